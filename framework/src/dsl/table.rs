//! `KTable`: a changelog of the latest value per key.

use std::sync::Arc;

use super::versioned::{LookupAsOf, Versioned};
use super::{Downstream, KStream, Shared, lock};
use crate::serdes::Serde;
use crate::state::ItemState;
use crate::topology::describe::NodeId;

/// A table's current value of a key, as a join reads it from the table's store.
pub(crate) struct Lookup<K, V> {
    /// The store's index in the topology.
    pub(crate) store: usize,
    /// Encodes a key as the store's items are keyed.
    pub(crate) key_serde: Arc<dyn Serde<K>>,
    /// The table's value from the item's state (`None`: deleted).
    pub(crate) value: LookupValue<K, V>,
    /// The timestamp of the item's value, for the tables that keep it (those read from a
    /// topic or made by `to_table`: the timestamp of the record that set the value); a
    /// table–table join's result carries the later of its two sides' timestamps.
    pub(crate) timestamp: Option<LookupTimestamp<K>>,
    /// For a versioned table (and the tables derived from one by `filter` and
    /// `map_values`): its value as of a time, which stream–table joins read at the stream
    /// record's timestamp.
    pub(crate) versioned: Option<Versioned<K, V>>,
}

impl<K, V> Lookup<K, V> {
    /// The table's value of `key` from its item as read (`None`: no item, deleted, or
    /// filtered out); an item that does not decode is an error naming `store`.
    pub(crate) fn find(
        &self,
        key: &K,
        state: Option<&ItemState>,
        store: &str,
    ) -> Result<Option<V>, crate::error::StreamError> {
        match state {
            None => Ok(None),
            Some(state) => (self.value)(key, state).map_err(|e| {
                crate::error::StreamError::Config(format!(
                    "store {store:?}: a stored value does not decode: {e}"
                ))
            }),
        }
    }
}

impl<K, V> Lookup<K, V> {
    /// The table's value of `key` for a stream record at `timestamp`: a versioned table's
    /// value as of that time, any other table's current value (see [`find`](Self::find)).
    pub(crate) fn find_at(
        &self,
        key: &K,
        state: Option<&ItemState>,
        timestamp: i64,
        store: &str,
    ) -> Result<Option<V>, crate::error::StreamError> {
        let Some(versioned) = &self.versioned else {
            return self.find(key, state, store);
        };
        match state {
            None => Ok(None),
            Some(state) => (versioned.as_of)(key, state, timestamp).map_err(|e| {
                crate::error::StreamError::Config(format!(
                    "store {store:?}: a stored value does not decode: {e}"
                ))
            }),
        }
    }
}

/// Decodes the timestamp of a table's value from its stored item (`None`: not known).
pub(crate) type LookupTimestamp<K> = Arc<dyn Fn(&K, &ItemState) -> Option<i64> + Send + Sync>;

/// Decodes a table's value of a key from its stored item (`None`: the key was deleted,
/// or filtered out).
pub(crate) type LookupValue<K, V> =
    Arc<dyn Fn(&K, &ItemState) -> Result<Option<V>, String> + Send + Sync>;

/// A table: the latest value per key, kept in a state store. Its updates flow on after
/// each batch's state writes, one per key the batch changed.
pub struct KTable<K, V> {
    pub(crate) shared: Shared,
    updates: Downstream<K, V>,
    /// The keys a batch deleted from the table (a tombstone read by `table`, a value a
    /// `filter` rejects, a join result that no longer holds).
    deletes: Downstream<K, ()>,
    /// How joins read it (tables of windowed aggregations cannot be joined).
    pub(crate) lookup: Option<Arc<Lookup<K, V>>>,
    /// The nodes that emit its updates (its aggregation, or a table join's two sides):
    /// the parents of the operators reading them, along which the build orders a
    /// batch's store writes.
    pub(crate) nodes: Vec<NodeId>,
}

impl<K, V> KTable<K, V>
where
    K: Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// The table of the aggregation declared last (its updates come from `updates`).
    pub(crate) fn new(shared: Shared, updates: Downstream<K, V>) -> Self {
        let nodes = lock(&shared)
            .description
            .table_parent()
            .into_iter()
            .collect();
        Self::from_nodes(shared, updates, nodes)
    }

    /// A table whose updates `nodes` emit into `updates`.
    pub(crate) fn from_nodes(
        shared: Shared,
        updates: Downstream<K, V>,
        nodes: Vec<NodeId>,
    ) -> Self {
        KTable {
            shared,
            updates,
            deletes: Downstream::new(),
            lookup: None,
            nodes,
        }
    }

    /// A table whose updates come from `updates` and deletions from `deletes`.
    pub(crate) fn with_deletes(mut self, deletes: Downstream<K, ()>) -> Self {
        self.deletes = deletes;
        self
    }

    /// The processors that receive the table's deletions.
    pub(crate) fn deletes(&self) -> &Downstream<K, ()> {
        &self.deletes
    }

    /// The same table, readable by joins through `lookup`.
    pub(crate) fn with_lookup(mut self, lookup: Lookup<K, V>) -> Self {
        self.lookup = Some(Arc::new(lookup));
        self
    }

    /// The processors that receive the table's updates.
    pub(crate) fn updates(&self) -> &Downstream<K, V> {
        &self.updates
    }

    /// The table's updates as a stream: one record per key changed by a batch, with the
    /// key's value after the batch. Deletions are left out: see
    /// [`to_change_stream`](Self::to_change_stream).
    pub fn to_stream(&self) -> KStream<K, V> {
        KStream::new(self.shared.clone(), self.updates.clone(), &self.nodes)
    }

    /// The table's changelog as a stream, as Kafka Streams' `KTable::toStream`: an update
    /// is `(key, Some(value))`, a deletion `(key, None)`. Produced with a
    /// [`Nullable`](crate::serdes::Nullable) value serde, a deletion is a tombstone (a
    /// null value), so a compacted topic or a downstream table forgets the key. Like every
    /// table update, a deletion carries the item's version in the `lambda-streams-version`
    /// header.
    ///
    /// ```
    /// use lambda_streams::driver::TestDriver;
    /// use lambda_streams::serdes::{Nullable, Utf8};
    /// use lambda_streams::StreamsBuilder;
    ///
    /// let builder = StreamsBuilder::new();
    /// builder
    ///     .table("customers", Utf8, Utf8, "customers")
    ///     .to_change_stream()
    ///     .to("customers-copy", Utf8, Nullable(Utf8));
    /// let driver = TestDriver::new(builder.build());
    /// let mut input = driver.input_topic("customers", Utf8, Nullable(Utf8));
    /// input.pipe_input("c1", Some("Ada".to_owned()))?;
    /// input.pipe_input("c1", None)?; // a tombstone deletes c1
    /// let copy = driver.read_output("customers-copy");
    /// assert_eq!(copy[0].value.as_deref(), Some(&b"Ada"[..]));
    /// assert_eq!(copy[1].value, None); // and is forwarded as one
    /// assert_eq!(copy[1].header("lambda-streams-version"), Some(&b"2"[..]));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn to_change_stream(&self) -> KStream<K, Option<V>> {
        let changes = Downstream::<K, Option<V>>::new();
        let (updated, deleted) = (changes.clone(), changes.clone());
        self.updates.add(Arc::new(move |ctx, key, value| {
            updated.forward(ctx, key, Some(value))
        }));
        self.deletes.add(Arc::new(move |ctx, key, ()| {
            deleted.forward(ctx, key, None)
        }));
        KStream::new(self.shared.clone(), changes, &self.nodes)
    }

    /// The table of the keys whose value satisfies `predicate`: its updates are those that
    /// satisfy it, and a join finds no value for a key whose value does not (as Kafka
    /// Streams' `KTable::filter`, which turns such values into deletions).
    ///
    /// ```
    /// use lambda_streams::driver::TestDriver;
    /// use lambda_streams::serdes::{DecimalI64, Utf8};
    /// use lambda_streams::StreamsBuilder;
    ///
    /// let builder = StreamsBuilder::new();
    /// let limits = builder.table("limits", Utf8, DecimalI64, "limits");
    /// let positive = limits.filter(|_, limit| *limit > 0);
    /// builder
    ///     .stream("spend", Utf8, DecimalI64)
    ///     .join(&positive, |_, spend: i64, limit: i64| spend <= limit)
    ///     .map_values(|ok| if ok { "ok".to_owned() } else { "over".to_owned() })
    ///     .to("checks", Utf8, Utf8);
    /// let driver = TestDriver::new(builder.build());
    /// let mut limits_in = driver.input_topic("limits", Utf8, DecimalI64);
    /// limits_in.pipe_input("a", 100)?;
    /// limits_in.pipe_input("b", 0)?; // filtered out: b has no limit
    /// let mut spend = driver.input_topic("spend", Utf8, DecimalI64);
    /// spend.pipe_input("a", 150)?;
    /// spend.pipe_input("b", 1)?;
    /// assert_eq!(
    ///     driver.output_topic("checks", Utf8, Utf8).read_key_values()?,
    ///     [("a".to_owned(), "over".to_owned())]
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn filter(
        &self,
        predicate: impl Fn(&K, &V) -> bool + Send + Sync + 'static,
    ) -> KTable<K, V> {
        let predicate = Arc::new(predicate);
        let (next, deletes) = (Downstream::<K, V>::new(), Downstream::<K, ()>::new());
        let (out, removed) = (next.clone(), deletes.clone());
        let keep = Arc::clone(&predicate);
        self.updates.add(Arc::new(move |ctx, key, value| {
            if keep(&key, &value) {
                out.forward(ctx, key, value)
            } else {
                removed.forward(ctx, key, ())
            }
        }));
        self.pass_deletes(&deletes);
        self.derived(next, deletes, move |key, value| {
            predicate(key, &value).then_some(value)
        })
    }

    /// A table derived from this one (`filter`, `map_values`): its updates and deletions
    /// flow through `updates` and `deletes`, and a join reads this table's value passed
    /// through `derive` (`None`: absent).
    fn derived<V2>(
        &self,
        updates: Downstream<K, V2>,
        deletes: Downstream<K, ()>,
        derive: impl Fn(&K, V) -> Option<V2> + Send + Sync + 'static,
    ) -> KTable<K, V2>
    where
        V2: Clone + Send + Sync + 'static,
    {
        let derive = Arc::new(derive);
        let lookup = self.lookup.as_ref().map(|inner| {
            let decode = Arc::clone(&inner.value);
            let latest = Arc::clone(&derive);
            let value: LookupValue<K, V2> =
                Arc::new(move |key, state| Ok(decode(key, state)?.and_then(|v| latest(key, v))));
            let versioned = inner.versioned.as_ref().map(|versioned| {
                let (decode, derive) = (Arc::clone(&versioned.as_of), Arc::clone(&derive));
                let as_of: LookupAsOf<K, V2> = Arc::new(move |key, state, ts| {
                    Ok(decode(key, state, ts)?.and_then(|v| derive(key, v)))
                });
                Versioned {
                    as_of,
                    retention: versioned.retention,
                }
            });
            Arc::new(Lookup {
                store: inner.store,
                key_serde: Arc::clone(&inner.key_serde),
                value,
                timestamp: inner.timestamp.clone(),
                versioned,
            })
        });
        KTable {
            shared: self.shared.clone(),
            updates,
            deletes,
            lookup,
            nodes: self.nodes.clone(),
        }
    }

    /// Forwards this table's deletions to `deletes`.
    fn pass_deletes(&self, deletes: &Downstream<K, ()>) {
        let out = deletes.clone();
        self.deletes
            .add(Arc::new(move |ctx, key, ()| out.forward(ctx, key, ())));
    }

    /// The table with each value mapped by `f`, as Kafka Streams' `KTable::mapValues`: its
    /// updates are mapped, and a join reads the mapped value.
    ///
    /// ```
    /// use lambda_streams::driver::TestDriver;
    /// use lambda_streams::serdes::Utf8;
    /// use lambda_streams::StreamsBuilder;
    ///
    /// let builder = StreamsBuilder::new();
    /// let names = builder.table("names", Utf8, Utf8, "names").map_values(|n: &String| n.to_uppercase());
    /// names.to_stream().to("upper", Utf8, Utf8);
    /// let driver = TestDriver::new(builder.build());
    /// driver.input_topic("names", Utf8, Utf8).pipe_input("c1", "ada".to_owned())?;
    /// assert_eq!(driver.output_topic("upper", Utf8, Utf8).read_values()?, ["ADA"]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn map_values<V2>(&self, f: impl Fn(&V) -> V2 + Send + Sync + 'static) -> KTable<K, V2>
    where
        V2: Clone + Send + Sync + 'static,
    {
        let f = Arc::new(f);
        let next = Downstream::<K, V2>::new();
        let out = next.clone();
        let map = Arc::clone(&f);
        self.updates.add(Arc::new(move |ctx, key, value: V| {
            out.forward(ctx, key, map(&value))
        }));
        let deletes = Downstream::<K, ()>::new();
        self.pass_deletes(&deletes);
        self.derived(next, deletes, move |_, value| Some(f(&value)))
    }
}

impl<K, V> KTable<K, Option<V>>
where
    K: Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// The table without its `None` values (a reduce's aggregate before its first value,
    /// a deleted key of a table read from a topic): they are forwarded as deletions, and a
    /// join finds no value for them.
    pub(crate) fn flatten(self) -> KTable<K, V> {
        let (flat, deletes) = (Downstream::<K, V>::new(), Downstream::<K, ()>::new());
        let (out, removed) = (flat.clone(), deletes.clone());
        self.updates
            .add(Arc::new(move |ctx, key, value: Option<V>| match value {
                Some(value) => out.forward(ctx, key, value),
                None => removed.forward(ctx, key, ()),
            }));
        self.pass_deletes(&deletes);
        let lookup = self.lookup.map(|inner| {
            let decode = Arc::clone(&inner.value);
            let value: LookupValue<K, V> =
                Arc::new(move |key, state| decode(key, state).map(Option::flatten));
            let versioned = inner.versioned.as_ref().map(|versioned| {
                let decode = Arc::clone(&versioned.as_of);
                let as_of: LookupAsOf<K, V> =
                    Arc::new(move |key, state, ts| decode(key, state, ts).map(Option::flatten));
                Versioned {
                    as_of,
                    retention: versioned.retention,
                }
            });
            Arc::new(Lookup {
                store: inner.store,
                key_serde: Arc::clone(&inner.key_serde),
                value,
                timestamp: inner.timestamp.clone(),
                versioned,
            })
        });
        KTable {
            shared: self.shared,
            updates: flat,
            deletes,
            lookup,
            nodes: self.nodes.clone(),
        }
    }
}

impl<K, V> KTable<K, (Option<V>, i64)>
where
    K: Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// The table of a topic's (or a stream's) latest value per key, from the aggregate
    /// that keeps each value (`None`: deleted) with the timestamp of the record that set
    /// it. Its updates and deletions carry that timestamp, as Kafka Streams' table source
    /// forwards each record with its own, and joins read it (a table–table join's result
    /// carries the later of both sides'). `i64::MIN` stands for a timestamp not kept (an
    /// item written before timestamps were stored): the update keeps the batch's.
    pub(crate) fn unstamp(self) -> KTable<K, V> {
        let (flat, deletes) = (Downstream::<K, V>::new(), Downstream::<K, ()>::new());
        let (out, removed) = (flat.clone(), deletes.clone());
        self.updates.add(Arc::new(
            move |ctx, key, (value, timestamp): (Option<V>, i64)| {
                let forward = |ctx: &mut crate::topology::context::Ctx| match value {
                    Some(value) => out.forward(ctx, key, value),
                    None => removed.forward(ctx, key, ()),
                };
                if timestamp == i64::MIN {
                    forward(ctx)
                } else {
                    ctx.with_update_timestamp(timestamp, forward)
                }
            },
        ));
        self.pass_deletes(&deletes);
        let lookup = self.lookup.map(|inner| {
            let decode = Arc::clone(&inner.value);
            let value: LookupValue<K, V> =
                Arc::new(move |key, state| decode(key, state).map(|v| v.and_then(|(v, _)| v)));
            let decode = Arc::clone(&inner.value);
            let timestamp: LookupTimestamp<K> =
                Arc::new(move |key, state| match decode(key, state) {
                    Ok(Some((Some(_), timestamp))) if timestamp != i64::MIN => Some(timestamp),
                    _ => None,
                });
            Arc::new(Lookup {
                store: inner.store,
                key_serde: Arc::clone(&inner.key_serde),
                value,
                timestamp: Some(timestamp),
                versioned: None,
            })
        });
        KTable {
            shared: self.shared,
            updates: flat,
            deletes,
            lookup,
            nodes: self.nodes.clone(),
        }
    }
}
