//! What a record is after a stream–table join, and how a null-key record crosses a
//! repartition topic: three defects the generative test found (issue 12), and two found
//! while fixing them, each with a hand-counted case.
//!
//! - A record waiting at a join goes on after the batch's record pass; its lateness at a
//!   windowed aggregation downstream is judged against the stream time of its partition
//!   *at the record* (Kafka Streams' rule), not at the end of the pass.
//! - A null-key record at a join has no table value (nor partner at a stream–stream outer
//!   join), but it waits with the others all the same: going on at once, it overtook the
//!   earlier records of its partition, and the repartition topic downstream then took those
//!   for copies and dropped them.
//! - A null-key record produced to a repartition topic: the producer puts a null key on a
//!   partition of its choice per send, so a retry's copy could land on another partition
//!   (another watermark channel) and be counted again. Every copy now carries the same
//!   stand-in key (and a header saying the key is null), so all copies share a partition.
//! - Records that waited at a join merged with records that did not reach what follows
//!   after them: a general aggregate now folds each channel's values in offset order, and
//!   a batch sends the records of a repartition topic fed that way in source order (out of
//!   order, the next hop dropped the late ones as copies).
//!
//! Each test plays the event source by hand: events over ranges of hand-made logs,
//! `Topology::process` with a `MemoryStore` and a `MemorySink`, and the records produced to
//! the repartition topic fed back as the next events.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use lambda_streams::dsl::{Grouped, TimeWindows};
use lambda_streams::event::{
    EventSource, Header, KafkaEvent, PartitionRecords, Record, TimestampType, TopicPartition,
};
use lambda_streams::serdes::{DecimalI64, Nullable, Serde, Utf8};
use lambda_streams::sink::{MemorySink, OutputRecord};
use lambda_streams::state::memory::MemoryStore;
use lambda_streams::{BatchReport, StreamsBuilder, Topology};

/// A record of a source topic: key, value, timestamp.
fn record(offset: i64, key: Option<&str>, value: i64, timestamp: i64) -> Record {
    Record {
        offset,
        timestamp,
        timestamp_type: TimestampType::CreateTime,
        key: Nullable(Utf8)
            .serialize(&key.map(str::to_owned))
            .map(Into::into),
        value: Some(value.to_string().into_bytes().into()),
        headers: Vec::new(),
        key_schema_metadata: None,
        value_schema_metadata: None,
    }
}

/// A produced record as the next hop's event source reads it, at `offset`.
fn read_back(offset: i64, r: &OutputRecord) -> Record {
    Record {
        offset,
        timestamp: r.timestamp.unwrap_or_default(),
        timestamp_type: TimestampType::CreateTime,
        key: r.key.clone().map(Into::into),
        value: r.value.clone().map(Into::into),
        headers: r
            .headers
            .iter()
            .map(|(n, v)| Header::new(n.as_str(), v.clone()))
            .collect(),
        key_schema_metadata: None,
        value_schema_metadata: None,
    }
}

fn event(partitions: Vec<(TopicPartition, Vec<Record>)>) -> KafkaEvent {
    KafkaEvent {
        source: EventSource::SelfManaged,
        bootstrap_servers: "test:9092".to_owned(),
        partitions: partitions
            .into_iter()
            .map(|(tp, records)| PartitionRecords { tp, records })
            .collect(),
    }
}

/// Processes one event; returns what it produced and its report.
fn process(
    topology: &Topology,
    store: &MemoryStore,
    event: &KafkaEvent,
) -> (Vec<OutputRecord>, BatchReport) {
    let sink = MemorySink::new();
    let report = futures::executor::block_on(topology.process(event, store, &sink))
        .expect("the batch succeeds");
    (sink.records(), report)
}

/// The last value produced per key to `topic` (one event: one update per item).
fn latest(records: &[OutputRecord], topic: &str) -> BTreeMap<String, i64> {
    records
        .iter()
        .filter(|r| r.topic == topic)
        .map(|r| {
            let key = Utf8.deserialize(r.key.as_deref()).expect("a key");
            let value = DecimalI64.deserialize(r.value.as_deref()).expect("a value");
            (key, value)
        })
        .collect()
}

/// Stream `s` left-joined with table `t`, counted in 5 s tumbling windows without grace,
/// per key; the windows' counts go to `out` keyed `<key>@<start>`.
fn joined_windows(join: bool) -> Topology {
    let builder = StreamsBuilder::new();
    let table = builder.table("t", Nullable(Utf8), DecimalI64, "t-store");
    let stream = builder.stream("s", Nullable(Utf8), DecimalI64);
    let stream = if join {
        stream.left_join(&table, |_, v, t: Option<i64>| v + t.unwrap_or(0))
    } else {
        stream
    };
    stream
        .group_by_key(Nullable(Utf8))
        .windowed_by(TimeWindows::of_size(Duration::from_secs(5)).grace(Duration::from_millis(0)))
        .count("windows")
        .to_stream()
        .map(|w, n| (format!("{}@{}", w.key.unwrap_or_default(), w.start), n))
        .to("out", Utf8, DecimalI64);
    builder.build()
}

#[test]
fn a_record_after_a_join_is_late_only_against_the_stream_time_at_it() {
    // One batch of partition s-0: k at 2.188 s, then k at 5.480 s. At the first record the
    // stream time is 2.188 s, before its window [0, 5 s) ends (grace 0): it is counted
    // there. The second record is in [5 s, 10 s). Counted by hand: k@0 = 1, k@5000 = 1,
    // nothing late. The same without the join is the control.
    let batch = vec![
        record(0, Some("k"), 1, 2_188),
        record(1, Some("k"), 2, 5_480),
    ];
    let want = BTreeMap::from([("k@0".to_owned(), 1), ("k@5000".to_owned(), 1)]);
    for join in [false, true] {
        let topology = joined_windows(join);
        let store = MemoryStore::new();
        let (out, report) = process(
            &topology,
            &store,
            &event(vec![(TopicPartition::new("s", 0), batch.clone())]),
        );
        assert_eq!(latest(&out, "out"), want, "join: {join}");
        assert_eq!(report.late_records, 0, "join: {join}");
    }
}

/// Stream `s` left-joined with table `t`, then every record grouped under key `"all"`
/// through the repartition topic `all-repartition`, counted; the count goes to `out`.
fn joined_then_repartitioned() -> Topology {
    let builder = StreamsBuilder::new();
    let table = builder.table("t", Nullable(Utf8), DecimalI64, "t-store");
    builder
        .stream("s", Nullable(Utf8), DecimalI64)
        .left_join(&table, |_, v, t: Option<i64>| v + t.unwrap_or(0))
        .group_by(
            |_, _| "all".to_owned(),
            Grouped::with(Utf8, DecimalI64).with_topic("all-repartition"),
        )
        .count("counts")
        .to_stream()
        .to("out", Utf8, DecimalI64);
    builder.build()
}

#[test]
fn a_null_key_record_at_a_join_does_not_overtake_the_records_before_it() {
    // One batch of s-0: "a" at offset 0, a null key at offset 1. Both are counted under
    // "all": count 2. Had the null-key record gone on before "a" (which waits for the
    // table's value of "a"), it would reach the repartition topic first, and "a", at a
    // lower position of the same channel, would be taken for a copy: count 1.
    let topology = joined_then_repartitioned();
    assert_eq!(topology.repartition_topics(), ["all-repartition"]);
    let store = MemoryStore::new();
    let (hop, _) = process(
        &topology,
        &store,
        &event(vec![(
            TopicPartition::new("s", 0),
            vec![record(0, Some("a"), 1, 1_000), record(1, None, 2, 1_001)],
        )]),
    );
    let hop: Vec<Record> = hop
        .iter()
        .filter(|r| r.topic == "all-repartition")
        .enumerate()
        .map(|(i, r)| read_back(i as i64, r))
        .collect();
    assert_eq!(hop.len(), 2);
    let (out, _) = process(
        &topology,
        &store,
        &event(vec![(TopicPartition::new("all-repartition", 0), hop)]),
    );
    assert_eq!(latest(&out, "out"), BTreeMap::from([("all".to_owned(), 2)]));
}

/// Stream `s` through the repartition topic `hop` (keys kept, null ones too), then
/// regrouped directly under key `"all"` and summed; the sum goes to `sums`, and the hop's
/// records, as read back, to `seen`.
fn null_keys_through_a_hop() -> Topology {
    let builder = StreamsBuilder::new();
    let back = builder.stream("s", Nullable(Utf8), DecimalI64).repartition(
        "hop",
        Nullable(Utf8),
        DecimalI64,
    );
    back.to("seen", Nullable(Utf8), DecimalI64);
    back.group_by(|_, _| "all".to_owned(), Grouped::direct(Utf8))
        .aggregate("sums", || 0i64, |_, v, sum| sum + v, DecimalI64)
        .to_stream()
        .to("sums", Utf8, DecimalI64);
    builder.build()
}

#[test]
fn copies_of_a_null_key_record_cross_a_hop_on_one_partition() {
    // s-0 holds one record with a null key, value 5. Its batch runs twice (a retry after a
    // crash that came after the produce): two copies in the topic `hop` (2 partitions).
    // Kafka's producer picks a partition of its choice for a null key on each send; this
    // event source puts a null key on the partitions in turn, any other key by its bytes.
    // Counted by hand: one source record, sum 5; the record read back has a null key.
    let topology = null_keys_through_a_hop();
    let store = MemoryStore::new();
    let source = event(vec![(
        TopicPartition::new("s", 0),
        vec![record(0, None, 5, 1_000)],
    )]);
    let (first, _) = process(&topology, &store, &source);
    let (retry, _) = process(&topology, &store, &source);
    let copies: Vec<&OutputRecord> = first
        .iter()
        .chain(&retry)
        .filter(|r| r.topic == "hop")
        .collect();
    assert_eq!(copies.len(), 2);
    let mut logs: BTreeMap<i32, Vec<Record>> = BTreeMap::new();
    for (n, copy) in copies.iter().enumerate() {
        let partition = match &copy.key {
            None => n as i32 % 2,
            Some(key) => key.iter().map(|b| i32::from(*b)).sum::<i32>() % 2,
        };
        let log = logs.entry(partition).or_default();
        log.push(read_back(log.len() as i64, copy));
    }
    let mut sums = BTreeMap::new();
    let mut seen = Vec::new();
    for (partition, log) in logs {
        let (out, _) = process(
            &topology,
            &store,
            &event(vec![(TopicPartition::new("hop", partition), log)]),
        );
        sums.extend(latest(&out, "sums"));
        seen.extend(
            out.iter()
                .filter(|r| r.topic == "seen")
                .map(|r| r.key.clone()),
        );
    }
    assert_eq!(sums, BTreeMap::from([("all".to_owned(), 5)]));
    assert!(!seen.is_empty());
    assert!(seen.iter().all(Option::is_none), "keys read back: {seen:?}");
}

/// Stream `s` split in two: the records of key `"a"` joined with table `t`, the others
/// not (each of those `copies` times); merged again and grouped under key `"all"` through
/// `all-repartition`, counted.
fn joined_and_not_merged_with(copies: usize) -> StreamsBuilder {
    let builder = StreamsBuilder::new();
    let table = builder.table("t", Nullable(Utf8), DecimalI64, "t-store");
    let stream = builder.stream("s", Nullable(Utf8), DecimalI64);
    let joined = stream
        .filter(|k, _| k.as_deref() == Some("a"))
        .left_join(&table, |_, v, t: Option<i64>| v + t.unwrap_or(0));
    let plain = stream
        .filter(|k, _| k.as_deref() != Some("a"))
        .flat_map_values(move |v| vec![v; copies]);
    joined
        .merge(&plain)
        .group_by(
            |_, _| "all".to_owned(),
            Grouped::with(Utf8, DecimalI64).with_topic("all-repartition"),
        )
        .count("counts")
        .to_stream()
        .to("out", Utf8, DecimalI64);
    builder
}

fn joined_and_not_merged() -> StreamsBuilder {
    joined_and_not_merged_with(1)
}

#[test]
fn records_that_waited_at_a_join_merged_with_records_that_did_not_cross_a_hop_in_order() {
    // One batch of s-0: "a" (offset 0) waits at the join until the table is read, "b"
    // (offset 1) does not. Both are counted under "all": count 2. Produced in the order
    // they go on, "b" reached the repartition topic first, and "a", at a lower position of
    // the same channel, was taken for a copy: count 1. The batch now sends its repartition
    // records in source order.
    let topology = joined_and_not_merged().build();
    let store = MemoryStore::new();
    let (hop, _) = process(
        &topology,
        &store,
        &event(vec![(
            TopicPartition::new("s", 0),
            vec![
                record(0, Some("a"), 1, 1_000),
                record(1, Some("b"), 2, 1_001),
            ],
        )]),
    );
    let hop: Vec<Record> = hop
        .iter()
        .filter(|r| r.topic == "all-repartition")
        .enumerate()
        .map(|(i, r)| read_back(i as i64, r))
        .collect();
    assert_eq!(hop.len(), 2);
    let (out, _) = process(
        &topology,
        &store,
        &event(vec![(TopicPartition::new("all-repartition", 0), hop)]),
    );
    assert_eq!(latest(&out, "out"), BTreeMap::from([("all".to_owned(), 2)]));
}

#[test]
fn a_reduce_of_records_merged_from_a_join_folds_them_in_offset_order() {
    // One batch of s-0, key "k": 2 at offset 0 (even: it waits at the join), 3 at offset 1
    // (odd: it does not). Reduced to the latest value, record at a time as Kafka Streams
    // does: 2, then 3, so 3. Folded in the order the records reach the store, it was 2.
    let builder = StreamsBuilder::new();
    let table = builder.table("t", Nullable(Utf8), DecimalI64, "t-store");
    let stream = builder.stream("s", Nullable(Utf8), DecimalI64);
    let joined = stream
        .filter(|_, v| v % 2 == 0)
        .left_join(&table, |_, v, _: Option<i64>| v);
    joined
        .merge(&stream.filter(|_, v| v % 2 != 0))
        .group_by_key(Nullable(Utf8))
        .reduce("latest", |_, newer| newer, DecimalI64)
        .to_stream()
        .map(|k, v| (k.unwrap_or_default(), v))
        .to("out", Utf8, DecimalI64);
    let topology = builder.build();
    let store = MemoryStore::new();
    let (out, _) = process(
        &topology,
        &store,
        &event(vec![(
            TopicPartition::new("s", 0),
            vec![
                record(0, Some("k"), 2, 1_000),
                record(1, Some("k"), 3, 1_001),
            ],
        )]),
    );
    assert_eq!(latest(&out, "out"), BTreeMap::from([("k".to_owned(), 3)]));
}

#[test]
fn a_left_stream_join_s_output_is_not_repartitioned_or_aggregated() {
    // A left or outer stream–stream join emits a record that joined nothing in the closing
    // pass at the end of a batch (when the stream time closes its window), with no source
    // record: a repartition topic or an aggregation downstream could not apply it exactly
    // once, so `build()` refuses the shape (it used to run, and this test checked that a
    // null-key record did not overtake the pairs before it into the repartition topic).
    let builder = StreamsBuilder::new();
    let right = builder.stream("r", Nullable(Utf8), DecimalI64);
    builder
        .stream("l", Nullable(Utf8), DecimalI64)
        .left_join_stream(
            &right,
            lambda_streams::dsl::JoinWindows::of(Duration::from_secs(10)),
            "pairs",
            (Nullable(Utf8), DecimalI64, DecimalI64),
            |_, v, o: Option<&i64>| v * 100 + o.copied().unwrap_or(0),
        )
        .group_by(
            |_, _| "all".to_owned(),
            Grouped::with(Utf8, DecimalI64).with_topic("all-repartition"),
        )
        .count("counts")
        .to_stream()
        .to("out", Utf8, DecimalI64);
    let refused = builder.try_build().err().expect("refused").to_string();
    assert!(
        refused.contains("closing pass") && refused.contains("\"pairs\""),
        "{refused}"
    );
    // The refusal says what to write instead (docs/kafka-streams-differences.md lists it).
    assert!(
        refused.contains("with `to`") && refused.contains("in another sub-topology"),
        "{refused}"
    );
}

/// Sessions and sliding windows emitted on close reach what follows them in their store's
/// closing pass, after the batch's joins have run: a stream–table join of them would hold
/// its records for a resumption that never comes. `build()` accepted the shape and the
/// joined closes were never produced (found while lifting the exactly-once refusals: a
/// session closed and counted through `to`, nothing through the join); it is refused now,
/// as a time window's close through a join always was, naming the store and what to do.
#[test]
fn closes_of_sessions_and_sliding_windows_are_not_joined_with_a_table() {
    use lambda_streams::dsl::{EmitStrategy, SessionWindows, SlidingWindows, Suppressed};
    for kind in 0..3 {
        let builder = StreamsBuilder::new();
        let names = builder.table("names", Utf8, Utf8, "names");
        let clicks = builder.stream("clicks", Utf8, Utf8).group_by_key(Utf8);
        let closes = match kind {
            0 => clicks
                .windowed_by_session(SessionWindows::with_inactivity_gap(Duration::from_secs(10)))
                .emit_strategy(EmitStrategy::OnWindowClose)
                .count("closes")
                .to_stream()
                .map(|w, n| (w.key, n)),
            1 => clicks
                .windowed_by_sliding(SlidingWindows::of_time_difference_and_grace(
                    Duration::from_secs(10),
                    Duration::ZERO,
                ))
                .emit_strategy(EmitStrategy::OnWindowClose)
                .count("closes")
                .to_stream()
                .map(|w, n| (w.key, n)),
            _ => clicks
                .windowed_by_session(SessionWindows::with_inactivity_gap(Duration::from_secs(10)))
                .count("closes")
                .suppress(Suppressed::until_window_closes())
                .to_stream()
                .map(|w, n| (w.key, n)),
        };
        closes
            .join(&names, |_, n: i64, name: String| format!("{name}:{n}"))
            .to("out", Utf8, Utf8);
        let refused = builder.try_build().err().expect("refused").to_string();
        assert!(
            refused.contains("\"closes\"") && refused.contains("when the window closes"),
            "kind {kind}: {refused}"
        );
        assert!(
            refused.contains("OnWindowUpdate") && refused.contains("another sub-topology"),
            "kind {kind}: {refused}"
        );
    }
}

#[test]
fn a_hop_fed_from_a_join_and_from_outside_it_holds_its_chunks_until_the_join() {
    // As above, with "b" producing one more record than an output chunk holds: sent as a
    // chunk during the record pass, its records would precede "a"'s (which waits at the
    // join), and "a"'s record would be dropped as a copy at the hop. Counted by hand: one
    // record of "a" and OUTPUT_CHUNK + 1 of "b".
    let copies = lambda_streams::OUTPUT_CHUNK + 1;
    let topology = joined_and_not_merged_with(copies).build();
    let store = MemoryStore::new();
    let (hop, _) = process(
        &topology,
        &store,
        &event(vec![(
            TopicPartition::new("s", 0),
            vec![
                record(0, Some("a"), 1, 1_000),
                record(1, Some("b"), 2, 1_001),
                record(2, Some("c"), 3, 1_002),
            ],
        )]),
    );
    let hop: Vec<Record> = hop
        .iter()
        .filter(|r| r.topic == "all-repartition")
        .enumerate()
        .map(|(i, r)| read_back(i as i64, r))
        .collect();
    assert_eq!(hop.len(), 1 + 2 * copies);
    let (out, _) = process(
        &topology,
        &store,
        &event(vec![(TopicPartition::new("all-repartition", 0), hop)]),
    );
    assert_eq!(
        latest(&out, "out"),
        BTreeMap::from([("all".to_owned(), 1 + 2 * copies as i64)])
    );
}
