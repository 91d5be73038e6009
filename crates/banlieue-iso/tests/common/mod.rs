//! Independent readers of the images the writer produces: isoinfo, xorriso, pycdlib, blkid and
//! cloud-init's NoCloud datasource. Each check runs the real program and compares what it
//! reports with what went in.
//!
//! A missing reader fails the test with the command that installs it; only with
//! BANLIEUE_ALLOW_MISSING_PEERS=1 is it skipped, loudly.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::io::Cursor;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use banlieue_iso::{Image, ImageOptions, Tree};
use bytes::Bytes;

const SETUP_HINT: &str = "run `scripts/setup iso-readers` (as root) to install the ISO readers";

/// What an image should contain: every file with its bytes and every directory, under the
/// real (Joliet) path and the derived primary path.
#[derive(Debug, Default, Clone)]
pub struct Expected {
    pub volume_id: String,
    /// Joliet path → (primary path, contents).
    pub files: BTreeMap<String, (String, Vec<u8>)>,
    /// (Joliet path, primary path).
    pub dirs: BTreeSet<(String, String)>,
}

/// An entry of a tree to build: a file with contents, or a directory.
#[derive(Debug, Clone)]
pub enum Spec {
    File(String, Vec<u8>),
    Dir(String),
}

/// Builds an image from `specs` and records what readers must find in it.
pub fn build(specs: &[Spec], options: &ImageOptions) -> banlieue_iso::Result<(Bytes, Expected)> {
    let mut tree = Tree::new();
    let mut contents = BTreeMap::new();
    for spec in specs {
        match spec {
            Spec::File(path, data) => {
                tree.add_bytes(path, data.clone())?;
                contents.insert(format!("/{}", path.trim_start_matches('/')), data.clone());
            }
            Spec::Dir(path) => tree.add_directory(path)?,
        }
    }
    let image = Image::plan(tree, options)?;
    let expected = expected_from(&image, &contents, options.volume_label.as_str());
    Ok((image.to_bytes()?, expected))
}

/// Like [`build`], but skips entries that conflict with earlier ones (a duplicate path, or a
/// path through a file), as random trees produce; returns the specs that were kept.
pub fn build_lenient(
    specs: &[Spec],
    options: &ImageOptions,
) -> banlieue_iso::Result<(Bytes, Expected, Vec<Spec>)> {
    let mut tree = Tree::new();
    let mut contents = BTreeMap::new();
    let mut kept = Vec::new();
    for spec in specs {
        let added = match spec {
            Spec::File(path, data) => tree.add_bytes(path, data.clone()),
            Spec::Dir(path) => tree.add_directory(path),
        };
        match added {
            Ok(()) => {}
            Err(
                banlieue_iso::Error::DuplicatePath { .. }
                | banlieue_iso::Error::NotADirectory { .. },
            ) => {
                continue;
            }
            Err(e) => return Err(e),
        }
        if let Spec::File(path, data) = spec {
            contents.insert(format!("/{}", path.trim_start_matches('/')), data.clone());
        }
        kept.push(spec.clone());
    }
    let image = Image::plan(tree, options)?;
    let expected = expected_from(&image, &contents, options.volume_label.as_str());
    Ok((image.to_bytes()?, expected, kept))
}

pub fn expected_from(
    image: &Image<Cursor<Bytes>>,
    contents: &BTreeMap<String, Vec<u8>>,
    volume_id: &str,
) -> Expected {
    let mut expected = Expected {
        volume_id: volume_id.to_owned(),
        ..Default::default()
    };
    for entry in image.entries() {
        if entry.is_directory {
            expected
                .dirs
                .insert((entry.joliet_path.clone(), entry.primary_path.clone()));
        } else {
            let data = contents
                .get(&entry.joliet_path)
                .cloned()
                .unwrap_or_default();
            assert_eq!(data.len() as u64, entry.size, "{}", entry.joliet_path);
            expected.files.insert(
                entry.joliet_path.clone(),
                (entry.primary_path.clone(), data),
            );
        }
    }
    expected
}

impl Expected {
    fn joliet_paths(&self) -> BTreeSet<String> {
        self.files
            .keys()
            .cloned()
            .chain(self.dirs.iter().map(|(j, _)| j.clone()))
            .collect()
    }

    fn primary_paths(&self) -> BTreeSet<String> {
        self.files
            .values()
            .map(|(p, _)| p.clone())
            .chain(self.dirs.iter().map(|(_, p)| p.clone()))
            .collect()
    }
}

fn allow_missing() -> bool {
    std::env::var("BANLIEUE_ALLOW_MISSING_PEERS").as_deref() == Ok("1")
}

/// Reports a missing reader: a failure, or with BANLIEUE_ALLOW_MISSING_PEERS=1 a loud skip.
fn missing(what: &str) -> Option<PathBuf> {
    if allow_missing() {
        eprintln!("!!!! SKIPPING the {what} check: it is not installed; {SETUP_HINT}");
        None
    } else {
        panic!(
            "{what} is not installed; {SETUP_HINT} (or set BANLIEUE_ALLOW_MISSING_PEERS=1 to skip)"
        );
    }
}

/// The absolute path of a program on PATH (or the usual sbin directories, where blkid lives).
pub fn program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file());
    found.or_else(|| missing(name))
}

/// The tests' own venv with pycdlib.
pub fn venv_python() -> Option<PathBuf> {
    let cache = std::env::var_os("BANLIEUE_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/banlieue")
        });
    let python = cache.join("venv-iso/bin/python3");
    let usable = python.is_file()
        && Command::new(&python)
            .args(["-c", "import pycdlib"])
            .output()
            .is_ok_and(|o| o.status.success());
    if usable {
        Some(python)
    } else {
        missing("pycdlib (venv-iso)")
    }
}

/// Debian's python3 with the cloudinit package.
pub fn cloud_init_python() -> Option<PathBuf> {
    let python = PathBuf::from("/usr/bin/python3");
    let usable = Command::new(&python)
        .args(["-c", "import cloudinit.sources.DataSourceNoCloud"])
        .output()
        .is_ok_and(|o| o.status.success());
    if usable {
        Some(python)
    } else {
        missing("cloud-init (Debian package)")
    }
}

pub fn run(command: &mut Command) -> Output {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("start {command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed with {}:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

pub fn readers_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/readers")
}

/// How isoinfo prints a Joliet name: it converts to a one-byte charset (ISO 8859-1 in the C
/// locale) and prints `_` for characters that have no byte there.
fn isoinfo_spelling(name: &str) -> Vec<u8> {
    name.chars()
        .map(|c| u8::try_from(u32::from(c)).unwrap_or(b'_'))
        .collect()
}

fn latin1(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| char::from(b)).collect()
}

/// `isoinfo -f` (and `-J -f`) lists every path; `-x` extracts each file, byte-compared.
pub fn check_isoinfo(image: &Path, expected: &Expected) {
    let Some(isoinfo) = program("isoinfo") else {
        return;
    };
    let list = |joliet: bool| -> Vec<String> {
        let mut command = Command::new(&isoinfo);
        command.env("LC_ALL", "C").arg("-i").arg(image).arg("-f");
        if joliet {
            command.arg("-J");
        }
        let out = run(&mut command).stdout;
        let mut lines: Vec<String> = out
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .map(latin1)
            .collect();
        lines.sort();
        lines
    };
    let mut want_joliet: Vec<String> = expected
        .joliet_paths()
        .iter()
        .map(|p| latin1(&isoinfo_spelling(p)))
        .collect();
    want_joliet.sort();
    assert_eq!(list(true), want_joliet, "isoinfo -J -f");
    let want_primary: Vec<String> = expected.primary_paths().into_iter().collect();
    assert_eq!(list(false), want_primary, "isoinfo -f");

    for (joliet_path, (primary_path, data)) in &expected.files {
        let extract = |joliet: bool, path: OsString| -> Vec<u8> {
            let mut command = Command::new(&isoinfo);
            command.env("LC_ALL", "C").arg("-i").arg(image);
            if joliet {
                command.arg("-J");
            }
            run(command.arg("-x").arg(path)).stdout
        };
        // A name isoinfo cannot spell in one byte per character cannot be addressed through
        // it; the primary path reaches the same extent, and the other readers cover Joliet.
        if joliet_path.chars().all(|c| u32::from(c) <= 0xFF) {
            let got = extract(true, OsString::from_vec(isoinfo_spelling(joliet_path)));
            assert!(
                got == *data,
                "isoinfo -J -x {joliet_path}: {} bytes, want {}",
                got.len(),
                data.len()
            );
        }
        let got = extract(false, OsString::from(primary_path));
        assert!(
            got == *data,
            "isoinfo -x {primary_path}: {} bytes, want {}",
            got.len(),
            data.len()
        );
    }
}

/// Undoes xorriso's shell-safe quoting: `'it'"'"'s'` is `it's`.
fn xorriso_unquote(line: &str) -> String {
    let inner = line
        .strip_prefix('\'')
        .and_then(|l| l.strip_suffix('\''))
        .unwrap_or(line);
    inner.replace("'\"'\"'", "'")
}

/// Every file and directory under `root`, as `/relative/path`, with file contents.
pub fn read_dir_tree(root: &Path) -> (BTreeMap<String, Vec<u8>>, BTreeSet<String>) {
    let mut files = BTreeMap::new();
    let mut dirs = BTreeSet::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            let relative = format!("/{}", path.strip_prefix(root).unwrap().to_str().unwrap());
            if entry.file_type().unwrap().is_dir() {
                dirs.insert(relative);
                stack.push(path);
            } else {
                files.insert(relative, std::fs::read(&path).unwrap());
            }
        }
    }
    (files, dirs)
}

fn compare_extracted(reader: &str, root: &Path, expected: &Expected, primary: bool) {
    let (files, dirs) = read_dir_tree(root);
    let want_dirs: BTreeSet<String> = expected
        .dirs
        .iter()
        .map(|(j, p)| if primary { p.clone() } else { j.clone() })
        .collect();
    assert_eq!(dirs, want_dirs, "{reader}: directories");
    let got_names: BTreeSet<&String> = files.keys().collect();
    let want: BTreeMap<String, &Vec<u8>> = expected
        .files
        .iter()
        .map(|(j, (p, data))| (if primary { p.clone() } else { j.clone() }, data))
        .collect();
    assert_eq!(got_names, want.keys().collect(), "{reader}: files");
    for (path, data) in want {
        assert!(files[&path] == *data, "{reader}: contents of {path} differ");
    }
}

/// `xorriso -find` lists the tree; `-extract` copies it out, compared byte for byte. With no
/// Rock Ridge present xorriso shows the Joliet names.
pub fn check_xorriso(image: &Path, expected: &Expected) {
    let Some(xorriso) = program("xorriso") else {
        return;
    };
    let out = run(Command::new(&xorriso)
        .arg("-indev")
        .arg(image)
        .args(["-find", "/"]))
    .stdout;
    let listed: BTreeSet<String> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(xorriso_unquote)
        .collect();
    let mut want = expected.joliet_paths();
    want.insert("/".to_owned());
    assert_eq!(listed, want, "xorriso -find");

    let scratch = tempfile::tempdir().unwrap();
    let target = scratch.path().join("x");
    run(Command::new(&xorriso)
        .env("LC_ALL", "C.UTF-8")
        .args(["-osirrox", "on", "-indev"])
        .arg(image)
        .args(["-extract", "/"])
        .arg(&target));
    compare_extracted("xorriso -extract", &target, expected, false);
}

/// pycdlib opens the image (checking its structure as it parses), walks both hierarchies and
/// reads every file.
pub fn check_pycdlib(image: &Path, expected: &Expected) {
    let Some(python) = venv_python() else { return };
    let scratch = tempfile::tempdir().unwrap();
    let out = run(Command::new(python)
        .arg(readers_dir().join("pycdlib_read.py"))
        .arg(image)
        .arg(scratch.path()))
    .stdout;
    let report: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(
        report["volume_id"],
        expected.volume_id.as_str(),
        "pycdlib volume id"
    );
    for (hierarchy, primary) in [("joliet", false), ("iso9660", true)] {
        let listed: BTreeMap<String, u64> = report[hierarchy]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["path"].as_str().unwrap().to_owned(),
                    e["size"].as_u64().unwrap(),
                )
            })
            .collect();
        let mut want: BTreeMap<String, u64> = expected
            .files
            .iter()
            .map(|(j, (p, d))| (if primary { p.clone() } else { j.clone() }, d.len() as u64))
            .collect();
        for (j, p) in &expected.dirs {
            want.insert(if primary { p.clone() } else { j.clone() }, 0);
        }
        assert_eq!(listed, want, "pycdlib {hierarchy} listing");
        compare_extracted(
            &format!("pycdlib {hierarchy}"),
            &scratch.path().join(hierarchy),
            expected,
            primary,
        );
    }
}

/// `blkid -p` probes the image as udev would when cloud-init searches for LABEL=cidata.
pub fn check_blkid(image: &Path, label: &str) {
    let Some(blkid) = program("blkid") else {
        return;
    };
    let out = run(Command::new(blkid).arg("-p").arg(image)).stdout;
    let text = String::from_utf8_lossy(&out);
    assert!(text.contains("TYPE=\"iso9660\""), "blkid: {text}");
    assert!(
        text.contains(&format!(" LABEL=\"{label}\"")),
        "blkid: {text}"
    );
}

/// What cloud-init's NoCloud datasource made of a seed directory.
#[derive(Debug)]
pub struct NoCloudReport {
    pub instance_id: String,
    pub local_hostname: String,
    pub user_data: Vec<u8>,
    pub vendor_data: Vec<u8>,
    pub network_config: serde_json::Value,
}

pub fn nocloud_read(seed_dir: &Path) -> Option<NoCloudReport> {
    let python = cloud_init_python()?;
    let out = run(Command::new(python)
        .arg(readers_dir().join("nocloud_read.py"))
        .arg(seed_dir))
    .stdout;
    let report: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let bytes = |key: &str| -> Vec<u8> {
        let text = report[key].as_str().unwrap_or("");
        base64_decode(text)
    };
    Some(NoCloudReport {
        instance_id: report["instance_id"].as_str().unwrap().to_owned(),
        local_hostname: report["local_hostname"].as_str().unwrap().to_owned(),
        user_data: bytes("user_data"),
        vendor_data: bytes("vendor_data"),
        network_config: report["network_config"].clone(),
    })
}

fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    };
    let mut out = Vec::new();
    for chunk in text.as_bytes().chunks(4) {
        let digits: Vec<u32> = chunk
            .iter()
            .filter(|&&c| c != b'=')
            .map(|&c| value(c))
            .collect();
        let mut acc = 0u32;
        for (i, d) in digits.iter().enumerate() {
            acc |= d << (18 - 6 * i);
        }
        let bytes = acc.to_be_bytes();
        out.extend_from_slice(&bytes[1..digits.len()]);
    }
    out
}

/// Runs every tree reader on `image`.
pub fn check_all_readers(image_bytes: &[u8], expected: &Expected) {
    let scratch = tempfile::tempdir().unwrap();
    let image = scratch.path().join("image.iso");
    std::fs::write(&image, image_bytes).unwrap();
    check_isoinfo(&image, expected);
    check_xorriso(&image, expected);
    check_pycdlib(&image, expected);
    check_blkid(&image, &expected.volume_id);
}
