//! `banlieue-dev up` / `banlieue-dev down`: the embedded local default (see the library's
//! documentation). A binary of its own so that the product binary, and the image built from
//! it, never link the test harness that runs the local peers.

use std::process::ExitCode;

use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    name = "banlieue-dev",
    version,
    about = "banlieue's embedded local default"
)]
struct Cli {
    #[command(flatten)]
    log: banlieue::observe::LogArgs,
    #[command(subcommand)]
    command: banlieue_dev::DevCommand,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    banlieue::observe::init_tracing(cli.log.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(banlieue_dev::run(cli.command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
                "error: {}",
                banlieue_api::conditions::error_message(e.as_ref())
            );
            ExitCode::FAILURE
        }
    }
}
