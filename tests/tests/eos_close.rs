//! Exactly-once output of window closes on the real broker (issue 15): an emit-on-close windowed
//! count run by the local runner (duplicate deliveries, retries ending elsewhere, a crash after
//! state writes injected on purpose) and by handlers (a fenced zombie that re-claims the windows
//! its retry committed), with `exactly_once` output and a DynamoDB store on the emulator. Kafka's
//! own Java consumer with `read_committed` (`tests/fixtures/kafka/ReadAll.java`) must see every
//! window that closed exactly once, with the count computed here by brute force from the records
//! produced, and no window still open.
//!
//! Under exactly-once output a batch claims a closed window before emitting it (a
//! conditional write, keyed by the batch's attempt id, which its transaction commits as the
//! shadow offset's metadata): see `docs/state.md`, "Exactly-once output of window closes".
//! The same for a session count emitted on close, whose sessions close in the closing pass:
//! its rewrite of the key's item claims the sessions it emits.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use lambda_streams::dsl::{EmitStrategy, SessionWindows, TimeWindows};
use lambda_streams::lambda::Handler;
use lambda_streams::serdes::{DecimalI64, Utf8};
use lambda_streams::state::Store;
use lambda_streams::state::dynamodb::{DynamoStore, create_table};
use lambda_streams::state::fault::FaultyStore;
use lambda_streams::{BatchOptions, Guarantee, OutputGuarantee, StreamsBuilder, Topology};
use lambda_streams_e2e::*;
use local_runner::{Faults, admin};

const PARTITIONS: i32 = 3;
/// Records per partition.
const RECORDS: i64 = 24;
/// The windows' size, ms (no grace).
const SIZE: i64 = 20;
/// The first record's time (a multiple of [`SIZE`]).
const BASE: i64 = 1_700_000_000_000;
/// The sessions' inactivity gap, ms (no grace): a key's records are 4 or 7 ms apart, so
/// its sessions hold three records each (the first one, one).
const GAP: i64 = 4;

/// What the topology counts and emits on close.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Shape {
    /// Tumbling windows of [`SIZE`].
    Windows,
    /// Sessions of gap [`GAP`].
    Sessions,
}

/// Partition `p`'s record `i`: key `k<(i + p) mod 3>` at time `BASE + 5 i + p`.
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

/// The reference, by brute force: per window (`<key>@<start>`) that closed, its count. A
/// window closes once every partition's stream time (its latest record's time) reaches
/// its end.
fn closed_windows() -> BTreeMap<String, i64> {
    closed(Shape::Windows)
}

/// [`closed_windows`], or for [`Shape::Sessions`] per session (`<key>@<start>-<end>`) that
/// closed, its count: a key's record times merged while the next is within the gap of the
/// session's end (`t - end <= gap`, Kafka Streams' rule), closed once every partition's
/// stream time is past its end + gap.
fn closed(shape: Shape) -> BTreeMap<String, i64> {
    let low = (0..PARTITIONS)
        .map(|p| records(p).iter().map(|r| r.1).max().unwrap_or(i64::MIN))
        .min()
        .unwrap_or(i64::MIN);
    let mut counts = BTreeMap::new();
    if shape == Shape::Sessions {
        let mut times: BTreeMap<String, Vec<i64>> = BTreeMap::new();
        for p in 0..PARTITIONS {
            for (key, t) in records(p) {
                times.entry(key).or_default().push(t);
            }
        }
        for (key, mut ts) in times {
            ts.sort_unstable();
            let mut sessions: Vec<(i64, i64, i64)> = Vec::new();
            for t in ts {
                match sessions.last_mut() {
                    Some((_, end, n)) if t - *end <= GAP => {
                        *end = t;
                        *n += 1;
                    }
                    _ => sessions.push((t, t, 1)),
                }
            }
            for (start, end, n) in sessions {
                if end + GAP < low {
                    counts.insert(format!("{key}@{start}-{end}"), n);
                }
            }
        }
        return counts;
    }
    for p in 0..PARTITIONS {
        for (key, t) in records(p) {
            let start = t - t.rem_euclid(SIZE);
            if start + SIZE <= low {
                *counts.entry(format!("{key}@{start}")).or_default() += 1;
            }
        }
    }
    counts
}

/// A tumbling count of `input` emitted on close, each window as `<key>@<start>` → count;
/// or a session count emitted on close, each session as `<key>@<start>-<end>` → count;
/// when `merged`, merged with a plain count's updates (`c:<key>` → count: its outbox covers
/// them).
fn topology(shape: Shape, input: &str, output: &str, merged: bool) -> Topology {
    let builder = StreamsBuilder::new();
    let grouped = builder.stream(input, Utf8, Utf8).group_by_key(Utf8);
    let closes = match shape {
        Shape::Windows => grouped
            .windowed_by(TimeWindows::of_size(Duration::from_millis(SIZE as u64)))
            .emit_strategy(EmitStrategy::OnWindowClose)
            .count("closing")
            .to_stream()
            .map(|w, n| (format!("{}@{}", w.key, w.start), n)),
        Shape::Sessions => grouped
            .windowed_by_session(SessionWindows::with_inactivity_gap(Duration::from_millis(
                GAP as u64,
            )))
            .emit_strategy(EmitStrategy::OnWindowClose)
            .count("sessions")
            .to_stream()
            .map(|w, n| (format!("{}@{}-{}", w.key, w.start, w.end), n)),
    };
    if merged {
        let plain = grouped
            .count("plain-counts")
            .to_stream()
            .map(|k, n| (format!("c:{k}"), n));
        closes.merge(&plain).to(output, Utf8, DecimalI64);
    } else {
        closes.to(output, Utf8, DecimalI64);
    }
    builder.build()
}

struct Setup {
    shape: Shape,
    input: String,
    output: String,
    table: String,
    app: String,
    /// Whether the output has the plain count's updates merged in (see [`topology`]).
    merged: bool,
}

async fn setup(name: &str) -> Setup {
    setup_shape(name, Shape::Windows).await
}

async fn setup_shape(name: &str, shape: Shape) -> Setup {
    require_services();
    let s = Setup {
        shape,
        input: unique(&format!("{name}-in")),
        output: unique(&format!("{name}-out")),
        table: unique(name),
        app: unique(&format!("{name}-app")),
        merged: true,
    };
    let servers = bootstrap();
    for topic in [&s.input, &s.output] {
        admin::create_topic(&servers, topic, PARTITIONS)
            .await
            .expect("topic");
    }
    let all: Vec<(i32, String, i64)> = (0..PARTITIONS)
        .flat_map(|p| records(p).into_iter().map(move |(k, t)| (p, k, t)))
        .collect();
    produce_timed(&s.input, &all).await;
    create_table(&dynamo_client(), &s.table)
        .await
        .expect("table");
    s
}

fn handler(s: &Setup, store: Arc<dyn Store>) -> Handler {
    Handler::with_kafka_output(
        topology(s.shape, &s.input, &s.output, s.merged),
        store,
        None,
    )
    .with_options(BatchOptions {
        output: OutputGuarantee::ExactlyOnce,
        // Every partition holds the windows open until it delivered records past them.
        source_partitions: BTreeMap::from([(s.input.clone(), PARTITIONS)]),
        ..BatchOptions::default()
    })
    .with_application_id(&s.app)
    .with_event_read_committed(true)
}

fn dynamo(s: &Setup) -> DynamoStore {
    DynamoStore::new(dynamo_client(), s.table.clone(), Guarantee::ExactlyOnce)
}

/// Every record of `topic` as Kafka's Java consumer reads it with `read_committed`:
/// `(key, value)`.
fn kafka_read_committed(topic: &str) -> Vec<(String, String)> {
    kafka_read_all(topic, "read_committed")
        .into_iter()
        .map(|r| (r.key, r.value))
        .collect()
}

/// The violations of what a `read_committed` reader of the output sees, against
/// [`closed_windows`]: a closed window missing, seen more than once or with another
/// count, or a window that has not closed.
fn check_closes(s: &Setup) -> Vec<String> {
    check_closed(s)
}

/// [`check_closes`] for `shape`, against [`closed`]; and the plain count's updates merged
/// in: per key each version once, with a count growing with it, the last the key's number
/// of records.
fn check_closed(s: &Setup) -> Vec<String> {
    let (shape, output) = (s.shape, s.output.as_str());
    let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut plain: BTreeMap<String, BTreeMap<u64, Vec<i64>>> = BTreeMap::new();
    for r in kafka_read_all(output, "read_committed") {
        if let Some(key) = r.key.strip_prefix("c:") {
            let versions = plain.entry(key.to_owned()).or_default();
            let version = versions.entry(r.version.unwrap_or(0)).or_default();
            version.push(r.value.parse().unwrap_or(i64::MIN));
            continue;
        }
        seen.entry(r.key).or_default().push(r.value);
    }
    let mut violations = Vec::new();
    let mut want: BTreeMap<String, i64> = BTreeMap::new();
    for p in 0..PARTITIONS {
        for (key, _) in records(p) {
            *want.entry(key).or_default() += 1;
        }
    }
    for (key, n) in want.iter().filter(|_| s.merged) {
        let versions = plain.remove(key).unwrap_or_default();
        let counts: Vec<i64> = versions.values().flatten().copied().collect();
        let once = versions.values().all(|v| v.len() == 1);
        let growing = counts.windows(2).all(|w| w[0] < w[1]);
        if !once || !growing || counts.last() != Some(n) || versions.contains_key(&0) {
            violations.push(format!(
                "c:{key}: counts by version {versions:?}, expected once each, growing to {n}"
            ));
        }
    }
    for key in plain.keys() {
        violations.push(format!("c:{key}: the plain count of an unexpected key"));
    }
    for (window, count) in closed(shape) {
        let got = seen.remove(&window).unwrap_or_default();
        if got != [count.to_string()] {
            violations.push(format!("window {window}: seen {got:?}, expected [{count}]"));
        }
    }
    for (window, got) in seen {
        violations.push(format!("window {window} has not closed, seen {got:?}"));
    }
    violations
}

async fn run_runner(s: &Setup, faults: Faults, store: Arc<dyn Store>) -> (u64, u64) {
    let summary = run_in_process(
        handler(s, store),
        unique("group"),
        vec![s.input.clone()],
        5,
        faults,
    )
    .await;
    (summary.invocations, summary.failures)
}

#[test]
fn the_reference_closes_windows_and_leaves_some_open() {
    // 3 keys x 5 closed windows; the windows at the end stay open.
    let closed = closed_windows();
    assert_eq!(closed.len(), 15, "{closed:?}");
    assert_eq!(closed.values().sum::<i64>(), 3 * 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_closed_window_once_under_duplicates_and_shifted_retries() {
    let s = setup("eosclose-dup").await;
    let faults = Faults {
        duplicate_every: Some(2),
        extend_retry_every: Some(3),
        ..Faults::default()
    };
    let (invocations, _) = run_runner(&s, faults, Arc::new(dynamo(&s))).await;
    assert!(invocations > 15, "duplicates delivered: {invocations}");
    let violations = check_closes(&s);
    assert!(violations.is_empty(), "read_committed: {violations:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_closed_window_once_after_crashes_after_state_writes() {
    // The crash hits a state write, a claim or a re-claim of some batch: its transaction
    // aborts with whatever it emitted, and the retry (or the partition's next batch)
    // emits the claimed windows again, once.
    for k in [3, 17, 30] {
        let s = setup(&format!("eosclose-crash{k}")).await;
        let store = Arc::new(FaultyStore::fail_once_after(dynamo(&s), k));
        let (_, failures) = run_runner(&s, Faults::default(), store).await;
        assert_eq!(failures, 1, "one injected crash (after {k} writes)");
        let violations = check_closes(&s);
        assert!(violations.is_empty(), "after {k} writes: {violations:#?}");
    }
}

/// One event with every record, as the event source would deliver it.
fn event_of_all(input: &str) -> lambda_streams::event::KafkaEvent {
    use lambda_streams::event::{
        EventSource, KafkaEvent, PartitionRecords, Record, TimestampType, TopicPartition,
    };
    KafkaEvent {
        source: EventSource::SelfManaged,
        bootstrap_servers: bootstrap(),
        partitions: (0..PARTITIONS)
            .map(|p| PartitionRecords {
                tp: TopicPartition::new(input, p),
                records: records(p)
                    .into_iter()
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

/// A zombie: container A initialises its producers, reads the committed progress (none)
/// and freezes before its first state write; B, a retry of the same event, fences A, claims
/// and emits every closed window and commits. A then goes on: it finds B's claims, which it
/// takes for uncommitted (its progress read is older than B's commit), re-claims them (its
/// attempt id appended to B's) and is fenced when it produces. A delayed duplicate C finds B's
/// attempt committed and in each claim: it finishes them and emits nothing. Were A's re-claim
/// to replace B's attempt (the claim keeping only the last), C would emit every window again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zombie_re_claiming_committed_windows_emits_nothing() {
    // Without the plain count: A must reach its claims before its first produce fences it.
    let mut s = setup("eosclose-zombie").await;
    s.merged = false;
    let claims = zombie_then_duplicate(&s, Resume::AfterRetry).await;
    // A re-claimed windows B committed: their claims hold B's attempt, then A's. (A is
    // fenced at its first produce, which may come before it re-claimed the last windows:
    // those keep B's attempt alone.)
    assert_eq!(claims.len(), closed_windows().len(), "{claims:?}");
    assert_b_then_a(&claims);
    let violations = check_closes(&s);
    assert!(violations.is_empty(), "read_committed: {violations:#?}");
}

/// The zombie of [`a_zombie_re_claiming_committed_windows_emits_nothing`], let go while its
/// retry B is mid-way (before B's 2nd, 12th and 24th state write): A and B race through the
/// writes and claims. Which claims hold which attempts depends on the race (A may claim a
/// window B's closing query no longer finds: its claim keeps A's attempt alone, and the
/// partition's next batch, the duplicate C, emits it); whatever the race, a read_committed
/// consumer sees each closed window once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zombie_racing_its_retry_leaves_every_window_once() {
    for n in [2, 12, 24] {
        let s = setup(&format!("eosclose-race{n}")).await;
        let claims = zombie_then_duplicate(&s, Resume::DuringRetry(n)).await;
        eprintln!("A let go at B's write {n}: claims {claims:?}");
        let violations = check_closes(&s);
        assert!(
            violations.is_empty(),
            "A let go at B's write {n}: {violations:#?}"
        );
    }
}

#[test]
fn the_reference_closes_sessions_and_leaves_some_open() {
    // Per key, 24 records (8 per partition) 4 or 7 ms apart, mostly sessions of three:
    // 8 + 8 + 7 closed, and the last session of each key (2, 1 and 3 records) open.
    let closed = closed(Shape::Sessions);
    assert_eq!(closed.len(), 23, "{closed:?}");
    assert_eq!(closed.values().sum::<i64>(), 3 * RECORDS - 6, "{closed:?}");
    assert_eq!(
        closed.get(&format!("k1@{}-{}", BASE + 1, BASE + 5)),
        Some(&2)
    );
}

/// A session count emitted on close, run by the runner with duplicate deliveries, retries
/// ending elsewhere and a crash after 17 state writes (a rewrite, a claim, a re-claim of
/// some batch: its transaction aborts with what it emitted, and the retry or the
/// partition's next batch re-claims and emits the sessions' stored records once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_closed_session_once_under_duplicates_retries_and_a_crash() {
    let s = setup_shape("eosclose-sessions", Shape::Sessions).await;
    let faults = Faults {
        duplicate_every: Some(2),
        extend_retry_every: Some(3),
        ..Faults::default()
    };
    let store = Arc::new(FaultyStore::fail_once_after(dynamo(&s), 17));
    let (invocations, failures) = run_runner(&s, faults, store).await;
    assert!(invocations > 15, "duplicates delivered: {invocations}");
    assert_eq!(failures, 1, "one injected crash");
    let violations = check_closed(&s);
    assert!(violations.is_empty(), "read_committed: {violations:#?}");
}

/// The zombie of [`a_zombie_re_claiming_committed_windows_emits_nothing`] with sessions:
/// A freezes before its first state write; B fences it, closes every session in the
/// closing pass (each key's rewrite claims its sessions) and commits; A goes on, re-claims
/// B's claims (its attempt appended) and is fenced; the duplicate C finds B's attempt in
/// each claim, finishes them and emits nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zombie_re_claiming_committed_sessions_emits_nothing() {
    let mut s = setup_shape("eosclose-szombie", Shape::Sessions).await;
    s.merged = false;
    let claims = zombie_then_duplicate(&s, Resume::AfterRetry).await;
    // One claim per key's item (B closed all of a key's sessions in one rewrite), holding
    // B's attempt and, where A re-claimed it, A's.
    assert_eq!(claims.len(), 3, "{claims:?}");
    assert_b_then_a(&claims);
    let violations = check_closed(&s);
    assert!(violations.is_empty(), "read_committed: {violations:#?}");
}

/// The sessions' zombie let go while its retry is mid-way, as
/// [`a_zombie_racing_its_retry_leaves_every_window_once`]: each closed session once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zombie_racing_its_retry_leaves_every_session_once() {
    for n in [1, 3, 6] {
        let s = setup_shape(&format!("eosclose-srace{n}"), Shape::Sessions).await;
        let claims = zombie_then_duplicate(&s, Resume::DuringRetry(n)).await;
        eprintln!("A let go at B's write {n}: claims {claims:?}");
        let violations = check_closed(&s);
        assert!(
            violations.is_empty(),
            "A let go at B's write {n}: {violations:#?}"
        );
    }
}

/// The claims after [`zombie_then_duplicate`]: each holds B's attempt first and at most A's
/// after it, and A re-claimed at least one (A is fenced at its first produce, which may come
/// before it re-claimed the last ones: those keep B's attempt alone).
fn assert_b_then_a(claims: &[String]) {
    let b = claims
        .first()
        .and_then(|c| c.split(' ').next())
        .unwrap_or_default();
    assert!(
        claims.iter().all(|c| {
            let attempts: Vec<&str> = c.split(' ').collect();
            attempts[0] == b && attempts.len() <= 2
        }),
        "every claim by B, then at most A: {claims:?}"
    );
    assert!(
        claims.iter().any(|c| c.split(' ').count() == 2),
        "A re-claimed some of B's committed claims: {claims:?}"
    );
}

/// When the zombie A of [`zombie_then_duplicate`] goes on after its freeze.
#[derive(Clone, Copy)]
enum Resume {
    /// Once its retry B has committed (the schedule the claims assertions describe).
    AfterRetry,
    /// When B is about to make its `n`-th state write: A and B then race through the
    /// state writes and the claims (what a loaded machine made of a fixed-length freeze).
    DuringRetry(u64),
}

/// The zombie schedule on `s`: container A initialises its producers, reads the committed
/// progress (none) and freezes before its first state write; B, a retry of the same event,
/// fences A, claims and emits what closed and commits; A goes on (as `resume` says) and is
/// fenced; then the delayed duplicate C runs. Returns the claims (attempts) in the table
/// before C ran.
///
/// The freeze is a gate, not a fixed time: with a fixed one, a loaded machine made B slower
/// than the freeze, and A went on mid-way through B (it then claims windows B's closing
/// query no longer finds, which keep A's attempt alone until the partition's next batch, C
/// here, emits them: allowed, but not the schedule the claims assertions describe).
async fn zombie_then_duplicate(s: &Setup, resume: Resume) -> Vec<String> {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    let frozen = Arc::new(AtomicBool::new(false));
    let release = Arc::new(AtomicBool::new(false));
    let slow: Arc<dyn Store> = {
        let (frozen, release) = (Arc::clone(&frozen), Arc::clone(&release));
        Arc::new(FaultyStore::new(dynamo(s)).on_write(move |before| {
            if before == 0 {
                frozen.store(true, SeqCst);
                // Blocks A's task (one worker thread); B runs on the test's thread.
                let deadline = std::time::Instant::now() + Duration::from_secs(180);
                while !release.load(SeqCst) {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "the zombie was never let go"
                    );
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }))
    };
    let retry: Arc<dyn Store> = match resume {
        Resume::AfterRetry => Arc::new(dynamo(s)),
        Resume::DuringRetry(n) => {
            let release = Arc::clone(&release);
            Arc::new(FaultyStore::new(dynamo(s)).on_write(move |before| {
                if before == n {
                    release.store(true, SeqCst);
                }
            }))
        }
    };
    let a = handler(s, slow);
    let b = handler(s, retry);
    let c = handler(s, Arc::new(dynamo(s)));
    let event = event_of_all(&s.input);
    // A runs on a runtime of its own, on its own thread: its freeze blocks that thread
    // only. (Blocking a worker of the test's runtime stalled B too, for as long as A was
    // frozen: B went on only once A did, and the two raced.)
    let zombie = {
        let event = event.clone();
        std::thread::spawn(move || {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("a runtime for the zombie")
                .block_on(async move { a.handle_event(&event).await.map(|_| ()) })
        })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !frozen.load(SeqCst) {
        assert!(
            std::time::Instant::now() < deadline,
            "A never reached its state writes"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let started = std::time::Instant::now();
    b.handle_event(&event).await.expect("the retry succeeds");
    eprintln!("B took {:?}", started.elapsed());
    release.store(true, SeqCst);
    let e = tokio::task::spawn_blocking(move || zombie.join())
        .await
        .expect("joined")
        .expect("no panic")
        .expect_err("the zombie is fenced");
    eprintln!("the zombie: {e}");
    let claims = claims_in(&s.table).await;
    c.handle_event(&event)
        .await
        .expect("the duplicate succeeds");
    claims
}

/// The claims (`ca`, or a closing pass's `ca:<slot>`: the attempts, space-separated) of the
/// items in `table`.
async fn claims_in(table: &str) -> Vec<String> {
    use aws_sdk_dynamodb::types::AttributeValue;
    let mut claims = Vec::new();
    let mut pages = dynamo_client()
        .scan()
        .table_name(table)
        .consistent_read(true)
        .into_paginator()
        .send();
    while let Some(page) = pages.next().await {
        for item in page.expect("scan").items() {
            for (name, value) in item {
                if let (true, AttributeValue::S(attempts)) =
                    (name == "ca" || name.starts_with("ca:"), value)
                {
                    claims.push(attempts.clone());
                }
            }
        }
    }
    claims
}

/// A batch that closes more windows than one DynamoDB item could name: 2,500 windows with
/// 120-byte keys, whose claim register entries (about 180 bytes each) pass 400 KB together.
/// The register is paged (`state::dynamodb`, 64 items under its partition key): the batch
/// claims and emits every window, each once for read_committed, and its redelivery finishes
/// the claims and emits nothing. (On one item, every attempt of the batch failed on the
/// register's write, the partition stopped.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_closing_more_windows_than_one_item_can_name_emits_each_once() {
    use lambda_streams::event::{
        EventSource, KafkaEvent, PartitionRecords, Record, TimestampType, TopicPartition,
    };
    require_services();
    const WINDOWS: usize = 2_500;
    let (input, output) = (unique("eosclose-many-in"), unique("eosclose-many-out"));
    let (table, app) = (unique("eosclose-many"), unique("eosclose-many-app"));
    let servers = bootstrap();
    for topic in [&input, &output] {
        admin::create_topic(&servers, topic, 1)
            .await
            .expect("topic");
    }
    // Every key's window at BASE, then a record of key `z` 100 ms later closes them all.
    let key = |i: usize| format!("{i:05}{}", "k".repeat(115));
    let mut records: Vec<(i32, String, i64)> = (0..WINDOWS).map(|i| (0, key(i), BASE)).collect();
    records.push((0, "z".to_owned(), BASE + 100));
    produce_timed(&input, &records).await;
    create_table(&dynamo_client(), &table).await.expect("table");
    let event = KafkaEvent {
        source: EventSource::SelfManaged,
        bootstrap_servers: bootstrap(),
        partitions: vec![PartitionRecords {
            tp: TopicPartition::new(&input, 0),
            records: records
                .iter()
                .enumerate()
                .map(|(o, (_, key, t))| Record {
                    offset: o as i64,
                    timestamp: *t,
                    timestamp_type: TimestampType::CreateTime,
                    key: Some(key.clone().into_bytes().into()),
                    value: Some(key.clone().into_bytes().into()),
                    headers: Vec::new(),
                    key_schema_metadata: None,
                    value_schema_metadata: None,
                })
                .collect(),
        }],
    };
    let handler = || {
        let store = DynamoStore::new(dynamo_client(), table.clone(), Guarantee::ExactlyOnce);
        Handler::with_kafka_output(
            topology(Shape::Windows, &input, &output, false),
            Arc::new(store),
            None,
        )
        .with_options(BatchOptions {
            output: OutputGuarantee::ExactlyOnce,
            source_partitions: BTreeMap::from([(input.clone(), 1)]),
            ..BatchOptions::default()
        })
        .with_application_id(&app)
        .with_event_read_committed(true)
    };
    let expected: BTreeMap<String, Vec<String>> = (0..WINDOWS)
        .map(|i| (format!("{}@{BASE}", key(i)), vec!["1".to_owned()]))
        .collect();
    // The windows whose read_committed records differ from one "1" (the first 5 of them).
    let wrong = || {
        let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (key, value) in kafka_read_committed(&output) {
            seen.entry(key).or_default().push(value);
        }
        let keys: BTreeSet<&String> = seen.keys().chain(expected.keys()).collect();
        let wrong: Vec<String> = keys
            .into_iter()
            .filter(|k| seen.get(*k) != expected.get(*k))
            .map(|k| format!("{k}: {:?}", seen.get(k)))
            .collect();
        (wrong.len(), wrong.into_iter().take(5).collect::<Vec<_>>())
    };
    handler()
        .handle_event(&event)
        .await
        .expect("the batch claims and emits every window");
    assert_eq!(
        claims_in(&table).await.len(),
        WINDOWS,
        "every window claimed"
    );
    assert_eq!(wrong(), (0, Vec::new()), "each window once, count 1");
    handler()
        .handle_event(&event)
        .await
        .expect("the redelivery finishes the claims");
    assert!(claims_in(&table).await.is_empty(), "every claim finished");
    assert_eq!(wrong(), (0, Vec::new()), "each window still once");
}
