//! A client of the AWS Glue Schema Registry: schemas fetched by schema version id
//! (`GetSchemaVersion`), output schemas looked up (`GetSchemaByDefinition`) or registered
//! (`RegisterSchemaVersion`) under a schema name, each call a SigV4-signed request of
//! Glue's JSON API (`X-Amz-Target: AWSGlue.<Action>`, `application/x-amz-json-1.1`).
//!
//! Not proven against Glue itself: no Glue service runs where this was built. Its tests
//! check the requests it sends (target, body, a SigV4 signature equal to botocore's for the
//! same request) and read the answers' documented shapes from a local HTTP server.
//!
//! As [`RegistryClient`](super::registry::RegistryClient): answers are cached (bounded),
//! so a container asks once per schema version; a request runs on a short thread of its
//! own; a Glue that cannot be reached, throttles (`ThrottlingException`), refuses the
//! credentials (`AccessDeniedException`, ...) or fails (5xx) fails the batch (the event
//! source retries it) instead of making the record a poison record; an unknown schema
//! version (`EntityNotFoundException`) makes it one.

use std::sync::Arc;
use std::time::SystemTime;

use aws_credential_types::Credentials;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};

use super::registry::{Answer, block_on_own_thread, send};
use super::{
    BoundedCache, DEFAULT_CACHE_CAPACITY, RegisteredSchema, SchemaError, SchemaId, SchemaSource,
    SchemaType, Subject, WireFormat,
};
use crate::aws::TlsRoots;
use crate::serdes::UNAVAILABLE_PREFIX;

/// Glue's JSON protocol content type.
const CONTENT_TYPE: &str = "application/x-amz-json-1.1";

/// The registry Glue's serializers use when none is named.
pub const DEFAULT_REGISTRY: &str = "default-registry";

/// An AWS Glue Schema Registry reached with SigV4-signed requests.
///
/// Output schemas are found under the schema named by the serde's subject (Glue's
/// serializers name a schema after its topic by default: use [`Subject::named`]) in the
/// registry set with [`registry`](Self::registry).
///
/// ```no_run
/// use aws_credential_types::provider::SharedCredentialsProvider;
/// use lambda_streams::serdes::schema::glue::GlueRegistryClient;
///
/// # fn credentials() -> SharedCredentialsProvider { unimplemented!() }
/// // In Lambda: the function role's credentials, e.g. from aws_config's default chain.
/// let glue = GlueRegistryClient::new("eu-west-1", credentials())?
///     .registry("orders-registry")
///     .auto_register(false);
/// # Ok::<(), lambda_streams::serdes::schema::SchemaError>(())
/// ```
pub struct GlueRegistryClient {
    region: String,
    endpoint: String,
    registry: String,
    auto_register: bool,
    credentials: SharedCredentialsProvider,
    roots: TlsRoots,
    schemas: BoundedCache<SchemaId, RegisteredSchema>,
    ids: BoundedCache<(Subject, RegisteredSchema), SchemaId>,
}

impl std::fmt::Debug for GlueRegistryClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GlueRegistryClient")
            .field("endpoint", &self.endpoint)
            .field("registry", &self.registry)
            .field("auto_register", &self.auto_register)
            .finish_non_exhaustive()
    }
}

impl GlueRegistryClient {
    /// A client of Glue in `region` (`https://glue.<region>.amazonaws.com`, or the
    /// standard `AWS_ENDPOINT_URL_GLUE` when it is set), signing with `credentials`; output
    /// schemas in [`DEFAULT_REGISTRY`], registered when missing.
    ///
    /// # Errors
    ///
    /// `region` is not a region's name.
    pub fn new(region: &str, credentials: SharedCredentialsProvider) -> Result<Self, SchemaError> {
        if region.is_empty()
            || !region
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            return Err(SchemaError(format!(
                "Glue schema registry: {region:?} is not an AWS region"
            )));
        }
        let endpoint = std::env::var("AWS_ENDPOINT_URL_GLUE")
            .ok()
            .filter(|e| !e.trim().is_empty())
            .unwrap_or_else(|| format!("https://glue.{region}.amazonaws.com"));
        Ok(GlueRegistryClient {
            region: region.to_owned(),
            endpoint: endpoint.trim().trim_end_matches('/').to_owned(),
            registry: DEFAULT_REGISTRY.to_owned(),
            auto_register: true,
            credentials,
            roots: TlsRoots::Compiled,
            schemas: BoundedCache::new(DEFAULT_CACHE_CAPACITY),
            ids: BoundedCache::new(DEFAULT_CACHE_CAPACITY),
        })
    }

    /// Sends the requests to `url` instead (a VPC endpoint, a test server).
    pub fn endpoint(mut self, url: &str) -> Self {
        self.endpoint = url.trim().trim_end_matches('/').to_owned();
        self
    }

    /// The registry output schemas are looked up or registered in.
    pub fn registry(mut self, name: &str) -> Self {
        self.registry = name.to_owned();
        self
    }

    /// Whether an output schema missing from its schema is registered as a new version
    /// (`true`, the default) or is an error (`false`).
    pub fn auto_register(mut self, register: bool) -> Self {
        self.auto_register = register;
        self
    }

    /// The root certificates trusted over HTTPS (default [`TlsRoots::Compiled`]).
    pub fn tls_roots(mut self, roots: TlsRoots) -> Self {
        self.roots = roots;
        self
    }

    /// Calls Glue's `action` with the JSON `body`: credentials fetched, the request signed
    /// and sent on a thread of its own.
    fn call(&self, action: &str, body: serde_json::Value) -> Result<Answer, String> {
        let provider = self.credentials.clone();
        let url = format!("{}/", self.endpoint);
        let region = self.region.clone();
        let roots = self.roots;
        let target = format!("AWSGlue.{action}");
        block_on_own_thread(format!("Glue {action} at {url}"), async move {
            let credentials = provider
                .provide_credentials()
                .await
                .map_err(|e| format!("cannot load AWS credentials for Glue: {e}"))?;
            let body = body.to_string().into_bytes();
            let headers = signed_headers(
                &url,
                &region,
                &target,
                &body,
                &credentials,
                SystemTime::now(),
            )?;
            send("POST", &url, headers, roots, body).await
        })
    }

    /// Calls `action`, mapping Glue's errors: the record's fault (`Ok(Err)`, an entity not
    /// found) or Glue's unavailability (`Err`, marked for the batch to be retried).
    fn answer(
        &self,
        what: &str,
        action: &str,
        body: serde_json::Value,
    ) -> Result<Result<serde_json::Value, String>, SchemaError> {
        let unavailable = |e: String| SchemaError(format!("{UNAVAILABLE_PREFIX}{what}: {e}"));
        let answer = self.call(action, body).map_err(unavailable)?;
        let json: serde_json::Value = serde_json::from_slice(&answer.body).unwrap_or_default();
        if answer.status == 200 {
            return Ok(Ok(json));
        }
        let kind = error_type(&json);
        let message = json
            .get("Message")
            .or_else(|| json.get("message"))
            .and_then(serde_json::Value::as_str)
            .map_or_else(
                || {
                    String::from_utf8_lossy(&answer.body)
                        .chars()
                        .take(300)
                        .collect()
                },
                str::to_owned,
            );
        let reason = format!("HTTP {}: {kind}: {message}", answer.status);
        match kind.as_str() {
            "EntityNotFoundException" | "InvalidInputException" if answer.status < 500 => {
                Ok(Err(reason))
            }
            _ => Err(unavailable(reason)),
        }
    }
}

/// The error type of Glue's JSON error answer (`__type`, without its namespace).
fn error_type(json: &serde_json::Value) -> String {
    json.get("__type")
        .and_then(serde_json::Value::as_str)
        .map(|t| t.rsplit('#').next().unwrap_or(t).to_owned())
        .unwrap_or_else(|| "unknown error".to_owned())
}

/// The headers of a Glue JSON API request to `url` with `target` and `body`, signed with
/// SigV4 (service `glue`) by `credentials` at `time`.
fn signed_headers(
    url: &str,
    region: &str,
    target: &str,
    body: &[u8],
    credentials: &Credentials,
    time: SystemTime,
) -> Result<Vec<(String, String)>, String> {
    use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
    let host = url
        .split_once("://")
        .map(|(_, rest)| rest.split('/').next().unwrap_or(rest))
        .ok_or_else(|| format!("Glue endpoint {url:?} has no scheme"))?
        .to_owned();
    let mut headers = vec![
        ("content-type".to_owned(), CONTENT_TYPE.to_owned()),
        ("host".to_owned(), host),
        ("x-amz-target".to_owned(), target.to_owned()),
    ];
    let identity = credentials.clone().into();
    let params = aws_sigv4::sign::v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name("glue")
        .time(time)
        .settings(SigningSettings::default())
        .build()
        .map_err(|e| format!("signing the Glue request: {e}"))?
        .into();
    let request = SignableRequest::new(
        "POST",
        url,
        headers.iter().map(|(n, v)| (n.as_str(), v.as_str())),
        SignableBody::Bytes(body),
    )
    .map_err(|e| format!("signing the Glue request: {e}"))?;
    let (instructions, _) = sign(request, &params)
        .map_err(|e| format!("signing the Glue request: {e}"))?
        .into_parts();
    for (name, value) in instructions.headers() {
        headers.push((name.to_owned(), value.to_owned()));
    }
    Ok(headers)
}

/// Glue's `DataFormat` as a schema type.
fn data_format(name: &str) -> Option<SchemaType> {
    match name {
        "AVRO" => Some(SchemaType::Avro),
        "PROTOBUF" => Some(SchemaType::Protobuf),
        "JSON" => Some(SchemaType::Json),
        _ => None,
    }
}

impl SchemaSource for GlueRegistryClient {
    fn schema_by_id(
        &self,
        id: &SchemaId,
        subject: &Subject,
    ) -> Result<RegisteredSchema, SchemaError> {
        if let Some(schema) = self.schemas.get(id) {
            return Ok(schema);
        }
        let what = format!("schema version {id} (subject {subject}) in Glue");
        if !matches!(id, SchemaId::Glue(_)) {
            return Err(SchemaError(format!(
                "schema id {id} (subject {subject}): a Confluent registry's id cannot be looked up in Glue"
            )));
        }
        let json = self
            .answer(
                &what,
                "GetSchemaVersion",
                serde_json::json!({ "SchemaVersionId": id.to_string() }),
            )?
            .map_err(|e| SchemaError(format!("{what}: not found ({e})")))?;
        let definition = json
            .get("SchemaDefinition")
            .and_then(serde_json::Value::as_str)
            .ok_or_else(|| SchemaError(format!("{what}: the answer has no SchemaDefinition")))?;
        let format = json
            .get("DataFormat")
            .and_then(serde_json::Value::as_str)
            .unwrap_or("AVRO");
        let schema_type = data_format(format)
            .ok_or_else(|| SchemaError(format!("{what}: unknown DataFormat {format:?}")))?;
        let schema = RegisteredSchema::new(schema_type, Arc::<str>::from(definition));
        self.schemas.insert(*id, schema.clone());
        Ok(schema)
    }

    fn id_for(
        &self,
        subject: &Subject,
        schema: &RegisteredSchema,
        format: WireFormat,
    ) -> Result<SchemaId, SchemaError> {
        if format != WireFormat::Glue {
            return Err(SchemaError(format!(
                "subject {subject}: Glue has schema version UUIDs only (use WireFormat::Glue)"
            )));
        }
        let key = (subject.clone(), schema.clone());
        if let Some(id) = self.ids.get(&key) {
            return Ok(id);
        }
        let schema_id = serde_json::json!({
            "RegistryName": self.registry,
            "SchemaName": subject.as_str(),
        });
        let body = serde_json::json!({
            "SchemaId": schema_id,
            "SchemaDefinition": &*schema.text,
        });
        let what = format!(
            "schema {subject} in Glue registry {}: the output schema",
            self.registry
        );
        let found = match self.answer(&what, "GetSchemaByDefinition", body.clone())? {
            Ok(json) => json,
            Err(e) if !self.auto_register => {
                return Err(SchemaError(format!("{what} is not registered ({e})")));
            }
            Err(_) => self
                .answer(&what, "RegisterSchemaVersion", body)?
                .map_err(|e| SchemaError(format!("{what} cannot be registered ({e})")))?,
        };
        let id = found
            .get("SchemaVersionId")
            .and_then(serde_json::Value::as_str)
            .and_then(SchemaId::parse)
            .filter(|id| matches!(id, SchemaId::Glue(_)))
            .ok_or_else(|| {
                SchemaError(format!("{what}: the answer has no SchemaVersionId UUID"))
            })?;
        self.ids.insert(key, id);
        self.schemas.insert(id, schema.clone());
        Ok(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    fn credentials() -> Credentials {
        Credentials::new(
            "AKIDEXAMPLE",
            "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            None,
            None,
            "test",
        )
    }

    #[test]
    fn the_signature_equals_botocores() {
        // The reference: botocore 1.44.8's SigV4Auth over the same request, computed with
        //   AWSRequest("POST", "https://glue.eu-west-1.amazonaws.com/", data=BODY,
        //              headers={"Content-Type": ..., "X-Amz-Target": ...})
        //   SigV4Auth(Credentials(AKID, SECRET), "glue", "eu-west-1").add_auth(r)
        // at 2026-12-01T12:00:00Z (botocore signs host, x-amz-date and the other headers).
        let body = br#"{"SchemaVersionId":"0b6f7c1e-2d3a-4b5c-8d9e-0f1a2b3c4d01"}"#;
        let time = UNIX_EPOCH + Duration::from_secs(1_796_126_400);
        let headers = signed_headers(
            "https://glue.eu-west-1.amazonaws.com/",
            "eu-west-1",
            "AWSGlue.GetSchemaVersion",
            body,
            &credentials(),
            time,
        )
        .unwrap();
        let get = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| panic!("{name} in {headers:?}"))
        };
        assert_eq!(get("x-amz-date"), "20261201T120000Z");
        assert_eq!(get("x-amz-target"), "AWSGlue.GetSchemaVersion");
        assert_eq!(get("content-type"), "application/x-amz-json-1.1");
        assert_eq!(get("authorization"), BOTOCORE_AUTHORIZATION);
    }

    /// See [`the_signature_equals_botocores`].
    const BOTOCORE_AUTHORIZATION: &str = "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261201/eu-west-1/glue/aws4_request, SignedHeaders=content-type;host;x-amz-date;x-amz-target, Signature=5f3d3166533d923569b8c12c2be179c2d28890124a1380aca8d4571e6a7ea67e";

    /// A one-request HTTP server answering `status` and `body`; the request it got.
    fn serve_once(status: u16, body: &'static str) -> (String, std::sync::mpsc::Receiver<String>) {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                let n = stream.read(&mut buf).unwrap();
                got.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&got).to_string();
                if let Some((head, rest)) = text.split_once("\r\n\r\n") {
                    let length = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length: ")
                                .map(|v| v.trim().parse::<usize>().unwrap())
                        })
                        .unwrap_or(0);
                    if rest.len() >= length {
                        break;
                    }
                }
                if n == 0 {
                    break;
                }
            }
            let reply = format!(
                "HTTP/1.1 {status} X\r\ncontent-type: application/x-amz-json-1.1\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            stream.write_all(reply.as_bytes()).unwrap();
            tx.send(String::from_utf8_lossy(&got).to_string()).unwrap();
        });
        (url, rx)
    }

    fn client(url: &str) -> GlueRegistryClient {
        GlueRegistryClient::new("eu-west-1", SharedCredentialsProvider::new(credentials()))
            .unwrap()
            .endpoint(url)
            .registry("shop")
    }

    const VERSION: &str = "0b6f7c1e-2d3a-4b5c-8d9e-0f1a2b3c4d01";

    #[test]
    fn get_schema_version_request_and_answer() {
        // The answer's shape as Glue's API reference documents GetSchemaVersion's.
        let (url, request) = serve_once(
            200,
            r#"{"SchemaVersionId":"0b6f7c1e-2d3a-4b5c-8d9e-0f1a2b3c4d01","SchemaDefinition":"{\"type\":\"string\"}","DataFormat":"AVRO","SchemaArn":"arn:aws:glue:eu-west-1:123456789012:schema/shop/orders","VersionNumber":1,"Status":"AVAILABLE","CreatedTime":"2026-12-01T12:00:00Z"}"#,
        );
        let glue = client(&url);
        let id = SchemaId::parse(VERSION).unwrap();
        let subject = Subject::named("orders");
        let schema = glue.schema_by_id(&id, &subject).unwrap();
        assert_eq!(
            schema,
            RegisteredSchema::new(SchemaType::Avro, r#"{"type":"string"}"#)
        );
        let request = request.recv().unwrap();
        let lower = request.to_ascii_lowercase();
        assert!(request.starts_with("POST / HTTP/1.1\r\n"), "{request}");
        assert!(
            lower.contains("\r\nx-amz-target: awsglue.getschemaversion\r\n"),
            "{request}"
        );
        assert!(
            lower.contains("\r\ncontent-type: application/x-amz-json-1.1\r\n"),
            "{request}"
        );
        assert!(
            lower.contains("\r\nauthorization: aws4-hmac-sha256 credential=akidexample/"),
            "{request}"
        );
        assert!(
            request.ends_with(&format!(r#"{{"SchemaVersionId":"{VERSION}"}}"#)),
            "{request}"
        );
        // Cached: no second request (the server answers once only).
        assert_eq!(glue.schema_by_id(&id, &subject).unwrap(), schema);
    }

    #[test]
    fn glue_errors_name_the_version_and_say_whose_fault() {
        let id = SchemaId::parse(VERSION).unwrap();
        let subject = Subject::named("orders");
        let (url, _) = serve_once(
            400,
            r#"{"__type":"com.amazonaws.glue#EntityNotFoundException","Message":"Schema version is not found."}"#,
        );
        let err = client(&url).schema_by_id(&id, &subject).unwrap_err();
        assert_eq!(
            err.0,
            format!(
                "schema version {VERSION} (subject orders) in Glue: not found (HTTP 400: EntityNotFoundException: Schema version is not found.)"
            )
        );
        let (url, _) = serve_once(
            400,
            r#"{"__type":"ThrottlingException","message":"Rate exceeded"}"#,
        );
        let err = client(&url).schema_by_id(&id, &subject).unwrap_err();
        assert!(err.0.starts_with(UNAVAILABLE_PREFIX), "{err}");
        assert!(
            err.0.contains("ThrottlingException: Rate exceeded"),
            "{err}"
        );
        // Nothing listening: unavailable, not the record's fault.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let err = client(&format!("http://127.0.0.1:{port}"))
            .schema_by_id(&id, &subject)
            .unwrap_err();
        assert!(err.0.starts_with(UNAVAILABLE_PREFIX), "{err}");
        // A Confluent id, a Confluent header: refused without a request.
        let glue = client("http://127.0.0.1:9");
        assert!(
            glue.schema_by_id(&SchemaId::Confluent(1), &subject)
                .is_err()
        );
        let schema = RegisteredSchema::new(SchemaType::Avro, "\"string\"");
        assert!(
            glue.id_for(&subject, &schema, WireFormat::Confluent)
                .is_err()
        );
        assert!(
            GlueRegistryClient::new("eu west", SharedCredentialsProvider::new(credentials()))
                .is_err()
        );
    }

    #[test]
    fn output_schema_looked_up_by_definition() {
        let (url, request) = serve_once(
            200,
            r#"{"SchemaVersionId":"0b6f7c1e-2d3a-4b5c-8d9e-0f1a2b3c4d04","SchemaArn":"arn:aws:glue:eu-west-1:123456789012:schema/shop/totals","DataFormat":"AVRO","Status":"AVAILABLE","CreatedTime":"2026-12-01T12:00:00Z"}"#,
        );
        let glue = client(&url);
        let schema = RegisteredSchema::new(SchemaType::Avro, "\"long\"");
        let id = glue
            .id_for(&Subject::named("totals"), &schema, WireFormat::Glue)
            .unwrap();
        assert_eq!(id.to_string(), "0b6f7c1e-2d3a-4b5c-8d9e-0f1a2b3c4d04");
        let request = request.recv().unwrap();
        assert!(
            request
                .to_ascii_lowercase()
                .contains("\r\nx-amz-target: awsglue.getschemabydefinition\r\n"),
            "{request}"
        );
        let body: serde_json::Value =
            serde_json::from_str(request.split_once("\r\n\r\n").unwrap().1).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"SchemaId": {"RegistryName": "shop", "SchemaName": "totals"},
                "SchemaDefinition": "\"long\""})
        );
    }
}
