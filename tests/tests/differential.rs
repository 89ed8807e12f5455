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
    EventSource, Header, KafkaEvent, PartitionRecords, Record, TimestampType, TopicPartition,
};
use lambda_streams::lambda::Handler;
use lambda_streams::serdes::{DecimalI64, Json, Unit, Utf8};
use lambda_streams::sink::{MemorySink, OutputRecord, VERSION_HEADER};
use lambda_streams::{StreamsBuilder, Topology};
use lambda_streams_e2e::*;
use local_runner::{InProcess, Runner, RunnerConfig, admin};

const PARTITIONS: i32 = 3;
const COUNTS: &str = "word-counts";
const LONGEST: &str = "longest-by-initial";

/// The repartition topics of the topology in repartition mode (`None`: direct mode).
type Rekeying<'a> = Option<(&'a str, &'a str)>;

/// Word counts, and (from the same stream) the longest word per initial letter: two
/// stores, an additive one and a general aggregate; re-keyed directly, or (the default for
/// updates that go to a topic) through the two repartition topics of `rekeying`.
fn topology(input: &str, counts_out: &str, longest_out: &str, rekeying: Rekeying) -> Topology {
    let grouped = |topic: Option<&str>| match topic {
        Some(topic) => Grouped::with(Utf8, Utf8).with_topic(topic),
        None => Grouped::direct(Utf8),
    };
    let builder = StreamsBuilder::new();
    let words = builder
        .stream(input, Unit, Utf8)
        .flat_map_values(|line: String| {
            line.split_whitespace()
                .map(str::to_lowercase)
                .collect::<Vec<_>>()
        });
    words
        .group_by(|_, w| w.clone(), grouped(rekeying.map(|r| r.0)))
        .count(COUNTS)
        .to_stream()
        .to(counts_out, Utf8, DecimalI64);
    words
        .group_by(
            |_, w: &String| w.chars().take(1).collect::<String>(),
            grouped(rekeying.map(|r| r.1)),
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
    let topology = builder.build();
    assert_eq!(
        topology.repartition_topics().len(),
        if rekeying.is_some() { 2 } else { 0 }
    );
    topology
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

/// The records of the output topics (not of the repartition topics).
fn outputs(records: Vec<OutputRecord>, counts_out: &str, longest_out: &str) -> Outputs {
    latest(
        records
            .into_iter()
            .filter(|r| r.topic == counts_out || r.topic == longest_out),
    )
}

fn driver_run(
    lines: &[String],
    input: &str,
    counts_out: &str,
    longest_out: &str,
    rekeying: Rekeying<'_>,
) -> Outputs {
    let driver = TestDriver::new(topology(input, counts_out, longest_out, rekeying));
    let mut topic = driver.input_topic(input, Unit, Utf8);
    for (p, part) in partitioned(lines).into_iter().enumerate() {
        for line in part {
            topic
                .pipe_to_partition(p as i32, (), line)
                .expect("driver batch");
        }
    }
    outputs(driver.produced(), counts_out, longest_out)
}

/// A Kafka record as an event record at `offset` (timestamp and headers kept).
fn event_record(
    offset: i64,
    key: Option<Vec<u8>>,
    value: Vec<u8>,
    headers: Vec<Header>,
    timestamp: i64,
) -> Record {
    Record {
        offset,
        timestamp,
        timestamp_type: TimestampType::CreateTime,
        key: key.map(Into::into),
        value: Some(value.into()),
        headers,
        key_schema_metadata: None,
        value_schema_metadata: None,
    }
}

async fn handler_run(
    lines: &[String],
    input: &str,
    counts_out: &str,
    longest_out: &str,
    rekeying: Rekeying<'_>,
) -> Outputs {
    let store = Arc::new(exactly_once_store("diff-handler").await.1);
    let sink = Arc::new(MemorySink::new());
    let handler = Handler::new(
        topology(input, counts_out, longest_out, rekeying),
        store,
        sink.clone(),
    );
    let event = |partitions| KafkaEvent {
        source: EventSource::SelfManaged,
        bootstrap_servers: bootstrap(),
        partitions,
    };
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
                    .map(|o| {
                        let line = part[o].clone().into_bytes();
                        event_record(o as i64, None, line, Vec::new(), 1_000 + o as i64)
                    })
                    .collect(),
            })
            .collect();
        handler
            .handle_json(&event(partitions).to_json())
            .await
            .expect("handler batch");
    }
    // Repartition mode: what the batches produced to the repartition topics comes back as
    // a second event source would deliver it (each key in one partition, in order), until
    // nothing new is produced there.
    let Some((counts_rp, longest_rp)) = rekeying else {
        return outputs(sink.records(), counts_out, longest_out);
    };
    let (mut consumed, mut next_offset) = (0, BTreeMap::<(String, i32), i64>::new());
    loop {
        let produced = sink.records();
        let fresh: Vec<OutputRecord> = produced[consumed..]
            .iter()
            .filter(|r| r.topic == counts_rp || r.topic == longest_rp)
            .cloned()
            .collect();
        consumed = produced.len();
        if fresh.is_empty() {
            break;
        }
        let mut by_partition: BTreeMap<(String, i32), Vec<Record>> = BTreeMap::new();
        for r in fresh {
            let key = r.key.clone().expect("a repartitioned key");
            let partition =
                (key.iter().map(|&b| u32::from(b)).sum::<u32>() % PARTITIONS as u32) as i32;
            let tp = (r.topic.clone(), partition);
            let offset = next_offset.entry(tp.clone()).or_insert(0);
            let headers = r
                .headers
                .iter()
                .map(|(name, value)| Header::new(name.as_str(), value.clone()))
                .collect();
            let record = event_record(
                *offset,
                Some(key),
                r.value.clone().expect("value"),
                headers,
                r.timestamp.unwrap_or(0),
            );
            *offset += 1;
            by_partition.entry(tp).or_default().push(record);
        }
        let partitions = by_partition
            .into_iter()
            .map(|((topic, partition), records)| PartitionRecords {
                tp: TopicPartition::new(&topic, partition),
                records,
            })
            .collect();
        handler
            .handle_json(&event(partitions).to_json())
            .await
            .expect("repartition batch");
    }
    outputs(sink.records(), counts_out, longest_out)
}

async fn runner_run(
    lines: &[String],
    input: &str,
    counts_out: &str,
    longest_out: &str,
    rekeying: Rekeying<'_>,
) -> Outputs {
    let servers = bootstrap();
    let mut topics = vec![input.to_owned()];
    if let Some((counts_rp, longest_rp)) = rekeying {
        topics.extend([counts_rp.to_owned(), longest_rp.to_owned()]);
    }
    for topic in topics
        .iter()
        .map(String::as_str)
        .chain([counts_out, longest_out])
    {
        admin::create_topic(&servers, topic, PARTITIONS)
            .await
            .expect("topic");
    }
    produce_across_partitions(input, lines, PARTITIONS).await;
    let store = Arc::new(exactly_once_store("diff-runner").await.1);
    let handler = Handler::with_kafka_output(
        topology(input, counts_out, longest_out, rekeying),
        store,
        None,
    );
    let config = RunnerConfig {
        bootstrap_servers: servers,
        group_id: unique("diff-group"),
        topics,
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

/// Runs the three runtimes on one input and checks them against the reference.
async fn agree(rekeying: Option<(String, String)>, seed: u64) {
    require_services();
    let lines = sample_text(240, seed);
    let (input, counts_out, longest_out) = (
        unique("diff-lines"),
        unique("diff-counts"),
        unique("diff-longest"),
    );
    let rekeying = rekeying.as_ref().map(|(a, b)| (a.as_str(), b.as_str()));
    let expected = reference(&lines, &counts_out, &longest_out);
    let driver = driver_run(&lines, &input, &counts_out, &longest_out, rekeying);
    assert_eq!(driver, expected, "test driver");
    let handler = handler_run(&lines, &input, &counts_out, &longest_out, rekeying).await;
    assert_eq!(handler, expected, "Lambda handler on the emulator");
    let runner = runner_run(&lines, &input, &counts_out, &longest_out, rekeying).await;
    assert_eq!(runner, expected, "local runner on the broker");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn driver_handler_and_runner_agree() {
    agree(None, 99).await;
}

/// The same in repartition mode (the default of `group_by` when updates go to a topic):
/// the driver reads the repartition topics back itself, the handler gets their records as
/// a second event source would deliver them, the runner consumes them from the broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn driver_handler_and_runner_agree_in_repartition_mode() {
    let topics = (unique("diff-words-rp"), unique("diff-initials-rp"));
    agree(Some(topics), 101).await;
}
