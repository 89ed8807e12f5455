//! The runtime: executes a [`Topology`](crate::dsl::Topology) on one batch.

pub(crate) mod batch;
pub(crate) mod context;

pub use batch::{
    BatchOptions, BatchOutcome, BatchReport, ERROR_HEADER, OUTPUT_CHUNK, PoisonPolicy,
};
