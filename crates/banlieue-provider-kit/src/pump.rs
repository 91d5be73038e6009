//! The wake-up pump: follows a backend's change feed (libvirt's domain events, vSphere's
//! property wait) and turns its changes into wake-ups of the machine reconcile. When the feed
//! fails or ends, the pump subscribes again after a [`Backoff`] that grows while subscribing
//! keeps failing and starts over once a subscription worked.
//!
//! What a change is, and what a failure says of the backend's connection, is the backend's:
//! it follows the feed through a [`Feed`] handle; the pump owns the retrying.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use banlieue_api::conditions::error_message;
use tokio::sync::mpsc;

use crate::backoff::Backoff;

/// A backend's handle on one subscription to its change feed.
#[derive(Clone, Debug)]
pub struct Feed {
    wake: mpsc::Sender<()>,
    subscribed: Arc<AtomicBool>,
}

impl Feed {
    /// Says the subscription is in place, so the next failure waits the shortest delay again.
    pub fn subscribed(&self) {
        self.subscribed.store(true, Ordering::SeqCst);
    }

    /// Queues one wake-up unless one is already waiting: a burst of changes (a start emits
    /// several) collapses into one pass of the reconcile.
    pub fn wake(&self) {
        // A full queue already holds a wake-up, which covers this change too; a closed one
        // ends the pump.
        let _ = self.wake.try_send(());
    }
}

/// Follows the change feed named `feed` (in logs) until the receiver of `wake` is dropped.
/// Each round calls `follow`, which subscribes, calls [`Feed::subscribed`] once the
/// subscription is in place and [`Feed::wake`] for each change, and returns when the feed ended
/// (`Ok`) or failed. The next round starts after the backoff of provider errors
/// ([`crate::MIN_ERROR_BACKOFF`] doubling to [`crate::MAX_ERROR_BACKOFF`]), reset by every
/// round whose subscription worked: a feed that keeps failing is not hammered, and one that
/// breaks now and then is back within the shortest delay.
pub async fn run<F, Fut, E>(feed: &str, wake: mpsc::Sender<()>, mut follow: F)
where
    F: FnMut(Feed) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: std::error::Error + 'static,
{
    let mut backoff = Backoff::for_errors();
    loop {
        let round = Feed {
            wake: wake.clone(),
            subscribed: Arc::default(),
        };
        let outcome = tokio::select! {
            outcome = follow(round.clone()) => outcome,
            () = wake.closed() => return,
        };
        let subscribed = round.subscribed.load(Ordering::SeqCst);
        if subscribed {
            backoff.succeeded();
        }
        let retry_in = backoff.failed();
        match outcome {
            Ok(()) => tracing::debug!(feed, ?retry_in, "change feed ended; subscribing again"),
            Err(e) if subscribed => {
                tracing::warn!(feed, error = %error_message(&e), ?retry_in, "change feed failed; subscribing again")
            }
            Err(e) => {
                tracing::debug!(feed, error = %error_message(&e), ?retry_in, "change feed unavailable")
            }
        }
        tokio::select! {
            () = tokio::time::sleep(retry_in) => {}
            () = wake.closed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("feed refused")]
    struct Refused;

    /// Runs the pump over a feed whose rounds do what `rounds` says (`true`: subscribe, send one
    /// change and fail; `false`: fail to subscribe) and returns when each round started, relative
    /// to the first, and the wake-ups received.
    async fn rounds_started(rounds: &[bool]) -> (Vec<Duration>, usize) {
        let (wake, mut woken) = mpsc::channel(1);
        let (started_tx, mut started) = mpsc::unbounded_channel();
        let plan = rounds.to_vec();
        let mut round = 0;
        let pump = tokio::spawn(run("test", wake, move |feed: Feed| {
            let works = plan.get(round).copied().unwrap_or(false);
            round += 1;
            let _ = started_tx.send(Instant::now());
            async move {
                if works {
                    feed.subscribed();
                    feed.wake();
                }
                Err::<(), _>(Refused)
            }
        }));
        let mut instants = Vec::new();
        let mut wakes = 0;
        while instants.len() < rounds.len() {
            tokio::select! {
                at = started.recv() => instants.push(at.unwrap()),
                Some(()) = woken.recv() => wakes += 1,
            }
        }
        while woken.try_recv().is_ok() {
            wakes += 1;
        }
        drop(woken);
        pump.await.unwrap();
        let first = instants[0];
        (instants.into_iter().map(|at| at - first).collect(), wakes)
    }

    fn secs(gaps: &[u64]) -> Vec<Duration> {
        let mut at = 0;
        let mut instants = vec![Duration::ZERO];
        for gap in gaps {
            at += gap;
            instants.push(Duration::from_secs(at));
        }
        instants
    }

    #[tokio::test(start_paused = true)]
    async fn failures_to_subscribe_wait_longer_each_time_up_to_the_maximum() {
        let (started, _) = rounds_started(&[false; 7]).await;
        assert_eq!(started, secs(&[5, 10, 20, 40, 60, 60]));
    }

    #[tokio::test(start_paused = true)]
    async fn a_subscription_that_worked_starts_the_backoff_over() {
        let (started, wakes) = rounds_started(&[false, false, false, true, false, false]).await;
        // 5, 10, 20 while failing; the working round waits the shortest delay, and the next
        // failures grow from there.
        assert_eq!(started, secs(&[5, 10, 20, 5, 10]));
        assert_eq!(wakes, 1, "the working round's change");
    }

    #[tokio::test(start_paused = true)]
    async fn the_pump_ends_when_nobody_listens_even_while_following() {
        let (wake, woken) = mpsc::channel(1);
        let pump = tokio::spawn(run("test", wake, |feed: Feed| async move {
            feed.subscribed();
            std::future::pending::<Result<(), Refused>>().await
        }));
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(woken);
        pump.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_of_changes_leaves_one_wake_up() {
        let (wake, mut woken) = mpsc::channel(1);
        let feed = Feed {
            wake,
            subscribed: Arc::default(),
        };
        for _ in 0..5 {
            feed.wake();
        }
        assert_eq!(woken.try_recv(), Ok(()));
        assert!(woken.try_recv().is_err());
    }
}
