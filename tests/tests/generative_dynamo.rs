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
use lambda_streams::state::dynamodb::{
    DynamoStore, LeanClient, create_table, emulator_client, emulator_lean_client,
};
use lambda_streams_e2e::{dynamo_endpoint, require_services, unique};
use std::sync::Arc;

#[test]
fn random_topologies_equal_the_reference_under_faults_on_dynamodb() {
    on_dynamodb(6, None);
}

/// The same suite with the store's state writes through its [`LeanClient`] (half the cases:
/// the SDK path above covers the store's logic; this covers the lean request path's requests,
/// responses, failed conditions and errors on the same schedules).
#[test]
fn random_topologies_equal_the_reference_under_faults_through_the_lean_client() {
    let lean = emulator_lean_client(&dynamo_endpoint()).expect("a lean client");
    on_dynamodb(3, Some(Arc::new(lean)));
}

fn on_dynamodb(cases: u64, lean: Option<Arc<LeanClient>>) {
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
        let store = DynamoStore::new(client.clone(), table, Guarantee::ExactlyOnce);
        Box::new(match &lean {
            Some(lean) => store.with_shared_lean_client(Arc::clone(lean)),
            None => store,
        })
    };
    generative::suite::run_all(cases, &generative::suite::FIXED_SEEDS[..1], &new_store);
}
