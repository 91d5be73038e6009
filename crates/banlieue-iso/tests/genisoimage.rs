//! Side by side with `genisoimage -volid cidata -joliet -rock`, the documented way to build a
//! seed by hand: the fields readers report about the two images agree.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use banlieue_iso::NoCloudSeed;
use common::{program, run};

/// The `isoinfo -d` lines that describe the volume's structure rather than who wrote it when.
fn structural_summary(isoinfo: &Path, image: &Path) -> Vec<String> {
    let out = run(Command::new(isoinfo).arg("-d").arg("-i").arg(image)).stdout;
    String::from_utf8_lossy(&out)
        .lines()
        .filter(|l| {
            l.starts_with("Volume id:")
                || l.starts_with("Logical block size")
                || l.starts_with("Volume set size")
                || l.starts_with("Joliet with UCS level")
                || l.starts_with("CD-ROM is in ISO 9660")
        })
        .map(str::to_owned)
        .collect()
}

/// Path → size for every file `isoinfo -J -l` lists, directories included with their names.
fn joliet_listing(isoinfo: &Path, image: &Path) -> BTreeMap<String, u64> {
    let out = run(Command::new(isoinfo).args(["-J", "-l", "-i"]).arg(image)).stdout;
    let mut listing = BTreeMap::new();
    let mut directory = String::new();
    for line in String::from_utf8_lossy(&out).lines() {
        if let Some(dir) = line.strip_prefix("Directory listing of ") {
            directory = dir.to_owned();
            continue;
        }
        let Some((fields, name)) = line.split_once("]  ") else {
            continue;
        };
        let name = name.trim_end();
        if name == "." || name == ".." || line.starts_with('d') {
            continue;
        }
        let size: u64 = fields.split_whitespace().nth(4).unwrap().parse().unwrap();
        listing.insert(format!("{directory}{name}"), size);
    }
    listing
}

fn blkid_fields(blkid: &Path, image: &Path) -> BTreeMap<String, String> {
    let out = run(Command::new(blkid).arg("-p").arg(image)).stdout;
    let text = String::from_utf8_lossy(&out).into_owned();
    ["TYPE", "LABEL", "VERSION", "BLOCK_SIZE"]
        .into_iter()
        .filter_map(|key| {
            let start = text.find(&format!(" {key}=\""))? + key.len() + 3;
            let end = start + text[start..].find('"')?;
            Some((key.to_owned(), text[start..end].to_owned()))
        })
        .collect()
}

#[test]
fn agrees_with_genisoimage_on_what_readers_see() {
    let (Some(genisoimage), Some(isoinfo), Some(blkid)) =
        (program("genisoimage"), program("isoinfo"), program("blkid"))
    else {
        return;
    };
    let user_data = "#cloud-config\n".repeat(500);
    let seed = NoCloudSeed::new("f81d4fae-7dec-11d0-a765-00a0c91e6bf6", "default-web-0")
        .with_user_data(user_data.clone())
        .with_network_config("version: 2\n")
        .with_vendor_data("");
    let scratch = tempfile::tempdir().unwrap();
    let files = scratch.path().join("files");
    std::fs::create_dir(&files).unwrap();
    std::fs::write(files.join("meta-data"), seed.meta_data().unwrap()).unwrap();
    std::fs::write(files.join("user-data"), &user_data).unwrap();
    std::fs::write(files.join("network-config"), "version: 2\n").unwrap();
    std::fs::write(files.join("vendor-data"), "").unwrap();
    let theirs = scratch.path().join("genisoimage.iso");
    run(Command::new(genisoimage)
        .args(["-quiet", "-volid", "cidata", "-joliet", "-rock", "-o"])
        .arg(&theirs)
        .arg(&files));
    let ours = scratch.path().join("banlieue.iso");
    std::fs::write(&ours, seed.to_bytes().unwrap()).unwrap();

    let summary = structural_summary(&isoinfo, &ours);
    assert!(
        summary.iter().any(|l| l == "Joliet with UCS level 3 found"),
        "{summary:?}"
    );
    assert_eq!(summary, structural_summary(&isoinfo, &theirs));
    let listing = joliet_listing(&isoinfo, &ours);
    assert_eq!(listing.len(), 4, "{listing:?}");
    assert_eq!(listing, joliet_listing(&isoinfo, &theirs));
    assert_eq!(blkid_fields(&blkid, &ours), blkid_fields(&blkid, &theirs));
    assert_eq!(blkid_fields(&blkid, &ours)["LABEL"], "cidata");
}
