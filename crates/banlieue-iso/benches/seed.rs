//! A NoCloud seed with 64 KiB of user-data, built in process, against `genisoimage` on the
//! same files in the same run. Prints both medians and their ratio after criterion's report.
//!
//!     cargo bench -p banlieue-iso --bench seed

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use banlieue_iso::{NoCloudSeed, Timestamp};
use criterion::Criterion;

const USER_DATA_LEN: usize = 64 * 1024;

fn user_data() -> Vec<u8> {
    let line = b"# padding line for a 64 KiB #cloud-config payload ............\n";
    let mut user_data = b"#cloud-config\n".to_vec();
    while user_data.len() < USER_DATA_LEN {
        user_data.extend_from_slice(line);
    }
    user_data.truncate(USER_DATA_LEN);
    user_data
}

fn seed() -> NoCloudSeed {
    NoCloudSeed::new("f81d4fae-7dec-11d0-a765-00a0c91e6bf6", "default-web-0")
        .with_user_data(user_data())
        .with_timestamp(Timestamp::from_unix_seconds(1_704_164_645).unwrap_or_default())
}

fn genisoimage() -> Option<PathBuf> {
    ["/usr/bin/genisoimage", "/bin/genisoimage"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

/// Writes the seed's files for genisoimage and returns its argument list.
fn genisoimage_args(dir: &Path, seed: &NoCloudSeed) -> Vec<String> {
    let files = dir.join("files");
    std::fs::create_dir_all(&files).expect("create the input directory");
    let meta_data = seed.meta_data().expect("valid meta-data");
    std::fs::write(files.join("meta-data"), meta_data).expect("write meta-data");
    std::fs::write(files.join("user-data"), user_data()).expect("write user-data");
    [
        "-quiet",
        "-volid",
        "cidata",
        "-joliet",
        "-rock",
        "-o",
        &dir.join("seed.iso").to_string_lossy(),
        &files.to_string_lossy(),
    ]
    .map(str::to_owned)
    .to_vec()
}

fn run_genisoimage(program: &Path, args: &[String]) {
    let status = Command::new(program)
        .args(args)
        .status()
        .expect("start genisoimage");
    assert!(status.success(), "genisoimage failed: {status}");
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn main() {
    let seed = seed();
    let scratch = tempfile::tempdir().expect("create a scratch directory");
    let peer = genisoimage();
    let args = genisoimage_args(scratch.path(), &seed);

    let mut criterion = Criterion::default().configure_from_args();
    let mut group = criterion.benchmark_group("seed_64k_user_data");
    group.bench_function("banlieue_iso", |b| {
        b.iter(|| black_box(seed.to_bytes().expect("build the seed")))
    });
    if let Some(program) = &peer {
        group.sample_size(20);
        group.bench_function("genisoimage", |b| {
            b.iter(|| run_genisoimage(program, &args))
        });
    }
    group.finish();
    criterion.final_summary();

    let Some(program) = peer else {
        eprintln!("genisoimage is not installed; run scripts/setup iso-readers for the comparison");
        return;
    };
    let in_process = median(
        (0..2000)
            .map(|_| {
                let start = Instant::now();
                black_box(seed.to_bytes().expect("build the seed"));
                start.elapsed()
            })
            .collect(),
    );
    let subprocess = median(
        (0..30)
            .map(|_| {
                let start = Instant::now();
                run_genisoimage(&program, &args);
                start.elapsed()
            })
            .collect(),
    );
    println!(
        "seed with 64 KiB user-data: banlieue-iso {:.1} µs, genisoimage {:.1} µs, ratio {:.0}x",
        in_process.as_secs_f64() * 1e6,
        subprocess.as_secs_f64() * 1e6,
        subprocess.as_secs_f64() / in_process.as_secs_f64()
    );
}
