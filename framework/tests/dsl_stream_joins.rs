//! Stream–stream joins through the test driver equal a nested-loop reference over random
//! interleavings of both sides with out-of-order timestamps (at most window + grace behind
//! the newest record), record by record and in batches of any size: every pair of records
//! of one key within the window is emitted exactly once.
//!
//! Left and outer joins against a reference of their own, over records wandering further
//! out of order: the join's closing time `T(x)` at record `x` is the highest, over the
//! batches before `x`'s, of the lowest stream time of the two topics after that batch (a
//! topic's stream time is its highest timestamp; one not seen yet does not count, and
//! once it is seen it may lower the lowest, but what closed stays closed). A pair `(l, r)` within the window is emitted
//! iff the earlier of the two (in processing order) is still there when the later arrives:
//! `ts + window + grace >= T(later)`. A record of an outer side with no pair is emitted alone
//! iff the final closing time passed its `ts + window + grace`. So a record is emitted alone
//! only once
//! it can no longer join, and never after it joined.

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

/// Which kind of stream–stream join.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Left,
    Outer,
}

fn outer_topology(kind: Kind) -> Topology {
    let builder = StreamsBuilder::new();
    let left = builder.stream("left", Utf8, Utf8);
    let right = builder.stream("right", Utf8, Utf8);
    let windows = JoinWindows::of(Duration::from_millis(DIFFERENCE as u64))
        .grace(Duration::from_millis(GRACE as u64));
    let joined = match kind {
        Kind::Left => left.left_join_stream(
            &right,
            windows,
            "pairs",
            (Utf8, Utf8, Utf8),
            |_, l: &String, r: Option<&String>| format!("{l}+{}", r.map_or("none", |r| r)),
        ),
        Kind::Outer => left.outer_join_stream(
            &right,
            windows,
            "pairs",
            (Utf8, Utf8, Utf8),
            |_, l: Option<&String>, r: Option<&String>| {
                format!("{}+{}", l.map_or("none", |l| l), r.map_or("none", |r| r))
            },
        ),
    };
    joined.to("joined", Utf8, Utf8);
    builder.build()
}

/// The order in which the driver processes the inputs: per batch of `size` consecutive
/// inputs, topic by topic (in order of first appearance in the batch), each in input order.
fn processing_order(inputs: &[Input], size: usize) -> Vec<usize> {
    let mut order = Vec::new();
    for (n, chunk) in inputs.chunks(size).enumerate() {
        let first_left = chunk[0].0;
        for side in [first_left, !first_left] {
            for (i, input) in chunk.iter().enumerate() {
                if input.0 == side {
                    order.push(n * size + i);
                }
            }
        }
    }
    order
}

/// The left or outer join reference (see the module documentation), per key, sorted.
fn outer_reference(inputs: &[Input], kind: Kind, size: usize) -> BTreeMap<String, Vec<String>> {
    let order = processing_order(inputs, size);
    let rank = |i: usize| order.iter().position(|o| *o == i).unwrap();
    // The join's closing time: the lowest stream time of the topics seen so far (a topic
    // not seen yet does not hold it), after the batches before the record's.
    let low_after = |records: &[Input]| {
        [true, false]
            .iter()
            .filter_map(|side| records.iter().filter(|x| x.0 == *side).map(|x| x.2).max())
            .min()
            .unwrap_or(i64::MIN)
    };
    // A partition seen later may lower it; what it closed stays closed: the highest so far.
    let closed_by = |end: usize| {
        (0..=end.div_ceil(size))
            .map(|k| low_after(&inputs[..(k * size).min(end)]))
            .max()
            .unwrap_or(i64::MIN)
    };
    let time_at = |i: usize| closed_by((i / size) * size);
    let name = |i: usize| format!("{}{i}", if inputs[i].0 { "L" } else { "R" });
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut joined = vec![false; inputs.len()];
    for l in (0..inputs.len()).filter(|i| inputs[*i].0) {
        for r in (0..inputs.len()).filter(|i| !inputs[*i].0) {
            let ((_, key, tl), (_, key_r, tr)) = (&inputs[l], &inputs[r]);
            if key != key_r || (tl - tr).abs() > DIFFERENCE {
                continue;
            }
            let (earlier, later) = if rank(l) < rank(r) { (l, r) } else { (r, l) };
            if inputs[earlier].2 + DIFFERENCE + GRACE >= time_at(later) {
                joined[l] = true;
                joined[r] = true;
                out.entry(key.clone())
                    .or_default()
                    .push(format!("{}+{}", name(l), name(r)));
            }
        }
    }
    for (i, (left, key, ts)) in inputs.iter().enumerate() {
        let outer_side = *left || kind == Kind::Outer;
        let final_time = closed_by(inputs.len());
        if outer_side && !joined[i] && ts + DIFFERENCE + GRACE < final_time {
            let alone = if *left {
                format!("{}+none", name(i))
            } else {
                format!("none+{}", name(i))
            };
            out.entry(key.clone()).or_default().push(alone);
        }
    }
    for results in out.values_mut() {
        results.sort();
    }
    out
}

fn run_outer(inputs: &[Input], kind: Kind, size: usize) -> BTreeMap<String, Vec<String>> {
    let driver = TestDriver::new(outer_topology(kind)).with_batching(Batching::Size(size));
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
    for results in out.values_mut() {
        results.sort();
    }
    out
}

/// Records wandering up to twice the window plus the grace behind the newest.
fn wandering() -> impl Strategy<Value = Vec<Input>> {
    let key = prop::sample::select(vec!["a", "b"]).prop_map(str::to_owned);
    prop::collection::vec(
        (any::<bool>(), key, -(2 * DIFFERENCE + GRACE + 3)..8),
        0..40,
    )
    .prop_map(|steps| {
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

/// No record is emitted alone after it joined (or twice alone).
fn never_alone_after_joining(out: &BTreeMap<String, Vec<String>>) -> bool {
    out.values().flatten().all(|result| {
        let (l, r) = result.split_once('+').unwrap();
        let alone = |name: &str| {
            out.values()
                .flatten()
                .filter(|x| x.split('+').any(|part| part == name))
                .count()
                == 1
        };
        match (l, r) {
            (name, "none") | ("none", name) => alone(name),
            _ => true,
        }
    })
}

proptest! {
    #[test]
    fn left_joins_equal_the_reference(inputs in wandering(), size in 1usize..10) {
        let out = run_outer(&inputs, Kind::Left, size);
        prop_assert!(never_alone_after_joining(&out));
        prop_assert_eq!(out, outer_reference(&inputs, Kind::Left, size));
    }

    #[test]
    fn outer_joins_equal_the_reference(inputs in wandering(), size in 1usize..10) {
        let out = run_outer(&inputs, Kind::Outer, size);
        prop_assert!(never_alone_after_joining(&out));
        prop_assert_eq!(out, outer_reference(&inputs, Kind::Outer, size));
    }
}

/// A hand-computed case (window 7, grace 3), record by record: L0@10 and R1@15 join; R3@41
/// joins L2@40; L4@60 finds no partner (R5@75 is 15 away) and waits: the join's closing
/// time (the lower of the two topics' stream times) ends at 60, which does not pass
/// 60 + 7 + 3, so L4 is never emitted alone (Kafka Streams, closing on the highest stream
/// time, 75, would emit it). The outer join also has R6@0 and R7@11 of key b: they arrive
/// when the closing time is 60 already, past both their windows and grace, so both are
/// alone at once.
///
/// In batches of 3 the driver processes a batch topic by topic (L0, L2, R1; L4, R3, R5;
/// R6, R7), and a record closes only on the closing time as its batch started: L0 is still
/// there when R1 arrives, so the results are the same.
#[test]
fn unjoined_records_wait_for_window_and_grace() {
    let inputs: Vec<Input> = vec![
        (true, "a".into(), 10),
        (false, "a".into(), 15),
        (true, "a".into(), 40),
        (false, "a".into(), 41),
        (true, "a".into(), 60),
        (false, "a".into(), 75),
        (false, "b".into(), 0),
        (false, "b".into(), 11),
    ];
    let results = |a: &[&str], b: &[&str]| {
        let mut out = BTreeMap::from([("a".to_owned(), a.iter().map(|s| s.to_string()).collect())]);
        if !b.is_empty() {
            out.insert("b".to_owned(), b.iter().map(|s| s.to_string()).collect());
        }
        out
    };
    let b = ["none+R6", "none+R7"];
    let cases = [
        (1, Kind::Left, results(&["L0+R1", "L2+R3"], &[])),
        (1, Kind::Outer, results(&["L0+R1", "L2+R3"], &b)),
        (3, Kind::Left, results(&["L0+R1", "L2+R3"], &[])),
        (3, Kind::Outer, results(&["L0+R1", "L2+R3"], &b)),
    ];
    for (size, kind, expected) in cases {
        assert_eq!(
            outer_reference(&inputs, kind, size),
            expected,
            "{kind:?}, {size}"
        );
        assert_eq!(run_outer(&inputs, kind, size), expected, "{kind:?}, {size}");
    }
}

/// A record whose key serializes to null joins nothing: emitted alone at once on an outer
/// side (the left side of a left join, both of an outer join), dropped on the other side.
#[test]
fn null_keys_are_emitted_alone_on_outer_sides() {
    use lambda_streams::serdes::Nullable;
    for kind in [Kind::Left, Kind::Outer] {
        let builder = StreamsBuilder::new();
        let left = builder.stream("left", Nullable(Utf8), Utf8);
        let right = builder.stream("right", Nullable(Utf8), Utf8);
        let windows = JoinWindows::of(Duration::from_millis(DIFFERENCE as u64));
        let name = |v: Option<&String>| v.cloned().unwrap_or_else(|| "none".to_owned());
        let joined = match kind {
            Kind::Left => left.left_join_stream(
                &right,
                windows,
                "pairs",
                (Nullable(Utf8), Utf8, Utf8),
                move |_, l: &String, r: Option<&String>| format!("{l}+{}", name(r)),
            ),
            Kind::Outer => left.outer_join_stream(
                &right,
                windows,
                "pairs",
                (Nullable(Utf8), Utf8, Utf8),
                move |_, l: Option<&String>, r: Option<&String>| format!("{}+{}", name(l), name(r)),
            ),
        };
        joined.to("joined", Nullable(Utf8), Utf8);
        let driver = TestDriver::new(builder.build());
        let mut l = driver.input_topic("left", Nullable(Utf8), Utf8);
        let mut r = driver.input_topic("right", Nullable(Utf8), Utf8);
        l.pipe_input_with_timestamp(None, "L0".to_owned(), 10)
            .unwrap();
        r.pipe_input_with_timestamp(None, "R1".to_owned(), 10)
            .unwrap();
        l.pipe_input_with_timestamp(Some("a".to_owned()), "L2".to_owned(), 10)
            .unwrap();
        r.pipe_input_with_timestamp(Some("a".to_owned()), "R3".to_owned(), 12)
            .unwrap();
        let out: Vec<String> = driver
            .output_topic("joined", Nullable(Utf8), Utf8)
            .read_values()
            .unwrap();
        let expected = match kind {
            Kind::Left => vec!["L0+none", "L2+R3"],
            Kind::Outer => vec!["L0+none", "none+R1", "L2+R3"],
        };
        assert_eq!(out, expected, "{kind:?}");
    }
}

/// A redelivered batch changes no state (same items, same versions) and emits exactly what
/// its first delivery's records emitted (same values, same source headers): here R7@95,
/// whose arrival joined L6@90. Its first delivery's closing pass also emitted R5@75 alone
/// (the closing time reached 90, past 75 + 7 + 3), which the redelivery does not emit
/// again: R5 left the item.
#[test]
fn a_redelivered_batch_emits_its_outputs_again_and_changes_no_state() {
    let driver = TestDriver::new(outer_topology(Kind::Outer));
    let mut left = driver.input_topic("left", Utf8, Utf8);
    let mut right = driver.input_topic("right", Utf8, Utf8);
    for (i, (is_left, key, ts)) in [
        (true, 10),
        (false, 15),
        (true, 40),
        (false, 41),
        (true, 60),
        (false, 75),
        (true, 90),
        (false, 95),
    ]
    .into_iter()
    .map(|(l, t)| (l, "a".to_owned(), t))
    .enumerate()
    {
        let topic = if is_left { &mut left } else { &mut right };
        let value = format!("{}{i}", if is_left { "L" } else { "R" });
        topic.pipe_input_with_timestamp(key, value, ts).unwrap();
    }
    let first = driver.read_output("joined");
    let values: Vec<_> = first.iter().map(|r| r.value.clone().unwrap()).collect();
    // L4 alone by the closing pass after L6 (closing time 75), R5 alone after R7 (90).
    assert_eq!(
        values,
        ["L0+R1", "L2+R3", "L4+none", "L6+R7", "none+R5"].map(|v| v.as_bytes().to_vec())
    );
    let last: Vec<_> = first
        .iter()
        .filter(|r| r.header("lambda-streams-source") == Some(&b"right:0:3"[..]))
        .cloned()
        .collect();
    assert_eq!(last.len(), 1);
    assert_eq!(last[0].value.as_deref(), Some(&b"L6+R7"[..]));
    let state = driver.store("pairs");
    assert_eq!(state.len(), 1, "one item: key a");
    driver.redeliver_last_batch().unwrap();
    assert_eq!(driver.read_output("joined"), last);
    assert_eq!(driver.store("pairs"), state);
}
