//! A small world for proving a guest's egress from inside it, on this machine alone: an
//! isolated libvirt network (an address of the host's on its bridge, no forwarding), and a
//! network namespace plugged into that bridge that plays everything a guest might try to
//! reach: a peer on the guests' own network, and, routed through it, "outside" servers, a
//! link-local metadata address and two DNS resolvers. Each listens on TCP and UDP and answers
//! `ok`; the host answers `ok` on its bridge address too. Nothing here forwards off the
//! machine: the namespace has no other link, and the network no `<forward>`.
//!
//! A guest joins with a second interface (`interface_xml`), is given its address and routes
//! through the agent (`guest_setup_script`), and tries every destination at once
//! (`probe_script`), printing one `NAME reached` or `NAME blocked` line each.

use std::io::Write as _;
use std::net::Ipv4Addr;
use std::process::{Child, Command, Stdio};

use crate::libvirtd::Libvirtd;

/// What went wrong building the world.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("run {what}: {source}")]
    Spawn {
        what: String,
        source: std::io::Error,
    },
    #[error("{what}: {status}: {stderr}")]
    Failed {
        what: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("libvirt: {0}")]
    Libvirt(#[from] crate::libvirtd::Error),
    #[error("the host's bridge filtering: {0}")]
    BridgeFilter(String),
    #[error("the responder: {0}")]
    Responder(String),
}

type Result<T, E = Error> = std::result::Result<T, E>;

/// The TCP and UDP ports every server of the world listens on.
pub const PORTS: [u16; 5] = [53, 80, 8443, 8444, BULK_PORT];
/// The TCP port on which every server sends [`BULK_MIB`] MiB of zeros and closes, for a
/// throughput figure.
pub const BULK_PORT: u16 = 8445;
pub const BULK_MIB: u32 = 32;
/// An allowed-looking server outside the guests' network (TEST-NET-1).
pub const SERVER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 10);
/// Another server beside it.
pub const OTHER_SERVER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 11);
/// The cloud metadata address.
pub const METADATA: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 254);
/// A DNS resolver (TEST-NET-2), and another.
pub const RESOLVER: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 53);
pub const OTHER_RESOLVER: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 54);

/// The answering side: every address the namespace holds, each port, TCP and UDP.
const RESPONDER: &str = r#"
import socket, sys, threading
def tcp(address, port):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((address, port)); s.listen(16)
    while True:
        c, _ = s.accept()
        try:
            if port == BULK_PORT:
                for _ in range(BULK_MIB): c.sendall(bytes(1 << 20))
            else: c.sendall(b"ok\n")
        except OSError: pass
        finally: c.close()
def udp(address, port):
    # Bound to the address itself: a reply from a wildcard socket leaves from the route's
    # source address, which a connected client ignores.
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((address, port))
    while True:
        _, peer = s.recvfrom(512); s.sendto(b"ok\n", peer)
BULK_PORT, BULK_MIB = int(sys.argv[2]), int(sys.argv[3])
for address in sys.argv[1].split(","):
    for port in map(int, sys.argv[4:]):
        for serve in (tcp, udp):
            threading.Thread(target=serve, args=(address, port), daemon=True).start()
print("listening", flush=True)
threading.Event().wait()
"#;

/// The world; [`EgressWorld::stop`] takes it down (a drop does what it can without libvirt).
#[derive(Debug)]
pub struct EgressWorld {
    /// The libvirt network guests join.
    pub network: String,
    pub bridge: String,
    /// The host's address on the bridge (a /24 the guests are on).
    pub host: Ipv4Addr,
    /// The namespace's address on the bridge: the peer on the guests' network, and the router
    /// to every other address of the world.
    pub peer: Ipv4Addr,
    /// The address a guest takes.
    pub guest: Ipv4Addr,
    netns: String,
    responders: Vec<Child>,
}

impl EgressWorld {
    /// Builds the world on `daemon`, named after `tag` (a few letters, unique per test).
    pub async fn start(daemon: &Libvirtd, tag: &str) -> Result<EgressWorld> {
        bridge_filtering_on()?;
        let id = std::process::id() % 200 + 20;
        let (host, peer, guest) = (
            Ipv4Addr::new(10, 254, id as u8, 1),
            Ipv4Addr::new(10, 254, id as u8, 2),
            Ipv4Addr::new(10, 254, id as u8, 10),
        );
        let network = format!("bnl{tag}{id}");
        let xml = format!(
            "<network><name>{network}</name><bridge name='{network}' stp='off'/>\
             <dns enable='no'/><ip address='{host}' prefix='24'/></network>"
        );
        let path = daemon.dir().join(format!("{network}.xml"));
        std::fs::write(&path, xml).map_err(|source| Error::Spawn {
            what: format!("write {}", path.display()),
            source,
        })?;
        daemon
            .virsh(["net-define", &path.display().to_string()])
            .await?;
        daemon.virsh(["net-start", &network]).await?;
        let mut world = EgressWorld {
            bridge: network.clone(),
            network,
            host,
            peer,
            guest,
            netns: format!("bnl{tag}{id}"),
            responders: Vec::new(),
        };
        world.plug_namespace()?;
        let netns = world.netns.clone();
        let in_namespace = world.respond(Some(&netns))?;
        world.responders.push(in_namespace);
        let on_host = world.respond(None)?;
        world.responders.push(on_host);
        Ok(world)
    }

    fn plug_namespace(&self) -> Result<()> {
        let (ns, outside, inside) = (
            self.netns.as_str(),
            format!("{}o", self.netns),
            format!("{}i", self.netns),
        );
        let _ = run("ip", &["netns", "del", ns]);
        run("ip", &["netns", "add", ns])?;
        run(
            "ip",
            &[
                "link", "add", &outside, "type", "veth", "peer", "name", &inside,
            ],
        )?;
        run(
            "ip",
            &["link", "set", &outside, "master", &self.bridge, "up"],
        )?;
        run("ip", &["link", "set", &inside, "netns", ns])?;
        let inner = |args: &[&str]| {
            let mut all = vec!["netns", "exec", ns, "ip"];
            all.extend_from_slice(args);
            run("ip", &all)
        };
        inner(&["link", "set", "lo", "up"])?;
        inner(&["addr", "add", &format!("{}/24", self.peer), "dev", &inside])?;
        inner(&["link", "set", &inside, "up"])?;
        for address in [SERVER, OTHER_SERVER, METADATA, RESOLVER, OTHER_RESOLVER] {
            inner(&["addr", "add", &format!("{address}/32"), "dev", "lo"])?;
        }
        Ok(())
    }

    /// Starts the responder, in the namespace `ns` on every address it holds, or on the
    /// host's bridge address.
    fn respond(&self, ns: Option<&str>) -> Result<Child> {
        let ports: Vec<String> = PORTS.iter().map(u16::to_string).collect();
        let mut command = match ns {
            Some(ns) => {
                let addresses = [
                    self.peer,
                    SERVER,
                    OTHER_SERVER,
                    METADATA,
                    RESOLVER,
                    OTHER_RESOLVER,
                ]
                .map(|a| a.to_string())
                .join(",");
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, "python3", "-c", RESPONDER, &addresses]);
                c
            }
            None => {
                let mut c = Command::new("python3");
                c.args(["-c", RESPONDER, &self.host.to_string()]);
                c
            }
        };
        let mut child = command
            .args([BULK_PORT.to_string(), BULK_MIB.to_string()])
            .args(&ports)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|source| Error::Spawn {
                what: "python3 (the responder)".into(),
                source,
            })?;
        // Listening once it says so: a probe before would be refused, not dropped.
        let mut line = String::new();
        if let Some(out) = child.stdout.take() {
            let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut line);
        }
        if line.trim() != "listening" {
            let _ = child.kill();
            let _ = child.wait();
            return Err(Error::Responder(format!(
                "it did not start listening on ports {ports:?} (taken?)"
            )));
        }
        Ok(child)
    }

    /// The second interface of a guest on this world's network, with `filter` (a libvirt
    /// network filter's name) on it when given.
    pub fn interface_xml(&self, mac: &str, filter: Option<&str>) -> String {
        let filterref = filter
            .map(|f| format!("<filterref filter='{f}'/>"))
            .unwrap_or_default();
        format!(
            "<interface type='network'><mac address='{mac}'/><source network='{}'/>\
             <model type='virtio'/>{filterref}</interface>",
            self.network
        )
    }

    /// Shell (for the guest's /bin/sh) that waits for the interface of `mac` (udev renames a
    /// hot-plugged one, so it is looked up once udev is done), gives it the world's guest
    /// address and routes the world's other addresses through the peer.
    pub fn guest_setup_script(&self, mac: &str) -> String {
        format!(
            "for i in $(seq 50); do udevadm settle -t 2 2>/dev/null; dev=; \
               for d in /sys/class/net/*; do \
                 [ \"$(cat $d/address)\" = {mac} ] && dev=${{d##*/}}; done; \
               [ -n \"$dev\" ] && ip link set \"$dev\" up 2>/dev/null && break; \
               sleep 0.2; done; \
             [ -n \"$dev\" ] || {{ echo no interface {mac}; exit 1; }}; \
             ip addr replace {guest}/24 dev \"$dev\" && \
             ip route replace 192.0.2.0/24 via {peer} && \
             ip route replace 198.51.100.0/24 via {peer} && \
             ip route replace {METADATA}/32 via {peer}",
            guest = self.guest,
            peer = self.peer
        )
    }

    /// Bash that tries each `(name, "tcp"|"udp", address, port)` at once, each for at most
    /// three seconds, printing `NAME reached` (the server's `ok` came back) or `NAME blocked`.
    /// The answer is read with `head`, not bash's `read`: `read` takes a byte at a time, and
    /// on a datagram socket the first byte's read discards the rest of the datagram.
    pub fn probe_script(rows: &[(&str, &str, Ipv4Addr, u16)]) -> String {
        let mut script = String::from(
            "probe() { if timeout 3 bash -c \"exec 3<>/dev/$2/$3/$4 && echo ping >&3 && \
             [ \\\"\\$(head -c 2 <&3)\\\" = ok ]\" 2>/dev/null; \
             then echo \"$1 reached\"; else echo \"$1 blocked\"; fi; }\n",
        );
        for (name, protocol, address, port) in rows {
            script.push_str(&format!("probe {name} {protocol} {address} {port} &\n"));
        }
        script.push_str("wait\n");
        script
    }

    /// Bash that reads [`BULK_PORT`]'s stream from `address` and prints `BYTES START END`,
    /// the two in nanoseconds of the guest's clock.
    pub fn bulk_script(address: Ipv4Addr) -> String {
        format!(
            "start=$(date +%s%N); bytes=$(timeout 60 cat </dev/tcp/{address}/{BULK_PORT} | wc -c); \
             end=$(date +%s%N); echo \"$bytes $start $end\""
        )
    }

    /// Parses [`EgressWorld::bulk_script`]'s line into (bytes, seconds).
    pub fn bulk_result(line: &str) -> Option<(u64, f64)> {
        let mut fields = line.split_whitespace().map(str::parse::<u64>);
        let (Some(Ok(bytes)), Some(Ok(start)), Some(Ok(end))) =
            (fields.next(), fields.next(), fields.next())
        else {
            return None;
        };
        Some((bytes, end.saturating_sub(start) as f64 / 1e9))
    }

    /// Takes the world down: the responders (this process's own children), the namespace,
    /// the network.
    pub async fn stop(mut self, daemon: &Libvirtd) -> Result<()> {
        self.kill_responders();
        let _ = run("ip", &["netns", "del", &self.netns]);
        daemon.virsh(["net-destroy", &self.network]).await?;
        daemon.virsh(["net-undefine", &self.network]).await?;
        Ok(())
    }

    fn kill_responders(&mut self) {
        for mut child in self.responders.drain(..) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for EgressWorld {
    fn drop(&mut self) {
        self.kill_responders();
        let _ = run("ip", &["netns", "del", &self.netns]);
        // libvirtd leaves a started network's bridge behind when it exits.
        let _ = run("ip", &["link", "del", &self.bridge]);
    }
}

/// Bridged frames pass the host's iptables only with `br_netfilter` loaded and
/// `bridge-nf-call-iptables` on, which a libvirt network filter needs to see a guest's traffic
/// to its neighbours (the libvirt provider guide's host requirements).
fn bridge_filtering_on() -> Result<()> {
    const KNOB: &str = "/proc/sys/net/bridge/bridge-nf-call-iptables";
    if !std::path::Path::new(KNOB).exists() {
        run("modprobe", &["br_netfilter"])?;
    }
    let mut knob = std::fs::OpenOptions::new()
        .write(true)
        .open(KNOB)
        .map_err(|e| Error::BridgeFilter(format!("open {KNOB}: {e}")))?;
    knob.write_all(b"1")
        .map_err(|e| Error::BridgeFilter(format!("write {KNOB}: {e}")))
}

fn run(program: &str, args: &[&str]) -> Result<String> {
    let what = format!("{program} {}", args.join(" "));
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|source| Error::Spawn {
            what: what.clone(),
            source,
        })?;
    if !out.status.success() {
        return Err(Error::Failed {
            what,
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
