//! Loopback ports for the peers a test starts: one allocator for all of them.

use std::io;
use std::net::{Ipv4Addr, TcpListener};

/// `N` distinct loopback ports nobody listens on, picked by binding port 0. The listeners are
/// held together, so the ports differ, and closed before returning: another process could take
/// one in between, a window every peer's start-up reports as a failed bind.
pub(crate) fn free_loopback_ports<const N: usize>() -> io::Result<[u16; N]> {
    let listeners = (0..N)
        .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
        .collect::<io::Result<Vec<_>>>()?;
    let mut ports = [0; N];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener.local_addr()?.port();
    }
    Ok(ports)
}

/// One loopback port nobody listens on; see [`free_loopback_ports`].
pub(crate) fn free_loopback_port() -> io::Result<u16> {
    let [port] = free_loopback_ports()?;
    Ok(port)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_and_free() {
        let ports: [u16; 8] = free_loopback_ports().unwrap();
        let mut sorted = ports.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), ports.len(), "{ports:?}");
        // Each can be listened on once returned.
        let held: Vec<_> = ports
            .iter()
            .map(|&port| TcpListener::bind((Ipv4Addr::LOCALHOST, port)).unwrap())
            .collect();
        assert_eq!(held.len(), 8);
        assert_ne!(free_loopback_port().unwrap(), 0);
    }
}
