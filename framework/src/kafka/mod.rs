//! How a function's producer connects to Kafka: TLS, SASL/SCRAM, MSK IAM and any librdkafka
//! property, from the environment.
//!
//! | variable | meaning |
//! |---|---|
//! | `LAMBDA_STREAMS_KAFKA_SECURITY_PROTOCOL` | `PLAINTEXT` (default), `SSL`, `SASL_PLAINTEXT` or `SASL_SSL` |
//! | `LAMBDA_STREAMS_KAFKA_SASL_MECHANISM` | `SCRAM-SHA-512`, `SCRAM-SHA-256`, `PLAIN`, or `AWS_MSK_IAM` (SASL/OAUTHBEARER with a token signed with the function role's credentials); with a mechanism, the protocol defaults to `SASL_SSL` |
//! | `LAMBDA_STREAMS_KAFKA_SASL_USERNAME`, `LAMBDA_STREAMS_KAFKA_SASL_PASSWORD` | SCRAM/PLAIN credentials (plain environment variables; see below) |
//! | `LAMBDA_STREAMS_KAFKA_SSL_CA_LOCATION` | PEM file of the CAs to trust; with TLS and without it, the system's CA bundle (`probe`) |
//! | `LAMBDA_STREAMS_KAFKA_<PROPERTY>` | any other librdkafka property, its name upper-cased with `.` written `_` (`LAMBDA_STREAMS_KAFKA_SSL_ENDPOINT_IDENTIFICATION_ALGORITHM=none` sets `ssl.endpoint.identification.algorithm`) |
//!
//! Every property is checked against librdkafka when the settings are read: an unknown
//! property or an invalid value is an error naming the variable. `bootstrap.servers` is
//! not accepted here (it is `LAMBDA_STREAMS_BOOTSTRAP_SERVERS`, or the event's).
//! `LAMBDA_STREAMS_KAFKA_HEAP` belongs to `scripts/services` and is ignored.
//!
//! The SCRAM password is read from the environment as it is: encrypt the function's
//! environment with KMS, or prefer `AWS_MSK_IAM`. Reading it from a Secrets Manager secret
//! (as the event source mapping does) is not implemented yet.
//!
//! `AWS_MSK_IAM` tokens are byte-identical to botocore's (unit tests below) and are accepted
//! in a real handshake by a local broker whose listener checks them with an independent SigV4
//! validator (`scripts/kafka/msk-iam`, `tests/tests/kafka_security.rs`); AWS's own MSK
//! authorizer and IAM policies are not exercised.

mod context;
mod iam;
mod settings;
mod sink;
mod transactional;
mod transactions;

pub(crate) use context::ConnectionHealth;
pub use context::SinkContext;
pub use iam::{MskIamSigner, msk_iam_token};
pub use settings::{AWS_MSK_IAM, ENV_PREFIX, KafkaProperty, KafkaSettings};
pub use sink::KafkaSink;
pub use transactional::KafkaTransactions;
pub use transactions::{
    Committed, ExactlyOnceOutput, TransactionReport, TransactionalLog, TransactionalProducer,
    TxnError, check_application_id,
};
