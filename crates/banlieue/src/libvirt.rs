//! `banlieue libvirt …`: diagnostics over the client library.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use banlieue_libvirt::flags::{ConnectListAllDomainsFlags, ConnectListAllStoragePoolsFlags};
use banlieue_libvirt::proto::PROGRAMS;
use banlieue_libvirt::stream::{Transfer, TransferOptions};
use banlieue_libvirt::xdr::StreamDirection;
use banlieue_libvirt::{
    Backoff, CaBundle, Client, ClientOptions, ConnectUri, Domain, DomainState, Identity,
    LifecycleUpdate, Reconnecting, StoragePool, StorageVol, uuid_string, version_string,
};
use clap::{Args, Subcommand, ValueEnum};
use serde_json::json;

type BoxError = Box<dyn std::error::Error>;

#[derive(Debug, Subcommand)]
pub enum Command {
    /// List the procedures generated from libvirt's protocol files.
    ///
    /// One line per procedure: program, number, name, argument type, return type (`-` for
    /// void) and, for stream procedures, the direction (`stream:read` or `stream:write`).
    Procedures {
        /// Only this program.
        #[arg(long, value_enum)]
        program: Option<Program>,
    },
    /// The daemon's libvirt version, the hypervisor and its version, and the host name.
    Version(Connect),
    /// The host's capabilities XML.
    Capabilities(Connect),
    /// Storage pools: name, state, autostart.
    Pools(Connect),
    /// Volumes of a pool: name, type, capacity, allocation, path.
    Vols {
        /// Storage pool name.
        pool: String,
        #[command(flatten)]
        conn: Connect,
    },
    /// Domains, running and defined: id, name, state.
    Domains(Connect),
    /// Upload a local file into a volume.
    VolUpload {
        /// Storage pool name.
        pool: String,
        /// Volume name in the pool.
        vol: String,
        /// File to read.
        file: PathBuf,
        #[command(flatten)]
        range: Range,
        #[command(flatten)]
        conn: Connect,
    },
    /// Download a volume into a local file.
    VolDownload {
        /// Storage pool name.
        pool: String,
        /// Volume name in the pool.
        vol: String,
        /// File to write (created or truncated).
        file: PathBuf,
        #[command(flatten)]
        range: Range,
        #[command(flatten)]
        conn: Connect,
    },
    /// Print domain lifecycle events as they happen, across daemon restarts.
    Events {
        /// Stop after this many events.
        #[arg(long)]
        count: Option<usize>,
        /// Stop after this many seconds.
        #[arg(long, value_name = "SECS")]
        timeout: Option<u64>,
        #[command(flatten)]
        conn: Connect,
    },
}

/// How to reach libvirtd.
#[derive(Debug, Args)]
pub struct Connect {
    /// `qemu+tls://HOST[:PORT]/system` (or `/session`). As for virsh, `?pkipath=DIR` names a
    /// directory holding cacert.pem, clientcert.pem and clientkey.pem; without it they are read
    /// from ~/.config/banlieue/libvirt/. Also `qemu:///system`, `qemu+unix:///system?socket=PATH`
    /// (the local socket) and `qemu+tcp://HOST[:PORT]/system`, which need no files.
    #[arg(
        short = 'c',
        long = "connect",
        value_name = "URI",
        env = "LIBVIRT_DEFAULT_URI"
    )]
    uri: Option<String>,
    /// Client certificate (PEM), instead of the pki dir's clientcert.pem.
    #[arg(long, value_name = "FILE")]
    cert: Option<PathBuf>,
    /// Client key (PEM: PKCS#1, PKCS#8 or SEC1), instead of the pki dir's clientkey.pem.
    #[arg(long, value_name = "FILE")]
    key: Option<PathBuf>,
    /// CA bundle (PEM), instead of the pki dir's cacert.pem.
    #[arg(long, value_name = "FILE")]
    ca: Option<PathBuf>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    output: Output,
}

/// Part of a volume.
#[derive(Debug, Args)]
pub struct Range {
    /// Send runs of zeros as holes (VIR_STORAGE_VOL_{UPLOAD,DOWNLOAD}_SPARSE_STREAM).
    #[arg(long)]
    sparse: bool,
    /// Start at this byte of the volume.
    #[arg(long, default_value_t = 0)]
    offset: u64,
    /// Move this many bytes (0: everything).
    #[arg(long, default_value_t = 0)]
    length: u64,
}

impl Range {
    /// The transfer these flags ask for; an upload's length is the file's when none is given.
    fn transfer(&self, length: u64) -> TransferOptions<'static> {
        TransferOptions::new()
            .offset(self.offset)
            .length(length)
            .sparse(self.sparse)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Program {
    Remote,
    Qemu,
    Lxc,
    Admin,
    Keepalive,
}

impl Program {
    fn name(self) -> &'static str {
        match self {
            Program::Remote => "remote",
            Program::Qemu => "qemu",
            Program::Lxc => "lxc",
            Program::Admin => "admin",
            Program::Keepalive => "keepalive",
        }
    }
}

pub fn run(cmd: Command) -> Result<(), Box<dyn std::error::Error>> {
    if let Command::Procedures { program } = cmd {
        return procedures(program);
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // One line whatever the depth: the library's errors keep their causes in the chain.
    runtime
        .block_on(remote_command(cmd))
        .map_err(|e| banlieue_api::conditions::error_message(&*e).into())
}

async fn remote_command(cmd: Command) -> Result<(), BoxError> {
    match cmd {
        Command::Procedures { .. } => unreachable!("handled without a runtime"),
        Command::Version(conn) => version(&conn).await,
        Command::Capabilities(conn) => {
            let caps = conn.client().await?.capabilities().await?;
            match conn.output {
                Output::Table => print!("{caps}"),
                Output::Json => println!("{}", json!({ "capabilities": caps })),
            }
            Ok(())
        }
        Command::Pools(conn) => pools(&conn).await,
        Command::Vols { pool, conn } => vols(&conn, &pool).await,
        Command::Domains(conn) => domains(&conn).await,
        Command::VolUpload {
            pool,
            vol,
            file,
            range,
            conn,
        } => vol_upload(&conn, &pool, &vol, &file, &range).await,
        Command::VolDownload {
            pool,
            vol,
            file,
            range,
            conn,
        } => vol_download(&conn, &pool, &vol, &file, &range).await,
        Command::Events {
            count,
            timeout,
            conn,
        } => events(&conn, count, timeout.map(Duration::from_secs)).await,
    }
}

/// Where the client's TLS files are read from.
struct Pki {
    cert: PathBuf,
    key: PathBuf,
    ca: PathBuf,
}

impl Connect {
    fn uri(&self) -> Result<&str, BoxError> {
        self.uri
            .as_deref()
            .ok_or_else(|| "no libvirt URI: pass -c/--connect or set LIBVIRT_DEFAULT_URI".into())
    }

    fn pki(&self) -> Result<Pki, BoxError> {
        let uri = ConnectUri::parse(self.uri()?)?;
        let dir = match uri.pkipath {
            Some(dir) => PathBuf::from(dir),
            None => default_pki_dir()?,
        };
        let pick =
            |given: &Option<PathBuf>, name: &str| given.clone().unwrap_or_else(|| dir.join(name));
        Ok(Pki {
            cert: pick(&self.cert, "clientcert.pem"),
            key: pick(&self.key, "clientkey.pem"),
            ca: pick(&self.ca, "cacert.pem"),
        })
    }

    fn material(&self) -> Result<(Identity, CaBundle), BoxError> {
        let pki = self.pki()?;
        let identity = Identity::from_files(&pki.cert, &pki.key)?;
        let ca = CaBundle::from_file(&pki.ca)?;
        Ok((identity, ca))
    }

    /// TLS with the client's files for `qemu+tls`; the local socket or plain TCP otherwise,
    /// where no files are read.
    async fn client(&self) -> Result<Client, BoxError> {
        let uri = ConnectUri::parse(self.uri()?)?;
        if uri.transport != banlieue_libvirt::uri::Transport::Tls {
            return Ok(Client::connect_plain(self.uri()?).await?);
        }
        let (identity, ca) = self.material()?;
        Ok(Client::connect(self.uri()?, &identity, &ca).await?)
    }
}

/// `$XDG_CONFIG_HOME/banlieue/libvirt`, else `~/.config/banlieue/libvirt`.
fn default_pki_dir() -> Result<PathBuf, BoxError> {
    if let Some(dir) = std::env::var_os("XDG_CONFIG_HOME").filter(|d| !d.is_empty()) {
        return Ok(Path::new(&dir).join("banlieue/libvirt"));
    }
    let home = std::env::var_os("HOME")
        .filter(|d| !d.is_empty())
        .ok_or("HOME is not set: pass ?pkipath=DIR in the URI or --cert, --key and --ca")?;
    Ok(Path::new(&home).join(".config/banlieue/libvirt"))
}

/// Left-aligned columns separated by two spaces, with a header row.
fn print_table(headers: &[&str], rows: &[Vec<String>]) -> std::io::Result<()> {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = std::io::stdout().lock();
    let line = |cells: Vec<&str>| {
        let last = cells.len().saturating_sub(1);
        let mut s = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i == last {
                s.push_str(cell);
            } else {
                s.push_str(&format!("{cell:<w$}  "));
            }
        }
        s
    };
    writeln!(out, "{}", line(headers.to_vec()))?;
    for row in rows {
        writeln!(out, "{}", line(row.iter().map(String::as_str).collect()))?;
    }
    Ok(())
}

async fn version(conn: &Connect) -> Result<(), BoxError> {
    let c = conn.client().await?;
    let lib = c.lib_version().await?;
    let hv = c.version().await?;
    let kind = c.hypervisor_type().await?;
    let host = c.hostname().await?;
    match conn.output {
        Output::Table => {
            println!("libvirt     {}", version_string(lib));
            println!("hypervisor  {kind} {}", version_string(hv));
            println!("host        {host}");
        }
        Output::Json => println!(
            "{}",
            json!({
                "libvirt": version_string(lib),
                "hypervisor": { "type": kind, "version": version_string(hv) },
                "hostname": host,
            })
        ),
    }
    Ok(())
}

async fn pools(conn: &Connect) -> Result<(), BoxError> {
    let c = conn.client().await?;
    let mut rows = Vec::new();
    for pool in c
        .list_all_storage_pools(ConnectListAllStoragePoolsFlags::empty())
        .await?
    {
        let active = pool.is_active().await?;
        let autostart = pool.get_autostart().await?;
        rows.push((pool.name().to_string(), active, autostart));
    }
    rows.sort();
    match conn.output {
        Output::Table => print_table(
            &["NAME", "STATE", "AUTOSTART"],
            &rows
                .iter()
                .map(|(n, a, s)| {
                    vec![
                        n.clone(),
                        if *a { "active" } else { "inactive" }.into(),
                        if *s { "yes" } else { "no" }.into(),
                    ]
                })
                .collect::<Vec<_>>(),
        )?,
        Output::Json => println!(
            "{}",
            serde_json::Value::Array(
                rows.iter()
                    .map(|(n, a, s)| json!({ "name": n, "active": a, "autostart": s }))
                    .collect()
            )
        ),
    }
    Ok(())
}

async fn pool_named(c: &Client, name: &str) -> Result<StoragePool, BoxError> {
    StoragePool::lookup_by_name(c, name)
        .await?
        .ok_or_else(|| format!("storage pool {name:?} not found").into())
}

async fn vol_named(c: &Client, pool: &str, name: &str) -> Result<StorageVol, BoxError> {
    let p = pool_named(c, pool).await?;
    StorageVol::lookup_by_name(&p, name)
        .await?
        .ok_or_else(|| format!("volume {name:?} not found in pool {pool:?}").into())
}

async fn vols(conn: &Connect, pool: &str) -> Result<(), BoxError> {
    let c = conn.client().await?;
    let pool = pool_named(&c, pool).await?;
    let mut rows = Vec::new();
    for vol in pool.list_all_volumes().await? {
        let info = vol.get_info().await?;
        let path = vol.get_path().await?;
        rows.push((vol.name().to_string(), info, path));
    }
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    match conn.output {
        Output::Table => print_table(
            &["NAME", "TYPE", "CAPACITY", "ALLOCATION", "PATH"],
            &rows
                .iter()
                .map(|(n, i, p)| {
                    vec![
                        n.clone(),
                        i.kind.name().unwrap_or("unknown").to_string(),
                        i.capacity.to_string(),
                        i.allocation.to_string(),
                        p.clone(),
                    ]
                })
                .collect::<Vec<_>>(),
        )?,
        Output::Json => println!(
            "{}",
            serde_json::Value::Array(
                rows.iter()
                    .map(|(n, i, p)| json!({
                        "name": n,
                        "type": i.kind.name(),
                        "capacity": i.capacity,
                        "allocation": i.allocation,
                        "path": p,
                    }))
                    .collect()
            )
        ),
    }
    Ok(())
}

async fn domains(conn: &Connect) -> Result<(), BoxError> {
    let c = conn.client().await?;
    let mut rows: Vec<(Domain, DomainState)> = Vec::new();
    for dom in c
        .list_all_domains(ConnectListAllDomainsFlags::empty())
        .await?
    {
        let (state, _) = dom.get_state().await?;
        rows.push((dom, state));
    }
    // virsh's order: running domains by id, then the others by name.
    rows.sort_by(|(a, _), (b, _)| {
        let key = |d: &Domain| (d.id() < 0, d.id(), d.name().to_string());
        key(a).cmp(&key(b))
    });
    let id = |d: &Domain| {
        if d.id() < 0 {
            "-".to_string()
        } else {
            d.id().to_string()
        }
    };
    let state = |s: DomainState| s.to_string();
    match conn.output {
        Output::Table => print_table(
            &["ID", "NAME", "STATE"],
            &rows
                .iter()
                .map(|(d, s)| vec![id(d), d.name().to_string(), state(*s)])
                .collect::<Vec<_>>(),
        )?,
        Output::Json => println!(
            "{}",
            serde_json::Value::Array(
                rows.iter()
                    .map(|(d, s)| json!({
                        "id": if d.id() < 0 { None } else { Some(d.id()) },
                        "name": d.name(),
                        "uuid": d.uuid_string(),
                        "state": state(*s),
                    }))
                    .collect()
            )
        ),
    }
    Ok(())
}

fn report_transfer(
    output: Output,
    verb: &str,
    vol: &StorageVol,
    t: Transfer,
) -> Result<(), BoxError> {
    match output {
        Output::Table => println!(
            "{verb} {} bytes ({} as data, {} as holes) {} {}/{}",
            t.data + t.holes,
            t.data,
            t.holes,
            if verb == "uploaded" { "to" } else { "from" },
            vol.pool(),
            vol.name()
        ),
        Output::Json => println!(
            "{}",
            json!({ verb: { "pool": vol.pool(), "volume": vol.name(), "data": t.data, "holes": t.holes } })
        ),
    }
    Ok(())
}

async fn vol_upload(
    conn: &Connect,
    pool: &str,
    vol: &str,
    file: &Path,
    range: &Range,
) -> Result<(), BoxError> {
    let mut source = tokio::fs::File::open(file)
        .await
        .map_err(|e| format!("open {}: {e}", file.display()))?;
    let length = match range.length {
        0 => source.metadata().await?.len(),
        n => n,
    };
    let c = conn.client().await?;
    let v = vol_named(&c, pool, vol).await?;
    let t = v.upload(&mut source, range.transfer(length)).await?;
    report_transfer(conn.output, "uploaded", &v, t)
}

async fn vol_download(
    conn: &Connect,
    pool: &str,
    vol: &str,
    file: &Path,
    range: &Range,
) -> Result<(), BoxError> {
    let c = conn.client().await?;
    let v = vol_named(&c, pool, vol).await?;
    let sink = tokio::fs::File::create(file)
        .await
        .map_err(|e| format!("create {}: {e}", file.display()))?;
    // With --sparse the volume's holes stay holes in the file.
    let t = v
        .download_to_file(sink, range.transfer(range.length))
        .await?;
    report_transfer(conn.output, "downloaded", &v, t)
}

async fn events(
    conn: &Connect,
    count: Option<usize>,
    timeout: Option<Duration>,
) -> Result<(), BoxError> {
    let (identity, ca) = conn.material()?;
    let rc = Reconnecting::connect(
        conn.uri()?,
        &identity,
        &ca,
        ClientOptions::default(),
        Backoff::default(),
    )
    .await?;
    let mut watch = rc.lifecycle_events().await?;
    eprintln!("watching domain lifecycle events");
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    let mut seen = 0;
    // Flushed per line, so a pipe sees each event as it happens.
    let mut out = std::io::stdout();
    while count.is_none_or(|n| seen < n) {
        let next = async {
            match deadline {
                Some(d) => tokio::time::timeout_at(d, watch.next()).await.ok(),
                None => Some(watch.next().await),
            }
        };
        let update = tokio::select! {
            u = next => u,
            _ = tokio::signal::ctrl_c() => None,
        };
        let Some(update) = update else { break };
        let Some(update) = update else {
            return Err("the event stream ended".into());
        };
        match update? {
            LifecycleUpdate::Event(e) => {
                seen += 1;
                let name = e.event.to_string();
                match conn.output {
                    Output::Table => {
                        writeln!(out, "{}\t{name}\t{}", e.domain, e.detail)?;
                    }
                    Output::Json => writeln!(
                        out,
                        "{}",
                        json!({
                            "domain": e.domain,
                            "uuid": uuid_string(&e.uuid),
                            "event": name,
                            "detail": e.detail,
                        })
                    )?,
                }
                out.flush()?;
            }
            LifecycleUpdate::Resubscribed { generation } => {
                eprintln!("reconnected (connection {generation}); events in the gap are lost");
            }
            other => eprintln!("{other:?}"),
        }
    }
    Ok(())
}

fn procedures(only: Option<Program>) -> Result<(), Box<dyn std::error::Error>> {
    let mut out = std::io::stdout().lock();
    for (name, table) in PROGRAMS {
        if only.is_some_and(|p| p.name() != *name) {
            continue;
        }
        for p in *table {
            let stream = match p.stream {
                Some((StreamDirection::Read, _)) => " stream:read",
                Some((StreamDirection::Write, _)) => " stream:write",
                None => "",
            };
            let ty = |t: Option<&str>| t.unwrap_or("-").to_string();
            let args = p
                .message
                .map_or_else(|| ty(p.args), |m| format!("{m} (event)"));
            writeln!(
                out,
                "{name}\t{}\t{}\t{args}\t{}{stream}",
                p.number,
                p.name,
                ty(p.ret)
            )?;
        }
    }
    Ok(())
}
