//! Exactly-once output of sessions and sliding windows emitted on update (Kafka Streams'
//! default emit strategy) on the real broker and dynoxide (issue 15). One record may change
//! several sessions (a merge deletes each session it bridges, a tombstone, and emits the
//! merged one) or several sliding windows, so one write of a key's item makes several
//! updates; under exactly-once output the item's outbox entry of the write holds the state
//! the write left, the updates of that write alone are derived from it, and a retry after
//! an aborted transaction produces them again from the entry, in the transaction of the
//! write's record (see `docs/state.md`, "The outbox of updates").
//!
//! The local runner runs a session count and a sliding count with duplicate deliveries,
//! retries ending elsewhere and a crash after k state writes; the records of one partition
//! are produced after the others were consumed, so that they bridge the sessions already
//! emitted (merges, tombstones). Kafka's own Java consumer with `read_committed` must see
//! each (windowed key, version)
//! once (a session's tombstone and its new value may share a version: a record within a
//! session merges it into a new one of the same bounds), every version of each key's item
//! among its updates, and the latest version of each session or window holding the value
//! computed here by brute force with Kafka Streams' definitions.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use lambda_streams::dsl::{SessionWindows, SlidingWindows};
use lambda_streams::lambda::Handler;
use lambda_streams::serdes::{DecimalI64, Nullable, Utf8};
use lambda_streams::state::Store;
use lambda_streams::state::dynamodb::{DynamoStore, create_table};
use lambda_streams::state::fault::FaultyStore;
use lambda_streams::{BatchOptions, Guarantee, OutputGuarantee, StreamsBuilder, Topology};
use lambda_streams_e2e::*;
use local_runner::{Faults, admin};

const PARTITIONS: i32 = 3;
/// Records per partition.
const RECORDS: i64 = 16;
/// The first record's time.
const BASE: i64 = 1_700_000_000_000;
/// The sessions' inactivity gap, ms.
const GAP: i64 = 4;
/// The sliding windows' time difference, ms.
const DIFFERENCE: i64 = 6;
/// The grace of both, long enough that no record is late and the items keep every
/// session and record (so the brute force below needs no lateness or retention).
const GRACE: Duration = Duration::from_secs(3600);

/// What the topology counts and emits on every update.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Shape {
    /// Sessions of gap [`GAP`], with the tombstones of merged sessions.
    Sessions,
    /// Sliding windows of difference [`DIFFERENCE`].
    Sliding,
}

impl Shape {
    fn store(self) -> &'static str {
        match self {
            Shape::Sessions => "sessions",
            Shape::Sliding => "sliding",
        }
    }
}

/// Partition `p`'s record `i`: key `k<(i + p) mod 3>` at time `BASE + 5 i + p`. A key's
/// records are then 4 or 7 ms apart (one from each partition in turn), so partition 2's
/// records bridge the sessions of gap 4 that partitions 0 and 1 leave.
fn records(p: i32) -> Vec<(String, i64)> {
    (0..RECORDS)
        .map(|i| {
            (
                format!("k{}", (i + i64::from(p)) % 3),
                BASE + 5 * i + i64::from(p),
            )
        })
        .collect()
}

/// Every key's record times (of the first `n` records of each partition), sorted.
fn times(n: usize) -> BTreeMap<String, Vec<i64>> {
    let mut times: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for p in 0..PARTITIONS {
        for (key, t) in records(p).into_iter().take(n) {
            times.entry(key).or_default().push(t);
        }
    }
    for ts in times.values_mut() {
        ts.sort_unstable();
    }
    times
}

/// The reference, by brute force with Kafka Streams' definitions: for sessions, per
/// session (`<key>@<start>-<end>`) its count, a key's record times merged while the next
/// is within the gap of the session's end (`t - end <= gap`); for sliding windows, per
/// window (`<key>@<start>`, the window `[start, start + difference]`) its count, the
/// windows being each record's left window `[t - difference, t]` and its right window
/// `[t + 1, t + 1 + difference]` when a later record falls in it. Also the windows that
/// must be there (every session; every left window). Of the first `n` records of each
/// partition.
fn reference(shape: Shape, n: usize) -> (BTreeMap<String, i64>, BTreeSet<String>) {
    let mut counts = BTreeMap::new();
    let mut required = BTreeSet::new();
    for (key, ts) in times(n) {
        match shape {
            Shape::Sessions => {
                let mut sessions: Vec<(i64, i64, i64)> = Vec::new();
                for &t in &ts {
                    match sessions.last_mut() {
                        Some((_, end, n)) if t - *end <= GAP => {
                            *end = t;
                            *n += 1;
                        }
                        _ => sessions.push((t, t, 1)),
                    }
                }
                for (start, end, n) in sessions {
                    let name = format!("{key}@{start}-{end}");
                    required.insert(name.clone());
                    counts.insert(name, n);
                }
            }
            Shape::Sliding => {
                let count = |start: i64| {
                    ts.iter()
                        .filter(|&&t| start <= t && t <= start + DIFFERENCE)
                        .count() as i64
                };
                for &t in &ts {
                    let left = format!("{key}@{}", t - DIFFERENCE);
                    counts.insert(left.clone(), count(t - DIFFERENCE));
                    required.insert(left);
                    if ts.iter().any(|&u| u > t && u <= t + 1 + DIFFERENCE) {
                        counts.insert(format!("{key}@{}", t + 1), count(t + 1));
                    }
                }
            }
        }
    }
    (counts, required)
}

/// The store of a plain count of the same records, whose updates are merged into the
/// output as `c:<key>` → count.
const PLAIN: &str = "plain-counts";

/// The count of `input` on update, each session as `<key>@<start>-<end>` → count (or a
/// tombstone), each sliding window as `<key>@<start>` → count, merged with a plain count's
/// updates (`c:<key>`): each store's outbox covers its own.
fn topology(shape: Shape, input: &str, output: &str) -> Topology {
    let builder = StreamsBuilder::new();
    let grouped = builder.stream(input, Utf8, Utf8).group_by_key(Utf8);
    let plain = grouped
        .count(PLAIN)
        .to_stream()
        .map(|k, n| (format!("c:{k}"), Some(n)));
    match shape {
        Shape::Sessions => grouped
            .windowed_by_session(
                SessionWindows::with_inactivity_gap(Duration::from_millis(GAP as u64)).grace(GRACE),
            )
            .count(shape.store())
            .to_change_stream()
            .map(|w, n| (format!("{}@{}-{}", w.key, w.start, w.end), n))
            .merge(&plain)
            .to(output, Utf8, Nullable(DecimalI64)),
        Shape::Sliding => grouped
            .windowed_by_sliding(SlidingWindows::of_time_difference_and_grace(
                Duration::from_millis(DIFFERENCE as u64),
                GRACE,
            ))
            .count(shape.store())
            .to_stream()
            .map(|w, n| (format!("{}@{}", w.key, w.start), Some(n)))
            .merge(&plain)
            .to(output, Utf8, Nullable(DecimalI64)),
    }
    builder.build()
}

struct Setup {
    shape: Shape,
    input: String,
    output: String,
    table: String,
    app: String,
    group: String,
}

async fn setup(name: &str, shape: Shape) -> Setup {
    require_services();
    let s = Setup {
        shape,
        input: unique(&format!("{name}-in")),
        output: unique(&format!("{name}-out")),
        table: unique(name),
        app: unique(&format!("{name}-app")),
        group: unique(&format!("{name}-group")),
    };
    let servers = bootstrap();
    for topic in [&s.input, &s.output] {
        admin::create_topic(&servers, topic, PARTITIONS)
            .await
            .expect("topic");
    }
    create_table(&dynamo_client(), &s.table)
        .await
        .expect("table");
    s
}

fn handler(s: &Setup, store: Arc<dyn Store>) -> Handler {
    handler_of(s, topology(s.shape, &s.input, &s.output), store)
}

fn handler_of(s: &Setup, topology: Topology, store: Arc<dyn Store>) -> Handler {
    Handler::with_kafka_output(topology, store, None)
        .with_options(BatchOptions {
            output: OutputGuarantee::ExactlyOnce,
            ..BatchOptions::default()
        })
        .with_application_id(&s.app)
        .with_event_read_committed(true)
}

fn dynamo(s: &Setup) -> DynamoStore {
    DynamoStore::new(dynamo_client(), s.table.clone(), Guarantee::ExactlyOnce)
}

async fn produce(s: &Setup, partitions: &[i32]) {
    let all: Vec<(i32, String, i64)> = partitions
        .iter()
        .flat_map(|&p| records(p).into_iter().map(move |(k, t)| (p, k, t)))
        .collect();
    produce_timed(&s.input, &all).await;
}

/// Runs the runner over partitions 0 and 1's records, then produces partition 2's (which
/// bridge the sessions already written) and runs it again, on `store` with `faults`.
/// Returns the invocations and failures.
async fn run(s: &Setup, faults: Faults, store: Arc<dyn Store>) -> (u64, u64) {
    let (mut invocations, mut failures) = (0, 0);
    produce(s, &[0, 1]).await;
    for phase in 0..2 {
        if phase == 1 {
            produce(s, &[2]).await;
        }
        let summary = run_in_process(
            handler(s, Arc::clone(&store)),
            s.group.clone(),
            vec![s.input.clone()],
            4,
            faults.clone(),
        )
        .await;
        invocations += summary.invocations;
        failures += summary.failures;
    }
    (invocations, failures)
}

/// The violations of what a `read_committed` reader of the output sees (see the file's
/// documentation), against [`reference`] of the first `n` records of each partition and the
/// items' versions in the table.
async fn check(s: &Setup, n: usize) -> Vec<String> {
    let (want, required) = reference(s.shape, n);
    let mut violations = Vec::new();
    // Per window: version -> (tombstones, values).
    let mut seen: BTreeMap<String, BTreeMap<u64, (usize, Vec<String>)>> = BTreeMap::new();
    let read = kafka_read_all(&s.output, "read_committed");
    // The plain count's updates: per key, version -> values.
    let mut plain: BTreeMap<String, BTreeMap<u64, Vec<i64>>> = BTreeMap::new();
    for r in &read {
        let Some(version) = r.version else {
            violations.push(format!("{}: no version header", r.key));
            continue;
        };
        if let Some(key) = r.key.strip_prefix("c:") {
            let value = r.value.parse().unwrap_or(i64::MIN);
            let versions = plain.entry(key.to_owned()).or_default();
            versions.entry(version).or_default().push(value);
            continue;
        }
        let entry = seen
            .entry(r.key.clone())
            .or_default()
            .entry(version)
            .or_default();
        if r.value == "null" {
            entry.0 += 1;
        } else {
            entry.1.push(r.value.clone());
        }
    }
    let mut tombstones = 0;
    for (window, versions) in &seen {
        for (version, (dead, values)) in versions {
            tombstones += dead;
            if *dead > 1 || values.len() > 1 {
                violations.push(format!(
                    "{window} version {version}: seen {dead} times as a tombstone and as \
                     {values:?}"
                ));
            }
        }
    }
    eprintln!(
        "{:?}: read_committed read {} updates of {} windows, {tombstones} tombstones",
        s.shape,
        read.len(),
        seen.len()
    );
    if s.shape == Shape::Sessions && tombstones == 0 {
        violations.push("no session was merged away: the test proves nothing of merges".into());
    }
    // Every version of each key's item among its windows' updates, and of its plain
    // count's item among those, once each, growing to the key's number of records.
    let store = dynamo(s);
    for (key, ts) in &times(n) {
        let last = store
            .get(PLAIN, key.as_bytes())
            .await
            .expect("read")
            .map_or(0, |i| i.version);
        let versions = plain.remove(key).unwrap_or_default();
        let got: Vec<u64> = versions.keys().copied().collect();
        let values: Vec<i64> = versions.values().flatten().copied().collect();
        let growing = values.windows(2).all(|w| w[0] < w[1]);
        if got != (1..=last).collect::<Vec<u64>>()
            || values.len() != got.len()
            || !growing
            || values.last() != Some(&(ts.len() as i64))
        {
            violations.push(format!(
                "c:{key}: versions {got:?} with counts {values:?}, its item at {last}, \
                 expected once each, growing to {}",
                ts.len()
            ));
        }
    }
    if !plain.is_empty() {
        violations.push(format!(
            "plain counts of unexpected keys {:?}",
            plain.keys()
        ));
    }
    for key in times(n).keys() {
        let last = store
            .get(s.shape.store(), key.as_bytes())
            .await
            .expect("read")
            .map_or(0, |i| i.version);
        let got: BTreeSet<u64> = seen
            .iter()
            .filter(|(w, _)| w.split_once('@').is_some_and(|(k, _)| k == key))
            .flat_map(|(_, v)| v.keys().copied())
            .collect();
        if got != (1..=last).collect::<BTreeSet<u64>>() {
            violations.push(format!(
                "key {key}: versions {got:?} among its updates, its item is at {last}"
            ));
        }
    }
    // The latest version of each window: live with the reference's count, or deleted.
    let live: BTreeMap<String, i64> = seen
        .iter()
        .filter_map(|(window, versions)| {
            let (_, (_, values)) = versions.iter().next_back()?;
            values
                .first()
                .map(|v| (window.clone(), v.parse().unwrap_or(i64::MIN)))
        })
        .collect();
    match s.shape {
        Shape::Sessions => {
            if live != want {
                violations.push(format!("live sessions {live:?}\nreference {want:?}"));
            }
        }
        Shape::Sliding => {
            for (window, n) in &live {
                match want.get(window) {
                    Some(w) if w == n => {}
                    other => violations.push(format!(
                        "window {window}: latest {n}, reference {other:?} (a left or right \
                         window of a record)"
                    )),
                }
            }
            for window in &required {
                if !live.contains_key(window) {
                    violations.push(format!("left window {window} never seen"));
                }
            }
        }
    }
    violations
}

/// Per item of the table (by partition key): its bytes as DynamoDB counts them (attribute
/// names plus values; numbers as their digits, a close upper bound) and, of those, the
/// outbox's (`ob:<tp>` lists and `o*:<tp>` slots).
async fn item_bytes(table: &str) -> BTreeMap<String, (usize, usize)> {
    use aws_sdk_dynamodb::types::AttributeValue;
    let out = dynamo_client()
        .scan()
        .table_name(table)
        .consistent_read(true)
        .send()
        .await
        .expect("scan");
    out.items()
        .iter()
        .filter_map(|item| {
            let Some(AttributeValue::S(pk)) = item.get("pk") else {
                return None;
            };
            let (mut all, mut outbox) = (0, 0);
            for (name, value) in item {
                let size = name.len()
                    + match value {
                        AttributeValue::S(s) => s.len(),
                        AttributeValue::N(n) => n.len().div_ceil(2) + 1,
                        AttributeValue::B(b) => b.as_ref().len(),
                        _ => 0,
                    };
                all += size;
                if name.starts_with('o') && name.contains(':') {
                    outbox += size;
                }
            }
            Some((pk.clone(), (all, outbox)))
        })
        .collect()
}

/// Prints the bytes of the store's items and of their outboxes; checks that the outbox
/// was used.
async fn measure(s: &Setup) {
    let prefix = format!("{}#", s.shape.store());
    let sizes: BTreeMap<String, (usize, usize)> = item_bytes(&s.table)
        .await
        .into_iter()
        .filter(|(pk, _)| pk.starts_with(&prefix))
        .collect();
    for (pk, (all, outbox)) in &sizes {
        eprintln!(
            "{:?} item {pk}: {all} bytes, of which the outbox {outbox}",
            s.shape
        );
    }
    assert!(
        sizes.values().any(|(_, outbox)| *outbox > 0),
        "the outbox holds entries: {sizes:?}"
    );
}

fn faults() -> Faults {
    Faults {
        duplicate_every: Some(2),
        extend_retry_every: Some(3),
        ..Faults::default()
    }
}

#[test]
fn the_references_merge_sessions_and_slide_windows() {
    // Per key 16 records, 4 or 7 ms apart: sessions of gap 4 of three records (the first
    // of one, the last of one or two).
    let (sessions, required) = reference(Shape::Sessions, RECORDS as usize);
    assert_eq!(sessions.values().sum::<i64>(), 3 * RECORDS);
    assert_eq!(sessions.len(), required.len());
    assert_eq!(sessions.get(&format!("k0@{BASE}-{BASE}")), Some(&1));
    assert_eq!(
        sessions.get(&format!("k0@{}-{}", BASE + 7, BASE + 15)),
        Some(&3)
    );
    // Sliding windows of 6 ms: a record's left window holds it and the one 4 ms before.
    let (windows, left) = reference(Shape::Sliding, RECORDS as usize);
    assert_eq!(left.len(), 3 * RECORDS as usize);
    assert_eq!(windows.get(&format!("k0@{}", BASE + 11 - 6)), Some(&2));
    assert!(windows.len() > left.len(), "right windows too");
}

/// Sessions on update, with merges: duplicates, shifted retries and a crash after `k`
/// state writes (its transaction aborts with the updates of
/// the writes before it; the retry finds those items written and emits their updates from
/// the outbox).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_session_update_once_under_duplicates_retries_and_crashes() {
    for k in [2, 9] {
        let s = setup(&format!("eosupd-sessions{k}"), Shape::Sessions).await;
        let store = Arc::new(FaultyStore::fail_once_after(dynamo(&s), k));
        let (invocations, failures) = run(&s, faults(), store).await;
        assert!(invocations > 12, "duplicates delivered: {invocations}");
        assert!(failures >= 1, "the injected crash (after {k} writes)");
        let violations = check(&s, RECORDS as usize).await;
        assert!(violations.is_empty(), "after {k} writes: {violations:#?}");
        measure(&s).await;
    }
}

/// Sliding windows on update: the same faults.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_sliding_window_update_once_under_duplicates_retries_and_crashes() {
    for k in [3, 11] {
        let s = setup(&format!("eosupd-sliding{k}"), Shape::Sliding).await;
        let store = Arc::new(FaultyStore::fail_once_after(dynamo(&s), k));
        let (invocations, failures) = run(&s, faults(), store).await;
        assert!(invocations > 12, "duplicates delivered: {invocations}");
        assert!(failures >= 1, "the injected crash (after {k} writes)");
        let violations = check(&s, RECORDS as usize).await;
        assert!(violations.is_empty(), "after {k} writes: {violations:#?}");
        measure(&s).await;
    }
}

/// One event of records `0..=to` of every partition, as the event source delivers it.
fn event(s: &Setup, to: usize) -> lambda_streams::event::KafkaEvent {
    use lambda_streams::event::{
        EventSource, KafkaEvent, PartitionRecords, Record, TimestampType, TopicPartition,
    };
    KafkaEvent {
        source: EventSource::SelfManaged,
        bootstrap_servers: bootstrap(),
        partitions: (0..PARTITIONS)
            .map(|p| PartitionRecords {
                tp: TopicPartition::new(&s.input, p),
                records: records(p)
                    .into_iter()
                    .take(to + 1)
                    .enumerate()
                    .map(|(o, (key, t))| Record {
                        offset: o as i64,
                        timestamp: t,
                        timestamp_type: TimestampType::CreateTime,
                        key: Some(key.clone().into_bytes().into()),
                        value: Some(key.into_bytes().into()),
                        headers: Vec::new(),
                        key_schema_metadata: None,
                        value_schema_metadata: None,
                    })
                    .collect(),
            })
            .collect(),
    }
}

/// An event of records 0..=3 of the three partitions (one write per key, merging sessions
/// within it) writes the three keys' session items, then crashes at the first write of a
/// second store, a plain count written after them (every partition's transaction aborts);
/// the retry is longer, 0..=7, as the event source may deliver it. A `read_committed` reader
/// must see both versions of each key (the crashed write's updates from the outbox, then the
/// retry's own), and the sessions of the 24 records. The control, the same store without the outbox (each write's
/// updates re-derived from the item's current state), loses version 1 of those keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_session_batch_retried_longer_emits_every_update_once() {
    for outbox in [true, false] {
        let name = if outbox {
            "eosupd-retry"
        } else {
            "eosupd-retry-control"
        };
        let s = setup(name, Shape::Sessions).await;
        let store: Arc<dyn Store> = if outbox {
            Arc::new(FaultyStore::fail_once_after(dynamo(&s), 3))
        } else {
            Arc::new(FaultyStore::fail_once_after(NoOutbox(dynamo(&s)), 3))
        };
        // The session count, and a count of the same records written after it, whose
        // updates are merged into the output (as `topology`'s).
        let builder = StreamsBuilder::new();
        let stream = builder.stream(&s.input, Utf8, Utf8);
        let sessions = stream
            .group_by_key(Utf8)
            .windowed_by_session(
                SessionWindows::with_inactivity_gap(Duration::from_millis(GAP as u64)).grace(GRACE),
            )
            .count(Shape::Sessions.store())
            .to_change_stream()
            .map(|w, n| (format!("{}@{}-{}", w.key, w.start, w.end), n));
        let plain = stream
            .group_by_key(Utf8)
            .count(PLAIN)
            .to_stream()
            .map(|k, n| (format!("c:{k}"), Some(n)));
        sessions
            .merge(&plain)
            .to(&s.output, Utf8, Nullable(DecimalI64));
        let h = handler_of(&s, builder.build(), store);
        h.handle_event(&event(&s, 3))
            .await
            .expect_err("the injected crash");
        h.handle_event(&event(&s, 7))
            .await
            .expect("the longer retry");
        let store = dynamo(&s);
        for key in ["k0", "k1", "k2"] {
            let version = store
                .get(Shape::Sessions.store(), key.as_bytes())
                .await
                .expect("read")
                .map(|i| i.version);
            assert_eq!(
                version,
                Some(2),
                "{key}: written by the crash and by the retry"
            );
        }
        let violations = check(&s, 8).await;
        if outbox {
            assert!(violations.is_empty(), "{violations:#?}");
        } else {
            eprintln!("the control without the outbox: {violations:#?}");
            assert!(
                violations
                    .iter()
                    .any(|v| v.contains("versions {2} among its updates, its item is at 2")),
                "without the outbox, version 1 is lost: {violations:#?}"
            );
        }
    }
}
