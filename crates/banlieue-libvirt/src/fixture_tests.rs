//! Round trips of a value that uses every construct the generator supports.

use crate::fixture::constructs::*;
use crate::xdr::{Error, Xdr};

fn inner(n: i32) -> FixInner {
    FixInner {
        i: -n,
        u: n as u32,
        h: -i64::from(n) << 40,
        uh: u64::MAX - n as u64,
        b: n % 2 == 0,
        f: 1.5,
        d: -2.25,
        c: -7,
        uc: 250,
        s: -300,
        us: 65000,
    }
}

fn outer() -> FixOuter {
    FixOuter {
        name: "abc".into(),
        uuid: [7; 16],
        alias: Some("x".into()),
        maybe: Some(inner(1)),
        list: vec![inner(2), inner(3)],
        pair: [inner(4), inner(5)],
        names: vec!["".into(), "hello".into()],
        blob: vec![1, 2, 3, 4, 5],
        fixed: [9; 5],
        label: [1, -1, 0],
        unbounded: "é".into(),
        choice: FixChoice::Blue("blue".into()),
        open: FixOpen::Default {
            discriminant: 77,
            value: [3; 16],
        },
        color: FixColor(99),
        flag: FixFlag::True(5),
        r#type: 4,
    }
}

#[test]
fn every_construct_round_trips() {
    let v = outer();
    let bytes = v.to_bytes().expect("encodes");
    assert_eq!(bytes.len() % 4, 0);
    assert_eq!(FixOuter::from_bytes(&bytes).expect("decodes"), v);
}

#[test]
fn chars_and_shorts_are_four_bytes() {
    let bytes = inner(1).to_bytes().expect("encodes");
    // i u h uh b f d c uc s us: 4+4+8+8+4+4+8+4+4+4+4
    assert_eq!(bytes.len(), 56);
    assert_eq!(
        &bytes[40..44],
        &(-7i32).to_be_bytes(),
        "char is sign-extended"
    );
    assert_eq!(&bytes[44..48], &250u32.to_be_bytes());
}

#[test]
fn union_cases_use_declared_values() {
    assert_eq!(
        &FixChoice::Blue("".into()).to_bytes().expect("encodes")[..4],
        &0x7fff_ffffu32.to_be_bytes()
    );
    assert_eq!(
        &FixOpen::FixNeg(1).to_bytes().expect("encodes")[..4],
        &(-3i32).to_be_bytes()
    );
    assert_eq!(FixOpen::V1.to_bytes().expect("encodes").len(), 4);
    assert_eq!(
        FixFlag::False.to_bytes().expect("encodes")[..],
        [0, 0, 0, 0]
    );
}

#[test]
fn bounds_hold_on_encode() {
    let mut v = outer();
    v.name = "x".repeat(17);
    assert_eq!(
        v.to_bytes(),
        Err(Error::EncodeBound {
            what: "fix_outer.name",
            len: 17,
            max: 16
        })
    );
    let mut v = outer();
    v.list = vec![inner(0); 5];
    assert!(matches!(
        v.to_bytes(),
        Err(Error::EncodeBound {
            what: "fix_outer.list",
            ..
        })
    ));
}

#[test]
fn procedure_markers_carry_the_table() {
    use crate::xdr::{Procedure, StreamDirection};
    assert_eq!(
        procedures::Download::STREAM,
        Some((StreamDirection::Read, 1))
    );
    assert_eq!(
        procedures::Upload::STREAM,
        Some((StreamDirection::Write, 1))
    );
    assert_eq!(procedures::Ping::NUMBER, 1);
    assert_eq!(procedures::Ping::PROGRAM, 0x1234_5678);
    assert!(PROCEDURES[1].priority_high);
    assert_eq!(PROCEDURES[3].message, Some("fix_event_changed_msg"));
}
