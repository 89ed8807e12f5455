//! The Lambda Invoke API over HTTP, as served by `cargo lambda watch`, the AWS SAM CLI's
//! `sam local start-lambda`, and other Lambda emulators, in any language.

use std::error::Error as _;
use std::time::Duration;

use async_trait::async_trait;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Request, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::{InvokeError, Transport};

/// The longest a Lambda invocation may run: 15 minutes.
pub const MAX_INVOCATION_TIME: Duration = Duration::from_secs(15 * 60);

/// A function served over the Lambda Invoke API:
/// `POST {endpoint}/2015-03-31/functions/{name}/invocations` with the event as the body
/// (invocation type `RequestResponse`).
///
/// A response with the `X-Amz-Function-Error` header, or with a status other than 2xx,
/// is a function error ([`InvokeError`] with the error payload); an endpoint that cannot
/// be reached is an [`InvokeError`] naming it. Both are retried like any failed batch.
/// Plain `http://` only (emulators listen on loopback).
pub struct Http {
    endpoint: String,
    uri: Uri,
    client: Client<HttpConnector, Full<Bytes>>,
    timeout: Duration,
}

impl Http {
    /// A transport invoking `function_name` at `endpoint` (such as `http://127.0.0.1:9000`).
    /// An endpoint that is not a valid `http://` URL is an error naming it.
    pub fn new(endpoint: &str, function_name: &str) -> Result<Self, String> {
        let trimmed = endpoint.trim().trim_end_matches('/');
        if !trimmed.starts_with("http://") {
            return Err(format!(
                "--function-url {endpoint:?}: only http:// endpoints are supported (a local Lambda emulator such as `cargo lambda watch`)"
            ));
        }
        if function_name.is_empty()
            || !function_name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_:.".contains(c))
        {
            return Err(format!(
                "--function-name {function_name:?}: a Lambda function name is letters, digits, '-', '_' (or an ARN)"
            ));
        }
        let url = format!("{trimmed}/2015-03-31/functions/{function_name}/invocations");
        let uri: Uri = url
            .parse()
            .map_err(|e| format!("--function-url {endpoint:?} is not a valid URL: {e}"))?;
        let client = Client::builder(TokioExecutor::new()).build_http();
        Ok(Http {
            endpoint: trimmed.to_owned(),
            uri,
            client,
            timeout: MAX_INVOCATION_TIME,
        })
    }

    /// Sets how long an invocation may take before it counts as failed (default 15 min).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The invocation URL.
    pub fn url(&self) -> String {
        self.uri.to_string()
    }

    async fn post(&self, payload: Vec<u8>) -> Result<Vec<u8>, InvokeError> {
        let request = Request::post(self.uri.clone())
            .header("content-type", "application/json")
            .header("x-amz-invocation-type", "RequestResponse")
            .body(Full::new(Bytes::from(payload)))
            .map_err(|e| InvokeError(format!("cannot build a request to {}: {e}", self.uri)))?;
        let response = self.client.request(request).await.map_err(|e| {
            let mut cause = e.to_string();
            let mut source = e.source();
            while let Some(s) = source {
                cause = format!("{cause}: {s}");
                source = s.source();
            }
            if e.is_connect() {
                InvokeError(format!(
                    "cannot reach the function at {} ({cause}); is the Lambda emulator (e.g. `cargo lambda watch`) running?",
                    self.endpoint
                ))
            } else {
                InvokeError(format!("invoking {} failed: {cause}", self.uri))
            }
        })?;
        let status = response.status();
        let function_error = response
            .headers()
            .get("x-amz-function-error")
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| InvokeError(format!("reading the response of {} failed: {e}", self.uri)))?
            .to_bytes()
            .to_vec();
        let text = || String::from_utf8_lossy(&body).into_owned();
        if let Some(kind) = function_error {
            return Err(InvokeError(format!("function error ({kind}): {}", text())));
        }
        if !status.is_success() {
            return Err(InvokeError(format!(
                "{} answered HTTP {status}: {}",
                self.uri,
                text()
            )));
        }
        Ok(body)
    }
}

#[async_trait]
impl Transport for Http {
    async fn invoke(&self, payload: Vec<u8>) -> Result<Vec<u8>, InvokeError> {
        match tokio::time::timeout(self.timeout, self.post(payload)).await {
            Ok(result) => result,
            Err(_) => Err(InvokeError(format!(
                "{} did not answer within {:?} (the invocation timed out)",
                self.uri, self.timeout
            ))),
        }
    }
}
