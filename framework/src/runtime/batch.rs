//! Batch execution: records through the stateless operators, then one write per
//! touched state item, then the table updates, then the sinks.

use futures::{StreamExt, TryStreamExt};

use super::context::{Ctx, Origin, PendingItem};
use crate::dsl::Topology;
use crate::error::StreamError;
use crate::event::KafkaEvent;
use crate::sink::Sink;
use crate::state::{ItemState, ItemWrite, Store, WriteStats};

/// How many state writes a batch keeps in flight at once: DynamoDB answers in
/// milliseconds, so a batch must not pay that latency once per item in series.
pub(crate) const WRITE_CONCURRENCY: usize = 32;

/// What one batch did: counts for logs, metrics and benchmarks.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BatchReport {
    /// Source records processed.
    pub records_in: u64,
    /// Records produced to sinks.
    pub records_out: u64,
    /// Distinct state items the batch touched (one write each in the common case).
    pub items_touched: u64,
    /// Records not aggregated because their key serialized to null.
    pub dropped_null_keys: u64,
    /// The cost of the state writes.
    pub state: WriteStats,
}

impl Topology {
    /// Processes one event: every record through the topology, then each touched state
    /// item written once (exactly-once per the store), then the resulting table updates
    /// through their downstream operators, then all output records produced and
    /// acknowledged. An error fails the whole batch; the event source delivers it again
    /// and the watermarks make the retry exact.
    pub async fn process(
        &self,
        event: &KafkaEvent,
        store: &dyn Store,
        sink: &dyn Sink,
    ) -> Result<BatchReport, StreamError> {
        let partitions = event.partitions.iter().map(|p| p.tp.clone()).collect();
        let mut ctx = Ctx::new(partitions, self.inner.stores.len());
        let mut report = BatchReport::default();
        for (index, batch) in event.partitions.iter().enumerate() {
            let Some(sources) = self.inner.sources.get(&batch.tp.topic) else {
                return Err(StreamError::UnknownTopic {
                    tp: batch.tp.clone(),
                    offset: batch.records.first().map_or(-1, |r| r.offset),
                });
            };
            for record in &batch.records {
                ctx.origin = Origin::Record {
                    tp: u32::try_from(index).unwrap_or(u32::MAX),
                    offset: record.offset,
                    timestamp: record.timestamp,
                };
                for source in sources {
                    source(&mut ctx, record)?;
                }
                report.records_in += 1;
            }
        }
        for index in 0..self.inner.stores.len() {
            let pending = std::mem::take(&mut ctx.pending[index]);
            report.items_touched += pending.len() as u64;
            let updates = self
                .write_store(index, pending, &ctx, store, &mut report.state)
                .await?;
            let spec = &self.inner.stores[index];
            for (key, timestamp, state) in updates {
                ctx.origin = Origin::Update {
                    version: state.version,
                    timestamp,
                };
                (spec.on_update)(&mut ctx, &key, state.value)?;
            }
        }
        report.dropped_null_keys = ctx.dropped_null_keys;
        report.records_out = ctx.outputs.len() as u64;
        if !ctx.outputs.is_empty() {
            sink.send(std::mem::take(&mut ctx.outputs)).await?;
        }
        Ok(report)
    }

    /// Writes one store's touched items, concurrently, and returns their new states
    /// sorted by key (so that emission order does not depend on response order).
    async fn write_store(
        &self,
        index: usize,
        pending: std::collections::HashMap<Vec<u8>, PendingItem>,
        ctx: &Ctx,
        store: &dyn Store,
        stats: &mut WriteStats,
    ) -> Result<Vec<(Vec<u8>, i64, ItemState)>, StreamError> {
        let name = self.inner.stores[index].name.as_str();
        let partitions = ctx.partitions.as_slice();
        let mut results: Vec<_> = futures::stream::iter(pending)
            .map(|(key, item)| async move {
                let write = ItemWrite {
                    store: name,
                    key: &key,
                    contributions: &item.contributions,
                    partitions,
                };
                let (state, stats) = store.apply(write).await?;
                Ok::<_, StreamError>((key, item.max_timestamp, state, stats))
            })
            .buffer_unordered(WRITE_CONCURRENCY)
            .try_collect()
            .await?;
        results.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(results
            .into_iter()
            .map(|(key, ts, state, item_stats)| {
                stats.add(&item_stats);
                (key, ts, state)
            })
            .collect())
    }
}
