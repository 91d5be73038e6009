//! What banlieue's long-running processes share: [`leader`], leader election on a
//! `coordination.k8s.io/v1` Lease, so a controller can run as several replicas with one acting;
//! and [`reconcile`], the finalizer, status, backoff and Event plumbing every reconciler (the
//! controller's and each provider's) uses.

pub mod leader;
pub mod reconcile;
