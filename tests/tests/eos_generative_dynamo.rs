//! The generative differential test under exactly-once output
//! (`framework/tests/eos_generative.rs`) on DynamoDB: the same plans, inputs, fault model
//! (zombies, crashes at any await point, shifted retries, warm producers, late transaction
//! markers, coordinator timeouts) and reference, every case on a fresh table of the
//! dynoxide emulator through `DynamoStore` (its outbox of updates and conditional writes
//! on the wire, through the lean request path a deployed function takes), fewer cases (`EOS_GENERATIVE_CASES`, default 4 per family).

#![allow(clippy::unwrap_used, clippy::expect_used)]

/// The in-memory test's cases and runner (its own test returns at once here).
#[path = "../../framework/tests/eos_generative.rs"]
mod eos_generative;

use std::sync::Arc;

use lambda_streams::Guarantee;
use lambda_streams::state::Store;
use lambda_streams::state::dynamodb::{
    DynamoStore, create_table, emulator_client, emulator_lean_client,
};
use lambda_streams_e2e::{dynamo_endpoint, require_services, unique};

#[test]
fn every_topology_accepted_under_exactly_once_output_is_seen_once_on_dynamodb() {
    require_services();
    // Worker threads drive the SDK's connections, also while the reference check blocks
    // on the store from this thread.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let _context = runtime.enter();
    let client = emulator_client(&dynamo_endpoint());
    // The request path a deployed function takes (the lean client is the default).
    let lean = Arc::new(emulator_lean_client(&dynamo_endpoint()).expect("a lean client"));
    let new_store = || -> Arc<dyn Store> {
        let table = unique("eos-generative");
        runtime
            .block_on(create_table(&client, &table))
            .expect("a table");
        Arc::new(
            DynamoStore::new(client.clone(), table, Guarantee::ExactlyOnce)
                .with_shared_lean_client(Arc::clone(&lean)),
        )
    };
    eos_generative::run_all(&runtime, 4, &new_store, true);
}
