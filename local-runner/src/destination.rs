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
        for record in given_up.records {
            // UTF-8: the topic is a string, the rest are digits and colons.
            let source = String::from_utf8_lossy(&SourceHeader::write(given_up.tp, record.offset))
                .into_owned();
            let attempts = given_up.attempts.to_string();
            let mut headers = OwnedHeaders::new_with_capacity(record.headers.len() + 4);
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
