//! On DynamoDB (the dynoxide emulator): a left join's record that joined nothing, of a key
//! that gets no later record, is emitted alone by the closing pass once both topics' stream
//! times pass its window, and once in the state whatever the redeliveries: a batch delivered
//! again, a crash between the emission and the item's rewrite (the retry emits the same
//! record again, identical), and two deliveries of one batch running at once.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use lambda_streams::dsl::JoinWindows;
use lambda_streams::event::{
    EventSource, KafkaEvent, PartitionRecords, Record, TimestampType, TopicPartition,
};
use lambda_streams::serdes::{DecimalI64, Utf8};
use lambda_streams::sink::{MemorySink, OutputRecord};
use lambda_streams::state::Store;
use lambda_streams::state::dynamodb::DynamoStore;
use lambda_streams::state::fault::FaultyStore;
use lambda_streams::{StreamsBuilder, Topology};
use lambda_streams_e2e::*;

/// `left` left-joined with `right` within 10 ms, no grace: `<l>+<r or none>`.
fn topology() -> Topology {
    let builder = StreamsBuilder::new();
    let right = builder.stream("right", Utf8, DecimalI64);
    builder
        .stream("left", Utf8, DecimalI64)
        .left_join_stream(
            &right,
            JoinWindows::of(Duration::from_millis(10)),
            "pairs",
            (Utf8, DecimalI64, DecimalI64),
            |_, l: &i64, r: Option<&i64>| {
                format!("{l}+{}", r.map_or("none".into(), i64::to_string))
            },
        )
        .to("joined", Utf8, Utf8);
    builder.build()
}

/// A record: offset, key, value, timestamp.
type In<'a> = (i64, &'a str, i64, i64);

/// One event: per topic, its records on partition 0.
fn event(parts: &[(&str, &[In])]) -> KafkaEvent {
    KafkaEvent {
        source: EventSource::SelfManaged,
        bootstrap_servers: "127.0.0.1:9092".into(),
        partitions: parts
            .iter()
            .map(|(topic, records)| PartitionRecords {
                tp: TopicPartition::new(*topic, 0),
                records: records
                    .iter()
                    .map(|(offset, key, value, ts)| Record {
                        offset: *offset,
                        timestamp: *ts,
                        timestamp_type: TimestampType::CreateTime,
                        key: Some(key.as_bytes().to_vec().into()),
                        value: Some(value.to_string().into_bytes().into()),
                        headers: Vec::new(),
                        key_schema_metadata: None,
                        value_schema_metadata: None,
                    })
                    .collect(),
            })
            .collect(),
    }
}

async fn process(topology: &Topology, event: &KafkaEvent, store: &dyn Store) -> Vec<OutputRecord> {
    let sink = MemorySink::new();
    topology.process(event, store, &sink).await.expect("batch");
    sink.records()
}

fn values(records: &[OutputRecord]) -> Vec<String> {
    records
        .iter()
        .map(|r| String::from_utf8(r.value.clone().unwrap_or_default()).unwrap())
        .collect()
}

/// The quiet key's item: no record left, out of the closing index.
async fn assert_closed(store: &DynamoStore) {
    let item = store
        .get("pairs", b"quiet")
        .await
        .unwrap()
        .expect("the item");
    let state = String::from_utf8(item.aggregate.unwrap()).unwrap();
    assert!(state.contains(r#""entries":[]"#), "{state}");
    let closing = store.closing_items("pairs", i64::MAX).await.unwrap();
    assert!(closing.iter().all(|c| c.key != b"quiet"), "{closing:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_key_s_unjoined_record_is_emitted_alone_once_under_redelivery() {
    require_services();
    let topology = topology();
    let first = event(&[("left", &[(0, "quiet", 1, 0), (1, "k", 2, 5)])]);
    let second = event(&[("right", &[(0, "k", 3, 6)])]);
    // Both topics pass 0 + 10: the quiet key's record can no longer join.
    let third = event(&[
        ("left", &[(2, "k3", 4, 50)]),
        ("right", &[(1, "k3", 5, 50)]),
    ]);

    // Every batch once: "1+none" once, by the closing pass of the third batch (the left
    // topic was at 5 after the second one, which does not pass 10).
    let (_, store) = exactly_once_store("ssj-close").await;
    assert_eq!(
        values(&process(&topology, &first, &store).await),
        Vec::<String>::new()
    );
    assert_eq!(values(&process(&topology, &second, &store).await), ["2+3"]);
    let out = process(&topology, &third, &store).await;
    assert_eq!(values(&out), ["4+5", "1+none"]);
    // Emitted alone with its own timestamp, as a table update (no source record).
    assert_eq!(out[1].timestamp, Some(0));
    assert!(out[1].header("lambda-streams-version").is_some());
    assert_closed(&store).await;
    // The third batch delivered again: its pair again (the item's kept output), not the
    // closed record.
    assert_eq!(values(&process(&topology, &third, &store).await), ["4+5"]);
    assert_closed(&store).await;

    // A crash after the batch's state writes, before the closing pass rewrote the quiet
    // key's item (its emission may have gone out): the retry emits "1+none" again, the
    // same record, and the state holds it once.
    let (_, store) = exactly_once_store("ssj-close-crash").await;
    process(&topology, &first, &store).await;
    process(&topology, &second, &store).await;
    // The third batch writes two items (k3's) — one join item — then the closing rewrite.
    let crashing = FaultyStore::new(&store).crash_after(1);
    let sink = MemorySink::new();
    let crashed = topology.process(&third, &crashing, &sink).await;
    assert!(crashed.is_err(), "the closing rewrite crashed");
    assert_eq!(values(&sink.records()), ["4+5", "1+none"]);
    let retry = process(&topology, &third, &store).await;
    assert_eq!(values(&retry), ["4+5", "1+none"]);
    assert_eq!(retry[1].value, sink.records()[1].value);
    assert_eq!(retry[1].timestamp, sink.records()[1].timestamp);
    assert_closed(&store).await;
    assert_eq!(values(&process(&topology, &third, &store).await), ["4+5"]);

    // Two deliveries of the third batch at once (a zombie and its retry): each record at
    // least once, "1+none" at most once per delivery, identical; the state closed once.
    let (_, store) = exactly_once_store("ssj-close-race").await;
    process(&topology, &first, &store).await;
    process(&topology, &second, &store).await;
    let (a, b) = tokio::join!(
        process(&topology, &third, &store),
        process(&topology, &third, &store)
    );
    let all: Vec<String> = values(&a).into_iter().chain(values(&b)).collect();
    let alone = all.iter().filter(|v| *v == "1+none").count();
    assert!((1..=2).contains(&alone), "{all:?}");
    assert!(all.iter().all(|v| v == "1+none" || v == "4+5"), "{all:?}");
    assert_closed(&store).await;
    assert_eq!(values(&process(&topology, &third, &store).await), ["4+5"]);
}
