//! The PCR reference values a built disk publishes: PCR 4 and PCR 5 as an EDK2 firmware will
//! measure a boot of it through shim's chain ([`banlieue_attest::boot`]), so that a subject
//! has values to compare a quote with, and can compute the same ones from the image itself.

use std::path::Path;

use banlieue_api::PcrReference;
use banlieue_attest::boot::{self, BootError};

/// The references of the raw disk at `path`, or why it has none (a disk without an EFI
/// system partition or shim's chain on it boots some other way: not an error of the build).
pub fn pcr_references(path: &Path) -> Result<Vec<PcrReference>, BootError> {
    let disk = std::fs::File::open(path)?;
    let prediction = boot::predict(&disk, &boot::SHIM_CHAIN)?;
    Ok(prediction
        .values()
        .into_iter()
        .map(|(pcr, value)| PcrReference {
            pcr,
            sha256: value.iter().map(|b| format!("{b:02x}")).collect(),
        })
        .collect())
}
