//! Poison records: what a record's failure or panic comes to, the dead-letter record,
//! and the guard around user code on table updates.

use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::error::StreamError;
use crate::event::{Record, TopicPartition};
use crate::sink::{OutputRecord, SOURCE_HEADER};
use crate::wire::ERROR_HEADER;

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
        format!("{}:{}:{}", tp.topic, tp.partition, record.offset).into_bytes(),
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

pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}
