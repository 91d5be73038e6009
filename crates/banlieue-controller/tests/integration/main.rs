//! The controller against a real control plane, with a fake provider task playing the machine
//! contract of the kind `BANLIEUE_TEST_MACHINE_KIND` names (`LibvirtMachine`, the default, or
//! `VSphereMachine`). One binary, so every test shares one control plane.

#[path = "../support/mod.rs"]
mod support;

mod crash;
mod leader;
mod lifecycle;
mod metrics;
mod pool_health;
mod quick_start;
mod race;
mod scheduling;
mod standby;
