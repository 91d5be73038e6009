//! How a complete imported volume is told from a half-written one (ADR-0060).
//!
//! libvirt has no volume rename and no per-volume metadata, so completeness is recorded beside
//! the volume: after the server has confirmed the end of the upload stream and the volume's
//! capacity has been checked, the importer creates `<volume>.complete`, a tiny volume holding
//! this record (size and SHA-256 of what was sent). A volume without a valid record is never
//! complete, whatever its size.

use serde::{Deserialize, Serialize};

/// Suffix of the completion record's volume.
pub const MARKER_SUFFIX: &str = ".complete";

/// The completion record's volume for `volume`.
pub fn marker_volume_name(volume: &str) -> String {
    format!("{volume}{MARKER_SUFFIX}")
}

/// The largest completion record read back; anything longer is not one of ours.
pub const MAX_MARKER_BYTES: u64 = 4096;

/// What the completion record holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Marker {
    /// The volume this record vouches for.
    pub volume: String,
    /// Bytes uploaded (the source's length and the volume's capacity).
    pub size_bytes: u64,
    /// SHA-256 of the uploaded bytes, hex.
    pub sha256: String,
}

impl Marker {
    pub fn to_bytes(&self) -> Vec<u8> {
        // A struct of strings and an integer always serializes.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// What the pool holds for a volume, as far as an import is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Completeness {
    /// Neither the volume nor its record: import from scratch.
    Absent,
    /// A complete volume: leave it alone.
    Complete(Marker),
    /// Something is there but not vouched for (killed import, stale record, other size):
    /// delete what exists and import again. The text says what was found.
    Incomplete(String),
    /// A complete volume whose record does not describe the source being imported: never
    /// deleted, since overlays may back onto it; the import refuses. The text says why.
    Conflict(String),
}

/// Judges what an earlier import left. `volume_capacity` is `None` when the volume does not
/// exist; `marker` is `None` when the record does not, otherwise its bytes.
pub fn completeness(
    volume: &str,
    volume_capacity: Option<u64>,
    marker: Option<&[u8]>,
    source_size: u64,
) -> Completeness {
    match (volume_capacity, marker) {
        (None, None) => Completeness::Absent,
        (None, Some(_)) => {
            Completeness::Incomplete(format!("a completion record without volume {volume}"))
        }
        (Some(_), None) => Completeness::Incomplete(format!(
            "volume {volume} has no completion record: an earlier import did not finish"
        )),
        (Some(capacity), Some(bytes)) => {
            let Ok(m) = serde_json::from_slice::<Marker>(trim_padding(bytes)) else {
                return Completeness::Incomplete(format!(
                    "the completion record of {volume} is unreadable"
                ));
            };
            if m.volume != volume {
                Completeness::Incomplete(format!(
                    "the completion record of {volume} names {}",
                    m.volume
                ))
            } else if m.size_bytes != capacity {
                Completeness::Incomplete(format!(
                    "volume {volume} holds {capacity} bytes but its record says {}",
                    m.size_bytes
                ))
            } else if m.size_bytes != source_size {
                Completeness::Conflict(format!(
                    "volume {volume} is complete with {} bytes but the source has {source_size}",
                    m.size_bytes
                ))
            } else {
                Completeness::Complete(m)
            }
        }
    }
}

/// Whether a complete volume holds the source's bytes: its record's SHA-256 against the
/// source's. `Err` says how they differ.
pub fn same_content(marker: &Marker, source_sha256: &str) -> Result<(), String> {
    if marker.sha256.eq_ignore_ascii_case(source_sha256) {
        Ok(())
    } else {
        Err(format!(
            "volume {} is complete with SHA-256 {} but the source's is {source_sha256}",
            marker.volume, marker.sha256
        ))
    }
}

/// Pools may round a volume up; the record is the bytes before the first NUL.
fn trim_padding(bytes: &[u8]) -> &[u8] {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    &bytes[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(volume: &str, size: u64) -> Vec<u8> {
        Marker {
            volume: volume.into(),
            size_bytes: size,
            sha256: "ab".into(),
        }
        .to_bytes()
    }

    #[test]
    fn only_a_matching_record_makes_a_volume_complete() {
        assert_eq!(completeness("v", None, None, 10), Completeness::Absent);
        assert!(matches!(
            completeness("v", Some(10), None, 10),
            Completeness::Incomplete(_)
        ));
        assert!(matches!(
            completeness("v", None, Some(&record("v", 10)), 10),
            Completeness::Incomplete(_)
        ));
        assert!(matches!(
            completeness("v", Some(10), Some(b"{\"volu"), 10),
            Completeness::Incomplete(_)
        ));
        assert!(matches!(
            completeness("v", Some(10), Some(&record("w", 10)), 10),
            Completeness::Incomplete(_)
        ));
        // A complete volume of another source is not redone: overlays may back onto it.
        assert!(matches!(
            completeness("v", Some(10), Some(&record("v", 10)), 11),
            Completeness::Conflict(_)
        ));
        let m = Marker {
            volume: "v".into(),
            size_bytes: 10,
            sha256: "AB".into(),
        };
        assert!(same_content(&m, "ab").is_ok());
        assert!(same_content(&m, "cd").unwrap_err().contains("SHA-256 AB"));
        assert!(matches!(
            completeness("v", Some(12), Some(&record("v", 10)), 10),
            Completeness::Incomplete(_)
        ));
        let mut padded = record("v", 10);
        padded.resize(512, 0);
        assert!(matches!(
            completeness("v", Some(10), Some(&padded), 10),
            Completeness::Complete(m) if m.size_bytes == 10
        ));
    }

    #[test]
    fn marker_name_is_beside_the_volume() {
        assert_eq!(marker_volume_name("a-r1.raw"), "a-r1.raw.complete");
    }
}
