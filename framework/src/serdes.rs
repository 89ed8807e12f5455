//! Serdes: how keys and values turn into bytes and back.
//!
//! A [`Serde`] works on `Option<&[u8]>` because Kafka keys and values can be null:
//! a `null` key is common (text lines), and a `null` value is a tombstone. The
//! built-in serdes reject null unless they say otherwise; wrap one in [`Nullable`]
//! to receive `Option<T>`, or use [`Unit`] for a side you do not read.
//!
//! | serde | Rust type | bytes |
//! |---|---|---|
//! | [`Bytes`] | `Vec<u8>` | unchanged |
//! | [`Utf8`] | `String` | UTF-8 text (Kafka's `StringSerde`) |
//! | [`DecimalI64`] | `i64` | decimal text, `"42"` |
//! | [`BigEndianI64`] | `i64` | 8 bytes, big-endian (Kafka's `LongSerde`) |
//! | [`Json`] | any `T: Serialize + DeserializeOwned` | JSON (read as `serde_json` reads it, with `sonic-rs` where the two agree; written with `serde_json`) |
//! | [`Unit`] | `()` | anything in, null out |
//! | [`Nullable`] | `Option<T>` | null is `None` |
//! | [`ReadWith`] | what its function returns | read by a function of the bytes (e.g. [`json::from_slice`] into a borrowed view), written by a serde |
//! | `schema::Avro`, `schema::Protobuf`, `schema::JsonSchema` | schema'd values | a schema registry's wire formats (module [`schema`], features `avro`, `protobuf`, `json-schema`) |
//!
//! A user format implements [`Serde`]; a decode failure is a [`SerdeError`] message, and the
//! framework turns it into [`StreamError::Deserialize`](crate::StreamError::Deserialize)
//! naming the record's topic-partition and offset.

use std::any::{Any, TypeId};
use std::fmt;
use std::sync::Arc;

pub use crate::event::SchemaMetadata;

pub mod json;
pub mod schema;

pub use json::Json;

/// Converts values of type `T` to Kafka bytes and back.
///
/// Implement it for your own formats. `deserialize` returns an error message (never
/// panics); the framework adds the record's topic-partition and offset to it.
pub trait Serde<T>: Send + Sync + 'static {
    /// Encodes a value; `None` writes a Kafka null.
    fn serialize(&self, value: &T) -> Option<Vec<u8>>;
    /// Decodes a Kafka key or value (`None` is a Kafka null).
    fn deserialize(&self, data: Option<&[u8]>) -> Result<T, SerdeError>;
    /// Encodes a value, or says why it cannot be encoded. Serdes whose encoding can
    /// fail ([`Json`]) override it; the framework's sinks call it, so such a failure
    /// fails the batch with an error naming the record instead of writing a null.
    fn try_serialize(&self, value: &T) -> Result<Option<Vec<u8>>, SerdeError> {
        Ok(self.serialize(value))
    }
    /// Encodes a value the caller gives up, as [`try_serialize`](Self::try_serialize)
    /// does. The framework's sinks call it with each output record's key and value;
    /// serdes whose bytes are the value itself ([`Bytes`], [`Utf8`]) override it to hand
    /// those bytes over without a copy. The result must equal `try_serialize(&value)`.
    fn try_serialize_owned(&self, value: T) -> Result<Option<Vec<u8>>, SerdeError> {
        self.try_serialize(&value)
    }
    /// Decodes a key or value of a source record together with its schema registry
    /// metadata (the event's `keySchemaMetadata` / `valueSchemaMetadata`, present when the
    /// event source mapping validates records against a registry). The framework calls it
    /// for every source record; the default ignores the metadata and calls
    /// [`deserialize`](Self::deserialize). The schema'd serdes ([`schema`]) read the schema
    /// id from it when the event source handed over the record without its wire-format
    /// prefix (`EventRecordFormat: SOURCE`).
    fn deserialize_with_schema(
        &self,
        data: Option<&[u8]>,
        schema: Option<&SchemaMetadata>,
    ) -> Result<T, SerdeError> {
        let _ = schema;
        self.deserialize(data)
    }

    /// Which of this serde's values stand for a Kafka null, when some do ([`Nullable`]:
    /// `None`). The DSL learns it from the value serdes a topology names (sources,
    /// `Grouped::with`, `to`), and skips such a value where Kafka Streams skips a null
    /// value: in `count`, `aggregate` and `reduce`, in sliding-window aggregations and in
    /// stream–table joins, counted in the batch report's `dropped_null_values`. The
    /// default: none of them.
    fn nulls(&self) -> Option<Nulls> {
        None
    }
}

/// A test of a value given as `Any`: whether it is a Kafka null.
type IsNull = Arc<dyn Fn(&dyn Any) -> bool + Send + Sync>;

/// A test telling which values of one type stand for a Kafka null (see [`Serde::nulls`]).
#[derive(Clone)]
pub struct Nulls {
    pub(crate) type_id: TypeId,
    pub(crate) is_null: IsNull,
}

impl Nulls {
    /// The values of type `T` for which `is_null` holds are Kafka nulls.
    pub fn of<T: 'static>(is_null: impl Fn(&T) -> bool + Send + Sync + 'static) -> Self {
        Nulls {
            type_id: TypeId::of::<T>(),
            is_null: Arc::new(move |value: &dyn Any| {
                value.downcast_ref::<T>().is_some_and(&is_null)
            }),
        }
    }
}

impl fmt::Debug for Nulls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Nulls")
            .field("type_id", &self.type_id)
            .finish()
    }
}

/// Why bytes could not be decoded. The framework wraps it with the record's coordinates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SerdeError(pub String);

impl fmt::Display for SerdeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SerdeError {}

/// The start of a [`SerdeError`]'s message that says a schema registry could not be
/// reached: not the record's fault, so the framework fails the batch (the event source
/// delivers it again) instead of treating the record as a poison record.
pub const UNAVAILABLE_PREFIX: &str = "schema registry unavailable: ";

impl SerdeError {
    /// An error that is not the record's fault (a registry that cannot be reached):
    /// `reason` with [`UNAVAILABLE_PREFIX`] in front.
    pub fn unavailable(reason: impl fmt::Display) -> Self {
        SerdeError(format!("{UNAVAILABLE_PREFIX}{reason}"))
    }

    /// Whether the error says that something the serde needs could not be reached
    /// (see [`unavailable`](Self::unavailable)), rather than that the bytes are bad.
    pub fn is_unavailable(&self) -> bool {
        self.0.starts_with(UNAVAILABLE_PREFIX)
    }
}

fn non_null<'a>(data: Option<&'a [u8]>, what: &str) -> Result<&'a [u8], SerdeError> {
    data.ok_or_else(|| {
        SerdeError(format!(
            "{what} serde got a null (use Nullable to accept nulls)"
        ))
    })
}

/// Raw bytes, unchanged.
#[derive(Debug, Clone, Copy, Default)]
pub struct Bytes;

impl Serde<Vec<u8>> for Bytes {
    fn serialize(&self, value: &Vec<u8>) -> Option<Vec<u8>> {
        Some(value.clone())
    }
    fn deserialize(&self, data: Option<&[u8]>) -> Result<Vec<u8>, SerdeError> {
        non_null(data, "Bytes").map(<[u8]>::to_vec)
    }
    fn try_serialize_owned(&self, value: Vec<u8>) -> Result<Option<Vec<u8>>, SerdeError> {
        Ok(Some(value))
    }
}

/// UTF-8 text as a `String`; invalid UTF-8 is an error.
#[derive(Debug, Clone, Copy, Default)]
pub struct Utf8;

impl Serde<String> for Utf8 {
    fn serialize(&self, value: &String) -> Option<Vec<u8>> {
        Some(value.as_bytes().to_vec())
    }
    fn deserialize(&self, data: Option<&[u8]>) -> Result<String, SerdeError> {
        let bytes = non_null(data, "Utf8")?;
        String::from_utf8(bytes.to_vec())
            .map_err(|e| SerdeError(format!("invalid UTF-8: {}", e.utf8_error())))
    }
    fn try_serialize_owned(&self, value: String) -> Result<Option<Vec<u8>>, SerdeError> {
        Ok(Some(value.into_bytes()))
    }
}

/// A signed 64-bit integer written as decimal UTF-8 text (`"42"`), readable by any consumer.
#[derive(Debug, Clone, Copy, Default)]
pub struct DecimalI64;

impl Serde<i64> for DecimalI64 {
    fn serialize(&self, value: &i64) -> Option<Vec<u8>> {
        Some(value.to_string().into_bytes())
    }
    fn deserialize(&self, data: Option<&[u8]>) -> Result<i64, SerdeError> {
        let bytes = non_null(data, "DecimalI64")?;
        std::str::from_utf8(bytes)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .ok_or_else(|| SerdeError("not a decimal 64-bit integer".to_owned()))
    }
}

/// A signed 64-bit integer as 8 big-endian bytes: the format of Kafka's `LongSerde`
/// (`Serdes.Long()`), for topics shared with Java applications.
///
/// ```
/// use lambda_streams::serdes::{BigEndianI64, Serde};
///
/// assert_eq!(BigEndianI64.serialize(&258), Some(vec![0, 0, 0, 0, 0, 0, 1, 2]));
/// assert_eq!(BigEndianI64.deserialize(Some(&[0xff; 8])), Ok(-1));
/// assert!(BigEndianI64.deserialize(Some(b"42")).is_err()); // not 8 bytes
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct BigEndianI64;

impl Serde<i64> for BigEndianI64 {
    fn serialize(&self, value: &i64) -> Option<Vec<u8>> {
        Some(value.to_be_bytes().to_vec())
    }
    fn deserialize(&self, data: Option<&[u8]>) -> Result<i64, SerdeError> {
        let bytes = non_null(data, "BigEndianI64")?;
        let array: [u8; 8] = bytes.try_into().map_err(|_| {
            SerdeError(format!(
                "a big-endian 64-bit integer has 8 bytes, got {}",
                bytes.len()
            ))
        })?;
        Ok(i64::from_be_bytes(array))
    }
}

/// A side that is not read: deserializes anything (null included) to `()`, writes null.
#[derive(Debug, Clone, Copy, Default)]
pub struct Unit;

impl Serde<()> for Unit {
    fn serialize(&self, _: &()) -> Option<Vec<u8>> {
        None
    }
    fn deserialize(&self, _: Option<&[u8]>) -> Result<(), SerdeError> {
        Ok(())
    }
}

/// Wraps a serde so that a Kafka null becomes `None` instead of an error.
#[derive(Debug, Clone, Copy, Default)]
pub struct Nullable<S>(pub S);

impl<T: 'static, S: Serde<T>> Serde<Option<T>> for Nullable<S> {
    fn serialize(&self, value: &Option<T>) -> Option<Vec<u8>> {
        value.as_ref().and_then(|v| self.0.serialize(v))
    }
    fn deserialize(&self, data: Option<&[u8]>) -> Result<Option<T>, SerdeError> {
        match data {
            None => Ok(None),
            Some(_) => self.0.deserialize(data).map(Some),
        }
    }
    fn deserialize_with_schema(
        &self,
        data: Option<&[u8]>,
        schema: Option<&SchemaMetadata>,
    ) -> Result<Option<T>, SerdeError> {
        match data {
            None => Ok(None),
            Some(_) => self.0.deserialize_with_schema(data, schema).map(Some),
        }
    }
    fn try_serialize(&self, value: &Option<T>) -> Result<Option<Vec<u8>>, SerdeError> {
        match value {
            None => Ok(None),
            Some(v) => self.0.try_serialize(v),
        }
    }
    fn try_serialize_owned(&self, value: Option<T>) -> Result<Option<Vec<u8>>, SerdeError> {
        match value {
            None => Ok(None),
            Some(v) => self.0.try_serialize_owned(v),
        }
    }
    fn nulls(&self) -> Option<Nulls> {
        Some(Nulls::of::<Option<T>>(Option::is_none))
    }
}

/// A serde that reads with a function of the bytes and writes with another serde.
///
/// For a source whose values are read through a view that borrows from the record's bytes
/// ([`json::from_slice`] into a type with `&str` or `Cow<str>` fields) and turned, in the
/// same call, into what the topology keeps: the fields it drops are never allocated. On the
/// handler benchmark's ten-field page views, reading a borrowed view and keeping a summary
/// line of the engaged ones costs 8% fewer instructions per event than `Json<T>` into an
/// owned struct followed by `filter` and `map_values` (BENCHMARKS.md section 1).
///
/// `read` gets the bytes of a non-null key or value; a Kafka null is an error, as for the
/// built-in serdes (wrap the `ReadWith` in [`Nullable`] to receive `None` instead). Its
/// error is reported with the record's topic-partition and offset, and the source's poison
/// policy applies to it as to any deserialization error. `write` encodes values where the
/// serde writes (a sink, a repartition topic); its nulls are not this serde's: a value
/// `read` returns never stands for a Kafka null.
///
/// See [`json::from_slice`] for an example.
#[derive(Clone, Copy)]
pub struct ReadWith<R, W> {
    read: R,
    write: W,
}

impl<R, W> ReadWith<R, W> {
    /// The serde that reads with `read` and writes with `write`.
    pub fn new(read: R, write: W) -> Self {
        ReadWith { read, write }
    }
}

impl<R, W: fmt::Debug> fmt::Debug for ReadWith<R, W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadWith")
            .field("read", &std::any::type_name::<R>())
            .field("write", &self.write)
            .finish()
    }
}

impl<T, R, W> Serde<T> for ReadWith<R, W>
where
    R: Fn(&[u8]) -> Result<T, SerdeError> + Send + Sync + 'static,
    W: Serde<T>,
{
    fn serialize(&self, value: &T) -> Option<Vec<u8>> {
        self.write.serialize(value)
    }
    fn deserialize(&self, data: Option<&[u8]>) -> Result<T, SerdeError> {
        (self.read)(non_null(data, "ReadWith")?)
    }
    fn try_serialize(&self, value: &T) -> Result<Option<Vec<u8>>, SerdeError> {
        self.write.try_serialize(value)
    }
    fn try_serialize_owned(&self, value: T) -> Result<Option<Vec<u8>>, SerdeError> {
        self.write.try_serialize_owned(value)
    }
}

/// Implements [`Serde`] for a pointer to a serde, forwarding every call (the provided
/// methods too, so that a serde's own `try_serialize` is kept behind the pointer).
macro_rules! forward_serde {
    ($pointer:ident) => {
        impl<T, S: Serde<T> + ?Sized> Serde<T> for $pointer<S> {
            fn serialize(&self, value: &T) -> Option<Vec<u8>> {
                (**self).serialize(value)
            }
            fn deserialize(&self, data: Option<&[u8]>) -> Result<T, SerdeError> {
                (**self).deserialize(data)
            }
            fn try_serialize(&self, value: &T) -> Result<Option<Vec<u8>>, SerdeError> {
                (**self).try_serialize(value)
            }
            fn try_serialize_owned(&self, value: T) -> Result<Option<Vec<u8>>, SerdeError> {
                (**self).try_serialize_owned(value)
            }
            fn deserialize_with_schema(
                &self,
                data: Option<&[u8]>,
                schema: Option<&SchemaMetadata>,
            ) -> Result<T, SerdeError> {
                (**self).deserialize_with_schema(data, schema)
            }
            fn nulls(&self) -> Option<Nulls> {
                (**self).nulls()
            }
        }
    };
}

forward_serde!(Box);
forward_serde!(Arc);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_rejects_invalid_and_null() {
        assert_eq!(Utf8.deserialize(Some(b"caf\xc3\xa9")).unwrap(), "café");
        assert!(
            Utf8.deserialize(Some(b"\xff"))
                .unwrap_err()
                .0
                .contains("UTF-8")
        );
        assert!(Utf8.deserialize(None).unwrap_err().0.contains("null"));
    }

    #[test]
    fn nullable_maps_null_to_none() {
        assert_eq!(Nullable(Utf8).deserialize(None).unwrap(), None);
        assert_eq!(
            Nullable(Utf8).deserialize(Some(b"a")).unwrap(),
            Some("a".to_owned())
        );
        assert_eq!(Nullable(Utf8).serialize(&None), None);
    }

    #[test]
    fn big_endian_i64_is_kafkas_long_serde() {
        // Java: ByteBuffer.allocate(8).putLong(-2) = ff ff ff ff ff ff ff fe.
        let minus_two = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe];
        assert_eq!(BigEndianI64.serialize(&-2), Some(minus_two.to_vec()));
        assert_eq!(BigEndianI64.deserialize(Some(&minus_two)).unwrap(), -2);
        let max = [0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff];
        assert_eq!(BigEndianI64.deserialize(Some(&max)).unwrap(), i64::MAX);
        assert_eq!(
            BigEndianI64.deserialize(Some(&[1, 2, 3])).unwrap_err().0,
            "a big-endian 64-bit integer has 8 bytes, got 3"
        );
        assert!(
            BigEndianI64
                .deserialize(None)
                .unwrap_err()
                .0
                .contains("null")
        );
    }

    #[test]
    fn decimal_i64_is_text() {
        assert_eq!(DecimalI64.serialize(&-42), Some(b"-42".to_vec()));
        assert_eq!(DecimalI64.deserialize(Some(b"17")).unwrap(), 17);
        assert!(DecimalI64.deserialize(Some(b"1.5")).is_err());
    }
}
