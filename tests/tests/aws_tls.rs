//! The AWS SDK's HTTPS client of the framework (`state::dynamodb::https_client`: rustls on
//! *ring*, the roots of `LAMBDA_STREAMS_AWS_TLS_ROOTS`) against a real TLS server: the
//! broker's SSL listener, whose certificate (for 127.0.0.1) a local CA signed. It speaks
//! Kafka, not HTTP, so no request succeeds; what the errors show is how far TLS got:
//!
//! - with the compiled roots (Amazon Trust Services' or all of Mozilla's), the handshake
//!   fails on the certificate: the local CA is not among them;
//! - with the system roots and `SSL_CERT_FILE` naming the local CA (in a process of its own,
//!   this test binary started again for one ignored test, since the tests of a binary share
//!   one environment), the handshake succeeds (key exchange, AEAD and the certificate's
//!   signature checked by *ring*) and the request fails after it.
//!
//! DynamoDB itself is reached over plain HTTP everywhere else in the tests (the emulator).

use std::time::Duration;

use aws_sdk_dynamodb::error::DisplayErrorContext;
use lambda_streams::lambda::TlsRoots;
use lambda_streams_e2e::*;

const SYSTEM_ROOTS_CHILD: &str = "system_roots_child";

/// One `ListTables` over HTTPS to the broker's SSL listener; the error's whole chain.
async fn list_tables_error(roots: TlsRoots) -> String {
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
        .endpoint_url(format!("https://{}", ssl_bootstrap()))
        .region(aws_sdk_dynamodb::config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_dynamodb::config::Credentials::new(
            "test", "test", None, None, "test",
        ))
        .retry_config(aws_sdk_dynamodb::config::retry::RetryConfig::disabled())
        .timeout_config(
            aws_sdk_dynamodb::config::timeout::TimeoutConfig::builder()
                .operation_timeout(Duration::from_secs(10))
                .build(),
        )
        .http_client(lambda_streams::state::dynamodb::https_client(roots))
        .build();
    let client = aws_sdk_dynamodb::Client::from_conf(config);
    match client.list_tables().send().await {
        Ok(_) => panic!("a Kafka listener answered a DynamoDB request"),
        Err(e) => format!("{}", DisplayErrorContext(&e)),
    }
}

#[tokio::test]
async fn compiled_roots_reject_a_certificate_of_another_ca() {
    require_secured_listeners();
    for roots in [TlsRoots::Aws, TlsRoots::Compiled] {
        let error = list_tables_error(roots).await;
        assert!(
            error.contains("UnknownIssuer"),
            "{roots:?}: expected a certificate error, got: {error}"
        );
    }
}

#[test]
fn system_roots_trust_ssl_cert_file() {
    require_secured_listeners();
    run_child_test(SYSTEM_ROOTS_CHILD, &[("SSL_CERT_FILE", ssl_ca_location())]);
}

/// Run by [`system_roots_trust_ssl_cert_file`] with `SSL_CERT_FILE` set.
#[tokio::test]
#[ignore = "run by system_roots_trust_ssl_cert_file, in a process of its own"]
async fn system_roots_child() {
    let error = list_tables_error(TlsRoots::System).await;
    assert!(
        !error.contains("UnknownIssuer") && !error.to_lowercase().contains("certificate"),
        "the handshake should succeed with the local CA trusted, got: {error}"
    );
    println!("after the handshake: {error}");
}
