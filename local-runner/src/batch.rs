//! The records consumed and not yet done, per partition, and how events are formed from
//! them by the event source's rules.
//!
//! Invariant: a partition's queue holds exactly its records that are not done yet (not
//! delivered successfully, not given up on), in offset order. So the offset to commit for
//! a partition is always the first queued offset, or, when the queue is empty, the one
//! after the last record consumed.

use std::collections::{BTreeMap, VecDeque};

use lambda_streams::event::{
    Bytes, EventSource, Header, KafkaEvent, PartitionRecords, Record, TimestampType, TopicPartition,
};
use rdkafka::message::{Headers, Message};

/// The Lambda limit on an invocation's payload: 6 MB.
pub const MAX_PAYLOAD_BYTES: usize = 6 * 1024 * 1024;
/// The Lambda limit on records per batch.
pub const MAX_BATCH_SIZE: usize = 10_000;

/// Consumed records not done yet, per partition.
#[derive(Debug, Default)]
pub struct Buffers {
    parts: BTreeMap<TopicPartition, PartitionBuffer>,
    /// The estimated event JSON size of everything buffered.
    bytes: usize,
}

#[derive(Debug)]
struct PartitionBuffer {
    queue: VecDeque<Record>,
    /// The offset after the last record consumed.
    next: i64,
    /// The estimated event JSON size of the queue.
    bytes: usize,
}

impl Buffers {
    /// Appends a consumed record to its partition's queue.
    pub fn push(&mut self, tp: TopicPartition, record: Record) {
        let size = estimated_json_size(&tp, &record);
        self.bytes += size;
        let part = self.parts.entry(tp).or_insert(PartitionBuffer {
            queue: VecDeque::new(),
            next: record.offset,
            bytes: 0,
        });
        part.next = part.next.max(record.offset + 1);
        part.bytes += size;
        part.queue.push_back(record);
    }

    /// Marks the record at `offset` of `tp` done without buffering it (it matched no filter,
    /// or the schema validation gave up on it): the partition's position moves past it once
    /// the records before it are done.
    pub fn skip(&mut self, tp: TopicPartition, offset: i64) {
        let part = self.parts.entry(tp).or_insert(PartitionBuffer {
            queue: VecDeque::new(),
            next: offset + 1,
            bytes: 0,
        });
        part.next = part.next.max(offset + 1);
    }

    /// Records and estimated event size buffered in partition `tp`.
    pub fn count_of(&self, tp: &TopicPartition) -> (usize, usize) {
        self.parts
            .get(tp)
            .map_or((0, 0), |p| (p.queue.len(), p.bytes))
    }

    /// Records and estimated event size buffered in the partitions `select` accepts.
    pub fn count_where(&self, select: impl Fn(&TopicPartition) -> bool) -> (usize, usize) {
        self.parts
            .iter()
            .filter(|(tp, _)| select(tp))
            .fold((0, 0), |(n, b), (_, p)| (n + p.queue.len(), b + p.bytes))
    }

    /// Records buffered over all partitions.
    pub fn len(&self) -> usize {
        self.parts.values().map(|p| p.queue.len()).sum()
    }

    /// The estimated size in an event of everything buffered.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether nothing is buffered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The offset to commit for `tp`: its first record not done, or the offset after the
    /// last one consumed. `None` for a partition never consumed.
    pub fn position(&self, tp: &TopicPartition) -> Option<i64> {
        self.parts
            .get(tp)
            .map(|p| p.queue.front().map_or(p.next, |r| r.offset))
    }

    /// Marks the records of `tp` below `offset` done: drops them.
    pub fn complete(&mut self, tp: &TopicPartition, offset: i64) {
        if let Some(part) = self.parts.get_mut(tp) {
            while let Some(record) = part.queue.front().filter(|r| r.offset < offset) {
                let size = estimated_json_size(tp, record);
                self.bytes = self.bytes.saturating_sub(size);
                part.bytes = part.bytes.saturating_sub(size);
                part.queue.pop_front();
            }
        }
    }

    /// Removes and returns the records (of the partitions `select` accepts, anywhere in
    /// their queues) whose timestamp is below `cutoff_ms`: records too old to deliver.
    pub fn take_older_than(
        &mut self,
        cutoff_ms: i64,
        select: impl Fn(&TopicPartition) -> bool,
    ) -> Vec<(TopicPartition, Vec<Record>)> {
        let mut taken = Vec::new();
        for (tp, part) in &mut self.parts {
            if !select(tp) || !part.queue.iter().any(|r| r.timestamp < cutoff_ms) {
                continue;
            }
            let (old, keep): (Vec<Record>, Vec<Record>) =
                part.queue.drain(..).partition(|r| r.timestamp < cutoff_ms);
            part.queue = keep.into();
            let size: usize = old.iter().map(|r| estimated_json_size(tp, r)).sum();
            self.bytes = self.bytes.saturating_sub(size);
            part.bytes = part.bytes.saturating_sub(size);
            taken.push((tp.clone(), old));
        }
        taken
    }

    /// Forgets the partitions not in `keep` (after a rebalance took them away): their
    /// records will be delivered by whoever owns them now.
    pub fn retain(&mut self, keep: impl Fn(&TopicPartition) -> bool) {
        self.parts.retain(|tp, _| keep(tp));
        self.bytes = self.parts.values().map(|p| p.bytes).sum();
    }

    /// The partitions with something buffered or consumed.
    pub fn partitions(&self) -> impl Iterator<Item = &TopicPartition> {
        self.parts.keys()
    }

    /// The next event: the records of the buffered partitions in offset order, up to
    /// `limit` records and the 6 MB payload cap (a record is never split; one alone always
    /// goes, even when it is larger than the cap, and the function then sees it).
    pub fn form_event(
        &self,
        limit: usize,
        source: &EventSource,
        bootstrap_servers: &str,
    ) -> KafkaEvent {
        self.form_event_where(limit, |_| true, source, bootstrap_servers)
    }

    /// [`form_event`](Self::form_event) from the partitions `select` accepts only (those
    /// without a batch in flight, or the partitions of one retried batch).
    pub fn form_event_where(
        &self,
        limit: usize,
        select: impl Fn(&TopicPartition) -> bool,
        source: &EventSource,
        bootstrap_servers: &str,
    ) -> KafkaEvent {
        let mut size = EVENT_OVERHEAD + bootstrap_servers.len();
        let mut count = 0usize;
        let mut partitions = Vec::new();
        'partitions: for (tp, part) in self.parts.iter().filter(|(tp, _)| select(tp)) {
            let mut records = Vec::new();
            let mut full = false;
            for record in &part.queue {
                let record_size = estimated_json_size(tp, record);
                if count == limit || (count > 0 && size + record_size > MAX_PAYLOAD_BYTES) {
                    full = true;
                    break;
                }
                size += record_size;
                count += 1;
                records.push(record.clone());
            }
            if !records.is_empty() {
                size += tp.topic.len() + 16;
                partitions.push(PartitionRecords {
                    tp: tp.clone(),
                    records,
                });
            }
            if full {
                break 'partitions;
            }
        }
        KafkaEvent {
            source: source.clone(),
            bootstrap_servers: bootstrap_servers.to_owned(),
            partitions,
        }
    }
}

/// The event's fields other than records, with room for an ARN.
const EVENT_OVERHEAD: usize = 512;

/// An upper bound of a record's size in the event JSON.
pub fn estimated_json_size(tp: &TopicPartition, record: &Record) -> usize {
    let b64 = |n: usize| n.div_ceil(3) * 4;
    // A header is {"name":[b,b,...]}: each byte at most 4 characters ("-128") and a comma.
    let headers: usize = record
        .headers
        .iter()
        .map(|h| 2 * h.name.len() + 8 + h.value.len() * 5)
        .sum();
    let schema = |s: &Option<lambda_streams::event::SchemaMetadata>| {
        s.as_ref().map_or(0, |m| {
            64 + 2
                * (m.data_format.as_ref().map_or(0, String::len)
                    + m.schema_id.as_ref().map_or(0, String::len))
        })
    };
    200 + 2 * tp.topic.len()
        + record.key.as_ref().map_or(4, |k| b64(k.len()))
        + record.value.as_ref().map_or(4, |v| b64(v.len()))
        + headers
        + schema(&record.key_schema_metadata)
        + schema(&record.value_schema_metadata)
}

/// A consumed message as an event record.
pub fn to_record<M: Message>(message: &M) -> Record {
    let (timestamp, timestamp_type) = match message.timestamp() {
        rdkafka::Timestamp::LogAppendTime(t) => (t, TimestampType::LogAppendTime),
        rdkafka::Timestamp::CreateTime(t) => (t, TimestampType::CreateTime),
        rdkafka::Timestamp::NotAvailable => (0, TimestampType::CreateTime),
    };
    let headers = message
        .headers()
        .map(|hs| {
            hs.iter()
                .map(|h| {
                    Header::new(
                        h.key,
                        h.value.map(Bytes::copy_from_slice).unwrap_or_default(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    Record {
        offset: message.offset(),
        timestamp,
        timestamp_type,
        key: message.key().map(Bytes::copy_from_slice),
        value: message.payload().map(Bytes::copy_from_slice),
        headers,
        key_schema_metadata: None,
        value_schema_metadata: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(offset: i64, timestamp: i64, value_len: usize) -> Record {
        Record {
            offset,
            timestamp,
            timestamp_type: TimestampType::CreateTime,
            key: None,
            value: Some(vec![b'x'; value_len].into()),
            headers: vec![Header::new("h", vec![0x80, 0x7f])],
            key_schema_metadata: None,
            value_schema_metadata: None,
        }
    }

    #[test]
    fn a_skipped_record_is_done_once_the_records_before_it_are() {
        let tp = TopicPartition::new("t", 0);
        let mut buffers = Buffers::default();
        // Alone: the position moves past it.
        buffers.skip(tp.clone(), 4);
        assert_eq!(buffers.position(&tp), Some(5));
        assert!(buffers.is_empty());
        // Behind a buffered record: the position stays at that record until it is done.
        buffers.push(tp.clone(), record(5, 0, 1));
        buffers.skip(tp.clone(), 6);
        assert_eq!(buffers.position(&tp), Some(5));
        buffers.complete(&tp, 6);
        assert_eq!(buffers.position(&tp), Some(7));
    }

    #[test]
    fn events_respect_the_limit_and_the_payload_cap() {
        let mut buffers = Buffers::default();
        let (a, b) = (TopicPartition::new("t-x", 0), TopicPartition::new("t-x", 1));
        for o in 0..4 {
            buffers.push(a.clone(), record(o, 0, 1_200_000));
            buffers.push(b.clone(), record(o, 0, 10));
        }
        let event = buffers.form_event(100, &EventSource::SelfManaged, "b:9092");
        assert_eq!(
            event.record_count(),
            3,
            "three 1.2 MB records (1.6 MB in base64)"
        );
        assert_eq!(event.partitions.len(), 1);
        assert!(event.to_json().len() <= MAX_PAYLOAD_BYTES);
        buffers.complete(&a, 4);
        let event = buffers.form_event(3, &EventSource::SelfManaged, "b:9092");
        assert_eq!(event.record_count(), 3);
        assert_eq!(event.partitions[0].tp, b);
        assert_eq!(buffers.position(&a), Some(4));
        assert_eq!(buffers.position(&b), Some(0));
    }

    #[test]
    fn events_form_from_the_selected_partitions_only() {
        let mut buffers = Buffers::default();
        let tps: Vec<TopicPartition> = (0..3).map(|p| TopicPartition::new("t", p)).collect();
        for (i, tp) in tps.iter().enumerate() {
            for o in 0..=i as i64 {
                buffers.push(tp.clone(), record(o, 0, 10));
            }
        }
        // Partition 1 has a batch in flight: the others form the event.
        let fresh = |tp: &TopicPartition| tp.partition != 1;
        let (records, bytes) = buffers.count_where(fresh);
        assert_eq!(records, 1 + 3);
        assert!(bytes > 0 && bytes < buffers.bytes());
        let event = buffers.form_event_where(100, fresh, &EventSource::SelfManaged, "b");
        let parts: Vec<i32> = event.partitions.iter().map(|p| p.tp.partition).collect();
        assert_eq!(parts, [0, 2]);
        buffers.complete(&tps[2], 3);
        assert_eq!(
            buffers.count_where(fresh),
            (1, buffers.count_where(|tp| tp.partition == 0).1)
        );
        assert_eq!(buffers.count_where(|_| true).1, buffers.bytes());
    }

    #[test]
    fn one_record_over_the_cap_still_goes_alone() {
        let mut buffers = Buffers::default();
        let tp = TopicPartition::new("t", 0);
        buffers.push(tp.clone(), record(7, 0, MAX_PAYLOAD_BYTES));
        buffers.push(tp.clone(), record(8, 0, 1));
        let event = buffers.form_event(100, &EventSource::SelfManaged, "b");
        assert_eq!(event.record_count(), 1);
    }

    #[test]
    fn old_records_are_taken_and_positions_stay_correct() {
        let mut buffers = Buffers::default();
        let tp = TopicPartition::new("t", 2);
        for (o, ts) in [(10, 5), (11, 100), (12, 6)] {
            buffers.push(tp.clone(), record(o, ts, 1));
        }
        let taken = buffers.take_older_than(50, |_| true);
        let offsets: Vec<i64> = taken[0].1.iter().map(|r| r.offset).collect();
        assert_eq!(offsets, [10, 12]);
        assert_eq!(buffers.position(&tp), Some(11));
        buffers.complete(&tp, 12);
        assert_eq!(buffers.position(&tp), Some(13), "after the last consumed");
    }
}
