//! Runs the controller against a kubeconfig, for tests that kill and restart it and for local
//! experiments:
//!
//! ```text
//! cargo run -p banlieue-controller --bin banlieue-controller-standalone -- KUBECONFIG [NAMESPACE]
//! ```
//!
//! `BANLIEUE_CRASH_AT=<point>` aborts it at that step of a bind or release (see
//! `banlieue_controller::crash`). SIGTERM or SIGINT stops it gracefully.

use std::path::PathBuf;
use std::time::Duration;

use banlieue_controller::{ControllerConfig, Metrics, run};
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::signal::unix::{SignalKind, signal};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,banlieue_controller=info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let mut args = std::env::args().skip(1);
    let kubeconfig = PathBuf::from(
        args.next()
            .ok_or("usage: controller KUBECONFIG [NAMESPACE]")?,
    );
    let namespace = args.next();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = kube::Config::from_custom_kubeconfig(
        Kubeconfig::read_from(&kubeconfig)?,
        &KubeConfigOptions::default(),
    )
    .await?;
    let client = kube::Client::try_from(config)?;
    let mut terminate = signal(SignalKind::terminate())?;
    let shutdown = async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    let config = ControllerConfig {
        namespace,
        readiness_signal_grace: Duration::from_secs(2),
        resync: Duration::from_secs(5),
        ..ControllerConfig::default()
    };
    run(client, config, Metrics::unregistered(), shutdown).await?;
    Ok(())
}
