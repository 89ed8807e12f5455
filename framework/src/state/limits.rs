//! DynamoDB's limits, checked before every request by every store ([`MemoryStore`],
//! [`FaultyStore`], [`DynamoStore`]) from this one place, so that what the test driver
//! accepts is what Lambda accepts, and a record that would break a limit is a poison
//! record of that record (handled by the poison policy), never a batch that fails on every
//! retry.
//!
//! The limits (DynamoDB developer guide, "Constraints" and "Item sizes and formats"; 1 KB
//! is 1,024 bytes):
//!
//! | limit | value | what breaks it here |
//! |---|---|---|
//! | partition key | 2,048 bytes | `pk` = `<store>#<key as unpadded base64url>`: a key over ~1,530 bytes |
//! | sort key | 1,024 bytes | never: `sk` is a number (the window start), at most 11 bytes |
//! | item | 400 KB (409,600 bytes) | an aggregate (a hot key's stream-join buffer, a growing list) |
//! | expression | 4 KB (4,096 bytes), 300 operators | a write naming many partitions' watermarks: split, never refused |
//!
//! # Byte accounting
//! An item's size is the sum, over its attributes, of the attribute name's UTF-8 bytes and
//! the value's size:
//! - a string (`S`): its UTF-8 bytes;
//! - a binary (`B`): its raw bytes (not the base64 sent on the wire);
//! - a number (`N`): 1 byte, plus 1 byte per two significant digits (leading and trailing
//!   zeros trimmed, so `100` has one significant digit), plus 1 byte for a negative
//!   number ([`number_bytes`]).
//!
//! [`item_bytes`] applies these rules to the store's item layout (see
//! [`DynamoStore`]'s module docs): `pk`, `sk`, `v` (a count) or `a` (an aggregate), `ver`,
//! `k`, `fv`, `ttl`, `mt` and `cq`/`cl` where set, and one `w:<topic>-<partition>` per watermark.
//!
//! [`MemoryStore`]: super::memory::MemoryStore
//! [`FaultyStore`]: super::fault::FaultyStore
//! [`DynamoStore`]: super::dynamodb::DynamoStore

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};

use super::{Contribution, Fold, ItemWrite, StateError, StateErrorKind};

/// The item format version the stores write (`fv`), counted in every item.
const FORMAT_VERSION: i64 = 1;

/// DynamoDB's limit on a partition key value (bytes).
pub const MAX_PARTITION_KEY_BYTES: usize = 2048;
/// DynamoDB's limit on a sort key value (bytes).
pub const MAX_SORT_KEY_BYTES: usize = 1024;
/// DynamoDB's limit on an item: 400 KB.
pub const MAX_ITEM_BYTES: usize = 400 * 1024;
/// DynamoDB's limit on one expression string (update, condition).
pub const MAX_EXPRESSION_BYTES: usize = 4096;
/// How many source partitions' watermarks one update names at most. A write whose
/// contributions come from more partitions is sent as several updates of at most this
/// many partitions each (each exact on its own partitions' watermarks): the fast path's
/// condition costs ~47 bytes and 4 operators per partition, so 50 partitions stay within
/// the 4 KB expression and 300-operator limits (2,365 bytes, 199 operators; the update
/// expression, ~14 bytes per partition, is shorter).
pub const MAX_PARTITIONS_PER_UPDATE: usize = 50;

/// One update of a write split by source partitions ([`split`]): the partitions (indices
/// into [`ItemWrite::partitions`]) and their contributions.
#[derive(Debug, Clone)]
pub struct Part {
    partitions: Vec<u32>,
    contributions: Vec<Contribution>,
}

impl Part {
    /// The fold of `write` restricted to this part's partitions.
    pub fn fold<'a>(&'a self, write: &ItemWrite<'a>) -> Option<Restricted<'a>> {
        write.fold.map(|inner| Restricted {
            inner,
            partitions: &self.partitions,
        })
    }

    /// This part of `write`, with `fold` (this part's [`fold`](Self::fold)).
    pub fn write<'a>(
        &'a self,
        write: &ItemWrite<'a>,
        fold: Option<&'a Restricted<'a>>,
    ) -> ItemWrite<'a> {
        ItemWrite {
            contributions: &self.contributions,
            fold: fold.map(|f| f as &dyn Fold),
            ..*write
        }
    }
}

/// The updates a write is sent as: none (empty) when its contributions come from at most
/// [`MAX_PARTITIONS_PER_UPDATE`] source partitions (one update), otherwise one per that
/// many partitions, in partition order, each exact on its own partitions' watermarks (a
/// crash between them loses nothing). Every store splits the same way, so that they give
/// the same versions and the same fold order.
pub fn split(write: &ItemWrite<'_>) -> Vec<Part> {
    let mut partitions: Vec<u32> = write.contributions.iter().map(|c| c.tp).collect();
    partitions.sort_unstable();
    partitions.dedup();
    if partitions.len() <= MAX_PARTITIONS_PER_UPDATE {
        return Vec::new();
    }
    partitions
        .chunks(MAX_PARTITIONS_PER_UPDATE)
        .map(|chunk| Part {
            partitions: chunk.to_vec(),
            contributions: write
                .contributions
                .iter()
                .filter(|c| chunk.binary_search(&c.tp).is_ok())
                .copied()
                .collect(),
        })
        .collect()
}

/// A fold restricted to the contributions of some partitions (one [`Part`] of a split
/// write).
pub struct Restricted<'a> {
    inner: &'a dyn Fold,
    partitions: &'a [u32],
}

impl Fold for Restricted<'_> {
    fn fold(
        &self,
        current: Option<&[u8]>,
        include: &dyn Fn(u32, i64) -> bool,
    ) -> Result<Vec<u8>, String> {
        self.inner.fold(current, &|tp, offset| {
            self.partitions.binary_search(&tp).is_ok() && include(tp, offset)
        })
    }

    fn close_at(&self, aggregate: &[u8]) -> Option<Option<i64>> {
        self.inner.close_at(aggregate)
    }

    fn closes(&self) -> bool {
        self.inner.closes()
    }
}

/// The length of `<store>#<key as unpadded base64url>`, the item's partition key.
pub fn partition_key_bytes(store: &str, key: &[u8]) -> usize {
    store.len() + 1 + (key.len() * 4).div_ceil(3)
}

/// Whether the item key of `key` in `store` is within DynamoDB's key limits. A read of a
/// key over them finds nothing (no store can hold such an item), and is not sent: DynamoDB
/// would refuse the whole request, and with it the batch, on every retry.
pub fn key_fits(store: &str, key: &[u8]) -> bool {
    partition_key_bytes(store, key) <= MAX_PARTITION_KEY_BYTES
}

/// The size DynamoDB counts for a number attribute's value (see the module docs).
pub fn number_bytes(n: i64) -> usize {
    if n == 0 {
        return 1;
    }
    let digits = n.unsigned_abs().to_string();
    let significant = digits.trim_end_matches('0').len();
    significant.div_ceil(2) + 1 + usize::from(n < 0)
}

/// The value of a state item, for [`item_bytes`].
#[derive(Debug, Clone, Copy)]
pub enum ItemValue {
    /// A count or sum (`v`, a number).
    Number(i64),
    /// A general aggregate of this many bytes (`a`, a binary).
    Aggregate(usize),
}

/// The size DynamoDB counts for the item `write` leaves: its value, its version, and its
/// watermarks (`(topic-partition, offset)`: the stored ones and the write's new ones,
/// each partition once).
pub fn item_bytes<'a>(
    write: &ItemWrite<'_>,
    value: ItemValue,
    version: u64,
    watermarks: impl IntoIterator<Item = (&'a str, i64)>,
) -> usize {
    let version = i64::try_from(version).unwrap_or(i64::MAX);
    let mut size = 2
        + partition_key_bytes(write.store, write.key)
        + 2
        + number_bytes(write.window.unwrap_or(0))
        + 3
        + number_bytes(version)
        + 1
        + write.key.len()
        + 2
        + number_bytes(FORMAT_VERSION);
    size += match value {
        ItemValue::Number(n) => 1 + number_bytes(n),
        ItemValue::Aggregate(bytes) => 1 + bytes,
    };
    if let Some(at) = write.expires_at {
        size += 3 + number_bytes(at);
    }
    if let Some(at) = write.timestamp {
        size += 2 + number_bytes(at);
    }
    if let Some(at) = closing_time(write) {
        size += 2 + write.store.len() + 2 + number_bytes(at);
    }
    for (tp, offset) in watermarks {
        size += 2 + tp.len() + number_bytes(offset);
    }
    size
}

/// The closing time a write may set (`cq`, `cl`): its own, or, for a store that closes on
/// its content ([`Fold::closes`]), one of the longest a closing time can be.
fn closing_time(write: &ItemWrite<'_>) -> Option<i64> {
    write
        .close_at
        .or_else(|| write.fold.filter(|f| f.closes()).map(|_| i64::MIN))
}

/// The size DynamoDB counts for the update request a store sends to write `write` with
/// `value` and the new watermarks `marks`, before it reads the item (it refuses a request
/// over [`MAX_ITEM_BYTES`] as it refuses such an item): 3 bytes, plus, for each `SET` or
/// `ADD` action, 19 bytes, the attribute's name and the value's size. The request is the
/// one the DynamoDB store's read-modify-write sends: `SET k, fv, [ttl], [cq, cl], a` and
/// the watermarks, `ADD ver` (and `ADD v` for a count).
pub fn update_bytes<'a>(
    write: &ItemWrite<'_>,
    value: ItemValue,
    marks: impl IntoIterator<Item = (&'a str, i64)>,
) -> usize {
    const STATEMENT: usize = 3;
    const ACTION: usize = 19;
    let mut size = STATEMENT
        + ACTION
        + 1
        + write.key.len()
        + ACTION
        + 2
        + number_bytes(FORMAT_VERSION)
        + ACTION
        + 3
        + number_bytes(1);
    size += match value {
        ItemValue::Number(delta) => ACTION + 1 + number_bytes(delta),
        ItemValue::Aggregate(bytes) => ACTION + 1 + bytes,
    };
    if let Some(at) = write.expires_at {
        size += ACTION + 3 + number_bytes(at);
    }
    if let Some(at) = write.timestamp {
        size += ACTION + 2 + number_bytes(at);
    }
    if let Some(at) = closing_time(write) {
        size += ACTION + 2 + write.store.len() + ACTION + 2 + number_bytes(at);
    }
    for (tp, offset) in marks {
        size += ACTION + 2 + tp.len() + number_bytes(offset);
    }
    size
}

/// Checks a general aggregate of `bytes` against the 400 KB limit, both as the item it
/// leaves ([`item_bytes`], with `version` and every watermark after the write) and as the
/// update request that writes it ([`update_bytes`], with the write's new watermarks
/// `marks`): `Err` says why, for the record to blame.
pub fn check_aggregate<'a>(
    write: &ItemWrite<'_>,
    bytes: usize,
    version: u64,
    watermarks: impl IntoIterator<Item = (&'a str, i64)>,
    marks: impl IntoIterator<Item = (&'a str, i64)>,
) -> Result<(), String> {
    let value = ItemValue::Aggregate(bytes);
    let size = item_bytes(write, value, version, watermarks).max(update_bytes(write, value, marks));
    check_item_bytes(size)
}

/// The bytes a closing pass's pending claim adds to its item until the claiming
/// partition's next batch finishes it (the DynamoDB store's `ck:<slot>` = the partition,
/// `ca:<slot>` = the attempts, space-separated, `cp:<slot>` = the records emitted): a write
/// of the item meanwhile counts them towards its 400 KB.
pub fn closing_claim_bytes(slot: u64, tp: &str, attempts: &[String], outputs: &[u8]) -> usize {
    let name = 3 + slot.to_string().len();
    let attempts =
        attempts.iter().map(String::len).sum::<usize>() + attempts.len().saturating_sub(1);
    3 * name + tp.len() + attempts + outputs.len()
}

/// A closing pass's claimed records per page, when they do not fit in the item beside
/// what it keeps: with a page's keys and attribute names, within the 400 KB item limit
/// (the DynamoDB store's `__claimpages#…` items; `docs/state.md`).
pub const CLAIM_PAGE_BYTES: usize = MAX_ITEM_BYTES - MAX_PARTITION_KEY_BYTES - 4 * 1024;

/// At most the bytes a claim whose records are in pages keeps in its item instead of them
/// (`cg:<slot>` = pages, bytes and the attempt's id).
pub const CLAIM_PAGES_REFERENCE_BYTES: usize = 128;

/// Checks an item's size (as [`item_bytes`] counts it) against [`MAX_ITEM_BYTES`]: `Err`
/// says why, for the record to blame.
pub fn check_item_bytes(size: usize) -> Result<(), String> {
    if size <= MAX_ITEM_BYTES {
        return Ok(());
    }
    Err(format!(
        "the item would be {size} bytes, over DynamoDB's {MAX_ITEM_BYTES}-byte (400 KB) item limit"
    ))
}

/// Checks the item's keys: the partition key within [`MAX_PARTITION_KEY_BYTES`] (the sort
/// key, a number, is always within [`MAX_SORT_KEY_BYTES`]). A key over the limit is the
/// fault of every record of the key: each of the write's contributions is rejected.
pub fn check_keys(write: &ItemWrite<'_>) -> Result<(), StateError> {
    let bytes = partition_key_bytes(write.store, write.key);
    if bytes <= MAX_PARTITION_KEY_BYTES {
        return Ok(());
    }
    let reason = format!(
        "the item's partition key would be {bytes} bytes (the store name, '#' and the key \
         in base64url), over DynamoDB's {MAX_PARTITION_KEY_BYTES}-byte limit"
    );
    Err(rejected(
        write,
        write
            .contributions
            .iter()
            .map(|c| (c.tp, c.offset, reason.clone()))
            .collect(),
    ))
}

/// Checks an expression against [`MAX_EXPRESSION_BYTES`] before it is sent. The stores
/// split their writes so that this never fails; an error here is a bug, not a record's.
pub fn check_expression(write: &ItemWrite<'_>, expression: &str) -> Result<(), StateError> {
    if expression.len() <= MAX_EXPRESSION_BYTES {
        return Ok(());
    }
    Err(StateError::new(
        write.store,
        write.key,
        StateErrorKind::Request(format!(
            "an expression of {} bytes would pass DynamoDB's {MAX_EXPRESSION_BYTES}-byte limit",
            expression.len()
        )),
    ))
}

/// The error of a write whose `records` (`(partition index, offset, why)`) it cannot hold.
pub fn rejected(write: &ItemWrite<'_>, records: Vec<(u32, i64, String)>) -> StateError {
    StateError::new(
        write.store,
        write.key,
        StateErrorKind::Rejected(RejectedRecords(records)),
    )
}

/// The records a write cannot hold, with why: the store wrote nothing; the caller drops
/// them and writes the rest (see [`StateErrorKind::Rejected`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejectedRecords(pub Vec<(u32, i64, String)>);

impl std::fmt::Display for RejectedRecords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.first() {
            Some((_, _, why)) if self.0.len() == 1 => write!(f, "one record rejected: {why}"),
            Some((_, _, why)) => write!(f, "{} records rejected, the first: {why}", self.0.len()),
            None => write!(f, "no record rejected"),
        }
    }
}

/// Folds the write's new contributions (those `include` accepts) onto `current`, checking
/// the result with `fits` (`Err` with why when an aggregate of that many bytes would break
/// a limit).
///
/// The batch's values of one item are folded together and the aggregate encoded once (an
/// intermediate aggregate is never encoded, so only the batch's result must encode and
/// fit). When that fails, panics or does not fit, the records to blame are found as a
/// record-at-a-time processor would meet them: the first contribution, in the order the
/// aggregations fold them (by partition, then offset), whose addition to the ones accepted
/// before it makes the fold fail is rejected,
/// then the search goes on after it (a binary search over prefixes, exact when a failing
/// prefix stays failing as records are added: a panic on one value, an aggregate that
/// grows). They are returned as [`StateErrorKind::Rejected`]: the same stored item and
/// contributions always give the same blame, so a retry decides the same. A stored
/// aggregate that does not fold even without a new value (it does not decode, or no
/// longer encodes) is no record's fault: [`StateErrorKind::Aggregate`].
pub fn fold_within_limits(
    write: &ItemWrite<'_>,
    fold: &dyn Fold,
    current: Option<&[u8]>,
    include: &dyn Fn(u32, i64) -> bool,
    fits: &dyn Fn(usize) -> Result<(), String>,
) -> Result<Vec<u8>, StateError> {
    // The new contributions, in the order the aggregations fold them (by partition, then
    // offset: record at a time), and each one's place among them.
    let mut candidates: Vec<(u32, i64)> = write
        .contributions
        .iter()
        .filter(|c| include(c.tp, c.offset))
        .map(|c| (c.tp, c.offset))
        .collect();
    candidates.sort_unstable();
    candidates.dedup();
    let place: HashMap<(u32, i64), usize> = candidates
        .iter()
        .enumerate()
        .map(|(i, c)| (*c, i))
        .collect();
    // Folds the candidates before `upto` that are not `blamed`.
    let attempt = |upto: usize, blamed: &[bool]| -> Result<Vec<u8>, String> {
        let chosen = |tp: u32, offset: i64| {
            place
                .get(&(tp, offset))
                .is_some_and(|i| *i < upto && !blamed[*i])
        };
        let folded = catch_unwind(AssertUnwindSafe(|| fold.fold(current, &chosen)))
            .unwrap_or_else(|panic| {
                Err(format!(
                    "the aggregation panicked: {}",
                    panic_message(panic.as_ref())
                ))
            })?;
        fits(folded.len())?;
        Ok(folded)
    };
    let mut blamed = vec![false; candidates.len()];
    let all = candidates.len();
    if all == 0 {
        // Nothing new to blame (the stores do not fold a write that adds nothing).
        return attempt(0, &blamed)
            .map_err(|e| StateError::new(write.store, write.key, StateErrorKind::Aggregate(e)));
    }
    let mut why = match attempt(all, &blamed) {
        Ok(folded) => return Ok(folded),
        Err(e) => e,
    };
    if current.is_some()
        && let Err(e) = attempt(0, &blamed)
    {
        return Err(StateError::new(
            write.store,
            write.key,
            StateErrorKind::Aggregate(e),
        ));
    }
    let mut rejected_records = Vec::new();
    // Invariant: the accepted candidates before `start` fold (or `start` is 0), and all of
    // them, the failing `why` said, do not.
    let mut start = 0;
    loop {
        // The smallest `end` in start+1..=all whose prefix fails.
        let (mut low, mut high) = (start + 1, all);
        while low < high {
            let mid = low + (high - low) / 2;
            match attempt(mid, &blamed) {
                Ok(_) => low = mid + 1,
                Err(e) => {
                    why = e;
                    high = mid;
                }
            }
        }
        let (tp, offset) = candidates[low - 1];
        blamed[low - 1] = true;
        rejected_records.push((tp, offset, why));
        start = low;
        if start >= all {
            break;
        }
        match attempt(all, &blamed) {
            Ok(_) => break,
            Err(e) => why = e,
        }
    }
    Err(rejected(write, rejected_records))
}

/// The message of a caught panic.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::TopicPartition;

    #[test]
    fn numbers_are_sized_as_dynamodb_sizes_them() {
        // One byte, one per two significant digits, one for a minus sign.
        assert_eq!(number_bytes(0), 1);
        assert_eq!(number_bytes(7), 2);
        assert_eq!(number_bytes(100), 2);
        assert_eq!(number_bytes(12_345), 4);
        assert_eq!(number_bytes(-42), 3);
    }

    #[test]
    fn the_partition_key_limit_falls_between_1534_and_1535_key_bytes_for_a_one_letter_store() {
        assert_eq!(partition_key_bytes("c", &[b'x'; 1534]), 2048);
        assert!(key_fits("c", &[b'x'; 1534]));
        assert!(!key_fits("c", &[b'x'; 1535]));
    }

    /// Sums the values of records 0..n of partition 0 (value = offset + 1); panics on the
    /// offsets in `panics`, and cannot read a stored aggregate `b"bad"`.
    struct Sum {
        n: i64,
        panics: Vec<i64>,
    }

    impl Fold for Sum {
        fn fold(
            &self,
            current: Option<&[u8]>,
            include: &dyn Fn(u32, i64) -> bool,
        ) -> Result<Vec<u8>, String> {
            let mut sum: i64 = match current {
                Some(b"bad") => return Err("unreadable".into()),
                Some(bytes) => String::from_utf8_lossy(bytes).parse().unwrap_or(0),
                None => 0,
            };
            for offset in (0..self.n).filter(|o| include(0, *o)) {
                assert!(!self.panics.contains(&offset), "panics on {offset}");
                sum += offset + 1;
            }
            Ok(sum.to_string().into_bytes())
        }
    }

    fn write<'a>(
        contributions: &'a [Contribution],
        partitions: &'a [TopicPartition],
    ) -> ItemWrite<'a> {
        ItemWrite {
            store: "s",
            key: b"k",
            window: None,
            expires_at: None,
            timestamp: None,
            contributions,
            partitions,
            close_at: None,
            fold: None,
        }
    }

    fn contributions(n: i64) -> Vec<Contribution> {
        (0..n)
            .map(|offset| Contribution {
                tp: 0,
                offset,
                delta: 1,
            })
            .collect()
    }

    #[test]
    fn the_records_to_blame_are_the_ones_a_record_at_a_time_fold_would_fail_on() {
        let partitions = [TopicPartition::new("t", 0)];
        let all = contributions(10);
        let w = write(&all, &partitions);
        let sum = Sum {
            n: 10,
            panics: vec![3, 7],
        };
        let every = |_: u32, _: i64| true;
        let fits = |_: usize| Ok(());
        let error = fold_within_limits(&w, &sum, Some(b"100"), &every, &fits).expect_err("blame");
        let StateErrorKind::Rejected(RejectedRecords(blamed)) = error.kind else {
            panic!("{error}");
        };
        let offsets: Vec<i64> = blamed.iter().map(|b| b.1).collect();
        assert_eq!(offsets, [3, 7]);
        assert!(blamed[0].2.contains("panics on 3"), "{}", blamed[0].2);
        // Without them, the fold goes through: 100 + (1..=10) - 4 - 8.
        let clean = |_: u32, o: i64| o != 3 && o != 7;
        assert_eq!(
            fold_within_limits(&w, &sum, Some(b"100"), &clean, &fits).expect("fits"),
            b"143"
        );
        // A size limit blames the first record past it: 1 + 2 + 3 = 6 fits in one byte,
        // 10 needs two.
        let fine = Sum {
            n: 10,
            panics: vec![],
        };
        let one_byte = |bytes: usize| {
            if bytes <= 1 {
                Ok(())
            } else {
                Err("too big".into())
            }
        };
        let error = fold_within_limits(&w, &fine, None, &every, &one_byte).expect_err("blame");
        let StateErrorKind::Rejected(RejectedRecords(blamed)) = error.kind else {
            panic!("{error}");
        };
        assert_eq!(
            blamed.iter().map(|b| b.1).collect::<Vec<_>>(),
            (3..10).collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_stored_aggregate_that_does_not_fold_is_no_records_fault() {
        let partitions = [TopicPartition::new("t", 0)];
        let all = contributions(3);
        let w = write(&all, &partitions);
        let sum = Sum {
            n: 3,
            panics: vec![],
        };
        let error = fold_within_limits(&w, &sum, Some(b"bad"), &|_, _| true, &|_| Ok(()))
            .expect_err("unreadable");
        assert!(
            matches!(error.kind, StateErrorKind::Aggregate(_)),
            "{error}"
        );
    }
}
