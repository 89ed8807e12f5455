//! The compiled plan: the [`Topology`] a [`StreamsBuilder`](crate::StreamsBuilder) builds
//! and the runtime executes, as Kafka Streams' `processor/internals`: processors, the
//! stores they declare, the node graph ([`describe`]) and the per-batch [`Ctx`](context::Ctx)
//! processors touch. It imports neither the DSL nor the runtime.

pub(crate) mod ahead;
pub(crate) mod context;
pub(crate) mod describe;
pub(crate) mod order;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use crate::error::StreamError;
use crate::event::Record;
use context::Ctx;
use describe::{NodeId, TopologyDescription};

/// A processing step: takes a key and value in the batch context.
pub(crate) type Processor<K, V> =
    Arc<dyn Fn(&mut Ctx, K, V) -> Result<(), StreamError> + Send + Sync>;

/// The children of a node: each record the node emits goes to all of them.
///
/// Children are added while the topology is built and only read after. The first record
/// forwarded freezes the list into a slice that is read without a lock (a lock would be
/// an atomic read-modify-write pair per operator and record, on the batch's hot path); a
/// child added after that is a programming error and panics with a message saying so,
/// rather than being left out silently.
pub(crate) struct Downstream<K, V>(Arc<Children<K, V>>);

/// [`Downstream`]'s list: open while building, frozen from the first record on.
struct Children<K, V> {
    building: Mutex<Vec<Processor<K, V>>>,
    frozen: OnceLock<Box<[Processor<K, V>]>>,
}

impl<K, V> Clone for Downstream<K, V> {
    fn clone(&self) -> Self {
        Downstream(Arc::clone(&self.0))
    }
}

impl<K: Clone, V: Clone> Downstream<K, V> {
    pub(crate) fn new() -> Self {
        Downstream(Arc::new(Children {
            building: Mutex::new(Vec::new()),
            frozen: OnceLock::new(),
        }))
    }

    /// Adds a child. Panics if records have gone through this node already: the topology
    /// it belongs to is built and running, and would not run the new child.
    pub(crate) fn add(&self, processor: Processor<K, V>) {
        let mut building = self
            .0
            .building
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        assert!(
            self.0.frozen.get().is_none(),
            "an operator was added to a stream whose topology has already processed records; \
             build a new topology with a new StreamsBuilder instead"
        );
        building.push(processor);
    }

    /// An identity of this node's children list (the same for every clone of it).
    pub(crate) fn id(&self) -> usize {
        Arc::as_ptr(&self.0) as *const () as usize
    }

    /// How many children it has.
    pub(crate) fn readers(&self) -> usize {
        match self.0.frozen.get() {
            Some(children) => children.len(),
            None => self
                .0
                .building
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .len(),
        }
    }

    /// The children, frozen on the first call.
    fn children(&self) -> &[Processor<K, V>] {
        if let Some(children) = self.0.frozen.get() {
            return children;
        }
        // The list is frozen under the building lock, so that an `add` racing with the
        // first record either lands before the freeze or sees it and panics.
        let building = self
            .0
            .building
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        self.0
            .frozen
            .get_or_init(|| building.iter().cloned().collect())
    }

    /// Sends one record to every child (cloning for all but the last).
    pub(crate) fn forward(&self, ctx: &mut Ctx, key: K, value: V) -> Result<(), StreamError> {
        if let Some((last, rest)) = self.children().split_last() {
            for child in rest {
                child(ctx, key.clone(), value.clone())?;
            }
            last(ctx, key, value)?;
        }
        Ok(())
    }
}

/// Reads a source record into the topology, with what its source read of it ahead.
pub(crate) type SourceFn =
    Arc<dyn Fn(&mut Ctx, &Record, ahead::Ahead<'_>) -> Result<(), StreamError> + Send + Sync>;

/// A reader of a source topic: how it reads a record into the topology, and how it
/// deserializes a large batch's records ahead ([`ahead`]), if it can.
pub(crate) struct Source {
    pub(crate) read: SourceFn,
    pub(crate) ahead: Option<ahead::ReadAheadFn>,
}

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
    /// For a stream–stream join's store: how its items close.
    pub(crate) closing: Option<Closing>,
    /// Whether one write's update fans out into several records (session and sliding
    /// windows: the sessions, tombstones or windows a write changed), rather than one
    /// record per item version. Under exactly-once output its updates straight from the
    /// write are derived from the state its outbox entry holds (the updates of that write
    /// alone); through a join or merged with another store's they stay refused.
    pub(crate) fans_out: bool,
    /// Whether its non-windowed items keep their newest record time, which their updates
    /// carry (a `count`, `aggregate` or `reduce`: Kafka Streams' `KStreamAggregate` stamps
    /// an update with the highest timestamp of the aggregate's records). Windowed items
    /// always keep it.
    pub(crate) keeps_time: bool,
}

/// Closes a left or outer join's item (key, state read) at a closing time: emits into the
/// context the records whose window closed and that joined nothing, except those whose
/// identity is in the set of the records emitted already (a second try after a conflict);
/// adds the identities of those it emits to it; and returns the item's new aggregate and
/// next closing time (`None`: nothing closed).
pub(crate) type CloseFn = Arc<
    dyn Fn(
            &mut Ctx,
            &[u8],
            &crate::state::ItemState,
            Option<&crate::state::ItemState>,
            i64,
            &mut std::collections::HashSet<Vec<u8>>,
        ) -> Result<Option<(Vec<u8>, Option<i64>)>, StreamError>
        + Send
        + Sync,
>;

/// How a store closes on its content: a stream–stream join's records can meet no partner
/// once the join's closing time passes their window and grace; an emit-on-close session or
/// sliding window's item emits each session or window once it closes.
#[derive(Clone)]
pub(crate) struct Closing {
    /// The join's (or aggregation's) node: the source topics upstream of it give its
    /// closing time.
    pub(crate) node: NodeId,
    /// The topics whose partitions' stream times close the join (set at build: the
    /// source topics upstream of `node`).
    pub(crate) topics: BTreeSet<String>,
    /// The closing pass of a left or outer join's or of an emit-on-close session or
    /// sliding window's items (`None`: an inner join's buffer, which prunes as records
    /// arrive and emits nothing alone).
    pub(crate) close: Option<CloseFn>,
    /// The store (by index) whose item of each closing key the pass reads and gives the
    /// close function (a stream–table join's table, read as of each released record's
    /// timestamp); `None`: none.
    pub(crate) reads: Option<usize>,
}

/// Everything a built topology holds.
#[derive(Default)]
pub(crate) struct TopologyInner {
    pub(crate) sources: HashMap<String, Vec<Source>>,
    pub(crate) stores: Vec<StoreSpec>,
    pub(crate) sink_topics: BTreeSet<String>,
    /// The node graph [`Topology::describe`] renders (one node per operator).
    pub(crate) description: describe::Graph,
    /// Whether a windowed aggregation needs the partitions' stream times.
    pub(crate) windowed: bool,
    /// The topics read with a timestamp extractor: their stream time is that of the
    /// extracted timestamps (the source updates it), not of the records' own.
    pub(crate) extracted: BTreeSet<String>,
    /// The `group_by`s whose re-keying mode is chosen at [`StreamsBuilder::build`].
    pub(crate) rekeys: Vec<PendingRekey>,
    /// The table–table joins: built for exactly-once output at [`StreamsBuilder::build`]
    /// if the topology's guarantee is then exactly once.
    pub(crate) table_joins: Vec<PendingTableJoin>,
    /// What the graph's nodes do with state (which store a node writes, which stores its
    /// records wait at), from which the build derives [`write_order`](Self::write_order).
    pub(crate) roles: order::Roles,
    /// The order in which a batch writes the stores (indices into `stores`): every store
    /// after all of its feeders (see [`order`]). Set when the topology is built.
    pub(crate) write_order: Vec<usize>,
    /// Whether a batch puts its repartition records back in source order before sending
    /// them (a repartition topic fed by records that waited at different joins, see
    /// [`order`]). Set when the topology is built.
    pub(crate) sort_hops: bool,
    /// The sinks exactly-once output cannot serve yet (see `order::WriteOrder`). Set when
    /// the topology is built.
    pub(crate) unsourced_sinks: Vec<crate::error::TopologyError>,
    /// The stores that keep the outbox of updates under exactly-once output
    /// (`order::WriteOrder::outboxed`).
    pub(crate) outboxed: std::collections::BTreeSet<usize>,
    /// The outboxed stores whose updates feed a table–table join's decision store
    /// (`order::WriteOrder::decision_inputs`).
    pub(crate) decision_inputs: std::collections::BTreeSet<usize>,
    /// The output guarantee the builder asked for ([`StreamsBuilder::output_guarantee`]).
    ///
    /// [`StreamsBuilder::output_guarantee`]: crate::StreamsBuilder::output_guarantee
    pub(crate) output: crate::sink::OutputGuarantee,
    /// The windowed aggregations' switches to final results, by the id of their table's
    /// updates ([`Downstream::id`]): what `KTable::suppress(untilWindowCloses)` turns on.
    pub(crate) finals: HashMap<usize, FinalSwitch>,
    /// The suppressed tables: the suppress node, and how many operators read the
    /// aggregation's own updates (exactly one, the suppression, or the build refuses).
    pub(crate) suppressions: Vec<(NodeId, Readers)>,
    /// Compositions the DSL accepted when written but the build refuses (a grace period on
    /// a table that is not versioned, a suppression it cannot serve): the first one is
    /// [`StreamsBuilder::try_build`]'s error.
    ///
    /// [`StreamsBuilder::try_build`]: crate::StreamsBuilder::try_build
    pub(crate) refused: Vec<crate::error::TopologyError>,
    /// Which values stand for a Kafka null, by type, learnt from the value serdes the
    /// topology names ([`Serde::nulls`](crate::serdes::Serde::nulls)).
    pub(crate) nulls: NullRegistry,
}

/// The null tests of a topology's value types (see [`TopologyInner::nulls`]).
pub(crate) type NullRegistry = Arc<Mutex<HashMap<std::any::TypeId, crate::serdes::Nulls>>>;

/// Whether a value of type `V` is a Kafka null: the registry's test for `V`, looked up
/// once, at the first value (the topology is built by then, so every serde is known).
pub(crate) struct NullCheck<V> {
    registry: NullRegistry,
    test: std::sync::OnceLock<Option<crate::serdes::Nulls>>,
    value: std::marker::PhantomData<fn(&V)>,
}

impl<V: 'static> NullCheck<V> {
    /// Whether `value` stands for a Kafka null.
    pub(crate) fn is_null(&self, value: &V) -> bool {
        self.test
            .get_or_init(|| {
                self.registry
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get(&std::any::TypeId::of::<V>())
                    .cloned()
            })
            .as_ref()
            .is_some_and(|nulls| (nulls.is_null)(value))
    }
}

/// Switches a windowed aggregation to emit once per window, when it closes.
pub(crate) type FinalSwitch = Arc<dyn Fn(&mut TopologyInner) + Send + Sync>;

/// How many operators read a table's updates.
pub(crate) type Readers = Box<dyn Fn() -> usize + Send + Sync>;

impl TopologyInner {
    /// Learns which values a value serde writes as a Kafka null.
    pub(crate) fn learn_nulls(&mut self, nulls: Option<crate::serdes::Nulls>) {
        if let Some(nulls) = nulls {
            self.nulls
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(nulls.type_id, nulls);
        }
    }

    /// The null test of values of type `V`.
    pub(crate) fn null_check<V: 'static>(&self) -> NullCheck<V> {
        NullCheck {
            registry: Arc::clone(&self.nulls),
            test: std::sync::OnceLock::new(),
            value: std::marker::PhantomData,
        }
    }

    /// Registers `source` as a reader of `topic`, with its `KSTREAM-SOURCE` node.
    pub(crate) fn add_source(&mut self, topic: &str, source: Source) -> NodeId {
        self.sources
            .entry(topic.to_owned())
            .or_default()
            .push(source);
        let topics = vec![topic.to_owned()];
        self.description
            .add_node("KSTREAM-SOURCE", describe::NodeKind::Source { topics }, &[])
    }
}

pub(crate) type Shared = Arc<Mutex<TopologyInner>>;

pub(crate) fn lock(shared: &Shared) -> std::sync::MutexGuard<'_, TopologyInner> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
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

    /// The output guarantee its builder asked for ([`StreamsBuilder::output_guarantee`];
    /// at least once unless set). A handler runs the topology exactly once when either
    /// this or its configuration (`LAMBDA_STREAMS_OUTPUT_GUARANTEE`) says `exactly_once`.
    ///
    /// [`StreamsBuilder::output_guarantee`]: crate::StreamsBuilder::output_guarantee
    pub fn output_guarantee(&self) -> crate::sink::OutputGuarantee {
        self.inner.output
    }

    /// Whether the topology can run under `guarantee`: under exactly-once output, the
    /// refusal of the first sink that produces records with no source record that neither
    /// the outbox of updates nor the claims cover (a window's close through a join or merged
    /// with another store's records, a store's updates, sessions' and sliding windows' among
    /// them, after a join or merged with another store's, a table–table join of a topology
    /// built for at-least-once output), naming the sink's node. A store's updates
    /// straight from its write are accepted (they go in the transaction of the record they
    /// are kept under), and so are closes straight from their store and the closing passes
    /// of left and outer stream–stream joins and grace joins (claimed by the batch's first
    /// event partition).
    pub fn check_output_guarantee(
        &self,
        guarantee: crate::sink::OutputGuarantee,
    ) -> Result<(), crate::error::TopologyError> {
        match (guarantee, self.inner.unsourced_sinks.first()) {
            (crate::sink::OutputGuarantee::ExactlyOnce, Some(refused)) => Err(refused.clone()),
            _ => Ok(()),
        }
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

/// How the re-keyed records reach their aggregation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Rekeying {
    /// Through a repartition topic when the aggregation's updates go to a topic and are
    /// emitted on every update; directly otherwise (the default).
    #[default]
    Auto,
    /// Always through the repartition topic.
    Repartition,
    /// Always directly: no repartition topic.
    Direct,
}

/// Connects the re-keyed records to their aggregation: directly (`None`) or through a
/// repartition topic (`Some(topic)`); returns the node the aggregation then reads from.
pub(crate) type Wire = Box<dyn FnOnce(Option<&str>) -> Option<NodeId> + Send + Sync>;

/// A `group_by` whose mode is chosen when the topology is built.
pub(crate) struct PendingRekey {
    /// The re-keying node (the aggregation nodes hang from it).
    pub(crate) node: NodeId,
    pub(crate) rekeying: Rekeying,
    pub(crate) topic: Option<String>,
    pub(crate) wire: Wire,
}

/// Connects a table–table join's decision store (its exactly-once form, see
/// `dsl::join::Decision`); returns the nodes that emit the joined table's updates.
pub(crate) type JoinWire = Box<dyn FnOnce() -> Vec<NodeId> + Send + Sync>;

/// A table–table join, whose form the guarantee the topology is built with decides, in
/// whichever order the builder was told.
pub(crate) struct PendingTableJoin {
    /// The join's two nodes (one per side), from which the joined table's operators read
    /// until the decision store is connected between them.
    pub(crate) sides: [NodeId; 2],
    pub(crate) wire: JoinWire,
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A child that counts the records it is given into `seen`.
    fn counter(seen: &Arc<AtomicUsize>) -> Processor<u8, u8> {
        let seen = Arc::clone(seen);
        Arc::new(move |_, _, _| {
            seen.fetch_add(1, Ordering::Relaxed);
            Ok(())
        })
    }

    #[test]
    fn every_child_added_before_the_first_record_gets_every_record() {
        let (node, seen) = (Downstream::<u8, u8>::new(), Arc::new(AtomicUsize::new(0)));
        let clone = node.clone();
        node.add(counter(&seen));
        clone.add(counter(&seen));
        let mut ctx = Ctx::new(Vec::new(), 0);
        for i in 0..3 {
            node.forward(&mut ctx, i, i).unwrap();
        }
        assert_eq!(seen.load(Ordering::Relaxed), 6);
        assert_eq!(clone.readers(), 2);
    }

    #[test]
    #[should_panic(expected = "already processed records")]
    fn a_child_added_after_the_first_record_is_refused_not_left_out() {
        let (node, seen) = (Downstream::<u8, u8>::new(), Arc::new(AtomicUsize::new(0)));
        node.add(counter(&seen));
        node.forward(&mut Ctx::new(Vec::new(), 0), 1, 1).unwrap();
        node.add(counter(&seen));
    }
}
