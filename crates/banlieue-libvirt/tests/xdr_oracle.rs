//! The XDR oracle: libvirt's own C toolchain (rpcgen + libtirpc), built from the same `.x`
//! files, must agree byte for byte with the generated Rust code.
//!
//! For every type of every program, random valid encodings are decoded and re-encoded by the
//! Rust code and by rpcgen's C code; both must give back the input. So the Rust bytes are the
//! C bytes, Rust decodes what C encodes, and C decodes what Rust encodes.

mod oracle;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use banlieue_libvirt::proto::{self, net, remote};
use banlieue_libvirt::xdr::Xdr;
use banlieue_xdrgen::Input;
use banlieue_xdrgen::model::Model;
use banlieue_xdrgen::sample::{self, Limits, SplitMix64};

use oracle::{CProtocol, Status};

/// Values per type; `BANLIEUE_ORACLE_VALUES` raises it for a deeper run.
fn values_per_type() -> u64 {
    std::env::var("BANLIEUE_ORACLE_VALUES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100)
}

/// A seed per type and index that stays the same across runs and machines (FNV-1a of the
/// name, then the index), so a failure names a value that can be made again.
fn seed(name: &str, index: u64) -> u64 {
    let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    h ^ index.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

struct Case {
    name: String,
    seed: u64,
    bytes: Vec<u8>,
}

/// The C transcoding driver, built once per process.
fn driver(inputs: &[Input], model: &Model) -> &'static Path {
    static DRIVER: OnceLock<PathBuf> = OnceLock::new();
    DRIVER.get_or_init(|| {
        let c = CProtocol::build(inputs);
        c.program("xdr_driver", &oracle::driver_source(&c, model))
    })
}

const MAX_REPORTED: usize = 20;

#[test]
fn rust_and_rpcgen_agree_on_every_type() {
    if !oracle::peers_available("the XDR oracle") {
        return;
    }
    let inputs = oracle::inputs();
    let model = oracle::model(&inputs);
    let per_type = values_per_type();

    let mut cases = Vec::new();
    let mut per_module = Vec::new();
    for module in &model.modules {
        per_module.push((module.name.clone(), module.types.len()));
        for name in &module.types {
            for i in 0..per_type {
                let seed = seed(name, i);
                let mut bytes = Vec::new();
                assert!(
                    sample::encode_named(
                        &model,
                        name,
                        &mut SplitMix64(seed),
                        Limits::default(),
                        &mut bytes
                    ),
                    "{name} is in the model"
                );
                cases.push(Case {
                    name: name.clone(),
                    seed,
                    bytes,
                });
            }
        }
    }

    let mut failures = Vec::new();
    for case in &cases {
        match proto::transcode(&case.name, &case.bytes) {
            Some(Ok(out)) if out[..] == case.bytes[..] => {}
            other => failures.push(format!(
                "Rust {} seed {:#018x}: {}\ninput:\n{}",
                case.name,
                case.seed,
                match other {
                    None => "no such type".to_string(),
                    Some(Err(e)) => format!("decode/encode failed: {e}"),
                    Some(Ok(out)) => format!("re-encoded differently:\n{}", oracle::hex(&out)),
                },
                oracle::hex(&case.bytes)
            )),
        }
    }

    let driver = driver(&inputs, &model);
    let requests: Vec<(&str, &[u8])> = cases
        .iter()
        .map(|c| (c.name.as_str(), c.bytes.as_slice()))
        .collect();
    let replies = oracle::transcode_in_c(driver, &requests);
    for (case, (status, out)) in cases.iter().zip(&replies) {
        if *status != Status::Ok || out[..] != case.bytes[..] {
            failures.push(format!(
                "C {} seed {:#018x}: {status:?}\ninput:\n{}C output:\n{}",
                case.name,
                case.seed,
                oracle::hex(&case.bytes),
                oracle::hex(out)
            ));
        }
    }

    let types: usize = per_module.iter().map(|(_, n)| n).sum();
    let bytes: usize = cases.iter().map(|c| c.bytes.len()).sum();
    eprintln!(
        "xdr oracle: {types} types x {per_type} values = {} cases ({bytes} bytes), \
         checked by Rust and by rpcgen/libtirpc",
        cases.len()
    );
    for (module, n) in &per_module {
        eprintln!("xdr oracle:   {module}: {n} types");
    }
    assert!(
        failures.is_empty(),
        "{} of {} checks failed; the first {}:\n{}",
        failures.len(),
        2 * cases.len(),
        failures.len().min(MAX_REPORTED),
        failures[..failures.len().min(MAX_REPORTED)].join("\n")
    );
    eprintln!("xdr oracle: all {} checks passed", 2 * cases.len());
}

/// Values built in Rust, encoded by the generated code, fed to C: identical bytes come back.
#[test]
fn hand_built_rust_values_survive_c() {
    if !oracle::peers_available("the XDR oracle") {
        return;
    }
    let inputs = oracle::inputs();
    let model = oracle::model(&inputs);
    let driver = driver(&inputs, &model);

    let domain = remote::RemoteNonnullDomain {
        name: "default-sandbox-7f3a".into(),
        uuid: *b"\x6f\x1c\x2e\x01\x9a\x44\x4b\x70\x8e\x11\x02\xc3\xd4\xe5\xf6\x07",
        id: 42,
    };
    let info = remote::RemoteDomainGetInfoRet {
        state: 1,
        max_mem: 4 << 20,
        memory: 2 << 20,
        nr_virt_cpu: 4,
        cpu_time: 1_234_567_890_123,
    };
    let listing = remote::RemoteConnectListAllDomainsRet {
        domains: vec![
            domain.clone(),
            remote::RemoteNonnullDomain {
                name: "é€".into(),
                uuid: [0xff; 16],
                id: -1,
            },
        ],
        ret: 2,
    };
    let error = net::VirNetMessageError {
        code: 42,
        domain: 10,
        message: Some("Domain not found: no domain with matching name 'x'".into()),
        level: 2,
        dom: None,
        str1: Some("x".into()),
        str2: None,
        str3: Some(String::new()),
        int1: -1,
        int2: 0,
        net: None,
    };
    let header = net::VirNetMessageHeader {
        prog: 0x2000_8086,
        vers: 1,
        proc: 301,
        r#type: net::VirNetMessageType::REPLY,
        serial: 7,
        status: net::VirNetMessageStatus::OK,
    };
    let values: Vec<(&str, Vec<u8>)> = vec![
        ("remote_nonnull_domain", bytes_of(&domain)),
        ("remote_domain_get_info_ret", bytes_of(&info)),
        ("remote_connect_list_all_domains_ret", bytes_of(&listing)),
        ("virNetMessageError", bytes_of(&error)),
        ("virNetMessageHeader", bytes_of(&header)),
    ];
    let requests: Vec<(&str, &[u8])> = values.iter().map(|(n, b)| (*n, b.as_slice())).collect();
    let replies = oracle::transcode_in_c(driver, &requests);
    for ((name, bytes), (status, out)) in values.iter().zip(&replies) {
        assert_eq!(
            *status,
            Status::Ok,
            "C rejected {name}:\n{}",
            oracle::hex(bytes)
        );
        assert_eq!(
            out,
            bytes,
            "C re-encoded {name} differently:\nRust:\n{}C:\n{}",
            oracle::hex(bytes),
            oracle::hex(out)
        );
    }
    eprintln!(
        "xdr oracle: {} hand-built values identical in C",
        values.len()
    );
}

fn bytes_of<T: Xdr>(v: &T) -> Vec<u8> {
    v.to_bytes().expect("encode").to_vec()
}

/// The oracle has teeth: input the C code must not reproduce is reported as such.
#[test]
fn driver_reports_disagreement() {
    if !oracle::peers_available("the XDR oracle") {
        return;
    }
    let inputs = oracle::inputs();
    let model = oracle::model(&inputs);
    let driver = driver(&inputs, &model);
    let good = bytes_of(&remote::RemoteNonnullDomain {
        name: "a".into(),
        uuid: [7; 16],
        id: 1,
    });
    let mut trailing = good.clone();
    trailing.extend_from_slice(&[0, 0, 0, 0]);
    // `unsigned char state` of 0x101 decodes as 1 (xdr_u_char truncates) and encodes as 1.
    let mut wide_char = vec![0, 0, 1, 1];
    wide_char.resize(4 + 8 + 8 + 4 + 8, 0);
    let mut narrowed = wide_char.clone();
    narrowed[2] = 0;
    let requests: Vec<(&str, &[u8])> = vec![
        ("remote_nonnull_domain", &good),
        ("remote_nonnull_domain", &good[..good.len() - 1]),
        ("remote_nonnull_domain", &trailing),
        ("remote_domain_get_info_ret", &wide_char),
        ("no_such_type", &good),
    ];
    let replies = oracle::transcode_in_c(driver, &requests);
    let statuses: Vec<Status> = replies.iter().map(|(s, _)| *s).collect();
    assert_eq!(
        statuses,
        [
            Status::Ok,
            Status::DecodeFailed,
            Status::NotAllConsumed,
            Status::Ok,
            Status::UnknownType
        ]
    );
    assert_eq!(replies[0].1, good);
    assert_eq!(replies[3].1, narrowed);
}
