//! Stream–stream joins, hand-counted cases of Kafka Streams' semantics (one per root cause
//! the generative test found):
//! - a self-join (`s.join(s, ..)`): Kafka Streams' this-side and other-side processors both
//!   see every record, so each record also joins its own copy, and every ordered pair of
//!   records of a key within the window is emitted once;
//! - a source record that reaches a join as several records (`flat_map_values`) has each
//!   of its pairs, and each of its records emitted alone, once;
//! - a pair's timestamp is the later of its two records' (`KStreamKStreamJoin`:
//!   `max(inputRecordTimestamp, otherRecordTimestamp)`), whichever of them arrives last; a
//!   record emitted alone keeps its own.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use lambda_streams::driver::{Batching, TestDriver};
use lambda_streams::dsl::{JoinWindows, KStream};
use lambda_streams::serdes::Utf8;
use lambda_streams::{StreamsBuilder, Topology};

#[derive(Clone, Copy, Debug)]
enum Kind {
    Inner,
    Left,
    Outer,
}

fn windows() -> JoinWindows {
    JoinWindows::of(Duration::from_secs(10))
}

fn part(v: Option<&String>) -> &str {
    v.map_or("none", String::as_str)
}

/// `left` joined with `right` (`kind`), the results `<left>+<right>` to `joined`.
fn join(left: &KStream<String, String>, right: &KStream<String, String>, kind: Kind) {
    let serdes = (Utf8, Utf8, Utf8);
    let joined = match kind {
        Kind::Inner => left.join_stream(right, windows(), "pairs", serdes, |_, l, r| {
            format!("{l}+{r}")
        }),
        Kind::Left => left.left_join_stream(right, windows(), "pairs", serdes, |_, l, r| {
            format!("{l}+{}", part(r))
        }),
        Kind::Outer => left.outer_join_stream(right, windows(), "pairs", serdes, |_, l, r| {
            format!("{}+{}", part(l), part(r))
        }),
    };
    joined.to("joined", Utf8, Utf8);
}

fn self_join(kind: Kind) -> Topology {
    let builder = StreamsBuilder::new();
    let s = builder.stream("s", Utf8, Utf8);
    join(&s, &s, kind);
    builder.build()
}

fn sorted_values(driver: &TestDriver) -> Vec<String> {
    let mut values = driver
        .output_topic("joined", Utf8, Utf8)
        .read_values()
        .unwrap();
    values.sort();
    values
}

#[test]
fn a_self_join_emits_every_pair_once_and_each_record_joins_itself() {
    // s: a=1@1s, a=2@5s, b=3@6s, a=4@30s. By hand, every (this, other) pair of one key
    // within 10 s: (1,1) (1,2) (2,1) (2,2) (3,3) (4,4); 4 is 25 s from 2.
    let expected = ["1+1", "1+2", "2+1", "2+2", "3+3", "4+4"];
    for kind in [Kind::Inner, Kind::Left, Kind::Outer] {
        for batching in [Batching::PerRecord, Batching::Manual] {
            let driver = TestDriver::new(self_join(kind)).with_batching(batching);
            let mut s = driver.input_topic("s", Utf8, Utf8);
            for (k, v, ts) in [("a", "1", 1_000), ("a", "2", 5_000), ("b", "3", 6_000)] {
                s.pipe_input_with_timestamp(k, v.to_owned(), ts).unwrap();
            }
            s.pipe_input_with_timestamp("a", "4".to_owned(), 30_000)
                .unwrap();
            driver.flush().unwrap();
            // Every record joined (itself at least): none is emitted alone.
            assert_eq!(sorted_values(&driver), expected, "{kind:?} {batching:?}");
        }
    }
}

#[test]
fn a_fanned_out_record_has_each_of_its_outputs_emitted_once() {
    // l: a=1@1s fanned out to 1 and 10; then a=2@20s (2, 20: no partner within 10 s);
    // then a=3@60s (3, 30). r: a=5@2s, piped before l, so that l's records emit the pairs;
    // then b=9@60s, after which both topics are at 60 s: the join's closing time closes
    // 2 and 20 (20 s + 10 s < 60 s).
    for kind in [Kind::Inner, Kind::Left, Kind::Outer] {
        let builder = StreamsBuilder::new();
        let l = builder
            .stream("l", Utf8, Utf8)
            .flat_map_values(|v: String| vec![v.clone(), format!("{v}0")]);
        let r = builder.stream("r", Utf8, Utf8);
        join(&l, &r, kind);
        let driver = TestDriver::new(builder.build());
        driver
            .input_topic("r", Utf8, Utf8)
            .pipe_input_with_timestamp("a", "5".to_owned(), 2_000)
            .unwrap();
        let mut left = driver.input_topic("l", Utf8, Utf8);
        for (v, ts) in [("1", 1_000), ("2", 20_000), ("3", 60_000)] {
            left.pipe_input_with_timestamp("a", v.to_owned(), ts)
                .unwrap();
        }
        driver
            .input_topic("r", Utf8, Utf8)
            .pipe_input_with_timestamp("b", "9".to_owned(), 60_000)
            .unwrap();
        let expected: &[&str] = match kind {
            Kind::Inner => &["1+5", "10+5"],
            Kind::Left | Kind::Outer => &["1+5", "10+5", "2+none", "20+none"],
        };
        assert_eq!(sorted_values(&driver), expected, "{kind:?}");
    }
}

#[test]
fn a_pair_carries_the_later_timestamp_whichever_record_arrives_last() {
    // r: a=R@5s, then l: a=L@1s (a later batch: L emits the pair, at 5 s, not its own
    // 1 s); then l: a=X@20s (no partner), l: a=Y@60s and r: b=Z@60s, after which both
    // topics are at 60 s, which closes X: X alone keeps its own 20 s.
    for kind in [Kind::Inner, Kind::Left, Kind::Outer] {
        let builder = StreamsBuilder::new();
        let l = builder.stream("l", Utf8, Utf8);
        let r = builder.stream("r", Utf8, Utf8);
        join(&l, &r, kind);
        let driver = TestDriver::new(builder.build());
        driver
            .input_topic("r", Utf8, Utf8)
            .pipe_input_with_timestamp("a", "R".to_owned(), 5_000)
            .unwrap();
        let mut left = driver.input_topic("l", Utf8, Utf8);
        for (v, ts) in [("L", 1_000), ("X", 20_000), ("Y", 60_000)] {
            left.pipe_input_with_timestamp("a", v.to_owned(), ts)
                .unwrap();
        }
        driver
            .input_topic("r", Utf8, Utf8)
            .pipe_input_with_timestamp("b", "Z".to_owned(), 60_000)
            .unwrap();
        let out: Vec<(String, Option<i64>)> = driver
            .output_topic("joined", Utf8, Utf8)
            .read_records()
            .unwrap()
            .into_iter()
            .map(|r| (r.value, r.timestamp))
            .collect();
        let mut expected = vec![("L+R".to_owned(), Some(5_000))];
        if !matches!(kind, Kind::Inner) {
            expected.push(("X+none".to_owned(), Some(20_000)));
        }
        assert_eq!(out, expected, "{kind:?}");
    }
}
