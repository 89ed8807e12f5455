//! Exactly-once output to Kafka (design notes, section 5a): per source partition of the
//! event a transactional producer with a stable `transactional.id`, the partition's
//! progress in a shadow consumer group committed inside each transaction.

/// Whether `id` can prefix transactional ids and a consumer group: Kafka topic-name
/// characters (`A-Z a-z 0-9 . _ -`), 1 to 200 of them; `Err` says why not.
pub fn check_application_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > 200 {
        return Err("must be 1 to 200 characters".into());
    }
    if let Some(c) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "holds {c:?}: use the characters of Kafka topic names (A-Z a-z 0-9 . _ -)"
        ));
    }
    Ok(())
}

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use async_trait::async_trait;
use tokio::sync::Mutex;

use crate::dsl::Topology;
use crate::error::StreamError;
use crate::event::{KafkaEvent, TopicPartition};
use crate::runtime::{
    BatchOptions, BatchOutcome, OutputGuarantee, Shadow, StreamTime, WindowClaims,
};
use crate::sink::{OutputRecord, Sink, SinkError};
use crate::state::Clock;
use crate::state::Store;
use crate::wire::{ERROR_HEADER, SOURCE_HEADER, SourceHeader, TRANSACTION_HEADER};

/// Why a step of a transaction failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnError {
    /// The producer cannot go on (fenced by a newer instance of its transactional id, or
    /// another fatal error): it is dropped, the next invocation initialises a new one.
    pub fatal: bool,
    /// What the client said.
    pub reason: String,
}

impl TxnError {
    /// A fatal error (the producer is dropped).
    pub fn fatal(reason: impl Into<String>) -> Self {
        TxnError {
            fatal: true,
            reason: reason.into(),
        }
    }

    /// An error after which the producer can abort and go on.
    pub fn abortable(reason: impl Into<String>) -> Self {
        TxnError {
            fatal: false,
            reason: reason.into(),
        }
    }
}

/// A transactional producer: one `transactional.id`, initialised (`init_transactions`,
/// which fences every older instance of the id and completes its open transaction).
#[async_trait]
pub trait TransactionalProducer: Send + Sync {
    /// Starts a transaction.
    async fn begin(&self) -> Result<(), TxnError>;
    /// Produces `records` in the open transaction and waits for their acknowledgements.
    async fn send(&self, records: Vec<OutputRecord>) -> Result<(), TxnError>;
    /// Commits, inside the open transaction, the offset `next` of `tp` with `metadata` in
    /// the consumer group `group` (a group the producer is not a member of: generation -1).
    async fn send_offset(
        &self,
        group: &str,
        tp: &TopicPartition,
        next: i64,
        metadata: &str,
    ) -> Result<(), TxnError>;
    /// Commits the open transaction.
    async fn commit(&self) -> Result<(), TxnError>;
    /// Aborts the open transaction.
    async fn abort(&self) -> Result<(), TxnError>;
}

/// The cluster side of the protocol: transactional producers, and the shadow group's
/// committed offsets.
#[async_trait]
pub trait TransactionalLog: Send + Sync {
    /// A producer for `transactional_id`, initialised.
    async fn producer(
        &self,
        transactional_id: &str,
    ) -> Result<Arc<dyn TransactionalProducer>, TxnError>;
    /// The offsets of `tp` in `first..=last` whose records a `read_committed` consumer
    /// reads (not those of aborted transactions; waiting while a transaction in the range
    /// is open), in order.
    async fn read_committed(
        &self,
        tp: &TopicPartition,
        first: i64,
        last: i64,
    ) -> Result<Vec<i64>, TxnError>;
    /// The offsets committed in `group` for `tps` (`None`: none), with their metadata,
    /// *stable*: waiting out the transactional offsets not yet materialised
    /// (`require_stable`).
    async fn committed(
        &self,
        group: &str,
        tps: &[TopicPartition],
    ) -> Result<Vec<Option<CommittedOffset>>, TxnError>;
}

/// An offset committed in a consumer group, with the metadata committed with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommittedOffset {
    /// The next offset to read.
    pub offset: i64,
    /// The commit's metadata string (empty: none).
    pub metadata: String,
}

/// What the shadow group's commit metadata holds for a partition:
/// `lambda-streams attempt=<id> stream-time=<ms|none>`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ProgressMetadata {
    /// The random id of the batch attempt whose transaction committed the offset: claims of
    /// closed windows are keyed by it (see `WindowClaims`).
    attempt: Option<String>,
    /// The partition's stream time as of the committed offset, so that a retry decides
    /// lateness as the attempt that committed did (Kafka Streams keeps its partition time in
    /// the commit metadata too).
    stream_time: StreamTime,
    /// The offset at-least-once batches had processed the partition up to when its stream
    /// time was last seeded (`Clock::at_least_once`), carried by every commit: a higher one
    /// in the clock means at-least-once batches ran since (a switch back), and the
    /// partition is seeded again.
    at_least_once: Option<i64>,
}

/// The first word of the shadow group's commit metadata.
const PROGRESS_METADATA: &str = "lambda-streams";

impl ProgressMetadata {
    fn encode(attempt: &str, stream_time: i64, at_least_once: Option<i64>) -> String {
        let time = if stream_time == i64::MIN {
            "none".to_owned()
        } else {
            stream_time.to_string()
        };
        match at_least_once {
            Some(mark) => format!(
                "{PROGRESS_METADATA} attempt={attempt} stream-time={time} at-least-once={mark}"
            ),
            None => format!("{PROGRESS_METADATA} attempt={attempt} stream-time={time}"),
        }
    }

    /// Reads `metadata`; a commit without it (by an earlier version of the framework) has
    /// no attempt and an unknown stream time.
    fn parse(metadata: &str) -> Self {
        let mut parsed = ProgressMetadata {
            attempt: None,
            stream_time: StreamTime::Unknown,
            at_least_once: None,
        };
        let mut words = metadata.split_ascii_whitespace();
        if words.next() != Some(PROGRESS_METADATA) {
            return parsed;
        }
        for word in words {
            match word.split_once('=') {
                Some(("attempt", id)) if !id.is_empty() => parsed.attempt = Some(id.to_owned()),
                Some(("stream-time", "none")) => {
                    parsed.stream_time = StreamTime::Committed(i64::MIN)
                }
                Some(("stream-time", time)) => {
                    if let Ok(time) = time.parse() {
                        parsed.stream_time = StreamTime::Committed(time);
                    }
                }
                Some(("at-least-once", mark)) => parsed.at_least_once = mark.parse().ok(),
                _ => {}
            }
        }
        parsed
    }
}

/// What one invocation did with its transactions (in the handler's log and in tests).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TransactionReport {
    /// Producers initialised (not reused from an earlier invocation).
    pub initialised: u64,
    /// Producers reused.
    pub reused: u64,
    /// Transactions committed.
    pub committed: u64,
    /// Partitions whose starting stream time was committed first, in a transaction of its
    /// own (their first batch under exactly-once output; not counted in `committed`).
    pub seeded: u64,
    /// Output records not produced because their source record's outputs were committed
    /// already (below the shadow offset).
    pub skipped_outputs: u64,
    /// Records of the event not processed because `read_committed` does not read them (of
    /// aborted transactions), in the topics read again.
    pub uncommitted_records: u64,
}

/// Exactly-once output (design notes, section 5a): runs a batch with one transaction per
/// source partition of the event.
///
/// Per partition `tp` a producer with the stable `transactional.id` `<app>-<topic>-<p>`,
/// reused across invocations of a warm container and initialised when there is none (a
/// retry's initialisation fences a zombie's). Once every producer of the event is
/// initialised, one stable read of the shadow group `<app>-eos` gives `s[tp]`, the
/// offset up to which `tp`'s outputs are committed, with `tp`'s stream time as of it (a
/// partition without any, in a windowed topology, first commits the stream time the store
/// persisted, in a transaction of its own: see `seed_stream_times`; then, for the topics given to
/// [`reread_committed`](Self::reread_committed), the batch is read again with
/// `read_committed` and only what that finds is processed); the batch runs as ever (state written
/// before producing), its outputs of records below `s[tp]` dropped and each other output
/// produced in the transaction of its source record's partition; then per partition
/// `{tp: max(s[tp], last + 1)}` is committed to the shadow group in the transaction, with
/// the batch attempt's random id as the offset's metadata, and the transaction is
/// committed. The progress read returns the last committed attempt of each partition with
/// its offset: emit-on-close windows are claimed by attempt before they are emitted, and a
/// claim holding that attempt was committed (`Topology::claim_and_close_windows`, in
/// `runtime/batch.rs`). Any failure aborts every open transaction and fails the
/// invocation, naming the partition and its transactional id.
pub struct ExactlyOnceOutput {
    application_id: String,
    log: Arc<dyn TransactionalLog>,
    /// The producers of the warm container, by source partition; taken out for an
    /// invocation and put back when it ends with the producer still usable.
    producers: Mutex<HashMap<TopicPartition, Arc<dyn TransactionalProducer>>>,
    /// The topics whose batches are read again with `read_committed` (see
    /// [`reread_committed`](Self::reread_committed)).
    reread: std::collections::BTreeSet<String>,
}

impl ExactlyOnceOutput {
    /// Exactly-once output of the application `application_id` through `log`.
    pub fn new(application_id: impl Into<String>, log: Arc<dyn TransactionalLog>) -> Self {
        ExactlyOnceOutput {
            application_id: application_id.into(),
            log,
            producers: Mutex::new(HashMap::new()),
            reread: std::collections::BTreeSet::new(),
        }
    }

    /// Reads each batch of these topics again with `read_committed` (after the progress
    /// read) and processes only the records it finds: for topics written in transactions
    /// (the topology's repartition topics) delivered by an event source that may read
    /// `read_uncommitted`, whose batches may hold records of aborted transactions. The
    /// progress still covers the whole batch.
    pub fn reread_committed(mut self, topics: impl IntoIterator<Item = String>) -> Self {
        self.reread = topics.into_iter().collect();
        self
    }

    /// The transactional id of source partition `tp`: `<app>-<topic>-<partition>`.
    pub fn transactional_id(&self, tp: &TopicPartition) -> String {
        format!("{}-{}-{}", self.application_id, tp.topic, tp.partition)
    }

    /// The shadow consumer group holding the committed progress: `<app>-eos`.
    pub fn group(&self) -> String {
        format!("{}-eos", self.application_id)
    }

    /// Processes `event` with `topology` on `store` (see the type's documentation).
    pub async fn process(
        &self,
        topology: &Topology,
        event: &KafkaEvent,
        store: &dyn Store,
        options: &BatchOptions,
    ) -> Result<(BatchOutcome, TransactionReport), StreamError> {
        let tps: Vec<TopicPartition> = event.partitions.iter().map(|p| p.tp.clone()).collect();
        let ids: Vec<String> = tps.iter().map(|tp| self.transactional_id(tp)).collect();
        let failed = |i: usize, step: &str, e: TxnError| StreamError::Transaction {
            tp: tps[i].clone(),
            transactional_id: ids[i].clone(),
            reason: format!("{step}: {}", e.reason),
        };
        let mut report = TransactionReport::default();
        // 1. Every producer of the event, initialised (or reused), before reading progress.
        let mut cached: Vec<Option<Arc<dyn TransactionalProducer>>> = {
            let mut producers = self.producers.lock().await;
            tps.iter().map(|tp| producers.remove(tp)).collect()
        };
        let inits =
            futures::future::join_all(cached.iter_mut().zip(&ids).map(|(cached, id)| async move {
                match cached.take() {
                    Some(p) => (Ok(p), true),
                    None => (self.log.producer(id).await, false),
                }
            }))
            .await;
        let mut ready: Vec<(TopicPartition, Arc<dyn TransactionalProducer>)> = Vec::new();
        let mut producers: Vec<Arc<dyn TransactionalProducer>> = Vec::with_capacity(tps.len());
        let mut error = None;
        for (i, (init, reused)) in inits.into_iter().enumerate() {
            match init {
                Ok(p) => {
                    if reused {
                        report.reused += 1;
                    } else {
                        report.initialised += 1;
                    }
                    ready.push((tps[i].clone(), Arc::clone(&p)));
                    producers.push(p);
                }
                Err(e) => {
                    error.get_or_insert(failed(i, "init_transactions", e));
                }
            }
        }
        if let Some(e) = error {
            // The initialised ones are good for the next invocation.
            let mut cache = self.producers.lock().await;
            cache.extend(ready);
            return Err(e);
        }
        // 2. One stable read of the shadow group's progress, after every init.
        let shadow = match self.log.committed(&self.group(), &tps).await {
            Ok(s) => s,
            Err(e) => {
                self.keep(&tps, &producers, &[]).await;
                return Err(StreamError::Transaction {
                    tp: tps[0].clone(),
                    transactional_id: ids[0].clone(),
                    reason: format!(
                        "reading the committed progress of group {:?}: {}",
                        self.group(),
                        e.reason
                    ),
                });
            }
        };
        // Nothing committed: no outputs, no attempt, and the stream time to be seeded (2a).
        let mut progress: Vec<(i64, ProgressMetadata)> = shadow
            .into_iter()
            .map(|s| match s {
                Some(c) => (c.offset, ProgressMetadata::parse(&c.metadata)),
                None => (
                    i64::MIN,
                    ProgressMetadata {
                        attempt: None,
                        stream_time: StreamTime::Committed(i64::MIN),
                        at_least_once: None,
                    },
                ),
            })
            .collect();
        // 2a. The partitions without committed progress, or read at least once past it:
        // their starting stream time first. A windowed topology's clock is read once, here,
        // and the batch uses it.
        let clock = match topology.inner.windowed {
            true => match store.clock().await {
                Ok(clock) => Some(clock),
                Err(e) => {
                    self.keep(&tps, &producers, &[]).await;
                    return Err(e.into());
                }
            },
            false => None,
        };
        match self
            .seed_stream_times(clock.as_ref(), event, &producers, &mut progress)
            .await
        {
            Ok(seeded) => report.seeded = seeded,
            Err((fatal, e)) => {
                self.give_up(&tps, &producers, fatal).await;
                return Err(e);
            }
        }
        let committed_attempts: Vec<Option<String>> =
            progress.iter().map(|(_, m)| m.attempt.clone()).collect();
        let stream_times: Vec<StreamTime> = progress.iter().map(|(_, m)| m.stream_time).collect();
        let marks: Vec<Option<i64>> = progress.iter().map(|(_, m)| m.at_least_once).collect();
        let shadow: Vec<i64> = progress.iter().map(|(offset, _)| *offset).collect();
        // This attempt's id: committed as the shadow offsets' metadata, and kept in the
        // claims of the windows it closes (see `WindowClaims`).
        let attempt = format!("{:032x}", rand::random::<u128>());
        let claims = WindowClaims::new(&attempt, &committed_attempts);
        // 2b. The batches of transactional topics, as read_committed reads them.
        let original = event;
        let filtered;
        let event = if original
            .partitions
            .iter()
            .any(|p| self.reread.contains(&p.tp.topic) && !p.records.is_empty())
        {
            let mut copy = original.clone();
            for (i, batch) in copy.partitions.iter_mut().enumerate() {
                let (Some(first), Some(last)) = (batch.records.first(), batch.records.last())
                else {
                    continue;
                };
                if !self.reread.contains(&batch.tp.topic) {
                    continue;
                }
                let (first, last) = (first.offset, last.offset);
                match self.log.read_committed(&batch.tp, first, last).await {
                    Ok(visible) => {
                        let visible: std::collections::HashSet<i64> = visible.into_iter().collect();
                        let before = batch.records.len();
                        batch.records.retain(|r| visible.contains(&r.offset));
                        report.uncommitted_records += (before - batch.records.len()) as u64;
                    }
                    Err(e) => {
                        self.keep(&tps, &producers, &[]).await;
                        return Err(failed(
                            i,
                            &format!("re-reading offsets {first}..={last} with read_committed"),
                            e,
                        ));
                    }
                }
            }
            filtered = copy;
            &filtered
        } else {
            original
        };
        // 3. One transaction per partition.
        for (i, p) in producers.iter().enumerate() {
            if let Err(e) = p.begin().await {
                let fatal = e.fatal;
                let err = failed(i, "begin_transaction", e);
                self.give_up(&tps, &producers, if fatal { Some(i) } else { None })
                    .await;
                return Err(err);
            }
        }
        let sink = TransactionalSink {
            tps: &tps,
            producers: &producers,
            shadow: &shadow,
            produced: tps.iter().map(|_| AtomicBool::new(false)).collect(),
            skipped: AtomicU64::new(0),
            failure: std::sync::Mutex::new(None),
        };
        let mut eos_options = options.clone();
        eos_options.output = OutputGuarantee::ExactlyOnce;
        let committed = Shadow {
            offsets: shadow.clone(),
            stream_times,
            clock,
        };
        let result = topology
            .process_transactional(
                event,
                store,
                &sink,
                &eos_options,
                Some((&committed, &claims)),
            )
            .await;
        report.skipped_outputs = sink.skipped.load(Ordering::Relaxed);
        let (outcome, end_times) = match result {
            Ok(done) => done,
            Err(e) => {
                let fatal = sink
                    .failure
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .take();
                let e = match fatal {
                    Some((i, txn)) => {
                        let fatal = txn.fatal.then_some(i);
                        let err = failed(i, "produce", txn);
                        self.give_up(&tps, &producers, fatal).await;
                        return Err(err);
                    }
                    None => e,
                };
                self.give_up(&tps, &producers, None).await;
                return Err(e);
            }
        };
        // 4. Per partition: progress in the transaction, then commit; the partitions'
        // transactions are independent, so they end concurrently.
        let group = self.group();
        let ends =
            futures::future::join_all(event.partitions.iter().enumerate().map(|(i, batch)| {
                let next = match outcome.failures.iter().find(|(tp, _)| *tp == batch.tp) {
                    // A partial batch response: the partition is delivered again from there.
                    Some((_, offset)) => *offset,
                    None => batch.records.last().map_or(i64::MIN, |r| r.offset + 1),
                };
                let committed_before = shadow[i];
                let progress = committed_before.max(next);
                // A batch that claimed windows commits, so that its attempt is recorded.
                let produced = sink.produced[i].load(Ordering::Relaxed) || claims.claimed(i);
                let (p, group) = (&producers[i], group.as_str());
                let metadata = ProgressMetadata::encode(&attempt, end_times[i], marks[i]);
                async move {
                    if !produced && progress == committed_before {
                        // Nothing to produce and nothing to record: no round trip.
                        return p
                            .abort()
                            .await
                            .map(|()| false)
                            .map_err(|e| ("abort_transaction", e));
                    }
                    // Always with the attempt: a transaction that holds claimed windows
                    // must record it (no offset yet: 0, below every record).
                    p.send_offset(group, &batch.tp, progress.max(0), &metadata)
                        .await
                        .map_err(|e| ("send_offsets_to_transaction", e))?;
                    p.commit()
                        .await
                        .map(|()| true)
                        .map_err(|e| ("commit_transaction", e))
                }
            }))
            .await;
        let mut first_error = None;
        let mut dropped: Vec<usize> = Vec::new();
        for (i, end) in ends.into_iter().enumerate() {
            match end {
                Ok(committed) => report.committed += u64::from(committed),
                Err((step, e)) => {
                    // Fenced: the producer is dropped; otherwise aborted and kept.
                    if e.fatal || producers[i].abort().await.is_err() {
                        dropped.push(i);
                    }
                    first_error.get_or_insert(failed(i, step, e));
                }
            }
        }
        self.keep(&tps, &producers, &dropped).await;
        match first_error {
            // The other partitions' transactions may have committed: their retry finds
            // their progress and produces nothing again.
            Some(e) => Err(e),
            None => Ok((outcome, report)),
        }
    }

    /// A partition whose progress the shadow group does not hold yet (its first batch under
    /// exactly-once output: a new deployment, a switch from at-least-once output, or shadow
    /// offsets that expired) starts from the stream time the store persisted: as far as
    /// at-least-once batches read the partition, so that the windows they closed stay
    /// closed. That time is committed first, with the batch's first offset, in a transaction
    /// of its own and before anything is written: an aborted attempt moves the persisted
    /// time past records its retry must process again (and would then drop as late), so
    /// every later attempt takes the time from the shadow group, as for any committed
    /// progress. The same for a partition that at-least-once batches read past its
    /// committed progress since its last seed (a switch back: `Clock::at_least_once` above
    /// the progress and above the mark the last seed committed): the later of the committed
    /// and the persisted time, the progress never moved back, the committed attempt id kept
    /// (the windows it claimed stay claimed by a committed attempt). Only for a topology that
    /// keeps stream time (a windowed one: `clock` is its clock), once per partition and
    /// switch; a first seed's attempt id is its own (it claims no window). Returns the
    /// partitions seeded; on failure, the partition whose producer failed fatally (if one
    /// did) and the error.
    async fn seed_stream_times(
        &self,
        clock: Option<&Clock>,
        event: &KafkaEvent,
        producers: &[Arc<dyn TransactionalProducer>],
        progress: &mut [(i64, ProgressMetadata)],
    ) -> Result<u64, (Option<usize>, StreamError)> {
        let Some(clock) = clock else {
            return Ok(0);
        };
        let unseeded: Vec<(usize, i64)> = event
            .partitions
            .iter()
            .enumerate()
            .filter(|(i, batch)| {
                let (committed, metadata) = &progress[*i];
                let read_since = clock.at_least_once.get(&batch.tp).is_some_and(|&mark| {
                    mark > *committed && metadata.at_least_once.is_none_or(|seen| mark > seen)
                });
                *committed == i64::MIN || read_since
            })
            .filter_map(|(i, batch)| batch.records.first().map(|r| (i, r.offset)))
            .collect();
        if unseeded.is_empty() {
            return Ok(0);
        }
        let fresh = format!("{:032x}", rand::random::<u128>());
        let group = self.group();
        let seeds = futures::future::join_all(unseeded.iter().map(|&(i, first)| {
            let tp = &event.partitions[i].tp;
            let (committed, metadata) = &progress[i];
            let persisted = clock.partitions.get(tp).map_or(i64::MIN, |t| t.stream_time);
            let time = match metadata.stream_time {
                StreamTime::Committed(t) => t.max(persisted),
                StreamTime::Unknown => persisted,
            };
            let offset = first.max(*committed);
            let attempt = metadata.attempt.clone().unwrap_or_else(|| fresh.clone());
            let mark = clock.at_least_once.get(tp).copied();
            let encoded = ProgressMetadata::encode(&attempt, time, mark);
            let (p, group) = (&producers[i], group.as_str());
            async move {
                p.begin().await.map_err(|e| ("begin_transaction", e))?;
                p.send_offset(group, tp, offset, &encoded)
                    .await
                    .map_err(|e| ("send_offsets_to_transaction", e))?;
                p.commit().await.map_err(|e| ("commit_transaction", e))?;
                Ok::<_, (&str, TxnError)>((
                    offset,
                    ProgressMetadata {
                        attempt: Some(attempt),
                        stream_time: StreamTime::Committed(time),
                        at_least_once: mark,
                    },
                ))
            }
        }))
        .await;
        for (seed, &(i, _)) in seeds.into_iter().zip(&unseeded) {
            match seed {
                Ok(seeded) => progress[i] = seeded,
                Err((step, e)) => {
                    let tp = &event.partitions[i].tp;
                    let fatal = e.fatal.then_some(i);
                    return Err((
                        fatal,
                        StreamError::Transaction {
                            tp: tp.clone(),
                            transactional_id: self.transactional_id(tp),
                            reason: format!(
                                "{step} (committing the partition's starting stream time): {}",
                                e.reason
                            ),
                        },
                    ));
                }
            }
        }
        Ok(unseeded.len() as u64)
    }

    /// Aborts every transaction of the invocation; keeps the producers that aborted (not
    /// `fatal`, the one that failed fatally).
    async fn give_up(
        &self,
        tps: &[TopicPartition],
        producers: &[Arc<dyn TransactionalProducer>],
        fatal: Option<usize>,
    ) {
        let mut dropped: Vec<usize> = fatal.into_iter().collect();
        for (i, p) in producers.iter().enumerate() {
            if Some(i) != fatal && p.abort().await.is_err() {
                dropped.push(i);
            }
        }
        self.keep(tps, producers, &dropped).await;
    }

    /// Puts the producers back for the next invocation, but those `dropped`.
    async fn keep(
        &self,
        tps: &[TopicPartition],
        producers: &[Arc<dyn TransactionalProducer>],
        dropped: &[usize],
    ) {
        let mut cache = self.producers.lock().await;
        for (i, p) in producers.iter().enumerate() {
            if !dropped.contains(&i) {
                cache.insert(tps[i].clone(), Arc::clone(p));
            }
        }
    }
}

/// The sink of one invocation under exactly-once output: each record into the
/// transaction of the partition of the event's record that caused it, none of a record
/// below the partition's shadow offset.
struct TransactionalSink<'a> {
    tps: &'a [TopicPartition],
    producers: &'a [Arc<dyn TransactionalProducer>],
    shadow: &'a [i64],
    produced: Vec<AtomicBool>,
    skipped: AtomicU64,
    /// The first transaction error, with its partition (the batch's error is a sink error).
    failure: std::sync::Mutex<Option<(usize, TxnError)>>,
}

impl TransactionalSink<'_> {
    /// The partition index and offset of the event's record that caused `record`, and the
    /// record without the internal header.
    fn origin(&self, mut record: OutputRecord) -> Result<(usize, i64, OutputRecord), SinkError> {
        let tagged = record
            .headers
            .iter()
            .position(|(name, _)| name == TRANSACTION_HEADER);
        let source = match tagged {
            Some(at) => SourceHeader::parse(&record.headers.remove(at).1),
            // A dead letter names the event's record in its source header.
            None if record.header(ERROR_HEADER).is_some() => {
                record.header(SOURCE_HEADER).and_then(SourceHeader::parse)
            }
            None => None,
        };
        let found = source.and_then(|s| {
            self.tps
                .iter()
                .position(|tp| *tp == s.tp)
                .map(|i| (i, s.offset))
        });
        match found {
            Some((i, offset)) => Ok((i, offset, record)),
            None => Err(SinkError {
                topic: record.topic.clone(),
                reason: "under exactly-once output, a record with no source record in the \
                         event and not from an outbox of updates (a window's close, a join's \
                         closing pass) cannot be put in a transaction; the topology should \
                         have been refused (a bug)"
                    .into(),
            }),
        }
    }
}

#[async_trait]
impl Sink for TransactionalSink<'_> {
    async fn send(&self, records: Vec<OutputRecord>) -> Result<(), SinkError> {
        let mut per_partition: Vec<Vec<OutputRecord>> =
            self.tps.iter().map(|_| Vec::new()).collect();
        for record in records {
            let (i, offset, record) = self.origin(record)?;
            if offset < self.shadow[i] {
                // Committed with the transaction of an earlier attempt.
                self.skipped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            per_partition[i].push(record);
        }
        // Each partition's records into its own transaction, the partitions concurrently.
        let sends = per_partition
            .into_iter()
            .enumerate()
            .filter(|(_, records)| !records.is_empty())
            .map(|(i, records)| async move {
                let topic = records[0].topic.clone();
                self.produced[i].store(true, Ordering::Relaxed);
                self.producers[i]
                    .send(records)
                    .await
                    .map_err(|e| (i, topic, e))
            });
        for result in futures::future::join_all(sends).await {
            if let Err((i, topic, e)) = result {
                let reason = format!(
                    "in the transaction of {} (the partition's transactional producer): {}",
                    self.tps[i], e.reason
                );
                self.failure
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .get_or_insert((i, e));
                return Err(SinkError { topic, reason });
            }
        }
        Ok(())
    }
}
