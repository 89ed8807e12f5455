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
//! as in Kafka Streams without versioned stores.

use std::sync::Arc;

use super::table::Lookup;
use super::{Downstream, KStream, KTable, StreamsBuilder, lock};
use crate::error::StreamError;
use crate::serdes::{Nullable, Serde, SerdeError};
use crate::topology::context::{Ctx, Origin};
use crate::topology::describe::{NodeId, NodeKind};

/// Why a table without a lookup cannot be a join's side (a composition the DSL refuses
/// when it is written, naming what to do instead).
const NOT_JOINABLE: &str = "this table cannot be joined by key: it is a windowed \
    aggregation's table or the result of a table-table join, which have no per-key lookup \
    (joining a joined table is not supported yet: join the source tables in one step, or \
    aggregate the joined stream into a table of its own)";

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
        .group_by_key(key_serde)
        .aggregate(
            store,
            || None,
            |_, value: Option<V>, _| value,
            Present(value_serde),
        )
        .flatten()
    }
}

/// A table's stored value: `1` then the value's bytes, or `0` for a deleted key (the
/// item stays, with its watermarks, so that a redelivered older record cannot bring the
/// key back).
struct Present<S>(S);

impl<V, S: Serde<V>> Serde<Option<V>> for Present<S> {
    fn serialize(&self, value: &Option<V>) -> Option<Vec<u8>> {
        self.try_serialize(value).ok().flatten()
    }

    fn try_serialize(&self, value: &Option<V>) -> Result<Option<Vec<u8>>, SerdeError> {
        Ok(Some(match value {
            None => vec![0],
            Some(v) => {
                let bytes = self.0.try_serialize(v)?.unwrap_or_default();
                let mut out = Vec::with_capacity(bytes.len() + 1);
                out.push(1);
                out.extend_from_slice(&bytes);
                out
            }
        }))
    }

    fn deserialize(&self, data: Option<&[u8]>) -> Result<Option<V>, SerdeError> {
        match data {
            None | Some([0]) => Ok(None),
            Some([1, rest @ ..]) => self.0.deserialize(Some(rest)).map(Some),
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
        self.group_by_key(key_serde)
            .aggregate(
                store,
                || None,
                |_, value: V, _| Some(value),
                Present(value_serde),
            )
            .flatten()
    }

    /// Joins each record with `table`'s current value of its key (an inner join, as Kafka
    /// Streams' `KStream::join(KTable)`): a record whose key has no value in the table is
    /// dropped; the others go on as `joiner(key, value, table_value)`.
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
    /// on as `joiner(key, value, Some(table_value) or None)`. Costs as [`join`](Self::join).
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
            (name, node)
        };
        let next = Downstream::<K, VR>::new();
        let out = next.clone();
        let f = Arc::new(f);
        self.downstream()
            .add(Arc::new(move |ctx, key: K, value: V| {
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
                ctx.defer(
                    lookup.store,
                    encoded,
                    Box::new(move |ctx, state| {
                        let found = lookup.find(&key, state, &store_name)?;
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
    /// key. A deletion in either table is not forwarded (as for every table here), and the
    /// joined table cannot itself be joined.
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
        self.join_tables(other, "KTABLE-JOIN", move |k, v, o: Option<&VO>| {
            o.map(|o| joiner(k, v, o))
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
        self.join_tables(other, "KTABLE-LEFTJOIN", move |k, v, o: Option<&VO>| {
            Some(joiner(k, v, o))
        })
    }

    /// Both sides of a table–table join: an update of this table meets `other`'s value
    /// (or none), an update of `other` meets this table's value (only if there is one);
    /// `f(key, this, other)` gives the joined value, or `None` for nothing. Deletions: a key
    /// deleted from this table deletes the joined key; a key deleted from `other` where
    /// this table has a value gives `f(key, this, None)` (a left join's update), or deletes
    /// the joined key when that is `None` (an inner join).
    fn join_tables<VO, VR>(
        &self,
        other: &KTable<K, VO>,
        prefix: &str,
        f: impl Fn(&K, &V, Option<&VO>) -> Option<VR> + Send + Sync + 'static,
    ) -> KTable<K, VR>
    where
        VO: Clone + Send + Sync + 'static,
        VR: Clone + Send + Sync + 'static,
    {
        let f = Arc::new(f);
        let out = Outputs {
            updates: Downstream::<K, VR>::new(),
            deletes: Downstream::<K, ()>::new(),
        };
        let (this_side, other_deleted) = (Arc::clone(&f), Arc::clone(&f));
        let this_node = watch(
            self,
            other,
            &out,
            &format!("{prefix}THIS"),
            move |k, v, o| this_side(k, v, o).map_or(Joined::Nothing, Joined::Update),
            |_, _| Joined::Delete,
        );
        let other_node = watch(
            other,
            self,
            &out,
            &format!("{prefix}OTHER"),
            move |k, o, v: Option<&V>| {
                v.and_then(|v| f(k, v, Some(o)))
                    .map_or(Joined::Nothing, Joined::Update)
            },
            move |k, v: Option<&V>| match v {
                None => Joined::Nothing,
                Some(v) => other_deleted(k, v, None).map_or(Joined::Delete, Joined::Update),
            },
        );
        KTable::from_nodes(
            self.shared.clone(),
            out.updates,
            vec![this_node, other_node],
        )
        .with_deletes(out.deletes)
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
}

impl<K: Clone, R: Clone> Outputs<K, R> {
    /// Emits `joined` with the item's version plus the other side's (`other_version`), so
    /// that a key's joined updates and deletions are ordered by version.
    fn emit(
        &self,
        ctx: &mut Ctx,
        key: K,
        joined: Joined<R>,
        other_version: u64,
    ) -> Result<(), StreamError> {
        if let Joined::Nothing = joined {
            return Ok(());
        }
        if let Origin::Update { version, timestamp } = ctx.origin {
            ctx.origin = Origin::Update {
                version: version + other_version,
                timestamp,
            };
        }
        match joined {
            Joined::Update(value) => self.updates.forward(ctx, key, value),
            Joined::Delete => self.deletes.forward(ctx, key, ()),
            Joined::Nothing => Ok(()),
        }
    }
}

/// Joins each update and deletion of `changed` with `other`'s value of its key, read after
/// the batch's writes: `on_update(key, changed value, other value)` and
/// `on_delete(key, other value)` say what to emit to `out`.
fn watch<K, A, B, R>(
    changed: &KTable<K, A>,
    other: &KTable<K, B>,
    out: &Outputs<K, R>,
    prefix: &str,
    on_update: impl Fn(&K, &A, Option<&B>) -> Joined<R> + Send + Sync + 'static,
    on_delete: impl Fn(&K, Option<&B>) -> Joined<R> + Send + Sync + 'static,
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
                move |k, found| on_update(k, &value, found),
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
            move |k, found| on_delete(k, found),
        )
    }));
    node
}

/// Parks a table change until `lookup`'s value of `key` is read, then emits what `decide`
/// makes of it.
fn defer_lookup<K, B, R>(
    ctx: &mut Ctx,
    (lookup, store): (&Arc<Lookup<K, B>>, &Arc<str>),
    key: K,
    out: Outputs<K, R>,
    decide: impl FnOnce(&K, Option<&B>) -> Joined<R> + Send + Sync + 'static,
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
    ctx.defer(
        lookup.store,
        encoded,
        Box::new(move |ctx, state| {
            let found = lookup.find(&key, state, &store)?;
            let joined = decide(&key, found.as_ref());
            out.emit(ctx, key, joined, state.map_or(0, |s| s.version))
        }),
    )
}
