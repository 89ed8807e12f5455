//! Windowed aggregations through the test driver equal a brute-force reference over
//! random inputs with out-of-order timestamps and late records: tumbling and hopping
//! windows with a grace period, emitted on every update and on window close.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use lambda_streams::driver::TestDriver;
use lambda_streams::dsl::{EmitStrategy, TimeWindows};
use lambda_streams::serdes::{DecimalI64, Utf8};
use lambda_streams::{StreamsBuilder, Topology};
use proptest::prelude::*;

/// Window size, advance and grace, in ms.
#[derive(Debug, Clone, Copy)]
struct Spec {
    size: i64,
    advance: i64,
    grace: i64,
}

fn specs() -> impl Strategy<Value = Spec> {
    (1i64..20, 0i64..15).prop_flat_map(|(size, grace)| {
        (1..=size).prop_map(move |advance| Spec {
            size,
            advance,
            grace,
        })
    })
}

/// Records: key and timestamp, in arrival order; timestamps wander back and forth.
fn inputs() -> impl Strategy<Value = Vec<(String, i64)>> {
    let key = prop::sample::select(vec!["a", "b", "c"]).prop_map(str::to_owned);
    prop::collection::vec((key, 0i64..120), 0..60)
}

/// Sums of values per key and window, as `<key>@<start>`, emitted by `emit`.
fn topology(spec: Spec, emit: EmitStrategy) -> Topology {
    let windows = TimeWindows::of_size(Duration::from_millis(spec.size as u64))
        .advance_by(Duration::from_millis(spec.advance as u64))
        .grace(Duration::from_millis(spec.grace as u64));
    let builder = StreamsBuilder::new();
    builder
        .stream("in", Utf8, DecimalI64)
        .group_by_key(Utf8)
        .windowed_by(windows)
        .emit_strategy(emit)
        .aggregate("sums", || 0i64, |_, v: i64, sum: i64| sum + v, DecimalI64)
        .to_stream()
        .map(|w, sum| (format!("{}@{}", w.key, w.start), sum))
        .to("out", Utf8, DecimalI64);
    builder.build()
}

/// The reference, by brute force: records in arrival order; the stream time is the
/// highest timestamp so far (the record's own included); a record counts in every window
/// `[s, s + size)` containing it (`s` a multiple of the advance, and never below 0, as in
/// Kafka Streams' `TimeWindows.windowsFor`) unless the stream time has reached
/// `s + size + grace`. Returns every window's sum, and the final stream time.
fn reference(spec: Spec, inputs: &[(String, i64)]) -> (BTreeMap<String, i64>, i64) {
    let mut sums = BTreeMap::new();
    let mut stream_time = i64::MIN;
    for (i, (key, ts)) in inputs.iter().enumerate() {
        stream_time = stream_time.max(*ts);
        let mut start = ts - ts.rem_euclid(spec.advance);
        while start > ts - spec.size && start >= 0 {
            if start + spec.size + spec.grace > stream_time {
                *sums.entry(format!("{key}@{start}")).or_insert(0) += i as i64 + 1;
            }
            start -= spec.advance;
        }
    }
    (sums, stream_time)
}

fn run(spec: Spec, emit: EmitStrategy, inputs: &[(String, i64)]) -> Vec<(String, i64)> {
    let driver = TestDriver::new(topology(spec, emit));
    let mut input = driver.input_topic("in", Utf8, DecimalI64);
    for (i, (key, ts)) in inputs.iter().enumerate() {
        input
            .pipe_input_with_timestamp(key.clone(), i as i64 + 1, *ts)
            .unwrap();
    }
    driver
        .output_topic("out", Utf8, DecimalI64)
        .read_key_values()
        .unwrap()
}

proptest! {
    /// On every update: the last update of each window is its reference sum, and every
    /// window the reference has was updated.
    #[test]
    fn windowed_sums_equal_brute_force(spec in specs(), inputs in inputs()) {
        let (expected, _) = reference(spec, &inputs);
        let last: BTreeMap<String, i64> = run(spec, EmitStrategy::OnWindowUpdate, &inputs)
            .into_iter()
            .collect();
        prop_assert_eq!(last, expected);
    }

    /// On window close: exactly the windows that the final stream time closed are
    /// emitted, once each, with their reference sums.
    #[test]
    fn windows_closed_once_equal_brute_force(spec in specs(), inputs in inputs()) {
        let (all, stream_time) = reference(spec, &inputs);
        let expected: BTreeMap<String, i64> = all
            .into_iter()
            .filter(|(k, _)| {
                let start: i64 = k.rsplit_once('@').unwrap().1.parse().unwrap();
                start + spec.size + spec.grace <= stream_time
            })
            .collect();
        let emitted = run(spec, EmitStrategy::OnWindowClose, &inputs);
        let once: BTreeMap<String, i64> = emitted.iter().cloned().collect();
        prop_assert_eq!(once.len(), emitted.len(), "each window once: {:?}", emitted);
        prop_assert_eq!(once, expected);
    }
}
