//! Responses recorded from vcsim (and one hand-written for the vTPM vcsim lacks), decoded into
//! the typed values and snapshotted; every truncation of each is refused without a panic.

use crate::error::Error;
use crate::property::{ChangeOp, PropertyValue, RetrieveResult, UpdateSet, extra_config_path};
use crate::soap::parse_response;
use crate::types::{PowerState, ServiceContent, TaskInfo, TaskState, UserSession, VmInfo};
use crate::xml::Element;

const SERVICE_CONTENT: &[u8] = include_bytes!("testdata/vcsim-service_content.xml");
const LOGIN: &[u8] = include_bytes!("testdata/vcsim-login.xml");
const LOGIN_FAULT: &[u8] = include_bytes!("testdata/vcsim-login_fault.xml");
const VM_NAMES: &[u8] = include_bytes!("testdata/vcsim-vms.xml");
const VM_INFO: &[u8] = include_bytes!("testdata/vcsim-vminfo.xml");
const TASK_ERROR: &[u8] = include_bytes!("testdata/vcsim-task_error.xml");
const WAIT_INITIAL: &[u8] = include_bytes!("testdata/vcsim-wait_initial.xml");
const WAIT_CHANGE: &[u8] = include_bytes!("testdata/vcsim-wait_change.xml");
const WAIT_NONE: &[u8] = include_bytes!("testdata/vcsim-wait_none.xml");
const VTPM_DEVICES: &[u8] = include_bytes!("testdata/vtpm-devices.xml");

const ALL: &[(&str, &[u8])] = &[
    ("RetrieveServiceContent", SERVICE_CONTENT),
    ("Login", LOGIN),
    ("Login", LOGIN_FAULT),
    ("RetrievePropertiesEx", VM_NAMES),
    ("RetrievePropertiesEx", VM_INFO),
    ("RetrievePropertiesEx", TASK_ERROR),
    ("WaitForUpdatesEx", WAIT_INITIAL),
    ("WaitForUpdatesEx", WAIT_CHANGE),
    ("WaitForUpdatesEx", WAIT_NONE),
    ("RetrievePropertiesEx", VTPM_DEVICES),
];

fn response(method: &'static str, body: &[u8]) -> Element {
    parse_response(method, 200, body).expect("a response")
}

fn returnval(element: &Element) -> &Element {
    element.child("returnval").expect("returnval")
}

fn retrieved(body: &[u8]) -> RetrieveResult {
    RetrieveResult::from_element(returnval(&response("RetrievePropertiesEx", body)))
        .expect("RetrieveResult")
}

#[test]
fn service_content() {
    let content = ServiceContent::from_element(returnval(&response(
        "RetrieveServiceContent",
        SERVICE_CONTENT,
    )))
    .expect("ServiceContent");
    assert_eq!(content.about.api_version, "6.5");
    insta::assert_debug_snapshot!(content);
}

#[test]
fn login_and_its_fault() {
    let session =
        UserSession::from_element(returnval(&response("Login", LOGIN))).expect("UserSession");
    assert_eq!(session.user_name, "u");
    let error = parse_response("Login", 500, LOGIN_FAULT).expect_err("a fault");
    let Error::Fault { method, fault } = &error else {
        panic!("not a fault: {error}");
    };
    assert_eq!((*method, fault.kind.as_str()), ("Login", "InvalidLogin"));
    assert_eq!(error.to_string(), "call Login");
    assert_eq!(
        fault.to_string(),
        "vSphere fault InvalidLogin: Login failure"
    );
}

#[test]
fn objects_of_a_container_view() {
    let result = retrieved(VM_NAMES);
    assert_eq!(result.token, None);
    let names: Vec<_> = result
        .objects
        .iter()
        .map(|o| o.get("name").and_then(PropertyValue::text).unwrap_or("?"))
        .collect();
    assert_eq!(
        names,
        [
            "DC0_C0_RP0_VM0",
            "DC0_C1_RP0_VM0",
            "DC1_C0_RP0_VM0",
            "DC1_C1_RP0_VM0"
        ]
    );
    insta::assert_debug_snapshot!(result);
}

#[test]
fn vm_info() {
    let result = retrieved(VM_INFO);
    let info = VmInfo::from_content(&result.objects[0]).expect("VmInfo");
    assert_eq!(info.power_state, PowerState::PoweredOn);
    assert_eq!(
        info.extra_config.get("govcsim").map(String::as_str),
        Some("TRUE")
    );
    assert_eq!(info.guest_nics.len(), 1);
    assert!(info.tpm_endorsement_certificates.is_empty());
    insta::assert_debug_snapshot!(info);
}

#[test]
fn vtpm_endorsement_certificates() {
    let result = retrieved(VTPM_DEVICES);
    let devices = result.objects[0]
        .get("config.hardware.device")
        .expect("devices");
    let certificates = crate::types::tpm_endorsement_certificates(devices).expect("certificates");
    let lengths: Vec<_> = certificates.iter().map(Vec::len).collect();
    assert_eq!(lengths, [398, 403]);
    for der in &certificates {
        // A DER SEQUENCE with a two-byte length that covers exactly the rest.
        assert_eq!(der.get(..2), Some(&[0x30, 0x82][..]));
        let len = u16::from_be_bytes([der[2], der[3]]) as usize;
        assert_eq!(len + 4, der.len());
    }
    let broken = crate::xml::parse(
        br#"<val xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" xsi:type="ArrayOfVirtualDevice"><VirtualDevice xsi:type="VirtualTPM"><endorsementKeyCertificate>!!</endorsementKeyCertificate></VirtualDevice></val>"#,
    )
    .expect("XML");
    assert!(
        crate::types::tpm_endorsement_certificates(&PropertyValue::Other(broken)).is_err(),
        "bad base64 is refused"
    );
}

#[test]
fn a_failed_task() {
    let result = retrieved(TASK_ERROR);
    let PropertyValue::Other(info) = result.objects[0].get("info").expect("info") else {
        panic!("info is not a TaskInfo element");
    };
    let info = TaskInfo::from_element(info).expect("TaskInfo");
    assert_eq!(info.state, TaskState::Error);
    assert_eq!(
        info.error.as_ref().map(|f| f.kind.as_str()),
        Some("InvalidPowerState")
    );
    insta::assert_debug_snapshot!(info);
}

#[test]
fn updates_initial_changed_and_none() {
    let phase = extra_config_path("guestinfo.banlieue.phase");
    let initial = UpdateSet::from_element(returnval(&response("WaitForUpdatesEx", WAIT_INITIAL)))
        .expect("UpdateSet");
    insta::assert_debug_snapshot!("updates_initial", initial);
    let changed = UpdateSet::from_element(returnval(&response("WaitForUpdatesEx", WAIT_CHANGE)))
        .expect("UpdateSet");
    let change = changed
        .object_updates()
        .flat_map(|o| o.changes.iter())
        .find(|c| c.path == phase)
        .expect("the phase changed");
    assert_eq!(change.op, ChangeOp::Assign);
    assert_eq!(
        change.value,
        Some(PropertyValue::OptionValue {
            key: "guestinfo.banlieue.phase".into(),
            value: Box::new(PropertyValue::String("ready".into())),
        })
    );
    insta::assert_debug_snapshot!("updates_changed", changed);
    let none = response("WaitForUpdatesEx", WAIT_NONE);
    assert!(
        none.child("returnval").is_none(),
        "timed out: no update set"
    );
}

#[test]
fn every_truncation_is_refused_without_panic() {
    for (method, body) in ALL {
        let body = body.trim_ascii_end();
        // The whole body decodes (to a response, or to the fault it carries).
        assert!(matches!(
            parse_response(method, 200, body),
            Ok(_) | Err(Error::Fault { .. })
        ));
        for len in 0..body.len() {
            let result = parse_response(method, 200, &body[..len]);
            assert!(
                result.is_err(),
                "{method}: a body cut at {len} of {} bytes parsed",
                body.len()
            );
        }
    }
}

proptest::proptest! {
    /// Random bytes overwritten anywhere in a recorded response: parsing and decoding end in a
    /// value or an error, never a panic.
    #[test]
    fn mutated_responses_never_panic(
        which in 0..ALL.len(),
        edits in proptest::collection::vec((proptest::num::usize::ANY, proptest::num::u8::ANY), 1..8),
    ) {
        let (method, body) = ALL[which];
        let mut body = body.to_vec();
        for (at, byte) in edits {
            let at = at % body.len();
            body[at] = byte;
        }
        if let Ok(response) = parse_response(method, 200, &body)
            && let Some(returnval) = response.child("returnval")
        {
            let _ = ServiceContent::from_element(returnval);
            let _ = UserSession::from_element(returnval);
            let _ = UpdateSet::from_element(returnval);
            if let Ok(result) = RetrieveResult::from_element(returnval) {
                for object in &result.objects {
                    let _ = VmInfo::from_content(object);
                    if let Some(PropertyValue::Other(info)) = object.get("info") {
                        let _ = TaskInfo::from_element(info);
                    }
                }
            }
        }
    }
}
