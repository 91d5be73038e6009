//! The banlieue binary.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cidata;
mod libvirt;

/// banlieue: single-use VM sandboxes on Kubernetes, on libvirt/KVM hosts.
#[derive(Debug, Parser)]
#[command(name = "banlieue", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Inspect the libvirt protocol and hosts through banlieue's own client.
    #[command(subcommand)]
    Libvirt(libvirt::Command),
    /// Build a cloud-init NoCloud seed ISO (label `cidata`) in process.
    Cidata(cidata::CidataArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Libvirt(cmd) => libvirt::run(cmd),
        Command::Cidata(args) => return cidata::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
