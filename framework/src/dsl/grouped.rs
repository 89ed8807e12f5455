//! `KGroupedStream`: a stream grouped by key, ready for an aggregation.

use std::sync::Arc;

use super::table::Lookup;
use super::{Downstream, KTable, Shared, StoreSpec, UpdateFn, lock};
use crate::error::StreamError;
use crate::serdes::Serde;
use crate::state::{Fold, ItemState};
use crate::topology::NullCheck;
use crate::topology::context::{Ctx, PendingFold};
use crate::topology::describe::NodeId;

/// A stream grouped by key; its aggregations keep one state item per key.
pub struct KGroupedStream<K, V> {
    pub(crate) shared: Shared,
    pub(crate) downstream: Downstream<K, V>,
    pub(crate) key_serde: Arc<dyn Serde<K>>,
    /// The node its records come from: the parent of its aggregation nodes (and so the
    /// edge along which the build orders the batch's store writes).
    pub(crate) node: Option<NodeId>,
    /// Which values are Kafka nulls, skipped by `count`, `aggregate` and `reduce` and by
    /// sliding-window aggregations as Kafka Streams skips them.
    pub(crate) nulls: Arc<NullCheck<V>>,
}

/// Which windows a record falls in, and whether each is still open (`None`: not windowed).
pub(crate) type Windowing = Option<super::windowed::WindowSpec>;

/// A general aggregation's adder: `(key, value, aggregate) -> aggregate`.
pub(crate) type Adder<K, V, A> = Box<dyn Fn(&K, V, A) -> A + Send + Sync>;

/// The user's functions of a general aggregation.
pub(crate) struct Aggregation<K, V, A> {
    pub(crate) init: Box<dyn Fn() -> A + Send + Sync>,
    pub(crate) adder: Adder<K, V, A>,
    pub(crate) serde: Arc<dyn Serde<A>>,
    /// For a store that closes on its content (a left or outer stream–stream join's, an
    /// emit-on-close session or sliding window's): when an aggregate next closes.
    pub(crate) closes: Option<ClosesFn<A>>,
}

/// When an aggregate next closes (see [`Aggregation::closes`]): `Some(None)` when nothing
/// in it closes, `None` when the store does not close on its content (an aggregation
/// whose final results are off).
pub(crate) type ClosesFn<A> = Box<dyn Fn(&A) -> Option<Option<i64>> + Send + Sync>;

/// One item's values of a general aggregation in one batch, typed.
struct TypedFold<K, V, A> {
    key: K,
    /// (channel, offset or position, value), sorted by channel and offset (a record's own
    /// values in the order it gave them).
    values: Vec<(u32, i64, V)>,
    aggregation: Arc<Aggregation<K, V, A>>,
}

impl<K, V, A> Fold for TypedFold<K, V, A>
where
    K: Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    A: 'static,
{
    fn fold(
        &self,
        current: Option<&[u8]>,
        include: &dyn Fn(u32, i64) -> bool,
    ) -> Result<Vec<u8>, String> {
        let agg = &self.aggregation;
        let mut acc = match current {
            Some(bytes) => agg
                .serde
                .deserialize(Some(bytes))
                .map_err(|e| format!("the stored aggregate does not decode: {e}"))?,
            None => (agg.init)(),
        };
        for (tp, offset, value) in &self.values {
            if include(*tp, *offset) {
                acc = (agg.adder)(&self.key, value.clone(), acc);
            }
        }
        agg.serde
            .try_serialize(&acc)
            .map_err(|e| format!("the aggregate does not encode: {e}"))?
            .ok_or_else(|| "the aggregate serialized to null".to_owned())
    }

    fn closes(&self) -> bool {
        self.aggregation.closes.is_some()
    }

    fn close_at(&self, aggregate: &[u8]) -> Option<Option<i64>> {
        let closes = self.aggregation.closes.as_ref()?;
        let acc = self.aggregation.serde.deserialize(Some(aggregate)).ok()?;
        closes(&acc)
    }
}

/// The aggregate of a written item.
pub(crate) fn decode_aggregate<A: 'static>(
    serde: &dyn Serde<A>,
    state: &ItemState,
) -> Result<A, String> {
    let bytes = state
        .aggregate
        .as_deref()
        .ok_or("the item holds no aggregate")?;
    serde.deserialize(Some(bytes)).map_err(|e| e.0)
}

impl<K, V, A> PendingFold for TypedFold<K, V, A>
where
    K: Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    A: 'static,
{
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }

    fn forget(&mut self, tp: u32, offset: i64) {
        self.values.retain(|(t, o, _)| !(*t == tp && *o == offset));
    }
}

impl<K, V> KGroupedStream<K, V>
where
    K: Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    pub(crate) fn new(
        shared: Shared,
        downstream: Downstream<K, V>,
        key_serde: Arc<dyn Serde<K>>,
    ) -> Self {
        // The grouping operator (`group_by`, `group_by_key`) has just set it.
        let inner = lock(&shared);
        let (node, nulls) = (inner.description.grouped_parent(), inner.null_check());
        drop(inner);
        KGroupedStream {
            shared,
            downstream,
            key_serde,
            node,
            nulls: Arc::new(nulls),
        }
    }

    /// Declares the store `store` and returns its index and the table of its updates;
    /// `table_key` makes the table's key from the item's key and window start, `value`
    /// the table's value from a written item's state.
    pub(crate) fn register<TK, T>(
        &self,
        store: &str,
        operator: &str,
        windowed: bool,
        table_key: impl Fn(K, Option<i64>) -> TK + Send + Sync + 'static,
        value: impl Fn(&ItemState) -> Result<T, String> + Send + Sync + 'static,
    ) -> (usize, KTable<TK, T>)
    where
        TK: Clone + Send + Sync + 'static,
        T: Clone + Send + Sync + 'static,
    {
        assert!(
            crate::state::valid_store_name(store),
            "invalid store name {store:?}: use 1-64 characters of [A-Za-z0-9_.-]"
        );
        let updates = Downstream::<TK, T>::new();
        let mut inner = lock(&self.shared);
        assert!(
            inner.stores.iter().all(|s| s.name != store),
            "store name {store:?} is used twice in the topology"
        );
        inner.windowed |= windowed;
        let index = inner.stores.len();
        let (key_serde, out, name) = (
            Arc::clone(&self.key_serde),
            updates.clone(),
            store.to_owned(),
        );
        let on_update: UpdateFn = Arc::new(move |ctx, key, window, state| {
            let corrupt = |what: &str, e: String| {
                StreamError::Config(format!(
                    "store {name:?}: a stored {what} does not decode: {e}"
                ))
            };
            let key = key_serde
                .deserialize(Some(key))
                .map_err(|e| corrupt("key", e.0))?;
            let value = value(state).map_err(|e| corrupt("value", e))?;
            out.forward(ctx, table_key(key, window), value)
        });
        inner.stores.push(StoreSpec {
            name: store.to_owned(),
            on_update,
            emit_on_close: None,
            closing: None,
            fans_out: false,
            keeps_time: false,
        });
        let node = inner.description.push_from(
            format!("  Processor: {operator} (store: {store})"),
            self.node,
        );
        inner.roles.write(node, index);
        drop(inner);
        (index, KTable::new(self.shared.clone(), updates))
    }

    /// Counts records into store `index`, in their windows when `windows` is set.
    pub(crate) fn add_count(&self, index: usize, windows: Windowing) {
        let key_serde = Arc::clone(&self.key_serde);
        let nulls = Arc::clone(&self.nulls);
        self.downstream.add(Arc::new(move |ctx, key, value| {
            let Some(encoded) = key_serde.serialize(&key) else {
                ctx.dropped_null_keys += 1;
                return Ok(());
            };
            // Kafka Streams' `KStreamAggregate` skips a null value; its time-window
            // aggregation (`KStreamWindowAggregate`) counts it.
            if windows.is_none() && nulls.is_null(&value) {
                ctx.dropped_null_values += 1;
                return Ok(());
            }
            match &windows {
                None => ctx.contribute(index, encoded, None, 1),
                Some(windows) => {
                    for window in windows.open_windows(ctx, index)? {
                        ctx.contribute(index, encoded.clone(), Some(window), 1);
                    }
                }
            }
            Ok(())
        }));
    }

    /// Folds records into store `index` with `aggregation`, in their windows when
    /// `windows` is set.
    pub(crate) fn add_fold<A>(
        &self,
        index: usize,
        aggregation: Arc<Aggregation<K, V, A>>,
        windows: Windowing,
    ) where
        A: Clone + Send + Sync + 'static,
    {
        let key_serde = Arc::clone(&self.key_serde);
        let nulls = Arc::clone(&self.nulls);
        self.downstream
            .add(Arc::new(move |ctx: &mut Ctx, key: K, value: V| {
                let Some(encoded) = key_serde.serialize(&key) else {
                    ctx.dropped_null_keys += 1;
                    return Ok(());
                };
                // As `add_count`: Kafka Streams' `KStreamAggregate` and `KStreamReduce`
                // skip a null value, its time-window aggregation does not.
                if windows.is_none() && nulls.is_null(&value) {
                    ctx.dropped_null_values += 1;
                    return Ok(());
                }
                let targets = match &windows {
                    None => vec![None],
                    Some(windows) => windows
                        .open_windows(ctx, index)?
                        .into_iter()
                        .map(Some)
                        .collect(),
                };
                for window in targets {
                    let (aggregation, key, value) =
                        (Arc::clone(&aggregation), key.clone(), value.clone());
                    ctx.contribute_value(
                        index,
                        encoded.clone(),
                        window,
                        || {
                            Box::new(TypedFold {
                                key,
                                values: Vec::new(),
                                aggregation,
                            })
                        },
                        |fold, tp, offset| {
                            if let Some(fold) =
                                fold.as_any_mut().downcast_mut::<TypedFold<K, V, A>>()
                            {
                                // In offset order per channel, as Kafka Streams folds
                                // them (record at a time): records that waited at a join
                                // come after the batch's others, merged or not.
                                let at = fold
                                    .values
                                    .partition_point(|(t, o, _)| (*t, *o) <= (tp, offset));
                                fold.values.insert(at, (tp, offset, value));
                            }
                        },
                    );
                }
                Ok(())
            }));
    }

    /// Groups the records further by event-time windows, for a windowed aggregation.
    pub fn windowed_by(
        &self,
        windows: super::windowed::TimeWindows,
    ) -> super::windowed::TimeWindowedKStream<K, V> {
        super::windowed::TimeWindowedKStream::new(
            KGroupedStream {
                shared: self.shared.clone(),
                downstream: self.downstream.clone(),
                key_serde: Arc::clone(&self.key_serde),
                node: self.node,
                nulls: Arc::clone(&self.nulls),
            },
            windows,
        )
    }

    /// Counts the records per key in the state store `store` (names are `[A-Za-z0-9_.-]`,
    /// unique in the topology). The table's updates are the counts after each batch.
    ///
    /// Records whose key serializes to null are not counted (as in Kafka Streams): they
    /// are reported in the batch report's `dropped_null_keys`; nor are records whose value
    /// is a Kafka null (a `None` of a [`Nullable`](crate::serdes::Nullable) value serde the
    /// topology names: Kafka Streams' `KStreamAggregate` skips it), in `dropped_null_values`.
    /// An update carries the newest timestamp of the key's records (Kafka Streams:
    /// `max(record, aggregate)`), so an older record does not move it back.
    ///
    /// Cost: one conditional DynamoDB `UpdateItem` (`ADD`) per touched key per batch.
    ///
    /// # Panics
    /// When `store` is not a valid store name or is already used: a programming error in
    /// the topology, caught when the topology is built.
    pub fn count(&self, store: &str) -> KTable<K, i64> {
        let (index, table) =
            self.register(store, "count", false, |k, _| k, |state| Ok(state.value));
        self.keep_newest_time(index);
        self.add_count(index, None);
        table.with_lookup(Lookup {
            store: index,
            key_serde: Arc::clone(&self.key_serde),
            value: Arc::new(|_, state| Ok(Some(state.value))),
            timestamp: Some(Arc::new(|_, state| state.timestamp)),
            versioned: None,
        })
    }

    /// Aggregates the records per key, as Kafka Streams' `aggregate`: the aggregate of a
    /// new key starts as `init()`, and each record's value is added with
    /// `adder(key, value, aggregate)`. The aggregate is kept in `store`, encoded with
    /// `aggregate_serde` (it must fit DynamoDB's 400 KB item limit: the record that would
    /// take it past the limit is a poison record, named with the store and key, as is a
    /// record the adder or the serde fails or panics on; docs/state.md, "Limits").
    ///
    /// A Kafka null value is skipped and an update's timestamp is the key's newest, as for
    /// [`count`](Self::count).
    ///
    /// The adder runs once per record and item in the common case; on a redelivery or a
    /// conflict it runs again on the values the stored item does not hold yet, so it must
    /// be a pure function of its arguments.
    ///
    /// Cost: one DynamoDB `UpdateItem` per touched key per batch, conditioned on the
    /// version of the item as this container last wrote it; a key this container has not
    /// written yet (a cold start, another container) costs one more, refused write, which
    /// returns the current item.
    ///
    /// ```
    /// use lambda_streams::driver::TestDriver;
    /// use lambda_streams::serdes::{Json, Unit, Utf8};
    /// use lambda_streams::StreamsBuilder;
    /// use lambda_streams::dsl::Grouped;
    ///
    /// // The longest word seen per first letter.
    /// let builder = StreamsBuilder::new();
    /// builder
    ///     .stream("words", Unit, Utf8)
    ///     .group_by(|_, w: &String| w[..1].to_owned(), Grouped::with(Utf8, Utf8))
    ///     .aggregate("longest", String::new, |_, w: String, best: String| if w.len() > best.len() { w } else { best }, Json::<String>::default())
    ///     .to_stream()
    ///     .to("longest-words", Utf8, Utf8);
    /// let driver = TestDriver::new(builder.build());
    /// let mut words = driver.input_topic("words", Unit, Utf8);
    /// for w in ["kafka", "kappa", "lambda", "key", "log"] {
    ///     words.pipe_input((), w.to_owned()).unwrap();
    /// }
    /// let out = driver.output_topic("longest-words", Utf8, Utf8).read_key_values_to_map().unwrap();
    /// assert_eq!(out["k"], "kafka");
    /// assert_eq!(out["l"], "lambda");
    /// ```
    pub fn aggregate<A>(
        &self,
        store: &str,
        init: impl Fn() -> A + Send + Sync + 'static,
        adder: impl Fn(&K, V, A) -> A + Send + Sync + 'static,
        aggregate_serde: impl Serde<A>,
    ) -> KTable<K, A>
    where
        A: Clone + Send + Sync + 'static,
    {
        let table = self.aggregate_closing(store, init, adder, aggregate_serde, None);
        if let Some(lookup) = &table.lookup {
            self.keep_newest_time(lookup.store);
        }
        table
    }

    /// Makes store `index`'s items keep their newest record time, which their updates
    /// carry: Kafka Streams' `KStreamAggregate` and `KStreamReduce` stamp an update with
    /// `max(record timestamp, aggregate timestamp)`.
    fn keep_newest_time(&self, index: usize) {
        lock(&self.shared).stores[index].keeps_time = true;
    }

    /// [`aggregate`](Self::aggregate) into a store whose items close on their content
    /// (`closes`: when an aggregate next closes, kept in the closing index by every write).
    pub(crate) fn aggregate_closing<A>(
        &self,
        store: &str,
        init: impl Fn() -> A + Send + Sync + 'static,
        adder: impl Fn(&K, V, A) -> A + Send + Sync + 'static,
        aggregate_serde: impl Serde<A>,
        closes: Option<ClosesFn<A>>,
    ) -> KTable<K, A>
    where
        A: Clone + Send + Sync + 'static,
    {
        let serde: Arc<dyn Serde<A>> = Arc::new(aggregate_serde);
        let aggregation = Arc::new(Aggregation {
            init: Box::new(init),
            adder: Box::new(adder),
            serde: Arc::clone(&serde),
            closes,
        });
        let decode = Arc::clone(&serde);
        let (index, table) = self.register(
            store,
            "aggregate",
            false,
            |k, _| k,
            move |state| decode_aggregate(&*decode, state),
        );
        self.add_fold(index, aggregation, None);
        table.with_lookup(Lookup {
            store: index,
            key_serde: Arc::clone(&self.key_serde),
            value: Arc::new(move |_, state| decode_aggregate(&*serde, state).map(Some)),
            // The newest record time, where the store keeps it (`aggregate`).
            timestamp: Some(Arc::new(|_, state| state.timestamp)),
            versioned: None,
        })
    }

    /// Combines the values per key, as Kafka Streams' `reduce`: the first value of a key
    /// is its aggregate, each later one is combined with `reducer(aggregate, value)`.
    /// Same costs and rules as [`aggregate`](Self::aggregate).
    pub fn reduce(
        &self,
        store: &str,
        reducer: impl Fn(V, V) -> V + Send + Sync + 'static,
        value_serde: impl Serde<V>,
    ) -> KTable<K, V> {
        self.aggregate(
            store,
            || None,
            super::reduce_adder(reducer),
            crate::serdes::Nullable(value_serde),
        )
        .flatten()
    }
}
