//! Kafka Streams' window tests on DynamoDB (the dynoxide emulator): the newest record time a
//! time window keeps (`mt`), which its updates and its emit-on-close result carry, is kept by
//! the DynamoDB store's conditional writes as by the in-memory store. Inputs and expected
//! records are Kafka Streams' (`KStreamWindowAggregateTest.testAggBasic`,
//! `TimeWindowedKStreamImplTest.shouldCountWindowed`); a redelivered batch changes neither
//! the records' timestamps nor the state.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use lambda_streams::dsl::{EmitStrategy, SessionWindows, SlidingWindows, TimeWindows};
use lambda_streams::event::{
    EventSource, KafkaEvent, PartitionRecords, Record, TimestampType, TopicPartition,
};
use lambda_streams::serdes::Utf8;
use lambda_streams::sink::MemorySink;
use lambda_streams::{StreamsBuilder, Topology};
use lambda_streams_e2e::*;

/// (window key, value, timestamp).
type Out = (String, String, i64);

/// Events of `size` records each from `inputs` (key, value, timestamp) on `input`-0.
fn events(inputs: &[(&str, &str, i64)], size: usize) -> Vec<KafkaEvent> {
    inputs
        .chunks(size)
        .enumerate()
        .map(|(i, chunk)| KafkaEvent {
            source: EventSource::SelfManaged,
            bootstrap_servers: "127.0.0.1:9092".into(),
            partitions: vec![PartitionRecords {
                tp: TopicPartition::new("input", 0),
                records: chunk
                    .iter()
                    .enumerate()
                    .map(|(j, (k, v, ts))| Record {
                        offset: (i * size + j) as i64,
                        timestamp: *ts,
                        timestamp_type: TimestampType::CreateTime,
                        key: Some(k.to_string().into()),
                        value: Some(v.to_string().into()),
                        headers: Vec::new(),
                        key_schema_metadata: None,
                        value_schema_metadata: None,
                    })
                    .collect(),
            }],
        })
        .collect()
}

/// Runs `events` on a new table, each batch delivered twice (the second delivery must emit
/// what the first did); returns the records of the first deliveries.
async fn run(topology: &Topology, events: &[KafkaEvent]) -> Vec<Out> {
    let (_, store) = exactly_once_store("kafka-windows").await;
    let mut out = Vec::new();
    for event in events {
        let sink = MemorySink::new();
        topology.process(event, &store, &sink).await.expect("batch");
        let again = MemorySink::new();
        topology
            .process(event, &store, &again)
            .await
            .expect("redelivery");
        let first: Vec<Out> = sink
            .records()
            .into_iter()
            .map(|r| {
                (
                    String::from_utf8(r.key.unwrap().to_vec()).unwrap(),
                    String::from_utf8(r.value.unwrap().to_vec()).unwrap(),
                    r.timestamp.unwrap(),
                )
            })
            .collect();
        for r in again.records() {
            let key = String::from_utf8(r.key.unwrap().to_vec()).unwrap();
            let value = String::from_utf8(r.value.unwrap().to_vec()).unwrap();
            assert!(
                first.contains(&(key.clone(), value.clone(), r.timestamp.unwrap())),
                "the redelivery emitted something new: {key} {value}"
            );
        }
        out.extend(first);
    }
    out
}

fn last_per_window(records: &[Out]) -> BTreeMap<String, (String, i64)> {
    records
        .iter()
        .map(|(k, v, t)| (k.clone(), (v.clone(), *t)))
        .collect()
}

/// KStreamWindowAggregateTest.testAggBasic (ON_WINDOW_UPDATE), the records of key B: the
/// late records at 3, 2 and 9 keep the windows' newest timestamps (8, then 9; 13).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_records_keep_the_windows_newest_timestamp_on_dynamodb() {
    require_services();
    let builder = StreamsBuilder::new();
    builder
        .stream("input", Utf8, Utf8)
        .group_by_key(Utf8)
        .windowed_by(
            TimeWindows::of_size(Duration::from_millis(10))
                .grace(Duration::from_millis(100))
                .advance_by(Duration::from_millis(5)),
        )
        .aggregate(
            "topic1-Canonized",
            || "0".to_owned(),
            |_, v: String, agg: String| format!("{agg}+{v}"),
            Utf8,
        )
        .to_stream()
        .map(|w, v| (format!("{}@{}/{}", w.key, w.start, w.end), v))
        .to("out", Utf8, Utf8);
    let topology = builder.build();
    let inputs = [
        ("B", "2", 1),
        ("B", "2", 6),
        ("B", "2", 8),
        ("B", "2", 11),
        ("B", "2", 13),
        ("B", "1", 3),
        ("B", "2", 2),
        ("B", "3", 9),
    ];
    let kafka: Vec<Out> = [
        ("B@0/10", "0+2", 1),
        ("B@0/10", "0+2+2", 6),
        ("B@5/15", "0+2", 6),
        ("B@0/10", "0+2+2+2", 8),
        ("B@5/15", "0+2+2", 8),
        ("B@5/15", "0+2+2+2", 11),
        ("B@10/20", "0+2", 11),
        ("B@5/15", "0+2+2+2+2", 13),
        ("B@10/20", "0+2+2", 13),
        ("B@0/10", "0+2+2+2+1", 8),
        ("B@0/10", "0+2+2+2+1+2", 8),
        ("B@0/10", "0+2+2+2+1+2+3", 9),
        ("B@5/15", "0+2+2+2+2+3", 13),
    ]
    .into_iter()
    .map(|(k, v, t)| (k.to_owned(), v.to_owned(), t))
    .collect();
    assert_eq!(run(&topology, &events(&inputs, 1)).await, kafka);
    for size in [3, 8] {
        let batched = run(&topology, &events(&inputs, size)).await;
        assert_eq!(
            last_per_window(&batched),
            last_per_window(&kafka),
            "batches of {size}"
        );
    }
}

/// TimeWindowedKStreamImplTest.shouldCountWindowed (ON_WINDOW_CLOSE): the final results carry
/// the windows' newest record times (15, 500, 550), read from the closing index.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn final_results_carry_the_windows_newest_timestamp_on_dynamodb() {
    require_services();
    let builder = StreamsBuilder::new();
    builder
        .stream("input", Utf8, Utf8)
        .group_by_key(Utf8)
        .windowed_by(TimeWindows::of_size(Duration::from_millis(500)))
        .emit_strategy(EmitStrategy::OnWindowClose)
        .count("store")
        .to_stream()
        .map(|w, n| (format!("{}@{}/{}", w.key, w.start, w.end), n.to_string()))
        .to("out", Utf8, Utf8);
    let topology = builder.build();
    let inputs = [
        ("1", "1", 10),
        ("1", "2", 15),
        ("1", "3", 500),
        ("2", "10", 550),
        ("2", "20", 500),
        ("2", "30", 1000),
    ];
    let kafka = BTreeMap::from([
        ("1@0/500".to_owned(), ("2".to_owned(), 15)),
        ("1@500/1000".to_owned(), ("1".to_owned(), 500)),
        ("2@500/1000".to_owned(), ("2".to_owned(), 550)),
    ]);
    for size in [1, 2, 6] {
        let records = run(&topology, &events(&inputs, size)).await;
        assert_eq!(records.len(), 3, "batches of {size}: one result per window");
        assert_eq!(last_per_window(&records), kafka, "batches of {size}");
    }
}

/// A session-windowed count emitting on close (gap 10, grace 5) to `out`.
fn final_sessions() -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream("input", Utf8, Utf8)
        .group_by_key(Utf8)
        .windowed_by_session(
            SessionWindows::with_inactivity_gap(Duration::from_millis(10))
                .grace(Duration::from_millis(5)),
        )
        .emit_strategy(EmitStrategy::OnWindowClose)
        .count("sessions")
        .to_stream()
        .map(|w, n| (format!("{}@{}/{}", w.key, w.start, w.end), n.to_string()))
        .to("out", Utf8, Utf8);
    builder.build()
}

/// A key that goes quiet gets its final session from the closing pass over the table's
/// `closing` index on DynamoDB, once: every batch delivered twice, and at the end the whole
/// input delivered again (an old range), emit nothing more. The quiet key's session `[1, 3]`
/// closes once another key moves the stream time past 3 + 10 + 5 (Kafka Streams:
/// `end < stream time - grace - gap`), with its end as timestamp.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_keys_final_session_is_emitted_once_on_dynamodb() {
    require_services();
    let topology = final_sessions();
    let mut inputs = vec![("quiet", "x", 1), ("quiet", "x", 3)];
    // The busy key's records every 4 ms: one session that stays open.
    for t in 0..12 {
        inputs.push(("busy", "x", 4 * t));
    }
    for size in [1, 3, inputs.len()] {
        let (_, store) = exactly_once_store("final-sessions").await;
        let all = events(&inputs, size);
        let mut out: Vec<Out> = Vec::new();
        for event in all.iter().chain(all.iter()) {
            for _ in 0..2 {
                let sink = MemorySink::new();
                topology.process(event, &store, &sink).await.expect("batch");
                out.extend(sink.records().into_iter().map(|r| {
                    (
                        String::from_utf8(r.key.unwrap().to_vec()).unwrap(),
                        String::from_utf8(r.value.unwrap().to_vec()).unwrap(),
                        r.timestamp.unwrap(),
                    )
                }));
            }
        }
        assert_eq!(
            out,
            [("quiet@1/3".to_owned(), "2".to_owned(), 3)],
            "batches of {size}"
        );
    }
}

/// SessionWindowedKStreamImplTest.shouldCountSessionWindowedWithCachingDisabled
/// (ON_WINDOW_CLOSE) on DynamoDB, every batch delivered twice: the one final session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafkas_final_session_on_dynamodb() {
    require_services();
    let builder = StreamsBuilder::new();
    builder
        .stream("input", Utf8, Utf8)
        .group_by_key(Utf8)
        .windowed_by_session(SessionWindows::with_inactivity_gap(Duration::from_millis(
            500,
        )))
        .emit_strategy(EmitStrategy::OnWindowClose)
        .count("store")
        .to_stream()
        .map(|w, n| (format!("{}@{}/{}", w.key, w.start, w.end), n.to_string()))
        .to("out", Utf8, Utf8);
    let topology = builder.build();
    let inputs = [
        ("1", "1", 10),
        ("1", "2", 15),
        ("1", "3", 600),
        ("2", "1", 600),
        ("2", "2", 599),
    ];
    for size in [1, 2, 5] {
        assert_eq!(
            run(&topology, &events(&inputs, size)).await,
            [("1@10/15".to_owned(), "2".to_owned(), 15)],
            "batches of {size}"
        );
    }
}

/// KStreamSlidingWindowAggregateTest.testNoGracePeriodSmallInput (ON_WINDOW_CLOSE) on
/// DynamoDB, every batch delivered twice: Kafka's three final windows, once each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafkas_final_sliding_windows_on_dynamodb() {
    require_services();
    let builder = StreamsBuilder::new();
    builder
        .stream("input", Utf8, Utf8)
        .group_by_key(Utf8)
        .windowed_by_sliding(SlidingWindows::of_time_difference_and_grace(
            Duration::from_millis(50),
            Duration::ZERO,
        ))
        .emit_strategy(EmitStrategy::OnWindowClose)
        .aggregate(
            "store",
            || "0".to_owned(),
            |_, v: String, agg: String| format!("{agg}+{v}"),
            Utf8,
        )
        .to_stream()
        .map(|w, v| (format!("{}@{}/{}", w.key, w.start, w.end - 1), v))
        .to("out", Utf8, Utf8);
    let topology = builder.build();
    let inputs = [
        ("A", "1", 100),
        ("A", "2", 105),
        ("A", "3", 106),
        ("A", "4", 103),
        ("A", "5", 113),
        ("A", "6", 110),
    ];
    let kafka: Vec<Out> = [
        ("A@50/100", "0+1", 100),
        ("A@55/105", "0+1+2", 105),
        ("A@56/106", "0+1+2+3+4", 106),
    ]
    .into_iter()
    .map(|(k, v, t)| (k.to_owned(), v.to_owned(), t))
    .collect();
    for size in [1, 4, 6] {
        let mut records = run(&topology, &events(&inputs, size)).await;
        records.sort();
        assert_eq!(records, kafka, "batches of {size}");
    }
}
