//! Records that cross several repartition topics, and stores fed through several channels
//! (a stream merged with its own repartitioned copy, two repartition topics of one source, a
//! direct re-key after a hop): every source record's effect is applied exactly once, under
//! fault schedules on every hop (design notes, section 4a; docs/state.md).
//!
//! The test plays the Kafka cluster and the event source: one log per topic-partition, the
//! records the topology produces to its repartition topics appended to them (partitioned by
//! key, as Kafka's producer does), and invocations of `Topology::process` over ranges of
//! those logs. The faults are the ones section 3 of the design notes allows: a duplicate
//! delivery, a batch that fails after producing part of its outputs and is retried (perhaps
//! with a later end), a zombie that finishes (writes its state and produces) after its retry,
//! a redelivery of an old range, several partitions in one event. Expected values are
//! counted here from the source records (each distinct source record once), never taken from
//! the code under test.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use lambda_streams::dsl::Grouped;
use lambda_streams::event::{
    EventSource, Header, KafkaEvent, PartitionRecords, Record, TimestampType, TopicPartition,
};
use lambda_streams::serdes::{DecimalI64, Serde, Unit, Utf8};
use lambda_streams::sink::{MemorySink, OutputRecord};
use lambda_streams::state::memory::MemoryStore;
use lambda_streams::{StreamError, StreamsBuilder, Topology};

// ---------------------------------------------------------------------------------------
// The cluster and the event source
// ---------------------------------------------------------------------------------------

/// A small deterministic generator (xorshift64*), so that a failing seed replays.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// A number in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    /// True with probability `percent` / 100.
    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
}

/// The partition Kafka's producer would pick in this test: a hash of the key (FNV-1a).
fn partition_of(key: Option<&[u8]>, partitions: i32) -> i32 {
    let mut hash: u32 = 0x811C_9DC5;
    for b in key.unwrap_or_default() {
        hash ^= u32::from(*b);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    (hash % partitions as u32) as i32
}

/// Invocations that have not finished: a zombie's state write and outputs happen later.
enum Late {
    /// A whole invocation over `lo..hi` of a partition, run later.
    Run(TopicPartition, i64, i64),
    /// The outputs an invocation had not produced yet when it was given up for dead.
    Tail(Vec<OutputRecord>),
}

/// The logs of every topic-partition, the function, its state, and the event source's
/// committed offsets.
struct Cluster {
    topology: Topology,
    store: MemoryStore,
    /// The partition count of each repartition topic.
    internal: BTreeMap<String, i32>,
    logs: BTreeMap<TopicPartition, Vec<Record>>,
    committed: BTreeMap<TopicPartition, i64>,
    late: Vec<Late>,
    runtime: tokio::runtime::Runtime,
}

impl Cluster {
    fn new(topology: Topology, internal: &[(&str, i32)]) -> Self {
        let internal: BTreeMap<String, i32> = internal
            .iter()
            .map(|(t, n)| ((*t).to_owned(), *n))
            .collect();
        let mut logs = BTreeMap::new();
        for (topic, n) in &internal {
            for p in 0..*n {
                logs.insert(TopicPartition::new(topic.as_str(), p), Vec::new());
            }
        }
        Cluster {
            topology,
            store: MemoryStore::new(),
            internal,
            logs,
            committed: BTreeMap::new(),
            late: Vec::new(),
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime"),
        }
    }

    /// Appends a source record to `topic`-`partition`.
    fn source(&mut self, topic: &str, partition: i32, key: Option<&str>, value: &str) {
        let log = self
            .logs
            .entry(TopicPartition::new(topic, partition))
            .or_default();
        let offset = log.len() as i64;
        log.push(Record {
            offset,
            timestamp: 1_000 + offset,
            timestamp_type: TimestampType::CreateTime,
            key: key.map(|k| k.as_bytes().to_vec().into()),
            value: Some(value.as_bytes().to_vec().into()),
            headers: Vec::new(),
            key_schema_metadata: None,
            value_schema_metadata: None,
        });
    }

    /// Appends produced records to the logs of their repartition topics (by key); records
    /// of other topics leave the cluster.
    fn produce(&mut self, records: &[OutputRecord]) {
        for record in records {
            let Some(partitions) = self.internal.get(&record.topic) else {
                continue;
            };
            let partition = partition_of(record.key.as_deref(), *partitions);
            let log = self
                .logs
                .get_mut(&TopicPartition::new(record.topic.as_str(), partition))
                .expect("a log per partition");
            let offset = log.len() as i64;
            log.push(Record {
                offset,
                timestamp: record.timestamp.unwrap_or_default(),
                timestamp_type: TimestampType::CreateTime,
                key: record.key.clone().map(Into::into),
                value: record.value.clone().map(Into::into),
                headers: record
                    .headers
                    .iter()
                    .map(|(name, value)| Header::new(name.as_str(), value.clone()))
                    .collect(),
                key_schema_metadata: None,
                value_schema_metadata: None,
            });
        }
    }

    fn len(&self, tp: &TopicPartition) -> i64 {
        self.logs.get(tp).map_or(0, |log| log.len() as i64)
    }

    fn committed(&self, tp: &TopicPartition) -> i64 {
        self.committed.get(tp).copied().unwrap_or(0)
    }

    /// Runs the function once over the given ranges (one event) and returns what it
    /// produced; the state writes happen here.
    fn try_invoke(
        &self,
        ranges: &[(TopicPartition, i64, i64)],
    ) -> Result<Vec<OutputRecord>, StreamError> {
        let partitions = ranges
            .iter()
            .filter(|(_, lo, hi)| lo < hi)
            .map(|(tp, lo, hi)| PartitionRecords {
                tp: tp.clone(),
                records: self.logs[tp][*lo as usize..*hi as usize].to_vec(),
            })
            .collect();
        let event = KafkaEvent {
            source: EventSource::SelfManaged,
            bootstrap_servers: "127.0.0.1:9092".to_owned(),
            partitions,
        };
        let sink = MemorySink::new();
        self.runtime
            .block_on(self.topology.process(&event, &self.store, &sink))?;
        Ok(sink.records())
    }

    fn invoke(&self, ranges: &[(TopicPartition, i64, i64)]) -> Vec<OutputRecord> {
        self.try_invoke(ranges)
            .unwrap_or_else(|e| panic!("the batch {ranges:?} failed: {e}"))
    }

    /// A successful invocation over `lo..hi` of `tp`: processed, produced, committed.
    fn run(&mut self, tp: &TopicPartition, lo: i64, hi: i64) {
        let out = self.invoke(&[(tp.clone(), lo, hi)]);
        self.produce(&out);
        let committed = self.committed.entry(tp.clone()).or_insert(0);
        *committed = (*committed).max(hi);
    }

    /// Every partition the function consumes, in a fixed order.
    fn consumed(&self) -> Vec<TopicPartition> {
        let topics = self.topology.source_topics();
        self.logs
            .keys()
            .filter(|tp| topics.contains(&tp.topic))
            .cloned()
            .collect()
    }

    /// Runs the zombies, then consumes every log to its end without faults (in batches of
    /// up to `batch` records).
    fn drain(&mut self, batch: i64) {
        for late in std::mem::take(&mut self.late) {
            self.finish(late);
        }
        loop {
            let mut progress = false;
            for tp in self.consumed() {
                let (lo, len) = (self.committed(&tp), self.len(&tp));
                if lo < len {
                    self.run(&tp, lo, len.min(lo + batch));
                    progress = true;
                }
            }
            if !progress {
                return;
            }
        }
    }

    fn finish(&mut self, late: Late) {
        match late {
            Late::Run(tp, lo, hi) => {
                let out = self.invoke(&[(tp, lo, hi)]);
                self.produce(&out);
            }
            Late::Tail(out) => self.produce(&out),
        }
    }

    /// One random step of the event source on a random partition with records to deliver,
    /// with the faults of the design notes (section 3).
    fn step(&mut self, rng: &mut Rng) {
        if !self.late.is_empty() && rng.chance(25) {
            let i = rng.below(self.late.len());
            let late = self.late.swap_remove(i);
            self.finish(late);
            return;
        }
        let ready: Vec<TopicPartition> = self
            .consumed()
            .into_iter()
            .filter(|tp| self.committed(tp) < self.len(tp))
            .collect();
        if ready.is_empty() {
            return;
        }
        let tp = ready[rng.below(ready.len())].clone();
        let (lo, len) = (self.committed(&tp), self.len(&tp));
        let hi = len.min(lo + 1 + rng.below(4) as i64);
        match rng.below(100) {
            // A duplicate delivery (a rebalance): the batch runs twice, both produce.
            0..=11 => {
                self.run(&tp, lo, hi);
                self.run(&tp, lo, hi);
            }
            // The batch fails after part of its outputs went out; the event source retries
            // it later from the same offset (the next step on this partition, with its own
            // end: a shifted retry).
            12..=29 => {
                let out = self.invoke(&[(tp, lo, hi)]);
                let sent = rng.below(out.len() + 1);
                self.produce(&out[..sent]);
            }
            // A zombie: the invocation times out and runs on; its retry (with a later end)
            // succeeds first, the zombie writes its state and produces afterwards.
            30..=39 => {
                self.late.push(Late::Run(tp.clone(), lo, hi));
                let retry_hi = len.min(hi + rng.below(3) as i64);
                self.run(&tp, lo, retry_hi);
            }
            // A zombie that wrote its state and produced part of its outputs before its
            // retry; the rest of its outputs go out afterwards.
            40..=47 => {
                let out = self.invoke(&[(tp.clone(), lo, hi)]);
                let sent = rng.below(out.len() + 1);
                self.produce(&out[..sent]);
                self.late.push(Late::Tail(out[sent..].to_vec()));
                let retry_hi = len.min(hi + rng.below(3) as i64);
                self.run(&tp, lo, retry_hi);
            }
            // A redelivery of an old range.
            48..=54 if lo > 0 => {
                let from = rng.below(lo as usize) as i64;
                let to = lo.min(from + 1 + rng.below(4) as i64);
                let out = self.invoke(&[(tp, from, to)]);
                self.produce(&out);
            }
            // Two partitions in one event.
            55..=69 if ready.len() > 1 => {
                let other = ready[rng.below(ready.len())].clone();
                if other == tp {
                    self.run(&tp, lo, hi);
                    return;
                }
                let (olo, olen) = (self.committed(&other), self.len(&other));
                let ohi = olen.min(olo + 1 + rng.below(4) as i64);
                let out = self.invoke(&[(tp.clone(), lo, hi), (other.clone(), olo, ohi)]);
                self.produce(&out);
                for (tp, hi) in [(tp, hi), (other, ohi)] {
                    let committed = self.committed.entry(tp).or_insert(0);
                    *committed = (*committed).max(hi);
                }
            }
            _ => self.run(&tp, lo, hi),
        }
    }

    /// The counts of additive `store`, by key.
    fn counts(&self, store: &str) -> BTreeMap<String, i64> {
        self.store
            .items(store)
            .into_iter()
            .map(|(k, v, _)| (String::from_utf8(k).unwrap(), v))
            .collect()
    }

    /// The aggregates of `store` (decimal numbers), by key.
    fn sums(&self, store: &str) -> BTreeMap<String, i64> {
        self.store
            .states(store)
            .into_iter()
            .map(|(k, state)| {
                let sum = DecimalI64.deserialize(state.aggregate.as_deref()).unwrap();
                (String::from_utf8(k).unwrap(), sum)
            })
            .collect()
    }

    /// How many copies of source records the repartition topic `topic` holds in all.
    fn copies(&self, topic: &str) -> usize {
        self.logs
            .iter()
            .filter(|(tp, _)| tp.topic == topic)
            .map(|(_, log)| log.len())
            .sum()
    }
}

// ---------------------------------------------------------------------------------------
// The topologies and their references
// ---------------------------------------------------------------------------------------

const WORDS: [&str; 10] = [
    "apple",
    "avocado",
    "banana",
    "blueberry",
    "cherry",
    "cranberry",
    "date",
    "damson",
    "elderberry",
    "fig",
];

/// Source lines: `partitions` partitions of `lines`, `n` random lines of 0..4 words each.
fn lines(rng: &mut Rng, partitions: i32, n: usize) -> Vec<(i32, String)> {
    (0..n)
        .map(|_| {
            let words: Vec<&str> = (0..rng.below(5))
                .map(|_| WORDS[rng.below(WORDS.len())])
                .collect();
            (rng.below(partitions as usize) as i32, words.join(" "))
        })
        .collect()
}

/// lines → words (hop 1, keyed by word) → first letters (hop 2, keyed by letter) →
/// count and total length per letter; with `third`, also → word-length parity (hop 3,
/// keyed by parity) → count per parity.
fn hops(third: bool) -> Topology {
    let builder = StreamsBuilder::new();
    let by_letter = builder
        .stream("lines", Unit, Utf8)
        .flat_map(|_, line: String| {
            line.split_whitespace()
                .map(|w| (w.to_owned(), ()))
                .collect::<Vec<_>>()
        })
        .repartition("words", Utf8, Unit)
        .map(|word: String, ()| (word[..1].to_owned(), word))
        .repartition("letters", Utf8, Utf8);
    let grouped = by_letter.group_by_key(Utf8);
    grouped.count("per-letter");
    grouped.aggregate(
        "chars",
        || 0i64,
        |_, word: String, n| n + word.len() as i64,
        DecimalI64,
    );
    if third {
        by_letter
            .map(|_, word: String| {
                (
                    if word.len().is_multiple_of(2) {
                        "even"
                    } else {
                        "odd"
                    }
                    .to_owned(),
                    word,
                )
            })
            .repartition("parity", Utf8, Utf8)
            .group_by_key(Utf8)
            .count("per-parity");
    }
    builder.build()
}

/// The right answer for [`hops`], from each source line once: (count per letter, total
/// length per letter, count per parity).
fn hops_reference(
    lines: &[(i32, String)],
) -> (
    BTreeMap<String, i64>,
    BTreeMap<String, i64>,
    BTreeMap<String, i64>,
) {
    let (mut count, mut chars, mut parity) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
    for (_, line) in lines {
        for word in line.split_whitespace() {
            *count.entry(word[..1].to_owned()).or_default() += 1;
            *chars.entry(word[..1].to_owned()).or_default() += word.len() as i64;
            let p = if word.len().is_multiple_of(2) {
                "even"
            } else {
                "odd"
            };
            *parity.entry(p.to_owned()).or_default() += 1;
        }
    }
    (count, chars, parity)
}

/// The internal topics of [`hops`]: more word partitions than letter partitions, so the
/// records of one source partition reach one letter partition through several word
/// partitions, interleaved.
const HOP_TOPICS: [(&str, i32); 3] = [("words", 3), ("letters", 2), ("parity", 2)];

fn hops_cluster(third: bool, lines: &[(i32, String)]) -> Cluster {
    let mut cluster = Cluster::new(hops(third), &HOP_TOPICS);
    for (partition, line) in lines {
        cluster.source("lines", *partition, None, line);
    }
    cluster
}

/// How the stores of [`merged`] are fed.
#[derive(Debug, Clone, Copy)]
enum Merge {
    /// A stream merged with its own repartitioned copy: every record counts twice.
    DirectAndCopy,
    /// Two repartition topics of one source: every record counts twice.
    TwoTopics,
    /// Direct, one hop and two hops into one store: every record counts three times.
    OneTwoAndNoHop,
    /// One hop by key, then a direct re-key by value: every record counts once, per value.
    DirectAfterHop,
}

fn merged(kind: Merge) -> Topology {
    let builder = StreamsBuilder::new();
    let s = builder.stream("in", Utf8, Utf8);
    match kind {
        Merge::DirectAndCopy => {
            s.merge(&s.repartition("copy", Utf8, Utf8))
                .group_by_key(Utf8)
                .count("n");
        }
        Merge::TwoTopics => {
            s.repartition("copy", Utf8, Utf8)
                .merge(&s.repartition("copy-b", Utf8, Utf8))
                .group_by_key(Utf8)
                .count("n");
        }
        Merge::OneTwoAndNoHop => {
            let two = s
                .repartition("copy-b", Utf8, Utf8)
                .repartition("copy-c", Utf8, Utf8);
            s.merge(&s.repartition("copy", Utf8, Utf8))
                .merge(&two)
                .group_by_key(Utf8)
                .count("n");
        }
        Merge::DirectAfterHop => {
            s.repartition("copy", Utf8, Utf8)
                .group_by(|_, v: &String| v.clone(), Grouped::direct(Utf8))
                .count("n");
        }
    }
    builder.build()
}

const MERGE_TOPICS: [(&str, i32); 3] = [("copy", 2), ("copy-b", 3), ("copy-c", 2)];

/// Source records of `in`: (partition, key, value).
fn keyed(rng: &mut Rng, partitions: i32, n: usize) -> Vec<(i32, String, String)> {
    (0..n)
        .map(|_| {
            (
                rng.below(partitions as usize) as i32,
                format!("k{}", rng.below(6)),
                format!("v{}", rng.below(3)),
            )
        })
        .collect()
}

fn merged_reference(kind: Merge, records: &[(i32, String, String)]) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    for (_, key, value) in records {
        let (item, times) = match kind {
            Merge::DirectAndCopy | Merge::TwoTopics => (key, 2),
            Merge::OneTwoAndNoHop => (key, 3),
            Merge::DirectAfterHop => (value, 1),
        };
        *out.entry(item.clone()).or_default() += times;
    }
    out
}

fn merged_cluster(kind: Merge, records: &[(i32, String, String)]) -> Cluster {
    let mut cluster = Cluster::new(merged(kind), &MERGE_TOPICS);
    for (partition, key, value) in records {
        cluster.source("in", *partition, Some(key), value);
    }
    cluster
}

// ---------------------------------------------------------------------------------------
// Defect: two hops count an upstream retry's copies twice
// ---------------------------------------------------------------------------------------

/// The first hop's producer is retried (the batch failed after producing), so `words`
/// holds every word twice, at new offsets; the second hop's consumer reads the copies in
/// different batches. Each source line still counts once.
#[test]
fn two_hops_count_an_upstream_retry_once() {
    let input = vec![
        (0, "apple avocado banana".to_owned()),
        (0, "cherry apple".to_owned()),
        (1, "blueberry date".to_owned()),
    ];
    let mut cluster = hops_cluster(false, &input);
    for p in 0..2 {
        let tp = TopicPartition::new("lines", p);
        let len = cluster.len(&tp);
        // Fails after producing everything; retried from the same offset.
        let out = cluster.invoke(&[(tp.clone(), 0, len)]);
        cluster.produce(&out);
        cluster.run(&tp, 0, len);
    }
    assert_eq!(cluster.copies("words"), 14, "every word twice in `words`");
    // The word partitions one record at a time: the copies are in different batches.
    cluster.drain(1);
    let (count, chars, _) = hops_reference(&input);
    assert_eq!(cluster.counts("per-letter"), count);
    assert_eq!(cluster.sums("chars"), chars);
}

/// The records the first hop's consumer produces to the second repartition topic name the
/// original source record, not the record of `words` they were read from.
#[test]
fn a_second_hop_names_the_original_source_record() {
    let builder = StreamsBuilder::new();
    builder
        .stream("lines", Unit, Utf8)
        .repartition("words", Unit, Utf8)
        .repartition("letters", Unit, Utf8)
        .to("out", Unit, Utf8);
    let mut cluster = Cluster::new(builder.build(), &[("words", 1), ("letters", 1)]);
    cluster.source("lines", 3, None, "x");
    cluster.source("lines", 3, None, "y");
    let lines = TopicPartition::new("lines", 3);
    let words = TopicPartition::new("words", 0);
    // `words` holds x, y, x, y: an upstream retry.
    let out = cluster.invoke(&[(lines.clone(), 0, 2)]);
    cluster.produce(&out);
    cluster.run(&lines, 0, 2);
    let out = cluster.invoke(&[(words.clone(), 2, 4)]);
    let sources: Vec<&[u8]> = out
        .iter()
        .filter(|r| r.topic == "letters")
        .map(|r| r.header("lambda-streams-source").expect("a source header"))
        .collect();
    assert_eq!(sources, [&b"lines:3:0"[..], &b"lines:3:1"[..]]);
}

// ---------------------------------------------------------------------------------------
// Defect: channels merged into one store share one watermark per partition
// ---------------------------------------------------------------------------------------

fn merged_in_order(kind: Merge) {
    let records = vec![
        (0, "k1".to_owned(), "v1".to_owned()),
        (0, "k2".to_owned(), "v1".to_owned()),
        (0, "k1".to_owned(), "v2".to_owned()),
        (0, "k3".to_owned(), "v1".to_owned()),
    ];
    let mut cluster = merged_cluster(kind, &records);
    cluster.drain(10);
    assert_eq!(
        cluster.counts("n"),
        merged_reference(kind, &records),
        "{kind:?}"
    );
}

/// `s.merge(&s.repartition(..))`: the direct record and its repartitioned copy are two
/// contributions of one source record, through two channels.
#[test]
fn a_stream_merged_with_its_repartitioned_copy_counts_both() {
    merged_in_order(Merge::DirectAndCopy);
}

/// `s.repartition(a).merge(&s.repartition(b))`: one source record through two topics.
#[test]
fn two_repartition_topics_of_one_source_feed_one_store() {
    merged_in_order(Merge::TwoTopics);
}

/// A direct record, its copy through one hop and its copy through two hops, in one store.
#[test]
fn no_hop_one_hop_and_two_hops_feed_one_store() {
    merged_in_order(Merge::OneTwoAndNoHop);
}

/// One hop by key, then a direct re-key by value: an item is fed by every partition of the
/// repartition topic, in parallel invocations; the later source offsets arrive first.
#[test]
fn a_direct_rekey_after_a_hop_is_fed_by_every_hop_partition() {
    let kind = Merge::DirectAfterHop;
    let records: Vec<(i32, String, String)> = (0..8)
        .map(|i| (0, format!("k{i}"), "v".to_owned()))
        .collect();
    let mut cluster = merged_cluster(kind, &records);
    cluster.run(&TopicPartition::new("in", 0), 0, 8);
    // Each copy partition holds some of the keys; the later partition runs first.
    for p in [1, 0] {
        let tp = TopicPartition::new("copy", p);
        assert!(
            cluster.len(&tp) > 0,
            "the test needs keys on both partitions"
        );
        let len = cluster.len(&tp);
        cluster.run(&tp, 0, len);
    }
    assert_eq!(cluster.counts("n"), merged_reference(kind, &records));
}

// ---------------------------------------------------------------------------------------
// Fault schedules
// ---------------------------------------------------------------------------------------

/// Seeds per randomised test; a failure names its seed.
const SEEDS: u64 = 150;

fn with_seeds(test: impl Fn(u64)) {
    for seed in 0..SEEDS {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| test(seed)));
        if let Err(panic) = result {
            eprintln!("failing seed: {seed}");
            std::panic::resume_unwind(panic);
        }
    }
}

fn hops_under_faults(third: bool, seed: u64) {
    let mut rng = Rng::new(seed);
    let n = 4 + rng.below(12);
    let input = lines(&mut rng, 2, n);
    let mut cluster = hops_cluster(third, &input);
    for _ in 0..rng.below(80) {
        cluster.step(&mut rng);
    }
    cluster.drain(1 + rng.below(5) as i64);
    let (count, chars, parity) = hops_reference(&input);
    let context = format!("seed {seed}, input {input:?}");
    assert_eq!(cluster.counts("per-letter"), count, "{context}");
    assert_eq!(cluster.sums("chars"), chars, "{context}");
    if third {
        assert_eq!(cluster.counts("per-parity"), parity, "{context}");
    }
}

/// Two hops under duplicate deliveries, shifted retries, zombies and redeliveries on every
/// hop: exact.
#[test]
fn two_hops_are_exact_under_fault_schedules() {
    with_seeds(|seed| hops_under_faults(false, seed));
}

/// Three hops, with stores after the second and the third: exact.
#[test]
fn three_hops_are_exact_under_fault_schedules() {
    with_seeds(|seed| hops_under_faults(true, seed));
}

/// Every merge of channels under the same faults: exact.
#[test]
fn merged_channels_are_exact_under_fault_schedules() {
    for kind in [
        Merge::DirectAndCopy,
        Merge::TwoTopics,
        Merge::OneTwoAndNoHop,
        Merge::DirectAfterHop,
    ] {
        with_seeds(|seed| {
            let mut rng = Rng::new(seed);
            let n = 3 + rng.below(14);
            let records = keyed(&mut rng, 2, n);
            let mut cluster = merged_cluster(kind, &records);
            for _ in 0..rng.below(80) {
                cluster.step(&mut rng);
            }
            cluster.drain(1 + rng.below(5) as i64);
            assert_eq!(
                cluster.counts("n"),
                merged_reference(kind, &records),
                "{kind:?}, seed {seed}, input {records:?}"
            );
        });
    }
}

// ---------------------------------------------------------------------------------------
// Bad headers
// ---------------------------------------------------------------------------------------

/// A record of a repartition topic whose hop headers are not the framework's is a poison
/// record named by its topic-partition and offset, never a panic.
#[test]
fn a_bad_hop_header_names_the_record() {
    let bad: [&[(&str, &[u8])]; 5] = [
        &[],
        &[("lambda-streams-source", b"lines:0")],
        &[("lambda-streams-source", b"lines:0:1")],
        &[
            ("lambda-streams-source", b"lines:0:1"),
            ("lambda-streams-sequence", b"x"),
        ],
        &[
            ("lambda-streams-source", b"lines:0:1"),
            ("lambda-streams-sequence", b"0,1"),
        ],
    ];
    for headers in bad {
        let builder = StreamsBuilder::new();
        builder
            .stream("lines", Unit, Utf8)
            .repartition("words", Unit, Utf8)
            .group_by_key(Unit)
            .count("n");
        let mut cluster = Cluster::new(builder.build(), &[("words", 1)]);
        let words = TopicPartition::new("words", 0);
        cluster.logs.get_mut(&words).unwrap().push(Record {
            offset: 0,
            timestamp: 0,
            timestamp_type: TimestampType::CreateTime,
            key: None,
            value: Some(b"x".to_vec().into()),
            headers: headers
                .iter()
                .map(|(n, v)| Header::new(*n, v.to_vec()))
                .collect(),
            key_schema_metadata: None,
            value_schema_metadata: None,
        });
        let error = cluster
            .try_invoke(&[(words.clone(), 0, 1)])
            .expect_err("a poison record under the default policy");
        let message = error.to_string();
        assert!(
            message.contains("words-0") && message.contains("offset 0"),
            "{headers:?}: {message}"
        );
    }
}
