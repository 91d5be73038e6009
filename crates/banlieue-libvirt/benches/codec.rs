//! The XDR codec against libvirt's own C toolchain, in one run.
//!
//! Two workloads, each encode then decode of the same value on both sides:
//! - the reply of `REMOTE_PROC_CONNECT_LIST_ALL_DOMAINS` with 1,000 domains;
//! - a 256 KiB STREAM packet: length word and header through XDR, the body copied in and,
//!   on receipt, copied out to the reader's buffer, as libvirt does
//!   (`virNetMessageEncodePayloadRaw`, `virNetClientStreamRecvPacket`).
//!
//! The Rust side is measured by criterion; the C side (rpcgen + libtirpc, `-O2`) by a program
//! built from the same `.x` files that times the loop with `clock_gettime`. Before timing,
//! both sides' encodings are checked to be the same bytes. The last lines print `rust/c`.
//!
//! ```text
//! cargo bench -p banlieue-libvirt --bench codec
//! ```

#[path = "../tests/oracle/mod.rs"]
mod oracle;

use std::cell::RefCell;
use std::hint::black_box;
use std::path::Path;
use std::process::Command;
use std::rc::Rc;
use std::time::{Duration, Instant};

use banlieue_libvirt::packet::Packet;
use banlieue_libvirt::proto::net::{VirNetMessageHeader, VirNetMessageStatus, VirNetMessageType};
use banlieue_libvirt::proto::remote::{
    REMOTE_PROGRAM, REMOTE_PROTOCOL_VERSION, RemoteConnectListAllDomainsRet, RemoteNonnullDomain,
    RemoteProcedure,
};
use banlieue_libvirt::xdr::{BytesMut, Xdr};
use bytes::Bytes;
use criterion::Criterion;

const DOMAINS: usize = 1000;
const STREAM_BODY: usize = 256 * 1024;

/// The listing both sides encode: names, UUIDs and ids derived from the index.
fn listing() -> RemoteConnectListAllDomainsRet {
    RemoteConnectListAllDomainsRet {
        domains: (0..DOMAINS)
            .map(|i| RemoteNonnullDomain {
                name: format!("default-sandbox-pool-{i:04}"),
                uuid: std::array::from_fn(|j| (i * 31 + j * 7) as u8),
                id: i as i32 + 1,
            })
            .collect(),
        ret: DOMAINS as u32,
    }
}

fn stream_packet() -> Packet {
    Packet {
        header: VirNetMessageHeader {
            prog: REMOTE_PROGRAM,
            vers: REMOTE_PROTOCOL_VERSION,
            proc: RemoteProcedure::STORAGE_VOL_DOWNLOAD.0,
            r#type: VirNetMessageType::STREAM,
            serial: 7,
            status: VirNetMessageStatus::CONTINUE,
        },
        fds: None,
        body: Bytes::from(
            (0..STREAM_BODY)
                .map(|i| (i * 13) as u8)
                .collect::<Vec<u8>>(),
        ),
    }
}

const C_BENCH: &str = r#"
#define DOMAINS 1000
#define STREAM_BODY (256 * 1024)

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static remote_connect_list_all_domains_ret listing(void) {
    remote_connect_list_all_domains_ret v;
    v.domains.domains_len = DOMAINS;
    v.domains.domains_val = calloc(DOMAINS, sizeof(remote_nonnull_domain));
    for (int i = 0; i < DOMAINS; i++) {
        remote_nonnull_domain *d = &v.domains.domains_val[i];
        d->name = malloc(32);
        snprintf(d->name, 32, "default-sandbox-pool-%04d", i);
        for (int j = 0; j < VIR_UUID_BUFLEN; j++) d->uuid[j] = (char)(unsigned char)(i * 31 + j * 7);
        d->id = i + 1;
    }
    v.ret = DOMAINS;
    return v;
}

static unsigned char wire[4 * 1024 * 1024];
static unsigned char stream_body_store[STREAM_BODY + 4096];
static unsigned char *stream_body;
static unsigned char stream_dst_store[STREAM_BODY + 4096];
static unsigned char *stream_dst;

static u_int list_encode(remote_connect_list_all_domains_ret *v) {
    XDR x;
    xdrmem_create(&x, (char *)wire, sizeof wire, XDR_ENCODE);
    if (!xdr_remote_connect_list_all_domains_ret(&x, v)) { fputs("encode failed\n", stderr); exit(1); }
    u_int len = xdr_getpos(&x);
    xdr_destroy(&x);
    return len;
}

static void list_round(remote_connect_list_all_domains_ret *v) {
    u_int len = list_encode(v);
    remote_connect_list_all_domains_ret d;
    memset(&d, 0, sizeof d);
    XDR x;
    xdrmem_create(&x, (char *)wire, len, XDR_DECODE);
    if (!xdr_remote_connect_list_all_domains_ret(&x, &d)) { fputs("decode failed\n", stderr); exit(1); }
    xdr_destroy(&x);
    xdr_free((xdrproc_t)xdr_remote_connect_list_all_domains_ret, (char *)&d);
}

/* As libvirt: a placeholder length, the header, the raw body, then the real length. */
static u_int stream_encode(virNetMessageHeader *h) {
    XDR x;
    u_int len = 0;
    xdrmem_create(&x, (char *)wire, sizeof wire, XDR_ENCODE);
    if (!xdr_u_int(&x, &len) || !xdr_virNetMessageHeader(&x, h)) { fputs("encode failed\n", stderr); exit(1); }
    u_int off = xdr_getpos(&x);
    memcpy(wire + off, stream_body, STREAM_BODY);
    len = off + STREAM_BODY;
    xdr_setpos(&x, 0);
    if (!xdr_u_int(&x, &len)) { fputs("encode failed\n", stderr); exit(1); }
    xdr_destroy(&x);
    return len;
}

static void stream_round(virNetMessageHeader *h) {
    u_int total = stream_encode(h), len;
    virNetMessageHeader d;
    XDR x;
    xdrmem_create(&x, (char *)wire, total, XDR_DECODE);
    if (!xdr_u_int(&x, &len) || len != total || !xdr_virNetMessageHeader(&x, &d)) { fputs("decode failed\n", stderr); exit(1); }
    u_int off = xdr_getpos(&x);
    memcpy(stream_dst, wire + off, total - off);
    xdr_destroy(&x);
}

/* See `half_page_away` in codec.rs. */
static size_t half_page_away(uintptr_t src, uintptr_t store) {
    return (src + 2048 - store) & 4095;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc != 4) { fputs("usage: xdr_bench list|stream dump|ITERS REPEATS\n", stderr); return 2; }
    remote_connect_list_all_domains_ret v = listing();
    virNetMessageHeader h = { REMOTE_PROGRAM, REMOTE_PROTOCOL_VERSION, REMOTE_PROC_STORAGE_VOL_DOWNLOAD,
                              VIR_NET_STREAM, 7, VIR_NET_CONTINUE };
    stream_body = stream_body_store + half_page_away((uintptr_t)(wire + 28), (uintptr_t)stream_body_store);
    for (int i = 0; i < STREAM_BODY; i++) stream_body[i] = (unsigned char)(i * 13);
    stream_dst = stream_dst_store + half_page_away((uintptr_t)(wire + 28), (uintptr_t)stream_dst_store);
    int list = strcmp(argv[1], "list") == 0;
    if (strcmp(argv[2], "dump") == 0) {
        u_int len = list ? list_encode(&v) : stream_encode(&h);
        fwrite(wire, 1, len, stdout);
        return 0;
    }
    long iters = atol(argv[2]);
    int repeats = atoi(argv[3]);
    double *per_iter = calloc(repeats, sizeof(double));
    for (int w = 0; w < 2; w++) /* warm up caches and the allocator */
        for (long i = 0; i < iters; i++) list ? list_round(&v) : stream_round(&h);
    for (int r = 0; r < repeats; r++) {
        double t0 = now_ns();
        for (long i = 0; i < iters; i++) list ? list_round(&v) : stream_round(&h);
        per_iter[r] = (now_ns() - t0) / (double)iters;
    }
    qsort(per_iter, repeats, sizeof(double), cmp);
    printf("%.1f\n", per_iter[repeats / 2]);
    return 0;
}
"#;

fn c_output(bench: &Path, args: &[&str]) -> Vec<u8> {
    let out = Command::new(bench)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", bench.display()));
    assert!(
        out.status.success(),
        "{} {args:?} failed: {}",
        bench.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// The C loop's median ns per iteration over `repeats` runs of `iters`.
fn c_ns_per_iter(bench: &Path, case: &str, iters: u64, repeats: u32) -> f64 {
    let out = c_output(bench, &[case, &iters.to_string(), &repeats.to_string()]);
    String::from_utf8_lossy(&out)
        .trim()
        .parse()
        .expect("the C bench prints ns per iteration")
}

/// The offset into a buffer that puts it half a page away from `src` modulo 4 KiB.
/// A copy whose source and destination sit a few bytes apart modulo 4 KiB runs far slower
/// on x86 (4K aliasing); where the heap happens to place the buffers would otherwise decide
/// the result. Both programs place the body they send and the reader's buffer this way.
fn half_page_away(src: usize, store: usize) -> usize {
    (src + 2048).wrapping_sub(store) & 4095
}

/// Per-sample timings as criterion takes them, so the ratio uses criterion's own samples.
type Samples = Rc<RefCell<Vec<(u64, Duration)>>>;

/// The median ns per iteration of the last `n` samples (the earlier ones are warm-up).
fn median_ns(samples: &Samples, n: usize) -> Option<f64> {
    let s = samples.borrow();
    let mut per_iter: Vec<f64> = s[s.len().saturating_sub(n)..]
        .iter()
        .map(|(iters, d)| d.as_nanos() as f64 / *iters as f64)
        .collect();
    if per_iter.is_empty() {
        return None;
    }
    per_iter.sort_by(f64::total_cmp);
    Some(per_iter[per_iter.len() / 2])
}

const SAMPLE_SIZE: usize = 60;

fn main() {
    if !oracle::peers_available("the codec benchmark") {
        return;
    }
    let quick = std::env::args().any(|a| a == "--test");
    let inputs = oracle::inputs();
    let c = oracle::CProtocol::build(&inputs);
    let bench = c.program("xdr_bench", &format!("{}{C_BENCH}", c.includes()));

    let value = listing();
    let packet = stream_packet();
    let mut rust_list = BytesMut::new();
    value.encode(&mut rust_list).expect("encode listing");
    let mut rust_stream = BytesMut::new();
    packet.encode(&mut rust_stream).expect("encode packet");
    assert!(
        c_output(&bench, &["list", "dump", "0"]) == rust_list[..],
        "Rust and C encode the listing differently"
    );
    assert!(
        c_output(&bench, &["stream", "dump", "0"]) == rust_stream[..],
        "Rust and C encode the stream packet differently"
    );

    let mut criterion = Criterion::default()
        .sample_size(SAMPLE_SIZE)
        .configure_from_args();
    let list_samples = Samples::default();
    let stream_samples = Samples::default();

    {
        let samples = list_samples.clone();
        let mut buf = BytesMut::with_capacity(rust_list.len());
        criterion.bench_function("list_all_domains_1000/encode+decode", |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    buf.clear();
                    black_box(&value).encode(&mut buf).expect("encode");
                    let decoded = RemoteConnectListAllDomainsRet::from_bytes(&buf).expect("decode");
                    black_box(decoded);
                }
                let elapsed = start.elapsed();
                samples.borrow_mut().push((iters, elapsed));
                elapsed
            })
        });
    }
    {
        let samples = stream_samples.clone();
        let mut buf = BytesMut::with_capacity(rust_stream.len());
        // Where the body sits in the wire buffer: the same place every iteration.
        buf.clear();
        packet.encode(&mut buf).expect("encode");
        let src = Packet::decode(buf.split().freeze())
            .expect("decode")
            .body
            .as_ptr() as usize;
        let mut body_store = vec![0u8; STREAM_BODY + 4096];
        let off = half_page_away(src, body_store.as_ptr() as usize);
        body_store[off..off + STREAM_BODY].copy_from_slice(&packet.body);
        let packet = Packet {
            body: Bytes::from(body_store).slice(off..off + STREAM_BODY),
            ..packet.clone()
        };
        let mut dst_store = vec![0u8; STREAM_BODY + 4096];
        let off = half_page_away(src, dst_store.as_ptr() as usize);
        let dst = &mut dst_store[off..off + STREAM_BODY];
        criterion.bench_function("stream_packet_256k/encode+decode", |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    buf.clear();
                    black_box(&packet).encode(&mut buf).expect("encode");
                    let received = Packet::decode(buf.split().freeze()).expect("decode");
                    dst.copy_from_slice(&received.body);
                    black_box(&*dst);
                }
                let elapsed = start.elapsed();
                samples.borrow_mut().push((iters, elapsed));
                elapsed
            })
        });
    }
    criterion.final_summary();

    let (repeats, scale) = if quick { (1, 0) } else { (21, 1) };
    let cases = [
        (
            "list_all_domains_1000",
            "list",
            &list_samples,
            200 * scale + 1,
        ),
        (
            "stream_packet_256k",
            "stream",
            &stream_samples,
            2000 * scale + 1,
        ),
    ];
    println!();
    for (name, case, samples, iters) in cases {
        let c_ns = c_ns_per_iter(&bench, case, iters, repeats);
        match median_ns(samples, SAMPLE_SIZE) {
            Some(rust_ns) => println!(
                "{name} encode+decode: rust {rust_ns:.0} ns, c (rpcgen/libtirpc -O2) {c_ns:.0} ns, rust/c = {:.2}",
                rust_ns / c_ns
            ),
            None => println!("{name}: not run (filtered out)"),
        }
    }
}
