//! The AWS SDK's HTTP client ([`super::https_client`]): the SDK's connector traits over the
//! framework's HTTP/1.1 ([`crate::http1`]), so that the SDK's own client (hyper with
//! HTTP/2, and its `h2` crate) is not linked. DynamoDB, STS and the credential providers
//! speak HTTP/1.1; their request bodies are in memory.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::connector_metadata::ConnectorMetadata;
use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnector, HttpConnectorFuture, HttpConnectorSettings, SharedHttpConnector,
};
use aws_smithy_runtime_api::client::orchestrator::{HttpRequest, HttpResponse};
use aws_smithy_runtime_api::client::result::ConnectorError;
use aws_smithy_runtime_api::client::runtime_components::{
    RuntimeComponents, RuntimeComponentsBuilder,
};
use aws_smithy_types::body::SdkBody;
use aws_smithy_types::config_bag::ConfigBag;

use super::TlsRoots;
use crate::http1::{Connector, ExchangeError, Failure, Pool};

/// The client: one connector per timeout settings (as the SDK's own client caches them),
/// all sharing one TLS configuration.
#[derive(Debug)]
pub(super) struct SdkHttpClient {
    roots: TlsRoots,
    /// The rustls configuration of `roots`, built when the SDK validates its configuration
    /// (the client's construction) or at the first HTTPS connection; the error says why
    /// not (no system roots found), for each HTTPS request.
    tls: OnceLock<Result<Arc<rustls::ClientConfig>, String>>,
    connectors: Mutex<HashMap<Timeouts, SharedHttpConnector>>,
}

/// A connector's connect and read timeouts (the SDK's [`HttpConnectorSettings`]).
type Timeouts = (Option<Duration>, Option<Duration>);

impl SdkHttpClient {
    pub(super) fn new(roots: TlsRoots) -> Self {
        SdkHttpClient {
            roots,
            tls: OnceLock::new(),
            connectors: Mutex::new(HashMap::new()),
        }
    }

    fn tls(&self) -> Result<Arc<rustls::ClientConfig>, String> {
        self.tls
            .get_or_init(|| super::rustls_client_config(self.roots).map(Arc::new))
            .clone()
    }
}

impl HttpClient for SdkHttpClient {
    fn http_connector(
        &self,
        settings: &HttpConnectorSettings,
        _components: &RuntimeComponents,
    ) -> SharedHttpConnector {
        let key = (settings.connect_timeout(), settings.read_timeout());
        let mut connectors = self
            .connectors
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        connectors
            .entry(key)
            .or_insert_with(|| {
                SharedHttpConnector::new(SdkConnector {
                    tls: self.tls(),
                    connect_timeout: key.0,
                    read_timeout: key.1,
                    pools: Mutex::new(HashMap::new()),
                })
            })
            .clone()
    }

    fn validate_base_client_config(
        &self,
        _: &RuntimeComponentsBuilder,
        _: &ConfigBag,
    ) -> Result<(), BoxError> {
        // The roots are read and parsed as the client is built, not at its first request
        // (as the SDK's own client does); an error waits for an HTTPS request.
        let _ = self.tls();
        Ok(())
    }

    fn connector_metadata(&self) -> Option<ConnectorMetadata> {
        Some(ConnectorMetadata::new("lambda-streams-http1", None))
    }
}

/// The connections of one timeout setting: a pool per scheme, host and port.
struct SdkConnector {
    tls: Result<Arc<rustls::ClientConfig>, String>,
    /// How long connecting (TCP and TLS) may take; `None`: no limit.
    connect_timeout: Option<Duration>,
    /// How long a request may take until its response is read whole, connecting included
    /// (the SDK's client times the same); `None`: no limit.
    read_timeout: Option<Duration>,
    pools: Mutex<HashMap<String, Arc<Pool>>>,
}

impl std::fmt::Debug for SdkConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SdkConnector")
            .field("connect_timeout", &self.connect_timeout)
            .field("read_timeout", &self.read_timeout)
            .finish_non_exhaustive()
    }
}

impl SdkConnector {
    /// The pool of `uri`'s scheme, host and port.
    fn pool(&self, uri: &http::Uri) -> Result<Arc<Pool>, String> {
        let key = format!(
            "{}://{}",
            uri.scheme_str().unwrap_or(""),
            uri.authority().map_or("", |a| a.as_str())
        );
        let mut pools = self.pools.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(pool) = pools.get(&key) {
            return Ok(Arc::clone(pool));
        }
        let connect_timeout = self.connect_timeout.unwrap_or(Duration::MAX);
        let pool = Arc::new(Pool::new(Connector::new(
            uri,
            || self.tls.clone(),
            connect_timeout,
        )?));
        pools.insert(key, Arc::clone(&pool));
        Ok(pool)
    }
}

impl HttpConnector for SdkConnector {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        let prepared = encode_request(&request).and_then(|(uri, bytes)| {
            let pool = self
                .pool(&uri)
                .map_err(|e| ConnectorError::user(e.into()))?;
            Ok((pool, bytes))
        });
        let read_timeout = self.read_timeout;
        HttpConnectorFuture::new(async move {
            let (pool, bytes) = prepared?;
            let exchange = async {
                let response = pool.send(&bytes).await.map_err(connector_error)?;
                decode_response(response.status(), response.head(), response.body())
            };
            match read_timeout {
                None => exchange.await,
                Some(limit) => tokio::time::timeout(limit, exchange)
                    .await
                    .unwrap_or_else(|_| {
                        Err(ConnectorError::timeout(
                            format!("HTTP read timeout occurred after {limit:?}").into(),
                        ))
                    }),
            }
        })
    }
}

/// A failed exchange as the SDK's retries classify it: timeouts and I/O failures are
/// transient (retried), a response this client cannot read is not.
fn connector_error(error: ExchangeError) -> ConnectorError {
    let source: BoxError = error.text.into();
    match error.kind {
        Failure::TimedOut => ConnectorError::timeout(source),
        Failure::Io => ConnectorError::io(source),
        Failure::Protocol => ConnectorError::other(source, None),
    }
}

/// A request's URI (`http` or `https`, with a host) and its HTTP/1.1 bytes: head and body,
/// with `host` and `content-length` added when the SDK did not set them. A streaming body
/// or a `HEAD` request (whose response this client cannot frame) is refused.
fn encode_request(request: &HttpRequest) -> Result<(http::Uri, Vec<u8>), ConnectorError> {
    let user = |text: String| ConnectorError::user(text.into());
    let uri: http::Uri = request
        .uri()
        .parse()
        .map_err(|e| user(format!("request URI {:?}: {e}", request.uri())))?;
    let https = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return Err(user(format!("request URI {uri}: not http or https"))),
    };
    let host = uri
        .host()
        .ok_or_else(|| user(format!("request URI {uri}: no host")))?;
    let method = request.method();
    if method.eq_ignore_ascii_case("HEAD") {
        return Err(user(format!(
            "{method} {uri}: HEAD requests are not supported"
        )));
    }
    let body = request.body().bytes().ok_or_else(|| {
        user(format!(
            "{method} {uri}: a streaming request body is not supported (the framework's HTTP \
             client sends bodies in memory)"
        ))
    })?;
    let target = uri.path_and_query().map_or("/", |p| p.as_str());
    let mut bytes = Vec::with_capacity(256 + body.len());
    bytes.extend_from_slice(format!("{method} {target} HTTP/1.1\r\n").as_bytes());
    let headers = request.headers();
    if !headers.contains_key("host") {
        // As hyper sets it: the port only when not the scheme's default.
        let default_port = if https { 443 } else { 80 };
        let host = match uri.port_u16() {
            Some(port) if port != default_port => format!("{host}:{port}"),
            _ => host.to_owned(),
        };
        bytes.extend_from_slice(format!("host: {host}\r\n").as_bytes());
    }
    if !headers.contains_key("content-length")
        && !headers.contains_key("transfer-encoding")
        && (!body.is_empty() || matches!(method, "POST" | "PUT" | "PATCH"))
    {
        bytes.extend_from_slice(format!("content-length: {}\r\n", body.len()).as_bytes());
    }
    for (name, value) in headers.iter_bytes() {
        bytes.extend_from_slice(name.as_bytes());
        bytes.extend_from_slice(b": ");
        bytes.extend_from_slice(value);
        bytes.extend_from_slice(b"\r\n");
    }
    bytes.extend_from_slice(b"\r\n");
    bytes.extend_from_slice(body);
    Ok((uri, bytes))
}

/// The SDK's response of a status, a head (its headers are parsed again here) and a body.
fn decode_response(status: u16, head: &[u8], body: &[u8]) -> Result<HttpResponse, ConnectorError> {
    let other = |text: String| ConnectorError::other(text.into(), None);
    let status = status
        .try_into()
        .map_err(|e| other(format!("response status {status}: {e}")))?;
    let mut response = HttpResponse::new(status, SdkBody::from(body));
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut parsed = httparse::Response::new(&mut headers);
    parsed
        .parse(head)
        .map_err(|e| other(format!("the response's headers: {e}")))?;
    for header in parsed.headers.iter() {
        let value = std::str::from_utf8(header.value).map_err(|_| {
            other(format!(
                "the response's header {} is not UTF-8",
                header.name
            ))
        })?;
        response
            .headers_mut()
            .try_append(header.name.to_owned(), value.to_owned())
            .map_err(|e| other(format!("the response's header {}: {e}", header.name)))?;
    }
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: &str, uri: &str, body: SdkBody) -> HttpRequest {
        let mut request = HttpRequest::new(body);
        request.set_method(method).unwrap();
        request.set_uri(uri).unwrap();
        request
    }

    #[test]
    fn requests_are_written_with_host_and_length() {
        let mut post = request(
            "POST",
            "http://127.0.0.1:8000/?a=b",
            SdkBody::from(&b"{}"[..]),
        );
        post.headers_mut()
            .insert("x-amz-target", "DynamoDB_20120810.ListTables");
        let (uri, bytes) = encode_request(&post).unwrap();
        assert_eq!(uri.port_u16(), Some(8000));
        assert_eq!(
            String::from_utf8(bytes).unwrap(),
            "POST /?a=b HTTP/1.1\r\nhost: 127.0.0.1:8000\r\ncontent-length: 2\r\n\
             x-amz-target: DynamoDB_20120810.ListTables\r\n\r\n{}"
        );
        // The default port is left out of `host`; a GET without a body has no length.
        let get = request("GET", "https://sts.amazonaws.com:443", SdkBody::empty());
        let (_, bytes) = encode_request(&get).unwrap();
        assert_eq!(
            String::from_utf8(bytes).unwrap(),
            "GET / HTTP/1.1\r\nhost: sts.amazonaws.com\r\n\r\n"
        );
    }

    #[test]
    fn unsupported_requests_are_user_errors_not_panics() {
        let streaming = request("POST", "http://localhost/", SdkBody::taken());
        let error = encode_request(&streaming).unwrap_err();
        assert!(error.is_user());
        let text = aws_smithy_types::error::display::DisplayErrorContext(&error).to_string();
        assert!(text.contains("streaming"), "{text}");
        for (method, uri) in [("HEAD", "http://localhost/"), ("GET", "ftp://localhost/")] {
            let error = encode_request(&request(method, uri, SdkBody::empty())).unwrap_err();
            assert!(error.is_user(), "{method} {uri}: {error}");
        }
    }

    #[test]
    fn responses_keep_status_headers_and_body() {
        let head = b"HTTP/1.1 400 Bad Request\r\nx-amzn-RequestId: r1\r\n\
                     Content-Type: application/x-amz-json-1.0\r\nx-a: 1\r\nx-a: 2\r\n\r\n";
        let response = decode_response(400, head, b"{\"__type\":\"x\"}").unwrap();
        assert_eq!(response.status().as_u16(), 400);
        assert_eq!(response.headers().get("x-amzn-requestid"), Some("r1"));
        assert_eq!(
            response.headers().get_all("x-a").collect::<Vec<_>>(),
            ["1", "2"]
        );
        assert_eq!(response.body().bytes(), Some(&b"{\"__type\":\"x\"}"[..]));
        let error = decode_response(200, b"HTTP/1.1 200 OK\r\nx: \xff\r\n\r\n", b"").unwrap_err();
        assert!(!error.is_user() && !error.is_io() && !error.is_timeout());
    }

    /// The SDK's retries tell the failures apart by kind.
    #[test]
    fn failures_keep_their_kind() {
        let error = |kind| ExchangeError {
            text: "x".into(),
            answered: false,
            kind,
        };
        assert!(connector_error(error(Failure::TimedOut)).is_timeout());
        assert!(connector_error(error(Failure::Io)).is_io());
        let other = connector_error(error(Failure::Protocol));
        assert!(other.is_other() && other.as_other().is_none());
    }
}
