//! The producer's connection settings, read from `LAMBDA_STREAMS_KAFKA_*` (see the
//! [module table](super)).

use std::fmt;

use rdkafka::ClientConfig;
use rdkafka::error::KafkaError;

use crate::error::StreamError;

/// The prefix of the variables read here.
pub const ENV_PREFIX: &str = "LAMBDA_STREAMS_KAFKA_";

/// Variables with [`ENV_PREFIX`] that are not librdkafka properties.
const IGNORED: &[&str] = &["LAMBDA_STREAMS_KAFKA_HEAP"];

/// The `sasl.mechanism` value that selects MSK IAM.
pub const AWS_MSK_IAM: &str = "AWS_MSK_IAM";

/// One librdkafka property and the variable it came from.
#[derive(Clone, PartialEq, Eq)]
pub struct KafkaProperty {
    /// The librdkafka property (`security.protocol`).
    pub name: String,
    /// Its value.
    pub value: String,
    /// The environment variable that set it, or `(default)`.
    pub variable: String,
}

impl fmt::Debug for KafkaProperty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value = if is_secret(&self.name) {
            "<redacted>"
        } else {
            &self.value
        };
        write!(f, "{}={value} ({})", self.name, self.variable)
    }
}

/// Whether a property holds a secret (never logged).
fn is_secret(name: &str) -> bool {
    name.contains("password") || name.contains("secret") || name == "ssl.key.pem"
}

/// The producer's connection settings: librdkafka properties, and MSK IAM.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KafkaSettings {
    properties: Vec<KafkaProperty>,
    msk_iam_region: Option<String>,
}

impl KafkaSettings {
    /// Plaintext, no authentication: no property set.
    pub fn plaintext() -> Self {
        Self::default()
    }

    /// Reads the `LAMBDA_STREAMS_KAFKA_*` variables (and `AWS_REGION` for MSK IAM) of the
    /// process environment. See the [module](crate::kafka) documentation.
    pub fn from_env() -> Result<Self, StreamError> {
        Self::from_vars(std::env::vars())
    }

    /// Reads the settings from these `(variable, value)` pairs (the environment, in tests).
    pub fn from_vars(
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, StreamError> {
        let config = |msg: String| StreamError::Config(msg);
        let var = |suffix: &str| format!("{ENV_PREFIX}{suffix}");
        let mut region = None;
        let mut given: Vec<(String, String)> = Vec::new();
        for (name, value) in vars {
            if name == "AWS_REGION" {
                region = Some(value);
                continue;
            }
            if !name.starts_with(ENV_PREFIX)
                || IGNORED.contains(&name.as_str())
                || value.trim().is_empty()
            {
                continue;
            }
            // A password is taken as it is; other values without surrounding blanks.
            let value = if name.contains("PASSWORD") {
                value
            } else {
                value.trim().to_owned()
            };
            given.push((name, value));
        }
        given.sort();
        let mut settings = KafkaSettings::default();
        let mut protocol: Option<String> = None;
        let mut mechanism: Option<String> = None;
        for (variable, value) in given {
            let suffix = &variable[ENV_PREFIX.len()..];
            let name = property_name(suffix);
            let value = match name.as_str() {
                "bootstrap.servers" => {
                    return Err(config(format!(
                        "{variable}: set the output brokers with LAMBDA_STREAMS_BOOTSTRAP_SERVERS"
                    )));
                }
                "security.protocol" => {
                    let upper = value.to_ascii_uppercase();
                    if !["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"].contains(&upper.as_str())
                    {
                        return Err(config(format!(
                            "{variable}: {value:?} is not PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"
                        )));
                    }
                    protocol = Some(upper.clone());
                    upper
                }
                "sasl.mechanism" | "sasl.mechanisms" => {
                    let upper = value.to_ascii_uppercase();
                    match upper.as_str() {
                        "SCRAM-SHA-256" | "SCRAM-SHA-512" | "PLAIN" => {}
                        AWS_MSK_IAM => {}
                        "OAUTHBEARER" => {
                            return Err(config(format!(
                                "{variable}: OAUTHBEARER needs a token provider: use AWS_MSK_IAM for MSK IAM authentication"
                            )));
                        }
                        _ => {
                            return Err(config(format!(
                                "{variable}: {value:?} is not SCRAM-SHA-512, SCRAM-SHA-256, PLAIN or AWS_MSK_IAM (GSSAPI is not built in)"
                            )));
                        }
                    }
                    mechanism = Some(upper.clone());
                    if upper == AWS_MSK_IAM {
                        "OAUTHBEARER".to_owned()
                    } else {
                        upper
                    }
                }
                _ => value,
            };
            let name = if name == "sasl.mechanisms" {
                "sasl.mechanism".to_owned()
            } else {
                name
            };
            check_property(&variable, &name, &value)?;
            settings.properties.push(KafkaProperty {
                name,
                value,
                variable,
            });
        }
        let has = |settings: &KafkaSettings, name: &str| settings.get(name).is_some();
        match (protocol.clone(), mechanism.clone()) {
            (None, Some(_)) => {
                protocol = Some("SASL_SSL".to_owned());
                settings.push_default("security.protocol", "SASL_SSL");
            }
            (Some(p), None) if p.starts_with("SASL_") => {
                return Err(config(format!(
                    "{}={p} needs {}",
                    var("SECURITY_PROTOCOL"),
                    var("SASL_MECHANISM")
                )));
            }
            (Some(p), Some(m)) if !p.starts_with("SASL_") => {
                return Err(config(format!(
                    "{}={m} needs {}=SASL_SSL or SASL_PLAINTEXT, not {p}",
                    var("SASL_MECHANISM"),
                    var("SECURITY_PROTOCOL")
                )));
            }
            _ => {}
        }
        match mechanism.as_deref() {
            Some(AWS_MSK_IAM) => {
                if has(&settings, "sasl.username") || has(&settings, "sasl.password") {
                    return Err(config(format!(
                        "{}=AWS_MSK_IAM signs with the function's role: unset {} and {}",
                        var("SASL_MECHANISM"),
                        var("SASL_USERNAME"),
                        var("SASL_PASSWORD")
                    )));
                }
                let Some(region) = region.filter(|r| !r.trim().is_empty()) else {
                    return Err(config(format!(
                        "{}=AWS_MSK_IAM needs AWS_REGION (the cluster's region; Lambda sets it)",
                        var("SASL_MECHANISM")
                    )));
                };
                settings.msk_iam_region = Some(region);
            }
            Some(m) if !has(&settings, "sasl.username") || !has(&settings, "sasl.password") => {
                return Err(config(format!(
                    "{}={m} needs {} and {}",
                    var("SASL_MECHANISM"),
                    var("SASL_USERNAME"),
                    var("SASL_PASSWORD")
                )));
            }
            _ => {}
        }
        if protocol.as_deref().is_some_and(|p| p.ends_with("SSL"))
            && !has(&settings, "ssl.ca.location")
            && !has(&settings, "ssl.ca.pem")
        {
            // Probe the system's bundle (/etc/pki/tls/certs/ca-bundle.crt in Lambda's
            // provided.al2023): the system's OpenSSL would find it by its own defaults, but
            // a vendored one (`openssl-vendored`) has no usable default CA directory.
            settings.push_default("ssl.ca.location", "probe");
        }
        Ok(settings)
    }

    fn push_default(&mut self, name: &str, value: &str) {
        self.properties.push(KafkaProperty {
            name: name.to_owned(),
            value: value.to_owned(),
            variable: "(default)".to_owned(),
        });
    }

    /// The librdkafka properties to set, in order.
    pub fn properties(&self) -> &[KafkaProperty] {
        &self.properties
    }

    /// The value of a property, if set.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.properties
            .iter()
            .rev()
            .find(|p| p.name == name)
            .map(|p| p.value.as_str())
    }

    /// With MSK IAM: the region the tokens are signed for.
    pub fn msk_iam_region(&self) -> Option<&str> {
        self.msk_iam_region.as_deref()
    }

    /// The variables to check when the connection cannot be set up, for error messages.
    pub fn hint(&self) -> String {
        if self.msk_iam_region.is_some() {
            return format!(
                "check {ENV_PREFIX}SASL_MECHANISM=AWS_MSK_IAM, the cluster's IAM authentication (port 9098) and the function role's kafka-cluster:Connect permission"
            );
        }
        let vars: Vec<String> = self
            .properties
            .iter()
            .filter(|p| {
                p.name.starts_with("sasl.")
                    || p.name.starts_with("ssl.")
                    || p.name == "security.protocol"
            })
            .map(|p| {
                if p.variable == "(default)" {
                    format!(
                        "{ENV_PREFIX}{} (unset: {})",
                        p.name.to_ascii_uppercase().replace('.', "_"),
                        p.value
                    )
                } else {
                    p.variable.clone()
                }
            })
            .collect();
        if vars.is_empty() {
            format!(
                "no {ENV_PREFIX}* security setting is set (the producer connects in PLAINTEXT): set {ENV_PREFIX}SECURITY_PROTOCOL and friends if the brokers need TLS or SASL"
            )
        } else {
            format!("check {}", vars.join(", "))
        }
    }
}

/// `SSL_CA_LOCATION` → `ssl.ca.location`; `LOG_LEVEL` → `log_level`.
fn property_name(suffix: &str) -> String {
    match suffix {
        "LOG_LEVEL" => "log_level".to_owned(),
        "ENABLED_EVENTS" => "enabled_events".to_owned(),
        _ => suffix.to_ascii_lowercase().replace('_', "."),
    }
}

/// Asks librdkafka whether it takes this property and value.
fn check_property(variable: &str, name: &str, value: &str) -> Result<(), StreamError> {
    let mut config = ClientConfig::new();
    config.set(name, value);
    match config.create_native_config() {
        Ok(_) => Ok(()),
        Err(KafkaError::ClientConfig(_, reason, _, _)) => Err(StreamError::Config(format!(
            "{variable}: librdkafka does not accept {name}={}: {reason}",
            if is_secret(name) { "<redacted>" } else { value }
        ))),
        Err(e) => Err(StreamError::Config(format!("{variable}: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn error(pairs: &[(&str, &str)]) -> String {
        KafkaSettings::from_vars(vars(pairs))
            .expect_err("invalid")
            .to_string()
    }

    #[test]
    fn nothing_set_is_plaintext_without_properties() {
        let settings = KafkaSettings::from_vars(vars(&[("PATH", "/bin")])).expect("valid");
        assert_eq!(settings, KafkaSettings::plaintext());
        assert!(settings.properties().is_empty());
    }

    #[test]
    fn scram_over_tls() {
        let settings = KafkaSettings::from_vars(vars(&[
            ("LAMBDA_STREAMS_KAFKA_SASL_MECHANISM", "scram-sha-512"),
            ("LAMBDA_STREAMS_KAFKA_SASL_USERNAME", "alice"),
            ("LAMBDA_STREAMS_KAFKA_SASL_PASSWORD", "s3cret"),
            ("LAMBDA_STREAMS_KAFKA_HEAP", "-Xmx1g"),
        ]))
        .expect("valid");
        assert_eq!(settings.get("security.protocol"), Some("SASL_SSL"));
        assert_eq!(settings.get("sasl.mechanism"), Some("SCRAM-SHA-512"));
        assert_eq!(settings.get("sasl.username"), Some("alice"));
        assert_eq!(settings.get("ssl.ca.location"), Some("probe"));
        assert_eq!(settings.msk_iam_region(), None);
        let debug = format!("{settings:?}");
        assert!(!debug.contains("s3cret"), "{debug}");
        assert!(debug.contains("<redacted>"), "{debug}");
    }

    #[test]
    fn a_password_is_taken_as_it_is() {
        let settings = KafkaSettings::from_vars(vars(&[
            ("LAMBDA_STREAMS_KAFKA_SECURITY_PROTOCOL", " SASL_PLAINTEXT "),
            ("LAMBDA_STREAMS_KAFKA_SASL_MECHANISM", "PLAIN"),
            ("LAMBDA_STREAMS_KAFKA_SASL_USERNAME", "bob "),
            ("LAMBDA_STREAMS_KAFKA_SASL_PASSWORD", " p w "),
        ]))
        .expect("valid");
        assert_eq!(settings.get("sasl.password"), Some(" p w "));
        assert_eq!(settings.get("sasl.username"), Some("bob"));
        assert_eq!(settings.get("security.protocol"), Some("SASL_PLAINTEXT"));
    }

    #[test]
    fn passthrough_properties_and_a_given_ca() {
        let settings = KafkaSettings::from_vars(vars(&[
            ("LAMBDA_STREAMS_KAFKA_SECURITY_PROTOCOL", "ssl"),
            ("LAMBDA_STREAMS_KAFKA_SSL_CA_LOCATION", "/tmp/ca.pem"),
            (
                "LAMBDA_STREAMS_KAFKA_SSL_ENDPOINT_IDENTIFICATION_ALGORITHM",
                "none",
            ),
            ("LAMBDA_STREAMS_KAFKA_LINGER_MS", "20"),
        ]))
        .expect("valid");
        assert_eq!(settings.get("security.protocol"), Some("SSL"));
        assert_eq!(settings.get("ssl.ca.location"), Some("/tmp/ca.pem"));
        assert_eq!(
            settings.get("ssl.endpoint.identification.algorithm"),
            Some("none")
        );
        assert_eq!(settings.get("linger.ms"), Some("20"));
    }

    #[test]
    fn invalid_settings_name_the_variable() {
        assert_eq!(
            error(&[("LAMBDA_STREAMS_KAFKA_SECURITY_PROTOCOL", "TLS")]),
            "configuration: LAMBDA_STREAMS_KAFKA_SECURITY_PROTOCOL: \"TLS\" is not PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"
        );
        assert!(
            error(&[("LAMBDA_STREAMS_KAFKA_SASL_MECHANISM", "GSSAPI")]).starts_with(
                "configuration: LAMBDA_STREAMS_KAFKA_SASL_MECHANISM: \"GSSAPI\" is not"
            )
        );
        assert_eq!(
            error(&[("LAMBDA_STREAMS_KAFKA_SASL_MECHANISM", "SCRAM-SHA-256")]),
            "configuration: LAMBDA_STREAMS_KAFKA_SASL_MECHANISM=SCRAM-SHA-256 needs LAMBDA_STREAMS_KAFKA_SASL_USERNAME and LAMBDA_STREAMS_KAFKA_SASL_PASSWORD"
        );
        assert_eq!(
            error(&[("LAMBDA_STREAMS_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")]),
            "configuration: LAMBDA_STREAMS_KAFKA_SECURITY_PROTOCOL=SASL_SSL needs LAMBDA_STREAMS_KAFKA_SASL_MECHANISM"
        );
        assert_eq!(
            error(&[
                ("LAMBDA_STREAMS_KAFKA_SECURITY_PROTOCOL", "SSL"),
                ("LAMBDA_STREAMS_KAFKA_SASL_MECHANISM", "AWS_MSK_IAM"),
            ]),
            "configuration: LAMBDA_STREAMS_KAFKA_SASL_MECHANISM=AWS_MSK_IAM needs LAMBDA_STREAMS_KAFKA_SECURITY_PROTOCOL=SASL_SSL or SASL_PLAINTEXT, not SSL"
        );
        assert_eq!(
            error(&[("LAMBDA_STREAMS_KAFKA_SASL_MECHANISM", "AWS_MSK_IAM")]),
            "configuration: LAMBDA_STREAMS_KAFKA_SASL_MECHANISM=AWS_MSK_IAM needs AWS_REGION (the cluster's region; Lambda sets it)"
        );
        assert_eq!(
            error(&[("LAMBDA_STREAMS_KAFKA_BOOTSTRAP_SERVERS", "b:9092")]),
            "configuration: LAMBDA_STREAMS_KAFKA_BOOTSTRAP_SERVERS: set the output brokers with LAMBDA_STREAMS_BOOTSTRAP_SERVERS"
        );
        let unknown = error(&[("LAMBDA_STREAMS_KAFKA_SASL_PASWORD", "x")]);
        assert!(
            unknown.starts_with("configuration: LAMBDA_STREAMS_KAFKA_SASL_PASWORD: librdkafka does not accept sasl.pasword=x:"),
            "{unknown}"
        );
        let bad_value = error(&[("LAMBDA_STREAMS_KAFKA_LINGER_MS", "soon")]);
        assert!(
            bad_value.starts_with("configuration: LAMBDA_STREAMS_KAFKA_LINGER_MS: librdkafka does not accept linger.ms=soon:"),
            "{bad_value}"
        );
    }

    #[test]
    fn msk_iam_selects_oauthbearer_over_tls_in_the_lambda_region() {
        let settings = KafkaSettings::from_vars(vars(&[
            ("LAMBDA_STREAMS_KAFKA_SASL_MECHANISM", "AWS_MSK_IAM"),
            ("AWS_REGION", "eu-west-3"),
        ]))
        .expect("valid");
        assert_eq!(settings.get("sasl.mechanism"), Some("OAUTHBEARER"));
        assert_eq!(settings.get("security.protocol"), Some("SASL_SSL"));
        assert_eq!(settings.msk_iam_region(), Some("eu-west-3"));
    }
}
