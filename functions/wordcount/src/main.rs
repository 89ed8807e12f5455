//! The `wordcount` Lambda function.

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    lambda_streams::lambda::run(wordcount::topology_from_env()?).await
}
