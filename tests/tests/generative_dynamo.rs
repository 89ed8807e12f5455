//! The generative differential test (issue 12, item 2) on DynamoDB: the same plans,
//! inputs, fault schedules (duplicates, crashes after k writes through `FaultyStore`
//! wrapping the store, shifted retries, zombies, redeliveries) and reference interpreter
//! as `framework/tests/generative.rs`, with every case on a fresh table of the dynoxide
//! emulator through `DynamoStore`, fewer cases (`GENERATIVE_CASES`, default 6 per family
//! and base seed). `GENERATIVE_FAMILIES` and `GENERATIVE_SEED` work as there.

#![allow(clippy::unwrap_used, clippy::expect_used)]

/// The in-memory test's families and suite (its own test returns at once here).
#[path = "../../framework/tests/generative.rs"]
mod generative;

use lambda_streams::Guarantee;
use lambda_streams::state::Store;
use lambda_streams::state::dynamodb::{DynamoStore, create_table, emulator_client};
use lambda_streams_e2e::{dynamo_endpoint, require_services, unique};

#[test]
fn random_topologies_equal_the_reference_under_faults_on_dynamodb() {
    require_services();
    // The cases run on this thread (the harness blocks on each batch); the SDK's
    // connections are driven by the runtime's workers.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let _context = runtime.enter();
    let client = emulator_client(&dynamo_endpoint());
    let new_store = || -> Box<dyn Store> {
        let table = unique("generative");
        futures::executor::block_on(create_table(&client, &table)).expect("a table");
        Box::new(DynamoStore::new(
            client.clone(),
            table,
            Guarantee::ExactlyOnce,
        ))
    };
    generative::suite::run_all(6, &generative::suite::FIXED_SEEDS[..1], &new_store);
}
