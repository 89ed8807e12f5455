//! WordCount in repartition mode, end to end: lines on 3 partitions, the words through a
//! 3-partition repartition topic that the same function consumes, through the local runner
//! on the real broker with duplicate deliveries and longer retries injected (so the
//! repartition topic gets duplicate copies), the counts in DynamoDB on the emulator.
//! The counts equal a reference computed here; the repartition hop counts nothing twice;
//! and each word's updates reach the output in order (one writer per word).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use lambda_streams::lambda::Handler;
use lambda_streams::sink::VERSION_HEADER;
use lambda_streams_e2e::*;
use local_runner::admin;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wordcount_in_repartition_mode_is_exact_and_ordered_per_word() {
    require_services();
    let (input, repartition, output) =
        (unique("rp-lines"), unique("rp-words"), unique("rp-counts"));
    let servers = bootstrap();
    for topic in [&input, &repartition, &output] {
        admin::create_topic(&servers, topic, 3)
            .await
            .expect("topic");
    }
    let lines = sample_text(200, 31);
    produce_across_partitions(&input, &lines, 3).await;
    let (table, store) = exactly_once_store("repartition").await;
    let store = Arc::new(store);
    let handler = Handler::with_kafka_output(
        wordcount::topology_repartitioned(&input, &repartition, &output),
        store,
        None,
    );
    run_with_redeliveries(
        handler,
        vec![input.clone(), repartition.clone()],
        "rp-group",
        25,
        Duration::from_secs(180),
    )
    .await;

    let expected = reference_counts(&lines);
    assert_eq!(
        table_counts(&table, wordcount::STORE).await,
        expected,
        "state"
    );
    let words = read_topic(&repartition);
    let total: i64 = expected.values().sum();
    assert!(
        words.len() as i64 > total,
        "the faults put duplicate copies in the repartition topic ({} records for {total} words)",
        words.len()
    );
    // Per word, the output's updates come in version order, the last with the count.
    let mut last: BTreeMap<String, (u64, i64)> = BTreeMap::new();
    for record in read_topic(&output) {
        let word = String::from_utf8(record.key.expect("key")).expect("utf-8");
        let version: u64 = std::str::from_utf8(&record.headers[VERSION_HEADER])
            .expect("utf-8")
            .parse()
            .expect("version");
        let count: i64 = std::str::from_utf8(&record.value.expect("value"))
            .expect("utf-8")
            .parse()
            .expect("count");
        let previous = last.insert(word.clone(), (version, count));
        if let Some((v, _)) = previous {
            assert!(version >= v, "{word}: version {version} after {v}");
        }
    }
    let finals: BTreeMap<String, i64> = last.into_iter().map(|(w, (_, c))| (w, c)).collect();
    assert_eq!(finals, expected, "the last update per word");
}

/// The `local-runner` binary running the `wordcount` function in its default mode: the
/// runner creates the repartition topic (with the input's partition count), consumes it
/// beside the input, and the counts and the per-word order hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runner_binary_runs_wordcount_in_its_default_repartition_mode() {
    require_services();
    let (input, repartition, output) = (
        unique("rpd-lines"),
        unique("rpd-words"),
        unique("rpd-counts"),
    );
    let (table, group) = (unique("rpd"), unique("rpd-group"));
    let servers = bootstrap();
    for topic in [&input, &output] {
        admin::create_topic(&servers, topic, 3)
            .await
            .expect("topic");
    }
    let lines = sample_text(300, 17);
    produce_across_partitions(&input, &lines, 3).await;
    let status = runner_process(&input, &output, &table, &group)
        .env("WORDCOUNT_REKEYING", "repartition")
        .env("WORDCOUNT_REPARTITION_TOPIC", &repartition)
        .args(["--until-idle", "--idle-timeout-ms", "1500"])
        .stdout(std::process::Stdio::null())
        .status()
        .expect("the runner ran");
    assert!(status.success(), "the runner failed: {status}");
    let created: BTreeMap<String, usize> = admin::list_topics(&servers)
        .expect("topics")
        .into_iter()
        .collect();
    assert_eq!(
        created.get(&repartition),
        Some(&3),
        "created like the input"
    );
    let expected = reference_counts(&lines);
    assert_eq!(table_counts(&table, wordcount::STORE).await, expected);
    let words: i64 = expected.values().sum();
    assert_eq!(
        read_topic(&repartition).len() as i64,
        words,
        "each word once"
    );
    let mut last: BTreeMap<String, i64> = BTreeMap::new();
    for record in read_topic(&output) {
        let word = String::from_utf8(record.key.expect("key")).expect("utf-8");
        let count: i64 = std::str::from_utf8(&record.value.expect("value"))
            .expect("utf-8")
            .parse()
            .expect("count");
        let previous = last.insert(word.clone(), count).unwrap_or(0);
        assert!(count >= previous, "{word}: {count} after {previous}");
    }
    assert_eq!(last, expected, "the last update per word is its count");
}
