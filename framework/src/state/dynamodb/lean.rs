//! The store's own request path for its hot operation, the conditional `UpdateItem`:
//! DynamoDB's JSON 1.0 protocol over one kept-alive hyper client, signed with SigV4 by hand.
//!
//! # Why
//! A state write is one small request, and the AWS SDK's general per-request machinery
//! (the orchestrator's runtime plugins and config bags, interceptors, the user agent,
//! endpoint resolution, SigV4 recomputing its signing key) costs several times the request
//! itself in the function's CPU, which is what a user pays for in Lambda. This path does
//! only what a DynamoDB `UpdateItem` needs: the request body as the store wrote it (the
//! store builds each write once and sends it either way, so both paths send the same
//! request), the signing key and its HMAC state derived once a day, the canonical request
//! hashed as it is written (never built as a string), one HTTP/1.1 request written whole
//! on a kept-alive connection of its own pool (`http1.rs`), and of the response only what
//! the store reads: the item's state straight from it ([`Read::State`], no item map), or the
//! attributes the store reads ([`store_reads`]) in the SDK's own types ([`Read::Item`], and
//! a failed condition's item). Everything else the store does (reads,
//! queries, the closing index, table administration) stays on the SDK.
//!
//! # What it keeps of the SDK's behaviour
//! - **Retries**: the attempts and backoff of [`RetrySettings`] (standard mode: throttling,
//!   5xx, transport errors and attempts that take over 10 s are retried with exponential
//!   backoff and full jitter), and a
//!   retry budget of its own (the SDK's token bucket costs: 5 tokens a retry, 10 after a
//!   transport error; a first-attempt success gives 1 back, a retried success what its
//!   retries took; refilled over a minute).
//! - **Credentials** from the client's provider, cached until 5 minutes before they expire
//!   (15 minutes for credentials without an expiry, as the SDK's identity cache).
//! - **Errors** as the SDK reports them: the service's code and message, a failed condition
//!   with the item it returns (`ReturnValuesOnConditionCheckFailure=ALL_OLD`).
//!
//! What it does not do: proxies, FIPS or dual-stack endpoints, request compression. A
//! configuration that asks for one of them keeps the SDK path ([`LeanClient::from_sdk`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use aws_credential_types::Credentials;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use serde::Deserialize;
use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
use sha2::{Digest, Sha256};

use super::item::{NEWEST_TIME, StateAttribute, state_from};
use super::retry::RetrySettings;
use crate::aws::TlsRoots;
use crate::http1::{Connector, Pool};
use crate::state::ItemState;

/// The `X-Amz-Target` of `UpdateItem` (DynamoDB's JSON 1.0 protocol).
const UPDATE_ITEM_TARGET: &str = "DynamoDB_20120810.UpdateItem";
/// The headers this client signs, in canonical (sorted) order, without the session token.
const SIGNED_HEADERS: &str = "content-type;host;x-amz-date;x-amz-target";
/// [`SIGNED_HEADERS`] with the session token.
const SIGNED_HEADERS_WITH_TOKEN: &str =
    "content-type;host;x-amz-date;x-amz-security-token;x-amz-target";
const CONTENT_TYPE: &str = "application/x-amz-json-1.0";
/// How long credentials without an expiry are kept (the SDK identity cache's default).
const CREDENTIALS_WITHOUT_EXPIRY: Duration = Duration::from_secs(15 * 60);
/// Credentials are refreshed this long before they expire.
const CREDENTIALS_REFRESH_MARGIN: Duration = Duration::from_secs(5 * 60);
/// The connect timeout (the SDK's default is 3.1 s).
const CONNECT_TIMEOUT: Duration = Duration::from_millis(3100);
/// How long one attempt (request and whole response) may take before it is abandoned and
/// retried: a stalled connection must fail the attempt, not hang the batch until the
/// function times out (the SDK's stalled-stream protection does this for its path). A
/// single-item `UpdateItem` answers in milliseconds.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

/// A failed `UpdateItem`.
#[derive(Debug)]
pub enum LeanError {
    /// The condition failed; the item as it is (the attributes the store reads,
    /// [`store_reads`]), when DynamoDB returned it.
    ConditionFailed(Option<HashMap<String, AttributeValue>>),
    /// The service refused the request: its error code (the part after `#` of `__type`)
    /// and message, after the retries.
    Service {
        /// E.g. `ValidationException`.
        code: String,
        /// The service's message.
        message: String,
    },
    /// No response (connection refused, reset, timed out), after the retries; or a response
    /// this client cannot read.
    Transport(String),
}

/// What the store reads of the attributes a successful `UpdateItem` returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    /// The attributes the store reads ([`store_reads`]), as an item.
    Item,
    /// The item's state alone (value or aggregate, version, format, newest record time),
    /// read straight from the response: no item map, no string per attribute.
    State,
}

/// The attributes of a successful `UpdateItem`, as [`Read`] asked for them.
#[derive(Debug, PartialEq)]
pub enum Attributes {
    /// Of the `Attributes` (as `ReturnValues` asked), those the store reads
    /// ([`store_reads`]).
    Item(HashMap<String, AttributeValue>),
    /// The item's state, or why the attributes hold none (the store's own error for an
    /// item it cannot read, the same as it gives for an item map).
    State(Result<ItemState, String>),
}

impl Default for Attributes {
    fn default() -> Self {
        Attributes::Item(HashMap::new())
    }
}

/// A successful `UpdateItem`: the attributes it returned and the write units it consumed.
#[derive(Debug, Default)]
pub struct LeanOutput {
    /// The attributes it returned (as `ReturnValues` asked), read as [`Read`] asked.
    pub attributes: Attributes,
    /// `ConsumedCapacity.CapacityUnits`, when returned.
    pub capacity_units: Option<f64>,
}

/// The signing key of one day and secret, derived once (four HMACs) instead of per request,
/// with the HMAC-SHA-256 state of the key's inner and outer pads: a signature then hashes
/// only the string to sign and one block.
struct SigningKey {
    day: String,
    secret: String,
    inner: Sha256,
    outer: Sha256,
}

impl SigningKey {
    fn new(day: &str, secret: &str, key: &[u8]) -> Self {
        // HMAC (RFC 2104) with SHA-256's 64-byte blocks: a 32-byte key is zero-padded.
        let mut block = [0u8; 64];
        block[..key.len()].copy_from_slice(key);
        let pad = |byte: u8| {
            let mut padded = block;
            padded.iter_mut().for_each(|b| *b ^= byte);
            Sha256::new().chain_update(padded)
        };
        SigningKey {
            day: day.to_owned(),
            secret: secret.to_owned(),
            inner: pad(0x36),
            outer: pad(0x5c),
        }
    }

    /// The hex HMAC-SHA-256 of the string to sign, fed by `message` into the inner hash.
    fn sign(&self, message: impl FnOnce(&mut Sha256)) -> [u8; 64] {
        let mut inner = self.inner.clone();
        message(&mut inner);
        let mut outer = self.outer.clone();
        outer.update(inner.finalize());
        hex_digest(&outer.finalize())
    }
}

/// Credentials, until when they are used, and the signing key derived from them.
struct CachedCredentials {
    credentials: Credentials,
    refresh_at: Instant,
}

/// The retry budget: the SDK's token bucket costs, refilled over a minute.
struct Budget {
    tokens: f64,
    capacity: f64,
    refilled_at: Instant,
}

impl Budget {
    fn new(capacity: usize) -> Self {
        Budget {
            tokens: capacity as f64,
            capacity: capacity as f64,
            refilled_at: Instant::now(),
        }
    }

    fn refill(&mut self) {
        let now = Instant::now();
        let elapsed = now.duration_since(self.refilled_at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.capacity / 60.0).min(self.capacity);
        self.refilled_at = now;
    }

    /// Takes `cost` tokens for a retry, if the budget holds them.
    fn take(&mut self, cost: f64) -> bool {
        self.refill();
        if self.tokens >= cost {
            self.tokens -= cost;
            true
        } else {
            false
        }
    }

    fn give(&mut self, tokens: f64) {
        self.tokens = (self.tokens + tokens).min(self.capacity);
    }
}

/// A DynamoDB client for `UpdateItem` only (see the module docs).
pub struct LeanClient {
    pool: Pool,
    uri: http::Uri,
    host: String,
    region: String,
    provider: SharedCredentialsProvider,
    credentials: Mutex<Option<CachedCredentials>>,
    /// Held while the credentials are fetched, so that one request fetches them.
    refreshing: tokio::sync::Mutex<()>,
    signing_key: Mutex<Option<Arc<SigningKey>>>,
    retry: RetrySettings,
    budget: Mutex<Budget>,
    attempt_timeout: Duration,
}

impl std::fmt::Debug for LeanClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeanClient")
            .field("endpoint", &self.uri)
            .field("region", &self.region)
            .finish_non_exhaustive()
    }
}

impl LeanClient {
    /// A client for the endpoint `endpoint` (`http://` or `https://`, e.g.
    /// `https://dynamodb.eu-west-1.amazonaws.com` or an emulator's `http://127.0.0.1:8000`)
    /// in `region`, signing with `provider`'s credentials, trusting `roots` over HTTPS.
    pub fn new(
        endpoint: &str,
        region: &str,
        provider: SharedCredentialsProvider,
        roots: TlsRoots,
        retry: RetrySettings,
    ) -> Result<Self, String> {
        let uri: http::Uri = endpoint
            .parse()
            .map_err(|e| format!("DynamoDB endpoint {endpoint:?}: {e}"))?;
        let host = uri
            .authority()
            .ok_or_else(|| format!("DynamoDB endpoint {endpoint:?} has no host"))?
            .to_string();
        let scheme = uri.scheme_str().unwrap_or("https");
        if !matches!(scheme, "http" | "https") {
            return Err(format!(
                "DynamoDB endpoint {endpoint:?}: scheme {scheme:?} is not http or https"
            ));
        }
        let uri = http::Uri::builder()
            .scheme(scheme)
            .authority(host.as_str())
            .path_and_query("/")
            .build()
            .map_err(|e| format!("DynamoDB endpoint {endpoint:?}: {e}"))?;
        if !header_safe(&host) {
            return Err(format!(
                "DynamoDB endpoint {endpoint:?}: the host is not a header value"
            ));
        }
        let tls = std::sync::Arc::new(crate::aws::rustls_client_config(roots)?);
        let tls = || Ok(tls);
        let pool = Pool::new(Connector::new(&uri, tls, CONNECT_TIMEOUT)?);
        Ok(LeanClient {
            pool,
            uri,
            host,
            region: region.to_owned(),
            provider,
            credentials: Mutex::new(None),
            refreshing: tokio::sync::Mutex::new(()),
            signing_key: Mutex::new(None),
            retry,
            budget: Mutex::new(Budget::new(retry.retry_budget)),
            attempt_timeout: ATTEMPT_TIMEOUT,
        })
    }

    /// A client with the region and credentials of a loaded SDK configuration, for the
    /// DynamoDB endpoint the SDK would use (`AWS_ENDPOINT_URL_DYNAMODB`, else
    /// `AWS_ENDPOINT_URL` or the configuration's endpoint, else the region's public
    /// endpoint); `Ok(None)` when the configuration asks for what this client does not do
    /// (a proxy, FIPS or dual-stack endpoints, a region of another partition than `aws`,
    /// `AWS_IGNORE_CONFIGURED_ENDPOINT_URLS`), so the store keeps the SDK path.
    pub fn from_sdk(
        sdk: &aws_config::SdkConfig,
        roots: TlsRoots,
        retry: RetrySettings,
    ) -> Result<Option<Self>, String> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let proxied = ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"]
            .iter()
            .any(|name| var(name).is_some());
        let special = sdk.use_fips() == Some(true) || sdk.use_dual_stack() == Some(true);
        let ignore_endpoints = var("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS")
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
        let (Some(region), Some(provider)) = (sdk.region(), sdk.credentials_provider()) else {
            return Ok(None);
        };
        if proxied || special || ignore_endpoints {
            return Ok(None);
        }
        let region = region.as_ref();
        let endpoint = match var("AWS_ENDPOINT_URL_DYNAMODB")
            .or_else(|| var("AWS_ENDPOINT_URL"))
            .or_else(|| sdk.endpoint_url().map(str::to_owned))
        {
            Some(endpoint) => endpoint,
            // The `aws` partition's regions; others (China, GovCloud's FIPS-only hosts,
            // ISO) keep the SDK's endpoint rules.
            None if !region.starts_with("cn-") && !region.starts_with("us-iso") => {
                format!("https://dynamodb.{region}.amazonaws.com")
            }
            None => return Ok(None),
        };
        Self::new(endpoint.trim(), region, provider, roots, retry).map(Some)
    }

    /// The same client abandoning (and retrying) an attempt that takes longer than
    /// `timeout` (default 10 s).
    pub fn with_attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = timeout;
        self
    }

    /// The endpoint requests go to.
    pub fn endpoint(&self) -> &http::Uri {
        &self.uri
    }

    /// Sends `body`, an `UpdateItem` request in DynamoDB's JSON 1.0 protocol, retried as
    /// the module docs say; the attributes it returns read as an item (`Read::Item`).
    pub async fn update_item(&self, body: Bytes) -> Result<LeanOutput, LeanError> {
        self.update_item_reading(&body, Read::Item).await
    }

    /// [`update_item`](Self::update_item) of the request `body`, the attributes it returns
    /// read as `read` asks.
    pub async fn update_item_reading(
        &self,
        body: &[u8],
        read: Read,
    ) -> Result<LeanOutput, LeanError> {
        let payload_hash = hex_digest(&Sha256::digest(body));
        let payload_hash = std::str::from_utf8(&payload_hash).unwrap_or_default();
        let mut attempt = 0u32;
        // Tokens the retries of this request took: a success gives them back.
        let mut spent = 0.0;
        loop {
            attempt += 1;
            let outcome = self.attempt(body, payload_hash, read).await;
            let retry_cost = match &outcome {
                Attempt::Done(_) => None,
                Attempt::Retryable { transport, .. } => Some(if *transport { 10.0 } else { 5.0 }),
            };
            match (outcome, retry_cost) {
                (Attempt::Done(result), _) => {
                    if result.is_ok() {
                        let mut budget = self.budget.lock().unwrap_or_else(PoisonError::into_inner);
                        budget.give(if attempt == 1 { 1.0 } else { spent });
                    }
                    return result;
                }
                (Attempt::Retryable { error, .. }, Some(cost)) => {
                    let allowed = attempt < self.retry.max_attempts
                        && self
                            .budget
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .take(cost);
                    if !allowed {
                        return Err(error);
                    }
                    spent += cost;
                    tokio::time::sleep(self.backoff(attempt)).await;
                }
                (Attempt::Retryable { error, .. }, None) => return Err(error),
            }
        }
    }

    /// Exponential backoff with full jitter from the initial backoff (the SDK's standard
    /// mode), capped at 20 s.
    fn backoff(&self, attempt: u32) -> Duration {
        let base = self.retry.initial_backoff.as_secs_f64() * 2f64.powi(attempt as i32 - 1);
        Duration::from_secs_f64(rand::random::<f64>() * base.min(20.0))
    }

    async fn attempt(&self, body: &[u8], payload_hash: &str, read: Read) -> Attempt {
        match tokio::time::timeout(
            self.attempt_timeout,
            self.attempt_once(body, payload_hash, read),
        )
        .await
        {
            Ok(attempt) => attempt,
            Err(_) => Attempt::Retryable {
                error: LeanError::Transport(format!(
                    "DynamoDB request to {} timed out after {:?}",
                    self.uri, self.attempt_timeout
                )),
                transport: true,
            },
        }
    }

    async fn attempt_once(&self, body: &[u8], payload_hash: &str, read: Read) -> Attempt {
        let credentials = match self.credentials().await {
            Ok(credentials) => credentials,
            Err(e) => return Attempt::Done(Err(LeanError::Transport(e))),
        };
        let request = self.request(body, payload_hash, &credentials, SystemTime::now());
        let response = match self.pool.send(&request).await {
            Ok(response) => response,
            Err(e) => {
                return Attempt::Retryable {
                    error: LeanError::Transport(format!(
                        "DynamoDB request to {} failed: {}",
                        self.uri, e.text
                    )),
                    transport: true,
                };
            }
        };
        let (status, bytes) = (response.status(), response.body());
        if (200..300).contains(&status) {
            let output = match read {
                Read::Item => parse_output(bytes),
                Read::State => parse_state_output(bytes),
            };
            return Attempt::Done(output.map_err(LeanError::Transport));
        }
        let error = parse_error(status, bytes);
        let retryable = status >= 500
            || matches!(&error, LeanError::Service { code, .. } if is_retryable_code(code));
        if retryable {
            Attempt::Retryable {
                error,
                transport: false,
            }
        } else {
            Attempt::Done(Err(error))
        }
    }

    /// The credentials to sign with, from the cache or the provider.
    async fn credentials(&self) -> Result<Credentials, String> {
        if let Some(credentials) = self.cached_credentials() {
            return Ok(credentials);
        }
        let _refreshing = self.refreshing.lock().await;
        if let Some(credentials) = self.cached_credentials() {
            return Ok(credentials); // fetched while this request waited
        }
        let credentials = self
            .provider
            .provide_credentials()
            .await
            .map_err(|e| format!("DynamoDB: no credentials: {e}"))?;
        // They are written into the request's head as they are.
        if !header_safe(credentials.access_key_id())
            || !credentials.session_token().is_none_or(header_safe)
        {
            return Err(
                "DynamoDB: the credentials' access key or session token holds control characters"
                    .to_owned(),
            );
        }
        let lifetime = credentials
            .expiry()
            .and_then(|at| at.duration_since(SystemTime::now()).ok())
            .map_or(CREDENTIALS_WITHOUT_EXPIRY, |left| {
                left.saturating_sub(CREDENTIALS_REFRESH_MARGIN)
            });
        *self
            .credentials
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(CachedCredentials {
            credentials: credentials.clone(),
            refresh_at: Instant::now() + lifetime,
        });
        Ok(credentials)
    }

    /// The cached credentials, unless they are due for a refresh.
    fn cached_credentials(&self) -> Option<Credentials> {
        let cached = self
            .credentials
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        cached
            .as_ref()
            .filter(|entry| Instant::now() < entry.refresh_at)
            .map(|entry| entry.credentials.clone())
    }

    /// The signing key of `day` for `secret`, derived once.
    fn signing_key(&self, day: &str, secret: &str, now: SystemTime) -> Arc<SigningKey> {
        let mut slot = self
            .signing_key
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match slot.as_ref() {
            Some(key) if key.day == day && key.secret == secret => Arc::clone(key),
            _ => {
                let key = Arc::new(SigningKey::new(
                    day,
                    secret,
                    aws_sigv4::sign::v4::generate_signing_key(
                        secret,
                        now,
                        &self.region,
                        "dynamodb",
                    )
                    .as_ref(),
                ));
                *slot = Some(Arc::clone(&key));
                key
            }
        }
    }

    /// The `UpdateItem` request as HTTP/1.1 bytes (head and body), signed with SigV4.
    /// The host was checked when the client was made, the credentials when they were
    /// fetched, and the other values are this client's own: no header needs checking here.
    fn request(
        &self,
        body: &[u8],
        payload_hash: &str,
        credentials: &Credentials,
        now: SystemTime,
    ) -> Vec<u8> {
        let date = amz_date(now);
        let (day, stamp) = (date.day(), date.stamp());
        let token = credentials.session_token();
        let key = self.signing_key(day, credentials.secret_access_key(), now);
        let mut out = Vec::with_capacity(body.len() + 480 + token.map_or(0, str::len));
        out.extend_from_slice(b"POST / HTTP/1.1\r\nhost: ");
        out.extend_from_slice(self.host.as_bytes());
        out.extend_from_slice(b"\r\ncontent-type: ");
        out.extend_from_slice(CONTENT_TYPE.as_bytes());
        out.extend_from_slice(b"\r\nx-amz-target: ");
        out.extend_from_slice(UPDATE_ITEM_TARGET.as_bytes());
        out.extend_from_slice(b"\r\nx-amz-date: ");
        out.extend_from_slice(stamp.as_bytes());
        if let Some(token) = token {
            out.extend_from_slice(b"\r\nx-amz-security-token: ");
            out.extend_from_slice(token.as_bytes());
        }
        out.extend_from_slice(b"\r\nauthorization: ");
        authorization(
            &mut out,
            &self.host,
            &self.region,
            stamp,
            day,
            credentials.access_key_id(),
            token,
            &key,
            payload_hash,
        );
        out.extend_from_slice(b"\r\ncontent-length: ");
        super::request::decimal(&mut out, body.len() as u64, false);
        out.extend_from_slice(b"\r\n\r\n");
        out.extend_from_slice(body);
        out
    }
}

/// Whether `text` can be written as a header value as it is: no control characters but tab.
fn header_safe(text: &str) -> bool {
    text.bytes().all(|b| b == b'\t' || (b >= 0x20 && b != 0x7f))
}

enum Attempt {
    Done(Result<LeanOutput, LeanError>),
    Retryable { error: LeanError, transport: bool },
}

/// Throttling and transient service errors the SDK's standard mode retries.
fn is_retryable_code(code: &str) -> bool {
    matches!(
        code,
        "ProvisionedThroughputExceededException"
            | "ThrottlingException"
            | "RequestLimitExceeded"
            | "Throttling"
            | "ThrottledException"
            | "TransactionInProgressException"
            | "InternalServerError"
            | "ServiceUnavailable"
    )
}

/// Writes the SigV4 `Authorization` header value of an `UpdateItem` POST to `/` with the
/// headers this client sends into `out`. The canonical request is hashed as it is written
/// and the string to sign fed to the key's HMAC state: neither is built as a string.
#[allow(clippy::too_many_arguments)]
fn authorization(
    out: &mut Vec<u8>,
    host: &str,
    region: &str,
    stamp: &str,
    day: &str,
    access_key: &str,
    token: Option<&str>,
    key: &SigningKey,
    payload_hash: &str,
) {
    let signed_headers = if token.is_some() {
        SIGNED_HEADERS_WITH_TOKEN
    } else {
        SIGNED_HEADERS
    };
    let mut canonical = Sha256::new();
    canonical.update(b"POST\n/\n\ncontent-type:");
    canonical.update(CONTENT_TYPE);
    canonical.update(b"\nhost:");
    canonical.update(host);
    canonical.update(b"\nx-amz-date:");
    canonical.update(stamp);
    if let Some(token) = token {
        canonical.update(b"\nx-amz-security-token:");
        canonical.update(token.trim());
    }
    canonical.update(b"\nx-amz-target:");
    canonical.update(UPDATE_ITEM_TARGET);
    canonical.update(b"\n\n");
    canonical.update(signed_headers);
    canonical.update(b"\n");
    canonical.update(payload_hash);
    let canonical = hex_digest(&canonical.finalize());
    let signature = key.sign(|mac| {
        mac.update(b"AWS4-HMAC-SHA256\n");
        mac.update(stamp);
        mac.update(b"\n");
        scope(day, region, |part| mac.update(part));
        mac.update(b"\n");
        mac.update(canonical);
    });
    out.extend_from_slice(b"AWS4-HMAC-SHA256 Credential=");
    out.extend_from_slice(access_key.as_bytes());
    out.push(b'/');
    scope(day, region, |part| out.extend_from_slice(part));
    out.extend_from_slice(b", SignedHeaders=");
    out.extend_from_slice(signed_headers.as_bytes());
    out.extend_from_slice(b", Signature=");
    out.extend_from_slice(&signature);
}

/// The credential scope, `<day>/<region>/dynamodb/aws4_request`, in parts.
fn scope(day: &str, region: &str, mut write: impl FnMut(&[u8])) {
    write(day.as_bytes());
    write(b"/");
    write(region.as_bytes());
    write(b"/dynamodb/aws4_request");
}

/// A request's time as SigV4 writes it: `YYYYMMDD'T'HHMMSS'Z'` in UTC.
struct AmzDate([u8; 16]);

impl AmzDate {
    /// `YYYYMMDD`.
    fn day(&self) -> &str {
        std::str::from_utf8(&self.0[..8]).unwrap_or_default()
    }

    /// `YYYYMMDD'T'HHMMSS'Z'`.
    fn stamp(&self) -> &str {
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

/// The [`AmzDate`] of `time`.
fn amz_date(time: SystemTime) -> AmzDate {
    let seconds = time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()) as i64;
    let (days, of_day) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let mut text = *b"00000000T000000Z";
    let mut digits = |at: usize, n: i64, width: usize| {
        let mut n = n;
        for place in (at..at + width).rev() {
            text[place] = b'0' + n.rem_euclid(10) as u8;
            n /= 10;
        }
    };
    digits(0, year, 4);
    digits(4, month, 2);
    digits(6, day, 2);
    digits(9, of_day / 3600, 2);
    digits(11, of_day / 60 % 60, 2);
    digits(13, of_day % 60, 2);
    AmzDate(text)
}

/// The lowercase hex of a SHA-256 digest.
fn hex_digest(bytes: &[u8]) -> [u8; 64] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 64];
    for (i, b) in bytes.iter().take(32).enumerate() {
        out[2 * i] = DIGITS[usize::from(b >> 4)];
        out[2 * i + 1] = DIGITS[usize::from(b & 0xf)];
    }
    out
}

// --- The JSON 1.0 protocol's responses -------------------------------------------------

/// Whether the store reads attribute `name` of an item an `UpdateItem` returns: the value
/// (`v`, or `a` of a general aggregate), the version `ver`, the format `fv`, the newest
/// record time `mt`, the watermarks (`w:<topic>-<partition>`) and, under exactly-once
/// output, the outbox (`ob:<tp>` lists and the `oo:`/`ov:`/`on:`/`ot:`/`om:<tp>` slots).
/// The others (the raw key `k`, TTL and closing attributes) are skipped unread, so a
/// response costs no allocation for them.
pub fn store_reads(name: &str) -> bool {
    matches!(name, "v" | "a" | "ver" | "fv" | "mt")
        || name.starts_with(super::WATERMARK_PREFIX)
        || name.starts_with(super::OUTBOX_PREFIX)
        || super::SLOT_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// An attribute value as the JSON protocol reads it.
#[derive(Deserialize)]
enum WireValue {
    S(String),
    N(String),
    B(String),
    #[serde(rename = "BOOL")]
    Bool(bool),
    #[serde(rename = "NULL")]
    Null(bool),
    M(HashMap<String, WireValue>),
    L(Vec<WireValue>),
    #[serde(rename = "SS")]
    Ss(Vec<String>),
    #[serde(rename = "NS")]
    Ns(Vec<String>),
    #[serde(rename = "BS")]
    Bs(Vec<String>),
}

impl WireValue {
    fn into_value(self) -> Result<AttributeValue, String> {
        let blob = |text: String| {
            STANDARD
                .decode(text.as_bytes())
                .map(Blob::new)
                .map_err(|e| format!("binary attribute is not base64: {e}"))
        };
        Ok(match self {
            WireValue::S(s) => AttributeValue::S(s),
            WireValue::N(n) => AttributeValue::N(n),
            WireValue::B(b) => AttributeValue::B(blob(b)?),
            WireValue::Bool(b) => AttributeValue::Bool(b),
            WireValue::Null(b) => AttributeValue::Null(b),
            WireValue::M(m) => AttributeValue::M(
                m.into_iter()
                    .map(|(name, value)| Ok((name, value.into_value()?)))
                    .collect::<Result<_, String>>()?,
            ),
            WireValue::L(l) => AttributeValue::L(
                l.into_iter()
                    .map(WireValue::into_value)
                    .collect::<Result<_, _>>()?,
            ),
            WireValue::Ss(v) => AttributeValue::Ss(v),
            WireValue::Ns(v) => AttributeValue::Ns(v),
            WireValue::Bs(v) => {
                AttributeValue::Bs(v.into_iter().map(blob).collect::<Result<_, _>>()?)
            }
        })
    }
}

/// An attribute name, borrowed from the response unless it holds escapes.
struct Name<'de>(std::borrow::Cow<'de, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Name<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct NameVisitor<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for NameVisitor<'a> {
            type Value = Name<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an attribute name")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Name(std::borrow::Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Name(std::borrow::Cow::Owned(v.to_owned())))
            }
        }
        deserializer.deserialize_str(NameVisitor(std::marker::PhantomData))
    }
}

/// An item of a response: the attributes the store reads ([`store_reads`]), the others
/// skipped; a binary value that is not base64 is an error.
struct StoreItem(HashMap<String, AttributeValue>);

impl<'de> Deserialize<'de> for StoreItem {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ItemVisitor;
        impl<'de> Visitor<'de> for ItemVisitor {
            type Value = StoreItem;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an item")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut item = HashMap::with_capacity(8);
                while let Some(Name(name)) = map.next_key::<Name<'de>>()? {
                    if store_reads(&name) {
                        let value = map
                            .next_value::<WireValue>()?
                            .into_value()
                            .map_err(serde::de::Error::custom)?;
                        item.insert(name.into_owned(), value);
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(StoreItem(item))
            }
        }
        deserializer.deserialize_map(ItemVisitor)
    }
}

/// A response's attribute value as an item's state is read from it ([`StateAttribute`]):
/// a number's text (borrowed from the response unless it holds escapes), a binary decoded
/// (an error when it is not base64, as for [`StoreItem`]), or another type, skipped.
enum WireAttribute<'de> {
    N(std::borrow::Cow<'de, str>),
    B(Vec<u8>),
    Other,
}

impl WireAttribute<'_> {
    fn as_state(&self) -> StateAttribute<'_> {
        match self {
            WireAttribute::N(n) => StateAttribute::N(n),
            WireAttribute::B(b) => StateAttribute::B(b),
            WireAttribute::Other => StateAttribute::Other,
        }
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for WireAttribute<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct AttributeVisitor<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for AttributeVisitor<'a> {
            type Value = WireAttribute<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an attribute value")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let Some(Name(kind)) = map.next_key::<Name<'a>>()? else {
                    return Err(serde::de::Error::custom(
                        "an attribute value without a type",
                    ));
                };
                let value = match kind.as_ref() {
                    "N" => WireAttribute::N(map.next_value::<Name<'a>>()?.0),
                    "B" => {
                        let Name(text) = map.next_value::<Name<'a>>()?;
                        WireAttribute::B(STANDARD.decode(text.as_bytes()).map_err(|e| {
                            serde::de::Error::custom(format!("binary attribute is not base64: {e}"))
                        })?)
                    }
                    _ => {
                        map.next_value::<IgnoredAny>()?;
                        WireAttribute::Other
                    }
                };
                if map.next_key::<IgnoredAny>()?.is_some() {
                    return Err(serde::de::Error::custom(
                        "an attribute value with more than one type",
                    ));
                }
                Ok(value)
            }
        }
        deserializer.deserialize_map(AttributeVisitor(std::marker::PhantomData))
    }
}

/// Of a response's item, the attributes its state is read from (`v`, `a`, `ver`, `fv`,
/// `mt`; of a name given twice, the last, as an item map keeps it), the others skipped.
#[derive(Default)]
struct StateFields<'de> {
    v: Option<WireAttribute<'de>>,
    a: Option<WireAttribute<'de>>,
    ver: Option<WireAttribute<'de>>,
    fv: Option<WireAttribute<'de>>,
    mt: Option<WireAttribute<'de>>,
}

impl StateFields<'_> {
    /// The item's state, read as the store reads an item map ([`state_from`]).
    fn state(&self) -> Result<ItemState, String> {
        state_from(|name| {
            let slot = match name {
                "v" => &self.v,
                "a" => &self.a,
                "ver" => &self.ver,
                "fv" => &self.fv,
                NEWEST_TIME => &self.mt,
                _ => return None,
            };
            slot.as_ref().map(WireAttribute::as_state)
        })
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for StateFields<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct FieldsVisitor<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for FieldsVisitor<'a> {
            type Value = StateFields<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an item")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut fields = StateFields::default();
                while let Some(Name(name)) = map.next_key::<Name<'a>>()? {
                    let slot = match name.as_ref() {
                        "v" => &mut fields.v,
                        "a" => &mut fields.a,
                        "ver" => &mut fields.ver,
                        "fv" => &mut fields.fv,
                        NEWEST_TIME => &mut fields.mt,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                            continue;
                        }
                    };
                    *slot = Some(map.next_value::<WireAttribute<'a>>()?);
                }
                Ok(fields)
            }
        }
        deserializer.deserialize_map(FieldsVisitor(std::marker::PhantomData))
    }
}

/// The fields of a response body this client reads (the others skipped).
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct OutputBody {
    #[serde(default)]
    attributes: Option<StoreItem>,
    #[serde(default)]
    consumed_capacity: Option<Capacity>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Capacity {
    #[serde(default)]
    capacity_units: Option<f64>,
}

#[derive(Deserialize)]
struct ErrorBody<'a> {
    #[serde(rename = "__type", default, borrow)]
    kind: Option<Name<'a>>,
    #[serde(default, alias = "Message", borrow)]
    message: Option<Name<'a>>,
    #[serde(rename = "Item", default)]
    item: Option<StoreItem>,
}

fn parse_output(bytes: &[u8]) -> Result<LeanOutput, String> {
    let body: OutputBody = serde_json::from_slice(bytes)
        .map_err(|e| format!("DynamoDB UpdateItem response is not readable: {e}"))?;
    Ok(LeanOutput {
        attributes: Attributes::Item(body.attributes.map(|item| item.0).unwrap_or_default()),
        capacity_units: body.consumed_capacity.and_then(|c| c.capacity_units),
    })
}

/// The fields of a response body read for [`Read::State`].
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct StateOutputBody<'a> {
    #[serde(default, borrow)]
    attributes: Option<StateFields<'a>>,
    #[serde(default)]
    consumed_capacity: Option<Capacity>,
}

/// A response read for [`Read::State`]: the state straight from the attributes.
fn parse_state_output(bytes: &[u8]) -> Result<LeanOutput, String> {
    let body: StateOutputBody<'_> = serde_json::from_slice(bytes)
        .map_err(|e| format!("DynamoDB UpdateItem response is not readable: {e}"))?;
    Ok(LeanOutput {
        attributes: Attributes::State(body.attributes.unwrap_or_default().state()),
        capacity_units: body.consumed_capacity.and_then(|c| c.capacity_units),
    })
}

fn parse_error(status: u16, bytes: &[u8]) -> LeanError {
    let body = match serde_json::from_slice::<ErrorBody<'_>>(bytes) {
        Ok(body) => body,
        Err(e) => {
            // A DynamoDB error whose failed condition's item does not read.
            if let Ok(failed) = serde_json::from_slice::<FailedCondition<'_>>(bytes)
                && failed.kind.ends_with("#ConditionalCheckFailedException")
            {
                return LeanError::Transport(format!("the failed condition's item: {e}"));
            }
            return LeanError::Service {
                code: format!("HTTP {status}"),
                message: String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into_owned(),
            };
        }
    };
    let code = body
        .kind
        .as_ref()
        .map(|Name(kind)| kind.rsplit('#').next().unwrap_or(kind));
    if code == Some("ConditionalCheckFailedException") {
        return LeanError::ConditionFailed(body.item.map(|item| item.0));
    }
    LeanError::Service {
        code: code.map_or_else(|| format!("HTTP {status}"), str::to_owned),
        message: body
            .message
            .map(|Name(m)| m.into_owned())
            .unwrap_or_default(),
    }
}

/// The error type of an error body whose other fields may not read.
#[derive(Deserialize)]
struct FailedCondition<'a> {
    #[serde(rename = "__type", borrow)]
    kind: std::borrow::Cow<'a, str>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An `UpdateItem` body (the client sends it as it is).
    fn sample_body() -> Bytes {
        Bytes::from_static(
            br##"{"TableName":"state","Key":{"pk":{"S":"counts#Zm94"},"sk":{"N":"0"}},"UpdateExpression":"ADD #v :d","ExpressionAttributeNames":{"#v":"v"},"ExpressionAttributeValues":{":d":{"N":"3"}},"ReturnValues":"UPDATED_NEW"}"##,
        )
    }

    #[test]
    fn responses_and_errors_parse_into_the_sdks_types() {
        let out = parse_output(
            br#"{"Attributes":{"v":{"N":"7"},"a":{"B":"AAE="},"l":{"L":[{"S":"x"}]},
                "k":{"B":"Zm94"},"ver":{"N":"2"},"w:t\u002d0":{"N":"41"},"ttl":{"N":"9"},
                "mt":{"N":"5"},"fv":{"N":"1"},"cq":{"S":"counts"},"m":{"M":{"x":{"NULL":true}}}},
                "ConsumedCapacity":{"TableName":"state","CapacityUnits":1.0}}"#,
        )
        .unwrap();
        let n = |v: &str| AttributeValue::N(v.into());
        let expected = HashMap::from([
            ("v".to_owned(), n("7")),
            ("a".to_owned(), AttributeValue::B(Blob::new(vec![0, 1]))),
            ("ver".to_owned(), n("2")),
            ("w:t-0".to_owned(), n("41")),
            ("mt".to_owned(), n("5")),
            ("fv".to_owned(), n("1")),
        ]);
        assert_eq!(
            out.attributes,
            Attributes::Item(expected),
            "only what the store reads"
        );
        assert_eq!(out.capacity_units, Some(1.0));
        assert!(
            parse_output(br#"{"Attributes":{"a":{"B":"!!"}}}"#)
                .unwrap_err()
                .contains("not base64")
        );
        assert!(parse_output(br#"{"Attributes":{"v":{"X":"1"}}}"#).is_err());
        let failed = parse_error(
            400,
            br#"{"__type":"com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException",
                "message":"The conditional request failed","Item":{"ver":{"N":"2"}}}"#,
        );
        match failed {
            LeanError::ConditionFailed(Some(item)) => {
                assert_eq!(item["ver"], AttributeValue::N("2".into()));
            }
            other => panic!("{other:?}"),
        }
        match parse_error(
            400,
            br#"{"__type":"com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException",
                "message":"The conditional request failed","Item":{"a":{"B":"!"}}}"#,
        ) {
            LeanError::Transport(text) => assert!(text.contains("failed condition"), "{text}"),
            other => panic!("{other:?}"),
        }
        match parse_error(
            400,
            br#"{"__type":"com.amazon.coral.validate#ValidationException","Message":"Item size has exceeded"}"#,
        ) {
            LeanError::Service { code, message } => {
                assert_eq!(code, "ValidationException");
                assert_eq!(message, "Item size has exceeded");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse_error(502, b"<html>"),
            LeanError::Service { code, .. } if code == "HTTP 502"
        ));
    }

    /// A response read for the state alone gives the state, or the error, that the store
    /// gets from the same response read as an item ([`super::super::item::parse_state`]).
    #[test]
    fn states_read_straight_from_responses_equal_the_items_states() {
        let responses: &[&[u8]] = &[
            br#"{"Attributes":{"v":{"N":"7"},"ver":{"N":"2"},"k":{"B":"Zm94"},"fv":{"N":"1"},"w:events-0":{"N":"41"}},"ConsumedCapacity":{"TableName":"t","CapacityUnits":1.0}}"#,
            br#"{"Attributes":{"a":{"B":"AAE="},"ver":{"N":"9"},"mt":{"N":"1764460800000"},"ttl":{"N":"9"}}}"#,
            br#"{"Attributes":{"v":{"N":"-5"},"ver":{"N":"3"},"mt":{"S":"x"}}}"#,
            br#"{"Attributes":{"v":{"N":"12"},"ver":{"N":"1"},"l":{"L":[{"S":"x"}]},"m":{"M":{"x":{"NULL":true}}}}}"#,
            br#"{"Attributes":{"v":{"N":"1"},"ver":{"N":"2"},"v":{"N":"3"}}}"#,
            br#"{"Attributes":{"v":{"N":"1"},"ver":{"N":"-1"}}}"#,
            br#"{"Attributes":{"v":{"N":"1.5"},"ver":{"N":"1"}}}"#,
            br#"{"Attributes":{"v":{"S":"1"},"ver":{"N":"1"}}}"#,
            br#"{"Attributes":{"a":{"N":"1"},"ver":{"N":"1"}}}"#,
            br#"{"Attributes":{"v":{"N":"1"},"ver":{"N":"1"},"fv":{"N":"2"}}}"#,
            br#"{"Attributes":{"v":{"N":"1"}}}"#,
            br#"{"Attributes":{}}"#,
            br#"{"ConsumedCapacity":{"CapacityUnits":2.0}}"#,
            br#"{}"#,
        ];
        for response in responses {
            let text = String::from_utf8_lossy(response);
            let item = parse_output(response).unwrap();
            let state = parse_state_output(response).unwrap();
            let Attributes::Item(item_attributes) = item.attributes else {
                panic!("{text}")
            };
            let expected = super::super::item::parse_state(&item_attributes);
            assert_eq!(state.attributes, Attributes::State(expected), "{text}");
            assert_eq!(state.capacity_units, item.capacity_units, "{text}");
        }
        // Responses neither reads.
        for response in [
            &br#"{"Attributes":{"a":{"B":"!!"}}}"#[..],
            br#"{"Attributes":{"v":{"N":1}}}"#,
            br#"{"Attributes":{"v":{"N":"1","S":"1"}}}"#,
            br#"{"Attributes":{"v":{}}}"#,
            br#"{"Attributes":[]}"#,
            b"not json",
        ] {
            let text = String::from_utf8_lossy(response);
            assert!(parse_output(response).is_err(), "{text}");
            assert!(parse_state_output(response).is_err(), "{text}");
        }
    }

    /// A local HTTP/1.1 server answering each request with the next of `responses`
    /// (status, body), counting the requests; its address.
    async fn scripted(responses: Vec<(u16, &'static str)>) -> (String, Arc<Mutex<usize>>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = format!("http://{}", listener.local_addr().unwrap());
        let served = Arc::new(Mutex::new(0usize));
        let count = Arc::clone(&served);
        tokio::spawn(async move {
            let responses = Arc::new(responses);
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                let (responses, count) = (Arc::clone(&responses), Arc::clone(&count));
                tokio::spawn(async move {
                    let mut buffer = Vec::new();
                    loop {
                        let mut chunk = [0u8; 4096];
                        let Ok(n) = socket.read(&mut chunk).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        buffer.extend_from_slice(&chunk[..n]);
                        let text = String::from_utf8_lossy(&buffer).to_string();
                        let Some(head_end) = text.find("\r\n\r\n") else {
                            continue;
                        };
                        let length: usize = text[..head_end]
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length:")
                                    .map(|v| v.trim().parse().unwrap())
                            })
                            .unwrap_or(0);
                        if buffer.len() < head_end + 4 + length {
                            continue;
                        }
                        buffer.drain(..head_end + 4 + length);
                        let index = {
                            let mut n = count.lock().unwrap();
                            *n += 1;
                            *n - 1
                        };
                        let (status, body) = responses[index.min(responses.len() - 1)];
                        let reply = format!(
                            "HTTP/1.1 {status} X\r\ncontent-type: application/x-amz-json-1.0\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if socket.write_all(reply.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (address, served)
    }

    fn client(endpoint: &str, max_attempts: u32) -> LeanClient {
        let provider = SharedCredentialsProvider::new(Credentials::new("a", "b", None, None, "t"));
        let retry = RetrySettings {
            max_attempts,
            initial_backoff: Duration::from_millis(1),
            ..RetrySettings::default()
        };
        LeanClient::new(endpoint, "us-east-1", provider, TlsRoots::Compiled, retry).unwrap()
    }

    const THROTTLED: &str = r#"{"__type":"com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException","message":"slow down"}"#;

    #[tokio::test]
    async fn throttling_and_server_errors_are_retried_then_succeed() {
        let (endpoint, served) = scripted(vec![
            (400, THROTTLED),
            (500, "{}"),
            (200, r#"{"Attributes":{"v":{"N":"1"}}}"#),
        ])
        .await;
        let out = client(&endpoint, 6)
            .update_item(sample_body())
            .await
            .unwrap();
        match out.attributes {
            Attributes::Item(item) => assert_eq!(item["v"], AttributeValue::N("1".into())),
            other => panic!("{other:?}"),
        }
        assert_eq!(*served.lock().unwrap(), 3);
    }

    #[tokio::test]
    async fn retries_stop_at_max_attempts_and_conditions_are_not_retried() {
        let (endpoint, served) = scripted(vec![(400, THROTTLED)]).await;
        match client(&endpoint, 3).update_item(sample_body()).await {
            Err(LeanError::Service { code, .. }) => {
                assert_eq!(code, "ProvisionedThroughputExceededException");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(*served.lock().unwrap(), 3, "three attempts");
        let (endpoint, served) = scripted(vec![(
            400,
            r#"{"__type":"com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException","message":"no"}"#,
        )])
        .await;
        let result = client(&endpoint, 6).update_item(sample_body()).await;
        assert!(
            matches!(result, Err(LeanError::ConditionFailed(None))),
            "{result:?}"
        );
        assert_eq!(
            *served.lock().unwrap(),
            1,
            "a failed condition is an answer"
        );
    }

    #[tokio::test]
    async fn a_stalled_endpoint_times_the_attempt_out_and_fails_after_the_retries() {
        // Accepts connections and never answers.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        let started = Instant::now();
        let result = client(&endpoint, 2)
            .with_attempt_timeout(Duration::from_millis(100))
            .update_item(sample_body())
            .await;
        match result {
            Err(LeanError::Transport(text)) => assert!(text.contains("timed out"), "{text}"),
            other => panic!("{other:?}"),
        }
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn amz_dates_are_utc_calendar_dates() {
        // 2024-02-29T23:59:59Z = 1709251199; 1970-01-01; 2000-03-01T00:00:00Z = 951868800.
        let at = |s: u64| {
            let date = amz_date(UNIX_EPOCH + Duration::from_secs(s));
            (date.day().to_owned(), date.stamp().to_owned())
        };
        assert_eq!(
            at(1_709_251_199),
            ("20240229".into(), "20240229T235959Z".into())
        );
        assert_eq!(at(0), ("19700101".into(), "19700101T000000Z".into()));
        assert_eq!(
            at(951_868_800),
            ("20000301".into(), "20000301T000000Z".into())
        );
    }

    /// The hand-built signature equals the one `aws-sigv4`'s general signer computes for
    /// the same request (with and without a session token).
    #[test]
    fn signatures_match_aws_sigv4s_signer() {
        use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
        use aws_smithy_runtime_api::client::identity::Identity;
        for token in [None, Some("session-token")] {
            let now = UNIX_EPOCH + Duration::from_secs(1_764_590_400);
            let credentials = Credentials::new(
                "AKIDEXAMPLE",
                "secret/key",
                token.map(str::to_owned),
                None,
                "test",
            );
            let body = sample_body();
            let host = "dynamodb.eu-west-1.amazonaws.com";
            let date = amz_date(now);
            let (day, stamp) = (date.day(), date.stamp());
            let key = aws_sigv4::sign::v4::generate_signing_key(
                "secret/key",
                now,
                "eu-west-1",
                "dynamodb",
            );
            let key = SigningKey::new(day, "secret/key", key.as_ref());
            let mut ours = Vec::new();
            authorization(
                &mut ours,
                host,
                "eu-west-1",
                stamp,
                day,
                "AKIDEXAMPLE",
                token,
                &key,
                std::str::from_utf8(&hex_digest(&Sha256::digest(&body))).unwrap(),
            );
            let ours = String::from_utf8(ours).unwrap();
            let identity: Identity = credentials.into();
            let params = aws_sigv4::sign::v4::SigningParams::builder()
                .identity(&identity)
                .region("eu-west-1")
                .name("dynamodb")
                .time(now)
                .settings(SigningSettings::default())
                .build()
                .unwrap()
                .into();
            // The general signer adds x-amz-date and x-amz-security-token itself.
            let headers = [
                ("content-type", CONTENT_TYPE),
                ("host", host),
                ("x-amz-target", UPDATE_ITEM_TARGET),
            ];
            let request = SignableRequest::new(
                "POST",
                format!("https://{host}/"),
                headers.into_iter(),
                SignableBody::Bytes(&body),
            )
            .unwrap();
            let (instructions, _) = sign(request, &params).unwrap().into_parts();
            let reference = instructions
                .headers()
                .find(|(name, _)| *name == "authorization")
                .map(|(_, value)| value.to_owned())
                .expect("an authorization header");
            assert_eq!(ours, reference, "token {token:?}");
        }
    }
}
