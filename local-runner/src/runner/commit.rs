//! Committing the offsets of done records, and the two stop conditions that read the
//! group's commits: `until_idle` (everything assigned is committed) and `until_caught_up`
//! ([`CaughtUp`]: the records there were at the start are committed).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use lambda_streams::event::TopicPartition;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::{Offset, TopicPartitionList};

use super::state::Progress;
use super::{GroupConsumer, Runner};
use crate::admin::{METADATA_TIMEOUT, with_coordinator};

impl Runner {
    /// Commits the position of every partition whose done records moved it, if it is
    /// still owned under the lease its records were read under (a revoked partition, or
    /// one whose batch was in flight when it was revoked, is dropped instead). The
    /// assignment stays locked until the commit is done, so a revocation waits for it.
    ///
    /// A commit refused because of a rebalance is not an error: it is tried again at the
    /// next commit, or, if the partition was revoked, its new owner delivers the records
    /// again.
    pub(super) fn commit(
        &self,
        consumer: &GroupConsumer,
        state: &mut Progress,
    ) -> Result<(), String> {
        state.drop_stale(consumer);
        let assignment = consumer.context().assignment();
        let mut offsets = TopicPartitionList::new();
        let mut moved = Vec::new();
        for tp in state.buffers.partitions() {
            if !state
                .leases
                .get(tp)
                .is_some_and(|&lease| assignment.holds(tp, lease))
            {
                continue;
            }
            let Some(position) = state.buffers.position(tp) else {
                continue;
            };
            if state.committed.get(tp).is_some_and(|&c| c >= position) {
                continue;
            }
            offsets
                .add_partition_offset(&tp.topic, tp.partition, Offset::Offset(position))
                .map_err(|e| format!("cannot commit {tp}@{position}: {e}"))?;
            moved.push((tp.clone(), position));
        }
        if moved.is_empty() {
            return Ok(());
        }
        match with_coordinator(|| consumer.commit(&offsets, CommitMode::Sync)) {
            Ok(()) => {
                state.committed.extend(moved);
                Ok(())
            }
            Err(e) if refused_by_rebalance(&e) => {
                tracing::warn!(error = %e, "commit refused during a rebalance: tried again later");
                Ok(())
            }
            Err(e) => Err(format!(
                "commit of group {} failed: {e}",
                self.config.group_id
            )),
        }
    }
}

/// Whether a commit failed because the group is rebalancing or this member left it: the
/// offsets are not committed, and that is not an error of the run.
fn refused_by_rebalance(error: &KafkaError) -> bool {
    matches!(
        error,
        KafkaError::ConsumerCommit(
            RDKafkaErrorCode::RebalanceInProgress
                | RDKafkaErrorCode::IllegalGeneration
                | RDKafkaErrorCode::UnknownMemberId
                | RDKafkaErrorCode::AssignmentLost
        )
    )
}

/// Whether the group's committed offsets have reached the end of every assigned
/// partition (what `until_idle` waits for; called when nothing is buffered or in flight).
/// A partition whose log ends with a transaction's marker (a topic written in
/// transactions, such as a repartition topic under exactly-once output) counts when the
/// consumer's position has passed the end: the commit of its last record is one short of
/// the end, the marker being no record.
pub(super) fn caught_up(consumer: &GroupConsumer, offsets: &BaseConsumer) -> Result<bool, String> {
    let assignment = consumer
        .assignment()
        .map_err(|e| format!("cannot read the assignment: {e}"))?;
    if assignment.count() == 0 {
        return Ok(false);
    }
    let committed = with_coordinator(|| consumer.committed(METADATA_TIMEOUT))
        .map_err(|e| format!("cannot read committed offsets: {e}"))?;
    let consumed = consumer
        .position()
        .map_err(|e| format!("cannot read the consumer's positions: {e}"))?;
    for element in assignment.elements() {
        let (low, high) = offsets
            .fetch_watermarks(element.topic(), element.partition(), METADATA_TIMEOUT)
            .map_err(|e| {
                format!(
                    "cannot read watermarks of {}-{}: {e}",
                    element.topic(),
                    element.partition()
                )
            })?;
        let position = committed
            .find_partition(element.topic(), element.partition())
            .and_then(|e| match e.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            })
            .unwrap_or(low);
        let past_the_end = consumed
            .find_partition(element.topic(), element.partition())
            .is_some_and(|e| matches!(e.offset(), Offset::Offset(o) if o >= high));
        if position < high && !past_the_end {
            return Ok(false);
        }
    }
    Ok(true)
}

/// What `until_caught_up` waits for: every owned partition committed up to the end
/// offset it had at the start.
pub(super) struct CaughtUp {
    /// Each partition's (low, high) watermarks at the start.
    ends: BTreeMap<TopicPartition, (i64, i64)>,
    /// The group's committed offsets, as last read from the broker.
    committed: BTreeMap<TopicPartition, i64>,
    /// When the committed offsets were last read.
    refreshed: Instant,
}

impl CaughtUp {
    /// How often the group's commits are read again while the runner has nothing to do.
    const REFRESH: Duration = Duration::from_millis(500);

    /// The end offsets now (`ends`), and where the group is (`committed`).
    pub(super) fn new(
        ends: BTreeMap<TopicPartition, (i64, i64)>,
        committed: &TopicPartitionList,
    ) -> Self {
        let mut caught_up = CaughtUp {
            ends,
            committed: BTreeMap::new(),
            refreshed: Instant::now(),
        };
        caught_up.update(committed);
        caught_up
    }

    fn update(&mut self, committed: &TopicPartitionList) {
        for e in committed.elements() {
            if let Offset::Offset(o) = e.offset() {
                let c = self
                    .committed
                    .entry(TopicPartition::new(e.topic(), e.partition()))
                    .or_insert(o);
                *c = (*c).max(o);
            }
        }
    }

    pub(super) fn refresh_due(&self) -> bool {
        self.refreshed.elapsed() >= Self::REFRESH
    }

    pub(super) fn next_refresh(&self) -> Instant {
        self.refreshed + Self::REFRESH
    }

    /// Reads the group's committed offsets of the owned partitions again.
    pub(super) fn refresh(&mut self, consumer: &GroupConsumer) -> Result<(), String> {
        self.refreshed = Instant::now();
        let owned = consumer.context().assignment().owned();
        if owned.is_empty() {
            return Ok(());
        }
        let mut list = TopicPartitionList::new();
        for tp in &owned {
            list.add_partition(&tp.topic, tp.partition);
        }
        let committed =
            with_coordinator(|| consumer.committed_offsets(list.clone(), METADATA_TIMEOUT))
                .map_err(|e| format!("cannot read committed offsets: {e}"))?;
        self.update(&committed);
        Ok(())
    }

    /// Whether every partition this runner owns (it owns some) is committed up to its end
    /// offset at the start, by this runner or (as last read) by the group. A partition
    /// that appeared since the start has nothing to wait for; one the group never
    /// committed starts at its low watermark.
    pub(super) fn reached(&self, consumer: &GroupConsumer, state: &Progress) -> bool {
        let owned = consumer.context().assignment().owned();
        !owned.is_empty()
            && owned.iter().all(|tp| {
                let Some(&(low, high)) = self.ends.get(tp) else {
                    return true;
                };
                let committed = self
                    .committed
                    .get(tp)
                    .copied()
                    .max(state.committed.get(tp).copied())
                    .unwrap_or(low);
                committed >= high
            })
    }
}
