//! The `pageviews` function end to end: page views with timestamps over six minutes on a
//! 2-partition topic of the real broker, run through the local runner (in-process
//! transport) with its state on dynoxide; the windows it emits on close (views per page,
//! top 5 pages, distinct users) equal a brute-force reference computed here.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use lambda_streams::BatchOptions;
use lambda_streams::lambda::Handler;
use lambda_streams_e2e::*;
use local_runner::{InProcess, Runner, RunnerConfig, admin};
use pageviews::{PageCount, PageView, PageViews, TopPages, Topics, UniqueUsers};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rdkafka::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};

const PARTITIONS: i32 = 2;
/// A minute boundary (2025-11-30T00:00:00Z).
const T0: i64 = 1_764_460_800_000;
const MINUTE: i64 = 60_000;

/// Per partition, `(timestamp, view)` in timestamp order: views over minutes 0 to 5, then
/// one view per partition at 6 min 10 s, which closes every window up to [5 min, 6 min)
/// (end + 10 s of grace) once both partitions have reached it.
fn input(seed: u64, per_partition: usize) -> Vec<Vec<(i64, PageView)>> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..PARTITIONS)
        .map(|_| {
            let mut times: Vec<i64> = (0..per_partition)
                .map(|_| T0 + rng.random_range(0..6 * MINUTE))
                .collect();
            times.sort_unstable();
            let mut views: Vec<(i64, PageView)> = times
                .into_iter()
                .map(|t| {
                    // Skewed pages: /p0 most viewed; 9 pages in all.
                    let page = if rng.random_bool(0.3) {
                        0
                    } else {
                        rng.random_range(0..9)
                    };
                    let view = PageView {
                        user: format!("u{}", rng.random_range(0..40)),
                        page: format!("/p{page}"),
                    };
                    (t, view)
                })
                .collect();
            views.push((
                T0 + 6 * MINUTE + 10_000,
                PageView {
                    user: "closer".to_owned(),
                    page: "/close".to_owned(),
                },
            ));
            views
        })
        .collect()
}

#[derive(Debug, Default, PartialEq)]
struct Outputs {
    views: BTreeMap<String, PageViews>,
    top: BTreeMap<String, TopPages>,
    unique: BTreeMap<String, UniqueUsers>,
}

/// The windows that close by brute force: every view of minutes 0 to 5.
fn reference(input: &[Vec<(i64, PageView)>]) -> Outputs {
    let mut per_window: BTreeMap<i64, Vec<&PageView>> = BTreeMap::new();
    for (t, view) in input.iter().flatten() {
        let start = (t - T0).div_euclid(MINUTE) * MINUTE + T0;
        if start < T0 + 6 * MINUTE {
            per_window.entry(start).or_default().push(view);
        }
    }
    let mut out = Outputs::default();
    for (start, views) in per_window {
        let end = start + MINUTE;
        let mut counts: BTreeMap<&str, u64> = BTreeMap::new();
        for v in &views {
            *counts.entry(&v.page).or_insert(0) += 1;
        }
        for (page, n) in &counts {
            out.views.insert(
                format!("{page}@{start}"),
                PageViews {
                    page: (*page).to_owned(),
                    window_start: start,
                    window_end: end,
                    views: *n,
                },
            );
        }
        let mut ranked: Vec<(&str, u64)> = counts.into_iter().collect();
        ranked.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        out.top.insert(
            start.to_string(),
            TopPages {
                window_start: start,
                window_end: end,
                pages: ranked
                    .into_iter()
                    .take(5)
                    .map(|(page, views)| PageCount {
                        page: page.to_owned(),
                        views,
                    })
                    .collect(),
            },
        );
        let users: BTreeSet<&str> = views.iter().map(|v| v.user.as_str()).collect();
        out.unique.insert(
            start.to_string(),
            UniqueUsers {
                window_start: start,
                window_end: end,
                users: users.len() as u64,
            },
        );
    }
    out
}

async fn produce(topic: &str, input: &[Vec<(i64, PageView)>]) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("enable.idempotence", "true")
        .create()
        .expect("producer");
    for (p, views) in input.iter().enumerate() {
        for (t, view) in views {
            let payload = serde_json::to_vec(&serde_json::json!({
                "user": view.user, "page": view.page, "agent": "e2e"
            }))
            .expect("json");
            producer
                .send(
                    FutureRecord::<(), Vec<u8>>::to(topic)
                        .payload(&payload)
                        .partition(p as i32)
                        .timestamp(*t),
                    Duration::from_secs(10),
                )
                .await
                .expect("produced");
        }
    }
}

/// Per key, the value of the record with the highest version, decoded from JSON; and how
/// many records the topic holds.
fn emitted<T: serde::de::DeserializeOwned>(topic: &str) -> (BTreeMap<String, T>, usize) {
    let records = read_topic(topic);
    let latest = latest_by_version(&records)
        .into_iter()
        .map(|(k, (_, v))| (k, serde_json::from_str(&v).expect("json value")))
        .collect();
    (latest, records.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pageviews_through_the_runner_equal_the_reference() {
    require_services();
    let topics = Topics {
        input: unique("page-views"),
        views: unique("page-views-per-minute"),
        top: unique("top-pages-per-minute"),
        unique: unique("unique-users-per-minute"),
    };
    let servers = bootstrap();
    admin::create_topic(&servers, &topics.input, PARTITIONS)
        .await
        .expect("input topic");
    for out in [&topics.views, &topics.top, &topics.unique] {
        admin::create_topic(&servers, out, 1)
            .await
            .expect("output topic");
    }
    let input = input(11, 300);
    produce(&topics.input, &input).await;

    let (_, store) = exactly_once_store("pageviews").await;
    let store = Arc::new(store);
    // As LAMBDA_STREAMS_SOURCE_PARTITIONS=<input>:2 does in Lambda; a long idle timeout so
    // that a partition read later than the other never lets windows close early.
    let options = BatchOptions {
        source_partitions: BTreeMap::from([(topics.input.clone(), PARTITIONS)]),
        idle_partition_timeout: Duration::from_secs(600),
        ..BatchOptions::default()
    };
    let handler =
        Handler::with_kafka_output(pageviews::topology(&topics), store, None).with_options(options);
    let config = RunnerConfig {
        bootstrap_servers: servers,
        group_id: unique("group"),
        topics: vec![topics.input.clone()],
        batch_size: 50,
        batching_window: Duration::from_millis(100),
        until_idle: true,
        idle_timeout: Duration::from_millis(500),
        retry_backoff: Duration::from_millis(10),
        ..RunnerConfig::default()
    };
    let runner = Runner::new(config, Arc::new(InProcess::new(Arc::new(handler)))).expect("runner");
    let summary = tokio::time::timeout(Duration::from_secs(180), runner.run())
        .await
        .expect("the runner finished in time")
        .expect("the runner succeeded");
    let total: usize = input.iter().map(Vec::len).sum();
    assert_eq!(summary.records, total as u64);
    assert_eq!(summary.failures, 0);

    let expected = reference(&input);
    assert_eq!(expected.top.len(), 6, "six windows close");
    let (views, n_views) = emitted::<PageViews>(&topics.views);
    let (top, n_top) = emitted::<TopPages>(&topics.top);
    let (unique_users, n_unique) = emitted::<UniqueUsers>(&topics.unique);
    eprintln!(
        "pageviews: {total} views in, {} batches; emitted {n_views} view counts ({} windows x pages), {n_top} top lists, {n_unique} distinct counts",
        summary.invocations,
        expected.views.len()
    );
    assert_eq!(views, expected.views, "views per page and window");
    assert_eq!(top, expected.top, "top 5 pages per window");
    assert_eq!(unique_users, expected.unique, "distinct users per window");
}
