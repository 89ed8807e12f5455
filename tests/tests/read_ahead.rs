//! Large batches deserialized ahead on two threads (`LAMBDA_STREAMS_DESERIALIZE_THREADS`,
//! `BatchOptions::deserialize_threads`), end to end: ~2 MB of JSON page views, some of them
//! not JSON, through the local runner on the real broker with duplicate deliveries and
//! longer retries injected, the engaged views counted per user in DynamoDB on the emulator
//! with the poison records skipped. The counts in the table and on the output topic equal
//! those computed here with `serde_json`, and the values were read on the framework's
//! read-ahead threads. Three times: on three partitions, on one (each large event then one
//! partition, decoded in chunks split between its records), and on three with the next
//! window of values read while the topology takes from this one
//! (`LAMBDA_STREAMS_OVERLAP_READING`, `BatchOptions::overlap_reading`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lambda_streams::dsl::Grouped;
use lambda_streams::lambda::Handler;
use lambda_streams::serdes::{DecimalI64, Json, ReadWith, Unit, Utf8, json};
use lambda_streams::{BatchOptions, PoisonPolicy, StreamsBuilder, Topology};
use lambda_streams_e2e::*;
use serde::{Deserialize, Serialize};

const PARTITIONS: i32 = 3;
const STORE: &str = "engaged-by-user";
const ENGAGED_MS: u32 = 30_000;

/// Values deserialized on the framework's read-ahead threads.
static READ_AHEAD: AtomicUsize = AtomicUsize::new(0);

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PageView {
    user_id: String,
    url: String,
    referrer: String,
    duration_ms: u32,
}

/// Engaged views counted per user; the value serde counts where it runs.
fn topology(input: &str, output: &str) -> Topology {
    let views = ReadWith::new(
        |bytes: &[u8]| {
            if std::thread::current().name() == Some("lambda-streams-read") {
                READ_AHEAD.fetch_add(1, Ordering::Relaxed);
            }
            json::from_slice::<PageView>(bytes)
        },
        Json::<PageView>::new(),
    );
    let builder = StreamsBuilder::new();
    builder
        .stream(input, Unit, views)
        .filter(|_, v| v.duration_ms >= ENGAGED_MS)
        .group_by(|_, v| v.user_id.clone(), Grouped::direct(Utf8))
        .count(STORE)
        .to_stream()
        .to(output, Utf8, DecimalI64);
    builder.build()
}

/// Deterministic page views of ~350 bytes; every 97th is cut short (not JSON).
fn views(n: usize, seed: u64) -> Vec<String> {
    let mut next = lcg(seed);
    (0..n)
        .map(|i| {
            let view = PageView {
                user_id: format!("user-{}", next() % 40),
                url: format!("/articles/{}/{}?utm_source=news", next(), "a".repeat(100)),
                referrer: format!("https://www.example.com/search?q={}", "b".repeat(120)),
                duration_ms: (next() % 60_000) as u32,
            };
            let json = serde_json::to_string(&view).expect("JSON");
            if i % 97 == 13 {
                json[..json.len() / 2].to_owned()
            } else {
                json
            }
        })
        .collect()
}

/// The engaged views per user, read with `serde_json`; values that are not JSON skipped.
fn reference(values: &[String]) -> BTreeMap<String, i64> {
    let mut counts = BTreeMap::new();
    for view in values
        .iter()
        .filter_map(|v| serde_json::from_str::<PageView>(v).ok())
    {
        if view.duration_ms >= ENGAGED_MS {
            *counts.entry(view.user_id).or_default() += 1;
        }
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_batches_read_ahead_on_two_threads_count_exactly_once() {
    count_exactly_once(PARTITIONS, "ra", false).await;
}

/// The same with the reading of the next window overlapping the topology.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_batches_read_ahead_while_the_topology_runs_count_exactly_once() {
    count_exactly_once(PARTITIONS, "rao", true).await;
}

/// The same on a topic of one partition: each event of a megabyte or more holds one
/// partition, decoded in chunks split between its records (on the machine's cores, two in
/// CI) as well as read ahead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_batches_of_one_partition_count_exactly_once() {
    count_exactly_once(1, "ra1", false).await;
}

/// Produces 6,000 views (≈ 2 MB) to a new topic of `partitions`, counts them through the
/// runner with redeliveries, and checks the table and the output against the reference.
async fn count_exactly_once(partitions: i32, name: &str, overlap_reading: bool) {
    require_services();
    let input = new_topic(&format!("{name}-views"), partitions).await;
    let output = new_topic(&format!("{name}-counts"), partitions).await;
    let values = views(6_000, 29);
    let bytes: usize = values.iter().map(String::len).sum();
    assert!(bytes > 1_500_000, "{bytes} bytes: batches above 256 KiB");
    produce_across_partitions(&input, &values, partitions).await;
    let expected = reference(&values);

    let (table, store) = exactly_once_store(&format!("{name}-read-ahead")).await;
    let store = Arc::new(store);
    let handler = Handler::with_kafka_output(topology(&input, &output), store, None).with_options(
        BatchOptions {
            poison: PoisonPolicy::Skip,
            deserialize_threads: 2,
            overlap_reading,
            ..BatchOptions::default()
        },
    );
    run_with_redeliveries(
        handler,
        vec![input.clone()],
        &format!("{name}-group"),
        4_000,
        Duration::from_secs(240),
    )
    .await;

    assert!(
        READ_AHEAD.load(Ordering::Relaxed) > 0,
        "values were deserialized on the read-ahead threads"
    );
    assert_eq!(table_counts(&table, STORE).await, expected, "the table");
    assert_eq!(
        emitted_counts(&output),
        expected,
        "the output topic, by version"
    );
}
