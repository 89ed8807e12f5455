//! The Lambda response of a partial batch: `batchItemFailures`, as the Kafka event source
//! reads it (one entry per failed partition: the offset to resume from).

use super::TopicPartition;

/// The Lambda response: `{"batchItemFailures":[{"itemIdentifier":{"topic-partition":"<topic>-<p>","offset":N}}]}`.
/// The key is `topic-partition`, as Lambda's Kafka event source reads it: with any other
/// key name it fails the whole batch.
pub fn batch_item_failures(failures: &[(TopicPartition, i64)]) -> serde_json::Value {
    let failures: Vec<_> = failures
        .iter()
        .map(|(tp, offset)| serde_json::json!({ "itemIdentifier": { "topic-partition": tp.to_string(), "offset": offset } }))
        .collect();
    serde_json::json!({ "batchItemFailures": failures })
}
