//! The lean DynamoDB client (`LeanClient`, its own HTTP/1.1 on rustls) over HTTPS, as it
//! reaches DynamoDB in Lambda: a TLS proxy in this test (the broker's certificate for
//! 127.0.0.1, signed by the local CA of `scripts/services`) terminates TLS and forwards to
//! the dynoxide emulator, and the client trusts the local CA through the system roots
//! (`SSL_CERT_FILE`). Batches of a count written through it must leave the counts of the
//! input log (read back through the SDK, over plain HTTP), on kept-alive TLS connections;
//! with the compiled roots the handshake fails on the certificate, naming the endpoint.
//! The store's AWS SDK client (the framework's `aws::https_client`, the same HTTP/1.1 on
//! rustls) goes through the proxy too: it creates the table and serves the store's reads.
//!
//! The test runs in a child process of this binary, with `SSL_CERT_FILE` set for it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use aws_credential_types::provider::SharedCredentialsProvider;
use lambda_streams::aws::{TlsRoots, static_credentials};
use lambda_streams::dsl::Grouped;
use lambda_streams::serdes::{DecimalI64, Unit, Utf8};
use lambda_streams::sink::MemorySink;
use lambda_streams::state::dynamodb::{DynamoStore, LeanClient, RetrySettings, create_table};
use lambda_streams::{Guarantee, StreamsBuilder, Topology};
use lambda_streams_e2e::*;

const TOPIC: &str = "lean-tls-events";
const BASE_TIME: i64 = 1_764_460_800_000;

fn value(p: usize, o: usize) -> String {
    format!("k{}", (p * 5 + o * 3) % 7)
}

const SCHEDULE: &[&[(usize, usize, usize)]] = &[
    &[(0, 0, 30), (1, 0, 20)],
    &[(0, 30, 60), (1, 20, 45)],
    // Delivered again: refused conditional writes, over the same connections.
    &[(0, 30, 60), (1, 20, 45)],
];

/// The counts of the log, by brute force.
fn truth() -> BTreeMap<String, i64> {
    let mut counts = BTreeMap::new();
    for (p, hi) in [(0, 60), (1, 45)] {
        for o in 0..hi {
            *counts.entry(value(p, o)).or_insert(0) += 1;
        }
    }
    counts
}

fn topology() -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream(TOPIC, Unit, Utf8)
        .group_by(|_, v: &String| v.clone(), Grouped::direct(Utf8))
        .count("counts")
        .to_stream()
        .to("lean-tls-counts", Utf8, DecimalI64);
    builder.build()
}

/// `openssl` run on the files of the local CA's directory; its standard output.
fn openssl(args: &[&str]) -> Vec<u8> {
    let out = Command::new("openssl")
        .args(args)
        .output()
        .expect("openssl runs");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// A TLS server on 127.0.0.1 with the broker's certificate, forwarding every connection to
/// the emulator; its address and the number of TLS connections it accepted.
async fn tls_proxy() -> (String, Arc<AtomicUsize>) {
    let ca = ssl_ca_location();
    let dir = std::path::Path::new(&ca)
        .parent()
        .expect("the CA's directory");
    let p12 = dir.join("broker.p12").display().to_string();
    let pass = format!(
        "pass:{}",
        std::env::var("KAFKA_TLS_PASSWORD").unwrap_or_else(|_| "lambda-streams".into())
    );
    let key_pem = openssl(&[
        "pkcs12", "-in", &p12, "-nocerts", "-nodes", "-passin", &pass,
    ]);
    let key_path = std::env::temp_dir().join(format!("{}.key.pem", unique("lean-tls")));
    std::fs::write(&key_path, key_pem).unwrap();
    let key_der = openssl(&[
        "pkcs8",
        "-topk8",
        "-nocrypt",
        "-in",
        &key_path.display().to_string(),
        "-outform",
        "DER",
    ]);
    std::fs::remove_file(&key_path).ok();
    let cert_der = openssl(&[
        "x509",
        "-in",
        &dir.join("broker.pem").display().to_string(),
        "-outform",
        "DER",
    ]);
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![rustls::pki_types::CertificateDer::from(cert_der)],
        rustls::pki_types::PrivateKeyDer::Pkcs8(key_der.into()),
    )
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let upstream = dynamo_endpoint()
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    tokio::spawn(async move {
        loop {
            let Ok((socket, _)) = listener.accept().await else {
                return;
            };
            let (acceptor, upstream, count) =
                (acceptor.clone(), upstream.clone(), Arc::clone(&count));
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(socket).await else {
                    return;
                };
                count.fetch_add(1, Ordering::SeqCst);
                let mut plain = tokio::net::TcpStream::connect(&upstream).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });
    (address, accepted)
}

fn lean(endpoint: &str, roots: TlsRoots) -> LeanClient {
    let credentials = SharedCredentialsProvider::new(static_credentials(
        "lambda-streams-local",
        "lambda-streams-local",
        "lean-tls-test",
    ));
    LeanClient::new(
        endpoint,
        "us-east-1",
        credentials,
        roots,
        RetrySettings::default(),
    )
    .unwrap()
}

const CHILD: &str = "lean_tls_child";

/// Runs [`lean_tls_child`] in a process of its own, with `SSL_CERT_FILE` naming the local
/// CA (the tests of a binary share one environment).
#[test]
fn the_lean_client_writes_over_tls_and_refuses_an_untrusted_certificate() {
    require_services();
    run_child_test(CHILD, &[("SSL_CERT_FILE", ssl_ca_location())]);
}

#[test]
#[ignore = "run by the_lean_client_writes_over_tls_and_refuses_an_untrusted_certificate, in a process of its own"]
fn lean_tls_child() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (address, accepted) = tls_proxy().await;
        let endpoint = format!("https://{address}");
        // The SDK over HTTPS, trusting the system roots (the local CA).
        let client = lambda_streams::state::dynamodb::emulator_client(&endpoint);
        let table = unique("lean-tls");
        create_table(&client, &table).await.unwrap();
        let store = DynamoStore::new(client.clone(), &table, Guarantee::ExactlyOnce)
            .with_lean_client(lean(&endpoint, TlsRoots::System));
        assert!(store.uses_lean_client());
        let topology = topology();
        let mut conditional_failures = 0;
        for batch in SCHEDULE {
            let event = log_event(TOPIC, BASE_TIME, batch, |p, o| value(p, o).into_bytes());
            let report = topology
                .process(&event, &store, &MemorySink::new())
                .await
                .expect("the batch, over TLS");
            conditional_failures += report.state.conditional_failures;
        }
        assert!(conditional_failures > 0, "the redelivery was refused");
        assert_eq!(table_counts(&table, "counts").await, truth());
        let connections = accepted.load(Ordering::SeqCst);
        assert!(connections > 0, "the writes went through the TLS proxy");
        let keys = truth().len();
        println!("{connections} TLS connections");
        assert!(
            connections < SCHEDULE.len() * keys,
            "connections kept alive across requests: {connections} TLS connections"
        );

        // The compiled roots do not hold the local CA: the handshake fails, and the batch
        // fails with an error naming the store, not a panic.
        let untrusted = DynamoStore::new(client, &table, Guarantee::ExactlyOnce)
            .with_lean_client(lean(&endpoint, TlsRoots::Compiled));
        let event = log_event(TOPIC, BASE_TIME, &[(0, 60, 61)], |p, o| {
            value(p, o).into_bytes()
        });
        let error = topology
            .process(&event, &untrusted, &MemorySink::new())
            .await
            .expect_err("an untrusted certificate")
            .to_string();
        assert!(
            error.contains("counts") && error.to_lowercase().contains("certificate"),
            "{error}"
        );
    });
}
