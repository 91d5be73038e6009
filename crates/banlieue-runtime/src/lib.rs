//! What banlieue's long-running processes share. Today: [`leader`], leader election on a
//! `coordination.k8s.io/v1` Lease, so a controller can run as several replicas with one acting.

pub mod leader;
