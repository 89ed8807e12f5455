//! Settling: what an invocation's outcome does to the buffers, the attempt counts and the
//! retry groups, partition by partition of its event (see the [module](super) doc).

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use lambda_streams::event::{KafkaEvent, TopicPartition};

use super::Runner;
use super::invoke::{Dispatched, Invoked, Outcome};
use super::state::Progress;
use crate::batch::MAX_BATCH_SIZE;

/// The longest a retry waits: its backoff doubles per failed attempt up to this.
const MAX_RETRY_BACKOFF: Duration = Duration::from_secs(5);

impl Runner {
    /// Applies an invocation's outcome to the buffers, attempt counts and retry groups.
    /// Only the partitions still owned under the lease the batch was read under are
    /// settled (returned); the outcome for the others is dropped.
    pub(super) fn settle(
        &self,
        batch: &Dispatched,
        invoked: Invoked,
        state: &mut Progress,
    ) -> Vec<TopicPartition> {
        let now = Instant::now();
        state.summary.invocations += invoked.extra_invocations;
        let Some(live) = live_partitions(batch, state) else {
            return Vec::new();
        };
        let event = &batch.event;
        let mut limits = batch.limits.clone();
        match invoked.outcome {
            Outcome::Lost => {
                // The retry is a longer batch from the same offsets.
                let longer = (event.record_count() * 2).min(MAX_BATCH_SIZE);
                limits.push_front(longer);
                state.retry(live.clone(), limits, now, true);
            }
            Outcome::Failed(error) => self.settle_failed(event, &live, limits, error, state, now),
            Outcome::Success => {
                state
                    .summary
                    .invocation_times
                    .extend(invoked.invocation_time);
                self.settle_done(event, &live, limits, &BTreeMap::new(), state, now)
            }
            Outcome::Partial(resume) => {
                state
                    .summary
                    .invocation_times
                    .extend(invoked.invocation_time);
                self.settle_done(event, &live, limits, &resume, state, now)
            }
        }
        live
    }

    /// A failed invocation (function error or invalid response): nothing is done. With
    /// bisection the batch is retried as two halves (not counted as an attempt), else
    /// whole, after the backoff of its partitions' worst attempt count.
    fn settle_failed(
        &self,
        event: &KafkaEvent,
        live: &[TopicPartition],
        mut limits: VecDeque<usize>,
        error: String,
        state: &mut Progress,
        now: Instant,
    ) {
        state.summary.failures += 1;
        tracing::warn!(%error, records = event.record_count(), "batch failed");
        let n = event.record_count();
        if self.config.bisect_batch_on_function_error && n > 1 {
            limits.pop_front();
            limits.push_front(n / 2);
            limits.push_front(n.div_ceil(2));
            let at = now + self.backoff(0);
            state.retry(live.to_vec(), limits, at, false);
        } else {
            let mut worst = 0;
            for tp in live {
                worst = worst.max(count_failure(state, tp, error.clone()));
            }
            let at = now + self.backoff(worst);
            state.retry(live.to_vec(), limits, at, false);
        }
    }

    /// A successful invocation, complete or partial: each partition named in `resume` is
    /// done below its offset and retried from it (a failed attempt), the others are done.
    fn settle_done(
        &self,
        event: &KafkaEvent,
        live: &[TopicPartition],
        mut limits: VecDeque<usize>,
        resume: &BTreeMap<TopicPartition, i64>,
        state: &mut Progress,
        now: Instant,
    ) {
        if !resume.is_empty() {
            state.summary.failures += 1;
        }
        limits.pop_front();
        let mut done = 0;
        let mut failed = Vec::new();
        let mut worst = 0;
        for part in event.partitions.iter().filter(|p| live.contains(&p.tp)) {
            let (Some(first), Some(last)) = (part.records.first(), part.records.last()) else {
                continue;
            };
            let Some(&offset) = resume.get(&part.tp) else {
                done += part.records.len();
                state.buffers.complete(&part.tp, last.offset + 1);
                state.attempts.remove(&part.tp);
                continue;
            };
            done += part.records.iter().filter(|r| r.offset < offset).count();
            state.buffers.complete(&part.tp, offset);
            if offset > first.offset {
                state.attempts.remove(&part.tp);
            }
            let error = format!(
                "the function reported {}@{offset} as failed (partial batch response)",
                part.tp
            );
            worst = worst.max(count_failure(state, &part.tp, error));
            failed.push(part.tp.clone());
        }
        if !failed.is_empty() {
            let at = now + self.backoff(worst);
            state.retry(failed, limits, at, false);
        } else if !limits.is_empty() {
            // The rest of a bisected batch goes next, at once.
            state.retry(live.to_vec(), limits, now, false);
        }
        if done > 0 {
            state.summary.batches += 1;
            state.summary.records += done as u64;
            state.last_done = Some(now);
        }
    }

    /// The wait before retrying a partition after its `attempt`th failed attempt.
    fn backoff(&self, attempt: u32) -> Duration {
        (self.config.retry_backoff * 2u32.saturating_pow(attempt.min(7))).min(MAX_RETRY_BACKOFF)
    }
}

/// Takes the batch's partitions out of flight, and returns those still owned under the
/// lease the batch was read under; `None` when all were revoked (a stale completion).
fn live_partitions(batch: &Dispatched, state: &mut Progress) -> Option<Vec<TopicPartition>> {
    let event = &batch.event;
    let mut live = Vec::new();
    for part in &event.partitions {
        state.in_flight.remove(&part.tp);
        let lease = batch.leases.get(&part.tp);
        if lease.is_some_and(|lease| state.leases.get(&part.tp) == Some(lease)) {
            live.push(part.tp.clone());
        }
    }
    if live.len() < event.partitions.len() {
        tracing::info!(
            revoked = event.partitions.len() - live.len(),
            "a batch completed after some of its partitions were revoked: their outcome is dropped (their new owner delivers them again)"
        );
        if live.is_empty() {
            state.summary.stale_completions += 1;
            return None;
        }
    }
    Some(live)
}

/// Counts a failed attempt of `tp` with its error; returns the partition's attempt count.
fn count_failure(state: &mut Progress, tp: &TopicPartition, error: String) -> u32 {
    let a = state.attempts.entry(tp.clone()).or_default();
    a.count += 1;
    a.last_error = error;
    a.count
}
