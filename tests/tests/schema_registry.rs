//! Avro records behind a real schema registry, end to end: an independent producer (Python,
//! `confluent-kafka` + `fastavro`, tests/fixtures/schema/avro_tool.py) registers two
//! versions of the order schema (v2 adds a field with a default) with the registry started
//! by `scripts/services` and produces orders in the Confluent wire format; the local
//! runner delivers them to a topology that decodes them with the registry (reader v2: the
//! v1 records take the default), sums the quantities per item and minute on DynamoDB
//! (dynoxide) and produces the totals as Avro, registering its output schema; the
//! independent reader (Python again) fetches the writer's schema by the id in each output
//! record and decodes it with `fastavro`, resolved to its own reader schema (one with a
//! field more, with a default). A record with an id the registry does not know and one
//! that is not in the wire format at all are dead-lettered, their errors naming the record,
//! the schema id and the subject. The expected totals are summed by hand.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use lambda_streams::dsl::TimeWindows;
use lambda_streams::lambda::Handler;
use lambda_streams::serdes::schema::registry::RegistryClient;
use lambda_streams::serdes::schema::{Avro, SchemaSource, Side, Subject};
use lambda_streams::serdes::{BigEndianI64, Utf8};
use lambda_streams::state::Store;
use lambda_streams::state::dynamodb::{DynamoStore, create_table};
use lambda_streams::{BatchOptions, Guarantee, PoisonPolicy, StreamsBuilder, Topology};
use lambda_streams_e2e::*;
use local_runner::{InProcess, Runner, RunnerConfig, admin};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

const MINUTE: i64 = 60_000;
/// Minute-aligned, so that the windows are easy to name.
const T0: i64 = 1_764_460_800_000;

fn order_v1() -> Value {
    json!({"type": "record", "name": "Order", "namespace": "shop", "fields": [
        {"name": "item", "type": "string"}, {"name": "qty", "type": "long"}]})
}

fn order_v2() -> Value {
    json!({"type": "record", "name": "Order", "namespace": "shop", "fields": [
        {"name": "item", "type": "string"}, {"name": "qty", "type": "long"},
        {"name": "coupon", "type": ["null", "string"], "default": null}]})
}

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

fn registry_url() -> String {
    std::env::var("LAMBDA_STREAMS_SCHEMA_REGISTRY_URL").unwrap_or_else(|_| {
        panic!(
            "LAMBDA_STREAMS_SCHEMA_REGISTRY_URL is not set: start the registry with \
             `scripts/services up` and eval \"$(scripts/services env)\""
        )
    })
}

/// Runs the independent tool with `args`, feeding it `stdin`; its stdout lines as JSON.
fn avro_tool(args: &[&str], stdin: &str) -> Vec<Value> {
    let script = workspace().join("tests/fixtures/schema/avro_tool.py");
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
        "avro_tool.py {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn topology(input: &str, output: &str, registry: Arc<dyn SchemaSource>) -> Topology {
    let orders = Avro::<Order>::new(
        &order_v2().to_string(),
        registry.clone(),
        Subject::topic(input, Side::Value),
    )
    .unwrap();
    let totals = Avro::<Total>::new(TOTAL, registry, Subject::topic(output, Side::Value)).unwrap();
    let builder = StreamsBuilder::new();
    builder
        .stream(input, Utf8, orders)
        .group_by_key(Utf8)
        .windowed_by(TimeWindows::of_size(Duration::from_secs(60)))
        .aggregate("qty", || 0i64, |_, o: Order, sum| sum + o.qty, BigEndianI64)
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
        .to(output, Utf8, totals);
    builder.build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn avro_through_a_real_registry_read_back_by_an_independent_decoder() {
    require_services();
    let registry = registry_url();
    let (input, output, dlq, table) = (
        unique("avro-orders"),
        unique("avro-totals"),
        unique("avro-dlq"),
        unique("avro-orders"),
    );
    for topic in [&input, &output, &dlq] {
        admin::create_topic(&bootstrap(), topic, 1)
            .await
            .expect("topic");
    }
    create_table(&dynamo_client(), &table).await.expect("table");

    // The orders, produced by the independent producer: v1 and v2 records, a record whose
    // schema id (0x00ffffff) the registry does not know, and JSON text (no wire format).
    let orders = [
        json!({"schema": order_v1(), "key": "tea", "value": {"item": "tea", "qty": 2}, "timestamp": T0 + 1_000}),
        json!({"schema": order_v2(), "key": "tea", "value": {"item": "tea", "qty": 3, "coupon": "x"}, "timestamp": T0 + 2_000}),
        json!({"schema": order_v2(), "key": "jam", "value": {"item": "jam", "qty": 5, "coupon": null}, "timestamp": T0 + 3_000}),
        json!({"raw": "0000ffffff0e", "key": "tea", "timestamp": T0 + 4_000}),
        json!({"raw": hex(br#"{"item":"tea","qty":100}"#), "key": "tea", "timestamp": T0 + 5_000}),
        json!({"schema": order_v1(), "key": "tea", "value": {"item": "tea", "qty": 7}, "timestamp": T0 + MINUTE + 1}),
        json!({"schema": order_v2(), "key": "jam", "value": {"item": "jam", "qty": 1, "coupon": null}, "timestamp": T0 + MINUTE + 2}),
    ];
    let lines: String = orders.iter().map(|o| format!("{o}\n")).collect();
    let ids = avro_tool(&["produce", &bootstrap(), &registry, &input], &lines);
    let (v1, v2) = (ids[0]["schema_id"].clone(), ids[1]["schema_id"].clone());
    assert_ne!(v1, v2, "two schema versions: {ids:?}");

    let source: Arc<dyn SchemaSource> = Arc::new(RegistryClient::new(&registry).unwrap());
    let store: Arc<dyn Store> = Arc::new(DynamoStore::new(
        dynamo_client(),
        table.clone(),
        Guarantee::ExactlyOnce,
    ));
    let options = BatchOptions {
        poison: PoisonPolicy::DeadLetter { topic: dlq.clone() },
        ..BatchOptions::default()
    };
    let handler = Handler::with_kafka_output(topology(&input, &output, source), store, None)
        .with_options(options);
    let config = RunnerConfig {
        bootstrap_servers: bootstrap(),
        group_id: unique("avro-group"),
        topics: vec![input.clone()],
        batching_window: Duration::from_millis(300),
        until_idle: true,
        idle_timeout: Duration::from_millis(1500),
        ..RunnerConfig::default()
    };
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

    // Read back by the independent decoder, with a reader schema of its own: a field
    // more, with a default (the writer's fields resolve to it; `currency` takes "EUR").
    let reader = json!({"type": "record", "name": "Total", "namespace": "shop", "fields": [
        {"name": "item", "type": "string"}, {"name": "window_start", "type": "long"},
        {"name": "qty", "type": "long"}, {"name": "currency", "type": "string", "default": "EUR"}]});
    let read = avro_tool(
        &[
            "read",
            &bootstrap(),
            &registry,
            &output,
            &reader.to_string(),
        ],
        "",
    );
    let mut totals = BTreeMap::new();
    let mut output_ids = std::collections::BTreeSet::new();
    for r in &read {
        let v = &r["value"];
        assert_eq!(r["key"], v["item"]);
        assert_eq!(v["currency"], "EUR");
        output_ids.insert(r["schema_id"].as_i64().unwrap());
        totals.insert(
            (
                v["item"].as_str().unwrap().to_owned(),
                v["window_start"].as_i64().unwrap() - T0,
            ),
            v["qty"].as_i64().unwrap(),
        );
    }
    assert_eq!(output_ids.len(), 1, "one output schema id: {read:?}");
    // By hand: tea [0, 1 min) 2 + 3 = 5; jam 5; tea [1, 2 min) 7; jam 1.
    let expected = BTreeMap::from([
        (("jam".to_owned(), 0), 5),
        (("jam".to_owned(), MINUTE), 1),
        (("tea".to_owned(), 0), 5),
        (("tea".to_owned(), MINUTE), 7),
    ]);
    assert_eq!(totals, expected, "{read:?}");

    let dead = read_topic(&dlq);
    assert_eq!(dead.len(), 2, "the two undecodable records");
    let error =
        |i: usize| String::from_utf8(dead[i].headers["lambda-streams-error"].clone()).unwrap();
    let subject = format!("{input}-value");
    assert!(
        error(0).starts_with(&format!(
            "record {input}-0 offset 3: cannot deserialize the value: schema id 16777215 (subject {subject}) at {registry}: not found (HTTP 404"
        )),
        "{}",
        error(0)
    );
    assert!(
        error(1).starts_with(&format!(
            "record {input}-0 offset 4: cannot deserialize the value: subject {subject}: magic byte 123"
        )),
        "{}",
        error(1)
    );
    assert_eq!(
        dead[1].value.as_deref(),
        Some(&br#"{"item":"tea","qty":100}"#[..]),
        "the record itself"
    );
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A click as a `prost` message: `message Click { string page = 1; int64 ms = 2; }`.
#[derive(Clone, PartialEq, prost::Message)]
struct Click {
    #[prost(string, tag = "1")]
    page: String,
    #[prost(int64, tag = "2")]
    ms: i64,
}

const CLICK_PROTO: &str =
    "syntax = \"proto3\";\npackage web;\nmessage Click {\n  string page = 1;\n  int64 ms = 2;\n}\n";

const PAGE_COUNT: &str = r#"{"type":"record","name":"PageCount","namespace":"web","fields":[
    {"name":"page","type":"string"},{"name":"window_start","type":"long"},
    {"name":"clicks","type":"long"}]}"#;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct PageCount {
    page: String,
    window_start: i64,
    clicks: i64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protobuf_in_avro_out_through_a_real_registry() {
    use lambda_streams::serdes::schema::Protobuf;
    require_services();
    let registry = registry_url();
    let (input, output, dlq, table) = (
        unique("proto-clicks"),
        unique("proto-counts"),
        unique("proto-dlq"),
        unique("proto-clicks"),
    );
    for topic in [&input, &output, &dlq] {
        admin::create_topic(&bootstrap(), topic, 1)
            .await
            .expect("topic");
    }
    create_table(&dynamo_client(), &table).await.expect("table");
    // Clicks encoded by the independent producer; the page is the key too. The fourth
    // record says it is message index [1] (count 1 = zig-zag 2, index 1 = zig-zag 2) of
    // its schema, which this topology does not read; the fifth has an unknown id.
    let click = |page: &str, ms: i64| {
        json!({"proto": CLICK_PROTO, "fields": [[1, "string", page], [2, "int64", ms]],
               "key": page, "timestamp": T0 + ms})
    };
    let mut lines: Vec<Value> = vec![
        click("/home", 1_000),
        click("/home", 2_000),
        click("/cart", 3_000),
    ];
    let produced = avro_tool(
        &["produce", &bootstrap(), &registry, &input],
        &lines.iter().map(|o| format!("{o}\n")).collect::<String>(),
    );
    let id = produced[0]["schema_id"].as_u64().unwrap() as u32;
    let mut other_message = vec![0];
    other_message.extend_from_slice(&id.to_be_bytes());
    other_message.extend_from_slice(&[2, 2, 0x0a, 1, b'x']);
    lines = vec![
        json!({"raw": hex(&other_message), "key": "/home", "timestamp": T0 + 4_000}),
        json!({"raw": "0000ffffff000a0178", "key": "/home", "timestamp": T0 + 5_000}),
        click("/home", MINUTE + 1),
    ];
    avro_tool(
        &["produce", &bootstrap(), &registry, &input],
        &lines.iter().map(|o| format!("{o}\n")).collect::<String>(),
    );

    let source: Arc<dyn SchemaSource> = Arc::new(RegistryClient::new(&registry).unwrap());
    let clicks = Protobuf::<Click>::new(
        CLICK_PROTO,
        source.clone(),
        Subject::topic(&input, Side::Value),
    );
    let counts =
        Avro::<PageCount>::new(PAGE_COUNT, source, Subject::topic(&output, Side::Value)).unwrap();
    let builder = StreamsBuilder::new();
    builder
        .stream(&input, Utf8, clicks)
        .group_by_key(Utf8)
        .windowed_by(TimeWindows::of_size(Duration::from_secs(60)))
        .count("clicks")
        .to_stream()
        .map(|w, clicks| {
            (
                w.key.clone(),
                PageCount {
                    page: w.key.clone(),
                    window_start: w.start,
                    clicks,
                },
            )
        })
        .to(&output, Utf8, counts);
    let store: Arc<dyn Store> = Arc::new(DynamoStore::new(
        dynamo_client(),
        table.clone(),
        Guarantee::ExactlyOnce,
    ));
    let options = BatchOptions {
        poison: PoisonPolicy::DeadLetter { topic: dlq.clone() },
        ..BatchOptions::default()
    };
    let handler = Handler::with_kafka_output(builder.build(), store, None).with_options(options);
    let config = RunnerConfig {
        bootstrap_servers: bootstrap(),
        group_id: unique("proto-group"),
        topics: vec![input.clone()],
        batching_window: Duration::from_millis(300),
        until_idle: true,
        idle_timeout: Duration::from_millis(1500),
        ..RunnerConfig::default()
    };
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

    let read = avro_tool(&["read", &bootstrap(), &registry, &output, PAGE_COUNT], "");
    let mut counts = BTreeMap::new();
    for r in &read {
        let v = &r["value"];
        counts.insert(
            (
                v["page"].as_str().unwrap().to_owned(),
                v["window_start"].as_i64().unwrap() - T0,
            ),
            v["clicks"].as_i64().unwrap(),
        );
    }
    // By hand: /home twice and /cart once in the first minute, /home once in the second.
    let expected = BTreeMap::from([
        (("/cart".to_owned(), 0), 1),
        (("/home".to_owned(), 0), 2),
        (("/home".to_owned(), MINUTE), 1),
    ]);
    assert_eq!(counts, expected, "{read:?}");

    let dead = read_topic(&dlq);
    assert_eq!(dead.len(), 2, "the two undecodable records");
    let error =
        |i: usize| String::from_utf8(dead[i].headers["lambda-streams-error"].clone()).unwrap();
    let subject = format!("{input}-value");
    assert!(
        error(0).starts_with(&format!(
            "record {input}-0 offset 3: cannot deserialize the value: schema id {id} (subject {subject}): the record is message [1] of the schema, this serde reads [0]"
        )),
        "{}",
        error(0)
    );
    assert!(
        error(1).starts_with(&format!(
            "record {input}-0 offset 4: cannot deserialize the value: schema id 16777215 (subject {subject}) at {registry}: not found"
        )),
        "{}",
        error(1)
    );
}

/// The runner plays the event source's schema validation: with `SOURCE` the function reads
/// the bytes without prefix and the id from the schema metadata, with `JSON` the decoded
/// value; a record of an unknown schema id goes to the on-failure topic as
/// `SCHEMA_NOT_FOUND`, one not in the wire format as `DESERIALIZATION_ERROR`, and neither
/// reaches the function.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runner_validates_records_against_the_registry_as_the_event_source_does() {
    use lambda_streams::serdes::schema::WireFormat;
    use local_runner::schema::{EventRecordFormat, SchemaValidationConfig};
    require_services();
    let registry = registry_url();
    for (format, wire) in [
        (EventRecordFormat::Source, WireFormat::Source),
        (EventRecordFormat::Json, WireFormat::Json),
    ] {
        let name = format!("{format:?}").to_lowercase();
        let (input, output, failed, table) = (
            unique(&format!("esm-{name}-orders")),
            unique(&format!("esm-{name}-totals")),
            unique(&format!("esm-{name}-failed")),
            unique("esm-orders"),
        );
        for topic in [&input, &output, &failed] {
            admin::create_topic(&bootstrap(), topic, 1)
                .await
                .expect("topic");
        }
        create_table(&dynamo_client(), &table).await.expect("table");
        let orders = [
            json!({"schema": order_v1(), "key": "tea", "value": {"item": "tea", "qty": 2}, "timestamp": T0 + 1_000}),
            json!({"raw": "0000ffffff0e", "key": "tea", "timestamp": T0 + 2_000}),
            json!({"schema": order_v2(), "key": "tea", "value": {"item": "tea", "qty": 3, "coupon": "x"}, "timestamp": T0 + 3_000}),
            json!({"raw": hex(b"plain text"), "key": "tea", "timestamp": T0 + 4_000}),
        ];
        let lines: String = orders.iter().map(|o| format!("{o}\n")).collect();
        avro_tool(&["produce", &bootstrap(), &registry, &input], &lines);

        let source: Arc<dyn SchemaSource> = Arc::new(RegistryClient::new(&registry).unwrap());
        let reader = Avro::<Order>::new(
            &order_v2().to_string(),
            source.clone(),
            Subject::topic(&input, Side::Value),
        )
        .unwrap()
        .input(wire);
        let totals =
            Avro::<Total>::new(TOTAL, source, Subject::topic(&output, Side::Value)).unwrap();
        let builder = StreamsBuilder::new();
        builder
            .stream(&input, Utf8, reader)
            .group_by_key(Utf8)
            .windowed_by(TimeWindows::of_size(Duration::from_secs(60)))
            .aggregate("qty", || 0i64, |_, o: Order, sum| sum + o.qty, BigEndianI64)
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
            .to(&output, Utf8, totals);
        let store: Arc<dyn Store> = Arc::new(DynamoStore::new(
            dynamo_client(),
            table.clone(),
            Guarantee::ExactlyOnce,
        ));
        // The default poison policy (fail): a record the runner let through undecodable
        // would stop the run.
        let handler = Handler::with_kafka_output(builder.build(), store, None);
        let config = RunnerConfig {
            bootstrap_servers: bootstrap(),
            group_id: unique("esm-group"),
            topics: vec![input.clone()],
            batching_window: Duration::from_millis(300),
            until_idle: true,
            idle_timeout: Duration::from_millis(1500),
            on_failure_topic: Some(failed.clone()),
            schema_validation: Some(SchemaValidationConfig {
                registry_url: registry.clone(),
                format,
                key: false,
                value: true,
            }),
            ..RunnerConfig::default()
        };
        let summary = tokio::time::timeout(
            Duration::from_secs(120),
            Runner::new(config, Arc::new(InProcess::new(Arc::new(handler))))
                .expect("runner")
                .run(),
        )
        .await
        .expect("the runner finished")
        .expect("the runner succeeded");
        assert_eq!(summary.failures, 0, "{name}");
        assert_eq!(summary.given_up, 2, "{name}");

        let read = avro_tool(&["read", &bootstrap(), &registry, &output, TOTAL], "");
        let last = read.last().expect("totals");
        // By hand: 2 + 3.
        assert_eq!(
            last["value"],
            json!({"item": "tea", "window_start": T0, "qty": 5}),
            "{name}: {read:?}"
        );

        let dead = read_topic(&failed);
        assert_eq!(dead.len(), 2, "{name}");
        let header = |i: usize, h: &str| String::from_utf8(dead[i].headers[h].clone()).unwrap();
        assert_eq!(
            header(0, "lambda-streams-failure-reason"),
            "SCHEMA_NOT_FOUND",
            "{name}"
        );
        assert_eq!(header(0, "lambda-streams-source"), format!("{input}:0:1"));
        assert!(
            header(0, "lambda-streams-failure-error").starts_with(&format!(
                "schema id 16777215 (subject {input}-value) at {registry}: not found"
            )),
            "{}",
            header(0, "lambda-streams-failure-error")
        );
        assert_eq!(
            header(1, "lambda-streams-failure-reason"),
            "DESERIALIZATION_ERROR",
            "{name}"
        );
        assert_eq!(header(1, "lambda-streams-source"), format!("{input}:0:3"));
        assert_eq!(
            dead[1].value.as_deref(),
            Some(&b"plain text"[..]),
            "the record itself"
        );
    }
}
