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
//! once per delivery. One difference with Kafka Streams: a record that is not late is
//! added to all its windows, also to those that have closed already (Kafka Streams skips
//! those windows and counts one dropped record per window skipped). Records are kept for
//! `2 * difference + grace + 1` ms behind the newest record of the key, which covers every record
//! that is not late when a key's records come from one partition (`group_by_key`, or a
//! repartition topic); with direct re-keying from several partitions, a partition whose
//! stream time lags the key's newest record by more than `grace` can see windows without
//! the records already dropped. A record with a negative timestamp (none, for Kafka) is a
//! poison record.

use std::sync::Arc;
use std::time::Duration;

use super::state_codec::StateCodec;
use super::windowed::Windowed;
use super::{Downstream, KGroupedStream, KTable, lock};
use crate::error::StreamError;
use crate::serdes::{Serde, SerdeError};

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
    /// every window of a record that is not late, and for the record just before them.
    fn kept(&self) -> i64 {
        self.difference
            .saturating_mul(2)
            .saturating_add(self.grace)
            .saturating_add(1)
    }

    /// The starts of the windows of the records at `times` (sorted): each record's left
    /// window (from 0 at the earliest), and its right window when a later record is in it.
    fn starts(&self, times: &[i64]) -> Vec<i64> {
        let mut starts = Vec::with_capacity(times.len() * 2);
        for t in times {
            starts.push(t.saturating_sub(self.difference).max(0));
            // The first later record (the times are sorted) decides the right window.
            let right = t.saturating_add(1);
            let later = times.partition_point(|x| x <= t);
            if times
                .get(later)
                .is_some_and(|next| *next <= right.saturating_add(self.difference))
            {
                starts.push(right);
            }
        }
        starts.sort_unstable();
        starts.dedup();
        starts
    }
}

/// A key's buffered records `(timestamp, value bytes)`, by timestamp. `from`: every record
/// of the key at or after it is buffered (`None`: every record; earlier ones were dropped as
/// too old). `floor` is the newest timestamp as stored before the batch (read back, not
/// stored).
#[derive(Debug, Clone, Default)]
struct Records {
    records: Vec<(i64, Vec<u8>)>,
    from: Option<i64>,
    floor: Option<i64>,
}

/// Stores [`Records`] as JSON `{"from": <ms or null>, "records": [[timestamp, "<value,
/// base64>"], …]}`; reads back the bare array of records written by earlier versions too.
struct RecordsSerde;

/// The codec of [`Records`].
const RECORDS: StateCodec = StateCodec::new("window records");

/// The stored form of [`Records`] (no item yet: no records).
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
enum StoredRecords {
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
        let records = value
            .records
            .iter()
            .map(|(ts, v)| (*ts, RECORDS.encode_bytes(v)))
            .collect();
        let stored = StoredRecords::Kept {
            from: value.from,
            records,
        };
        RECORDS.encode(&stored)
    }

    fn deserialize(&self, data: Option<&[u8]>) -> Result<Records, SerdeError> {
        let stored: StoredRecords = RECORDS.decode(data)?;
        let (from, rows) = match stored {
            StoredRecords::Kept { from, records } => (from, records),
            StoredRecords::Bare(records) => (None, records),
        };
        let mut records = Vec::with_capacity(rows.len());
        for (ts, value) in rows {
            records.push((ts, RECORDS.decode_bytes(&value)?));
        }
        let floor = records.iter().map(|r| r.0).max();
        Ok(Records {
            records,
            from,
            floor,
        })
    }
}

/// A grouped stream in sliding windows, ready for an aggregation.
pub struct SlidingWindowedKStream<K, V> {
    grouped: KGroupedStream<K, V>,
    windows: SlidingWindows,
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
        }
    }
}

impl<K, V> SlidingWindowedKStream<K, V>
where
    K: Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
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
        self.aggregate_with(
            store,
            |_| Ok(Vec::new()),
            |_| Ok(()),
            || 0,
            |_, (), n: i64| n + 1,
        )
    }

    /// Aggregates the records of each key in each of its sliding windows: from `init()`,
    /// adding each record of the window in time order with `adder(key, value, aggregate)`.
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
            move |value| {
                value_serde
                    .try_serialize(value)
                    .map(Option::unwrap_or_default)
                    .map_err(|e| e.0)
            },
            move |bytes| decoder.deserialize(Some(bytes)).map_err(|e| e.0),
            init,
            adder,
        )
    }

    /// The aggregation, with the values kept as `encode` writes them and read back as
    /// `decode` does.
    fn aggregate_with<T, A>(
        &self,
        store: &str,
        encode: impl Fn(&V) -> Result<Vec<u8>, String> + Send + Sync + 'static,
        decode: impl Fn(&[u8]) -> Result<T, String> + Send + Sync + 'static,
        init: impl Fn() -> A + Send + Sync + 'static,
        adder: impl Fn(&K, T, A) -> A + Send + Sync + 'static,
    ) -> KTable<Windowed<K>, A>
    where
        A: Clone + Send + Sync + 'static,
    {
        let windows = self.windows;
        // Lateness needs the partitions' stream times, loaded and persisted with the state.
        lock(&self.grouped.shared).windowed = true;

        // The records with their timestamps and encoded values; the late ones are dropped.
        let timed = Downstream::<K, (i64, Vec<u8>)>::new();
        let out = timed.clone();
        self.grouped
            .downstream
            .add(Arc::new(move |ctx, key, value| {
                let Some((_, _, ts)) = ctx.record_time() else {
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
                out.forward(ctx, key, (ts, bytes))
            }));
        let grouped = KGroupedStream::new(
            self.grouped.shared.clone(),
            timed,
            Arc::clone(&self.grouped.key_serde),
        );
        let table = grouped.aggregate(
            store,
            Records::default,
            move |_, (ts, value): (i64, Vec<u8>), mut buffer: Records| {
                if let Some(floor) = buffer.floor {
                    let oldest = floor.saturating_sub(windows.kept());
                    buffer.records.retain(|r| r.0 >= oldest);
                    buffer.from = Some(buffer.from.map_or(oldest, |from| from.max(oldest)));
                }
                let at = buffer.records.partition_point(|r| r.0 <= ts);
                buffer.records.insert(at, (ts, value));
                buffer
            },
            RecordsSerde,
        );
        let next = Downstream::<Windowed<K>, A>::new();
        let out = next.clone();
        let (init, adder) = (Arc::new(init), Arc::new(adder));
        table
            .updates()
            .add(Arc::new(move |ctx, key: K, buffer: Records| {
                let times: Vec<i64> = buffer.records.iter().map(|r| r.0).collect();
                // The windows whose records are all buffered, as is the record just before
                // them (which decides whether a right window exists): every window this
                // batch changed is one of them.
                let first = buffer.from.map_or(i64::MIN, |from| from.saturating_add(1));
                for start in windows.starts(&times) {
                    let end = start.saturating_add(windows.difference);
                    if start < first {
                        continue;
                    }
                    let mut aggregate = init();
                    for (ts, bytes) in &buffer.records {
                        if (start..=end).contains(ts) {
                            let value = decode(bytes).map_err(|e| {
                                StreamError::Config(format!(
                                    "a stored window record does not decode: {e}"
                                ))
                            })?;
                            aggregate = adder(&key, value, aggregate);
                        }
                    }
                    let window = Windowed {
                        key: key.clone(),
                        start,
                        end: end.saturating_add(1),
                    };
                    out.forward(ctx, window, aggregate)?;
                }
                Ok(())
            }));
        KTable::new(self.grouped.shared.clone(), next)
    }
}
