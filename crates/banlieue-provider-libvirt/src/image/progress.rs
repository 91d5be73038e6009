//! Progress lines of an import: bytes, percent, MB/s and ETA (sans-io, so the arithmetic is
//! tested on its own; the importer logs one at a steady interval).

use std::time::Duration;

/// One progress report.
#[derive(Debug, Clone, PartialEq)]
pub struct Progress {
    /// Bytes of the source consumed (data sent plus holes skipped).
    pub done: u64,
    pub total: u64,
    pub percent: f64,
    /// Decimal megabytes per second since the start.
    pub mb_per_s: f64,
    /// Time left at the average rate so far; `None` before anything moved.
    pub eta: Option<Duration>,
}

impl Progress {
    pub fn at(done: u64, total: u64, elapsed: Duration) -> Self {
        let percent = if total == 0 {
            100.0
        } else {
            done as f64 * 100.0 / total as f64
        };
        let secs = elapsed.as_secs_f64();
        let rate = if secs > 0.0 { done as f64 / secs } else { 0.0 };
        let eta =
            (rate > 0.0).then(|| Duration::from_secs_f64(total.saturating_sub(done) as f64 / rate));
        Progress {
            done,
            total,
            percent,
            mb_per_s: rate / 1e6,
            eta,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_percent_and_eta() {
        let p = Progress::at(250_000_000, 1_000_000_000, Duration::from_secs(2));
        assert_eq!(p.percent, 25.0);
        assert_eq!(p.mb_per_s, 125.0);
        assert_eq!(p.eta, Some(Duration::from_secs(6)));
        assert_eq!(Progress::at(0, 10, Duration::ZERO).eta, None);
        assert_eq!(Progress::at(0, 0, Duration::ZERO).percent, 100.0);
    }
}
