//! Routine Events coalesced per object and reason (pure): the first of a kind is published at
//! once, the ones that follow within a window are counted, and one summary Event closes the
//! window. A pool refilled behind every claim would otherwise cost the API server one Event
//! write per member; kube's own Recorder aggregates repeats into a series but still writes
//! (a PATCH) for each of them.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long repeats of one routine Event are held back and counted.
pub(crate) const EVENT_WINDOW: Duration = Duration::from_secs(30);

/// What to do with an Event offered to the window.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Offer {
    /// Publish it now: nothing of its kind was published within the window.
    Publish,
    /// Counted; the first repeat of a window also asks for a flush when the window closes.
    Held { flush_at: Option<Instant> },
}

/// The summary of a closed window's repeats.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Summary {
    pub repeats: u32,
    pub last_note: String,
}

#[derive(Debug)]
struct Window {
    opened: Instant,
    repeats: u32,
    last_note: String,
}

/// Open windows, keyed by the object and reason the Events are about.
#[derive(Debug, Default)]
pub(crate) struct EventWindows {
    windows: HashMap<String, Window>,
}

impl EventWindows {
    /// Offers an Event with `note` for `key` at `now`.
    pub fn offer(&mut self, key: &str, note: &str, now: Instant) -> Offer {
        // A window nothing repeated in is forgotten once over, so the map holds only the
        // objects with recent Events.
        self.windows.retain(|_, window| {
            window.repeats > 0 || now.saturating_duration_since(window.opened) < EVENT_WINDOW
        });
        match self.windows.get_mut(key) {
            Some(window) if now.saturating_duration_since(window.opened) < EVENT_WINDOW => {
                window.repeats += 1;
                window.last_note = note.to_owned();
                Offer::Held {
                    flush_at: (window.repeats == 1).then_some(window.opened + EVENT_WINDOW),
                }
            }
            _ => {
                self.windows.insert(
                    key.to_owned(),
                    Window {
                        opened: now,
                        repeats: 0,
                        last_note: String::new(),
                    },
                );
                Offer::Publish
            }
        }
    }

    /// Closes `key`'s window: the repeats it held back, if any. The next Event of the kind is
    /// published at once again.
    pub fn close(&mut self, key: &str) -> Option<Summary> {
        let window = self.windows.remove(key)?;
        (window.repeats > 0).then_some(Summary {
            repeats: window.repeats,
            last_note: window.last_note,
        })
    }
}

impl Summary {
    /// The note of the summary Event.
    pub fn note(&self) -> String {
        format!(
            "{} more in {} s; the last: {}",
            self.repeats,
            EVENT_WINDOW.as_secs(),
            self.last_note
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_event_is_published_and_repeats_are_summarised_once() {
        let mut windows = EventWindows::default();
        let t0 = Instant::now();
        assert_eq!(windows.offer("pool/a", "created a-1", t0), Offer::Publish);
        assert_eq!(
            windows.offer("pool/a", "created a-2", t0 + Duration::from_secs(1)),
            Offer::Held {
                flush_at: Some(t0 + EVENT_WINDOW)
            }
        );
        assert_eq!(
            windows.offer("pool/a", "created a-3", t0 + Duration::from_secs(2)),
            Offer::Held { flush_at: None }
        );
        // Another object's Events have their own window.
        assert_eq!(windows.offer("pool/b", "created b-1", t0), Offer::Publish);
        let summary = windows.close("pool/a").expect("two repeats");
        assert_eq!(summary.repeats, 2);
        assert_eq!(summary.note(), "2 more in 30 s; the last: created a-3");
        assert_eq!(
            windows.offer("pool/a", "created a-4", t0 + Duration::from_secs(3)),
            Offer::Publish
        );
    }

    #[test]
    fn a_window_without_repeats_closes_silently_and_an_old_one_reopens() {
        let mut windows = EventWindows::default();
        let t0 = Instant::now();
        assert_eq!(windows.offer("k", "one", t0), Offer::Publish);
        assert_eq!(windows.close("k"), None);
        assert_eq!(windows.offer("k", "two", t0), Offer::Publish);
        assert_eq!(
            windows.offer("k", "three", t0 + EVENT_WINDOW),
            Offer::Publish
        );
        assert_eq!(windows.windows.len(), 1);
        windows.offer("other", "x", t0 + EVENT_WINDOW * 2);
        assert_eq!(
            windows.windows.len(),
            1,
            "the idle window of k was forgotten"
        );
        assert_eq!(windows.close("unknown"), None);
    }
}
