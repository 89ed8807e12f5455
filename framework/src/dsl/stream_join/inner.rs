//! The inner stream–stream join ([`KStream::join_stream`]): the left and outer joins' state
//! (both sides of a key in one item) with no outer side.

use super::outer::Outer;
use super::*;

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
    /// each ordered pair `(a, b)` of records within the window, `(a, a)` included, once.
    ///
    /// Both sides' recent records of a key live in one state item of `store` (a general
    /// aggregate, written exactly once), encoded with `serdes` (key, this value, other
    /// value), as for [`left_join_stream`](Self::left_join_stream): which records a record
    /// joins is decided once, in the conditional write that adds it, so of two records that
    /// meet, the one written second emits the pair, whatever the batch boundaries and even
    /// when the two sides' batches run at the same time. The pairs of a write are kept in
    /// the item (until a later batch of the same source partition writes it) and emitted by
    /// the record they are attributed to (its `lambda-streams-source` header names it): a
    /// retried or redelivered batch emits the same pairs again, from the same record, so an
    /// aggregation after the join counts each pair once, and under exactly-once output
    /// (`LAMBDA_STREAMS_OUTPUT_GUARANTEE=exactly_once`) a `read_committed` consumer sees
    /// each pair once. A record stays in the item until the join's closing time (the lowest
    /// stream time of the source partitions feeding the join, as the batch starts) passes
    /// its timestamp plus twice the wider side of the window plus the grace (as long as
    /// Kafka Streams' window store keeps it), so a side whose partitions run ahead drops
    /// nothing the other side can still join (see the module documentation).
    ///
    /// Cost per batch: one conditional write per touched key, one batched read of the
    /// touched keys' items after the write, and the partitions' stream times (one read, and
    /// one conditional write per partition whose stream time moved). The item holds at most
    /// 400 KB: the key's records within the window and grace, and the pairs of one batch
    /// per source partition.
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
        // An inner join is the left and outer joins' state with no outer side: no record is
        // ever emitted alone, so no item enters the closing index and no closing pass runs.
        let inner = Outer {
            this: false,
            other: false,
        };
        self.outer_join(
            other,
            windows,
            store,
            serdes,
            inner,
            "KSTREAM-JOIN",
            move |k, v, o| match (v, o) {
                (Some(v), Some(o)) => Some(joiner(k, v, o)),
                _ => None,
            },
        )
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
