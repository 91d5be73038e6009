//! The banlieue binary: one executable for every role, chosen by subcommand.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use banlieue::{bootstrap, cidata, libvirt, observe};

/// banlieue: single-use VM sandboxes on Kubernetes, on libvirt/KVM hosts.
#[derive(Debug, Parser)]
#[command(name = "banlieue", version, about, propagate_version = true)]
struct Cli {
    #[command(flatten)]
    log: observe::LogArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Inspect libvirt hosts and the libvirt protocol through banlieue's own client.
    #[command(subcommand)]
    Libvirt(libvirt::Command),
    /// Build a cloud-init NoCloud seed ISO (label `cidata`) in process.
    Cidata(cidata::CidataArgs),
    /// Apply the namespace, CRDs, RBAC and controller Deployment to the current kubeconfig.
    ///
    /// Server-side apply, idempotent; prints what changed. Does not apply deploy/admission/:
    /// that is a separate, mandatory step.
    Bootstrap,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Runs `future` on a multi-threaded runtime; the short-lived subcommands stay synchronous.
fn block_on<F>(future: F) -> Result<(), BoxError>
where
    F: std::future::Future<Output = Result<(), BoxError>>,
{
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(future)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    observe::init_tracing(cli.log.log_format);
    let result = match cli.command {
        Command::Libvirt(cmd) => libvirt::run(cmd).map_err(|e| e.to_string().into()),
        Command::Cidata(args) => return cidata::run(&args),
        Command::Bootstrap => block_on(async {
            let client = kube::Client::try_default().await?;
            bootstrap::run(client).await?;
            Ok(())
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
