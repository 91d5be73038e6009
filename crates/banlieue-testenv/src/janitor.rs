//! A janitor: a shell that outlives the test process to clean up after it, whatever the peer
//! (the control plane's processes, a node's containers, a registry's storage, a libvirtd's
//! guests). Its stdin is a pipe only the test process holds: the peer may tell it things on it
//! (which PIDs to kill), and end of file, on drop or because the test process died (even by
//! SIGKILL or Ctrl-C), is its cue to clean up and exit. It runs in a session of its own, so a
//! Ctrl-C in the terminal reaches the tests but not it; its script should ignore INT, TERM and
//! HUP as well.

use std::ffi::OsStr;
use std::io::{self, Write as _};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug)]
pub(crate) struct Janitor {
    child: Child,
    pipe: Option<ChildStdin>,
}

impl Janitor {
    /// Starts `script` under bash as `setsid bash -c SCRIPT NAME ARGS…`.
    pub(crate) fn spawn<I, S>(script: &str, name: &str, args: I) -> io::Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut child = Command::new("setsid")
            .arg("bash")
            .arg("-c")
            .arg(script)
            .arg(name)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let Some(pipe) = child.stdin.take() else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(io::Error::other("the janitor has no stdin pipe"));
        };
        Ok(Self {
            child,
            pipe: Some(pipe),
        })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Tells the janitor `line`; best effort (a janitor that is gone cannot clean up, but the
    /// peer's own drop still does).
    pub(crate) fn tell(&mut self, line: &str) {
        if let Some(pipe) = &mut self.pipe {
            let _ = writeln!(pipe, "{line}");
        }
    }

    /// Closes the pipe, so the janitor cleans up, and waits for it `within` at most (then
    /// kills it: a hung clean-up must not hang the tests).
    pub(crate) fn finish(mut self, within: Duration) {
        drop(self.pipe.take());
        let started = Instant::now();
        while matches!(self.child.try_wait(), Ok(None)) {
            if started.elapsed() >= within {
                let _ = self.child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cleans_up_on_end_of_file_with_what_it_was_told() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("told");
        let script = r#"trap '' INT TERM HUP; cat >"$1.tmp"; mv "$1.tmp" "$1""#;
        let mut janitor = Janitor::spawn(script, "test-janitor", [&out]).unwrap();
        janitor.tell("pid 42");
        assert!(!out.exists(), "nothing before end of file");
        janitor.finish(Duration::from_secs(5));
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "pid 42\n");
    }
}
