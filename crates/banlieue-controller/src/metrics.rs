//! Prometheus metrics of the controller.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Labels naming one pool.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    pub namespace: String,
    pub pool: String,
}

/// Labels of a reconcile error: which controller and why.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub controller: String,
    pub reason: String,
}

/// The controller's metrics. Cloning shares the underlying series.
#[derive(Clone, Debug)]
pub struct Metrics {
    /// Seconds from a claim's creation to its Bound status being written.
    pub claim_bind_latency: Histogram,
    /// Bind patches the API server rejected with 409 Conflict.
    pub bind_conflicts: Counter,
    /// Unclaimed members a claim could take now, per pool.
    pub pool_warm: Family<PoolLabels, Gauge>,
    /// Members bound to claims, per pool.
    pub pool_claimed: Family<PoolLabels, Gauge>,
    /// Unclaimed members that are not available yet, per pool.
    pub pool_filling: Family<PoolLabels, Gauge>,
    /// Failed reconciles, by controller and reason.
    pub reconcile_errors: Family<ErrorLabels, Counter>,
}

impl Metrics {
    /// Creates the metrics and registers them under the prefix `banlieue_controller`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::unregistered();
        let registry = registry.sub_registry_with_prefix("banlieue_controller");
        registry.register(
            "claim_bind_latency_seconds",
            "Seconds from a claim's creation to Bound",
            metrics.claim_bind_latency.clone(),
        );
        registry.register(
            "bind_conflicts",
            "Bind patches rejected with 409 Conflict",
            metrics.bind_conflicts.clone(),
        );
        registry.register(
            "pool_warm_members",
            "Unclaimed members available to claims",
            metrics.pool_warm.clone(),
        );
        registry.register(
            "pool_claimed_members",
            "Members bound to claims",
            metrics.pool_claimed.clone(),
        );
        registry.register(
            "pool_filling_members",
            "Unclaimed members not available yet",
            metrics.pool_filling.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Failed reconciles by controller and reason",
            metrics.reconcile_errors.clone(),
        );
        metrics
    }

    /// Metrics that are recorded but exported nowhere (for embedding without a registry).
    pub fn unregistered() -> Self {
        // 1 ms to ~65 s: a warm bind is milliseconds, a bind that waited for capacity minutes.
        let buckets = prometheus_client::metrics::histogram::exponential_buckets(0.001, 2.0, 17);
        Self {
            claim_bind_latency: Histogram::new(buckets),
            bind_conflicts: Counter::default(),
            pool_warm: Family::default(),
            pool_claimed: Family::default(),
            pool_filling: Family::default(),
            reconcile_errors: Family::default(),
        }
    }

    pub(crate) fn reconcile_error(&self, controller: &str, reason: &str) {
        self.reconcile_errors
            .get_or_create(&ErrorLabels {
                controller: controller.to_owned(),
                reason: reason.to_owned(),
            })
            .inc();
    }
}
