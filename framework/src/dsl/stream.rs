//! `KStream`: an unbounded stream of key-value records, and its stateless operators.
//!
//! Longer than 800 lines because it is one type's operator set (each operator a short
//! method with its rustdoc example), as Kafka Streams' `KStream` is one interface.

use std::fmt::Display;
use std::sync::{Arc, PoisonError, RwLock};

use super::rekey::Grouped;
use super::{Downstream, KGroupedStream, Shared, lock};
use crate::error::StreamError;
use crate::serdes::Serde;
use crate::sink::{OutputRecord, SOURCE_HEADER, VERSION_HEADER};
use crate::topology::context::{Ctx, Origin};
use crate::topology::describe::{NodeId, NodeKind};
use crate::topology::{PendingRekey, Wire};
use crate::wire::SourceHeader;

/// A stream of key-value records, as Kafka Streams' `KStream`. Operators return new
/// streams; a stream may feed several operators (each record reaches all of them once).
///
/// Stateless operators run record by record, inline, in the order of the source
/// partition. User functions must not panic: a function that can fail on some input
/// uses a `try_` operator ([`try_map_values`](Self::try_map_values), ...), whose error
/// fails the batch with [`StreamError::User`] naming the record's topic-partition and offset.
///
/// ```
/// use lambda_streams::StreamsBuilder;
/// use lambda_streams::driver::TestDriver;
/// use lambda_streams::serdes::{Unit, Utf8};
///
/// let builder = StreamsBuilder::new();
/// builder
///     .stream("text-lines", Unit, Utf8)
///     .filter(|_, line| !line.is_empty())
///     .map_values(|line| line.to_uppercase())
///     .to("shouted", Unit, Utf8);
/// let driver = TestDriver::new(builder.build());
/// driver.input_topic("text-lines", Unit, Utf8).pipe_values(["hi", "", "yo"])?;
/// let shouted = driver.output_topic("shouted", Unit, Utf8).read_values()?;
/// assert_eq!(shouted, ["HI", "YO"]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct KStream<K, V> {
    shared: Shared,
    downstream: Downstream<K, V>,
    node: NodeId,
}

/// A branch predicate of [`KStream::split`].
type Predicate<K, V> = Arc<dyn Fn(&K, &V) -> bool + Send + Sync>;

impl<K, V> KStream<K, V>
where
    K: Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// The stream of a table's updates, emitted by the table's nodes `parents` (a
    /// `KTABLE-TOSTREAM` node). Prefer [`KStream::from_node`].
    pub(crate) fn new(shared: Shared, downstream: Downstream<K, V>, parents: &[NodeId]) -> Self {
        let mut inner = lock(&shared);
        let node = inner.description.add_node(
            "KTABLE-TOSTREAM",
            NodeKind::Processor { stores: vec![] },
            parents,
        );
        drop(inner);
        KStream::from_node(shared, downstream, node)
    }

    /// A stream whose records are emitted by `downstream`, drawn as `node` in the description.
    pub(crate) fn from_node(shared: Shared, downstream: Downstream<K, V>, node: NodeId) -> Self {
        KStream {
            shared,
            downstream,
            node,
        }
    }

    /// The node that emits this stream's records: the parent of the nodes that
    /// operators declared elsewhere (aggregations, joins) add to the description.
    pub(crate) fn node(&self) -> NodeId {
        self.node
    }

    /// The processors that receive this stream's records.
    pub(crate) fn downstream(&self) -> &Downstream<K, V> {
        &self.downstream
    }

    /// The topology under construction.
    pub(crate) fn shared(&self) -> Shared {
        self.shared.clone()
    }

    /// Adds a stateless processor node reading from `parents`; returns it and its name.
    fn add_processor(&self, prefix: &str, parents: &[NodeId]) -> (NodeId, String) {
        let mut inner = lock(&self.shared);
        let kind = NodeKind::Processor { stores: vec![] };
        let node = inner.description.add_node(prefix, kind, parents);
        (node, inner.description.name(node).to_owned())
    }

    /// Attaches a child processor: `f` gets each record and the child's downstream, and
    /// forwards zero or more records to it.
    pub(crate) fn child<K2, V2>(
        &self,
        prefix: &str,
        f: impl Fn(&mut Ctx, K, V, &Downstream<K2, V2>) -> Result<(), StreamError>
        + Send
        + Sync
        + 'static,
    ) -> KStream<K2, V2>
    where
        K2: Clone + Send + Sync + 'static,
        V2: Clone + Send + Sync + 'static,
    {
        let next = Downstream::<K2, V2>::new();
        let out = next.clone();
        self.downstream
            .add(Arc::new(move |ctx, k, v| f(ctx, k, v, &out)));
        let (node, _) = self.add_processor(prefix, &[self.node]);
        KStream::from_node(self.shared.clone(), next, node)
    }

    /// Keeps the records for which `predicate` is true.
    ///
    /// ```
    /// # use lambda_streams::{StreamsBuilder, driver::TestDriver, serdes::{Utf8, DecimalI64}};
    /// let builder = StreamsBuilder::new();
    /// builder
    ///     .stream("amounts", Utf8, DecimalI64)
    ///     .filter(|_, amount| *amount >= 100)
    ///     .to("large", Utf8, DecimalI64);
    /// let driver = TestDriver::new(builder.build());
    /// driver.input_topic("amounts", Utf8, DecimalI64)
    ///     .pipe_key_values([("a", 50), ("b", 100), ("c", 7), ("d", 250)])?;
    /// assert_eq!(
    ///     driver.output_topic("large", Utf8, DecimalI64).read_key_values()?,
    ///     [("b".to_string(), 100), ("d".to_string(), 250)]
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn filter(&self, predicate: impl Fn(&K, &V) -> bool + Send + Sync + 'static) -> Self {
        self.child("KSTREAM-FILTER", move |ctx, k, v, out| {
            if predicate(&k, &v) {
                out.forward(ctx, k, v)?;
            }
            Ok(())
        })
    }

    /// Keeps the records for which `predicate` is false.
    ///
    /// ```
    /// # use lambda_streams::{StreamsBuilder, driver::TestDriver, serdes::{Utf8, DecimalI64}};
    /// let builder = StreamsBuilder::new();
    /// builder
    ///     .stream("amounts", Utf8, DecimalI64)
    ///     .filter_not(|_, amount| *amount >= 100)
    ///     .to("small", Utf8, DecimalI64);
    /// let driver = TestDriver::new(builder.build());
    /// driver.input_topic("amounts", Utf8, DecimalI64)
    ///     .pipe_key_values([("a", 50), ("b", 100), ("c", 7)])?;
    /// assert_eq!(
    ///     driver.output_topic("small", Utf8, DecimalI64).read_key_values()?,
    ///     [("a".to_string(), 50), ("c".to_string(), 7)]
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn filter_not(&self, predicate: impl Fn(&K, &V) -> bool + Send + Sync + 'static) -> Self {
        self.filter(move |k, v| !predicate(k, v))
    }

    /// Transforms each record into a new key and value.
    ///
    /// ```
    /// # use lambda_streams::{StreamsBuilder, driver::TestDriver, serdes::{Utf8, DecimalI64}};
    /// let builder = StreamsBuilder::new();
    /// builder
    ///     .stream("scores", Utf8, DecimalI64)
    ///     .map(|player: String, score| (score.to_string(), player.len() as i64))
    ///     .to("by-score", Utf8, DecimalI64);
    /// let driver = TestDriver::new(builder.build());
    /// driver.input_topic("scores", Utf8, DecimalI64).pipe_key_values([("ann", 7), ("bo", 9)])?;
    /// assert_eq!(
    ///     driver.output_topic("by-score", Utf8, DecimalI64).read_key_values()?,
    ///     [("7".to_string(), 3), ("9".to_string(), 2)]
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn map<K2, V2>(
        &self,
        f: impl Fn(K, V) -> (K2, V2) + Send + Sync + 'static,
    ) -> KStream<K2, V2>
    where
        K2: Clone + Send + Sync + 'static,
        V2: Clone + Send + Sync + 'static,
    {
        self.child("KSTREAM-MAP", move |ctx, k, v, out| {
            let (k2, v2) = f(k, v);
            out.forward(ctx, k2, v2)
        })
    }

    /// Transforms each value, keeping the key.
    ///
    /// ```
    /// # use lambda_streams::{StreamsBuilder, driver::TestDriver, serdes::{Utf8, DecimalI64}};
    /// let builder = StreamsBuilder::new();
    /// builder
    ///     .stream("words", Utf8, Utf8)
    ///     .map_values(|word| word.chars().count() as i64)
    ///     .to("lengths", Utf8, DecimalI64);
    /// let driver = TestDriver::new(builder.build());
    /// driver.input_topic("words", Utf8, Utf8).pipe_input("k", "café")?;
    /// assert_eq!(
    ///     driver.output_topic("lengths", Utf8, DecimalI64).read_key_values()?,
    ///     [("k".to_string(), 4)]
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn map_values<V2>(&self, f: impl Fn(V) -> V2 + Send + Sync + 'static) -> KStream<K, V2>
    where
        V2: Clone + Send + Sync + 'static,
    {
        self.child("KSTREAM-MAPVALUES", move |ctx, k, v, out| {
            out.forward(ctx, k, f(v))
        })
    }

    /// Turns each record into zero or more records with new keys and values.
    ///
    /// ```
    /// # use lambda_streams::{StreamsBuilder, driver::TestDriver, serdes::{Utf8, DecimalI64}};
    /// // A sentence keyed by its author becomes one record per word, keyed by the word.
    /// let builder = StreamsBuilder::new();
    /// builder
    ///     .stream("sentences", Utf8, Utf8)
    ///     .flat_map(|author: String, sentence: String| {
    ///         sentence
    ///             .split_whitespace()
    ///             .map(|w| (w.to_owned(), author.clone()))
    ///             .collect::<Vec<_>>()
    ///     })
    ///     .to("word-authors", Utf8, Utf8);
    /// let driver = TestDriver::new(builder.build());
    /// driver.input_topic("sentences", Utf8, Utf8).pipe_input("ann", "hi there")?;
    /// assert_eq!(
    ///     driver.output_topic("word-authors", Utf8, Utf8).read_key_values()?,
    ///     [("hi".to_string(), "ann".to_string()), ("there".to_string(), "ann".to_string())]
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn flat_map<K2, V2, I>(
        &self,
        f: impl Fn(K, V) -> I + Send + Sync + 'static,
    ) -> KStream<K2, V2>
    where
        K2: Clone + Send + Sync + 'static,
        V2: Clone + Send + Sync + 'static,
        I: IntoIterator<Item = (K2, V2)>,
    {
        self.child("KSTREAM-FLATMAP", move |ctx, k, v, out| {
            for (k2, v2) in f(k, v) {
                out.forward(ctx, k2, v2)?;
            }
            Ok(())
        })
    }

    /// Turns each value into zero or more values, each with the record's key.
    ///
    /// ```
    /// # use lambda_streams::{StreamsBuilder, driver::TestDriver, serdes::{Unit, Utf8}};
    /// let builder = StreamsBuilder::new();
    /// builder
    ///     .stream("text-lines", Unit, Utf8)
    ///     .flat_map_values(|line: String| {
    ///         line.split_whitespace().map(str::to_owned).collect::<Vec<_>>()
    ///     })
    ///     .to("words", Unit, Utf8);
    /// let driver = TestDriver::new(builder.build());
    /// driver.input_topic("text-lines", Unit, Utf8).pipe_values(["a b", "", "c"])?;
    /// assert_eq!(driver.output_topic("words", Unit, Utf8).read_values()?, ["a", "b", "c"]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn flat_map_values<V2, I>(
        &self,
        f: impl Fn(V) -> I + Send + Sync + 'static,
    ) -> KStream<K, V2>
    where
        V2: Clone + Send + Sync + 'static,
        I: IntoIterator<Item = V2>,
    {
        self.child("KSTREAM-FLATMAPVALUES", move |ctx, k, v, out| {
            let mut values = f(v).into_iter().peekable();
            while let Some(v2) = values.next() {
                if values.peek().is_some() {
                    out.forward(ctx, k.clone(), v2)?;
                } else {
                    return out.forward(ctx, k, v2);
                }
            }
            Ok(())
        })
    }

    /// Gives each record a new key computed from its key and value; the value is kept.
    ///
    /// ```
    /// # use lambda_streams::{StreamsBuilder, driver::TestDriver, serdes::{Unit, Utf8}};
    /// // Key each email by its domain.
    /// let builder = StreamsBuilder::new();
    /// builder
    ///     .stream("emails", Unit, Utf8)
    ///     .select_key(|_, email| email.rsplit('@').next().unwrap_or_default().to_owned())
    ///     .to("emails-by-domain", Utf8, Utf8);
    /// let driver = TestDriver::new(builder.build());
    /// driver.input_topic("emails", Unit, Utf8).pipe_values(["ann@a.org", "bo@b.net"])?;
    /// assert_eq!(
    ///     driver.output_topic("emails-by-domain", Utf8, Utf8).read_key_values()?,
    ///     [("a.org".to_string(), "ann@a.org".to_string()), ("b.net".to_string(), "bo@b.net".to_string())]
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn select_key<K2>(&self, f: impl Fn(&K, &V) -> K2 + Send + Sync + 'static) -> KStream<K2, V>
    where
        K2: Clone + Send + Sync + 'static,
    {
        self.child("KSTREAM-KEY-SELECT", move |ctx, k, v, out| {
            let k2 = f(&k, &v);
            out.forward(ctx, k2, v)
        })
    }

    /// Calls `f` on each record and passes the record on unchanged (for logging or metrics).
    ///
    /// ```
    /// # use lambda_streams::{StreamsBuilder, driver::TestDriver, serdes::{Unit, Utf8}};
    /// use std::sync::{Arc, Mutex};
    ///
    /// let seen = Arc::new(Mutex::new(Vec::new()));
    /// let log = Arc::clone(&seen);
    /// let builder = StreamsBuilder::new();
    /// builder
    ///     .stream("in", Unit, Utf8)
    ///     .peek(move |_, v| log.lock().unwrap().push(v.clone()))
    ///     .to("out", Unit, Utf8);
    /// let driver = TestDriver::new(builder.build());
    /// driver.input_topic("in", Unit, Utf8).pipe_values(["x", "y"])?;
    /// assert_eq!(*seen.lock().unwrap(), ["x", "y"]);
    /// assert_eq!(driver.output_topic("out", Unit, Utf8).read_values()?, ["x", "y"]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn peek(&self, f: impl Fn(&K, &V) + Send + Sync + 'static) -> Self {
        self.child("KSTREAM-PEEK", move |ctx, k, v, out| {
            f(&k, &v);
            out.forward(ctx, k, v)
        })
    }

    /// Calls `f` on each record; the stream ends here (a terminal operation).
    ///
    /// The function runs when the batch is processed, before its state writes and
    /// output; a retried batch runs it again (at-least-once side effects).
    ///
    /// ```
    /// # use lambda_streams::{StreamsBuilder, driver::TestDriver, serdes::{Utf8, DecimalI64}};
    /// use std::sync::{Arc, Mutex};
    ///
    /// let total = Arc::new(Mutex::new(0));
    /// let sum = Arc::clone(&total);
    /// let builder = StreamsBuilder::new();
    /// builder
    ///     .stream("amounts", Utf8, DecimalI64)
    ///     .foreach(move |_, amount| *sum.lock().unwrap() += amount);
    /// let driver = TestDriver::new(builder.build());
    /// driver.input_topic("amounts", Utf8, DecimalI64).pipe_key_values([("a", 2), ("b", 40)])?;
    /// assert_eq!(*total.lock().unwrap(), 42);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn foreach(&self, f: impl Fn(K, V) + Send + Sync + 'static) {
        self.downstream.add(Arc::new(move |_ctx, k, v| {
            f(k, v);
            Ok(())
        }));
        self.add_processor("KSTREAM-FOREACH", &[self.node]);
    }

    /// Transforms each value with a function that may fail. An error fails the batch
    /// with [`StreamError::User`], naming the record's topic-partition and offset, the
    /// operator's node and the error; it never panics.
    ///
    /// ```
    /// # use lambda_streams::{StreamsBuilder, StreamError, driver::TestDriver, serdes::{Unit, Utf8, DecimalI64}};
    /// let builder = StreamsBuilder::new();
    /// builder
    ///     .stream("numbers", Unit, Utf8)
    ///     .try_map_values(|text: String| text.parse::<i64>())
    ///     .to("parsed", Unit, DecimalI64);
    /// let driver = TestDriver::new(builder.build());
    /// let mut input = driver.input_topic("numbers", Unit, Utf8);
    /// input.pipe_value("12")?;
    /// let err = input.pipe_value("twelve").unwrap_err();
    /// assert!(matches!(&err, StreamError::User { offset: 1, .. }));
    /// assert_eq!(
    ///     err.to_string(),
    ///     "record numbers-0 offset 1: KSTREAM-MAPVALUES-0000000001: invalid digit found in string"
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_map_values<V2, E>(
        &self,
        f: impl Fn(V) -> Result<V2, E> + Send + Sync + 'static,
    ) -> KStream<K, V2>
    where
        V2: Clone + Send + Sync + 'static,
        E: Display,
    {
        self.try_child("KSTREAM-MAPVALUES", move |k, v, emit| emit(k, f(v)?))
    }

    /// Transforms each record into a new key and value with a function that may fail;
    /// an error fails the batch as with [`try_map_values`](Self::try_map_values).
    pub fn try_map<K2, V2, E>(
        &self,
        f: impl Fn(K, V) -> Result<(K2, V2), E> + Send + Sync + 'static,
    ) -> KStream<K2, V2>
    where
        K2: Clone + Send + Sync + 'static,
        V2: Clone + Send + Sync + 'static,
        E: Display,
    {
        self.try_child("KSTREAM-MAP", move |k, v, emit| {
            let (k2, v2) = f(k, v)?;
            emit(k2, v2)
        })
    }

    /// Turns each value into zero or more values with a function that may fail; an
    /// error fails the batch as with [`try_map_values`](Self::try_map_values).
    pub fn try_flat_map_values<V2, I, E>(
        &self,
        f: impl Fn(V) -> Result<I, E> + Send + Sync + 'static,
    ) -> KStream<K, V2>
    where
        V2: Clone + Send + Sync + 'static,
        I: IntoIterator<Item = V2>,
        E: Display,
    {
        self.try_child("KSTREAM-FLATMAPVALUES", move |k, v, emit| {
            for v2 in f(v)? {
                emit(k.clone(), v2)?;
            }
            Ok(())
        })
    }

    /// A child processor whose function may fail with a user error `E`. Errors of the
    /// operators downstream pass through unchanged; a user error becomes
    /// [`StreamError::User`] with the record's coordinates and the node's name.
    fn try_child<K2, V2, E>(
        &self,
        prefix: &str,
        f: impl Fn(K, V, &mut dyn FnMut(K2, V2) -> Result<(), TryError<E>>) -> Result<(), TryError<E>>
        + Send
        + Sync
        + 'static,
    ) -> KStream<K2, V2>
    where
        K2: Clone + Send + Sync + 'static,
        V2: Clone + Send + Sync + 'static,
        E: Display,
    {
        let next = Downstream::<K2, V2>::new();
        let out = next.clone();
        let (node, name) = self.add_processor(prefix, &[self.node]);
        self.downstream.add(Arc::new(move |ctx, k, v| {
            let result = {
                let mut emit = |k2, v2| out.forward(ctx, k2, v2).map_err(TryError::Downstream);
                f(k, v, &mut emit)
            };
            match result {
                Ok(()) => Ok(()),
                Err(TryError::Downstream(e)) => Err(e),
                Err(TryError::User(e)) => Err(ctx.user_error(format!("{name}: {e}"))),
            }
        }));
        KStream::from_node(self.shared.clone(), next, node)
    }

    /// Splits the stream into branches, as Kafka Streams' `split()`: each record goes
    /// to the **first** branch whose predicate it matches, or else to the default branch
    /// (if there is one), or else nowhere.
    ///
    /// ```
    /// # use lambda_streams::{StreamsBuilder, driver::TestDriver, serdes::{Utf8, DecimalI64}};
    /// let builder = StreamsBuilder::new();
    /// let split = builder.stream("amounts", Utf8, DecimalI64).split();
    /// split.branch("large", |_, a| *a >= 100).to("large", Utf8, DecimalI64);
    /// // 150 matches both predicates and goes to the first one only.
    /// split.branch("even", |_, a| a % 2 == 0).to("even", Utf8, DecimalI64);
    /// split.default_branch("rest").to("rest", Utf8, DecimalI64);
    ///
    /// let driver = TestDriver::new(builder.build());
    /// driver.input_topic("amounts", Utf8, DecimalI64)
    ///     .pipe_key_values([("a", 150), ("b", 4), ("c", 7), ("d", 100)])?;
    /// let read = |topic| driver.output_topic(topic, Utf8, DecimalI64).read_values();
    /// assert_eq!(read("large")?, [150, 100]);
    /// assert_eq!(read("even")?, [4]);
    /// assert_eq!(read("rest")?, [7]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn split(&self) -> BranchedKStream<K, V> {
        let arms = Arc::new(RwLock::new(Arms {
            branches: Vec::new(),
            default: None,
        }));
        let shared_arms = Arc::clone(&arms);
        self.downstream.add(Arc::new(move |ctx, k, v| {
            let arms = shared_arms.read().unwrap_or_else(PoisonError::into_inner);
            let target = arms
                .branches
                .iter()
                .find(|(predicate, _)| predicate(&k, &v))
                .map(|(_, out)| out)
                .or(arms.default.as_ref());
            match target {
                Some(out) => out.forward(ctx, k, v),
                None => Ok(()),
            }
        }));
        let (node, name) = self.add_processor("KSTREAM-BRANCH", &[self.node]);
        BranchedKStream {
            shared: self.shared.clone(),
            node,
            name,
            arms,
        }
    }

    /// One stream with the records of both `self` and `other` (Kafka Streams' `merge`).
    /// Records keep the order of their own source partition; there is no order between
    /// the two streams.
    ///
    /// # Panics
    /// When `other` comes from another [`StreamsBuilder`](super::StreamsBuilder): a
    /// programming error in the topology, caught when it is built.
    ///
    /// ```
    /// # use lambda_streams::{StreamsBuilder, driver::TestDriver, serdes::{Unit, Utf8}};
    /// let builder = StreamsBuilder::new();
    /// let web = builder.stream("web-clicks", Unit, Utf8);
    /// let app = builder.stream("app-clicks", Unit, Utf8).map_values(|c| format!("app:{c}"));
    /// web.merge(&app).to("clicks", Unit, Utf8);
    /// let driver = TestDriver::new(builder.build());
    /// driver.input_topic("web-clicks", Unit, Utf8).pipe_value("home")?;
    /// driver.input_topic("app-clicks", Unit, Utf8).pipe_value("cart")?;
    /// assert_eq!(driver.output_topic("clicks", Unit, Utf8).read_values()?, ["home", "app:cart"]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn merge(&self, other: &KStream<K, V>) -> KStream<K, V> {
        assert!(
            Arc::ptr_eq(&self.shared, &other.shared),
            "merge: both streams must come from the same StreamsBuilder"
        );
        let next = Downstream::<K, V>::new();
        for side in [&self.downstream, &other.downstream] {
            let out = next.clone();
            side.add(Arc::new(move |ctx, k, v| out.forward(ctx, k, v)));
        }
        let (node, _) = self.add_processor("KSTREAM-MERGE", &[self.node, other.node]);
        KStream::from_node(self.shared.clone(), next, node)
    }

    /// Groups the records by a new key computed by `f`, for an aggregation, as Kafka
    /// Streams' `groupBy`; `grouped` gives the serdes and the re-keying mode.
    ///
    /// With [`Grouped::with`]`(key_serde, value_serde)` the records go through a
    /// repartition topic when the aggregation's updates go to a topic and are emitted on
    /// every update (docs/state.md, "Direct or repartition"): the function consumes that
    /// topic too, each key is written by the one partition that owns it, and its updates
    /// reach the output in order. Otherwise, and always with [`Grouped::direct`]`(key_serde)`, the
    /// aggregation writes the new key's item straight from every source partition: the
    /// per-partition watermarks keep the state exact, and each emitted update carries the
    /// item's version in the `lambda-streams-version` header, so a consumer keeps the
    /// highest version per key. The mode is chosen by [`StreamsBuilder::build`](super::StreamsBuilder::build)
    /// and shown by [`Topology::describe`](super::Topology::describe). See
    /// [`Grouped`] and [`Rekeying`](super::Rekeying).
    ///
    /// ```
    /// use lambda_streams::driver::TestDriver;
    /// use lambda_streams::dsl::Grouped;
    /// use lambda_streams::serdes::{DecimalI64, Unit, Utf8};
    /// use lambda_streams::StreamsBuilder;
    ///
    /// let builder = StreamsBuilder::new();
    /// builder
    ///     .stream("words", Unit, Utf8)
    ///     .group_by(|_, word| word.clone(), Grouped::with(Utf8, Utf8))
    ///     .count("counts")
    ///     .to_stream()
    ///     .to("word-counts", Utf8, DecimalI64);
    /// let topology = builder.build();
    /// // The counts go to a topic: the words are repartitioned through `counts-repartition`.
    /// assert_eq!(topology.repartition_topics(), ["counts-repartition"]);
    /// let driver = TestDriver::new(topology); // reads the repartition topic back
    /// let mut words = driver.input_topic("words", Unit, Utf8);
    /// for w in ["a", "b", "a"] {
    ///     words.pipe_value(w.to_owned())?;
    /// }
    /// let counts = driver.output_topic("word-counts", Utf8, DecimalI64).read_key_values_to_map()?;
    /// assert_eq!((counts["a"], counts["b"]), (2, 1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn group_by<K2>(
        &self,
        f: impl Fn(&K, &V) -> K2 + Send + Sync + 'static,
        grouped: Grouped<K2, V>,
    ) -> KGroupedStream<K2, V>
    where
        K2: Clone + Send + Sync + 'static,
    {
        let rekeyed = self.select_key(f);
        let input = Downstream::<K2, V>::new();
        let node = rekeyed.node;
        let Grouped {
            key_serde,
            value_serde,
            rekeying,
            topic,
        } = grouped;
        if let Some(values) = &value_serde {
            lock(&self.shared).learn_nulls(values.nulls());
        }
        let (serde, to_input) = (Arc::clone(&key_serde), input.clone());
        let wire: Wire = Box::new(move |through: Option<&str>| {
            let (from, source) = match (through, value_serde) {
                (Some(topic), Some(values)) => {
                    let back = rekeyed.repartition_with(topic, serde, values);
                    let source = back.node;
                    (back, Some(source))
                }
                _ => (rekeyed, None),
            };
            from.downstream
                .add(Arc::new(move |ctx, k, v| to_input.forward(ctx, k, v)));
            source
        });
        let mut inner = lock(&self.shared);
        inner.description.set_grouped_parent(node);
        inner.rekeys.push(PendingRekey {
            node,
            rekeying,
            topic,
            wire,
        });
        drop(inner);
        KGroupedStream::new(self.shared.clone(), input, key_serde)
    }

    /// Groups the records by their current key, for an aggregation.
    pub fn group_by_key(&self, key_serde: impl Serde<K>) -> KGroupedStream<K, V> {
        lock(&self.shared).description.set_grouped_parent(self.node);
        KGroupedStream::new(
            self.shared.clone(),
            self.downstream.clone(),
            Arc::new(key_serde),
        )
    }

    /// Produces every record to `topic`, the key written with `key_serde` and the value
    /// with `value_serde`. The records go out after the batch's state writes, all
    /// acknowledged before the batch succeeds.
    ///
    /// Output records carry a header naming their origin:
    /// `lambda-streams-source` (`<topic>:<partition>:<offset>` of the source record) for
    /// records of a source stream, `lambda-streams-version` (the state item's version)
    /// for table updates; their timestamp is the source record's (or, for a table
    /// update, the latest of the records that changed it). A key or value that cannot
    /// be serialized ([`Serde::try_serialize`]) fails the batch with
    /// [`StreamError::User`] naming the record.
    ///
    /// ```
    /// # use lambda_streams::{StreamsBuilder, driver::TestDriver, serdes::{Utf8, BigEndianI64, DecimalI64}};
    /// let builder = StreamsBuilder::new();
    /// builder.stream("in", Utf8, DecimalI64).to("out", Utf8, BigEndianI64);
    /// let driver = TestDriver::new(builder.build());
    /// driver.input_topic("in", Utf8, DecimalI64).pipe_input("k", 258)?;
    /// let out = driver.read_output("out");
    /// assert_eq!(out[0].key.as_deref(), Some(&b"k"[..]));
    /// assert_eq!(out[0].value.as_deref(), Some(&[0, 0, 0, 0, 0, 0, 1, 2][..]));
    /// assert_eq!(out[0].header("lambda-streams-source"), Some(&b"in:0:0"[..]));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn to(&self, topic: &str, key_serde: impl Serde<K>, value_serde: impl Serde<V>) {
        lock(&self.shared).learn_nulls(value_serde.nulls());
        let topic_name = topic.to_owned();
        self.downstream.add(Arc::new(move |ctx, k, v| {
            let (headers, timestamp) = match ctx.origin {
                Origin::Record {
                    tp,
                    offset,
                    timestamp,
                } => {
                    let tp = &ctx.partitions[tp as usize];
                    (
                        vec![(SOURCE_HEADER.to_owned(), SourceHeader::write(tp, offset))],
                        timestamp,
                    )
                }
                Origin::Update { version, timestamp } => (
                    vec![(VERSION_HEADER.to_owned(), version.to_string().into_bytes())],
                    timestamp,
                ),
            };
            let serialize_error = |ctx: &Ctx, side: &str, e: crate::serdes::SerdeError| {
                let reason = format!("cannot serialize the {side} for topic {topic_name:?}: {e}");
                ctx.user_error(reason)
            };
            let key = key_serde
                .try_serialize_owned(k)
                .map_err(|e| serialize_error(ctx, "key", e))?;
            let value = value_serde
                .try_serialize_owned(v)
                .map_err(|e| serialize_error(ctx, "value", e))?;
            ctx.outputs.push(OutputRecord {
                topic: topic_name.clone(),
                key,
                value,
                headers,
                timestamp: Some(timestamp),
            });
            Ok(())
        }));
        let mut inner = lock(&self.shared);
        inner.sink_topics.insert(topic.to_owned());
        let kind = NodeKind::Sink {
            topic: topic.to_owned(),
        };
        inner
            .description
            .add_node("KSTREAM-SINK", kind, &[self.node]);
    }
}

/// Either a user function's error or an error of the operators downstream of it.
enum TryError<E> {
    User(E),
    Downstream(StreamError),
}

impl<E> From<E> for TryError<E> {
    fn from(e: E) -> Self {
        TryError::User(e)
    }
}

/// The branches of a [`KStream::split`], in declaration order.
struct Arms<K, V> {
    branches: Vec<(Predicate<K, V>, Downstream<K, V>)>,
    default: Option<Downstream<K, V>>,
}

/// A stream being split into branches by [`KStream::split`] (Kafka Streams'
/// `BranchedKStream`). Each [`branch`](Self::branch) returns the stream of the records
/// it takes; [`default_branch`](Self::default_branch) takes the records no branch took.
pub struct BranchedKStream<K, V> {
    shared: Shared,
    node: NodeId,
    name: String,
    arms: Arc<RwLock<Arms<K, V>>>,
}

impl<K, V> BranchedKStream<K, V>
where
    K: Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// Adds a branch named `name` (its node in the description is
    /// `<split node>-<name>`) that takes the records matching `predicate` that no
    /// earlier branch took.
    pub fn branch(
        &self,
        name: &str,
        predicate: impl Fn(&K, &V) -> bool + Send + Sync + 'static,
    ) -> KStream<K, V> {
        let out = Downstream::<K, V>::new();
        self.arms
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .branches
            .push((Arc::new(predicate), out.clone()));
        self.branch_stream(name, out)
    }

    /// The default branch, named `name`: the records that no branch took.
    pub fn default_branch(self, name: &str) -> KStream<K, V> {
        let out = Downstream::<K, V>::new();
        self.arms
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .default = Some(out.clone());
        self.branch_stream(name, out)
    }

    fn branch_stream(&self, name: &str, out: Downstream<K, V>) -> KStream<K, V> {
        let node = lock(&self.shared).description.add_named_node(
            format!("{}-{name}", self.name),
            NodeKind::Processor { stores: vec![] },
            &[self.node],
        );
        KStream::from_node(self.shared.clone(), out, node)
    }
}

#[cfg(test)]
mod tests {
    use crate::StreamsBuilder;
    use crate::serdes::{Unit, Utf8};

    #[test]
    fn every_operator_is_a_named_node() {
        let builder = StreamsBuilder::new();
        let s = builder.stream("in", Unit, Utf8);
        let split = s.filter(|_, _| true).split();
        let a = split.branch("a", |_, v| v.is_empty());
        let rest = split.default_branch("rest");
        a.merge(&rest).foreach(|_, _| {});
        let d = builder.build().describe();
        let names: Vec<&str> = d.nodes().map(|n| n.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "KSTREAM-SOURCE-0000000000",
                "KSTREAM-FILTER-0000000001",
                "KSTREAM-BRANCH-0000000002",
                "KSTREAM-BRANCH-0000000002-a",
                "KSTREAM-BRANCH-0000000002-rest",
                "KSTREAM-MERGE-0000000005",
                "KSTREAM-FOREACH-0000000006",
            ]
        );
        let merge = d.node("KSTREAM-MERGE-0000000005").unwrap();
        assert_eq!(
            merge.predecessors,
            [
                "KSTREAM-BRANCH-0000000002-a",
                "KSTREAM-BRANCH-0000000002-rest"
            ]
        );
    }
}
