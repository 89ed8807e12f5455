//! # The local runner
//!
//! Plays the part of the AWS Lambda Kafka event source mapping against a real Kafka
//! broker, so that a function runs on a laptop as it will in Lambda: it consumes with a
//! consumer group, forms batches by the event source's rules (batch size, batching
//! window, 6 MB payload cap, several partitions per event, in offset order), builds the
//! very same event JSON, invokes the function through a [`Transport`], and commits the
//! offsets only after the function succeeded. A failed batch is retried, like the event
//! source does (by default without limit).
//!
//! [`faults`](runner::Faults) inject, on purpose, the redeliveries that the real event
//! source produces now and then (a batch delivered twice, a retry whose batch ends later),
//! to show that a function's effect stays exactly-once.

pub mod admin;
pub mod embedded;
pub mod functions;
pub mod runner;
pub mod transport;

pub use runner::{EventShape, Faults, RunSummary, Runner, RunnerConfig};
pub use transport::{InProcess, Transport};
