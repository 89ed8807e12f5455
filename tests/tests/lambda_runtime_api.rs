//! The Lambda path for real: `cargo lambda watch` builds and serves the `wordcount`
//! function on the Lambda runtime API, `cargo lambda invoke --data-file` sends a fixture
//! event, twice. The counts in DynamoDB (the emulator) must equal the counts computed
//! here from the fixture, after the first invocation and still after the second (a
//! redelivery changes nothing); the output topic on the real broker holds them too.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use lambda_streams_e2e::*;

fn fixture_counts(path: &Path) -> BTreeMap<String, i64> {
    let event: serde_json::Value =
        serde_json::from_slice(&std::fs::read(path).expect("fixture")).expect("json");
    let mut lines = Vec::new();
    for records in event["records"].as_object().expect("records").values() {
        for record in records.as_array().expect("list") {
            let value = STANDARD
                .decode(record["value"].as_str().expect("value"))
                .expect("base64");
            lines.push(String::from_utf8(value).expect("utf-8"));
        }
    }
    reference_counts(&lines)
}

fn invoke(port: u16, fixture: &Path) -> String {
    let output = Command::new("cargo")
        .args([
            "lambda",
            "invoke",
            "--invoke-address",
            "127.0.0.1",
            "--invoke-port",
            &port.to_string(),
            "wordcount",
            "--data-file",
        ])
        .arg(fixture)
        .stdin(Stdio::null())
        .current_dir(workspace())
        .output()
        .expect("cargo lambda invoke runs (is cargo-lambda installed? scripts/tools)");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "invoke failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cargo_lambda_watch_serves_wordcount_exactly_once() {
    require_services();
    let table = unique("lambda-api");
    let output_topic = unique("lambda-api-counts");
    lambda_streams::state::dynamodb::create_table(&dynamo_client(), &table)
        .await
        .expect("table");
    local_runner::admin::create_topic(&bootstrap(), &output_topic, 2)
        .await
        .expect("topic");

    let port = 9310;
    let mut env = emulator_env();
    env.extend([
        format!("LAMBDA_STREAMS_TABLE={table}"),
        format!("WORDCOUNT_OUTPUT_TOPIC={output_topic}"),
        "WORDCOUNT_REKEYING=direct".to_owned(),
        "WORDCOUNT_INPUT_TOPIC=text-lines".to_owned(),
        // The fixture's event names 127.0.0.1:9092; produce to the broker under test.
        format!("LAMBDA_STREAMS_BOOTSTRAP_SERVERS={}", bootstrap()),
    ]);
    let watch = LambdaWatch::start("wordcount", port, &env);

    let fixture = workspace().join("tests/fixtures/wordcount-event.json");
    let expected = fixture_counts(&fixture);
    let response = invoke(port, &fixture);
    assert!(
        response.contains("batchItemFailures"),
        "a success response: {response}"
    );
    assert_eq!(
        table_counts(&table, wordcount::STORE).await,
        expected,
        "counts after one invocation"
    );

    invoke(port, &fixture);
    assert_eq!(
        table_counts(&table, wordcount::STORE).await,
        expected,
        "a redelivery changes nothing"
    );

    let emitted = emitted_counts(&output_topic);
    assert_eq!(emitted, expected, "the highest-version output per word");
    drop(watch);
}
