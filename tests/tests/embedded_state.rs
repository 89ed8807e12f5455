//! The local runner's embedded default: dynoxide in-process, its data in a file, so state
//! survives a restart. Written through the real DynamoDB store, read back after a restart.

use lambda_streams::Guarantee;
use lambda_streams::event::TopicPartition;
use lambda_streams::state::dynamodb::{DynamoStore, create_table, emulator_client};
use lambda_streams::state::{Contribution, ItemState, ItemWrite, Store};
use local_runner::embedded::EmbeddedDynamo;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_state_survives_a_restart() {
    let dir = std::env::temp_dir().join(lambda_streams_e2e::unique("embedded"));
    let path = dir.join("state.db");
    let partitions = [TopicPartition::new("text-lines", 0)];
    let contributions = [
        Contribution {
            tp: 0,
            offset: 4,
            delta: 2,
        },
        Contribution {
            tp: 0,
            offset: 9,
            delta: 1,
        },
    ];
    let write = ItemWrite {
        store: "counts",
        key: b"fox",
        contributions: &contributions,
        partitions: &partitions,
        window: None,
        expires_at: None,
        timestamp: None,
        close_at: None,
        fold: None,
    };

    let first = EmbeddedDynamo::start(&path)
        .await
        .expect("embedded dynoxide");
    let client = emulator_client(first.endpoint());
    create_table(&client, "state").await.expect("table");
    let store = DynamoStore::new(client, "state", Guarantee::ExactlyOnce);
    let (state, stats) = store.apply(write).await.expect("write");
    assert_eq!(state, ItemState::number(3, 1));
    assert_eq!(
        (stats.requests, stats.conditional_failures),
        (1, 0),
        "one conditional write"
    );
    drop(store);
    drop(first);
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;

    let second = EmbeddedDynamo::start(&path)
        .await
        .expect("restarted embedded dynoxide");
    let store = DynamoStore::new(
        emulator_client(second.endpoint()),
        "state",
        Guarantee::ExactlyOnce,
    );
    assert_eq!(
        store.get("counts", b"fox").await.expect("read"),
        Some(ItemState::number(3, 1))
    );
    // The same contributions again (a redelivery after the restart) change nothing.
    let (state, stats) = store.apply(write).await.expect("redelivery");
    assert_eq!(state, ItemState::number(3, 1));
    assert_eq!(
        stats.conditional_failures, 1,
        "the watermark refused the duplicate"
    );
    let _ = std::fs::remove_dir_all(dir);
}
