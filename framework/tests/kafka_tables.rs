//! Kafka Streams' own tests of tables, table–table joins, stream–table joins, non-windowed
//! aggregations and stateless operators, ported: the same inputs and the same expected
//! records, timestamps included, each test naming the Kafka test class and method
//! (`streams/src/test/java/org/apache/kafka/streams/kstream/internals/`). The expected
//! values are Kafka's facts; where lambda-streams differs on purpose, the test asserts our
//! behaviour and says so, and `docs/kafka-streams-differences.md` ("Tables, table joins and
//! aggregations") gives the reason.
//!
//! Each scenario runs three times: one record per batch (as Kafka Streams processes), where
//! every output record must equal Kafka's in order; one batch per step of the Kafka test (all
//! the records piped between two of its assertions), where a table emits one update per key
//! per batch and the last output record of each key must equal Kafka's last for that key; and
//! the same with every batch delivered twice, where the second delivery repeats only records
//! already out and every later step is still Kafka's (the state applied each record once).

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use lambda_streams::driver::{Batching, TestDriver};
use lambda_streams::serdes::{DecimalI64, Nullable, Serde, Utf8};
use lambda_streams::{StreamsBuilder, Topology};

/// A record piped in: topic, key (`None`: a null key), value (`None`: a null value), timestamp.
type In = (&'static str, Option<i64>, Option<String>, i64);
/// A record out: key, value (`None`: a tombstone), timestamp.
type Out = (Option<i64>, Option<String>, i64);

/// One step of a Kafka test: the records it pipes, then the records it asserts.
struct Step {
    input: Vec<In>,
    expected: Vec<Out>,
}

fn rec(topic: &'static str, key: i64, value: &str, ts: i64) -> In {
    (topic, Some(key), Some(value.to_owned()), ts)
}

fn tomb(topic: &'static str, key: i64, ts: i64) -> In {
    (topic, Some(key), None, ts)
}

fn null_key(topic: &'static str, value: &str, ts: i64) -> In {
    (topic, None, Some(value.to_owned()), ts)
}

fn out(key: i64, value: &str, ts: i64) -> Out {
    (Some(key), Some(value.to_owned()), ts)
}

fn out_tomb(key: i64, ts: i64) -> Out {
    (Some(key), None, ts)
}

/// Pipes `step`'s records into `driver` (keys and values as Kafka's Integer/String test
/// serdes would carry them: decimal text here).
fn pipe(driver: &TestDriver, input: &[In]) {
    for (topic, key, value, ts) in input {
        driver
            .pipe(
                topic,
                0,
                Nullable(DecimalI64).serialize(key),
                value.as_ref().map(|v| v.as_bytes().to_vec()),
                *ts,
            )
            .unwrap();
    }
}

/// The records produced to `topic` since the last read.
fn read(driver: &TestDriver, topic: &str) -> Vec<Out> {
    driver
        .output_topic(topic, Nullable(DecimalI64), Nullable(Utf8))
        .read_records()
        .unwrap()
        .into_iter()
        .map(|r| (r.key, r.value, r.timestamp.unwrap()))
        .collect()
}

/// The last record per key of `records`.
fn last_per_key(records: &[Out]) -> BTreeMap<Option<i64>, Out> {
    records.iter().map(|r| (r.0, r.clone())).collect()
}

/// Runs `steps` through `topology()` one record per batch (every record out equals
/// Kafka's, in order) and one batch per step (the last record per key equals Kafka's).
fn check(topology: impl Fn() -> Topology, output: &str, steps: &[Step]) {
    let driver = TestDriver::new(topology());
    for (i, step) in steps.iter().enumerate() {
        pipe(&driver, &step.input);
        assert_eq!(
            read(&driver, output),
            step.expected,
            "one record per batch, step {i}"
        );
    }
    let driver = TestDriver::new(topology()).with_batching(Batching::Manual);
    for (i, step) in steps.iter().enumerate() {
        pipe(&driver, &step.input);
        driver.flush().unwrap();
        assert_eq!(
            last_per_key(&read(&driver, output)),
            last_per_key(&step.expected),
            "one batch per step, step {i}"
        );
    }
    // Each batch delivered twice (a rebalance): the copies repeat records already out
    // (at least once), and the state stays exact, so every later step is Kafka's again.
    let driver = TestDriver::new(topology()).with_batching(Batching::Manual);
    for (i, step) in steps.iter().enumerate() {
        pipe(&driver, &step.input);
        driver.flush().unwrap();
        let first = read(&driver, output);
        driver.redeliver_last_batch().unwrap();
        let again = read(&driver, output);
        assert!(
            again.iter().all(|r| first.contains(r)),
            "redelivered step {i}: {again:?} not among {first:?}"
        );
        assert_eq!(
            last_per_key(&first),
            last_per_key(&step.expected),
            "redelivered batches, step {i}"
        );
    }
}

fn step(input: Vec<In>, expected: Vec<Out>) -> Step {
    Step { input, expected }
}

// ---------------------------------------------------------------------------------------
// KTableKTableInnerJoinTest, KTableKTableLeftJoinTest, KTableKTableOuterJoinTest
// ---------------------------------------------------------------------------------------

const T1: &str = "topic1";
const T2: &str = "topic2";
const OUTPUT: &str = "output";

/// Kafka's `MockValueJoiner.TOSTRING_JOINER`: `left + "+" + right` (`null` when absent).
fn joiner(left: Option<&String>, right: Option<&String>) -> String {
    let show = |v: Option<&String>| v.map_or_else(|| "null".to_owned(), Clone::clone);
    format!("{}+{}", show(left), show(right))
}

/// The inputs of the table–table join tests' `testJoin` / `doTestJoin` but their last
/// step ([`final_deletes`]), step by step, with the join's expected outputs per step.
fn table_join_steps(expected: [Vec<Out>; 7]) -> Vec<Step> {
    let keys = [0, 1, 2, 3];
    let [e0, e1, e2, e3, e4, e5, e6] = expected;
    let mut s0: Vec<In> = (0..2)
        .map(|i| rec(T1, i, &format!("X{i}"), 5 + i))
        .collect();
    s0.push(null_key(T1, "SomeVal", 42));
    let mut s1: Vec<In> = (0..2)
        .map(|i| rec(T2, i, &format!("Y{i}"), 10 * i))
        .collect();
    s1.push(null_key(T2, "AnotherVal", 73));
    let s2 = keys
        .iter()
        .map(|&k| rec(T1, k, &format!("XX{k}"), 7))
        .collect();
    let s3 = keys
        .iter()
        .map(|&k| rec(T2, k, &format!("YY{k}"), k * 5))
        .collect();
    let s4 = keys
        .iter()
        .map(|&k| rec(T1, k, &format!("XXX{k}"), 6))
        .collect();
    let s5 = vec![tomb(T2, 0, 5), tomb(T2, 1, 7)];
    let s6a: Vec<In> = keys
        .iter()
        .map(|&k| rec(T1, k, &format!("XXXX{k}"), 13))
        .collect();
    vec![
        step(s0, e0),
        step(s1, e1),
        step(s2, e2),
        step(s3, e3),
        step(s4, e4),
        step(s5, e5),
        step(s6a, e6),
    ]
}

/// `builder.table(topic1).<join>(builder.table(topic2), TOSTRING_JOINER).toStream().to(output)`.
fn table_join_topology(kind: &'static str) -> impl Fn() -> Topology {
    move || {
        let builder = StreamsBuilder::new();
        let t1 = builder.table(T1, Nullable(DecimalI64), Utf8, "t1");
        let t2 = builder.table(T2, Nullable(DecimalI64), Utf8, "t2");
        let joined = match kind {
            "inner" => t1.join(&t2, |_, a, b| joiner(Some(a), Some(b))),
            "left" => t1.left_join(&t2, |_, a, b| joiner(Some(a), b)),
            "outer" => t1.outer_join(&t2, |_, a, b| joiner(a, b)),
            _ => unreachable!(),
        };
        joined
            .to_change_stream()
            .to(OUTPUT, Nullable(DecimalI64), Nullable(Utf8));
        builder.build()
    }
}

/// The last step of the table–table join tests: tombstones for every key of topic1.
fn final_deletes(expected: Vec<Out>) -> Step {
    step(
        vec![
            tomb(T1, 0, 0),
            tomb(T1, 1, 42),
            tomb(T1, 2, 5),
            tomb(T1, 3, 20),
        ],
        expected,
    )
}

/// Kafka: `KTableKTableInnerJoinTest.testJoin` (through `doTestJoin`).
#[test]
fn ktable_ktable_inner_join_test_join() {
    let mut steps = table_join_steps([
        vec![],
        vec![out(0, "X0+Y0", 5), out(1, "X1+Y1", 10)],
        vec![out(0, "XX0+Y0", 7), out(1, "XX1+Y1", 10)],
        vec![
            out(0, "XX0+YY0", 7),
            out(1, "XX1+YY1", 7),
            out(2, "XX2+YY2", 10),
            out(3, "XX3+YY3", 15),
        ],
        vec![
            out(0, "XXX0+YY0", 6),
            out(1, "XXX1+YY1", 6),
            out(2, "XXX2+YY2", 10),
            out(3, "XXX3+YY3", 15),
        ],
        vec![out_tomb(0, 6), out_tomb(1, 7)],
        vec![out(2, "XXXX2+YY2", 13), out(3, "XXXX3+YY3", 15)],
    ]);
    // Kafka: `[tomb(2, 10), tomb(3, 20)]`. Keys 0 and 1 lost their topic2 value in step 5,
    // which sent their deletions; losing their topic1 value too sends them again (with this
    // deletion's timestamp), on purpose: two tables losing a key at once, or a retried
    // batch after the other table's, would otherwise each find the other side gone and
    // send none (`docs/kafka-streams-differences.md`, "Tombstones that Kafka Streams would
    // not send"; `tests/table_join_faults.rs`).
    steps.push(final_deletes(vec![
        out_tomb(0, 0),
        out_tomb(1, 42),
        out_tomb(2, 10),
        out_tomb(3, 20),
    ]));
    check(table_join_topology("inner"), OUTPUT, &steps);
}

/// Kafka: `KTableKTableInnerJoinTest.testQueryableJoin` (the joined table materialized:
/// every table here is kept in a store, so it is `testJoin` again).
#[test]
fn ktable_ktable_inner_join_test_queryable_join() {
    ktable_ktable_inner_join_test_join();
}

/// Kafka: `KTableKTableLeftJoinTest.testJoin`.
#[test]
fn ktable_ktable_left_join_test_join() {
    let mut steps = table_join_steps([
        vec![out(0, "X0+null", 5), out(1, "X1+null", 6)],
        vec![out(0, "X0+Y0", 5), out(1, "X1+Y1", 10)],
        vec![
            out(0, "XX0+Y0", 7),
            out(1, "XX1+Y1", 10),
            out(2, "XX2+null", 7),
            out(3, "XX3+null", 7),
        ],
        vec![
            out(0, "XX0+YY0", 7),
            out(1, "XX1+YY1", 7),
            out(2, "XX2+YY2", 10),
            out(3, "XX3+YY3", 15),
        ],
        vec![
            out(0, "XXX0+YY0", 6),
            out(1, "XXX1+YY1", 6),
            out(2, "XXX2+YY2", 10),
            out(3, "XXX3+YY3", 15),
        ],
        vec![out(0, "XXX0+null", 6), out(1, "XXX1+null", 7)],
        vec![
            out(0, "XXXX0+null", 13),
            out(1, "XXXX1+null", 13),
            out(2, "XXXX2+YY2", 13),
            out(3, "XXXX3+YY3", 15),
        ],
    ]);
    steps.push(final_deletes(vec![
        out_tomb(0, 0),
        out_tomb(1, 42),
        out_tomb(2, 10),
        out_tomb(3, 20),
    ]));
    check(table_join_topology("left"), OUTPUT, &steps);
}

/// Kafka: `KTableKTableOuterJoinTest.testJoin`.
#[test]
fn ktable_ktable_outer_join_test_join() {
    let mut steps = table_join_steps([
        vec![out(0, "X0+null", 5), out(1, "X1+null", 6)],
        vec![out(0, "X0+Y0", 5), out(1, "X1+Y1", 10)],
        vec![
            out(0, "XX0+Y0", 7),
            out(1, "XX1+Y1", 10),
            out(2, "XX2+null", 7),
            out(3, "XX3+null", 7),
        ],
        vec![
            out(0, "XX0+YY0", 7),
            out(1, "XX1+YY1", 7),
            out(2, "XX2+YY2", 10),
            out(3, "XX3+YY3", 15),
        ],
        vec![
            out(0, "XXX0+YY0", 6),
            out(1, "XXX1+YY1", 6),
            out(2, "XXX2+YY2", 10),
            out(3, "XXX3+YY3", 15),
        ],
        vec![out(0, "XXX0+null", 6), out(1, "XXX1+null", 7)],
        vec![
            out(0, "XXXX0+null", 13),
            out(1, "XXXX1+null", 13),
            out(2, "XXXX2+YY2", 13),
            out(3, "XXXX3+YY3", 15),
        ],
    ]);
    steps.push(final_deletes(vec![
        out_tomb(0, 0),
        out_tomb(1, 42),
        out(2, "null+YY2", 10),
        out(3, "null+YY3", 20),
    ]));
    check(table_join_topology("outer"), OUTPUT, &steps);
}

// ---------------------------------------------------------------------------------------
// KStreamKTableJoinTest, KStreamKTableLeftJoinTest
// ---------------------------------------------------------------------------------------

const STREAM: &str = "streamTopic";
const TABLE: &str = "tableTopic";

/// `builder.stream(streamTopic).<join>(builder.table(tableTopic), TOSTRING_JOINER)`.
fn stream_table_topology(left: bool) -> impl Fn() -> Topology {
    move || {
        let builder = StreamsBuilder::new();
        let table = builder.table(TABLE, Nullable(DecimalI64), Utf8, "table");
        let stream = builder.stream(STREAM, Nullable(DecimalI64), Utf8);
        let joined = if left {
            stream.left_join(&table, |_, v: String, t: Option<String>| {
                joiner(Some(&v), t.as_ref())
            })
        } else {
            stream.join(&table, |_, v: String, t: String| joiner(Some(&v), Some(&t)))
        };
        joined.to(OUTPUT, Nullable(DecimalI64), Utf8);
        builder.build()
    }
}

/// Kafka's `pushToStream(n, prefix)`: key `i`, value `prefix + i`, timestamp `i`.
fn push_to_stream(n: i64, prefix: &str) -> Vec<In> {
    (0..n)
        .map(|i| rec(STREAM, i, &format!("{prefix}{i}"), i))
        .collect()
}

/// Kafka's `pushToTable(n, prefix)` (random timestamps there; they do not reach the output).
fn push_to_table(n: i64, prefix: &str) -> Vec<In> {
    (0..n)
        .map(|i| rec(TABLE, i, &format!("{prefix}{i}"), 1_000 + 7 * i))
        .collect()
}

/// Kafka's `pushNullValueToTable(n)`: tombstones at the input topic's time, 0.
fn push_null_value_to_table(n: i64) -> Vec<In> {
    (0..n).map(|i| tomb(TABLE, i, 0)).collect()
}

/// Kafka: `KStreamKTableJoinTest.shouldNotJoinWithEmptyTableOnStreamUpdates`.
#[test]
fn kstream_ktable_join_should_not_join_with_empty_table_on_stream_updates() {
    check(
        stream_table_topology(false),
        OUTPUT,
        &[step(push_to_stream(2, "X"), vec![])],
    );
}

/// Kafka: `KStreamKTableJoinTest.shouldNotJoinOnTableUpdates`.
#[test]
fn kstream_ktable_join_should_not_join_on_table_updates() {
    check(
        stream_table_topology(false),
        OUTPUT,
        &[
            step(push_to_stream(2, "X"), vec![]),
            step(push_to_table(2, "Y"), vec![]),
            step(
                push_to_stream(4, "X"),
                vec![out(0, "X0+Y0", 0), out(1, "X1+Y1", 1)],
            ),
            step(push_to_table(4, "YY"), vec![]),
            step(
                push_to_stream(4, "X"),
                vec![
                    out(0, "X0+YY0", 0),
                    out(1, "X1+YY1", 1),
                    out(2, "X2+YY2", 2),
                    out(3, "X3+YY3", 3),
                ],
            ),
            step(push_to_table(4, "YYY"), vec![]),
        ],
    );
}

/// Kafka: `KStreamKTableJoinTest.shouldJoinOnlyIfMatchFoundOnStreamUpdates`.
#[test]
fn kstream_ktable_join_should_join_only_if_match_found_on_stream_updates() {
    check(
        stream_table_topology(false),
        OUTPUT,
        &[
            step(push_to_table(2, "Y"), vec![]),
            step(
                push_to_stream(4, "X"),
                vec![out(0, "X0+Y0", 0), out(1, "X1+Y1", 1)],
            ),
        ],
    );
}

/// Kafka: `KStreamKTableJoinTest.shouldClearTableEntryOnNullValueUpdates`.
#[test]
fn kstream_ktable_join_should_clear_table_entry_on_null_value_updates() {
    check(
        stream_table_topology(false),
        OUTPUT,
        &[
            step(push_to_table(4, "Y"), vec![]),
            step(
                push_to_stream(4, "X"),
                vec![
                    out(0, "X0+Y0", 0),
                    out(1, "X1+Y1", 1),
                    out(2, "X2+Y2", 2),
                    out(3, "X3+Y3", 3),
                ],
            ),
            step(push_null_value_to_table(2), vec![]),
            step(
                push_to_stream(4, "XX"),
                vec![out(2, "XX2+Y2", 2), out(3, "XX3+Y3", 3)],
            ),
        ],
    );
}

/// Kafka: `KStreamKTableJoinTest.shouldLogAndMeterWhenSkippingNullLeftKey`: the record is
/// dropped (Kafka logs and meters it; here it is dropped without output).
#[test]
fn kstream_ktable_join_should_log_and_meter_when_skipping_null_left_key() {
    check(
        stream_table_topology(false),
        OUTPUT,
        &[
            step(push_to_table(2, "Y"), vec![]),
            step(vec![null_key(STREAM, "A", 0)], vec![]),
        ],
    );
}

/// Kafka: `KStreamKTableLeftJoinTest.shouldJoinWithEmptyTableOnStreamUpdates`.
#[test]
fn kstream_ktable_left_join_should_join_with_empty_table_on_stream_updates() {
    check(
        stream_table_topology(true),
        OUTPUT,
        &[step(
            push_to_stream(2, "X"),
            vec![out(0, "X0+null", 0), out(1, "X1+null", 1)],
        )],
    );
}

/// Kafka: `KStreamKTableLeftJoinTest.shouldNotJoinOnTableUpdates`.
#[test]
fn kstream_ktable_left_join_should_not_join_on_table_updates() {
    check(
        stream_table_topology(true),
        OUTPUT,
        &[
            step(
                push_to_stream(2, "X"),
                vec![out(0, "X0+null", 0), out(1, "X1+null", 1)],
            ),
            step(push_to_table(2, "Y"), vec![]),
            step(
                push_to_stream(4, "X"),
                vec![
                    out(0, "X0+Y0", 0),
                    out(1, "X1+Y1", 1),
                    out(2, "X2+null", 2),
                    out(3, "X3+null", 3),
                ],
            ),
            step(push_to_table(4, "YY"), vec![]),
            step(
                push_to_stream(4, "X"),
                vec![
                    out(0, "X0+YY0", 0),
                    out(1, "X1+YY1", 1),
                    out(2, "X2+YY2", 2),
                    out(3, "X3+YY3", 3),
                ],
            ),
            step(push_to_table(4, "YYY"), vec![]),
        ],
    );
}

/// Kafka: `KStreamKTableLeftJoinTest.shouldJoinRegardlessIfMatchFoundOnStreamUpdates`.
#[test]
fn kstream_ktable_left_join_should_join_regardless_if_match_found_on_stream_updates() {
    check(
        stream_table_topology(true),
        OUTPUT,
        &[
            step(push_to_table(2, "Y"), vec![]),
            step(
                push_to_stream(4, "X"),
                vec![
                    out(0, "X0+Y0", 0),
                    out(1, "X1+Y1", 1),
                    out(2, "X2+null", 2),
                    out(3, "X3+null", 3),
                ],
            ),
        ],
    );
}

/// Kafka: `KStreamKTableLeftJoinTest.shouldClearTableEntryOnNullValueUpdates`.
#[test]
fn kstream_ktable_left_join_should_clear_table_entry_on_null_value_updates() {
    check(
        stream_table_topology(true),
        OUTPUT,
        &[
            step(push_to_table(4, "Y"), vec![]),
            step(
                push_to_stream(4, "X"),
                vec![
                    out(0, "X0+Y0", 0),
                    out(1, "X1+Y1", 1),
                    out(2, "X2+Y2", 2),
                    out(3, "X3+Y3", 3),
                ],
            ),
            step(push_null_value_to_table(2), vec![]),
            step(
                push_to_stream(4, "XX"),
                vec![
                    out(0, "XX0+null", 0),
                    out(1, "XX1+null", 1),
                    out(2, "XX2+Y2", 2),
                    out(3, "XX3+Y3", 3),
                ],
            ),
        ],
    );
}

// ---------------------------------------------------------------------------------------
// KTableSourceTest, KTableFilterTest, KTableMapValuesTest
// ---------------------------------------------------------------------------------------

/// Kafka: `KTableSourceTest.testKTable`: `builder.table(topic1).toStream()`, tombstones
/// included.
#[test]
fn ktable_source_test_ktable() {
    let topology = || {
        let builder = StreamsBuilder::new();
        builder
            .table(T1, Nullable(DecimalI64), DecimalI64, "t1")
            .to_change_stream()
            .to(OUTPUT, Nullable(DecimalI64), Nullable(DecimalI64));
        builder.build()
    };
    let input = vec![
        rec(T1, 1, "1", 10),
        rec(T1, 2, "2", 11),
        rec(T1, 3, "3", 12),
        rec(T1, 4, "4", 13),
        tomb(T1, 1, 14),
        tomb(T1, 2, 15),
    ];
    // Kafka's keys are "A".."D"; here 1..4.
    let expected = vec![
        out(1, "1", 10),
        out(2, "2", 11),
        out(3, "3", 12),
        out(4, "4", 13),
        out_tomb(1, 14),
        out_tomb(2, 15),
    ];
    check(topology, OUTPUT, &[step(input, expected)]);
}

/// Kafka: `KTableSourceTest.kTableShouldLogAndMeterOnSkippedRecords`: a record with a null
/// key is skipped (and counted: `dropped_null_keys`).
#[test]
fn ktable_source_should_log_and_meter_on_skipped_records() {
    let builder = StreamsBuilder::new();
    builder
        .table(T1, Nullable(DecimalI64), Utf8, "t1")
        .to_change_stream()
        .to(OUTPUT, Nullable(DecimalI64), Nullable(Utf8));
    let driver = TestDriver::new(builder.build());
    pipe(&driver, &[null_key(T1, "value", 0)]);
    assert_eq!(driver.last_report().unwrap().dropped_null_keys, 1);
    assert!(read(&driver, OUTPUT).is_empty());
}

/// Kafka: `KTableSourceTest.kTableShouldLogOnOutOfOrder`: an update older than the key's
/// current one still replaces it (Kafka logs a warning), with its own timestamp: also when
/// both are in one batch (the update carries the latest record's timestamp, not the
/// batch's highest).
#[test]
fn ktable_source_should_log_on_out_of_order() {
    let topology = || {
        let builder = StreamsBuilder::new();
        builder
            .table(T1, Nullable(DecimalI64), Utf8, "t1")
            .to_change_stream()
            .to(OUTPUT, Nullable(DecimalI64), Nullable(Utf8));
        builder.build()
    };
    check(
        topology,
        OUTPUT,
        &[
            step(
                vec![rec(T1, 1, "value", 10), rec(T1, 1, "value", 5)],
                vec![out(1, "value", 10), out(1, "value", 5)],
            ),
            // Not in Kafka's test: the same for a deletion (Kafka's `testKTable` forwards
            // a tombstone with its own timestamp).
            step(
                vec![rec(T1, 1, "value", 30), tomb(T1, 1, 25)],
                vec![out(1, "value", 30), out_tomb(1, 25)],
            ),
        ],
    );
}

/// The inputs of `KTableFilterTest.doTestKTable` (keys "A".."D" as 1..4).
fn filter_input() -> Vec<In> {
    vec![
        rec(T1, 1, "1", 10),
        rec(T1, 2, "2", 5),
        rec(T1, 3, "3", 8),
        rec(T1, 4, "4", 14),
        tomb(T1, 1, 18),
        tomb(T1, 2, 15),
    ]
}

/// `table(topic1).filter(even)` to `even`, `.filterNot(even)` to `odd`, changelogs.
fn filter_topology() -> Topology {
    let builder = StreamsBuilder::new();
    let table = builder.table(T1, Nullable(DecimalI64), DecimalI64, "t1");
    table.filter(|_, v| v % 2 == 0).to_change_stream().to(
        "even",
        Nullable(DecimalI64),
        Nullable(DecimalI64),
    );
    table.filter(|_, v| v % 2 != 0).to_change_stream().to(
        "odd",
        Nullable(DecimalI64),
        Nullable(DecimalI64),
    );
    builder.build()
}

/// Kafka: `KTableFilterTest.shouldPassThroughWithoutMaterialization` (a value the
/// predicate rejects is forwarded as a tombstone).
#[test]
fn ktable_filter_should_pass_through_without_materialization() {
    let even = vec![
        out_tomb(1, 10),
        out(2, "2", 5),
        out_tomb(3, 8),
        out(4, "4", 14),
        out_tomb(1, 18),
        out_tomb(2, 15),
    ];
    let odd = vec![
        out(1, "1", 10),
        out_tomb(2, 5),
        out(3, "3", 8),
        out_tomb(4, 14),
        out_tomb(1, 18),
        out_tomb(2, 15),
    ];
    check(filter_topology, "even", &[step(filter_input(), even)]);
    check(filter_topology, "odd", &[step(filter_input(), odd)]);
}

/// Kafka: `KTableFilterTest.shouldPassThroughOnMaterialization` (the same records: every
/// table here is read from its store).
#[test]
fn ktable_filter_should_pass_through_on_materialization() {
    ktable_filter_should_pass_through_without_materialization();
}

/// Kafka: `KTableMapValuesTest.testKTable`: `table(topic1).mapValues(v -> v.charAt(0) - 48)`.
#[test]
fn ktable_map_values_test_ktable() {
    let topology = || {
        let builder = StreamsBuilder::new();
        builder
            .table(T1, Nullable(DecimalI64), Utf8, "t1")
            .map_values(|v: &String| i64::from(v.as_bytes()[0]) - 48)
            .to_stream()
            .to(OUTPUT, Nullable(DecimalI64), DecimalI64);
        builder.build()
    };
    let input = vec![
        rec(T1, 1, "1", 5),
        rec(T1, 2, "2", 25),
        rec(T1, 3, "3", 20),
        rec(T1, 4, "4", 10),
    ];
    let expected = vec![
        out(1, "1", 5),
        out(2, "2", 25),
        out(3, "3", 20),
        out(4, "4", 10),
    ];
    check(topology, OUTPUT, &[step(input, expected)]);
}

// ---------------------------------------------------------------------------------------
// KGroupedStreamImplTest (non-windowed)
// ---------------------------------------------------------------------------------------

const TOPIC: &str = "topic";

/// Kafka's `processData`: keys "1".."3" as 1..3; the last record has a null value.
fn process_data() -> Vec<In> {
    vec![
        rec(TOPIC, 1, "A", 5),
        rec(TOPIC, 2, "B", 1),
        rec(TOPIC, 1, "C", 3),
        rec(TOPIC, 1, "D", 10),
        rec(TOPIC, 3, "E", 8),
        rec(TOPIC, 3, "F", 9),
        tomb(TOPIC, 3, 9),
    ]
}

/// Per key: the final aggregate and its timestamp.
type Finals = BTreeMap<Option<i64>, (Option<String>, i64)>;

/// The final aggregate per key, and its timestamp, from the table's updates.
fn finals(records: &[Out]) -> Finals {
    records
        .iter()
        .map(|(k, v, t)| (*k, (v.clone(), *t)))
        .collect()
}

/// Runs `process_data` through `topology` one record per batch and as one batch, and
/// returns the final (value, timestamp) per key of both runs.
fn aggregate_finals(topology: impl Fn() -> Topology) -> [Finals; 2] {
    let per_record = TestDriver::new(topology());
    pipe(&per_record, &process_data());
    let one_batch = TestDriver::new(topology()).with_batching(Batching::Manual);
    pipe(&one_batch, &process_data());
    one_batch.flush().unwrap();
    [
        finals(&read(&per_record, OUTPUT)),
        finals(&read(&one_batch, OUTPUT)),
    ]
}

fn expected_finals(rows: [(i64, &str, i64); 3]) -> Finals {
    rows.iter()
        .map(|(k, v, t)| (Some(*k), (Some((*v).to_owned()), *t)))
        .collect()
}

/// `stream(topic).groupByKey().count()`; with `skip_nulls`, the stream's `None` values are
/// dropped first (a `flat_map_values` that gives no record for a `None`).
fn count_topology(skip_nulls: bool) -> impl Fn() -> Topology {
    move || {
        let builder = StreamsBuilder::new();
        let mut stream = builder.stream(TOPIC, Nullable(DecimalI64), Nullable(Utf8));
        if skip_nulls {
            stream = stream.flat_map_values(|v| [v].into_iter().flatten().map(Some));
        }
        stream
            .group_by_key(Nullable(DecimalI64))
            .count("count")
            .to_stream()
            .to(OUTPUT, Nullable(DecimalI64), DecimalI64);
        builder.build()
    }
}

/// Kafka: `KGroupedStreamImplTest.shouldCountAndMaterializeResults`: 1 → 3 (ts 10),
/// 2 → 1 (ts 1), 3 → 2 (ts 9), the null value skipped (`KStreamAggregate` skips a null
/// value, counted as dropped): a `None` of the `Nullable` value serde is Kafka's null, and
/// `count` skips it too (`dropped_null_values`). Dropping the `None`s first changes nothing.
#[test]
fn kgrouped_stream_should_count_and_materialize_results() {
    let kafka = expected_finals([(1, "3", 10), (2, "1", 1), (3, "2", 9)]);
    for skip_nulls in [false, true] {
        for finals in aggregate_finals(count_topology(skip_nulls)) {
            assert_eq!(finals, kafka);
        }
    }
}

/// Kafka: `KGroupedStreamImplTest.shouldCountAndMaterializeResults`, every update: Kafka's
/// `KStreamAggregate` stamps an update with `max(record timestamp, aggregate timestamp)`,
/// so C (ts 3) after A (ts 5) gives key 1's count 2 at 5, not 3 (by hand from its code,
/// and the store's timestamps its test asserts: 10, 1 and 9). One record per batch: every
/// update; in batches of 2 and 3 and as one batch: the last update per key is Kafka's last,
/// its timestamp included, also when a batch's records are all older than the aggregate's.
#[test]
fn kgrouped_stream_count_update_carries_the_aggregates_newest_timestamp() {
    let kafka = vec![
        out(1, "1", 5),
        out(2, "1", 1),
        out(1, "2", 5),
        out(1, "3", 10),
        out(3, "1", 8),
        out(3, "2", 9),
    ];
    let topologies: [Box<dyn Fn() -> Topology>; 2] = [
        Box::new(count_topology(false)),
        Box::new(|| {
            let builder = StreamsBuilder::new();
            builder
                .stream(TOPIC, Nullable(DecimalI64), Nullable(Utf8))
                .group_by_key(Nullable(DecimalI64))
                .reduce("reduce", |a: Option<String>, _| a, Nullable(Utf8))
                .to_stream()
                .map_values(|_| Some("x".to_owned()))
                .to(OUTPUT, Nullable(DecimalI64), Nullable(Utf8));
            builder.build()
        }),
    ];
    for (i, topology) in topologies.iter().enumerate() {
        let per_record = TestDriver::new(topology());
        pipe(&per_record, &process_data());
        let got = read(&per_record, OUTPUT);
        if i == 0 {
            assert_eq!(got, kafka);
        } else {
            let times: Vec<_> = got.iter().map(|o| (o.0, o.2)).collect();
            let kafka_times: Vec<_> = kafka.iter().map(|o| (o.0, o.2)).collect();
            assert_eq!(times, kafka_times, "reduce");
        }
        for size in [2, 3, 7] {
            let batched = TestDriver::new(topology()).with_batching(Batching::Size(size));
            pipe(&batched, &process_data());
            batched.flush().unwrap();
            let last = |o: &[Out]| -> BTreeMap<Option<i64>, i64> {
                o.iter().map(|(k, _, t)| (*k, *t)).collect()
            };
            assert_eq!(
                last(&read(&batched, OUTPUT)),
                last(&kafka),
                "batches of {size}"
            );
        }
    }
    // A batch whose records are all older than the aggregate: (1, 10) then (1, 3), (1, 4).
    let driver = TestDriver::new(count_topology(false)()).with_batching(Batching::Size(2));
    pipe(&driver, &[rec(TOPIC, 1, "a", 10)]);
    driver.flush().unwrap();
    pipe(&driver, &[rec(TOPIC, 1, "b", 3), rec(TOPIC, 1, "c", 4)]);
    assert_eq!(read(&driver, OUTPUT), [out(1, "1", 10), out(1, "3", 10)]);
}

/// Kafka: `KGroupedStreamImplTest.shouldLogAndMeasureSkipsInAggregate` and
/// `shouldLogAndMeasureSkipsInReduce`: `processData`'s null value (offset 6) is skipped,
/// Kafka logging "Skipping record due to null key or value" with its offset; here it is
/// counted in the batch report's `dropped_null_values` (and the `DroppedNullValues`
/// metric), for `count`, `aggregate` and `reduce`.
#[test]
fn kgrouped_stream_should_log_and_measure_skips_in_aggregate_and_reduce() {
    let reduce = || {
        let builder = StreamsBuilder::new();
        builder
            .stream(TOPIC, Nullable(DecimalI64), Nullable(Utf8))
            .group_by_key(Nullable(DecimalI64))
            .reduce(
                "reduce",
                |a: Option<String>, b: Option<String>| a.zip(b).map(|(a, b)| format!("{a}+{b}")),
                Nullable(Utf8),
            )
            .to_stream()
            .to(OUTPUT, Nullable(DecimalI64), Nullable(Utf8));
        builder.build()
    };
    let topologies: [Box<dyn Fn() -> Topology>; 3] = [
        Box::new(count_topology(false)),
        Box::new(aggregate_topology(false)),
        Box::new(reduce),
    ];
    for topology in topologies {
        let one_batch = TestDriver::new(topology()).with_batching(Batching::Manual);
        pipe(&one_batch, &process_data());
        one_batch.flush().unwrap();
        let report = one_batch.last_report().unwrap();
        assert_eq!((report.dropped_null_values, report.records_in), (1, 7));
        let per_record = TestDriver::new(topology());
        pipe(&per_record, &process_data());
        assert_eq!(per_record.last_report().unwrap().dropped_null_values, 1);
        // The null record produced nothing: the last update is F's (key 3, ts 9).
        assert_eq!(
            read(&per_record, OUTPUT).last().map(|o| (o.0, o.2)),
            Some((Some(3), 9))
        );
    }
}

/// Kafka: `KGroupedStreamImplTest.shouldReduceAndMaterializeResults` (`MockReducer.STRING_ADDER`):
/// 1 → "A+C+D" (ts 10), 2 → "B" (ts 1), 3 → "E+F" (ts 9): the null value is skipped before
/// the reducer, as Kafka's `KStreamReduce` skips it (this reducer would show a `None`).
#[test]
fn kgrouped_stream_should_reduce_and_materialize_results() {
    let topology = || {
        let builder = StreamsBuilder::new();
        builder
            .stream(TOPIC, Nullable(DecimalI64), Nullable(Utf8))
            .group_by_key(Nullable(DecimalI64))
            .reduce(
                "reduce",
                |a: Option<String>, b: Option<String>| {
                    let show = |v: Option<String>| v.unwrap_or_else(|| "null".to_owned());
                    Some(format!("{}+{}", show(a), show(b)))
                },
                Nullable(Utf8),
            )
            .to_stream()
            .to(OUTPUT, Nullable(DecimalI64), Nullable(Utf8));
        builder.build()
    };
    let expected = expected_finals([(1, "A+C+D", 10), (2, "B", 1), (3, "E+F", 9)]);
    for finals in aggregate_finals(topology) {
        assert_eq!(finals, expected);
    }
}

/// The topology of `KGroupedStreamImplTest.shouldAggregateAndMaterializeResults`
/// (`MockInitializer.STRING_INIT`, `MockAggregator.TOSTRING_ADDER`, which shows a null as
/// `null`); with `skip_nulls`, the stream's `None` values are dropped first.
fn aggregate_topology(skip_nulls: bool) -> impl Fn() -> Topology {
    move || {
        let builder = StreamsBuilder::new();
        let mut stream = builder.stream(TOPIC, Nullable(DecimalI64), Nullable(Utf8));
        if skip_nulls {
            stream = stream.flat_map_values(|v| [v].into_iter().flatten().map(Some));
        }
        stream
            .group_by_key(Nullable(DecimalI64))
            .aggregate(
                "aggregate",
                || "0".to_owned(),
                |_, v: Option<String>, agg: String| {
                    format!("{agg}+{}", v.unwrap_or_else(|| "null".to_owned()))
                },
                Utf8,
            )
            .to_stream()
            .to(OUTPUT, Nullable(DecimalI64), Utf8);
        builder.build()
    }
}

/// Kafka: `KGroupedStreamImplTest.shouldAggregateAndMaterializeResults`: 1 → "0+A+C+D"
/// (ts 10), 2 → "0+B" (ts 1), 3 → "0+E+F" (ts 9): the `None` value does not reach the
/// aggregator (which would show it as `null`), as in Kafka's `KStreamAggregate`.
#[test]
fn kgrouped_stream_should_aggregate_and_materialize_results() {
    let kafka = expected_finals([(1, "0+A+C+D", 10), (2, "0+B", 1), (3, "0+E+F", 9)]);
    for skip_nulls in [false, true] {
        for finals in aggregate_finals(aggregate_topology(skip_nulls)) {
            assert_eq!(finals, kafka);
        }
    }
}

/// Kafka: `KGroupedStreamImplTest.shouldAggregateWithDefaultSerdes` (the last value and
/// timestamp per key of the table's stream: the same records).
#[test]
fn kgrouped_stream_should_aggregate_with_default_serdes() {
    kgrouped_stream_should_aggregate_and_materialize_results();
}

// ---------------------------------------------------------------------------------------
// KStreamFilterTest, KStreamMapTest, KStreamFlatMapTest, KStreamSelectKeyTest
// ---------------------------------------------------------------------------------------

/// Kafka: `KStreamFilterTest.testFilter` / `testFilterNot`: keys 1..7, multiples of three.
#[test]
fn kstream_filter_test_filter_and_filter_not() {
    let builder = StreamsBuilder::new();
    let stream = builder.stream(TOPIC, DecimalI64, Utf8);
    stream
        .filter(|k, _| k % 3 == 0)
        .to("kept", DecimalI64, Utf8);
    stream
        .filter_not(|k, _| k % 3 == 0)
        .to("rest", DecimalI64, Utf8);
    let driver = TestDriver::new(builder.build());
    let mut input = driver.input_topic(TOPIC, DecimalI64, Utf8);
    for k in 1..=7 {
        input.pipe_input(k, format!("V{k}")).unwrap();
    }
    assert_eq!(driver.read_output("kept").len(), 2);
    assert_eq!(driver.read_output("rest").len(), 5);
}

/// Kafka: `KStreamMapTest.testMap`: `(k, v) -> (v, k)`, timestamps kept.
#[test]
fn kstream_map_test_map() {
    let builder = StreamsBuilder::new();
    builder
        .stream(TOPIC, DecimalI64, Utf8)
        .map(|k, v| (v, k))
        .to(OUTPUT, Utf8, DecimalI64);
    let driver = TestDriver::new(builder.build());
    let mut input = driver.input_topic(TOPIC, DecimalI64, Utf8);
    for k in 0..4 {
        input
            .pipe_input_with_timestamp(k, format!("V{k}"), 10 - k)
            .unwrap();
    }
    let got: Vec<(String, i64, Option<i64>)> = driver
        .output_topic(OUTPUT, Utf8, DecimalI64)
        .read_records()
        .unwrap()
        .into_iter()
        .map(|r| (r.key, r.value, r.timestamp))
        .collect();
    let expected: Vec<(String, i64, Option<i64>)> =
        (0..4).map(|k| (format!("V{k}"), k, Some(10 - k))).collect();
    assert_eq!(got, expected);
}

/// Kafka: `KStreamFlatMapTest.testFlatMap`: key `k` gives `k` records `(k*10+i, v)`.
#[test]
fn kstream_flat_map_test_flat_map() {
    let builder = StreamsBuilder::new();
    builder
        .stream(TOPIC, DecimalI64, Utf8)
        .flat_map(|k, v| {
            (0..k)
                .map(|i| ((k * 10 + i).to_string(), v.clone()))
                .collect::<Vec<_>>()
        })
        .to(OUTPUT, Utf8, Utf8);
    let driver = TestDriver::new(builder.build());
    let mut input = driver.input_topic(TOPIC, DecimalI64, Utf8).with_time(0, 0);
    for k in 0..4 {
        input.pipe_input(k, format!("V{k}")).unwrap();
    }
    let got: Vec<(String, String, Option<i64>)> = driver
        .output_topic(OUTPUT, Utf8, Utf8)
        .read_records()
        .unwrap()
        .into_iter()
        .map(|r| (r.key, r.value, r.timestamp))
        .collect();
    let expected: Vec<(String, String, Option<i64>)> = [
        ("10", "V1"),
        ("20", "V2"),
        ("21", "V2"),
        ("30", "V3"),
        ("31", "V3"),
        ("32", "V3"),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned(), Some(0)))
    .collect();
    assert_eq!(got, expected);
}

/// Kafka: `KStreamSelectKeyTest.testSelectKey`: values 1..3 keyed "ONE".."THREE".
#[test]
fn kstream_select_key_test_select_key() {
    let builder = StreamsBuilder::new();
    builder
        .stream(TOPIC, Nullable(Utf8), DecimalI64)
        .select_key(|_, v| ["", "ONE", "TWO", "THREE"][*v as usize].to_owned())
        .to(OUTPUT, Utf8, DecimalI64);
    let driver = TestDriver::new(builder.build());
    let mut input = driver
        .input_topic(TOPIC, Nullable(Utf8), DecimalI64)
        .with_time(0, 0);
    for v in 1..=3 {
        input.pipe_input(None::<String>, v).unwrap();
    }
    let got: Vec<(String, i64, Option<i64>)> = driver
        .output_topic(OUTPUT, Utf8, DecimalI64)
        .read_records()
        .unwrap()
        .into_iter()
        .map(|r| (r.key, r.value, r.timestamp))
        .collect();
    assert_eq!(
        got,
        [
            ("ONE".to_owned(), 1, Some(0)),
            ("TWO".to_owned(), 2, Some(0)),
            ("THREE".to_owned(), 3, Some(0)),
        ]
    );
}

// ---------------------------------------------------------------------------------------
// KStreamSplitTest
// ---------------------------------------------------------------------------------------

/// Kafka's `withDriver`: keys -1..7, values "V<key>".
fn pipe_split_input(driver: &TestDriver) {
    let mut input = driver.input_topic(TOPIC, DecimalI64, Utf8);
    for k in -1..=7 {
        input.pipe_input(k, format!("V{k}")).unwrap();
    }
}

fn values(driver: &TestDriver, topic: &str) -> Vec<String> {
    driver
        .output_topic(topic, DecimalI64, Utf8)
        .read_values()
        .unwrap()
}

/// Kafka: `KStreamSplitTest.testKStreamSplit`: a record goes to the first branch it
/// matches (even, multiple of three, multiple of five), no default branch.
#[test]
fn kstream_split_test_kstream_split() {
    let builder = StreamsBuilder::new();
    let split = builder.stream(TOPIC, DecimalI64, Utf8).split();
    split
        .branch("x2", |k, _| k % 2 == 0)
        .to("x2", DecimalI64, Utf8);
    split
        .branch("x3", |k, _| k % 3 == 0)
        .to("x3", DecimalI64, Utf8);
    split
        .branch("x5", |k, _| k % 5 == 0)
        .to("x5", DecimalI64, Utf8);
    let driver = TestDriver::new(builder.build());
    pipe_split_input(&driver);
    assert_eq!(values(&driver, "x2"), ["V0", "V2", "V4", "V6"]);
    assert_eq!(values(&driver, "x3"), ["V3"]);
    assert_eq!(values(&driver, "x5"), ["V5"]);
}

/// Kafka: `KStreamSplitTest.testBranchingWithNoTerminalOperation`: two branches into one
/// topic, in input order.
#[test]
fn kstream_split_test_branching_with_no_terminal_operation() {
    let builder = StreamsBuilder::new();
    let split = builder.stream(TOPIC, DecimalI64, Utf8).split();
    split
        .branch("even", |k, _| k % 2 == 0)
        .to(OUTPUT, DecimalI64, Utf8);
    split
        .branch("five", |k, _| k % 5 == 0)
        .to(OUTPUT, DecimalI64, Utf8);
    let driver = TestDriver::new(builder.build());
    pipe_split_input(&driver);
    assert_eq!(values(&driver, OUTPUT), ["V0", "V2", "V4", "V5", "V6"]);
}

// ---------------------------------------------------------------------------------------
// Null values at a stream–table join
// ---------------------------------------------------------------------------------------

/// Kafka: `KStreamKTableJoinTest.shouldLogAndMeterWhenSkippingNullLeftValue`: Kafka drops
/// a stream record with a null value before the join (`KStreamKTableJoinProcessor`); so
/// does this join, for a `None` of the stream's `Nullable` value serde (counted in
/// `dropped_null_values`). Dropping `None`s first changes nothing.
#[test]
fn kstream_ktable_join_should_log_and_meter_when_skipping_null_left_value() {
    let topology = |skip_nulls: bool| {
        let builder = StreamsBuilder::new();
        let table = builder.table(TABLE, Nullable(DecimalI64), Utf8, "table");
        let mut stream = builder.stream(STREAM, Nullable(DecimalI64), Nullable(Utf8));
        if skip_nulls {
            stream = stream.flat_map_values(|v| [v].into_iter().flatten().map(Some));
        }
        stream
            .join(&table, |_, v: Option<String>, t: String| {
                joiner(v.as_ref(), Some(&t))
            })
            .to(OUTPUT, Nullable(DecimalI64), Utf8);
        builder.build()
    };
    let steps = |expected: Vec<Out>| {
        vec![
            step(push_to_table(2, "Y"), vec![]),
            step(vec![tomb(STREAM, 1, 0)], expected),
        ]
    };
    check(|| topology(false), OUTPUT, &steps(vec![]));
    check(|| topology(true), OUTPUT, &steps(vec![]));
}

/// Kafka: `KTableKTableInnerJoinTest.testNotSendingOldValues` (through
/// `doTestNotSendingOldValues`): the joined table's changes without old values are the
/// records of `testJoin`, deletions included.
#[test]
fn ktable_ktable_inner_join_test_not_sending_old_values() {
    ktable_ktable_inner_join_test_join();
}

/// The workarounds `docs/kafka-streams-differences.md` gives: `flat_map_values(|v| v)` drops
/// `None` values before an aggregation (Kafka's counts of `processData`), and a table–table
/// join's changelog produced to a topic and read back as a table can be joined.
#[test]
fn documented_workarounds() {
    let builder = StreamsBuilder::new();
    builder
        .stream(TOPIC, Nullable(DecimalI64), Nullable(Utf8))
        .flat_map_values(|v| v)
        .group_by_key(Nullable(DecimalI64))
        .count("count")
        .to_stream()
        .to(OUTPUT, Nullable(DecimalI64), DecimalI64);
    let t1 = builder.table(T1, Nullable(DecimalI64), Utf8, "t1");
    let t2 = builder.table(T2, Nullable(DecimalI64), Utf8, "t2");
    t1.join(&t2, |_, a, b| joiner(Some(a), Some(b)))
        .to_change_stream()
        .to("joined-changelog", Nullable(DecimalI64), Nullable(Utf8));
    let joined = builder.table("joined-changelog", Nullable(DecimalI64), Utf8, "joined");
    builder
        .stream(STREAM, Nullable(DecimalI64), Utf8)
        .join(&joined, |_, v: String, t: String| {
            joiner(Some(&v), Some(&t))
        })
        .to("enriched", Nullable(DecimalI64), Utf8);
    let driver = TestDriver::new(builder.build());
    pipe(&driver, &process_data());
    assert_eq!(
        finals(&read(&driver, OUTPUT)),
        expected_finals([(1, "3", 10), (2, "1", 1), (3, "2", 9)])
    );
    pipe(
        &driver,
        &[
            rec(T1, 0, "X0", 1),
            rec(T2, 0, "Y0", 2),
            rec(STREAM, 0, "S0", 3),
        ],
    );
    assert_eq!(read(&driver, "enriched"), [out(0, "S0+X0+Y0", 3)]);
}

/// `table(topic1)` filtered to even values (`even` joins read it) and to odd ones (`odd`),
/// each read by a left join of the stream `probe`: the value getter of Kafka's test, as
/// a join sees the filtered tables.
fn value_getter_topology() -> Topology {
    let builder = StreamsBuilder::new();
    let table = builder.table(T1, Nullable(DecimalI64), DecimalI64, "t1");
    let even = table.filter(|_, v| v % 2 == 0);
    let odd = table.filter(|_, v| v % 2 != 0);
    let probe = builder.stream("probe", Nullable(DecimalI64), Utf8);
    for (name, table) in [("even", even), ("odd", odd)] {
        probe
            .left_join(&table, |_, p: String, v: Option<i64>| {
                format!(
                    "{p}+{}",
                    v.map_or_else(|| "null".to_owned(), |v| v.to_string())
                )
            })
            .to(name, Nullable(DecimalI64), Utf8);
    }
    builder.build()
}

/// Kafka: `KTableFilterTest.shouldGetValuesOnMaterialization` (through `doTestValueGetter`):
/// the values the filtered tables' getters return after each step, read by a join (keys
/// "A".."C" as 1..3; the getters' timestamps are not seen through a stream–table join).
#[test]
fn ktable_filter_should_get_values_on_materialization() {
    let probe = |at: i64| -> Vec<In> { (1..=3).map(|k| rec("probe", k, "P", at)).collect() };
    let seen = |at: i64, values: [&str; 3]| -> Vec<Out> {
        (1..=3)
            .zip(values)
            .map(|(k, v)| out(k, &format!("P+{v}"), at))
            .collect()
    };
    let updates = [
        vec![rec(T1, 1, "1", 5), rec(T1, 2, "1", 10), rec(T1, 3, "1", 15)],
        vec![rec(T1, 1, "2", 10), rec(T1, 2, "2", 5)],
        vec![rec(T1, 1, "3", 15)],
        vec![tomb(T1, 1, 10), tomb(T1, 2, 20)],
    ];
    let even = [
        ["null", "null", "null"],
        ["2", "2", "null"],
        ["null", "2", "null"],
        ["null", "null", "null"],
    ];
    let odd = [
        ["1", "1", "1"],
        ["null", "null", "1"],
        ["3", "null", "1"],
        ["null", "null", "1"],
    ];
    for (output, getter) in [("even", even), ("odd", odd)] {
        let steps: Vec<Step> = updates
            .iter()
            .zip(getter)
            .enumerate()
            .flat_map(|(i, (update, values))| {
                let at = 100 + i as i64;
                [
                    step(update.clone(), vec![]),
                    step(probe(at), seen(at, values)),
                ]
            })
            .collect();
        check(value_getter_topology, output, &steps);
    }
}

/// Kafka: `KTableSourceTest.testValueGetter`: the table's value and timestamp per key after
/// each step (keys "A".."C" as 1..3), read by a table–table join: probe table `p<i>`, fed
/// once at timestamp 0 for check `i`, joined with the table, gives `(key, value,
/// max(0, the value's timestamp))` for each key the table holds, nothing for the others.
#[test]
fn ktable_source_test_value_getter() {
    let topology = || {
        let builder = StreamsBuilder::new();
        let table = builder.table(T1, Nullable(DecimalI64), Utf8, "store");
        for i in 0..4 {
            builder
                .table(
                    &format!("p{i}"),
                    Nullable(DecimalI64),
                    Utf8,
                    &format!("p{i}"),
                )
                .join(&table, |_, _: &String, v: &String| v.clone())
                .to_stream()
                .to(&format!("got{i}"), Nullable(DecimalI64), Utf8);
        }
        builder.build()
    };
    let updates = [
        vec![
            rec(T1, 1, "01", 10),
            rec(T1, 2, "01", 20),
            rec(T1, 3, "01", 15),
        ],
        vec![rec(T1, 1, "02", 30), rec(T1, 2, "02", 5)],
        vec![rec(T1, 1, "03", 29)],
        vec![tomb(T1, 1, 50), tomb(T1, 2, 3)],
    ];
    let getter = [
        vec![out(1, "01", 10), out(2, "01", 20), out(3, "01", 15)],
        vec![out(1, "02", 30), out(2, "02", 5), out(3, "01", 15)],
        vec![out(1, "03", 29), out(2, "02", 5), out(3, "01", 15)],
        vec![out(3, "01", 15)],
    ];
    for batching in [Batching::PerRecord, Batching::Manual] {
        let driver = TestDriver::new(topology()).with_batching(batching);
        for (i, (update, expected)) in updates.iter().zip(&getter).enumerate() {
            pipe(&driver, update);
            driver.flush().unwrap();
            let probe = ["p0", "p1", "p2", "p3"][i];
            let probes: Vec<In> = (1..=3).map(|k| rec(probe, k, "P", 0)).collect();
            pipe(&driver, &probes);
            driver.flush().unwrap();
            assert_eq!(
                read(&driver, &format!("got{i}")),
                *expected,
                "{batching:?}, check {i}"
            );
        }
    }
}

/// Kafka: `KTableKTableLeftJoinTest.testNotSendingOldValue`: the joined table's changes
/// without old values are the records of `testJoin`, deletions included.
#[test]
fn ktable_ktable_left_join_test_not_sending_old_value() {
    ktable_ktable_left_join_test_join();
}

/// Kafka: `KTableKTableOuterJoinTest.testNotSendingOldValue`: the records of `testJoin`.
#[test]
fn ktable_ktable_outer_join_test_not_sending_old_value() {
    ktable_ktable_outer_join_test_join();
}
