//! The claims of `docs/guarantees.md` that no other test states: the DynamoDB requests a
//! batch costs, per state kind, counted on the wire (a proxy in front of the emulator counts
//! every request by its operation), against counts worked out by hand from the write path's
//! design (`docs/state.md`); and what `at_least_once` changes (the additive count only).
//!
//! Each test runs the real `Topology::process` on the real `DynamoStore` against dynoxide.

use std::collections::BTreeMap;
use std::time::Duration;

use lambda_streams::dsl::{EmitStrategy, SessionWindows, TimeWindows};
use lambda_streams::event::{
    EventSource, KafkaEvent, PartitionRecords, Record, TimestampType, TopicPartition,
};
use lambda_streams::serdes::{DecimalI64, Utf8};
use lambda_streams::sink::MemorySink;
use lambda_streams::state::dynamodb::{DynamoStore, create_table, emulator_client};
use lambda_streams::{
    BatchOptions, BatchReport, Guarantee, PoisonPolicy, StreamsBuilder, Topology,
};
use lambda_streams_e2e::*;

/// A base event time (2025-12-01T00:00:00Z): windows of a minute start on it.
const BASE: i64 = 1_764_547_200_000;

/// A batch of one topic-partition: `(key, value, timestamp)` at offsets from `first`.
fn event(topic: &str, partition: i32, first: i64, records: &[(&str, &str, i64)]) -> KafkaEvent {
    KafkaEvent {
        source: EventSource::SelfManaged,
        bootstrap_servers: "127.0.0.1:9092".into(),
        partitions: vec![PartitionRecords {
            tp: TopicPartition::new(topic, partition),
            records: records
                .iter()
                .enumerate()
                .map(|(i, (key, value, timestamp))| Record {
                    offset: first + i as i64,
                    timestamp: *timestamp,
                    timestamp_type: TimestampType::CreateTime,
                    key: Some(key.as_bytes().to_vec().into()),
                    value: Some(value.as_bytes().to_vec().into()),
                    headers: Vec::new(),
                    key_schema_metadata: None,
                    value_schema_metadata: None,
                })
                .collect(),
        }],
    }
}

/// A fresh table, and a store on it whose requests go through a counting proxy.
async fn counted_store(guarantee: Guarantee) -> (DynamoStore, ThrottlingProxy, String) {
    require_services();
    let table = unique("guarantees");
    create_table(&emulator_client(&dynamo_endpoint()), &table)
        .await
        .expect("table");
    let proxy =
        ThrottlingProxy::start(dynamo_endpoint().trim_start_matches("http://"), |_| false).await;
    let store = DynamoStore::new(
        emulator_client(&format!("http://127.0.0.1:{}", proxy.port)),
        table.clone(),
        guarantee,
    );
    (store, proxy, table)
}

/// Runs one batch; returns its report and the requests it sent, per operation.
async fn batch(
    topology: &Topology,
    event: &KafkaEvent,
    store: &DynamoStore,
    proxy: &ThrottlingProxy,
) -> (BatchReport, BTreeMap<String, u64>) {
    let before = proxy.operations();
    let report = topology
        .process(event, store, &MemorySink::new())
        .await
        .expect("batch");
    let mut sent = proxy.operations();
    for (operation, n) in before {
        let count = sent.entry(operation).or_insert(0);
        *count -= n;
    }
    sent.retain(|_, n| *n > 0);
    (report, sent)
}

fn ops(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
    pairs.iter().map(|(op, n)| (op.to_string(), *n)).collect()
}

fn counts() -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream("events", Utf8, Utf8)
        .group_by_key(Utf8)
        .count("counts")
        .to_stream()
        .to("counts-out", Utf8, DecimalI64);
    builder.build()
}

/// Six records of three keys.
fn three_keys() -> Vec<(&'static str, &'static str, i64)> {
    ["a", "b", "a", "c", "b", "a"]
        .iter()
        .enumerate()
        .map(|(i, k)| (*k, "x", BASE + i as i64))
        .collect()
}

/// A count: one `UpdateItem` per touched key, nothing else (no clock: nothing is windowed);
/// the same batch again: one refused `UpdateItem` per key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_count_costs_one_update_per_touched_key() {
    let (store, proxy, _) = counted_store(Guarantee::ExactlyOnce).await;
    let (topology, batch_of) = (counts(), event("events", 0, 0, &three_keys()));
    let (report, sent) = batch(&topology, &batch_of, &store, &proxy).await;
    assert_eq!(sent, ops(&[("UpdateItem", 3)]));
    assert_eq!(report.items_touched, 3);
    let (again, sent) = batch(&topology, &batch_of, &store, &proxy).await;
    assert_eq!(sent, ops(&[("UpdateItem", 3)]));
    assert_eq!(again.state.conditional_failures, 3);
}

/// `at_least_once` writes the count without conditions: the same cost, and a redelivered
/// batch counts again (a: 3 → 6). A general aggregate keeps its version-conditioned fold
/// under it: the redelivery adds nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_least_once_counts_a_redelivery_again_and_keeps_general_aggregates_exact() {
    let (store, proxy, table) = counted_store(Guarantee::AtLeastOnce).await;
    let builder = StreamsBuilder::new();
    let events = builder.stream("events", Utf8, Utf8);
    events
        .group_by_key(Utf8)
        .count("counts")
        .to_stream()
        .to("counts-out", Utf8, DecimalI64);
    events
        .group_by_key(Utf8)
        .aggregate("sums", || 0i64, |_, _v: String, n: i64| n + 1, DecimalI64)
        .to_stream()
        .to("sums-out", Utf8, DecimalI64);
    let topology = builder.build();
    let batch_of = event("events", 0, 0, &three_keys());
    let (_, sent) = batch(&topology, &batch_of, &store, &proxy).await;
    assert_eq!(sent, ops(&[("UpdateItem", 6)]), "3 counts and 3 new sums");
    // The redelivery: the counts' unconditional ADDs only. The sums are cached as this
    // container wrote them, with their watermarks: nothing of the batch is new for them, so
    // nothing is sent.
    let (_, sent) = batch(&topology, &batch_of, &store, &proxy).await;
    assert_eq!(sent, ops(&[("UpdateItem", 3)]));
    assert_eq!(
        table_counts(&table, "counts").await,
        BTreeMap::from([("a".into(), 6), ("b".into(), 4), ("c".into(), 2)]),
        "at least once: the redelivered batch counted again"
    );
    let sums: BTreeMap<String, i64> = ["a", "b", "c"]
        .into_iter()
        .zip([3, 2, 1])
        .map(|(k, n)| (k.to_owned(), n))
        .collect();
    let stored = store_values(&store, "sums", &["a", "b", "c"]).await;
    assert_eq!(stored, sums, "the general aggregate stays exact");
}

/// The values of `keys` in the general-aggregate store `store` (decimal text).
async fn store_values(store: &DynamoStore, name: &str, keys: &[&str]) -> BTreeMap<String, i64> {
    use lambda_streams::state::Store;
    let mut out = BTreeMap::new();
    for key in keys {
        let state = store
            .get(name, key.as_bytes())
            .await
            .expect("read")
            .expect("an item");
        let bytes = state.aggregate.expect("an aggregate");
        let value = std::str::from_utf8(&bytes)
            .expect("utf-8")
            .parse()
            .expect("decimal");
        out.insert(key.to_string(), value);
    }
    out
}

/// A windowed count, emitted on update: one `UpdateItem` per touched (key, window), plus the
/// stream-time clock: one `GetItem` (read once per batch) and one `UpdateItem` per source
/// partition whose stream time advanced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_windowed_count_costs_one_update_per_window_plus_the_clock() {
    let (store, proxy, _) = counted_store(Guarantee::ExactlyOnce).await;
    let builder = StreamsBuilder::new();
    builder
        .stream("events", Utf8, Utf8)
        .group_by_key(Utf8)
        .windowed_by(TimeWindows::of_size(Duration::from_secs(60)).grace(Duration::from_secs(600)))
        .count("per-minute")
        .to_stream()
        .map(|w, n| (format!("{}@{}", w.key, w.start), n))
        .to("per-minute-out", Utf8, DecimalI64);
    let topology = builder.build();
    // Two keys in two windows each: 4 window items.
    let records = [
        ("a", "x", BASE + 1_000),
        ("b", "x", BASE + 2_000),
        ("a", "x", BASE + 3_000),
        ("a", "x", BASE + 61_000),
        ("b", "x", BASE + 62_000),
    ];
    let (report, sent) = batch(&topology, &event("events", 0, 0, &records), &store, &proxy).await;
    assert_eq!(report.items_touched, 4);
    assert_eq!(sent, ops(&[("GetItem", 1), ("UpdateItem", 4 + 1)]));
}

/// Emit on close: every batch pays, beyond the windowed count's requests, a second clock
/// read, one `Query` of the `closing` index and one `UpdateItem` that moves the store's
/// closed time forward (`c:<store>`, also when nothing closes); a batch that closes windows
/// also one strongly consistent `BatchGetItem` (up to 100 windows) and one `UpdateItem` per
/// closed window (out of the index).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emit_on_close_costs_a_query_a_read_and_a_write_per_closed_window() {
    let (store, proxy, _) = counted_store(Guarantee::ExactlyOnce).await;
    let builder = StreamsBuilder::new();
    builder
        .stream("events", Utf8, Utf8)
        .group_by_key(Utf8)
        .windowed_by(TimeWindows::of_size(Duration::from_secs(60)).grace(Duration::from_secs(10)))
        .emit_strategy(EmitStrategy::OnWindowClose)
        .count("final-per-minute")
        .to_stream()
        .map(|w, n| (format!("{}@{}", w.key, w.start), n))
        .to("final-out", Utf8, DecimalI64);
    let topology = builder.build();
    // Batch 1: a, b and c in [0, 60 s): three window items, nothing closes.
    let first = [
        ("a", "x", BASE + 1_000),
        ("b", "x", BASE + 2_000),
        ("c", "x", BASE + 3_000),
    ];
    let (report, sent) = batch(&topology, &event("events", 0, 0, &first), &store, &proxy).await;
    assert_eq!(report.windows_closed, 0);
    assert_eq!(
        sent,
        ops(&[("GetItem", 2), ("Query", 1), ("UpdateItem", 3 + 1 + 1)])
    );
    // Batch 2: one record at 70 s closes [0, 60 s): a, b and c are emitted.
    let second = [("a", "x", BASE + 70_000)];
    let (report, sent) = batch(&topology, &event("events", 0, 3, &second), &store, &proxy).await;
    assert_eq!(report.windows_closed, 3);
    assert_eq!(
        sent,
        ops(&[
            ("BatchGetItem", 1),
            ("GetItem", 2),
            ("Query", 1),
            ("UpdateItem", 1 + 1 + 3 + 1),
        ])
    );
}

/// A session-windowed count: all sessions of a key in one item, one `UpdateItem` per touched
/// key (a new item needs no read), plus the clock as for time windows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_cost_one_update_per_touched_key_plus_the_clock() {
    let (store, proxy, _) = counted_store(Guarantee::ExactlyOnce).await;
    let builder = StreamsBuilder::new();
    builder
        .stream("events", Utf8, Utf8)
        .group_by_key(Utf8)
        .windowed_by_session(
            SessionWindows::with_inactivity_gap(Duration::from_secs(5))
                .grace(Duration::from_secs(600)),
        )
        .count("sessions")
        .to_stream()
        .map(|w, n| (format!("{}@{}-{}", w.key, w.start, w.end), n))
        .to("sessions-out", Utf8, DecimalI64);
    let topology = builder.build();
    // a: two sessions (1 s, 2 s; 30 s), b: one; two items.
    let records = [
        ("a", "x", BASE + 1_000),
        ("b", "x", BASE + 1_500),
        ("a", "x", BASE + 2_000),
        ("a", "x", BASE + 30_000),
    ];
    let (report, sent) = batch(&topology, &event("events", 0, 0, &records), &store, &proxy).await;
    assert_eq!(report.items_touched, 2);
    assert_eq!(sent, ops(&[("GetItem", 1), ("UpdateItem", 2 + 1)]));
}

/// A table and a stream–table join: the table's batch writes one item per key (new items:
/// one conditional write each); a batch of orders reads its distinct keys in one
/// `BatchGetItem` (up to 100 keys a request) and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_reads_its_distinct_keys_in_one_batch_get() {
    let (store, proxy, _) = counted_store(Guarantee::ExactlyOnce).await;
    let builder = StreamsBuilder::new();
    let names = builder.table("customers", Utf8, Utf8, "names");
    builder
        .stream("orders", Utf8, Utf8)
        .join(&names, |_, order: String, name: String| {
            format!("{order} {name}")
        })
        .to("named-orders", Utf8, Utf8);
    let topology = builder.build();
    let customers = [
        ("c1", "Ada", BASE),
        ("c2", "Grace", BASE),
        ("c3", "Alan", BASE),
    ];
    let (report, sent) = batch(
        &topology,
        &event("customers", 0, 0, &customers),
        &store,
        &proxy,
    )
    .await;
    assert_eq!(report.items_touched, 3);
    assert_eq!(sent, ops(&[("UpdateItem", 3)]));
    // Five orders of three customers (c4 unknown).
    let orders = [
        ("c1", "tea", BASE),
        ("c2", "cake", BASE),
        ("c1", "jam", BASE),
        ("c4", "pie", BASE),
        ("c2", "bun", BASE),
    ];
    let (report, sent) = batch(&topology, &event("orders", 0, 0, &orders), &store, &proxy).await;
    assert_eq!(report.join_lookups, 3);
    assert_eq!(report.records_out, 4);
    assert_eq!(sent, ops(&[("BatchGetItem", 1)]));
}

/// A windowed count under `at_least_once`: the same unconditional `ADD` as a count, so a
/// redelivered batch counts its windows again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_least_once_counts_a_redelivered_window_again() {
    let (store, proxy, _) = counted_store(Guarantee::AtLeastOnce).await;
    let builder = StreamsBuilder::new();
    builder
        .stream("events", Utf8, Utf8)
        .group_by_key(Utf8)
        .windowed_by(TimeWindows::of_size(Duration::from_secs(60)).grace(Duration::from_secs(600)))
        .count("per-minute")
        .to_stream()
        .map(|w, n| (format!("{}@{}", w.key, w.start), n))
        .to("per-minute-out", Utf8, DecimalI64);
    let topology = builder.build();
    let batch_of = event("events", 0, 0, &three_keys());
    batch(&topology, &batch_of, &store, &proxy).await;
    batch(&topology, &batch_of, &store, &proxy).await;
    let windows = lambda_streams::state::Store::windows(&store, "per-minute", b"a", 0, i64::MAX)
        .await
        .expect("read");
    let counts: Vec<i64> = windows.iter().map(|(_, state)| state.value).collect();
    assert_eq!(counts, [6], "a: 3 records, delivered twice");
}

/// A dead letter is an output like the others: produced again when its batch is delivered
/// again (at least once), while the state stays exact (`a` counts its two good records once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_is_produced_again_when_its_batch_is_redelivered() {
    let (store, _proxy, table) = counted_store(Guarantee::ExactlyOnce).await;
    let builder = StreamsBuilder::new();
    builder
        .stream("events", Utf8, Utf8)
        .try_map_values(|v: String| v.parse::<i64>())
        .group_by_key(Utf8)
        .count("counts")
        .to_stream()
        .to("counts-out", Utf8, DecimalI64);
    let topology = builder.build();
    let options = BatchOptions {
        poison: PoisonPolicy::DeadLetter {
            topic: "dlq".to_owned(),
        },
        ..BatchOptions::default()
    };
    let batch_of = event(
        "events",
        0,
        0,
        &[("a", "1", BASE), ("b", "bad", BASE), ("a", "3", BASE)],
    );
    let sink = MemorySink::new();
    for _ in 0..2 {
        topology
            .process_with(&batch_of, &store, &sink, &options)
            .await
            .expect("batch");
    }
    let dead: Vec<_> = sink
        .records()
        .into_iter()
        .filter(|r| r.topic == "dlq")
        .collect();
    assert_eq!(dead.len(), 2, "one dead letter per delivery");
    for letter in &dead {
        assert_eq!(letter.value.as_deref(), Some(&b"bad"[..]));
        let source = letter
            .headers
            .iter()
            .find(|(name, _)| name == lambda_streams::wire::SOURCE_HEADER)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned());
        assert_eq!(source.as_deref(), Some("events:0:1"));
    }
    assert_eq!(
        table_counts(&table, "counts").await,
        BTreeMap::from([("a".into(), 2)])
    );
}
