//! What a function's response means to the event source: success, or a partial batch
//! response (`ReportBatchItemFailures`) naming, per partition, the first record to deliver
//! again.
//!
//! ```json
//! {"batchItemFailures":[{"itemIdentifier":{"partition":"orders-3","offset":42}}]}
//! ```
//!
//! The rules follow Lambda's for partial batch responses: an empty body, `null`, `{}`, a
//! `null` or empty `batchItemFailures` are complete success; a response that names a
//! partition or offset not in the batch, or is not such JSON at all, fails the whole batch.
//! When one partition is reported more than once, its lowest offset counts.

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

fn item_identifier(item: &Value, event: &KafkaEvent) -> Result<(TopicPartition, i64), String> {
    let id = item
        .get("itemIdentifier")
        .filter(|v| v.is_object())
        .ok_or_else(|| {
            format!(
                "no itemIdentifier object in {}",
                truncate(&item.to_string())
            )
        })?;
    let key = id
        .get("partition")
        .and_then(Value::as_str)
        .ok_or("itemIdentifier.partition is not a \"<topic>-<partition>\" string")?;
    let offset = match id.get("offset") {
        Some(Value::Number(n)) => n.as_i64(),
        Some(Value::String(s)) => s.parse().ok(),
        _ => None,
    }
    .ok_or_else(|| format!("itemIdentifier.offset of {key} is not an integer offset"))?;
    let part = event
        .partitions
        .iter()
        .find(|p| p.tp.to_string() == key)
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

    #[test]
    fn partial_takes_the_lowest_offset_per_partition() {
        let body = br#"{"batchItemFailures":[
            {"itemIdentifier":{"partition":"my-topic-0","offset":7}},
            {"itemIdentifier":{"partition":"my-topic-0","offset":"6"}}]}"#;
        let Verdict::Partial(resume) = judge(body, &event()) else {
            panic!("partial")
        };
        assert_eq!(resume.len(), 1);
        assert_eq!(resume[&TopicPartition::new("my-topic", 0)], 6);
    }

    #[test]
    fn invalid_responses_fail_the_batch_and_say_why() {
        for (body, says) in [
            ("not json", "not JSON"),
            (r#""ok""#, "not a partial batch response"),
            (r#"{"batchItemFailures":{}}"#, "not a list"),
            (r#"{"batchItemFailures":[{}]}"#, "no itemIdentifier"),
            (
                r#"{"batchItemFailures":[{"itemIdentifier":{"partition":"my-topic-9","offset":1}}]}"#,
                "my-topic-9",
            ),
            (
                r#"{"batchItemFailures":[{"itemIdentifier":{"partition":"my-topic-0","offset":4}}]}"#,
                "offset 4 of my-topic-0",
            ),
            (
                r#"{"batchItemFailures":[{"itemIdentifier":{"partition":"my-topic-0"}}]}"#,
                "offset of my-topic-0",
            ),
        ] {
            match judge(body.as_bytes(), &event()) {
                Verdict::Invalid(e) => assert!(e.contains(says), "{body}: {e}"),
                other => panic!("{body}: {other:?}"),
            }
        }
    }
}
