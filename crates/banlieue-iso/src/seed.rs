//! The NoCloud seed: the small volume labelled `cidata` that cloud-init's NoCloud datasource
//! reads `meta-data`, `user-data` and optionally `network-config` and `vendor-data` from.

use std::fmt::Write as _;
use std::io::Cursor;

use bytes::Bytes;

use crate::{Error, Image, ImageOptions, Result, Timestamp, Tree, VolumeLabel};

/// A cloud-init NoCloud seed for one machine.
///
/// `meta-data` is generated from the instance id and hostname and is always present;
/// `user-data` is always present too (empty when none is set), because cloud-init ignores a
/// seed that lacks either. Payloads are carried byte for byte: a `#cloud-config`, a MIME
/// multipart, gzip, anything.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoCloudSeed {
    instance_id: String,
    local_hostname: String,
    user_data: Option<Bytes>,
    network_config: Option<Bytes>,
    vendor_data: Option<Bytes>,
    timestamp: Timestamp,
}

impl NoCloudSeed {
    /// A seed for the machine `local_hostname` whose cloud-init instance is `instance_id`
    /// (banlieue uses the libvirt domain's UUID, so that a rebuilt VM is a new instance).
    pub fn new(instance_id: impl Into<String>, local_hostname: impl Into<String>) -> Self {
        NoCloudSeed {
            instance_id: instance_id.into(),
            local_hostname: local_hostname.into(),
            user_data: None,
            network_config: None,
            vendor_data: None,
            timestamp: Timestamp::UNIX_EPOCH,
        }
    }

    /// Sets `user-data`, carried unchanged.
    pub fn with_user_data(mut self, user_data: impl Into<Bytes>) -> Self {
        self.user_data = Some(user_data.into());
        self
    }

    /// Sets `network-config`, carried unchanged.
    pub fn with_network_config(mut self, network_config: impl Into<Bytes>) -> Self {
        self.network_config = Some(network_config.into());
        self
    }

    /// Sets `vendor-data`, carried unchanged.
    pub fn with_vendor_data(mut self, vendor_data: impl Into<Bytes>) -> Self {
        self.vendor_data = Some(vendor_data.into());
        self
    }

    /// Sets the instant recorded in the image; the default, the Unix epoch, makes the image
    /// a pure function of its contents.
    pub fn with_timestamp(mut self, timestamp: Timestamp) -> Self {
        self.timestamp = timestamp;
        self
    }

    /// The generated `meta-data` document, each value quoted so YAML reads back the same
    /// string (see [`yaml_string`]).
    pub fn meta_data(&self) -> Result<String> {
        if self.instance_id.is_empty() {
            return Err(Error::EmptyMetaData {
                field: "instance-id",
            });
        }
        if self.local_hostname.is_empty() {
            return Err(Error::EmptyMetaData {
                field: "local-hostname",
            });
        }
        Ok(format!(
            "instance-id: {}\nlocal-hostname: {}\n",
            yaml_string(&self.instance_id),
            yaml_string(&self.local_hostname)
        ))
    }

    /// The seed's files, for callers that want to add more or write them elsewhere.
    pub fn tree(&self) -> Result<Tree<Cursor<Bytes>>> {
        let mut tree = Tree::new();
        tree.add_bytes("meta-data", self.meta_data()?)?;
        tree.add_bytes("user-data", self.user_data.clone().unwrap_or_default())?;
        if let Some(network_config) = &self.network_config {
            tree.add_bytes("network-config", network_config.clone())?;
        }
        if let Some(vendor_data) = &self.vendor_data {
            tree.add_bytes("vendor-data", vendor_data.clone())?;
        }
        Ok(tree)
    }

    /// The laid-out image, labelled `cidata`, ready to stream with `write_to` or
    /// `write_to_async`.
    pub fn image(&self) -> Result<Image<Cursor<Bytes>>> {
        let options = ImageOptions {
            volume_label: VolumeLabel::default(),
            timestamp: self.timestamp,
        };
        Image::plan(self.tree()?, &options)
    }

    /// The whole image in memory.
    pub fn to_bytes(&self) -> Result<Bytes> {
        self.image()?.to_bytes()
    }
}

/// Spells `value` as a YAML scalar that every YAML 1.1 or 1.2 parser reads back as exactly
/// the same string.
///
/// Hostnames and ids that start with a letter and use only `[A-Za-z0-9._-]` stay plain unless
/// they spell a YAML 1.1 boolean or null (`yes`, `off`, `null`, …); everything else is
/// double-quoted, escaping `"`, `\`, line breaks, control characters and the code points
/// PyYAML (cloud-init's parser) refuses to read raw.
pub fn yaml_string(value: &str) -> String {
    const RESOLVES_TO_NON_STRING: [&str; 9] =
        ["y", "n", "yes", "no", "true", "false", "on", "off", "null"];
    let plain = value.starts_with(|c: char| c.is_ascii_alphabetic())
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && !RESOLVES_TO_NON_STRING
            .iter()
            .any(|word| word.eq_ignore_ascii_case(value));
    if plain {
        return value.to_owned();
    }
    let mut quoted = String::with_capacity(value.len() + 2);
    quoted.push('"');
    for c in value.chars() {
        match c {
            '"' => quoted.push_str("\\\""),
            '\\' => quoted.push_str("\\\\"),
            '\n' => quoted.push_str("\\n"),
            '\t' => quoted.push_str("\\t"),
            '\r' => quoted.push_str("\\r"),
            // C0 and C1 controls, DEL, NEL, the Unicode line separators, the BOM and the
            // non-characters are either line breaks to YAML or unreadable to PyYAML.
            c if c.is_control()
                || matches!(
                    c,
                    '\u{2028}' | '\u{2029}' | '\u{FEFF}' | '\u{FFFE}' | '\u{FFFF}'
                ) =>
            {
                let _ = write!(quoted, "\\u{:04X}", u32::from(c));
            }
            c => quoted.push(c),
        }
    }
    quoted.push('"');
    quoted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_when_unambiguous() {
        assert_eq!(yaml_string("default-web-0"), "default-web-0");
        assert_eq!(
            yaml_string("f81d4fae-7dec-11d0-a765-00a0c91e6bf6"),
            "f81d4fae-7dec-11d0-a765-00a0c91e6bf6"
        );
        assert_eq!(yaml_string("host.example.org"), "host.example.org");
    }

    #[test]
    fn quoted_when_yaml_would_reinterpret() {
        assert_eq!(yaml_string("yes"), "\"yes\"");
        assert_eq!(yaml_string("Off"), "\"Off\"");
        assert_eq!(yaml_string("123"), "\"123\"");
        assert_eq!(yaml_string("0e1"), "\"0e1\"");
        assert_eq!(yaml_string("a: b"), "\"a: b\"");
        assert_eq!(yaml_string("*ref"), "\"*ref\"");
        assert_eq!(yaml_string("a\nb\"\\"), "\"a\\nb\\\"\\\\\"");
        assert_eq!(yaml_string("\u{85}\u{0}"), "\"\\u0085\\u0000\"");
        assert_eq!(yaml_string(""), "\"\"");
    }

    #[test]
    fn meta_data_document() {
        let seed = NoCloudSeed::new("f81d4fae-7dec-11d0-a765-00a0c91e6bf6", "default-web-0");
        assert_eq!(
            seed.meta_data().unwrap(),
            "instance-id: f81d4fae-7dec-11d0-a765-00a0c91e6bf6\nlocal-hostname: default-web-0\n"
        );
        assert!(matches!(
            NoCloudSeed::new("", "h").meta_data(),
            Err(Error::EmptyMetaData { .. })
        ));
    }
}
