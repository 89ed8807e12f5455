//! [`KafkaSink`]: the rdkafka producer behind the [`Sink`] contract (idempotent, every
//! record acknowledged before the batch succeeds).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer, PurgeConfig};

use super::{ConnectionHealth, KafkaSettings, MskIamSigner, SinkContext};
use crate::sink::{OutputRecord, Sink, SinkError};

/// Produces to Kafka with an idempotent producer (`acks=all`), partitioning keys with
/// murmur2 as Java clients do, so a key lands where Kafka Streams would put it.
///
/// An authentication or TLS failure of the producer fails the batch at once (not after the
/// 30 s message timeout) with an error that names the settings to check; the batch's
/// records still queued are purged, so that nothing of a failed batch is produced later.
pub struct KafkaSink {
    pub(super) producer: FutureProducer<SinkContext>,
    health: Arc<ConnectionHealth>,
}

impl KafkaSink {
    /// A producer for `bootstrap_servers`, with extra librdkafka settings.
    pub fn new(bootstrap_servers: &str, extra: &[(String, String)]) -> Result<Self, SinkError> {
        Self::create(
            bootstrap_servers,
            extra,
            SinkContext::new(&KafkaSettings::plaintext(), None),
        )
    }

    /// A producer for `bootstrap_servers` connecting as `settings` say (TLS, SASL/SCRAM,
    /// MSK IAM with the SDK's default credentials: in Lambda, the function's role).
    pub async fn connect(
        bootstrap_servers: &str,
        settings: &KafkaSettings,
    ) -> Result<Self, SinkError> {
        Self::connect_with(bootstrap_servers, settings, &[]).await
    }

    /// [`connect`](Self::connect) with more properties, after the settings' own (a
    /// transactional producer's `transactional.id`).
    pub(super) async fn connect_with(
        bootstrap_servers: &str,
        settings: &KafkaSettings,
        more: &[(String, String)],
    ) -> Result<Self, SinkError> {
        let failed = |reason: String| SinkError {
            topic: String::new(),
            reason,
        };
        let context = context(settings).await.map_err(failed)?;
        let mut properties: Vec<(String, String)> = settings
            .properties()
            .iter()
            .map(|p| (p.name.clone(), p.value.clone()))
            .collect();
        properties.extend(more.iter().cloned());
        Self::create(bootstrap_servers, &properties, context)
            .map_err(|e| failed(format!("{}; {}", e.reason, settings.hint())))
    }

    /// Connects ahead of the first send; blocking (call it off the async runtime). Asks
    /// for the metadata of `topics` twice: the first answer usually comes through a
    /// bootstrap server and names the cluster's brokers, the second through one of those;
    /// a metadata answer is also when librdkafka asks for the idempotent producer's id,
    /// which it otherwise retries only on a 500 ms timer. Then the topics' leaders, their
    /// connections and the producer id are in place when the first batch's output is sent
    /// (BENCHMARKS.md section 4). Errors are ignored: a send reports them.
    pub fn warm_up(&self, topics: &[String], timeout: Duration) {
        for _ in 0..2 {
            for topic in topics {
                let _ = self.producer.client().fetch_metadata(Some(topic), timeout);
            }
        }
    }

    fn create(
        bootstrap_servers: &str,
        extra: &[(String, String)],
        context: SinkContext,
    ) -> Result<Self, SinkError> {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", bootstrap_servers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("partitioner", "murmur2_random")
            // No linger: a batch's records are all enqueued before the handler waits for
            // their acknowledgements, so librdkafka's default 5 ms linger only delayed the
            // end of every invocation (billed), and the first one's. Large batches still go
            // out in large requests, which fill while earlier ones are in flight
            // (BENCHMARKS.md section 4, "No linger"). `LAMBDA_STREAMS_KAFKA_LINGER_MS` sets it.
            .set("linger.ms", "0")
            // Connect to a broker as soon as the metadata names it, not when a send first
            // needs it (librdkafka's default throttles those connections to one per 50 ms,
            // which a cold start's first send waits for; BENCHMARKS.md section 4). A
            // producer sends to every partition's leader anyway.
            .set("enable.sparse.connections", "false")
            .set("message.timeout.ms", "30000");
        for (key, value) in extra {
            config.set(key, value);
        }
        let health = context.health();
        let producer = config.create_with_context(context).map_err(|e| SinkError {
            topic: String::new(),
            reason: format!("cannot create a producer for {bootstrap_servers}: {e}"),
        })?;
        Ok(KafkaSink { producer, health })
    }
}

/// The client context of `settings`: their TLS/SASL hint, and the MSK IAM signer (with
/// the SDK's default credentials) when they ask for it.
pub(super) async fn context(settings: &KafkaSettings) -> Result<SinkContext, String> {
    let signer = match settings.msk_iam_region() {
        Some(region) => Some(MskIamSigner::new(
            region,
            crate::aws::default_credentials().await?,
            tokio::runtime::Handle::current(),
        )),
        None => None,
    };
    Ok(SinkContext::new(settings, signer))
}

#[async_trait]
impl Sink for KafkaSink {
    async fn send(&self, records: Vec<OutputRecord>) -> Result<(), SinkError> {
        let mut deliveries = Vec::with_capacity(records.len());
        // Each record is dropped once librdkafka has copied it; deliveries name their topic by
        // index into the batch's few distinct topics.
        let mut topics: Vec<String> = Vec::new();
        for record in records {
            let topic = match topics.iter().position(|t| *t == record.topic) {
                Some(index) => index,
                None => {
                    topics.push(record.topic.clone());
                    topics.len() - 1
                }
            };
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
                        deliveries.push((topic, delivery));
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
        let context = &self.health;
        for (topic, mut delivery) in deliveries {
            let topic = topics[topic].as_str();
            let result = loop {
                tokio::select! {
                    result = &mut delivery => break result,
                    _ = tokio::time::sleep(Duration::from_millis(50)) => {
                        if let Some(failure) = context.recent_failure() {
                            self.producer.purge(PurgeConfig::default().queue().inflight());
                            return Err(SinkError {
                                topic: topic.to_owned(),
                                reason: format!(
                                    "the producer cannot connect to Kafka: {failure}; {}",
                                    context.hint()
                                ),
                            });
                        }
                    }
                }
            };
            match result {
                Ok(Ok(_)) => context.delivered(),
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
