//! Sliding windows through the test driver equal a brute-force reference: with a grace
//! long enough that no record is late, each record's window `[t - d, t]` holds its key's
//! records in that range, whatever the arrival order and the batch boundaries.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use lambda_streams::driver::{Batching, TestDriver};
use lambda_streams::dsl::SlidingWindows;
use lambda_streams::serdes::{DecimalI64, Utf8};
use lambda_streams::sink::VERSION_HEADER;
use lambda_streams::{StreamsBuilder, Topology};
use proptest::prelude::*;

const DIFFERENCE: i64 = 6;

/// Per window `<key>@<start>..<end>`: the sum of the values of the records in it.
fn topology() -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream("in", Utf8, DecimalI64)
        .group_by_key(Utf8)
        .windowed_by_sliding(SlidingWindows::of_time_difference_and_grace(
            Duration::from_millis(DIFFERENCE as u64),
            Duration::from_secs(3600),
        ))
        .aggregate("sums", || 0i64, |_, v: i64, sum: i64| sum + v, DecimalI64)
        .to_stream()
        .map(|w, sum| (format!("{}@{}..{}", w.key, w.start, w.end), sum))
        .to("out", Utf8, DecimalI64);
    builder.build()
}

fn reference(inputs: &[(String, i64, i64)]) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    for (key, ts, _) in inputs {
        let sum = inputs
            .iter()
            .filter(|(k, t, _)| k == key && (ts - DIFFERENCE..=*ts).contains(t))
            .map(|(_, _, v)| v)
            .sum();
        out.insert(format!("{key}@{}..{}", ts - DIFFERENCE, ts + 1), sum);
    }
    out
}

fn run(inputs: &[(String, i64, i64)], batching: Batching) -> BTreeMap<String, i64> {
    let driver = TestDriver::new(topology()).with_batching(batching);
    let mut input = driver.input_topic("in", Utf8, DecimalI64);
    for (key, ts, value) in inputs {
        input
            .pipe_input_with_timestamp(key.clone(), *value, *ts)
            .unwrap();
    }
    driver.flush().unwrap();
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
    latest.into_iter().map(|(k, (_, v))| (k, v)).collect()
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
        prop_assert_eq!(run(&inputs, Batching::Size(size)), reference(&inputs));
    }
}
