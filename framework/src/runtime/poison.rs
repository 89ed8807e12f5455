//! Poison records: what a record's failure or panic comes to, the dead-letter record,
//! and the guard around user code on table updates.

use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::error::StreamError;
use crate::event::{KafkaEvent, Record, TopicPartition};
use crate::sink::{OutputRecord, SOURCE_HEADER};
use crate::topology::context::Ctx;
use crate::wire::{ERROR_HEADER, SourceHeader};

/// The record as it came, to the dead-letter topic, with the error and its source.
pub(crate) fn dead_letter(
    topic: &str,
    tp: &TopicPartition,
    record: &Record,
    error: &StreamError,
) -> OutputRecord {
    let mut headers: Vec<(String, Vec<u8>)> = record
        .headers
        .iter()
        .map(|h| (h.name().to_owned(), h.value().to_vec()))
        .collect();
    headers.push((ERROR_HEADER.to_owned(), error.to_string().into_bytes()));
    headers.push((
        SOURCE_HEADER.to_owned(),
        SourceHeader::write(tp, record.offset),
    ));
    OutputRecord {
        topic: topic.to_owned(),
        key: record.key().map(<[u8]>::to_vec),
        value: record.value().map(<[u8]>::to_vec),
        headers,
        timestamp: Some(record.timestamp),
    }
}

/// What a record's processing came to: `None` when it went through, the poison error
/// when user code failed or panicked on it, `Err` for any other error (which fails the
/// batch).
pub(crate) fn failure(
    result: std::thread::Result<Result<(), StreamError>>,
    tp: &TopicPartition,
    offset: i64,
) -> Result<Option<StreamError>, StreamError> {
    match result {
        Ok(Ok(())) => Ok(None),
        Ok(Err(e @ (StreamError::Deserialize { .. } | StreamError::User { .. }))) => Ok(Some(e)),
        Ok(Err(other)) => Err(other),
        Err(panic) => Ok(Some(StreamError::User {
            tp: tp.clone(),
            offset,
            reason: format!("user code panicked: {}", panic_message(panic.as_ref())),
        })),
    }
}

/// Runs user code on a table's update: a panic there (not attributable to one record)
/// fails the batch with an error instead of unwinding through the runtime.
pub(crate) fn guarded(f: impl FnOnce() -> Result<(), StreamError>) -> Result<(), StreamError> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        Err(StreamError::Config(format!(
            "user code panicked on a table update: {}",
            panic_message(panic.as_ref())
        )))
    })
}

pub(crate) use crate::state::limits::panic_message;

/// A record whose contribution a store rejected, named for the poison policy.
pub(crate) struct RejectedRecord<'a> {
    /// The poison error, naming the batch record (topic-partition and offset).
    pub(crate) error: StreamError,
    /// The batch record (partition index, offset), when the batch holds it.
    pub(crate) record: Option<(u32, i64)>,
    tp: Option<&'a TopicPartition>,
    found: Option<&'a Record>,
}

impl RejectedRecord<'_> {
    /// The dead letter of the record, when the batch holds it.
    pub(crate) fn letter(&self, topic: &str) -> Option<OutputRecord> {
        Some(dead_letter(topic, self.tp?, self.found?, &self.error))
    }
}

/// Names the batch record behind the contribution (`source`, `offset`) that a store
/// rejected with `reason`: the record itself, or the repartitioned record standing for it.
/// A contribution the batch cannot trace (none should be) is named by its source
/// partition and position.
pub(crate) fn rejected_record<'a>(
    ctx: &Ctx,
    event: &'a KafkaEvent,
    source: u32,
    offset: i64,
    reason: String,
) -> RejectedRecord<'a> {
    let at = ctx.batch_record(source, offset);
    let batch = at.and_then(|(tp, _)| event.partitions.get(tp as usize));
    let found = at.zip(batch).and_then(|((_, offset), batch)| {
        batch
            .records
            .binary_search_by_key(&offset, |r| r.offset)
            .ok()
            .map(|i| &batch.records[i])
    });
    let (tp, record_offset) = match (batch, at) {
        (Some(batch), Some((_, offset))) => (batch.tp.clone(), offset),
        _ => (
            ctx.sources
                .get(source as usize)
                .cloned()
                .unwrap_or_else(|| TopicPartition::new("<unknown>", -1)),
            offset,
        ),
    };
    RejectedRecord {
        error: StreamError::User {
            tp,
            offset: record_offset,
            reason,
        },
        record: at,
        tp: batch.map(|b| &b.tp),
        found,
    }
}
