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
mod grouped;
mod stream;
mod table;
mod versioned;
mod windowed;

use std::sync::Arc;

pub use crate::topology::Topology;
pub use crate::topology::describe::{Node, NodeKind, SubTopology, TopologyDescription};
pub use aggregators::Score;
pub use grouped::KGroupedStream;
pub use rekey::{Grouped, Rekeying};
pub use stream::{BranchedKStream, KStream};
pub use table::KTable;

mod join;
mod rekey;
mod repartition;
mod session;
mod sliding;
mod state_codec;
mod stream_join;
mod suppress;
pub use session::{SessionWindowedKStream, SessionWindows};
pub use sliding::{SlidingWindowedKStream, SlidingWindows};
pub use stream_join::JoinWindows;
pub use suppress::Suppressed;
pub use windowed::{EmitStrategy, TimeWindowedKStream, TimeWindows, Windowed};

use crate::error::{StreamError, TopologyError};
use crate::event::Record;
use crate::serdes::Serde;
use crate::topology::ahead::{Read, ReadAheadFn, read_run};
use crate::topology::context::Ctx;
pub(crate) use crate::topology::{Downstream, Shared, Source, SourceFn, StoreSpec, UpdateFn, lock};

/// A source record's key and value, or the error naming the record and the side that
/// does not deserialize.
/// A `reduce` as an aggregation over `Option<V>` (Kafka Streams' rule): a key's (or
/// window's) first value is its aggregate, each later one is combined with
/// `reducer(aggregate, value)`.
fn reduce_adder<K, V>(
    reducer: impl Fn(V, V) -> V + Send + Sync + 'static,
) -> impl Fn(&K, V, Option<V>) -> Option<V> + Send + Sync + 'static {
    move |_, value, acc| {
        Some(match acc {
            Some(acc) => reducer(acc, value),
            None => value,
        })
    }
}

fn decode_record<K, V>(
    ctx: &Ctx,
    record: &Record,
    key_serde: &impl Serde<K>,
    value_serde: &impl Serde<V>,
) -> Result<(K, V), StreamError> {
    read_record(record, key_serde, value_serde).map_err(|(side, e)| ctx.deserialize_error(side, e))
}

/// A source record's key and value, or the side that does not deserialize and why (the
/// key first, as [`decode_record`] names it): what a source reads ahead.
fn read_record<K, V>(
    record: &Record,
    key_serde: &impl Serde<K>,
    value_serde: &impl Serde<V>,
) -> Read<K, V> {
    let key = key_serde
        .deserialize_with_schema(record.key.as_deref(), record.key_schema_metadata.as_ref())
        .map_err(|e| ("key", e))?;
    let value = value_serde
        .deserialize_with_schema(
            record.value.as_deref(),
            record.value_schema_metadata.as_ref(),
        )
        .map_err(|e| ("value", e))?;
    Ok((key, value))
}

/// [`decode_record`] of a key and a value given apart (a repartition record whose key
/// stands in for a null one decodes `None` as its key).
fn decode_parts<K, V>(
    ctx: &Ctx,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    key_serde: &impl Serde<K>,
    value_serde: &impl Serde<V>,
) -> Result<(K, V), StreamError> {
    let key = key_serde
        .deserialize(key)
        .map_err(|e| ctx.deserialize_error("key", e))?;
    let value = value_serde
        .deserialize(value)
        .map_err(|e| ctx.deserialize_error("value", e))?;
    Ok((key, value))
}

/// A timestamp extractor: `(key, value, record timestamp) -> event time`.
type Extractor<K, V> = Arc<dyn Fn(&K, &V, i64) -> i64 + Send + Sync>;

/// Builds a [`Topology`]: start with [`stream`](Self::stream), chain operators, then
/// [`build`](Self::build).
pub struct StreamsBuilder {
    shared: Shared,
}

impl Default for StreamsBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl StreamsBuilder {
    /// A new, empty builder. Its output guarantee is `LAMBDA_STREAMS_OUTPUT_GUARANTEE`'s
    /// when that is set to a valid value (the handler reads the same variable, and refuses
    /// an invalid one), so that the operators that are built differently under exactly-once
    /// output (a table–table join's decision store) are built for the guarantee the function
    /// is deployed with; [`output_guarantee`](Self::output_guarantee) overrides it, at any
    /// time before [`build`](Self::build), which builds them for the guarantee it holds.
    pub fn new() -> Self {
        let builder = StreamsBuilder {
            shared: Shared::default(),
        };
        let from_env = std::env::var("LAMBDA_STREAMS_OUTPUT_GUARANTEE")
            .ok()
            .and_then(|g| g.parse::<crate::OutputGuarantee>().ok());
        if let Some(guarantee) = from_env {
            builder.output_guarantee(guarantee);
        }
        builder
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
        self.source(topic, key_serde, value_serde, None)
    }

    /// Reads `topic` as a stream whose event time comes from `extractor(key, value,
    /// record timestamp)` instead of the record's timestamp, as Kafka Streams'
    /// `Consumed.withTimestampExtractor`: windows, grace, stream time (persisted per
    /// partition) and the timestamps of the records produced from it all use the extracted
    /// time. Otherwise as [`stream`](Self::stream).
    ///
    /// ```
    /// use std::time::Duration;
    /// use lambda_streams::driver::TestDriver;
    /// use lambda_streams::dsl::{Grouped, TimeWindows};
    /// use lambda_streams::serdes::{DecimalI64, Json, Unit, Utf8};
    /// use lambda_streams::StreamsBuilder;
    ///
    /// #[derive(Clone, serde::Serialize, serde::Deserialize)]
    /// struct Reading { sensor: String, at_ms: i64 }
    ///
    /// let builder = StreamsBuilder::new();
    /// builder
    ///     // The time a reading was taken, not the time it reached Kafka.
    ///     .stream_with_timestamps("readings", Unit, Json::<Reading>::new(), |_, r: &Reading, _| r.at_ms)
    ///     .group_by(|_, r| r.sensor.clone(), Grouped::direct(Utf8))
    ///     .windowed_by(TimeWindows::of_size(Duration::from_secs(60)))
    ///     .count("per-minute")
    ///     .to_stream()
    ///     .map(|w, n| (format!("{}@{}", w.key, w.start), n))
    ///     .to("counts", Utf8, DecimalI64);
    /// let driver = TestDriver::new(builder.build());
    /// let mut input = driver.input_topic("readings", Unit, Json::<Reading>::new());
    /// // Both arrive at 500 s, but were taken in two different minutes.
    /// input.pipe_input_with_timestamp((), Reading { sensor: "s1".into(), at_ms: 30_000 }, 500_000)?;
    /// input.pipe_input_with_timestamp((), Reading { sensor: "s1".into(), at_ms: 90_000 }, 500_000)?;
    /// let counts = driver.output_topic("counts", Utf8, DecimalI64).read_key_values_to_map()?;
    /// assert_eq!((counts["s1@0"], counts["s1@60000"]), (1, 1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn stream_with_timestamps<K, V>(
        &self,
        topic: &str,
        key_serde: impl Serde<K>,
        value_serde: impl Serde<V>,
        extractor: impl Fn(&K, &V, i64) -> i64 + Send + Sync + 'static,
    ) -> KStream<K, V>
    where
        K: Clone + Send + Sync + 'static,
        V: Clone + Send + Sync + 'static,
    {
        self.source(topic, key_serde, value_serde, Some(Arc::new(extractor)))
    }

    /// A source of `topic`; with `extractor`, its records' event time is the extracted one.
    fn source<K, V>(
        &self,
        topic: &str,
        key_serde: impl Serde<K>,
        value_serde: impl Serde<V>,
        extractor: Option<Extractor<K, V>>,
    ) -> KStream<K, V>
    where
        K: Clone + Send + Sync + 'static,
        V: Clone + Send + Sync + 'static,
    {
        let downstream = Downstream::<K, V>::new();
        let out = downstream.clone();
        let extracted = extractor.is_some();
        lock(&self.shared).learn_nulls(value_serde.nulls());
        let serdes = Arc::new((key_serde, value_serde));
        let read = Arc::clone(&serdes);
        let ahead: ReadAheadFn = Arc::new(move |records| {
            let read = |record: &Record| read_record(record, &read.0, &read.1);
            let (slots, stopped) = read_run(records, &read);
            (Box::new(slots) as Box<dyn std::any::Any + Send>, stopped)
        });
        let read: SourceFn = Arc::new(move |ctx, record, ahead| {
            let (key, value) = match ahead.take::<Read<K, V>>() {
                Some(read) => read.map_err(|(side, e)| ctx.deserialize_error(side, e))?,
                None => decode_record(ctx, record, &serdes.0, &serdes.1)?,
            };
            if let Some(extract) = &extractor {
                ctx.set_event_time(extract(&key, &value, record.timestamp));
            }
            out.forward(ctx, key, value)
        });
        let source = Source {
            read,
            ahead: Some(ahead),
        };
        let mut inner = lock(&self.shared);
        if extracted {
            inner.extracted.insert(topic.to_owned());
        }
        let node = inner.add_source(topic, source);
        drop(inner);
        KStream::from_node(Arc::clone(&self.shared), downstream, node)
    }

    /// Freezes the topology, or refuses it with a [`TopologyError`] naming the operator
    /// (its node name, as [`Topology::describe`] prints it) when a batch could not run it
    /// exactly once: a table's update stream aggregated (`to_stream().group_by_key()
    /// .count()`, `to_stream().to_table()`), repartitioned or buffered by a stream–stream
    /// join; a join of an emit-on-close window's updates; a store that would feed itself
    /// within one batch; a `suppress` that is not directly on a windowed aggregation's table. As Kafka Streams' `TopologyException` at build: a programming
    /// error, found before any record.
    ///
    /// It also fixes the order of each batch's steps: every store is written once, after
    /// all the stores whose updates or joins feed it, and a record waiting at a join goes
    /// on after the joined store's write (so chains of joins, and aggregations of joined
    /// records read by later joins, see the batch's own changes).
    ///
    /// ```
    /// use lambda_streams::StreamsBuilder;
    /// use lambda_streams::serdes::Utf8;
    ///
    /// let builder = StreamsBuilder::new();
    /// builder
    ///     .table("customers", Utf8, Utf8, "customers")
    ///     .to_stream()
    ///     .group_by_key(Utf8)
    ///     .count("updates"); // counts batches, not changes: refused
    /// let refused = builder.try_build().err().expect("refused");
    /// assert_eq!(refused.operator, "KSTREAM-AGGREGATE-0000000003");
    /// ```
    pub fn try_build(self) -> Result<Topology, TopologyError> {
        join::connect_decisions(&self.shared);
        rekey::resolve_all(&self.shared);
        let mut inner = std::mem::take(&mut *lock(&self.shared));
        if let Some(refused) = inner.refused.drain(..).next() {
            return Err(refused);
        }
        suppress::check(&inner)?;
        // A left or outer join closes on the stream times of the partitions feeding it.
        for index in 0..inner.stores.len() {
            if let Some(node) = inner.stores[index].closing.as_ref().map(|c| c.node) {
                let topics = inner.description.source_topics(node);
                if let Some(closing) = inner.stores[index].closing.as_mut() {
                    closing.topics = topics;
                }
            }
        }
        let order =
            crate::topology::order::write_order(&inner.description, &inner.roles, &inner.stores)?;
        inner.write_order = order.stores;
        inner.sort_hops = order.sort_hops;
        inner.unsourced_sinks = order.unsourced_sinks;
        inner.outboxed = order.outboxed;
        inner.decision_inputs = order.decision_inputs;
        let topology = Topology {
            inner: Arc::new(inner),
        };
        topology.check_output_guarantee(topology.output_guarantee())?;
        Ok(topology)
    }

    /// Asks for this output guarantee (Kafka Streams' `processing.guarantee`; the builder
    /// starts with `LAMBDA_STREAMS_OUTPUT_GUARANTEE`'s, see [`new`](Self::new)): with
    /// [`OutputGuarantee::ExactlyOnce`](crate::OutputGuarantee::ExactlyOnce),
    /// [`try_build`](Self::try_build) refuses a topology whose outputs cannot be produced
    /// exactly once yet, naming the sink, and a handler runs it with transactions whatever
    /// its `LAMBDA_STREAMS_OUTPUT_GUARANTEE`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lambda_streams::{OutputGuarantee, StreamsBuilder};
    /// use lambda_streams::dsl::{EmitStrategy, SessionWindows, TimeWindows};
    /// use lambda_streams::serdes::{BigEndianI64, Utf8};
    ///
    /// let builder = StreamsBuilder::new();
    /// builder.output_guarantee(OutputGuarantee::ExactlyOnce);
    /// let words = builder.stream("words", Utf8, Utf8);
    /// words.filter(|_, w| !w.is_empty()).to("non-empty", Utf8, Utf8); // records: fine
    /// words
    ///     .group_by_key(Utf8)
    ///     .count("counts")
    ///     .to_stream()
    ///     .to("counts", Utf8, BigEndianI64); // a table's updates: fine (the outbox)
    /// words
    ///     .group_by_key(Utf8)
    ///     .windowed_by(TimeWindows::of_size(Duration::from_secs(60)))
    ///     .emit_strategy(EmitStrategy::OnWindowClose)
    ///     .count("per-minute")
    ///     .to_stream()
    ///     .map(|w, n| (w.key, n))
    ///     .to("per-minute", Utf8, BigEndianI64); // a window's close: fine (claimed)
    /// let sessions = words
    ///     .group_by_key(Utf8)
    ///     .windowed_by_session(SessionWindows::with_inactivity_gap(Duration::from_secs(30)))
    ///     .count("sessions")
    ///     .to_stream()
    ///     .map(|w, n| (w.key, n));
    /// sessions.to("sessions", Utf8, BigEndianI64); // sessions on update: fine (the outbox)
    /// let lengths = builder
    ///     .stream("lengths", Utf8, Utf8)
    ///     .group_by_key(Utf8)
    ///     .count("lengths");
    /// sessions
    ///     .merge(&lengths.to_stream())
    ///     .to("merged", Utf8, BigEndianI64); // two stores' updates merged: fine (each outbox)
    /// let names = builder.table("names", Utf8, Utf8, "names");
    /// lengths
    ///     .to_stream()
    ///     .join(&names, |_, n: i64, name: String| format!("{name}:{n}"))
    ///     .to("named", Utf8, Utf8); // a table's updates through a join: fine (each outbox)
    /// assert!(builder.try_build().is_ok());
    ///
    /// // A table–table join is built for the guarantee the builder holds at `build`, in
    /// // whichever order it was asked: exactly once, its results are decided in a store.
    /// let join = |builder: &StreamsBuilder| {
    ///     let names = builder.table("names", Utf8, Utf8, "names");
    ///     let cities = builder.table("cities", Utf8, Utf8, "cities");
    ///     names
    ///         .join(&cities, |_, n: &String, c: &String| format!("{n}@{c}"))
    ///         .to_stream()
    ///         .to("profiles", Utf8, Utf8);
    /// };
    /// let builder = StreamsBuilder::new();
    /// join(&builder);
    /// builder.output_guarantee(OutputGuarantee::ExactlyOnce);
    /// assert!(builder.try_build().is_ok());
    ///
    /// // Built at least once, the join emits straight from the two tables' writes: a
    /// // handler run exactly once refuses it, naming the sink.
    /// let builder = StreamsBuilder::new();
    /// join(&builder);
    /// let topology = builder.try_build()?;
    /// let refused = topology
    ///     .check_output_guarantee(OutputGuarantee::ExactlyOnce)
    ///     .expect_err("refused");
    /// assert!(refused.operator.starts_with("KSTREAM-SINK"), "{refused}");
    /// # Ok::<(), lambda_streams::TopologyError>(())
    /// ```
    pub fn output_guarantee(&self, guarantee: crate::OutputGuarantee) {
        lock(&self.shared).output = guarantee;
    }

    /// Freezes the topology: [`try_build`](Self::try_build), for a topology known to be
    /// accepted.
    ///
    /// # Panics
    /// When [`try_build`](Self::try_build) refuses the topology, with its error's message
    /// (which names the operator, why, and what to do instead).
    pub fn build(self) -> Topology {
        match self.try_build() {
            Ok(topology) => topology,
            Err(refused) => panic!("{refused}"),
        }
    }
}
