//! How the runner invokes a function. One trait, so that a function linked into the
//! runner ([`InProcess`]) and one served over the Lambda Invoke API ([`Http`]) are driven
//! the same way: the event's JSON in, the function's response JSON out.
//!
//! A transport only reports what happened. What a response means (success, a partial
//! batch failure, an invalid answer) is decided by the runner
//! ([`response`](crate::response)).

mod http;

use std::sync::Arc;

use async_trait::async_trait;
use lambda_streams::Topology;
use lambda_streams::error::StreamError;
use lambda_streams::lambda::{Config, Handler};
use lambda_streams::state::Store;

pub use http::Http;

/// The function failed, or could not be reached: the whole batch counts as failed and
/// is retried. The text is the function's error payload, or what went wrong on the way.
#[derive(Debug, Clone, thiserror::Error)]
#[error("invocation failed: {0}")]
pub struct InvokeError(pub String);

/// Invokes a function with an event's JSON and returns the function's response JSON.
///
/// Implement it to drive any function: the tests implement it with functions that
/// record what they were given and answer as a real function would (an error, or a
/// partial batch response).
#[async_trait]
pub trait Transport: Send + Sync {
    /// One invocation. `Ok` is the response body of a function that returned normally
    /// (it may still report failed records); `Err` is a function error.
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

    /// The function `topology` on `store`, with its own settings read from the
    /// environment as in Lambda ([`Config::from_env`]: poison policy, partial batch
    /// responses, emit-on-close windows, output brokers, the producer's TLS/SASL, EMF
    /// metrics) and wired by [`Handler::from_config`], as [`lambda::run`] wires it.
    ///
    /// [`lambda::run`]: lambda_streams::lambda::run
    pub fn from_env(topology: Topology, store: Arc<dyn Store>) -> Result<Self, StreamError> {
        let config = Config::from_env()?;
        Ok(InProcess::new(Arc::new(Handler::try_from_config(
            topology, store, &config,
        )?)))
    }

    /// The handler it calls.
    pub fn handler(&self) -> &Handler {
        &self.handler
    }
}

#[async_trait]
impl Transport for InProcess {
    async fn invoke(&self, payload: Vec<u8>) -> Result<Vec<u8>, InvokeError> {
        // The function's own response: with partial batch responses, the failed partitions.
        match self.handler.invoke_json(&payload).await {
            Ok(response) => Ok(response.to_string().into_bytes()),
            Err(e) => Err(InvokeError(e.to_string())),
        }
    }
}
