//! Every child a peer starts under `setpriv --pdeathsig KILL` is forked here, by one thread
//! that lives as long as the test process.
//!
//! The kernel delivers the parent-death signal when the *thread* that forked the child exits,
//! not the process. libtest runs each test on a thread of its own and tokio's blocking pool
//! comes and goes, so a child forked from either could be killed while a later test still uses
//! it (a shared control plane, a shared libvirtd); this thread never exits, and so its children
//! die exactly when the test process does, however it ends.

use std::io;
use std::process::{Child, Command};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

type SpawnRequest = (Command, mpsc::Sender<io::Result<Child>>);

/// Spawns `command` from the process-lifetime thread (see the module comment).
pub(crate) fn spawn_for_process_lifetime(command: Command) -> io::Result<Child> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let sender = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        // The thread ends only when the process does: the sender lives in a static.
        let spawned = std::thread::Builder::new()
            .name("banlieue-testenv-spawner".into())
            .spawn(move || {
                for (mut command, reply) in rx {
                    // The requester may have given up; nothing to do then.
                    let _ = reply.send(command.spawn());
                }
            });
        if let Err(e) = spawned {
            // Surfaces on the first send below as a closed channel.
            eprintln!("banlieue-testenv: cannot start the spawner thread: {e}");
        }
        Mutex::new(tx)
    });
    let (reply, response) = mpsc::channel();
    sender
        .lock()
        .map_err(|_| io::Error::other("spawner lock poisoned"))?
        .send((command, reply))
        .map_err(|_| io::Error::other("spawner thread is gone"))?;
    response
        .recv()
        .map_err(|_| io::Error::other("spawner thread dropped the request"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_outlive_the_thread_that_asked() {
        // Asked from a short-lived thread, as libtest's are, with the parent-death signal every
        // peer runs under: forked by the asking thread, the child would be killed as it ends.
        let asked = std::thread::spawn(|| {
            let mut command = Command::new("setpriv");
            command.args(["--pdeathsig", "KILL", "--", "sleep", "5"]);
            let child = spawn_for_process_lifetime(command).unwrap();
            // Time for setpriv to set the signal before this thread ends.
            std::thread::sleep(std::time::Duration::from_millis(200));
            child
        })
        .join()
        .unwrap();
        let mut child = asked;
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(child.try_wait().unwrap().is_none(), "the child is running");
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
