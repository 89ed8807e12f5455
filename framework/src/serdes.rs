//! Serdes: how keys and values turn into bytes and back.
//!
//! A [`Serde`] works on `Option<&[u8]>` because Kafka keys and values can be null:
//! a `null` key is common (text lines), and a `null` value is a tombstone. The
//! built-in serdes reject null unless they say otherwise; wrap one in [`Nullable`]
//! to receive `Option<T>`, or use [`Unit`] for a side you do not read.

use std::fmt;

/// Converts values of type `T` to Kafka bytes and back.
///
/// Implement it for your own formats. `deserialize` returns an error message (never
/// panics); the framework adds the record's topic-partition and offset to it.
pub trait Serde<T>: Send + Sync + 'static {
    /// Encodes a value; `None` writes a Kafka null.
    fn serialize(&self, value: &T) -> Option<Vec<u8>>;
    /// Decodes a Kafka key or value (`None` is a Kafka null).
    fn deserialize(&self, data: Option<&[u8]>) -> Result<T, SerdeError>;
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

impl<T, S: Serde<T>> Serde<Option<T>> for Nullable<S> {
    fn serialize(&self, value: &Option<T>) -> Option<Vec<u8>> {
        value.as_ref().and_then(|v| self.0.serialize(v))
    }
    fn deserialize(&self, data: Option<&[u8]>) -> Result<Option<T>, SerdeError> {
        match data {
            None => Ok(None),
            Some(_) => self.0.deserialize(data).map(Some),
        }
    }
}

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
    fn decimal_i64_is_text() {
        assert_eq!(DecimalI64.serialize(&-42), Some(b"-42".to_vec()));
        assert_eq!(DecimalI64.deserialize(Some(b"17")).unwrap(), 17);
        assert!(DecimalI64.deserialize(Some(b"1.5")).is_err());
    }
}
