//! The generator on small inputs: its Rust output and its error messages are pinned.

use banlieue_xdrgen::model::{StreamDirection, Ty, TypeKind};
use banlieue_xdrgen::{Input, Options, generate, model};

fn input(source: &str) -> Vec<Input> {
    vec![Input {
        module: "demo".into(),
        file: "demo.x".into(),
        source: source.into(),
    }]
}

fn error_of(source: &str) -> String {
    match model(&input(source)) {
        Ok(_) => panic!("accepted:\n{source}"),
        Err(e) => e.to_string(),
    }
}

const SMALL: &str = r#"
/* A small program in libvirt's style. */
%#include <libvirt/libvirt.h>
const DEMO_NAME_MAX = 64;
const DEMO_LIST_MAX = DEMO_NAME_MAX;
enum demo_state { DEMO_STATE_OFF = 0, DEMO_STATE_ON = 1 };
typedef string demo_name<DEMO_NAME_MAX>;
typedef demo_name *demo_optional_name;
struct demo_thing {
    demo_name name;
    opaque uuid[16];
    demo_optional_name alias;
    unsigned hyper sizes<DEMO_LIST_MAX>;
    demo_state state;
    char tag;
};
union demo_value switch (int kind) {
 case 1: int i;
 case 2: demo_name s;
 default: void;
};
const DEMO_PROGRAM = 0x44454d4f;
const DEMO_PROTOCOL_VERSION = 1;
enum demo_procedure {
    /** @generate: both */
    DEMO_PROC_GET_THING = 1,
    /**
     * @generate: both
     * @writestream: 1
     */
    DEMO_PROC_UPLOAD = 2,
    DEMO_PROC_EVENT_CHANGED = 3
};
struct demo_get_thing_args { demo_name name; };
struct demo_get_thing_ret { demo_thing thing; };
struct demo_upload_args { demo_name name; unsigned hyper length; };
struct demo_event_changed_msg { demo_value value; };
"#;

#[test]
fn generated_rust_for_a_small_program() {
    let out = generate(&input(SMALL), &Options::default()).expect("generates");
    let text = &out["demo"];
    assert!(
        text.starts_with("// @generated"),
        "carries the @generated marker"
    );
    insta::assert_snapshot!(text.as_str());
}

#[test]
fn procedures_pair_with_types_by_convention() {
    let m = model(&input(SMALL)).expect("resolves");
    let program = m.modules[0].program.as_ref().expect("a program");
    assert_eq!(
        (program.name.as_str(), program.number, program.version),
        ("demo", 0x44454d4f, 1)
    );
    let get = &program.procedures[0];
    assert_eq!(get.args.as_deref(), Some("demo_get_thing_args"));
    assert_eq!(get.ret.as_deref(), Some("demo_get_thing_ret"));
    assert_eq!(get.stream, None);
    let upload = &program.procedures[1];
    assert_eq!(upload.ret, None);
    assert_eq!(upload.stream, Some((StreamDirection::Write, 1)));
    let event = &program.procedures[2];
    assert_eq!(event.message.as_deref(), Some("demo_event_changed_msg"));
}

#[test]
fn typedefs_resolve_with_their_bounds() {
    let m = model(&input(SMALL)).expect("resolves");
    let TypeKind::Struct(fields) = &m.types["demo_thing"].kind else {
        panic!("a struct")
    };
    assert_eq!(fields[0].ty.unaliased(), &Ty::String(Some(64)));
    assert_eq!(
        fields[3].ty,
        Ty::VarArray(
            Box::new(Ty::Prim(banlieue_xdrgen::model::Prim::U64)),
            Some(64)
        )
    );
    assert!(matches!(fields[2].ty.unaliased(), Ty::Optional(_)));
}

#[test]
fn enums_are_encoded_by_declared_value() {
    let m = model(&input("enum e { A = 5, B = -2, C = 0x10 };")).expect("resolves");
    let TypeKind::Enum(variants) = &m.types["e"].kind else {
        panic!("an enum")
    };
    let values: Vec<i64> = variants.iter().map(|(_, v)| *v).collect();
    assert_eq!(values, vec![5, -2, 16]);
}

#[test]
fn header_constants_are_known() {
    model(&input("typedef opaque u[VIR_UUID_BUFLEN];"))
        .expect("VIR_UUID_BUFLEN comes from the table");
}

#[test]
fn error_messages() {
    let cases = [
        (
            "struct s { int a; }",
            "missing semicolon after a definition",
        ),
        ("struct s { int ; };", "missing member name"),
        ("struct s { undefined_t a; };", "unknown type"),
        ("typedef opaque x[NO_SUCH_CONST];", "unknown constant"),
        ("const A = 1;\nconst A = 2;", "duplicate constant"),
        (
            "struct s { int a; };\nstruct s { int b; };",
            "duplicate type",
        ),
        ("struct s { string a; };", "string without a bound"),
        (
            "union u switch (string s<>) { case 1: int a; };",
            "bad discriminant",
        ),
        (
            "union u switch (int k) { case 1: int a; case 1: int b; };",
            "duplicate case",
        ),
        ("/* never closed", "open comment"),
        ("struct s { quadruple q; };", "quadruple"),
        (
            "program P { version V { void NULL(void) = 0; } = 1; } = 9;",
            "program blocks",
        ),
        (
            "struct s { int fooBar; int foo_bar; };",
            "Rust name collision",
        ),
        ("typedef int x[-1];", "negative bound"),
    ];
    let mut text = String::new();
    for (src, what) in cases {
        let message = match generate(&input(src), &Options::default()) {
            Ok(_) => panic!("{what}: accepted"),
            Err(e) => e.to_string(),
        };
        assert!(
            message.starts_with("demo.x:") || message.starts_with("generated"),
            "{what}: {message}"
        );
        text += &format!("{what}:\n  {message}\n");
    }
    insta::assert_snapshot!(text);
}

#[test]
fn errors_point_at_the_right_line_and_column() {
    let e = error_of("const A = 1;\n\nstruct s {\n    int a;\n    bogus_t b;\n};\n");
    assert_eq!(e, "demo.x:5:5: unknown type `bogus_t`");
}
