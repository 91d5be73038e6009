//! The controller against a real control plane, with a fake provider task playing the
//! LibvirtMachine contract. One binary, so every test shares one control plane.

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
