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
//! | [`Json`] | any `T: Serialize + DeserializeOwned` | JSON (read with `sonic-rs`, `serde_json` the arbiter; written with `serde_json`) |
//! | [`Unit`] | `()` | anything in, null out |
//! | [`Nullable`] | `Option<T>` | null is `None` |
//! | `schema::Avro`, `schema::Protobuf`, `schema::JsonSchema` | schema'd values | a schema registry's wire formats (module [`schema`], features `avro`, `protobuf`, `json-schema`) |
//!
//! A user format implements [`Serde`]; a decode failure is a [`SerdeError`] message, and the
//! framework turns it into [`StreamError::Deserialize`](crate::StreamError::Deserialize)
//! naming the record's topic-partition and offset.

use std::any::{Any, TypeId};
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;

pub use crate::event::SchemaMetadata;

pub mod schema;

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

/// JSON, for any type that derives `Serialize` and `Deserialize`.
///
/// Values are read with `sonic-rs` (SIMD; 1.4x fewer instructions than `serde_json` into a
/// struct of ten fields, BENCHMARKS.md section 1) through the type's own `Deserialize`, so the
/// same derive decides both. `serde_json` stays the arbiter: a value `sonic-rs` refuses is
/// read again by `serde_json`, whose result (a value, or its error) is the answer, so no
/// input that `serde_json` reads is refused and every error has `serde_json`'s wording.
/// Values are written with `serde_json`.
///
/// A value that is not valid JSON for `T` is a [`SerdeError`] with `serde_json`'s message
/// (line and column included); the framework adds the record's topic-partition and offset.
///
/// ```
/// use lambda_streams::serdes::{Json, Serde};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
/// struct PageView { page: String, user: u64 }
///
/// let serde = Json::<PageView>::new();
/// let view = PageView { page: "/home".into(), user: 7 };
/// let bytes = serde.serialize(&view).unwrap();
/// assert_eq!(bytes, br#"{"page":"/home","user":7}"#);
/// assert_eq!(serde.deserialize(Some(&bytes)), Ok(view));
/// let err = serde.deserialize(Some(br#"{"page":"/home"}"#)).unwrap_err();
/// assert_eq!(err.to_string(), "invalid JSON: missing field `user` at line 1 column 16");
/// ```
pub struct Json<T>(PhantomData<fn() -> T>);

impl<T> Json<T> {
    /// The JSON serde of `T`.
    pub fn new() -> Self {
        Json(PhantomData)
    }
}

impl<T> Default for Json<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Clone for Json<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Json<T> {}

impl<T> fmt::Debug for Json<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Json<{}>", std::any::type_name::<T>())
    }
}

impl<T: Serialize + DeserializeOwned + 'static> Serde<T> for Json<T> {
    /// Encodes `value`; `None` only if `serde_json` cannot encode it (a map with
    /// non-string keys, or a failing `Serialize` implementation): the sinks call
    /// [`try_serialize`](Serde::try_serialize), which reports that as an error.
    fn serialize(&self, value: &T) -> Option<Vec<u8>> {
        serde_json::to_vec(value).ok()
    }
    fn deserialize(&self, data: Option<&[u8]>) -> Result<T, SerdeError> {
        let bytes = non_null(data, "Json")?;
        match sonic_rs::from_slice(bytes) {
            Ok(value) => Ok(value),
            // The arbiter: its value, or its error's wording.
            Err(_) => {
                serde_json::from_slice(bytes).map_err(|e| SerdeError(format!("invalid JSON: {e}")))
            }
        }
    }
    fn try_serialize(&self, value: &T) -> Result<Option<Vec<u8>>, SerdeError> {
        serde_json::to_vec(value)
            .map(Some)
            .map_err(|e| SerdeError(format!("cannot encode as JSON: {e}")))
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

    #[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Order {
        id: u32,
        items: Vec<String>,
        note: Option<String>,
    }

    #[test]
    fn json_round_trips_and_reports_bad_input() {
        let serde = Json::<Order>::new();
        let order = Order {
            id: 3,
            items: vec!["tea".into()],
            note: None,
        };
        let bytes = br#"{"id":3,"items":["tea"],"note":null}"#;
        assert_eq!(serde.serialize(&order), Some(bytes.to_vec()));
        assert_eq!(serde.deserialize(Some(bytes)).unwrap(), order);
        let err = serde.deserialize(Some(b"{\"id\":")).unwrap_err();
        assert_eq!(
            err.0,
            "invalid JSON: EOF while parsing a value at line 1 column 6"
        );
        let err = serde
            .deserialize(Some(br#"{"id":"x","items":[]}"#))
            .unwrap_err();
        assert!(
            err.0
                .starts_with("invalid JSON: invalid type: string \"x\", expected u32")
        );
        assert!(serde.deserialize(None).unwrap_err().0.contains("null"));
        assert_eq!(
            Nullable(Json::<Order>::new()).deserialize(None).unwrap(),
            None
        );
    }

    #[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct View {
        user_id: String,
        url: String,
        referrer: Option<String>,
        duration_ms: u32,
        scroll_depth: f32,
        ts: i64,
        tags: Vec<String>,
    }

    use proptest::strategy::Strategy as _;

    proptest::proptest! {
        /// `Json` (sonic-rs, serde_json the arbiter) gives what serde_json alone gives, on
        /// valid values and on every corruption of one: the same value, or the same error.
        #[test]
        fn json_reads_what_serde_json_reads(
            user in "\\PC{0,12}",
            url in "[a-z/\"\\\\\u{0}-\u{1f}é😀]{0,16}",
            referrer in proptest::option::of("[a-z]{0,4}"),
            duration_ms in proptest::prelude::any::<u32>(),
            scroll_depth in proptest::prelude::any::<f32>().prop_filter("finite", |f| f.is_finite()),
            ts in proptest::prelude::any::<i64>(),
            tags in proptest::collection::vec("[a-z]{0,3}", 0..3),
            cut in 0usize..200,
            flip in proptest::option::of((0usize..200, proptest::prelude::any::<u8>())),
        ) {
            let view = View { user_id: user, url, referrer, duration_ms, scroll_depth, ts, tags };
            let mut bytes = serde_json::to_vec(&view).unwrap();
            let reference = |b: &[u8]| {
                serde_json::from_slice::<View>(b).map_err(|e| format!("invalid JSON: {e}"))
            };
            let ours = |b: &[u8]| Json::<View>::new().deserialize(Some(b)).map_err(|e| e.0);
            proptest::prop_assert_eq!(ours(&bytes), reference(&bytes));
            proptest::prop_assert_eq!(ours(&bytes).unwrap(), view);
            if let Some((at, byte)) = flip {
                let at = at % bytes.len();
                bytes[at] = byte;
            }
            bytes.truncate(bytes.len().saturating_sub(cut % 4 * (cut % 3)));
            proptest::prop_assert_eq!(ours(&bytes), reference(&bytes));
        }
    }

    #[test]
    fn json_reads_what_serde_json_reads_at_the_edges() {
        let ours = |b: &[u8]| Json::<View>::new().deserialize(Some(b)).map_err(|e| e.0);
        let reference =
            |b: &[u8]| serde_json::from_slice::<View>(b).map_err(|e| format!("invalid JSON: {e}"));
        let base = r#"{"userId":"u","url":"/","referrer":null,"durationMs":1,"scrollDepth":0.5,"ts":-1,"tags":[]}"#;
        for case in [
            base.to_owned(),
            base.replace("\"u\"", "\"\\ud83d\\ude00\""),
            base.replace("\"u\"", "\"\\ud83d\""),
            base.replace("0.5", "1e400"),
            base.replace("0.5", "2.5e-46"),
            base.replace(":1,", ":4294967296,"),
            base.replace("-1", "-9223372036854775809"),
            base.replace("\"ts\"", "\"ts\":1,\"ts\""),
            base.replace("{", "{\"extra\":{\"a\":[1,{}]},"),
            format!("{base} "),
            format!("{base}x"),
            format!(" \n{base}"),
            base.replace("\"u\"", "\"\u{7f}\""),
        ] {
            assert_eq!(ours(case.as_bytes()), reference(case.as_bytes()), "{case}");
        }
        let control = base.replace("\"u\"", "\"\u{1}\"").into_bytes();
        assert_eq!(ours(&control), reference(&control));
        let mut latin1 = base.as_bytes().to_vec();
        latin1[11] = 0xe9;
        assert_eq!(ours(&latin1), reference(&latin1));
    }

    #[test]
    fn json_encoding_failure_is_an_error_not_a_null() {
        use std::collections::HashMap;
        // JSON object keys must be strings: a map keyed by a tuple cannot be encoded.
        let serde = Json::<HashMap<(u8, u8), u8>>::new();
        let value = HashMap::from([((1, 2), 3)]);
        assert_eq!(serde.serialize(&value), None);
        assert!(
            serde
                .try_serialize(&value)
                .unwrap_err()
                .0
                .starts_with("cannot encode as JSON: key must be a string")
        );
        assert_eq!(
            Utf8.try_serialize(&"a".to_owned()).unwrap(),
            Some(b"a".to_vec())
        );
    }

    #[test]
    fn decimal_i64_is_text() {
        assert_eq!(DecimalI64.serialize(&-42), Some(b"-42".to_vec()));
        assert_eq!(DecimalI64.deserialize(Some(b"17")).unwrap(), 17);
        assert!(DecimalI64.deserialize(Some(b"1.5")).is_err());
    }
}
