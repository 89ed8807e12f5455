//! Topic administration and a line producer, for demos and tests.

use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::producer::{FutureProducer, FutureRecord};

/// How long a metadata request may take before the broker counts as unreachable.
pub const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a group request waits for its coordinator to settle (see [`with_coordinator`]).
pub const COORDINATOR_WAIT: Duration = Duration::from_secs(30);

/// Runs a consumer-group request (committed offsets, a commit), retrying it while the
/// group's coordinator is not ready: a broker that has just started creates and loads
/// `__consumer_offsets` on the first group request and answers `NOT_COORDINATOR`,
/// `COORDINATOR_NOT_AVAILABLE` or `COORDINATOR_LOAD_IN_PROGRESS` meanwhile, as it does
/// while a coordinator moves. Other errors, and the last one after [`COORDINATOR_WAIT`],
/// are returned as they are.
pub fn with_coordinator<T>(mut request: impl FnMut() -> KafkaResult<T>) -> KafkaResult<T> {
    let deadline = Instant::now() + COORDINATOR_WAIT;
    let mut pause = Duration::from_millis(50);
    loop {
        match request() {
            Err(e) if coordinator_settling(&e) && Instant::now() < deadline => {
                tracing::debug!(error = %e, "group coordinator not ready; retrying");
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            other => return other,
        }
    }
}

fn coordinator_settling(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::NotCoordinator
                | RDKafkaErrorCode::CoordinatorNotAvailable
                | RDKafkaErrorCode::CoordinatorLoadInProgress
        )
    )
}

fn admin(bootstrap: &str) -> Result<AdminClient<DefaultClientContext>, String> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .map_err(|e| format!("cannot create an admin client for {bootstrap}: {e}"))
}

/// Creates `topic` with `partitions` partitions (replication factor 1) unless it exists.
/// Returns whether it was created.
pub async fn create_topic(bootstrap: &str, topic: &str, partitions: i32) -> Result<bool, String> {
    let admin = admin(bootstrap)?;
    let options = AdminOptions::new().operation_timeout(Some(METADATA_TIMEOUT));
    let results = admin
        .create_topics(
            &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
            &options,
        )
        .await
        .map_err(|e| format!("cannot create topic {topic} on {bootstrap}: {e}"))?;
    match results.into_iter().next() {
        Some(Ok(_)) => Ok(true),
        Some(Err((_, RDKafkaErrorCode::TopicAlreadyExists))) => Ok(false),
        Some(Err((_, code))) => Err(format!(
            "cannot create topic {topic} on {bootstrap}: {code}"
        )),
        None => Err(format!(
            "cannot create topic {topic}: the broker gave no answer"
        )),
    }
}

/// The topics of the cluster with their partition counts, sorted; an unreachable broker
/// is an error naming it.
pub fn list_topics(bootstrap: &str) -> Result<Vec<(String, usize)>, String> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .map_err(|e| format!("cannot create a client for {bootstrap}: {e}"))?;
    let metadata = consumer
        .fetch_metadata(None, METADATA_TIMEOUT)
        .map_err(|e| format!("Kafka broker {bootstrap} cannot be reached: {e}"))?;
    let mut topics: Vec<(String, usize)> = metadata
        .topics()
        .iter()
        .filter(|t| !t.name().starts_with("__"))
        .map(|t| (t.name().to_owned(), t.partitions().len()))
        .collect();
    topics.sort();
    Ok(topics)
}

/// Produces each line as one record (null key) to `topic`, optionally to a fixed
/// partition, and waits for every acknowledgement. Returns how many were produced.
pub async fn produce_lines(
    bootstrap: &str,
    topic: &str,
    lines: impl IntoIterator<Item = String>,
    partition: Option<i32>,
) -> Result<usize, String> {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()
        .map_err(|e| format!("cannot create a producer for {bootstrap}: {e}"))?;
    let mut deliveries = Vec::new();
    for line in lines {
        let mut record = FutureRecord::<(), String>::to(topic).payload(&line);
        if let Some(p) = partition {
            record = record.partition(p);
        }
        let delivery = loop {
            match producer.send_result(record) {
                Ok(d) => break d,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err((e, _)) => return Err(format!("producing to {topic} failed: {e}")),
            }
        };
        deliveries.push(delivery);
    }
    let count = deliveries.len();
    for delivery in deliveries {
        match delivery.await {
            Ok(Ok(_)) => {}
            Ok(Err((e, _))) => return Err(format!("producing to {topic} failed: {e}")),
            Err(_) => return Err(format!("producing to {topic}: delivery report lost")),
        }
    }
    Ok(count)
}
