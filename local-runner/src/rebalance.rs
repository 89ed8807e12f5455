//! Scale-out: several runners in one consumer group share the partitions, and a rebalance
//! (a runner joining, leaving or dying) moves them. A partition taken away from a runner
//! must be given up cleanly there: its buffered records are dropped (the new owner reads
//! them again from the committed offset), a batch of it in flight when it is revoked does
//! not commit, and nothing of it is committed after the revocation.
//!
//! The consumer's [`RebalanceContext`] records every assignment and revocation in an
//! [`Assignment`], shared with the runner's loop. Each time a partition is assigned it gets
//! a new *lease* (a number). The loop remembers the lease under which it read a
//! partition's records; it commits a partition only while that lease is still held, and
//! drops the partition's records as soon as it is not (see [`Assignment::stale`]). A
//! partition revoked and assigned again to the same runner gets a new lease, so what was
//! read under the old one is dropped too: after a reassignment the consumer reads again
//! from the committed offset.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use lambda_streams::event::TopicPartition;
use rdkafka::TopicPartitionList;
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, ConsumerContext, Rebalance};

/// The partitions this runner owns, each with the lease it holds it under.
#[derive(Debug, Default)]
pub struct Assignment {
    /// The last lease handed out.
    last_lease: u64,
    owned: BTreeMap<TopicPartition, u64>,
    /// Revocations so far (for logs and tests).
    revocations: u64,
    /// When partitions were first assigned.
    first_assigned: Option<Instant>,
}

impl Assignment {
    /// Records that `partitions` were assigned: each one not already owned gets a new lease.
    pub fn assign<'a>(&mut self, partitions: impl IntoIterator<Item = &'a TopicPartition>) {
        self.first_assigned.get_or_insert_with(Instant::now);
        for tp in partitions {
            if !self.owned.contains_key(tp) {
                self.last_lease += 1;
                self.owned.insert(tp.clone(), self.last_lease);
            }
        }
    }

    /// Records that `partitions` were revoked (or lost): their leases end.
    pub fn revoke<'a>(&mut self, partitions: impl IntoIterator<Item = &'a TopicPartition>) {
        for tp in partitions {
            if self.owned.remove(tp).is_some() {
                self.revocations += 1;
            }
        }
    }

    /// The lease under which `tp` is owned now; `None` when it is not owned.
    pub fn lease(&self, tp: &TopicPartition) -> Option<u64> {
        self.owned.get(tp).copied()
    }

    /// Whether `tp` is still owned under `lease` (owned without interruption since).
    pub fn holds(&self, tp: &TopicPartition, lease: u64) -> bool {
        self.lease(tp) == Some(lease)
    }

    /// The partitions of `held` (partition → the lease its records were read under) that
    /// are no longer owned under that lease: their records must be dropped, not delivered
    /// again nor committed.
    pub fn stale(&self, held: &BTreeMap<TopicPartition, u64>) -> Vec<TopicPartition> {
        held.iter()
            .filter(|(tp, lease)| !self.holds(tp, **lease))
            .map(|(tp, _)| tp.clone())
            .collect()
    }

    /// The partitions owned now.
    pub fn owned(&self) -> Vec<TopicPartition> {
        self.owned.keys().cloned().collect()
    }

    /// When partitions were first assigned (the end of the first group join).
    pub fn first_assigned(&self) -> Option<Instant> {
        self.first_assigned
    }

    /// How many partition revocations this runner has seen.
    pub fn revocations(&self) -> u64 {
        self.revocations
    }
}

/// The partitions of a list.
fn partitions(list: &TopicPartitionList) -> Vec<TopicPartition> {
    list.elements()
        .iter()
        .map(|e| TopicPartition::new(e.topic(), e.partition()))
        .collect()
}

/// The consumer context that keeps an [`Assignment`] up to date: a revocation ends the
/// leases before the consumer lets the partitions go; an assignment starts leases once the
/// consumer owns them.
#[derive(Debug, Clone, Default)]
pub struct RebalanceContext {
    assignment: Arc<Mutex<Assignment>>,
}

impl RebalanceContext {
    /// The assignment, locked (a poisoned lock is still read: it only holds numbers).
    pub fn assignment(&self) -> MutexGuard<'_, Assignment> {
        self.assignment
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl ClientContext for RebalanceContext {}

impl ConsumerContext for RebalanceContext {
    fn pre_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(list) => {
                let revoked = partitions(list);
                tracing::info!(
                    partitions = %names(&revoked),
                    "rebalance: partitions revoked (their buffered records are dropped)"
                );
                self.assignment().revoke(&revoked);
            }
            Rebalance::Error(e) => tracing::warn!(error = %e, "rebalance error"),
            Rebalance::Assign(_) => {}
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(list) = rebalance {
            let assigned = partitions(list);
            tracing::info!(partitions = %names(&assigned), "rebalance: partitions assigned");
            self.assignment().assign(&assigned);
        }
    }
}

fn names(tps: &[TopicPartition]) -> String {
    tps.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(p: i32) -> TopicPartition {
        TopicPartition::new("lines", p)
    }

    #[test]
    fn a_revoked_partition_is_stale_and_a_reassigned_one_too() {
        let mut a = Assignment::default();
        a.assign(&[tp(0), tp(1), tp(2)]);
        // The loop read records of 0, 1 and 2 under their leases.
        let held: BTreeMap<_, _> = (0..3)
            .map(|p| (tp(p), a.lease(&tp(p)).expect("assigned")))
            .collect();
        assert!(a.stale(&held).is_empty());

        // An eager rebalance: everything revoked, then 0 and 2 assigned back.
        a.revoke(&[tp(0), tp(1), tp(2)]);
        assert_eq!(a.stale(&held), [tp(0), tp(1), tp(2)], "nothing commits now");
        a.assign(&[tp(0), tp(2)]);
        assert_eq!(
            a.stale(&held),
            [tp(0), tp(1), tp(2)],
            "read under the old leases: dropped even though owned again"
        );
        assert!(!a.holds(&tp(0), held[&tp(0)]));
        assert!(a.lease(&tp(1)).is_none());
        assert_eq!(a.revocations(), 3);
    }

    #[test]
    fn an_incremental_rebalance_leaves_the_other_partitions_alone() {
        let mut a = Assignment::default();
        a.assign(&[tp(0), tp(1)]);
        let held: BTreeMap<_, _> = (0..2)
            .map(|p| (tp(p), a.lease(&tp(p)).expect("assigned")))
            .collect();
        // Cooperative: only 1 is revoked; 3 is added; 0 is assigned again (no change).
        a.revoke(&[tp(1)]);
        a.assign(&[tp(0), tp(3)]);
        assert_eq!(a.stale(&held), [tp(1)]);
        assert!(a.holds(&tp(0), held[&tp(0)]));
        assert!(a.lease(&tp(3)).is_some());
    }
}
