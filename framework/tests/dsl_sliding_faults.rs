//! Sliding windows under null values and under a retry after a failed batch, against
//! windows computed by hand from Kafka Streams' definition: per key, each record at `t` has
//! its left window `[t - d, t]` and, when a later record falls in it, its right window
//! `[t + 1, t + 1 + d]` (both ends inclusive).

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use lambda_streams::driver::TestDriver;
use lambda_streams::dsl::{Grouped, SlidingWindows};
use lambda_streams::event::TopicPartition;
use lambda_streams::event::{EventSource, KafkaEvent, PartitionRecords, Record, TimestampType};
use lambda_streams::serdes::{DecimalI64, Nullable, Serde, Utf8};
use lambda_streams::sink::{MemorySink, OutputRecord, Sink, SinkError, UnreachableSink};
use lambda_streams::state::memory::MemoryStore;
use lambda_streams::{StreamsBuilder, Topology};

/// Sliding windows of 10 ms and `grace` ms over `in` (nullable numbers), keyed
/// `<key>@<start>..=<end>`: the count of the records in each window to `counts`, the sum of
/// their values (a null adds nothing) to `sums`.
fn topology(grace: u64) -> Topology {
    let builder = StreamsBuilder::new();
    let windows = || {
        SlidingWindows::of_time_difference_and_grace(
            Duration::from_millis(10),
            Duration::from_millis(grace),
        )
    };
    let grouped = builder
        .stream("in", Utf8, Nullable(DecimalI64))
        .group_by_key(Utf8);
    grouped
        .windowed_by_sliding(windows())
        .count("counts")
        .to_stream()
        .map(|w, n| (format!("{}@{}..={}", w.key, w.start, w.end - 1), n))
        .to("counts", Utf8, DecimalI64);
    grouped
        .windowed_by_sliding(windows())
        .aggregate(
            "sums",
            || 0i64,
            |_, v: Option<i64>, sum: i64| sum + v.unwrap_or(0),
            Nullable(DecimalI64),
        )
        .to_stream()
        .map(|w, n| (format!("{}@{}..={}", w.key, w.start, w.end - 1), n))
        .to("sums", Utf8, DecimalI64);
    builder.build()
}

fn expected(rows: &[(&str, i64)]) -> BTreeMap<String, i64> {
    rows.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
}

#[test]
fn a_null_value_in_a_sliding_window_is_skipped_counted_and_stops_nothing() {
    let driver = TestDriver::new(topology(1_000));
    let mut input = driver.input_topic("in", Utf8, Nullable(DecimalI64));
    input.pipe_input_with_timestamp("a", Some(3), 100).unwrap();
    input.pipe_input_with_timestamp("a", None, 105).unwrap();
    // Kafka Streams' `KStreamSlidingWindowAggregate` skips a null value, counted as a
    // dropped record (here by each of the two aggregations).
    assert_eq!(driver.last_report().unwrap().dropped_null_values, 2);
    input.pipe_input_with_timestamp("a", Some(4), 108).unwrap();
    // The partition goes on after the null value.
    input.pipe_input_with_timestamp("a", Some(5), 200).unwrap();
    // By hand, without the null value: left windows [90,100] {100}, [98,108] {100,108},
    // [190,200] {200}; right window [101,111] {108} (108's right window holds nothing).
    let counts = driver
        .output_topic("counts", Utf8, DecimalI64)
        .read_key_values_to_map()
        .unwrap();
    assert_eq!(
        counts.into_iter().collect::<BTreeMap<_, _>>(),
        expected(&[
            ("a@90..=100", 1),
            ("a@98..=108", 2),
            ("a@101..=111", 1),
            ("a@190..=200", 1),
        ])
    );
    let sums = driver
        .output_topic("sums", Utf8, DecimalI64)
        .read_key_values_to_map()
        .unwrap();
    assert_eq!(
        sums.into_iter().collect::<BTreeMap<_, _>>(),
        expected(&[
            ("a@90..=100", 3),
            ("a@98..=108", 7),
            ("a@101..=111", 4),
            ("a@190..=200", 5),
        ])
    );
}

/// A sink that fails its first `send` (the invocation dies after its state writes, before
/// its output is acknowledged), then collects.
struct FailsFirst {
    failed: AtomicBool,
    inner: MemorySink,
}

#[async_trait]
impl Sink for FailsFirst {
    async fn send(&self, records: Vec<OutputRecord>) -> Result<(), SinkError> {
        if !self.failed.swap(true, Ordering::SeqCst) {
            return Err(SinkError {
                topic: "counts".into(),
                reason: "the invocation crashed".into(),
            });
        }
        self.inner.send(records).await
    }
}

fn record(offset: i64, timestamp: i64) -> Record {
    Record {
        offset,
        timestamp,
        timestamp_type: TimestampType::CreateTime,
        key: Some(b"a".to_vec().into()),
        value: Some(b"1".to_vec().into()),
        headers: Vec::new(),
        key_schema_metadata: None,
        value_schema_metadata: None,
    }
}

fn event(records: Vec<Record>) -> KafkaEvent {
    KafkaEvent {
        source: EventSource::SelfManaged,
        bootstrap_servers: "127.0.0.1:9092".into(),
        partitions: vec![PartitionRecords {
            tp: TopicPartition::new("in", 0),
            records,
        }],
    }
}

/// The last value per key of the records sent to `topic`.
fn outputs(sink: &MemorySink, topic: &str) -> BTreeMap<String, i64> {
    sink.records()
        .into_iter()
        .filter(|r| r.topic == topic)
        .map(|r| {
            let key = Utf8.deserialize(r.key.as_deref()).unwrap();
            let value = DecimalI64.deserialize(r.value.as_deref()).unwrap();
            (key, value)
        })
        .collect()
}

#[tokio::test]
async fn a_retry_emits_the_windows_of_records_its_failed_attempt_wrote() {
    let topology = topology(0);
    let store = MemoryStore::new();
    let sink = FailsFirst {
        failed: AtomicBool::new(true),
        inner: MemorySink::new(),
    };
    // Batch 1 succeeds: a@100.
    topology
        .process(&event(vec![record(0, 100)]), &store, &sink)
        .await
        .unwrap();
    // Batch 2 writes a@200 and a@1000, then dies before its output is acknowledged.
    sink.failed.store(false, Ordering::SeqCst);
    let failed = topology
        .process(
            &event(vec![record(1, 200), record(2, 1_000)]),
            &store,
            &sink,
        )
        .await;
    assert!(failed.is_err(), "the sink fails the first attempt");
    // Its retry starts at the same offset and ends later (a@3000). a@200 is more than
    // 2 × 10 + 0 + 1 ms behind the key's newest record as stored (1000), but its window
    // was never emitted.
    topology
        .process(
            &event(vec![record(1, 200), record(2, 1_000), record(3, 3_000)]),
            &store,
            &sink,
        )
        .await
        .unwrap();
    // By hand: one left window per record, no right windows (no two records within 10 ms).
    let window = expected(&[
        ("a@90..=100", 1),
        ("a@190..=200", 1),
        ("a@990..=1000", 1),
        ("a@2990..=3000", 1),
    ]);
    assert_eq!(outputs(&sink.inner, "counts"), window);
    assert_eq!(outputs(&sink.inner, "sums"), window);
}

/// A sliding count (10 ms, no grace) of every record of `in`, re-keyed directly to `all`,
/// so that the batches of several partitions write one item.
fn rekeyed() -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream("in", Utf8, Utf8)
        .group_by(|_, _| "all".to_owned(), Grouped::direct(Utf8))
        .windowed_by_sliding(SlidingWindows::of_time_difference_and_grace(
            Duration::from_millis(10),
            Duration::ZERO,
        ))
        .count("counts")
        .to_stream()
        .map(|w, n| (format!("{}@{}..={}", w.key, w.start, w.end - 1), n))
        .to("counts", Utf8, DecimalI64);
    builder.build()
}

/// An event of one record of `in`'s partition `p`.
fn on(p: i32, offset: i64, timestamp: i64) -> KafkaEvent {
    let mut event = event(vec![record(offset, timestamp)]);
    event.partitions[0].tp = TopicPartition::new("in", p);
    event
}

#[tokio::test]
async fn a_retry_after_another_partition_s_batch_still_emits_the_windows_it_wrote() {
    let topology = rekeyed();
    let store = MemoryStore::new();
    let sink = MemorySink::new();
    let ok = |r: Result<_, lambda_streams::StreamError>| r.expect("the batch");
    let fails = |r: Result<_, lambda_streams::StreamError>| {
        assert!(r.is_err(), "the producer fails");
    };
    // Partition 1: all@1000.
    ok(topology.process(&on(1, 0, 1_000), &store, &sink).await);
    // Partition 2: all@985, written, not produced (its window [975, 985] is emitted by
    // every write of the key that keeps the record).
    fails(
        topology
            .process(&on(2, 0, 985), &store, &UnreachableSink)
            .await,
    );
    // Partition 1: all@1020, written, not produced either: the key's newest record is now
    // 1020, so that all@985 is more than 3 × 10 + 0 + 1 ms behind it.
    fails(
        topology
            .process(&on(1, 1, 1_020), &store, &UnreachableSink)
            .await,
    );
    // Partition 3, before the two retries: all@1021. Its write prunes all@985, whose
    // batch (of a partition outside this one) is not known to be committed.
    ok(topology.process(&on(3, 0, 1_021), &store, &sink).await);
    // The retries: their state writes are already applied; every window must still be
    // emitted (outputs are at least once).
    ok(topology.process(&on(2, 0, 985), &store, &sink).await);
    ok(topology.process(&on(1, 1, 1_020), &store, &sink).await);
    // By hand (Kafka Streams' windows of the records 985, 1000, 1020, 1021 of one key):
    // left windows [975, 985] {985}, [990, 1000] {1000}, [1010, 1020] {1020},
    // [1011, 1021] {1020, 1021}; the right window of 1020, [1021, 1031] {1021}.
    let want = expected(&[
        ("all@975..=985", 1),
        ("all@990..=1000", 1),
        ("all@1010..=1020", 1),
        ("all@1011..=1021", 2),
        ("all@1021..=1031", 1),
    ]);
    assert_eq!(outputs(&sink, "counts"), want);
    // A batch of partition 2 that starts past all@985 (its batch is committed) does not
    // emit its parked window.
    let before = sink.records().len();
    ok(topology.process(&on(2, 1, 1_022), &store, &sink).await);
    let again = sink.records()[before..]
        .iter()
        .filter(|r| r.key.as_deref() == Some(b"all@975..=985".as_slice()))
        .count();
    assert_eq!(
        again, 0,
        "a committed record's parked window is not emitted"
    );
}
