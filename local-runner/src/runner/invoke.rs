//! Invoking: a batch is started as its own task with the faults that apply to it
//! ([`Plan`]), and comes back as an [`Outcome`] judged from the function's response
//! ([`crate::response`]).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lambda_streams::event::{KafkaEvent, TopicPartition};
use tokio::task::{Id, JoinError, JoinSet};

use super::Runner;
use super::state::Progress;
use crate::response::{Verdict, judge};
use crate::transport::Transport;

/// What one invocation came to.
pub(super) enum Outcome {
    Success,
    Partial(BTreeMap<TopicPartition, i64>),
    Failed(String),
    /// The function succeeded but the response was lost (an injected fault): nothing is
    /// done, and no failed attempt is counted.
    Lost,
}

/// What an invocation task reports back to the loop.
pub(super) struct Invoked {
    pub(super) outcome: Outcome,
    /// Invocations it made beyond the first (a duplicate delivery).
    pub(super) extra_invocations: u64,
    /// How long the function took for the batch: the first invocation, from the request
    /// sent to the response received (`None`: not invoked).
    pub(super) invocation_time: Option<Duration>,
}

impl Invoked {
    /// What a task that panicked or was cancelled came to: a failed invocation.
    pub(super) fn task_failed(e: &JoinError) -> Self {
        Invoked {
            outcome: Outcome::Failed(format!("the invocation task failed: {e}")),
            extra_invocations: 0,
            invocation_time: None,
        }
    }

    /// A finished task's id and report, whether it ended or failed.
    pub(super) fn joined(joined: Result<(Id, Invoked), JoinError>) -> (Id, Invoked) {
        match joined {
            Ok((id, invoked)) => (id, invoked),
            Err(e) => (e.id(), Invoked::task_failed(&e)),
        }
    }
}

/// How one batch is to be invoked: the faults that apply to it.
struct Plan {
    /// The batch's number (counting batches formed).
    number: u64,
    /// The number of its (first) invocation, counting every invocation started.
    invocation: u64,
    fail: bool,
    duplicate: bool,
    crash_before_commit: bool,
    lose_response: bool,
    report_batch_item_failures: bool,
}

/// A batch in flight, as the loop remembers it.
pub(super) struct Dispatched {
    pub(super) event: Arc<KafkaEvent>,
    /// The lease (see [`crate::rebalance`]) each of its partitions was read under.
    pub(super) leases: BTreeMap<TopicPartition, u64>,
    /// The batch size limits of the retry group it was formed for (empty: a fresh batch).
    pub(super) limits: VecDeque<usize>,
}

impl Runner {
    /// Starts the invocation of `event` as a task; returns the task's id and what the loop
    /// keeps of the batch.
    pub(super) fn dispatch(
        &self,
        event: KafkaEvent,
        limits: VecDeque<usize>,
        state: &mut Progress,
        tasks: &mut JoinSet<Invoked>,
    ) -> (Id, Dispatched) {
        state.batch_number += 1;
        state.summary.invocations += 1;
        let plan = self.plan(state.batch_number, state.summary.invocations);
        let mut leases = BTreeMap::new();
        for part in &event.partitions {
            state.in_flight.insert(part.tp.clone());
            if let Some(&lease) = state.leases.get(&part.tp) {
                leases.insert(part.tp.clone(), lease);
            }
        }
        let event = Arc::new(event);
        let handle = tasks.spawn(invoke(
            Arc::clone(&self.transport),
            Arc::clone(&event),
            plan,
        ));
        let batch = Dispatched {
            event,
            leases,
            limits,
        };
        (handle.id(), batch)
    }

    /// The faults of the configuration that apply to batch `number`, whose first
    /// invocation is invocation `invocation`.
    fn plan(&self, number: u64, invocation: u64) -> Plan {
        let faults = &self.config.faults;
        let every = |n: Option<u64>| n.is_some_and(|n| n > 0 && number.is_multiple_of(n));
        Plan {
            number,
            invocation,
            fail: faults.fail_invocation == Some(invocation),
            duplicate: every(faults.duplicate_every),
            crash_before_commit: faults.crash_before_commit == Some(number),
            lose_response: every(faults.extend_retry_every),
            report_batch_item_failures: self.config.report_batch_item_failures,
        }
    }
}

/// One batch's invocation (twice with the duplicate fault), run as its own task, and
/// what it came to.
async fn invoke(transport: Arc<dyn Transport>, event: Arc<KafkaEvent>, plan: Plan) -> Invoked {
    let mut extra_invocations = 0;
    if plan.fail {
        return Invoked {
            outcome: Outcome::Failed(format!(
                "injected failure of invocation {}",
                plan.invocation
            )),
            extra_invocations,
            invocation_time: None,
        };
    }
    let payload = event.to_json();
    // The payload is kept (a copy of up to 6 MB) only for a duplicate delivery.
    let duplicate = plan.duplicate.then(|| payload.clone());
    let started = Instant::now();
    let mut result = transport.invoke(payload).await;
    let invocation_time = Some(started.elapsed());
    if let Some(payload) = duplicate.filter(|_| result.is_ok()) {
        extra_invocations += 1;
        result = transport.invoke(payload).await;
    }
    let outcome = match result {
        Err(e) => Outcome::Failed(e.0),
        Ok(_) if !plan.report_batch_item_failures => Outcome::Success,
        Ok(body) => match judge(&body, &event) {
            Verdict::Success => Outcome::Success,
            Verdict::Partial(resume) => Outcome::Partial(resume),
            Verdict::Invalid(why) => Outcome::Failed(format!("invalid response: {why}")),
        },
    };
    if matches!(outcome, Outcome::Success) && plan.crash_before_commit {
        eprintln!(
            "[local-runner] injected crash: batch {} succeeded, aborting before its commit",
            plan.number
        );
        std::process::abort();
    }
    if matches!(outcome, Outcome::Success) && plan.lose_response {
        // Injected: the response was lost; the retry is a longer batch from the same
        // offsets (not a failure of the function: no attempt is counted).
        return Invoked {
            outcome: Outcome::Lost,
            extra_invocations,
            invocation_time,
        };
    }
    Invoked {
        outcome,
        extra_invocations,
        invocation_time,
    }
}
