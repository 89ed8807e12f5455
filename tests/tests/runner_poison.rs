//! Poison-record policies through the local runner, on the real broker and the DynamoDB
//! emulator: `fail` (the partition stops at the record and is retried; with partial batch
//! responses only that partition stops), `skip` (counted), `dead-letter:<topic>` (read back
//! from the broker), a panic in user code (the invocation fails with a diagnostic, the next
//! one succeeds), and the real `wordcount` binary under `cargo lambda watch`, whose policy
//! comes from its environment. State is compared with counts computed here.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lambda_streams::dsl::Grouped;
use lambda_streams::event::KafkaEvent;
use lambda_streams::lambda::Handler;
use lambda_streams::serdes::{DecimalI64, Unit, Utf8};
use lambda_streams::state::Store;
use lambda_streams::state::dynamodb::{DynamoStore, create_table};
use lambda_streams::{BatchOptions, Guarantee, PoisonPolicy, StreamsBuilder, Topology};
use lambda_streams_e2e::*;
use local_runner::{
    Faults, Http, InProcess, InvokeError, RunSummary, Runner, RunnerConfig, Transport, admin,
};
use rdkafka::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

const STORE: &str = "values";

/// Counts values. Not UTF-8: a deserialization error; `"fail"`: an error of user code;
/// `"boom"`: user code panics while `panics` is above zero (once per unit).
fn topology(input: &str, output: &str, panics: Arc<AtomicU32>) -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream(input, Unit, Utf8)
        .map_values(move |v: String| {
            if v == "boom"
                && panics
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok()
            {
                panic!("boom in user code");
            }
            v
        })
        .try_map_values(|v: String| {
            if v == "fail" {
                Err("the value says fail")
            } else {
                Ok(v)
            }
        })
        .group_by(|_, v| v.clone(), Grouped::direct(Utf8))
        .count(STORE)
        .to_stream()
        .to(output, Utf8, DecimalI64);
    builder.build()
}

const NOT_UTF8: &[u8] = &[0xc3, 0x28];

/// Per partition, the values to produce (`NOT_UTF8` is the deserialization poison).
fn data() -> Vec<Vec<&'static [u8]>> {
    vec![
        vec![
            "a".as_bytes(),
            "b".as_bytes(),
            NOT_UTF8,
            "c".as_bytes(),
            "a".as_bytes(),
        ],
        vec!["b".as_bytes(), "fail".as_bytes(), "d".as_bytes()],
        vec!["a".as_bytes(), "c".as_bytes(), "e".as_bytes()],
    ]
}

fn poison(value: &[u8]) -> bool {
    value == NOT_UTF8 || value == b"fail"
}

/// The reference: every value that is not poison, counted once (`upto`: per partition,
/// only the records below that offset).
fn reference(data: &[Vec<&[u8]>], upto: Option<&[i64]>) -> BTreeMap<String, i64> {
    let mut counts = BTreeMap::new();
    for (p, values) in data.iter().enumerate() {
        for (o, value) in values.iter().enumerate() {
            if poison(value) || upto.is_some_and(|u| o as i64 >= u[p]) {
                continue;
            }
            *counts
                .entry(String::from_utf8(value.to_vec()).expect("utf-8"))
                .or_insert(0) += 1;
        }
    }
    counts
}

/// Produces `data`, values to their partitions in order, each with a `trace-id` header.
async fn produce(topic: &str, data: &[Vec<&[u8]>]) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("enable.idempotence", "true")
        .create()
        .expect("producer");
    for (p, values) in data.iter().enumerate() {
        for (o, value) in values.iter().enumerate() {
            let trace = format!("t-{p}-{o}");
            producer
                .send(
                    FutureRecord::<(), [u8]>::to(topic)
                        .partition(p as i32)
                        .payload(value)
                        .headers(OwnedHeaders::new().insert(Header {
                            key: "trace-id",
                            value: Some(trace.as_bytes()),
                        })),
                    Duration::from_secs(30),
                )
                .await
                .expect("produced");
        }
    }
}

/// One invocation: the `(partition, offset)` of its records, and the response or error.
type Call = (Vec<(i32, i64)>, Result<String, String>);

/// The function under the runner: a handler called in-process exactly as the runner's
/// `InProcess` transport calls it (`handle_json`, then the Lambda response), recording
/// every invocation and summing the poison records it met.
struct Function {
    handler: Arc<Handler>,
    calls: Mutex<Vec<Call>>,
    poison: AtomicU64,
}

#[local_runner::async_trait]
impl Transport for Function {
    async fn invoke(&self, payload: Vec<u8>) -> Result<Vec<u8>, InvokeError> {
        let event = KafkaEvent::decode(&payload).expect("the runner's event decodes");
        let offsets = event
            .partitions
            .iter()
            .flat_map(|p| p.records.iter().map(move |r| (p.tp.partition, r.offset)))
            .collect();
        let result = match self.handler.handle_json(&payload).await {
            Ok(outcome) => {
                self.poison
                    .fetch_add(outcome.report.poison_records, Ordering::SeqCst);
                Ok(outcome.response().to_string())
            }
            Err(e) => Err(e.to_string()),
        };
        self.calls
            .lock()
            .expect("calls")
            .push((offsets, result.clone()));
        result.map(String::into_bytes).map_err(InvokeError)
    }
}

struct Setup {
    input: String,
    output: String,
    table: String,
    function: Arc<Function>,
    config: RunnerConfig,
}

async fn setup(name: &str, options: BatchOptions, panics: u32) -> Setup {
    setup_with(name, options, panics, &data()).await
}

async fn setup_with(name: &str, options: BatchOptions, panics: u32, data: &[Vec<&[u8]>]) -> Setup {
    require_services();
    let (input, output, table) = (
        unique(&format!("{name}-in")),
        unique(&format!("{name}-out")),
        unique(name),
    );
    admin::create_topic(&bootstrap(), &input, 3)
        .await
        .expect("topic");
    admin::create_topic(&bootstrap(), &output, 1)
        .await
        .expect("topic");
    create_table(&dynamo_client(), &table).await.expect("table");
    let store: Arc<dyn Store> = Arc::new(DynamoStore::new(
        dynamo_client(),
        table.clone(),
        Guarantee::ExactlyOnce,
    ));
    let topology = topology(&input, &output, Arc::new(AtomicU32::new(panics)));
    let handler = Handler::with_kafka_output(topology, store, None).with_options(options);
    let function = Arc::new(Function {
        handler: Arc::new(handler),
        calls: Mutex::new(Vec::new()),
        poison: AtomicU64::new(0),
    });
    let config = RunnerConfig {
        bootstrap_servers: bootstrap(),
        group_id: unique(&format!("{name}-group")),
        topics: vec![input.clone()],
        batching_window: Duration::from_millis(300),
        until_idle: true,
        idle_timeout: Duration::from_millis(1500),
        retry_backoff: Duration::from_millis(50),
        ..RunnerConfig::default()
    };
    produce(&input, data).await;
    Setup {
        input,
        output,
        table,
        function,
        config,
    }
}

async fn run_to_end(config: RunnerConfig, function: Arc<Function>) -> RunSummary {
    tokio::time::timeout(
        Duration::from_secs(120),
        Runner::new(config, function).expect("runner").run(),
    )
    .await
    .expect("the runner finished")
    .expect("the runner succeeded")
}

/// Runs a runner that cannot finish (a poison record retried without limit) for a while,
/// then drops it, as a stopped runner.
async fn run_for(config: RunnerConfig, function: Arc<Function>, time: Duration) {
    let runner = Runner::new(config, function).expect("runner");
    let _ = tokio::time::timeout(time, runner.run()).await;
}

fn options(poison: PoisonPolicy, partial_batch_response: bool) -> BatchOptions {
    BatchOptions {
        poison,
        partial_batch_response,
        ..BatchOptions::default()
    }
}

/// How many times each `(partition, offset)` was delivered.
fn deliveries(function: &Function) -> BTreeMap<(i32, i64), usize> {
    let mut seen = BTreeMap::new();
    for (offsets, _) in function.calls.lock().expect("calls").iter() {
        for &o in offsets {
            *seen.entry(o).or_insert(0) += 1;
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_with_partial_responses_stops_only_the_poisoned_partitions() {
    let s = setup("poison-fail-partial", options(PoisonPolicy::Fail, true), 0).await;
    run_for(s.config.clone(), s.function.clone(), Duration::from_secs(8)).await;

    // Partition 0 stops at offset 2, partition 1 at offset 1; partition 2 is done.
    let stops = [2, 1, 3];
    assert_eq!(
        committed(&s.config.group_id, &s.input, 3),
        BTreeMap::from([(0, Some(2)), (1, Some(1)), (2, Some(3))])
    );
    let seen = deliveries(&s.function);
    assert!(
        seen[&(0, 2)] >= 3 && seen[&(1, 1)] >= 3,
        "the poison records are retried: {seen:?}"
    );
    for (&(p, o), &n) in &seen {
        if o < stops[p as usize] {
            assert_eq!(
                n, 1,
                "record {p}@{o} was done the first time: only the poisoned partitions are retried"
            );
        }
    }
    // Every invocation answered with a partial success, and what the responses reported
    // is exactly the two poison records (however the batches were cut: under load the
    // first batch may not hold every partition).
    let calls = s.function.calls.lock().expect("calls").clone();
    let mut reported = std::collections::BTreeSet::new();
    for (_, result) in &calls {
        let response: serde_json::Value =
            serde_json::from_str(result.as_ref().expect("a partial success")).expect("json");
        for failure in response["batchItemFailures"].as_array().expect("a list") {
            let id = &failure["itemIdentifier"];
            reported.insert((
                id["topic-partition"]
                    .as_str()
                    .expect("topic-partition")
                    .to_owned(),
                id["offset"].as_i64().expect("offset"),
            ));
        }
    }
    let expected_failures = std::collections::BTreeSet::from([
        (format!("{}-0", s.input), 2),
        (format!("{}-1", s.input), 1),
    ]);
    assert_eq!(reported, expected_failures);
    let expected = reference(&data(), Some(&stops));
    assert_eq!(table_counts(&s.table, STORE).await, expected);
    assert_eq!(emitted_counts(&s.output), expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_without_partial_responses_retries_the_whole_batch() {
    let s = setup("poison-fail-whole", options(PoisonPolicy::Fail, false), 0).await;
    run_for(s.config.clone(), s.function.clone(), Duration::from_secs(6)).await;

    let commits = committed(&s.config.group_id, &s.input, 3);
    assert!(
        commits.values().all(|o| o.unwrap_or(0) == 0),
        "nothing past the start is committed, on any partition: {commits:?}"
    );
    let calls = s.function.calls.lock().expect("calls").clone();
    assert!(calls.len() >= 3, "retried: {} invocations", calls.len());
    for (_, result) in calls.iter() {
        let error = result.clone().expect_err("every invocation fails");
        assert!(
            error.contains(" offset 2: cannot deserialize the value")
                || error.contains(" offset 1: KSTREAM-"),
            "{error}"
        );
    }
    assert!(
        table_counts(&s.table, STORE).await.is_empty(),
        "no state is written by a failed batch"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skip_counts_the_poison_records_and_state_is_exact() {
    let mut s = setup("poison-skip", options(PoisonPolicy::Skip, false), 0).await;
    // Every batch is delivered twice, as the event source does now and then.
    s.config.faults = Faults {
        duplicate_every: Some(1),
        ..Faults::default()
    };
    let summary = run_to_end(s.config.clone(), s.function.clone()).await;
    assert_eq!(summary.records, 11);
    assert_eq!(summary.failures, 0);
    assert_eq!(
        s.function.poison.load(Ordering::SeqCst),
        2 * 2,
        "2 poison records, each batch delivered twice"
    );
    let expected = reference(&data(), None);
    assert_eq!(table_counts(&s.table, STORE).await, expected);
    assert_eq!(emitted_counts(&s.output), expected);
    assert_eq!(
        committed(&s.config.group_id, &s.input, 3),
        BTreeMap::from([(0, Some(5)), (1, Some(3)), (2, Some(3))])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letter_produces_the_poison_records_unchanged_with_error_and_source() {
    let dlq = unique("poison-dlq");
    admin::create_topic(&bootstrap(), &dlq, 1)
        .await
        .expect("topic");
    let s = setup(
        "poison-dead-letter",
        options(PoisonPolicy::DeadLetter { topic: dlq.clone() }, true),
        0,
    )
    .await;
    let summary = run_to_end(s.config.clone(), s.function.clone()).await;
    assert_eq!(summary.failures, 0);
    assert_eq!(summary.given_up, 0);
    let expected = reference(&data(), None);
    assert_eq!(table_counts(&s.table, STORE).await, expected);
    assert_eq!(emitted_counts(&s.output), expected);

    let mut dead = read_topic(&dlq);
    dead.sort_by_key(|r| r.headers["lambda-streams-source"].clone());
    assert_eq!(dead.len(), 2, "the two poison records");
    let source = |r: &Consumed| String::from_utf8(r.headers["lambda-streams-source"].clone());
    let error =
        |r: &Consumed| String::from_utf8(r.headers["lambda-streams-error"].clone()).expect("utf-8");
    assert_eq!(source(&dead[0]).expect("utf-8"), format!("{}:0:2", s.input));
    assert_eq!(dead[0].value.as_deref(), Some(NOT_UTF8), "unchanged bytes");
    assert_eq!(
        dead[0].headers["trace-id"], b"t-0-2",
        "its own headers kept"
    );
    assert!(
        error(&dead[0]).starts_with(&format!(
            "record {}-0 offset 2: cannot deserialize the value",
            s.input
        )),
        "{}",
        error(&dead[0])
    );
    assert_eq!(source(&dead[1]).expect("utf-8"), format!("{}:1:1", s.input));
    assert_eq!(dead[1].value.as_deref(), Some(&b"fail"[..]));
    assert_eq!(dead[1].headers["trace-id"], b"t-1-1");
    assert_eq!(
        error(&dead[1]),
        format!(
            "record {}-1 offset 1: KSTREAM-MAPVALUES-0000000002: the value says fail",
            s.input
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_fails_the_invocation_with_a_diagnostic_and_the_next_one_succeeds() {
    // No other poison; "boom" at partition 1 offset 1 panics the first time only.
    let data: Vec<Vec<&[u8]>> = vec![
        vec!["a".as_bytes(), "b".as_bytes()],
        vec!["c".as_bytes(), "boom".as_bytes(), "a".as_bytes()],
        vec!["b".as_bytes()],
    ];
    let s = setup_with("poison-panic", options(PoisonPolicy::Fail, false), 1, &data).await;
    let summary = run_to_end(s.config.clone(), s.function.clone()).await;
    assert_eq!(summary.failures, 1, "one failed invocation");
    assert_eq!(summary.records, 6);
    let calls = s.function.calls.lock().expect("calls").clone();
    let errors: Vec<&String> = calls.iter().filter_map(|(_, r)| r.as_ref().err()).collect();
    assert_eq!(
        errors,
        [&format!(
            "record {}-1 offset 1: user code panicked: boom in user code",
            s.input
        )],
        "the diagnostic names the record and the panic"
    );
    assert!(
        calls.last().expect("calls").1.is_ok(),
        "the next invocation succeeds"
    );
    let expected = reference(&data, None);
    assert_eq!(expected["boom"], 1);
    assert_eq!(
        table_counts(&s.table, STORE).await,
        expected,
        "exactly once"
    );
    assert_eq!(emitted_counts(&s.output), expected);
}

/// The real `wordcount` binary under `cargo lambda watch`, its poison policy and partial
/// batch responses from its environment (`LAMBDA_STREAMS_POISON_POLICY`,
/// `LAMBDA_STREAMS_PARTIAL_BATCH_RESPONSE`), driven by the runner over HTTP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wordcount_binary_dead_letters_by_its_environment_over_http() {
    require_services();
    let (input, output, dlq, failed, table) = (
        unique("http-poison-in"),
        unique("http-poison-out"),
        unique("http-poison-dlq"),
        unique("http-poison-failed"),
        unique("http-poison"),
    );
    for (topic, partitions) in [(&input, 2), (&output, 2), (&dlq, 1), (&failed, 1)] {
        admin::create_topic(&bootstrap(), topic, partitions)
            .await
            .expect("topic");
    }
    create_table(&dynamo_client(), &table).await.expect("table");
    let lines = sample_text(60, 3);
    produce_across_partitions(&input, &lines, 2).await;
    produce(
        &input,
        &[vec![
            &b"\xff\xfe not utf-8"[..],
            "after the poison".as_bytes(),
        ]],
    )
    .await;

    let mut env = emulator_env();
    env.extend([
        format!("LAMBDA_STREAMS_TABLE={table}"),
        format!("WORDCOUNT_INPUT_TOPIC={input}"),
        format!("WORDCOUNT_OUTPUT_TOPIC={output}"),
        "WORDCOUNT_REKEYING=direct".to_owned(),
        format!("LAMBDA_STREAMS_POISON_POLICY=dead-letter:{dlq}"),
        "LAMBDA_STREAMS_PARTIAL_BATCH_RESPONSE=true".to_owned(),
    ]);
    let port = free_port();
    let watch = LambdaWatch::start("wordcount", port, &env);
    let http: Arc<dyn Transport> =
        Arc::new(Http::new(&format!("http://127.0.0.1:{port}"), "wordcount").expect("endpoint"));
    let config = RunnerConfig {
        bootstrap_servers: bootstrap(),
        group_id: unique("http-poison-group"),
        topics: vec![input.clone()],
        batch_size: 40,
        batching_window: Duration::from_millis(200),
        until_idle: true,
        idle_timeout: Duration::from_millis(1500),
        retry_backoff: Duration::from_millis(50),
        // Were the policy ignored, the poison would end here after one retry.
        maximum_retry_attempts: Some(1),
        on_failure_topic: Some(failed.clone()),
        ..RunnerConfig::default()
    };
    let summary = tokio::time::timeout(
        Duration::from_secs(900),
        Runner::new(config, http).expect("runner").run(),
    )
    .await
    .expect("the runner finished")
    .expect("the runner succeeded");
    assert_eq!(summary.failures, 0);
    assert_eq!(summary.given_up, 0);
    assert!(read_topic(&failed).is_empty());
    let dead = read_topic(&dlq);
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].value.as_deref(), Some(&b"\xff\xfe not utf-8"[..]));
    assert_eq!(dead[0].headers["trace-id"], b"t-0-0");
    let source =
        String::from_utf8(dead[0].headers["lambda-streams-source"].clone()).expect("utf-8");
    assert!(source.starts_with(&format!("{input}:0:")), "{source}");
    let mut all = lines.clone();
    all.push("after the poison".to_owned());
    let expected = reference_counts(&all);
    assert_eq!(table_counts(&table, wordcount::STORE).await, expected);
    assert_eq!(emitted_counts(&output), expected);
    drop(watch);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_in_process_transport_forwards_partial_batch_responses() {
    let s = setup("poison-in-process", options(PoisonPolicy::Fail, true), 0).await;
    let transport = InProcess::new(s.function.handler.clone());
    let event = lambda_streams::event::KafkaEvent {
        source: lambda_streams::event::EventSource::SelfManaged,
        bootstrap_servers: bootstrap(),
        partitions: vec![lambda_streams::event::PartitionRecords {
            tp: lambda_streams::event::TopicPartition::new(&s.input, 0),
            records: vec![lambda_streams::event::Record {
                offset: 7,
                timestamp: 1,
                timestamp_type: lambda_streams::event::TimestampType::CreateTime,
                key: None,
                value: Some("fail".into()),
                headers: Vec::new(),
                key_schema_metadata: None,
                value_schema_metadata: None,
            }],
        }],
    };
    let body = transport.invoke(event.to_json()).await.expect("a response");
    let response: serde_json::Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(
        response,
        serde_json::json!({"batchItemFailures": [{"itemIdentifier": {"topic-partition": format!("{}-0", s.input), "offset": 7}}]})
    );
}
