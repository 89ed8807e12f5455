//! Stream–table joins through the test driver equal a nested-loop reference over random
//! interleavings of table updates (tombstones included) and stream records, for batches
//! of one record and for larger batches (where a batch's table updates come first).

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use lambda_streams::driver::{Batching, TestDriver};
use lambda_streams::serdes::{Nullable, Utf8};
use lambda_streams::{StreamsBuilder, Topology};
use proptest::prelude::*;

/// One input record: to the table (`Some(value)` or a tombstone) or to the stream.
#[derive(Debug, Clone)]
enum Input {
    Table(String, Option<String>),
    Stream(String, String),
}

fn inputs() -> impl Strategy<Value = Vec<Input>> {
    let key = prop::sample::select(vec!["a", "b", "c"]).prop_map(str::to_owned);
    let value = "[x-z]{1,3}";
    let input = prop_oneof![
        (key.clone(), prop::option::weighted(0.8, value)).prop_map(|(k, v)| Input::Table(k, v)),
        (key, value).prop_map(|(k, v)| Input::Stream(k, v)),
    ];
    prop::collection::vec(input, 0..40)
}

/// The records of a join's output topic, in order.
type Joined = Vec<(String, String)>;

/// Inner and left joins of `orders` with the table `customers`.
fn topology() -> Topology {
    let builder = StreamsBuilder::new();
    let customers = builder.table("customers", Utf8, Utf8, "customers");
    let orders = builder.stream("orders", Utf8, Utf8);
    orders
        .join(&customers, |_, order: String, name: String| {
            format!("{order}|{name}")
        })
        .to("inner", Utf8, Utf8);
    orders
        .left_join(&customers, |_, order: String, name: Option<String>| {
            format!("{order}|{}", name.unwrap_or_else(|| "-".to_owned()))
        })
        .to("left", Utf8, Utf8);
    builder.build()
}

/// The reference: batches of `size` records in input order; within a batch the table
/// updates apply first (latest wins, a tombstone deletes), then each stream record joins
/// the table as it stands.
fn reference(inputs: &[Input], size: usize) -> (Joined, Joined) {
    let mut table: BTreeMap<String, String> = BTreeMap::new();
    let (mut inner, mut left) = (Vec::new(), Vec::new());
    for batch in inputs.chunks(size.max(1)) {
        for input in batch {
            if let Input::Table(k, v) = input {
                match v {
                    Some(v) => table.insert(k.clone(), v.clone()),
                    None => table.remove(k),
                };
            }
        }
        for input in batch {
            if let Input::Stream(k, order) = input {
                match table.get(k) {
                    Some(name) => {
                        inner.push((k.clone(), format!("{order}|{name}")));
                        left.push((k.clone(), format!("{order}|{name}")));
                    }
                    None => left.push((k.clone(), format!("{order}|-"))),
                }
            }
        }
    }
    (inner, left)
}

fn run(inputs: &[Input], batching: Batching) -> (Joined, Joined) {
    let driver = TestDriver::new(topology()).with_batching(batching);
    let mut customers = driver.input_topic("customers", Utf8, Nullable(Utf8));
    let mut orders = driver.input_topic("orders", Utf8, Utf8);
    for input in inputs {
        match input {
            Input::Table(k, v) => customers.pipe_input(k.clone(), v.clone()).unwrap(),
            Input::Stream(k, v) => orders.pipe_input(k.clone(), v.clone()).unwrap(),
        }
    }
    driver.flush().unwrap();
    let read = |topic| {
        driver
            .output_topic(topic, Utf8, Utf8)
            .read_key_values()
            .unwrap()
    };
    (read("inner"), read("left"))
}

proptest! {
    #[test]
    fn joins_equal_a_nested_loop_reference_record_by_record(inputs in inputs()) {
        prop_assert_eq!(run(&inputs, Batching::PerRecord), reference(&inputs, 1));
    }

    #[test]
    fn joins_equal_a_nested_loop_reference_in_batches(inputs in inputs(), size in 2usize..10) {
        // Within a batch, the stream's outputs are in input order per key only (records
        // wait at the join, then go on in order): compare per key.
        let by_key = |v: Vec<(String, String)>| {
            let mut m: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for (k, x) in v { m.entry(k).or_default().push(x); }
            m
        };
        let (inner, left) = run(&inputs, Batching::Size(size));
        let (ref_inner, ref_left) = reference(&inputs, size);
        prop_assert_eq!(by_key(inner), by_key(ref_inner));
        prop_assert_eq!(by_key(left), by_key(ref_left));
    }
}

/// Table–table joins: after random updates of two tables (in batches of any size), the
/// highest-version update per key of the joined table is the join of the final tables.
mod table_table {
    use super::*;
    use lambda_streams::serdes::Nullable;
    use lambda_streams::sink::VERSION_HEADER;

    fn topology() -> Topology {
        let builder = StreamsBuilder::new();
        let left = builder.table("left", Utf8, Utf8, "left");
        let right = builder.table("right", Utf8, Utf8, "right");
        left.join(&right, |_, l: &String, r: &String| format!("{l}|{r}"))
            .to_change_stream()
            .to("inner", Utf8, Nullable(Utf8));
        left.left_join(&right, |_, l: &String, r: Option<&String>| {
            format!("{l}|{}", r.map_or("-", String::as_str))
        })
        .to_change_stream()
        .to("left-outer", Utf8, Nullable(Utf8));
        left.outer_join(&right, |_, l: Option<&String>, r: Option<&String>| {
            format!(
                "{}|{}",
                l.map_or("-", String::as_str),
                r.map_or("-", String::as_str)
            )
        })
        .to_change_stream()
        .to("full-outer", Utf8, Nullable(Utf8));
        left.filter(|_, l| l.len() == 1)
            .map_values(|l| l.to_uppercase())
            .to_change_stream()
            .to("left-short", Utf8, Nullable(Utf8));
        builder.build()
    }

    /// The table a consumer keeps from a changelog topic: per key, the record with the
    /// highest version (the later one on a tie), a tombstone deleting the key.
    fn latest(driver: &TestDriver, topic: &str) -> BTreeMap<String, String> {
        let mut best: BTreeMap<String, (u64, Option<String>)> = BTreeMap::new();
        for record in driver
            .output_topic(topic, Utf8, Nullable(Utf8))
            .read_records()
            .unwrap()
        {
            let version: u64 = record
                .headers
                .iter()
                .find(|(name, _)| name == VERSION_HEADER)
                .map(|(_, v)| std::str::from_utf8(v).unwrap().parse().unwrap())
                .unwrap();
            let entry = best.entry(record.key).or_insert((0, None));
            if version >= entry.0 {
                *entry = (version, record.value);
            }
        }
        best.into_iter()
            .filter_map(|(k, (_, v))| Some((k, v?)))
            .collect()
    }

    /// Updates of either table; `None` is a tombstone.
    fn updates() -> impl Strategy<Value = Vec<(bool, String, Option<String>)>> {
        let key = prop::sample::select(vec!["a", "b", "c"]).prop_map(str::to_owned);
        let value = prop::option::weighted(0.7, "[x-z]{1,2}");
        prop::collection::vec((any::<bool>(), key, value), 0..30)
    }

    proptest! {
        /// With deletions: the changelogs of the joins (inner, left, outer) and of a
        /// filtered table, applied by version, equal the joins and the filter of the final
        /// tables.
        #[test]
        fn table_joins_equal_the_join_of_the_final_tables(updates in updates(), size in 1usize..8) {
            let driver = TestDriver::new(topology()).with_batching(Batching::Size(size));
            let mut left_in = driver.input_topic("left", Utf8, Nullable(Utf8));
            let mut right_in = driver.input_topic("right", Utf8, Nullable(Utf8));
            let (mut left, mut right) = (BTreeMap::new(), BTreeMap::new());
            for (is_left, key, value) in &updates {
                let (input, table) = if *is_left {
                    (&mut left_in, &mut left)
                } else {
                    (&mut right_in, &mut right)
                };
                input.pipe_input(key.clone(), value.clone()).unwrap();
                match value {
                    Some(v) => table.insert(key.clone(), v.clone()),
                    None => table.remove(key),
                };
            }
            driver.flush().unwrap();
            let inner: BTreeMap<String, String> = left
                .iter()
                .filter_map(|(k, l)| right.get(k).map(|r| (k.clone(), format!("{l}|{r}"))))
                .collect();
            let outer: BTreeMap<String, String> = left
                .iter()
                .map(|(k, l)| (k.clone(), format!("{l}|{}", right.get(k).map_or("-", String::as_str))))
                .collect();
            let full: BTreeMap<String, String> = left
                .keys()
                .chain(right.keys())
                .map(|k| {
                    let show = |t: &BTreeMap<String, String>| t.get(k).map_or("-".to_owned(), Clone::clone);
                    (k.clone(), format!("{}|{}", show(&left), show(&right)))
                })
                .collect();
            let short: BTreeMap<String, String> = left
                .iter()
                .filter(|(_, l)| l.len() == 1)
                .map(|(k, l)| (k.clone(), l.to_uppercase()))
                .collect();
            prop_assert_eq!(latest(&driver, "inner"), inner);
            prop_assert_eq!(latest(&driver, "left-outer"), outer);
            prop_assert_eq!(latest(&driver, "full-outer"), full);
            prop_assert_eq!(latest(&driver, "left-short"), short);
        }
    }
}
