//! Schema'd records: Avro, Protobuf and JSON Schema values behind a schema registry.
//!
//! Most production topics carry values written by a registry-aware serializer: a short
//! header naming the writer's schema, then the encoded value. The serdes here read and
//! write the four shapes such a record can have in a Lambda function ([`WireFormat`]):
//!
//! | format | bytes | where the schema id is |
//! |---|---|---|
//! | [`WireFormat::Confluent`] | `0x00`, 4-byte big-endian id, payload | in the header |
//! | [`WireFormat::Glue`] | `0x03`, compression byte, 16-byte schema version UUID, payload | in the header |
//! | [`WireFormat::Source`] | payload only (`EventRecordFormat: SOURCE`) | the record's `valueSchemaMetadata` / `keySchemaMetadata` |
//! | [`WireFormat::Json`] | the value as JSON text (`EventRecordFormat: JSON`) | the metadata (the event source decoded it already) |
//!
//! A serde finds the writer's schema by id in a [`SchemaSource`]: a Confluent-compatible
//! registry over HTTP ([`registry::RegistryClient`], each schema fetched once per container
//! and kept in a bounded cache) or schemas compiled into the function ([`OfflineSchemas`],
//! no network call). Output values are written with the serde's own schema, whose id is
//! registered or looked up under a subject once ([`Subject`], Confluent's
//! TopicNameStrategy `<topic>-value` / `<topic>-key` by default).
//!
//! A value that cannot be decoded (no header, an unknown schema id, bytes that do not match
//! the schema) is a [`SerdeError`] naming the schema id and the
//! subject; the framework adds the record's topic-partition and offset and applies the
//! poison policy. Nothing here panics on bad input.
//!
//! The formats are behind features: `avro` (`Avro`, `AvroGeneric`), `protobuf`
//! (`Protobuf`) and `json-schema` (`JsonSchema`); `schema` enables all three (docs.rs
//! documents the crate with all of them).

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use crate::event::SchemaMetadata;
use crate::serdes::SerdeError;

pub mod glue;
pub mod registry;

#[cfg(feature = "avro")]
mod avro;
#[cfg(feature = "avro")]
pub use avro::{Avro, AvroGeneric};
#[cfg(feature = "protobuf")]
mod protobuf;
#[cfg(feature = "protobuf")]
pub use protobuf::Protobuf;
#[cfg(feature = "json-schema")]
mod json_schema;
#[cfg(feature = "json-schema")]
pub use json_schema::JsonSchema;

/// The Confluent wire format's first byte.
pub const CONFLUENT_MAGIC: u8 = 0;
/// The AWS Glue Schema Registry header's first byte (its header version).
pub const GLUE_HEADER_VERSION: u8 = 3;
/// The Glue header's compression byte for an uncompressed payload.
pub const GLUE_NO_COMPRESSION: u8 = 0;
/// The Glue header's compression byte for a zlib-compressed payload.
pub const GLUE_ZLIB_COMPRESSION: u8 = 5;
/// The length of the Confluent header: magic byte and 4-byte schema id.
pub const CONFLUENT_HEADER_LEN: usize = 5;
/// The length of the Glue header: version, compression and the 16-byte UUID.
pub const GLUE_HEADER_LEN: usize = 18;
/// The most bytes a zlib-compressed Glue payload may inflate to. A Lambda event holds
/// 6 MB at most; a payload that claims more than this is refused, so that a corrupt or
/// hostile record cannot make the function allocate without bound.
pub const GLUE_MAX_INFLATED_LEN: usize = 16 << 20;

/// Whether a serde writing [`WireFormat::Glue`] compresses its payloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GlueCompression {
    /// Compression byte `0`: the payload as encoded (the default, as Glue's serializer's).
    #[default]
    None,
    /// Compression byte `5`: the payload compressed with zlib (Glue's `ZLIB` setting).
    Zlib,
}

/// How a schema'd key or value is laid out in a record (see the [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WireFormat {
    /// Confluent's: magic byte `0`, the schema id (4 bytes, big-endian), the payload.
    #[default]
    Confluent,
    /// AWS Glue Schema Registry's: version byte `3`, a compression byte, the schema
    /// version id (16 bytes), the payload.
    Glue,
    /// What Lambda's event source hands over with `EventRecordFormat: SOURCE`: the payload
    /// without its prefix; the schema id is in the record's schema metadata.
    Source,
    /// What Lambda's event source hands over with `EventRecordFormat: JSON`: the value
    /// decoded to JSON text.
    Json,
}

impl WireFormat {
    /// Parses `confluent`, `glue`, `source` or `json` (case-insensitive); the error names
    /// the setting's value.
    pub fn parse(value: &str) -> Result<Self, SchemaError> {
        match value.trim().to_ascii_lowercase().as_str() {
            "confluent" => Ok(WireFormat::Confluent),
            "glue" => Ok(WireFormat::Glue),
            "source" => Ok(WireFormat::Source),
            "json" => Ok(WireFormat::Json),
            other => Err(SchemaError(format!(
                "wire format {other:?} is not confluent, glue, source or json"
            ))),
        }
    }
}

/// The kind of a schema, as a registry (`schemaType`) and the event source's metadata
/// (`dataFormat`) name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SchemaType {
    /// Apache Avro (`AVRO`, a registry's default).
    Avro,
    /// Protocol Buffers (`PROTOBUF`).
    Protobuf,
    /// JSON Schema (`JSON`).
    Json,
}

impl SchemaType {
    /// The name a registry and the event source use: `AVRO`, `PROTOBUF` or `JSON`.
    pub fn as_str(self) -> &'static str {
        match self {
            SchemaType::Avro => "AVRO",
            SchemaType::Protobuf => "PROTOBUF",
            SchemaType::Json => "JSON",
        }
    }

    /// Parses a registry's `schemaType` or the metadata's `dataFormat` (absent means Avro
    /// in a registry's answers).
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "AVRO" => Some(SchemaType::Avro),
            "PROTOBUF" => Some(SchemaType::Protobuf),
            "JSON" => Some(SchemaType::Json),
            _ => None,
        }
    }
}

/// A schema's id: a Confluent-compatible registry's integer, or a Glue schema version id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SchemaId {
    /// A Confluent-compatible registry's global schema id.
    Confluent(u32),
    /// An AWS Glue schema version id (a UUID, as its 16 bytes).
    Glue([u8; 16]),
}

impl SchemaId {
    /// Parses the metadata's `schemaId`: a decimal integer (a Confluent-compatible registry)
    /// or a UUID in its 8-4-4-4-12 hexadecimal form (Glue).
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
            return text.parse().ok().map(SchemaId::Confluent);
        }
        let hex: Vec<u8> = text.bytes().filter(|b| *b != b'-').collect();
        let dashes_ok = text.len() == 36
            && [8, 13, 18, 23]
                .iter()
                .all(|&i| text.as_bytes().get(i) == Some(&b'-'));
        if hex.len() != 32 || !dashes_ok {
            return None;
        }
        let mut bytes = [0u8; 16];
        for (i, pair) in hex.chunks(2).enumerate() {
            let pair = std::str::from_utf8(pair).ok()?;
            bytes[i] = u8::from_str_radix(pair, 16).ok()?;
        }
        Some(SchemaId::Glue(bytes))
    }
}

impl fmt::Display for SchemaId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SchemaId::Confluent(id) => write!(f, "{id}"),
            SchemaId::Glue(b) => {
                for (i, byte) in b.iter().enumerate() {
                    if matches!(i, 4 | 6 | 8 | 10) {
                        f.write_str("-")?;
                    }
                    write!(f, "{byte:02x}")?;
                }
                Ok(())
            }
        }
    }
}

/// Whether a serde reads keys or values: the suffix of its TopicNameStrategy subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// A record key: subject `<topic>-key`.
    Key,
    /// A record value: subject `<topic>-value`.
    Value,
}

/// The registry subject of a topic's keys or values.
///
/// [`Subject::topic`] is Confluent's default TopicNameStrategy (`orders-value`);
/// [`Subject::named`] is any other name (a RecordNameStrategy's `com.example.Order`).
///
/// ```
/// use lambda_streams::serdes::schema::{Side, Subject};
///
/// assert_eq!(Subject::topic("orders", Side::Value).as_str(), "orders-value");
/// assert_eq!(Subject::topic("orders", Side::Key).as_str(), "orders-key");
/// assert_eq!(Subject::named("com.example.Order").as_str(), "com.example.Order");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Subject(String);

impl Subject {
    /// TopicNameStrategy: `<topic>-key` or `<topic>-value`.
    pub fn topic(topic: &str, side: Side) -> Self {
        match side {
            Side::Key => Subject(format!("{topic}-key")),
            Side::Value => Subject(format!("{topic}-value")),
        }
    }

    /// A subject given by name.
    pub fn named(name: impl Into<String>) -> Self {
        Subject(name.into())
    }

    /// The subject's name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A schema as a registry stores it: its kind, its text, and the schemas it references.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RegisteredSchema {
    /// Avro, Protobuf or JSON Schema.
    pub schema_type: SchemaType,
    /// The schema's text (Avro JSON, a `.proto` file, a JSON Schema document).
    pub text: Arc<str>,
    /// The schemas this one refers to (Confluent's schema `references`), resolved and
    /// flattened, each as its reference name and text, dependencies before dependants: for
    /// Avro, named types defined in other subjects (the name is the type's full name); for
    /// Protobuf, the files it imports (the name is the import path). Empty for a schema
    /// that stands alone.
    pub dependencies: Vec<(String, Arc<str>)>,
}

impl RegisteredSchema {
    /// A schema from its kind and text, without references.
    pub fn new(schema_type: SchemaType, text: impl Into<Arc<str>>) -> Self {
        RegisteredSchema {
            schema_type,
            text: text.into(),
            dependencies: Vec::new(),
        }
    }

    /// The same schema, referring to `dependencies` (name and text each, dependencies
    /// before dependants; see [`dependencies`](Self::dependencies)).
    pub fn with_dependencies(
        mut self,
        dependencies: impl IntoIterator<Item = (String, Arc<str>)>,
    ) -> Self {
        self.dependencies = dependencies.into_iter().collect();
        self
    }
}

/// Why a schema could not be found, registered or used; the message names the schema id
/// and the subject (and the registry's answer when there is one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaError(pub String);

impl fmt::Display for SchemaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SchemaError {}

impl From<SchemaError> for SerdeError {
    fn from(e: SchemaError) -> Self {
        SerdeError(e.0)
    }
}

/// Where the schema'd serdes find writer schemas by id and the ids of their own schemas.
///
/// Calls are synchronous because serdes are: an implementation that asks a server
/// ([`registry::RegistryClient`]) caches what it got, so that a container asks once per
/// schema.
pub trait SchemaSource: Send + Sync + 'static {
    /// The schema with id `id`; `subject` is the subject the caller reads, for messages.
    fn schema_by_id(
        &self,
        id: &SchemaId,
        subject: &Subject,
    ) -> Result<RegisteredSchema, SchemaError>;
    /// The id of `schema` under `subject` for a header of `format` (a Confluent id for
    /// [`WireFormat::Confluent`], a Glue schema version for [`WireFormat::Glue`]):
    /// registered if the source registers schemas and the subject does not hold it yet,
    /// else looked up.
    fn id_for(
        &self,
        subject: &Subject,
        schema: &RegisteredSchema,
        format: WireFormat,
    ) -> Result<SchemaId, SchemaError>;
}

impl<S: SchemaSource + ?Sized> SchemaSource for Arc<S> {
    fn schema_by_id(
        &self,
        id: &SchemaId,
        subject: &Subject,
    ) -> Result<RegisteredSchema, SchemaError> {
        (**self).schema_by_id(id, subject)
    }
    fn id_for(
        &self,
        subject: &Subject,
        schema: &RegisteredSchema,
        format: WireFormat,
    ) -> Result<SchemaId, SchemaError> {
        (**self).id_for(subject, schema, format)
    }
}

/// Schemas compiled into the function: no registry call, ever (offline mode).
///
/// Each schema is listed with its id and the subject it is registered under; an unknown id
/// is an error naming it. A serde writing with this source finds its output schema's id by
/// subject and schema text.
///
/// ```
/// use lambda_streams::serdes::schema::{
///     OfflineSchemas, RegisteredSchema, SchemaId, SchemaSource, SchemaType, Side, Subject,
///     WireFormat,
/// };
///
/// let text = r#"{"type":"record","name":"Order","fields":[{"name":"id","type":"long"}]}"#;
/// let subject = Subject::topic("orders", Side::Value);
/// let schemas = OfflineSchemas::new().with(SchemaId::Confluent(7), subject.clone(), SchemaType::Avro, text);
/// let schema = RegisteredSchema::new(SchemaType::Avro, text);
/// assert_eq!(schemas.schema_by_id(&SchemaId::Confluent(7), &subject), Ok(schema.clone()));
/// assert_eq!(schemas.id_for(&subject, &schema, WireFormat::Confluent), Ok(SchemaId::Confluent(7)));
/// let err = schemas.schema_by_id(&SchemaId::Confluent(8), &subject).unwrap_err();
/// assert_eq!(err.to_string(), "schema id 8 (subject orders-value): not among the compiled-in schemas (offline mode)");
/// ```
#[derive(Debug, Clone, Default)]
pub struct OfflineSchemas {
    by_id: HashMap<SchemaId, (Subject, RegisteredSchema)>,
}

impl OfflineSchemas {
    /// No schemas yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the schema `text` of kind `schema_type` with id `id` under `subject`.
    pub fn with(
        mut self,
        id: SchemaId,
        subject: Subject,
        schema_type: SchemaType,
        text: impl Into<Arc<str>>,
    ) -> Self {
        self.by_id
            .insert(id, (subject, RegisteredSchema::new(schema_type, text)));
        self
    }

    /// Adds `schema` (which may carry [`dependencies`](RegisteredSchema::dependencies))
    /// with id `id` under `subject`.
    pub fn with_schema(mut self, id: SchemaId, subject: Subject, schema: RegisteredSchema) -> Self {
        self.by_id.insert(id, (subject, schema));
        self
    }
}

impl SchemaSource for OfflineSchemas {
    fn schema_by_id(
        &self,
        id: &SchemaId,
        subject: &Subject,
    ) -> Result<RegisteredSchema, SchemaError> {
        self.by_id
            .get(id)
            .map(|(_, schema)| schema.clone())
            .ok_or_else(|| {
                SchemaError(format!(
                    "schema id {id} (subject {subject}): not among the compiled-in schemas (offline mode)"
                ))
            })
    }

    fn id_for(
        &self,
        subject: &Subject,
        schema: &RegisteredSchema,
        format: WireFormat,
    ) -> Result<SchemaId, SchemaError> {
        let glue = format == WireFormat::Glue;
        let mut found: Vec<SchemaId> = self
            .by_id
            .iter()
            .filter(|(id, (s, registered))| {
                s == subject && registered == schema && matches!(id, SchemaId::Glue(_)) == glue
            })
            .map(|(id, _)| *id)
            .collect();
        found.sort();
        found.pop().ok_or_else(|| {
            SchemaError(format!(
                "subject {subject}: the output schema is not among the compiled-in schemas (offline mode)"
            ))
        })
    }
}

/// A map with at most `capacity` entries; inserting into a full one forgets the oldest
/// entry first. The registry client and the serdes keep schemas in it, so that a topic
/// with ever new schema ids cannot grow a container's memory without bound.
#[derive(Debug)]
pub(crate) struct BoundedCache<K, V> {
    capacity: usize,
    inner: Mutex<(HashMap<K, V>, VecDeque<K>)>,
}

impl<K: Eq + Hash + Clone, V: Clone> BoundedCache<K, V> {
    pub(crate) fn new(capacity: usize) -> Self {
        BoundedCache {
            capacity: capacity.max(1),
            inner: Mutex::new((HashMap::new(), VecDeque::new())),
        }
    }

    pub(crate) fn get(&self, key: &K) -> Option<V> {
        let guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        guard.0.get(key).cloned()
    }

    pub(crate) fn insert(&self, key: K, value: V) {
        let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let (map, order) = &mut *guard;
        if map.insert(key.clone(), value).is_none() {
            order.push_back(key);
            while map.len() > self.capacity {
                match order.pop_front() {
                    Some(oldest) => {
                        map.remove(&oldest);
                    }
                    None => break,
                }
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).0.len()
    }
}

/// How many schemas a serde or a registry client keeps parsed or fetched at once.
pub const DEFAULT_CACHE_CAPACITY: usize = 1000;

/// A schema'd key or value split into the writer's schema id and its payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Framed<'a> {
    /// The writer's schema id: from the header, or from the schema metadata
    /// ([`WireFormat::Source`], [`WireFormat::Json`]); `None` when neither has one.
    pub id: Option<SchemaId>,
    /// The encoded value (for [`WireFormat::Json`], JSON text): borrowed from the record,
    /// or owned when it was inflated (a zlib-compressed Glue payload).
    pub payload: Cow<'a, [u8]>,
}

/// Splits `data` laid out as `format` into its schema id and payload.
///
/// # Errors
///
/// A message (for the serde to prefix with the subject) when the bytes are too short for
/// the header, the magic byte or Glue version is wrong, a Glue compression byte is neither
/// `0` nor `5`, a zlib payload does not inflate (or inflates past
/// [`GLUE_MAX_INFLATED_LEN`]), or, for [`WireFormat::Source`], the metadata has no schema
/// id. (Inflating needs one of the format features.)
///
/// ```
/// use lambda_streams::serdes::schema::{unframe, SchemaId, WireFormat};
///
/// let framed = unframe(WireFormat::Confluent, &[0, 0, 0, 1, 2, 0xaa], None).unwrap();
/// assert_eq!(framed.id, Some(SchemaId::Confluent(258)));
/// assert_eq!(&*framed.payload, &[0xaa]);
/// assert!(unframe(WireFormat::Confluent, &[1, 0, 0, 1, 2], None).is_err());
/// ```
pub fn unframe<'a>(
    format: WireFormat,
    data: &'a [u8],
    metadata: Option<&SchemaMetadata>,
) -> Result<Framed<'a>, String> {
    let metadata_id = || -> Result<Option<SchemaId>, String> {
        match metadata.and_then(|m| m.schema_id.as_deref()) {
            None => Ok(None),
            Some(text) => SchemaId::parse(text).map(Some).ok_or_else(|| {
                format!("the schema metadata's schemaId {text:?} is not an integer or a UUID")
            }),
        }
    };
    match format {
        WireFormat::Confluent => match data {
            [CONFLUENT_MAGIC, a, b, c, d, payload @ ..] => Ok(Framed {
                id: Some(SchemaId::Confluent(u32::from_be_bytes([*a, *b, *c, *d]))),
                payload: Cow::Borrowed(payload),
            }),
            [CONFLUENT_MAGIC, ..] => Err(format!(
                "{} bytes are too short for the Confluent wire format's 5-byte header",
                data.len()
            )),
            [] => Err("no bytes: the Confluent wire format has a 5-byte header".to_owned()),
            [magic, ..] => Err(format!(
                "magic byte {magic} is not the Confluent wire format's 0 (not written by a registry-aware serializer?)"
            )),
        },
        WireFormat::Glue => {
            if data.len() < GLUE_HEADER_LEN {
                return Err(format!(
                    "{} bytes are too short for the Glue wire format's 18-byte header",
                    data.len()
                ));
            }
            if data[0] != GLUE_HEADER_VERSION {
                return Err(format!(
                    "header version byte {} is not the Glue wire format's 3",
                    data[0]
                ));
            }
            let mut uuid = [0u8; 16];
            uuid.copy_from_slice(&data[2..GLUE_HEADER_LEN]);
            let id = SchemaId::Glue(uuid);
            match data[1] {
                GLUE_NO_COMPRESSION => Ok(Framed {
                    id: Some(id),
                    payload: Cow::Borrowed(&data[GLUE_HEADER_LEN..]),
                }),
                GLUE_ZLIB_COMPRESSION => Ok(Framed {
                    id: Some(id),
                    payload: Cow::Owned(
                        inflate(&data[GLUE_HEADER_LEN..])
                            .map_err(|e| format!("schema version {id}: {e}"))?,
                    ),
                }),
                other => Err(format!(
                    "schema version {id}: compression byte {other} is not Glue's 0 (none) or 5 (zlib)"
                )),
            }
        }
        WireFormat::Source => match metadata_id()? {
            Some(id) => Ok(Framed {
                id: Some(id),
                payload: Cow::Borrowed(data),
            }),
            None => Err(
                "EventRecordFormat SOURCE: the record has no schema metadata with a schemaId"
                    .to_owned(),
            ),
        },
        WireFormat::Json => Ok(Framed {
            id: metadata_id()?,
            payload: Cow::Borrowed(data),
        }),
    }
}

/// Inflates a zlib-compressed Glue payload, refusing one that inflates past
/// [`GLUE_MAX_INFLATED_LEN`].
fn inflate(compressed: &[u8]) -> Result<Vec<u8>, String> {
    #[cfg(any(feature = "avro", feature = "protobuf", feature = "json-schema"))]
    {
        use std::io::Read;
        let mut out = Vec::with_capacity(compressed.len().saturating_mul(4).min(1 << 20));
        let limit = GLUE_MAX_INFLATED_LEN as u64 + 1;
        flate2::read::ZlibDecoder::new(compressed)
            .take(limit)
            .read_to_end(&mut out)
            .map_err(|e| format!("the zlib-compressed payload does not inflate: {e}"))?;
        if out.len() > GLUE_MAX_INFLATED_LEN {
            return Err(format!(
                "the zlib-compressed payload inflates past {GLUE_MAX_INFLATED_LEN} bytes"
            ));
        }
        Ok(out)
    }
    #[cfg(not(any(feature = "avro", feature = "protobuf", feature = "json-schema")))]
    {
        let _ = compressed;
        Err(
            "zlib-compressed Glue payloads need one of the features avro, protobuf or json-schema"
                .to_owned(),
        )
    }
}

/// Compresses a Glue payload with zlib (the default level).
#[cfg(any(feature = "avro", feature = "protobuf", feature = "json-schema"))]
fn deflate(payload: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
    use std::io::Write;
    let mut encoder = flate2::write::ZlibEncoder::new(out, flate2::Compression::default());
    encoder
        .write_all(payload)
        .and_then(|()| encoder.finish().map(|_| ()))
        .map_err(|e| format!("cannot compress the payload: {e}"))
}

/// Appends the header of `format` for schema `id` to `out` (nothing for
/// [`WireFormat::Source`] and [`WireFormat::Json`], whose bytes have no header).
///
/// # Errors
///
/// When the id is not of the format's kind (a Glue UUID in a Confluent header, or the
/// reverse).
///
/// ```
/// use lambda_streams::serdes::schema::{frame_header, SchemaId, WireFormat};
///
/// let mut out = Vec::new();
/// frame_header(WireFormat::Confluent, &SchemaId::Confluent(258), &mut out).unwrap();
/// assert_eq!(out, [0, 0, 0, 1, 2]);
/// ```
pub fn frame_header(format: WireFormat, id: &SchemaId, out: &mut Vec<u8>) -> Result<(), String> {
    match (format, id) {
        (WireFormat::Confluent, SchemaId::Confluent(id)) => {
            out.push(CONFLUENT_MAGIC);
            out.extend_from_slice(&id.to_be_bytes());
            Ok(())
        }
        (WireFormat::Glue, SchemaId::Glue(uuid)) => {
            out.push(GLUE_HEADER_VERSION);
            out.push(GLUE_NO_COMPRESSION);
            out.extend_from_slice(uuid);
            Ok(())
        }
        (WireFormat::Source | WireFormat::Json, _) => Ok(()),
        (WireFormat::Confluent, id) => Err(format!(
            "schema id {id} is a Glue schema version, not a Confluent registry's integer id"
        )),
        (WireFormat::Glue, id) => Err(format!(
            "schema id {id} is a Confluent registry's id, not a Glue schema version UUID"
        )),
    }
}

/// What every schema'd serde shares: its schema source, subject, formats and caches.
#[cfg_attr(
    not(any(feature = "avro", feature = "protobuf", feature = "json-schema")),
    allow(dead_code)
)]
pub(crate) struct Common {
    pub(crate) source: Arc<dyn SchemaSource>,
    pub(crate) subject: Subject,
    pub(crate) input: WireFormat,
    pub(crate) output: WireFormat,
    /// Whether [`WireFormat::Glue`] output is compressed.
    pub(crate) glue_compression: GlueCompression,
    /// The id of the serde's own schema under its subject, once known.
    pub(crate) output_id: std::sync::OnceLock<SchemaId>,
}

#[cfg_attr(
    not(any(feature = "avro", feature = "protobuf", feature = "json-schema")),
    allow(dead_code)
)]
impl Common {
    pub(crate) fn new(source: Arc<dyn SchemaSource>, subject: Subject) -> Self {
        Common {
            source,
            subject,
            input: WireFormat::Confluent,
            output: WireFormat::Confluent,
            glue_compression: GlueCompression::None,
            output_id: std::sync::OnceLock::new(),
        }
    }

    /// A decoding failure's message: the schema id (when known), the subject, the reason.
    pub(crate) fn error(&self, id: Option<&SchemaId>, reason: impl fmt::Display) -> String {
        match id {
            Some(id) => format!("schema id {id} (subject {}): {reason}", self.subject),
            None => format!("subject {}: {reason}", self.subject),
        }
    }

    /// Splits a non-null key or value (an error for null) into schema id and payload.
    pub(crate) fn unframe<'a>(
        &self,
        data: Option<&'a [u8]>,
        metadata: Option<&SchemaMetadata>,
    ) -> Result<Framed<'a>, String> {
        let data = data.ok_or_else(|| {
            self.error(
                None,
                "got a null (use Nullable to accept nulls and tombstones)",
            )
        })?;
        unframe(self.input, data, metadata).map_err(|e| self.error(None, e))
    }

    /// The id of the serde's own schema `schema` under its subject (asked once).
    pub(crate) fn output_id(&self, schema: &RegisteredSchema) -> Result<SchemaId, String> {
        if let Some(id) = self.output_id.get() {
            return Ok(*id);
        }
        let id = self
            .source
            .id_for(&self.subject, schema, self.output)
            .map_err(|e| e.0)?;
        Ok(*self.output_id.get_or_init(|| id))
    }

    /// The writer's schema of id `id` from the schema source, checked to be of kind
    /// `expected` (the event source's `SCHEMA_NOT_FOUND` otherwise).
    pub(crate) fn writer_schema(
        &self,
        id: &SchemaId,
        expected: SchemaType,
    ) -> Result<RegisteredSchema, String> {
        let found = self
            .source
            .schema_by_id(id, &self.subject)
            .map_err(|e| e.0)?;
        if found.schema_type != expected {
            return Err(self.error(
                Some(id),
                format!(
                    "the registry's schema is {}, not {}",
                    found.schema_type.as_str(),
                    expected.as_str()
                ),
            ));
        }
        Ok(found)
    }
}

/// The part of a schema'd serde that knows its format; the framing around the payload
/// (the wire format's header, the schema id, Glue's compression, the JSON event format's
/// dispatch) is shared by [`decode_framed`] and [`encode_framed`], and the [`Serde`]
/// impl by [`schema_serde!`].
///
/// [`Serde`]: crate::serdes::Serde
#[cfg(any(feature = "avro", feature = "protobuf", feature = "json-schema"))]
pub(crate) trait PayloadCodec<T> {
    /// The serde's shared settings.
    fn common(&self) -> &Common;
    /// The serde's own schema, whose id heads its output.
    fn own_schema(&self) -> &RegisteredSchema;
    /// Decodes `payload` (no header) written with the schema of id `id`.
    fn decode_payload(&self, id: &SchemaId, payload: &[u8]) -> Result<T, SerdeError>;
    /// Decodes a value the event source decoded to JSON (`EventRecordFormat: JSON`); `id`
    /// is the metadata's schema id, if any.
    fn decode_json(&self, id: Option<&SchemaId>, json: &[u8]) -> Result<T, SerdeError>;
    /// Appends the encoded `value` (no header) to `out`.
    fn encode_payload(&self, value: &T, out: &mut Vec<u8>) -> Result<(), SerdeError>;
    /// `value` as JSON text ([`WireFormat::Json`] output).
    fn encode_json(&self, value: &T) -> Result<Vec<u8>, SerdeError>;
}

/// Decodes a schema'd key or value with `codec`: unframes it in the input format (the
/// header's or the metadata's schema id, a Glue payload inflated), then hands the payload
/// to the codec (as JSON text for [`WireFormat::Json`]).
#[cfg(any(feature = "avro", feature = "protobuf", feature = "json-schema"))]
pub(crate) fn decode_framed<T, C: PayloadCodec<T> + ?Sized>(
    codec: &C,
    data: Option<&[u8]>,
    metadata: Option<&SchemaMetadata>,
) -> Result<T, SerdeError> {
    let common = codec.common();
    let framed = common.unframe(data, metadata).map_err(SerdeError)?;
    if common.input == WireFormat::Json {
        return codec.decode_json(framed.id.as_ref(), &framed.payload);
    }
    let Some(id) = framed.id else {
        return Err(SerdeError(common.error(None, "no schema id")));
    };
    codec.decode_payload(&id, &framed.payload)
}

/// Encodes `value` with `codec` in the output format: the header with the serde's own
/// schema id (registered or looked up once), then the payload, compressed for a Glue
/// output told to; JSON text for [`WireFormat::Json`]; the bare payload for
/// [`WireFormat::Source`].
#[cfg(any(feature = "avro", feature = "protobuf", feature = "json-schema"))]
pub(crate) fn encode_framed<T, C: PayloadCodec<T> + ?Sized>(
    codec: &C,
    value: &T,
) -> Result<Vec<u8>, SerdeError> {
    let common = codec.common();
    let subject = &common.subject;
    let mut out = Vec::new();
    match common.output {
        WireFormat::Json => return codec.encode_json(value),
        WireFormat::Source => {}
        WireFormat::Confluent | WireFormat::Glue => {
            let id = common.output_id(codec.own_schema()).map_err(SerdeError)?;
            frame_header(common.output, &id, &mut out)
                .map_err(|e| SerdeError(format!("subject {subject}: {e}")))?;
        }
    }
    if common.output == WireFormat::Glue && common.glue_compression == GlueCompression::Zlib {
        out[1] = GLUE_ZLIB_COMPRESSION;
        let mut payload = Vec::new();
        codec.encode_payload(value, &mut payload)?;
        deflate(&payload, &mut out).map_err(|e| SerdeError(format!("subject {subject}: {e}")))?;
    } else {
        codec.encode_payload(value, &mut out)?;
    }
    Ok(out)
}

/// The [`Serde`](crate::serdes::Serde) impl of a schema'd serde, through its
/// [`PayloadCodec`]: `schema_serde!([T: bounds] Type<T> => T)`.
#[cfg(any(feature = "avro", feature = "protobuf", feature = "json-schema"))]
macro_rules! schema_serde {
    ([$($generics:tt)*] $ty:ty => $value:ty) => {
        impl<$($generics)*> $crate::serdes::Serde<$value> for $ty {
            /// Encodes `value`; `None` if it cannot be (the sinks call
            /// [`try_serialize`](crate::serdes::Serde::try_serialize), which says why).
            fn serialize(&self, value: &$value) -> Option<Vec<u8>> {
                $crate::serdes::schema::encode_framed(self, value).ok()
            }

            fn deserialize(
                &self,
                data: Option<&[u8]>,
            ) -> Result<$value, $crate::serdes::SerdeError> {
                $crate::serdes::schema::decode_framed(self, data, None)
            }

            fn try_serialize(
                &self,
                value: &$value,
            ) -> Result<Option<Vec<u8>>, $crate::serdes::SerdeError> {
                $crate::serdes::schema::encode_framed(self, value).map(Some)
            }

            fn deserialize_with_schema(
                &self,
                data: Option<&[u8]>,
                schema: Option<&$crate::event::SchemaMetadata>,
            ) -> Result<$value, $crate::serdes::SerdeError> {
                $crate::serdes::schema::decode_framed(self, data, schema)
            }
        }
    };
}
#[cfg(any(feature = "avro", feature = "protobuf", feature = "json-schema"))]
pub(crate) use schema_serde;

/// The builder methods every schema'd serde has (`input`, `output`, `glue_compression`),
/// on a type with a `common()` path given as the second argument.
#[cfg(any(feature = "avro", feature = "protobuf", feature = "json-schema"))]
macro_rules! format_builders {
    ([$($generics:tt)*] $ty:ty, $($common:ident).+) => {
        impl<$($generics)*> $ty {
            /// Reads records laid out as `format`.
            pub fn input(mut self, format: $crate::serdes::schema::WireFormat) -> Self {
                self.$($common).+.input = format;
                self
            }

            /// Writes records laid out as `format`.
            pub fn output(mut self, format: $crate::serdes::schema::WireFormat) -> Self {
                self.$($common).+.output = format;
                self
            }

            /// Whether [`WireFormat::Glue`](crate::serdes::schema::WireFormat::Glue)
            /// output is zlib-compressed (compression byte `5`); Glue input is read
            /// compressed or not, whatever this says.
            pub fn glue_compression(
                mut self,
                compression: $crate::serdes::schema::GlueCompression,
            ) -> Self {
                self.$($common).+.glue_compression = compression;
                self
            }
        }
    };
}
#[cfg(any(feature = "avro", feature = "protobuf", feature = "json-schema"))]
pub(crate) use format_builders;

#[cfg(test)]
mod tests;

/// Decodes a payload written with `schema` to JSON, as Lambda's event source does for
/// `EventRecordFormat: JSON` (and to validate a record for `SOURCE`): an Avro value as its
/// JSON form (records as objects, unions as their branch's value), a JSON Schema value
/// validated against its schema, a Protobuf message (the payload starting with Confluent's
/// message indexes, as after the 5-byte header) in Protobuf's JSON mapping, its `.proto`
/// compiled with its imports. The schema's references
/// ([`dependencies`](RegisteredSchema::dependencies)) are used. The local runner plays the
/// event source with it.
///
/// # Errors
///
/// The payload does not decode with the schema, or fails it; a schema of a kind whose
/// feature is off.
///
/// ```
/// # #[cfg(feature = "avro")] {
/// use lambda_streams::serdes::schema::{decode_to_json, RegisteredSchema, SchemaType};
///
/// let schema = RegisteredSchema::new(SchemaType::Avro, r#"{"type":"record","name":"A","fields":[{"name":"n","type":"long"}]}"#);
/// assert_eq!(decode_to_json(&schema, &[0x0e]).unwrap(), serde_json::json!({"n": 7}));
/// assert!(decode_to_json(&schema, &[0x0e, 0]).is_err()); // a byte too many
/// # }
/// ```
pub fn decode_to_json(
    schema: &RegisteredSchema,
    payload: &[u8],
) -> Result<serde_json::Value, String> {
    let _ = payload; // unused when the formats' features are off
    match schema.schema_type {
        #[cfg(feature = "avro")]
        SchemaType::Avro => avro::decode_to_json(schema, payload),
        #[cfg(feature = "json-schema")]
        SchemaType::Json => json_schema::validate_json(&schema.text, payload),
        #[cfg(feature = "protobuf")]
        SchemaType::Protobuf => protobuf::decode_to_json(schema, payload),
        #[allow(unreachable_patterns)]
        other => Err(format!(
            "{} schemas need the framework's feature for them",
            other.as_str()
        )),
    }
}
