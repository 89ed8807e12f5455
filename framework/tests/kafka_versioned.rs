//! Kafka Streams' own tests of versioned tables (KIP-889) and of stream–table joins against
//! them, ported: the same inputs and the same expected records, timestamps included, each
//! test naming the Kafka test class and method (`streams/src/test/java/org/apache/kafka/
//! streams/`). The expected values are Kafka's facts; where lambda-streams differs on
//! purpose, the test asserts our behaviour and says so, and docs/kafka-streams-differences.md
//! ("Versioned tables") gives the reason.
//!
//! Each scenario runs one record per batch (as Kafka Streams processes: every output equals
//! Kafka's, in order), in batches of consecutive records of one topic or of one step of the
//! Kafka test (a stream–table join's results must not depend on those boundaries; a table's
//! changes: the last per key), and one record per batch with every batch delivered twice (the copy repeats only records already out, and every later step is
//! still Kafka's: the table applied each record once).

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use lambda_streams::driver::{Batching, TestDriver};
use lambda_streams::serdes::{DecimalI64, Nullable, Serde, Utf8};
use lambda_streams::{StreamsBuilder, Topology};

/// A record piped in: topic, key (`None`: a null key), value (`None`: a null value), timestamp.
type In = (&'static str, Option<i64>, Option<&'static str>, i64);
/// A record out: key, value (`None`: a tombstone), timestamp.
type Out = (Option<i64>, Option<String>, i64);

fn out(key: i64, value: &str, ts: i64) -> Out {
    (Some(key), Some(value.to_owned()), ts)
}

fn out_tomb(key: i64, ts: i64) -> Out {
    (Some(key), None, ts)
}

fn pipe(driver: &TestDriver, (topic, key, value, ts): &In) {
    driver
        .pipe(
            topic,
            0,
            Nullable(DecimalI64).serialize(key),
            value.map(|v| v.as_bytes().to_vec()),
            *ts,
        )
        .unwrap();
}

fn read(driver: &TestDriver, topic: &str) -> Vec<Out> {
    driver
        .output_topic(topic, Nullable(DecimalI64), Nullable(Utf8))
        .read_records()
        .unwrap()
        .into_iter()
        .map(|r| (r.key, r.value, r.timestamp.unwrap()))
        .collect()
}

/// Runs `input` through `topology()`, `expected[i]` being Kafka's records after input `i`:
/// one record per batch; in batches of consecutive records of one topic (the records of
/// such a batch together); and one record per batch, each delivered twice.
fn check(topology: impl Fn() -> Topology, output: &str, input: &[In], expected: &[Vec<Out>]) {
    check_with(topology, output, input, expected, false);
}

/// [`check`] for a table's changes: a batch emits one update per key, so in batches of
/// several records the last record per key equals Kafka's last.
fn check_table(topology: impl Fn() -> Topology, output: &str, input: &[In], expected: &[Vec<Out>]) {
    check_with(topology, output, input, expected, true);
}

fn last_per_key(records: Vec<Out>) -> BTreeMap<Option<i64>, Out> {
    records.into_iter().map(|r| (r.0, r)).collect()
}

fn check_with(
    topology: impl Fn() -> Topology,
    output: &str,
    input: &[In],
    expected: &[Vec<Out>],
    table: bool,
) {
    assert_eq!(input.len(), expected.len());
    let driver = TestDriver::new(topology());
    for (i, (record, expected)) in input.iter().zip(expected).enumerate() {
        pipe(&driver, record);
        assert_eq!(
            &read(&driver, output),
            expected,
            "one record per batch, input {i}"
        );
    }
    let driver = TestDriver::new(topology()).with_batching(Batching::Manual);
    let mut i = 0;
    while i < input.len() {
        let topic = input[i].0;
        let mut want = Vec::new();
        while i < input.len() && input[i].0 == topic {
            pipe(&driver, &input[i]);
            want.extend(expected[i].iter().cloned());
            i += 1;
        }
        driver.flush().unwrap();
        let got = read(&driver, output);
        if table {
            assert_eq!(
                last_per_key(got),
                last_per_key(want),
                "runs of one topic, ending at input {i}"
            );
        } else {
            assert_eq!(got, want, "runs of one topic, ending at input {i}");
        }
    }
    let driver = TestDriver::new(topology());
    for (i, (record, expected)) in input.iter().zip(expected).enumerate() {
        pipe(&driver, record);
        let first = read(&driver, output);
        assert_eq!(&first, expected, "redelivered batches, input {i}");
        driver.redeliver_last_batch().unwrap();
        let again = read(&driver, output);
        assert!(
            again.iter().all(|r| first.contains(r)),
            "redelivered input {i}: {again:?} not among {first:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// StreamTableJoinIntegrationTest (inputs of AbstractJoinIntegrationTest)
// ---------------------------------------------------------------------------------------

const LEFT: &str = "inputTopicLeft";
const RIGHT: &str = "inputTopicRight";
const OUTPUT: &str = "outputTopic";
/// `AbstractJoinIntegrationTest.ANY_UNIQUE_KEY`.
const KEY: i64 = 0;

/// `AbstractJoinIntegrationTest.input`: every record with key 0, timestamps out of order
/// towards the end ("out-of-order data with null as latest", "... with non-null as latest").
fn join_input() -> Vec<In> {
    let rows: [(&'static str, Option<&'static str>, i64); 23] = [
        (LEFT, None, 1),
        (RIGHT, None, 2),
        (LEFT, Some("A"), 3),
        (RIGHT, Some("a"), 4),
        (LEFT, Some("B"), 5),
        (RIGHT, Some("b"), 6),
        (LEFT, None, 7),
        (RIGHT, None, 8),
        (LEFT, Some("C"), 9),
        (RIGHT, Some("c"), 10),
        (RIGHT, None, 11),
        (LEFT, None, 12),
        (RIGHT, None, 13),
        (RIGHT, Some("d"), 7),
        (LEFT, Some("D"), 6),
        (LEFT, None, 2),
        (RIGHT, None, 3),
        (RIGHT, Some("e"), 14),
        (LEFT, Some("E"), 15),
        (LEFT, None, 10),
        (RIGHT, None, 9),
        (LEFT, Some("F"), 4),
        (RIGHT, Some("f"), 3),
    ];
    rows.iter()
        .map(|(topic, value, ts)| (*topic, Some(KEY), *value, *ts))
        .collect()
}

/// `leftStream.<join>(builder.table(right, Materialized.as(persistentVersionedKeyValueStore(
/// STORE_NAME, 5 min))), valueJoiner)` with `valueJoiner = (l, r) -> l + "-" + r`. A left
/// record with a null value joins nothing (Kafka drops it): `flat_map_values` drops it here.
fn versioned_join_topology(left: bool) -> impl Fn() -> Topology {
    move || {
        let builder = StreamsBuilder::new();
        let table = builder.versioned_table(
            RIGHT,
            Nullable(DecimalI64),
            Utf8,
            "versioned",
            Duration::from_secs(300),
        );
        let stream = builder
            .stream(LEFT, Nullable(DecimalI64), Nullable(Utf8))
            .flat_map_values(|v: Option<String>| v);
        let joined = if left {
            stream.left_join(&table, |_, l: String, r: Option<String>| {
                format!("{l}-{}", r.as_deref().unwrap_or("null"))
            })
        } else {
            stream.join(&table, |_, l: String, r: String| format!("{l}-{r}"))
        };
        joined.to(OUTPUT, Nullable(DecimalI64), Utf8);
        builder.build()
    }
}

/// Kafka's expected list: the record after each input (`None`: nothing).
fn expected_after(rows: [Option<(&str, i64)>; 23]) -> Vec<Vec<Out>> {
    rows.iter()
        .map(|r| r.map(|(v, ts)| vec![out(KEY, v, ts)]).unwrap_or_default())
        .collect()
}

/// Kafka: `StreamTableJoinIntegrationTest.testInnerWithVersionedStore`: each left record
/// joins the table's value as of its own timestamp ("D" at 6 finds "b", valid 6..7, though
/// the latest is a tombstone; "F" at 4 finds "a").
#[test]
fn stream_table_join_integration_test_inner_with_versioned_store() {
    let expected = expected_after([
        None,
        None,
        None,
        None,
        Some(("B-a", 5)),
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        Some(("D-b", 6)),
        None,
        None,
        None,
        Some(("E-e", 15)),
        None,
        None,
        Some(("F-a", 4)),
        None,
    ]);
    check(
        versioned_join_topology(false),
        OUTPUT,
        &join_input(),
        &expected,
    );
}

/// Kafka: `StreamTableJoinIntegrationTest.testLeftWithVersionedStore`.
#[test]
fn stream_table_join_integration_test_left_with_versioned_store() {
    let expected = expected_after([
        None,
        None,
        Some(("A-null", 3)),
        None,
        Some(("B-a", 5)),
        None,
        None,
        None,
        Some(("C-null", 9)),
        None,
        None,
        None,
        None,
        None,
        Some(("D-b", 6)),
        None,
        None,
        None,
        Some(("E-e", 15)),
        None,
        None,
        Some(("F-a", 4)),
        None,
    ]);
    check(
        versioned_join_topology(true),
        OUTPUT,
        &join_input(),
        &expected,
    );
}

/// Not in Kafka's tests, the same semantics by hand: a join reads a versioned table
/// through `filter` and `map_values` as of the stream record's time (Kafka's
/// `KTableFilter` and `KTableMapValues` value getters are versioned when their parent is:
/// `isVersioned()` returns the parent's).
#[test]
fn a_join_reads_a_filtered_and_mapped_versioned_table_as_of_the_stream_record() {
    let topology = || {
        let builder = StreamsBuilder::new();
        let table = builder
            .versioned_table(
                RIGHT,
                Nullable(DecimalI64),
                Utf8,
                "v",
                Duration::from_secs(60),
            )
            .filter(|_, v| v != "skip")
            .map_values(|v| v.to_uppercase());
        builder
            .stream(LEFT, Nullable(DecimalI64), Utf8)
            .left_join(&table, |_, l: String, r: Option<String>| {
                format!("{l}-{}", r.as_deref().unwrap_or("null"))
            })
            .to(OUTPUT, Nullable(DecimalI64), Utf8);
        builder.build()
    };
    let input: Vec<In> = vec![
        (RIGHT, Some(1), Some("a"), 10),
        (RIGHT, Some(1), Some("skip"), 20),
        (RIGHT, Some(1), Some("c"), 30),
        (LEFT, Some(1), Some("x"), 5),
        (LEFT, Some(1), Some("y"), 15),
        (LEFT, Some(1), Some("z"), 25),
        (LEFT, Some(1), Some("w"), 35),
        // Out of order in the table: "b" at 12 splits "a"'s validity.
        (RIGHT, Some(1), Some("b"), 12),
        (LEFT, Some(1), Some("v"), 13),
        (LEFT, Some(1), Some("u"), 11),
    ];
    let expected = vec![
        vec![],
        vec![],
        vec![],
        vec![out(1, "x-null", 5)],
        vec![out(1, "y-A", 15)],
        vec![out(1, "z-null", 25)],
        vec![out(1, "w-C", 35)],
        vec![],
        vec![out(1, "v-B", 13)],
        vec![out(1, "u-A", 11)],
    ];
    check(topology, OUTPUT, &input, &expected);
}

// ---------------------------------------------------------------------------------------
// KTableFilterTest, KTableSourceTest on a versioned table
// ---------------------------------------------------------------------------------------

/// Kafka: `KTableFilterTest.shouldNotSkipNullIfVersionedUpstream`: a filter on a versioned
/// table forwards a deletion for every rejected value, also for keys that had none (Kafka's
/// second processor sees `(A, null)`, `(B, null)`, `(C, null)` at 5, 10, 20). Kafka's test
/// reads the filter's changes in a processor; here its change stream.
#[test]
fn ktable_filter_should_not_skip_null_if_versioned_upstream() {
    let topology = || {
        let builder = StreamsBuilder::new();
        builder
            .versioned_table(
                "topic1",
                Nullable(DecimalI64),
                Utf8,
                "versioned",
                Duration::from_secs(300),
            )
            .filter(|_, v| v.eq_ignore_ascii_case("accept"))
            .to_change_stream()
            .to(OUTPUT, Nullable(DecimalI64), Nullable(Utf8));
        builder.build()
    };
    // Kafka's keys "A", "B", "C" as 1, 2, 3.
    let input: Vec<In> = vec![
        ("topic1", Some(1), Some("reject"), 5),
        ("topic1", Some(2), Some("reject"), 10),
        ("topic1", Some(3), Some("reject"), 20),
    ];
    let expected = vec![
        vec![out_tomb(1, 5)],
        vec![out_tomb(2, 10)],
        vec![out_tomb(3, 20)],
    ];
    check_table(topology, OUTPUT, &input, &expected);
}

/// Kafka: the inputs of `KTableSourceTest.kTableShouldLogOnOutOfOrder` (which reads a plain
/// table), on a versioned table; Kafka's records, in the comments, are what its
/// `KTableSource` forwards for a versioned store (read from its code, not asserted by a
/// Kafka test). The update at 5, older than the latest at 10, does not replace it.
/// **Difference kept on purpose**:
/// Kafka's `KTableSource` forwards the out-of-order record itself (`(1, "value5", 5)`,
/// marked not latest, which `toStream` passes on and table–table joins drop); a batch here
/// emits the key's value after the batch, which is still the latest, so it re-emits
/// `(1, "value10", 10)` (docs/kafka-streams-differences.md, "Versioned tables").
#[test]
fn ktable_source_should_log_on_out_of_order_versioned() {
    let topology = || {
        let builder = StreamsBuilder::new();
        builder
            .versioned_table(
                "topic1",
                Nullable(DecimalI64),
                Utf8,
                "versioned",
                Duration::from_secs(300),
            )
            .to_change_stream()
            .to(OUTPUT, Nullable(DecimalI64), Nullable(Utf8));
        builder.build()
    };
    let input: Vec<In> = vec![
        ("topic1", Some(1), Some("value10"), 10),
        ("topic1", Some(1), Some("value5"), 5),
        ("topic1", Some(1), None, 7),
        ("topic1", Some(1), None, 12),
    ];
    let expected = vec![
        vec![out(1, "value10", 10)],
        // Kafka: (1, "value5", 5).
        vec![out(1, "value10", 10)],
        // Kafka: (1, null, 7).
        vec![out(1, "value10", 10)],
        vec![out_tomb(1, 12)],
    ];
    check_table(topology, OUTPUT, &input, &expected);
}

// ---------------------------------------------------------------------------------------
// Grace periods: KStreamKTableJoinTest, StreamTableJoinWithGraceIntegrationTest
// ---------------------------------------------------------------------------------------

/// One step of a Kafka test: the records it pipes, then the records it asserts.
type Step = (Vec<In>, Vec<Out>);

/// Runs `steps` through `topology()`: one record per batch (the records out during a step
/// equal Kafka's, in order), one batch per step (the same), and one record per batch with
/// every batch delivered twice (the copy emits nothing new, and every step is Kafka's).
fn check_steps(topology: impl Fn() -> Topology, output: &str, steps: &[Step]) {
    let driver = TestDriver::new(topology());
    for (i, (input, expected)) in steps.iter().enumerate() {
        input.iter().for_each(|r| pipe(&driver, r));
        assert_eq!(
            &read(&driver, output),
            expected,
            "one record per batch, step {i}"
        );
    }
    let driver = TestDriver::new(topology()).with_batching(Batching::Manual);
    for (i, (input, expected)) in steps.iter().enumerate() {
        input.iter().for_each(|r| pipe(&driver, r));
        driver.flush().unwrap();
        assert_eq!(
            &read(&driver, output),
            expected,
            "one batch per step, step {i}"
        );
    }
    let driver = TestDriver::new(topology());
    for (i, (input, expected)) in steps.iter().enumerate() {
        let mut got = Vec::new();
        for r in input {
            pipe(&driver, r);
            let first = read(&driver, output);
            driver.redeliver_last_batch().unwrap();
            let again = read(&driver, output);
            assert!(
                again.iter().all(|r| first.contains(r)),
                "redelivered step {i}: {again:?} not among {first:?}"
            );
            got.extend(first);
        }
        assert_eq!(&got, expected, "redelivered batches, step {i}");
    }
}

const STREAM: &str = "streamTopic";
const TABLE2: &str = "tableTopic2";

/// Kafka's `KStreamKTableJoinTest.makeJoin(grace)`: `stream.join(builder.table("tableTopic2",
/// Materialized.as(persistentVersionedKeyValueStore("V-grace", 5 min))), TOSTRING_JOINER,
/// Joined.with(.., "Grace", grace))`, `TOSTRING_JOINER` giving `value1 + "+" + value2`.
fn grace_topology(grace: Duration) -> impl Fn() -> Topology {
    move || {
        let builder = StreamsBuilder::new();
        let table = builder.versioned_table(
            TABLE2,
            Nullable(DecimalI64),
            Utf8,
            "V-grace",
            Duration::from_secs(300),
        );
        builder
            .stream(STREAM, Nullable(DecimalI64), Utf8)
            .join_with_grace(
                &table,
                grace,
                "Grace",
                (Nullable(DecimalI64), Utf8),
                |_, v: String, t: String| format!("{v}+{t}"),
            )
            .to(OUTPUT, Nullable(DecimalI64), Utf8);
        builder.build()
    }
}

/// Kafka's `pushToStream(n, prefix)`: key `i`, value `prefix + i`, timestamp `i`.
fn push_to_stream(n: i64, prefix: &'static str) -> Vec<In> {
    (0..n)
        .map(|i| (STREAM, Some(i), Some(leak(format!("{prefix}{i}"))), i))
        .collect()
}

/// Kafka's `pushToTableNonRandom(n, prefix)`: key `i`, value `prefix + i`, timestamp 0.
fn push_to_table_non_random(n: i64, prefix: &'static str) -> Vec<In> {
    (0..n)
        .map(|i| (TABLE2, Some(i), Some(leak(format!("{prefix}{i}"))), 0))
        .collect()
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// Kafka: `KStreamKTableJoinTest.shouldDelayJoinByGracePeriod`: with a grace of 2 ms, a
/// stream record joins once the stream time reaches its timestamp + 2, as of its timestamp,
/// and the records released together come out in timestamp order.
#[test]
fn kstream_ktable_join_should_delay_join_by_grace_period() {
    check_steps(
        grace_topology(Duration::from_millis(2)),
        OUTPUT,
        &[
            (push_to_table_non_random(4, "Y"), vec![]),
            (
                push_to_stream(4, "X"),
                vec![out(0, "X0+Y0", 0), out(1, "X1+Y1", 1)],
            ),
            (push_to_table_non_random(4, "YY"), vec![]),
            (
                push_to_stream(4, "X"),
                vec![out(0, "X0+YY0", 0), out(1, "X1+YY1", 1)],
            ),
            (
                vec![(STREAM, Some(5), Some("test"), 7)],
                vec![
                    out(2, "X2+YY2", 2),
                    out(2, "X2+YY2", 2),
                    out(3, "X3+YY3", 3),
                    out(3, "X3+YY3", 3),
                ],
            ),
            (push_to_table_non_random(4, "YYY"), vec![]),
        ],
    );
}

/// Kafka: `KStreamKTableJoinTest.shouldHandleLateJoinsWithGracePeriod`: a record later than
/// the grace joins at once (here: at the end of its own batch) and releases nothing else.
#[test]
fn kstream_ktable_join_should_handle_late_joins_with_grace_period() {
    check_steps(
        grace_topology(Duration::from_millis(2)),
        OUTPUT,
        &[
            (push_to_table_non_random(4, "Y"), vec![]),
            (
                push_to_stream(4, "X"),
                vec![out(0, "X0+Y0", 0), out(1, "X1+Y1", 1)],
            ),
            (push_to_stream(1, "X"), vec![out(0, "X0+Y0", 0)]),
        ],
    );
}

/// `StreamTableJoinWithGraceIntegrationTest`'s topology: the versioned table of
/// [`versioned_join_topology`], joined with `Joined.with(.., "Grace", 2 ms)`.
fn grace_join_topology(left: bool) -> impl Fn() -> Topology {
    move || {
        let builder = StreamsBuilder::new();
        let table = builder.versioned_table(
            RIGHT,
            Nullable(DecimalI64),
            Utf8,
            "table-store",
            Duration::from_secs(300),
        );
        let stream = builder
            .stream(LEFT, Nullable(DecimalI64), Nullable(Utf8))
            .flat_map_values(|v: Option<String>| v);
        let grace = Duration::from_millis(2);
        let serdes = (Nullable(DecimalI64), Utf8);
        let joined = if left {
            stream.left_join_with_grace(
                &table,
                grace,
                "Grace",
                serdes,
                |_, l: String, r: Option<String>| format!("{l}-{}", r.as_deref().unwrap_or("null")),
            )
        } else {
            stream.join_with_grace(&table, grace, "Grace", serdes, |_, l: String, r: String| {
                format!("{l}-{r}")
            })
        };
        joined.to(OUTPUT, Nullable(DecimalI64), Utf8);
        builder.build()
    }
}

/// Kafka: `StreamTableJoinWithGraceIntegrationTest.testInnerWithVersionedStore`: the same
/// records with the same timestamps ("B-a" at 5, "D-b" at 6, "F-a" at 4; "E" at 15 still
/// waits at the end). **Difference kept on purpose**: "B-a" comes out one input earlier
/// than in Kafka (after the null-valued left record at 7, not after "C" at 9). Kafka's buffer
/// counts its stream time from the records that reach it, and a null value is dropped
/// before; here the join's time is its source partitions' stream time, which every record
/// moves (docs/kafka-streams-differences.md, "Versioned tables").
#[test]
fn stream_table_join_with_grace_integration_test_inner_with_versioned_store() {
    let expected = expected_after([
        None,
        None,
        None,
        None,
        None,
        None,
        // Kafka: at the next input but one ("C" at 9).
        Some(("B-a", 5)),
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        Some(("D-b", 6)),
        None,
        None,
        None,
        None,
        None,
        None,
        Some(("F-a", 4)),
        None,
    ]);
    check(grace_join_topology(false), OUTPUT, &join_input(), &expected);
}

/// Kafka: `StreamTableJoinWithGraceIntegrationTest.testLeftWithVersionedStore`: the same
/// records with the same timestamps; "B-a" and "C-null" come out earlier than in Kafka, for
/// the reason given at the inner join's test ("C-null" after the null-valued record at 12,
/// Kafka after "E" at 15).
#[test]
fn stream_table_join_with_grace_integration_test_left_with_versioned_store() {
    let expected = expected_after([
        None,
        None,
        None,
        None,
        Some(("A-null", 3)),
        None,
        // Kafka: after input 8.
        Some(("B-a", 5)),
        None,
        None,
        None,
        None,
        // Kafka: after input 18.
        Some(("C-null", 9)),
        None,
        None,
        Some(("D-b", 6)),
        None,
        None,
        None,
        None,
        None,
        None,
        Some(("F-a", 4)),
        None,
    ]);
    check(grace_join_topology(true), OUTPUT, &join_input(), &expected);
}

/// The refusals of a grace period, with Kafka's messages.
fn refusal(
    table: impl Fn(&StreamsBuilder) -> lambda_streams::dsl::KTable<String, String>,
    grace: Duration,
) -> Option<String> {
    let builder = StreamsBuilder::new();
    let table = table(&builder);
    builder
        .stream("topic", Utf8, Utf8)
        .join_with_grace(
            &table,
            grace,
            "first-join",
            (Utf8, Utf8),
            |_, a: String, b: String| a + &b,
        )
        .to("out-one", Utf8, Utf8);
    builder.try_build().err().map(|e| e.reason)
}

/// Kafka: `KStreamKTableJoinTest.shouldFailIfTableIsNotVersioned`.
#[test]
fn kstream_ktable_join_should_fail_if_table_is_not_versioned() {
    assert_eq!(
        refusal(
            |b| b.table("topic2", Utf8, Utf8, "tableB"),
            Duration::from_millis(6)
        )
        .as_deref(),
        Some("KTable must be versioned to use a grace period in a stream table join.")
    );
}

/// Kafka: `KStreamKTableJoinTest.shouldFailIfTableIsNotVersionedButMaterializationIsInherited`.
#[test]
fn kstream_ktable_join_should_fail_if_table_is_not_versioned_but_materialization_is_inherited() {
    assert_eq!(
        refusal(
            |b| b.table("topic2", Utf8, Utf8, "tableB").filter(|_, _| true),
            Duration::from_millis(6)
        )
        .as_deref(),
        Some("KTable must be versioned to use a grace period in a stream table join.")
    );
}

/// Kafka: `KStreamKTableJoinTest.shouldNotFailIfTableIsVersionedButMaterializationIsInherited`.
#[test]
fn kstream_ktable_join_should_not_fail_if_table_is_versioned_but_materialization_is_inherited() {
    assert_eq!(
        refusal(
            |b| {
                b.versioned_table("topic2", Utf8, Utf8, "tableB", Duration::from_secs(300))
                    .filter(|_, _| true)
            },
            Duration::from_millis(6)
        ),
        None
    );
}

/// Kafka: `KStreamKTableJoinTest.shouldFailIfGracePeriodIsLongerThanHistoryRetention`.
#[test]
fn kstream_ktable_join_should_fail_if_grace_period_is_longer_than_history_retention() {
    assert_eq!(
        refusal(
            |b| b.versioned_table("topic2", Utf8, Utf8, "tableB", Duration::from_secs(300)),
            Duration::from_secs(360)
        )
        .as_deref(),
        Some("History retention must be at least grace period.")
    );
}

/// Kafka: `KStreamKTableJoinTest.shouldFailIfGracePeriodIsLongerThanHistoryRetentionAndInheritedStore`.
#[test]
fn kstream_ktable_join_should_fail_if_grace_period_is_longer_than_history_retention_and_inherited_store()
 {
    assert_eq!(
        refusal(
            |b| {
                b.versioned_table("topic2", Utf8, Utf8, "V-grace", Duration::ZERO)
                    .filter(|_, _| true)
            },
            Duration::from_millis(6)
        )
        .as_deref(),
        Some("History retention must be at least grace period.")
    );
}

/// A grace join's results come from the closing pass, with no source record: an
/// aggregation of them is refused at build, as of a left or outer stream–stream join's.
#[test]
fn a_grace_joins_output_cannot_be_aggregated() {
    let builder = StreamsBuilder::new();
    let table = builder.versioned_table("t", Utf8, Utf8, "t", Duration::from_secs(60));
    builder
        .stream("s", Utf8, Utf8)
        .join_with_grace(
            &table,
            Duration::from_secs(1),
            "g",
            (Utf8, Utf8),
            |_, a: String, b: String| a + &b,
        )
        .group_by_key(Utf8)
        .count("counts");
    let refused = builder.try_build().err().expect("refused");
    assert!(refused.reason.contains("closing pass"), "{refused}");
}

// ---------------------------------------------------------------------------------------
// Not in Kafka's tests: the item limit
// ---------------------------------------------------------------------------------------

/// A versioned table keeps every version its retention reaches in the key's one item: the
/// table record that would take the item past DynamoDB's 400 KB is a poison record, named
/// by its topic-partition and offset (with the default `fail` policy the batch fails), and
/// no version is dropped to make room.
#[test]
fn a_versioned_table_record_that_would_pass_400_kb_is_a_poison_record() {
    let builder = StreamsBuilder::new();
    let table = builder.versioned_table(
        RIGHT,
        Nullable(DecimalI64),
        Utf8,
        "big",
        Duration::from_secs(3600),
    );
    builder
        .stream(LEFT, Nullable(DecimalI64), Utf8)
        .join(&table, |_, l: String, r: String| {
            format!("{l}-{}", r.chars().last().unwrap_or('?'))
        })
        .to(OUTPUT, Nullable(DecimalI64), Utf8);
    let driver = TestDriver::new(builder.build());
    let big = "x".repeat(100_000);
    for i in 0..4 {
        pipe(
            &driver,
            &(RIGHT, Some(1), Some(leak(format!("{big}{i}"))), 1_000 * i),
        );
    }
    // Every version is there: as of 1.5 s, the one from 1 s.
    pipe(&driver, &(LEFT, Some(1), Some("at"), 1_500));
    assert_eq!(read(&driver, OUTPUT), [out(1, "at-1", 1_500)]);
    // The fifth version (offset 4) would make the item about 500 KB.
    let error = driver
        .pipe(
            RIGHT,
            0,
            Nullable(DecimalI64).serialize(&Some(1)),
            Some(big.into_bytes()),
            5_000,
        )
        .unwrap_err()
        .to_string();
    assert!(
        error.contains(&format!("{RIGHT}-0")) && error.contains("offset 4"),
        "{error}"
    );
    assert!(error.contains("400 KB"), "{error}");
}
