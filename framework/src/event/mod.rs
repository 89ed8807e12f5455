//! The Kafka event that AWS Lambda hands to a function: exact decoding and encoding.
//!
//! A Kafka event source mapping (ESM) — Amazon MSK (`"eventSource": "aws:kafka"`) or a
//! self-managed cluster (`"SelfManagedKafka"`) — invokes the function with one JSON document
//! per batch:
//!
//! ```json
//! {
//!   "eventSource": "aws:kafka",
//!   "eventSourceArn": "arn:aws:kafka:...",
//!   "bootstrapServers": "b-1:9092,b-2:9092",
//!   "records": {
//!     "page-views-0": [
//!       { "topic": "page-views", "partition": 0, "offset": 15,
//!         "timestamp": 1764460800123, "timestampType": "CREATE_TIME",
//!         "key": "dXNlci0x", "value": "eyJwYWdlIjoiL2hvbWUifQ==",
//!         "headers": [ { "trace-id": [97, 98, 99] } ] }
//!     ]
//!   }
//! }
//! ```
//!
//! [`KafkaEvent::decode`] turns that document into a [`KafkaEvent`]; [`KafkaEvent::to_json`]
//! writes the same shape back (the local runner and the test driver build their events with it).
//!
//! # Fidelity guarantees
//!
//! - **Timestamps are exact.** `timestamp` is read as an `i64` straight from the JSON digits,
//!   never through `f64`: `9007199254740993` (2^53 + 1) stays `9007199254740993`. A float or a
//!   string there is an error, not a silent rounding.
//! - **Bytes are exact.** `key` and `value` are standard base64 with padding; `null` is
//!   [`None`] (for `value`, a tombstone). Header values are arrays of byte values that the ESM
//!   writes as signed Java bytes (`-128..=127`); unsigned values (`0..=255`) are accepted too,
//!   and both map to the same `u8` (`-17` and `239` are both `0xEF`). Anything else is an error.
//! - **Order is kept.** Partitions appear in [`KafkaEvent::partitions`] in the order of their
//!   keys in the JSON; records and headers in the order of their arrays. Within a partition the
//!   offsets must strictly increase.
//! - **Every record is where its key says.** The `records` map is keyed `"<topic>-<partition>"`
//!   (topic names may themselves contain `-`, so the key is split at its *last* `-`); each
//!   record's `topic` and `partition` must match its key.
//! - **Leniency where the ESM varies, strictness where data could be lost.** An absent `key`,
//!   `value` or `headers` field reads as `None` / `None` / empty; `keySchemaMetadata` and
//!   `valueSchemaMetadata` (schema registry option) are optional; unknown fields are ignored.
//!   Everything else that is missing, mistyped or inconsistent is a [`DecodeError`].
//! - **Errors name the place.** A [`DecodeError`] carries the JSON path
//!   (`records["text-lines-0"][1]`), the record's topic-partition and offset when known, the
//!   field, and the line and column; bad input never panics.
//! - **Round trip.** For any decoded event `e`, `KafkaEvent::decode(&e.to_json()) == Ok(e)`.
//!   `to_json` writes headers as signed Java bytes and `"key": null` for a missing key, so
//!   its output is also readable by `aws_lambda_events::event::kafka::KafkaEvent`.
//!
//! Decoding has two paths with one result. A fast path scans events of the usual shape
//! directly (no `serde_json`), decoding each base64 string with `base64-simd` as soon as
//! `memchr` has found its end, into one buffer for the whole event: keys, values and header
//! values are [`Bytes`] views of it, and each distinct header name is one shared `Arc<str>`,
//! so decoding allocates per partition, not per record and field (see [`Record`]); it gives
//! up on anything unusual (an escape in a string, an unknown field, a float, invalid
//! base64, ...).
//! The full path, one pass of `serde_json` with
//! hand-written visitors, then decides, and every [`DecodeError`] comes from it. Tests check
//! that whenever the fast path decodes, the full path decodes the same event, on thousands
//! of mutated events, and that its base64 decoder agrees with the `base64` crate.
//!
//! ```
//! use lambda_streams::event::{KafkaEvent, EventSource};
//!
//! let json = br#"{"eventSource":"SelfManagedKafka","bootstrapServers":"127.0.0.1:9092",
//!   "records":{"words-0":[{"topic":"words","partition":0,"offset":3,
//!   "timestamp":1764460800000,"timestampType":"CREATE_TIME","key":null,
//!   "value":"aGVsbG8=","headers":[]}]}}"#;
//! let event = KafkaEvent::decode(json)?;
//! assert_eq!(event.source, EventSource::SelfManaged);
//! assert_eq!(event.partitions[0].tp.to_string(), "words-0");
//! assert_eq!(event.partitions[0].records[0].value.as_deref(), Some(&b"hello"[..]));
//! assert_eq!(KafkaEvent::decode(&event.to_json())?, event);
//! # Ok::<(), lambda_streams::event::DecodeError>(())
//! ```

mod decode;
pub(crate) use decode::{MAX_THREADS, cpus};
pub(crate) mod encode;
mod error;
pub mod response;
#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::Arc;

pub use bytes::Bytes;
use serde::{Deserialize, Serialize};

pub use error::{DecodeError, DecodeErrorKind};

/// One Lambda invocation's worth of Kafka records, as delivered by the event source mapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaEvent {
    /// Which kind of event source mapping sent the event (`eventSource`, `eventSourceArn`).
    pub source: EventSource,
    /// The cluster's bootstrap servers, one comma-separated string as in the event.
    pub bootstrap_servers: String,
    /// One entry per `"<topic>-<partition>"` key, in the order they appear in the JSON.
    pub partitions: Vec<PartitionRecords>,
}

/// The event source mapping that produced an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventSource {
    /// Amazon MSK: `"eventSource": "aws:kafka"`, with the cluster's `eventSourceArn`.
    Msk {
        /// The MSK cluster ARN (`eventSourceArn`).
        arn: String,
    },
    /// A self-managed Apache Kafka cluster: `"eventSource": "SelfManagedKafka"`, no ARN.
    SelfManaged,
}

/// A topic and one of its partitions: the unit of ordering in Kafka and of keys in the event.
///
/// Displays as `"<topic>-<partition>"`, the form used as the key of the event's `records`
/// map and as the `partition` of a partial batch response's item identifier.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TopicPartition {
    /// The topic name (it may contain `-`).
    pub topic: String,
    /// The partition number.
    pub partition: i32,
}

impl TopicPartition {
    /// A topic-partition from its parts.
    pub fn new(topic: impl Into<String>, partition: i32) -> Self {
        TopicPartition {
            topic: topic.into(),
            partition,
        }
    }

    /// Parses a `"<topic>-<partition>"` key, splitting at the last `-`.
    ///
    /// Returns `None` unless the key is exactly what [`Display`](fmt::Display) would write:
    /// a non-empty topic, and a partition in canonical decimal form (no sign, no leading
    /// zeros) that fits an `i32`.
    pub fn from_key(key: &str) -> Option<Self> {
        let (topic, partition) = key.rsplit_once('-')?;
        let canonical = !partition.is_empty()
            && partition.bytes().all(|b| b.is_ascii_digit())
            && (partition == "0" || !partition.starts_with('0'));
        if topic.is_empty() || !canonical {
            return None;
        }
        let partition = partition.parse().ok()?;
        Some(TopicPartition::new(topic, partition))
    }

    /// Appends the key, `"<topic>-<partition>"` as [`Display`](fmt::Display) writes it,
    /// to `out` without the formatting machinery (state writes name watermarks by it).
    pub(crate) fn push_key(&self, out: &mut String) {
        out.push_str(&self.topic);
        out.push('-');
        let mut text = [0u8; 11];
        let mut at = text.len();
        let mut n = self.partition.unsigned_abs();
        loop {
            at -= 1;
            text[at] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        if self.partition < 0 {
            out.push('-');
        }
        out.push_str(std::str::from_utf8(&text[at..]).unwrap_or_default());
    }
}

impl fmt::Display for TopicPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.topic, self.partition)
    }
}

/// The records of one topic-partition in an event, in offset order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionRecords {
    /// The topic-partition, parsed from the `records` key.
    pub tp: TopicPartition,
    /// The records, in the order of the JSON array (strictly increasing offsets).
    pub records: Vec<Record>,
}

/// One Kafka record with its bytes decoded.
///
/// The key, the value and the header values are [`Bytes`]: cheap, reference-counted views
/// of one buffer that [`KafkaEvent::decode`] fills for the whole event (a record costs no
/// allocation of its own, apart from its header list). They dereference to `&[u8]`, which
/// is what serdes read: `record.value.as_deref()` is an `Option<&[u8]>`, as are the
/// accessors [`key`](Record::key) and [`value`](Record::value). Keeping one of them (or a
/// clone of it) keeps that whole buffer alive; copy the bytes out (`to_vec()`) to keep a
/// small part of a large event for long.
///
/// To build a record by hand, anything that converts into [`Bytes`] will do:
///
/// ```
/// use lambda_streams::event::{Header, Record, TimestampType};
///
/// let record = Record {
///     offset: 7,
///     timestamp: 1764460800000,
///     timestamp_type: TimestampType::CreateTime,
///     key: Some(b"user-1".to_vec().into()),
///     value: Some("hello".into()),
///     headers: vec![Header::new("trace-id", &b"abc"[..])],
///     key_schema_metadata: None,
///     value_schema_metadata: None,
/// };
/// assert_eq!(record.key(), Some(&b"user-1"[..]));
/// assert_eq!(record.value(), Some(&b"hello"[..]));
/// assert_eq!(record.header("trace-id"), Some(&b"abc"[..]));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The record's offset in its partition.
    pub offset: i64,
    /// The record timestamp in epoch milliseconds, exactly as in the event.
    pub timestamp: i64,
    /// Whether the producer or the broker set the timestamp.
    pub timestamp_type: TimestampType,
    /// The key bytes; `None` when the key is `null` or absent.
    pub key: Option<Bytes>,
    /// The value bytes; `None` for a tombstone (`null`, or absent).
    pub value: Option<Bytes>,
    /// The headers in order (names may repeat); empty when the field is missing.
    pub headers: Vec<Header>,
    /// `keySchemaMetadata`, present with the ESM's schema registry option.
    pub key_schema_metadata: Option<SchemaMetadata>,
    /// `valueSchemaMetadata`, present with the ESM's schema registry option.
    pub value_schema_metadata: Option<SchemaMetadata>,
}

impl Record {
    /// The key bytes; `None` when the key is `null` or absent.
    pub fn key(&self) -> Option<&[u8]> {
        self.key.as_deref()
    }

    /// The value bytes; `None` for a tombstone.
    pub fn value(&self) -> Option<&[u8]> {
        self.value.as_deref()
    }

    /// The value of the first header called `name`.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|h| h.name() == name)
            .map(|h| h.value.as_ref())
    }
}

/// The Kafka timestamp type of a record (`timestampType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TimestampType {
    /// `CREATE_TIME`: set by the producer.
    CreateTime,
    /// `LOG_APPEND_TIME`: set by the broker when it appended the record.
    LogAppendTime,
}

impl TimestampType {
    /// The name used in the event: `CREATE_TIME` or `LOG_APPEND_TIME`.
    pub fn as_str(self) -> &'static str {
        match self {
            TimestampType::CreateTime => "CREATE_TIME",
            TimestampType::LogAppendTime => "LOG_APPEND_TIME",
        }
    }
}

/// One record header: a name and its bytes.
///
/// The name is an [`Arc<str>`]: the decoder makes one per distinct name in an event and
/// shares it between the records; the value is a view of the event's buffer (see
/// [`Record`]). [`Header::new`] builds one from a `&str` or `String` and anything that
/// converts into [`Bytes`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// The header name.
    pub name: Arc<str>,
    /// The header value bytes.
    pub value: Bytes,
}

impl Header {
    /// A header from its name and value.
    pub fn new(name: impl Into<Arc<str>>, value: impl Into<Bytes>) -> Self {
        Header {
            name: name.into(),
            value: value.into(),
        }
    }

    /// The header name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The header value bytes.
    pub fn value(&self) -> &[u8] {
        &self.value
    }
}

/// Schema registry metadata of a key or value (`keySchemaMetadata` / `valueSchemaMetadata`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SchemaMetadata {
    /// `dataFormat`, e.g. `AVRO`, `PROTOBUF` or `JSON`.
    #[serde(default)]
    pub data_format: Option<String>,
    /// `schemaId`: the schema's id in the registry.
    #[serde(default)]
    pub schema_id: Option<String>,
}

impl KafkaEvent {
    /// Decodes an event from its JSON bytes, checking everything the
    /// [module documentation](self) promises.
    ///
    /// # Errors
    ///
    /// A [`DecodeError`] naming the place (path, topic-partition and offset, field, line and
    /// column) for malformed JSON, a wrong or unknown event source, a missing or mistyped
    /// field, invalid base64, a header byte outside `-128..=255`, a non-integer timestamp,
    /// a record listed under another partition's key, or offsets out of order.
    ///
    /// An event of a megabyte or more is decoded in chunks of about equal size (split
    /// between partitions or between the records of one) on up to four threads, as many
    /// as the process has CPUs for: the cores available
    /// (`std::thread::available_parallelism`), and in Lambda one per 1,769 MB of memory
    /// (Lambda's CPU share: a function under 3,538 MB decodes on one thread); the result is
    /// the same as on one thread.
    pub fn decode(json: &[u8]) -> Result<KafkaEvent, DecodeError> {
        decode::decode(json, decode::threads())
    }

    /// [`decode`](Self::decode) on at most `threads` threads (1: on the caller's thread
    /// only). The same event or the same error whatever the number.
    ///
    /// # Errors
    ///
    /// As [`decode`](Self::decode).
    pub fn decode_with_threads(json: &[u8], threads: usize) -> Result<KafkaEvent, DecodeError> {
        decode::decode(json, threads.clamp(1, MAX_THREADS))
    }

    /// Writes the event in the exact shape Lambda sends (compact JSON).
    ///
    /// `eventSourceArn` appears only for [`EventSource::Msk`]; a missing key or value is
    /// written as `null`; headers are always written (possibly `[]`), their bytes as signed
    /// Java bytes (`-128..=127`); schema metadata only when present.
    pub fn to_json(&self) -> Vec<u8> {
        encode::to_json(self)
    }

    /// The number of records across all partitions.
    pub fn record_count(&self) -> usize {
        self.partitions.iter().map(|p| p.records.len()).sum()
    }
}
