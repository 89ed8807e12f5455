//! Kafka Streams' own tests of final results, ported: the emit-on-close (`ON_WINDOW_CLOSE`)
//! variants of the session and sliding window tests, and the final results of windowed
//! counts under `suppress(untilWindowCloses(unbounded()))`. The same inputs and the same
//! expected records (key, window, value and timestamp) as the Kafka Streams test each one
//! names (`streams/src/test/java/org/apache/kafka/streams/kstream/internals/<Class>.java`,
//! `<method>`); the expected values are Kafka Streams' facts, copied from those tests, the
//! test code is ours.
//!
//! Each topology runs with one record per batch, as Kafka Streams processes them (its tests
//! set the emit interval to 0, so every record that moves the stream time emits what it
//! closes): the records out must equal Kafka's, in order. Final results must not depend on
//! batch boundaries, so with larger batches the same records come out (in the order the
//! closing passes emit them). Where lambda-streams differs on purpose, the test asserts our
//! behaviour and says which difference of `docs/kafka-streams-differences.md` it is.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use lambda_streams::driver::{Batching, TestDriver};
use lambda_streams::dsl::{
    EmitStrategy, Grouped, KTable, SessionWindows, SlidingWindows, Suppressed, TimeWindows,
    Windowed,
};
use lambda_streams::serdes::{Nullable, Utf8};
use lambda_streams::{StreamsBuilder, Topology};

/// One output record: `<key>@<start>/<end>`, the value (`None`: a tombstone), the timestamp.
type Out = (String, Option<String>, i64);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Sends a windowed table's changelog to `out` as `<key>@<start>/<end>` → value.
fn to_out<V: Clone + Send + Sync + ToString + 'static>(table: KTable<Windowed<String>, V>) {
    table
        .to_change_stream()
        .map(|w, v: Option<V>| {
            (
                format!("{}@{}/{}", w.key, w.start, w.end),
                v.map(|v| v.to_string()),
            )
        })
        .to("out", Utf8, Nullable(Utf8));
}

/// Kafka's `MockAggregator.TOSTRING_ADDER` on strings.
fn adder(_: &String, v: String, agg: String) -> String {
    format!("{agg}+{v}")
}

/// Runs `inputs` (key, value, timestamp) on topic `input` through `topology` and returns the
/// records produced to `out`, in order.
fn run(topology: Topology, batching: Batching, inputs: &[(&str, &str, i64)]) -> Vec<Out> {
    let driver = TestDriver::new(topology).with_batching(batching);
    let mut input = driver.input_topic("input", Utf8, Utf8);
    for (k, v, ts) in inputs {
        input
            .pipe_input_with_timestamp(k.to_string(), v.to_string(), *ts)
            .unwrap();
    }
    // A manual batch's repartition records are a batch of their own, flushed next.
    for _ in 0..3 {
        driver.flush().unwrap();
    }
    driver
        .output_topic("out", Utf8, Nullable(Utf8))
        .read_records()
        .unwrap()
        .into_iter()
        .map(|r| (r.key, r.value, r.timestamp.unwrap()))
        .collect()
}

fn out(records: &[(&str, &str, i64)]) -> Vec<Out> {
    records
        .iter()
        .map(|(k, v, t)| (k.to_string(), Some(v.to_string()), *t))
        .collect()
}

/// Runs the topology one record per batch (must equal `expected`, in order) and in batches
/// of 2, 3 and all records (the same records, each once, in any order).
fn check(build: impl Fn() -> Topology, inputs: &[(&str, &str, i64)], expected: &[Out]) {
    assert_eq!(run(build(), Batching::PerRecord, inputs), expected);
    let mut sorted = expected.to_vec();
    sorted.sort();
    for size in [2, 3, inputs.len()] {
        let mut batched = run(build(), Batching::Size(size), inputs);
        batched.sort();
        assert_eq!(batched, sorted, "batches of {size}");
    }
}

// ---------------------------------------------------------------------------------------
// Session windows: SessionWindowedKStreamImplTest (gap 500 ms, no grace), ON_WINDOW_CLOSE
// ---------------------------------------------------------------------------------------

/// `SessionWindowedKStreamImplTest.processData`.
const SESSION_DATA: &[(&str, &str, i64)] = &[
    ("1", "1", 10),
    ("1", "2", 15),
    ("1", "3", 600),
    ("2", "1", 600),
    ("2", "2", 599),
];

fn session_windowed(kind: &str) -> Topology {
    let builder = StreamsBuilder::new();
    let windowed = builder
        .stream("input", Utf8, Utf8)
        .group_by_key(Utf8)
        .windowed_by_session(SessionWindows::with_inactivity_gap(ms(500)))
        .emit_strategy(EmitStrategy::OnWindowClose);
    match kind {
        "count" => to_out(windowed.count("store")),
        "reduce" => to_out(windowed.reduce("store", |a, b| format!("{a}+{b}"), Utf8)),
        _ => to_out(windowed.aggregate(
            "store",
            || "0".to_owned(),
            adder,
            |_, a: String, b: String| format!("{a}+{b}"),
            Utf8,
        )),
    }
    builder.build()
}

/// SessionWindowedKStreamImplTest.shouldCountSessionWindowedWithCachingDisabled and
/// …WithCachingEnabled (ON_WINDOW_CLOSE): at stream time 600 the session `[10, 15]` closes
/// (`15 < 600 - 0 - 500`), the others stay open.
#[test]
fn session_windowed_should_count_emit_final() {
    check(
        || session_windowed("count"),
        SESSION_DATA,
        &out(&[("1@10/15", "2", 15)]),
    );
}

/// SessionWindowedKStreamImplTest.shouldReduceWindowed (ON_WINDOW_CLOSE).
#[test]
fn session_windowed_should_reduce_emit_final() {
    check(
        || session_windowed("reduce"),
        SESSION_DATA,
        &out(&[("1@10/15", "1+2", 15)]),
    );
}

/// SessionWindowedKStreamImplTest.shouldAggregateSessionWindowed (ON_WINDOW_CLOSE): the
/// merger's order gives `0+0+1+2`, as on update.
#[test]
fn session_windowed_should_aggregate_emit_final() {
    check(
        || session_windowed("aggregate"),
        SESSION_DATA,
        &out(&[("1@10/15", "0+0+1+2", 15)]),
    );
}

// ---------------------------------------------------------------------------------------
// Session windows: KStreamSessionWindowAggregateProcessorTest (GAP_MS = 5 min, no grace),
// ON_WINDOW_CLOSE
// ---------------------------------------------------------------------------------------

const GAP_MS: i64 = 5 * 60 * 1000;

/// The processor test's aggregation: `0`, `aggregate + 1`, merged by `a + b`.
fn session_processor() -> Topology {
    let builder = StreamsBuilder::new();
    to_out(
        builder
            .stream("input", Utf8, Utf8)
            .group_by_key(Utf8)
            .windowed_by_session(SessionWindows::with_inactivity_gap(ms(GAP_MS as u64)))
            .emit_strategy(EmitStrategy::OnWindowClose)
            .aggregate(
                "session-store",
                || 0i64,
                |_, _, n: i64| n + 1,
                |_, a: i64, b: i64| a + b,
                lambda_streams::serdes::DecimalI64,
            ),
    );
    builder.build()
}

/// KStreamSessionWindowAggregateProcessorTest.shouldHaveMultipleSessionsForSameIdWhenTimestampApartBySessionGap
/// (ON_WINDOW_CLOSE): the sessions at 0 and GAP + 1 close; the last one (3 records at
/// 2 GAP + 2) stays open.
#[test]
fn session_processor_should_have_multiple_sessions_emit_final() {
    let (t1, t2) = (GAP_MS + 1, 2 * (GAP_MS + 1));
    check(
        session_processor,
        &[
            ("mel", "first", 0),
            ("mel", "second", t1),
            ("mel", "second", t1),
            ("mel", "third", t2),
            ("mel", "third", t2),
            ("mel", "third", t2),
        ],
        &out(&[("mel@0/0", "1", 0), (&format!("mel@{t1}/{t1}"), "2", t1)]),
    );
}

/// KStreamSessionWindowAggregateProcessorTest.shouldHandleMultipleSessionsAndMerging
/// (ON_WINDOW_CLOSE): `a`, `b`, `c` at `[0, 0]` close at stream time GAP + 1, `d`'s
/// `[0, GAP / 2]` at GAP + 1 + GAP / 2; no tombstones (the merged sessions were never
/// emitted).
#[test]
fn session_processor_should_handle_multiple_sessions_and_merging_emit_final() {
    let (half, after) = (GAP_MS / 2, GAP_MS + 1);
    check(
        session_processor,
        &[
            ("a", "1", 0),
            ("b", "1", 0),
            ("c", "1", 0),
            ("d", "1", 0),
            ("d", "2", half),
            ("a", "2", after),
            ("b", "2", after),
            ("a", "3", after + half),
            ("c", "3", after + half),
        ],
        &out(&[
            ("a@0/0", "1", 0),
            ("b@0/0", "1", 0),
            ("c@0/0", "1", 0),
            (&format!("d@0/{half}"), "2", half),
        ]),
    );
}

/// KStreamSessionWindowAggregateProcessorTest.shouldMergeSessions and
/// shouldRemoveMergedSessionsFromStateStore (ON_WINDOW_CLOSE; Kafka asserts the store, here
/// the records out). The record at GAP + 1 closes `[0, 0]` (`0 < GAP + 1 - GAP`), so Kafka
/// Streams emits it; the record at GAP / 2 is on time (its session's end GAP + 1 is not
/// before the close time 1). Kafka's test, whose session store keeps 3 × GAP, merges
/// `[0, 0]` into `[0, GAP + 1]`; with the DSL's default retention, gap + grace, this
/// crate's only one, `[0, 0]` has expired from the store and the record merges with
/// `[GAP + 1, GAP + 1]` only (a documented difference), in every batching.
#[test]
fn session_processor_should_merge_sessions_emit_final() {
    let close = 3 * GAP_MS; // past GAP + 1 + GAP: closes the merged session
    let inputs = [
        ("mel", "first", 0),
        ("mel", "second", GAP_MS + 1),
        ("mel", "third", GAP_MS / 2),
        ("other", "x", close),
    ];
    let merged = format!("mel@{}/{}", GAP_MS / 2, GAP_MS + 1);
    let ours = out(&[("mel@0/0", "1", 0), (&merged, "2", GAP_MS + 1)]);
    for batching in [
        Batching::PerRecord,
        Batching::Size(2),
        Batching::Size(3),
        Batching::Manual,
    ] {
        assert_eq!(
            run(session_processor(), batching, &inputs),
            ours,
            "{batching:?}"
        );
    }
}

/// Kafka Streams' session store (the DSL's retention, gap + grace) no longer returns a
/// session ending at or before its time minus the retention, so a later record on time
/// within the gap of an emitted, expired session starts a session of its own (Kafka's
/// `KStreamSessionWindowAggregate`: `findSessions` from `observedStreamTime - retention +
/// 1`). Gap 10, no grace: `[0, 0]` closes at stream time 11 and has expired from the store
/// (0 < 11 - 10 + 1); the record at 5 is not late (its session ends at 5 >= 11 - 10) and
/// is `[5, 5]`, emitted when the record at 30 closes it.
#[test]
fn an_expired_emitted_session_takes_no_record_as_in_kafka_streams() {
    let build = || {
        let builder = StreamsBuilder::new();
        to_out(
            builder
                .stream("input", Utf8, Utf8)
                .group_by_key(Utf8)
                .windowed_by_session(SessionWindows::with_inactivity_gap(ms(10)))
                .emit_strategy(EmitStrategy::OnWindowClose)
                .count("s"),
        );
        builder.build()
    };
    let inputs = [("a", "x", 0), ("b", "x", 11), ("a", "x", 5), ("b", "x", 30)];
    assert_eq!(
        run(build(), Batching::PerRecord, &inputs),
        out(&[("a@0/0", "1", 0), ("a@5/5", "1", 5), ("b@11/11", "1", 11)])
    );
}

/// A key that goes quiet gets its final session from the closing pass, whichever key
/// moves the stream time; each session once, however the batches fall.
#[test]
fn a_quiet_key_gets_its_final_session_once() {
    let build = || {
        let builder = StreamsBuilder::new();
        to_out(
            builder
                .stream("input", Utf8, Utf8)
                .group_by_key(Utf8)
                .windowed_by_session(SessionWindows::with_inactivity_gap(ms(10)).grace(ms(5)))
                .emit_strategy(EmitStrategy::OnWindowClose)
                .count("s"),
        );
        builder.build()
    };
    let mut inputs = vec![("quiet", "x", 1), ("quiet", "x", 3)];
    for t in 0..40 {
        inputs.push(("busy", "x", t * 2));
    }
    let records = run(build(), Batching::PerRecord, &inputs);
    let quiet: Vec<_> = records
        .iter()
        .filter(|r| r.0.starts_with("quiet"))
        .collect();
    // [1, 3] closes once the stream time passes 3 + 10 + 5.
    assert_eq!(quiet, [&("quiet@1/3".to_owned(), Some("2".to_owned()), 3)]);
    let mut per_size = BTreeMap::new();
    for size in [1, 7, inputs.len()] {
        let mut batched = run(build(), Batching::Size(size), &inputs);
        batched.sort();
        per_size.insert(size, batched);
    }
    let first = per_size.values().next().cloned().unwrap();
    assert!(per_size.values().all(|r| *r == first));
}

// ---------------------------------------------------------------------------------------
// Sliding windows: KStreamSlidingWindowAggregateTest, ON_WINDOW_CLOSE
// ---------------------------------------------------------------------------------------

/// The test's sliding aggregation (`"0"`, `TOSTRING_ADDER`) or reduce (`STRING_ADDER`),
/// emitting final results.
fn sliding(difference: u64, grace: u64, kind: &str) -> Topology {
    let builder = StreamsBuilder::new();
    let windowed = builder
        .stream("input", Utf8, Utf8)
        .group_by_key(Utf8)
        .windowed_by_sliding(SlidingWindows::of_time_difference_and_grace(
            ms(difference),
            ms(grace),
        ))
        .emit_strategy(EmitStrategy::OnWindowClose);
    match kind {
        "reduce" => to_out(windowed.reduce("store", |a, b| format!("{a}+{b}"), Utf8)),
        _ => to_out(windowed.aggregate("store", || "0".to_owned(), adder, Utf8)),
    }
    builder.build()
}

/// A sliding window's record: (key, start, value, timestamp).
type Slid = (String, i64, String, i64);

/// The records out as (key, window start, value, timestamp), sorted (Kafka's `gatherOutput`
/// and its sorted lists compare them as a set).
fn slid(records: &[Out]) -> Vec<Slid> {
    let mut slid: Vec<Slid> = records
        .iter()
        .map(|(window, value, ts)| {
            let (key, bounds) = window.split_once('@').unwrap();
            let start = bounds.split('/').next().unwrap().parse().unwrap();
            (key.to_owned(), start, value.clone().unwrap(), *ts)
        })
        .collect();
    slid.sort();
    slid
}

fn windows(key: &str, expected: &[(i64, &str, i64)]) -> Vec<Slid> {
    let mut all: Vec<Slid> = expected
        .iter()
        .map(|(start, v, ts)| (key.to_owned(), *start, v.to_string(), *ts))
        .collect();
    all.sort();
    all
}

/// One record per batch, then batches of 2, 3 and all records: each time Kafka's final
/// windows, each once.
fn check_sliding(build: impl Fn() -> Topology, inputs: &[(&str, &str, i64)], expected: &[Slid]) {
    let mut sorted = expected.to_vec();
    sorted.sort();
    for batching in [
        Batching::PerRecord,
        Batching::Size(2),
        Batching::Size(3),
        Batching::Manual,
    ] {
        assert_eq!(
            slid(&run(build(), batching, inputs)),
            sorted,
            "{batching:?}"
        );
    }
}

/// KStreamSlidingWindowAggregateTest.testAggregateSmallInput (ON_WINDOW_CLOSE): difference
/// 10, grace 5; at stream time 30 the windows ending before 25 have closed.
#[test]
fn sliding_aggregate_small_input_emit_final() {
    check_sliding(
        || sliding(10, 5, "aggregate"),
        &[
            ("A", "1", 10),
            ("A", "2", 10),
            ("A", "3", 14),
            ("A", "4", 15),
            ("A", "5", 20),
            ("A", "6", 22),
            ("A", "7", 30),
        ],
        &windows(
            "A",
            &[
                (0, "0+1+2", 10),
                (4, "0+1+2+3", 14),
                (5, "0+1+2+3+4", 15),
                (10, "0+1+2+3+4+5", 20),
                (11, "0+3+4+5", 20),
                (12, "0+3+4+5+6", 22),
            ],
        ),
    );
}

/// KStreamSlidingWindowAggregateTest.testReduceSmallInput (ON_WINDOW_CLOSE).
#[test]
fn sliding_reduce_small_input_emit_final() {
    check_sliding(
        || sliding(10, 5, "reduce"),
        &[
            ("A", "1", 10),
            ("A", "2", 14),
            ("A", "3", 15),
            ("A", "4", 22),
            ("A", "5", 26),
            ("A", "6", 30),
        ],
        &windows(
            "A",
            &[
                (0, "1", 10),
                (4, "1+2", 14),
                (5, "1+2+3", 15),
                (11, "2+3", 15),
                (12, "2+3+4", 22),
            ],
        ),
    );
}

/// KStreamSlidingWindowAggregateTest.testAggregateLargeInput (ON_WINDOW_CLOSE): difference
/// 10, grace 10. Records whose windows had closed when they were read (B@14's `[4, 14]`,
/// C@11's `[1, 11]`, D@11, D@12, D@16's left windows) count only in their windows still
/// open, and the windows no record counted in are not emitted.
#[test]
fn sliding_aggregate_large_input_emit_final() {
    let mut expected = windows("A", &[(0, "0+1", 10), (5, "0+1+4", 15)]);
    expected.extend(windows(
        "B",
        &[(2, "0+1", 12), (3, "0+1+2", 13), (8, "0+1+2+3+6", 18)],
    ));
    expected.extend(windows("C", &[(5, "0+2", 15), (6, "0+2+3", 16)]));
    check_sliding(
        || sliding(10, 10, "aggregate"),
        &[
            ("A", "1", 10),
            ("A", "2", 20),
            ("A", "3", 22),
            ("A", "4", 15),
            ("B", "1", 12),
            ("B", "2", 13),
            ("B", "3", 18),
            ("B", "4", 19),
            ("B", "5", 25),
            ("B", "6", 14),
            ("C", "1", 11),
            ("C", "2", 15),
            ("C", "3", 16),
            ("C", "4", 21),
            ("C", "5", 23),
            ("D", "4", 11),
            ("D", "2", 12),
            ("D", "3", 29),
            ("D", "5", 16),
        ],
        &expected,
    );
}

/// `testEarlyRecordsSmallInput`'s and `testEarlyNoGracePeriodSmallInput`'s input (records
/// before the difference share the window `[0, 50]`); the last value is `last`.
fn early_small(last: &'static str) -> Vec<(&'static str, &'static str, i64)> {
    vec![
        ("A", "1", 0),
        ("A", "2", 5),
        ("A", "3", 6),
        ("A", "4", 3),
        ("A", "5", 13),
        ("A", "6", 10),
        ("A", last, 70),
    ]
}

/// The final windows of [`early_small`], as both Kafka tests expect them.
fn early_small_final() -> Vec<Slid> {
    windows(
        "A",
        &[
            (0, "0+1+2+3+4+5+6", 13),
            (1, "0+2+3+4+5+6", 13),
            (4, "0+2+3+5+6", 13),
            (6, "0+3+5+6", 13),
            (7, "0+5+6", 13),
            (11, "0+5", 13),
        ],
    )
}

/// KStreamSlidingWindowAggregateTest.testEarlyRecordsSmallInput (ON_WINDOW_CLOSE):
/// difference 50, grace 0.
#[test]
fn sliding_early_records_small_input_emit_final() {
    check_sliding(
        || sliding(50, 0, "aggregate"),
        &early_small("7"),
        &early_small_final(),
    );
}

/// KStreamSlidingWindowAggregateTest.testEarlyNoGracePeriodSmallInput (ON_WINDOW_CLOSE).
#[test]
fn sliding_early_no_grace_period_small_input_emit_final() {
    check_sliding(
        || sliding(50, 0, "aggregate"),
        &early_small("6"),
        &early_small_final(),
    );
}

/// KStreamSlidingWindowAggregateTest.testEarlyRecordsRepeatedInput (ON_WINDOW_CLOSE):
/// difference 5, grace 0; at stream time 7 the windows starting at 0 and 1 have closed.
#[test]
fn sliding_early_records_repeated_input_emit_final() {
    check_sliding(
        || sliding(5, 0, "aggregate"),
        &[
            ("A", "1", 0),
            ("A", "2", 2),
            ("A", "3", 4),
            ("A", "4", 0),
            ("A", "5", 2),
            ("A", "6", 2),
            ("A", "7", 0),
            ("A", "8", 7),
        ],
        &windows("A", &[(0, "0+1+2+3+4+5+6+7", 4), (1, "0+2+3+5+6", 4)]),
    );
}

/// KStreamSlidingWindowAggregateTest.testNoGracePeriodSmallInput (ON_WINDOW_CLOSE):
/// difference 50, grace 0. The record at 103 is read at stream time 106, when its left
/// window `[53, 103]` had closed: that window does not exist, and 103 counts in `[56, 106]`.
#[test]
fn sliding_no_grace_period_small_input_emit_final() {
    check_sliding(
        || sliding(50, 0, "aggregate"),
        &[
            ("A", "1", 100),
            ("A", "2", 105),
            ("A", "3", 106),
            ("A", "4", 103),
            ("A", "5", 113),
            ("A", "6", 110),
        ],
        &windows(
            "A",
            &[(50, "0+1", 100), (55, "0+1+2", 105), (56, "0+1+2+3+4", 106)],
        ),
    );
}

/// `testEarlyRecordsLargeInput`'s and `testEarlyNoGracePeriodLargeInput`'s input.
const EARLY_LARGE: &[(&str, &str, i64)] = &[
    ("E", "1", 0),
    ("E", "3", 5),
    ("E", "4", 6),
    ("E", "2", 3),
    ("E", "6", 13),
    ("E", "5", 10),
    ("E", "7", 4),
    ("E", "8", 2),
    ("E", "9", 15),
];

/// KStreamSlidingWindowAggregateTest.testEarlyRecordsLargeInput (ON_WINDOW_CLOSE):
/// difference 10, grace 1.
#[test]
fn sliding_early_records_large_input_emit_final() {
    check_sliding(
        || sliding(10, 1, "aggregate"),
        EARLY_LARGE,
        &windows(
            "E",
            &[
                (0, "0+1+3+4+2", 6),
                (1, "0+3+4+2", 6),
                (3, "0+3+4+2+6+5+7", 13),
            ],
        ),
    );
}

/// KStreamSlidingWindowAggregateTest.testEarlyNoGracePeriodLargeInput (ON_WINDOW_CLOSE):
/// difference 10, no grace.
#[test]
fn sliding_early_no_grace_period_large_input_emit_final() {
    check_sliding(
        || sliding(10, 0, "aggregate"),
        EARLY_LARGE,
        &windows(
            "E",
            &[
                (0, "0+1+3+4+2", 6),
                (1, "0+3+4+2", 6),
                (3, "0+3+4+2+6+5+7", 13),
                (4, "0+3+4+6+5+7", 13),
            ],
        ),
    );
}

/// KStreamSlidingWindowAggregateTest.testNoGracePeriodLargeInput (ON_WINDOW_CLOSE):
/// difference 10, no grace.
#[test]
fn sliding_no_grace_period_large_input_emit_final() {
    check_sliding(
        || sliding(10, 0, "aggregate"),
        &[
            ("E", "1", 100),
            ("E", "3", 105),
            ("E", "4", 106),
            ("E", "2", 103),
            ("E", "6", 113),
            ("E", "5", 110),
            ("E", "7", 104),
            ("E", "8", 102),
            ("E", "9", 115),
        ],
        &windows(
            "E",
            &[
                (90, "0+1", 100),
                (95, "0+1+3", 105),
                (96, "0+1+3+4+2", 106),
                (101, "0+3+4+2", 106),
                (103, "0+3+4+2+6+5+7", 113),
                (104, "0+3+4+6+5+7", 113),
            ],
        ),
    );
}

/// KStreamSlidingWindowAggregateTest.shouldLogAndMeterWhenSkippingExpiredWindowByGrace
/// (ON_WINDOW_CLOSE): difference 10, grace 90; Kafka reads exactly these two records, in
/// this order (the records at 100 … 105 and 15 count in no open window).
#[test]
fn sliding_should_skip_expired_window_by_grace_emit_final() {
    let inputs = [
        ("k", "100", 200),
        ("k", "0", 100),
        ("k", "1", 101),
        ("k", "2", 102),
        ("k", "3", 103),
        ("k", "4", 104),
        ("k", "5", 105),
        ("k", "6", 15),
        ("k", "101", 300),
        ("k", "102", 400),
    ];
    let kafka = out(&[("k@190/201", "0+100", 200), ("k@290/301", "0+101", 300)]);
    assert_eq!(
        run(sliding(10, 90, "aggregate"), Batching::PerRecord, &inputs),
        kafka
    );
    check_sliding(|| sliding(10, 90, "aggregate"), &inputs, &slid(&kafka));
}

// ---------------------------------------------------------------------------------------
// suppress(untilWindowCloses): SuppressScenarioTest, KTableSuppressProcessorTest
// ---------------------------------------------------------------------------------------

/// `[<key>@<start>/<end>]`, as Kafka's `Windowed.toString` (a sliding window's end is its
/// last millisecond there, its exclusive end here: `inclusive` takes one off).
fn kafka_key(w: &Windowed<String>, inclusive: bool) -> String {
    let end = if inclusive { w.end - 1 } else { w.end };
    format!("[{}@{}/{}]", w.key, w.start, end)
}

/// Sends a windowed count's changelog to `topic`, keyed as Kafka prints it.
fn counts_to(table: &KTable<Windowed<String>, i64>, topic: &str, inclusive: bool) {
    table
        .to_change_stream()
        .map(move |w, v: Option<i64>| (kafka_key(&w, inclusive), v.map(|v| v.to_string())))
        .to(topic, Utf8, Nullable(Utf8));
}

/// Runs `inputs` on `input` and returns what reached `topics`, in order.
fn run_to(
    topology: Topology,
    batching: Batching,
    inputs: &[(&str, &str, i64)],
    topics: &[&str],
) -> Vec<Vec<Out>> {
    let driver = TestDriver::new(topology).with_batching(batching);
    let mut input = driver.input_topic("input", Utf8, Utf8);
    for (k, v, ts) in inputs {
        input
            .pipe_input_with_timestamp(k.to_string(), v.to_string(), *ts)
            .unwrap();
    }
    // A manual batch's repartition records are a batch of their own, flushed next.
    for _ in 0..3 {
        driver.flush().unwrap();
    }
    topics
        .iter()
        .map(|topic| {
            driver
                .output_topic(topic, Utf8, Nullable(Utf8))
                .read_records()
                .unwrap()
                .into_iter()
                .map(|r| (r.key, r.value, r.timestamp.unwrap()))
                .collect()
        })
        .collect()
}

fn counted(records: &[(&str, Option<i64>, i64)]) -> Vec<Out> {
    records
        .iter()
        .map(|(k, v, t)| (k.to_string(), v.map(|v| v.to_string()), *t))
        .collect()
}

/// SuppressScenarioTest's shape: the windowed count of `input` suppressed to
/// `output-suppressed`, and raw to `output-raw`. Kafka suppresses one count and reads it
/// twice; here `suppress` is the aggregation's own emit strategy, so the raw reader counts
/// into a second store (one suppressed count read raw too is refused: see
/// [`suppress_is_refused_where_it_is_not_a_windowed_aggregations_own`]).
fn suppress_scenario(windows: &str) -> Topology {
    let builder = StreamsBuilder::new();
    let grouped = builder
        .stream("input", Utf8, Utf8)
        .group_by(|k: &String, _| k.clone(), Grouped::with(Utf8, Utf8));
    let (suppressed, raw, inclusive) = match windows {
        "time-1" | "time-2" => {
            let grace = if windows == "time-1" { 1 } else { 2 };
            let w = TimeWindows::of_size(ms(2)).grace(ms(grace));
            (
                grouped.windowed_by(w).count("counts-final"),
                grouped.windowed_by(w).count("counts"),
                false,
            )
        }
        "sliding" => {
            let w = SlidingWindows::of_time_difference_and_grace(ms(5), ms(15));
            (
                grouped.windowed_by_sliding(w).count("counts-final"),
                grouped.windowed_by_sliding(w).count("counts"),
                true,
            )
        }
        _ => {
            let w = SessionWindows::with_inactivity_gap(ms(5));
            (
                grouped.windowed_by_session(w).count("counts-final"),
                grouped.windowed_by_session(w).count("counts"),
                false,
            )
        }
    };
    counts_to(
        &suppressed.suppress(Suppressed::until_window_closes()),
        "output-suppressed",
        inclusive,
    );
    counts_to(&raw, "output-raw", inclusive);
    builder.build()
}

/// Checks the suppressed output (and, one record per batch, the raw one when given) in
/// every batching: the same final records each time.
fn check_suppressed(
    windows: &str,
    inputs: &[(&str, &str, i64)],
    raw: Option<&[Out]>,
    suppressed: &[Out],
) {
    let topics = ["output-suppressed", "output-raw"];
    let per_record = run_to(
        suppress_scenario(windows),
        Batching::PerRecord,
        inputs,
        &topics,
    );
    assert_eq!(per_record[0], suppressed);
    if let Some(raw) = raw {
        assert_eq!(per_record[1], raw);
    }
    let mut sorted = suppressed.to_vec();
    sorted.sort();
    for batching in [Batching::Size(2), Batching::Size(3), Batching::Manual] {
        let mut got = run_to(suppress_scenario(windows), batching, inputs, &topics).remove(0);
        got.sort();
        assert_eq!(got, sorted, "{batching:?}");
    }
}

/// SuppressScenarioTest.shouldSupportFinalResultsForTimeWindows: windows of 2 ms, grace 1;
/// the last record (at 0, after 5) is late and dropped from both outputs.
#[test]
fn suppress_should_support_final_results_for_time_windows() {
    check_suppressed(
        "time-1",
        &[
            ("k1", "v1", 0),
            ("k1", "v1", 1),
            ("k1", "v1", 2),
            ("k1", "v1", 1),
            ("k1", "v1", 0),
            ("k1", "v1", 5),
            ("k1", "v1", 0),
        ],
        Some(&counted(&[
            ("[k1@0/2]", Some(1), 0),
            ("[k1@0/2]", Some(2), 1),
            ("[k1@2/4]", Some(1), 2),
            ("[k1@0/2]", Some(3), 1),
            ("[k1@0/2]", Some(4), 1),
            ("[k1@4/6]", Some(1), 5),
        ])),
        &counted(&[("[k1@0/2]", Some(4), 1), ("[k1@2/4]", Some(1), 2)]),
    );
}

/// SuppressScenarioTest.shouldSupportFinalResultsForTimeWindowsWithLargeJump: grace 2.
#[test]
fn suppress_should_support_final_results_for_time_windows_with_large_jump() {
    check_suppressed(
        "time-2",
        &[
            ("k1", "v1", 0),
            ("k1", "v1", 1),
            ("k1", "v1", 2),
            ("k1", "v1", 0),
            ("k1", "v1", 3),
            ("k1", "v1", 0),
            ("k1", "v1", 4),
            ("k1", "v1", 0),
            ("k1", "v1", 30),
        ],
        Some(&counted(&[
            ("[k1@0/2]", Some(1), 0),
            ("[k1@0/2]", Some(2), 1),
            ("[k1@2/4]", Some(1), 2),
            ("[k1@0/2]", Some(3), 1),
            ("[k1@2/4]", Some(2), 3),
            ("[k1@0/2]", Some(4), 1),
            ("[k1@4/6]", Some(1), 4),
            ("[k1@30/32]", Some(1), 30),
        ])),
        &counted(&[
            ("[k1@0/2]", Some(4), 1),
            ("[k1@2/4]", Some(2), 3),
            ("[k1@4/6]", Some(1), 4),
        ]),
    );
}

/// SuppressScenarioTest.shouldSupportFinalResultsForSlidingWindows: difference 5, grace
/// 15 (the raw output is not compared: a sliding-window batch re-emits unchanged windows
/// here, a documented difference of the update mode). Kafka's suppressed records come in
/// its order; ours, one record per batch, in the closing pass's (by window start, all
/// closed by the record at 90): the same records, sorted as Kafka lists them.
#[test]
fn suppress_should_support_final_results_for_sliding_windows() {
    let inputs = [
        ("k1", "v1", 10),
        ("k1", "v1", 11),
        ("k1", "v1", 10),
        ("k1", "v1", 13),
        ("k1", "v1", 10),
        ("k1", "v1", 24),
        ("k1", "v1", 5),
        ("k1", "v1", 7),
        ("k1", "v1", 90),
    ];
    check_suppressed(
        "sliding",
        &inputs,
        None,
        &counted(&[
            ("[k1@5/10]", Some(5), 10),
            ("[k1@6/11]", Some(5), 11),
            ("[k1@8/13]", Some(5), 13),
            ("[k1@11/16]", Some(2), 13),
            ("[k1@12/17]", Some(1), 13),
            ("[k1@19/24]", Some(1), 24),
        ]),
    );
}

/// SuppressScenarioTest.shouldSupportFinalResultsForSessionWindows: gap 5, no grace; the
/// record of k2 at 11 closes `[0, 5]`, the late record at 5 is dropped from both.
#[test]
fn suppress_should_support_final_results_for_session_windows() {
    check_suppressed(
        "session",
        &[
            ("k1", "v1", 0),
            ("k1", "v1", 5),
            ("k1", "v1", 1),
            ("k2", "v1", 11),
            ("k1", "v1", 5),
            ("k1", "v1", 30),
        ],
        Some(&counted(&[
            ("[k1@0/0]", Some(1), 0),
            ("[k1@0/0]", None, 0),
            ("[k1@0/5]", Some(2), 5),
            ("[k1@0/5]", None, 5),
            ("[k1@0/5]", Some(3), 5),
            ("[k2@11/11]", Some(1), 11),
            ("[k1@30/30]", Some(1), 30),
        ])),
        &counted(&[("[k1@0/5]", Some(3), 5), ("[k2@11/11]", Some(1), 11)]),
    );
}

/// A suppressed tumbling count of `input` (windows of `size`, grace `grace`) to `out`.
fn suppressed_count(size: u64, grace: u64) -> Topology {
    let builder = StreamsBuilder::new();
    counts_to(
        &builder
            .stream("input", Utf8, Utf8)
            .group_by_key(Utf8)
            .windowed_by(TimeWindows::of_size(ms(size)).grace(ms(grace)))
            .count("counts")
            .suppress(Suppressed::until_window_closes()),
        "out",
        false,
    );
    builder.build()
}

/// KTableSuppressProcessorTest.finalResultsSuppressionShouldBufferAndEmitAtGraceExpiration,
/// on a windowed count: windows of 1 ms, grace 1; `hey` at 99 (window `[99, 100)`) is not
/// emitted at stream time 100, and is at 101, with its own timestamp.
#[test]
fn suppress_final_results_should_buffer_and_emit_at_grace_expiration() {
    let inputs = [("hey", "v", 99), ("dummyKey1", "v", 100)];
    let none = run_to(
        suppressed_count(1, 1),
        Batching::PerRecord,
        &inputs,
        &["out"],
    );
    assert_eq!(none[0], []);
    let inputs = [inputs[0], inputs[1], ("dummyKey2", "v", 101)];
    let got = run_to(
        suppressed_count(1, 1),
        Batching::PerRecord,
        &inputs,
        &["out"],
    );
    assert_eq!(got[0], counted(&[("[hey@99/100]", Some(1), 99)]));
}

/// KTableSuppressProcessorTest.finalResultsWithZeroGraceShouldStillBufferUntilTheWindowEnd,
/// on a windowed count: windows of 100 ms, no grace; a record at 5 waits for stream time
/// 100, then `[0, 100)` is emitted with its timestamp, 5.
#[test]
fn suppress_final_results_with_zero_grace_buffer_until_the_window_end() {
    let inputs = [("hey", "v", 5), ("dummyKey", "v", 99)];
    let got = run_to(
        suppressed_count(100, 0),
        Batching::PerRecord,
        &inputs,
        &["out"],
    );
    assert_eq!(got[0], []);
    let inputs = [inputs[0], ("dummyKey", "v", 100)];
    let got = run_to(
        suppressed_count(100, 0),
        Batching::PerRecord,
        &inputs,
        &["out"],
    );
    assert_eq!(got[0], counted(&[("[hey@0/100]", Some(1), 5)]));
}

/// KTableSuppressProcessorTest.finalResultsShouldDropTombstonesForSessionWindows: a
/// suppressed session count emits no tombstone for the sessions a record merges away.
#[test]
fn suppress_final_results_drop_tombstones_for_session_windows() {
    let builder = StreamsBuilder::new();
    counts_to(
        &builder
            .stream("input", Utf8, Utf8)
            .group_by_key(Utf8)
            .windowed_by_session(SessionWindows::with_inactivity_gap(ms(5)))
            .count("counts")
            .suppress(Suppressed::until_window_closes()),
        "out",
        false,
    );
    let inputs = [("hey", "v", 0), ("hey", "v", 4), ("other", "v", 100)];
    let got = run_to(builder.build(), Batching::PerRecord, &inputs, &["out"]);
    assert_eq!(got[0], counted(&[("[hey@0/4]", Some(2), 4)]));
}

/// A suppressed windowed reduce gives its final values too.
#[test]
fn suppress_final_results_of_a_windowed_reduce() {
    let builder = StreamsBuilder::new();
    to_out(
        builder
            .stream("input", Utf8, Utf8)
            .group_by_key(Utf8)
            .windowed_by(TimeWindows::of_size(ms(10)))
            .reduce("r", |a, b| format!("{a}+{b}"), Utf8)
            .suppress(Suppressed::until_window_closes()),
    );
    let got = run(
        builder.build(),
        Batching::PerRecord,
        &[("a", "1", 1), ("a", "2", 2), ("a", "3", 12)],
    );
    assert_eq!(got, out(&[("a@0/10", "1+2", 2)]));
}

/// `suppress` anywhere but directly on a windowed aggregation's table, or on one whose
/// updates are read unsuppressed too, is refused by `build()`, naming the suppress node.
#[test]
fn suppress_is_refused_where_it_is_not_a_windowed_aggregations_own() {
    let windowed = |builder: &StreamsBuilder| {
        builder
            .stream("input", Utf8, Utf8)
            .group_by_key(Utf8)
            .windowed_by(TimeWindows::of_size(ms(10)))
            .count("c")
    };
    // A derived table.
    let builder = StreamsBuilder::new();
    counts_to(
        &windowed(&builder)
            .filter(|_, n| *n > 1)
            .suppress(Suppressed::until_window_closes()),
        "out",
        false,
    );
    let refused = builder.try_build().err().unwrap();
    assert!(
        refused.operator.starts_with("KTABLE-SUPPRESS-"),
        "{refused}"
    );
    assert!(
        refused.reason.contains("not a windowed aggregation's own"),
        "{refused}"
    );
    // Read raw before the suppression.
    let builder = StreamsBuilder::new();
    let counts = windowed(&builder);
    counts_to(&counts, "raw", false);
    counts_to(
        &counts.suppress(Suppressed::until_window_closes()),
        "out",
        false,
    );
    let refused = builder.try_build().err().unwrap();
    assert!(refused.reason.contains("also read without it"), "{refused}");
    // Read raw after the suppression.
    let builder = StreamsBuilder::new();
    let counts = windowed(&builder);
    counts_to(
        &counts.suppress(Suppressed::until_window_closes()),
        "out",
        false,
    );
    counts_to(&counts, "raw", false);
    let refused = builder.try_build().err().unwrap();
    assert!(refused.reason.contains("also read without it"), "{refused}");
    // Suppressed once, read once: accepted.
    let builder = StreamsBuilder::new();
    counts_to(
        &windowed(&builder).suppress(Suppressed::until_window_closes()),
        "out",
        false,
    );
    assert!(builder.try_build().is_ok());
}

/// A re-keyed session or sliding aggregation emitting on close stays direct by default, as
/// emit-on-close time windows do (one emission per window, versioned): no repartition
/// topic, though its results go to a topic.
#[test]
fn re_keyed_final_results_stay_direct() {
    for kind in ["session", "sliding"] {
        let builder = StreamsBuilder::new();
        let grouped = builder
            .stream("input", Utf8, Utf8)
            .group_by(|_, v: &String| v.clone(), Grouped::with(Utf8, Utf8));
        let table = if kind == "session" {
            grouped
                .windowed_by_session(SessionWindows::with_inactivity_gap(ms(10)))
                .emit_strategy(EmitStrategy::OnWindowClose)
                .count("c")
        } else {
            grouped
                .windowed_by_sliding(SlidingWindows::of_time_difference_and_grace(ms(10), ms(0)))
                .emit_strategy(EmitStrategy::OnWindowClose)
                .count("c")
        };
        counts_to(&table, "out", false);
        let topology = builder.build();
        assert!(topology.repartition_topics().is_empty(), "{kind}");
    }
}

/// KStreamSlidingWindowAggregateTest.testJoin (ON_WINDOW_CLOSE; difference 10, grace 0),
/// its two tables (the windowed table–table join is not supported here: a windowed table
/// has no per-key lookup, docs/kafka-streams-differences.md): each table's final windows,
/// step by step, each closing on the stream time of its own topic.
#[test]
fn sliding_join_tables_emit_final() {
    let builder = StreamsBuilder::new();
    let windows = SlidingWindows::of_time_difference_and_grace(ms(10), ms(0));
    for (topic, out) in [("topic1", "out1"), ("topic2", "out2")] {
        let table = builder
            .stream(topic, Utf8, Utf8)
            .group_by_key(Utf8)
            .windowed_by_sliding(windows)
            .emit_strategy(EmitStrategy::OnWindowClose)
            .aggregate(&format!("store-{topic}"), || "0".to_owned(), adder, Utf8);
        table
            .to_stream()
            .map(|w, v| (format!("{}@{}/{}", w.key, w.start, w.end - 1), v))
            .to(out, Utf8, Utf8);
    }
    let driver = TestDriver::new(builder.build());
    let (mut t1, mut t2) = (
        driver.input_topic("topic1", Utf8, Utf8),
        driver.input_topic("topic2", Utf8, Utf8),
    );
    let (mut o1, mut o2) = (
        driver.output_topic("out1", Utf8, Utf8),
        driver.output_topic("out2", Utf8, Utf8),
    );
    let read = |o: &mut lambda_streams::driver::TestOutputTopic<String, String>| {
        o.read_records()
            .unwrap()
            .into_iter()
            .map(|r| (r.key, r.value, r.timestamp.unwrap()))
            .collect::<Vec<_>>()
    };
    let rec = |k: &str, v: &str, t: i64| (k.to_owned(), v.to_owned(), t);
    for (k, v, t) in [("A", "1", 10), ("B", "2", 11), ("C", "3", 12)] {
        t1.pipe_input_with_timestamp(k.to_owned(), v.to_owned(), t)
            .unwrap();
    }
    assert_eq!(
        read(&mut o1),
        [rec("A@0/10", "0+1", 10), rec("B@1/11", "0+2", 11)]
    );
    for (k, v, t) in [("A", "1", 15), ("B", "2", 16), ("C", "3", 19)] {
        t1.pipe_input_with_timestamp(k.to_owned(), v.to_owned(), t)
            .unwrap();
    }
    assert_eq!(
        read(&mut o1),
        [
            rec("C@2/12", "0+3", 12),
            rec("A@5/15", "0+1+1", 15),
            rec("B@6/16", "0+2+2", 16)
        ]
    );
    assert_eq!(read(&mut o2), []);
    for (k, v, t) in [("A", "a", 10), ("C", "c", 12)] {
        t2.pipe_input_with_timestamp(k.to_owned(), v.to_owned(), t)
            .unwrap();
    }
    assert_eq!(read(&mut o1), []);
    assert_eq!(read(&mut o2), [rec("A@0/10", "0+a", 10)]);
    for (k, v, t) in [("A", "a", 15), ("B", "b", 16), ("C", "c", 17)] {
        t2.pipe_input_with_timestamp(k.to_owned(), v.to_owned(), t)
            .unwrap();
    }
    assert_eq!(read(&mut o1), []);
    assert_eq!(
        read(&mut o2),
        [
            rec("C@2/12", "0+c", 12),
            rec("A@5/15", "0+a+a", 15),
            rec("B@6/16", "0+b", 16)
        ]
    );
}
