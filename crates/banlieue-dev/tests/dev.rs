//! `banlieue-dev up` as a user runs it, interactively, then `banlieue-dev down` from another
//! process: the claim is Bound, the view is printed, and tear-down leaves nothing running
//! (dev up itself fails when a process it started outlives it).

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_banlieue-dev");

/// The dev up child, killed if the test ends (a failed assertion) while it still runs, so a
/// failing run never leaves an interactive dev up behind; its peers' janitors then clean up.
struct Stopped(std::process::Child);

impl Drop for Stopped {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

#[test]
fn help_names_up_and_down() {
    for path in [vec!["--help"], vec!["up", "--help"], vec!["down", "--help"]] {
        let output = Command::new(BIN).args(&path).output().unwrap();
        assert!(output.status.success(), "{path:?}");
        if path == ["--help"] {
            let help = String::from_utf8_lossy(&output.stdout);
            for command in ["up", "down"] {
                assert!(help.contains(command), "--help lacks {command}:\n{help}");
            }
        }
    }
}

#[test]
fn dev_up_binds_a_claim_and_dev_down_tears_it_down() {
    if std::env::var_os("BANLIEUE_ALLOW_MISSING_PEERS").is_some()
        && !banlieue_testenv::libvirtd::Libvirtd::available().unwrap_or(false)
    {
        eprintln!("SKIPPED: libvirtd is not installed (BANLIEUE_ALLOW_MISSING_PEERS is set)");
        return;
    }
    let cache = tempfile::tempdir().unwrap();
    let mut up = Stopped(
        Command::new(BIN)
            .args(["up", "--timeout-seconds", "300"])
            .env("XDG_CACHE_HOME", cache.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut stdout = up.0.stdout.take().unwrap();
    let stderr = up.0.stderr.take().unwrap();
    let (lines_tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("dev up: {line}");
            let _ = lines_tx.send(line);
        }
    });
    let mut log = Vec::new();
    loop {
        match lines.recv_timeout(Duration::from_secs(400)) {
            Ok(line) if line.starts_with("running;") => break,
            Ok(line) => log.push(line),
            Err(_) => {
                let _ = up.0.kill();
                panic!("dev up never reported running:\n{}", log.join("\n"));
            }
        }
    }
    // Steps are reported in order.
    let steps: Vec<&String> = log.iter().filter(|l| l.starts_with('[')).collect();
    assert_eq!(steps.len(), 10, "{steps:?}");
    assert!(steps[9].starts_with("[10/10] waiting for the claim to be Bound"));

    let down = Command::new(BIN)
        .args(["down"])
        .env("XDG_CACHE_HOME", cache.path())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&down.stdout);
    assert!(
        down.status.success(),
        "dev down: {said} {}",
        String::from_utf8_lossy(&down.stderr)
    );
    assert!(said.contains("stopped; nothing is left running"), "{said}");

    let status = up.0.wait().unwrap();
    let mut view = String::new();
    stdout.read_to_string(&mut view).unwrap();
    assert!(status.success(), "dev up exited {status}:\n{view}");
    let header = view.lines().next().unwrap_or_default();
    let columns: Vec<&str> = header.split_whitespace().collect();
    assert_eq!(
        columns,
        ["NAME", "POOL", "VM", "PHASE", "EXPIRES", "AGE"],
        "{view}"
    );
    let row: Vec<&str> = view
        .lines()
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(row[0], "sandbox-for-alice", "{view}");
    assert_eq!(row[1], "sandbox-pool");
    assert!(row[2].starts_with("sandbox-pool-"), "{view}");
    assert_eq!(row[3], "Bound");
    assert!(
        row[4].ends_with('Z'),
        "EXPIRES is an absolute deadline: {view}"
    );
    // The claim took alice's key, and the `banlieue claim ssh` line printed ran in the guest.
    assert!(
        view.lines()
            .any(|l| l.contains(" claim -n banlieue-system ssh sandbox-for-alice -i ")),
        "no ssh line: {view}"
    );
    assert!(
        view.lines().any(|l| l.starts_with("  ran: Linux sandbox ")),
        "the ssh line did not run in the guest: {view}"
    );
    // Only once alice proved the VM: her challenge answered by its TPM, the host key quoted.
    assert!(
        view.lines()
            .any(|l| l.starts_with("  claim sandbox-for-alice: verified in ")),
        "the VM was not verified before the login: {view}"
    );
    assert!(
        cache
            .path()
            .join("banlieue/dev/ek-trust-bundle.pem")
            .is_file()
    );
    assert!(cache.path().join("banlieue/dev/id_ed25519").is_file());
    assert!(
        !cache.path().join("banlieue/dev/dev-up.pid").exists(),
        "the PID file outlived dev up"
    );

    // A second `dev down` finds nothing to stop.
    let again = Command::new(BIN)
        .args(["down"])
        .env("XDG_CACHE_HOME", cache.path())
        .output()
        .unwrap();
    assert!(again.status.success());
    assert!(String::from_utf8_lossy(&again.stdout).contains("no `banlieue-dev up` is running"));
}
