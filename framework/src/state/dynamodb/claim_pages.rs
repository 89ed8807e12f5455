//! A closing pass's claim whose records do not fit in its item.
//!
//! Under exactly-once output a closing pass's rewrite keeps the records it emits in the
//! item it rewrites (`cp:<slot>`), so that an attempt that re-claims them emits exactly
//! them again ([`Store::claim_closing_item`](crate::state::Store::claim_closing_item)).
//! Those records can be much larger than the item: a sliding window's closing pass emits
//! every window the item's records make (n records, up to 2n windows, each with its
//! aggregate), and the operators after the store may grow them. DynamoDB refuses an item
//! over 400 KB, on every retry, so such a claim kept in the item would stop its partition
//! for good.
//!
//! When the records do not fit beside what the item keeps, they are written first to
//! *pages*: items of their own under `__claimpages#<slot>#<attempt>#<item's partition
//! key>`, sort keys `1..=n`, each at most [`PAGE_BYTES`] of the records in attribute `p`.
//! The rewrite then keeps, instead of the records, `cg:<slot>` = `"<n> <bytes> <attempt>"`,
//! on the same condition as ever (the item's version is the one read). Pages are keyed by
//! the claiming attempt, so a concurrent closer of the same item (another partition, a
//! zombie) never overwrites the pages of the rewrite that won; a rewrite that loses deletes
//! its own. Finishing the claim deletes its pages. A crash between the pages' writes and the
//! rewrite leaves pages no claim names: they cost storage only, and are never read.

use aws_sdk_dynamodb::types::AttributeValue;

use super::{DynamoStore, Item, primary_key};
use crate::state::{StateError, StateErrorKind, WriteStats, limits};

/// The name of the attribute that names a slot's pages: `cg:<slot>`.
pub(super) fn pages_attribute(slot: i64) -> String {
    format!("cg:{slot}")
}

/// The records' bytes per page ([`limits::CLAIM_PAGE_BYTES`]).
pub(super) const PAGE_BYTES: usize = limits::CLAIM_PAGE_BYTES;

/// Where a claim's records are when they are not in its item: how many pages, how many
/// bytes in all, and the attempt whose pages they are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Pages {
    count: usize,
    bytes: usize,
    attempt: String,
}

impl Pages {
    /// The pages `outputs` takes, written by `attempt`.
    fn of(outputs: &[u8], attempt: &str) -> Self {
        Pages {
            count: outputs.len().div_ceil(PAGE_BYTES).max(1),
            bytes: outputs.len(),
            attempt: attempt.to_owned(),
        }
    }

    /// The value of `cg:<slot>`.
    pub(super) fn attribute(&self) -> String {
        format!("{} {} {}", self.count, self.bytes, self.attempt)
    }

    /// Parses the value of `cg:<slot>` (`None`: not one this store wrote).
    pub(super) fn parse(value: &str) -> Option<Self> {
        let mut parts = value.splitn(3, ' ');
        let count = parts.next()?.parse().ok()?;
        let bytes = parts.next()?.parse().ok()?;
        let attempt = parts.next()?.to_owned();
        Some(Pages {
            count,
            bytes,
            attempt,
        })
    }

    /// The partition key of the pages of slot `slot` of the item `item_pk`. A key so long
    /// that this would pass DynamoDB's partition key limit gets a digest of the item's
    /// partition key instead (two 64-bit hashes of it, and its length).
    fn key(&self, item_pk: &str, slot: i64) -> String {
        let key = format!("__claimpages#{slot}#{}#{item_pk}", self.attempt);
        if key.len() <= limits::MAX_PARTITION_KEY_BYTES {
            return key;
        }
        let hash = |seed: u64| {
            item_pk.bytes().fold(seed, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
            })
        };
        format!(
            "__claimpages#{slot}#{}#~{:016x}{:016x}{}",
            self.attempt,
            hash(0xcbf2_9ce4_8422_2325),
            hash(0x6c62_272e_07bb_0142),
            item_pk.len()
        )
    }
}

impl DynamoStore {
    /// Writes `outputs` as the pages of slot `slot` of `key`'s item (`item_pk`) by
    /// `attempt`: one `PutItem` a page.
    pub(super) async fn put_claim_pages(
        &self,
        (store, key, item_pk): (&str, &[u8], &str),
        slot: i64,
        attempt: &str,
        outputs: &[u8],
        stats: &mut WriteStats,
    ) -> Result<Pages, StateError> {
        let pages = Pages::of(outputs, attempt);
        let pk = pages.key(item_pk, slot);
        for (i, chunk) in outputs.chunks(PAGE_BYTES).enumerate() {
            stats.requests += 1;
            let mut item = primary_key(&pk, i as i64 + 1);
            item.insert("p".to_owned(), AttributeValue::B(chunk.to_vec().into()));
            self.client
                .put_item()
                .table_name(&self.table)
                .set_item(Some(item))
                .send()
                .await
                .map_err(|e| {
                    let why = format!(
                        "cannot write page {} of a closing pass's claim ({pk}): {}",
                        i + 1,
                        self.describe(&e)
                    );
                    StateError::new(store, key, StateErrorKind::Request(why))
                })?;
        }
        Ok(pages)
    }

    /// The records of slot `slot` of `key`'s item (`item_pk`) that `pages` names, read
    /// strongly consistent. A page missing, or records of another length than the claim
    /// names, is a corrupt claim: an error, never other records.
    pub(super) async fn read_claim_pages(
        &self,
        (store, key, item_pk): (&str, &[u8], &str),
        slot: i64,
        pages: &Pages,
        stats: &mut WriteStats,
    ) -> Result<Vec<u8>, StateError> {
        let pk = pages.key(item_pk, slot);
        let keys: Vec<Item> = (1..=pages.count as i64)
            .map(|sk| primary_key(&pk, sk))
            .collect();
        stats.requests += keys.len().div_ceil(100) as u64;
        let found = self
            .batch_get(keys)
            .await
            .map_err(|e| StateError::new(store, key, StateErrorKind::Request(e)))?;
        let mut parts: Vec<(i64, Vec<u8>)> = Vec::with_capacity(found.len());
        for item in found {
            let sk = super::number::<i64>(&item, "sk").unwrap_or(0);
            if let Some(AttributeValue::B(b)) = item.get("p") {
                parts.push((sk, b.as_ref().to_vec()));
            }
        }
        parts.sort_by_key(|(sk, _)| *sk);
        let outputs: Vec<u8> = parts.into_iter().flat_map(|(_, p)| p).collect();
        if outputs.len() != pages.bytes {
            let why = format!(
                "the claim of slot {slot} names {} pages of {} bytes under {pk}; {} bytes are there",
                pages.count,
                pages.bytes,
                outputs.len()
            );
            return Err(StateError::new(store, key, StateErrorKind::Corrupt(why)));
        }
        Ok(outputs)
    }

    /// Deletes the pages of slot `slot` of `key`'s item (`item_pk`) that `pages` names:
    /// one `DeleteItem` a page (a page already gone is no error).
    pub(super) async fn delete_claim_pages(
        &self,
        (store, key, item_pk): (&str, &[u8], &str),
        slot: i64,
        pages: &Pages,
        stats: &mut WriteStats,
    ) -> Result<(), StateError> {
        let pk = pages.key(item_pk, slot);
        for sk in 1..=pages.count as i64 {
            stats.requests += 1;
            self.client
                .delete_item()
                .table_name(&self.table)
                .set_key(Some(primary_key(&pk, sk)))
                .send()
                .await
                .map_err(|e| {
                    let why = format!(
                        "cannot delete page {sk} of a closing pass's claim ({pk}): {}",
                        self.describe(&e)
                    );
                    StateError::new(store, key, StateErrorKind::Request(why))
                })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_s_pages_are_named_as_written() {
        let pages = Pages::of(&vec![0u8; PAGE_BYTES * 2 + 1], "attempt-1");
        assert_eq!(pages.count, 3);
        assert_eq!(Pages::parse(&pages.attribute()), Some(pages.clone()));
        assert_eq!(Pages::parse("3 x attempt"), None);
        assert_eq!(
            pages.key("counts#Zm94", 7),
            "__claimpages#7#attempt-1#counts#Zm94"
        );
    }

    #[test]
    fn the_pages_of_a_long_key_stay_within_the_partition_key_limit() {
        let long = format!("store#{}", "A".repeat(limits::MAX_PARTITION_KEY_BYTES - 6));
        let other = format!("store#{}B", "A".repeat(limits::MAX_PARTITION_KEY_BYTES - 7));
        let pages = Pages::of(b"x", "attempt-1");
        let key = pages.key(&long, 1);
        assert!(
            key.len() <= limits::MAX_PARTITION_KEY_BYTES,
            "{}",
            key.len()
        );
        assert_ne!(key, pages.key(&other, 1));
    }
}
