//! The transport-agnostic [`Handler`]: executes a topology on Kafka events (decoded or
//! JSON) with its store and its output, as the Lambda adapter and the local runner call it.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;

use crate::config::Config;
use crate::dsl::Topology;
use crate::error::StreamError;
use crate::event::KafkaEvent;
use crate::kafka::{ExactlyOnceOutput, KafkaSettings, KafkaSink, KafkaTransactions};
use crate::runtime::{BatchOptions, BatchOutcome, OutputGuarantee};
use crate::sink::Sink;
use crate::state::Store;

/// Executes a topology on Lambda Kafka events, with its store and its Kafka output.
/// Built once per container; every invocation borrows it.
pub struct Handler {
    topology: Topology,
    store: Arc<dyn Store>,
    sink: SinkChoice,
    options: BatchOptions,
    metrics_function: Option<String>,
    application_id: Option<String>,
    event_read_committed: bool,
}

enum SinkChoice {
    Given(Arc<dyn Sink>),
    /// Created on first use, for the configured brokers or the event's own: one
    /// producer per brokers named, since one function can have event sources on several
    /// clusters and each event's output goes to its own cluster.
    Kafka {
        bootstrap_servers: Option<String>,
        settings: KafkaSettings,
        producers: Mutex<Vec<(String, Arc<KafkaSink>)>>,
        /// Under exactly-once output: the transactions per brokers named (their producers,
        /// one per source partition, are reused by later invocations).
        transactions: Mutex<Vec<(String, Arc<ExactlyOnceOutput>)>>,
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
            application_id: None,
            event_read_committed: false,
        }
    }

    /// The handler of a function with these settings: output to Kafka (to
    /// `config.bootstrap_servers`, or the event's own brokers) with the producer's
    /// connection settings, the batch options, and EMF metrics when
    /// `config.metrics_function` names the function. The one wiring of a function: the
    /// Lambda adapter ([`crate::lambda::run`]) and the local runner both build their
    /// handler with it, so a function runs locally with every setting it has in Lambda.
    pub fn from_config(topology: Topology, store: Arc<dyn Store>, config: &Config) -> Self {
        let mut handler =
            Handler::with_kafka_output(topology, store, config.bootstrap_servers.clone())
                .with_kafka_settings(config.kafka.clone())
                .with_options(config.batch.clone());
        handler.metrics_function = config.metrics_function.clone();
        handler.application_id = config.application_id.clone();
        handler.event_read_committed = config.event_read_committed;
        handler
    }

    /// [`from_config`](Self::from_config), refusing at once what every event would fail
    /// on: a topology the output guarantee cannot run (see [`check`](Self::check)).
    pub fn try_from_config(
        topology: Topology,
        store: Arc<dyn Store>,
        config: &Config,
    ) -> Result<Self, StreamError> {
        let handler = Handler::from_config(topology, store, config);
        handler.check()?;
        Ok(handler)
    }

    /// The output guarantee the handler runs with: exactly once when its options or the
    /// topology's builder ask for it.
    pub fn output_guarantee(&self) -> OutputGuarantee {
        if self.options.output == OutputGuarantee::ExactlyOnce
            || self.topology.output_guarantee() == OutputGuarantee::ExactlyOnce
        {
            OutputGuarantee::ExactlyOnce
        } else {
            OutputGuarantee::AtLeastOnce
        }
    }

    /// Whether the handler can run its topology under its output guarantee; every event
    /// fails with this error otherwise (never a silent at-least-once output). Under
    /// exactly-once output: the topology must not produce records without a source
    /// record ([`Topology::check_output_guarantee`]), and the output must be Kafka's with
    /// an application id.
    pub fn check(&self) -> Result<(), StreamError> {
        let guarantee = self.output_guarantee();
        if guarantee == OutputGuarantee::AtLeastOnce {
            return Ok(());
        }
        let refused = |why: String| {
            StreamError::Config(format!(
                "LAMBDA_STREAMS_OUTPUT_GUARANTEE=exactly_once: {why}"
            ))
        };
        self.topology
            .check_output_guarantee(guarantee)
            .map_err(|e| refused(e.to_string()))?;
        if matches!(self.sink, SinkChoice::Given(_)) {
            return Err(refused(
                "the output must be Kafka's (a handler with a given sink cannot run \
                 transactions): build it with `with_kafka_output` or `from_config`"
                    .into(),
            ));
        }
        if self.application_id.is_none() {
            return Err(refused(
                "no application id: set LAMBDA_STREAMS_APPLICATION_ID".into(),
            ));
        }
        Ok(())
    }

    /// Declares that the event source reads its topics with `read_committed` (see
    /// [`Config::event_read_committed`]).
    pub fn with_event_read_committed(mut self, read_committed: bool) -> Self {
        self.event_read_committed = read_committed;
        self
    }

    /// Sets the application id (under exactly-once output: the prefix of the transactional
    /// ids and of the shadow group; see [`Config::application_id`]).
    pub fn with_application_id(mut self, id: impl Into<String>) -> Self {
        self.application_id = Some(id.into());
        self
    }

    /// A handler producing output to Kafka: to `bootstrap_servers`, or when `None` to the
    /// cluster the event came from (each event's own `bootstrapServers`: a function with
    /// event sources on two clusters answers each with its own output). A producer is
    /// created on the first batch for its brokers and reused by every later invocation of
    /// the container that names them.
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
                producers: Mutex::new(Vec::new()),
                transactions: Mutex::new(Vec::new()),
            },
            options: BatchOptions::default(),
            metrics_function: None,
            application_id: None,
            event_read_committed: false,
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

    /// How batches are executed.
    pub fn options(&self) -> &BatchOptions {
        &self.options
    }

    /// The function name EMF metrics are printed under; `None`: no metrics.
    pub fn metrics_function(&self) -> Option<&str> {
        self.metrics_function.as_deref()
    }

    /// For a handler producing to Kafka: the configured brokers (`None`: the event's own)
    /// and the producer's connection settings; `None` for a handler whose sink is given.
    pub fn kafka_output(&self) -> Option<(Option<&str>, &KafkaSettings)> {
        match &self.sink {
            SinkChoice::Given(_) => None,
            SinkChoice::Kafka {
                bootstrap_servers,
                settings,
                ..
            } => Some((bootstrap_servers.as_deref(), settings)),
        }
    }

    /// Processes one decoded event.
    pub async fn handle_event(&self, event: &KafkaEvent) -> Result<BatchOutcome, StreamError> {
        self.check()?;
        if self.output_guarantee() == OutputGuarantee::ExactlyOnce {
            return self.handle_exactly_once(event).await;
        }
        let sink: Arc<dyn Sink> = match &self.sink {
            SinkChoice::Given(sink) => Arc::clone(sink),
            SinkChoice::Kafka {
                bootstrap_servers,
                settings,
                producers,
                ..
            } => {
                let servers = bootstrap_servers
                    .as_deref()
                    .unwrap_or(&event.bootstrap_servers);
                let mut producers = producers.lock().await;
                match producers.iter().find(|(named, _)| named == servers) {
                    Some((_, sink)) => Arc::clone(sink) as Arc<dyn Sink>,
                    None => {
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
                        producers.push((servers.to_owned(), Arc::clone(&sink)));
                        sink as Arc<dyn Sink>
                    }
                }
            }
        };
        let outcome = self
            .topology
            .process_with(event, self.store.as_ref(), sink.as_ref(), &self.options)
            .await?;
        self.log_batch(event, &outcome);
        Ok(outcome)
    }

    /// [`handle_event`](Self::handle_event) under exactly-once output: the batch through
    /// the transactions of the event's brokers (or the configured ones).
    async fn handle_exactly_once(&self, event: &KafkaEvent) -> Result<BatchOutcome, StreamError> {
        let SinkChoice::Kafka {
            bootstrap_servers,
            settings,
            transactions,
            ..
        } = &self.sink
        else {
            return Err(StreamError::Config(
                "LAMBDA_STREAMS_OUTPUT_GUARANTEE=exactly_once: the output must be Kafka's".into(),
            ));
        };
        let Some(application_id) = self.application_id.as_deref() else {
            return Err(StreamError::Config(
                "LAMBDA_STREAMS_OUTPUT_GUARANTEE=exactly_once: set LAMBDA_STREAMS_APPLICATION_ID"
                    .into(),
            ));
        };
        let servers = bootstrap_servers
            .as_deref()
            .unwrap_or(&event.bootstrap_servers);
        let output = {
            let mut transactions = transactions.lock().await;
            match transactions.iter().find(|(named, _)| named == servers) {
                Some((_, output)) => Arc::clone(output),
                None => {
                    let log = KafkaTransactions::connect(servers, settings, application_id).await?;
                    let mut output = ExactlyOnceOutput::new(application_id, Arc::new(log));
                    if !self.event_read_committed {
                        // The repartition topics are written in transactions; an event
                        // source reading read_uncommitted would deliver aborted records.
                        output = output.reread_committed(self.topology.repartition_topics());
                    }
                    let output = Arc::new(output);
                    transactions.push((servers.to_owned(), Arc::clone(&output)));
                    output
                }
            }
        };
        let (outcome, transactions) = output
            .process(&self.topology, event, self.store.as_ref(), &self.options)
            .await?;
        tracing::info!(
            initialised = transactions.initialised,
            reused = transactions.reused,
            committed = transactions.committed,
            seeded = transactions.seeded,
            skipped_outputs = transactions.skipped_outputs,
            uncommitted_records = transactions.uncommitted_records,
            "transactions committed"
        );
        self.log_batch(event, &outcome);
        Ok(outcome)
    }

    /// Logs a processed batch, and prints its EMF metrics.
    fn log_batch(&self, event: &KafkaEvent, outcome: &BatchOutcome) {
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
