//! WordCount, end to end on the real broker and the DynamoDB emulator, through the
//! local runner, with the redeliveries the Kafka event source can produce injected on
//! purpose. The counts in DynamoDB, and per word the `word-counts` record with the
//! highest version, must equal a count computed independently here.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use lambda_streams::Guarantee;
use lambda_streams::lambda::Handler;
use lambda_streams::state::Store;
use lambda_streams::state::dynamodb::{DynamoStore, create_table, emulator_lean_client};
use lambda_streams::state::fault::FaultyStore;
use lambda_streams_e2e::*;
use local_runner::{Faults, InProcess, Runner, RunnerConfig, admin};

const PARTITIONS: i32 = 3;

struct Scenario {
    faults: Faults,
    fail_after_writes: Option<u64>,
    guarantee: Guarantee,
    batch_size: usize,
    /// Tombstones (null lines) produced to each partition after the text.
    tombstones: usize,
    /// State writes through the store's lean client instead of the AWS SDK.
    lean: bool,
}

impl Default for Scenario {
    fn default() -> Self {
        Scenario {
            faults: Faults::default(),
            fail_after_writes: None,
            guarantee: Guarantee::ExactlyOnce,
            batch_size: 40,
            tombstones: 0,
            lean: false,
        }
    }
}

struct Outcome {
    expected: BTreeMap<String, i64>,
    stored: BTreeMap<String, i64>,
    emitted: BTreeMap<String, (u64, String)>,
    invocations: u64,
    failures: u64,
}

/// Produces a known text to a fresh 3-partition topic, runs wordcount over it through
/// the local runner until idle, and reads back the state and the output.
async fn run(name: &str, scenario: Scenario) -> Outcome {
    require_services();
    let (input, output, table) = (
        unique(&format!("{name}-lines")),
        unique(&format!("{name}-counts")),
        unique(name),
    );
    let servers = bootstrap();
    admin::create_topic(&servers, &input, PARTITIONS)
        .await
        .expect("input topic");
    admin::create_topic(&servers, &output, PARTITIONS)
        .await
        .expect("output topic");
    let lines = sample_text(300, name.len() as u64);
    produce_across_partitions(&input, &lines, PARTITIONS).await;
    let tombstones = vec![("null-line".to_owned(), None); scenario.tombstones];
    for p in 0..PARTITIONS {
        produce_keyed(&input, &tombstones, Some(p)).await;
    }

    let client = dynamo_client();
    create_table(&client, &table).await.expect("table");
    let dynamo = DynamoStore::new(client, table.clone(), scenario.guarantee);
    let dynamo = if scenario.lean {
        dynamo.with_lean_client(emulator_lean_client(&dynamo_endpoint()).expect("a lean client"))
    } else {
        dynamo
    };
    let store: Arc<dyn Store> = match scenario.fail_after_writes {
        Some(n) => Arc::new(FaultyStore::fail_once_after(dynamo, n)),
        None => Arc::new(dynamo),
    };
    let handler =
        Handler::with_kafka_output(wordcount::topology_direct(&input, &output), store, None);
    let config = RunnerConfig {
        bootstrap_servers: servers,
        group_id: unique("group"),
        topics: vec![input],
        batch_size: scenario.batch_size,
        batching_window: Duration::from_millis(100),
        until_idle: true,
        idle_timeout: Duration::from_millis(500),
        retry_backoff: Duration::from_millis(10),
        faults: scenario.faults,
        ..RunnerConfig::default()
    };
    let runner = Runner::new(config, Arc::new(InProcess::new(Arc::new(handler)))).expect("runner");
    let summary = tokio::time::timeout(Duration::from_secs(120), runner.run())
        .await
        .expect("the runner finished in time")
        .expect("the runner succeeded");
    assert_eq!(
        summary.records,
        (lines.len() + scenario.tombstones * PARTITIONS as usize) as u64,
        "every record delivered once to a successful batch"
    );

    Outcome {
        expected: reference_counts(&lines),
        stored: table_counts(&table, wordcount::STORE).await,
        emitted: latest_by_version(&read_topic(&output)),
        invocations: summary.invocations,
        failures: summary.failures,
    }
}

fn assert_exact(outcome: &Outcome) {
    assert_eq!(
        outcome.stored, outcome.expected,
        "DynamoDB counts equal the reference"
    );
    let emitted: BTreeMap<String, i64> = outcome
        .emitted
        .iter()
        .map(|(k, (_, v))| (k.clone(), v.parse().expect("decimal count")))
        .collect();
    assert_eq!(
        emitted, outcome.expected,
        "the highest-version output per word equals the reference"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_run_is_exact() {
    let outcome = run("clean", Scenario::default()).await;
    assert_eq!(outcome.failures, 0);
    assert_exact(&outcome);
}

/// Null lines (tombstones) in `text-lines` have no words: the counts are the text's, and no
/// batch fails (the default poison policy is `fail`, so a poison record would stop its
/// partition and the runner would not finish).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tombstone_lines_count_no_words() {
    let outcome = run(
        "tombstones",
        Scenario {
            tombstones: 2,
            ..Scenario::default()
        },
    )
    .await;
    assert_eq!(outcome.failures, 0);
    assert_exact(&outcome);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_some_item_writes_then_retry_is_exact() {
    for k in [0, 3, 17] {
        let outcome = run(
            &format!("crash{k}"),
            Scenario {
                fail_after_writes: Some(k),
                ..Scenario::default()
            },
        )
        .await;
        assert_eq!(
            outcome.failures, 1,
            "exactly one injected failure (k = {k})"
        );
        assert_exact(&outcome);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_batch_delivered_twice_is_exact() {
    let faults = Faults {
        duplicate_every: Some(1),
        ..Faults::default()
    };
    let outcome = run(
        "dup",
        Scenario {
            faults,
            ..Scenario::default()
        },
    )
    .await;
    assert!(
        outcome.invocations >= 2 * 4,
        "duplicates were delivered ({} invocations)",
        outcome.invocations
    );
    assert_exact(&outcome);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_with_a_longer_batch_is_exact() {
    let faults = Faults {
        extend_retry_every: Some(2),
        ..Faults::default()
    };
    let outcome = run(
        "extend",
        Scenario {
            faults,
            ..Scenario::default()
        },
    )
    .await;
    assert_exact(&outcome);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_faults_together_are_exact() {
    let faults = Faults {
        duplicate_every: Some(3),
        extend_retry_every: Some(2),
        fail_invocation: Some(4),
        ..Faults::default()
    };
    let outcome = run(
        "all",
        Scenario {
            faults,
            fail_after_writes: Some(5),
            batch_size: 25,
            ..Scenario::default()
        },
    )
    .await;
    assert_exact(&outcome);
}

/// [`all_faults_together_are_exact`] with the state writes through the store's lean client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_faults_together_are_exact_through_the_lean_client() {
    let faults = Faults {
        duplicate_every: Some(3),
        extend_retry_every: Some(2),
        fail_invocation: Some(4),
        ..Faults::default()
    };
    let outcome = run(
        "all-lean",
        Scenario {
            faults,
            fail_after_writes: Some(5),
            batch_size: 25,
            lean: true,
            ..Scenario::default()
        },
    )
    .await;
    assert_exact(&outcome);
}

/// The control: without the offset conditions, the same duplicate deliveries do count
/// twice. It shows that the exact results above come from the guarantee, and that the
/// test can tell.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_least_once_double_counts_duplicates() {
    let faults = Faults {
        duplicate_every: Some(1),
        ..Faults::default()
    };
    let outcome = run(
        "alo",
        Scenario {
            faults,
            guarantee: Guarantee::AtLeastOnce,
            ..Scenario::default()
        },
    )
    .await;
    let doubled: BTreeMap<String, i64> = outcome
        .expected
        .iter()
        .map(|(k, v)| (k.clone(), 2 * v))
        .collect();
    assert_eq!(outcome.stored, doubled, "every batch was applied twice");
}
