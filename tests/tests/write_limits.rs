//! DynamoDB's limits on the real write path (the dynoxide emulator, which enforces them as
//! DynamoDB does): a key over the 2,048-byte partition key limit, an item over 400 KB and a
//! user fold that panics are poison records of the record that caused them, handled by the
//! poison policy, never a batch that fails on every retry; an item fed by so many source
//! partitions in one batch that its update would pass the 4 KB expression limit is written
//! exactly all the same.
//!
//! Expected values are worked out by hand from DynamoDB's documented limits and Kafka
//! Streams' semantics (a skipped record has no effect on the aggregate it failed in).

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use lambda_streams::event::KafkaEvent;
use lambda_streams::serdes::{DecimalI64, Serde, Utf8};
use lambda_streams::sink::MemorySink;
use lambda_streams::state::Store;
use lambda_streams::state::dynamodb::DynamoStore;
use lambda_streams::{BatchOptions, PoisonPolicy, StreamsBuilder, Topology};
use lambda_streams_e2e::*;

/// An event of topic `in`: `(partition, offset, key, value)` per record.
fn event(records: &[(i32, i64, String, String)]) -> KafkaEvent {
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

fn record(partition: i32, offset: i64, key: &str, value: &str) -> (i32, i64, String, String) {
    (partition, offset, key.to_owned(), value.to_owned())
}

fn skip() -> BatchOptions {
    BatchOptions {
        poison: PoisonPolicy::Skip,
        ..BatchOptions::default()
    }
}

async fn store() -> DynamoStore {
    require_services();
    exactly_once_store("write-limits").await.1
}

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

/// Sums per key; the adder panics on the value "panic".
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
            DecimalI64,
        )
        .to_stream()
        .to("sums-out", Utf8, DecimalI64);
    builder.build()
}

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

async fn count_of(store: &DynamoStore, key: &str) -> Option<i64> {
    store
        .get("c", key.as_bytes())
        .await
        .expect("get")
        .map(|s| s.value)
}

async fn sum_of(store: &DynamoStore, key: &str) -> Option<i64> {
    store
        .get("sums", key.as_bytes())
        .await
        .expect("get")
        .map(|s| {
            DecimalI64
                .deserialize(s.aggregate.as_deref())
                .expect("a number")
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_over_the_partition_key_limit_is_a_poison_record_on_dynamodb() {
    let store = store().await;
    // `c#` + ceil(4 * 1535 / 3) = 2,049 bytes: one over DynamoDB's 2,048.
    let too_long = "x".repeat(1535);
    let fits = "f".repeat(1534);
    let event = event(&[
        record(0, 0, &fits, "v"),
        record(0, 1, &too_long, "v"),
        record(0, 2, "a", "v"),
    ]);
    let outcome = counts()
        .process_with(&event, &store, &MemorySink::new(), &skip())
        .await
        .expect("the batch goes on without the record");
    assert_eq!(outcome.report.poison_records, 1);
    assert_eq!(count_of(&store, "a").await, Some(1));
    assert_eq!(count_of(&store, &fits).await, Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_adder_is_a_poison_record_on_dynamodb() {
    let store = store().await;
    let event = event(&[
        record(0, 0, "k", "1"),
        record(0, 1, "k", "panic"),
        record(0, 2, "k", "3"),
    ]);
    let outcome = sums()
        .process_with(&event, &store, &MemorySink::new(), &skip())
        .await
        .expect("the batch goes on");
    assert_eq!(outcome.report.poison_records, 1);
    assert_eq!(sum_of(&store, "k").await, Some(4));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_record_that_would_take_an_item_past_400_kb_is_a_poison_record_on_dynamodb() {
    let store = store().await;
    let big = "b".repeat(100_000);
    let mut records: Vec<_> = (0..5).map(|o| record(0, o, "k", &big)).collect();
    records.push(record(0, 5, "k", "tail"));
    let event = event(&records);
    let outcome = concat()
        .process_with(&event, &store, &MemorySink::new(), &skip())
        .await
        .expect("the batch goes on");
    assert_eq!(outcome.report.poison_records, 1);
    let state = store.get("concat", b"k").await.expect("get").expect("item");
    assert_eq!(state.aggregate.map(|a| a.len()), Some(400_004));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_count_fed_by_many_partitions_in_one_batch_stays_within_the_expression_limits() {
    let store = store().await;
    // 150 partitions contribute to one item: its conditional update names 150 watermarks
    // (about 45 bytes of condition each, over DynamoDB's 4 KB and 300 operators).
    let records: Vec<_> = (0..150).map(|p| record(p, 3, "hot", "v")).collect();
    let event = event(&records);
    let topology = counts();
    let outcome = topology
        .process_with(&event, &store, &MemorySink::new(), &skip())
        .await
        .expect("the batch is written");
    assert_eq!(outcome.report.poison_records, 0);
    assert_eq!(count_of(&store, "hot").await, Some(150));
    // Redelivered: every partition's watermark holds its record.
    topology
        .process_with(&event, &store, &MemorySink::new(), &skip())
        .await
        .expect("a redelivery");
    assert_eq!(count_of(&store, "hot").await, Some(150));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aggregate_fed_by_many_partitions_in_one_batch_stays_within_the_expression_limits() {
    let store = store().await;
    // 400 watermarks in one update: `#wN = :lN, ` is ~14 bytes each, over 4 KB.
    let records: Vec<_> = (0..400).map(|p| record(p, 0, "hot", "2")).collect();
    let event = event(&records);
    let topology = sums();
    topology
        .process_with(&event, &store, &MemorySink::new(), &skip())
        .await
        .expect("the batch is written");
    assert_eq!(sum_of(&store, "hot").await, Some(800));
    topology
        .process_with(&event, &store, &MemorySink::new(), &skip())
        .await
        .expect("a redelivery");
    assert_eq!(sum_of(&store, "hot").await, Some(800));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_lookup_of_a_key_over_the_limit_finds_nothing_and_the_batch_goes_on() {
    let store = store().await;
    // A table keyed by customer, and orders joined to it; one order's key (3,000 bytes)
    // cannot be a DynamoDB key, so no customer can have it: the left join finds none.
    let builder = StreamsBuilder::new();
    let customers = builder.table("customers", Utf8, Utf8, "customers");
    builder
        .stream("orders", Utf8, Utf8)
        .left_join(&customers, |_, order: String, name: Option<String>| {
            format!("{order}|{}", name.unwrap_or_else(|| "-".to_owned()))
        })
        .to("enriched", Utf8, Utf8);
    let topology = builder.build();
    let long = "x".repeat(3000);
    let json = |topic: &str, offset: i64, key: &str, value: &str| {
        format!(
            r#"{{"topic":"{topic}","partition":0,"offset":{offset},"timestamp":{offset},"timestampType":"CREATE_TIME","key":"{}","value":"{}","headers":[]}}"#,
            STANDARD.encode(key),
            STANDARD.encode(value)
        )
    };
    let customers_event = format!(
        r#"{{"eventSource":"SelfManagedKafka","bootstrapServers":"b:9092","records":{{"customers-0":[{}]}}}}"#,
        json("customers", 0, "c1", "Ada")
    );
    let orders_event = format!(
        r#"{{"eventSource":"SelfManagedKafka","bootstrapServers":"b:9092","records":{{"orders-0":[{},{}]}}}}"#,
        json("orders", 0, "c1", "o1"),
        json("orders", 1, &long, "o2")
    );
    let sink = MemorySink::new();
    for event in [customers_event, orders_event] {
        let event = KafkaEvent::decode(event.as_bytes()).expect("a valid event");
        topology
            .process_with(&event, &store, &sink, &skip())
            .await
            .expect("the batch goes on");
    }
    let enriched: Vec<String> = sink
        .records()
        .into_iter()
        .filter(|r| r.topic == "enriched")
        .map(|r| String::from_utf8(r.value.expect("a value")).expect("UTF-8"))
        .collect();
    assert_eq!(enriched, ["o1|Ada", "o2|-"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_time_poison_records_are_decided_the_same_under_redelivery_on_dynamodb() {
    use lambda_streams::state::fault::FaultyStore;
    let store = store().await;
    // Two partitions; k gets 1, a panic and 3 from in-0 and 10 from in-1; j gets 5 and a
    // panic. The first attempt crashes after one item write, the event source delivers it
    // again, then once more with a later end (in-0@3: 100 more for k).
    let first = event(&[
        record(0, 0, "k", "1"),
        record(0, 1, "k", "panic"),
        record(0, 2, "k", "3"),
        record(1, 0, "j", "5"),
        record(1, 1, "j", "panic"),
        record(1, 2, "k", "10"),
    ]);
    let longer = event(&[
        record(0, 0, "k", "1"),
        record(0, 1, "k", "panic"),
        record(0, 2, "k", "3"),
        record(0, 3, "k", "100"),
        record(1, 0, "j", "5"),
        record(1, 1, "j", "panic"),
        record(1, 2, "k", "10"),
    ]);
    let topology = sums();
    let faulty = FaultyStore::fail_once_after(&store, 1);
    let sink = MemorySink::new();
    assert!(
        topology
            .process_with(&first, &faulty, &sink, &skip())
            .await
            .is_err(),
        "the injected crash"
    );
    let again = topology
        .process_with(&first, &faulty, &sink, &skip())
        .await
        .expect("the redelivery");
    assert_eq!(again.report.poison_records, 2);
    topology
        .process_with(&longer, &faulty, &sink, &skip())
        .await
        .expect("the longer retry");
    // By hand: k = 1 + 3 + 10 + 100, j = 5; each record once, the panics never.
    assert_eq!(sum_of(&store, "k").await, Some(114));
    assert_eq!(sum_of(&store, "j").await, Some(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_split_by_partitions_gives_the_same_state_and_version_in_memory() {
    use lambda_streams::state::memory::MemoryStore;
    let store = store().await;
    let memory = MemoryStore::new();
    // 120 partitions feed "hot" (three updates of at most 50 partitions: version 3), then
    // a redelivery (nothing new), then 10 of them again with later offsets (one update).
    let first: Vec<_> = (0..120).map(|p| record(p, 3, "hot", "2")).collect();
    let later: Vec<_> = (0..10).map(|p| record(p, 4, "hot", "5")).collect();
    let topology = sums();
    for records in [&first, &first, &later] {
        let event = event(records);
        for target in [&store as &dyn Store, &memory as &dyn Store] {
            topology
                .process_with(&event, target, &MemorySink::new(), &skip())
                .await
                .expect("a batch");
        }
    }
    let dynamo = store.get("sums", b"hot").await.expect("get").expect("item");
    let in_memory = memory
        .get("sums", b"hot")
        .await
        .expect("get")
        .expect("item");
    // By hand: 120 * 2 + 10 * 5 = 290, in 3 + 1 writes.
    assert_eq!(
        DecimalI64
            .deserialize(dynamo.aggregate.as_deref())
            .expect("a number"),
        290
    );
    assert_eq!(dynamo.version, 4);
    assert_eq!(in_memory, dynamo);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_record_is_decided_once_per_item_on_dynamodb() {
    let store = store().await;
    let sink = MemorySink::new();
    let options = BatchOptions {
        poison: PoisonPolicy::DeadLetter {
            topic: "dlq".to_owned(),
        },
        ..BatchOptions::default()
    };
    // in-0: 5 and a panic (the last record of its partition in the item), in-1: 20, then
    // in-0's batch delivered again: the panic is not met again, and the sum is 25.
    let first = event(&[record(0, 0, "k", "5"), record(0, 1, "k", "panic")]);
    let other = event(&[record(1, 0, "k", "20")]);
    let topology = sums();
    for batch in [&first, &other, &first] {
        topology
            .process_with(batch, &store, &sink, &options)
            .await
            .expect("a batch");
    }
    assert_eq!(sum_of(&store, "k").await, Some(25));
    let dead = sink
        .records()
        .into_iter()
        .filter(|r| r.topic == "dlq")
        .count();
    assert_eq!(dead, 1);
}
