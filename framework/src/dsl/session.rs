//! Session windows: per key, the records separated by less than an inactivity gap form a
//! session, as Kafka Streams' `SessionWindows`.
//!
//! All sessions of a key live in one state item (a general aggregate: exactly once, one
//! write per touched key per batch). A record within the gap of one or more sessions
//! extends them, merging those it bridges (with the user's merger); otherwise it starts
//! a session. After each batch the key's sessions are emitted, all with the item's
//! version: per key, the sessions carrying the highest version are the current ones (a
//! session merged away is not in that set; no tombstones are produced).
//!
//! Lateness is decided on the stream time of the record's partition (the highest timestamp
//! seen in it, persisted with the state like the time windows'), as in Kafka Streams: a
//! record more than gap + grace behind it is late, dropped and counted in
//! [`BatchReport::late_records`](crate::BatchReport::late_records) (metric `LateRecordsDropped`),
//! once per delivery. One difference with Kafka Streams, which looks at the session the
//! record would merge into: such a record is dropped here even when it falls within the gap
//! of a session still open (that would take the stored sessions, which are read only when
//! the item is written). A key's sessions are kept while they end less than `2 * gap + grace`
//! before the newest record of the key (any record that is not late can still merge with
//! them when a key's records come from one partition: `group_by_key`, or a repartition
//! topic), then dropped from the item, which keeps to its 400 KB. A session starts at its
//! earliest record, so no session starts before its records do (the hopping-window rule of
//! Kafka Streams, no window before 0, has nothing to cut here). Session items carry no TTL:
//! a key's sessions live in its one item, pruned as above.

use std::sync::Arc;
use std::time::Duration;

use super::state_codec::StateCodec;
use super::windowed::Windowed;
use super::{Downstream, KGroupedStream, KTable, lock};
use crate::error::StreamError;
use crate::serdes::{Serde, SerdeError};

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

/// One session: first and last record times, and its aggregate.
#[derive(Debug, Clone, PartialEq)]
struct Session<A> {
    start: i64,
    end: i64,
    aggregate: A,
}

/// A key's sessions, by start; `floor` is the newest record time as stored before the
/// batch (read back from the sessions, not stored).
#[derive(Debug, Clone)]
struct Sessions<A> {
    sessions: Vec<Session<A>>,
    floor: Option<i64>,
}

/// The codec of [`Sessions`].
const SESSIONS: StateCodec = StateCodec::new("sessions");

/// Stores [`Sessions`] as JSON: `[[start, end, "<aggregate, base64>"], …]`.
struct SessionsSerde<A>(Arc<dyn Serde<A>>);

impl<A: 'static> Serde<Sessions<A>> for SessionsSerde<A> {
    fn serialize(&self, value: &Sessions<A>) -> Option<Vec<u8>> {
        self.try_serialize(value).ok().flatten()
    }

    fn try_serialize(&self, value: &Sessions<A>) -> Result<Option<Vec<u8>>, SerdeError> {
        let mut rows = Vec::with_capacity(value.sessions.len());
        for s in &value.sessions {
            let bytes = self.0.try_serialize(&s.aggregate)?.unwrap_or_default();
            rows.push((s.start, s.end, SESSIONS.encode_bytes(&bytes)));
        }
        SESSIONS.encode(&rows)
    }

    fn deserialize(&self, data: Option<&[u8]>) -> Result<Sessions<A>, SerdeError> {
        let rows: Vec<(i64, i64, String)> = SESSIONS.decode(data)?;
        let mut sessions = Vec::with_capacity(rows.len());
        for (start, end, aggregate) in rows {
            let bytes = SESSIONS.decode_bytes(&aggregate)?;
            sessions.push(Session {
                start,
                end,
                aggregate: self.0.deserialize(Some(&bytes))?,
            });
        }
        let floor = sessions.iter().map(|s| s.end).max();
        Ok(Sessions { sessions, floor })
    }
}

/// A grouped stream in session windows, ready for an aggregation.
pub struct SessionWindowedKStream<K, V> {
    grouped: KGroupedStream<K, V>,
    windows: SessionWindows,
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
        }
    }
}

impl<K, V> SessionWindowedKStream<K, V>
where
    K: Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
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
    /// for ts in [0, 10_000, 100_000, 25_000] { // 25 s: out of order, joins the first session
    ///     clicks.pipe_input_with_timestamp("u1", "/".to_owned(), ts)?;
    /// }
    /// let out = driver.output_topic("session-clicks", Utf8, DecimalI64).read_key_values_to_map()?;
    /// assert_eq!(out["u1@0-25000"], 3);
    /// assert_eq!(out["u1@100000-100000"], 1);
    /// // More than gap + grace (90 s) behind the stream time (100 s): late, dropped, counted.
    /// clicks.pipe_input_with_timestamp("u1", "/".to_owned(), 5_000)?;
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

    /// Aggregates the records per key and session: a session starts as `init()`, each
    /// record is added with `adder(key, value, aggregate)`, and two sessions that a record
    /// bridges are combined with `merger(key, a, b)` (as Kafka Streams' session
    /// `aggregate(initializer, aggregator, merger)`). All of a key's sessions share one
    /// item (at most 400 KB); see the module documentation.
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
        let timed = Downstream::<K, (V, i64)>::new();
        let out = timed.clone();
        self.grouped
            .downstream
            .add(Arc::new(move |ctx, key, value| {
                let Some((_, _, ts)) = ctx.record_time() else {
                    return Err(StreamError::Config(
                        "session windows take source records, not a table's updates".into(),
                    ));
                };
                let close = ctx
                    .stream_time()
                    .saturating_sub(windows.gap)
                    .saturating_sub(windows.grace);
                if ts < close {
                    ctx.late_records += 1;
                    return Ok(());
                }
                out.forward(ctx, key, (value, ts))
            }));
        let grouped = KGroupedStream::new(
            self.grouped.shared.clone(),
            timed,
            Arc::clone(&self.grouped.key_serde),
        );
        let init = Arc::new(init);
        let table = grouped.aggregate(
            store,
            || Sessions {
                sessions: Vec::new(),
                floor: None,
            },
            move |key, (value, ts): (V, i64), mut all: Sessions<A>| {
                // Kept: the sessions that a record which is not late can merge with.
                let kept = windows.gap.saturating_mul(2).saturating_add(windows.grace);
                if let Some(floor) = all.floor {
                    let oldest = floor.saturating_sub(kept);
                    all.sessions.retain(|s| s.end >= oldest);
                }
                // The sessions within the gap of `ts` merge with the record.
                let (near, far): (Vec<Session<A>>, Vec<Session<A>>) =
                    all.sessions.into_iter().partition(|s| {
                        s.start.saturating_sub(windows.gap) <= ts
                            && ts <= s.end.saturating_add(windows.gap)
                    });
                let mut merged = Session {
                    start: ts,
                    end: ts,
                    aggregate: adder(key, value, init()),
                };
                for s in near {
                    merged = Session {
                        start: merged.start.min(s.start),
                        end: merged.end.max(s.end),
                        aggregate: merger(key, s.aggregate, merged.aggregate),
                    };
                }
                let mut sessions = far;
                sessions.push(merged);
                sessions.sort_by_key(|s| s.start);
                Sessions {
                    sessions,
                    floor: all.floor,
                }
            },
            SessionsSerde(Arc::new(aggregate_serde) as Arc<dyn Serde<A>>),
        );
        let next = Downstream::<Windowed<K>, A>::new();
        let out = next.clone();
        table
            .updates()
            .add(Arc::new(move |ctx, key: K, all: Sessions<A>| {
                for s in all.sessions {
                    let window = Windowed {
                        key: key.clone(),
                        start: s.start,
                        end: s.end,
                    };
                    out.forward(ctx, window, s.aggregate)?;
                }
                Ok(())
            }));
        KTable::new(self.grouped.shared.clone(), next)
    }
}
