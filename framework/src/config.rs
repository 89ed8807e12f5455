//! A function's settings, read from the environment (the variables are listed in
//! [`crate::lambda`]).

use std::time::Duration;

use crate::aws::TlsRoots;
use crate::error::StreamError;
use crate::kafka::KafkaSettings;
use crate::runtime::{BatchOptions, PoisonPolicy};
use crate::state::Guarantee;

/// A function's settings, read from the environment.
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// The DynamoDB state table.
    pub table: Option<String>,
    /// Brokers for the output; `None` uses the event's `bootstrapServers`.
    pub bootstrap_servers: Option<String>,
    /// The processing guarantee.
    pub guarantee: Guarantee,
    /// Poison records and partial batch responses.
    pub batch: BatchOptions,
    /// The function name put in metrics; `None`: no metrics.
    pub metrics_function: Option<String>,
    /// How the producer connects to Kafka (TLS, SASL).
    pub kafka: KafkaSettings,
    /// The root certificates the AWS SDK clients (DynamoDB) trust.
    pub aws_tls_roots: TlsRoots,
    /// The DynamoDB store's aggregate cache, in bytes (`LAMBDA_STREAMS_STATE_CACHE_BYTES`;
    /// 0 turns it off); `None`: the default,
    /// [`DEFAULT_CACHE_BYTES`](crate::state::dynamodb::DEFAULT_CACHE_BYTES).
    pub state_cache_bytes: Option<usize>,
}

impl Config {
    /// Reads `LAMBDA_STREAMS_TABLE`, `LAMBDA_STREAMS_BOOTSTRAP_SERVERS`,
    /// `LAMBDA_STREAMS_GUARANTEE`, `LAMBDA_STREAMS_POISON_POLICY`,
    /// `LAMBDA_STREAMS_PARTIAL_BATCH_RESPONSE`, `LAMBDA_STREAMS_IDLE_PARTITION_TIMEOUT_MS`,
    /// `LAMBDA_STREAMS_SOURCE_PARTITIONS` (`<topic>:<partitions>,…`),
    /// `LAMBDA_STREAMS_METRICS`, `LAMBDA_STREAMS_AWS_TLS_ROOTS`,
    /// `LAMBDA_STREAMS_STATE_CACHE_BYTES` and the `LAMBDA_STREAMS_KAFKA_*` connection settings
    /// ([`KafkaSettings::from_env`]); an invalid value is an error naming the variable.
    pub fn from_env() -> Result<Config, StreamError> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let guarantee = match var("LAMBDA_STREAMS_GUARANTEE") {
            Some(g) => g
                .parse()
                .map_err(|e| StreamError::Config(format!("LAMBDA_STREAMS_GUARANTEE: {e}")))?,
            None => Guarantee::default(),
        };
        let poison: PoisonPolicy = match var("LAMBDA_STREAMS_POISON_POLICY") {
            Some(p) => p
                .parse()
                .map_err(|e| StreamError::Config(format!("LAMBDA_STREAMS_POISON_POLICY: {e}")))?,
            None => PoisonPolicy::default(),
        };
        let partial_batch_response = match var("LAMBDA_STREAMS_PARTIAL_BATCH_RESPONSE").as_deref() {
            None | Some("false") => false,
            Some("true") => true,
            Some(other) => {
                return Err(StreamError::Config(format!(
                    "LAMBDA_STREAMS_PARTIAL_BATCH_RESPONSE: {other:?} is not true or false"
                )));
            }
        };
        let idle_partition_timeout = match var("LAMBDA_STREAMS_IDLE_PARTITION_TIMEOUT_MS") {
            Some(ms) => Duration::from_millis(ms.trim().parse().map_err(|_| {
                StreamError::Config(format!(
                    "LAMBDA_STREAMS_IDLE_PARTITION_TIMEOUT_MS: {ms:?} is not a number of milliseconds"
                ))
            })?),
            None => crate::runtime::DEFAULT_IDLE_PARTITION_TIMEOUT,
        };
        let mut source_partitions = std::collections::BTreeMap::new();
        for entry in var("LAMBDA_STREAMS_SOURCE_PARTITIONS")
            .unwrap_or_default()
            .split(',')
            .filter(|e| !e.trim().is_empty())
        {
            let parsed = entry
                .trim()
                .rsplit_once(':')
                .and_then(|(topic, n)| Some((topic.to_owned(), n.parse::<i32>().ok()?)))
                .filter(|(topic, n)| !topic.is_empty() && *n > 0);
            let Some((topic, n)) = parsed else {
                return Err(StreamError::Config(format!(
                    "LAMBDA_STREAMS_SOURCE_PARTITIONS: {entry:?} is not <topic>:<partitions>"
                )));
            };
            source_partitions.insert(topic, n);
        }
        let aws_tls_roots = TlsRoots::parse(var("LAMBDA_STREAMS_AWS_TLS_ROOTS").as_deref())?;
        let state_cache_bytes = var("LAMBDA_STREAMS_STATE_CACHE_BYTES")
            .map(|bytes| {
                bytes.trim().parse::<usize>().map_err(|_| {
                    StreamError::Config(format!(
                        "LAMBDA_STREAMS_STATE_CACHE_BYTES: {bytes:?} is not a number of bytes"
                    ))
                })
            })
            .transpose()?;
        let function = var("AWS_LAMBDA_FUNCTION_NAME");
        let metrics_function = match var("LAMBDA_STREAMS_METRICS").as_deref() {
            Some("emf") => Some(function.unwrap_or_else(|| "local".to_owned())),
            Some("off") => None,
            None => function,
            Some(other) => {
                return Err(StreamError::Config(format!(
                    "LAMBDA_STREAMS_METRICS: {other:?} is not emf or off"
                )));
            }
        };
        Ok(Config {
            table: var("LAMBDA_STREAMS_TABLE"),
            bootstrap_servers: var("LAMBDA_STREAMS_BOOTSTRAP_SERVERS"),
            guarantee,
            batch: BatchOptions {
                poison,
                partial_batch_response,
                idle_partition_timeout,
                source_partitions,
            },
            metrics_function,
            kafka: KafkaSettings::from_env()?,
            aws_tls_roots,
            state_cache_bytes,
        })
    }
}
