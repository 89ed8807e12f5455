//! The framework's errors. Every error a record caused names its topic-partition and offset.

use crate::event::TopicPartition;
use crate::state::StateError;

/// Why a batch could not be processed. The batch then fails as a whole and the event
/// source delivers it again; nothing is lost.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// The event's JSON is malformed.
    #[error(transparent)]
    Decode(#[from] crate::event::DecodeError),
    /// A key or value could not be deserialized (a poison record).
    #[error("record {tp} offset {offset}: cannot deserialize the {side}: {reason}")]
    Deserialize {
        /// Where the record came from.
        tp: TopicPartition,
        /// The record's offset.
        offset: i64,
        /// `"key"` or `"value"`.
        side: &'static str,
        /// What the serde said.
        reason: String,
    },
    /// The event holds records of a topic the topology does not read.
    #[error("record {tp} offset {offset}: the topology has no source for topic {topic:?}", topic = tp.topic)]
    UnknownTopic {
        /// Where the record came from.
        tp: TopicPartition,
        /// The first record's offset.
        offset: i64,
    },
    /// A user function failed on a record.
    #[error("record {tp} offset {offset}: {reason}")]
    User {
        /// Where the record came from.
        tp: TopicPartition,
        /// The record's offset.
        offset: i64,
        /// What the user function reported.
        reason: String,
    },
    /// Writing or reading state failed.
    #[error(transparent)]
    State(#[from] StateError),
    /// Producing output records failed.
    #[error(transparent)]
    Sink(#[from] crate::sink::SinkError),
    /// A transaction of the exactly-once output failed (fenced by a newer instance of its
    /// transactional id, aborted, timed out, or unreachable): the invocation fails and
    /// every transaction of it is aborted; the retry starts over.
    #[error("transaction of {tp} (transactional.id {transactional_id:?}) failed at {reason}")]
    Transaction {
        /// The source partition whose transaction failed.
        tp: TopicPartition,
        /// Its transactional id.
        transactional_id: String,
        /// The step and what the client said.
        reason: String,
    },
    /// A setting is missing or invalid.
    #[error("configuration: {0}")]
    Config(String),
    /// A key or value could not be decoded because something its serde needs could not be
    /// reached (a schema registry down, a timeout): not the record's fault, so not a
    /// poison record; the batch fails and the event source delivers it again.
    #[error("record {tp} offset {offset}: cannot deserialize the {side} now: {reason}")]
    Unavailable {
        /// Where the record came from.
        tp: TopicPartition,
        /// The record's offset.
        offset: i64,
        /// `"key"` or `"value"`.
        side: &'static str,
        /// What the serde said.
        reason: String,
    },
}

impl From<crate::aws::AwsConfigError> for StreamError {
    fn from(e: crate::aws::AwsConfigError) -> Self {
        StreamError::Config(e.0)
    }
}

/// Why [`StreamsBuilder::try_build`](crate::StreamsBuilder::try_build) refuses a topology:
/// a shape the framework cannot run exactly once, found before any record (as Kafka
/// Streams' `TopologyException` at build). It names the operator as
/// [`Topology::describe`](crate::Topology::describe) prints it, says why, and what to do
/// instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("topology refused at {operator}: {reason}. Instead: {instead}")]
pub struct TopologyError {
    /// The refused operator's node name (e.g. `KSTREAM-AGGREGATE-0000000003`).
    pub operator: String,
    /// Why it cannot run exactly once.
    pub reason: String,
    /// What to write instead.
    pub instead: String,
}

impl TopologyError {
    /// An error at `operator`.
    pub(crate) fn new(operator: String, reason: String, instead: &str) -> Self {
        TopologyError {
            operator,
            reason,
            instead: instead.to_owned(),
        }
    }
}
