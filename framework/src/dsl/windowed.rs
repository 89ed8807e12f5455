//! Event-time windows: `KGroupedStream::windowed_by(TimeWindows)` and its aggregations.
//!
//! A record falls in every window `[start, start + size)` that contains its timestamp
//! (tumbling windows: one; hopping windows: `size / advance`), and no window starts before
//! 0, as in Kafka Streams. Each (key, window) is its own state item (DynamoDB sort key =
//! window start), with a TTL past the window's end, grace and retention, and at least the
//! retention past the wall-clock time of its last write (so that a replay of old data does
//! not write items that are already expired). The *stream time* of a source partition is the highest record timestamp
//! seen in it, persisted with the state so that a cold container knows it; a window is
//! closed once the stream time of the partition of the record reaches its end plus grace,
//! and a record for a closed window is dropped and counted (`BatchReport::late_records`,
//! metric `LateRecordsDropped`), as in Kafka Streams. As in Kafka Streams too, a window's
//! updates (and its emit-on-close result) carry its newest record time as timestamp, kept in
//! the item: a late record does not move it back (docs/state.md, "Windows").

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::KTable;
use super::grouped::{Aggregation, KGroupedStream, decode_aggregate};
use super::suppress::{FinalResults, alias_final, register_final};
use crate::error::StreamError;
use crate::serdes::Serde;
use crate::topology::context::{Ctx, ItemWindow};

/// Tumbling or hopping event-time windows, as Kafka Streams' `TimeWindows`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeWindows {
    size: i64,
    advance: i64,
    grace: i64,
    retention: i64,
}

impl TimeWindows {
    /// Tumbling windows of `size` (at least 1 ms), no grace, kept one day after they close.
    pub fn of_size(size: Duration) -> Self {
        let size = i64::try_from(size.as_millis()).unwrap_or(i64::MAX).max(1);
        TimeWindows {
            size,
            advance: size,
            grace: 0,
            retention: 86_400_000,
        }
    }

    /// Hopping windows: a new window every `advance` (between 1 ms and the size).
    pub fn advance_by(mut self, advance: Duration) -> Self {
        self.advance = i64::try_from(advance.as_millis())
            .unwrap_or(i64::MAX)
            .clamp(1, self.size);
        self
    }

    /// How long after its end a window still accepts out-of-order records.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = i64::try_from(grace.as_millis()).unwrap_or(i64::MAX);
        self
    }

    /// How long a closed window's item is kept before DynamoDB's TTL may delete it.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
        self
    }

    /// The window size in milliseconds.
    pub fn size_ms(&self) -> i64 {
        self.size
    }

    /// The start of every window that contains `timestamp`, earliest first.
    ///
    /// As Kafka Streams' `TimeWindows.windowsFor`, no window starts before 0: the first
    /// start is `max(0, timestamp - size + advance)` rounded down to a multiple of the
    /// advance, so a record at 1 s in 10 s windows advancing by 5 s is in `[0, 10 s)` only,
    /// not in `[-5 s, 5 s)`. A negative timestamp is in no window (the aggregation refuses
    /// such a record as poison before it gets here).
    pub fn window_starts(&self, timestamp: i64) -> Vec<i64> {
        let mut start = timestamp
            .saturating_sub(self.size)
            .saturating_add(self.advance)
            .max(0)
            / self.advance
            * self.advance;
        let mut starts = Vec::new();
        while start <= timestamp {
            starts.push(start);
            match start.checked_add(self.advance) {
                Some(next) => start = next,
                None => break,
            }
        }
        starts
    }

    /// Whether the window starting at `start` is closed at `stream_time`.
    pub fn is_closed(&self, start: i64, stream_time: i64) -> bool {
        start.saturating_add(self.size).saturating_add(self.grace) <= stream_time
    }

    /// When the window starting at `start` closes: its end plus grace (epoch ms).
    pub fn close_time(&self, start: i64) -> i64 {
        start.saturating_add(self.size).saturating_add(self.grace)
    }
}

/// When a windowed aggregation emits its results, as Kafka Streams' `EmitStrategy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EmitStrategy {
    /// After every batch that changed the window (the default): the latest value of a
    /// window, updated as records arrive.
    #[default]
    OnWindowUpdate,
    /// Once per window, its final value, when the window closes (the low watermark passes
    /// its end plus grace; a session's end plus gap plus grace), as Kafka Streams'
    /// `EmitStrategy.onWindowClose()` or `suppress(untilWindowCloses)`
    /// ([`KTable::suppress`]). For time windows see [`TimeWindowedKStream::emit_strategy`],
    /// for sessions [`SessionWindowedKStream::emit_strategy`](super::SessionWindowedKStream::emit_strategy),
    /// for sliding windows [`SlidingWindowedKStream::emit_strategy`](super::SlidingWindowedKStream::emit_strategy).
    OnWindowClose,
}

/// The windows of a windowed aggregation and whether it emits final results only.
#[derive(Clone)]
pub(crate) struct WindowSpec {
    pub(crate) windows: TimeWindows,
    pub(crate) emit: FinalResults,
}

impl WindowSpec {
    /// The windows of the current record that are still open in store `store`; the
    /// closed ones are counted as late. A record with a negative timestamp is refused (a
    /// poison record, named): Kafka Streams creates no window before 0 and drops such
    /// records, never silently here.
    ///
    /// Each window's TTL is [`expires_at`] of its close time, the retention and the wall
    /// clock now, so that an item written for old data (a replay) is not born expired.
    pub(crate) fn open_windows(
        &self,
        ctx: &mut Ctx,
        store: usize,
    ) -> Result<Vec<ItemWindow>, StreamError> {
        let Some((_, _, timestamp)) = ctx.record_time() else {
            return Ok(Vec::new());
        };
        if timestamp < 0 {
            return Err(ctx.user_error(format!(
                "time windows need a timestamp of 0 or more, not {timestamp}"
            )));
        }
        let now = ctx.close_time(store);
        let wall_ms = wall_clock_ms();
        let windows = &self.windows;
        let mut open = Vec::new();
        for start in windows.window_starts(timestamp) {
            if windows.is_closed(start, now) {
                ctx.late_records += 1;
            } else {
                let close = windows.close_time(start);
                open.push(ItemWindow {
                    start,
                    expires_at: expires_at(close, windows.retention, wall_ms),
                    close_at: self.emit.on().then_some(close),
                });
            }
        }
        Ok(open)
    }
}

/// The TTL (epoch seconds, as DynamoDB's TTL attribute) of a window item that closes at
/// `close_ms` (event time: end plus grace) and is kept `retention_ms` after, written at
/// `wall_ms` (wall clock): the later of close + retention and write time + retention,
/// rounded up to the next second.
///
/// DynamoDB deletes an item, and the stores' reads leave it out, once its TTL is behind
/// the *wall clock*, while a window closes in *event time*. With close + retention alone, a
/// replay of old data (a consumer starting from the oldest offset, or one lagging by more
/// than the retention) would write items that are expired as they are born: hidden from
/// reads at once and deleted while the window is still open. See docs/state.md, "Windows".
pub(crate) fn expires_at(close_ms: i64, retention_ms: i64, wall_ms: i64) -> i64 {
    let retention_ms = retention_ms.max(0);
    close_ms
        .saturating_add(retention_ms)
        .max(wall_ms.saturating_add(retention_ms))
        .div_euclid(1000)
        .saturating_add(1)
}

/// The wall clock, epoch milliseconds (0 if the system clock is before 1970).
fn wall_clock_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A key and the window it is aggregated in: the key of a windowed table.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Windowed<K> {
    /// The record key.
    pub key: K,
    /// The window start, epoch milliseconds (inclusive).
    pub start: i64,
    /// The window end, epoch milliseconds (exclusive).
    pub end: i64,
}

/// A grouped stream in event-time windows, ready for a windowed aggregation.
///
/// ```
/// use std::time::Duration;
/// use lambda_streams::driver::TestDriver;
/// use lambda_streams::dsl::TimeWindows;
/// use lambda_streams::serdes::{DecimalI64, Unit, Utf8};
/// use lambda_streams::StreamsBuilder;
/// use lambda_streams::dsl::Grouped;
///
/// // Page views per page per minute, with 10 s of grace.
/// let builder = StreamsBuilder::new();
/// builder
///     .stream("page-views", Unit, Utf8)
///     .group_by(|_, page: &String| page.clone(), Grouped::with(Utf8, Utf8))
///     .windowed_by(TimeWindows::of_size(Duration::from_secs(60)).grace(Duration::from_secs(10)))
///     .count("views-per-minute")
///     .to_stream()
///     .map(|w, n| (format!("{}@{}", w.key, w.start), n))
///     .to("views", Utf8, DecimalI64);
/// let driver = TestDriver::new(builder.build());
/// let mut views = driver.input_topic("page-views", Unit, Utf8);
/// views.pipe_input_with_timestamp((), "/home".to_owned(), 5_000).unwrap();
/// views.pipe_input_with_timestamp((), "/home".to_owned(), 59_000).unwrap();
/// views.pipe_input_with_timestamp((), "/home".to_owned(), 61_000).unwrap();
/// views.pipe_input_with_timestamp((), "/home".to_owned(), 75_000).unwrap(); // closes [0, 60 s)
/// views.pipe_input_with_timestamp((), "/home".to_owned(), 30_000).unwrap(); // late: dropped
/// let out = driver.output_topic("views", Utf8, DecimalI64).read_key_values_to_map().unwrap();
/// assert_eq!(out["/home@0"], 2);
/// assert_eq!(out["/home@60000"], 2);
/// assert_eq!(driver.last_report().unwrap().late_records, 1);
/// ```
pub struct TimeWindowedKStream<K, V> {
    grouped: KGroupedStream<K, V>,
    windows: TimeWindows,
    emit: EmitStrategy,
}

impl<K, V> TimeWindowedKStream<K, V>
where
    K: Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    pub(crate) fn new(grouped: KGroupedStream<K, V>, windows: TimeWindows) -> Self {
        TimeWindowedKStream {
            grouped,
            windows,
            emit: EmitStrategy::default(),
        }
    }

    /// When the aggregation emits: after every update (the default) or once per window
    /// when it closes ([`EmitStrategy::OnWindowClose`]).
    ///
    /// With `OnWindowClose`, a window closes when the *low watermark* passes its end plus
    /// grace: the lowest stream time over the source partitions, leaving out partitions
    /// whose stream time has not advanced for the idle timeout
    /// ([`BatchOptions::idle_partition_timeout`](crate::runtime::BatchOptions), 30 s by
    /// default), so that one quiet partition cannot hold every window open. The batch
    /// whose records move the low watermark emits the windows it closes, after its own
    /// output; each emitted record carries the window's final version, and a window is
    /// marked closed only after its record is acknowledged, so a retried batch emits it
    /// again with the same version (consumers keep the highest version per key:
    /// docs/state.md, "Emit on window close"). A record for a closed window is late:
    /// dropped and counted.
    ///
    /// Cost: the window items enter a sparse index (`closing`, keys only) when created
    /// and leave it when closed; closing reads the closed windows once (strongly
    /// consistent `BatchGetItem`) and writes each once. A batch of such a store queries
    /// the index once.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lambda_streams::driver::TestDriver;
    /// use lambda_streams::dsl::{EmitStrategy, TimeWindows};
    /// use lambda_streams::serdes::{DecimalI64, Unit, Utf8};
    /// use lambda_streams::StreamsBuilder;
    /// use lambda_streams::dsl::Grouped;
    ///
    /// let builder = StreamsBuilder::new();
    /// builder
    ///     .stream("page-views", Unit, Utf8)
    ///     .group_by(|_, page: &String| page.clone(), Grouped::with(Utf8, Utf8))
    ///     .windowed_by(TimeWindows::of_size(Duration::from_secs(60)).grace(Duration::from_secs(10)))
    ///     .emit_strategy(EmitStrategy::OnWindowClose)
    ///     .count("views-per-minute")
    ///     .to_stream()
    ///     .map(|w, n| (format!("{}@{}", w.key, w.start), n))
    ///     .to("views", Utf8, DecimalI64);
    /// let driver = TestDriver::new(builder.build());
    /// let mut views = driver.input_topic("page-views", Unit, Utf8);
    /// let mut out = driver.output_topic("views", Utf8, DecimalI64);
    /// views.pipe_input_with_timestamp((), "/home".to_owned(), 5_000).unwrap();
    /// views.pipe_input_with_timestamp((), "/home".to_owned(), 59_000).unwrap();
    /// views.pipe_input_with_timestamp((), "/home".to_owned(), 61_000).unwrap();
    /// assert!(out.read_key_values().unwrap().is_empty()); // [0, 60 s) is still open
    /// views.pipe_input_with_timestamp((), "/about".to_owned(), 70_000).unwrap(); // closes it
    /// assert_eq!(out.read_key_values().unwrap(), vec![("/home@0".to_owned(), 2)]);
    /// ```
    pub fn emit_strategy(mut self, emit: EmitStrategy) -> Self {
        self.emit = emit;
        self
    }

    /// The windows of a new aggregation, with its own final-results switch.
    fn spec(&self) -> WindowSpec {
        WindowSpec {
            windows: self.windows,
            emit: FinalResults::default(),
        }
    }

    /// Registers how store `index` (of `table`) switches to emit-on-close, and switches it
    /// when the strategy says so.
    fn set_emit<T: Clone + Send + Sync + 'static>(
        &self,
        index: usize,
        spec: &WindowSpec,
        table: &KTable<Windowed<K>, T>,
    ) {
        let (finals, size) = (spec.emit.clone(), self.windows.size);
        let node = table.nodes.first().copied();
        let switch = Arc::new(move |inner: &mut crate::topology::TopologyInner| {
            finals.set();
            inner.stores[index].emit_on_close = Some(size);
            // Its windows close on the stream times of the topics feeding it.
            if let Some(node) = node {
                inner.stores[index].closing = Some(crate::topology::Closing {
                    node,
                    topics: Default::default(),
                    close: None,
                    reads: None,
                });
            }
        });
        register_final(&self.grouped.shared, table.updates(), self.emit, switch);
    }

    fn table_key(&self) -> impl Fn(K, Option<i64>) -> Windowed<K> + Send + Sync + 'static {
        let size = self.windows.size;
        move |key, start| {
            let start = start.unwrap_or_default();
            Windowed {
                key,
                start,
                end: start.saturating_add(size),
            }
        }
    }

    /// Counts the records per key and window (one conditional `ADD` per touched window
    /// item per batch).
    pub fn count(&self, store: &str) -> KTable<Windowed<K>, i64> {
        let (index, table) =
            self.grouped
                .register(store, "windowed count", true, self.table_key(), |s| {
                    Ok(s.value)
                });
        let spec = self.spec();
        self.grouped.add_count(index, Some(spec.clone()));
        self.set_emit(index, &spec, &table);
        table
    }

    /// Aggregates the records per key and window, as
    /// [`KGroupedStream::aggregate`] does per key.
    pub fn aggregate<A>(
        &self,
        store: &str,
        init: impl Fn() -> A + Send + Sync + 'static,
        adder: impl Fn(&K, V, A) -> A + Send + Sync + 'static,
        aggregate_serde: impl Serde<A>,
    ) -> KTable<Windowed<K>, A>
    where
        A: Clone + Send + Sync + 'static,
    {
        let serde: Arc<dyn Serde<A>> = Arc::new(aggregate_serde);
        let aggregation = Arc::new(Aggregation {
            init: Box::new(init),
            adder: Box::new(adder),
            serde: Arc::clone(&serde),
            closes: None,
        });
        let (index, table) = self.grouped.register(
            store,
            "windowed aggregate",
            true,
            self.table_key(),
            move |state| decode_aggregate(&*serde, state),
        );
        let spec = self.spec();
        self.grouped
            .add_fold(index, aggregation, Some(spec.clone()));
        self.set_emit(index, &spec, &table);
        table
    }

    /// Combines the values per key and window, as Kafka Streams' windowed `reduce`: a
    /// window's first value is its aggregate, each later one is combined with
    /// `reducer(aggregate, value)`. Same costs and rules as [`aggregate`](Self::aggregate).
    pub fn reduce(
        &self,
        store: &str,
        reducer: impl Fn(V, V) -> V + Send + Sync + 'static,
        value_serde: impl Serde<V>,
    ) -> KTable<Windowed<K>, V> {
        let table = self.aggregate(
            store,
            || None,
            super::reduce_adder(reducer),
            crate::serdes::Nullable(value_serde),
        );
        let shared = table.shared.clone();
        let updates = table.updates().clone();
        let flat = table.flatten();
        alias_final(&shared, &updates, flat.updates());
        flat
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tumbling_and_hopping_windows_contain_the_timestamp() {
        let tumbling = TimeWindows::of_size(Duration::from_secs(60));
        assert_eq!(tumbling.window_starts(59_999), vec![0]);
        assert_eq!(tumbling.window_starts(60_000), vec![60_000]);
        let hopping =
            TimeWindows::of_size(Duration::from_secs(60)).advance_by(Duration::from_secs(20));
        assert_eq!(hopping.window_starts(65_000), vec![20_000, 40_000, 60_000]);
        assert_eq!(hopping.window_starts(-1), Vec::<i64>::new());
    }

    #[test]
    fn a_window_item_lives_the_retention_past_its_close_and_past_its_write() {
        let (day, now) = (86_400_000, 1_790_000_000_123);
        // Live data: the window closes after the write, so close + retention is later.
        assert_eq!(
            expires_at(now + 60_000, day, now),
            (now + 60_000 + day) / 1000 + 1
        );
        // A replay a month behind: close + retention is long past; the write time counts.
        let month_ago = now - 30 * day;
        assert_eq!(expires_at(month_ago, day, now), (now + day) / 1000 + 1);
        assert!(expires_at(month_ago, day, now) * 1000 > now + day);
        // No overflow at the edges.
        assert_eq!(expires_at(i64::MAX, i64::MAX, now), i64::MAX / 1000 + 1);
    }

    #[test]
    fn a_window_closes_at_end_plus_grace() {
        let windows = TimeWindows::of_size(Duration::from_secs(60)).grace(Duration::from_secs(10));
        assert!(!windows.is_closed(0, 69_999));
        assert!(windows.is_closed(0, 70_000));
    }
}
