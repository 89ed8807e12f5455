//! Stream–stream joins through the test driver equal a nested-loop reference over random
//! interleavings of both sides with out-of-order timestamps (at most window + grace behind
//! the newest record), record by record and in batches of any size: every pair of records
//! of one key within the window is emitted exactly once.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use lambda_streams::driver::{Batching, TestDriver};
use lambda_streams::dsl::JoinWindows;
use lambda_streams::serdes::Utf8;
use lambda_streams::{StreamsBuilder, Topology};
use proptest::prelude::*;

/// One record: left side or not, key, timestamp.
type Input = (bool, String, i64);

const DIFFERENCE: i64 = 7;
const GRACE: i64 = 3;

/// Records whose timestamps wander, each at most `DIFFERENCE + GRACE` behind the newest so far.
fn inputs() -> impl Strategy<Value = Vec<Input>> {
    let key = prop::sample::select(vec!["a", "b"]).prop_map(str::to_owned);
    prop::collection::vec((any::<bool>(), key, -(DIFFERENCE + GRACE)..6), 0..40).prop_map(|steps| {
        let mut newest = 0i64;
        steps
            .into_iter()
            .map(|(left, key, step)| {
                let ts = newest + step;
                newest = newest.max(ts);
                (left, key, ts)
            })
            .collect()
    })
}

fn topology() -> Topology {
    let builder = StreamsBuilder::new();
    let left = builder.stream("left", Utf8, Utf8);
    let right = builder.stream("right", Utf8, Utf8);
    left.join_stream(
        &right,
        JoinWindows::of(Duration::from_millis(DIFFERENCE as u64))
            .grace(Duration::from_millis(GRACE as u64)),
        "pairs",
        (Utf8, Utf8, Utf8),
        |_, l: &String, r: &String| format!("{l}+{r}"),
    )
    .to("joined", Utf8, Utf8);
    builder.build()
}

/// The reference, a nested loop: per key, every (left, right) pair whose timestamps differ
/// by at most `DIFFERENCE`, named `L<i>+R<j>` by input position, sorted.
fn reference(inputs: &[Input]) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (i, (left_i, key_i, ts_i)) in inputs.iter().enumerate() {
        for (j, (left_j, key_j, ts_j)) in inputs.iter().enumerate() {
            if *left_i && !*left_j && key_i == key_j && (ts_i - ts_j).abs() <= DIFFERENCE {
                out.entry(key_i.clone())
                    .or_default()
                    .push(format!("L{i}+R{j}"));
            }
        }
    }
    for pairs in out.values_mut() {
        pairs.sort();
    }
    out
}

fn run(inputs: &[Input], batching: Batching) -> BTreeMap<String, Vec<String>> {
    let driver = TestDriver::new(topology()).with_batching(batching);
    let mut left = driver.input_topic("left", Utf8, Utf8);
    let mut right = driver.input_topic("right", Utf8, Utf8);
    for (i, (is_left, key, ts)) in inputs.iter().enumerate() {
        if *is_left {
            left.pipe_input_with_timestamp(key.clone(), format!("L{i}"), *ts)
                .unwrap();
        } else {
            right
                .pipe_input_with_timestamp(key.clone(), format!("R{i}"), *ts)
                .unwrap();
        }
    }
    driver.flush().unwrap();
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (k, v) in driver
        .output_topic("joined", Utf8, Utf8)
        .read_key_values()
        .unwrap()
    {
        out.entry(k).or_default().push(v);
    }
    for pairs in out.values_mut() {
        pairs.sort();
    }
    out
}

proptest! {
    #[test]
    fn stream_joins_equal_a_nested_loop_reference_record_by_record(inputs in inputs()) {
        prop_assert_eq!(run(&inputs, Batching::PerRecord), reference(&inputs));
    }

    #[test]
    fn stream_joins_equal_a_nested_loop_reference_in_batches(inputs in inputs(), size in 2usize..12) {
        prop_assert_eq!(run(&inputs, Batching::Size(size)), reference(&inputs));
    }
}

/// A hand-computed case: L0@10, R1@15, R2@30, L3@28 (window 7) join as L0+R1 and L3+R2.
#[test]
fn pairs_within_the_window_join_once() {
    let inputs: Vec<Input> = vec![
        (true, "a".into(), 10),
        (false, "a".into(), 15),
        (false, "a".into(), 30),
        (true, "a".into(), 28),
    ];
    let expected = BTreeMap::from([("a".to_owned(), vec!["L0+R1".to_owned(), "L3+R2".to_owned()])]);
    assert_eq!(reference(&inputs), expected);
    for batching in [Batching::PerRecord, Batching::Size(2), Batching::Size(4)] {
        assert_eq!(run(&inputs, batching), expected, "{batching:?}");
    }
}
