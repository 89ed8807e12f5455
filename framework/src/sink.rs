//! Sinks: where output records go. [`KafkaSink`] produces to Kafka (idempotent, every
//! record acknowledged before the batch succeeds); [`MemorySink`] collects them for tests.

use std::sync::{Mutex, PoisonError};

use async_trait::async_trait;

/// The rdkafka producer, in [`crate::kafka`].
pub use crate::kafka::KafkaSink;
pub use crate::wire::{PATH_HEADER, SEQUENCE_HEADER, SOURCE_HEADER, VERSION_HEADER};

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
