//! A source read through a borrowed view, end to end: JSON page views whose text fields
//! borrow from the record's bytes (`serdes::json::from_slice` into `Cow<str>` fields, some
//! of them escaped and so owned) inside a `ReadWith` serde that keeps the device of the
//! engaged views only, counted per device in DynamoDB on the emulator, through the local
//! runner on the real broker with duplicate deliveries and longer retries injected. The
//! counts in the table and on the output topic equal those computed here with `serde_json`
//! into an owned struct.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use lambda_streams::dsl::Grouped;
use lambda_streams::lambda::Handler;
use lambda_streams::serdes::{DecimalI64, Nullable, ReadWith, Unit, Utf8, json};
use lambda_streams::{StreamsBuilder, Topology};
use lambda_streams_e2e::*;
use serde::{Deserialize, Serialize};

const PARTITIONS: i32 = 3;
const STORE: &str = "engaged-by-device";
const ENGAGED_MS: u32 = 30_000;

/// A page view as produced, and as the reference reads it (owned text).
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PageView {
    user_id: String,
    url: String,
    device: String,
    duration_ms: u32,
}

/// The same value as the topology reads it: text borrowed from the record's bytes.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PageViewRef<'a> {
    #[serde(borrow)]
    url: Cow<'a, str>,
    #[serde(borrow)]
    device: Cow<'a, str>,
    duration_ms: u32,
}

/// Engaged views counted per device; the source's serde reads the borrowed view and keeps
/// the device of an engaged view only.
fn topology(input: &str, output: &str) -> Topology {
    let engaged_device = ReadWith::new(
        |bytes: &[u8]| {
            let view: PageViewRef<'_> = json::from_slice(bytes)?;
            let engaged = view.duration_ms >= ENGAGED_MS && !view.url.is_empty();
            Ok(engaged.then(|| view.device.into_owned()))
        },
        Nullable(Utf8),
    );
    let builder = StreamsBuilder::new();
    builder
        .stream(input, Unit, engaged_device)
        .flat_map_values(|device| device)
        .group_by(|_, device| device.clone(), Grouped::direct(Utf8))
        .count(STORE)
        .to_stream()
        .to(output, Utf8, DecimalI64);
    builder.build()
}

/// Deterministic page views; some devices and URLs need escapes in JSON (a quote, a
/// backslash, a newline), so their `Cow` fields are owned, the others borrowed.
fn views(n: usize, seed: u64) -> Vec<String> {
    const DEVICES: &[&str] = &[
        "mobile",
        "desktop",
        "tab\"let",
        "tv\\box",
        "watch\nos",
        "désktop",
    ];
    let mut next = lcg(seed);
    (0..n)
        .map(|i| {
            let view = PageView {
                user_id: format!("user-{}", next() % 50),
                url: match next() % 4 {
                    0 => format!("/p/{i}?q=\"x\""),
                    _ => format!("/p/{}", next() % 20),
                },
                device: DEVICES[(next() % DEVICES.len() as u64) as usize].to_owned(),
                duration_ms: (next() % 60_000) as u32,
            };
            serde_json::to_string(&view).expect("JSON")
        })
        .collect()
}

/// The engaged views per device, read with `serde_json` into the owned struct.
fn reference(values: &[String]) -> BTreeMap<String, i64> {
    let mut counts = BTreeMap::new();
    for value in values {
        let view: PageView = serde_json::from_str(value).expect("a page view");
        if view.duration_ms >= ENGAGED_MS && !view.url.is_empty() {
            *counts.entry(view.device).or_default() += 1;
        }
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_borrowed_view_in_the_source_counts_exactly_once() {
    require_services();
    let input = new_topic("bj-views", PARTITIONS).await;
    let output = new_topic("bj-counts", PARTITIONS).await;
    let values = views(400, 17);
    produce_across_partitions(&input, &values, PARTITIONS).await;
    let expected = reference(&values);
    assert!(
        expected.keys().any(|d| d.contains(['"', '\\', '\n'])) && expected.contains_key("mobile"),
        "both escaped (owned) and plain (borrowed) devices are counted: {expected:?}"
    );

    let (table, store) = exactly_once_store("borrowed-json").await;
    let store = Arc::new(store);
    let handler = Handler::with_kafka_output(topology(&input, &output), store, None);
    run_with_redeliveries(
        handler,
        vec![input.clone()],
        "bj-group",
        23,
        Duration::from_secs(180),
    )
    .await;

    assert_eq!(table_counts(&table, STORE).await, expected, "the table");
    assert_eq!(
        emitted_counts(&output),
        expected,
        "the output topic, by version"
    );
}
