//! The resolved model: every name looked up, every bound a number, typedefs unfolded, and the
//! procedure tables that libvirt expresses as `*_procedure` enums plus naming conventions.

use std::collections::BTreeMap;

use crate::ast::{self, DeclarationKind, Definition, Pos, Shape, TypeSpec, Value};
use crate::error::{Error, Location, Result};
use crate::header_constants::HEADER_CONSTANTS;

/// A primitive XDR type and the Rust type it becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prim {
    I32,
    U32,
    I64,
    U64,
    F32,
    F64,
    Bool,
    /// `char`: 4 bytes on the wire, truncated to 8 bits on decode as rpcgen's `xdr_char` does.
    I8,
    U8,
    I16,
    U16,
}

/// A type with its wire shape fully known.
#[derive(Debug, Clone, PartialEq)]
pub enum Ty {
    Prim(Prim),
    /// A struct, enum or union, by XDR name.
    Named(String),
    /// A typedef, by XDR name, and what it stands for.
    Alias(String, Box<Ty>),
    String(Option<u32>),
    OpaqueFixed(u32),
    OpaqueVar(Option<u32>),
    FixedArray(Box<Ty>, u32),
    VarArray(Box<Ty>, Option<u32>),
    Optional(Box<Ty>),
}

impl Ty {
    /// The type with typedef names looked through.
    pub fn unaliased(&self) -> &Ty {
        match self {
            Ty::Alias(_, inner) => inner.unaliased(),
            other => other,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    pub name: String,
    pub ty: Ty,
}

#[derive(Debug, Clone, PartialEq)]
pub struct UnionArm {
    /// The label's constant name, or `None` for a literal.
    pub label: Option<String>,
    pub value: i64,
    /// `None` for `void`.
    pub body: Option<Field>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct UnionDef {
    pub discriminant: Field,
    pub arms: Vec<UnionArm>,
    /// `Some(None)` is `default: void`.
    pub default: Option<Option<Field>>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum TypeKind {
    Enum(Vec<(String, i64)>),
    Struct(Vec<Field>),
    Union(UnionDef),
    Typedef(Ty),
}

#[derive(Debug, Clone, PartialEq)]
pub struct TypeDef {
    pub name: String,
    pub module: String,
    pub kind: TypeKind,
    pub location: Location,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamDirection {
    /// The client reads stream data (`@readstream`), e.g. a volume download.
    Read,
    /// The client writes stream data (`@writestream`), e.g. a volume upload.
    Write,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Procedure {
    /// The enum constant, e.g. `REMOTE_PROC_CONNECT_OPEN`.
    pub const_name: String,
    /// The name without the program's prefix, e.g. `CONNECT_OPEN`.
    pub base_name: String,
    pub number: i64,
    pub args: Option<String>,
    pub ret: Option<String>,
    /// For events the server sends as MESSAGE packets.
    pub message: Option<String>,
    pub stream: Option<(StreamDirection, u32)>,
    pub priority_high: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Program {
    pub name: String,
    pub number: u32,
    pub version: u32,
    pub procedures: Vec<Procedure>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Constant {
    pub name: String,
    pub value: i64,
}

/// One input file after resolution.
#[derive(Debug, Clone, PartialEq)]
pub struct Module {
    pub name: String,
    pub file: String,
    pub constants: Vec<Constant>,
    /// Type names in declaration order.
    pub types: Vec<String>,
    pub program: Option<Program>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Model {
    pub modules: Vec<Module>,
    pub types: BTreeMap<String, TypeDef>,
}

impl Model {
    pub fn get(&self, name: &str) -> Option<&TypeDef> {
        self.types.get(name)
    }

    /// Whether values of `ty` can be `Default`ed by derive (std arrays stop at 32).
    pub fn is_defaultable(&self, ty: &Ty) -> bool {
        match ty {
            Ty::Prim(_) | Ty::String(_) | Ty::OpaqueVar(_) | Ty::VarArray(..) | Ty::Optional(_) => {
                true
            }
            Ty::OpaqueFixed(n) => *n <= 32,
            Ty::FixedArray(inner, n) => *n <= 32 && self.is_defaultable(inner),
            Ty::Alias(_, inner) => self.is_defaultable(inner),
            Ty::Named(name) => match self.types.get(name).map(|t| &t.kind) {
                Some(TypeKind::Enum(_)) => true,
                Some(TypeKind::Struct(fields)) => fields.iter().all(|f| self.is_defaultable(&f.ty)),
                _ => false,
            },
        }
    }
}

/// A parsed file handed to [`resolve`].
#[derive(Debug)]
pub struct ParsedFile<'a> {
    pub module: &'a str,
    pub file: &'a str,
    pub spec: &'a ast::Spec,
}

struct ConstEntry {
    value: i64,
    location: Option<Location>,
}

pub fn resolve(files: &[ParsedFile<'_>]) -> Result<Model> {
    let mut consts: BTreeMap<String, ConstEntry> = HEADER_CONSTANTS
        .iter()
        .map(|(n, v)| {
            (
                n.to_string(),
                ConstEntry {
                    value: *v,
                    location: None,
                },
            )
        })
        .collect();
    let mut raw: BTreeMap<String, (&str, &str, &Definition)> = BTreeMap::new();

    // Pass 1: collect every name, so definitions may refer forward and across files.
    for f in files {
        for def in &f.spec.definitions {
            let loc = Location::new(f.file, def.pos());
            if let Definition::Const(c) = def {
                let value = const_value(&consts, &c.value, f.file)?;
                insert_const(&mut consts, &c.name, value, loc)?;
                continue;
            }
            if let Definition::Enum(e) = def {
                // Enum variants are constants too (usable as bounds and case labels); their
                // values may name earlier constants.
                for v in &e.variants {
                    let value = const_value(&consts, &v.value, f.file)?;
                    insert_const(&mut consts, &v.name, value, Location::new(f.file, v.pos))?;
                }
            }
            if let Some((_, file, first)) = raw.get(def.name()) {
                return Err(Error::Duplicate {
                    location: loc,
                    name: def.name().to_string(),
                    first: Location::new(file, first.pos()),
                });
            }
            raw.insert(def.name().to_string(), (f.module, f.file, def));
        }
    }

    let r = Resolver {
        consts: &consts,
        raw: &raw,
    };
    let mut types = BTreeMap::new();
    let mut modules = Vec::new();
    for f in files {
        let mut module = Module {
            name: f.module.to_string(),
            file: f.file.to_string(),
            constants: Vec::new(),
            types: Vec::new(),
            program: None,
        };
        for def in &f.spec.definitions {
            let location = Location::new(f.file, def.pos());
            let kind = match def {
                Definition::Const(c) => {
                    let value = const_value(&consts, &c.value, f.file)?;
                    module.constants.push(Constant {
                        name: c.name.clone(),
                        value,
                    });
                    continue;
                }
                Definition::Enum(e) => TypeKind::Enum(
                    e.variants
                        .iter()
                        .map(|v| Ok((v.name.clone(), const_value(&consts, &v.value, f.file)?)))
                        .collect::<Result<_>>()?,
                ),
                Definition::Struct(s) => TypeKind::Struct(
                    s.fields
                        .iter()
                        .map(|d| r.field(d, f.file, "struct member"))
                        .collect::<Result<_>>()?,
                ),
                Definition::Union(u) => TypeKind::Union(r.union(u, f.file)?),
                Definition::Typedef(d) => TypeKind::Typedef(r.field(d, f.file, "typedef")?.ty),
            };
            module.types.push(def.name().to_string());
            types.insert(
                def.name().to_string(),
                TypeDef {
                    name: def.name().to_string(),
                    module: f.module.to_string(),
                    kind,
                    location,
                },
            );
        }
        modules.push(module);
    }
    let mut model = Model { modules, types };
    let programs = files
        .iter()
        .map(|f| program(&model, f.spec, f.file, &consts))
        .collect::<Result<Vec<_>>>()?;
    for (module, program) in model.modules.iter_mut().zip(programs) {
        module.program = program;
    }
    Ok(model)
}

fn insert_const(
    consts: &mut BTreeMap<String, ConstEntry>,
    name: &str,
    value: i64,
    loc: Location,
) -> Result<()> {
    if let Some(prev) = consts.get(name) {
        let first = prev.location.clone().unwrap_or(Location {
            file: "<libvirt headers>".into(),
            line: 0,
            col: 0,
        });
        return Err(Error::Duplicate {
            location: loc,
            name: name.to_string(),
            first,
        });
    }
    consts.insert(
        name.to_string(),
        ConstEntry {
            value,
            location: Some(loc),
        },
    );
    Ok(())
}

fn const_value(consts: &BTreeMap<String, ConstEntry>, v: &Value, file: &str) -> Result<i64> {
    match v {
        Value::Literal(n) => Ok(*n),
        Value::Named { name, pos } => {
            consts
                .get(name)
                .map(|c| c.value)
                .ok_or_else(|| Error::Unknown {
                    location: Location::new(file, *pos),
                    kind: "constant",
                    name: name.clone(),
                })
        }
    }
}

struct Resolver<'a> {
    consts: &'a BTreeMap<String, ConstEntry>,
    raw: &'a BTreeMap<String, (&'a str, &'a str, &'a Definition)>,
}

impl Resolver<'_> {
    fn bound(&self, v: &Value, file: &str, pos: Pos) -> Result<u32> {
        let n = const_value(self.consts, v, file)?;
        u32::try_from(n).map_err(|_| Error::Invalid {
            location: Location::new(file, pos),
            message: format!("array bound {n} is not in 0..=4294967295"),
        })
    }

    fn named(&self, name: &str, pos: Pos, file: &str) -> Result<Ty> {
        match self.raw.get(name) {
            Some((_, tfile, Definition::Typedef(d))) => Ok(Ty::Alias(
                name.to_string(),
                Box::new(self.field(d, tfile, "typedef")?.ty),
            )),
            Some((_, _, Definition::Const(_))) | None => Err(Error::Unknown {
                location: Location::new(file, pos),
                kind: "type",
                name: name.to_string(),
            }),
            Some(_) => Ok(Ty::Named(name.to_string())),
        }
    }

    fn field(&self, d: &ast::Declaration, file: &str, what: &str) -> Result<Field> {
        let DeclarationKind::Named { name, ty, shape } = &d.kind else {
            return Err(Error::Invalid {
                location: Location::new(file, d.pos),
                message: format!("a {what} cannot be void"),
            });
        };
        let base = match ty {
            TypeSpec::Int { unsigned } => Ty::Prim(if *unsigned { Prim::U32 } else { Prim::I32 }),
            TypeSpec::Hyper { unsigned } => Ty::Prim(if *unsigned { Prim::U64 } else { Prim::I64 }),
            TypeSpec::Char { unsigned } => Ty::Prim(if *unsigned { Prim::U8 } else { Prim::I8 }),
            TypeSpec::Short { unsigned } => Ty::Prim(if *unsigned { Prim::U16 } else { Prim::I16 }),
            TypeSpec::Float => Ty::Prim(Prim::F32),
            TypeSpec::Double => Ty::Prim(Prim::F64),
            TypeSpec::Bool => Ty::Prim(Prim::Bool),
            TypeSpec::Opaque | TypeSpec::String => Ty::Prim(Prim::U8), // replaced below
            TypeSpec::Named { name, pos } => self.named(name, *pos, file)?,
        };
        let ty = match (ty, shape) {
            (TypeSpec::String, Shape::VarArray(b)) => Ty::String(self.opt_bound(b, file, d.pos)?),
            (TypeSpec::Opaque, Shape::VarArray(b)) => {
                Ty::OpaqueVar(self.opt_bound(b, file, d.pos)?)
            }
            (TypeSpec::Opaque, Shape::FixedArray(b)) => {
                Ty::OpaqueFixed(self.bound(b, file, d.pos)?)
            }
            (TypeSpec::String | TypeSpec::Opaque, _) => {
                return Err(Error::Invalid {
                    location: Location::new(file, d.pos),
                    message: "string and opaque need an array size".into(),
                });
            }
            (_, Shape::Scalar) => base,
            (_, Shape::Optional) => Ty::Optional(Box::new(base)),
            (_, Shape::FixedArray(b)) => {
                Ty::FixedArray(Box::new(base), self.bound(b, file, d.pos)?)
            }
            (_, Shape::VarArray(b)) => {
                Ty::VarArray(Box::new(base), self.opt_bound(b, file, d.pos)?)
            }
        };
        Ok(Field {
            name: name.clone(),
            ty,
        })
    }

    fn opt_bound(&self, b: &Option<Value>, file: &str, pos: Pos) -> Result<Option<u32>> {
        b.as_ref().map(|v| self.bound(v, file, pos)).transpose()
    }

    fn union(&self, u: &ast::Union, file: &str) -> Result<UnionDef> {
        let discriminant = self.field(&u.discriminant, file, "union discriminant")?;
        let ok = match discriminant.ty.unaliased() {
            Ty::Prim(Prim::I32 | Prim::U32 | Prim::Bool) => true,
            Ty::Named(n) => matches!(self.raw.get(n.as_str()), Some((_, _, Definition::Enum(_)))),
            _ => false,
        };
        if !ok {
            return Err(Error::Invalid {
                location: Location::new(file, u.discriminant.pos),
                message: "a union discriminant must be int, unsigned int, bool or an enum".into(),
            });
        }
        let mut arms = Vec::new();
        let mut seen = BTreeMap::new();
        for arm in &u.arms {
            let body = match arm.body.kind {
                DeclarationKind::Void => None,
                _ => Some(self.field(&arm.body, file, "union arm")?),
            };
            for label in &arm.labels {
                let value = const_value(self.consts, label, file)?;
                if seen.insert(value, ()).is_some() {
                    return Err(Error::Invalid {
                        location: Location::new(file, arm.body.pos),
                        message: format!("case value {value} appears twice in union `{}`", u.name),
                    });
                }
                let label = match label {
                    Value::Named { name, .. } => Some(name.clone()),
                    Value::Literal(_) => None,
                };
                arms.push(UnionArm {
                    label,
                    value,
                    body: body.clone(),
                });
            }
        }
        let default = match &u.default {
            None => None,
            Some(d) if d.kind == DeclarationKind::Void => Some(None),
            Some(d) => Some(Some(self.field(d, file, "union default arm")?)),
        };
        Ok(UnionDef {
            discriminant,
            arms,
            default,
        })
    }
}

/// libvirt declares a program as constants `<P>_PROGRAM`, `<P>_PROTOCOL_VERSION` and an enum
/// `<p>_procedure` whose variants `<P>_PROC_<NAME>` pair with `<p>_<name>_args`, `_ret` and
/// `_msg` types by naming convention; stream direction is in the variant's doc comment.
fn program(
    model: &Model,
    spec: &ast::Spec,
    file: &str,
    consts: &BTreeMap<String, ConstEntry>,
) -> Result<Option<Program>> {
    let Some(procs) = spec.definitions.iter().find_map(|d| match d {
        Definition::Enum(e) if e.name.ends_with("_procedure") => Some(e),
        _ => None,
    }) else {
        return Ok(None);
    };
    let prefix = procs.name.trim_end_matches("_procedure");
    let upper = prefix.to_ascii_uppercase();
    let number = |suffix: &str| -> Result<u32> {
        let name = format!("{upper}{suffix}");
        let c = consts.get(&name).ok_or_else(|| Error::Unknown {
            location: Location::new(file, procs.pos),
            kind: "constant",
            name: name.clone(),
        })?;
        u32::try_from(c.value).map_err(|_| Error::Invalid {
            location: Location::new(file, procs.pos),
            message: format!("{name} is not a 32-bit unsigned number"),
        })
    };
    let proc_prefix = format!("{upper}_PROC_");
    let mut procedures = Vec::new();
    for v in &procs.variants {
        let Some(base) = v.name.strip_prefix(&proc_prefix) else {
            return Err(Error::Invalid {
                location: Location::new(file, v.pos),
                message: format!("procedure `{}` does not start with {proc_prefix}", v.name),
            });
        };
        let lower = base.to_ascii_lowercase();
        let ty = |suffix: &str| {
            let n = format!("{prefix}_{lower}_{suffix}");
            model.types.contains_key(&n).then_some(n)
        };
        let mut stream = None;
        let mut priority_high = false;
        for line in v.doc.lines() {
            let line = line.trim().trim_start_matches('*').trim();
            let annotation = |key: &str| line.strip_prefix(key).map(|rest| rest.trim());
            let direction = if let Some(n) = annotation("@readstream:") {
                Some((StreamDirection::Read, n))
            } else {
                annotation("@writestream:").map(|n| (StreamDirection::Write, n))
            };
            if let Some((dir, n)) = direction {
                let param = n.parse::<u32>().map_err(|_| Error::Invalid {
                    location: Location::new(file, v.pos),
                    message: format!("stream annotation `{line}` needs a parameter number"),
                })?;
                stream = Some((dir, param));
            }
            if annotation("@priority:") == Some("high") {
                priority_high = true;
            }
        }
        procedures.push(Procedure {
            const_name: v.name.clone(),
            base_name: base.to_string(),
            number: const_value(consts, &v.value, file)?,
            args: ty("args"),
            ret: ty("ret"),
            message: ty("msg"),
            stream,
            priority_high,
        });
    }
    Ok(Some(Program {
        name: prefix.to_string(),
        number: number("_PROGRAM")?,
        version: number("_PROTOCOL_VERSION")?,
        procedures,
    }))
}
