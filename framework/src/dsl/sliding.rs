//! Sliding windows, as Kafka Streams' `SlidingWindows`: windows of a fixed `difference`
//! (both ends inclusive) that are defined by the records they contain. Per key, each record
//! at `t` has its "left" window `[t - difference, t]` (ending at it), and its "right" window
//! `[t + 1, t + 1 + difference]` (starting just after it) when that window holds a later
//! record: together, one window per distinct set of records within `difference`. As in
//! Kafka Streams, no window starts before 0: a record earlier than `difference` has the
//! window `[0, difference]` as its left window. A [`Windowed`] key carries the window as
//! `start` (inclusive) and `end = start + difference + 1` (exclusive).
//!
//! A key's recent records live in one state item (a general aggregate: exactly once, one
//! write per touched key per batch), and after each batch every window of the buffered
//! records (every window all of whose records are still buffered, which includes every
//! window the batch changed) is emitted with the item's version: per key and window, the
//! highest version carries the current value.
//!
//! Lateness is Kafka Streams' rule, on the stream time of the record's partition (the
//! highest timestamp seen in it, persisted with the state like the time windows'): a record
//! at `t` is late once every window containing it has closed, `t + 1 + difference <=
//! stream time - grace`. A late record is dropped and counted in
//! [`BatchReport::late_records`](crate::BatchReport::late_records) (metric `LateRecordsDropped`),
//! once per delivery. A record that is not late counts only in its windows still open when
//! it is read, and the windows are made and filled as Kafka 4's
//! `KStreamSlidingWindowAggregate` makes them (it keeps windows, not records: a window is
//! made only while open, a new left window starts from the window ending just before it,
//! a new right window from the latest window holding the record), on update and on close
//! alike: the item keeps, per window, the records that count in it. Kafka Streams also
//! counts a dropped record per closed window it skips; here only late records are counted.
//! Records are kept for `3 * difference + grace + 1` ms behind the newest record of the key
//! (the windows a record on time reads start from `t - 2 * difference`), and as long as a
//! window kept holds them, which covers every record
//! that is not late when a key's records come from one partition (`group_by_key`, or a
//! repartition topic); with direct re-keying from several partitions, a partition whose
//! stream time lags the key's newest record by more than `grace` can see windows without
//! the records already dropped. A record with a negative timestamp (none, for Kafka) is a
//! poison record.
//!
//! With [`EmitStrategy::OnWindowClose`] (or [`KTable::suppress`]) nothing is emitted after a
//! batch: each window is emitted once, its final value with its newest record's time, when
//! the low watermark passes its end + grace, by the closing pass over the table's `closing`
//! index, so that the final values are Kafka Streams' whatever the batch boundaries. See
//! [`SlidingWindowedKStream::emit_strategy`].
//!
//! Records that a failed attempt of the current batch may have written (read at or after
//! the first offset of one of the batch's partitions, so not committed by the event source)
//! are never dropped as too old, nor the records their windows hold: their windows were
//! perhaps never emitted, and the retry emits them (outputs are at least once). Each
//! buffered record keeps where it was read for that. A record from a partition that is not
//! in the batch is not that batch's to emit, and every write that keeps it emits its
//! windows; with direct re-keying from several partitions, a batch of one partition may
//! still prune records that a failed batch of another wrote before its retry (when a third
//! batch in between also failed): it parks their windows in the item for that retry to
//! emit, until a batch of their partition starts past them. Under exactly-once output the
//! windows of a write are emitted from the store's outbox entry, which holds the state the
//! write left (the windows are a function of it), and nothing is parked.
//!
//! A null value (a `None` of a [`Nullable`](crate::serdes::Nullable) value serde the
//! topology names) is skipped and counted in
//! [`BatchReport::dropped_null_values`](crate::BatchReport::dropped_null_values), as Kafka
//! Streams' sliding-window aggregation skips it.

use std::sync::Arc;
use std::time::Duration;

mod closing;

use closing::closer;

use super::state_codec::StateCodec;
use super::suppress::{FinalResults, alias_final, register_final};
use super::windowed::{EmitStrategy, Windowed};
use super::{Downstream, KGroupedStream, KTable, lock};
use crate::error::StreamError;
use crate::serdes::{Serde, SerdeError};
use crate::topology::Closing;
use crate::topology::context::Origin;

/// Sliding windows: how far back a record's window reaches, and a grace period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingWindows {
    difference: i64,
    grace: i64,
}

impl SlidingWindows {
    /// Windows of `difference` (both ends inclusive) ending at each record's timestamp and
    /// starting just after it, and a grace period for out-of-order records (as Kafka
    /// Streams' `ofTimeDifferenceAndGrace`); see the module documentation.
    pub fn of_time_difference_and_grace(difference: Duration, grace: Duration) -> Self {
        let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        SlidingWindows {
            difference: ms(difference),
            grace: ms(grace),
        }
    }

    /// Whether a record at `ts` is late at `stream_time`: every window containing it has
    /// closed (Kafka Streams' rule: `ts + 1 + difference <= stream time - grace`).
    fn is_late(&self, ts: i64, stream_time: i64) -> bool {
        ts.saturating_add(1).saturating_add(self.difference)
            <= stream_time.saturating_sub(self.grace)
    }

    /// How far behind the newest record of a key its records are kept: far enough for
    /// every window a record that is not late reads (Kafka Streams' processor reads the
    /// windows starting from `t - 2 * difference`), and for the records in them.
    fn kept(&self) -> i64 {
        self.difference
            .saturating_mul(3)
            .saturating_add(self.grace)
            .saturating_add(1)
    }
}

/// One buffered record: its timestamp, its value as the value serde wrote it (`None`: the
/// serde wrote null, as `Nullable` does for `None`; `count` keeps no value), where it
/// was read, `(topic-partition of the batch, offset)` (`None` in items written by earlier
/// versions), and, for emit-on-close, the stream time of its partition when it was read
/// (its own timestamp included), its place in the item's arrival order, and whether it
/// counted in a window when it was read (see [`Records::arrive_final`]).
#[derive(Debug, Clone)]
struct Buffered {
    ts: i64,
    value: Option<Vec<u8>>,
    at: Option<(String, i64)>,
    seen: Option<i64>,
    seq: u64,
    known: bool,
}

/// A key's buffered records, in arrival order (items written by earlier versions: by
/// timestamp). `from`: every record of the key at or after it
/// is buffered (`None`: every record; earlier ones were dropped as too old). `floor` is the
/// newest timestamp as stored before the batch, and `batch` the batch's partitions with
/// their first offsets (both known during a write, not stored).
/// Emit-on-close: `closed`, the windows that close at or before it were emitted by the
/// closing pass; `created`, the windows Kafka Streams would hold (start, and the arrival
/// number of the record that created it); `members`, for each of those windows, the
/// arrival numbers of the records that count in it, as Kafka Streams' processor makes
/// them (`None` in items written before they were kept: the rule of
/// [`Records::final_windows`] then); `seq`, the next arrival number.
/// `parked`: at least once, the windows of records that a batch of another partition
/// pruned before their own partition's batch was known to be committed (see [`Parked`]).
#[derive(Debug, Clone, Default)]
struct Records {
    records: Vec<Buffered>,
    from: Option<i64>,
    floor: Option<i64>,
    batch: Arc<Vec<(String, i64)>>,
    closed: Option<i64>,
    created: Vec<(i64, u64)>,
    members: Option<Vec<(i64, Vec<u64>)>>,
    seq: u64,
    parked: Vec<Parked>,
}

/// A window whose records a write pruned while some of them came from a partition
/// outside the write's batch, not known to be committed: with direct re-keying, a failed
/// batch of that partition may have written them without producing their windows, and its
/// retry, which may come after the pruning write, emits the window from here (outputs are
/// at least once). Kept until a batch of each of those partitions starts past its record
/// (the event source committed it); never emitted otherwise. At least once only: under
/// exactly-once output each write's windows come from its outbox entry.
#[derive(Debug, Clone, PartialEq)]
struct Parked {
    /// The window's start.
    start: i64,
    /// Its newest record's timestamp (the update's timestamp, as Kafka Streams').
    newest: i64,
    /// The values of the records that count in it, in arrival order.
    values: Vec<Option<Vec<u8>>>,
    /// Where its records of partitions outside the pruning batch were read.
    by: Vec<(String, i64)>,
}

impl Records {
    /// Whether the batch that wrote `record` may not have emitted its windows yet: it was
    /// read at or after the first offset of a partition of the current batch, so the event
    /// source has not committed it (a failed attempt of this batch may have written it).
    /// Records of partitions outside the batch, and those of older items, count as emitted.
    fn unconfirmed(&self, record: &Buffered) -> bool {
        let Some((tp, offset)) = &record.at else {
            return false;
        };
        self.batch
            .iter()
            .any(|(batch_tp, first)| batch_tp == tp && offset >= first)
    }

    /// Whether the event source committed the batch that read at `at`: it is before the
    /// first offset of its partition in the current batch.
    fn committed(&self, at: &(String, i64)) -> bool {
        self.batch
            .iter()
            .any(|(tp, first)| *tp == at.0 && at.1 < *first)
    }

    /// Whether `at` is of a partition outside the current batch.
    fn elsewhere(&self, at: &(String, i64)) -> bool {
        !self.batch.iter().any(|(tp, _)| *tp == at.0)
    }

    /// At least once, before the records older than `oldest` are pruned: forgets the
    /// parked windows whose every partition has committed past them, and parks the windows
    /// (as emitted now: from `first`) that hold a record about to be pruned of a partition
    /// outside the batch, whose batch may have failed after writing it.
    fn park(&mut self, before: Vec<(i64, Vec<usize>)>, oldest: i64, first: i64) {
        let mut parked = std::mem::take(&mut self.parked);
        for p in &mut parked {
            p.by.retain(|at| !self.committed(at));
        }
        parked.retain(|p| !p.by.is_empty());
        let unsettled =
            |r: &Buffered| r.ts < oldest && r.at.as_ref().is_some_and(|at| self.elsewhere(at));
        if self.records.iter().any(unsettled) {
            for (start, members) in before {
                let by: Vec<(String, i64)> = members
                    .iter()
                    .map(|&i| &self.records[i])
                    .filter(|r| unsettled(r))
                    .filter_map(|r| r.at.clone())
                    .collect();
                if start < first || by.is_empty() {
                    continue;
                }
                let window = Parked {
                    start,
                    newest: members
                        .iter()
                        .map(|&i| self.records[i].ts)
                        .max()
                        .unwrap_or(start),
                    values: members
                        .iter()
                        .map(|&i| self.records[i].value.clone())
                        .collect(),
                    by,
                };
                match parked.iter_mut().find(|p| p.start == window.start) {
                    Some(p) => {
                        for at in window.by {
                            if !p.by.contains(&at) {
                                p.by.push(at);
                            }
                        }
                    }
                    None => parked.push(window),
                }
            }
        }
        self.parked = parked;
    }
}

/// A record for the buffer: as [`Buffered`], with the batch's partitions and first offsets.
#[derive(Clone)]
struct Timed {
    record: Buffered,
    batch: Arc<Vec<(String, i64)>>,
    exactly_once: bool,
}

/// Stores [`Records`] as JSON `{"from": <ms or null>, "buffer": [[timestamp, "<value,
/// base64>" or null, ["<topic>-<partition>", offset] or null], …]}`; reads back the forms
/// written by earlier versions too (`records` without null values or coordinates, or a
/// bare array).
struct RecordsSerde;

/// The codec of [`Records`].
const RECORDS: StateCodec = StateCodec::new("window records");

/// A stored record: timestamp, value, where it was read.
type StoredRecord = (i64, Option<String>, Option<(String, i64)>);

/// A stored record of an emit-on-close item: as [`StoredRecord`], and the stream time it
/// was read at, its arrival number, whether it counted in a window.
type StoredFinal = (
    i64,
    Option<String>,
    Option<(String, i64)>,
    Option<i64>,
    u64,
    bool,
);

/// A stored [`Parked`] window: start, newest timestamp, values, where its unsettled
/// records were read.
type StoredParked = (i64, i64, Vec<Option<String>>, Vec<(String, i64)>);

/// The stored form of [`Records`] (no item yet: no records).
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
enum StoredRecords {
    Final {
        from: Option<i64>,
        buffer: Vec<StoredFinal>,
        closed: Option<i64>,
        created: Vec<(i64, u64)>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        members: Option<Vec<(i64, Vec<u64>)>>,
        seq: u64,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        parked: Vec<StoredParked>,
    },
    Sourced {
        from: Option<i64>,
        buffer: Vec<StoredRecord>,
    },
    Kept {
        from: Option<i64>,
        records: Vec<(i64, String)>,
    },
    Bare(Vec<(i64, String)>),
}

impl Default for StoredRecords {
    fn default() -> Self {
        StoredRecords::Bare(Vec::new())
    }
}

impl Serde<Records> for RecordsSerde {
    fn serialize(&self, value: &Records) -> Option<Vec<u8>> {
        self.try_serialize(value).ok().flatten()
    }

    fn try_serialize(&self, value: &Records) -> Result<Option<Vec<u8>>, SerdeError> {
        if value.closed.is_some() || value.seq > 0 || !value.parked.is_empty() {
            let buffer = value
                .records
                .iter()
                .map(|r| {
                    (
                        r.ts,
                        r.value.as_deref().map(|v| RECORDS.encode_bytes(v)),
                        r.at.clone(),
                        r.seen,
                        r.seq,
                        r.known,
                    )
                })
                .collect();
            return RECORDS.encode(&StoredRecords::Final {
                from: value.from,
                buffer,
                closed: value.closed,
                created: value.created.clone(),
                members: value.members.clone(),
                seq: value.seq,
                parked: value
                    .parked
                    .iter()
                    .map(|p| {
                        let values = p.values.iter();
                        let values = values.map(|v| v.as_deref().map(|v| RECORDS.encode_bytes(v)));
                        (p.start, p.newest, values.collect(), p.by.clone())
                    })
                    .collect(),
            });
        }
        let buffer = value
            .records
            .iter()
            .map(|r| {
                (
                    r.ts,
                    r.value.as_deref().map(|v| RECORDS.encode_bytes(v)),
                    r.at.clone(),
                )
            })
            .collect();
        let stored = StoredRecords::Sourced {
            from: value.from,
            buffer,
        };
        RECORDS.encode(&stored)
    }

    fn deserialize(&self, data: Option<&[u8]>) -> Result<Records, SerdeError> {
        let stored: StoredRecords = RECORDS.decode(data)?;
        let mut stored_members = None;
        let mut stored_parked = Vec::new();
        let (from, rows, closed, created, seq): (_, Vec<StoredFinal>, _, _, _) = match stored {
            StoredRecords::Final {
                from,
                buffer,
                closed,
                created,
                members,
                seq,
                parked,
            } => {
                stored_members = members;
                stored_parked = parked;
                (from, buffer, closed, created, seq)
            }
            StoredRecords::Sourced { from, buffer } => (
                from,
                buffer
                    .into_iter()
                    .map(|(t, v, at)| (t, v, at, None, 0, true))
                    .collect(),
                None,
                Vec::new(),
                0,
            ),
            StoredRecords::Kept { from, records } => (
                from,
                records
                    .into_iter()
                    .map(|(t, v)| (t, Some(v), None, None, 0, true))
                    .collect(),
                None,
                Vec::new(),
                0,
            ),
            StoredRecords::Bare(records) => (
                None,
                records
                    .into_iter()
                    .map(|(t, v)| (t, Some(v), None, None, 0, true))
                    .collect(),
                None,
                Vec::new(),
                0,
            ),
        };
        let mut records = Vec::with_capacity(rows.len());
        for (ts, value, at, seen, seq, known) in rows {
            let value = match value {
                Some(text) => Some(RECORDS.decode_bytes(&text)?),
                None => None,
            };
            records.push(Buffered {
                ts,
                value,
                at,
                seen,
                seq,
                known,
            });
        }
        let mut parked = Vec::with_capacity(stored_parked.len());
        for (start, newest, stored, by) in stored_parked {
            let mut values = Vec::with_capacity(stored.len());
            for value in stored {
                values.push(match value {
                    Some(text) => Some(RECORDS.decode_bytes(&text)?),
                    None => None,
                });
            }
            parked.push(Parked {
                start,
                newest,
                values,
                by,
            });
        }
        let floor = records.iter().map(|r| r.ts).max();
        Ok(Records {
            records,
            from,
            floor,
            batch: Arc::default(),
            closed,
            created,
            members: stored_members,
            seq,
            parked,
        })
    }
}

/// A grouped stream in sliding windows, ready for an aggregation.
pub struct SlidingWindowedKStream<K, V> {
    grouped: KGroupedStream<K, V>,
    windows: SlidingWindows,
    emit: EmitStrategy,
}

impl<K, V> KGroupedStream<K, V>
where
    K: Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// Groups the records further by sliding windows, for a sliding-window aggregation.
    pub fn windowed_by_sliding(&self, windows: SlidingWindows) -> SlidingWindowedKStream<K, V> {
        SlidingWindowedKStream {
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

impl<K, V> SlidingWindowedKStream<K, V>
where
    K: Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// When the aggregation emits, as Kafka Streams' `emitStrategy`: after every batch
    /// that touched a key, every window of its buffered records (the default), or once per
    /// window, its final value, when it closes ([`EmitStrategy::OnWindowClose`]): when the
    /// low watermark (the lowest stream time of the partitions feeding the aggregation, with
    /// the idle-partition timeout) passes its end + grace, as Kafka Streams' `end < stream
    /// time - grace`. The final result carries the window's newest record time (Kafka
    /// Streams'). As in Kafka Streams, a record counts only in the windows still open at its
    /// partition's stream time when it is read (each buffered record keeps that time), and a
    /// window no record counts in is not emitted, so the final values do not depend on batch
    /// boundaries. A key that goes quiet still gets its final windows: its item is in the
    /// table's `closing` index with the close time of its earliest window not emitted yet,
    /// and the closing pass at the end of every batch emits the windows closed by then,
    /// produced and acknowledged, then records in the item up to which time it emitted, on
    /// the condition that its version is the one read (a crash in between emits them
    /// again, with the same version). The item keeps the records of every window not
    /// emitted yet.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lambda_streams::driver::TestDriver;
    /// use lambda_streams::dsl::{EmitStrategy, SlidingWindows};
    /// use lambda_streams::serdes::{DecimalI64, Utf8};
    /// use lambda_streams::StreamsBuilder;
    ///
    /// let builder = StreamsBuilder::new();
    /// let windows = SlidingWindows::of_time_difference_and_grace(
    ///     Duration::from_secs(10),
    ///     Duration::ZERO,
    /// );
    /// builder
    ///     .stream("logins", Utf8, Utf8)
    ///     .group_by_key(Utf8)
    ///     .windowed_by_sliding(windows)
    ///     .emit_strategy(EmitStrategy::OnWindowClose)
    ///     .count("recent-logins")
    ///     .to_stream()
    ///     .map(|w, n| (format!("{}@{}..={}", w.key, w.start, w.end - 1), n))
    ///     .to("login-bursts", Utf8, DecimalI64);
    /// let driver = TestDriver::new(builder.build());
    /// let mut logins = driver.input_topic("logins", Utf8, Utf8);
    /// let mut out = driver.output_topic("login-bursts", Utf8, DecimalI64);
    /// logins.pipe_input_with_timestamp("u1", "ok".to_owned(), 20_000)?;
    /// assert!(out.read_key_values()?.is_empty()); // [10 s, 20 s] is open
    /// logins.pipe_input_with_timestamp("u1", "ok".to_owned(), 25_000)?;
    /// // [10 s, 20 s] has closed (20 s < 25 s); [15 s, 25 s] and [20.001 s, 30.001 s] not.
    /// assert_eq!(out.read_key_values()?, [("u1@10000..=20000".to_owned(), 1)]);
    /// // Another key moves the stream time past 30.001 s: u1's last two windows close.
    /// logins.pipe_input_with_timestamp("u2", "ok".to_owned(), 40_002)?;
    /// let closed = [("u1@15000..=25000".to_owned(), 2), ("u1@20001..=30001".to_owned(), 1)];
    /// assert_eq!(out.read_key_values()?, closed);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn emit_strategy(mut self, emit: EmitStrategy) -> Self {
        self.emit = emit;
        self
    }

    /// Counts the records of each key in each of its sliding windows.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lambda_streams::driver::TestDriver;
    /// use lambda_streams::dsl::SlidingWindows;
    /// use lambda_streams::serdes::{DecimalI64, Utf8};
    /// use lambda_streams::StreamsBuilder;
    ///
    /// // Logins per user in any 10 s, with 5 s of grace.
    /// let builder = StreamsBuilder::new();
    /// let windows = SlidingWindows::of_time_difference_and_grace(
    ///     Duration::from_secs(10),
    ///     Duration::from_secs(5),
    /// );
    /// builder
    ///     .stream("logins", Utf8, Utf8)
    ///     .group_by_key(Utf8)
    ///     .windowed_by_sliding(windows)
    ///     .count("recent-logins")
    ///     .to_stream()
    ///     .map(|w, n| (format!("{}@{}..={}", w.key, w.start, w.end - 1), n))
    ///     .to("login-bursts", Utf8, DecimalI64);
    /// let driver = TestDriver::new(builder.build());
    /// let mut logins = driver.input_topic("logins", Utf8, Utf8);
    /// for ts in [101_000, 104_000, 109_000, 130_000] {
    ///     logins.pipe_input_with_timestamp("u1", "ok".to_owned(), ts)?;
    /// }
    /// let out = driver.output_topic("login-bursts", Utf8, DecimalI64).read_key_values_to_map()?;
    /// // Left windows, ending at each login:
    /// assert_eq!(out["u1@91000..=101000"], 1);
    /// assert_eq!(out["u1@94000..=104000"], 2);
    /// assert_eq!(out["u1@99000..=109000"], 3);
    /// assert_eq!(out["u1@120000..=130000"], 1);
    /// // Right windows, starting just after a login, when a later one is in them:
    /// assert_eq!(out["u1@101001..=111001"], 2); // 104 s and 109 s
    /// assert_eq!(out["u1@104001..=114001"], 1); // 109 s
    /// assert_eq!(out.len(), 6);
    ///
    /// // At stream time 130 s, every window of a login at 101.5 s has closed (its last one
    /// // ends at 111.501 s, before 130 s - 5 s of grace): late, dropped and counted.
    /// logins.pipe_input_with_timestamp("u1", "ok".to_owned(), 101_500)?;
    /// assert_eq!(driver.last_report().unwrap().late_records, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn count(&self, store: &str) -> KTable<Windowed<K>, i64> {
        self.aggregate_with(store, |_| Ok(None), |_| Ok(()), || 0, |_, (), n: i64| n + 1)
    }

    /// Aggregates the records of each key in each of its sliding windows: from `init()`,
    /// adding each record of the window in arrival order (by source partition, then offset)
    /// with `adder(key, value, aggregate)`, the order in which Kafka Streams adds a record to
    /// every window that already holds the records before it. Each window's update carries
    /// the timestamp of its newest record.
    /// The records are kept (encoded with `value_serde`) in one item per key, at most
    /// 400 KB: see the module documentation.
    pub fn aggregate<A>(
        &self,
        store: &str,
        init: impl Fn() -> A + Send + Sync + 'static,
        adder: impl Fn(&K, V, A) -> A + Send + Sync + 'static,
        value_serde: impl Serde<V>,
    ) -> KTable<Windowed<K>, A>
    where
        A: Clone + Send + Sync + 'static,
    {
        let value_serde: Arc<dyn Serde<V>> = Arc::new(value_serde);
        let decoder = Arc::clone(&value_serde);
        self.aggregate_with(
            store,
            move |value| value_serde.try_serialize(value).map_err(|e| e.0),
            move |bytes| decoder.deserialize(bytes).map_err(|e| e.0),
            init,
            adder,
        )
    }

    /// Combines the values of each key in each of its sliding windows, as Kafka Streams'
    /// sliding `reduce`: a window's first value (in arrival order) is its aggregate, each
    /// later one is combined with `reducer(aggregate, value)`. The records are kept as for
    /// [`aggregate`](Self::aggregate).
    pub fn reduce(
        &self,
        store: &str,
        reducer: impl Fn(V, V) -> V + Send + Sync + 'static,
        value_serde: impl Serde<V>,
    ) -> KTable<Windowed<K>, V> {
        let table = self.aggregate(store, || None, super::reduce_adder(reducer), value_serde);
        let (shared, updates) = (table.shared.clone(), table.updates().clone());
        let flat = table.flatten();
        alias_final(&shared, &updates, flat.updates());
        flat
    }

    /// The aggregation, with the values kept as `encode` writes them (`None`: null) and
    /// read back as `decode` does.
    fn aggregate_with<T, A>(
        &self,
        store: &str,
        encode: impl Fn(&V) -> Result<Option<Vec<u8>>, String> + Send + Sync + 'static,
        decode: impl Fn(Option<&[u8]>) -> Result<T, String> + Send + Sync + 'static,
        init: impl Fn() -> A + Send + Sync + 'static,
        adder: impl Fn(&K, T, A) -> A + Send + Sync + 'static,
    ) -> KTable<Windowed<K>, A>
    where
        A: Clone + Send + Sync + 'static,
    {
        let windows = self.windows;
        let finals = FinalResults::default();
        let (pruning, closing, emitting) = (finals.clone(), finals.clone(), finals.clone());
        // Lateness needs the partitions' stream times, loaded and persisted with the state.
        lock(&self.grouped.shared).windowed = true;

        // The records with their timestamps, encoded values and coordinates; the late ones
        // are dropped.
        let timed = Downstream::<K, Timed>::new();
        let out = timed.clone();
        let nulls = Arc::clone(&self.grouped.nulls);
        self.grouped
            .downstream
            .add(Arc::new(move |ctx, key, value| {
                // Kafka Streams' `KStreamSlidingWindowAggregate` skips a null value (and
                // a null key: the aggregation below drops it), counted.
                if nulls.is_null(&value) {
                    ctx.dropped_null_values += 1;
                    return Ok(());
                }
                let (Some((tp, offset)), Some((_, _, ts))) =
                    (ctx.record_coordinates(), ctx.record_time())
                else {
                    return Err(StreamError::Config(
                        "sliding windows take source records, not a table's updates".into(),
                    ));
                };
                if ts < 0 {
                    return Err(ctx.user_error(format!(
                        "sliding windows need a timestamp of 0 or more, not {ts}"
                    )));
                }
                if windows.is_late(ts, ctx.stream_time()) {
                    ctx.late_records += 1;
                    return Ok(());
                }
                let bytes = encode(&value)
                    .map_err(|e| ctx.user_error(format!("the value does not encode: {e}")))?;
                let batch = ctx
                    .partitions
                    .iter()
                    .zip(&ctx.ranges)
                    .map(|(p, (first, _))| (p.to_string(), *first))
                    .collect();
                let record = Buffered {
                    ts,
                    value: bytes,
                    at: Some((tp.to_string(), offset)),
                    // The stream time the record was read at: it counts only in the
                    // windows still open then (emit on update and on close alike).
                    seen: Some(ctx.stream_time()),
                    seq: 0,
                    known: true,
                };
                out.forward(
                    ctx,
                    key,
                    Timed {
                        record,
                        batch: Arc::new(batch),
                        exactly_once: ctx.transactions.is_some(),
                    },
                )
            }));
        let grouped = KGroupedStream::new(
            self.grouped.shared.clone(),
            timed,
            Arc::clone(&self.grouped.key_serde),
        );
        let table = grouped.aggregate_closing(
            store,
            Records::default,
            move |_, timed: Timed, mut buffer: Records| {
                buffer.batch = timed.batch;
                if let Some(floor) = buffer.floor {
                    // At least once: the windows as emitted before this write, in case it
                    // prunes records of another partition's batch (see `Records::park`).
                    let parking = !pruning.on() && !timed.exactly_once;
                    let before = (parking
                        && buffer.records.iter().any(|r| {
                            r.ts < floor.saturating_sub(windows.kept())
                                && r.at.as_ref().is_some_and(|at| buffer.elsewhere(at))
                        }))
                    .then(|| buffer.final_windows(windows));
                    // Records too old for any window that is still open are dropped, but
                    // not those whose windows may not have been emitted yet (written by a
                    // failed attempt of this batch), nor the records their windows hold.
                    let mut oldest = floor.saturating_sub(windows.kept());
                    for record in buffer.records.iter().filter(|r| buffer.unconfirmed(r)) {
                        let reach = record.ts.saturating_sub(windows.difference);
                        oldest = oldest.min(reach.saturating_sub(1));
                    }
                    // Emit-on-close: nor the records of a window not emitted yet (and the
                    // record just before it, which decides whether a right window exists).
                    if pruning.on() && buffer.records.iter().any(|r| r.ts < oldest) {
                        for (start, _) in buffer.final_windows(windows) {
                            oldest = oldest.min(start.saturating_sub(1));
                        }
                    }
                    // The windows no record on time can read any more are forgotten
                    // (Kafka Streams reads those starting from `t - 2 * difference`);
                    // emit on close keeps them all until they are emitted.
                    let difference = windows.difference;
                    let horizon = oldest;
                    let read = move |start: &i64| start.saturating_add(difference) >= horizon;
                    if let Some(members) = &mut buffer.members {
                        members.retain(|(start, _)| read(start));
                        // Nor the records that count in a window kept: Kafka Streams'
                        // window can hold a record before its start (a left window is
                        // made from the window that ends before it).
                        let kept: std::collections::HashSet<u64> = members
                            .iter()
                            .flat_map(|(_, m)| m.iter().copied())
                            .collect();
                        for record in buffer.records.iter().filter(|r| kept.contains(&r.seq)) {
                            oldest = oldest.min(record.ts);
                        }
                    }
                    if parking {
                        let first = buffer.from.map_or(i64::MIN, |from| from.saturating_add(1));
                        buffer.park(before.unwrap_or_default(), oldest, first);
                    }
                    if !pruning.on() {
                        buffer.created.retain(|(start, _)| read(start));
                    }
                    buffer.records.retain(|r| r.ts >= oldest);
                    buffer.from = Some(buffer.from.map_or(oldest, |from| from.max(oldest)));
                }
                // Kept in arrival order (the order the store folds the values in: by
                // partition, then offset), which is the order Kafka Streams adds them to
                // each window's aggregate; a record counts only in the windows open when
                // it was read, and creates the windows Kafka Streams creates.
                buffer.arrive_final(timed.record, windows);
                buffer
            },
            RecordsSerde,
            Some(Box::new(move |buffer: &Records| {
                closing.on().then(|| buffer.next_close(windows))
            })),
        );
        let store_index = table.lookup.as_ref().map(|l| l.store);
        if let Some(index) = store_index {
            lock(&self.grouped.shared).stores[index].fans_out = true;
        }
        let node = table.nodes.first().copied();
        let next = Downstream::<Windowed<K>, A>::new();
        let out = next.clone();
        let (init, adder, decode) = (Arc::new(init), Arc::new(adder), Arc::new(decode));
        let fold = {
            let (init, adder, decode) =
                (Arc::clone(&init), Arc::clone(&adder), Arc::clone(&decode));
            Arc::new(
                move |key: &K,
                      records: &mut dyn Iterator<Item = &Buffered>|
                      -> Result<A, StreamError> {
                    let mut aggregate = init();
                    for record in records {
                        let value = decode(record.value.as_deref()).map_err(|e| {
                            StreamError::Config(format!(
                                "a stored window record does not decode: {e}"
                            ))
                        })?;
                        aggregate = adder(key, value, aggregate);
                    }
                    Ok(aggregate)
                },
            )
        };
        let close = closer(
            Arc::clone(&self.grouped.key_serde),
            windows,
            fold,
            next.clone(),
        );
        table
            .updates()
            .add(Arc::new(move |ctx, key: K, buffer: Records| {
                if emitting.on() {
                    // Emitted once per window, when it closes (the closing pass).
                    return Ok(());
                }
                // The windows Kafka Streams holds for the buffered records, each with the
                // records that count in it (those read while it was open), whose records
                // are all buffered, as is the record just before them (which decides
                // whether a right window exists): every window this batch changed is one
                // of them.
                let first = buffer.from.map_or(i64::MIN, |from| from.saturating_add(1));
                // A window's update: the fold of its records' values, carrying its newest
                // record's time (as Kafka Streams).
                let emit = |ctx: &mut crate::topology::context::Ctx,
                            start: i64,
                            newest: i64,
                            values: &mut dyn Iterator<Item = Option<&[u8]>>|
                 -> Result<(), StreamError> {
                    let mut aggregate = init();
                    for value in values {
                        let value = decode(value).map_err(|e| {
                            StreamError::Config(format!(
                                "a stored window record does not decode: {e}"
                            ))
                        })?;
                        aggregate = adder(&key, value, aggregate);
                    }
                    if let Origin::Update { version, .. } = ctx.origin {
                        ctx.origin = Origin::Update {
                            version,
                            timestamp: newest,
                        };
                    }
                    let end = start.saturating_add(windows.difference).saturating_add(1);
                    let window = Windowed {
                        key: key.clone(),
                        start,
                        end,
                    };
                    out.forward(ctx, window, aggregate)
                };
                for (start, members) in buffer.final_windows(windows) {
                    if start < first {
                        continue;
                    }
                    let records = members.iter().map(|&i| &buffer.records[i]);
                    let newest = records.clone().map(|r| r.ts).fold(start, i64::max);
                    emit(ctx, start, newest, &mut records.map(|r| r.value.as_deref()))?;
                }
                // At least once: the parked windows of records this batch read (its retry
                // of a failed attempt), which a batch of another partition pruned.
                if ctx.transactions.is_none() && !buffer.parked.is_empty() {
                    let unconfirmed = |at: &(String, i64)| {
                        ctx.partitions
                            .iter()
                            .zip(&ctx.ranges)
                            .any(|(tp, (first, _))| tp.to_string() == at.0 && at.1 >= *first)
                    };
                    let due: Vec<&Parked> = buffer
                        .parked
                        .iter()
                        .filter(|p| p.by.iter().any(unconfirmed))
                        .collect();
                    for p in due {
                        let values = &mut p.values.iter().map(|v| v.as_deref());
                        emit(ctx, p.start, p.newest, values)?;
                    }
                }
                Ok(())
            }));
        let table = KTable::new(self.grouped.shared.clone(), next);
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
