use std::fmt;

use crate::{Error, Result};

/// The longest label: the Joliet descriptor holds 16 UCS-2 units, and the label is written to
/// both descriptors so that every reader sees the same one.
pub const MAX_VOLUME_LABEL_LEN: usize = 16;

/// A volume label (volume identifier), written to the primary and the Joliet descriptor.
///
/// Letters, digits, `_`, `-` and `.`, at most [`MAX_VOLUME_LABEL_LEN`] of them. Case is kept
/// as given, as genisoimage does: cloud-init's NoCloud source looks for `cidata` or `CIDATA`,
/// and `blkid` reports the label verbatim.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct VolumeLabel(String);

impl VolumeLabel {
    /// The label cloud-init's NoCloud datasource looks for.
    pub const CIDATA: &'static str = "cidata";

    /// Validates `label`.
    pub fn new(label: &str) -> Result<Self> {
        let refuse = |reason| {
            Err(Error::InvalidVolumeLabel {
                label: label.to_owned(),
                reason,
            })
        };
        if label.is_empty() {
            return refuse("it is empty");
        }
        if label.len() > MAX_VOLUME_LABEL_LEN {
            return refuse("it is longer than 16 characters");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
        {
            return refuse("only ASCII letters, digits, '_', '-' and '.' are allowed");
        }
        Ok(VolumeLabel(label.to_owned()))
    }

    /// The label as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for VolumeLabel {
    /// `cidata`.
    fn default() -> Self {
        VolumeLabel(Self::CIDATA.to_owned())
    }
}

impl fmt::Display for VolumeLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation() {
        assert_eq!(VolumeLabel::new("cidata").unwrap().as_str(), "cidata");
        assert_eq!(
            VolumeLabel::new("CIDATA-2.x").unwrap().as_str(),
            "CIDATA-2.x"
        );
        assert_eq!(VolumeLabel::default().as_str(), "cidata");
        for bad in ["", "a b", "seventeen-chars-x", "é"] {
            assert!(VolumeLabel::new(bad).is_err(), "{bad:?}");
        }
    }
}
