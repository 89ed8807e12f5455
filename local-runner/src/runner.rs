//! The consume → batch → invoke → commit loop, by the event source's rules.
//!
//! Several partitions are in flight at once, as with the event source: up to
//! [`RunnerConfig::concurrency`] invocations run concurrently, each as its own task, and a
//! batch is formed only from partitions without a batch in flight, so each partition has
//! at most one batch in flight and is delivered in offset order. The loop meanwhile keeps
//! consuming (which also serves the consumer group's rebalance callbacks), and settles
//! each invocation as it completes. Every partition of the event gets its verdict:
//!
//! - success: its records are done;
//! - a partial batch response naming offset N: its records below N are done, and it
//!   resumes from N (this counts as a failed attempt for the records from N);
//! - a function error (or an invalid response): nothing is done; with bisection, the
//!   batch is retried as two halves (that does not count as an attempt), else as a whole.
//!
//! The partitions of a failed batch are retried together, as a *retry group*, after
//! their own backoff (`retry_backoff`, doubling per attempt, at most 5 s); the other
//! partitions are not delayed. A partition whose failed attempts exceed the retry limit
//! gives up the records of the event (to the on-failure destination, or skipped with a
//! warning). Records older than the maximum record age are given up before delivery.
//! Then the offsets of the done records are committed: only ever after success or a
//! give-up.
//!
//! Consuming runs ahead of the invocations by a bounded amount: a partition with ten
//! batches (at least 10,000 records) or 24 MB buffered is paused (the consumer keeps
//! polling, so rebalances are still served) and resumed once half of it is delivered.
//!
//! Several runners in one consumer group share the partitions ([`crate::rebalance`]):
//! the records of a partition revoked by a rebalance are dropped; a batch of it in flight
//! at the revocation runs to its end, but its outcome is dropped (its records are neither
//! committed nor retried here: the new owner delivers them again), and a partition is
//! committed only while it is still owned under the lease its records were read under.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lambda_streams::event::{EventSource, KafkaEvent, Record, TopicPartition};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tokio::task::JoinSet;

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

/// The longest a retry waits: its backoff doubles per failed attempt up to this.
const MAX_RETRY_BACKOFF: Duration = Duration::from_secs(5);
/// A partition is paused when this many of its records are buffered (or
/// [`RunnerConfig::read_ahead_batches`] batches, when more), or [`PAUSE_BYTES`] of them,
/// and resumed below half of it. Far above one
/// batch on purpose: pausing makes librdkafka drop what it prefetched for the partition
/// and fetch it again on resume, which costs throughput (BENCHMARKS.md section 2); this
/// only bounds memory when the function falls far behind a backlog.
const PAUSE_RECORDS: usize = 10_000;
/// The buffered size at which a partition is paused: four full payloads.
const PAUSE_BYTES: usize = 4 * MAX_PAYLOAD_BYTES;

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
    /// The most invocations that were in flight at once.
    pub peak_in_flight: usize,
    /// Batches whose partitions were all revoked while they were in flight: their
    /// outcome was dropped.
    pub stale_completions: u64,
    /// From the start of the run to the first partitions assigned (the group join,
    /// after the starting positions were committed); `None` if none was.
    pub to_assignment: Option<Duration>,
    /// From the start of the run to the first record received.
    pub to_first_record: Option<Duration>,
    /// From the last batch done to the stop condition met (`until_idle`: the idle period
    /// and the caught-up check; `until_caught_up`: the check).
    pub stop_after_last_batch: Option<Duration>,
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

/// What an invocation task reports back to the loop.
struct Invoked {
    outcome: Outcome,
    /// Invocations it made beyond the first (a duplicate delivery).
    extra_invocations: u64,
}

/// How one batch is to be invoked: the faults that apply to it.
struct Plan {
    /// The batch's number (counting batches formed).
    number: u64,
    /// The number of its (first) invocation, counting every invocation started.
    invocation: u64,
    fail: bool,
    duplicate: bool,
    crash_before_commit: bool,
    lose_response: bool,
    report_batch_item_failures: bool,
}

/// A batch in flight, as the loop remembers it.
struct Dispatched {
    event: Arc<KafkaEvent>,
    /// The lease (see [`crate::rebalance`]) each of its partitions was read under.
    leases: BTreeMap<TopicPartition, u64>,
    /// The batch size limits of the retry group it was formed for (empty: a fresh batch).
    limits: VecDeque<usize>,
}

/// The partitions of a failed batch, retried together after their backoff.
#[derive(Debug)]
struct RetryGroup {
    partitions: BTreeSet<TopicPartition>,
    /// Batch size limits queued by bisection and the extended-retry fault; the front
    /// applies to the next batch (none: the batch size).
    limits: VecDeque<usize>,
    /// Not retried before this (the backoff).
    not_before: Instant,
    /// Gather records for the batching window first (a retry that may end later) instead
    /// of going at once with the records it failed with.
    gather: bool,
}

/// Failed attempts of a partition's first records not done.
#[derive(Debug, Default)]
struct Attempts {
    count: u32,
    last_error: String,
}

/// The loop's state.
#[derive(Default)]
struct Progress {
    buffers: Buffers,
    attempts: BTreeMap<TopicPartition, Attempts>,
    /// Partitions of failed batches waiting for their retry (none of them in flight).
    groups: Vec<RetryGroup>,
    /// Partitions with a batch in flight (whatever lease it was read under).
    in_flight: BTreeSet<TopicPartition>,
    committed: BTreeMap<TopicPartition, i64>,
    /// The lease (see [`crate::rebalance`]) under which each buffered partition was read.
    leases: BTreeMap<TopicPartition, u64>,
    /// Partitions this runner paused because enough of their records are buffered.
    paused: BTreeSet<TopicPartition>,
    /// When the batching window of the fresh records (those of partitions neither in
    /// flight nor in a retry group) opened.
    window_opened: Option<Instant>,
    batch_number: u64,
    summary: RunSummary,
    /// When the last batch completed.
    last_done: Option<Instant>,
}

impl Progress {
    /// Forgets everything about `tp` (revoked): its buffered records, attempts, commits,
    /// its retry. A batch of it in flight is still awaited (its outcome is then dropped).
    fn forget(&mut self, tp: &TopicPartition) {
        let before = self.buffers.len();
        self.buffers.retain(|t| t != tp);
        self.summary.dropped += (before - self.buffers.len()) as u64;
        self.attempts.remove(tp);
        self.committed.remove(tp);
        self.leases.remove(tp);
        self.ungroup(tp);
    }

    /// Takes `tp` out of its retry group (a group left empty is dropped).
    fn ungroup(&mut self, tp: &TopicPartition) {
        for group in &mut self.groups {
            group.partitions.remove(tp);
        }
        self.groups.retain(|g| !g.partitions.is_empty());
    }

    /// Whether `tp` can go into a fresh batch: no batch of it in flight, no retry pending.
    fn fresh(&self, tp: &TopicPartition) -> bool {
        !self.in_flight.contains(tp) && !self.groups.iter().any(|g| g.partitions.contains(tp))
    }

    /// Drops the partitions no longer owned under the lease they were read under.
    fn drop_stale(&mut self, consumer: &GroupConsumer) {
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
}

/// What `until_caught_up` waits for: every owned partition committed up to the end
/// offset it had at the start.
struct CaughtUp {
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

    fn new(ends: BTreeMap<TopicPartition, (i64, i64)>, committed: &TopicPartitionList) -> Self {
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

    fn refresh_due(&self) -> bool {
        self.refreshed.elapsed() >= Self::REFRESH
    }

    fn next_refresh(&self) -> Instant {
        self.refreshed + Self::REFRESH
    }

    /// Reads the group's committed offsets of the owned partitions again.
    fn refresh(&mut self, consumer: &GroupConsumer) -> Result<(), String> {
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
    fn reached(&self, consumer: &GroupConsumer, state: &Progress) -> bool {
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
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &c.bootstrap_servers)
            .set("group.id", &c.group_id)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", c.starting_position.auto_offset_reset());
        // The KIP-848 protocol takes the session timeout from the broker (librdkafka
        // refuses a client-side one).
        let next_gen = c
            .consumer_properties
            .iter()
            .any(|(k, v)| k == "group.protocol" && v.eq_ignore_ascii_case("consumer"));
        if !next_gen {
            config.set("session.timeout.ms", "10000");
        }
        for (key, value) in &c.consumer_properties {
            config.set(key, value);
        }
        let consumer: GroupConsumer = config
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

    /// A client (no group) for the end offsets of partitions. Not the group consumer:
    /// a broker answers the requests of one connection in order, so on the consumer's
    /// connection a query waits behind its fetch, which the broker holds up to
    /// `fetch.wait.max.ms` (500 ms) when there is nothing new: about half a second per
    /// partition.
    fn offsets_client(&self) -> Result<BaseConsumer, String> {
        let c = &self.config;
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &c.bootstrap_servers);
        // The connection's settings (TLS, SASL) apply to it too.
        for (key, value) in c.consumer_properties.iter().filter(|(k, _)| {
            ["security.", "ssl.", "sasl.", "client."]
                .iter()
                .any(|p| k.starts_with(p))
        }) {
            config.set(key, value);
        }
        config
            .create()
            .map_err(|e| format!("cannot create a client for {}: {e}", c.bootstrap_servers))
    }

    /// The end offset (high watermark) of every partition of the runner's topics.
    fn end_offsets(
        &self,
        client: &BaseConsumer,
    ) -> Result<BTreeMap<TopicPartition, (i64, i64)>, String> {
        let mut ends = BTreeMap::new();
        for topic in &self.config.topics {
            let metadata = client
                .fetch_metadata(Some(topic), METADATA_TIMEOUT)
                .map_err(|e| format!("cannot read the partitions of {topic}: {e}"))?;
            for t in metadata.topics() {
                for p in t.partitions() {
                    let watermarks = client
                        .fetch_watermarks(t.name(), p.id(), METADATA_TIMEOUT)
                        .map_err(|e| {
                            format!("cannot read the end offset of {}-{}: {e}", t.name(), p.id())
                        })?;
                    ends.insert(TopicPartition::new(t.name(), p.id()), watermarks);
                }
            }
        }
        Ok(ends)
    }

    /// Consumes, batches, invokes and commits until stopped (or, with `until_idle`,
    /// until the group has consumed everything; with `until_caught_up`, until the records
    /// there were at the start are done).
    pub async fn run(&self) -> Result<RunSummary, String> {
        let started = Instant::now();
        let consumer = self.consumer()?;
        let offsets = self.offsets_client()?;
        self.initialize_positions()?;
        // What `until_caught_up` waits for: the end offsets now, and where the group is.
        let targets = if self.config.until_caught_up {
            let ends = self.end_offsets(&offsets)?;
            let mut list = TopicPartitionList::new();
            for tp in ends.keys() {
                list.add_partition(&tp.topic, tp.partition);
            }
            let committed =
                with_coordinator(|| consumer.committed_offsets(list.clone(), METADATA_TIMEOUT))
                    .map_err(|e| {
                        format!(
                            "cannot read the committed offsets of group {}: {e}",
                            self.config.group_id
                        )
                    })?;
            Some(CaughtUp::new(ends, &committed))
        } else {
            None
        };
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
        let mut targets = targets;
        let mut state = Progress::default();
        let mut tasks: JoinSet<Invoked> = JoinSet::new();
        let mut dispatched: HashMap<tokio::task::Id, Dispatched> = HashMap::new();
        let mut last_progress = Instant::now();
        let mut last_activity = Instant::now();
        let mut first_record: Option<Instant> = None;
        // After a consumer error, reading waits a little (the loop goes on meanwhile).
        let mut read_after: Option<Instant> = None;
        // Whether `until_caught_up` is to be checked (a batch was settled).
        let mut settled = false;
        let stopped = loop {
            state.drop_stale(&consumer);
            if tasks.len() < self.config.concurrency {
                // Before a batch can form: too old records are not delivered.
                self.give_up_old_records(&consumer, &mut state, destination.as_ref())
                    .await?;
            }
            while tasks.len() < self.config.concurrency {
                let Some((event, limits)) = self.next_batch(&mut state, Instant::now()) else {
                    break;
                };
                let (id, batch) = self.dispatch(event, limits, &mut state, &mut tasks);
                dispatched.insert(id, batch);
            }
            state.summary.peak_in_flight = state.summary.peak_in_flight.max(tasks.len());
            self.apply_backpressure(&consumer, &mut state);
            let idle = tasks.is_empty() && state.buffers.is_empty();
            if idle && last_activity.elapsed() >= self.config.idle_timeout {
                // Commits refused during a rebalance are tried again here.
                self.commit(&consumer, &mut state)?;
                if self.config.until_idle && self.caught_up(&consumer, &offsets)? {
                    break Instant::now();
                }
                last_activity = Instant::now();
            }
            if let Some(targets) = targets.as_mut() {
                // With nothing left to do here, the group's commits are read again (now and
                // then): a partition done by another runner before it came here counts.
                if idle && targets.refresh_due() {
                    self.commit(&consumer, &mut state)?;
                    targets.refresh(&consumer)?;
                    settled = true;
                }
                if std::mem::take(&mut settled) && targets.reached(&consumer, &state) {
                    break Instant::now();
                }
            }
            if self.config.progress && last_progress.elapsed() >= Duration::from_secs(1) {
                last_progress = Instant::now();
                state.summary.active = first_record.map_or(Duration::ZERO, |t| t.elapsed());
                eprintln!(
                    "{}",
                    self.progress_line(&consumer, &offsets, &state, tasks.len())
                );
            }

            let now = Instant::now();
            let mut wake = now + Duration::from_secs(1);
            if let Some(targets) = targets.as_ref().filter(|_| idle) {
                wake = wake.min(targets.next_refresh());
            }
            if tasks.len() < self.config.concurrency {
                wake = wake.min(self.next_deadline(&state));
            }
            if idle {
                wake = wake.min(last_activity + self.config.idle_timeout);
            }
            let reading = read_after.is_none_or(|t| now >= t);
            if let Some(t) = read_after.filter(|_| !reading) {
                wake = wake.min(t);
            }
            let wake = tokio::time::Instant::from_std(wake.max(now + Duration::from_millis(1)));
            tokio::select! {
                biased;
                Some(joined) = tasks.join_next_with_id(), if !tasks.is_empty() => {
                    let (id, invoked) = match joined {
                        Ok((id, invoked)) => (id, invoked),
                        Err(e) => (e.id(), Invoked {
                            outcome: Outcome::Failed(format!("the invocation task failed: {e}")),
                            extra_invocations: 0,
                        }),
                    };
                    let batch = dispatched.remove(&id).ok_or("an unknown invocation completed")?;
                    let live = self.settle(&batch, invoked, &mut state);
                    self.give_up_exhausted(&batch.event, &live, &mut state, destination.as_ref())
                        .await?;
                    self.commit(&consumer, &mut state)?;
                    last_activity = Instant::now();
                    settled = true;
                }
                received = consumer.recv(), if reading => {
                    match received {
                        Err(e) => {
                            tracing::warn!(error = %e, "consumer error");
                            read_after = Some(Instant::now() + Duration::from_millis(100));
                        }
                        Ok(message) => {
                            read_after = None;
                            let tp = TopicPartition::new(message.topic(), message.partition());
                            let record = to_record(&message);
                            drop(message);
                            // A rebalance runs inside `recv`: drop what was revoked first.
                            state.drop_stale(&consumer);
                            let lease = consumer.context().assignment().lease(&tp);
                            if let Some(lease) = lease {
                                if state.leases.get(&tp) != Some(&lease) {
                                    // Assigned again since its records were read: read afresh.
                                    state.forget(&tp);
                                    state.leases.insert(tp.clone(), lease);
                                }
                                let now = Instant::now();
                                first_record = first_record.or(Some(now));
                                last_activity = now;
                                state.buffers.push(tp, record);
                            } else {
                                tracing::debug!(%tp, "record of a partition not owned: dropped");
                            }
                        }
                    }
                }
                () = tokio::time::sleep_until(wake) => {}
            }
        };
        // Caught up with batches of other partitions (records produced since the start)
        // still in flight: they end and are committed, so nothing is delivered twice.
        while let Some(joined) = tasks.join_next_with_id().await {
            let (id, invoked) = match joined {
                Ok((id, invoked)) => (id, invoked),
                Err(e) => (
                    e.id(),
                    Invoked {
                        outcome: Outcome::Failed(format!("the invocation task failed: {e}")),
                        extra_invocations: 0,
                    },
                ),
            };
            let batch = dispatched
                .remove(&id)
                .ok_or("an unknown invocation completed")?;
            self.settle(&batch, invoked, &mut state);
        }
        self.commit(&consumer, &mut state)?;
        let assignment = consumer.context().assignment();
        state.summary.revocations = assignment.revocations();
        state.summary.to_assignment = assignment
            .first_assigned()
            .map(|t| t.saturating_duration_since(started));
        drop(assignment);
        state.summary.to_first_record = first_record.map(|t| t.saturating_duration_since(started));
        state.summary.stop_after_last_batch = state
            .last_done
            .map(|last| stopped.saturating_duration_since(last));
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

    /// The next batch to invoke, if one is due: a retry group whose backoff is over (at
    /// once with the records it failed with, or after gathering for the batching window),
    /// else a fresh batch of the partitions neither in flight nor retrying, once it is
    /// full (batch size or 6 MB) or its batching window has closed. Returns the event and
    /// the retry group's remaining batch size limits.
    fn next_batch(
        &self,
        state: &mut Progress,
        now: Instant,
    ) -> Option<(KafkaEvent, VecDeque<usize>)> {
        let (source, servers) = (self.source(), &self.config.bootstrap_servers);
        let mut i = 0;
        while i < state.groups.len() {
            let group = &state.groups[i];
            let member = |tp: &TopicPartition| group.partitions.contains(tp);
            let (records, bytes) = state.buffers.count_where(member);
            if records == 0 {
                // Everything it held was given up on (or dropped).
                state.groups.remove(i);
                continue;
            }
            let limit = group
                .limits
                .front()
                .copied()
                .unwrap_or(self.config.batch_size);
            let due = now >= group.not_before
                && (!group.gather
                    || records >= limit
                    || bytes >= MAX_PAYLOAD_BYTES
                    || now >= group.not_before + self.config.batching_window);
            if due
                && !group
                    .partitions
                    .iter()
                    .any(|tp| state.in_flight.contains(tp))
            {
                let event = state
                    .buffers
                    .form_event_where(limit, member, &source, servers);
                let group = state.groups.remove(i);
                return Some((event, group.limits));
            }
            i += 1;
        }
        let (records, bytes) = state.buffers.count_where(|tp| state.fresh(tp));
        if records == 0 {
            state.window_opened = None;
            return None;
        }
        let opened = *state.window_opened.get_or_insert(now);
        let limit = self.config.batch_size;
        if records >= limit
            || bytes >= MAX_PAYLOAD_BYTES
            || now >= opened + self.config.batching_window
        {
            state.window_opened = None;
            let event =
                state
                    .buffers
                    .form_event_where(limit, |tp| state.fresh(tp), &source, servers);
            return Some((event, VecDeque::new()));
        }
        None
    }

    /// When [`next_batch`](Self::next_batch) may next have a batch without a new record
    /// arriving: the end of a batching window or of a retry's backoff.
    fn next_deadline(&self, state: &Progress) -> Instant {
        let window = self.config.batching_window;
        let groups = state.groups.iter().map(|g| {
            if g.gather {
                g.not_before + window
            } else {
                g.not_before
            }
        });
        let fresh = state.window_opened.map(|opened| opened + window);
        groups
            .chain(fresh)
            .min()
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(1))
    }

    /// Starts the invocation of `event` as a task; returns the task's id and what the loop
    /// keeps of the batch.
    fn dispatch(
        &self,
        event: KafkaEvent,
        limits: VecDeque<usize>,
        state: &mut Progress,
        tasks: &mut JoinSet<Invoked>,
    ) -> (tokio::task::Id, Dispatched) {
        state.batch_number += 1;
        state.summary.invocations += 1;
        let faults = &self.config.faults;
        let number = state.batch_number;
        let every = |n: Option<u64>| n.is_some_and(|n| n > 0 && number.is_multiple_of(n));
        let plan = Plan {
            number,
            invocation: state.summary.invocations,
            fail: faults.fail_invocation == Some(state.summary.invocations),
            duplicate: every(faults.duplicate_every),
            crash_before_commit: faults.crash_before_commit == Some(number),
            lose_response: every(faults.extend_retry_every),
            report_batch_item_failures: self.config.report_batch_item_failures,
        };
        let mut leases = BTreeMap::new();
        for part in &event.partitions {
            state.in_flight.insert(part.tp.clone());
            if let Some(&lease) = state.leases.get(&part.tp) {
                leases.insert(part.tp.clone(), lease);
            }
        }
        let event = Arc::new(event);
        let handle = tasks.spawn(invoke(
            Arc::clone(&self.transport),
            Arc::clone(&event),
            plan,
        ));
        (
            handle.id(),
            Dispatched {
                event,
                leases,
                limits,
            },
        )
    }

    /// Applies an invocation's outcome to the buffers, attempt counts and retry groups.
    /// Only the partitions still owned under the lease the batch was read under are
    /// settled (returned); the outcome for the others is dropped.
    fn settle(
        &self,
        batch: &Dispatched,
        invoked: Invoked,
        state: &mut Progress,
    ) -> Vec<TopicPartition> {
        let now = Instant::now();
        let event = &batch.event;
        state.summary.invocations += invoked.extra_invocations;
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
                return live;
            }
        }
        let is_live = |tp: &TopicPartition| live.contains(tp);
        let mut limits = batch.limits.clone();
        let fail = |state: &mut Progress, tp: &TopicPartition, error: String| {
            let a = state.attempts.entry(tp.clone()).or_default();
            a.count += 1;
            a.last_error = error;
            a.count
        };
        match invoked.outcome {
            Outcome::Lost => {
                // The retry is a longer batch from the same offsets.
                let longer = (event.record_count() * 2).min(MAX_BATCH_SIZE);
                limits.push_front(longer);
                self.retry(state, live.clone(), limits, now, true);
            }
            Outcome::Failed(error) => {
                state.summary.failures += 1;
                tracing::warn!(%error, records = event.record_count(), "batch failed");
                let n = event.record_count();
                if self.config.bisect_batch_on_function_error && n > 1 {
                    limits.pop_front();
                    limits.push_front(n / 2);
                    limits.push_front(n.div_ceil(2));
                    let at = now + self.backoff(0);
                    self.retry(state, live.clone(), limits, at, false);
                } else {
                    let mut worst = 0;
                    for tp in &live {
                        worst = worst.max(fail(state, tp, error.clone()));
                    }
                    let at = now + self.backoff(worst);
                    self.retry(state, live.clone(), limits, at, false);
                }
            }
            Outcome::Success | Outcome::Partial(_) => {
                let resume = match invoked.outcome {
                    Outcome::Partial(resume) => resume,
                    _ => BTreeMap::new(),
                };
                if !resume.is_empty() {
                    state.summary.failures += 1;
                }
                limits.pop_front();
                let mut done = 0;
                let mut failed = Vec::new();
                let mut worst = 0;
                for part in event.partitions.iter().filter(|p| is_live(&p.tp)) {
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
                            let error = format!(
                                "the function reported {}@{offset} as failed (partial batch response)",
                                part.tp
                            );
                            worst = worst.max(fail(state, &part.tp, error));
                            failed.push(part.tp.clone());
                        }
                        None => {
                            done += part.records.len();
                            state.buffers.complete(&part.tp, last.offset + 1);
                            state.attempts.remove(&part.tp);
                        }
                    }
                }
                if !failed.is_empty() {
                    let at = now + self.backoff(worst);
                    self.retry(state, failed, limits, at, false);
                } else if !limits.is_empty() {
                    // The rest of a bisected batch goes next, at once.
                    self.retry(state, live.clone(), limits, now, false);
                }
                if done > 0 {
                    state.summary.batches += 1;
                    state.summary.records += done as u64;
                    state.last_done = Some(now);
                }
            }
        }
        live
    }

    /// Makes `partitions` a retry group, due at `not_before`.
    fn retry(
        &self,
        state: &mut Progress,
        partitions: Vec<TopicPartition>,
        limits: VecDeque<usize>,
        not_before: Instant,
        gather: bool,
    ) {
        for tp in &partitions {
            state.ungroup(tp);
        }
        if partitions.is_empty() {
            return;
        }
        state.groups.push(RetryGroup {
            partitions: partitions.into_iter().collect(),
            limits,
            not_before,
            gather,
        });
    }

    /// The wait before retrying a partition after its `attempt`th failed attempt.
    fn backoff(&self, attempt: u32) -> Duration {
        (self.config.retry_backoff * 2u32.saturating_pow(attempt.min(7))).min(MAX_RETRY_BACKOFF)
    }

    /// Pauses the owned partitions with enough buffered records that consuming more would
    /// only grow memory, and resumes them once they are below half of it. Paused
    /// partitions stay paused across rebalances in librdkafka, so a partition is resumed
    /// as soon as its records are dropped, whoever owns it.
    fn apply_backpressure(&self, consumer: &GroupConsumer, state: &mut Progress) {
        let records = PAUSE_RECORDS.max(
            self.config
                .read_ahead_batches
                .saturating_mul(self.config.batch_size),
        );
        let bytes = PAUSE_BYTES;
        let paused: Vec<TopicPartition> = state
            .leases
            .keys()
            .filter(|tp| !state.paused.contains(*tp))
            .filter(|tp| {
                let (n, b) = state.buffers.count_of(tp);
                n >= records || b >= bytes
            })
            .cloned()
            .collect();
        let resumed: Vec<TopicPartition> = state
            .paused
            .iter()
            .filter(|tp| {
                let (n, b) = state.buffers.count_of(tp);
                n < records / 2 && b < bytes / 2
            })
            .cloned()
            .collect();
        let list = |tps: &[TopicPartition]| {
            let mut list = TopicPartitionList::new();
            for tp in tps {
                list.add_partition(&tp.topic, tp.partition);
            }
            list
        };
        if !paused.is_empty() {
            match consumer.pause(&list(&paused)) {
                Ok(()) => state.paused.extend(paused),
                Err(e) => tracing::warn!(error = %e, "cannot pause partitions"),
            }
        }
        if !resumed.is_empty() {
            match consumer.resume(&list(&resumed)) {
                Ok(()) => {
                    for tp in &resumed {
                        state.paused.remove(tp);
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot resume partitions"),
            }
        }
    }

    /// Gives up the records of the event's `live` partitions whose attempts exceed the limit.
    async fn give_up_exhausted(
        &self,
        event: &KafkaEvent,
        live: &[TopicPartition],
        state: &mut Progress,
        destination: Option<&FailureDestination>,
    ) -> Result<(), String> {
        let Some(limit) = self.config.effective_retry_limit() else {
            return Ok(());
        };
        for part in event.partitions.iter().filter(|p| live.contains(&p.tp)) {
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
            // What follows is fresh: no backoff, no retry plan.
            state.ungroup(&part.tp);
        }
        Ok(())
    }

    /// Gives up the buffered records older than the maximum record age (of partitions
    /// without a batch in flight), and commits.
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
        let in_flight = &state.in_flight;
        let old = state
            .buffers
            .take_older_than(cutoff, |tp| !in_flight.contains(tp));
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

    /// Whether the group's committed offsets have reached the end of every assigned partition.
    fn caught_up(&self, consumer: &GroupConsumer, offsets: &BaseConsumer) -> Result<bool, String> {
        let assignment = consumer
            .assignment()
            .map_err(|e| format!("cannot read the assignment: {e}"))?;
        if assignment.count() == 0 {
            return Ok(false);
        }
        let committed = with_coordinator(|| consumer.committed(METADATA_TIMEOUT))
            .map_err(|e| format!("cannot read committed offsets: {e}"))?;
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
            if position < high {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// `records, batches, retries, records/s, invocations in flight (and the peak), lag per
    /// partition` (the lag: records after the committed position).
    fn progress_line(
        &self,
        consumer: &GroupConsumer,
        offsets: &BaseConsumer,
        state: &Progress,
        in_flight: usize,
    ) -> String {
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
                offsets.fetch_watermarks(&tp.topic, tp.partition, Duration::from_millis(500)),
            ) {
                (Some(position), Ok((_, high))) => (high - position).max(0).to_string(),
                (None, Ok((low, high))) => format!("<={}", high - low),
                (_, Err(_)) => "?".to_owned(),
            };
            lags.push(format!("{tp}={lag}"));
        }
        format!(
            "[local-runner] {} records, {} batches, {} retries, {} given up, {:.0} records/s; {} in flight (peak {}); lag {}",
            s.records,
            s.batches,
            s.failures,
            s.given_up,
            s.records_per_second(),
            in_flight,
            s.peak_in_flight,
            if lags.is_empty() {
                "-".to_owned()
            } else {
                lags.join(" ")
            }
        )
    }
}

/// One batch's invocation (twice with the duplicate fault), run as its own task, and
/// what it came to.
async fn invoke(transport: Arc<dyn Transport>, event: Arc<KafkaEvent>, plan: Plan) -> Invoked {
    let mut extra_invocations = 0;
    if plan.fail {
        return Invoked {
            outcome: Outcome::Failed(format!(
                "injected failure of invocation {}",
                plan.invocation
            )),
            extra_invocations,
        };
    }
    let payload = event.to_json();
    // The payload is kept (a copy of up to 6 MB) only for a duplicate delivery.
    let duplicate = plan.duplicate.then(|| payload.clone());
    let mut result = transport.invoke(payload).await;
    if let Some(payload) = duplicate.filter(|_| result.is_ok()) {
        extra_invocations += 1;
        result = transport.invoke(payload).await;
    }
    let outcome = match result {
        Err(e) => Outcome::Failed(e.0),
        Ok(_) if !plan.report_batch_item_failures => Outcome::Success,
        Ok(body) => match judge(&body, &event) {
            Verdict::Success => Outcome::Success,
            Verdict::Partial(resume) => Outcome::Partial(resume),
            Verdict::Invalid(why) => Outcome::Failed(format!("invalid response: {why}")),
        },
    };
    if matches!(outcome, Outcome::Success) && plan.crash_before_commit {
        eprintln!(
            "[local-runner] injected crash: batch {} succeeded, aborting before its commit",
            plan.number
        );
        std::process::abort();
    }
    if matches!(outcome, Outcome::Success) && plan.lose_response {
        // Injected: the response was lost; the retry is a longer batch from the same
        // offsets (not a failure of the function: no attempt is counted).
        return Invoked {
            outcome: Outcome::Lost,
            extra_invocations,
        };
    }
    Invoked {
        outcome,
        extra_invocations,
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
