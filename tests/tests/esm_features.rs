//! The event source's newer parts in the local runner, on the real broker: `FilterCriteria`
//! (records no filter matches are committed, not delivered), the on-failure Kafka
//! destination with Lambda's failure metadata and the cap of 10 retries when a destination
//! is set with unlimited retries, and a new user's first run: `wordcount` under
//! `cargo lambda watch` on topics that do not exist yet (`--create-topics`), with logs
//! written to a pipe (no ANSI colour codes).
//!
//! Expected results are worked out by hand from AWS's documentation (filter rule syntax,
//! retry controls) or computed by the tests' own reference (`reference_counts`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lambda_streams::event::KafkaEvent;
use lambda_streams_e2e::*;
use local_runner::destination::{ATTEMPTS_HEADER, METADATA_HEADER};
use local_runner::filter::FilterCriteria;
use local_runner::{InvokeError, Runner, RunnerConfig, Transport};
use rdkafka::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};

/// How the test function answers an event.
type Answer = dyn Fn(&KafkaEvent) -> Result<String, String> + Send + Sync;

/// A function that records the `(partition, offset)`s of every event and answers with
/// `answer(event)`: `Ok(body)` is its response, `Err(message)` a function error.
struct Recorder {
    calls: Mutex<Vec<Vec<(i32, i64)>>>,
    answer: Box<Answer>,
}

impl Recorder {
    fn new(
        answer: impl Fn(&KafkaEvent) -> Result<String, String> + Send + Sync + 'static,
    ) -> Arc<Self> {
        Arc::new(Recorder {
            calls: Mutex::new(Vec::new()),
            answer: Box::new(answer),
        })
    }

    /// Per partition, the offsets delivered, in order (every call).
    fn delivered(&self) -> BTreeMap<i32, Vec<i64>> {
        let mut by_partition: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
        for call in self.calls.lock().expect("calls").iter() {
            for &(p, o) in call {
                by_partition.entry(p).or_default().push(o);
            }
        }
        by_partition
    }
}

#[local_runner::async_trait]
impl Transport for Recorder {
    async fn invoke(&self, payload: Vec<u8>) -> Result<Vec<u8>, InvokeError> {
        let event = KafkaEvent::decode(&payload).expect("the runner's event decodes");
        let offsets = event
            .partitions
            .iter()
            .flat_map(|p| p.records.iter().map(move |r| (p.tp.partition, r.offset)))
            .collect();
        self.calls.lock().expect("calls").push(offsets);
        (self.answer)(&event)
            .map(String::into_bytes)
            .map_err(InvokeError)
    }
}

/// Produces `values` to `topic`, each `(partition, value)`, in order.
async fn produce(topic: &str, values: &[(i32, &[u8])]) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("enable.idempotence", "true")
        .create()
        .expect("producer");
    for (partition, value) in values {
        producer
            .send(
                FutureRecord::<str, [u8]>::to(topic)
                    .partition(*partition)
                    .key("k")
                    .payload(value),
                Duration::from_secs(30),
            )
            .await
            .expect("produced");
    }
}

fn config(topic: &str) -> RunnerConfig {
    RunnerConfig {
        bootstrap_servers: bootstrap(),
        group_id: unique("esm-features-group"),
        topics: vec![topic.to_owned()],
        batching_window: Duration::from_millis(100),
        until_idle: true,
        idle_timeout: Duration::from_millis(1500),
        retry_backoff: Duration::from_millis(10),
        ..RunnerConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_deliver_the_matching_records_and_commit_the_others() {
    require_services();
    let topic = new_topic("esm-filter", 2).await;
    produce(
        &topic,
        &[
            (0, br#"{"kind": "order", "n": 1}"#),
            (0, br#"{"kind": "refund"}"#),
            (0, b"hello world"),
            (0, br#"{"kind": "order", "n": 7}"#),
            (0, b"\xff\xfe"),
            (1, br#"{"kind": "ORDER"}"#),
            (1, br#"{"n": 3}"#),
        ],
    )
    .await;
    let filter = FilterCriteria::parse(&[
        r#"{"value": {"kind": ["order"], "n": [{"numeric": [">", 5]}]}}"#,
        r#"{"value": [{"prefix": "hello"}]}"#,
        r#"{"value": {"kind": [{"equals-ignore-case": "order"}], "n": [{"exists": false}]}}"#,
    ])
    .expect("filters");
    let function = Recorder::new(|_| Ok(String::new()));
    let config = RunnerConfig {
        filter,
        ..config(&topic)
    };
    let group = config.group_id.clone();
    let summary = Runner::new(config, function.clone())
        .expect("runner")
        .run()
        .await
        .expect("run");
    // By hand: p0@0 has n = 1 (not > 5, and n exists); p0@1 is a refund; p0@2 is a plain
    // string beginning with "hello"; p0@3 is an order with n = 7; p0@4 is not UTF-8 (no
    // value to match). p1@0 is "ORDER" without n; p1@1 has no kind.
    assert_eq!(
        function.delivered(),
        BTreeMap::from([(0, vec![2, 3]), (1, vec![0])])
    );
    assert_eq!(summary.filtered, 4);
    assert_eq!(summary.records, 3);
    // Every record is committed, delivered or not (the last of p0 was filtered out).
    assert_eq!(
        committed(&group, &topic, 2),
        BTreeMap::from([(0, Some(5)), (1, Some(2))])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_destination_and_unlimited_retries_a_record_is_retried_10_times_then_sent_with_lambdas_metadata()
 {
    require_services();
    let topic = new_topic("esm-cap", 1).await;
    let dlq = new_topic("esm-cap-dlq", 1).await;
    produce(&topic, &[(0, b"a0"), (0, b"a1"), (0, b"a2"), (0, b"a3")]).await;
    let t = topic.clone();
    // Offset 3 always fails (a partial batch response naming it).
    let function = Recorder::new(move |event| {
        let has_3 = event
            .partitions
            .iter()
            .any(|p| p.records.iter().any(|r| r.offset == 3));
        Ok(if has_3 {
            serde_json::json!({"batchItemFailures": [
                {"itemIdentifier": {"topic-partition": format!("{t}-0"), "offset": 3}}
            ]})
            .to_string()
        } else {
            String::new()
        })
    });
    let config = RunnerConfig {
        batch_size: 4,
        batching_window: Duration::from_secs(60),
        // MaximumRetryAttempts -1 (the default): unlimited, but 10 with a destination.
        maximum_retry_attempts: None,
        on_failure_topic: Some(dlq.clone()),
        ..config(&topic)
    };
    let group = config.group_id.clone();
    let summary = Runner::new(config, function.clone())
        .expect("runner")
        .run()
        .await
        .expect("run");
    let delivered = function.delivered();
    assert_eq!(
        delivered[&0].iter().filter(|&&o| o == 3).count(),
        11,
        "the first invocation and 10 retries: {delivered:?}"
    );
    assert_eq!(summary.given_up, 1);
    assert_eq!(committed(&group, &topic, 1), BTreeMap::from([(0, Some(4))]));

    let failed = read_topic(&dlq);
    assert_eq!(failed.len(), 1, "the record itself");
    let record = &failed[0];
    assert_eq!(record.value.as_deref(), Some(&b"a3"[..]));
    assert_eq!(record.key.as_deref(), Some(&b"k"[..]));
    assert_eq!(record.headers[ATTEMPTS_HEADER], b"11");
    let metadata: serde_json::Value =
        serde_json::from_slice(&record.headers[METADATA_HEADER]).expect("JSON metadata");
    assert_eq!(
        metadata["requestContext"]["condition"],
        "RetryAttemptsExhausted"
    );
    assert_eq!(metadata["requestContext"]["approximateInvokeCount"], 11);
    assert_eq!(metadata["KafkaBatchInfo"]["batchSize"], 1);
    assert_eq!(metadata["KafkaBatchInfo"]["bootstrapServers"], bootstrap());
    let info = &metadata["KafkaBatchInfo"]["recordsInfo"][format!("{topic}-0")];
    assert_eq!(info["firstRecordOffset"], "3");
    assert_eq!(info["lastRecordOffset"], "3");
    assert!(
        metadata["responseContext"]["errorMessage"]
            .as_str()
            .is_some_and(|e| e.contains(&format!("{topic}-0@3"))),
        "{metadata}"
    );
}

/// What a new user runs: `wordcount` under `cargo lambda watch`, invoked by the runner
/// binary over the Invoke API, on a fresh input topic whose output and repartition topics
/// do not exist (`--create-topics` creates them), with a filter on the input, and the
/// runner's logs going to a pipe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wordcount_under_cargo_lambda_watch_runs_on_fresh_topics_with_a_filter_and_plain_logs() {
    require_services();
    let input = new_topic("esm-new-user-in", 2).await;
    let (output, repartition, table) = (
        unique("esm-new-user-out"),
        unique("esm-new-user-repartition"),
        unique("esm-new-user"),
    );
    let words = sample_text(40, 11);
    let lines: Vec<String> = words
        .iter()
        .enumerate()
        .map(|(i, l)| {
            if i % 3 == 0 {
                format!("drop {l}")
            } else {
                format!("keep {l}")
            }
        })
        .collect();
    produce_across_partitions(&input, &lines, 2).await;
    let kept: Vec<String> = lines
        .iter()
        .filter(|l| l.starts_with("keep "))
        .cloned()
        .collect();
    let expected = reference_counts(&kept);

    let topics = [
        format!("WORDCOUNT_INPUT_TOPIC={input}"),
        format!("WORDCOUNT_OUTPUT_TOPIC={output}"),
        format!("WORDCOUNT_REPARTITION_TOPIC={repartition}"),
        "WORDCOUNT_REKEYING=repartition".to_owned(),
    ];
    let mut env = emulator_env();
    env.extend(topics.iter().cloned());
    env.push(format!("LAMBDA_STREAMS_TABLE={table}"));
    lambda_streams::state::dynamodb::create_table(&dynamo_client(), &table)
        .await
        .expect("table");
    let port = free_port();
    let watch = LambdaWatch::start("wordcount", port, &env);

    let group = unique("esm-new-user-group");
    let mut runner = std::process::Command::new("cargo");
    runner
        .args([
            "run",
            "--quiet",
            "-p",
            "lambda-streams-local-runner",
            "--",
            "run",
        ])
        .args(["--function-url", &format!("http://127.0.0.1:{port}")])
        .args(["--function-name", "wordcount"])
        .args(["--topic", &input, "--topic", &repartition])
        .args(["--group-id", &group, "--bootstrap-servers", &bootstrap()])
        .args(["--create-topics"])
        .args(["--filter", r#"{"value": [{"prefix": "keep "}]}"#])
        .args(["--batch-size", "20", "--batching-window-ms", "50"])
        .args(["--until-idle", "--idle-timeout-ms", "3000", "--quiet"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(std::process::Stdio::null());
    for var in &topics {
        let (k, v) = var.split_once('=').expect("KEY=VALUE");
        runner.env(k, v);
    }
    // A terminal-less run, as in CI, a file or CloudWatch.
    runner.env_remove("NO_COLOR");
    let done = tokio::task::spawn_blocking(move || runner.output().expect("the runner runs"))
        .await
        .expect("joined");
    let stdout = String::from_utf8_lossy(&done.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&done.stderr).into_owned();
    assert!(done.status.success(), "runner failed:\n{stdout}\n{stderr}");
    drop(watch);

    // The topics it created, with the input's partitions.
    let listed: BTreeMap<String, usize> = local_runner::admin::list_topics(&bootstrap())
        .expect("topics")
        .into_iter()
        .collect();
    assert_eq!(listed.get(&output), Some(&2), "{stderr}");
    assert_eq!(listed.get(&repartition), Some(&2), "{stderr}");
    // The filtered lines were committed, not delivered; the counts are the kept lines'.
    let dropped = lines.len() - kept.len();
    assert!(
        stdout.contains(&format!("{dropped} filtered out")),
        "{stdout}"
    );
    assert_eq!(committed_total(&group, &input, 2), lines.len() as i64);
    assert_eq!(emitted_counts(&output), expected);
    assert_eq!(table_counts(&table, wordcount::STORE).await, expected);
    // Logs into a pipe carry no ANSI escape codes (and there are some: the rebalance line).
    assert!(
        stdout.contains("partitions assigned"),
        "a log line was written: {stdout}"
    );
    assert!(
        !stdout.contains('\u{1b}') && !stderr.contains('\u{1b}'),
        "ANSI codes in the logs:\n{stdout:?}\n{stderr:?}"
    );
}
