//! The inner stream–stream join ([`KStream::join_stream`]): a buffer per side and key, probed
//! by the other side.

use std::cmp::Ordering;

use super::*;
use crate::topology::Closing;

impl<K, V> KStream<K, V>
where
    K: Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// Joins this stream with `other`: each pair of records with the same key whose
    /// timestamps differ by at most the window gives `joiner(key, this value, other value)`
    /// (an inner join), once, timestamped with the later of the two records' timestamps (as
    /// Kafka Streams). Joined with itself (`s.join_stream(&s, ..)`), every record also joins
    /// its own copy, as in Kafka Streams, where the record reaches both sides' processors:
    /// each ordered pair `(a, b)` of records within the window, `(a, a)` included, once. The two sides' recent records are kept in the stores
    /// `<store>-this` and `<store>-other` (exactly once; see the module documentation for
    /// how long), encoded with `serdes` (key, this value, other value).
    ///
    /// The buffers keep a record until the join's closing time (the lowest stream time of
    /// the source partitions feeding the join, as the batch starts) passes its timestamp
    /// plus twice the window plus the grace, so a side whose partitions run ahead drops
    /// nothing the other side can still join (see the module documentation).
    ///
    /// Cost per batch: one buffer write per touched key and side, one batched read of the
    /// other side's buffers per distinct key, and the partitions' stream times (one read,
    /// and one conditional write per partition whose stream time moved).
    ///
    /// ```
    /// use std::time::Duration;
    /// use lambda_streams::driver::TestDriver;
    /// use lambda_streams::dsl::JoinWindows;
    /// use lambda_streams::serdes::Utf8;
    /// use lambda_streams::StreamsBuilder;
    ///
    /// // Ad impressions joined with the clicks that follow within 10 s.
    /// let builder = StreamsBuilder::new();
    /// let impressions = builder.stream("impressions", Utf8, Utf8);
    /// let clicks = builder.stream("clicks", Utf8, Utf8);
    /// impressions
    ///     .join_stream(
    ///         &clicks,
    ///         JoinWindows::of(Duration::from_secs(10)),
    ///         "impression-clicks",
    ///         (Utf8, Utf8, Utf8),
    ///         |_, ad: &String, click: &String| format!("{ad}->{click}"),
    ///     )
    ///     .to("attributed", Utf8, Utf8);
    /// let driver = TestDriver::new(builder.build());
    /// let mut shown = driver.input_topic("impressions", Utf8, Utf8);
    /// let mut clicked = driver.input_topic("clicks", Utf8, Utf8);
    /// shown.pipe_input_with_timestamp("u1", "ad-7".to_owned(), 1_000)?;
    /// clicked.pipe_input_with_timestamp("u1", "buy".to_owned(), 5_000)?; // within 10 s
    /// clicked.pipe_input_with_timestamp("u1", "late".to_owned(), 60_000)?; // too late
    /// assert_eq!(
    ///     driver.output_topic("attributed", Utf8, Utf8).read_values()?,
    ///     ["ad-7->buy"]
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn join_stream<VO, VR, SK, SV, SO>(
        &self,
        other: &KStream<K, VO>,
        windows: JoinWindows,
        store: &str,
        serdes: (SK, SV, SO),
        joiner: impl Fn(&K, &V, &VO) -> VR + Send + Sync + 'static,
    ) -> KStream<K, VR>
    where
        VO: Clone + Send + Sync + 'static,
        VR: Clone + Send + Sync + 'static,
        SK: Serde<K>,
        SV: Serde<V>,
        SO: Serde<VO>,
    {
        let (key_serde, this, that) = sides(serdes);
        let store_index = Arc::new(std::sync::OnceLock::new());
        let this_records = self.buffered(&this, Arc::clone(&store_index));
        let that_records = other.buffered(&that, Arc::clone(&store_index));
        // The other side's buffer first: a batch resumes the records waiting at joins store
        // by store, so this side's records (`this + other`) come out before the other
        // side's (`other + this`), as Kafka Streams' join forwards them for a record that
        // reaches both sides (a self-join, `KStreamKStreamSelfJoinTest`).
        let that_buffer = buffer(
            &that_records,
            &key_serde,
            &format!("{store}-other"),
            windows,
        );
        let this_buffer = buffer(&this_records, &key_serde, &format!("{store}-this"), windows);
        let joiner = Arc::new(joiner);
        let next = Downstream::<K, VR>::new();
        {
            let joiner = Arc::clone(&joiner);
            probe(
                &this_records,
                &that_buffer,
                &that,
                windows,
                true,
                next.clone(),
                move |k, v: &V, o: &VO| joiner(k, v, o),
            );
        }
        probe(
            &that_records,
            &this_buffer,
            &this,
            windows,
            false,
            next.clone(),
            move |k, o: &VO, v: &V| joiner(k, v, o),
        );
        let shared = self.shared();
        let node = {
            let mut inner = lock(&shared);
            let kind = NodeKind::Processor {
                stores: vec![format!("{store}-this"), format!("{store}-other")],
            };
            let node =
                inner
                    .description
                    .add_node("KSTREAM-JOIN", kind, &[self.node(), other.node()]);
            inner.roles.read(node, this_buffer.store);
            inner.roles.read(node, that_buffer.store);
            // Both buffers prune on the join's closing time (see the module documentation),
            // from the partitions' persisted stream times.
            inner.windowed = true;
            let _ = store_index.set(this_buffer.store);
            for store in [this_buffer.store, that_buffer.store] {
                inner.stores[store].closing = Some(Closing {
                    node,
                    topics: Default::default(),
                    close: None,
                    reads: None,
                });
            }
            node
        };
        KStream::from_node(self.shared(), next, node)
    }

    /// This stream's records with their timestamp, source and encoded value, and the
    /// closing time of the join whose store `store` will be set to.
    pub(super) fn buffered(
        &self,
        side: &Side<V>,
        store: Arc<std::sync::OnceLock<usize>>,
    ) -> KStream<K, (V, Buffered)> {
        let serde = Arc::clone(&side.serde);
        let side = self.child("KSTREAM-JOINSIDE", move |ctx, key, value: V, out| {
            let (Some((tp, offset)), Some((_, _, ts))) =
                (ctx.record_coordinates(), ctx.record_time())
            else {
                return Err(StreamError::Config(
                    "a stream–stream join takes source records, not a table's updates".into(),
                ));
            };
            let bytes = serde.try_serialize(&value).map_err(|e| {
                ctx.user_error(format!("the joined value does not encode: {}", e.0))
            })?;
            let close = store
                .get()
                .and_then(|index| ctx.closing_times.get(*index))
                .copied()
                .unwrap_or(i64::MIN);
            let entry = Buffered {
                ts,
                topic: tp.topic,
                partition: tp.partition,
                offset,
                value: bytes,
                close,
            };
            out.forward(ctx, key, (value, entry))
        });
        lock(&side.shared())
            .roles
            .records_only(side.node(), "a stream–stream join");
        side
    }
}

/// One key's buffered records of one side, in processing order.
#[derive(Debug, Clone, Default)]
pub(super) struct Buffer {
    pub(super) entries: Vec<Buffered>,
}

/// Stores a [`Buffer`] as the JSON array of its entries.
/// The codec of [`Buffer`].
const BUFFER: StateCodec = StateCodec::new("join buffer");

pub(super) struct BufferSerde;

impl Serde<Buffer> for BufferSerde {
    fn serialize(&self, value: &Buffer) -> Option<Vec<u8>> {
        self.try_serialize(value).ok().flatten()
    }

    fn try_serialize(&self, value: &Buffer) -> Result<Option<Vec<u8>>, SerdeError> {
        BUFFER.encode(&value.entries)
    }

    fn deserialize(&self, data: Option<&[u8]>) -> Result<Buffer, SerdeError> {
        let entries: Vec<Buffered> = BUFFER.decode(data)?;
        Ok(Buffer { entries })
    }
}

/// The buffer of one side: its records per key, pruned to the window.
pub(super) fn buffer<K, V>(
    records: &KStream<K, (V, Buffered)>,
    key_serde: &Arc<dyn Serde<K>>,
    store: &str,
    windows: JoinWindows,
) -> Arc<Lookup<K, Buffer>>
where
    K: Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    let table: KTable<K, Buffer> = records
        .group_by_key(Arc::clone(key_serde))
        .aggregate_closing(
            store,
            Buffer::default,
            move |_, (_, entry): (V, Buffered), mut buffer: Buffer| {
                let close = entry.close;
                buffer.entries.push(entry);
                buffer.entries.retain(|b| !windows.expired(b.ts, close));
                buffer
                    .entries
                    .sort_by(|a, b| a.position().cmp(&b.position()));
                buffer
            },
            BufferSerde,
            None,
        );
    match table.lookup {
        Some(lookup) => lookup,
        None => unreachable!("a key's aggregate can be looked up"),
    }
}

/// Joins each record of `records` with the other side's buffered records of its key
/// (`this_side`: `records` are the joining stream's own, not `other`'s).
pub(super) fn probe<K, V, VO, VR>(
    records: &KStream<K, (V, Buffered)>,
    other: &Arc<Lookup<K, Buffer>>,
    other_side: &Side<VO>,
    windows: JoinWindows,
    this_side: bool,
    out: Downstream<K, VR>,
    join: impl Fn(&K, &V, &VO) -> VR + Send + Sync + 'static,
) where
    K: Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    VO: Clone + Send + Sync + 'static,
    VR: Clone + Send + Sync + 'static,
{
    let (other, serde, join) = (
        Arc::clone(other),
        Arc::clone(&other_side.serde),
        Arc::new(join),
    );
    records
        .downstream()
        .add(Arc::new(move |ctx, key: K, (value, me): (V, Buffered)| {
            let Some(encoded) = other.key_serde.serialize(&key) else {
                return Ok(());
            };
            let (other, serde, join, out) = (
                Arc::clone(&other),
                Arc::clone(&serde),
                Arc::clone(&join),
                out.clone(),
            );
            ctx.defer(
                other.store,
                encoded,
                Box::new(move |ctx: &mut Ctx, state| {
                    let Some(state) = state else {
                        return Ok(());
                    };
                    let partners = (other.value)(&key, state)
                        .map_err(|e| {
                            StreamError::Config(format!("a join buffer does not decode: {e}"))
                        })?
                        .unwrap_or_default();
                    for partner in partners.entries {
                        let joins = if this_side {
                            windows.joins(me.ts, partner.ts)
                        } else {
                            windows.joins(partner.ts, me.ts)
                        };
                        if !joins {
                            continue;
                        }
                        let source = TopicPartition::new(partner.topic.as_str(), partner.partition);
                        if ctx.in_batch(&source, partner.offset) {
                            match partner.position().cmp(&me.position()) {
                                // Both in this batch: the later record emits the pair.
                                Ordering::Greater => continue,
                                // One source record on both sides (a self-join): it meets
                                // itself in both buffers, and the other side's probe emits
                                // it, after this side's pairs (Kafka Streams' order).
                                Ordering::Equal if this_side => continue,
                                _ => {}
                            }
                        }
                        let other_value =
                            serde.deserialize(partner.value.as_deref()).map_err(|e| {
                                stored_value_error(
                                    &partner.topic,
                                    partner.partition,
                                    partner.offset,
                                    e,
                                )
                            })?;
                        let joined = join(&key, &value, &other_value);
                        // The pair's timestamp is the later of the two (Kafka Streams).
                        ctx.with_timestamp(me.ts.max(partner.ts), |ctx| {
                            out.forward(ctx, key.clone(), joined)
                        })?;
                    }
                    Ok(())
                }),
            )
        }));
}
