//! What a function's response means to the event source: success, or a partial batch
//! response (`ReportBatchItemFailures`) naming, per partition, the first record to deliver
//! again.
//!
//! ```json
//! {"batchItemFailures":[{"itemIdentifier":{"topic-partition":"orders-3","offset":42}}]}
//! ```
//!
//! The rules follow Lambda's for partial batch responses of a Kafka event source: an empty
//! body, `null`, `{}`, a `null` or empty `batchItemFailures` are complete success. The whole
//! batch fails on an `itemIdentifier` that is null, empty, or has a bad key name (the key
//! is `topic-partition`; `partition`, which an earlier version of the design notes had, is
//! refused by name), on an offset that is not a JSON integer, on a partition or offset not
//! in the batch, and on a response that is not such JSON at all: Lambda retries such a
//! batch whole, so a local run must not pass where Lambda would retry forever. When one
//! partition is reported more than once, its lowest offset counts.

use std::collections::BTreeMap;

use lambda_streams::event::{KafkaEvent, TopicPartition};
use serde_json::Value;

/// The verdict on one invocation's response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every record of the batch succeeded.
    Success,
    /// These partitions failed from this offset on (the records before it succeeded);
    /// the partitions of the batch not named succeeded.
    Partial(BTreeMap<TopicPartition, i64>),
    /// The response is not a valid partial batch response: the whole batch failed.
    Invalid(String),
}

/// Judges a response body against the event it answers.
pub fn judge(body: &[u8], event: &KafkaEvent) -> Verdict {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Verdict::Success;
    }
    let value: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return Verdict::Invalid(format!("the response is not JSON ({e})")),
    };
    let failures = match &value {
        Value::Null => return Verdict::Success,
        Value::Object(map) => match map.get("batchItemFailures") {
            None | Some(Value::Null) => return Verdict::Success,
            Some(Value::Array(items)) if items.is_empty() => return Verdict::Success,
            Some(Value::Array(items)) => items,
            Some(other) => {
                return Verdict::Invalid(format!("batchItemFailures is not a list: {other}"));
            }
        },
        other => {
            return Verdict::Invalid(format!(
                "the response is not a partial batch response object: {}",
                truncate(&other.to_string())
            ));
        }
    };
    let mut resume = BTreeMap::new();
    for (i, item) in failures.iter().enumerate() {
        match item_identifier(item, event) {
            Ok((tp, offset)) => {
                let entry = resume.entry(tp).or_insert(offset);
                *entry = (*entry).min(offset);
            }
            Err(e) => return Verdict::Invalid(format!("batchItemFailures[{i}]: {e}")),
        }
    }
    Verdict::Partial(resume)
}

/// The key of an item identifier's partition, as Lambda's Kafka event source reads it.
const TOPIC_PARTITION: &str = "topic-partition";

fn item_identifier(item: &Value, event: &KafkaEvent) -> Result<(TopicPartition, i64), String> {
    let id = match item.get("itemIdentifier") {
        None => {
            return Err(format!(
                "no itemIdentifier in {}",
                truncate(&item.to_string())
            ));
        }
        Some(Value::Null) => return Err("itemIdentifier is null".to_owned()),
        Some(Value::String(s)) if s.is_empty() => {
            return Err("itemIdentifier is an empty string".to_owned());
        }
        Some(Value::Object(id)) if id.is_empty() => {
            return Err("itemIdentifier is empty ({})".to_owned());
        }
        Some(Value::Object(id)) => id,
        Some(other) => {
            return Err(format!(
                "itemIdentifier is not an object with \"{TOPIC_PARTITION}\" and \"offset\": {}",
                truncate(&other.to_string())
            ));
        }
    };
    let key = match id.get(TOPIC_PARTITION) {
        Some(Value::String(key)) if !key.is_empty() => key,
        Some(other) => {
            return Err(format!(
                "itemIdentifier.{TOPIC_PARTITION} is not a \"<topic>-<partition>\" string: {}",
                truncate(&other.to_string())
            ));
        }
        // The key an earlier version of the design notes had: Lambda does not know it
        // and fails the whole batch, so the runner does too.
        None if id.contains_key("partition") => {
            return Err(format!(
                "itemIdentifier has the key \"partition\"; Lambda's Kafka event source expects \"{TOPIC_PARTITION}\" \
                 ({{\"itemIdentifier\":{{\"{TOPIC_PARTITION}\":\"<topic>-<partition>\",\"offset\":N}}}}) \
                 and fails the whole batch on any other key name"
            ));
        }
        None => {
            return Err(format!(
                "itemIdentifier has no \"{TOPIC_PARTITION}\" key: {}",
                truncate(&Value::Object(id.clone()).to_string())
            ));
        }
    };
    // A JSON integer, as Lambda's documentation and AWS's own batch utility write it. A
    // numeric string is refused: what the runner accepts must not fail in Lambda.
    let offset = match id.get("offset") {
        Some(Value::Number(n)) => n.as_i64(),
        _ => None,
    }
    .ok_or_else(|| {
        format!(
            "itemIdentifier.offset of {key} is not a JSON integer: {}",
            id.get("offset")
                .map_or("absent".to_owned(), Value::to_string)
        )
    })?;
    let part = event
        .partitions
        .iter()
        .find(|p| p.tp.to_string() == *key)
        .ok_or_else(|| format!("partition {key:?} is not in the batch"))?;
    if !part.records.iter().any(|r| r.offset == offset) {
        return Err(format!("offset {offset} of {key} is not in the batch"));
    }
    Ok((part.tp.clone(), offset))
}

fn truncate(text: &str) -> String {
    match text.char_indices().nth(200) {
        Some((i, _)) => format!("{}...", &text[..i]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lambda_streams::event::{EventSource, PartitionRecords, Record, TimestampType};

    fn event() -> KafkaEvent {
        let record = |offset| Record {
            offset,
            timestamp: 0,
            timestamp_type: TimestampType::CreateTime,
            key: None,
            value: None,
            headers: vec![],
            key_schema_metadata: None,
            value_schema_metadata: None,
        };
        KafkaEvent {
            source: EventSource::SelfManaged,
            bootstrap_servers: "b".into(),
            partitions: vec![
                PartitionRecords {
                    tp: TopicPartition::new("my-topic", 0),
                    records: vec![record(5), record(6), record(7)],
                },
                PartitionRecords {
                    tp: TopicPartition::new("my-topic", 1),
                    records: vec![record(0)],
                },
            ],
        }
    }

    #[test]
    fn success_forms() {
        for body in [
            "",
            " ",
            "null",
            "{}",
            r#"{"batchItemFailures":null}"#,
            r#"{"batchItemFailures":[]}"#,
        ] {
            assert_eq!(judge(body.as_bytes(), &event()), Verdict::Success, "{body}");
        }
    }

    /// A response of one failure with this `itemIdentifier` (raw JSON).
    fn failing(identifier: &str) -> String {
        format!(r#"{{"batchItemFailures":[{{"itemIdentifier":{identifier}}}]}}"#)
    }

    fn invalid(body: &str) -> String {
        match judge(body.as_bytes(), &event()) {
            Verdict::Invalid(why) => why,
            other => panic!("{body}: expected a failed batch, got {other:?}"),
        }
    }

    #[test]
    fn the_topic_partition_key_resumes_its_partition_from_the_offset() {
        let body = failing(r#"{"topic-partition":"my-topic-0","offset":6}"#);
        assert_eq!(
            judge(body.as_bytes(), &event()),
            Verdict::Partial(BTreeMap::from([(TopicPartition::new("my-topic", 0), 6)]))
        );
    }

    #[test]
    fn partial_takes_the_lowest_offset_per_partition() {
        let body = br#"{"batchItemFailures":[
            {"itemIdentifier":{"topic-partition":"my-topic-0","offset":7}},
            {"itemIdentifier":{"topic-partition":"my-topic-1","offset":0}},
            {"itemIdentifier":{"topic-partition":"my-topic-0","offset":6}}]}"#;
        assert_eq!(
            judge(body, &event()),
            Verdict::Partial(BTreeMap::from([
                (TopicPartition::new("my-topic", 0), 6),
                (TopicPartition::new("my-topic", 1), 0),
            ]))
        );
    }

    #[test]
    fn the_partition_key_fails_the_batch_and_names_the_right_key() {
        let why = invalid(&failing(r#"{"partition":"my-topic-0","offset":6}"#));
        assert!(why.contains(r#"the key "partition""#), "{why}");
        assert!(why.contains(r#"expects "topic-partition""#), "{why}");
    }

    #[test]
    fn another_key_name_fails_the_batch() {
        let why = invalid(&failing(r#"{"topicPartition":"my-topic-0","offset":6}"#));
        assert!(why.contains(r#"no "topic-partition" key"#), "{why}");
    }

    #[test]
    fn an_empty_item_identifier_fails_the_batch() {
        assert!(invalid(&failing("{}")).contains("itemIdentifier is empty"));
        assert!(invalid(&failing(r#""""#)).contains("itemIdentifier is an empty string"));
        let why = invalid(&failing(r#"{"topic-partition":"","offset":6}"#));
        assert!(
            why.contains("is not a \"<topic>-<partition>\" string"),
            "{why}"
        );
    }

    #[test]
    fn a_null_item_identifier_fails_the_batch() {
        assert!(invalid(&failing("null")).contains("itemIdentifier is null"));
        let why = invalid(&failing(r#"{"topic-partition":null,"offset":6}"#));
        assert!(why.contains("topic-partition is not"), "{why}");
    }

    #[test]
    fn an_offset_as_a_string_fails_the_batch() {
        let why = invalid(&failing(r#"{"topic-partition":"my-topic-0","offset":"6"}"#));
        assert!(
            why.contains(r#"offset of my-topic-0 is not a JSON integer: "6""#),
            "{why}"
        );
    }

    #[test]
    fn a_partition_not_in_the_batch_fails_the_batch() {
        let why = invalid(&failing(r#"{"topic-partition":"my-topic-9","offset":1}"#));
        assert!(
            why.contains(r#"partition "my-topic-9" is not in the batch"#),
            "{why}"
        );
        let why = invalid(&failing(r#"{"topic-partition":"other-0","offset":5}"#));
        assert!(why.contains(r#""other-0" is not in the batch"#), "{why}");
    }

    #[test]
    fn invalid_responses_fail_the_batch_and_say_why() {
        for (body, says) in [
            ("not json", "not JSON"),
            (r#""ok""#, "not a partial batch response"),
            (r#"{"batchItemFailures":{}}"#, "not a list"),
            (r#"{"batchItemFailures":[{}]}"#, "no itemIdentifier"),
            (
                r#"{"batchItemFailures":[{"itemIdentifier":"my-topic-0-6"}]}"#,
                "not an object",
            ),
            (
                r#"{"batchItemFailures":[{"itemIdentifier":{"topic-partition":"my-topic-0","offset":4}}]}"#,
                "offset 4 of my-topic-0",
            ),
            (
                r#"{"batchItemFailures":[{"itemIdentifier":{"topic-partition":"my-topic-0"}}]}"#,
                "offset of my-topic-0 is not a JSON integer: absent",
            ),
            (
                r#"{"batchItemFailures":[{"itemIdentifier":{"topic-partition":"my-topic-0","offset":6.5}}]}"#,
                "offset of my-topic-0 is not a JSON integer: 6.5",
            ),
        ] {
            let why = invalid(body);
            assert!(why.contains(says), "{body}: {why}");
        }
    }

    #[test]
    fn one_bad_item_fails_the_whole_batch() {
        let body = br#"{"batchItemFailures":[
            {"itemIdentifier":{"topic-partition":"my-topic-0","offset":6}},
            {"itemIdentifier":{"partition":"my-topic-1","offset":0}}]}"#;
        match judge(body, &event()) {
            Verdict::Invalid(why) => assert!(why.starts_with("batchItemFailures[1]: "), "{why}"),
            other => panic!("{other:?}"),
        }
    }
}
