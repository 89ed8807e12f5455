//! AWS plumbing, in one place below every AWS client of the framework (the DynamoDB
//! store, the MSK IAM signer, the Lambda adapter): the root certificates the SDK trusts
//! ([`TlsRoots`]), the SDK's HTTPS client ([`https_client`]) and credentials (the default
//! chain, [`default_credentials`]; static ones for emulators, [`static_credentials`]).

use aws_credential_types::Credentials;
use aws_credential_types::provider::SharedCredentialsProvider;
use base64::Engine;

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
    /// is read at start-up, and 5 roots are parsed instead of ~120 (the SDK's trust store
    /// takes PEM, which rustls decodes with a constant-time base64 and parses when the
    /// client's connector is built, before the first event; parsing all of Mozilla's was
    /// most of the start-up's work, BENCHMARKS.md section 4). An endpoint with
    /// another CA (`AWS_ENDPOINT_URL_DYNAMODB` pointing elsewhere over HTTPS) needs
    /// [`TlsRoots::Compiled`] or [`TlsRoots::System`].
    #[default]
    Aws,
    /// Mozilla's roots compiled into the binary (Amazon's included): nothing is read at
    /// start-up ([`https_client`]).
    Compiled,
    /// The system's store (`SSL_CERT_FILE`, `SSL_CERT_DIR`, else the platform's bundle and
    /// directory, as `rustls-native-certs` finds them), read and parsed when the client's
    /// first connector is built.
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

/// The HTTPS client of the AWS SDK clients (DynamoDB, and the credentials chain of MSK IAM):
/// the SDK's default client (hyper 1, rustls, proxy settings from the environment) with
/// rustls on *ring* rather than aws-lc (the SDK's default; aws-lc makes the zip larger,
/// BENCHMARKS.md section 4, and the binary links a second TLS stack, OpenSSL, for
/// librdkafka anyway), trusting `roots`:
/// [`TlsRoots::Aws`], Amazon Trust Services' roots compiled into the binary (the default);
/// [`TlsRoots::Compiled`], all of the root store compiled into the binary (Mozilla's, from
/// `webpki-root-certs`; Amazon's roots included), nothing read at start-up either; or
/// [`TlsRoots::System`], the system's (read and parsed when the first connector is built:
/// the bundle, and every file of the directory where `SSL_CERT_DIR` is set; BENCHMARKS.md
/// section 4). The SDK crates are built without their `default-https-client` feature, so a
/// client without this one has no HTTP client: every SDK client of the framework is given
/// it ([`crate::lambda::run`], [`crate::state::dynamodb::emulator_client`]).
///
/// [`TlsRoots::Aws`]: TlsRoots::Aws
/// [`TlsRoots::Compiled`]: TlsRoots::Compiled
/// [`TlsRoots::System`]: TlsRoots::System
pub fn https_client(roots: TlsRoots) -> aws_sdk_dynamodb::config::SharedHttpClient {
    use aws_smithy_http_client::tls::{self, TlsContext, TrustStore};
    use aws_smithy_http_client::{Builder, ConnectorBuilder, proxy::ProxyConfig};
    let trust_store = match roots {
        TlsRoots::Aws => TrustStore::empty().with_pem_certificate(compiled_roots_pem(true)),
        TlsRoots::Compiled => TrustStore::empty().with_pem_certificate(compiled_roots_pem(false)),
        TlsRoots::System => TrustStore::empty().with_native_roots(true),
    };
    let context = TlsContext::builder()
        .with_trust_store(trust_store)
        .build()
        .unwrap_or_default();
    Builder::new().build_with_connector_fn(move |settings, components| {
        // As the SDK's default client (aws-smithy-runtime's `default_https_client`), with
        // the crypto provider and trust store above.
        let mut builder = ConnectorBuilder::default()
            .tls_provider(tls::Provider::Rustls(
                tls::rustls_provider::CryptoMode::Ring,
            ))
            .tls_context(context.clone());
        builder.set_connector_settings(settings.cloned());
        if let Some(components) = components {
            builder.set_sleep_impl(components.sleep_impl());
        }
        builder.set_proxy_config(Some(ProxyConfig::from_env()));
        builder.build()
    })
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

/// The compiled-in root certificates, PEM-encoded (the form the SDK's trust store takes):
/// Amazon Trust Services' only with `amazon_only`, else all of them.
fn compiled_roots_pem(amazon_only: bool) -> Vec<u8> {
    use base64::engine::general_purpose::STANDARD;
    let roots = webpki_root_certs::TLS_SERVER_ROOT_CERTS
        .iter()
        .filter(|cert| !amazon_only || is_amazon_trust_services_root(cert.as_ref()));
    let mut pem = Vec::with_capacity(webpki_root_certs::TLS_SERVER_ROOT_CERTS.len() * 2048);
    for cert in roots {
        pem.extend_from_slice(b"-----BEGIN CERTIFICATE-----\n");
        let encoded = STANDARD.encode(cert.as_ref());
        for line in encoded.as_bytes().chunks(64) {
            pem.extend_from_slice(line);
            pem.push(b'\n');
        }
        pem.extend_from_slice(b"-----END CERTIFICATE-----\n");
    }
    pem
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
    fn compiled_roots_are_pem_of_every_root_amazons_included() {
        use base64::engine::general_purpose::STANDARD;
        let pem = String::from_utf8(compiled_roots_pem(false)).expect("PEM is ASCII");
        let blocks: Vec<Vec<u8>> = pem
            .split("-----BEGIN CERTIFICATE-----\n")
            .skip(1)
            .map(|block| {
                let body = block
                    .split("-----END CERTIFICATE-----")
                    .next()
                    .expect("an end marker");
                STANDARD
                    .decode(body.replace('\n', ""))
                    .expect("base64 body")
            })
            .collect();
        let roots = webpki_root_certs::TLS_SERVER_ROOT_CERTS;
        assert_eq!(blocks.len(), roots.len());
        assert!(
            blocks
                .iter()
                .zip(roots)
                .all(|(b, r)| b.as_slice() == r.as_ref())
        );
        // DynamoDB's endpoints chain to Amazon Root CA 1 (and Starfield for older ones).
        let names = |name: &[u8]| {
            roots
                .iter()
                .any(|r| r.windows(name.len()).any(|w| w == name))
        };
        assert!(names(b"Amazon Root CA 1"));
        assert!(names(b"Starfield Services Root Certificate Authority - G2"));
    }

    #[test]
    fn the_aws_roots_are_amazon_trust_services_five() {
        let pem = String::from_utf8(compiled_roots_pem(true)).expect("PEM is ASCII");
        assert_eq!(pem.matches("-----BEGIN CERTIFICATE-----").count(), 5);
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
