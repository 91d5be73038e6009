//! A bounded XML tree: what a vim25 response is parsed into before typed decoding, and what an
//! untyped property value stays as. Namespaces are resolved once here, so decoders match
//! local names and read `xsi:type` whatever prefixes the server chose.

use quick_xml::NsReader;
use quick_xml::events::Event;
use quick_xml::name::{Namespace, QName, ResolveResult};

use crate::error::{Error, Result};

/// The deepest nesting accepted: vim25 answers nest about 15 levels (envelope, body, response,
/// returnval, propSet, val, device, backing, …); far deeper input is hostile or broken, and a
/// bound keeps the tree's recursive drop and walks off the end of the stack.
pub const MAX_DEPTH: usize = 64;

const XSI: &[u8] = b"http://www.w3.org/2001/XMLSchema-instance";
const XSD: &[u8] = b"http://www.w3.org/2001/XMLSchema";

/// One element: its local name, `xsi:type` (vim25 types bare, XML Schema types as `xsd:<name>`),
/// unqualified attributes, text and child elements.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Element {
    name: String,
    xsi_type: Option<String>,
    attributes: Vec<(String, String)>,
    text: String,
    children: Vec<Element>,
}

impl Element {
    /// The local name (without prefix).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The `xsi:type`: `OptionValue`, `ManagedObjectReference`, `xsd:string`, ….
    pub fn xsi_type(&self) -> Option<&str> {
        self.xsi_type.as_deref()
    }

    /// An unqualified attribute, such as a managed object reference's `type`.
    pub fn attribute(&self, name: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The text content, entities resolved (child elements' text excluded).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The child elements, in document order.
    pub fn children(&self) -> &[Element] {
        &self.children
    }

    /// The first child named `name`.
    pub fn child(&self, name: &str) -> Option<&Element> {
        self.children.iter().find(|c| c.name == name)
    }

    /// Every child named `name`.
    pub fn children_named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Element> {
        self.children.iter().filter(move |c| c.name == name)
    }

    /// The text of the first child named `name`.
    pub fn child_text(&self, name: &str) -> Option<&str> {
        self.child(name).map(Element::text)
    }

    #[cfg(test)]
    pub(crate) fn leaf(name: &str, xsi_type: Option<&str>, text: &str) -> Element {
        Element {
            name: name.to_owned(),
            xsi_type: xsi_type.map(str::to_owned),
            text: text.to_owned(),
            ..Element::default()
        }
    }
}

/// Parses a whole document into its root element. Refuses malformed XML, more than one root,
/// unclosed elements and nesting beyond [`MAX_DEPTH`]; never panics.
pub fn parse(bytes: &[u8]) -> Result<Element> {
    let mut reader = NsReader::from_reader(bytes);
    let config = reader.config_mut();
    // Not trimmed: a value's own leading or trailing spaces are data, and text split around
    // an entity would lose the spaces next to it. Indentation is dropped in `close`.
    config.trim_text(false);
    config.check_end_names = true;
    config.expand_empty_elements = false;
    let mut stack: Vec<Element> = Vec::new();
    let mut root: Option<Element> = None;
    loop {
        let event = reader.read_event().map_err(|e| malformed(e.to_string()))?;
        match event {
            Event::Start(start) => {
                if stack.len() >= MAX_DEPTH {
                    return Err(malformed(format!("nested deeper than {MAX_DEPTH}")));
                }
                if root.is_some() {
                    return Err(malformed("content after the root element"));
                }
                stack.push(open(&reader, &start)?);
            }
            Event::Empty(start) => {
                if stack.len() >= MAX_DEPTH {
                    return Err(malformed(format!("nested deeper than {MAX_DEPTH}")));
                }
                let element = open(&reader, &start)?;
                close(&mut stack, &mut root, element)?;
            }
            Event::End(_) => {
                let element = stack
                    .pop()
                    .ok_or_else(|| malformed("end tag without a start"))?;
                close(&mut stack, &mut root, element)?;
            }
            Event::Text(text) => {
                let text = text.xml_content().map_err(|e| malformed(e.to_string()))?;
                append_text(&mut stack, &text)?;
            }
            Event::CData(data) => {
                let text = data.decode().map_err(|e| malformed(e.to_string()))?;
                append_text(&mut stack, &text)?;
            }
            Event::GeneralRef(reference) => {
                let text = if reference.is_char_ref() {
                    let c = reference
                        .resolve_char_ref()
                        .map_err(|e| malformed(e.to_string()))?
                        .ok_or_else(|| malformed("an invalid character reference"))?;
                    c.to_string()
                } else {
                    let name = reference.decode().map_err(|e| malformed(e.to_string()))?;
                    quick_xml::escape::resolve_predefined_entity(&name)
                        .ok_or_else(|| malformed(format!("an unknown entity &{name};")))?
                        .to_owned()
                };
                append_text(&mut stack, &text)?;
            }
            Event::Eof => break,
            // Declarations, comments, processing instructions: no content.
            Event::Decl(_) | Event::Comment(_) | Event::PI(_) | Event::DocType(_) => {}
        }
    }
    if !stack.is_empty() {
        return Err(malformed("the document ends inside an element"));
    }
    root.ok_or_else(|| malformed("no root element"))
}

fn open(reader: &NsReader<&[u8]>, start: &quick_xml::events::BytesStart<'_>) -> Result<Element> {
    let (_, local) = reader.resolve_element(start.name());
    let mut element = Element {
        name: utf8(local.as_ref())?.to_owned(),
        ..Element::default()
    };
    for attribute in start.attributes() {
        let attribute = attribute.map_err(|e| malformed(e.to_string()))?;
        let (namespace, local) = reader.resolve_attribute(attribute.key);
        let value = attribute
            .unescape_value()
            .map_err(|e| malformed(e.to_string()))?;
        match namespace {
            ResolveResult::Bound(Namespace(ns)) if ns == XSI && local.as_ref() == b"type" => {
                element.xsi_type = Some(qualified_type(reader, &value)?);
            }
            ResolveResult::Unbound => {
                let name = utf8(local.as_ref())?;
                // Namespace declarations are not attributes of the data.
                if name != "xmlns" && !attribute.key.as_ref().starts_with(b"xmlns:") {
                    element
                        .attributes
                        .push((name.to_owned(), value.into_owned()));
                }
            }
            _ => {}
        }
    }
    Ok(element)
}

/// An `xsi:type` value resolved against the namespaces in scope: XML Schema types as
/// `xsd:<name>` whatever their prefix, every other type by its local name.
fn qualified_type(reader: &NsReader<&[u8]>, value: &str) -> Result<String> {
    let (namespace, local) = reader.resolve_element(QName(value.as_bytes()));
    let local = utf8(local.as_ref())?;
    Ok(match namespace {
        ResolveResult::Bound(Namespace(ns)) if ns == XSD => format!("xsd:{local}"),
        _ => local.to_owned(),
    })
}

fn close(stack: &mut [Element], root: &mut Option<Element>, mut element: Element) -> Result<()> {
    if !element.children.is_empty() && element.text.trim().is_empty() {
        element.text.clear();
    }
    match stack.last_mut() {
        Some(parent) => parent.children.push(element),
        None if root.is_none() => *root = Some(element),
        None => return Err(malformed("more than one root element")),
    }
    Ok(())
}

fn append_text(stack: &mut [Element], text: &str) -> Result<()> {
    match stack.last_mut() {
        Some(element) => {
            element.text.push_str(text);
            Ok(())
        }
        None if text.trim().is_empty() => Ok(()),
        None => Err(malformed("text outside the root element")),
    }
}

fn utf8(bytes: &[u8]) -> Result<&str> {
    std::str::from_utf8(bytes).map_err(|e| malformed(e.to_string()))
}

fn malformed(reason: impl Into<String>) -> Error {
    Error::Malformed {
        what: "XML".into(),
        reason: reason.into(),
    }
}

/// Escapes text for element content and attribute values.
pub(crate) fn escape(text: &str) -> std::borrow::Cow<'_, str> {
    quick_xml::escape::escape(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_resolve_to_local_names_and_schema_types() {
        let doc = br#"<?xml version="1.0"?>
            <e:Envelope xmlns:e="http://schemas.xmlsoap.org/soap/envelope/"
                xmlns:s="http://www.w3.org/2001/XMLSchema"
                xmlns:i="http://www.w3.org/2001/XMLSchema-instance">
              <e:Body><R xmlns="urn:vim25"><val i:type="s:string">a &amp; b&#x21;</val>
              <obj type="VirtualMachine">vm-1</obj><o i:type="OptionValue"/></R></e:Body>
            </e:Envelope>"#;
        let root = parse(doc).expect("parse");
        assert_eq!(root.name(), "Envelope");
        let r = root.child("Body").and_then(|b| b.child("R")).expect("R");
        let val = r.child("val").expect("val");
        assert_eq!(val.xsi_type(), Some("xsd:string"));
        assert_eq!(val.text(), "a & b!");
        let obj = r.child("obj").expect("obj");
        assert_eq!(obj.attribute("type"), Some("VirtualMachine"));
        assert_eq!(obj.attribute("xmlns"), None);
        assert_eq!(
            r.child("o").and_then(Element::xsi_type),
            Some("OptionValue")
        );
    }

    #[test]
    fn malformed_documents_are_refused() {
        for doc in [
            &b""[..],
            b"<a>",
            b"<a></b>",
            b"</a>",
            b"<a/><b/>",
            b"<a/>text",
            b"<a>&bogus;</a>",
            b"<a>&#0;</a>",
            b"<a x='1' x='2'/>",
        ] {
            assert!(parse(doc).is_err(), "{}", String::from_utf8_lossy(doc));
        }
    }

    #[test]
    fn nesting_is_bounded() {
        let ok = format!("{}{}", "<a>".repeat(MAX_DEPTH), "</a>".repeat(MAX_DEPTH));
        assert!(parse(ok.as_bytes()).is_ok());
        let deep = format!(
            "{}{}",
            "<a>".repeat(MAX_DEPTH + 1),
            "</a>".repeat(MAX_DEPTH + 1)
        );
        assert!(parse(deep.as_bytes()).is_err());
        // Empty elements count too.
        let deep_empty = format!(
            "{}<a/>{}",
            "<a>".repeat(MAX_DEPTH),
            "</a>".repeat(MAX_DEPTH)
        );
        assert!(parse(deep_empty.as_bytes()).is_err());
        // A hostile depth fails fast rather than exhausting the stack.
        let hostile = "<a>".repeat(1_000_000);
        assert!(parse(hostile.as_bytes()).is_err());
    }
}
