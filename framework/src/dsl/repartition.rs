//! Repartitioning through an internal topic (design notes, section 4a).
//!
//! `repartition(topic, …)` produces the stream's records to `topic` (partitioned by their
//! key, with the idempotent producer; each record carries its original source
//! coordinates in the `lambda-streams-source` header) and reads them back from it: the
//! same function consumes the repartition topic through a second event source. The
//! records of one key then arrive in one partition, so one invocation at a time writes
//! its state and its updates are ordered per key.
//!
//! Exactly once across the hop: a record read back contributes to state under its
//! *original* source partition and offset, and items keep their watermarks on those. A
//! retried producer can write a record again, but only after the first copy, so a copy at
//! or below the highest original offset already seen (in the batch, or in the item's
//! watermark) is a duplicate and counts nothing.

use std::sync::Arc;

use super::{Downstream, KStream, SourceFn, lock};
use crate::error::StreamError;
use crate::event::TopicPartition;
use crate::serdes::Serde;
use crate::sink::{OutputRecord, SEQUENCE_HEADER, SOURCE_HEADER};
use crate::topology::describe::NodeKind;

/// How many records one source record may produce to a repartition topic: watermarks of
/// repartitioned records are `offset * RANKS + rank`.
const RANKS: i64 = 1 << 20;

impl<K, V> KStream<K, V>
where
    K: Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// Sends the records through the repartition topic `topic` (which the function must
    /// also consume: with the event source of its source topic, or a second one), keyed
    /// and valued with the serdes, and continues with the records read back from it. See
    /// the module documentation.
    ///
    /// ```
    /// use lambda_streams::driver::TestDriver;
    /// use lambda_streams::serdes::{DecimalI64, Unit, Utf8};
    /// use lambda_streams::StreamsBuilder;
    ///
    /// // WordCount with the counts owned by the partition of each word.
    /// let builder = StreamsBuilder::new();
    /// builder
    ///     .stream("lines", Unit, Utf8)
    ///     .flat_map(|_, line: String| {
    ///         line.split_whitespace().map(|w| (w.to_owned(), ())).collect::<Vec<_>>()
    ///     })
    ///     .repartition("words-by-word", Utf8, Unit)
    ///     .group_by_key(Utf8)
    ///     .count("counts")
    ///     .to_stream()
    ///     .to("word-counts", Utf8, DecimalI64);
    /// let driver = TestDriver::new(builder.build());
    /// driver.input_topic("lines", Unit, Utf8).pipe_value("to be or not to be".to_owned())?;
    /// let counts = driver.output_topic("word-counts", Utf8, DecimalI64).read_key_values_to_map()?;
    /// assert_eq!((counts["to"], counts["be"], counts["or"]), (2, 2, 1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn repartition(
        &self,
        topic: &str,
        key_serde: impl Serde<K>,
        value_serde: impl Serde<V>,
    ) -> KStream<K, V> {
        self.repartition_with(topic, Arc::new(key_serde), Arc::new(value_serde))
    }

    /// [`repartition`](Self::repartition) with shared serdes.
    pub(crate) fn repartition_with(
        &self,
        topic: &str,
        key_serde: Arc<dyn Serde<K>>,
        value_serde: Arc<dyn Serde<V>>,
    ) -> KStream<K, V> {
        self.produce_ranked(topic, Arc::clone(&key_serde), Arc::clone(&value_serde));
        let downstream = Downstream::<K, V>::new();
        let out = downstream.clone();
        let source: SourceFn = Arc::new(move |ctx, record| {
            let (Some((tp, offset)), Some((partition, _, _))) =
                (ctx.record_coordinates(), ctx.record_time())
            else {
                return Ok(());
            };
            let bad = |reason: String| StreamError::Deserialize {
                tp: tp.clone(),
                offset,
                side: "header",
                reason,
            };
            let header = record
                .headers
                .iter()
                .find(|h| h.name() == SOURCE_HEADER)
                .ok_or_else(|| {
                    bad(format!(
                        "a repartition topic's record needs its {SOURCE_HEADER} header"
                    ))
                })?;
            let (origin, source_offset) = parse_source(&header.value).ok_or_else(|| {
                bad(format!(
                    "{SOURCE_HEADER} is not <topic>:<partition>:<offset>"
                ))
            })?;
            let rank = record
                .headers
                .iter()
                .find(|h| h.name() == SEQUENCE_HEADER)
                .and_then(|h| std::str::from_utf8(&h.value).ok()?.parse::<i64>().ok())
                .filter(|r| (0..RANKS).contains(r))
                .ok_or_else(|| bad(format!("no valid {SEQUENCE_HEADER} header")))?;
            if !(0..i64::MAX / RANKS).contains(&source_offset) {
                return Err(bad(format!("source offset {source_offset} out of range")));
            }
            // The watermark position of this record: its source record, then its rank.
            let original_offset = source_offset * RANKS + rank;
            let index = match ctx.sources.iter().position(|t| *t == origin) {
                Some(i) => i,
                None => {
                    ctx.sources.push(origin);
                    ctx.sources.len() - 1
                }
            };
            let index = u32::try_from(index).unwrap_or(u32::MAX);
            let seen = ctx.seen.entry((partition, index)).or_insert(i64::MIN);
            if original_offset <= *seen {
                // A copy from a retried producer: its first copy came before.
                return Ok(());
            }
            *seen = original_offset;
            ctx.source = Some((index, original_offset));
            let key = key_serde
                .deserialize(record.key.as_deref())
                .map_err(|e| bad_side(&tp, offset, "key", e.0))?;
            let value = value_serde
                .deserialize(record.value.as_deref())
                .map_err(|e| bad_side(&tp, offset, "value", e.0))?;
            out.forward(ctx, key, value)
        });
        let shared = self.shared();
        let node = {
            let mut inner = lock(&shared);
            inner
                .sources
                .entry(topic.to_owned())
                .or_default()
                .push(source);
            let topics = vec![topic.to_owned()];
            inner
                .description
                .add_node("KSTREAM-SOURCE", NodeKind::Source { topics }, &[])
        };
        KStream::from_node(shared, downstream, node)
    }
}

impl<K, V> KStream<K, V>
where
    K: Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// Produces the records to repartition topic `topic` with their source coordinates and
    /// their rank among their source record's records there.
    fn produce_ranked(
        &self,
        topic: &str,
        key_serde: Arc<dyn Serde<K>>,
        value_serde: Arc<dyn Serde<V>>,
    ) {
        let name = topic.to_owned();
        let topic = name.clone();
        self.downstream().add(Arc::new(move |ctx, key, value| {
            let (Some((tp, offset)), Some((index, _, timestamp))) =
                (ctx.record_coordinates(), ctx.record_time())
            else {
                return Err(StreamError::Config(
                    "only source records can be repartitioned, not a table's updates".into(),
                ));
            };
            let rank = ctx.sequences.entry((index, offset)).or_insert(0);
            let this_rank = *rank;
            *rank += 1;
            if i64::from(this_rank) >= RANKS {
                return Err(StreamError::User {
                    tp,
                    offset,
                    reason: format!("more than {RANKS} records repartitioned from one record"),
                });
            }
            let encode_error = |side: &str, e: crate::serdes::SerdeError| StreamError::User {
                tp: tp.clone(),
                offset,
                reason: format!("cannot serialize the {side} for topic {topic:?}: {}", e.0),
            };
            let key = key_serde
                .try_serialize(&key)
                .map_err(|e| encode_error("key", e))?;
            let value = value_serde
                .try_serialize(&value)
                .map_err(|e| encode_error("value", e))?;
            ctx.outputs.push(OutputRecord {
                topic: topic.clone(),
                key,
                value,
                headers: vec![
                    (
                        SOURCE_HEADER.to_owned(),
                        format!("{}:{}:{offset}", tp.topic, tp.partition).into_bytes(),
                    ),
                    (
                        SEQUENCE_HEADER.to_owned(),
                        this_rank.to_string().into_bytes(),
                    ),
                ],
                timestamp: Some(timestamp),
            });
            Ok(())
        }));
        let shared = self.shared();
        let mut inner = lock(&shared);
        inner.sink_topics.insert(name.clone());
        let kind = NodeKind::Sink { topic: name };
        inner
            .description
            .add_node("KSTREAM-SINK", kind, &[self.node()]);
    }
}

fn bad_side(tp: &TopicPartition, offset: i64, side: &'static str, reason: String) -> StreamError {
    StreamError::Deserialize {
        tp: tp.clone(),
        offset,
        side,
        reason,
    }
}

/// `<topic>:<partition>:<offset>` (topic names cannot hold `:`).
fn parse_source(bytes: &[u8]) -> Option<(TopicPartition, i64)> {
    let text = std::str::from_utf8(bytes).ok()?;
    let mut parts = text.rsplitn(3, ':');
    let offset = parts.next()?.parse().ok()?;
    let partition = parts.next()?.parse().ok()?;
    let topic = parts.next().filter(|t| !t.is_empty())?;
    Some((TopicPartition::new(topic, partition), offset))
}
