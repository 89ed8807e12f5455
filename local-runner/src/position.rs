//! Where a consumer group starts: the event source's `StartingPosition`.
//!
//! An existing group resumes from its committed offsets. A partition the group has never
//! committed starts at the starting position: `TRIM_HORIZON` (the earliest record),
//! `LATEST` (the end of the partition when the runner starts) or `AT_TIMESTAMP` (the
//! first record at or after a time; the end when there is none). The runner makes this
//! exact by committing the start positions for the group before it joins it, so records
//! produced after that are delivered whenever the group's rebalance completes.

use std::str::FromStr;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::admin::{METADATA_TIMEOUT, with_coordinator};

/// Where a partition without committed offsets starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StartingPosition {
    /// The earliest record (`TRIM_HORIZON`).
    #[default]
    TrimHorizon,
    /// The end of the partition when the runner starts (`LATEST`).
    Latest,
    /// The first record whose timestamp is at or after this time, in epoch milliseconds
    /// (`AT_TIMESTAMP`).
    AtTimestamp(i64),
}

impl StartingPosition {
    /// The consumer's `auto.offset.reset` for partitions that appear later.
    pub fn auto_offset_reset(self) -> &'static str {
        match self {
            StartingPosition::Latest => "latest",
            _ => "earliest",
        }
    }
}

impl FromStr for StartingPosition {
    type Err = String;

    /// `trim-horizon`, `latest` (any case, `_` or `-`); `at-timestamp` needs a time and
    /// is built with [`StartingPosition::AtTimestamp`].
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().replace('_', "-").as_str() {
            "trim-horizon" => Ok(StartingPosition::TrimHorizon),
            "latest" => Ok(StartingPosition::Latest),
            other => Err(format!(
                "starting position {other:?}: expected trim-horizon, latest or at-timestamp"
            )),
        }
    }
}

/// Commits the starting position of every partition of `topics` that `group_id` has not
/// committed yet. Returns how many partitions it positioned. Partitions with commits are
/// left alone: an existing group resumes.
pub fn initialize(
    bootstrap_servers: &str,
    group_id: &str,
    topics: &[String],
    position: StartingPosition,
) -> Result<usize, String> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap_servers)
        .set("group.id", group_id)
        .set("enable.auto.commit", "false")
        .create()
        .map_err(|e| format!("cannot create a consumer for {bootstrap_servers}: {e}"))?;
    let mut all = TopicPartitionList::new();
    for topic in topics {
        let metadata = consumer
            .fetch_metadata(Some(topic), METADATA_TIMEOUT)
            .map_err(|e| format!("Kafka broker {bootstrap_servers} cannot be reached: {e}"))?;
        for t in metadata.topics() {
            for p in t.partitions() {
                all.add_partition(t.name(), p.id());
            }
        }
    }
    let committed = with_coordinator(|| consumer.committed_offsets(all.clone(), METADATA_TIMEOUT))
        .map_err(|e| format!("cannot read the committed offsets of group {group_id}: {e}"))?;
    let mut start = TopicPartitionList::new();
    for element in committed.elements() {
        if matches!(element.offset(), Offset::Offset(_)) {
            continue;
        }
        let (topic, partition) = (element.topic(), element.partition());
        let (low, high) = consumer
            .fetch_watermarks(topic, partition, METADATA_TIMEOUT)
            .map_err(|e| format!("cannot read the offsets of {topic}-{partition}: {e}"))?;
        let offset = match position {
            StartingPosition::TrimHorizon => low,
            StartingPosition::Latest => high,
            StartingPosition::AtTimestamp(ms) => {
                let mut query = TopicPartitionList::new();
                query
                    .add_partition_offset(topic, partition, Offset::Offset(ms))
                    .map_err(|e| format!("{topic}-{partition}: {e}"))?;
                let found = consumer
                    .offsets_for_times(query, METADATA_TIMEOUT)
                    .map_err(|e| {
                        format!("cannot find the offset of time {ms} in {topic}-{partition}: {e}")
                    })?;
                found
                    .find_partition(topic, partition)
                    .and_then(|e| match e.offset() {
                        Offset::Offset(o) => Some(o),
                        _ => None,
                    })
                    .unwrap_or(high)
            }
        };
        start
            .add_partition_offset(topic, partition, Offset::Offset(offset))
            .map_err(|e| format!("{topic}-{partition}: {e}"))?;
    }
    if start.count() > 0 {
        match with_coordinator(|| consumer.commit(&start, CommitMode::Sync)) {
            Ok(()) => {}
            // The group already has live members (another runner started at the same
            // time): they own the positions now, and a partition without a commit starts
            // where `auto.offset.reset` (set from the same starting position) puts it.
            Err(rdkafka::error::KafkaError::ConsumerCommit(
                RDKafkaErrorCode::UnknownMemberId
                | RDKafkaErrorCode::IllegalGeneration
                | RDKafkaErrorCode::RebalanceInProgress,
            )) => {
                tracing::warn!(
                    group = group_id,
                    "the group is already active; leaving its starting positions to it"
                );
                return Ok(0);
            }
            Err(e) => {
                return Err(format!(
                    "cannot commit the starting position of group {group_id}: {e}"
                ));
            }
        }
    }
    Ok(start.count())
}
