//! A table–table join at least once, when the two tables lose a joined key in turn and
//! each side's batch finds the other side already gone: a crashed batch's retry after the
//! other table's batch, or the two tables' batches in two orders. Whatever the order, the
//! join of the two tables' final values has no value for the key, so the update of the
//! key with the highest version (what a consumer of the joined table keeps) must be a
//! deletion. Expected values come from that rule, not from the join's code: per key, the
//! highest-versioned record is the join of the final values (none here).

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use lambda_streams::event::KafkaEvent;
use lambda_streams::serdes::{Nullable, Utf8};
use lambda_streams::sink::{MemorySink, OutputRecord, UnreachableSink};
use lambda_streams::state::memory::MemoryStore;
use lambda_streams::{StreamsBuilder, Topology};

/// The header with the version of a table update.
const VERSION_HEADER: &str = "lambda-streams-version";

/// `names ⋈ cities` (inner, left or outer), its change stream to `pairs`.
fn topology(kind: &str) -> Topology {
    let builder = StreamsBuilder::new();
    let names = builder.table("names", Utf8, Utf8, "names");
    let cities = builder.table("cities", Utf8, Utf8, "cities");
    let show = |v: Option<&String>| v.cloned().unwrap_or_else(|| "?".to_owned());
    let joined = match kind {
        "inner" => names.join(&cities, |_, n: &String, c: &String| format!("{n}@{c}")),
        "left" => names.left_join(&cities, move |_, n: &String, c: Option<&String>| {
            format!("{n}@{}", show(c))
        }),
        _ => names.outer_join(&cities, move |_, n: Option<&String>, c: Option<&String>| {
            format!("{}@{}", show(n), show(c))
        }),
    };
    joined.to_change_stream().to("pairs", Utf8, Nullable(Utf8));
    builder.build()
}

/// An event of one record of `topic`'s partition 0 at `offset`: key `a`, `value` (`None`:
/// a tombstone).
fn event(topic: &str, offset: i64, value: Option<&str>) -> KafkaEvent {
    let value = value.map_or_else(
        || "null".to_owned(),
        |v| format!("\"{}\"", STANDARD.encode(v)),
    );
    let json = format!(
        r#"{{"eventSource":"SelfManagedKafka","bootstrapServers":"b:9092","records":{{"{topic}-0":[{{"topic":"{topic}","partition":0,"offset":{offset},"timestamp":{ts},"timestampType":"CREATE_TIME","key":"{key}","value":{value},"headers":[]}}]}}}}"#,
        ts = 1_000 + offset,
        key = STANDARD.encode("a"),
    );
    KafkaEvent::decode(json.as_bytes()).expect("a valid event")
}

/// Per key of `pairs`, the record with the highest version (later records win a tie).
fn latest(records: &[OutputRecord]) -> BTreeMap<Vec<u8>, (u64, Option<Vec<u8>>)> {
    let mut latest: BTreeMap<Vec<u8>, (u64, Option<Vec<u8>>)> = BTreeMap::new();
    for r in records.iter().filter(|r| r.topic == "pairs") {
        let version: u64 = r
            .header(VERSION_HEADER)
            .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
            .expect("a versioned update");
        let key = r.key.clone().expect("a key");
        if latest.get(&key).is_none_or(|(v, _)| *v <= version) {
            latest.insert(key, (version, r.value.clone()));
        }
    }
    latest
}

/// A step: one batch of one record (`(topic, offset, value)`), and whether it crashes
/// after its state writes (its producer fails; its retry is a later step).
type Step<'a> = (&'a str, i64, Option<&'a str>, bool);

/// Runs the steps in order against one store.
async fn run(kind: &str, steps: &[Step<'_>]) -> Vec<OutputRecord> {
    let topology = topology(kind);
    let memory = MemoryStore::new();
    let sink = MemorySink::new();
    for &(topic, offset, value, crash) in steps {
        let event = event(topic, offset, value);
        match crash {
            true => {
                let failed = topology.process(&event, &memory, &UnreachableSink).await;
                assert!(failed.is_err(), "{topic}@{offset}: the injected crash");
            }
            false => {
                topology
                    .process(&event, &memory, &sink)
                    .await
                    .unwrap_or_else(|e| panic!("{topic}@{offset}: {e}"));
            }
        }
    }
    sink.records()
}

/// Both tables hold `a`, then both delete it; `names`' deletion crashes after its table
/// write (its producer fails), `cities` deletes, then `names`' batch is retried.
const CRASHED_THEN_OTHER_SIDE: &[Step] = &[
    ("names", 0, Some("n1"), false),
    ("cities", 0, Some("c1"), false),
    ("names", 1, None, true),
    ("cities", 1, None, false),
    ("names", 1, None, false),
];

#[tokio::test]
async fn a_pair_both_tables_lose_while_a_batch_is_retried_is_deleted() {
    for kind in ["inner", "left", "outer"] {
        let records = run(kind, CRASHED_THEN_OTHER_SIDE).await;
        let pairs: Vec<_> = records
            .iter()
            .filter(|r| r.topic == "pairs")
            .map(|r| r.value.as_deref().map(String::from_utf8_lossy))
            .collect();
        assert!(
            pairs.iter().any(|v| v.as_deref() == Some("n1@c1")),
            "{kind}: the pair was emitted: {pairs:?}"
        );
        let latest = latest(&records);
        assert_eq!(
            latest.get(b"a".as_slice()).map(|(_, v)| v.clone()),
            Some(None),
            "{kind}: the highest version of `a` deletes it: {pairs:?}"
        );
    }
}

#[tokio::test]
async fn a_pair_both_tables_lose_in_either_order_is_deleted() {
    for kind in ["inner", "left", "outer"] {
        for first in ["names", "cities"] {
            let second = if first == "names" { "cities" } else { "names" };
            let records = run(
                kind,
                &[
                    ("names", 0, Some("n1"), false),
                    ("cities", 0, Some("c1"), false),
                    (first, 1, None, false),
                    (second, 1, None, false),
                ],
            )
            .await;
            let latest = latest(&records);
            assert_eq!(
                latest.get(b"a".as_slice()).map(|(_, v)| v.clone()),
                Some(None),
                "{kind}, {first} first: {records:?}"
            );
        }
    }
}
