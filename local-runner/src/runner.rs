//! The consume → batch → invoke → commit loop, by the event source's rules.
//!
//! One loop per runner: at most one batch in flight, so each partition has at most one
//! batch in flight, in offset order. After each invocation, every partition of the event
//! gets its verdict:
//!
//! - success: its records are done;
//! - a partial batch response naming offset N: its records below N are done, and it
//!   resumes from N (this counts as a failed attempt for the records from N);
//! - a function error (or an invalid response): nothing is done; with bisection, the
//!   batch is retried as two halves (that does not count as an attempt), else as a whole.
//!
//! A partition whose failed attempts exceed the retry limit gives up the records of the
//! event (to the on-failure destination, or skipped with a warning). Records older than
//! the maximum record age are given up before delivery. Then the offsets of the done
//! records are committed: only ever after success or a give-up.
//!
//! Several runners in one consumer group share the partitions ([`crate::rebalance`]):
//! the records of a partition revoked by a rebalance are dropped, and a partition is
//! committed only while it is still owned under the lease its records were read under.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lambda_streams::event::{EventSource, KafkaEvent, Record, TopicPartition};
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::admin::{METADATA_TIMEOUT, with_coordinator};
use crate::batch::{Buffers, to_record};
pub use crate::batch::{MAX_BATCH_SIZE, MAX_PAYLOAD_BYTES};
pub use crate::config::{EventShape, Faults, RunnerConfig};
use crate::destination::{FailureDestination, GiveUpReason, GivenUp};
use crate::position;
use crate::rebalance::RebalanceContext;
use crate::response::{Verdict, judge};
use crate::transport::Transport;

/// The runner's consumer: its context tracks the partitions it owns.
type GroupConsumer = StreamConsumer<RebalanceContext>;

/// What a run did.
#[derive(Debug, Clone, Default)]
pub struct RunSummary {
    /// Records delivered in successful invocations (each counted once).
    pub records: u64,
    /// Invocations after which some records were done and committed.
    pub batches: u64,
    /// Invocations, duplicates and retries included.
    pub invocations: u64,
    /// Invocations that failed, wholly or partly (and were retried).
    pub failures: u64,
    /// Records given up on (retries exhausted or too old): sent to the on-failure
    /// destination, or skipped without one.
    pub given_up: u64,
    /// Wall time of the run.
    pub elapsed: Duration,
    /// Time from the first record received to the last batch completed (excludes the
    /// consumer group's join and the idle wait at the end): what throughput is measured over.
    pub active: Duration,
    /// Partition revocations seen (rebalances that took partitions away).
    pub revocations: u64,
    /// Buffered records dropped because their partition was revoked (its new owner
    /// reads them again).
    pub dropped: u64,
}

impl RunSummary {
    /// Records per second from the first record received to the end of the run.
    pub fn records_per_second(&self) -> f64 {
        self.records as f64 / self.active.as_secs_f64().max(1e-9)
    }
}

/// What one invocation came to.
enum Outcome {
    Success,
    Partial(BTreeMap<TopicPartition, i64>),
    Failed(String),
    /// The function succeeded but the response was lost (an injected fault): nothing is
    /// done, and no failed attempt is counted.
    Lost,
}

/// Failed attempts of a partition's first records not done.
#[derive(Debug, Default)]
struct Attempts {
    count: u32,
    last_error: String,
}

/// The loop's state between invocations.
#[derive(Default)]
struct Progress {
    buffers: Buffers,
    attempts: BTreeMap<TopicPartition, Attempts>,
    /// Batch size limits queued by bisection and the extended-retry fault; the front applies.
    limits: VecDeque<usize>,
    committed: BTreeMap<TopicPartition, i64>,
    /// The lease (see [`crate::rebalance`]) under which each buffered partition was read.
    leases: BTreeMap<TopicPartition, u64>,
    batch_number: u64,
    summary: RunSummary,
    /// When the last batch completed.
    last_done: Option<Instant>,
}

impl Progress {
    /// Forgets everything about `tp` (revoked): its buffered records, attempts, commits.
    fn forget(&mut self, tp: &TopicPartition) {
        let before = self.buffers.len();
        self.buffers.retain(|t| t != tp);
        self.summary.dropped += (before - self.buffers.len()) as u64;
        self.attempts.remove(tp);
        self.committed.remove(tp);
        self.leases.remove(tp);
    }

    /// Drops the partitions no longer owned under the lease they were read under. The
    /// queued batch limits (bisection) are dropped with them: they described a batch that
    /// will not be retried here.
    fn drop_stale(&mut self, consumer: &GroupConsumer) {
        let stale = consumer.context().assignment().stale(&self.leases);
        if stale.is_empty() {
            return;
        }
        let before = self.buffers.len();
        for tp in &stale {
            self.forget(tp);
        }
        self.limits.clear();
        let dropped = before - self.buffers.len();
        if dropped > 0 {
            tracing::info!(
                partitions = stale.len(),
                records = dropped,
                "revoked partitions: buffered records dropped (their new owner reads them again)"
            );
        }
    }
}

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

    fn consumer(&self) -> Result<GroupConsumer, String> {
        let c = &self.config;
        let consumer: GroupConsumer = ClientConfig::new()
            .set("bootstrap.servers", &c.bootstrap_servers)
            .set("group.id", &c.group_id)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", c.starting_position.auto_offset_reset())
            .set("session.timeout.ms", "10000")
            .create_with_context(RebalanceContext::default())
            .map_err(|e| format!("cannot create a consumer for {}: {e}", c.bootstrap_servers))?;
        let metadata = consumer
            .fetch_metadata(None, METADATA_TIMEOUT)
            .map_err(|e| {
                format!(
                    "Kafka broker {} cannot be reached: {e}",
                    c.bootstrap_servers
                )
            })?;
        for topic in c.topics.iter().chain(&c.on_failure_topic) {
            if !metadata
                .topics()
                .iter()
                .any(|t| t.name() == topic && t.error().is_none())
            {
                return Err(format!(
                    "topic {topic:?} does not exist on {} (create it: local-runner topics create {topic})",
                    c.bootstrap_servers
                ));
            }
        }
        Ok(consumer)
    }

    /// Consumes, batches, invokes and commits until stopped (or, with `until_idle`,
    /// until the group has consumed everything).
    pub async fn run(&self) -> Result<RunSummary, String> {
        let consumer = self.consumer()?;
        self.initialize_positions()?;
        let topics: Vec<&str> = self.config.topics.iter().map(String::as_str).collect();
        consumer
            .subscribe(&topics)
            .map_err(|e| format!("cannot subscribe to {topics:?}: {e}"))?;
        let destination = match &self.config.on_failure_topic {
            Some(topic) => Some(FailureDestination::new(
                &self.config.bootstrap_servers,
                topic,
            )?),
            None => None,
        };
        let started = Instant::now();
        let mut state = Progress::default();
        let mut last_progress = Instant::now();
        let mut first_record: Option<Instant> = None;
        let mut failed: Option<u32> = None;
        loop {
            let limit = state
                .limits
                .front()
                .copied()
                .unwrap_or(self.config.batch_size);
            // A retry goes at once (after its backoff) with the records it failed with.
            let retry = failed.is_some_and(|_| !state.buffers.is_empty());
            let got = if retry {
                None
            } else {
                self.fill(&consumer, &mut state, limit).await
            };
            first_record = first_record.or(got);
            state.drop_stale(&consumer);
            self.give_up_old_records(&consumer, &mut state, destination.as_ref())
                .await?;
            if state.buffers.is_empty() {
                // Commits refused during a rebalance are tried again here.
                self.commit(&consumer, &mut state)?;
                if self.config.until_idle && got.is_none() && self.caught_up(&consumer)? {
                    break;
                }
                continue;
            }
            state.batch_number += 1;
            let event =
                state
                    .buffers
                    .form_event(limit, &self.source(), &self.config.bootstrap_servers);
            let outcome = self.invoke(&event, &mut state).await;
            failed = self.settle(&event, outcome, &mut state);
            self.give_up_exhausted(&event, &mut state, destination.as_ref())
                .await?;
            self.commit(&consumer, &mut state)?;
            if let Some(attempt) = failed {
                let delay = self.config.retry_backoff * 2u32.saturating_pow(attempt.min(7));
                tokio::time::sleep(delay.min(Duration::from_secs(5))).await;
            }
            if self.config.progress && last_progress.elapsed() >= Duration::from_secs(1) {
                last_progress = Instant::now();
                state.summary.active = first_record.map_or(Duration::ZERO, |t| t.elapsed());
                eprintln!("{}", self.progress_line(&consumer, &state));
            }
        }
        state.summary.revocations = consumer.context().assignment().revocations();
        state.summary.elapsed = started.elapsed();
        state.summary.active = match (first_record, state.last_done) {
            (Some(first), Some(last)) => last.saturating_duration_since(first),
            _ => Duration::ZERO,
        };
        Ok(state.summary)
    }

    fn source(&self) -> EventSource {
        match &self.config.shape {
            EventShape::Msk { arn } => EventSource::Msk { arn: arn.clone() },
            EventShape::SelfManaged => EventSource::SelfManaged,
        }
    }

    /// One invocation of `event` (twice with the duplicate fault), and what it came to.
    async fn invoke(&self, event: &KafkaEvent, state: &mut Progress) -> Outcome {
        let faults = &self.config.faults;
        let number = state.batch_number;
        let every = |n: Option<u64>| n.is_some_and(|n| n > 0 && number.is_multiple_of(n));
        let payload = event.to_json();
        state.summary.invocations += 1;
        if faults.fail_invocation == Some(state.summary.invocations) {
            return Outcome::Failed(format!(
                "injected failure of invocation {}",
                state.summary.invocations
            ));
        }
        let mut result = self.transport.invoke(payload.clone()).await;
        if result.is_ok() && every(faults.duplicate_every) {
            state.summary.invocations += 1;
            result = self.transport.invoke(payload).await;
        }
        let outcome = match result {
            Err(e) => Outcome::Failed(e.0),
            Ok(_) if !self.config.report_batch_item_failures => Outcome::Success,
            Ok(body) => match judge(&body, event) {
                Verdict::Success => Outcome::Success,
                Verdict::Partial(resume) => Outcome::Partial(resume),
                Verdict::Invalid(why) => Outcome::Failed(format!("invalid response: {why}")),
            },
        };
        if matches!(outcome, Outcome::Success) && faults.crash_before_commit == Some(number) {
            eprintln!(
                "[local-runner] injected crash: batch {number} succeeded, aborting before its commit"
            );
            std::process::abort();
        }
        if matches!(outcome, Outcome::Success) && every(faults.extend_retry_every) {
            // Injected: the response was lost; the retry is a longer batch from the
            // same offsets (not a failure of the function: no attempt is counted).
            let longer = (event.record_count() * 2).min(MAX_BATCH_SIZE);
            state.limits.push_front(longer);
            return Outcome::Lost;
        }
        outcome
    }

    /// Applies an outcome to the buffers and attempt counts. Returns the highest attempt
    /// count of a failed partition, if any failed.
    fn settle(&self, event: &KafkaEvent, outcome: Outcome, state: &mut Progress) -> Option<u32> {
        let mut worst = None;
        let mut fail = |state: &mut Progress, tp: &TopicPartition, error: String| {
            let a = state.attempts.entry(tp.clone()).or_default();
            a.count += 1;
            a.last_error = error;
            worst = Some(worst.unwrap_or(0).max(a.count));
        };
        match outcome {
            Outcome::Lost => {}
            Outcome::Failed(error) => {
                state.summary.failures += 1;
                tracing::warn!(%error, records = event.record_count(), "batch failed");
                let n = event.record_count();
                if self.config.bisect_batch_on_function_error && n > 1 {
                    state.limits.pop_front();
                    state.limits.push_front(n / 2);
                    state.limits.push_front(n.div_ceil(2));
                    worst = Some(0);
                } else {
                    for part in &event.partitions {
                        fail(state, &part.tp, error.clone());
                    }
                }
            }
            Outcome::Success | Outcome::Partial(_) => {
                let resume = match outcome {
                    Outcome::Partial(resume) => resume,
                    _ => BTreeMap::new(),
                };
                if !resume.is_empty() {
                    state.summary.failures += 1;
                }
                state.limits.pop_front();
                let mut done = 0;
                for part in &event.partitions {
                    let (Some(first), Some(last)) = (part.records.first(), part.records.last())
                    else {
                        continue;
                    };
                    match resume.get(&part.tp) {
                        Some(&offset) => {
                            done += part.records.iter().filter(|r| r.offset < offset).count();
                            state.buffers.complete(&part.tp, offset);
                            if offset > first.offset {
                                state.attempts.remove(&part.tp);
                            }
                            fail(
                                state,
                                &part.tp,
                                format!(
                                    "the function reported {}@{offset} as failed (partial batch response)",
                                    part.tp
                                ),
                            );
                        }
                        None => {
                            done += part.records.len();
                            state.buffers.complete(&part.tp, last.offset + 1);
                            state.attempts.remove(&part.tp);
                        }
                    }
                }
                if done > 0 {
                    state.summary.batches += 1;
                    state.summary.records += done as u64;
                    state.last_done = Some(Instant::now());
                }
            }
        }
        worst
    }

    /// Gives up the records of the event's partitions whose attempts exceed the limit.
    async fn give_up_exhausted(
        &self,
        event: &KafkaEvent,
        state: &mut Progress,
        destination: Option<&FailureDestination>,
    ) -> Result<(), String> {
        let Some(limit) = self.config.effective_retry_limit() else {
            return Ok(());
        };
        for part in &event.partitions {
            let Some(attempts) = state.attempts.get(&part.tp).filter(|a| a.count > limit) else {
                continue;
            };
            let from = state.buffers.position(&part.tp).unwrap_or(i64::MAX);
            let records: Vec<Record> = part
                .records
                .iter()
                .filter(|r| r.offset >= from)
                .cloned()
                .collect();
            let Some(last) = records.last().map(|r| r.offset) else {
                continue;
            };
            let given_up = GivenUp {
                tp: &part.tp,
                records: &records,
                reason: GiveUpReason::RetriesExhausted,
                error: &attempts.last_error,
                attempts: attempts.count,
            };
            self.give_up(&given_up, destination).await?;
            state.summary.given_up += records.len() as u64;
            state.buffers.complete(&part.tp, last + 1);
            state.attempts.remove(&part.tp);
        }
        Ok(())
    }

    /// Gives up the buffered records older than the maximum record age, and commits.
    async fn give_up_old_records(
        &self,
        consumer: &GroupConsumer,
        state: &mut Progress,
        destination: Option<&FailureDestination>,
    ) -> Result<(), String> {
        let Some(age) = self.config.maximum_record_age else {
            return Ok(());
        };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let cutoff = now.saturating_sub(age.as_millis() as i64);
        let old = state.buffers.take_older_than(cutoff);
        if old.is_empty() {
            return Ok(());
        }
        for (tp, records) in &old {
            let error = format!(
                "record older than the maximum record age of {} s",
                age.as_secs()
            );
            let attempts = state.attempts.get(tp).map_or(0, |a| a.count);
            let given_up = GivenUp {
                tp,
                records,
                reason: GiveUpReason::RecordAgeExceeded,
                error: &error,
                attempts,
            };
            self.give_up(&given_up, destination).await?;
            state.summary.given_up += records.len() as u64;
        }
        self.commit(consumer, state)
    }

    async fn give_up(
        &self,
        given_up: &GivenUp<'_>,
        destination: Option<&FailureDestination>,
    ) -> Result<(), String> {
        let (first, last) = match (given_up.records.first(), given_up.records.last()) {
            (Some(f), Some(l)) => (f.offset, l.offset),
            _ => return Ok(()),
        };
        match destination {
            Some(d) => {
                tracing::warn!(
                    records = %format!("{}@{first}..={last}", given_up.tp),
                    reason = given_up.reason.as_str(),
                    error = given_up.error,
                    destination = d.topic(),
                    "records given up on: sent to the on-failure destination"
                );
                d.send(given_up).await
            }
            None => {
                tracing::warn!(
                    records = %format!("{}@{first}..={last}", given_up.tp),
                    reason = given_up.reason.as_str(),
                    error = given_up.error,
                    "records given up on and skipped (no on-failure destination)"
                );
                Ok(())
            }
        }
    }

    /// Commits the position of every partition whose done records moved it, if it is
    /// still owned under the lease its records were read under (a revoked partition, or
    /// one whose batch was in flight when it was revoked, is dropped instead). The
    /// assignment stays locked until the commit is done, so a revocation waits for it.
    ///
    /// A commit refused because of a rebalance is not an error: it is tried again at the
    /// next commit, or, if the partition was revoked, its new owner delivers the records
    /// again.
    fn commit(&self, consumer: &GroupConsumer, state: &mut Progress) -> Result<(), String> {
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

    /// Reads records until `limit` are buffered, 6 MB of them are, or the batching window
    /// closes. The window opens with the first record buffered (at once when some are
    /// already); with nothing buffered, it waits up to the idle timeout for one. Returns
    /// when the first record of this call arrived, if any did.
    async fn fill(
        &self,
        consumer: &GroupConsumer,
        state: &mut Progress,
        limit: usize,
    ) -> Option<Instant> {
        let start = Instant::now();
        let mut window_opened = (!state.buffers.is_empty()).then_some(start);
        let mut got = None;
        while state.buffers.len() < limit && state.buffers.bytes() < MAX_PAYLOAD_BYTES {
            let deadline = match window_opened {
                Some(opened) => opened + self.config.batching_window,
                None => start + self.config.idle_timeout,
            };
            let Some(remaining) = deadline.checked_duration_since(Instant::now()) else {
                break;
            };
            let received = tokio::time::timeout(remaining, consumer.recv()).await;
            // A rebalance runs inside `recv`: drop what was revoked before buffering more.
            state.drop_stale(consumer);
            match received {
                Err(_) => break,
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "consumer error");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Ok(Ok(message)) => {
                    let tp = TopicPartition::new(message.topic(), message.partition());
                    let Some(lease) = consumer.context().assignment().lease(&tp) else {
                        tracing::debug!(%tp, "record of a partition not owned: dropped");
                        continue;
                    };
                    if state.leases.get(&tp) != Some(&lease) {
                        // Assigned again since its records were read: read afresh.
                        state.forget(&tp);
                        state.leases.insert(tp.clone(), lease);
                    }
                    let now = Instant::now();
                    got = got.or(Some(now));
                    window_opened = window_opened.or(Some(now));
                    state.buffers.push(tp, to_record(&message));
                }
            }
        }
        got
    }

    /// Whether the group's committed offsets have reached the end of every assigned partition.
    fn caught_up(&self, consumer: &GroupConsumer) -> Result<bool, String> {
        let assignment = consumer
            .assignment()
            .map_err(|e| format!("cannot read the assignment: {e}"))?;
        if assignment.count() == 0 {
            return Ok(false);
        }
        let committed = with_coordinator(|| consumer.committed(METADATA_TIMEOUT))
            .map_err(|e| format!("cannot read committed offsets: {e}"))?;
        for element in assignment.elements() {
            let (low, high) = consumer
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
            if position < high {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// `records, batches, retries, records/s, lag per partition` (the lag: records after
    /// the committed position).
    fn progress_line(&self, consumer: &GroupConsumer, state: &Progress) -> String {
        let s = &state.summary;
        let mut lags = Vec::new();
        let assigned = consumer.assignment().unwrap_or_default();
        for element in assigned.elements() {
            let tp = TopicPartition::new(element.topic(), element.partition());
            let position = state
                .buffers
                .position(&tp)
                .or_else(|| state.committed.get(&tp).copied());
            let lag = match (
                position,
                consumer.fetch_watermarks(&tp.topic, tp.partition, Duration::from_millis(500)),
            ) {
                (Some(position), Ok((_, high))) => (high - position).max(0).to_string(),
                (None, Ok((low, high))) => format!("<={}", high - low),
                (_, Err(_)) => "?".to_owned(),
            };
            lags.push(format!("{tp}={lag}"));
        }
        format!(
            "[local-runner] {} records, {} batches, {} retries, {} given up, {:.0} records/s; lag {}",
            s.records,
            s.batches,
            s.failures,
            s.given_up,
            s.records_per_second(),
            if lags.is_empty() {
                "-".to_owned()
            } else {
                lags.join(" ")
            }
        )
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
