//! Avro values: [`Avro<T>`] for serde-derived types, [`AvroGeneric`] for `apache_avro`'s
//! generic [`Value`].

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use apache_avro::Schema;
use apache_avro::reader::datum::GenericDatumReader;
use apache_avro::types::Value;
use apache_avro::writer::datum::GenericDatumWriter;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{
    BoundedCache, Common, DEFAULT_CACHE_CAPACITY, RegisteredSchema, SchemaError, SchemaId,
    SchemaSource, SchemaType, Subject, WireFormat,
};
use crate::event::SchemaMetadata;
use crate::serdes::{Serde, SerdeError};

/// The most `apache_avro` may allocate for one string, byte array or collection while
/// decoding (see [`Core::new`]).
const MAX_ALLOCATION_BYTES: usize = 8 << 20;

/// A writer's schema, parsed once per id, and whether it is the reader's own (then no
/// resolution is needed).
struct Writer {
    schema: Schema,
    same_as_reader: bool,
}

/// The Avro machinery [`Avro`] and [`AvroGeneric`] share.
struct Core {
    common: Common,
    /// The reader's (and writer's, for output) schema.
    schema: Schema,
    registered: RegisteredSchema,
    canonical: String,
    writers: BoundedCache<SchemaId, Arc<Writer>>,
}

impl Core {
    fn new(
        schema: &str,
        source: Arc<dyn SchemaSource>,
        subject: Subject,
    ) -> Result<Self, SchemaError> {
        // A length read from a record is allocated before its bytes are read: no single
        // value of a Lambda event (6 MB at most) needs more than this, so a corrupt length
        // is an error instead of an allocation the function cannot survive. The setting is
        // the process's, set once.
        apache_avro::util::max_allocation_bytes(MAX_ALLOCATION_BYTES);
        let parsed = Schema::parse_str(schema)
            .map_err(|e| SchemaError(format!("subject {subject}: invalid Avro schema: {e}")))?;
        Ok(Core {
            canonical: parsed.canonical_form(),
            schema: parsed,
            registered: RegisteredSchema::new(SchemaType::Avro, schema),
            common: Common::new(source, subject),
            writers: BoundedCache::new(DEFAULT_CACHE_CAPACITY),
        })
    }

    /// The writer's schema of id `id`, from the cache or the schema source.
    fn writer(&self, id: &SchemaId) -> Result<Arc<Writer>, String> {
        if let Some(writer) = self.writers.get(id) {
            return Ok(writer);
        }
        let found = self
            .common
            .source
            .schema_by_id(id, &self.common.subject)
            .map_err(|e| e.0)?;
        if found.schema_type != SchemaType::Avro {
            return Err(self.common.error(
                Some(id),
                format!(
                    "the registry's schema is {}, not AVRO",
                    found.schema_type.as_str()
                ),
            ));
        }
        let schema = Schema::parse_str(&found.text).map_err(|e| {
            self.common.error(
                Some(id),
                format!("the writer's schema is not valid Avro: {e}"),
            )
        })?;
        let writer = Arc::new(Writer {
            same_as_reader: schema.canonical_form() == self.canonical,
            schema,
        });
        self.writers.insert(*id, writer.clone());
        Ok(writer)
    }

    /// Decodes a framed value into a generic value in the reader's schema.
    fn decode(
        &self,
        data: Option<&[u8]>,
        metadata: Option<&SchemaMetadata>,
    ) -> Result<Value, SerdeError> {
        let framed = self.common.unframe(data, metadata).map_err(SerdeError)?;
        let Some(id) = framed.id else {
            return Err(SerdeError(self.common.error(None, "no schema id")));
        };
        let writer = self.writer(&id).map_err(SerdeError)?;
        let reader = GenericDatumReader::builder(&writer.schema)
            .maybe_reader_schema((!writer.same_as_reader).then_some(&self.schema))
            .build()
            .map_err(|e| {
                SerdeError(self.common.error(
                    Some(&id),
                    format!("the writer's schema does not resolve to the reader's: {e}"),
                ))
            })?;
        let mut payload = framed.payload;
        let value = reader.read_value(&mut payload).map_err(|e| {
            SerdeError(self.common.error(
                Some(&id),
                format!("the bytes are not Avro of the writer's schema: {e}"),
            ))
        })?;
        if !payload.is_empty() {
            return Err(SerdeError(self.common.error(
                Some(&id),
                format!("{} bytes left after the Avro value", payload.len()),
            )));
        }
        // `apache_avro` reads a string or bytes cut short by the end of the input as a
        // null instead of failing: a value that does not match the schema it was read with
        // is such a truncated record.
        let expected = if writer.same_as_reader {
            &writer.schema
        } else {
            &self.schema
        };
        if !value.validate(expected) {
            return Err(SerdeError(self.common.error(
                Some(&id),
                "the bytes are not Avro of the writer's schema (truncated)",
            )));
        }
        Ok(value)
    }

    /// Encodes a generic value of the serde's schema with the output format's header.
    fn encode(&self, value: &Value) -> Result<Vec<u8>, SerdeError> {
        let mut out = self
            .common
            .output_header(&self.registered)
            .map_err(SerdeError)?;
        let writer = GenericDatumWriter::builder(&self.schema)
            .build()
            .map_err(|e| SerdeError(format!("subject {}: {e}", self.common.subject)))?;
        writer.write_value_ref(&mut out, value).map_err(|e| {
            SerdeError(format!(
                "subject {}: the value does not match the Avro schema: {e}",
                self.common.subject
            ))
        })?;
        Ok(out)
    }
}

/// Avro values of a serde-derived type `T`, in a registry's wire formats
/// ([module docs](super)).
///
/// Decoding reads the writer's schema by id (from the header, or the record's schema
/// metadata), resolves it to the serde's own schema (Avro's schema evolution: a field the
/// writer lacks takes the reader's default, a field the reader lacks is skipped, promotions
/// such as `int` to `long` apply) and turns the value into `T`. Encoding writes `T` with
/// the serde's own schema, whose id is registered or looked up once under the subject.
///
/// ```
/// use std::sync::Arc;
/// use lambda_streams::serdes::Serde;
/// use lambda_streams::serdes::schema::{Avro, OfflineSchemas, SchemaId, SchemaType, Side, Subject};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
/// struct Order { id: i64, amount: f64 }
///
/// const ORDER: &str = r#"{"type":"record","name":"Order","fields":[
///     {"name":"id","type":"long"},{"name":"amount","type":"double"}]}"#;
/// let subject = Subject::topic("orders", Side::Value);
/// // Offline mode: the schema and its id compiled in, no registry call.
/// let schemas = OfflineSchemas::new().with(SchemaId::Confluent(1), subject.clone(), SchemaType::Avro, ORDER);
/// let serde = Avro::<Order>::new(ORDER, Arc::new(schemas), subject)?;
///
/// let order = Order { id: 7, amount: 2.5 };
/// let bytes = serde.try_serialize(&order)?.unwrap();
/// assert_eq!(&bytes[..5], &[0, 0, 0, 0, 1]); // Confluent: magic byte, schema id 1
/// assert_eq!(serde.deserialize(Some(&bytes))?, order);
/// let err = serde.deserialize(Some(&[0, 0, 0, 0, 9, 14])).unwrap_err();
/// assert!(err.0.starts_with("schema id 9 (subject orders-value)"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Avro<T> {
    core: Core,
    types: PhantomData<fn() -> T>,
}

impl<T> fmt::Debug for Avro<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Avro<{}>({})",
            std::any::type_name::<T>(),
            self.core.common.subject
        )
    }
}

impl<T> Avro<T> {
    /// The Avro serde of `T` with `schema` (Avro's JSON form) as the reader's and the
    /// writer's schema, finding schemas in `source`, under `subject`. It reads and writes
    /// the Confluent wire format until told otherwise ([`input`](Self::input),
    /// [`output`](Self::output)).
    ///
    /// # Errors
    ///
    /// `schema` is not a valid Avro schema.
    pub fn new(
        schema: &str,
        source: Arc<dyn SchemaSource>,
        subject: Subject,
    ) -> Result<Self, SchemaError> {
        Ok(Avro {
            core: Core::new(schema, source, subject)?,
            types: PhantomData,
        })
    }

    /// Reads records laid out as `format`.
    pub fn input(mut self, format: WireFormat) -> Self {
        self.core.common.input = format;
        self
    }

    /// Writes records laid out as `format`.
    pub fn output(mut self, format: WireFormat) -> Self {
        self.core.common.output = format;
        self
    }

    /// The serde's own schema.
    pub fn schema(&self) -> &Schema {
        &self.core.schema
    }
}

impl<T: Serialize + DeserializeOwned + 'static> Avro<T> {
    fn encode(&self, value: &T) -> Result<Vec<u8>, SerdeError> {
        let subject = &self.core.common.subject;
        if self.core.common.output == WireFormat::Json {
            return serde_json::to_vec(value)
                .map_err(|e| SerdeError(format!("subject {subject}: cannot encode as JSON: {e}")));
        }
        let generic = apache_avro::to_value(value)
            .and_then(|v| v.resolve(&self.core.schema))
            .map_err(|e| {
                SerdeError(format!(
                    "subject {subject}: the value does not match the Avro schema: {e}"
                ))
            })?;
        self.core.encode(&generic)
    }
}

impl<T: Serialize + DeserializeOwned + 'static> Serde<T> for Avro<T> {
    /// Encodes `value`; `None` if it cannot be (the sinks call
    /// [`try_serialize`](Serde::try_serialize), which says why).
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
        let common = &self.core.common;
        if common.input == WireFormat::Json {
            let framed = common.unframe(data, schema).map_err(SerdeError)?;
            return serde_json::from_slice(framed.payload).map_err(|e| {
                SerdeError(common.error(framed.id.as_ref(), format!("invalid JSON: {e}")))
            });
        }
        let value = self.core.decode(data, schema)?;
        apache_avro::from_value::<T>(&value).map_err(|e| {
            SerdeError(common.error(
                None,
                format!(
                    "the Avro value does not fit {}: {e}",
                    std::any::type_name::<T>()
                ),
            ))
        })
    }
}

/// Avro values as `apache_avro`'s generic [`Value`], in the reader's schema, for code that
/// does not map records to Rust types (a pass-through, a field projection). Otherwise as
/// [`Avro`]; [`WireFormat::Json`] is not read or written (use `Avro<serde_json::Value>`).
pub struct AvroGeneric {
    core: Core,
}

impl fmt::Debug for AvroGeneric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AvroGeneric({})", self.core.common.subject)
    }
}

impl AvroGeneric {
    /// As [`Avro::new`].
    ///
    /// # Errors
    ///
    /// `schema` is not a valid Avro schema.
    pub fn new(
        schema: &str,
        source: Arc<dyn SchemaSource>,
        subject: Subject,
    ) -> Result<Self, SchemaError> {
        Ok(AvroGeneric {
            core: Core::new(schema, source, subject)?,
        })
    }

    /// Reads records laid out as `format`.
    pub fn input(mut self, format: WireFormat) -> Self {
        self.core.common.input = format;
        self
    }

    /// Writes records laid out as `format`.
    pub fn output(mut self, format: WireFormat) -> Self {
        self.core.common.output = format;
        self
    }

    fn encode(&self, value: &Value) -> Result<Vec<u8>, SerdeError> {
        if self.core.common.output == WireFormat::Json {
            return Err(SerdeError(format!(
                "subject {}: AvroGeneric does not write JSON (use Avro<serde_json::Value>)",
                self.core.common.subject
            )));
        }
        let resolved = value.clone().resolve(&self.core.schema).map_err(|e| {
            SerdeError(format!(
                "subject {}: the value does not match the Avro schema: {e}",
                self.core.common.subject
            ))
        })?;
        self.core.encode(&resolved)
    }
}

impl Serde<Value> for AvroGeneric {
    fn serialize(&self, value: &Value) -> Option<Vec<u8>> {
        self.encode(value).ok()
    }

    fn deserialize(&self, data: Option<&[u8]>) -> Result<Value, SerdeError> {
        self.deserialize_with_schema(data, None)
    }

    fn try_serialize(&self, value: &Value) -> Result<Option<Vec<u8>>, SerdeError> {
        self.encode(value).map(Some)
    }

    fn deserialize_with_schema(
        &self,
        data: Option<&[u8]>,
        schema: Option<&SchemaMetadata>,
    ) -> Result<Value, SerdeError> {
        if self.core.common.input == WireFormat::Json {
            return Err(SerdeError(self.core.common.error(
                None,
                "AvroGeneric does not read EventRecordFormat JSON (use Avro<serde_json::Value>)",
            )));
        }
        self.core.decode(data, schema)
    }
}

/// [`super::decode_to_json`] for Avro.
pub(super) fn decode_to_json(schema: &str, payload: &[u8]) -> Result<serde_json::Value, String> {
    apache_avro::util::max_allocation_bytes(MAX_ALLOCATION_BYTES);
    let schema = Schema::parse_str(schema).map_err(|e| format!("invalid Avro schema: {e}"))?;
    let reader = GenericDatumReader::builder(&schema)
        .build()
        .map_err(|e| e.to_string())?;
    let mut rest = payload;
    let value = reader
        .read_value(&mut rest)
        .map_err(|e| format!("the bytes are not Avro of the schema: {e}"))?;
    if !rest.is_empty() {
        return Err(format!("{} bytes left after the Avro value", rest.len()));
    }
    if !value.validate(&schema) {
        return Err("the bytes are not Avro of the schema (truncated)".to_owned());
    }
    json_of(value)
}

/// The JSON form of an Avro value: a union is its branch's value.
fn json_of(value: Value) -> Result<serde_json::Value, String> {
    Ok(match value {
        Value::Union(_, inner) => json_of(*inner)?,
        Value::Record(fields) => serde_json::Value::Object(
            fields
                .into_iter()
                .map(|(k, v)| Ok((k, json_of(v)?)))
                .collect::<Result<_, String>>()?,
        ),
        Value::Array(items) => {
            serde_json::Value::Array(items.into_iter().map(json_of).collect::<Result<_, _>>()?)
        }
        Value::Map(entries) => serde_json::Value::Object(
            entries
                .into_iter()
                .map(|(k, v)| Ok((k, json_of(v)?)))
                .collect::<Result<_, String>>()?,
        ),
        other => serde_json::Value::try_from(other).map_err(|e| e.to_string())?,
    })
}
