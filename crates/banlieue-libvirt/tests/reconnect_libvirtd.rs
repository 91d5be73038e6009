//! The reconnecting connection against a real libvirtd that is restarted under it: calls
//! work afterwards, and a lifecycle subscription keeps delivering events.

use std::time::Duration;

use banlieue_libvirt::flags;
use banlieue_libvirt::proto::remote::procedures as rp;
use banlieue_libvirt::{
    Backoff, ClientOptions, Domain, Error, LifecycleUpdate, LifecycleWatch, Reconnecting,
};
use banlieue_testenv::libvirtd::LibvirtdOptions;

mod peer;

use peer::{daemon, identity};

fn domain_xml(name: &str) -> String {
    format!(
        "<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>\
         <os><type arch='x86_64' machine='pc'>hvm</type></os></domain>"
    )
}

/// Waits for the event `event` of domain `name`, collecting what else arrives.
async fn wait_for(watch: &mut LifecycleWatch, name: &str, event: i32) -> Vec<LifecycleUpdate> {
    let mut seen = Vec::new();
    loop {
        let update = tokio::time::timeout(Duration::from_secs(60), watch.next())
            .await
            .unwrap_or_else(|_| panic!("event {event} of {name} in time; saw {seen:?}"))
            .expect("the watch is open")
            .expect("an update");
        let done = matches!(&update, LifecycleUpdate::Event(e) if e.domain == name && e.event.raw() == event);
        seen.push(update);
        if done {
            return seen;
        }
    }
}

#[tokio::test]
async fn calls_and_events_continue_across_a_daemon_restart() {
    let Some(mut d) = daemon(LibvirtdOptions::default()).await else {
        return;
    };
    let (id, ca) = identity(&d);
    let conn = Reconnecting::connect(
        &d.tls_uri(),
        &id,
        &ca,
        ClientOptions::default(),
        Backoff::default(),
    )
    .await
    .expect("connects");
    assert_eq!(conn.generation(), 1);
    let mut watch = conn.lifecycle_events().await.expect("subscribed");
    let first = conn.client().await.expect("client");

    let before = Domain::define_xml(&first, &domain_xml("banlieue-reconnect-before"))
        .await
        .expect("defined");
    wait_for(&mut watch, "banlieue-reconnect-before", 0).await;

    d.restart().await.expect("libvirtd restarts");

    let version = conn
        .call_retrying::<rp::ConnectGetVersion>(&())
        .await
        .expect("a call after the restart")
        .hv_ver;
    assert!(version >= 10_000_000);
    assert!(!first.is_alive(), "the old connection is gone");
    assert!(conn.generation() >= 2, "a new connection was opened");

    // The domain defined before the restart is still there, seen through the new connection.
    let client = conn.client().await.expect("client");
    let again = Domain::lookup_by_name(&client, "banlieue-reconnect-before")
        .await
        .expect("lookup")
        .expect("persistent domain survives");
    assert_eq!(again.uuid(), before.uuid());

    let after = Domain::define_xml(&client, &domain_xml("banlieue-reconnect-after"))
        .await
        .expect("defined after the restart");
    let seen = wait_for(&mut watch, "banlieue-reconnect-after", 0).await;
    assert!(
        seen.iter()
            .any(|u| matches!(u, LifecycleUpdate::Resubscribed { generation } if *generation >= 2)),
        "the watch says it resubscribed before new events: {seen:?}"
    );

    after
        .undefine_flags(flags::DomainUndefineFlags::empty())
        .await
        .expect("undefined");
    wait_for(&mut watch, "banlieue-reconnect-after", 1).await;
    again
        .undefine_flags(flags::DomainUndefineFlags::empty())
        .await
        .expect("undefined");
}

#[tokio::test]
async fn an_unreachable_daemon_gives_up_after_the_bounded_attempts() {
    let Some(d) = daemon(LibvirtdOptions::default()).await else {
        return;
    };
    let (id, ca) = identity(&d);
    // A port nothing listens on: bind one, then close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let backoff = Backoff {
        initial: Duration::from_millis(10),
        max: Duration::from_millis(40),
        factor: 2,
        attempts: 4,
    };
    let err = Reconnecting::connect(
        &format!("qemu+tls://127.0.0.1:{port}/system"),
        &id,
        &ca,
        ClientOptions::default(),
        backoff,
    )
    .await
    .expect_err("nothing listens");
    match &err {
        Error::ReconnectGaveUp { attempts: 4, last } => {
            assert!(matches!(**last, Error::Connect { .. }), "{last}");
        }
        other => panic!("expected ReconnectGaveUp, got {other}"),
    }
    // Bad input is not retried.
    let err = Reconnecting::connect(
        "qemu+ssh://127.0.0.1/system",
        &id,
        &ca,
        ClientOptions::default(),
        backoff,
    )
    .await
    .expect_err("ssh");
    assert!(matches!(err, Error::UnsupportedScheme(_)), "{err}");
}

#[tokio::test]
async fn a_frozen_daemon_is_left_and_rejoined_when_it_wakes() {
    let Some(mut d) = daemon(LibvirtdOptions::default()).await else {
        return;
    };
    let (id, ca) = identity(&d);
    let opts = ClientOptions {
        keepalive_interval: Duration::from_secs(1),
        keepalive_count: 3,
        connect_timeout: Some(Duration::from_secs(1)),
        ..ClientOptions::default()
    };
    let backoff = Backoff {
        initial: Duration::from_millis(100),
        max: Duration::from_millis(500),
        factor: 2,
        attempts: 200,
    };
    let conn = Reconnecting::connect(&d.tls_uri(), &id, &ca, opts.clone(), backoff)
        .await
        .expect("connects");
    let mut watch = conn.lifecycle_events().await.expect("subscribed");
    let first = conn.client().await.expect("client");

    d.suspend().expect("SIGSTOP");
    // The kernel still accepts TCP connections for the stopped daemon; nothing answers TLS.
    let err = banlieue_libvirt::Client::connect_with(&d.tls_uri(), &id, &ca, opts)
        .await
        .expect_err("no TLS from a stopped daemon");
    assert!(matches!(err, Error::ConnectTimeout { .. }), "{err}");
    assert!(err.is_transient());
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while first.is_alive() {
        assert!(
            std::time::Instant::now() < deadline,
            "keepalive gives the frozen daemon up"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    d.resume().expect("SIGCONT");

    let client = conn.client().await.expect("a new connection");
    let dom = Domain::define_xml(&client, &domain_xml("banlieue-reconnect-thawed"))
        .await
        .expect("defined");
    let seen = wait_for(&mut watch, "banlieue-reconnect-thawed", 0).await;
    assert!(
        seen.iter()
            .any(|u| matches!(u, LifecycleUpdate::Resubscribed { .. })),
        "{seen:?}"
    );
    dom.undefine_flags(flags::DomainUndefineFlags::empty())
        .await
        .expect("undefined");
}
