//! Exactly-once output of an inner stream–stream join on the real broker (issue 15): the local
//! runner delivers two topics (duplicate deliveries, retries ending elsewhere, a crash after state
//! writes injected on purpose) to a handler with `exactly_once` output and a DynamoDB store on the
//! emulator. The join's pairs go to one topic, and a count of pairs per key (an aggregation after
//! the join) to another. Kafka's own Java consumer with `read_committed`
//! (`tests/fixtures/kafka/ReadAll.java`) must see every pair the nested-loop reference computes
//! exactly once, and per key the counts' updates once per version, their versions 1..N complete,
//! the highest holding the reference's number of pairs.
//!
//! Which records a record joins is decided in the join item's conditional write, and the
//! pairs are kept in the item with the record that emits them, so a retry emits the same
//! pairs in that record's transaction (`docs/state.md`, "Stream–stream joins").

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use lambda_streams::dsl::JoinWindows;
use lambda_streams::lambda::Handler;
use lambda_streams::serdes::{DecimalI64, Utf8};
use lambda_streams::state::Store;
use lambda_streams::state::dynamodb::{DynamoStore, create_table};
use lambda_streams::state::fault::FaultyStore;
use lambda_streams::{BatchOptions, Guarantee, OutputGuarantee, StreamsBuilder, Topology};
use lambda_streams_e2e::*;
use local_runner::{Faults, admin};

const PARTITIONS: i32 = 2;
/// Records per partition and side.
const RECORDS: i64 = 12;
/// The join window, ms (either way).
const WINDOW: i64 = 10;
/// The first record's time.
const BASE: i64 = 1_700_000_000_000;

/// One side's records of partition `p`: `(key, value, time)`. Keys stay in their partition
/// on both sides (co-partitioned, as a join needs); the left side's records are 7 ms apart,
/// the right side's 5 ms, so a record meets a few of the other side's.
fn records(left: bool, p: i32) -> Vec<(String, String, i64)> {
    let (name, step, shift) = if left { ("L", 7, 0) } else { ("R", 5, 3) };
    (0..RECORDS)
        .map(|i| {
            (
                format!("k{p}{}", i % 2),
                format!("{name}{p}.{i}"),
                BASE + step * i + shift,
            )
        })
        .collect()
}

/// The reference, a nested loop: every `(key, "<left>+<right>")` whose two timestamps
/// differ by at most the window.
fn reference_pairs() -> BTreeSet<(String, String)> {
    let mut pairs = BTreeSet::new();
    for p in 0..PARTITIONS {
        for (lk, lv, lt) in records(true, p) {
            for (rk, rv, rt) in records(false, p) {
                if lk == rk && (lt - rt).abs() <= WINDOW {
                    pairs.insert((lk.clone(), format!("{lv}+{rv}")));
                }
            }
        }
    }
    pairs
}

/// The join's pairs to `pairs`, and their number per key to `counts`.
fn topology(s: &Setup) -> Topology {
    let builder = StreamsBuilder::new();
    let left = builder.stream(&s.left, Utf8, Utf8);
    let right = builder.stream(&s.right, Utf8, Utf8);
    let joined = left.join_stream(
        &right,
        JoinWindows::of(Duration::from_millis(WINDOW as u64)).grace(Duration::from_secs(60)),
        "pairs",
        (Utf8, Utf8, Utf8),
        |_, l: &String, r: &String| format!("{l}+{r}"),
    );
    joined.to(&s.pairs, Utf8, Utf8);
    joined
        .group_by_key(Utf8)
        .count("pair-counts")
        .to_stream()
        .to(&s.counts, Utf8, DecimalI64);
    builder.build()
}

struct Setup {
    left: String,
    right: String,
    pairs: String,
    counts: String,
    table: String,
    app: String,
}

async fn setup(name: &str) -> Setup {
    require_services();
    let s = Setup {
        left: unique(&format!("{name}-left")),
        right: unique(&format!("{name}-right")),
        pairs: unique(&format!("{name}-pairs")),
        counts: unique(&format!("{name}-counts")),
        table: unique(name),
        app: unique(&format!("{name}-app")),
    };
    let servers = bootstrap();
    for topic in [&s.left, &s.right, &s.pairs, &s.counts] {
        admin::create_topic(&servers, topic, PARTITIONS)
            .await
            .expect("topic");
    }
    let producer: rdkafka::producer::FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", servers)
        .set("enable.idempotence", "true")
        .create()
        .expect("producer");
    for (topic, left) in [(&s.left, true), (&s.right, false)] {
        for p in 0..PARTITIONS {
            for (key, value, t) in records(left, p) {
                let record = rdkafka::producer::FutureRecord::to(topic)
                    .key(&key)
                    .payload(&value)
                    .partition(p)
                    .timestamp(t);
                producer
                    .send(record, Duration::from_secs(10))
                    .await
                    .expect("produced");
            }
        }
    }
    create_table(&dynamo_client(), &s.table)
        .await
        .expect("table");
    s
}

async fn run_runner(s: &Setup, faults: Faults, store: Arc<dyn Store>) -> (u64, u64) {
    let handler = Handler::with_kafka_output(topology(s), store, None)
        .with_options(BatchOptions {
            output: OutputGuarantee::ExactlyOnce,
            source_partitions: BTreeMap::from([
                (s.left.clone(), PARTITIONS),
                (s.right.clone(), PARTITIONS),
            ]),
            ..BatchOptions::default()
        })
        .with_application_id(&s.app)
        .with_event_read_committed(true);
    let summary = run_in_process(
        handler,
        unique("group"),
        vec![s.left.clone(), s.right.clone()],
        5,
        faults,
    )
    .await;
    (summary.invocations, summary.failures)
}

/// The violations of what `read_committed` readers of the two outputs see, against
/// [`reference_pairs`].
fn check(s: &Setup) -> Vec<String> {
    let mut violations = Vec::new();
    let expected = reference_pairs();
    let mut seen: BTreeMap<(String, String), usize> = BTreeMap::new();
    for r in kafka_read_all(&s.pairs, "read_committed") {
        *seen.entry((r.key, r.value)).or_default() += 1;
    }
    for pair in &expected {
        match seen.remove(pair) {
            Some(1) => {}
            n => violations.push(format!("pair {pair:?} seen {} times", n.unwrap_or(0))),
        }
    }
    for (pair, n) in seen {
        violations.push(format!("pair {pair:?} invented, seen {n} times"));
    }
    let mut per_key: BTreeMap<String, usize> = BTreeMap::new();
    for (key, _) in &expected {
        *per_key.entry(key.clone()).or_default() += 1;
    }
    let mut updates: BTreeMap<String, Vec<(u64, String)>> = BTreeMap::new();
    for r in kafka_read_all(&s.counts, "read_committed") {
        match r.version {
            Some(v) => updates.entry(r.key).or_default().push((v, r.value)),
            None => violations.push(format!("a count update without a version: {}", r.key)),
        }
    }
    for (key, n) in per_key {
        // The key's count is written by records of two source partitions (one per topic),
        // whose transactions commit in either order: versions once each, in any order, and
        // the highest holds the final count (docs/state.md, "Exactly-once output").
        let mut got = updates.remove(&key).unwrap_or_default();
        got.sort();
        let versions: Vec<u64> = got.iter().map(|(v, _)| *v).collect();
        let complete: Vec<u64> = (1..=versions.len() as u64).collect();
        if versions != complete {
            violations.push(format!("{key}: versions {versions:?}, not 1..N once each"));
        }
        if got.last().map(|(_, value)| value.as_str()) != Some(n.to_string().as_str()) {
            violations.push(format!("{key}: counts {got:?}, expected to end at {n}"));
        }
    }
    for (key, got) in updates {
        violations.push(format!("{key}: counted without a pair: {got:?}"));
    }
    violations
}

#[test]
fn the_reference_joins_each_record_with_a_few() {
    let pairs = reference_pairs();
    // Every left record meets 2 to 4 right records of its key: neither none nor all.
    assert!(pairs.len() > 20 && pairs.len() < 100, "{}", pairs.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_pair_once_under_duplicates_and_shifted_retries() {
    let s = setup("eosjoin-dup").await;
    let faults = Faults {
        duplicate_every: Some(2),
        extend_retry_every: Some(3),
        ..Faults::default()
    };
    let store = DynamoStore::new(dynamo_client(), s.table.clone(), Guarantee::ExactlyOnce);
    let (invocations, _) = run_runner(&s, faults, Arc::new(store)).await;
    assert!(invocations > 10, "duplicates delivered: {invocations}");
    let violations = check(&s);
    assert!(violations.is_empty(), "read_committed: {violations:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_pair_once_after_crashes_after_state_writes() {
    // The crash hits the join's write or the count's of some batch: its transaction aborts
    // with whatever it emitted, and the retry emits the same pairs from the same records.
    for k in [2, 9, 21] {
        let s = setup(&format!("eosjoin-crash{k}")).await;
        let store = DynamoStore::new(dynamo_client(), s.table.clone(), Guarantee::ExactlyOnce);
        let store = Arc::new(FaultyStore::fail_once_after(store, k));
        let (_, failures) = run_runner(&s, Faults::default(), store).await;
        assert_eq!(failures, 1, "one injected crash (after {k} writes)");
        let violations = check(&s);
        assert!(violations.is_empty(), "after {k} writes: {violations:#?}");
    }
}
