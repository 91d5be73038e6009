//! Reads a running guest through its qemu-guest-agent (QEMU_PROC_DOMAIN_AGENT_COMMAND): the
//! guest-phase layer's phase file and, for a tpmEnabled machine whose guest is ready, its EK
//! certificate files. The thin async shell around [`super::guest`].

use banlieue_libvirt::Domain;
use prometheus_client::metrics::counter::Counter;

use super::guest::{self, EkReading, GuestSight, MAX_GUEST_FILE_BYTES, Phase};

/// Seconds libvirt waits for one agent reply: a connected agent answers file calls in
/// milliseconds, and a hung one must not hold the reconcile.
const AGENT_TIMEOUT_SECS: i32 = 5;

/// Reads what the guest says about itself. `read_ek` asks for the EK certificates too (a
/// tpmEnabled machine with none recorded yet); they are read only once the guest is `ready`,
/// which the layer writes after them.
pub(super) async fn look(domain: &Domain, read_ek: bool, calls: &Counter) -> GuestSight {
    let phase = match read_file(domain, guest::PHASE_FILE, calls).await {
        Ok(Some(bytes)) => Phase::parse(&bytes),
        Ok(None) => return GuestSight::NoPhaseFile,
        Err(why) => return GuestSight::AgentUnavailable(why),
    };
    let ek = if read_ek && phase == Phase::Ready {
        read_ek_certificates(domain, calls).await
    } else {
        EkReading::NotRead
    };
    GuestSight::Phase { phase, ek }
}

async fn read_ek_certificates(domain: &Domain, calls: &Counter) -> EkReading {
    let mut found = Vec::new();
    let mut problems = Vec::new();
    for path in guest::EK_FILES {
        match read_file(domain, path, calls).await {
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
    domain: &Domain,
    path: &str,
    calls: &Counter,
) -> Result<Option<Vec<u8>>, String> {
    calls.inc();
    let handle = match domain
        .agent_command(&guest::file_open(path), AGENT_TIMEOUT_SECS)
        .await
    {
        Ok(reply) => guest::parse_open(&reply).map_err(|e| e.to_string())?,
        Err(e) if is_missing_file(&e) => return Ok(None),
        Err(e) => return Err(agent_error(&e)),
    };
    let read = read_open(domain, handle, calls).await;
    // Closed whatever happened: the agent holds few handles.
    calls.inc();
    if let Err(e) = domain
        .agent_command(&guest::file_close(handle), AGENT_TIMEOUT_SECS)
        .await
    {
        tracing::debug!(path, error = %e, "guest-file-close");
    }
    read.map(Some)
}

async fn read_open(domain: &Domain, handle: i64, calls: &Counter) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::new();
    loop {
        // One byte more than allowed, so an over-long file is seen as such.
        let want = MAX_GUEST_FILE_BYTES + 1 - bytes.len();
        calls.inc();
        let reply = domain
            .agent_command(&guest::file_read(handle, want), AGENT_TIMEOUT_SECS)
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
