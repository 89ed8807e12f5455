//! Sliding windows through the test driver equal a brute-force reference of Kafka Streams'
//! windows, whatever the arrival order and the batch boundaries: per key, every window
//! `[s, s + d]` (both ends inclusive) that ends at a record (its "left" window; from 0 for
//! the records before `d`, as Kafka Streams never starts a window before 0) or starts just
//! after a record and holds a later one (its "right" window), with the sum of the values
//! in it. With a short grace, records whose every window has closed on the stream time
//! (`t + 1 + d <= stream time - grace`) are late: the driver's reports count exactly those,
//! and the windows hold the other records.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use lambda_streams::driver::{Batching, TestDriver};
use lambda_streams::dsl::SlidingWindows;
use lambda_streams::serdes::{DecimalI64, Utf8};
use lambda_streams::sink::VERSION_HEADER;
use lambda_streams::{StreamsBuilder, Topology};
use proptest::prelude::*;

#[path = "reference/kafka_sliding.rs"]
mod kafka_sliding;

const DIFFERENCE: i64 = 6;

/// Per window `<key>@<start>..<end>` (`end` exclusive): the sum of the values of the
/// records in it.
fn topology(grace: i64) -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream("in", Utf8, DecimalI64)
        .group_by_key(Utf8)
        .windowed_by_sliding(SlidingWindows::of_time_difference_and_grace(
            Duration::from_millis(DIFFERENCE as u64),
            Duration::from_millis(grace as u64),
        ))
        .aggregate("sums", || 0i64, |_, v: i64, sum: i64| sum + v, DecimalI64)
        .to_stream()
        .map(|w, sum| (format!("{}@{}..{}", w.key, w.start, w.end), sum))
        .to("out", Utf8, DecimalI64);
    builder.build()
}

/// Kafka Streams' windows of the records `(key, timestamp, value)`, brute force: every
/// start `s` from 0 past the last record, kept when `[s, s + d]` is a left window (a record
/// at its end, or `s = 0` and a record in it) or a right window (a record at `s - 1` and one
/// in the window).
fn reference(inputs: &[(String, i64, i64)]) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    let last = inputs.iter().map(|r| r.1).max().unwrap_or(0);
    for key in ["a", "b"] {
        let records: Vec<(i64, i64)> = inputs
            .iter()
            .filter(|(k, _, _)| k == key)
            .map(|(_, t, v)| (*t, *v))
            .collect();
        let at = |t: i64| records.iter().any(|r| r.0 == t);
        for start in 0..=last + 1 {
            let end = start + DIFFERENCE;
            let inside: Vec<i64> = records
                .iter()
                .filter(|r| (start..=end).contains(&r.0))
                .map(|r| r.1)
                .collect();
            let left = at(end) || (start == 0 && !inside.is_empty());
            let right = at(start - 1) && !inside.is_empty();
            if left || right {
                out.insert(format!("{key}@{start}..{}", end + 1), inside.iter().sum());
            }
        }
    }
    out
}

/// Kafka Streams' sliding-window processor on `inputs` (one partition, in arrival order:
/// the stream time is the highest timestamp so far), per window `<key>@<start>..<end>` the
/// sum, and the records it drops as late. A record on time counts only in the windows
/// still open when it is read, and a window is made only while open (`kafka_sliding`).
fn kafka(inputs: &[(String, i64, i64)], grace: i64) -> (BTreeMap<String, i64>, u64) {
    let mut stream_time = i64::MIN;
    let mut by_key: BTreeMap<&str, Vec<(i64, i64, i64)>> = BTreeMap::new();
    for (key, ts, value) in inputs {
        stream_time = stream_time.max(*ts);
        by_key
            .entry(key)
            .or_default()
            .push((*ts, *value, stream_time));
    }
    let (mut out, mut late) = (BTreeMap::new(), 0);
    for (key, records) in by_key {
        let (windows, dropped) =
            kafka_sliding::kafka_sliding(&records, DIFFERENCE, grace, || 0i64, |a, v| a + v);
        late += dropped;
        for (start, (sum, _)) in windows {
            out.insert(format!("{key}@{start}..{}", start + DIFFERENCE + 1), sum);
        }
    }
    (out, late)
}

/// The records that are not late, and how many are: a record is late when
/// `t + 1 + d <= stream time - grace`, the stream time being the highest timestamp so far
/// (the record's own included; one partition).
fn on_time(inputs: &[(String, i64, i64)], grace: i64) -> (Vec<(String, i64, i64)>, u64) {
    let mut stream_time = i64::MIN;
    let mut kept = Vec::new();
    let mut late = 0;
    for input in inputs {
        stream_time = stream_time.max(input.1);
        if input.1 + 1 + DIFFERENCE <= stream_time - grace {
            late += 1;
        } else {
            kept.push(input.clone());
        }
    }
    (kept, late)
}

/// Per window, the value with the highest version, and the late records the batches
/// reported (batches of `size` records).
fn run(inputs: &[(String, i64, i64)], grace: i64, size: usize) -> (BTreeMap<String, i64>, u64) {
    let driver = TestDriver::new(topology(grace)).with_batching(Batching::Manual);
    let mut input = driver.input_topic("in", Utf8, DecimalI64);
    let mut late = 0;
    for (i, (key, ts, value)) in inputs.iter().enumerate() {
        input
            .pipe_input_with_timestamp(key.clone(), *value, *ts)
            .unwrap();
        if (i + 1) % size == 0 {
            late += driver.flush().unwrap().late_records;
        }
    }
    late += driver.flush().unwrap().late_records;
    let mut latest: BTreeMap<String, (u64, i64)> = BTreeMap::new();
    for record in driver
        .output_topic("out", Utf8, DecimalI64)
        .read_records()
        .unwrap()
    {
        let version: u64 = record
            .headers
            .iter()
            .find(|(name, _)| name == VERSION_HEADER)
            .map(|(_, v)| std::str::from_utf8(v).unwrap().parse().unwrap())
            .unwrap();
        let entry = latest.entry(record.key).or_insert((0, 0));
        if version >= entry.0 {
            *entry = (version, record.value);
        }
    }
    (latest.into_iter().map(|(k, (_, v))| (k, v)).collect(), late)
}

/// Records whose timestamps wander, at times far enough behind the newest to be late.
fn wandering() -> impl Strategy<Value = Vec<(String, i64, i64)>> {
    let key = prop::sample::select(vec!["a", "b"]).prop_map(str::to_owned);
    prop::collection::vec((key, -20i64..8, 1i64..10), 1..40).prop_map(|steps| {
        let mut newest = 20i64;
        steps
            .into_iter()
            .map(|(key, step, value)| {
                let ts = (newest + step).max(0);
                newest = newest.max(ts);
                (key, ts, value)
            })
            .collect()
    })
}

/// A hand-computed case (d = 6): records at 10, 13 and 30 make the left windows [4, 10],
/// [7, 13] and [24, 30], and the right window [11, 17] of 10 (holding 13); the right
/// windows of 13 and 30 hold nothing and do not exist. A record at 2 then has [0, 6] as its
/// left window and [3, 9] as its right one holds nothing.
#[test]
fn left_and_right_windows_by_hand() {
    let inputs: Vec<(String, i64, i64)> = [(10, 1), (13, 2), (30, 4), (2, 8)]
        .into_iter()
        .map(|(t, v)| ("a".to_owned(), t, v))
        .collect();
    let expected = BTreeMap::from([
        ("a@0..7".to_owned(), 8),
        ("a@4..11".to_owned(), 1),
        ("a@7..14".to_owned(), 3),
        ("a@11..18".to_owned(), 2),
        ("a@24..31".to_owned(), 4),
    ]);
    assert_eq!(reference(&inputs), expected);
    for size in [1, 2, 4] {
        assert_eq!(
            run(&inputs, 3600, size),
            (expected.clone(), 0),
            "batches of {size}"
        );
    }
    // With a grace of 10, the record at 2 is late at stream time 30 (2 + 1 + 6 <= 30 - 10).
    let mut without = expected;
    without.remove("a@0..7");
    for size in [1, 4] {
        assert_eq!(
            run(&inputs, 10, size),
            (without.clone(), 1),
            "batches of {size}"
        );
    }
}

proptest! {
    #[test]
    fn sliding_windows_equal_brute_force(
        inputs in prop::collection::vec(
            (prop::sample::select(vec!["a", "b"]).prop_map(str::to_owned), 0i64..60, 1i64..10),
            1..40,
        ),
        size in 1usize..10,
    ) {
        prop_assert_eq!(run(&inputs, 3_600_000, size), (reference(&inputs), 0));
        // Kafka's processor, with no record reaching a closed window, agrees.
        prop_assert_eq!(kafka(&inputs, 3_600_000), (reference(&inputs), 0));
    }

    /// With records behind the stream time: Kafka's windows and values, whatever the
    /// batches (a record on time is left out of the windows that closed before it was
    /// read, and windows are made and filled as Kafka Streams' processor makes them, even
    /// where that puts a record in a window it is not in the time range of:
    /// `reference/kafka_sliding.rs`).
    #[test]
    fn late_records_are_counted_and_left_out(inputs in wandering(), grace in 0i64..6, size in 1usize..10) {
        let (_, late) = on_time(&inputs, grace);
        let expected = kafka(&inputs, grace);
        prop_assert_eq!(expected.1, late);
        prop_assert_eq!(run(&inputs, grace, size), expected);
    }
}

/// A record without a valid event time (a negative timestamp; Kafka Streams refuses those)
/// is a poison record: with the default policy its batch fails with an error naming it.
#[test]
fn a_negative_timestamp_is_a_poison_record() {
    let driver = TestDriver::new(topology(3600));
    let mut input = driver.input_topic("in", Utf8, DecimalI64);
    let error = input
        .pipe_input_with_timestamp("a".to_owned(), 1, -1)
        .unwrap_err();
    assert!(
        error.to_string().contains("timestamp of 0 or more"),
        "{error}"
    );
}
