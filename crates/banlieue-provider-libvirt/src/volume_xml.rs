//! Storage volume XML for a machine's own volumes, written with quick-xml's escaping writer.

use quick_xml::Writer;
use quick_xml::events::BytesText;

/// How the backing image of an overlay is to be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackingFormat {
    Qcow2,
    Raw,
}

impl BackingFormat {
    /// From the backing volume's *name*: `.qcow2`/`.qcow` → qcow2, anything else raw. Never
    /// probed from the contents: a raw image whose first bytes look like a qcow2 header would
    /// otherwise be read as one, and name any file the daemon can read as its backing file.
    pub fn from_volume_name(name: &str) -> BackingFormat {
        let lower = name.to_ascii_lowercase();
        if lower.ends_with(".qcow2") || lower.ends_with(".qcow") {
            BackingFormat::Qcow2
        } else {
            BackingFormat::Raw
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            BackingFormat::Qcow2 => "qcow2",
            BackingFormat::Raw => "raw",
        }
    }
}

/// The backing file of an overlay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Backing {
    /// The backing volume's path on the host (from STORAGE_VOL_GET_PATH).
    pub path: String,
    pub format: BackingFormat,
}

/// A qcow2 volume of `capacity` bytes, empty or over `backing`.
pub fn qcow2(name: &str, capacity: u64, backing: Option<&Backing>) -> String {
    let mut w = Writer::new_with_indent(Vec::new(), b' ', 2);
    let written: std::io::Result<()> = (|| {
        w.create_element("volume").write_inner_content(|w| {
            w.create_element("name")
                .write_text_content(BytesText::new(name))?;
            w.create_element("capacity")
                .with_attribute(("unit", "bytes"))
                .write_text_content(BytesText::new(&capacity.to_string()))?;
            w.create_element("target").write_inner_content(|w| {
                w.create_element("format")
                    .with_attribute(("type", "qcow2"))
                    .write_empty()?;
                Ok(())
            })?;
            if let Some(b) = backing {
                w.create_element("backingStore").write_inner_content(|w| {
                    w.create_element("path")
                        .write_text_content(BytesText::new(&b.path))?;
                    w.create_element("format")
                        .with_attribute(("type", b.format.as_str()))
                        .write_empty()?;
                    Ok(())
                })?;
            }
            Ok(())
        })?;
        Ok(())
    })();
    debug_assert!(written.is_ok());
    String::from_utf8(w.into_inner()).unwrap_or_default()
}

/// A sparse raw volume of `capacity` bytes (a seed ISO or an image, filled by an upload).
/// Nothing is allocated up front: the upload writes what it has and a hole stays a hole.
pub fn raw(name: &str, capacity: u64) -> String {
    let mut w = Writer::new_with_indent(Vec::new(), b' ', 2);
    let written: std::io::Result<()> = (|| {
        w.create_element("volume").write_inner_content(|w| {
            w.create_element("name")
                .write_text_content(BytesText::new(name))?;
            w.create_element("capacity")
                .with_attribute(("unit", "bytes"))
                .write_text_content(BytesText::new(&capacity.to_string()))?;
            w.create_element("allocation")
                .with_attribute(("unit", "bytes"))
                .write_text_content(BytesText::new("0"))?;
            w.create_element("target").write_inner_content(|w| {
                w.create_element("format")
                    .with_attribute(("type", "raw"))
                    .write_empty()?;
                Ok(())
            })?;
            Ok(())
        })?;
        Ok(())
    })();
    debug_assert!(written.is_ok());
    String::from_utf8(w.into_inner()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backing_format_comes_from_the_name_only() {
        assert_eq!(
            BackingFormat::from_volume_name("a.qcow2"),
            BackingFormat::Qcow2
        );
        assert_eq!(
            BackingFormat::from_volume_name("a.QCOW"),
            BackingFormat::Qcow2
        );
        assert_eq!(BackingFormat::from_volume_name("a.raw"), BackingFormat::Raw);
        assert_eq!(BackingFormat::from_volume_name("a.img"), BackingFormat::Raw);
        assert_eq!(BackingFormat::from_volume_name("qcow2"), BackingFormat::Raw);
    }

    #[test]
    fn overlay_names_its_backing_format() {
        let xml = qcow2(
            "ns-web-os.qcow2",
            10 << 30,
            Some(&Backing {
                path: "/pool/base.raw".into(),
                format: BackingFormat::Raw,
            }),
        );
        insta::assert_snapshot!(xml);
    }

    #[test]
    fn seed_volume_is_raw_and_sparse() {
        insta::assert_snapshot!(raw("ns-web-cidata.iso", 374_784));
    }

    #[test]
    fn hostile_volume_names_are_escaped() {
        let name = "a<b>&'\"c";
        let xml = raw(name, 1);
        let start = xml.find("<name>").expect("a name element") + "<name>".len();
        let end = xml.find("</name>").expect("a closed name element");
        let escaped = &xml[start..end];
        assert!(!escaped.contains(['<', '>', '"', '\'']), "{xml}");
        assert_eq!(quick_xml::escape::unescape(escaped).unwrap(), name);
    }
}
