//! The reference seed, byte for byte: any change to the writer's output shows up here as a
//! reviewable diff of hex dumps.

use std::fmt::Write as _;

use banlieue_iso::{NoCloudSeed, SECTOR_SIZE, Timestamp};

const ROW: usize = 16;

/// One block per sector that has any non-zero byte, rows of 16 bytes with absolute offsets
/// and ASCII; runs of all-zero sectors and of all-zero rows collapse into one marker line.
fn sector_hex_dump(image: &[u8]) -> String {
    let mut out = String::new();
    let mut zero_run_start: Option<usize> = None;
    let flush_zero_run = |out: &mut String, start: Option<usize>, end: usize| {
        if let Some(start) = start {
            let _ = writeln!(out, "sectors {start}..{end}: all zero\n");
        }
    };
    for (index, sector) in image.chunks(SECTOR_SIZE).enumerate() {
        if sector.iter().all(|&b| b == 0) {
            zero_run_start.get_or_insert(index);
            continue;
        }
        flush_zero_run(&mut out, zero_run_start.take(), index);
        let _ = writeln!(out, "sector {index} @ {:#08x}", index * SECTOR_SIZE);
        let mut in_zero_rows = false;
        for (row_index, row) in sector.chunks(ROW).enumerate() {
            if row.iter().all(|&b| b == 0) {
                if !in_zero_rows {
                    out.push_str("*\n");
                    in_zero_rows = true;
                }
                continue;
            }
            in_zero_rows = false;
            let offset = index * SECTOR_SIZE + row_index * ROW;
            let hex: Vec<String> = row.iter().map(|b| format!("{b:02x}")).collect();
            let ascii: String = row
                .iter()
                .map(|&b| {
                    if (0x20..0x7f).contains(&b) {
                        b as char
                    } else {
                        '.'
                    }
                })
                .collect();
            let _ = writeln!(out, "{offset:08x}  {}  |{ascii}|", hex.join(" "));
        }
        out.push('\n');
    }
    flush_zero_run(&mut out, zero_run_start, image.len() / SECTOR_SIZE);
    out
}

fn reference_seed() -> NoCloudSeed {
    NoCloudSeed::new("f81d4fae-7dec-11d0-a765-00a0c91e6bf6", "default-web-0")
        .with_user_data("#cloud-config\nruncmd:\n  - [touch, /run/banlieue-ready]\n")
        .with_network_config("version: 2\nethernets:\n  eth0:\n    dhcp4: true\n")
        .with_timestamp(Timestamp::from_unix_seconds(1_704_164_645).unwrap())
}

#[test]
fn reference_seed_bytes() {
    let image = reference_seed().to_bytes().unwrap();
    insta::assert_snapshot!("reference_seed", sector_hex_dump(&image));
    // The dump is lossless for this image: re-reading it gives the same bytes back.
    assert_eq!(
        parse_dump(&sector_hex_dump(&image), image.len()),
        image.to_vec()
    );
}

#[test]
fn same_input_same_bytes() {
    assert_eq!(
        reference_seed().to_bytes().unwrap(),
        reference_seed().to_bytes().unwrap()
    );
    let other_time = reference_seed().with_timestamp(Timestamp::from_unix_seconds(0).unwrap());
    assert_ne!(
        reference_seed().to_bytes().unwrap(),
        other_time.to_bytes().unwrap()
    );
}

/// Rebuilds an image from its dump: collapsed rows and sectors are zeros.
fn parse_dump(dump: &str, len: usize) -> Vec<u8> {
    let mut image = vec![0u8; len];
    for line in dump.lines() {
        let Some((offset, rest)) = line.split_once("  ") else {
            continue;
        };
        let Ok(offset) = usize::from_str_radix(offset, 16) else {
            continue;
        };
        let hex = rest.split("  |").next().unwrap();
        for (i, byte) in hex.split(' ').enumerate() {
            image[offset + i] = u8::from_str_radix(byte, 16).unwrap();
        }
    }
    image
}
