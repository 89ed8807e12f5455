//! How a batch is executed: [`BatchOptions`] and the [`PoisonPolicy`] for records that
//! cannot be processed.

use std::collections::BTreeMap;
use std::time::Duration;

/// What to do with a *poison* record: one whose key or value does not deserialize, whose
/// user function returns an error or panics (also an adder, reducer or aggregate serde
/// when its store folds the batch), or that would break a DynamoDB limit (a key too long
/// for a partition key, an item past 400 KB; see `state::limits`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum PoisonPolicy {
    /// Fail: the partition stops at the record (the event source's default behaviour).
    /// With partial batch responses, only that partition stops, from that record;
    /// without, the whole batch fails and is retried.
    #[default]
    Fail,
    /// Skip the record and count it (`BatchReport::poison_records`).
    Skip,
    /// Produce the record, unchanged, to this topic, with the error in the
    /// `lambda-streams-error` header and its source in `lambda-streams-source`; go on.
    DeadLetter {
        /// The dead-letter topic.
        topic: String,
    },
}

impl std::str::FromStr for PoisonPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fail" => Ok(PoisonPolicy::Fail),
            "skip" => Ok(PoisonPolicy::Skip),
            _ => match s.strip_prefix("dead-letter:") {
                Some(topic) if !topic.is_empty() => Ok(PoisonPolicy::DeadLetter {
                    topic: topic.to_owned(),
                }),
                _ => Err(format!(
                    "unknown poison policy {s:?}: use fail, skip or dead-letter:<topic>"
                )),
            },
        }
    }
}

pub use crate::sink::OutputGuarantee;

impl BatchOptions {
    /// The threads that deserialize a large batch's records ahead:
    /// [`deserialize_threads`](Self::deserialize_threads), or the process's CPUs when it is
    /// `0` (in Lambda, its whole vCPUs of CPU share), at most 4.
    pub(crate) fn read_ahead_threads(&self) -> usize {
        match self.deserialize_threads {
            0 => crate::event::cpus(),
            n => n,
        }
        .min(crate::event::MAX_THREADS)
    }
}

/// How a batch is executed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchOptions {
    /// What to do with poison records.
    pub poison: PoisonPolicy,
    /// Report failed records as a partial batch response (`batchItemFailures`) instead of
    /// failing the whole batch. Enable it only together with the event source mapping's
    /// `FunctionResponseTypes: [ReportBatchItemFailures]`: without it, Lambda ignores the
    /// response and would commit the failed records.
    pub partial_batch_response: bool,
    /// For emit-on-close windows: a source partition whose stream time has not advanced
    /// for this long no longer holds the low watermark back (30 s by default).
    pub idle_partition_timeout: Duration,
    /// For emit-on-close windows: the number of partitions of each source topic. A
    /// declared partition that has not delivered a record yet holds the low watermark
    /// back (until the idle timeout, counted from the table's first stream time), so that
    /// a window cannot close before every partition has been heard from. Without it, the
    /// low watermark is over the partitions seen so far: at the very start, the first
    /// partitions' records can close windows that a slower partition still feeds (its
    /// records for them are then late).
    pub source_partitions: BTreeMap<String, i32>,
    /// The output guarantee. Under [`OutputGuarantee::ExactlyOnce`] each output record is
    /// tagged with the event record that caused it, for the transactional output to route
    /// it into that partition's transaction (see [`crate::kafka::ExactlyOnceOutput`]).
    pub output: OutputGuarantee,
    /// How many threads deserialize a large batch's source records ahead of the topology
    /// (a topic's records in the batch holding 256 KiB of keys and values or more): `0`,
    /// the default, for the process's CPUs (at most 4): the cores available, and in Lambda
    /// no more than one per 1,769 MB of memory (its CPU share, so one thread under
    /// 3,538 MB); `1` to deserialize every record on the batch's own thread as the topology
    /// reaches it. Either way the
    /// topology sees the same values and errors in the same order: only where the serdes
    /// run changes (they are `Send + Sync`; see `serdes::Serde`).
    pub deserialize_threads: usize,
    /// Whether a large batch read ahead on several threads reads its next window of records
    /// while the topology takes the records of this one (`true`), or reads each window with
    /// every thread and then runs the topology over it (`false`, the default). The overlap
    /// hands values allocated on one thread to another to be freed and reallocated while
    /// the first goes on allocating: glibc's `malloc` (Rust's default global allocator on
    /// Linux) serializes that on its arenas' locks, so the overlap is slower there than
    /// without it; it is meant for a function whose `#[global_allocator]` keeps free lists
    /// per thread (e.g. mimalloc). Measure it on the function (BENCHMARKS.md section 1 has
    /// the benchmark's figures). The same values and errors in the same order either way.
    pub overlap_reading: bool,
}

/// The default [`BatchOptions::idle_partition_timeout`].
pub const DEFAULT_IDLE_PARTITION_TIMEOUT: Duration = Duration::from_secs(30);

impl Default for BatchOptions {
    fn default() -> Self {
        BatchOptions {
            poison: PoisonPolicy::default(),
            partial_batch_response: false,
            idle_partition_timeout: DEFAULT_IDLE_PARTITION_TIMEOUT,
            source_partitions: BTreeMap::new(),
            output: OutputGuarantee::AtLeastOnce,
            deserialize_threads: 0,
            overlap_reading: false,
        }
    }
}
