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
use lambda_streams::dsl::{EmitStrategy, KTable, SessionWindows, Windowed};
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
    driver.flush().unwrap();
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
/// Streams emits it; the record at GAP / 2 is on time (the merged end GAP + 1 is not
/// before the close time 1) and merges it with `[GAP + 1, GAP + 1]` into `[0, GAP + 1]`,
/// emitted when a later record closes it. A documented difference with larger batches:
/// when the record at GAP / 2 shares a batch with the one at GAP + 1, `[0, 0]` is merged
/// before the batch's closing pass and only the merged session is emitted.
#[test]
fn session_processor_should_merge_sessions_emit_final() {
    let close = 3 * GAP_MS; // past GAP + 1 + GAP: closes the merged session
    let inputs = [
        ("mel", "first", 0),
        ("mel", "second", GAP_MS + 1),
        ("mel", "third", GAP_MS / 2),
        ("other", "x", close),
    ];
    let merged = format!("mel@0/{}", GAP_MS + 1);
    let kafka = out(&[("mel@0/0", "1", 0), (&merged, "3", GAP_MS + 1)]);
    for batching in [Batching::PerRecord, Batching::Size(2)] {
        assert_eq!(run(session_processor(), batching, &inputs), kafka);
    }
    for batching in [Batching::Size(3), Batching::Manual] {
        assert_eq!(
            run(session_processor(), batching, &inputs),
            out(&[(&merged, "3", GAP_MS + 1)])
        );
    }
}

/// Kafka Streams keeps an emitted session in its store, and a later record on time that
/// falls within the gap merges with it into a new session, emitted when it closes (Kafka's
/// `KStreamSessionWindowAggregate`: the emitted session is found by `findSessions` and
/// removed, the merged one put). Gap 10, no grace: `[0, 0]` closes at stream time 11; the
/// record at 5 is not late (5 >= 11 - 10) and merges it into `[0, 5]`.
#[test]
fn an_emitted_session_merges_with_a_record_on_time_as_in_kafka_streams() {
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
        out(&[("a@0/0", "1", 0), ("a@0/5", "2", 5), ("b@11/11", "1", 11)])
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
