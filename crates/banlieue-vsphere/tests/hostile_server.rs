//! The client against a server that answers badly: over-long bodies (announced and streamed),
//! HTTP errors without SOAP, hostile XML. Every one must end in a typed error, never a panic
//! or an unbounded read. Plain HTTP on loopback: what is tested is the body handling.

use std::time::Duration;

use banlieue_vsphere::{BODY_LIMIT, Client, Credentials, Error};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the server sends after reading a request.
#[derive(Clone)]
enum Answer {
    /// These bytes, as a whole HTTP response.
    Bytes(Vec<u8>),
    /// A 200 with `len` body bytes, with or without a Content-Length.
    Huge { len: usize, announced: bool },
}

/// Serves `answer` to every request on a loopback port; returns the SDK URL.
async fn serve(answer: Answer) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(answer_one(stream, answer.clone()));
        }
    });
    format!("http://127.0.0.1:{port}/sdk")
}

async fn answer_one(mut stream: TcpStream, answer: Answer) {
    // Read the headers and the announced body, so the client sees an answer, not a reset.
    let mut request = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let Ok(n) = stream.read(&mut buf).await else {
            return;
        };
        if n == 0 {
            return;
        }
        request.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&request);
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text[..end]
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                })
                .unwrap_or(0);
            if request.len() >= end + 4 + length {
                break;
            }
        }
    }
    match answer {
        Answer::Bytes(bytes) => {
            let _ = stream.write_all(&bytes).await;
        }
        Answer::Huge { len, announced } => {
            let head = if announced {
                format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/xml\r\ncontent-length: {len}\r\n\r\n"
                )
            } else {
                "HTTP/1.1 200 OK\r\ncontent-type: text/xml\r\ntransfer-encoding: chunked\r\n\r\n"
                    .to_owned()
            };
            if stream.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            let chunk = vec![b'a'; 64 * 1024];
            let mut sent = 0;
            while sent < len {
                let n = chunk.len().min(len - sent);
                let written = if announced {
                    stream.write_all(&chunk[..n]).await
                } else {
                    let framed = [format!("{n:x}\r\n").as_bytes(), &chunk[..n], b"\r\n"].concat();
                    stream.write_all(&framed).await
                };
                // The client hangs up once it has seen enough.
                if written.is_err() {
                    return;
                }
                sent += n;
            }
            if !announced {
                let _ = stream.write_all(b"0\r\n\r\n").await;
            }
        }
    }
}

fn response(status: &str, content_type: &str, body: &str) -> Answer {
    Answer::Bytes(
        format!(
            "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .into_bytes(),
    )
}

async fn connect(url: &str) -> Error {
    // Any valid CA: the URL is plain HTTP.
    let ca = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()])
        .expect("a certificate")
        .cert
        .pem();
    let connected = tokio::time::timeout(
        Duration::from_secs(30),
        Client::connect(url, &ca, Credentials::new("u", "p")),
    )
    .await
    .expect("the client gives up within 30 s");
    match connected {
        Ok(_) => panic!("connected to a hostile server"),
        Err(error) => error,
    }
}

#[tokio::test]
async fn an_announced_body_over_the_limit_is_refused_unread() {
    let url = serve(Answer::Huge {
        len: BODY_LIMIT + 1,
        announced: true,
    })
    .await;
    let error = connect(&url).await;
    assert!(
        matches!(error, Error::TooLarge { method: "RetrieveServiceContent", limit } if limit == BODY_LIMIT),
        "{error}"
    );
}

#[tokio::test]
async fn a_streamed_body_over_the_limit_is_cut_off() {
    let url = serve(Answer::Huge {
        len: BODY_LIMIT + 1,
        announced: false,
    })
    .await;
    let error = connect(&url).await;
    assert!(matches!(error, Error::TooLarge { .. }), "{error}");
}

#[tokio::test]
async fn an_http_error_without_soap_reports_the_status() {
    let url = serve(response(
        "503 Service Unavailable",
        "text/html",
        "<html>down</html>",
    ))
    .await;
    let error = connect(&url).await;
    assert!(
        matches!(&error, Error::Status { status: 503, body, .. } if body.contains("down")),
        "{error}"
    );
}

#[tokio::test]
async fn hostile_xml_is_malformed_not_a_crash() {
    let deep = format!("{}{}", "<a>".repeat(100_000), "</a>".repeat(100_000));
    let wrong = r#"<?xml version="1.0"?><soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/"><soapenv:Body><LoginResponse xmlns="urn:vim25"/></soapenv:Body></soapenv:Envelope>"#;
    let no_about = r#"<?xml version="1.0"?><soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/"><soapenv:Body><RetrieveServiceContentResponse xmlns="urn:vim25"><returnval><rootFolder type="Folder">group-d1</rootFolder></returnval></RetrieveServiceContentResponse></soapenv:Body></soapenv:Envelope>"#;
    let entity = r#"<?xml version="1.0"?><!DOCTYPE a [<!ENTITY x "xxxxxxxx">]><soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/"><soapenv:Body>&x;</soapenv:Body></soapenv:Envelope>"#;
    for body in [deep.as_str(), wrong, no_about, entity, "\u{0}\u{1}not xml"] {
        let url = serve(response("200 OK", "text/xml", body)).await;
        let error = connect(&url).await;
        assert!(
            matches!(error, Error::Malformed { .. }),
            "{}: {error}",
            &body[..body.len().min(60)]
        );
    }
}
