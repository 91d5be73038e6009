//! Independent readers agree with the writer: isoinfo, xorriso, pycdlib, blkid, and
//! cloud-init's NoCloud datasource on the files those readers extract.

mod common;

use std::collections::BTreeMap;
use std::io::Cursor;
use std::process::Command;

use banlieue_iso::{Error, Image, ImageOptions, NoCloudSeed, Timestamp, Tree, VolumeLabel};
use bytes::Bytes;
use common::{Spec, build, check_all_readers, expected_from, nocloud_read, program, run};

const DOMAIN_UUID: &str = "f81d4fae-7dec-11d0-a765-00a0c91e6bf6";

fn reference_options() -> ImageOptions {
    ImageOptions {
        volume_label: VolumeLabel::default(),
        timestamp: Timestamp::from_unix_seconds(1_704_164_645).unwrap(),
    }
}

/// The image of `seed` and what readers must find in it; `payloads` are the files besides the
/// generated meta-data.
fn seed_expected(seed: &NoCloudSeed, payloads: &[(&str, &[u8])]) -> (Bytes, common::Expected) {
    let image = seed.image().unwrap();
    let mut contents: BTreeMap<String, Vec<u8>> = payloads
        .iter()
        .map(|(name, data)| (format!("/{name}"), data.to_vec()))
        .collect();
    contents.insert("/meta-data".into(), seed.meta_data().unwrap().into_bytes());
    contents.entry("/user-data".into()).or_default();
    let expected = expected_from(&image, &contents, "cidata");
    (image.to_bytes().unwrap(), expected)
}

/// Extracts the seed's files with `isoinfo -J -x` into a fresh directory, as a guest's mount
/// would show them.
fn extract_seed_with_isoinfo(image: &[u8], names: &[&str]) -> Option<tempfile::TempDir> {
    let isoinfo = program("isoinfo")?;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("seed.iso");
    std::fs::write(&path, image).unwrap();
    let seed_dir = dir.path().join("seed");
    std::fs::create_dir(&seed_dir).unwrap();
    for name in names {
        let out = run(Command::new(&isoinfo)
            .arg("-i")
            .arg(&path)
            .arg("-J")
            .arg("-x")
            .arg(format!("/{name}")))
        .stdout;
        std::fs::write(seed_dir.join(name), out).unwrap();
    }
    std::fs::remove_file(&path).unwrap();
    Some(dir)
}

const CLOUD_CONFIG: &str = "#cloud-config\nusers:\n  - name: sandbox\n    ssh_authorized_keys: []\nruncmd:\n  - [touch, /run/banlieue-ready]\n";
const NETWORK_CONFIG: &str = "version: 2\nethernets:\n  eth0:\n    dhcp4: true\n";
const VENDOR_DATA: &str = "#cloud-config\npackage_update: false\n";

#[test]
fn reference_seed_is_read_alike_by_every_reader() {
    let seed = NoCloudSeed::new(DOMAIN_UUID, "default-web-0")
        .with_user_data(CLOUD_CONFIG)
        .with_network_config(NETWORK_CONFIG)
        .with_vendor_data(VENDOR_DATA)
        .with_timestamp(reference_options().timestamp);
    let (image, expected) = seed_expected(
        &seed,
        &[
            ("user-data", CLOUD_CONFIG.as_bytes()),
            ("network-config", NETWORK_CONFIG.as_bytes()),
            ("vendor-data", VENDOR_DATA.as_bytes()),
        ],
    );
    assert_eq!(
        expected.files.keys().collect::<Vec<_>>(),
        [
            "/meta-data",
            "/network-config",
            "/user-data",
            "/vendor-data"
        ]
    );
    assert_eq!(expected.files["/user-data"].1, CLOUD_CONFIG.as_bytes());
    check_all_readers(&image, &expected);

    let names = ["meta-data", "user-data", "network-config", "vendor-data"];
    let Some(extracted) = extract_seed_with_isoinfo(&image, &names) else {
        return;
    };
    let Some(report) = nocloud_read(&extracted.path().join("seed")) else {
        return;
    };
    assert_eq!(report.instance_id, DOMAIN_UUID);
    assert_eq!(report.local_hostname, "default-web-0");
    assert_eq!(report.user_data, CLOUD_CONFIG.as_bytes());
    assert_eq!(report.vendor_data, VENDOR_DATA.as_bytes());
    assert_eq!(report.network_config["ethernets"]["eth0"]["dhcp4"], true);
}

#[test]
fn seed_without_user_data_still_satisfies_cloud_init() {
    let seed = NoCloudSeed::new(DOMAIN_UUID, "default-web-1");
    let (image, expected) = seed_expected(&seed, &[]);
    assert_eq!(
        expected.files.keys().collect::<Vec<_>>(),
        ["/meta-data", "/user-data"]
    );
    assert!(expected.files["/user-data"].1.is_empty());
    check_all_readers(&image, &expected);
    let Some(extracted) = extract_seed_with_isoinfo(&image, &["meta-data", "user-data"]) else {
        return;
    };
    let Some(report) = nocloud_read(&extracted.path().join("seed")) else {
        return;
    };
    assert_eq!(report.instance_id, DOMAIN_UUID);
    assert_eq!(report.local_hostname, "default-web-1");
    assert!(report.user_data.is_empty());
}

#[test]
fn awkward_meta_data_values_and_binary_user_data_survive() {
    // gzip magic, a NUL, invalid UTF-8 and a trailing CR: user-data is bytes, not text.
    let mut binary = vec![0x1f, 0x8b, 0x08, 0x00, 0x00, 0xff, 0xfe, b'\r'];
    binary.extend((0..=255u8).cycle().take(5000));
    let multipart = "Content-Type: multipart/mixed; boundary=\"B\"\nMIME-Version: 1.0\n\n--B\nContent-Type: text/cloud-config\n\n#cloud-config\n--B--\n";
    for (instance_id, hostname, user_data) in [
        ("yes", "123", binary.clone()),
        ("a: b", "*anchor", multipart.as_bytes().to_vec()),
        (
            "&x !tag",
            "line\nbreak \"quoted\" \\",
            b"#cloud-config\n".to_vec(),
        ),
        ("~", "0x1F", Vec::new()),
    ] {
        let seed = NoCloudSeed::new(instance_id, hostname).with_user_data(user_data.clone());
        let (image, expected) = seed_expected(&seed, &[("user-data", &user_data)]);
        check_all_readers(&image, &expected);
        let Some(extracted) = extract_seed_with_isoinfo(&image, &["meta-data", "user-data"]) else {
            return;
        };
        let Some(report) = nocloud_read(&extracted.path().join("seed")) else {
            return;
        };
        assert_eq!(report.instance_id, instance_id);
        assert_eq!(report.local_hostname, hostname);
        assert_eq!(report.user_data, user_data);
    }
}

#[test]
fn nested_tree_with_collisions_and_sector_edges() {
    let specs = vec![
        Spec::File("meta-data".into(), b"instance-id: x\n".to_vec()),
        Spec::File(
            "meta_data".into(),
            b"collides in the primary tree\n".to_vec(),
        ),
        Spec::File("META-DATA.txt".into(), vec![b'm'; 2047]),
        Spec::File("a/b/c/d/e/f/g/deepest".into(), vec![1; 2048]),
        Spec::File("a/b/sector-plus-one".into(), vec![2; 2049]),
        Spec::File("a/empty".into(), Vec::new()),
        Spec::File("ünïcødé/名前 with spaces.bin".into(), vec![3; 4096]),
        Spec::File(format!("long/{}", "n".repeat(64)), b"64 units".to_vec()),
        Spec::Dir("empty-dir/inner".into()),
        Spec::File("zz-last-empty".into(), Vec::new()),
    ];
    let (image, expected) = build(&specs, &reference_options()).unwrap();
    assert_eq!(expected.files["/meta_data"].0, "/META_DA1.;1");
    check_all_readers(&image, &expected);
}

#[test]
fn many_entries_spill_directories_over_several_sectors() {
    let specs: Vec<Spec> = (0..300)
        .map(|i| {
            Spec::File(
                format!("dir/file-with-a-longish-name-{i:04}"),
                vec![i as u8; i % 7],
            )
        })
        .collect();
    let options = ImageOptions {
        volume_label: VolumeLabel::new("CIDATA").unwrap(),
        ..Default::default()
    };
    let (image, expected) = build(&specs, &options).unwrap();
    check_all_readers(&image, &expected);
}

#[tokio::test]
async fn async_writer_matches_sync_writer() {
    let seed = NoCloudSeed::new(DOMAIN_UUID, "default-web-0").with_user_data(vec![9u8; 70_000]);
    let sync = seed.to_bytes().unwrap();
    let mut out = Vec::new();
    let written = seed
        .image()
        .unwrap()
        .write_to_async(&mut out)
        .await
        .unwrap();
    assert_eq!(written, out.len() as u64);
    assert_eq!(out, sync);
}

#[test]
fn sources_must_match_their_declared_size() {
    let plan = |declared: u64, actual: &'static [u8]| {
        let mut tree: Tree<Cursor<&[u8]>> = Tree::new();
        tree.add_file("f", declared, Cursor::new(actual)).unwrap();
        Image::plan(tree, &ImageOptions::default()).unwrap()
    };
    let err = plan(10, b"short").write_to(&mut Vec::new()).unwrap_err();
    assert!(
        matches!(
            err,
            Error::SourceTooShort {
                declared: 10,
                read: 5,
                ..
            }
        ),
        "{err}"
    );
    let err = plan(3, b"too long").write_to(&mut Vec::new()).unwrap_err();
    assert!(
        matches!(err, Error::SourceTooLong { declared: 3, .. }),
        "{err}"
    );
    let mut out = Vec::new();
    plan(8, b"too long").write_to(&mut out).unwrap();
    assert_eq!(out.len() % 2048, 0);
}
