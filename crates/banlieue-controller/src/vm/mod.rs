//! VirtualMachines: `reconcile` schedules one onto a failure domain (through
//! [`crate::scheduling`]), creates its machine and mirrors the machine's status back.

pub(crate) mod reconcile;
