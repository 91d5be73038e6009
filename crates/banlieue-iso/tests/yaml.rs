//! meta-data values round-trip through cloud-init's own YAML loading as the same strings.

mod common;

use std::io::Write as _;
use std::process::{Command, Stdio};

use banlieue_iso::NoCloudSeed;
use common::{cloud_init_python, readers_dir};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};

/// Values YAML would otherwise read as something else, or not read at all.
const AWKWARD: &[&str] = &[
    "yes",
    "No",
    "ON",
    "off",
    "y",
    "n",
    "true",
    "False",
    "null",
    "Null",
    "~",
    "123",
    "-1",
    "0x1F",
    "0o17",
    "017",
    "1e3",
    "1_000",
    ".inf",
    "-.Inf",
    ".NaN",
    "12:30:00",
    "2024-01-02",
    "2001-12-14t21:59:43.10-05:00",
    "a: b",
    "a #b",
    "#comment",
    "*alias",
    "&anchor",
    "!tag",
    "!!str",
    "%directive",
    "@at",
    "`tick",
    "|",
    ">",
    "[a, b]",
    "{a: b}",
    "- item",
    "? key",
    "'",
    "\"",
    "\\",
    "a\nb",
    "trailing\n",
    " leading",
    "trailing ",
    "\t",
    "\r\n",
    "\u{85}",
    "\u{2028}",
    "\u{feff}bom",
    "\u{fffe}",
    "\u{0}",
    "\u{7f}",
    "\u{9f}",
    "ünï中Ω😀",
    "<<",
    "=",
    "---",
    "...",
    "default-web-0",
    "f81d4fae-7dec-11d0-a765-00a0c91e6bf6",
    "3f2a0000-0000-0000-0000-000000000000",
    "host.example.org",
    "E",
    "e5",
];

/// Parses each value's meta-data with cloud-init and returns (instance-id, local-hostname).
fn parse_with_cloud_init(values: &[String]) -> Option<Vec<(String, String)>> {
    let python = cloud_init_python()?;
    let documents: Vec<String> = values
        .iter()
        .map(|v| {
            NoCloudSeed::new(v.clone(), format!("h{v}"))
                .meta_data()
                .unwrap()
        })
        .collect();
    let mut child = Command::new(python)
        .arg(readers_dir().join("yaml_values.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let input = serde_json::to_vec(&documents).unwrap();
    child.stdin.take().unwrap().write_all(&input).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success());
    let parsed: Vec<serde_json::Value> = serde_json::from_slice(&output.stdout).unwrap();
    Some(
        parsed
            .iter()
            .map(|doc| {
                let field = |key: &str| {
                    doc[key]
                        .as_str()
                        .map(str::to_owned)
                        .unwrap_or_else(|| format!("<{}>", doc[key]))
                };
                (field("instance-id"), field("local-hostname"))
            })
            .collect(),
    )
}

fn assert_round_trip(values: &[String]) {
    let Some(parsed) = parse_with_cloud_init(values) else {
        return;
    };
    for (value, (instance_id, hostname)) in values.iter().zip(parsed) {
        assert_eq!(&instance_id, value, "instance-id for {value:?}");
        assert_eq!(
            hostname,
            format!("h{value}"),
            "local-hostname for {value:?}"
        );
    }
}

#[test]
fn awkward_values_round_trip() {
    let values: Vec<String> = AWKWARD.iter().map(|v| (*v).to_owned()).collect();
    assert_round_trip(&values);
}

#[test]
fn random_values_round_trip() {
    // One cloud-init process for the whole batch: the values come from proptest's generators,
    // the parsing happens once.
    let mut runner = TestRunner::new(Config::default());
    let strategy = prop::collection::vec(
        prop_oneof![
            any::<String>(),
            "[ -~]{1,20}",
            "[\\x00-\\x20:#&*!|>'\"%@`{}\\[\\],?-]{1,6}"
        ]
        .prop_filter("non-empty", |s| !s.is_empty()),
        400,
    );
    let values = strategy.new_tree(&mut runner).unwrap().current();
    assert_round_trip(&values);
}
