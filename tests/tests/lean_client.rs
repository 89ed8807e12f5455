//! The DynamoDB store's lean request path (`LeanClient`) against the dynoxide emulator:
//! the same batches (first deliveries, a redelivery, a retry with other boundaries, a
//! zombie's late batch) written through the AWS SDK and through the lean client must leave
//! the same items and cost the same requests, conditional failures and write units; and its
//! failures (an unreachable endpoint, a missing table) are errors naming what failed.
//! Expected counts come from the input log, not from either store.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use aws_credential_types::provider::SharedCredentialsProvider;
use aws_sdk_dynamodb::types::AttributeValue;
use lambda_streams::aws::{TlsRoots, static_credentials};
use lambda_streams::dsl::{EmitStrategy, Grouped, TimeWindows};
use lambda_streams::serdes::{DecimalI64, Json, Unit, Utf8};
use lambda_streams::sink::MemorySink;
use lambda_streams::state::WriteStats;
use lambda_streams::state::dynamodb::{
    DynamoStore, LeanClient, RetrySettings, STREAM_TIME_KEY, create_table, emulator_lean_client,
};
use lambda_streams::{Guarantee, StreamsBuilder, Topology};
use lambda_streams_e2e::*;

const TOPIC: &str = "lean-events";
const BASE_TIME: i64 = 1_764_460_800_000;

/// A count (the additive fast path), a general aggregate (read-modify-write with the
/// cache) and an emit-on-close window (the closing index and its pass, and the clock) of
/// the same records.
fn topology() -> Topology {
    let builder = StreamsBuilder::new();
    let words = builder.stream(TOPIC, Unit, Utf8);
    words
        .group_by(|_, v: &String| v.clone(), Grouped::direct(Utf8))
        .count("counts")
        .to_stream()
        .to("lean-counts", Utf8, DecimalI64);
    words
        .group_by(|_, v: &String| v.clone(), Grouped::direct(Utf8))
        .aggregate(
            "seen",
            Vec::new,
            |_, v: String, mut seen: Vec<String>| {
                seen.push(v);
                seen.sort();
                seen
            },
            Json::<Vec<String>>::default(),
        )
        .to_stream()
        .to("lean-seen", Utf8, Json::<Vec<String>>::default());
    words
        .group_by(|_, v: &String| v.clone(), Grouped::direct(Utf8))
        .windowed_by(
            TimeWindows::of_size(Duration::from_millis(20)).grace(Duration::from_millis(5)),
        )
        .emit_strategy(EmitStrategy::OnWindowClose)
        .count("windows")
        .to_stream()
        .map(|w, n| (format!("{}@{}", w.key, w.start), n))
        .to("lean-windows", Utf8, DecimalI64);
    builder.build()
}

fn value(p: usize, o: usize) -> String {
    format!("k{}", (p * 7 + o * 3) % 11)
}

/// The batches: first deliveries over two partitions, the second batch delivered again, a
/// retry of the third with other boundaries, then an old range (a zombie's) again.
const SCHEDULE: &[&[(usize, usize, usize)]] = &[
    &[(0, 0, 40), (1, 0, 25)],
    &[(0, 40, 90), (1, 25, 60)],
    &[(0, 40, 90), (1, 25, 60)],
    &[(0, 90, 120)],
    &[(0, 85, 140), (1, 60, 100)],
    &[(0, 0, 40)],
    &[(0, 140, 200), (1, 100, 160)],
];

fn truth() -> BTreeMap<String, i64> {
    let mut counts = BTreeMap::new();
    for (p, hi) in [(0, 200), (1, 160)] {
        for o in 0..hi {
            *counts.entry(value(p, o)).or_insert(0) += 1;
        }
    }
    counts
}

async fn run(store: &DynamoStore) -> WriteStats {
    let topology = topology();
    let mut stats = WriteStats::default();
    for batch in SCHEDULE {
        let event = log_event(TOPIC, BASE_TIME, batch, |p, o| value(p, o).into_bytes());
        let report = topology
            .process(&event, store, &MemorySink::new())
            .await
            .expect("the batch");
        stats.add(&report.state);
    }
    stats
}

/// Every item of `table`, as raw attributes (the store-independent view), without the
/// stream-time clock's item (it holds wall-clock times) and `ttl` (computed from the wall
/// clock).
async fn items(table: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    let client = dynamo_client();
    let mut out = BTreeMap::new();
    let mut pages = client.scan().table_name(table).into_paginator().send();
    while let Some(page) = pages.next().await {
        for item in page.unwrap().items() {
            let pk = match (&item["pk"], &item["sk"]) {
                (AttributeValue::S(pk), AttributeValue::N(sk)) => format!("{pk}/{sk}"),
                other => panic!("{other:?}"),
            };
            if pk.starts_with(STREAM_TIME_KEY) {
                continue;
            }
            let attributes = item
                .iter()
                .filter(|(name, _)| name.as_str() != "ttl")
                .map(|(name, v)| (name.clone(), format!("{v:?}")))
                .collect();
            out.insert(pk, attributes);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lean_client_writes_what_the_sdk_writes() {
    require_services();
    let client = dynamo_client();
    let (sdk_table, lean_table) = (unique("lean-sdk"), unique("lean-lean"));
    create_table(&client, &sdk_table).await.unwrap();
    create_table(&client, &lean_table).await.unwrap();
    let sdk = DynamoStore::new(client.clone(), &sdk_table, Guarantee::ExactlyOnce);
    let lean = DynamoStore::new(client.clone(), &lean_table, Guarantee::ExactlyOnce)
        .with_lean_client(emulator_lean_client(&dynamo_endpoint()).unwrap());
    assert!(lean.uses_lean_client() && !sdk.uses_lean_client());
    let sdk_stats = run(&sdk).await;
    let lean_stats = run(&lean).await;
    assert!(
        sdk_stats.conditional_failures > 0,
        "the schedule provokes refusals"
    );
    assert_eq!(
        lean_stats, sdk_stats,
        "requests, refusals, retries, write units"
    );
    let counts = table_counts(&lean_table, "counts").await;
    assert_eq!(counts, truth(), "the lean store's counts equal the log's");
    assert_eq!(table_counts(&sdk_table, "counts").await, truth());
    let (sdk_items, lean_items) = (items(&sdk_table).await, items(&lean_table).await);
    assert!(sdk_items.len() > truth().len());
    assert_eq!(
        lean_items, sdk_items,
        "the same items, attribute for attribute"
    );
}

#[tokio::test]
async fn an_unreachable_endpoint_fails_the_batch_naming_the_store_and_the_endpoint() {
    let client = dynamo_client();
    // A port nothing listens on.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let credentials =
        SharedCredentialsProvider::new(static_credentials("lean", "lean", "lean-test"));
    let retry = RetrySettings {
        max_attempts: 2,
        ..RetrySettings::default()
    };
    let lean = LeanClient::new(
        &endpoint,
        "us-east-1",
        credentials,
        TlsRoots::Compiled,
        retry,
    )
    .expect("a client");
    let store = DynamoStore::new(client, "no-table", Guarantee::ExactlyOnce).with_lean_client(lean);
    let event = log_event(TOPIC, BASE_TIME, &[(0, 0, 3)], |p, o| {
        value(p, o).into_bytes()
    });
    // A count alone: its first request is a state write (windows read the clock first).
    let builder = StreamsBuilder::new();
    builder
        .stream(TOPIC, Unit, Utf8)
        .group_by(|_, v: &String| v.clone(), Grouped::direct(Utf8))
        .count("counts")
        .to_stream()
        .to("lean-counts", Utf8, DecimalI64);
    let error = builder
        .build()
        .process(&event, &store, &MemorySink::new())
        .await
        .expect_err("no endpoint");
    let text = error.to_string();
    assert!(
        text.contains(&format!("DynamoDB request to {endpoint}/ failed"))
            && text.contains("\"counts\""),
        "{text}"
    );
}

#[tokio::test]
async fn a_missing_table_is_the_services_error_named() {
    require_services();
    let store = DynamoStore::new(
        dynamo_client(),
        unique("lean-missing"),
        Guarantee::ExactlyOnce,
    )
    .with_shared_lean_client(Arc::new(emulator_lean_client(&dynamo_endpoint()).unwrap()));
    let event = log_event(TOPIC, BASE_TIME, &[(0, 0, 3)], |p, o| {
        value(p, o).into_bytes()
    });
    let error = topology()
        .process(&event, &store, &MemorySink::new())
        .await
        .expect_err("no table");
    let text = error.to_string();
    assert!(text.contains("ResourceNotFoundException"), "{text}");
}

#[test]
fn endpoints_are_checked() {
    let credentials =
        SharedCredentialsProvider::new(static_credentials("lean", "lean", "lean-test"));
    for bad in ["ftp://127.0.0.1:8000", "not a uri", "/path-only"] {
        let error = LeanClient::new(
            bad,
            "us-east-1",
            credentials.clone(),
            TlsRoots::Compiled,
            RetrySettings::default(),
        )
        .expect_err(bad);
        assert!(error.contains("DynamoDB endpoint"), "{bad}: {error}");
    }
}
