//! Left and outer stream–stream joins ([`KStream::left_join_stream`],
//! [`KStream::outer_join_stream`]): both sides of a key in one item, closed on the lowest
//! stream time of the partitions feeding the join (its closing time), by the arrivals of
//! the key's records and by the closing pass at the end of every batch.

use std::panic::{AssertUnwindSafe, catch_unwind};

use super::*;
use crate::runtime::poison::failure;
use crate::state::ItemState;
use crate::topology::context::ClosingPoison;
use crate::topology::{CloseFn, Closing};

/// Which sides of a left or outer join emit their records that found no partner.
#[derive(Debug, Clone, Copy)]
pub(super) struct Outer {
    pub(super) this: bool,
    pub(super) other: bool,
}

impl Outer {
    pub(super) fn of(&self, side: u8) -> bool {
        if side == THIS { self.this } else { self.other }
    }

    /// Whether no side is outer (an inner join): no record is ever emitted alone, the
    /// items never enter the closing index and the join has no closing pass.
    pub(super) fn pairs_only(&self) -> bool {
        !self.this && !self.other
    }
}

/// The ids of left and outer joins, one per join built (its arrivals are counted per
/// join in a batch, [`Ctx::join_arrivals`]).
pub(super) static NEXT_JOIN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The side of this stream in a [`JoinState`] (the other stream's is 1).
pub(super) const THIS: u8 = 0;

/// A record kept in a key's [`JoinState`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Entry {
    /// [`THIS`] or 1 (the other stream).
    pub(super) side: u8,
    pub(super) ts: i64,
    pub(super) topic: String,
    pub(super) partition: i32,
    pub(super) offset: i64,
    #[serde(with = "base64_bytes")]
    pub(super) value: Option<Vec<u8>>,
    /// Whether it has joined a record of the other side.
    pub(super) matched: bool,
    /// Which of its source record's records at this side it is (0 unless a
    /// `flat_map_values` ahead of the join made several of one record).
    #[serde(default)]
    pub(super) seq: u32,
}

/// One side of an output: that record's encoded value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Part {
    #[serde(with = "base64_bytes")]
    pub(super) value: Option<Vec<u8>>,
}

/// Encoded values in a [`JoinState`] as base64 strings (a third of the size of JSON's
/// arrays of numbers, against the item's 400 KB).
pub(super) mod base64_bytes {
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(in crate::dsl::stream_join) fn serialize<S: Serializer>(
        value: &Option<Vec<u8>>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(bytes) => serializer.serialize_some(&STANDARD.encode(bytes)),
            None => serializer.serialize_none(),
        }
    }

    pub(in crate::dsl::stream_join) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Vec<u8>>, D::Error> {
        Option::<String>::deserialize(deserializer)?
            .map(|text| STANDARD.decode(text).map_err(serde::de::Error::custom))
            .transpose()
    }
}

/// An output of a key's join, attributed to the record whose arrival made it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Output {
    pub(super) topic: String,
    pub(super) partition: i32,
    pub(super) offset: i64,
    /// The side and [`Entry::seq`] of the arrival that emits it: one source record can
    /// arrive several times (at both sides of a self-join, or fanned out), and each
    /// arrival emits only its own outputs. `None` (an item written before this was
    /// kept): every arrival of the record.
    #[serde(default)]
    pub(super) by: Option<(u8, u32)>,
    /// Its timestamp: a pair's is the later of its two records', a record emitted
    /// alone keeps its own (as Kafka Streams). `None` (an item written before this was
    /// kept): the emitting record's.
    #[serde(default)]
    pub(super) ts: Option<i64>,
    pub(super) this: Option<Part>,
    pub(super) other: Option<Part>,
}

/// A key's left or outer join: the records of both sides still able to join, and the
/// outputs of the last write per source partition (emitted by the records they name,
/// after the write).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(super) struct JoinState {
    /// The highest closing time applied to the item so far (by an arrival or by the
    /// closing pass): the records whose window and grace it passed have left.
    pub(super) time: Option<i64>,
    pub(super) entries: Vec<Entry>,
    pub(super) outputs: Vec<Output>,
    /// The source partitions whose outputs this write has replaced (not stored).
    #[serde(skip)]
    pub(super) replaced: Vec<(String, i32)>,
}

/// Stores a [`JoinState`] as JSON.
/// The codec of [`JoinState`].
const JOIN_STATE: StateCodec = StateCodec::new("join state");

pub(super) struct JoinStateSerde;

impl Serde<JoinState> for JoinStateSerde {
    fn serialize(&self, value: &JoinState) -> Option<Vec<u8>> {
        self.try_serialize(value).ok().flatten()
    }

    fn try_serialize(&self, value: &JoinState) -> Result<Option<Vec<u8>>, SerdeError> {
        JOIN_STATE.encode(value)
    }

    fn deserialize(&self, data: Option<&[u8]>) -> Result<JoinState, SerdeError> {
        JOIN_STATE.decode(data)
    }
}

/// A record arriving at a left or outer join: its entry, the join's closing time at the
/// start of its batch, and the first offset of its partition in its batch.
#[derive(Debug, Clone)]
pub(super) struct Arrival {
    pub(super) entry: Entry,
    pub(super) close: i64,
    pub(super) batch_first: i64,
}

impl JoinState {
    /// Folds the arrival of `x`: the item's closing time moves to the batch's (if later);
    /// the records whose window and grace it passes leave (those that never joined, of an
    /// outer side, are emitted alone, by `x`); `x` joins the records of the other side
    /// within the window that remain; `x` stays unless its own window and grace have
    /// passed already (a record later than the grace).
    pub(super) fn arrive(mut self, x: Arrival, windows: JoinWindows, outer: Outer) -> Self {
        // The first write of this batch's records of the partition drops the outputs of
        // its earlier batches (the event source started this one after them, so they
        // succeeded), and keeps those of this batch: a retried batch (perhaps with a later
        // end) has its records emit them again.
        let source = (x.entry.topic.clone(), x.entry.partition);
        if !self.replaced.contains(&source) {
            self.outputs.retain(|o| {
                (o.topic.as_str(), o.partition) != (source.0.as_str(), source.1)
                    || o.offset >= x.batch_first
            });
            self.replaced.push(source);
        }
        let time = self.time.map_or(x.close, |t| t.max(x.close));
        self.time = Some(time);
        // A record of an outer side leaves when its window and grace close (emitted alone
        // if it never joined); an inner join keeps its records as long as Kafka Streams'
        // window store, for partners later than the grace.
        let pairs_only = outer.pairs_only();
        let closed = |e: &Entry| {
            if pairs_only {
                windows.expired(e.ts, time)
            } else {
                windows.closed(e.side == THIS, e.ts, time)
            }
        };
        let mut me = x.entry;
        let output = |this: Option<&Entry>, other: Option<&Entry>, by: &Entry, ts: i64| Output {
            topic: by.topic.clone(),
            partition: by.partition,
            offset: by.offset,
            by: Some((by.side, by.seq)),
            ts: Some(ts),
            this: this.map(|e| Part {
                value: e.value.clone(),
            }),
            other: other.map(|e| Part {
                value: e.value.clone(),
            }),
        };
        let alone = |e: &Entry, by: &Entry| {
            if e.side == THIS {
                output(Some(e), None, by, e.ts)
            } else {
                output(None, Some(e), by, e.ts)
            }
        };
        let (gone, mut kept): (Vec<Entry>, Vec<Entry>) = std::mem::take(&mut self.entries)
            .into_iter()
            .partition(|e| closed(e));
        for e in gone.iter().filter(|e| !e.matched && outer.of(e.side)) {
            self.outputs.push(alone(e, &me));
        }
        let (side, ts) = (me.side, me.ts);
        let joins = |e: &Entry| {
            e.side != side
                && if side == THIS {
                    windows.joins(ts, e.ts)
                } else {
                    windows.joins(e.ts, ts)
                }
        };
        // Partners in timestamp order, as Kafka Streams' window store returns them.
        kept.sort_by(|a, b| {
            (a.ts, &a.topic, a.partition, a.offset, a.side, a.seq).cmp(&(
                b.ts,
                &b.topic,
                b.partition,
                b.offset,
                b.side,
                b.seq,
            ))
        });
        for e in kept.iter_mut().filter(|e| joins(e)) {
            e.matched = true;
            me.matched = true;
            let ts = me.ts.max(e.ts);
            let pair = if me.side == THIS {
                output(Some(&me), Some(e), &me, ts)
            } else {
                output(Some(e), Some(&me), &me, ts)
            };
            self.outputs.push(pair);
        }
        if closed(&me) {
            if !me.matched && outer.of(me.side) {
                self.outputs.push(alone(&me, &me));
            }
        } else {
            kept.push(me);
        }
        self.entries = kept;
        self
    }

    /// When the item next closes: just past the window and grace of its earliest record
    /// of an outer side that has not joined (`None`: it holds no such record).
    pub(super) fn next_close(&self, windows: JoinWindows, outer: Outer) -> Option<i64> {
        self.entries
            .iter()
            .filter(|e| !e.matched && outer.of(e.side))
            .map(|e| windows.close_at(e.side == THIS, e.ts))
            .min()
    }

    /// Closes the item at the closing time `low`: the records whose window and grace it
    /// passes leave, and those of an outer side that never joined are returned, in
    /// timestamp order, to be emitted alone.
    pub(super) fn close(
        mut self,
        low: i64,
        windows: JoinWindows,
        outer: Outer,
    ) -> (Self, Vec<Entry>) {
        let time = self.time.map_or(low, |t| t.max(low));
        self.time = Some(time);
        let (gone, kept): (Vec<Entry>, Vec<Entry>) = std::mem::take(&mut self.entries)
            .into_iter()
            .partition(|e| windows.closed(e.side == THIS, e.ts, time));
        self.entries = kept;
        let mut alone: Vec<Entry> = gone
            .into_iter()
            .filter(|e| !e.matched && outer.of(e.side))
            .collect();
        alone.sort_by(|a, b| {
            (a.ts, a.side, &a.topic, a.partition, a.offset, a.seq).cmp(&(
                b.ts,
                b.side,
                &b.topic,
                b.partition,
                b.offset,
                b.seq,
            ))
        });
        (self, alone)
    }
}

impl<K, V> KStream<K, V>
where
    K: Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// Left-joins this stream with `other`, as Kafka Streams' `KStream::leftJoin(KStream,
    /// ValueJoiner, JoinWindows)` (3.1 and later): each pair of records with the same key
    /// whose timestamps differ by at most the window gives `joiner(key, this value,
    /// Some(other value))`, once; a record of this stream that joined no record gives
    /// `joiner(key, this value, None)`, once, as soon as it can no longer join one and not
    /// before: when the join's closing time passes its timestamp plus the window plus the
    /// grace. A record that joined is never emitted alone.
    ///
    /// The join's **closing time** is the lowest stream time of the source partitions
    /// feeding the join (both sides; with the idle-partition timeout of
    /// [`BatchOptions`](crate::BatchOptions), as emit-on-close windows, so that a quiet
    /// partition does not hold it forever), and it never moves back. Kafka Streams closes on
    /// the highest timestamp its task has seen, reading its partitions in timestamp order;
    /// an event source delivers every partition on its own, and a partition that lags may
    /// still deliver a partner within the grace, so here a record is emitted alone only once
    /// both sides are past its window and grace (docs/kafka-streams-differences.md). Every
    /// pair within the window is found, whichever side runs ahead, for records at most the
    /// grace behind their partition's stream time. A record later than that meets only the
    /// records still there, and one whose own window has closed already is emitted alone at
    /// once if it found no partner. A record whose key serializes to null joins nothing: on
    /// an outer side it is emitted alone at once (as Kafka Streams does since 3.7).
    ///
    /// Both sides' records of a key live in one state item of `store` (a general
    /// aggregate: exactly once), encoded with `serdes` (key, this value, other value), so
    /// every decision — which records join, which leave alone — is made once, in one
    /// conditional write. A record that arrives folds the records of its key whose window the
    /// closing time (as its batch started) has passed, and joins the other side's records
    /// within the window; the outputs of that write are kept in the item (until a later
    /// batch of the same source partition writes it) and emitted by the record they are
    /// attributed to, after the write (its `lambda-streams-source` header names it): a pair
    /// by the later of its two records (in processing order). The records of keys that get no
    /// later record close in the **closing pass** at the end of every batch: an item holding
    /// records of an outer side that joined nothing is in the table's `closing` index
    /// (`create_table`, `template.yaml`) with the time its earliest one expires; the pass
    /// reads the items whose time has come, emits their records alone through the join's
    /// downstream operators (with a version header, as a table update, not a source
    /// header), then rewrites each item without them on the condition that its version is
    /// the one read (two closers, or a closer and an arrival, write once; a crash between
    /// the emission and the write emits the same records again). Because those records have
    /// no source record, `build()` refuses the join's output fed into an aggregation, a
    /// repartition topic or another join: produce it with `to` and read it in another
    /// sub-topology.
    ///
    /// As in Kafka Streams, a pair's timestamp is the later of its two records', and a
    /// record emitted alone keeps its own. A record that reaches the join several times (a
    /// self-join, where it arrives at both sides, or a `flat_map_values` ahead of the join)
    /// emits each of its outputs once: each output names the arrival that emits it. Like
    /// every output of the framework, it is at least once: a retried batch (even one ending
    /// later) emits its outputs again, identical, as does a batch delivered again before a
    /// later batch of its partition wrote the key. Under exactly-once output
    /// (`LAMBDA_STREAMS_OUTPUT_GUARANTEE=exactly_once`) a `read_committed` consumer sees each
    /// pair and each record alone once: an arrival's outputs go in its record's
    /// transaction, and the closing pass's rewrite of the item claims what it emits
    /// (`runtime::claims`). The outputs of one batch for one key are part of the item, which
    /// holds at most 400 KB.
    ///
    /// Cost per batch: one conditional write per touched key, one batched read of the
    /// touched keys' items after the write, one query of the closing index, and one
    /// conditional write per item the closing pass closes.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lambda_streams::driver::TestDriver;
    /// use lambda_streams::dsl::JoinWindows;
    /// use lambda_streams::serdes::Utf8;
    /// use lambda_streams::StreamsBuilder;
    ///
    /// // Ad impressions with the click that follows within 10 s, or "none".
    /// let builder = StreamsBuilder::new();
    /// let impressions = builder.stream("impressions", Utf8, Utf8);
    /// let clicks = builder.stream("clicks", Utf8, Utf8);
    /// impressions
    ///     .left_join_stream(
    ///         &clicks,
    ///         JoinWindows::of(Duration::from_secs(10)).grace(Duration::from_secs(5)),
    ///         "impression-clicks",
    ///         (Utf8, Utf8, Utf8),
    ///         |_, ad: &String, click: Option<&String>| format!("{ad}->{}", click.map_or("none", |c| c.as_str())),
    ///     )
    ///     .to("attributed", Utf8, Utf8);
    /// let driver = TestDriver::new(builder.build());
    /// let mut shown = driver.input_topic("impressions", Utf8, Utf8);
    /// let mut clicked = driver.input_topic("clicks", Utf8, Utf8);
    /// let mut out = driver.output_topic("attributed", Utf8, Utf8);
    /// shown.pipe_input_with_timestamp("u1", "ad-1".to_owned(), 1_000)?;
    /// shown.pipe_input_with_timestamp("u1", "ad-2".to_owned(), 3_000)?;
    /// clicked.pipe_input_with_timestamp("u1", "buy".to_owned(), 12_000)?; // joins ad-2 only
    /// assert_eq!(out.read_values()?, ["ad-2->buy"]); // ad-1 could still meet a click
    /// // Both topics pass 1 s + 10 s + 5 s: ad-1 can no longer meet a click.
    /// shown.pipe_input_with_timestamp("u1", "ad-3".to_owned(), 30_000)?;
    /// assert_eq!(out.read_values()?, Vec::<String>::new()); // the clicks are at 12 s
    /// clicked.pipe_input_with_timestamp("u2", "view".to_owned(), 30_000)?;
    /// assert_eq!(out.read_values()?, ["ad-1->none"]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn left_join_stream<VO, VR, SK, SV, SO>(
        &self,
        other: &KStream<K, VO>,
        windows: JoinWindows,
        store: &str,
        serdes: (SK, SV, SO),
        joiner: impl Fn(&K, &V, Option<&VO>) -> VR + Send + Sync + 'static,
    ) -> KStream<K, VR>
    where
        VO: Clone + Send + Sync + 'static,
        VR: Clone + Send + Sync + 'static,
        SK: Serde<K>,
        SV: Serde<V>,
        SO: Serde<VO>,
    {
        let outer = Outer {
            this: true,
            other: false,
        };
        self.outer_join(
            other,
            windows,
            store,
            serdes,
            outer,
            "KSTREAM-LEFTJOIN",
            move |k, v, o| v.map(|v| joiner(k, v, o)),
        )
    }

    /// Outer-joins this stream with `other`, as Kafka Streams' `KStream::outerJoin(KStream,
    /// ValueJoiner, JoinWindows)` (3.1 and later): each pair of records with the same key
    /// whose timestamps differ by at most the window gives `joiner(key, Some(this value),
    /// Some(other value))`, once; a record of either side that joined no record gives
    /// `joiner(key, Some(this value), None)` or `joiner(key, None, Some(other value))`,
    /// once, when it can no longer join one (the join's closing time, the lowest stream time
    /// of the partitions feeding it, passes its timestamp plus the window plus the grace),
    /// and never when it joined. Closing time, state, costs and delivery as
    /// [`left_join_stream`](Self::left_join_stream).
    ///
    /// ```
    /// use std::time::Duration;
    /// use lambda_streams::driver::TestDriver;
    /// use lambda_streams::dsl::JoinWindows;
    /// use lambda_streams::serdes::Utf8;
    /// use lambda_streams::StreamsBuilder;
    ///
    /// // Orders and payments of the same id within 10 s; the unmatched ones of either side.
    /// let builder = StreamsBuilder::new();
    /// let orders = builder.stream("orders", Utf8, Utf8);
    /// let payments = builder.stream("payments", Utf8, Utf8);
    /// orders
    ///     .outer_join_stream(
    ///         &payments,
    ///         JoinWindows::of(Duration::from_secs(10)),
    ///         "order-payments",
    ///         (Utf8, Utf8, Utf8),
    ///         |_, o: Option<&String>, p: Option<&String>| {
    ///             format!("{}/{}", o.map_or("-", |o| o.as_str()), p.map_or("-", |p| p.as_str()))
    ///         },
    ///     )
    ///     .to("reconciled", Utf8, Utf8);
    /// let driver = TestDriver::new(builder.build());
    /// let mut order = driver.input_topic("orders", Utf8, Utf8);
    /// let mut payment = driver.input_topic("payments", Utf8, Utf8);
    /// payment.pipe_input_with_timestamp("o1", "paid".to_owned(), 1_000)?; // no order
    /// order.pipe_input_with_timestamp("o2", "book".to_owned(), 2_000)?;
    /// payment.pipe_input_with_timestamp("o2", "paid".to_owned(), 4_000)?;
    /// order.pipe_input_with_timestamp("o1", "pen".to_owned(), 30_000)?; // 29 s later
    /// payment.pipe_input_with_timestamp("o1", "late".to_owned(), 50_000)?; // -/paid
    /// order.pipe_input_with_timestamp("o3", "cup".to_owned(), 50_000)?; // pen/-
    /// let out = driver.output_topic("reconciled", Utf8, Utf8).read_key_values()?;
    /// let expected = [("o2", "book/paid"), ("o1", "-/paid"), ("o1", "pen/-")];
    /// assert_eq!(out, expected.map(|(k, v)| (k.to_owned(), v.to_owned())));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn outer_join_stream<VO, VR, SK, SV, SO>(
        &self,
        other: &KStream<K, VO>,
        windows: JoinWindows,
        store: &str,
        serdes: (SK, SV, SO),
        joiner: impl Fn(&K, Option<&V>, Option<&VO>) -> VR + Send + Sync + 'static,
    ) -> KStream<K, VR>
    where
        VO: Clone + Send + Sync + 'static,
        VR: Clone + Send + Sync + 'static,
        SK: Serde<K>,
        SV: Serde<V>,
        SO: Serde<VO>,
    {
        let outer = Outer {
            this: true,
            other: true,
        };
        self.outer_join(
            other,
            windows,
            store,
            serdes,
            outer,
            "KSTREAM-OUTERJOIN",
            move |k, v, o| Some(joiner(k, v, o)),
        )
    }

    /// A left or outer join: both sides' records per key in one [`JoinState`] item.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn outer_join<VO, VR, SK, SV, SO>(
        &self,
        other: &KStream<K, VO>,
        windows: JoinWindows,
        store: &str,
        serdes: (SK, SV, SO),
        outer: Outer,
        name: &str,
        joiner: impl Fn(&K, Option<&V>, Option<&VO>) -> Option<VR> + Send + Sync + 'static,
    ) -> KStream<K, VR>
    where
        VO: Clone + Send + Sync + 'static,
        VR: Clone + Send + Sync + 'static,
        SK: Serde<K>,
        SV: Serde<V>,
        SO: Serde<VO>,
    {
        let (key_serde, this, that) = sides(serdes);
        let id = NEXT_JOIN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let store_index = Arc::new(std::sync::OnceLock::new());
        let arrivals = self
            .buffered(&this, Arc::clone(&store_index))
            .arrivals(id, THIS)
            .merge(
                &other
                    .buffered(&that, Arc::clone(&store_index))
                    .arrivals(id, 1),
            );
        let pairs_only = outer.pairs_only();
        let closes: Option<crate::dsl::grouped::ClosesFn<JoinState>> = if pairs_only {
            None
        } else {
            Some(Box::new(move |state: &JoinState| {
                Some(state.next_close(windows, outer))
            }))
        };
        let table: KTable<K, JoinState> = arrivals
            .group_by_key(Arc::clone(&key_serde))
            .aggregate_closing(
                store,
                JoinState::default,
                move |_, x: Arrival, state: JoinState| state.arrive(x, windows, outer),
                JoinStateSerde,
                closes,
            );
        let Some(lookup) = table.lookup else {
            unreachable!("a key's aggregate can be looked up")
        };
        let join_store = lookup.store;
        let _ = store_index.set(join_store);
        let shared = self.shared();
        {
            let mut inner = lock(&shared);
            // The join closes on the partitions' persisted stream times.
            inner.windowed = true;
        }
        let next = Downstream::<K, VR>::new();
        let out = next.clone();
        let (this_serde, that_serde, joiner) = (
            Arc::clone(&this.serde),
            Arc::clone(&that.serde),
            Arc::new(joiner),
        );
        let close = (!pairs_only).then(|| {
            closer(
                Arc::clone(&key_serde),
                Arc::clone(&this_serde),
                Arc::clone(&that_serde),
                Arc::clone(&joiner) as Arc<OuterJoiner<K, V, VO, VR>>,
                windows,
                outer,
                next.clone(),
            )
        });
        arrivals
            .downstream()
            .add(Arc::new(move |ctx, key: K, x: Arrival| {
                let Some(encoded) = lookup.key_serde.serialize(&key) else {
                    // A null key joins nothing: on an outer side, the record is emitted alone
                    // (as Kafka Streams 3.7 and later do), in its place among the records
                    // waiting at the join, not ahead of them.
                    let (this_serde, that_serde, joiner, out) = (
                        Arc::clone(&this_serde),
                        Arc::clone(&that_serde),
                        Arc::clone(&joiner),
                        out.clone(),
                    );
                    return ctx.defer_null_key(
                        lookup.store,
                        Box::new(move |ctx: &mut Ctx, _| {
                            emit_null_key(
                                ctx,
                                &key,
                                &x,
                                outer,
                                &this_serde,
                                &that_serde,
                                &*joiner,
                                &out,
                            )
                        }),
                    );
                };
                let (lookup, this_serde, that_serde, joiner, out) = (
                    Arc::clone(&lookup),
                    Arc::clone(&this_serde),
                    Arc::clone(&that_serde),
                    Arc::clone(&joiner),
                    out.clone(),
                );
                ctx.defer(
                    lookup.store,
                    encoded,
                    Box::new(move |ctx: &mut Ctx, state| {
                        let Some(state) = state else {
                            return Ok(());
                        };
                        let state = (lookup.value)(&key, state)
                            .map_err(|e| {
                                StreamError::Config(format!("a join state does not decode: {e}"))
                            })?
                            .unwrap_or_default();
                        let by = &x.entry;
                        let decode_error = |e: SerdeError| {
                            stored_value_error(&by.topic, by.partition, by.offset, e)
                        };
                        for output in state.outputs.iter().filter(|o| {
                            (o.topic.as_str(), o.partition, o.offset)
                                == (by.topic.as_str(), by.partition, by.offset)
                                && o.by.is_none_or(|arrival| arrival == (by.side, by.seq))
                        }) {
                            let this_value = match &output.this {
                                Some(part) => Some(
                                    this_serde
                                        .deserialize(part.value.as_deref())
                                        .map_err(decode_error)?,
                                ),
                                None => None,
                            };
                            let that_value = match &output.other {
                                Some(part) => Some(
                                    that_serde
                                        .deserialize(part.value.as_deref())
                                        .map_err(decode_error)?,
                                ),
                                None => None,
                            };
                            if let Some(joined) =
                                joiner(&key, this_value.as_ref(), that_value.as_ref())
                            {
                                let ts = output.ts.unwrap_or(by.ts);
                                ctx.with_timestamp(ts, |ctx| {
                                    out.forward(ctx, key.clone(), joined)
                                })?;
                            }
                        }
                        Ok(())
                    }),
                )
            }));
        let node = {
            let mut inner = lock(&shared);
            let kind = NodeKind::Processor {
                stores: vec![store.to_owned()],
            };
            let node = inner
                .description
                .add_node(name, kind, &[self.node(), other.node()]);
            inner.roles.read(node, join_store);
            if !pairs_only {
                inner.roles.closes(node, join_store);
            }
            // The items prune on the join's closing time either way (from the partitions'
            // persisted stream times); only an outer side needs the closing pass.
            inner.stores[join_store].closing = Some(Closing {
                node,
                topics: Default::default(),
                close,
                reads: None,
            });
            node
        };
        KStream::from_node(shared, next, node)
    }
}

/// The closing pass of a left or outer join's items: decodes the item, closes it at the
/// closing time, emits the records that leave alone (as Kafka Streams, with their own
/// timestamps) through the join's downstream operators, and returns the item's new
/// aggregate and closing time.
fn closer<K, V, VO, VR>(
    key_serde: Arc<dyn Serde<K>>,
    this_serde: Arc<dyn Serde<V>>,
    that_serde: Arc<dyn Serde<VO>>,
    joiner: Arc<OuterJoiner<K, V, VO, VR>>,
    windows: JoinWindows,
    outer: Outer,
    out: Downstream<K, VR>,
) -> CloseFn
where
    K: Clone + Send + Sync + 'static,
    V: 'static,
    VO: 'static,
    VR: Clone + Send + Sync + 'static,
{
    Arc::new(
        move |ctx: &mut Ctx,
              key_bytes: &[u8],
              state: &ItemState,
              _: Option<&ItemState>,
              low: i64,
              emitted| {
            let corrupt = |what: &str, e: String| {
                StreamError::Config(format!("a join state's {what} does not decode: {e}"))
            };
            let stored = JoinStateSerde
                .deserialize(state.aggregate.as_deref())
                .map_err(|e| corrupt("state", e.0))?;
            let (closed, alone) = stored.close(low, windows, outer);
            if !alone.is_empty() {
                let key = key_serde
                    .deserialize(Some(key_bytes))
                    .map_err(|e| corrupt("key", e.0))?;
                for e in &alone {
                    let identity = format!(
                        "{}:{}:{}:{}:{}",
                        e.side, e.topic, e.partition, e.offset, e.seq
                    )
                    .into_bytes();
                    if !emitted.insert(identity) {
                        continue;
                    }
                    // A failure on this record (its stored value, the joiner, an operator
                    // after it) is a poison record of its own, not of the batch: its
                    // outputs so far are taken back and the policy decides
                    // (`Ctx::closing_poison`); the record leaves the item either way.
                    let before = ctx.outputs.len();
                    let result = catch_unwind(AssertUnwindSafe(|| {
                        let decode_error = |err: SerdeError| {
                            stored_value_error(&e.topic, e.partition, e.offset, err)
                        };
                        let value = e.value.as_deref();
                        let joined = if e.side == THIS {
                            let v = this_serde.deserialize(value).map_err(decode_error)?;
                            joiner(&key, Some(&v), None)
                        } else {
                            let o = that_serde.deserialize(value).map_err(decode_error)?;
                            joiner(&key, None, Some(&o))
                        };
                        match joined {
                            Some(joined) => ctx
                                .with_timestamp(e.ts, |ctx| out.forward(ctx, key.clone(), joined)),
                            None => Ok(()),
                        }
                    }));
                    let tp = TopicPartition::new(e.topic.as_str(), e.partition);
                    if let Some(error) = failure(result, &tp, e.offset)? {
                        ctx.outputs.truncate(before);
                        ctx.closing_poison.push(ClosingPoison {
                            error,
                            tp,
                            offset: e.offset,
                            key: key_bytes.to_vec(),
                            value: e.value.clone(),
                            timestamp: e.ts,
                        });
                    }
                }
            }
            let next = closed.next_close(windows, outer);
            let bytes = JoinStateSerde
                .try_serialize(&closed)
                .map_err(|e| corrupt("state", e.0))?
                .unwrap_or_default();
            Ok(Some((bytes, next)))
        },
    )
}

/// A left or outer join's joiner: the output of a pair or of a record alone (`None`: no
/// output).
pub(super) type OuterJoiner<K, V, VO, VR> =
    dyn Fn(&K, Option<&V>, Option<&VO>) -> Option<VR> + Send + Sync;

/// Emits a record whose key serialized to null alone, when its side is an outer one.
#[allow(clippy::too_many_arguments)]
pub(super) fn emit_null_key<K, V, VO, VR>(
    ctx: &mut Ctx,
    key: &K,
    x: &Arrival,
    outer: Outer,
    this_serde: &Arc<dyn Serde<V>>,
    that_serde: &Arc<dyn Serde<VO>>,
    joiner: &OuterJoiner<K, V, VO, VR>,
    out: &Downstream<K, VR>,
) -> Result<(), StreamError>
where
    K: Clone + Send + Sync + 'static,
    V: 'static,
    VO: 'static,
    VR: Clone + Send + Sync + 'static,
{
    let entry = &x.entry;
    if !outer.of(entry.side) {
        return Ok(());
    }
    let decode_error =
        |e: SerdeError| stored_value_error(&entry.topic, entry.partition, entry.offset, e);
    let value = entry.value.as_deref();
    let joined = if entry.side == THIS {
        let v = this_serde.deserialize(value).map_err(decode_error)?;
        joiner(key, Some(&v), None)
    } else {
        let o = that_serde.deserialize(value).map_err(decode_error)?;
        joiner(key, None, Some(&o))
    };
    match joined {
        Some(joined) => out.forward(ctx, key.clone(), joined),
        None => Ok(()),
    }
}

impl<K, V> KStream<K, (V, Buffered)>
where
    K: Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// The records of one side of a left or outer join (`join`: its id) as they arrive at
    /// its state, each numbered among its source record's arrivals at that side.
    pub(super) fn arrivals(&self, join: u64, side: u8) -> KStream<K, Arrival> {
        self.child(
            "KSTREAM-JOINSIDE",
            move |ctx, key, (_, b): (V, Buffered), out| {
                let seq = match ctx.record_time() {
                    Some((tp, offset, _)) => {
                        let count = ctx
                            .join_arrivals
                            .entry((join, side, tp, offset))
                            .or_insert(0);
                        *count += 1;
                        *count - 1
                    }
                    None => 0,
                };
                let entry = Entry {
                    side,
                    ts: b.ts,
                    topic: b.topic,
                    partition: b.partition,
                    offset: b.offset,
                    value: b.value,
                    matched: false,
                    seq,
                };
                let close = b.close;
                let batch_first = ctx
                    .record_time()
                    .and_then(|(tp, _, _)| ctx.ranges.get(tp as usize))
                    .map_or(entry.offset, |range| range.0);
                let arrival = Arrival {
                    entry,
                    close,
                    batch_first,
                };
                out.forward(ctx, key, arrival)
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arrival(side: u8, offset: i64, ts: i64, batch_first: i64) -> Arrival {
        Arrival {
            entry: Entry {
                side,
                ts,
                topic: if side == THIS { "l" } else { "r" }.to_owned(),
                partition: 0,
                offset,
                value: Some(vec![u8::try_from(offset).unwrap_or(0)]),
                matched: false,
                seq: 0,
            },
            close: ts,
            batch_first,
        }
    }

    /// A stored state read back for a new write (the `replaced` marks are not stored).
    fn stored(state: &JoinState) -> JoinState {
        let bytes = JoinStateSerde.serialize(state).unwrap_or_default();
        JoinStateSerde.deserialize(Some(&bytes)).unwrap_or_default()
    }

    fn offsets(state: &JoinState) -> Vec<(String, i64)> {
        state
            .outputs
            .iter()
            .map(|o| (o.topic.clone(), o.offset))
            .collect()
    }

    #[test]
    fn an_item_written_before_outputs_named_their_arrival_still_decodes() {
        // A join state as stored before `by`, `ts` and `seq` existed.
        let old = br#"{"time":5,"entries":[{"side":0,"ts":5,"topic":"l","partition":0,
            "offset":3,"value":"Bw==","matched":false}],"outputs":[{"topic":"l",
            "partition":0,"offset":3,"this":{"value":"Bw=="},"other":null}]}"#;
        let state = JoinStateSerde.deserialize(Some(old)).unwrap_or_default();
        assert_eq!(state.entries.len(), 1);
        assert_eq!(state.entries[0].seq, 0);
        // Emitted by every arrival of l:0:3, at the emitting record's timestamp.
        assert_eq!(state.outputs.len(), 1);
        assert_eq!((state.outputs[0].by, state.outputs[0].ts), (None, None));
    }

    #[test]
    fn values_are_stored_as_base64_and_read_back() {
        let state = JoinState::default().arrive(
            arrival(THIS, 7, 0, 0),
            JoinWindows::of(Duration::from_millis(5)),
            Outer {
                this: true,
                other: false,
            },
        );
        let bytes = JoinStateSerde.serialize(&state).unwrap_or_default();
        let text = String::from_utf8(bytes).unwrap_or_default();
        // [7] in base64.
        assert!(text.contains(r#""value":"Bw==""#), "{text}");
        assert_eq!(stored(&state).entries, state.entries);
    }

    #[test]
    fn a_retried_batch_keeps_its_outputs_and_a_later_batch_drops_them() {
        let windows = JoinWindows::of(Duration::from_millis(5));
        let outer = Outer {
            this: true,
            other: true,
        };
        // Batch 1 of partition l: l0@0, then r0@3 of partition r joins it.
        let state = JoinState::default()
            .arrive(arrival(THIS, 0, 0, 0), windows, outer)
            .arrive(arrival(1, 0, 3, 0), windows, outer);
        assert_eq!(offsets(&state), [("r".to_owned(), 0)]);
        // The batch of l is retried ending later: l1@20 (its first offset is still 0) leaves
        // r0's output in place and adds its own: r0 (3 + 5 < 20) leaves, joined: not alone.
        let state = stored(&state).arrive(arrival(THIS, 1, 20, 0), windows, outer);
        assert_eq!(offsets(&state), [("r".to_owned(), 0)]);
        // l2@40 of a later batch of l (first offset 2): l1 leaves alone, by l2.
        let state = stored(&state).arrive(arrival(THIS, 2, 40, 2), windows, outer);
        assert_eq!(offsets(&state), [("r".to_owned(), 0), ("l".to_owned(), 2)]);
        // A later batch of r (first offset 1) drops r0's output; r1@41 joins l2.
        let state = stored(&state).arrive(arrival(1, 1, 41, 1), windows, outer);
        assert_eq!(offsets(&state), [("l".to_owned(), 2), ("r".to_owned(), 1)]);
        assert_eq!(
            state.outputs[0].this,
            Some(Part {
                value: Some(vec![1])
            })
        );
        assert_eq!(
            state.outputs[1].this,
            Some(Part {
                value: Some(vec![2])
            })
        );
        assert_eq!(
            state.outputs[1].other,
            Some(Part {
                value: Some(vec![1])
            })
        );
        assert_eq!(state.outputs[0].other, None);
    }
}
