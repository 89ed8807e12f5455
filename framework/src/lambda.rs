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
//! | `LAMBDA_STREAMS_OUTPUT_GUARANTEE` | `at_least_once` or `exactly_once` (transactions per source partition, read by `read_committed` consumers; docs/state.md) | `at_least_once` |
//! | `LAMBDA_STREAMS_APPLICATION_ID` | under `exactly_once`: the prefix of the transactional ids `<id>-<topic>-<partition>` and of the shadow consumer group `<id>-eos`; unique per function | `AWS_LAMBDA_FUNCTION_NAME` |
//! | `LAMBDA_STREAMS_EVENT_ISOLATION` | `read_committed` when the event source is known to read committed: under `exactly_once`, the repartition topics' batches are then not read again with `read_committed` | not known |
//! | `LAMBDA_STREAMS_POISON_POLICY` | `fail`, `skip` or `dead-letter:<topic>` | `fail` |
//! | `LAMBDA_STREAMS_PARTIAL_BATCH_RESPONSE` | `true` to answer with `batchItemFailures` (needs the event source's `ReportBatchItemFailures`) | `false` |
//! | `LAMBDA_STREAMS_METRICS` | `emf` to print CloudWatch EMF metrics per batch, `off` | `emf` in Lambda, else `off` |
//! | `LAMBDA_STREAMS_AWS_TLS_ROOTS` | the roots the AWS SDK's HTTPS client (DynamoDB, MSK IAM's credentials chain) trusts: `aws` (Amazon Trust Services' 5 roots, in the binary: every AWS endpoint's), `compiled` (all of Mozilla's, in the binary) or `system` (the system store; `SSL_CERT_FILE`/`SSL_CERT_DIR`) | `aws` |
//! | `RUST_LOG` | the log filter: `level` and `target=level` directives ([`init_tracing`]) | `info` |
//! | `LAMBDA_STREAMS_KAFKA_*` | how the producer connects: TLS, SASL/SCRAM, MSK IAM, any librdkafka property ([`crate::kafka`]) | PLAINTEXT |
//!
//! plus the AWS SDK's own (`AWS_REGION`, `AWS_ENDPOINT_URL_DYNAMODB`, credentials).

use std::sync::Arc;

use serde_json::value::RawValue;

pub use crate::aws::TlsRoots;
pub use crate::config::Config;
use crate::dsl::Topology;
use crate::error::StreamError;
pub use crate::handler::Handler;
use crate::state::Store;
use crate::state::dynamodb::DynamoStore;

/// Runs `topology` as a Lambda function: reads [`Config`] from the environment, builds
/// the DynamoDB client (the SDK's default chain: in Lambda, the function's role) and the
/// Kafka producer once, then serves invocations until the runtime stops. Every batch
/// either succeeds whole or fails whole (the event source retries it; the state's
/// watermarks make the retry exact). The DynamoDB client retries throttling as
/// [`RetrySettings`](crate::state::dynamodb::RetrySettings) says
/// (`LAMBDA_STREAMS_DYNAMODB_MAX_ATTEMPTS`, `LAMBDA_STREAMS_DYNAMODB_RETRY_BUDGET`); its
/// aggregate cache holds `LAMBDA_STREAMS_STATE_CACHE_BYTES` (default
/// [`DEFAULT_CACHE_BYTES`](crate::state::dynamodb::DEFAULT_CACHE_BYTES)); its state
/// writes go through its [`LeanClient`](crate::state::dynamodb::LeanClient) unless
/// `LAMBDA_STREAMS_DYNAMODB_CLIENT=sdk` (or a configuration the lean client does not
/// serve, logged) keeps them on the AWS SDK.
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
            .http_client(crate::aws::https_client(config.aws_tls_roots))
            .load()
            .await;
        let client = retry.client(&sdk, &table);
        let mut store = DynamoStore::new(client, table, config.guarantee);
        if config.dynamodb_lean {
            match crate::state::dynamodb::LeanClient::from_sdk(&sdk, config.aws_tls_roots, retry)
                .map_err(|e| {
                    StreamError::Config(format!("LAMBDA_STREAMS_DYNAMODB_CLIENT=lean: {e}"))
                })? {
                Some(lean) => store = store.with_lean_client(lean),
                None => tracing::warn!(
                    "LAMBDA_STREAMS_DYNAMODB_CLIENT=lean (the default): the configuration needs \
                     what the lean client does not do (a proxy, FIPS or dual-stack endpoints, \
                     another partition's region, or ignored endpoint URLs); state writes use \
                     the AWS SDK"
                ),
            }
        }
        Arc::new(match config.state_cache_bytes {
            Some(bytes) => store.with_cache_bytes(bytes),
            None => store,
        })
    };
    let handler = Arc::new(Handler::try_from_config(topology, store, &config)?);
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

/// Whether log lines written to standard output get ANSI colours: only when it is a
/// terminal, and `NO_COLOR` (<https://no-color.org>) is unset or empty. A file, a pipe, the
/// Lambda runtime's log capture (CloudWatch) get plain text.
pub fn log_colours() -> bool {
    use std::io::IsTerminal;
    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Logs through `tracing` to standard output: JSON when `AWS_LAMBDA_LOG_FORMAT=JSON`, level
/// from `RUST_LOG` (`level` and `target=level` directives; default `info`); coloured only
/// on a terminal ([`log_colours`]). Safe to call more than once.
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
            .with(
                fmt::layer()
                    .with_ansi(log_colours())
                    .with_target(false)
                    .without_time(),
            )
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
            StreamError::Transaction { .. } => "TransactionError",
            StreamError::Config(_) => "ConfigurationError",
            StreamError::Unavailable { .. } => "DependencyUnavailable",
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
