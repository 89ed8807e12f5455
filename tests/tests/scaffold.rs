//! A user's first function, end to end, with the commands of the README's "Your own
//! function in five steps" run as written there: `local-runner new` in a copy of this
//! workspace (the copy holds what `git ls-files` lists; it shares this process's
//! `CARGO_TARGET_DIR`, and its framework is a copy at another path, so cargo compiles the
//! framework once more for it), the generated crate's own tests and `cargo clippy
//! --all-targets -- -D warnings` of it, `cfn-lint` of the template with the new block,
//! `cargo lambda watch` of the new function, and the local runner over the Invoke API
//! against the real broker and the DynamoDB emulator, its windowed counts checked against a
//! count computed here from the input topic as read back, with a late record (beyond the
//! window and its grace) that the count must leave out. A second test builds it with
//! `cargo lambda build` (a debug build: a release build takes ~9 minutes on these machines;
//! CI's `.ci/run` builds every default member, this one included, with `--release`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use lambda_streams_e2e::*;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};

const PARTITIONS: i32 = 3;

/// `command`'s output, asserting it succeeded (stdout and stderr in the message if not).
fn run_ok(command: &mut Command, what: &str) -> Output {
    let output = command
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// `cargo` in the workspace `dir`, with this workspace's target directory when
/// `CARGO_TARGET_DIR` is not set (a copy's own `target/` would compile everything anew).
fn cargo(dir: &Path) -> Command {
    let mut command = Command::new("cargo");
    command.current_dir(dir);
    if std::env::var_os("CARGO_TARGET_DIR").is_none() {
        command.env("CARGO_TARGET_DIR", workspace().join("target"));
    }
    command
}

/// The local runner of the workspace `dir`, as the README runs it: `cargo run -p
/// lambda-streams-local-runner -- <args>`.
fn local_runner(dir: &Path) -> Command {
    let mut command = cargo(dir);
    command.args(["run", "--quiet", "-p", "lambda-streams-local-runner", "--"]);
    command
}

/// A copy of this workspace's tracked and untracked-but-not-ignored files in a new
/// temporary directory (no `target/`, `.git`, `.local/`).
fn copy_workspace() -> PathBuf {
    let root = workspace();
    let files = run_ok(
        Command::new("git")
            .args([
                "ls-files",
                "-z",
                "--cached",
                "--others",
                "--exclude-standard",
            ])
            .current_dir(&root),
        "git ls-files",
    );
    let copy = std::env::temp_dir().join(unique("lambda-streams-scaffold"));
    for file in files.stdout.split(|b| *b == 0).filter(|f| !f.is_empty()) {
        let file = Path::new(std::str::from_utf8(file).expect("utf-8 path"));
        let from = root.join(file);
        if !from.is_file() {
            continue; // deleted in the work tree
        }
        let to = copy.join(file);
        std::fs::create_dir_all(to.parent().expect("parent")).expect("mkdir");
        std::fs::copy(&from, &to).expect("copy");
    }
    copy
}

/// Scaffolds `name` into a fresh copy of the workspace and checks what the scaffold
/// refuses; returns the copy.
fn scaffolded(name: &str) -> PathBuf {
    let copy = copy_workspace();
    let template_before = std::fs::read_to_string(copy.join("template.yaml")).expect("template");
    let out = run_ok(local_runner(&copy).args(["new", name]), "local-runner new");
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        printed.contains(&format!("functions/{name}/src/lib.rs")),
        "{printed}"
    );

    // Never overwrites: the same name again is refused, and nothing changes.
    let template = std::fs::read_to_string(copy.join("template.yaml")).expect("template");
    let manifest = std::fs::read_to_string(copy.join("Cargo.toml")).expect("manifest");
    assert_ne!(template, template_before, "the function block was added");
    let again = local_runner(&copy)
        .args(["new", name])
        .stdin(Stdio::null())
        .output()
        .expect("runs");
    assert!(!again.status.success(), "a second `new {name}` must fail");
    let error = String::from_utf8_lossy(&again.stderr);
    assert!(
        error.contains("exists") && error.contains("never overwrites"),
        "{error}"
    );
    // A function already in the template (wordcount's directory is elsewhere).
    let taken = local_runner(&copy)
        .args(["new", "wordcount", "--path", "functions/wordcount-2"])
        .stdin(Stdio::null())
        .output()
        .expect("runs");
    assert!(!taken.status.success());
    let error = String::from_utf8_lossy(&taken.stderr);
    assert!(
        error.contains("wordcount") && error.contains("already"),
        "{error}"
    );
    // Not a crate name.
    let bad = local_runner(&copy)
        .args(["new", "My Function"])
        .stdin(Stdio::null())
        .output()
        .expect("runs");
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("\"My Function\""));
    assert!(!copy.join("functions/wordcount-2").exists());
    assert_eq!(
        std::fs::read_to_string(copy.join("template.yaml")).expect("template"),
        template
    );
    assert_eq!(
        std::fs::read_to_string(copy.join("Cargo.toml")).expect("manifest"),
        manifest
    );
    copy
}

/// The `[[package]]` blocks of a `Cargo.lock`.
fn lock_packages(lock: &str) -> Vec<String> {
    lock.split("\n[[package]]\n")
        .skip(1)
        .map(|b| b.trim().to_owned())
        .collect()
}

/// A record of the input topic as read back: `(partition, value, timestamp)`.
type Input = (i32, Option<String>, i64);

/// Every record of `topic` as `(partition, value, timestamp)`, read with a plain assigned
/// consumer: the input as the function received it, for the reference count.
fn read_values_with_timestamps(topic: &str, partitions: i32) -> Vec<Input> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", unique("scaffold-reader"))
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut assignment = TopicPartitionList::new();
    let mut remaining = 0;
    for p in 0..partitions {
        let (_, high) = consumer
            .fetch_watermarks(topic, p, Duration::from_secs(10))
            .expect("watermarks");
        remaining += high;
        assignment
            .add_partition_offset(topic, p, Offset::Beginning)
            .expect("assign");
    }
    consumer.assign(&assignment).expect("assign");
    let mut out = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while (out.len() as i64) < remaining {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out reading {topic}"
        );
        if let Some(message) = consumer.poll(Duration::from_millis(200)) {
            let message = message.expect("message");
            let value = message
                .payload()
                .map(|v| String::from_utf8(v.to_vec()).expect("utf-8"));
            let timestamp = message.timestamp().to_millis().expect("timestamp");
            out.push((message.partition(), value, timestamp));
        }
    }
    out
}

/// The generated function's window and grace, in ms (its `WINDOW` and `GRACE`).
const WINDOW_MS: i64 = 60_000;
const GRACE_MS: i64 = 10_000;

/// The trimmed name of a record the generated filter keeps (not a tombstone, not blank).
fn name_of(value: &Option<String>) -> Option<&str> {
    value.as_deref().map(str::trim).filter(|n| !n.is_empty())
}

/// The start of the window holding `ts`.
fn window_start(ts: i64) -> i64 {
    ts - ts.rem_euclid(WINDOW_MS)
}

/// The reference, by definition: per `<name>@<window start>`, the records of that trimmed,
/// non-blank name in the 1-minute window `[start, start + 60 s)`, over the records of the
/// first run (`on_time`) and those of the second (`after`) that are not late.
///
/// No record of the first run is late: their timestamps span less than the grace (asserted).
/// A record of the second run is late when its window's end + grace is at or before the
/// lowest timestamp of the first run's counted records: by then every stream time that can
/// judge it (its source partition's, which counted records of the first run, and the
/// repartition partition's of its name, which did too; both asserted by the caller) is at
/// least that high, so the window has closed and the record must be dropped.
fn reference(on_time: &[Input], after: &[Input]) -> BTreeMap<String, i64> {
    let counted: Vec<i64> = on_time
        .iter()
        .filter(|(_, value, _)| name_of(value).is_some())
        .map(|(_, _, ts)| *ts)
        .collect();
    let (low, high) = (
        counted.iter().copied().min().expect("names counted"),
        counted.iter().copied().max().expect("names counted"),
    );
    assert!(
        high - low < GRACE_MS,
        "the first run spans less than the grace"
    );
    let mut counts = BTreeMap::new();
    for (_, value, ts) in on_time {
        if let Some(name) = name_of(value) {
            *counts
                .entry(format!("{name}@{}", window_start(*ts)))
                .or_insert(0) += 1;
        }
    }
    for (_, value, ts) in after {
        let Some(name) = name_of(value) else { continue };
        if window_start(*ts) + WINDOW_MS + GRACE_MS <= low {
            continue; // late: dropped
        }
        *counts
            .entry(format!("{name}@{}", window_start(*ts)))
            .or_insert(0) += 1;
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scaffolded_function_tests_lints_and_runs_on_the_broker() {
    require_services();
    let name = "click-counts";
    let copy = scaffolded(name);

    // Step 2: its own tests. The lock gains one entry, the new crate (its dependencies are
    // locked already, so nothing is resolved or downloaded: --offline). The first cargo
    // command after the scaffold writes it (here the refused `new`s of `scaffolded`): the
    // lock before is this workspace's, which the copy started with.
    let lock_before = std::fs::read_to_string(workspace().join("Cargo.lock")).expect("lock");
    let out = run_ok(
        cargo(&copy).args(["test", "-p", name, "--offline"]),
        "cargo test of the generated crate",
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        printed.contains("test result: ok. 3 passed"),
        "the generated crate's 3 tests pass:\n{printed}"
    );
    let lock_after = std::fs::read_to_string(copy.join("Cargo.lock")).expect("lock");
    let (before, after) = (lock_packages(&lock_before), lock_packages(&lock_after));
    let added: Vec<&String> = after.iter().filter(|p| !before.contains(p)).collect();
    assert_eq!(added.len(), 1, "one new lock entry: {added:?}");
    assert!(
        added[0].starts_with(&format!("name = \"{name}\"")),
        "{}",
        added[0]
    );
    assert!(
        before.iter().all(|p| after.contains(p)),
        "no other lock entry changed"
    );
    // The lock is now complete.
    run_ok(
        cargo(&copy).args(["test", "-p", name, "--offline", "--locked", "--no-run"]),
        "cargo test --locked",
    );
    // The generated crate is clippy-clean with the workspace's lints, its tests included.
    run_ok(
        cargo(&copy).args([
            "clippy",
            "-p",
            name,
            "--all-targets",
            "--offline",
            "--locked",
            "--",
            "-D",
            "warnings",
        ]),
        "cargo clippy of the generated crate",
    );

    // The template with the new block passes cfn-lint.
    run_ok(
        Command::new("cfn-lint")
            .arg("template.yaml")
            .current_dir(&copy),
        "cfn-lint (scripts/tools installs it; PATH=\"$(scripts/tools path):$PATH\")",
    );

    // Step 3: on the real broker, over the Invoke API of `cargo lambda watch`.
    let (input, output, repartition, table) = (
        unique("scaffold-events"),
        unique("scaffold-counts"),
        unique("scaffold-repartition"),
        unique("scaffold-state"),
    );
    for topic in [&input, &output, &repartition] {
        run_ok(
            local_runner(&copy).args([
                "topics",
                "create",
                topic,
                "--partitions",
                &PARTITIONS.to_string(),
                "--bootstrap-servers",
                &bootstrap(),
            ]),
            "topics create",
        );
    }
    run_ok(
        local_runner(&copy).args([
            "tables",
            "create",
            &table,
            "--dynamodb-endpoint",
            &dynamo_endpoint(),
        ]),
        "tables create",
    );
    let names = ["click", "view", "buy", " click ", "view", "click"];
    let events: Vec<String> = (0..300)
        .map(|i| names[i % names.len()].to_owned())
        .collect();
    let file = copy.join("events.txt");
    std::fs::write(&file, events.join("\n") + "\n").expect("events file");
    run_ok(
        local_runner(&copy).args([
            "produce",
            "--topic",
            &input,
            "--file",
            "events.txt",
            "--bootstrap-servers",
            &bootstrap(),
        ]),
        "produce",
    );
    // What the filter drops: tombstones and blank names, to every partition.
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .expect("producer");
    for p in 0..PARTITIONS {
        for value in [None, Some("   ")] {
            let mut record = FutureRecord::<(), str>::to(&input).partition(p);
            if let Some(v) = value {
                record = record.payload(v);
            }
            producer
                .send(record, Duration::from_secs(10))
                .await
                .expect("produced");
        }
    }
    let records = read_values_with_timestamps(&input, PARTITIONS);
    assert_eq!(records.len(), events.len() + 2 * PARTITIONS as usize);
    let on_time = reference(&records, &[]);

    let mut env = emulator_env();
    env.extend([
        format!("LAMBDA_STREAMS_TABLE={table}"),
        format!("CLICK_COUNTS_INPUT_TOPIC={input}"),
        format!("CLICK_COUNTS_OUTPUT_TOPIC={output}"),
        format!("CLICK_COUNTS_REPARTITION_TOPIC={repartition}"),
    ]);
    let port = free_port();
    let watch = LambdaWatch::start_in(&copy, name, port, &env);
    let group = unique("scaffold-group");
    let run = || {
        let out = run_ok(
            local_runner(&copy).args([
                "run",
                "--function-url",
                &format!("http://127.0.0.1:{port}"),
                "--function-name",
                name,
                "--topic",
                &input,
                "--topic",
                &repartition,
                "--group-id",
                &group,
                "--until-idle",
                "--idle-timeout-ms",
                "2000",
                "--quiet",
                "--bootstrap-servers",
                &bootstrap(),
            ]),
            "local-runner run over the Invoke API",
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let printed = run();
    let names_counted: i64 = on_time.values().sum();
    assert!(
        printed.contains(&format!(
            "processed {} records",
            records.len() as i64 + names_counted
        )),
        "every input record, then every non-blank name through the repartition topic: {printed}"
    );

    // A late record: a click five windows before the first run's earliest counted record,
    // to a partition that counted records, produced once the first run is done (so every
    // stream time that judges it has passed its window's end + grace). The same group
    // resumes from its commits and reads it (and its copy in the repartition topic).
    let low = records
        .iter()
        .filter(|(_, value, _)| name_of(value).is_some())
        .map(|(_, _, ts)| *ts)
        .min()
        .expect("names counted");
    let late_partition = records
        .iter()
        .find(|(_, value, _)| name_of(value) == Some("click"))
        .map(|(p, _, _)| *p)
        .expect("a partition with clicks");
    let late_at = window_start(low) - 5 * WINDOW_MS;
    producer
        .send(
            FutureRecord::<(), str>::to(&input)
                .partition(late_partition)
                .payload("click")
                .timestamp(late_at),
            Duration::from_secs(10),
        )
        .await
        .expect("produced");
    let all = read_values_with_timestamps(&input, PARTITIONS);
    let after: Vec<Input> = all
        .iter()
        .filter(|record| !records.contains(record))
        .cloned()
        .collect();
    assert_eq!(after, [(late_partition, Some("click".to_owned()), late_at)]);
    let expected = reference(&records, &after);
    let late_key = format!("click@{}", window_start(late_at));
    assert_eq!(expected, on_time, "the reference drops the late record");
    assert!(!expected.contains_key(&late_key));
    let printed = run();
    drop(watch);
    assert!(
        printed.contains("processed 2 records"),
        "the late record and its copy in the repartition topic: {printed}"
    );

    // One writer per name: its updates reach the output in order, the last one its count.
    let mut last: BTreeMap<String, i64> = BTreeMap::new();
    for record in read_topic(&output) {
        let key = String::from_utf8(record.key.expect("key")).expect("utf-8");
        let count: i64 = String::from_utf8(record.value.expect("value"))
            .expect("utf-8")
            .parse()
            .expect("a decimal count");
        let previous = last.insert(key.clone(), count).unwrap_or(0);
        assert!(count >= previous, "{key}: {count} after {previous}");
    }
    assert_eq!(last, expected, "the last update per window is its count");

    // The README's look at the state: `query --top`, one JSON line per window.
    let out = run_ok(
        local_runner(&copy).args([
            "query",
            "--store",
            &format!("{name}-counts"),
            "--table",
            &table,
            "--top",
            "1000",
            "--dynamodb-endpoint",
            &dynamo_endpoint(),
        ]),
        "local-runner query",
    );
    let stored: BTreeMap<String, i64> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| {
            let item: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
            let key = item["key"].as_str().expect("key");
            let start = item["window_start"].as_i64().expect("window_start");
            (
                format!("{key}@{start}"),
                item["value"].as_i64().expect("value"),
            )
        })
        .collect();
    assert_eq!(stored, expected, "the state table holds the counts");
    let _ = std::fs::remove_dir_all(&copy);
}

#[test]
fn a_scaffolded_function_builds_with_cargo_lambda() {
    let name = "built-counts";
    let copy = scaffolded(name);
    // Step 4, in debug (see the module documentation).
    run_ok(
        cargo(&copy).args(["lambda", "build", "-p", name, "--offline"]),
        "cargo lambda build (scripts/tools installs it; PATH=\"$(scripts/tools path):$PATH\")",
    );
    let target = std::env::var("CARGO_TARGET_DIR")
        .map_or_else(|_| workspace().join("target"), PathBuf::from);
    let bootstrap = target.join("lambda").join(name).join("bootstrap");
    assert!(bootstrap.is_file(), "{} was built", bootstrap.display());
    let _ = std::fs::remove_dir_all(&copy);
}
