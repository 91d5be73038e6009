//! The PropertyCollector's data: what to read (filter specs), what comes back (object
//! contents, update sets) and property values.

use crate::error::{Error, Fault, Result};
use crate::moref::ManagedObjectRef;
use crate::soap::{BodyWriter, localized_fault};
use crate::xml::Element;

/// The property path of one `config.extraConfig` entry, e.g.
/// `config.extraConfig["guestinfo.banlieue.phase"]`: a filter on it reports changes of that
/// key only. Keys containing `"` or `\` cannot be addressed this way.
pub fn extra_config_path(key: &str) -> String {
    format!("config.extraConfig[\"{key}\"]")
}

/// A property value: the vim25 scalar types typed, a `ManagedObjectReference`, an
/// `OptionValue` (an `extraConfig` entry), and everything else as its XML element.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PropertyValue {
    /// `xsd:string` (and `xsd:anyURI`, `xsd:dateTime`: text on the wire).
    String(String),
    /// `xsd:int`, `xsd:long`, `xsd:short`, `xsd:byte`.
    Int(i64),
    /// `xsd:boolean`.
    Bool(bool),
    /// `ManagedObjectReference`.
    MoRef(ManagedObjectRef),
    /// `OptionValue`: a key and a value, as `config.extraConfig["key"]` answers.
    OptionValue {
        /// The option's key, e.g. `guestinfo.banlieue.phase`.
        key: String,
        /// Its value.
        value: Box<PropertyValue>,
    },
    /// Any other type (arrays, data objects, enums): the `<val>` element itself.
    Other(Element),
}

impl PropertyValue {
    /// Decodes a `<val xsi:type="…">`. Scalars that do not parse are refused, not guessed.
    pub fn from_element(element: &Element) -> Result<PropertyValue> {
        let text = element.text();
        let value = match element.xsi_type() {
            Some("xsd:string" | "xsd:anyURI" | "xsd:dateTime") => {
                PropertyValue::String(text.to_owned())
            }
            Some("xsd:int" | "xsd:long" | "xsd:short" | "xsd:byte") => PropertyValue::Int(
                text.trim()
                    .parse()
                    .map_err(|_| Error::malformed("integer property", text))?,
            ),
            Some("xsd:boolean") => PropertyValue::Bool(match text.trim() {
                "true" | "1" => true,
                "false" | "0" => false,
                _ => return Err(Error::malformed("boolean property", text)),
            }),
            Some("ManagedObjectReference") => {
                PropertyValue::MoRef(ManagedObjectRef::from_element(element)?)
            }
            Some("OptionValue") => {
                let key = element
                    .child_text("key")
                    .ok_or_else(|| Error::malformed("OptionValue", "no <key>"))?
                    .to_owned();
                let value = match element.child("value") {
                    Some(value) => PropertyValue::from_element(value)?,
                    // A key without a value: vSphere's way of saying "unset".
                    None => PropertyValue::String(String::new()),
                };
                PropertyValue::OptionValue {
                    key,
                    value: Box::new(value),
                }
            }
            _ => PropertyValue::Other(element.clone()),
        };
        Ok(value)
    }

    /// The text of a string, or of a childless untyped value such as an enum
    /// (`runtime.powerState` is `<val xsi:type="VirtualMachinePowerState">poweredOn</val>`).
    pub fn text(&self) -> Option<&str> {
        match self {
            PropertyValue::String(s) => Some(s),
            PropertyValue::Other(e) if e.children().is_empty() => Some(e.text()),
            _ => None,
        }
    }

    /// The integer, if this is one.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            PropertyValue::Int(n) => Some(*n),
            _ => None,
        }
    }

    /// The reference, if this is one.
    pub fn as_moref(&self) -> Option<&ManagedObjectRef> {
        match self {
            PropertyValue::MoRef(r) => Some(r),
            _ => None,
        }
    }
}

/// Which properties to read from objects of one type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PropertySpec {
    /// The managed object type, e.g. `VirtualMachine`.
    pub kind: String,
    /// The property paths, e.g. `name`, `runtime.powerState`,
    /// `config.extraConfig["guestinfo.x"]`.
    pub paths: Vec<String>,
}

/// Where the collector starts: one object, or every object a `ContainerView` shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ObjectSpec {
    /// The object itself.
    Object(ManagedObjectRef),
    /// Every object in the view (the view itself is skipped).
    ContainerView(ManagedObjectRef),
}

/// What a `RetrievePropertiesEx` or a `CreateFilter` collects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PropertyFilterSpec {
    /// Which properties, per object type.
    pub properties: Vec<PropertySpec>,
    /// Where to start.
    pub objects: Vec<ObjectSpec>,
}

impl PropertyFilterSpec {
    /// `paths` of the single object `obj`.
    pub fn object(obj: &ManagedObjectRef, paths: &[&str]) -> Self {
        PropertyFilterSpec {
            properties: vec![PropertySpec {
                kind: obj.kind.clone(),
                paths: paths.iter().map(|p| (*p).to_owned()).collect(),
            }],
            objects: vec![ObjectSpec::Object(obj.clone())],
        }
    }

    /// `paths` of every object of type `kind` in the container view `view`.
    pub fn container_view(view: &ManagedObjectRef, kind: &str, paths: &[&str]) -> Self {
        PropertyFilterSpec {
            properties: vec![PropertySpec {
                kind: kind.to_owned(),
                paths: paths.iter().map(|p| (*p).to_owned()).collect(),
            }],
            objects: vec![ObjectSpec::ContainerView(view.clone())],
        }
    }

    /// Writes `<{name}>…</{name}>` (a `PropertyFilterSpec`) in WSDL order: propSet, objectSet.
    pub(crate) fn write(&self, writer: &mut BodyWriter, name: &str) {
        writer.open(name);
        for property in &self.properties {
            writer.open("propSet").text("type", &property.kind);
            writer.text("all", "false");
            for path in &property.paths {
                writer.text("pathSet", path);
            }
            writer.close("propSet");
        }
        for object in &self.objects {
            writer.open("objectSet");
            match object {
                ObjectSpec::Object(obj) => {
                    writer.moref("obj", obj).text("skip", "false");
                }
                ObjectSpec::ContainerView(view) => {
                    writer.moref("obj", view).text("skip", "true");
                    writer
                        .open_typed("selectSet", "TraversalSpec")
                        .text("name", "traverseView")
                        .text("type", "ContainerView")
                        .text("path", "view")
                        .text("skip", "false")
                        .close("selectSet");
                }
            }
            writer.close("objectSet");
        }
        writer.close(name);
    }
}

/// One object's properties, as `RetrievePropertiesEx` returns them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectContent {
    /// The object.
    pub obj: ManagedObjectRef,
    /// `(path, value)`, in the server's order; unset properties are absent.
    pub properties: Vec<(String, PropertyValue)>,
    /// Paths the server could not read, and why.
    pub missing: Vec<(String, Fault)>,
}

impl ObjectContent {
    /// The value at `path`, if the server returned one.
    pub fn get(&self, path: &str) -> Option<&PropertyValue> {
        self.properties
            .iter()
            .find(|(p, _)| p == path)
            .map(|(_, v)| v)
    }

    pub(crate) fn from_element(element: &Element) -> Result<ObjectContent> {
        let obj = ManagedObjectRef::child(element, "obj")?;
        let mut properties = Vec::new();
        for property in element.children_named("propSet") {
            let name = property
                .child_text("name")
                .ok_or_else(|| Error::malformed("DynamicProperty", "no <name>"))?;
            let value = property
                .child("val")
                .ok_or_else(|| Error::malformed("DynamicProperty", format!("{name}: no <val>")))?;
            properties.push((name.to_owned(), PropertyValue::from_element(value)?));
        }
        let missing = element
            .children_named("missingSet")
            .map(missing_property)
            .collect::<Result<_>>()?;
        Ok(ObjectContent {
            obj,
            properties,
            missing,
        })
    }
}

fn missing_property(element: &Element) -> Result<(String, Fault)> {
    let path = element
        .child_text("path")
        .ok_or_else(|| Error::malformed("MissingProperty", "no <path>"))?;
    let fault = element
        .child("fault")
        .map(localized_fault)
        .unwrap_or_else(|| Fault {
            kind: "MethodFault".into(),
            message: String::new(),
        });
    Ok((path.to_owned(), fault))
}

/// One page of a `RetrievePropertiesEx` answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetrieveResult {
    /// This page's objects.
    pub objects: Vec<ObjectContent>,
    /// Set when more pages follow: pass it to `ContinueRetrievePropertiesEx`.
    pub token: Option<String>,
}

impl RetrieveResult {
    pub(crate) fn from_element(returnval: &Element) -> Result<RetrieveResult> {
        Ok(RetrieveResult {
            objects: returnval
                .children_named("objects")
                .map(ObjectContent::from_element)
                .collect::<Result<_>>()?,
            token: returnval.child_text("token").map(str::to_owned),
        })
    }
}

/// How a property changed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ChangeOp {
    /// An element was added to an array property.
    Add,
    /// An element was removed, or the property became unset.
    Remove,
    /// The property was set.
    Assign,
    /// The property went away because its parent did.
    IndirectRemove,
    /// A value this client does not know, kept as sent.
    Other(String),
}

impl ChangeOp {
    fn from_wire(text: &str) -> ChangeOp {
        match text {
            "add" => ChangeOp::Add,
            "remove" => ChangeOp::Remove,
            "assign" => ChangeOp::Assign,
            "indirectRemove" => ChangeOp::IndirectRemove,
            other => ChangeOp::Other(other.to_owned()),
        }
    }
}

/// One property change in an update.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PropertyChange {
    /// The path, as the filter named it (`config.extraConfig["guestinfo.x"]`) or a parent.
    pub path: String,
    /// How it changed.
    pub op: ChangeOp,
    /// The new value; `None` for removals and for properties that became unset.
    pub value: Option<PropertyValue>,
}

/// How an object relates to a filter in an update.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ObjectUpdateKind {
    /// The object entered the filter's set (or this is the first update).
    Enter,
    /// Some of its properties changed.
    Modify,
    /// The object left the set (e.g. it was destroyed).
    Leave,
    /// A value this client does not know, kept as sent.
    Other(String),
}

/// One object's changes in an update.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectUpdate {
    /// How the object relates to the filter.
    pub kind: ObjectUpdateKind,
    /// The object.
    pub obj: ManagedObjectRef,
    /// Its changed properties (all the filter's, for `Enter`).
    pub changes: Vec<PropertyChange>,
}

/// One filter's part of an update.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterUpdate {
    /// The filter.
    pub filter: ManagedObjectRef,
    /// The objects it reports on.
    pub objects: Vec<ObjectUpdate>,
}

/// What `WaitForUpdatesEx` returned: the changes since the version passed in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpdateSet {
    /// Pass this to the next wait to get only later changes.
    pub version: String,
    /// What each filter reports.
    pub filters: Vec<FilterUpdate>,
    /// The server had more than it sent; the next wait returns the rest.
    pub truncated: bool,
}

impl UpdateSet {
    /// Every object update of every filter.
    pub fn object_updates(&self) -> impl Iterator<Item = &ObjectUpdate> {
        self.filters.iter().flat_map(|f| f.objects.iter())
    }

    pub(crate) fn from_element(returnval: &Element) -> Result<UpdateSet> {
        let version = returnval
            .child_text("version")
            .ok_or_else(|| Error::malformed("UpdateSet", "no <version>"))?
            .to_owned();
        let mut filters = Vec::new();
        for filter in returnval.children_named("filterSet") {
            let mut objects = Vec::new();
            for object in filter.children_named("objectSet") {
                let kind = match object.child_text("kind") {
                    Some("enter") => ObjectUpdateKind::Enter,
                    Some("modify") => ObjectUpdateKind::Modify,
                    Some("leave") => ObjectUpdateKind::Leave,
                    Some(other) => ObjectUpdateKind::Other(other.to_owned()),
                    None => return Err(Error::malformed("ObjectUpdate", "no <kind>")),
                };
                let mut changes = Vec::new();
                for change in object.children_named("changeSet") {
                    let path = change
                        .child_text("name")
                        .ok_or_else(|| Error::malformed("PropertyChange", "no <name>"))?;
                    let op = change
                        .child_text("op")
                        .ok_or_else(|| Error::malformed("PropertyChange", "no <op>"))?;
                    changes.push(PropertyChange {
                        path: path.to_owned(),
                        op: ChangeOp::from_wire(op),
                        value: change
                            .child("val")
                            .map(PropertyValue::from_element)
                            .transpose()?,
                    });
                }
                objects.push(ObjectUpdate {
                    kind,
                    obj: ManagedObjectRef::child(object, "obj")?,
                    changes,
                });
            }
            filters.push(FilterUpdate {
                filter: ManagedObjectRef::child(filter, "filter")?,
                objects,
            });
        }
        Ok(UpdateSet {
            version,
            filters,
            truncated: returnval.child_text("truncated") == Some("true"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalar_values_are_typed_and_bad_ones_refused() {
        let value =
            |t: &str, text: &str| PropertyValue::from_element(&Element::leaf("val", Some(t), text));
        assert_eq!(value("xsd:int", "42").ok(), Some(PropertyValue::Int(42)));
        assert_eq!(value("xsd:long", "-7").ok(), Some(PropertyValue::Int(-7)));
        assert_eq!(
            value("xsd:boolean", "true").ok(),
            Some(PropertyValue::Bool(true))
        );
        assert_eq!(
            value("xsd:string", " x ").ok(),
            Some(PropertyValue::String(" x ".into()))
        );
        assert!(value("xsd:int", "4x").is_err());
        assert!(value("xsd:long", "99999999999999999999").is_err());
        assert!(value("xsd:boolean", "yes").is_err());
        assert!(
            value("ManagedObjectReference", "vm-1").is_err(),
            "no type attribute"
        );
        let state = value("VirtualMachinePowerState", "poweredOn").expect("enum");
        assert_eq!(state.text(), Some("poweredOn"));
    }

    #[test]
    fn extra_config_paths_quote_the_key() {
        assert_eq!(
            extra_config_path("guestinfo.banlieue.phase"),
            r#"config.extraConfig["guestinfo.banlieue.phase"]"#
        );
    }
}
