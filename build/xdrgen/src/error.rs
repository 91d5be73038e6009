use std::fmt;

use crate::ast::Pos;

/// Where something is in the generator's input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    pub file: String,
    pub line: u32,
    pub col: u32,
}

impl Location {
    pub fn new(file: &str, pos: Pos) -> Self {
        Location {
            file: file.to_string(),
            line: pos.line,
            col: pos.col,
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.col)
    }
}

/// Everything the generator can refuse. Each carries the file:line:col it is about.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("{location}: {message}")]
    Parse { location: Location, message: String },
    #[error("{location}: unknown {kind} `{name}`")]
    Unknown {
        location: Location,
        kind: &'static str,
        name: String,
    },
    #[error("{location}: `{name}` is defined twice (first at {first})")]
    Duplicate {
        location: Location,
        name: String,
        first: Location,
    },
    #[error("{location}: {message}")]
    Invalid { location: Location, message: String },
    #[error("generated Rust does not parse: {0}")]
    Emit(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
