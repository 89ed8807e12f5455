//! Handler in-process benchmark (issue 7, item 1): decode + a stateless pipeline on an MSK
//! event at the Lambda limit (10,000 records, just under 6 MB), side by side with its anchors.
//!
//! ```sh
//! cargo bench -p lambda-streams --bench handler          # criterion, all groups
//! bench/run                                              # + Powertools anchor, JSON + Markdown
//! ```
//!
//! Groups (each reports bytes of event JSON per second; records/s is 10,000 / time):
//! - `handler/lambda_streams`: `KafkaEvent::decode` + `Topology::process` of
//!   `stream(Utf8, Json<PageView>) -> filter -> map_values -> to` with a
//!   `MemoryStore` and a `MemorySink`.
//! - `handler/lambda_streams_six`: the same with the goal's "struct of six fields" (issue 16
//!   goal 4): six of the value's ten fields (three of them text) read, four skipped.
//!   `handler/lambda_streams_six_one_thread`: the same on one thread (the handler rows decode
//!   a large event and deserialize its values on the cores available, up to 4; in Lambda
//!   one per 1,769 MB of memory: what a function under 3,538 MB gets is this row).
//!   `handler/lambda_streams_six_overlap`: the same with `BatchOptions::overlap_reading` (the
//!   next window of values read while the topology takes from this one).
//! - The bench `handler_mimalloc` is this one with mimalloc as the global allocator (what
//!   `overlap_reading` is for): `cargo bench -p lambda-streams --bench handler_mimalloc`.
//! - `handler/lambda_streams_borrowed`: the ten-field values read into a view that borrows
//!   its text (`Cow<str>`) by `serdes::json::from_slice` (`Json<T>`'s arbitration), in a
//!   `ReadWith` serde that filters and maps in the source: what borrowing gains.
//! - `handler/naive_rust`: what a careful user writes without the framework:
//!   `aws_lambda_events::event::kafka::KafkaEvent` through `serde_json`, base64 per record,
//!   the value parsed into the same `PageView`, the same filter and map in plain Rust.
//! - `handler/limit_read_once`: summing the event's bytes once (the floor for any decoder).
//! - `decode/lambda_streams`, `decode/naive_rust`: the decoding part alone;
//!   `decode/lambda_streams_one_thread`: the same on one thread (`KafkaEvent::decode` splits a
//!   large event's partitions across the cores available, as the handler rows do too).
//! - `avro/lambda_streams`, `avro/apache_avro_cached`, `avro/naive_apache_avro` (with
//!   `--features avro`): 10,000 Avro orders in the Confluent wire format decoded into a serde
//!   type, by `serdes::schema::Avro` (writer schema parsed once per id, the bytes read
//!   straight into the type), by `apache_avro` with the schema and reader built once (each
//!   record a `Value`, validated, then `from_value`), and by a per-record `apache_avro`
//!   reader (the schema parsed and a reader built for every record); bytes of Avro per
//!   second. `avro_write/lambda_streams`, `avro_write/apache_avro_cached`: the same orders
//!   written, by `Avro::try_serialize` (straight into bytes) and by `apache_avro` with the
//!   writer built once (`to_value`, the resolution, the writer).
//! - `json/serde_json`, `json/lambda_streams`: the 10,000 values parsed into `PageView`, by
//!   `serde_json::from_slice` and by the framework's `Json<PageView>` serde (the handler's
//!   parse alone).
//!
//! Two modes outside criterion, selected by environment variables:
//! - `LAMBDA_STREAMS_BENCH_WRITE_EVENT=<file>`: write the event JSON (for the Python anchor)
//!   and exit;
//! - `LAMBDA_STREAMS_BENCH_LOOPS=<n>` with `LAMBDA_STREAMS_BENCH_WHAT=<group/name>` (one of
//!   `decode/lambda_streams`, `decode/lambda_streams_one_thread`, `decode/naive_rust`, `handler/lambda_streams`,
//!   `handler/lambda_streams_six`, `handler/lambda_streams_six_one_thread`, `handler/lambda_streams_six_overlap`, `handler/lambda_streams_borrowed`, `handler/naive_rust`, `json/serde_json`, `json/lambda_streams`): run that `n` times and exit, for `valgrind --tool=callgrind`,
//!   which counts instructions reliably on a busy machine; `LAMBDA_STREAMS_BENCH_EVENT=<file>`
//!   runs it on that event JSON instead of the bench's own (to see what a part of the event
//!   costs, e.g. the same records without headers).

#![allow(missing_docs, clippy::unwrap_used)]

use std::borrow::Cow;
use std::hint::black_box;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use criterion::{Criterion, SamplingMode, Throughput, criterion_group};
use lambda_streams::Topology;
use lambda_streams::event::{EventSource, Header, KafkaEvent, PartitionRecords, Record};
use lambda_streams::event::{TimestampType, TopicPartition};
use lambda_streams::serdes::{Json, Nullable, ReadWith, Serde, Utf8, json};
use lambda_streams::sink::MemorySink;
use lambda_streams::state::memory::MemoryStore;
use lambda_streams::{BatchOptions, StreamsBuilder};
use serde::{Deserialize, Serialize};

/// Records in the event: the Lambda maximum per invocation.
const RECORDS: usize = 10_000;
/// Partitions of the input topic present in the event.
const PARTITIONS: i32 = 4;
const TOPIC: &str = "page-views";
const OUTPUT_TOPIC: &str = "engaged-views";

/// The typed value both pipelines parse each record into.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
struct PageView {
    event_id: String,
    user_id: String,
    session_id: String,
    url: String,
    referrer: Option<String>,
    device: String,
    country: String,
    duration_ms: u32,
    scroll_depth: f32,
    ts: i64,
}

/// The goal's "struct of six fields" (issue 16 goal 4): the same values read into six of
/// their ten fields (three of them text), the other four skipped by the parser.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PageViewSix {
    user_id: String,
    url: String,
    referrer: Option<String>,
    duration_ms: u32,
    scroll_depth: f32,
    ts: i64,
}

/// The six-field pipeline's summary line.
fn summary_six(v: &PageViewSix) -> String {
    format!("{}|{}|{}", v.user_id, v.url, v.duration_ms)
}

/// The same values read into a view that borrows its text from the record's bytes
/// (`Cow::Borrowed` unless a string has escapes): no allocation per text field.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
struct PageViewRef<'a> {
    #[serde(borrow)]
    event_id: Cow<'a, str>,
    #[serde(borrow)]
    user_id: Cow<'a, str>,
    #[serde(borrow)]
    session_id: Cow<'a, str>,
    #[serde(borrow)]
    url: Cow<'a, str>,
    #[serde(borrow)]
    referrer: Option<Cow<'a, str>>,
    #[serde(borrow)]
    device: Cow<'a, str>,
    #[serde(borrow)]
    country: Cow<'a, str>,
    duration_ms: u32,
    scroll_depth: f32,
    ts: i64,
}

/// The borrowed parse as the framework offers it: a [`ReadWith`] that reads each value into
/// a [`PageViewRef`] with `serdes::json::from_slice` (`Json<T>`'s arbitration: the value or
/// error `serde_json` gives) and keeps only the summary of an engaged view (BENCHMARKS.md
/// section 1, "A borrowed parse").
fn engaged_summary() -> impl Serde<Option<String>> {
    ReadWith::new(
        |bytes: &[u8]| {
            let v: PageViewRef<'_> = json::from_slice(bytes)?;
            Ok((v.duration_ms >= ENGAGED_MS)
                .then(|| summary_line(&v.country, &v.device, &v.url, v.duration_ms)))
        },
        Nullable(Utf8),
    )
}

/// How long an engaged view stays on the page: 30 s (about half of the views).
const ENGAGED_MS: u32 = 30_000;

/// The filter: engaged views.
fn engaged(v: &PageView) -> bool {
    v.duration_ms >= ENGAGED_MS
}

/// The map: a small summary line.
fn summary(v: &PageView) -> String {
    summary_line(&v.country, &v.device, &v.url, v.duration_ms)
}

/// The summary line of a view's fields, owned or borrowed.
fn summary_line(country: &str, device: &str, url: &str, duration_ms: u32) -> String {
    format!("{country}|{device}|{url}|{duration_ms}")
}

/// A small deterministic generator (splitmix64): same event on every machine and run.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len() as u64) as usize]
    }
    fn hex(&mut self, digits: usize) -> String {
        let mut s = String::with_capacity(digits);
        while s.len() < digits {
            s.push_str(&format!("{:016x}", self.next()));
        }
        s.truncate(digits);
        s
    }
}

const PAGES: &[&str] = &[
    "/",
    "/search",
    "/cart",
    "/checkout/payment",
    "/products/outdoor/tents/ultralight-2p",
    "/products/kitchen/espresso-machines/dual-boiler",
    "/blog/2025/11/how-we-ship-on-fridays",
    "/account/orders",
];
const REFERRERS: &[&str] = &[
    "https://www.google.com/",
    "https://news.ycombinator.com/",
    "https://t.co/x1Y2z3",
    "https://www.bing.com/search?q=tent",
];
const DEVICES: &[&str] = &["mobile", "desktop", "tablet"];
const COUNTRIES: &[&str] = &["DE", "FR", "US", "JP", "BR", "IN", "NL", "ES"];

/// One page view value (JSON, about 300-340 bytes).
fn page_view(g: &mut Gen, user: u64, ts: i64) -> Vec<u8> {
    let referrer = if g.below(4) == 0 {
        "null".to_owned()
    } else {
        format!("\"{}\"", g.pick(REFERRERS))
    };
    format!(
        concat!(
            "{{\"eventId\":\"{}-{}-{}-{}-{}\",\"userId\":\"user-{:06}\",",
            "\"sessionId\":\"{}\",\"url\":\"https://shop.example.com{}?utm_source=mail\",",
            "\"referrer\":{},\"device\":\"{}\",\"country\":\"{}\",",
            "\"durationMs\":{},\"scrollDepth\":{:.2},\"ts\":{}}}"
        ),
        g.hex(8),
        g.hex(4),
        g.hex(4),
        g.hex(4),
        g.hex(12),
        user,
        g.hex(16),
        g.pick(PAGES),
        referrer,
        g.pick(DEVICES),
        g.pick(COUNTRIES),
        g.below(60_000),
        g.below(10_000) as f64 / 10_000.0,
        ts,
    )
    .into_bytes()
}

/// The benchmark event: MSK, 4 partitions of `page-views`, 10,000 records with keys, JSON
/// values and one or two headers, just under 6 MB of JSON.
fn event() -> KafkaEvent {
    let mut g = Gen(7);
    let per_partition = RECORDS / PARTITIONS as usize;
    let partitions = (0..PARTITIONS)
        .map(|p| {
            let records = (0..per_partition)
                .map(|i| {
                    let offset = 4_200_000 + i as i64;
                    let timestamp = 1_764_460_800_000 + (i as i64) * 37 + i64::from(p);
                    let user = g.below(1_000_000);
                    let mut headers = vec![Header::new(
                        "source",
                        g.pick(&["web", "ios", "android"]).as_bytes().to_vec(),
                    )];
                    if i % 4 == 0 {
                        headers.push(Header::new("trace-id", g.next().to_be_bytes().to_vec()));
                    }
                    Record {
                        offset,
                        timestamp,
                        timestamp_type: TimestampType::CreateTime,
                        key: Some(format!("user-{user:06}").into()),
                        value: Some(page_view(&mut g, user, timestamp).into()),
                        headers,
                        key_schema_metadata: None,
                        value_schema_metadata: None,
                    }
                })
                .collect();
            PartitionRecords {
                tp: TopicPartition::new(TOPIC, p),
                records,
            }
        })
        .collect();
    KafkaEvent {
        source: EventSource::Msk {
            arn: "arn:aws:kafka:eu-west-1:123456789012:cluster/shop/6a8e3f2c-1b5d-4c7e-9f0a-2d4b6c8e0f1a-3"
                .to_owned(),
        },
        bootstrap_servers: "b-1.shop.kafka.eu-west-1.amazonaws.com:9098,b-2.shop.kafka.eu-west-1.amazonaws.com:9098"
            .to_owned(),
        partitions,
    }
}

/// The lambda-streams pipeline.
fn topology() -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream(TOPIC, Utf8, Json::<PageView>::new())
        .filter(|_, v| engaged(v))
        .map_values(|v| summary(&v))
        .to(OUTPUT_TOPIC, Utf8, Utf8);
    builder.build()
}

/// The pipeline with the goal's six-field value type.
fn topology_six() -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream(TOPIC, Utf8, Json::<PageViewSix>::new())
        .filter(|_, v| v.duration_ms >= ENGAGED_MS)
        .map_values(|v| summary_six(&v))
        .to(OUTPUT_TOPIC, Utf8, Utf8);
    builder.build()
}

/// The ten-field pipeline with the borrowed parse: the source's serde filters and maps.
fn topology_borrowed() -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream(TOPIC, Utf8, engaged_summary())
        .flat_map_values(|summary| summary)
        .to(OUTPUT_TOPIC, Utf8, Utf8);
    builder.build()
}

/// An output record of the naive path.
#[allow(dead_code)]
struct NaiveOutput {
    topic: &'static str,
    key: Option<Vec<u8>>,
    value: Vec<u8>,
    timestamp: i64,
}

/// The naive path's decoded record: what a user keeps from `aws_lambda_events`.
#[allow(dead_code)]
struct NaiveRecord {
    topic: Option<String>,
    partition: i64,
    offset: i64,
    timestamp: i64,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Vec<(String, Vec<u8>)>,
}

/// Decoding as a careful user would with `aws_lambda_events`: serde_json into its types,
/// base64 per key and value, headers converted from `i8`. Errors are returned, not unwrapped.
fn naive_decode(json: &[u8]) -> Result<Vec<NaiveRecord>, String> {
    use aws_lambda_events::event::kafka::KafkaEvent as AwsEvent;
    let event: AwsEvent = serde_json::from_slice(json).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for records in event.records.into_values() {
        for r in records {
            let b64 = |s: Option<String>| -> Result<Option<Vec<u8>>, String> {
                s.map(|s| STANDARD.decode(s))
                    .transpose()
                    .map_err(|e| format!("offset {}: {e}", r.offset))
            };
            out.push(NaiveRecord {
                key: b64(r.key)?,
                value: b64(r.value)?,
                headers: r
                    .headers
                    .into_iter()
                    .flat_map(|h| h.into_iter())
                    .map(|(k, v)| (k, v.into_iter().map(|b| b as u8).collect()))
                    .collect(),
                topic: r.topic,
                partition: r.partition,
                offset: r.offset,
                timestamp: r.timestamp.0.timestamp_millis(),
            });
        }
    }
    Ok(out)
}

/// The naive handler: decode, parse each value, filter, map, collect the outputs.
fn naive_handler(json: &[u8]) -> Result<Vec<NaiveOutput>, String> {
    let mut outputs = Vec::new();
    for r in naive_decode(json)? {
        let Some(value) = r.value else { continue };
        let Ok(view) = serde_json::from_slice::<PageView>(&value) else {
            continue;
        };
        if engaged(&view) {
            outputs.push(NaiveOutput {
                topic: OUTPUT_TOPIC,
                key: r.key,
                value: summary(&view).into_bytes(),
                timestamp: r.timestamp,
            });
        }
    }
    Ok(outputs)
}

/// The lambda-streams handler: decode, then run the topology on the batch. Returns the
/// sink (dropped by the caller, as the naive path's outputs are) and the number of outputs.
fn lambda_streams_handler(
    rt: &tokio::runtime::Runtime,
    topology: &Topology,
    json: &[u8],
) -> (MemorySink, u64) {
    let event = KafkaEvent::decode(json).unwrap();
    process(rt, topology, event, &BatchOptions::default())
}

/// [`lambda_streams_handler`] with the next window of values read while the topology takes
/// from this one (`BatchOptions::overlap_reading`).
fn lambda_streams_handler_overlap(
    rt: &tokio::runtime::Runtime,
    topology: &Topology,
    json: &[u8],
) -> (MemorySink, u64) {
    let event = KafkaEvent::decode(json).unwrap();
    let options = BatchOptions {
        overlap_reading: true,
        ..BatchOptions::default()
    };
    process(rt, topology, event, &options)
}

/// [`lambda_streams_handler`] on this thread alone: the event decoded and its values
/// deserialized on one thread.
fn lambda_streams_handler_one_thread(
    rt: &tokio::runtime::Runtime,
    topology: &Topology,
    json: &[u8],
) -> (MemorySink, u64) {
    let event = KafkaEvent::decode_with_threads(json, 1).unwrap();
    let options = BatchOptions {
        deserialize_threads: 1,
        ..BatchOptions::default()
    };
    process(rt, topology, event, &options)
}

/// Runs the topology on the decoded event with `options` (the event dropped here).
fn process(
    rt: &tokio::runtime::Runtime,
    topology: &Topology,
    event: KafkaEvent,
    options: &BatchOptions,
) -> (MemorySink, u64) {
    let (store, sink) = (MemoryStore::new(), MemorySink::new());
    let outcome = rt
        .block_on(topology.process_with(&event, &store, &sink, options))
        .unwrap();
    (sink, outcome.report.records_out)
}

/// The event's values, for the JSON parse alone.
fn values() -> Vec<Vec<u8>> {
    event()
        .partitions
        .iter()
        .flat_map(|p| p.records.iter())
        .filter_map(|r| r.value().map(<[u8]>::to_vec))
        .collect()
}

/// Parses every value with `serde_json`; how many are engaged.
fn json_serde_json(values: &[Vec<u8>]) -> usize {
    values
        .iter()
        .filter(|v| serde_json::from_slice::<PageView>(v).is_ok_and(|v| engaged(&v)))
        .count()
}

/// Parses every value with the framework's `Json<PageView>`; how many are engaged.
fn json_lambda_streams(values: &[Vec<u8>]) -> usize {
    let serde = Json::<PageView>::new();
    values
        .iter()
        .filter(|v| serde.deserialize(Some(v)).is_ok_and(|v| engaged(&v)))
        .count()
}

/// The limit: read every byte once.
fn read_once(json: &[u8]) -> u64 {
    json.iter().map(|&b| u64::from(b)).sum()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Checks that both pipelines see the same records and produce the same outputs.
fn check(json: &[u8], topology: &Topology, rt: &tokio::runtime::Runtime) {
    let event = KafkaEvent::decode(json).unwrap();
    assert_eq!(event.record_count(), RECORDS);
    assert_eq!(naive_decode(json).unwrap().len(), RECORDS);
    let (sink, records_out) = lambda_streams_handler(rt, topology, json);
    let ours = sink.records();
    assert_eq!(ours.len() as u64, records_out);
    let naive = naive_handler(json).unwrap();
    assert!(!ours.is_empty() && ours.len() < RECORDS);
    assert_eq!(ours.len(), naive.len());
    let mut a: Vec<_> = ours
        .iter()
        .map(|o| (o.key.clone(), o.value.clone()))
        .collect();
    let mut b: Vec<_> = naive
        .iter()
        .map(|o| (o.key.clone(), Some(o.value.clone())))
        .collect();
    a.sort();
    b.sort();
    assert_eq!(a, b);
}

/// Checks the six-field pipeline's outputs against `serde_json` and plain Rust.
fn check_six(json: &[u8], topology: &Topology, rt: &tokio::runtime::Runtime) {
    let (sink, _) = lambda_streams_handler(rt, topology, json);
    let mut ours: Vec<_> = sink
        .records()
        .into_iter()
        .map(|o| (o.key, o.value))
        .collect();
    let mut expected: Vec<_> = naive_decode(json)
        .unwrap()
        .into_iter()
        .filter_map(|r| {
            let view: PageViewSix = serde_json::from_slice(r.value.as_deref()?).ok()?;
            (view.duration_ms >= ENGAGED_MS).then(|| (r.key, Some(summary_six(&view).into_bytes())))
        })
        .collect();
    assert!(!expected.is_empty() && expected.len() < RECORDS);
    ours.sort();
    expected.sort();
    assert_eq!(ours, expected);
}

fn benches(c: &mut Criterion) {
    let json = event().to_json();
    let (topology, six, borrowed) = (topology(), topology_six(), topology_borrowed());
    let rt = runtime();
    check(&json, &topology, &rt);
    check(&json, &borrowed, &rt);
    check_six(&json, &six, &rt);
    assert_eq!(
        lambda_streams_handler_one_thread(&rt, &six, &json)
            .0
            .records(),
        lambda_streams_handler(&rt, &six, &json).0.records(),
        "one thread and the cores available: the same outputs in the same order"
    );
    eprintln!(
        "event: {} bytes of JSON, {} records, {} partitions",
        json.len(),
        RECORDS,
        PARTITIONS
    );

    let mut group = c.benchmark_group("handler");
    group.throughput(Throughput::BytesDecimal(json.len() as u64));
    // Flat sampling, 20 samples over 10 s: moderate on 2 shared cores, enough for a median.
    group.sampling_mode(SamplingMode::Flat);
    group.sample_size(20);
    group.measurement_time(std::time::Duration::from_secs(10));
    group.bench_function("lambda_streams", |b| {
        b.iter(|| lambda_streams_handler(&rt, &topology, black_box(&json)))
    });
    group.bench_function("lambda_streams_six", |b| {
        b.iter(|| lambda_streams_handler(&rt, &six, black_box(&json)))
    });
    group.bench_function("lambda_streams_six_one_thread", |b| {
        b.iter(|| lambda_streams_handler_one_thread(&rt, &six, black_box(&json)))
    });
    group.bench_function("lambda_streams_six_overlap", |b| {
        b.iter(|| lambda_streams_handler_overlap(&rt, &six, black_box(&json)))
    });
    group.bench_function("lambda_streams_borrowed", |b| {
        b.iter(|| lambda_streams_handler(&rt, &borrowed, black_box(&json)))
    });
    group.bench_function("naive_rust", |b| {
        b.iter(|| naive_handler(black_box(&json)).unwrap())
    });
    group.bench_function("limit_read_once", |b| {
        b.iter(|| read_once(black_box(&json)))
    });
    group.finish();

    let mut group = c.benchmark_group("decode");
    group.throughput(Throughput::BytesDecimal(json.len() as u64));
    // Flat sampling, 20 samples over 10 s: moderate on 2 shared cores, enough for a median.
    group.sampling_mode(SamplingMode::Flat);
    group.sample_size(20);
    group.measurement_time(std::time::Duration::from_secs(10));
    group.bench_function("lambda_streams", |b| {
        b.iter(|| KafkaEvent::decode(black_box(&json)).unwrap())
    });
    group.bench_function("lambda_streams_one_thread", |b| {
        b.iter(|| KafkaEvent::decode_with_threads(black_box(&json), 1).unwrap())
    });
    group.bench_function("naive_rust", |b| {
        b.iter(|| naive_decode(black_box(&json)).unwrap())
    });
    group.finish();

    let values = values();
    assert_eq!(json_serde_json(&values), json_lambda_streams(&values));
    let mut group = c.benchmark_group("json");
    group.throughput(Throughput::BytesDecimal(
        values.iter().map(|v| v.len() as u64).sum(),
    ));
    group.sampling_mode(SamplingMode::Flat);
    group.sample_size(20);
    group.measurement_time(std::time::Duration::from_secs(5));
    group.bench_function("serde_json", |b| {
        b.iter(|| json_serde_json(black_box(&values)))
    });
    group.bench_function("lambda_streams", |b| {
        b.iter(|| json_lambda_streams(black_box(&values)))
    });
    group.finish();

    #[cfg(feature = "avro")]
    avro_bench::run(c);
}

/// The Avro decode rows (see the module docs).
#[cfg(feature = "avro")]
mod avro_bench {
    use std::hint::black_box;
    use std::sync::Arc;

    use apache_avro::reader::datum::GenericDatumReader;
    use apache_avro::writer::datum::GenericDatumWriter;
    use criterion::{Criterion, SamplingMode, Throughput};
    use lambda_streams::serdes::Serde;
    use lambda_streams::serdes::schema::{
        Avro, OfflineSchemas, SchemaId, SchemaType, Side, Subject,
    };

    const SCHEMA: &str = r#"{"type":"record","name":"Order","namespace":"shop","fields":[
        {"name":"order_id","type":"long"},{"name":"customer","type":"string"},
        {"name":"item","type":"string"},{"name":"qty","type":"int"},
        {"name":"price","type":"double"},
        {"name":"coupon","type":["null","string"],"default":null}]}"#;

    #[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Order {
        order_id: i64,
        customer: String,
        item: String,
        qty: i32,
        price: f64,
        coupon: Option<String>,
    }

    fn serde() -> Avro<Order> {
        let subject = Subject::topic("orders", Side::Value);
        let schemas = OfflineSchemas::new().with(
            SchemaId::Confluent(1),
            subject.clone(),
            SchemaType::Avro,
            SCHEMA,
        );
        Avro::new(SCHEMA, Arc::new(schemas), subject).expect("schema")
    }

    fn records(serde: &Avro<Order>) -> Vec<Vec<u8>> {
        (0..10_000)
            .map(|i| {
                let order = Order {
                    order_id: 1_000_000 + i,
                    customer: format!("customer-{}", i % 977),
                    item: format!("item-{}", i % 131),
                    qty: (i % 7) as i32 + 1,
                    price: (i % 100) as f64 * 0.25,
                    coupon: (i % 3 == 0).then(|| "WINTER".to_owned()),
                };
                serde
                    .try_serialize(&order)
                    .expect("encodes")
                    .expect("not null")
            })
            .collect()
    }

    fn ours(serde: &Avro<Order>, records: &[Vec<u8>]) -> i64 {
        records
            .iter()
            .map(|r| i64::from(serde.deserialize(Some(r)).expect("decodes").qty))
            .sum()
    }

    /// `apache_avro` used well: the schema parsed and the reader built once, each record
    /// read into a `Value`, checked against the schema and turned into the type (what
    /// `Avro<T>` does where its direct read gives up).
    fn generic(reader: &GenericDatumReader<'_>, records: &[Vec<u8>]) -> Vec<Order> {
        records
            .iter()
            .map(|r| {
                let value = reader.read_value(&mut &r[5..]).expect("decodes");
                assert!(value.validate(reader_schema()));
                apache_avro::from_value(&value).expect("fits")
            })
            .collect()
    }

    fn reader_schema() -> &'static apache_avro::Schema {
        static SCHEMA_PARSED: std::sync::OnceLock<apache_avro::Schema> = std::sync::OnceLock::new();
        SCHEMA_PARSED.get_or_init(|| apache_avro::Schema::parse_str(SCHEMA).expect("schema"))
    }

    /// The orders written by the serde (header and value), bytes in all.
    fn write_ours(serde: &Avro<Order>, orders: &[Order]) -> usize {
        orders
            .iter()
            .map(|o| {
                serde
                    .try_serialize(o)
                    .expect("encodes")
                    .map_or(0, |b| b.len())
            })
            .sum()
    }

    /// An order written by `apache_avro` with the writer built once: `to_value`, the
    /// resolution to the schema, the writer (what `Avro<T>` does where its direct write
    /// gives up), after the header.
    fn write_generic_one(writer: &GenericDatumWriter<'_>, order: &Order) -> Vec<u8> {
        let value = apache_avro::to_value(order).expect("a value");
        let value = value.resolve(reader_schema()).expect("resolves");
        let mut out = vec![0, 0, 0, 0, 1];
        writer.write_value_ref(&mut out, &value).expect("writes");
        out
    }

    /// The orders written by [`write_generic_one`], bytes in all.
    fn write_generic(writer: &GenericDatumWriter<'_>, orders: &[Order]) -> usize {
        orders
            .iter()
            .map(|o| write_generic_one(writer, o).len())
            .sum()
    }

    #[allow(deprecated)]
    fn naive(records: &[Vec<u8>]) -> i64 {
        records
            .iter()
            .map(|r| {
                let schema = apache_avro::Schema::parse_str(SCHEMA).expect("schema");
                let value =
                    apache_avro::from_avro_datum(&schema, &mut &r[5..], None).expect("decodes");
                let order: Order = apache_avro::from_value(&value).expect("fits");
                i64::from(order.qty)
            })
            .sum()
    }

    pub fn run(c: &mut Criterion) {
        let serde = serde();
        let records = records(&serde);
        let bytes: usize = records.iter().map(Vec::len).sum();
        assert_eq!(ours(&serde, &records), naive(&records));
        let reader = GenericDatumReader::builder(reader_schema())
            .build()
            .expect("reader");
        // The same orders both ways (dropped before measuring).
        {
            let decoded: Vec<Order> = records
                .iter()
                .map(|r| serde.deserialize(Some(r)).expect("decodes"))
                .collect();
            assert_eq!(decoded, generic(&reader, &records));
        }
        eprintln!("avro: {} records, {bytes} bytes", records.len());
        let mut group = c.benchmark_group("avro");
        group.throughput(Throughput::BytesDecimal(bytes as u64));
        group.sampling_mode(SamplingMode::Flat);
        group.sample_size(20);
        group.measurement_time(std::time::Duration::from_secs(10));
        group.bench_function("lambda_streams", |b| {
            b.iter(|| ours(&serde, black_box(&records)))
        });
        group.bench_function("apache_avro_cached", |b| {
            b.iter(|| generic(&reader, black_box(&records)))
        });
        group.bench_function("naive_apache_avro", |b| {
            b.iter(|| naive(black_box(&records)))
        });
        group.finish();

        let orders: Vec<Order> = records
            .iter()
            .map(|r| serde.deserialize(Some(r)).expect("decodes"))
            .collect();
        let writer = GenericDatumWriter::builder(reader_schema())
            .build()
            .expect("writer");
        // The same bytes both ways.
        for order in &orders {
            assert_eq!(
                serde.try_serialize(order).expect("encodes"),
                Some(write_generic_one(&writer, order))
            );
        }
        let mut group = c.benchmark_group("avro_write");
        group.throughput(Throughput::BytesDecimal(bytes as u64));
        group.sampling_mode(SamplingMode::Flat);
        group.sample_size(20);
        group.measurement_time(std::time::Duration::from_secs(10));
        group.bench_function("lambda_streams", |b| {
            b.iter(|| write_ours(&serde, black_box(&orders)))
        });
        group.bench_function("apache_avro_cached", |b| {
            b.iter(|| write_generic(&writer, black_box(&orders)))
        });
        group.finish();
    }
}

criterion_group!(handler, benches);

pub(crate) fn main() {
    if let Some(path) = std::env::var_os("LAMBDA_STREAMS_BENCH_WRITE_EVENT") {
        let json = event().to_json();
        std::fs::write(&path, &json).unwrap();
        eprintln!("wrote {} bytes to {}", json.len(), path.to_string_lossy());
        return;
    }
    if let Some(loops) = std::env::var_os("LAMBDA_STREAMS_BENCH_LOOPS") {
        let loops: usize = loops.to_string_lossy().parse().unwrap();
        let what = std::env::var("LAMBDA_STREAMS_BENCH_WHAT").unwrap_or_else(|_| "decode".into());
        let json = match std::env::var_os("LAMBDA_STREAMS_BENCH_EVENT") {
            Some(path) => std::fs::read(path).unwrap(),
            None => event().to_json(),
        };
        let (topology, six, rt) = (topology(), topology_six(), runtime());
        let borrowed = topology_borrowed();
        let values = values();
        let mut n = 0;
        for _ in 0..loops {
            n += match what.as_str() {
                "decode/lambda_streams" | "decode" => {
                    KafkaEvent::decode(black_box(&json)).unwrap().record_count()
                }
                "decode/lambda_streams_one_thread" => {
                    KafkaEvent::decode_with_threads(black_box(&json), 1)
                        .unwrap()
                        .record_count()
                }
                "decode/naive_rust" => naive_decode(black_box(&json)).unwrap().len(),
                "handler/lambda_streams" => {
                    // The outputs are counted, not cloned out of the sink: the same work
                    // as the criterion run and the naive path (which drops its outputs).
                    lambda_streams_handler(&rt, &topology, black_box(&json)).1 as usize
                }
                "handler/lambda_streams_six" => {
                    lambda_streams_handler(&rt, &six, black_box(&json)).1 as usize
                }
                "handler/lambda_streams_six_one_thread" => {
                    lambda_streams_handler_one_thread(&rt, &six, black_box(&json)).1 as usize
                }
                "handler/lambda_streams_six_overlap" => {
                    lambda_streams_handler_overlap(&rt, &six, black_box(&json)).1 as usize
                }
                "handler/lambda_streams_borrowed" => {
                    lambda_streams_handler(&rt, &borrowed, black_box(&json)).1 as usize
                }
                "handler/naive_rust" => naive_handler(black_box(&json)).unwrap().len(),
                "json/serde_json" => json_serde_json(black_box(&values)),
                "json/lambda_streams" => json_lambda_streams(black_box(&values)),
                other => panic!("unknown LAMBDA_STREAMS_BENCH_WHAT {other}"),
            };
        }
        eprintln!("{what}: {n}");
        return;
    }
    handler();
    criterion::Criterion::default()
        .configure_from_args()
        .final_summary();
}
