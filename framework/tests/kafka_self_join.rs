//! Kafka Streams' `KStreamKStreamSelfJoinTest`, ported (issue 18): a stream joined with
//! itself (Kafka's self-join optimization must give the records of the plain inner join of
//! the topic with itself). Kafka's test computes its expected records by running that inner
//! join; here they are written out, derived by hand from Kafka 4's `KStreamKStreamJoin`
//! (for a record `r`: `r + o` for each record `o` of the key already in the window, in
//! timestamp order, then `o + r` for each of them with `r + r` in its timestamp place, each
//! at the later of the two timestamps; a record the window store has expired (older than
//! stream time − before − after − grace) neither joins itself nor is kept).
//! The joiner is Kafka's `(v, v2) -> v + v2`. One record per batch, checked after each
//! record in order; in batches of 2, 3 and all records, the same records as a multiset.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use lambda_streams::StreamsBuilder;
use lambda_streams::driver::{Batching, TestDriver};
use lambda_streams::dsl::JoinWindows;
use lambda_streams::serdes::Utf8;

/// A record in or out: key, value, timestamp.
type Rec = (&'static str, &'static str, i64);

/// The topology: `topic1` joined with itself (`two_streams`: read by two `stream` calls,
/// Kafka's `shouldMatchInnerJoinWithSelfJoinWithTwoStreams`), inner join in `windows`.
fn driver(windows: JoinWindows, two_streams: bool, batching: Batching) -> TestDriver {
    let builder = StreamsBuilder::new();
    let stream1 = builder.stream("topic1", Utf8, Utf8);
    let joiner = |_: &String, a: &String, b: &String| format!("{a}{b}");
    let joined = if two_streams {
        let stream2 = builder.stream("topic1", Utf8, Utf8);
        stream1.join_stream(&stream2, windows, "self", (Utf8, Utf8, Utf8), joiner)
    } else {
        stream1.join_stream(&stream1, windows, "self", (Utf8, Utf8, Utf8), joiner)
    };
    joined.to("joined", Utf8, Utf8);
    TestDriver::new(builder.build()).with_batching(batching)
}

fn read(driver: &TestDriver) -> Vec<(String, String, i64)> {
    driver
        .output_topic("joined", Utf8, Utf8)
        .read_records()
        .unwrap()
        .into_iter()
        .map(|r| (r.key, r.value, r.timestamp.unwrap_or(-1)))
        .collect()
}

fn owned(records: &[Rec]) -> Vec<(String, String, i64)> {
    records
        .iter()
        .map(|(k, v, t)| ((*k).to_owned(), (*v).to_owned(), *t))
        .collect()
}

/// Pipes `script` (each input with the records it must produce) one record per batch,
/// then in larger batches.
fn check(windows: impl Fn() -> JoinWindows, two_streams: bool, script: &[(Rec, Vec<Rec>)]) {
    check_batched(windows, two_streams, script, script.len());
}

/// As [`check`], with the larger batches run on the first `batched` records only.
fn check_batched(
    windows: impl Fn() -> JoinWindows,
    two_streams: bool,
    script: &[(Rec, Vec<Rec>)],
    batched: usize,
) {
    let d = driver(windows(), two_streams, Batching::PerRecord);
    let mut input = d.input_topic("topic1", Utf8, Utf8);
    for (i, ((k, v, t), want)) in script.iter().enumerate() {
        input
            .pipe_input_with_timestamp((*k).to_owned(), (*v).to_owned(), *t)
            .unwrap();
        assert_eq!(read(&d), owned(want), "one record per batch, record {i}");
    }
    let script = &script[..batched];
    let mut all: Vec<_> = script.iter().flat_map(|(_, want)| owned(want)).collect();
    all.sort();
    for size in [2, 3, script.len()] {
        let d = driver(windows(), two_streams, Batching::Size(size));
        let mut input = d.input_topic("topic1", Utf8, Utf8);
        for ((k, v, t), _) in script {
            input
                .pipe_input_with_timestamp((*k).to_owned(), (*v).to_owned(), *t)
                .unwrap();
        }
        if d.pending() > 0 {
            d.flush().unwrap();
        }
        let mut got = read(&d);
        got.sort();
        assert_eq!(got, all, "batches of {size}");
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The input of `shouldMatchInnerJoinWithSelfJoinWithSingleStream` and `…WithTwoStreams`
/// (window 100 ms, no grace) and the inner join's records.
fn single_and_two_streams_script() -> Vec<(Rec, Vec<Rec>)> {
    vec![
        (("A", "1", 1), vec![("A", "11", 1)]),
        (("B", "1", 2), vec![("B", "11", 2)]),
        (
            ("A", "2", 3),
            vec![("A", "21", 3), ("A", "12", 3), ("A", "22", 3)],
        ),
        (
            ("B", "2", 4),
            vec![("B", "21", 4), ("B", "12", 4), ("B", "22", 4)],
        ),
        (
            ("B", "3", 5),
            vec![
                ("B", "31", 5),
                ("B", "32", 5),
                ("B", "13", 5),
                ("B", "23", 5),
                ("B", "33", 5),
            ],
        ),
    ]
}

/// Kafka: `KStreamKStreamSelfJoinTest.shouldMatchInnerJoinWithSelfJoinWithSingleStream`.
#[test]
fn self_join_with_single_stream() {
    check(
        || JoinWindows::of(ms(100)),
        false,
        &single_and_two_streams_script(),
    );
}

/// Kafka: `KStreamKStreamSelfJoinTest.shouldMatchInnerJoinWithSelfJoinWithTwoStreams`.
#[test]
fn self_join_with_two_streams() {
    check(
        || JoinWindows::of(ms(100)),
        true,
        &single_and_two_streams_script(),
    );
}

/// Kafka: `KStreamKStreamSelfJoinTest.shouldMatchInnerJoinWithSelfJoinDifferentBeforeAfterWindows`
/// (`ofTimeDifferenceAndGrace(11 s, 10 s)`).
#[test]
fn self_join_different_before_after_windows() {
    let five_way = |k, t| {
        vec![
            (k, "42", t),
            (k, "43", t),
            (k, "24", t),
            (k, "34", t),
            (k, "44", t),
        ]
    };
    check(
        || JoinWindows::of(ms(11_000)).grace(ms(10_000)),
        true,
        &[
            (("A", "1", 0), vec![("A", "11", 0)]),
            (
                ("A", "2", 11_000),
                vec![
                    ("A", "21", 11_000),
                    ("A", "12", 11_000),
                    ("A", "22", 11_000),
                ],
            ),
            (("B", "1", 12_000), vec![("B", "11", 12_000)]),
            // 0 is more than 11 s before 13 s.
            (
                ("A", "3", 13_000),
                vec![
                    ("A", "32", 13_000),
                    ("A", "23", 13_000),
                    ("A", "33", 13_000),
                ],
            ),
            (("A", "4", 15_000), five_way("A", 15_000)),
            (("C", "1", 16_000), vec![("C", "11", 16_000)]),
            (("D", "1", 17_000), vec![("D", "11", 17_000)]),
            (("A", "5", 30_000), vec![("A", "55", 30_000)]),
        ],
    );
}

/// Kafka: `KStreamKStreamSelfJoinTest.shouldMatchInnerJoinWithSelfJoinOutOfOrderMessages`
/// (`ofTimeDifferenceWithNoGrace(10 s)`): Kafka's records one record per batch. Its last
/// record, `A:5` at 6 s, arrives at stream time 30 s: in a batch that also holds the record
/// at 30 s, the join's buffers are still those of the stream time before the batch (17 s),
/// so it also joins 0 s, 9.999 s and itself, which Kafka's window store had expired (a
/// documented difference: docs/kafka-streams-differences.md, "Stream–stream joins").
#[test]
fn self_join_out_of_order_messages() {
    let five_way = |k, t| {
        vec![
            (k, "42", t),
            (k, "43", t),
            (k, "24", t),
            (k, "34", t),
            (k, "44", t),
        ]
    };
    let mut script = vec![
        (("A", "1", 0), vec![("A", "11", 0)]),
        (
            ("A", "2", 9_999),
            vec![("A", "21", 9_999), ("A", "12", 9_999), ("A", "22", 9_999)],
        ),
        (("B", "1", 11_000), vec![("B", "11", 11_000)]),
        (
            ("A", "3", 13_000),
            vec![
                ("A", "32", 13_000),
                ("A", "23", 13_000),
                ("A", "33", 13_000),
            ],
        ),
        (("A", "4", 15_000), five_way("A", 15_000)),
        (("C", "1", 16_000), vec![("C", "11", 16_000)]),
        (("D", "1", 17_000), vec![("D", "11", 17_000)]),
        (("A", "5", 30_000), vec![("A", "55", 30_000)]),
    ];
    // Kafka: the window store (retention before + after + grace = 20 s) still holds 13 s
    // and 15 s at stream time 30 s, and `A:5` at 6 s joins them both ways ("53", "54",
    // "35", "45" at 13 s and 15 s); it is itself expired (6 s < 30 s - 20 s + 1), so it
    // joins neither itself nor a later record.
    script.push((
        ("A", "5", 6_000),
        vec![
            ("A", "53", 13_000),
            ("A", "54", 15_000),
            ("A", "35", 13_000),
            ("A", "45", 15_000),
        ],
    ));
    let windows = || JoinWindows::of(ms(10_000));
    check_batched(windows, true, &script, script.len() - 1);
    // Ours in batches of 3: the last batch is D:1, A:5 at 30 s and A:5 at 6 s.
    let d = driver(windows(), true, Batching::Size(3));
    let mut input = d.input_topic("topic1", Utf8, Utf8);
    for ((k, v, t), _) in &script {
        input
            .pipe_input_with_timestamp((*k).to_owned(), (*v).to_owned(), *t)
            .unwrap();
    }
    let mut got = read(&d);
    got.sort();
    let mut want: Vec<_> = script.iter().flat_map(|(_, want)| owned(want)).collect();
    want.extend(owned(&[
        ("A", "51", 6_000),
        ("A", "15", 6_000),
        ("A", "52", 9_999),
        ("A", "25", 9_999),
        ("A", "55", 6_000),
    ]));
    want.sort();
    assert_eq!(got, want);
}
