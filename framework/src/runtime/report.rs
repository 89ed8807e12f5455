//! What a batch did: the [`BatchReport`] of counts and the [`BatchOutcome`] with its
//! partial-batch failures.

use std::time::Duration;

use crate::event::TopicPartition;
use crate::state::WriteStats;

/// What one batch did: counts for logs, metrics and benchmarks.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BatchReport {
    /// Source records processed.
    pub records_in: u64,
    /// Records produced to sinks (dead letters included).
    pub records_out: u64,
    /// Distinct state items the batch touched (one write each in the common case).
    pub items_touched: u64,
    /// Records not aggregated because their key serialized to null.
    pub dropped_null_keys: u64,
    /// Records not aggregated because their value is a Kafka null (a `None` of a
    /// [`Nullable`](crate::serdes::Nullable) serde), skipped as Kafka Streams skips them:
    /// by `count`, `aggregate` and `reduce`, by sliding-window aggregations, and by
    /// stream–table joins (with or without a grace period).
    pub dropped_null_values: u64,
    /// (record, window) pairs dropped because the window had closed (later than its end
    /// plus grace, by the partition's stream time).
    pub late_records: u64,
    /// Poison records met (skipped, dead-lettered or failed).
    pub poison_records: u64,
    /// Poison records produced to the dead-letter topic.
    pub dead_lettered: u64,
    /// Windows of emit-on-close stores this batch closed and emitted.
    pub windows_closed: u64,
    /// Distinct keys read from joined tables.
    pub join_lookups: u64,
    /// The cost of the state writes.
    pub state: WriteStats,
    /// Wall time of the batch.
    pub duration: Duration,
}

/// The result of a batch that did not fail as a whole.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BatchOutcome {
    /// What the batch did.
    pub report: BatchReport,
    /// With partial batch responses: per failed partition, the offset to resume from.
    pub failures: Vec<(TopicPartition, i64)>,
}

impl BatchOutcome {
    /// The Lambda response: `{"batchItemFailures":[{"itemIdentifier":{"topic-partition":"<topic>-<p>","offset":N}}]}`
    /// ([`event::response`](crate::event::response)).
    pub fn response(&self) -> serde_json::Value {
        crate::event::response::batch_item_failures(&self.failures)
    }
}
