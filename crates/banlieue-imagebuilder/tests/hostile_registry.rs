//! The puller against a registry that lies: endless or oversized bodies, token realms on other
//! hosts or over plain HTTP, redirects from the token service. A real registry does none of
//! this, so the registry here is a small HTTP/1.1 server of the test's own on loopback that
//! answers each request as the test says and records what it was sent. What is asserted is
//! the puller's side: the reason it stops with, that it stops (a body that never ends would
//! otherwise hang the test or exhaust memory), and that the credentials never reach a host
//! they were not meant for.

use std::sync::{Arc, Mutex};

use banlieue_imagebuilder::pull::{self, Access, MAX_MANIFEST_BYTES, Puller};
use banlieue_imagebuilder::reason::Reason;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A recorded request: its request line and headers, lower-cased names.
#[derive(Clone, Debug)]
struct Seen {
    line: String,
    headers: Vec<(String, String)>,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// How the server answers one request.
enum Reply {
    /// Status, extra headers, body (sent with its Content-Length).
    Fixed(u16, Vec<(&'static str, String)>, Vec<u8>),
    /// Status and a chunked body that never ends.
    Endless(u16),
    /// Status and a Content-Length far larger than what follows.
    Claims(u16, u64),
}

type Answer = Arc<dyn Fn(&Seen) -> Reply + Send + Sync>;

/// A loopback server answering with `answer`; returns its `host:port` and what it was sent.
async fn serve(host: &str, answer: Answer) -> (String, Arc<Mutex<Vec<Seen>>>) {
    let listener = TcpListener::bind((host, 0)).await.expect("bind");
    let address = listener.local_addr().expect("address").to_string();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let (answer, log) = (answer.clone(), log.clone());
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && head.len() < 64 << 10 {
                    if socket.read(&mut byte).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let text = String::from_utf8_lossy(&head).into_owned();
                let mut lines = text.split("\r\n");
                let line = lines.next().unwrap_or_default().to_owned();
                let headers = lines
                    .filter_map(|l| l.split_once(':'))
                    .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
                    .collect();
                let request = Seen { line, headers };
                log.lock().expect("log").push(request.clone());
                let head_only = request.line.starts_with("HEAD ");
                let _ = match answer(&request) {
                    Reply::Fixed(status, headers, body) => {
                        let mut out = format!(
                            "HTTP/1.1 {status} X\r\nConnection: close\r\nContent-Length: {}\r\n",
                            body.len()
                        );
                        for (name, value) in headers {
                            out.push_str(&format!("{name}: {value}\r\n"));
                        }
                        out.push_str("\r\n");
                        let mut bytes = out.into_bytes();
                        if !head_only {
                            bytes.extend_from_slice(&body);
                        }
                        socket.write_all(&bytes).await
                    }
                    Reply::Endless(status) => {
                        let head = format!(
                            "HTTP/1.1 {status} X\r\nConnection: close\r\n\
                             Content-Type: application/vnd.oci.image.manifest.v1+json\r\n\
                             Transfer-Encoding: chunked\r\n\r\n"
                        );
                        let chunk = format!("10000\r\n{}\r\n", "a".repeat(0x10000));
                        let mut result = socket.write_all(head.as_bytes()).await;
                        while result.is_ok() {
                            result = socket.write_all(chunk.as_bytes()).await;
                        }
                        result
                    }
                    Reply::Claims(status, length) => {
                        let head = format!(
                            "HTTP/1.1 {status} X\r\nConnection: close\r\n\
                             Content-Type: application/vnd.oci.image.manifest.v1+json\r\n\
                             Content-Length: {length}\r\n\r\n{{"
                        );
                        socket.write_all(head.as_bytes()).await
                    }
                };
            });
        }
    });
    (address, seen)
}

fn access_with_credentials() -> Access {
    Access {
        credentials: Some(("alice".to_owned(), "s3cret-password".to_owned())),
        plain_http: true,
        ..Access::default()
    }
}

fn reference(registry: &str) -> oci_client::Reference {
    pull::parse_reference(&format!("{registry}/disks/a:v1")).expect("reference")
}

const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

fn manifest_body() -> Vec<u8> {
    br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.empty.v1+json","digest":"sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a","size":2},"layers":[]}"#.to_vec()
}

#[tokio::test]
async fn an_endless_or_oversized_manifest_is_too_large_and_memory_stays_bounded() {
    for reply in [0, 1] {
        let (registry, _) = serve(
            "127.0.0.1",
            Arc::new(
                move |seen: &Seen| match (reply, seen.line.starts_with("HEAD ")) {
                    // No digest header on HEAD: the puller falls back to a GET.
                    (_, true) => {
                        Reply::Fixed(200, vec![("Content-Type", MANIFEST.to_owned())], vec![])
                    }
                    (0, false) => Reply::Endless(200),
                    _ => Reply::Claims(200, 1 << 40),
                },
            ),
        )
        .await;
        let r = reference(&registry);
        let puller = Puller::new(&r, &access_with_credentials()).expect("puller");
        let e = puller.resolve(&r).await.expect_err("refused");
        assert_eq!(e.reason, Reason::TooLarge, "{e}");
        assert!(
            e.message.contains(&format!("at most {MAX_MANIFEST_BYTES}")),
            "{}",
            e.message
        );
    }
}

#[tokio::test]
async fn an_endless_error_body_is_cut_and_its_message_bounded() {
    let (registry, _) = serve(
        "127.0.0.1",
        Arc::new(|seen: &Seen| {
            if seen.line.starts_with("HEAD ") {
                Reply::Fixed(500, vec![], vec![])
            } else {
                Reply::Endless(500)
            }
        }),
    )
    .await;
    let r = pull::parse_reference(&format!("{registry}/disks/a@sha256:{}", "0".repeat(64)))
        .expect("reference");
    let puller = Puller::new(&r, &access_with_credentials()).expect("puller");
    let e = puller.manifest(&r).await.expect_err("refused");
    assert_eq!(e.reason, Reason::RegistryUnreachable, "{e}");
    assert!(e.message.len() < 512, "{}", e.message.len());
}

/// A token service on `host` that hands out the token `good` to whoever asks.
async fn token_service(host: &str) -> (String, Arc<Mutex<Vec<Seen>>>) {
    serve(
        host,
        Arc::new(|_: &Seen| Reply::Fixed(200, vec![], br#"{"token":"good"}"#.to_vec())),
    )
    .await
}

/// A registry whose 401 names `realm`; the manifest is served to whoever sends `Bearer good`.
fn bearer_registry(realm: String) -> Answer {
    Arc::new(move |seen: &Seen| {
        if seen.header("authorization") == Some("Bearer good") {
            let body = manifest_body();
            Reply::Fixed(
                200,
                vec![
                    ("Content-Type", MANIFEST.to_owned()),
                    ("Docker-Content-Digest", pull::sha256_digest(&body)),
                ],
                body,
            )
        } else {
            Reply::Fixed(
                401,
                vec![(
                    "WWW-Authenticate",
                    format!(r#"Bearer realm="{realm}",service="test""#),
                )],
                br#"{"errors":[{"code":"UNAUTHORIZED","message":"auth"}]}"#.to_vec(),
            )
        }
    })
}

#[tokio::test]
async fn a_token_realm_on_its_own_host_gets_the_credentials_and_a_pull_token() {
    let (tokens, asked) = token_service("127.0.0.1").await;
    let (registry, _) = serve(
        "127.0.0.1",
        bearer_registry(format!("http://{tokens}/token")),
    )
    .await;
    let r = reference(&registry);
    let puller = Puller::new(&r, &access_with_credentials()).expect("puller");
    let digest = puller.resolve(&r).await.expect("resolved");
    assert_eq!(digest, pull::sha256_digest(&manifest_body()));
    let asked = asked.lock().expect("log").clone();
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert!(
        asked[0]
            .line
            .contains("scope=repository%3Adisks%2Fa%3Apull")
            && asked[0].line.contains("service=test"),
        "{asked:?}"
    );
    assert!(
        asked[0]
            .header("authorization")
            .is_some_and(|a| a.starts_with("Basic ")),
        "{asked:?}"
    );
}

#[tokio::test]
async fn a_token_realm_elsewhere_or_in_plain_http_never_sees_the_credentials() {
    // The token service an attacker runs, on another loopback address.
    let (elsewhere, asked) = token_service("127.0.0.2").await;
    for (realm, plain_http, why) in [
        (format!("http://{elsewhere}/token"), true, "only over https"),
        (
            format!("https://{elsewhere}/token"),
            true,
            "not the registry's host",
        ),
    ] {
        let (registry, _) = serve("127.0.0.1", bearer_registry(realm.clone())).await;
        let r = reference(&registry);
        let access = Access {
            plain_http,
            ..access_with_credentials()
        };
        let puller = Puller::new(&r, &access).expect("puller");
        let e = puller.resolve(&r).await.expect_err("refused");
        assert_eq!(e.reason, Reason::TokenRealmRefused, "{e}");
        assert!(e.message.contains(&realm) && e.message.contains(why), "{e}");
    }
    assert!(
        asked.lock().expect("log").is_empty(),
        "the foreign realm was asked"
    );
}

#[tokio::test]
async fn a_token_service_that_redirects_or_never_stops_is_refused() {
    let (moved, moved_asked) = token_service("127.0.0.2").await;
    for (answer, reason) in [
        (
            Arc::new(move |_: &Seen| {
                Reply::Fixed(
                    302,
                    vec![("Location", format!("http://{moved}/token"))],
                    vec![],
                )
            }) as Answer,
            Reason::TokenRealmRefused,
        ),
        (
            Arc::new(|_: &Seen| Reply::Endless(200)) as Answer,
            Reason::TooLarge,
        ),
    ] {
        let (tokens, _) = serve("127.0.0.1", answer).await;
        let (registry, _) = serve(
            "127.0.0.1",
            bearer_registry(format!("http://{tokens}/token")),
        )
        .await;
        let r = reference(&registry);
        let puller = Puller::new(&r, &access_with_credentials()).expect("puller");
        let e = puller.resolve(&r).await.expect_err("refused");
        assert_eq!(e.reason, reason, "{e}");
    }
    assert!(moved_asked.lock().expect("log").is_empty());
}

#[tokio::test]
async fn a_pinned_digest_is_resolved_only_by_showing_its_manifest() {
    // The registry answers every HEAD with 200 but has no such manifest: a digest the
    // credentials cannot show is not taken for resolved.
    let (registry, seen) = serve(
        "127.0.0.1",
        Arc::new(|seen: &Seen| {
            if seen.line.starts_with("HEAD ") {
                Reply::Fixed(200, vec![("Content-Type", MANIFEST.to_owned())], vec![])
            } else {
                let body = manifest_body();
                Reply::Fixed(200, vec![("Content-Type", MANIFEST.to_owned())], body)
            }
        }),
    )
    .await;
    let r = pull::parse_reference(&format!("{registry}/disks/a@sha256:{}", "1".repeat(64)))
        .expect("reference");
    let puller = Puller::new(&r, &access_with_credentials()).expect("puller");
    let e = puller.resolve(&r).await.expect_err("refused");
    assert_eq!(e.reason, Reason::DigestMismatch, "{e}");
    assert!(
        seen.lock()
            .expect("log")
            .iter()
            .any(|s| s.line.starts_with("GET ")),
        "no GET of the manifest"
    );
    let good = pull::pinned(&r, &pull::sha256_digest(&manifest_body()));
    assert_eq!(
        puller.resolve(&good).await.expect("resolved"),
        pull::sha256_digest(&manifest_body())
    );
}
