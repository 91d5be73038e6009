//! VirtualMachinePools: [`decide`] is the pure decision over a pool's snapshot (ADR-0058),
//! `startup` keeps each pool's streak of members that did not start in time and its create
//! backoff, `reconcile` reads the snapshot and carries the decision out.

pub mod decide;
pub(crate) mod reconcile;
pub(crate) mod startup;
