//! [`DecodeError`]: what went wrong in an event, and where.

use std::fmt;

use super::TopicPartition;

/// Why an event could not be decoded: the place ([`location`](Self::location), topic-partition,
/// offset, field, line and column) and the reason ([`kind`](Self::kind)).
///
/// Displays as one line a person can act on, e.g.
/// `malformed Kafka event at records["text-lines-0"][1] (text-lines-0 offset 1), field "key":
/// invalid base64: Invalid symbol 36, offset 3. (line 12, column 27)`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct DecodeError(Box<Details>);

/// The contents of a [`DecodeError`], boxed so that `Result<_, DecodeError>` stays small.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Details {
    pub(super) kind: DecodeErrorKind,
    pub(super) key: Option<String>,
    pub(super) index: Option<usize>,
    pub(super) tp: Option<TopicPartition>,
    pub(super) offset: Option<i64>,
    pub(super) field: Option<&'static str>,
    pub(super) line_column: Option<(usize, usize)>,
}

/// The reason an event could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeErrorKind {
    /// The input is not well-formed JSON (including truncated input and trailing garbage).
    #[error("JSON syntax error: {0}")]
    Syntax(String),
    /// A value has the wrong JSON type or an unknown enum value (as reported by `serde_json`).
    #[error("{0}")]
    Invalid(String),
    /// A required field is absent.
    #[error("missing field \"{0}\"")]
    MissingField(&'static str),
    /// A field appears twice in one object.
    #[error("duplicate field \"{0}\"")]
    DuplicateField(&'static str),
    /// `eventSource` is neither `aws:kafka` nor `SelfManagedKafka`.
    #[error("unknown eventSource {0:?} (expected \"aws:kafka\" or \"SelfManagedKafka\")")]
    UnknownEventSource(String),
    /// `eventSource` is `aws:kafka` but `eventSourceArn` is missing or null.
    #[error("eventSourceArn is required when eventSource is \"aws:kafka\"")]
    MissingEventSourceArn,
    /// A key of the `records` map is not of the form `"<topic>-<partition>"`.
    #[error("records key {0:?} is not of the form \"<topic>-<partition>\"")]
    BadPartitionKey(String),
    /// The same `"<topic>-<partition>"` key appears twice in the `records` map.
    #[error("records key {0:?} appears more than once")]
    DuplicatePartitionKey(String),
    /// A record's `topic` / `partition` differ from the key it is listed under.
    #[error("record has topic {topic:?} and partition {partition} but is listed under key {key:?}")]
    WrongPartition {
        /// The key the record is listed under.
        key: String,
        /// The record's `topic` field.
        topic: String,
        /// The record's `partition` field.
        partition: i32,
    },
    /// A record's offset is not above the previous record's offset in its list.
    #[error(
        "offset {offset} follows offset {previous}: offsets must strictly increase (an event source in Queue mode, on a share group, does not keep partition order; lambda-streams needs ConsumptionMode Stream)"
    )]
    OffsetOutOfOrder {
        /// The offset of the previous record in the list.
        previous: i64,
        /// The offset of this record.
        offset: i64,
    },
    /// The event comes from an event source in Queue mode (Kafka share groups): records of
    /// a partition are delivered by several consumers at once, out of order and more than
    /// once, and the framework's per-partition offset watermarks (its exactly-once design)
    /// need partition order. Refused, never processed. AWS's documentation (as found) does
    /// not show the Queue-mode event itself; the decoder refuses what marks one: a record's
    /// `deliveryCount` (the share consumer's per-record delivery count, which a consumer
    /// group's records never have), an event-level `consumptionMode` of `Queue`, and, as
    /// for any event, offsets out of order ([`OffsetOutOfOrder`](Self::OffsetOutOfOrder)).
    #[error(
        "this event comes from an event source in Queue mode (Kafka share groups: {0}): lambda-streams needs per-partition order for its exactly-once state; set the event source mapping's ConsumptionMode to Stream (the default)"
    )]
    QueueMode(&'static str),
    /// `timestamp` is a number but not an integer that fits an `i64` (`1764460800000.0`,
    /// `1.7e12`, `2^63`). A non-number (a string, ...) is [`Invalid`](Self::Invalid).
    #[error("timestamp must be an integer number of epoch milliseconds, found {0}")]
    InvalidTimestamp(String),
    /// `key` or `value` is not valid standard base64 (with padding).
    #[error("invalid base64: {0}")]
    InvalidBase64(String),
    /// A header byte value is outside `-128..=255`.
    #[error("header {header:?} has byte value {value}, outside -128..=255")]
    HeaderByteOutOfRange {
        /// The header's name.
        header: String,
        /// The offending value.
        value: i128,
    },
}

impl DecodeError {
    pub(super) fn new(details: Details) -> Self {
        DecodeError(Box::new(details))
    }

    /// The reason.
    pub fn kind(&self) -> &DecodeErrorKind {
        &self.0.kind
    }

    /// Where in the event: a JSON path such as `records["text-lines-0"][1]` or
    /// `records["text-lines-0"]`, or `event` for the top level. The field, if any, is
    /// [`field`](Self::field).
    pub fn location(&self) -> String {
        match (&self.0.key, self.0.index) {
            (Some(key), Some(index)) => format!("records[{key:?}][{index}]"),
            (Some(key), None) => format!("records[{key:?}]"),
            (None, _) => "event".to_owned(),
        }
    }

    /// The topic-partition of the `records` entry the error is in, when known.
    pub fn topic_partition(&self) -> Option<&TopicPartition> {
        self.0.tp.as_ref()
    }

    /// The offset of the record the error is in, when it was read before the error.
    pub fn offset(&self) -> Option<i64> {
        self.0.offset
    }

    /// The JSON field the error is in (`"key"`, `"headers"`, `"eventSource"`, ...), if any.
    pub fn field(&self) -> Option<&str> {
        self.0.field
    }

    /// The 1-based line and column in the input where `serde_json` stopped, if known.
    pub fn line_column(&self) -> Option<(usize, usize)> {
        self.0.line_column
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("malformed Kafka event")?;
        let d = &self.0;
        if d.key.is_some() {
            write!(f, " at {}", self.location())?;
            if let (Some(tp), Some(offset)) = (&d.tp, d.offset) {
                write!(f, " ({tp} offset {offset})")?;
            }
        }
        if let Some(field) = d.field {
            write!(f, ", field {field:?}")?;
        }
        write!(f, ": {}", d.kind)?;
        if let Some((line, column)) = d.line_column {
            write!(f, " (line {line}, column {column})")?;
        }
        Ok(())
    }
}
