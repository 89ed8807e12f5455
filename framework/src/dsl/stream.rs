//! `KStream`: an unbounded stream of key-value records.

use std::sync::Arc;

use super::{Downstream, KGroupedStream, Shared, lock};
use crate::runtime::context::Origin;
use crate::serdes::Serde;
use crate::sink::{OutputRecord, SOURCE_HEADER, VERSION_HEADER};

/// A stream of key-value records, as Kafka Streams' `KStream`. Operators return new
/// streams; a stream may feed several operators (each record reaches all of them once).
///
/// ```
/// use lambda_streams::dsl::StreamsBuilder;
/// use lambda_streams::serdes::{Unit, Utf8};
///
/// let builder = StreamsBuilder::new();
/// builder
///     .stream("text-lines", Unit, Utf8)
///     .filter(|_, line| !line.is_empty())
///     .map_values(|line| line.to_uppercase())
///     .to("shouted", Unit, Utf8);
/// let topology = builder.build();
/// assert_eq!(topology.sink_topics(), vec!["shouted".to_string()]);
/// ```
pub struct KStream<K, V> {
    shared: Shared,
    downstream: Downstream<K, V>,
}

impl<K, V> KStream<K, V>
where
    K: Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    pub(crate) fn new(shared: Shared, downstream: Downstream<K, V>) -> Self {
        KStream { shared, downstream }
    }

    fn describe(&self, line: String) {
        lock(&self.shared).description.push(line);
    }

    /// Attaches a child that maps each record to zero or more records of a new stream.
    fn child<K2, V2>(
        &self,
        name: &str,
        f: impl Fn(K, V, &mut dyn FnMut(K2, V2)) + Send + Sync + 'static,
    ) -> KStream<K2, V2>
    where
        K2: Clone + Send + Sync + 'static,
        V2: Clone + Send + Sync + 'static,
    {
        let next = Downstream::<K2, V2>::new();
        let out = next.clone();
        self.downstream.add(Arc::new(move |ctx, k, v| {
            let mut produced = Vec::new();
            f(k, v, &mut |k2, v2| produced.push((k2, v2)));
            for (k2, v2) in produced {
                out.forward(ctx, k2, v2)?;
            }
            Ok(())
        }));
        self.describe(format!("  Processor: {name}"));
        KStream::new(self.shared.clone(), next)
    }

    /// Keeps the records for which `predicate` is true.
    pub fn filter(&self, predicate: impl Fn(&K, &V) -> bool + Send + Sync + 'static) -> Self {
        self.child("filter", move |k, v, out| {
            if predicate(&k, &v) {
                out(k, v)
            }
        })
    }

    /// Keeps the records for which `predicate` is false.
    pub fn filter_not(&self, predicate: impl Fn(&K, &V) -> bool + Send + Sync + 'static) -> Self {
        self.filter(move |k, v| !predicate(k, v))
    }

    /// Transforms each record into a new key and value.
    pub fn map<K2, V2>(
        &self,
        f: impl Fn(K, V) -> (K2, V2) + Send + Sync + 'static,
    ) -> KStream<K2, V2>
    where
        K2: Clone + Send + Sync + 'static,
        V2: Clone + Send + Sync + 'static,
    {
        self.child("map", move |k, v, out| {
            let (k2, v2) = f(k, v);
            out(k2, v2)
        })
    }

    /// Transforms each value, keeping the key.
    pub fn map_values<V2>(&self, f: impl Fn(V) -> V2 + Send + Sync + 'static) -> KStream<K, V2>
    where
        V2: Clone + Send + Sync + 'static,
    {
        self.child("map_values", move |k, v, out| out(k, f(v)))
    }

    /// Turns each value into zero or more values, each with the record's key.
    pub fn flat_map_values<V2, I>(
        &self,
        f: impl Fn(V) -> I + Send + Sync + 'static,
    ) -> KStream<K, V2>
    where
        V2: Clone + Send + Sync + 'static,
        I: IntoIterator<Item = V2>,
    {
        self.child("flat_map_values", move |k, v, out| {
            for v2 in f(v) {
                out(k.clone(), v2)
            }
        })
    }

    /// Calls `f` on each record and passes the record on unchanged.
    pub fn peek(&self, f: impl Fn(&K, &V) + Send + Sync + 'static) -> Self {
        self.child("peek", move |k, v, out| {
            f(&k, &v);
            out(k, v)
        })
    }

    /// Groups the records by a new key computed by `f`, for an aggregation.
    ///
    /// This is the *direct* re-keying mode (design notes, section 4a): the aggregation
    /// writes the state item of the new key straight from every source partition. The
    /// per-partition watermarks keep the state exact; each emitted update carries the
    /// item's version in the `lambda-streams-version` header, so a consumer keeps the
    /// highest version per key.
    pub fn group_by<K2>(
        &self,
        f: impl Fn(&K, &V) -> K2 + Send + Sync + 'static,
        key_serde: impl Serde<K2>,
    ) -> KGroupedStream<K2, V>
    where
        K2: Clone + Send + Sync + 'static,
    {
        let rekeyed = self.child("group_by", move |k, v, out| {
            let k2 = f(&k, &v);
            out(k2, v)
        });
        KGroupedStream::new(self.shared.clone(), rekeyed.downstream, Arc::new(key_serde))
    }

    /// Groups the records by their current key, for an aggregation.
    pub fn group_by_key(&self, key_serde: impl Serde<K>) -> KGroupedStream<K, V> {
        KGroupedStream::new(
            self.shared.clone(),
            self.downstream.clone(),
            Arc::new(key_serde),
        )
    }

    /// Produces every record to `topic`. Output records carry a header naming their origin:
    /// `lambda-streams-source` (`<topic>:<partition>:<offset>` of the source record) for
    /// records of a source stream, `lambda-streams-version` (the state item's version)
    /// for table updates.
    pub fn to(&self, topic: &str, key_serde: impl Serde<K>, value_serde: impl Serde<V>) {
        let topic_name = topic.to_owned();
        self.downstream.add(Arc::new(move |ctx, k, v| {
            let (headers, timestamp) = match ctx.origin {
                Origin::Record {
                    tp,
                    offset,
                    timestamp,
                } => {
                    let tp = &ctx.partitions[tp as usize];
                    let origin = format!("{}:{}:{}", tp.topic, tp.partition, offset);
                    (
                        vec![(SOURCE_HEADER.to_owned(), origin.into_bytes())],
                        timestamp,
                    )
                }
                Origin::Update { version, timestamp } => (
                    vec![(VERSION_HEADER.to_owned(), version.to_string().into_bytes())],
                    timestamp,
                ),
            };
            ctx.outputs.push(OutputRecord {
                topic: topic_name.clone(),
                key: key_serde.serialize(&k),
                value: value_serde.serialize(&v),
                headers,
                timestamp: Some(timestamp),
            });
            Ok(())
        }));
        let mut inner = lock(&self.shared);
        inner.sink_topics.insert(topic.to_owned());
        inner.description.push(format!("  Sink: {topic}"));
    }
}
