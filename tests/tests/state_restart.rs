//! Scenario 7 of the exactly-once proof: the local runner is killed with SIGKILL in the
//! middle of a stream (state written, offsets not all committed), then started again. The
//! final DynamoDB counts and the highest-version output per word equal a count computed
//! here: the restart redelivers what was not committed, and the watermarks absorb it.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lambda_streams_e2e::*;
use local_runner::admin;

const PARTITIONS: i32 = 3;

fn runner(input: &str, output: &str, table: &str, group: &str) -> Command {
    let mut command = runner_process(input, output, table, group);
    command
        .args(["--idle-timeout-ms", "1500"])
        .stdout(Stdio::null());
    command
}

fn committed(group: &str, topic: &str) -> i64 {
    committed_total(group, topic, PARTITIONS)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runner_killed_mid_stream_then_restarted_is_exact() {
    require_services();
    let (input, output) = (unique("sigkill-lines"), unique("sigkill-counts"));
    let (table, group) = (unique("sigkill"), unique("sigkill-group"));
    admin::create_topic(&bootstrap(), &input, PARTITIONS)
        .await
        .expect("input");
    admin::create_topic(&bootstrap(), &output, PARTITIONS)
        .await
        .expect("output");
    let lines = sample_text(3000, 7);
    produce_across_partitions(&input, &lines, PARTITIONS).await;

    let mut first = runner(&input, &output, &table, &group)
        .spawn()
        .expect("runner starts");
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let done = committed(&group, &input);
        if done > 0 {
            assert!(
                done < lines.len() as i64,
                "killed mid-stream, not after the end ({done} committed)"
            );
            break;
        }
        assert!(Instant::now() < deadline, "the runner made no progress");
        assert!(
            first.try_wait().expect("status").is_none(),
            "the runner exited early"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    first.kill().expect("SIGKILL");
    first.wait().expect("reaped");

    let status = runner(&input, &output, &table, &group)
        .arg("--until-idle")
        .status()
        .expect("restart");
    assert!(status.success(), "the restarted runner finished");

    let expected = reference_counts(&lines);
    assert_eq!(table_counts(&table, wordcount::STORE).await, expected);
    // The interactive query of one key agrees.
    let (word, count) = expected.iter().next().expect("a word");
    let query = Command::new("cargo")
        .args([
            "run",
            "--quiet",
            "-p",
            "lambda-streams-local-runner",
            "--",
            "query",
        ])
        .args([
            "--store",
            wordcount::STORE,
            "--table",
            &table,
            "--dynamodb-endpoint",
            &dynamo_endpoint(),
            "--key",
            word,
        ])
        .stdin(Stdio::null())
        .output()
        .expect("query runs");
    let printed: serde_json::Value = serde_json::from_slice(&query.stdout).expect("one JSON line");
    assert_eq!(printed["value"], *count, "query --key {word}");
    let emitted = emitted_counts(&output);
    assert_eq!(emitted, expected);
}

/// The runner aborts after a batch succeeded but before its commit (the ESM's "invocation
/// done, offsets not committed" case); the restarted runner delivers that batch again,
/// and the counts stay exact. Also an invocation that fails before reaching the function.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_between_invocation_and_commit_then_restart_is_exact() {
    require_services();
    let (input, output) = (unique("abort-lines"), unique("abort-counts"));
    let (table, group) = (unique("abort"), unique("abort-group"));
    admin::create_topic(&bootstrap(), &input, PARTITIONS)
        .await
        .expect("input");
    admin::create_topic(&bootstrap(), &output, PARTITIONS)
        .await
        .expect("output");
    let lines = sample_text(600, 11);
    produce_across_partitions(&input, &lines, PARTITIONS).await;

    let crashed = runner(&input, &output, &table, &group)
        .args([
            "--crash-before-commit",
            "3",
            "--fail-invocation",
            "2",
            "--until-idle",
        ])
        .status()
        .expect("runner runs");
    assert!(
        !crashed.success(),
        "the runner aborted before its third commit"
    );
    let done = committed(&group, &input);
    assert!(
        done < lines.len() as i64,
        "not everything was committed ({done})"
    );

    let status = runner(&input, &output, &table, &group)
        .arg("--until-idle")
        .status()
        .expect("restart");
    assert!(status.success(), "the restarted runner finished");
    let expected = reference_counts(&lines);
    assert_eq!(table_counts(&table, wordcount::STORE).await, expected);
    let emitted = emitted_counts(&output);
    assert_eq!(emitted, expected);
}
