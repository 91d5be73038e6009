//! The syntax tree of an RPC-language file, as written (names unresolved).

/// A position in an input file, 1-based.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Pos {
    pub line: u32,
    pub col: u32,
}

/// One parsed `.x` file.
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    pub definitions: Vec<Definition>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Definition {
    Const(Const),
    Enum(Enum),
    Struct(Struct),
    Union(Union),
    Typedef(Declaration),
}

impl Definition {
    pub fn name(&self) -> &str {
        match self {
            Definition::Const(c) => &c.name,
            Definition::Enum(e) => &e.name,
            Definition::Struct(s) => &s.name,
            Definition::Union(u) => &u.name,
            Definition::Typedef(d) => d.name(),
        }
    }

    pub fn pos(&self) -> Pos {
        match self {
            Definition::Const(c) => c.pos,
            Definition::Enum(e) => e.pos,
            Definition::Struct(s) => s.pos,
            Definition::Union(u) => u.pos,
            Definition::Typedef(d) => d.pos,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Const {
    pub name: String,
    pub value: Value,
    pub pos: Pos,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Enum {
    pub name: String,
    pub variants: Vec<EnumVariant>,
    pub pos: Pos,
}

#[derive(Debug, Clone, PartialEq)]
pub struct EnumVariant {
    pub name: String,
    pub value: Value,
    /// The text of the comments written just before the variant; libvirt keeps its
    /// per-procedure annotations (`@readstream: 1`) there.
    pub doc: String,
    pub pos: Pos,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Struct {
    pub name: String,
    pub fields: Vec<Declaration>,
    pub pos: Pos,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Union {
    pub name: String,
    pub discriminant: Declaration,
    pub arms: Vec<UnionArm>,
    pub default: Option<Declaration>,
    pub pos: Pos,
}

#[derive(Debug, Clone, PartialEq)]
pub struct UnionArm {
    pub labels: Vec<Value>,
    pub body: Declaration,
}

/// A literal number or a reference to a named constant.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Literal(i64),
    Named { name: String, pos: Pos },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Declaration {
    pub kind: DeclarationKind,
    pub pos: Pos,
}

impl Declaration {
    pub fn name(&self) -> &str {
        match &self.kind {
            DeclarationKind::Void => "",
            DeclarationKind::Named { name, .. } => name,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum DeclarationKind {
    Void,
    Named {
        name: String,
        ty: TypeSpec,
        shape: Shape,
    },
}

/// How a declared name wraps its type.
#[derive(Debug, Clone, PartialEq)]
pub enum Shape {
    Scalar,
    /// `T name[N]`
    FixedArray(Value),
    /// `T name<N>` or `T name<>`
    VarArray(Option<Value>),
    /// `T *name`
    Optional,
}

#[derive(Debug, Clone, PartialEq)]
pub enum TypeSpec {
    Int {
        unsigned: bool,
    },
    Hyper {
        unsigned: bool,
    },
    /// `char` and `short` travel as 4-byte integers, as rpcgen encodes them.
    Char {
        unsigned: bool,
    },
    Short {
        unsigned: bool,
    },
    Float,
    Double,
    Bool,
    Opaque,
    String,
    Named {
        name: String,
        pos: Pos,
    },
}
