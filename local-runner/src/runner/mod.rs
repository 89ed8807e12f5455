//! The consume → batch → invoke → commit loop, by the event source's rules.
//!
//! Several partitions are in flight at once, as with the event source: up to
//! [`RunnerConfig::concurrency`] invocations run concurrently, each as its own task, and a
//! batch is formed only from partitions without a batch in flight, so each partition has
//! at most one batch in flight and is delivered in offset order. The loop meanwhile keeps
//! consuming (which also serves the consumer group's rebalance callbacks), and settles
//! each invocation as it completes. Every partition of the event gets its verdict:
//!
//! - success: its records are done;
//! - a partial batch response naming offset N: its records below N are done, and it
//!   resumes from N (this counts as a failed attempt for the records from N);
//! - a function error (or an invalid response): nothing is done; with bisection, the
//!   batch is retried as two halves (that does not count as an attempt), else as a whole.
//!
//! The partitions of a failed batch are retried together, as a *retry group*, after
//! their own backoff (`retry_backoff`, doubling per attempt, at most 5 s); the other
//! partitions are not delayed. A partition whose failed attempts exceed the retry limit
//! gives up the records of the event (to the on-failure destination, or skipped with a
//! warning). Records older than the maximum record age are given up before delivery.
//! Then the offsets of the done records are committed: only ever after success or a
//! give-up.
//!
//! Consuming runs ahead of the invocations by a bounded amount: a partition with ten
//! batches (at least 10,000 records) or 24 MB buffered is paused (the consumer keeps
//! polling, so rebalances are still served) and resumed once half of it is delivered.
//!
//! Several runners in one consumer group share the partitions ([`crate::rebalance`]):
//! the records of a partition revoked by a rebalance are dropped; a batch of it in flight
//! at the revocation runs to its end, but its outcome is dropped (its records are neither
//! committed nor retried here: the new owner delivers them again), and a partition is
//! committed only while it is still owned under the lease its records were read under.

//!
//! The parts, one a file:
//!
//! | file | what it does |
//! |---|---|
//! | [`event_loop`] | one run's loop, turn by turn, and its end |
//! | [`consume`] | the group consumer, received records, backpressure |
//! | [`schedule`] | which batch goes next (retries after their backoff, fresh batches when due) |
//! | [`invoke`] | a batch's invocation as a task, with the faults that apply to it |
//! | [`settle`] | what an invocation's outcome does to each partition |
//! | [`give_up`] | records past the retry limit or the maximum record age |
//! | [`commit`] | committing done records; the stop conditions that read the group's commits |
//! | [`state`] | what the loop remembers between turns |
//! | [`report`] | the run's summary and its progress line |

mod commit;
mod consume;
mod event_loop;
mod give_up;
mod invoke;
mod report;
mod schedule;
mod settle;
mod state;

use std::sync::Arc;

use rdkafka::consumer::StreamConsumer;

pub use crate::batch::{MAX_BATCH_SIZE, MAX_PAYLOAD_BYTES};
pub use crate::config::{EventShape, Faults, RunnerConfig};
use crate::position;
use crate::rebalance::RebalanceContext;
use crate::transport::Transport;
pub use report::RunSummary;

/// The runner's consumer: its context tracks the partitions it owns.
type GroupConsumer = StreamConsumer<RebalanceContext>;

/// Runs one function against the broker.
pub struct Runner {
    config: RunnerConfig,
    transport: Arc<dyn Transport>,
}

impl Runner {
    /// A runner invoking `transport`. Invalid settings are an error naming the setting.
    pub fn new(config: RunnerConfig, transport: Arc<dyn Transport>) -> Result<Self, String> {
        config.validate()?;
        Ok(Runner { config, transport })
    }

    /// Commits the starting position for the partitions the group has never committed
    /// (see [`position`]). [`run`](Self::run) does it first; call it earlier to fix the
    /// position of `LATEST` before producing.
    pub fn initialize_positions(&self) -> Result<usize, String> {
        let c = &self.config;
        position::initialize(
            &c.bootstrap_servers,
            &c.group_id,
            &c.topics,
            c.starting_position,
        )
    }

    /// Consumes, batches, invokes and commits until stopped (or, with `until_idle`,
    /// until the group has consumed everything; with `until_caught_up`, until the records
    /// there were at the start are done).
    pub async fn run(&self) -> Result<RunSummary, String> {
        let mut session = event_loop::Session::open(self)?;
        let stopped = loop {
            if let Some(stopped) = session.turn().await? {
                break stopped;
            }
        };
        session.finish(stopped).await
    }
}
