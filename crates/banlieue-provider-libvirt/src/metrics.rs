//! Prometheus metrics of the libvirt provider workload (`banlieue provider libvirt run`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of a failed machine reconcile: the condition reason it was reported with.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

/// The provider's metrics. Cloning shares the underlying series.
#[derive(Clone, Debug)]
pub struct Metrics {
    /// Seconds from a LibvirtMachine's creation to each status that reports it ready (its
    /// domain running) after not ready: the first is how long a pool waits for a member's
    /// infrastructure; a domain stopped and started again counts once more.
    pub machine_ready_latency: Histogram,
    /// Seconds from a LibvirtMachine's creation to its GuestReady turning True: the guest's
    /// boot and setup, which a GuestReady pool pays before any claim.
    pub guest_ready_latency: Histogram,
    /// Seconds a saved domain took to start from its managed save image (ADR-0073): QEMU
    /// started and the guest's memory read back.
    pub restore_latency: Histogram,
    /// Seconds from a restore to its guest's clock set through the agent (or given up on):
    /// how long the agent took to answer again.
    pub clock_set_latency: Histogram,
    /// Commands sent to guest agents (QEMU_PROC_DOMAIN_AGENT_COMMAND, and the agent-sourced
    /// address query): what reading guests costs the host.
    pub agent_commands: Counter,
    /// Domains this provider defined on its host.
    pub domains_defined: Counter,
    /// Domains this provider destroyed and undefined.
    pub domains_undefined: Counter,
    /// Failed machine reconciles, by the condition reason they were reported with.
    pub reconcile_errors: Family<ReasonLabels, Counter>,
    /// 1 while the provider holds a live connection to its host, else 0.
    pub host_connected: Gauge,
}

impl Metrics {
    /// Creates the metrics and registers them under the prefix `banlieue_provider_libvirt`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::unregistered();
        let registry = registry.sub_registry_with_prefix("banlieue_provider_libvirt");
        registry.register(
            "machine_ready_seconds",
            "Seconds from a LibvirtMachine's creation to its domain reported running",
            metrics.machine_ready_latency.clone(),
        );
        registry.register(
            "guest_ready_seconds",
            "Seconds from a LibvirtMachine's creation to its guest reporting ready",
            metrics.guest_ready_latency.clone(),
        );
        registry.register(
            "restore_seconds",
            "Seconds a saved domain took to start from its managed save image",
            metrics.restore_latency.clone(),
        );
        registry.register(
            "clock_set_seconds",
            "Seconds from a restore to its guest's clock set through the agent",
            metrics.clock_set_latency.clone(),
        );
        registry.register(
            "agent_commands",
            "Commands sent to guest agents",
            metrics.agent_commands.clone(),
        );
        registry.register(
            "domains_defined",
            "Domains this provider defined on its host",
            metrics.domains_defined.clone(),
        );
        registry.register(
            "domains_undefined",
            "Domains this provider destroyed and undefined",
            metrics.domains_undefined.clone(),
        );
        registry.register(
            "machine_reconcile_errors",
            "Failed machine reconciles by condition reason",
            metrics.reconcile_errors.clone(),
        );
        registry.register(
            "host_connected",
            "1 while the provider holds a live connection to its host",
            metrics.host_connected.clone(),
        );
        metrics
    }

    /// Metrics that are recorded but exported nowhere (for embedding without a registry).
    pub fn unregistered() -> Self {
        Self {
            // 0.25 s to ~17 min: a domain from a warm overlay starts in seconds, one that
            // waits for a slow host or a retried step takes minutes.
            machine_ready_latency: Histogram::new(exponential_buckets(0.25, 2.0, 13)),
            guest_ready_latency: Histogram::new(exponential_buckets(0.25, 2.0, 13)),
            // 50 ms to ~25 s: a resume is meant to take about a second.
            restore_latency: Histogram::new(exponential_buckets(0.05, 2.0, 10)),
            clock_set_latency: Histogram::new(exponential_buckets(0.05, 2.0, 10)),
            agent_commands: Counter::default(),
            domains_defined: Counter::default(),
            domains_undefined: Counter::default(),
            reconcile_errors: Family::default(),
            host_connected: Gauge::default(),
        }
    }

    pub(crate) fn reconcile_error(&self, reason: &str) {
        self.reconcile_errors
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }
}
