//! Time windows that can be trusted with edge-of-time input:
//!
//! - no hopping window starts before 0 (Kafka Streams' `TimeWindows.windowsFor`);
//! - window items written for old data (a replay a month behind) are not born expired:
//!   they stay readable and exact (design notes, section 4: the TTL is the later of
//!   event-time close + retention and wall-clock write time + retention);
//! - a poison record with a far-future timestamp does not advance stream time: skipped or
//!   dead-lettered, it closes no window, and the good records after it are not late.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lambda_streams::driver::TestDriver;
use lambda_streams::dsl::{Grouped, TimeWindows};
use lambda_streams::event::{
    EventSource, KafkaEvent, PartitionRecords, Record, TimestampType, TopicPartition,
};
use lambda_streams::serdes::{DecimalI64, Unit, Utf8};
use lambda_streams::sink::MemorySink;
use lambda_streams::state::Store;
use lambda_streams::state::memory::MemoryStore;
use lambda_streams::{BatchOptions, PoisonPolicy, StreamsBuilder, Topology};

const SECOND: i64 = 1_000;
const MINUTE: i64 = 60 * SECOND;
const DAY: i64 = 86_400 * SECOND;
/// 3000-01-01T00:00:00Z, epoch milliseconds.
const YEAR_3000: i64 = 32_503_680_000_000;

fn wall_clock_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap()
}

fn millis(ms: i64) -> Duration {
    Duration::from_millis(ms as u64)
}

/// The window starts of a record at `timestamp`, as Kafka Streams'
/// `TimeWindows.windowsFor(timestamp)` computes them (streams/src/main/java/org/apache/
/// kafka/streams/kstream/TimeWindows.java):
/// `windowStart = (max(0, timestamp - size + advance) / advance) * advance`, then every
/// `advance` while `windowStart <= timestamp`. The reference of these tests.
fn kafka_windows_for(size: i64, advance: i64, timestamp: i64) -> Vec<i64> {
    let mut start = (0.max(timestamp - size + advance) / advance) * advance;
    let mut starts = Vec::new();
    while start <= timestamp {
        starts.push(start);
        start += advance;
    }
    starts
}

#[test]
fn window_starts_are_kafka_streams_windows_for() {
    // Kafka's TimeWindowsTest: shouldComputeWindowsForHoppingWindows (12 ms advancing by
    // 5 at 21: windows at 10, 15, 20), shouldComputeWindowsForBarelyOverlappingHoppingWindows
    // (6 ms advancing by 5 at 7: the window at 5) and shouldComputeWindowsForTumblingWindows
    // (12 ms at 21: the window at 12).
    let hopping = TimeWindows::of_size(millis(12)).advance_by(millis(5));
    assert_eq!(hopping.window_starts(21), vec![10, 15, 20]);
    let barely = TimeWindows::of_size(millis(6)).advance_by(millis(5));
    assert_eq!(barely.window_starts(7), vec![5]);
    let tumbling = TimeWindows::of_size(millis(12));
    assert_eq!(tumbling.window_starts(21), vec![12]);
    // The issue's case: 10 s windows advancing by 5 s, a record at 1 s is in [0, 10 s)
    // only; windowsFor never creates [-5 s, 5 s).
    let issue = TimeWindows::of_size(millis(10 * SECOND)).advance_by(millis(5 * SECOND));
    assert_eq!(issue.window_starts(SECOND), vec![0]);
    assert_eq!(issue.window_starts(0), vec![0]);
    // Every early timestamp, for a few shapes, against the formula.
    for (size, advance) in [(10, 5), (12, 5), (60, 20), (7, 3), (5, 5), (9, 1)] {
        let windows = TimeWindows::of_size(millis(size)).advance_by(millis(advance));
        for ts in 0..3 * size {
            assert_eq!(
                windows.window_starts(ts),
                kafka_windows_for(size, advance, ts),
                "size {size}, advance {advance}, timestamp {ts}"
            );
        }
    }
}

/// Per `<key>@<window start>`, counts of 10 s windows advancing by 5 s, no grace.
fn hopping_counts() -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream("clicks", Unit, Utf8)
        .group_by(|_, page: &String| page.clone(), Grouped::direct(Utf8))
        .windowed_by(TimeWindows::of_size(millis(10 * SECOND)).advance_by(millis(5 * SECOND)))
        .count("clicks-per-10s")
        .to_stream()
        .map(|w, n| (format!("{}@{}", w.key, w.start), n))
        .to("counts", Utf8, DecimalI64);
    builder.build()
}

#[test]
fn a_hopping_window_aggregation_counts_no_window_before_0() {
    let driver = TestDriver::new(hopping_counts());
    let mut clicks = driver.input_topic("clicks", Unit, Utf8);
    let stamps = [SECOND, 6 * SECOND, 7 * SECOND];
    for ts in stamps {
        clicks
            .pipe_input_with_timestamp((), "/home".to_owned(), ts)
            .unwrap();
    }
    let mut expected = BTreeMap::new();
    for ts in stamps {
        for start in kafka_windows_for(10 * SECOND, 5 * SECOND, ts) {
            *expected.entry(format!("/home@{start}")).or_insert(0) += 1;
        }
    }
    // [0, 10 s): all three; [5 s, 15 s): the two later ones; nothing at -5 s.
    assert_eq!(
        expected,
        BTreeMap::from([("/home@0".to_owned(), 3), ("/home@5000".to_owned(), 2)])
    );
    let out = driver
        .output_topic("counts", Utf8, DecimalI64)
        .read_key_values_to_map()
        .unwrap();
    assert_eq!(out, expected);
    let starts: Vec<i64> = driver
        .memory_store()
        .windowed_states("clicks-per-10s")
        .into_iter()
        .map(|(_, start, _)| start)
        .collect();
    assert_eq!(starts, vec![0, 5 * SECOND]);
}

#[test]
fn a_negative_timestamp_in_time_windows_is_a_poison_record_named_by_its_coordinates() {
    let driver = TestDriver::new(hopping_counts());
    let error = driver
        .pipe("clicks", 0, None, Some(b"/home".to_vec()), -1)
        .unwrap_err()
        .to_string();
    assert!(error.contains("clicks-0 offset 0"), "{error}");
    assert!(error.contains("timestamp of 0 or more"), "{error}");
}

/// Per-minute counts per page, kept one day after they close (the default retention).
fn minute_counts() -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream("views", Unit, Utf8)
        .group_by(|_, page: &String| page.clone(), Grouped::direct(Utf8))
        .windowed_by(TimeWindows::of_size(millis(MINUTE)))
        .count("views-per-minute")
        .to_stream()
        .map(|w, n| (format!("{}@{}", w.key, w.start), n))
        .to("counts", Utf8, DecimalI64);
    builder.build()
}

#[test]
fn window_items_of_month_old_data_stay_readable_and_exact() {
    // A replay a month behind the wall clock: with TTL = event-time close + retention
    // (one day), every item would be expired the moment it is written.
    let base = (wall_clock_ms() - 30 * DAY).div_euclid(MINUTE) * MINUTE;
    let inputs = [
        ("/a", base + 1),
        ("/a", base + 2 * SECOND),
        ("/b", base + 3 * SECOND),
        ("/a", base + 59 * SECOND),
        ("/a", base + MINUTE + 5),
        ("/b", base + MINUTE + 30 * SECOND),
        ("/a", base + MINUTE + 40 * SECOND),
    ];
    let driver = TestDriver::new(minute_counts());
    let mut views = driver.input_topic("views", Unit, Utf8);
    // The reference: per page and minute, the records in it (none is late: the
    // timestamps are in order, no window has ended before a record of it arrives).
    let mut expected: BTreeMap<(String, i64), i64> = BTreeMap::new();
    for (page, ts) in inputs {
        views
            .pipe_input_with_timestamp((), page.to_owned(), ts)
            .unwrap();
        let start = ts.div_euclid(MINUTE) * MINUTE;
        *expected.entry((page.to_owned(), start)).or_insert(0) += 1;
    }
    assert_eq!(driver.last_report().unwrap().late_records, 0);
    assert_eq!(
        expected,
        BTreeMap::from([
            (("/a".to_owned(), base), 3),
            (("/a".to_owned(), base + MINUTE), 2),
            (("/b".to_owned(), base), 1),
            (("/b".to_owned(), base + MINUTE), 1),
        ])
    );
    let stored: BTreeMap<(String, i64), i64> = driver
        .memory_store()
        .windowed_states("views-per-minute")
        .into_iter()
        .map(|(k, start, s)| ((String::from_utf8(k).unwrap(), start), s.value))
        .collect();
    assert_eq!(stored, expected, "every window item is readable and exact");
    // Through the store's query of a key's windows (what interactive queries use).
    let windows = futures::executor::block_on(driver.memory_store().windows(
        "views-per-minute",
        b"/a",
        i64::MIN,
        i64::MAX,
    ))
    .unwrap();
    let windows: Vec<(i64, i64)> = windows.into_iter().map(|(w, s)| (w, s.value)).collect();
    assert_eq!(windows, vec![(base, 3), (base + MINUTE, 2)]);
    let emitted = driver
        .output_topic("counts", Utf8, DecimalI64)
        .read_key_values_to_map()
        .unwrap();
    let expected_emitted: BTreeMap<String, i64> = expected
        .iter()
        .map(|((page, start), n)| (format!("{page}@{start}"), *n))
        .collect();
    assert_eq!(emitted, expected_emitted);
}

/// Per-minute counts per key (the value is a number: anything else is a poison record).
fn keyed_minute_counts() -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream("readings", Utf8, DecimalI64)
        .group_by_key(Utf8)
        .windowed_by(TimeWindows::of_size(millis(MINUTE)))
        .count("readings-per-minute")
        .to_stream()
        .map(|w, n| (format!("{}@{}", w.key, w.start), n))
        .to("counts", Utf8, DecimalI64);
    builder.build()
}

fn record(offset: i64, timestamp: i64, key: &str, value: &str) -> Record {
    Record {
        offset,
        timestamp,
        timestamp_type: TimestampType::CreateTime,
        key: Some(key.to_owned().into_bytes().into()),
        value: Some(value.to_owned().into_bytes().into()),
        headers: Vec::new(),
        key_schema_metadata: None,
        value_schema_metadata: None,
    }
}

fn event(topic: &str, records: Vec<Record>) -> KafkaEvent {
    KafkaEvent {
        source: EventSource::SelfManaged,
        bootstrap_servers: "127.0.0.1:9092".into(),
        partitions: vec![PartitionRecords {
            tp: TopicPartition::new(topic, 0),
            records,
        }],
    }
}

fn stored_counts(store: &MemoryStore, name: &str) -> BTreeMap<String, i64> {
    store
        .windowed_states(name)
        .into_iter()
        .map(|(k, start, s)| {
            (
                format!("{}@{start}", String::from_utf8(k).unwrap()),
                s.value,
            )
        })
        .collect()
}

async fn stream_time(store: &MemoryStore, topic: &str) -> Option<i64> {
    store
        .clock()
        .await
        .unwrap()
        .partitions
        .get(&TopicPartition::new(topic, 0))
        .map(|t| t.stream_time)
}

#[tokio::test]
async fn a_poison_record_from_the_year_3000_closes_no_window() {
    for policy in [
        PoisonPolicy::Skip,
        PoisonPolicy::DeadLetter {
            topic: "readings-dlq".to_owned(),
        },
    ] {
        let topology = keyed_minute_counts();
        let store = MemoryStore::new();
        let sink = MemorySink::new();
        let options = BatchOptions {
            poison: policy.clone(),
            ..BatchOptions::default()
        };
        // In one batch: good, poison (an undecodable value) at the year 3000, good.
        let first = event(
            "readings",
            vec![
                record(0, 10 * SECOND, "s", "1"),
                record(1, YEAR_3000, "s", "not a number"),
                record(2, 20 * SECOND, "s", "2"),
                record(3, 30 * SECOND, "s", "3"),
            ],
        );
        let report = topology
            .process_with(&first, &store, &sink, &options)
            .await
            .unwrap()
            .report;
        assert_eq!(report.poison_records, 1, "{policy:?}");
        assert_eq!(report.late_records, 0, "{policy:?}: nothing is late");
        // The next batch: stream time is the good records', not the year 3000's.
        assert_eq!(stream_time(&store, "readings").await, Some(30 * SECOND));
        let second = event(
            "readings",
            vec![
                record(4, 40 * SECOND, "s", "4"),
                record(5, MINUTE + SECOND, "s", "5"),
            ],
        );
        let report = topology
            .process_with(&second, &store, &sink, &options)
            .await
            .unwrap()
            .report;
        assert_eq!(report.late_records, 0, "{policy:?}: nothing is late");
        // Kafka Streams' tumbling windows of a minute: 10, 20, 30, 40 s in [0, 1 min),
        // 61 s in [1 min, 2 min).
        assert_eq!(
            stored_counts(&store, "readings-per-minute"),
            BTreeMap::from([("s@0".to_owned(), 4), (format!("s@{MINUTE}"), 1)]),
            "{policy:?}"
        );
        assert_eq!(stream_time(&store, "readings").await, Some(MINUTE + SECOND));
        let dead: Vec<i64> = sink
            .records()
            .into_iter()
            .filter(|r| r.topic == "readings-dlq")
            .map(|r| r.timestamp.unwrap_or_default())
            .collect();
        match policy {
            PoisonPolicy::DeadLetter { .. } => assert_eq!(dead.len(), 1),
            _ => assert!(dead.is_empty()),
        }
    }
}

#[tokio::test]
async fn a_poison_record_alone_in_its_batch_leaves_the_stream_time_unchanged() {
    let topology = keyed_minute_counts();
    let store = MemoryStore::new();
    let sink = MemorySink::new();
    let options = BatchOptions {
        poison: PoisonPolicy::Skip,
        ..BatchOptions::default()
    };
    let batches = [
        vec![record(0, 10 * SECOND, "s", "1")],
        vec![record(1, YEAR_3000, "s", "poison")],
        vec![record(2, 20 * SECOND, "s", "2")],
    ];
    let mut late = 0;
    for records in batches {
        late += topology
            .process_with(&event("readings", records), &store, &sink, &options)
            .await
            .unwrap()
            .report
            .late_records;
    }
    assert_eq!(late, 0);
    assert_eq!(stream_time(&store, "readings").await, Some(20 * SECOND));
    assert_eq!(
        stored_counts(&store, "readings-per-minute"),
        BTreeMap::from([("s@0".to_owned(), 2)])
    );
}

/// Values `"<time taken>,<reading>"`, event time from the first field; a reading
/// `"bad"` makes the user's mapper panic (a poison record, after the extractor ran).
fn extracted_minute_counts() -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream_with_timestamps("taken", Utf8, Utf8, |_, v: &String, _| {
            v.split(',')
                .next()
                .and_then(|t| t.parse().ok())
                .unwrap_or(0)
        })
        .map_values(|v: String| {
            let reading = v.split(',').nth(1).unwrap_or_default().to_owned();
            assert!(reading != "bad", "a bad reading");
            reading
        })
        .group_by_key(Utf8)
        .windowed_by(TimeWindows::of_size(millis(MINUTE)))
        .count("taken-per-minute");
    builder.build()
}

#[tokio::test]
async fn a_poison_record_whose_extracted_time_is_far_future_closes_no_window() {
    let topology = extracted_minute_counts();
    let store = MemoryStore::new();
    let sink = MemorySink::new();
    let options = BatchOptions {
        poison: PoisonPolicy::Skip,
        ..BatchOptions::default()
    };
    let taken =
        |offset, time: i64, reading: &str| record(offset, 0, "s", &format!("{time},{reading}"));
    let records = vec![
        taken(0, 10 * SECOND, "1"),
        taken(1, YEAR_3000, "bad"),
        taken(2, 20 * SECOND, "2"),
    ];
    // The user's panic is caught and made a poison record (its message is on stderr).
    let report = topology
        .process_with(&event("taken", records), &store, &sink, &options)
        .await
        .unwrap()
        .report;
    assert_eq!((report.poison_records, report.late_records), (1, 0));
    assert_eq!(stream_time(&store, "taken").await, Some(20 * SECOND));
    assert_eq!(
        stored_counts(&store, "taken-per-minute"),
        BTreeMap::from([("s@0".to_owned(), 2)])
    );
}
