//! The client against other libvirt clients, on one real libvirtd, in one run: python3-libvirt
//! (the C library, under Debian's `/usr/bin/python3`), go-libvirt (github.com/digitalocean/
//! go-libvirt, a pure Go client like ours: `benches/peers/golibvirt`, built once into
//! `~/.cache/banlieue/peers/` and rebuilt when its sources change) and, for volumes, `virsh`.
//! Every client uses the same TLS URI and PKI.
//!
//! - Calls (`calls`): connect (TCP, TLS, AUTH_LIST, CONNECT_OPEN; the client's PKI files read
//!   each time), `CONNECT_GET_LIB_VERSION` one after another, then with 32 in flight on one
//!   connection (ours: 32 tasks; Python: 32 threads, which libvirt-python runs concurrently;
//!   Go: 32 goroutines). The daemon is configured with `max_client_requests = 32` so that it,
//!   not the server, bounds concurrency.
//! - Domains (`domains`): on the test driver (`test+tls://…/default`, whose state lives while
//!   a connection holds it: this process holds one), 1,000 defined domains, then
//!   `DOMAIN_LOOKUP_BY_NAME` with 32 in flight and `CONNECT_LIST_ALL_DOMAINS` one after another.
//! - Volumes (`volumes`): 1 GiB of incompressible data up into a raw volume of a dir pool and
//!   back down; ours is this bench re-run as a worker process (`StorageVol::upload` from a file,
//!   `StorageVol::download_to_file`), every client as its own process under `/usr/bin/time`.
//!
//! Each workload runs in rounds, the clients interleaved (the first client rotates from round
//! to round) so that load from other work on the machine falls on all; medians are compared.
//! Besides wall time, each client's own CPU time (all its threads; ours from
//! `/proc/self/task/*/schedstat`, Python's `time.process_time`, Go's `getrusage`, a process's
//! from `/usr/bin/time`), which that load disturbs far less.
//!
//! ```text
//! cargo bench -p banlieue-libvirt --bench peer             # everything
//! cargo bench -p banlieue-libvirt --bench peer -- calls    # or some of: calls, domains, volumes
//! ```
//!
//! Prints a table; a peer's ratio is its time over ours (above 1 means we are faster).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use banlieue_libvirt::flags;
use banlieue_libvirt::proto::remote::procedures as rp;
use banlieue_libvirt::{CaBundle, Client, ConnectUri, Domain, Identity, StoragePool, StorageVol};
use banlieue_testenv::libvirtd::{Libvirtd, LibvirtdOptions};

const CONNECTS: usize = 20;
const SEQUENTIAL: usize = 5_000;
const CONCURRENT: usize = 32_000;
const IN_FLIGHT: usize = 32;
const DOMAINS: usize = 1_000;
const DOMAIN_PREFIX: &str = "bench-";
const LOOKUPS: usize = 32_000;
const LISTS: usize = 200;
const VOLUME: u64 = 1 << 30;
const ROUNDS: usize = 5;

/// The python3-libvirt driver; same modes and output as the Go one.
const PYTHON: &str = include_str!("peers/python3_libvirt.py");
/// The go-libvirt driver's module.
const GO_SOURCES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/peers/golibvirt");

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    if args.first().map(String::as_str) == Some("--worker") {
        runtime.block_on(worker(&args[1..]));
        return;
    }
    if !Libvirtd::available().expect("libvirtd is installed (run scripts/setup)") {
        return;
    }
    const PARTS: [&str; 3] = ["calls", "domains", "volumes"];
    let only = |part: &str| {
        !args.iter().any(|a| PARTS.contains(&a.as_str())) || args.iter().any(|a| a == part)
    };
    let go = go_peer();
    runtime.block_on(compare(
        go.as_deref(),
        only("calls"),
        only("domains"),
        only("volumes"),
    ));
}

// ---------------------------------------------------------------------------------------------
// The clients

/// One client of the comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Peer {
    Ours,
    Python,
    Go,
    Virsh,
}

impl Peer {
    fn name(self) -> &'static str {
        match self {
            Peer::Ours => "banlieue-libvirt",
            Peer::Python => "python3-libvirt",
            Peer::Go => "go-libvirt",
            Peer::Virsh => "virsh",
        }
    }
}

/// The go-libvirt driver, built from `GO_SOURCES` into a cache path named after a hash of its
/// sources and of `go version`, so that it is built once and again only when either changes.
/// `None` (the peer is left out) when Go is not installed.
fn go_peer() -> Option<PathBuf> {
    let go = ["go", "/usr/local/go/bin/go"].into_iter().find(|go| {
        Command::new(go)
            .arg("version")
            .output()
            .is_ok_and(|o| o.status.success())
    });
    let Some(go) = go else {
        eprintln!("go-libvirt is left out: no Go toolchain (`go`, /usr/local/go/bin/go)");
        return None;
    };
    let version = Command::new(go)
        .arg("version")
        .output()
        .expect("go version");
    let sources = Path::new(GO_SOURCES);
    let mut key = Fnv::default();
    key.write(&version.stdout);
    for file in ["go.mod", "go.sum", "main.go"] {
        key.write(file.as_bytes());
        key.write(&std::fs::read(sources.join(file)).expect("the go-libvirt driver's sources"));
    }
    let home = std::env::var_os("HOME").expect("HOME");
    let cache = std::env::var_os("BANLIEUE_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(&home).join(".cache/banlieue"));
    let binary = cache.join(format!("peers/golibvirt-{:016x}", key.0));
    if binary.exists() {
        return Some(binary);
    }
    eprintln!("building the go-libvirt driver into {}", binary.display());
    let partial = binary.with_extension("partial");
    let status = Command::new(go)
        .current_dir(sources)
        .env(
            "GOCACHE",
            std::env::var_os("GOCACHE").unwrap_or_else(|| cache.join("go-build").into()),
        )
        .env(
            "GOMODCACHE",
            std::env::var_os("GOMODCACHE").unwrap_or_else(|| cache.join("go-mod").into()),
        )
        // The versions and checksums in go.mod and go.sum, nothing resolved anew.
        .env("GOFLAGS", "-mod=readonly")
        .env("GOTOOLCHAIN", "local")
        .args(["build", "-trimpath", "-o"])
        .arg(&partial)
        .arg(".")
        .status()
        .expect("go build runs");
    assert!(status.success(), "building the go-libvirt driver failed");
    std::fs::rename(&partial, &binary).expect("cache the go-libvirt driver");
    Some(binary)
}

/// FNV-1a: a cache key stable across Rust versions (unlike `DefaultHasher`).
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// Runs a peer's driver in `mode` and returns the numbers it prints.
fn run_driver(peer: Peer, go: Option<&Path>, mode: &str, args: &[String]) -> Vec<f64> {
    let mut cmd = match peer {
        Peer::Python => {
            let mut cmd = Command::new("/usr/bin/python3");
            cmd.args(["-c", PYTHON]);
            cmd
        }
        Peer::Go => Command::new(go.expect("go-libvirt driver")),
        other => unreachable!("{other:?} has no driver"),
    };
    let out = cmd.arg(mode).args(args).output().expect("driver runs");
    assert!(
        out.status.success(),
        "{} {mode}: {}",
        peer.name(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(|s| s.parse().expect("a number"))
        .collect()
}

async fn connect(uri: &str) -> Client {
    let pki = PathBuf::from(
        ConnectUri::parse(uri)
            .expect("uri")
            .pkipath
            .expect("pkipath"),
    );
    let id = Identity::from_files(&pki.join("clientcert.pem"), &pki.join("clientkey.pem"))
        .expect("identity");
    let ca = CaBundle::from_file(&pki.join("cacert.pem")).expect("ca");
    Client::connect(uri, &id, &ca).await.expect("connects")
}

/// `--worker upload|download URI POOL VOL FILE`: one transfer, as its own process so that its
/// peak RSS and CPU time are measured alone.
async fn worker(args: &[String]) {
    let [op, uri, pool, vol, file] = args else {
        panic!("--worker upload|download URI POOL VOL FILE");
    };
    let c = connect(uri).await;
    let pool = StoragePool::lookup_by_name(&c, pool)
        .await
        .expect("lookup")
        .expect("pool");
    let vol = StorageVol::lookup_by_name(&pool, vol)
        .await
        .expect("lookup")
        .expect("vol");
    match op.as_str() {
        "upload" => {
            let mut f = tokio::fs::File::open(file).await.expect("open");
            let len = f.metadata().await.expect("stat").len();
            vol.upload(
                &mut f,
                banlieue_libvirt::stream::TransferOptions::new().length(len),
            )
            .await
            .expect("upload");
        }
        "download" => {
            let f = tokio::fs::File::create(file).await.expect("create");
            vol.download_to_file(f, banlieue_libvirt::stream::TransferOptions::new())
                .await
                .expect("download");
        }
        other => panic!("unknown worker operation {other}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Measurements and the table

/// Wall and CPU time of one run of a workload by one client.
#[derive(Debug, Clone, Copy)]
struct Sample {
    wall: Duration,
    cpu: Duration,
    /// Peak RSS in KiB, for whole processes.
    rss_kib: Option<u64>,
}

impl Sample {
    fn new(wall: f64, cpu: f64) -> Sample {
        Sample {
            wall: Duration::from_secs_f64(wall),
            cpu: Duration::from_secs_f64(cpu),
            rss_kib: None,
        }
    }
}

/// CPU time of every thread of this process so far, from `/proc/self/task/*/schedstat`.
fn own_cpu() -> Duration {
    let mut ns: u64 = 0;
    for task in std::fs::read_dir("/proc/self/task")
        .expect("proc")
        .flatten()
    {
        if let Ok(stat) = std::fs::read_to_string(task.path().join("schedstat")) {
            ns += stat
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    Duration::from_nanos(ns)
}

/// Times `f` in this process: wall and CPU of all threads.
async fn measure<F: std::future::Future<Output = ()>>(f: F) -> Sample {
    let (start, cpu) = (Instant::now(), own_cpu());
    f.await;
    Sample {
        wall: start.elapsed(),
        cpu: own_cpu() - cpu,
        rss_kib: None,
    }
}

/// How a row reads its samples.
#[derive(Debug, Clone, Copy)]
enum Unit {
    /// `n` calls per sample: calls/s and µs CPU per call.
    Calls(usize),
    /// `n` connects per sample: ms per connect and ms CPU per connect.
    Connects(usize),
    /// One transfer of `VOLUME` bytes per sample: s, MiB/s, CPU s, peak RSS.
    Transfer,
}

/// One workload: every client's samples, ours first.
struct Row {
    name: String,
    unit: Unit,
    samples: Vec<(Peer, Vec<Sample>)>,
}

impl Row {
    fn new(name: String, unit: Unit) -> Row {
        Row {
            name,
            unit,
            samples: Vec::new(),
        }
    }

    fn push(&mut self, peer: Peer, s: Sample) {
        match self.samples.iter_mut().find(|(p, _)| *p == peer) {
            Some((_, v)) => v.push(s),
            None => self.samples.push((peer, vec![s])),
        }
    }

    fn median(&self, peer: Peer) -> Option<Sample> {
        let (_, v) = self.samples.iter().find(|(p, _)| *p == peer)?;
        let pick = |f: fn(&Sample) -> Duration| {
            let mut d: Vec<Duration> = v.iter().map(f).collect();
            d.sort();
            d[d.len() / 2]
        };
        let mut rss: Vec<u64> = v.iter().filter_map(|s| s.rss_kib).collect();
        rss.sort_unstable();
        Some(Sample {
            wall: pick(|s| s.wall),
            cpu: pick(|s| s.cpu),
            rss_kib: rss.get(rss.len() / 2).copied(),
        })
    }

    /// The range of wall-time figures over the rounds, as the spread line shows it.
    fn spread(&self, peer: Peer) -> String {
        let Some((_, v)) = self.samples.iter().find(|(p, _)| *p == peer) else {
            return String::new();
        };
        let figures: Vec<f64> = v.iter().map(|s| self.figure(s.wall)).collect();
        let lo = figures.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = figures.iter().copied().fold(0.0, f64::max);
        match self.unit {
            Unit::Calls(_) => format!(
                "{} {}–{}",
                peer.name(),
                grouped(lo as u64),
                grouped(hi as u64)
            ),
            Unit::Connects(_) | Unit::Transfer => format!("{} {lo:.2}–{hi:.2}", peer.name()),
        }
    }

    /// The headline figure of a wall time: calls/s, ms per connect, or seconds.
    fn figure(&self, wall: Duration) -> f64 {
        match self.unit {
            Unit::Calls(n) => n as f64 / wall.as_secs_f64(),
            Unit::Connects(n) => wall.as_secs_f64() * 1e3 / n as f64,
            Unit::Transfer => wall.as_secs_f64(),
        }
    }

    fn cell(&self, s: Sample) -> String {
        match self.unit {
            Unit::Calls(n) => format!(
                "{} calls/s, {:.1} µs CPU/call",
                grouped(self.figure(s.wall) as u64),
                s.cpu.as_secs_f64() * 1e6 / n as f64
            ),
            Unit::Connects(n) => format!(
                "{:.2} ms, {:.2} ms CPU",
                self.figure(s.wall),
                s.cpu.as_secs_f64() * 1e3 / n as f64
            ),
            Unit::Transfer => format!(
                "{:.2} s, {:.0} MiB/s, {:.2} s CPU, peak RSS {:.1} MiB",
                s.wall.as_secs_f64(),
                VOLUME as f64 / (1 << 20) as f64 / s.wall.as_secs_f64(),
                s.cpu.as_secs_f64(),
                s.rss_kib.unwrap_or(0) as f64 / 1024.0
            ),
        }
    }

    /// `| workload | ours | python3-libvirt | go-libvirt | virsh |`, each peer with its
    /// ratios to ours.
    fn print(&self) {
        let ours = self.median(Peer::Ours).expect("ours ran");
        let mut line = format!("| {} | {} |", self.name, self.cell(ours));
        for peer in [Peer::Python, Peer::Go, Peer::Virsh] {
            match self.median(peer) {
                Some(s) => line.push_str(&format!(
                    " {}: **{:.2}×** (CPU {:.2}×) |",
                    self.cell(s),
                    s.wall.as_secs_f64() / ours.wall.as_secs_f64(),
                    s.cpu.as_secs_f64() / ours.cpu.as_secs_f64()
                )),
                None => line.push_str(" — |"),
            }
        }
        println!("{line}");
        let spreads: Vec<String> = self.samples.iter().map(|(p, _)| self.spread(*p)).collect();
        eprintln!("{} over {ROUNDS} rounds: {}", self.name, spreads.join(", "));
    }
}

/// `12,345`: figures as the documentation prints them.
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(d);
    }
    out
}

/// The clients of a round in the order they run: rotated each round so that none always runs
/// first (or always after the same one).
fn order(round: usize, peers: &[Peer]) -> Vec<Peer> {
    let mut v = peers.to_vec();
    v.rotate_left(round % peers.len());
    v
}

async fn compare(go: Option<&Path>, calls: bool, domains: bool, volumes: bool) {
    let d = Libvirtd::start(LibvirtdOptions::default().with_max_client_requests(IN_FLIGHT as u32))
        .await
        .expect("libvirtd starts");
    let uri = d.virsh_uri();
    let mut peers = vec![Peer::Ours, Peer::Python];
    if go.is_some() {
        peers.push(Peer::Go);
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    eprintln!("load average before: {}", load.trim());

    let mut rows = Vec::new();
    if calls {
        rows.extend(compare_calls(&peers, go, &uri).await);
    }
    if domains {
        rows.extend(compare_domains(&peers, go, &d).await);
    }
    if volumes {
        let mut peers = peers.clone();
        peers.push(Peer::Virsh);
        rows.extend(compare_volumes(&peers, go, &d, &uri).await);
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    eprintln!("load average after: {}", load.trim());

    println!(
        "\n| workload | banlieue-libvirt | python3-libvirt: time / ours | go-libvirt: time / ours | virsh: time / ours |"
    );
    println!("|---|---|---|---|---|");
    for row in &rows {
        row.print();
    }
}

// ---------------------------------------------------------------------------------------------
// Workloads

async fn compare_calls(peers: &[Peer], go: Option<&Path>, uri: &str) -> Vec<Row> {
    let mut connects = Row::new(
        "connect (TLS, AUTH_LIST, CONNECT_OPEN)".into(),
        Unit::Connects(CONNECTS),
    );
    let mut sequential = Row::new(
        format!("{} sequential GET_LIB_VERSION", grouped(SEQUENTIAL as u64)),
        Unit::Calls(SEQUENTIAL),
    );
    let mut in_flight = Row::new(
        format!(
            "{} GET_LIB_VERSION, {IN_FLIGHT} in flight",
            grouped(CONCURRENT as u64)
        ),
        Unit::Calls(CONCURRENT),
    );
    for round in 0..ROUNDS {
        for peer in order(round, peers) {
            if peer == Peer::Ours {
                let mut total = Sample::new(0.0, 0.0);
                for _ in 0..CONNECTS {
                    let (start, cpu) = (Instant::now(), own_cpu());
                    let c = connect(uri).await;
                    total.wall += start.elapsed();
                    total.cpu += own_cpu() - cpu;
                    c.close().await.expect("close");
                }
                connects.push(peer, total);
                let (s, f) = our_calls(&connect(uri).await).await;
                sequential.push(peer, s);
                in_flight.push(peer, f);
            } else {
                let v = run_driver(peer, go, "connect", &[uri.into(), CONNECTS.to_string()]);
                connects.push(peer, Sample::new(v[0], v[1]));
                let args = [uri.to_string()]
                    .into_iter()
                    .chain([SEQUENTIAL, CONCURRENT, IN_FLIGHT].map(|n| n.to_string()))
                    .collect::<Vec<_>>();
                let v = run_driver(peer, go, "calls", &args);
                sequential.push(peer, Sample::new(v[0], v[2]));
                in_flight.push(peer, Sample::new(v[1], v[3]));
            }
        }
    }
    vec![connects, sequential, in_flight]
}

async fn our_calls(c: &Client) -> (Sample, Sample) {
    for _ in 0..200 {
        c.call::<rp::ConnectGetLibVersion>(&()).await.expect("warm");
    }
    let sequential = measure(async {
        for _ in 0..SEQUENTIAL {
            c.call::<rp::ConnectGetLibVersion>(&()).await.expect("call");
        }
    })
    .await;
    let in_flight = measure(async {
        let tasks: Vec<_> = (0..IN_FLIGHT)
            .map(|_| {
                let c = c.clone();
                tokio::spawn(async move {
                    for _ in 0..CONCURRENT / IN_FLIGHT {
                        c.call::<rp::ConnectGetLibVersion>(&()).await.expect("call");
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("task");
        }
    })
    .await;
    (sequential, in_flight)
}

fn domain_name(i: usize) -> String {
    format!("{DOMAIN_PREFIX}{i:04}")
}

async fn compare_domains(peers: &[Peer], go: Option<&Path>, d: &Libvirtd) -> Vec<Row> {
    let uri = format!(
        "test+tls://127.0.0.1:{}/default?pkipath={}",
        d.tls_port(),
        d.pki_dir().display()
    );
    // The test driver's shared state lives while a connection holds it: this one, to the end.
    let holder = connect(&uri).await;
    for i in 0..DOMAINS {
        let xml = format!(
            "<domain type='test'><name>{}</name><memory>1024</memory><os><type>hvm</type></os></domain>",
            domain_name(i)
        );
        Domain::define_xml(&holder, &xml).await.expect("define");
    }
    let listed = Domain::list_all(&holder, flags::ConnectListAllDomainsFlags::empty())
        .await
        .expect("list")
        .len();
    assert!(listed > DOMAINS, "{listed} domains listed");

    let mut lookups = Row::new(
        format!(
            "{} DOMAIN_LOOKUP_BY_NAME, {IN_FLIGHT} in flight (test driver)",
            grouped(LOOKUPS as u64)
        ),
        Unit::Calls(LOOKUPS),
    );
    let mut lists = Row::new(
        format!(
            "{LISTS} sequential LIST_ALL_DOMAINS of {} domains (test driver)",
            grouped(listed as u64)
        ),
        Unit::Calls(LISTS),
    );
    for round in 0..ROUNDS {
        for peer in order(round, peers) {
            if peer == Peer::Ours {
                let c = connect(&uri).await;
                lookups.push(peer, our_lookups(&c).await);
                let (s, n) = our_lists(&c).await;
                assert_eq!(n, listed);
                lists.push(peer, s);
                c.close().await.expect("close");
            } else {
                let args = [
                    uri.clone(),
                    DOMAIN_PREFIX.into(),
                    DOMAINS.to_string(),
                    LOOKUPS.to_string(),
                    IN_FLIGHT.to_string(),
                ];
                let v = run_driver(peer, go, "lookup", &args);
                lookups.push(peer, Sample::new(v[0], v[1]));
                let v = run_driver(peer, go, "list", &[uri.clone(), LISTS.to_string()]);
                assert_eq!(v[2] as usize, listed, "{} listed", peer.name());
                lists.push(peer, Sample::new(v[0], v[1]));
            }
        }
    }
    drop(holder);
    vec![lookups, lists]
}

async fn our_lookups(c: &Client) -> Sample {
    let names: std::sync::Arc<Vec<String>> =
        std::sync::Arc::new((0..DOMAINS).map(domain_name).collect());
    for i in 0..200 {
        Domain::lookup_by_name(c, &names[i % DOMAINS])
            .await
            .expect("lookup")
            .expect("defined");
    }
    measure(async {
        let tasks: Vec<_> = (0..IN_FLIGHT)
            .map(|g| {
                let (c, names) = (c.clone(), names.clone());
                tokio::spawn(async move {
                    for i in (g..LOOKUPS).step_by(IN_FLIGHT) {
                        Domain::lookup_by_name(&c, &names[i % DOMAINS])
                            .await
                            .expect("lookup")
                            .expect("defined");
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("task");
        }
    })
    .await
}

async fn our_lists(c: &Client) -> (Sample, usize) {
    let all = flags::ConnectListAllDomainsFlags::empty();
    let mut count = 0;
    for _ in 0..2 {
        count = Domain::list_all(c, all).await.expect("list").len();
    }
    let s = measure(async {
        for _ in 0..LISTS {
            let n = Domain::list_all(c, all).await.expect("list").len();
            assert_eq!(n, count);
        }
    })
    .await;
    (s, count)
}

/// Wall time, CPU time and peak RSS of a command, from `/usr/bin/time`.
fn timed(cmd: &mut Command) -> Sample {
    let report = tempfile::NamedTempFile::new().expect("temp");
    let program = cmd.get_program().to_owned();
    let args: Vec<_> = cmd.get_args().map(ToOwned::to_owned).collect();
    let status = Command::new("/usr/bin/time")
        .args(["-f", "%e %U %S %M", "-o"])
        .arg(report.path())
        .arg(program)
        .args(args)
        .status()
        .expect("/usr/bin/time runs");
    assert!(status.success(), "{cmd:?} failed");
    let text = std::fs::read_to_string(report.path()).expect("report");
    let v: Vec<f64> = text
        .split_whitespace()
        .map(|s| s.parse().expect("a number"))
        .collect();
    Sample {
        wall: Duration::from_secs_f64(v[0]),
        cpu: Duration::from_secs_f64(v[1] + v[2]),
        rss_kib: Some(v[3] as u64),
    }
}

fn incompressible_file(path: &Path, len: u64) {
    use std::io::Write;
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).expect("create"));
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut block = vec![0u8; 1 << 20];
    for _ in 0..len / block.len() as u64 {
        for b in block.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b.copy_from_slice(&x.to_le_bytes());
        }
        f.write_all(&block).expect("write");
    }
    f.flush().expect("flush");
}

fn same_bytes(a: &Path, b: &Path) -> bool {
    Command::new("cmp")
        .arg("-s")
        .arg(a)
        .arg(b)
        .status()
        .expect("cmp")
        .success()
}

async fn compare_volumes(peers: &[Peer], go: Option<&Path>, d: &Libvirtd, uri: &str) -> Vec<Row> {
    let c = connect(uri).await;
    let dir = d.create_pool_dir("bench").expect("pool dir");
    let xml = format!(
        "<pool type='dir'><name>bench</name><target><path>{}</path></target></pool>",
        dir.display()
    );
    let pool = StoragePool::define_xml(&c, &xml).await.expect("pool");
    pool.create(flags::StoragePoolCreateFlags::empty())
        .await
        .expect("pool started");
    let vol_xml = format!(
        "<volume><name>big.raw</name><capacity unit='bytes'>{VOLUME}</capacity><target><format type='raw'/></target></volume>"
    );
    StorageVol::create_xml(&pool, &vol_xml, flags::StorageVolCreateFlags::empty())
        .await
        .expect("volume");
    let work = d.dir().join("bench-files");
    std::fs::create_dir_all(&work).expect("dir");
    let source = work.join("source.raw");
    incompressible_file(&source, VOLUME);

    let me = std::env::current_exe().expect("own path");
    let transfer = |peer: Peer, upload: bool, file: &Path| {
        let op = if upload { "upload" } else { "download" };
        let mut cmd = match peer {
            Peer::Ours => {
                let mut cmd = Command::new(&me);
                cmd.args(["--worker", op]);
                cmd
            }
            Peer::Python => {
                let mut cmd = Command::new("/usr/bin/python3");
                cmd.args(["-c", PYTHON, op]);
                cmd
            }
            Peer::Go => {
                let mut cmd = Command::new(go.expect("go-libvirt driver"));
                cmd.arg(op);
                cmd
            }
            Peer::Virsh => {
                let mut cmd = Command::new("virsh");
                cmd.args([
                    "-q",
                    "-c",
                    uri,
                    &format!("vol-{op}"),
                    "--pool",
                    "bench",
                    "big.raw",
                ])
                .arg(file);
                return timed(&mut cmd);
            }
        };
        cmd.args([uri, "bench", "big.raw"]).arg(file);
        timed(&mut cmd)
    };
    let mut upload = Row::new(format!("upload {} GiB", VOLUME >> 30), Unit::Transfer);
    let mut download = Row::new(format!("download {} GiB", VOLUME >> 30), Unit::Transfer);
    for round in 0..ROUNDS {
        for peer in order(round, peers) {
            upload.push(peer, transfer(peer, true, &source));
            let down = work.join(format!("{}.raw", peer.name()));
            download.push(peer, transfer(peer, false, &down));
            // Each client's upload, then its download, checked once: byte for byte.
            if round == 0 {
                assert!(
                    same_bytes(&source, &down),
                    "{}'s round trip differs",
                    peer.name()
                );
            }
            std::fs::remove_file(&down).expect("remove download");
        }
    }
    vec![upload, download]
}
