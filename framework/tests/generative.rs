//! The generative differential test (issue 12, item 2).
//!
//! Random topologies from the DSL ([`Plan`]: a small enum tree that drives both the real
//! DSL and the reference), random inputs (a few topics and partitions, a small key space,
//! null keys, null values and tombstones, timestamps out of order) and random fault
//! schedules (duplicate delivery, a retry with shifted boundaries, a crash after k state
//! writes, a zombie finishing after its retry, redelivery of an old range), run through
//! `Topology::process_with` by an in-test event source, and checked against an
//! independent reference interpreter (module `reference`): record at a time, no
//! batching, no watermarks, no store, with Kafka Streams' semantics where they are
//! defined.
//!
//! Shapes are grouped in named families ([`FAMILIES`]); the ones enabled by default are
//! in [`DEFAULT_FAMILIES`]. Environment:
//! - `GENERATIVE_FAMILIES=all` (or a comma-separated list of names) selects families;
//! - `GENERATIVE_CASES=N` runs N cases per family and base seed (default 300);
//! - `GENERATIVE_SEED=<family>:<seed>` replays one case (as printed on failure).
//! - `GENERATIVE_RANDOM_BASE=<seed>` fixes the run's random base seed (printed at the start),
//!   to repeat a whole run.
//! - `GENERATIVE_LIST_FAILURES=1` prints one line per failing case (its seed and difference).
//!
//! A topology that the builder refuses (a panic in `build()` or while composing it) is
//! counted as refused and skipped: refusing is what the project's rule allows.

#![allow(clippy::unwrap_used)]

#[path = "generative/harness.rs"]
pub(crate) mod harness;
#[path = "reference/kafka_sliding.rs"]
pub(crate) mod kafka_sliding;
#[path = "generative/plan.rs"]
pub(crate) mod plan;
#[path = "generative/reference.rs"]
pub(crate) mod reference;
/// The run over the families, shared with the test on DynamoDB.
#[path = "generative/suite.rs"]
pub mod suite;

use lambda_streams::state::memory::MemoryStore;

/// Every family of shapes the generator knows.
pub const FAMILIES: &[&str] = &[
    "stateless",
    "repartition_once",
    "aggregate_by_key",
    "aggregate_direct",
    "aggregate_repartition",
    "tumbling",
    "hopping",
    "hopping_near_zero",
    // Sessions, sliding windows, emit-on-close, stream–stream joins, poison records. Those
    // not in DEFAULT_FAMILIES fail today, for the reason beside them:
    "session",
    // Lateness as Kafka Streams judges it: the end of the session a record merges into.
    "session_late",
    "sliding",
    "sliding_late",
    "sliding_null_values",
    // Session and sliding windows emitting on close: each session or window once, when
    // the low watermark of the partitions feeding them passes its end + grace.
    "session_close",
    "sliding_close",
    "emit_on_close",
    "stream_stream_join",
    // Left and outer joins with windows that close before the end: records that joined
    // nothing are emitted alone when the lowest stream time of the partitions feeding the
    // join passes their window and grace, also for keys that get no later record.
    "stream_stream_join_close",
    "stream_stream_self_join",
    "stream_stream_join_timestamps",
    "stream_stream_join_fan_out",
    // An inner join's pairs aggregated: each pair counted once under every fault.
    "stream_stream_join_aggregate",
    "poison_stateless",
    "poison_aggregate",
    "poison_window",
    "windowed_after_repartition",
    "table_source",
    // Two tables' updates merged into one sink.
    "merged_tables",
    // A table's updates left-joined with a topic's table.
    "table_updates_lookup",
    "to_table",
    "stream_table_join",
    // Stream–table joins with versioned tables, as of each record's timestamp; with a
    // grace period, records released once the stream's partitions pass ts + grace.
    "versioned_table_join",
    "versioned_grace_join",
    "table_table_join",
    "table_table_join_churn",
    "join_then_aggregate",
    "join_then_window",
    "two_joins_then_aggregate",
    "two_repartition_hops",
    "merge_direct_with_repartitioned",
    "table_update_stream_to_table",
    "join_merge_aggregate",
    "join_merge_window",
    "join_merge_repartition_count",
    "split_branch_aggregates",
    "split_merge_branches",
    // Refused while composing ("this table cannot be joined by key: ... the result of a
    // table-table join"): a table–table join's table has no lookup, so no stream can join
    // it (Kafka Streams allows it).
    "joined_table_lookup",
    // Refused as `joined_table_lookup`: a table–table join cannot be joined again.
    "table_join_chain",
    "to_table_table_join",
    "table_chains",
];

/// The families enabled by default: those that pass today. The others
/// (`GENERATIVE_FAMILIES=all` runs them) fail for the reason beside them in [`FAMILIES`],
/// except `table_update_stream_to_table` (a table's update stream read into a table),
/// `joined_table_lookup` and `table_join_chain` (a table–table join's table joined again),
/// whose every case the builder refuses.
pub const DEFAULT_FAMILIES: &[&str] = &[
    "session",
    "session_late",
    "sliding",
    "sliding_late",
    "sliding_null_values",
    "session_close",
    "sliding_close",
    "emit_on_close",
    "stream_stream_join",
    "stream_stream_join_close",
    "stream_stream_self_join",
    "stream_stream_join_timestamps",
    "stream_stream_join_fan_out",
    // An inner join's pairs aggregated: each pair counted once under every fault.
    "stream_stream_join_aggregate",
    "poison_stateless",
    "poison_aggregate",
    "poison_window",
    "stateless",
    "repartition_once",
    "aggregate_by_key",
    "aggregate_direct",
    "aggregate_repartition",
    "tumbling",
    "hopping",
    "hopping_near_zero",
    "windowed_after_repartition",
    "table_source",
    // Two tables' updates merged into one sink.
    "merged_tables",
    // A table's updates left-joined with a topic's table.
    "table_updates_lookup",
    "to_table",
    "stream_table_join",
    // Stream–table joins with versioned tables, as of each record's timestamp; with a
    // grace period, records released once the stream's partitions pass ts + grace.
    "versioned_table_join",
    "versioned_grace_join",
    "table_table_join",
    "table_table_join_churn",
    "join_then_aggregate",
    "join_then_window",
    "two_joins_then_aggregate",
    "two_repartition_hops",
    "merge_direct_with_repartitioned",
    "join_merge_aggregate",
    "join_merge_window",
    "join_merge_repartition_count",
    "split_branch_aggregates",
    "split_merge_branches",
    "to_table_table_join",
    "table_chains",
];

#[test]
fn random_topologies_equal_the_reference_under_faults() {
    // This file is also a module of the test on DynamoDB (`tests/tests/generative_dynamo.rs`,
    // for the families above); the in-memory run belongs to this crate alone.
    if module_path!() != "generative" {
        return;
    }
    suite::run_all(300, suite::FIXED_SEEDS, &|| Box::new(MemoryStore::new()));
}
