//! Scale-out: several local runner processes in one consumer group share a 4-partition
//! topic. One is killed with SIGKILL mid-stream (its partitions move to the others once
//! its session expires) and a third one joins (a rebalance while the survivor works).
//! The run ends when the group has committed every record; then the DynamoDB counts and
//! the highest-version output per word equal a count computed here.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use lambda_streams_e2e::*;
use local_runner::admin;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

const PARTITIONS: i32 = 4;
/// How long the whole scenario may take before the test gives up (not a timing assert:
/// only a bound on a stuck run).
const DEADLINE: Duration = Duration::from_secs(900);

fn runner(input: &str, output: &str, table: &str, group: &str, log: &Path) -> Command {
    let mut command = runner_process(input, output, table, group);
    command.stdout(File::create(log).expect("log file"));
    command
}

fn client(group: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", group)
        .create()
        .expect("consumer")
}

fn committed(group: &str, topic: &str) -> i64 {
    committed_total(group, topic, PARTITIONS)
}

/// Members of the group once it is stable (`None` while it rebalances).
fn stable_members(group: &str) -> Option<usize> {
    let list = client(group)
        .fetch_group_list(Some(group), Duration::from_secs(10))
        .ok()?;
    let info = list.groups().iter().find(|g| g.name() == group)?;
    (info.state() == "Stable").then_some(info.members().len())
}

/// Waits until `done` holds, failing if a runner exited meanwhile or the deadline passed.
fn wait_for(what: &str, runners: &mut [&mut Child], started: Instant, done: impl Fn() -> bool) {
    loop {
        if done() {
            return;
        }
        for runner in runners.iter_mut() {
            assert!(
                runner.try_wait().expect("status").is_none(),
                "a runner exited while waiting for {what}"
            );
        }
        assert!(started.elapsed() < DEADLINE, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn stop(mut runner: Child) {
    runner.kill().expect("SIGKILL");
    runner.wait().expect("reaped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runners_sharing_a_group_survive_a_kill_and_a_join_exactly() {
    require_services();
    let (input, output) = (unique("scale-lines"), unique("scale-counts"));
    let (table, group) = (unique("scale"), unique("scale-group"));
    admin::create_topic(&bootstrap(), &input, PARTITIONS)
        .await
        .expect("input");
    admin::create_topic(&bootstrap(), &output, PARTITIONS)
        .await
        .expect("output");
    let lines = sample_text(4000, 11);
    let total = lines.len() as i64;
    let started = Instant::now();
    let logs: Vec<PathBuf> = (0..3)
        .map(|i| std::env::temp_dir().join(format!("{group}-runner-{i}.log")))
        .collect();

    // Two runners share the group before any record exists: both get partitions.
    let mut first = runner(&input, &output, &table, &group, &logs[0])
        .spawn()
        .expect("first runner starts");
    wait_for(
        "the first runner to join",
        &mut [&mut first],
        started,
        || stable_members(&group) == Some(1),
    );
    let mut second = runner(&input, &output, &table, &group, &logs[1])
        .spawn()
        .expect("second runner starts");
    wait_for(
        "both runners in the group",
        &mut [&mut first, &mut second],
        started,
        || stable_members(&group) == Some(2),
    );
    produce_across_partitions(&input, &lines, PARTITIONS).await;

    // The first one dies mid-stream, without leaving the group.
    wait_for(
        "a first commit",
        &mut [&mut first, &mut second],
        started,
        || committed(&group, &input) > 0,
    );
    stop(first);
    let at_kill = committed(&group, &input);
    assert!(
        at_kill < total,
        "killed mid-stream, not after the end ({at_kill} of {total} committed)"
    );

    // A third one joins while the second works; the dead one's partitions move once its
    // session expires. Everything gets committed, by whoever owns it by then.
    let mut third = runner(&input, &output, &table, &group, &logs[2])
        .spawn()
        .expect("third runner starts");
    wait_for(
        "every record committed",
        &mut [&mut second, &mut third],
        started,
        || committed(&group, &input) == total,
    );
    stop(second);
    stop(third);

    // The group's assignor is eager: every rebalance revokes every partition first, so
    // the first runner saw one when the second joined.
    let logs: Vec<String> = logs
        .iter()
        .map(|path| {
            let log = std::fs::read_to_string(path).unwrap_or_default();
            let _ = std::fs::remove_file(path);
            log
        })
        .collect();
    for (i, log) in logs.iter().enumerate() {
        for line in log
            .lines()
            .filter(|l| l.contains("rebalance") || l.contains("dropped") || l.contains("refused"))
        {
            eprintln!("runner {i}: {line}");
        }
    }
    let revoked = |log: &String| log.contains("rebalance: partitions revoked");
    assert!(
        revoked(&logs[0]) && revoked(&logs[1]),
        "the first two runners logged revocations: {logs:#?}"
    );

    let expected = reference_counts(&lines);
    assert_eq!(table_counts(&table, wordcount::STORE).await, expected);
    let emitted = emitted_counts(&output);
    assert_eq!(emitted, expected);
}
