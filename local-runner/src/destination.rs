//! The on-failure destination: a Kafka topic that receives the records the event source
//! gave up on (retries exhausted, or too old), as the Lambda ESM's Kafka on-failure
//! destination does, so that nothing is lost silently.
//!
//! Each record keeps its key, value, timestamp and headers, and gains headers saying where
//! it came from and why it was given up:
//!
//! | header | value |
//! |---|---|
//! | [`SOURCE_HEADER`] (`lambda-streams-source`) | `<topic>:<partition>:<offset>` of the source record |
//! | [`REASON_HEADER`] (`lambda-streams-failure-reason`) | `RetriesExhausted`, `RecordAgeExceeded`, or (schema validation, [`crate::schema`]) `SCHEMA_NOT_FOUND` / `DESERIALIZATION_ERROR` |
//! | [`ERROR_HEADER`] (`lambda-streams-failure-error`) | the last error (the function's error payload, or why the response failed the batch) |
//! | [`ATTEMPTS_HEADER`] (`lambda-streams-failure-attempts`) | invocations that included the record and failed, decimal |
//! | [`METADATA_HEADER`] (`lambda-streams-failure-metadata`) | Lambda's failure metadata, as JSON (below) |
//!
//! AWS documents that a Kafka on-failure destination receives "the actual failed records
//! along with failure metadata", but not (in the pages at hand) how the metadata is encoded
//! on the record. So the runner carries the fields of the failure record Lambda documents
//! for its Kafka event sources' other destinations (SQS, SNS, S3), in that record's shape,
//! as one JSON header:
//!
//! ```json
//! {"version": "1.0", "timestamp": "2026-12-01T19:30:00.000Z",
//!  "requestContext": {"condition": "RetryAttemptsExhausted", "approximateInvokeCount": 11},
//!  "responseContext": {"functionError": "Unhandled", "errorMessage": "..."},
//!  "KafkaBatchInfo": {"batchSize": 1, "bootstrapServers": "127.0.0.1:9092",
//!    "recordsInfo": {"orders-0": {"firstRecordOffset": "3", "firstRecordTimestamp": "...",
//!                                 "lastRecordOffset": "3", "lastRecordTimestamp": "..."}}}}
//! ```
//!
//! `condition` is `RetryAttemptsExhausted` or `RecordAgeExceeded`; `approximateInvokeCount`
//! counts the invocations that included the record (0 for a record too old to be
//! delivered); `batchSize` and `recordsInfo` describe the records given up together (one
//! partition's). A consumer of the topic that needs the source record's coordinates reads
//! them from [`SOURCE_HEADER`], which does not depend on this shape.

use std::time::Duration;

use lambda_streams::event::{Record, TopicPartition};
pub use lambda_streams::sink::SOURCE_HEADER;
use lambda_streams::wire::SourceHeader;
use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

/// Header: why the record was given up.
pub const REASON_HEADER: &str = "lambda-streams-failure-reason";
/// Header: the last error of the invocations that included the record.
pub const ERROR_HEADER: &str = "lambda-streams-failure-error";
/// Header: how many failed invocations included the record.
pub const ATTEMPTS_HEADER: &str = "lambda-streams-failure-attempts";
/// Header: Lambda's failure metadata as JSON (see the module documentation).
pub const METADATA_HEADER: &str = "lambda-streams-failure-metadata";

/// Why records were given up on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GiveUpReason {
    /// `MaximumRetryAttempts` was reached.
    RetriesExhausted,
    /// The record was older than `MaximumRecordAgeInSeconds`.
    RecordAgeExceeded,
    /// Schema validation: the registry does not know the record's schema id.
    SchemaNotFound,
    /// Schema validation: the record is not in the wire format or does not decode.
    DeserializationError,
}

impl GiveUpReason {
    /// The value of [`REASON_HEADER`].
    pub fn as_str(self) -> &'static str {
        match self {
            GiveUpReason::RetriesExhausted => "RetriesExhausted",
            GiveUpReason::RecordAgeExceeded => "RecordAgeExceeded",
            GiveUpReason::SchemaNotFound => "SCHEMA_NOT_FOUND",
            GiveUpReason::DeserializationError => "DESERIALIZATION_ERROR",
        }
    }

    /// Lambda's name of the condition (`requestContext.condition` of its failure record);
    /// a record the schema validation refused carries the validation's error code.
    pub fn lambda_condition(self) -> &'static str {
        match self {
            GiveUpReason::RetriesExhausted => "RetryAttemptsExhausted",
            GiveUpReason::RecordAgeExceeded => "RecordAgeExceeded",
            GiveUpReason::SchemaNotFound => "SCHEMA_NOT_FOUND",
            GiveUpReason::DeserializationError => "DESERIALIZATION_ERROR",
        }
    }
}

impl GivenUp<'_> {
    /// Lambda's failure metadata of these records (see the module documentation), given
    /// up at `now_ms` (epoch milliseconds) from a cluster at `bootstrap_servers`.
    pub fn metadata(&self, bootstrap_servers: &str, now_ms: i64) -> serde_json::Value {
        let (Some(first), Some(last)) = (self.records.first(), self.records.last()) else {
            return serde_json::Value::Null;
        };
        let mut records_info = serde_json::Map::new();
        records_info.insert(
            self.tp.to_string(),
            serde_json::json!({
                "firstRecordOffset": first.offset.to_string(),
                "firstRecordTimestamp": iso8601(first.timestamp),
                "lastRecordOffset": last.offset.to_string(),
                "lastRecordTimestamp": iso8601(last.timestamp),
            }),
        );
        serde_json::json!({
            "version": "1.0",
            "timestamp": iso8601(now_ms),
            "requestContext": {
                "condition": self.reason.lambda_condition(),
                "approximateInvokeCount": self.attempts,
            },
            "responseContext": {
                "functionError": if self.attempts > 0 { "Unhandled" } else { "" },
                "errorMessage": self.error,
            },
            "KafkaBatchInfo": {
                "batchSize": self.records.len(),
                "bootstrapServers": bootstrap_servers,
                "recordsInfo": records_info,
            },
        })
    }
}

/// Epoch milliseconds as an ISO 8601 UTC time with milliseconds (`2026-12-01T19:30:00.000Z`).
pub fn iso8601(epoch_ms: i64) -> String {
    let days = epoch_ms.div_euclid(86_400_000);
    let ms_of_day = epoch_ms.rem_euclid(86_400_000);
    // Civil date from days since 1970-01-01 (the proleptic Gregorian calendar).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        ms_of_day / 3_600_000,
        ms_of_day / 60_000 % 60,
        ms_of_day / 1000 % 60,
        ms_of_day % 1000
    )
}

/// Records given up on, with why.
#[derive(Debug, Clone)]
pub struct GivenUp<'a> {
    /// Where they came from.
    pub tp: &'a TopicPartition,
    /// The records, in offset order.
    pub records: &'a [Record],
    /// Why.
    pub reason: GiveUpReason,
    /// The last error.
    pub error: &'a str,
    /// Failed invocations that included them.
    pub attempts: u32,
}

/// A producer to the on-failure destination topic.
pub struct FailureDestination {
    topic: String,
    bootstrap_servers: String,
    producer: FutureProducer,
}

impl FailureDestination {
    /// A destination producing (idempotently) to `topic` on `bootstrap_servers`.
    pub fn new(bootstrap_servers: &str, topic: &str) -> Result<Self, String> {
        let producer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap_servers)
            .set("enable.idempotence", "true")
            .set("linger.ms", "5")
            .create()
            .map_err(|e| {
                format!("on-failure destination {topic}: cannot create a producer for {bootstrap_servers}: {e}")
            })?;
        Ok(FailureDestination {
            topic: topic.to_owned(),
            bootstrap_servers: bootstrap_servers.to_owned(),
            producer,
        })
    }

    /// The destination topic.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Produces the records and waits until every one is acknowledged.
    pub async fn send(&self, given_up: &GivenUp<'_>) -> Result<(), String> {
        let mut deliveries = Vec::with_capacity(given_up.records.len());
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let metadata = given_up.metadata(&self.bootstrap_servers, now).to_string();
        for record in given_up.records {
            // UTF-8: the topic is a string, the rest are digits and colons.
            let source = String::from_utf8_lossy(&SourceHeader::write(given_up.tp, record.offset))
                .into_owned();
            let attempts = given_up.attempts.to_string();
            let mut headers = OwnedHeaders::new_with_capacity(record.headers.len() + 5);
            for h in &record.headers {
                headers = headers.insert(Header {
                    key: h.name(),
                    value: Some(h.value()),
                });
            }
            for (key, value) in [
                (SOURCE_HEADER, source.as_bytes()),
                (REASON_HEADER, given_up.reason.as_str().as_bytes()),
                (ERROR_HEADER, given_up.error.as_bytes()),
                (ATTEMPTS_HEADER, attempts.as_bytes()),
                (METADATA_HEADER, metadata.as_bytes()),
            ] {
                headers = headers.insert(Header {
                    key,
                    value: Some(value),
                });
            }
            let mut out = FutureRecord::<[u8], [u8]>::to(&self.topic)
                .headers(headers)
                .timestamp(record.timestamp);
            if let Some(key) = &record.key {
                out = out.key(key);
            }
            if let Some(value) = &record.value {
                out = out.payload(value);
            }
            let delivery = loop {
                match self.producer.send_result(out) {
                    Ok(d) => break d,
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                        out = back;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Err((e, _)) => return Err(self.failed(&source, e)),
                }
            };
            deliveries.push((source, delivery));
        }
        for (source, delivery) in deliveries {
            match delivery.await {
                Ok(Ok(_)) => {}
                Ok(Err((e, _))) => return Err(self.failed(&source, e)),
                Err(_) => {
                    return Err(format!(
                        "on-failure destination {}: the delivery report of {source} was lost",
                        self.topic
                    ));
                }
            }
        }
        Ok(())
    }

    fn failed(&self, source: &str, e: KafkaError) -> String {
        format!(
            "on-failure destination {}: producing {source} failed: {e}",
            self.topic
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso8601_by_hand() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00.000Z");
        // 1545084650987: the record timestamp of AWS's Kafka event example.
        assert_eq!(iso8601(1_545_084_650_987), "2018-12-17T22:10:50.987Z");
        // A leap day, and a time before 1970.
        assert_eq!(iso8601(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(iso8601(-1), "1969-12-31T23:59:59.999Z");
    }

    #[test]
    fn the_metadata_names_the_condition_the_records_and_the_attempts() {
        let tp = TopicPartition::new("orders-eu", 2);
        let records = [7, 9].map(|o| Record {
            offset: o,
            timestamp: 1_545_084_650_987 + o,
            timestamp_type: lambda_streams::event::TimestampType::CreateTime,
            key: None,
            value: None,
            headers: Vec::new(),
            key_schema_metadata: None,
            value_schema_metadata: None,
        });
        let given_up = GivenUp {
            tp: &tp,
            records: &records,
            reason: GiveUpReason::RetriesExhausted,
            error: "boom",
            attempts: 11,
        };
        let json = given_up.metadata("b:9092", 0);
        assert_eq!(
            json["requestContext"]["condition"],
            "RetryAttemptsExhausted"
        );
        assert_eq!(json["requestContext"]["approximateInvokeCount"], 11);
        assert_eq!(json["responseContext"]["errorMessage"], "boom");
        assert_eq!(json["KafkaBatchInfo"]["batchSize"], 2);
        assert_eq!(json["KafkaBatchInfo"]["bootstrapServers"], "b:9092");
        let info = &json["KafkaBatchInfo"]["recordsInfo"]["orders-eu-2"];
        assert_eq!(info["firstRecordOffset"], "7");
        assert_eq!(info["lastRecordOffset"], "9");
        assert_eq!(info["lastRecordTimestamp"], "2018-12-17T22:10:50.996Z");
        assert_eq!(json["timestamp"], "1970-01-01T00:00:00.000Z");
    }
}
