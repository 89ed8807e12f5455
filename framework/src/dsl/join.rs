//! Stream–table joins, and tables read from topics.
//!
//! A record reaching a join waits until the record pass of its batch is over; then the
//! table's values of every waiting key are read at once (strongly consistent
//! `BatchGetItem`, 100 keys a request), after the batch's own writes to the table's store,
//! and each record goes on with its table value. So a record joins the table as of the
//! end of its batch's writes to the table: a table topic consumed by the same function
//! (one event source for both topics) updates the table before the stream records of
//! the same batch are joined. Across event sources (the usual deployment: one per topic)
//! the order between a stream record and a table update is that of their invocations,
//! as in Kafka Streams without versioned stores. A versioned table
//! ([`StreamsBuilder::versioned_table`]) is read as of each stream record's timestamp
//! instead, and [`KStream::join_with_grace`] waits a grace period for late table updates.

use std::sync::{Arc, OnceLock};

use super::table::Lookup;
use super::{Downstream, KStream, KTable, StreamsBuilder, lock};
use crate::error::StreamError;
use crate::serdes::{Nullable, Serde, SerdeError};
use crate::state::ItemState;
use crate::topology::context::{Ctx, Origin};
use crate::topology::describe::{NodeId, NodeKind};
use crate::topology::{JoinWire, PendingTableJoin, Shared};

/// Why a table without a lookup cannot be a join's side (a composition the DSL refuses
/// when it is written, naming what to do instead).
const NOT_JOINABLE: &str = "this table cannot be joined by key: it is a windowed \
    aggregation's table or the result of a table-table join, which have no per-key lookup \
    (joining a joined table is not supported yet: produce the joined table's changelog to a \
    topic with `to_change_stream().to(..)` and read that topic as a table with \
    `builder.table(..)`)";

impl StreamsBuilder {
    /// Reads `topic` as a table, as Kafka Streams' `builder.table`: the latest value per
    /// key, kept in `store`; a record with a null value (a tombstone) deletes its key.
    /// Records with a null key are dropped and counted (`dropped_null_keys`).
    ///
    /// The table's updates flow on after each batch (deletions too, through
    /// [`KTable::to_change_stream`]), and
    /// streams can [`join`](KStream::join) it. Exactly once, like every aggregation: a
    /// redelivered or retried record changes the table once, and the latest offset of a
    /// partition wins.
    ///
    /// ```
    /// use lambda_streams::driver::TestDriver;
    /// use lambda_streams::serdes::Utf8;
    /// use lambda_streams::StreamsBuilder;
    ///
    /// let builder = StreamsBuilder::new();
    /// let customers = builder.table("customers", Utf8, Utf8, "customers");
    /// customers.to_stream().to("customer-changes", Utf8, Utf8);
    /// let driver = TestDriver::new(builder.build());
    /// let mut input = driver.input_topic("customers", Utf8, Utf8);
    /// input.pipe_input("c1", "Ada".to_owned())?;
    /// input.pipe_input("c1", "Ada Lovelace".to_owned())?;
    /// let changes = driver.output_topic("customer-changes", Utf8, Utf8);
    /// assert_eq!(changes.read_key_values_to_map()?["c1"], "Ada Lovelace");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn table<K, V>(
        &self,
        topic: &str,
        key_serde: impl Serde<K>,
        value_serde: impl Serde<V>,
        store: &str,
    ) -> KTable<K, V>
    where
        K: Clone + Send + Sync + 'static,
        V: Clone + Send + Sync + 'static,
    {
        let key_serde: Arc<dyn Serde<K>> = Arc::new(key_serde);
        let value_serde: Arc<dyn Serde<V>> = Arc::new(value_serde);
        self.stream(
            topic,
            Arc::clone(&key_serde),
            Nullable(Arc::clone(&value_serde)),
        )
        .stamped()
        .group_by_key(key_serde)
        .aggregate_closing(
            store,
            || (None, i64::MIN),
            |_, stamped: (Option<V>, i64), _| stamped,
            Present(value_serde),
            None,
        )
        .unstamp()
    }
}

/// A table's stored state: its value (`None`: deleted) and the timestamp of the record
/// that set it. Encoded as `2`, the timestamp (8 bytes, big endian), then the value's
/// bytes; or, for a deleted key, `3` and the timestamp (the item stays, with its
/// watermarks, so that a redelivered older record cannot bring the key back). Items
/// written before timestamps were kept (`1` then the value's bytes, `0` for a deleted
/// key) still decode, with the timestamp `i64::MIN` (not known).
struct Present<S>(S);

impl<V, S: Serde<V>> Serde<(Option<V>, i64)> for Present<S> {
    fn serialize(&self, value: &(Option<V>, i64)) -> Option<Vec<u8>> {
        self.try_serialize(value).ok().flatten()
    }

    fn try_serialize(&self, value: &(Option<V>, i64)) -> Result<Option<Vec<u8>>, SerdeError> {
        let (value, timestamp) = value;
        let bytes = match value {
            None => None,
            Some(v) => Some(self.0.try_serialize(v)?.unwrap_or_default()),
        };
        let mut out = Vec::with_capacity(9 + bytes.as_ref().map_or(0, Vec::len));
        out.push(if bytes.is_some() { 2 } else { 3 });
        out.extend_from_slice(&timestamp.to_be_bytes());
        out.extend_from_slice(bytes.as_deref().unwrap_or_default());
        Ok(Some(out))
    }

    fn deserialize(&self, data: Option<&[u8]>) -> Result<(Option<V>, i64), SerdeError> {
        let stamp = |rest: &[u8]| -> Option<(i64, usize)> {
            let bytes: [u8; 8] = rest.get(..8)?.try_into().ok()?;
            Some((i64::from_be_bytes(bytes), 8))
        };
        match data {
            None | Some([0]) => Ok((None, i64::MIN)),
            Some([1, rest @ ..]) => Ok((Some(self.0.deserialize(Some(rest))?), i64::MIN)),
            Some([tag @ (2 | 3), rest @ ..]) => {
                let (timestamp, at) = stamp(rest)
                    .ok_or_else(|| SerdeError("a stored table value is cut short".into()))?;
                let value = match tag {
                    2 => Some(self.0.deserialize(Some(&rest[at..]))?),
                    _ => None,
                };
                Ok((value, timestamp))
            }
            Some(_) => Err(SerdeError("not a stored table value".into())),
        }
    }
}

impl<K, V> KStream<K, V>
where
    K: Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// The stream as a table, as Kafka Streams' `KStream::toTable`: the latest value per
    /// key, kept in `store` (exactly once, like [`StreamsBuilder::table`]); records whose
    /// key serializes to null are dropped and counted.
    ///
    /// ```
    /// use lambda_streams::driver::TestDriver;
    /// use lambda_streams::serdes::Utf8;
    /// use lambda_streams::StreamsBuilder;
    ///
    /// let builder = StreamsBuilder::new();
    /// let last_page = builder
    ///     .stream("clicks", Utf8, Utf8)
    ///     .to_table("last-page", Utf8, Utf8);
    /// builder
    ///     .stream("purchases", Utf8, Utf8)
    ///     .join(&last_page, |_, item: String, page: String| format!("{item} after {page}"))
    ///     .to("attributed", Utf8, Utf8);
    /// let driver = TestDriver::new(builder.build());
    /// let mut clicks = driver.input_topic("clicks", Utf8, Utf8);
    /// clicks.pipe_input("u1", "/home".to_owned())?;
    /// clicks.pipe_input("u1", "/tea".to_owned())?;
    /// driver.input_topic("purchases", Utf8, Utf8).pipe_input("u1", "tea".to_owned())?;
    /// assert_eq!(driver.output_topic("attributed", Utf8, Utf8).read_values()?, ["tea after /tea"]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn to_table(
        &self,
        store: &str,
        key_serde: impl Serde<K>,
        value_serde: impl Serde<V>,
    ) -> KTable<K, V> {
        self.stamped()
            .group_by_key(key_serde)
            .aggregate_closing(
                store,
                || (None, i64::MIN),
                |_, (value, timestamp): (V, i64), _| (Some(value), timestamp),
                Present(value_serde),
                None,
            )
            .unstamp()
    }

    /// Each record's value with its timestamp (the source record's event time, or the
    /// table update's), for a table that keeps the timestamp of its values. No node of
    /// its own: it is part of the table's aggregation.
    fn stamped(&self) -> KStream<K, (V, i64)> {
        let next = Downstream::<K, (V, i64)>::new();
        let out = next.clone();
        self.downstream().add(Arc::new(move |ctx, key, value| {
            let timestamp = ctx.timestamp();
            out.forward(ctx, key, (value, timestamp))
        }));
        KStream::from_node(self.shared(), next, self.node())
    }

    /// Joins each record with `table`'s current value of its key (an inner join, as Kafka
    /// Streams' `KStream::join(KTable)`): a record whose key has no value in the table is
    /// dropped; the others go on as `joiner(key, value, table_value)`. A versioned table
    /// ([`StreamsBuilder::versioned_table`], or a `filter` / `map_values` of one) is read
    /// as of the record's timestamp, as Kafka Streams does.
    ///
    /// Cost: the table's values are read once per distinct key per batch, 100 keys a
    /// request (strongly consistent reads: 1 read unit per 4 KB item).
    ///
    /// # Panics
    /// When `table` is the table of a windowed aggregation (it cannot be joined by key):
    /// a programming error, caught when the topology is built.
    ///
    /// ```
    /// use lambda_streams::driver::TestDriver;
    /// use lambda_streams::serdes::Utf8;
    /// use lambda_streams::StreamsBuilder;
    ///
    /// let builder = StreamsBuilder::new();
    /// let names = builder.table("customers", Utf8, Utf8, "customers");
    /// builder
    ///     .stream("orders", Utf8, Utf8)
    ///     .join(&names, |_, order: String, name: String| format!("{order} for {name}"))
    ///     .to("named-orders", Utf8, Utf8);
    /// let driver = TestDriver::new(builder.build());
    /// driver.input_topic("customers", Utf8, Utf8).pipe_input("c1", "Ada".to_owned())?;
    /// let mut orders = driver.input_topic("orders", Utf8, Utf8);
    /// orders.pipe_input("c1", "tea".to_owned())?;
    /// orders.pipe_input("c2", "cake".to_owned())?; // no customer c2: dropped
    /// assert_eq!(
    ///     driver.output_topic("named-orders", Utf8, Utf8).read_key_values()?,
    ///     [("c1".to_owned(), "tea for Ada".to_owned())]
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn join<VT, VR>(
        &self,
        table: &KTable<K, VT>,
        joiner: impl Fn(&K, V, VT) -> VR + Send + Sync + 'static,
    ) -> KStream<K, VR>
    where
        VT: Clone + Send + Sync + 'static,
        VR: Clone + Send + Sync + 'static,
    {
        self.table_join("KSTREAM-JOIN", table, move |key, value, found| {
            found.map(|t| joiner(key, value, t))
        })
    }

    /// Joins each record with `table`'s current value of its key, keeping records without
    /// one (a left join, as Kafka Streams' `KStream::leftJoin(KTable)`): every record goes
    /// on as `joiner(key, value, Some(table_value) or None)`. Costs, and versioned tables, as
    /// [`join`](Self::join).
    ///
    /// ```
    /// use lambda_streams::driver::TestDriver;
    /// use lambda_streams::serdes::Utf8;
    /// use lambda_streams::StreamsBuilder;
    ///
    /// let builder = StreamsBuilder::new();
    /// let names = builder.table("customers", Utf8, Utf8, "customers");
    /// builder
    ///     .stream("orders", Utf8, Utf8)
    ///     .left_join(&names, |_, order: String, name: Option<String>| {
    ///         format!("{order} for {}", name.unwrap_or_else(|| "?".to_owned()))
    ///     })
    ///     .to("named-orders", Utf8, Utf8);
    /// let driver = TestDriver::new(builder.build());
    /// driver.input_topic("orders", Utf8, Utf8).pipe_input("c2", "cake".to_owned())?;
    /// assert_eq!(
    ///     driver.output_topic("named-orders", Utf8, Utf8).read_values()?,
    ///     ["cake for ?"]
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn left_join<VT, VR>(
        &self,
        table: &KTable<K, VT>,
        joiner: impl Fn(&K, V, Option<VT>) -> VR + Send + Sync + 'static,
    ) -> KStream<K, VR>
    where
        VT: Clone + Send + Sync + 'static,
        VR: Clone + Send + Sync + 'static,
    {
        self.table_join("KSTREAM-LEFTJOIN", table, move |key, value, found| {
            Some(joiner(key, value, found))
        })
    }

    /// A join with `table`: `f(key, value, table value)` gives the joined value, or
    /// `None` to drop the record.
    fn table_join<VT, VR>(
        &self,
        prefix: &str,
        table: &KTable<K, VT>,
        f: impl Fn(&K, V, Option<VT>) -> Option<VR> + Send + Sync + 'static,
    ) -> KStream<K, VR>
    where
        VT: Clone + Send + Sync + 'static,
        VR: Clone + Send + Sync + 'static,
    {
        let lookup: Arc<Lookup<K, VT>> = match &table.lookup {
            Some(lookup) => Arc::clone(lookup),
            None => panic!("{NOT_JOINABLE}"),
        };
        let (store_name, node) = {
            let mut inner = lock(&table.shared);
            let name = inner.stores[lookup.store].name.clone();
            let kind = NodeKind::Processor {
                stores: vec![name.clone()],
            };
            let node = inner.description.add_node(prefix, kind, &[self.node()]);
            inner.roles.read(node, lookup.store);
            inner.roles.lookup(node);
            (name, node)
        };
        let next = Downstream::<K, VR>::new();
        let out = next.clone();
        let f = Arc::new(f);
        let nulls = lock(&self.shared()).null_check::<V>();
        self.downstream()
            .add(Arc::new(move |ctx, key: K, value: V| {
                // Kafka Streams' `KStreamKTableJoinProcessor` skips a record with a null
                // value (inner and left joins: a null value has nothing to join), counted.
                if nulls.is_null(&value) {
                    ctx.dropped_null_values += 1;
                    return Ok(());
                }
                let Some(encoded) = lookup.key_serde.serialize(&key) else {
                    // A null key has no table value; it waits with the other records all
                    // the same, so that it does not overtake them.
                    let (out, f) = (out.clone(), Arc::clone(&f));
                    return ctx.defer_null_key(
                        lookup.store,
                        Box::new(move |ctx, _| match f(&key, value, None) {
                            Some(joined) => out.forward(ctx, key, joined),
                            None => Ok(()),
                        }),
                    );
                };
                let (lookup, out, f, store_name) = (
                    Arc::clone(&lookup),
                    out.clone(),
                    Arc::clone(&f),
                    store_name.clone(),
                );
                // A versioned table is read as of the stream record's timestamp.
                let timestamp = ctx.timestamp();
                ctx.defer(
                    lookup.store,
                    encoded,
                    Box::new(move |ctx, state| {
                        let found = lookup.find_at(&key, state, timestamp, &store_name)?;
                        match f(&key, value, found) {
                            Some(joined) => out.forward(ctx, key, joined),
                            None => Ok(()),
                        }
                    }),
                )
            }));
        KStream::from_node(self.shared(), next, node)
    }
}

impl<K, V> KTable<K, V>
where
    K: Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// Joins this table with `other` by key (an inner join, as Kafka Streams'
    /// `KTable::join(KTable)`): after a batch that changed a key in either table, if both
    /// tables hold a value for it, the joined table's update is `joiner(key, this, other)`.
    /// Each update carries as its version the sum of the two items' versions, which grows
    /// with every change of either side, so consumers can keep the highest version per
    /// key. Under exactly-once output (the builder's
    /// [`output_guarantee`](StreamsBuilder::output_guarantee), asked before or after the
    /// join is declared, or `LAMBDA_STREAMS_OUTPUT_GUARANTEE` when the builder is made: the
    /// guarantee the builder holds at `build`) each key's joined update is decided once in a
    /// store of the join's own
    /// (one more write per key a batch changes), and carries that item's version: each
    /// `(key, version)` once for a `read_committed` consumer, the highest one the join of
    /// the two tables' final values (docs/state.md, "Exactly-once output of table–table
    /// joins"). A deletion in either table deletes the joined key where it had a value (a
    /// deletion, seen in [`KTable::to_change_stream`]). Each update and deletion carries
    /// the later of the two sides' timestamps, as in Kafka Streams. The joined table
    /// cannot itself be joined.
    ///
    /// Cost: one batched read of the other table per key changed by a batch.
    ///
    /// # Panics
    /// When either table is the table of a windowed aggregation.
    ///
    /// ```
    /// use lambda_streams::driver::TestDriver;
    /// use lambda_streams::serdes::Utf8;
    /// use lambda_streams::StreamsBuilder;
    ///
    /// let builder = StreamsBuilder::new();
    /// let names = builder.table("names", Utf8, Utf8, "names");
    /// let cities = builder.table("cities", Utf8, Utf8, "cities");
    /// names
    ///     .join(&cities, |_, name: &String, city: &String| format!("{name} in {city}"))
    ///     .to_stream()
    ///     .to("profiles", Utf8, Utf8);
    /// let driver = TestDriver::new(builder.build());
    /// driver.input_topic("names", Utf8, Utf8).pipe_input("u1", "Ada".to_owned())?;
    /// let mut city = driver.input_topic("cities", Utf8, Utf8);
    /// city.pipe_input("u1", "London".to_owned())?;
    /// city.pipe_input("u1", "Paris".to_owned())?;
    /// assert_eq!(
    ///     driver.output_topic("profiles", Utf8, Utf8).read_values()?,
    ///     ["Ada in London", "Ada in Paris"]
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn join<VO, VR>(
        &self,
        other: &KTable<K, VO>,
        joiner: impl Fn(&K, &V, &VO) -> VR + Send + Sync + 'static,
    ) -> KTable<K, VR>
    where
        VO: Clone + Send + Sync + 'static,
        VR: Clone + Send + Sync + 'static,
    {
        self.join_tables(other, "KTABLE-JOIN", JoinKind::Inner, move |k, v, o| {
            Some(joiner(k, v?, o?))
        })
    }

    /// Joins this table with `other` by key, keeping the keys `other` lacks (a left join,
    /// as Kafka Streams' `KTable::leftJoin(KTable)`): after a batch that changed a key of
    /// this table, or of `other` where this table has a value, the update is
    /// `joiner(key, this, other or None)`. Versions and costs as [`join`](Self::join).
    pub fn left_join<VO, VR>(
        &self,
        other: &KTable<K, VO>,
        joiner: impl Fn(&K, &V, Option<&VO>) -> VR + Send + Sync + 'static,
    ) -> KTable<K, VR>
    where
        VO: Clone + Send + Sync + 'static,
        VR: Clone + Send + Sync + 'static,
    {
        self.join_tables(other, "KTABLE-LEFTJOIN", JoinKind::Left, move |k, v, o| {
            Some(joiner(k, v?, o))
        })
    }

    /// Joins this table with `other` by key, keeping the keys either table lacks (an outer
    /// join, as Kafka Streams' `KTable::outerJoin(KTable)`): after a batch that changed a
    /// key in either table, the update is `joiner(key, this or None, other or None)`, and
    /// the joined key is deleted once neither table has a value. Versions and costs as
    /// [`join`](Self::join).
    ///
    /// ```
    /// use lambda_streams::driver::TestDriver;
    /// use lambda_streams::serdes::{Nullable, Utf8};
    /// use lambda_streams::StreamsBuilder;
    ///
    /// let builder = StreamsBuilder::new();
    /// let names = builder.table("names", Utf8, Utf8, "names");
    /// let cities = builder.table("cities", Utf8, Utf8, "cities");
    /// names
    ///     .outer_join(&cities, |_, name: Option<&String>, city: Option<&String>| {
    ///         format!("{} in {}", name.map_or("?", |n| n), city.map_or("?", |c| c))
    ///     })
    ///     .to_change_stream()
    ///     .to("profiles", Utf8, Nullable(Utf8));
    /// let driver = TestDriver::new(builder.build());
    /// driver.input_topic("cities", Utf8, Utf8).pipe_input("u1", "Paris".to_owned())?;
    /// driver.input_topic("names", Utf8, Utf8).pipe_input("u1", "Ada".to_owned())?;
    /// driver.input_topic("cities", Utf8, Nullable(Utf8)).pipe_input("u1", None)?;
    /// assert_eq!(
    ///     driver.output_topic("profiles", Utf8, Nullable(Utf8)).read_values()?,
    ///     [Some("? in Paris".to_owned()), Some("Ada in Paris".to_owned()), Some("Ada in ?".to_owned())]
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn outer_join<VO, VR>(
        &self,
        other: &KTable<K, VO>,
        joiner: impl Fn(&K, Option<&V>, Option<&VO>) -> VR + Send + Sync + 'static,
    ) -> KTable<K, VR>
    where
        VO: Clone + Send + Sync + 'static,
        VR: Clone + Send + Sync + 'static,
    {
        self.join_tables(
            other,
            "KTABLE-OUTERJOIN",
            JoinKind::Outer,
            move |k, v, o| Some(joiner(k, v, o)),
        )
    }

    /// Both sides of a table–table join of `kind`: an update or deletion of either table
    /// meets the other table's value of the key (or none), read after the batch's writes;
    /// `f(key, this, other)` gives the joined value (called only with the sides the kind
    /// keeps: both for an inner join, this one for a left join, either for an outer one).
    /// A key whose joined value no longer exists is deleted. An inner join deletes it only
    /// where the other table has a value, had one in this batch, or (at least once) lost
    /// the key too (otherwise there was no joined value to delete, and Kafka Streams sends
    /// nothing either; see `OtherSide::deletes_inner` for the second loss); left and outer
    /// joins send the deletion whenever this table (or, outer, the last of the two) loses
    /// the key.
    ///
    /// As in Kafka Streams, a joined update or deletion carries the later of the changed
    /// side's timestamp and the other side's value's, when the other side has a value
    /// whose timestamp its table keeps (tables read from a topic or made by `to_table`);
    /// otherwise the changed side's.
    fn join_tables<VO, VR>(
        &self,
        other: &KTable<K, VO>,
        prefix: &str,
        kind: JoinKind,
        f: impl Fn(&K, Option<&V>, Option<&VO>) -> Option<VR> + Send + Sync + 'static,
    ) -> KTable<K, VR>
    where
        VO: Clone + Send + Sync + 'static,
        VR: Clone + Send + Sync + 'static,
    {
        // Under exactly-once output the two sides' changes go to the join's decision
        // store instead of the output (see `Decision`), connected when the topology is
        // built for that guarantee.
        let decisions = Arc::new(OnceLock::new());
        let out = Outputs {
            updates: Downstream::<K, VR>::new(),
            deletes: Downstream::<K, ()>::new(),
            decisions: Arc::clone(&decisions),
            flipped: false,
        };
        // `f` called only with the sides `kind` keeps.
        let joined = Arc::new(move |k: &K, v: Option<&V>, o: Option<&VO>| -> Option<VR> {
            let kept = match kind {
                JoinKind::Inner => v.is_some() && o.is_some(),
                JoinKind::Left => v.is_some(),
                JoinKind::Outer => v.is_some() || o.is_some(),
            };
            if kept { f(k, v, o) } else { None }
        });
        let (decided_this, decided_other) = (Arc::clone(&decisions), Arc::clone(&decisions));
        let (f1, f2, f3, f4) = (
            Arc::clone(&joined),
            Arc::clone(&joined),
            Arc::clone(&joined),
            Arc::clone(&joined),
        );
        let this_node = watch(
            self,
            other,
            &out,
            &format!("{prefix}THIS"),
            move |k, v, o| f1(k, Some(v), o).map_or(Joined::Nothing, Joined::Update),
            move |k, o: Option<&VO>, seen: OtherSide| match f2(k, None, o) {
                Some(value) => Joined::Update(value),
                None if kind == JoinKind::Inner
                    && o.is_none()
                    && !seen.deletes_inner(decided_this.get().is_some()) =>
                {
                    Joined::Nothing
                }
                None => Joined::Delete,
            },
        );
        let flipped = Outputs {
            flipped: true,
            ..out.clone()
        };
        let other_node = watch(
            other,
            self,
            &flipped,
            &format!("{prefix}OTHER"),
            move |k, o, v: Option<&V>| f3(k, v, Some(o)).map_or(Joined::Nothing, Joined::Update),
            move |k, v: Option<&V>, seen: OtherSide| match f4(k, v, None) {
                Some(value) => Joined::Update(value),
                // This table has the key (an inner join loses it) or, outer, neither has;
                // or, inner, this table lost it too (see `OtherSide::deletes_inner`).
                None if v.is_some() || kind == JoinKind::Outer => Joined::Delete,
                None if kind == JoinKind::Inner && seen.lost && decided_other.get().is_none() => {
                    Joined::Delete
                }
                None => Joined::Nothing,
            },
        );
        let (Some(this_lookup), Some(other_lookup)) = (self.lookup.clone(), other.lookup.clone())
        else {
            panic!("{NOT_JOINABLE}");
        };
        let sides = [this_node, other_node];
        let shared = self.shared.clone();
        let (updates, deletes) = (out.updates.clone(), out.deletes.clone());
        let wire: JoinWire = Box::new(move || {
            let downstream = Downstream::<K, Decision>::new();
            let _ = decisions.set(downstream.clone());
            decide(
                &shared,
                (this_lookup, other_lookup),
                downstream,
                sides,
                out,
                joined,
            )
        });
        // Connected when the topology is built, for the guarantee the builder holds then
        // (asked before or after the join): `connect_decisions`.
        lock(&self.shared)
            .table_joins
            .push(PendingTableJoin { sides, wire });
        let nodes = sides.to_vec();
        KTable::from_nodes(self.shared.clone(), updates, nodes).with_deletes(deletes)
    }
}

/// Under exactly-once output, a table–table join's table from its decisions (`decisions`,
/// from the nodes `sides`): a store of one item per key holding the latest decision (the
/// one made from the highest sum of the two sides' versions) with the two sides' states it
/// was made from, written attributed to the outbox entries of the updates that caused it.
/// The joined table's updates are that store's, from its outbox, each value computed again
/// from the states the decision keeps (`joined`). Returns the nodes that emit them.
fn decide<K, V, VO, VR>(
    shared: &Shared,
    (this_lookup, other_lookup): Lookups<K, V, VO>,
    decisions: Downstream<K, Decision>,
    sides: [NodeId; 2],
    out: Outputs<K, VR>,
    joined: Arc<JoinFn<K, V, VO, VR>>,
) -> Vec<NodeId>
where
    K: Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    VO: Clone + Send + Sync + 'static,
    VR: Clone + Send + Sync + 'static,
{
    let (store, names) = {
        let inner = lock(shared);
        let name = |i: usize| inner.stores[i].name.clone();
        (
            format!("{}.{}", inner.description.name(sides[0]), sides[1]),
            (name(this_lookup.store), name(other_lookup.store)),
        )
    };
    let decided = KStream::new(shared.clone(), decisions, &sides)
        .group_by_key(Arc::clone(&this_lookup.key_serde))
        .aggregate_closing(
            &store,
            Decision::none,
            |_, mut decision: Decision, latest: Decision| {
                // The decision made from the newest states of the two sides wins: a
                // lookup overtaken by a later change of the key changes nothing. Of
                // two made from the same states (both sides changed in one batch),
                // one that emits wins over one that does not (a deletion of an inner
                // join is sent by the side that lost the key, not by the other).
                if decision.sum < latest.sum
                    || (decision.sum == latest.sum && latest.outcome != Decision::NOTHING)
                {
                    return latest;
                }
                // A join without a value where the last decision emitted one deletes
                // it, whatever the side that changed saw. Each side's change decides
                // "nothing" when it finds the other side gone (that side's change
                // would have sent the deletion), but when the two sides lose the key
                // in concurrent batches (two partitions, or a retry after the other
                // side's batch), each may find the other gone, and neither sends it.
                if decision.outcome == Decision::NOTHING && latest.outcome == Decision::UPDATE {
                    decision.outcome = Decision::DELETE;
                }
                decision
            },
            DecisionSerde,
            None,
        );
    {
        let mut inner = lock(shared);
        for &node in &decided.nodes {
            inner.roles.decides(node);
        }
    }
    let (updates, deletes) = (out.updates.clone(), out.deletes.clone());
    decided
        .updates()
        .add(Arc::new(move |ctx, key: K, decision: Decision| {
            let forward = |ctx: &mut Ctx| match decision.outcome {
                Decision::UPDATE => {
                    let this = this_lookup.find(&key, decision.this.as_ref(), &names.0)?;
                    let other = other_lookup.find(&key, decision.other.as_ref(), &names.1)?;
                    match joined(&key, this.as_ref(), other.as_ref()) {
                        Some(value) => updates.forward(ctx, key.clone(), value),
                        None => Ok(()),
                    }
                }
                Decision::DELETE => deletes.forward(ctx, key.clone(), ()),
                _ => Ok(()),
            };
            ctx.with_update_timestamp(decision.timestamp, forward)
        }));
    decided.nodes.clone()
}

/// Under exactly-once output, connects the decision store of every table–table join and
/// moves the operators reading the join's two sides to read the store's updates; at least
/// once, the joins emit straight from the two tables' writes. Either way the form follows
/// the guarantee the builder holds at `build`, whenever it was asked.
pub(crate) fn connect_decisions(shared: &Shared) {
    let pending = {
        let mut inner = lock(shared);
        let pending = std::mem::take(&mut inner.table_joins);
        if inner.output != crate::sink::OutputGuarantee::ExactlyOnce {
            return;
        }
        pending
    };
    for join in pending {
        let before = lock(shared).description.len();
        let nodes = (join.wire)();
        lock(shared)
            .description
            .reparent_all(&join.sides, &nodes, before);
    }
}

/// How a table–table join reads its two tables (this one's, the other's).
type Lookups<K, V, VO> = (Arc<Lookup<K, V>>, Arc<Lookup<K, VO>>);

/// A table–table join's joiner, called with the sides its kind keeps.
type JoinFn<K, V, VO, VR> = dyn Fn(&K, Option<&V>, Option<&VO>) -> Option<VR> + Send + Sync;

/// Under exactly-once output, a table–table join's decision for a key: what it emits, made
/// once from the two sides' items as they were read, and kept in the join's store.
///
/// Without it, a joined update is derived from the changed side's update (kept in its
/// outbox) and the other side's item as the batch reads it. A retry after an aborted
/// transaction re-emits the update from the outbox but reads the other side again, and
/// two changes of a key on both sides (two partitions, or one batch) both read the same
/// pair of states: the output would carry one `(key, version)` twice, or two values with
/// one version (the version was the sum of the two sides' versions). With the decision
/// kept in one item per key, written attributed to the outbox entry of the update that
/// caused it, a retry or a zombie finds the decision made (the item's watermark) and emits
/// it from the item's own outbox; the item's version numbers the joined updates of a key
/// 1, 2, 3, ... once each.
#[derive(Clone, Debug)]
pub(crate) struct Decision {
    /// The sum of the two sides' item versions it was made from (0: none yet). Each side's
    /// version only grows, so the decision made last from the newest states has the
    /// highest sum: the store keeps the decision of the highest sum.
    sum: u64,
    /// What it emits: [`Decision::UPDATE`], [`Decision::DELETE`] or nothing.
    outcome: u8,
    /// The timestamp its output carries (the later of the two sides', as Kafka Streams).
    timestamp: i64,
    /// This table's item and the other table's, as read (`None`: no item).
    this: Option<ItemState>,
    other: Option<ItemState>,
}

impl Decision {
    /// Emits nothing.
    const NOTHING: u8 = 0;
    /// Emits the joiner's value of the two sides.
    const UPDATE: u8 = 1;
    /// Emits a deletion.
    const DELETE: u8 = 2;

    /// No decision yet.
    fn none() -> Self {
        Decision {
            sum: 0,
            outcome: Self::NOTHING,
            timestamp: i64::MIN,
            this: None,
            other: None,
        }
    }
}

/// Encodes a [`Decision`]: the sum (8 bytes, big endian), the outcome (1), the timestamp
/// (8), then each side's item: a presence byte, then its value, version (8 each), a
/// timestamp presence byte and the timestamp (8), an aggregate presence byte and the
/// aggregate (4-byte length, bytes).
struct DecisionSerde;

impl Serde<Decision> for DecisionSerde {
    fn serialize(&self, value: &Decision) -> Option<Vec<u8>> {
        let mut out = Vec::with_capacity(64);
        out.extend_from_slice(&value.sum.to_be_bytes());
        out.push(value.outcome);
        out.extend_from_slice(&value.timestamp.to_be_bytes());
        for state in [&value.this, &value.other] {
            let Some(state) = state else {
                out.push(0);
                continue;
            };
            out.push(1);
            out.extend_from_slice(&state.value.to_be_bytes());
            out.extend_from_slice(&state.version.to_be_bytes());
            match state.timestamp {
                Some(t) => {
                    out.push(1);
                    out.extend_from_slice(&t.to_be_bytes());
                }
                None => out.push(0),
            }
            match &state.aggregate {
                Some(bytes) => {
                    out.push(1);
                    out.extend_from_slice(&u32::try_from(bytes.len()).ok()?.to_be_bytes());
                    out.extend_from_slice(bytes);
                }
                None => out.push(0),
            }
        }
        Some(out)
    }

    fn deserialize(&self, data: Option<&[u8]>) -> Result<Decision, SerdeError> {
        let data = data.ok_or_else(|| SerdeError("a join decision is null".into()))?;
        let mut at = 0usize;
        let mut take = |n: usize| -> Result<&[u8], SerdeError> {
            let bytes = data
                .get(at..at + n)
                .ok_or_else(|| SerdeError(format!("a join decision is cut short at {at}")))?;
            at += n;
            Ok(bytes)
        };
        let word = |b: &[u8]| -> [u8; 8] { b.try_into().unwrap_or([0; 8]) };
        let sum = u64::from_be_bytes(word(take(8)?));
        let outcome = take(1)?[0];
        let timestamp = i64::from_be_bytes(word(take(8)?));
        let mut sides = [None, None];
        for side in &mut sides {
            if take(1)?[0] == 0 {
                continue;
            }
            let value = i64::from_be_bytes(word(take(8)?));
            let version = u64::from_be_bytes(word(take(8)?));
            let timestamp = match take(1)?[0] {
                0 => None,
                _ => Some(i64::from_be_bytes(word(take(8)?))),
            };
            let aggregate = match take(1)?[0] {
                0 => None,
                _ => {
                    let len = u32::from_be_bytes(take(4)?.try_into().unwrap_or([0; 4]));
                    Some(take(len as usize)?.to_vec())
                }
            };
            *side = Some(ItemState {
                value,
                aggregate,
                version,
                timestamp,
            });
        }
        let [this, other] = sides;
        Ok(Decision {
            sum,
            outcome,
            timestamp,
            this,
            other,
        })
    }
}

/// Which keys a table–table join keeps.
#[derive(Clone, Copy, PartialEq, Eq)]
enum JoinKind {
    /// Keys both tables have.
    Inner,
    /// Keys this table has.
    Left,
    /// Keys either table has.
    Outer,
}

/// What a table–table join's deletion of a key on one side found of the other side's
/// item, besides its value (none, when these matter).
#[derive(Debug, Clone, Copy)]
struct OtherSide {
    /// This batch wrote the other table's key (it may have had a value in the batch).
    written: bool,
    /// The other table's item exists and holds no value: the other table lost the key
    /// (deleted, or filtered out).
    lost: bool,
}

impl OtherSide {
    /// Whether an inner join's deletion on one side sends a deletion although the other
    /// side has no value: when this batch wrote the other side's key, or, at least once,
    /// when the other side lost the key too. Kafka Streams sends one deletion, when the
    /// first side loses the key (the other side still holds its value then); here the
    /// two sides' losses may run at once in two batches (two partitions, or a crashed
    /// batch's retry after the other side's), each finding the other side gone, so that
    /// neither would send it and the pair would stay in the output. The second side's
    /// loss sends the deletion again: at least one of two such batches reads the other's
    /// write (each reads after its own), so the deletion with the highest version is sent.
    /// Under exactly-once output the join's decision store covers that case instead
    /// (`Decision`), and sends one.
    fn deletes_inner(self, exactly_once: bool) -> bool {
        self.written || (self.lost && !exactly_once)
    }
}

/// What a table–table join emits for a changed key.
enum Joined<R> {
    Update(R),
    Delete,
    Nothing,
}

/// Where a table–table join's updates and deletions go.
#[derive(Clone)]
struct Outputs<K, R> {
    updates: Downstream<K, R>,
    deletes: Downstream<K, ()>,
    /// Under exactly-once output: where the decisions go instead (see [`Decision`]); set
    /// when the join's decision store is connected (the builder asks for exactly-once
    /// output as the join is declared, or the topology is built for it).
    decisions: Arc<OnceLock<Downstream<K, Decision>>>,
    /// Whether the changed side is the join's other table (the decision keeps the sides
    /// in the join's order).
    flipped: bool,
}

impl<K: Clone, R: Clone> Outputs<K, R> {
    /// Emits `joined` with the item's version plus the other side's (`other_version`), so
    /// that a key's joined updates and deletions are ordered by version, and with the
    /// later of the update's timestamp and the other side's value's (`other_timestamp`,
    /// when known), as Kafka Streams' table–table joins.
    fn emit(
        &self,
        ctx: &mut Ctx,
        key: K,
        joined: Joined<R>,
        other_version: u64,
        other_timestamp: Option<i64>,
    ) -> Result<(), StreamError> {
        if let Joined::Nothing = joined {
            return Ok(());
        }
        let Origin::Update { version, timestamp } = ctx.origin else {
            return Ok(());
        };
        let timestamp = other_timestamp.map_or(timestamp, |t| t.max(timestamp));
        ctx.origin = Origin::Update {
            version: version + other_version,
            timestamp,
        };
        match joined {
            Joined::Update(value) => self.updates.forward(ctx, key, value),
            Joined::Delete => self.deletes.forward(ctx, key, ()),
            Joined::Nothing => Ok(()),
        }
    }
}

impl<K: Clone, R: Clone> Outputs<K, R> {
    /// Under exactly-once output: sends the decision on `joined` (made from the changed
    /// side's item `changed` and the other side's `other`, as read) to the join's store,
    /// attributed to the outbox entry `entry` of the change. Sent also when it emits
    /// nothing, so that a retry re-emitting the change touches the join's item and emits
    /// what its outbox holds.
    #[allow(clippy::too_many_arguments)]
    fn decide(
        &self,
        decisions: &Downstream<K, Decision>,
        ctx: &mut Ctx,
        key: K,
        joined: &Joined<R>,
        (changed, other): (Option<ItemState>, Option<&ItemState>),
        other_timestamp: Option<i64>,
        entry: Option<(u32, i64)>,
    ) -> Result<(), StreamError> {
        let Origin::Update { version, timestamp } = ctx.origin else {
            return Ok(());
        };
        let other = other.cloned();
        let sum = version + other.as_ref().map_or(0, |s| s.version);
        let (this, other) = if self.flipped {
            (other, changed)
        } else {
            (changed, other)
        };
        let decision = Decision {
            sum,
            outcome: match joined {
                Joined::Update(_) => Decision::UPDATE,
                Joined::Delete => Decision::DELETE,
                Joined::Nothing => Decision::NOTHING,
            },
            timestamp: other_timestamp.map_or(timestamp, |t| t.max(timestamp)),
            this,
            other,
        };
        let saved = std::mem::replace(&mut ctx.update_entry, entry);
        let sent = decisions.forward(ctx, key, decision);
        ctx.update_entry = saved;
        sent
    }
}

/// Joins each update and deletion of `changed` with `other`'s value of its key, read after
/// the batch's writes: `on_update(key, changed value, other value)` and
/// `on_delete(key, other value, what else was seen of the other side's item)` say what
/// to emit to `out`.
fn watch<K, A, B, R>(
    changed: &KTable<K, A>,
    other: &KTable<K, B>,
    out: &Outputs<K, R>,
    prefix: &str,
    on_update: impl Fn(&K, &A, Option<&B>) -> Joined<R> + Send + Sync + 'static,
    on_delete: impl Fn(&K, Option<&B>, OtherSide) -> Joined<R> + Send + Sync + 'static,
) -> NodeId
where
    K: Clone + Send + Sync + 'static,
    A: Clone + Send + Sync + 'static,
    B: Clone + Send + Sync + 'static,
    R: Clone + Send + Sync + 'static,
{
    let (Some(_), Some(lookup)) = (&changed.lookup, &other.lookup) else {
        panic!("{NOT_JOINABLE}");
    };
    let (store, node): (Arc<str>, NodeId) = {
        let mut inner = lock(&changed.shared);
        let name = inner.stores[lookup.store].name.clone();
        let kind = NodeKind::Processor {
            stores: vec![name.clone()],
        };
        let node = inner.description.add_node(prefix, kind, &changed.nodes);
        inner.roles.read(node, lookup.store);
        (name.into(), node)
    };
    let (on_update, on_delete) = (Arc::new(on_update), Arc::new(on_delete));
    let (updates_lookup, updates_out, updates_store) =
        (Arc::clone(lookup), out.clone(), Arc::clone(&store));
    changed
        .updates()
        .add(Arc::new(move |ctx, key: K, value: A| {
            let on_update = Arc::clone(&on_update);
            defer_lookup(
                ctx,
                (&updates_lookup, &updates_store),
                key,
                updates_out.clone(),
                move |k, found, _| on_update(k, &value, found),
            )
        }));
    let (deletes_lookup, deletes_out, deletes_store) =
        (Arc::clone(lookup), out.clone(), Arc::clone(&store));
    changed.deletes().add(Arc::new(move |ctx, key: K, ()| {
        let on_delete = Arc::clone(&on_delete);
        defer_lookup(
            ctx,
            (&deletes_lookup, &deletes_store),
            key,
            deletes_out.clone(),
            move |k, found, seen| on_delete(k, found, seen),
        )
    }));
    node
}

/// Parks a table change until `lookup`'s value of `key` is read, then emits what `decide`
/// makes of it (with what else was seen of the other table's item of `key`).
fn defer_lookup<K, B, R>(
    ctx: &mut Ctx,
    (lookup, store): (&Arc<Lookup<K, B>>, &Arc<str>),
    key: K,
    out: Outputs<K, R>,
    decide: impl FnOnce(&K, Option<&B>, OtherSide) -> Joined<R> + Send + Sync + 'static,
) -> Result<(), StreamError>
where
    K: Clone + Send + Sync + 'static,
    B: Clone + Send + Sync + 'static,
    R: Clone + Send + Sync + 'static,
{
    let Some(encoded) = lookup.key_serde.serialize(&key) else {
        return Ok(());
    };
    let (lookup, store) = (Arc::clone(lookup), Arc::clone(store));
    let key_bytes = encoded.clone();
    // Under exactly-once output: the changed item's state and outbox entry, for the
    // decision.
    let changed = out
        .decisions
        .get()
        .map(|_| (ctx.update_state.clone(), ctx.update_entry));
    ctx.defer(
        lookup.store,
        encoded,
        Box::new(move |ctx, state| {
            let written = ctx.wrote(lookup.store, &key_bytes);
            let found = lookup.find(&key, state, &store)?;
            let timestamp = match (&found, &lookup.timestamp, state) {
                (Some(_), Some(timestamp), Some(state)) => timestamp(&key, state),
                _ => None,
            };
            let seen = OtherSide {
                written,
                lost: found.is_none() && state.is_some(),
            };
            let joined = decide(&key, found.as_ref(), seen);
            match (out.decisions.get(), changed) {
                (Some(decisions), Some((changed, entry))) => out.decide(
                    decisions,
                    ctx,
                    key,
                    &joined,
                    (changed, state),
                    timestamp,
                    entry,
                ),
                _ => out.emit(ctx, key, joined, state.map_or(0, |s| s.version), timestamp),
            }
        }),
    )
}
