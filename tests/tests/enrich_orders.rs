//! `enrich-orders` end to end: customers (a table from a topic, tombstones included) and
//! orders (a stream on 3 partitions) through the local runner on the real broker, with the
//! table in DynamoDB on the emulator and duplicate deliveries injected. Every order comes
//! out once per delivery with the customer it had when its batch ran, and the expected
//! enrichment is computed independently here.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use enrich_orders::{Customer, EnrichedOrder, Order};
use lambda_streams::lambda::Handler;
use lambda_streams_e2e::*;
use local_runner::{Faults, InProcess, Runner, RunnerConfig, admin};

/// Runs `enrich-orders` over whatever the topics hold until idle (the group resumes).
async fn run_until_idle(handler: &Arc<Handler>, topics: &[String], group: &str, faults: Faults) {
    let config = RunnerConfig {
        bootstrap_servers: bootstrap(),
        group_id: group.to_owned(),
        topics: topics.to_vec(),
        batch_size: 7,
        batching_window: Duration::from_millis(50),
        until_idle: true,
        idle_timeout: Duration::from_millis(500),
        retry_backoff: Duration::from_millis(10),
        faults,
        ..RunnerConfig::default()
    };
    let runner =
        Runner::new(config, Arc::new(InProcess::new(Arc::clone(handler)))).expect("runner");
    tokio::time::timeout(Duration::from_secs(120), runner.run())
        .await
        .expect("the runner finished in time")
        .expect("the runner succeeded");
}

fn customer(name: &str, tier: &str) -> Option<String> {
    Some(
        serde_json::to_string(&Customer {
            name: name.into(),
            tier: tier.into(),
        })
        .expect("json"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_are_enriched_with_the_customer_of_their_time() {
    require_services();
    let (customers, orders, output) = (unique("customers"), unique("orders"), unique("enriched"));
    let servers = bootstrap();
    admin::create_topic(&servers, &customers, 1)
        .await
        .expect("topic");
    admin::create_topic(&servers, &orders, 3)
        .await
        .expect("topic");
    admin::create_topic(&servers, &output, 3)
        .await
        .expect("topic");
    let (_, store) = exactly_once_store("enrich").await;
    let store = Arc::new(store);
    let handler = Arc::new(Handler::with_kafka_output(
        enrich_orders::topology(&customers, &orders, &output),
        store,
        None,
    ));
    let topics = vec![customers.clone(), orders.clone()];
    let group = unique("enrich-group");
    let faults = || Faults {
        duplicate_every: Some(3),
        ..Faults::default()
    };

    // The reference: the customers table as a map, phase by phase.
    let mut reference: BTreeMap<String, Customer> = BTreeMap::new();
    let mut expected: BTreeMap<String, EnrichedOrder> = BTreeMap::new();
    let mut order_id = 0;
    let mut place = |reference: &BTreeMap<String, Customer>,
                     expected: &mut BTreeMap<String, EnrichedOrder>,
                     n: usize| {
        let mut records = Vec::new();
        for i in 0..n {
            order_id += 1;
            let order = Order {
                order_id: format!("o{order_id}"),
                customer_id: format!("c{}", i % 5),
                amount_cents: (order_id * 37 % 1000) as i64,
            };
            expected.insert(
                order.order_id.clone(),
                EnrichedOrder {
                    order: order.clone(),
                    customer: reference.get(&order.customer_id).cloned(),
                },
            );
            records.push((
                order.order_id.clone(),
                Some(serde_json::to_string(&order).expect("json")),
            ));
        }
        records
    };

    // Phase 1: customers c0..c3 (c4 unknown), then orders.
    let first: Vec<(String, Option<String>)> = (0..4)
        .map(|i| {
            (
                format!("c{i}"),
                customer(&format!("Customer {i}"), "silver"),
            )
        })
        .collect();
    for (k, v) in &first {
        reference.insert(
            k.clone(),
            serde_json::from_str(v.as_deref().expect("value")).expect("json"),
        );
    }
    produce_keyed(&customers, &first, Some(0)).await;
    run_until_idle(&handler, &topics, &group, faults()).await;
    let orders_1 = place(&reference, &mut expected, 40);
    produce_keyed(&orders, &orders_1, None).await;
    run_until_idle(&handler, &topics, &group, faults()).await;

    // Phase 2: c1 upgraded, c2 deleted (a tombstone), c4 created; then more orders.
    let second = vec![
        ("c1".to_owned(), customer("Customer 1", "gold")),
        ("c2".to_owned(), None),
        ("c4".to_owned(), customer("Customer 4", "bronze")),
    ];
    for (k, v) in &second {
        match v {
            Some(v) => reference.insert(k.clone(), serde_json::from_str(v).expect("json")),
            None => reference.remove(k),
        };
    }
    produce_keyed(&customers, &second, Some(0)).await;
    run_until_idle(&handler, &topics, &group, faults()).await;
    let orders_2 = place(&reference, &mut expected, 40);
    produce_keyed(&orders, &orders_2, None).await;
    run_until_idle(&handler, &topics, &group, faults()).await;

    // Every output record is an expected enrichment; duplicates (from the injected
    // redeliveries) are identical; every order came out.
    let mut seen: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for record in read_topic(&output) {
        let key = String::from_utf8(record.key.expect("key")).expect("utf-8");
        let value = String::from_utf8(record.value.expect("value")).expect("utf-8");
        seen.entry(key).or_default().insert(value);
    }
    assert_eq!(seen.len(), expected.len(), "every order enriched");
    for (id, values) in seen {
        assert_eq!(
            values.len(),
            1,
            "order {id}: one enrichment, however often delivered"
        );
        let got: EnrichedOrder =
            serde_json::from_str(values.first().expect("value")).expect("json");
        assert_eq!(got, expected[&id], "order {id}");
    }
}
