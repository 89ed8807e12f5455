//! # The local runner
//!
//! Plays the part of the AWS Lambda Kafka event source mapping (ESM) against a real Kafka
//! broker, so that a function runs on a laptop as it will in Lambda: it consumes with a
//! consumer group from its [starting position](position), forms batches by the event
//! source's rules ([`batch`]: batch size, batching window, 6 MB payload cap, several
//! partitions per event, in offset order), builds the very same event JSON, invokes the
//! function through a [`Transport`] (in-process, or [`Http`]: the Lambda Invoke API of
//! `cargo lambda watch` or any emulator), honours partial batch responses ([`response`]),
//! [`filter`]s records by their value (`FilterCriteria`), retries (with a limit, a maximum
//! record age and bisection as options), sends records
//! it gives up on to an on-failure [`destination`] topic, and commits offsets only for
//! records done.
//!
//! [`faults`](config::Faults) inject, on purpose, the redeliveries that the real event
//! source produces now and then (a batch delivered twice, a retry whose batch ends later),
//! to show that a function's effect stays exactly-once.
//!
//! The example functions of the workspace run in-process by name (module `functions`, the
//! default cargo feature `examples`). Built with `--no-default-features`, the runner
//! depends on the framework only and runs functions over the Lambda Invoke API.

pub mod admin;
pub mod batch;
pub mod config;
pub mod destination;
pub mod embedded;
pub mod filter;
#[cfg(feature = "examples")]
pub mod functions;
pub mod position;
pub mod rebalance;
pub mod response;
pub mod runner;
pub mod scaffold;
pub mod schema;
pub mod transport;

/// The attribute to implement [`Transport`] with (re-exported from `async-trait`).
pub use async_trait::async_trait;
pub use config::{EventShape, Faults, RunnerConfig};
pub use position::StartingPosition;
pub use runner::{RunSummary, Runner};
pub use transport::{Http, InProcess, InvokeError, Transport};
