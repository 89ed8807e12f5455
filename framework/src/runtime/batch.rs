//! Batch execution: records through the stateless operators, then one write per
//! touched state item, then the table updates, then the sinks.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Mutex, PoisonError};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use futures::{StreamExt, TryStreamExt};

use super::claims::WindowClaims;
use super::options::{BatchOptions, OutputGuarantee, PoisonPolicy};
use super::poison::{dead_letter, failure, guarded, rejected_record};
use super::records::{Pass, Records};
use super::report::{BatchOutcome, BatchReport};
use crate::error::StreamError;
use crate::event::{KafkaEvent, TopicPartition};
use crate::sink::{OutputRecord, Sink};
use crate::state::WRITE_CONCURRENCY;
use crate::state::limits::RejectedRecords;
use crate::state::{
    Clock, ClockAdvance, ClosingItem, ItemState, ItemWrite, PartitionTime, StateError,
    StateErrorKind, Store, WriteStats,
};
use crate::topology::ahead::BatchAhead;
use crate::topology::context::{Ctx, Deferred, Origin, PendingItem, PendingKey};
use crate::topology::{StoreSpec, Topology};
use crate::wire::HopHeaders;

/// How many output records a batch holds before it sends them, while its records are
/// processed: a record can emit many (a `flat_map` ahead of a repartition turns one event
/// of text into hundreds of thousands), and holding them all would not fit a small
/// function's memory; the bound keeps the peak memory bounded (BENCHMARKS.md section 4
/// measures it). Once
/// this many are held, they are sent (and acknowledged) before the next record; a chunk is
/// at most this many plus one record's outputs. A batch that fails later has produced some of
/// its outputs, as a failure in the middle of a send would; its retry produces them again
/// under the same source headers and versions (outputs are at least once, state exactly once).
/// One exception: in a topology whose repartition topic is fed by records that waited at
/// different joins, a batch sends no chunk while records wait at a join (their repartition
/// records must be sorted with the ones held, see `topology::order`).
pub const OUTPUT_CHUNK: usize = 20_000;

/// Under exactly-once output, what the shadow consumer group holds for each event
/// partition (in the event's order), read after every producer's initialisation.
pub(crate) struct Shadow {
    /// The offset up to which the partition's outputs are committed (`i64::MIN`: none).
    pub(crate) offsets: Vec<i64>,
    /// The partition's stream time as of that offset, committed with it.
    pub(crate) stream_times: Vec<StreamTime>,
    /// The store's clock, read once after the progress for a windowed topology (its
    /// starting stream times are seeded from it): the batch uses it instead of reading it
    /// again.
    pub(crate) clock: Option<Clock>,
}

/// A partition's stream time as the shadow group's commit holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StreamTime {
    /// Committed with the progress (`i64::MIN`: nothing committed, no time yet).
    Committed(i64),
    /// A progress committed without it (by an earlier version): the store's persisted
    /// stream time stands in, as under at-least-once output.
    Unknown,
}

/// How many times a join's closing pass reads an item again after another writer changed
/// it between its read and its write.
pub(super) const CLOSE_ATTEMPTS: u32 = 4;

impl Topology {
    /// Processes one event with the default options (poison records fail the batch).
    /// See [`process_with`](Self::process_with).
    pub async fn process(
        &self,
        event: &KafkaEvent,
        store: &dyn Store,
        sink: &dyn Sink,
    ) -> Result<BatchReport, StreamError> {
        self.process_with(event, store, sink, &BatchOptions::default())
            .await
            .map(|outcome| outcome.report)
    }

    /// Processes one event: every record through the topology, then each touched state
    /// item written once (exactly-once per the store), then the resulting table updates
    /// through their downstream operators, then all output records produced and
    /// acknowledged (while the records are processed, in chunks of [`OUTPUT_CHUNK`]). A poison record is handled by `options`; any other error fails the
    /// whole batch, which the event source delivers again (the watermarks make the
    /// retry exact). A panic in user code is a poison record, not a crash.
    pub async fn process_with(
        &self,
        event: &KafkaEvent,
        store: &dyn Store,
        sink: &dyn Sink,
        options: &BatchOptions,
    ) -> Result<BatchOutcome, StreamError> {
        self.process_transactional(event, store, sink, options, None)
            .await
            .map(|(outcome, _)| outcome)
    }

    /// [`process_with`](Self::process_with); under exactly-once output with `eos`: per
    /// event partition, the offset up to which its outputs are committed (`i64::MIN`:
    /// none) and the partition's stream time as of that offset (`Shadow`), and the
    /// attempt's [`WindowClaims`]. The stores whose updates reach a sink keep the outbox of
    /// updates (`state::outbox`) and emit from it, each update in the transaction of the
    /// record it is kept under; emit-on-close windows are claimed before they are emitted
    /// (see [`close_windows`](Self::close_windows)); the closing passes claim their rewrites
    /// (`runtime::claims`). Returns, besides the outcome, every
    /// event partition's stream time after the batch (what the transaction commits with the
    /// partition's progress).
    pub(crate) async fn process_transactional(
        &self,
        event: &KafkaEvent,
        store: &dyn Store,
        sink: &dyn Sink,
        options: &BatchOptions,
        eos: Option<(&Shadow, &WindowClaims<'_>)>,
    ) -> Result<(BatchOutcome, Vec<i64>), StreamError> {
        let shadow = eos.map(|(shadow, _)| shadow);
        let claims = eos.map(|(_, claims)| claims);
        let started = Instant::now();
        let partitions = event.partitions.iter().map(|p| p.tp.clone()).collect();
        let mut ctx = Ctx::new(partitions, self.inner.stores.len());
        ctx.keeps_time = self.inner.stores.iter().map(|s| s.keeps_time).collect();
        ctx.ranges = event
            .partitions
            .iter()
            .map(|p| {
                let first = p.records.first().map_or(0, |r| r.offset);
                (first, p.records.last().map_or(-1, |r| r.offset))
            })
            .collect();
        let clock = match shadow.and_then(|s| s.clock.clone()) {
            Some(clock) => clock,
            None if self.inner.windowed => store.clock().await?,
            None => Clock::default(),
        };
        let initial_times: Vec<Option<i64>> = ctx
            .partitions
            .iter()
            .map(|tp| clock.partitions.get(tp).map(|t| t.stream_time))
            .collect();
        ctx.stream_times = initial_times
            .iter()
            .enumerate()
            .map(|(i, t)| match shadow.map(|s| s.stream_times[i]) {
                // Under exactly-once output, lateness is decided on the stream time as of
                // the committed progress, not on the persisted one: an attempt whose
                // transaction aborted (a fenced zombie, a crash before the commit) has
                // moved the persisted time past records whose updates its retry must
                // produce again; judged late, they would be lost.
                Some(StreamTime::Committed(committed)) => committed,
                Some(StreamTime::Unknown) | None => t.unwrap_or(i64::MIN),
            })
            .collect();
        for (index, spec) in self.inner.stores.iter().enumerate() {
            if let Some(closed) = clock.closed.get(&spec.name) {
                ctx.closed[index] = *closed;
            }
            if let Some(closing) = &spec.closing {
                // The join's closing time as the batch starts: its records close on it as
                // they arrive (the closing pass after the writes closes the others). It
                // never moves back (a partition seen for the first time, or back from
                // idle, may be behind): what closed stays closed.
                let low = self.low_watermark(&clock, &[], unix_millis(), options, &closing.topics);
                ctx.closing_times[index] = low.unwrap_or(i64::MIN).max(ctx.closed[index]);
            }
        }
        let mut outcome = BatchOutcome::default();
        let mut dead_letters = Vec::new();
        let exactly_once = options.output == OutputGuarantee::ExactlyOnce;
        // A large batch's records deserialized ahead, on the cores available, a window at a
        // time, the next one while the topology takes from this one.
        let readers =
            self.inner.sources.iter().map(|(topic, sources)| {
                (topic, sources.iter().map(|s| s.ahead.as_ref()).collect())
            });
        let threads = options.read_ahead_threads();
        let mut ahead = BatchAhead::new(event, threads, options.overlap_reading, readers);
        let mut records = Records {
            event,
            options,
            next: (0, 0),
        };
        loop {
            // The threads reading ahead live in a scope that ends before anything is
            // awaited: the next window's reading finished and kept for the records after
            // the chunk of outputs sent, or given up at the batch's end.
            let pass = std::thread::scope(|scope| {
                let pass = self.run_records(
                    &mut records,
                    scope,
                    &mut ahead,
                    &mut ctx,
                    &mut outcome,
                    &mut dead_letters,
                );
                match pass {
                    Ok(Pass::Send(_)) => ahead.pause(),
                    Ok(Pass::Done) | Err(_) => ahead.abandon(),
                }
                pass
            })?;
            match pass {
                Pass::Send(chunk) => {
                    outcome.report.records_out += chunk.len() as u64;
                    sink.send(chunk).await?;
                }
                Pass::Done => break,
            }
        }
        if let Some(shadow) = shadow.map(|s| s.offsets.as_slice()) {
            // The outputs this batch commits per partition: up to a partial batch
            // response's failed record, exclusive (its retry emits from there).
            let mut ranges = ctx.ranges.clone();
            for (tp, offset) in &outcome.failures {
                if let Some(i) = ctx.partitions.iter().position(|p| p == tp) {
                    ranges[i].1 = ranges[i].1.min(offset - 1);
                }
            }
            ctx.transactions = Some((shadow.to_vec(), ranges));
        }
        // Each store once, in the order the build derived (every store after the stores
        // whose updates or joins feed it); before each write, the records waiting at joins
        // of the stores written so far go on (again and again: a record that passes one
        // join may wait at the next), so they reach the store before its write.
        let mut written = vec![false; self.inner.stores.len()];
        let poisoned = Mutex::new(HashSet::new());
        for &index in &self.inner.write_order {
            self.resume_joins(
                &mut ctx,
                &written,
                event,
                store,
                options,
                &mut outcome,
                &mut dead_letters,
            )
            .await?;
            let writing = Writing {
                event,
                store,
                sink,
                options,
                poisoned: &poisoned,
            };
            self.write_and_emit(index, &mut ctx, &writing, &mut outcome.report)
                .await?;
            written[index] = true;
        }
        // The records waiting at joins after the last write (its updates included).
        self.resume_joins(
            &mut ctx,
            &written,
            event,
            store,
            options,
            &mut outcome,
            &mut dead_letters,
        )
        .await?;
        // Never silent: what the order did not foresee fails the batch (a bug: `build()`
        // refuses every shape that would get here).
        if let Some(index) = (0..ctx.pending.len()).find(|i| !ctx.pending[*i].is_empty()) {
            return Err(StreamError::Config(format!(
                "store {:?} was given contributions after its write in this batch: the \
                 topology's write order missed a feeder",
                self.inner.stores[index].name
            )));
        }
        if let Some(index) = ctx.unattributed {
            return Err(StreamError::Config(format!(
                "store {:?} was given a table's update, which has no source record to \
                 apply it exactly once",
                self.inner.stores[index].name
            )));
        }
        outcome.report.dropped_null_keys = ctx.dropped_null_keys;
        outcome.report.dropped_null_values = ctx.dropped_null_values;
        outcome.report.dead_lettered += dead_letters.len() as u64;
        let mut outputs = std::mem::take(&mut ctx.outputs);
        if self.inner.sort_hops {
            let hops = self.repartition_topics();
            sort_hop_records(&mut outputs, &hops);
        }
        outputs.extend(dead_letters);
        outcome.report.records_out += outputs.len() as u64;
        if !outputs.is_empty() {
            sink.send(outputs).await?;
        }
        if self.inner.windowed {
            // Last, once everything else succeeded: a retry of a failed batch decides
            // lateness against the same stream time as the first attempt.
            let now_ms = unix_millis();
            let advanced: Vec<_> = ctx
                .partitions
                .iter()
                .zip(&ctx.stream_times)
                .zip(&initial_times)
                .filter(|((_, now), before)| before.is_none_or(|b| **now > b) && **now > i64::MIN)
                .map(|((tp, now), _)| (tp.clone(), *now))
                .collect();
            // At least once, also how far the batch read each partition: exactly-once
            // output seeds the stream time again from the persisted one when at-least-once
            // batches read past its committed progress (`Clock::at_least_once`).
            let advances: Vec<ClockAdvance> = event
                .partitions
                .iter()
                .filter_map(|batch| {
                    let stream_time = advanced
                        .iter()
                        .find(|(tp, _)| *tp == batch.tp)
                        .map(|(_, t)| *t);
                    let processed = (!exactly_once)
                        .then(
                            || match outcome.failures.iter().find(|(tp, _)| *tp == batch.tp) {
                                Some((_, failed)) => Some(*failed),
                                None => batch.records.last().map(|r| r.offset + 1),
                            },
                        )
                        .flatten();
                    (stream_time.is_some() || processed.is_some()).then(|| ClockAdvance {
                        tp: batch.tp.clone(),
                        stream_time,
                        processed,
                    })
                })
                .collect();
            if !advances.is_empty() {
                store.advance_stream_times(&advances, now_ms).await?;
            }
            let closes = |s: &StoreSpec| {
                s.emit_on_close.is_some() || s.closing.as_ref().is_some_and(|c| c.close.is_some())
            };
            if self.inner.stores.iter().any(closes) {
                // Read the clock again, after this batch's own advance: of two batches
                // of different partitions running at once, at least the later reader
                // sees both advances, so the windows they close together do close.
                let clock = store.clock().await?;
                if self.inner.stores.iter().any(|s| s.emit_on_close.is_some()) {
                    let all = self.inner.sources.keys().cloned().collect();
                    // Each store closes on the low watermark of the topics feeding it (a
                    // repartitioned aggregation's: its repartition topic).
                    let lows = self.inner.stores.iter().map(|spec| {
                        let topics = spec.closing.as_ref().map_or(&all, |c| &c.topics);
                        self.low_watermark(&clock, &advanced, now_ms, options, topics)
                    });
                    let lows: Vec<Option<i64>> = lows.collect();
                    match claims {
                        Some(claims) => {
                            self.claim_and_close_windows(
                                &lows,
                                &mut ctx,
                                store,
                                sink,
                                claims,
                                &mut outcome.report,
                            )
                            .await?
                        }
                        None => {
                            self.close_windows(&lows, &mut ctx, store, sink, &mut outcome.report)
                                .await?
                        }
                    }
                }
                for (index, spec) in self.inner.stores.iter().enumerate() {
                    let Some(closing) = spec.closing.as_ref().filter(|c| c.close.is_some()) else {
                        continue;
                    };
                    if let Some(claims) = claims {
                        // Under exactly-once output, each partition's claims of earlier
                        // closing passes first (whatever the closing time).
                        self.resolve_claims(
                            spec,
                            &mut ctx,
                            store,
                            sink,
                            claims,
                            &mut outcome.report,
                        )
                        .await?;
                    }
                    let low =
                        self.low_watermark(&clock, &advanced, now_ms, options, &closing.topics);
                    // Never back (see the batch start), and the same for every closer.
                    let persisted = clock.closed.get(&spec.name).copied().unwrap_or(i64::MIN);
                    let Some(low) = low.map(|l| l.max(persisted)) else {
                        continue;
                    };
                    match claims {
                        Some(claims) => {
                            self.claim_and_close_items(
                                index,
                                low,
                                &options.poison,
                                &mut ctx,
                                store,
                                sink,
                                claims,
                                &mut outcome.report,
                            )
                            .await?
                        }
                        None => {
                            self.close_join(
                                index,
                                low,
                                &options.poison,
                                &mut ctx,
                                store,
                                sink,
                                &mut outcome.report,
                            )
                            .await?
                        }
                    }
                    if low > persisted {
                        let stats = store.mark_closed(&spec.name, &[], low).await?;
                        outcome.report.state.add(&stats);
                    }
                }
            }
        }
        outcome.report.late_records = ctx.late_records;
        outcome.report.duration = started.elapsed();
        Ok((outcome, ctx.stream_times))
    }

    /// Writes store `index`'s pending items and sends their updates downstream (unless
    /// the store emits on window close).
    async fn write_and_emit(
        &self,
        index: usize,
        ctx: &mut Ctx,
        writing: &Writing<'_>,
        report: &mut BatchReport,
    ) -> Result<(), StreamError> {
        let pending = std::mem::take(&mut ctx.pending[index]);
        if pending.is_empty() {
            return Ok(());
        }
        report.items_touched += pending.len() as u64;
        let updates = self
            .write_store(index, pending, ctx, writing, report)
            .await?;
        let spec = &self.inner.stores[index];
        if spec.emit_on_close.is_some() {
            // Emitted once, when the window closes.
            return Ok(());
        }
        if let Some(written) = ctx.written.get_mut(index) {
            written.extend(
                updates
                    .iter()
                    .filter(|((_, window), _, _, _)| window.is_none())
                    .map(|((key, _), _, _, _)| key.clone()),
            );
        }
        for ((key, window), timestamp, state, emissions) in updates {
            if let Some(emissions) = emissions {
                // Exactly-once output: the updates of the item's outbox this batch commits,
                // each in the transaction of the record it is kept under.
                for emission in emissions {
                    ctx.origin = Origin::Update {
                        version: emission.entry.state.version,
                        timestamp: emission.entry.time,
                    };
                    let mark = ctx.outputs.len();
                    // A table–table join's decision needs the entry and the item's state.
                    if self.inner.decision_inputs.contains(&index) {
                        ctx.update_entry = Some((emission.tp, emission.entry.offset));
                        ctx.update_state = Some(emission.entry.state.clone());
                    }
                    // What waits at a stream–table join goes on later, in the same
                    // transaction.
                    ctx.outbox_entry = Some((emission.tp, emission.entry.offset));
                    let emitted =
                        guarded(|| (spec.on_update)(ctx, &key, window, &emission.entry.state));
                    ctx.update_entry = None;
                    ctx.update_state = None;
                    ctx.outbox_entry = None;
                    emitted?;
                    let tp = ctx.partitions[emission.tp as usize].clone();
                    tag_transaction(&mut ctx.outputs[mark..], &tp, emission.entry.offset);
                }
                continue;
            }
            // A time window's, a count's or an aggregate's update carries its newest
            // record time (Kafka Streams' window and aggregate timestamp: an older record
            // does not move it back; the item holds it after the write); other items the
            // newest of the batch's records.
            ctx.origin = Origin::Update {
                version: state.version,
                timestamp: state.timestamp.unwrap_or(timestamp),
            };
            guarded(|| (spec.on_update)(ctx, &key, window, &state))?;
        }
        Ok(())
    }

    /// Takes on the records waiting at joins of the stores `written` so far in this batch
    /// (the others wait for their store's write): reads the joined tables' values of their
    /// keys (one batched, strongly consistent read per 100 distinct keys), then runs each
    /// record's continuation. A continuation that fails is a poison record, handled by
    /// the policy (with `Fail`, the whole batch fails, partial batch responses or not).
    #[allow(clippy::too_many_arguments)]
    async fn resume_joins(
        &self,
        ctx: &mut Ctx,
        written: &[bool],
        event: &KafkaEvent,
        store: &dyn Store,
        options: &BatchOptions,
        outcome: &mut BatchOutcome,
        dead_letters: &mut Vec<OutputRecord>,
    ) -> Result<(), StreamError> {
        // The records waiting at stores written already go on; a record that goes on may
        // wait again at another join: repeat until none waits at a written store.
        loop {
            let (ready, waiting): (Vec<Deferred>, Vec<Deferred>) =
                std::mem::take(&mut ctx.deferred)
                    .into_iter()
                    .partition(|d| written.get(d.store).copied().unwrap_or(false));
            ctx.deferred = waiting;
            if ready.is_empty() {
                return Ok(());
            }
            let resumed = self
                .resume_ready(ready, ctx, event, store, options, outcome, dead_letters)
                .await;
            ctx.resumed_stream_time = None;
            resumed?;
        }
    }

    /// Reads the joined tables' values of the keys `deferred` wait for, and takes each of
    /// those records on (see [`resume_joins`](Self::resume_joins)).
    #[allow(clippy::too_many_arguments)]
    async fn resume_ready(
        &self,
        deferred: Vec<Deferred>,
        ctx: &mut Ctx,
        event: &KafkaEvent,
        store: &dyn Store,
        options: &BatchOptions,
        outcome: &mut BatchOutcome,
        dead_letters: &mut Vec<OutputRecord>,
    ) -> Result<(), StreamError> {
        let mut keys: BTreeMap<usize, BTreeSet<&[u8]>> = BTreeMap::new();
        for d in &deferred {
            let Some(key) = &d.key else { continue };
            keys.entry(d.store).or_default().insert(key);
        }
        let mut values = HashMap::new();
        for (index, keys) in keys {
            let keys: Vec<Vec<u8>> = keys.into_iter().map(<[u8]>::to_vec).collect();
            outcome.report.join_lookups += keys.len() as u64;
            let found = store
                .get_many(&self.inner.stores[index].name, &keys)
                .await?;
            values.insert(index, found);
        }
        for d in deferred {
            ctx.origin = d.origin;
            ctx.source = d.source;
            ctx.resumed_stream_time = Some(d.stream_time);
            let state = d
                .key
                .as_ref()
                .and_then(|key| values.get(&d.store).and_then(|found| found.get(key)));
            let Origin::Record { tp, offset, .. } = d.origin else {
                // A table update at a join: no record to blame, an error fails the batch.
                // Under exactly-once output its outputs go in the transaction of its
                // outbox entry's record, as those it made before waiting.
                let mark = ctx.outputs.len();
                ctx.outbox_entry = d.entry;
                let resumed = guarded(|| (d.resume)(ctx, state));
                ctx.outbox_entry = None;
                resumed?;
                if let Some((tp, offset)) = d.entry {
                    let tp = ctx.partitions[tp as usize].clone();
                    tag_transaction(&mut ctx.outputs[mark..], &tp, offset);
                }
                continue;
            };
            let batch = &event.partitions[tp as usize];
            let mark = ctx.outputs.len();
            let result = catch_unwind(AssertUnwindSafe(|| (d.resume)(ctx, state)));
            let Some(error) = failure(result, &batch.tp, offset)? else {
                if options.output == OutputGuarantee::ExactlyOnce {
                    tag_transaction(&mut ctx.outputs[mark..], &batch.tp, offset);
                }
                continue;
            };
            ctx.outputs.truncate(mark);
            let (source, source_offset) = d.source.unwrap_or((tp, offset));
            ctx.forget(source, source_offset);
            outcome.report.records_in = outcome.report.records_in.saturating_sub(1);
            outcome.report.poison_records += 1;
            tracing::warn!(error = %error, policy = ?options.poison, "poison record at a join");
            match &options.poison {
                PoisonPolicy::Skip => {}
                PoisonPolicy::DeadLetter { topic } => {
                    if let Ok(i) = batch.records.binary_search_by_key(&offset, |r| r.offset) {
                        dead_letters.push(dead_letter(topic, &batch.tp, &batch.records[i], &error));
                    }
                }
                PoisonPolicy::Fail => return Err(error),
            }
        }
        Ok(())
    }

    /// The low watermark of the source partitions of `topics` (of those the topology
    /// reads) after this batch: the lowest stream time over the partitions whose stream
    /// time advanced within the idle timeout (`None`: no such partition).
    fn low_watermark(
        &self,
        clock: &Clock,
        advanced: &[(TopicPartition, i64)],
        now_ms: i64,
        options: &BatchOptions,
        topics: &BTreeSet<String>,
    ) -> Option<i64> {
        let idle_ms = i64::try_from(options.idle_partition_timeout.as_millis()).unwrap_or(i64::MAX);
        let counts =
            |topic: &String| self.inner.sources.contains_key(topic) && topics.contains(topic);
        let mut times: HashMap<&TopicPartition, PartitionTime> = clock
            .partitions
            .iter()
            .filter(|(tp, _)| counts(&tp.topic))
            .map(|(tp, t)| (tp, *t))
            .collect();
        let declared: Vec<TopicPartition> = options
            .source_partitions
            .iter()
            .filter(|(topic, _)| counts(topic))
            .flat_map(|(topic, n)| (0..*n).map(|p| TopicPartition::new(topic.as_str(), p)))
            .collect();
        let unseen = PartitionTime {
            stream_time: i64::MIN,
            advanced_at: clock.started_at.unwrap_or(now_ms),
        };
        for tp in &declared {
            times.entry(tp).or_insert(unseen);
        }
        for (tp, time) in advanced.iter().filter(|(tp, _)| counts(&tp.topic)) {
            // The clock may hold a later time already (a concurrent batch of the partition).
            let mine = PartitionTime {
                stream_time: *time,
                advanced_at: now_ms,
            };
            let entry = times.entry(tp).or_insert(mine);
            if entry.stream_time <= *time {
                *entry = mine;
            }
        }
        times
            .values()
            .filter(|t| now_ms.saturating_sub(t.advanced_at) <= idle_ms)
            .map(|t| t.stream_time)
            .min()
            .filter(|low| *low > i64::MIN)
    }

    /// Emits the windows of emit-on-close stores that close at or before their low
    /// watermark (`lows`, by store), once each: their final values through the store's
    /// downstream operators, produced and acknowledged, then the windows marked closed (a
    /// crash in between emits them again, with the same versions).
    async fn close_windows(
        &self,
        lows: &[Option<i64>],
        ctx: &mut Ctx,
        store: &dyn Store,
        sink: &dyn Sink,
        report: &mut BatchReport,
    ) -> Result<(), StreamError> {
        for (spec, low) in self.inner.stores.iter().zip(lows) {
            let (Some(size), Some(low)) = (spec.emit_on_close, *low) else {
                continue;
            };
            let windows = store.closed_windows(&spec.name, low).await?;
            forward_closed(spec, size, &windows, ctx)?;
            let outputs = std::mem::take(&mut ctx.outputs);
            report.records_out += outputs.len() as u64;
            if !outputs.is_empty() {
                sink.send(outputs).await?;
            }
            let stats = store.mark_closed(&spec.name, &windows, low).await?;
            report.state.add(&stats);
            report.windows_closed += windows.len() as u64;
        }
        Ok(())
    }

    /// The closing pass of the left or outer join of store `index` at its closing time
    /// `low`: reads the items whose earliest unmatched record closes by then (the closing
    /// index), emits the records that leave alone through the join's downstream operators,
    /// produced and acknowledged, then writes each item without its closed records and
    /// with its next closing time, on the condition that its version is the one read. Of
    /// two closers (or a closer and an arrival) of one item, one writes; the other's
    /// emission is a copy with the same content (outputs are at least once). A crash between
    /// the emission and the write emits the same records again on the next pass. A record
    /// the pass cannot emit (its joiner, a serde or an operator after it fails or panics
    /// on it) is a poison record, named by its topic-partition and offset: with `Fail` the
    /// batch fails; with `Skip` or `DeadLetter` it leaves the item without an output (its
    /// dead letter holds the join's key and its stored value), and the pass goes on.
    #[allow(clippy::too_many_arguments)]
    async fn close_join(
        &self,
        index: usize,
        low: i64,
        poison_policy: &PoisonPolicy,
        ctx: &mut Ctx,
        store: &dyn Store,
        sink: &dyn Sink,
        report: &mut BatchReport,
    ) -> Result<(), StreamError> {
        let spec = &self.inner.stores[index];
        let Some(close) = spec.closing.as_ref().and_then(|c| c.close.as_ref()) else {
            return Ok(());
        };
        let items = store.closing_items(&spec.name, low).await?;
        if items.is_empty() {
            return Ok(());
        }
        // Per item: the records emitted alone so far (a retry after a conflict emits only
        // the others).
        let mut emitted: HashMap<Vec<u8>, HashSet<Vec<u8>>> = HashMap::new();
        let mut pending = items;
        for attempt in 0..CLOSE_ATTEMPTS {
            let read = self.closing_reads(spec, &pending, store, report).await?;
            let mut rewrites = Vec::with_capacity(pending.len());
            for item in pending {
                ctx.origin = Origin::Update {
                    version: item.state.version + 1,
                    timestamp: 0,
                };
                let mut closed = None;
                let done = emitted.entry(item.key.clone()).or_default();
                guarded(|| {
                    let table = read.get(&item.key);
                    closed = close(ctx, &item.key, &item.state, table, low, done)?;
                    Ok(())
                })?;
                if let Some((aggregate, next)) = closed {
                    rewrites.push((item, aggregate, next));
                }
            }
            let mut outputs = std::mem::take(&mut ctx.outputs);
            report.records_out += outputs.len() as u64;
            for poison in std::mem::take(&mut ctx.closing_poison) {
                match poison_policy {
                    PoisonPolicy::Fail => return Err(poison.error),
                    PoisonPolicy::Skip => {}
                    PoisonPolicy::DeadLetter { topic } => {
                        outputs.push(closing_dead_letter(topic, poison));
                        report.dead_lettered += 1;
                        report.records_out += 1;
                    }
                }
                report.poison_records += 1;
            }
            if !outputs.is_empty() {
                sink.send(outputs).await?;
            }
            let name = spec.name.as_str();
            let results: Vec<(ClosingItem, Option<ItemState>, WriteStats)> =
                futures::stream::iter(rewrites)
                    .map(|(item, aggregate, next)| async move {
                        let (written, stats) =
                            store.close_item(name, &item, &aggregate, next).await?;
                        Ok::<_, StateError>((item, written, stats))
                    })
                    .buffer_unordered(WRITE_CONCURRENCY)
                    .try_collect()
                    .await?;
            let mut conflicts = Vec::new();
            for (item, written, stats) in results {
                report.state.add(&stats);
                if written.is_none() {
                    conflicts.push(item.key);
                }
            }
            if conflicts.is_empty() {
                return Ok(());
            }
            // Another writer changed the item since it was read (an arrival of its key, or
            // a concurrent closer): read it again and close what is still there.
            pending = Vec::new();
            if attempt + 1 < CLOSE_ATTEMPTS {
                let found = store.get_many(name, &conflicts).await?;
                for key in conflicts {
                    if let Some(state) = found.get(&key) {
                        pending.push(ClosingItem {
                            key,
                            state: state.clone(),
                        });
                    }
                }
            }
        }
        // Still changing: the items stay in the closing index for the next pass.
        Ok(())
    }

    /// The store a closing pass's close function reads (a stream–table join's table), as it
    /// is after this batch's writes, for each of `items`' keys (empty: it reads none).
    pub(super) async fn closing_reads(
        &self,
        spec: &StoreSpec,
        items: &[ClosingItem],
        store: &dyn Store,
        report: &mut BatchReport,
    ) -> Result<HashMap<Vec<u8>, ItemState>, StreamError> {
        let Some(table) = spec.closing.as_ref().and_then(|c| c.reads) else {
            return Ok(HashMap::new());
        };
        let keys: Vec<Vec<u8>> = items.iter().map(|i| i.key.clone()).collect();
        report.join_lookups += keys.len() as u64;
        Ok(store
            .get_many(&self.inner.stores[table].name, &keys)
            .await?)
    }

    /// Writes one store's touched items, concurrently, and returns their new states
    /// sorted by key (so that emission order does not depend on response order).
    ///
    /// A store that rejects records of an item ([`StateErrorKind::Rejected`]: a key over
    /// DynamoDB's limits, an item that would pass 400 KB, a user fold function that fails
    /// or panics at write time) has written nothing of it: each rejected record is a poison
    /// record, handled by the policy (with `Fail`, the whole batch fails, partial batch
    /// responses or not, with the error naming the record), and the item is written again
    /// without its effect, its watermark past it (so a redelivery of the record, whatever
    /// the item holds by then, does not decide again; an item left with nothing but
    /// rejected records is not written). A dead-lettered record is produced and
    /// acknowledged before that write: once the item is written, the record is decided,
    /// and a retry of a batch that fails later would not meet it again (a crash between
    /// the two decides again on the retry: dead letters are at least once). The record is dropped from
    /// the item that rejected it only: what it did elsewhere (other items, other stores,
    /// its other outputs) stays, as when a Kafka Streams processor fails on a record after
    /// the processors before it forwarded it.
    async fn write_store(
        &self,
        index: usize,
        pending: std::collections::HashMap<PendingKey, PendingItem>,
        ctx: &Ctx,
        writing: &Writing<'_>,
        report: &mut BatchReport,
    ) -> Result<Vec<Written>, StreamError> {
        let name = self.inner.stores[index].name.as_str();
        let partitions = ctx.sources.as_slice();
        // Under exactly-once output: the stores whose updates reach a sink keep the outbox
        // of updates; with dead letters, every store keeps its write-time dead letters there.
        let outboxed = self.inner.outboxed.contains(&index);
        let dead_letters = matches!(writing.options.poison, PoisonPolicy::DeadLetter { .. });
        let transactions = ctx
            .transactions
            .as_ref()
            .filter(|_| outboxed || dead_letters);
        let mut results: Vec<_> = futures::stream::iter(pending)
            .map(|((key, window), mut item)| async move {
                let mut stats = WriteStats::default();
                let mut rejections = Rejections::default();
                // The item's records rejected so far (partition index, offset).
                let mut rejected: HashSet<(u32, i64)> = HashSet::new();
                // Under the outbox: the records to dead-letter with why, kept by the write
                // and produced from what it returns; their letters, for an item left empty.
                let mut kept_letters: Vec<(u32, i64, String)> = Vec::new();
                let mut held_letters: Vec<OutputRecord> = Vec::new();
                loop {
                    let fold = item.fold.as_deref().map(|f| f as &dyn crate::state::Fold);
                    let write = ItemWrite {
                        store: name,
                        key: &key,
                        contributions: &item.contributions,
                        partitions,
                        window,
                        expires_at: item.expires_at,
                        // A time window keeps its newest record time (Kafka Streams'
                        // window timestamp), which its updates carry: of the records it
                        // holds, not of those rejected at write time.
                        timestamp: item
                            .times
                            .iter()
                            .filter(|(tp, offset, _)| !rejected.contains(&(*tp, *offset)))
                            .map(|t| t.2)
                            .max(),
                        close_at: item.close_at,
                        fold,
                    };
                    let applied =
                        match transactions {
                            Some((shadow, ranges)) => {
                                let outbox = crate::state::outbox::Outbox {
                                    partitions: &ctx.partitions,
                                    shadow,
                                    ranges,
                                    hopped: &ctx.hopped,
                                    time: item.max_timestamp,
                                    updates: outboxed,
                                    rejected: &kept_letters,
                                };
                                writing.store.apply_outboxed(write, &outbox).await.map(
                                    |(state, emissions, stats)| (state, Some(emissions), stats),
                                )
                            }
                            None => writing
                                .store
                                .apply(write)
                                .await
                                .map(|(state, stats)| (state, None, stats)),
                        };
                    let (records, printable) = match applied {
                        Ok((state, emissions, item_stats)) => {
                            stats.add(&item_stats);
                            let (letters, updates): (Vec<_>, Vec<_>) = emissions
                                .unwrap_or_default()
                                .into_iter()
                                .partition(|e| e.entry.dead_letter.is_some());
                            if let PoisonPolicy::DeadLetter { topic } = &writing.options.poison {
                                let letters: Vec<OutputRecord> = letters
                                    .iter()
                                    .filter_map(|e| kept_dead_letter(writing.event, topic, e))
                                    .collect();
                                if !letters.is_empty() {
                                    rejections.dead_lettered += letters.len() as u64;
                                    writing.sink.send(letters).await?;
                                }
                            }
                            let updates = outboxed
                                .then_some(updates)
                                .filter(|_| transactions.is_some());
                            let written = ((key, window), item.max_timestamp, state, updates);
                            return Ok((Some(written), stats, rejections));
                        }
                        Err(StateError {
                            kind: StateErrorKind::Rejected(RejectedRecords(records)),
                            key: printable,
                            ..
                        }) => (records, printable),
                        Err(other) => return Err(StreamError::from(other)),
                    };
                    let mut letters = Vec::new();
                    for (source, offset, why) in records {
                        // The record stays in the write without its effect (its values
                        // forgotten, its delta 0), so that the item's watermark covers it:
                        // the decision is made once per item, and a redelivery does not
                        // decide again on another stored state.
                        let live = item
                            .contributions
                            .iter_mut()
                            .filter(|c| c.tp == source && c.offset == offset)
                            .fold(false, |_, c| {
                                c.delta = 0;
                                true
                            });
                        if !live || !rejected.insert((source, offset)) {
                            return Err(StreamError::Config(format!(
                                "state store {name:?}, key {printable}: the store rejected a \
                                 record the write does not hold, or rejected it again"
                            )));
                        }
                        if let Some(fold) = &mut item.fold {
                            fold.forget(source, offset);
                        }
                        let reason = format!("state store {name:?}, key {printable}: {why}");
                        let poison =
                            rejected_record(ctx, writing.event, source, offset, reason.clone());
                        if writing.options.poison == PoisonPolicy::Fail {
                            return Err(poison.error);
                        }
                        tracing::warn!(
                            error = %poison.error,
                            policy = ?writing.options.poison,
                            "poison record at a state write"
                        );
                        // A record rejected by several items is one poison record.
                        let first = poison.record.is_none_or(|at| {
                            writing
                                .poisoned
                                .lock()
                                .unwrap_or_else(PoisonError::into_inner)
                                .insert(at)
                        });
                        if !first {
                            continue;
                        }
                        rejections.poison_records += 1;
                        if let PoisonPolicy::DeadLetter { topic } = &writing.options.poison
                            && let Some(letter) = poison.letter(topic)
                        {
                            if transactions.is_some() {
                                kept_letters.push((source, offset, reason));
                                held_letters.push(letter);
                            } else {
                                letters.push(letter);
                            }
                        }
                    }
                    if item
                        .contributions
                        .iter()
                        .all(|c| rejected.contains(&(c.tp, c.offset)))
                    {
                        // Nothing of the item is left to write: it is not created (a retry
                        // decides again, so its dead letters need no outbox).
                        letters.append(&mut held_letters);
                    }
                    if !letters.is_empty() {
                        rejections.dead_lettered += letters.len() as u64;
                        writing.sink.send(letters).await?;
                    }
                    if item
                        .contributions
                        .iter()
                        .all(|c| rejected.contains(&(c.tp, c.offset)))
                    {
                        return Ok((None, stats, rejections));
                    }
                }
            })
            .buffer_unordered(WRITE_CONCURRENCY)
            .try_collect::<Vec<_>>()
            .await?
            .into_iter()
            .filter_map(|(written, item_stats, rejections)| {
                report.state.add(&item_stats);
                report.poison_records += rejections.poison_records;
                report.records_in = report.records_in.saturating_sub(rejections.poison_records);
                report.dead_lettered += rejections.dead_lettered;
                report.records_out += rejections.dead_lettered;
                written
            })
            .collect();
        results.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(results)
    }
}

/// An item a batch wrote: its key, the batch's newest record time for it, its state, and
/// under exactly-once output the updates of its outbox to emit.
type Written = (
    PendingKey,
    i64,
    ItemState,
    Option<Vec<crate::state::outbox::Emission>>,
);

/// The poison records one item's write met.
#[derive(Debug, Default)]
struct Rejections {
    /// Records rejected (each counted once per batch).
    poison_records: u64,
    /// Of those, the ones produced to the dead-letter topic.
    dead_lettered: u64,
}

/// What the state writes of a batch need besides the topology and the context.
struct Writing<'a> {
    event: &'a KafkaEvent,
    store: &'a dyn Store,
    sink: &'a dyn Sink,
    options: &'a BatchOptions,
    /// The batch records (partition index, offset) a store rejected so far, over every
    /// store of the batch: a record is one poison record however many items reject it.
    poisoned: &'a Mutex<HashSet<(u32, i64)>>,
}

/// Puts the records of the repartition topics `hops` among `outputs` back in source order:
/// by their channel (source partition and the hops crossed before) and position (source
/// offset, then the rank at every hop), each in the slot one of them held, the other
/// outputs untouched. A repartition topic fed by records that waited at different joins
/// gets them out of that order (`topology::order`), and a hop's exactly-once rule needs it
/// (`dsl::repartition`). The sort is stable: a record's own records keep their ranks' order.
fn sort_hop_records(outputs: &mut [OutputRecord], hops: &[String]) {
    let slots: Vec<usize> = (0..outputs.len())
        .filter(|&i| hops.contains(&outputs[i].topic))
        .collect();
    let mut held: Vec<_> = slots
        .iter()
        .map(|&i| {
            let record = std::mem::replace(
                &mut outputs[i],
                OutputRecord {
                    topic: String::new(),
                    key: None,
                    value: None,
                    headers: Vec::new(),
                    timestamp: None,
                },
            );
            // Every repartition record carries its headers; one without sorts first.
            let position = HopHeaders::parse_produced(&record.headers)
                .ok()
                .map(|h| (h.source.tp, h.path, h.source.offset, h.ranks));
            (record.topic.clone(), position, record)
        })
        .collect();
    held.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
    for (&slot, (_, _, record)) in slots.iter().zip(held) {
        outputs[slot] = record;
    }
}

/// The dead letter of an outbox's dead-letter entry: the event's record it names, with the
/// error the store's rejection gave (`None` when the event does not hold the record).
fn kept_dead_letter(
    event: &KafkaEvent,
    topic: &str,
    emission: &crate::state::outbox::Emission,
) -> Option<OutputRecord> {
    let batch = event.partitions.get(emission.tp as usize)?;
    let offset = emission.entry.offset;
    let at = batch
        .records
        .binary_search_by_key(&offset, |r| r.offset)
        .ok()?;
    let error = StreamError::User {
        tp: batch.tp.clone(),
        offset,
        reason: emission.entry.dead_letter.clone()?,
    };
    Some(dead_letter(topic, &batch.tp, &batch.records[at], &error))
}

/// Marks `outputs` as caused by the event's record `tp`@`offset`: under exactly-once output
/// they go in `tp`'s transaction ([`crate::wire::TRANSACTION_HEADER`]).
/// Forwards the final results of `windows` of emit-on-close store `spec` (window size
/// `size`) through its downstream operators into `ctx`'s outputs. Kafka Streams' final
/// result carries the window's newest record time (items written before it was kept: the
/// window's last millisecond).
pub(super) fn forward_closed(
    spec: &StoreSpec,
    size: i64,
    windows: &[crate::state::ClosedWindow],
    ctx: &mut Ctx,
) -> Result<(), StreamError> {
    for window in windows {
        let last = window.start.saturating_add(size).saturating_sub(1);
        ctx.origin = Origin::Update {
            version: window.state.version,
            timestamp: window.state.timestamp.unwrap_or(last),
        };
        guarded(|| (spec.on_update)(ctx, &window.key, Some(window.start), &window.state))?;
    }
    Ok(())
}

pub(super) fn tag_transaction(outputs: &mut [OutputRecord], tp: &TopicPartition, offset: i64) {
    if outputs.is_empty() {
        return;
    }
    let value = crate::wire::SourceHeader::write(tp, offset);
    for record in outputs {
        record
            .headers
            .push((crate::wire::TRANSACTION_HEADER.to_owned(), value.clone()));
    }
}

fn unix_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The dead letter of a record a join's closing pass could not emit: the join's key and
/// the record's stored value, the error, and the record's source.
pub(super) fn closing_dead_letter(
    topic: &str,
    poison: crate::topology::context::ClosingPoison,
) -> OutputRecord {
    let headers = vec![
        (
            crate::wire::ERROR_HEADER.to_owned(),
            poison.error.to_string().into_bytes(),
        ),
        (
            crate::sink::SOURCE_HEADER.to_owned(),
            crate::wire::SourceHeader::write(&poison.tp, poison.offset),
        ),
    ];
    OutputRecord {
        topic: topic.to_owned(),
        key: Some(poison.key),
        value: poison.value,
        headers,
        timestamp: Some(poison.timestamp),
    }
}
