//! Avro values: [`Avro<T>`] for serde-derived types, [`AvroGeneric`] for `apache_avro`'s
//! generic [`Value`].

mod direct;

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use apache_avro::Schema;
use apache_avro::reader::datum::GenericDatumReader;
use apache_avro::schema::ResolvedSchema;
use apache_avro::types::Value;
use apache_avro::writer::datum::GenericDatumWriter;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{
    BoundedCache, Common, DEFAULT_CACHE_CAPACITY, PayloadCodec, RegisteredSchema, SchemaError,
    SchemaId, SchemaSource, SchemaType, Subject, format_builders, schema_serde,
};
use crate::serdes::SerdeError;

/// The most `apache_avro` may allocate for one string, byte array or collection while
/// decoding (see [`Core::new`]).
const MAX_ALLOCATION_BYTES: usize = 8 << 20;

/// A writer's schema, parsed once per id, and whether it is the reader's own (then no
/// resolution is needed).
struct Writer {
    schema: Schema,
    /// The named types the schema refers to (its references), for resolution.
    dependencies: Vec<Schema>,
    same_as_reader: bool,
    /// The schema as the direct read walks it ([`direct`]), when neither schema has
    /// references, both hold only the types that read covers, and the writer's is the
    /// reader's or differs from it only by fields the reader lacks and optional fields the
    /// writer lacks ([`direct::Node::projection`]).
    direct: Option<direct::Node>,
}

/// A schema with the named types it refers to, dependencies first, as `apache_avro`
/// resolves references.
fn with_named<'a>(schema: &'a Schema, dependencies: &'a [Schema]) -> Vec<&'a Schema> {
    dependencies.iter().chain(std::iter::once(schema)).collect()
}

/// Parses an Avro schema with the named types of its references.
fn parse_with_dependencies(schema: &RegisteredSchema) -> Result<(Schema, Vec<Schema>), String> {
    if schema.dependencies.is_empty() {
        return Schema::parse_str(&schema.text)
            .map(|s| (s, Vec::new()))
            .map_err(|e| e.to_string());
    }
    Schema::parse_str_with_list(
        &schema.text,
        schema.dependencies.iter().map(|(_, text)| &**text),
    )
    .map_err(|e| e.to_string())
}

/// The Avro machinery [`Avro`] and [`AvroGeneric`] share.
struct Core {
    common: Common,
    /// The reader's (and writer's, for output) schema.
    schema: Schema,
    /// The named types the reader's schema refers to.
    dependencies: Vec<Schema>,
    registered: RegisteredSchema,
    canonical: String,
    writers: BoundedCache<SchemaId, Arc<Writer>>,
    /// The serde's own schema as the direct write walks it ([`direct`]), when it has no
    /// references and holds only the types that write covers.
    direct: Option<direct::Node>,
}

/// What `apache_avro`'s serializer and deserializer tell the types that ask whether the
/// format is human-readable: its process-wide setting (this initialises it to its default
/// if nothing set it, as its own first use would).
fn human_readable() -> bool {
    apache_avro::util::set_serde_human_readable(apache_avro::util::DEFAULT_SERDE_HUMAN_READABLE)
}

impl Core {
    fn new(
        schema: RegisteredSchema,
        source: Arc<dyn SchemaSource>,
        subject: Subject,
    ) -> Result<Self, SchemaError> {
        // A length read from a record is allocated before its bytes are read: no single
        // value of a Lambda event (6 MB at most) needs more than this, so a corrupt length
        // is an error instead of an allocation the function cannot survive. The setting is
        // the process's, set once.
        apache_avro::util::max_allocation_bytes(MAX_ALLOCATION_BYTES);
        let (parsed, dependencies) = parse_with_dependencies(&schema)
            .map_err(|e| SchemaError(format!("subject {subject}: invalid Avro schema: {e}")))?;
        let direct = dependencies
            .is_empty()
            .then(|| direct::Node::of(&parsed))
            .flatten();
        Ok(Core {
            direct,
            canonical: parsed.canonical_form(),
            schema: parsed,
            dependencies,
            registered: schema,
            common: Common::new(source, subject),
            writers: BoundedCache::new(DEFAULT_CACHE_CAPACITY),
        })
    }

    /// The writer's schema of id `id`, from the cache or the schema source.
    fn writer(&self, id: &SchemaId) -> Result<Arc<Writer>, String> {
        if let Some(writer) = self.writers.get(id) {
            return Ok(writer);
        }
        let found = self.common.writer_schema(id, SchemaType::Avro)?;
        let (schema, dependencies) = parse_with_dependencies(&found).map_err(|e| {
            self.common.error(
                Some(id),
                format!("the writer's schema is not valid Avro: {e}"),
            )
        })?;
        let same_as_reader = schema.canonical_form() == self.canonical;
        let direct = if !dependencies.is_empty() || !self.dependencies.is_empty() {
            None
        } else if same_as_reader {
            direct::Node::of(&schema)
        } else {
            direct::Node::projection(&schema, &self.schema)
        };
        let writer = Arc::new(Writer {
            same_as_reader,
            direct,
            schema,
            dependencies,
        });
        self.writers.insert(*id, writer.clone());
        Ok(writer)
    }

    /// Decodes a payload written with schema `id` into a generic value in the reader's
    /// schema.
    fn decode(&self, id: &SchemaId, payload: &[u8]) -> Result<Value, SerdeError> {
        let writer = self.writer(id).map_err(SerdeError)?;
        let resolve = !writer.same_as_reader;
        let unresolvable = |e: apache_avro::Error| {
            SerdeError(self.common.error(
                Some(id),
                format!("the writer's schema does not resolve to the reader's: {e}"),
            ))
        };
        // References (named types of other schemas) need the names resolved up front.
        let writer_names = (!writer.dependencies.is_empty())
            .then(|| {
                ResolvedSchema::new_with_schemata(with_named(&writer.schema, &writer.dependencies))
            })
            .transpose()
            .map_err(unresolvable)?;
        let reader_names = (resolve && !self.dependencies.is_empty())
            .then(|| {
                ResolvedSchema::new_with_schemata(with_named(&self.schema, &self.dependencies))
            })
            .transpose()
            .map_err(unresolvable)?;
        let reader = GenericDatumReader::builder(&writer.schema)
            .maybe_reader_schema(resolve.then_some(&self.schema))
            .maybe_resolved_writer_schemata(writer_names)
            .maybe_resolved_reader_schemata(reader_names)
            .build()
            .map_err(unresolvable)?;
        let mut rest = payload;
        let value = reader.read_value(&mut rest).map_err(|e| {
            SerdeError(self.common.error(
                Some(id),
                format!("the bytes are not Avro of the writer's schema: {e}"),
            ))
        })?;
        if !rest.is_empty() {
            return Err(SerdeError(self.common.error(
                Some(id),
                format!("{} bytes left after the Avro value", rest.len()),
            )));
        }
        // `apache_avro` reads a string or bytes cut short by the end of the input as a
        // null instead of failing: a value that does not match the schema it was read with
        // is such a truncated record.
        let (expected, named) = if writer.same_as_reader {
            (&writer.schema, &writer.dependencies)
        } else {
            (&self.schema, &self.dependencies)
        };
        // With references, the names resolved above: `validate_schemata` cannot fail to
        // resolve them here.
        let valid = if named.is_empty() {
            value.validate(expected)
        } else {
            value.validate_schemata(&with_named(expected, named))
        };
        if !valid {
            return Err(SerdeError(self.common.error(
                Some(id),
                "the bytes are not Avro of the writer's schema (truncated)",
            )));
        }
        Ok(value)
    }

    /// Appends a generic value of the serde's schema, encoded, to `out`.
    fn encode(&self, value: &Value, out: &mut Vec<u8>) -> Result<(), SerdeError> {
        let subject = &self.common.subject;
        let names = (!self.dependencies.is_empty())
            .then(|| {
                ResolvedSchema::new_with_schemata(with_named(&self.schema, &self.dependencies))
            })
            .transpose()
            .map_err(|e| SerdeError(format!("subject {subject}: {e}")))?;
        let writer = GenericDatumWriter::builder(&self.schema)
            .maybe_resolved_schemata(names)
            .build()
            .map_err(|e| SerdeError(format!("subject {subject}: {e}")))?;
        writer.write_value_ref(out, value).map_err(|e| {
            SerdeError(format!(
                "subject {}: the value does not match the Avro schema: {e}",
                self.common.subject
            ))
        })?;
        Ok(())
    }

    /// A generic value resolved to the serde's schema.
    fn resolve(&self, value: Value) -> Result<Value, SerdeError> {
        let resolved = if self.dependencies.is_empty() {
            value.resolve(&self.schema)
        } else {
            value.resolve_schemata(&self.schema, with_named(&self.schema, &self.dependencies))
        };
        resolved.map_err(|e| {
            SerdeError(format!(
                "subject {}: the value does not match the Avro schema: {e}",
                self.common.subject
            ))
        })
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
/// A writer's schema with references (named types defined in other subjects) is parsed
/// with the referenced types; so is the serde's own, given with
/// [`with_schema`](Self::with_schema).
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
        Self::with_schema(
            RegisteredSchema::new(SchemaType::Avro, schema),
            source,
            subject,
        )
    }

    /// As [`new`](Self::new), with a schema that may refer to named types of other
    /// schemas ([`RegisteredSchema::dependencies`]).
    ///
    /// # Errors
    ///
    /// `schema` is not a valid Avro schema (with its dependencies).
    pub fn with_schema(
        schema: RegisteredSchema,
        source: Arc<dyn SchemaSource>,
        subject: Subject,
    ) -> Result<Self, SchemaError> {
        Ok(Avro {
            core: Core::new(schema, source, subject)?,
            types: PhantomData,
        })
    }

    /// The serde's own schema.
    pub fn schema(&self) -> &Schema {
        &self.core.schema
    }
}

format_builders!([T] Avro<T>, core.common);

impl<T: Serialize + DeserializeOwned + 'static> PayloadCodec<T> for Avro<T> {
    fn common(&self) -> &Common {
        &self.core.common
    }

    fn own_schema(&self) -> &RegisteredSchema {
        &self.core.registered
    }

    fn decode_payload(&self, id: &SchemaId, payload: &[u8]) -> Result<T, SerdeError> {
        // The direct read first; where it gives up, the generic read decides.
        let writer = self.core.writer(id).map_err(SerdeError)?;
        if let Some(node) = &writer.direct {
            let max_bytes = apache_avro::util::max_allocation_bytes(MAX_ALLOCATION_BYTES);
            if let Some(value) = direct::read(node, payload, max_bytes, human_readable()) {
                return Ok(value);
            }
        }
        let value = self.core.decode(id, payload)?;
        apache_avro::from_value::<T>(&value).map_err(|e| {
            SerdeError(self.core.common.error(
                None,
                format!(
                    "the Avro value does not fit {}: {e}",
                    std::any::type_name::<T>()
                ),
            ))
        })
    }

    fn decode_json(&self, id: Option<&SchemaId>, json: &[u8]) -> Result<T, SerdeError> {
        serde_json::from_slice(json)
            .map_err(|e| SerdeError(self.core.common.error(id, format!("invalid JSON: {e}"))))
    }

    fn encode_payload(&self, value: &T, out: &mut Vec<u8>) -> Result<(), SerdeError> {
        // The direct write first; where it gives up, the generic write decides.
        if let Some(node) = &self.core.direct
            && direct::write(node, value, out, human_readable())
        {
            return Ok(());
        }
        let generic = apache_avro::to_value(value).map_err(|e| {
            SerdeError(format!(
                "subject {}: the value does not match the Avro schema: {e}",
                self.core.common.subject
            ))
        })?;
        self.core.encode(&self.core.resolve(generic)?, out)
    }

    fn encode_json(&self, value: &T) -> Result<Vec<u8>, SerdeError> {
        serde_json::to_vec(value).map_err(|e| {
            SerdeError(format!(
                "subject {}: cannot encode as JSON: {e}",
                self.core.common.subject
            ))
        })
    }
}

schema_serde!([T: Serialize + DeserializeOwned + 'static] Avro<T> => T);

/// Avro values as `apache_avro`'s generic [`Value`], in the reader's schema, for code that
/// does not map records to Rust types (a pass-through, a field projection). Otherwise as
/// [`Avro`]; [`WireFormat::Json`](super::WireFormat::Json) is not read or written (use
/// `Avro<serde_json::Value>`).
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
        Self::with_schema(
            RegisteredSchema::new(SchemaType::Avro, schema),
            source,
            subject,
        )
    }

    /// As [`Avro::with_schema`].
    ///
    /// # Errors
    ///
    /// `schema` is not a valid Avro schema (with its dependencies).
    pub fn with_schema(
        schema: RegisteredSchema,
        source: Arc<dyn SchemaSource>,
        subject: Subject,
    ) -> Result<Self, SchemaError> {
        Ok(AvroGeneric {
            core: Core::new(schema, source, subject)?,
        })
    }
}

format_builders!([] AvroGeneric, core.common);

impl PayloadCodec<Value> for AvroGeneric {
    fn common(&self) -> &Common {
        &self.core.common
    }

    fn own_schema(&self) -> &RegisteredSchema {
        &self.core.registered
    }

    fn decode_payload(&self, id: &SchemaId, payload: &[u8]) -> Result<Value, SerdeError> {
        self.core.decode(id, payload)
    }

    fn decode_json(&self, _: Option<&SchemaId>, _: &[u8]) -> Result<Value, SerdeError> {
        Err(SerdeError(self.core.common.error(
            None,
            "AvroGeneric does not read EventRecordFormat JSON (use Avro<serde_json::Value>)",
        )))
    }

    fn encode_payload(&self, value: &Value, out: &mut Vec<u8>) -> Result<(), SerdeError> {
        self.core.encode(&self.core.resolve(value.clone())?, out)
    }

    fn encode_json(&self, _: &Value) -> Result<Vec<u8>, SerdeError> {
        Err(SerdeError(format!(
            "subject {}: AvroGeneric does not write JSON (use Avro<serde_json::Value>)",
            self.core.common.subject
        )))
    }
}

schema_serde!([] AvroGeneric => Value);

/// [`super::decode_to_json`] for Avro.
pub(super) fn decode_to_json(
    schema: &RegisteredSchema,
    payload: &[u8],
) -> Result<serde_json::Value, String> {
    apache_avro::util::max_allocation_bytes(MAX_ALLOCATION_BYTES);
    let (schema, dependencies) =
        parse_with_dependencies(schema).map_err(|e| format!("invalid Avro schema: {e}"))?;
    let names = (!dependencies.is_empty())
        .then(|| ResolvedSchema::new_with_schemata(with_named(&schema, &dependencies)))
        .transpose()
        .map_err(|e| e.to_string())?;
    let reader = GenericDatumReader::builder(&schema)
        .maybe_resolved_writer_schemata(names)
        .build()
        .map_err(|e| e.to_string())?;
    let mut rest = payload;
    let value = reader
        .read_value(&mut rest)
        .map_err(|e| format!("the bytes are not Avro of the schema: {e}"))?;
    if !rest.is_empty() {
        return Err(format!("{} bytes left after the Avro value", rest.len()));
    }
    let valid = if dependencies.is_empty() {
        value.validate(&schema)
    } else {
        value.validate_schemata(&with_named(&schema, &dependencies))
    };
    if !valid {
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
