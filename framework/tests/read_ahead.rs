//! A large batch's records deserialized ahead on several threads
//! (`BatchOptions::deserialize_threads`) give the batch exactly what reading each record
//! where it stands gives: the same outputs in the same order, the same poison records named
//! the same way under every policy, the same partial batch response, the same error.
//!
//! The batch (three partitions, ~2.6 MB of keys and values: above the 256 KiB from which a
//! topic is read ahead, and read in windows of 1 MiB, which end inside partitions) holds
//! values that are not JSON, keys that are not UTF-8 and values on which the value serde
//! panics, among valid records. Each is run with every window read before the topology
//! takes from it, and with the next window read while it does
//! (`BatchOptions::overlap_reading`); once more with outputs enough to be sent in chunks
//! (the threads' scope ends and starts again around each send). Expected outputs come from
//! `serde_json` and plain Rust over the same records, not from the framework.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lambda_streams::event::{
    Bytes, EventSource, KafkaEvent, PartitionRecords, Record, TimestampType, TopicPartition,
};
use lambda_streams::serdes::{DecimalI64, Json, Serde, SerdeError, Utf8};
use lambda_streams::sink::{MemorySink, OutputRecord};
use lambda_streams::state::memory::MemoryStore;
use lambda_streams::{BatchOptions, BatchOutcome, PoisonPolicy, StreamError, StreamsBuilder};

#[derive(Clone, serde::Serialize, serde::Deserialize)]
struct View {
    user: String,
    ms: i64,
}

/// Deserializations run on the framework's read-ahead threads, over the whole test binary.
static ON_READ_THREADS: AtomicUsize = AtomicUsize::new(0);

/// `Json<View>` that panics on a value containing `PANIC`, and counts where it runs and
/// how often it panicked.
struct Panicky(Json<View>, Arc<AtomicUsize>);

impl Serde<View> for Panicky {
    fn serialize(&self, value: &View) -> Option<Vec<u8>> {
        Some(format!("{}:{}", value.user, value.ms).into_bytes())
    }
    fn deserialize(&self, data: Option<&[u8]>) -> Result<View, SerdeError> {
        if std::thread::current().name() == Some("lambda-streams-read") {
            ON_READ_THREADS.fetch_add(1, Ordering::Relaxed);
        }
        if data.is_some_and(|d| d.windows(5).any(|w| w == b"PANIC")) {
            self.1.fetch_add(1, Ordering::Relaxed);
            panic!("a value serde that panics");
        }
        self.0.deserialize(data)
    }
}

/// The kinds of records, by offset: most valid, some bad in one way each.
fn bytes_of(partition: i32, offset: i64) -> (Vec<u8>, Vec<u8>) {
    let n = offset * 7 + i64::from(partition) * 13;
    let key = if n % 97 == 5 {
        vec![b'k', 0xfe, b'!'] // not UTF-8
    } else {
        format!("key-{}", n % 50).into_bytes()
    };
    let value = match n % 89 {
        3 => b"{\"user\": \"u1\", \"ms\": ".to_vec(), // not JSON
        11 => format!("{{\"user\":\"PANIC\",\"ms\":{n}}}").into_bytes(),
        _ => format!(
            "{{\"user\":\"u{}\",\"ms\":{},\"page\":\"/articles/{}/comments?sort=new&page={}\"}}",
            n % 37,
            (n * 31) % 3_000,
            n * 1_000_003,
            n % 9
        )
        .into_bytes(),
    };
    (key, value)
}

/// The batch: partitions 0–2 of `in`, 6,000 records each from offset 1,000.
fn event() -> KafkaEvent {
    let partitions = (0..3)
        .map(|p| PartitionRecords {
            tp: TopicPartition::new("in", p),
            records: (1_000..7_000)
                .map(|offset| {
                    let (key, value) = bytes_of(p, offset);
                    Record {
                        offset,
                        timestamp: 1_700_000_000_000 + offset,
                        timestamp_type: TimestampType::CreateTime,
                        key: Some(Bytes::from(key)),
                        value: Some(Bytes::from(value)),
                        headers: Vec::new(),
                        key_schema_metadata: None,
                        value_schema_metadata: None,
                    }
                })
                .collect(),
        })
        .collect();
    KafkaEvent {
        source: EventSource::SelfManaged,
        bootstrap_servers: "b:9092".to_owned(),
        partitions,
    }
}

/// A valid record as the reference reads it: key, user, duration.
type Read = (String, String, i64);

/// The reference's reading of a record: `None` for a poison record.
fn reference(record: &Record) -> Option<Read> {
    let key = std::str::from_utf8(record.key.as_deref()?).ok()?.to_owned();
    let value: serde_json::Value = serde_json::from_slice(record.value.as_deref()?).ok()?;
    let user = value["user"].as_str()?.to_owned();
    (user != "PANIC").then_some(())?;
    Some((key, user, value["ms"].as_i64()?))
}

/// Two readers of `in`: views of 1 s or more produced as `user:ms`, views counted per user;
/// a third reader takes the raw values as text. `panics` counts the value serde's panics.
fn topology(panics: &Arc<AtomicUsize>) -> lambda_streams::Topology {
    let builder = StreamsBuilder::new();
    let views = builder.stream("in", Utf8, Panicky(Json::new(), Arc::clone(panics)));
    views
        .filter(|_, v| v.ms >= 1_000)
        .map_values(|v| format!("{}:{}", v.user, v.ms))
        .to("long", Utf8, Utf8);
    views
        .group_by(
            |_, v| v.user.clone(),
            lambda_streams::dsl::Grouped::direct(Utf8),
        )
        .count("per-user")
        .to_stream()
        .to("counts", Utf8, DecimalI64);
    builder
        .stream("in", Utf8, Utf8)
        .filter(|_, v| v.contains("page=0"))
        .to("first-pages", Utf8, Utf8);
    builder.build()
}

type Run = (Result<BatchOutcome, String>, Vec<OutputRecord>);

/// Processes `event` on a runtime of its own.
fn process(
    topology: &lambda_streams::Topology,
    event: &KafkaEvent,
    store: &MemoryStore,
    sink: &dyn lambda_streams::sink::Sink,
    options: &BatchOptions,
) -> Result<BatchOutcome, StreamError> {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime")
        .block_on(topology.process_with(event, store, sink, options))
}

/// How the batch reads ahead: on how many threads, and whether the next window is read
/// while the topology takes from this one.
#[derive(Debug, Clone, Copy)]
struct Reading {
    threads: usize,
    overlap: bool,
}

/// One thread: every record read where it stands.
const ONE: Reading = Reading {
    threads: 1,
    overlap: false,
};

/// Each number of threads, with and without the overlap.
fn readings(threads: &[usize]) -> Vec<Reading> {
    threads
        .iter()
        .flat_map(|&threads| [false, true].map(|overlap| Reading { threads, overlap }))
        .collect()
}

fn run(poison: PoisonPolicy, partial: bool, reading: Reading) -> Run {
    run_counting_panics(poison, partial, reading).0
}

/// [`run`], and how many times the value serde panicked.
fn run_counting_panics(poison: PoisonPolicy, partial: bool, reading: Reading) -> (Run, usize) {
    let panics = Arc::new(AtomicUsize::new(0));
    let (topology, event) = (topology(&panics), event());
    let (store, sink) = (MemoryStore::new(), MemorySink::new());
    let options = BatchOptions {
        poison,
        partial_batch_response: partial,
        deserialize_threads: reading.threads,
        overlap_reading: reading.overlap,
        ..BatchOptions::default()
    };
    let outcome = process(&topology, &event, &store, &sink, &options)
        .map(|mut o| {
            o.report.duration = Duration::ZERO;
            o
        })
        .map_err(|e: StreamError| e.to_string());
    ((outcome, sink.records()), panics.load(Ordering::Relaxed))
}

fn values(records: &[OutputRecord], topic: &str) -> Vec<(String, Vec<u8>)> {
    records
        .iter()
        .filter(|r| r.topic == topic)
        .map(|r| {
            let key = String::from_utf8(r.key.clone().unwrap_or_default()).expect("UTF-8");
            (key, r.value.clone().unwrap_or_default())
        })
        .collect()
}

/// Every record of the batch as the reference reads it, in the event's order.
fn read_all() -> Vec<(TopicPartition, i64, Option<Read>)> {
    event()
        .partitions
        .iter()
        .flat_map(|p| {
            p.records
                .iter()
                .map(|r| (p.tp.clone(), r.offset, reference(r)))
        })
        .collect()
}

#[test]
fn skipped_poison_records_and_every_output_as_on_one_thread_and_as_the_reference() {
    let read = read_all();
    let poison = read.iter().filter(|r| r.2.is_none()).count();
    assert!(
        poison > 40,
        "the batch holds poison records of each kind: {poison}"
    );
    let long: Vec<(String, Vec<u8>)> = read
        .iter()
        .filter_map(|r| r.2.clone())
        .filter(|(_, _, ms)| *ms >= 1_000)
        .map(|(key, user, ms)| (key, format!("{user}:{ms}").into_bytes()))
        .collect();
    let mut counts: BTreeMap<String, i64> = BTreeMap::new();
    for (_, user, _) in read.iter().filter_map(|r| r.2.clone()) {
        *counts.entry(user).or_default() += 1;
    }
    let weight: usize = event()
        .partitions
        .iter()
        .flat_map(|p| p.records.iter())
        .map(|r| 64 + r.key().map_or(0, <[u8]>::len) + r.value().map_or(0, <[u8]>::len))
        .sum();
    assert!(weight > 2 << 20, "read in three windows: {weight}");
    let one = run(PoisonPolicy::Skip, false, ONE);
    let before = ON_READ_THREADS.load(Ordering::Relaxed);
    for reading in readings(&[2, 3, 4]) {
        let many = run(PoisonPolicy::Skip, false, reading);
        assert_eq!(many, one, "{reading:?} against one thread");
    }
    assert!(
        ON_READ_THREADS.load(Ordering::Relaxed) > before,
        "the values were read ahead on the read threads"
    );
    let (outcome, records) = one;
    let outcome = outcome.expect("skipped poison records do not fail the batch");
    assert_eq!(outcome.report.poison_records as usize, poison);
    assert_eq!(values(&records, "long"), long);
    let mut last: BTreeMap<String, i64> = BTreeMap::new();
    for (user, count) in values(&records, "counts") {
        let count = DecimalI64.deserialize(Some(&count)).expect("a count");
        last.insert(user, count);
    }
    assert_eq!(last, counts);
}

#[test]
fn dead_letters_and_partial_failures_as_on_one_thread_and_as_the_reference() {
    let read = read_all();
    let dead = PoisonPolicy::DeadLetter {
        topic: "dlq".to_owned(),
    };
    let one = run(dead.clone(), false, ONE);
    for reading in readings(&[2, 4]) {
        assert_eq!(run(dead.clone(), false, reading), one, "{reading:?}");
    }
    let poison = read.iter().filter(|r| r.2.is_none()).count();
    assert_eq!(one.1.iter().filter(|r| r.topic == "dlq").count(), poison);

    // Fail with a partial batch response: each partition stops at its first poison record.
    let one = run(PoisonPolicy::Fail, true, ONE);
    for reading in readings(&[2, 3]) {
        assert_eq!(run(PoisonPolicy::Fail, true, reading), one, "{reading:?}");
    }
    let mut first: Vec<(TopicPartition, i64)> = Vec::new();
    for (tp, offset, read) in &read {
        if read.is_none() && !first.iter().any(|(t, _)| t == tp) {
            first.push((tp.clone(), *offset));
        }
    }
    assert_eq!(one.0.expect("a partial batch response").failures, first);

    // Fail without: the batch fails on the event's first poison record.
    let one = run(PoisonPolicy::Fail, false, ONE);
    for reading in readings(&[2, 4]) {
        assert_eq!(run(PoisonPolicy::Fail, false, reading), one, "{reading:?}");
    }
    let error = one.0.expect_err("the batch fails");
    let (tp, offset) = &first[0];
    assert!(
        error.starts_with(&format!("record {tp} offset {offset}")),
        "{error}"
    );
}

#[test]
fn a_serde_that_panics_on_a_read_thread_runs_once_per_record() {
    let panicking = event()
        .partitions
        .iter()
        .flat_map(|p| p.records.iter())
        // The key is read first: a record whose key is not UTF-8 does not reach its value.
        .filter(|r| r.key().is_some_and(|k| std::str::from_utf8(k).is_ok()))
        .filter(|r| {
            r.value()
                .is_some_and(|v| v.windows(5).any(|w| w == b"PANIC"))
        })
        .count();
    assert!(
        panicking > 10,
        "the batch holds panicking values: {panicking}"
    );
    for reading in [ONE].into_iter().chain(readings(&[2, 4])) {
        let (_, panics) = run_counting_panics(PoisonPolicy::Skip, false, reading);
        assert_eq!(panics, panicking, "{reading:?}: one panic per record");
    }
}

/// Keeps each send apart.
#[derive(Default)]
struct Sends(std::sync::Mutex<Vec<Vec<OutputRecord>>>);

#[async_trait::async_trait]
impl lambda_streams::sink::Sink for Sends {
    async fn send(
        &self,
        records: Vec<OutputRecord>,
    ) -> Result<(), lambda_streams::sink::SinkError> {
        self.0.lock().expect("not poisoned").push(records);
        Ok(())
    }
}

/// Each valid view as eight outputs (`user:ms:i`): ~130,000 outputs, sent in chunks of
/// [`OUTPUT_CHUNK`](lambda_streams::OUTPUT_CHUNK) while the batch goes on, so that the
/// reading ahead stops and starts again around each send, a window read or being read.
fn chunked(reading: Reading) -> (Result<u64, String>, Vec<Vec<OutputRecord>>) {
    let panics = Arc::new(AtomicUsize::new(0));
    let builder = StreamsBuilder::new();
    builder
        .stream("in", Utf8, Panicky(Json::new(), Arc::clone(&panics)))
        .flat_map_values(|v| (0..8).map(move |i| format!("{}:{}:{i}", v.user, v.ms)))
        .to("many", Utf8, Utf8);
    let (topology, event) = (builder.build(), event());
    let (store, sink) = (MemoryStore::new(), Sends::default());
    let options = BatchOptions {
        poison: PoisonPolicy::Skip,
        deserialize_threads: reading.threads,
        overlap_reading: reading.overlap,
        ..BatchOptions::default()
    };
    let outcome = process(&topology, &event, &store, &sink, &options)
        .map(|o| o.report.records_out)
        .map_err(|e| e.to_string());
    (outcome, sink.0.into_inner().expect("not poisoned"))
}

#[test]
fn outputs_sent_in_chunks_while_reading_ahead_as_on_one_thread_and_as_the_reference() {
    let expected: Vec<(String, Vec<u8>)> = read_all()
        .into_iter()
        .filter_map(|r| r.2)
        .flat_map(|(key, user, ms)| {
            (0..8).map(move |i| (key.clone(), format!("{user}:{ms}:{i}").into_bytes()))
        })
        .collect();
    assert!(
        expected.len() > 5 * lambda_streams::OUTPUT_CHUNK,
        "{} outputs",
        expected.len()
    );
    let one = chunked(ONE);
    assert!(one.1.len() > 5, "sent in {} chunks", one.1.len());
    let all: Vec<OutputRecord> = one.1.concat();
    assert_eq!(values(&all, "many"), expected);
    assert_eq!(one.0, Ok(expected.len() as u64));
    for reading in readings(&[2, 3]) {
        assert_eq!(chunked(reading), one, "{reading:?}");
    }
}
