//! A nom parser for the RPC language (RFC 4506 §6, RFC 5531 §12) as libvirt's `.x` files use it.
//!
//! Whitespace, `/* */` and `//` comments and `%` pass-through lines (C for rpcgen) are
//! skipped; the comments just before an enum variant are kept, because libvirt writes its
//! per-procedure annotations there.

use nom::{
    IResult, Parser,
    bytes::complete::{tag, take_until, take_while, take_while1},
    character::complete::{char, digit1, hex_digit1, oct_digit0},
    combinator::{opt, recognize},
    error::{ErrorKind, ParseError},
};

use crate::ast::*;
use crate::error::{Error, Location};

/// Parses one file. `file` only names the input in errors.
pub fn parse(file: &str, src: &str) -> Result<Spec, Error> {
    let p = P { src };
    match p.spec(src) {
        Ok((_, spec)) => Ok(spec),
        Err(nom::Err::Error(e) | nom::Err::Failure(e)) => Err(Error::Parse {
            location: Location::new(file, p.pos(e.input)),
            message: format!("expected {}", e.expected),
        }),
        Err(nom::Err::Incomplete(_)) => Err(Error::Parse {
            location: Location::new(file, p.pos("")),
            message: "unexpected end of input".into(),
        }),
    }
}

#[derive(Debug)]
struct PErr<'a> {
    input: &'a str,
    expected: String,
}

impl<'a> ParseError<&'a str> for PErr<'a> {
    fn from_error_kind(input: &'a str, kind: ErrorKind) -> Self {
        PErr {
            input,
            expected: kind.description().to_lowercase(),
        }
    }
    fn append(_: &'a str, _: ErrorKind, other: Self) -> Self {
        other
    }
}

type Res<'a, T> = IResult<&'a str, T, PErr<'a>>;

fn fail<T>(input: &str, expected: impl Into<String>) -> Res<'_, T> {
    Err(nom::Err::Failure(PErr {
        input,
        expected: expected.into(),
    }))
}

const KEYWORDS: &[&str] = &[
    "bool",
    "case",
    "char",
    "const",
    "default",
    "double",
    "quadruple",
    "enum",
    "float",
    "hyper",
    "int",
    "opaque",
    "program",
    "short",
    "string",
    "struct",
    "switch",
    "typedef",
    "union",
    "unsigned",
    "version",
    "void",
];

struct P<'s> {
    src: &'s str,
}

impl<'s> P<'s> {
    fn pos(&self, rest: &str) -> Pos {
        let offset = self.src.len() - rest.len();
        let before = &self.src[..offset];
        let line = before.matches('\n').count() as u32 + 1;
        let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) as u32 + 1;
        Pos { line, col }
    }

    fn at_line_start(&self, rest: &str) -> bool {
        let offset = self.src.len() - rest.len();
        offset == 0 || self.src.as_bytes()[offset - 1] == b'\n'
    }

    /// Skips blanks, comments and `%` lines; returns the text of the comments skipped.
    fn skip<'a>(&self, mut i: &'a str) -> Res<'a, String> {
        let mut comments = String::new();
        loop {
            let (rest, _) = take_while(|c: char| c.is_whitespace()).parse(i)?;
            i = rest;
            if let Some(body) = i.strip_prefix("/*") {
                let Ok((rest, text)) = take_until::<_, _, PErr<'a>>("*/").parse(body) else {
                    return fail(i, "the end of this comment");
                };
                comments.push_str(text);
                comments.push('\n');
                i = &rest[2..];
            } else if let Some(body) = i.strip_prefix("//") {
                let end = body.find('\n').unwrap_or(body.len());
                comments.push_str(&body[..end]);
                comments.push('\n');
                i = &body[end..];
            } else if i.starts_with('%') && self.at_line_start(i) {
                let end = i.find('\n').unwrap_or(i.len());
                i = &i[end..];
            } else {
                return Ok((i, comments));
            }
        }
    }

    fn ws<'a>(&self, i: &'a str) -> &'a str {
        match self.skip(i) {
            Ok((rest, _)) => rest,
            Err(_) => i,
        }
    }

    fn punct<'a>(&self, i: &'a str, c: char) -> Res<'a, ()> {
        let i = self.ws(i);
        match char::<_, PErr<'a>>(c).parse(i) {
            Ok((rest, _)) => Ok((rest, ())),
            Err(_) => fail(i, format!("`{c}`")),
        }
    }

    fn raw_ident<'a>(&self, i: &'a str) -> Res<'a, &'a str> {
        let i = self.ws(i);
        recognize((
            take_while1(|c: char| c.is_ascii_alphabetic() || c == '_'),
            take_while(|c: char| c.is_ascii_alphanumeric() || c == '_'),
        ))
        .parse(i)
    }

    /// An identifier that is not a keyword.
    fn ident<'a>(&self, i: &'a str, what: &str) -> Res<'a, (String, Pos)> {
        let i = self.ws(i);
        match self.raw_ident(i) {
            Ok((rest, id)) if !KEYWORDS.contains(&id) => Ok((rest, (id.to_string(), self.pos(i)))),
            _ => fail(i, what.to_string()),
        }
    }

    fn keyword<'a>(&self, i: &'a str, kw: &str) -> Option<&'a str> {
        match self.raw_ident(i) {
            Ok((rest, id)) if id == kw => Some(rest),
            _ => None,
        }
    }

    fn number<'a>(&self, i: &'a str) -> Res<'a, i64> {
        let start = self.ws(i);
        let (i, neg) = opt(char('-')).parse(start)?;
        let parsed = if let Ok((rest, digits)) = (tag::<_, _, PErr<'a>>("0x"), hex_digit1)
            .parse(i)
            .map(|(r, (_, d))| (r, d))
        {
            (rest, i64::from_str_radix(digits, 16))
        } else if let Ok((rest, digits)) =
            recognize((char::<_, PErr<'a>>('0'), oct_digit0)).parse(i)
        {
            (rest, i64::from_str_radix(digits, 8))
        } else {
            let (rest, digits) = digit1(i)?;
            (rest, digits.parse::<i64>())
        };
        match parsed {
            (rest, Ok(v)) => Ok((rest, if neg.is_some() { -v } else { v })),
            (_, Err(_)) => fail(start, "a number that fits in 64 bits"),
        }
    }

    fn value<'a>(&self, i: &'a str) -> Res<'a, Value> {
        let i = self.ws(i);
        if let Ok((rest, v)) = self.number(i) {
            return Ok((rest, Value::Literal(v)));
        }
        match self.ident(i, "a number or a constant name") {
            Ok((rest, (name, pos))) => Ok((rest, Value::Named { name, pos })),
            Err(e) => Err(e),
        }
    }

    fn spec<'a>(&self, i: &'a str) -> Res<'a, Spec> {
        let mut definitions = Vec::new();
        let mut i = i;
        loop {
            i = self.skip(i)?.0;
            if i.is_empty() {
                return Ok((i, Spec { definitions }));
            }
            let (rest, def) = self.definition(i)?;
            definitions.push(def);
            i = rest;
        }
    }

    fn definition<'a>(&self, i: &'a str) -> Res<'a, Definition> {
        let i = self.ws(i);
        let pos = self.pos(i);
        if let Some(rest) = self.keyword(i, "const") {
            let (rest, (name, _)) = self.ident(rest, "a constant name")?;
            let (rest, _) = self.punct(rest, '=')?;
            let (rest, value) = match self.value(rest) {
                Ok(ok) => ok,
                Err(_) => return fail(self.ws(rest), "a number or a constant name"),
            };
            let (rest, _) = self.punct(rest, ';')?;
            return Ok((rest, Definition::Const(Const { name, value, pos })));
        }
        if let Some(rest) = self.keyword(i, "enum") {
            let (rest, (name, _)) = self.ident(rest, "an enum name")?;
            let (rest, variants) = self.enum_body(rest)?;
            let (rest, _) = self.punct(rest, ';')?;
            return Ok((
                rest,
                Definition::Enum(Enum {
                    name,
                    variants,
                    pos,
                }),
            ));
        }
        if let Some(rest) = self.keyword(i, "struct") {
            let (rest, (name, _)) = self.ident(rest, "a struct name")?;
            let (rest, fields) = self.struct_body(rest)?;
            let (rest, _) = self.punct(rest, ';')?;
            return Ok((rest, Definition::Struct(Struct { name, fields, pos })));
        }
        if let Some(rest) = self.keyword(i, "union") {
            let (rest, (name, _)) = self.ident(rest, "a union name")?;
            let (rest, mut union) = self.union_body(rest)?;
            let (rest, _) = self.punct(rest, ';')?;
            union.name = name;
            union.pos = pos;
            return Ok((rest, Definition::Union(union)));
        }
        if let Some(rest) = self.keyword(i, "typedef") {
            let (rest, decl) = self.declaration(rest)?;
            if decl.kind == DeclarationKind::Void {
                return fail(self.ws(rest), "a named type after typedef");
            }
            let (rest, _) = self.punct(rest, ';')?;
            return Ok((rest, Definition::Typedef(decl)));
        }
        if self.keyword(i, "program").is_some() {
            return fail(
                i,
                "a definition (`program` blocks are not used by libvirt and not supported)",
            );
        }
        fail(i, "a definition: const, enum, struct, union or typedef")
    }

    fn enum_body<'a>(&self, i: &'a str) -> Res<'a, Vec<EnumVariant>> {
        let (mut i, _) = self.punct(i, '{')?;
        let mut variants = Vec::new();
        loop {
            let (rest, doc) = self.skip(i)?;
            let (rest, (name, pos)) = self.ident(rest, "an enum variant name")?;
            let (rest, _) = self.punct(rest, '=')?;
            let (rest, value) = self.value(rest)?;
            variants.push(EnumVariant {
                name,
                value,
                doc,
                pos,
            });
            let rest = self.ws(rest);
            if let Some(rest) = rest.strip_prefix(',') {
                i = rest;
                continue;
            }
            let (rest, _) = self.punct(rest, '}')?;
            return Ok((rest, variants));
        }
    }

    fn struct_body<'a>(&self, i: &'a str) -> Res<'a, Vec<Declaration>> {
        let (mut i, _) = self.punct(i, '{')?;
        let mut fields = Vec::new();
        loop {
            let rest = self.ws(i);
            if let Some(rest) = rest.strip_prefix('}') {
                if fields.is_empty() {
                    return fail(i, "at least one struct member");
                }
                return Ok((rest, fields));
            }
            let (rest, decl) = self.declaration(rest)?;
            let (rest, _) = self.punct(rest, ';')?;
            fields.push(decl);
            i = rest;
        }
    }

    fn union_body<'a>(&self, i: &'a str) -> Res<'a, Union> {
        let i = self.ws(i);
        let Some(rest) = self.keyword(i, "switch") else {
            return fail(i, "`switch`");
        };
        let (rest, _) = self.punct(rest, '(')?;
        let (rest, discriminant) = self.declaration(rest)?;
        let (rest, _) = self.punct(rest, ')')?;
        let (mut i, _) = self.punct(rest, '{')?;
        let mut arms = Vec::new();
        let mut default = None;
        loop {
            let rest = self.ws(i);
            if let Some(rest) = rest.strip_prefix('}') {
                if arms.is_empty() {
                    return fail(rest, "at least one `case`");
                }
                let union = Union {
                    name: String::new(),
                    discriminant,
                    arms,
                    default,
                    pos: Pos { line: 0, col: 0 },
                };
                return Ok((rest, union));
            }
            if let Some(rest) = self.keyword(rest, "default") {
                let (rest, _) = self.punct(rest, ':')?;
                let (rest, decl) = self.declaration(rest)?;
                let (rest, _) = self.punct(rest, ';')?;
                default = Some(decl);
                i = rest;
                continue;
            }
            let mut labels = Vec::new();
            let mut cur = rest;
            while let Some(rest) = self.keyword(self.ws(cur), "case") {
                let (rest, label) = self.value(rest)?;
                let (rest, _) = self.punct(rest, ':')?;
                labels.push(label);
                cur = rest;
            }
            if labels.is_empty() {
                return fail(rest, "`case`, `default` or `}`");
            }
            let (rest, body) = self.declaration(cur)?;
            let (rest, _) = self.punct(rest, ';')?;
            arms.push(UnionArm { labels, body });
            i = rest;
        }
    }

    fn type_spec<'a>(&self, i: &'a str) -> Res<'a, TypeSpec> {
        let i = self.ws(i);
        if let Some(rest) = self.keyword(i, "unsigned") {
            let after = self.ws(rest);
            for (kw, make) in [
                ("int", TypeSpec::Int { unsigned: true }),
                ("hyper", TypeSpec::Hyper { unsigned: true }),
                ("char", TypeSpec::Char { unsigned: true }),
                ("short", TypeSpec::Short { unsigned: true }),
            ] {
                if let Some(rest) = self.keyword(after, kw) {
                    return Ok((rest, make));
                }
            }
            // A bare `unsigned` means `unsigned int`, as in C.
            return Ok((rest, TypeSpec::Int { unsigned: true }));
        }
        for (kw, make) in [
            ("int", TypeSpec::Int { unsigned: false }),
            ("hyper", TypeSpec::Hyper { unsigned: false }),
            ("char", TypeSpec::Char { unsigned: false }),
            ("short", TypeSpec::Short { unsigned: false }),
            ("float", TypeSpec::Float),
            ("double", TypeSpec::Double),
            ("bool", TypeSpec::Bool),
            ("opaque", TypeSpec::Opaque),
            ("string", TypeSpec::String),
        ] {
            if let Some(rest) = self.keyword(i, kw) {
                return Ok((rest, make));
            }
        }
        if self.keyword(i, "quadruple").is_some() {
            return fail(i, "a supported type (`quadruple` is not supported)");
        }
        for kw in ["struct", "enum", "union"] {
            if let Some(rest) = self.keyword(i, kw) {
                // `struct foo bar;` refers to a named type; inline bodies are not used by libvirt.
                let (rest, (name, pos)) = self.ident(
                    rest,
                    &format!("a {kw} name (inline {kw} bodies are not supported)"),
                )?;
                return Ok((rest, TypeSpec::Named { name, pos }));
            }
        }
        let (rest, (name, pos)) = self.ident(i, "a type")?;
        Ok((rest, TypeSpec::Named { name, pos }))
    }

    fn declaration<'a>(&self, i: &'a str) -> Res<'a, Declaration> {
        let i = self.ws(i);
        let pos = self.pos(i);
        if let Some(rest) = self.keyword(i, "void") {
            return Ok((
                rest,
                Declaration {
                    kind: DeclarationKind::Void,
                    pos,
                },
            ));
        }
        let (rest, ty) = self.type_spec(i)?;
        let rest = self.ws(rest);
        if let Some(rest) = rest.strip_prefix('*') {
            let (rest, (name, _)) = self.ident(rest, "a declaration name")?;
            return Ok((
                rest,
                Declaration {
                    kind: DeclarationKind::Named {
                        name,
                        ty,
                        shape: Shape::Optional,
                    },
                    pos,
                },
            ));
        }
        let (rest, (name, _)) = self.ident(rest, "a declaration name")?;
        let after = self.ws(rest);
        let (rest, shape) = if let Some(r) = after.strip_prefix('[') {
            let (r, size) = self.value(r)?;
            let (r, _) = self.punct(r, ']')?;
            (r, Shape::FixedArray(size))
        } else if let Some(r) = after.strip_prefix('<') {
            let r2 = self.ws(r);
            if let Some(r3) = r2.strip_prefix('>') {
                (r3, Shape::VarArray(None))
            } else {
                let (r, size) = self.value(r)?;
                let (r, _) = self.punct(r, '>')?;
                (r, Shape::VarArray(Some(size)))
            }
        } else {
            (rest, Shape::Scalar)
        };
        match (&ty, &shape) {
            (TypeSpec::String, Shape::VarArray(_))
            | (TypeSpec::Opaque, Shape::VarArray(_) | Shape::FixedArray(_)) => {}
            (TypeSpec::String, _) => {
                return fail(
                    after,
                    "`<` after a string name (strings are variable-length)",
                );
            }
            (TypeSpec::Opaque, _) => return fail(after, "`[` or `<` after an opaque name"),
            _ => {}
        }
        Ok((
            rest,
            Declaration {
                kind: DeclarationKind::Named { name, ty, shape },
                pos,
            },
        ))
    }
}
