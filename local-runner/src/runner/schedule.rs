//! Which batch goes next, by the event source's rules: a retry group once its backoff is
//! over, else a fresh batch of the partitions neither in flight nor retrying, once it is
//! full (batch size or 6 MB) or its batching window has closed. The events themselves are
//! formed by [`crate::batch`].

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use lambda_streams::event::{EventSource, KafkaEvent, TopicPartition};

use super::Runner;
use super::state::Progress;
use crate::batch::MAX_PAYLOAD_BYTES;
use crate::config::EventShape;

impl Runner {
    /// The event source the events name (MSK with its ARN, or self-managed).
    fn source(&self) -> EventSource {
        match &self.config.shape {
            EventShape::Msk { arn } => EventSource::Msk { arn: arn.clone() },
            EventShape::SelfManaged => EventSource::SelfManaged,
        }
    }

    /// The next batch to invoke, if one is due: a retry group whose backoff is over (at
    /// once with the records it failed with, or after gathering for the batching window),
    /// else a fresh batch. Returns the event and the retry group's remaining batch size
    /// limits.
    pub(super) fn next_batch(
        &self,
        state: &mut Progress,
        now: Instant,
    ) -> Option<(KafkaEvent, VecDeque<usize>)> {
        self.due_retry(state, now)
            .or_else(|| self.fresh_batch(state, now))
    }

    /// The first retry group that is due and has no partition in flight, as an event
    /// (retry groups left without records are dropped on the way).
    fn due_retry(
        &self,
        state: &mut Progress,
        now: Instant,
    ) -> Option<(KafkaEvent, VecDeque<usize>)> {
        let mut i = 0;
        while i < state.groups.len() {
            let group = &state.groups[i];
            let member = |tp: &TopicPartition| group.partitions.contains(tp);
            let (records, bytes) = state.buffers.count_where(member);
            if records == 0 {
                // Everything it held was given up on (or dropped).
                state.groups.remove(i);
                continue;
            }
            let limit = group
                .limits
                .front()
                .copied()
                .unwrap_or(self.config.batch_size);
            let due = now >= group.not_before
                && (!group.gather
                    || records >= limit
                    || bytes >= MAX_PAYLOAD_BYTES
                    || now >= group.not_before + self.config.batching_window);
            if due
                && !group
                    .partitions
                    .iter()
                    .any(|tp| state.in_flight.contains(tp))
            {
                let (source, servers) = (self.source(), &self.config.bootstrap_servers);
                let event = state
                    .buffers
                    .form_event_where(limit, member, &source, servers);
                let group = state.groups.remove(i);
                return Some((event, group.limits));
            }
            i += 1;
        }
        None
    }

    /// A fresh batch of the partitions neither in flight nor retrying, once it is full or
    /// its batching window (opened by its first record) has closed.
    fn fresh_batch(
        &self,
        state: &mut Progress,
        now: Instant,
    ) -> Option<(KafkaEvent, VecDeque<usize>)> {
        let (records, bytes) = state.buffers.count_where(|tp| state.fresh(tp));
        if records == 0 {
            state.window_opened = None;
            return None;
        }
        let opened = *state.window_opened.get_or_insert(now);
        let limit = self.config.batch_size;
        if records >= limit
            || bytes >= MAX_PAYLOAD_BYTES
            || now >= opened + self.config.batching_window
        {
            state.window_opened = None;
            let (source, servers) = (self.source(), &self.config.bootstrap_servers);
            let event =
                state
                    .buffers
                    .form_event_where(limit, |tp| state.fresh(tp), &source, servers);
            return Some((event, VecDeque::new()));
        }
        None
    }

    /// When [`next_batch`](Self::next_batch) may next have a batch without a new record
    /// arriving: the end of a batching window or of a retry's backoff.
    pub(super) fn next_deadline(&self, state: &Progress) -> Instant {
        let window = self.config.batching_window;
        let groups = state.groups.iter().map(|g| {
            if g.gather {
                g.not_before + window
            } else {
                g.not_before
            }
        });
        let fresh = state.window_opened.map(|opened| opened + window);
        groups
            .chain(fresh)
            .min()
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(1))
    }
}
