//! Every event kind against the protocol tables, and every message through its wire form.

use std::collections::BTreeSet;

use super::*;
use crate::params::TypedValue;
use crate::proto::remote::{
    RemoteDomainEventGraphicsAddress, RemoteDomainEventGraphicsIdentity, RemoteNonnullDomain,
    RemoteTypedParam, RemoteTypedParamValue,
};
use crate::xdr::Xdr;

/// (family, event id, procedure) of every typed event.
macro_rules! kinds {
    ($($event:ty),* $(,)?) => {
        vec![$((<$event>::FAMILY, <$event>::EVENT_ID, <$event>::PROCEDURE, stringify!($event))),*]
    };
}

fn all_kinds() -> Vec<(EventFamily, i32, i32, &'static str)> {
    kinds![
        DomainLifecycleEvent,
        RebootEvent,
        RtcChangeEvent,
        WatchdogEvent,
        IoErrorEvent,
        GraphicsEvent,
        IoErrorReasonEvent,
        ControlErrorEvent,
        BlockJobEvent,
        DiskChangeEvent,
        TrayChangeEvent,
        PmWakeupEvent,
        PmSuspendEvent,
        BalloonChangeEvent,
        PmSuspendDiskEvent,
        DeviceRemovedEvent,
        BlockJob2Event,
        TunableEvent,
        AgentLifecycleEvent,
        DeviceAddedEvent,
        MigrationIterationEvent,
        JobCompletedEvent,
        DeviceRemovalFailedEvent,
        MetadataChangeEvent,
        BlockThresholdEvent,
        MemoryFailureEvent,
        MemoryDeviceSizeChangeEvent,
        NicMacChangeEvent,
        StoragePoolLifecycleEvent,
        StoragePoolRefreshEvent,
        NetworkLifecycleEvent,
        NetworkMetadataChangeEvent,
    ]
}

#[test]
fn every_event_procedure_of_these_families_has_a_typed_event() {
    let short = |name: &'static str| name.strip_prefix("REMOTE_PROC_").unwrap_or(name);
    let names: BTreeSet<&str> = remote::PROCEDURES.iter().map(|p| short(p.name)).collect();
    // The legacy forms (no callback id) are only sent for the legacy registrations, which
    // this client never makes: DOMAIN_EVENT_X where DOMAIN_EVENT_CALLBACK_X exists.
    let legacy = |name: &str| {
        name.strip_prefix("DOMAIN_EVENT_")
            .is_some_and(|rest| names.contains(format!("DOMAIN_EVENT_CALLBACK_{rest}").as_str()))
    };
    let expected: BTreeSet<i32> = remote::PROCEDURES
        .iter()
        .filter(|p| p.message.is_some())
        .filter(|p| {
            ["DOMAIN_EVENT_", "STORAGE_POOL_EVENT_", "NETWORK_EVENT_"]
                .iter()
                .any(|prefix| short(p.name).starts_with(prefix))
        })
        .filter(|p| !legacy(short(p.name)))
        .map(|p| p.number)
        .collect();
    let typed: BTreeSet<i32> = all_kinds().iter().map(|k| k.2).collect();
    assert_eq!(
        typed.len(),
        all_kinds().len(),
        "one procedure per event type"
    );
    assert_eq!(
        typed, expected,
        "typed events and the remote program's event procedures differ"
    );
}

#[test]
fn every_event_id_is_registered_by_exactly_one_type() {
    let ids = |family| -> Vec<i32> {
        let mut ids: Vec<i32> = all_kinds()
            .into_iter()
            .filter(|k| k.0 == family)
            .map(|k| k.1)
            .collect();
        ids.sort_unstable();
        ids
    };
    let known = |values: Vec<i32>| -> Vec<i32> {
        let mut v = values;
        v.sort_unstable();
        v
    };
    assert_eq!(
        ids(EventFamily::Domain),
        known(DomainEventId::KNOWN.iter().map(|i| i.raw()).collect())
    );
    assert_eq!(
        ids(EventFamily::StoragePool),
        known(StoragePoolEventId::KNOWN.iter().map(|i| i.raw()).collect())
    );
    assert_eq!(
        ids(EventFamily::Network),
        known(NetworkEventId::KNOWN.iter().map(|i| i.raw()).collect())
    );
}

/// Encodes `message` as the daemon would, decodes it and types it.
fn through_the_wire<E: EventKind>(message: E::Message) -> (i32, E) {
    let bytes = message.to_bytes().expect("encodes");
    E::from_message(E::Message::from_bytes(&bytes).expect("decodes"))
}

fn dom() -> RemoteNonnullDomain {
    RemoteNonnullDomain {
        name: "vm-1".into(),
        uuid: *b"0123456789abcdef",
        id: 3,
    }
}

fn param(field: &str, value: RemoteTypedParamValue) -> RemoteTypedParam {
    RemoteTypedParam {
        field: field.into(),
        value,
    }
}

#[test]
fn messages_become_typed_events() {
    let mut out = Vec::new();
    macro_rules! show {
        ($event:ty, $message:expr) => {{
            let (callback_id, event) = through_the_wire::<$event>($message);
            out.push(format!("{callback_id} {event:?}"));
            event
        }};
    }
    let e = show!(
        DomainLifecycleEvent,
        remote::RemoteDomainEventCallbackLifecycleMsg {
            callback_id: 1,
            msg: remote::RemoteDomainEventLifecycleMsg {
                dom: dom(),
                event: 5,
                detail: 1,
            },
        }
    );
    assert_eq!(e.event, DomainEventType::Stopped);
    show!(
        RebootEvent,
        remote::RemoteDomainEventCallbackRebootMsg {
            callback_id: 2,
            msg: remote::RemoteDomainEventRebootMsg { dom: dom() },
        }
    );
    let e = show!(
        RtcChangeEvent,
        remote::RemoteDomainEventCallbackRtcChangeMsg {
            callback_id: 3,
            msg: remote::RemoteDomainEventRtcChangeMsg {
                dom: dom(),
                offset: -3600,
            },
        }
    );
    assert_eq!(e.offset_seconds, -3600);
    let e = show!(
        WatchdogEvent,
        remote::RemoteDomainEventCallbackWatchdogMsg {
            callback_id: 4,
            msg: remote::RemoteDomainEventWatchdogMsg {
                dom: dom(),
                action: 6,
            },
        }
    );
    assert_eq!(e.action, WatchdogAction::InjectNmi);
    show!(
        IoErrorEvent,
        remote::RemoteDomainEventCallbackIoErrorMsg {
            callback_id: 5,
            msg: remote::RemoteDomainEventIoErrorMsg {
                dom: dom(),
                src_path: "/var/lib/libvirt/images/a.qcow2".into(),
                dev_alias: "virtio-disk0".into(),
                action: 1,
            },
        }
    );
    let e = show!(
        GraphicsEvent,
        remote::RemoteDomainEventCallbackGraphicsMsg {
            callback_id: 6,
            msg: remote::RemoteDomainEventGraphicsMsg {
                dom: dom(),
                phase: 1,
                local: RemoteDomainEventGraphicsAddress {
                    family: 0,
                    node: "127.0.0.1".into(),
                    service: "5900".into(),
                },
                remote: RemoteDomainEventGraphicsAddress {
                    family: 1,
                    node: "::1".into(),
                    service: "40000".into(),
                },
                auth_scheme: "vnc".into(),
                subject: vec![RemoteDomainEventGraphicsIdentity {
                    r#type: "x509dname".into(),
                    name: "CN=viewer".into(),
                }],
            },
        }
    );
    assert_eq!(e.remote.family, GraphicsAddressFamily::Ipv6);
    assert_eq!(e.subject, [("x509dname".into(), "CN=viewer".into())]);
    show!(
        IoErrorReasonEvent,
        remote::RemoteDomainEventCallbackIoErrorReasonMsg {
            callback_id: 7,
            msg: remote::RemoteDomainEventIoErrorReasonMsg {
                dom: dom(),
                src_path: "/dev/sdb".into(),
                dev_alias: "virtio-disk1".into(),
                action: 2,
                reason: "enospc".into(),
            },
        }
    );
    show!(
        ControlErrorEvent,
        remote::RemoteDomainEventCallbackControlErrorMsg {
            callback_id: 8,
            msg: remote::RemoteDomainEventControlErrorMsg { dom: dom() },
        }
    );
    show!(
        BlockJobEvent,
        remote::RemoteDomainEventCallbackBlockJobMsg {
            callback_id: 9,
            msg: remote::RemoteDomainEventBlockJobMsg {
                dom: dom(),
                path: "/images/a.qcow2".into(),
                r#type: 2,
                status: 3,
            },
        }
    );
    show!(
        DiskChangeEvent,
        remote::RemoteDomainEventCallbackDiskChangeMsg {
            callback_id: 10,
            msg: remote::RemoteDomainEventDiskChangeMsg {
                dom: dom(),
                old_src_path: Some("/media/old.iso".into()),
                new_src_path: None,
                dev_alias: "ide0-0-0".into(),
                reason: 0,
            },
        }
    );
    show!(
        TrayChangeEvent,
        remote::RemoteDomainEventCallbackTrayChangeMsg {
            callback_id: 11,
            msg: remote::RemoteDomainEventTrayChangeMsg {
                dom: dom(),
                dev_alias: "ide0-0-0".into(),
                reason: 1,
            },
        }
    );
    show!(
        PmWakeupEvent,
        remote::RemoteDomainEventCallbackPmwakeupMsg {
            callback_id: 12,
            reason: 0,
            msg: remote::RemoteDomainEventPmwakeupMsg { dom: dom() },
        }
    );
    show!(
        PmSuspendEvent,
        remote::RemoteDomainEventCallbackPmsuspendMsg {
            callback_id: 13,
            reason: 0,
            msg: remote::RemoteDomainEventPmsuspendMsg { dom: dom() },
        }
    );
    show!(
        BalloonChangeEvent,
        remote::RemoteDomainEventCallbackBalloonChangeMsg {
            callback_id: 14,
            msg: remote::RemoteDomainEventBalloonChangeMsg {
                dom: dom(),
                actual: 524_288,
            },
        }
    );
    show!(
        PmSuspendDiskEvent,
        remote::RemoteDomainEventCallbackPmsuspendDiskMsg {
            callback_id: 15,
            reason: 0,
            msg: remote::RemoteDomainEventPmsuspendDiskMsg { dom: dom() },
        }
    );
    show!(
        DeviceRemovedEvent,
        remote::RemoteDomainEventCallbackDeviceRemovedMsg {
            callback_id: 16,
            msg: remote::RemoteDomainEventDeviceRemovedMsg {
                dom: dom(),
                dev_alias: "usb-disk9".into(),
            },
        }
    );
    show!(
        BlockJob2Event,
        remote::RemoteDomainEventBlockJob2Msg {
            callback_id: 17,
            dom: dom(),
            dst: "vda".into(),
            r#type: 4,
            status: 0,
        }
    );
    let e = show!(
        TunableEvent,
        remote::RemoteDomainEventCallbackTunableMsg {
            callback_id: 18,
            dom: dom(),
            params: vec![
                param(
                    "cputune.vcpupin0",
                    RemoteTypedParamValue::String("0".into())
                ),
                param("cputune.cpu_shares", RemoteTypedParamValue::Ullong(2048)),
            ],
        }
    );
    assert_eq!(e.params.u64("cputune.cpu_shares"), Some(2048));
    let e = show!(
        AgentLifecycleEvent,
        remote::RemoteDomainEventCallbackAgentLifecycleMsg {
            callback_id: 19,
            dom: dom(),
            state: 1,
            reason: 2,
        }
    );
    assert!(e.connected());
    show!(
        DeviceAddedEvent,
        remote::RemoteDomainEventCallbackDeviceAddedMsg {
            callback_id: 20,
            dom: dom(),
            dev_alias: "virtio-disk2".into(),
        }
    );
    show!(
        MigrationIterationEvent,
        remote::RemoteDomainEventCallbackMigrationIterationMsg {
            callback_id: 21,
            dom: dom(),
            iteration: 2,
        }
    );
    let e = show!(
        JobCompletedEvent,
        remote::RemoteDomainEventCallbackJobCompletedMsg {
            callback_id: 22,
            dom: dom(),
            params: vec![
                param("type", RemoteTypedParamValue::Int(3)),
                param("time_elapsed", RemoteTypedParamValue::Ullong(1234)),
                param("compression_ratio", RemoteTypedParamValue::Double(0.25)),
            ],
        }
    );
    assert_eq!(
        e.params.get("compression_ratio"),
        Some(&TypedValue::Double(0.25))
    );
    show!(
        DeviceRemovalFailedEvent,
        remote::RemoteDomainEventCallbackDeviceRemovalFailedMsg {
            callback_id: 23,
            dom: dom(),
            dev_alias: "hostdev0".into(),
        }
    );
    let e = show!(
        MetadataChangeEvent,
        remote::RemoteDomainEventCallbackMetadataChangeMsg {
            callback_id: 24,
            dom: dom(),
            r#type: 2,
            nsuri: Some("https://banlieue.example/meta".into()),
        }
    );
    assert_eq!(e.kind, MetadataType::Element);
    show!(
        BlockThresholdEvent,
        remote::RemoteDomainEventBlockThresholdMsg {
            callback_id: 25,
            dom: dom(),
            dev: "vda[1]".into(),
            path: None,
            threshold: 1 << 30,
            excess: 4096,
        }
    );
    let e = show!(
        MemoryFailureEvent,
        remote::RemoteDomainEventMemoryFailureMsg {
            callback_id: 26,
            dom: dom(),
            recipient: 1,
            action: 9,
            flags: 3,
        }
    );
    assert_eq!(
        e.action,
        MemoryFailureAction::Unknown(9),
        "a newer action stays readable"
    );
    assert!(e.flags.contains(MemoryFailureFlags::RECURSIVE));
    show!(
        MemoryDeviceSizeChangeEvent,
        remote::RemoteDomainEventMemoryDeviceSizeChangeMsg {
            callback_id: 27,
            dom: dom(),
            alias: "virtiomem0".into(),
            size: 1 << 20,
        }
    );
    show!(
        NicMacChangeEvent,
        remote::RemoteDomainEventNicMacChangeMsg {
            callback_id: 28,
            dom: dom(),
            alias: "net0".into(),
            old_mac: "52:54:00:00:00:01".into(),
            new_mac: "52:54:00:00:00:02".into(),
        }
    );
    let pool = remote::RemoteNonnullStoragePool {
        name: "images".into(),
        uuid: *b"fedcba9876543210",
    };
    show!(
        StoragePoolLifecycleEvent,
        remote::RemoteStoragePoolEventLifecycleMsg {
            callback_id: 29,
            pool: pool.clone(),
            event: 4,
            detail: 0,
        }
    );
    show!(
        StoragePoolRefreshEvent,
        remote::RemoteStoragePoolEventRefreshMsg {
            callback_id: 30,
            pool,
        }
    );
    let net = remote::RemoteNonnullNetwork {
        name: "default".into(),
        uuid: *b"0000111122223333",
    };
    show!(
        NetworkLifecycleEvent,
        remote::RemoteNetworkEventLifecycleMsg {
            callback_id: 31,
            net: net.clone(),
            event: 2,
            detail: 0,
        }
    );
    show!(
        NetworkMetadataChangeEvent,
        remote::RemoteNetworkEventCallbackMetadataChangeMsg {
            callback_id: 32,
            net,
            r#type: 1,
            nsuri: None,
        }
    );
    assert_eq!(out.len(), all_kinds().len(), "every kind shown once");
    insta::assert_snapshot!(out.join("\n"));
}
