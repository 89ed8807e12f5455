//! Sinks: where output records go. [`KafkaSink`] produces to Kafka (idempotent, every
//! record acknowledged before the batch succeeds); [`MemorySink`] collects them for tests.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};

/// Header naming the source record of an output record: `<topic>:<partition>:<offset>`.
pub const SOURCE_HEADER: &str = "lambda-streams-source";
/// Header carrying the version of the state item a table update comes from (decimal).
pub const VERSION_HEADER: &str = "lambda-streams-version";
/// Header of a record produced to a repartition topic: its rank among the records its
/// source record produced there (decimal, from 0).
pub const SEQUENCE_HEADER: &str = "lambda-streams-sequence";

/// A record to produce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputRecord {
    /// The topic.
    pub topic: String,
    /// The key (`None`: null).
    pub key: Option<Vec<u8>>,
    /// The value (`None`: a tombstone).
    pub value: Option<Vec<u8>>,
    /// Headers, in order.
    pub headers: Vec<(String, Vec<u8>)>,
    /// Event time in epoch milliseconds.
    pub timestamp: Option<i64>,
}

impl OutputRecord {
    /// The value of the first header called `name`.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }
}

/// Producing failed; the batch fails and is delivered again.
#[derive(Debug, thiserror::Error)]
#[error("producing to topic {topic:?} failed: {reason}")]
pub struct SinkError {
    /// The topic.
    pub topic: String,
    /// What the producer said.
    pub reason: String,
}

/// Where a batch's output records go. `send` returns only once every record is
/// acknowledged, so a batch succeeds only when its output is durable.
#[async_trait]
pub trait Sink: Send + Sync {
    /// Produces `records` and waits for all acknowledgements.
    async fn send(&self, records: Vec<OutputRecord>) -> Result<(), SinkError>;
}

/// Collects output records in memory (for tests).
#[derive(Debug, Default)]
pub struct MemorySink {
    records: Mutex<Vec<OutputRecord>>,
}

impl MemorySink {
    /// An empty sink.
    pub fn new() -> Self {
        Self::default()
    }

    /// Everything sent so far, in order.
    pub fn records(&self) -> Vec<OutputRecord> {
        self.records
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

#[async_trait]
impl Sink for MemorySink {
    async fn send(&self, records: Vec<OutputRecord>) -> Result<(), SinkError> {
        self.records
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(records);
        Ok(())
    }
}

/// Produces to Kafka with an idempotent producer (`acks=all`), partitioning keys with
/// murmur2 as Java clients do, so a key lands where Kafka Streams would put it.
pub struct KafkaSink {
    producer: FutureProducer,
}

impl KafkaSink {
    /// A producer for `bootstrap_servers`, with extra librdkafka settings (e.g. TLS/SASL).
    pub fn new(bootstrap_servers: &str, extra: &[(String, String)]) -> Result<Self, SinkError> {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", bootstrap_servers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("partitioner", "murmur2_random")
            .set("linger.ms", "5")
            .set("message.timeout.ms", "30000");
        for (key, value) in extra {
            config.set(key, value);
        }
        let producer = config.create().map_err(|e| SinkError {
            topic: String::new(),
            reason: format!("cannot create a producer for {bootstrap_servers}: {e}"),
        })?;
        Ok(KafkaSink { producer })
    }
}

#[async_trait]
impl Sink for KafkaSink {
    async fn send(&self, records: Vec<OutputRecord>) -> Result<(), SinkError> {
        let mut deliveries = Vec::with_capacity(records.len());
        for record in &records {
            let mut headers = OwnedHeaders::new_with_capacity(record.headers.len());
            for (name, value) in &record.headers {
                headers = headers.insert(Header {
                    key: name,
                    value: Some(value),
                });
            }
            let mut future = FutureRecord::<[u8], [u8]>::to(&record.topic).headers(headers);
            if let Some(key) = &record.key {
                future = future.key(key);
            }
            if let Some(value) = &record.value {
                future = future.payload(value);
            }
            if let Some(ts) = record.timestamp {
                future = future.timestamp(ts);
            }
            loop {
                match self.producer.send_result(future) {
                    Ok(delivery) => {
                        deliveries.push((record.topic.as_str(), delivery));
                        break;
                    }
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                        future = back;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Err((e, _)) => {
                        return Err(SinkError {
                            topic: record.topic.clone(),
                            reason: e.to_string(),
                        });
                    }
                }
            }
        }
        for (topic, delivery) in deliveries {
            match delivery.await {
                Ok(Ok(_)) => {}
                Ok(Err((e, _))) => {
                    return Err(SinkError {
                        topic: topic.to_owned(),
                        reason: e.to_string(),
                    });
                }
                Err(_) => {
                    return Err(SinkError {
                        topic: topic.to_owned(),
                        reason: "the producer dropped the delivery report".into(),
                    });
                }
            }
        }
        Ok(())
    }
}

impl Drop for KafkaSink {
    fn drop(&mut self) {
        let _ = self.producer.flush(Duration::from_secs(10));
    }
}
