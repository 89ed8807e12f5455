//! How [`KStream::group_by`](super::KStream::group_by) re-keys a stream: [`Grouped`], and
//! the choice between its two modes (docs/state.md, "Direct or repartition"), made when
//! the topology is built.
//!
//! - **Repartition**: the re-keyed records go through an internal topic partitioned by
//!   the new key (see [`KStream::repartition`](super::KStream::repartition)), which the
//!   same function consumes; one writer per key, so a key's updates reach an output topic
//!   in order. It is the default (as in Kafka Streams) when the aggregation's updates go
//!   to a topic and are emitted on every update.
//! - **Direct**: the aggregation writes the new key's item from every source partition;
//!   the state is exact, and every update carries the item's version
//!   (`lambda-streams-version`), so consumers keep the highest version per key. It is the
//!   default when the updates go to no topic (state read from DynamoDB) or only once per
//!   window ([`EmitStrategy::OnWindowClose`](super::EmitStrategy)), and can be chosen
//!   with [`Grouped::direct`].

use std::sync::Arc;

use crate::serdes::Serde;
pub use crate::topology::Rekeying;
use crate::topology::{Shared, lock};

/// The serdes and the re-keying mode of [`KStream::group_by`](super::KStream::group_by), as
/// Kafka Streams' `Grouped`.
///
/// ```
/// use lambda_streams::dsl::Grouped;
/// use lambda_streams::serdes::Utf8;
///
/// // Repartition when the counts go to a topic, through `word-counts-repartition`
/// // (the default name: the first store's name and `-repartition`).
/// let grouped: Grouped<String, String> = Grouped::with(Utf8, Utf8);
/// // Through a topic of a chosen name.
/// let named: Grouped<String, String> = Grouped::with(Utf8, Utf8).with_topic("wordcount-words");
/// // Never through a topic: the key serde is all it needs.
/// let direct: Grouped<String, String> = Grouped::direct(Utf8);
/// # let _ = (grouped, named, direct);
/// ```
pub struct Grouped<K, V> {
    pub(crate) key_serde: Arc<dyn Serde<K>>,
    pub(crate) value_serde: Option<Arc<dyn Serde<V>>>,
    pub(crate) rekeying: Rekeying,
    pub(crate) topic: Option<String>,
}

impl<K: 'static, V: 'static> Grouped<K, V> {
    /// The new key written with `key_serde`, the value with `value_serde` (both needed to
    /// repartition); the mode is [`Rekeying::Auto`].
    pub fn with(key_serde: impl Serde<K>, value_serde: impl Serde<V>) -> Self {
        Grouped {
            key_serde: Arc::new(key_serde),
            value_serde: Some(Arc::new(value_serde)),
            rekeying: Rekeying::Auto,
            topic: None,
        }
    }

    /// Direct re-keying ([`Rekeying::Direct`]): no repartition topic, so only the key's
    /// serde is needed.
    pub fn direct(key_serde: impl Serde<K>) -> Self {
        Grouped {
            key_serde: Arc::new(key_serde),
            value_serde: None,
            rekeying: Rekeying::Direct,
            topic: None,
        }
    }

    /// Repartitions even when the updates go to no topic ([`Rekeying::Repartition`]).
    /// No effect on [`Grouped::direct`], which has no value serde to repartition with.
    pub fn always_repartition(mut self) -> Self {
        if self.value_serde.is_some() {
            self.rekeying = Rekeying::Repartition;
        }
        self
    }

    /// The name of the repartition topic (default: the name of the grouped stream's first
    /// store followed by `-repartition`). The function must consume this topic too (a
    /// second event source in Lambda), created with as many partitions as the input.
    pub fn with_topic(mut self, topic: &str) -> Self {
        self.topic = Some(topic.to_owned());
        self
    }

    /// The mode this `Grouped` asks for.
    pub fn rekeying(&self) -> Rekeying {
        self.rekeying
    }
}

/// Chooses the mode of every pending `group_by` of the topology and connects it.
pub(crate) fn resolve_all(shared: &Shared) {
    let pending = std::mem::take(&mut lock(shared).rekeys);
    for rekey in pending {
        let (repartition, default_topic) = {
            let inner = lock(shared);
            let graph = &inner.description;
            let stores = graph.child_stores(rekey.node);
            let on_close = !stores.is_empty()
                && stores.iter().all(|name| {
                    inner.stores.iter().any(|s| {
                        // Time windows, or sessions and sliding windows, emitting on close.
                        let closes = s.closing.as_ref().is_some_and(|c| c.close.is_some());
                        &s.name == name && (s.emit_on_close.is_some() || closes)
                    })
                });
            let repartition = match rekey.rekeying {
                Rekeying::Direct => false,
                Rekeying::Repartition => true,
                Rekeying::Auto => graph.reaches_sink(rekey.node) && !on_close,
            };
            let base = stores
                .first()
                .cloned()
                .unwrap_or_else(|| graph.name(rekey.node).to_owned());
            (repartition, format!("{base}-repartition"))
        };
        let topic = repartition.then(|| rekey.topic.clone().unwrap_or(default_topic));
        if let Some(source) = (rekey.wire)(topic.as_deref()) {
            lock(shared).description.reparent(rekey.node, source);
        }
    }
}
