//! `KGroupedStream`: a stream grouped by key, ready for an aggregation.

use std::sync::Arc;

use super::{Downstream, KTable, Shared, StoreSpec, lock};
use crate::error::StreamError;
use crate::serdes::Serde;

/// A stream grouped by key; its aggregations keep one state item per key.
pub struct KGroupedStream<K, V> {
    shared: Shared,
    downstream: Downstream<K, V>,
    key_serde: Arc<dyn Serde<K>>,
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
        KGroupedStream {
            shared,
            downstream,
            key_serde,
        }
    }

    /// Counts the records per key in the state store `store` (names are `[A-Za-z0-9_.-]`,
    /// unique in the topology). The table's updates are the counts after each batch.
    ///
    /// Records whose key serializes to null are not counted (as in Kafka Streams): they
    /// are reported in the batch report's `dropped_null_keys`.
    ///
    /// # Panics
    /// When `store` is not a valid store name or is already used: a programming error in
    /// the topology, caught when the topology is built.
    pub fn count(&self, store: &str) -> KTable<K, i64> {
        assert!(
            crate::state::valid_store_name(store),
            "invalid store name {store:?}: use 1-64 characters of [A-Za-z0-9_.-]"
        );
        let updates = Downstream::<K, i64>::new();
        let mut inner = lock(&self.shared);
        assert!(
            inner.stores.iter().all(|s| s.name != store),
            "store name {store:?} is used twice in the topology"
        );
        let index = inner.stores.len();
        let (key_serde, out) = (Arc::clone(&self.key_serde), updates.clone());
        inner.stores.push(StoreSpec {
            name: store.to_owned(),
            on_update: Arc::new(move |ctx, key, count| {
                let key = key_serde.deserialize(Some(key)).map_err(|e| {
                    StreamError::Config(format!("store {index}: stored key does not decode: {e}"))
                })?;
                out.forward(ctx, key, count)
            }),
        });
        inner
            .description
            .push(format!("  Processor: count (store: {store})"));
        drop(inner);
        let key_serde = Arc::clone(&self.key_serde);
        self.downstream.add(Arc::new(move |ctx, key, _value| {
            match key_serde.serialize(&key) {
                Some(encoded) => ctx.contribute(index, encoded, 1),
                None => ctx.dropped_null_keys += 1,
            }
            Ok(())
        }));
        KTable::new(self.shared.clone(), updates)
    }
}
