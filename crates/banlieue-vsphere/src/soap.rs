//! SOAP 1.1 envelopes: writing a vim25 request body and reading a response or a fault.
//! Pure functions over strings and bytes; the HTTP shell lives in `client`.

use std::fmt::Write as _;

use crate::error::{Error, Fault, Result};
use crate::moref::ManagedObjectRef;
use crate::xml::{self, Element};

/// The vim25 namespace every method and type lives in.
pub const VIM25_NAMESPACE: &str = "urn:vim25";

const ENVELOPE_START: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
<soapenv:Envelope xmlns:soapenv=\"http://schemas.xmlsoap.org/soap/envelope/\" \
xmlns:xsd=\"http://www.w3.org/2001/XMLSchema\" \
xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\">\
<soapenv:Body>";
const ENVELOPE_END: &str = "</soapenv:Body></soapenv:Envelope>";

/// A request ready to POST to `/sdk`: the method it calls and its SOAP envelope. `Debug`
/// shows the method and the envelope's size, never the envelope: `Login`'s holds the password.
#[derive(Clone, PartialEq, Eq)]
pub struct Request {
    /// The vim25 method, e.g. `RetrievePropertiesEx`: the response is `<{method}Response>`.
    pub method: &'static str,
    /// The whole envelope, UTF-8.
    pub body: String,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("method", &self.method)
            .field("body", &format_args!("<{} bytes>", self.body.len()))
            .finish()
    }
}

/// Writes one method call's body. Element order is the WSDL's sequence order, which the
/// callers keep: vCenter validates it (vcsim does not). No `Debug`: the body may hold a
/// password.
pub(crate) struct BodyWriter {
    method: &'static str,
    buf: String,
}

impl BodyWriter {
    /// `<{method} xmlns="urn:vim25"><_this type="…">…</_this>`.
    pub(crate) fn new(method: &'static str, this: &ManagedObjectRef) -> Self {
        let mut writer = BodyWriter {
            method,
            buf: String::from(ENVELOPE_START),
        };
        let _ = write!(writer.buf, "<{method} xmlns=\"{VIM25_NAMESPACE}\">");
        writer.moref("_this", this);
        writer
    }

    /// `<name>text</name>`.
    pub(crate) fn text(&mut self, name: &str, text: &str) -> &mut Self {
        let _ = write!(self.buf, "<{name}>{}</{name}>", xml::escape(text));
        self
    }

    /// `<name xsi:type="type">text</name>`, for `xsd:anyType` fields.
    pub(crate) fn typed_text(&mut self, name: &str, xsi_type: &str, text: &str) -> &mut Self {
        let _ = write!(
            self.buf,
            "<{name} xsi:type=\"{xsi_type}\">{}</{name}>",
            xml::escape(text)
        );
        self
    }

    /// `<name type="Kind">value</name>`.
    pub(crate) fn moref(&mut self, name: &str, reference: &ManagedObjectRef) -> &mut Self {
        let _ = write!(
            self.buf,
            "<{name} type=\"{}\">{}</{name}>",
            xml::escape(&reference.kind),
            xml::escape(&reference.value)
        );
        self
    }

    /// `<name>`.
    pub(crate) fn open(&mut self, name: &str) -> &mut Self {
        let _ = write!(self.buf, "<{name}>");
        self
    }

    /// `<name xsi:type="type">`, for a field whose declared type is a base type.
    pub(crate) fn open_typed(&mut self, name: &str, xsi_type: &str) -> &mut Self {
        let _ = write!(self.buf, "<{name} xsi:type=\"{xsi_type}\">");
        self
    }

    /// `</name>`.
    pub(crate) fn close(&mut self, name: &str) -> &mut Self {
        let _ = write!(self.buf, "</{name}>");
        self
    }

    /// The finished envelope.
    pub(crate) fn finish(mut self) -> Request {
        let _ = write!(self.buf, "</{}>{ENVELOPE_END}", self.method);
        Request {
            method: self.method,
            body: self.buf,
        }
    }
}

/// Reads a response to `method`: the `<{method}Response>` element, or the server's fault as
/// [`Error::Fault`]. `status` is the HTTP status: vim25 sends faults with 500, and any other
/// answer that is not a SOAP envelope becomes [`Error::Status`].
pub fn parse_response(method: &'static str, status: u16, body: &[u8]) -> Result<Element> {
    let envelope = match xml::parse(body) {
        Ok(envelope) if envelope.name() == "Envelope" => envelope,
        Ok(_) | Err(_) if status != 200 => {
            return Err(Error::Status {
                method,
                status,
                body: excerpt(body),
            });
        }
        Ok(other) => {
            return Err(Error::malformed(
                format!("{method} response"),
                format!("the root element is <{}>, not <Envelope>", other.name()),
            ));
        }
        Err(e) => return Err(e),
    };
    let soap_body = envelope.child("Body").ok_or_else(|| {
        Error::malformed(format!("{method} response"), "no <Body> in the envelope")
    })?;
    if let Some(fault) = soap_body.child("Fault") {
        return Err(Error::Fault {
            method,
            fault: soap_fault(fault),
        });
    }
    let expected = format!("{method}Response");
    soap_body.child(&expected).cloned().ok_or_else(|| {
        Error::malformed(
            format!("{method} response"),
            format!("no <{expected}> in the body"),
        )
    })
}

/// A `<soapenv:Fault>`: the detail's type, else the fault code, and the fault string.
pub(crate) fn soap_fault(fault: &Element) -> Fault {
    let message = fault
        .child_text("faultstring")
        .unwrap_or_default()
        .to_owned();
    let detail_kind = fault
        .child("detail")
        .and_then(|d| d.children().first())
        .map(|d| match d.xsi_type() {
            Some(kind) => kind.to_owned(),
            None => d
                .name()
                .strip_suffix("Fault")
                .unwrap_or(d.name())
                .to_owned(),
        });
    let kind = detail_kind.unwrap_or_else(|| {
        let code = fault.child_text("faultcode").unwrap_or("UnknownFault");
        code.rsplit(':').next().unwrap_or(code).to_owned()
    });
    Fault { kind, message }
}

/// A `LocalizedMethodFault` (a task's `info.error`): the inner fault's type and the message.
pub(crate) fn localized_fault(error: &Element) -> Fault {
    let inner = error.child("fault");
    let kind = inner
        .and_then(Element::xsi_type)
        .unwrap_or("MethodFault")
        .to_owned();
    let message = error
        .child_text("localizedMessage")
        .filter(|m| !m.is_empty())
        .or_else(|| {
            inner
                .and_then(|f| f.child("faultMessage"))
                .and_then(|m| m.child_text("message"))
        })
        .unwrap_or_default()
        .to_owned();
    Fault { kind, message }
}

/// The start of a body for an error message, lossily decoded.
fn excerpt(body: &[u8]) -> String {
    const MAX: usize = 512;
    let text = String::from_utf8_lossy(&body[..body.len().min(MAX)]);
    if body.len() > MAX {
        format!("{text}…")
    } else {
        text.into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_escape_text_and_references() {
        let mut writer = BodyWriter::new("Login", &ManagedObjectRef::new("SessionManager", "sm"));
        writer
            .text("userName", "a<b&c")
            .typed_text("value", "xsd:string", "\"q\"");
        let request = writer.finish();
        assert_eq!(request.method, "Login");
        assert!(request.body.contains("<userName>a&lt;b&amp;c</userName>"));
        assert!(
            request
                .body
                .contains("<value xsi:type=\"xsd:string\">&quot;q&quot;</value>")
        );
        assert!(xml::parse(request.body.as_bytes()).is_ok());
    }

    #[test]
    fn a_fault_without_detail_takes_the_fault_code() {
        let body = br#"<?xml version="1.0"?><soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/"><soapenv:Body><soapenv:Fault><faultcode>soapenv:Server</faultcode><faultstring>broken</faultstring></soapenv:Fault></soapenv:Body></soapenv:Envelope>"#;
        let error = parse_response("Logout", 500, body).expect_err("fault");
        assert_eq!(
            error.fault(),
            Some(&Fault {
                kind: "Server".into(),
                message: "broken".into()
            })
        );
    }

    #[test]
    fn non_soap_answers_report_the_status() {
        let error = parse_response("Login", 503, b"<html>busy</html>").expect_err("status");
        assert!(
            matches!(error, Error::Status { status: 503, .. }),
            "{error}"
        );
        let error = parse_response("Login", 200, b"not xml").expect_err("malformed");
        assert!(matches!(error, Error::Malformed { .. }), "{error}");
        let error = parse_response("Login", 200, b"<html/>").expect_err("malformed");
        assert!(matches!(error, Error::Malformed { .. }), "{error}");
    }
}
