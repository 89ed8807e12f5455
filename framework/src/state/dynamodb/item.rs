//! The item layout of the DynamoDB store (attributes, keys, parsing) and the update
//! expressions every write starts from.
//!
//! # Item layout
//! One table holds every store of a function (on-demand billing). An item:
//!
//! | attribute | type | meaning |
//! |---|---|---|
//! | `pk` | S | `<store>#<key as unpadded base64url>`; store names exclude `#`, so no two (store, key) pairs collide |
//! | `sk` | N | `0` for a key's item (windowed items will use the window start) |
//! | `v` | N | the aggregate |
//! | `ver` | N | the version, +1 per write that changes the item |
//! | `k` | B | the raw key, for queries and scans |
//! | `fv` | N | the item format version (`1`) |
//! | `w:<topic>-<partition>` | N | watermark: the highest source offset of that partition whose effect `v` holds |
//! | `mt` | N | a time window's newest record time (epoch ms), the timestamp of its updates; absent in items written before it was kept |
//!
//! Watermarks are top-level attributes rather than entries of one map attribute: an
//! update can then create the item and set a watermark in the same request
//! (`SET wm.#p` fails on an item without `wm`), which keeps the first write of a key to
//! one request.

use std::collections::HashMap;

use std::borrow::Cow;

use aws_sdk_dynamodb::types::AttributeValue;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use super::request::{Returned, Update, Value};
use super::{DynamoStore, Item};
use crate::state::{ItemState, ItemWrite};

/// The item format this release writes and reads.
pub const FORMAT_VERSION: i64 = 1;
/// Prefix of the watermark attributes.
pub const WATERMARK_PREFIX: &str = "w:";
/// The partition key of the item holding the partitions' stream times.
pub const STREAM_TIME_KEY: &str = "__stream-time";
/// The TTL attribute of windowed items (epoch seconds).
pub const TTL_ATTRIBUTE: &str = "ttl";
/// The global secondary index that finds emit-on-close windows by close time: partition
/// key `cq` (the store name), sort key `cl` (the close time, epoch ms), keys only. A
/// window leaves the (sparse) index when it is marked closed.
pub const CLOSING_INDEX: &str = "closing";
/// The attributes of [`CLOSING_INDEX`].
pub const CLOSING_STORE: &str = "cq";
/// See [`CLOSING_STORE`].
pub const CLOSING_TIME: &str = "cl";
/// The attribute of a time window's newest record time (epoch ms).
pub const NEWEST_TIME: &str = "mt";

/// Under exactly-once output, the prefix of an item's outbox entries of one event
/// partition (`ob:<topic>-<partition>`, binary: [`crate::state::outbox::encode`]), as the
/// read-modify-write keeps them.
pub const OUTBOX_PREFIX: &str = "ob:";
/// The prefixes of the single outbox entry the additive fast path keeps per event
/// partition, as numbers computed in the write (`oo:` offset, `ov:` value, `on:` version,
/// `ot:` the update's time, `om:` the item's record time).
pub const SLOT_PREFIXES: [&str; 5] = ["oo:", "ov:", "on:", "ot:", "om:"];

/// The outbox entries of an item, by event partition: the read-modify-write's list and
/// the fast path's single entry, by version.
pub(super) fn parse_outbox(
    item: &Item,
) -> Result<HashMap<String, Vec<crate::state::outbox::Entry>>, String> {
    use crate::state::outbox::{Entry, decode};
    let mut out: HashMap<String, Vec<Entry>> = HashMap::new();
    for (name, value) in item {
        if let Some(tp) = name.strip_prefix(OUTBOX_PREFIX) {
            let AttributeValue::B(bytes) = value else {
                return Err(format!("attribute {name} is not binary"));
            };
            let entries = decode(bytes.as_ref()).map_err(|e| format!("attribute {name}: {e}"))?;
            out.entry(tp.to_owned()).or_default().extend(entries);
        } else if let Some(tp) = name.strip_prefix(SLOT_PREFIXES[0]) {
            let field = |i: usize| format!("{}{tp}", SLOT_PREFIXES[i]);
            out.entry(tp.to_owned()).or_default().push(Entry {
                offset: number(item, name)?,
                state: ItemState {
                    value: number(item, &field(1))?,
                    aggregate: None,
                    version: number(item, &field(2))?,
                    timestamp: number(item, &field(4)).ok(),
                },
                time: number(item, &field(3))?,
                dead_letter: None,
            });
        }
    }
    for entries in out.values_mut() {
        entries.sort_by_key(|e| e.state.version);
    }
    Ok(out)
}

impl DynamoStore {
    /// The attributes every write sets besides the value and the watermarks.
    pub(super) fn base_set(write: &ItemWrite<'_>) -> Vec<Cow<'static, str>> {
        let mut set = Vec::with_capacity(8);
        set.extend(Self::base_set_parts(write).map(Cow::Borrowed));
        set
    }

    /// [`base_set`](Self::base_set)'s parts, in order, as static strings.
    pub(super) fn base_set_parts(write: &ItemWrite<'_>) -> impl Iterator<Item = &'static str> {
        ["#k = :k", "#fv = :fv"]
            .into_iter()
            .chain(write.expires_at.map(|_| "#ttl = :ttl"))
            .chain(write.timestamp.map(|_| "#mt = :mt"))
            .chain(write.close_at.map(|_| "#cq = :cq, #cl = :cl"))
    }

    /// The write's request with what every write of an item names and sets: the value,
    /// version, key and format attributes (and the TTL, record time and closing time the
    /// write has); `fold` asks for the whole item back, else for what the update set.
    pub(super) fn update<'a>(&'a self, write: &ItemWrite<'a>, fold: bool) -> Update<'a> {
        let (store, key) = (write.store, write.key);
        let (value, returned) = if fold {
            ("a", Returned::AllNew)
        } else {
            ("v", Returned::UpdatedNew)
        };
        let request = Update::new(&self.table, item_key(store, key), write.window.unwrap_or(0))
            .returned(returned)
            .old_on_failure()
            .consumed_capacity()
            .name("#v", value)
            .name("#ver", "ver")
            .name("#k", "k")
            .name("#fv", "fv")
            .value(":one", Value::N(1))
            .value(":k", Value::B(Cow::Borrowed(key)))
            .value(":fv", Value::N(FORMAT_VERSION));
        let request = match write.expires_at {
            Some(at) => request
                .name("#ttl", TTL_ATTRIBUTE)
                .value(":ttl", Value::N(at)),
            None => request,
        };
        let request = match write.timestamp {
            Some(at) => request.name("#mt", NEWEST_TIME).value(":mt", Value::N(at)),
            None => request,
        };
        match write.close_at {
            Some(at) => request
                .name("#cq", CLOSING_STORE)
                .name("#cl", CLOSING_TIME)
                .value(":cq", Value::S(Cow::Borrowed(store)))
                .value(":cl", Value::N(at)),
            None => request,
        }
    }
}

/// An item as [`DynamoStore::scan`] returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScannedItem {
    /// The key, as the aggregation's key serde encoded it.
    pub key: Vec<u8>,
    /// The window start (epoch ms) of a windowed item.
    pub window: Option<i64>,
    /// The item's state.
    pub state: ItemState,
}

/// The cache key of an item: partition key and window.
pub(super) fn cache_key(write: &ItemWrite<'_>) -> String {
    format!(
        "{}#{}",
        item_key(write.store, write.key),
        write.window.unwrap_or(0)
    )
}

/// The partition key of `key` in `store`.
pub fn item_key(store: &str, key: &[u8]) -> String {
    // Written in one allocation (no formatting, no intermediate base64 string).
    let mut pk = String::with_capacity(store.len() + 1 + key.len().div_ceil(3) * 4);
    pk.push_str(store);
    pk.push('#');
    URL_SAFE_NO_PAD.encode_string(key, &mut pk);
    pk
}

/// The watermark attribute of `tp`: `w:<topic>-<partition>`.
pub(super) fn watermark_name(tp: &crate::event::TopicPartition) -> String {
    let mut name = String::with_capacity(WATERMARK_PREFIX.len() + tp.topic.len() + 12);
    name.push_str(WATERMARK_PREFIX);
    tp.push_key(&mut name);
    name
}

pub(super) fn number<T: std::str::FromStr>(
    item: &HashMap<String, AttributeValue>,
    name: &str,
) -> Result<T, String> {
    number_of(name, item.get(name).map(StateAttribute::from))
}

/// An attribute as an item's state is read from it: a number's text, a binary's bytes, or
/// another type. Both the SDK's items and the lean client's responses (read straight into
/// these, without an item map) are read by [`state_from`], so they give the same states
/// and the same errors.
#[derive(Debug, Clone, Copy)]
pub(super) enum StateAttribute<'a> {
    /// A number (`N`), as its text.
    N(&'a str),
    /// A binary (`B`), decoded.
    B(&'a [u8]),
    /// Any other type.
    Other,
}

impl<'a> From<&'a AttributeValue> for StateAttribute<'a> {
    fn from(value: &'a AttributeValue) -> Self {
        match value {
            AttributeValue::N(n) => StateAttribute::N(n),
            AttributeValue::B(b) => StateAttribute::B(b.as_ref()),
            _ => StateAttribute::Other,
        }
    }
}

/// The number in attribute `name` (`attribute`, when the item has it).
fn number_of<T: std::str::FromStr>(
    name: &str,
    attribute: Option<StateAttribute<'_>>,
) -> Result<T, String> {
    match attribute {
        Some(StateAttribute::N(n)) => n
            .parse()
            .map_err(|_| format!("attribute {name} = {n} is out of range")),
        Some(_) => Err(format!("attribute {name} is not a number")),
        None => Err(format!("attribute {name} is missing")),
    }
}

pub(super) fn parse_state(item: &Item) -> Result<ItemState, String> {
    state_from(|name| item.get(name).map(StateAttribute::from))
}

/// An item's state from its attributes (`get` returns the attribute of a name): the format
/// version checked, the value (`v`) or aggregate (`a`), the version (`ver`) and the newest
/// record time (`mt`, when it is a number).
pub(super) fn state_from<'a>(
    get: impl Fn(&str) -> Option<StateAttribute<'a>>,
) -> Result<ItemState, String> {
    if let Some(StateAttribute::N(fv)) = get("fv")
        && fv.parse::<i64>().ok() != Some(FORMAT_VERSION)
    {
        return Err(format!(
            "item format version {fv} is not supported (this release reads {FORMAT_VERSION})"
        ));
    }
    let (value, aggregate) = match get("a") {
        Some(StateAttribute::B(bytes)) => (0, Some(bytes.to_vec())),
        Some(_) => return Err("attribute a is not binary".to_owned()),
        None => (number_of("v", get("v"))?, None),
    };
    Ok(ItemState {
        value,
        aggregate,
        version: number_of("ver", get("ver"))?,
        timestamp: number_of(NEWEST_TIME, get(NEWEST_TIME)).ok(),
    })
}

pub(super) fn parse_watermarks(
    item: &HashMap<String, AttributeValue>,
) -> Result<HashMap<String, i64>, String> {
    item.keys()
        .filter_map(|name| name.strip_prefix(WATERMARK_PREFIX).map(|tp| (name, tp)))
        .map(|(name, tp)| Ok((tp.to_owned(), number(item, name)?)))
        .collect()
}

/// Whether an item is past its TTL: DynamoDB deletes such items lazily (within days),
/// so reads leave them out themselves.
pub(super) fn expired(item: &Item, now_seconds: i64) -> bool {
    number::<i64>(item, TTL_ATTRIBUTE).is_ok_and(|ttl| ttl < now_seconds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watermark_names_are_the_formatted_ones() {
        use crate::event::TopicPartition;
        for (topic, partition) in [
            ("events", 0),
            ("text-lines", 7),
            ("t", 1234),
            ("é-x", i32::MAX),
            ("n", i32::MIN),
            ("", -1),
        ] {
            let tp = TopicPartition::new(topic, partition);
            assert_eq!(watermark_name(&tp), format!("{WATERMARK_PREFIX}{tp}"));
            let mut text = String::from("x");
            tp.push_key(&mut text);
            assert_eq!(text, format!("x{tp}"));
        }
        for key in [&b""[..], b"f", b"fo", b"fox", b"\xff\x00\x80 binary"] {
            assert_eq!(
                item_key("counts", key),
                format!("counts#{}", URL_SAFE_NO_PAD.encode(key))
            );
        }
    }

    #[test]
    fn item_keys_do_not_collide_across_stores() {
        // ("a", "b#c") and ("a#b", "c") must differ: the store name may not hold '#',
        // and the key is base64url, whose alphabet has no '#'.
        assert_ne!(item_key("a", b"b#c"), item_key("a-b", b"c"));
        assert_eq!(item_key("counts", b"fox"), "counts#Zm94");
        assert_eq!(item_key("counts", b""), "counts#");
    }

    #[test]
    fn parses_watermarks_and_rejects_future_formats() {
        let item = HashMap::from([
            ("v".to_owned(), AttributeValue::N("5".into())),
            ("ver".to_owned(), AttributeValue::N("2".into())),
            ("w:text-lines-0".to_owned(), AttributeValue::N("41".into())),
        ]);
        assert_eq!(parse_state(&item), Ok(ItemState::number(5, 2)));
        assert_eq!(
            parse_watermarks(&item),
            Ok(HashMap::from([("text-lines-0".to_owned(), 41)]))
        );
        let mut future = item.clone();
        future.insert("fv".into(), AttributeValue::N("2".into()));
        assert!(
            parse_state(&future)
                .unwrap_err()
                .contains("format version 2")
        );
    }
}
