//! The test driver: runs a [`Topology`] in memory, deterministically, without a broker,
//! DynamoDB or Lambda — the analogue of Kafka Streams' `TopologyTestDriver`, for unit
//! tests of your own topologies.
//!
//! Pipe records into the topology's input topics, read what it produced to its output
//! topics, and look at its state stores:
//!
//! ```
//! use lambda_streams::StreamsBuilder;
//! use lambda_streams::dsl::Grouped;
//! use lambda_streams::driver::TestDriver;
//! use lambda_streams::serdes::{DecimalI64, Unit, Utf8};
//!
//! // WordCount.
//! let builder = StreamsBuilder::new();
//! builder
//!     .stream("text-lines", Unit, Utf8)
//!     .flat_map_values(|line: String| {
//!         line.split_whitespace().map(str::to_lowercase).collect::<Vec<_>>()
//!     })
//!     .group_by(|_, word| word.clone(), Grouped::with(Utf8, Utf8))
//!     .count("counts")
//!     .to_stream()
//!     .to("word-counts", Utf8, DecimalI64);
//! let driver = TestDriver::new(builder.build());
//!
//! let mut lines = driver.input_topic("text-lines", Unit, Utf8);
//! lines.pipe_value("the fox")?;
//! lines.pipe_value("The end")?;
//!
//! let counts = driver.output_topic("word-counts", Utf8, DecimalI64);
//! // One batch per piped record (the default): each update comes out as it happens.
//! assert_eq!(
//!     counts.read_key_values()?,
//!     [("fox".into(), 1), ("the".into(), 1), ("end".into(), 1), ("the".into(), 2)]
//! );
//! // The store holds (key, value, version) per item.
//! assert_eq!(driver.store("counts")[2], (b"the".to_vec(), 2, 2));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # How records are processed
//!
//! The driver plays the Kafka event source's part: every piped record gets the next
//! offset of its topic-partition (from 0); pending records are grouped into one
//! [`KafkaEvent`] (one entry per topic-partition, in order of first appearance, records in
//! offset order) and handed to [`Topology::process`] with an in-memory store
//! ([`MemoryStore`], exactly-once like the DynamoDB store) and an in-memory sink. So the
//! topology runs exactly the code it runs in Lambda.
//!
//! When a batch is processed is the [`Batching`] mode's choice: by default after every
//! piped record ([`Batching::PerRecord`], as Kafka Streams processes record by record), or
//! when a given number of records is pending ([`Batching::Size`]), or only on
//! [`TestDriver::flush`] ([`Batching::Manual`]) — which shows how a topology behaves per
//! batch (aggregations emit one update per key per batch).
//!
//! Like the event source, a failed batch is not skipped: its records stay pending and are
//! delivered again, with any records piped since, at the next batch. Call
//! [`TestDriver::discard_pending`] to drop them. [`TestDriver::redeliver_last_batch`]
//! delivers the last successful batch again, as a Kafka event source may.
//!
//! The driver runs batches on the calling thread (no async runtime is needed, and it
//! works inside one).

use std::collections::{BTreeMap, HashMap};
use std::marker::PhantomData;
use std::sync::{Mutex, PoisonError};

use async_trait::async_trait;

use crate::dsl::Topology;
use crate::error::StreamError;
use crate::event::{
    Bytes, EventSource, KafkaEvent, PartitionRecords, Record, TimestampType, TopicPartition,
};
use crate::runtime::BatchReport;
use crate::serdes::{Serde, SerdeError};
use crate::sink::{MemorySink, OutputRecord, Sink, SinkError};
use crate::state::memory::MemoryStore;

/// When the [`TestDriver`] processes the records piped into it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Batching {
    /// Each piped record is a batch of its own, processed at once (the default).
    #[default]
    PerRecord,
    /// A batch is processed as soon as this many records are pending (0 counts as 1);
    /// [`TestDriver::flush`] processes a partial one.
    Size(usize),
    /// Records wait until [`TestDriver::flush`].
    Manual,
}

/// Runs a [`Topology`] in memory: see the [module documentation](self).
pub struct TestDriver {
    topology: Topology,
    batching: Batching,
    store: MemoryStore,
    sink: DriverSink,
    state: Mutex<DriverState>,
}

#[derive(Default)]
struct DriverState {
    next_offsets: HashMap<TopicPartition, i64>,
    pending: Vec<(TopicPartition, Record)>,
    last_batch: Option<KafkaEvent>,
    last_report: Option<BatchReport>,
    /// How many produced records have been looked at for feeding back (records produced
    /// to a topic the topology reads, such as a repartition topic, are read back).
    fed_back: usize,
}

impl TestDriver {
    /// A driver for `topology`, processing each piped record as a batch of its own.
    pub fn new(topology: Topology) -> Self {
        TestDriver {
            topology,
            batching: Batching::default(),
            store: MemoryStore::new(),
            sink: DriverSink::default(),
            state: Mutex::new(DriverState::default()),
        }
    }

    /// The same driver with another [`Batching`] mode.
    ///
    /// ```
    /// # use lambda_streams::{StreamsBuilder, driver::{Batching, TestDriver}, serdes::{DecimalI64, Unit, Utf8}};
    /// # use lambda_streams::dsl::Grouped;
    /// let builder = StreamsBuilder::new();
    /// builder
    ///     .stream("words", Unit, Utf8)
    ///     .group_by(|_, w| w.clone(), Grouped::direct(Utf8))
    ///     .count("counts")
    ///     .to_stream()
    ///     .to("counts", Utf8, DecimalI64);
    /// let driver = TestDriver::new(builder.build()).with_batching(Batching::Manual);
    /// driver.input_topic("words", Unit, Utf8).pipe_values(["a", "b", "a"])?;
    /// let counts = driver.output_topic("counts", Utf8, DecimalI64);
    /// assert!(counts.is_empty()); // nothing processed yet
    /// let report = driver.flush()?;
    /// assert_eq!(report.records_in, 3);
    /// // One update per key per batch.
    /// assert_eq!(counts.read_key_values()?, [("a".into(), 2), ("b".into(), 1)]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_batching(mut self, batching: Batching) -> Self {
        self.batching = batching;
        self
    }

    /// Pipes one record, as bytes, into `partition` of `topic`; it gets the partition's
    /// next offset. Processes a batch if the [`Batching`] mode says so, and returns its error.
    pub fn pipe(
        &self,
        topic: &str,
        partition: i32,
        key: Option<Vec<u8>>,
        value: Option<Vec<u8>>,
        timestamp: i64,
    ) -> Result<(), StreamError> {
        let record = Record {
            offset: 0,
            timestamp,
            timestamp_type: TimestampType::CreateTime,
            key: key.map(Bytes::from),
            value: value.map(Bytes::from),
            headers: Vec::new(),
            key_schema_metadata: None,
            value_schema_metadata: None,
        };
        self.pipe_record(topic, partition, record)
    }

    /// Pipes one event record as it is (headers, timestamp type and schema metadata
    /// included, as the event source mapping delivers it with a schema registry) into
    /// `partition` of `topic`; its offset is replaced by the partition's next one.
    /// Otherwise as [`pipe`](Self::pipe).
    pub fn pipe_record(
        &self,
        topic: &str,
        partition: i32,
        mut record: Record,
    ) -> Result<(), StreamError> {
        let pending = {
            let mut state = self.lock();
            let tp = TopicPartition::new(topic, partition);
            let offset = state.next_offsets.entry(tp.clone()).or_insert(0);
            record.offset = *offset;
            *offset += 1;
            state.pending.push((tp, record));
            state.pending.len()
        };
        let due = match self.batching {
            Batching::PerRecord => true,
            Batching::Size(n) => pending >= n.max(1),
            Batching::Manual => false,
        };
        if due {
            self.flush()?;
        }
        Ok(())
    }

    /// Processes the pending records as one batch. With nothing pending, returns an
    /// empty report. On error the records stay pending (see the module documentation).
    pub fn flush(&self) -> Result<BatchReport, StreamError> {
        let pending = std::mem::take(&mut self.lock().pending);
        if pending.is_empty() {
            return Ok(BatchReport::default());
        }
        let event = batch_event(&pending);
        match self.run(&event) {
            Ok(report) => {
                {
                    let mut state = self.lock();
                    state.last_batch = Some(event);
                    state.last_report = Some(report.clone());
                }
                if self.feed_back() && self.batching != Batching::Manual {
                    self.flush()?;
                }
                Ok(report)
            }
            Err(e) => {
                let mut state = self.lock();
                let newer = std::mem::take(&mut state.pending);
                state.pending = pending;
                state.pending.extend(newer);
                Err(e)
            }
        }
    }

    /// Queues the records produced to topics the topology reads (repartition topics), with
    /// their headers, on partition 0 of those topics, as the broker would deliver them.
    /// Returns whether any were queued.
    fn feed_back(&self) -> bool {
        let sources = self.topology.source_topics();
        let produced = self.sink.all();
        let mut state = self.lock();
        let mut queued = false;
        for record in produced.iter().skip(state.fed_back) {
            if !sources.contains(&record.topic) {
                continue;
            }
            let tp = TopicPartition::new(record.topic.as_str(), 0);
            let offset = state.next_offsets.entry(tp.clone()).or_insert(0);
            let fed = Record {
                offset: *offset,
                timestamp: record.timestamp.unwrap_or_default(),
                timestamp_type: TimestampType::CreateTime,
                key: record.key.clone().map(Bytes::from),
                value: record.value.clone().map(Bytes::from),
                headers: record
                    .headers
                    .iter()
                    .map(|(name, value)| crate::event::Header::new(name.as_str(), value.clone()))
                    .collect(),
                key_schema_metadata: None,
                value_schema_metadata: None,
            };
            *offset += 1;
            state.pending.push((tp, fed));
            queued = true;
        }
        state.fed_back = produced.len();
        queued
    }

    /// Delivers the last successfully processed batch again, as a Kafka event source may
    /// after a rebalance. State is unchanged by it (exactly-once); its output records
    /// are produced again (the sinks are at-least-once).
    pub fn redeliver_last_batch(&self) -> Result<BatchReport, StreamError> {
        let last = self.lock().last_batch.clone();
        match last {
            Some(event) => self.run(&event),
            None => Ok(BatchReport::default()),
        }
    }

    /// How many piped records wait to be processed.
    pub fn pending(&self) -> usize {
        self.lock().pending.len()
    }

    /// Drops the pending records (for instance a poison record's failed batch);
    /// returns how many there were. Their offsets are not reused.
    pub fn discard_pending(&self) -> usize {
        std::mem::take(&mut self.lock().pending).len()
    }

    /// The report of the last successful batch.
    pub fn last_report(&self) -> Option<BatchReport> {
        self.lock().last_report.clone()
    }

    /// A typed handle to pipe records into `topic` (partition 0, timestamps from 0).
    pub fn input_topic<K: 'static, V: 'static>(
        &self,
        topic: &str,
        key_serde: impl Serde<K>,
        value_serde: impl Serde<V>,
    ) -> TestInputTopic<'_, K, V> {
        TestInputTopic {
            driver: self,
            topic: topic.to_owned(),
            key_serde: Box::new(key_serde),
            value_serde: Box::new(value_serde),
            partition: 0,
            time: 0,
            auto_advance: 0,
        }
    }

    /// A typed handle to read what the topology produced to `topic`. Reading consumes:
    /// every handle of a topic reads from the same position.
    pub fn output_topic<K: 'static, V: 'static>(
        &self,
        topic: &str,
        key_serde: impl Serde<K>,
        value_serde: impl Serde<V>,
    ) -> TestOutputTopic<'_, K, V> {
        TestOutputTopic {
            driver: self,
            topic: topic.to_owned(),
            key_serde: Box::new(key_serde),
            value_serde: Box::new(value_serde),
            types: PhantomData,
        }
    }

    /// Reads (consumes) the unread records produced to `topic`, as bytes with headers
    /// and timestamps.
    pub fn read_output(&self, topic: &str) -> Vec<OutputRecord> {
        self.sink.take(topic)
    }

    /// Every record produced so far, to any topic, in production order (read or not).
    pub fn produced(&self) -> Vec<OutputRecord> {
        self.sink.all()
    }

    /// The items of state store `store`, sorted by key: `(key bytes, value, version)`.
    pub fn store(&self, store: &str) -> Vec<(Vec<u8>, i64, u64)> {
        self.store.items(store)
    }

    /// The in-memory store the topology's state lives in.
    pub fn memory_store(&self) -> &MemoryStore {
        &self.store
    }

    fn run(&self, event: &KafkaEvent) -> Result<BatchReport, StreamError> {
        futures::executor::block_on(self.topology.process(event, &self.store, &self.sink))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, DriverState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The event the Kafka event source would send for these records: one entry per
/// topic-partition, in order of first appearance.
fn batch_event(pending: &[(TopicPartition, Record)]) -> KafkaEvent {
    let mut partitions: Vec<PartitionRecords> = Vec::new();
    for (tp, record) in pending {
        match partitions.iter_mut().find(|p| &p.tp == tp) {
            Some(p) => p.records.push(record.clone()),
            None => partitions.push(PartitionRecords {
                tp: tp.clone(),
                records: vec![record.clone()],
            }),
        }
    }
    KafkaEvent {
        source: EventSource::SelfManaged,
        bootstrap_servers: "test-driver:9092".to_owned(),
        partitions,
    }
}

/// Pipes typed records into one input topic of a [`TestDriver`] (Kafka Streams'
/// `TestInputTopic`). Records go to partition 0 unless said otherwise; their timestamp
/// is the handle's current time (from 0), which moves by the auto-advance step
/// (0 unless set) after each record.
pub struct TestInputTopic<'d, K, V> {
    driver: &'d TestDriver,
    topic: String,
    key_serde: Box<dyn Serde<K>>,
    value_serde: Box<dyn Serde<V>>,
    partition: i32,
    time: i64,
    auto_advance: i64,
}

impl<K: 'static, V: 'static> TestInputTopic<'_, K, V> {
    /// Sends the following records to `partition`.
    pub fn with_partition(mut self, partition: i32) -> Self {
        self.partition = partition;
        self
    }

    /// Starts the clock at `timestamp` (epoch milliseconds) and moves it by
    /// `auto_advance` milliseconds after each record.
    pub fn with_time(mut self, timestamp: i64, auto_advance: i64) -> Self {
        self.time = timestamp;
        self.auto_advance = auto_advance;
        self
    }

    /// Moves the clock forward by `millis`.
    pub fn advance_time(&mut self, millis: i64) {
        self.time = self.time.saturating_add(millis);
    }

    /// The timestamp the next record gets.
    pub fn current_time(&self) -> i64 {
        self.time
    }

    /// Pipes a record with the current time.
    pub fn pipe_input(
        &mut self,
        key: impl Into<K>,
        value: impl Into<V>,
    ) -> Result<(), StreamError> {
        let (partition, timestamp) = (self.partition, self.tick());
        self.send(partition, key.into(), value.into(), timestamp)
    }

    /// Pipes a record with a given timestamp (the clock does not move).
    pub fn pipe_input_with_timestamp(
        &mut self,
        key: impl Into<K>,
        value: impl Into<V>,
        timestamp: i64,
    ) -> Result<(), StreamError> {
        self.send(self.partition, key.into(), value.into(), timestamp)
    }

    /// Pipes a record to another partition, with the current time.
    pub fn pipe_to_partition(
        &mut self,
        partition: i32,
        key: impl Into<K>,
        value: impl Into<V>,
    ) -> Result<(), StreamError> {
        let timestamp = self.tick();
        self.send(partition, key.into(), value.into(), timestamp)
    }

    /// Pipes key-value pairs in order; stops at the first error.
    pub fn pipe_key_values<IK: Into<K>, IV: Into<V>>(
        &mut self,
        records: impl IntoIterator<Item = (IK, IV)>,
    ) -> Result<(), StreamError> {
        records
            .into_iter()
            .try_for_each(|(k, v)| self.pipe_input(k, v))
    }

    fn tick(&mut self) -> i64 {
        let now = self.time;
        self.time = self.time.saturating_add(self.auto_advance);
        now
    }

    fn send(&self, partition: i32, key: K, value: V, timestamp: i64) -> Result<(), StreamError> {
        let key = self.key_serde.serialize(&key);
        let value = self.value_serde.serialize(&value);
        self.driver
            .pipe(&self.topic, partition, key, value, timestamp)
    }
}

impl<V: 'static> TestInputTopic<'_, (), V> {
    /// Pipes a value with a null key (for topics read with [`Unit`](crate::serdes::Unit) keys).
    pub fn pipe_value(&mut self, value: impl Into<V>) -> Result<(), StreamError> {
        self.pipe_input((), value)
    }

    /// Pipes values with null keys in order; stops at the first error.
    pub fn pipe_values<IV: Into<V>>(
        &mut self,
        values: impl IntoIterator<Item = IV>,
    ) -> Result<(), StreamError> {
        values.into_iter().try_for_each(|v| self.pipe_value(v))
    }
}

/// A record read from an output topic, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestRecord<K, V> {
    /// The key.
    pub key: K,
    /// The value.
    pub value: V,
    /// The headers, in order.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The timestamp (epoch milliseconds).
    pub timestamp: Option<i64>,
}

/// Reads typed records from one output topic of a [`TestDriver`] (Kafka Streams'
/// `TestOutputTopic`). Reading consumes the records read.
pub struct TestOutputTopic<'d, K, V> {
    driver: &'d TestDriver,
    topic: String,
    key_serde: Box<dyn Serde<K>>,
    value_serde: Box<dyn Serde<V>>,
    types: PhantomData<fn() -> (K, V)>,
}

impl<K: 'static, V: 'static> TestOutputTopic<'_, K, V> {
    /// Reads every unread record, decoded. On a decode error nothing is consumed.
    pub fn read_records(&self) -> Result<Vec<TestRecord<K, V>>, SerdeError> {
        self.driver.sink.take_decoded(&self.topic, |record| {
            Ok(TestRecord {
                key: self.key_serde.deserialize(record.key.as_deref())?,
                value: self.value_serde.deserialize(record.value.as_deref())?,
                headers: record.headers.clone(),
                timestamp: record.timestamp,
            })
        })
    }

    /// Reads every unread record as a key-value pair.
    pub fn read_key_values(&self) -> Result<Vec<(K, V)>, SerdeError> {
        let records = self.read_records()?;
        Ok(records.into_iter().map(|r| (r.key, r.value)).collect())
    }

    /// Reads every unread record's value.
    pub fn read_values(&self) -> Result<Vec<V>, SerdeError> {
        let records = self.read_records()?;
        Ok(records.into_iter().map(|r| r.value).collect())
    }

    /// Reads every unread record and keeps the last value per key (a table's latest state).
    pub fn read_key_values_to_map(&self) -> Result<BTreeMap<K, V>, SerdeError>
    where
        K: Ord,
    {
        Ok(self.read_key_values()?.into_iter().collect())
    }

    /// How many records are unread.
    pub fn queue_size(&self) -> usize {
        self.driver.sink.unread(&self.topic)
    }

    /// Whether every record produced to the topic has been read.
    pub fn is_empty(&self) -> bool {
        self.queue_size() == 0
    }
}

/// The driver's sink: a [`MemorySink`] (every record in production order) and a read
/// position per topic.
#[derive(Default)]
struct DriverSink {
    records: MemorySink,
    /// Per topic: how many of its records have been read.
    read: Mutex<HashMap<String, usize>>,
}

impl DriverSink {
    fn all(&self) -> Vec<OutputRecord> {
        self.records.records()
    }

    fn unread(&self, topic: &str) -> usize {
        let read = self.read_of(topic);
        let produced = self
            .records
            .inspect(|all| all.iter().filter(|r| r.topic == topic).count());
        produced - read
    }

    fn read_of(&self, topic: &str) -> usize {
        let read = self.read.lock().unwrap_or_else(PoisonError::into_inner);
        read.get(topic).copied().unwrap_or(0)
    }

    fn take(&self, topic: &str) -> Vec<OutputRecord> {
        self.take_decoded(topic, |r| Ok::<_, SerdeError>(r.clone()))
            .unwrap_or_default()
    }

    /// Decodes the unread records of `topic`; consumes them only if all decode.
    fn take_decoded<T, E>(
        &self,
        topic: &str,
        decode: impl Fn(&OutputRecord) -> Result<T, E>,
    ) -> Result<Vec<T>, E> {
        let mut read = self.read.lock().unwrap_or_else(PoisonError::into_inner);
        let position = read.entry(topic.to_owned()).or_insert(0);
        let decoded = self.records.inspect(|all| {
            all.iter()
                .filter(|r| r.topic == topic)
                .skip(*position)
                .map(&decode)
                .collect::<Result<Vec<T>, E>>()
        })?;
        *position += decoded.len();
        Ok(decoded)
    }
}

#[async_trait]
impl Sink for DriverSink {
    async fn send(&self, records: Vec<OutputRecord>) -> Result<(), SinkError> {
        self.records.send(records).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StreamsBuilder;
    use crate::serdes::{Unit, Utf8};

    fn copy_topology() -> Topology {
        let builder = StreamsBuilder::new();
        builder.stream("in", Utf8, Utf8).to("out", Utf8, Utf8);
        builder.build()
    }

    #[test]
    fn offsets_are_per_partition_and_batches_group_partitions() {
        let driver = TestDriver::new(copy_topology()).with_batching(Batching::Manual);
        driver
            .pipe("in", 1, Some(b"k".to_vec()), Some(b"a".to_vec()), 5)
            .unwrap();
        driver
            .pipe("in", 0, Some(b"k".to_vec()), Some(b"b".to_vec()), 6)
            .unwrap();
        driver
            .pipe("in", 1, Some(b"k".to_vec()), Some(b"c".to_vec()), 7)
            .unwrap();
        let pending = driver.lock().pending.clone();
        let event = batch_event(&pending);
        assert_eq!(event.partitions.len(), 2);
        assert_eq!(event.partitions[0].tp, TopicPartition::new("in", 1));
        let offsets: Vec<i64> = event.partitions[0]
            .records
            .iter()
            .map(|r| r.offset)
            .collect();
        assert_eq!(offsets, [0, 1]);
        assert_eq!(event.partitions[1].records[0].offset, 0);
        assert_eq!(event.partitions[1].records[0].timestamp, 6);
        assert_eq!(driver.flush().unwrap().records_in, 3);
        // Partition 1's records first (first to appear), then partition 0's.
        let sources: Vec<Vec<u8>> = driver
            .read_output("out")
            .iter()
            .map(|r| r.header(crate::sink::SOURCE_HEADER).unwrap().to_vec())
            .collect();
        assert_eq!(
            sources,
            [b"in:1:0".to_vec(), b"in:1:1".to_vec(), b"in:0:0".to_vec()]
        );
        assert!(driver.read_output("out").is_empty());
    }

    #[test]
    fn size_batching_flushes_every_n_records() {
        let driver = TestDriver::new(copy_topology()).with_batching(Batching::Size(2));
        let mut input = driver.input_topic("in", Utf8, Utf8);
        input.pipe_input("k", "1").unwrap();
        assert_eq!(driver.pending(), 1);
        input.pipe_input("k", "2").unwrap();
        assert_eq!(driver.pending(), 0);
        assert_eq!(driver.last_report().unwrap().records_in, 2);
    }

    #[test]
    fn failed_batch_stays_pending_until_discarded() {
        let driver = TestDriver::new(copy_topology());
        let mut input = driver.input_topic("in", Utf8, Utf8);
        input.pipe_input("k", "fine").unwrap();
        // Invalid UTF-8 value: a poison record.
        let err = driver
            .pipe("in", 0, Some(b"k".to_vec()), Some(vec![0xff]), 0)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "record in-0 offset 1: cannot deserialize the value: invalid UTF-8: \
             invalid utf-8 sequence of 1 bytes from index 0"
        );
        assert_eq!(driver.pending(), 1);
        assert!(input.pipe_input("k", "next").is_err());
        assert_eq!(driver.pending(), 2);
        assert_eq!(driver.discard_pending(), 2);
        input.pipe_input("k", "after").unwrap();
        let out = driver.output_topic("out", Utf8, Utf8);
        let records = out.read_records().unwrap();
        let values: Vec<&str> = records.iter().map(|r| r.value.as_str()).collect();
        assert_eq!(values, ["fine", "after"]);
        // Offsets are not reused: "after" is offset 3.
        assert_eq!(
            records[1].headers,
            [(crate::sink::SOURCE_HEADER.to_owned(), b"in:0:3".to_vec())]
        );
    }

    #[test]
    fn unknown_topic_is_an_error() {
        let driver = TestDriver::new(copy_topology());
        let err = driver.pipe("nope", 0, None, None, 0).unwrap_err();
        assert!(matches!(err, StreamError::UnknownTopic { .. }));
    }

    #[test]
    fn output_decode_error_consumes_nothing() {
        let driver = TestDriver::new(copy_topology());
        driver
            .input_topic("in", Utf8, Utf8)
            .pipe_input("k", "x")
            .unwrap();
        let as_unit_key = driver.output_topic("out", Unit, crate::serdes::DecimalI64);
        assert!(as_unit_key.read_values().is_err());
        assert_eq!(as_unit_key.queue_size(), 1);
        let ok = driver.output_topic("out", Utf8, Utf8);
        assert_eq!(ok.read_key_values().unwrap(), [("k".into(), "x".into())]);
        assert!(ok.is_empty());
    }

    #[test]
    fn timestamps_follow_the_input_clock() {
        let driver = TestDriver::new(copy_topology());
        let mut input = driver.input_topic("in", Utf8, Utf8).with_time(1000, 10);
        input.pipe_input("a", "1").unwrap();
        input.pipe_input("b", "2").unwrap();
        input.advance_time(100);
        input.pipe_input_with_timestamp("c", "3", 5).unwrap();
        input.pipe_input("d", "4").unwrap();
        assert_eq!(input.current_time(), 1130);
        let ts: Vec<Option<i64>> = driver
            .output_topic("out", Utf8, Utf8)
            .read_records()
            .unwrap()
            .iter()
            .map(|r| r.timestamp)
            .collect();
        assert_eq!(ts, [Some(1000), Some(1010), Some(5), Some(1120)]);
    }
}
