//! What the loop remembers between turns: the buffered records, attempt counts, retry
//! groups, the partitions in flight and committed, and the lease each was read under.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Instant;

use lambda_streams::event::TopicPartition;
use rdkafka::consumer::Consumer;

use super::GroupConsumer;
use super::report::RunSummary;
use crate::batch::Buffers;

/// The partitions of a failed batch, retried together after their backoff.
#[derive(Debug)]
pub(super) struct RetryGroup {
    pub(super) partitions: BTreeSet<TopicPartition>,
    /// Batch size limits queued by bisection and the extended-retry fault; the front
    /// applies to the next batch (none: the batch size).
    pub(super) limits: VecDeque<usize>,
    /// Not retried before this (the backoff).
    pub(super) not_before: Instant,
    /// Gather records for the batching window first (a retry that may end later) instead
    /// of going at once with the records it failed with.
    pub(super) gather: bool,
}

/// Failed attempts of a partition's first records not done.
#[derive(Debug, Default)]
pub(super) struct Attempts {
    pub(super) count: u32,
    pub(super) last_error: String,
}

/// The loop's state.
#[derive(Default)]
pub(super) struct Progress {
    pub(super) buffers: Buffers,
    pub(super) attempts: BTreeMap<TopicPartition, Attempts>,
    /// Partitions of failed batches waiting for their retry (none of them in flight).
    pub(super) groups: Vec<RetryGroup>,
    /// Partitions with a batch in flight (whatever lease it was read under).
    pub(super) in_flight: BTreeSet<TopicPartition>,
    pub(super) committed: BTreeMap<TopicPartition, i64>,
    /// The lease (see [`crate::rebalance`]) under which each buffered partition was read.
    pub(super) leases: BTreeMap<TopicPartition, u64>,
    /// Partitions this runner paused because enough of their records are buffered.
    pub(super) paused: BTreeSet<TopicPartition>,
    /// When the batching window of the fresh records (those of partitions neither in
    /// flight nor in a retry group) opened.
    pub(super) window_opened: Option<Instant>,
    pub(super) batch_number: u64,
    pub(super) summary: RunSummary,
    /// When the last batch completed.
    pub(super) last_done: Option<Instant>,
}

impl Progress {
    /// Forgets everything about `tp` (revoked): its buffered records, attempts, commits,
    /// its retry. A batch of it in flight is still awaited (its outcome is then dropped).
    pub(super) fn forget(&mut self, tp: &TopicPartition) {
        let before = self.buffers.len();
        self.buffers.retain(|t| t != tp);
        self.summary.dropped += (before - self.buffers.len()) as u64;
        self.attempts.remove(tp);
        self.committed.remove(tp);
        self.leases.remove(tp);
        self.ungroup(tp);
    }

    /// Takes `tp` out of its retry group (a group left empty is dropped).
    pub(super) fn ungroup(&mut self, tp: &TopicPartition) {
        for group in &mut self.groups {
            group.partitions.remove(tp);
        }
        self.groups.retain(|g| !g.partitions.is_empty());
    }

    /// Whether `tp` can go into a fresh batch: no batch of it in flight, no retry pending.
    pub(super) fn fresh(&self, tp: &TopicPartition) -> bool {
        !self.in_flight.contains(tp) && !self.groups.iter().any(|g| g.partitions.contains(tp))
    }

    /// Drops the partitions no longer owned under the lease they were read under.
    pub(super) fn drop_stale(&mut self, consumer: &GroupConsumer) {
        let stale = consumer.context().assignment().stale(&self.leases);
        if stale.is_empty() {
            return;
        }
        let before = self.buffers.len();
        for tp in &stale {
            self.forget(tp);
        }
        let dropped = before - self.buffers.len();
        if dropped > 0 {
            tracing::info!(
                partitions = stale.len(),
                records = dropped,
                "revoked partitions: buffered records dropped (their new owner reads them again)"
            );
        }
    }

    /// Makes `partitions` a retry group, due at `not_before`.
    pub(super) fn retry(
        &mut self,
        partitions: Vec<TopicPartition>,
        limits: VecDeque<usize>,
        not_before: Instant,
        gather: bool,
    ) {
        for tp in &partitions {
            self.ungroup(tp);
        }
        if partitions.is_empty() {
            return;
        }
        self.groups.push(RetryGroup {
            partitions: partitions.into_iter().collect(),
            limits,
            not_before,
            gather,
        });
    }
}
