//! Table administration (creating the state table) and the SDK client settings of the
//! store: the emulator's client and the retry policy.

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType, Projection,
    ProjectionType, ScalarAttributeType, TimeToLiveSpecification,
};

use super::lean::LeanClient;
use super::retry::RetrySettings;
use super::{CLOSING_INDEX, CLOSING_STORE, CLOSING_TIME, TTL_ATTRIBUTE, describe_sdk_error};
use crate::aws::{TlsRoots, https_client, static_credentials};
use crate::state::{StateError, StateErrorKind};

/// Creates the state table (`pk` S + `sk` N, on-demand, TTL on `ttl`, the
/// [`CLOSING_INDEX`] for emit-on-close windows) if it does not exist.
/// For local runs and tests; in AWS, `template.yaml` creates it.
pub async fn create_table(client: &Client, table: &str) -> Result<(), StateError> {
    let err = |e: String| StateError::new("<table>", table.as_bytes(), StateErrorKind::Request(e));
    let created = client
        .create_table()
        .table_name(table)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(attr("pk", ScalarAttributeType::S))
        .attribute_definitions(attr("sk", ScalarAttributeType::N))
        .attribute_definitions(attr(CLOSING_STORE, ScalarAttributeType::S))
        .attribute_definitions(attr(CLOSING_TIME, ScalarAttributeType::N))
        .key_schema(key("pk", KeyType::Hash))
        .key_schema(key("sk", KeyType::Range))
        .global_secondary_indexes(
            GlobalSecondaryIndex::builder()
                .index_name(CLOSING_INDEX)
                .key_schema(key(CLOSING_STORE, KeyType::Hash))
                .key_schema(key(CLOSING_TIME, KeyType::Range))
                .projection(
                    Projection::builder()
                        .projection_type(ProjectionType::KeysOnly)
                        .build(),
                )
                .build()
                .map_err(|e| err(e.to_string()))?,
        )
        .send()
        .await;
    match created {
        Ok(_) => {}
        Err(e) if e.code() == Some("ResourceInUseException") => return Ok(()),
        Err(e) => return Err(err(describe_sdk_error(&e))),
    }
    let ttl = TimeToLiveSpecification::builder()
        .enabled(true)
        .attribute_name(TTL_ATTRIBUTE)
        .build()
        .map_err(|e| err(e.to_string()))?;
    client
        .update_time_to_live()
        .table_name(table)
        .time_to_live_specification(ttl)
        .send()
        .await
        .map_err(|e| err(describe_sdk_error(&e)))?;
    Ok(())
}

fn attr(name: &str, kind: ScalarAttributeType) -> AttributeDefinition {
    AttributeDefinition::builder()
        .attribute_name(name)
        .attribute_type(kind)
        .build()
        .expect("name and type are set")
}

fn key(name: &str, kind: KeyType) -> KeySchemaElement {
    KeySchemaElement::builder()
        .attribute_name(name)
        .key_type(kind)
        .build()
        .expect("name and type are set")
}

/// A client for a local emulator at `endpoint` (e.g. dynoxide), with static dummy
/// credentials and a fixed region: it never consults the default credential chain
/// (which would query the instance metadata service). The client has the default
/// [`RetrySettings`] and a retry budget of its own.
pub fn emulator_client(endpoint: &str) -> Client {
    emulator_client_with(endpoint, RetrySettings::default())
}

/// [`emulator_client`] with other retry settings; every call gets a retry budget of its
/// own, so clients (tests, stores) never spend one another's.
pub fn emulator_client_with(endpoint: &str, retry: RetrySettings) -> Client {
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
        .endpoint_url(endpoint)
        .region(aws_sdk_dynamodb::config::Region::new("us-east-1"))
        .credentials_provider(static_credentials(
            "lambda-streams-local",
            "lambda-streams-local",
            "lambda-streams-emulator",
        ))
        .retry_config(retry.retry_config())
        .retry_partition(retry.retry_partition(endpoint))
        .http_client(https_client(TlsRoots::System))
        .build();
    Client::from_conf(config)
}

/// A [`LeanClient`] for a local emulator at `endpoint`, with the same dummy credentials and
/// region as [`emulator_client`] (for [`DynamoStore::with_lean_client`](super::DynamoStore::with_lean_client)).
pub fn emulator_lean_client(endpoint: &str) -> Result<LeanClient, String> {
    let credentials =
        aws_credential_types::provider::SharedCredentialsProvider::new(static_credentials(
            "lambda-streams-local",
            "lambda-streams-local",
            "lambda-streams-emulator",
        ));
    LeanClient::new(
        endpoint,
        "us-east-1",
        credentials,
        TlsRoots::Compiled,
        RetrySettings::default(),
    )
}
