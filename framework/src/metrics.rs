//! Metrics in CloudWatch Embedded Metric Format (EMF): one JSON document per batch,
//! written to stdout, that CloudWatch Logs turns into metrics without any API call
//! (no extra latency, no extra cost per request).
//!
//! Namespace `lambda-streams`, dimension `FunctionName`, and per source topic a second
//! document with the dimension set `[FunctionName, Topic]` for the records read from it.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::event::KafkaEvent;
use crate::runtime::BatchReport;

/// The CloudWatch namespace of every metric.
pub const NAMESPACE: &str = "lambda-streams";

/// The metrics of one batch, as `(name, unit, value)`.
pub fn batch_metrics(report: &BatchReport) -> Vec<(&'static str, &'static str, f64)> {
    vec![
        ("RecordsIn", "Count", report.records_in as f64),
        ("RecordsOut", "Count", report.records_out as f64),
        ("PoisonRecords", "Count", report.poison_records as f64),
        ("DeadLettered", "Count", report.dead_lettered as f64),
        ("DroppedNullKeys", "Count", report.dropped_null_keys as f64),
        (
            "DroppedNullValues",
            "Count",
            report.dropped_null_values as f64,
        ),
        ("LateRecordsDropped", "Count", report.late_records as f64),
        ("StateItems", "Count", report.items_touched as f64),
        ("DynamoDbRequests", "Count", report.state.requests as f64),
        (
            "DynamoDbConditionalFailures",
            "Count",
            report.state.conditional_failures as f64,
        ),
        ("DynamoDbRetries", "Count", report.state.retries as f64),
        (
            "DynamoDbWriteUnits",
            "Count",
            report.state.consumed_write_units,
        ),
        (
            "BatchDuration",
            "Milliseconds",
            report.duration.as_secs_f64() * 1000.0,
        ),
    ]
}

/// The EMF documents of one batch: the batch's metrics by function, then per topic the
/// records read from it.
pub fn emf_documents(function: &str, event: &KafkaEvent, report: &BatchReport) -> Vec<Value> {
    let timestamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let metrics = batch_metrics(report);
    let mut batch = json!({
        "_aws": {
            "Timestamp": timestamp,
            "CloudWatchMetrics": [{
                "Namespace": NAMESPACE,
                "Dimensions": [["FunctionName"]],
                "Metrics": metrics.iter().map(|(name, unit, _)| json!({"Name": name, "Unit": unit})).collect::<Vec<_>>(),
            }],
        },
        "FunctionName": function,
    });
    for (name, _, value) in &metrics {
        batch[*name] = json!(value);
    }
    let mut documents = vec![batch];
    let mut topics: Vec<(&str, usize)> = Vec::new();
    for part in &event.partitions {
        match topics.iter_mut().find(|(t, _)| *t == part.tp.topic) {
            Some((_, n)) => *n += part.records.len(),
            None => topics.push((&part.tp.topic, part.records.len())),
        }
    }
    for (topic, records) in topics {
        documents.push(json!({
            "_aws": {
                "Timestamp": timestamp,
                "CloudWatchMetrics": [{
                    "Namespace": NAMESPACE,
                    "Dimensions": [["FunctionName", "Topic"]],
                    "Metrics": [{"Name": "TopicRecordsIn", "Unit": "Count"}],
                }],
            },
            "FunctionName": function,
            "Topic": topic,
            "TopicRecordsIn": records,
        }));
    }
    documents
}
