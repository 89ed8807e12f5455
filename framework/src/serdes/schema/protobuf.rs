//! Protocol Buffers messages: [`Protobuf<T>`] for `prost` messages.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use super::{
    BoundedCache, Common, DEFAULT_CACHE_CAPACITY, RegisteredSchema, SchemaId, SchemaSource,
    SchemaType, Subject, WireFormat,
};
use crate::event::SchemaMetadata;
use crate::serdes::{Serde, SerdeError};

/// Protocol Buffers messages of a `prost` type `T`, in a registry's wire formats
/// ([module docs](super)).
///
/// The Confluent wire format puts the *message indexes* between the schema id and the
/// message: which message of the `.proto` file the bytes are (a zig-zag varint count, then
/// each index; the single byte `0` for the file's first message). This serde reads one
/// message type, at [`message_index`](Self::message_index) (default `[0]`): a record of
/// another message is an error naming it. With [`WireFormat::Source`] the indexes are
/// expected when the metadata's schema id is a Confluent one (the event source strips the
/// 5-byte header only), not for a Glue schema version (Glue has no indexes).
///
/// A `.proto` is not needed to decode (the message is compiled in), but the writer's schema
/// id is checked to exist in the schema source and to be a Protobuf schema (the event
/// source's `SCHEMA_NOT_FOUND`), once per id; the serde's own `.proto` is registered or
/// looked up under the subject for its output.
///
/// [`WireFormat::Json`] is not read or written: `prost` messages have no JSON mapping of
/// their own (read such records with [`Json`](crate::serdes::Json) and a serde type).
///
/// ```
/// use std::sync::Arc;
/// use lambda_streams::serdes::Serde;
/// use lambda_streams::serdes::schema::{OfflineSchemas, Protobuf, SchemaId, SchemaType, Side, Subject};
///
/// #[derive(Clone, PartialEq, prost::Message)]
/// struct Click {
///     #[prost(string, tag = "1")]
///     page: String,
/// }
/// const PROTO: &str = "syntax = \"proto3\"; message Click { string page = 1; }";
/// let subject = Subject::topic("clicks", Side::Value);
/// let schemas = OfflineSchemas::new().with(SchemaId::Confluent(4), subject.clone(), SchemaType::Protobuf, PROTO);
/// let serde = Protobuf::<Click>::new(PROTO, Arc::new(schemas), subject);
/// let bytes = serde.try_serialize(&Click { page: "/a".into() })?.unwrap();
/// // Header, message index [0] as the single byte 0, then field 1 (tag 0x0a), length 2.
/// assert_eq!(bytes, [0, 0, 0, 0, 4, 0, 0x0a, 2, b'/', b'a']);
/// assert_eq!(serde.deserialize(Some(&bytes))?, Click { page: "/a".into() });
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Protobuf<T> {
    common: Common,
    registered: RegisteredSchema,
    message_index: Vec<i32>,
    checked: BoundedCache<SchemaId, ()>,
    types: PhantomData<fn() -> T>,
}

impl<T> fmt::Debug for Protobuf<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Protobuf<{}>({})",
            std::any::type_name::<T>(),
            self.common.subject
        )
    }
}

impl<T> Protobuf<T> {
    /// The serde of message `T`, whose `.proto` file is `proto` (the text registered for
    /// its output), finding schemas in `source`, under `subject`; Confluent wire format in
    /// and out until told otherwise.
    pub fn new(proto: &str, source: Arc<dyn SchemaSource>, subject: Subject) -> Self {
        Protobuf {
            common: Common::new(source, subject),
            registered: RegisteredSchema::new(SchemaType::Protobuf, proto),
            message_index: vec![0],
            checked: BoundedCache::new(DEFAULT_CACHE_CAPACITY),
            types: PhantomData,
        }
    }

    /// Reads and writes the message at this index path of the `.proto` file (`[0]`: its
    /// first message; `[1, 0]`: the first message nested in the second).
    pub fn message_index(mut self, path: Vec<i32>) -> Self {
        self.message_index = path;
        self
    }

    /// Reads records laid out as `format`.
    pub fn input(mut self, format: WireFormat) -> Self {
        self.common.input = format;
        self
    }

    /// Writes records laid out as `format`.
    pub fn output(mut self, format: WireFormat) -> Self {
        self.common.output = format;
        self
    }

    /// Checks once per id that the writer's schema exists and is a Protobuf schema.
    fn check(&self, id: &SchemaId) -> Result<(), String> {
        if self.checked.get(id).is_some() {
            return Ok(());
        }
        let found = self
            .common
            .source
            .schema_by_id(id, &self.common.subject)
            .map_err(|e| e.0)?;
        if found.schema_type != SchemaType::Protobuf {
            return Err(self.common.error(
                Some(id),
                format!(
                    "the registry's schema is {}, not PROTOBUF",
                    found.schema_type.as_str()
                ),
            ));
        }
        self.checked.insert(*id, ());
        Ok(())
    }
}

/// Reads one zig-zag varint (Java's `ByteUtils.readVarint`) from the front of `bytes`.
fn read_zigzag(bytes: &mut &[u8]) -> Option<i32> {
    let mut value: u32 = 0;
    for shift in (0..35).step_by(7) {
        let (&byte, rest) = bytes.split_first()?;
        *bytes = rest;
        value |= u32::from(byte & 0x7f).checked_shl(shift)?;
        if byte & 0x80 == 0 {
            return Some(((value >> 1) as i32) ^ -((value & 1) as i32));
        }
    }
    None
}

fn write_zigzag(value: i32, out: &mut Vec<u8>) {
    let mut v = ((value << 1) ^ (value >> 31)) as u32;
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Reads Confluent's message indexes from the front of `bytes`.
fn read_indexes(bytes: &mut &[u8]) -> Result<Vec<i32>, String> {
    let count = read_zigzag(bytes).ok_or("the message indexes are cut short")?;
    if count == 0 {
        return Ok(vec![0]);
    }
    if count < 0 || count as usize > bytes.len() {
        return Err(format!("{count} is not a count of message indexes"));
    }
    (0..count)
        .map(|_| read_zigzag(bytes).ok_or_else(|| "the message indexes are cut short".to_owned()))
        .collect()
}

fn write_indexes(path: &[i32], out: &mut Vec<u8>) {
    if path == [0] {
        out.push(0);
        return;
    }
    write_zigzag(path.len() as i32, out);
    for index in path {
        write_zigzag(*index, out);
    }
}

impl<T: prost::Message + Default + 'static> Protobuf<T> {
    fn encode(&self, value: &T) -> Result<Vec<u8>, SerdeError> {
        if self.common.output == WireFormat::Json {
            return Err(SerdeError(format!(
                "subject {}: Protobuf does not write JSON",
                self.common.subject
            )));
        }
        let mut out = self
            .common
            .output_header(&self.registered)
            .map_err(SerdeError)?;
        if self.common.output == WireFormat::Confluent {
            write_indexes(&self.message_index, &mut out);
        }
        value
            .encode(&mut out)
            .map_err(|e| SerdeError(format!("subject {}: {e}", self.common.subject)))?;
        Ok(out)
    }
}

impl<T: prost::Message + Default + 'static> Serde<T> for Protobuf<T> {
    fn serialize(&self, value: &T) -> Option<Vec<u8>> {
        self.encode(value).ok()
    }

    fn deserialize(&self, data: Option<&[u8]>) -> Result<T, SerdeError> {
        self.deserialize_with_schema(data, None)
    }

    fn try_serialize(&self, value: &T) -> Result<Option<Vec<u8>>, SerdeError> {
        self.encode(value).map(Some)
    }

    fn deserialize_with_schema(
        &self,
        data: Option<&[u8]>,
        schema: Option<&SchemaMetadata>,
    ) -> Result<T, SerdeError> {
        let common = &self.common;
        if common.input == WireFormat::Json {
            return Err(SerdeError(common.error(
                None,
                "Protobuf does not read EventRecordFormat JSON (use Json with a serde type)",
            )));
        }
        let framed = common.unframe(data, schema).map_err(SerdeError)?;
        let Some(id) = framed.id else {
            return Err(SerdeError(common.error(None, "no schema id")));
        };
        self.check(&id).map_err(SerdeError)?;
        let mut payload = framed.payload;
        let has_indexes = match common.input {
            WireFormat::Confluent => true,
            WireFormat::Source => matches!(id, SchemaId::Confluent(_)),
            WireFormat::Glue | WireFormat::Json => false,
        };
        if has_indexes {
            let path =
                read_indexes(&mut payload).map_err(|e| SerdeError(common.error(Some(&id), e)))?;
            if path != self.message_index {
                return Err(SerdeError(common.error(
                    Some(&id),
                    format!(
                        "the record is message {path:?} of the schema, this serde reads {:?}",
                        self.message_index
                    ),
                )));
            }
        }
        T::decode(payload).map_err(|e| {
            SerdeError(common.error(
                Some(&id),
                format!("not a {} message: {e}", std::any::type_name::<T>()),
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zigzag_varints_by_hand() {
        // Zig-zag: 0 -> 0, -1 -> 1, 1 -> 2, 64 -> 128 = varint 80 01.
        for (value, bytes) in [
            (0, vec![0u8]),
            (-1, vec![1]),
            (1, vec![2]),
            (64, vec![0x80, 0x01]),
            (i32::MIN, vec![0xff, 0xff, 0xff, 0xff, 0x0f]),
        ] {
            let mut out = Vec::new();
            write_zigzag(value, &mut out);
            assert_eq!(out, bytes, "{value}");
            let mut slice = &bytes[..];
            assert_eq!(read_zigzag(&mut slice), Some(value));
            assert!(slice.is_empty());
        }
        assert_eq!(read_zigzag(&mut &[0x80u8][..]), None);
        assert_eq!(read_zigzag(&mut &[0xffu8; 6][..]), None);
        // [1, 0]: count 2 (zig-zag 4), 1 (2), 0 (0).
        let mut out = Vec::new();
        write_indexes(&[1, 0], &mut out);
        assert_eq!(out, [4, 2, 0]);
        assert_eq!(read_indexes(&mut &out[..]).unwrap(), [1, 0]);
        assert_eq!(read_indexes(&mut &[0u8][..]).unwrap(), [0]);
        assert!(read_indexes(&mut &[0x7eu8][..]).is_err());
    }
}
