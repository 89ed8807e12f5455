//! Consuming: the group consumer and the offsets client, the end offsets that
//! `until_caught_up` waits for, taking in a received record under its partition's lease,
//! and pausing partitions that have enough buffered (backpressure).

use std::collections::BTreeMap;

use lambda_streams::event::{Record, TopicPartition};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::{ClientConfig, TopicPartitionList};

use super::commit::CaughtUp;
use super::state::Progress;
use super::{GroupConsumer, Runner};
use crate::admin::{METADATA_TIMEOUT, with_coordinator};
use crate::batch::{MAX_PAYLOAD_BYTES, to_record};
use crate::filter::FilterCriteria;
use crate::rebalance::RebalanceContext;
use crate::schema::{SchemaFailure, SchemaValidation};

/// A partition is paused when this many of its records are buffered (or
/// [`RunnerConfig::read_ahead_batches`](crate::RunnerConfig::read_ahead_batches) batches,
/// when more), or [`PAUSE_BYTES`] of them, and resumed below half of it. Far above one
/// batch on purpose: pausing makes librdkafka drop what it prefetched for the partition
/// and fetch it again on resume, which costs throughput (BENCHMARKS.md section 2); this
/// only bounds memory when the function falls far behind a backlog.
const PAUSE_RECORDS: usize = 10_000;
/// The buffered size at which a partition is paused: four full payloads.
const PAUSE_BYTES: usize = 4 * MAX_PAYLOAD_BYTES;

impl Runner {
    /// The group consumer (not yet subscribed), once the broker answers and every topic
    /// of the run exists.
    pub(super) fn consumer(&self) -> Result<GroupConsumer, String> {
        let c = &self.config;
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &c.bootstrap_servers)
            .set("group.id", &c.group_id)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", c.starting_position.auto_offset_reset());
        // The KIP-848 protocol takes the session timeout from the broker (librdkafka
        // refuses a client-side one).
        let next_gen = c
            .consumer_properties
            .iter()
            .any(|(k, v)| k == "group.protocol" && v.eq_ignore_ascii_case("consumer"));
        if !next_gen {
            config.set("session.timeout.ms", "10000");
        }
        for (key, value) in &c.consumer_properties {
            config.set(key, value);
        }
        let consumer: GroupConsumer = config
            .create_with_context(RebalanceContext::default())
            .map_err(|e| format!("cannot create a consumer for {}: {e}", c.bootstrap_servers))?;
        self.check_topics(&consumer)?;
        Ok(consumer)
    }

    /// Fails, naming the topic, if a topic of the run does not exist.
    fn check_topics(&self, consumer: &GroupConsumer) -> Result<(), String> {
        let c = &self.config;
        let metadata = consumer
            .fetch_metadata(None, METADATA_TIMEOUT)
            .map_err(|e| {
                format!(
                    "Kafka broker {} cannot be reached: {e}",
                    c.bootstrap_servers
                )
            })?;
        for topic in c.topics.iter().chain(&c.on_failure_topic) {
            if !metadata
                .topics()
                .iter()
                .any(|t| t.name() == topic && t.error().is_none())
            {
                return Err(format!(
                    "topic {topic:?} does not exist on {} (create it: local-runner topics create {topic})",
                    c.bootstrap_servers
                ));
            }
        }
        Ok(())
    }

    /// A client (no group) for the end offsets of partitions. Not the group consumer:
    /// a broker answers the requests of one connection in order, so on the consumer's
    /// connection a query waits behind its fetch, which the broker holds up to
    /// `fetch.wait.max.ms` (500 ms) when there is nothing new: about half a second per
    /// partition.
    pub(super) fn offsets_client(&self) -> Result<BaseConsumer, String> {
        let c = &self.config;
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &c.bootstrap_servers);
        // The connection's settings (TLS, SASL) apply to it too.
        for (key, value) in c.consumer_properties.iter().filter(|(k, _)| {
            ["security.", "ssl.", "sasl.", "client."]
                .iter()
                .any(|p| k.starts_with(p))
        }) {
            config.set(key, value);
        }
        config
            .create()
            .map_err(|e| format!("cannot create a client for {}: {e}", c.bootstrap_servers))
    }

    /// With `until_caught_up`, what the run waits for: the end offsets now, and where the
    /// group is.
    pub(super) fn targets(
        &self,
        consumer: &GroupConsumer,
        offsets: &BaseConsumer,
    ) -> Result<Option<CaughtUp>, String> {
        if !self.config.until_caught_up {
            return Ok(None);
        }
        let ends = self.end_offsets(offsets)?;
        let mut list = TopicPartitionList::new();
        for tp in ends.keys() {
            list.add_partition(&tp.topic, tp.partition);
        }
        let committed =
            with_coordinator(|| consumer.committed_offsets(list.clone(), METADATA_TIMEOUT))
                .map_err(|e| {
                    format!(
                        "cannot read the committed offsets of group {}: {e}",
                        self.config.group_id
                    )
                })?;
        Ok(Some(CaughtUp::new(ends, &committed)))
    }

    /// The (low, high) watermarks of every partition of the runner's topics.
    fn end_offsets(
        &self,
        client: &BaseConsumer,
    ) -> Result<BTreeMap<TopicPartition, (i64, i64)>, String> {
        let mut ends = BTreeMap::new();
        for topic in &self.config.topics {
            let metadata = client
                .fetch_metadata(Some(topic), METADATA_TIMEOUT)
                .map_err(|e| format!("cannot read the partitions of {topic}: {e}"))?;
            for t in metadata.topics() {
                for p in t.partitions() {
                    let watermarks = client
                        .fetch_watermarks(t.name(), p.id(), METADATA_TIMEOUT)
                        .map_err(|e| {
                            format!("cannot read the end offset of {}-{}: {e}", t.name(), p.id())
                        })?;
                    ends.insert(TopicPartition::new(t.name(), p.id()), watermarks);
                }
            }
        }
        Ok(ends)
    }

    /// Pauses the owned partitions with enough buffered records that consuming more would
    /// only grow memory, and resumes them once they are below half of it. Paused
    /// partitions stay paused across rebalances in librdkafka, so a partition is resumed
    /// as soon as its records are dropped, whoever owns it.
    pub(super) fn apply_backpressure(&self, consumer: &GroupConsumer, state: &mut Progress) {
        let records = PAUSE_RECORDS.max(
            self.config
                .read_ahead_batches
                .saturating_mul(self.config.batch_size),
        );
        let bytes = PAUSE_BYTES;
        let paused: Vec<TopicPartition> = state
            .leases
            .keys()
            .filter(|tp| !state.paused.contains(*tp))
            .filter(|tp| {
                let (n, b) = state.buffers.count_of(tp);
                n >= records || b >= bytes
            })
            .cloned()
            .collect();
        let resumed: Vec<TopicPartition> = state
            .paused
            .iter()
            .filter(|tp| {
                let (n, b) = state.buffers.count_of(tp);
                n < records / 2 && b < bytes / 2
            })
            .cloned()
            .collect();
        if !paused.is_empty() {
            match consumer.pause(&list(&paused)) {
                Ok(()) => state.paused.extend(paused),
                Err(e) => tracing::warn!(error = %e, "cannot pause partitions"),
            }
        }
        if !resumed.is_empty() {
            match consumer.resume(&list(&resumed)) {
                Ok(()) => {
                    for tp in &resumed {
                        state.paused.remove(tp);
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot resume partitions"),
            }
        }
    }
}

/// The partitions `tps` as an rdkafka list.
fn list(tps: &[TopicPartition]) -> TopicPartitionList {
    let mut list = TopicPartitionList::new();
    for tp in tps {
        list.add_partition(&tp.topic, tp.partition);
    }
    list
}

/// What became of a received record.
pub(super) enum TakenIn {
    /// Buffered, or done at once because it matched no filter.
    Buffered,
    /// Of a partition not owned: dropped.
    Dropped,
    /// Failed the schema validation: to give up on (it is marked done, not buffered).
    Invalid(TopicPartition, Box<Record>, SchemaFailure),
}

/// Buffers a received record if its partition is owned, after the schema validation if
/// there is one, and if it matches the `filter` (one that matches none is done at once).
/// A partition assigned again since its records were read is read afresh (what was
/// buffered of it is forgotten). `Err`: the registry could not be reached.
pub(super) fn take_in(
    consumer: &GroupConsumer,
    state: &mut Progress,
    filter: Option<&FilterCriteria>,
    message: BorrowedMessage<'_>,
    validation: Option<&SchemaValidation>,
) -> Result<TakenIn, String> {
    let tp = TopicPartition::new(message.topic(), message.partition());
    let mut record = to_record(&message);
    drop(message);
    // A rebalance runs inside `recv`: drop what was revoked first.
    state.drop_stale(consumer);
    let lease = consumer.context().assignment().lease(&tp);
    let Some(lease) = lease else {
        tracing::debug!(%tp, "record of a partition not owned: dropped");
        return Ok(TakenIn::Dropped);
    };
    if state.leases.get(&tp) != Some(&lease) {
        // Assigned again since its records were read: read afresh.
        state.forget(&tp);
        state.leases.insert(tp.clone(), lease);
    }
    if let Some(validation) = validation
        && let Err(failure) = validation.apply(&tp.topic, &mut record)?
    {
        state.buffers.skip(tp.clone(), record.offset);
        return Ok(TakenIn::Invalid(tp, Box::new(record), failure));
    }
    // The filter sees the value as the function would (after the schema validation).
    if filter.is_none_or(|f| f.matches(record.value.as_deref())) {
        state.buffers.push(tp, record);
    } else {
        // As the event source: a record no filter matches is done (committed), not delivered.
        state.buffers.skip(tp, record.offset);
        state.summary.filtered += 1;
    }
    Ok(TakenIn::Buffered)
}
