//! One run's loop: each turn drops what was revoked, gives up too old records, dispatches
//! the batches that are due (up to the concurrency), applies backpressure, checks the stop
//! conditions, and then waits for the first of: an invocation completing (settled and
//! committed), a record arriving (buffered), or the next deadline (a batching window,
//! a backoff, the idle timeout).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use tokio::task::{Id, JoinSet};

use super::commit::{CaughtUp, caught_up};
use super::consume::{TakenIn, take_in};
use super::invoke::{Dispatched, Invoked};
use super::report::{RunSummary, progress_line};
use super::state::Progress;
use super::{GroupConsumer, Runner};
use crate::destination::FailureDestination;
use crate::schema::SchemaValidation;

/// A run in progress: its clients, its state, the batches in flight and its clocks.
pub(super) struct Session<'r> {
    runner: &'r Runner,
    started: Instant,
    consumer: GroupConsumer,
    /// The client for end offsets (see [`Runner::offsets_client`]).
    offsets: BaseConsumer,
    destination: Option<FailureDestination>,
    /// The event source's schema validation, if set.
    validation: Option<SchemaValidation>,
    /// What `until_caught_up` waits for (`None` without it).
    targets: Option<CaughtUp>,
    state: Progress,
    tasks: JoinSet<Invoked>,
    dispatched: HashMap<Id, Dispatched>,
    last_progress: Instant,
    last_activity: Instant,
    first_record: Option<Instant>,
    /// After a consumer error, reading waits a little (the loop goes on meanwhile).
    read_after: Option<Instant>,
    /// Whether `until_caught_up` is to be checked (a batch was settled).
    settled: bool,
}

impl<'r> Session<'r> {
    /// Connects, commits the starting positions, reads what `until_caught_up` waits for,
    /// and subscribes.
    pub(super) fn open(runner: &'r Runner) -> Result<Self, String> {
        let started = Instant::now();
        let consumer = runner.consumer()?;
        let offsets = runner.offsets_client()?;
        runner.initialize_positions()?;
        let targets = runner.targets(&consumer, &offsets)?;
        let config = &runner.config;
        let topics: Vec<&str> = config.topics.iter().map(String::as_str).collect();
        consumer
            .subscribe(&topics)
            .map_err(|e| format!("cannot subscribe to {topics:?}: {e}"))?;
        let destination = match &config.on_failure_topic {
            Some(topic) => Some(FailureDestination::new(&config.bootstrap_servers, topic)?),
            None => None,
        };
        let validation = match &config.schema_validation {
            Some(settings) => Some(SchemaValidation::new(settings.clone())?),
            None => None,
        };
        Ok(Session {
            runner,
            started,
            consumer,
            offsets,
            destination,
            validation,
            targets,
            state: Progress::default(),
            tasks: JoinSet::new(),
            dispatched: HashMap::new(),
            last_progress: Instant::now(),
            last_activity: Instant::now(),
            first_record: None,
            read_after: None,
            settled: false,
        })
    }

    /// One turn of the loop; returns when the run stopped, once it has.
    pub(super) async fn turn(&mut self) -> Result<Option<Instant>, String> {
        self.state.drop_stale(&self.consumer);
        self.dispatch_due().await?;
        self.runner
            .apply_backpressure(&self.consumer, &mut self.state);
        let idle = self.tasks.is_empty() && self.state.buffers.is_empty();
        if self.stop_condition_met(idle)? {
            return Ok(Some(Instant::now()));
        }
        self.print_progress();
        let now = Instant::now();
        let reading = self.read_after.is_none_or(|t| now >= t);
        let wake = self.wake_at(now, idle, reading);
        tokio::select! {
            biased;
            Some(joined) = self.tasks.join_next_with_id(), if !self.tasks.is_empty() => {
                self.complete(Invoked::joined(joined)).await?;
            }
            received = self.consumer.recv(), if reading => match received {
                Err(e) => {
                    tracing::warn!(error = %e, "consumer error");
                    self.read_after = Some(Instant::now() + Duration::from_millis(100));
                }
                Ok(message) => {
                    self.read_after = None;
                    let config = &self.runner.config;
                    let filter = (!config.filter.is_empty()
                        && !config.unfiltered_topics.iter().any(|t| t == message.topic()))
                    .then_some(&config.filter);
                    let taken = take_in(
                        &self.consumer,
                        &mut self.state,
                        filter,
                        message,
                        self.validation.as_ref(),
                    )?;
                    if !matches!(taken, TakenIn::Dropped) {
                        let now = Instant::now();
                        self.first_record = self.first_record.or(Some(now));
                        self.last_activity = now;
                    }
                    if let TakenIn::Invalid(tp, record, failure) = taken {
                        self.runner
                            .give_up_invalid(
                                &self.consumer,
                                &mut self.state,
                                self.destination.as_ref(),
                                &tp,
                                *record,
                                failure,
                            )
                            .await?;
                    }
                }
            },
            () = tokio::time::sleep_until(wake) => {}
        }
        Ok(None)
    }

    /// Gives up too old records, then starts the batches that are due, up to the
    /// concurrency.
    async fn dispatch_due(&mut self) -> Result<(), String> {
        let runner = self.runner;
        let concurrency = runner.config.concurrency;
        if self.tasks.len() < concurrency {
            // Before a batch can form: too old records are not delivered.
            runner
                .give_up_old_records(&self.consumer, &mut self.state, self.destination.as_ref())
                .await?;
        }
        while self.tasks.len() < concurrency {
            let Some((event, limits)) = runner.next_batch(&mut self.state, Instant::now()) else {
                break;
            };
            let (id, batch) = runner.dispatch(event, limits, &mut self.state, &mut self.tasks);
            self.dispatched.insert(id, batch);
        }
        let peak = &mut self.state.summary.peak_in_flight;
        *peak = (*peak).max(self.tasks.len());
        Ok(())
    }

    /// Whether the run is to stop: `until_idle` and idle, with everything assigned
    /// committed; or `until_caught_up` and caught up. Commits refused during a rebalance
    /// are tried again here.
    fn stop_condition_met(&mut self, idle: bool) -> Result<bool, String> {
        let runner = self.runner;
        if idle && self.last_activity.elapsed() >= runner.config.idle_timeout {
            runner.commit(&self.consumer, &mut self.state)?;
            if runner.config.until_idle && caught_up(&self.consumer, &self.offsets)? {
                return Ok(true);
            }
            self.last_activity = Instant::now();
        }
        if let Some(targets) = self.targets.as_mut() {
            // With nothing left to do here, the group's commits are read again (now and
            // then): a partition done by another runner before it came here counts.
            if idle && targets.refresh_due() {
                runner.commit(&self.consumer, &mut self.state)?;
                targets.refresh(&self.consumer)?;
                self.settled = true;
            }
            if std::mem::take(&mut self.settled) && targets.reached(&self.consumer, &self.state) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// With `progress`, the progress line, once a second.
    fn print_progress(&mut self) {
        if !self.runner.config.progress || self.last_progress.elapsed() < Duration::from_secs(1) {
            return;
        }
        self.last_progress = Instant::now();
        self.state.summary.active = self.first_record.map_or(Duration::ZERO, |t| t.elapsed());
        eprintln!(
            "{}",
            progress_line(&self.consumer, &self.offsets, &self.state, self.tasks.len())
        );
    }

    /// When to wake up if nothing completes and no record arrives: the next deadline of a
    /// batch, a refresh of `until_caught_up`, the idle timeout, the end of a read pause;
    /// at most a second from now.
    fn wake_at(&self, now: Instant, idle: bool, reading: bool) -> tokio::time::Instant {
        let config = &self.runner.config;
        let mut wake = now + Duration::from_secs(1);
        if let Some(targets) = self.targets.as_ref().filter(|_| idle) {
            wake = wake.min(targets.next_refresh());
        }
        if self.tasks.len() < config.concurrency {
            wake = wake.min(self.runner.next_deadline(&self.state));
        }
        if idle {
            wake = wake.min(self.last_activity + config.idle_timeout);
        }
        if let Some(t) = self.read_after.filter(|_| !reading) {
            wake = wake.min(t);
        }
        tokio::time::Instant::from_std(wake.max(now + Duration::from_millis(1)))
    }

    /// Settles a completed invocation, gives up what exhausted its retries, and commits.
    async fn complete(&mut self, (id, invoked): (Id, Invoked)) -> Result<(), String> {
        let runner = self.runner;
        let batch = self
            .dispatched
            .remove(&id)
            .ok_or("an unknown invocation completed")?;
        let live = runner.settle(&batch, invoked, &mut self.state);
        runner
            .give_up_exhausted(
                &batch.event,
                &live,
                &mut self.state,
                self.destination.as_ref(),
            )
            .await?;
        runner.commit(&self.consumer, &mut self.state)?;
        self.last_activity = Instant::now();
        self.settled = true;
        Ok(())
    }

    /// Ends the run that stopped at `stopped`: the batches still in flight (of other
    /// partitions, records produced since the start) end and are committed, so nothing
    /// is delivered twice; then the summary.
    pub(super) async fn finish(mut self, stopped: Instant) -> Result<RunSummary, String> {
        while let Some(joined) = self.tasks.join_next_with_id().await {
            let (id, invoked) = Invoked::joined(joined);
            let batch = self
                .dispatched
                .remove(&id)
                .ok_or("an unknown invocation completed")?;
            self.runner.settle(&batch, invoked, &mut self.state);
        }
        self.runner.commit(&self.consumer, &mut self.state)?;
        let assignment = self.consumer.context().assignment();
        let summary = &mut self.state.summary;
        summary.revocations = assignment.revocations();
        summary.to_assignment = assignment
            .first_assigned()
            .map(|t| t.saturating_duration_since(self.started));
        drop(assignment);
        summary.to_first_record = self
            .first_record
            .map(|t| t.saturating_duration_since(self.started));
        summary.stop_after_last_batch = self
            .state
            .last_done
            .map(|last| stopped.saturating_duration_since(last));
        summary.elapsed = self.started.elapsed();
        summary.active = match (self.first_record, self.state.last_done) {
            (Some(first), Some(last)) => last.saturating_duration_since(first),
            _ => Duration::ZERO,
        };
        Ok(self.state.summary)
    }
}
