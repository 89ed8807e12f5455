//! A batch's records through the topology's sources, in the event's order: the pass before
//! the stores are written. It is synchronous and runs inside the scope of the threads that
//! read the records ahead ([`BatchAhead`]); it stops, to be resumed, where the outputs it
//! holds are to be sent (the only thing it waits for).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::thread::Scope;

use super::batch::{OUTPUT_CHUNK, tag_transaction};
use super::options::{BatchOptions, OutputGuarantee, PoisonPolicy};
use super::poison::{dead_letter, failure};
use super::report::BatchOutcome;
use crate::error::StreamError;
use crate::event::KafkaEvent;
use crate::sink::OutputRecord;
use crate::topology::Topology;
use crate::topology::ahead::BatchAhead;
use crate::topology::context::{Ctx, Origin};

/// Where a batch's pass over its records stands.
pub(crate) struct Records<'e> {
    pub(crate) event: &'e KafkaEvent,
    pub(crate) options: &'e BatchOptions,
    /// The next record: partition index and position in it.
    pub(crate) next: (usize, usize),
}

/// How a pass over the records stopped.
pub(crate) enum Pass {
    /// Every record went through.
    Done,
    /// These outputs are to be sent before the next record.
    Send(Vec<OutputRecord>),
}

impl Topology {
    /// Reads the records from `records.next` through the sources, taking what `ahead` read
    /// of them (its threads in `scope`), until the last or until a chunk of outputs is to be
    /// sent. A poison record is handled by the options' policy (its outputs, contributions
    /// and stream time undone); any other error fails the batch.
    pub(crate) fn run_records<'s, 'e: 's>(
        &self,
        records: &mut Records<'e>,
        scope: &'s Scope<'s, '_>,
        ahead: &mut BatchAhead<'e>,
        ctx: &mut Ctx,
        outcome: &mut BatchOutcome,
        dead_letters: &mut Vec<OutputRecord>,
    ) -> Result<Pass, StreamError> {
        let (event, options) = (records.event, records.options);
        let exactly_once = options.output == OutputGuarantee::ExactlyOnce;
        let (first, mut from) = records.next;
        'partitions: for (index, batch) in event.partitions.iter().enumerate().skip(first) {
            let skip = std::mem::take(&mut from);
            let Some(sources) = self.inner.sources.get(&batch.tp.topic) else {
                return Err(StreamError::UnknownTopic {
                    tp: batch.tp.clone(),
                    offset: batch.records.first().map_or(-1, |r| r.offset),
                });
            };
            let tp_index = u32::try_from(index).unwrap_or(u32::MAX);
            // A topic read with a timestamp extractor: its source sets the stream time.
            let record_time = !self.inner.extracted.contains(&batch.tp.topic);
            for (position, record) in batch.records.iter().enumerate().skip(skip) {
                // Records waiting at joins will produce repartition records below the ones
                // held now, which must then be sorted with them (see `sort_hops`).
                let may_send = !self.inner.sort_hops || ctx.deferred.is_empty();
                if ctx.outputs.len() >= OUTPUT_CHUNK && may_send {
                    // Bounded memory: a record may emit many (a flat_map ahead of a
                    // repartition), so the outputs go out in chunks while the batch goes on.
                    records.next = (index, position);
                    return Ok(Pass::Send(std::mem::take(&mut ctx.outputs)));
                }
                ahead.prepare(scope, index, position);
                let mark = ctx.outputs.len();
                ctx.origin = Origin::Record {
                    tp: tp_index,
                    offset: record.offset,
                    timestamp: record.timestamp,
                };
                ctx.source = None;
                // A poison record's timestamp must not count (a far-future one would close
                // every window): restored below when the record fails.
                let (stream_time, late) = (ctx.stream_times[index], ctx.late_records);
                ctx.prior_stream_time = stream_time;
                if record_time {
                    ctx.stream_times[index] = ctx.stream_times[index].max(record.timestamp);
                }
                let result = catch_unwind(AssertUnwindSafe(|| {
                    sources.iter().enumerate().try_for_each(|(s, source)| {
                        (source.read)(ctx, record, ahead.get(index, s, position))
                    })
                }));
                let Some(error) = failure(result, &batch.tp, record.offset)? else {
                    if exactly_once {
                        tag_transaction(&mut ctx.outputs[mark..], &batch.tp, record.offset);
                    }
                    if let Some(source) = ctx.source {
                        ctx.hopped.insert(source, (tp_index, record.offset));
                    }
                    outcome.report.records_in += 1;
                    continue;
                };
                // Undo what the record did before it failed (its outputs, contributions,
                // stream time, also one a timestamp extractor set, and late windows); the
                // batch goes on without it.
                ctx.stream_times[index] = stream_time;
                ctx.late_records = late;
                ctx.outputs.truncate(mark);
                let (source, offset) = ctx.source.unwrap_or((tp_index, record.offset));
                ctx.forget(source, offset);
                outcome.report.poison_records += 1;
                tracing::warn!(error = %error, policy = ?options.poison, "poison record");
                match &options.poison {
                    PoisonPolicy::Skip => {}
                    PoisonPolicy::DeadLetter { topic } => {
                        dead_letters.push(dead_letter(topic, &batch.tp, record, &error))
                    }
                    PoisonPolicy::Fail if options.partial_batch_response => {
                        outcome.failures.push((batch.tp.clone(), record.offset));
                        continue 'partitions;
                    }
                    PoisonPolicy::Fail => return Err(error),
                }
            }
        }
        records.next = (event.partitions.len(), 0);
        Ok(Pass::Done)
    }
}
