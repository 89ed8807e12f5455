//! The output guarantee's configuration and its refusals (issue 15): under
//! `exactly_once`, aggregate and table updates from their store's write are accepted (the
//! outbox of updates makes them exactly once: sessions' and sliding windows' updates on
//! update too, also through stream–table joins, where each update goes on in its outbox
//! entry's transaction), and so are time windows', sessions' and sliding windows' closes
//! straight from their store (emit on close, `suppress`: claimed before they are emitted),
//! the closing passes of left and outer stream–stream joins and of grace joins (their
//! rewrite of the join's item claims what they emit, dead letters among them), and the
//! updates of several such stores merged into one sink (each store's outbox covers its
//! own); a topology whose sinks produce records that neither covers (a table–table join
//! declared while the builder's guarantee was at least once, which emits straight from the
//! two tables' writes) is refused, by `try_build` when the builder asks for it and by the
//! handler when its configuration does, naming the sink. Never a silent at-least-once
//! output.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use lambda_streams::dsl::{EmitStrategy, JoinWindows, TimeWindows};
use lambda_streams::lambda::{Config, Handler};
use lambda_streams::serdes::{BigEndianI64, Utf8};
use lambda_streams::sink::MemorySink;
use lambda_streams::state::memory::MemoryStore;
use lambda_streams::{OutputGuarantee, StreamsBuilder, Topology};

/// Records only: `to()` of a filtered stream, a stream–table join, a repartition.
fn records_only(builder: &StreamsBuilder) {
    let table = builder.table("customers", Utf8, Utf8, "customers");
    let orders = builder.stream("orders", Utf8, Utf8);
    orders
        .filter(|_, v| !v.is_empty())
        .to("non-empty", Utf8, Utf8);
    orders
        .join(&table, |_, o: String, c: String| format!("{o}@{c}"))
        .to("enriched", Utf8, Utf8);
    orders
        .select_key(|_, v: &String| v.clone())
        .repartition("by-value", Utf8, Utf8)
        .to("rekeyed", Utf8, Utf8);
}

/// The kinds of sinks fed by a store's updates through a stream–table join, each with
/// its store: merged with a window's close, with a left join's closing pass, as they are
/// (sliding windows on update, a count), and merged with sessions' closes. Each update that
/// waits at the join goes on in the transaction of its outbox entry's record: accepted
/// under exactly-once output (they were refused before).
const THROUGH_LOOKUPS: usize = 5;

fn through_lookups(kind: usize) -> (StreamsBuilder, &'static str) {
    let builder = StreamsBuilder::new();
    records_only(&builder);
    let clicks = builder.stream("clicks", Utf8, Utf8);
    let store = match kind {
        0 => {
            // A window's close merged with a store's updates through a stream–table join.
            let table = builder.table("names", Utf8, Utf8, "names");
            let named = builder
                .stream("views", Utf8, Utf8)
                .group_by_key(Utf8)
                .count("view-counts")
                .to_stream()
                .join(&table, |_, n: i64, name: String| n + name.len() as i64);
            clicks
                .group_by_key(Utf8)
                .windowed_by(TimeWindows::of_size(Duration::from_secs(60)))
                .emit_strategy(EmitStrategy::OnWindowClose)
                .count("per-minute")
                .to_stream()
                .map(|w, n| (w.key, n))
                .merge(&named)
                .to("per-minute", Utf8, BigEndianI64);
            "per-minute"
        }
        1 => {
            // A left join's closing pass merged with a store's updates through a
            // stream–table join.
            let other = builder.stream("views", Utf8, Utf8);
            let table = builder.table("names", Utf8, Utf8, "names");
            let counts = other
                .group_by_key(Utf8)
                .count("view-counts")
                .to_stream()
                .join(&table, |_, n: i64, name: String| format!("{name}:{n}"));
            clicks
                .left_join_stream(
                    &other,
                    JoinWindows::of(Duration::from_secs(10)),
                    "pairs",
                    (Utf8, Utf8, Utf8),
                    |_, l: &String, r: Option<&String>| format!("{l}+{}", r.map_or("none", |r| r)),
                )
                .merge(&counts)
                .to("joined", Utf8, Utf8);
            "view-counts"
        }
        2 => {
            // Sliding windows on update (several updates per write) through a stream–table
            // join.
            use lambda_streams::dsl::SlidingWindows;
            let table = builder.table("names", Utf8, Utf8, "names");
            clicks
                .group_by_key(Utf8)
                .windowed_by_sliding(SlidingWindows::of_time_difference_and_grace(
                    Duration::from_secs(30),
                    Duration::ZERO,
                ))
                .count("sliding-counts")
                .to_stream()
                .map(|w, n| (w.key, n))
                .join(&table, |_, n: i64, name: String| format!("{name}:{n}"))
                .to("sliding-counts", Utf8, Utf8);
            "sliding-counts"
        }
        3 => {
            let table = builder.table("names", Utf8, Utf8, "names");
            clicks
                .group_by_key(Utf8)
                .count("click-counts")
                .to_stream()
                .join(&table, |_, n: i64, name: String| format!("{name}:{n}"))
                .to("named-counts", Utf8, Utf8);
            "click-counts"
        }
        _ => {
            // Sessions emitted on close merged with a store's updates after a join.
            use lambda_streams::dsl::SessionWindows;
            let table = builder.table("names", Utf8, Utf8, "names");
            let named = builder
                .stream("views", Utf8, Utf8)
                .group_by_key(Utf8)
                .count("view-counts")
                .to_stream()
                .join(&table, |_, n: i64, name: String| n + name.len() as i64);
            clicks
                .group_by_key(Utf8)
                .windowed_by_session(SessionWindows::with_inactivity_gap(Duration::from_secs(30)))
                .emit_strategy(EmitStrategy::OnWindowClose)
                .count("sessions")
                .to_stream()
                .map(|w, n| (w.key, n))
                .merge(&named)
                .to("session-counts", Utf8, BigEndianI64);
            "sessions"
        }
    };
    (builder, store)
}

/// The kinds of sinks of records with no source record neither the outbox nor the claims
/// cover, each with the store it names: a table–table join declared while the builder's
/// guarantee was at least once (it emits straight from the two tables' writes), alone, and
/// merged with a count's updates.
const UNSOURCED: usize = 2;

/// A table–table join's updates, to a topic alone (`kind` 0) or merged with a count's
/// (1): refused under exactly-once output when built at least once (the store named is the
/// refusal's).
fn unsourced(kind: usize) -> (StreamsBuilder, &'static str) {
    (unsourced_on(StreamsBuilder::new(), kind), "names")
}

fn unsourced_on(builder: StreamsBuilder, kind: usize) -> StreamsBuilder {
    records_only(&builder);
    let names = builder.table("names", Utf8, Utf8, "names");
    let cities = builder.table("cities", Utf8, Utf8, "cities");
    let joined = names
        .join(&cities, |_, n: &String, c: &String| format!("{n}@{c}"))
        .to_stream();
    match kind {
        0 => joined.to("pairs", Utf8, Utf8),
        _ => {
            let counts = builder
                .stream("clicks", Utf8, Utf8)
                .group_by_key(Utf8)
                .count("click-counts")
                .to_stream()
                .map_values(|n: i64| n.to_string());
            joined.merge(&counts).to("pairs-and-counts", Utf8, Utf8);
        }
    }
    builder
}

/// Time windows' closes straight from their store, emitted on close or suppressed until
/// the window closes: under exactly-once output each window is claimed before it is
/// emitted, and the topology is accepted.
#[test]
fn time_window_closes_build_under_exactly_once() {
    use lambda_streams::dsl::Suppressed;
    let builder = StreamsBuilder::new();
    builder.output_guarantee(OutputGuarantee::ExactlyOnce);
    let clicks = builder.stream("clicks", Utf8, Utf8);
    clicks
        .group_by_key(Utf8)
        .windowed_by(TimeWindows::of_size(Duration::from_secs(60)))
        .emit_strategy(EmitStrategy::OnWindowClose)
        .count("per-minute")
        .to_stream()
        .map(|w, n| (w.key, n))
        .filter(|_, n| *n > 0)
        .to("per-minute", Utf8, BigEndianI64);
    clicks
        .group_by_key(Utf8)
        .windowed_by(TimeWindows::of_size(Duration::from_secs(3600)).grace(Duration::from_secs(1)))
        .count("per-hour")
        .suppress(Suppressed::until_window_closes())
        .to_stream()
        .map(|w, n| (w.key, n))
        .to("per-hour", Utf8, BigEndianI64);
    let topology = builder.try_build().expect("accepted under exactly_once");
    Handler::try_from_config(
        topology,
        Arc::new(MemoryStore::new()),
        &config(EXACTLY_ONCE),
    )
    .expect("a handler configured exactly once accepts it");
}

/// Aggregate updates straight from their store's write: counts, reductions and
/// aggregates, grouped and re-keyed (direct and through a repartition topic), time windows
/// emitted on update, a table's own updates. Under exactly-once output they keep the
/// outbox of updates (`state::outbox`) and are accepted.
#[test]
fn aggregate_updates_build_under_exactly_once() {
    use lambda_streams::dsl::Grouped;
    use lambda_streams::serdes::DecimalI64;
    let builder = StreamsBuilder::new();
    builder.output_guarantee(OutputGuarantee::ExactlyOnce);
    records_only(&builder);
    let clicks = builder.stream("clicks", Utf8, Utf8);
    clicks
        .group_by_key(Utf8)
        .count("counts")
        .to_stream()
        .to("counts", Utf8, DecimalI64);
    clicks
        .group_by_key(Utf8)
        .reduce("latest", |_, v| v, Utf8)
        .to_stream()
        .to("latest", Utf8, Utf8);
    clicks
        .group_by(|_, v: &String| v.clone(), Grouped::direct(Utf8))
        .aggregate(
            "lengths",
            || 0i64,
            |_, v: String, n| n + v.len() as i64,
            DecimalI64,
        )
        .to_change_stream()
        .to(
            "lengths",
            Utf8,
            lambda_streams::serdes::Nullable(DecimalI64),
        );
    clicks
        .group_by(|_, v: &String| v.clone(), Grouped::with(Utf8, Utf8))
        .count("by-value")
        .to_stream()
        .to("by-value-counts", Utf8, DecimalI64);
    clicks
        .group_by_key(Utf8)
        .windowed_by(TimeWindows::of_size(Duration::from_secs(60)))
        .count("per-minute")
        .to_stream()
        .map(|w, n| (w.key, n))
        .to("per-minute", Utf8, DecimalI64);
    builder
        .table("names", Utf8, Utf8, "names")
        .map_values(|v: &String| v.to_uppercase())
        .to_stream()
        .to("upper-names", Utf8, Utf8);
    let topology = builder.try_build().expect("accepted under exactly_once");
    assert!(
        topology
            .check_output_guarantee(OutputGuarantee::ExactlyOnce)
            .is_ok()
    );
    Handler::try_from_config(
        topology,
        Arc::new(MemoryStore::new()),
        &config(EXACTLY_ONCE),
    )
    .expect("a handler configured exactly once accepts it");
}

fn config(vars: &[(&str, &str)]) -> Config {
    Config::from_vars(vars.iter().map(|(k, v)| (k.to_string(), v.to_string()))).unwrap()
}

fn handler(topology: Topology, vars: &[(&str, &str)]) -> Handler {
    Handler::from_config(topology, Arc::new(MemoryStore::new()), &config(vars))
}

const EXACTLY_ONCE: &[(&str, &str)] = &[
    ("LAMBDA_STREAMS_OUTPUT_GUARANTEE", "exactly_once"),
    ("LAMBDA_STREAMS_APPLICATION_ID", "app"),
];

#[test]
fn records_only_topologies_build_under_exactly_once() {
    let builder = StreamsBuilder::new();
    builder.output_guarantee(OutputGuarantee::ExactlyOnce);
    records_only(&builder);
    let topology = builder.try_build().expect("records only: accepted");
    assert_eq!(topology.output_guarantee(), OutputGuarantee::ExactlyOnce);
    assert!(
        topology
            .check_output_guarantee(OutputGuarantee::ExactlyOnce)
            .is_ok()
    );
}

/// Two stores' updates merged into one sink (a count and a general aggregate, each straight
/// from its write, through stateless operators, also merged with a source stream's
/// records): each store keeps the outbox, so that each store's updates are exactly once,
/// and the topology is accepted (the fault model's proof: `eos_protocol`'s
/// `merged-updates`).
#[test]
fn two_stores_updates_merged_build_under_exactly_once() {
    let builder = StreamsBuilder::new();
    builder.output_guarantee(OutputGuarantee::ExactlyOnce);
    let clicks = builder.stream("clicks", Utf8, Utf8);
    let views = builder.stream("views", Utf8, Utf8);
    let counts = clicks.group_by_key(Utf8).count("click-counts").to_stream();
    let lengths = views
        .group_by_key(Utf8)
        .aggregate(
            "view-lengths",
            || 0i64,
            |_, v: String, n| n + v.len() as i64,
            BigEndianI64,
        )
        .to_stream();
    counts
        .map(|k, n| (format!("clicks:{k}"), n))
        .merge(&lengths.map(|k, n| (format!("views:{k}"), n)))
        .filter(|_, n| *n > 0)
        .merge(&clicks.map_values(|v: String| v.len() as i64))
        .to("merged", Utf8, BigEndianI64);
    let topology = builder.try_build().expect("accepted under exactly_once");
    assert!(
        topology
            .check_output_guarantee(OutputGuarantee::ExactlyOnce)
            .is_ok()
    );
    Handler::try_from_config(
        topology,
        Arc::new(MemoryStore::new()),
        &config(EXACTLY_ONCE),
    )
    .expect("a handler configured exactly once accepts it");
}

/// Closes merged with another store's updates: a time window emitted on close, sessions
/// emitted on close and a suppressed sliding window, each merged with a count's updates.
/// Each close is claimed as alone, the count's updates come from its outbox: accepted
/// (the fault model's proof: `eos_protocol`'s `window-closes` and `session-closes`).
#[test]
fn closes_merged_with_another_store_s_updates_build_under_exactly_once() {
    use lambda_streams::dsl::{SessionWindows, SlidingWindows, Suppressed};
    for kind in 0..3 {
        let builder = StreamsBuilder::new();
        builder.output_guarantee(OutputGuarantee::ExactlyOnce);
        let clicks = builder.stream("clicks", Utf8, Utf8);
        let counts = builder
            .stream("views", Utf8, Utf8)
            .group_by_key(Utf8)
            .count("view-counts")
            .to_stream();
        let grouped = clicks.group_by_key(Utf8);
        let closes = match kind {
            0 => grouped
                .windowed_by(TimeWindows::of_size(Duration::from_secs(60)))
                .emit_strategy(EmitStrategy::OnWindowClose)
                .count("per-minute")
                .to_stream()
                .map(|w, n| (w.key, n)),
            1 => grouped
                .windowed_by_session(SessionWindows::with_inactivity_gap(Duration::from_secs(30)))
                .emit_strategy(EmitStrategy::OnWindowClose)
                .count("sessions")
                .to_stream()
                .map(|w, n| (w.key, n)),
            _ => grouped
                .windowed_by_sliding(SlidingWindows::of_time_difference_and_grace(
                    Duration::from_secs(30),
                    Duration::ZERO,
                ))
                .count("sliding")
                .suppress(Suppressed::until_window_closes())
                .to_stream()
                .map(|w, n| (w.key, n)),
        };
        closes
            .merge(&counts)
            .filter(|_, n| *n > 0)
            .to("merged", Utf8, BigEndianI64);
        let topology = builder
            .try_build()
            .unwrap_or_else(|e| panic!("kind {kind}: refused: {e}"));
        Handler::try_from_config(
            topology,
            Arc::new(MemoryStore::new()),
            &config(EXACTLY_ONCE),
        )
        .unwrap_or_else(|e| panic!("kind {kind}: the handler refused: {e}"));
    }
}

/// A left join's output (its closing pass among it) merged with a store's updates, and
/// with a window's closes: what the join's arrivals emit is kept with their records, what
/// its closing pass emits is claimed by its rewrite, the updates come from the outbox, the
/// closes are claimed: accepted (the fault model's proof: `eos_protocol`'s outer join
/// merged with a count).
#[test]
fn a_join_s_closing_pass_merged_with_updates_or_closes_builds_under_exactly_once() {
    for closes in [false, true] {
        let builder = StreamsBuilder::new();
        builder.output_guarantee(OutputGuarantee::ExactlyOnce);
        let clicks = builder.stream("clicks", Utf8, Utf8);
        let views = builder.stream("views", Utf8, Utf8);
        let joined = clicks
            .left_join_stream(
                &views,
                JoinWindows::of(Duration::from_secs(10)),
                "pairs",
                (Utf8, Utf8, Utf8),
                |_, l: &String, r: Option<&String>| format!("{l}+{}", r.map_or("none", |r| r)),
            )
            .map_values(|v: String| v.len() as i64);
        let other = if closes {
            clicks
                .group_by_key(Utf8)
                .windowed_by(TimeWindows::of_size(Duration::from_secs(60)))
                .emit_strategy(EmitStrategy::OnWindowClose)
                .count("per-minute")
                .to_stream()
                .map(|w, n| (w.key, n))
        } else {
            views.group_by_key(Utf8).count("view-counts").to_stream()
        };
        joined.merge(&other).to("joined", Utf8, BigEndianI64);
        let topology = builder
            .try_build()
            .unwrap_or_else(|e| panic!("closes {closes}: refused: {e}"));
        Handler::try_from_config(
            topology,
            Arc::new(MemoryStore::new()),
            &config(EXACTLY_ONCE),
        )
        .unwrap_or_else(|e| panic!("closes {closes}: the handler refused: {e}"));
    }
}

/// A store's updates through a stream–table join (alone, sliding windows on update, merged
/// with a window's or sessions' closes, with a left join's closing pass): each update that
/// waits at the join goes on in its outbox entry's transaction, so under exactly-once
/// output the topology is accepted, by `try_build` and by a handler configured exactly
/// once (the fault model's proof: `eos_protocol`'s
/// `table_updates_through_a_stream_table_join_are_seen_once_by_read_committed_under_the_fault_model`).
#[test]
fn a_store_s_updates_through_a_stream_table_join_build_under_exactly_once() {
    for kind in 0..THROUGH_LOOKUPS {
        let (builder, _) = through_lookups(kind);
        builder.output_guarantee(OutputGuarantee::ExactlyOnce);
        let topology = builder
            .try_build()
            .unwrap_or_else(|e| panic!("kind {kind}: refused: {e}"));
        assert!(
            topology
                .check_output_guarantee(OutputGuarantee::ExactlyOnce)
                .is_ok(),
            "kind {kind}"
        );
        let (builder, _) = through_lookups(kind);
        Handler::try_from_config(
            builder.build(),
            Arc::new(MemoryStore::new()),
            &config(EXACTLY_ONCE),
        )
        .unwrap_or_else(|e| panic!("kind {kind}: a handler configured exactly once: {e}"));
    }
}

/// A table–table join is built for the guarantee the builder holds at `build()`, whatever
/// the order it was told in: asked for exactly-once output after the join is declared,
/// the join gets its decision store (the same graph as when asked before), and the
/// topology is accepted. Built at least once, the topology is refused under exactly-once
/// output, naming the sink and the store, at `check_output_guarantee` and by a handler.
#[test]
fn a_table_join_is_built_for_the_guarantee_asked_before_build_in_either_order() {
    for kind in 0..UNSOURCED {
        let (builder, _) = unsourced(kind);
        builder.output_guarantee(OutputGuarantee::ExactlyOnce);
        let after = builder
            .try_build()
            .unwrap_or_else(|e| panic!("kind {kind}: asked after the join: {e}"));
        assert!(
            after
                .check_output_guarantee(OutputGuarantee::ExactlyOnce)
                .is_ok()
        );
        // Asked before anything is declared: the same stores, and the same graph but for
        // the nodes' numbering (the decision store's nodes come last when asked after).
        let builder = StreamsBuilder::new();
        builder.output_guarantee(OutputGuarantee::ExactlyOnce);
        let before = unsourced_on(builder, kind)
            .try_build()
            .unwrap_or_else(|e| panic!("kind {kind}: asked before the join: {e}"));
        let stores = |t: &lambda_streams::Topology| {
            let mut names = t.store_names();
            names.sort();
            names
        };
        assert_eq!(stores(&after), stores(&before), "kind {kind}");
        assert!(
            stores(&after)
                .iter()
                .any(|s| s.starts_with("KTABLE-JOINTHIS")),
            "kind {kind}: a decision store: {:?}",
            stores(&after)
        );
        assert_eq!(
            shape(&after.describe().to_string()),
            shape(&before.describe().to_string()),
            "kind {kind}"
        );
        // Built at least once: no decision store, and refused under exactly-once output.
        let (builder, store) = unsourced(kind);
        let topology = builder.try_build().expect("at least once: accepted");
        assert!(
            !stores(&topology)
                .iter()
                .any(|s| s.starts_with("KTABLE-JOINTHIS")),
            "kind {kind}"
        );
        assert!(
            topology
                .check_output_guarantee(OutputGuarantee::AtLeastOnce)
                .is_ok()
        );
        let refused = topology
            .check_output_guarantee(OutputGuarantee::ExactlyOnce)
            .expect_err("refused");
        assert!(
            refused.operator.starts_with("KSTREAM-SINK"),
            "kind {kind}: {refused}"
        );
        let message = refused.to_string();
        assert!(message.contains(store), "kind {kind}: {message}");
        assert!(message.contains("exactly_once"), "kind {kind}: {message}");
    }
}

/// Asked for exactly-once output, then for at least once before `build`: the join is
/// built at least once (no decision store) and runs, its updates Kafka Streams' (an inner
/// join's update per change of either side where both have a value).
#[test]
fn a_table_join_asked_exactly_once_then_at_least_once_runs_at_least_once() {
    use lambda_streams::driver::TestDriver;
    let builder = StreamsBuilder::new();
    builder.output_guarantee(OutputGuarantee::ExactlyOnce);
    let names = builder.table("names", Utf8, Utf8, "names");
    let cities = builder.table("cities", Utf8, Utf8, "cities");
    names
        .join(&cities, |_, n: &String, c: &String| format!("{n} in {c}"))
        .to_stream()
        .to("profiles", Utf8, Utf8);
    builder.output_guarantee(OutputGuarantee::AtLeastOnce);
    let topology = builder.build();
    assert_eq!(topology.store_names(), ["names", "cities"]);
    let driver = TestDriver::new(topology);
    driver
        .input_topic("names", Utf8, Utf8)
        .pipe_input("u1", "Ada".to_owned())
        .unwrap();
    let mut city = driver.input_topic("cities", Utf8, Utf8);
    city.pipe_input("u1", "London".to_owned()).unwrap();
    city.pipe_input("u1", "Paris".to_owned()).unwrap();
    assert_eq!(
        driver
            .output_topic("profiles", Utf8, Utf8)
            .read_values()
            .unwrap(),
        ["Ada in London", "Ada in Paris"]
    );
}

/// A topology description's lines with the nodes' numbers removed, sorted: what stays
/// when the same operators are numbered in another order.
fn shape(description: &str) -> Vec<String> {
    let mut lines: Vec<String> = description
        .lines()
        .map(|line| {
            line.chars()
                .filter(|c| !c.is_ascii_digit())
                .collect::<String>()
        })
        .collect();
    lines.sort();
    lines
}

#[test]
fn a_handler_configured_exactly_once_refuses_an_unsourced_sink_before_any_record() {
    for kind in 0..UNSOURCED {
        let (builder, store) = unsourced(kind);
        let topology = builder.build();
        let e = Handler::try_from_config(
            topology.clone(),
            Arc::new(MemoryStore::new()),
            &config(EXACTLY_ONCE),
        )
        .err()
        .expect("refused");
        let message = e.to_string();
        assert!(
            message.contains("LAMBDA_STREAMS_OUTPUT_GUARANTEE=exactly_once")
                && message.contains("KSTREAM-SINK")
                && message.contains(store),
            "kind {kind}: {message}"
        );
        // A handler built anyway fails every event with it, never producing at least once.
        let h = handler(topology.clone(), EXACTLY_ONCE);
        let event = lambda_streams::event::KafkaEvent::decode(
            br#"{"eventSource":"SelfManagedKafka","bootstrapServers":"127.0.0.1:1","records":{"clicks-0":[{"topic":"clicks","partition":0,"offset":0,"timestamp":1,"timestampType":"CREATE_TIME","key":"aw==","value":"dg==","headers":[]}]}}"#,
        )
        .unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let e = rt.block_on(h.handle_event(&event)).expect_err("fails");
        assert!(e.to_string().contains("KSTREAM-SINK"), "kind {kind}: {e}");
        // At least once (the default), the same topology runs.
        let h = Handler::new(
            topology,
            Arc::new(MemoryStore::new()),
            Arc::new(MemorySink::new()),
        );
        assert_eq!(h.output_guarantee(), OutputGuarantee::AtLeastOnce);
        assert!(h.check().is_ok());
    }
}

#[test]
fn a_handler_reading_its_repartition_topic_is_accepted_and_a_given_sink_refused() {
    let topology = || {
        let builder = StreamsBuilder::new();
        records_only(&builder);
        builder.build()
    };
    let store = || Arc::new(MemoryStore::new());
    // Read uncommitted or not known, its batches of the repartition topic are read again
    // with read_committed; known to read committed, they are not.
    let h = Handler::try_from_config(topology(), store(), &config(EXACTLY_ONCE)).expect("accepted");
    assert_eq!(h.output_guarantee(), OutputGuarantee::ExactlyOnce);
    let mut vars = EXACTLY_ONCE.to_vec();
    vars.push(("LAMBDA_STREAMS_EVENT_ISOLATION", "read_committed"));
    assert!(config(&vars).event_read_committed);
    Handler::try_from_config(topology(), store(), &config(&vars)).expect("accepted");
    // A handler with a given sink cannot run transactions: refused, not at least once.
    let given = Handler::new(topology(), store(), Arc::new(MemorySink::new()))
        .with_options(config(&vars).batch)
        .with_application_id("app")
        .with_event_read_committed(true);
    let e = given.check().expect_err("refused");
    assert!(e.to_string().contains("Kafka"), "{e}");
}

/// A stream–table join with a grace period emits its held records from the closing pass,
/// and a left or outer stream–stream join its records that joined nothing, with no source
/// record of the batch: under exactly_once output the pass's rewrite of the join's item
/// claims them (`runtime::claims`), so straight to a sink through stateless operators
/// (merged with the streams' own records too) they build, and a handler configured
/// exactly once accepts them, with a dead-letter poison policy too (the pass's dead letters
/// are kept in its claims).
#[test]
fn joins_closing_passes_build_under_exactly_once_output() {
    let topology = |guarantee: OutputGuarantee, kind: usize| {
        let builder = StreamsBuilder::new();
        builder.output_guarantee(guarantee);
        let orders = builder.stream("orders", Utf8, Utf8);
        let windows = JoinWindows::of(Duration::from_secs(10)).grace(Duration::from_secs(2));
        let joined = match kind {
            0 => orders.left_join_stream(
                &builder.stream("payments", Utf8, Utf8),
                windows,
                "order-payments",
                (Utf8, Utf8, Utf8),
                |_, o: &String, p: Option<&String>| format!("{o}/{}", p.map_or("-", |p| p)),
            ),
            1 => orders.outer_join_stream(
                &builder.stream("payments", Utf8, Utf8),
                windows,
                "order-payments",
                (Utf8, Utf8, Utf8),
                |_, o: Option<&String>, p: Option<&String>| {
                    format!("{}/{}", o.map_or("-", |o| o), p.map_or("-", |p| p))
                },
            ),
            2 => orders.join_with_grace(
                &builder.versioned_table("prices", Utf8, Utf8, "prices", Duration::from_secs(600)),
                Duration::from_secs(5),
                "held-orders",
                (Utf8, Utf8),
                |_, o: String, p: String| format!("{o}@{p}"),
            ),
            _ => orders.left_join_with_grace(
                &builder.versioned_table("prices", Utf8, Utf8, "prices", Duration::from_secs(600)),
                Duration::from_secs(5),
                "held-orders",
                (Utf8, Utf8),
                |_, o: String, p: Option<String>| format!("{o}@{}", p.unwrap_or_default()),
            ),
        };
        joined
            .filter(|_, v| !v.is_empty())
            .map_values(|v| v.to_uppercase())
            .merge(&orders)
            .to("out", Utf8, Utf8);
        builder.try_build()
    };
    for kind in 0..4 {
        assert!(topology(OutputGuarantee::AtLeastOnce, kind).is_ok());
        let built = match topology(OutputGuarantee::ExactlyOnce, kind) {
            Ok(built) => built,
            Err(e) => panic!("kind {kind}: refused under exactly_once: {e}"),
        };
        for poison in ["fail", "skip", "dead-letter:dead"] {
            let mut vars = EXACTLY_ONCE.to_vec();
            vars.push(("LAMBDA_STREAMS_POISON_POLICY", poison));
            if let Err(e) = Handler::try_from_config(
                built.clone(),
                Arc::new(MemoryStore::new()),
                &config(&vars),
            ) {
                panic!("kind {kind}, {poison}: refused: {e}");
            }
        }
    }
}

/// Sessions and sliding windows emitted on update (Kafka Streams' default), straight from
/// their store through stateless operators, with the tombstones of merged sessions
/// (`to_change_stream`): one write changes several sessions or windows, and the outbox
/// entry of the write holds the state it left, from which exactly the updates of that
/// write are derived, so they are accepted under exactly_once output, also merged with
/// another store's updates (each store's outbox covers its own).
#[test]
fn sessions_and_sliding_windows_on_update_build_under_exactly_once() {
    use lambda_streams::dsl::{SessionWindows, SlidingWindows};
    use lambda_streams::serdes::{DecimalI64, Nullable};
    let topology = |guarantee: OutputGuarantee, sliding: bool, merged: bool| {
        let builder = StreamsBuilder::new();
        builder.output_guarantee(guarantee);
        let stream = builder.stream("clicks", Utf8, Utf8);
        let grouped = stream.group_by_key(Utf8);
        let updates = if sliding {
            grouped
                .windowed_by_sliding(SlidingWindows::of_time_difference_and_grace(
                    Duration::from_secs(30),
                    Duration::from_secs(5),
                ))
                .count("sliding")
                .to_stream()
                .map(|w, n| (format!("{}@{}", w.key, w.start), Some(n)))
        } else {
            grouped
                .windowed_by_session(
                    SessionWindows::with_inactivity_gap(Duration::from_secs(30))
                        .grace(Duration::from_secs(5)),
                )
                .count("sessions")
                .to_change_stream()
                .map(|w, n| (format!("{}@{}-{}", w.key, w.start, w.end), n))
        };
        let updates = updates.filter(|k, _| !k.is_empty());
        if merged {
            let totals = stream
                .group_by_key(Utf8)
                .count("totals")
                .to_stream()
                .map(|k, n| (k, Some(n)));
            updates
                .merge(&totals)
                .to("window-counts", Utf8, Nullable(DecimalI64));
        } else {
            updates.to("window-counts", Utf8, Nullable(DecimalI64));
        }
        builder.try_build()
    };
    for sliding in [false, true] {
        assert!(topology(OutputGuarantee::AtLeastOnce, sliding, false).is_ok());
        assert!(topology(OutputGuarantee::AtLeastOnce, sliding, true).is_ok());
        let accepted = topology(OutputGuarantee::ExactlyOnce, sliding, false)
            .unwrap_or_else(|e| panic!("sliding {sliding}: refused: {e}"));
        Handler::try_from_config(
            accepted,
            Arc::new(MemoryStore::new()),
            &config(EXACTLY_ONCE),
        )
        .expect("a handler configured exactly once accepts it");
        // Merged with another store's updates: each store's outbox covers its own.
        let merged = topology(OutputGuarantee::ExactlyOnce, sliding, true)
            .unwrap_or_else(|e| panic!("sliding {sliding}, merged: refused: {e}"));
        Handler::try_from_config(merged, Arc::new(MemoryStore::new()), &config(EXACTLY_ONCE))
            .expect("a handler configured exactly once accepts the merge");
    }
}

/// Final results of session and sliding windows come from the closing pass, with no source
/// record of the batch: under exactly_once output its rewrite of the key's item claims them
/// (`runtime::claims`), so straight to a sink through stateless operators (merged with the
/// stream's own records too) they build, and merged with another store's updates too (its
/// outbox covers those).
#[test]
fn final_sessions_and_sliding_windows_build_under_exactly_once_output() {
    use lambda_streams::dsl::{SessionWindows, SlidingWindows};
    let topology = |guarantee: OutputGuarantee, sliding: bool, merged: bool| {
        let builder = StreamsBuilder::new();
        builder.output_guarantee(guarantee);
        let stream = builder.stream("clicks", Utf8, Utf8);
        let grouped = stream.group_by_key(Utf8);
        let finals = if sliding {
            grouped
                .windowed_by_sliding(SlidingWindows::of_time_difference_and_grace(
                    Duration::from_secs(30),
                    Duration::ZERO,
                ))
                .emit_strategy(EmitStrategy::OnWindowClose)
                .count("sliding")
        } else {
            grouped
                .windowed_by_session(SessionWindows::with_inactivity_gap(Duration::from_secs(30)))
                .emit_strategy(EmitStrategy::OnWindowClose)
                .count("sessions")
        };
        let counts = finals
            .to_stream()
            .map(|w, n| (w.key, n.to_string()))
            .filter(|_, n| !n.is_empty());
        let out = if merged {
            // Merged with another store's updates (merging with the stream's own records
            // is fine: those go in their records' transactions).
            let totals = stream
                .group_by_key(Utf8)
                .count("totals")
                .to_stream()
                .map(|k, n| (k, n.to_string()));
            counts.merge(&stream).merge(&totals)
        } else {
            counts.merge(&stream)
        };
        out.to("window-counts", Utf8, Utf8);
        builder.try_build()
    };
    for sliding in [false, true] {
        assert!(topology(OutputGuarantee::AtLeastOnce, sliding, false).is_ok());
        assert!(topology(OutputGuarantee::AtLeastOnce, sliding, true).is_ok());
        if let Err(e) = topology(OutputGuarantee::ExactlyOnce, sliding, false) {
            panic!("sliding {sliding}: refused: {e}");
        }
        // Merged with another store's updates: the closes claimed as alone, the other
        // store's updates from its outbox.
        if let Err(e) = topology(OutputGuarantee::ExactlyOnce, sliding, true) {
            panic!("sliding {sliding}, merged with a count's updates: refused: {e}");
        }
    }
}

/// Table–table joins (inner, left, outer; on tables of topics, of streams and of
/// aggregations, filtered or mapped before and after) build under exactly-once output when
/// the builder asks for it before the join is declared: each key's joined update is
/// decided once in the join's store and emitted from its outbox. Declared first and run by
/// a handler configured exactly once, the same join is refused, naming the sink.
#[test]
fn table_table_joins_build_under_exactly_once_output() {
    use lambda_streams::serdes::Nullable;
    let joins = |guarantee: Option<OutputGuarantee>| {
        let builder = StreamsBuilder::new();
        if let Some(guarantee) = guarantee {
            builder.output_guarantee(guarantee);
        }
        let names = builder.table("names", Utf8, Utf8, "names");
        let cities = builder
            .stream("moves", Utf8, Utf8)
            .to_table("cities", Utf8, Utf8)
            .filter(|_, c| !c.is_empty());
        let counts = builder
            .stream("clicks", Utf8, Utf8)
            .group_by_key(Utf8)
            .count("clicks");
        names
            .join(&cities, |_, n: &String, c: &String| format!("{n}@{c}"))
            .to_stream()
            .to("inner", Utf8, Utf8);
        names
            .map_values(|n| n.to_uppercase())
            .left_join(&counts, |_, n: &String, c: Option<&i64>| {
                format!("{n}:{c:?}")
            })
            .filter(|_, v| !v.is_empty())
            .to_change_stream()
            .to("left", Utf8, Nullable(Utf8));
        cities
            .outer_join(&counts, |_, c: Option<&String>, n: Option<&i64>| {
                format!("{c:?}:{n:?}")
            })
            .to_change_stream()
            .to("outer", Utf8, Nullable(Utf8));
        builder
    };
    let topology = joins(Some(OutputGuarantee::ExactlyOnce))
        .try_build()
        .expect("accepted under exactly-once output");
    assert!(
        topology
            .check_output_guarantee(OutputGuarantee::ExactlyOnce)
            .is_ok()
    );
    // A handler configured exactly once runs it.
    assert!(
        Handler::try_from_config(
            topology,
            Arc::new(MemoryStore::new()),
            &config(EXACTLY_ONCE)
        )
        .is_ok()
    );
    // Declared at least once, the joins emit straight from the two tables' writes: refused
    // under exactly-once output, naming the sink and what to do.
    let topology = joins(None).try_build().expect("accepted at least once");
    let refused = topology
        .check_output_guarantee(OutputGuarantee::ExactlyOnce)
        .expect_err("refused");
    assert!(refused.operator.starts_with("KSTREAM-SINK"), "{refused}");
    assert!(
        refused
            .to_string()
            .contains("output_guarantee(OutputGuarantee::ExactlyOnce)"),
        "{refused}"
    );
}
