//! The Authenticode digest of a PE/COFF image (Microsoft's "Windows Authenticode Portable
//! Executable Signature Format"): what a UEFI firmware measures into PCR 4 for each EFI
//! application it starts (`EV_EFI_BOOT_SERVICES_APPLICATION`), and what shim measures for the
//! loader it starts after itself.
//!
//! The digest covers the file but three things a signature changes: the optional header's
//! checksum, the certificate table's directory entry, and the certificate table itself. So a
//! signed and an unsigned build of one binary measure alike, and the value can be computed
//! from the file alone.

use sha2::{Digest, Sha256};

/// The largest image accepted: a boot loader or a kernel is a few MiB.
pub const MAX_PE_BYTES: usize = 64 * 1024 * 1024;
/// The most sections a header may declare (the PE format allows 96).
const MAX_SECTIONS: usize = 96;
/// Index of the certificate table ("security") among the optional header's data directories.
const SECURITY_DIRECTORY: u32 = 4;

const PE32_MAGIC: u16 = 0x10b;
const PE32_PLUS_MAGIC: u16 = 0x20b;

/// Why a file is not a PE image this digest can be computed for.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PeError {
    #[error("{0} bytes, over the {MAX_PE_BYTES} accepted")]
    TooLarge(usize),
    #[error("not a PE image: {0}")]
    NotPe(&'static str),
    #[error("the header is cut short: {0}")]
    Truncated(&'static str),
    #[error("{0}")]
    Malformed(String),
}

/// The SHA-256 Authenticode digest of `image`, as EDK2's firmware and shim compute it: the
/// headers without the checksum and the certificate table's entry, the sections in the order
/// of their file offsets, then whatever follows them but the certificate table.
pub fn authenticode_sha256(image: &[u8]) -> Result<[u8; 32], PeError> {
    if image.len() > MAX_PE_BYTES {
        return Err(PeError::TooLarge(image.len()));
    }
    let layout = Layout::parse(image)?;
    let mut hash = Sha256::new();
    let headers = &image[..layout.size_of_headers];
    hash.update(&headers[..layout.checksum]);
    match layout.certificate_entry {
        Some(entry) => {
            hash.update(&headers[layout.checksum + 4..entry]);
            hash.update(&headers[entry + 8..]);
        }
        None => hash.update(&headers[layout.checksum + 4..]),
    }
    let mut hashed = layout.size_of_headers;
    for (offset, size) in &layout.sections {
        hash.update(&image[*offset..*offset + *size]);
        hashed += size;
    }
    // What follows the sections (a debug directory, an appended payload), but the
    // certificate table, which a signature appends last.
    if image.len() > hashed + layout.certificate_size {
        hash.update(&image[hashed..image.len() - layout.certificate_size]);
    }
    Ok(hash.finalize().into())
}

/// Where the digest's pieces lie in one image, every offset checked against its length.
struct Layout {
    /// Offset of the optional header's CheckSum field.
    checksum: usize,
    /// Offset of the certificate table's data directory entry, when the header has one.
    certificate_entry: Option<usize>,
    certificate_size: usize,
    size_of_headers: usize,
    /// (file offset, size) of each section with bytes in the file, by offset.
    sections: Vec<(usize, usize)>,
}

impl Layout {
    fn parse(image: &[u8]) -> Result<Self, PeError> {
        if image.get(..2) != Some(b"MZ") {
            return Err(PeError::NotPe("no MZ header"));
        }
        let pe = u32_at(image, 0x3c, "e_lfanew")? as usize;
        if image.get(pe..pe.saturating_add(4)) != Some(b"PE\0\0") {
            return Err(PeError::NotPe("no PE signature where e_lfanew points"));
        }
        let coff = pe + 4;
        let section_count = usize::from(u16_at(image, coff + 2, "NumberOfSections")?);
        let optional_size = usize::from(u16_at(image, coff + 16, "SizeOfOptionalHeader")?);
        let optional = coff + 20;
        let (count_at, directories) = match u16_at(image, optional, "the optional header")? {
            PE32_MAGIC => (optional + 92, optional + 96),
            PE32_PLUS_MAGIC => (optional + 108, optional + 112),
            other => {
                return Err(PeError::Malformed(format!(
                    "optional header magic {other:#x}"
                )));
            }
        };
        let checksum = optional + 64;
        let size_of_headers = u32_at(image, optional + 60, "SizeOfHeaders")? as usize;
        let directory_count = u32_at(image, count_at, "NumberOfRvaAndSizes")?;
        let section_table = optional + optional_size;
        if directories > section_table
            || size_of_headers > image.len()
            || size_of_headers < section_table
        {
            return Err(PeError::Malformed(format!(
                "SizeOfHeaders {size_of_headers} does not hold the headers ({section_table} bytes) within the file ({} bytes)",
                image.len()
            )));
        }
        let (certificate_entry, certificate_size) = if directory_count > SECURITY_DIRECTORY {
            let entry = directories + 8 * SECURITY_DIRECTORY as usize;
            if entry + 8 > section_table {
                return Err(PeError::Malformed(
                    "the certificate table's entry lies past the optional header".into(),
                ));
            }
            let offset = u32_at(image, entry, "the certificate table")? as usize;
            let size = u32_at(image, entry + 4, "the certificate table")? as usize;
            if size > 0 && offset.checked_add(size) != Some(image.len()) {
                // A signature is appended last; one elsewhere would be hashed around in a way
                // firmware implementations do not agree on.
                return Err(PeError::Malformed(format!(
                    "the certificate table ({size} bytes at {offset}) does not end the file"
                )));
            }
            (Some(entry), size)
        } else {
            (None, 0)
        };
        let sections = Self::sections(image, section_table, section_count, size_of_headers)?;
        Ok(Layout {
            checksum,
            certificate_entry,
            certificate_size,
            size_of_headers,
            sections,
        })
    }

    fn sections(
        image: &[u8],
        table: usize,
        count: usize,
        size_of_headers: usize,
    ) -> Result<Vec<(usize, usize)>, PeError> {
        if count > MAX_SECTIONS {
            return Err(PeError::Malformed(format!(
                "{count} sections, over the {MAX_SECTIONS} the format allows"
            )));
        }
        if table + 40 * count > size_of_headers {
            return Err(PeError::Malformed(
                "the section table lies past SizeOfHeaders".into(),
            ));
        }
        let mut sections = Vec::with_capacity(count);
        for index in 0..count {
            let at = table + 40 * index;
            let size = u32_at(image, at + 16, "SizeOfRawData")? as usize;
            let offset = u32_at(image, at + 20, "PointerToRawData")? as usize;
            if size == 0 {
                continue;
            }
            if offset.checked_add(size).is_none_or(|end| end > image.len()) {
                return Err(PeError::Malformed(format!(
                    "section {index} ({size} bytes at {offset}) lies past the file's end"
                )));
            }
            sections.push((offset, size));
        }
        sections.sort_unstable();
        Ok(sections)
    }
}

fn u16_at(image: &[u8], at: usize, what: &'static str) -> Result<u16, PeError> {
    image
        .get(at..at + 2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .ok_or(PeError::Truncated(what))
}

fn u32_at(image: &[u8], at: usize, what: &'static str) -> Result<u32, PeError> {
    image
        .get(at..at + 4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or(PeError::Truncated(what))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small PE32+ image: headers, two sections (in the table out of file order), an
    /// appended payload, and optionally a certificate table at the end.
    fn image(certificate: Option<&[u8]>) -> Vec<u8> {
        let mut image = vec![0u8; 0x400];
        image[..2].copy_from_slice(b"MZ");
        image[0x3c..0x40].copy_from_slice(&0x80u32.to_le_bytes());
        image[0x80..0x84].copy_from_slice(b"PE\0\0");
        let coff = 0x84;
        image[coff + 2..coff + 4].copy_from_slice(&2u16.to_le_bytes());
        image[coff + 16..coff + 18].copy_from_slice(&240u16.to_le_bytes());
        let optional = coff + 20;
        image[optional..optional + 2].copy_from_slice(&PE32_PLUS_MAGIC.to_le_bytes());
        image[optional + 60..optional + 64].copy_from_slice(&0x200u32.to_le_bytes());
        image[optional + 64..optional + 68].copy_from_slice(&0xdeadu32.to_le_bytes());
        image[optional + 108..optional + 112].copy_from_slice(&16u32.to_le_bytes());
        let table = optional + 240;
        for (index, (offset, size)) in [(0x300u32, 0x100u32), (0x200, 0x100)].iter().enumerate() {
            let at = table + 40 * index;
            image[at + 16..at + 20].copy_from_slice(&size.to_le_bytes());
            image[at + 20..at + 24].copy_from_slice(&offset.to_le_bytes());
        }
        for (i, byte) in image[0x200..].iter_mut().enumerate() {
            *byte = (i % 251) as u8;
        }
        image.extend_from_slice(b"appended after the sections");
        if let Some(certificate) = certificate {
            let entry = optional + 112 + 8 * 4;
            let offset = image.len() as u32;
            image[entry..entry + 4].copy_from_slice(&offset.to_le_bytes());
            image[entry + 4..entry + 8].copy_from_slice(&(certificate.len() as u32).to_le_bytes());
            image.extend_from_slice(certificate);
        }
        image
    }

    /// The digest by the specification's steps, written out by hand for the test image.
    fn by_hand(image: &[u8], certificate_size: usize) -> [u8; 32] {
        let optional = 0x84 + 20;
        let entry = optional + 112 + 32;
        let mut hash = Sha256::new();
        hash.update(&image[..optional + 64]);
        hash.update(&image[optional + 68..entry]);
        hash.update(&image[entry + 8..0x200]);
        hash.update(&image[0x200..0x300]);
        hash.update(&image[0x300..0x400]);
        hash.update(&image[0x400..image.len() - certificate_size]);
        hash.finalize().into()
    }

    #[test]
    fn a_signature_and_the_checksum_do_not_change_the_digest() {
        let unsigned = image(None);
        let signed = image(Some(&[7u8; 64]));
        let digest = authenticode_sha256(&unsigned).unwrap();
        assert_eq!(digest, by_hand(&unsigned, 0));
        assert_eq!(authenticode_sha256(&signed).unwrap(), digest);
        let mut checksummed = signed.clone();
        checksummed[0x84 + 20 + 64] ^= 0xff;
        assert_eq!(authenticode_sha256(&checksummed).unwrap(), digest);
    }

    #[test]
    fn a_byte_of_a_section_or_the_appended_data_changes_it() {
        let base = authenticode_sha256(&image(None)).unwrap();
        for at in [0x210, 0x310, 0x402] {
            let mut changed = image(None);
            changed[at] ^= 1;
            assert_ne!(authenticode_sha256(&changed).unwrap(), base, "byte {at:#x}");
        }
    }

    #[test]
    fn hostile_headers_are_refused_without_panicking() {
        assert_eq!(
            authenticode_sha256(b"ZM"),
            Err(PeError::NotPe("no MZ header"))
        );
        let mut far = image(None);
        far[0x3c..0x40].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(authenticode_sha256(&far), Err(PeError::NotPe(_))));
        let mut section_past_end = image(None);
        let at = 0x84 + 20 + 240 + 16;
        section_past_end[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            authenticode_sha256(&section_past_end),
            Err(PeError::Malformed(m)) if m.contains("past the file's end")
        ));
        let mut certificate_inside = image(Some(&[1u8; 16]));
        let entry = 0x84 + 20 + 112 + 32;
        certificate_inside[entry..entry + 4].copy_from_slice(&0x200u32.to_le_bytes());
        assert!(matches!(
            authenticode_sha256(&certificate_inside),
            Err(PeError::Malformed(m)) if m.contains("does not end the file")
        ));
        // Every prefix of a valid image: an error or a digest, never a panic.
        let whole = image(Some(&[3u8; 8]));
        for cut in 0..whole.len() {
            let _ = authenticode_sha256(&whole[..cut]);
        }
    }
}
