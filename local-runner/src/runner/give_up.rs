//! Giving up on records: those whose partition's failed attempts exceed the retry limit,
//! and those older than the maximum record age. They go to the on-failure destination,
//! or are skipped with a warning without one; either way they are done (committed).

use std::time::{SystemTime, UNIX_EPOCH};

use lambda_streams::event::{KafkaEvent, Record, TopicPartition};

use super::state::Progress;
use super::{GroupConsumer, Runner};
use crate::destination::{FailureDestination, GiveUpReason, GivenUp};
use crate::schema::SchemaFailure;

impl Runner {
    /// Gives up the records of the event's `live` partitions whose attempts exceed the limit.
    pub(super) async fn give_up_exhausted(
        &self,
        event: &KafkaEvent,
        live: &[TopicPartition],
        state: &mut Progress,
        destination: Option<&FailureDestination>,
    ) -> Result<(), String> {
        let Some(limit) = self.config.effective_retry_limit() else {
            return Ok(());
        };
        for part in event.partitions.iter().filter(|p| live.contains(&p.tp)) {
            let Some(attempts) = state.attempts.get(&part.tp).filter(|a| a.count > limit) else {
                continue;
            };
            let from = state.buffers.position(&part.tp).unwrap_or(i64::MAX);
            let records: Vec<Record> = part
                .records
                .iter()
                .filter(|r| r.offset >= from)
                .cloned()
                .collect();
            let Some(last) = records.last().map(|r| r.offset) else {
                continue;
            };
            let given_up = GivenUp {
                tp: &part.tp,
                records: &records,
                reason: GiveUpReason::RetriesExhausted,
                error: &attempts.last_error,
                attempts: attempts.count,
            };
            give_up(&given_up, destination).await?;
            state.summary.given_up += records.len() as u64;
            state.buffers.complete(&part.tp, last + 1);
            state.attempts.remove(&part.tp);
            // What follows is fresh: no backoff, no retry plan.
            state.ungroup(&part.tp);
        }
        Ok(())
    }

    /// Gives up the buffered records older than the maximum record age (of partitions
    /// without a batch in flight), and commits.
    pub(super) async fn give_up_old_records(
        &self,
        consumer: &GroupConsumer,
        state: &mut Progress,
        destination: Option<&FailureDestination>,
    ) -> Result<(), String> {
        let Some(age) = self.config.maximum_record_age else {
            return Ok(());
        };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let cutoff = now.saturating_sub(age.as_millis() as i64);
        let in_flight = &state.in_flight;
        let old = state
            .buffers
            .take_older_than(cutoff, |tp| !in_flight.contains(tp));
        if old.is_empty() {
            return Ok(());
        }
        for (tp, records) in &old {
            let error = format!(
                "record older than the maximum record age of {} s",
                age.as_secs()
            );
            let attempts = state.attempts.get(tp).map_or(0, |a| a.count);
            let given_up = GivenUp {
                tp,
                records,
                reason: GiveUpReason::RecordAgeExceeded,
                error: &error,
                attempts,
            };
            give_up(&given_up, destination).await?;
            state.summary.given_up += records.len() as u64;
        }
        self.commit(consumer, state)
    }
}

impl Runner {
    /// Gives up a record that failed the schema validation (already marked done in the
    /// buffers, see [`crate::schema`]), and commits.
    pub(super) async fn give_up_invalid(
        &self,
        consumer: &GroupConsumer,
        state: &mut Progress,
        destination: Option<&FailureDestination>,
        tp: &TopicPartition,
        record: Record,
        failure: SchemaFailure,
    ) -> Result<(), String> {
        let (reason, error) = match failure {
            SchemaFailure::SchemaNotFound(e) => (GiveUpReason::SchemaNotFound, e),
            SchemaFailure::DeserializationError(e) => (GiveUpReason::DeserializationError, e),
        };
        let records = [record];
        let given_up = GivenUp {
            tp,
            records: &records,
            reason,
            error: &error,
            attempts: 0,
        };
        give_up(&given_up, destination).await?;
        state.summary.given_up += 1;
        self.commit(consumer, state)
    }
}

/// Sends records given up on to the destination, or logs that they are skipped.
async fn give_up(
    given_up: &GivenUp<'_>,
    destination: Option<&FailureDestination>,
) -> Result<(), String> {
    let (first, last) = match (given_up.records.first(), given_up.records.last()) {
        (Some(f), Some(l)) => (f.offset, l.offset),
        _ => return Ok(()),
    };
    match destination {
        Some(d) => {
            tracing::warn!(
                records = %format!("{}@{first}..={last}", given_up.tp),
                reason = given_up.reason.as_str(),
                error = given_up.error,
                destination = d.topic(),
                "records given up on: sent to the on-failure destination"
            );
            d.send(given_up).await
        }
        None => {
            tracing::warn!(
                records = %format!("{}@{first}..={last}", given_up.tp),
                reason = given_up.reason.as_str(),
                error = given_up.error,
                "records given up on and skipped (no on-failure destination)"
            );
            Ok(())
        }
    }
}
