//! The per-batch processing context that records flow through.

use std::collections::HashMap;

use crate::event::TopicPartition;
use crate::sink::OutputRecord;
use crate::state::Contribution;

/// Where the record being processed right now came from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Origin {
    /// A source record: index of its topic-partition in the batch, offset, timestamp.
    Record {
        tp: u32,
        offset: i64,
        timestamp: i64,
    },
    /// An update of a table after the batch's state writes: the item's version.
    Update { version: u64, timestamp: i64 },
}

/// One state item's pending contributions in this batch.
#[derive(Debug, Default)]
pub(crate) struct PendingItem {
    pub(crate) contributions: Vec<Contribution>,
    pub(crate) max_timestamp: i64,
}

/// State of one batch as records move through the topology: what the aggregations
/// will write, and what the sinks will produce.
pub(crate) struct Ctx {
    pub(crate) partitions: Vec<TopicPartition>,
    pub(crate) origin: Origin,
    /// Per store (by index), per encoded key: the batch's contributions, folded in memory.
    pub(crate) pending: Vec<HashMap<Vec<u8>, PendingItem>>,
    pub(crate) outputs: Vec<OutputRecord>,
    /// Records not aggregated because their key serialized to null.
    pub(crate) dropped_null_keys: u64,
}

impl Ctx {
    pub(crate) fn new(partitions: Vec<TopicPartition>, stores: usize) -> Self {
        Ctx {
            partitions,
            origin: Origin::Update {
                version: 0,
                timestamp: 0,
            },
            pending: (0..stores).map(|_| HashMap::new()).collect(),
            outputs: Vec::new(),
            dropped_null_keys: 0,
        }
    }

    /// Adds `delta` to the state item `key` of store `store`, attributed to the current record.
    pub(crate) fn contribute(&mut self, store: usize, key: Vec<u8>, delta: i64) {
        let Origin::Record {
            tp,
            offset,
            timestamp,
        } = self.origin
        else {
            // Updates of one table feeding another aggregation arrive with the DSL issue;
            // the builder does not let a topology express it yet.
            return;
        };
        let item = self.pending[store].entry(key).or_default();
        item.max_timestamp = item.max_timestamp.max(timestamp);
        match item.contributions.last_mut() {
            Some(last) if last.tp == tp && last.offset == offset => last.delta += delta,
            _ => item.contributions.push(Contribution { tp, offset, delta }),
        }
    }

    /// Forgets what the record at `offset` of partition `tp` contributed to pending state
    /// (after it failed part-way), so that the batch can go on without it.
    pub(crate) fn forget(&mut self, tp: u32, offset: i64) {
        for store in &mut self.pending {
            store.retain(|_, item| {
                item.contributions
                    .retain(|c| !(c.tp == tp && c.offset == offset));
                !item.contributions.is_empty()
            });
        }
    }

    /// The topic-partition and offset of the current record, for error messages.
    pub(crate) fn record_coordinates(&self) -> Option<(TopicPartition, i64)> {
        match self.origin {
            Origin::Record { tp, offset, .. } => {
                Some((self.partitions[tp as usize].clone(), offset))
            }
            Origin::Update { .. } => None,
        }
    }
}
