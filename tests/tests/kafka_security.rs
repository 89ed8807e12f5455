//! The Kafka sink over TLS, SASL/SCRAM and MSK IAM, configured by `LAMBDA_STREAMS_KAFKA_*`
//! variables, on the real broker's secured listeners (`scripts/services up` starts them:
//! SASL_PLAINTEXT with SCRAM, SSL with a certificate of a local CA, SASL_SSL, and SASL_SSL
//! with OAUTHBEARER whose MSK IAM tokens a SigV4 validator of a local key pair checks,
//! independently of this code: `scripts/kafka/msk-iam`).
//!
//! The MSK IAM batches run in processes of their own (this test binary, started again for
//! one ignored test) whose environment holds the AWS credentials: they reach the signer
//! through the SDK's default chain, as a function role's do in Lambda, and the environment
//! of this process, shared by its tests, cannot be changed safely.
//!
//! The handler's settings are parsed by the same code as in Lambda
//! (`KafkaSettings::from_vars`: `from_env` on given pairs, since tests share one process
//! environment); one test runs the real `wordcount` binary under `cargo lambda watch` with
//! the variables in its environment, driven by the local runner over HTTP. Output is read
//! back from the broker and compared with counts computed here; state is exactly once.

use std::collections::BTreeMap;
use std::process::Command;
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
                    value: Some(line.as_bytes().to_vec().into()),
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
/// local runner consumes the input (plaintext) and invokes `cargo lambda watch` on `port` over
/// HTTP; the function produces its output to `servers` as `kafka_env` (`KEY=VALUE`, which
/// replace the emulator's variables of the same name) says.
async fn the_function_produces_over(port: u16, servers: String, kafka_env: Vec<String>) {
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

    let key = |var: &String| var.split('=').next().unwrap_or_default().to_owned();
    let replaced: Vec<String> = kafka_env.iter().map(key).collect();
    let mut env: Vec<String> = emulator_env()
        .into_iter()
        .filter(|var| !replaced.contains(&key(var)))
        .collect();
    env.extend([
        format!("LAMBDA_STREAMS_TABLE={table}"),
        format!("WORDCOUNT_INPUT_TOPIC={input}"),
        format!("WORDCOUNT_OUTPUT_TOPIC={output}"),
        "WORDCOUNT_REKEYING=direct".to_owned(),
        format!("LAMBDA_STREAMS_BOOTSTRAP_SERVERS={servers}"),
    ]);
    env.extend(kafka_env);
    let watch = LambdaWatch::start("wordcount", port, &env);
    let http: Arc<dyn Transport> =
        Arc::new(Http::new(&format!("http://127.0.0.1:{port}"), "wordcount").expect("endpoint"));
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
    assert_eq!(emitted, expected, "produced to {servers}, read back");
    drop(watch);
}

/// The function produces its output over SASL/SCRAM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wordcount_function_produces_over_scram_configured_by_its_environment() {
    let (user, password) = scram_credentials();
    the_function_produces_over(
        free_port(),
        sasl_bootstrap(),
        vec![
            "LAMBDA_STREAMS_KAFKA_SECURITY_PROTOCOL=SASL_PLAINTEXT".to_owned(),
            "LAMBDA_STREAMS_KAFKA_SASL_MECHANISM=SCRAM-SHA-512".to_owned(),
            format!("LAMBDA_STREAMS_KAFKA_SASL_USERNAME={user}"),
            format!("LAMBDA_STREAMS_KAFKA_SASL_PASSWORD={password}"),
        ],
    )
    .await;
}

/// The function produces its output over MSK IAM, signing with the credentials of its
/// environment (a role's: with a session token) through the SDK's default chain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wordcount_function_produces_over_msk_iam_configured_by_its_environment() {
    require_iam_listener();
    let credentials = iam_credentials();
    the_function_produces_over(
        free_port(),
        iam_bootstrap(),
        vec![
            "LAMBDA_STREAMS_KAFKA_SASL_MECHANISM=AWS_MSK_IAM".to_owned(),
            format!("LAMBDA_STREAMS_KAFKA_SSL_CA_LOCATION={}", ssl_ca_location()),
            format!("AWS_ACCESS_KEY_ID={}", credentials.access_key_id),
            format!("AWS_SECRET_ACCESS_KEY={}", credentials.secret_access_key),
            format!("AWS_SESSION_TOKEN={}", credentials.session_token),
            format!("AWS_REGION={}", credentials.region),
        ],
    )
    .await;
}

/// The ignored test that runs one MSK IAM batch in a process of its own.
const MSK_IAM_CHILD: &str = "msk_iam_batch_in_a_process_of_its_own";
/// The child's instructions: `<output topic> <state table> <lines> <seed>`.
const MSK_IAM_BATCH: &str = "LAMBDA_STREAMS_TEST_MSK_IAM_BATCH";
/// What starts the child's report on its stdout (after libtest's `test <name> ... `).
const MSK_IAM_REPORT: &str = "MSK_IAM_BATCH:";

/// How a batch run by [`msk_iam_batch`] ended.
#[derive(Debug)]
enum Outcome {
    /// It succeeded.
    Succeeded,
    /// It failed after this long with this error.
    Failed(Duration, String),
}

/// Runs the wordcount batch of `sample_text(lines, seed)` to `output`, its state in `table`,
/// producing over the MSK IAM listener, in a new process of this test binary whose
/// environment is this one's but for `LAMBDA_STREAMS_KAFKA_SASL_MECHANISM=AWS_MSK_IAM` (and
/// the local CA), and the AWS credentials and region given.
fn msk_iam_batch(
    output: &str,
    table: &str,
    (lines, seed): (usize, u64),
    credentials: &IamTestCredentials,
) -> Outcome {
    let mut command = Command::new(std::env::current_exe().expect("the test binary"));
    command.args([
        MSK_IAM_CHILD,
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ]);
    for (name, _) in std::env::vars() {
        if name.starts_with("LAMBDA_STREAMS_KAFKA_") || name.starts_with("AWS_PROFILE") {
            command.env_remove(name);
        }
    }
    command
        .env(MSK_IAM_BATCH, format!("{output} {table} {lines} {seed}"))
        .env("LAMBDA_STREAMS_KAFKA_SASL_MECHANISM", "AWS_MSK_IAM")
        .env("LAMBDA_STREAMS_KAFKA_SSL_CA_LOCATION", ssl_ca_location())
        .env("AWS_ACCESS_KEY_ID", &credentials.access_key_id)
        .env("AWS_SECRET_ACCESS_KEY", &credentials.secret_access_key)
        .env("AWS_SESSION_TOKEN", &credentials.session_token)
        .env("AWS_REGION", &credentials.region)
        .env("AWS_EC2_METADATA_DISABLED", "true");
    let child = command.output().expect("the child test process runs");
    let stdout = String::from_utf8_lossy(&child.stdout);
    let stderr = String::from_utf8_lossy(&child.stderr);
    assert!(
        child.status.success(),
        "the child process failed ({}):\n{stdout}\n{stderr}",
        child.status
    );
    let report = stdout
        .lines()
        .find_map(|line| Some(&line[line.find(MSK_IAM_REPORT)? + MSK_IAM_REPORT.len()..]))
        .unwrap_or_else(|| panic!("no report from the child process:\n{stdout}\n{stderr}"));
    match report.split_once(' ') {
        Some(("ok", _)) => Outcome::Succeeded,
        Some(("failed", rest)) => {
            let (ms, message) = rest.split_once(' ').expect("<ms> <message>");
            Outcome::Failed(
                Duration::from_millis(ms.parse().expect("ms")),
                message.to_owned(),
            )
        }
        _ => panic!("unexpected report {report:?}"),
    }
}

/// The child of [`msk_iam_batch`]: settings from its environment (`from_env`, as in Lambda),
/// one batch, the outcome reported on stdout (a failure must be the sink's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by the MSK IAM tests in a process of its own, with its environment"]
async fn msk_iam_batch_in_a_process_of_its_own() {
    let Ok(batch) = std::env::var(MSK_IAM_BATCH) else {
        eprintln!("{MSK_IAM_BATCH} is not set: nothing to do (the MSK IAM tests run this)");
        return;
    };
    let [output, table, lines, seed] = batch.split(' ').collect::<Vec<_>>()[..] else {
        panic!("{MSK_IAM_BATCH}={batch:?} is not <output> <table> <lines> <seed>");
    };
    let lines = sample_text(lines.parse().expect("lines"), seed.parse().expect("seed"));
    let settings = KafkaSettings::from_env().expect("valid settings");
    assert_eq!(settings.get("sasl.mechanism"), Some("OAUTHBEARER"));
    assert_eq!(settings.get("security.protocol"), Some("SASL_SSL"));
    let handler = container(output, table, iam_bootstrap(), settings);
    let started = Instant::now();
    let result = handler.handle_json(&event(&lines).to_json()).await;
    let took = started.elapsed().as_millis();
    match result {
        Ok(_) => println!("{MSK_IAM_REPORT}ok {took}"),
        Err(error) => {
            let message = error.to_string().replace('\n', " ");
            assert!(matches!(error, StreamError::Sink(_)), "{message}");
            println!("{MSK_IAM_REPORT}failed {took} {message}");
        }
    }
}

/// A fresh output topic and state table, with the MSK IAM listener checked.
async fn iam_fixtures(name: &str) -> (String, String) {
    require_iam_listener();
    fixtures(name).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn msk_iam_over_tls_with_the_roles_credentials_from_the_environment() {
    let (output, table) = iam_fixtures("msk-iam").await;
    let (n, seed) = (60, 13);
    let outcome = msk_iam_batch(&output, &table, (n, seed), &iam_credentials());
    assert!(matches!(outcome, Outcome::Succeeded), "{outcome:?}");
    let expected = reference_counts(&sample_text(n, seed));
    assert_eq!(table_counts(&table, wordcount::STORE).await, expected);
    assert_eq!(
        emitted_counts(&output),
        expected,
        "produced over MSK IAM, read back"
    );
}

/// A batch whose MSK IAM token the broker rejects fails at once, naming the MSK IAM
/// settings; the same event retried with the right credentials (a new container) is exact.
async fn msk_iam_rejected_then_retry_is_exact(name: &str, wrong: IamTestCredentials) {
    let (output, table) = iam_fixtures(name).await;
    let (n, seed) = (40, 17);
    let outcome = msk_iam_batch(&output, &table, (n, seed), &wrong);
    let Outcome::Failed(took, message) = outcome else {
        panic!("the batch succeeded with wrong credentials {wrong:?}");
    };
    eprintln!("the batch failed after {took:?}: {message}");
    for part in [
        "cannot connect to Kafka",
        "SASL authentication error",
        "LAMBDA_STREAMS_KAFKA_SASL_MECHANISM=AWS_MSK_IAM",
        "kafka-cluster:Connect",
    ] {
        assert!(message.contains(part), "{part:?} not in: {message}");
    }
    assert!(
        took < Duration::from_secs(20),
        "failed after {took:?}, not after the 30 s message timeout"
    );
    assert!(
        read_topic(&output).is_empty(),
        "nothing of the failed batch was produced"
    );

    let outcome = msk_iam_batch(&output, &table, (n, seed), &iam_credentials());
    assert!(
        matches!(outcome, Outcome::Succeeded),
        "the retry: {outcome:?}"
    );
    let expected = reference_counts(&sample_text(n, seed));
    assert_eq!(
        table_counts(&table, wordcount::STORE).await,
        expected,
        "counted once"
    );
    assert_eq!(emitted_counts(&output), expected, "the output is complete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_msk_iam_secret_key_fails_the_batch_naming_the_setting_and_loses_nothing() {
    let wrong = IamTestCredentials {
        secret_access_key: "not-the-secret-key".to_owned(),
        ..iam_credentials()
    };
    msk_iam_rejected_then_retry_is_exact("msk-iam-wrong-secret", wrong).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_msk_iam_token_for_another_region_is_rejected_and_loses_nothing() {
    let right = iam_credentials();
    let other = if right.region == "eu-west-3" {
        "us-west-2"
    } else {
        "eu-west-3"
    };
    let wrong = IamTestCredentials {
        region: other.to_owned(),
        ..right
    };
    msk_iam_rejected_then_retry_is_exact("msk-iam-wrong-region", wrong).await;
}

/// One container, two event sources on different clusters (here: a cluster that is gone,
/// then the real broker): each event's output goes to the brokers that event names. A
/// container kept the producer of its first event, so the second batch's output went to
/// the first cluster and failed after the producer's 30 s timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_events_output_goes_to_the_cluster_it_names() {
    require_services();
    let (output, table) = (unique("clusters-out"), unique("clusters"));
    admin::create_topic(&bootstrap(), &output, 2)
        .await
        .expect("topic");
    create_table(&dynamo_client(), &table).await.expect("table");
    let store: Arc<dyn Store> = Arc::new(DynamoStore::new(
        dynamo_client(),
        table.clone(),
        Guarantee::ExactlyOnce,
    ));
    let handler =
        Handler::with_kafka_output(wordcount::topology_direct(INPUT, &output), store, None);
    let gone = KafkaEvent {
        bootstrap_servers: format!("127.0.0.1:{}", free_port()),
        partitions: Vec::new(),
        ..event(&[])
    };
    handler
        .handle_event(&gone)
        .await
        .expect("an event of no records succeeds");
    let lines = sample_text(40, 11);
    let started = Instant::now();
    handler
        .handle_json(&event(&lines).to_json())
        .await
        .expect("the batch from the real broker produces to it");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    let expected = reference_counts(&lines);
    assert_eq!(table_counts(&table, wordcount::STORE).await, expected);
    assert_eq!(
        emitted_counts(&output),
        expected,
        "read back from the broker"
    );
}
