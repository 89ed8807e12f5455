//! The stateless operators of `KStream`, through the test driver, with expected outputs
//! written by hand.

#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};

use lambda_streams::driver::{Batching, TestDriver};
use lambda_streams::serdes::{DecimalI64, Nullable, Unit, Utf8};
use lambda_streams::sink::SOURCE_HEADER;
use lambda_streams::{StreamError, StreamsBuilder};

fn s(text: &str) -> String {
    text.to_owned()
}

#[test]
fn filter_map_and_select_key_chain() {
    let builder = StreamsBuilder::new();
    builder
        .stream("orders", Utf8, DecimalI64)
        .filter_not(|_, amount| *amount < 0)
        .map(|customer, amount| (customer.to_uppercase(), amount * 10))
        .select_key(|customer, amount| format!("{customer}:{amount}"))
        .map_values(|amount| amount + 1)
        .to("out", Utf8, DecimalI64);
    let driver = TestDriver::new(builder.build());
    driver
        .input_topic("orders", Utf8, DecimalI64)
        .pipe_key_values([("ann", 3), ("bo", -1), ("cy", 0)])
        .unwrap();
    assert_eq!(
        driver
            .output_topic("out", Utf8, DecimalI64)
            .read_key_values()
            .unwrap(),
        [(s("ANN:30"), 31), (s("CY:0"), 1)]
    );
}

#[test]
fn flat_map_can_emit_nothing_one_or_many() {
    let builder = StreamsBuilder::new();
    builder
        .stream("in", Utf8, DecimalI64)
        .flat_map(|k: String, n: i64| (0..n).map(move |i| (format!("{k}{i}"), i * i)))
        .to("out", Utf8, DecimalI64);
    let driver = TestDriver::new(builder.build());
    driver
        .input_topic("in", Utf8, DecimalI64)
        .pipe_key_values([("a", 0), ("b", 1), ("c", 3)])
        .unwrap();
    assert_eq!(
        driver
            .output_topic("out", Utf8, DecimalI64)
            .read_key_values()
            .unwrap(),
        [(s("b0"), 0), (s("c0"), 0), (s("c1"), 1), (s("c2"), 4)]
    );
}

#[test]
fn flat_map_values_keeps_the_key_for_every_value() {
    let builder = StreamsBuilder::new();
    builder
        .stream("in", Utf8, Utf8)
        .flat_map_values(|v: String| v.chars().map(String::from).collect::<Vec<_>>())
        .to("out", Utf8, Utf8);
    let driver = TestDriver::new(builder.build());
    driver
        .input_topic("in", Utf8, Utf8)
        .pipe_key_values([("k1", "ab"), ("k2", ""), ("k3", "c")])
        .unwrap();
    assert_eq!(
        driver
            .output_topic("out", Utf8, Utf8)
            .read_key_values()
            .unwrap(),
        [(s("k1"), s("a")), (s("k1"), s("b")), (s("k3"), s("c"))]
    );
}

#[test]
fn one_stream_feeds_several_operators() {
    let builder = StreamsBuilder::new();
    let numbers = builder.stream("in", Unit, DecimalI64);
    numbers
        .filter(|_, n| n % 2 == 0)
        .to("even", Unit, DecimalI64);
    numbers
        .map_values(|n| n * 100)
        .to("scaled", Unit, DecimalI64);
    let driver = TestDriver::new(builder.build());
    driver
        .input_topic("in", Unit, DecimalI64)
        .pipe_values([1, 2, 3, 4])
        .unwrap();
    let read = |t| {
        driver
            .output_topic(t, Unit, DecimalI64)
            .read_values()
            .unwrap()
    };
    assert_eq!(read("even"), [2, 4]);
    assert_eq!(read("scaled"), [100, 200, 300, 400]);
}

#[test]
fn split_sends_each_record_to_the_first_matching_branch_only() {
    let builder = StreamsBuilder::new();
    let split = builder.stream("in", Unit, DecimalI64).split();
    split
        .branch("negative", |_, n| *n < 0)
        .to("negative", Unit, DecimalI64);
    split
        .branch("small", |_, n| *n < 10)
        .to("small", Unit, DecimalI64);
    split
        .branch("even", |_, n| n % 2 == 0)
        .to("even", Unit, DecimalI64);
    split.default_branch("odd").to("odd", Unit, DecimalI64);
    let driver = TestDriver::new(builder.build());
    driver
        .input_topic("in", Unit, DecimalI64)
        .pipe_values([-4, 3, 12, 15, 8, -1, 20, 11])
        .unwrap();
    let read = |t| {
        driver
            .output_topic(t, Unit, DecimalI64)
            .read_values()
            .unwrap()
    };
    // -4 and -1 are also small and some even: they go to "negative" only.
    assert_eq!(read("negative"), [-4, -1]);
    assert_eq!(read("small"), [3, 8]);
    assert_eq!(read("even"), [12, 20]);
    assert_eq!(read("odd"), [15, 11]);
}

#[test]
fn split_without_default_drops_unmatched_records() {
    let builder = StreamsBuilder::new();
    let split = builder.stream("in", Unit, Utf8).split();
    split
        .branch("a", |_, v| v.starts_with('a'))
        .to("a", Unit, Utf8);
    drop(split);
    let driver = TestDriver::new(builder.build());
    driver
        .input_topic("in", Unit, Utf8)
        .pipe_values(["apple", "banana", "avocado"])
        .unwrap();
    assert_eq!(
        driver.output_topic("a", Unit, Utf8).read_values().unwrap(),
        ["apple", "avocado"]
    );
    assert_eq!(driver.produced().len(), 2);
}

#[test]
fn merge_interleaves_in_processing_order_and_merging_twice_duplicates() {
    let builder = StreamsBuilder::new();
    let left = builder.stream("left", Unit, Utf8);
    let right = builder.stream("right", Unit, Utf8);
    left.merge(&right).to("both", Unit, Utf8);
    left.merge(&left).to("twice", Unit, Utf8);
    let driver = TestDriver::new(builder.build());
    let mut l = driver.input_topic("left", Unit, Utf8);
    let mut r = driver.input_topic("right", Unit, Utf8);
    l.pipe_value("l1").unwrap();
    r.pipe_value("r1").unwrap();
    l.pipe_value("l2").unwrap();
    assert_eq!(
        driver
            .output_topic("both", Unit, Utf8)
            .read_values()
            .unwrap(),
        ["l1", "r1", "l2"]
    );
    assert_eq!(
        driver
            .output_topic("twice", Unit, Utf8)
            .read_values()
            .unwrap(),
        ["l1", "l1", "l2", "l2"]
    );
}

#[test]
fn peek_and_foreach_see_every_record_in_order() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (peeked, each) = (Arc::clone(&seen), Arc::clone(&seen));
    let builder = StreamsBuilder::new();
    builder
        .stream("in", Utf8, DecimalI64)
        .peek(move |k, v| peeked.lock().unwrap().push(format!("peek {k}={v}")))
        .filter(|_, v| *v > 1)
        .foreach(move |k, v| each.lock().unwrap().push(format!("each {k}={v}")));
    let driver = TestDriver::new(builder.build());
    driver
        .input_topic("in", Utf8, DecimalI64)
        .pipe_key_values([("a", 1), ("b", 2)])
        .unwrap();
    assert_eq!(*seen.lock().unwrap(), ["peek a=1", "peek b=2", "each b=2"]);
    assert!(driver.produced().is_empty());
}

#[test]
fn tombstones_flow_through_nullable_serdes() {
    let builder = StreamsBuilder::new();
    builder
        .stream("in", Utf8, Nullable(Utf8))
        .map_values(|v: Option<String>| v.map(|text| text.len() as i64))
        .to("out", Utf8, Nullable(DecimalI64));
    let driver = TestDriver::new(builder.build());
    driver
        .input_topic("in", Utf8, Nullable(Utf8))
        .pipe_key_values([("a", Some(s("xyz"))), ("b", None)])
        .unwrap();
    let out = driver.read_output("out");
    assert_eq!(out[0].value.as_deref(), Some(&b"3"[..]));
    assert_eq!(out[1].key.as_deref(), Some(&b"b"[..]));
    assert_eq!(out[1].value, None);
}

#[test]
fn output_records_keep_source_coordinates_and_timestamps() {
    let builder = StreamsBuilder::new();
    builder
        .stream("in", Unit, Utf8)
        .flat_map_values(|v: String| [v.clone(), v])
        .to("out", Unit, Utf8);
    let driver = TestDriver::new(builder.build());
    let mut input = driver.input_topic("in", Unit, Utf8).with_time(1_000, 0);
    input.pipe_to_partition(2, (), "x").unwrap();
    input.pipe_to_partition(2, (), "y").unwrap();
    input.pipe_input_with_timestamp((), "z", 77).unwrap();
    let out = driver.read_output("out");
    let origin: Vec<(&[u8], Option<i64>)> = out
        .iter()
        .map(|r| (r.header(SOURCE_HEADER).unwrap(), r.timestamp))
        .collect();
    assert_eq!(
        origin,
        [
            (&b"in:2:0"[..], Some(1_000)),
            (&b"in:2:0"[..], Some(1_000)),
            (&b"in:2:1"[..], Some(1_000)),
            (&b"in:2:1"[..], Some(1_000)),
            (&b"in:0:0"[..], Some(77)),
            (&b"in:0:0"[..], Some(77)),
        ]
    );
}

#[test]
fn try_operator_errors_name_the_record_and_never_panic() {
    let builder = StreamsBuilder::new();
    builder
        .stream("in", Unit, Utf8)
        .try_map(|(), v: String| {
            v.split_once('=')
                .map(|(k, n)| (k.to_owned(), n.to_owned()))
                .ok_or("no '=' in the line")
        })
        .try_map_values(|n: String| n.parse::<i64>())
        .try_flat_map_values(|n: i64| {
            if n < 0 {
                Err(format!("negative count {n}"))
            } else {
                Ok(vec![n; n as usize])
            }
        })
        .to("out", Utf8, DecimalI64);
    let driver = TestDriver::new(builder.build()).with_batching(Batching::Manual);
    let mut input = driver.input_topic("in", Unit, Utf8).with_partition(3);
    input.pipe_value("a=2").unwrap();
    driver.flush().unwrap();
    let check = |line: &str, offset: i64, expected: &str| {
        let mut input = driver.input_topic("in", Unit, Utf8).with_partition(3);
        input.pipe_value(line).unwrap();
        let err = driver.flush().unwrap_err();
        match &err {
            StreamError::User { tp, offset: o, .. } => {
                assert_eq!((tp.to_string(), *o), ("in-3".to_owned(), offset));
            }
            other => panic!("expected a user error, got {other:?}"),
        }
        assert_eq!(err.to_string(), expected);
        assert_eq!(driver.discard_pending(), 1);
    };
    check(
        "no equals sign",
        1,
        "record in-3 offset 1: KSTREAM-MAP-0000000001: no '=' in the line",
    );
    check(
        "b=x",
        2,
        "record in-3 offset 2: KSTREAM-MAPVALUES-0000000002: invalid digit found in string",
    );
    check(
        "c=-1",
        3,
        "record in-3 offset 3: KSTREAM-FLATMAPVALUES-0000000003: negative count -1",
    );
    assert_eq!(
        driver
            .output_topic("out", Utf8, DecimalI64)
            .read_key_values()
            .unwrap(),
        [(s("a"), 2), (s("a"), 2)]
    );
}

#[test]
fn an_error_downstream_of_a_try_operator_keeps_its_own_kind() {
    // The try operator's function succeeds; the error comes from the sink's serde
    // further down (JSON object keys must be strings), and is reported as the sink's.
    use std::collections::HashMap;
    let builder = StreamsBuilder::new();
    builder
        .stream("in", Unit, Utf8)
        .try_map_values(|v: String| Ok::<_, String>(HashMap::from([((v.len() as u8, 0u8), 1u8)])))
        .to(
            "out",
            Unit,
            lambda_streams::serdes::Json::<HashMap<(u8, u8), u8>>::new(),
        );
    let driver = TestDriver::new(builder.build());
    let err = driver
        .input_topic("in", Unit, Utf8)
        .pipe_value("ok")
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "record in-0 offset 0: cannot serialize the value for topic \"out\": \
         cannot encode as JSON: key must be a string"
    );
    assert!(driver.produced().is_empty());
}

#[test]
fn a_failed_batch_produces_nothing() {
    // Records before the poison one in the same batch are not produced either: the
    // batch fails as a whole and is delivered again.
    let builder = StreamsBuilder::new();
    builder
        .stream("in", Unit, Utf8)
        .try_map_values(|v: String| v.parse::<i64>())
        .to("out", Unit, DecimalI64);
    let driver = TestDriver::new(builder.build()).with_batching(Batching::Manual);
    driver
        .input_topic("in", Unit, Utf8)
        .pipe_values(["1", "x", "3"])
        .unwrap();
    assert!(driver.flush().is_err());
    assert!(driver.produced().is_empty());
    assert_eq!(driver.pending(), 3);
}
