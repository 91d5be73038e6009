//! Prometheus metrics of the controller.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// 1 ms to ~65 s: a warm bind is milliseconds, a bind that waited for capacity minutes.
fn bind_latency_histogram() -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.001, 2.0, 17,
    ))
}

/// Labels naming one pool.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    pub namespace: String,
    pub pool: String,
}

/// Labels of a bound claim: its pool, and whether a warm member was waiting for it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BindLabels {
    pub namespace: String,
    pub pool: String,
    /// `warm`: the member was available before the claim was created (a pool hit); `cold`:
    /// the claim waited for a member to be built or to become available (a miss).
    pub start: &'static str,
}

/// [`BindLabels::start`] of a claim whose member was waiting for it.
pub const START_WARM: &str = "warm";
/// [`BindLabels::start`] of a claim that waited for its member.
pub const START_COLD: &str = "cold";

/// Labels of a count of members in one phase.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    pub namespace: String,
    pub pool: String,
    pub phase: &'static str,
}

/// A histogram family's constructor: the bind-latency buckets.
pub type HistogramConstructor = fn() -> Histogram;

/// Labels of a reconcile error: which controller and why.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub controller: String,
    pub reason: String,
}

/// The controller's metrics. Cloning shares the underlying series.
#[derive(Clone, Debug)]
pub struct Metrics {
    /// Seconds from a claim's creation to its Bound status being written, by pool and start.
    pub claim_bind_latency: Family<BindLabels, Histogram, HistogramConstructor>,
    /// Bound claims by pool and start: `warm` is a pool hit, `cold` a miss.
    pub pool_claims: Family<BindLabels, Counter>,
    /// Seconds from a claim's bind to its member running again, for members of `standby:
    /// Saved` pools (ADR-0073), by pool.
    pub claim_resume_latency: Family<PoolLabels, Histogram, HistogramConstructor>,
    /// Members of each pool by phase (see `member::MemberView::phase`), and `Claimed`.
    pub pool_members: Family<PhaseLabels, Gauge>,
    /// Bind patches the API server rejected with 409 Conflict.
    pub bind_conflicts: Counter,
    /// Bind patches whose answer was lost (neither applied nor refused, as far as the
    /// controller could tell); the next reconcile reads the member back first.
    pub bind_outcomes_unknown: Counter,
    /// Second members found bound to a claim and deleted.
    pub extra_members_deleted: Counter,
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
            "Seconds from a claim's creation to Bound, by pool and by warm (a member was waiting) or cold start",
            metrics.claim_bind_latency.clone(),
        );
        registry.register(
            "pool_claims",
            "Bound claims by pool: start=warm is a pool hit, start=cold a miss",
            metrics.pool_claims.clone(),
        );
        registry.register(
            "claim_resume_latency_seconds",
            "Seconds from a claim's bind to Resumed, for members of standby: Saved pools, by pool",
            metrics.claim_resume_latency.clone(),
        );
        registry.register(
            "pool_members",
            "Members of each pool by phase",
            metrics.pool_members.clone(),
        );
        registry.register(
            "bind_conflicts",
            "Bind patches rejected with 409 Conflict",
            metrics.bind_conflicts.clone(),
        );
        registry.register(
            "bind_outcomes_unknown",
            "Bind patches whose answer was lost",
            metrics.bind_outcomes_unknown.clone(),
        );
        registry.register(
            "extra_members_deleted",
            "Second members found bound to a claim and deleted",
            metrics.extra_members_deleted.clone(),
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
        Self {
            claim_bind_latency: Family::new_with_constructor(bind_latency_histogram),
            pool_claims: Family::default(),
            claim_resume_latency: Family::new_with_constructor(bind_latency_histogram),
            pool_members: Family::default(),
            bind_conflicts: Counter::default(),
            bind_outcomes_unknown: Counter::default(),
            extra_members_deleted: Counter::default(),
            pool_warm: Family::default(),
            pool_claimed: Family::default(),
            pool_filling: Family::default(),
            reconcile_errors: Family::default(),
        }
    }

    /// Records a bind: its latency and whether it was a pool hit.
    pub(crate) fn bound(&self, labels: BindLabels, latency_seconds: f64) {
        self.claim_bind_latency
            .get_or_create(&labels)
            .observe(latency_seconds.max(0.0));
        self.pool_claims.get_or_create(&labels).inc();
    }

    /// Records a resume, `latency_seconds` after the bind.
    pub(crate) fn resumed(&self, labels: PoolLabels, latency_seconds: f64) {
        self.claim_resume_latency
            .get_or_create(&labels)
            .observe(latency_seconds.max(0.0));
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
