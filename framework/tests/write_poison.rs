//! Write-time failures are poison records of the record that caused them (issue 12): an
//! error or panic of the user's adder / reducer or of the aggregate's serde while the
//! store folds a batch, a key over DynamoDB's 2,048-byte partition key limit, an item over
//! its 400 KB item limit. Each is named with the record's topic-partition and offset and
//! handled by the poison policy; the batch goes on without the record, and the state stays
//! exact under retries.
//!
//! Expected values are worked out by hand from Kafka Streams' semantics (a skipped record
//! has no effect on the aggregate it failed in) and from DynamoDB's documented limits.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use lambda_streams::event::KafkaEvent;
use lambda_streams::serdes::{DecimalI64, Serde, SerdeError, Utf8};
use lambda_streams::sink::MemorySink;
use lambda_streams::state::fault::FaultyStore;
use lambda_streams::state::memory::MemoryStore;
use lambda_streams::{BatchOptions, PoisonPolicy, StreamError, StreamsBuilder, Topology};

/// The error header of a dead-lettered record.
const ERROR_HEADER: &str = "lambda-streams-error";

/// An event of topic `in`: `(partition, offset, key, value)` per record.
fn event(records: &[(i32, i64, &str, &str)]) -> KafkaEvent {
    let mut partitions: Vec<(i32, Vec<String>)> = Vec::new();
    for (partition, offset, key, value) in records {
        let json = format!(
            r#"{{"topic":"in","partition":{partition},"offset":{offset},"timestamp":{offset},"timestampType":"CREATE_TIME","key":"{}","value":"{}","headers":[]}}"#,
            STANDARD.encode(key),
            STANDARD.encode(value)
        );
        match partitions.iter_mut().find(|(p, _)| p == partition) {
            Some((_, list)) => list.push(json),
            None => partitions.push((*partition, vec![json])),
        }
    }
    let lists: Vec<String> = partitions
        .iter()
        .map(|(p, list)| format!(r#""in-{p}":[{}]"#, list.join(",")))
        .collect();
    let json = format!(
        r#"{{"eventSource":"SelfManagedKafka","bootstrapServers":"b:9092","records":{{{}}}}}"#,
        lists.join(",")
    );
    KafkaEvent::decode(json.as_bytes()).expect("a valid event")
}

/// The records the sink holds for the dead-letter topic `dlq`.
fn dead_letters(sink: &MemorySink) -> Vec<lambda_streams::sink::OutputRecord> {
    sink.records()
        .into_iter()
        .filter(|r| r.topic == "dlq")
        .collect()
}

fn options(poison: PoisonPolicy) -> BatchOptions {
    BatchOptions {
        poison,
        ..BatchOptions::default()
    }
}

fn dead_letter() -> PoisonPolicy {
    PoisonPolicy::DeadLetter {
        topic: "dlq".to_owned(),
    }
}

/// An `i64` serde that cannot encode a negative number (a user serde that fails).
struct NonNegative;

impl Serde<i64> for NonNegative {
    fn serialize(&self, value: &i64) -> Option<Vec<u8>> {
        DecimalI64.serialize(value)
    }
    fn try_serialize(&self, value: &i64) -> Result<Option<Vec<u8>>, SerdeError> {
        if *value < 0 {
            return Err(SerdeError(format!("{value} is negative")));
        }
        Ok(self.serialize(value))
    }
    fn deserialize(&self, data: Option<&[u8]>) -> Result<i64, SerdeError> {
        DecimalI64.deserialize(data)
    }
}

/// Sums the values per key in `sums` (the adder panics on the value "panic"), with the
/// aggregate encoded by `NonNegative`; the sums go to `sums-out`.
fn sums() -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream("in", Utf8, Utf8)
        .group_by_key(Utf8)
        .aggregate(
            "sums",
            || 0i64,
            |_, value: String, sum: i64| {
                assert!(value != "panic", "the adder panics on this record");
                sum + value.parse::<i64>().unwrap_or(0)
            },
            NonNegative,
        )
        .to_stream()
        .to("sums-out", Utf8, DecimalI64);
    builder.build()
}

/// The stored sum of `key`.
fn sum_of(store: &MemoryStore, key: &str) -> Option<(i64, u64)> {
    store
        .states("sums")
        .into_iter()
        .find(|(k, _)| k == key.as_bytes())
        .map(|(_, state)| {
            let bytes = state.aggregate.expect("an aggregate");
            let sum = DecimalI64.deserialize(Some(&bytes)).expect("a number");
            (sum, state.version)
        })
}

#[tokio::test]
async fn a_panicking_adder_at_write_time_is_a_poison_record_and_the_batch_goes_on() {
    let topology = sums();
    let (store, sink) = (MemoryStore::new(), MemorySink::new());
    let event = event(&[(0, 0, "k", "1"), (0, 1, "k", "panic"), (0, 2, "k", "3")]);
    let outcome = topology
        .process_with(&event, &store, &sink, &options(PoisonPolicy::Skip))
        .await
        .expect("the batch goes on without the poison record");
    // Kafka Streams' CONTINUE: the record is skipped, 1 + 3 = 4.
    assert_eq!(outcome.report.poison_records, 1);
    assert_eq!(sum_of(&store, "k"), Some((4, 1)));
}

#[tokio::test]
async fn a_write_time_poison_record_is_dead_lettered_with_its_coordinates() {
    let topology = sums();
    let (store, sink) = (MemoryStore::new(), MemorySink::new());
    let event = event(&[(0, 0, "k", "1"), (0, 1, "k", "panic"), (0, 2, "j", "5")]);
    let outcome = topology
        .process_with(&event, &store, &sink, &options(dead_letter()))
        .await
        .expect("the batch goes on");
    assert_eq!(
        (outcome.report.poison_records, outcome.report.dead_lettered),
        (1, 1)
    );
    let dead = dead_letters(&sink);
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].value.as_deref(), Some(&b"panic"[..]));
    assert_eq!(
        dead[0].header("lambda-streams-source"),
        Some(&b"in:0:1"[..])
    );
    let error = String::from_utf8_lossy(dead[0].header(ERROR_HEADER).expect("error header"));
    assert!(error.contains("panic"), "{error}");
    assert_eq!(sum_of(&store, "k"), Some((1, 1)));
    assert_eq!(sum_of(&store, "j"), Some((5, 1)));
}

#[tokio::test]
async fn with_fail_a_write_time_poison_record_fails_the_batch_naming_it() {
    let topology = sums();
    let (store, sink) = (MemoryStore::new(), MemorySink::new());
    let event = event(&[(0, 0, "k", "1"), (0, 1, "k", "panic")]);
    let error = topology
        .process_with(&event, &store, &sink, &options(PoisonPolicy::Fail))
        .await
        .expect_err("fail stops the partition at the record");
    let text = error.to_string();
    assert!(
        text.contains("in-0") && text.contains("offset 1"),
        "the error names the record: {text}"
    );
    // Nothing of the failed item was written.
    assert_eq!(sum_of(&store, "k"), None);
}

#[tokio::test]
async fn an_aggregate_serde_error_at_write_time_blames_the_record_that_caused_it() {
    let topology = sums();
    let (store, sink) = (MemoryStore::new(), MemorySink::new());
    // 5, then -10 makes the sum -5, which NonNegative cannot encode: offset 1 is to
    // blame; without it 5 + 2 = 7.
    let event = event(&[(0, 0, "k", "5"), (0, 1, "k", "-10"), (0, 2, "k", "2")]);
    let outcome = topology
        .process_with(&event, &store, &sink, &options(PoisonPolicy::Skip))
        .await
        .expect("the batch goes on");
    assert_eq!(outcome.report.poison_records, 1);
    assert_eq!(sum_of(&store, "k"), Some((7, 1)));
}

#[tokio::test]
async fn a_panicking_reducer_at_write_time_is_a_poison_record() {
    let builder = StreamsBuilder::new();
    builder
        .stream("in", Utf8, Utf8)
        .group_by_key(Utf8)
        .reduce(
            "longest",
            |a: String, b: String| {
                assert!(b != "boom", "the reducer panics");
                if b.len() > a.len() { b } else { a }
            },
            Utf8,
        )
        .to_stream()
        .to("longest-out", Utf8, Utf8);
    let topology = builder.build();
    let (store, sink) = (MemoryStore::new(), MemorySink::new());
    let event = event(&[(0, 0, "k", "ab"), (0, 1, "k", "boom"), (0, 2, "k", "abc")]);
    let outcome = topology
        .process_with(&event, &store, &sink, &options(PoisonPolicy::Skip))
        .await
        .expect("the batch goes on");
    assert_eq!(outcome.report.poison_records, 1);
    let out: Vec<_> = sink
        .records()
        .into_iter()
        .filter(|r| r.topic == "longest-out")
        .map(|r| String::from_utf8(r.value.expect("a value")).expect("UTF-8"))
        .collect();
    assert_eq!(out, ["abc"]);
}

#[tokio::test]
async fn a_retried_batch_makes_the_same_decision_and_the_state_stays_exact() {
    let topology = sums();
    let memory = MemoryStore::new();
    let sink = MemorySink::new();
    let event = event(&[
        (0, 0, "k", "1"),
        (0, 1, "k", "panic"),
        (0, 2, "k", "3"),
        (1, 0, "j", "5"),
        (1, 1, "i", "7"),
    ]);
    // The first attempt crashes after one item write; the event source delivers the batch
    // again, twice.
    let faulty = FaultyStore::fail_once_after(&memory, 1);
    assert!(
        topology
            .process_with(&event, &faulty, &sink, &options(PoisonPolicy::Skip))
            .await
            .is_err()
    );
    for _ in 0..2 {
        topology
            .process_with(&event, &faulty, &sink, &options(PoisonPolicy::Skip))
            .await
            .expect("a retry succeeds");
    }
    assert_eq!(sum_of(&memory, "k").map(|s| s.0), Some(4));
    assert_eq!(sum_of(&memory, "j"), Some((5, 1)));
    assert_eq!(sum_of(&memory, "i"), Some((7, 1)));
}

/// Counts the records per key in `counts`.
fn counts() -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream("in", Utf8, Utf8)
        .group_by_key(Utf8)
        .count("c")
        .to_stream()
        .to("counts-out", Utf8, DecimalI64);
    builder.build()
}

#[tokio::test]
async fn a_key_over_dynamodbs_partition_key_limit_is_a_poison_record_in_memory_too() {
    // The partition key is `c#<key as unpadded base64url>`: 2 + ceil(4n / 3) bytes, at
    // most 2,048 (DynamoDB's limit): a key of 1,534 bytes fits (2,048), 1,535 does not.
    let fits = "f".repeat(1534);
    let too_long = "x".repeat(1535);
    let topology = counts();
    let (store, sink) = (MemoryStore::new(), MemorySink::new());
    let event = event(&[(0, 0, &fits, "v"), (0, 1, &too_long, "v"), (0, 2, "a", "v")]);
    let outcome = topology
        .process_with(&event, &store, &sink, &options(PoisonPolicy::Skip))
        .await
        .expect("the batch goes on");
    assert_eq!(outcome.report.poison_records, 1);
    let keys: Vec<Vec<u8>> = store.items("c").into_iter().map(|(k, ..)| k).collect();
    assert_eq!(keys, [b"a".to_vec(), fits.into_bytes()]);
}

#[tokio::test]
async fn with_fail_a_key_over_the_limit_fails_the_batch_naming_the_record() {
    let too_long = "x".repeat(3000);
    let topology = counts();
    let (store, sink) = (MemoryStore::new(), MemorySink::new());
    let event = event(&[(0, 0, "a", "v"), (0, 7, &too_long, "v")]);
    let error = topology
        .process_with(&event, &store, &sink, &options(PoisonPolicy::Fail))
        .await
        .expect_err("the key breaks DynamoDB's limit");
    let text = error.to_string();
    assert!(
        text.contains("in-0") && text.contains("offset 7") && text.contains("2048"),
        "{text}"
    );
    assert!(matches!(error, StreamError::User { .. }), "{error:?}");
}

/// Concatenates the values per key in `concat`.
fn concat() -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream("in", Utf8, Utf8)
        .group_by_key(Utf8)
        .aggregate(
            "concat",
            String::new,
            |_, value: String, mut all: String| {
                all.push_str(&value);
                all
            },
            Utf8,
        )
        .to_stream()
        .to("concat-out", Utf8, Utf8);
    builder.build()
}

#[tokio::test]
async fn the_record_that_would_take_an_item_past_400_kb_is_a_poison_record() {
    // Four values of 100,000 bytes fit in an item (409,600 bytes, with ~100 bytes of keys
    // and numbers); the fifth does not, and is blamed; the small sixth fits again.
    let big = "b".repeat(100_000);
    let topology = concat();
    let (store, sink) = (MemoryStore::new(), MemorySink::new());
    let mut records: Vec<(i32, i64, &str, &str)> = (0..5)
        .map(|offset| (0, offset, "k", big.as_str()))
        .collect();
    records.push((0, 5, "k", "tail"));
    let event = event(&records);
    let outcome = topology
        .process_with(&event, &store, &sink, &options(dead_letter()))
        .await
        .expect("the batch goes on");
    assert_eq!(outcome.report.poison_records, 1);
    let dead = dead_letters(&sink);
    assert_eq!(dead.len(), 1);
    assert_eq!(
        dead[0].header("lambda-streams-source"),
        Some(&b"in:0:4"[..])
    );
    let (_, state) = store.states("concat").pop().expect("the item");
    assert_eq!(state.aggregate.map(|a| a.len()), Some(400_004));
    // Redelivered: nothing changes, and nothing is blamed again.
    let again = topology
        .process_with(&event, &store, &sink, &options(dead_letter()))
        .await
        .expect("a redelivery");
    assert_eq!(again.report.poison_records, 0);
    assert_eq!(
        store.states("concat").pop().map(|(_, s)| s.version),
        Some(1)
    );
}

#[tokio::test]
async fn a_write_time_poison_record_after_a_repartition_hop_is_the_hop_record_and_siblings_apply_once()
 {
    use lambda_streams::dsl::Grouped;
    use lambda_streams::event::TopicPartition;
    use lambda_streams::event::{EventSource, Header, PartitionRecords, Record, TimestampType};

    // Values re-keyed by their first letter through the repartition topic "by-letter", then
    // summed by their length; the adder panics on "panic".
    let builder = StreamsBuilder::new();
    builder
        .stream("in", Utf8, Utf8)
        .group_by(
            |_, v: &String| v[..1].to_owned(),
            Grouped::with(Utf8, Utf8).with_topic("by-letter"),
        )
        .aggregate(
            "lengths",
            || 0i64,
            |_, value: String, sum: i64| {
                assert!(value != "panic", "the adder panics on this record");
                sum + i64::try_from(value.len()).unwrap_or(0)
            },
            DecimalI64,
        )
        .to_stream()
        .to("lengths-out", Utf8, DecimalI64);
    let topology = builder.build();
    let (store, sink) = (MemoryStore::new(), MemorySink::new());
    // The source batch: only produces to the repartition topic.
    let source = event(&[
        (0, 0, "a", "pear"),
        (0, 1, "b", "panic"),
        (0, 2, "c", "plum"),
    ]);
    topology
        .process_with(&source, &store, &sink, &options(dead_letter()))
        .await
        .expect("the source batch");
    // The repartition topic as the event source delivers it (one partition here).
    let hop: Vec<Record> = sink
        .records()
        .into_iter()
        .filter(|r| r.topic == "by-letter")
        .enumerate()
        .map(|(offset, r)| Record {
            offset: i64::try_from(offset).unwrap_or(0) + 10,
            timestamp: r.timestamp.unwrap_or_default(),
            timestamp_type: TimestampType::CreateTime,
            key: r.key.clone().map(Into::into),
            value: r.value.clone().map(Into::into),
            headers: r
                .headers
                .iter()
                .map(|(name, value)| Header::new(name.as_str(), value.clone()))
                .collect(),
            key_schema_metadata: None,
            value_schema_metadata: None,
        })
        .collect();
    assert_eq!(hop.len(), 3);
    let hop_event = KafkaEvent {
        source: EventSource::SelfManaged,
        bootstrap_servers: "b:9092".to_owned(),
        partitions: vec![PartitionRecords {
            tp: TopicPartition::new("by-letter", 0),
            records: hop,
        }],
    };
    // Delivered, then delivered again (a redelivery).
    let first = topology
        .process_with(&hop_event, &store, &sink, &options(dead_letter()))
        .await
        .expect("the hop batch goes on");
    assert_eq!(
        (first.report.poison_records, first.report.dead_lettered),
        (1, 1)
    );
    topology
        .process_with(&hop_event, &store, &sink, &options(dead_letter()))
        .await
        .expect("a redelivery");
    let dead = dead_letters(&sink);
    // The hop record at by-letter-0@11 is the one dead-lettered (the batch holds it, not
    // in-0@1), unchanged (its own source header, in:0:1, first) with its coordinates in the
    // last source header (what Kafka's `Headers::lastHeader` reads); named so in its error.
    // Once: on the redelivery the item's watermark is past it ("plum" came after it).
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].value.as_deref(), Some(&b"panic"[..]));
    let sources: Vec<&[u8]> = dead[0]
        .headers
        .iter()
        .filter(|(name, _)| name == "lambda-streams-source")
        .map(|(_, value)| value.as_slice())
        .collect();
    assert_eq!(sources, [&b"in:0:1"[..], &b"by-letter:0:11"[..]]);
    let error = String::from_utf8_lossy(dead[0].header(ERROR_HEADER).expect("error header"));
    assert!(
        error.contains("by-letter-0") && error.contains("offset 11"),
        "{error}"
    );
    // "pear" and "plum" under "p": 4 + 4, once, whatever the redelivery.
    let (_, state) = store
        .states("lengths")
        .into_iter()
        .find(|(k, _)| k == b"p")
        .expect("the item of p");
    let sum = DecimalI64
        .deserialize(state.aggregate.as_deref())
        .expect("a number");
    assert_eq!((sum, state.version), (8, 1));
}

#[tokio::test]
async fn a_hot_keys_stream_join_buffer_past_400_kb_blames_the_record_that_overflows_it() {
    use lambda_streams::dsl::JoinWindows;
    use std::time::Duration;

    let builder = StreamsBuilder::new();
    let left = builder.stream("in", Utf8, Utf8);
    let right = builder.stream("right", Utf8, Utf8);
    left.join_stream(
        &right,
        JoinWindows::of(Duration::from_secs(3600)),
        "pairs",
        (Utf8, Utf8, Utf8),
        |_, l: &String, r: &String| format!("{}+{r}", l.len()),
    )
    .to("joined", Utf8, Utf8);
    let topology = builder.build();
    let (store, sink) = (MemoryStore::new(), MemorySink::new());
    // The join's item holds each value's bytes in base64: 55,000 bytes take 73,336 in it,
    // so five fit in one item (366,680 bytes and a little bookkeeping per record), a sixth
    // and a seventh do not.
    let big = "v".repeat(55_000);
    let records: Vec<(i32, i64, &str, &str)> = (0..7)
        .map(|offset| (0, offset, "hot", big.as_str()))
        .collect();
    let outcome = topology
        .process_with(&event(&records), &store, &sink, &options(dead_letter()))
        .await
        .expect("the batch goes on: no partition stuck on the hot key");
    assert_eq!(
        (outcome.report.poison_records, outcome.report.dead_lettered),
        (2, 2)
    );
    let dead = dead_letters(&sink);
    let sources: Vec<_> = dead
        .iter()
        .map(|r| r.header("lambda-streams-source").map(<[u8]>::to_vec))
        .collect();
    assert_eq!(
        sources,
        [Some(b"in:0:5".to_vec()), Some(b"in:0:6".to_vec())]
    );
    let error = String::from_utf8_lossy(dead[0].header(ERROR_HEADER).expect("error header"));
    assert!(
        error.contains("pairs") && error.contains("400 KB") && error.contains("in-0"),
        "{error}"
    );
}

#[tokio::test]
async fn a_rejected_record_is_decided_once_even_when_the_item_changes_before_its_redelivery() {
    let topology = sums();
    let (store, sink) = (MemoryStore::new(), MemorySink::new());
    // in-0: 5, then -10 (the sum -5 does not encode: poison). Then in-1 adds 20 (25).
    // Then the event source delivers in-0's batch again (a rebalance): -10 would now fit
    // (15), but it was decided, and dead-lettered, already. Kafka Streams' answer: 25.
    let first = event(&[(0, 0, "k", "5"), (0, 1, "k", "-10")]);
    let other = event(&[(1, 0, "k", "20")]);
    for batch in [&first, &other, &first] {
        topology
            .process_with(batch, &store, &sink, &options(dead_letter()))
            .await
            .expect("a batch");
    }
    assert_eq!(sum_of(&store, "k").map(|s| s.0), Some(25));
    let dead = dead_letters(&sink).len();
    assert_eq!(dead, 1, "dead-lettered once, never applied");
}

#[test]
fn the_test_driver_refuses_a_key_dynamodb_would_refuse() {
    use lambda_streams::driver::TestDriver;
    let driver = TestDriver::new(counts());
    let mut input = driver.input_topic("in", Utf8, Utf8);
    input
        .pipe_input("fits", "v".to_owned())
        .expect("a short key");
    let error = input
        .pipe_input("x".repeat(1535), "v".to_owned())
        .expect_err("a key DynamoDB refuses, refused in memory too");
    let text = error.to_string();
    assert!(
        text.contains("in-0") && text.contains("offset 1") && text.contains("2048"),
        "{text}"
    );
}

/// An event of `(topic, key, value, timestamp)` records, each topic on partition 0 from
/// offset 0.
fn two_topics(records: &[(&str, &str, &str, i64)]) -> KafkaEvent {
    let mut topics: Vec<(&str, Vec<String>)> = Vec::new();
    for (topic, key, value, ts) in records {
        let list = match topics.iter_mut().find(|(t, _)| t == topic) {
            Some((_, list)) => list,
            None => {
                topics.push((topic, Vec::new()));
                &mut topics.last_mut().expect("pushed").1
            }
        };
        list.push(format!(
            r#"{{"topic":"{topic}","partition":0,"offset":{},"timestamp":{ts},"timestampType":"CREATE_TIME","key":"{}","value":"{}","headers":[]}}"#,
            list.len(),
            STANDARD.encode(key),
            STANDARD.encode(value)
        ));
    }
    let lists: Vec<String> = topics
        .iter()
        .map(|(t, list)| format!(r#""{t}-0":[{}]"#, list.join(",")))
        .collect();
    let json = format!(
        r#"{{"eventSource":"SelfManagedKafka","bootstrapServers":"b:9092","records":{{{}}}}}"#,
        lists.join(",")
    );
    KafkaEvent::decode(json.as_bytes()).expect("a valid event")
}

/// `in` left-joined with `other` within 10 ms (no grace) to `joined`; the joiner panics
/// on a record of `in` with the value "boom" that joined nothing.
fn left_join_panicking_alone() -> Topology {
    use lambda_streams::dsl::JoinWindows;
    let builder = StreamsBuilder::new();
    let other = builder.stream("other", Utf8, Utf8);
    builder
        .stream("in", Utf8, Utf8)
        .left_join_stream(
            &other,
            JoinWindows::of(std::time::Duration::from_millis(10)),
            "join",
            (Utf8, Utf8, Utf8),
            |_, l: &String, r: Option<&String>| {
                assert!(
                    !(l == "boom" && r.is_none()),
                    "the joiner panics on boom alone"
                );
                format!("{l}+{}", r.map_or("-", |v| v))
            },
        )
        .to("joined", Utf8, Utf8);
    builder.build()
}

/// a@0 = boom and b@1 = ok join nothing; z@100 on both topics moves the join's closing
/// time to 100, past 0 + 10 and 1 + 10: the closing pass emits a and b alone.
fn closing_event() -> KafkaEvent {
    two_topics(&[
        ("in", "a", "boom", 0),
        ("in", "b", "ok", 1),
        ("in", "z", "x", 100),
        ("other", "z", "y", 100),
    ])
}

fn joined(sink: &MemorySink) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = sink
        .records()
        .into_iter()
        .filter(|r| r.topic == "joined")
        .map(|r| {
            let text =
                |b: Option<&[u8]>| String::from_utf8_lossy(b.unwrap_or_default()).into_owned();
            (text(r.key.as_deref()), text(r.value.as_deref()))
        })
        .collect();
    out.sort();
    out
}

#[tokio::test]
async fn a_joiner_panicking_in_a_joins_closing_pass_is_a_poison_record_of_that_record() {
    let topology = left_join_panicking_alone();
    let (store, sink) = (MemoryStore::new(), MemorySink::new());
    let outcome = topology
        .process_with(
            &closing_event(),
            &store,
            &sink,
            &options(PoisonPolicy::Skip),
        )
        .await
        .expect("the closing pass goes on without the poison record");
    assert_eq!(outcome.report.poison_records, 1);
    // Kafka Streams' left join: z's pair, b alone; a is skipped.
    let expected = vec![
        ("b".to_owned(), "ok+-".to_owned()),
        ("z".to_owned(), "x+y".to_owned()),
    ];
    assert_eq!(joined(&sink), expected);
    // A redelivery decides nothing again: a left the item with the pass.
    let again = topology
        .process_with(
            &closing_event(),
            &store,
            &sink,
            &options(PoisonPolicy::Skip),
        )
        .await
        .expect("the redelivery succeeds");
    assert_eq!(again.report.poison_records, 0);
}

#[tokio::test]
async fn a_record_the_closing_pass_cannot_emit_is_dead_lettered_or_fails_the_batch_naming_it() {
    let topology = left_join_panicking_alone();
    let (store, sink) = (MemoryStore::new(), MemorySink::new());
    let outcome = topology
        .process_with(&closing_event(), &store, &sink, &options(dead_letter()))
        .await
        .expect("the batch goes on");
    assert_eq!(
        (outcome.report.poison_records, outcome.report.dead_lettered),
        (1, 1)
    );
    let dead = dead_letters(&sink);
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].key.as_deref(), Some(&b"a"[..]));
    assert_eq!(dead[0].value.as_deref(), Some(&b"boom"[..]));
    assert_eq!(
        dead[0].header("lambda-streams-source"),
        Some(&b"in:0:0"[..])
    );
    let error = String::from_utf8_lossy(dead[0].header(ERROR_HEADER).expect("error header"));
    assert!(error.contains("boom alone"), "{error}");
    assert_eq!(joined(&sink).len(), 2, "b alone and z's pair");

    let (store, sink) = (MemoryStore::new(), MemorySink::new());
    let error = topology
        .process_with(
            &closing_event(),
            &store,
            &sink,
            &options(PoisonPolicy::Fail),
        )
        .await
        .expect_err("fail stops at the record");
    let text = error.to_string();
    assert!(
        text.contains("in-0") && text.contains("offset 0"),
        "the error names the record: {text}"
    );
}

/// Session counts (gap 5) emitting on close, through a `map` that panics on key `boom`.
fn final_sessions_panicking_on_boom() -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream("in", Utf8, Utf8)
        .group_by_key(Utf8)
        .windowed_by_session(lambda_streams::dsl::SessionWindows::with_inactivity_gap(
            std::time::Duration::from_millis(5),
        ))
        .emit_strategy(lambda_streams::dsl::EmitStrategy::OnWindowClose)
        .count("sessions")
        .to_stream()
        .map(|w, n| {
            assert!(w.key != "boom", "the map panics on boom's final session");
            (w.key, n)
        })
        .to("final", Utf8, DecimalI64);
    builder.build()
}

/// An operator failing on a session's final result in the closing pass is a poison record
/// of the record that last changed the session (boom@0, `in-0` offset 0), not of every batch:
/// `skip` goes on (ok's session is emitted, boom's leaves the item, a redelivery decides
/// nothing again), `dead-letter` produces it, `fail` fails the batch naming it.
#[tokio::test]
async fn an_operator_failing_on_a_final_session_is_a_poison_record_of_its_last_record() {
    let topology = final_sessions_panicking_on_boom();
    // At stream time 100 both sessions have closed (0 + 5 < 100, 1 + 5 < 100).
    let batch = event(&[(0, 0, "boom", "x"), (0, 1, "ok", "x"), (0, 100, "z", "x")]);
    let (store, sink) = (MemoryStore::new(), MemorySink::new());
    let outcome = topology
        .process_with(&batch, &store, &sink, &options(PoisonPolicy::Skip))
        .await
        .expect("the closing pass goes on without the poison record");
    assert_eq!(outcome.report.poison_records, 1);
    let finals: Vec<Vec<u8>> = sink
        .records()
        .into_iter()
        .filter(|r| r.topic == "final")
        .filter_map(|r| r.key)
        .collect();
    assert_eq!(finals, [b"ok".to_vec()]);
    let again = topology
        .process_with(&batch, &store, &sink, &options(PoisonPolicy::Skip))
        .await
        .expect("the redelivery succeeds");
    assert_eq!(again.report.poison_records, 0);

    let (store, sink) = (MemoryStore::new(), MemorySink::new());
    let outcome = topology
        .process_with(&batch, &store, &sink, &options(dead_letter()))
        .await
        .expect("the batch goes on");
    assert_eq!(outcome.report.dead_lettered, 1);
    let dead = dead_letters(&sink);
    assert_eq!(dead[0].key.as_deref(), Some(&b"boom"[..]));
    assert_eq!(
        dead[0].header("lambda-streams-source"),
        Some(&b"in:0:0"[..])
    );

    let (store, sink) = (MemoryStore::new(), MemorySink::new());
    let error = topology
        .process_with(&batch, &store, &sink, &options(PoisonPolicy::Fail))
        .await
        .expect_err("fail stops at the record");
    let text = error.to_string();
    assert!(
        text.contains("in-0") && text.contains("offset 0") && text.contains("boom"),
        "the error names the record: {text}"
    );
}
