//! Child processes of a control plane, and the guarantees that they never outlive it.
//!
//! Three mechanisms, because each covers a way the others fail:
//! - `Drop` kills every child by PID and reaps it (the ordinary case: an owned instance).
//! - Each child runs under `setpriv --pdeathsig KILL`, forked by [`crate::spawner`]'s thread,
//!   so the kernel kills it when the test process exits. Statics are never dropped, so this is
//!   what stops the shared instance when the test binary exits, however it exits.
//! - A janitor shell owns the state directory: it reads the children's PIDs on a pipe and, when
//!   the pipe closes (on drop, or because the test process died, even by SIGKILL or Ctrl-C),
//!   makes sure they are gone and removes the directory.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read as _, Seek as _, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use super::Error;
use crate::janitor::Janitor;

/// How long a peer's janitor may take to clean up after the peer is dropped.
const JANITOR_FINISH: Duration = Duration::from_secs(120);

/// Finds `name` on `PATH`.
pub(crate) fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|candidate| candidate.is_file())
    })
}

const JANITOR_SCRIPT: &str = r#"
# Ctrl-C reaches the whole process group; the janitor must outlive the test process to clean up.
trap '' INT TERM HUP
dir=$1
pids=()
while read -r word arg; do
    case $word in
    pid) pids+=("$arg") ;;
    stopped) pids=() ;;
    esac
done
for pid in "${pids[@]}"; do
    # Only a process whose command line names this state directory is one of ours.
    if grep -qF -- "$dir" "/proc/$pid/cmdline" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
done
for pid in "${pids[@]}"; do
    for _ in $(seq 200); do
        grep -qF -- "$dir" "/proc/$pid/cmdline" 2>/dev/null || break
        sleep 0.05
    done
done
rm -rf -- "$dir"
"#;

/// One supervised child with its log file, and how it was started (to start it again).
#[derive(Debug)]
struct Supervised {
    name: &'static str,
    child: Child,
    log: PathBuf,
    binary: PathBuf,
    args: Vec<String>,
    env: Vec<(String, std::ffi::OsString)>,
}

/// The processes of one local control plane and its state directory.
#[derive(Debug)]
pub(crate) struct Processes {
    dir: PathBuf,
    setpriv: PathBuf,
    children: Vec<Supervised>,
    janitor: Option<Janitor>,
}

impl Processes {
    /// Creates the state directory and its janitor.
    pub(crate) fn new() -> Result<Self, Error> {
        Self::with_janitor("banlieue-control-plane-", JANITOR_SCRIPT, &[])
    }

    /// Creates a state directory named `<prefix>XXXXXX` and a janitor running `script` (bash)
    /// with the directory and `args` as its arguments. The janitor reads `pid N` lines, and
    /// a `stopped` line once the children are gone, on its stdin; end of file is its cue.
    pub(crate) fn with_janitor(prefix: &str, script: &str, args: &[String]) -> Result<Self, Error> {
        let setpriv = which("setpriv").ok_or(Error::SetprivMissing)?;
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir()
            .map_err(|source| Error::io("create the state directory", source))?
            // The janitor removes it, also when this process dies without unwinding.
            .keep();
        let janitor_args = std::iter::once(dir.as_os_str()).chain(args.iter().map(OsStr::new));
        let janitor = match Janitor::spawn(script, "janitor", janitor_args) {
            Ok(janitor) => janitor,
            Err(source) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(Error::io("start the janitor", source));
            }
        };
        Ok(Self {
            dir,
            setpriv,
            children: Vec::new(),
            janitor: Some(janitor),
        })
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Starts `binary` with `args`, its output in `logs/<name>.log` under the state directory.
    pub(crate) fn spawn(
        &mut self,
        name: &'static str,
        binary: &Path,
        args: &[String],
    ) -> Result<u32, Error> {
        self.spawn_with_env(name, binary, args, &[])
    }

    /// Like [`spawn`](Self::spawn), with extra environment variables.
    pub(crate) fn spawn_with_env(
        &mut self,
        name: &'static str,
        binary: &Path,
        args: &[String],
        env: &[(&str, std::ffi::OsString)],
    ) -> Result<u32, Error> {
        let logs = self.dir.join("logs");
        std::fs::create_dir_all(&logs).map_err(|source| Error::io("create logs", source))?;
        let log = logs.join(format!("{name}.log"));
        let supervised = Supervised {
            name,
            child: self.start(name, binary, args, env, &log, false)?,
            log,
            binary: binary.to_owned(),
            args: args.to_vec(),
            env: env
                .iter()
                .map(|(key, value)| ((*key).to_owned(), value.clone()))
                .collect(),
        };
        let pid = supervised.child.id();
        self.tell_janitor(&format!("pid {pid}"));
        self.children.push(supervised);
        Ok(pid)
    }

    /// Starts one child under `setpriv --pdeathsig KILL`, its output to `log` (appended to
    /// when `append`, so a restarted process's log follows its first life).
    fn start(
        &self,
        name: &str,
        binary: &Path,
        args: &[String],
        env: &[(&str, std::ffi::OsString)],
        log: &Path,
        append: bool,
    ) -> Result<Child, Error> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(log)
            .map_err(|source| Error::io("create a log file", source))?;
        let err = out
            .try_clone()
            .map_err(|source| Error::io("create a log file", source))?;
        let mut command = Command::new(&self.setpriv);
        command
            .arg("--pdeathsig")
            .arg("KILL")
            .arg("--")
            .arg(binary)
            .args(args)
            .envs(env.iter().map(|(key, value)| (key, value)))
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        crate::spawner::spawn_for_process_lifetime(command)
            .map_err(|source| Error::io(format!("start {name}"), source))
    }

    /// Kills the child `name` with SIGKILL, as a crash would, and reaps it.
    pub(crate) fn kill(&mut self, name: &str) -> Result<(), Error> {
        let supervised = self
            .children
            .iter_mut()
            .find(|s| s.name == name)
            .ok_or_else(|| {
                Error::io(format!("kill {name}"), io::Error::other("no such process"))
            })?;
        // Already exited is fine: the point is that it is not running.
        let _ = supervised.child.kill();
        supervised
            .child
            .wait()
            .map_err(|source| Error::io(format!("reap {name}"), source))?;
        Ok(())
    }

    /// Starts the child `name` again with the command line and environment of its first start,
    /// after [`kill`](Self::kill) (or its own exit); its log continues the first one's.
    pub(crate) fn restart(&mut self, name: &str) -> Result<u32, Error> {
        let index = self
            .children
            .iter()
            .position(|s| s.name == name)
            .ok_or_else(|| {
                Error::io(
                    format!("restart {name}"),
                    io::Error::other("no such process"),
                )
            })?;
        let old = &self.children[index];
        let env: Vec<(&str, std::ffi::OsString)> = old
            .env
            .iter()
            .map(|(key, value)| (key.as_str(), value.clone()))
            .collect();
        let child = self.start(name, &old.binary, &old.args, &env, &old.log, true)?;
        let pid = child.id();
        self.tell_janitor(&format!("pid {pid}"));
        self.children[index].child = child;
        Ok(pid)
    }

    fn tell_janitor(&mut self, line: &str) {
        if let Some(janitor) = &mut self.janitor {
            janitor.tell(line);
        }
    }

    /// Fails if any child has exited, naming it and quoting the end of its log.
    pub(crate) fn check_running(&mut self) -> Result<(), Error> {
        for supervised in &mut self.children {
            if let Ok(Some(status)) = supervised.child.try_wait() {
                return Err(exited(supervised, status));
            }
        }
        Ok(())
    }

    /// The last lines of every child's log, for error messages.
    pub(crate) fn log_tails(&self) -> String {
        self.children
            .iter()
            .map(|s| format!("--- {} ({})\n{}", s.name, s.log.display(), tail(&s.log)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    pub(crate) fn pids(&self) -> Vec<(&'static str, u32)> {
        let mut pids: Vec<_> = self
            .children
            .iter()
            .map(|s| (s.name, s.child.id()))
            .collect();
        if let Some(janitor) = &self.janitor {
            pids.push(("janitor", janitor.pid()));
        }
        pids
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        // Dependents first, so the apiserver never logs a storm of etcd errors on the way down.
        while let Some(mut supervised) = self.children.pop() {
            let _ = supervised.child.kill();
            let _ = supervised.child.wait();
        }
        self.tell_janitor("stopped");
        if let Some(janitor) = self.janitor.take() {
            // A node's janitor stops its containers and unmounts their state: give it time.
            janitor.finish(JANITOR_FINISH);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn exited(supervised: &Supervised, status: ExitStatus) -> Error {
    Error::Exited {
        name: supervised.name,
        status,
        log_tail: tail(&supervised.log),
    }
}

/// The last few KiB of a log file, lossily decoded.
fn tail(path: &Path) -> String {
    const TAIL: u64 = 4096;
    let Ok(mut file) = File::open(path) else {
        return String::new();
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(TAIL)));
    let mut bytes = Vec::new();
    let _ = file.read_to_end(&mut bytes);
    String::from_utf8_lossy(&bytes).into_owned()
}
