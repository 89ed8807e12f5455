//! MSK IAM authentication: the SASL/OAUTHBEARER token signed with SigV4, and the signer
//! that makes tokens with a credentials provider.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_credential_types::Credentials;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use rdkafka::client::OAuthToken;

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
