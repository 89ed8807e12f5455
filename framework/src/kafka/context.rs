//! The producer's client context: connection health (recent authentication and TLS
//! failures) and the MSK IAM token callback.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rdkafka::client::{ClientContext, OAuthToken};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use super::iam::MskIamSigner;
use super::settings::KafkaSettings;

/// How long an authentication or TLS failure of the producer keeps failing sends fast.
pub(crate) const FAILURE_MEMORY: Duration = Duration::from_secs(10);

/// The producer's context: remembers authentication and TLS failures (so that a batch
/// fails at once with a clear error instead of after the message timeout), and with MSK
/// IAM, makes the SASL/OAUTHBEARER tokens.
pub struct SinkContext {
    health: Arc<ConnectionHealth>,
    msk_iam: Option<MskIamSigner>,
}

impl SinkContext {
    /// A context for these settings (`msk_iam` when they select MSK IAM).
    pub(crate) fn new(settings: &KafkaSettings, msk_iam: Option<MskIamSigner>) -> Self {
        SinkContext {
            health: Arc::new(ConnectionHealth {
                hint: settings.hint(),
                failure: Mutex::new(None),
            }),
            msk_iam,
        }
    }

    /// What the context learns about the connection, shared with the sink.
    pub(crate) fn health(&self) -> Arc<ConnectionHealth> {
        Arc::clone(&self.health)
    }
}

/// The producer's recent authentication and TLS failures.
pub(crate) struct ConnectionHealth {
    hint: String,
    failure: Mutex<Option<(Instant, String)>>,
}

impl ConnectionHealth {
    fn failed(&self, reason: String) {
        *self.failure.lock().unwrap_or_else(PoisonError::into_inner) =
            Some((Instant::now(), reason));
    }

    /// The last authentication or TLS failure, if it is recent.
    pub(crate) fn recent_failure(&self) -> Option<String> {
        let failure = self.failure.lock().unwrap_or_else(PoisonError::into_inner);
        failure
            .as_ref()
            .filter(|(at, _)| at.elapsed() < FAILURE_MEMORY)
            .map(|(_, reason)| reason.clone())
    }

    /// Forgets failures: a record was delivered, so the connection works.
    pub(crate) fn delivered(&self) {
        *self.failure.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// What to check, for error messages.
    pub(crate) fn hint(&self) -> &str {
        &self.hint
    }
}

/// The shadow group's consumer of the exactly-once output (never subscribed) uses it too.
impl rdkafka::consumer::ConsumerContext for SinkContext {}

impl ClientContext for SinkContext {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn error(&self, error: KafkaError, reason: &str) {
        let code = error.rdkafka_error_code();
        if matches!(
            code,
            Some(
                RDKafkaErrorCode::Authentication
                    | RDKafkaErrorCode::SSL
                    | RDKafkaErrorCode::SaslAuthenticationFailed
            )
        ) {
            tracing::error!(error = %error, reason, hint = %self.health.hint, "kafka producer cannot connect");
            self.health.failed(format!("{error}: {reason}"));
        } else {
            tracing::warn!(error = %error, reason, "kafka producer error");
        }
    }

    fn generate_oauth_token(
        &self,
        _oauthbearer_config: Option<&str>,
    ) -> Result<OAuthToken, Box<dyn std::error::Error>> {
        match &self.msk_iam {
            Some(signer) => signer.token().map_err(|e| {
                tracing::error!(error = %e, "cannot make an MSK IAM token");
                self.health.failed(e.clone());
                e.into()
            }),
            None => {
                Err("SASL/OAUTHBEARER without AWS_MSK_IAM: no token provider is configured".into())
            }
        }
    }
}
