//! How the DynamoDB client retries throttled and transient requests, and what a batch
//! does once the retries are spent.

use std::time::Duration;

use aws_sdk_dynamodb::Client;

/// How the DynamoDB client retries throttled and transient requests, and when it stops.
///
/// Every request is tried up to [`max_attempts`](Self::max_attempts) times, with
/// exponential backoff and jitter from [`initial_backoff`](Self::initial_backoff) (the
/// SDK's standard mode). The retries of one client also draw on a **retry budget**, the
/// SDK's token bucket: a retry after throttling or a service error costs 5 tokens, after a
/// timeout 10; a request that succeeds at once gives 1 back, a retry that succeeds gives its
/// tokens back, and the budget also refills over a minute of wall-clock time. When the
/// budget is spent (sustained throttling), requests are no longer retried: they fail at
/// the first refusal instead of piling retries onto a table that is already over its
/// throughput.
///
/// What a function does then is deliberate: the request's error names the table and says
/// `throttled`, the batch fails as a whole, nothing of it is emitted, and the Kafka event
/// source delivers it again (with the same or other boundaries); the watermarks of the
/// items already written make that redelivery exact (docs/state.md, "Throttling").
///
/// Each client gets a budget of its own ([`retry_partition`](Self::retry_partition)): the
/// SDK would otherwise share one bucket between every DynamoDB client of the process (its
/// default retry partition is per service), so one table's throttling would spend the
/// retries of another.
///
/// In Lambda ([`crate::lambda::run`]) the settings come from
/// `LAMBDA_STREAMS_DYNAMODB_MAX_ATTEMPTS` and `LAMBDA_STREAMS_DYNAMODB_RETRY_BUDGET`
/// ([`RetrySettings::from_env`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetrySettings {
    /// Attempts per request, the first included (`LAMBDA_STREAMS_DYNAMODB_MAX_ATTEMPTS`,
    /// default 6, at least 1: 1 never retries).
    pub max_attempts: u32,
    /// The retry budget in tokens (`LAMBDA_STREAMS_DYNAMODB_RETRY_BUDGET`, default 500, the
    /// SDK's: 100 throttled retries; 0 never retries).
    pub retry_budget: usize,
    /// The backoff before the first retry; it doubles per attempt, with jitter (25 ms).
    pub initial_backoff: Duration,
}

impl Default for RetrySettings {
    fn default() -> Self {
        RetrySettings {
            max_attempts: 6,
            retry_budget: 500,
            initial_backoff: Duration::from_millis(25),
        }
    }
}

impl RetrySettings {
    /// Parses the values of `LAMBDA_STREAMS_DYNAMODB_MAX_ATTEMPTS` and
    /// `LAMBDA_STREAMS_DYNAMODB_RETRY_BUDGET` (`None` or blank: the default); an invalid
    /// value is an error naming the variable.
    pub fn parse(
        max_attempts: Option<&str>,
        retry_budget: Option<&str>,
    ) -> Result<Self, crate::error::StreamError> {
        let mut settings = RetrySettings::default();
        if let Some(value) = max_attempts.map(str::trim).filter(|v| !v.is_empty()) {
            settings.max_attempts = value.parse().ok().filter(|n| *n >= 1).ok_or_else(|| {
                crate::error::StreamError::Config(format!(
                    "LAMBDA_STREAMS_DYNAMODB_MAX_ATTEMPTS: {value:?} is not a number of attempts (1 or more)"
                ))
            })?;
        }
        if let Some(value) = retry_budget.map(str::trim).filter(|v| !v.is_empty()) {
            settings.retry_budget = value.parse().map_err(|_| {
                crate::error::StreamError::Config(format!(
                    "LAMBDA_STREAMS_DYNAMODB_RETRY_BUDGET: {value:?} is not a number of tokens (0 or more)"
                ))
            })?;
        }
        Ok(settings)
    }

    /// Reads `LAMBDA_STREAMS_DYNAMODB_MAX_ATTEMPTS` and `LAMBDA_STREAMS_DYNAMODB_RETRY_BUDGET`
    /// from the environment ([`RetrySettings::parse`]).
    pub fn from_env() -> Result<Self, crate::error::StreamError> {
        let var = |name: &str| std::env::var(name).ok();
        Self::parse(
            var("LAMBDA_STREAMS_DYNAMODB_MAX_ATTEMPTS").as_deref(),
            var("LAMBDA_STREAMS_DYNAMODB_RETRY_BUDGET").as_deref(),
        )
    }

    /// The SDK retry configuration: standard mode, these attempts and backoff.
    pub fn retry_config(&self) -> aws_sdk_dynamodb::config::retry::RetryConfig {
        aws_sdk_dynamodb::config::retry::RetryConfig::standard()
            .with_max_attempts(self.max_attempts)
            .with_initial_backoff(self.initial_backoff)
    }

    /// A retry partition named `name` with a token bucket of its own, holding
    /// [`retry_budget`](Self::retry_budget) tokens and refilling it in a minute. Every
    /// call makes a new bucket: clients built from one partition share it, clients built
    /// from two calls do not.
    pub fn retry_partition(&self, name: &str) -> aws_sdk_dynamodb::config::retry::RetryPartition {
        use aws_sdk_dynamodb::config::retry::{RetryPartition, TokenBucket};
        let bucket = TokenBucket::builder()
            .capacity(self.retry_budget)
            .refill_rate(self.retry_budget as f32 / 60.0)
            .build();
        RetryPartition::custom(format!("lambda-streams-dynamodb-{name}"))
            .token_bucket(bucket)
            .build()
    }

    /// A DynamoDB client for `table` from a loaded SDK configuration, with these retry
    /// settings and a retry budget of its own.
    pub fn client(&self, sdk: &aws_config::SdkConfig, table: &str) -> Client {
        let config = aws_sdk_dynamodb::config::Builder::from(sdk)
            .retry_config(self.retry_config())
            .retry_partition(self.retry_partition(table))
            .build();
        Client::from_conf(config)
    }
}

/// The default retry configuration ([`RetrySettings::default`]): up to 6 attempts,
/// exponential backoff with jitter from 25 ms.
pub fn retry_config() -> aws_sdk_dynamodb::config::retry::RetryConfig {
    RetrySettings::default().retry_config()
}

/// The error codes with which DynamoDB refuses a request for throughput (the SDK
/// classifies them as throttling and retries them).
const THROTTLING_CODES: [&str; 3] = [
    "ProvisionedThroughputExceededException",
    "ThrottlingException",
    "RequestLimitExceeded",
];

/// The description of a failed request to `table`, from the service's error `code`:
/// throttling, once the client stopped retrying it, is said so, with the table and what
/// happens next.
pub(super) fn describe_request(table: &str, code: Option<&str>, described: String) -> String {
    if code.is_some_and(|code| THROTTLING_CODES.contains(&code)) {
        format!(
            "table \"{table}\" throttled: {described} (the client's retries are spent: \
             LAMBDA_STREAMS_DYNAMODB_MAX_ATTEMPTS attempts, or its retry budget \
             LAMBDA_STREAMS_DYNAMODB_RETRY_BUDGET; the batch fails and is delivered again)"
        )
    } else {
        described
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_settings_parse_defaults_values_and_name_the_bad_variable() {
        assert_eq!(
            RetrySettings::parse(None, Some(" ")).expect("defaults"),
            RetrySettings::default()
        );
        let set = RetrySettings::parse(Some("3"), Some("0")).expect("valid");
        assert_eq!((set.max_attempts, set.retry_budget), (3, 0));
        for (attempts, budget, variable) in [
            (Some("0"), None, "LAMBDA_STREAMS_DYNAMODB_MAX_ATTEMPTS"),
            (Some("six"), None, "LAMBDA_STREAMS_DYNAMODB_MAX_ATTEMPTS"),
            (None, Some("-1"), "LAMBDA_STREAMS_DYNAMODB_RETRY_BUDGET"),
        ] {
            let error = RetrySettings::parse(attempts, budget).expect_err("invalid");
            assert!(error.to_string().contains(variable), "{error}");
        }
    }

    #[test]
    fn a_throttled_request_names_the_table_and_says_throttled() {
        let text = describe_request(
            "state",
            Some("ProvisionedThroughputExceededException"),
            "ProvisionedThroughputExceededException: rate".into(),
        );
        assert!(text.starts_with("table \"state\" throttled: "), "{text}");
        let other = describe_request("state", Some("ValidationException"), "bad".into());
        assert_eq!(other, "bad");
    }
}
