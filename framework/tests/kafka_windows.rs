//! Kafka Streams' own windowed-aggregation tests, ported: the same inputs and the same
//! expected records (key, window, value and timestamp) as the Kafka Streams test each one
//! names (`streams/src/test/java/org/apache/kafka/streams/kstream/internals/<Class>.java`,
//! `<method>`). The expected values are Kafka Streams' facts, copied from those tests; the
//! test code is ours.
//!
//! Each topology runs with one record per batch, as Kafka Streams processes them, where the
//! records out must equal Kafka's one for one; and with larger batches, where lambda-streams
//! emits one update per window per batch: there the last update of each window must equal
//! Kafka's last one. Where lambda-streams differs on purpose, the test asserts our behaviour
//! and says which difference of `docs/kafka-streams-differences.md` ("Windowed
//! aggregations") it is.
//!
//! Kafka's `MockInitializer.STRING_INIT` is `"0"`, `MockAggregator.TOSTRING_ADDER` is
//! `agg + "+" + value`, `MockReducer.STRING_ADDER` is `a + "+" + b`, and the session
//! merger of `SessionWindowedKStreamImplTest` is `a + "+" + b`.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use lambda_streams::driver::{Batching, TestDriver};
use lambda_streams::dsl::{
    EmitStrategy, KTable, SessionWindows, SlidingWindows, TimeWindows, Windowed,
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

/// Kafka's `TOSTRING_ADDER` as an aggregation on strings.
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
    driver.flush().unwrap();
    driver
        .output_topic("out", Utf8, Nullable(Utf8))
        .read_records()
        .unwrap()
        .into_iter()
        .map(|r| (r.key, r.value, r.timestamp.unwrap()))
        .collect()
}

fn out(records: &[(&str, Option<&str>, i64)]) -> Vec<Out> {
    records
        .iter()
        .map(|(k, v, t)| (k.to_string(), v.map(str::to_owned), *t))
        .collect()
}

/// The last record per window.
fn last_per_window(records: &[Out]) -> BTreeMap<String, (Option<String>, i64)> {
    records
        .iter()
        .map(|(k, v, t)| (k.clone(), (v.clone(), *t)))
        .collect()
}

/// Runs the topology one record per batch (must equal `expected`) and in batches of 2, 3
/// and all records (the last update per window must equal `expected`'s).
fn check(build: impl Fn() -> Topology, inputs: &[(&str, &str, i64)], expected: &[Out]) {
    assert_eq!(run(build(), Batching::PerRecord, inputs), expected);
    for size in [2, 3, inputs.len()] {
        let batched = run(build(), Batching::Size(size), inputs);
        assert_eq!(
            last_per_window(&batched),
            last_per_window(expected),
            "batches of {size}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Time windows: TimeWindowedKStreamImplTest (windows of 500 ms, no grace)
// ---------------------------------------------------------------------------------------

/// `TimeWindowedKStreamImplTest.processData`.
const TIME_DATA: &[(&str, &str, i64)] = &[
    ("1", "1", 10),
    ("1", "2", 15),
    ("1", "3", 500),
    ("2", "10", 550),
    ("2", "20", 500),
    ("2", "30", 1000),
];

fn time_windowed(emit: EmitStrategy, kind: &str) -> Topology {
    let builder = StreamsBuilder::new();
    let windowed = builder
        .stream("input", Utf8, Utf8)
        .group_by_key(Utf8)
        .windowed_by(TimeWindows::of_size(ms(500)))
        .emit_strategy(emit);
    match kind {
        "count" => to_out(windowed.count("store")),
        "reduce" => to_out(windowed.reduce("store", |a, b| format!("{a}+{b}"), Utf8)),
        _ => to_out(windowed.aggregate("store", || "0".to_owned(), adder, Utf8)),
    }
    builder.build()
}

/// TimeWindowedKStreamImplTest.shouldCountWindowed (ON_WINDOW_UPDATE).
#[test]
fn time_windowed_should_count_windowed() {
    check(
        || time_windowed(EmitStrategy::OnWindowUpdate, "count"),
        TIME_DATA,
        &out(&[
            ("1@0/500", Some("1"), 10),
            ("1@0/500", Some("2"), 15),
            ("1@500/1000", Some("1"), 500),
            ("2@500/1000", Some("1"), 550),
            // The record at 500 is older than the window's newest (550): the update keeps 550.
            ("2@500/1000", Some("2"), 550),
            ("2@1000/1500", Some("1"), 1000),
        ]),
    );
}

/// TimeWindowedKStreamImplTest.shouldCountWindowed (ON_WINDOW_CLOSE).
#[test]
fn time_windowed_should_count_windowed_emit_final() {
    check(
        || time_windowed(EmitStrategy::OnWindowClose, "count"),
        TIME_DATA,
        &out(&[
            ("1@0/500", Some("2"), 15),
            ("1@500/1000", Some("1"), 500),
            ("2@500/1000", Some("2"), 550),
        ]),
    );
}

/// TimeWindowedKStreamImplTest.shouldReduceWindowed (ON_WINDOW_UPDATE).
#[test]
fn time_windowed_should_reduce_windowed() {
    check(
        || time_windowed(EmitStrategy::OnWindowUpdate, "reduce"),
        TIME_DATA,
        &out(&[
            ("1@0/500", Some("1"), 10),
            ("1@0/500", Some("1+2"), 15),
            ("1@500/1000", Some("3"), 500),
            ("2@500/1000", Some("10"), 550),
            ("2@500/1000", Some("10+20"), 550),
            ("2@1000/1500", Some("30"), 1000),
        ]),
    );
}

/// TimeWindowedKStreamImplTest.shouldReduceWindowed (ON_WINDOW_CLOSE).
#[test]
fn time_windowed_should_reduce_windowed_emit_final() {
    check(
        || time_windowed(EmitStrategy::OnWindowClose, "reduce"),
        TIME_DATA,
        &out(&[
            ("1@0/500", Some("1+2"), 15),
            ("1@500/1000", Some("3"), 500),
            ("2@500/1000", Some("10+20"), 550),
        ]),
    );
}

/// TimeWindowedKStreamImplTest.shouldAggregateWindowed (ON_WINDOW_UPDATE).
#[test]
fn time_windowed_should_aggregate_windowed() {
    check(
        || time_windowed(EmitStrategy::OnWindowUpdate, "aggregate"),
        TIME_DATA,
        &out(&[
            ("1@0/500", Some("0+1"), 10),
            ("1@0/500", Some("0+1+2"), 15),
            ("1@500/1000", Some("0+3"), 500),
            ("2@500/1000", Some("0+10"), 550),
            ("2@500/1000", Some("0+10+20"), 550),
            ("2@1000/1500", Some("0+30"), 1000),
        ]),
    );
}

/// TimeWindowedKStreamImplTest.shouldAggregateWindowed (ON_WINDOW_CLOSE).
#[test]
fn time_windowed_should_aggregate_windowed_emit_final() {
    check(
        || time_windowed(EmitStrategy::OnWindowClose, "aggregate"),
        TIME_DATA,
        &out(&[
            ("1@0/500", Some("0+1+2"), 15),
            ("1@500/1000", Some("0+3"), 500),
            ("2@500/1000", Some("0+10+20"), 550),
        ]),
    );
}

/// KGroupedStreamImplTest.shouldCountWindowed: windows of 500 ms, grace 100.
#[test]
fn grouped_stream_should_count_windowed() {
    let build = || {
        let builder = StreamsBuilder::new();
        to_out(
            builder
                .stream("input", Utf8, Utf8)
                .group_by_key(Utf8)
                .windowed_by(TimeWindows::of_size(ms(500)).grace(ms(100)))
                .count("aggregate-by-key-windowed"),
        );
        builder.build()
    };
    check(
        build,
        &[
            ("1", "A", 0),
            ("1", "A", 499),
            ("1", "A", 100),
            ("2", "B", 0),
            ("2", "B", 100),
            ("2", "B", 200),
            ("3", "C", 1),
            ("1", "A", 500),
            ("1", "A", 500),
            ("2", "B", 500),
            ("2", "B", 500),
            ("3", "B", 100),
        ],
        &out(&[
            ("1@0/500", Some("1"), 0),
            ("1@0/500", Some("2"), 499),
            ("1@0/500", Some("3"), 499),
            ("2@0/500", Some("1"), 0),
            ("2@0/500", Some("2"), 100),
            ("2@0/500", Some("3"), 200),
            ("3@0/500", Some("1"), 1),
            ("1@500/1000", Some("1"), 500),
            ("1@500/1000", Some("2"), 500),
            ("2@500/1000", Some("1"), 500),
            ("2@500/1000", Some("2"), 500),
            ("3@0/500", Some("2"), 100),
        ]),
    );
}

// ---------------------------------------------------------------------------------------
// Time windows: KStreamWindowAggregateTest
// ---------------------------------------------------------------------------------------

fn hopping_10_by_5(grace: u64, emit: EmitStrategy) -> Topology {
    let builder = StreamsBuilder::new();
    to_out(
        builder
            .stream("input", Utf8, Utf8)
            .group_by_key(Utf8)
            .windowed_by(
                TimeWindows::of_size(ms(10))
                    .grace(ms(grace))
                    .advance_by(ms(5)),
            )
            .emit_strategy(emit)
            .aggregate("topic1-Canonized", || "0".to_owned(), adder, Utf8),
    );
    builder.build()
}

/// KStreamWindowAggregateTest.testAggBasic's input.
const AGG_BASIC: &[(&str, &str, i64)] = &[
    ("A", "1", 0),
    ("B", "2", 1),
    ("C", "3", 2),
    ("D", "4", 3),
    ("A", "1", 4),
    ("A", "1", 5),
    ("B", "2", 6),
    ("D", "4", 7),
    ("B", "2", 8),
    ("C", "3", 9),
    ("A", "1", 10),
    ("B", "2", 11),
    ("D", "4", 12),
    ("B", "2", 13),
    ("C", "3", 14),
    ("B", "1", 3),
    ("B", "2", 2),
    ("B", "3", 9),
];

/// KStreamWindowAggregateTest.testAggBasic (ON_WINDOW_UPDATE): hopping windows of 10 ms
/// advancing by 5, grace 100; the late records of B keep the window's newest timestamp (8).
#[test]
fn window_aggregate_test_agg_basic() {
    check(
        || hopping_10_by_5(100, EmitStrategy::OnWindowUpdate),
        AGG_BASIC,
        &out(&[
            ("A@0/10", Some("0+1"), 0),
            ("B@0/10", Some("0+2"), 1),
            ("C@0/10", Some("0+3"), 2),
            ("D@0/10", Some("0+4"), 3),
            ("A@0/10", Some("0+1+1"), 4),
            ("A@0/10", Some("0+1+1+1"), 5),
            ("A@5/15", Some("0+1"), 5),
            ("B@0/10", Some("0+2+2"), 6),
            ("B@5/15", Some("0+2"), 6),
            ("D@0/10", Some("0+4+4"), 7),
            ("D@5/15", Some("0+4"), 7),
            ("B@0/10", Some("0+2+2+2"), 8),
            ("B@5/15", Some("0+2+2"), 8),
            ("C@0/10", Some("0+3+3"), 9),
            ("C@5/15", Some("0+3"), 9),
            ("A@5/15", Some("0+1+1"), 10),
            ("A@10/20", Some("0+1"), 10),
            ("B@5/15", Some("0+2+2+2"), 11),
            ("B@10/20", Some("0+2"), 11),
            ("D@5/15", Some("0+4+4"), 12),
            ("D@10/20", Some("0+4"), 12),
            ("B@5/15", Some("0+2+2+2+2"), 13),
            ("B@10/20", Some("0+2+2"), 13),
            ("C@5/15", Some("0+3+3"), 14),
            ("C@10/20", Some("0+3"), 14),
            ("B@0/10", Some("0+2+2+2+1"), 8),
            ("B@0/10", Some("0+2+2+2+1+2"), 8),
            ("B@0/10", Some("0+2+2+2+1+2+3"), 9),
            ("B@5/15", Some("0+2+2+2+2+3"), 13),
        ]),
    );
}

/// KStreamWindowAggregateTest.testAggBasic (ON_WINDOW_CLOSE): with 100 ms of grace no
/// window closes, nothing is emitted.
#[test]
fn window_aggregate_test_agg_basic_emit_final() {
    for batching in [Batching::PerRecord, Batching::Size(4)] {
        let records = run(
            hopping_10_by_5(100, EmitStrategy::OnWindowClose),
            batching,
            AGG_BASIC,
        );
        assert_eq!(records, Vec::<Out>::new());
    }
}

/// KStreamWindowAggregateTest.testJoin (ON_WINDOW_CLOSE, grace 5), the part before the
/// join: the first topic's final results as windows close, with their newest timestamps.
#[test]
fn window_aggregate_test_join_emit_final_first_table() {
    let build = || hopping_10_by_5(5, EmitStrategy::OnWindowClose);
    let first = [
        ("A", "1", 0),
        ("B", "2", 1),
        ("C", "3", 2),
        ("D", "4", 3),
        ("A", "1", 9),
        ("A", "1", 15),
    ];
    let expected_first = out(&[
        ("A@0/10", Some("0+1+1"), 9),
        ("B@0/10", Some("0+2"), 1),
        ("C@0/10", Some("0+3"), 2),
        ("D@0/10", Some("0+4"), 3),
    ]);
    assert_eq!(run(build(), Batching::PerRecord, &first), expected_first);
    let mut second = first.to_vec();
    second.extend([
        ("A", "1", 10),
        ("B", "2", 11),
        ("D", "4", 12),
        ("B", "2", 13),
        ("C", "3", 14),
        ("A", "1", 20),
    ]);
    let mut expected = expected_first.clone();
    expected.extend(out(&[
        ("A@5/15", Some("0+1+1"), 10),
        ("B@5/15", Some("0+2+2"), 13),
        ("C@5/15", Some("0+3"), 14),
        ("D@5/15", Some("0+4"), 12),
    ]));
    assert_eq!(run(build(), Batching::PerRecord, &second), expected);
    let batched = run(build(), Batching::Size(4), &second);
    assert_eq!(last_per_window(&batched), last_per_window(&expected));
}

/// KStreamWindowAggregateTest.shouldLogAndMeterWhenSkippingExpiredWindowByGrace
/// (ON_WINDOW_UPDATE): tumbling windows of 10 ms, grace 90, `"" + "+" + value`; after the
/// record at 200, the records at 100 … 105 (window `[100, 110)` expired at 110) and at 6
/// are skipped: 7 dropped records, one output.
#[test]
fn window_aggregate_should_skip_expired_window_by_grace() {
    let inputs = [
        ("k", "100", 200),
        ("k", "0", 100),
        ("k", "1", 101),
        ("k", "2", 102),
        ("k", "3", 103),
        ("k", "4", 104),
        ("k", "5", 105),
        ("k", "6", 6),
    ];
    let build = || {
        let builder = StreamsBuilder::new();
        to_out(
            builder
                .stream("input", Utf8, Utf8)
                .group_by_key(Utf8)
                .windowed_by(
                    TimeWindows::of_size(ms(10))
                        .advance_by(ms(10))
                        .grace(ms(90)),
                )
                .aggregate("topic1-Canonicalized", String::new, adder, Utf8),
        );
        builder.build()
    };
    for batching in [Batching::PerRecord, Batching::Size(3), Batching::Manual] {
        let driver = TestDriver::new(build()).with_batching(batching);
        let mut input = driver.input_topic("input", Utf8, Utf8);
        let mut late = 0;
        for (k, v, ts) in inputs {
            input
                .pipe_input_with_timestamp(k.to_owned(), v.to_owned(), ts)
                .unwrap();
            late += driver.last_report().map_or(0, |r| r.late_records);
        }
        let report = driver.flush().unwrap();
        late += report.late_records;
        let records: Vec<Out> = driver
            .output_topic("out", Utf8, Nullable(Utf8))
            .read_records()
            .unwrap()
            .into_iter()
            .map(|r| (r.key, r.value, r.timestamp.unwrap()))
            .collect();
        assert_eq!(
            records,
            out(&[("k@200/210", Some("+100"), 200)]),
            "{batching:?}"
        );
        if batching == Batching::PerRecord {
            assert_eq!(late, 7);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Session windows
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
        .windowed_by_session(SessionWindows::with_inactivity_gap(ms(500)));
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

/// SessionWindowedKStreamImplTest.shouldCountSessionWindowedWithCachingDisabled (and
/// …WithCachingEnabled, whose output Kafka asserts equal), ON_WINDOW_UPDATE.
#[test]
fn session_windowed_should_count() {
    check(
        || session_windowed("count"),
        SESSION_DATA,
        &out(&[
            ("1@10/10", Some("1"), 10),
            ("1@10/10", None, 10),
            ("1@10/15", Some("2"), 15),
            ("1@600/600", Some("1"), 600),
            ("2@600/600", Some("1"), 600),
            ("2@600/600", None, 600),
            ("2@599/600", Some("2"), 600),
        ]),
    );
}

/// SessionWindowedKStreamImplTest.shouldReduceWindowed, ON_WINDOW_UPDATE.
#[test]
fn session_windowed_should_reduce() {
    check(
        || session_windowed("reduce"),
        SESSION_DATA,
        &out(&[
            ("1@10/10", Some("1"), 10),
            ("1@10/10", None, 10),
            ("1@10/15", Some("1+2"), 15),
            ("1@600/600", Some("3"), 600),
            ("2@600/600", Some("1"), 600),
            ("2@600/600", None, 600),
            ("2@599/600", Some("1+2"), 600),
        ]),
    );
}

/// SessionWindowedKStreamImplTest.shouldAggregateSessionWindowed, ON_WINDOW_UPDATE: the
/// merger's order, `merger(merger(init, old), …)` then the adder, gives `0+0+1+2`.
#[test]
fn session_windowed_should_aggregate() {
    check(
        || session_windowed("aggregate"),
        SESSION_DATA,
        &out(&[
            ("1@10/10", Some("0+1"), 10),
            ("1@10/10", None, 10),
            ("1@10/15", Some("0+0+1+2"), 15),
            ("1@600/600", Some("0+3"), 600),
            ("2@600/600", Some("0+1"), 600),
            ("2@600/600", None, 600),
            ("2@599/600", Some("0+0+1+2"), 600),
        ]),
    );
}

/// KStreamSessionWindowAggregateProcessorTest's topology: `GAP_MS` = 5 minutes, no grace,
/// a count kept as a number aggregated by `aggregate + 1` and merged by `a + b`.
const GAP_MS: i64 = 5 * 60 * 1000;

fn session_processor() -> Topology {
    let builder = StreamsBuilder::new();
    to_out(
        builder
            .stream("input", Utf8, Utf8)
            .group_by_key(Utf8)
            .windowed_by_session(SessionWindows::with_inactivity_gap(ms(GAP_MS as u64)))
            .aggregate(
                "store",
                || 0i64,
                |_, _, n: i64| n + 1,
                |_, a: i64, b: i64| a + b,
                lambda_streams::serdes::DecimalI64,
            ),
    );
    builder.build()
}

/// The live sessions after `records`: the last update per window, tombstones left out.
fn live(records: &[Out]) -> BTreeMap<String, (String, i64)> {
    last_per_window(records)
        .into_iter()
        .filter_map(|(k, (v, t))| v.map(|v| (k, (v, t))))
        .collect()
}

/// KStreamSessionWindowAggregateProcessorTest.shouldImmediatelyForwardRemovedSessionsWhenMerging
/// (ON_WINDOW_UPDATE, no cache): the record at 5 merges `[0, 0]`, deleted.
#[test]
fn session_processor_should_forward_removed_sessions_when_merging() {
    check(
        session_processor,
        &[("a", "1", 0), ("a", "1", 5)],
        &out(&[
            ("a@0/0", Some("1"), 0),
            ("a@0/0", None, 0),
            ("a@0/5", Some("2"), 5),
        ]),
    );
}

/// KStreamSessionWindowAggregateProcessorTest.shouldMergeSessions: records at 0 and
/// GAP + 1 are two sessions; in Kafka's test one at GAP / 2 bridges them into one session
/// of 3. A documented difference: Kafka's test builds its session store with a retention
/// of 3 × GAP; the DSL's default, gap + grace (= GAP here), is this crate's only one, and
/// with it `[0, 0]` has expired from the store when the record at GAP / 2 arrives (stream
/// time GAP + 1): it merges with `[GAP + 1, GAP + 1]` only. We assert the live sessions, in
/// every batching.
#[test]
fn session_processor_should_merge_sessions() {
    let inputs = [
        ("mel", "first", 0),
        ("mel", "second", GAP_MS + 1),
        ("mel", "third", GAP_MS / 2),
    ];
    for batching in [Batching::PerRecord, Batching::Size(2), Batching::Manual] {
        let records = run(session_processor(), batching, &inputs);
        assert_eq!(
            live(&records),
            BTreeMap::from([
                ("mel@0/0".to_owned(), ("1".to_owned(), 0)),
                (
                    format!("mel@{}/{}", GAP_MS / 2, GAP_MS + 1),
                    ("2".to_owned(), GAP_MS + 1)
                ),
            ]),
            "{batching:?}"
        );
    }
}

/// KStreamSessionWindowAggregateProcessorTest.shouldHandleMultipleSessionsAndMerging
/// (ON_WINDOW_UPDATE, with Kafka's cache, flushed at the end): one batch of all records is
/// the cache's analogue, one update per window. A documented difference: a session created
/// and merged away within one batch is deleted with a tombstone here, where Kafka's cache
/// drops both; the live sessions are Kafka's.
#[test]
fn session_processor_should_handle_multiple_sessions_and_merging() {
    let inputs = [
        ("a", "1", 0),
        ("b", "1", 0),
        ("c", "1", 0),
        ("d", "1", 0),
        ("d", "2", GAP_MS / 2),
        ("a", "2", GAP_MS + 1),
        ("b", "2", GAP_MS + 1),
        ("a", "3", GAP_MS + 1 + GAP_MS / 2),
        ("c", "3", GAP_MS + 1 + GAP_MS / 2),
    ];
    let kafka: BTreeMap<String, (String, i64)> = [
        ("a@0/0".to_owned(), ("1", 0)),
        ("b@0/0".to_owned(), ("1", 0)),
        ("c@0/0".to_owned(), ("1", 0)),
        (format!("d@0/{}", GAP_MS / 2), ("2", GAP_MS / 2)),
        (format!("b@{0}/{0}", GAP_MS + 1), ("1", GAP_MS + 1)),
        (
            format!("a@{}/{}", GAP_MS + 1, GAP_MS + 1 + GAP_MS / 2),
            ("2", GAP_MS + 1 + GAP_MS / 2),
        ),
        (
            format!("c@{0}/{0}", GAP_MS + 1 + GAP_MS / 2),
            ("1", GAP_MS + 1 + GAP_MS / 2),
        ),
    ]
    .into_iter()
    .map(|(k, (v, t))| (k, (v.to_owned(), t)))
    .collect();
    for batching in [Batching::Manual, Batching::PerRecord, Batching::Size(4)] {
        let records = run(session_processor(), batching, &inputs);
        assert_eq!(live(&records), kafka, "{batching:?}");
    }
    let one_batch = run(session_processor(), Batching::Manual, &inputs);
    let tombstones: BTreeSet<String> = one_batch
        .iter()
        .filter(|r| r.1.is_none())
        .map(|r| r.0.clone())
        .collect();
    assert_eq!(
        tombstones,
        BTreeSet::from(["d@0/0".to_owned(), format!("a@{0}/{0}", GAP_MS + 1)])
    );
}

/// KGroupedStreamImplTest's session input (`doCountSessionWindows`,
/// `doAggregateSessionWindows`, `doReduceSessionWindows`): gap 30, no grace.
fn grouped_sessions(kind: &str) -> Topology {
    let builder = StreamsBuilder::new();
    let windowed = builder
        .stream("input", Utf8, Utf8)
        .group_by_key(Utf8)
        .windowed_by_session(SessionWindows::with_inactivity_gap(ms(30)));
    match kind {
        "count" => to_out(windowed.count("session-store")),
        "reduce" => to_out(windowed.reduce("session-store", |a, b| format!("{a}:{b}"), Utf8)),
        _ => to_out(windowed.aggregate(
            "session-store",
            || 0i64,
            |_, _, n: i64| n + 1,
            |_, a: i64, b: i64| a + b,
            lambda_streams::serdes::DecimalI64,
        )),
    }
    builder.build()
}

fn check_grouped_sessions(kind: &str, values: [&str; 6], expected: [(&str, &str, i64); 3]) {
    let times = [
        ("1", 10),
        ("2", 15),
        ("1", 30),
        ("1", 70),
        ("1", 100),
        ("1", 90),
    ];
    let inputs: Vec<(&str, &str, i64)> = times
        .iter()
        .zip(values)
        .map(|((k, t), v)| (*k, v, *t))
        .collect();
    for batching in [Batching::PerRecord, Batching::Size(2), Batching::Manual] {
        let got = live(&run(grouped_sessions(kind), batching, &inputs));
        for (window, value, ts) in expected {
            assert_eq!(
                got.get(window),
                Some(&(value.to_owned(), ts)),
                "{kind} {window} {batching:?}"
            );
        }
    }
}

/// KGroupedStreamImplTest.shouldCountSessionWindows.
#[test]
fn grouped_stream_should_count_session_windows() {
    check_grouped_sessions(
        "count",
        ["1"; 6],
        [
            ("1@10/30", "2", 30),
            ("2@15/15", "1", 15),
            ("1@70/100", "3", 100),
        ],
    );
}

/// KGroupedStreamImplTest.shouldAggregateSessionWindows.
#[test]
fn grouped_stream_should_aggregate_session_windows() {
    check_grouped_sessions(
        "aggregate",
        ["1"; 6],
        [
            ("1@10/30", "2", 30),
            ("2@15/15", "1", 15),
            ("1@70/100", "3", 100),
        ],
    );
}

/// KGroupedStreamImplTest.shouldReduceSessionWindows: `A:B`, and `A:B:C` for the session
/// that the record at 90 (value C) joins after 70 (A) and 100 (B).
#[test]
fn grouped_stream_should_reduce_session_windows() {
    check_grouped_sessions(
        "reduce",
        ["A", "Z", "B", "A", "B", "C"],
        [
            ("1@10/30", "A:B", 30),
            ("2@15/15", "Z", 15),
            ("1@70/100", "A:B:C", 100),
        ],
    );
}

// ---------------------------------------------------------------------------------------
// Sliding windows
// ---------------------------------------------------------------------------------------

fn sliding(difference: u64, grace: u64, kind: &str) -> Topology {
    let builder = StreamsBuilder::new();
    let windowed = builder
        .stream("input", Utf8, Utf8)
        .group_by_key(Utf8)
        .windowed_by_sliding(SlidingWindows::of_time_difference_and_grace(
            ms(difference),
            ms(grace),
        ));
    match kind {
        "count" => to_out(windowed.count("store")),
        "reduce" => to_out(windowed.reduce("store", |a, b| format!("{a}+{b}"), Utf8)),
        _ => to_out(windowed.aggregate("store", || "0".to_owned(), adder, Utf8)),
    }
    builder.build()
}

/// Kafka's `gatherOutput`: per window start, the set of (value, timestamp) emitted.
type Gathered = BTreeMap<i64, BTreeSet<(String, i64)>>;

fn gather(records: &[Out]) -> Gathered {
    let mut out = Gathered::new();
    for (key, value, ts) in records {
        let start: i64 = key
            .split('@')
            .nth(1)
            .unwrap()
            .split('/')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        out.entry(start)
            .or_default()
            .insert((value.clone().unwrap(), *ts));
    }
    out
}

fn gathered(entries: &[(i64, &[(&str, i64)])]) -> Gathered {
    entries
        .iter()
        .map(|(start, values)| {
            (
                *start,
                values.iter().map(|(v, t)| (v.to_string(), *t)).collect(),
            )
        })
        .collect()
}

/// The sliding-window check: one record per batch gathers to `expected` (plus `extra`,
/// windows lambda-streams emits and Kafka Streams does not, see the caller); with larger
/// batches, every window's last update is one of Kafka's values for it, the one with the
/// most records (the longest; for these string aggregates, the window's final value).
fn check_sliding(
    build: impl Fn() -> Topology,
    inputs: &[(&str, &str, i64)],
    expected: &Gathered,
    extra: &Gathered,
) {
    let mut all = expected.clone();
    for (start, values) in extra {
        all.entry(*start)
            .or_default()
            .extend(values.iter().cloned());
    }
    assert_eq!(gather(&run(build(), Batching::PerRecord, inputs)), all);
    let last: BTreeMap<i64, (String, i64)> = all
        .iter()
        .map(|(start, values)| {
            let longest = values.iter().max_by_key(|(v, _)| v.len()).unwrap();
            (*start, longest.clone())
        })
        .collect();
    for size in [2, 3, inputs.len()] {
        let batched = run(build(), Batching::Size(size), inputs);
        let got: BTreeMap<i64, (String, i64)> = batched
            .iter()
            .map(|(key, value, ts)| {
                let start: i64 = key
                    .split('@')
                    .nth(1)
                    .unwrap()
                    .split('/')
                    .next()
                    .unwrap()
                    .parse()
                    .unwrap();
                (start, (value.clone().unwrap(), *ts))
            })
            .collect();
        assert_eq!(got, last, "batches of {size}");
    }
}

/// KStreamSlidingWindowAggregateTest.testAggregateSmallInput (ON_WINDOW_UPDATE).
#[test]
fn sliding_aggregate_small_input() {
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
        &gathered(&[
            (0, &[("0+1", 10), ("0+1+2", 10)]),
            (4, &[("0+1+2+3", 14)]),
            (5, &[("0+1+2+3+4", 15)]),
            (10, &[("0+1+2+3+4+5", 20)]),
            (11, &[("0+3", 14), ("0+3+4", 15), ("0+3+4+5", 20)]),
            (12, &[("0+3+4+5+6", 22)]),
            (15, &[("0+4", 15), ("0+4+5", 20), ("0+4+5+6", 22)]),
            (16, &[("0+5", 20), ("0+5+6", 22)]),
            (20, &[("0+5+6+7", 30)]),
            (21, &[("0+6", 22), ("0+6+7", 30)]),
            (23, &[("0+7", 30)]),
        ]),
        &Gathered::new(),
    );
}

/// KStreamSlidingWindowAggregateTest.testReduceSmallInput (ON_WINDOW_UPDATE).
#[test]
fn sliding_reduce_small_input() {
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
        &gathered(&[
            (0, &[("1", 10)]),
            (4, &[("1+2", 14)]),
            (5, &[("1+2+3", 15)]),
            (11, &[("2", 14), ("2+3", 15)]),
            (12, &[("2+3+4", 22)]),
            (15, &[("3", 15), ("3+4", 22)]),
            (16, &[("4", 22), ("4+5", 26)]),
            (20, &[("4+5+6", 30)]),
            (23, &[("5", 26), ("5+6", 30)]),
            (27, &[("6", 30)]),
        ]),
        &Gathered::new(),
    );
}

/// KStreamSlidingWindowAggregateTest.testEarlyRecordsSmallInput (ON_WINDOW_UPDATE): records
/// before the difference share `[0, 50]`; out-of-order records are added in arrival order.
#[test]
fn sliding_early_records_small_input() {
    check_sliding(
        || sliding(50, 0, "aggregate"),
        &[
            ("A", "1", 0),
            ("A", "2", 5),
            ("A", "3", 6),
            ("A", "4", 3),
            ("A", "5", 13),
            ("A", "6", 10),
            ("A", "7", 70),
        ],
        &gathered(&[
            (
                0,
                &[
                    ("0+1", 0),
                    ("0+1+2", 5),
                    ("0+1+2+3", 6),
                    ("0+1+2+3+4", 6),
                    ("0+1+2+3+4+5", 13),
                    ("0+1+2+3+4+5+6", 13),
                ],
            ),
            (
                1,
                &[
                    ("0+2", 5),
                    ("0+2+3", 6),
                    ("0+2+3+4", 6),
                    ("0+2+3+4+5", 13),
                    ("0+2+3+4+5+6", 13),
                ],
            ),
            (4, &[("0+2+3", 6), ("0+2+3+5", 13), ("0+2+3+5+6", 13)]),
            (6, &[("0+3", 6), ("0+3+5", 13), ("0+3+5+6", 13)]),
            (7, &[("0+5", 13), ("0+5+6", 13)]),
            (11, &[("0+5", 13)]),
            (20, &[("0+7", 70)]),
        ]),
        &Gathered::new(),
    );
}

/// KStreamSlidingWindowAggregateTest.testEarlyRecordsRepeatedInput (ON_WINDOW_UPDATE).
#[test]
fn sliding_early_records_repeated_input() {
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
        &gathered(&[
            (
                0,
                &[
                    ("0+1", 0),
                    ("0+1+2", 2),
                    ("0+1+2+3", 4),
                    ("0+1+2+3+4", 4),
                    ("0+1+2+3+4+5", 4),
                    ("0+1+2+3+4+5+6", 4),
                    ("0+1+2+3+4+5+6+7", 4),
                ],
            ),
            (
                1,
                &[("0+2", 2), ("0+2+3", 4), ("0+2+3+5", 4), ("0+2+3+5+6", 4)],
            ),
            (2, &[("0+2+3+5+6+8", 7)]),
            (3, &[("0+3", 4), ("0+3+8", 7)]),
            (5, &[("0+8", 7)]),
        ]),
        &Gathered::new(),
    );
}

/// KStreamSlidingWindowAggregateTest.testEarlyNoGracePeriodSmallInput (ON_WINDOW_UPDATE).
#[test]
fn sliding_early_no_grace_period_small_input() {
    check_sliding(
        || sliding(50, 0, "aggregate"),
        &[
            ("A", "1", 0),
            ("A", "2", 5),
            ("A", "3", 6),
            ("A", "4", 3),
            ("A", "5", 13),
            ("A", "6", 10),
            ("A", "6", 70),
        ],
        &gathered(&[
            (
                0,
                &[
                    ("0+1", 0),
                    ("0+1+2", 5),
                    ("0+1+2+3", 6),
                    ("0+1+2+3+4", 6),
                    ("0+1+2+3+4+5", 13),
                    ("0+1+2+3+4+5+6", 13),
                ],
            ),
            (
                1,
                &[
                    ("0+2", 5),
                    ("0+2+3", 6),
                    ("0+2+3+4", 6),
                    ("0+2+3+4+5", 13),
                    ("0+2+3+4+5+6", 13),
                ],
            ),
            (4, &[("0+2+3", 6), ("0+2+3+5", 13), ("0+2+3+5+6", 13)]),
            (6, &[("0+3", 6), ("0+3+5", 13), ("0+3+5+6", 13)]),
            (7, &[("0+5", 13), ("0+5+6", 13)]),
            (11, &[("0+5", 13)]),
            (20, &[("0+6", 70)]),
        ]),
        &Gathered::new(),
    );
}

/// KStreamSlidingWindowAggregateTest.testNoGracePeriodSmallInput (ON_WINDOW_UPDATE): the
/// record at 103 arrives at stream time 106, when its left window `[53, 103]` and the
/// window `[55, 105]` have closed, and the one at 110 at 113, when its left window
/// `[60, 110]` has: as Kafka Streams, neither created nor updated (Kafka's records, no
/// extra values).
#[test]
fn sliding_no_grace_period_small_input() {
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
        &gathered(&[
            (50, &[("0+1", 100)]),
            (55, &[("0+1+2", 105)]),
            (56, &[("0+1+2+3", 106), ("0+1+2+3+4", 106)]),
            (63, &[("0+1+2+3+4+5", 113), ("0+1+2+3+4+5+6", 113)]),
            (
                101,
                &[
                    ("0+2", 105),
                    ("0+2+3", 106),
                    ("0+2+3+4", 106),
                    ("0+2+3+4+5", 113),
                    ("0+2+3+4+5+6", 113),
                ],
            ),
            (104, &[("0+2+3", 106), ("0+2+3+5", 113), ("0+2+3+5+6", 113)]),
            (106, &[("0+3", 106), ("0+3+5", 113), ("0+3+5+6", 113)]),
            (107, &[("0+5", 113), ("0+5+6", 113)]),
            (111, &[("0+5", 113)]),
        ]),
        &Gathered::new(),
    );
}

/// SlidingWindowedKStreamImplTest's input (`processData`): difference 100, grace 1000.
const SLIDING_DATA: &[(&str, &str, i64)] = &[
    ("1", "1", 100),
    ("1", "2", 150),
    ("1", "3", 500),
    ("2", "10", 200),
    ("2", "20", 150),
];

/// Kafka's `lastValueAndTimestampPerKey` for the windows it asserts (`TimeWindow(s, e)` is
/// our `s/e+1`), in every batching.
fn check_sliding_last(kind: &str, expected: &[(&str, &str, i64)]) {
    for batching in [Batching::PerRecord, Batching::Size(2), Batching::Manual] {
        let got = live(&run(sliding(100, 1000, kind), batching, SLIDING_DATA));
        for (window, value, ts) in expected {
            assert_eq!(
                got.get(*window),
                Some(&(value.to_string(), *ts)),
                "{kind} {window} {batching:?}"
            );
        }
    }
}

/// SlidingWindowedKStreamImplTest.shouldCountSlidingWindows.
#[test]
fn sliding_windowed_should_count() {
    check_sliding_last(
        "count",
        &[
            ("1@0/101", "1", 100),
            ("1@101/202", "1", 150),
            ("1@50/151", "2", 150),
            ("1@400/501", "1", 500),
            ("2@100/201", "2", 200),
            ("2@50/151", "1", 150),
            ("2@151/252", "1", 200),
        ],
    );
}

/// SlidingWindowedKStreamImplTest.shouldReduceSlidingWindows: `10+20` in arrival order
/// (the record at 150 arrives after the one at 200).
#[test]
fn sliding_windowed_should_reduce() {
    check_sliding_last(
        "reduce",
        &[
            ("1@0/101", "1", 100),
            ("1@101/202", "2", 150),
            ("1@50/151", "1+2", 150),
            ("1@400/501", "3", 500),
            ("2@100/201", "10+20", 200),
            ("2@50/151", "20", 150),
            ("2@151/252", "10", 200),
        ],
    );
}

/// SlidingWindowedKStreamImplTest.shouldAggregateSlidingWindows.
#[test]
fn sliding_windowed_should_aggregate() {
    check_sliding_last(
        "aggregate",
        &[
            ("1@0/101", "0+1", 100),
            ("1@101/202", "0+2", 150),
            ("1@50/151", "0+1+2", 150),
            ("1@400/501", "0+3", 500),
            ("2@100/201", "0+10+20", 200),
            ("2@50/151", "0+20", 150),
            ("2@151/252", "0+10", 200),
        ],
    );
}

/// KGroupedStreamImplTest.shouldCountSlidingWindows: difference 500, grace 2000. Kafka
/// sorts its records by key and window start (stably); per window, the values in the order
/// Kafka emits them equal ours once each re-emission of an unchanged window is left out (a
/// documented difference: a batch emits every buffered window of a key it touched).
#[test]
fn grouped_stream_should_count_sliding_windows() {
    let inputs = [
        ("1", "A", 500),
        ("1", "A", 999),
        ("1", "A", 600),
        ("2", "B", 500),
        ("2", "B", 600),
        ("2", "B", 700),
        ("3", "C", 501),
        ("1", "A", 1000),
        ("1", "A", 1000),
        ("2", "B", 1000),
        ("2", "B", 1000),
        ("3", "C", 600),
    ];
    let kafka = out(&[
        ("1@0/501", Some("1"), 500),
        ("1@100/601", Some("2"), 600),
        ("1@499/1000", Some("2"), 999),
        ("1@499/1000", Some("3"), 999),
        ("1@500/1001", Some("4"), 1000),
        ("1@500/1001", Some("5"), 1000),
        ("1@501/1002", Some("1"), 999),
        ("1@501/1002", Some("2"), 999),
        ("1@501/1002", Some("3"), 1000),
        ("1@501/1002", Some("4"), 1000),
        ("1@601/1102", Some("1"), 999),
        ("1@601/1102", Some("2"), 1000),
        ("1@601/1102", Some("3"), 1000),
        ("1@1000/1501", Some("1"), 1000),
        ("1@1000/1501", Some("2"), 1000),
        ("2@0/501", Some("1"), 500),
        ("2@100/601", Some("2"), 600),
        ("2@200/701", Some("3"), 700),
        ("2@500/1001", Some("4"), 1000),
        ("2@500/1001", Some("5"), 1000),
        ("2@501/1002", Some("1"), 600),
        ("2@501/1002", Some("2"), 700),
        ("2@501/1002", Some("3"), 1000),
        ("2@501/1002", Some("4"), 1000),
        ("2@601/1102", Some("1"), 700),
        ("2@601/1102", Some("2"), 1000),
        ("2@601/1102", Some("3"), 1000),
        ("2@701/1202", Some("1"), 1000),
        ("2@701/1202", Some("2"), 1000),
        ("3@1/502", Some("1"), 501),
        ("3@100/601", Some("2"), 600),
        ("3@502/1003", Some("1"), 600),
    ]);
    let sequences = |records: &[Out]| {
        let mut per_window: BTreeMap<String, Vec<(Option<String>, i64)>> = BTreeMap::new();
        for (k, v, t) in records {
            let seen = per_window.entry(k.clone()).or_default();
            if seen.last() != Some(&(v.clone(), *t)) {
                seen.push((v.clone(), *t));
            }
        }
        per_window
    };
    let got = run(sliding(500, 2000, "count"), Batching::PerRecord, &inputs);
    assert_eq!(sequences(&got), sequences(&kafka));
    for size in [2, 5, inputs.len()] {
        let batched = run(sliding(500, 2000, "count"), Batching::Size(size), &inputs);
        assert_eq!(
            last_per_window(&batched),
            last_per_window(&kafka),
            "batches of {size}"
        );
    }
}

/// Runs `inputs` one record per batch through session windows of gap 10 and `grace`
/// counting, and returns the late records the batches reported and the keys of the sessions
/// produced.
fn late_sessions(grace: u64, inputs: &[(&str, i64)]) -> (u64, BTreeSet<String>) {
    let builder = StreamsBuilder::new();
    to_out(
        builder
            .stream("input", Utf8, Utf8)
            .group_by_key(Utf8)
            .windowed_by_session(SessionWindows::with_inactivity_gap(ms(10)).grace(ms(grace)))
            .count("store"),
    );
    let driver = TestDriver::new(builder.build());
    let mut input = driver.input_topic("input", Utf8, Utf8);
    let mut late = 0;
    for (key, ts) in inputs {
        input
            .pipe_input_with_timestamp(key.to_string(), "1".to_owned(), *ts)
            .unwrap();
        late += driver.last_report().unwrap().late_records;
    }
    let keys = driver
        .output_topic("out", Utf8, Nullable(Utf8))
        .read_records()
        .unwrap()
        .into_iter()
        .map(|r| r.key.split('@').next().unwrap().to_owned())
        .collect();
    (late, keys)
}

/// KStreamSessionWindowAggregateProcessorTest.shouldLogAndMeterWhenSkippingLateRecordWithZeroGrace:
/// gap 10, no grace; at stream time 11, a record at 0 (its session `[0, 0]` expired at 1) is
/// dropped: one dropped record.
#[test]
fn session_processor_should_skip_late_record_with_zero_grace() {
    let (late, keys) = late_sessions(
        0,
        &[("dummy", 0), ("OnTime1", 0), ("dummy", 11), ("Late1", 0)],
    );
    assert_eq!(late, 1);
    assert!(keys.contains("OnTime1") && !keys.contains("Late1"));
}

/// KStreamSessionWindowAggregateProcessorTest.shouldLogAndMeterWhenSkippingLateRecordWithNonzeroGrace:
/// gap 10, grace 1; a record at 0 is on time at stream time 11 and late at 12.
#[test]
fn session_processor_should_skip_late_record_with_nonzero_grace() {
    let (late, keys) = late_sessions(
        1,
        &[
            ("dummy", 0),
            ("OnTime1", 0),
            ("dummy", 11),
            ("OnTime2", 0),
            ("dummy", 12),
            ("Late1", 0),
        ],
    );
    assert_eq!(late, 1);
    assert!(keys.contains("OnTime1") && keys.contains("OnTime2") && !keys.contains("Late1"));
}

/// KStreamSlidingWindowAggregateTest.shouldLogAndMeterWhenSkippingExpiredWindowByGrace
/// (ON_WINDOW_UPDATE): difference 10, grace 90. Kafka's three records are ours: at stream
/// time 200 (close time 110) the records at 100 … 105 are not late (`t + 1 + 10 > 110`: a
/// window of theirs could still be open), but their left windows have closed, so they
/// count in no window, and no later window holds them (as Kafka Streams, which skips 7
/// windows, with the record at 15). Only the record at 15 is late (dropped before any
/// window). Our re-emissions of an unchanged window (the documented difference) aside.
#[test]
fn sliding_should_skip_expired_window_by_grace() {
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
    let kafka = out(&[
        ("k@190/201", Some("0+100"), 200),
        ("k@290/301", Some("0+101"), 300),
        ("k@390/401", Some("0+102"), 400),
    ]);
    let driver = TestDriver::new(sliding(10, 90, "aggregate"));
    let mut input = driver.input_topic("input", Utf8, Utf8);
    let mut late = 0;
    for (k, v, ts) in inputs {
        input
            .pipe_input_with_timestamp(k.to_owned(), v.to_owned(), ts)
            .unwrap();
        late += driver.last_report().unwrap().late_records;
    }
    let ours: Vec<Out> = driver
        .output_topic("out", Utf8, Nullable(Utf8))
        .read_records()
        .unwrap()
        .into_iter()
        .map(|r| (r.key, r.value, r.timestamp.unwrap()))
        .collect();
    let mut distinct: Vec<Out> = Vec::new();
    for record in ours {
        if !distinct.contains(&record) {
            distinct.push(record);
        }
    }
    assert_eq!(distinct, kafka);
    assert_eq!(late, 1);
}

// ---------------------------------------------------------------------------------------
// Null values (Kafka 4's processors, read from their code: no Kafka test pipes one)
// ---------------------------------------------------------------------------------------

/// `a` at 10, a null value at 20, `a` at 30, counted in tumbling windows of 100 ms, in
/// sessions of gap 100 ms and in sliding windows of difference 100 ms; the last count per
/// live window, and the batches' `dropped_null_values`, one record per batch and as one batch.
fn null_value_counts(
    kind: &str,
    batching: Batching,
) -> (BTreeMap<String, (Option<String>, i64)>, u64) {
    let builder = StreamsBuilder::new();
    let grouped = builder
        .stream("input", Utf8, Nullable(Utf8))
        .group_by_key(Utf8);
    match kind {
        "time" => to_out(
            grouped
                .windowed_by(TimeWindows::of_size(ms(100)))
                .count("store"),
        ),
        "session" => to_out(
            grouped
                .windowed_by_session(SessionWindows::with_inactivity_gap(ms(100)))
                .count("store"),
        ),
        _ => to_out(
            grouped
                .windowed_by_sliding(SlidingWindows::of_time_difference_and_grace(
                    ms(100),
                    ms(1000),
                ))
                .count("store"),
        ),
    }
    let driver = TestDriver::new(builder.build()).with_batching(batching);
    let mut input = driver.input_topic("input", Utf8, Nullable(Utf8));
    let mut dropped = 0;
    for (v, ts) in [(Some("x"), 10), (None, 20), (Some("y"), 30)] {
        input
            .pipe_input_with_timestamp("a".to_owned(), v.map(str::to_owned), ts)
            .unwrap();
        if let Some(report) = driver.last_report() {
            dropped += report.dropped_null_values;
        }
    }
    driver.flush().unwrap();
    if batching != Batching::PerRecord {
        dropped = driver.last_report().unwrap().dropped_null_values;
    }
    let records: Vec<Out> = driver
        .output_topic("out", Utf8, Nullable(Utf8))
        .read_records()
        .unwrap()
        .into_iter()
        .map(|r| (r.key, r.value, r.timestamp.unwrap()))
        .collect();
    // The live windows: a session merged away ends with its tombstone.
    let mut last = last_per_window(&records);
    last.retain(|_, (v, _)| v.is_some());
    (last, dropped)
}

/// Kafka 4's `KStreamWindowAggregate` and `KStreamSessionWindowAggregate` skip only a null
/// key: a null value is aggregated (`count` counts it). Its `KStreamSlidingWindowAggregate`
/// skips a null key or value ("Skipping record due to null key or value"), counted as a
/// dropped record: windows [0,100] (2 records) and [11,111] (the record at 30) only (ends
/// inclusive in Kafka, exclusive here: `0/101`, `11/112`).
#[test]
fn null_values_in_windowed_aggregations_as_kafka_4() {
    for batching in [Batching::PerRecord, Batching::Manual] {
        let expected = |rows: &[(&str, &str, i64)]| -> BTreeMap<String, (Option<String>, i64)> {
            rows.iter()
                .map(|(w, v, t)| (w.to_string(), (Some(v.to_string()), *t)))
                .collect()
        };
        assert_eq!(
            null_value_counts("time", batching),
            (expected(&[("a@0/100", "3", 30)]), 0)
        );
        assert_eq!(
            null_value_counts("session", batching),
            (expected(&[("a@10/30", "3", 30)]), 0)
        );
        assert_eq!(
            null_value_counts("sliding", batching),
            (expected(&[("a@0/101", "2", 30), ("a@11/112", "1", 30)]), 1),
            "{batching:?}"
        );
    }
}

/// KStreamSlidingWindowAggregateTest.testAggregateRandomInput (ON_WINDOW_UPDATE):
/// difference 10, grace 100; Kafka's 21 records of key `A` shuffled (here 20 fixed
/// shuffles), then `V` at 181; the aggregator sorts the concatenated letters, so the last
/// value per window does not depend on the order. Kafka asserts the last value and
/// timestamp per window start: so here, one record per batch and in batches of 2, 3 and
/// all records. (Its ON_WINDOW_CLOSE variant expects only the windows from 52 on, which
/// its window store's retention keeps; not ported.)
#[test]
fn sliding_aggregate_random_input() {
    let letters: [(&str, i64); 21] = [
        ("A", 10),
        ("B", 15),
        ("C", 16),
        ("D", 18),
        ("E", 30),
        ("F", 40),
        ("G", 55),
        ("H", 56),
        ("I", 58),
        ("J", 58),
        ("K", 62),
        ("L", 63),
        ("M", 63),
        ("N", 63),
        ("O", 76),
        ("P", 77),
        ("Q", 80),
        ("R", 2),
        ("S", 3),
        ("T", 5),
        ("U", 8),
    ];
    let expected: BTreeMap<String, (Option<String>, i64)> = [
        (0, "ARSTU", 10),
        (3, "ASTU", 10),
        (4, "ATU", 10),
        (5, "ABTU", 15),
        (6, "ABCU", 16),
        (8, "ABCDU", 18),
        (9, "ABCD", 18),
        (11, "BCD", 18),
        (16, "CD", 18),
        (17, "D", 18),
        (20, "E", 30),
        (30, "EF", 40),
        (31, "F", 40),
        (45, "G", 55),
        (46, "GH", 56),
        (48, "GHIJ", 58),
        (52, "GHIJK", 62),
        (53, "GHIJKLMN", 63),
        (56, "HIJKLMN", 63),
        (57, "IJKLMN", 63),
        (59, "KLMN", 63),
        (63, "LMN", 63),
        (66, "O", 76),
        (67, "OP", 77),
        (70, "OPQ", 80),
        (77, "PQ", 80),
        (78, "Q", 80),
        (171, "V", 181),
    ]
    .into_iter()
    .map(|(start, v, ts)| {
        (
            format!("A@{start}/{}", start + 11),
            (Some(v.to_owned()), ts),
        )
    })
    .collect();
    let topology = || {
        let builder = StreamsBuilder::new();
        to_out(
            builder
                .stream("input", Utf8, Utf8)
                .group_by_key(Utf8)
                .windowed_by_sliding(SlidingWindows::of_time_difference_and_grace(
                    ms(10),
                    ms(100),
                ))
                .aggregate(
                    "store",
                    String::new,
                    |_, v: String, agg: String| {
                        let mut letters: Vec<char> = (agg + &v).chars().collect();
                        letters.sort_unstable();
                        letters.into_iter().collect()
                    },
                    Utf8,
                ),
        );
        builder.build()
    };
    // A fixed linear congruential generator for the shuffles (Fisher–Yates).
    let mut seed: u64 = 0x5eed;
    let mut next = move |bound: usize| {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        usize::try_from(seed >> 33).unwrap() % bound
    };
    for shuffle in 0..20 {
        let mut input = letters.to_vec();
        for i in (1..input.len()).rev() {
            input.swap(i, next(i + 1));
        }
        let mut records: Vec<(&str, &str, i64)> =
            input.iter().map(|(v, ts)| ("A", *v, *ts)).collect();
        records.push(("A", "V", 181));
        for batching in [
            Batching::PerRecord,
            Batching::Size(2),
            Batching::Size(3),
            Batching::Manual,
        ] {
            let got = last_per_window(&run(topology(), batching, &records));
            assert_eq!(
                got, expected,
                "shuffle {shuffle}, {batching:?}: {records:?}"
            );
        }
    }
}
