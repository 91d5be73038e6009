//! Property tests: random trees are reproduced by every reader, arbitrary input never panics
//! the writer, and the output depends on the input alone.
//!
//! Readers are subprocesses, so the reader property runs a modest number of cases.

mod common;

use std::io::Cursor;

use banlieue_iso::{Image, ImageOptions, MAX_JOLIET_NAME_UNITS, Timestamp, Tree, VolumeLabel};
use common::{Spec, build_lenient, check_all_readers};
use proptest::prelude::*;

/// Characters Joliet can carry: printable ASCII without `* / : ; ? \`, and BMP characters
/// outside the surrogate range, weighted towards ASCII so names stay legible.
fn joliet_char() -> impl Strategy<Value = char> {
    prop_oneof![
        6 => prop::sample::select(
            "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.~ !#$%&'()+,=@[]^`{}|"
                .chars()
                .collect::<Vec<_>>()
        ),
        1 => prop::char::range('\u{a0}', '\u{2fff}'),
        1 => prop::char::range('\u{3000}', '\u{d7ff}'),
        1 => prop::char::range('\u{e000}', '\u{fffd}'),
    ]
}

fn joliet_name() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::collection::vec(joliet_char(), 1..12),
        1 => prop::collection::vec(joliet_char(), MAX_JOLIET_NAME_UNITS..=MAX_JOLIET_NAME_UNITS),
        1 => prop::collection::vec(joliet_char(), 50..=MAX_JOLIET_NAME_UNITS),
    ]
    .prop_map(|chars| chars.into_iter().collect::<String>())
    .prop_filter("not . or ..", |name| name != "." && name != "..")
}

/// Sizes around sector boundaries, plus empty files and a spread of others.
fn file_size() -> impl Strategy<Value = usize> {
    prop_oneof![
        Just(0usize),
        (1usize..4).prop_flat_map(|k| prop::sample::select(vec![
            2048 * k - 1,
            2048 * k,
            2048 * k + 1
        ])),
        0usize..10_000,
    ]
}

fn spec() -> impl Strategy<Value = Spec> {
    // Up to 8 components: a file in the deepest directory ECMA-119 allows.
    let path = || prop::collection::vec(joliet_name(), 1..=8).prop_map(|parts| parts.join("/"));
    prop_oneof![
        4 => (path(), file_size(), any::<u8>()).prop_map(|(path, size, seed)| {
            let data = (0..size).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect();
            Spec::File(path, data)
        }),
        1 => path().prop_filter("directories end one level higher", |p| p.matches('/').count() < 7)
            .prop_map(Spec::Dir),
    ]
}

fn options() -> impl Strategy<Value = ImageOptions> {
    (
        prop::sample::select(vec!["cidata", "CIDATA", "A", "sixteen-chars-ok"]),
        0i64..4_000_000_000,
    )
        .prop_map(|(label, secs)| ImageOptions {
            volume_label: VolumeLabel::new(label).unwrap(),
            timestamp: Timestamp::from_unix_seconds(secs).unwrap(),
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn every_reader_reproduces_random_trees(
        specs in prop::collection::vec(spec(), 1..10),
        options in options(),
    ) {
        let (image, expected, _) = build_lenient(&specs, &options).unwrap();
        check_all_readers(&image, &expected);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn output_depends_on_content_not_insertion_order(
        specs in prop::collection::vec(spec(), 1..16),
        options in options(),
    ) {
        let (image, _, kept) = build_lenient(&specs, &options).unwrap();
        let reversed: Vec<Spec> = kept.into_iter().rev().collect();
        let (again, _, _) = build_lenient(&reversed, &options).unwrap();
        prop_assert_eq!(image, again);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_input_gives_ok_or_a_typed_error(
        entries in prop::collection::vec(
            (any::<String>(), prop_oneof![0u64..5000, any::<u64>()], prop::collection::vec(any::<u8>(), 0..300), any::<bool>()),
            0..12,
        ),
        label in any::<String>(),
        secs in any::<i64>(),
    ) {
        let mut tree: Tree<Cursor<Vec<u8>>> = Tree::new();
        for (path, declared, data, is_dir) in entries {
            let _ = if is_dir {
                tree.add_directory(&path)
            } else {
                tree.add_file(&path, declared, Cursor::new(data))
            };
        }
        let volume_label = VolumeLabel::new(&label).unwrap_or_default();
        let timestamp = Timestamp::from_unix_seconds(secs).unwrap_or_default();
        if let Ok(image) = Image::plan(tree, &ImageOptions { volume_label, timestamp }) {
            let declared_size = image.size_bytes();
            if let Ok(written) = image.write_to(&mut std::io::sink()) {
                prop_assert_eq!(written, declared_size);
            }
        }
    }
}
