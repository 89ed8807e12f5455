//! The schema'd records' remaining layouts, end to end on the real broker (and the real
//! registry of `scripts/services` for references), each record written by an independent
//! encoder (Python: struct, zlib, uuid, fastavro, Protobuf by hand;
//! tests/fixtures/schema/schema_tool.py) and every expected value worked out by hand:
//!
//! - AWS Glue's wire format (header version 3, compression 0 or 5 = zlib, the 16-byte
//!   schema version UUID): Avro, Protobuf and JSON Schema records decoded with the schemas
//!   given offline by UUID (no Glue registry service runs here), the output written as
//!   zlib-compressed Glue Avro and read back by Python;
//! - schema references through the real registry: an Avro record type defined in another
//!   subject, a Protobuf import, read by the serdes from the Confluent wire format and,
//!   with the local runner playing the event source with `EventRecordFormat: JSON`, from
//!   the JSON the runner decoded (Protobuf's JSON mapping read into a `prost` message).

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use lambda_streams::lambda::Handler;
use lambda_streams::serdes::Utf8;
use lambda_streams::serdes::schema::registry::RegistryClient;
use lambda_streams::serdes::schema::{
    Avro, GlueCompression, JsonSchema, OfflineSchemas, Protobuf, RegisteredSchema, SchemaId,
    SchemaSource, SchemaType, Side, Subject, WireFormat,
};
use lambda_streams::state::Store;
use lambda_streams::state::dynamodb::{DynamoStore, create_table};
use lambda_streams::{BatchOptions, Guarantee, PoisonPolicy, StreamsBuilder};
use lambda_streams_e2e::*;
use local_runner::schema::{EventRecordFormat, SchemaValidationConfig};
use local_runner::{InProcess, Runner, RunnerConfig, admin};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

const T0: i64 = 1_764_460_800_000;

/// Runs the independent tool with `args`, feeding it `stdin`; its stdout lines as JSON.
fn schema_tool(args: &[&str], stdin: &str) -> Vec<Value> {
    let script = workspace().join("tests/fixtures/schema/schema_tool.py");
    let mut child = Command::new("python3")
        .arg(&script)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect(
            "python3 with confluent-kafka and fastavro (scripts/tools installs them; \
             PATH=\"$(scripts/tools path):$PATH\")",
        );
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "schema_tool.py {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn produce(topic: &str, records: &[Value]) {
    let lines: String = records.iter().map(|r| format!("{r}\n")).collect();
    schema_tool(&["produce", &bootstrap(), topic], &lines);
}

fn registry_url() -> String {
    std::env::var("LAMBDA_STREAMS_SCHEMA_REGISTRY_URL").unwrap_or_else(|_| {
        panic!(
            "LAMBDA_STREAMS_SCHEMA_REGISTRY_URL is not set: start the registry with \
             `scripts/services up` and eval \"$(scripts/services env)\""
        )
    })
}

async fn run(handler: Handler, topics: Vec<String>, configure: impl FnOnce(&mut RunnerConfig)) {
    let mut config = RunnerConfig {
        bootstrap_servers: bootstrap(),
        group_id: unique("schema-glue-group"),
        topics,
        batching_window: Duration::from_millis(300),
        until_idle: true,
        idle_timeout: Duration::from_millis(1500),
        ..RunnerConfig::default()
    };
    configure(&mut config);
    let summary = tokio::time::timeout(
        Duration::from_secs(120),
        Runner::new(config, Arc::new(InProcess::new(Arc::new(handler))))
            .expect("runner")
            .run(),
    )
    .await
    .expect("the runner finished")
    .expect("the runner succeeded");
    assert_eq!(summary.failures, 0);
}

async fn topics_and_table(names: &[&String], table: &str) {
    for topic in names {
        admin::create_topic(&bootstrap(), topic, 1)
            .await
            .expect("topic");
    }
    create_table(&dynamo_client(), table).await.expect("table");
}

fn store(table: &str) -> Arc<dyn Store> {
    Arc::new(DynamoStore::new(
        dynamo_client(),
        table.to_owned(),
        Guarantee::ExactlyOnce,
    ))
}

// ------------------------------------------------------------------------------ Glue

const ORDER: &str = r#"{"type":"record","name":"Order","namespace":"shop","fields":[
    {"name":"item","type":"string"},{"name":"qty","type":"long"}]}"#;
const CLICK_PROTO: &str =
    "syntax = \"proto3\";\npackage web;\nmessage Click {\n  string page = 1;\n  int64 ms = 2;\n}\n";
const READING: &str = r#"{"type":"object","properties":{"sensor":{"type":"string"},
    "celsius":{"type":"number"}},"required":["sensor","celsius"]}"#;
const SUMMARY: &str = r#"{"type":"record","name":"Summary","namespace":"shop","fields":[
    {"name":"source","type":"string"},{"name":"name","type":"string"},
    {"name":"amount","type":"long"}]}"#;

const ORDER_VERSION: &str = "0b6f7c1e-2d3a-4b5c-8d9e-0f1a2b3c4d01";
const CLICK_VERSION: &str = "0b6f7c1e-2d3a-4b5c-8d9e-0f1a2b3c4d02";
const READING_VERSION: &str = "0b6f7c1e-2d3a-4b5c-8d9e-0f1a2b3c4d03";
const SUMMARY_VERSION: &str = "0b6f7c1e-2d3a-4b5c-8d9e-0f1a2b3c4d04";
const UNKNOWN_VERSION: &str = "0b6f7c1e-2d3a-4b5c-8d9e-0f1a2b3c4dff";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Order {
    item: String,
    qty: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Click {
    #[prost(string, tag = "1")]
    page: String,
    #[prost(int64, tag = "2")]
    ms: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Reading {
    sensor: String,
    celsius: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Summary {
    source: String,
    name: String,
    amount: i64,
}

fn glue(uuid: &str) -> SchemaId {
    SchemaId::parse(uuid).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn glue_records_of_an_independent_encoder_decoded_with_offline_schemas() {
    require_services();
    let (orders, clicks, readings, output, dlq, table) = (
        unique("glue-orders"),
        unique("glue-clicks"),
        unique("glue-readings"),
        unique("glue-summaries"),
        unique("glue-dlq"),
        unique("glue"),
    );
    topics_and_table(&[&orders, &clicks, &readings, &output, &dlq], &table).await;

    // Each input plain (compression 0) and zlib-compressed (5); two orders that cannot be
    // read: a compression byte 5 over bytes that are no zlib stream, a version the
    // function does not know.
    let at = |i: i64| T0 + i * 1_000;
    produce(
        &orders,
        &[
            json!({"key": "tea", "timestamp": at(1), "glue": ORDER_VERSION, "avro": serde_json::from_str::<Value>(ORDER).unwrap(), "value": {"item": "tea", "qty": 2}}),
            json!({"key": "jam", "timestamp": at(2), "glue": ORDER_VERSION, "zlib": true, "avro": serde_json::from_str::<Value>(ORDER).unwrap(), "value": {"item": "jam", "qty": 5}}),
            json!({"key": "bad", "timestamp": at(3), "raw": format!("0305{}0e0402", ORDER_VERSION.replace('-', ""))}),
            json!({"key": "who", "timestamp": at(4), "glue": UNKNOWN_VERSION, "avro": serde_json::from_str::<Value>(ORDER).unwrap(), "value": {"item": "who", "qty": 1}}),
        ],
    );
    produce(
        &clicks,
        &[
            json!({"key": "/home", "timestamp": at(5), "glue": CLICK_VERSION, "proto": [[1, "string", "/home"], [2, "int64", 1000]]}),
            json!({"key": "/cart", "timestamp": at(6), "glue": CLICK_VERSION, "zlib": true, "proto": [[1, "string", "/cart"], [2, "int64", 2500]]}),
        ],
    );
    produce(
        &readings,
        &[
            json!({"key": "s1", "timestamp": at(7), "glue": READING_VERSION, "zlib": true, "json": {"sensor": "s1", "celsius": 21}}),
            json!({"key": "s2", "timestamp": at(8), "glue": READING_VERSION, "json": {"sensor": "s2", "celsius": -3}}),
        ],
    );

    // The schemas compiled in, by Glue schema version.
    let value = |t: &str| Subject::topic(t, Side::Value);
    let schemas: Arc<dyn SchemaSource> = Arc::new(
        OfflineSchemas::new()
            .with(glue(ORDER_VERSION), value(&orders), SchemaType::Avro, ORDER)
            .with(
                glue(CLICK_VERSION),
                value(&clicks),
                SchemaType::Protobuf,
                CLICK_PROTO,
            )
            .with(
                glue(READING_VERSION),
                value(&readings),
                SchemaType::Json,
                READING,
            )
            .with(
                glue(SUMMARY_VERSION),
                value(&output),
                SchemaType::Avro,
                SUMMARY,
            ),
    );
    let out = || {
        Avro::<Summary>::new(SUMMARY, schemas.clone(), value(&output))
            .unwrap()
            .output(WireFormat::Glue)
            .glue_compression(GlueCompression::Zlib)
    };
    let summary = |source: &str, name: String, amount: i64| Summary {
        source: source.to_owned(),
        name,
        amount,
    };
    let builder = StreamsBuilder::new();
    builder
        .stream(
            &orders,
            Utf8,
            Avro::<Order>::new(ORDER, schemas.clone(), value(&orders))
                .unwrap()
                .input(WireFormat::Glue),
        )
        .map(move |k, o: Order| (k.clone(), summary("orders", o.item, o.qty)))
        .to(&output, Utf8, out());
    builder
        .stream(
            &clicks,
            Utf8,
            Protobuf::<Click>::new(CLICK_PROTO, schemas.clone(), value(&clicks))
                .input(WireFormat::Glue),
        )
        .map(move |k, c: Click| (k.clone(), summary("clicks", c.page, c.ms)))
        .to(&output, Utf8, out());
    builder
        .stream(
            &readings,
            Utf8,
            JsonSchema::<Reading>::new(READING, schemas.clone(), value(&readings))
                .unwrap()
                .input(WireFormat::Glue),
        )
        .map(move |k, r: Reading| (k.clone(), summary("readings", r.sensor, r.celsius as i64)))
        .to(&output, Utf8, out());
    let handler = Handler::with_kafka_output(builder.build(), store(&table), None).with_options(
        BatchOptions {
            poison: PoisonPolicy::DeadLetter { topic: dlq.clone() },
            ..BatchOptions::default()
        },
    );
    run(
        handler,
        vec![orders.clone(), clicks.clone(), readings.clone()],
        |_| {},
    )
    .await;

    // Read back by Python: header parsed, payload inflated, decoded by fastavro.
    let read = schema_tool(&["read-glue", &bootstrap(), &output, SUMMARY], "");
    let mut got = BTreeSet::new();
    for r in &read {
        assert_eq!(r["version"], 3, "{r}");
        assert_eq!(r["compression"], 5, "zlib, as told: {r}");
        assert_eq!(r["uuid"], SUMMARY_VERSION, "{r}");
        let v = &r["value"];
        got.insert((
            r["key"].as_str().unwrap().to_owned(),
            v["source"].as_str().unwrap().to_owned(),
            v["name"].as_str().unwrap().to_owned(),
            v["amount"].as_i64().unwrap(),
        ));
    }
    // By hand, from the records produced above.
    let expected: BTreeSet<_> = [
        ("tea", "orders", "tea", 2),
        ("jam", "orders", "jam", 5),
        ("/home", "clicks", "/home", 1000),
        ("/cart", "clicks", "/cart", 2500),
        ("s1", "readings", "s1", 21),
        ("s2", "readings", "s2", -3),
    ]
    .into_iter()
    .map(|(k, s, n, a)| (k.to_owned(), s.to_owned(), n.to_owned(), a))
    .collect();
    assert_eq!(got, expected, "{read:?}");
    assert_eq!(read.len(), 6, "{read:?}");

    let dead = read_topic(&dlq);
    assert_eq!(dead.len(), 2, "the two unreadable orders");
    let error =
        |i: usize| String::from_utf8(dead[i].headers["lambda-streams-error"].clone()).unwrap();
    let subject = format!("{orders}-value");
    assert!(
        error(0).starts_with(&format!(
            "record {orders}-0 offset 2: cannot deserialize the value: subject {subject}: schema version {ORDER_VERSION}: the zlib-compressed payload does not inflate"
        )),
        "{}",
        error(0)
    );
    assert!(
        error(1).starts_with(&format!(
            "record {orders}-0 offset 3: cannot deserialize the value: schema id {UNKNOWN_VERSION} (subject {subject}): not among the compiled-in schemas (offline mode)"
        )),
        "{}",
        error(1)
    );
}

// ------------------------------------------------------------------------ references

const ADDRESS: &str = r#"{"type":"record","name":"Address","namespace":"shop","fields":[
    {"name":"city","type":"string"}]}"#;
/// A customer whose `address` is `shop.Address`, defined by the schema of another subject.
const CUSTOMER: &str = r#"{"type":"record","name":"Customer","namespace":"shop","fields":[
    {"name":"id","type":"long"},{"name":"address","type":"shop.Address"}]}"#;
const WHERE_PROTO: &str =
    "syntax = \"proto3\";\npackage geo;\nmessage Where {\n  string city = 1;\n}\n";
const WHERE_IMPORT: &str = "geo/where.proto";
/// A visit whose `where` is `geo.Where`, imported from the schema of another subject.
const VISIT_PROTO: &str = "syntax = \"proto3\";\npackage web;\nimport \"geo/where.proto\";\nmessage Visit {\n  string page = 1;\n  geo.Where where = 2;\n  int64 ms = 3;\n}\n";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Address {
    city: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Customer {
    id: i64,
    address: Address,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Where {
    #[prost(string, tag = "1")]
    city: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Visit {
    #[prost(string, tag = "1")]
    page: String,
    #[prost(message, optional, tag = "2")]
    r#where: Option<Where>,
    #[prost(int64, tag = "3")]
    ms: i64,
}

fn register(subject: &str, schema_type: &str, references: Value, text: &str) -> u32 {
    let registry = registry_url();
    let answer = schema_tool(
        &[
            "register",
            &registry,
            subject,
            schema_type,
            &references.to_string(),
        ],
        text,
    );
    answer[0]["id"].as_u64().unwrap() as u32
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_references_through_the_real_registry() {
    require_services();
    let registry = registry_url();
    // The serdes read the Confluent wire format themselves (`None`), or the runner plays
    // the event source and hands over the JSON it decoded.
    for event_format in [None, Some(EventRecordFormat::Json)] {
        let name = match event_format {
            None => "confluent",
            Some(_) => "json",
        };
        let (customers, visits, output, table) = (
            unique(&format!("ref-{name}-customers")),
            unique(&format!("ref-{name}-visits")),
            unique(&format!("ref-{name}-out")),
            unique("ref"),
        );
        topics_and_table(&[&customers, &visits, &output], &table).await;

        // The referenced schemas under subjects of their own (version 1 of each: fresh
        // subjects), then the referencing ones under the topics' subjects.
        let address_subject = unique("ref-address");
        let where_subject = unique("ref-where");
        register(&address_subject, "AVRO", json!([]), ADDRESS);
        register(&where_subject, "PROTOBUF", json!([]), WHERE_PROTO);
        let customer_id = register(
            &format!("{customers}-value"),
            "AVRO",
            json!([{"name": "shop.Address", "subject": address_subject, "version": 1}]),
            CUSTOMER,
        );
        let visit_id = register(
            &format!("{visits}-value"),
            "PROTOBUF",
            json!([{"name": WHERE_IMPORT, "subject": where_subject, "version": 1}]),
            VISIT_PROTO,
        );

        let address: Value = serde_json::from_str(ADDRESS).unwrap();
        let customer: Value = serde_json::from_str(CUSTOMER).unwrap();
        produce(
            &customers,
            &[
                json!({"key": "c5", "timestamp": T0, "confluent": customer_id, "avro": customer, "named": [address], "value": {"id": 5, "address": {"city": "Oslo"}}}),
                json!({"key": "c6", "timestamp": T0 + 1, "confluent": customer_id, "avro": customer, "named": [address], "value": {"id": -6, "address": {"city": "Bergen"}}}),
            ],
        );
        produce(
            &visits,
            &[
                json!({"key": "v1", "timestamp": T0 + 2, "confluent": visit_id, "proto": [[1, "string", "/a"], [2, "message", [[1, "string", "Oslo"]]], [3, "int64", 9_007_199_254_740_993_i64]]}),
                json!({"key": "v2", "timestamp": T0 + 3, "confluent": visit_id, "proto": [[1, "string", "/b"], [3, "int64", -1]]}),
            ],
        );

        let source: Arc<dyn SchemaSource> = Arc::new(RegistryClient::new(&registry).unwrap());
        let wire = match event_format {
            None => WireFormat::Confluent,
            Some(_) => WireFormat::Json,
        };
        // The readers' own schemas refer to the same named type and import, given with
        // their texts.
        let customer_reader = Avro::<Customer>::with_schema(
            RegisteredSchema::new(SchemaType::Avro, CUSTOMER)
                .with_dependencies([("shop.Address".to_owned(), Arc::<str>::from(ADDRESS))]),
            source.clone(),
            Subject::topic(&customers, Side::Value),
        )
        .unwrap()
        .input(wire);
        let visit_reader = Protobuf::<Visit>::with_schema(
            RegisteredSchema::new(SchemaType::Protobuf, VISIT_PROTO)
                .with_dependencies([(WHERE_IMPORT.to_owned(), Arc::<str>::from(WHERE_PROTO))]),
            source.clone(),
            Subject::topic(&visits, Side::Value),
        )
        .input(wire);
        let builder = StreamsBuilder::new();
        builder
            .stream(&customers, Utf8, customer_reader)
            .map(|k, c: Customer| {
                (
                    k.clone(),
                    format!("customer {} in {}", c.id, c.address.city),
                )
            })
            .to(&output, Utf8, Utf8);
        builder
            .stream(&visits, Utf8, visit_reader)
            .map(|k, v: Visit| {
                let city = v.r#where.map(|w| w.city).unwrap_or_default();
                (
                    k.clone(),
                    format!("visit {} from {city:?} at {}", v.page, v.ms),
                )
            })
            .to(&output, Utf8, Utf8);
        // The default poison policy (fail): a record that does not decode stops the run.
        let handler = Handler::with_kafka_output(builder.build(), store(&table), None);
        let failed = unique(&format!("ref-{name}-failed"));
        admin::create_topic(&bootstrap(), &failed, 1)
            .await
            .expect("topic");
        run(handler, vec![customers.clone(), visits.clone()], |config| {
            if let Some(format) = event_format {
                config.on_failure_topic = Some(failed.clone());
                config.schema_validation = Some(SchemaValidationConfig {
                    registry_url: registry.clone(),
                    format,
                    key: false,
                    value: true,
                });
            }
        })
        .await;

        let got: BTreeSet<(String, String)> = read_topic(&output)
            .into_iter()
            .map(|r| {
                (
                    String::from_utf8(r.key.unwrap()).unwrap(),
                    String::from_utf8(r.value.unwrap()).unwrap(),
                )
            })
            .collect();
        // By hand, from the records produced above.
        let expected: BTreeSet<(String, String)> = [
            ("c5", "customer 5 in Oslo"),
            ("c6", "customer -6 in Bergen"),
            ("v1", "visit /a from \"Oslo\" at 9007199254740993"),
            ("v2", "visit /b from \"\" at -1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        assert_eq!(got, expected, "{name}");
    }
}
