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

/// The standalone binary cargo builds for the integration tests.
fn binary() -> TestResult<PathBuf> {
    Ok(PathBuf::from(env!(
        "CARGO_BIN_EXE_banlieue-controller-standalone"
    )))
}

impl ChildController {
    pub fn spawn(
        kubeconfig: &Path,
        namespace: &str,
        crash_at: Option<&str>,
        run: u32,
    ) -> TestResult<Self> {
        let log = std::env::temp_dir().join(format!("banlieue-controller-{namespace}-{run}.log"));
        let mut command = Command::new(binary()?);
        command
            .arg(kubeconfig)
            .arg(namespace)
            .env_remove(CRASH_AT_ENV)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?);
        if let Some(point) = crash_at {
            command.env(CRASH_AT_ENV, point);
        }
        Ok(Self {
            child: command.spawn()?,
            log,
        })
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
