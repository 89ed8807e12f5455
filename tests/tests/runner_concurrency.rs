//! The local runner invokes several partitions at once, as the event source does, and
//! never two batches of one partition; a partition whose batches fail retries on its own
//! while the others go on. On the real broker.
//!
//! The function under the runner records when each invocation started and ended, and
//! sleeps a little in each so that overlapping invocations can be observed. Assertions are
//! on what was observed (which invocations overlapped, which records each one held, what
//! was committed when), never on durations.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lambda_streams::event::KafkaEvent;
use lambda_streams_e2e::*;
use local_runner::{InvokeError, RunSummary, Runner, RunnerConfig, Transport, admin};

/// One invocation as the function saw it.
struct Call {
    event: KafkaEvent,
    start: Instant,
    end: Instant,
    succeeded: bool,
}

impl Call {
    fn partitions(&self) -> Vec<i32> {
        self.event
            .partitions
            .iter()
            .map(|p| p.tp.partition)
            .collect()
    }

    fn has(&self, partition: i32) -> bool {
        self.partitions().contains(&partition)
    }

    fn overlaps(&self, other: &Call) -> bool {
        self.start < other.end && other.start < self.end
    }
}

type Answer = dyn Fn(&KafkaEvent) -> Result<(), String> + Send + Sync;

/// A function that sleeps `work` per invocation (`first_work` for the first
/// `first_calls` ones), records it, and answers with `answer(event)`: `Ok` is success,
/// `Err` a function error.
struct Recorder {
    work: Duration,
    first_work: Duration,
    first_calls: usize,
    started: AtomicUsize,
    calls: Mutex<Vec<Call>>,
    answer: Box<Answer>,
}

impl Recorder {
    fn new(
        work: Duration,
        answer: impl Fn(&KafkaEvent) -> Result<(), String> + Send + Sync + 'static,
    ) -> Arc<Self> {
        Arc::new(Recorder {
            work,
            first_work: work,
            first_calls: 0,
            started: AtomicUsize::new(0),
            calls: Mutex::new(Vec::new()),
            answer: Box::new(answer),
        })
    }

    /// A succeeding function whose first `first_calls` invocations take `first_work`.
    fn slow_at_first(first_calls: usize, first_work: Duration, work: Duration) -> Arc<Self> {
        Arc::new(Recorder {
            work,
            first_work,
            first_calls,
            started: AtomicUsize::new(0),
            calls: Mutex::new(Vec::new()),
            answer: Box::new(|_| Ok(())),
        })
    }

    /// The calls in the order they started.
    fn take(&self) -> Vec<Call> {
        let mut calls = std::mem::take(&mut *self.calls.lock().expect("calls"));
        calls.sort_by_key(|c| c.start);
        calls
    }
}

#[local_runner::async_trait]
impl Transport for Recorder {
    async fn invoke(&self, payload: Vec<u8>) -> Result<Vec<u8>, InvokeError> {
        let start = Instant::now();
        let event = KafkaEvent::decode(&payload).expect("the runner's event decodes");
        let index = self.started.fetch_add(1, Ordering::SeqCst);
        let work = if index < self.first_calls {
            self.first_work
        } else {
            self.work
        };
        tokio::time::sleep(work).await;
        let answer = (self.answer)(&event);
        self.calls.lock().expect("calls").push(Call {
            event,
            start,
            end: Instant::now(),
            succeeded: answer.is_ok(),
        });
        answer
            .map(|()| br#"{"batchItemFailures":[]}"#.to_vec())
            .map_err(InvokeError)
    }
}

async fn topic_with(name: &str, partitions: i32, per_partition: usize) -> String {
    let topic = unique(name);
    admin::create_topic(&bootstrap(), &topic, partitions)
        .await
        .expect("topic");
    for p in 0..partitions {
        let lines = (0..per_partition).map(|i| format!("p{p}-{i}"));
        admin::produce_lines(&bootstrap(), &topic, lines, Some(p))
            .await
            .expect("produced");
    }
    topic
}

fn config(topic: &str, concurrency: usize) -> RunnerConfig {
    RunnerConfig {
        bootstrap_servers: bootstrap(),
        group_id: unique("concurrency-group"),
        topics: vec![topic.to_owned()],
        batch_size: 10,
        batching_window: Duration::from_millis(50),
        until_idle: true,
        idle_timeout: Duration::from_millis(1500),
        retry_backoff: Duration::from_millis(100),
        concurrency,
        ..RunnerConfig::default()
    }
}

async fn run(config: RunnerConfig, function: Arc<Recorder>) -> RunSummary {
    let runner = Runner::new(config, function).expect("runner");
    tokio::time::timeout(Duration::from_secs(180), runner.run())
        .await
        .expect("the runner finished")
        .expect("the runner succeeded")
}

/// Per partition, the offsets of the successful calls, in the order the calls started.
fn delivered_ok(calls: &[Call]) -> BTreeMap<i32, Vec<i64>> {
    let mut by_partition: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
    for call in calls.iter().filter(|c| c.succeeded) {
        for part in &call.event.partitions {
            let offsets = by_partition.entry(part.tp.partition).or_default();
            offsets.extend(part.records.iter().map(|r| r.offset));
        }
    }
    by_partition
}

/// Every call holds contiguous offsets of each of its partitions, and no two calls
/// holding the same partition overlap in time.
fn assert_one_batch_per_partition(calls: &[Call]) {
    for call in calls {
        for part in &call.event.partitions {
            let offsets: Vec<i64> = part.records.iter().map(|r| r.offset).collect();
            assert!(
                offsets.windows(2).all(|w| w[1] == w[0] + 1),
                "{} contiguous in one event: {offsets:?}",
                part.tp
            );
        }
    }
    for (i, a) in calls.iter().enumerate() {
        for b in &calls[i + 1..] {
            let shared: Vec<i32> = a.partitions().into_iter().filter(|p| b.has(*p)).collect();
            assert!(
                shared.is_empty() || !a.overlaps(b),
                "two batches of partitions {shared:?} in flight at once"
            );
        }
    }
}

/// The most calls in flight at one instant.
fn most_overlapping(calls: &[Call]) -> usize {
    calls
        .iter()
        .map(|c| {
            calls
                .iter()
                .filter(|o| o.start <= c.start && c.start < o.end)
                .count()
        })
        .max()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_are_invoked_in_parallel_never_two_batches_of_one_partition() {
    require_services();
    let (partitions, per_partition) = (4, 60);
    let topic = topic_with("conc-parallel", partitions, per_partition).await;
    let function = Recorder::new(Duration::from_millis(150), |_| Ok(()));
    let config = config(&topic, 4);
    let group = config.group_id.clone();
    let summary = run(config, function.clone()).await;
    let calls = function.take();

    let overlapping = most_overlapping(&calls);
    eprintln!(
        "{} calls, at most {overlapping} overlapping; runner peak in flight {}",
        calls.len(),
        summary.peak_in_flight
    );
    assert!(
        overlapping >= 2,
        "two invocations overlapped in time (observed {overlapping})"
    );
    assert!(overlapping <= 4, "never more than the concurrency");
    assert!((2..=4).contains(&summary.peak_in_flight));
    assert_one_batch_per_partition(&calls);
    let expected: Vec<i64> = (0..per_partition as i64).collect();
    for (p, offsets) in delivered_ok(&calls) {
        assert_eq!(offsets, expected, "partition {p}: each once, in order");
    }
    assert_eq!(
        summary.records,
        (partitions as usize * per_partition) as u64
    );
    assert_eq!(summary.failures, 0);
    assert_eq!(
        committed(&group, &topic, partitions),
        (0..partitions)
            .map(|p| (p, Some(per_partition as i64)))
            .collect(),
        "everything committed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_partition_retries_on_its_own_while_the_others_progress() {
    require_services();
    let (partitions, per_partition, failures) = (4, 40, 4);
    let topic = topic_with("conc-failing", partitions, per_partition).await;
    let config = config(&topic, 4);
    let (group, t) = (config.group_id.clone(), topic.clone());
    // Each failing call of partition 0 looks at what the group has committed meanwhile.
    let seen: Arc<Mutex<Vec<Commits>>> = Arc::default();
    let seen_in = Arc::clone(&seen);
    let function = Recorder::new(Duration::from_millis(30), move |event| {
        if !event.partitions.iter().any(|p| p.tp.partition == 0) {
            return Ok(());
        }
        let mut seen = seen_in.lock().expect("seen");
        if seen.len() < failures {
            seen.push(committed(&group, &t, partitions));
            Err(format!("partition 0 failure number {}", seen.len()))
        } else {
            Ok(())
        }
    });
    let config_group = config.group_id.clone();
    let summary = run(config, function.clone()).await;
    let calls = function.take();
    let seen = seen.lock().expect("seen").clone();
    assert_eq!(seen.len(), failures);

    // While partition 0 was still failing, the other partitions were committed.
    let others = |c: &Commits| -> i64 { (1..partitions).map(|p| c[&p].unwrap_or(0)).sum() };
    let at_last_failure = seen.last().expect("failures");
    eprintln!("commits seen by the failing calls of partition 0: {seen:?}");
    assert!(
        others(at_last_failure) > others(&seen[0]),
        "other partitions committed more while partition 0 was retrying: {seen:?}"
    );
    assert_eq!(
        at_last_failure[&0],
        Some(0),
        "nothing of partition 0 committed before its success"
    );
    let first_failure = calls
        .iter()
        .find(|c| c.has(0) && !c.succeeded)
        .expect("a failed call");
    let first_p0_success = calls
        .iter()
        .find(|c| c.has(0) && c.succeeded)
        .expect("partition 0 succeeded at last");
    // (The failing call itself looks up commits, so it can outlast the others' batches:
    // "meanwhile" counts from its start.)
    let meanwhile = calls
        .iter()
        .filter(|c| !c.has(0) && c.start > first_failure.start && c.end < first_p0_success.start)
        .count();
    assert!(
        meanwhile > 0,
        "other partitions were invoked between partition 0's first failure and its success"
    );

    // Partition 0 completes exactly: its failed batches are retried from the same offsets.
    assert_one_batch_per_partition(&calls);
    let expected: Vec<i64> = (0..per_partition as i64).collect();
    let delivered = delivered_ok(&calls);
    assert_eq!(delivered.len(), partitions as usize);
    for (p, offsets) in delivered {
        assert_eq!(offsets, expected, "partition {p}: each once, in order");
    }
    let mut next_p0 = 0;
    for call in calls.iter().filter(|c| c.has(0)) {
        let part = call
            .event
            .partitions
            .iter()
            .find(|p| p.tp.partition == 0)
            .expect("partition 0");
        assert_eq!(
            part.records[0].offset, next_p0,
            "each batch of partition 0 starts where the last success ended"
        );
        if call.succeeded {
            next_p0 = part.records.last().expect("records").offset + 1;
        }
    }
    assert_eq!(summary.failures, failures as u64);
    assert_eq!(
        summary.records,
        (partitions as usize * per_partition) as u64
    );
    assert_eq!(
        committed(&config_group, &topic, partitions),
        (0..partitions)
            .map(|p| (p, Some(per_partition as i64)))
            .collect()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_concurrency_one_invocations_never_overlap() {
    require_services();
    let (partitions, per_partition) = (3, 30);
    let topic = topic_with("conc-one", partitions, per_partition).await;
    let function = Recorder::new(Duration::from_millis(50), |_| Ok(()));
    let config = config(&topic, 1);
    let group = config.group_id.clone();
    let summary = run(config, function.clone()).await;
    let calls = function.take();
    assert_eq!(summary.peak_in_flight, 1);
    assert_eq!(most_overlapping(&calls), 1, "one invocation at a time");
    for pair in calls.windows(2) {
        assert!(pair[0].end <= pair[1].start, "sequential invocations");
    }
    assert_one_batch_per_partition(&calls);
    let expected: Vec<i64> = (0..per_partition as i64).collect();
    for (p, offsets) in delivered_ok(&calls) {
        assert_eq!(offsets, expected, "partition {p}: each once, in order");
    }
    assert_eq!(
        committed(&group, &topic, partitions),
        (0..partitions)
            .map(|p| (p, Some(per_partition as i64)))
            .collect()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_in_flight_when_its_partition_is_revoked_is_dropped_not_committed() {
    require_services();
    let (partitions, per_partition) = (2, 20);
    let topic = topic_with("conc-revoke", partitions, per_partition).await;
    // Runner A owns both partitions; its first two invocations (one per partition) take
    // 8 s, during which runner B joins the group: the eager rebalance revokes A's
    // partitions while their batches are in flight.
    let slow = Recorder::slow_at_first(2, Duration::from_secs(8), Duration::from_millis(20));
    let fast = Recorder::new(Duration::from_millis(20), |_| Ok(()));
    let a_config = RunnerConfig {
        idle_timeout: Duration::from_secs(3),
        ..config(&topic, 2)
    };
    let group = a_config.group_id.clone();
    // B stays until A is done (a member leaving is one more rebalance, which could revoke
    // a later batch of A's too).
    let b_config = RunnerConfig {
        group_id: group.clone(),
        idle_timeout: Duration::from_secs(10),
        ..config(&topic, 2)
    };
    let a = tokio::spawn(run(a_config, slow.clone()));
    let deadline = Instant::now() + Duration::from_secs(60);
    while slow.started.load(Ordering::SeqCst) < 2 {
        assert!(
            Instant::now() < deadline,
            "runner A never invoked its first batches"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let joined = Instant::now();
    let b = tokio::spawn(run(b_config, fast.clone()));
    let (a, b) = (a.await.expect("runner A"), b.await.expect("runner B"));
    let (slow_calls, fast_calls) = (slow.take(), fast.take());
    eprintln!(
        "A: {} calls, {} revocations, {} stale completions; B: {} calls, {} revocations",
        slow_calls.len(),
        a.revocations,
        a.stale_completions,
        fast_calls.len(),
        b.revocations
    );
    let first_slow_end = slow_calls.iter().map(|c| c.end).min().expect("A's calls");
    let first_fast_start = fast_calls.first().map(|c| c.start);
    assert!(
        first_fast_start.is_some_and(|s| s > joined && s < first_slow_end),
        "B was invoked while A's first batches were still in flight: the rebalance was served meanwhile"
    );
    assert!(a.revocations >= 2, "A's partitions were revoked");
    assert!(
        a.stale_completions >= 1,
        "a batch of A completed after its partition was revoked, and was dropped"
    );
    // The first batches of A completed after the revocation: none of them counts, and
    // their records are delivered again (by B, or by A under its new assignment) from
    // the offsets the group had committed, each once and in order.
    let first_batches: Vec<&Call> = slow_calls.iter().take(2).collect();
    assert!(
        first_batches
            .iter()
            .all(|c| c.end > first_fast_start.expect("B ran"))
    );
    let mut after: Vec<Call> = slow_calls.into_iter().skip(2).chain(fast_calls).collect();
    after.sort_by_key(|c| c.start);
    assert_one_batch_per_partition(&after);
    let expected: Vec<i64> = (0..per_partition as i64).collect();
    let delivered = delivered_ok(&after);
    assert_eq!(delivered.len(), partitions as usize);
    for (p, offsets) in delivered {
        assert_eq!(offsets, expected, "partition {p}: each once, in order");
    }
    assert_eq!(
        a.records + b.records,
        (partitions as usize * per_partition) as u64,
        "records counted by the runners: the dropped batches do not count"
    );
    assert_eq!(
        committed(&group, &topic, partitions),
        (0..partitions)
            .map(|p| (p, Some(per_partition as i64)))
            .collect()
    );
}
