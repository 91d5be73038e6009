//! What banlieue's long-running processes share: [`artifacts`], how the artifacts volume is
//! shared, which places build and import Jobs; [`crash`], the test-only crash points;
//! [`leader`], leader election on a
//! `coordination.k8s.io/v1` Lease, so a controller can run as several replicas with one acting;
//! and [`reconcile`], the finalizer, status, backoff and Event plumbing every reconciler (the
//! controller's and each provider's) uses.

// A product function stays under clippy.toml's line limit (tests may be longer).
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

pub mod artifacts;
pub mod crash;
pub mod leader;
pub mod reconcile;
