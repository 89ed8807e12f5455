//! The `pageviews` Lambda function.

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    lambda_streams::lambda::run(pageviews::topology_from_env()).await
}
