//! Decoding one record: its fields, base64 bytes, exact timestamp and headers.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::{Ctx, missing, once};
use crate::event::TopicPartition;
use crate::event::{DecodeErrorKind, Header, Record, SchemaMetadata, TimestampType};

/// Record field names; anything else is ignored.
#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "camelCase")]
enum RecordField {
    Topic,
    Partition,
    Offset,
    Timestamp,
    TimestampType,
    Key,
    Value,
    Headers,
    KeySchemaMetadata,
    ValueSchemaMetadata,
    /// Only a share group's records carry it (Queue mode): refused.
    DeliveryCount,
    #[serde(other)]
    Other,
}

/// One record listed under `tp`'s key.
pub(super) struct RecordSeed<'c> {
    pub(super) ctx: &'c mut Ctx,
    pub(super) tp: &'c TopicPartition,
}

impl<'de> DeserializeSeed<'de> for RecordSeed<'_> {
    type Value = Record;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Record, D::Error> {
        deserializer.deserialize_map(self)
    }
}

/// The fields of a record as they are read, in whatever order they come.
#[derive(Default)]
struct Fields {
    topic: Option<TopicCheck>,
    partition: Option<i32>,
    offset: Option<i64>,
    timestamp: Option<i64>,
    timestamp_type: Option<TimestampType>,
    key: Option<Option<Vec<u8>>>,
    value: Option<Option<Vec<u8>>>,
    headers: Option<Vec<Header>>,
    key_schema_metadata: Option<Option<SchemaMetadata>>,
    value_schema_metadata: Option<Option<SchemaMetadata>>,
}

impl<'de> Visitor<'de> for RecordSeed<'_> {
    type Value = Record;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Kafka record object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Record, A::Error> {
        let ctx = self.ctx;
        let mut f = Fields::default();
        while let Some(field) = map.next_key::<RecordField>()? {
            match field {
                RecordField::Topic => {
                    once(ctx, f.topic.is_some(), "topic")?;
                    let seed = TopicSeed(&self.tp.topic);
                    f.topic = Some(map.next_value_seed(seed)?);
                }
                RecordField::Partition => {
                    once(ctx, f.partition.is_some(), "partition")?;
                    f.partition = Some(map.next_value()?);
                }
                RecordField::Offset => {
                    once(ctx, f.offset.is_some(), "offset")?;
                    let offset = map.next_value()?;
                    ctx.offset = Some(offset);
                    f.offset = Some(offset);
                }
                RecordField::Timestamp => {
                    once(ctx, f.timestamp.is_some(), "timestamp")?;
                    f.timestamp = Some(map.next_value_seed(TimestampSeed { ctx: &mut *ctx })?);
                }
                RecordField::TimestampType => {
                    once(ctx, f.timestamp_type.is_some(), "timestampType")?;
                    f.timestamp_type = Some(map.next_value()?);
                }
                RecordField::Key => {
                    once(ctx, f.key.is_some(), "key")?;
                    f.key = Some(map.next_value_seed(BytesSeed { ctx: &mut *ctx })?);
                }
                RecordField::Value => {
                    once(ctx, f.value.is_some(), "value")?;
                    f.value = Some(map.next_value_seed(BytesSeed { ctx: &mut *ctx })?);
                }
                RecordField::Headers => {
                    once(ctx, f.headers.is_some(), "headers")?;
                    f.headers = Some(map.next_value_seed(HeadersSeed { ctx: &mut *ctx })?);
                }
                RecordField::KeySchemaMetadata => {
                    once(ctx, f.key_schema_metadata.is_some(), "keySchemaMetadata")?;
                    f.key_schema_metadata = Some(map.next_value()?);
                }
                RecordField::ValueSchemaMetadata => {
                    once(
                        ctx,
                        f.value_schema_metadata.is_some(),
                        "valueSchemaMetadata",
                    )?;
                    f.value_schema_metadata = Some(map.next_value()?);
                }
                RecordField::DeliveryCount => {
                    ctx.field = Some("deliveryCount");
                    return Err(ctx.fail(DecodeErrorKind::QueueMode(
                        "the record carries a deliveryCount",
                    )));
                }
                RecordField::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            ctx.field = None;
        }
        finish(ctx, self.tp, f)
    }
}

/// Checks required fields and the record's place, and builds the [`Record`].
fn finish<E: de::Error>(ctx: &mut Ctx, tp: &TopicPartition, f: Fields) -> Result<Record, E> {
    let topic = f.topic.ok_or_else(|| missing(ctx, "topic"))?;
    let partition = f.partition.ok_or_else(|| missing(ctx, "partition"))?;
    let offset = f.offset.ok_or_else(|| missing(ctx, "offset"))?;
    let timestamp = f.timestamp.ok_or_else(|| missing(ctx, "timestamp"))?;
    let timestamp_type = f
        .timestamp_type
        .ok_or_else(|| missing(ctx, "timestampType"))?;
    if matches!(topic, TopicCheck::Other(_)) || partition != tp.partition {
        let topic = match topic {
            TopicCheck::Same => tp.topic.clone(),
            TopicCheck::Other(topic) => topic,
        };
        let kind = DecodeErrorKind::WrongPartition {
            key: tp.to_string(),
            topic,
            partition,
        };
        return Err(ctx.fail(kind));
    }
    Ok(Record {
        offset,
        timestamp,
        timestamp_type,
        key: f.key.flatten().map(Bytes::from),
        value: f.value.flatten().map(Bytes::from),
        headers: f.headers.unwrap_or_default(),
        key_schema_metadata: f.key_schema_metadata.flatten(),
        value_schema_metadata: f.value_schema_metadata.flatten(),
    })
}

/// A record's `topic`, compared with its key's topic without allocating when they match.
enum TopicCheck {
    Same,
    Other(String),
}

struct TopicSeed<'a>(&'a str);

impl<'de> DeserializeSeed<'de> for TopicSeed<'_> {
    type Value = TopicCheck;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<TopicCheck, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl Visitor<'_> for TopicSeed<'_> {
    type Value = TopicCheck;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a topic name")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<TopicCheck, E> {
        Ok(if v == self.0 {
            TopicCheck::Same
        } else {
            TopicCheck::Other(v.to_owned())
        })
    }
}

/// `timestamp`: an integer read straight from its digits, never through `f64`.
struct TimestampSeed<'c> {
    ctx: &'c mut Ctx,
}

impl<'de> DeserializeSeed<'de> for TimestampSeed<'_> {
    type Value = i64;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<i64, D::Error> {
        // `deserialize_i64` (not `deserialize_any`) so that serde_json hands over integers
        // as `i64`/`u64` even if some other crate enables its `arbitrary_precision` feature.
        deserializer.deserialize_i64(self)
    }
}

impl Visitor<'_> for TimestampSeed<'_> {
    type Value = i64;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an integer number of epoch milliseconds")
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<i64, E> {
        Ok(v)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<i64, E> {
        i64::try_from(v).map_err(|_| {
            let found = format!("{v}, which does not fit an i64");
            self.ctx.fail(DecodeErrorKind::InvalidTimestamp(found))
        })
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<i64, E> {
        let found = format!("the floating-point number {v}");
        Err(self.ctx.fail(DecodeErrorKind::InvalidTimestamp(found)))
    }
}

/// `key` / `value`: standard base64 or `null`, decoded straight into the final `Vec`.
struct BytesSeed<'c> {
    ctx: &'c mut Ctx,
}

impl<'de> DeserializeSeed<'de> for BytesSeed<'_> {
    type Value = Option<Vec<u8>>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for BytesSeed<'_> {
    type Value = Option<Vec<u8>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a base64 string or null")
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        // `deserialize_bytes` hands over the string's raw bytes (escapes resolved) without
        // the UTF-8 check `deserialize_str` does: base64 decoding checks every byte anyway.
        d.deserialize_bytes(self)
    }

    // Borrowed or not (a string with escapes comes through serde_json's scratch buffer),
    // the text is only read here: no intermediate `String`.
    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Self::Value, E> {
        match STANDARD.decode(v) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(err) => Err(self
                .ctx
                .fail(DecodeErrorKind::InvalidBase64(err.to_string()))),
        }
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        self.visit_bytes(v.as_bytes())
    }
}

/// `headers`: a list of objects, each mapping names to arrays of byte values; `null` is empty.
struct HeadersSeed<'c> {
    ctx: &'c mut Ctx,
}

impl<'de> DeserializeSeed<'de> for HeadersSeed<'_> {
    type Value = Vec<Header>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Vec<Header>, D::Error> {
        deserializer.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for HeadersSeed<'_> {
    type Value = Vec<Header>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of header objects")
    }

    fn visit_none<E: de::Error>(self) -> Result<Vec<Header>, E> {
        Ok(Vec::new())
    }

    fn visit_unit<E: de::Error>(self) -> Result<Vec<Header>, E> {
        Ok(Vec::new())
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Vec<Header>, D::Error> {
        d.deserialize_seq(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<Header>, A::Error> {
        let mut headers = Vec::new();
        let mut seed = HeaderObjectSeed {
            ctx: self.ctx,
            out: &mut headers,
        };
        while seq.next_element_seed(seed.reborrow())?.is_some() {}
        Ok(headers)
    }
}

/// One header object; its entries (normally one, but all are kept) are appended to `out`.
struct HeaderObjectSeed<'c> {
    ctx: &'c mut Ctx,
    out: &'c mut Vec<Header>,
}

impl HeaderObjectSeed<'_> {
    fn reborrow(&mut self) -> HeaderObjectSeed<'_> {
        HeaderObjectSeed {
            ctx: &mut *self.ctx,
            out: &mut *self.out,
        }
    }
}

impl<'de> DeserializeSeed<'de> for HeaderObjectSeed<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for HeaderObjectSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a header object {\"name\": [bytes...]}")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(name) = map.next_key::<String>()? {
            let value = map.next_value_seed(HeaderBytesSeed {
                ctx: &mut *self.ctx,
                name: &name,
            })?;
            self.out.push(Header::new(name, value));
        }
        Ok(())
    }
}

/// A header's array of byte values: signed Java bytes (-128..=127) or unsigned (0..=255).
struct HeaderBytesSeed<'c> {
    ctx: &'c mut Ctx,
    name: &'c str,
}

impl<'de> DeserializeSeed<'de> for HeaderBytesSeed<'_> {
    type Value = Vec<u8>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Vec<u8>, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for HeaderBytesSeed<'_> {
    type Value = Vec<u8>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of byte values")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
        let mut bytes = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(v) = seq.next_element_seed(ByteSeed)? {
            match v {
                // Two's complement: -17 and 239 are both 0xEF.
                -128..=255 => bytes.push(v as u8),
                _ => {
                    let kind = DecodeErrorKind::HeaderByteOutOfRange {
                        header: self.name.to_owned(),
                        value: v,
                    };
                    return Err(self.ctx.fail(kind));
                }
            }
        }
        Ok(bytes)
    }
}

/// One integer of a header's byte array, range-checked by [`HeaderBytesSeed`].
struct ByteSeed;

impl<'de> DeserializeSeed<'de> for ByteSeed {
    type Value = i128;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<i128, D::Error> {
        deserializer.deserialize_i64(self)
    }
}

impl Visitor<'_> for ByteSeed {
    type Value = i128;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a byte value (-128..=255)")
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<i128, E> {
        Ok(i128::from(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<i128, E> {
        Ok(i128::from(v))
    }
}
