//! Repartitioning through an internal topic (docs/state.md, "Repartition mode").
//!
//! `repartition(topic, …)` produces the stream's records to `topic` (partitioned by their
//! key, with the idempotent producer) and reads them back from it: the same function
//! consumes the repartition topic through a second event source. The records of one key
//! then arrive in one partition, so one invocation at a time writes its state and its
//! updates are ordered per key.
//!
//! # Exactly once across any number of hops: channels and positions
//!
//! A state item keeps one watermark per *channel* (the highest *position* on that channel
//! whose effect it holds) and applies a record only above it, so that a copy at or below
//! the watermark counts nothing. That is exact if, on every channel, **no record of a
//! higher position arrives before the first copy of a record** (call it the *order* of the
//! channel): then a first copy is never below the watermark, and every other copy is.
//!
//! - A **direct** record (read from a topic the topology does not produce) is on the
//!   channel of its partition `P`, at its offset. A partition is read in order and holds
//!   each record once, so the channel is in order. Watermark `w:<P>` (`w:lines-0`).
//! - A record that crossed **one hop** `P → q` (partition `q` of the repartition topic) is
//!   on the channel `P>q`, at position `(o, s)`: `o` the offset of its source record in
//!   `P`, `s` its rank among the records that source record produced to the topic. Order:
//!   the invocation that produces the first copy of `(o, s)` processes `P` in order from a
//!   committed offset; if that offset is at or below `o`, it produced every lower position
//!   of `P` in `q` before (its producer is idempotent: a retried send cannot land after a
//!   later one); if above, the batches up to it were committed, so produced and
//!   acknowledged, before it started. A copy made by a retry or a zombie is a copy, never a
//!   first. The partition `q` is part of the channel because an item can be fed from
//!   several partitions of the topic (a direct re-key after the hop): records of `P` come
//!   through `q1` and `q2` from parallel invocations, in no order between the two.
//! - **Several hops** `P → q → r`: the consumer of `q` reads it in order and is itself a
//!   producer of that kind. On `P>q`, the first copy of a position comes before every record
//!   of a higher position, so the consumer meets it before them (the in-batch filter below
//!   never drops a first copy) and produces its records to `r` before theirs: in one
//!   invocation by the order of processing, across invocations because the batches before
//!   were committed. So the records that came through `P>q` are in order on `P>q>r`, at
//!   position `(o, s1, s2)`. By induction, after `n` hops the channel is the source partition
//!   and every hop's partition, and the position the source offset and the rank at every hop.
//!   The records of `P` that reach `r` through another partition `q'` interleave with those
//!   through `q` in no order: the channel must name the whole path.
//! - A copy made by an upstream retry and read by the next hop in a later batch is forwarded
//!   with its *original* coordinates ([`HopHeaders`]), so it reaches the next hop at the
//!   position of its first copy and the item refuses it. With the current record's
//!   coordinates instead, each copy would be a record of its own: counted twice.
//! - A direct record and its repartitioned copy are on different channels (`w:in-0` and
//!   `w:in-0>copy-1`), as are the copies of one source record through two repartition
//!   topics (`w:in-0>a-0`, `w:in-0>b-1`): their positions are not comparable, and one
//!   watermark for both would refuse the contributions of one of them.
//!
//! The order also needs every copy of a record on the same partition `q`: a null key is
//! produced with a stand-in key ([`NULL_KEY_HEADER`]). And it needs a batch to produce its
//! records in source order: a hop fed by records that waited at different joins (which go
//! on at different steps of a batch) gets its records sorted back into source order before
//! they are sent (`topology::order`).
//!
//! Within a batch the same rule drops duplicates before they reach the stores: per channel,
//! a record at or below the highest position already seen in the batch (`Ctx::seen`) is a
//! copy. The argument needs deterministic processing (a record produces the same records in
//! the same order every time), which the DSL's operators have when the user's functions do.
//!
//! Positions are packed into the watermark's integer, ordered as `(o, s1, …, sn)`: after one
//! hop `o * 2^20 + s1` (ranks below 2^20, offsets below 2^43); after two, three or four hops
//! 12, 8 or 6 bits per rank, and offsets below 2^39. A record beyond these limits, or one
//! that would cross a fifth hop, is refused with an error naming it (a poison record).

use std::sync::Arc;

use super::{Downstream, KStream, Source, SourceFn, decode_parts, lock};
use crate::error::StreamError;
use crate::serdes::{Serde, SerdeError};
use crate::sink::OutputRecord;
use crate::topology::context::Channel;
use crate::topology::describe::NodeKind;
use crate::wire::{HopHeaders, NULL_KEY_HEADER, SourceHeader};

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
        let read: SourceFn = Arc::new(move |ctx, record, _| {
            let Some((tp, _)) = ctx.record_coordinates() else {
                return Ok(());
            };
            let bad = |reason: String| ctx.deserialize_error("header", SerdeError(reason));
            let hop = HopHeaders::parse(&record.headers).map_err(bad)?;
            let position = position(hop.source.offset, &hop.ranks).map_err(bad)?;
            let mut hops = hop.path;
            hops.push(tp.clone());
            let channel = ctx.channel(Channel {
                origin: hop.source.tp,
                hops,
            });
            let seen = ctx.seen.entry(channel).or_insert(i64::MIN);
            if position <= *seen {
                // A copy: its first copy came before (see the module documentation).
                return Ok(());
            }
            *seen = position;
            ctx.source = Some((channel, position));
            let null_key = record.headers.iter().any(|h| h.name() == NULL_KEY_HEADER);
            let key_bytes = if null_key {
                None
            } else {
                record.key.as_deref()
            };
            let (key, value) = decode_parts(
                ctx,
                key_bytes,
                record.value.as_deref(),
                &key_serde,
                &value_serde,
            )?;
            out.forward(ctx, key, value)
        });
        let shared = self.shared();
        // Its records are read where they stand: a repartition record's position decides
        // whether it is read at all (a copy is not).
        let source = Source { read, ahead: None };
        let node = lock(&shared).add_source(topic, source);
        KStream::from_node(shared, downstream, node)
    }
}

impl<K, V> KStream<K, V>
where
    K: Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// Produces the records to repartition topic `topic` with their way so far
    /// ([`HopHeaders`]): the original source record, the hops crossed before, and the rank
    /// at every hop, this one's last (its rank among the records the current record
    /// produced to repartition topics).
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
            // The record's way so far: its source record, and the hops it crossed.
            let mut hops = match ctx.source {
                Some((channel, position)) => {
                    let channel = &ctx.channels[channel as usize];
                    let (offset, ranks) = unpack(position, channel.hops.len());
                    HopHeaders {
                        source: SourceHeader {
                            tp: channel.origin.clone(),
                            offset,
                        },
                        path: channel.hops.clone(),
                        ranks,
                    }
                }
                None => HopHeaders {
                    source: SourceHeader {
                        tp: tp.clone(),
                        offset,
                    },
                    path: Vec::new(),
                    ranks: Vec::new(),
                },
            };
            hops.ranks.push(this_rank);
            if let Err(reason) = position(hops.source.offset, &hops.ranks) {
                return Err(ctx.user_error(format!("cannot repartition to {topic:?}: {reason}")));
            }
            let encode_error = |side: &str, e: SerdeError| {
                ctx.user_error(format!(
                    "cannot serialize the {side} for topic {topic:?}: {}",
                    e.0
                ))
            };
            let key = key_serde
                .try_serialize(&key)
                .map_err(|e| encode_error("key", e))?;
            let value = value_serde
                .try_serialize(&value)
                .map_err(|e| encode_error("value", e))?;
            let mut headers = hops.write();
            // A null key: a stand-in that puts every copy on one partition (see
            // NULL_KEY_HEADER).
            let key = match key {
                Some(key) => Some(key),
                None => {
                    headers.push((NULL_KEY_HEADER.to_owned(), Vec::new()));
                    Some(SourceHeader::write(&hops.source.tp, hops.source.offset))
                }
            };
            ctx.outputs.push(OutputRecord {
                topic: topic.clone(),
                key,
                value,
                headers,
                timestamp: Some(timestamp),
            });
            Ok(())
        }));
        let shared = self.shared();
        let mut inner = lock(&shared);
        inner.sink_topics.insert(name.clone());
        let kind = NodeKind::Sink { topic: name };
        let node = inner
            .description
            .add_node("KSTREAM-SINK", kind, &[self.node()]);
        inner.roles.records_only(node, "a repartition topic's sink");
        inner.roles.in_order(node);
    }
}

/// The most repartition hops a record can cross (the bits of its position, see the module
/// documentation).
const MAX_HOPS: usize = 4;

/// The bits of each rank in the position of a record that crossed `hops` hops.
fn rank_bits(hops: usize) -> u32 {
    match hops {
        1 => 20,
        2 => 12,
        3 => 8,
        _ => 6,
    }
}

/// The watermark position of a record whose source record is at `offset` and whose ranks
/// at its hops are `ranks` (`1..=MAX_HOPS` of them): ordered as `(offset, ranks…)`.
fn position(offset: i64, ranks: &[u32]) -> Result<i64, String> {
    let hops = ranks.len();
    if !(1..=MAX_HOPS).contains(&hops) {
        return Err(format!(
            "a record can cross 1 to {MAX_HOPS} repartition hops, not {hops}"
        ));
    }
    let bits = rank_bits(hops);
    let offset_bits = 63 - bits * hops as u32;
    if !(0..1i64 << offset_bits).contains(&offset) {
        return Err(format!(
            "source offset {offset} out of range after {hops} hop(s) (below 2^{offset_bits})"
        ));
    }
    let mut position = offset;
    for rank in ranks {
        if *rank >= 1 << bits {
            return Err(format!(
                "more than {} records from one record at a hop of a {hops}-hop path",
                1u32 << bits
            ));
        }
        position = (position << bits) | i64::from(*rank);
    }
    Ok(position)
}

/// The source offset and ranks of a position of a record that crossed `hops` hops: the
/// inverse of [`position`].
fn unpack(position: i64, hops: usize) -> (i64, Vec<u32>) {
    let bits = rank_bits(hops);
    let mask = (1i64 << bits) - 1;
    let mut ranks: Vec<u32> = (0..hops)
        .map(|i| ((position >> (bits * i as u32)) & mask) as u32)
        .collect();
    ranks.reverse();
    (position >> (bits * hops as u32), ranks)
}
