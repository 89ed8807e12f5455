//! The exactly-once write path under every fault the Kafka event source allows (design
//! notes, sections 3 and 4), driven through the real `Topology::process` and the real
//! DynamoDB store on the emulator: redeliveries, retries with other boundaries, crashes
//! after k of n item writes, zombies whose writes interleave with newer invocations,
//! commits lost or going backwards, several partitions writing one key at once, the
//! emulator going away mid-batch, and a poison record. Every final state is compared with
//! counts computed here from the input log, independently of the code under test.

// Partition numbers index several parallel vectors (log, committed offsets).
#![allow(clippy::needless_range_loop)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use lambda_streams::dsl::{EmitStrategy, Grouped, JoinWindows, TimeWindows};
use lambda_streams::event::KafkaEvent;
use lambda_streams::serdes::{DecimalI64, Json, Unit, Utf8};
use lambda_streams::sink::{MemorySink, VERSION_HEADER};
use lambda_streams::state::dynamodb::{
    DynamoStore, RetrySettings, create_table, emulator_client, emulator_client_with,
};
use lambda_streams::state::fault::FaultyStore;
use lambda_streams::state::memory::MemoryStore;
use lambda_streams::state::{ItemState, Store};
use lambda_streams::{BatchOptions, Guarantee, StreamError, StreamsBuilder, Topology};
use lambda_streams_e2e::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const TOPIC: &str = "events";
/// The timestamp of offset 0 in every partition of a [`Log`]'s events.
const BASE_TIME: i64 = 1_764_460_800_000;
const STORE: &str = "counts";

/// Counts records per value, re-keyed (direct mode): every partition writes every key.
fn topology() -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream(TOPIC, Unit, Utf8)
        .group_by(|_, value| value.clone(), Grouped::direct(Utf8))
        .count(STORE)
        .to_stream()
        .to("counts-out", Utf8, DecimalI64);
    builder.build()
}

/// The input: per partition, the value (= the key counted) at each offset.
struct Log(Vec<Vec<String>>);

impl Log {
    fn random(rng: &mut StdRng, partitions: usize, len: usize, keys: usize) -> Log {
        Log((0..partitions)
            .map(|_| {
                (0..len)
                    .map(|_| format!("k{}", rng.random_range(0..keys)))
                    .collect()
            })
            .collect())
    }

    fn truth(&self) -> BTreeMap<String, i64> {
        let mut counts = BTreeMap::new();
        for value in self.0.iter().flatten() {
            *counts.entry(value.clone()).or_insert(0) += 1;
        }
        counts
    }

    /// The event of a batch: per partition, offsets `lo..hi`.
    fn event(&self, batch: &[(usize, usize, usize)]) -> KafkaEvent {
        log_event(TOPIC, BASE_TIME, batch, |p, o| {
            self.0[p][o].clone().into_bytes()
        })
    }
}

/// A general aggregate that shows every duplicate and every loss: per key, the sorted
/// list of the (unique) values it was given.
fn seen_topology() -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream(TOPIC, Unit, Utf8)
        .group_by(
            |_, value: &String| value.split('@').next().unwrap_or_default().to_owned(),
            Grouped::direct(Utf8),
        )
        .aggregate(
            SEEN,
            Vec::new,
            |_, value: String, mut seen: Vec<String>| {
                seen.push(value);
                seen.sort();
                seen
            },
            Json::<Vec<String>>::default(),
        )
        .to_stream()
        .to("seen-out", Utf8, Json::<Vec<String>>::default());
    builder.build()
}

const SEEN: &str = "seen";

/// The reference of [`seen_topology`]: per key, its sorted values.
fn seen_truth(log: &Log) -> BTreeMap<String, Vec<String>> {
    let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for value in log.0.iter().flatten() {
        let key = value.split('@').next().unwrap_or_default().to_owned();
        seen.entry(key).or_default().push(value.clone());
    }
    seen.values_mut().for_each(|v| v.sort());
    seen
}

/// The `seen` aggregates straight from the table (attribute `a`, JSON).
async fn table_seen(table: &str) -> BTreeMap<String, Vec<String>> {
    use aws_sdk_dynamodb::types::AttributeValue;
    let client = emulator_client(&dynamo_endpoint());
    let mut out = BTreeMap::new();
    let mut pages = client
        .scan()
        .table_name(table)
        .consistent_read(true)
        .into_paginator()
        .send();
    while let Some(page) = pages.next().await {
        for item in page.expect("scan").items() {
            let (Some(AttributeValue::B(key)), Some(AttributeValue::B(a))) =
                (item.get("k"), item.get("a"))
            else {
                panic!("an aggregate item without k or a: {item:?}");
            };
            let key = String::from_utf8(key.as_ref().to_vec()).expect("utf-8");
            out.insert(
                key,
                serde_json::from_slice(a.as_ref()).expect("json aggregate"),
            );
        }
    }
    out
}

/// Per key, the aggregate of the emitted update with the highest version.
fn latest_seen(sink: &MemorySink) -> BTreeMap<String, Vec<String>> {
    let mut latest: BTreeMap<String, (u64, Vec<String>)> = BTreeMap::new();
    for record in sink.records() {
        let key = String::from_utf8(record.key.clone().expect("key")).expect("utf-8");
        let version: u64 = std::str::from_utf8(record.header(VERSION_HEADER).expect("version"))
            .expect("utf-8")
            .parse()
            .expect("n");
        let value: Vec<String> =
            serde_json::from_slice(record.value.as_deref().expect("value")).expect("json");
        let entry = latest.entry(key).or_insert((0, Vec::new()));
        if version > entry.0 {
            *entry = (version, value);
        }
    }
    latest.into_iter().map(|(k, (_, v))| (k, v)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_faults_on_a_general_aggregate_on_the_emulator_are_exact() {
    require_services();
    for seed in 0..seeds(30) {
        // One store per run, as one container's: its cache of written items is exercised
        // by the zombies and retries, and refused when stale.
        let (table, store) = exactly_once_store("seen").await;
        let store: Arc<dyn Store> = Arc::new(store);
        let (log, sink) = faulty_run(seed, store, seen_topology(), true).await;
        let truth = seen_truth(&log);
        assert_eq!(
            table_seen(&table).await,
            truth,
            "seed {seed}: every value once, none lost"
        );
        assert_eq!(
            latest_seen(&sink),
            truth,
            "seed {seed}: highest-version update per key"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_faults_on_a_general_aggregate_in_memory_are_exact() {
    for seed in 0..seeds(300) {
        let memory = Arc::new(MemoryStore::new());
        let (log, sink) = faulty_run(seed, memory.clone(), seen_topology(), true).await;
        let stored: BTreeMap<String, Vec<String>> = memory
            .states(SEEN)
            .into_iter()
            .map(|(k, s)| {
                let value = serde_json::from_slice(s.aggregate.as_deref().expect("aggregate"))
                    .expect("json");
                (String::from_utf8(k).expect("utf-8"), value)
            })
            .collect();
        assert_eq!(stored, seen_truth(&log), "seed {seed}");
        assert_eq!(latest_seen(&sink), seen_truth(&log), "seed {seed}");
    }
}

/// A general aggregate costs one request per touched key per batch once the container
/// has written the key: the cached version makes the conditional write succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_general_aggregate_writes_once_per_item_when_warm() {
    let (client, table) = dynamo_table().await;
    let store = DynamoStore::new(client, table.clone(), Guarantee::ExactlyOnce);
    let mut log = Log(vec![(0..60).map(|o| format!("k{}@0:{o}", o % 5)).collect()]);
    log.0[0].truncate(60);
    let topology = seen_topology();
    let first = topology
        .process(&log.event(&[(0, 0, 30)]), &store, &MemorySink::new())
        .await
        .expect("cold");
    assert_eq!(
        (
            first.items_touched,
            first.state.requests,
            first.state.conditional_failures
        ),
        (5, 5, 0)
    );
    let warm = topology
        .process(&log.event(&[(0, 30, 60)]), &store, &MemorySink::new())
        .await
        .expect("warm");
    assert_eq!(
        (
            warm.items_touched,
            warm.state.requests,
            warm.state.conditional_failures
        ),
        (5, 5, 0)
    );
    // Another container (a new store: cold cache) on the same table: one refused write
    // per item returns the current item, then one write.
    let other = DynamoStore::new(
        emulator_client(&dynamo_endpoint()),
        table.clone(),
        Guarantee::ExactlyOnce,
    );
    let mut more = Log(vec![(0..70).map(|o| format!("k{}@0:{o}", o % 5)).collect()]);
    more.0[0].truncate(70);
    let cold = topology
        .process(&more.event(&[(0, 60, 70)]), &other, &MemorySink::new())
        .await
        .expect("other container");
    assert_eq!(
        (cold.state.requests, cold.state.conditional_failures),
        (10, 5)
    );
    assert_eq!(table_seen(&table).await, seen_truth(&more));
}

const WINDOWED: &str = "per-window";
/// Hopping windows of 5 ms every 2 ms, grace far beyond the test's time span: no record
/// is late, so the reference is plain arithmetic.
fn hopping() -> TimeWindows {
    TimeWindows::of_size(Duration::from_millis(5))
        .advance_by(Duration::from_millis(2))
        .grace(Duration::from_secs(3600))
}

/// Counts per value and window of `windows` in `store`, emitted by `emit` to `output`
/// keyed `<key>@<window start>`.
fn windowed_counts(
    windows: TimeWindows,
    emit: EmitStrategy,
    store: &str,
    output: &str,
) -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream(TOPIC, Unit, Utf8)
        .group_by(|_, value: &String| value.clone(), Grouped::direct(Utf8))
        .windowed_by(windows)
        .emit_strategy(emit)
        .count(store)
        .to_stream()
        .map(|w, n| (format!("{}@{}", w.key, w.start), n))
        .to(output, Utf8, DecimalI64);
    builder.build()
}

/// Counts per value and hopping window, emitted on every update.
fn windowed_topology() -> Topology {
    windowed_counts(
        hopping(),
        EmitStrategy::OnWindowUpdate,
        WINDOWED,
        "windowed-out",
    )
}

/// The reference of [`windowed_topology`]: per `<key>@<start>`, the records whose
/// timestamp (`BASE_TIME + offset`, see `Log::event`) falls in the window.
fn windowed_truth(log: &Log) -> BTreeMap<String, i64> {
    let mut counts = BTreeMap::new();
    for values in &log.0 {
        for (offset, value) in values.iter().enumerate() {
            let ts = BASE_TIME + offset as i64;
            // Windows [s, s + 5) with s a multiple of 2: s in (ts - 5, ts].
            for start in (ts - 4..=ts).filter(|s| s % 2 == 0) {
                *counts.entry(format!("{value}@{start}")).or_insert(0) += 1;
            }
        }
    }
    counts
}

/// The windowed counts straight from the table: items with a window start as sort key,
/// each with a TTL attribute the later of its end + grace + retention and its write time
/// (between `written_from` and now, epoch ms) + retention, as Kafka's retention is counted
/// in event time and DynamoDB's TTL in wall-clock time (docs/state.md).
async fn table_windowed(table: &str, written_from: i64) -> BTreeMap<String, i64> {
    use aws_sdk_dynamodb::types::AttributeValue;
    let client = emulator_client(&dynamo_endpoint());
    let mut out = BTreeMap::new();
    let mut pages = client
        .scan()
        .table_name(table)
        .consistent_read(true)
        .into_paginator()
        .send();
    while let Some(page) = pages.next().await {
        for item in page.expect("scan").items() {
            let Some(AttributeValue::S(pk)) = item.get("pk") else {
                panic!("no pk")
            };
            if !pk.starts_with(&format!("{WINDOWED}#")) {
                continue;
            }
            let (
                Some(AttributeValue::B(key)),
                Some(AttributeValue::N(sk)),
                Some(AttributeValue::N(v)),
                Some(AttributeValue::N(ttl)),
            ) = (
                item.get("k"),
                item.get("sk"),
                item.get("v"),
                item.get("ttl"),
            )
            else {
                panic!("a windowed item without k, sk, v or ttl: {item:?}");
            };
            let start: i64 = sk.parse().expect("sk");
            let retention = 86_400_000;
            let by_event_time = start + 5 + 3_600_000 + retention;
            let written_to = now_ms();
            let ttl: i64 = ttl.parse().expect("ttl");
            let earliest = (by_event_time.max(written_from + retention)).div_euclid(1000) + 1;
            let latest = (by_event_time.max(written_to + retention)).div_euclid(1000) + 1;
            assert!(
                (earliest..=latest).contains(&ttl),
                "TTL of window {start}: {ttl} not in {earliest}..={latest}"
            );
            let key = String::from_utf8(key.as_ref().to_vec()).expect("utf-8");
            out.insert(format!("{key}@{start}"), v.parse().expect("count"));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_faults_on_a_windowed_count_on_the_emulator_are_exact() {
    require_services();
    for seed in 0..seeds(20) {
        let (table, store) = exactly_once_store("windowed").await;
        let store: Arc<dyn Store> = Arc::new(store);
        let written_from = now_ms();
        let (log, sink) = faulty_run(seed, store, windowed_topology(), false).await;
        let truth = windowed_truth(&log);
        assert_eq!(
            table_windowed(&table, written_from).await,
            truth,
            "seed {seed}: windowed state"
        );
        assert_eq!(
            latest_emitted(&sink),
            truth,
            "seed {seed}: highest-version update per window"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_faults_on_a_windowed_count_in_memory_are_exact() {
    for seed in 0..seeds(200) {
        let memory = Arc::new(MemoryStore::new());
        let (log, sink) = faulty_run(seed, memory.clone(), windowed_topology(), false).await;
        let stored: BTreeMap<String, i64> = memory
            .windowed_states(WINDOWED)
            .into_iter()
            .map(|(k, start, s)| {
                (
                    format!("{}@{start}", String::from_utf8(k).expect("utf-8")),
                    s.value,
                )
            })
            .collect();
        assert_eq!(stored, windowed_truth(&log), "seed {seed}");
        assert_eq!(latest_emitted(&sink), windowed_truth(&log), "seed {seed}");
    }
}

/// Stream time is persisted with the state: a new container (a new store, empty cache)
/// still knows that a window has closed, and drops and counts a late record for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_time_survives_a_cold_start_and_late_records_are_dropped() {
    let (client, table) = dynamo_table().await;
    let builder = StreamsBuilder::new();
    builder
        .stream(TOPIC, Unit, Utf8)
        .group_by(|_, value: &String| value.clone(), Grouped::direct(Utf8))
        .windowed_by(TimeWindows::of_size(Duration::from_secs(60)).grace(Duration::from_secs(10)))
        .count(WINDOWED)
        .to_stream()
        .map(|w, n| (format!("{}@{}", w.key, w.start), n))
        .to("windowed-out", Utf8, DecimalI64);
    let topology = builder.build();
    let at = |ts: i64, offset: i64| {
        let mut event = Log(vec![vec!["k".to_owned()]]).event(&[(0, 0, 1)]);
        event.partitions[0].records[0].timestamp = ts;
        event.partitions[0].records[0].offset = offset;
        event
    };
    let first = DynamoStore::new(client.clone(), table.clone(), Guarantee::ExactlyOnce);
    for (offset, ts) in [(0, 5_000), (1, 75_000)] {
        topology
            .process(&at(ts, offset), &first, &MemorySink::new())
            .await
            .expect("batch");
    }
    let cold = DynamoStore::new(client, table.clone(), Guarantee::ExactlyOnce);
    let late = topology
        .process(&at(30_000, 2), &cold, &MemorySink::new())
        .await
        .expect("late batch");
    assert_eq!(
        (late.late_records, late.items_touched),
        (1, 0),
        "[0, 60 s) closed at 70 s; stream time is 75 s"
    );
    let on_time = topology
        .process(&at(71_000, 3), &cold, &MemorySink::new())
        .await
        .expect("on time");
    assert_eq!(on_time.late_records, 0);
    let counts: BTreeMap<String, i64> = table_windowed_any(&table).await;
    assert_eq!(
        counts,
        BTreeMap::from([("k@0".to_owned(), 1), ("k@60000".to_owned(), 2)])
    );
}

/// Windowed counts from the table without the TTL check of [`table_windowed`].
async fn table_windowed_any(table: &str) -> BTreeMap<String, i64> {
    use aws_sdk_dynamodb::types::AttributeValue;
    let client = emulator_client(&dynamo_endpoint());
    let mut out = BTreeMap::new();
    for item in client
        .scan()
        .table_name(table)
        .consistent_read(true)
        .send()
        .await
        .expect("scan")
        .items()
    {
        if let (
            Some(AttributeValue::B(key)),
            Some(AttributeValue::N(sk)),
            Some(AttributeValue::N(v)),
        ) = (item.get("k"), item.get("sk"), item.get("v"))
        {
            out.insert(
                format!(
                    "{}@{sk}",
                    String::from_utf8(key.as_ref().to_vec()).expect("utf-8")
                ),
                v.parse().expect("n"),
            );
        }
    }
    out
}

/// Per key, the value of the emitted update with the highest version.
fn latest_emitted(sink: &MemorySink) -> BTreeMap<String, i64> {
    let mut latest: BTreeMap<String, (u64, i64)> = BTreeMap::new();
    for record in sink.records() {
        let key = String::from_utf8(record.key.clone().expect("key")).expect("utf-8");
        let version: u64 =
            std::str::from_utf8(record.header(VERSION_HEADER).expect("version header"))
                .expect("utf-8")
                .parse()
                .expect("number");
        let value: i64 = std::str::from_utf8(record.value.as_deref().expect("value"))
            .expect("utf-8")
            .parse()
            .expect("n");
        let entry = latest.entry(key).or_insert((0, 0));
        if version > entry.0 {
            *entry = (version, value);
        }
    }
    latest.into_iter().map(|(k, (_, v))| (k, v)).collect()
}

/// One random scenario after the model in shared/models/exactly_once_direct.py: rounds of
/// 1 to 3 concurrent invocations (the older ones are zombies), each on some partitions from
/// the committed offsets, some crashing after k writes, writes delayed at random so that
/// they interleave; commits sometimes lost or moved back. Then a fault-free drain.
async fn scenario(seed: u64, store: Arc<dyn Store>, read: impl AsyncFn() -> BTreeMap<String, i64>) {
    let (log, sink) = faulty_run(seed, store, topology(), false).await;
    let truth = log.truth();
    assert_eq!(
        read().await,
        truth,
        "seed {seed}: state equals the exactly-once reference"
    );
    assert_eq!(
        latest_emitted(&sink),
        truth,
        "seed {seed}: highest-version update per key equals the reference"
    );
}

/// Runs the random fault model of [`scenario`] on `topology`; `tagged` makes every value
/// unique (`<key>@<partition>:<offset>`). Returns the input and everything emitted.
async fn faulty_run(
    seed: u64,
    store: Arc<dyn Store>,
    topology: Topology,
    tagged: bool,
) -> (Log, MemorySink) {
    let mut rng = StdRng::seed_from_u64(seed);
    let (parts, len) = (3, rng.random_range(5..40));
    let keys = rng.random_range(1..6);
    let mut log = Log::random(&mut rng, parts, len, keys);
    if tagged {
        for (p, values) in log.0.iter_mut().enumerate() {
            for (o, value) in values.iter_mut().enumerate() {
                *value = format!("{value}@{p}:{o}");
            }
        }
    }
    let sink = MemorySink::new();
    let mut committed = vec![0usize; parts];
    for round in 0..rng.random_range(3..25) {
        let mut invocations = Vec::new();
        for i in 0..rng.random_range(1..=3) {
            let mut batch = Vec::new();
            for p in 0..parts {
                if committed[p] < len && rng.random_bool(0.6) {
                    batch.push((
                        p,
                        committed[p],
                        (committed[p] + rng.random_range(1..12)).min(len),
                    ));
                }
            }
            if batch.is_empty() {
                continue;
            }
            let mut layer = FaultyStore::new(Arc::clone(&store))
                .with_delays(Duration::from_millis(3), seed * 1000 + round * 10 + i);
            if rng.random_bool(0.3) {
                layer = layer.crash_after(rng.random_range(0..4));
            }
            invocations.push((batch, layer));
        }
        let results = futures::future::join_all(invocations.iter().map(|(batch, layer)| {
            let (topology, sink, event) = (&topology, &sink, log.event(batch));
            async move {
                topology
                    .process_with(&event, layer, sink, &declared(parts))
                    .await
            }
        }))
        .await;
        for ((batch, _), result) in invocations.iter().zip(results) {
            if result.is_err() {
                continue;
            }
            for &(p, lo, hi) in batch {
                if rng.random_bool(0.9) {
                    committed[p] = committed[p].max(hi);
                }
                if rng.random_bool(0.05) {
                    committed[p] = rng.random_range(0..=lo);
                }
            }
        }
    }
    for p in 0..parts {
        while committed[p] < len {
            let hi = (committed[p] + rng.random_range(1..12)).min(len);
            topology
                .process_with(
                    &log.event(&[(p, committed[p], hi)]),
                    &store,
                    &sink,
                    &declared(parts),
                )
                .await
                .expect("fault-free batch");
            committed[p] = hi;
        }
    }
    (log, sink)
}

/// Batch options that declare the source topic's `partitions` (for the low watermark).
fn declared(partitions: usize) -> BatchOptions {
    BatchOptions {
        source_partitions: BTreeMap::from([(TOPIC.to_owned(), partitions as i32)]),
        ..BatchOptions::default()
    }
}

fn seeds(default: u64) -> u64 {
    std::env::var("LAMBDA_STREAMS_FAULT_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_faults_on_the_emulator_are_exact() {
    require_services();
    for seed in 0..seeds(30) {
        let (table, store) = exactly_once_store("faults").await;
        let store: Arc<dyn Store> = Arc::new(store);
        scenario(seed, store, async || table_counts(&table, STORE).await).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_faults_in_memory_are_exact() {
    for seed in 0..seeds(300) {
        let memory = Arc::new(MemoryStore::new());
        let read = {
            let memory = Arc::clone(&memory);
            async move || {
                memory
                    .items(STORE)
                    .into_iter()
                    .map(|(k, v, _)| (String::from_utf8(k).expect("utf-8"), v))
                    .collect()
            }
        };
        scenario(seed, memory, read).await;
    }
}

async fn dynamo_table() -> (aws_sdk_dynamodb::Client, String) {
    require_services();
    let client = emulator_client(&dynamo_endpoint());
    let table = unique("faults");
    create_table(&client, &table).await.expect("table");
    (client, table)
}

/// Scenario 4: two partitions write the same keys at the same time, many times over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_partitions_writing_the_same_keys_concurrently_are_exact() {
    let (client, table) = dynamo_table().await;
    let store = DynamoStore::new(client, table.clone(), Guarantee::ExactlyOnce);
    let mut rng = StdRng::seed_from_u64(4);
    let log = Log::random(&mut rng, 2, 400, 3);
    let (topology, sink) = (topology(), MemorySink::new());
    for (round, lo) in (0..400).step_by(8).enumerate() {
        let layer = |i: u64| {
            FaultyStore::new(&store).with_delays(Duration::from_millis(2), round as u64 * 2 + i)
        };
        let (a, b) = (layer(0), layer(1));
        let (ea, eb) = (log.event(&[(0, lo, lo + 8)]), log.event(&[(1, lo, lo + 8)]));
        let (ra, rb) = tokio::join!(
            topology.process(&ea, &a, &sink),
            topology.process(&eb, &b, &sink)
        );
        ra.expect("partition 0");
        rb.expect("partition 1");
    }
    assert_eq!(table_counts(&table, STORE).await, log.truth());
    assert_eq!(latest_emitted(&sink), log.truth());
}

/// Scenario 5: a zombie (an old invocation of 0..10) finishes after its retry (0..20).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zombie_finishing_after_its_retry_changes_nothing() {
    let (client, table) = dynamo_table().await;
    let store = DynamoStore::new(client, table.clone(), Guarantee::ExactlyOnce);
    let mut rng = StdRng::seed_from_u64(5);
    let log = Log::random(&mut rng, 1, 20, 4);
    let (topology, sink) = (topology(), MemorySink::new());
    let slow = FaultyStore::new(&store).with_delays(Duration::from_millis(300), 1);
    let zombie = log.event(&[(0, 0, 10)]);
    let retry = log.event(&[(0, 0, 20)]);
    let (old, new) = tokio::join!(topology.process(&zombie, &slow, &sink), async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        topology.process(&retry, &store, &sink).await
    });
    old.expect("zombie");
    new.expect("retry");
    assert_eq!(table_counts(&table, STORE).await, log.truth());
    // The zombie's writes, late as they are, found the watermark: nothing was written twice,
    // and the last update per key still carries the exact count.
    assert_eq!(latest_emitted(&sink), log.truth());
}

/// Scenario 6: the emulator is unreachable for a few seconds mid-batch. The batch fails
/// with an error naming the store and key; once the emulator is back, the redelivered batch
/// completes and the state is exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_emulator_going_away_mid_batch_fails_the_batch_and_loses_nothing() {
    let (_, table) = dynamo_table().await;
    let proxy = Proxy::start(dynamo_endpoint().trim_start_matches("http://")).await;
    let store = DynamoStore::new(
        emulator_client(&format!("http://127.0.0.1:{}", proxy.port)),
        table.clone(),
        Guarantee::ExactlyOnce,
    );
    let mut rng = StdRng::seed_from_u64(6);
    let log = Log::random(&mut rng, 2, 60, 30);
    let (topology, sink) = (topology(), MemorySink::new());
    let event = log.event(&[(0, 0, 60), (1, 0, 60)]);
    // The network to the emulator goes down before the 8th item write.
    let down = proxy.switch();
    let cutting = FaultyStore::new(&store).on_write(move |before| {
        if before == 7 {
            down();
        }
    });
    let error = topology
        .process(&event, &cutting, &sink)
        .await
        .expect_err("the outage fails the batch");
    let message = error.to_string();
    assert!(
        matches!(error, StreamError::State(_)),
        "a state error: {message}"
    );
    assert!(
        message.contains("state store \"counts\", key \"k"),
        "names the store and key: {message}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    proxy.set_up();
    topology
        .process(&event, &store, &sink)
        .await
        .expect("the redelivery succeeds");
    assert_eq!(table_counts(&table, STORE).await, log.truth());
}

/// Scenario 8: a poison record mid-batch fails the batch with an error naming its
/// topic-partition and offset, before any state is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_record_mid_batch_names_itself_and_writes_nothing() {
    let (client, table) = dynamo_table().await;
    let store = DynamoStore::new(client, table.clone(), Guarantee::ExactlyOnce);
    let log = Log(vec![(0..10).map(|i| format!("k{}", i % 3)).collect()]);
    let mut event = log.event(&[(0, 0, 10)]);
    event.partitions[0].records[4].value = Some(vec![0xff, 0xfe].into());
    let error = topology()
        .process(&event, &store, &MemorySink::new())
        .await
        .expect_err("poison");
    assert_eq!(
        error.to_string(),
        "record events-0 offset 4: cannot deserialize the value: invalid UTF-8: invalid utf-8 sequence of 1 bytes from index 0"
    );
    assert!(
        table_counts(&table, STORE).await.is_empty(),
        "nothing was written"
    );
}

/// A key beyond DynamoDB's key size limit fails the batch with an error naming the store
/// and (the start of) the key, instead of a panic or a silent drop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversize_key_is_a_clear_error() {
    let (client, table) = dynamo_table().await;
    let store = DynamoStore::new(client, table.clone(), Guarantee::ExactlyOnce);
    let log = Log(vec![vec!["x".repeat(3000)]]);
    let error = topology()
        .process(&log.event(&[(0, 0, 1)]), &store, &MemorySink::new())
        .await
        .expect_err("too large");
    let message = error.to_string();
    assert!(
        message.contains("state store \"counts\", key \"xxxx"),
        "{message}"
    );
    assert!(message.contains("(3000 bytes)"), "{message}");
}

/// The cost claim: a clean batch sends one request per touched item, and a redelivery of
/// it one more per item (the refused condition), writing nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_request_per_touched_item_per_batch() {
    let (client, table) = dynamo_table().await;
    let store = DynamoStore::new(client, table.clone(), Guarantee::ExactlyOnce);
    let mut rng = StdRng::seed_from_u64(7);
    let log = Log::random(&mut rng, 2, 200, 50);
    let event = log.event(&[(0, 0, 200), (1, 0, 200)]);
    let keys = log.truth().len() as u64;
    let report = topology()
        .process(&event, &store, &MemorySink::new())
        .await
        .expect("batch");
    assert_eq!(
        (
            report.items_touched,
            report.state.requests,
            report.state.conditional_failures
        ),
        (keys, keys, 0)
    );
    let again = topology()
        .process(&event, &store, &MemorySink::new())
        .await
        .expect("redelivery");
    assert_eq!(
        (again.state.requests, again.state.conditional_failures),
        (keys, keys)
    );
    assert_eq!(table_counts(&table, STORE).await, log.truth());
}

// --- Emit on window close -------------------------------------------------------------

const CLOSING: &str = "per-window-final";

/// Hopping windows of 5 ms every 2 ms with 1 ms of grace: window `s` closes at `s + 6`.
fn closing_windows() -> TimeWindows {
    TimeWindows::of_size(Duration::from_millis(5))
        .advance_by(Duration::from_millis(2))
        .grace(Duration::from_millis(1))
}

/// [`windowed_topology`]'s counts, emitted once per window when it closes.
fn closing_topology() -> Topology {
    windowed_counts(
        closing_windows(),
        EmitStrategy::OnWindowClose,
        CLOSING,
        "closed-out",
    )
}

/// The windows of [`windowed_truth`] that have closed once every partition's stream time
/// is at least `low` (window `s` closes at `s + 5 + 1`).
fn closed_truth(log: &Log, low: i64) -> BTreeMap<String, i64> {
    windowed_truth(log)
        .into_iter()
        .filter(|(k, _)| {
            let start: i64 = k.rsplit_once('@').expect("@").1.parse().expect("start");
            start + 6 <= low
        })
        .collect()
}

/// Every emitted `<key>@<start>` with how many times it was emitted and its values.
fn emissions(sink: &MemorySink) -> BTreeMap<String, Vec<i64>> {
    let mut out: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for record in sink.records() {
        let key = String::from_utf8(record.key.clone().expect("key")).expect("utf-8");
        let value = std::str::from_utf8(record.value.as_deref().expect("value"))
            .expect("utf-8")
            .parse()
            .expect("count");
        out.entry(key).or_default().push(value);
    }
    out
}

/// The random fault model on an emit-on-close windowed count: whatever the redeliveries,
/// crashes and zombies, every window that closed is emitted, and the highest version
/// emitted per window is its exact count; no window still open is emitted.
async fn closing_scenario(seed: u64, store: Arc<dyn Store>) {
    let (log, sink) = faulty_run(seed, store, closing_topology(), false).await;
    // After the drain every partition's stream time is its last record's timestamp.
    let low = BASE_TIME + log.0[0].len() as i64 - 1;
    let truth = closed_truth(&log, low);
    assert!(
        !truth.is_empty() || log.0[0].len() < 7,
        "seed {seed}: some window closes"
    );
    assert_eq!(
        latest_emitted(&sink),
        truth,
        "seed {seed}: the final emission of every closed window, and nothing else"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_faults_on_emit_on_close_windows_on_the_emulator_are_exact() {
    require_services();
    for seed in 0..seeds(15) {
        let (_, store) = exactly_once_store("closing").await;
        let store: Arc<dyn Store> = Arc::new(store);
        closing_scenario(seed, store).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_faults_on_emit_on_close_windows_in_memory_are_exact() {
    for seed in 0..seeds(200) {
        closing_scenario(seed, Arc::new(MemoryStore::new())).await;
    }
}

/// Without faults, on the emulator: each window is emitted exactly once, with its exact
/// count, only after the low watermark (both partitions) passed its end plus grace; a
/// record for a closed window is dropped and counted, and emits nothing; a partition
/// whose stream time stops advancing holds windows open only for the idle timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windows_close_once_on_the_low_watermark_and_late_records_are_dropped() {
    let (client, table) = dynamo_table().await;
    let store = DynamoStore::new(client, table.clone(), Guarantee::ExactlyOnce);
    let topology = closing_topology();
    let sink = MemorySink::new();
    let two = declared(2);
    let mut rng = StdRng::seed_from_u64(7);
    let log = Log::random(&mut rng, 2, 40, 3);
    // Partition 0 runs ahead to 29: partition 1, declared but not seen yet, holds every
    // window open.
    topology
        .process_with(&log.event(&[(0, 0, 30)]), &store, &sink, &two)
        .await
        .expect("batch");
    assert!(
        sink.records().is_empty(),
        "nothing closes before partition 1 is heard from"
    );
    // Partition 1 to 10: the low watermark is 10.
    for (p, lo, hi) in [(1, 0, 11)] {
        topology
            .process_with(&log.event(&[(p, lo, hi)]), &store, &sink, &two)
            .await
            .expect("batch");
    }
    let low = BASE_TIME + 10;
    let first = emissions(&sink);
    let expected = closed_truth(
        &Log(vec![log.0[0][..11].to_vec(), log.0[1][..11].to_vec()]),
        low,
    );
    assert!(!expected.is_empty());
    assert_eq!(
        first
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<BTreeMap<_, _>>(),
        expected
            .iter()
            .map(|(k, v)| (k.clone(), vec![*v]))
            .collect(),
        "the windows closed by the low watermark, once each, exact"
    );

    // A record of partition 1 for a closed window (offset 11, timestamp of offset 2): late.
    let mut late = log.event(&[(1, 11, 12)]);
    late.partitions[0].records[0].timestamp = BASE_TIME + 2;
    let report = topology
        .process_with(&late, &store, &sink, &two)
        .await
        .expect("late")
        .report;
    assert!(
        report.late_records >= 1,
        "late records: {}",
        report.late_records
    );
    assert_eq!(report.items_touched, 0);
    assert_eq!(emissions(&sink), first, "a late record emits nothing");

    // Both partitions to the end: every window closed by the final low watermark is
    // emitted once, none twice.
    for (p, lo, hi) in [(1, 12, 40), (0, 30, 40)] {
        topology
            .process_with(&log.event(&[(p, lo, hi)]), &store, &sink, &two)
            .await
            .expect("batch");
    }
    // The reference: the input without the late record (its key marked, then left out).
    let mut truth = Log(log.0.clone());
    truth.0[1][11] = "late".to_owned();
    let all = emissions(&sink);
    assert!(
        all.values().all(|v| v.len() == 1),
        "each window once: {all:?}"
    );
    let mut final_truth = closed_truth(&truth, BASE_TIME + 39);
    final_truth.retain(|k, _| !k.starts_with("late@"));
    assert_eq!(
        all.into_iter()
            .map(|(k, v)| (k, v[0]))
            .collect::<BTreeMap<_, _>>(),
        final_truth
    );

    // Idle partitions: partition 1 stops; partition 0 goes on. With the default timeout
    // (30 s) partition 1 holds the windows open; once it has been idle for longer than
    // the timeout, partition 0 alone closes them.
    let more = Log(vec![vec!["z".to_owned(); 60], vec!["z".to_owned(); 60]]);
    let before = sink.records().len();
    topology
        .process_with(&more.event(&[(0, 40, 50)]), &store, &sink, &two)
        .await
        .expect("batch");
    assert_eq!(
        sink.records().len(),
        before,
        "partition 1 (at 39) holds windows open"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let options = BatchOptions {
        idle_partition_timeout: Duration::from_millis(200),
        ..declared(2)
    };
    let outcome = topology
        .process_with(&more.event(&[(0, 50, 60)]), &store, &sink, &options)
        .await
        .expect("batch");
    assert!(outcome.report.windows_closed > 0);
    let closed: Vec<String> = emissions(&sink)
        .into_keys()
        .filter(|k| k.starts_with("z@"))
        .collect();
    // Partition 0's stream time is BASE + 59: windows up to start BASE + 53 closed.
    let expected_z: Vec<String> = (BASE_TIME + 36..=BASE_TIME + 53)
        .filter(|s| s % 2 == 0)
        .map(|s| format!("z@{s}"))
        .collect();
    assert_eq!(closed, expected_z);
}

/// Interactive queries of a windowed store, on the emulator: by key and window range,
/// through the `Store` API and through `local-runner query --key --from --to`; windows
/// past their TTL are left out (DynamoDB deletes them only lazily).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windowed_items_are_queried_by_key_and_window_range() {
    let (client, table) = dynamo_table().await;
    let store = DynamoStore::new(client.clone(), table.clone(), Guarantee::ExactlyOnce);
    let builder = StreamsBuilder::new();
    builder
        .stream(TOPIC, Unit, Utf8)
        .group_by(|_, value: &String| value.clone(), Grouped::direct(Utf8))
        .windowed_by(
            TimeWindows::of_size(Duration::from_secs(60))
                .grace(Duration::from_secs(3600))
                .retention(Duration::from_secs(3600)),
        )
        .count(WINDOWED);
    let topology = builder.build();
    let minute = 60_000;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64;
    let base = now.div_euclid(minute) * minute - 10 * minute;
    // Key "a": 1 record in minute 0, 2 in minute 1, 3 in minute 3; one record three days
    // ago, whose window is written with a TTL an hour past the write (not born expired),
    // then moved into the past below, as when its hour has passed.
    let old = base - 3 * 86_400_000;
    let stamps = [
        old,
        base,
        base + minute,
        base + minute + 1,
        base + 3 * minute,
        base + 3 * minute + 5,
        base + 3 * minute + 9,
    ];
    let mut event = Log(vec![vec!["a".to_owned(); stamps.len()]]).event(&[(0, 0, stamps.len())]);
    for (record, ts) in event.partitions[0].records.iter_mut().zip(stamps) {
        record.timestamp = ts;
    }
    // The old record first, in its own batch, so that it is not late.
    let mut first = event.clone();
    first.partitions[0].records.truncate(1);
    let mut rest = event;
    rest.partitions[0].records.remove(0);
    for batch in [first, rest] {
        topology
            .process(&batch, &store, &MemorySink::new())
            .await
            .expect("batch");
    }
    let counts = |windows: Vec<(i64, ItemState)>| -> Vec<(i64, i64)> {
        windows
            .into_iter()
            .map(|(s, state)| (s, state.value))
            .collect()
    };
    let old_window = old.div_euclid(minute) * minute;
    let all = store
        .windows(WINDOWED, b"a", i64::MIN, old_window)
        .await
        .expect("query");
    assert_eq!(counts(all), vec![(old_window, 1)], "not born expired");
    let past = (now / 1000 - 60).to_string();
    client
        .update_item()
        .table_name(&table)
        .key(
            "pk",
            aws_sdk_dynamodb::types::AttributeValue::S(lambda_streams::state::dynamodb::item_key(
                WINDOWED, b"a",
            )),
        )
        .key(
            "sk",
            aws_sdk_dynamodb::types::AttributeValue::N(old_window.to_string()),
        )
        .update_expression("SET #ttl = :past")
        .expression_attribute_names("#ttl", lambda_streams::state::dynamodb::TTL_ATTRIBUTE)
        .expression_attribute_values(":past", aws_sdk_dynamodb::types::AttributeValue::N(past))
        .send()
        .await
        .expect("TTL moved into the past");
    let all = store
        .windows(WINDOWED, b"a", i64::MIN, i64::MAX)
        .await
        .expect("query");
    assert_eq!(
        counts(all),
        vec![(base, 1), (base + minute, 2), (base + 3 * minute, 3)],
        "the expired window is left out"
    );
    let range = store
        .windows(WINDOWED, b"a", base + minute, base + 2 * minute)
        .await
        .expect("query");
    assert_eq!(counts(range), vec![(base + minute, 2)]);
    assert!(
        store
            .windows(WINDOWED, b"b", i64::MIN, i64::MAX)
            .await
            .expect("query")
            .is_empty()
    );

    // The same through the CLI: one JSON line per window.
    let output = std::process::Command::new("cargo")
        .args([
            "run",
            "--quiet",
            "-p",
            "lambda-streams-local-runner",
            "--",
            "query",
        ])
        .args([
            "--store",
            WINDOWED,
            "--table",
            &table,
            "--dynamodb-endpoint",
            &dynamo_endpoint(),
        ])
        .args([
            "--key",
            "a",
            "--from",
            &base.to_string(),
            "--to",
            &(base + 3 * minute).to_string(),
        ])
        .current_dir(workspace())
        .stdin(std::process::Stdio::null())
        .output()
        .expect("query runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<serde_json::Value> = String::from_utf8(output.stdout)
        .expect("utf-8")
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    let printed: Vec<(i64, i64)> = lines
        .iter()
        .map(|l| {
            (
                l["window_start"].as_i64().expect("start"),
                l["value"].as_i64().expect("value"),
            )
        })
        .collect();
    assert_eq!(
        printed,
        vec![(base, 1), (base + minute, 2), (base + 3 * minute, 3)]
    );
    assert!(lines.iter().all(|l| l["key"] == "a"));
}

/// Throttling (DynamoDB's `ProvisionedThroughputExceededException`, injected on the wire
/// in front of the emulator) is retried with backoff and jitter: with one request in
/// three refused, every batch completes and the state is exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttled_requests_are_retried_and_the_state_is_exact() {
    throttled_requests_are_retried(false).await;
}

/// [`throttled_requests_are_retried_and_the_state_is_exact`] with the state writes through
/// the store's lean client (its own retries and budget).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttled_requests_are_retried_by_the_lean_client_and_the_state_is_exact() {
    throttled_requests_are_retried(true).await;
}

async fn throttled_requests_are_retried(lean: bool) {
    let (_, table) = dynamo_table().await;
    let proxy = ThrottlingProxy::start(dynamo_endpoint().trim_start_matches("http://"), |n| {
        n % 3 == 0
    })
    .await;
    let endpoint = format!("http://127.0.0.1:{}", proxy.port);
    let store = DynamoStore::new(
        emulator_client(&endpoint),
        table.clone(),
        Guarantee::ExactlyOnce,
    );
    let store = if lean {
        store.with_lean_client(
            lambda_streams::state::dynamodb::emulator_lean_client(&endpoint).expect("a client"),
        )
    } else {
        store
    };
    let mut rng = StdRng::seed_from_u64(11);
    let log = Log::random(&mut rng, 2, 60, 8);
    let (topology, sink) = (topology(), MemorySink::new());
    for lo in (0..60).step_by(20) {
        topology
            .process(
                &log.event(&[(0, lo, lo + 20), (1, lo, lo + 20)]),
                &store,
                &sink,
            )
            .await
            .expect("throttled requests are retried");
    }
    assert!(
        proxy.throttled() > 5,
        "throttled {} requests",
        proxy.throttled()
    );
    assert_eq!(table_counts(&table, STORE).await, log.truth());
    assert_eq!(latest_emitted(&sink), log.truth());
}

/// A store that keeps throttling: the batch fails as a whole with an error naming the
/// store, the key and the throttling, after the bounded retries; its redelivery, once
/// throughput is back, completes exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_keeps_throttling_fails_the_batch_and_loses_nothing() {
    let (_, table) = dynamo_table().await;
    let always =
        ThrottlingProxy::start(dynamo_endpoint().trim_start_matches("http://"), |_| true).await;
    let throttled = DynamoStore::new(
        emulator_client(&format!("http://127.0.0.1:{}", always.port)),
        table.clone(),
        Guarantee::ExactlyOnce,
    );
    let mut rng = StdRng::seed_from_u64(12);
    let log = Log::random(&mut rng, 1, 30, 5);
    let (topology, sink) = (topology(), MemorySink::new());
    let event = log.event(&[(0, 0, 30)]);
    let started = std::time::Instant::now();
    let error = topology
        .process(&event, &throttled, &sink)
        .await
        .expect_err("a store that keeps throttling fails the batch");
    let message = error.to_string();
    assert!(
        message.contains("state store \"counts\", key \"k")
            && message.contains("ProvisionedThroughputExceeded"),
        "names the store, the key and the throttling: {message}"
    );
    // 6 attempts per request, with backoff: the batch fails in bounded time.
    assert!(started.elapsed() < Duration::from_secs(60));
    assert!(always.throttled() >= 6, "retried: {}", always.throttled());
    assert!(sink.records().is_empty(), "a failed batch emits nothing");
    let store = DynamoStore::new(
        emulator_client(&dynamo_endpoint()),
        table.clone(),
        Guarantee::ExactlyOnce,
    );
    topology
        .process(&event, &store, &sink)
        .await
        .expect("the redelivery succeeds");
    assert_eq!(table_counts(&table, STORE).await, log.truth());
}

/// Sustained throttling: a client's retries are bounded by its retry budget, not only by
/// its attempts. With a budget of 10 tokens (the SDK's standard mode charges 5 per
/// throttled retry), a request that is always refused is tried 1 + 2 times although 10
/// attempts are allowed; once the budget is spent, the next batch fails at the first
/// refusal. Each batch fails as a whole with an error naming the table and the
/// throttling, and emits nothing. Another client of the same process has a budget of its
/// own. When throughput is back, the event source's redelivery (with other boundaries)
/// completes exactly: 10 records, counted once each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_retry_budget_fails_the_batch_at_once_and_the_redelivery_is_exact() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let (_, table) = dynamo_table().await;
    let throttling = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&throttling);
    let proxy =
        ThrottlingProxy::start(dynamo_endpoint().trim_start_matches("http://"), move |_| {
            flag.load(Ordering::SeqCst)
        })
        .await;
    let endpoint = format!("http://127.0.0.1:{}", proxy.port);
    let retry = RetrySettings {
        max_attempts: 10,
        retry_budget: 10,
        ..RetrySettings::default()
    };
    let store = DynamoStore::new(
        emulator_client_with(&endpoint, retry),
        table.clone(),
        Guarantee::ExactlyOnce,
    );
    // One key: each batch is one state request.
    let log = Log(vec![vec!["k0".to_owned(); 10]]);
    let (topology, sink) = (topology(), MemorySink::new());
    topology
        .process(&log.event(&[(0, 0, 3)]), &store, &sink)
        .await
        .expect("the first batch is written before the throttling starts");
    throttling.store(true, Ordering::SeqCst);
    let failing = log.event(&[(0, 3, 6)]);
    let throttled_error = |error: StreamError| {
        let message = error.to_string();
        assert!(
            message.contains(&format!("table \"{table}\" throttled"))
                && message.contains("ProvisionedThroughputExceeded")
                && message.contains("state store \"counts\", key \"k0\""),
            "names the table, the throttling, the store and the key: {message}"
        );
    };
    let emitted = sink.records().len();
    throttled_error(
        topology
            .process(&failing, &store, &sink)
            .await
            .expect_err("the budget pays for two retries, then the batch fails"),
    );
    assert_eq!(proxy.throttled(), 3, "1 attempt + 10 / 5 retries");
    throttled_error(
        topology
            .process(&failing, &store, &sink)
            .await
            .expect_err("a spent budget retries nothing"),
    );
    assert_eq!(proxy.throttled(), 4, "no retry once the budget is spent");
    let other = DynamoStore::new(
        emulator_client_with(&endpoint, retry),
        table.clone(),
        Guarantee::ExactlyOnce,
    );
    throttled_error(
        topology
            .process(&failing, &other, &sink)
            .await
            .expect_err("still throttled"),
    );
    assert_eq!(
        proxy.throttled(),
        7,
        "another client retries on a budget of its own"
    );
    assert_eq!(
        sink.records().len(),
        emitted,
        "a failed batch emits nothing"
    );
    throttling.store(false, Ordering::SeqCst);
    topology
        .process(&log.event(&[(0, 3, 10)]), &store, &sink)
        .await
        .expect("the redelivery succeeds once throughput is back");
    let truth = BTreeMap::from([("k0".to_owned(), 10)]);
    assert_eq!(table_counts(&table, STORE).await, truth);
    assert_eq!(latest_emitted(&sink), truth);
}

/// The timestamps (ms) of the `left` and `right` records of [`join_topology`] by offset; all
/// have key `a`, and a record's value names it (`L<offset>`, `R<offset>`).
const JOIN_LEFT: [i64; 6] = [10, 20, 30, 40, 50, 60];
const JOIN_RIGHT: [i64; 6] = [12, 22, 33, 45, 51, 58];
/// [`join_topology`]'s join window.
const JOIN_DIFFERENCE: i64 = 5;

/// An inner stream–stream join of `left` and `right` within [`JOIN_DIFFERENCE`] ms.
fn join_topology() -> Topology {
    let builder = StreamsBuilder::new();
    let left = builder.stream("left", Utf8, Utf8);
    let right = builder.stream("right", Utf8, Utf8);
    left.join_stream(
        &right,
        JoinWindows::of(Duration::from_millis(JOIN_DIFFERENCE as u64)),
        "pairs",
        (Utf8, Utf8, Utf8),
        |_, l: &String, r: &String| format!("{l}+{r}"),
    )
    .to("joined", Utf8, Utf8);
    builder.build()
}

/// An event with `left` offsets `l.0..l.1` and `right` offsets `r.0..r.1`.
fn join_event(l: (usize, usize), r: (usize, usize)) -> KafkaEvent {
    use lambda_streams::event::{
        EventSource, PartitionRecords, Record, TimestampType, TopicPartition,
    };
    let records =
        |topic: &str, (lo, hi): (usize, usize), times: &[i64], name: &str| PartitionRecords {
            tp: TopicPartition::new(topic, 0),
            records: (lo..hi)
                .map(|o| Record {
                    offset: o as i64,
                    timestamp: times[o],
                    timestamp_type: TimestampType::CreateTime,
                    key: Some(b"a".to_vec().into()),
                    value: Some(format!("{name}{o}").into_bytes().into()),
                    headers: Vec::new(),
                    key_schema_metadata: None,
                    value_schema_metadata: None,
                })
                .collect(),
        };
    KafkaEvent {
        source: EventSource::SelfManaged,
        bootstrap_servers: "127.0.0.1:9092".into(),
        partitions: vec![
            records("left", l, &JOIN_LEFT, "L"),
            records("right", r, &JOIN_RIGHT, "R"),
        ],
    }
}

/// A stream–stream join under a retry with other boundaries: the event source delivers
/// `left` 0..3 and `right` 0..3, then (the commit lost) `left` 0..6 with `right` 2..6.
/// Kafka Streams' join emits every pair within the window once (a nested loop over the
/// input is the reference). lambda-streams loses none and invents none, and decides each
/// pair once, in the join item's conditional write: every emission of a pair names the same
/// record (its `lambda-streams-source` header, one of the pair's two records), and the pair
/// is emitted once per delivery of that record. So the output is at least once, like every
/// output of the framework, and a pair is never emitted from two records: an aggregation
/// after the join (keyed on the source record) counts it once (docs/state.md,
/// "Stream–stream joins").
#[tokio::test]
async fn a_stream_join_retried_with_other_boundaries_emits_each_pair_from_one_record() {
    let deliveries = [("left", [(0, 3), (0, 6)]), ("right", [(0, 3), (2, 6)])];
    let delivered = |topic: &str, offset: usize| {
        deliveries
            .iter()
            .filter(|(t, _)| *t == topic)
            .flat_map(|(_, ranges)| ranges.iter())
            .filter(|(lo, hi)| (*lo..*hi).contains(&offset))
            .count()
    };
    let mut reference = BTreeMap::new();
    for (i, l) in JOIN_LEFT.iter().enumerate() {
        for (j, r) in JOIN_RIGHT.iter().enumerate() {
            if (l - r).abs() <= JOIN_DIFFERENCE {
                reference.insert(format!("L{i}+R{j}"), (i, j));
            }
        }
    }
    let (topology, store, sink) = (join_topology(), MemoryStore::new(), MemorySink::new());
    for (l, r) in deliveries[0].1.into_iter().zip(deliveries[1].1) {
        topology
            .process(&join_event(l, r), &store, &sink)
            .await
            .expect("delivered");
    }
    let mut emitted: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for record in sink.records() {
        let value = String::from_utf8(record.value.clone().expect("value")).expect("utf-8");
        let source = record
            .header("lambda-streams-source")
            .map(|h| String::from_utf8_lossy(h).into_owned())
            .expect("a source header");
        emitted.entry(value).or_default().push(source);
    }
    assert_eq!(
        emitted.keys().collect::<Vec<_>>(),
        reference.keys().collect::<Vec<_>>(),
        "no pair lost, none invented"
    );
    let mut again = 0;
    for (pair, sources) in &emitted {
        let (i, j) = reference[pair];
        let emitter = &sources[0];
        assert!(
            sources.iter().all(|s| s == emitter),
            "{pair} emitted from two records: {sources:?}"
        );
        let times = if *emitter == format!("left:0:{i}") {
            delivered("left", i)
        } else {
            assert_eq!(
                *emitter,
                format!("right:0:{j}"),
                "{pair}: not one of its records"
            );
            delivered("right", j)
        };
        assert_eq!(
            sources.len(),
            times,
            "{pair}: once per delivery of {emitter}"
        );
        again += times - 1;
    }
    assert!(
        again > 0,
        "the retry emitted some pairs again (at least once)"
    );
}

/// An aggregate that outgrows DynamoDB's 400 KB item limit fails the batch with an error
/// naming the store and key and the limit; the stored item keeps its last good value and
/// version (nothing corrupt, nothing half-written), and a redelivery fails the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aggregate_over_400_kb_is_a_clear_error_and_writes_nothing() {
    let (client, table) = dynamo_table().await;
    let store = DynamoStore::new(client, table.clone(), Guarantee::ExactlyOnce);
    // Values of 100 KB for key "big": three fit in an item, five do not.
    let padding = "p".repeat(100 * 1024);
    let log = Log(vec![(0..5).map(|i| format!("big@{i}{padding}")).collect()]);
    let topology = seen_topology();
    let sink = MemorySink::new();
    topology
        .process(&log.event(&[(0, 0, 3)]), &store, &sink)
        .await
        .expect("300 KB fit");
    let before = store.get(SEEN, b"big").await.expect("read").expect("item");
    for _ in 0..2 {
        let error = topology
            .process(&log.event(&[(0, 3, 5)]), &store, &sink)
            .await
            .expect_err("500 KB do not fit");
        let message = error.to_string();
        assert!(
            message.contains("state store \"seen\", key \"big\"") && message.contains("400 KB"),
            "names the store, the key and the limit: {message}"
        );
    }
    let after = store.get(SEEN, b"big").await.expect("read").expect("item");
    assert_eq!(after, before, "the item is unchanged");
    let held: Vec<String> =
        serde_json::from_slice(after.aggregate.as_deref().expect("aggregate")).expect("json");
    assert_eq!(held.len(), 3);
}

/// The wall clock, epoch milliseconds.
fn now_ms() -> i64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970");
    i64::try_from(since.as_millis()).expect("ms fit in i64")
}
