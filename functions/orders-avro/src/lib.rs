//! Avro orders summed per item and minute, on AWS Lambda.
//!
//! Reads Avro orders ([`Order`], schema [`ORDER_SCHEMA`]) written by a registry-aware
//! producer, and produces, per item and 1-minute tumbling window with 10 s of grace,
//! **once per window when it closes** ([`EmitStrategy::OnWindowClose`]), the window's
//! [`OrderTotal`] as Avro ([`ORDER_TOTAL_SCHEMA`], registered under `<output topic>-value`):
//!
//! | topic (default) | key | value (Avro) |
//! |---|---|---|
//! | `orders-avro` (in) | the item (UTF-8) | [`Order`]: item, quantity, optional coupon |
//! | `order-totals-avro` (out) | `<item>@<window start>` | [`OrderTotal`]: the item's orders and quantity in the window |
//!
//! Each record is decoded with its writer's schema, fetched by id from the registry once
//! per container, and resolved to [`ORDER_SCHEMA`]: an order written without `coupon` (an
//! older producer) reads as `coupon: None`. A record that does not decode is a poison
//! record naming its topic-partition, offset, schema id and subject (the function's poison
//! policy applies); a registry that cannot be reached fails the batch, to be delivered again.
//!
//! Environment: `ORDERS_AVRO_INPUT_TOPIC` (default `orders-avro`),
//! `ORDERS_AVRO_OUTPUT_TOPIC` (`order-totals-avro`), `LAMBDA_STREAMS_SCHEMA_REGISTRY_URL`
//! (required: a Confluent-compatible registry), `ORDERS_AVRO_INPUT_FORMAT`: how the event
//! source hands the records over: `confluent` (the default: no schema registry on the event
//! source mapping, the records as produced), `source` or `json` (the mapping's
//! `SchemaRegistryConfig` with `EventRecordFormat` SOURCE or JSON); plus the framework's
//! (`LAMBDA_STREAMS_TABLE`, `LAMBDA_STREAMS_SOURCE_PARTITIONS`, …; see
//! `lambda_streams::lambda`).

use std::sync::Arc;
use std::time::Duration;

use lambda_streams::config_env::env_or;
use lambda_streams::dsl::{EmitStrategy, TimeWindows};
use lambda_streams::serdes::schema::registry::RegistryClient;
use lambda_streams::serdes::schema::{Avro, SchemaSource, Side, Subject, WireFormat};
use lambda_streams::serdes::{Json, Utf8};
use lambda_streams::{StreamsBuilder, Topology};
use serde::{Deserialize, Serialize};

/// The store of the totals per item and window.
pub const STORE: &str = "orders-avro-totals";
/// The window size.
pub const WINDOW: Duration = Duration::from_secs(60);
/// How long after its end a window still accepts orders.
pub const GRACE: Duration = Duration::from_secs(10);

/// The reader's schema of the orders.
pub const ORDER_SCHEMA: &str = r#"{"type":"record","name":"Order","namespace":"shop","fields":[
  {"name":"item","type":"string"},
  {"name":"qty","type":"long"},
  {"name":"coupon","type":["null","string"],"default":null}]}"#;

/// The schema of the totals the function writes.
pub const ORDER_TOTAL_SCHEMA: &str = r#"{"type":"record","name":"OrderTotal","namespace":"shop","fields":[
  {"name":"item","type":"string"},
  {"name":"window_start","type":"long"},
  {"name":"window_end","type":"long"},
  {"name":"orders","type":"long"},
  {"name":"qty","type":"long"}]}"#;

/// One order, as read from the input topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Order {
    /// What was ordered.
    pub item: String,
    /// How many.
    pub qty: i64,
    /// A coupon code, if any (absent from older writers' schema).
    pub coupon: Option<String>,
}

/// An item's orders in one window (the output topic).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderTotal {
    /// The item.
    pub item: String,
    /// The window start, epoch ms (inclusive).
    pub window_start: i64,
    /// The window end, epoch ms (exclusive).
    pub window_end: i64,
    /// Orders in the window.
    pub orders: i64,
    /// Their quantity.
    pub qty: i64,
}

/// The running sum of one item's window (the store's value).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sum {
    /// Orders so far.
    pub orders: i64,
    /// Quantity so far.
    pub qty: i64,
}

/// The topology: orders from `input` in `format`, totals to `output`, schemas in `schemas`.
///
/// # Errors
///
/// Never for the compiled-in schemas (kept fallible for the serdes' constructors).
pub fn topology(
    input: &str,
    output: &str,
    format: WireFormat,
    schemas: Arc<dyn SchemaSource>,
) -> Result<Topology, String> {
    let orders = Avro::<Order>::new(
        ORDER_SCHEMA,
        schemas.clone(),
        Subject::topic(input, Side::Value),
    )
    .map_err(|e| e.0)?
    .input(format);
    let totals = Avro::<OrderTotal>::new(
        ORDER_TOTAL_SCHEMA,
        schemas,
        Subject::topic(output, Side::Value),
    )
    .map_err(|e| e.0)?;
    let builder = StreamsBuilder::new();
    builder
        .stream(input, Utf8, orders)
        .group_by_key(Utf8)
        .windowed_by(TimeWindows::of_size(WINDOW).grace(GRACE))
        .emit_strategy(EmitStrategy::OnWindowClose)
        .aggregate(
            STORE,
            Sum::default,
            |_, order: Order, sum: Sum| Sum {
                orders: sum.orders + 1,
                qty: sum.qty + order.qty,
            },
            Json::<Sum>::new(),
        )
        .to_stream()
        .map(|window, sum| {
            (
                format!("{}@{}", window.key, window.start),
                OrderTotal {
                    item: window.key.clone(),
                    window_start: window.start,
                    window_end: window.end,
                    orders: sum.orders,
                    qty: sum.qty,
                },
            )
        })
        .to(output, Utf8, totals);
    Ok(builder.build())
}

/// The topology with its topics, format and registry from the environment (see the
/// module docs).
///
/// # Errors
///
/// `LAMBDA_STREAMS_SCHEMA_REGISTRY_URL` missing or not an http(s) URL, or an
/// `ORDERS_AVRO_INPUT_FORMAT` that is not `confluent`, `source` or `json`; the message names
/// the variable.
pub fn topology_from_env() -> Result<Topology, String> {
    let input = env_or("ORDERS_AVRO_INPUT_TOPIC", "orders-avro");
    let output = env_or("ORDERS_AVRO_OUTPUT_TOPIC", "order-totals-avro");
    let url = std::env::var("LAMBDA_STREAMS_SCHEMA_REGISTRY_URL")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .ok_or("LAMBDA_STREAMS_SCHEMA_REGISTRY_URL: not set (the schema registry's URL)")?;
    let registry = RegistryClient::new(&url)
        .map_err(|e| format!("LAMBDA_STREAMS_SCHEMA_REGISTRY_URL: {e}"))?;
    let format = match env_or("ORDERS_AVRO_INPUT_FORMAT", "confluent").as_str() {
        "confluent" => WireFormat::Confluent,
        "source" => WireFormat::Source,
        "json" => WireFormat::Json,
        other => {
            return Err(format!(
                "ORDERS_AVRO_INPUT_FORMAT: {other:?} is not confluent, source or json"
            ));
        }
    };
    topology(&input, &output, format, Arc::new(registry))
}

#[cfg(test)]
mod tests;
