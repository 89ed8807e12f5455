//! The outbox of aggregate updates (design notes, section 5a): under exactly-once output,
//! each state item keeps, per partition of the events that wrote it, the updates it
//! emitted and whose transaction may not have committed yet, so that a retried, shifted,
//! duplicated or zombie batch produces each `(key, version, value)` exactly as it was first
//! produced, instead of re-deriving it from the item's current state.
//!
//! An entry is `(offset -> update)`: the offset of the event's record (of partition `tp`)
//! in whose transaction the update goes, the item's state after the write, and the
//! update's timestamp. One write makes one entry, in the transaction of the first event
//! partition among its new contributions, at the highest event offset of that partition
//! among them (so that the partition's committed progress passes the entry exactly when
//! the transaction that carried it committed). Entries of `tp` below the shadow offset
//! `s[tp]` (the committed progress) are committed and pruned at the next write that knows
//! `s[tp]`.
//!
//! A batch emits, for each item it touches, the entries of its own partitions whose offset
//! lies in its range of that partition and at or above `s[tp]`, in version order: the
//! entries its earlier attempts (or a zombie) wrote and did not commit, then the entry of
//! its own write, if it applied anything new. The batch's commit moves `s[tp]` past every
//! one of them, so no later batch emits them again; a batch that does not commit leaves
//! them for its retry.

use std::collections::HashMap;

use crate::event::TopicPartition;

use super::{Contribution, ItemState};

/// What a write under exactly-once output needs to keep and read the item's outbox: the
/// event's partitions, their committed progress and ranges, and which event record each
/// contribution came with.
#[derive(Debug, Clone, Copy)]
pub struct Outbox<'a> {
    /// The event's partitions (the transactions), by index.
    pub partitions: &'a [TopicPartition],
    /// Per event partition: the shadow offset `s[tp]` (`i64::MIN`: nothing committed).
    pub shadow: &'a [i64],
    /// Per event partition: the first and last offsets whose outputs this batch commits
    /// (an empty range, `last < first`, when it commits none).
    pub ranges: &'a [(i64, i64)],
    /// Contributions attributed to repartitioned coordinates (partition index at or above
    /// `partitions.len()`), and the event record (partition index, offset) they came with.
    pub hopped: &'a HashMap<(u32, i64), (u32, i64)>,
    /// The update's timestamp when the item keeps no record time of its own.
    pub time: i64,
    /// Whether the write keeps an entry of its update (the store's updates reach a sink);
    /// `false`: the outbox keeps only dead letters.
    pub updates: bool,
    /// The write's records the store rejected in this batch (a key over DynamoDB's limits,
    /// an item past 400 KB, a fold that failed), by contribution coordinates, with why, to
    /// be dead-lettered: the write keeps a dead-letter entry of each at its event record,
    /// so that a retry that finds the record held (the item's watermark passed it) still
    /// produces the dead letter when the transaction that carried it aborted.
    pub rejected: &'a [(u32, i64, String)],
}

impl Outbox<'_> {
    /// The event record (partition index, offset) a contribution came with.
    pub fn origin(&self, c: &Contribution) -> Option<(u32, i64)> {
        if (c.tp as usize) < self.partitions.len() {
            return Some((c.tp, c.offset));
        }
        self.hopped.get(&(c.tp, c.offset)).copied()
    }

    /// Where the entry of a write whose new contributions are `new` goes: the first event
    /// partition among them and its highest offset among them (`None` when the write keeps
    /// no update entry).
    pub fn entry_origin<'c>(
        &self,
        new: impl IntoIterator<Item = &'c Contribution>,
    ) -> Option<(u32, i64)> {
        if !self.updates {
            return None;
        }
        let origins: Vec<(u32, i64)> = new.into_iter().filter_map(|c| self.origin(c)).collect();
        let tp = origins.first()?.0;
        origins
            .iter()
            .filter(|(p, _)| *p == tp)
            .map(|o| o.1)
            .max()
            .map(|offset| (tp, offset))
    }

    /// The dead-letter entries of the rejected records among `contributions` (a write's),
    /// by event partition index.
    pub fn dead_letters(&self, contributions: &[Contribution]) -> Vec<(u32, Entry)> {
        self.rejected
            .iter()
            .filter(|(tp, offset, _)| {
                contributions
                    .iter()
                    .any(|c| c.tp == *tp && c.offset == *offset)
            })
            .filter_map(|(tp, offset, reason)| {
                let c = Contribution {
                    tp: *tp,
                    offset: *offset,
                    delta: 0,
                };
                self.origin(&c).map(|(tp, offset)| {
                    (
                        tp,
                        Entry {
                            offset,
                            state: ItemState::number(0, 0),
                            time: 0,
                            dead_letter: Some(reason.clone()),
                        },
                    )
                })
            })
            .collect()
    }

    /// Whether the entry of partition index `tp` at `offset` is this batch's to emit: in
    /// its range and not committed.
    pub fn emits(&self, tp: u32, offset: i64) -> bool {
        let i = tp as usize;
        let (first, last) = self.ranges[i];
        offset >= first && offset <= last && offset >= self.shadow[i]
    }

    /// Whether the entry of partition index `tp` at `offset` is committed (prunable).
    pub fn committed(&self, tp: u32, offset: i64) -> bool {
        offset < self.shadow[tp as usize]
    }
}

/// One update kept in an item's outbox, or to be emitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The event record's offset whose transaction carries the update.
    pub offset: i64,
    /// The item's state right after the write.
    pub state: ItemState,
    /// The update's timestamp.
    pub time: i64,
    /// A dead-letter entry: not an update but the dead letter of the event record at
    /// `offset`, which the store rejected for this reason.
    pub dead_letter: Option<String>,
}

/// An update to produce in the transaction of event partition `tp` (index), as an output
/// of its record at `entry.offset`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Emission {
    /// The event partition's index.
    pub tp: u32,
    /// The update.
    pub entry: Entry,
}

/// Encodes entries as the outbox attribute's bytes: per entry, big-endian, the offset,
/// version, value, time (8 bytes each), a flags byte (1: a record time follows, 2: an
/// aggregate follows, 4: a dead letter's reason follows), the record time (8), the
/// aggregate and the reason (4-byte length, bytes, each).
pub fn encode(entries: &[Entry]) -> Vec<u8> {
    let mut out = Vec::with_capacity(encoded_len(entries));
    out.extend_from_slice(
        &u32::try_from(entries.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    for e in entries {
        out.extend_from_slice(&e.offset.to_be_bytes());
        out.extend_from_slice(&e.state.version.to_be_bytes());
        out.extend_from_slice(&e.state.value.to_be_bytes());
        out.extend_from_slice(&e.time.to_be_bytes());
        let flags = u8::from(e.state.timestamp.is_some())
            | (u8::from(e.state.aggregate.is_some()) << 1)
            | (u8::from(e.dead_letter.is_some()) << 2);
        out.push(flags);
        if let Some(t) = e.state.timestamp {
            out.extend_from_slice(&t.to_be_bytes());
        }
        let blobs = [
            e.state.aggregate.as_deref(),
            e.dead_letter.as_deref().map(str::as_bytes),
        ];
        for bytes in blobs.into_iter().flatten() {
            out.extend_from_slice(&u32::try_from(bytes.len()).unwrap_or(u32::MAX).to_be_bytes());
            out.extend_from_slice(bytes);
        }
    }
    out
}

/// The length of [`encode`]'s output.
pub fn encoded_len(entries: &[Entry]) -> usize {
    4 + entries
        .iter()
        .map(|e| {
            33 + e.state.timestamp.map_or(0, |_| 8)
                + e.state.aggregate.as_ref().map_or(0, |a| 4 + a.len())
                + e.dead_letter.as_ref().map_or(0, |r| 4 + r.len())
        })
        .sum::<usize>()
}

/// Decodes [`encode`]'s bytes.
pub fn decode(bytes: &[u8]) -> Result<Vec<Entry>, String> {
    let mut at = 0usize;
    let mut take = |n: usize| -> Result<&[u8], String> {
        let slice = bytes
            .get(at..at + n)
            .ok_or_else(|| format!("outbox attribute truncated at byte {at}"))?;
        at += n;
        Ok(slice)
    };
    let word = |s: &[u8]| i64::from_be_bytes(s.try_into().unwrap_or([0; 8]));
    let count = u32::from_be_bytes(take(4)?.try_into().unwrap_or([0; 4]));
    let mut entries = Vec::new();
    for _ in 0..count {
        let offset = word(take(8)?);
        let version = u64::from_be_bytes(take(8)?.try_into().unwrap_or([0; 8]));
        let value = word(take(8)?);
        let time = word(take(8)?);
        let flags = take(1)?[0];
        let timestamp = if flags & 1 != 0 {
            Some(word(take(8)?))
        } else {
            None
        };
        let mut blob = |present: bool| -> Result<Option<Vec<u8>>, String> {
            if !present {
                return Ok(None);
            }
            let len = u32::from_be_bytes(take(4)?.try_into().unwrap_or([0; 4])) as usize;
            Ok(Some(take(len)?.to_vec()))
        };
        let aggregate = blob(flags & 2 != 0)?;
        let dead_letter = blob(flags & 4 != 0)?
            .map(|r| String::from_utf8(r).map_err(|_| "a dead letter's reason is not UTF-8"))
            .transpose()?;
        entries.push(Entry {
            offset,
            state: ItemState {
                value,
                aggregate,
                version,
                timestamp,
            },
            time,
            dead_letter,
        });
    }
    Ok(entries)
}

/// Of an item's stored outbox (entries by event partition name), the ones this batch
/// emits, by partition index.
pub fn stored_emissions(
    outbox: &Outbox<'_>,
    stored: &HashMap<String, Vec<Entry>>,
) -> Vec<Emission> {
    let mut out = Vec::new();
    for (i, tp) in outbox.partitions.iter().enumerate() {
        let Some(entries) = stored.get(&tp.to_string()) else {
            continue;
        };
        let i = u32::try_from(i).unwrap_or(u32::MAX);
        out.extend(
            entries
                .iter()
                .filter(|e| outbox.emits(i, e.offset))
                .map(|e| Emission {
                    tp: i,
                    entry: e.clone(),
                }),
        );
    }
    out
}

/// The stored entries of event partition index `tp` a write keeps (the committed ones
/// pruned).
pub fn kept(outbox: &Outbox<'_>, tp: u32, entries: &[Entry]) -> Vec<Entry> {
    entries
        .iter()
        .filter(|e| !outbox.committed(tp, e.offset))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip() {
        let entries = vec![
            Entry {
                offset: 7,
                state: ItemState::number(-3, 2),
                time: 1000,
                dead_letter: None,
            },
            Entry {
                offset: i64::MAX,
                state: ItemState {
                    value: 0,
                    aggregate: Some(vec![1, 2, 3]),
                    version: 9,
                    timestamp: Some(-5),
                },
                time: -1,
                dead_letter: Some("the adder failed".into()),
            },
        ];
        let bytes = encode(&entries);
        assert_eq!(bytes.len(), encoded_len(&entries));
        assert_eq!(decode(&bytes).unwrap(), entries);
        assert!(decode(&bytes[..bytes.len() - 1]).is_err());
    }
}
