//! The Lambda adapter: a function's `main` is one call to [`run`].
//!
//! ```no_run
//! # fn topology() -> lambda_streams::Topology { lambda_streams::StreamsBuilder::new().build() }
//! #[tokio::main]
//! async fn main() -> Result<(), lambda_runtime::Error> {
//!     lambda_streams::lambda::run(topology()).await
//! }
//! ```
//!
//! Configuration comes from the environment ([`Config::from_env`]):
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `LAMBDA_STREAMS_TABLE` | the DynamoDB table of the function's state | required when the topology has a store |
//! | `LAMBDA_STREAMS_BOOTSTRAP_SERVERS` | brokers to produce output to | the event's `bootstrapServers` |
//! | `LAMBDA_STREAMS_GUARANTEE` | `exactly_once` or `at_least_once` | `exactly_once` |
//! | `LAMBDA_STREAMS_POISON_POLICY` | `fail`, `skip` or `dead-letter:<topic>` | `fail` |
//! | `LAMBDA_STREAMS_PARTIAL_BATCH_RESPONSE` | `true` to answer with `batchItemFailures` (needs the event source's `ReportBatchItemFailures`) | `false` |
//! | `LAMBDA_STREAMS_METRICS` | `emf` to print CloudWatch EMF metrics per batch, `off` | `emf` in Lambda, else `off` |
//! | `LAMBDA_STREAMS_AWS_TLS_ROOTS` | the roots the AWS SDK's HTTPS client (DynamoDB, MSK IAM's credentials chain) trusts: `aws` (Amazon Trust Services' 5 roots, in the binary: every AWS endpoint's), `compiled` (all of Mozilla's, in the binary) or `system` (the system store; `SSL_CERT_FILE`/`SSL_CERT_DIR`) | `aws` |
//! | `RUST_LOG` | the log filter: `level` and `target=level` directives ([`init_tracing`]) | `info` |
//! | `LAMBDA_STREAMS_KAFKA_*` | how the producer connects: TLS, SASL/SCRAM, MSK IAM, any librdkafka property ([`crate::kafka`]) | PLAINTEXT |
//!
//! plus the AWS SDK's own (`AWS_REGION`, `AWS_ENDPOINT_URL_DYNAMODB`, credentials).

use std::sync::Arc;
use std::time::Duration;

use serde_json::value::RawValue;
use tokio::sync::OnceCell;

use crate::dsl::Topology;
use crate::error::StreamError;
use crate::event::KafkaEvent;
use crate::kafka::KafkaSettings;
use crate::runtime::{BatchOptions, BatchOutcome, PoisonPolicy};
use crate::sink::{KafkaSink, Sink};
use crate::state::dynamodb::DynamoStore;
use crate::state::{Guarantee, Store};

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
}

/// The root certificates the AWS SDK clients trust (`LAMBDA_STREAMS_AWS_TLS_ROOTS`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TlsRoots {
    /// Amazon Trust Services' roots (Amazon Root CA 1 to 4, Starfield Services Root CA G2),
    /// compiled into the binary: every AWS endpoint's certificate chains to them. Nothing
    /// is read at start-up, and 5 roots are parsed instead of ~120 (the SDK's trust store
    /// takes PEM, which rustls decodes with a constant-time base64 and parses when the
    /// client's connector is built, before the first event: callgrind, start-up to the
    /// first poll, 17.1 M instructions with all of Mozilla's, 4.2 M with these). An endpoint with
    /// another CA (`AWS_ENDPOINT_URL_DYNAMODB` pointing elsewhere over HTTPS) needs
    /// [`TlsRoots::Compiled`] or [`TlsRoots::System`].
    #[default]
    Aws,
    /// Mozilla's roots compiled into the binary (Amazon's included): nothing is read at
    /// start-up ([`crate::state::dynamodb::https_client`]).
    Compiled,
    /// The system's store (`SSL_CERT_FILE`, `SSL_CERT_DIR`, else the platform's bundle and
    /// directory, as `rustls-native-certs` finds them), read and parsed when the client's
    /// first connector is built.
    System,
}

impl TlsRoots {
    /// Parses a value of `LAMBDA_STREAMS_AWS_TLS_ROOTS` (`None` or blank: the default,
    /// [`TlsRoots::Aws`]); an invalid value is an error naming the variable.
    pub fn parse(value: Option<&str>) -> Result<Self, StreamError> {
        match value.map(str::trim) {
            None | Some("" | "aws") => Ok(TlsRoots::Aws),
            Some("compiled") => Ok(TlsRoots::Compiled),
            Some("system") => Ok(TlsRoots::System),
            Some(other) => Err(StreamError::Config(format!(
                "LAMBDA_STREAMS_AWS_TLS_ROOTS: {other:?} is not aws, compiled or system"
            ))),
        }
    }

    /// Reads `LAMBDA_STREAMS_AWS_TLS_ROOTS` from the environment.
    pub fn from_env() -> Result<Self, StreamError> {
        Self::parse(
            std::env::var("LAMBDA_STREAMS_AWS_TLS_ROOTS")
                .ok()
                .as_deref(),
        )
    }
}

impl Config {
    /// Reads `LAMBDA_STREAMS_TABLE`, `LAMBDA_STREAMS_BOOTSTRAP_SERVERS`,
    /// `LAMBDA_STREAMS_GUARANTEE`, `LAMBDA_STREAMS_POISON_POLICY`,
    /// `LAMBDA_STREAMS_PARTIAL_BATCH_RESPONSE`, `LAMBDA_STREAMS_IDLE_PARTITION_TIMEOUT_MS`,
    /// `LAMBDA_STREAMS_SOURCE_PARTITIONS` (`<topic>:<partitions>,…`),
    /// `LAMBDA_STREAMS_METRICS`, `LAMBDA_STREAMS_AWS_TLS_ROOTS` and the `LAMBDA_STREAMS_KAFKA_*` connection settings
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
            None => crate::runtime::batch::DEFAULT_IDLE_PARTITION_TIMEOUT,
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
        })
    }
}

/// Executes a topology on Lambda Kafka events, with its store and its Kafka output.
/// Built once per container; every invocation borrows it.
pub struct Handler {
    topology: Topology,
    store: Arc<dyn Store>,
    sink: SinkChoice,
    options: BatchOptions,
    metrics_function: Option<String>,
}

enum SinkChoice {
    Given(Arc<dyn Sink>),
    /// Created on first use, for the configured brokers or the event's own.
    Kafka {
        bootstrap_servers: Option<String>,
        settings: KafkaSettings,
        producer: OnceCell<Arc<KafkaSink>>,
    },
}

impl Handler {
    /// A handler writing output to `sink`.
    pub fn new(topology: Topology, store: Arc<dyn Store>, sink: Arc<dyn Sink>) -> Self {
        Handler {
            topology,
            store,
            sink: SinkChoice::Given(sink),
            options: BatchOptions::default(),
            metrics_function: None,
        }
    }

    /// A handler producing output to Kafka: to `bootstrap_servers`, or when `None` to the
    /// cluster the event came from. The producer is created on the first batch with
    /// output and reused by every later invocation of the container.
    pub fn with_kafka_output(
        topology: Topology,
        store: Arc<dyn Store>,
        bootstrap_servers: Option<String>,
    ) -> Self {
        Handler {
            topology,
            store,
            sink: SinkChoice::Kafka {
                bootstrap_servers,
                settings: KafkaSettings::plaintext(),
                producer: OnceCell::new(),
            },
            options: BatchOptions::default(),
            metrics_function: None,
        }
    }

    /// Sets how the Kafka output connects (TLS, SASL); no effect on a handler built with
    /// [`new`](Self::new), whose sink is given.
    pub fn with_kafka_settings(mut self, kafka: KafkaSettings) -> Self {
        if let SinkChoice::Kafka { settings, .. } = &mut self.sink {
            *settings = kafka;
        }
        self
    }

    /// Sets how batches are executed (poison policy, partial batch responses).
    pub fn with_options(mut self, options: BatchOptions) -> Self {
        self.options = options;
        self
    }

    /// Prints CloudWatch EMF metrics for every batch, under this function name.
    pub fn with_metrics(mut self, function: impl Into<String>) -> Self {
        self.metrics_function = Some(function.into());
        self
    }

    /// The topology.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Processes one decoded event.
    pub async fn handle_event(&self, event: &KafkaEvent) -> Result<BatchOutcome, StreamError> {
        let sink: Arc<dyn Sink> = match &self.sink {
            SinkChoice::Given(sink) => Arc::clone(sink),
            SinkChoice::Kafka {
                bootstrap_servers,
                settings,
                producer,
            } => {
                let servers = bootstrap_servers
                    .as_deref()
                    .unwrap_or(&event.bootstrap_servers);
                let producer = producer
                    .get_or_try_init(|| async {
                        let sink = KafkaSink::connect(servers, settings).await.map(Arc::new)?;
                        // Connects while the batch works on its state: the output is sent
                        // at the end of the batch (BENCHMARKS.md section 4).
                        let topics = self.topology.sink_topics();
                        if !topics.is_empty() {
                            let warm = Arc::clone(&sink);
                            tokio::task::spawn_blocking(move || {
                                warm.warm_up(&topics, Duration::from_secs(5))
                            });
                        }
                        Ok::<_, crate::sink::SinkError>(sink)
                    })
                    .await?;
                Arc::clone(producer) as Arc<dyn Sink>
            }
        };
        let outcome = self
            .topology
            .process_with(event, self.store.as_ref(), sink.as_ref(), &self.options)
            .await?;
        let report = &outcome.report;
        tracing::info!(
            partitions = %event.partitions.iter().map(|p| format!("{}@{}..{}", p.tp,
                p.records.first().map_or(-1, |r| r.offset), p.records.last().map_or(-1, |r| r.offset)))
                .collect::<Vec<_>>().join(","),
            records_in = report.records_in,
            records_out = report.records_out,
            items = report.items_touched,
            requests = report.state.requests,
            conditional_failures = report.state.conditional_failures,
            write_units = report.state.consumed_write_units,
            poison = report.poison_records,
            failed_partitions = outcome.failures.len(),
            "batch processed"
        );
        if let Some(function) = &self.metrics_function {
            for document in crate::metrics::emf_documents(function, event, report) {
                println!("{document}");
            }
        }
        Ok(outcome)
    }

    /// Decodes an event's JSON and processes it.
    pub async fn handle_json(&self, payload: &[u8]) -> Result<BatchOutcome, StreamError> {
        let event = KafkaEvent::decode(payload)?;
        self.handle_event(&event).await
    }

    /// Decodes an event's JSON, processes it, and returns the Lambda response JSON
    /// (`{"batchItemFailures":[...]}`): what the function answers to the event source.
    pub async fn invoke_json(&self, payload: &[u8]) -> Result<serde_json::Value, StreamError> {
        Ok(self.handle_json(payload).await?.response())
    }
}

/// Runs `topology` as a Lambda function: reads [`Config`] from the environment, builds
/// the DynamoDB client (the SDK's default chain: in Lambda, the function's role) and the
/// Kafka producer once, then serves invocations until the runtime stops. Every batch
/// either succeeds whole or fails whole (the event source retries it; the state's
/// watermarks make the retry exact). The DynamoDB client retries throttling as
/// [`RetrySettings`](crate::state::dynamodb::RetrySettings) says
/// (`LAMBDA_STREAMS_DYNAMODB_MAX_ATTEMPTS`, `LAMBDA_STREAMS_DYNAMODB_RETRY_BUDGET`).
pub async fn run(topology: Topology) -> Result<(), lambda_runtime::Error> {
    init_tracing();
    let config = Config::from_env()?;
    let store: Arc<dyn Store> = if topology.store_names().is_empty() {
        Arc::new(crate::state::memory::MemoryStore::new())
    } else {
        let table = config.table.clone().ok_or_else(|| {
            StreamError::Config(
                "LAMBDA_STREAMS_TABLE is not set: name the DynamoDB table of the function's state"
                    .into(),
            )
        })?;
        let retry = crate::state::dynamodb::RetrySettings::from_env()?;
        let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .http_client(crate::state::dynamodb::https_client(config.aws_tls_roots))
            .load()
            .await;
        let client = retry.client(&sdk, &table);
        Arc::new(DynamoStore::new(client, table, config.guarantee))
    };
    let mut handler = Handler::with_kafka_output(topology, store, config.bootstrap_servers)
        .with_kafka_settings(config.kafka)
        .with_options(config.batch);
    if let Some(function) = config.metrics_function {
        handler = handler.with_metrics(function);
    }
    let handler = Arc::new(handler);
    lambda_runtime::run(lambda_runtime::service_fn(
        move |event: lambda_runtime::LambdaEvent<Box<RawValue>>| {
            let handler = Arc::clone(&handler);
            async move {
                // The response names the failed partitions when partial batch responses
                // are on; otherwise it is always empty.
                handler
                    .invoke_json(event.payload.get().as_bytes())
                    .await
                    .inspect_err(|e| tracing::error!(error = %e, "batch failed"))
            }
        },
    ))
    .await
}

/// The log filter of a `RUST_LOG` value: comma-separated `level` and `target=level`
/// directives (`warn`, `info,lambda_streams=debug`); unset, blank or not of that form
/// (e.g. `EnvFilter`'s span filters `[span{field}]`, which are not supported): `info`.
fn log_filter(rust_log: Option<&str>) -> tracing_subscriber::filter::Targets {
    rust_log
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            tracing_subscriber::filter::Targets::new()
                .with_default(tracing_subscriber::filter::LevelFilter::INFO)
        })
}

/// Logs through `tracing`: JSON when `AWS_LAMBDA_LOG_FORMAT=JSON`, level from `RUST_LOG`
/// (`level` and `target=level` directives; default `info`). Safe to call more than once.
pub fn init_tracing() {
    use tracing_subscriber::fmt;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let registry =
        tracing_subscriber::registry().with(log_filter(std::env::var("RUST_LOG").ok().as_deref()));
    let _ = if std::env::var("AWS_LAMBDA_LOG_FORMAT").is_ok_and(|f| f.eq_ignore_ascii_case("json"))
    {
        registry
            .with(fmt::layer().json().with_target(false).without_time())
            .try_init()
    } else {
        registry
            .with(fmt::layer().with_target(false).without_time())
            .try_init()
    };
}

impl From<StreamError> for lambda_runtime::Diagnostic {
    fn from(error: StreamError) -> Self {
        let kind = match &error {
            StreamError::Decode(_) => "MalformedEvent",
            StreamError::Deserialize { .. } => "PoisonRecord",
            StreamError::UnknownTopic { .. } => "UnknownTopic",
            StreamError::User { .. } => "UserFunctionError",
            StreamError::State(_) => "StateError",
            StreamError::Sink(_) => "SinkError",
            StreamError::Config(_) => "ConfigurationError",
        };
        lambda_runtime::Diagnostic {
            error_type: kind.to_owned(),
            error_message: error.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::filter::LevelFilter;

    #[test]
    fn tls_roots_parse_and_errors_name_the_variable() {
        assert_eq!(TlsRoots::parse(None).ok(), Some(TlsRoots::Aws));
        assert_eq!(TlsRoots::parse(Some(" ")).ok(), Some(TlsRoots::Aws));
        assert_eq!(TlsRoots::parse(Some("aws")).ok(), Some(TlsRoots::Aws));
        assert_eq!(
            TlsRoots::parse(Some("compiled")).ok(),
            Some(TlsRoots::Compiled)
        );
        assert_eq!(TlsRoots::parse(Some("system")).ok(), Some(TlsRoots::System));
        let error = TlsRoots::parse(Some("webpki")).err().map(|e| e.to_string());
        assert!(error.is_some_and(|e| e.contains("LAMBDA_STREAMS_AWS_TLS_ROOTS")));
    }

    #[test]
    fn rust_log_directives_and_the_info_default() {
        assert_eq!(log_filter(None).default_level(), Some(LevelFilter::INFO));
        assert_eq!(
            log_filter(Some("")).default_level(),
            Some(LevelFilter::INFO)
        );
        assert_eq!(
            log_filter(Some("warn")).default_level(),
            Some(LevelFilter::WARN)
        );
        let filter = log_filter(Some("warn,lambda_streams=debug"));
        assert!(filter.would_enable("lambda_streams::sink", &tracing::Level::DEBUG));
        assert!(!filter.would_enable("aws_smithy_runtime", &tracing::Level::INFO));
        // EnvFilter's span filters are not supported: the default applies.
        let filter = log_filter(Some("[span{x=1}]=trace"));
        assert_eq!(filter.default_level(), Some(LevelFilter::INFO));
    }
}
