//! The local runner over the Lambda Invoke API: `cargo lambda watch` builds and serves the
//! real `wordcount` function; the runner consumes a real topic and invokes it over HTTP
//! (`POST /2015-03-31/functions/wordcount/invocations`), in its default mode: the words go
//! through a repartition topic that the runner consumes too. The counts in DynamoDB must
//! equal a count computed here, and each word's updates reach the output in order. Then a record the function cannot decode (not UTF-8) makes it
//! fail: the function error arrives over HTTP, bisection isolates the record, and after
//! its retry it goes to the on-failure topic, while the good record beside it is counted.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use lambda_streams_e2e::*;
use local_runner::destination::{REASON_HEADER, SOURCE_HEADER};
use local_runner::{Http, Runner, RunnerConfig, Transport, admin};
use rdkafka::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};

const PARTITIONS: i32 = 3;

async fn produce_raw(topic: &str, partition: i32, values: &[&[u8]]) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .expect("producer");
    for value in values {
        producer
            .send(
                FutureRecord::<(), [u8]>::to(topic)
                    .partition(partition)
                    .payload(value),
                Duration::from_secs(30),
            )
            .await
            .expect("produced");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runner_invokes_cargo_lambda_watch_over_http() {
    require_services();
    let (input, repartition, output, dlq, table) = (
        unique("http-lines"),
        unique("http-words"),
        unique("http-counts"),
        unique("http-failed"),
        unique("http-state"),
    );
    let servers = bootstrap();
    for (topic, partitions) in [
        (&input, PARTITIONS),
        (&repartition, PARTITIONS),
        (&output, PARTITIONS),
        (&dlq, 1),
    ] {
        admin::create_topic(&servers, topic, partitions)
            .await
            .expect("topic");
    }
    lambda_streams::state::dynamodb::create_table(&dynamo_client(), &table)
        .await
        .expect("table");
    let mut lines = sample_text(240, 20);
    produce_across_partitions(&input, &lines, PARTITIONS).await;

    let mut env = emulator_env();
    env.extend([
        format!("LAMBDA_STREAMS_TABLE={table}"),
        format!("WORDCOUNT_INPUT_TOPIC={input}"),
        format!("WORDCOUNT_OUTPUT_TOPIC={output}"),
        // The default mode: the words through a repartition topic, which the runner
        // consumes too (a second event source in Lambda).
        format!("WORDCOUNT_REPARTITION_TOPIC={repartition}"),
    ]);
    let port = free_port();
    let watch = LambdaWatch::start("wordcount", port, &env);
    let http: Arc<dyn Transport> =
        Arc::new(Http::new(&format!("http://127.0.0.1:{port}"), "wordcount").expect("endpoint"));
    let config = RunnerConfig {
        bootstrap_servers: servers.clone(),
        group_id: unique("http-group"),
        topics: vec![input.clone(), repartition.clone()],
        batch_size: 50,
        batching_window: Duration::from_millis(200),
        until_idle: true,
        idle_timeout: Duration::from_millis(1500),
        retry_backoff: Duration::from_millis(50),
        bisect_batch_on_function_error: true,
        maximum_retry_attempts: Some(1),
        on_failure_topic: Some(dlq.clone()),
        ..RunnerConfig::default()
    };
    let runner = Runner::new(config.clone(), Arc::clone(&http)).expect("runner");
    // The first invocation may wait for `cargo lambda watch` to compile the function.
    let summary = tokio::time::timeout(Duration::from_secs(900), runner.run())
        .await
        .expect("the runner finished")
        .expect("the runner succeeded");
    let reference = reference_counts(&lines);
    let words: i64 = reference.values().sum();
    assert_eq!(
        summary.records,
        lines.len() as u64 + words as u64,
        "every line, then every word through the repartition topic"
    );
    assert_eq!(summary.given_up, 0);
    assert_eq!(
        table_counts(&table, wordcount::STORE).await,
        reference,
        "DynamoDB counts equal the reference"
    );
    // One writer per word: its updates reach the output in order, the last one its count.
    let mut last: BTreeMap<String, i64> = BTreeMap::new();
    for record in read_topic(&output) {
        let word = String::from_utf8(record.key.expect("key")).expect("utf-8");
        let count: i64 = String::from_utf8(record.value.expect("value"))
            .expect("utf-8")
            .parse()
            .expect("a count");
        let previous = last.insert(word.clone(), count).unwrap_or(0);
        assert!(count >= previous, "{word}: {count} after {previous}");
    }
    assert_eq!(last, reference, "the last update per word is its count");

    // A record that is not UTF-8 beside a good one, both in partition 0.
    let good = "Lambda streams over HTTP";
    produce_raw(&input, 0, &[b"\xff\xfe not utf-8", good.as_bytes()]).await;
    let runner = Runner::new(config, http).expect("runner");
    let summary = tokio::time::timeout(Duration::from_secs(300), runner.run())
        .await
        .expect("the runner finished")
        .expect("the runner succeeded");
    assert_eq!(
        summary.given_up, 1,
        "the poison record, given up after one retry"
    );
    assert!(summary.failures >= 2, "its function errors were retried");
    lines.push(good.to_owned());
    assert_eq!(
        table_counts(&table, wordcount::STORE).await,
        reference_counts(&lines),
        "the good record beside it was counted"
    );
    let failed = read_topic(&dlq);
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].value.as_deref(), Some(&b"\xff\xfe not utf-8"[..]));
    let source = String::from_utf8(failed[0].headers[SOURCE_HEADER].clone()).expect("utf-8");
    assert!(source.starts_with(&format!("{input}:0:")), "{source}");
    assert_eq!(failed[0].headers[REASON_HEADER], b"RetriesExhausted");
    drop(watch);
}
