//! The runner's in-process handler carries every setting a function has in Lambda:
//! the same environment gives the handler `lambda::run` builds ([`Handler::from_config`])
//! and the one the runner invokes ([`InProcess::from_env`]), metrics included.
//!
//! The settings are environment variables: the test runs this test binary again as a
//! child process with them set (the crate forbids `unsafe`, so no `set_var`).

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use lambda_streams::lambda::{Config, Handler};
use lambda_streams::serdes::Utf8;
use lambda_streams::state::memory::MemoryStore;
use lambda_streams::{PoisonPolicy, StreamsBuilder};
use local_runner::InProcess;

/// Set in the child process: there, [`in_the_child`] checks the handlers.
const CHILD: &str = "LAMBDA_STREAMS_WIRING_TEST_CHILD";

#[test]
fn the_runner_wires_its_handler_as_lambda_does() {
    let output = Command::new(std::env::current_exe().expect("the test binary"))
        .args([
            "--exact",
            "in_the_child",
            "--include-ignored",
            "--nocapture",
        ])
        .env(CHILD, "1")
        .env("LAMBDA_STREAMS_BOOTSTRAP_SERVERS", "out-1:9092,out-2:9092")
        .env("LAMBDA_STREAMS_POISON_POLICY", "dead-letter:wiring-dlq")
        .env("LAMBDA_STREAMS_PARTIAL_BATCH_RESPONSE", "true")
        .env("LAMBDA_STREAMS_IDLE_PARTITION_TIMEOUT_MS", "1234")
        .env("LAMBDA_STREAMS_SOURCE_PARTITIONS", "wiring-in:3")
        .env("LAMBDA_STREAMS_METRICS", "emf")
        .env("LAMBDA_STREAMS_KAFKA_LINGER_MS", "7")
        .env_remove("AWS_LAMBDA_FUNCTION_NAME")
        .output()
        .expect("the child runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the child failed:\n{stdout}\n{stderr}"
    );
    // The child ran the check (and did not filter it away).
    assert!(
        stdout.contains("1 passed"),
        "the child ran no test:\n{stdout}"
    );
}

#[test]
#[ignore = "run by the_runner_wires_its_handler_as_lambda_does, with its environment"]
fn in_the_child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let topology = || {
        let builder = StreamsBuilder::new();
        builder
            .stream("wiring-in", Utf8, Utf8)
            .to("wiring-out", Utf8, Utf8);
        builder.build()
    };
    let store = || Arc::new(MemoryStore::new());
    let runner = InProcess::from_env(topology(), store()).expect("valid settings");
    let runner = runner.handler();

    // What the variables above say, by hand.
    assert_eq!(
        runner.options().poison,
        PoisonPolicy::DeadLetter {
            topic: "wiring-dlq".into()
        }
    );
    assert!(runner.options().partial_batch_response);
    assert_eq!(
        runner.options().idle_partition_timeout,
        Duration::from_millis(1234)
    );
    assert_eq!(
        runner.options().source_partitions.get("wiring-in"),
        Some(&3)
    );
    // LAMBDA_STREAMS_METRICS=emf outside Lambda: metrics under the name "local".
    assert_eq!(runner.metrics_function(), Some("local"));
    let (brokers, kafka) = runner.kafka_output().expect("output to Kafka");
    assert_eq!(brokers, Some("out-1:9092,out-2:9092"));
    assert_eq!(kafka.get("linger.ms"), Some("7"));

    // And the same as the handler of the Lambda adapter.
    let config = Config::from_env().expect("valid settings");
    let lambda = Handler::from_config(topology(), store(), &config);
    assert_eq!(runner.options(), lambda.options());
    assert_eq!(runner.metrics_function(), lambda.metrics_function());
    assert_eq!(runner.kafka_output(), lambda.kafka_output());
}
