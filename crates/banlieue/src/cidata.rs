//! `banlieue cidata`: builds a cloud-init NoCloud seed image from files, in process.
//!
//! Exit codes: 0 the image was written; 1 an input was unreadable or unrepresentable, or the
//! output could not be written (a message on stderr, no partial output left behind); 2 a usage
//! error, reported by clap.

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use banlieue_iso::{MAX_IN_MEMORY_IMAGE, NoCloudSeed, Timestamp};

/// Build a NoCloud seed (an ISO 9660 + Joliet image labelled `cidata`) for one machine.
#[derive(clap::Args, Debug)]
pub struct CidataArgs {
    /// cloud-init user-data, carried byte for byte (#cloud-config, MIME multipart, gzip, ...).
    #[arg(long, value_name = "FILE")]
    pub user_data: PathBuf,
    /// Optional network-config (version 1 or 2), carried byte for byte.
    #[arg(long, value_name = "FILE")]
    pub network_config: Option<PathBuf>,
    /// Optional vendor-data, carried byte for byte.
    #[arg(long, value_name = "FILE")]
    pub vendor_data: Option<PathBuf>,
    /// meta-data instance-id; banlieue uses the libvirt domain's UUID.
    #[arg(long, value_name = "ID")]
    pub instance_id: String,
    /// meta-data local-hostname; banlieue uses the domain name.
    #[arg(long, value_name = "NAME")]
    pub hostname: String,
    /// Where to write the image; replaced atomically.
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: PathBuf,
    /// Seconds since the Unix epoch to record in the image (default: now). The same inputs
    /// and timestamp always give the same bytes.
    #[arg(long, env = "SOURCE_DATE_EPOCH", value_name = "SECONDS")]
    pub timestamp: Option<i64>,
}

/// Runs `banlieue cidata`; on success prints one line describing the image to stdout.
pub fn run(args: &CidataArgs) -> ExitCode {
    match build(args) {
        Ok(summary) => {
            println!("{summary}");
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("banlieue cidata: {message}");
            ExitCode::FAILURE
        }
    }
}

fn build(args: &CidataArgs) -> Result<String, String> {
    let timestamp = match args.timestamp {
        Some(seconds) => Timestamp::from_unix_seconds(seconds).map_err(|e| chain(&e))?,
        None => Timestamp::now(),
    };
    let mut files = vec!["meta-data", "user-data"];
    let mut seed = NoCloudSeed::new(args.instance_id.clone(), args.hostname.clone())
        .with_timestamp(timestamp)
        .with_user_data(read_input(&args.user_data)?);
    if let Some(path) = &args.network_config {
        seed = seed.with_network_config(read_input(path)?);
        files.push("network-config");
    }
    if let Some(path) = &args.vendor_data {
        seed = seed.with_vendor_data(read_input(path)?);
        files.push("vendor-data");
    }
    let image = seed.to_bytes().map_err(|e| chain(&e))?;
    write_atomically(&args.output, &image)
        .map_err(|e| format!("write {}: {e}", args.output.display()))?;
    Ok(format!(
        "wrote {}: {} bytes, label cidata, files {}",
        args.output.display(),
        image.len(),
        files.join(" ")
    ))
}

/// Reads an input file, refusing one too large to be part of an in-memory seed before
/// reading it.
fn read_input(path: &Path) -> Result<Vec<u8>, String> {
    let fail = |e: std::io::Error| format!("read {}: {e}", path.display());
    let size = fs::metadata(path).map_err(fail)?.len();
    if size > MAX_IN_MEMORY_IMAGE {
        return Err(format!(
            "read {}: {size} bytes is more than a seed may hold ({MAX_IN_MEMORY_IMAGE})",
            path.display()
        ));
    }
    fs::read(path).map_err(fail)
}

/// Writes to a temporary file beside `path` and renames it over `path`, so a failure never
/// leaves a truncated seed where a good one was expected.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temporary = path.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
    let written = (|| {
        let mut file = fs::File::create(&temporary)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        fs::rename(&temporary, path)
    })();
    if written.is_err() {
        let _ = fs::remove_file(&temporary);
    }
    written
}

/// An error and its sources on one line.
fn chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}
