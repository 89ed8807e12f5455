//! Versioned tables (as Kafka Streams' versioned key-value stores, KIP-889): per key, the
//! values with their validity intervals by record timestamp, kept for a history retention,
//! so that a stream–table join reads the table **as of the stream record's timestamp**.
//!
//! A key's versions live in its one state item, written exactly once like every aggregate
//! (the item's watermarks), so a redelivered or retried table record inserts its version
//! once. The rules, Kafka Streams' (`RocksDBVersionedStore`), with one difference: Kafka
//! measures the history retention from the store's observed stream time (the newest
//! timestamp put into the store, over all keys), here from the key's own newest version
//! (the only time an item knows without reading the others; docs/kafka-streams-differences.md):
//!
//! - An update at a timestamp newer than (or equal to) the key's newest version becomes the
//!   latest value; an older one (out of order) is inserted into the history and does not
//!   replace the latest value. An update at the timestamp of an existing version replaces it.
//! - An update older than the newest version minus the history retention is dropped (Kafka's
//!   `PUT_RETURN_CODE_NOT_PUT`).
//! - A tombstone is a version too: the key has no value from its timestamp to the next
//!   version's.
//! - A lookup as of a time older than the newest version minus the retention finds nothing,
//!   and versions no such lookup can reach are pruned on every write.
//!
//! The item grows with the versions the retention keeps; an item that would pass DynamoDB's
//! 400 KB is refused before the write, as every aggregate: a poison record of the table
//! record that would grow it past the limit, named and handled by the poison policy
//! (`state/limits.rs`). Old versions are not dropped to make room, since that would change
//! what an as-of join finds without saying so: a table that needs more history than fits
//! should keep a shorter retention.

use std::sync::Arc;
use std::time::Duration;

use super::table::{Lookup, LookupTimestamp, LookupValue};
use super::{Downstream, KStream, KTable, StreamsBuilder};
use crate::serdes::{Nullable, Serde, SerdeError};
use crate::state::ItemState;

/// A key's versions: `(valid from, value or None for a tombstone)`, sorted by timestamp,
/// one per timestamp. Each is valid until the next one's timestamp; the last is the latest.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Versions<V> {
    pub(crate) versions: Vec<(i64, Option<V>)>,
}

impl<V> Default for Versions<V> {
    fn default() -> Self {
        Versions {
            versions: Vec::new(),
        }
    }
}

impl<V> Versions<V> {
    /// The key's newest timestamp (`None`: no version yet).
    fn newest(&self) -> Option<i64> {
        self.versions.last().map(|(ts, _)| *ts)
    }

    /// Puts `value` (None: a tombstone) valid from `ts`, under a history retention of
    /// `retention` milliseconds, then prunes the versions no lookup can reach.
    pub(crate) fn put(mut self, ts: i64, value: Option<V>, retention: i64) -> Self {
        if let Some(newest) = self.newest()
            && ts < newest.saturating_sub(retention)
        {
            // Older than the history retention: not put (Kafka drops it too).
            return self;
        }
        match self.versions.binary_search_by_key(&ts, |(t, _)| *t) {
            Ok(at) => self.versions[at].1 = value,
            Err(at) => self.versions.insert(at, (ts, value)),
        }
        let Some(newest) = self.newest() else {
            return self;
        };
        let horizon = newest.saturating_sub(retention);
        // A version is reachable while its validity ends after the horizon (the latest's
        // never ends).
        let first_kept = self
            .versions
            .windows(2)
            .position(|pair| pair[1].0 > horizon)
            .unwrap_or(self.versions.len() - 1);
        self.versions.drain(..first_kept);
        self
    }

    /// The value valid at `ts` (`None`: none, a tombstone, or older than the history
    /// retention of `retention` milliseconds).
    pub(crate) fn as_of(&self, ts: i64, retention: i64) -> Option<&V> {
        let newest = self.newest()?;
        if ts < newest.saturating_sub(retention) {
            return None;
        }
        let at = self.versions.partition_point(|(t, _)| *t <= ts);
        self.versions.get(at.checked_sub(1)?)?.1.as_ref()
    }

    /// The latest value (`None`: none or deleted) and its timestamp.
    pub(crate) fn latest(&self) -> Option<(Option<&V>, i64)> {
        self.versions.last().map(|(ts, v)| (v.as_ref(), *ts))
    }
}

/// A versioned table's stored versions: `4`, then per version its timestamp (8 bytes, big
/// endian), `1` and the value's length (4 bytes, big endian) and bytes, or `0` for a
/// tombstone.
pub(crate) struct VersionsSerde<S>(pub(crate) S);

impl<V, S: Serde<V>> Serde<Versions<V>> for VersionsSerde<S> {
    fn serialize(&self, value: &Versions<V>) -> Option<Vec<u8>> {
        self.try_serialize(value).ok().flatten()
    }

    fn try_serialize(&self, value: &Versions<V>) -> Result<Option<Vec<u8>>, SerdeError> {
        let mut out = vec![4];
        for (ts, v) in &value.versions {
            out.extend_from_slice(&ts.to_be_bytes());
            match v {
                None => out.push(0),
                Some(v) => {
                    let bytes = self.0.try_serialize(v)?.unwrap_or_default();
                    let len = u32::try_from(bytes.len())
                        .map_err(|_| SerdeError("a versioned value passes 4 GiB".into()))?;
                    out.push(1);
                    out.extend_from_slice(&len.to_be_bytes());
                    out.extend_from_slice(&bytes);
                }
            }
        }
        Ok(Some(out))
    }

    fn deserialize(&self, data: Option<&[u8]>) -> Result<Versions<V>, SerdeError> {
        let cut = || SerdeError("a stored versioned table value is cut short".into());
        let mut rest = match data {
            None => return Ok(Versions { versions: vec![] }),
            Some([4, rest @ ..]) => rest,
            Some(_) => return Err(SerdeError("not a stored versioned table value".into())),
        };
        let mut versions = Vec::new();
        while !rest.is_empty() {
            let ts: [u8; 8] = rest
                .get(..8)
                .ok_or_else(cut)?
                .try_into()
                .map_err(|_| cut())?;
            let ts = i64::from_be_bytes(ts);
            match rest.get(8) {
                Some(0) => {
                    versions.push((ts, None));
                    rest = &rest[9..];
                }
                Some(1) => {
                    let len: [u8; 4] = rest
                        .get(9..13)
                        .ok_or_else(cut)?
                        .try_into()
                        .map_err(|_| cut())?;
                    let len = u32::from_be_bytes(len) as usize;
                    let bytes = rest.get(13..13 + len).ok_or_else(cut)?;
                    versions.push((ts, Some(self.0.deserialize(Some(bytes))?)));
                    rest = &rest[13 + len..];
                }
                _ => return Err(SerdeError("not a stored versioned table value".into())),
            }
        }
        Ok(Versions { versions })
    }
}

/// A history retention in milliseconds (saturating: a retention past `i64::MAX` ms keeps
/// everything).
fn retention_ms(history_retention: Duration) -> i64 {
    i64::try_from(history_retention.as_millis()).unwrap_or(i64::MAX)
}

impl StreamsBuilder {
    /// Reads `topic` as a **versioned table**, as Kafka Streams' `builder.table(topic,
    /// Materialized.as(Stores.persistentVersionedKeyValueStore(store, historyRetention)))`:
    /// per key, every value with the time from which it is valid (its record's timestamp)
    /// for `history_retention` behind the key's newest version, kept in `store`. A
    /// tombstone deletes the key from its timestamp on.
    ///
    /// What differs from [`table`](Self::table):
    /// - An update older than the key's latest value (out of order) goes into the history
    ///   and does **not** replace the latest value; the table's updates
    ///   ([`KTable::to_stream`], table–table joins) are the latest value after each batch,
    ///   with the timestamp of the record that set it.
    /// - A stream–table [`join`](KStream::join) or [`left_join`](KStream::left_join) reads
    ///   the value **as of the stream record's timestamp**, so a stream record joins the
    ///   version that was valid when it happened, whichever of the two arrived first within
    ///   the batch and the history.
    ///
    /// The rules of the history (and the one difference from Kafka Streams: the retention
    /// counts from the key's own newest version) are in docs/state.md ("Versioned tables").
    /// Cost: the item holds every version the retention keeps; one that would pass 400 KB is
    /// a poison record of the table record that grows it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lambda_streams::driver::TestDriver;
    /// use lambda_streams::serdes::Utf8;
    /// use lambda_streams::StreamsBuilder;
    ///
    /// let builder = StreamsBuilder::new();
    /// let prices = builder.versioned_table("prices", Utf8, Utf8, "prices", Duration::from_secs(3600));
    /// builder
    ///     .stream("orders", Utf8, Utf8)
    ///     .join(&prices, |_, order: String, price: String| format!("{order} at {price}"))
    ///     .to("priced", Utf8, Utf8);
    /// let driver = TestDriver::new(builder.build());
    /// let mut price = driver.input_topic("prices", Utf8, Utf8);
    /// price.pipe_input_with_timestamp("tea", "3".to_owned(), 1_000)?;
    /// price.pipe_input_with_timestamp("tea", "4".to_owned(), 5_000)?;
    /// // An order placed at 2 s, arriving after the price changed at 5 s, pays the old price.
    /// driver.input_topic("orders", Utf8, Utf8).pipe_input_with_timestamp("tea", "1 cup".to_owned(), 2_000)?;
    /// assert_eq!(driver.output_topic("priced", Utf8, Utf8).read_values()?, ["1 cup at 3"]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn versioned_table<K, V>(
        &self,
        topic: &str,
        key_serde: impl Serde<K>,
        value_serde: impl Serde<V>,
        store: &str,
        history_retention: Duration,
    ) -> KTable<K, V>
    where
        K: Clone + Send + Sync + 'static,
        V: Clone + Send + Sync + 'static,
    {
        let key_serde: Arc<dyn Serde<K>> = Arc::new(key_serde);
        let value_serde: Arc<dyn Serde<V>> = Arc::new(value_serde);
        self.stream(
            topic,
            Arc::clone(&key_serde),
            Nullable(Arc::clone(&value_serde)),
        )
        .versioned(key_serde, value_serde, store, history_retention)
    }
}

impl<K, V> KStream<K, V>
where
    K: Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// The stream as a **versioned table** (as Kafka Streams' `KStream::toTable` with a
    /// versioned store): every value per key with the time from which it is valid, for
    /// `history_retention`, kept in `store`. See
    /// [`StreamsBuilder::versioned_table`] for what versioning changes.
    pub fn to_versioned_table(
        &self,
        store: &str,
        key_serde: impl Serde<K>,
        value_serde: impl Serde<V>,
        history_retention: Duration,
    ) -> KTable<K, V> {
        let key_serde: Arc<dyn Serde<K>> = Arc::new(key_serde);
        let value_serde: Arc<dyn Serde<V>> = Arc::new(value_serde);
        self.map_values(Some)
            .versioned(key_serde, value_serde, store, history_retention)
    }
}

impl<K, V> KStream<K, Option<V>>
where
    K: Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// The versioned table of this stream's values (`None`: a tombstone) by key.
    fn versioned(
        &self,
        key_serde: Arc<dyn Serde<K>>,
        value_serde: Arc<dyn Serde<V>>,
        store: &str,
        history_retention: Duration,
    ) -> KTable<K, V> {
        let retention = retention_ms(history_retention);
        let stamped = {
            let next = Downstream::<K, (Option<V>, i64)>::new();
            let out = next.clone();
            self.downstream().add(Arc::new(move |ctx, key, value| {
                let timestamp = ctx.timestamp();
                out.forward(ctx, key, (value, timestamp))
            }));
            KStream::from_node(self.shared(), next, self.node())
        };
        stamped
            .group_by_key(key_serde)
            .aggregate_closing(
                store,
                Versions::default,
                move |_, (value, ts): (Option<V>, i64), versions: Versions<V>| {
                    versions.put(ts, value, retention)
                },
                VersionsSerde(value_serde),
                None,
            )
            .unversion(retention)
    }
}

/// Reads a versioned table's value of a key as of a timestamp from its stored item
/// (`None`: no value valid then).
pub(crate) type LookupAsOf<K, V> =
    Arc<dyn Fn(&K, &ItemState, i64) -> Result<Option<V>, String> + Send + Sync>;

/// How a join reads a versioned table: as of a time, within the history retention.
pub(crate) struct Versioned<K, V> {
    /// The value valid at a time.
    pub(crate) as_of: LookupAsOf<K, V>,
    /// The history retention, in milliseconds.
    pub(crate) retention: i64,
}

impl<K, V> Clone for Versioned<K, V> {
    fn clone(&self) -> Self {
        Versioned {
            as_of: Arc::clone(&self.as_of),
            retention: self.retention,
        }
    }
}

impl<K, V> KTable<K, Versions<V>>
where
    K: Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// The table of the latest value per key, from the aggregate of its versions: its updates
    /// and deletions carry the latest version's timestamp, and joins read it as of a time.
    fn unversion(self, retention: i64) -> KTable<K, V> {
        let (flat, deletes) = (Downstream::<K, V>::new(), Downstream::<K, ()>::new());
        let (out, removed) = (flat.clone(), deletes.clone());
        self.updates()
            .add(Arc::new(move |ctx, key, versions: Versions<V>| {
                let Some((latest, timestamp)) = versions.latest() else {
                    return Ok(());
                };
                let latest = latest.cloned();
                ctx.with_update_timestamp(timestamp, |ctx| match latest {
                    Some(value) => out.forward(ctx, key, value),
                    None => removed.forward(ctx, key, ()),
                })
            }));
        let lookup = self.lookup.clone().map(|inner| {
            let decode = Arc::clone(&inner.value);
            let value: LookupValue<K, V> = Arc::new(move |key, state| {
                Ok(decode(key, state)?.and_then(|v| v.latest().and_then(|(v, _)| v.cloned())))
            });
            let decode = Arc::clone(&inner.value);
            let timestamp: LookupTimestamp<K> =
                Arc::new(move |key, state| match decode(key, state) {
                    Ok(Some(v)) => match v.latest() {
                        Some((Some(_), ts)) => Some(ts),
                        _ => None,
                    },
                    _ => None,
                });
            let decode = Arc::clone(&inner.value);
            let as_of: LookupAsOf<K, V> = Arc::new(move |key, state, ts| {
                Ok(decode(key, state)?.and_then(|v| v.as_of(ts, retention).cloned()))
            });
            Arc::new(Lookup {
                store: inner.store,
                key_serde: Arc::clone(&inner.key_serde),
                value,
                timestamp: Some(timestamp),
                versioned: Some(Versioned { as_of, retention }),
            })
        });
        let mut table =
            KTable::from_nodes(self.shared.clone(), flat, self.nodes.clone()).with_deletes(deletes);
        table.lookup = lookup;
        table
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serdes::Utf8;

    fn put(v: Versions<String>, ts: i64, value: Option<&str>, retention: i64) -> Versions<String> {
        v.put(ts, value.map(str::to_owned), retention)
    }

    fn values(v: &Versions<String>) -> Vec<(i64, Option<&str>)> {
        v.versions.iter().map(|(t, v)| (*t, v.as_deref())).collect()
    }

    #[test]
    fn an_out_of_order_update_goes_into_the_history_and_keeps_the_latest() {
        let v = put(Versions::default(), 10, Some("b"), 100);
        let v = put(v, 5, Some("a"), 100);
        assert_eq!(v.latest(), Some((Some(&"b".to_owned()), 10)));
        assert_eq!(v.as_of(4, 100), None);
        assert_eq!(v.as_of(5, 100).map(String::as_str), Some("a"));
        assert_eq!(v.as_of(9, 100).map(String::as_str), Some("a"));
        assert_eq!(v.as_of(10, 100).map(String::as_str), Some("b"));
        // The same timestamp replaces its version.
        let v = put(v, 5, Some("A"), 100);
        assert_eq!(values(&v), [(5, Some("A")), (10, Some("b"))]);
        // A tombstone in the history: no value from 7 to 10.
        let v = put(v, 7, None, 100);
        assert_eq!(v.as_of(8, 100), None);
        assert_eq!(v.as_of(6, 100).map(String::as_str), Some("A"));
    }

    #[test]
    fn the_history_retention_drops_old_updates_and_prunes_unreachable_versions() {
        let v = put(Versions::default(), 0, Some("a"), 10);
        let v = put(v, 5, Some("b"), 10);
        let v = put(v, 20, Some("c"), 10);
        // Lookups reach back to 10: "b" (valid 5..20) still serves them, "a" is pruned.
        assert_eq!(values(&v), [(5, Some("b")), (20, Some("c"))]);
        assert_eq!(v.as_of(10, 10).map(String::as_str), Some("b"));
        assert_eq!(v.as_of(9, 10), None);
        // Older than the retention: not put.
        let v = put(v, 9, Some("x"), 10);
        assert_eq!(values(&v), [(5, Some("b")), (20, Some("c"))]);
        // Retention 0 keeps only the latest, and refuses every older update.
        let v = put(Versions::default(), 5, Some("a"), 0);
        let v = put(v, 4, Some("x"), 0);
        let v = put(v, 6, Some("b"), 0);
        assert_eq!(values(&v), [(6, Some("b"))]);
    }

    #[test]
    fn versions_round_trip_and_bad_bytes_are_errors() {
        let v = put(Versions::default(), -3, Some("a"), 100);
        let v = put(v, 7, None, 100);
        let v = put(v, 9, Some(""), 100);
        let serde = VersionsSerde(Utf8);
        let bytes = serde.serialize(&v).unwrap_or_default();
        assert_eq!(serde.deserialize(Some(&bytes)).ok(), Some(v));
        assert!(serde.deserialize(Some(&bytes[..bytes.len() - 1])).is_err());
        assert!(serde.deserialize(Some(&bytes[..5])).is_err());
        assert!(serde.deserialize(Some(&[2, 0])).is_err());
    }
}
