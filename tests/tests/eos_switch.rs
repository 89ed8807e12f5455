//! Switching a deployed topology from at-least-once to exactly-once output (issue 15),
//! on the real broker and dynoxide with the local runner: a windowed count (tumbling windows
//! of 1 s, grace 0.5 s, emitted on update) runs under `at_least_once` output, then the same
//! function, table and consumer group run under `exactly_once`, with nothing in the shadow
//! group yet. The first records after the switch are late by the stream time the
//! at-least-once batches reached (their windows closed), and must stay out, as Kafka Streams
//! decides lateness: on the partition's stream time over everything it has read.
//!
//! Checked against a brute-force reference computed here from the records produced (per
//! partition, in offset order, a record is late when its window's end + grace is at or
//! before the highest timestamp read so far in its partition, its own included): the state's
//! count of every window (read from the table), the last update of every window that Kafka's
//! Java consumer reads with `read_committed` (the highest `lambda-streams-version`), no
//! update after the switch of a window that had closed before it, and every `(window,
//! version)` seen once after the switch. See docs/state.md, "Switching to exactly-once
//! output".

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use lambda_streams::dsl::TimeWindows;
use lambda_streams::lambda::Handler;
use lambda_streams::serdes::{DecimalI64, Utf8};
use lambda_streams::state::Store;
use lambda_streams::state::dynamodb::{DynamoStore, create_table};
use lambda_streams::{BatchOptions, Guarantee, OutputGuarantee, StreamsBuilder, Topology};
use lambda_streams_e2e::*;
use local_runner::{Faults, admin};

const PARTITIONS: i32 = 2;
/// The windows' size and grace, ms.
const SIZE: i64 = 1_000;
const GRACE: i64 = 500;
/// The first window's start.
const BASE: i64 = 1_700_000_000_000;
const STORE: &str = "switch-counts";
const KEYS: [&str; 3] = ["k0", "k1", "k2"];

/// Partition `p`'s records before the switch: key `k<i mod 3>` every 250 ms from `BASE`
/// (12 records: its stream time reaches `BASE + 2,750 + p`, which closes the windows of
/// `BASE` and `BASE + 1,000`).
fn before(p: i32) -> Vec<(String, i64)> {
    (0..12)
        .map(|i| (KEYS[i % 3].to_owned(), BASE + 250 * i as i64 + i64::from(p)))
        .collect()
}

/// Partition `p`'s records after the switch: first two late ones (in the closed windows of
/// `BASE` and `BASE + 1,000`), then on time from `BASE + 2,200` on, with one more late
/// record in the middle.
fn after(p: i32) -> Vec<(String, i64)> {
    let mut records = vec![
        ("k0".to_owned(), BASE + 100 + i64::from(p)),
        ("k1".to_owned(), BASE + 1_100 + i64::from(p)),
    ];
    for i in 0..10 {
        records.push((KEYS[i % 3].to_owned(), BASE + 2_200 + 200 * i as i64));
        if i == 4 {
            // Stream time BASE + 3,000 by now: the window of BASE + 1,000 closed long ago.
            records.push(("k2".to_owned(), BASE + 1_900));
        }
    }
    records
}

fn window_of(t: i64) -> i64 {
    t - t.rem_euclid(SIZE)
}

/// The reference: per window (`<key>@<start>`), the count of its records that are not
/// late, and the windows closed at the switch (by the stream time of any partition).
fn reference() -> (BTreeMap<String, i64>, BTreeSet<String>) {
    let (mut counts, mut closed) = (BTreeMap::new(), BTreeSet::new());
    for p in 0..PARTITIONS {
        let mut stream_time = i64::MIN;
        let before = before(p);
        for (i, (key, t)) in before.iter().chain(after(p).iter()).enumerate() {
            if i == before.len() {
                for (k, t) in &before {
                    let start = window_of(*t);
                    if start + SIZE + GRACE <= stream_time {
                        closed.insert(format!("{k}@{start}"));
                    }
                }
            }
            stream_time = stream_time.max(*t);
            let start = window_of(*t);
            if start + SIZE + GRACE > stream_time {
                *counts.entry(format!("{key}@{start}")).or_default() += 1;
            }
        }
    }
    (counts, closed)
}

/// A tumbling count of `input`, emitted on update as `<key>@<start>` → count.
fn topology(input: &str, output: &str) -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream(input, Utf8, Utf8)
        .group_by_key(Utf8)
        .windowed_by(
            TimeWindows::of_size(Duration::from_millis(SIZE as u64))
                .grace(Duration::from_millis(GRACE as u64)),
        )
        .count(STORE)
        .to_stream()
        .map(|w, n| (format!("{}@{}", w.key, w.start), n))
        .to(output, Utf8, DecimalI64);
    builder.build()
}

struct Setup {
    input: String,
    output: String,
    table: String,
    group: String,
}

async fn produce(s: &Setup, records: impl Fn(i32) -> Vec<(String, i64)>) {
    let all: Vec<(i32, String, i64)> = (0..PARTITIONS)
        .flat_map(|p| records(p).into_iter().map(move |(k, t)| (p, k, t)))
        .collect();
    produce_timed(&s.input, &all).await;
}

/// Runs the function with `output` guarantee over what the group has not consumed yet.
async fn run(s: &Setup, output: OutputGuarantee, faults: Faults) -> (u64, u64) {
    let store: Arc<dyn Store> = Arc::new(DynamoStore::new(
        dynamo_client(),
        s.table.clone(),
        Guarantee::ExactlyOnce,
    ));
    let handler = Handler::with_kafka_output(topology(&s.input, &s.output), store, None)
        .with_options(BatchOptions {
            output,
            ..BatchOptions::default()
        })
        .with_application_id(format!("{}-app", s.table))
        .with_event_read_committed(true);
    let summary = run_in_process(handler, s.group.clone(), vec![s.input.clone()], 4, faults).await;
    (summary.invocations, summary.failures)
}

/// The state's count per window, read through the store's window query.
async fn state_counts(table: &str) -> BTreeMap<String, i64> {
    let store = DynamoStore::new(dynamo_client(), table.to_owned(), Guarantee::ExactlyOnce);
    let mut counts = BTreeMap::new();
    for key in KEYS {
        let windows = store
            .windows(STORE, key.as_bytes(), BASE - 10 * SIZE, BASE + 10 * SIZE)
            .await
            .expect("windows");
        for (start, item) in windows {
            counts.insert(format!("{key}@{start}"), item.value);
        }
    }
    counts
}

#[test]
fn the_reference_has_late_records_after_the_switch() {
    let (counts, closed) = reference();
    // Both partitions close the windows of BASE and BASE + 1,000 before the switch.
    let closed_windows: Vec<&str> = closed.iter().map(String::as_str).collect();
    assert_eq!(
        closed_windows,
        [
            format!("k0@{BASE}"),
            format!("k0@{}", BASE + 1_000),
            format!("k1@{BASE}"),
            format!("k1@{}", BASE + 1_000),
            format!("k2@{BASE}"),
            format!("k2@{}", BASE + 1_000),
        ]
    );
    // 2 x (12 + 10) records count; 2 x 3 are late.
    assert_eq!(counts.values().sum::<i64>(), 2 * 22);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switch_to_exactly_once_keeps_closed_windows_closed() {
    switch_to_exactly_once("eosswitch", false).await;
}

/// A switch back: the first half of the records before the switch run exactly once, the
/// second half at least once (their stream time closes the windows that the shadow group's
/// committed stream time, as of the first half, still holds open), then the rest exactly
/// once again, with the same function, table, consumer group and shadow group. Each
/// partition is seeded again from the persisted time, which at-least-once batches record
/// having read past its committed progress (before that seed, windows `k0@BASE` and
/// `k1@BASE+1000` reopened: counts 6 instead of 4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switch_back_to_exactly_once_keeps_closed_windows_closed() {
    switch_to_exactly_once("eosswitchback", true).await;
}

/// The records before the switch at least once (when `back`, their first half exactly
/// once before), then the records after it exactly once, checked against the reference.
async fn switch_to_exactly_once(name: &str, back: bool) {
    require_services();
    let s = Setup {
        input: unique(&format!("{name}-in")),
        output: unique(&format!("{name}-out")),
        table: unique(name),
        group: unique(&format!("{name}-group")),
    };
    for topic in [&s.input, &s.output] {
        admin::create_topic(&bootstrap(), topic, PARTITIONS)
            .await
            .expect("topic");
    }
    create_table(&dynamo_client(), &s.table)
        .await
        .expect("table");
    let (counts, closed) = reference();

    if back {
        // Exactly once first, then at least once.
        produce(&s, |p| before(p)[..6].to_vec()).await;
        run(&s, OutputGuarantee::ExactlyOnce, Faults::default()).await;
        produce(&s, |p| before(p)[6..].to_vec()).await;
    } else {
        produce(&s, before).await;
    }
    // At least once: the deployed function.
    run(&s, OutputGuarantee::AtLeastOnce, Faults::default()).await;
    // Per output partition, the offset after the last record before the switch (aborted
    // records and transaction markers take offsets too).
    let switched_at: BTreeMap<i32, i64> = kafka_read_all(&s.output, "read_uncommitted")
        .iter()
        .fold(BTreeMap::new(), |mut n, r| {
            let next = n.entry(r.partition).or_default();
            *next = (*next).max(r.offset + 1);
            n
        });

    // Exactly once, same table and group, nothing in the shadow group yet; a retry of every
    // second batch after its success, as a longer batch.
    produce(&s, after).await;
    let faults = Faults {
        extend_retry_every: Some(2),
        ..Faults::default()
    };
    run(&s, OutputGuarantee::ExactlyOnce, faults).await;

    let mut violations = Vec::new();
    let state = state_counts(&s.table).await;
    if state != counts {
        violations.push(format!("state {state:?}, expected {counts:?}"));
    }
    let reads = kafka_read_all(&s.output, "read_committed");
    let mut last: BTreeMap<String, (u64, String)> = BTreeMap::new();
    let mut seen_after = BTreeSet::new();
    for r in &reads {
        let version = r.version.expect("a versioned update");
        if last.get(&r.key).is_none_or(|(v, _)| version > *v) {
            last.insert(r.key.clone(), (version, r.value.clone()));
        }
        let after_switch = r.offset >= switched_at.get(&r.partition).copied().unwrap_or(0);
        if after_switch {
            if closed.contains(&r.key) {
                violations.push(format!(
                    "window {} reopened after the switch: {} (version {version})",
                    r.key, r.value
                ));
            }
            if !seen_after.insert((r.key.clone(), version)) {
                violations.push(format!("{} version {version} seen twice", r.key));
            }
        }
    }
    let emitted: BTreeMap<String, i64> = last
        .into_iter()
        .map(|(k, (_, v))| (k, v.parse().expect("a count")))
        .collect();
    if emitted != counts {
        violations.push(format!(
            "last updates read_committed {emitted:?}, expected {counts:?}"
        ));
    }
    assert!(violations.is_empty(), "{violations:#?}");
}
