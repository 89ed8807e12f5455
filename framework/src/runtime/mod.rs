//! The runtime: executes a [`Topology`](crate::topology::Topology) on one batch.

pub(crate) mod batch;
pub(crate) mod claims;
pub(crate) mod options;
pub(crate) mod poison;
pub(crate) mod records;
pub(crate) mod report;

pub use crate::wire::ERROR_HEADER;
pub use batch::OUTPUT_CHUNK;
pub(crate) use batch::{Shadow, StreamTime};
pub(crate) use claims::WindowClaims;
pub use options::{BatchOptions, DEFAULT_IDLE_PARTITION_TIMEOUT, OutputGuarantee, PoisonPolicy};
pub use report::{BatchOutcome, BatchReport};
