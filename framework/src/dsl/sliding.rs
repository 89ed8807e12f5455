//! Sliding windows: per record, the window of its key's records in the `difference`
//! before it, as the "left" windows of Kafka Streams' `SlidingWindows` (every record closes
//! a window ending at its timestamp). Kafka Streams also creates a window starting just
//! after each record; here those are not produced.
//!
//! A key's recent records live in one state item (a general aggregate: exactly once, one
//! write per touched key per batch), and after each batch every buffered record's window
//! is emitted with the item's version: per key and window, the highest version carries the
//! current value. Records more than `difference + grace` older than the newest record of
//! the key as of the previous batch are late (ignored), and dropped from the item.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

use super::windowed::Windowed;
use super::{Downstream, KGroupedStream, KTable};
use crate::error::StreamError;
use crate::serdes::{Serde, SerdeError};

/// Sliding windows: how far back a record's window reaches, and a grace period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingWindows {
    difference: i64,
    grace: i64,
}

impl SlidingWindows {
    /// Windows `[t - difference, t]` ending at each record's timestamp `t`, and a grace
    /// period for out-of-order records (as Kafka Streams' `ofTimeDifferenceAndGrace`).
    pub fn of_time_difference_and_grace(difference: Duration, grace: Duration) -> Self {
        let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        SlidingWindows {
            difference: ms(difference),
            grace: ms(grace),
        }
    }
}

/// A key's buffered records `(timestamp, value bytes)`, by timestamp; `floor` is the newest
/// timestamp as stored before the batch (read back, not stored).
#[derive(Debug, Clone, Default)]
struct Records {
    records: Vec<(i64, Vec<u8>)>,
    floor: Option<i64>,
}

/// Stores [`Records`] as JSON `[[timestamp, "<value, base64>"], …]`.
struct RecordsSerde;

impl Serde<Records> for RecordsSerde {
    fn serialize(&self, value: &Records) -> Option<Vec<u8>> {
        self.try_serialize(value).ok().flatten()
    }

    fn try_serialize(&self, value: &Records) -> Result<Option<Vec<u8>>, SerdeError> {
        let rows: Vec<_> = value
            .records
            .iter()
            .map(|(ts, v)| serde_json::json!([ts, STANDARD.encode(v)]))
            .collect();
        serde_json::to_vec(&rows)
            .map(Some)
            .map_err(|e| SerdeError(format!("window records do not encode: {e}")))
    }

    fn deserialize(&self, data: Option<&[u8]>) -> Result<Records, SerdeError> {
        let bad = |e: String| SerdeError(format!("stored window records do not decode: {e}"));
        let rows: Vec<(i64, String)> = match data {
            None => Vec::new(),
            Some(bytes) => serde_json::from_slice(bytes).map_err(|e| bad(e.to_string()))?,
        };
        let mut records = Vec::with_capacity(rows.len());
        for (ts, value) in rows {
            records.push((ts, STANDARD.decode(value).map_err(|e| bad(e.to_string()))?));
        }
        let floor = records.iter().map(|r| r.0).max();
        Ok(Records { records, floor })
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
    /// Counts, per record, its key's records in the window ending at it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lambda_streams::driver::TestDriver;
    /// use lambda_streams::dsl::SlidingWindows;
    /// use lambda_streams::serdes::{DecimalI64, Utf8};
    /// use lambda_streams::StreamsBuilder;
    ///
    /// // Logins per user in the 10 s up to each login.
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
    ///     .map(|w, n| (format!("{}@{}", w.key, w.end - 1), n))
    ///     .to("login-bursts", Utf8, DecimalI64);
    /// let driver = TestDriver::new(builder.build());
    /// let mut logins = driver.input_topic("logins", Utf8, Utf8);
    /// for ts in [1_000, 4_000, 9_000, 30_000] {
    ///     logins.pipe_input_with_timestamp("u1", "ok".to_owned(), ts)?;
    /// }
    /// let out = driver.output_topic("login-bursts", Utf8, DecimalI64).read_key_values_to_map()?;
    /// assert_eq!(out["u1@9000"], 3); // 1 s, 4 s and 9 s
    /// assert_eq!(out["u1@30000"], 1);
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

    /// Aggregates, per record, its key's records in the window ending at it: from
    /// `init()`, adding each record of the window in time order with `adder(key, value,
    /// aggregate)`. The records are kept (encoded with `value_serde`) in one item per key,
    /// at most 400 KB: see the module documentation.
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

        // The records with their timestamps and encoded values.
        let timed = Downstream::<K, (i64, Vec<u8>)>::new();
        let out = timed.clone();
        self.grouped
            .downstream
            .add(Arc::new(move |ctx, key, value| {
                let (Some((tp, offset)), Some((_, _, ts))) =
                    (ctx.record_coordinates(), ctx.record_time())
                else {
                    return Err(StreamError::Config(
                        "sliding windows take source records, not a table's updates".into(),
                    ));
                };
                let bytes = encode(&value).map_err(|e| StreamError::User {
                    tp,
                    offset,
                    reason: format!("the value does not encode: {e}"),
                })?;
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
                let horizon = windows.difference.saturating_add(windows.grace);
                if let Some(floor) = buffer.floor {
                    let oldest = floor.saturating_sub(horizon);
                    if ts < oldest {
                        return buffer; // late
                    }
                    buffer
                        .records
                        .retain(|r| r.0 >= oldest.saturating_sub(windows.difference));
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
                let mut ends: Vec<i64> = buffer.records.iter().map(|r| r.0).collect();
                ends.dedup();
                let newest = ends.last().copied().unwrap_or(i64::MIN);
                let oldest = buffer
                    .floor
                    .unwrap_or(newest)
                    .max(newest)
                    .saturating_sub(windows.difference.saturating_add(windows.grace));
                for end in ends.into_iter().filter(|end| *end >= oldest) {
                    let start = end.saturating_sub(windows.difference);
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
