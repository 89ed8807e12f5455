//! Compositions of operators that a batch must order: records that pass one join and then
//! another, an aggregation read by a later join in the same batch, chains of stream–stream
//! joins; and the shapes the builder refuses because a batch cannot run them exactly once
//! (a table's update stream aggregated, repartitioned or buffered by a stream–stream join).
//!
//! Expected values are those of Kafka Streams processing one record at a time (each piped
//! record is its own batch, or, where a batch holds several records, the order the
//! framework documents: a record joins the table as of the end of its batch's writes).

#![allow(clippy::unwrap_used)]

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use lambda_streams::StreamsBuilder;
use lambda_streams::driver::{Batching, TestDriver};
use lambda_streams::dsl::JoinWindows;
use lambda_streams::serdes::{DecimalI64, Utf8};

/// The message `build()` panics with, or `None` when it accepts the topology.
fn build_refusal(builder: StreamsBuilder) -> Option<String> {
    match catch_unwind(AssertUnwindSafe(move || builder.build())) {
        Ok(_) => None,
        Err(panic) => Some(
            panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default(),
        ),
    }
}

/// `orders` joined with `customers`, then with `regions`, then counted per key.
fn two_joins_then_count() -> StreamsBuilder {
    let builder = StreamsBuilder::new();
    let customers = builder.table("customers", Utf8, Utf8, "customers");
    let regions = builder.table("regions", Utf8, Utf8, "regions");
    builder
        .stream("orders", Utf8, Utf8)
        .join(&customers, |_, order: String, name: String| {
            format!("{order} for {name}")
        })
        .join(&regions, |_, named: String, region: String| {
            format!("{named} in {region}")
        })
        .group_by_key(Utf8)
        .count("orders-per-customer")
        .to_stream()
        .to("counts", Utf8, DecimalI64);
    builder
}

#[test]
fn records_that_pass_two_joins_are_counted() {
    let driver = TestDriver::new(two_joins_then_count().build());
    driver
        .input_topic("customers", Utf8, Utf8)
        .pipe_input("c1", "Ada".to_owned())
        .unwrap();
    driver
        .input_topic("regions", Utf8, Utf8)
        .pipe_input("c1", "EU".to_owned())
        .unwrap();
    let mut orders = driver.input_topic("orders", Utf8, Utf8);
    orders.pipe_input("c1", "tea".to_owned()).unwrap();
    orders.pipe_input("c1", "cake".to_owned()).unwrap();
    orders.pipe_input("c2", "jam".to_owned()).unwrap(); // no customer c2: dropped
    // Record at a time: c1 counted twice, one update per record.
    assert_eq!(
        driver
            .output_topic("counts", Utf8, DecimalI64)
            .read_key_values()
            .unwrap(),
        [("c1".to_owned(), 1), ("c1".to_owned(), 2)]
    );
    let stored = driver.store("orders-per-customer");
    assert_eq!(stored.len(), 1);
    assert_eq!((stored[0].0.as_slice(), stored[0].1), (&b"c1"[..], 2));
}

#[test]
fn records_that_pass_two_joins_are_counted_once_in_one_batch_and_on_redelivery() {
    let driver = TestDriver::new(two_joins_then_count().build()).with_batching(Batching::Manual);
    driver
        .input_topic("customers", Utf8, Utf8)
        .pipe_input("c1", "Ada".to_owned())
        .unwrap();
    driver
        .input_topic("regions", Utf8, Utf8)
        .pipe_input("c1", "EU".to_owned())
        .unwrap();
    let mut orders = driver.input_topic("orders", Utf8, Utf8);
    orders.pipe_input("c1", "tea".to_owned()).unwrap();
    orders.pipe_input("c1", "cake".to_owned()).unwrap();
    // One batch: the tables are written first, the orders join them as of the batch's end.
    driver.flush().unwrap();
    driver.redeliver_last_batch().unwrap();
    let stored = driver.store("orders-per-customer");
    assert_eq!(stored.len(), 1);
    assert_eq!((stored[0].0.as_slice(), stored[0].1), (&b"c1"[..], 2));
}

#[test]
fn a_count_of_joined_records_is_read_by_another_join_after_its_write() {
    let builder = StreamsBuilder::new();
    let customers = builder.table("customers", Utf8, Utf8, "customers");
    let visits = builder
        .stream("visits", Utf8, Utf8)
        .join(&customers, |_, visit: String, _name: String| visit)
        .group_by_key(Utf8)
        .count("visits-per-customer");
    builder
        .stream("questions", Utf8, Utf8)
        .join(&visits, |_, question: String, n: i64| {
            format!("{question} after {n} visits")
        })
        .to("answers", Utf8, Utf8);
    let driver = TestDriver::new(builder.build());
    driver
        .input_topic("customers", Utf8, Utf8)
        .pipe_input("c1", "Ada".to_owned())
        .unwrap();
    let mut visits_in = driver.input_topic("visits", Utf8, Utf8);
    visits_in.pipe_input("c1", "home".to_owned()).unwrap();
    visits_in.pipe_input("c1", "cart".to_owned()).unwrap();
    driver
        .input_topic("questions", Utf8, Utf8)
        .pipe_input("c1", "why?".to_owned())
        .unwrap();
    assert_eq!(
        driver
            .output_topic("answers", Utf8, Utf8)
            .read_values()
            .unwrap(),
        ["why? after 2 visits"]
    );
}

/// Three streams joined in a chain: `(a ⋈ b) ⋈ c`, all within 10 s.
fn chained_stream_joins() -> StreamsBuilder {
    let builder = StreamsBuilder::new();
    let window = JoinWindows::of(Duration::from_secs(10));
    let a = builder.stream("a", Utf8, Utf8);
    let b = builder.stream("b", Utf8, Utf8);
    let c = builder.stream("c", Utf8, Utf8);
    a.join_stream(&b, window, "ab", (Utf8, Utf8, Utf8), |_, x, y| {
        format!("{x}+{y}")
    })
    .join_stream(&c, window, "abc", (Utf8, Utf8, Utf8), |_, xy, z| {
        format!("{xy}+{z}")
    })
    .to("joined", Utf8, Utf8);
    builder
}

#[test]
fn a_chain_of_stream_joins_runs_record_at_a_time() {
    let driver = TestDriver::new(chained_stream_joins().build());
    driver
        .input_topic("a", Utf8, Utf8)
        .pipe_input_with_timestamp("k", "x".to_owned(), 1_000)
        .unwrap();
    driver
        .input_topic("b", Utf8, Utf8)
        .pipe_input_with_timestamp("k", "y".to_owned(), 2_000)
        .unwrap();
    driver
        .input_topic("c", Utf8, Utf8)
        .pipe_input_with_timestamp("k", "z".to_owned(), 3_000)
        .unwrap();
    driver
        .input_topic("c", Utf8, Utf8)
        .pipe_input_with_timestamp("k", "far".to_owned(), 60_000)
        .unwrap();
    assert_eq!(
        driver
            .output_topic("joined", Utf8, Utf8)
            .read_values()
            .unwrap(),
        ["x+y+z"]
    );
}

#[test]
fn a_chain_of_stream_joins_emits_each_triple_once_in_one_batch() {
    let driver = TestDriver::new(chained_stream_joins().build()).with_batching(Batching::Manual);
    driver
        .input_topic("a", Utf8, Utf8)
        .pipe_input_with_timestamp("k", "x".to_owned(), 1_000)
        .unwrap();
    driver
        .input_topic("b", Utf8, Utf8)
        .pipe_input_with_timestamp("k", "y".to_owned(), 2_000)
        .unwrap();
    driver
        .input_topic("c", Utf8, Utf8)
        .pipe_input_with_timestamp("k", "z".to_owned(), 3_000)
        .unwrap();
    driver.flush().unwrap();
    assert_eq!(
        driver
            .output_topic("joined", Utf8, Utf8)
            .read_values()
            .unwrap(),
        ["x+y+z"]
    );
}

#[test]
fn a_tables_update_stream_counted_is_refused_at_build() {
    let builder = StreamsBuilder::new();
    builder
        .table("customers", Utf8, Utf8, "customers")
        .to_stream()
        .group_by_key(Utf8)
        .count("updates-per-customer");
    let message = build_refusal(builder).expect("build() must refuse it");
    // The counting node, named as describe() names it (Kafka Streams' naming).
    assert!(
        message.contains("KSTREAM-AGGREGATE-0000000003"),
        "{message}"
    );
    assert!(message.contains("table"), "{message}");
}

#[test]
fn a_tables_update_stream_to_table_is_refused_at_build() {
    let builder = StreamsBuilder::new();
    builder
        .table("customers", Utf8, Utf8, "customers")
        .to_stream()
        .to_table("customers-copy", Utf8, Utf8);
    let message = build_refusal(builder).expect("build() must refuse it");
    assert!(
        message.contains("KSTREAM-AGGREGATE-0000000003"),
        "{message}"
    );
}

#[test]
fn a_count_of_a_count_is_refused_at_build() {
    let builder = StreamsBuilder::new();
    builder
        .stream("words", Utf8, Utf8)
        .group_by_key(Utf8)
        .count("word-counts")
        .to_stream()
        .map(|_, n| (n.to_string(), n))
        .group_by_key(Utf8)
        .count("count-counts");
    let message = build_refusal(builder).expect("build() must refuse it");
    assert!(message.contains("count-counts") || message.contains("KSTREAM-AGGREGATE"));
}

#[test]
fn a_tables_update_stream_repartitioned_is_refused_at_build() {
    let builder = StreamsBuilder::new();
    builder
        .table("customers", Utf8, Utf8, "customers")
        .to_stream()
        .repartition("customers-by-key", Utf8, Utf8)
        .to("copy", Utf8, Utf8);
    let message = build_refusal(builder).expect("build() must refuse it");
    assert!(message.contains("KSTREAM-SINK"), "{message}");
}

#[test]
fn a_tables_update_stream_in_a_stream_join_is_refused_at_build() {
    let builder = StreamsBuilder::new();
    let updates = builder
        .table("customers", Utf8, Utf8, "customers")
        .to_stream();
    builder
        .stream("orders", Utf8, Utf8)
        .join_stream(
            &updates,
            JoinWindows::of(Duration::from_secs(1)),
            "orders-customers",
            (Utf8, Utf8, Utf8),
            |_, o, c| format!("{o}{c}"),
        )
        .to("out", Utf8, Utf8);
    let message = build_refusal(builder).expect("build() must refuse it");
    assert!(message.contains("KSTREAM-JOINSIDE"), "{message}");
}

#[test]
fn a_tables_update_stream_joined_with_a_table_and_produced_is_accepted() {
    // Stateless use of a table's updates (here through a stream–table join) stays exact.
    let builder = StreamsBuilder::new();
    let names = builder.table("names", Utf8, Utf8, "names");
    let cities = builder.table("cities", Utf8, Utf8, "cities");
    names
        .to_stream()
        .join(&cities, |_, name: String, city: String| {
            format!("{name} in {city}")
        })
        .to("profiles", Utf8, Utf8);
    let driver = TestDriver::new(builder.build());
    driver
        .input_topic("cities", Utf8, Utf8)
        .pipe_input("u1", "Paris".to_owned())
        .unwrap();
    driver
        .input_topic("names", Utf8, Utf8)
        .pipe_input("u1", "Ada".to_owned())
        .unwrap();
    assert_eq!(
        driver
            .output_topic("profiles", Utf8, Utf8)
            .read_values()
            .unwrap(),
        ["Ada in Paris"]
    );
}

#[test]
fn an_emit_on_close_windows_updates_joined_is_refused_at_build() {
    use lambda_streams::dsl::{EmitStrategy, TimeWindows};
    let builder = StreamsBuilder::new();
    let limits = builder.table("limits", Utf8, DecimalI64, "limits");
    builder
        .stream("clicks", Utf8, Utf8)
        .group_by_key(Utf8)
        .windowed_by(TimeWindows::of_size(Duration::from_secs(60)))
        .emit_strategy(EmitStrategy::OnWindowClose)
        .count("clicks-per-minute")
        .to_stream()
        .map(|w, n| (w.key, n))
        .join(&limits, |_, n: i64, limit: i64| n > limit)
        .map_values(|over| over.to_string())
        .to("over-limit", Utf8, Utf8);
    let message = build_refusal(builder).expect("build() must refuse it");
    assert!(message.contains("KSTREAM-JOIN"), "{message}");
    assert!(message.contains("clicks-per-minute"), "{message}");
}

#[test]
fn a_table_join_s_updates_joined_with_a_third_table() {
    let builder = StreamsBuilder::new();
    let names = builder.table("names", Utf8, Utf8, "names");
    let cities = builder.table("cities", Utf8, Utf8, "cities");
    let countries = builder.table("countries", Utf8, Utf8, "countries");
    names
        .join(&cities, |_, name: &String, city: &String| {
            format!("{name} in {city}")
        })
        .to_stream()
        .join(&countries, |_, profile: String, country: String| {
            format!("{profile}, {country}")
        })
        .to("profiles", Utf8, Utf8);
    let driver = TestDriver::new(builder.build());
    driver
        .input_topic("countries", Utf8, Utf8)
        .pipe_input("u1", "France".to_owned())
        .unwrap();
    driver
        .input_topic("cities", Utf8, Utf8)
        .pipe_input("u1", "Paris".to_owned())
        .unwrap();
    driver
        .input_topic("names", Utf8, Utf8)
        .pipe_input("u1", "Ada".to_owned())
        .unwrap();
    // Record at a time: the names update meets Paris, then France.
    assert_eq!(
        driver
            .output_topic("profiles", Utf8, Utf8)
            .read_values()
            .unwrap(),
        ["Ada in Paris, France"]
    );
}
