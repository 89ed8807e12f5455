//! How the runner invokes a function. One trait, so that a function linked into the
//! runner and one served over the Lambda Invoke API are driven the same way.

use std::sync::Arc;

use async_trait::async_trait;
use lambda_streams::lambda::Handler;

/// The function failed, or could not be reached: the batch is retried.
#[derive(Debug, thiserror::Error)]
#[error("invocation failed: {0}")]
pub struct InvokeError(pub String);

/// Invokes a function with an event's JSON and returns the function's response JSON.
#[async_trait]
pub trait Transport: Send + Sync {
    /// One invocation.
    async fn invoke(&self, payload: Vec<u8>) -> Result<Vec<u8>, InvokeError>;
}

/// A function of this workspace, linked into the runner: its [`Handler`] is called
/// directly, with the event JSON exactly as Lambda would deliver it.
pub struct InProcess {
    handler: Arc<Handler>,
}

impl InProcess {
    /// Wraps a handler.
    pub fn new(handler: Arc<Handler>) -> Self {
        InProcess { handler }
    }
}

#[async_trait]
impl Transport for InProcess {
    async fn invoke(&self, payload: Vec<u8>) -> Result<Vec<u8>, InvokeError> {
        match self.handler.handle_json(&payload).await {
            Ok(_) => Ok(br#"{"batchItemFailures":[]}"#.to_vec()),
            Err(e) => Err(InvokeError(e.to_string())),
        }
    }
}
