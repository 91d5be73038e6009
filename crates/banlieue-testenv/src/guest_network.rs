//! The host's way to one guest on an isolated libvirt network (a bridge with no address, no
//! forwarding, guests without a default route): the host takes [`HOST_ADDRESS`] on the
//! bridge and a route to that guest's address alone through it, so an SSH test or `dev up`
//! reaches the guest's sshd and nothing sent to it can leave the machine.
//!
//! Host routes (a /32 each) rather than the guests' whole /15: two runs side by side (a test
//! and `dev up`, or two test binaries) each have their own bridge, and a /15 on both would
//! leave the kernel to pick one of them for every guest.

use std::process::Command;

/// The host's address on a guests' network. The guests' are in 198.18.0.0/15 (RFC 2544's
/// benchmarking range, banlieue-dev's `GUEST_USER_DATA`), so the guest finds this one on its
/// link; no guest is ever given it.
pub const HOST_ADDRESS: &str = "198.19.255.254";

/// What went wrong joining the network.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("run ip: {0}")]
    Spawn(#[from] std::io::Error),
    #[error("ip {args}: {status}: {stderr}")]
    Failed {
        args: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("{address} is not reached through {bridge} but: {route}")]
    WrongRoute {
        address: String,
        bridge: String,
        route: String,
    },
}

fn ip(args: &[&str]) -> Result<String, Error> {
    let out = Command::new("ip").args(args).output()?;
    if !out.status.success() {
        return Err(Error::Failed {
            args: args.join(" "),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Gives the host [`HOST_ADDRESS`] on `bridge` and a route to `guest` (an IPv4 address)
/// through it, then checks that `guest` is reached through `bridge` and nowhere else.
/// Both go with the bridge when its network is destroyed.
pub fn route_to_guest(bridge: &str, guest: &str) -> Result<(), Error> {
    let host = format!("{HOST_ADDRESS}/32");
    ip(&["addr", "replace", &host, "dev", bridge])?;
    let target = format!("{guest}/32");
    ip(&[
        "-4",
        "route",
        "replace",
        &target,
        "dev",
        bridge,
        "src",
        HOST_ADDRESS,
    ])?;
    let route = ip(&["-4", "route", "get", guest])?;
    let words: Vec<&str> = route.split_whitespace().collect();
    if !words.windows(2).any(|w| w == ["dev", bridge]) {
        return Err(Error::WrongRoute {
            address: guest.to_owned(),
            bridge: bridge.to_owned(),
            route: route.trim().to_owned(),
        });
    }
    Ok(())
}
