//! The runner's settings: the event source mapping's, with its defaults, and the faults
//! a test or a demo may inject.

use std::time::Duration;

use crate::batch::MAX_BATCH_SIZE;
use crate::filter::FilterCriteria;
use crate::position::StartingPosition;

/// When an on-failure destination is set and retries are unlimited, the ESM caps them at 10.
pub const RETRIES_WITH_DESTINATION: u32 = 10;
/// The longest batching window the ESM accepts: 300 s.
pub const MAX_BATCHING_WINDOW: Duration = Duration::from_secs(300);
/// The default bound on invocations in flight (see [`RunnerConfig::concurrency`]).
pub const DEFAULT_CONCURRENCY: usize = 8;
/// The most invocations in flight the runner accepts: one per partition of a large topic.
pub const MAX_CONCURRENCY: usize = 1000;
/// The default of [`RunnerConfig::read_ahead_batches`].
pub const DEFAULT_READ_AHEAD_BATCHES: usize = 10;

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
    /// The Nth invocation (counting every invocation) fails before it reaches the function,
    /// as a throttled or timed-out invocation would.
    pub fail_invocation: Option<u64>,
    /// After the Nth batch's successful invocation, the runner aborts before committing:
    /// the batch is delivered again when a runner resumes the group.
    pub crash_before_commit: Option<u64>,
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
    /// Where partitions the group has not committed start (`StartingPosition`).
    pub starting_position: StartingPosition,
    /// Records per batch at most (`BatchSize`: default 100, at most 10,000).
    pub batch_size: usize,
    /// How long to gather records before invoking (`MaximumBatchingWindowInSeconds`:
    /// default 500 ms, at most 300 s).
    pub batching_window: Duration,
    /// The event's `eventSource`.
    pub shape: EventShape,
    /// Retries of a failed record before it is given up on (`MaximumRetryAttempts`; the
    /// first invocation is not a retry). `None`: without limit, as the ESM's default
    /// (but 10 when an on-failure destination is set, as the ESM does).
    pub maximum_retry_attempts: Option<u32>,
    /// Records older than this are not delivered but given up on
    /// (`MaximumRecordAgeInSeconds`). `None`: no limit.
    pub maximum_record_age: Option<Duration>,
    /// On a function error, retry the batch as two halves (`BisectBatchOnFunctionError`).
    /// Splitting does not count as a retry; a batch of one record does.
    pub bisect_batch_on_function_error: bool,
    /// Honour partial batch responses (`FunctionResponseTypes: [ReportBatchItemFailures]`).
    /// When false, any normal return is complete success.
    pub report_batch_item_failures: bool,
    /// A Kafka topic (the ESM's `kafka://topic` on-failure destination) receiving the
    /// records given up on; without it they are skipped, with a warning.
    pub on_failure_topic: Option<String>,
    /// The event source's schema validation against a registry (`SchemaRegistryConfig`,
    /// see [`crate::schema`]); `None`: records are delivered as they are.
    pub schema_validation: Option<crate::schema::SchemaValidationConfig>,
    /// The event source's `FilterCriteria` on the records' `value`: a record that matches
    /// none of the filters is not delivered, and is committed (as Lambda does). Empty: every
    /// record is delivered.
    pub filter: FilterCriteria,
    /// Topics whose records are never filtered: a topology's repartition topics, which in
    /// Lambda are read by an event source mapping of their own, without the input's filter
    /// (see `template.yaml`).
    pub unfiltered_topics: Vec<String>,
    /// Exit once the group has consumed everything (for tests and demos): no record for
    /// [`idle_timeout`](Self::idle_timeout), and the group's committed offsets at the end
    /// of every partition it owns.
    pub until_idle: bool,
    /// Exit as soon as the records that were in the topics when the runner started are
    /// done: every partition this runner owns committed up to (at least) the end offset it
    /// had at the start, without waiting for an idle period. Records produced later may be
    /// delivered too, but are not waited for. For benchmarks and batch jobs over a fixed
    /// input. In a group of several runners, each stops once the partitions it owns are done.
    pub until_caught_up: bool,
    /// How long without new records counts as idle.
    pub idle_timeout: Duration,
    /// First retry delay of a failed batch's partitions; doubles per failed attempt up to
    /// 5 s. Only those partitions wait: the others keep being delivered meanwhile.
    pub retry_backoff: Duration,
    /// Invocations in flight at most (1..=1000). The event source invokes the function
    /// for several partitions at once, in different invocations and containers, with at
    /// most one batch of a partition in flight; the runner does the same: a batch is formed
    /// only from partitions without one in flight, and each invocation runs as its own
    /// task while the runner keeps consuming, settling and committing.
    ///
    /// Default 8 ([`DEFAULT_CONCURRENCY`]). In Lambda the bound is the partition count (one
    /// invocation per partition, spread over the pollers), so a topic of up to 8
    /// partitions runs with every partition in flight, as it would there; beyond that a
    /// laptop (one process, one DynamoDB endpoint, a few cores) gains little from more
    /// parallel invocations, and a topic of hundreds of partitions must not open hundreds
    /// of them. 1 gives one invocation at a time, in the order batches are formed.
    pub concurrency: usize,
    /// Redeliveries to inject.
    pub faults: Faults,
    /// Print a progress line every second.
    pub progress: bool,
    /// Batches' worth of records (at least 10,000) a partition may have buffered before it
    /// is paused (see [`crate::runner`]); resumed below half of it.
    pub read_ahead_batches: usize,
    /// librdkafka properties of the group consumer, set after the runner's own (so they
    /// override them), e.g. `group.protocol=consumer` or `queued.max.messages.kbytes`.
    pub consumer_properties: Vec<(String, String)>,
}

impl Default for RunnerConfig {
    fn default() -> Self {
        RunnerConfig {
            bootstrap_servers: "127.0.0.1:9092".into(),
            group_id: "lambda-streams".into(),
            topics: Vec::new(),
            starting_position: StartingPosition::TrimHorizon,
            batch_size: 100,
            batching_window: Duration::from_millis(500),
            shape: EventShape::SelfManaged,
            maximum_retry_attempts: None,
            maximum_record_age: None,
            bisect_batch_on_function_error: false,
            report_batch_item_failures: true,
            on_failure_topic: None,
            schema_validation: None,
            filter: FilterCriteria::default(),
            unfiltered_topics: Vec::new(),
            until_idle: false,
            until_caught_up: false,
            idle_timeout: Duration::from_secs(2),
            retry_backoff: Duration::from_millis(100),
            concurrency: DEFAULT_CONCURRENCY,
            faults: Faults::default(),
            progress: false,
            read_ahead_batches: DEFAULT_READ_AHEAD_BATCHES,
            consumer_properties: Vec::new(),
        }
    }
}

impl RunnerConfig {
    /// Checks the settings; an error names the setting.
    pub fn validate(&self) -> Result<(), String> {
        if self.batch_size == 0 || self.batch_size > MAX_BATCH_SIZE {
            return Err(format!(
                "batch size {} is out of range 1..={MAX_BATCH_SIZE}",
                self.batch_size
            ));
        }
        if self.batching_window > MAX_BATCHING_WINDOW {
            return Err(format!(
                "batching window {:?} is over the maximum of 300 s",
                self.batching_window
            ));
        }
        if self.concurrency == 0 || self.concurrency > MAX_CONCURRENCY {
            return Err(format!(
                "concurrency {} is out of range 1..={MAX_CONCURRENCY}",
                self.concurrency
            ));
        }
        if self.read_ahead_batches == 0 {
            return Err("read-ahead must be at least one batch".into());
        }
        if self.until_idle && self.until_caught_up {
            return Err(
                "until-idle and until-caught-up are two stop conditions: choose one".into(),
            );
        }
        if let Some((key, _)) = self
            .consumer_properties
            .iter()
            .find(|(k, _)| k == "group.id" || k == "enable.auto.commit")
        {
            return Err(format!(
                "consumer property {key} is the runner's own (use --group-id; offsets are committed only after success)"
            ));
        }
        if self.topics.is_empty() {
            return Err("no topic to consume".into());
        }
        if self.group_id.trim().is_empty() {
            return Err("the consumer group id is empty".into());
        }
        if self.maximum_record_age.is_some_and(|a| a.is_zero()) {
            return Err("maximum record age must be positive (or unset: no limit)".into());
        }
        if let Some(dest) = &self.on_failure_topic
            && self.topics.contains(dest)
        {
            return Err(format!(
                "on-failure topic {dest:?} is also a source topic: records given up on would be consumed again (the event source forbids it)"
            ));
        }
        Ok(())
    }

    /// The retry limit in effect: the configured one, or 10 with an on-failure
    /// destination and no configured limit.
    pub fn effective_retry_limit(&self) -> Option<u32> {
        self.maximum_retry_attempts.or(self
            .on_failure_topic
            .as_ref()
            .map(|_| RETRIES_WITH_DESTINATION))
    }
}
