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
#[path = "generative/suite.rs"]
mod suite;

use lambda_streams::state::memory::MemoryStore;

#[test]
fn random_topologies_equal_the_reference_under_faults() {
    suite::run_all(300, suite::FIXED_SEEDS, &|| Box::new(MemoryStore::new()));
}
