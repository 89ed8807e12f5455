//! A function's settings, read from the environment (the variables are listed in
//! [`crate::lambda`]).

use std::time::Duration;

use crate::aws::TlsRoots;
use crate::error::StreamError;
use crate::kafka::KafkaSettings;
use crate::runtime::{BatchOptions, OutputGuarantee, PoisonPolicy};
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
    /// Whether the DynamoDB store sends its state writes through its
    /// [`LeanClient`](crate::state::dynamodb::LeanClient) (`LAMBDA_STREAMS_DYNAMODB_CLIENT=lean`,
    /// the default: a fraction of the SDK's CPU per write) rather than the AWS SDK (`sdk`).
    pub dynamodb_lean: bool,
    /// The application id (`LAMBDA_STREAMS_APPLICATION_ID`, else the function's name
    /// `AWS_LAMBDA_FUNCTION_NAME`): under exactly-once output, the prefix of the
    /// transactional ids (`<app>-<topic>-<partition>`) and of the shadow consumer group
    /// (`<app>-eos`). It must be unique per function: two functions with one id fence each
    /// other's transactions.
    pub application_id: Option<String>,
    /// Whether the event source is known to read its topics with `read_committed`
    /// (`LAMBDA_STREAMS_EVENT_ISOLATION=read_committed`; `read_uncommitted` or unset: not
    /// known). Under exactly-once output, the batches of the topology's repartition topics
    /// (written in transactions) are read again with `read_committed` unless it is known:
    /// Lambda's Kafka event source does not document its isolation level, and read
    /// uncommitted it would deliver records of aborted transactions.
    pub event_read_committed: bool,
}

impl Config {
    /// Reads `LAMBDA_STREAMS_TABLE`, `LAMBDA_STREAMS_BOOTSTRAP_SERVERS`,
    /// `LAMBDA_STREAMS_GUARANTEE`, `LAMBDA_STREAMS_POISON_POLICY`,
    /// `LAMBDA_STREAMS_PARTIAL_BATCH_RESPONSE`, `LAMBDA_STREAMS_IDLE_PARTITION_TIMEOUT_MS`,
    /// `LAMBDA_STREAMS_SOURCE_PARTITIONS` (`<topic>:<partitions>,…`),
    /// `LAMBDA_STREAMS_DESERIALIZE_THREADS`, `LAMBDA_STREAMS_OVERLAP_READING`,
    /// `LAMBDA_STREAMS_METRICS`, `LAMBDA_STREAMS_AWS_TLS_ROOTS`,
    /// `LAMBDA_STREAMS_STATE_CACHE_BYTES`, `LAMBDA_STREAMS_OUTPUT_GUARANTEE`
    /// (`at_least_once` or `exactly_once`), `LAMBDA_STREAMS_APPLICATION_ID` (required with
    /// `exactly_once` unless `AWS_LAMBDA_FUNCTION_NAME` is set) and the `LAMBDA_STREAMS_KAFKA_*` connection settings
    /// ([`KafkaSettings::from_env`]); an invalid value is an error naming the variable.
    pub fn from_env() -> Result<Config, StreamError> {
        Self::from_vars(std::env::vars())
    }

    /// Reads the settings of [`Config::from_env`] from these `(variable, value)` pairs (the
    /// environment, in tests). A variable set to blanks counts as unset.
    pub fn from_vars(
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, StreamError> {
        let vars: std::collections::HashMap<String, String> = vars.into_iter().collect();
        let var = |name: &str| vars.get(name).filter(|v| !v.trim().is_empty()).cloned();
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
        // A flag: unset or `false`, or `true`; anything else names the variable.
        let flag = |name: &str| match var(name).as_deref() {
            None | Some("false") => Ok(false),
            Some("true") => Ok(true),
            Some(other) => Err(StreamError::Config(format!(
                "{name}: {other:?} is not true or false"
            ))),
        };
        let partial_batch_response = flag("LAMBDA_STREAMS_PARTIAL_BATCH_RESPONSE")?;
        let idle_partition_timeout = match var("LAMBDA_STREAMS_IDLE_PARTITION_TIMEOUT_MS") {
            Some(ms) => Duration::from_millis(ms.trim().parse().map_err(|_| {
                StreamError::Config(format!(
                    "LAMBDA_STREAMS_IDLE_PARTITION_TIMEOUT_MS: {ms:?} is not a number of milliseconds"
                ))
            })?),
            None => crate::runtime::DEFAULT_IDLE_PARTITION_TIMEOUT,
        };
        let deserialize_threads = match var("LAMBDA_STREAMS_DESERIALIZE_THREADS") {
            Some(n) => n.trim().parse().map_err(|_| {
                StreamError::Config(format!(
                    "LAMBDA_STREAMS_DESERIALIZE_THREADS: {n:?} is not a number of threads (0: the function's CPUs, in Lambda one per 1,769 MB of memory)"
                ))
            })?,
            None => 0,
        };
        let overlap_reading = flag("LAMBDA_STREAMS_OVERLAP_READING")?;
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
        let dynamodb_lean = match var("LAMBDA_STREAMS_DYNAMODB_CLIENT")
            .as_deref()
            .map(str::trim)
        {
            None | Some("" | "lean") => true,
            Some("sdk") => false,
            Some(other) => {
                return Err(StreamError::Config(format!(
                    "LAMBDA_STREAMS_DYNAMODB_CLIENT: {other:?} is not sdk or lean"
                )));
            }
        };
        let output = match var("LAMBDA_STREAMS_OUTPUT_GUARANTEE") {
            Some(g) => g.parse().map_err(|e| {
                StreamError::Config(format!("LAMBDA_STREAMS_OUTPUT_GUARANTEE: {e}"))
            })?,
            None => OutputGuarantee::default(),
        };
        let function = var("AWS_LAMBDA_FUNCTION_NAME");
        let application_id = var("LAMBDA_STREAMS_APPLICATION_ID")
            .map(|id| id.trim().to_owned())
            .or_else(|| function.clone());
        if let Some(id) = &application_id
            && let Err(why) = crate::kafka::check_application_id(id)
        {
            return Err(StreamError::Config(format!(
                "LAMBDA_STREAMS_APPLICATION_ID: {id:?} {why}"
            )));
        }
        let event_read_committed = match var("LAMBDA_STREAMS_EVENT_ISOLATION").as_deref() {
            None | Some("read_uncommitted") => false,
            Some("read_committed") => true,
            Some(other) => {
                return Err(StreamError::Config(format!(
                    "LAMBDA_STREAMS_EVENT_ISOLATION: {other:?} is not read_committed or read_uncommitted"
                )));
            }
        };
        if output == OutputGuarantee::ExactlyOnce && application_id.is_none() {
            return Err(StreamError::Config(
                "LAMBDA_STREAMS_OUTPUT_GUARANTEE=exactly_once needs LAMBDA_STREAMS_APPLICATION_ID \
                 (or AWS_LAMBDA_FUNCTION_NAME): the prefix of the transactional ids and of the \
                 shadow consumer group"
                    .into(),
            ));
        }
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
                output,
                deserialize_threads,
                overlap_reading,
            },
            metrics_function,
            kafka: KafkaSettings::from_vars(vars.clone())?,
            aws_tls_roots,
            state_cache_bytes,
            dynamodb_lean,
            application_id,
            event_read_committed,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(vars: &[(&str, &str)]) -> Result<Config, StreamError> {
        Config::from_vars(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())))
    }

    fn refused(vars: &[(&str, &str)]) -> String {
        match config(vars) {
            Ok(c) => panic!("{vars:?} was taken: {c:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn the_cache_size_is_read_in_bytes_and_a_bad_value_names_the_variable() {
        assert_eq!(config(&[]).unwrap().state_cache_bytes, None);
        assert_eq!(
            config(&[("LAMBDA_STREAMS_STATE_CACHE_BYTES", "1048576")])
                .unwrap()
                .state_cache_bytes,
            Some(1 << 20)
        );
        assert_eq!(
            config(&[("LAMBDA_STREAMS_STATE_CACHE_BYTES", " 0 ")])
                .unwrap()
                .state_cache_bytes,
            Some(0),
            "0 turns the cache off"
        );
        assert_eq!(
            config(&[("LAMBDA_STREAMS_STATE_CACHE_BYTES", "  ")])
                .unwrap()
                .state_cache_bytes,
            None,
            "blank is unset"
        );
        for bad in ["16MiB", "-1", "1.5", "lots"] {
            let e = refused(&[("LAMBDA_STREAMS_STATE_CACHE_BYTES", bad)]);
            assert!(
                e.contains("LAMBDA_STREAMS_STATE_CACHE_BYTES") && e.contains(bad),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn each_setting_is_parsed_and_a_bad_value_names_its_variable() {
        let c = config(&[
            ("LAMBDA_STREAMS_TABLE", "state"),
            ("LAMBDA_STREAMS_GUARANTEE", "at_least_once"),
            ("LAMBDA_STREAMS_POISON_POLICY", "skip"),
            ("LAMBDA_STREAMS_PARTIAL_BATCH_RESPONSE", "true"),
            ("LAMBDA_STREAMS_IDLE_PARTITION_TIMEOUT_MS", "2500"),
            ("LAMBDA_STREAMS_SOURCE_PARTITIONS", "a:3, b-c:12"),
            ("LAMBDA_STREAMS_DESERIALIZE_THREADS", "1"),
            ("LAMBDA_STREAMS_OVERLAP_READING", "true"),
            ("LAMBDA_STREAMS_METRICS", "off"),
            ("AWS_LAMBDA_FUNCTION_NAME", "f"),
        ])
        .unwrap();
        assert_eq!(c.table.as_deref(), Some("state"));
        assert_eq!(c.guarantee, Guarantee::AtLeastOnce);
        assert!(matches!(c.batch.poison, PoisonPolicy::Skip));
        assert!(c.batch.partial_batch_response);
        assert_eq!(c.batch.idle_partition_timeout, Duration::from_millis(2500));
        assert_eq!(c.batch.deserialize_threads, 1);
        assert!(c.batch.overlap_reading);
        assert!(
            !config(&[]).unwrap().batch.overlap_reading,
            "off by default"
        );
        assert_eq!(
            c.batch.source_partitions.into_iter().collect::<Vec<_>>(),
            vec![("a".to_owned(), 3), ("b-c".to_owned(), 12)]
        );
        assert_eq!(c.metrics_function, None);
        assert!(c.dynamodb_lean, "the lean path is the default");
        assert!(
            config(&[("LAMBDA_STREAMS_DYNAMODB_CLIENT", "lean")])
                .unwrap()
                .dynamodb_lean
        );
        assert!(
            !config(&[("LAMBDA_STREAMS_DYNAMODB_CLIENT", "sdk")])
                .unwrap()
                .dynamodb_lean,
            "the SDK stays selectable"
        );
        let named = config(&[("AWS_LAMBDA_FUNCTION_NAME", "f")]).unwrap();
        assert_eq!(named.metrics_function.as_deref(), Some("f"));
        for (name, bad) in [
            ("LAMBDA_STREAMS_GUARANTEE", "twice"),
            ("LAMBDA_STREAMS_POISON_POLICY", "ignore"),
            ("LAMBDA_STREAMS_PARTIAL_BATCH_RESPONSE", "yes"),
            ("LAMBDA_STREAMS_IDLE_PARTITION_TIMEOUT_MS", "5s"),
            ("LAMBDA_STREAMS_DESERIALIZE_THREADS", "two"),
            ("LAMBDA_STREAMS_OVERLAP_READING", "yes"),
            ("LAMBDA_STREAMS_SOURCE_PARTITIONS", "a"),
            ("LAMBDA_STREAMS_SOURCE_PARTITIONS", "a:0"),
            ("LAMBDA_STREAMS_METRICS", "prometheus"),
            ("LAMBDA_STREAMS_DYNAMODB_CLIENT", "hyper"),
            ("LAMBDA_STREAMS_OUTPUT_GUARANTEE", "exactly-once"),
            ("LAMBDA_STREAMS_OUTPUT_GUARANTEE", "twice"),
            ("LAMBDA_STREAMS_APPLICATION_ID", "a b"),
            ("LAMBDA_STREAMS_EVENT_ISOLATION", "committed"),
        ] {
            let e = refused(&[(name, bad)]);
            assert!(e.contains(name), "{name}={bad}: {e}");
        }
    }

    #[test]
    fn the_output_guarantee_defaults_to_at_least_once_and_exactly_once_needs_an_application_id() {
        let c = config(&[]).unwrap();
        assert_eq!(c.batch.output, OutputGuarantee::AtLeastOnce);
        assert_eq!(c.application_id, None);
        let c = config(&[
            ("LAMBDA_STREAMS_OUTPUT_GUARANTEE", "exactly_once"),
            ("LAMBDA_STREAMS_APPLICATION_ID", "wordcount"),
        ])
        .unwrap();
        assert_eq!(c.batch.output, OutputGuarantee::ExactlyOnce);
        assert_eq!(c.application_id.as_deref(), Some("wordcount"));
        let c = config(&[
            ("LAMBDA_STREAMS_OUTPUT_GUARANTEE", "exactly_once"),
            ("AWS_LAMBDA_FUNCTION_NAME", "f"),
        ])
        .unwrap();
        assert_eq!(
            c.application_id.as_deref(),
            Some("f"),
            "the function name by default"
        );
        let c = config(&[("LAMBDA_STREAMS_OUTPUT_GUARANTEE", "at_least_once")]).unwrap();
        assert_eq!(c.batch.output, OutputGuarantee::AtLeastOnce);
        let e = refused(&[("LAMBDA_STREAMS_OUTPUT_GUARANTEE", "exactly_once")]);
        assert!(
            e.contains("LAMBDA_STREAMS_OUTPUT_GUARANTEE")
                && e.contains("LAMBDA_STREAMS_APPLICATION_ID"),
            "{e}"
        );
    }
}
