//! The aggregate cache of a [`DynamoStore`](super::DynamoStore): general aggregates' items
//! as this container last wrote them, within a budget of bytes.
//!
//! A batch folds onto the cached item and writes once, conditioned on the cached version.
//! The cache only saves requests, it never decides a value: an item that is not cached (or
//! cached stale, because another container wrote it since) costs one refused conditional
//! write, which returns the current item to fold onto. So eviction changes the cost of a
//! write, never its result.
//!
//! The budget is in bytes because items are: one item may hold up to 400 KB, so a bound by
//! count (100,000 items) could hold 40 GB in a function of 128 MB. An entry costs its item's
//! size as DynamoDB counts it (names and values) plus an estimate of the heap around it.
//! When an insertion would pass the budget, the entries written longest ago are evicted
//! first (a hot key, written every batch, stays); an item larger than the whole budget is
//! not cached.

use std::collections::{HashMap, VecDeque};

use aws_sdk_dynamodb::types::AttributeValue;

use super::Item;
use crate::state::limits;

/// The default budget of the aggregate cache: 16 MiB, sized for a 128 MB function (the
/// smallest Lambda size). A function peaks at 43–51 MB of resident memory on a 6 MB
/// event without the cache (BENCHMARKS.md section 4); 16 MiB more leaves room for a batch's
/// pending state (up to 400 KB per touched item) below 128 MB. A larger function can give
/// the cache more (`LAMBDA_STREAMS_STATE_CACHE_BYTES`); 0 turns it off.
pub const DEFAULT_CACHE_BYTES: usize = 16 * 1024 * 1024;

/// What one cached entry costs beyond its item's DynamoDB size: the map and queue entries
/// and the key's string (an estimate of the heap, not a measurement).
const ENTRY_OVERHEAD: usize = 96;
/// See [`ENTRY_OVERHEAD`]: per attribute (the name's `String`, the value's enum and
/// allocation).
const ATTRIBUTE_OVERHEAD: usize = 64;

/// Items by cache key, within a budget of bytes, evicting the longest-written first.
#[derive(Debug, Default)]
pub(super) struct Cache {
    /// Per key: the item, what it costs, and the write that put it there.
    items: HashMap<String, (Item, usize, u64)>,
    /// Keys in the order they were written, with the write's number (an entry whose number
    /// is not its key's current one was written again since: skipped).
    order: VecDeque<(String, u64)>,
    /// Writes so far.
    writes: u64,
    /// What the entries cost, in total: at most `budget`.
    bytes: usize,
    budget: usize,
}

impl Cache {
    /// An empty cache of at most `budget` bytes.
    pub(super) fn new(budget: usize) -> Self {
        Cache {
            budget,
            ..Cache::default()
        }
    }

    /// The item cached under `key`.
    pub(super) fn get(&self, key: &str) -> Option<&Item> {
        self.items.get(key).map(|(item, ..)| item)
    }

    /// Caches `item` under `key` (replacing what was there), evicting the entries written
    /// longest ago until it fits.
    pub(super) fn insert(&mut self, key: String, item: Item) {
        self.remove(&key);
        let cost = ENTRY_OVERHEAD
            + key.len()
            + item
                .iter()
                .map(|(name, value)| ATTRIBUTE_OVERHEAD + attribute_bytes(name, value))
                .sum::<usize>();
        if cost > self.budget {
            return;
        }
        self.shrink_to(self.budget - cost);
        self.writes += 1;
        self.bytes += cost;
        self.order.push_back((key.clone(), self.writes));
        self.items.insert(key, (item, cost, self.writes));
        // Keys written again leave stale places in the queue: drop them once they outnumber
        // the live ones, so the queue stays within twice the entries.
        if self.order.len() > 2 * self.items.len() + 16 {
            let items = &self.items;
            self.order
                .retain(|(key, write)| items.get(key).is_some_and(|(.., w)| w == write));
        }
    }

    /// Sets the budget to `budget` bytes, evicting what no longer fits.
    pub(super) fn set_budget(&mut self, budget: usize) {
        self.budget = budget;
        self.shrink_to(budget);
    }

    /// What the entries cost now, in total.
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    /// How many items are cached.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.items.len()
    }

    /// Evicts the entries written longest ago until they cost at most `bytes`.
    fn shrink_to(&mut self, bytes: usize) {
        while self.bytes > bytes {
            let Some((key, write)) = self.order.pop_front() else {
                break;
            };
            if self.items.get(&key).is_some_and(|(.., w)| *w == write) {
                self.remove(&key);
            }
        }
    }

    pub(super) fn remove(&mut self, key: &str) {
        if let Some((_, cost, _)) = self.items.remove(key) {
            self.bytes -= cost;
        }
    }
}

/// An attribute's size as DynamoDB counts it (name plus value; see [`limits`]).
pub(super) fn attribute_bytes(name: &str, value: &AttributeValue) -> usize {
    name.len()
        + match value {
            AttributeValue::S(s) => s.len(),
            AttributeValue::B(b) => b.as_ref().len(),
            AttributeValue::N(n) => n.parse::<i64>().map_or(n.len(), limits::number_bytes),
            AttributeValue::Ss(v) => v.iter().map(String::len).sum(),
            AttributeValue::Bs(v) => v.iter().map(|b| b.as_ref().len()).sum(),
            AttributeValue::Ns(v) => v.iter().map(String::len).sum(),
            AttributeValue::L(v) => 3 + v.iter().map(|a| 1 + attribute_bytes("", a)).sum::<usize>(),
            AttributeValue::M(m) => {
                3 + m
                    .iter()
                    .map(|(n, a)| 1 + attribute_bytes(n, a))
                    .sum::<usize>()
            }
            _ => 1,
        }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_dynamodb::primitives::Blob;

    /// An item with an aggregate of `bytes` bytes, at version `version`.
    fn item(bytes: usize, version: u64) -> Item {
        HashMap::from([
            ("a".to_owned(), AttributeValue::B(Blob::new(vec![7; bytes]))),
            ("ver".to_owned(), AttributeValue::N(version.to_string())),
        ])
    }

    #[test]
    fn the_budget_holds_whatever_is_inserted() {
        let budget = 64 * 1024;
        let mut cache = Cache::new(budget);
        // A pseudo-random mix of sizes and keys (some written again), deterministic.
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        for i in 0..5_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let key = format!("k{}", x % 300);
            let size = usize::try_from(x % 20_000).unwrap_or(0);
            cache.insert(key, item(size, i));
            assert!(cache.bytes() <= budget, "{} > {budget}", cache.bytes());
            let counted: usize = cache.items.values().map(|(_, cost, _)| cost).sum();
            assert_eq!(cache.bytes(), counted);
            assert!(cache.order.len() <= 2 * cache.items.len() + 17);
        }
        // An item larger than the whole budget is not cached, and evicts nothing.
        let before = cache.len();
        cache.insert("huge".to_owned(), item(budget, 1));
        assert!(cache.get("huge").is_none());
        assert_eq!(cache.len(), before);
    }

    #[test]
    fn the_longest_written_go_first_and_a_rewritten_key_stays() {
        // Each entry costs a bit over 1,000 bytes: three fit in 3,500.
        let mut cache = Cache::new(3_500);
        cache.insert("a".into(), item(800, 1));
        cache.insert("b".into(), item(800, 1));
        cache.insert("c".into(), item(800, 1));
        // "a" written again: now "b" is the longest written.
        cache.insert("a".into(), item(800, 2));
        cache.insert("d".into(), item(800, 1));
        assert!(cache.get("b").is_none());
        for key in ["a", "c", "d"] {
            assert!(cache.get(key).is_some(), "{key}");
        }
        assert_eq!(
            cache.get("a").and_then(|i| i.get("ver")),
            Some(&AttributeValue::N("2".into()))
        );
        // A smaller budget evicts down to it; 0 holds nothing.
        cache.set_budget(2_200);
        assert_eq!(cache.len(), 2);
        assert!(cache.get("c").is_none());
        cache.set_budget(0);
        assert_eq!((cache.len(), cache.bytes()), (0, 0));
        cache.insert("e".into(), item(1, 1));
        assert_eq!(cache.len(), 0);
    }
}
