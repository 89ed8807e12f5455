//! How the local runner stops and joins its group, on the real broker: `until_caught_up`
//! (stop as soon as the records there were at the start are done, without an idle
//! period), and the KIP-848 consumer group protocol (`group.protocol=consumer`, through
//! the consumer properties): partitions are assigned, and a restart resumes from the
//! committed offsets.
//!
//! Assertions are on which records were delivered and what was committed; the one bound
//! on a duration (the stop comes well before an idle period would end) is generous.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lambda_streams::event::KafkaEvent;
use lambda_streams_e2e::*;
use local_runner::{InvokeError, RunSummary, Runner, RunnerConfig, Transport};
use rdkafka::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};

/// A function that records the `(partition, offset)` of every record it is given.
#[derive(Default)]
struct Recorder {
    seen: Mutex<Vec<(i32, i64)>>,
}

impl Recorder {
    /// Per partition, the offsets delivered, in order; then forgets them.
    fn take(&self) -> BTreeMap<i32, Vec<i64>> {
        let mut by_partition: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
        for (p, o) in std::mem::take(&mut *self.seen.lock().expect("seen")) {
            by_partition.entry(p).or_default().push(o);
        }
        by_partition
    }
}

#[local_runner::async_trait]
impl Transport for Recorder {
    async fn invoke(&self, payload: Vec<u8>) -> Result<Vec<u8>, InvokeError> {
        let event = KafkaEvent::decode(&payload).expect("the runner's event decodes");
        let mut seen = self.seen.lock().expect("seen");
        for part in &event.partitions {
            seen.extend(part.records.iter().map(|r| (part.tp.partition, r.offset)));
        }
        Ok(br#"{"batchItemFailures":[]}"#.to_vec())
    }
}

/// Produces `count` records to each of `partitions`.
async fn produce(topic: &str, partitions: &[i32], count: usize) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("enable.idempotence", "true")
        .create()
        .expect("producer");
    for &p in partitions {
        for i in 0..count {
            let value = format!("p{p}-{i}");
            producer
                .send(
                    FutureRecord::to(topic)
                        .partition(p)
                        .key("k")
                        .payload(&value),
                    Duration::from_secs(30),
                )
                .await
                .expect("produced");
        }
    }
}

async fn topic(name: &str, partitions: i32) -> String {
    new_topic(name, partitions).await
}

fn config(topic: &str, group: &str) -> RunnerConfig {
    RunnerConfig {
        bootstrap_servers: bootstrap(),
        group_id: group.to_owned(),
        topics: vec![topic.to_owned()],
        batch_size: 25,
        batching_window: Duration::from_millis(100),
        until_caught_up: true,
        // Far longer than any stop below: the runner must not wait for an idle period.
        idle_timeout: Duration::from_secs(60),
        ..RunnerConfig::default()
    }
}

async fn run(config: RunnerConfig, function: Arc<Recorder>) -> RunSummary {
    let runner = Runner::new(config, function).expect("runner");
    tokio::time::timeout(Duration::from_secs(120), runner.run())
        .await
        .expect("the runner stopped")
        .expect("the runner succeeded")
}

fn offsets(range: std::ops::Range<i64>) -> Vec<i64> {
    range.collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn until_caught_up_stops_once_the_records_at_the_start_are_done() {
    require_services();
    let topic = topic("stop-caught-up", 3).await;
    produce(&topic, &[0, 1, 2], 40).await;
    let group = unique("stop-caught-up-group");
    let function = Arc::new(Recorder::default());

    let summary = run(config(&topic, &group), function.clone()).await;
    let delivered = function.take();
    for p in 0..3 {
        assert_eq!(
            delivered[&p],
            offsets(0..40),
            "partition {p}: each record once, in order"
        );
    }
    assert_eq!(summary.records, 120);
    assert_eq!(
        committed(&group, &topic, 3),
        (0..3).map(|p| (p, Some(40))).collect(),
        "committed up to the end offsets of the start"
    );
    let stop = summary.stop_after_last_batch.expect("a batch was done");
    assert!(
        stop < Duration::from_secs(10),
        "stopped {stop:?} after the last batch: no idle period (60 s) was waited for"
    );
    assert!(summary.to_assignment.is_some() && summary.to_first_record.is_some());

    // Nothing new: caught up at the start, it stops without delivering anything.
    let summary = run(config(&topic, &group), function.clone()).await;
    assert_eq!(summary.records, 0);
    assert!(function.take().is_empty(), "nothing delivered again");

    // New records in one partition: exactly those are delivered, and committed.
    produce(&topic, &[1], 10).await;
    let summary = run(config(&topic, &group), function.clone()).await;
    assert_eq!(summary.records, 10);
    assert_eq!(function.take(), BTreeMap::from([(1, offsets(40..50))]));
    assert_eq!(committed(&group, &topic, 3)[&1], Some(50));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kip_848_consumer_protocol_assigns_partitions_and_resumes_after_a_restart() {
    require_services();
    let topic = topic("stop-kip848", 2).await;
    produce(&topic, &[0, 1], 20).await;
    let group = unique("stop-kip848-group");
    let kip848 = |group: &str| RunnerConfig {
        consumer_properties: vec![("group.protocol".into(), "consumer".into())],
        ..config(&topic, group)
    };
    let function = Arc::new(Recorder::default());

    let summary = run(kip848(&group), function.clone()).await;
    assert!(summary.to_assignment.is_some(), "partitions were assigned");
    assert_eq!(
        function.take(),
        BTreeMap::from([(0, offsets(0..20)), (1, offsets(0..20))])
    );
    assert_eq!(
        committed(&group, &topic, 2),
        BTreeMap::from([(0, Some(20)), (1, Some(20))])
    );

    // A restart resumes from the commits: only the new records are delivered.
    produce(&topic, &[0, 1], 5).await;
    let summary = run(kip848(&group), function.clone()).await;
    assert_eq!(summary.records, 10);
    assert_eq!(
        function.take(),
        BTreeMap::from([(0, offsets(20..25)), (1, offsets(20..25))])
    );
    assert_eq!(
        committed(&group, &topic, 2),
        BTreeMap::from([(0, Some(25)), (1, Some(25))])
    );

    // The same group with --until-idle (the classic idle stop) still works on it.
    produce(&topic, &[1], 3).await;
    let idle = RunnerConfig {
        until_caught_up: false,
        until_idle: true,
        idle_timeout: Duration::from_millis(500),
        ..kip848(&group)
    };
    let summary = run(idle, function.clone()).await;
    assert_eq!(summary.records, 3);
    assert_eq!(function.take(), BTreeMap::from([(1, offsets(25..28))]));
}

#[test]
fn stop_conditions_and_the_runners_own_consumer_properties_are_checked() {
    let base = config("t", "g");
    let both = RunnerConfig {
        until_idle: true,
        ..base.clone()
    };
    let e = Runner::new(both, Arc::new(Recorder::default()))
        .err()
        .expect("two stop conditions are refused");
    assert!(
        e.contains("until-idle") && e.contains("until-caught-up"),
        "{e}"
    );
    let own = RunnerConfig {
        consumer_properties: vec![("enable.auto.commit".into(), "true".into())],
        ..base
    };
    let e = Runner::new(own, Arc::new(Recorder::default()))
        .err()
        .expect("the runner's own property is refused");
    assert!(e.contains("enable.auto.commit"), "{e}");
}
