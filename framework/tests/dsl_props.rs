//! Property tests: the stateless operators through the test driver equal the same
//! computation done with plain `Vec` iterators, over random inputs, partitions and
//! batch boundaries; WordCount's state equals a `HashMap` count whatever the batching
//! and redeliveries.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashMap};

use lambda_streams::driver::{Batching, TestDriver};
use lambda_streams::dsl::Grouped;
use lambda_streams::serdes::{DecimalI64, Json, Unit, Utf8};
use lambda_streams::sink::SOURCE_HEADER;
use lambda_streams::wire::SourceHeader;
use lambda_streams::{StreamsBuilder, Topology};
use proptest::prelude::*;

/// An input record: partition, key, value.
type Input = (i32, String, i64);

fn inputs() -> impl Strategy<Value = Vec<Input>> {
    let key = prop::sample::select(vec!["a", "b", "c", "dd"]).prop_map(str::to_owned);
    prop::collection::vec((0..3i32, key, -20i64..20), 0..40)
}

fn batching() -> impl Strategy<Value = Batching> {
    prop_oneof![
        Just(Batching::PerRecord),
        (1usize..8).prop_map(Batching::Size),
        Just(Batching::Manual),
    ]
}

/// filter → map_values → flat_map → select_key → filter_not, through the DSL.
fn pipeline() -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream("in", Utf8, DecimalI64)
        .filter(|_, v| v % 3 != 0)
        .map_values(|v| v * 2)
        .flat_map(|k: String, v: i64| (0..v.rem_euclid(3)).map(move |i| (format!("{k}{i}"), v + i)))
        .select_key(|k, v| format!("{k}/{}", v.rem_euclid(2)))
        .filter_not(|k, _| k.starts_with('c'))
        .to("out", Utf8, DecimalI64);
    builder.build()
}

/// The same computation, written independently with iterators.
fn reference(inputs: &[(String, i64)]) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    for (k, v) in inputs {
        if v % 3 == 0 {
            continue;
        }
        let doubled = v * 2;
        let copies = doubled.rem_euclid(3);
        for i in 0..copies {
            let value = doubled + i;
            let key = format!("{k}{i}/{}", value.rem_euclid(2));
            if !key.starts_with('c') {
                out.push((key, value));
            }
        }
    }
    out
}

fn pipe_all(driver: &TestDriver, inputs: &[Input]) {
    let mut topic = driver.input_topic("in", Utf8, DecimalI64);
    for (partition, k, v) in inputs {
        topic.pipe_to_partition(*partition, k.as_str(), *v).unwrap();
    }
    driver.flush().unwrap();
}

/// The source partition of an output record, from its `lambda-streams-source` header.
fn source_partition(record: &lambda_streams::sink::OutputRecord) -> i32 {
    SourceHeader::parse(record.header(SOURCE_HEADER).unwrap())
        .expect("<topic>:<partition>:<offset>")
        .tp
        .partition
}

proptest! {
    #[test]
    fn record_by_record_equals_the_iterator_reference(inputs in inputs()) {
        let driver = TestDriver::new(pipeline());
        pipe_all(&driver, &inputs);
        let pairs: Vec<(String, i64)> = inputs.iter().map(|(_, k, v)| (k.clone(), *v)).collect();
        let out = driver.output_topic("out", Utf8, DecimalI64).read_key_values().unwrap();
        prop_assert_eq!(out, reference(&pairs));
    }

    #[test]
    fn any_batching_keeps_each_partition_equal_to_the_reference(
        inputs in inputs(),
        batching in batching(),
    ) {
        let driver = TestDriver::new(pipeline()).with_batching(batching);
        pipe_all(&driver, &inputs);
        let produced = driver.read_output("out");
        for p in 0..3 {
            let pairs: Vec<(String, i64)> = inputs
                .iter()
                .filter(|(q, _, _)| *q == p)
                .map(|(_, k, v)| (k.clone(), *v))
                .collect();
            let got: Vec<(String, i64)> = produced
                .iter()
                .filter(|r| source_partition(r) == p)
                .map(|r| {
                    let key = String::from_utf8(r.key.clone().unwrap()).unwrap();
                    let value = std::str::from_utf8(r.value.as_deref().unwrap()).unwrap();
                    (key, value.parse().unwrap())
                })
                .collect();
            prop_assert_eq!(got, reference(&pairs), "partition {}", p);
        }
    }

    #[test]
    fn split_routes_to_the_first_match_and_merge_reunites(
        values in prop::collection::vec(-20i64..20, 0..40),
    ) {
        let builder = StreamsBuilder::new();
        let split = builder.stream("in", Unit, DecimalI64).split();
        let low = split.branch("low", |_, v| *v < -5);
        split.branch("even", |_, v| v % 2 == 0).to("even", Unit, DecimalI64);
        let rest = split.default_branch("rest");
        low.to("low", Unit, DecimalI64);
        rest.to("rest", Unit, DecimalI64);
        low.merge(&rest).to("low-or-rest", Unit, DecimalI64);
        let driver = TestDriver::new(builder.build());
        driver.input_topic("in", Unit, DecimalI64).pipe_values(values.clone()).unwrap();

        let read = |t| driver.output_topic(t, Unit, DecimalI64).read_values().unwrap();
        let low_ref: Vec<i64> = values.iter().copied().filter(|v| *v < -5).collect();
        let even_ref: Vec<i64> =
            values.iter().copied().filter(|v| *v >= -5 && v % 2 == 0).collect();
        let rest_ref: Vec<i64> =
            values.iter().copied().filter(|v| *v >= -5 && v % 2 != 0).collect();
        let merged_ref: Vec<i64> =
            values.iter().copied().filter(|v| *v < -5 || v % 2 != 0).collect();
        prop_assert_eq!(read("low"), low_ref);
        prop_assert_eq!(read("even"), even_ref);
        prop_assert_eq!(read("rest"), rest_ref);
        prop_assert_eq!(read("low-or-rest"), merged_ref);
    }

    #[test]
    fn json_values_round_trip_through_a_topology(
        records in prop::collection::vec(
            (prop::collection::vec(any::<char>(), 0..8), prop::collection::vec(any::<i64>(), 0..4), any::<Option<bool>>()),
            0..20,
        ),
    ) {
        type Value = (String, Vec<i64>, Option<bool>);
        let values: Vec<Value> = records
            .into_iter()
            .map(|(chars, numbers, flag)| (chars.into_iter().collect(), numbers, flag))
            .collect();
        let builder = StreamsBuilder::new();
        builder
            .stream("in", Unit, Json::<Value>::new())
            .to("out", Unit, Json::<Value>::new());
        let driver = TestDriver::new(builder.build());
        driver.input_topic("in", Unit, Json::<Value>::new()).pipe_values(values.clone()).unwrap();
        let out = driver.output_topic("out", Unit, Json::<Value>::new()).read_values().unwrap();
        prop_assert_eq!(out, values);
    }

    #[test]
    fn wordcount_state_is_exact_under_any_batching_and_redelivery(
        lines in prop::collection::vec(
            (0..3i32, prop::collection::vec(prop::sample::select(vec!["x", "y", "z"]), 0..5)),
            0..30,
        ),
        batching in batching(),
        redeliver_every in 1usize..5,
    ) {
        let builder = StreamsBuilder::new();
        builder
            .stream("lines", Unit, Utf8)
            .flat_map_values(|line: String| {
                line.split_whitespace().map(str::to_owned).collect::<Vec<_>>()
            })
            .group_by(|_, w| w.clone(), Grouped::direct(Utf8))
            .count("counts")
            .to_stream()
            .to("counts", Utf8, DecimalI64);
        let driver = TestDriver::new(builder.build()).with_batching(batching);
        let mut input = driver.input_topic("lines", Unit, Utf8);
        let mut expected: HashMap<String, i64> = HashMap::new();
        for (i, (partition, words)) in lines.iter().enumerate() {
            for w in words {
                *expected.entry((*w).to_owned()).or_default() += 1;
            }
            input.pipe_to_partition(*partition, (), words.join(" ")).unwrap();
            if i % redeliver_every == 0 {
                driver.redeliver_last_batch().unwrap();
            }
        }
        driver.flush().unwrap();
        driver.redeliver_last_batch().unwrap();

        let expected: BTreeMap<String, i64> = expected.into_iter().collect();
        let store: BTreeMap<String, i64> = driver
            .store("counts")
            .into_iter()
            .map(|(k, count, _)| (String::from_utf8(k).unwrap(), count))
            .collect();
        prop_assert_eq!(&store, &expected);
        // The last update emitted per key carries the exact count.
        let table = driver
            .output_topic("counts", Utf8, DecimalI64)
            .read_key_values_to_map()
            .unwrap();
        prop_assert_eq!(&table, &expected);
    }
}
