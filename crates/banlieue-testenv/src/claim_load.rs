//! One load generator for every system that hands out warm members through claims: banlieue's
//! VirtualMachineClaims and agent-sandbox's SandboxClaims are driven by the same code, timed
//! the same way and counted the same way, so a figure of one is comparable with the other's.
//!
//! - Arrivals are a Poisson process at a rate for a fixed duration (inter-arrival gaps drawn
//!   from an exponential distribution, offsets absolute from the start so a late create does not
//!   delay the next), or a burst of N creates at once.
//! - A claim's latency runs from just before its create request to the moment a watch opened
//!   before the first create sees it ready (the system's own definition: [`ClaimSystem::is_ready`]).
//! - Each claim may be deleted a dwell after it is ready, so members churn as in real use.
//! - The API server's own `apiserver_request_total` gives the writes of a phase, and `/proc`
//!   gives a controller's CPU time and resident set, sampled while the phase runs.
//!
//! The pure parts (the schedule, quantiles, the metrics and `/proc` parsers) are unit-tested
//! here; the driver runs against real API servers in the tests that use it.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt as _, TryStreamExt as _};
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};

/// What goes wrong driving a load.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("{what}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("the watch of claims ended")]
    WatchEnded,
    #[error("{ready} of {created} claims ready after {after:?}; not ready: {missing:?}")]
    NotReady {
        created: usize,
        ready: usize,
        after: Duration,
        missing: Vec<String>,
    },
    #[error("read {path}: {source}")]
    Proc {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the machine was still {:.0}% busy after {after:?}", (1.0 - .idle) * 100.0)]
    NotQuiet { idle: f64, after: Duration },
    #[error("{path} has no {field}")]
    ProcField { path: String, field: &'static str },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

fn kube_error(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let what = what.into();
    move |source| Error::Kube { what, source }
}

/// A system that hands out warm members through claims.
pub trait ClaimSystem: Sync {
    /// Its name in reports.
    fn name(&self) -> &str;
    /// Where its claims are created.
    fn claims(&self) -> Api<DynamicObject>;
    /// A claim named `name` on the warm pool under test.
    fn claim(&self, name: &str) -> DynamicObject;
    /// Whether the claim has its member, as the system defines it.
    fn is_ready(&self, claim: &DynamicObject) -> bool;
    /// How many members the pool under test holds ready and unclaimed.
    fn warm(&self) -> impl Future<Output = Result<usize>> + Send;
    /// The PID of its controller.
    fn controller_pid(&self) -> u32;
    /// What keeps the pool short of full, one line each, for the error when it does not
    /// refill in time.
    fn shortfall(&self) -> impl Future<Output = Vec<String>> + Send {
        async { Vec::new() }
    }
}

/// When claims arrive.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arrivals {
    /// A Poisson process at `rate` claims/s for `duration`, its gaps drawn from `seed`.
    Poisson {
        rate: f64,
        duration: Duration,
        seed: u64,
    },
    /// `count` creates at once.
    Burst { count: usize },
}

impl Arrivals {
    /// Offsets of the arrivals from the start, in order.
    pub fn offsets(&self) -> Vec<Duration> {
        match *self {
            Arrivals::Burst { count } => vec![Duration::ZERO; count],
            Arrivals::Poisson {
                rate,
                duration,
                seed,
            } => PoissonSchedule::new(rate, seed)
                .take_while(|offset| *offset < duration)
                .collect(),
        }
    }
}

/// Arrival offsets of a homogeneous Poisson process: exponential gaps of mean `1/rate`,
/// absolute from the origin, strictly increasing. Seeded, so a run is repeatable and both
/// systems see the same arrivals.
#[derive(Clone, Debug)]
pub struct PoissonSchedule {
    rate: f64,
    state: u64,
    next: Duration,
}

impl PoissonSchedule {
    pub fn new(rate: f64, seed: u64) -> Self {
        assert!(rate > 0.0, "a Poisson rate must be positive, not {rate}");
        Self {
            rate,
            state: seed,
            next: Duration::ZERO,
        }
    }

    /// splitmix64: small, well mixed, and the same on every machine.
    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

impl Iterator for PoissonSchedule {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        // A uniform draw in (0, 1]: 53 random bits, never 0, so the logarithm is finite.
        let uniform = ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64;
        let gap = Duration::from_secs_f64(-uniform.ln() / self.rate).max(Duration::from_nanos(1));
        self.next += gap;
        Some(self.next)
    }
}

/// p50, p90, p99 and the largest of a set of latencies (nearest rank).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Quantiles {
    pub count: usize,
    pub p50: Duration,
    pub p90: Duration,
    pub p99: Duration,
    pub max: Duration,
}

impl Quantiles {
    pub fn of(latencies: &[Duration]) -> Self {
        let mut sorted = latencies.to_vec();
        sorted.sort();
        let at = |q: f64| -> Duration {
            if sorted.is_empty() {
                return Duration::ZERO;
            }
            // Nearest rank: the smallest value with at least q of the set at or below it.
            let rank = (q * sorted.len() as f64).ceil() as usize;
            sorted[rank.clamp(1, sorted.len()) - 1]
        };
        Self {
            count: sorted.len(),
            p50: at(0.50),
            p90: at(0.90),
            p99: at(0.99),
            max: sorted.last().copied().unwrap_or_default(),
        }
    }
}

/// One claim of a load: when its create was sent and when a watch first saw it ready.
#[derive(Clone, Debug)]
pub struct ClaimTiming {
    pub name: String,
    pub requested: Instant,
    pub ready: Instant,
}

/// What a load did.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub claims: Vec<ClaimTiming>,
}

impl Outcome {
    pub fn latencies(&self) -> Vec<Duration> {
        self.claims.iter().map(|c| c.ready - c.requested).collect()
    }

    pub fn quantiles(&self) -> Quantiles {
        Quantiles::of(&self.latencies())
    }

    /// From the first create request to the last claim ready.
    pub fn time_to_all(&self) -> Duration {
        let first = self.claims.iter().map(|c| c.requested).min();
        let last = self.claims.iter().map(|c| c.ready).max();
        match (first, last) {
            (Some(first), Some(last)) => last.saturating_duration_since(first),
            _ => Duration::ZERO,
        }
    }

    pub fn first_request(&self) -> Option<Instant> {
        self.claims.iter().map(|c| c.requested).min()
    }
}

/// Creates claims named `{prefix}-{n}` as `arrivals` says, deletes each `dwell` after it is
/// ready (if given), and returns once every claim was seen ready, or fails at `deadline`
/// naming those that were not.
pub async fn drive(
    system: &impl ClaimSystem,
    prefix: &str,
    arrivals: Arrivals,
    dwell: Option<Duration>,
    deadline: Duration,
) -> Result<Outcome> {
    let claims = system.claims();
    let offsets = arrivals.offsets();
    let names: Vec<String> = (0..offsets.len())
        .map(|i| format!("{prefix}-{i:04}"))
        .collect();
    let wanted: std::collections::HashSet<&str> = names.iter().map(String::as_str).collect();

    // Listed and watching before the first create, so no claim's readiness is seen late.
    let mut watch = watcher(claims.clone(), watcher::Config::default())
        .default_backoff()
        .boxed();
    loop {
        match watch.try_next().await.map_err(|e| Error::Kube {
            what: format!("watch {}'s claims", system.name()),
            source: watch_error(e),
        })? {
            Some(watcher::Event::InitDone) => break,
            Some(_) => continue,
            None => return Err(Error::WatchEnded),
        }
    }

    let requested: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let mut ready: HashMap<String, Instant> = HashMap::new();
    let mut deletions = tokio::task::JoinSet::new();
    let started = Instant::now();
    let end = started + deadline;

    let creates = async {
        let mut sent = tokio::task::JoinSet::new();
        for (name, offset) in names.iter().zip(&offsets) {
            tokio::time::sleep_until((started + *offset).into()).await;
            let claims = claims.clone();
            let object = system.claim(name);
            let requested = requested.clone();
            let name = name.clone();
            sent.spawn(async move {
                let at = Instant::now();
                requested
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(name.clone(), at);
                claims
                    .create(&PostParams::default(), &object)
                    .await
                    .map(|_| ())
                    .map_err(kube_error(format!("create claim {name}")))
            });
        }
        while let Some(result) = sent.join_next().await {
            result.expect("a create task does not panic")?;
        }
        Ok::<(), Error>(())
    };
    let watched = async {
        while ready.len() < names.len() {
            let event = tokio::time::timeout_at(end.into(), watch.try_next()).await;
            let Ok(event) = event else {
                break; // the deadline: reported below with what is missing
            };
            let event = event.map_err(|e| Error::Kube {
                what: format!("watch {}'s claims", system.name()),
                source: watch_error(e),
            })?;
            let (watcher::Event::Apply(claim) | watcher::Event::InitApply(claim)) =
                event.ok_or(Error::WatchEnded)?
            else {
                continue;
            };
            let Some(name) = claim.metadata.name.as_deref() else {
                continue;
            };
            if !wanted.contains(name) || ready.contains_key(name) || !system.is_ready(&claim) {
                continue;
            }
            ready.insert(name.to_owned(), Instant::now());
            if let Some(dwell) = dwell {
                let claims = claims.clone();
                let name = name.to_owned();
                deletions.spawn(async move {
                    tokio::time::sleep(dwell).await;
                    claims
                        .delete(&name, &DeleteParams::background())
                        .await
                        .map(|_| ())
                        .map_err(kube_error(format!("delete claim {name}")))
                });
            }
        }
        Ok::<(), Error>(())
    };
    // A failed create ends the load at once rather than at the deadline.
    tokio::try_join!(creates, watched)?;
    while let Some(result) = deletions.join_next().await {
        result.expect("a delete task does not panic")?;
    }

    let requested = requested.lock().unwrap_or_else(|e| e.into_inner()).clone();
    if ready.len() < names.len() {
        let mut missing: Vec<String> = names
            .iter()
            .filter(|n| !ready.contains_key(*n))
            .cloned()
            .collect();
        missing.truncate(10);
        return Err(Error::NotReady {
            created: requested.len(),
            ready: ready.len(),
            after: deadline,
            missing,
        });
    }
    let claims = names
        .into_iter()
        .map(|name| ClaimTiming {
            requested: requested[&name],
            ready: ready[&name],
            name,
        })
        .collect();
    Ok(Outcome { claims })
}

fn watch_error(error: watcher::Error) -> kube::Error {
    match error {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => e,
        other => kube::Error::Service(Box::new(other)),
    }
}

/// Waits until the system's pool holds `members` warm members again and returns when it did.
pub async fn wait_warm(
    system: &impl ClaimSystem,
    members: usize,
    deadline: Duration,
) -> Result<Instant> {
    let end = Instant::now() + deadline;
    loop {
        let warm = system.warm().await?;
        if warm >= members {
            return Ok(Instant::now());
        }
        if Instant::now() >= end {
            let mut missing = vec![format!("{} warm members", system.name())];
            missing.extend(system.shortfall().await);
            return Err(Error::NotReady {
                created: members,
                ready: warm,
                after: deadline,
                missing,
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Write requests (POST, PUT, PATCH, APPLY, DELETE, DELETECOLLECTION) the API server has
/// answered, by resource and subresource, from its `/metrics`.
pub async fn api_writes(admin: &kube::Client) -> Result<BTreeMap<String, f64>> {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .expect("a constant request");
    let text = admin
        .request_text(request)
        .await
        .map_err(kube_error("read the API server's /metrics"))?;
    Ok(writes_in_metrics(&text))
}

/// [`api_writes`] from the text of `/metrics`.
pub fn writes_in_metrics(text: &str) -> BTreeMap<String, f64> {
    let mut writes = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(',')
                .find_map(|pair| pair.strip_prefix(name)?.strip_prefix("=\""))
                .map(|v| v.trim_end_matches('"').to_owned())
                .unwrap_or_default()
        };
        if !matches!(
            label("verb").as_str(),
            "POST" | "PATCH" | "PUT" | "DELETE" | "DELETECOLLECTION" | "APPLY"
        ) {
            continue;
        }
        let mut resource = label("resource");
        let subresource = label("subresource");
        if !subresource.is_empty() {
            resource = format!("{resource}/{subresource}");
        }
        *writes.entry(resource).or_insert(0.0) += value.trim().parse::<f64>().unwrap_or(0.0);
    }
    writes
}

/// The writes between two readings of [`api_writes`], by resource, largest first.
pub fn writes_between(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
) -> Vec<(String, f64)> {
    let mut rows: Vec<(String, f64)> = after
        .iter()
        .map(|(resource, n)| (resource.clone(), n - before.get(resource).unwrap_or(&0.0)))
        .filter(|(_, n)| *n > 0.0)
        .collect();
    rows.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    rows
}

/// A process's CPU time and resident set, from `/proc/<pid>/stat` and `/proc/<pid>/status`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Usage {
    pub cpu: Duration,
    pub rss_kib: u64,
}

/// The kernel's clock ticks per second for `/proc/<pid>/stat` (USER_HZ, 100 on Linux).
const USER_HZ: f64 = 100.0;

impl Usage {
    pub fn of(pid: u32) -> Result<Self> {
        let read = |file: &str| {
            let path = format!("/proc/{pid}/{file}");
            std::fs::read_to_string(&path).map_err(|source| Error::Proc { path, source })
        };
        let field = |file: &str, field| Error::ProcField {
            path: format!("/proc/{pid}/{file}"),
            field,
        };
        let cpu = cpu_in_stat(&read("stat")?).ok_or_else(|| field("stat", "utime and stime"))?;
        let rss_kib = rss_in_status(&read("status")?).ok_or_else(|| field("status", "VmRSS"))?;
        Ok(Self { cpu, rss_kib })
    }
}

/// User plus system time from the text of `/proc/<pid>/stat`.
pub fn cpu_in_stat(stat: &str) -> Option<Duration> {
    // The command name, in parentheses, may hold spaces: fields are counted after its end.
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_secs_f64(ticks as f64 / USER_HZ))
}

/// `VmRSS` in KiB from the text of `/proc/<pid>/status`.
pub fn rss_in_status(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The machine's CPU time in jiffies since boot, idle (idle and iowait) and in all, from the
/// first line of `/proc/stat`.
pub fn cpu_times_in_proc_stat(stat: &str) -> Option<(u64, u64)> {
    let fields: Vec<u64> = stat
        .lines()
        .next()?
        .strip_prefix("cpu ")?
        .split_whitespace()
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal (guest time is already in user).
    let total: u64 = fields.iter().take(8).sum();
    let idle = fields.get(3)? + fields.get(4).unwrap_or(&0);
    Some((idle, total))
}

/// Waits until the machine was at least `min_idle` (0 to 1) idle over a `window`, e.g. after a
/// system's teardown, whose processes (a kubelet removing hundreds of containers) outlive its
/// objects, so the next system's figures are not taken beside it. Returns the idle share of the
/// last window, or fails at `deadline` with it.
pub async fn wait_quiet(min_idle: f64, window: Duration, deadline: Duration) -> Result<f64> {
    let read = || -> Result<(u64, u64)> {
        let path = "/proc/stat".to_owned();
        let text = std::fs::read_to_string(&path).map_err(|source| Error::Proc {
            path: path.clone(),
            source,
        })?;
        cpu_times_in_proc_stat(&text).ok_or(Error::ProcField {
            path,
            field: "cpu times",
        })
    };
    let end = Instant::now() + deadline;
    loop {
        let (idle_before, total_before) = read()?;
        tokio::time::sleep(window).await;
        let (idle_after, total_after) = read()?;
        let share = (idle_after - idle_before) as f64 / (total_after - total_before).max(1) as f64;
        if share >= min_idle {
            return Ok(share);
        }
        if Instant::now() >= end {
            return Err(Error::NotQuiet {
                idle: share,
                after: deadline,
            });
        }
    }
}

/// Samples a process every 100 ms from [`start`](Self::start) to [`stop`](Self::stop): the CPU
/// time it used in between and the largest resident set seen.
#[derive(Debug)]
pub struct UsageWindow {
    pid: u32,
    start: Usage,
    peak_kib: Arc<std::sync::atomic::AtomicU64>,
    sampler: tokio::task::JoinHandle<()>,
}

/// What a [`UsageWindow`] saw.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct UsageReport {
    pub cpu: Duration,
    pub peak_rss_kib: u64,
}

impl UsageWindow {
    pub fn start(pid: u32) -> Result<Self> {
        let start = Usage::of(pid)?;
        let peak_kib = Arc::new(std::sync::atomic::AtomicU64::new(start.rss_kib));
        let peak = peak_kib.clone();
        let sampler = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            loop {
                tick.tick().await;
                if let Ok(usage) = Usage::of(pid) {
                    peak.fetch_max(usage.rss_kib, std::sync::atomic::Ordering::Relaxed);
                }
            }
        });
        Ok(Self {
            pid,
            start,
            peak_kib,
            sampler,
        })
    }

    pub fn stop(self) -> Result<UsageReport> {
        self.sampler.abort();
        let end = Usage::of(self.pid)?;
        let peak = self.peak_kib.load(std::sync::atomic::Ordering::Relaxed);
        Ok(UsageReport {
            cpu: end.cpu.saturating_sub(self.start.cpu),
            peak_rss_kib: peak.max(end.rss_kib),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisson_schedule_is_increasing_repeatable_and_near_its_rate() {
        let arrivals = Arrivals::Poisson {
            rate: 45.0,
            duration: Duration::from_secs(200),
            seed: 7,
        };
        let offsets = arrivals.offsets();
        assert!(
            offsets.windows(2).all(|w| w[0] < w[1]),
            "strictly increasing"
        );
        assert!(offsets.iter().all(|o| *o < Duration::from_secs(200)));
        assert_eq!(offsets, arrivals.offsets(), "one seed, one schedule");
        // 9,000 expected; a Poisson count's standard deviation is its square root (about 95).
        let n = offsets.len() as f64;
        assert!(
            (8_700.0..9_300.0).contains(&n),
            "{n} arrivals in 200 s at 45/s"
        );
        // Exponential gaps: their mean and standard deviation are both 1/rate.
        let gaps: Vec<f64> = std::iter::once(offsets[0])
            .chain(offsets.windows(2).map(|w| w[1] - w[0]))
            .map(|g| g.as_secs_f64())
            .collect();
        let mean = gaps.iter().sum::<f64>() / n;
        let sd = (gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / n).sqrt();
        assert!((mean * 45.0 - 1.0).abs() < 0.05, "mean gap {mean}");
        assert!(
            (sd / mean - 1.0).abs() < 0.1,
            "coefficient of variation {}",
            sd / mean
        );
        let other = Arrivals::Poisson {
            rate: 45.0,
            duration: Duration::from_secs(200),
            seed: 8,
        };
        assert_ne!(offsets, other.offsets(), "another seed, other arrivals");
    }

    #[test]
    fn a_burst_arrives_at_once() {
        let offsets = Arrivals::Burst { count: 3 }.offsets();
        assert_eq!(offsets, vec![Duration::ZERO; 3]);
    }

    #[test]
    fn quantiles_take_the_nearest_rank() {
        let ms = |n: u64| Duration::from_millis(n);
        let latencies: Vec<Duration> = (1..=100).rev().map(ms).collect();
        let q = Quantiles::of(&latencies);
        assert_eq!(
            (q.count, q.p50, q.p90, q.p99, q.max),
            (100, ms(50), ms(90), ms(99), ms(100))
        );
        let q = Quantiles::of(&[ms(7), ms(3)]);
        assert_eq!((q.p50, q.p90, q.p99, q.max), (ms(3), ms(7), ms(7), ms(7)));
        assert_eq!(Quantiles::of(&[]), Quantiles::default());
    }

    #[test]
    fn writes_are_counted_by_resource_and_reads_are_not() {
        let text = r#"# HELP apiserver_request_total [STABLE] Counter of apiserver requests
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1"} 12
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="status",verb="PATCH",version="v1"} 30
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="status",verb="APPLY",version="v1"} 5
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="GET",version="v1"} 999
apiserver_request_total{code="200",component="apiserver",dry_run="",group="x",resource="sandboxclaims",scope="resource",subresource="",verb="DELETE",version="v1"} 4
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="WATCH",version="v1"} 8
apiserver_request_total_sum 3
"#;
        let writes = writes_in_metrics(text);
        assert_eq!(writes.get("pods"), Some(&12.0));
        assert_eq!(writes.get("pods/status"), Some(&35.0));
        assert_eq!(writes.get("sandboxclaims"), Some(&4.0));
        assert_eq!(writes.len(), 3, "{writes:?}");

        let before = BTreeMap::from([("pods".to_owned(), 10.0), ("gone".to_owned(), 1.0)]);
        assert_eq!(
            writes_between(&before, &writes),
            vec![
                ("pods/status".to_owned(), 35.0),
                ("sandboxclaims".to_owned(), 4.0),
                ("pods".to_owned(), 2.0),
            ]
        );
    }

    #[test]
    fn proc_files_give_cpu_and_rss() {
        // A command name with a space and a parenthesis, as the kernel writes it.
        let stat = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 75 0 0 20 0 9 0";
        assert_eq!(cpu_in_stat(stat), Some(Duration::from_millis(3250)));
        assert_eq!(cpu_in_stat("4242 (x) S 1"), None);
        let status = "Name:\tx\nVmPeak:\t  99 kB\nVmRSS:\t   20480 kB\nThreads:\t9\n";
        assert_eq!(rss_in_status(status), Some(20480));
        assert_eq!(rss_in_status("Name:\tx\n"), None);
        let stat = "cpu  100 5 50 800 20 1 2 0 7 0\ncpu0 50 2 25 400 10 0 1 0 0 0\n";
        assert_eq!(cpu_times_in_proc_stat(stat), Some((820, 978)));
        assert_eq!(cpu_times_in_proc_stat("cpu0 1 2 3 4\n"), None);
        let own = Usage::of(std::process::id()).expect("this process's usage");
        assert!(own.rss_kib > 0);
    }
}
