//! Failures in a Lambda handler, end to end on the DynamoDB emulator and the real broker:
//! partial batch responses, every poison-record policy (deserialization errors, user
//! errors and panics in user code), and the EMF metrics checked against the batch.

use std::collections::BTreeMap;
use std::sync::Arc;

use lambda_streams::dsl::Grouped;
use lambda_streams::event::{
    EventSource, KafkaEvent, PartitionRecords, Record, TimestampType, TopicPartition,
};
use lambda_streams::lambda::Handler;
use lambda_streams::serdes::{DecimalI64, Unit, Utf8};
use lambda_streams::sink::{KafkaSink, MemorySink, Sink};
use lambda_streams::state::Store;
use lambda_streams::{BatchOptions, PoisonPolicy, StreamError, StreamsBuilder, Topology};
use lambda_streams_e2e::*;

const TOPIC: &str = "events";
const STORE: &str = "counts";

/// Counts values; the value "boom" makes user code panic, "fail" makes it return an error.
fn topology() -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream(TOPIC, Unit, Utf8)
        .map_values(|v: String| {
            if v == "boom" {
                panic!("boom in user code")
            } else {
                v
            }
        })
        .group_by(|_, v| v.clone(), Grouped::direct(Utf8))
        .count(STORE)
        .to_stream()
        .to("counts-out", Utf8, DecimalI64);
    builder.build()
}

/// An event: per partition, the values from offset 0 (`None` bytes: invalid UTF-8).
fn event(partitions: &[&[Option<&str>]]) -> KafkaEvent {
    KafkaEvent {
        source: EventSource::SelfManaged,
        bootstrap_servers: bootstrap(),
        partitions: partitions
            .iter()
            .enumerate()
            .map(|(p, values)| PartitionRecords {
                tp: TopicPartition::new(TOPIC, p as i32),
                records: values
                    .iter()
                    .enumerate()
                    .map(|(o, v)| Record {
                        offset: o as i64,
                        timestamp: 1_000 + o as i64,
                        timestamp_type: TimestampType::CreateTime,
                        key: None,
                        value: Some(v.map_or(vec![0xc3, 0x28], |s| s.as_bytes().to_vec()).into()),
                        headers: Vec::new(),
                        key_schema_metadata: None,
                        value_schema_metadata: None,
                    })
                    .collect(),
            })
            .collect(),
    }
}

fn counts(pairs: &[(&str, i64)]) -> BTreeMap<String, i64> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

async fn handler(options: BatchOptions, sink: Arc<dyn Sink>) -> (Handler, String) {
    require_services();
    let (table, store) = exactly_once_store("failures").await;
    let store: Arc<dyn Store> = Arc::new(store);
    (
        Handler::new(topology(), store, sink).with_options(options),
        table,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partial_batch_response_commits_what_came_before_and_names_the_failed_record() {
    let options = BatchOptions {
        poison: PoisonPolicy::Fail,
        partial_batch_response: true,
        ..BatchOptions::default()
    };
    let (handler, table) = handler(options, Arc::new(MemorySink::new())).await;
    let batch = event(&[
        &[Some("a"), Some("b"), Some("a"), None, Some("a")],
        &[Some("b"), Some("c")],
    ]);
    let response = handler
        .invoke_json(&batch.to_json())
        .await
        .expect("a partial success");
    assert_eq!(
        response,
        serde_json::json!({"batchItemFailures": [{"itemIdentifier": {"topic-partition": "events-0", "offset": 3}}]})
    );
    // Partition 0 up to offset 2, and all of partition 1.
    assert_eq!(
        table_counts(&table, STORE).await,
        counts(&[("a", 2), ("b", 2), ("c", 1)])
    );
    // Lambda resumes partition 0 from offset 3 (the poison fails again); a full redelivery
    // of the first batch changes nothing that was already applied.
    handler.invoke_json(&batch.to_json()).await.expect("again");
    assert_eq!(
        table_counts(&table, STORE).await,
        counts(&[("a", 2), ("b", 2), ("c", 1)])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_partial_responses_a_poison_record_fails_the_whole_batch() {
    let (handler, table) = handler(BatchOptions::default(), Arc::new(MemorySink::new())).await;
    let batch = event(&[&[Some("a"), None], &[Some("b")]]);
    let error = handler
        .invoke_json(&batch.to_json())
        .await
        .expect_err("fails");
    assert_eq!(
        error.to_string(),
        "record events-0 offset 1: cannot deserialize the value: invalid UTF-8: invalid utf-8 sequence of 1 bytes from index 0"
    );
    assert!(
        table_counts(&table, STORE).await.is_empty(),
        "nothing applied"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skip_policy_counts_and_skips_poison_records() {
    let options = BatchOptions {
        poison: PoisonPolicy::Skip,
        partial_batch_response: false,
        ..BatchOptions::default()
    };
    let (handler, table) = handler(options, Arc::new(MemorySink::new())).await;
    let batch = event(&[&[Some("a"), None, Some("boom"), Some("a")]]);
    let outcome = handler.handle_json(&batch.to_json()).await.expect("skips");
    assert_eq!(
        (outcome.report.poison_records, outcome.report.records_in),
        (2, 2)
    );
    assert_eq!(table_counts(&table, STORE).await, counts(&[("a", 2)]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_user_code_fails_the_invocation_and_the_next_one_succeeds() {
    let (handler, table) = handler(BatchOptions::default(), Arc::new(MemorySink::new())).await;
    let error = handler
        .invoke_json(&event(&[&[Some("a"), Some("boom")]]).to_json())
        .await
        .expect_err("panics");
    assert!(
        matches!(error, StreamError::User { offset: 1, .. }),
        "{error}"
    );
    assert_eq!(
        error.to_string(),
        "record events-0 offset 1: user code panicked: boom in user code"
    );
    let diagnostic = lambda_runtime::Diagnostic::from(error);
    assert_eq!(diagnostic.error_type, "UserFunctionError");
    // The runtime is still up: the next invocation of the same handler succeeds.
    handler
        .invoke_json(&event(&[&[Some("a"), Some("c")]]).to_json())
        .await
        .expect("next one");
    assert_eq!(
        table_counts(&table, STORE).await,
        counts(&[("a", 1), ("c", 1)])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letter_policy_produces_the_record_with_its_error_and_source() {
    let dlq = unique("dead-letters");
    let output = unique("failures-out");
    local_runner::admin::create_topic(&bootstrap(), &dlq, 1)
        .await
        .expect("dlq topic");
    local_runner::admin::create_topic(&bootstrap(), &output, 1)
        .await
        .expect("output topic");
    let options = BatchOptions {
        poison: PoisonPolicy::DeadLetter { topic: dlq.clone() },
        partial_batch_response: false,
        ..BatchOptions::default()
    };
    let sink: Arc<dyn Sink> = Arc::new(KafkaSink::new(&bootstrap(), &[]).expect("producer"));
    require_services();
    let (table, store) = exactly_once_store("failures").await;
    let store: Arc<dyn Store> = Arc::new(store);
    let builder = StreamsBuilder::new();
    builder
        .stream(TOPIC, Unit, Utf8)
        .group_by(|_, v| v.clone(), Grouped::direct(Utf8))
        .count(STORE)
        .to_stream()
        .to(&output, Utf8, DecimalI64);
    let handler = Handler::new(builder.build(), store, sink).with_options(options);

    let batch = event(&[&[Some("a"), None, Some("a")], &[Some("b")]]);
    let outcome = handler
        .handle_json(&batch.to_json())
        .await
        .expect("dead-letters and goes on");
    assert_eq!(outcome.report.dead_lettered, 1);
    assert_eq!(
        table_counts(&table, STORE).await,
        counts(&[("a", 2), ("b", 1)])
    );
    let dead = read_topic(&dlq);
    assert_eq!(dead.len(), 1);
    assert_eq!(
        dead[0].value.as_deref(),
        Some(&[0xc3, 0x28][..]),
        "the original bytes"
    );
    assert_eq!(dead[0].headers["lambda-streams-source"], b"events:0:1");
    let error = String::from_utf8(dead[0].headers["lambda-streams-error"].clone()).expect("utf-8");
    assert!(
        error.starts_with("record events-0 offset 1: cannot deserialize the value"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emf_metrics_match_the_batch() {
    let (handler, _) = handler(BatchOptions::default(), Arc::new(MemorySink::new())).await;
    let values = ["a", "b", "a", "c", "a", "d"];
    let batch = event(&[&values.map(Some)[..4], &values.map(Some)[4..]]);
    let outcome = handler.handle_event(&batch).await.expect("batch");
    let documents: Vec<serde_json::Value> =
        lambda_streams::metrics::emf_documents("wordcount", &batch, &outcome.report)
            .into_iter()
            .map(|d| serde_json::from_str(&d.to_string()).expect("valid JSON"))
            .collect();
    let main = &documents[0];
    assert_eq!(
        main["_aws"]["CloudWatchMetrics"][0]["Namespace"],
        "lambda-streams"
    );
    assert_eq!(main["FunctionName"], "wordcount");
    // Independent expectations: 6 records, 4 distinct values, one write each, 4 updates out.
    assert_eq!(main["RecordsIn"], 6.0);
    assert_eq!(main["StateItems"], 4.0);
    assert_eq!(main["DynamoDbRequests"], 4.0);
    assert_eq!(main["RecordsOut"], 4.0);
    assert_eq!(main["PoisonRecords"], 0.0);
    let names: Vec<&str> = main["_aws"]["CloudWatchMetrics"][0]["Metrics"]
        .as_array()
        .expect("metrics")
        .iter()
        .map(|m| m["Name"].as_str().expect("name"))
        .collect();
    for name in &names {
        assert!(main.get(*name).is_some(), "metric {name} has a value");
    }
    assert_eq!(documents[1]["Topic"], TOPIC);
    assert_eq!(documents[1]["TopicRecordsIn"], 6);
}
