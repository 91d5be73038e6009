//! `banlieue libvirt …`: diagnostics over the client library.

use std::io::Write;

use banlieue_libvirt::proto::PROGRAMS;
use banlieue_libvirt::xdr::StreamDirection;
use clap::{Subcommand, ValueEnum};

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
    match cmd {
        Command::Procedures { program } => procedures(program),
    }
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
