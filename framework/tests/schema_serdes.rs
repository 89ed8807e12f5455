//! Schema'd records through a topology: Avro values in the Confluent wire format and in
//! the event source's SOURCE format (the id in `valueSchemaMetadata`), decoded, resolved
//! from the writer's schema to the reader's, aggregated per key and minute, written as
//! Avro; undecodable records are poison records naming the record, the schema id and the
//! subject; a registry that cannot be reached fails the batch instead.
//!
//! The input bytes are encoded by hand in this file (Avro's binary encoding: zig-zag
//! varints, length-prefixed strings), not with the serde under test, and the expected totals
//! are summed by hand.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use lambda_streams::dsl::TimeWindows;
use lambda_streams::event::{
    EventSource, KafkaEvent, PartitionRecords, Record, SchemaMetadata, TimestampType,
    TopicPartition,
};
use lambda_streams::serdes::schema::registry::RegistryClient;
use lambda_streams::serdes::schema::{
    Avro, OfflineSchemas, SchemaId, SchemaSource, SchemaType, Side, Subject, WireFormat,
};
use lambda_streams::serdes::{Serde, Utf8};
use lambda_streams::sink::MemorySink;
use lambda_streams::state::memory::MemoryStore;
use lambda_streams::{BatchOptions, PoisonPolicy, StreamError, StreamsBuilder, Topology};
use serde::{Deserialize, Serialize};

const ORDER_V1: &str = r#"{"type":"record","name":"Order","namespace":"shop","fields":[
    {"name":"item","type":"string"},{"name":"qty","type":"long"}]}"#;
/// V1 plus a field with a default; the reader below reads V2.
const ORDER_V2: &str = r#"{"type":"record","name":"Order","namespace":"shop","fields":[
    {"name":"item","type":"string"},{"name":"qty","type":"long"},
    {"name":"coupon","type":["null","string"],"default":null}]}"#;
const TOTAL: &str = r#"{"type":"record","name":"Total","namespace":"shop","fields":[
    {"name":"item","type":"string"},{"name":"window_start","type":"long"},
    {"name":"qty","type":"long"}]}"#;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Order {
    item: String,
    qty: i64,
    coupon: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Total {
    item: String,
    window_start: i64,
    qty: i64,
}

const MINUTE: i64 = 60_000;

fn schemas() -> Arc<dyn SchemaSource> {
    Arc::new(
        OfflineSchemas::new()
            .with(
                SchemaId::Confluent(11),
                Subject::topic("orders", Side::Value),
                SchemaType::Avro,
                ORDER_V1,
            )
            .with(
                SchemaId::Confluent(12),
                Subject::topic("orders", Side::Value),
                SchemaType::Avro,
                ORDER_V2,
            )
            .with(
                SchemaId::Confluent(21),
                Subject::topic("totals", Side::Value),
                SchemaType::Avro,
                TOTAL,
            ),
    )
}

fn topology(source: Arc<dyn SchemaSource>, input: WireFormat) -> Topology {
    let orders = Avro::<Order>::new(
        ORDER_V2,
        source.clone(),
        Subject::topic("orders", Side::Value),
    )
    .unwrap()
    .input(input);
    let totals = Avro::<Total>::new(TOTAL, source, Subject::topic("totals", Side::Value)).unwrap();
    let builder = StreamsBuilder::new();
    builder
        .stream("orders", Utf8, orders)
        .group_by_key(Utf8)
        .windowed_by(TimeWindows::of_size(Duration::from_secs(60)))
        .aggregate(
            "qty-per-minute",
            || 0i64,
            |_, o: Order, sum| sum + o.qty,
            lambda_streams::serdes::BigEndianI64,
        )
        .to_stream()
        .map(|w, qty| {
            (
                w.key.clone(),
                Total {
                    item: w.key.clone(),
                    window_start: w.start,
                    qty,
                },
            )
        })
        .to("totals", Utf8, totals);
    builder.build()
}

fn zigzag(v: i64, out: &mut Vec<u8>) {
    let mut u = ((v << 1) ^ (v >> 63)) as u64;
    while u >= 0x80 {
        out.push((u as u8) | 0x80);
        u >>= 7;
    }
    out.push(u as u8);
}

fn string(s: &str, out: &mut Vec<u8>) {
    zigzag(s.len() as i64, out);
    out.extend_from_slice(s.as_bytes());
}

/// An order in Avro's binary encoding: v1 (item, qty) or v2 (item, qty, coupon union).
fn order_bytes(item: &str, qty: i64, coupon: Option<Option<&str>>) -> Vec<u8> {
    let mut out = Vec::new();
    string(item, &mut out);
    zigzag(qty, &mut out);
    match coupon {
        None => {}                 // v1: no coupon field
        Some(None) => out.push(0), // union branch 0: null
        Some(Some(c)) => {
            out.push(2); // union branch 1
            string(c, &mut out);
        }
    }
    out
}

fn confluent(id: u32, payload: Vec<u8>) -> Vec<u8> {
    let mut out = vec![0];
    out.extend_from_slice(&id.to_be_bytes());
    out.extend(payload);
    out
}

fn record(offset: i64, ts: i64, key: &str, value: Vec<u8>, id: Option<&str>) -> Record {
    Record {
        offset,
        timestamp: ts,
        timestamp_type: TimestampType::CreateTime,
        key: Some(key.as_bytes().to_vec().into()),
        value: Some(value.into()),
        headers: Vec::new(),
        key_schema_metadata: None,
        value_schema_metadata: id.map(|id| SchemaMetadata {
            data_format: Some("AVRO".into()),
            schema_id: Some(id.into()),
        }),
    }
}

fn event(records: Vec<Record>) -> KafkaEvent {
    KafkaEvent {
        source: EventSource::SelfManaged,
        bootstrap_servers: "127.0.0.1:9092".into(),
        partitions: vec![PartitionRecords {
            tp: TopicPartition::new("orders", 0),
            records,
        }],
    }
}

/// The last total per (item, window start) among the produced `totals` records.
fn totals(sink: &MemorySink) -> BTreeMap<(String, i64), i64> {
    let serde =
        Avro::<Total>::new(TOTAL, schemas(), Subject::topic("totals", Side::Value)).unwrap();
    let mut out = BTreeMap::new();
    for r in sink.records().into_iter().filter(|r| r.topic == "totals") {
        let bytes = r.value.clone().unwrap();
        // The Confluent header with the registered id of the Total schema.
        assert_eq!(&bytes[..5], &[0, 0, 0, 0, 21]);
        let t = serde.deserialize(Some(&bytes)).unwrap();
        out.insert((t.item, t.window_start), t.qty);
    }
    out
}

#[tokio::test]
async fn avro_orders_are_resolved_aggregated_and_written_as_avro() {
    let store = MemoryStore::new();
    let sink = MemorySink::new();
    let options = BatchOptions {
        poison: PoisonPolicy::DeadLetter {
            topic: "orders-dlq".into(),
        },
        ..BatchOptions::default()
    };
    let records = vec![
        // Writer v1 (id 11): no coupon field, the reader's default null applies.
        record(
            0,
            1_000,
            "tea",
            confluent(11, order_bytes("tea", 2, None)),
            None,
        ),
        // Writer v2 (id 12).
        record(
            1,
            2_000,
            "tea",
            confluent(12, order_bytes("tea", 3, Some(Some("x")))),
            None,
        ),
        record(
            2,
            3_000,
            "jam",
            confluent(12, order_bytes("jam", 5, Some(None))),
            None,
        ),
        // Unknown schema id 99: a poison record.
        record(
            3,
            4_000,
            "tea",
            confluent(99, order_bytes("tea", 100, None)),
            None,
        ),
        // Not the wire format at all (JSON text): a poison record.
        record(4, 5_000, "tea", br#"{"item":"tea"}"#.to_vec(), None),
        // Next minute.
        record(
            5,
            MINUTE + 1,
            "tea",
            confluent(11, order_bytes("tea", 7, None)),
            None,
        ),
    ];
    let topology = topology(schemas(), WireFormat::Confluent);
    let outcome = topology
        .process_with(&event(records), &store, &sink, &options)
        .await
        .unwrap();
    assert_eq!(outcome.report.poison_records, 2);
    // By hand: tea [0, 60 s) 2 + 3 = 5; jam 5; tea [60 s, 120 s) 7.
    let expected = BTreeMap::from([
        (("jam".to_owned(), 0), 5),
        (("tea".to_owned(), 0), 5),
        (("tea".to_owned(), MINUTE), 7),
    ]);
    assert_eq!(totals(&sink), expected);
    let dead: Vec<_> = sink
        .records()
        .into_iter()
        .filter(|r| r.topic == "orders-dlq")
        .collect();
    assert_eq!(dead.len(), 2);
    let error = |i: usize| {
        String::from_utf8(dead[i].header("lambda-streams-error").unwrap().to_vec()).unwrap()
    };
    assert!(
        error(0).starts_with("record orders-0 offset 3: cannot deserialize the value: schema id 99 (subject orders-value): "),
        "{}",
        error(0)
    );
    assert!(
        error(1).starts_with("record orders-0 offset 4: cannot deserialize the value: subject orders-value: magic byte 123"),
        "{}",
        error(1)
    );
    // The dead letters are the records themselves.
    assert_eq!(dead[1].value.as_deref(), Some(&br#"{"item":"tea"}"#[..]));
}

#[tokio::test]
async fn source_format_reads_the_id_from_the_schema_metadata() {
    let store = MemoryStore::new();
    let sink = MemorySink::new();
    let records = vec![
        record(0, 1_000, "tea", order_bytes("tea", 2, None), Some("11")),
        record(
            1,
            2_000,
            "tea",
            order_bytes("tea", 4, Some(None)),
            Some("12"),
        ),
    ];
    let topology = topology(schemas(), WireFormat::Source);
    topology
        .process_with(&event(records), &store, &sink, &BatchOptions::default())
        .await
        .unwrap();
    assert_eq!(totals(&sink), BTreeMap::from([(("tea".to_owned(), 0), 6)]));
    // Without metadata, SOURCE bytes cannot be decoded: the default policy fails the
    // batch, naming the record.
    let err = topology
        .process_with(
            &event(vec![record(
                2,
                3_000,
                "tea",
                order_bytes("tea", 1, None),
                None,
            )]),
            &store,
            &sink,
            &BatchOptions::default(),
        )
        .await
        .unwrap_err();
    assert!(
        err.to_string().starts_with(
            "record orders-0 offset 2: cannot deserialize the value: subject orders-value: EventRecordFormat SOURCE: the record has no schema metadata"
        ),
        "{err}"
    );
}

#[tokio::test]
async fn an_unreachable_registry_fails_the_batch_instead_of_poisoning_records() {
    // Port 1 on the loopback: nothing listens, the connection is refused.
    let registry: Arc<dyn SchemaSource> =
        Arc::new(RegistryClient::new("http://127.0.0.1:1").unwrap());
    let topology = topology(registry, WireFormat::Confluent);
    let store = MemoryStore::new();
    let sink = MemorySink::new();
    let options = BatchOptions {
        poison: PoisonPolicy::Skip,
        ..BatchOptions::default()
    };
    let err = topology
        .process_with(
            &event(vec![record(
                0,
                1_000,
                "tea",
                confluent(11, order_bytes("tea", 2, None)),
                None,
            )]),
            &store,
            &sink,
            &options,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StreamError::Unavailable { .. }), "{err:?}");
    assert!(
        err.to_string().starts_with(
            "record orders-0 offset 0: cannot deserialize the value now: schema registry unavailable: schema id 11 (subject orders-value) at http://127.0.0.1:1"
        ),
        "{err}"
    );
    assert!(sink.records().is_empty());
}
