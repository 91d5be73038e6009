//! `banlieue claim`: a consumer's commands, in kubectl's idiom (the kubeconfig's context and
//! namespace, `-n`, `-o json|yaml|name`). They act as the caller: the API server's admission
//! decides, and a refusal is printed as the one line it gives.
//!
//! `create` takes one member of a pool for the caller (the subject is the caller's own
//! identity, as the claim-subject policy requires), with the caller's public keys when given,
//! and with `--wait` follows the claim until it is Bound; `list` shows the namespace's claims;
//! `release` deletes one, and with `--wait` follows it until it is gone.

use std::io::Write;
use std::time::Duration;

use banlieue_api::LocalObjectReference;
use banlieue_api::access::{self, ClaimAccess};
use banlieue_api::conditions::{self, reasons, types};
use banlieue_api::{ClaimPhase, ClaimSubject, VirtualMachineClaim, VirtualMachineClaimSpec};
use futures::TryStreamExt;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};

/// How a claim is printed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// A table: name, pool, VM, phase, expiry, first address.
    #[default]
    Table,
    Json,
    Yaml,
    /// `virtualmachineclaim.banlieue.io/<name>`.
    Name,
}

/// What `banlieue claim create` is given.
#[derive(Clone, Debug)]
pub struct CreateRequest {
    pub pool: String,
    /// The claim's name; `<pool>-` and a suffix the API server picks when `None`.
    pub name: Option<String>,
    pub ttl: Duration,
    /// The subject's issuer: the OIDC issuer that logged the caller in. Looked up in the
    /// claim-subject policy when `None` (which the caller may not be allowed to read).
    pub issuer: Option<String>,
    /// The subject's id; the caller's username without its issuer's prefix when `None`.
    pub subject_id: Option<String>,
    /// Public key lines, each checked before the claim is sent.
    pub ssh_keys: Vec<String>,
    pub user: Option<String>,
}

/// Why a command failed: one line for the terminal.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    Refused(String),
    #[error("{0}")]
    Invalid(String),
    #[error("timed out after {after:?} waiting for claim {name}: {last}")]
    TimedOut {
        name: String,
        after: Duration,
        last: String,
    },
    #[error("claim {name} failed: {why}")]
    Failed { name: String, why: String },
    #[error(transparent)]
    Kube(#[from] kube::Error),
    #[error("writing the output: {0}")]
    Io(#[from] std::io::Error),
    #[error("encoding the output: {0}")]
    Encode(String),
    #[error("ssh exited with status {0}")]
    Ssh(i32),
}

impl CliError {
    /// The API server's refusal as its message alone (kubectl prints the same).
    pub(crate) fn from_kube(error: kube::Error) -> Self {
        match error {
            kube::Error::Api(status) if matches!(status.code, 403 | 404 | 422) => {
                Self::Refused(status.message)
            }
            other => Self::Kube(other),
        }
    }
}

/// The caller's username, as the API server authenticated it.
pub async fn whoami(client: &Client) -> Result<String, CliError> {
    let reviews: Api<SelfSubjectReview> = Api::all(client.clone());
    let review = reviews
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .map_err(CliError::from_kube)?;
    review
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.username)
        .ok_or_else(|| CliError::Invalid("the API server did not say who you are".into()))
}

/// The subject id of `username`: without the issuer prefix it carries (a prefix ends at its
/// first `:`, as the claim-subject policy reads it), or as it is when it has none.
pub fn subject_id_of(username: &str, prefix: Option<&str>) -> String {
    match prefix {
        Some(prefix) => username.strip_prefix(prefix).unwrap_or(username).to_owned(),
        None => username.to_owned(),
    }
}

/// The issuer the claim-subject policy gives `username`, and its prefix: the one entry whose
/// prefix the username carries, else the one entry without a prefix.
pub fn issuer_for(policy: &str, username: &str) -> Option<(String, Option<String>)> {
    let entries: Vec<(String, Option<String>)> = policy
        .split(['\n', ','])
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|entry| match entry.split_once('=') {
            Some((issuer, prefix)) => (issuer.trim().to_owned(), Some(prefix.trim().to_owned())),
            None => (entry.to_owned(), None),
        })
        .collect();
    let prefixed: Vec<_> = entries
        .iter()
        .filter(|(_, p)| {
            p.as_deref()
                .is_some_and(|p| !p.is_empty() && username.starts_with(p))
        })
        .collect();
    match prefixed.as_slice() {
        [one] => Some((*one).clone()),
        [] => {
            let plain: Vec<_> = entries.iter().filter(|(_, p)| p.is_none()).collect();
            (plain.len() == 1).then(|| plain[0].clone())
        }
        _ => None,
    }
}

/// The claim `request` makes for `username`, checked before it is sent.
pub fn claim_for(
    request: &CreateRequest,
    issuer: String,
    subject_id: String,
) -> Result<VirtualMachineClaim, CliError> {
    let ttl_seconds = i64::try_from(request.ttl.as_secs())
        .ok()
        .filter(|s| (1..=banlieue_api::pool::MAX_TTL_SECONDS).contains(s))
        .ok_or_else(|| {
            CliError::Invalid(format!(
                "--ttl {:?} is not between 1 s and ten years",
                request.ttl
            ))
        })?;
    let access = if request.ssh_keys.is_empty() && request.user.is_none() {
        None
    } else {
        let access = ClaimAccess {
            ssh_authorized_keys: request.ssh_keys.clone(),
            user: request.user.clone(),
        };
        if access.ssh_authorized_keys.len() > access::MAX_SSH_KEYS {
            return Err(CliError::Invalid(format!(
                "{} keys: a claim carries at most {}",
                access.ssh_authorized_keys.len(),
                access::MAX_SSH_KEYS
            )));
        }
        access::parse_keys(&access).map_err(CliError::Invalid)?;
        Some(access)
    };
    let metadata = match &request.name {
        Some(name) => ObjectMeta {
            name: Some(name.clone()),
            ..ObjectMeta::default()
        },
        None => ObjectMeta {
            generate_name: Some(format!("{}-", request.pool)),
            ..ObjectMeta::default()
        },
    };
    Ok(VirtualMachineClaim {
        metadata,
        spec: VirtualMachineClaimSpec {
            pool_ref: LocalObjectReference {
                name: request.pool.clone(),
            },
            subject: ClaimSubject {
                issuer,
                id: subject_id,
            },
            ttl_seconds,
            access,
            handover: None,
        },
        status: None,
    })
}

/// Creates the claim for the caller; prints it.
pub async fn create(
    client: &Client,
    namespace: &str,
    request: &CreateRequest,
) -> Result<VirtualMachineClaim, CliError> {
    let username = whoami(client).await?;
    let (issuer, prefix) = match &request.issuer {
        Some(issuer) => (issuer.clone(), None),
        None => {
            let policies: Api<ConfigMap> =
                Api::namespaced(client.clone(), banlieue_api::names::SYSTEM_NAMESPACE);
            let policy = policies
                .get_opt("banlieue-claim-subject-policy")
                .await
                .ok()
                .flatten()
                .and_then(|c| c.data)
                .and_then(|d| d.get("issuers").cloned())
                .unwrap_or_default();
            issuer_for(&policy, &username).ok_or_else(|| {
                CliError::Invalid(format!(
                    "cannot tell which issuer logged you in ({username}): pass --issuer"
                ))
            })?
        }
    };
    let subject_id = request
        .subject_id
        .clone()
        .unwrap_or_else(|| subject_id_of(&username, prefix.as_deref()));
    let claim = claim_for(request, issuer, subject_id)?;
    let claims: Api<VirtualMachineClaim> = Api::namespaced(client.clone(), namespace);
    claims
        .create(&PostParams::default(), &claim)
        .await
        .map_err(CliError::from_kube)
}

/// One line of progress about `claim`, for stderr.
pub fn progress(claim: &VirtualMachineClaim) -> String {
    let status = claim.status.clone().unwrap_or_default();
    let phase = status
        .phase
        .map(|p| format!("{p:?}"))
        .unwrap_or_else(|| "Pending".into());
    let mut line = format!("claim {}: {phase}", claim.name_any());
    if let Some(vm) = &status.virtual_machine_ref {
        line.push_str(&format!(", VM {}", vm.name));
    }
    if let Some(address) = status.addresses.first() {
        line.push_str(&format!(", address {}", address.address));
    }
    if let Some(bound) = status.conditions.iter().find(|c| c.type_ == types::BOUND)
        && bound.status != "True"
    {
        line.push_str(&format!(" ({}: {})", bound.reason, bound.message));
    }
    if let Some(access) = status
        .conditions
        .iter()
        .find(|c| c.type_ == types::ACCESS_READY)
    {
        line.push_str(&format!(", access {}", access.reason));
        if access.status != "True" {
            line.push_str(&format!(" ({})", access.message));
        }
    }
    line
}

/// Whether `claim` is what its consumer waits for: Bound, and with `spec.access` its keys
/// installed. `Err` says why it never will be (released, failed, its keys refused).
pub fn usable(claim: Option<&VirtualMachineClaim>) -> Result<bool, String> {
    let Some(claim) = claim else {
        return Err("it was deleted".into());
    };
    let status = claim.status.clone().unwrap_or_default();
    match status.phase {
        Some(ClaimPhase::Bound) => {}
        Some(ClaimPhase::Failed | ClaimPhase::Releasing) => return Err(progress(claim)),
        _ => return Ok(false),
    }
    if claim.spec.access.is_none() {
        return Ok(true);
    }
    match conditions::find(&status.conditions, types::ACCESS_READY) {
        Some(c) if c.status == conditions::status::TRUE => Ok(true),
        Some(c)
            if c.reason == reasons::ACCESS_REFUSED || c.reason == reasons::ACCESS_NOT_SUPPORTED =>
        {
            Err(format!("its keys were not installed: {}", c.message))
        }
        _ => Ok(false),
    }
}

/// Follows `name` until `done` says it is, printing each change to `log`; gives up after
/// `timeout` with the claim's last state.
async fn follow(
    client: &Client,
    namespace: &str,
    name: &str,
    timeout: Duration,
    log: &mut (dyn Write + Send),
    done: impl Fn(Option<&VirtualMachineClaim>) -> Result<bool, CliError>,
) -> Result<Option<VirtualMachineClaim>, CliError> {
    let claims: Api<VirtualMachineClaim> = Api::namespaced(client.clone(), namespace);
    let mut last = claims.get_opt(name).await.map_err(CliError::from_kube)?;
    if done(last.as_ref())? {
        return Ok(last);
    }
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = std::pin::pin!(watcher(claims, config).default_backoff());
    let mut printed = String::new();
    let outcome = tokio::time::timeout(timeout, async {
        while let Some(event) = events
            .try_next()
            .await
            .map_err(|e| CliError::Invalid(format!("watching claim {name}: {e}")))?
        {
            match event {
                watcher::Event::Apply(claim) | watcher::Event::InitApply(claim) => {
                    last = Some(claim);
                }
                watcher::Event::Delete(_) => last = None,
                watcher::Event::Init | watcher::Event::InitDone => continue,
            }
            if let Some(claim) = &last {
                let line = progress(claim);
                if line != printed {
                    writeln!(log, "{line}")?;
                    printed = line;
                }
            }
            if done(last.as_ref())? {
                return Ok(());
            }
        }
        Ok(())
    })
    .await;
    match outcome {
        Ok(result) => result.map(|()| last),
        Err(_) => Err(CliError::TimedOut {
            name: name.to_owned(),
            after: timeout,
            last: last
                .as_ref()
                .map(progress)
                .unwrap_or_else(|| "it is gone".into()),
        }),
    }
}

/// Waits until `name` is [`usable`]; fails when it fails, disappears or its keys are refused.
pub async fn wait_usable(
    client: &Client,
    namespace: &str,
    name: &str,
    timeout: Duration,
    log: &mut (dyn Write + Send),
) -> Result<VirtualMachineClaim, CliError> {
    let done = |claim: Option<&VirtualMachineClaim>| {
        usable(claim).map_err(|why| CliError::Failed {
            name: name.to_owned(),
            why,
        })
    };
    follow(client, namespace, name, timeout, log, done)
        .await?
        .ok_or_else(|| CliError::Failed {
            name: name.to_owned(),
            why: "it was deleted".into(),
        })
}

/// Deletes `name`; with `wait`, returns once it is gone.
pub async fn release(
    client: &Client,
    namespace: &str,
    name: &str,
    wait: Option<Duration>,
    log: &mut (dyn Write + Send),
) -> Result<(), CliError> {
    let claims: Api<VirtualMachineClaim> = Api::namespaced(client.clone(), namespace);
    claims
        .delete(name, &DeleteParams::default())
        .await
        .map_err(CliError::from_kube)?;
    if let Some(timeout) = wait {
        follow(client, namespace, name, timeout, log, |claim| {
            Ok(claim.is_none())
        })
        .await?;
    }
    Ok(())
}

/// The namespace's claims.
pub async fn list(client: &Client, namespace: &str) -> Result<Vec<VirtualMachineClaim>, CliError> {
    let claims: Api<VirtualMachineClaim> = Api::namespaced(client.clone(), namespace);
    Ok(claims
        .list(&Default::default())
        .await
        .map_err(CliError::from_kube)?
        .items)
}

/// `claims` as `output` prints them.
pub fn render(claims: &[VirtualMachineClaim], output: Output) -> Result<String, CliError> {
    let encode = |e: &dyn std::fmt::Display| CliError::Encode(e.to_string());
    match output {
        Output::Name => Ok(claims
            .iter()
            .map(|c| format!("virtualmachineclaim.banlieue.io/{}\n", c.name_any()))
            .collect()),
        Output::Json => {
            let value = match claims {
                [one] => serde_json::to_value(one),
                many => serde_json::to_value(many),
            }
            .map_err(|e| encode(&e))?;
            serde_json::to_string_pretty(&value)
                .map(|s| s + "\n")
                .map_err(|e| encode(&e))
        }
        Output::Yaml => {
            let mut out = String::new();
            for claim in claims {
                out.push_str("---\n");
                out.push_str(&serde_saphyr::to_string(claim).map_err(|e| encode(&e))?);
            }
            Ok(out)
        }
        Output::Table => Ok(table(claims)),
    }
}

fn table(claims: &[VirtualMachineClaim]) -> String {
    let mut rows = vec![[
        "NAME".to_owned(),
        "POOL".into(),
        "VM".into(),
        "PHASE".into(),
        "EXPIRES".into(),
        "ADDRESS".into(),
    ]];
    for claim in claims {
        let status = claim.status.clone().unwrap_or_default();
        rows.push([
            claim.name_any(),
            claim.spec.pool_ref.name.clone(),
            status
                .virtual_machine_ref
                .map(|r| r.name)
                .unwrap_or_default(),
            status.phase.map(|p| format!("{p:?}")).unwrap_or_default(),
            status
                .expires_at
                .map(|t| t.0.to_string())
                .unwrap_or_default(),
            status
                .addresses
                .first()
                .map(|a| a.address.clone())
                .unwrap_or_default(),
        ]);
    }
    let widths: Vec<usize> = (0..6)
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        out.push_str(line.join("   ").trim_end());
        out.push('\n');
    }
    out
}

/// `banlieue claim …`.
#[derive(Debug, clap::Args)]
pub struct ClaimCommand {
    /// The namespace; the kubeconfig context's when omitted.
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
    /// How claims are printed.
    #[arg(short = 'o', long, global = true, value_enum, default_value_t = Output::Table)]
    pub output: Output,
    #[command(subcommand)]
    pub action: ClaimAction,
}

#[derive(Debug, clap::Subcommand)]
pub enum ClaimAction {
    /// Take one warm member of POOL for yourself.
    Create {
        /// The pool (same namespace).
        pool: String,
        /// The claim's name (default: the pool's name and a suffix).
        #[arg(long)]
        name: Option<String>,
        /// How long the claim lasts once bound: `900`, `900s`, `15m`, `1h`.
        #[arg(long, value_parser = parse_duration)]
        ttl: Duration,
        /// An OpenSSH public key file (`~/.ssh/id_ed25519.pub`); repeatable. Each line is a key.
        #[arg(long = "ssh-key", value_name = "FILE")]
        ssh_keys: Vec<std::path::PathBuf>,
        /// The login to install the keys for (default: the image's default user).
        #[arg(long)]
        user: Option<String>,
        /// The OIDC issuer that logged you in (default: the one the site's claim-subject
        /// policy gives your username, when you may read it).
        #[arg(long, env = "BANLIEUE_ISSUER")]
        issuer: Option<String>,
        /// The subject's id (default: your username without its issuer's prefix); only a
        /// broker may name someone else.
        #[arg(long)]
        subject_id: Option<String>,
        /// Follow the claim until it is Bound, printing each change to stderr.
        #[arg(long)]
        wait: bool,
        /// How long `--wait` waits.
        #[arg(long, value_parser = parse_duration, default_value = "5m")]
        timeout: Duration,
    },
    /// List the namespace's claims.
    List,
    /// Prove which VM the claim holds: its TPM, certified by the EK trust bundle you hold,
    /// answers a fresh challenge for this claim, and quotes the SSH host keys the claim shows.
    /// Each check is printed; nothing banlieue says is taken on trust.
    Verify {
        name: String,
        /// The PEM bundle the claim's EK certificate must chain to: the Provider's
        /// `ekTrustBundle`, as your administrator gave it to you.
        #[arg(long, env = "BANLIEUE_EK_TRUST_BUNDLE", value_name = "FILE")]
        trust_bundle: std::path::PathBuf,
        /// The PCR values a boot of the claim's image must quote (`PCR SHA256-HEX` lines, as
        /// `verify --write-pcrs` writes them), from whoever publishes the image.
        #[arg(long, env = "BANLIEUE_PCR_REFERENCES", value_name = "FILE")]
        pcr_references: Option<std::path::PathBuf>,
        /// Write the verified PCR values to FILE, in the form `--pcr-references` reads.
        #[arg(long, value_name = "FILE")]
        write_pcrs: Option<std::path::PathBuf>,
        /// How long to wait for the VM's answer.
        #[arg(long, value_parser = parse_duration, default_value = "1m")]
        timeout: Duration,
    },
    /// Hand the claim's VM a secret only it can open: the payload of FILE is sealed to a
    /// challenge as `verify` makes it, and the verified guest's TPM alone releases the key;
    /// the guest puts it at /run/banlieue/sealed/payload, for the claim's login alone.
    Seal {
        name: String,
        /// The payload (at most 32 KiB): a token, a key.
        #[arg(long, value_name = "FILE")]
        from_file: std::path::PathBuf,
        /// The EK trust bundle (as for `verify`).
        #[arg(long, env = "BANLIEUE_EK_TRUST_BUNDLE", value_name = "FILE")]
        trust_bundle: std::path::PathBuf,
        /// The PCR values a boot of the claim's image must quote (`PCR SHA256-HEX` lines, as
        /// `verify --write-pcrs` writes them), from whoever publishes the image.
        #[arg(long, env = "BANLIEUE_PCR_REFERENCES", value_name = "FILE")]
        pcr_references: Option<std::path::PathBuf>,
        /// How long to wait for the VM's answer.
        #[arg(long, value_parser = parse_duration, default_value = "1m")]
        timeout: Duration,
    },
    /// Log in to a claim's member with the system `ssh` (or run COMMAND there), once `verify`
    /// proved the VM, with the member's host keys pinned from the claim's
    /// `status.sshHostKeys`: no host is trusted on first use.
    Ssh {
        name: String,
        /// The private key to offer (`ssh -i`); the ssh agent's keys otherwise.
        #[arg(short = 'i', long, value_name = "FILE")]
        identity: Option<std::path::PathBuf>,
        /// The EK trust bundle to verify the VM with first (as for `verify`).
        #[arg(long, env = "BANLIEUE_EK_TRUST_BUNDLE", value_name = "FILE")]
        trust_bundle: Option<std::path::PathBuf>,
        /// The PCR values a boot of the claim's image must quote (`PCR SHA256-HEX` lines, as
        /// `verify --write-pcrs` writes them), from whoever publishes the image.
        #[arg(
            long,
            requires = "trust_bundle",
            env = "BANLIEUE_PCR_REFERENCES",
            value_name = "FILE"
        )]
        pcr_references: Option<std::path::PathBuf>,
        /// Pin the claim's host keys without verifying the VM first: trust the relay.
        #[arg(long, conflicts_with = "trust_bundle")]
        no_verify: bool,
        /// The command to run, after `--`.
        #[arg(last = true, value_name = "COMMAND")]
        command: Vec<String>,
    },
    /// Release a claim: its member is destroyed.
    Release {
        name: String,
        /// Return once the claim is gone.
        #[arg(long)]
        wait: bool,
        /// How long `--wait` waits.
        #[arg(long, value_parser = parse_duration, default_value = "5m")]
        timeout: Duration,
    },
}

/// How `banlieue claim ssh` runs the system `ssh` for `claim`: its arguments and the
/// known_hosts file (written to `known_hosts`) that pins the member's host keys.
pub fn ssh_invocation(
    claim: &VirtualMachineClaim,
    known_hosts: &std::path::Path,
    identity: Option<&std::path::Path>,
    command: &[String],
) -> Result<(Vec<String>, String), CliError> {
    let name = claim.name_any();
    let not_ready = |why: String| CliError::Invalid(format!("claim {name}: {why}"));
    if claim.spec.access.is_none() {
        return Err(not_ready(
            "it carries no keys (spec.access): create it with --ssh-key".into(),
        ));
    }
    match usable(Some(claim)) {
        Ok(true) => {}
        Ok(false) => return Err(not_ready(format!("not ready yet: {}", progress(claim)))),
        Err(why) => return Err(not_ready(why)),
    }
    let status = claim.status.clone().unwrap_or_default();
    if status.ssh_host_keys.is_empty() {
        return Err(not_ready(
            "its guest published no SSH host keys, so its host cannot be pinned".into(),
        ));
    }
    // The address comes from the member's network or its guest: only an IP address is
    // passed to ssh, never text that could read as an option.
    let address = status
        .addresses
        .iter()
        .find_map(|a| a.address.parse::<std::net::IpAddr>().ok())
        .ok_or_else(|| not_ready("its member has no IP address yet".into()))?;
    let user = status
        .login_user
        .clone()
        .or_else(|| claim.spec.access.as_ref().and_then(|a| a.user.clone()))
        .ok_or_else(|| not_ready("no login is recorded for its keys".into()))?;
    let mut pinned = String::new();
    for key in &status.ssh_host_keys {
        let key = access::parse_authorized_key(key)
            .map_err(|why| not_ready(format!("a host key on the claim {why}")))?;
        pinned.push_str(&format!("{address} {}\n", key.line()));
    }
    let mut args: Vec<String> = [
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        &format!("UserKnownHostsFile={}", known_hosts.display()),
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-o",
        "UpdateHostKeys=no",
        // banlieue installs keys and nothing else: no password prompt from a sandbox.
        "-o",
        "PreferredAuthentications=publickey",
        "-o",
        "ConnectTimeout=15",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    if let Some(identity) = identity {
        args.extend([
            "-i".to_owned(),
            identity.display().to_string(),
            "-o".to_owned(),
            "IdentitiesOnly=yes".to_owned(),
        ]);
    }
    args.push("--".into());
    args.push(format!("{user}@{address}"));
    args.extend(command.iter().cloned());
    Ok((args, pinned))
}

/// How `banlieue claim ssh` logs in.
struct SshLogin<'a> {
    identity: Option<&'a std::path::Path>,
    /// The EK trust bundle to verify the VM with before its host keys are pinned; `None`
    /// trusts the relay (`--no-verify`).
    verify_with: Option<&'a crate::claim_verify::Trust>,
    command: &'a [String],
}

/// How long `banlieue claim ssh` waits for the VM's answer to its challenge.
const SSH_VERIFY_TIMEOUT: Duration = Duration::from_secs(60);

/// `banlieue claim ssh`: the system `ssh`, its exit status passed on.
async fn ssh(
    client: &Client,
    namespace: &str,
    name: &str,
    login: &SshLogin<'_>,
    log: &mut impl Write,
) -> Result<(), CliError> {
    let claims: Api<VirtualMachineClaim> = Api::namespaced(client.clone(), namespace);
    let claim = claims.get(name).await.map_err(CliError::from_kube)?;
    let dir = tempfile::tempdir()?;
    let known_hosts = dir.path().join("known_hosts");
    // A claim not ready for a login is said to be so before any challenge is made.
    let (mut args, mut pinned) =
        ssh_invocation(&claim, &known_hosts, login.identity, login.command)?;
    if let Some(trust) = login.verify_with {
        let (verified, _) =
            crate::claim_verify::verify(client, namespace, name, trust, SSH_VERIFY_TIMEOUT, log)
                .await?;
        // The host keys pinned are those the verified quote covered.
        (args, pinned) = ssh_invocation(&verified, &known_hosts, login.identity, login.command)?;
    }
    std::fs::write(&known_hosts, pinned)?;
    let status = tokio::process::Command::new("ssh")
        .args(&args)
        .status()
        .await
        .map_err(|e| CliError::Invalid(format!("running ssh: {e}")))?;
    match status.code() {
        Some(0) => Ok(()),
        Some(code) => Err(CliError::Ssh(code)),
        None => Err(CliError::Ssh(-1)),
    }
}

/// `claim verify` and `claim seal`: a handover to the claim's VM, checked here.
async fn hand_over(
    client: &Client,
    namespace: &str,
    action: ClaimAction,
    out: &mut impl Write,
    log: &mut impl Write,
) -> Result<(), CliError> {
    match action {
        ClaimAction::Verify {
            name,
            trust_bundle,
            pcr_references,
            write_pcrs,
            timeout,
        } => {
            let trust = crate::claim_verify::read_trust(&trust_bundle, pcr_references.as_deref())?;
            let (_, verified) =
                crate::claim_verify::verify(client, namespace, &name, &trust, timeout, log).await?;
            if let Some(path) = write_pcrs {
                crate::claim_verify::write_pcrs(&path, &verified)?;
            }
            writeln!(out, "virtualmachineclaim.banlieue.io/{name} verified")?;
        }
        ClaimAction::Seal {
            name,
            from_file,
            trust_bundle,
            pcr_references,
            timeout,
        } => {
            let trust = crate::claim_verify::read_trust(&trust_bundle, pcr_references.as_deref())?;
            let payload = crate::claim_verify::read_payload(&from_file)?;
            let (_, verified) =
                crate::claim_verify::seal(client, namespace, &name, &trust, &payload, timeout, log)
                    .await?;
            let opened = verified.opened.unwrap_or_default();
            writeln!(
                out,
                "virtualmachineclaim.banlieue.io/{name} sealed payload opened at {opened}"
            )?;
        }
        // `run` hands only these two here.
        _ => {}
    }
    Ok(())
}

/// `900`, `900s`, `15m`, `1h`, `2d`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, "s"),
    };
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration such as 900s, 15m or 1h"))?;
    let scale = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        _ => return Err(format!("{text:?}: the unit is one of s, m, h, d")),
    };
    number
        .checked_mul(scale)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("{text:?} is too long"))
}

/// The key lines of `files`: every line that is not blank or a comment.
fn read_keys(files: &[std::path::PathBuf]) -> Result<Vec<String>, CliError> {
    let mut keys = Vec::new();
    for file in files {
        let metadata = std::fs::metadata(file)
            .map_err(|e| CliError::Invalid(format!("{}: {e}", file.display())))?;
        // A public key file is a few KiB; a larger one is the wrong file (a private key
        // directory, a log), not keys.
        if metadata.len() > (access::MAX_SSH_KEYS * access::MAX_SSH_KEY_LENGTH) as u64 {
            return Err(CliError::Invalid(format!(
                "{}: {} bytes is not a public key file",
                file.display(),
                metadata.len()
            )));
        }
        let text = std::fs::read_to_string(file)
            .map_err(|e| CliError::Invalid(format!("{}: {e}", file.display())))?;
        if text.contains("PRIVATE KEY") {
            return Err(CliError::Invalid(format!(
                "{} holds a private key: pass the .pub file",
                file.display()
            )));
        }
        keys.extend(
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(str::to_owned),
        );
    }
    Ok(keys)
}

/// Runs `command` as the kubeconfig's user, printing to stdout (results) and stderr
/// (progress).
pub async fn run(command: ClaimCommand) -> Result<(), CliError> {
    let client = Client::try_default().await?;
    let namespace = command
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_owned());
    let mut log = std::io::stderr();
    let mut out = std::io::stdout();
    match command.action {
        ClaimAction::Create {
            pool,
            name,
            ttl,
            ssh_keys,
            user,
            issuer,
            subject_id,
            wait,
            timeout,
        } => {
            let request = CreateRequest {
                pool,
                name,
                ttl,
                issuer,
                subject_id,
                ssh_keys: read_keys(&ssh_keys)?,
                user,
            };
            let mut claim = create(&client, &namespace, &request).await?;
            if wait {
                writeln!(log, "{}", progress(&claim))?;
                claim =
                    wait_usable(&client, &namespace, &claim.name_any(), timeout, &mut log).await?;
            }
            out.write_all(render(&[claim], command.output)?.as_bytes())?;
        }
        action @ (ClaimAction::Verify { .. } | ClaimAction::Seal { .. }) => {
            hand_over(&client, &namespace, action, &mut out, &mut log).await?;
        }
        ClaimAction::Ssh {
            name,
            identity,
            trust_bundle,
            pcr_references,
            no_verify,
            command,
        } => {
            let verify_with = match (trust_bundle, no_verify) {
                (Some(path), _) => Some(crate::claim_verify::read_trust(
                    &path,
                    pcr_references.as_deref(),
                )?),
                (None, true) => None,
                (None, false) => {
                    return Err(CliError::Invalid(
                        "claim ssh proves the VM before it trusts its host keys: pass \
                         --trust-bundle FILE (the Provider's EK trust bundle; or set \
                         BANLIEUE_EK_TRUST_BUNDLE), or --no-verify to trust the relay"
                            .into(),
                    ));
                }
            };
            let login = SshLogin {
                identity: identity.as_deref(),
                verify_with: verify_with.as_ref(),
                command: &command,
            };
            ssh(&client, &namespace, &name, &login, &mut log).await?
        }
        ClaimAction::List => {
            let claims = list(&client, &namespace).await?;
            out.write_all(render(&claims, command.output)?.as_bytes())?;
        }
        ClaimAction::Release {
            name,
            wait,
            timeout,
        } => {
            release(
                &client,
                &namespace,
                &name,
                wait.then_some(timeout),
                &mut log,
            )
            .await?;
            writeln!(out, "virtualmachineclaim.banlieue.io/{name} released")?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_issuer_is_the_one_whose_prefix_the_username_carries() {
        let policy = "# ours\nhttps://a.example=a:\nhttps://b.example=b:, https://plain.example\n";
        assert_eq!(
            issuer_for(policy, "b:alice"),
            Some(("https://b.example".into(), Some("b:".into())))
        );
        assert_eq!(
            issuer_for(policy, "alice"),
            Some(("https://plain.example".into(), None))
        );
        // Two issuers without a prefix: which one is ambiguous, so none is guessed.
        assert_eq!(issuer_for("https://x\nhttps://y", "alice"), None);
        assert_eq!(issuer_for("", "alice"), None);
        assert_eq!(subject_id_of("b:alice", Some("b:")), "alice");
        assert_eq!(subject_id_of("alice", None), "alice");
    }

    fn request() -> CreateRequest {
        CreateRequest {
            pool: "sandbox-pool".into(),
            name: None,
            ttl: Duration::from_secs(3600),
            issuer: None,
            subject_id: None,
            ssh_keys: Vec::new(),
            user: None,
        }
    }

    #[test]
    fn a_claim_is_checked_before_it_is_sent() {
        let claim = claim_for(&request(), "https://i".into(), "alice".into()).unwrap();
        assert_eq!(
            claim.metadata.generate_name.as_deref(),
            Some("sandbox-pool-")
        );
        assert_eq!(claim.spec.ttl_seconds, 3600);
        assert_eq!(claim.spec.access, None);

        let mut bad_key = request();
        bad_key.ssh_keys = vec!["ssh-ed25519 AAAA".into()];
        let error = claim_for(&bad_key, "https://i".into(), "alice".into()).unwrap_err();
        assert!(
            error.to_string().starts_with("sshAuthorizedKeys entry 0 "),
            "{error}"
        );
        let mut zero = request();
        zero.ttl = Duration::from_millis(10);
        assert!(matches!(
            claim_for(&zero, "https://i".into(), "alice".into()),
            Err(CliError::Invalid(_))
        ));
    }

    #[test]
    fn durations_read_as_kubectl_writes_them() {
        assert_eq!(parse_duration("900"), Ok(Duration::from_secs(900)));
        assert_eq!(parse_duration("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_duration("1w").is_err());
        assert!(parse_duration("h").is_err());
        assert!(parse_duration("99999999999999999999d").is_err());
    }

    #[test]
    fn outputs_name_and_tabulate() {
        let mut claim = claim_for(&request(), "https://i".into(), "alice".into()).unwrap();
        claim.metadata.name = Some("sandbox-pool-x7k2p".into());
        assert_eq!(
            render(std::slice::from_ref(&claim), Output::Name).unwrap(),
            "virtualmachineclaim.banlieue.io/sandbox-pool-x7k2p\n"
        );
        let table = render(std::slice::from_ref(&claim), Output::Table).unwrap();
        assert!(table.starts_with("NAME "), "{table}");
        assert!(
            table.contains("sandbox-pool-x7k2p   sandbox-pool"),
            "{table}"
        );
        let json: serde_json::Value =
            serde_json::from_str(&render(&[claim], Output::Json).unwrap()).unwrap();
        assert_eq!(json["spec"]["poolRef"]["name"], "sandbox-pool");
    }

    /// A Bound claim with keys, as `status` (merged into a Bound status) says.
    fn bound(status: serde_json::Value) -> VirtualMachineClaim {
        let key =
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
        let mut base = serde_json::json!({
            "phase": "Bound",
            "addresses": [{"type": "InternalIP", "address": "192.0.2.41"}],
            "sshHostKeys": [key],
            "loginUser": "alice",
            "conditions": [{"type": "AccessReady", "status": "True", "reason": "AccessInstalled",
                            "message": "", "lastTransitionTime": "2026-12-07T00:00:00Z"}]
        });
        base.as_object_mut()
            .unwrap()
            .extend(status.as_object().unwrap().clone());
        serde_json::from_value(serde_json::json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachineClaim",
            "metadata": {"name": "c", "namespace": "ns"},
            "spec": {"poolRef": {"name": "p"}, "subject": {"issuer": "i", "id": "alice"},
                     "ttlSeconds": 60, "access": {"sshAuthorizedKeys": [key]}},
            "status": base
        }))
        .unwrap()
    }

    #[test]
    fn ssh_pins_the_claims_host_keys_and_takes_no_option_from_it() {
        let path = std::path::Path::new("/tmp/kh");
        let command = vec!["uname".to_owned(), "-a".to_owned()];
        let (args, pinned) =
            ssh_invocation(&bound(serde_json::json!({})), path, None, &command).unwrap();
        assert!(args.contains(&"StrictHostKeyChecking=yes".to_owned()));
        assert!(args.contains(&"UserKnownHostsFile=/tmp/kh".to_owned()));
        let at = args.iter().position(|a| a == "--").unwrap();
        assert_eq!(args[at + 1..], ["alice@192.0.2.41", "uname", "-a"]);
        assert!(
            pinned.starts_with("192.0.2.41 ssh-ed25519 AAAA"),
            "{pinned}"
        );

        // An address that is not an IP address is never passed on.
        let forged = bound(serde_json::json!({
            "addresses": [{"type": "InternalIP", "address": "-oProxyCommand=sh"}]
        }));
        assert!(ssh_invocation(&forged, path, None, &[]).is_err());
        // No host keys: nothing to pin, so no login.
        let unpinned = bound(serde_json::json!({"sshHostKeys": []}));
        let error = ssh_invocation(&unpinned, path, None, &[]).unwrap_err();
        assert!(error.to_string().contains("cannot be pinned"), "{error}");
        // Keys not installed yet, or refused.
        let pending = bound(serde_json::json!({"conditions": [{"type": "AccessReady",
            "status": "False", "reason": "AccessPending", "message": "soon",
            "lastTransitionTime": "2026-12-07T00:00:00Z"}]}));
        assert_eq!(usable(Some(&pending)), Ok(false));
        assert!(ssh_invocation(&pending, path, None, &[]).is_err());
        let refused = bound(serde_json::json!({"conditions": [{"type": "AccessReady",
            "status": "False", "reason": "AccessRefused", "message": "bad user",
            "lastTransitionTime": "2026-12-07T00:00:00Z"}]}));
        assert!(usable(Some(&refused)).unwrap_err().contains("bad user"));
        assert!(usable(None).is_err());
    }
}
