//! Managed object references: how vim25 names every server-side object.

use crate::error::{Error, Result};
use crate::xml::Element;

/// A managed object reference: the object's type and its server-assigned id, such as
/// `VirtualMachine:vm-42`. Only meaningful on the server (and, for session objects, in the
/// session) that issued it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ManagedObjectRef {
    /// The managed object type: `VirtualMachine`, `Folder`, `Task`, ….
    pub kind: String,
    /// The id: `vm-42`, `group-d1`, `task-7`, ….
    pub value: String,
}

impl ManagedObjectRef {
    /// A reference to the object of type `kind` with id `value`.
    pub fn new(kind: impl Into<String>, value: impl Into<String>) -> Self {
        ManagedObjectRef {
            kind: kind.into(),
            value: value.into(),
        }
    }

    /// Reads `<x type="Kind">value</x>`.
    pub(crate) fn from_element(element: &Element) -> Result<Self> {
        let kind = element.attribute("type").ok_or_else(|| {
            Error::malformed(
                "managed object reference",
                format!("<{}> has no type attribute", element.name()),
            )
        })?;
        if element.text().is_empty() {
            return Err(Error::malformed(
                "managed object reference",
                format!("<{}> has no value", element.name()),
            ));
        }
        Ok(ManagedObjectRef::new(kind, element.text()))
    }

    /// Reads the required child `name` of `parent` as a reference.
    pub(crate) fn child(parent: &Element, name: &str) -> Result<Self> {
        let child = parent.child(name).ok_or_else(|| {
            Error::malformed(
                format!("<{}>", parent.name()),
                format!("no <{name}> reference"),
            )
        })?;
        ManagedObjectRef::from_element(child)
    }
}

impl std::fmt::Display for ManagedObjectRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.kind, self.value)
    }
}
