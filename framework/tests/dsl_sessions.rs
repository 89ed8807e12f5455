//! Session windows through the test driver equal a brute-force reference: with a grace
//! long enough that no record is late, the sessions of a key are the groups of its records
//! whose sorted timestamps are at most the gap apart, whatever the arrival order and the
//! batch boundaries; each session's count is its number of records.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use lambda_streams::driver::{Batching, TestDriver};
use lambda_streams::dsl::SessionWindows;
use lambda_streams::serdes::{DecimalI64, Utf8};
use lambda_streams::sink::VERSION_HEADER;
use lambda_streams::{StreamsBuilder, Topology};
use proptest::prelude::*;

const GAP: i64 = 5;

fn topology() -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream("in", Utf8, Utf8)
        .group_by_key(Utf8)
        .windowed_by_session(
            SessionWindows::with_inactivity_gap(Duration::from_millis(GAP as u64))
                .grace(Duration::from_secs(3600)),
        )
        .count("sessions")
        .to_stream()
        .map(|w, n| (format!("{}@{}-{}", w.key, w.start, w.end), n))
        .to("out", Utf8, DecimalI64);
    builder.build()
}

/// Per key: its sessions as `start-end` with their counts.
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
                sessions.insert(format!("{start}-{end}"), n);
                (start, n) = (ts, 0);
            }
            end = ts;
            n += 1;
        }
        sessions.insert(format!("{start}-{end}"), n);
        out.insert(key, sessions);
    }
    out
}

/// The sessions the driver emitted last per key: those with the highest version.
fn run(inputs: &[(String, i64)], batching: Batching) -> Sessions {
    let driver = TestDriver::new(topology()).with_batching(batching);
    let mut input = driver.input_topic("in", Utf8, Utf8);
    for (key, ts) in inputs {
        input
            .pipe_input_with_timestamp(key.clone(), "x".to_owned(), *ts)
            .unwrap();
    }
    driver.flush().unwrap();
    let mut latest: BTreeMap<String, (u64, BTreeMap<String, i64>)> = BTreeMap::new();
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
        let (key, window) = record.key.split_once('@').unwrap();
        let entry = latest.entry(key.to_owned()).or_default();
        if version > entry.0 {
            *entry = (version, BTreeMap::new());
        }
        if version == entry.0 {
            entry.1.insert(window.to_owned(), record.value);
        }
    }
    latest.into_iter().map(|(k, (_, s))| (k, s)).collect()
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
        prop_assert_eq!(run(&inputs, Batching::Size(size)), reference(&inputs));
    }
}
