//! Session windows through the test driver equal a brute-force reference: with a grace
//! long enough that no record is late, the sessions of a key are the groups of its records
//! whose sorted timestamps are at most the gap apart, whatever the arrival order and the
//! batch boundaries; each session's count is its number of records. With a short grace,
//! the records whose merged session ends more than gap + grace behind the stream time (the
//! highest timestamp so far; Kafka Streams' rule) are late: the driver's reports count
//! exactly those, and the sessions are those of the other records.

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

/// The records that are not late, and how many are, as Kafka Streams'
/// `KStreamSessionWindowAggregate` judges them record by record: a record is late when the
/// session it merges into (its own `[t, t]` joined with every session of the key within
/// the gap of `t` that the store still returns: its retention is gap + grace behind its time,
/// the stream time before the record, so a session ending at or before that minus gap +
/// grace is not) ends before the close time, stream time − gap − grace, the stream time
/// being the highest timestamp so far (its own included; one partition).
/// Also returns the sessions Kafka Streams then holds, per key, with their counts
/// (`Held`: start, end, count).
fn on_time(inputs: &[(String, i64)], grace: i64) -> (Vec<(String, i64)>, u64, Sessions) {
    type Held = (i64, i64, i64);
    let mut stream_time = i64::MIN;
    let mut sessions: BTreeMap<String, Vec<Held>> = BTreeMap::new();
    let mut kept = Vec::new();
    let mut late = 0;
    for (key, ts) in inputs {
        // Kafka's session store time: the stream time before the record.
        let expired = stream_time.saturating_sub(GAP + grace);
        stream_time = stream_time.max(*ts);
        let close = stream_time - GAP - grace;
        let of_key = sessions.entry(key.clone()).or_default();
        let (near, mut far): (Vec<Held>, Vec<Held>) = of_key
            .iter()
            .partition(|(start, end, _)| start - GAP <= *ts && *ts <= end + GAP && *end > expired);
        let start = near.iter().map(|s| s.0).fold(*ts, i64::min);
        let end = near.iter().map(|s| s.1).fold(*ts, i64::max);
        if end < close {
            late += 1;
        } else {
            let n = near.iter().map(|s| s.2).sum::<i64>() + 1;
            far.push((start, end, n));
            *of_key = far;
            kept.push((key.clone(), *ts));
        }
    }
    let held = sessions
        .into_iter()
        .filter(|(_, all)| !all.is_empty())
        .map(|(key, all)| {
            let all = all
                .into_iter()
                .map(|(start, end, n)| (format!("{start}..{end}"), n))
                .collect();
            (key, all)
        })
        .collect();
    (kept, late, held)
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

/// A hand-computed case (gap 5, grace 2), by Kafka Streams' rule: 0, 4, 12; at stream time
/// 12 the close time is 5, so the session 0..4 has expired from Kafka's session store
/// (retention gap + grace): 3 merges with nothing and is late (its session [3, 3] ends
/// before 5); 9 is on time and merges with 12 only: sessions 0..4 (2) and 9..12 (2).
#[test]
fn a_late_record_is_counted_and_left_out() {
    let inputs: Vec<(String, i64)> = [0, 4, 12, 3, 9]
        .into_iter()
        .map(|t| ("a".to_owned(), t))
        .collect();
    assert_eq!(on_time(&inputs, 2).1, 1);
    let expected = BTreeMap::from([(
        "a".to_owned(),
        BTreeMap::from([("0..4".to_owned(), 2), ("9..12".to_owned(), 2)]),
    )]);
    assert_eq!(on_time(&inputs, 2).2, expected);
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

    /// With late records: the count is exact (Kafka Streams' rule, [`on_time`]); the
    /// sessions emitted last are the sessions Kafka Streams holds, with their counts, and
    /// hold at least every such session that ends within gap + grace of the key's newest
    /// record (older ones may have been dropped from the item).
    #[test]
    fn late_records_are_counted_and_left_out(inputs in wandering(), grace in 0i64..6, size in 1usize..10) {
        let (kept, late, expected) = on_time(&inputs, grace);
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
