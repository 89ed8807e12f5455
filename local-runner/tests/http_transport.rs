//! The HTTP transport against a minimal Lambda Invoke API server written here (one
//! request per connection, HTTP/1.1): what it sends, and how it reads successes,
//! function errors, HTTP errors and an endpoint that is not there.

use std::sync::{Arc, Mutex};

use local_runner::{Http, Transport};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// The requests a server received: head and body.
type Requests = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

/// Serves every request with `status`, `headers` and `body`; records each request's
/// head and body.
async fn server(
    status: &'static str,
    headers: &'static str,
    body: &'static str,
) -> (String, Requests) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let endpoint = format!("http://{}", listener.local_addr().expect("address"));
    let seen: Requests = Arc::default();
    let record = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut data = Vec::new();
            let mut buf = [0u8; 4096];
            let (head, body_start, length) = loop {
                let n = socket.read(&mut buf).await.expect("read");
                assert!(n > 0, "request ended early");
                data.extend_from_slice(&buf[..n]);
                if let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&data[..end]).into_owned();
                    let length = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse::<usize>().expect("length"))
                        })
                        .unwrap_or(0);
                    break (head, end + 4, length);
                }
            };
            while data.len() < body_start + length {
                let n = socket.read(&mut buf).await.expect("read");
                data.extend_from_slice(&buf[..n]);
            }
            record
                .lock()
                .expect("seen")
                .push((head, data[body_start..body_start + length].to_vec()));
            let response = format!(
                "HTTP/1.1 {status}\r\ncontent-length: {}\r\n{headers}connection: close\r\n\r\n{body}",
                body.len()
            );
            socket.write_all(response.as_bytes()).await.expect("write");
        }
    });
    (endpoint, seen)
}

#[tokio::test]
async fn posts_the_event_to_the_invoke_api_and_returns_the_response() {
    let (endpoint, seen) = server("200 OK", "", r#"{"batchItemFailures":[]}"#).await;
    let http = Http::new(&format!("{endpoint}/"), "my-function").expect("endpoint");
    let response = http
        .invoke(b"{\"records\":{}}".to_vec())
        .await
        .expect("success");
    assert_eq!(response, br#"{"batchItemFailures":[]}"#);
    let seen = seen.lock().expect("seen");
    let (head, body) = &seen[0];
    assert!(
        head.starts_with("POST /2015-03-31/functions/my-function/invocations HTTP/1.1"),
        "{head}"
    );
    assert_eq!(body, b"{\"records\":{}}");
}

#[tokio::test]
async fn a_function_error_header_is_an_error_with_the_payload() {
    let payload = r#"{"errorType":"PoisonRecord","errorMessage":"t-0@5: not UTF-8"}"#;
    let (endpoint, _) = server("200 OK", "x-amz-function-error: Unhandled\r\n", payload).await;
    let http = Http::new(&endpoint, "f").expect("endpoint");
    let error = http
        .invoke(b"{}".to_vec())
        .await
        .expect_err("function error");
    assert!(error.0.contains("Unhandled"), "{error}");
    assert!(error.0.contains("t-0@5: not UTF-8"), "{error}");
}

#[tokio::test]
async fn a_non_2xx_status_is_an_error() {
    let (endpoint, _) = server("502 Bad Gateway", "", "the runtime crashed").await;
    let http = Http::new(&endpoint, "f").expect("endpoint");
    let error = http.invoke(b"{}".to_vec()).await.expect_err("HTTP error");
    assert!(error.0.contains("502"), "{error}");
    assert!(error.0.contains("the runtime crashed"), "{error}");
}

#[tokio::test]
async fn an_endpoint_that_is_not_there_is_named() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let endpoint = format!("http://{}", listener.local_addr().expect("address"));
    drop(listener);
    let http = Http::new(&endpoint, "f").expect("endpoint");
    let error = http.invoke(b"{}".to_vec()).await.expect_err("refused");
    assert!(error.0.contains(&endpoint), "{error}");
}

#[test]
fn bad_settings_are_refused_with_the_option_named() {
    for (url, name, says) in [
        ("https://example.com", "f", "--function-url"),
        ("127.0.0.1:9000", "f", "--function-url"),
        ("http://127.0.0.1:9000", "a/b", "--function-name"),
        ("http://127.0.0.1:9000", "", "--function-name"),
    ] {
        match Http::new(url, name) {
            Err(e) => assert!(e.contains(says), "{url} {name}: {e}"),
            Ok(_) => panic!("accepted {url} {name}"),
        }
    }
}
