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
mod harness;
#[path = "generative/plan.rs"]
mod plan;
#[path = "generative/reference.rs"]
mod reference;
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
    // Lateness is judged on the record's own timestamp, not on the session it merges
    // into (a difference from Kafka Streams that dsl/session.rs documents).
    "session_late",
    "sliding",
    // After a crash part-way through a batch's writes, the retry emits only the windows
    // still in a key's buffer: those of records the first attempt wrote and then dropped
    // (more than 2 × difference + grace behind the key's newest) are never emitted. It
    // shows when that key was written before the crash, which depends on the order of the
    // batch's writes (0 to 2 cases in 1,200, varying between runs of the same seeds).
    "sliding_late",
    // A null value in a sliding window fails every batch of its partition ("a stored
    // window record does not decode").
    "sliding_null_values",
    "emit_on_close",
    "stream_stream_join",
    // Left and outer joins close a record's window on the stream time of whichever side's
    // batch ran first, so a partner on the other side's partition arriving later, within
    // the grace, no longer joins: the pair is lost and the record emitted alone.
    "stream_stream_join_close",
    // With both sides reading one topic, every pair is emitted twice.
    "stream_stream_self_join",
    // Under the faulty schedule only, a pair can carry the timestamp of the record that
    // emitted it (`left_join_stream` documents "its own"), not the later of the two as in
    // Kafka Streams.
    "stream_stream_join_timestamps",
    // A source record that reaches the join as several records (`flat_map_values`) has
    // its pairs emitted twice.
    "stream_stream_join_fan_out",
    "poison_stateless",
    "poison_aggregate",
    "poison_window",
    "windowed_after_repartition",
    "table_source",
    "to_table",
    "stream_table_join",
    "table_table_join",
    "join_then_aggregate",
    "join_then_window",
    "two_joins_then_aggregate",
    "two_repartition_hops",
    "merge_direct_with_repartitioned",
    "table_update_stream_to_table",
];

/// The families enabled by default: those that pass today. The others
/// (`GENERATIVE_FAMILIES=all` runs them) fail for the reason beside them in [`FAMILIES`],
/// except `table_update_stream_to_table` (a table's update stream read into a table),
/// whose every case the builder refuses.
pub const DEFAULT_FAMILIES: &[&str] = &[
    "session",
    "sliding",
    "emit_on_close",
    "stream_stream_join",
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
    "to_table",
    "stream_table_join",
    "table_table_join",
    "join_then_aggregate",
    "join_then_window",
    "two_joins_then_aggregate",
    "two_repartition_hops",
    "merge_direct_with_repartitioned",
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
