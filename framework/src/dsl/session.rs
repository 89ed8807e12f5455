//! Session windows: per key, the records separated by less than an inactivity gap form a
//! session, as Kafka Streams' `SessionWindows`.
//!
//! All sessions of a key live in one state item (a general aggregate: exactly once, one
//! write per touched key per batch). A record within the gap of one or more sessions
//! extends them, merging those it bridges (with the user's merger); otherwise it starts
//! a session. As in Kafka Streams, each update names one session and carries its end as
//! timestamp, and the sessions a record merges away are deleted: after each batch, first a
//! deletion (a tombstone on [`KTable::to_change_stream`]) for every session merged away, then
//! the current value of every session the batch changed, all with the item's version (per
//! session, the highest version is the current value). Kafka Streams emits them per record;
//! here a batch emits each session once, with its value after the batch, so a session that
//! is created and merged away within one batch gets only its tombstone.
//!
//! With [`EmitStrategy::OnWindowClose`] (or [`KTable::suppress`]) nothing is emitted after a
//! batch: each session is emitted once, its final value with its end as timestamp, when the
//! low watermark passes its end + gap + grace, by the closing pass over the table's
//! `closing` index (the item re-enters it at the close time of its earliest session not
//! emitted yet), and the item marks it emitted; see
//! [`SessionWindowedKStream::emit_strategy`].
//!
//! Exactly once under redelivery: each session keeps the record that last changed it, and
//! the item the sessions merged away by records of the batch, with the merging record. A
//! batch emits the sessions and tombstones of records read at or after its partitions' first
//! offsets, which the event source has not committed (a failed attempt of the batch may
//! have written them without producing their updates), so a retry emits what its failed
//! attempt did not; tombstones of committed records are forgotten at the next write. With
//! direct re-keying from several partitions, a batch of one partition may write the key
//! between a failed batch of another partition and its retry: it emits nothing of the other
//! partition's records, and keeps the tombstones they made (their partition's retry emits
//! them) until a batch of that partition starts past them.
//!
//! Under exactly-once output the item also remembers what its latest write did: the
//! sessions it changed and those it merged away. The store's outbox entry of the write holds
//! that state, and the write's updates are derived from it alone (its tombstones, then its
//! changed sessions), so the write and a retry after its transaction aborted produce the same
//! updates, each `(session, version)` once (`docs/state.md`, "Sessions and sliding windows on
//! update").
//!
//! Lateness is decided as in Kafka Streams' `KStreamSessionWindowAggregate`, on the stream
//! time of the record's partition (the highest timestamp seen in it, persisted with the
//! state like the time windows'): a record is late when the session it merges into ends
//! before stream time − gap − grace (the close time), so a record behind that is on time
//! when it falls within the gap of a session still open. A session that ends at or before
//! the stream time before the record − gap − grace takes no more records (Kafka's session
//! store, of the DSL's retention gap + grace, no longer returns it; a longer retention is
//! not offered). The decision is taken when the key's item is written, with its
//! sessions; a late record is dropped and counted in
//! [`BatchReport::late_records`](crate::BatchReport::late_records) (metric `LateRecordsDropped`)
//! by the batch that read it (its retry counts it again). A key's sessions are kept while they end less than `2 * gap + grace`
//! before the newest record of the key (any record that is not late can still merge with
//! them when a key's records come from one partition: `group_by_key`, or a repartition
//! topic), then dropped from the item, which keeps to its 400 KB. A session starts at its
//! earliest record, so no session starts before its records do (the hopping-window rule of
//! Kafka Streams, no window before 0, has nothing to cut here). Session items carry no TTL:
//! a key's sessions live in its one item, pruned as above.

use std::sync::Arc;
use std::time::Duration;

use super::state_codec::StateCodec;
use super::suppress::{FinalResults, alias_final, emit_final, register_final};
use super::windowed::{EmitStrategy, Windowed};
use super::{Downstream, KGroupedStream, KTable, lock};
use crate::error::StreamError;
use crate::serdes::{Serde, SerdeError};
use crate::state::ItemState;
use crate::topology::context::{Ctx, Origin};
use crate::topology::{CloseFn, Closing};

/// Session windows: an inactivity gap, and a grace period for out-of-order records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionWindows {
    gap: i64,
    grace: i64,
}

impl SessionWindows {
    /// Sessions of records at most `gap` apart.
    pub fn with_inactivity_gap(gap: Duration) -> Self {
        SessionWindows {
            gap: i64::try_from(gap.as_millis()).unwrap_or(i64::MAX),
            grace: 0,
        }
    }

    /// How long after a session could last be extended a record may still arrive for it.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = i64::try_from(grace.as_millis()).unwrap_or(i64::MAX);
        self
    }
}

/// Where a record was read: `(topic-partition of the batch, offset)`.
type ReadAt = (String, i64);

/// One session: first and last record times, its aggregate, the record that last
/// changed it (`None` in items written by earlier versions), and whether its final result
/// was emitted (emit-on-close only; a session that changes is a new one, not emitted).
#[derive(Debug, Clone, PartialEq)]
struct Session<A> {
    start: i64,
    end: i64,
    aggregate: A,
    at: Option<ReadAt>,
    emitted: bool,
    /// Whether the item's latest write changed it (created, extended or merged it): one of
    /// the updates of that write under exactly-once output.
    touched: bool,
}

/// A key's sessions, by start, and the sessions merged away by records that may not have
/// been emitted yet (`(start, end, the merging record)`), whose tombstones the batch emits.
/// `floor` is the newest record time as stored before the batch (read back from the
/// sessions, not stored), `batch` the batch's partitions with their first offsets (known
/// during a write, not stored).
#[derive(Debug, Clone)]
struct Sessions<A> {
    sessions: Vec<Session<A>>,
    removed: Vec<(i64, i64, ReadAt)>,
    /// The records dropped as late (their merged session had closed), until their batch is
    /// committed: the batch's updates count them in its report.
    late: Vec<ReadAt>,
    /// The sessions `(start, end)` the item's latest write merged away (its tombstones
    /// under exactly-once output, in the order they were merged).
    gone: Vec<(i64, i64)>,
    /// Whether no record was added since the sessions were read (or created): the next
    /// record starts a new write, which forgets the latest write's `touched` and `gone`.
    /// Not stored.
    fresh: bool,
    floor: Option<i64>,
    batch: Arc<Vec<(String, i64)>>,
}

impl<A> Sessions<A> {
    /// Whether the batch that `at` was read in may not have emitted its updates yet: it
    /// was read at or after the first offset of a partition of the current batch, so the
    /// event source has not committed it (a failed attempt of this batch may have
    /// written it). A record of a partition outside the batch is not this batch's to emit.
    fn unconfirmed(&self, at: &ReadAt) -> bool {
        self.batch
            .iter()
            .any(|(tp, first)| *tp == at.0 && at.1 >= *first)
    }

    /// Whether the event source committed the batch that `at` was read in: it was read
    /// before the first offset of its partition in the current batch. A record of a
    /// partition outside the batch is not known to be: a failed batch of its partition may
    /// have written it without producing its updates, and that batch's retry, which may
    /// come after this batch (with direct re-keying, several partitions write one key),
    /// emits them, so what it merged away is kept until then.
    fn committed(&self, at: &ReadAt) -> bool {
        self.batch
            .iter()
            .any(|(tp, first)| *tp == at.0 && at.1 < *first)
    }
}

/// A record for the sessions: its value, timestamp, where it was read, and the batch's
/// partitions with their first offsets.
#[derive(Clone)]
struct Timed<V> {
    value: V,
    ts: i64,
    /// The close time when the record was read: stream time − gap − grace. The record is
    /// late when the session it merges into ends before it.
    close: i64,
    /// The sessions ending at or before it merge with nothing: Kafka Streams' session store
    /// (retention gap + grace) no longer returns them, its time being the partition's
    /// stream time before the record.
    expired: i64,
    at: ReadAt,
    batch: Arc<Vec<(String, i64)>>,
}

/// The codec of [`Sessions`].
const SESSIONS: StateCodec = StateCodec::new("sessions");

/// A stored session: start, end, aggregate (base64), the record that last changed it.
type StoredSession = (i64, i64, String, Option<ReadAt>);

/// The stored form of [`Sessions`]: `{"sessions": [[start, end, "<aggregate, base64>",
/// ["<topic>-<partition>", offset]], …], "removed": [[start, end, [tp, offset]], …]}`, or
/// the bare `[[start, end, "<aggregate>"], …]` of earlier versions.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
enum StoredSessions {
    Tracked {
        sessions: Vec<StoredSession>,
        removed: Vec<(i64, i64, ReadAt)>,
        /// The sessions (start, end) whose final result was emitted.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        emitted: Vec<(i64, i64)>,
        /// The records dropped as late, until their batch is committed.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        late: Vec<ReadAt>,
        /// The sessions (start, end) the latest write changed.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        touched: Vec<(i64, i64)>,
        /// The sessions (start, end) the latest write merged away.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        gone: Vec<(i64, i64)>,
    },
    Bare(Vec<(i64, i64, String)>),
}

impl Default for StoredSessions {
    fn default() -> Self {
        StoredSessions::Bare(Vec::new())
    }
}

/// Stores [`Sessions`] as [`StoredSessions`].
struct SessionsSerde<A>(Arc<dyn Serde<A>>);

impl<A: 'static> Serde<Sessions<A>> for SessionsSerde<A> {
    fn serialize(&self, value: &Sessions<A>) -> Option<Vec<u8>> {
        self.try_serialize(value).ok().flatten()
    }

    fn try_serialize(&self, value: &Sessions<A>) -> Result<Option<Vec<u8>>, SerdeError> {
        let mut sessions = Vec::with_capacity(value.sessions.len());
        for s in &value.sessions {
            let bytes = self.0.try_serialize(&s.aggregate)?.unwrap_or_default();
            sessions.push((s.start, s.end, SESSIONS.encode_bytes(&bytes), s.at.clone()));
        }
        let emitted = value
            .sessions
            .iter()
            .filter(|s| s.emitted)
            .map(|s| (s.start, s.end))
            .collect();
        let touched = value
            .sessions
            .iter()
            .filter(|s| s.touched)
            .map(|s| (s.start, s.end))
            .collect();
        SESSIONS.encode(&StoredSessions::Tracked {
            sessions,
            removed: value.removed.clone(),
            emitted,
            late: value.late.clone(),
            touched,
            gone: value.gone.clone(),
        })
    }

    fn deserialize(&self, data: Option<&[u8]>) -> Result<Sessions<A>, SerdeError> {
        let (rows, removed, emitted, late, touched, gone) = match SESSIONS.decode(data)? {
            StoredSessions::Tracked {
                sessions,
                removed,
                emitted,
                late,
                touched,
                gone,
            } => (sessions, removed, emitted, late, touched, gone),
            StoredSessions::Bare(rows) => (
                rows.into_iter().map(|(s, e, a)| (s, e, a, None)).collect(),
                Vec::new(),
                Vec::new(),
                Vec::new(),
                Vec::new(),
                Vec::new(),
            ),
        };
        let mut sessions = Vec::with_capacity(rows.len());
        for (start, end, aggregate, at) in rows {
            let bytes = SESSIONS.decode_bytes(&aggregate)?;
            sessions.push(Session {
                start,
                end,
                aggregate: self.0.deserialize(Some(&bytes))?,
                at,
                emitted: emitted.contains(&(start, end)),
                touched: touched.contains(&(start, end)),
            });
        }
        let floor = sessions.iter().map(|s| s.end).max();
        Ok(Sessions {
            sessions,
            removed,
            late,
            gone,
            fresh: true,
            floor,
            batch: Arc::default(),
        })
    }
}

impl SessionWindows {
    /// When a session ending at `end` closes, as Kafka Streams' emit-on-close: once the
    /// stream time is past its end + gap + grace (`end < stream time - grace - gap`).
    fn close_time(&self, end: i64) -> i64 {
        end.saturating_add(self.gap)
            .saturating_add(self.grace)
            .saturating_add(1)
    }
}

impl<A> Sessions<A> {
    /// When the item next closes: the earliest close time of a session not emitted yet.
    fn next_close(&self, windows: SessionWindows) -> Option<i64> {
        self.sessions
            .iter()
            .filter(|s| !s.emitted)
            .map(|s| windows.close_time(s.end))
            .min()
    }
}

/// A grouped stream in session windows, ready for an aggregation.
pub struct SessionWindowedKStream<K, V> {
    grouped: KGroupedStream<K, V>,
    windows: SessionWindows,
    emit: EmitStrategy,
}

impl<K, V> KGroupedStream<K, V>
where
    K: Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// Groups the records further by session windows, for a session aggregation.
    pub fn windowed_by_session(&self, windows: SessionWindows) -> SessionWindowedKStream<K, V> {
        SessionWindowedKStream {
            grouped: KGroupedStream::new(
                self.shared.clone(),
                self.downstream.clone(),
                Arc::clone(&self.key_serde),
            ),
            windows,
            emit: EmitStrategy::default(),
        }
    }
}

impl<K, V> SessionWindowedKStream<K, V>
where
    K: Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// When the aggregation emits, as Kafka Streams' `emitStrategy`: after every batch
    /// that changed a session (the default), or once per session, its final value, when
    /// it closes ([`EmitStrategy::OnWindowClose`]): when the low watermark (the lowest
    /// stream time of the partitions feeding the aggregation, with the idle-partition
    /// timeout) passes its end + gap + grace, as Kafka Streams' rule, `end < stream time -
    /// grace - gap`. No tombstones then: a merged-away session was never emitted. The final
    /// result carries the session's end as timestamp (Kafka Streams'). A key that goes
    /// quiet still gets its final sessions: its item is in the table's `closing` index with
    /// the close time of its earliest open session, and the closing pass at the end of
    /// every batch emits the sessions closed by then, produced and acknowledged, then marks
    /// them emitted in the item on the condition that its version is the one read (a crash
    /// in between emits them again, with the same version). As in Kafka Streams, an
    /// emitted session stays in the item while a record on time may still merge with it
    /// (the merged session is a new one, emitted when it closes).
    ///
    /// ```
    /// use std::time::Duration;
    /// use lambda_streams::driver::TestDriver;
    /// use lambda_streams::dsl::{EmitStrategy, SessionWindows};
    /// use lambda_streams::serdes::{DecimalI64, Utf8};
    /// use lambda_streams::StreamsBuilder;
    ///
    /// let builder = StreamsBuilder::new();
    /// builder
    ///     .stream("clicks", Utf8, Utf8)
    ///     .group_by_key(Utf8)
    ///     .windowed_by_session(SessionWindows::with_inactivity_gap(Duration::from_secs(30)))
    ///     .emit_strategy(EmitStrategy::OnWindowClose)
    ///     .count("sessions")
    ///     .to_stream()
    ///     .map(|w, n| (format!("{}@{}-{}", w.key, w.start, w.end), n))
    ///     .to("final-sessions", Utf8, DecimalI64);
    /// let driver = TestDriver::new(builder.build());
    /// let mut clicks = driver.input_topic("clicks", Utf8, Utf8);
    /// let mut out = driver.output_topic("final-sessions", Utf8, DecimalI64);
    /// clicks.pipe_input_with_timestamp("u1", "/".to_owned(), 0)?;
    /// clicks.pipe_input_with_timestamp("u1", "/".to_owned(), 10_000)?;
    /// assert!(out.read_key_values()?.is_empty()); // still open
    /// // Another key moves the stream time past 10 s + 30 s: u1's session closes.
    /// clicks.pipe_input_with_timestamp("u2", "/".to_owned(), 40_001)?;
    /// assert_eq!(out.read_key_values()?, [("u1@0-10000".to_owned(), 2)]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn emit_strategy(mut self, emit: EmitStrategy) -> Self {
        self.emit = emit;
        self
    }

    /// Counts the records per key and session.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lambda_streams::driver::TestDriver;
    /// use lambda_streams::dsl::SessionWindows;
    /// use lambda_streams::serdes::{DecimalI64, Utf8};
    /// use lambda_streams::StreamsBuilder;
    ///
    /// // Clicks per user session, a session ending after 30 s without a click; records
    /// // up to a minute out of order still count.
    /// let builder = StreamsBuilder::new();
    /// let sessions = SessionWindows::with_inactivity_gap(Duration::from_secs(30))
    ///     .grace(Duration::from_secs(60));
    /// builder
    ///     .stream("clicks", Utf8, Utf8)
    ///     .group_by_key(Utf8)
    ///     .windowed_by_session(sessions)
    ///     .count("sessions")
    ///     .to_stream()
    ///     .map(|w, n| (format!("{}@{}-{}", w.key, w.start, w.end), n))
    ///     .to("session-clicks", Utf8, DecimalI64);
    /// let driver = TestDriver::new(builder.build());
    /// let mut clicks = driver.input_topic("clicks", Utf8, Utf8);
    /// for ts in [0, 10_000, 25_000, 100_000] {
    ///     clicks.pipe_input_with_timestamp("u1", "/".to_owned(), ts)?;
    /// }
    /// // 95 s behind the stream time (100 s), but it joins a session that ends within gap +
    /// // grace (90 s) of it: on time, as in Kafka Streams.
    /// clicks.pipe_input_with_timestamp("u1", "/".to_owned(), 5_000)?;
    /// assert_eq!(driver.last_report().unwrap().late_records, 0);
    /// let out = driver.output_topic("session-clicks", Utf8, DecimalI64).read_key_values_to_map()?;
    /// assert_eq!(out["u1@0-25000"], 4);
    /// assert_eq!(out["u1@100000-100000"], 1);
    /// // At 200 s, a click at 60 s joins no session that is still open: late, dropped, counted.
    /// clicks.pipe_input_with_timestamp("u1", "/".to_owned(), 200_000)?;
    /// clicks.pipe_input_with_timestamp("u1", "/".to_owned(), 60_000)?;
    /// assert_eq!(driver.last_report().unwrap().late_records, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn count(&self, store: &str) -> KTable<Windowed<K>, i64> {
        self.aggregate(
            store,
            || 0,
            |_, _, n: i64| n + 1,
            |_, a: i64, b: i64| a + b,
            crate::serdes::DecimalI64,
        )
    }

    /// Combines the values per key and session, as Kafka Streams' session `reduce`: a
    /// session's first value is its aggregate, each later one is combined with
    /// `reducer(aggregate, value)`, and merged sessions with `reducer(earlier, later)`.
    pub fn reduce(
        &self,
        store: &str,
        reducer: impl Fn(V, V) -> V + Send + Sync + 'static,
        value_serde: impl Serde<V>,
    ) -> KTable<Windowed<K>, V> {
        let reducer = Arc::new(reducer);
        let merge = Arc::clone(&reducer);
        let table = self.aggregate(
            store,
            || None,
            super::reduce_adder(move |a, b| reducer(a, b)),
            move |_, a: Option<V>, b: Option<V>| match (a, b) {
                (Some(a), Some(b)) => Some(merge(a, b)),
                (a, None) => a,
                (None, b) => b,
            },
            crate::serdes::Nullable(value_serde),
        );
        let (shared, updates) = (table.shared.clone(), table.updates().clone());
        let flat = table.flatten();
        alias_final(&shared, &updates, flat.updates());
        flat
    }

    /// Aggregates the records per key and session: a session starts as `init()`, each
    /// record is added with `adder(key, value, aggregate)`, and the sessions that a record
    /// falls within the gap of are merged, as Kafka Streams' session
    /// `aggregate(initializer, aggregator, merger)` does it: from `init()`, each such session
    /// (earliest first) with `merger(key, aggregate, session)`, then the record with the
    /// adder (so a merger that is not commutative gives Kafka Streams' result). Each
    /// session's update carries the session's end as its timestamp. All of a key's sessions
    /// share one item (at most 400 KB); see the module documentation.
    pub fn aggregate<A>(
        &self,
        store: &str,
        init: impl Fn() -> A + Send + Sync + 'static,
        adder: impl Fn(&K, V, A) -> A + Send + Sync + 'static,
        merger: impl Fn(&K, A, A) -> A + Send + Sync + 'static,
        aggregate_serde: impl Serde<A>,
    ) -> KTable<Windowed<K>, A>
    where
        A: Clone + Send + Sync + 'static,
    {
        let windows = self.windows;
        // Lateness needs the partitions' stream times, loaded and persisted with the state.
        lock(&self.grouped.shared).windowed = true;
        // The records with their timestamps; the late ones are dropped.
        let timed = Downstream::<K, Timed<V>>::new();
        let out = timed.clone();
        self.grouped
            .downstream
            .add(Arc::new(move |ctx, key, value| {
                let (Some((tp, offset)), Some((_, _, ts))) =
                    (ctx.record_coordinates(), ctx.record_time())
                else {
                    return Err(StreamError::Config(
                        "session windows take source records, not a table's updates".into(),
                    ));
                };
                // Whether the record is late is decided with the key's sessions, when the
                // item is written: Kafka Streams drops it when the session it merges into
                // ends before the stream time − gap − grace.
                let close = ctx
                    .stream_time()
                    .saturating_sub(windows.gap)
                    .saturating_sub(windows.grace);
                let prior = match ctx.resumed_stream_time {
                    Some(time) => time,
                    None => ctx.prior_stream_time,
                };
                let expired = prior
                    .saturating_sub(windows.gap)
                    .saturating_sub(windows.grace);
                let batch = ctx
                    .partitions
                    .iter()
                    .zip(&ctx.ranges)
                    .map(|(p, (first, _))| (p.to_string(), *first))
                    .collect();
                let timed = Timed {
                    value,
                    ts,
                    close,
                    expired,
                    at: (tp.to_string(), offset),
                    batch: Arc::new(batch),
                };
                out.forward(ctx, key, timed)
            }));
        let grouped = KGroupedStream::new(
            self.grouped.shared.clone(),
            timed,
            Arc::clone(&self.grouped.key_serde),
        );
        let init = Arc::new(init);
        let finals = FinalResults::default();
        let (pruning, closing) = (finals.clone(), finals.clone());
        let aggregate_serde: Arc<dyn Serde<A>> = Arc::new(aggregate_serde);
        let table = grouped.aggregate_closing(
            store,
            || Sessions {
                sessions: Vec::new(),
                removed: Vec::new(),
                late: Vec::new(),
                gone: Vec::new(),
                fresh: true,
                floor: None,
                batch: Arc::default(),
            },
            move |key, timed: Timed<V>, mut all: Sessions<A>| {
                let Timed {
                    value,
                    ts,
                    close,
                    expired,
                    at,
                    batch,
                } = timed;
                all.batch = batch;
                // The first record of a write: what the previous write changed is no
                // longer this write's (exactly-once output emits each write's own).
                if all.fresh {
                    all.fresh = false;
                    all.gone.clear();
                    all.sessions.iter_mut().for_each(|s| s.touched = false);
                }
                // The tombstones of earlier batches were emitted: forgotten, as the late
                // records they counted.
                let removed = std::mem::take(&mut all.removed);
                all.removed = removed
                    .into_iter()
                    .filter(|(_, _, by)| !all.committed(by))
                    .collect();
                let late = std::mem::take(&mut all.late);
                all.late = late.into_iter().filter(|by| !all.committed(by)).collect();
                // Kept: the sessions that a record which is not late can merge with.
                let kept = windows.gap.saturating_mul(2).saturating_add(windows.grace);
                // Emit-on-close: a session is kept until its final result is emitted.
                if let Some(floor) = all.floor {
                    let oldest = floor.saturating_sub(kept);
                    let open = pruning.on();
                    all.sessions
                        .retain(|s| s.end >= oldest || (open && !s.emitted));
                }
                // The sessions within the gap of `ts` merge with the record, those that
                // Kafka Streams' session store still returns: its retention is gap + grace
                // behind its time (the stream time before the record), so a session
                // ending at or before that is expired there (it stays apart).
                let (near, far): (Vec<Session<A>>, Vec<Session<A>>) =
                    std::mem::take(&mut all.sessions)
                        .into_iter()
                        .partition(|s| {
                            s.start.saturating_sub(windows.gap) <= ts
                                && ts <= s.end.saturating_add(windows.gap)
                                && s.end > expired
                        });
                // Kafka Streams' order: from `init()`, merge each session (earliest first)
                // as `merger(key, aggregate, session)`, then add the record.
                let merged_end = near.iter().map(|s| s.end).fold(ts, i64::max);
                if merged_end < close {
                    // Late (Kafka Streams' `KStreamSessionWindowAggregate`: the merged
                    // session ends before the close time): dropped, counted, the sessions
                    // as they were.
                    all.sessions = far;
                    all.sessions.extend(near);
                    all.sessions.sort_by_key(|s| s.start);
                    all.late.push(at);
                    return all;
                }
                let (mut start, mut end, mut aggregate) = (ts, ts, init());
                let mut merged_away = Vec::with_capacity(near.len());
                for s in near {
                    start = start.min(s.start);
                    end = end.max(s.end);
                    merged_away.push((s.start, s.end, at.clone()));
                    aggregate = merger(key, aggregate, s.aggregate);
                }
                // As Kafka Streams: the merged sessions are deleted (tombstones) unless the
                // record only falls on the one session `[ts, ts]`, which it updates.
                if (start, end) != (ts, ts) {
                    for (start, end, _) in &merged_away {
                        if !all.gone.contains(&(*start, *end)) {
                            all.gone.push((*start, *end));
                        }
                    }
                    all.removed.extend(merged_away);
                }
                let merged = Session {
                    start,
                    end,
                    aggregate: adder(key, value, aggregate),
                    at: Some(at),
                    emitted: false,
                    touched: true,
                };
                all.sessions = far;
                all.sessions.push(merged);
                all.sessions.sort_by_key(|s| s.start);
                all
            },
            SessionsSerde(Arc::clone(&aggregate_serde)),
            Some(Box::new(move |all: &Sessions<A>| {
                closing.on().then(|| all.next_close(windows))
            })),
        );
        let store_index = table.lookup.as_ref().map(|l| l.store);
        if let Some(index) = store_index {
            lock(&self.grouped.shared).stores[index].fans_out = true;
        }
        let node = table.nodes.first().copied();
        let next = Downstream::<Windowed<K>, A>::new();
        let deletes = Downstream::<Windowed<K>, ()>::new();
        let (out, removed) = (next.clone(), deletes.clone());
        let emitting = finals.clone();
        table
            .updates()
            .add(Arc::new(move |ctx, key: K, mut all: Sessions<A>| {
                // The batch's records dropped as late (a retry counts those of its failed
                // attempt again).
                all.batch = Arc::new(
                    ctx.partitions
                        .iter()
                        .zip(&ctx.ranges)
                        .map(|(p, (first, _))| (p.to_string(), *first))
                        .collect(),
                );
                ctx.late_records += all.late.iter().filter(|by| all.unconfirmed(by)).count() as u64;
                if emitting.on() {
                    // Emitted once per session, when it closes (the closing pass).
                    return Ok(());
                }
                // As Kafka Streams, each update carries its session's end as timestamp.
                let at = |ctx: &mut crate::topology::context::Ctx, end: i64| {
                    if let Origin::Update { version, .. } = ctx.origin {
                        ctx.origin = Origin::Update {
                            version,
                            timestamp: end,
                        };
                    }
                };
                if ctx.transactions.is_some() {
                    // Exactly-once output: the updates of the write that left the item in
                    // this state (its own, or an earlier attempt's from the outbox), and
                    // nothing else: first the sessions it merged away, then those it
                    // changed. A function of the state alone, so that the retry of an
                    // aborted transaction produces the same updates from the outbox.
                    for (start, end) in &all.gone {
                        at(ctx, *end);
                        let window = Windowed {
                            key: key.clone(),
                            start: *start,
                            end: *end,
                        };
                        removed.forward(ctx, window, ())?;
                    }
                    for s in all.sessions.iter().filter(|s| s.touched) {
                        at(ctx, s.end);
                        let window = Windowed {
                            key: key.clone(),
                            start: s.start,
                            end: s.end,
                        };
                        out.forward(ctx, window, s.aggregate.clone())?;
                    }
                    return Ok(());
                }
                all.batch = Arc::new(
                    ctx.partitions
                        .iter()
                        .zip(&ctx.ranges)
                        .map(|(p, (first, _))| (p.to_string(), *first))
                        .collect(),
                );
                // First the sessions merged away, then the sessions changed: those that
                // records not committed yet changed (this batch, or a failed attempt of
                // it whose updates may not have been produced). A live session with the
                // bounds of one merged away is emitted after its tombstone, so that the
                // tombstone (with the item's version now) does not end it for a consumer.
                let mut deleted = Vec::new();
                for (start, end, by) in &all.removed {
                    if all.unconfirmed(by) {
                        at(ctx, *end);
                        let window = Windowed {
                            key: key.clone(),
                            start: *start,
                            end: *end,
                        };
                        removed.forward(ctx, window, ())?;
                        deleted.push((*start, *end));
                    }
                }
                for s in &all.sessions {
                    let changed = s.at.as_ref().is_some_and(|by| all.unconfirmed(by));
                    if !changed && !deleted.contains(&(s.start, s.end)) {
                        continue;
                    }
                    at(ctx, s.end);
                    let window = Windowed {
                        key: key.clone(),
                        start: s.start,
                        end: s.end,
                    };
                    out.forward(ctx, window, s.aggregate.clone())?;
                }
                Ok(())
            }));
        let close = closer(
            Arc::clone(&self.grouped.key_serde),
            SessionsSerde(aggregate_serde),
            windows,
            next.clone(),
        );
        let table = KTable::new(self.grouped.shared.clone(), next).with_deletes(deletes);
        if let (Some(index), Some(node)) = (store_index, node) {
            let switch = Arc::new(move |inner: &mut crate::topology::TopologyInner| {
                finals.set();
                inner.stores[index].closing = Some(Closing {
                    node,
                    topics: Default::default(),
                    close: Some(Arc::clone(&close)),
                    reads: None,
                });
            });
            register_final(&self.grouped.shared, table.updates(), self.emit, switch);
        }
        table
    }
}

/// The closing pass of an emit-on-close session item at the closing time `low`: emits
/// each session not emitted yet whose close time has come (by end, then start; with the
/// session's end as timestamp, as Kafka Streams) through the aggregation's downstream
/// operators, except those in the set of sessions emitted already by an earlier try of
/// this pass, and returns the item marking them emitted, with its next closing time.
fn closer<K, A>(
    key_serde: Arc<dyn Serde<K>>,
    serde: SessionsSerde<A>,
    windows: SessionWindows,
    out: Downstream<Windowed<K>, A>,
) -> CloseFn
where
    K: Clone + Send + Sync + 'static,
    A: Clone + Send + Sync + 'static,
{
    Arc::new(
        move |ctx: &mut Ctx,
              key_bytes: &[u8],
              state: &ItemState,
              _read: Option<&ItemState>,
              low: i64,
              emitted| {
            let corrupt = |what: &str, e: String| {
                StreamError::Config(format!("a session item's {what} does not decode: {e}"))
            };
            let mut all = serde
                .deserialize(state.aggregate.as_deref())
                .map_err(|e| corrupt("sessions", e.0))?;
            let mut closed: Vec<usize> = (0..all.sessions.len())
                .filter(|&i| {
                    let s = &all.sessions[i];
                    !s.emitted && windows.close_time(s.end) <= low
                })
                .collect();
            closed.sort_by_key(|&i| (all.sessions[i].end, all.sessions[i].start));
            if !closed.is_empty() {
                let key = key_serde
                    .deserialize(Some(key_bytes))
                    .map_err(|e| corrupt("key", e.0))?;
                for i in closed {
                    let s = &mut all.sessions[i];
                    s.emitted = true;
                    let identity = [s.start.to_be_bytes(), s.end.to_be_bytes()].concat();
                    if !emitted.insert(identity) {
                        continue;
                    }
                    let window = Windowed {
                        key: key.clone(),
                        start: s.start,
                        end: s.end,
                    };
                    let (aggregate, end, at) = (s.aggregate.clone(), s.end, s.at.clone());
                    let stored = serde.0.try_serialize(&aggregate).ok().flatten();
                    emit_final(ctx, at.as_ref(), key_bytes, stored, end, |ctx| {
                        ctx.with_timestamp(end, |ctx| out.forward(ctx, window, aggregate))
                    })?;
                }
            }
            let next = all.next_close(windows);
            let bytes = serde
                .try_serialize(&all)
                .map_err(|e| corrupt("sessions", e.0))?
                .unwrap_or_default();
            Ok(Some((bytes, next)))
        },
    )
}
