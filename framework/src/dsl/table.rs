//! `KTable`: a changelog of the latest value per key.

use std::sync::Arc;

use super::{Downstream, KStream, Shared};
use crate::serdes::Serde;
use crate::state::ItemState;

/// A table's current value of a key, as a join reads it from the table's store.
pub(crate) struct Lookup<K, V> {
    /// The store's index in the topology.
    pub(crate) store: usize,
    /// Encodes a key as the store's items are keyed.
    pub(crate) key_serde: Arc<dyn Serde<K>>,
    /// The table's value from the item's state (`None`: deleted).
    pub(crate) value: LookupValue<V>,
}

/// Decodes a table's value from a stored item (`None`: the key was deleted).
pub(crate) type LookupValue<V> = Arc<dyn Fn(&ItemState) -> Result<Option<V>, String> + Send + Sync>;

/// A table: the latest value per key, kept in a state store. Its updates flow on after
/// each batch's state writes, one per key the batch changed.
pub struct KTable<K, V> {
    pub(crate) shared: Shared,
    updates: Downstream<K, V>,
    /// How joins read it (tables of windowed aggregations cannot be joined).
    pub(crate) lookup: Option<Arc<Lookup<K, V>>>,
}

impl<K, V> KTable<K, V>
where
    K: Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    pub(crate) fn new(shared: Shared, updates: Downstream<K, V>) -> Self {
        KTable {
            shared,
            updates,
            lookup: None,
        }
    }

    /// The same table, readable by joins through `lookup`.
    pub(crate) fn with_lookup(mut self, lookup: Lookup<K, V>) -> Self {
        self.lookup = Some(Arc::new(lookup));
        self
    }

    /// The table's updates as a stream: one record per key changed by a batch, with the
    /// key's value after the batch.
    pub fn to_stream(&self) -> KStream<K, V> {
        KStream::new(self.shared.clone(), self.updates.clone())
    }
}

impl<K, V> KTable<K, Option<V>>
where
    K: Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// The table without its `None` values (a reduce's aggregate before its first value,
    /// a deleted key of a table read from a topic): they are not forwarded, and a join
    /// finds no value for them.
    pub(crate) fn flatten(self) -> KTable<K, V> {
        let flat = Downstream::<K, V>::new();
        let out = flat.clone();
        self.updates
            .add(Arc::new(move |ctx, key, value: Option<V>| match value {
                Some(value) => out.forward(ctx, key, value),
                None => Ok(()),
            }));
        let lookup = self.lookup.map(|inner| {
            let decode = Arc::clone(&inner.value);
            let value: LookupValue<V> = Arc::new(move |state| decode(state).map(Option::flatten));
            Arc::new(Lookup {
                store: inner.store,
                key_serde: Arc::clone(&inner.key_serde),
                value,
            })
        });
        KTable {
            shared: self.shared,
            updates: flat,
            lookup,
        }
    }
}
