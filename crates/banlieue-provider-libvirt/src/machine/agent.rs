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

use banlieue_api::access::ClaimAccess;
use banlieue_api::handover::{self, HandoverAnswer, HandoverChallenge};
use banlieue_provider_kit::access::{self, AccessSight, GuestAccess};
use banlieue_provider_kit::handover::HandoverSight;

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

/// The guest's SSH host keys ([`access::HOST_KEYS_FILE`]), giving up at `until`: an empty
/// list when the guest publishes none (no sshd), `Err` when the file or the agent fails.
pub(super) async fn read_host_keys(
    agent: &impl AgentChannel,
    calls: &Counter,
    until: Instant,
) -> Result<Vec<String>, String> {
    let read = tokio::time::timeout_at(until, read_file(agent, access::HOST_KEYS_FILE, calls))
        .await
        .unwrap_or_else(|_| Err(deadline_message()))?;
    match read {
        None => Ok(Vec::new()),
        Some(bytes) => access::parse_host_keys(&bytes)
            .map_err(|why| format!("{} {why}", access::HOST_KEYS_FILE)),
    }
}

/// How long one reconcile waits for the guest's layer to answer a delivery; past it the
/// machine reports AccessPending and looks again soon. The layer answers within tens of
/// milliseconds; the wait only spares a round through the API server.
pub(super) const ACCESS_ANSWER_WAIT: Duration = Duration::from_secs(3);

/// How often the layer's state is read while waiting for its answer.
const ACCESS_POLL: Duration = Duration::from_millis(20);

/// Hands the claim's keys to a ready guest: writes [`access::WANTED_FILE`] unless the layer
/// already answered for these very bytes, then reads [`access::STATE_FILE`] until the layer
/// answers, [`ACCESS_ANSWER_WAIT`] passes or `until` comes.
pub(super) async fn deliver_access(
    agent: &impl AgentChannel,
    wanted: &ClaimAccess,
    calls: &Counter,
    until: Instant,
) -> AccessSight {
    let bytes = access::wanted_file(wanted);
    let digest = access::digest(&bytes);
    let answer_by = until.min(Instant::now() + ACCESS_ANSWER_WAIT);
    let delivery = async {
        match read_state(agent, &digest, calls).await? {
            GuestAccess::NotYet => {}
            answered => return Ok::<_, String>(answered),
        }
        write_file(agent, access::WANTED_FILE, &bytes, calls).await?;
        loop {
            match read_state(agent, &digest, calls).await? {
                GuestAccess::NotYet => tokio::time::sleep(ACCESS_POLL).await,
                answered => return Ok(answered),
            }
        }
    };
    match tokio::time::timeout_at(answer_by, delivery).await {
        Ok(Ok(GuestAccess::Installed { user })) => AccessSight::Installed { user },
        Ok(Ok(GuestAccess::Refused(why))) => AccessSight::Refused(why),
        Ok(Ok(GuestAccess::NotYet)) | Err(_) => AccessSight::Pending(
            "the keys are written; the guest's layer has not installed them yet".into(),
        ),
        Ok(Err(why)) => AccessSight::Pending(format!(
            "the keys could not be handed to the guest agent: {why}"
        )),
    }
}

/// How long one reconcile waits for the guest's TPM to answer a challenge: activating the
/// credential and quoting take the layer about a second under TCG. Past it the machine looks
/// again soon, and the next reconcile reads the answer.
pub(super) const HANDOVER_ANSWER_WAIT: Duration = Duration::from_secs(5);

/// How often the layer's answer is read while waiting for it.
const HANDOVER_POLL: Duration = Duration::from_millis(50);

/// How long without an answer before the activate line is written again. The layer's path
/// unit does not start it again while it runs, and a line written just as a run ends (after
/// its last look at the file) would wait for ever: written again, it starts a run (a run
/// still at work sees the same line and answers it once).
const HANDOVER_NUDGE: Duration = Duration::from_millis(2500);

/// How long after relaying a challenge the answer is first read. The layer's work takes the
/// guest's one vCPU for about a second under TCG (its tools' start-up, not the TPM), and each
/// read is three agent calls the guest's agent answers on that same vCPU: reading before the
/// answer can be there only slows it down.
const HANDOVER_FIRST_READ: Duration = Duration::from_millis(500);

/// The guest's attestation key ([`handover::AK_PUBLIC_FILE`], base64 for the status): `None`
/// when the guest published none.
pub(super) async fn read_attestation_key(
    agent: &impl AgentChannel,
    calls: &Counter,
    until: Instant,
) -> Result<Option<String>, String> {
    use base64::Engine;
    let read = tokio::time::timeout_at(until, read_file(agent, handover::AK_PUBLIC_FILE, calls))
        .await
        .map_err(|_| deadline_message())??;
    match read {
        None => Ok(None),
        Some(bytes) if bytes.len() * 4 / 3 + 4 > handover::MAX_AK_PUBLIC_LENGTH => Err(format!(
            "{} is larger than an attestation key's public area",
            handover::AK_PUBLIC_FILE
        )),
        Some(bytes) => Ok(Some(
            base64::engine::general_purpose::STANDARD.encode(bytes),
        )),
    }
}

/// Relays the subject's challenge to a ready guest: writes the credential to
/// [`handover::CHALLENGE_FILE`], a sealed payload to [`handover::SEALED_FILE`], and the line
/// that starts its activation to [`handover::ACTIVATE_FILE`], unless that line is there
/// already (a relay an earlier reconcile stopped waiting for, answered or not, is not
/// started over); then reads [`handover::ANSWER_FILE`] until the
/// layer answers it, [`HANDOVER_ANSWER_WAIT`] passes or `until` comes. Nothing in the answer is checked but its bounds: the subject
/// checks it.
pub(super) async fn relay_handover(
    agent: &impl AgentChannel,
    challenge: &HandoverChallenge,
    calls: &Counter,
    until: Instant,
) -> HandoverSight {
    let (credential, digest, line, sealed) = match (
        challenge.credential_bytes(),
        challenge.digest(),
        challenge.activate_line(),
        challenge.sealed_bytes(),
    ) {
        (Ok(credential), Ok(digest), Ok(line), Ok(sealed)) => (credential, digest, line, sealed),
        // [`banlieue_provider_kit::handover::unrelayable`] answers these without the guest.
        _ => return HandoverSight::Pending("the challenge is malformed".into()),
    };
    let answer_by = until.min(Instant::now() + HANDOVER_ANSWER_WAIT);
    let relay = async {
        // Relayed already, by an earlier reconcile that stopped waiting: the guest is at it
        // or has answered (it answers only what the activate line names), and writing again
        // would only start it over.
        let asked = read_file(agent, handover::ACTIVATE_FILE, calls).await?;
        if asked.as_deref() != Some(line.as_bytes()) {
            write_file(agent, handover::CHALLENGE_FILE, &credential, calls).await?;
            if let Some(sealed) = &sealed {
                write_file(agent, handover::SEALED_FILE, sealed, calls).await?;
            }
            write_file(agent, handover::ACTIVATE_FILE, line.as_bytes(), calls).await?;
            tokio::time::sleep(HANDOVER_FIRST_READ).await;
        }
        let mut nudge_at = Some(Instant::now() + HANDOVER_NUDGE);
        loop {
            match read_answer(agent, &digest, calls).await? {
                Some(answer) => return Ok::<_, String>(answer),
                None => tokio::time::sleep(HANDOVER_POLL).await,
            }
            if nudge_at.is_some_and(|at| Instant::now() >= at) {
                nudge_at = None;
                write_file(agent, handover::ACTIVATE_FILE, line.as_bytes(), calls).await?;
            }
        }
    };
    match tokio::time::timeout_at(answer_by, relay).await {
        Ok(Ok(answer)) => HandoverSight::Answered(answer),
        Ok(Err(why)) => {
            HandoverSight::Pending(format!("the challenge could not be relayed: {why}"))
        }
        Err(_) => HandoverSight::Pending(
            "the challenge is relayed; the guest's TPM has not answered yet".into(),
        ),
    }
}

/// The layer's answer to the challenge `digest`; `None` while it has none for it (no answer
/// yet, or one to an earlier challenge). A malformed answer is the guest's: it is recorded as
/// this challenge's failure, in words, and the subject's verify refuses it.
async fn read_answer(
    agent: &impl AgentChannel,
    digest: &str,
    calls: &Counter,
) -> Result<Option<HandoverAnswer>, String> {
    Ok(
        match read_file(agent, handover::ANSWER_FILE, calls).await? {
            None => None,
            Some(bytes) => match handover::parse_answer(&bytes, digest) {
                Ok(answer) => answer,
                Err(why) => Some(HandoverAnswer {
                    challenge: digest.to_owned(),
                    failure: Some(why.to_string()),
                    ..HandoverAnswer::default()
                }),
            },
        },
    )
}

async fn read_state(
    agent: &impl AgentChannel,
    digest: &str,
    calls: &Counter,
) -> Result<GuestAccess, String> {
    Ok(match read_file(agent, access::STATE_FILE, calls).await? {
        None => GuestAccess::NotYet,
        Some(bytes) => access::parse_state(&bytes, digest),
    })
}

/// Writes `bytes` as the whole file at `path`, closing it whatever happened (the layer acts
/// on the close).
async fn write_file(
    agent: &impl AgentChannel,
    path: &str,
    bytes: &[u8],
    calls: &Counter,
) -> Result<(), String> {
    calls.inc();
    let handle = match agent.command(&guest::file_open_for_writing(path)).await {
        Ok(reply) => guest::parse_open(&reply).map_err(|e| e.to_string())?,
        Err(e) => return Err(agent_error(&e)),
    };
    calls.inc();
    let written = match agent.command(&guest::file_write(handle, bytes)).await {
        Ok(reply) => guest::parse_write(&reply, bytes.len()).map_err(|e| e.to_string()),
        Err(e) => Err(agent_error(&e)),
    };
    calls.inc();
    let closed = agent
        .command(&guest::file_close(handle))
        .await
        .map_err(|e| agent_error(&e));
    written.and(closed.map(|_| ()))
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

    use base64::Engine;

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

    /// An open guest file: its path, whether it is being written, its bytes.
    type OpenFile = (String, bool, Vec<u8>);

    /// A guest whose layer answers the access contract as `answer` says, and the handover's
    /// as `attest` says (given the activate line): its files in a map, the layer acting when
    /// the host closes the wanted or the activate file, as its path units do.
    struct Layer {
        answer: fn(&[u8]) -> Option<String>,
        attest: fn(&str) -> Option<String>,
        files: RefCell<std::collections::HashMap<String, Vec<u8>>>,
        open: RefCell<std::collections::HashMap<i64, OpenFile>>,
        writes: RefCell<usize>,
    }

    impl Layer {
        fn new(answer: fn(&[u8]) -> Option<String>) -> Layer {
            Layer {
                answer,
                attest: |_| None,
                files: RefCell::default(),
                open: RefCell::default(),
                writes: RefCell::new(0),
            }
        }
    }

    impl AgentChannel for Layer {
        async fn command(&self, json: &str) -> Result<String, banlieue_libvirt::Error> {
            let command: serde_json::Value = serde_json::from_str(json).unwrap();
            let arguments = &command["arguments"];
            let handle = || arguments["handle"].as_i64().unwrap();
            Ok(match command["execute"].as_str().unwrap() {
                "guest-file-open" => {
                    let path = arguments["path"].as_str().unwrap().to_owned();
                    let writing = arguments["mode"] == "w";
                    let content = match self.files.borrow().get(&path) {
                        Some(content) => content.clone(),
                        None if writing => Vec::new(),
                        None => {
                            return Err(banlieue_libvirt::RemoteError::new(
                                banlieue_libvirt::ErrorCode::InternalError,
                                "failed to open file: No such file or directory",
                            )
                            .into());
                        }
                    };
                    let id = self.open.borrow().len() as i64 + 1;
                    let content = if writing { Vec::new() } else { content };
                    self.open.borrow_mut().insert(id, (path, writing, content));
                    format!(r#"{{"return": {id}}}"#)
                }
                "guest-file-read" => {
                    let open = self.open.borrow();
                    let bytes = &open[&handle()].2;
                    let encoded = base64::engine::general_purpose::STANDARD.encode(bytes);
                    format!(
                        r#"{{"return": {{"count": {}, "buf-b64": "{encoded}", "eof": true}}}}"#,
                        bytes.len()
                    )
                }
                "guest-file-write" => {
                    *self.writes.borrow_mut() += 1;
                    let bytes = base64::engine::general_purpose::STANDARD
                        .decode(arguments["buf-b64"].as_str().unwrap())
                        .unwrap();
                    let count = bytes.len();
                    self.open.borrow_mut().get_mut(&handle()).unwrap().2 = bytes;
                    format!(r#"{{"return": {{"count": {count}, "eof": false}}}}"#)
                }
                "guest-file-close" => {
                    let (path, writing, bytes) = self.open.borrow_mut().remove(&handle()).unwrap();
                    let acted = match path.as_str() {
                        _ if !writing => None,
                        access::WANTED_FILE => {
                            (self.answer)(&bytes).map(|state| (access::STATE_FILE, state))
                        }
                        handover::ACTIVATE_FILE => {
                            let line = String::from_utf8(bytes.clone()).unwrap();
                            (self.attest)(&line).map(|answer| (handover::ANSWER_FILE, answer))
                        }
                        _ => None,
                    };
                    if let Some((file, content)) = acted {
                        self.files
                            .borrow_mut()
                            .insert(file.into(), content.into_bytes());
                    }
                    if writing {
                        self.files.borrow_mut().insert(path, bytes);
                    }
                    r#"{"return": {}}"#.to_owned()
                }
                other => panic!("unexpected {other}"),
            })
        }
    }

    fn alices_keys() -> ClaimAccess {
        ClaimAccess {
            ssh_authorized_keys: vec![
                "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
                    .into(),
            ],
            user: Some("alice".into()),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_keys_are_written_once_and_the_layers_answer_for_them_is_read() {
        let guest =
            Layer::new(|bytes| Some(format!("installed alice {}\n", access::digest(bytes))));
        let sight = deliver_access(&guest, &alices_keys(), &Counter::default(), far()).await;
        assert_eq!(
            sight,
            AccessSight::Installed {
                user: "alice".into()
            }
        );
        assert_eq!(
            guest.files.borrow()[access::WANTED_FILE],
            access::wanted_file(&alices_keys())
        );
        // Asked again, the answer already there is read: nothing is written twice.
        let again = deliver_access(&guest, &alices_keys(), &Counter::default(), far()).await;
        assert_eq!(
            again,
            AccessSight::Installed {
                user: "alice".into()
            }
        );
        assert_eq!(*guest.writes.borrow(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_is_final_and_silence_or_a_lie_is_pending() {
        let refusing = Layer::new(|_| Some("failed: useradd: bad name\n".into()));
        let sight = deliver_access(&refusing, &alices_keys(), &Counter::default(), far()).await;
        assert_eq!(sight, AccessSight::Refused("useradd: bad name".into()));

        let silent = Layer::new(|_| None);
        let started = Instant::now();
        let sight = deliver_access(&silent, &alices_keys(), &Counter::default(), far()).await;
        assert!(matches!(sight, AccessSight::Pending(_)), "{sight:?}");
        assert_eq!(started.elapsed(), ACCESS_ANSWER_WAIT);

        // A guest claiming it installed other keys has not installed these.
        let lying = Layer::new(|_| Some(format!("installed alice {}\n", access::digest(b"other"))));
        let sight = deliver_access(&lying, &alices_keys(), &Counter::default(), far()).await;
        assert!(matches!(sight, AccessSight::Pending(_)), "{sight:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn host_keys_are_read_and_checked() {
        let guest = Layer::new(|_| None);
        assert_eq!(
            read_host_keys(&guest, &Counter::default(), far()).await,
            Ok(vec![])
        );
        guest.files.borrow_mut().insert(
            access::HOST_KEYS_FILE.into(),
            format!("{} root@guest\n", alices_keys().ssh_authorized_keys[0]).into_bytes(),
        );
        assert_eq!(
            read_host_keys(&guest, &Counter::default(), far()).await,
            Ok(alices_keys().ssh_authorized_keys)
        );
        guest.files.borrow_mut().insert(
            access::HOST_KEYS_FILE.into(),
            b"ssh-ed25519 AAAA\n".to_vec(),
        );
        let error = read_host_keys(&guest, &Counter::default(), far())
            .await
            .unwrap_err();
        assert!(error.starts_with(access::HOST_KEYS_FILE), "{error}");
    }

    fn challenge() -> HandoverChallenge {
        HandoverChallenge {
            credential: "AAECAw==".into(),
            binding: "ab".repeat(32),
            sealed: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_challenge_is_relayed_once_and_its_answer_read_unjudged() {
        let mut guest = Layer::new(|_| None);
        guest.attest = |line| {
            let digest = line.split(' ').next().unwrap();
            Some(format!(
                "activated {digest} 0a0b\nquote AAAA\nsignature BBBB\npcrs CCCC\n"
            ))
        };
        let sight = relay_handover(&guest, &challenge(), &Counter::default(), far()).await;
        let HandoverSight::Answered(answer) = sight else {
            panic!("{sight:?}");
        };
        assert_eq!(answer.challenge, challenge().digest().unwrap());
        assert_eq!(answer.activated.as_deref(), Some("0a0b"));
        assert_eq!(answer.quote.as_deref(), Some("AAAA"));
        let files = guest.files.borrow().clone();
        assert_eq!(files[handover::CHALLENGE_FILE], vec![0u8, 1, 2, 3]);
        assert_eq!(
            files[handover::ACTIVATE_FILE],
            challenge().activate_line().unwrap().into_bytes()
        );
        // Answered already (a reconcile after a crash): read, not written again.
        let writes = *guest.writes.borrow();
        relay_handover(&guest, &challenge(), &Counter::default(), far()).await;
        assert_eq!(*guest.writes.borrow(), writes);
    }

    #[tokio::test(start_paused = true)]
    async fn a_relay_the_guest_is_still_working_on_is_not_written_again() {
        // The last reconcile wrote the challenge and stopped waiting; the guest is at it.
        let busy = Layer::new(|_| None);
        busy.files.borrow_mut().insert(
            handover::ACTIVATE_FILE.into(),
            challenge().activate_line().unwrap().into_bytes(),
        );
        let until = Instant::now() + Duration::from_millis(300);
        let sight = relay_handover(&busy, &challenge(), &Counter::default(), until).await;
        assert!(matches!(sight, HandoverSight::Pending(_)), "{sight:?}");
        assert_eq!(*busy.writes.borrow(), 0, "the challenge was written again");
    }

    #[tokio::test(start_paused = true)]
    async fn a_line_no_run_took_up_is_written_once_more() {
        // The line landed as the layer's last run ended: nothing answers it.
        let deaf = Layer::new(|_| None);
        let until = Instant::now() + HANDOVER_ANSWER_WAIT;
        let sight = relay_handover(&deaf, &challenge(), &Counter::default(), until).await;
        assert!(matches!(sight, HandoverSight::Pending(_)), "{sight:?}");
        // The credential, the line, and the line again after HANDOVER_NUDGE: once.
        assert_eq!(*deaf.writes.borrow(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn an_older_answer_is_not_this_challenges_and_garbage_is_recorded_as_a_failure() {
        // The guest keeps the last challenge's answer and never gets to this one.
        let stale = Layer::new(|_| None);
        stale.files.borrow_mut().insert(
            handover::ANSWER_FILE.into(),
            format!("activated {} 0a\n", "0".repeat(64)).into_bytes(),
        );
        let until = Instant::now() + Duration::from_millis(300);
        let sight = relay_handover(&stale, &challenge(), &Counter::default(), until).await;
        assert!(matches!(sight, HandoverSight::Pending(_)), "{sight:?}");
        // A guest that answers what no layer writes: recorded as this challenge's failure.
        let mut lying = Layer::new(|_| None);
        lying.attest = |_| Some("activated\nrm -rf /\n".into());
        let sight = relay_handover(&lying, &challenge(), &Counter::default(), far()).await;
        let HandoverSight::Answered(answer) = sight else {
            panic!("{sight:?}");
        };
        assert_eq!(answer.activated, None);
        assert!(
            answer
                .failure
                .unwrap()
                .contains("not one this contract defines")
        );
    }
}
