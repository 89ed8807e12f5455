//! The Kafka sink over TLS and SASL/SCRAM, configured by `LAMBDA_STREAMS_KAFKA_*` variables,
//! on the real broker's secured listeners (`scripts/services up` starts them: SASL_PLAINTEXT
//! with SCRAM, SSL with a certificate of a local CA, and SASL_SSL).
//!
//! The handler's settings are parsed by the same code as in Lambda
//! (`KafkaSettings::from_vars`: `from_env` on given pairs, since tests share one process
//! environment); one test runs the real `wordcount` binary under `cargo lambda watch` with
//! the variables in its environment, driven by the local runner over HTTP. Output is read
//! back from the broker and compared with counts computed here; state is exactly once.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lambda_streams::event::{
    EventSource, KafkaEvent, PartitionRecords, Record, TimestampType, TopicPartition,
};
use lambda_streams::kafka::KafkaSettings;
use lambda_streams::lambda::Handler;
use lambda_streams::state::Store;
use lambda_streams::state::dynamodb::{DynamoStore, create_table};
use lambda_streams::{Guarantee, StreamError};
use lambda_streams_e2e::*;
use local_runner::{Http, Runner, RunnerConfig, Transport, admin};

const INPUT: &str = "secure-lines";
/// The port of this file's `cargo lambda watch` (others use other ports).
const PORT: u16 = 9331;

fn settings(pairs: &[(&str, &str)]) -> KafkaSettings {
    KafkaSettings::from_vars(
        pairs
            .iter()
            .map(|(k, v)| (format!("LAMBDA_STREAMS_KAFKA_{k}"), v.to_string())),
    )
    .expect("valid settings")
}

fn scram(mechanism: &str, protocol: &str, password: &str) -> KafkaSettings {
    let (user, _) = scram_credentials();
    let ca = ssl_ca_location();
    let mut pairs = vec![
        ("SECURITY_PROTOCOL", protocol),
        ("SASL_MECHANISM", mechanism),
        ("SASL_USERNAME", user.as_str()),
        ("SASL_PASSWORD", password),
    ];
    if protocol == "SASL_SSL" {
        pairs.push(("SSL_CA_LOCATION", ca.as_str()));
    }
    settings(&pairs)
}

/// An event of `lines` on partition 0 of `INPUT`, from offset 0.
fn event(lines: &[String]) -> KafkaEvent {
    KafkaEvent {
        source: EventSource::SelfManaged,
        bootstrap_servers: bootstrap(),
        partitions: vec![PartitionRecords {
            tp: TopicPartition::new(INPUT, 0),
            records: lines
                .iter()
                .enumerate()
                .map(|(o, line)| Record {
                    offset: o as i64,
                    timestamp: 1_000 + o as i64,
                    timestamp_type: TimestampType::CreateTime,
                    key: None,
                    value: Some(line.as_bytes().to_vec()),
                    headers: Vec::new(),
                    key_schema_metadata: None,
                    value_schema_metadata: None,
                })
                .collect(),
        }],
    }
}

/// A fresh output topic and state table.
async fn fixtures(name: &str) -> (String, String) {
    require_secured_listeners();
    let (output, table) = (unique(&format!("{name}-out")), unique(name));
    admin::create_topic(&bootstrap(), &output, 2)
        .await
        .expect("topic");
    create_table(&dynamo_client(), &table).await.expect("table");
    (output, table)
}

/// wordcount from `INPUT` to `output`, its state in `table`, producing to `servers` as
/// `settings` say: a Lambda container.
fn container(output: &str, table: &str, servers: String, settings: KafkaSettings) -> Handler {
    let store: Arc<dyn Store> = Arc::new(DynamoStore::new(
        dynamo_client(),
        table.to_owned(),
        Guarantee::ExactlyOnce,
    ));
    Handler::with_kafka_output(
        wordcount::topology_direct(INPUT, output),
        store,
        Some(servers),
    )
    .with_kafka_settings(settings)
}

async fn produces_over(name: &str, servers: String, settings: KafkaSettings) {
    let (output, table) = fixtures(name).await;
    let lines = sample_text(60, 7);
    let handler = container(&output, &table, servers, settings);
    handler
        .handle_json(&event(&lines).to_json())
        .await
        .expect("the batch succeeds");
    let expected = reference_counts(&lines);
    assert_eq!(table_counts(&table, wordcount::STORE).await, expected);
    assert_eq!(
        emitted_counts(&output),
        expected,
        "read back from the broker"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scram_sha_512_over_sasl_plaintext() {
    let (_, password) = scram_credentials();
    produces_over(
        "scram512",
        sasl_bootstrap(),
        scram("SCRAM-SHA-512", "SASL_PLAINTEXT", &password),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scram_sha_256_over_tls() {
    let (_, password) = scram_credentials();
    produces_over(
        "scram256-tls",
        sasl_ssl_bootstrap(),
        scram("SCRAM-SHA-256", "SASL_SSL", &password),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_trusting_the_local_ca() {
    let ca = ssl_ca_location();
    produces_over(
        "tls",
        ssl_bootstrap(),
        settings(&[("SECURITY_PROTOCOL", "SSL"), ("SSL_CA_LOCATION", &ca)]),
    )
    .await;
}

/// A batch whose output cannot be produced fails, at once and clearly; the same event
/// retried once the setting is fixed (a new container) is exact: nothing lost, nothing
/// counted twice.
async fn fails_clearly_then_retry_is_exact(
    name: &str,
    servers: String,
    wrong: KafkaSettings,
    right: KafkaSettings,
    expected_in_error: &[&str],
) {
    let (output, table) = fixtures(name).await;
    let lines = sample_text(40, 11);
    let batch = event(&lines).to_json();
    let broken = container(&output, &table, servers.clone(), wrong);
    let started = Instant::now();
    let error = broken
        .handle_json(&batch)
        .await
        .expect_err("the batch fails");
    let took = started.elapsed();
    let message = error.to_string();
    eprintln!("the batch failed after {took:?}: {message}");
    assert!(matches!(error, StreamError::Sink(_)), "{message}");
    for part in expected_in_error {
        assert!(message.contains(part), "{part:?} not in: {message}");
    }
    assert!(
        took < Duration::from_secs(20),
        "failed after {took:?}, not after the 30 s message timeout"
    );
    drop(broken);
    assert!(
        read_topic(&output).is_empty(),
        "nothing of the failed batch was produced"
    );

    let fixed = container(&output, &table, servers, right);
    fixed.handle_json(&batch).await.expect("the retry succeeds");
    let expected = reference_counts(&lines);
    assert_eq!(
        table_counts(&table, wordcount::STORE).await,
        expected,
        "counted once"
    );
    assert_eq!(emitted_counts(&output), expected, "the output is complete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_scram_password_fails_the_batch_naming_the_setting_and_loses_nothing() {
    let (_, password) = scram_credentials();
    fails_clearly_then_retry_is_exact(
        "scram-wrong",
        sasl_bootstrap(),
        scram("SCRAM-SHA-512", "SASL_PLAINTEXT", "not-the-password"),
        scram("SCRAM-SHA-512", "SASL_PLAINTEXT", &password),
        &[
            "cannot connect to Kafka",
            "Authentication failed",
            "LAMBDA_STREAMS_KAFKA_SASL_PASSWORD",
            "LAMBDA_STREAMS_KAFKA_SASL_USERNAME",
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_without_the_local_ca_fails_the_batch_naming_the_setting() {
    let ca = ssl_ca_location();
    // Without SSL_CA_LOCATION the producer trusts the system's CAs only (`probe`).
    fails_clearly_then_retry_is_exact(
        "tls-no-ca",
        ssl_bootstrap(),
        settings(&[("SECURITY_PROTOCOL", "SSL")]),
        settings(&[("SECURITY_PROTOCOL", "SSL"), ("SSL_CA_LOCATION", &ca)]),
        &[
            "cannot connect to Kafka",
            "certificate verify failed",
            "LAMBDA_STREAMS_KAFKA_SECURITY_PROTOCOL",
            "LAMBDA_STREAMS_KAFKA_SSL_CA_LOCATION (unset: probe)",
        ],
    )
    .await;
}

/// The real function binary, configured only by its environment, as in Lambda: the
/// local runner consumes the input (plaintext) and invokes `cargo lambda watch` over HTTP;
/// the function produces its output over SASL/SCRAM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wordcount_function_produces_over_scram_configured_by_its_environment() {
    require_secured_listeners();
    let (input, output, table) = (
        unique("secure-in"),
        unique("secure-out"),
        unique("secure-state"),
    );
    for topic in [&input, &output] {
        admin::create_topic(&bootstrap(), topic, 2)
            .await
            .expect("topic");
    }
    create_table(&dynamo_client(), &table).await.expect("table");
    let lines = sample_text(120, 5);
    produce_across_partitions(&input, &lines, 2).await;

    let (user, password) = scram_credentials();
    let mut env = emulator_env();
    env.extend([
        format!("LAMBDA_STREAMS_TABLE={table}"),
        format!("WORDCOUNT_INPUT_TOPIC={input}"),
        format!("WORDCOUNT_OUTPUT_TOPIC={output}"),
        "WORDCOUNT_REKEYING=direct".to_owned(),
        format!("LAMBDA_STREAMS_BOOTSTRAP_SERVERS={}", sasl_bootstrap()),
        "LAMBDA_STREAMS_KAFKA_SECURITY_PROTOCOL=SASL_PLAINTEXT".to_owned(),
        "LAMBDA_STREAMS_KAFKA_SASL_MECHANISM=SCRAM-SHA-512".to_owned(),
        format!("LAMBDA_STREAMS_KAFKA_SASL_USERNAME={user}"),
        format!("LAMBDA_STREAMS_KAFKA_SASL_PASSWORD={password}"),
    ]);
    let watch = LambdaWatch::start("wordcount", PORT, &env);
    let http: Arc<dyn Transport> =
        Arc::new(Http::new(&format!("http://127.0.0.1:{PORT}"), "wordcount").expect("endpoint"));
    let config = RunnerConfig {
        bootstrap_servers: bootstrap(),
        group_id: unique("secure-group"),
        topics: vec![input.clone()],
        batch_size: 50,
        batching_window: Duration::from_millis(200),
        until_idle: true,
        idle_timeout: Duration::from_millis(1500),
        retry_backoff: Duration::from_millis(50),
        ..RunnerConfig::default()
    };
    let summary = tokio::time::timeout(
        Duration::from_secs(900),
        Runner::new(config, http).expect("runner").run(),
    )
    .await
    .expect("the runner finished")
    .expect("the runner succeeded");
    assert_eq!(summary.records, lines.len() as u64);
    assert_eq!(summary.failures, 0);
    let expected = reference_counts(&lines);
    assert_eq!(table_counts(&table, wordcount::STORE).await, expected);
    let emitted: BTreeMap<String, i64> = emitted_counts(&output);
    assert_eq!(emitted, expected, "produced over SCRAM, read back");
    drop(watch);
}
