//! The XDR oracle's C side: libvirt's own toolchain (rpcgen from rpcsvc-proto, libtirpc) built
//! from the same `.x` files the Rust code is generated from.
//!
//! Shared by the oracle test and the codec benchmark. Builds land in a cache directory under
//! the target directory, keyed by a hash of everything that goes into them, and are published
//! by an atomic rename so concurrent test and bench runs never see half-built files.

#![allow(dead_code)] // the test and the benchmark each use part of this module

use std::collections::hash_map::DefaultHasher;
use std::fmt::Write as _;
use std::hash::{Hash, Hasher};
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

use banlieue_xdrgen::model::Model;
use banlieue_xdrgen::{HEADER_CONSTANTS, Input};

pub use banlieue_libvirt::proto::PROTOCOL_FILES;

/// Files whose C code needs `remote_protocol.h` for the types they borrow.
const USES_REMOTE: &[&str] = &["qemu_protocol.x", "lxc_protocol.x"];

/// The flags libvirt builds its XDR code with, give or take warnings.
const CFLAGS: &[&str] = &["-O2", "-I/usr/include/tirpc"];
const LIBS: &[&str] = &["-ltirpc"];

pub fn protocol_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("protocol")
}

pub fn inputs() -> Vec<Input> {
    let dir = protocol_dir();
    PROTOCOL_FILES
        .iter()
        .map(|f| {
            let path = dir.join(f);
            Input::from_path(&path).unwrap_or_else(|e| {
                panic!(
                    "read {}: {e} (run `protocol/fetch` or `scripts/setup`)",
                    path.display()
                )
            })
        })
        .collect()
}

pub fn model(inputs: &[Input]) -> Model {
    banlieue_xdrgen::model(inputs).expect("libvirt's protocol files resolve")
}

/// Whether rpcgen, gcc and libtirpc's headers are installed. Missing peers fail the caller
/// unless `BANLIEUE_ALLOW_MISSING_PEERS=1`, which turns the failure into a loud skip.
pub fn peers_available(what: &str) -> bool {
    let mut missing = Vec::new();
    for tool in ["rpcgen", "gcc"] {
        let found = Command::new(tool)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok();
        if !found {
            missing.push(tool.to_string());
        }
    }
    if !Path::new("/usr/include/tirpc/rpc/xdr.h").exists() {
        missing.push("libtirpc headers (/usr/include/tirpc)".into());
    }
    if missing.is_empty() {
        return true;
    }
    let message = format!(
        "{what} needs {}: run `scripts/setup` (it installs rpcsvc-proto and libtirpc-dev)",
        missing.join(", ")
    );
    if std::env::var("BANLIEUE_ALLOW_MISSING_PEERS").as_deref() == Ok("1") {
        eprintln!("\n!!! SKIPPED: {message}\n");
        false
    } else {
        panic!("{message}");
    }
}

/// `oracle_consts.h`: the constants libvirt's `.x` files take from libvirt's C headers.
pub fn consts_header() -> String {
    let mut h = String::from(
        "/* Constants libvirt's .x files take from libvirt's headers. */\n\
         #ifndef BANLIEUE_ORACLE_CONSTS_H\n#define BANLIEUE_ORACLE_CONSTS_H\n",
    );
    for (name, value) in HEADER_CONSTANTS {
        // TRUE and FALSE come from <rpc/types.h> already.
        writeln!(h, "#ifndef {name}\n#define {name} ({value})\n#endif").unwrap();
    }
    h.push_str("#endif\n");
    h
}

/// A `.x` file made fit for rpcgen outside libvirt's tree: libvirt's `%` pass-through lines
/// include private headers, so they are replaced by ours.
pub fn oracle_x_source(file: &str, source: &str) -> String {
    let mut out = String::from("%#include \"oracle_consts.h\"\n");
    if USES_REMOTE.contains(&file) {
        out.push_str("%#include \"remote_protocol.h\"\n");
    }
    for line in source.lines() {
        // Keep the line count so rpcgen's messages point at the original lines.
        if line.starts_with('%') {
            out.push('\n');
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

fn stem(file: &str) -> &str {
    file.trim_end_matches(".x")
}

fn hash_of(parts: &[&str]) -> String {
    let mut h = DefaultHasher::new();
    parts.hash(&mut h);
    format!("{:016x}", h.finish())
}

fn run(cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("run {cmd:?}: {e} (run `scripts/setup`)"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn cache_root() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("xdr-oracle")
}

/// Builds into a private directory, then publishes it under `key` by renaming; a build
/// someone else published first wins and ours is dropped.
fn cached_dir(key: &str, build: impl FnOnce(&Path)) -> PathBuf {
    let root = cache_root();
    let done = root.join(key);
    if done.join(".complete").exists() {
        return done;
    }
    static BUILDS: AtomicUsize = AtomicUsize::new(0);
    let tmp = root.join(format!(
        "{key}.tmp-{}-{}",
        std::process::id(),
        BUILDS.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).expect("create oracle build directory");
    build(&tmp);
    std::fs::write(tmp.join(".complete"), b"").expect("mark oracle build complete");
    if std::fs::rename(&tmp, &done).is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
        assert!(
            done.join(".complete").exists(),
            "publish oracle build {}",
            done.display()
        );
    }
    done
}

/// rpcgen's headers and compiled XDR routines for every protocol file.
#[derive(Debug, Clone)]
pub struct CProtocol {
    pub dir: PathBuf,
    /// Header file names, in dependency order.
    pub headers: Vec<String>,
    pub objects: Vec<PathBuf>,
}

impl CProtocol {
    pub fn build(inputs: &[Input]) -> CProtocol {
        let header = consts_header();
        let sources: Vec<(String, String)> = inputs
            .iter()
            .map(|i| (i.file.clone(), oracle_x_source(&i.file, &i.source)))
            .collect();
        let mut parts: Vec<&str> = vec![&header];
        parts.extend(CFLAGS);
        for (f, s) in &sources {
            parts.push(f);
            parts.push(s);
        }
        let dir = cached_dir(&format!("protocol-{}", hash_of(&parts)), |dir| {
            std::fs::write(dir.join("oracle_consts.h"), &header).expect("write oracle_consts.h");
            for (file, source) in &sources {
                let s = stem(file);
                std::fs::write(dir.join(file), source).expect("write .x copy");
                run(Command::new("rpcgen").current_dir(dir).args([
                    "-h",
                    "-o",
                    &format!("{s}.h"),
                    file,
                ]));
                run(Command::new("rpcgen").current_dir(dir).args([
                    "-c",
                    "-o",
                    &format!("{s}_xdr.c"),
                    file,
                ]));
            }
            // The files are independent translation units: compile them side by side.
            let children: Vec<_> = sources
                .iter()
                .map(|(file, _)| {
                    let s = stem(file);
                    let mut cmd = Command::new("gcc");
                    cmd.current_dir(dir).args(CFLAGS).args([
                        "-I.",
                        "-c",
                        &format!("{s}_xdr.c"),
                        "-o",
                        &format!("{s}_xdr.o"),
                    ]);
                    (format!("{cmd:?}"), cmd.output())
                })
                .collect();
            for (cmd, out) in children {
                let out = out.unwrap_or_else(|e| panic!("run {cmd}: {e}"));
                assert!(
                    out.status.success(),
                    "{cmd} failed:\n{}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        });
        CProtocol {
            headers: inputs
                .iter()
                .map(|i| format!("{}.h", stem(&i.file)))
                .collect(),
            objects: inputs
                .iter()
                .map(|i| dir.join(format!("{}_xdr.o", stem(&i.file))))
                .collect(),
            dir,
        }
    }

    /// `#include` lines for every generated header.
    pub fn includes(&self) -> String {
        let mut s = String::from(
            "#include <stdint.h>\n#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n\
             #include <time.h>\n#include <rpc/rpc.h>\n",
        );
        for h in &self.headers {
            writeln!(s, "#include \"{h}\"").unwrap();
        }
        s
    }

    /// Compiles and links a C program against the protocol's XDR routines.
    pub fn program(&self, name: &str, source: &str) -> PathBuf {
        let objects: Vec<String> = self
            .objects
            .iter()
            .map(|o| o.display().to_string())
            .collect();
        let dir_key = self.dir.display().to_string();
        let key = hash_of(&[name, source, &dir_key]);
        let dir = cached_dir(&format!("{name}-{key}"), |dir| {
            std::fs::write(dir.join(format!("{name}.c")), source).expect("write C program");
            run(Command::new("gcc")
                .current_dir(dir)
                .args(CFLAGS)
                .arg("-I")
                .arg(&self.dir)
                .args([&format!("{name}.c"), "-o", name])
                .args(&objects)
                .args(LIBS));
        });
        dir.join(name)
    }
}

fn c_ident(name: &str) -> String {
    format!("oracle_{name}")
}

/// The transcoding driver's C source: for every type of the model, decode with rpcgen's
/// routine, check every byte was consumed, encode again, free.
///
/// Requests on stdin: `[u32 be name_len][name][u32 be len][bytes]`. Replies on stdout:
/// `[u32 be status][u32 be len][bytes]`, status as [`Status`].
pub fn driver_source(c: &CProtocol, model: &Model) -> String {
    let mut names: Vec<&str> = model
        .modules
        .iter()
        .flat_map(|m| m.types.iter().map(String::as_str))
        .collect();
    // bsearch in the driver relies on strcmp order, which is byte order.
    names.sort_unstable();
    let mut s = c.includes();
    s.push_str("\ntypedef bool_t (*oracle_proc)(XDR *, void *);\n");
    s.push_str("struct oracle_type { const char *name; oracle_proc proc; size_t size; };\n\n");
    // A wrapper per type: rpcgen passes array typedefs by value (a decayed pointer) and
    // everything else by pointer, and `void *` converts to either.
    for n in &names {
        writeln!(
            s,
            "static bool_t {}(XDR *x, void *o) {{ return xdr_{n}(x, o); }}",
            c_ident(n)
        )
        .unwrap();
    }
    s.push_str("\nstatic const struct oracle_type oracle_types[] = {\n");
    for n in &names {
        writeln!(s, "    {{\"{n}\", {}, sizeof({n})}},", c_ident(n)).unwrap();
    }
    s.push_str("};\n");
    s.push_str(DRIVER_MAIN);
    s
}

const DRIVER_MAIN: &str = r#"
static int by_name(const void *key, const void *elem) {
    return strcmp((const char *)key, ((const struct oracle_type *)elem)->name);
}

static int read_u32(uint32_t *v) {
    unsigned char b[4];
    if (fread(b, 1, 4, stdin) != 4) return 0;
    *v = ((uint32_t)b[0] << 24) | ((uint32_t)b[1] << 16) | ((uint32_t)b[2] << 8) | b[3];
    return 1;
}

static void write_u32(uint32_t v) {
    unsigned char b[4] = {v >> 24, v >> 16, v >> 8, v};
    fwrite(b, 1, 4, stdout);
}

static void *grow(void *p, size_t *cap, size_t want) {
    if (want <= *cap) return p;
    *cap = want;
    p = realloc(p, want);
    if (!p) { perror("realloc"); exit(70); }
    return p;
}

int main(void) {
    char name[512];
    unsigned char *in = NULL, *out = NULL;
    size_t in_cap = 0, out_cap = 0;
    uint32_t name_len, len;
    in = grow(in, &in_cap, 1);
    while (read_u32(&name_len)) {
        if (name_len >= sizeof name || fread(name, 1, name_len, stdin) != name_len) return 65;
        name[name_len] = 0;
        if (!read_u32(&len)) return 65;
        in = grow(in, &in_cap, (size_t)len + 1);
        if (fread(in, 1, len, stdin) != len) return 65;
        const struct oracle_type *t = bsearch(name, oracle_types,
            sizeof oracle_types / sizeof oracle_types[0], sizeof oracle_types[0], by_name);
        uint32_t status, out_len = 0;
        if (!t) {
            status = 1;
        } else {
            void *obj = calloc(1, t->size);
            XDR dec, enc, fre;
            xdrmem_create(&dec, (char *)in, len, XDR_DECODE);
            if (!t->proc(&dec, obj)) {
                status = 2;
            } else if (xdr_getpos(&dec) != len) {
                status = 3;
            } else {
                /* Room for more than the input, so an encoding that grows shows up as
                   different bytes rather than as a failure. */
                out = grow(out, &out_cap, 2 * (size_t)len + 64);
                xdrmem_create(&enc, (char *)out, out_cap, XDR_ENCODE);
                if (!t->proc(&enc, obj)) {
                    status = 4;
                } else {
                    status = 0;
                    out_len = xdr_getpos(&enc);
                }
                xdr_destroy(&enc);
            }
            xdr_destroy(&dec);
            fre.x_op = XDR_FREE;
            t->proc(&fre, obj);
            free(obj);
        }
        write_u32(status);
        write_u32(out_len);
        if (out_len) fwrite(out, 1, out_len, stdout);
    }
    fflush(stdout);
    return 0;
}
"#;

/// The driver's verdict on one value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok,
    UnknownType,
    DecodeFailed,
    NotAllConsumed,
    EncodeFailed,
    Other(u32),
}

impl From<u32> for Status {
    fn from(v: u32) -> Status {
        match v {
            0 => Status::Ok,
            1 => Status::UnknownType,
            2 => Status::DecodeFailed,
            3 => Status::NotAllConsumed,
            4 => Status::EncodeFailed,
            n => Status::Other(n),
        }
    }
}

/// Sends every request to one driver process and returns its replies in order. A writer
/// thread feeds stdin while this thread drains stdout, so neither pipe can fill up and stall.
pub fn transcode_in_c(driver: &Path, requests: &[(&str, &[u8])]) -> Vec<(Status, Vec<u8>)> {
    let mut child = Command::new(driver)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", driver.display()));
    let stdin = child.stdin.take().expect("piped stdin");
    let stdout = child.stdout.take().expect("piped stdout");
    let replies = std::thread::scope(|scope| {
        scope.spawn(move || {
            let mut w = BufWriter::new(stdin);
            for (name, bytes) in requests {
                w.write_all(&(name.len() as u32).to_be_bytes()).unwrap();
                w.write_all(name.as_bytes()).unwrap();
                w.write_all(&(bytes.len() as u32).to_be_bytes()).unwrap();
                w.write_all(bytes).unwrap();
            }
            w.flush().unwrap();
        });
        let mut r = BufReader::new(stdout);
        let mut word = [0u8; 4];
        let mut replies = Vec::with_capacity(requests.len());
        for _ in requests {
            r.read_exact(&mut word).expect("read driver status");
            let status = Status::from(u32::from_be_bytes(word));
            r.read_exact(&mut word).expect("read driver length");
            let mut bytes = vec![0; u32::from_be_bytes(word) as usize];
            r.read_exact(&mut bytes).expect("read driver bytes");
            replies.push((status, bytes));
        }
        replies
    });
    let status = child.wait().expect("wait for driver");
    assert!(
        status.success(),
        "driver {} exited with {status}",
        driver.display()
    );
    replies
}

/// Hex with offsets, 16 bytes a line, for failure messages.
pub fn hex(bytes: &[u8]) -> String {
    let mut s = String::new();
    for (i, chunk) in bytes.chunks(16).enumerate() {
        write!(s, "{:06x}:", i * 16).unwrap();
        for b in chunk {
            write!(s, " {b:02x}").unwrap();
        }
        s.push('\n');
    }
    s
}
