//! Sinks: where output records go. [`KafkaSink`] produces to Kafka (idempotent, every
//! record acknowledged before the batch succeeds); [`MemorySink`] collects them for tests.

use std::sync::{Mutex, PoisonError};

use async_trait::async_trait;

/// The rdkafka producer, in [`crate::kafka`].
pub use crate::kafka::KafkaSink;
pub use crate::wire::{PATH_HEADER, SEQUENCE_HEADER, SOURCE_HEADER, VERSION_HEADER};

/// What a `read_committed` consumer of the function's Kafka output sees when a batch is
/// delivered again (`LAMBDA_STREAMS_OUTPUT_GUARANTEE`). The state in DynamoDB is exactly
/// once under both; this is about the records produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OutputGuarantee {
    /// Outputs are at least once: a retried batch produces its records again (idempotent
    /// producer, one per cluster).
    #[default]
    AtLeastOnce,
    /// Outputs are exactly once for a `read_committed` consumer: per source partition of the
    /// event, a transactional producer with a stable `transactional.id`, and the partition's
    /// progress committed in a shadow consumer group inside each transaction (design notes,
    /// section 5a; `docs/state.md`). Aggregate and table updates straight from their
    /// store's write are produced from the items' outbox of updates (`state::outbox`),
    /// closes and closing passes are claimed before they are emitted, and a join's results
    /// are decided once in its item; the outputs none of these covers yet (listed in
    /// `docs/state.md`, "Exactly-once output") are refused, never produced at least once.
    ExactlyOnce,
}

impl std::str::FromStr for OutputGuarantee {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "at_least_once" => Ok(OutputGuarantee::AtLeastOnce),
            "exactly_once" => Ok(OutputGuarantee::ExactlyOnce),
            other => Err(format!(
                "unknown output guarantee {other:?}: use at_least_once or exactly_once"
            )),
        }
    }
}

/// A record to produce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputRecord {
    /// The topic.
    pub topic: String,
    /// The key (`None`: null).
    pub key: Option<Vec<u8>>,
    /// The value (`None`: a tombstone).
    pub value: Option<Vec<u8>>,
    /// Headers, in order.
    pub headers: Vec<(String, Vec<u8>)>,
    /// Event time in epoch milliseconds.
    pub timestamp: Option<i64>,
}

impl OutputRecord {
    /// The value of the first header called `name`.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }
}

/// Producing failed; the batch fails and is delivered again.
#[derive(Debug, thiserror::Error)]
#[error("producing to topic {topic:?} failed: {reason}")]
pub struct SinkError {
    /// The topic.
    pub topic: String,
    /// What the producer said.
    pub reason: String,
}

/// Where a batch's output records go. `send` returns only once every record is
/// acknowledged, so a batch succeeds only when its output is durable.
#[async_trait]
pub trait Sink: Send + Sync {
    /// Produces `records` and waits for all acknowledgements.
    async fn send(&self, records: Vec<OutputRecord>) -> Result<(), SinkError>;
}

/// Collects output records in memory (for tests).
#[derive(Debug, Default)]
pub struct MemorySink {
    records: Mutex<Vec<OutputRecord>>,
}

impl MemorySink {
    /// An empty sink.
    pub fn new() -> Self {
        Self::default()
    }

    /// Everything sent so far, in order.
    pub fn records(&self) -> Vec<OutputRecord> {
        self.records
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Calls `f` on everything sent so far, in order, without copying it.
    pub(crate) fn inspect<R>(&self, f: impl FnOnce(&[OutputRecord]) -> R) -> R {
        f(&self.records.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

#[async_trait]
impl Sink for MemorySink {
    async fn send(&self, records: Vec<OutputRecord>) -> Result<(), SinkError> {
        self.records
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(records);
        Ok(())
    }
}

/// A sink whose brokers cannot be reached: every send fails, naming the first record's
/// topic. For tests and demos of the guarantees: a batch processed with it fails after its
/// state writes, as an invocation whose producer times out does, and its retry (with a
/// working sink) must still produce what the failed attempt could not.
#[derive(Debug, Default, Clone, Copy)]
pub struct UnreachableSink;

#[async_trait]
impl Sink for UnreachableSink {
    async fn send(&self, records: Vec<OutputRecord>) -> Result<(), SinkError> {
        Err(SinkError {
            topic: records.first().map(|r| r.topic.clone()).unwrap_or_default(),
            reason: "the brokers are unreachable".into(),
        })
    }
}
