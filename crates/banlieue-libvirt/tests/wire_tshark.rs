//! Wireshark's libvirt dissector, an independent decoder, reads our packets off the loopback
//! interface (plain TCP, so it can see them) and must find the programs, procedures, serials,
//! types and statuses we sent.

use std::process::Stdio;
use std::time::Duration;

use banlieue_libvirt::proto::qemu::{self, procedures as qp};
use banlieue_libvirt::proto::remote::{self, procedures as rp};
use banlieue_libvirt::xdr::Procedure;
use banlieue_libvirt::{Client, Domain};
use banlieue_testenv::libvirtd::LibvirtdOptions;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

mod peer;

/// One libvirt message as the dissector saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    program: u32,
    procedure: i32,
    kind: i32,
    serial: u32,
    status: i32,
}

fn parse_u32(s: &str) -> Option<u32> {
    match s.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

/// A `-T fields` line: one column per field, several messages in one frame comma-separated.
fn parse_line(line: &str) -> Vec<Seen> {
    let cols: Vec<Vec<&str>> = line.split('\t').map(|c| c.split(',').collect()).collect();
    if cols.len() != 5 || cols[0] == [""] {
        return Vec::new();
    }
    let n = cols[0].len();
    (0..n)
        .filter_map(|i| {
            let get = |c: usize| cols[c].get(i).copied().unwrap_or("");
            Some(Seen {
                program: parse_u32(get(0))?,
                procedure: get(1).parse().ok()?,
                kind: get(2).parse().ok()?,
                serial: parse_u32(get(3))?,
                status: get(4).parse().ok()?,
            })
        })
        .collect()
}

fn call<P: Procedure>(serial: u32) -> Seen {
    Seen {
        program: P::PROGRAM,
        procedure: P::NUMBER,
        kind: 0,
        serial,
        status: 0,
    }
}

fn reply<P: Procedure>(serial: u32, ok: bool) -> Seen {
    Seen {
        kind: 1,
        status: if ok { 0 } else { 1 },
        ..call::<P>(serial)
    }
}

#[tokio::test]
async fn the_dissector_decodes_what_we_sent() {
    let Some(d) = peer::daemon(LibvirtdOptions::default().with_tcp()).await else {
        return;
    };
    let port = d.tcp_port().expect("plain TCP port");
    let mut tshark = match Command::new("tshark")
        .args(["-i", "lo", "-l", "-f"])
        .arg(format!("tcp port {port}"))
        .arg("-d")
        .arg(format!("tcp.port=={port},libvirt"))
        .args(["-T", "fields"])
        .args(["-e", "libvirt.program", "-e", "libvirt.procedure"])
        .args(["-e", "libvirt.type", "-e", "libvirt.serial"])
        .args(["-e", "libvirt.status"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        // tshark captures through a dumpcap child, which outlives tshark when only tshark is
        // stopped: both go in a group of their own, stopped whole by `_capture`.
        .process_group(0)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => panic!("tshark is installed (run scripts/setup): {e}"),
    };
    let _capture = ProcessGroup(tshark.id());
    // Wait until tshark captures, or learn why it cannot.
    let mut stderr = BufReader::new(tshark.stderr.take().expect("stderr")).lines();
    let mut said = Vec::new();
    let capturing = tokio::time::timeout(Duration::from_secs(30), async {
        while let Ok(Some(line)) = stderr.next_line().await {
            let started = line.contains("Capturing on");
            said.push(line);
            if started {
                return true;
            }
        }
        false
    })
    .await
    .unwrap_or(false);
    if !capturing {
        let said = said.join("\n");
        if said.contains("permission") || said.contains("Permission") {
            eprintln!(
                "\n!!!!! SKIPPED: tshark may not capture on lo here (needs root or CAP_NET_RAW): {said} !!!!!\n"
            );
            return;
        }
        panic!("tshark did not start capturing: {said}");
    }
    // Keep draining stderr so tshark never blocks on it.
    tokio::spawn(async move { while let Ok(Some(_)) = stderr.next_line().await {} });
    // "Capturing on" comes before the capture is live: knock on the port (a TCP connection
    // that sends nothing) until tshark prints a frame.
    let mut lines = BufReader::new(tshark.stdout.take().expect("stdout")).lines();
    let live = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            drop(tokio::net::TcpStream::connect(("127.0.0.1", port)).await);
            if let Ok(Ok(Some(_))) =
                tokio::time::timeout(Duration::from_millis(200), lines.next_line()).await
            {
                return;
            }
        }
    })
    .await;
    assert!(
        live.is_ok(),
        "tshark printed no frame of the probe connections"
    );

    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("plain TCP");
    let c = Client::handshake(tcp, "qemu:///system")
        .await
        .expect("handshake");
    c.call::<rp::ConnectGetVersion>(&()).await.expect("version");
    c.call::<rp::ConnectGetHostname>(&())
        .await
        .expect("hostname");
    let missing = Domain::lookup_by_name(&c, "no-such-domain")
        .await
        .expect("lookup");
    assert!(missing.is_none());
    let ghost = remote::RemoteNonnullDomain {
        name: "no-such-domain".into(),
        uuid: [7; 16],
        id: -1,
    };
    c.call::<qp::DomainAgentCommand>(&qemu::QemuDomainAgentCommandArgs {
        dom: ghost,
        cmd: r#"{"execute":"guest-ping"}"#.into(),
        timeout: 1,
        flags: 0,
    })
    .await
    .expect_err("no such domain");
    c.close().await.expect("close");

    // Serials count up from 1 on a new connection, one per call, whatever the program.
    let expected = vec![
        call::<rp::AuthList>(1),
        reply::<rp::AuthList>(1, true),
        call::<rp::ConnectSupportsFeature>(2),
        reply::<rp::ConnectSupportsFeature>(2, true),
        call::<rp::ConnectOpen>(3),
        reply::<rp::ConnectOpen>(3, true),
        call::<rp::ConnectGetVersion>(4),
        reply::<rp::ConnectGetVersion>(4, true),
        call::<rp::ConnectGetHostname>(5),
        reply::<rp::ConnectGetHostname>(5, true),
        call::<rp::DomainLookupByName>(6),
        reply::<rp::DomainLookupByName>(6, false),
        call::<qp::DomainAgentCommand>(7),
        reply::<qp::DomainAgentCommand>(7, false),
        call::<rp::ConnectClose>(8),
        reply::<rp::ConnectClose>(8, true),
    ];
    let last = expected.last().cloned().expect("not empty");
    let mut seen = Vec::new();
    let mut raw = Vec::new();
    let done = tokio::time::timeout(Duration::from_secs(30), async {
        while let Ok(Some(line)) = lines.next_line().await {
            let messages = parse_line(&line);
            raw.push(line);
            // Keepalive is its own program and may interleave; it is not what we compare.
            seen.extend(messages.into_iter().filter(|m| {
                m.program == rp::ConnectOpen::PROGRAM
                    || m.program == qp::DomainAgentCommand::PROGRAM
            }));
            if seen.contains(&last) {
                return true;
            }
        }
        false
    })
    .await
    .unwrap_or(false);
    let _ = tshark.kill().await;
    assert!(
        done,
        "the dissector showed the CONNECT_CLOSE reply; it printed:\n{}",
        raw.join("\n")
    );
    assert_eq!(seen, expected, "tshark printed:\n{}", raw.join("\n"));
}

/// A process group this test started (its leader's PID), sent SIGTERM when dropped, whether
/// the test passed or panicked.
struct ProcessGroup(Option<u32>);

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        if let Some(leader) = self.0 {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", "--", &format!("-{leader}")])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}
