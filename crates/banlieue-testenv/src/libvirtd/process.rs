//! Processes by PID: signalling, and liveness from /proc.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};

/// How often liveness conditions are polled while waiting on a deadline.
pub(crate) const POLL: Duration = Duration::from_millis(20);

pub(crate) fn signal(pid: u32, signal: Signal) -> io::Result<()> {
    let raw = i32::try_from(pid).map_err(|_| io::Error::other("pid out of range"))?;
    let pid = Pid::from_raw(raw).ok_or_else(|| io::Error::other("pid 0"))?;
    kill_process(pid, signal).map_err(io::Error::from)
}

/// State and start time (clock ticks after boot) of a process, from `/proc/PID/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProcStat {
    pub(crate) state: char,
    pub(crate) start_ticks: u64,
}

pub(crate) fn proc_stat(pid: u32) -> Option<ProcStat> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_proc_stat(&text)
}

fn parse_proc_stat(text: &str) -> Option<ProcStat> {
    // The command name (field 2) may hold spaces and parentheses; fields resume after the
    // last ')'. State is field 3, starttime field 22.
    let (_, rest) = text.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let start_ticks = fields.nth(18)?.parse().ok()?;
    Some(ProcStat { state, start_ticks })
}

/// True while `pid` runs and started at or after `not_before_ticks`. A zombie counts as gone:
/// it holds no resources, and its reaper (init, for daemonized guests) is not ours.
pub(crate) fn is_running(pid: u32, not_before_ticks: u64) -> bool {
    match proc_stat(pid) {
        Some(stat) => stat.state != 'Z' && stat.start_ticks >= not_before_ticks,
        None => false,
    }
}

/// True when `pid` lives in a mount namespace other than this process's. Every process a test
/// daemon starts does (the daemon's private one, or QEMU's own below it), so a PID from a stale
/// pid file that the kernel has since given to an unrelated host process is never signalled.
pub(crate) fn in_other_mount_namespace(pid: u32) -> bool {
    let ns = |who: &str| fs::read_link(format!("/proc/{who}/ns/mnt")).ok();
    match (ns(&pid.to_string()), ns("self")) {
        (Some(theirs), Some(ours)) => theirs != ours,
        _ => false,
    }
}

/// "name (state wchan)" of each thread of `pid`, for the message when a daemon hangs.
pub(crate) fn describe_threads(pid: u32) -> String {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return "(gone)".to_owned();
    };
    let read = |task: &Path, file: &str| {
        fs::read_to_string(task.join(file))
            .map(|s| s.trim().to_owned())
            .unwrap_or_default()
    };
    tasks
        .flatten()
        .map(|task| {
            let path = task.path();
            let state = proc_stat_at(&path).map_or('?', |s| s.state);
            format!("{} ({state} {})", read(&path, "comm"), read(&path, "wchan"))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn proc_stat_at(dir: &Path) -> Option<ProcStat> {
    parse_proc_stat(&fs::read_to_string(dir.join("stat")).ok()?)
}

/// Polls `done` until it holds or `timeout` passes; returns whether it held.
pub(crate) fn wait_until(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(POLL);
    }
}

/// Pid files under libvirt's run directory that name the daemon itself, not a helper.
const DAEMON_PID_FILES: [&str; 2] = ["libvirtd.pid", "driver.pid"];

/// PIDs from the `*.pid` files under `dir`: QEMU, swtpm and the other helpers libvirt starts
/// write theirs under its run directory (`qemu/NAME.pid`, `qemu/swtpm/ID-NAME-swtpm.pid`, …).
/// The daemon's own pid files (`libvirtd.pid`, each driver's `driver.pid`) are left out.
pub(crate) fn pids_from_pid_files(dir: &Path) -> Vec<(PathBuf, u32)> {
    let mut found = Vec::new();
    collect_pid_files(dir, &mut found);
    found
}

fn collect_pid_files(dir: &Path, found: &mut Vec<(PathBuf, u32)>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(file_type) = entry.file_type() else {
            continue;
        };
        if file_type.is_dir() {
            collect_pid_files(&path, found);
            continue;
        }
        let is_helper_pid_file = file_type.is_file()
            && path.extension().is_some_and(|e| e == "pid")
            && !path
                .file_name()
                .is_some_and(|n| DAEMON_PID_FILES.iter().any(|d| n == *d));
        if !is_helper_pid_file {
            continue;
        }
        if let Some(pid) = fs::read_to_string(&path)
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            .filter(|&pid| pid > 1)
        {
            found.push((path, pid));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_awkward_command_name() {
        let line = "4242 (qemu (x) y) S 1 4242 4242 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 987654 \
                    1000 10 18446744073709551615";
        assert_eq!(
            parse_proc_stat(line),
            Some(ProcStat {
                state: 'S',
                start_ticks: 987654
            })
        );
        assert_eq!(parse_proc_stat("garbage"), None);
    }

    #[test]
    fn daemon_pid_files_are_not_helpers() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        fs::create_dir_all(dir.path().join("qemu/swtpm"))?;
        fs::write(dir.path().join("libvirtd.pid"), "100\n")?;
        fs::write(dir.path().join("qemu/driver.pid"), "100")?;
        fs::write(dir.path().join("qemu/guest.pid"), "200")?;
        fs::write(dir.path().join("qemu/swtpm/1-guest-swtpm.pid"), "201\n")?;
        fs::write(dir.path().join("qemu/guest.xml"), "300")?;
        fs::write(dir.path().join("qemu/broken.pid"), "x")?;
        let mut pids: Vec<u32> = pids_from_pid_files(dir.path())
            .into_iter()
            .map(|(_, pid)| pid)
            .collect();
        pids.sort_unstable();
        assert_eq!(pids, [200, 201]);
        Ok(())
    }

    #[test]
    fn own_process_is_running_in_our_namespace() {
        assert!(!in_other_mount_namespace(std::process::id()));
        let me = std::process::id();
        let stat = proc_stat(me).expect("own stat");
        assert!(is_running(me, stat.start_ticks));
        assert!(!is_running(me, stat.start_ticks + 1));
    }
}
