//! The controller as a child process (the standalone binary), so a test can abort or
//! SIGKILL it at a crash point and start it again.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use banlieue_controller::CRASH_AT_ENV;

use super::TestResult;

pub struct ChildController {
    child: Child,
    pub log: PathBuf,
}

/// The standalone binary cargo builds for the tests that include this support: the
/// controller's own, or banlieue-dev's build of the same source (a test can name only its own
/// package's binaries).
fn binary() -> TestResult<PathBuf> {
    option_env!("CARGO_BIN_EXE_banlieue-controller-standalone")
        .or(option_env!("CARGO_BIN_EXE_banlieue-dev-controller"))
        .map(PathBuf::from)
        .ok_or_else(|| "this test package builds no standalone controller".into())
}

/// Leader election timing for a candidate, in seconds.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub lease_duration: f64,
    pub renew_deadline: f64,
    pub retry_period: f64,
}

impl Timing {
    /// What `banlieue controller` runs with (client-go's defaults).
    pub const DEFAULT: Timing = Timing {
        lease_duration: 15.0,
        renew_deadline: 10.0,
        retry_period: 2.0,
    };
    /// The same proportions, shorter, for tests that wait out many takeovers.
    pub const SHORT: Timing = Timing {
        lease_duration: 6.0,
        renew_deadline: 4.0,
        retry_period: 1.0,
    };
}

impl ChildController {
    /// The controller alone, without leader election (one process: nothing to elect).
    pub fn spawn(
        kubeconfig: &Path,
        namespace: &str,
        crash_at: Option<&str>,
        run: u32,
    ) -> TestResult<Self> {
        Self::spawn_unelected(kubeconfig, namespace, crash_at, run, &[])
    }

    /// [`spawn`](Self::spawn) without a crash point, reconciling every object again each
    /// `resync` (the binary's default is 5 s; production's is 300 s).
    pub fn spawn_with_resync(
        kubeconfig: &Path,
        namespace: &str,
        run: u32,
        resync: Duration,
        extra: &[&str],
    ) -> TestResult<Self> {
        let resync = resync.as_secs_f64().to_string();
        let mut flags = vec!["--resync-seconds", &resync];
        flags.extend_from_slice(extra);
        Self::spawn_unelected(kubeconfig, namespace, None, run, &flags)
    }

    /// One process without leader election, its log named after `run`, with `extra` flags.
    fn spawn_unelected(
        kubeconfig: &Path,
        namespace: &str,
        crash_at: Option<&str>,
        run: u32,
        extra: &[&str],
    ) -> TestResult<Self> {
        let log = std::env::temp_dir().join(format!("banlieue-controller-{namespace}-{run}.log"));
        let mut command = Self::command(kubeconfig, namespace, crash_at, &log)?;
        command.arg("--no-leader-elect").args(extra);
        Ok(Self {
            child: command.spawn()?,
            log,
        })
    }

    /// A replica that takes the Lease `banlieue-controller` in `namespace` as `identity` (its
    /// POD_NAME) before acting.
    pub fn spawn_candidate(
        kubeconfig: &Path,
        namespace: &str,
        identity: &str,
        crash_at: Option<&str>,
        timing: Timing,
    ) -> TestResult<Self> {
        let log =
            std::env::temp_dir().join(format!("banlieue-controller-{namespace}-{identity}.log"));
        let mut command = Self::command(kubeconfig, namespace, crash_at, &log)?;
        command
            .env("POD_NAME", identity)
            .arg("--leader-elect")
            .arg("--lease-duration-seconds")
            .arg(timing.lease_duration.to_string())
            .arg("--renew-deadline-seconds")
            .arg(timing.renew_deadline.to_string())
            .arg("--retry-period-seconds")
            .arg(timing.retry_period.to_string());
        Ok(Self {
            child: command.spawn()?,
            log,
        })
    }

    fn command(
        kubeconfig: &Path,
        namespace: &str,
        crash_at: Option<&str>,
        log: &Path,
    ) -> TestResult<Command> {
        let mut command = Command::new(binary()?);
        if super::backend().is_memory() {
            command.args([
                "--placement-kind",
                &super::memory_backend::placement_kind_flag(),
            ]);
        }
        command
            .arg(kubeconfig)
            .arg(namespace)
            .env_remove(CRASH_AT_ENV)
            .env_remove("POD_NAME")
            .env_remove("POD_NAMESPACE")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log)?);
        if let Some(point) = crash_at {
            command.env(CRASH_AT_ENV, point);
        }
        Ok(command)
    }

    /// The exit status, if the process has exited.
    pub fn exited(&mut self) -> TestResult<Option<ExitStatus>> {
        Ok(self.child.try_wait()?)
    }

    /// SIGTERM: a graceful stop (which releases the Lease).
    pub fn terminate(&mut self) -> TestResult {
        let status = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status()?;
        if !status.success() {
            return Err(format!("kill -TERM {} failed", self.child.id()).into());
        }
        Ok(())
    }

    /// Waits for the process to exit by itself (a crash point).
    pub async fn wait_exit(&mut self, deadline: Duration) -> TestResult<ExitStatus> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            if started.elapsed() > deadline {
                return Err(format!("controller did not exit; log: {}", self.log.display()).into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGKILL.
    pub fn kill(&mut self) -> TestResult {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }
}

impl Drop for ChildController {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ChildController {
    /// The process id, for reading its usage from /proc.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}
