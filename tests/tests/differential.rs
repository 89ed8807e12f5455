//! The differential test: one topology and one input through the three runtimes the
//! design promises will agree (design notes, section 1): the in-memory test driver, the
//! Lambda handler on batch events with its state in DynamoDB on the emulator, and the local
//! runner on the real broker. The final state and, per key, the update with the highest
//! version must be identical across the three, and equal to a reference computed here.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use lambda_streams::driver::TestDriver;
use lambda_streams::dsl::Grouped;
use lambda_streams::event::{
    EventSource, KafkaEvent, PartitionRecords, Record, TimestampType, TopicPartition,
};
use lambda_streams::lambda::Handler;
use lambda_streams::serdes::{DecimalI64, Json, Unit, Utf8};
use lambda_streams::sink::{MemorySink, OutputRecord, VERSION_HEADER};
use lambda_streams::state::dynamodb::{DynamoStore, create_table};
use lambda_streams::{Guarantee, StreamsBuilder, Topology};
use lambda_streams_e2e::*;
use local_runner::{InProcess, Runner, RunnerConfig, admin};

const PARTITIONS: i32 = 3;
const COUNTS: &str = "word-counts";
const LONGEST: &str = "longest-by-initial";

/// Word counts, and (from the same stream) the longest word per initial letter: two
/// stores, an additive one and a general aggregate.
fn topology(input: &str, counts_out: &str, longest_out: &str) -> Topology {
    let builder = StreamsBuilder::new();
    let words = builder
        .stream(input, Unit, Utf8)
        .flat_map_values(|line: String| {
            line.split_whitespace()
                .map(str::to_lowercase)
                .collect::<Vec<_>>()
        });
    words
        .group_by(|_, w| w.clone(), Grouped::direct(Utf8))
        .count(COUNTS)
        .to_stream()
        .to(counts_out, Utf8, DecimalI64);
    words
        .group_by(
            |_, w: &String| w.chars().take(1).collect::<String>(),
            Grouped::direct(Utf8),
        )
        .reduce(
            LONGEST,
            |best: String, w: String| {
                if (w.len(), &w) > (best.len(), &best) {
                    w
                } else {
                    best
                }
            },
            Utf8,
        )
        .to_stream()
        .to(longest_out, Utf8, Json::<String>::default());
    builder.build()
}

/// What a runtime ended with: per output topic, the highest-version value per key.
type Outputs = BTreeMap<String, BTreeMap<String, String>>;

fn latest(records: impl IntoIterator<Item = OutputRecord>) -> Outputs {
    let mut best: BTreeMap<(String, String), (u64, String)> = BTreeMap::new();
    for r in records {
        let key = String::from_utf8(r.key.clone().expect("key")).expect("utf-8");
        let version: u64 = std::str::from_utf8(r.header(VERSION_HEADER).expect("version"))
            .expect("utf-8")
            .parse()
            .expect("n");
        let value = String::from_utf8(r.value.clone().expect("value")).expect("utf-8");
        let entry = best
            .entry((r.topic.clone(), key))
            .or_insert((0, String::new()));
        if version > entry.0 {
            *entry = (version, value);
        }
    }
    let mut out = Outputs::new();
    for ((topic, key), (_, value)) in best {
        out.entry(topic).or_default().insert(key, value);
    }
    out
}

/// The reference, computed without the framework.
fn reference(lines: &[String], counts_out: &str, longest_out: &str) -> Outputs {
    let counts = reference_counts(lines);
    let mut longest: BTreeMap<String, String> = BTreeMap::new();
    for word in counts.keys() {
        let initial: String = word.chars().take(1).collect();
        let best = longest.entry(initial).or_default();
        if (word.len(), word) > (best.len(), &*best) {
            *best = word.clone();
        }
    }
    Outputs::from([
        (
            counts_out.to_owned(),
            counts
                .into_iter()
                .map(|(k, v)| (k, v.to_string()))
                .collect(),
        ),
        (
            longest_out.to_owned(),
            longest
                .into_iter()
                .map(|(k, v)| (k, format!("{v:?}")))
                .collect(),
        ),
    ])
}

/// Line i goes to partition i mod 3, as `produce_across_partitions` does.
fn partitioned(lines: &[String]) -> Vec<Vec<String>> {
    (0..PARTITIONS as usize)
        .map(|p| {
            lines
                .iter()
                .skip(p)
                .step_by(PARTITIONS as usize)
                .cloned()
                .collect()
        })
        .collect()
}

fn driver_run(lines: &[String], input: &str, counts_out: &str, longest_out: &str) -> Outputs {
    let driver = TestDriver::new(topology(input, counts_out, longest_out));
    let mut topic = driver.input_topic(input, Unit, Utf8);
    for (p, part) in partitioned(lines).into_iter().enumerate() {
        for line in part {
            topic
                .pipe_to_partition(p as i32, (), line)
                .expect("driver batch");
        }
    }
    latest(driver.produced())
}

async fn handler_run(
    lines: &[String],
    input: &str,
    counts_out: &str,
    longest_out: &str,
) -> Outputs {
    let table = unique("diff-handler");
    create_table(&dynamo_client(), &table).await.expect("table");
    let store = Arc::new(DynamoStore::new(
        dynamo_client(),
        table,
        Guarantee::ExactlyOnce,
    ));
    let sink = Arc::new(MemorySink::new());
    let handler = Handler::new(
        topology(input, counts_out, longest_out),
        store,
        sink.clone(),
    );
    // Batches of up to 25 records from every partition, as the event source would form them.
    let parts = partitioned(lines);
    let longest = parts.iter().map(Vec::len).max().unwrap_or(0);
    for lo in (0..longest).step_by(25) {
        let partitions = parts
            .iter()
            .enumerate()
            .filter(|(_, part)| lo < part.len())
            .map(|(p, part)| PartitionRecords {
                tp: TopicPartition::new(input, p as i32),
                records: (lo..(lo + 25).min(part.len()))
                    .map(|o| Record {
                        offset: o as i64,
                        timestamp: 1_000 + o as i64,
                        timestamp_type: TimestampType::CreateTime,
                        key: None,
                        value: Some(part[o].clone().into_bytes()),
                        headers: Vec::new(),
                        key_schema_metadata: None,
                        value_schema_metadata: None,
                    })
                    .collect(),
            })
            .collect();
        let event = KafkaEvent {
            source: EventSource::SelfManaged,
            bootstrap_servers: bootstrap(),
            partitions,
        };
        handler
            .handle_json(&event.to_json())
            .await
            .expect("handler batch");
    }
    latest(sink.records())
}

async fn runner_run(lines: &[String], input: &str, counts_out: &str, longest_out: &str) -> Outputs {
    let servers = bootstrap();
    for topic in [input, counts_out, longest_out] {
        admin::create_topic(&servers, topic, PARTITIONS)
            .await
            .expect("topic");
    }
    produce_across_partitions(input, lines, PARTITIONS).await;
    let table = unique("diff-runner");
    create_table(&dynamo_client(), &table).await.expect("table");
    let store = Arc::new(DynamoStore::new(
        dynamo_client(),
        table,
        Guarantee::ExactlyOnce,
    ));
    let handler = Handler::with_kafka_output(topology(input, counts_out, longest_out), store, None);
    let config = RunnerConfig {
        bootstrap_servers: servers,
        group_id: unique("diff-group"),
        topics: vec![input.to_owned()],
        batch_size: 30,
        batching_window: Duration::from_millis(100),
        until_idle: true,
        idle_timeout: Duration::from_millis(500),
        ..RunnerConfig::default()
    };
    let runner = Runner::new(config, Arc::new(InProcess::new(Arc::new(handler)))).expect("runner");
    tokio::time::timeout(Duration::from_secs(180), runner.run())
        .await
        .expect("in time")
        .expect("runner");
    let mut records = Vec::new();
    for topic in [counts_out, longest_out] {
        for r in read_topic(topic) {
            records.push(OutputRecord {
                topic: topic.to_owned(),
                key: r.key,
                value: r.value,
                headers: r.headers.into_iter().collect(),
                timestamp: None,
            });
        }
    }
    latest(records)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn driver_handler_and_runner_agree() {
    require_services();
    let lines = sample_text(240, 99);
    let (input, counts_out, longest_out) = (
        unique("diff-lines"),
        unique("diff-counts"),
        unique("diff-longest"),
    );
    let expected = reference(&lines, &counts_out, &longest_out);
    let driver = driver_run(&lines, &input, &counts_out, &longest_out);
    assert_eq!(driver, expected, "test driver");
    let handler = handler_run(&lines, &input, &counts_out, &longest_out).await;
    assert_eq!(handler, expected, "Lambda handler on the emulator");
    let runner = runner_run(&lines, &input, &counts_out, &longest_out).await;
    assert_eq!(runner, expected, "local runner on the broker");
}
