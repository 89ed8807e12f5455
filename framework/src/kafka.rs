//! How a function's producer connects to Kafka: TLS, SASL/SCRAM, MSK IAM and any librdkafka
//! property, from the environment.
//!
//! | variable | meaning |
//! |---|---|
//! | `LAMBDA_STREAMS_KAFKA_SECURITY_PROTOCOL` | `PLAINTEXT` (default), `SSL`, `SASL_PLAINTEXT` or `SASL_SSL` |
//! | `LAMBDA_STREAMS_KAFKA_SASL_MECHANISM` | `SCRAM-SHA-512`, `SCRAM-SHA-256`, `PLAIN`, or `AWS_MSK_IAM` (SASL/OAUTHBEARER with a token signed with the function role's credentials); with a mechanism, the protocol defaults to `SASL_SSL` |
//! | `LAMBDA_STREAMS_KAFKA_SASL_USERNAME`, `LAMBDA_STREAMS_KAFKA_SASL_PASSWORD` | SCRAM/PLAIN credentials (plain environment variables; see below) |
//! | `LAMBDA_STREAMS_KAFKA_SSL_CA_LOCATION` | PEM file of the CAs to trust; with TLS and without it, the system's CA bundle (`probe`) |
//! | `LAMBDA_STREAMS_KAFKA_<PROPERTY>` | any other librdkafka property, its name upper-cased with `.` written `_` (`LAMBDA_STREAMS_KAFKA_SSL_ENDPOINT_IDENTIFICATION_ALGORITHM=none` sets `ssl.endpoint.identification.algorithm`) |
//!
//! Every property is checked against librdkafka when the settings are read: an unknown
//! property or an invalid value is an error naming the variable. `bootstrap.servers` is
//! not accepted here (it is `LAMBDA_STREAMS_BOOTSTRAP_SERVERS`, or the event's).
//! `LAMBDA_STREAMS_KAFKA_HEAP` belongs to `scripts/services` and is ignored.
//!
//! The SCRAM password is read from the environment as it is: encrypt the function's
//! environment with KMS, or prefer `AWS_MSK_IAM`. Reading it from a Secrets Manager secret
//! (as the event source mapping does) is not implemented yet.
//!
//! `AWS_MSK_IAM` tokens are byte-identical to botocore's (unit tests below) and are accepted
//! in a real handshake by a local broker whose listener checks them with an independent SigV4
//! validator (`scripts/kafka/msk-iam`, `tests/tests/kafka_security.rs`); AWS's own MSK
//! authorizer and IAM policies are not exercised.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use aws_credential_types::Credentials;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use rdkafka::ClientConfig;
use rdkafka::client::{ClientContext, OAuthToken};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use crate::error::StreamError;

/// The prefix of the variables read here.
pub const ENV_PREFIX: &str = "LAMBDA_STREAMS_KAFKA_";

/// Variables with [`ENV_PREFIX`] that are not librdkafka properties.
const IGNORED: &[&str] = &["LAMBDA_STREAMS_KAFKA_HEAP"];

/// The `sasl.mechanism` value that selects MSK IAM.
pub const AWS_MSK_IAM: &str = "AWS_MSK_IAM";

/// One librdkafka property and the variable it came from.
#[derive(Clone, PartialEq, Eq)]
pub struct KafkaProperty {
    /// The librdkafka property (`security.protocol`).
    pub name: String,
    /// Its value.
    pub value: String,
    /// The environment variable that set it, or `(default)`.
    pub variable: String,
}

impl fmt::Debug for KafkaProperty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value = if is_secret(&self.name) {
            "<redacted>"
        } else {
            &self.value
        };
        write!(f, "{}={value} ({})", self.name, self.variable)
    }
}

/// Whether a property holds a secret (never logged).
fn is_secret(name: &str) -> bool {
    name.contains("password") || name.contains("secret") || name == "ssl.key.pem"
}

/// The producer's connection settings: librdkafka properties, and MSK IAM.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KafkaSettings {
    properties: Vec<KafkaProperty>,
    msk_iam_region: Option<String>,
}

impl KafkaSettings {
    /// Plaintext, no authentication: no property set.
    pub fn plaintext() -> Self {
        Self::default()
    }

    /// Reads the `LAMBDA_STREAMS_KAFKA_*` variables (and `AWS_REGION` for MSK IAM) of the
    /// process environment. See the [module](self) documentation.
    pub fn from_env() -> Result<Self, StreamError> {
        Self::from_vars(std::env::vars())
    }

    /// Reads the settings from these `(variable, value)` pairs (the environment, in tests).
    pub fn from_vars(
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, StreamError> {
        let config = |msg: String| StreamError::Config(msg);
        let var = |suffix: &str| format!("{ENV_PREFIX}{suffix}");
        let mut region = None;
        let mut given: Vec<(String, String)> = Vec::new();
        for (name, value) in vars {
            if name == "AWS_REGION" {
                region = Some(value);
                continue;
            }
            if !name.starts_with(ENV_PREFIX)
                || IGNORED.contains(&name.as_str())
                || value.trim().is_empty()
            {
                continue;
            }
            // A password is taken as it is; other values without surrounding blanks.
            let value = if name.contains("PASSWORD") {
                value
            } else {
                value.trim().to_owned()
            };
            given.push((name, value));
        }
        given.sort();
        let mut settings = KafkaSettings::default();
        let mut protocol: Option<String> = None;
        let mut mechanism: Option<String> = None;
        for (variable, value) in given {
            let suffix = &variable[ENV_PREFIX.len()..];
            let name = property_name(suffix);
            let value = match name.as_str() {
                "bootstrap.servers" => {
                    return Err(config(format!(
                        "{variable}: set the output brokers with LAMBDA_STREAMS_BOOTSTRAP_SERVERS"
                    )));
                }
                "security.protocol" => {
                    let upper = value.to_ascii_uppercase();
                    if !["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"].contains(&upper.as_str())
                    {
                        return Err(config(format!(
                            "{variable}: {value:?} is not PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"
                        )));
                    }
                    protocol = Some(upper.clone());
                    upper
                }
                "sasl.mechanism" | "sasl.mechanisms" => {
                    let upper = value.to_ascii_uppercase();
                    match upper.as_str() {
                        "SCRAM-SHA-256" | "SCRAM-SHA-512" | "PLAIN" => {}
                        AWS_MSK_IAM => {}
                        "OAUTHBEARER" => {
                            return Err(config(format!(
                                "{variable}: OAUTHBEARER needs a token provider: use AWS_MSK_IAM for MSK IAM authentication"
                            )));
                        }
                        _ => {
                            return Err(config(format!(
                                "{variable}: {value:?} is not SCRAM-SHA-512, SCRAM-SHA-256, PLAIN or AWS_MSK_IAM (GSSAPI is not built in)"
                            )));
                        }
                    }
                    mechanism = Some(upper.clone());
                    if upper == AWS_MSK_IAM {
                        "OAUTHBEARER".to_owned()
                    } else {
                        upper
                    }
                }
                _ => value,
            };
            let name = if name == "sasl.mechanisms" {
                "sasl.mechanism".to_owned()
            } else {
                name
            };
            check_property(&variable, &name, &value)?;
            settings.properties.push(KafkaProperty {
                name,
                value,
                variable,
            });
        }
        let has = |settings: &KafkaSettings, name: &str| settings.get(name).is_some();
        match (protocol.clone(), mechanism.clone()) {
            (None, Some(_)) => {
                protocol = Some("SASL_SSL".to_owned());
                settings.push_default("security.protocol", "SASL_SSL");
            }
            (Some(p), None) if p.starts_with("SASL_") => {
                return Err(config(format!(
                    "{}={p} needs {}",
                    var("SECURITY_PROTOCOL"),
                    var("SASL_MECHANISM")
                )));
            }
            (Some(p), Some(m)) if !p.starts_with("SASL_") => {
                return Err(config(format!(
                    "{}={m} needs {}=SASL_SSL or SASL_PLAINTEXT, not {p}",
                    var("SASL_MECHANISM"),
                    var("SECURITY_PROTOCOL")
                )));
            }
            _ => {}
        }
        match mechanism.as_deref() {
            Some(AWS_MSK_IAM) => {
                if has(&settings, "sasl.username") || has(&settings, "sasl.password") {
                    return Err(config(format!(
                        "{}=AWS_MSK_IAM signs with the function's role: unset {} and {}",
                        var("SASL_MECHANISM"),
                        var("SASL_USERNAME"),
                        var("SASL_PASSWORD")
                    )));
                }
                let Some(region) = region.filter(|r| !r.trim().is_empty()) else {
                    return Err(config(format!(
                        "{}=AWS_MSK_IAM needs AWS_REGION (the cluster's region; Lambda sets it)",
                        var("SASL_MECHANISM")
                    )));
                };
                settings.msk_iam_region = Some(region);
            }
            Some(m) if !has(&settings, "sasl.username") || !has(&settings, "sasl.password") => {
                return Err(config(format!(
                    "{}={m} needs {} and {}",
                    var("SASL_MECHANISM"),
                    var("SASL_USERNAME"),
                    var("SASL_PASSWORD")
                )));
            }
            _ => {}
        }
        if protocol.as_deref().is_some_and(|p| p.ends_with("SSL"))
            && !has(&settings, "ssl.ca.location")
            && !has(&settings, "ssl.ca.pem")
        {
            // The vendored OpenSSL has no usable default CA directory: probe the system's
            // bundle (/etc/pki/tls/certs/ca-bundle.crt in Lambda's provided.al2023).
            settings.push_default("ssl.ca.location", "probe");
        }
        Ok(settings)
    }

    fn push_default(&mut self, name: &str, value: &str) {
        self.properties.push(KafkaProperty {
            name: name.to_owned(),
            value: value.to_owned(),
            variable: "(default)".to_owned(),
        });
    }

    /// The librdkafka properties to set, in order.
    pub fn properties(&self) -> &[KafkaProperty] {
        &self.properties
    }

    /// The value of a property, if set.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.properties
            .iter()
            .rev()
            .find(|p| p.name == name)
            .map(|p| p.value.as_str())
    }

    /// With MSK IAM: the region the tokens are signed for.
    pub fn msk_iam_region(&self) -> Option<&str> {
        self.msk_iam_region.as_deref()
    }

    /// The variables to check when the connection cannot be set up, for error messages.
    pub fn hint(&self) -> String {
        if self.msk_iam_region.is_some() {
            return format!(
                "check {ENV_PREFIX}SASL_MECHANISM=AWS_MSK_IAM, the cluster's IAM authentication (port 9098) and the function role's kafka-cluster:Connect permission"
            );
        }
        let vars: Vec<String> = self
            .properties
            .iter()
            .filter(|p| {
                p.name.starts_with("sasl.")
                    || p.name.starts_with("ssl.")
                    || p.name == "security.protocol"
            })
            .map(|p| {
                if p.variable == "(default)" {
                    format!(
                        "{ENV_PREFIX}{} (unset: {})",
                        p.name.to_ascii_uppercase().replace('.', "_"),
                        p.value
                    )
                } else {
                    p.variable.clone()
                }
            })
            .collect();
        if vars.is_empty() {
            format!(
                "no {ENV_PREFIX}* security setting is set (the producer connects in PLAINTEXT): set {ENV_PREFIX}SECURITY_PROTOCOL and friends if the brokers need TLS or SASL"
            )
        } else {
            format!("check {}", vars.join(", "))
        }
    }
}

/// `SSL_CA_LOCATION` → `ssl.ca.location`; `LOG_LEVEL` → `log_level`.
fn property_name(suffix: &str) -> String {
    match suffix {
        "LOG_LEVEL" => "log_level".to_owned(),
        "ENABLED_EVENTS" => "enabled_events".to_owned(),
        _ => suffix.to_ascii_lowercase().replace('_', "."),
    }
}

/// Asks librdkafka whether it takes this property and value.
fn check_property(variable: &str, name: &str, value: &str) -> Result<(), StreamError> {
    let mut config = ClientConfig::new();
    config.set(name, value);
    match config.create_native_config() {
        Ok(_) => Ok(()),
        Err(KafkaError::ClientConfig(_, reason, _, _)) => Err(StreamError::Config(format!(
            "{variable}: librdkafka does not accept {name}={}: {reason}",
            if is_secret(name) { "<redacted>" } else { value }
        ))),
        Err(e) => Err(StreamError::Config(format!("{variable}: {e}"))),
    }
}

/// How long an authentication or TLS failure of the producer keeps failing sends fast.
pub(crate) const FAILURE_MEMORY: Duration = Duration::from_secs(10);

/// The producer's context: remembers authentication and TLS failures (so that a batch
/// fails at once with a clear error instead of after the message timeout), and with MSK
/// IAM, makes the SASL/OAUTHBEARER tokens.
pub struct SinkContext {
    health: Arc<ConnectionHealth>,
    msk_iam: Option<MskIamSigner>,
}

impl SinkContext {
    /// A context for these settings (`msk_iam` when they select MSK IAM).
    pub(crate) fn new(settings: &KafkaSettings, msk_iam: Option<MskIamSigner>) -> Self {
        SinkContext {
            health: Arc::new(ConnectionHealth {
                hint: settings.hint(),
                failure: Mutex::new(None),
            }),
            msk_iam,
        }
    }

    /// What the context learns about the connection, shared with the sink.
    pub(crate) fn health(&self) -> Arc<ConnectionHealth> {
        Arc::clone(&self.health)
    }
}

/// The producer's recent authentication and TLS failures.
pub(crate) struct ConnectionHealth {
    hint: String,
    failure: Mutex<Option<(Instant, String)>>,
}

impl ConnectionHealth {
    fn failed(&self, reason: String) {
        *self.failure.lock().unwrap_or_else(PoisonError::into_inner) =
            Some((Instant::now(), reason));
    }

    /// The last authentication or TLS failure, if it is recent.
    pub(crate) fn recent_failure(&self) -> Option<String> {
        let failure = self.failure.lock().unwrap_or_else(PoisonError::into_inner);
        failure
            .as_ref()
            .filter(|(at, _)| at.elapsed() < FAILURE_MEMORY)
            .map(|(_, reason)| reason.clone())
    }

    /// Forgets failures: a record was delivered, so the connection works.
    pub(crate) fn delivered(&self) {
        *self.failure.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// What to check, for error messages.
    pub(crate) fn hint(&self) -> &str {
        &self.hint
    }
}

impl ClientContext for SinkContext {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn error(&self, error: KafkaError, reason: &str) {
        let code = error.rdkafka_error_code();
        if matches!(
            code,
            Some(
                RDKafkaErrorCode::Authentication
                    | RDKafkaErrorCode::SSL
                    | RDKafkaErrorCode::SaslAuthenticationFailed
            )
        ) {
            tracing::error!(error = %error, reason, hint = %self.health.hint, "kafka producer cannot connect");
            self.health.failed(format!("{error}: {reason}"));
        } else {
            tracing::warn!(error = %error, reason, "kafka producer error");
        }
    }

    fn generate_oauth_token(
        &self,
        _oauthbearer_config: Option<&str>,
    ) -> Result<OAuthToken, Box<dyn std::error::Error>> {
        match &self.msk_iam {
            Some(signer) => signer.token().map_err(|e| {
                tracing::error!(error = %e, "cannot make an MSK IAM token");
                self.health.failed(e.clone());
                e.into()
            }),
            None => {
                Err("SASL/OAUTHBEARER without AWS_MSK_IAM: no token provider is configured".into())
            }
        }
    }
}

/// Makes MSK IAM authentication tokens with the credentials of a provider (in Lambda, the
/// function's role, from the SDK's default chain).
pub struct MskIamSigner {
    region: String,
    credentials: SharedCredentialsProvider,
    runtime: tokio::runtime::Handle,
}

impl MskIamSigner {
    /// A signer for `region`. librdkafka asks for tokens from its own thread: the
    /// credentials are fetched on `runtime`.
    pub fn new(
        region: impl Into<String>,
        credentials: SharedCredentialsProvider,
        runtime: tokio::runtime::Handle,
    ) -> Self {
        MskIamSigner {
            region: region.into(),
            credentials,
            runtime,
        }
    }

    /// A token for now, valid 15 minutes (librdkafka refreshes it at 80 % of its lifetime).
    pub fn token(&self) -> Result<OAuthToken, String> {
        let provider = self.credentials.clone();
        let credentials = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    self.runtime
                        .block_on(async move { provider.provide_credentials().await })
                })
                .join()
        })
        .map_err(|_| "the credentials provider panicked".to_owned())?
        .map_err(|e| format!("cannot load AWS credentials for MSK IAM: {e}"))?;
        let (token, lifetime_ms) =
            msk_iam_token(&self.region, &credentials, SystemTime::now(), &user_agent())?;
        Ok(OAuthToken {
            token,
            principal_name: credentials.access_key_id().to_owned(),
            lifetime_ms,
        })
    }
}

/// The `User-Agent` put in tokens.
fn user_agent() -> String {
    format!("lambda-streams/{}", env!("CARGO_PKG_VERSION"))
}

/// The SDK's default credentials chain (in Lambda: the function's role).
pub(crate) async fn default_credentials() -> Result<SharedCredentialsProvider, String> {
    let roots = crate::lambda::TlsRoots::from_env().map_err(|e| e.to_string())?;
    let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .http_client(crate::state::dynamodb::https_client(roots))
        .load()
        .await;
    sdk.credentials_provider()
        .ok_or_else(|| "MSK IAM: the AWS SDK found no credentials provider".to_owned())
}

/// The MSK IAM authentication token (`AWS_MSK_IAM` over SASL/OAUTHBEARER), as AWS's signers
/// make it: the URL `https://kafka.<region>.amazonaws.com/?Action=kafka-cluster%3AConnect`
/// presigned with SigV4 (service `kafka-cluster`, 900 s) by `credentials` at `time`, then
/// `User-Agent` appended, base64url-encoded without padding. Returns the token and its
/// expiry in epoch milliseconds.
pub fn msk_iam_token(
    region: &str,
    credentials: &Credentials,
    time: SystemTime,
    user_agent: &str,
) -> Result<(String, i64), String> {
    use aws_sigv4::http_request::{
        SignableBody, SignableRequest, SignatureLocation, SigningSettings, sign,
    };
    use base64::Engine;
    const EXPIRES: Duration = Duration::from_secs(900);
    if credentials.access_key_id().is_empty() || credentials.secret_access_key().is_empty() {
        return Err(
            "MSK IAM: no AWS credentials (the function's role provides them in Lambda)".into(),
        );
    }
    if region.is_empty()
        || !region
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
        return Err(format!("MSK IAM: {region:?} is not an AWS region"));
    }
    let base = format!("https://kafka.{region}.amazonaws.com/");
    let action = "Action=kafka-cluster%3AConnect";
    let mut settings = SigningSettings::default();
    settings.signature_location = SignatureLocation::QueryParams;
    settings.expires_in = Some(EXPIRES);
    let identity = credentials.clone().into();
    let params = aws_sigv4::sign::v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name("kafka-cluster")
        .time(time)
        .settings(settings)
        .build()
        .map_err(|e| format!("MSK IAM: {e}"))?
        .into();
    let url = format!("{base}?{action}");
    let request = SignableRequest::new("GET", &url, std::iter::empty(), SignableBody::Bytes(&[]))
        .map_err(|e| format!("MSK IAM: {e}"))?;
    let (instructions, _) = sign(request, &params)
        .map_err(|e| format!("MSK IAM: {e}"))?
        .into_parts();
    let mut signed = url;
    // In the order AWS's signers write them (botocore's).
    let order = [
        "X-Amz-Algorithm",
        "X-Amz-Credential",
        "X-Amz-Date",
        "X-Amz-Expires",
        "X-Amz-SignedHeaders",
        "X-Amz-Security-Token",
        "X-Amz-Signature",
    ];
    let query = instructions.params();
    for name in order {
        if let Some((_, value)) = query.iter().find(|(n, _)| *n == name) {
            signed.push_str(&format!("&{name}={}", encode(value)));
        }
    }
    if let Some((name, _)) = query.iter().find(|(n, _)| !order.contains(n)) {
        return Err(format!("MSK IAM: unexpected signing parameter {name}"));
    }
    signed.push_str(&format!("&User-Agent={}", encode(user_agent)));
    let token = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(signed.as_bytes());
    let signed_at = time
        .duration_since(UNIX_EPOCH)
        .map_err(|_| "MSK IAM: the clock is before 1970".to_owned())?
        .as_secs();
    let expiry_ms = i64::try_from((signed_at + EXPIRES.as_secs()) * 1000).unwrap_or(i64::MAX);
    Ok((token, expiry_ms))
}

/// URI-encodes as SigV4 does: everything but `A-Za-z0-9-_.~`.
fn encode(value: &str) -> String {
    const SET: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'~');
    percent_encoding::utf8_percent_encode(value, SET).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn error(pairs: &[(&str, &str)]) -> String {
        KafkaSettings::from_vars(vars(pairs))
            .expect_err("invalid")
            .to_string()
    }

    #[test]
    fn nothing_set_is_plaintext_without_properties() {
        let settings = KafkaSettings::from_vars(vars(&[("PATH", "/bin")])).expect("valid");
        assert_eq!(settings, KafkaSettings::plaintext());
        assert!(settings.properties().is_empty());
    }

    #[test]
    fn scram_over_tls() {
        let settings = KafkaSettings::from_vars(vars(&[
            ("LAMBDA_STREAMS_KAFKA_SASL_MECHANISM", "scram-sha-512"),
            ("LAMBDA_STREAMS_KAFKA_SASL_USERNAME", "alice"),
            ("LAMBDA_STREAMS_KAFKA_SASL_PASSWORD", "s3cret"),
            ("LAMBDA_STREAMS_KAFKA_HEAP", "-Xmx1g"),
        ]))
        .expect("valid");
        assert_eq!(settings.get("security.protocol"), Some("SASL_SSL"));
        assert_eq!(settings.get("sasl.mechanism"), Some("SCRAM-SHA-512"));
        assert_eq!(settings.get("sasl.username"), Some("alice"));
        assert_eq!(settings.get("ssl.ca.location"), Some("probe"));
        assert_eq!(settings.msk_iam_region(), None);
        let debug = format!("{settings:?}");
        assert!(!debug.contains("s3cret"), "{debug}");
        assert!(debug.contains("<redacted>"), "{debug}");
    }

    #[test]
    fn a_password_is_taken_as_it_is() {
        let settings = KafkaSettings::from_vars(vars(&[
            ("LAMBDA_STREAMS_KAFKA_SECURITY_PROTOCOL", " SASL_PLAINTEXT "),
            ("LAMBDA_STREAMS_KAFKA_SASL_MECHANISM", "PLAIN"),
            ("LAMBDA_STREAMS_KAFKA_SASL_USERNAME", "bob "),
            ("LAMBDA_STREAMS_KAFKA_SASL_PASSWORD", " p w "),
        ]))
        .expect("valid");
        assert_eq!(settings.get("sasl.password"), Some(" p w "));
        assert_eq!(settings.get("sasl.username"), Some("bob"));
        assert_eq!(settings.get("security.protocol"), Some("SASL_PLAINTEXT"));
    }

    #[test]
    fn passthrough_properties_and_a_given_ca() {
        let settings = KafkaSettings::from_vars(vars(&[
            ("LAMBDA_STREAMS_KAFKA_SECURITY_PROTOCOL", "ssl"),
            ("LAMBDA_STREAMS_KAFKA_SSL_CA_LOCATION", "/tmp/ca.pem"),
            (
                "LAMBDA_STREAMS_KAFKA_SSL_ENDPOINT_IDENTIFICATION_ALGORITHM",
                "none",
            ),
            ("LAMBDA_STREAMS_KAFKA_LINGER_MS", "20"),
        ]))
        .expect("valid");
        assert_eq!(settings.get("security.protocol"), Some("SSL"));
        assert_eq!(settings.get("ssl.ca.location"), Some("/tmp/ca.pem"));
        assert_eq!(
            settings.get("ssl.endpoint.identification.algorithm"),
            Some("none")
        );
        assert_eq!(settings.get("linger.ms"), Some("20"));
    }

    #[test]
    fn invalid_settings_name_the_variable() {
        assert_eq!(
            error(&[("LAMBDA_STREAMS_KAFKA_SECURITY_PROTOCOL", "TLS")]),
            "configuration: LAMBDA_STREAMS_KAFKA_SECURITY_PROTOCOL: \"TLS\" is not PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"
        );
        assert!(
            error(&[("LAMBDA_STREAMS_KAFKA_SASL_MECHANISM", "GSSAPI")]).starts_with(
                "configuration: LAMBDA_STREAMS_KAFKA_SASL_MECHANISM: \"GSSAPI\" is not"
            )
        );
        assert_eq!(
            error(&[("LAMBDA_STREAMS_KAFKA_SASL_MECHANISM", "SCRAM-SHA-256")]),
            "configuration: LAMBDA_STREAMS_KAFKA_SASL_MECHANISM=SCRAM-SHA-256 needs LAMBDA_STREAMS_KAFKA_SASL_USERNAME and LAMBDA_STREAMS_KAFKA_SASL_PASSWORD"
        );
        assert_eq!(
            error(&[("LAMBDA_STREAMS_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")]),
            "configuration: LAMBDA_STREAMS_KAFKA_SECURITY_PROTOCOL=SASL_SSL needs LAMBDA_STREAMS_KAFKA_SASL_MECHANISM"
        );
        assert_eq!(
            error(&[
                ("LAMBDA_STREAMS_KAFKA_SECURITY_PROTOCOL", "SSL"),
                ("LAMBDA_STREAMS_KAFKA_SASL_MECHANISM", "AWS_MSK_IAM"),
            ]),
            "configuration: LAMBDA_STREAMS_KAFKA_SASL_MECHANISM=AWS_MSK_IAM needs LAMBDA_STREAMS_KAFKA_SECURITY_PROTOCOL=SASL_SSL or SASL_PLAINTEXT, not SSL"
        );
        assert_eq!(
            error(&[("LAMBDA_STREAMS_KAFKA_SASL_MECHANISM", "AWS_MSK_IAM")]),
            "configuration: LAMBDA_STREAMS_KAFKA_SASL_MECHANISM=AWS_MSK_IAM needs AWS_REGION (the cluster's region; Lambda sets it)"
        );
        assert_eq!(
            error(&[("LAMBDA_STREAMS_KAFKA_BOOTSTRAP_SERVERS", "b:9092")]),
            "configuration: LAMBDA_STREAMS_KAFKA_BOOTSTRAP_SERVERS: set the output brokers with LAMBDA_STREAMS_BOOTSTRAP_SERVERS"
        );
        let unknown = error(&[("LAMBDA_STREAMS_KAFKA_SASL_PASWORD", "x")]);
        assert!(
            unknown.starts_with("configuration: LAMBDA_STREAMS_KAFKA_SASL_PASWORD: librdkafka does not accept sasl.pasword=x:"),
            "{unknown}"
        );
        let bad_value = error(&[("LAMBDA_STREAMS_KAFKA_LINGER_MS", "soon")]);
        assert!(
            bad_value.starts_with("configuration: LAMBDA_STREAMS_KAFKA_LINGER_MS: librdkafka does not accept linger.ms=soon:"),
            "{bad_value}"
        );
    }

    #[test]
    fn msk_iam_selects_oauthbearer_over_tls_in_the_lambda_region() {
        let settings = KafkaSettings::from_vars(vars(&[
            ("LAMBDA_STREAMS_KAFKA_SASL_MECHANISM", "AWS_MSK_IAM"),
            ("AWS_REGION", "eu-west-3"),
        ]))
        .expect("valid");
        assert_eq!(settings.get("sasl.mechanism"), Some("OAUTHBEARER"));
        assert_eq!(settings.get("security.protocol"), Some("SASL_SSL"));
        assert_eq!(settings.msk_iam_region(), Some("eu-west-3"));
    }

    /// 2024-01-02T03:04:05Z.
    fn fixed_time() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_704_164_645)
    }

    // The expected tokens were computed by framework/tests/reference/msk_iam_token.py with
    // botocore 1.40.76's SigV4QueryAuth, as aws-msk-iam-sasl-signer-python builds them.
    #[test]
    fn msk_iam_token_equals_the_botocore_reference() {
        let credentials = Credentials::new(
            "AKIDEXAMPLE",
            "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            None,
            None,
            "test",
        );
        let (token, expiry) = msk_iam_token(
            "us-east-1",
            &credentials,
            fixed_time(),
            "lambda-streams/test",
        )
        .expect("token");
        assert_eq!(
            token,
            "aHR0cHM6Ly9rYWZrYS51cy1lYXN0LTEuYW1hem9uYXdzLmNvbS8_QWN0aW9uPWthZmthLWNsdXN0ZXIlM0FDb25uZWN0JlgtQW16LUFsZ29yaXRobT1BV1M0LUhNQUMtU0hBMjU2JlgtQW16LUNyZWRlbnRpYWw9QUtJREVYQU1QTEUlMkYyMDI0MDEwMiUyRnVzLWVhc3QtMSUyRmthZmthLWNsdXN0ZXIlMkZhd3M0X3JlcXVlc3QmWC1BbXotRGF0ZT0yMDI0MDEwMlQwMzA0MDVaJlgtQW16LUV4cGlyZXM9OTAwJlgtQW16LVNpZ25lZEhlYWRlcnM9aG9zdCZYLUFtei1TaWduYXR1cmU9ZDk3NmE2MzMzNGIyZjYwZTY4MmJhNjUwMzJjZDllOTg1Y2M1MjVmOWJlODA5ZGJhNDk1OTg0Zjg2NjkxMDEyNCZVc2VyLUFnZW50PWxhbWJkYS1zdHJlYW1zJTJGdGVzdA"
        );
        assert_eq!(expiry, (1_704_164_645 + 900) * 1000);
        use base64::Engine;
        let url = String::from_utf8(
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(&token)
                .expect("base64url"),
        )
        .expect("utf-8");
        assert!(url.starts_with(
            "https://kafka.us-east-1.amazonaws.com/?Action=kafka-cluster%3AConnect&X-Amz-Algorithm=AWS4-HMAC-SHA256&"
        ));
        assert!(
            !token.contains(['+', '/', '=']),
            "base64url without padding"
        );
    }

    #[test]
    fn msk_iam_token_with_a_session_token_equals_the_botocore_reference() {
        let credentials = Credentials::new(
            "ASIAEXAMPLE",
            "secret/with+slash=",
            Some("IQoJb3JpZ2luX2VjEXAMPLE/+=token".to_owned()),
            None,
            "test",
        );
        let (token, _) = msk_iam_token(
            "eu-west-3",
            &credentials,
            fixed_time(),
            "lambda-streams/test",
        )
        .expect("token");
        assert_eq!(
            token,
            "aHR0cHM6Ly9rYWZrYS5ldS13ZXN0LTMuYW1hem9uYXdzLmNvbS8_QWN0aW9uPWthZmthLWNsdXN0ZXIlM0FDb25uZWN0JlgtQW16LUFsZ29yaXRobT1BV1M0LUhNQUMtU0hBMjU2JlgtQW16LUNyZWRlbnRpYWw9QVNJQUVYQU1QTEUlMkYyMDI0MDEwMiUyRmV1LXdlc3QtMyUyRmthZmthLWNsdXN0ZXIlMkZhd3M0X3JlcXVlc3QmWC1BbXotRGF0ZT0yMDI0MDEwMlQwMzA0MDVaJlgtQW16LUV4cGlyZXM9OTAwJlgtQW16LVNpZ25lZEhlYWRlcnM9aG9zdCZYLUFtei1TZWN1cml0eS1Ub2tlbj1JUW9KYjNKcFoybHVYMlZqRVhBTVBMRSUyRiUyQiUzRHRva2VuJlgtQW16LVNpZ25hdHVyZT0zNDE4NWI3MDgyZTM4NjhlN2ZiYTFkODFhN2MzOGQ4YjJlYmJkZmE5ODQ4Y2JmOThmYWI0YjZiOTBlYmRmMGI5JlVzZXItQWdlbnQ9bGFtYmRhLXN0cmVhbXMlMkZ0ZXN0"
        );
    }

    #[test]
    fn msk_iam_token_needs_credentials_and_a_region() {
        let none = Credentials::new("", "", None, None, "none");
        assert!(msk_iam_token("us-east-1", &none, fixed_time(), "x").is_err());
        let some = Credentials::new("AKID", "SECRET", None, None, "test");
        assert!(msk_iam_token("us-east-1/evil", &some, fixed_time(), "x").is_err());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_signer_fetches_credentials_from_librdkafkas_thread() {
        let provider = SharedCredentialsProvider::new(Credentials::new(
            "AKIDEXAMPLE",
            "SECRET",
            None,
            None,
            "test",
        ));
        let signer = MskIamSigner::new("us-east-1", provider, tokio::runtime::Handle::current());
        // librdkafka calls generate_oauth_token from a thread of its own.
        let token = std::thread::spawn(move || signer.token())
            .join()
            .expect("joined")
            .expect("token");
        assert_eq!(token.principal_name, "AKIDEXAMPLE");
        let now_ms = i64::try_from(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .expect("clock")
                .as_millis(),
        )
        .expect("ms");
        assert!((token.lifetime_ms - now_ms - 900_000).abs() < 5_000);
    }
}
