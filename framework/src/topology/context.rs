//! The per-batch processing context that records flow through.

use std::collections::HashMap;

use crate::error::StreamError;
use crate::event::TopicPartition;
use crate::serdes::SerdeError;
use crate::sink::OutputRecord;
use crate::state::{Contribution, Fold};

/// Where the record being processed right now came from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Origin {
    /// A source record: index of its topic-partition in the batch, offset, timestamp.
    Record {
        tp: u32,
        offset: i64,
        timestamp: i64,
    },
    /// An update of a table after the batch's state writes: the item's version.
    Update { version: u64, timestamp: i64 },
}

/// A general aggregate's typed pending values for one item.
pub(crate) trait PendingFold: Fold {
    /// For downcasting to the aggregation's own type.
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any;
    /// Drops the values of the record at (`tp`, `offset`).
    fn forget(&mut self, tp: u32, offset: i64);
}

/// One state item's pending contributions in this batch.
#[derive(Default)]
pub(crate) struct PendingItem {
    pub(crate) contributions: Vec<Contribution>,
    pub(crate) max_timestamp: i64,
    /// Each contributing record's timestamp, `(partition index, offset, timestamp)`: a time
    /// window keeps the newest of those it holds, so a record rejected at write time (a
    /// poison record) leaves it out.
    pub(crate) times: Vec<(u32, i64, i64)>,
    /// The values of a general aggregate (`None` for an additive store).
    pub(crate) fold: Option<Box<dyn PendingFold>>,
    /// When a windowed item may be deleted (epoch seconds).
    pub(crate) expires_at: Option<i64>,
    /// When a window of an emit-on-close store closes (epoch ms).
    pub(crate) close_at: Option<i64>,
}

/// What a join does with a record once the table's value of its key is read: the rest of
/// the record's way through the topology.
pub(crate) type Resume = Box<
    dyn FnOnce(&mut Ctx, Option<&crate::state::ItemState>) -> Result<(), StreamError> + Send + Sync,
>;

/// A record waiting at a join for the table's value of its key (read for all such
/// records of a batch at once, after the record pass).
pub(crate) struct Deferred {
    /// The record it continues, and its original source (see [`Ctx::source`]).
    pub(crate) origin: Origin,
    pub(crate) source: Option<(u32, i64)>,
    /// Under exactly-once output, for a table's update: the event record (partition
    /// index, offset) its outbox entry is kept under, whose transaction the record's
    /// outputs go in when it goes on (see [`Ctx::outbox_entry`]).
    pub(crate) entry: Option<(u32, i64)>,
    /// The joined table's store, and the key to read (`None`: a record whose key is null,
    /// which has no table value but keeps its place among the records it came with).
    pub(crate) store: usize,
    pub(crate) key: Option<Vec<u8>>,
    /// The stream time of the record's partition when the record was read (see
    /// [`Ctx::stream_time`]): its lateness downstream is judged against it, not against
    /// the stream time at the end of the record pass.
    pub(crate) stream_time: i64,
    pub(crate) resume: Resume,
}

/// A pending item: the encoded key, and the window start of a windowed item.
pub(crate) type PendingKey = (Vec<u8>, Option<i64>);

/// A window of a windowed item: its start (epoch ms), when it may be deleted (epoch s),
/// and, for an emit-on-close store, when it closes (epoch ms).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ItemWindow {
    pub(crate) start: i64,
    pub(crate) expires_at: i64,
    pub(crate) close_at: Option<i64>,
}

/// A way records reach state items, with one watermark per item (see `dsl::repartition`):
/// a partition of the batch, read directly, or a source partition and the repartition
/// partitions its records crossed, the last one a partition of the batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Channel {
    /// The source partition.
    pub(crate) origin: TopicPartition,
    /// The repartition partitions, first hop first (empty: direct).
    pub(crate) hops: Vec<TopicPartition>,
}

impl Channel {
    /// The channel's watermark name, as a topic-partition that displays as
    /// `<origin>><hop>>…` (`lines-0>words-2>letters-1`; topic names cannot hold `>`), so
    /// that stores name the watermark `w:<name>` as for a partition.
    fn name(&self) -> TopicPartition {
        let Some((last, before)) = self.hops.split_last() else {
            return self.origin.clone();
        };
        let mut topic = self.origin.to_string();
        for hop in before {
            topic.push('>');
            topic.push_str(&hop.to_string());
        }
        topic.push('>');
        topic.push_str(&last.topic);
        TopicPartition::new(topic, last.partition)
    }
}

/// State of one batch as records move through the topology: what the aggregations
/// will write, and what the sinks will produce.
pub(crate) struct Ctx {
    pub(crate) partitions: Vec<TopicPartition>,
    pub(crate) origin: Origin,
    /// Per store (by index), per encoded key: the batch's contributions, folded in memory.
    pub(crate) pending: Vec<HashMap<PendingKey, PendingItem>>,
    /// Per partition of the batch: the stream time (highest timestamp seen, epoch ms).
    pub(crate) stream_times: Vec<i64>,
    /// (record, window) pairs dropped because the window had closed.
    pub(crate) late_records: u64,
    /// Per store (by index): the time up to which its windows are closed and emitted
    /// (emit-on-close stores; `i64::MIN` otherwise).
    pub(crate) closed: Vec<i64>,
    pub(crate) outputs: Vec<OutputRecord>,
    /// Records a join's closing pass could not emit alone (its joiner, a serde or an
    /// operator after it failed or panicked on them): poison records for the policy.
    pub(crate) closing_poison: Vec<ClosingPoison>,
    /// Records not aggregated because their key serialized to null.
    pub(crate) dropped_null_keys: u64,
    /// Records not aggregated because their value is a Kafka null (where Kafka Streams
    /// skips one: `count`, `aggregate`, `reduce`, sliding windows).
    pub(crate) dropped_null_values: u64,
    /// The current source record's partition stream time before the record (Kafka
    /// Streams' session store time when the record is processed).
    pub(crate) prior_stream_time: i64,
    /// Per store (by index): whether its non-windowed items keep their newest record time
    /// ([`StoreSpec::keeps_time`](super::StoreSpec::keeps_time)).
    pub(crate) keeps_time: Vec<bool>,
    /// Records waiting at joins.
    pub(crate) deferred: Vec<Deferred>,
    /// Per partition of the batch: its first and last offsets.
    pub(crate) ranges: Vec<(i64, i64)>,
    /// The watermark channels contributions are attributed to, by name (the item's
    /// watermark attribute is `w:<name>`): the batch's partitions, then the channels of
    /// records read from repartition topics (`<source tp>><hop tp>…`, see
    /// `dsl::repartition`). Indexed like `channels`.
    pub(crate) sources: Vec<TopicPartition>,
    /// What each of `sources` is: its source partition and the repartition partitions its
    /// records crossed (none for a batch partition).
    pub(crate) channels: Vec<Channel>,
    /// For the current record, when it came through a repartition topic: its channel
    /// (index in `sources`) and its position on it, which its contributions carry.
    pub(crate) source: Option<(u32, i64)>,
    /// Per channel (index in `sources`) of records read from repartition topics: the
    /// highest position seen in this batch (one at or below it again is a copy).
    pub(crate) seen: HashMap<u32, i64>,
    /// Per source record (partition index, offset): how many records it has produced to
    /// repartition topics so far.
    pub(crate) sequences: HashMap<(u32, i64), u32>,
    /// Per left or outer stream–stream join (its id), side, and source record (partition
    /// index, offset): how many of the record's records have arrived at that side so far
    /// (a `flat_map_values` ahead of the join makes several).
    pub(crate) join_arrivals: HashMap<(u64, u8, u32, i64), u32>,
    /// Per contribution coordinates of a record read from a repartition topic (see
    /// [`source`](Self::source)): the batch record (partition index, offset) they stand
    /// for, to name and dead-letter a record whose contribution a store rejects.
    pub(crate) hopped: HashMap<(u32, i64), (u32, i64)>,
    /// A store given a table's update (which has no source coordinates to attribute it
    /// to): the batch fails. `build()` refuses the topologies that would do it.
    pub(crate) unattributed: Option<usize>,
    /// While a record waiting at a join goes on: the stream time of its partition when it
    /// was read (a record's lateness is judged at the record, as in Kafka Streams, not
    /// against the later records of its batch read meanwhile).
    pub(crate) resumed_stream_time: Option<i64>,
    /// The keys of non-windowed items written in this batch, per store index: a
    /// table–table join reads the other table after the batch's writes, so a key the
    /// other table holds no more may still have held a value earlier in the batch.
    pub(crate) written: Vec<std::collections::HashSet<Vec<u8>>>,
    /// Per store (by index), for a left or outer stream–stream join's: its closing time at
    /// the start of the batch (the lowest stream time of the partitions feeding it, from
    /// the clock; `i64::MIN` when none is known or for other stores).
    pub(crate) closing_times: Vec<i64>,
    /// Under exactly-once output: per partition of the batch, the shadow offset (its
    /// outputs committed below it) and the range whose outputs this batch commits.
    pub(crate) transactions: Option<Transactions>,
    /// Under exactly-once output, while a store's update from its outbox goes on: the
    /// event record (partition index, offset) the outbox entry is kept under. A
    /// table–table join's decision is written to its store attributed to it (see
    /// `dsl::join`), so that a retry re-emitting the entry finds the decision made.
    pub(crate) update_entry: Option<(u32, i64)>,
    /// Under exactly-once output, while a store's update from its outbox goes on: the
    /// item's state the entry holds (a table–table join keeps it with its decision).
    pub(crate) update_state: Option<crate::state::ItemState>,
    /// Under exactly-once output, while a store's update from its outbox goes on (also
    /// when it goes on after waiting at a stream–table join): the event record (partition
    /// index, offset) the entry is kept under. The outputs it makes go in that record's
    /// partition's transaction, those it makes after waiting too.
    pub(crate) outbox_entry: Option<(u32, i64)>,
}

/// Per partition of a batch under exactly-once output: the shadow offsets, and the offset
/// ranges whose outputs the batch commits (see [`Ctx::transactions`]).
pub(crate) type Transactions = (Vec<i64>, Vec<(i64, i64)>);

/// A record a join's closing pass could not emit alone, named for the poison policy: its
/// error (naming its topic-partition and offset), and what its dead letter holds.
#[derive(Debug)]
pub(crate) struct ClosingPoison {
    /// The poison error, naming the record.
    pub(crate) error: StreamError,
    /// The record's source partition and offset.
    pub(crate) tp: TopicPartition,
    pub(crate) offset: i64,
    /// The join's key, as stored.
    pub(crate) key: Vec<u8>,
    /// The record's value, as stored.
    pub(crate) value: Option<Vec<u8>>,
    /// The record's timestamp.
    pub(crate) timestamp: i64,
}

impl Ctx {
    pub(crate) fn new(partitions: Vec<TopicPartition>, stores: usize) -> Self {
        let partitions_copy = partitions.clone();
        Ctx {
            partitions,
            origin: Origin::Update {
                version: 0,
                timestamp: 0,
            },
            pending: (0..stores).map(|_| HashMap::new()).collect(),
            outputs: Vec::new(),
            dropped_null_keys: 0,
            dropped_null_values: 0,
            prior_stream_time: i64::MIN,
            keeps_time: vec![false; stores],
            stream_times: Vec::new(),
            late_records: 0,
            closed: vec![i64::MIN; stores],
            deferred: Vec::new(),
            ranges: Vec::new(),
            channels: partitions_copy
                .iter()
                .map(|tp| Channel {
                    origin: tp.clone(),
                    hops: Vec::new(),
                })
                .collect(),
            sources: partitions_copy,
            source: None,
            seen: HashMap::new(),
            sequences: HashMap::new(),
            join_arrivals: HashMap::new(),
            hopped: HashMap::new(),
            unattributed: None,
            resumed_stream_time: None,
            written: (0..stores).map(|_| Default::default()).collect(),
            closing_times: vec![i64::MIN; stores],
            closing_poison: Vec::new(),
            transactions: None,
            update_entry: None,
            update_state: None,
            outbox_entry: None,
        }
    }

    /// Whether this batch wrote the non-windowed item `key` of store `store`.
    pub(crate) fn wrote(&self, store: usize, key: &[u8]) -> bool {
        self.written
            .get(store)
            .is_some_and(|keys| keys.contains(key))
    }

    /// The batch record (partition index, offset) whose contribution carries the
    /// coordinates (`source`, `offset`): the record itself, or the repartitioned record
    /// that stands for its original source record.
    pub(crate) fn batch_record(&self, source: u32, offset: i64) -> Option<(u32, i64)> {
        if (source as usize) < self.partitions.len() {
            return Some((source, offset));
        }
        self.hopped.get(&(source, offset)).copied()
    }

    /// The index of `channel` in `sources`, added on first use.
    pub(crate) fn channel(&mut self, channel: Channel) -> u32 {
        let index = match self.channels.iter().position(|c| *c == channel) {
            Some(i) => i,
            None => {
                self.sources.push(channel.name());
                self.channels.push(channel);
                self.channels.len() - 1
            }
        };
        u32::try_from(index).unwrap_or(u32::MAX)
    }

    /// The pending state item `key` (in `window`) of `store`, with its timestamps moved to
    /// the current record, and that record's coordinates (partition index, offset). `None`
    /// outside a source record: a table's updates do not feed aggregations (`build()`
    /// refuses it), and the store is noted as `unattributed` so that it is never silent.
    fn pending_item(
        &mut self,
        store: usize,
        key: Vec<u8>,
        window: Option<ItemWindow>,
    ) -> Option<(&mut PendingItem, u32, i64)> {
        let (tp, offset, timestamp) = match (
            self.contribution_coordinates(),
            self.record_time(),
            self.origin,
            self.update_entry,
        ) {
            (Some((tp, offset)), Some((_, _, timestamp)), _, _) => (tp, offset, timestamp),
            // A table–table join's decision under exactly-once output: attributed to the
            // event record its update's outbox entry is kept under.
            (_, _, Origin::Update { timestamp, .. }, Some((tp, offset))) => (tp, offset, timestamp),
            _ => {
                self.unattributed.get_or_insert(store);
                return None;
            }
        };
        let item = self.pending[store]
            .entry((key, window.map(|w| w.start)))
            .or_default();
        item.max_timestamp = item.max_timestamp.max(timestamp);
        if window.is_some() || self.keeps_time.get(store).copied().unwrap_or(false) {
            item.times.push((tp, offset, timestamp));
        }
        item.expires_at = window.map(|w| w.expires_at);
        item.close_at = window.and_then(|w| w.close_at);
        Some((item, tp, offset))
    }

    /// Adds `delta` to the state item `key` of store `store`, attributed to the current record.
    pub(crate) fn contribute(
        &mut self,
        store: usize,
        key: Vec<u8>,
        window: Option<ItemWindow>,
        delta: i64,
    ) {
        let Some((item, tp, offset)) = self.pending_item(store, key, window) else {
            return;
        };
        match item.contributions.last_mut() {
            Some(last) if last.tp == tp && last.offset == offset => last.delta += delta,
            _ => item.contributions.push(Contribution { tp, offset, delta }),
        }
    }

    /// Adds a value of the current record to the general aggregate `store` of `key`:
    /// `make` creates the item's typed fold on first use, `push` adds the value to it.
    pub(crate) fn contribute_value(
        &mut self,
        store: usize,
        key: Vec<u8>,
        window: Option<ItemWindow>,
        make: impl FnOnce() -> Box<dyn PendingFold>,
        push: impl FnOnce(&mut dyn PendingFold, u32, i64),
    ) {
        let Some((item, tp, offset)) = self.pending_item(store, key, window) else {
            return;
        };
        item.contributions.push(Contribution {
            tp,
            offset,
            delta: 1,
        });
        push(item.fold.get_or_insert_with(make).as_mut(), tp, offset);
    }

    /// Forgets what the record at `offset` of partition `tp` contributed to pending state
    /// (after it failed part-way), so that the batch can go on without it.
    pub(crate) fn forget(&mut self, tp: u32, offset: i64) {
        for store in &mut self.pending {
            store.retain(|_, item| {
                item.contributions
                    .retain(|c| !(c.tp == tp && c.offset == offset));
                item.times.retain(|t| !(t.0 == tp && t.1 == offset));
                if let Some(fold) = &mut item.fold {
                    fold.forget(tp, offset);
                }
                !item.contributions.is_empty()
            });
        }
    }

    /// What the current record's contributions are attributed to: its source partition
    /// (index in `sources`) and offset — for a record read from a repartition topic, those
    /// of the original record.
    pub(crate) fn contribution_coordinates(&self) -> Option<(u32, i64)> {
        match self.origin {
            Origin::Record { tp, offset, .. } => Some(self.source.unwrap_or((tp, offset))),
            Origin::Update { .. } => None,
        }
    }

    /// Sets the current source record's event time (a timestamp extractor's), and its
    /// partition's stream time with it.
    pub(crate) fn set_event_time(&mut self, time: i64) {
        if let Origin::Record { tp, timestamp, .. } = &mut self.origin {
            *timestamp = time;
            if let Some(stream_time) = self.stream_times.get_mut(*tp as usize) {
                *stream_time = (*stream_time).max(time);
            }
        }
    }

    /// The current record's partition index, offset and timestamp.
    pub(crate) fn record_time(&self) -> Option<(u32, i64, i64)> {
        match self.origin {
            Origin::Record {
                tp,
                offset,
                timestamp,
            } => Some((tp, offset, timestamp)),
            Origin::Update { .. } => None,
        }
    }

    /// The timestamp of what is being processed: the source record's event time, or the
    /// table update's timestamp.
    pub(crate) fn timestamp(&self) -> i64 {
        match self.origin {
            Origin::Record { timestamp, .. } | Origin::Update { timestamp, .. } => timestamp,
        }
    }

    /// Runs `f` with the current table update's timestamp set to `timestamp` (a table's
    /// update carries the timestamp of the record that set the value, not the highest of
    /// the batch's records of the key), then restores it.
    pub(crate) fn with_update_timestamp<R>(
        &mut self,
        timestamp: i64,
        f: impl FnOnce(&mut Ctx) -> R,
    ) -> R {
        let saved = self.origin;
        if let Origin::Update { timestamp: t, .. } = &mut self.origin {
            *t = timestamp;
        }
        let result = f(self);
        self.origin = saved;
        result
    }

    /// Runs `f` with the current record's timestamp set to `timestamp` (a join result's,
    /// which is the later of its two records' as in Kafka Streams, not the timestamp of the
    /// record that happens to emit it; a record a join's closing pass emits alone, its
    /// own), then restores it. Stream time is not touched.
    pub(crate) fn with_timestamp<R>(&mut self, timestamp: i64, f: impl FnOnce(&mut Ctx) -> R) -> R {
        let saved = self.origin;
        match &mut self.origin {
            Origin::Record { timestamp: t, .. } | Origin::Update { timestamp: t, .. } => {
                *t = timestamp;
            }
        }
        let result = f(self);
        self.origin = saved;
        result
    }

    /// The time before which windows of store `store` are closed for the current record:
    /// its partition's stream time (its own timestamp included), or the store's closed
    /// time when that is later.
    pub(crate) fn close_time(&self, store: usize) -> i64 {
        self.stream_time()
            .max(self.closed.get(store).copied().unwrap_or(i64::MIN))
    }

    /// The stream time of the current record's partition when the record was read (its own
    /// timestamp included; for a record resumed after a join, the time it was read at).
    pub(crate) fn stream_time(&self) -> i64 {
        if let Some(time) = self.resumed_stream_time {
            return time;
        }
        match self.origin {
            Origin::Record { tp, .. } => self
                .stream_times
                .get(tp as usize)
                .copied()
                .unwrap_or(i64::MIN),
            Origin::Update { .. } => i64::MIN,
        }
    }

    /// Parks the current record (a source record or a table update) at a join until the
    /// table's value of `key` in `store` is read; `resume` then takes it on.
    pub(crate) fn defer(
        &mut self,
        store: usize,
        key: Vec<u8>,
        resume: Resume,
    ) -> Result<(), StreamError> {
        self.park(store, Some(key), resume)
    }

    /// Parks the current record at a join of `store` although its key is null (it has no
    /// table value, `resume` gets `None`): it goes on with the records parked there, in
    /// their order. Going on at once, it would overtake the earlier records of its
    /// partition, which downstream operators rely on being in offset order (a repartition
    /// topic's positions, lateness, non-commutative aggregates).
    pub(crate) fn defer_null_key(
        &mut self,
        store: usize,
        resume: Resume,
    ) -> Result<(), StreamError> {
        self.park(store, None, resume)
    }

    fn park(
        &mut self,
        store: usize,
        key: Option<Vec<u8>>,
        resume: Resume,
    ) -> Result<(), StreamError> {
        let stream_time = self.stream_time();
        self.deferred.push(Deferred {
            origin: self.origin,
            source: self.source,
            entry: self.outbox_entry,
            store,
            key,
            stream_time,
            resume,
        });
        Ok(())
    }

    /// The topic-partition and offset of the current record, for error messages.
    pub(crate) fn record_coordinates(&self) -> Option<(TopicPartition, i64)> {
        match self.origin {
            Origin::Record { tp, offset, .. } => {
                Some((self.partitions[tp as usize].clone(), offset))
            }
            Origin::Update { .. } => None,
        }
    }

    /// The record to blame for an error raised now: the current record's topic-partition
    /// and offset, or, during a table's update (which no single source record caused),
    /// `<table update>` with partition and offset -1.
    pub(crate) fn blame(&self) -> (TopicPartition, i64) {
        self.record_coordinates()
            .unwrap_or_else(|| (TopicPartition::new("<table update>", -1), -1))
    }

    /// A user function's failure on the current record, naming the record.
    pub(crate) fn user_error(&self, reason: String) -> StreamError {
        let (tp, offset) = self.blame();
        StreamError::User { tp, offset, reason }
    }

    /// A key or value of the current record that does not deserialize, naming the record.
    pub(crate) fn deserialize_error(&self, side: &'static str, e: SerdeError) -> StreamError {
        let (tp, offset) = self.blame();
        if e.is_unavailable() {
            return StreamError::Unavailable {
                tp,
                offset,
                side,
                reason: e.0,
            };
        }
        StreamError::Deserialize {
            tp,
            offset,
            side,
            reason: e.0,
        }
    }
}
