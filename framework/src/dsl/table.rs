//! `KTable`: a changelog of the latest value per key.

use super::{Downstream, KStream, Shared};

/// A table: the latest value per key, kept in a state store. Its updates flow on after
/// each batch's state writes, one per key the batch changed.
pub struct KTable<K, V> {
    shared: Shared,
    updates: Downstream<K, V>,
}

impl<K, V> KTable<K, V>
where
    K: Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    pub(crate) fn new(shared: Shared, updates: Downstream<K, V>) -> Self {
        KTable { shared, updates }
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
    /// The table without its `None` values (a reduce's aggregate before its first value).
    pub(crate) fn flatten(self) -> KTable<K, V> {
        let flat = Downstream::<K, V>::new();
        let out = flat.clone();
        self.updates.add(std::sync::Arc::new(
            move |ctx, key, value: Option<V>| match value {
                Some(value) => out.forward(ctx, key, value),
                None => Ok(()),
            },
        ));
        KTable::new(self.shared, flat)
    }
}
