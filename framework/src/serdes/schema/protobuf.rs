//! Protocol Buffers messages: [`Protobuf<T>`] for `prost` messages.

use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, OnceLock};

use prost_reflect::{DescriptorPool, DynamicMessage, MessageDescriptor};

use super::{
    BoundedCache, Common, DEFAULT_CACHE_CAPACITY, PayloadCodec, RegisteredSchema, SchemaId,
    SchemaSource, SchemaType, Subject, WireFormat, format_builders, schema_serde,
};
use crate::serdes::SerdeError;

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
/// A `.proto` is not needed to decode the binary formats (the message is compiled in), but
/// the writer's schema id is checked to exist in the schema source and to be a Protobuf
/// schema (the event source's `SCHEMA_NOT_FOUND`), once per id; the serde's own `.proto`
/// is registered or looked up under the subject for its output.
///
/// [`WireFormat::Json`] (`EventRecordFormat: JSON`: the event source decoded the message
/// to Protobuf's JSON mapping) is read and written through the serde's own `.proto`,
/// compiled once at first use (with its imports, [`RegisteredSchema::dependencies`], and
/// Google's well-known types): field names in lowerCamelCase or as in the `.proto`,
/// 64-bit integers as strings or numbers, enums by name or number, bytes in base64. A
/// field the `.proto` does not know is skipped, as the binary format skips it (a newer
/// writer); JSON that does not fit the message is an error naming the schema id.
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
    /// The message's descriptor, compiled from the serde's `.proto` at first need.
    descriptor: OnceLock<Result<MessageDescriptor, String>>,
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

/// The file name the compiled `.proto` text gets (its imports keep theirs).
const MAIN_FILE: &str = "lambda-streams-schema.proto";

/// Compiles a `.proto` text with its imports (`dependencies`, by import path) and
/// Google's well-known types.
pub(super) fn compile_proto(schema: &RegisteredSchema) -> Result<DescriptorPool, String> {
    struct Texts(RegisteredSchema);
    impl protox::file::FileResolver for Texts {
        fn open_file(&self, name: &str) -> Result<protox::file::File, protox::Error> {
            if name == MAIN_FILE {
                return protox::file::File::from_source(name, &self.0.text);
            }
            match self.0.dependencies.iter().find(|(n, _)| n == name) {
                Some((_, text)) => protox::file::File::from_source(name, text),
                None => Err(protox::Error::file_not_found(name)),
            }
        }
    }
    let mut resolver = protox::file::ChainFileResolver::new();
    resolver.add(Texts(schema.clone()));
    resolver.add(protox::file::GoogleFileResolver::new());
    let mut compiler = protox::Compiler::with_file_resolver(resolver);
    compiler
        .open_file(MAIN_FILE)
        .map_err(|e| format!("the .proto does not compile: {e}"))?;
    Ok(compiler.descriptor_pool())
}

/// The message at `path` (Confluent's message indexes) of the compiled `.proto`.
pub(super) fn message_at(pool: &DescriptorPool, path: &[i32]) -> Result<MessageDescriptor, String> {
    let file = pool
        .get_file_by_name(MAIN_FILE)
        .ok_or_else(|| "the compiled .proto is missing".to_owned())?;
    let missing = || format!("the .proto has no message at index {path:?}");
    let (&first, rest) = path.split_first().ok_or_else(missing)?;
    let mut message = usize::try_from(first)
        .ok()
        .and_then(|i| file.messages().nth(i))
        .ok_or_else(missing)?;
    for &index in rest {
        message = usize::try_from(index)
            .ok()
            .and_then(|i| message.child_messages().nth(i))
            .ok_or_else(missing)?;
    }
    Ok(message)
}

/// Reads Protobuf's JSON mapping of a message of `descriptor` into its binary encoding.
pub(super) fn binary_of_json(
    descriptor: &MessageDescriptor,
    json: &[u8],
) -> Result<Vec<u8>, String> {
    use prost::Message;
    let options = prost_reflect::DeserializeOptions::new().deny_unknown_fields(false);
    let mut deserializer = serde_json::Deserializer::from_slice(json);
    let message =
        DynamicMessage::deserialize_with_options(descriptor.clone(), &mut deserializer, &options)
            .map_err(|e| format!("the JSON is not a {} message: {e}", descriptor.full_name()))?;
    deserializer
        .end()
        .map_err(|e| format!("bytes after the JSON value: {e}"))?;
    Ok(message.encode_to_vec())
}

/// Protobuf's JSON mapping of a message of `descriptor` given in its binary encoding.
pub(super) fn json_of_binary(
    descriptor: &MessageDescriptor,
    bytes: &[u8],
) -> Result<serde_json::Value, String> {
    let message = DynamicMessage::decode(descriptor.clone(), bytes)
        .map_err(|e| format!("not a {} message: {e}", descriptor.full_name()))?;
    serde_json::to_value(&message).map_err(|e| format!("cannot write it as JSON: {e}"))
}

impl<T> Protobuf<T> {
    /// The serde of message `T`, whose `.proto` file is `proto` (the text registered for
    /// its output), finding schemas in `source`, under `subject`; Confluent wire format in
    /// and out until told otherwise.
    pub fn new(proto: &str, source: Arc<dyn SchemaSource>, subject: Subject) -> Self {
        Self::with_schema(
            RegisteredSchema::new(SchemaType::Protobuf, proto),
            source,
            subject,
        )
    }

    /// As [`new`](Self::new), with a `.proto` that imports others (given as its
    /// [`dependencies`](RegisteredSchema::dependencies), by import path), for the JSON
    /// format.
    pub fn with_schema(
        schema: RegisteredSchema,
        source: Arc<dyn SchemaSource>,
        subject: Subject,
    ) -> Self {
        Protobuf {
            common: Common::new(source, subject),
            registered: schema,
            message_index: vec![0],
            checked: BoundedCache::new(DEFAULT_CACHE_CAPACITY),
            descriptor: OnceLock::new(),
            types: PhantomData,
        }
    }

    /// Reads and writes the message at this index path of the `.proto` file (`[0]`: its
    /// first message; `[1, 0]`: the first message nested in the second).
    pub fn message_index(mut self, path: Vec<i32>) -> Self {
        self.message_index = path;
        self
    }

    /// Checks once per id that the writer's schema exists and is a Protobuf schema.
    fn check(&self, id: &SchemaId) -> Result<(), String> {
        if self.checked.get(id).is_some() {
            return Ok(());
        }
        self.common.writer_schema(id, SchemaType::Protobuf)?;
        self.checked.insert(*id, ());
        Ok(())
    }

    /// The descriptor of the serde's message, compiled once from its `.proto`.
    fn descriptor(&self) -> Result<&MessageDescriptor, String> {
        self.descriptor
            .get_or_init(|| {
                let pool = compile_proto(&self.registered)?;
                message_at(&pool, &self.message_index)
            })
            .as_ref()
            .map_err(|e| format!("subject {}: {e}", self.common.subject))
    }
}

format_builders!([T] Protobuf<T>, common);

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
pub(super) fn read_indexes(bytes: &mut &[u8]) -> Result<Vec<i32>, String> {
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

/// [`super::decode_to_json`] for Protobuf: `payload` starts with Confluent's message
/// indexes, which pick the message of the `.proto`.
pub(super) fn decode_to_json(
    schema: &RegisteredSchema,
    payload: &[u8],
) -> Result<serde_json::Value, String> {
    // Compiled once per schema for the process (the runner calls this per record).
    static POOLS: OnceLock<BoundedCache<RegisteredSchema, DescriptorPool>> = OnceLock::new();
    let pools = POOLS.get_or_init(|| BoundedCache::new(DEFAULT_CACHE_CAPACITY));
    let mut rest = payload;
    let path = read_indexes(&mut rest)?;
    let pool = match pools.get(schema) {
        Some(pool) => pool,
        None => {
            let pool = compile_proto(schema)?;
            pools.insert(schema.clone(), pool.clone());
            pool
        }
    };
    let descriptor = message_at(&pool, &path)?;
    json_of_binary(&descriptor, rest)
}

impl<T: prost::Message + Default + 'static> PayloadCodec<T> for Protobuf<T> {
    fn common(&self) -> &Common {
        &self.common
    }

    fn own_schema(&self) -> &RegisteredSchema {
        &self.registered
    }

    fn decode_payload(&self, id: &SchemaId, payload: &[u8]) -> Result<T, SerdeError> {
        let common = &self.common;
        self.check(id).map_err(SerdeError)?;
        let mut payload = payload;
        let has_indexes = match common.input {
            WireFormat::Confluent => true,
            WireFormat::Source => matches!(id, SchemaId::Confluent(_)),
            WireFormat::Glue | WireFormat::Json => false,
        };
        if has_indexes {
            let path =
                read_indexes(&mut payload).map_err(|e| SerdeError(common.error(Some(id), e)))?;
            if path != self.message_index {
                return Err(SerdeError(common.error(
                    Some(id),
                    format!(
                        "the record is message {path:?} of the schema, this serde reads {:?}",
                        self.message_index
                    ),
                )));
            }
        }
        T::decode(payload).map_err(|e| {
            SerdeError(common.error(
                Some(id),
                format!("not a {} message: {e}", std::any::type_name::<T>()),
            ))
        })
    }

    fn decode_json(&self, id: Option<&SchemaId>, json: &[u8]) -> Result<T, SerdeError> {
        let common = &self.common;
        let descriptor = self.descriptor().map_err(SerdeError)?;
        let binary =
            binary_of_json(descriptor, json).map_err(|e| SerdeError(common.error(id, e)))?;
        T::decode(&binary[..]).map_err(|e| {
            SerdeError(common.error(
                id,
                format!("the JSON does not fit {}: {e}", std::any::type_name::<T>()),
            ))
        })
    }

    fn encode_payload(&self, value: &T, out: &mut Vec<u8>) -> Result<(), SerdeError> {
        if self.common.output == WireFormat::Confluent {
            write_indexes(&self.message_index, out);
        }
        value
            .encode(out)
            .map_err(|e| SerdeError(format!("subject {}: {e}", self.common.subject)))
    }

    fn encode_json(&self, value: &T) -> Result<Vec<u8>, SerdeError> {
        let subject = &self.common.subject;
        let descriptor = self.descriptor().map_err(SerdeError)?;
        let json = json_of_binary(descriptor, &value.encode_to_vec())
            .map_err(|e| SerdeError(format!("subject {subject}: {e}")))?;
        serde_json::to_vec(&json).map_err(|e| SerdeError(format!("subject {subject}: {e}")))
    }
}

schema_serde!([T: prost::Message + Default + 'static] Protobuf<T> => T);

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
