//! Exactly-once output on the real broker (issue 15, design notes section 5a): the local
//! runner (the event source's redeliveries injected on purpose) and the handler with
//! `exactly_once` output, a DynamoDB store on the emulator, then an independent
//! `read_committed` reader that is not our code: Kafka's own Java consumer
//! (`tests/fixtures/kafka/ReadAll.java` on the client of the broker's install that
//! `scripts/services` keeps), run with `isolation.level=read_committed`.
//! It must see every stateless output (two per record), every repartition record and
//! every dead letter exactly once; the counts in DynamoDB equal the reference.
//!
//! The Java consumer is used rather than Python's `confluent-kafka`: it needs no install
//! (the broker's libraries are on the machine already), and it is Kafka's reference
//! implementation of `read_committed` (librdkafka, under our producer, is not).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use lambda_streams::dsl::Grouped;
use lambda_streams::lambda::Handler;
use lambda_streams::serdes::{DecimalI64, Utf8};
use lambda_streams::state::Store;
use lambda_streams::state::dynamodb::{DynamoStore, create_table};
use lambda_streams::state::fault::FaultyStore;
use lambda_streams::{
    BatchOptions, Guarantee, OutputGuarantee, PoisonPolicy, StreamsBuilder, Topology,
};
use lambda_streams_e2e::*;
use local_runner::{Faults, InProcess, Runner, RunnerConfig, admin};

const PARTITIONS: i32 = 3;
const STORE: &str = "counts";

struct Topics {
    input: String,
    out: String,
    rep: String,
    dlq: String,
    /// The count's updates.
    counts: String,
    /// The updates of a general aggregate re-keyed directly (each item written from every
    /// partition).
    sums: String,
    /// The updates of both stores merged into one sink, keys prefixed `c:` (the count)
    /// and `s:` (the sums).
    merged: String,
}

/// The store of the directly re-keyed sums.
const SUMS: &str = "sums";

/// The key of a value `v<p>-<i>` in the sums: `i mod 3`, from every partition.
fn sum_key(value: &str) -> String {
    let i: i64 = value
        .rsplit('-')
        .next()
        .and_then(|i| i.parse().ok())
        .unwrap_or(0);
    format!("s{}", i % 3)
}

/// What a value `v<p>-<i>` adds to its sum: `i + 1` (so every update grows it).
fn sum_term(value: &str) -> i64 {
    value
        .rsplit('-')
        .next()
        .and_then(|i| i.parse::<i64>().ok())
        .unwrap_or(0)
        + 1
}

/// Per record: two stateless outputs to `out` (a fan-out), a repartition record to `rep`
/// (by value), a count per key; a record whose value is `poison` fails in the user's
/// function and is dead-lettered to `dlq`.
fn topology(t: &Topics) -> Topology {
    let builder = StreamsBuilder::new();
    let checked = builder
        .stream(&t.input, Utf8, Utf8)
        .try_map_values(|v: String| if v == "poison" { Err("poison") } else { Ok(v) });
    checked
        .flat_map_values(|v: String| [format!("{v}/1"), format!("{v}/2")])
        .to(&t.out, Utf8, Utf8);
    checked
        .select_key(|_, v: &String| v.clone())
        .repartition(&t.rep, Utf8, Utf8);
    let counts = checked.group_by_key(Utf8).count(STORE).to_stream();
    counts.to(&t.counts, Utf8, DecimalI64);
    let sums = checked
        .group_by(|_, v: &String| sum_key(v), Grouped::direct(Utf8))
        .aggregate(
            SUMS,
            || 0i64,
            |_, v: String, sum| sum + sum_term(&v),
            DecimalI64,
        )
        .to_stream();
    sums.to(&t.sums, Utf8, DecimalI64);
    // Both stores' updates merged into one sink: each store's outbox covers its own.
    counts
        .map(|k, n| (format!("c:{k}"), n))
        .merge(&sums.map(|k, n| (format!("s:{k}"), n)))
        .to(&t.merged, Utf8, DecimalI64);
    builder.build()
}

/// The input: per partition 20 records `k<i mod 4>` → `v<p>-<i>`, every 7th `poison`.
fn input_records() -> Vec<Vec<(String, Option<String>)>> {
    (0..PARTITIONS)
        .map(|p| {
            (0..20)
                .map(|i| {
                    let value = if (i + p) % 7 == 3 {
                        "poison".to_owned()
                    } else {
                        format!("v{p}-{i}")
                    };
                    (format!("k{}", i % 4), Some(value))
                })
                .collect()
        })
        .collect()
}

async fn setup(name: &str) -> (Topics, String, String) {
    require_services();
    let t = Topics {
        input: unique(&format!("{name}-in")),
        out: unique(&format!("{name}-out")),
        rep: unique(&format!("{name}-rep")),
        dlq: unique(&format!("{name}-dlq")),
        counts: unique(&format!("{name}-counts")),
        sums: unique(&format!("{name}-sums")),
        merged: unique(&format!("{name}-merged")),
    };
    let servers = bootstrap();
    for topic in [
        &t.input, &t.out, &t.rep, &t.dlq, &t.counts, &t.sums, &t.merged,
    ] {
        admin::create_topic(&servers, topic, PARTITIONS)
            .await
            .expect("topic");
    }
    for (p, records) in input_records().iter().enumerate() {
        produce_keyed(&t.input, records, Some(p as i32)).await;
    }
    let table = unique(name);
    create_table(&dynamo_client(), &table).await.expect("table");
    (t, table, unique(&format!("{name}-app")))
}

fn handler(t: &Topics, store: Arc<dyn Store>, app: &str, output: OutputGuarantee) -> Handler {
    Handler::with_kafka_output(topology(t), store, None)
        .with_options(BatchOptions {
            poison: PoisonPolicy::DeadLetter {
                topic: t.dlq.clone(),
            },
            output,
            ..BatchOptions::default()
        })
        .with_application_id(app)
        // The runner's consumer reads read_committed (librdkafka's default), and the
        // repartition topic is not consumed here anyway.
        .with_event_read_committed(true)
}

/// An update as Kafka's Java consumer read it: key, `lambda-streams-version`, value.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Update {
    key: String,
    version: u64,
    value: i64,
}

/// Every update of `topic` (a record with a version and a number as its value) as Kafka's
/// Java consumer reads it with `isolation_level`.
fn kafka_read_updates(topic: &str, isolation_level: &str) -> Vec<Update> {
    kafka_read_all(topic, isolation_level)
        .into_iter()
        .filter_map(|r| {
            Some(Update {
                version: r.version?,
                value: r.value.parse().ok()?,
                key: r.key,
            })
        })
        .collect()
}

/// Per key of `store` in `table`: its item's version (the number of updates it emitted).
async fn item_versions(table: &str, store: &str) -> BTreeMap<String, u64> {
    use aws_sdk_dynamodb::types::AttributeValue;
    let mut versions = BTreeMap::new();
    let mut pages = dynamo_client()
        .scan()
        .table_name(table)
        .consistent_read(true)
        .into_paginator()
        .send();
    while let Some(page) = pages.next().await {
        for item in page.expect("scan").items() {
            let (Some(AttributeValue::S(pk)), Some(AttributeValue::B(key))) =
                (item.get("pk"), item.get("k"))
            else {
                continue;
            };
            if !pk.starts_with(&format!("{store}#")) {
                continue;
            }
            let Some(AttributeValue::N(ver)) = item.get("ver") else {
                panic!("item without ver")
            };
            versions.insert(
                String::from_utf8(key.as_ref().to_vec()).expect("utf-8"),
                ver.parse().expect("a version"),
            );
        }
    }
    versions
}

/// The aggregate updates a reader with `isolation_level` sees, against the input (the
/// reference, computed here record by record): per key of the count and of the sums,
/// every version from 1 to its item's last exactly once, the values growing with the
/// version (each update adds at least one record), the last one the reference's.
async fn check_updates(t: &Topics, table: &str, isolation_level: &str) -> Vec<String> {
    let mut reference: [BTreeMap<String, i64>; 2] = Default::default();
    for records in input_records() {
        for (key, value) in records {
            let Some(value) = value.filter(|v| v != "poison") else {
                continue;
            };
            *reference[0].entry(key).or_default() += 1;
            *reference[1].entry(sum_key(&value)).or_default() += sum_term(&value);
        }
    }
    let mut violations = Vec::new();
    for (n, (topic, store, prefix)) in [
        (&t.counts, STORE, ""),
        (&t.sums, SUMS, ""),
        (&t.merged, STORE, "c:"),
        (&t.merged, SUMS, "s:"),
    ]
    .into_iter()
    .enumerate()
    {
        let reference = &reference[n % 2];
        let at = (topic.as_str(), prefix);
        violations.extend(check_update_topic(at, table, store, reference, isolation_level).await);
    }
    violations
}

/// The updates of `store` in `topic` against `reference` (see [`check_updates`]): those
/// whose key has `prefix`, the prefix taken off (a topic of several stores' updates).
async fn check_update_topic(
    (topic, prefix): (&str, &str),
    table: &str,
    store: &str,
    reference: &BTreeMap<String, i64>,
    isolation_level: &str,
) -> Vec<String> {
    let mut violations = Vec::new();
    let last = item_versions(table, store).await;
    let mut per_key: BTreeMap<String, BTreeMap<u64, Vec<i64>>> = BTreeMap::new();
    for u in kafka_read_updates(topic, isolation_level) {
        let Some(key) = u.key.strip_prefix(prefix) else {
            continue;
        };
        per_key
            .entry(key.to_owned())
            .or_default()
            .entry(u.version)
            .or_default()
            .push(u.value);
    }
    for (key, want) in reference {
        let versions = per_key.remove(key).unwrap_or_default();
        for (version, values) in &versions {
            if values.len() != 1 {
                violations.push(format!(
                    "{store}: ({key}, version {version}) seen {} times: {values:?}",
                    values.len()
                ));
            }
        }
        let got: Vec<u64> = versions.keys().copied().collect();
        let last = last.get(key).copied().unwrap_or(0);
        if got != (1..=last).collect::<Vec<_>>() {
            violations.push(format!(
                "{store}: key {key} has versions {got:?}, expected 1..={last}"
            ));
            continue;
        }
        let values: Vec<i64> = versions.values().map(|v| v[0]).collect();
        if values.windows(2).any(|w| w[1] <= w[0]) || values.last() != Some(want) {
            violations.push(format!(
                "{store}: key {key} has values {values:?} by version, expected growing to {want}"
            ));
        }
    }
    for key in per_key.keys() {
        violations.push(format!("{store}: updates of an unexpected key {key}"));
    }
    violations
}

/// Per record of `topic` read with `isolation_level`: its source header and its value.
fn kafka_read(topic: &str, isolation_level: &str) -> Vec<(String, String)> {
    kafka_read_all(topic, isolation_level)
        .into_iter()
        .map(|r| (r.source, r.value))
        .collect()
}

/// What a reader with `isolation_level` sees, against the input: the violations (an
/// output missing, or seen more than once), and how many records it read.
fn check_outputs(t: &Topics, isolation_level: &str) -> (Vec<String>, usize) {
    let mut seen: BTreeMap<(String, String, String), usize> = BTreeMap::new();
    let mut read = 0;
    for (topic, name) in [(&t.out, "out"), (&t.rep, "rep"), (&t.dlq, "dlq")] {
        for (source, value) in kafka_read(topic, isolation_level) {
            read += 1;
            let value = if name == "dlq" { String::new() } else { value };
            *seen.entry((name.to_owned(), source, value)).or_default() += 1;
        }
    }
    let mut expected: BTreeMap<(String, String, String), usize> = BTreeMap::new();
    for (p, records) in input_records().iter().enumerate() {
        for (o, (_, value)) in records.iter().enumerate() {
            let source = format!("{}:{p}:{o}", t.input);
            let value = value.clone().unwrap_or_default();
            if value == "poison" {
                expected.insert(("dlq".into(), source, String::new()), 1);
            } else {
                for suffix in ["/1", "/2"] {
                    expected.insert(
                        ("out".into(), source.clone(), format!("{value}{suffix}")),
                        1,
                    );
                }
                expected.insert(("rep".into(), source, value), 1);
            }
        }
    }
    let mut violations = Vec::new();
    for (what, want) in &expected {
        let got = seen.remove(what).unwrap_or(0);
        if got != *want {
            violations.push(format!("{what:?}: seen {got} times, expected {want}"));
        }
    }
    for (what, got) in seen {
        violations.push(format!("{what:?}: unexpected, seen {got} times"));
    }
    (violations, read)
}

fn reference_counts() -> BTreeMap<String, i64> {
    let mut counts = BTreeMap::new();
    for records in input_records() {
        for (key, value) in records {
            if value.as_deref() != Some("poison") {
                *counts.entry(key).or_default() += 1;
            }
        }
    }
    counts
}

struct Run {
    invocations: u64,
    batches: u64,
    failures: u64,
}

async fn run_runner(
    name: &str,
    faults: Faults,
    fail_after_writes: Option<u64>,
    output: OutputGuarantee,
) -> (Topics, String, Run) {
    let (t, table, app) = setup(name).await;
    let dynamo = DynamoStore::new(dynamo_client(), table.clone(), Guarantee::ExactlyOnce);
    let store: Arc<dyn Store> = match fail_after_writes {
        Some(n) => Arc::new(FaultyStore::fail_once_after(dynamo, n)),
        None => Arc::new(dynamo),
    };
    let handler = handler(&t, store, &app, output);
    let summary = run_in_process(handler, unique("group"), vec![t.input.clone()], 7, faults).await;
    let run = Run {
        invocations: summary.invocations,
        batches: summary.batches,
        failures: summary.failures,
    };
    (t, table, run)
}

/// Panics, naming the partition, when a partition of `topics` no longer starts at offset
/// 0: the broker deleted some of its records (retention), so a reader would miss them and
/// report them as never produced.
fn assert_nothing_deleted(topics: &[&String]) {
    use rdkafka::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .expect("consumer");
    for topic in topics {
        for p in 0..PARTITIONS {
            let (low, _) = consumer
                .fetch_watermarks(topic, p, Duration::from_secs(10))
                .expect("watermarks");
            assert_eq!(low, 0, "{topic}-{p}: records deleted by the broker");
        }
    }
}

async fn assert_exactly_once(t: &Topics, table: &str) {
    let (violations, read) = check_outputs(t, "read_committed");
    assert_nothing_deleted(&[&t.out, &t.rep, &t.dlq, &t.counts, &t.sums, &t.merged]);
    assert!(
        violations.is_empty(),
        "read_committed ({read} records): {violations:#?}"
    );
    assert_eq!(
        table_counts(table, STORE).await,
        reference_counts(),
        "state"
    );
    let violations = check_updates(t, table, "read_committed").await;
    assert!(
        violations.is_empty(),
        "read_committed aggregate updates: {violations:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_run_outputs_exactly_once() {
    let (t, table, run) = run_runner(
        "eos-clean",
        Faults::default(),
        None,
        OutputGuarantee::ExactlyOnce,
    )
    .await;
    assert_eq!(run.failures, 0);
    assert_exactly_once(&t, &table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_batch_delivered_twice_outputs_exactly_once() {
    let faults = Faults {
        duplicate_every: Some(1),
        ..Faults::default()
    };
    let (t, table, run) = run_runner("eos-dup", faults, None, OutputGuarantee::ExactlyOnce).await;
    assert!(
        run.invocations >= 2 * 9,
        "duplicates delivered: {}",
        run.invocations
    );
    assert_exactly_once(&t, &table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_ending_elsewhere_output_exactly_once() {
    // Every 2nd batch is failed after it succeeded (its transactions committed) and
    // delivered again as a longer batch: the retry's outputs of the records committed
    // already are dropped, the others produced.
    let faults = Faults {
        extend_retry_every: Some(2),
        ..Faults::default()
    };
    let (t, table, run) =
        run_runner("eos-shifted", faults, None, OutputGuarantee::ExactlyOnce).await;
    assert!(
        run.invocations > run.batches,
        "retries were injected: {} invocations, {} batches",
        run.invocations,
        run.batches
    );
    assert_exactly_once(&t, &table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_state_writes_outputs_exactly_once() {
    for k in [0, 2, 5] {
        let (t, table, run) = run_runner(
            &format!("eos-crash{k}"),
            Faults::default(),
            Some(k),
            OutputGuarantee::ExactlyOnce,
        )
        .await;
        assert_eq!(run.failures, 1, "one injected crash (after {k} writes)");
        assert_exactly_once(&t, &table).await;
    }
}

/// The control: the same duplicate deliveries at least once are seen twice by the same
/// reader, so the check above can see a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_least_once_the_same_reader_sees_the_duplicates() {
    let faults = Faults {
        duplicate_every: Some(1),
        ..Faults::default()
    };
    let (t, table, _) = run_runner("alo-dup", faults, None, OutputGuarantee::AtLeastOnce).await;
    let (violations, _) = check_outputs(&t, "read_committed");
    assert!(
        violations.iter().any(|v| v.contains("seen 2 times")),
        "at least once, duplicates are visible: {violations:#?}"
    );
    // The aggregate updates too: a redelivered batch emits its items' updates again.
    let violations = check_updates(&t, &table, "read_committed").await;
    assert!(
        violations.iter().any(|v| v.contains("seen 2 times")),
        "at least once, duplicate updates are visible: {violations:#?}"
    );
}

/// A zombie: container A takes a batch and is slow in its state writes (the event source
/// gives up on it); container B, a retry of the same batch, initialises the partition's
/// transactional id (fencing A), runs and commits; then A goes on and is fenced when it
/// produces: it fails, naming the partition and the transactional id, and produces
/// nothing visible. A later delayed duplicate on a cold container C reads the committed
/// progress and produces nothing again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zombie_is_fenced_and_a_delayed_duplicate_produces_nothing() {
    let (t, table, app) = setup("eos-zombie").await;
    let dynamo = || DynamoStore::new(dynamo_client(), table.clone(), Guarantee::ExactlyOnce);
    // A stops for 10 s before its first state write (it has initialised its producers and
    // read the progress by then), blocking its thread as a frozen container would; B starts
    // once A is there, so that B's initialisation comes after A's (on a loaded machine too).
    let frozen = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let slow: Arc<dyn Store> = {
        let frozen = Arc::clone(&frozen);
        Arc::new(FaultyStore::new(dynamo()).on_write(move |before| {
            if before == 0 {
                frozen.store(true, std::sync::atomic::Ordering::SeqCst);
                std::thread::sleep(Duration::from_secs(10));
            }
        }))
    };
    let a = handler(&t, slow, &app, OutputGuarantee::ExactlyOnce);
    let b = handler(&t, Arc::new(dynamo()), &app, OutputGuarantee::ExactlyOnce);
    let c = handler(&t, Arc::new(dynamo()), &app, OutputGuarantee::ExactlyOnce);
    let event = event_of_all(&t.input);
    let zombie = {
        let event = event.clone();
        tokio::spawn(async move { a.handle_event(&event).await.map(|_| ()) })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !frozen.load(std::sync::atomic::Ordering::SeqCst) {
        assert!(
            std::time::Instant::now() < deadline,
            "A never reached its state writes"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    b.handle_event(&event).await.expect("the retry succeeds");
    let zombie = zombie.await.expect("no panic");
    let e = zombie.expect_err("the zombie is fenced");
    let message = e.to_string();
    eprintln!("the zombie: {message}");
    assert!(
        message.contains("transactional.id") && message.contains(&format!("{app}-{}-", t.input)),
        "{message}"
    );
    c.handle_event(&event)
        .await
        .expect("the duplicate succeeds");
    assert_exactly_once(&t, &table).await;
}

/// The timestamp of the made-up events' first record: the time this test binary first
/// asked for it (one value, so that every delivery of a batch is the same event).
///
/// A record time of today, not of 1970: the outputs carry their source record's time, and
/// the broker's time-based retention (`log.retention.hours`, checked every
/// `log.retention.check.interval.ms`, 5 minutes) deletes a segment whose newest record is
/// older than the retention as soon as it checks. With a time of 1970 the outputs of these
/// events were deleted at the next check, and a reader that came after it saw every topic
/// empty (`read_committed (0 records)` in full runs, where the check more often falls
/// between the produce and the read).
fn event_time_base() -> i64 {
    static BASE: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    *BASE.get_or_init(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("the clock is after 1970");
        i64::try_from(now.as_millis()).expect("milliseconds fit in i64")
    })
}

/// One event with every input record, as the event source would deliver it.
fn event_of_all(input: &str) -> lambda_streams::event::KafkaEvent {
    use lambda_streams::event::{
        EventSource, KafkaEvent, PartitionRecords, Record, TimestampType, TopicPartition,
    };
    KafkaEvent {
        source: EventSource::SelfManaged,
        bootstrap_servers: bootstrap(),
        partitions: input_records()
            .into_iter()
            .enumerate()
            .map(|(p, records)| PartitionRecords {
                tp: TopicPartition::new(input, p as i32),
                records: records
                    .into_iter()
                    .enumerate()
                    .map(|(o, (k, v))| Record {
                        offset: o as i64,
                        timestamp: event_time_base() + o as i64,
                        timestamp_type: TimestampType::CreateTime,
                        key: Some(k.into_bytes().into()),
                        value: v.map(|v| v.into_bytes().into()),
                        headers: Vec::new(),
                        key_schema_metadata: None,
                        value_schema_metadata: None,
                    })
                    .collect(),
            })
            .collect(),
    }
}

/// Latency per batch, exactly-once output against at-least-once, on the real broker: a
/// warm handler (producers initialised by a first batch) on a stateless topology, batches
/// of 100 records over 1 and 3 partitions. Prints the numbers; run with
/// `cargo test -p lambda-streams-e2e --test eos_output -- --ignored --nocapture latency`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, not a check"]
async fn latency_per_batch_exactly_once_vs_at_least_once() {
    use lambda_streams::event::{
        EventSource, KafkaEvent, PartitionRecords, Record, TimestampType, TopicPartition,
    };
    use lambda_streams::state::memory::MemoryStore;
    require_services();
    // The input topic must exist (the shadow group's offsets are of its partitions); its
    // records are made up here, not read.
    let input = new_topic("bench-in", 3).await;
    let out = new_topic("bench-out", 3).await;
    let topology = || {
        let builder = StreamsBuilder::new();
        builder
            .stream(&input, Utf8, Utf8)
            .map_values(|v: String| v.to_uppercase())
            .to(&out, Utf8, Utf8);
        builder.build()
    };
    let event = |partitions: i32, batch: i64| KafkaEvent {
        source: EventSource::SelfManaged,
        bootstrap_servers: bootstrap(),
        partitions: (0..partitions)
            .map(|p| PartitionRecords {
                tp: TopicPartition::new(input.as_str(), p),
                records: (0..100 / i64::from(partitions))
                    .map(|i| {
                        let offset = batch * 100 + i;
                        Record {
                            offset,
                            timestamp: event_time_base() + offset,
                            timestamp_type: TimestampType::CreateTime,
                            key: Some(format!("k{i}").into_bytes().into()),
                            value: Some(format!("value {offset}").into_bytes().into()),
                            headers: Vec::new(),
                            key_schema_metadata: None,
                            value_schema_metadata: None,
                        }
                    })
                    .collect(),
            })
            .collect(),
    };
    for partitions in [1, 3] {
        for output in [OutputGuarantee::AtLeastOnce, OutputGuarantee::ExactlyOnce] {
            let handler =
                Handler::with_kafka_output(topology(), Arc::new(MemoryStore::new()), None)
                    .with_options(BatchOptions {
                        output,
                        ..BatchOptions::default()
                    })
                    .with_application_id(unique("bench-app"));
            let started = std::time::Instant::now();
            handler
                .handle_event(&event(partitions, 0))
                .await
                .expect("first batch");
            let first = started.elapsed();
            let mut times = Vec::new();
            for batch in 1..=40 {
                let started = std::time::Instant::now();
                handler
                    .handle_event(&event(partitions, batch))
                    .await
                    .expect("batch");
                times.push(started.elapsed().as_secs_f64() * 1000.0);
            }
            times.sort_by(f64::total_cmp);
            let mean = times.iter().sum::<f64>() / times.len() as f64;
            eprintln!(
                "{output:?}, {partitions} partition(s), 100 records per batch: first batch \
                 {:.1} ms; warm batches: mean {mean:.1} ms, p50 {:.1} ms, p90 {:.1} ms",
                first.as_secs_f64() * 1000.0,
                times[times.len() / 2],
                times[times.len() * 9 / 10],
            );
        }
    }
}

/// Two sub-topologies with a repartition hop, both run by the runner (its consumer reads
/// `read_committed`): the first re-keys each record by its value into `rep`, the second
/// fans each repartitioned record out to `out` twice and counts per value. Under duplicate
/// deliveries, retries ending elsewhere and a crash after state writes, a `read_committed`
/// reader sees every record of `rep` once per source record, and every output of the
/// second sub-topology once per record of `rep`; the counts are exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repartition_hop_outputs_exactly_once_end_to_end() {
    const HOP_STORE: &str = "per-value";
    const ORIGIN_STORE: &str = "per-origin";
    let (t, table, app) = setup("eos-hop").await;
    let topology = {
        let builder = StreamsBuilder::new();
        builder
            .stream(&t.input, Utf8, Utf8)
            .try_map_values(|v: String| if v == "poison" { Err("poison") } else { Ok(v) })
            .select_key(|_, v: &String| v.clone())
            .repartition(&t.rep, Utf8, Utf8);
        let hopped = builder.stream(&t.rep, Utf8, Utf8);
        hopped
            .flat_map_values(|v: String| [format!("{v}/1"), format!("{v}/2")])
            .to(&t.out, Utf8, Utf8);
        hopped.group_by_key(Utf8).count(HOP_STORE);
        // Re-keyed directly by the value's source partition (`v<p>`): each item written
        // from every partition of the repartition topic, its updates to `counts`.
        hopped
            .group_by(|_, v: &String| v[..2].to_owned(), Grouped::direct(Utf8))
            .count(ORIGIN_STORE)
            .to_stream()
            .to(&t.counts, Utf8, DecimalI64);
        builder.build()
    };
    let dynamo = DynamoStore::new(dynamo_client(), table.clone(), Guarantee::ExactlyOnce);
    let store: Arc<dyn Store> = Arc::new(FaultyStore::fail_once_after(dynamo, 3));
    let handler = Handler::with_kafka_output(topology.clone(), store, None)
        .with_options(BatchOptions {
            poison: PoisonPolicy::DeadLetter {
                topic: t.dlq.clone(),
            },
            output: OutputGuarantee::ExactlyOnce,
            ..BatchOptions::default()
        })
        .with_application_id(&app)
        .with_event_read_committed(true);
    handler
        .check()
        .expect("accepted: the runner reads read_committed");
    let config = RunnerConfig {
        bootstrap_servers: bootstrap(),
        group_id: unique("group"),
        topics: topology.source_topics(),
        batch_size: 7,
        batching_window: Duration::from_millis(100),
        until_idle: true,
        idle_timeout: Duration::from_millis(1500),
        retry_backoff: Duration::from_millis(10),
        faults: Faults {
            duplicate_every: Some(2),
            extend_retry_every: Some(3),
            ..Faults::default()
        },
        ..RunnerConfig::default()
    };
    let runner = Runner::new(config, Arc::new(InProcess::new(Arc::new(handler)))).expect("runner");
    tokio::time::timeout(Duration::from_secs(180), runner.run())
        .await
        .expect("the runner finished in time")
        .expect("the runner succeeded");

    let rep = kafka_read_all(&t.rep, "read_committed");
    let out = kafka_read_all(&t.out, "read_committed");
    // The original source record of each committed record of `rep`, by its position.
    let origin: BTreeMap<String, String> = rep
        .iter()
        .map(|r| {
            (
                format!("{}:{}:{}", t.rep, r.partition, r.offset),
                r.source.clone(),
            )
        })
        .collect();
    let mut seen: BTreeMap<(String, String), usize> = BTreeMap::new();
    for r in &rep {
        *seen.entry(("rep".into(), r.source.clone())).or_default() += 1;
    }
    for r in &out {
        let from = origin
            .get(&r.source)
            .unwrap_or_else(|| panic!("{:?} comes from no committed record of rep", r.source));
        *seen
            .entry(("out".into(), format!("{from} {}", r.value)))
            .or_default() += 1;
    }
    let mut expected: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut counts = BTreeMap::new();
    for (p, records) in input_records().iter().enumerate() {
        for (o, (_, value)) in records.iter().enumerate() {
            let value = value.clone().unwrap_or_default();
            if value == "poison" {
                continue;
            }
            let source = format!("{}:{p}:{o}", t.input);
            expected.insert(("rep".into(), source.clone()), 1);
            for suffix in ["/1", "/2"] {
                expected.insert(("out".into(), format!("{source} {value}{suffix}")), 1);
            }
            *counts.entry(value).or_insert(0i64) += 1;
        }
    }
    assert_eq!(seen, expected, "read_committed sees every output once");
    let (dead, _) = {
        let letters = kafka_read(&t.dlq, "read_committed");
        let n = letters.len();
        (letters, n)
    };
    assert_eq!(dead.len(), 9, "one dead letter per poison record");
    assert_eq!(table_counts(&table, HOP_STORE).await, counts, "state");
    let mut per_origin: BTreeMap<String, i64> = BTreeMap::new();
    for value in input_records().into_iter().flatten().filter_map(|(_, v)| v) {
        if value != "poison" {
            *per_origin.entry(value[..2].to_owned()).or_default() += 1;
        }
    }
    let violations = check_update_topic(
        (&t.counts, ""),
        &table,
        ORIGIN_STORE,
        &per_origin,
        "read_committed",
    )
    .await;
    assert!(
        violations.is_empty(),
        "read_committed updates after the hop: {violations:#?}"
    );
}

/// Records of an aborted transaction in the repartition topic (here written by a
/// transactional producer of the test, then aborted: what a fenced zombie or a crashed
/// invocation leaves), and a runner that reads `read_uncommitted` (so it delivers them, as
/// an event source of that isolation level would). The function reads each batch of the
/// repartition topic again with `read_committed` and processes only what it finds: no
/// output and no count of the aborted records. The control, a function told (wrongly)
/// that its event source reads committed, processes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aborted_repartition_records_are_not_processed_under_read_uncommitted() {
    for trust_the_event in [false, true] {
        let name = if trust_the_event {
            "eos-trust"
        } else {
            "eos-reread"
        };
        let (t, table, app) = setup(name).await;
        // Three aborted records in the repartition topic, as the hop writes them.
        {
            use rdkafka::ClientConfig;
            use rdkafka::message::{Header, OwnedHeaders};
            use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
            let producer: FutureProducer = ClientConfig::new()
                .set("bootstrap.servers", bootstrap())
                .set("transactional.id", unique("aborting"))
                .create()
                .expect("producer");
            producer
                .init_transactions(Duration::from_secs(10))
                .expect("init");
            producer.begin_transaction().expect("begin");
            for i in 0..3 {
                let source = format!("{}:0:{}", t.input, 900 + i);
                let headers = OwnedHeaders::new()
                    .insert(Header {
                        key: "lambda-streams-source",
                        value: Some(source.as_bytes()),
                    })
                    .insert(Header {
                        key: "lambda-streams-sequence",
                        value: Some(b"0"),
                    });
                let value = format!("aborted{i}");
                producer
                    .send(
                        FutureRecord::to(&t.rep)
                            .partition(0)
                            .key(&value)
                            .payload(&value)
                            .headers(headers),
                        Duration::from_secs(10),
                    )
                    .await
                    .expect("produced");
            }
            producer
                .abort_transaction(Duration::from_secs(10))
                .expect("abort");
        }
        let topology = {
            let builder = StreamsBuilder::new();
            builder
                .stream(&t.input, Utf8, Utf8)
                .try_map_values(|v: String| if v == "poison" { Err("poison") } else { Ok(v) })
                .select_key(|_, v: &String| v.clone())
                .repartition(&t.rep, Utf8, Utf8);
            let hopped = builder.stream(&t.rep, Utf8, Utf8);
            hopped
                .flat_map_values(|v: String| [format!("{v}/1"), format!("{v}/2")])
                .to(&t.out, Utf8, Utf8);
            hopped.group_by_key(Utf8).count("per-value");
            builder.build()
        };
        let store = Arc::new(DynamoStore::new(
            dynamo_client(),
            table.clone(),
            Guarantee::ExactlyOnce,
        ));
        let handler = Handler::with_kafka_output(topology.clone(), store, None)
            .with_options(BatchOptions {
                poison: PoisonPolicy::DeadLetter {
                    topic: t.dlq.clone(),
                },
                output: OutputGuarantee::ExactlyOnce,
                ..BatchOptions::default()
            })
            .with_application_id(&app)
            .with_event_read_committed(trust_the_event);
        let config = RunnerConfig {
            bootstrap_servers: bootstrap(),
            group_id: unique("group"),
            topics: topology.source_topics(),
            batch_size: 7,
            batching_window: Duration::from_millis(100),
            until_idle: true,
            idle_timeout: Duration::from_millis(1500),
            retry_backoff: Duration::from_millis(10),
            consumer_properties: vec![("isolation.level".into(), "read_uncommitted".into())],
            ..RunnerConfig::default()
        };
        let runner =
            Runner::new(config, Arc::new(InProcess::new(Arc::new(handler)))).expect("runner");
        tokio::time::timeout(Duration::from_secs(180), runner.run())
            .await
            .expect("the runner finished in time")
            .expect("the runner succeeded");
        let aborted_outputs = kafka_read(&t.out, "read_committed")
            .into_iter()
            .filter(|(_, v)| v.starts_with("aborted"))
            .count();
        let counts = table_counts(&table, "per-value").await;
        let counted = counts.keys().filter(|k| k.starts_with("aborted")).count();
        if trust_the_event {
            assert_eq!(
                (aborted_outputs, counted),
                (6, 3),
                "trusting a read_uncommitted event, the aborted records are processed"
            );
        } else {
            assert_eq!(
                (aborted_outputs, counted),
                (0, 0),
                "nothing of the aborted records"
            );
            let expected: usize = input_records()
                .iter()
                .flatten()
                .filter(|(_, v)| v.as_deref() != Some("poison"))
                .count();
            assert_eq!(counts.len(), expected, "every committed record counted");
            assert!(counts.values().all(|&n| n == 1), "once each: {counts:?}");
        }
    }
}

/// The event of partition 0's records `range` of the input.
fn event_of_partition_0(
    input: &str,
    range: std::ops::RangeInclusive<usize>,
) -> lambda_streams::event::KafkaEvent {
    let mut event = event_of_all(input);
    event.partitions.truncate(1);
    let records = std::mem::take(&mut event.partitions[0].records);
    event.partitions[0].records = records
        .into_iter()
        .filter(|r| range.contains(&(r.offset as usize)))
        .collect();
    event
}

/// A batch of partition 0 (records 0..=9) writes its counts, then crashes at its first
/// write of the sums (its transaction aborts, so none of its updates is visible); the
/// retry is longer (0..=14), as the event source may deliver it. A `read_committed` reader
/// must see each count's version 1 (the crashed batch's update, from the outbox) and
/// version 2 (the retry's own) once each. The control, the same store without the outbox,
/// re-derives only version 2: version 1 is never committed (a gap), which the same check
/// finds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_batch_retried_longer_emits_every_version_once() {
    for outbox in [true, false] {
        let name = if outbox {
            "eos-outbox"
        } else {
            "eos-no-outbox"
        };
        let (t, table, app) = setup(name).await;
        let dynamo = DynamoStore::new(dynamo_client(), table.clone(), Guarantee::ExactlyOnce);
        // The counts' four items (k0..k3) are written, the first write of the sums fails.
        let store: Arc<dyn Store> = if outbox {
            Arc::new(FaultyStore::fail_once_after(dynamo, 4))
        } else {
            Arc::new(FaultyStore::fail_once_after(NoOutbox(dynamo), 4))
        };
        let h = handler(&t, store, &app, OutputGuarantee::ExactlyOnce);
        h.handle_event(&event_of_partition_0(&t.input, 0..=9))
            .await
            .expect_err("the injected crash");
        h.handle_event(&event_of_partition_0(&t.input, 0..=14))
            .await
            .expect("the longer retry");
        let mut reference: BTreeMap<String, i64> = BTreeMap::new();
        for (key, value) in &input_records()[0][..15] {
            if value.as_deref() != Some("poison") {
                *reference.entry(key.clone()).or_default() += 1;
            }
        }
        assert_eq!(
            item_versions(&table, STORE)
                .await
                .values()
                .copied()
                .collect::<Vec<_>>(),
            vec![2; 4],
            "each count written twice"
        );
        let violations =
            check_update_topic((&t.counts, ""), &table, STORE, &reference, "read_committed").await;
        if outbox {
            assert!(violations.is_empty(), "{violations:#?}");
        } else {
            assert!(
                violations
                    .iter()
                    .any(|v| v.contains("versions [2], expected 1..=2")),
                "without the outbox, version 1 is lost: {violations:#?}"
            );
        }
    }
}
