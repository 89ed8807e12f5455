//! JSON validated against a JSON Schema: [`JsonSchema<T>`].

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use jsonschema::Validator;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{
    BoundedCache, Common, DEFAULT_CACHE_CAPACITY, PayloadCodec, RegisteredSchema, SchemaError,
    SchemaId, SchemaSource, SchemaType, Subject, format_builders, schema_serde,
};
use crate::serdes::SerdeError;

/// JSON values of a serde type `T`, validated against a JSON Schema, in a registry's wire
/// formats ([module docs](super)).
///
/// A record is validated against its writer's schema (found by id); with
/// [`WireFormat::Json`](super::WireFormat::Json) (the event source decoded and validated it already) against the
/// serde's own. An output value is validated against the serde's own schema before it is
/// written: a value the schema refuses is an error, never a record.
///
/// ```
/// use std::sync::Arc;
/// use lambda_streams::serdes::Serde;
/// use lambda_streams::serdes::schema::{JsonSchema, OfflineSchemas, SchemaId, SchemaType, Side, Subject};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Debug, PartialEq, Serialize, Deserialize)]
/// struct Reading { celsius: f64 }
/// const SCHEMA: &str = r#"{"type":"object","properties":{"celsius":{"type":"number","minimum":-273.15}},"required":["celsius"]}"#;
/// let subject = Subject::topic("readings", Side::Value);
/// let schemas = OfflineSchemas::new().with(SchemaId::Confluent(2), subject.clone(), SchemaType::Json, SCHEMA);
/// let serde = JsonSchema::<Reading>::new(SCHEMA, Arc::new(schemas), subject)?;
/// let bytes = serde.try_serialize(&Reading { celsius: 21.5 })?.unwrap();
/// assert_eq!(bytes, b"\0\0\0\0\x02{\"celsius\":21.5}");
/// assert!(serde.try_serialize(&Reading { celsius: -300.0 }).is_err());
/// let err = serde.deserialize(Some(b"\0\0\0\0\x02{\"celsius\":\"warm\"}")).unwrap_err();
/// assert!(err.0.starts_with("schema id 2 (subject readings-value): invalid at /celsius"), "{err}");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct JsonSchema<T> {
    common: Common,
    registered: RegisteredSchema,
    own: Arc<Validator>,
    validators: BoundedCache<SchemaId, Arc<Validator>>,
    types: PhantomData<fn() -> T>,
}

impl<T> fmt::Debug for JsonSchema<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "JsonSchema<{}>({})",
            std::any::type_name::<T>(),
            self.common.subject
        )
    }
}

fn compile(text: &str) -> Result<Validator, String> {
    let schema: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("the schema is not JSON: {e}"))?;
    jsonschema::validator_for(&schema).map_err(|e| format!("invalid JSON Schema: {e}"))
}

impl<T> JsonSchema<T> {
    /// The serde of `T` with the JSON Schema `schema` (its own, for output and for
    /// [`WireFormat::Json`](super::WireFormat::Json) input), finding writer schemas in `source`, under `subject`;
    /// Confluent wire format in and out until told otherwise.
    ///
    /// # Errors
    ///
    /// `schema` is not a valid JSON Schema (or needs a remote `$ref`, which is not fetched).
    pub fn new(
        schema: &str,
        source: Arc<dyn SchemaSource>,
        subject: Subject,
    ) -> Result<Self, SchemaError> {
        let own = compile(schema).map_err(|e| SchemaError(format!("subject {subject}: {e}")))?;
        Ok(JsonSchema {
            common: Common::new(source, subject),
            registered: RegisteredSchema::new(SchemaType::Json, schema),
            own: Arc::new(own),
            validators: BoundedCache::new(DEFAULT_CACHE_CAPACITY),
            types: PhantomData,
        })
    }

    fn validator(&self, id: &SchemaId) -> Result<Arc<Validator>, String> {
        if let Some(v) = self.validators.get(id) {
            return Ok(v);
        }
        let found = self.common.writer_schema(id, SchemaType::Json)?;
        let v = Arc::new(compile(&found.text).map_err(|e| self.common.error(Some(id), e))?);
        self.validators.insert(*id, v.clone());
        Ok(v)
    }
}

/// The first reason `value` fails `validator`, with the place (a JSON pointer).
fn invalid(validator: &Validator, value: &serde_json::Value) -> Option<String> {
    validator.validate(value).err().map(|e| {
        let at = e.instance_path().to_string();
        let at = if at.is_empty() { "/".to_owned() } else { at };
        format!("invalid at {at}: {e}")
    })
}

format_builders!([T] JsonSchema<T>, common);

impl<T: Serialize + DeserializeOwned + 'static> JsonSchema<T> {
    /// Parses, validates against `validator` and converts JSON text written with schema
    /// `id` (if known).
    fn read(
        &self,
        validator: &Validator,
        id: Option<&SchemaId>,
        json: &[u8],
    ) -> Result<T, SerdeError> {
        let common = &self.common;
        let json: serde_json::Value = serde_json::from_slice(json)
            .map_err(|e| SerdeError(common.error(id, format!("invalid JSON: {e}"))))?;
        if let Some(reason) = invalid(validator, &json) {
            return Err(SerdeError(common.error(id, reason)));
        }
        serde_json::from_value(json).map_err(|e| {
            SerdeError(common.error(
                id,
                format!("the JSON does not fit {}: {e}", std::any::type_name::<T>()),
            ))
        })
    }

    /// `value` as JSON, validated against the serde's own schema.
    fn to_json(&self, value: &T) -> Result<serde_json::Value, SerdeError> {
        let subject = &self.common.subject;
        let json = serde_json::to_value(value)
            .map_err(|e| SerdeError(format!("subject {subject}: cannot encode as JSON: {e}")))?;
        if let Some(reason) = invalid(&self.own, &json) {
            return Err(SerdeError(format!(
                "subject {subject}: the value does not match the JSON Schema: {reason}"
            )));
        }
        Ok(json)
    }
}

impl<T: Serialize + DeserializeOwned + 'static> PayloadCodec<T> for JsonSchema<T> {
    fn common(&self) -> &Common {
        &self.common
    }

    fn own_schema(&self) -> &RegisteredSchema {
        &self.registered
    }

    fn decode_payload(&self, id: &SchemaId, payload: &[u8]) -> Result<T, SerdeError> {
        let validator = self.validator(id).map_err(SerdeError)?;
        self.read(&validator, Some(id), payload)
    }

    /// The event source validated the record already; it is validated against the
    /// serde's own schema.
    fn decode_json(&self, id: Option<&SchemaId>, json: &[u8]) -> Result<T, SerdeError> {
        self.read(&self.own, id, json)
    }

    fn encode_payload(&self, value: &T, out: &mut Vec<u8>) -> Result<(), SerdeError> {
        let json = self.to_json(value)?;
        serde_json::to_writer(out, &json)
            .map_err(|e| SerdeError(format!("subject {}: {e}", self.common.subject)))
    }

    fn encode_json(&self, value: &T) -> Result<Vec<u8>, SerdeError> {
        let mut out = Vec::new();
        self.encode_payload(value, &mut out)?;
        Ok(out)
    }
}

schema_serde!([T: Serialize + DeserializeOwned + 'static] JsonSchema<T> => T);

/// [`super::decode_to_json`] for JSON Schema: the payload parsed and validated.
pub(super) fn validate_json(schema: &str, payload: &[u8]) -> Result<serde_json::Value, String> {
    let validator = compile(schema)?;
    let json: serde_json::Value =
        serde_json::from_slice(payload).map_err(|e| format!("invalid JSON: {e}"))?;
    match invalid(&validator, &json) {
        Some(reason) => Err(reason),
        None => Ok(json),
    }
}
