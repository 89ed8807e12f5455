//! The `orders-avro` Lambda function.

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    let topology = orders_avro::topology_from_env()?;
    lambda_streams::lambda::run(topology).await
}
