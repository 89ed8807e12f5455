//! The newer DSL operators on DynamoDB (the dynoxide emulator), against the in-memory
//! store: session windows, sliding windows, stream–stream inner, left and outer joins and
//! table–table joins, the same random batches through `Topology::process` with a
//! `DynamoStore` and with a `MemoryStore` give the same outputs, record for record (their
//! semantics are proven against brute-force references in `framework/tests/`), and a
//! redelivered batch changes no state. Late records of session and sliding windows are
//! counted on DynamoDB as an independent count over the stream time says.

use std::time::Duration;

use lambda_streams::dsl::{JoinWindows, SessionWindows, SlidingWindows};
use lambda_streams::event::{
    EventSource, KafkaEvent, PartitionRecords, Record, TimestampType, TopicPartition,
};
use lambda_streams::serdes::{DecimalI64, Utf8};
use lambda_streams::sink::{MemorySink, OutputRecord};
use lambda_streams::state::Store;
use lambda_streams::state::dynamodb::emulator_client;
use lambda_streams::state::memory::MemoryStore;
use lambda_streams::{StreamsBuilder, Topology};
use lambda_streams_e2e::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A record of topic `left` or `right`: key, value, timestamp.
type Input = (bool, String, i64, i64);

fn topologies() -> Vec<(&'static str, Topology)> {
    let sessions = {
        let b = StreamsBuilder::new();
        b.stream("left", Utf8, DecimalI64)
            .group_by_key(Utf8)
            .windowed_by_session(
                SessionWindows::with_inactivity_gap(Duration::from_millis(5))
                    .grace(Duration::from_millis(20)),
            )
            .count("sessions")
            .to_stream()
            .map(|w, n| (format!("{}@{}-{}", w.key, w.start, w.end), n))
            .to("out", Utf8, DecimalI64);
        b.build()
    };
    let sliding = {
        let b = StreamsBuilder::new();
        b.stream("left", Utf8, DecimalI64)
            .group_by_key(Utf8)
            .windowed_by_sliding(SlidingWindows::of_time_difference_and_grace(
                Duration::from_millis(6),
                Duration::from_millis(20),
            ))
            .aggregate("sums", || 0i64, |_, v: i64, s: i64| s + v, DecimalI64)
            .to_stream()
            .map(|w, s| (format!("{}@{}", w.key, w.start), s))
            .to("out", Utf8, DecimalI64);
        b.build()
    };
    let stream_join = {
        let b = StreamsBuilder::new();
        let left = b.stream("left", Utf8, DecimalI64);
        let right = b.stream("right", Utf8, DecimalI64);
        left.join_stream(
            &right,
            JoinWindows::of(Duration::from_millis(7)).grace(Duration::from_millis(3)),
            "pairs",
            (Utf8, DecimalI64, DecimalI64),
            |_, l: &i64, r: &i64| l * 1000 + r,
        )
        .to("out", Utf8, DecimalI64);
        b.build()
    };
    let windows = JoinWindows::of(Duration::from_millis(7)).grace(Duration::from_millis(3));
    let left_join = {
        let b = StreamsBuilder::new();
        let left = b.stream("left", Utf8, DecimalI64);
        let right = b.stream("right", Utf8, DecimalI64);
        left.left_join_stream(
            &right,
            windows,
            "pairs",
            (Utf8, DecimalI64, DecimalI64),
            |_, l: &i64, r: Option<&i64>| l * 1000 + r.copied().unwrap_or(-1),
        )
        .to("out", Utf8, DecimalI64);
        b.build()
    };
    let outer_join = {
        let b = StreamsBuilder::new();
        let left = b.stream("left", Utf8, DecimalI64);
        let right = b.stream("right", Utf8, DecimalI64);
        left.outer_join_stream(
            &right,
            windows,
            "pairs",
            (Utf8, DecimalI64, DecimalI64),
            |_, l: Option<&i64>, r: Option<&i64>| {
                l.copied().unwrap_or(-1) * 1000 + r.copied().unwrap_or(-1)
            },
        )
        .to("out", Utf8, DecimalI64);
        b.build()
    };
    let table_join = {
        let b = StreamsBuilder::new();
        let left = b.table("left", Utf8, DecimalI64, "left-table");
        let right = b.table("right", Utf8, DecimalI64, "right-table");
        left.join(&right, |_, l: &i64, r: &i64| l * 1000 + r)
            .to_stream()
            .to("out", Utf8, DecimalI64);
        b.build()
    };
    vec![
        ("session windows", sessions),
        ("sliding windows", sliding),
        ("stream-stream join", stream_join),
        ("stream-stream left join", left_join),
        ("stream-stream outer join", outer_join),
        ("table-table join", table_join),
    ]
}

/// Random inputs with timestamps wandering at most 8 ms behind the newest.
fn inputs(seed: u64) -> Vec<Input> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut newest = 0i64;
    (0..60)
        .map(|_| {
            let ts = (newest + rng.random_range(-8..5)).max(0);
            newest = newest.max(ts);
            (
                rng.random_bool(0.5),
                format!("k{}", rng.random_range(0..3)),
                rng.random_range(1..100),
                ts,
            )
        })
        .collect()
}

/// Batches of consecutive inputs (each topic on partition 0, offsets by topic).
fn events(inputs: &[Input], seed: u64) -> Vec<KafkaEvent> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    let mut offsets = [0i64; 2];
    let mut events = Vec::new();
    let mut rest = inputs;
    while !rest.is_empty() {
        let n = rng.random_range(1..=rest.len().min(9));
        let (batch, tail) = rest.split_at(n);
        rest = tail;
        let mut partitions: Vec<PartitionRecords> = Vec::new();
        for (left, key, value, ts) in batch {
            let (topic, side) = if *left { ("left", 0) } else { ("right", 1) };
            let record = Record {
                offset: offsets[side],
                timestamp: *ts,
                timestamp_type: TimestampType::CreateTime,
                key: Some(key.clone().into()),
                value: Some(value.to_string().into()),
                headers: Vec::new(),
                key_schema_metadata: None,
                value_schema_metadata: None,
            };
            offsets[side] += 1;
            let tp = TopicPartition::new(topic, 0);
            match partitions.iter_mut().find(|p| p.tp == tp) {
                Some(p) => p.records.push(record),
                None => partitions.push(PartitionRecords {
                    tp,
                    records: vec![record],
                }),
            }
        }
        events.push(KafkaEvent {
            source: EventSource::SelfManaged,
            bootstrap_servers: "127.0.0.1:9092".into(),
            partitions,
        });
    }
    events
}

async fn outputs(
    topology: &Topology,
    events: &[KafkaEvent],
    store: &dyn Store,
) -> Vec<OutputRecord> {
    let sink = MemorySink::new();
    for event in events {
        topology.process(event, store, &sink).await.expect("batch");
    }
    sink.records()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn newer_operators_agree_on_dynamodb_and_in_memory() {
    require_services();
    let client = emulator_client(&dynamo_endpoint());
    for (name, topology) in topologies() {
        let both_sides = topology.source_topics().len() == 2;
        let mut alone = 0;
        for seed in 0..4 {
            let mut inputs = inputs(seed);
            if !both_sides {
                inputs.iter_mut().for_each(|input| input.0 = true);
            }
            let events = events(&inputs, seed);
            let (table, dynamo) = exactly_once_store("newer-ops").await;
            let memory = MemoryStore::new();
            let on_dynamo = outputs(&topology, &events, &dynamo).await;
            let in_memory = outputs(&topology, &events, &memory).await;
            assert!(!in_memory.is_empty(), "{name}, seed {seed}: some output");
            // l * 1000 - 1: a left record emitted alone.
            alone += in_memory
                .iter()
                .filter(|r| r.value.as_deref().is_some_and(|v| v.ends_with(b"999")))
                .count();
            assert_eq!(on_dynamo, in_memory, "{name}, seed {seed}");
            // A redelivered batch (the last one, or the first one) changes no state (the
            // table's items, read raw, are the same): what it emits again (same versions, same
            // sources) was all emitted the first time. The first batch again only for the
            // windows and the left and outer joins: a record of the inner stream join meets
            // partners that came later and emits their pairs again under its own source
            // header, and a table-table join emits its current value again with the
            // timestamp of the redelivered batch (at least once, but not identical).
            let before = scan(&client, &table).await;
            let first = events
                .first()
                .filter(|_| !matches!(name, "stream-stream join" | "table-table join"));
            for again_event in [events.last(), first].into_iter().flatten() {
                let again = MemorySink::new();
                topology
                    .process(again_event, &dynamo, &again)
                    .await
                    .expect("redelivery");
                for record in again.records() {
                    // Sessions: a late record is written to its key's item (its lateness is
                    // decided with the key's sessions, as Kafka Streams decides it), which
                    // moves the item's version; a redelivery re-emits an unchanged session
                    // with that version (same value, timestamp and source).
                    let same = |r: &OutputRecord| {
                        if name == "session windows" {
                            (&r.topic, &r.key, &r.value, r.timestamp)
                                == (&record.topic, &record.key, &record.value, record.timestamp)
                        } else {
                            *r == record
                        }
                    };
                    assert!(
                        on_dynamo.iter().any(same),
                        "{name}, seed {seed}: the redelivery emitted something new: {record:?}"
                    );
                }
                assert_eq!(scan(&client, &table).await, before, "{name}, seed {seed}");
            }
        }
        if name.contains("left join") || name.contains("outer join") {
            assert!(alone > 0, "{name}: some record emitted alone");
        }
    }
}

/// Session and sliding windows without grace over records going up to 30 ms back: the late
/// records the batches report on DynamoDB are those an independent count finds (sessions:
/// more than the gap behind the stream time; sliding windows: `t + 1 + difference <= stream
/// time`), and the outputs equal the in-memory store's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_records_of_sessions_and_sliding_windows_are_counted_on_dynamodb() {
    require_services();
    let sessions = {
        let b = StreamsBuilder::new();
        b.stream("left", Utf8, DecimalI64)
            .group_by_key(Utf8)
            .windowed_by_session(SessionWindows::with_inactivity_gap(Duration::from_millis(
                5,
            )))
            .count("sessions")
            .to_stream()
            .map(|w, n| (format!("{}@{}-{}", w.key, w.start, w.end), n))
            .to("out", Utf8, DecimalI64);
        b.build()
    };
    let sliding = {
        let b = StreamsBuilder::new();
        b.stream("left", Utf8, DecimalI64)
            .group_by_key(Utf8)
            .windowed_by_sliding(SlidingWindows::of_time_difference_and_grace(
                Duration::from_millis(6),
                Duration::ZERO,
            ))
            .count("counts")
            .to_stream()
            .map(|w, n| (format!("{}@{}", w.key, w.start), n))
            .to("out", Utf8, DecimalI64);
        b.build()
    };
    /// Whether a record at `ts` is late at stream time `now`.
    type IsLate = fn(i64, i64) -> bool;
    let is_late: [(&str, Topology, IsLate); 2] = [
        // Placeholder: sessions are judged by `session_late` below (Kafka's rule needs the
        // key's sessions).
        ("session windows", sessions, |_, _| false),
        ("sliding windows", sliding, |ts, now| ts + 1 + 6 <= now),
    ];
    for (name, topology, late) in is_late {
        for seed in 0..3 {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut newest = 40i64;
            let inputs: Vec<Input> = (0..60)
                .map(|_| {
                    let ts = (newest + rng.random_range(-30..6)).max(0);
                    newest = newest.max(ts);
                    (true, format!("k{}", rng.random_range(0..3)), 1, ts)
                })
                .collect();
            let mut stream_time = i64::MIN;
            let expected = if name == "session windows" {
                session_late(&inputs)
            } else {
                inputs
                    .iter()
                    .filter(|(_, _, _, ts)| {
                        stream_time = stream_time.max(*ts);
                        late(*ts, stream_time)
                    })
                    .count() as u64
            };
            assert!(expected > 0, "{name}, seed {seed}: some late records");
            let events = events(&inputs, seed);
            let (_, dynamo) = exactly_once_store("late-records").await;
            let memory = MemoryStore::new();
            let (mut counted, sink) = (0, MemorySink::new());
            for event in &events {
                counted += topology
                    .process(event, &dynamo, &sink)
                    .await
                    .expect("batch")
                    .late_records;
            }
            assert_eq!(counted, expected, "{name}, seed {seed}");
            assert_eq!(
                sink.records(),
                outputs(&topology, &events, &memory).await,
                "{name}, seed {seed}"
            );
        }
    }
}

/// Every item of `table`, read with a raw `Scan`, sorted.
async fn scan(client: &aws_sdk_dynamodb::Client, table: &str) -> Vec<String> {
    let mut items = Vec::new();
    let mut start = None;
    loop {
        let page = client
            .scan()
            .table_name(table)
            .consistent_read(true)
            .set_exclusive_start_key(start)
            .send()
            .await
            .expect("scan");
        items.extend(page.items().iter().map(|item| {
            let mut fields: Vec<String> = item.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
            fields.sort();
            fields.join(",")
        }));
        match page.last_evaluated_key() {
            Some(key) => start = Some(key.clone()),
            None => break,
        }
    }
    items.sort();
    items
}

/// The late records of sessions of gap 5, no grace, by Kafka Streams'
/// `KStreamSessionWindowAggregate` rule, record by record (one partition): a record is late
/// when the session it merges into ends before stream time − 5; the sessions it can merge
/// with are those within the gap that end after the stream time before it − 5 (the session
/// store's retention).
fn session_late(inputs: &[Input]) -> u64 {
    /// A session: start, end.
    type Span = (i64, i64);
    let mut sessions: std::collections::BTreeMap<String, Vec<Span>> = Default::default();
    let (mut stream_time, mut late) = (i64::MIN, 0);
    for (_, key, _, ts) in inputs {
        let expired = stream_time.saturating_sub(5);
        stream_time = stream_time.max(*ts);
        let close = stream_time - 5;
        let of_key = sessions.entry(key.clone()).or_default();
        let (near, mut far): (Vec<Span>, Vec<Span>) = of_key
            .iter()
            .partition(|(s, e)| s - 5 <= *ts && *ts <= e + 5 && *e > expired);
        let start = near.iter().map(|s| s.0).fold(*ts, i64::min);
        let end = near.iter().map(|s| s.1).fold(*ts, i64::max);
        if end < close {
            late += 1;
        } else {
            far.push((start, end));
            *of_key = far;
        }
    }
    late
}

/// At least once, a sliding window parked for a failed batch's retry on DynamoDB: a count
/// (10 ms, no grace) re-keyed directly to one key from three partitions; partition 2's
/// batch (985 ms) and partition 1's (1,020 ms) write their records and fail to produce,
/// partition 3's batch (1,021 ms) then prunes 985 ms (more than 3 × 10 + 1 ms behind the
/// key's newest record), parking its window in the item; the retries emit every window.
/// By hand (Kafka Streams' windows of 985, 1000, 1020, 1021): left windows [975, 985] {985},
/// [990, 1000] {1000}, [1010, 1020] {1020}, [1011, 1021] {1020, 1021}; the right window of
/// 1020, [1021, 1031] {1021}. The same in memory proves the rule
/// (`framework/tests/dsl_sliding_faults.rs`); this proves the parked window's round trip
/// through a DynamoDB item.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sliding_window_parked_for_a_retry_is_emitted_by_it_on_dynamodb() {
    require_services();
    let builder = StreamsBuilder::new();
    builder
        .stream("left", Utf8, Utf8)
        .group_by(
            |_, _| "all".to_owned(),
            lambda_streams::dsl::Grouped::direct(Utf8),
        )
        .windowed_by_sliding(SlidingWindows::of_time_difference_and_grace(
            Duration::from_millis(10),
            Duration::ZERO,
        ))
        .count("counts")
        .to_stream()
        .map(|w, n| (format!("{}@{}..={}", w.key, w.start, w.end - 1), n))
        .to("out", Utf8, DecimalI64);
    let topology = builder.build();
    let (_, store) = exactly_once_store("sliding-parked").await;
    let on = |p: i32, offset: i64, timestamp: i64| KafkaEvent {
        source: EventSource::SelfManaged,
        bootstrap_servers: "127.0.0.1:9092".into(),
        partitions: vec![PartitionRecords {
            tp: TopicPartition::new("left", p),
            records: vec![Record {
                offset,
                timestamp,
                timestamp_type: TimestampType::CreateTime,
                key: Some(b"k".to_vec().into()),
                value: Some(b"v".to_vec().into()),
                headers: Vec::new(),
                key_schema_metadata: None,
                value_schema_metadata: None,
            }],
        }],
    };
    let sink = MemorySink::new();
    let failing = lambda_streams::sink::UnreachableSink;
    let schedule = [
        (1, 0, 1_000, true),
        (2, 0, 985, false),
        (1, 1, 1_020, false),
        (3, 0, 1_021, true),
        (2, 0, 985, true),
        (1, 1, 1_020, true),
    ];
    for (p, offset, ts, produced) in schedule {
        let result = if produced {
            topology.process(&on(p, offset, ts), &store, &sink).await
        } else {
            topology.process(&on(p, offset, ts), &store, &failing).await
        };
        assert_eq!(
            result.is_ok(),
            produced,
            "partition {p} at {offset}: {result:?}"
        );
    }
    let latest: std::collections::BTreeMap<String, i64> = sink
        .records()
        .into_iter()
        .map(|r| {
            let key = String::from_utf8(r.key.expect("a key")).expect("UTF-8");
            let value = std::str::from_utf8(&r.value.expect("a count"))
                .expect("UTF-8")
                .parse()
                .expect("a decimal count");
            (key, value)
        })
        .collect();
    let want: std::collections::BTreeMap<String, i64> = [
        ("all@975..=985", 1),
        ("all@990..=1000", 1),
        ("all@1010..=1020", 1),
        ("all@1011..=1021", 2),
        ("all@1021..=1031", 1),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    assert_eq!(latest, want);
}
