//! What the embedding binary chooses about a controller run.

use std::time::Duration;

use crate::machine_builder::MachineBackends;

/// Settings of one controller run.
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    /// The namespace to serve; `None` serves all namespaces.
    pub namespace: Option<String>,
    /// How long GuestReady pool members may be infrastructure-ready without any of them
    /// publishing `GuestReady` before the pool reports `ReadinessSignalAbsent`.
    pub readiness_signal_grace: Duration,
    /// How long a Provider may stay not Ready before its host counts as lost and pools replace
    /// their unclaimed members on it elsewhere (their deletion completes when the host is back).
    pub provider_lost_after: Duration,
    /// How often every object is looked at again without a watch event, so time-based
    /// decisions (Pending retries, expiry, idle members) never depend on an event arriving.
    pub resync: Duration,
    /// The shortest wait before a reconcile that failed is retried; it doubles per failure
    /// of the same object up to `max_error_backoff`.
    pub min_error_backoff: Duration,
    /// The longest wait between retries of an object whose reconcile keeps failing.
    pub max_error_backoff: Duration,
    /// The longest one reconcile may take. A reconcile still running then is cancelled and
    /// retried like a failed one: a request the API server never answers must not hold an
    /// object, or a bind, forever. Cancelling is as safe as a crash at the same point.
    pub reconcile_timeout: Duration,
    /// Name given to the field manager and to Events' reporting controller.
    pub manager_name: String,
    /// The machine kinds this controller builds: the embedding binary's list of backend
    /// descriptors (ADR-0071). None by default: the controller itself knows no backend.
    pub machine_backends: MachineBackends,
    /// How many objects each reconciler (VirtualMachines, pools, claims) works on at once; 0
    /// for no bound. The API client speaks HTTP/1.1, one request at a time per connection, so
    /// without a bound a burst of claims opens about one TLS connection per claim in flight:
    /// a burst of 300 claims took the controller to 300–320 MiB resident and a p50 of
    /// 2.25–2.36 s, against 66 MiB and 1.75–1.77 s with 32 (docs/performance.md).
    pub concurrent_reconciles: u16,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        Self {
            namespace: None,
            readiness_signal_grace: Duration::from_secs(300),
            provider_lost_after: Duration::from_secs(300),
            resync: Duration::from_secs(300),
            min_error_backoff: Duration::from_millis(200),
            max_error_backoff: Duration::from_secs(60),
            reconcile_timeout: Duration::from_secs(30),
            manager_name: crate::FIELD_MANAGER.to_owned(),
            machine_backends: MachineBackends::new([]),
            concurrent_reconciles: 32,
        }
    }
}
