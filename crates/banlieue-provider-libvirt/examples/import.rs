//! Runs the import exactly as the Job's `banlieue provider libvirt import` does, against the
//! cluster of a kubeconfig file. Tests run it as a child process (to kill it mid-upload and to
//! read its `/proc/<pid>/cmdline` and `environ`); the import benchmark times it.
//!
//! ```text
//! cargo run --release -p banlieue-provider-libvirt --example import -- \
//!     --kubeconfig KUBECONFIG --vmimage IMG --provider P --provider-namespace NS \
//!     --pool POOL --source PATH
//! ```

use std::path::PathBuf;

use anyhow::{Context, bail};
use banlieue_provider_libvirt::image::{ImportArgs, ImportOutcome, run_import};
use kube::config::{KubeConfigOptions, Kubeconfig};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    let mut flags = std::collections::BTreeMap::new();
    let mut argv = std::env::args().skip(1);
    while let Some(flag) = argv.next() {
        let Some(name) = flag.strip_prefix("--") else {
            bail!("unexpected argument {flag:?}");
        };
        let value = argv
            .next()
            .with_context(|| format!("--{name} needs a value"))?;
        flags.insert(name.to_owned(), value);
    }
    let mut take = |name: &str| {
        flags
            .remove(name)
            .with_context(|| format!("missing --{name}"))
    };
    let kubeconfig = Kubeconfig::read_from(take("kubeconfig")?)?;
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    let client = kube::Client::try_from(config)?;
    let mut args = ImportArgs::new(
        take("vmimage")?,
        take("provider")?,
        take("provider-namespace")?,
        take("pool")?,
        PathBuf::from(take("source")?),
    );
    if let Ok(root) = take("artifacts-root") {
        args.artifacts_root = PathBuf::from(root);
    }
    match run_import(client, args).await? {
        ImportOutcome::AlreadyComplete { volume, .. } => {
            println!("already-complete {volume}");
        }
        ImportOutcome::Imported {
            volume, elapsed, ..
        } => println!("imported {volume} {:.3}", elapsed.as_secs_f64()),
    }
    Ok(())
}
