//! The DSL a user writes topologies with, in the spirit of Kafka Streams.
//!
//! [`StreamsBuilder::stream`] reads a topic as a [`KStream`]; stateless operators
//! transform it record by record; [`KStream::group_by`] re-keys it into a
//! [`KGroupedStream`] whose aggregations ([`KGroupedStream::count`]) keep state in a
//! [`Store`](crate::state::Store) and yield a [`KTable`] of updates, which
//! [`KTable::to_stream`] turns back into a stream, for instance to produce it with
//! [`KStream::to`]. [`StreamsBuilder::build`] freezes it all into a [`Topology`].
//!
//! Internally every operator is a node that pushes records to its children, as in
//! Kafka Streams: a record flows once through the graph, however many branches read it.

pub mod aggregators;
mod describe;
mod grouped;
mod stream;
mod table;
mod windowed;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

pub use aggregators::Score;
pub use describe::{Node, NodeKind, SubTopology, TopologyDescription};
pub use grouped::KGroupedStream;
pub use rekey::{Grouped, Rekeying};
pub use stream::{BranchedKStream, KStream};
pub use table::KTable;

mod join;
mod rekey;
mod repartition;
mod session;
mod sliding;
mod stream_join;
pub use session::{SessionWindowedKStream, SessionWindows};
pub use sliding::{SlidingWindowedKStream, SlidingWindows};
pub use stream_join::JoinWindows;
pub use windowed::{EmitStrategy, TimeWindowedKStream, TimeWindows, Windowed};

use crate::error::StreamError;
use crate::event::Record;
use crate::runtime::context::Ctx;
use crate::serdes::Serde;

/// A processing step: takes a key and value in the batch context.
pub(crate) type Processor<K, V> =
    Arc<dyn Fn(&mut Ctx, K, V) -> Result<(), StreamError> + Send + Sync>;

/// The children of a node: each record the node emits goes to all of them.
pub(crate) struct Downstream<K, V>(Arc<RwLock<Vec<Processor<K, V>>>>);

impl<K, V> Clone for Downstream<K, V> {
    fn clone(&self) -> Self {
        Downstream(Arc::clone(&self.0))
    }
}

impl<K: Clone, V: Clone> Downstream<K, V> {
    pub(crate) fn new() -> Self {
        Downstream(Arc::new(RwLock::new(Vec::new())))
    }

    pub(crate) fn add(&self, processor: Processor<K, V>) {
        self.0
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .push(processor);
    }

    /// Sends one record to every child (cloning for all but the last).
    pub(crate) fn forward(&self, ctx: &mut Ctx, key: K, value: V) -> Result<(), StreamError> {
        let children = self.0.read().unwrap_or_else(PoisonError::into_inner);
        if let Some((last, rest)) = children.split_last() {
            for child in rest {
                child(ctx, key.clone(), value.clone())?;
            }
            last(ctx, key, value)?;
        }
        Ok(())
    }
}

/// Reads a source record into the topology.
pub(crate) type SourceFn = Arc<dyn Fn(&mut Ctx, &Record) -> Result<(), StreamError> + Send + Sync>;

/// Turns a state item's new value back into a typed table update.
pub(crate) type UpdateFn = Arc<
    dyn Fn(&mut Ctx, &[u8], Option<i64>, &crate::state::ItemState) -> Result<(), StreamError>
        + Send
        + Sync,
>;

/// A state store declared by an aggregation.
pub(crate) struct StoreSpec {
    pub(crate) name: String,
    pub(crate) on_update: UpdateFn,
    /// For an emit-on-close windowed store: the window size (ms). Its updates are
    /// emitted once per window, when the window closes, instead of after every batch.
    pub(crate) emit_on_close: Option<i64>,
}

/// Everything a built topology holds.
#[derive(Default)]
pub(crate) struct TopologyInner {
    pub(crate) sources: HashMap<String, Vec<SourceFn>>,
    pub(crate) stores: Vec<StoreSpec>,
    pub(crate) sink_topics: BTreeSet<String>,
    /// The node graph [`Topology::describe`] renders (one node per operator).
    pub(crate) description: describe::Graph,
    /// Whether a windowed aggregation needs the partitions' stream times.
    pub(crate) windowed: bool,
    /// The stores joins read (written before the joins run in each batch).
    pub(crate) join_targets: BTreeSet<usize>,
    /// The `group_by`s whose re-keying mode is chosen at [`StreamsBuilder::build`].
    pub(crate) rekeys: Vec<rekey::PendingRekey>,
}

pub(crate) type Shared = Arc<Mutex<TopologyInner>>;

pub(crate) fn lock(shared: &Shared) -> std::sync::MutexGuard<'_, TopologyInner> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Builds a [`Topology`]: start with [`stream`](Self::stream), chain operators, then
/// [`build`](Self::build).
#[derive(Default)]
pub struct StreamsBuilder {
    shared: Shared,
}

impl StreamsBuilder {
    /// A new, empty builder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads `topic` as a stream, decoding keys with `key_serde` and values with `value_serde`.
    /// A record whose key or value does not decode fails the batch with an error naming
    /// its topic-partition and offset.
    pub fn stream<K, V>(
        &self,
        topic: &str,
        key_serde: impl Serde<K>,
        value_serde: impl Serde<V>,
    ) -> KStream<K, V>
    where
        K: Clone + Send + Sync + 'static,
        V: Clone + Send + Sync + 'static,
    {
        let downstream = Downstream::<K, V>::new();
        let out = downstream.clone();
        let source: SourceFn = Arc::new(move |ctx, record| {
            let key = key_serde
                .deserialize(record.key.as_deref())
                .map_err(|e| deserialize_error(ctx, "key", e))?;
            let value = value_serde
                .deserialize(record.value.as_deref())
                .map_err(|e| deserialize_error(ctx, "value", e))?;
            out.forward(ctx, key, value)
        });
        let mut inner = lock(&self.shared);
        inner
            .sources
            .entry(topic.to_owned())
            .or_default()
            .push(source);
        let topics = vec![topic.to_owned()];
        let node = inner
            .description
            .add_node("KSTREAM-SOURCE", NodeKind::Source { topics }, &[]);
        drop(inner);
        KStream::from_node(Arc::clone(&self.shared), downstream, node)
    }

    /// Freezes the topology.
    pub fn build(self) -> Topology {
        rekey::resolve_all(&self.shared);
        let inner = std::mem::take(&mut *lock(&self.shared));
        Topology {
            inner: Arc::new(inner),
        }
    }
}

fn deserialize_error(ctx: &Ctx, side: &'static str, e: crate::serdes::SerdeError) -> StreamError {
    let (tp, offset) = ctx.record_coordinates().unwrap_or_else(|| {
        let tp = crate::event::TopicPartition {
            topic: "<table update>".to_owned(),
            partition: -1,
        };
        (tp, -1)
    });
    StreamError::Deserialize {
        tp,
        offset,
        side,
        reason: e.0,
    }
}

/// A built, immutable topology: the unit a Lambda function, the local runner and the
/// tests execute. Cheap to clone.
#[derive(Clone)]
pub struct Topology {
    pub(crate) inner: Arc<TopologyInner>,
}

impl Topology {
    /// The topics the topology reads, sorted.
    pub fn source_topics(&self) -> Vec<String> {
        let mut topics: Vec<String> = self.inner.sources.keys().cloned().collect();
        topics.sort();
        topics
    }

    /// The repartition topics: the topics the topology both writes and reads (sorted).
    /// The function consumes them as well as its input topics; create them with as many
    /// partitions as the input topics.
    pub fn repartition_topics(&self) -> Vec<String> {
        self.inner
            .sink_topics
            .iter()
            .filter(|t| self.inner.sources.contains_key(*t))
            .cloned()
            .collect()
    }

    /// The topics the topology writes to, sorted.
    pub fn sink_topics(&self) -> Vec<String> {
        self.inner.sink_topics.iter().cloned().collect()
    }

    /// The names of the state stores its aggregations keep.
    pub fn store_names(&self) -> Vec<String> {
        self.inner.stores.iter().map(|s| s.name.clone()).collect()
    }

    /// The topology's shape, in the spirit of Kafka Streams' `TopologyDescription`:
    /// sub-topologies, sources with their topics, processors with their stores, sinks
    /// with their topic, each node with its neighbours. `Display` writes the text form.
    ///
    /// ```
    /// use lambda_streams::StreamsBuilder;
    /// use lambda_streams::serdes::{Unit, Utf8};
    ///
    /// let builder = StreamsBuilder::new();
    /// builder
    ///     .stream("lines", Unit, Utf8)
    ///     .filter(|_, line| !line.is_empty())
    ///     .to("non-empty", Unit, Utf8);
    /// assert_eq!(
    ///     builder.build().describe().to_string(),
    ///     "Topologies:
    ///    Sub-topology: 0
    ///     Source: KSTREAM-SOURCE-0000000000 (topics: [lines])
    ///       --> KSTREAM-FILTER-0000000001
    ///     Processor: KSTREAM-FILTER-0000000001 (stores: [])
    ///       --> KSTREAM-SINK-0000000002
    ///       <-- KSTREAM-SOURCE-0000000000
    ///     Sink: KSTREAM-SINK-0000000002 (topic: non-empty)
    ///       <-- KSTREAM-FILTER-0000000001
    /// "
    /// );
    /// ```
    pub fn describe(&self) -> TopologyDescription {
        self.inner.description.describe()
    }

    /// The topology as a Mermaid `graph TD` diagram (see
    /// [`TopologyDescription::to_mermaid`]), e.g. for a README.
    ///
    /// ```
    /// use lambda_streams::StreamsBuilder;
    /// use lambda_streams::serdes::{Unit, Utf8};
    ///
    /// let builder = StreamsBuilder::new();
    /// builder.stream("lines", Unit, Utf8).to("copy", Unit, Utf8);
    /// let mermaid = builder.build().to_mermaid();
    /// assert!(mermaid.starts_with("graph TD\n"));
    /// assert!(mermaid.contains("n0([\"KSTREAM-SOURCE-0000000000\"])"));
    /// assert!(mermaid.contains("n1 --> t1")); // the sink writes to topic "copy"
    /// ```
    pub fn to_mermaid(&self) -> String {
        self.describe().to_mermaid()
    }
}
