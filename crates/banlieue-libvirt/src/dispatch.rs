//! The sans-io core of a connection: serial allocation, matching replies to calls, tombstones
//! for abandoned calls, classifying what arrives, and the keepalive decision. No sockets, no
//! clocks: time is passed in.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::packet::Packet;
use crate::proto::keepalive;
use crate::proto::net::{VirNetMessageStatus, VirNetMessageType};

/// What an incoming packet is, for routing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Incoming {
    /// The answer to a call, by serial.
    Reply,
    /// Data, a hole or an end-of-stream for an open stream, by serial.
    Stream,
    /// An unsolicited message (events), serial 0.
    Event,
    /// The peer asks whether we are alive.
    KeepalivePing,
    /// The peer answers our ping.
    KeepalivePong,
    /// Anything a client never receives (a CALL, an unknown type): dropped and counted.
    Unexpected,
}

pub fn classify(p: &Packet) -> Incoming {
    let h = &p.header;
    if h.prog == keepalive::PROGRAM {
        return match (h.r#type, h.r#proc) {
            (VirNetMessageType::MESSAGE, 1) => Incoming::KeepalivePing,
            (VirNetMessageType::MESSAGE, 2) => Incoming::KeepalivePong,
            _ => Incoming::Unexpected,
        };
    }
    match h.r#type {
        VirNetMessageType::REPLY | VirNetMessageType::REPLY_WITH_FDS => Incoming::Reply,
        VirNetMessageType::STREAM | VirNetMessageType::STREAM_HOLE => Incoming::Stream,
        VirNetMessageType::MESSAGE => Incoming::Event,
        _ => Incoming::Unexpected,
    }
}

#[derive(Debug)]
enum Entry<T> {
    Waiting {
        program: u32,
        slot: T,
    },
    /// The caller gave up (timeout or dropped future); its reply is still owed and discarded.
    Tombstone,
}

/// What became of a reply.
#[derive(Debug, PartialEq, Eq)]
pub enum Completion<T> {
    /// It answers a waiting call.
    Matched(T),
    /// It answers a call whose caller gave up.
    Late,
    /// No call has this serial (or the program differs): the client drops and counts it.
    Unknown,
}

/// Calls in flight on one connection, matched by program and serial.
#[derive(Debug)]
pub struct CallTable<T> {
    next_serial: u32,
    entries: HashMap<u32, Entry<T>>,
}

impl<T> Default for CallTable<T> {
    fn default() -> Self {
        CallTable {
            next_serial: 1,
            entries: HashMap::new(),
        }
    }
}

impl<T> CallTable<T> {
    /// Registers a call and returns its serial. Serial 0 is never used: events carry it.
    pub fn begin(&mut self, program: u32, slot: T) -> u32 {
        loop {
            let serial = self.next_serial;
            self.next_serial = self.next_serial.wrapping_add(1).max(1);
            if let std::collections::hash_map::Entry::Vacant(e) = self.entries.entry(serial) {
                e.insert(Entry::Waiting { program, slot });
                return serial;
            }
        }
    }

    /// The caller gave up; a later reply is discarded. Returns whether the call was pending.
    pub fn abandon(&mut self, serial: u32) -> bool {
        match self.entries.get_mut(&serial) {
            Some(e @ Entry::Waiting { .. }) => {
                *e = Entry::Tombstone;
                true
            }
            _ => false,
        }
    }

    pub fn complete(&mut self, program: u32, serial: u32) -> Completion<T> {
        match self.entries.remove(&serial) {
            Some(Entry::Waiting { program: p, slot }) if p == program => Completion::Matched(slot),
            Some(Entry::Tombstone) => Completion::Late,
            Some(other) => {
                self.entries.insert(serial, other);
                Completion::Unknown
            }
            None => Completion::Unknown,
        }
    }

    /// Every waiting call, for failing them when the connection dies.
    pub fn drain(&mut self) -> Vec<T> {
        self.entries
            .drain()
            .filter_map(|(_, e)| match e {
                Entry::Waiting { slot, .. } => Some(slot),
                Entry::Tombstone => None,
            })
            .collect()
    }

    /// Calls still owed a reply, tombstones included.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// What the keepalive timer should do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeepaliveAction {
    Nothing,
    SendPing,
    /// Nothing was heard for `interval × count`.
    Dead,
}

/// libvirt's keepalive rule from the client's side: ping after `interval` of silence, give
/// the peer up after `interval × count` of silence.
#[derive(Debug, Clone, Copy)]
pub struct Keepalive {
    pub interval: Duration,
    pub count: u32,
}

impl Keepalive {
    pub fn decide(&self, last_heard: Instant, now: Instant) -> KeepaliveAction {
        let silent = now.saturating_duration_since(last_heard);
        if silent >= self.interval * self.count {
            KeepaliveAction::Dead
        } else if silent >= self.interval {
            KeepaliveAction::SendPing
        } else {
            KeepaliveAction::Nothing
        }
    }
}

/// A keepalive packet (PING or PONG).
pub fn keepalive_packet(pong: bool) -> Packet {
    Packet {
        header: crate::proto::net::VirNetMessageHeader {
            prog: keepalive::PROGRAM,
            vers: keepalive::VERSION,
            r#proc: if pong { 2 } else { 1 },
            r#type: VirNetMessageType::MESSAGE,
            serial: 0,
            status: VirNetMessageStatus::OK,
        },
        fds: None,
        body: bytes::Bytes::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_match_by_program_and_serial() {
        let mut t = CallTable::default();
        let a = t.begin(7, "a");
        let b = t.begin(7, "b");
        assert_ne!(a, b);
        assert_eq!(
            t.complete(8, b),
            Completion::Unknown,
            "another program's serial"
        );
        assert_eq!(t.complete(7, b), Completion::Matched("b"));
        assert_eq!(t.complete(7, b), Completion::Unknown, "answered once");
        assert_eq!(t.complete(7, a), Completion::Matched("a"));
        assert!(t.is_empty());
    }

    #[test]
    fn abandoned_calls_leave_a_tombstone_until_their_reply() {
        let mut t = CallTable::default();
        let s = t.begin(1, ());
        assert!(t.abandon(s));
        assert_eq!(t.len(), 1);
        assert_eq!(t.complete(1, s), Completion::Late);
        assert!(t.is_empty());
        assert!(!t.abandon(s));
    }

    #[test]
    fn serials_skip_zero_and_live_entries() {
        let mut t = CallTable {
            next_serial: u32::MAX,
            entries: HashMap::new(),
        };
        let s1 = t.begin(1, ());
        let s2 = t.begin(1, ());
        assert_eq!((s1, s2), (u32::MAX, 1));
        t.next_serial = 1;
        assert_eq!(t.begin(1, ()), 2, "serial 1 is still in flight");
    }

    #[test]
    fn drain_returns_only_waiting_calls() {
        let mut t = CallTable::default();
        let a = t.begin(1, "a");
        t.begin(1, "b");
        t.abandon(a);
        assert_eq!(t.drain(), vec!["b"]);
        assert!(t.is_empty());
    }

    #[test]
    fn keepalive_pings_then_gives_up() {
        let k = Keepalive {
            interval: Duration::from_secs(5),
            count: 3,
        };
        let t0 = Instant::now();
        assert_eq!(
            k.decide(t0, t0 + Duration::from_secs(4)),
            KeepaliveAction::Nothing
        );
        assert_eq!(
            k.decide(t0, t0 + Duration::from_secs(5)),
            KeepaliveAction::SendPing
        );
        assert_eq!(
            k.decide(t0, t0 + Duration::from_secs(14)),
            KeepaliveAction::SendPing
        );
        assert_eq!(
            k.decide(t0, t0 + Duration::from_secs(15)),
            KeepaliveAction::Dead
        );
    }

    #[test]
    fn classification() {
        let ping = keepalive_packet(false);
        assert_eq!(classify(&ping), Incoming::KeepalivePing);
        assert_eq!(classify(&keepalive_packet(true)), Incoming::KeepalivePong);
        let mut p = keepalive_packet(false);
        p.header.prog = crate::proto::remote::PROGRAM;
        assert_eq!(classify(&p), Incoming::Event);
        p.header.r#type = VirNetMessageType::REPLY;
        assert_eq!(classify(&p), Incoming::Reply);
        p.header.r#type = VirNetMessageType::STREAM_HOLE;
        assert_eq!(classify(&p), Incoming::Stream);
        p.header.r#type = VirNetMessageType::CALL;
        assert_eq!(classify(&p), Incoming::Unexpected);
    }
}
