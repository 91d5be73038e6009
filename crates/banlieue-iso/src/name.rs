//! Names in the two trees: the real name validated for Joliet, and a Level-1 8.3 name derived
//! from it for the primary tree, which can spell neither lower case nor `-`.

use std::collections::HashSet;

use crate::{Error, Result};

/// The longest Joliet identifier, in UCS-2 code units.
pub const MAX_JOLIET_NAME_UNITS: usize = 64;

/// The most entries one directory may hold. ECMA-119 sets no such limit; this one keeps the
/// collision-suffix search for Level-1 names trivially bounded (7-digit suffixes alone exceed it).
pub const MAX_DIRECTORY_ENTRIES: usize = 1_000_000;

const LEVEL1_NAME_LEN: usize = 8;
const LEVEL1_EXTENSION_LEN: usize = 3;

/// Checks that `name` can be a Joliet identifier; `path` only makes the error findable.
pub(crate) fn validate_component(name: &str, path: &str) -> Result<()> {
    if name.is_empty() {
        return Err(Error::EmptyName {
            path: path.to_owned(),
        });
    }
    if name == "." || name == ".." {
        return Err(Error::ReservedName {
            name: name.to_owned(),
        });
    }
    if let Some(forbidden) = name
        .chars()
        .find(|&c| c.is_control() || matches!(c, '*' | '/' | ':' | ';' | '?' | '\\'))
    {
        return Err(Error::ForbiddenCharacter {
            name: name.to_owned(),
            forbidden,
        });
    }
    if let Some(character) = name.chars().find(|&c| u32::from(c) > 0xFFFF) {
        return Err(Error::NotUcs2 {
            name: name.to_owned(),
            character,
        });
    }
    // Every character is in the BMP now, so characters and UCS-2 units coincide.
    let units = name.chars().count();
    if units > MAX_JOLIET_NAME_UNITS {
        return Err(Error::NameTooLong {
            name: name.to_owned(),
            units,
            max: MAX_JOLIET_NAME_UNITS,
        });
    }
    Ok(())
}

/// UCS-2 big-endian bytes, the encoding of Joliet identifiers and descriptor strings.
pub(crate) fn ucs2_be(text: &str) -> Vec<u8> {
    text.encode_utf16().flat_map(u16::to_be_bytes).collect()
}

/// The 8.3 name a real name maps to before collisions are resolved: `base` and `extension`
/// in d-characters (A–Z, 0–9, `_`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Level1Name {
    base: String,
    extension: String,
    is_directory: bool,
}

impl Level1Name {
    fn natural(name: &str, is_directory: bool) -> Self {
        // A leading dot marks a hidden file, not an extension: `.profile` keeps its whole name.
        let split = if is_directory {
            None
        } else {
            name.rfind('.').filter(|&at| at > 0)
        };
        let (base, extension) = match split {
            Some(at) => (&name[..at], &name[at + 1..]),
            None => (name, ""),
        };
        let mut base = to_d_characters(base, LEVEL1_NAME_LEN);
        if base.is_empty() {
            base.push('_');
        }
        Level1Name {
            base,
            extension: to_d_characters(extension, LEVEL1_EXTENSION_LEN),
            is_directory,
        }
    }

    /// The same name with a numeric suffix overwriting the tail of the base.
    fn with_suffix(&self, suffix: u32) -> Self {
        let digits = suffix.to_string();
        let keep = LEVEL1_NAME_LEN
            .saturating_sub(digits.len())
            .min(self.base.len());
        Level1Name {
            base: format!("{}{digits}", &self.base[..keep]),
            extension: self.extension.clone(),
            is_directory: self.is_directory,
        }
    }

    /// What collides: readers that drop the version and a trailing dot show `A.;1` and the
    /// directory `A` alike, so both map to `A`.
    fn collision_key(&self) -> String {
        if self.extension.is_empty() {
            self.base.clone()
        } else {
            format!("{}.{}", self.base, self.extension)
        }
    }

    /// The identifier as recorded: `BASE.EXT;1` for files (the dot is mandatory), `BASE` for
    /// directories.
    fn identifier(&self) -> Vec<u8> {
        if self.is_directory {
            self.base.clone().into_bytes()
        } else {
            format!("{}.{};1", self.base, self.extension).into_bytes()
        }
    }
}

/// Upper-cases ASCII letters, keeps digits, turns everything else into `_`, and truncates.
fn to_d_characters(text: &str, max: usize) -> String {
    text.chars()
        .take(max)
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect()
}

/// Level-1 identifiers for the entries of one directory, in the order given.
///
/// The caller passes entries in a canonical order (sorted by real name), which makes the
/// result deterministic: the first entry to claim a natural name keeps it, and later ones get
/// the smallest numeric suffix that is still free, so `meta-data` stays `META_DAT.;1` and a
/// colliding `meta_data` becomes `META_DA1.;1`.
pub(crate) fn assign_level1_identifiers(entries: &[(&str, bool)]) -> Result<Vec<Vec<u8>>> {
    let naturals: Vec<Level1Name> = entries
        .iter()
        .map(|&(name, is_dir)| Level1Name::natural(name, is_dir))
        .collect();
    let mut taken: HashSet<String> = HashSet::with_capacity(naturals.len());
    let mut assigned: Vec<Option<Level1Name>> = naturals
        .iter()
        .map(|natural| {
            taken
                .insert(natural.collision_key())
                .then(|| natural.clone())
        })
        .collect();
    for (slot, natural) in assigned.iter_mut().zip(&naturals) {
        if slot.is_some() {
            continue;
        }
        // At most `taken.len()` candidates can be occupied, so the search ends well inside the
        // range that MAX_DIRECTORY_ENTRIES guarantees.
        let free = (1..=99_999_999u32)
            .map(|suffix| natural.with_suffix(suffix))
            .find(|candidate| !taken.contains(&candidate.collision_key()));
        let Some(free) = free else {
            return Err(Error::TooManyEntries {
                count: entries.len(),
                max: MAX_DIRECTORY_ENTRIES,
            });
        };
        taken.insert(free.collision_key());
        *slot = Some(free);
    }
    Ok(assigned
        .into_iter()
        .flatten()
        .map(|name| name.identifier())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(entries: &[(&str, bool)]) -> Vec<String> {
        assign_level1_identifiers(entries)
            .unwrap()
            .into_iter()
            .map(|id| String::from_utf8(id).unwrap())
            .collect()
    }

    #[test]
    fn seed_names() {
        assert_eq!(
            ids(&[
                ("meta-data", false),
                ("network-config", false),
                ("user-data", false),
                ("vendor-data", false)
            ]),
            ["META_DAT.;1", "NETWORK_.;1", "USER_DAT.;1", "VENDOR_D.;1"]
        );
    }

    #[test]
    fn extensions_hidden_files_and_directories() {
        assert_eq!(
            ids(&[
                (".profile", false),
                ("a.tar.gz", false),
                ("x.y", true),
                ("ünï", false)
            ]),
            ["_PROFILE.;1", "A_TAR.GZ;1", "X_Y", "_N_.;1"]
        );
    }

    #[test]
    fn collisions_get_numeric_suffixes() {
        assert_eq!(
            ids(&[
                ("meta-data", false),
                ("meta_data", false),
                ("meta_da1", false),
                ("META-DATA", true)
            ]),
            ["META_DAT.;1", "META_DA2.;1", "META_DA1.;1", "META_DA3"]
        );
    }

    #[test]
    fn joliet_rules() {
        assert!(validate_component("user-data", "").is_ok());
        assert!(validate_component(&"é".repeat(64), "").is_ok());
        assert!(matches!(
            validate_component(&"a".repeat(65), ""),
            Err(Error::NameTooLong { .. })
        ));
        for bad in ["a*b", "a:b", "a;1", "a?", "a\\b", "a\nb", "a\u{7f}"] {
            assert!(
                matches!(
                    validate_component(bad, ""),
                    Err(Error::ForbiddenCharacter { .. })
                ),
                "{bad:?}"
            );
        }
        assert!(matches!(
            validate_component("😀", ""),
            Err(Error::NotUcs2 { .. })
        ));
        assert!(matches!(
            validate_component("", ""),
            Err(Error::EmptyName { .. })
        ));
        assert!(matches!(
            validate_component("..", ""),
            Err(Error::ReservedName { .. })
        ));
    }
}
