//! The DynamoDB store's aggregate cache is bounded by bytes, and evicting from it never
//! changes a result (issue 12, scope 5): the same batches, redeliveries included, through
//! stores with no cache, a cache so small that it evicts on almost every write, and the
//! default cache, on the dynoxide emulator, give the sums a by-hand reference gives.

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use lambda_streams::event::KafkaEvent;
use lambda_streams::serdes::{DecimalI64, Serde, Utf8};
use lambda_streams::sink::MemorySink;
use lambda_streams::state::Store;
use lambda_streams::state::dynamodb::{
    DEFAULT_CACHE_BYTES, DynamoStore, create_table, emulator_client,
};
use lambda_streams::{Guarantee, StreamsBuilder, Topology};
use lambda_streams_e2e::*;

/// Sums the values per key, as a general aggregate (cached), with a padding string in the
/// aggregate so that items are of some size.
fn sums() -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream("in", Utf8, Utf8)
        .group_by_key(Utf8)
        .aggregate(
            "sums",
            || 0i64,
            |_, value: String, sum: i64| sum + value.parse::<i64>().unwrap_or(0),
            DecimalI64,
        )
        .to_stream()
        .to("sums-out", Utf8, DecimalI64);
    builder.build()
}

/// An event of `in-0`: offsets `from..to`, record `o` of key `k{o % 37}` with value `o % 11`.
fn event(from: i64, to: i64) -> KafkaEvent {
    let records: Vec<String> = (from..to)
        .map(|o| {
            format!(
                r#"{{"topic":"in","partition":0,"offset":{o},"timestamp":{o},"timestampType":"CREATE_TIME","key":"{}","value":"{}","headers":[]}}"#,
                STANDARD.encode(format!("k{}", o % 37)),
                STANDARD.encode((o % 11).to_string())
            )
        })
        .collect();
    let json = format!(
        r#"{{"eventSource":"SelfManagedKafka","bootstrapServers":"b:9092","records":{{"in-0":[{}]}}}}"#,
        records.join(",")
    );
    KafkaEvent::decode(json.as_bytes()).expect("a valid event")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_never_changes_the_sums_and_the_cache_stays_within_its_bytes() {
    require_services();
    let client = emulator_client(&dynamo_endpoint());
    // The reference, by hand: every offset 0..600 once.
    let mut expected: BTreeMap<String, i64> = BTreeMap::new();
    for o in 0..600i64 {
        *expected.entry(format!("k{}", o % 37)).or_default() += o % 11;
    }
    // Batches of 50 with redeliveries: one delivered twice, one retried with a later end.
    let deliveries = [
        (0, 50),
        (50, 100),
        (50, 100),
        (100, 150),
        (100, 230),
        (230, 400),
        (380, 600),
    ];
    // An item of a sum is ~60 bytes as DynamoDB counts it and ~600 as the cache counts it
    // with its heap: 1,500 bytes hold two of the 37 keys.
    let mut costs = Vec::new();
    for budget in [0, 1_500, DEFAULT_CACHE_BYTES] {
        let table = unique("state-cache");
        create_table(&client, &table).await.expect("table");
        let store = DynamoStore::new(client.clone(), table, Guarantee::ExactlyOnce)
            .with_cache_bytes(budget);
        let topology = sums();
        let mut requests = 0;
        for (from, to) in deliveries {
            let report = topology
                .process(&event(from, to), &store, &MemorySink::new())
                .await
                .expect("a batch");
            requests += report.state.requests;
            assert!(
                store.cached_bytes() <= budget,
                "budget {budget}: the cache holds {} bytes",
                store.cached_bytes()
            );
        }
        let mut sums = BTreeMap::new();
        for key in expected.keys() {
            let state = store
                .get("sums", key.as_bytes())
                .await
                .expect("get")
                .expect("an item");
            let sum = DecimalI64
                .deserialize(state.aggregate.as_deref())
                .expect("a number");
            sums.insert(key.clone(), sum);
        }
        assert_eq!(sums, expected, "budget {budget}");
        costs.push(requests);
    }
    // The cache saves requests (an item not cached costs a refused write more), and only
    // requests.
    assert!(
        costs[2] < costs[0],
        "write requests by budget (0, 1500, default): {costs:?}"
    );
}
