//! Stream–table joins with a grace period (Kafka Streams' `Joined.withGracePeriod`,
//! KIP-914): each stream record waits until the stream time passes its timestamp plus the
//! grace, then joins the versioned table's value as of its own timestamp, so that a table
//! update that arrives a little after the stream record it belongs to still joins it.
//!
//! The waiting records of a key live in one item of the join's own store (written exactly
//! once like every aggregate: a redelivered or retried record waits once). The item is in
//! the store's closing index at the earliest time one of its records is released (its
//! timestamp plus the grace), and the closing pass at the end of every batch releases what
//! the join's closing time has passed: the lowest stream time of the stream's source
//! partitions (with the idle-partition timeout), persisted, never moving back. The pass
//! reads the table's item of each key it closes (after the batch's writes), emits each
//! released record's join result, in timestamp order, then rewrites the item on a version
//! condition; after a conflict it reads the item again and emits only what it had not yet
//! (outputs are at least once, as every output of the framework; a crash between the
//! emission and the rewrite emits the same records again on the next pass; under
//! exactly-once output the rewrite claims what it releases, `runtime::claims`, and a
//! `read_committed` consumer sees each result once). A record later than the grace (its
//! timestamp plus the grace already passed) is released by the pass at the end of its own
//! batch.

use std::panic::{AssertUnwindSafe, catch_unwind};

use super::outer::{NEXT_JOIN, base64_bytes};
use super::*;
use crate::error::TopologyError;
use crate::runtime::poison::failure;
use crate::state::ItemState;
use crate::topology::context::ClosingPoison;
use crate::topology::{CloseFn, Closing};

/// A stream record waiting at a grace join.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Waiting {
    ts: i64,
    topic: String,
    partition: i32,
    offset: i64,
    /// Which of its source record's records at the join it is (0 unless a
    /// `flat_map_values` ahead of the join made several of one record).
    seq: u32,
    #[serde(with = "base64_bytes")]
    value: Option<Vec<u8>>,
}

/// A key's records waiting at a grace join, in arrival order.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct GraceState {
    waiting: Vec<Waiting>,
}

impl GraceState {
    /// When the item next releases a record: its earliest record's timestamp plus the
    /// grace (`None`: nothing waits).
    fn next_close(&self, grace: i64) -> Option<i64> {
        self.waiting
            .iter()
            .map(|w| w.ts.saturating_add(grace))
            .min()
    }

    /// Releases the records whose timestamp plus the grace the closing time `low` has
    /// reached (as Kafka Streams' buffer evicts `ts <= streamTime - grace`), in timestamp
    /// order (then by source, as they arrived).
    fn release(mut self, low: i64, grace: i64) -> (Self, Vec<Waiting>) {
        let (mut released, kept): (Vec<Waiting>, Vec<Waiting>) = std::mem::take(&mut self.waiting)
            .into_iter()
            .partition(|w| w.ts.saturating_add(grace) <= low);
        self.waiting = kept;
        released.sort_by(|a, b| {
            (a.ts, &a.topic, a.partition, a.offset, a.seq).cmp(&(
                b.ts,
                &b.topic,
                b.partition,
                b.offset,
                b.seq,
            ))
        });
        (self, released)
    }
}

/// The codec of [`GraceState`].
const GRACE_STATE: StateCodec = StateCodec::new("grace join state");

struct GraceStateSerde;

impl Serde<GraceState> for GraceStateSerde {
    fn serialize(&self, value: &GraceState) -> Option<Vec<u8>> {
        self.try_serialize(value).ok().flatten()
    }

    fn try_serialize(&self, value: &GraceState) -> Result<Option<Vec<u8>>, SerdeError> {
        GRACE_STATE.encode(value)
    }

    fn deserialize(&self, data: Option<&[u8]>) -> Result<GraceState, SerdeError> {
        GRACE_STATE.decode(data)
    }
}

/// A grace join's joiner: the output of a stream value and the table's value as of its
/// timestamp (`None`: no output).
type GraceJoiner<K, V, VT, VR> = dyn Fn(&K, V, Option<VT>) -> Option<VR> + Send + Sync;

impl<K, V> KStream<K, V>
where
    K: Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// Joins each record with the versioned `table`'s value of its key **as of the record's
    /// timestamp, after a grace period**, as Kafka Streams' `KStream::join(KTable,
    /// ValueJoiner, Joined.withGracePeriod(grace))` (KIP-914): a record waits, kept in
    /// `store`, until the stream time passes its timestamp plus `grace`; then it joins the
    /// table's value valid at its timestamp, so that a table update up to `grace` late
    /// still joins the stream records it belongs to. Records are released in timestamp
    /// order per key; a record whose key has no value then is dropped (an inner join); the
    /// others go on as `joiner(key, value, table_value)`, with the record's own timestamp.
    /// A record already later than the grace when it arrives joins at the end of its batch.
    ///
    /// The stream time is the lowest stream time of the partitions of the stream's source
    /// topics (with the idle-partition timeout of [`BatchOptions`](crate::BatchOptions), so
    /// that a quiet partition does not hold the join; Kafka Streams: the highest timestamp
    /// its task has seen), and a key that gets no later record still gets its results: the
    /// closing pass at the end of every batch releases them (docs/state.md, "Tables and
    /// joins"). A record whose key serializes to null has no table value: it is dropped and
    /// counted (`dropped_null_keys`). Its results have no source
    /// record, so, as a left or outer stream–stream join's, they can be produced with `to`
    /// but not aggregated, repartitioned or joined again in the same topology.
    ///
    /// `serdes` encode the key and the stream's values in `store`. [`try_build`] refuses the
    /// join when `table` is not versioned ([`StreamsBuilder::versioned_table`],
    /// [`KStream::to_versioned_table`], or a `filter` / `map_values` of one) or keeps less
    /// history than `grace`, with Kafka Streams' messages.
    ///
    /// Cost: one write per key per batch, one read of the closing index and, per key the
    /// pass releases, one read of the table's item and one conditional write.
    ///
    /// [`try_build`]: crate::StreamsBuilder::try_build
    /// [`StreamsBuilder::versioned_table`]: crate::StreamsBuilder::versioned_table
    ///
    /// ```
    /// use std::time::Duration;
    /// use lambda_streams::driver::TestDriver;
    /// use lambda_streams::serdes::Utf8;
    /// use lambda_streams::StreamsBuilder;
    ///
    /// let builder = StreamsBuilder::new();
    /// let prices = builder.versioned_table("prices", Utf8, Utf8, "prices", Duration::from_secs(60));
    /// builder
    ///     .stream("orders", Utf8, Utf8)
    ///     .join_with_grace(&prices, Duration::from_secs(5), "orders-waiting", (Utf8, Utf8),
    ///         |_, order: String, price: String| format!("{order} at {price}"))
    ///     .to("priced", Utf8, Utf8);
    /// let driver = TestDriver::new(builder.build());
    /// let mut orders = driver.input_topic("orders", Utf8, Utf8);
    /// orders.pipe_input_with_timestamp("tea", "1 cup".to_owned(), 10_000)?;
    /// // The price valid from 9 s arrives after the order: within the grace, so it joins.
    /// driver.input_topic("prices", Utf8, Utf8).pipe_input_with_timestamp("tea", "3".to_owned(), 9_000)?;
    /// assert!(driver.output_topic("priced", Utf8, Utf8).read_values()?.is_empty());
    /// orders.pipe_input_with_timestamp("cake", "1 slice".to_owned(), 15_000)?; // 10 s + 5 s passed
    /// assert_eq!(driver.output_topic("priced", Utf8, Utf8).read_values()?, ["1 cup at 3"]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn join_with_grace<VT, VR>(
        &self,
        table: &KTable<K, VT>,
        grace: Duration,
        store: &str,
        serdes: (impl Serde<K>, impl Serde<V>),
        joiner: impl Fn(&K, V, VT) -> VR + Send + Sync + 'static,
    ) -> KStream<K, VR>
    where
        VT: Clone + Send + Sync + 'static,
        VR: Clone + Send + Sync + 'static,
    {
        self.grace_join(
            "KSTREAM-JOIN",
            table,
            grace,
            store,
            serdes,
            false,
            move |key, value, found| found.map(|t| joiner(key, value, t)),
        )
    }

    /// [`join_with_grace`](Self::join_with_grace) keeping the records whose key has no
    /// table value at their timestamp (a left join, as Kafka Streams' `KStream::leftJoin(
    /// KTable, ValueJoiner, Joined.withGracePeriod(grace))`): every record goes on as
    /// `joiner(key, value, Some(table_value) or None)`. A record whose key serializes to
    /// null has no table value: it goes on at once, with `None`.
    pub fn left_join_with_grace<VT, VR>(
        &self,
        table: &KTable<K, VT>,
        grace: Duration,
        store: &str,
        serdes: (impl Serde<K>, impl Serde<V>),
        joiner: impl Fn(&K, V, Option<VT>) -> VR + Send + Sync + 'static,
    ) -> KStream<K, VR>
    where
        VT: Clone + Send + Sync + 'static,
        VR: Clone + Send + Sync + 'static,
    {
        self.grace_join(
            "KSTREAM-LEFTJOIN",
            table,
            grace,
            store,
            serdes,
            true,
            move |key, value, found| Some(joiner(key, value, found)),
        )
    }

    /// A stream–table join with a grace period: `f(key, value, table value as of the
    /// record's timestamp)` gives the output, or `None` for none.
    #[allow(clippy::too_many_arguments)]
    fn grace_join<VT, VR>(
        &self,
        prefix: &str,
        table: &KTable<K, VT>,
        grace: Duration,
        store: &str,
        (key_serde, value_serde): (impl Serde<K>, impl Serde<V>),
        left: bool,
        f: impl Fn(&K, V, Option<VT>) -> Option<VR> + Send + Sync + 'static,
    ) -> KStream<K, VR>
    where
        VT: Clone + Send + Sync + 'static,
        VR: Clone + Send + Sync + 'static,
    {
        let lookup: Arc<Lookup<K, VT>> = match &table.lookup {
            Some(lookup) => Arc::clone(lookup),
            None => panic!(
                "this table cannot be joined by key: it is a windowed aggregation's table or \
                 the result of a table-table join"
            ),
        };
        let grace = millis(grace);
        let key_serde: Arc<dyn Serde<K>> = Arc::new(key_serde);
        let value_serde: Arc<dyn Serde<V>> = Arc::new(value_serde);
        let joiner: Arc<GraceJoiner<K, V, VT, VR>> = Arc::new(f);
        let next = Downstream::<K, VR>::new();
        let id = NEXT_JOIN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // The records as they wait: their source, timestamp and encoded value; a null key
        // (no table value) goes on at once for a left join, and is dropped and counted for
        // an inner one.
        let (encode, keys, null_out, null_joiner) = (
            Arc::clone(&value_serde),
            Arc::clone(&key_serde),
            next.clone(),
            Arc::clone(&joiner),
        );
        let nulls = lock(&self.shared()).null_check::<V>();
        let waiting = self.child("KSTREAM-JOINGRACE", move |ctx, key: K, value: V, out| {
            // As `KStreamKTableJoinProcessor`: a record with a null value is skipped before
            // the buffer, counted.
            if nulls.is_null(&value) {
                ctx.dropped_null_values += 1;
                return Ok(());
            }
            if keys.serialize(&key).is_none() {
                if !left {
                    ctx.dropped_null_keys += 1;
                    return Ok(());
                }
                return match null_joiner(&key, value, None) {
                    Some(joined) => null_out.forward(ctx, key, joined),
                    None => Ok(()),
                };
            }
            let (Some((tp, offset)), Some((tp_index, _, ts))) =
                (ctx.record_coordinates(), ctx.record_time())
            else {
                return Err(StreamError::Config(
                    "a stream–table join with a grace period takes source records, not a \
                     table's updates"
                        .into(),
                ));
            };
            let bytes = encode.try_serialize(&value).map_err(|e| {
                ctx.user_error(format!("the joined value does not encode: {}", e.0))
            })?;
            let count = ctx
                .join_arrivals
                .entry((id, 0, tp_index, offset))
                .or_insert(0);
            *count += 1;
            let seq = *count - 1;
            let w = Waiting {
                ts,
                topic: tp.topic,
                partition: tp.partition,
                offset,
                seq,
                value: bytes,
            };
            out.forward(ctx, key, w)
        });
        lock(&waiting.shared())
            .roles
            .records_only(waiting.node(), "a stream–table join with a grace period");
        let buffer: KTable<K, GraceState> = waiting
            .group_by_key(Arc::clone(&key_serde))
            .aggregate_closing(
                store,
                GraceState::default,
                |_, w: Waiting, mut state: GraceState| {
                    state.waiting.push(w);
                    state
                },
                GraceStateSerde,
                Some(Box::new(move |state: &GraceState| {
                    Some(state.next_close(grace))
                })),
            );
        let Some(buffer_lookup) = buffer.lookup else {
            unreachable!("a key's aggregate can be looked up")
        };
        let buffer_store = buffer_lookup.store;
        let table_name = lock(&self.shared()).stores[lookup.store].name.clone();
        let close = closer(
            table_name,
            key_serde,
            value_serde,
            Arc::clone(&lookup),
            joiner,
            grace,
            next.clone(),
        );
        let shared = self.shared();
        let node = {
            let mut inner = lock(&shared);
            // The join releases on the partitions' persisted stream times.
            inner.windowed = true;
            let table_store = inner.stores[lookup.store].name.clone();
            let kind = NodeKind::Processor {
                stores: vec![store.to_owned(), table_store],
            };
            let node = inner.description.add_node(prefix, kind, &[self.node()]);
            inner.roles.read(node, buffer_store);
            inner.roles.read(node, lookup.store);
            inner.roles.closes(node, buffer_store);
            inner.stores[buffer_store].closing = Some(Closing {
                node,
                topics: Default::default(),
                close: Some(close),
                reads: Some(lookup.store),
            });
            let name = inner.description.name(node).to_owned();
            match &lookup.versioned {
                None => inner.refused.push(TopologyError::new(
                    name,
                    "KTable must be versioned to use a grace period in a stream table join.".into(),
                    "read the table with `builder.versioned_table(..)` or \
                     `to_versioned_table(..)`, or join without a grace period",
                )),
                Some(versioned) if versioned.retention < grace => {
                    inner.refused.push(TopologyError::new(
                        name,
                        "History retention must be at least grace period.".into(),
                        "give the versioned table a history retention of at least the grace \
                         period, or a shorter grace period",
                    ))
                }
                Some(_) => {}
            }
            node
        };
        KStream::from_node(shared, next, node)
    }
}

/// The closing pass of a grace join's items: releases the records the closing time has
/// passed, joins each with the table's value as of its timestamp (from the table's item,
/// read after the batch's writes), emits the results through the join's downstream
/// operators with the records' own timestamps, and returns the item's new state and next
/// closing time.
fn closer<K, V, VT, VR>(
    table_name: String,
    key_serde: Arc<dyn Serde<K>>,
    value_serde: Arc<dyn Serde<V>>,
    lookup: Arc<Lookup<K, VT>>,
    joiner: Arc<GraceJoiner<K, V, VT, VR>>,
    grace: i64,
    out: Downstream<K, VR>,
) -> CloseFn
where
    K: Clone + Send + Sync + 'static,
    V: 'static,
    VT: Clone + Send + Sync + 'static,
    VR: Clone + Send + Sync + 'static,
{
    Arc::new(
        move |ctx: &mut Ctx,
              key_bytes: &[u8],
              state: &ItemState,
              table: Option<&ItemState>,
              low: i64,
              emitted| {
            let corrupt = |what: &str, e: String| {
                StreamError::Config(format!("a grace join state's {what} does not decode: {e}"))
            };
            let stored = GraceStateSerde
                .deserialize(state.aggregate.as_deref())
                .map_err(|e| corrupt("state", e.0))?;
            let (kept, released) = stored.release(low, grace);
            if !released.is_empty() {
                let key = key_serde
                    .deserialize(Some(key_bytes))
                    .map_err(|e| corrupt("key", e.0))?;
                for w in &released {
                    let identity =
                        format!("{}:{}:{}:{}", w.topic, w.partition, w.offset, w.seq).into_bytes();
                    if !emitted.insert(identity) {
                        continue;
                    }
                    // A failure on this record (its stored value, the table's, the joiner, an
                    // operator after it) is a poison record of its own: its outputs so far
                    // are taken back and the policy decides; it leaves the item either way.
                    let before = ctx.outputs.len();
                    let result = catch_unwind(AssertUnwindSafe(|| {
                        let value = value_serde
                            .deserialize(w.value.as_deref())
                            .map_err(|e| stored_value_error(&w.topic, w.partition, w.offset, e))?;
                        let found = lookup.find_at(&key, table, w.ts, &table_name)?;
                        match joiner(&key, value, found) {
                            Some(joined) => ctx
                                .with_timestamp(w.ts, |ctx| out.forward(ctx, key.clone(), joined)),
                            None => Ok(()),
                        }
                    }));
                    let tp = TopicPartition::new(w.topic.as_str(), w.partition);
                    if let Some(error) = failure(result, &tp, w.offset)? {
                        ctx.outputs.truncate(before);
                        ctx.closing_poison.push(ClosingPoison {
                            error,
                            tp,
                            offset: w.offset,
                            key: key_bytes.to_vec(),
                            value: w.value.clone(),
                            timestamp: w.ts,
                        });
                    }
                }
            }
            let next = kept.next_close(grace);
            let bytes = GraceStateSerde
                .try_serialize(&kept)
                .map_err(|e| corrupt("state", e.0))?
                .unwrap_or_default();
            Ok(Some((bytes, next)))
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiting(ts: i64, offset: i64) -> Waiting {
        Waiting {
            ts,
            topic: "s".to_owned(),
            partition: 0,
            offset,
            seq: 0,
            value: Some(vec![1]),
        }
    }

    #[test]
    fn records_are_released_in_timestamp_order_once_the_grace_passed() {
        let state = GraceState {
            waiting: vec![waiting(5, 0), waiting(2, 1), waiting(9, 2), waiting(2, 3)],
        };
        assert_eq!(state.next_close(3), Some(5));
        let (kept, released) = state.release(8, 3);
        let order: Vec<i64> = released.iter().map(|w| w.offset).collect();
        assert_eq!(order, [1, 3, 0]);
        assert_eq!(kept.waiting, [waiting(9, 2)]);
        assert_eq!(kept.next_close(3), Some(12));
        let bytes = GraceStateSerde.serialize(&kept).unwrap_or_default();
        assert_eq!(
            GraceStateSerde
                .deserialize(Some(&bytes))
                .map(|s| s.waiting)
                .ok(),
            Some(vec![waiting(9, 2)])
        );
    }
}
