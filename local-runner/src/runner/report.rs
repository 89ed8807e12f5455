//! What a run reports: the [`RunSummary`] at its end, and the progress line printed
//! every second with `progress`.

use std::time::Duration;

use lambda_streams::event::TopicPartition;
use rdkafka::consumer::{BaseConsumer, Consumer};

use super::GroupConsumer;
use super::state::Progress;

/// What a run did.
#[derive(Debug, Clone, Default)]
pub struct RunSummary {
    /// Records delivered in successful invocations (each counted once).
    pub records: u64,
    /// Invocations after which some records were done and committed.
    pub batches: u64,
    /// Invocations, duplicates and retries included.
    pub invocations: u64,
    /// Invocations that failed, wholly or partly (and were retried).
    pub failures: u64,
    /// Records given up on (retries exhausted or too old): sent to the on-failure
    /// destination, or skipped without one.
    pub given_up: u64,
    /// Records that matched none of the filters (`--filter`): not delivered, committed.
    pub filtered: u64,
    /// Wall time of the run.
    pub elapsed: Duration,
    /// Time from the first record received to the last batch completed (excludes the
    /// consumer group's join and the idle wait at the end): what throughput is measured over.
    pub active: Duration,
    /// Partition revocations seen (rebalances that took partitions away).
    pub revocations: u64,
    /// Buffered records dropped because their partition was revoked (its new owner
    /// reads them again).
    pub dropped: u64,
    /// The most invocations that were in flight at once.
    pub peak_in_flight: usize,
    /// Batches whose partitions were all revoked while they were in flight: their
    /// outcome was dropped.
    pub stale_completions: u64,
    /// From the start of the run to the first partitions assigned (the group join,
    /// after the starting positions were committed); `None` if none was.
    pub to_assignment: Option<Duration>,
    /// From the start of the run to the first record received.
    pub to_first_record: Option<Duration>,
    /// From the last batch done to the stop condition met (`until_idle`: the idle period
    /// and the caught-up check; `until_caught_up`: the check).
    pub stop_after_last_batch: Option<Duration>,
    /// The function's time per successful invocation (its first delivery, from the
    /// request sent to the response received), in completion order: the latency per
    /// batch that [`RunSummary::invocation_time_quantile`] summarises.
    pub invocation_times: Vec<Duration>,
}

impl RunSummary {
    /// Records per second from the first record received to the end of the run.
    pub fn records_per_second(&self) -> f64 {
        self.records as f64 / self.active.as_secs_f64().max(1e-9)
    }

    /// The `q` quantile (0 to 1, nearest rank) of [`RunSummary::invocation_times`];
    /// `None` when no invocation succeeded.
    pub fn invocation_time_quantile(&self, q: f64) -> Option<Duration> {
        let mut times = self.invocation_times.clone();
        times.sort();
        let rank = (q.clamp(0.0, 1.0) * times.len() as f64).ceil() as usize;
        times.get(rank.max(1) - 1).copied()
    }
}

/// `records, batches, retries, records/s, invocations in flight (and the peak), lag per
/// partition` (the lag: records after the committed position).
pub(super) fn progress_line(
    consumer: &GroupConsumer,
    offsets: &BaseConsumer,
    state: &Progress,
    in_flight: usize,
) -> String {
    let s = &state.summary;
    let lags: Vec<String> = consumer
        .assignment()
        .unwrap_or_default()
        .elements()
        .iter()
        .map(|element| {
            let tp = TopicPartition::new(element.topic(), element.partition());
            format!("{tp}={}", lag(offsets, state, &tp))
        })
        .collect();
    format!(
        "[local-runner] {} records, {} batches, {} retries, {} given up, {:.0} records/s; {} in flight (peak {}); lag {}",
        s.records,
        s.batches,
        s.failures,
        s.given_up,
        s.records_per_second(),
        in_flight,
        s.peak_in_flight,
        if lags.is_empty() {
            "-".to_owned()
        } else {
            lags.join(" ")
        }
    )
}

/// The records of `tp` after its position (buffered or committed); `<=n` when neither is
/// known yet, `?` when the end offset cannot be read.
fn lag(offsets: &BaseConsumer, state: &Progress, tp: &TopicPartition) -> String {
    let position = state
        .buffers
        .position(tp)
        .or_else(|| state.committed.get(tp).copied());
    match (
        position,
        offsets.fetch_watermarks(&tp.topic, tp.partition, Duration::from_millis(500)),
    ) {
        (Some(position), Ok((_, high))) => (high - position).max(0).to_string(),
        (None, Ok((low, high))) => format!("<={}", high - low),
        (_, Err(_)) => "?".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invocation_time_quantiles_are_nearest_rank() {
        let mut summary = RunSummary::default();
        assert_eq!(summary.invocation_time_quantile(0.5), None);
        // 1..=100 ms, completed out of order.
        summary.invocation_times = (1..=100u64).rev().map(Duration::from_millis).collect();
        let ms = |q| summary.invocation_time_quantile(q).map(|d| d.as_millis());
        // Nearest rank: the ceil(q * n)-th smallest.
        assert_eq!(ms(0.5), Some(50));
        assert_eq!(ms(0.99), Some(99));
        assert_eq!(ms(1.0), Some(100));
        assert_eq!(ms(0.0), Some(1));
    }
}
