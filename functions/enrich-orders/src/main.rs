//! The `enrich-orders` Lambda function.

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    lambda_streams::lambda::run(enrich_orders::topology_from_env()).await
}
