//! PCR reference values computed from a disk image, before any boot: what an EDK2 firmware
//! (OVMF, the firmware of banlieue's libvirt guests) measures into PCR 4 and PCR 5 when it
//! boots the disk from its removable-media path.
//!
//! - PCR 4, the boot chain: the action "Calling EFI Application from Boot Option", the
//!   separator, then the Authenticode digest of each EFI application started, in order:
//!   `\EFI\BOOT\BOOTX64.EFI` by the firmware, and the loader that one starts (shim measures
//!   `grubx64.efi` from its own directory into PCR 4 as the firmware would).
//! - PCR 5, the disk's layout: the separator, the GPT (`EV_EFI_GPT_EVENT`), then the two
//!   actions of the kernel's ExitBootServices call.
//!
//! PCRs 0-3, 6 and 7 measure the host's firmware, its configuration and Secure Boot's state,
//! not the image; they come from a verified boot (`banlieue claim verify --write-pcrs`).
//!
//! So a subject that pulled an image by digest computes these values from its bytes, and a
//! quote whose PCR 4 or 5 differs came from another boot chain or another disk. Sans-io but
//! for [`Disk`], which reads a byte range of the image wherever it lives.

pub mod fat;
pub mod gpt;
pub mod pe;

use sha2::{Digest, Sha256};

/// The sector size a UEFI firmware addresses a virtio disk with.
const SECTOR: usize = 512;

/// The removable-media boot path a firmware starts with no boot entry.
pub const REMOVABLE_MEDIA_PATH: &str = r"\EFI\BOOT\BOOTX64.EFI";
/// The chain of Debian's (and most distributions') signed shim: the loader it starts from its
/// own directory.
pub const SHIM_CHAIN: [&str; 2] = [REMOVABLE_MEDIA_PATH, r"\EFI\BOOT\grubx64.efi"];

const CALLING_EFI_APPLICATION: &[u8] = b"Calling EFI Application from Boot Option";
const EXIT_BOOT_SERVICES_INVOCATION: &[u8] = b"Exit Boot Services Invocation";
const EXIT_BOOT_SERVICES_SUCCESS: &[u8] = b"Exit Boot Services Returned with Success";
/// `EV_SEPARATOR`'s data: a UINT32 0.
const SEPARATOR: [u8; 4] = [0; 4];

/// Where a disk image's bytes are read from: a file, or memory in tests.
pub trait Disk {
    /// Fills `buf` from byte `offset`; a range past the end is an error.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()>;
}

impl Disk for std::fs::File {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(self, buf, offset)
    }
}

impl Disk for Vec<u8> {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let start = usize::try_from(offset).ok();
        let range = start.and_then(|s| Some(s..s.checked_add(buf.len())?));
        let bytes = range.and_then(|r| self.get(r)).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "past the disk's end")
        })?;
        buf.copy_from_slice(bytes);
        Ok(())
    }
}

/// Why reference values could not be computed from a disk.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    #[error("reading the disk: {0}")]
    Io(#[from] std::io::Error),
    #[error("the partition table: {0}")]
    Gpt(String),
    #[error("the disk has no EFI system partition")]
    NoEsp,
    #[error("the EFI system partition: {0}")]
    Fat(String),
    #[error("the EFI system partition holds {0}: not handled")]
    Unsupported(String),
    #[error("the EFI system partition has no {0}")]
    NotFound(String),
    #[error("{0} is over {max} bytes", max = fat::MAX_FILE_BYTES)]
    TooLarge(String),
    #[error("{path} is not an EFI application: {error}")]
    Pe { path: String, error: pe::PeError },
}

/// One measurement the prediction replays: what, and its SHA-256 digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Measurement {
    pub pcr: u32,
    pub what: String,
    pub digest: [u8; 32],
}

/// The values PCR 4 and PCR 5 will hold after a boot of the disk, and the measurements
/// that make them, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prediction {
    pub measurements: Vec<Measurement>,
}

impl Prediction {
    /// The PCRs predicted, as `(pcr, value)`, for [`crate::PcrReferences::render`].
    pub fn values(&self) -> Vec<(u32, Vec<u8>)> {
        [4, 5]
            .into_iter()
            .map(|pcr| {
                let value = self
                    .measurements
                    .iter()
                    .filter(|m| m.pcr == pcr)
                    .fold([0u8; 32], |value, m| extend(&value, &m.digest));
                (pcr, value.to_vec())
            })
            .collect()
    }
}

/// Computes PCR 4 and PCR 5 for a boot of `disk` that starts each EFI application of
/// `chain` (ESP paths, first the one the firmware starts) in turn.
pub fn predict(disk: &dyn Disk, chain: &[&str]) -> Result<Prediction, BootError> {
    let table = gpt::PartitionTable::read(disk)?;
    let (esp, length) = table.esp()?;
    let fs = fat::Fat::open(disk, esp, length)?;
    let mut measurements = vec![
        action(4, CALLING_EFI_APPLICATION),
        separator(4),
        separator(5),
        Measurement {
            pcr: 5,
            what: "EV_EFI_GPT_EVENT (the partition table)".into(),
            digest: sha256(&table.gpt_event()),
        },
        action(5, EXIT_BOOT_SERVICES_INVOCATION),
        action(5, EXIT_BOOT_SERVICES_SUCCESS),
    ];
    for (index, path) in chain.iter().enumerate() {
        let image = fs.read_file(path)?;
        let digest = pe::authenticode_sha256(&image).map_err(|error| BootError::Pe {
            path: (*path).to_string(),
            error,
        })?;
        measurements.insert(
            2 + index,
            Measurement {
                pcr: 4,
                what: format!("EV_EFI_BOOT_SERVICES_APPLICATION {path}"),
                digest,
            },
        );
    }
    Ok(Prediction { measurements })
}

fn action(pcr: u32, text: &[u8]) -> Measurement {
    Measurement {
        pcr,
        what: format!("EV_EFI_ACTION {:?}", String::from_utf8_lossy(text)),
        digest: sha256(text),
    }
}

fn separator(pcr: u32) -> Measurement {
    Measurement {
        pcr,
        what: "EV_SEPARATOR".into(),
        digest: sha256(&SEPARATOR),
    }
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

fn extend(value: &[u8; 32], digest: &[u8; 32]) -> [u8; 32] {
    let mut hash = Sha256::new();
    hash.update(value);
    hash.update(digest);
    hash.finalize().into()
}
