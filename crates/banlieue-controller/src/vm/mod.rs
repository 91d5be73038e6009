//! VirtualMachines: [`decide`] is the pure decision over what the reconciler read (where the
//! status comes from, the machine to build, its standby, the teardown), `reconcile` schedules
//! one onto a failure domain (through [`crate::scheduling`]), creates its machine and mirrors
//! the machine's status back.

pub(crate) mod decide;
pub(crate) mod reconcile;
