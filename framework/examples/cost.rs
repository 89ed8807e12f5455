//! Cost per record (issue 7, item 3): count by key through `Topology::process` with the real
//! `DynamoStore` on the dynoxide emulator, for several batch sizes, key counts and both
//! guarantees. Reports DynamoDB write requests and write units per 1,000 records against the
//! floor (distinct items touched per batch), the cost of a redelivered batch, the handler
//! time, and dollars per million records at published prices.
//!
//! ```sh
//! scripts/services up      # dynoxide on 127.0.0.1:8000 (and Kafka, unused here)
//! cargo run --release -p lambda-streams --example cost -- \
//!     [--records 20000] [--batches 100,1000,10000] [--keys 100,10000,1000000] \
//!     [--guarantees exactly_once,at_least_once] [--json bench/results/cost.json] \
//!     [--skip-memory]   # no in-memory pass per batch: only the DynamoDB path (for profiling)
//!     [--client lean|sdk]   # the store's write path: its LeanClient (default, as in Lambda) or the AWS SDK
//! cargo run --release -p lambda-streams --example cost -- --create-table NAME   # and exit
//! ```
//!
//! Environment: `LAMBDA_STREAMS_DYNAMODB_ENDPOINT` (default `http://127.0.0.1:8000`).
//!
//! Write units: the store sums the `ConsumedCapacity` of successful writes (dynoxide returns
//! it); a refused conditional write is billed by DynamoDB too, but its error carries no
//! capacity, so it is counted from the item's size per DynamoDB's rules (one write unit per
//! started KB of the larger of the item before and after). Units are also computed from
//! item sizes for every request, as a cross-check.

#![allow(missing_docs, clippy::unwrap_used)]

use std::collections::HashMap;
use std::time::Instant;

use aws_sdk_dynamodb::types::AttributeValue;
use lambda_streams::event::{EventSource, KafkaEvent, PartitionRecords, Record};
use lambda_streams::event::{TimestampType, TopicPartition};
use lambda_streams::serdes::{Bytes, DecimalI64, Utf8};
use lambda_streams::sink::MemorySink;
use lambda_streams::state::dynamodb::{
    DynamoStore, create_table, emulator_client, emulator_lean_client,
};
use lambda_streams::state::memory::MemoryStore;
use lambda_streams::state::{Guarantee, WriteStats};
use lambda_streams::{StreamsBuilder, Topology};

const TOPIC: &str = "events";
const PARTITIONS: i32 = 4;
const STORE: &str = "counts";

/// Published prices (us-east-1), as stated in BENCHMARKS.md.
const DYNAMODB_WRU_USD: f64 = 0.625 / 1e6;
const LAMBDA_REQUEST_USD: f64 = 0.20 / 1e6;
const LAMBDA_ARM_GB_S_USD: f64 = 0.000_013_333_4;
/// Lambda gives one full vCPU at 1,769 MB (CPU is proportional to memory below that), so
/// CPU-bound time costs the same GB-s at any size up to 1,769 MB: 1.769 GB x time on a core.
const ONE_VCPU_GB: f64 = 1.769;
/// The smallest Lambda memory size (GB), billed while waiting on DynamoDB.
const MIN_MEMORY_GB: f64 = 0.125;
/// Assumed DynamoDB `UpdateItem` latency in the same region (not measured here).
const ASSUMED_DYNAMODB_LATENCY_S: f64 = 0.005;
/// The store's concurrent writes per batch (`WRITE_CONCURRENCY` in the runtime).
const WRITE_CONCURRENCY: f64 = 32.0;

/// splitmix64: the same keys on every run.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

fn topology() -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream(TOPIC, Utf8, Bytes)
        .group_by_key(Utf8)
        .count(STORE)
        .to_stream()
        .to("counts-out", Utf8, DecimalI64);
    builder.build()
}

/// Batch `index` of `size` records (spread over the partitions, offsets continuing from the
/// previous batches) with keys drawn uniformly from `keys`, as event JSON.
fn batch(g: &mut Gen, index: usize, size: usize, keys: u64) -> Vec<u8> {
    let per_partition = size / PARTITIONS as usize;
    let partitions = (0..PARTITIONS)
        .map(|p| PartitionRecords {
            tp: TopicPartition::new(TOPIC, p),
            records: (0..per_partition)
                .map(|i| {
                    let offset = (index * per_partition + i) as i64;
                    Record {
                        offset,
                        timestamp: 1_764_460_800_000 + offset,
                        timestamp_type: TimestampType::CreateTime,
                        key: Some(format!("key-{:07}", g.next() % keys).into()),
                        value: Some(lambda_streams::event::Bytes::from_static(b"{\"clicks\":1}")),
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
        bootstrap_servers: "127.0.0.1:9092".to_owned(),
        partitions,
    }
    .to_json()
}

/// An attribute value's size per DynamoDB's rules (numbers: about 1 byte per 2 significant
/// digits + 1; strings and binaries: their length).
fn value_size(v: &AttributeValue) -> usize {
    match v {
        AttributeValue::S(s) => s.len(),
        AttributeValue::B(b) => b.as_ref().len(),
        AttributeValue::N(n) => {
            let digits = n
                .trim_start_matches('-')
                .replace('.', "")
                .trim_start_matches('0')
                .trim_end_matches('0')
                .len();
            digits.div_ceil(2) + 1
        }
        AttributeValue::Bool(_) | AttributeValue::Null(_) => 1,
        _ => 1024, // not used by the store: count it as a whole KB
    }
}

fn item_size(item: &HashMap<String, AttributeValue>) -> usize {
    item.iter().map(|(k, v)| k.len() + value_size(v)).sum()
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

struct Args {
    records: usize,
    batches: Vec<usize>,
    keys: Vec<u64>,
    guarantees: Vec<Guarantee>,
    skip_memory: bool,
    json: Option<String>,
    create_table: Option<String>,
    lean: bool,
}

fn list<T: std::str::FromStr>(s: &str) -> Vec<T> {
    s.split(',')
        .map(|x| x.trim().replace('_', "").parse().ok().unwrap())
        .collect()
}

fn args() -> Args {
    let mut a = Args {
        records: 20_000,
        batches: vec![100, 1_000, 10_000],
        keys: vec![100, 10_000],
        guarantees: vec![Guarantee::ExactlyOnce, Guarantee::AtLeastOnce],
        skip_memory: false,
        json: None,
        create_table: None,
        lean: true,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut it = argv.iter();
    while let Some(flag) = it.next() {
        if flag == "--skip-memory" {
            a.skip_memory = true;
            continue;
        }
        let value = it.next().map(String::as_str).unwrap_or_default();
        match flag.as_str() {
            "--records" => a.records = value.replace('_', "").parse().unwrap(),
            "--batches" => a.batches = list(value),
            "--keys" => a.keys = list(value),
            "--guarantees" => {
                a.guarantees = value
                    .split(',')
                    .map(|g| match g.trim() {
                        "exactly_once" | "eo" => Guarantee::ExactlyOnce,
                        "at_least_once" | "alo" => Guarantee::AtLeastOnce,
                        other => panic!("unknown guarantee {other}"),
                    })
                    .collect();
            }
            "--json" => a.json = Some(value.to_owned()),
            "--create-table" => a.create_table = Some(value.to_owned()),
            "--client" => {
                a.lean = match value {
                    "sdk" => false,
                    "lean" => true,
                    other => panic!("unknown client {other} (sdk or lean)"),
                }
            }
            other => panic!("unknown argument {other}"),
        }
    }
    a
}

#[derive(Default)]
struct Run {
    batches: usize,
    records: u64,
    items_touched: u64,
    state: WriteStats,
    batch_ms: Vec<f64>,
    cpu_ms: Vec<f64>,
    redelivery: WriteStats,
    redelivery_ms: f64,
    redelivery_items: u64,
    max_item_bytes: usize,
}

async fn run(
    client: &aws_sdk_dynamodb::Client,
    guarantee: Guarantee,
    size: usize,
    keys: u64,
    total: usize,
    skip_memory: bool,
    lean: Option<&str>,
) -> Run {
    let g_name = match guarantee {
        Guarantee::ExactlyOnce => "eo",
        Guarantee::AtLeastOnce => "alo",
    };
    let table = format!("cost-{}-{g_name}-{size}-{keys}", std::process::id());
    create_table(client, &table).await.unwrap();
    let store = DynamoStore::new(client.clone(), &table, guarantee);
    let store = match lean {
        Some(endpoint) => store.with_lean_client(emulator_lean_client(endpoint).unwrap()),
        None => store,
    };
    let topology = topology();
    let mut g = Gen(keys ^ size as u64);
    let mut out = Run::default();
    let mut last = Vec::new();
    for index in 0..total.div_ceil(size) {
        let json = batch(&mut g, index, size, keys);
        if !skip_memory {
            // The CPU part alone: decode + process with the in-memory store.
            let started = Instant::now();
            let event = KafkaEvent::decode(&json).unwrap();
            topology
                .process(&event, &MemoryStore::new(), &MemorySink::new())
                .await
                .unwrap();
            out.cpu_ms.push(started.elapsed().as_secs_f64() * 1e3);
        }
        // The real thing: decode + process with DynamoDB.
        let started = Instant::now();
        let event = KafkaEvent::decode(&json).unwrap();
        let report = topology
            .process(&event, &store, &MemorySink::new())
            .await
            .unwrap();
        out.batch_ms.push(started.elapsed().as_secs_f64() * 1e3);
        out.batches += 1;
        out.records += report.records_in;
        out.items_touched += report.items_touched;
        out.state.add(&report.state);
        last = json;
    }
    // The last batch delivered again (as Lambda does after a failed invocation).
    let started = Instant::now();
    let event = KafkaEvent::decode(&last).unwrap();
    let report = topology
        .process(&event, &store, &MemorySink::new())
        .await
        .unwrap();
    out.redelivery_ms = started.elapsed().as_secs_f64() * 1e3;
    out.redelivery = report.state;
    out.redelivery_items = report.items_touched;
    // Item sizes, for write units: the largest item stored (all are alike).
    let mut pages = client.scan().table_name(&table).into_paginator().send();
    while let Some(page) = pages.next().await {
        for item in page.unwrap().items() {
            out.max_item_bytes = out.max_item_bytes.max(item_size(item));
        }
    }
    let _ = client.delete_table().table_name(&table).send().await;
    out
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args = args();
    let endpoint = std::env::var("LAMBDA_STREAMS_DYNAMODB_ENDPOINT")
        .unwrap_or_else(|_| "http://127.0.0.1:8000".to_owned());
    let client = emulator_client(&endpoint);
    if let Some(table) = args.create_table {
        // Only create a state table (for bench/run --size) and exit.
        create_table(&client, &table).await.unwrap();
        eprintln!("cost: table {table} exists");
        return;
    }
    let started = Instant::now();
    let mut rows = Vec::new();
    println!(
        "| guarantee | batch | keys | requests / 1k rec | WRU / 1k rec | floor (items) / 1k rec | requests / floor | cond. failures | redelivery: requests / batch (items) | batch median (dynoxide) | CPU median (memory store) | $ / M records |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for &keys in &args.keys {
        for &size in &args.batches {
            for &guarantee in &args.guarantees {
                let total = args.records.max(size);
                let t = Instant::now();
                let lean = args.lean.then_some(endpoint.as_str());
                let r = run(
                    &client,
                    guarantee,
                    size,
                    keys,
                    total,
                    args.skip_memory,
                    lean,
                )
                .await;
                let wall = t.elapsed();
                let per_k = |x: f64| x * 1000.0 / r.records as f64;
                // Units: reported by the service, else from item sizes (1 per started KB).
                // A refused conditional write is billed too (by the item's size), but its
                // error carries no ConsumedCapacity: count it from the item size.
                let per_request = r.max_item_bytes.div_ceil(1024).max(1) as f64;
                let wru_from_sizes = r.state.requests as f64 * per_request;
                let (wru, units_source) = if r.state.consumed_write_units > 0.0 {
                    (
                        r.state.consumed_write_units
                            + r.state.conditional_failures as f64 * per_request,
                        "ConsumedCapacity of successful writes + item size of refused ones",
                    )
                } else {
                    (wru_from_sizes, "item sizes (no ConsumedCapacity returned)")
                };
                let floor = r.items_touched as f64;
                let batch_ms = median(r.batch_ms.clone());
                let cpu_ms = median(r.cpu_ms.clone());
                let requests_per_batch = r.state.requests as f64 / r.batches as f64;
                // Dollars per million records.
                let batches_per_m = 1e6 / size as f64;
                let usd_dynamodb = wru / r.records as f64 * 1e6 * DYNAMODB_WRU_USD;
                let usd_requests = batches_per_m * LAMBDA_REQUEST_USD;
                let cpu_s = (cpu_ms / 1e3).max(0.001);
                let wait_s =
                    (requests_per_batch / WRITE_CONCURRENCY).ceil() * ASSUMED_DYNAMODB_LATENCY_S;
                let usd_duration = batches_per_m
                    * LAMBDA_ARM_GB_S_USD
                    * (ONE_VCPU_GB * cpu_s + MIN_MEMORY_GB * wait_s);
                let usd_total = usd_dynamodb + usd_requests + usd_duration;
                let g = match guarantee {
                    Guarantee::ExactlyOnce => "exactly_once",
                    Guarantee::AtLeastOnce => "at_least_once",
                };
                println!(
                    "| {g} | {size} | {keys} | {:.1} | {:.1} | {:.1} | {:.2} | {} | {} ({}) | {:.1} ms | {:.1} ms | {:.3} |",
                    per_k(r.state.requests as f64),
                    per_k(wru),
                    per_k(floor),
                    r.state.requests as f64 / floor,
                    r.state.conditional_failures,
                    r.redelivery.requests,
                    r.redelivery_items,
                    batch_ms,
                    cpu_ms,
                    usd_total,
                );
                rows.push(serde_json::json!({
                    "guarantee": g,
                    "batch_size": size,
                    "keys": keys,
                    "batches": r.batches,
                    "records": r.records,
                    "items_touched": r.items_touched,
                    "requests": r.state.requests,
                    "conditional_failures": r.state.conditional_failures,
                    "retries": r.state.retries,
                    "consumed_write_units_reported": r.state.consumed_write_units,
                    "write_units": wru,
                    "write_units_source": units_source,
                    "write_units_from_item_sizes": wru_from_sizes,
                    "max_item_bytes": r.max_item_bytes,
                    "per_1000_records": {
                        "requests": per_k(r.state.requests as f64),
                        "write_units": per_k(wru),
                        "floor_items_touched": per_k(floor),
                    },
                    "requests_over_floor": r.state.requests as f64 / floor,
                    "redelivery": {
                        "requests": r.redelivery.requests,
                        "conditional_failures": r.redelivery.conditional_failures,
                        "write_units_reported": r.redelivery.consumed_write_units,
                        "write_units": r.redelivery.consumed_write_units
                            + r.redelivery.conditional_failures as f64 * per_request,
                        "ms": r.redelivery_ms,
                    },
                    "batch_ms_median_dynoxide": batch_ms,
                    "cpu_ms_median_memory_store": cpu_ms,
                    "usd_per_million_records": {
                        "dynamodb_writes": usd_dynamodb,
                        "lambda_requests": usd_requests,
                        "lambda_duration": usd_duration,
                        "total": usd_total,
                    },
                    "wall_s": wall.as_secs_f64(),
                }));
                eprintln!(
                    "cost: {g} batch {size} keys {keys}: {} records, {} requests (+{} redelivered) in {:.1} s",
                    r.records,
                    r.state.requests,
                    r.redelivery.requests,
                    wall.as_secs_f64()
                );
            }
        }
    }
    let out = serde_json::json!({
        "benchmark": "cost per record (issue 7, item 3): count by key, DynamoStore on dynoxide",
        "endpoint": endpoint,
        "records_per_configuration": args.records,
        "partitions": PARTITIONS,
        "prices_usd": {
            "dynamodb_on_demand_per_million_wru_us_east_1": DYNAMODB_WRU_USD * 1e6,
            "lambda_per_million_requests": LAMBDA_REQUEST_USD * 1e6,
            "lambda_arm64_per_gb_s": LAMBDA_ARM_GB_S_USD,
        },
        "duration_model": {
            "cpu": "decode + process with MemoryStore, median per batch, billed at 1.769 GB (one vCPU; GB-s of CPU-bound work is the same at any smaller size)",
            "dynamodb_wait_s_per_round": ASSUMED_DYNAMODB_LATENCY_S,
            "write_concurrency": WRITE_CONCURRENCY,
            "wait_billed_gb": MIN_MEMORY_GB,
        },
        "total_wall_s": started.elapsed().as_secs_f64(),
        "results": rows,
    });
    if let Some(path) = args.json {
        std::fs::write(&path, serde_json::to_string_pretty(&out).unwrap() + "\n").unwrap();
        eprintln!("cost: wrote {path}");
    }
}
