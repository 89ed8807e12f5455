//! The consume → batch → invoke → commit loop.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lambda_streams::event::{
    EventSource, Header, KafkaEvent, PartitionRecords, Record, TimestampType, TopicPartition,
};
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::admin::METADATA_TIMEOUT;
use crate::transport::Transport;

/// The Lambda limit on an invocation's payload: 6 MB.
pub const MAX_PAYLOAD_BYTES: usize = 6 * 1024 * 1024;
/// The Lambda limit on records per batch.
pub const MAX_BATCH_SIZE: usize = 10_000;

/// Which event source mapping the runner plays: the event's `eventSource`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventShape {
    /// Amazon MSK (`aws:kafka`), with this cluster ARN.
    Msk {
        /// The `eventSourceArn` to put in events.
        arn: String,
    },
    /// A self-managed cluster (`SelfManagedKafka`).
    SelfManaged,
}

/// Redeliveries to inject on purpose: what the real event source does now and then.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Every Nth batch is invoked twice (a duplicate delivery) before its commit.
    pub duplicate_every: Option<u64>,
    /// Every Nth batch is treated as failed after the function succeeded (a lost
    /// response), and retried as a longer batch from the same offsets.
    pub extend_retry_every: Option<u64>,
}

/// The runner's settings, with the event source's defaults.
#[derive(Debug, Clone)]
pub struct RunnerConfig {
    /// Brokers to consume from (and that events name as `bootstrapServers`).
    pub bootstrap_servers: String,
    /// The consumer group (the event source's `ConsumerGroupId`).
    pub group_id: String,
    /// Topics to consume.
    pub topics: Vec<String>,
    /// Records per batch at most (default 100, at most 10,000).
    pub batch_size: usize,
    /// How long to gather records before invoking (default 500 ms).
    pub batching_window: Duration,
    /// The event's `eventSource`.
    pub shape: EventShape,
    /// Exit once the group has consumed everything (for tests and demos).
    pub until_idle: bool,
    /// How long without new records counts as idle.
    pub idle_timeout: Duration,
    /// First retry delay; doubles up to 5 s.
    pub retry_backoff: Duration,
    /// Give up after this many retries of one batch (`None`: retry forever, as the ESM).
    pub max_retries: Option<u32>,
    /// Redeliveries to inject.
    pub faults: Faults,
    /// Print a progress line every second.
    pub progress: bool,
}

impl Default for RunnerConfig {
    fn default() -> Self {
        RunnerConfig {
            bootstrap_servers: "127.0.0.1:9092".into(),
            group_id: "lambda-streams".into(),
            topics: Vec::new(),
            batch_size: 100,
            batching_window: Duration::from_millis(500),
            shape: EventShape::SelfManaged,
            until_idle: false,
            idle_timeout: Duration::from_secs(2),
            retry_backoff: Duration::from_millis(100),
            max_retries: None,
            faults: Faults::default(),
            progress: false,
        }
    }
}

/// What a run did.
#[derive(Debug, Clone, Default)]
pub struct RunSummary {
    /// Records delivered in successful invocations (each counted once).
    pub records: u64,
    /// Batches committed.
    pub batches: u64,
    /// Invocations, duplicates and retries included.
    pub invocations: u64,
    /// Invocations that failed (and were retried).
    pub failures: u64,
    /// Wall time of the run.
    pub elapsed: Duration,
    /// Time from the first record received to the end of the run (excludes the
    /// consumer group's join): what throughput is measured over.
    pub active: Duration,
}

impl RunSummary {
    /// Records per second from the first record received to the end of the run.
    pub fn records_per_second(&self) -> f64 {
        self.records as f64 / self.active.as_secs_f64().max(1e-9)
    }
}

/// Runs one function against the broker.
pub struct Runner {
    config: RunnerConfig,
    transport: Arc<dyn Transport>,
}

type Buffers = BTreeMap<TopicPartition, VecDeque<Record>>;

impl Runner {
    /// A runner invoking `transport`.
    pub fn new(config: RunnerConfig, transport: Arc<dyn Transport>) -> Result<Self, String> {
        if config.batch_size == 0 || config.batch_size > MAX_BATCH_SIZE {
            return Err(format!(
                "batch size {} is out of range 1..={MAX_BATCH_SIZE}",
                config.batch_size
            ));
        }
        if config.topics.is_empty() {
            return Err("no topic to consume".into());
        }
        Ok(Runner { config, transport })
    }

    fn consumer(&self) -> Result<StreamConsumer, String> {
        let c = &self.config;
        let consumer: StreamConsumer = ClientConfig::new()
            .set("bootstrap.servers", &c.bootstrap_servers)
            .set("group.id", &c.group_id)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("session.timeout.ms", "10000")
            .create()
            .map_err(|e| format!("cannot create a consumer for {}: {e}", c.bootstrap_servers))?;
        let metadata = consumer
            .fetch_metadata(None, METADATA_TIMEOUT)
            .map_err(|e| {
                format!(
                    "Kafka broker {} cannot be reached: {e}",
                    c.bootstrap_servers
                )
            })?;
        for topic in &c.topics {
            if !metadata
                .topics()
                .iter()
                .any(|t| t.name() == topic && t.error().is_none())
            {
                return Err(format!(
                    "topic {topic:?} does not exist on {} (create it: local-runner topics create {topic})",
                    c.bootstrap_servers
                ));
            }
        }
        let topics: Vec<&str> = c.topics.iter().map(String::as_str).collect();
        consumer
            .subscribe(&topics)
            .map_err(|e| format!("cannot subscribe to {topics:?}: {e}"))?;
        Ok(consumer)
    }

    /// Consumes, batches, invokes and commits until stopped (or, with `until_idle`,
    /// until the group has consumed everything).
    pub async fn run(&self) -> Result<RunSummary, String> {
        let consumer = self.consumer()?;
        let started = Instant::now();
        let mut summary = RunSummary::default();
        let mut buffers = Buffers::new();
        let mut last_progress = Instant::now();
        let mut batch_number = 0u64;
        let mut first_record: Option<Instant> = None;
        loop {
            let limit = self.config.batch_size;
            let got = self.fill(&consumer, &mut buffers, limit).await?;
            first_record = first_record.or(got);
            if buffered(&buffers) == 0 {
                if self.config.until_idle && got.is_none() && self.caught_up(&consumer)? {
                    break;
                }
                continue;
            }
            batch_number += 1;
            self.deliver(&consumer, &mut buffers, batch_number, &mut summary)
                .await?;
            if self.config.progress && last_progress.elapsed() >= Duration::from_secs(1) {
                last_progress = Instant::now();
                summary.active = first_record.map_or(Duration::ZERO, |t| t.elapsed());
                eprintln!(
                    "[local-runner] {} records, {} batches, {} retries, {:.0} records/s",
                    summary.records,
                    summary.batches,
                    summary.failures,
                    summary.records_per_second()
                );
            }
        }
        summary.elapsed = started.elapsed();
        summary.active = first_record.map_or(Duration::ZERO, |t| t.elapsed());
        Ok(summary)
    }

    /// Invokes one batch until it succeeds (retrying as the event source does), then
    /// commits its offsets and drops its records from the buffers.
    async fn deliver(
        &self,
        consumer: &StreamConsumer,
        buffers: &mut Buffers,
        number: u64,
        summary: &mut RunSummary,
    ) -> Result<(), String> {
        let faults = &self.config.faults;
        let every = |n: Option<u64>| n.is_some_and(|n| n > 0 && number.is_multiple_of(n));
        let mut limit = self.config.batch_size;
        let mut extend = every(faults.extend_retry_every);
        let mut attempt = 0u32;
        let event = loop {
            let event = self.form_event(buffers, limit);
            let payload = event.to_json();
            summary.invocations += 1;
            let mut result = self.transport.invoke(payload.clone()).await.map(|_| ());
            if result.is_ok() && every(faults.duplicate_every) && attempt == 0 {
                summary.invocations += 1;
                result = self.transport.invoke(payload).await.map(|_| ());
            }
            match result {
                Ok(()) if !extend => break event,
                Ok(()) => {
                    // Injected: the response was lost; retry with a longer batch.
                    extend = false;
                    limit = (limit * 2).min(MAX_BATCH_SIZE);
                    self.fill(consumer, buffers, limit).await?;
                }
                Err(e) => {
                    summary.failures += 1;
                    tracing::warn!(error = %e, attempt, "batch failed; retrying");
                    if self.config.max_retries.is_some_and(|max| attempt >= max) {
                        return Err(format!("batch gave up after {attempt} retries: {e}"));
                    }
                    let delay = self.config.retry_backoff * 2u32.saturating_pow(attempt.min(6));
                    tokio::time::sleep(delay.min(Duration::from_secs(5))).await;
                }
            }
            attempt += 1;
        };
        let mut offsets = TopicPartitionList::new();
        for part in &event.partitions {
            if let Some(last) = part.records.last() {
                offsets
                    .add_partition_offset(
                        &part.tp.topic,
                        part.tp.partition,
                        Offset::Offset(last.offset + 1),
                    )
                    .map_err(|e| format!("cannot commit {}: {e}", part.tp))?;
            }
            if let Some(queue) = buffers.get_mut(&part.tp) {
                queue.drain(..part.records.len());
            }
        }
        consumer
            .commit(&offsets, CommitMode::Sync)
            .map_err(|e| format!("commit failed: {e}"))?;
        summary.batches += 1;
        summary.records += event.record_count() as u64;
        Ok(())
    }

    /// Reads records until `limit` are buffered or the batching window closes. Returns
    /// when the first record of this call arrived, if any did.
    async fn fill(
        &self,
        consumer: &StreamConsumer,
        buffers: &mut Buffers,
        limit: usize,
    ) -> Result<Option<Instant>, String> {
        let window_start = Instant::now();
        let window = if buffered(buffers) == 0 {
            self.config
                .idle_timeout
                .min(self.config.batching_window.max(Duration::from_millis(200)))
        } else {
            self.config.batching_window
        };
        let mut got = None;
        while buffered(buffers) < limit {
            let Some(remaining) = window.checked_sub(window_start.elapsed()) else {
                break;
            };
            match tokio::time::timeout(remaining, consumer.recv()).await {
                Err(_) => break,
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "consumer error");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Ok(Ok(message)) => {
                    got = got.or_else(|| Some(Instant::now()));
                    let tp = TopicPartition::new(message.topic(), message.partition());
                    buffers
                        .entry(tp)
                        .or_default()
                        .push_back(to_record(&message));
                }
            }
        }
        Ok(got)
    }

    /// The next event: records of the buffered partitions in order, up to `limit`
    /// records and the 6 MB payload cap (a record is never split; one alone always fits).
    fn form_event(&self, buffers: &Buffers, limit: usize) -> KafkaEvent {
        let mut size = 256usize;
        let mut count = 0usize;
        let mut partitions = Vec::new();
        'outer: for (tp, queue) in buffers {
            let mut records = Vec::new();
            for record in queue {
                let record_size = estimated_json_size(tp, record);
                if count == limit || (count > 0 && size + record_size > MAX_PAYLOAD_BYTES) {
                    if !records.is_empty() {
                        partitions.push(PartitionRecords {
                            tp: tp.clone(),
                            records,
                        });
                    }
                    break 'outer;
                }
                size += record_size;
                count += 1;
                records.push(record.clone());
            }
            if !records.is_empty() {
                partitions.push(PartitionRecords {
                    tp: tp.clone(),
                    records,
                });
            }
        }
        let source = match &self.config.shape {
            EventShape::Msk { arn } => EventSource::Msk { arn: arn.clone() },
            EventShape::SelfManaged => EventSource::SelfManaged,
        };
        KafkaEvent {
            source,
            bootstrap_servers: self.config.bootstrap_servers.clone(),
            partitions,
        }
    }

    /// Whether the group's committed offsets have reached the end of every assigned partition.
    fn caught_up(&self, consumer: &StreamConsumer) -> Result<bool, String> {
        let assignment = consumer
            .assignment()
            .map_err(|e| format!("cannot read the assignment: {e}"))?;
        if assignment.count() == 0 {
            return Ok(false);
        }
        let committed = consumer
            .committed(METADATA_TIMEOUT)
            .map_err(|e| format!("cannot read committed offsets: {e}"))?;
        for element in assignment.elements() {
            let (low, high) = consumer
                .fetch_watermarks(element.topic(), element.partition(), METADATA_TIMEOUT)
                .map_err(|e| {
                    format!(
                        "cannot read watermarks of {}-{}: {e}",
                        element.topic(),
                        element.partition()
                    )
                })?;
            let position = committed
                .find_partition(element.topic(), element.partition())
                .and_then(|e| match e.offset() {
                    Offset::Offset(o) => Some(o),
                    _ => None,
                })
                .unwrap_or(low);
            if position < high {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

fn buffered(buffers: &Buffers) -> usize {
    buffers.values().map(VecDeque::len).sum()
}

fn to_record<M: Message>(message: &M) -> Record {
    let (timestamp, timestamp_type) = match message.timestamp() {
        rdkafka::Timestamp::LogAppendTime(t) => (t, TimestampType::LogAppendTime),
        rdkafka::Timestamp::CreateTime(t) => (t, TimestampType::CreateTime),
        rdkafka::Timestamp::NotAvailable => (0, TimestampType::CreateTime),
    };
    let headers = message
        .headers()
        .map(|hs| {
            hs.iter()
                .map(|h| Header {
                    name: h.key.to_owned(),
                    value: h.value.map(<[u8]>::to_vec).unwrap_or_default(),
                })
                .collect()
        })
        .unwrap_or_default();
    Record {
        offset: message.offset(),
        timestamp,
        timestamp_type,
        key: message.key().map(<[u8]>::to_vec),
        value: message.payload().map(<[u8]>::to_vec),
        headers,
        key_schema_metadata: None,
        value_schema_metadata: None,
    }
}

/// An upper bound of a record's size in the event JSON.
fn estimated_json_size(tp: &TopicPartition, record: &Record) -> usize {
    let b64 = |n: usize| n.div_ceil(3) * 4;
    let headers: usize = record
        .headers
        .iter()
        .map(|h| h.name.len() + 8 + h.value.len() * 5)
        .sum();
    200 + 2 * tp.topic.len()
        + record.key.as_ref().map_or(4, |k| b64(k.len()))
        + record.value.as_ref().map_or(4, |v| b64(v.len()))
        + headers
}
