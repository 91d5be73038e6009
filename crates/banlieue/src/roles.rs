//! The long-running roles (controller, Provider operator, a backend's provider) as tasks, so
//! the same wiring serves `banlieue controller`, `banlieue provider <backend> run` and `dev up`.

use banlieue_controller::{ControllerConfig, Metrics};
use banlieue_imagebuilder::reconcile::ReconcilerConfig;
use banlieue_operator::OperatorConfig;
use banlieue_provider_kit::descriptor::{Descriptor, Workload};
use kube::Client;
use prometheus_client::registry::Registry;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Which roles to run in this process.
#[derive(Clone, Debug, Default)]
pub struct Roles {
    /// VirtualMachine scheduling, pools and claims.
    pub controller: bool,
    /// The Provider operator: each Provider's workload (never its host).
    pub operator: bool,
    /// Watch only this namespace's Providers (the operator's; every namespace when `None`).
    pub operator_namespace: Option<String>,
    /// One Provider's workload, run by its backend.
    pub provider: Option<ProviderRole>,
    /// The controller's ReadinessSignalAbsent grace, instead of its default.
    pub readiness_signal_grace: Option<std::time::Duration>,
    /// The controller's lost-host grace, instead of its default.
    pub provider_lost_after: Option<std::time::Duration>,
    /// The image builder's reconciler: build Jobs for VMImages with Url sources.
    pub imagebuilder: Option<ReconcilerConfig>,
}

/// The workload of the Provider `name` in `namespace`, as `backend` runs it.
#[derive(Clone, Debug)]
pub struct ProviderRole {
    pub backend: Descriptor,
    pub name: String,
    pub namespace: String,
}

/// Spawns every selected role; each stops when `shutdown` is cancelled. A role that fails
/// logs its error and cancels `shutdown`, so the process never runs half of its roles.
pub fn spawn_all(
    kube: &Client,
    registry: &mut Registry,
    shutdown: &CancellationToken,
    roles: Roles,
) -> Result<Vec<JoinHandle<()>>, BoxError> {
    let mut tasks = Vec::new();
    if roles.controller {
        let metrics = Metrics::register(registry);
        let (kube, stop) = (kube.clone(), shutdown.clone());
        let mut config = ControllerConfig {
            machine_backends: crate::backends::machine_backends(),
            ..ControllerConfig::default()
        };
        if let Some(grace) = roles.readiness_signal_grace {
            config.readiness_signal_grace = grace;
        }
        if let Some(grace) = roles.provider_lost_after {
            config.provider_lost_after = grace;
        }
        tasks.push(supervise("controller", shutdown, async move {
            banlieue_controller::run(kube, config, metrics, stop.cancelled_owned())
                .await
                .map_err(BoxError::from)
        }));
    }
    if let Some(config) = roles.imagebuilder {
        let (kube, stop) = (kube.clone(), shutdown.clone());
        tasks.push(supervise("image builder", shutdown, async move {
            banlieue_imagebuilder::reconcile::run(kube, config, stop.cancelled_owned())
                .await
                .map_err(BoxError::from)
        }));
    }
    if roles.operator {
        let (kube, stop) = (kube.clone(), shutdown.clone());
        tasks.push(supervise("provider operator", shutdown, async move {
            banlieue_operator::run_operator(
                kube,
                OperatorConfig {
                    namespace: roles.operator_namespace,
                    backends: crate::backends::workloads(),
                    ..OperatorConfig::default()
                },
                stop.cancelled_owned(),
            )
            .await
            .map_err(BoxError::from)
        }));
    }
    if let Some(ProviderRole {
        backend,
        name,
        namespace,
    }) = roles.provider
    {
        let workload = Workload {
            client: kube.clone(),
            provider: name,
            namespace,
            registry,
            shutdown: shutdown.clone(),
        };
        for task in (backend.run)(workload) {
            tasks.push(supervise(task.name, shutdown, task.future));
        }
    }
    Ok(tasks)
}

/// How long a stopping role may take before the process leaves without it.
const STOP_DEADLINE: std::time::Duration = std::time::Duration::from_secs(20);

/// Waits for stopping roles, each at most [`STOP_DEADLINE`]: a role that never returns must not
/// keep the process from exiting on SIGTERM.
pub async fn join_all(tasks: Vec<JoinHandle<()>>) {
    for task in tasks {
        if tokio::time::timeout(STOP_DEADLINE, task).await.is_err() {
            tracing::warn!(deadline = ?STOP_DEADLINE, "a role did not stop in time; leaving it");
        }
    }
}

/// Runs one role as its own task and watches it: an error, a panic, or a return before
/// `shutdown` was asked for all cancel `shutdown`. A role that dies any of these ways must take
/// the process down with it (and out of `/readyz`), never leave it serving with a dead role.
fn supervise(
    role: &'static str,
    shutdown: &CancellationToken,
    task: impl Future<Output = Result<(), BoxError>> + Send + 'static,
) -> JoinHandle<()> {
    let shutdown = shutdown.clone();
    // Spawned apart from the watcher, so a panic unwinds only the role's task and reaches the
    // watcher as a JoinError.
    let role_task = tokio::spawn(task);
    tokio::spawn(async move {
        match role_task.await {
            Ok(Ok(())) if shutdown.is_cancelled() => tracing::info!(role, "stopped"),
            Ok(Ok(())) => {
                tracing::error!(role, "stopped unasked; stopping the process");
                shutdown.cancel();
            }
            Ok(Err(error)) => {
                tracing::error!(role, %error, "failed; stopping the process");
                shutdown.cancel();
            }
            Err(join_error) => {
                let panic = match join_error.try_into_panic() {
                    Ok(payload) => panic_text(payload.as_ref()),
                    Err(_) => "cancelled".to_owned(),
                };
                tracing::error!(role, panic, "panicked; stopping the process");
                shutdown.cancel();
            }
        }
    })
}

/// The text a panic was raised with, when it was a string (as `panic!` makes it).
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string panic".to_owned())
}

/// A token cancelled on Ctrl-C or SIGTERM; the handlers are installed when this returns.
pub fn stop_requested() -> CancellationToken {
    let token = CancellationToken::new();
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate());
    let cancel = token.clone();
    tokio::spawn(async move {
        match term {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
        tracing::info!("stop requested; shutting down");
        cancel.cancel();
    });
    token
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const DEADLINE: Duration = Duration::from_secs(30);

    async fn cancelled_before_deadline(shutdown: &CancellationToken) -> bool {
        tokio::time::timeout(DEADLINE, shutdown.cancelled())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn a_panicking_role_stops_the_process() {
        let shutdown = CancellationToken::new();
        let watcher = supervise("test role", &shutdown, async {
            panic!("index out of bounds in a reconcile");
        });
        assert!(
            cancelled_before_deadline(&shutdown).await,
            "a panicked role left the process running"
        );
        // The watcher itself ends cleanly, so join_all does not wait out its deadline.
        watcher
            .await
            .expect("the watcher survives the role's panic");
    }

    #[tokio::test]
    async fn a_failing_role_stops_the_process() {
        let shutdown = CancellationToken::new();
        let watcher = supervise("test role", &shutdown, async { Err("lost the API".into()) });
        assert!(cancelled_before_deadline(&shutdown).await);
        watcher.await.unwrap();
    }

    #[tokio::test]
    async fn a_role_that_returns_unasked_stops_the_process() {
        let shutdown = CancellationToken::new();
        let watcher = supervise("test role", &shutdown, async { Ok(()) });
        assert!(cancelled_before_deadline(&shutdown).await);
        watcher.await.unwrap();
    }

    #[tokio::test]
    async fn a_role_stopping_on_request_is_not_a_failure() {
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        let (stopped_tx, stopped_rx) = tokio::sync::oneshot::channel::<()>();
        let watcher = supervise("test role", &shutdown, async move {
            stop.cancelled().await;
            let _ = stopped_tx.send(());
            Ok(())
        });
        shutdown.cancel();
        watcher.await.unwrap();
        stopped_rx.await.expect("the role saw the stop");
    }
}
