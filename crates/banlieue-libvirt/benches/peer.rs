//! The client against libvirt's own clients, on one real libvirtd, in one run.
//!
//! - Calls: `CONNECT_GET_LIB_VERSION` sequentially, then with 32 calls in flight on one
//!   connection (32 tasks; Python: 32 threads, which libvirt-python lets run concurrently),
//!   against `/usr/bin/python3` with Debian's python3-libvirt over the same TLS URI; five
//!   rounds, interleaved, medians compared. Besides wall time, each client's own CPU time per
//!   call (all threads: `/proc/self/task/*/schedstat`; Python: `time.process_time`), which
//!   load from other work on the machine disturbs far less. The daemon
//!   is configured with `max_client_requests = 32` so that it, not the server, bounds
//!   concurrency.
//! - Volumes: 1 GiB of incompressible data up into a raw volume of a dir pool and back down,
//!   ours (this bench re-run as a worker process: `StorageVol::upload` from a file,
//!   `StorageVol::download_to_file`) against `virsh vol-upload` / `vol-download`,
//!   each under `/usr/bin/time` for wall time and peak RSS. Median of five interleaved runs each.
//!
//! ```text
//! cargo bench -p banlieue-libvirt --bench peer             # both parts
//! cargo bench -p banlieue-libvirt --bench peer -- calls    # or only one: calls, volumes
//! ```
//!
//! Prints a table with the ratios (libvirt's time / ours: above 1 means we are faster).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use banlieue_libvirt::flags;
use banlieue_libvirt::proto::remote::procedures as rp;
use banlieue_libvirt::{CaBundle, Client, ConnectUri, Identity, StoragePool, StorageVol};
use banlieue_testenv::libvirtd::{Libvirtd, LibvirtdOptions};

const SEQUENTIAL: usize = 5_000;
const CONCURRENT: usize = 32_000;
const IN_FLIGHT: usize = 32;
const VOLUME: u64 = 1 << 30;
const RUNS: usize = 5;

const PYTHON: &str = r#"
import sys, threading, time, libvirt
uri, n, m, t = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
c = libvirt.open(uri)
for _ in range(200): c.getLibVersion()
s, cpu = time.perf_counter(), time.process_time()
for _ in range(n): c.getLibVersion()
seq, seq_cpu = time.perf_counter() - s, time.process_time() - cpu
def work(k):
    for _ in range(k): c.getLibVersion()
threads = [threading.Thread(target=work, args=(m // t,)) for _ in range(t)]
s, cpu = time.perf_counter(), time.process_time()
for th in threads: th.start()
for th in threads: th.join()
print(seq, time.perf_counter() - s, seq_cpu, time.process_time() - cpu)
"#;

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
    let only = |part: &str| {
        !args.iter().any(|a| a == "calls" || a == "volumes") || args.iter().any(|a| a == part)
    };
    runtime.block_on(compare(only("calls"), only("volumes")));
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
/// peak RSS is measured alone.
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

/// Wall time and the client's CPU time (all its threads) of the two call workloads.
#[derive(Debug, Clone, Copy)]
struct CallRound {
    sequential: Duration,
    in_flight: Duration,
    sequential_cpu: Duration,
    in_flight_cpu: Duration,
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

async fn our_calls(c: &Client) -> CallRound {
    for _ in 0..200 {
        c.call::<rp::ConnectGetLibVersion>(&()).await.expect("warm");
    }
    let (start, cpu) = (Instant::now(), own_cpu());
    for _ in 0..SEQUENTIAL {
        c.call::<rp::ConnectGetLibVersion>(&()).await.expect("call");
    }
    let (sequential, sequential_cpu) = (start.elapsed(), own_cpu() - cpu);
    let (start, cpu) = (Instant::now(), own_cpu());
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
    CallRound {
        sequential,
        in_flight: start.elapsed(),
        sequential_cpu,
        in_flight_cpu: own_cpu() - cpu,
    }
}

fn python_calls(uri: &str) -> CallRound {
    let out = Command::new("/usr/bin/python3")
        .args(["-c", PYTHON, uri])
        .args([SEQUENTIAL, CONCURRENT, IN_FLIGHT].map(|n| n.to_string()))
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "python3-libvirt: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let secs: Vec<Duration> = text
        .split_whitespace()
        .map(|s| Duration::from_secs_f64(s.parse().expect("seconds")))
        .collect();
    CallRound {
        sequential: secs[0],
        in_flight: secs[1],
        sequential_cpu: secs[2],
        in_flight_cpu: secs[3],
    }
}

/// Wall time and peak RSS (KiB) of a command, from `/usr/bin/time`.
fn timed(cmd: &mut Command) -> (Duration, u64) {
    let report = tempfile::NamedTempFile::new().expect("temp");
    let program = cmd.get_program().to_owned();
    let args: Vec<_> = cmd.get_args().map(ToOwned::to_owned).collect();
    let status = Command::new("/usr/bin/time")
        .args(["-f", "%e %M", "-o"])
        .arg(report.path())
        .arg(program)
        .args(args)
        .status()
        .expect("/usr/bin/time runs");
    assert!(status.success(), "{cmd:?} failed");
    let text = std::fs::read_to_string(report.path()).expect("report");
    let mut it = text.split_whitespace();
    let secs: f64 = it.next().expect("seconds").parse().expect("seconds");
    let kib: u64 = it.next().expect("rss").parse().expect("rss");
    (Duration::from_secs_f64(secs), kib)
}

fn median(mut v: Vec<(Duration, u64)>) -> (Duration, u64) {
    v.sort();
    v[v.len() / 2]
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

async fn compare(calls: bool, volumes: bool) {
    let d = Libvirtd::start(LibvirtdOptions::default().with_max_client_requests(IN_FLIGHT as u32))
        .await
        .expect("libvirtd starts");
    let uri = d.virsh_uri();
    let c = connect(&uri).await;

    println!("\n| workload | banlieue-libvirt | libvirt | libvirt time / ours |");
    println!("|---|---|---|---|");
    if calls {
        compare_calls(&c, &uri).await;
    }
    if volumes {
        compare_volumes(&d, &c, &uri).await;
    }
}

/// Rounds of the call workloads, ours and Python's interleaved, so that load from other work
/// on the machine falls on both; the medians are compared.
const CALL_ROUNDS: usize = 5;

fn median_of(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

async fn compare_calls(c: &Client, uri: &str) {
    let (mut ours, mut python) = (Vec::new(), Vec::new());
    for _ in 0..CALL_ROUNDS {
        ours.push(our_calls(c).await);
        python.push(python_calls(uri));
    }
    let med =
        |v: &[CallRound], pick: fn(&CallRound) -> Duration| median_of(v.iter().map(pick).collect());
    let spread = |v: &[CallRound], pick: fn(&CallRound) -> Duration, n: usize| {
        let rates: Vec<f64> = v.iter().map(|r| n as f64 / pick(r).as_secs_f64()).collect();
        let lo = rates.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = rates.iter().copied().fold(0.0, f64::max);
        format!("{lo:.0}–{hi:.0}")
    };
    eprintln!(
        "calls/s over {CALL_ROUNDS} rounds: sequential ours {} python {}; in flight ours {} python {}",
        spread(&ours, |r| r.sequential, SEQUENTIAL),
        spread(&python, |r| r.sequential, SEQUENTIAL),
        spread(&ours, |r| r.in_flight, CONCURRENT),
        spread(&python, |r| r.in_flight, CONCURRENT),
    );
    let rate = |n: usize, t: Duration| n as f64 / t.as_secs_f64();
    let per_call = |n: usize, t: Duration| t.as_secs_f64() * 1e6 / n as f64;
    for (name, n, wall, cpu) in [
        (
            format!("{SEQUENTIAL} sequential GET_LIB_VERSION"),
            SEQUENTIAL,
            (|r: &CallRound| r.sequential) as fn(&CallRound) -> Duration,
            (|r: &CallRound| r.sequential_cpu) as fn(&CallRound) -> Duration,
        ),
        (
            format!("{CONCURRENT} GET_LIB_VERSION, {IN_FLIGHT} in flight"),
            CONCURRENT,
            |r: &CallRound| r.in_flight,
            |r: &CallRound| r.in_flight_cpu,
        ),
    ] {
        let (ow, pw) = (med(&ours, wall), med(&python, wall));
        let (oc, pc) = (med(&ours, cpu), med(&python, cpu));
        println!(
            "| {name} | {:.0} calls/s, {:.1} µs CPU/call | {:.0} calls/s, {:.1} µs CPU/call (python3-libvirt) | {:.2} (CPU {:.2}) |",
            rate(n, ow),
            per_call(n, oc),
            rate(n, pw),
            per_call(n, pc),
            pw.as_secs_f64() / ow.as_secs_f64(),
            pc.as_secs_f64() / oc.as_secs_f64(),
        );
    }
}

async fn compare_volumes(d: &Libvirtd, c: &Client, uri: &str) {
    let dir = d.create_pool_dir("bench").expect("pool dir");
    let xml = format!(
        "<pool type='dir'><name>bench</name><target><path>{}</path></target></pool>",
        dir.display()
    );
    let pool = StoragePool::define_xml(c, &xml).await.expect("pool");
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
    let ours_down = work.join("ours.raw");
    let virsh_down = work.join("virsh.raw");

    let me = std::env::current_exe().expect("own path");
    let ours = |op: &str, file: &Path| {
        let mut cmd = Command::new(&me);
        cmd.args(["--worker", op, uri, "bench", "big.raw"])
            .arg(file);
        timed(&mut cmd)
    };
    let virsh = |op: &str, file: &Path| {
        let mut cmd = Command::new("virsh");
        cmd.args(["-q", "-c", uri, op, "--pool", "bench", "big.raw"])
            .arg(file);
        timed(&mut cmd)
    };
    let mut results: [Vec<(Duration, u64)>; 4] = Default::default();
    for _ in 0..RUNS {
        results[0].push(ours("upload", &source));
        results[1].push(virsh("vol-upload", &source));
        results[2].push(ours("download", &ours_down));
        results[3].push(virsh("vol-download", &virsh_down));
    }
    assert!(same_bytes(&source, &ours_down), "our download differs");
    assert!(same_bytes(&source, &virsh_down), "virsh's download differs");
    let [up_ours, up_virsh, down_ours, down_virsh] = results.map(median);

    let mibs = |t: Duration| VOLUME as f64 / (1 << 20) as f64 / t.as_secs_f64();
    for (name, (ot, orss), (vt, vrss)) in [
        ("upload 1 GiB", up_ours, up_virsh),
        ("download 1 GiB", down_ours, down_virsh),
    ] {
        println!(
            "| {name} | {:.2} s, {:.0} MiB/s, peak RSS {:.1} MiB | {:.2} s, {:.0} MiB/s, peak RSS {:.1} MiB (virsh) | {:.2} |",
            ot.as_secs_f64(),
            mibs(ot),
            orss as f64 / 1024.0,
            vt.as_secs_f64(),
            mibs(vt),
            vrss as f64 / 1024.0,
            vt.as_secs_f64() / ot.as_secs_f64()
        );
    }
}
