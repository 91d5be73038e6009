//! `banlieue imagebuild pcrs IMAGE`: the PCR reference values of a disk image, computed from
//! its bytes ([`banlieue_attest::boot`]), as a reference file `banlieue claim verify
//! --pcr-references` reads. What the image builder publishes on a VMImage, reproduced by
//! whoever holds the image: a subject pulls the image by its digest and trusts its own result.

use std::io::Read as _;
use std::path::{Path, PathBuf};

use banlieue_attest::PcrReferences;
use banlieue_attest::boot::{self, Prediction};
use banlieue_imagebuilder::qcow2;
use banlieue_imagebuilder::sparse::SparseFile;

/// The largest qcow2 virtual size converted for a measurement.
const MAX_VIRTUAL_BYTES: u64 = 1 << 40;

/// What the command prints and writes.
#[derive(Debug)]
pub struct Measured {
    pub prediction: Prediction,
    /// The reference file's text (`PCR HEX` lines).
    pub references: String,
}

/// Computes the references of the raw or qcow2 disk at `image` for a boot through `chain`
/// (ESP paths; shim's when empty). A qcow2 is converted into `scratch` first.
pub fn measure(image: &Path, chain: &[String], scratch: &Path) -> Result<Measured, String> {
    let mut magic = [0u8; 4];
    let mut file = std::fs::File::open(image).map_err(|e| format!("{}: {e}", image.display()))?;
    let is_qcow2 = file.read_exact(&mut magic).is_ok() && magic == qcow2::MAGIC;
    let raw: PathBuf = if is_qcow2 {
        let raw = scratch.join("disk.raw");
        let out = std::fs::File::create(&raw).map_err(|e| format!("{}: {e}", raw.display()))?;
        let mut sink = SparseFile::new(out);
        let limits = qcow2::Limits {
            max_virtual_size: MAX_VIRTUAL_BYTES,
        };
        qcow2::convert_file(image, &mut sink, &limits, &mut |_, _| {})
            .map_err(|e| format!("{}: {e}", image.display()))?;
        sink.finish()
            .map_err(|e| format!("{}: {e}", raw.display()))?;
        raw
    } else {
        image.to_path_buf()
    };
    let disk = std::fs::File::open(&raw).map_err(|e| format!("{}: {e}", raw.display()))?;
    let chain: Vec<&str> = if chain.is_empty() {
        boot::SHIM_CHAIN.to_vec()
    } else {
        chain.iter().map(String::as_str).collect()
    };
    let prediction =
        boot::predict(&disk, &chain).map_err(|e| format!("{}: {e}", image.display()))?;
    let references = PcrReferences::render(&prediction.values());
    Ok(Measured {
        prediction,
        references,
    })
}

/// The measurements, one a line, then each PCR's value: what the command prints.
pub fn describe(prediction: &Prediction) -> String {
    let mut out = String::new();
    for m in &prediction.measurements {
        let digest: String = m.digest.iter().map(|b| format!("{b:02x}")).collect();
        out.push_str(&format!("PCR {} ← {digest} {}\n", m.pcr, m.what));
    }
    for (pcr, value) in prediction.values() {
        let value: String = value.iter().map(|b| format!("{b:02x}")).collect();
        out.push_str(&format!("PCR {pcr} = {value}\n"));
    }
    out
}
