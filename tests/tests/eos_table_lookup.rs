//! A table's updates through a stream–table join under exactly-once output on the real
//! broker (issue 15): a count of the `moves` stream per key, its updates left-joined with
//! the `names` table (`moved`), and inner-joined with it and merged with the names table's
//! own updates (`moved-inner`, the names' keys prefixed `n:`). The local runner reads both
//! topics with its redeliveries injected on purpose (every batch delivered twice, retries
//! ending elsewhere, crashes after some state writes) and invokes the handler in process,
//! its state on DynamoDB (the emulator); Kafka's own Java consumer (`read_committed`,
//! `tests/fixtures/kafka/ReadAll.java`: not our code) reads the outputs.
//!
//! Each update that waits at the join goes on in the transaction of its outbox entry's
//! record, so the consumer must see each `(key, version)` once; the left join's versions
//! 1..N per key, the count of the highest one the key's number of records (computed here
//! from the input alone); every joined name one the table held for the key (`?`, none,
//! only in the left join); the inner join's count of a version the left join's; and the
//! names' own updates each `(key, version)` once, the highest one the key's last name.

use std::collections::BTreeMap;
use std::sync::Arc;

use lambda_streams::lambda::Handler;
use lambda_streams::serdes::Utf8;
use lambda_streams::state::Store;
use lambda_streams::state::fault::FaultyStore;
use lambda_streams::{BatchOptions, OutputGuarantee, StreamsBuilder, Topology};
use lambda_streams_e2e::*;
use local_runner::{Faults, admin};

const PARTITIONS: i32 = 3;

/// The keys: `k<i>` in partition `i mod 3` of both topics (co-partitioned, as a
/// stream–table join requires).
const KEYS: usize = 6;

struct Topics {
    names: String,
    moves: String,
    /// The count's updates left-joined with the names.
    moved: String,
    /// The count's updates inner-joined with the names, merged with the names' updates.
    moved_inner: String,
}

fn topology(t: &Topics, output: OutputGuarantee) -> Topology {
    let builder = StreamsBuilder::new();
    builder.output_guarantee(output);
    let names = builder.table(&t.names, Utf8, Utf8, "names");
    let counts = builder
        .stream(&t.moves, Utf8, Utf8)
        .group_by_key(Utf8)
        .count("moves")
        .to_stream();
    counts
        .left_join(&names, |_, n: i64, name: Option<String>| {
            format!("{n}:{}", name.unwrap_or_else(|| "?".to_owned()))
        })
        .to(&t.moved, Utf8, Utf8);
    counts
        .join(&names, |_, n: i64, name: String| format!("{n}:{name}"))
        .merge(&names.to_stream().map(|k, name| (format!("n:{k}"), name)))
        .to(&t.moved_inner, Utf8, Utf8);
    builder.build()
}

/// Per partition of topic `side` (0: names, 1: moves), 12 records: key `k<3j + p>`; a
/// name `n<i>` (every 5th a tombstone), a move `m<i>`.
fn input_records(side: usize) -> Vec<Vec<(String, Option<String>)>> {
    (0..PARTITIONS as usize)
        .map(|p| {
            (0..12)
                .map(|i| {
                    let key = format!("k{}", 3 * ((i * 5 + side) % 2) + p);
                    let value = match side {
                        0 => (i % 5 != 4).then(|| format!("n{i}")),
                        _ => Some(format!("m{i}")),
                    };
                    (key, value)
                })
                .collect()
        })
        .collect()
}

/// Per key: every name the table held (`None`: none) in order, and the number of moves.
fn reference() -> BTreeMap<String, (Vec<Option<String>>, i64)> {
    let mut held: BTreeMap<String, (Vec<Option<String>>, i64)> = (0..KEYS)
        .map(|k| (format!("k{k}"), (vec![None], 0)))
        .collect();
    for records in input_records(0) {
        for (key, value) in records {
            held.get_mut(&key).expect("a known key").0.push(value);
        }
    }
    for records in input_records(1) {
        for (key, _) in records {
            held.get_mut(&key).expect("a known key").1 += 1;
        }
    }
    held
}

async fn run(name: &str, faults: Faults, fail_after_writes: Option<u64>) -> Topics {
    run_under(
        name,
        faults,
        fail_after_writes,
        OutputGuarantee::ExactlyOnce,
    )
    .await
}

/// [`run`] under the `output` guarantee.
async fn run_under(
    name: &str,
    faults: Faults,
    fail_after_writes: Option<u64>,
    output: OutputGuarantee,
) -> Topics {
    require_services();
    let t = Topics {
        names: unique(&format!("{name}-names")),
        moves: unique(&format!("{name}-moves")),
        moved: unique(&format!("{name}-moved")),
        moved_inner: unique(&format!("{name}-moved-inner")),
    };
    let servers = bootstrap();
    for topic in [&t.names, &t.moves, &t.moved, &t.moved_inner] {
        admin::create_topic(&servers, topic, PARTITIONS)
            .await
            .expect("topic");
    }
    for (side, topic) in [&t.names, &t.moves].into_iter().enumerate() {
        for (p, records) in input_records(side).iter().enumerate() {
            produce_keyed(topic, records, Some(p as i32)).await;
        }
    }
    let (_, dynamo) = exactly_once_store(name).await;
    let store: Arc<dyn Store> = match fail_after_writes {
        Some(n) => Arc::new(FaultyStore::fail_once_after(dynamo, n)),
        None => Arc::new(dynamo),
    };
    let handler = Handler::with_kafka_output(topology(&t, output), store, None)
        .with_options(BatchOptions {
            output,
            ..BatchOptions::default()
        })
        .with_application_id(unique(&format!("{name}-app")))
        .with_event_read_committed(true);
    let summary = run_in_process(
        handler,
        unique("group"),
        vec![t.names.clone(), t.moves.clone()],
        4,
        faults,
    )
    .await;
    if let Some(n) = fail_after_writes {
        assert_eq!(summary.failures, 1, "one injected crash (after {n} writes)");
    } else {
        assert!(
            summary.invocations > summary.batches,
            "redeliveries were injected: {} invocations, {} batches",
            summary.invocations,
            summary.batches
        );
    }
    t
}

/// Per key (as read), per version: the values read.
type Versions = BTreeMap<String, BTreeMap<u64, Vec<String>>>;

/// What Kafka's Java consumer reads `read_committed` from `topic`, per key and version;
/// updates without a version are violations.
fn read_versions(topic: &str, violations: &mut Vec<String>) -> Versions {
    let mut per_key = Versions::new();
    for r in kafka_read_all(topic, "read_committed") {
        let Some(version) = r.version else {
            violations.push(format!("{topic}: an update of {} without a version", r.key));
            continue;
        };
        per_key
            .entry(r.key)
            .or_default()
            .entry(version)
            .or_default()
            .push(r.value);
    }
    per_key
}

/// The count and the name of a joined value `<count>:<name>`.
fn parse(value: &str) -> Option<(i64, String)> {
    let (n, name) = value.split_once(':')?;
    Some((n.parse().ok()?, name.to_owned()))
}

fn check(t: &Topics) -> Vec<String> {
    let reference = reference();
    let mut violations = Vec::new();
    let moved = read_versions(&t.moved, &mut violations);
    let (names, merged): (Versions, Versions) = read_versions(&t.moved_inner, &mut violations)
        .into_iter()
        .partition(|(k, _)| k.starts_with("n:"));
    let names: Versions = names
        .into_iter()
        .map(|(k, v)| (k["n:".len()..].to_owned(), v))
        .collect();
    for (topic, per_key) in [
        ("moved", &moved),
        ("moved-inner", &merged),
        ("names", &names),
    ] {
        for (key, versions) in per_key {
            if !reference.contains_key(key) {
                violations.push(format!("{topic}: updates of an unexpected key {key}"));
            }
            for (version, values) in versions {
                if values.len() != 1 {
                    violations.push(format!(
                        "{topic}: ({key}, version {version}) seen {} times: {values:?}",
                        values.len()
                    ));
                }
            }
        }
    }
    for (key, (held, moves)) in &reference {
        let empty = BTreeMap::new();
        let left = moved.get(key).unwrap_or(&empty);
        let got: Vec<u64> = left.keys().copied().collect();
        if got != (1..=got.len() as u64).collect::<Vec<_>>() {
            violations.push(format!("moved: {key} has versions {got:?}, not 1..N"));
        }
        let last = left.last_key_value().and_then(|(_, v)| parse(&v[0]));
        if last.as_ref().map(|(n, _)| *n) != Some(*moves) {
            violations.push(format!(
                "moved: {key}'s highest version is {last:?}, the key has {moves} moves"
            ));
        }
        let inner = merged.get(key).unwrap_or(&empty);
        for (topic, versions, left_join) in [("moved", left, true), ("moved-inner", inner, false)] {
            for (version, values) in versions {
                let Some((n, name)) = parse(&values[0]) else {
                    violations.push(format!("{topic}: {key} = {values:?} is not <count>:<name>"));
                    continue;
                };
                let valid = held.iter().any(|h| match h {
                    Some(h) => *h == name,
                    None => left_join && name == "?",
                });
                if !valid {
                    violations.push(format!(
                        "{topic}: {key} version {version} = {values:?} joins a name the table \
                         never held"
                    ));
                }
                if !left_join {
                    let l = left.get(version).and_then(|v| parse(&v[0]));
                    if l.as_ref().map(|(c, _)| *c) != Some(n) {
                        violations.push(format!(
                            "{key} version {version}: the inner join's count {n}, the left \
                             join's {l:?}"
                        ));
                    }
                }
            }
        }
        // The names' own updates (no tombstones in `to_stream`): the highest version holds
        // the last name the key was given (its last non-null record).
        let last_name = held.iter().flatten().last();
        let got = names
            .get(key)
            .and_then(|v| v.last_key_value())
            .map(|(_, v)| &v[0]);
        if got != last_name {
            violations.push(format!(
                "names: {key}'s highest version holds {got:?}, its last name is {last_name:?}"
            ));
        }
    }
    violations
}

fn assert_exactly_once(t: &Topics) {
    let violations = check(t);
    if violations.is_empty() {
        return;
    }
    let mut all = String::new();
    for topic in [&t.moved, &t.moved_inner] {
        for r in kafka_read_all(topic, "read_uncommitted") {
            all.push_str(&format!(
                "{topic} p{} o{} {} v{:?} {} (from {})\n",
                r.partition, r.offset, r.key, r.version, r.value, r.source
            ));
        }
    }
    panic!("read_committed: {violations:#?}\nread_uncommitted:\n{all}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_batch_delivered_twice_joins_each_update_once() {
    let faults = Faults {
        duplicate_every: Some(1),
        ..Faults::default()
    };
    let t = run("eos-lookup-dup", faults, None).await;
    assert_exactly_once(&t);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_ending_elsewhere_join_each_update_once() {
    let faults = Faults {
        extend_retry_every: Some(2),
        ..Faults::default()
    };
    let t = run("eos-lookup-shifted", faults, None).await;
    assert_exactly_once(&t);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashes_after_state_writes_join_each_update_once() {
    for k in [2, 9, 17] {
        let t = run(&format!("eos-lookup-crash{k}"), Faults::default(), Some(k)).await;
        assert_exactly_once(&t);
    }
}

/// The control: the same topology at least once, every batch delivered twice. The
/// duplicates' updates are produced again, so the check above must find a `(key, version)`
/// seen twice (it can fail), while every value still joins a name the table held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_least_once_the_duplicates_updates_are_seen_twice() {
    let faults = Faults {
        duplicate_every: Some(1),
        ..Faults::default()
    };
    let t = run_under("alo-lookup-dup", faults, None, OutputGuarantee::AtLeastOnce).await;
    let violations = check(&t);
    assert!(
        violations.iter().any(|v| v.contains("seen 2 times")),
        "{violations:#?}"
    );
    assert!(
        violations.iter().all(|v| v.contains("seen ")),
        "only duplicates: {violations:#?}"
    );
}
