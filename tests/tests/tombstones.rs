//! A table's deletions, end to end: a table read from a topic with tombstones, filtered
//! (a rejected value deletes its key downstream too) and joined with a second table, its
//! changelog produced with `to_change_stream` to real topics through the local runner, the
//! tables in DynamoDB on the emulator, with duplicate deliveries and longer retries
//! injected. A consumer applying each output topic by version (tombstones deleting) ends
//! with exactly the tables computed here from the input.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use lambda_streams::lambda::Handler;
use lambda_streams::serdes::{Nullable, Utf8};
use lambda_streams::sink::VERSION_HEADER;
use lambda_streams::{StreamsBuilder, Topology};
use lambda_streams_e2e::*;
use local_runner::admin;

const PARTITIONS: i32 = 2;

fn topology(users: &str, plans: &str, active: &str, joined: &str) -> Topology {
    let builder = StreamsBuilder::new();
    let users = builder
        .table(users, Utf8, Utf8, "users")
        .filter(|_, name| !name.starts_with('~'));
    users.to_change_stream().to(active, Utf8, Nullable(Utf8));
    let plans = builder.table(plans, Utf8, Utf8, "plans");
    users
        .join(&plans, |_, name: &String, plan: &String| {
            format!("{name}:{plan}")
        })
        .to_change_stream()
        .to(joined, Utf8, Nullable(Utf8));
    builder.build()
}

/// Per key, the value of the record with the highest version (a tombstone deletes it).
fn applied(topic: &str) -> (BTreeMap<String, String>, usize) {
    let records = read_topic(topic);
    let tombstones = records.iter().filter(|r| r.value.is_none()).count();
    let mut best: BTreeMap<String, (u64, Option<String>)> = BTreeMap::new();
    for record in records {
        let key = String::from_utf8(record.key.expect("key")).expect("utf-8");
        let version: u64 = std::str::from_utf8(&record.headers[VERSION_HEADER])
            .expect("utf-8")
            .parse()
            .expect("version");
        let value = record.value.map(|v| String::from_utf8(v).expect("utf-8"));
        let entry = best.entry(key).or_insert((0, None));
        if version >= entry.0 {
            *entry = (version, value);
        }
    }
    let table = best
        .into_iter()
        .filter_map(|(k, (_, v))| Some((k, v?)))
        .collect();
    (table, tombstones)
}

/// Keyed changes: for each of `keys` keys, a few values, some rejected by the filter
/// (`~`), some tombstones; deterministic.
fn changes(keys: usize, seed: u64) -> Vec<(String, Option<String>)> {
    let mut next = lcg(seed);
    (0..keys * 4)
        .map(|i| {
            let key = format!("u{}", next() % keys as u64);
            let value = match next() % 5 {
                0 => None,
                1 => Some(format!("~gone{i}")),
                _ => Some(format!("v{i}")),
            };
            (key, value)
        })
        .collect()
}

/// The final table of `changes` (in order; `None` deletes).
fn final_table(changes: &[(String, Option<String>)]) -> BTreeMap<String, String> {
    let mut table = BTreeMap::new();
    for (key, value) in changes {
        match value {
            Some(v) => table.insert(key.clone(), v.clone()),
            None => table.remove(key),
        };
    }
    table
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletions_reach_the_changelog_topics_as_tombstones() {
    require_services();
    let (users, plans, active, joined) = (
        unique("tb-users"),
        unique("tb-plans"),
        unique("tb-active"),
        unique("tb-joined"),
    );
    let servers = bootstrap();
    for topic in [&users, &plans, &active, &joined] {
        admin::create_topic(&servers, topic, PARTITIONS)
            .await
            .expect("topic");
    }
    let user_changes = changes(12, 7);
    let plan_changes = changes(12, 11);
    // Keyed by the default partitioner: a key's changes stay in order in one partition.
    produce_keyed(&users, &user_changes, None).await;
    produce_keyed(&plans, &plan_changes, None).await;

    let (_, store) = exactly_once_store("tombstones").await;
    let store = Arc::new(store);
    let handler =
        Handler::with_kafka_output(topology(&users, &plans, &active, &joined), store, None);
    run_with_redeliveries(
        handler,
        vec![users.clone(), plans.clone()],
        "tb-group",
        5,
        Duration::from_secs(180),
    )
    .await;

    let users_final = final_table(&user_changes);
    let plans_final = final_table(&plan_changes);
    let expected_active: BTreeMap<String, String> = users_final
        .iter()
        .filter(|(_, name)| !name.starts_with('~'))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let expected_joined: BTreeMap<String, String> = expected_active
        .iter()
        .filter_map(|(k, name)| {
            plans_final
                .get(k)
                .map(|plan| (k.clone(), format!("{name}:{plan}")))
        })
        .collect();
    let (active_table, active_tombstones) = applied(&active);
    let (joined_table, joined_tombstones) = applied(&joined);
    assert!(
        active_tombstones > 0 && joined_tombstones > 0,
        "deletions were produced as tombstones ({active_tombstones}, {joined_tombstones})"
    );
    assert_eq!(active_table, expected_active, "the filtered table");
    assert_eq!(joined_table, expected_joined, "the joined table");
}
