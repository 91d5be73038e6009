//! Waiting in tests for something a real peer does in its own time: one poll loop with a
//! deadline, whose error says what was awaited and the probe's last error.

use std::fmt::{self, Display};
use std::future::Future;
use std::time::{Duration, Instant};

/// A wait that ran out: what was awaited, for how long, and the probe's last error if the
/// probe failed rather than said "not yet".
#[derive(Debug)]
pub struct PollTimeout {
    pub what: String,
    pub after: Duration,
    pub last_error: Option<String>,
}

impl Display for PollTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: not within {:?}", self.what, self.after)?;
        match &self.last_error {
            Some(error) => write!(f, "; last error: {error}"),
            None => Ok(()),
        }
    }
}

impl std::error::Error for PollTimeout {}

/// How often [`until`] asks: a test waits at most this long past the change it waits for.
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(200);

/// What a probe may fail with: any error, so a probe uses `?` on whatever it calls (a kube
/// call, an anyhow context) without naming a type.
pub type ProbeError = Box<dyn std::error::Error + Send + Sync>;

/// Calls `probe` every [`DEFAULT_INTERVAL`] until it yields a value; see [`until_every`].
pub async fn until<T, F, Fut>(what: &str, deadline: Duration, probe: F) -> Result<T, PollTimeout>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>, ProbeError>>,
{
    until_every(what, deadline, DEFAULT_INTERVAL, probe).await
}

/// Calls `probe` every `interval` until it yields a value. Errors end the wait only at the
/// deadline (a peer coming up answers with errors for a while), reported with the last one.
pub async fn until_every<T, F, Fut>(
    what: &str,
    deadline: Duration,
    interval: Duration,
    mut probe: F,
) -> Result<T, PollTimeout>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>, ProbeError>>,
{
    let started = Instant::now();
    loop {
        let last = probe().await;
        match last {
            Ok(Some(value)) => return Ok(value),
            _ if started.elapsed() < deadline => tokio::time::sleep(interval).await,
            Ok(None) => {
                return Err(PollTimeout {
                    what: what.to_owned(),
                    after: deadline,
                    last_error: None,
                });
            }
            Err(error) => {
                return Err(PollTimeout {
                    what: what.to_owned(),
                    after: deadline,
                    // The alternate form: an error chain (anyhow's) shows its causes too.
                    last_error: Some(format!("{error:#}")),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn yields_the_value_or_says_what_it_waited_for() {
        let mut calls = 0;
        let value = until_every(
            "three calls",
            Duration::from_secs(5),
            Duration::from_millis(1),
            || {
                calls += 1;
                let n = calls;
                async move { Ok((n == 3).then_some(n)) }
            },
        )
        .await
        .unwrap();
        assert_eq!(value, 3);

        let timeout = until_every(
            "nothing",
            Duration::from_millis(20),
            Duration::from_millis(1),
            || async { Err::<Option<()>, _>("refused".into()) },
        )
        .await
        .unwrap_err();
        assert_eq!(
            timeout.to_string(),
            "nothing: not within 20ms; last error: refused"
        );
    }
}
