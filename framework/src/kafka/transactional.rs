//! [`KafkaTransactions`]: the [`TransactionalLog`] of a real cluster, with rdkafka.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::producer::Producer;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use super::sink::context;
use super::{Committed, TransactionalLog, TransactionalProducer, TxnError};
use super::{KafkaSettings, KafkaSink, SinkContext};
use crate::error::StreamError;
use crate::event::TopicPartition;
use crate::sink::{OutputRecord, Sink};

/// How long a transactional step (init, offsets, commit, abort, the progress read) may
/// take before it fails the invocation.
const STEP_TIMEOUT: Duration = Duration::from_secs(30);

/// `transaction.timeout.ms` unless the settings set it: Lambda's longest function timeout
/// (15 minutes, also the broker's default `transaction.max.timeout.ms`), so that no
/// transaction of a running invocation is aborted by the coordinator; a zombie's open
/// transaction is aborted by the retry's `init_transactions`, not by this timeout.
const TRANSACTION_TIMEOUT_MS: &str = "900000";

/// Transactional producers and the shadow group's progress on one cluster.
pub struct KafkaTransactions {
    bootstrap_servers: String,
    settings: KafkaSettings,
    /// Configured with the shadow group's id and `isolation.level=read_committed` (so that
    /// `committed()` asks with `require_stable`), never subscribed: its group metadata
    /// (generation -1) goes with the transactional offset commits.
    consumer: Arc<BaseConsumer<SinkContext>>,
    /// The shadow group's id.
    group: String,
}

impl KafkaTransactions {
    /// The transactions of `application_id` on `bootstrap_servers`, connecting as
    /// `settings` say; the shadow group is `<application_id>-eos`.
    pub async fn connect(
        bootstrap_servers: &str,
        settings: &KafkaSettings,
        application_id: &str,
    ) -> Result<Self, StreamError> {
        let context = context(settings).await.map_err(StreamError::Config)?;
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", bootstrap_servers);
        for p in settings.properties() {
            config.set(&p.name, &p.value);
        }
        // An OffsetFetch that meets offsets of a transaction not materialised yet
        // (UNSTABLE_OFFSET_COMMIT, usually the previous batch's, a few ms after its commit)
        // is retried after retry.backoff.ms: 100 ms by default, which would be most of a
        // warm batch's latency.
        for (name, value) in [("retry.backoff.ms", "5"), ("retry.backoff.max.ms", "200")] {
            if !settings.properties().iter().any(|p| p.name == name) {
                config.set(name, value);
            }
        }
        config
            .set("group.id", format!("{application_id}-eos"))
            .set("isolation.level", "read_committed")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false");
        let consumer = config.create_with_context(context).map_err(|e| {
            StreamError::Config(format!(
                "cannot create the exactly-once output's consumer of group {application_id}-eos \
                 for {bootstrap_servers}: {e}"
            ))
        })?;
        Ok(KafkaTransactions {
            bootstrap_servers: bootstrap_servers.to_owned(),
            settings: settings.clone(),
            consumer: Arc::new(consumer),
            group: format!("{application_id}-eos"),
        })
    }
}

/// Runs a blocking librdkafka call off the async runtime.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, KafkaError> + Send + 'static,
) -> Result<T, KafkaError> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or(Err(KafkaError::Canceled))
}

#[async_trait]
impl TransactionalLog for KafkaTransactions {
    async fn producer(
        &self,
        transactional_id: &str,
    ) -> Result<Arc<dyn TransactionalProducer>, TxnError> {
        let mut more = vec![("transactional.id".to_owned(), transactional_id.to_owned())];
        if !self
            .settings
            .properties()
            .iter()
            .any(|p| p.name == "transaction.timeout.ms")
        {
            more.push((
                "transaction.timeout.ms".to_owned(),
                TRANSACTION_TIMEOUT_MS.to_owned(),
            ));
        }
        let sink = KafkaSink::connect_with(&self.bootstrap_servers, &self.settings, &more)
            .await
            .map_err(|e| TxnError::fatal(e.reason))?;
        let producer = sink.producer.clone();
        blocking(move || producer.init_transactions(STEP_TIMEOUT))
            .await
            .map_err(|e| TxnError::fatal(e.to_string()))?;
        Ok(Arc::new(KafkaTxnProducer {
            sink,
            consumer: Arc::clone(&self.consumer),
        }))
    }

    async fn read_committed(
        &self,
        tp: &TopicPartition,
        first: i64,
        last: i64,
    ) -> Result<Vec<i64>, TxnError> {
        // A consumer of its own per read (invocations of several partitions run at once),
        // assigned, never committing.
        let context = context(&self.settings).await.map_err(TxnError::abortable)?;
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.bootstrap_servers);
        for p in self.settings.properties() {
            config.set(&p.name, &p.value);
        }
        config
            .set("group.id", format!("{}-reread", self.group))
            .set("isolation.level", "read_committed")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false");
        let consumer: BaseConsumer<SinkContext> = config
            .create_with_context(context)
            .map_err(|e| TxnError::abortable(e.to_string()))?;
        let (topic, partition) = (tp.topic.clone(), tp.partition);
        blocking(move || {
            let mut list = TopicPartitionList::new();
            list.add_partition_offset(&topic, partition, Offset::Offset(first))?;
            consumer.assign(&list)?;
            let deadline = std::time::Instant::now() + STEP_TIMEOUT;
            let mut visible = Vec::new();
            loop {
                if let Some(message) = consumer.poll(Duration::from_millis(50)) {
                    let offset = rdkafka::Message::offset(&message?);
                    if offset <= last {
                        visible.push(offset);
                    }
                }
                // The position passes aborted records and transaction markers too: past
                // `last`, every transaction of the range is decided.
                let position = consumer
                    .position()?
                    .find_partition(&topic, partition)
                    .and_then(|e| match e.offset() {
                        Offset::Offset(o) => Some(o),
                        _ => None,
                    });
                if position.is_some_and(|p| p > last) {
                    return Ok(visible);
                }
                if std::time::Instant::now() > deadline {
                    return Err(KafkaError::Canceled);
                }
            }
        })
        .await
        .map_err(|e| match e {
            KafkaError::Canceled => TxnError::abortable(format!(
                "the range is not decided after {STEP_TIMEOUT:?} (a transaction still open)"
            )),
            e => TxnError::abortable(e.to_string()),
        })
    }

    async fn committed(
        &self,
        _group: &str,
        tps: &[TopicPartition],
    ) -> Result<Vec<Option<Committed>>, TxnError> {
        let mut list = TopicPartitionList::new();
        for tp in tps {
            list.add_partition(&tp.topic, tp.partition);
        }
        let consumer = Arc::clone(&self.consumer);
        let committed = blocking(move || consumer.committed_offsets(list, STEP_TIMEOUT))
            .await
            .map_err(|e| TxnError::abortable(e.to_string()))?;
        Ok(tps
            .iter()
            .map(|tp| {
                committed
                    .find_partition(&tp.topic, tp.partition)
                    .and_then(|e| match e.offset() {
                        Offset::Offset(n) => Some(Committed {
                            offset: n,
                            metadata: e.metadata().to_owned(),
                        }),
                        _ => None,
                    })
            })
            .collect())
    }
}

/// One transactional id's producer.
struct KafkaTxnProducer {
    sink: KafkaSink,
    consumer: Arc<BaseConsumer<SinkContext>>,
}

impl KafkaTxnProducer {
    /// `e` as a [`TxnError`]: fatal when the producer says it cannot go on (fenced).
    fn error(&self, e: impl std::fmt::Display) -> TxnError {
        match self.sink.producer.client().fatal_error() {
            Some((_, fatal)) => TxnError::fatal(format!("{e} (fatal: {fatal})")),
            None => TxnError::abortable(e.to_string()),
        }
    }
}

#[async_trait]
impl TransactionalProducer for KafkaTxnProducer {
    async fn begin(&self) -> Result<(), TxnError> {
        self.sink
            .producer
            .begin_transaction()
            .map_err(|e| self.error(e))
    }

    async fn send(&self, records: Vec<OutputRecord>) -> Result<(), TxnError> {
        self.sink.send(records).await.map_err(|e| self.error(e))
    }

    async fn send_offset(
        &self,
        _group: &str,
        tp: &TopicPartition,
        next: i64,
        attempt: &str,
    ) -> Result<(), TxnError> {
        let metadata = self.consumer.group_metadata().ok_or_else(|| {
            TxnError::abortable("the shadow group's consumer has no group metadata")
        })?;
        let mut list = TopicPartitionList::new();
        {
            let mut entry = list.add_partition(&tp.topic, tp.partition);
            entry
                .set_offset(Offset::Offset(next))
                .map_err(|e| TxnError::abortable(e.to_string()))?;
            entry.set_metadata(attempt);
        }
        let producer = self.sink.producer.clone();
        blocking(move || producer.send_offsets_to_transaction(&list, &metadata, STEP_TIMEOUT))
            .await
            .map_err(|e| self.error(e))
    }

    async fn commit(&self) -> Result<(), TxnError> {
        let producer = self.sink.producer.clone();
        blocking(move || producer.commit_transaction(STEP_TIMEOUT))
            .await
            .map_err(|e| self.error(e))
    }

    async fn abort(&self) -> Result<(), TxnError> {
        let producer = self.sink.producer.clone();
        blocking(move || producer.abort_transaction(STEP_TIMEOUT))
            .await
            .map_err(|e| self.error(e))
    }
}
