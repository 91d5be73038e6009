//! Reads a running guest through its qemu-guest-agent (QEMU_PROC_DOMAIN_AGENT_COMMAND): the
//! guest-phase layer's phase file and, for a tpmEnabled machine whose guest is ready, its EK
//! certificate files. The thin async shell around [`super::guest`].
//!
//! The guest is not trusted: whoever is root in it can answer for the agent. So a conversation
//! is bounded whatever the guest does: each reply within [`AGENT_TIMEOUT_SECS`], each file in
//! at most [`MAX_READS_PER_FILE`] reads, and the whole conversation within
//! [`CONVERSATION_DEADLINE`]. A reconcile busy talking to a guest delays everything else about
//! that machine, its teardown included; a machine being deleted is never talked to.

use std::future::Future;
use std::time::Duration;

use banlieue_libvirt::Domain;
use prometheus_client::metrics::counter::Counter;
use tokio::time::Instant;

use super::guest::{self, EkReading, GuestSight, MAX_GUEST_FILE_BYTES, Phase};

/// Seconds libvirt waits for one agent reply: a connected agent answers file calls in
/// milliseconds, and a hung one must not hold the reconcile.
pub(super) const AGENT_TIMEOUT_SECS: i32 = 5;

/// The longest one look at a guest may take: the phase file, the EK certificates and the
/// agent's addresses. A real agent needs well under a second for all of it.
pub(super) const CONVERSATION_DEADLINE: Duration = Duration::from_secs(15);

/// The most `guest-file-read` calls for one file. qemu-ga answers a read of a whole small file
/// at once (with `eof`); a guest that trickles a file out a byte at a time is not the layer
/// speaking, and would otherwise cost up to [`MAX_GUEST_FILE_BYTES`] calls.
pub(super) const MAX_READS_PER_FILE: usize = 4;

/// One agent command and its reply: the domain's agent through libvirt, or a scripted guest in
/// the unit tests.
pub(super) trait AgentChannel {
    fn command(&self, json: &str) -> impl Future<Output = Result<String, banlieue_libvirt::Error>>;
}

impl AgentChannel for Domain {
    fn command(&self, json: &str) -> impl Future<Output = Result<String, banlieue_libvirt::Error>> {
        self.agent_command(json, AGENT_TIMEOUT_SECS)
    }
}

/// What [`GuestSight::AgentUnavailable`] says when a guest kept the conversation past its
/// deadline.
pub(super) fn deadline_message() -> String {
    format!(
        "the guest agent did not finish answering within {} s",
        CONVERSATION_DEADLINE.as_secs()
    )
}

/// Reads what the guest says about itself, giving up at `until`. `read_ek` asks for the EK
/// certificates too (a tpmEnabled machine with none recorded yet); they are read only once the
/// guest is `ready`, which the layer writes after them.
pub(super) async fn look(
    agent: &impl AgentChannel,
    read_ek: bool,
    calls: &Counter,
    until: Instant,
) -> GuestSight {
    tokio::time::timeout_at(until, look_unbounded(agent, read_ek, calls))
        .await
        .unwrap_or_else(|_| GuestSight::AgentUnavailable(deadline_message()))
}

async fn look_unbounded(agent: &impl AgentChannel, read_ek: bool, calls: &Counter) -> GuestSight {
    let phase = match read_file(agent, guest::PHASE_FILE, calls).await {
        Ok(Some(bytes)) => Phase::parse(&bytes),
        Ok(None) => return GuestSight::NoPhaseFile,
        Err(why) => return GuestSight::AgentUnavailable(why),
    };
    let ek = if read_ek && phase == Phase::Ready {
        read_ek_certificates(agent, calls).await
    } else {
        EkReading::NotRead
    };
    GuestSight::Phase { phase, ek }
}

async fn read_ek_certificates(agent: &impl AgentChannel, calls: &Counter) -> EkReading {
    let mut found = Vec::new();
    let mut problems = Vec::new();
    for path in guest::EK_FILES {
        match read_file(agent, path, calls).await {
            Ok(Some(bytes)) => match guest::EkCertificate::from_pem(&bytes) {
                Ok(cert) => found.push(cert),
                Err(why) => problems.push(format!("{path} {why}")),
            },
            Ok(None) => problems.push(format!("{path} does not exist")),
            Err(why) => problems.push(format!("{path}: {why}")),
        }
    }
    // A TPM may hold only one of the two; one readable certificate is enough, a broken file
    // is not (it would be recorded as missing for good).
    if !found.is_empty() && problems.iter().all(|p| p.ends_with("does not exist")) {
        EkReading::Read(found)
    } else {
        EkReading::Unreadable(problems.join("; "))
    }
}

/// The whole file at `path` (`None` when the guest has no such file), at most
/// [`MAX_GUEST_FILE_BYTES`]. `Err` says why the agent could not be used.
async fn read_file(
    agent: &impl AgentChannel,
    path: &str,
    calls: &Counter,
) -> Result<Option<Vec<u8>>, String> {
    calls.inc();
    let handle = match agent.command(&guest::file_open(path)).await {
        Ok(reply) => guest::parse_open(&reply).map_err(|e| e.to_string())?,
        Err(e) if is_missing_file(&e) => return Ok(None),
        Err(e) => return Err(agent_error(&e)),
    };
    let read = read_open(agent, handle, calls).await;
    // Closed whatever happened: the agent holds few handles.
    calls.inc();
    if let Err(e) = agent.command(&guest::file_close(handle)).await {
        tracing::debug!(path, error = %e, "guest-file-close");
    }
    read.map(Some)
}

async fn read_open(
    agent: &impl AgentChannel,
    handle: i64,
    calls: &Counter,
) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::new();
    for _ in 0..MAX_READS_PER_FILE {
        // One byte more than allowed, so an over-long file is seen as such.
        let want = MAX_GUEST_FILE_BYTES + 1 - bytes.len();
        calls.inc();
        let reply = agent
            .command(&guest::file_read(handle, want))
            .await
            .map_err(|e| agent_error(&e))?;
        let chunk = guest::parse_read(&reply).map_err(|e| e.to_string())?;
        let empty = chunk.bytes.is_empty();
        bytes.extend_from_slice(&chunk.bytes);
        if bytes.len() > MAX_GUEST_FILE_BYTES {
            return Err(format!(
                "the file is larger than {MAX_GUEST_FILE_BYTES} bytes"
            ));
        }
        if chunk.eof || empty {
            return Ok(bytes);
        }
    }
    Err(format!(
        "the guest agent did not finish a file in {MAX_READS_PER_FILE} reads"
    ))
}

/// The guest answered that the file does not exist. qemu-ga reports it as a failed command
/// whose description carries the errno text; libvirt passes the description on.
fn is_missing_file(e: &banlieue_libvirt::Error) -> bool {
    matches!(e, banlieue_libvirt::Error::Remote(r)
        if r.message.as_deref().is_some_and(|m| m.contains("No such file or directory")))
}

fn agent_error(e: &banlieue_libvirt::Error) -> String {
    match e {
        banlieue_libvirt::Error::Remote(r) => r.message.clone().unwrap_or_else(|| e.to_string()),
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;

    /// A guest's agent that answers every `guest-file-read` with one byte and no `eof`,
    /// `delay` after each command: what a hostile guest's root can make the agent do.
    struct Trickle {
        delay: Duration,
        commands: RefCell<Vec<String>>,
    }

    impl Trickle {
        fn new(delay: Duration) -> Trickle {
            Trickle {
                delay,
                commands: RefCell::new(Vec::new()),
            }
        }

        fn reads(&self) -> usize {
            let commands = self.commands.borrow();
            commands
                .iter()
                .filter(|c| c.contains("guest-file-read"))
                .count()
        }
    }

    impl AgentChannel for Trickle {
        async fn command(&self, json: &str) -> Result<String, banlieue_libvirt::Error> {
            self.commands.borrow_mut().push(json.to_owned());
            tokio::time::sleep(self.delay).await;
            Ok(if json.contains("guest-file-open") {
                r#"{"return": 7}"#.to_owned()
            } else if json.contains("guest-file-read") {
                r#"{"return": {"count": 1, "buf-b64": "cg==", "eof": false}}"#.to_owned()
            } else {
                r#"{"return": {}}"#.to_owned()
            })
        }
    }

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(3600)
    }

    #[tokio::test(start_paused = true)]
    async fn a_file_trickled_out_is_given_up_after_the_read_cap_and_closed() {
        let guest = Trickle::new(Duration::ZERO);
        let sight = look(&guest, true, &Counter::default(), far()).await;
        let GuestSight::AgentUnavailable(why) = sight else {
            panic!("{sight:?}");
        };
        assert!(
            why.contains(&format!("{MAX_READS_PER_FILE} reads")),
            "{why}"
        );
        assert_eq!(guest.reads(), MAX_READS_PER_FILE);
        let last = guest.commands.borrow().last().cloned().unwrap_or_default();
        assert!(last.contains("guest-file-close"), "{last}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_guest_is_given_up_at_the_conversation_deadline() {
        // Each answer just inside libvirt's per-reply timeout.
        let guest = Trickle::new(Duration::from_secs(AGENT_TIMEOUT_SECS as u64 - 1));
        let started = Instant::now();
        let until = started + CONVERSATION_DEADLINE;
        let sight = look(&guest, true, &Counter::default(), until).await;
        assert_eq!(sight, GuestSight::AgentUnavailable(deadline_message()));
        assert_eq!(started.elapsed(), CONVERSATION_DEADLINE);
        assert!(guest.reads() < MAX_READS_PER_FILE, "{}", guest.reads());
    }

    #[tokio::test(start_paused = true)]
    async fn an_honest_agent_answers_the_phase_in_one_read() {
        struct Honest(RefCell<usize>);
        impl AgentChannel for Honest {
            async fn command(&self, json: &str) -> Result<String, banlieue_libvirt::Error> {
                *self.0.borrow_mut() += 1;
                Ok(if json.contains("guest-file-open") {
                    r#"{"return": 1}"#.to_owned()
                } else if json.contains("guest-file-read") {
                    r#"{"return": {"count": 6, "buf-b64": "cmVhZHkK", "eof": true}}"#.to_owned()
                } else {
                    r#"{"return": {}}"#.to_owned()
                })
            }
        }
        let guest = Honest(RefCell::new(0));
        let sight = look(&guest, false, &Counter::default(), far()).await;
        assert_eq!(
            sight,
            GuestSight::Phase {
                phase: Phase::Ready,
                ek: EkReading::NotRead
            }
        );
        assert_eq!(*guest.0.borrow(), 3, "open, one read, close");
    }
}
