//! `banlieue cidata`, exercised through its clap definition and run function (the module lives
//! in the binary crate; it is compiled here as well so the crate that owns the format tests
//! its command line too).

#[path = "../../banlieue/src/cidata.rs"]
mod cidata;
mod common;

use std::process::{Command, ExitCode};

use clap::Parser;
use common::{nocloud_read, program, run};

#[derive(Parser, Debug)]
#[command(name = "banlieue cidata")]
struct Cli {
    #[command(flatten)]
    args: cidata::CidataArgs,
}

fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
    Cli::try_parse_from(std::iter::once("banlieue cidata").chain(args.iter().copied()))
}

#[test]
fn writes_a_seed_cloud_init_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let user_data = dir.path().join("user-data.yaml");
    std::fs::write(&user_data, "#cloud-config\nhostname: x\n").unwrap();
    let network = dir.path().join("net.yaml");
    std::fs::write(&network, "version: 2\n").unwrap();
    let output = dir.path().join("seed.iso");
    let cli = parse(&[
        "--user-data",
        user_data.to_str().unwrap(),
        "--network-config",
        network.to_str().unwrap(),
        "--instance-id",
        "f81d4fae-7dec-11d0-a765-00a0c91e6bf6",
        "--hostname",
        "default-web-0",
        "--timestamp",
        "1704164645",
        "-o",
        output.to_str().unwrap(),
    ])
    .unwrap();
    assert_eq!(cidata::run(&cli.args), ExitCode::SUCCESS);
    let first = std::fs::read(&output).unwrap();
    assert_eq!(cidata::run(&cli.args), ExitCode::SUCCESS);
    assert_eq!(
        std::fs::read(&output).unwrap(),
        first,
        "same inputs, same bytes"
    );

    let Some(xorriso) = program("xorriso") else {
        return;
    };
    let extracted = dir.path().join("extracted");
    run(Command::new(xorriso)
        .args(["-osirrox", "on", "-indev"])
        .arg(&output)
        .args(["-extract", "/"])
        .arg(&extracted));
    let Some(report) = nocloud_read(&extracted) else {
        return;
    };
    assert_eq!(report.instance_id, "f81d4fae-7dec-11d0-a765-00a0c91e6bf6");
    assert_eq!(report.local_hostname, "default-web-0");
    assert_eq!(report.user_data, b"#cloud-config\nhostname: x\n");
}

#[test]
fn unreadable_input_exits_1_and_leaves_no_output() {
    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().join("seed.iso");
    let cli = parse(&[
        "--user-data",
        dir.path().join("missing").to_str().unwrap(),
        "--instance-id",
        "i",
        "--hostname",
        "h",
        "-o",
        output.to_str().unwrap(),
    ])
    .unwrap();
    assert_eq!(cidata::run(&cli.args), ExitCode::FAILURE);
    assert!(!output.exists());
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "no temporary left behind"
    );
}

#[test]
fn usage_errors_are_clap_exit_2() {
    let err = parse(&["--instance-id", "i", "--hostname", "h", "-o", "x.iso"]).unwrap_err();
    assert_eq!(err.exit_code(), 2, "{err}");
    let err = parse(&["--user-data", "u", "--instance-id", "i", "--hostname", "h"]).unwrap_err();
    assert_eq!(err.exit_code(), 2, "{err}");
}
