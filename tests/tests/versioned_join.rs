//! On DynamoDB (the dynoxide emulator): a stream–table join with a grace period against a
//! versioned table joins every stream record exactly once with the table's value as of its
//! timestamp, also when the table update arrives after the stream record (within the
//! grace), under redelivery of every batch, under a crash part-way through a batch retried
//! with other boundaries, and for keys that get no later record.
//!
//! The expected records come from a reference written here: for each order, the latest
//! price of its key whose timestamp is at or before the order's, over all the price
//! updates (each arrives well within the grace), or none.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use lambda_streams::event::{
    EventSource, KafkaEvent, PartitionRecords, Record, TimestampType, TopicPartition,
};
use lambda_streams::serdes::Utf8;
use lambda_streams::sink::{MemorySink, OutputRecord};
use lambda_streams::state::Store;
use lambda_streams::state::dynamodb::DynamoStore;
use lambda_streams::state::fault::FaultyStore;
use lambda_streams::{StreamsBuilder, Topology};
use lambda_streams_e2e::*;

const GRACE_MS: u64 = 150;
/// Orders (one per batch, 100 ms apart, over three keys).
const ORDERS: i64 = 24;

/// `orders` left-joined with the versioned table of `prices` (1 h of history), with a
/// grace of 150 ms: `<order>@<price or none>`.
fn topology() -> Topology {
    let builder = StreamsBuilder::new();
    let prices = builder.versioned_table("prices", Utf8, Utf8, "prices", Duration::from_secs(3600));
    builder
        .stream("orders", Utf8, Utf8)
        .left_join_with_grace(
            &prices,
            Duration::from_millis(GRACE_MS),
            "waiting",
            (Utf8, Utf8),
            |_, order: String, price: Option<String>| {
                format!("{order}@{}", price.as_deref().unwrap_or("none"))
            },
        )
        .to("priced", Utf8, Utf8);
    builder.build()
}

/// A record: topic, offset, key, value, timestamp.
type In = (&'static str, i64, String, String, i64);

fn key(i: i64) -> String {
    format!("k{}", i.rem_euclid(3))
}

/// Batch `j`'s records: order `j` (key `k(j)`, at 100 j), and two prices of order `j - 1`'s
/// key arriving after it: one valid from just before that order (10 ms earlier: it must
/// join it) and one from just after (it must not).
fn batch(j: i64) -> Vec<In> {
    let mut records = vec![("orders", j, key(j), format!("o{j}"), 100 * j)];
    if j >= 1 {
        let k = key(j - 1);
        records.push((
            "prices",
            2 * (j - 1),
            k.clone(),
            format!("a{j}"),
            100 * (j - 1) - 10,
        ));
        records.push((
            "prices",
            2 * (j - 1) + 1,
            k,
            format!("b{j}"),
            100 * (j - 1) + 10,
        ));
    }
    records
}

/// Every batch, then one order of a fresh key far ahead that releases all the others.
fn batches() -> Vec<Vec<In>> {
    let mut all: Vec<Vec<In>> = (0..ORDERS).map(batch).collect();
    all.push(vec![(
        "orders",
        ORDERS,
        "end".into(),
        "end".into(),
        100 * ORDERS + 10_000,
    )]);
    all
}

/// The reference: each order joined with its key's latest price at or before its time.
fn reference() -> BTreeMap<String, usize> {
    let records: Vec<In> = batches().into_iter().flatten().collect();
    let mut expected = BTreeMap::new();
    for (topic, _, k, order, ts) in &records {
        if *topic != "orders" || order == "end" {
            continue;
        }
        let price = records
            .iter()
            .filter(|(t, _, pk, _, pts)| *t == "prices" && pk == k && pts <= ts)
            .max_by_key(|(_, _, _, _, pts)| *pts)
            .map_or("none".to_owned(), |(_, _, _, v, _)| v.clone());
        *expected.entry(format!("{order}@{price}")).or_insert(0) += 1;
    }
    expected
}

fn event(records: &[In]) -> KafkaEvent {
    let mut parts: BTreeMap<&str, Vec<Record>> = BTreeMap::new();
    for (topic, offset, key, value, ts) in records {
        parts.entry(topic).or_default().push(Record {
            offset: *offset,
            timestamp: *ts,
            timestamp_type: TimestampType::CreateTime,
            key: Some(key.as_bytes().to_vec().into()),
            value: Some(value.as_bytes().to_vec().into()),
            headers: Vec::new(),
            key_schema_metadata: None,
            value_schema_metadata: None,
        });
    }
    KafkaEvent {
        source: EventSource::SelfManaged,
        bootstrap_servers: "127.0.0.1:9092".into(),
        partitions: parts
            .into_iter()
            .map(|(topic, records)| PartitionRecords {
                tp: TopicPartition::new(topic, 0),
                records,
            })
            .collect(),
    }
}

fn values(records: &[OutputRecord]) -> Vec<String> {
    records
        .iter()
        .map(|r| String::from_utf8(r.value.clone().unwrap_or_default()).unwrap())
        .collect()
}

fn counts(values: &[String]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for v in values {
        *counts.entry(v.clone()).or_insert(0) += 1;
    }
    counts
}

async fn process(topology: &Topology, event: &KafkaEvent, store: &dyn Store) -> Vec<String> {
    let sink = MemorySink::new();
    topology.process(event, store, &sink).await.expect("batch");
    values(&sink.records())
}

async fn fresh_store(name: &str) -> DynamoStore {
    exactly_once_store(name).await.1
}

/// No record waits any more but the far-ahead one, and the closing index holds only its key.
async fn assert_released(store: &DynamoStore) {
    for k in ["k0", "k1", "k2"] {
        let item = store
            .get("waiting", k.as_bytes())
            .await
            .unwrap()
            .expect("item");
        let state = String::from_utf8(item.aggregate.unwrap()).unwrap();
        assert!(state.contains(r#""waiting":[]"#), "{k}: {state}");
    }
    let closing = store.closing_items("waiting", i64::MAX).await.unwrap();
    let keys: Vec<&[u8]> = closing.iter().map(|c| c.key.as_slice()).collect();
    assert_eq!(keys, [b"end".as_slice()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_order_joins_once_with_the_price_valid_at_its_time() {
    require_services();
    let topology = topology();
    let expected = reference();
    assert_eq!(expected.values().sum::<usize>(), ORDERS as usize);
    // The reference has both kinds: prices that arrived after their order and join it.
    assert!(
        expected.keys().any(|v| v.starts_with("o3@a")),
        "{expected:?}"
    );

    // Every batch once: each order once, with its price.
    let store = fresh_store("grace-once").await;
    let mut out = Vec::new();
    for b in batches() {
        out.extend(process(&topology, &event(&b), &store).await);
    }
    assert_eq!(counts(&out), expected);
    assert_released(&store).await;

    // Every batch delivered twice: the copies emit nothing (their records wait once, and
    // what the closing pass released is out of the items), so each order is out once.
    let store = fresh_store("grace-twice").await;
    let mut out = Vec::new();
    for b in batches() {
        out.extend(process(&topology, &event(&b), &store).await);
        let again = process(&topology, &event(&b), &store).await;
        assert!(again.is_empty(), "a redelivery emitted {again:?}");
    }
    assert_eq!(counts(&out), expected);
    assert_released(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_batch_retried_with_other_boundaries_joins_each_order_once_in_the_state() {
    require_services();
    let topology = topology();
    let expected = reference();
    let all = batches();
    // Batches of one step each, except that every third batch crashes after `k` writes
    // (k = 0, 1, 2 in turn: before any write, part-way through the batch's writes, or at
    // the closing pass's rewrite, after its emission went out; at least five batches of each
    // run do crash) and is retried merged with the next one (a shifted retry).
    for (run, crash) in [0u64, 1, 2].into_iter().enumerate() {
        let store = fresh_store(&format!("grace-crash-{run}")).await;
        let mut out = Vec::new();
        let mut crashes = 0;
        let mut j = 0;
        while j < all.len() {
            if j % 3 == 1 && j + 1 < all.len() {
                let crashing = FaultyStore::new(&store).crash_after(crash);
                let sink = MemorySink::new();
                let crashed = topology.process(&event(&all[j]), &crashing, &sink).await;
                out.extend(values(&sink.records()));
                if crashed.is_ok() {
                    // Fewer writes than the crash point: it went through.
                    j += 1;
                    continue;
                }
                crashes += 1;
                let merged: Vec<In> = all[j].iter().chain(&all[j + 1]).cloned().collect();
                out.extend(process(&topology, &event(&merged), &store).await);
                j += 2;
            } else {
                out.extend(process(&topology, &event(&all[j]), &store).await);
                j += 1;
            }
        }
        assert!(
            crashes >= 5,
            "crash after {crash}: {crashes} crashed batches"
        );
        // Every order is out with its price, none with another; a copy only of what a
        // crashed attempt had already emitted (outputs are at least once).
        let got = counts(&out);
        assert_eq!(
            got.keys().collect::<Vec<_>>(),
            expected.keys().collect::<Vec<_>>(),
            "crash after {crash}"
        );
        assert!(
            got.values().all(|n| (1..=2).contains(n)),
            "crash after {crash}: {got:?}"
        );
        assert_released(&store).await;
    }
}
