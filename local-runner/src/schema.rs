//! The event source's schema validation (`SchemaRegistryConfig`): each consumed record's
//! key and/or value is checked against a Confluent-compatible registry and handed over as
//! Lambda does, with `EventRecordFormat` `SOURCE` (the bytes without the 5-byte wire-format
//! prefix) or `JSON` (the decoded value as JSON text), and `keySchemaMetadata` /
//! `valueSchemaMetadata` (`{"dataFormat", "schemaId"}`) on the record.
//!
//! A record that fails is not delivered: it goes to the on-failure destination with
//! `SCHEMA_NOT_FOUND` (the registry does not know its schema id) or
//! `DESERIALIZATION_ERROR` (not in the wire format, or its bytes do not decode with the
//! schema), and is done (committed), as the event source does. A registry that cannot be
//! reached stops the runner with an error instead (nothing is given up for it).
//!
//! Protobuf records are decoded with their `.proto` (compiled with its imports, the
//! schema's references) and handed over as `SOURCE` (the message indexes and the message)
//! or as `JSON` (Protobuf's JSON mapping: lowerCamelCase names, 64-bit integers as strings).
//! Schema references of Avro and Protobuf schemas are fetched from the registry.

use lambda_streams::event::{Bytes, Record, SchemaMetadata};
use lambda_streams::serdes::UNAVAILABLE_PREFIX;
use lambda_streams::serdes::schema::registry::RegistryClient;
use lambda_streams::serdes::schema::{
    SchemaId, SchemaSource, Side, Subject, WireFormat, decode_to_json, unframe,
};

/// How validated records are handed over (`EventRecordFormat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventRecordFormat {
    /// The bytes without their wire-format prefix.
    Source,
    /// The decoded value as JSON text.
    Json,
}

impl std::str::FromStr for EventRecordFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "source" => Ok(EventRecordFormat::Source),
            "json" => Ok(EventRecordFormat::Json),
            other => Err(format!(
                "--event-record-format: {other:?} is not json or source"
            )),
        }
    }
}

/// The schema validation settings of a runner.
#[derive(Debug, Clone)]
pub struct SchemaValidationConfig {
    /// The registry's URL (`--schema-registry`).
    pub registry_url: String,
    /// How records are handed over (`--event-record-format`).
    pub format: EventRecordFormat,
    /// Validate keys (`--schema-validation key`).
    pub key: bool,
    /// Validate values (`--schema-validation value`).
    pub value: bool,
}

impl SchemaValidationConfig {
    /// Parses `--schema-validation`: `key`, `value` or `key,value`.
    pub fn sides(list: &str) -> Result<(bool, bool), String> {
        let (mut key, mut value) = (false, false);
        for side in list.split(',').map(str::trim) {
            match side {
                "key" => key = true,
                "value" => value = true,
                other => {
                    return Err(format!(
                        "--schema-validation: {other:?} is not key or value"
                    ));
                }
            }
        }
        Ok((key, value))
    }
}

/// Why a record failed validation: the failure reason the destination records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SchemaFailure {
    /// The registry does not know the record's schema id.
    SchemaNotFound(String),
    /// The record is not in the wire format, or does not decode with its schema.
    DeserializationError(String),
}

/// The validation of a running runner: its registry client (one cache for the run).
pub struct SchemaValidation {
    config: SchemaValidationConfig,
    registry: RegistryClient,
}

impl SchemaValidation {
    /// A validation against the registry of `config`.
    pub fn new(config: SchemaValidationConfig) -> Result<Self, String> {
        let registry = RegistryClient::new(&config.registry_url).map_err(|e| e.0)?;
        Ok(SchemaValidation { config, registry })
    }

    /// Validates and rewrites `record` of `topic` in place. `Ok(Err(..))`: the record
    /// fails (see [`SchemaFailure`]); `Err`: the registry could not be reached.
    pub fn apply(
        &self,
        topic: &str,
        record: &mut Record,
    ) -> Result<Result<(), SchemaFailure>, String> {
        if self.config.key {
            match self.side(topic, Side::Key, record.key.as_deref())? {
                Ok(Some((bytes, meta))) => {
                    record.key = Some(bytes);
                    record.key_schema_metadata = Some(meta);
                }
                Ok(None) => {}
                Err(e) => return Ok(Err(e)),
            }
        }
        if self.config.value {
            match self.side(topic, Side::Value, record.value.as_deref())? {
                Ok(Some((bytes, meta))) => {
                    record.value = Some(bytes);
                    record.value_schema_metadata = Some(meta);
                }
                Ok(None) => {}
                Err(e) => return Ok(Err(e)),
            }
        }
        Ok(Ok(()))
    }

    #[allow(clippy::type_complexity)]
    fn side(
        &self,
        topic: &str,
        side: Side,
        data: Option<&[u8]>,
    ) -> Result<Result<Option<(Bytes, SchemaMetadata)>, SchemaFailure>, String> {
        let what = match side {
            Side::Key => "key",
            Side::Value => "value",
        };
        let Some(data) = data else {
            return Ok(Ok(None)); // a null key or a tombstone: nothing to validate
        };
        let framed = match unframe(WireFormat::Confluent, data, None) {
            Ok(f) => f,
            Err(e) => {
                return Ok(Err(SchemaFailure::DeserializationError(format!(
                    "the {what}: {e}"
                ))));
            }
        };
        let Some(id) = framed.id else {
            return Ok(Err(SchemaFailure::DeserializationError(format!(
                "the {what} has no schema id"
            ))));
        };
        let subject = Subject::topic(topic, side);
        let schema = match self.registry.schema_by_id(&id, &subject) {
            Ok(s) => s,
            Err(e) if e.0.starts_with(UNAVAILABLE_PREFIX) => return Err(e.0),
            Err(e) => return Ok(Err(SchemaFailure::SchemaNotFound(e.0))),
        };
        let metadata = SchemaMetadata {
            data_format: Some(schema.schema_type.as_str().to_owned()),
            schema_id: Some(match id {
                SchemaId::Confluent(n) => n.to_string(),
                glue => glue.to_string(),
            }),
        };
        let bytes = match decode_to_json(&schema, &framed.payload) {
            Ok(json) if self.config.format == EventRecordFormat::Json => {
                Bytes::from(json.to_string())
            }
            Ok(_) => Bytes::copy_from_slice(&framed.payload),
            Err(e) => {
                return Ok(Err(SchemaFailure::DeserializationError(format!(
                    "the {what} (schema id {id}, subject {subject}): {e}"
                ))));
            }
        };
        Ok(Ok(Some((bytes, metadata))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_and_name_the_flag() {
        assert_eq!(SchemaValidationConfig::sides("value"), Ok((false, true)));
        assert_eq!(
            SchemaValidationConfig::sides("key, value"),
            Ok((true, true))
        );
        assert!(
            SchemaValidationConfig::sides("values")
                .expect_err("not a side")
                .starts_with("--schema-validation: \"values\"")
        );
        assert_eq!("JSON".parse(), Ok(EventRecordFormat::Json));
        assert_eq!("source".parse(), Ok(EventRecordFormat::Source));
        assert!(
            "avro"
                .parse::<EventRecordFormat>()
                .expect_err("not a format")
                .starts_with("--event-record-format")
        );
    }
}
