//! The local runner as an event source mapping, on the real broker: how it forms batches,
//! when it commits, how it retries, honours partial batch responses, bisects, gives up
//! (to an on-failure destination topic) and where a new group starts.
//!
//! The function under the runner here is a real one written for the test: it decodes
//! each event with the framework's decoder, records what it got, and answers as a Lambda
//! function would (success, a function error, or a partial batch response). Assertions
//! are on structure (which records, in which events, in which order, what is committed),
//! never on durations.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lambda_streams::event::{KafkaEvent, TopicPartition};
use lambda_streams_e2e::*;
use local_runner::destination::{ATTEMPTS_HEADER, ERROR_HEADER, REASON_HEADER, SOURCE_HEADER};
use local_runner::runner::MAX_PAYLOAD_BYTES;
use local_runner::{InvokeError, RunSummary, Runner, RunnerConfig, StartingPosition, Transport};
use rdkafka::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};

/// One invocation as the function saw it.
struct Call {
    event: KafkaEvent,
    json_len: usize,
}

impl Call {
    /// `(partition, offset)` of every record, in event order.
    fn offsets(&self) -> Vec<(i32, i64)> {
        self.event
            .partitions
            .iter()
            .flat_map(|p| p.records.iter().map(move |r| (p.tp.partition, r.offset)))
            .collect()
    }

    fn contains(&self, partition: i32, offset: i64) -> bool {
        self.offsets().contains(&(partition, offset))
    }
}

type Answer = dyn Fn(&KafkaEvent, usize) -> Result<String, String> + Send + Sync;

/// A function that records every event and answers with `answer(event, call index)`:
/// `Ok(body)` is its response, `Err(message)` a function error.
struct Recorder {
    calls: Mutex<Vec<Call>>,
    answer: Box<Answer>,
}

impl Recorder {
    fn new(
        answer: impl Fn(&KafkaEvent, usize) -> Result<String, String> + Send + Sync + 'static,
    ) -> Arc<Self> {
        Arc::new(Recorder {
            calls: Mutex::new(Vec::new()),
            answer: Box::new(answer),
        })
    }

    fn succeeding() -> Arc<Self> {
        Recorder::new(|_, _| Ok(r#"{"batchItemFailures":[]}"#.into()))
    }

    fn take(&self) -> Vec<Call> {
        std::mem::take(&mut *self.calls.lock().expect("calls"))
    }
}

#[local_runner::async_trait]
impl Transport for Recorder {
    async fn invoke(&self, payload: Vec<u8>) -> Result<Vec<u8>, InvokeError> {
        let event = KafkaEvent::decode(&payload).expect("the runner's event decodes");
        let index = self.calls.lock().expect("calls").len();
        let answer = (self.answer)(&event, index);
        self.calls.lock().expect("calls").push(Call {
            event,
            json_len: payload.len(),
        });
        answer.map(String::into_bytes).map_err(InvokeError)
    }
}

/// A record to produce: partition, value, optional timestamp.
struct Out {
    partition: i32,
    value: Vec<u8>,
    timestamp: Option<i64>,
}

fn out(partition: i32, value: impl Into<Vec<u8>>) -> Out {
    Out {
        partition,
        value: value.into(),
        timestamp: None,
    }
}

async fn produce(topic: &str, records: Vec<Out>) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("enable.idempotence", "true")
        .set("message.max.bytes", "2000000")
        .create()
        .expect("producer");
    for r in records {
        let key = format!("k{}", r.partition);
        let mut record = FutureRecord::to(topic)
            .partition(r.partition)
            .key(&key)
            .payload(&r.value);
        if let Some(ts) = r.timestamp {
            record = record.timestamp(ts);
        }
        producer
            .send(record, Duration::from_secs(30))
            .await
            .expect("produced");
    }
}

async fn topic(name: &str, partitions: i32) -> String {
    new_topic(name, partitions).await
}

fn esm_config(topic: &str) -> RunnerConfig {
    RunnerConfig {
        bootstrap_servers: bootstrap(),
        group_id: unique("esm-group"),
        topics: vec![topic.to_owned()],
        batching_window: Duration::from_millis(100),
        until_idle: true,
        idle_timeout: Duration::from_millis(1500),
        retry_backoff: Duration::from_millis(10),
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

/// Per partition, the offsets in the order the function received them (all calls).
fn delivered(calls: &[Call]) -> BTreeMap<i32, Vec<i64>> {
    let mut by_partition: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
    for call in calls {
        for (p, o) in call.offsets() {
            by_partition.entry(p).or_default().push(o);
        }
    }
    by_partition
}

fn partial(topic: &str, partition: i32, offset: i64) -> String {
    serde_json::json!({"batchItemFailures": [
        {"itemIdentifier": {"topic-partition": format!("{topic}-{partition}"), "offset": offset}}
    ]})
    .to_string()
}

fn header(record: &Consumed, name: &str) -> String {
    String::from_utf8(record.headers.get(name).cloned().unwrap_or_default()).expect("utf-8 header")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_fills_to_its_size_across_partitions_in_offset_order() {
    require_services();
    let topic = topic("esm-fill", 3).await;
    let records = (0..3)
        .flat_map(|p| (0..30).map(move |i| out(p, format!("p{p}-{i}"))))
        .collect();
    produce(&topic, records).await;
    let function = Recorder::succeeding();
    let config = RunnerConfig {
        batch_size: 90,
        // Long enough that only the batch size can close the batch.
        batching_window: Duration::from_secs(60),
        ..esm_config(&topic)
    };
    let group = config.group_id.clone();
    let summary = run(config, function.clone()).await;
    let calls = function.take();
    assert_eq!(calls.len(), 1, "one event: the batch filled to its size");
    let event = &calls[0].event;
    assert_eq!(event.partitions.len(), 3, "three partitions in one event");
    for part in &event.partitions {
        let offsets: Vec<i64> = part.records.iter().map(|r| r.offset).collect();
        assert_eq!(
            offsets,
            (0..30).collect::<Vec<_>>(),
            "{} in offset order",
            part.tp
        );
        let first =
            String::from_utf8(part.records[0].value().expect("value").to_vec()).expect("utf-8");
        assert_eq!(first, format!("p{}-0", part.tp.partition));
    }
    assert_eq!(summary.records, 90);
    assert_eq!(
        committed(&group, &topic, 3),
        (0..3).map(|p| (p, Some(30))).collect(),
        "committed after success"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_size_and_batching_window_bound_every_event() {
    require_services();
    let topic = topic("esm-size", 1).await;
    produce(&topic, (0..250).map(|i| out(0, format!("r{i}"))).collect()).await;
    let function = Recorder::succeeding();
    let config = RunnerConfig {
        batch_size: 40,
        batching_window: Duration::from_millis(300),
        ..esm_config(&topic)
    };
    run(config, function.clone()).await;
    let calls = function.take();
    let sizes: Vec<usize> = calls.iter().map(|c| c.event.record_count()).collect();
    assert!(
        sizes.iter().all(|&n| n <= 40),
        "no event over the batch size: {sizes:?}"
    );
    assert!(
        sizes[..sizes.len() - 1].iter().all(|&n| n == 40),
        "full batches while records are waiting: {sizes:?}"
    );
    assert_eq!(
        sizes.last(),
        Some(&10),
        "the window closed the last, partial batch: {sizes:?}"
    );
    assert_eq!(
        delivered(&calls)[&0],
        (0..250).collect::<Vec<_>>(),
        "each once, in order"
    );

    // Fewer records than the batch size: the window alone closes the batch.
    let topic = self::topic("esm-window", 1).await;
    produce(&topic, (0..5).map(|i| out(0, format!("w{i}"))).collect()).await;
    let function = Recorder::succeeding();
    run(
        RunnerConfig {
            batch_size: 100,
            batching_window: Duration::from_millis(500),
            ..esm_config(&topic)
        },
        function.clone(),
    )
    .await;
    let calls = function.take();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].event.record_count(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_payload_stays_under_6_mb() {
    require_services();
    let topic = topic("esm-6mb", 1).await;
    // 900 kB values: 1.2 MB each in base64, so 5 fit in 6 MB and 6 do not.
    let big = |i: u8| vec![b'a' + i % 26; 900_000];
    produce(&topic, (0..12).map(|i| out(0, big(i))).collect()).await;
    let function = Recorder::succeeding();
    run(
        RunnerConfig {
            batch_size: 100,
            batching_window: Duration::from_millis(500),
            ..esm_config(&topic)
        },
        function.clone(),
    )
    .await;
    let calls = function.take();
    for call in &calls {
        assert!(
            call.json_len <= MAX_PAYLOAD_BYTES,
            "event of {} bytes",
            call.json_len
        );
        assert!(
            call.event.record_count() <= 5,
            "{} records",
            call.event.record_count()
        );
    }
    assert!(
        calls.len() >= 3,
        "12 records of 1.2 MB need at least 3 events"
    );
    assert!(
        calls.iter().any(|c| c.event.record_count() == 5),
        "a full event holds 5: {:?}",
        calls
            .iter()
            .map(|c| c.event.record_count())
            .collect::<Vec<_>>()
    );
    assert_eq!(delivered(&calls)[&0], (0..12).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_batch_is_retried_whole_and_committed_only_after_success() {
    require_services();
    let topic = topic("esm-commit", 2).await;
    let records = (0..2)
        .flat_map(|p| (0..10).map(move |i| out(p, format!("c{p}-{i}"))))
        .collect();
    produce(&topic, records).await;
    let config = RunnerConfig {
        batch_size: 20,
        batching_window: Duration::from_secs(60),
        ..esm_config(&topic)
    };
    let (group, t) = (config.group_id.clone(), topic.clone());
    // The function looks at the group's commits from inside each invocation.
    let seen: Arc<Mutex<Vec<Commits>>> = Arc::default();
    let seen_in = Arc::clone(&seen);
    let function = Recorder::new(move |_, call| {
        seen_in.lock().expect("seen").push(committed(&group, &t, 2));
        if call < 3 {
            Err(format!("failure number {}", call + 1))
        } else {
            Ok(String::new())
        }
    });
    let summary = run(config.clone(), function.clone()).await;
    let calls = function.take();
    assert_eq!(calls.len(), 4, "three failures, then success");
    for call in &calls {
        assert_eq!(
            call.event.record_count(),
            20,
            "the retried batch is the same whole batch"
        );
        assert_eq!(call.event.partitions.len(), 2);
    }
    // The runner commits the starting position (trim horizon: 0) before it starts.
    let start: Commits = (0..2).map(|p| (p, Some(0))).collect();
    assert!(
        seen.lock().expect("seen").iter().all(|c| *c == start),
        "nothing committed before the success: {:?}",
        seen.lock().expect("seen")
    );
    assert_eq!(
        committed(&config.group_id, &topic, 2),
        (0..2).map(|p| (p, Some(10))).collect(),
        "everything committed after it"
    );
    assert_eq!(
        (summary.failures, summary.records, summary.given_up),
        (3, 20, 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_batch_response_redelivers_the_reported_partition_from_its_offset() {
    require_services();
    let topic = topic("esm-partial", 2).await;
    let records = (0..2)
        .flat_map(|p| (0..20).map(move |i| out(p, format!("v{p}-{i}"))))
        .collect();
    produce(&topic, records).await;
    let t = topic.clone();
    let reported = Arc::new(Mutex::new(false));
    let function = Recorder::new(move |event, _| {
        let has_p0_5 = event
            .partitions
            .iter()
            .any(|p| p.tp == TopicPartition::new(&t, 0) && p.records.iter().any(|r| r.offset == 5));
        let mut reported = reported.lock().expect("flag");
        if has_p0_5 && !*reported {
            *reported = true;
            Ok(partial(&t, 0, 5))
        } else {
            Ok(r#"{"batchItemFailures":[]}"#.into())
        }
    });
    let config = esm_config(&topic);
    let group = config.group_id.clone();
    let summary = run(config, function.clone()).await;
    let calls = function.take();
    let failing = calls
        .iter()
        .position(|c| c.contains(0, 5))
        .expect("a call had partition 0, offset 5");
    let failing_last = calls[failing]
        .offsets()
        .iter()
        .filter(|(p, _)| *p == 0)
        .map(|(_, o)| *o)
        .max()
        .expect("partition 0 in the failing call");
    let by_partition = delivered(&calls);
    let expected_p0: Vec<i64> = (0..=failing_last).chain(5..20).collect();
    assert_eq!(
        by_partition[&0], expected_p0,
        "partition 0 redelivered from offset 5 (and only from there), in order"
    );
    assert_eq!(
        by_partition[&1],
        (0..20).collect::<Vec<_>>(),
        "partition 1 delivered once"
    );
    let next = &calls[failing + 1..];
    let first_p0_after = next
        .iter()
        .flat_map(Call::offsets)
        .find(|(p, _)| *p == 0)
        .map(|(_, o)| o);
    assert_eq!(
        first_p0_after,
        Some(5),
        "the next delivery of partition 0 starts at 5"
    );
    assert_eq!(
        summary.failures, 1,
        "the partial failure counts as a failed attempt"
    );
    assert_eq!(
        summary.records, 40,
        "every record delivered successfully once"
    );
    assert_eq!(
        committed(&group, &topic, 2),
        (0..2).map(|p| (p, Some(20))).collect()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_are_limited_and_given_up_records_go_to_the_on_failure_topic() {
    require_services();
    let topic = topic("esm-dlq", 2).await;
    let dlq = self::topic("esm-dlq-out", 1).await;
    // Partition 0: offsets 0..=3, the last one always reported failed.
    let mut records: Vec<Out> = (0..4).map(|i| out(0, format!("a{i}"))).collect();
    records.extend((0..6).map(|i| out(1, format!("b{i}"))));
    produce(&topic, records).await;
    let t = topic.clone();
    let function = Recorder::new(move |event, _| {
        let has_p0_3 = event
            .partitions
            .iter()
            .any(|p| p.tp.partition == 0 && p.records.iter().any(|r| r.offset == 3));
        Ok(if has_p0_3 {
            partial(&t, 0, 3)
        } else {
            String::new()
        })
    });
    let config = RunnerConfig {
        batch_size: 10,
        batching_window: Duration::from_secs(60),
        maximum_retry_attempts: Some(2),
        on_failure_topic: Some(dlq.clone()),
        ..esm_config(&topic)
    };
    let group = config.group_id.clone();
    let summary = run(config, function.clone()).await;
    let calls = function.take();
    assert_eq!(
        calls.iter().filter(|c| c.contains(0, 3)).count(),
        3,
        "the first delivery and 2 retries"
    );
    let by_partition = delivered(&calls);
    assert_eq!(
        by_partition[&0],
        [0, 1, 2, 3, 3, 3],
        "offsets 0..=2 once; 3 retried"
    );
    assert_eq!(by_partition[&1], (0..6).collect::<Vec<_>>());
    assert_eq!(summary.given_up, 1);
    assert_eq!(
        committed(&group, &topic, 2),
        BTreeMap::from([(0, Some(4)), (1, Some(6))])
    );

    let failed = read_topic(&dlq);
    assert_eq!(failed.len(), 1, "only the record given up on");
    let record = &failed[0];
    assert_eq!(record.value.as_deref(), Some(&b"a3"[..]));
    assert_eq!(record.key.as_deref(), Some(&b"k0"[..]), "the key is kept");
    assert_eq!(header(record, SOURCE_HEADER), format!("{topic}:0:3"));
    assert_eq!(header(record, REASON_HEADER), "RetriesExhausted");
    assert_eq!(header(record, ATTEMPTS_HEADER), "3");
    assert!(
        header(record, ERROR_HEADER).contains(&format!("{topic}-0@3")),
        "the error names the record: {}",
        header(record, ERROR_HEADER)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bisection_isolates_the_failing_record() {
    require_services();
    let topic = topic("esm-bisect", 1).await;
    let dlq = self::topic("esm-bisect-out", 1).await;
    produce(&topic, (0..16).map(|i| out(0, format!("x{i}"))).collect()).await;
    let function = Recorder::new(|event, _| {
        if event
            .partitions
            .iter()
            .any(|p| p.records.iter().any(|r| r.offset == 11))
        {
            Err("offset 11 is poison".into())
        } else {
            Ok(String::new())
        }
    });
    let config = RunnerConfig {
        batch_size: 16,
        // The batch size closes the first batch; the window only the remainder's.
        batching_window: Duration::from_secs(3),
        bisect_batch_on_function_error: true,
        maximum_retry_attempts: Some(1),
        on_failure_topic: Some(dlq.clone()),
        ..esm_config(&topic)
    };
    let summary = run(config, function.clone()).await;
    let calls = function.take();
    let sizes: Vec<usize> = calls.iter().map(|c| c.event.record_count()).collect();
    assert_eq!(sizes[0], 16, "{sizes:?}");
    let alone = calls
        .iter()
        .filter(|c| c.event.record_count() == 1 && c.contains(0, 11))
        .count();
    assert_eq!(
        alone, 2,
        "offset 11 alone: once, then one retry ({sizes:?})"
    );
    let succeeded: Vec<i64> = calls
        .iter()
        .filter(|c| !c.contains(0, 11))
        .flat_map(Call::offsets)
        .map(|(_, o)| o)
        .collect();
    let expected: Vec<i64> = (0..16).filter(|&o| o != 11).collect();
    assert_eq!(
        succeeded, expected,
        "every other record succeeded once, in order"
    );
    assert_eq!(summary.given_up, 1);
    let failed = read_topic(&dlq);
    assert_eq!(failed.len(), 1);
    assert_eq!(header(&failed[0], SOURCE_HEADER), format!("{topic}:0:11"));
    assert!(header(&failed[0], ERROR_HEADER).contains("offset 11 is poison"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starting_positions_and_resuming() {
    require_services();
    // LATEST: only what is produced after the runner fixed its start.
    let topic = topic("esm-latest", 1).await;
    produce(&topic, (0..5).map(|i| out(0, format!("old{i}"))).collect()).await;
    let config = RunnerConfig {
        starting_position: StartingPosition::Latest,
        ..esm_config(&topic)
    };
    let function = Recorder::succeeding();
    let runner = Runner::new(config.clone(), function.clone()).expect("runner");
    assert_eq!(runner.initialize_positions().expect("positions"), 1);
    produce(&topic, (0..3).map(|i| out(0, format!("new{i}"))).collect()).await;
    tokio::time::timeout(Duration::from_secs(120), runner.run())
        .await
        .expect("finished")
        .expect("ran");
    assert_eq!(delivered(&function.take())[&0], [5, 6, 7]);

    // An existing group resumes from its commits, whatever the starting position.
    produce(&topic, (0..2).map(|i| out(0, format!("more{i}"))).collect()).await;
    let function = Recorder::succeeding();
    let resumed = RunnerConfig {
        starting_position: StartingPosition::TrimHorizon,
        ..config
    };
    run(resumed, function.clone()).await;
    assert_eq!(delivered(&function.take())[&0], [8, 9]);

    // AT_TIMESTAMP: from the first record at or after the time.
    let topic = self::topic("esm-at", 1).await;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64;
    let base = now - 60_000;
    let records = (0..5)
        .map(|i| Out {
            partition: 0,
            value: format!("t{i}").into_bytes(),
            timestamp: Some(base + i * 1000),
        })
        .collect();
    produce(&topic, records).await;
    let function = Recorder::succeeding();
    run(
        RunnerConfig {
            starting_position: StartingPosition::AtTimestamp(base + 2000),
            ..esm_config(&topic)
        },
        function.clone(),
    )
    .await;
    let calls = function.take();
    assert_eq!(delivered(&calls)[&0], [2, 3, 4]);
    assert_eq!(
        calls[0].event.partitions[0].records[0].timestamp,
        base + 2000,
        "exact timestamps"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_over_the_maximum_age_are_given_up_not_delivered() {
    require_services();
    let topic = topic("esm-age", 1).await;
    let dlq = self::topic("esm-age-out", 1).await;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64;
    let hour_ago = now - 3_600_000;
    let records = [
        (hour_ago, "old0"),
        (now, "new1"),
        (hour_ago, "old2"),
        (now, "new3"),
    ]
    .into_iter()
    .map(|(ts, v)| Out {
        partition: 0,
        value: v.into(),
        timestamp: Some(ts),
    })
    .collect();
    produce(&topic, records).await;
    let function = Recorder::succeeding();
    let config = RunnerConfig {
        maximum_record_age: Some(Duration::from_secs(600)),
        on_failure_topic: Some(dlq.clone()),
        ..esm_config(&topic)
    };
    let group = config.group_id.clone();
    let summary = run(config, function.clone()).await;
    assert_eq!(delivered(&function.take())[&0], [1, 3]);
    assert_eq!(summary.given_up, 2);
    let failed = read_topic(&dlq);
    let sources: Vec<String> = failed.iter().map(|r| header(r, SOURCE_HEADER)).collect();
    assert_eq!(sources, [format!("{topic}:0:0"), format!("{topic}:0:2")]);
    assert!(
        failed
            .iter()
            .all(|r| header(r, REASON_HEADER) == "RecordAgeExceeded")
    );
    assert_eq!(committed(&group, &topic, 1), BTreeMap::from([(0, Some(4))]));
}

#[tokio::test]
async fn settings_that_cannot_work_are_refused_with_the_setting_named() {
    let function = Recorder::succeeding();
    let bad = [
        (
            RunnerConfig {
                topics: vec!["a".into()],
                on_failure_topic: Some("a".into()),
                ..RunnerConfig::default()
            },
            "on-failure topic",
        ),
        (
            RunnerConfig {
                topics: vec!["a".into()],
                batch_size: 10_001,
                ..RunnerConfig::default()
            },
            "batch size",
        ),
        (
            RunnerConfig {
                topics: vec!["a".into()],
                batching_window: Duration::from_secs(301),
                ..RunnerConfig::default()
            },
            "batching window",
        ),
    ];
    for (config, says) in bad {
        match Runner::new(config, function.clone()) {
            Err(e) => assert!(e.contains(says), "{e}"),
            Ok(_) => panic!("accepted a config with a bad {says}"),
        }
    }
}
