//! AWS plumbing, in one place below every AWS client of the framework (the DynamoDB
//! store, the MSK IAM signer, the Lambda adapter): the root certificates the SDK trusts
//! ([`TlsRoots`]), the SDK's HTTPS client ([`https_client`]) and credentials (the default
//! chain, [`default_credentials`]; static ones for emulators, [`static_credentials`]).

use aws_credential_types::Credentials;
use aws_credential_types::provider::SharedCredentialsProvider;

mod sdk_http;

/// An invalid AWS setting (a variable's value); converts into
/// [`StreamError::Config`](crate::error::StreamError::Config).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("configuration: {0}")]
pub struct AwsConfigError(pub String);

/// The root certificates the AWS SDK clients trust (`LAMBDA_STREAMS_AWS_TLS_ROOTS`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TlsRoots {
    /// Amazon Trust Services' roots (Amazon Root CA 1 to 4, Starfield Services Root CA G2),
    /// compiled into the binary: every AWS endpoint's certificate chains to them. Nothing
    /// is read at start-up, and 5 roots are parsed instead of ~120 (parsed as the client
    /// is built, before the first event; parsing all of Mozilla's was most of the
    /// start-up's work, BENCHMARKS.md section 4). An endpoint with
    /// another CA (`AWS_ENDPOINT_URL_DYNAMODB` pointing elsewhere over HTTPS) needs
    /// [`TlsRoots::Compiled`] or [`TlsRoots::System`].
    #[default]
    Aws,
    /// Mozilla's roots compiled into the binary (Amazon's included): nothing is read at
    /// start-up ([`https_client`]).
    Compiled,
    /// The system's store (`SSL_CERT_FILE`, `SSL_CERT_DIR`, else the platform's bundle and
    /// directory, as `rustls-native-certs` finds them), read and parsed as the client is
    /// built; none found fails each HTTPS request, naming `LAMBDA_STREAMS_AWS_TLS_ROOTS`.
    System,
}

impl TlsRoots {
    /// Parses a value of `LAMBDA_STREAMS_AWS_TLS_ROOTS` (`None` or blank: the default,
    /// [`TlsRoots::Aws`]); an invalid value is an error naming the variable.
    pub fn parse(value: Option<&str>) -> Result<Self, AwsConfigError> {
        match value.map(str::trim) {
            None | Some("" | "aws") => Ok(TlsRoots::Aws),
            Some("compiled") => Ok(TlsRoots::Compiled),
            Some("system") => Ok(TlsRoots::System),
            Some(other) => Err(AwsConfigError(format!(
                "LAMBDA_STREAMS_AWS_TLS_ROOTS: {other:?} is not aws, compiled or system"
            ))),
        }
    }

    /// Reads `LAMBDA_STREAMS_AWS_TLS_ROOTS` from the environment.
    pub fn from_env() -> Result<Self, AwsConfigError> {
        Self::parse(
            std::env::var("LAMBDA_STREAMS_AWS_TLS_ROOTS")
                .ok()
                .as_deref(),
        )
    }
}

/// The SDK's default credentials chain (in Lambda: the function's role).
pub async fn default_credentials() -> Result<SharedCredentialsProvider, String> {
    let roots = TlsRoots::from_env().map_err(|e| e.to_string())?;
    let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .http_client(https_client(roots))
        .load()
        .await;
    sdk.credentials_provider()
        .ok_or_else(|| "MSK IAM: the AWS SDK found no credentials provider".to_owned())
}

/// Static credentials (for a local emulator: dummy ones, so that no client consults the
/// default chain, which would query the instance metadata service).
pub fn static_credentials(
    access_key: &str,
    secret_key: &str,
    provider: &'static str,
) -> Credentials {
    Credentials::new(access_key, secret_key, None, None, provider)
}

/// The HTTP client of the AWS SDK clients (DynamoDB, and the credentials chain of MSK IAM):
/// the framework's own HTTP/1.1 (the one of the DynamoDB store's lean request path:
/// kept-alive connections, a request written in one write) on rustls on *ring*, behind
/// the SDK's connector traits. The SDK's default client (hyper with HTTP/2, rustls on
/// aws-lc) is not linked: aws-lc and the `h2` crate make the zip larger (BENCHMARKS.md
/// section 4 and "Issue 16 goal 3"), no AWS service the framework calls needs HTTP/2, and
/// the binary links a second TLS stack, OpenSSL, for librdkafka anyway. HTTPS trusts
/// `roots`:
/// [`TlsRoots::Aws`], Amazon Trust Services' roots compiled into the binary (the default);
/// [`TlsRoots::Compiled`], all of the root store compiled into the binary (Mozilla's, from
/// `webpki-root-certs`; Amazon's roots included), nothing read at start-up either; or
/// [`TlsRoots::System`], the system's (read and parsed as the client is built: the bundle,
/// and every file of the directory where `SSL_CERT_DIR` is set; BENCHMARKS.md section 4).
///
/// The SDK's connect and read timeouts apply (the read timeout to the whole exchange,
/// connecting included, as the SDK's own client times it), and its retries classify the
/// failures as they would the SDK client's: a timeout, an I/O failure (connecting,
/// sending, a connection closed before the response ended: transient), or a response that
/// is not HTTP/1.1 (not retried). Request bodies must be in memory (every request of
/// DynamoDB, STS and the credential providers is): a streaming body, or a `HEAD` request,
/// fails as the caller's error, without a panic.
///
/// **No proxy**: unlike the SDK's default client, this one does not read `HTTPS_PROXY`,
/// `HTTP_PROXY` or `ALL_PROXY` (Lambda functions reach AWS endpoints directly); when one of
/// them is set, building the client logs a warning naming it, and requests go direct.
///
/// The SDK crates are built without their `default-https-client` feature, so a client
/// without this one has no HTTP client: every SDK client of the framework is given it
/// ([`crate::lambda::run`], [`crate::state::dynamodb::emulator_client`]).
///
/// [`TlsRoots::Aws`]: TlsRoots::Aws
/// [`TlsRoots::Compiled`]: TlsRoots::Compiled
/// [`TlsRoots::System`]: TlsRoots::System
pub fn https_client(roots: TlsRoots) -> aws_sdk_dynamodb::config::SharedHttpClient {
    let proxies = [
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
        "ALL_PROXY",
        "all_proxy",
    ];
    for name in proxies {
        if std::env::var_os(name).is_some_and(|v| !v.is_empty()) {
            tracing::warn!(
                "{name} is set, but the AWS SDK's HTTP client of the framework does not use \
                 proxies: its requests go to the endpoints directly"
            );
        }
    }
    aws_sdk_dynamodb::config::SharedHttpClient::new(sdk_http::SdkHttpClient::new(roots))
}

/// A rustls client configuration (on *ring*, TLS 1.2 and 1.3) trusting `roots`, for the
/// framework's own HTTPS clients (the DynamoDB store's lean request path): the same roots
/// as [`https_client`] gives the SDK.
pub(crate) fn rustls_client_config(roots: TlsRoots) -> Result<rustls::ClientConfig, String> {
    let mut store = rustls::RootCertStore::empty();
    match roots {
        TlsRoots::Aws | TlsRoots::Compiled => {
            let amazon_only = roots == TlsRoots::Aws;
            let certs = webpki_root_certs::TLS_SERVER_ROOT_CERTS
                .iter()
                .filter(|cert| !amazon_only || is_amazon_trust_services_root(cert.as_ref()));
            for cert in certs {
                store
                    .add(cert.clone())
                    .map_err(|e| format!("a compiled-in root certificate: {e}"))?;
            }
        }
        TlsRoots::System => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = store.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err(format!(
                    "LAMBDA_STREAMS_AWS_TLS_ROOTS=system: no root certificate found ({} errors)",
                    found.errors.len()
                ));
            }
        }
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS settings: {e}"))?
        .with_root_certificates(store)
        .with_no_client_auth())
}

/// The common names of Amazon Trust Services' roots ([`TlsRoots::Aws`]):
/// AWS endpoints' certificates chain to Amazon Root CA 1 to 4, which Starfield Services
/// Root CA G2 cross-signs (<https://www.amazontrust.com/repository/>).
const AMAZON_TRUST_SERVICES_ROOTS: [&[u8]; 5] = [
    b"Amazon Root CA 1",
    b"Amazon Root CA 2",
    b"Amazon Root CA 3",
    b"Amazon Root CA 4",
    b"Starfield Services Root Certificate Authority - G2",
];

/// Whether a root certificate (DER) is one of Amazon Trust Services': its subject's common
/// name (a DER UTF8String/PrintableString, so the name preceded by its length) is one of
/// [`AMAZON_TRUST_SERVICES_ROOTS`]. Roots are self-signed: the issuer holds the same name.
fn is_amazon_trust_services_root(der: &[u8]) -> bool {
    AMAZON_TRUST_SERVICES_ROOTS.iter().any(|name| {
        let mut tagged = Vec::with_capacity(name.len() + 1);
        tagged.push(name.len() as u8);
        tagged.extend_from_slice(name);
        memchr::memmem::find(der, &tagged).is_some()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_roots_parse_and_errors_name_the_variable() {
        assert_eq!(TlsRoots::parse(None).ok(), Some(TlsRoots::Aws));
        assert_eq!(TlsRoots::parse(Some(" ")).ok(), Some(TlsRoots::Aws));
        assert_eq!(TlsRoots::parse(Some("aws")).ok(), Some(TlsRoots::Aws));
        assert_eq!(
            TlsRoots::parse(Some("compiled")).ok(),
            Some(TlsRoots::Compiled)
        );
        assert_eq!(TlsRoots::parse(Some("system")).ok(), Some(TlsRoots::System));
        let error = TlsRoots::parse(Some("webpki")).err().map(|e| e.to_string());
        assert!(error.is_some_and(|e| e.contains("LAMBDA_STREAMS_AWS_TLS_ROOTS")));
    }

    #[test]
    fn compiled_roots_hold_amazons() {
        // DynamoDB's endpoints chain to Amazon Root CA 1 (and Starfield for older ones).
        let roots = webpki_root_certs::TLS_SERVER_ROOT_CERTS;
        let names = |name: &[u8]| {
            roots
                .iter()
                .any(|r| r.windows(name.len()).any(|w| w == name))
        };
        assert!(names(b"Amazon Root CA 1"));
        assert!(names(b"Starfield Services Root Certificate Authority - G2"));
        for roots in [TlsRoots::Aws, TlsRoots::Compiled] {
            assert!(rustls_client_config(roots).is_ok(), "{roots:?}");
        }
    }

    #[test]
    fn the_aws_roots_are_amazon_trust_services_five() {
        let amazon: Vec<_> = webpki_root_certs::TLS_SERVER_ROOT_CERTS
            .iter()
            .filter(|r| is_amazon_trust_services_root(r.as_ref()))
            .collect();
        assert_eq!(amazon.len(), 5);
        // Each name matches exactly one root (not, e.g., "Starfield Root ... G2").
        for name in AMAZON_TRUST_SERVICES_ROOTS {
            let n = amazon
                .iter()
                .filter(|r| r.windows(name.len()).any(|w| w == name))
                .count();
            assert_eq!(n, 1, "{}", String::from_utf8_lossy(name));
        }
    }
}
