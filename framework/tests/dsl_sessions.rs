//! Session windows through the test driver equal a brute-force reference: with a grace
//! long enough that no record is late, the sessions of a key are the groups of its records
//! whose sorted timestamps are at most the gap apart, whatever the arrival order and the
//! batch boundaries; each session's count is its number of records. With a short grace,
//! the records more than gap + grace behind the stream time (the highest timestamp so far)
//! are late: the driver's reports count exactly those, and the sessions are those of the
//! other records.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use lambda_streams::driver::{Batching, TestDriver};
use lambda_streams::dsl::SessionWindows;
use lambda_streams::serdes::{DecimalI64, Nullable, Utf8};
use lambda_streams::sink::VERSION_HEADER;
use lambda_streams::{StreamsBuilder, Topology};
use proptest::prelude::*;

const GAP: i64 = 5;

fn topology(grace: i64) -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream("in", Utf8, Utf8)
        .group_by_key(Utf8)
        .windowed_by_session(
            SessionWindows::with_inactivity_gap(Duration::from_millis(GAP as u64))
                .grace(Duration::from_millis(grace as u64)),
        )
        .count("sessions")
        .to_change_stream()
        .map(|w, n| (format!("{}@{}..{}", w.key, w.start, w.end), n))
        .to("out", Utf8, Nullable(DecimalI64));
    builder.build()
}

/// Per key: its sessions as `start..end` with their counts.
type Sessions = BTreeMap<String, BTreeMap<String, i64>>;

/// The reference: sort each key's timestamps; split where two neighbours are more than
/// the gap apart.
fn reference(inputs: &[(String, i64)]) -> Sessions {
    let mut by_key: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for (key, ts) in inputs {
        by_key.entry(key.clone()).or_default().push(*ts);
    }
    let mut out = Sessions::new();
    for (key, mut times) in by_key {
        times.sort();
        let mut sessions = BTreeMap::new();
        let (mut start, mut end, mut n) = (times[0], times[0], 0);
        for ts in times {
            if ts - end > GAP {
                sessions.insert(format!("{start}..{end}"), n);
                (start, n) = (ts, 0);
            }
            end = ts;
            n += 1;
        }
        sessions.insert(format!("{start}..{end}"), n);
        out.insert(key, sessions);
    }
    out
}

/// The records that are not late, and how many are: a record is late when it is more than
/// gap + grace behind the stream time, the highest timestamp so far (its own included; one
/// partition).
fn on_time(inputs: &[(String, i64)], grace: i64) -> (Vec<(String, i64)>, u64) {
    let mut stream_time = i64::MIN;
    let mut kept = Vec::new();
    let mut late = 0;
    for input in inputs {
        stream_time = stream_time.max(input.1);
        if input.1 < stream_time - GAP - grace {
            late += 1;
        } else {
            kept.push(input.clone());
        }
    }
    (kept, late)
}

/// The sessions the driver emitted last (per session, the update with the highest version:
/// a tombstone deletes it; within one version the tombstones come first), and the late
/// records the batches reported (batches of `size` records).
fn run(inputs: &[(String, i64)], grace: i64, size: usize) -> (Sessions, u64) {
    let driver = TestDriver::new(topology(grace)).with_batching(Batching::Manual);
    let mut input = driver.input_topic("in", Utf8, Utf8);
    let mut late = 0;
    for (i, (key, ts)) in inputs.iter().enumerate() {
        input
            .pipe_input_with_timestamp(key.clone(), "x".to_owned(), *ts)
            .unwrap();
        if (i + 1) % size == 0 {
            late += driver.flush().unwrap().late_records;
        }
    }
    late += driver.flush().unwrap().late_records;
    let mut latest: BTreeMap<String, (u64, Option<i64>)> = BTreeMap::new();
    for record in driver
        .output_topic("out", Utf8, Nullable(DecimalI64))
        .read_records()
        .unwrap()
    {
        let version: u64 = record
            .headers
            .iter()
            .find(|(name, _)| name == VERSION_HEADER)
            .map(|(_, v)| std::str::from_utf8(v).unwrap().parse().unwrap())
            .unwrap();
        let entry = latest.entry(record.key).or_default();
        if version > entry.0 || (version == entry.0 && record.value.is_some()) {
            *entry = (version, record.value);
        }
    }
    let mut sessions = Sessions::new();
    for (key, (_, value)) in latest {
        if let Some(n) = value {
            let (key, window) = key.split_once('@').unwrap();
            sessions
                .entry(key.to_owned())
                .or_default()
                .insert(window.to_owned(), n);
        }
    }
    (sessions, late)
}

/// Records whose timestamps wander, at times far enough behind the newest to be late.
fn wandering() -> impl Strategy<Value = Vec<(String, i64)>> {
    let key = prop::sample::select(vec!["a", "b"]).prop_map(str::to_owned);
    prop::collection::vec((key, -25i64..9), 1..40).prop_map(|steps| {
        let mut newest = 0i64;
        steps
            .into_iter()
            .map(|(key, step)| {
                let ts = newest + step;
                newest = newest.max(ts);
                (key, ts)
            })
            .collect()
    })
}

/// A hand-computed case (gap 5, grace 2): 0, 4, 12; then 3 is late (more than 7 behind the
/// stream time 12); then 9 is not (3 behind), and bridges 0..4 and 12: one session 0..12
/// of 4 records.
#[test]
fn a_late_record_is_counted_and_left_out() {
    let inputs: Vec<(String, i64)> = [0, 4, 12, 3, 9]
        .into_iter()
        .map(|t| ("a".to_owned(), t))
        .collect();
    assert_eq!(on_time(&inputs, 2).1, 1);
    let expected = BTreeMap::from([("a".to_owned(), BTreeMap::from([("0..12".to_owned(), 4)]))]);
    for size in [1, 2, 5] {
        assert_eq!(
            run(&inputs, 2, size),
            (expected.clone(), 1),
            "batches of {size}"
        );
    }
}

proptest! {
    #[test]
    fn sessions_equal_brute_force(
        inputs in prop::collection::vec(
            (prop::sample::select(vec!["a", "b"]).prop_map(str::to_owned), 0i64..80),
            1..40,
        ),
        size in 1usize..10,
    ) {
        prop_assert_eq!(run(&inputs, 3_600_000, size), (reference(&inputs), 0));
    }

    /// With late records: the count is exact; the sessions emitted last are sessions of
    /// the records on time, with their counts, and hold at least every such session that
    /// ends within gap + grace of the key's newest record (older ones may have been
    /// dropped from the item).
    #[test]
    fn late_records_are_counted_and_left_out(inputs in wandering(), grace in 0i64..6, size in 1usize..10) {
        let (kept, late) = on_time(&inputs, grace);
        let expected = reference(&kept);
        let (sessions, counted) = run(&inputs, grace, size);
        prop_assert_eq!(counted, late);
        for (key, all) in &expected {
            let newest = kept.iter().filter(|(k, _)| k == key).map(|r| r.1).max().unwrap();
            let got = sessions.get(key).cloned().unwrap_or_default();
            for (window, n) in &got {
                prop_assert_eq!(all.get(window), Some(n), "{} {}", key, window);
            }
            for (window, n) in all {
                let end: i64 = window.split_once("..").unwrap().1.parse().unwrap();
                if end >= newest - GAP - grace {
                    prop_assert_eq!(got.get(window), Some(n), "{} {}", key, window);
                }
            }
        }
        prop_assert!(sessions.keys().all(|k| expected.contains_key(k)));
    }
}
