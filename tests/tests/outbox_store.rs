//! The outbox of aggregate updates (`state::outbox`, design notes section 5a) in the
//! DynamoDB store on the emulator, driven write by write through `Store::apply_outboxed`
//! as a batch under exactly-once output calls it: what each write emits, how many requests
//! it costs, and what the outbox costs in item bytes and write units. Expected emissions are
//! worked out by hand from the protocol (an update goes in the transaction of the record it
//! is kept under, and a batch emits the uncommitted entries of its range), not from the code.

use std::collections::HashMap;

use lambda_streams::event::TopicPartition;
use lambda_streams::state::dynamodb::DynamoStore;
use lambda_streams::state::outbox::{Emission, Outbox};
use lambda_streams::state::{Contribution, Fold, ItemWrite, StateErrorKind, Store, WriteStats};
use lambda_streams_e2e::*;

async fn store() -> (DynamoStore, String) {
    require_services();
    let (table, store) = exactly_once_store("outbox").await;
    (store, table)
}

fn partitions() -> Vec<TopicPartition> {
    vec![TopicPartition::new("in", 0), TopicPartition::new("in", 1)]
}

fn contributions(offsets: &[(u32, i64)]) -> Vec<Contribution> {
    offsets
        .iter()
        .map(|&(tp, offset)| Contribution {
            tp,
            offset,
            delta: 1,
        })
        .collect()
}

/// One write of item `key` of an additive store (a count) in a batch of `ranges`, with
/// the shadow offsets `shadow`.
async fn count(
    store: &DynamoStore,
    key: &[u8],
    offsets: &[(u32, i64)],
    shadow: [i64; 2],
    ranges: [(i64, i64); 2],
) -> (Vec<(u32, i64, u64, i64)>, WriteStats) {
    write(store, key, offsets, shadow, ranges, None).await
}

async fn write(
    store: &DynamoStore,
    key: &[u8],
    offsets: &[(u32, i64)],
    shadow: [i64; 2],
    ranges: [(i64, i64); 2],
    fold: Option<&dyn Fold>,
) -> (Vec<(u32, i64, u64, i64)>, WriteStats) {
    let partitions = partitions();
    let contributions = contributions(offsets);
    let hopped = HashMap::new();
    let outbox = Outbox {
        partitions: &partitions,
        shadow: &shadow,
        ranges: &ranges,
        hopped: &hopped,
        time: 5,
        updates: true,
        rejected: &[],
    };
    let write = ItemWrite {
        store: "counts",
        key,
        window: None,
        expires_at: None,
        timestamp: None,
        contributions: &contributions,
        partitions: &partitions,
        close_at: None,
        fold,
    };
    let (_, emissions, stats) = store
        .apply_outboxed(write, &outbox)
        .await
        .expect("the write");
    (summary(&emissions), stats)
}

/// Per emission: (partition index, offset, version, value).
fn summary(emissions: &[Emission]) -> Vec<(u32, i64, u64, i64)> {
    emissions
        .iter()
        .map(|e| {
            (
                e.tp,
                e.entry.offset,
                e.entry.state.version,
                e.entry.state.value,
            )
        })
        .collect()
}

const NONE: i64 = i64::MIN;

/// A count's updates, batch by batch of partition 0 (and one of both partitions): each
/// first write is one request; a batch retried before its commit re-emits its update from
/// the outbox, the same version and value, for one refused request; a shifted retry emits
/// the kept update, then its own; once the progress passes them, nothing is emitted again,
/// and after one more write that prunes what the fault left, writes are one request again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counts_updates_come_from_its_outbox_with_one_request_per_write() {
    let (store, _) = store().await;
    let k = b"k".as_slice();
    let empty = (0, -1);
    // Batch 0..=9 of partition 0, nothing committed: the count's first update, kept under
    // its last record (5).
    let (emitted, stats) = count(&store, k, &[(0, 2), (0, 5)], [NONE, NONE], [(0, 9), empty]).await;
    assert_eq!(emitted, vec![(0, 5, 1, 2)]);
    assert_eq!((stats.requests, stats.conditional_failures), (1, 0));
    // Its retry (the transaction did not commit): the same update from the outbox.
    let (emitted, stats) = count(&store, k, &[(0, 2), (0, 5)], [NONE, NONE], [(0, 9), empty]).await;
    assert_eq!(emitted, vec![(0, 5, 1, 2)]);
    assert_eq!((stats.requests, stats.conditional_failures), (1, 1));
    // A shifted retry 0..=14 adds record 12: the kept update, then version 2.
    let (emitted, stats) = count(
        &store,
        k,
        &[(0, 2), (0, 5), (0, 12)],
        [NONE, NONE],
        [(0, 14), empty],
    )
    .await;
    assert_eq!(emitted, vec![(0, 5, 1, 2), (0, 12, 2, 3)]);
    assert_eq!(stats.requests, 2, "refused, then the read-modify-write");
    // Committed up to 15; the next batch 15..=19: version 3 only. The fault left a list
    // in the item, so this one write costs a refused request and the read-modify-write,
    // which prunes the list back to the fast path's slot.
    let (emitted, stats) = count(&store, k, &[(0, 17)], [15, NONE], [(15, 19), empty]).await;
    assert_eq!(emitted, vec![(0, 17, 3, 4)]);
    assert_eq!((stats.requests, stats.conditional_failures), (2, 1));
    // And the next one is the fast path again: one request.
    let (emitted, stats) = count(&store, k, &[(0, 20)], [20, NONE], [(20, 20), empty]).await;
    assert_eq!(emitted, vec![(0, 20, 4, 5)]);
    assert_eq!((stats.requests, stats.conditional_failures), (1, 0));
    // A duplicate of 0..=14 delivered late: committed already, nothing to emit.
    let (emitted, _) = count(
        &store,
        k,
        &[(0, 2), (0, 5), (0, 12)],
        [21, NONE],
        [(0, 14), empty],
    )
    .await;
    assert_eq!(emitted, vec![]);
    // Both partitions in one batch: one update (version 5), in partition 0's transaction
    // (the first partition among the write's records) at its record 21.
    let (emitted, stats) = count(
        &store,
        k,
        &[(0, 21), (1, 3)],
        [21, NONE],
        [(21, 21), (0, 3)],
    )
    .await;
    assert_eq!(emitted, vec![(0, 21, 5, 7)]);
    assert_eq!((stats.requests, stats.conditional_failures), (1, 0));
    // Its retry with partition 1 alone (partition 0's transaction committed): partition 1
    // holds no update of it, so nothing is emitted again.
    let (emitted, _) = count(&store, k, &[(1, 3)], [22, NONE], [empty, (0, 3)]).await;
    assert_eq!(emitted, vec![]);
}

/// A general aggregate of `bytes` bytes (its value: the bytes, all `7`).
struct Sized(usize);

impl Fold for Sized {
    fn fold(
        &self,
        _current: Option<&[u8]>,
        _include: &dyn Fn(u32, i64) -> bool,
    ) -> Result<Vec<u8>, String> {
        Ok(vec![7; self.0])
    }
}

/// What the outbox costs a general aggregate: the item holds its aggregate twice (once as
/// the value, once in the uncommitted entry), so its bytes and write units double; an
/// aggregate that fits the 400 KB item limit alone but not with its entry is a poison
/// record of the record that made it, named, with nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_general_aggregate_s_outbox_doubles_its_bytes_and_counts_towards_400_kb() {
    let (store, _) = store().await;
    let empty = (0, -1);
    for bytes in [100usize, 2_000, 10_000] {
        let key = format!("agg-{bytes}");
        let (_, first) = write(
            &store,
            key.as_bytes(),
            &[(0, 1)],
            [NONE, NONE],
            [(0, 1), empty],
            Some(&Sized(bytes)),
        )
        .await;
        let (_, next) = write(
            &store,
            key.as_bytes(),
            &[(0, 2)],
            [2, NONE],
            [(2, 2), empty],
            Some(&Sized(bytes)),
        )
        .await;
        // The same aggregate without the outbox (at-least-once output), for comparison.
        let plain = {
            let partitions = partitions();
            let contributions = contributions(&[(0, 2)]);
            let fold = Sized(bytes);
            let key = format!("plain-{bytes}");
            let write = ItemWrite {
                store: "counts",
                key: key.as_bytes(),
                window: None,
                expires_at: None,
                timestamp: None,
                contributions: &contributions,
                partitions: &partitions,
                close_at: None,
                fold: Some(&fold),
            };
            store.apply(write).await.expect("write").1
        };
        eprintln!(
            "general aggregate of {bytes} bytes: without the outbox {:.1} WCU a write; with it, \
             first write {} request(s), {:.1} WCU; next batch's write {} request(s), {:.1} WCU",
            plain.consumed_write_units,
            first.requests,
            first.consumed_write_units,
            next.requests,
            next.consumed_write_units
        );
        assert_eq!(next.requests, 1, "cached: one write");
    }
    // 250 KB fits alone, not with its entry.
    let partitions = partitions();
    let contributions = contributions(&[(0, 1)]);
    let hopped = HashMap::new();
    let outbox = Outbox {
        partitions: &partitions,
        shadow: &[NONE, NONE],
        ranges: &[(0, 1), empty],
        hopped: &hopped,
        time: 5,
        updates: true,
        rejected: &[],
    };
    let fold = Sized(250 * 1024);
    let write = ItemWrite {
        store: "counts",
        key: b"huge",
        window: None,
        expires_at: None,
        timestamp: None,
        contributions: &contributions,
        partitions: &partitions,
        close_at: None,
        fold: Some(&fold),
    };
    store.apply(write).await.expect("alone, it fits");
    let write = ItemWrite {
        key: b"huge-outboxed",
        ..write
    };
    let e = store
        .apply_outboxed(write, &outbox)
        .await
        .expect_err("with its entry, it does not");
    match &e.kind {
        StateErrorKind::Rejected(rejected) => {
            assert_eq!(rejected.0.len(), 1, "{e}");
            assert_eq!((rejected.0[0].0, rejected.0[0].1), (0, 1), "{e}");
            assert!(rejected.0[0].2.contains("400 KB"), "{e}");
        }
        other => panic!("expected a rejected record, got {other}"),
    }
}

/// What the outbox costs a count: a handful of number attributes per event partition (the
/// fast path's slot), well under a write unit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_count_s_outbox_costs_a_slot_of_numbers() {
    let (store, table) = store().await;
    let empty = (0, -1);
    let (_, plain) = {
        let partitions = partitions();
        let contributions = contributions(&[(0, 1)]);
        let write = ItemWrite {
            store: "counts",
            key: b"plain",
            window: None,
            expires_at: None,
            timestamp: None,
            contributions: &contributions,
            partitions: &partitions,
            close_at: None,
            fold: None,
        };
        store.apply(write).await.expect("write")
    };
    let (_, outboxed) = count(
        &store,
        b"outboxed",
        &[(0, 1)],
        [NONE, NONE],
        [(0, 1), empty],
    )
    .await;
    let sizes = item_sizes(&table).await;
    eprintln!(
        "count item without outbox: {} bytes, {:.1} WCU; with: {} bytes, {:.1} WCU",
        sizes["counts#cGxhaW4"],
        plain.consumed_write_units,
        sizes["counts#b3V0Ym94ZWQ"],
        outboxed.consumed_write_units
    );
    assert!(sizes["counts#b3V0Ym94ZWQ"] - sizes["counts#cGxhaW4"] < 100);
}

/// Every item's size as DynamoDB counts it (attribute names plus values; numbers as their
/// digits, a close upper bound), by partition key.
async fn item_sizes(table: &str) -> HashMap<String, usize> {
    use aws_sdk_dynamodb::types::AttributeValue;
    let out = dynamo_client()
        .scan()
        .table_name(table)
        .consistent_read(true)
        .send()
        .await
        .expect("scan");
    out.items()
        .iter()
        .map(|item| {
            let size = item
                .iter()
                .map(|(name, value)| {
                    name.len()
                        + match value {
                            AttributeValue::S(s) => s.len(),
                            AttributeValue::N(n) => n.len().div_ceil(2) + 1,
                            AttributeValue::B(b) => b.as_ref().len(),
                            _ => 0,
                        }
                })
                .sum();
            let Some(AttributeValue::S(pk)) = item.get("pk") else {
                panic!("no pk")
            };
            (pk.clone(), size)
        })
        .collect()
}

/// A record rejected at write time is kept in the item as a dead-letter entry at its own
/// record (not an update): the write returns it to produce, a retry that finds the record
/// held returns it again, until the progress passes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_record_s_dead_letter_is_kept_until_committed() {
    let (store, _) = store().await;
    let partitions = partitions();
    let hopped = HashMap::new();
    let rejected = vec![(0u32, 1i64, "the adder failed".to_owned())];
    // Records 0 and 2 count; record 1 was rejected (kept in the write with no effect).
    let mut contributions = contributions(&[(0, 0), (0, 1), (0, 2)]);
    contributions[1].delta = 0;
    let letters = |emissions: &[Emission]| -> Vec<(u32, i64, String)> {
        emissions
            .iter()
            .filter_map(|e| {
                e.entry
                    .dead_letter
                    .clone()
                    .map(|r| (e.tp, e.entry.offset, r))
            })
            .collect()
    };
    for (shadow, rejected, want_letters, want_updates) in [
        // The write: its update and the dead letter of record 1.
        ([NONE, NONE], rejected.as_slice(), 1, vec![(0, 2, 1, 2)]),
        // Its retry, the transaction aborted: both again.
        ([NONE, NONE], &[][..], 1, vec![(0, 2, 1, 2)]),
        // Committed past record 1, not past 2: the update only.
        ([2, NONE], &[][..], 0, vec![(0, 2, 1, 2)]),
        // Committed: nothing.
        ([3, NONE], &[][..], 0, vec![]),
    ] {
        let outbox = Outbox {
            partitions: &partitions,
            shadow: &shadow,
            ranges: &[(0, 2), (0, -1)],
            hopped: &hopped,
            time: 5,
            updates: true,
            rejected,
        };
        let write = ItemWrite {
            store: "counts",
            key: b"k",
            window: None,
            expires_at: None,
            timestamp: None,
            contributions: &contributions,
            partitions: &partitions,
            close_at: None,
            fold: None,
        };
        let (_, emissions, _) = store.apply_outboxed(write, &outbox).await.expect("write");
        let found = letters(&emissions);
        assert_eq!(found.len(), want_letters, "{shadow:?}: {emissions:?}");
        if want_letters == 1 {
            assert_eq!(found[0], (0, 1, "the adder failed".to_owned()));
        }
        let updates: Vec<_> = summary(&emissions)
            .into_iter()
            .zip(&emissions)
            .filter(|(_, e)| e.entry.dead_letter.is_none())
            .map(|(s, _)| s)
            .collect();
        assert_eq!(updates, want_updates, "{shadow:?}");
    }
}
