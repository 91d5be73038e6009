//! A time-bounded fuzz run of the receive path on stable Rust (cargo-fuzz needs nightly; the
//! same target lives in `fuzz/`).
//!
//! Inputs are valid packets for every procedure of every program (random bodies from the
//! schema), error packets and stream packets, then mutated: bits flipped, bytes inserted and
//! deleted, chunks repeated, truncated, and words set to huge counts. Most of the time the
//! length word is fixed up afterwards so the input gets past framing into the body decoders.
//! Random bytes are mixed in too.
//!
//! Asserts: no panic (the failing input is printed as hex) and peak memory (VmHWM) under a
//! bound, so no hostile length makes the decoder allocate what the input cannot back.
//!
//! `BANLIEUE_FUZZ_SECS` sets the duration (default 3 s under `cargo test`; scripts/test.d uses
//! more), `BANLIEUE_FUZZ_SEED` the starting seed.

mod fuzz;
mod oracle;

use std::time::{Duration, Instant};

use banlieue_libvirt::proto::net::{VirNetMessageHeader, VirNetMessageStatus, VirNetMessageType};
use banlieue_libvirt::proto::{self, keepalive};
use banlieue_libvirt::xdr::Xdr;
use banlieue_xdrgen::model::Model;
use banlieue_xdrgen::sample::{self, Limits, Rng, SplitMix64};

const PEAK_RSS_LIMIT_KIB: u64 = 256 * 1024;

fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn header(
    prog: u32,
    vers: u32,
    proc: i32,
    ty: VirNetMessageType,
    status: VirNetMessageStatus,
) -> Vec<u8> {
    VirNetMessageHeader {
        prog,
        vers,
        proc,
        r#type: ty,
        serial: 1,
        status,
    }
    .to_bytes()
    .expect("encode header")
    .to_vec()
}

fn frame(header: Vec<u8>, body: &[u8]) -> Vec<u8> {
    let mut p = ((4 + header.len() + body.len()) as u32)
        .to_be_bytes()
        .to_vec();
    p.extend_from_slice(&header);
    p.extend_from_slice(body);
    p
}

/// A valid packet of some kind, its body drawn from the schema.
fn valid_packet(model: &Model, rng: &mut SplitMix64) -> Vec<u8> {
    let procs: Vec<_> = proto::PROGRAMS.iter().flat_map(|(_, p)| p.iter()).collect();
    let info = procs[rng.below(procs.len() as u64) as usize];
    let mut body = Vec::new();
    let (ty, status, name) = match rng.below(6) {
        0 | 1 => (VirNetMessageType::CALL, VirNetMessageStatus::OK, info.args),
        2 | 3 => (VirNetMessageType::REPLY, VirNetMessageStatus::OK, info.ret),
        4 => (
            VirNetMessageType::MESSAGE,
            VirNetMessageStatus::OK,
            info.message,
        ),
        _ => match rng.below(3) {
            0 => (
                VirNetMessageType::REPLY,
                VirNetMessageStatus::ERROR,
                Some("virNetMessageError"),
            ),
            1 => {
                let n = rng.below(200) as usize;
                body.extend((0..n).map(|_| rng.next_u64() as u8));
                (
                    VirNetMessageType::STREAM,
                    VirNetMessageStatus::CONTINUE,
                    None,
                )
            }
            _ => (
                VirNetMessageType::CALL_WITH_FDS,
                VirNetMessageStatus::OK,
                info.args,
            ),
        },
    };
    if let Some(name) = name {
        let limits = Limits {
            max_array: 4,
            max_bytes: 40,
        };
        assert!(sample::encode_named(model, name, rng, limits, &mut body));
    }
    let mut h = header(info.program, info.version, info.number, ty, status);
    if ty == VirNetMessageType::CALL_WITH_FDS {
        h.extend_from_slice(&(rng.below(40) as u32).to_be_bytes());
    }
    frame(h, &body)
}

const HUGE: &[u32] = &[
    u32::MAX,
    0x7fff_ffff,
    0x8000_0000,
    0x0100_0000,
    0x0040_0000,
    0x0040_0001,
    0x0200_0000,
    0x0000_4001,
    0x0000_ffff,
];

fn mutate(data: &mut Vec<u8>, rng: &mut SplitMix64) {
    let len = data.len() as u64;
    match rng.below(9) {
        0 if len > 0 => {
            let i = rng.below(len) as usize;
            data[i] ^= 1 << rng.below(8);
        }
        1 if len > 0 => {
            let i = rng.below(len) as usize;
            data[i] = rng.next_u64() as u8;
        }
        2 => {
            let i = rng.below(len + 1) as usize;
            let n = 1 + rng.below(8) as usize;
            let bytes: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
            data.splice(i..i, bytes);
        }
        3 if len > 0 => {
            let i = rng.below(len) as usize;
            let n = (1 + rng.below(8) as usize).min(data.len() - i);
            data.drain(i..i + n);
        }
        4 => data.truncate(rng.below(len + 1) as usize),
        5 if len >= 4 => {
            // A count or length word set to something the rest of the input cannot back.
            let i = (rng.below(len / 4) * 4) as usize;
            let v = match rng.below(3) {
                0 => HUGE[rng.below(HUGE.len() as u64) as usize],
                1 => (len as u32).wrapping_add(rng.below(16) as u32),
                _ => rng.next_u64() as u32,
            };
            data[i..i + 4].copy_from_slice(&v.to_be_bytes());
        }
        6 if len > 0 => {
            let i = rng.below(len) as usize;
            let n = (1 + rng.below(64) as usize).min(data.len() - i);
            let chunk = data[i..i + n].to_vec();
            for _ in 0..1 + rng.below(64) {
                data.splice(i..i, chunk.iter().copied());
            }
        }
        7 if len >= 28 => {
            // Another header word, e.g. a different procedure or message type.
            let i = 4 + (rng.below(6) * 4) as usize;
            let v = rng.below(8) as u32;
            data[i..i + 4].copy_from_slice(&v.to_be_bytes());
        }
        _ => {}
    }
}

fn fix_length(data: &mut [u8]) {
    if data.len() >= 4 {
        let n = (data.len() as u32).to_be_bytes();
        data[..4].copy_from_slice(&n);
    }
}

fn hex(bytes: &[u8]) -> String {
    oracle::hex(bytes)
}

#[test]
fn packet_receive_path_survives_mutated_input() {
    let secs: f64 = std::env::var("BANLIEUE_FUZZ_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3.0);
    let base_seed: u64 = std::env::var("BANLIEUE_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        });
    let model = oracle::model(&oracle::inputs());
    assert!(
        keepalive::PROCEDURES.len() >= 2,
        "keepalive's PING and PONG are listed"
    );

    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let (mut runs, mut packets, mut typed, mut decoded) = (0u64, 0u64, 0u64, 0u64);
    let started = Instant::now();
    while Instant::now() < deadline {
        for _ in 0..64 {
            let seed = base_seed.wrapping_add(runs);
            let mut rng = SplitMix64(seed);
            let mut data = if rng.below(16) == 0 {
                let n = rng.below(256) as usize;
                (0..n).map(|_| rng.next_u64() as u8).collect()
            } else {
                valid_packet(&model, &mut rng)
            };
            for _ in 0..rng.below(4) {
                mutate(&mut data, &mut rng);
            }
            if rng.below(4) != 0 {
                fix_length(&mut data);
            }
            let result = std::panic::catch_unwind(|| fuzz::packet(&data));
            match result {
                Ok(r) => {
                    packets += u64::from(r.packet);
                    typed += u64::from(r.body_typed);
                    decoded += u64::from(r.body_decoded);
                }
                Err(panic) => {
                    eprintln!(
                        "fuzz: panic on input from seed {seed} (BANLIEUE_FUZZ_SEED={seed} reproduces it first):\n{}",
                        hex(&data)
                    );
                    std::panic::resume_unwind(panic);
                }
            }
            runs += 1;
        }
        let peak = peak_rss_kib().unwrap_or(0);
        assert!(
            peak < PEAK_RSS_LIMIT_KIB,
            "peak RSS {peak} KiB passed {PEAK_RSS_LIMIT_KIB} KiB after {runs} inputs (base seed {base_seed})"
        );
    }
    let elapsed = started.elapsed().as_secs_f64();
    eprintln!(
        "fuzz: {runs} inputs in {elapsed:.1} s ({:.0}/s), base seed {base_seed}: {packets} framed, \
         {typed} with a typed body, {decoded} bodies decoded; peak RSS {} KiB (limit {PEAK_RSS_LIMIT_KIB})",
        runs as f64 / elapsed,
        peak_rss_kib().unwrap_or(0)
    );
}
