//! A client of a Confluent-compatible schema registry (Confluent Schema Registry, Karapace,
//! Apicurio's `ccompat` API, Redpanda): schemas fetched by id, output schemas registered or
//! looked up by subject.
//!
//! A schema with `references` (an Avro type defined in another subject, a `.proto`
//! import) comes with them: each referenced schema is fetched by subject and version
//! (`GET /subjects/{subject}/versions/{version}`, transitively, at most 32 deep) and
//! handed to the serde as the schema's [`dependencies`](super::RegisteredSchema::dependencies).
//!
//! Each answer is kept in a bounded cache ([`DEFAULT_CACHE_CAPACITY`] schemas and subject
//! ids), so a container asks once per schema id. The serdes that use it are synchronous:
//! on a cache miss the request runs on a short-lived thread of its own (a current-thread
//! Tokio runtime), so it works inside the Lambda handler's runtime and outside any. That
//! blocks the batch for one round trip per new schema id, which happens once per container
//! and schema.
//!
//! A registry that cannot be reached (connection refused, a timeout, a 5xx answer) is not
//! the record's fault: the serde's error is then marked
//! [`SerdeError::is_unavailable`](crate::serdes::SerdeError::is_unavailable) and fails the
//! batch (the event source retries it) instead of making the record a poison record. A
//! registry that answers that the id or subject does not exist (4xx) makes it one.

use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;

use super::{
    BoundedCache, DEFAULT_CACHE_CAPACITY, RegisteredSchema, SchemaError, SchemaId, SchemaSource,
    SchemaType, Subject, WireFormat,
};
use crate::aws::TlsRoots;
use crate::serdes::UNAVAILABLE_PREFIX;

/// The registry API's content type.
const CONTENT_TYPE: &str = "application/vnd.schemaregistry.v1+json";

/// How long one request to the registry may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// How deep schema references may nest (a schema referring to one that refers to ...):
/// deeper is refused, which also ends a cycle of references.
const MAX_REFERENCE_DEPTH: usize = 32;

/// A schema as the registry answers it: by id (`GET /schemas/ids/{id}`) or by subject
/// and version (`GET /subjects/{subject}/versions/{version}`).
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Answered {
    schema: String,
    schema_type: Option<String>,
    #[serde(default)]
    references: Vec<Reference>,
}

/// One of a schema's `references`: a schema registered under `subject`, at `version`,
/// known to the referring schema as `name` (an Avro type's full name, a `.proto` import
/// path).
#[derive(serde::Deserialize)]
struct Reference {
    name: String,
    subject: String,
    version: i64,
}

/// A Confluent-compatible schema registry reached over HTTP or HTTPS.
///
/// ```no_run
/// use lambda_streams::serdes::schema::registry::RegistryClient;
///
/// let registry = RegistryClient::new("https://registry.example.com:8081")?
///     .basic_auth("api-key", "api-secret")
///     .auto_register(false); // output schemas must be registered already
/// # Ok::<(), lambda_streams::serdes::schema::SchemaError>(())
/// ```
pub struct RegistryClient {
    base: String,
    authorization: Option<String>,
    auto_register: bool,
    roots: TlsRoots,
    schemas: BoundedCache<SchemaId, RegisteredSchema>,
    ids: BoundedCache<(Subject, RegisteredSchema), SchemaId>,
    /// Referenced schemas by subject and version (with their own references resolved).
    versions: BoundedCache<(String, i64), RegisteredSchema>,
}

impl std::fmt::Debug for RegistryClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryClient")
            .field("base", &self.base)
            .field("auto_register", &self.auto_register)
            .finish_non_exhaustive()
    }
}

/// A registry's answer: its status and body.
pub(super) struct Answer {
    pub(super) status: u16,
    pub(super) body: Vec<u8>,
}

/// Runs `future` on a short thread of its own with a current-thread Tokio runtime, at
/// most [`REQUEST_TIMEOUT`] (serdes are synchronous; see the module docs). `what` names
/// the request in the timeout's message.
pub(super) fn block_on_own_thread<T: Send + 'static>(
    what: String,
    future: impl std::future::Future<Output = Result<T, String>> + Send + 'static,
) -> Result<T, String> {
    let worker = std::thread::Builder::new()
        .name("schema-registry".to_owned())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("cannot start a runtime for the request: {e}"))?;
            runtime.block_on(async move {
                tokio::time::timeout(REQUEST_TIMEOUT, future)
                    .await
                    .map_err(|_| format!("{what}: no answer in {REQUEST_TIMEOUT:?}"))?
            })
        })
        .map_err(|e| format!("cannot start the request's thread: {e}"))?;
    worker
        .join()
        .map_err(|_| "the request's thread panicked".to_owned())?
}

impl RegistryClient {
    /// A client of the registry at `url` (`http://` or `https://`, no trailing path
    /// needed; a path such as Apicurio's `/apis/ccompat/v7` is kept). Output schemas are
    /// registered when missing ([`auto_register`](Self::auto_register)); HTTPS trusts
    /// Mozilla's roots compiled into the binary ([`tls_roots`](Self::tls_roots)).
    ///
    /// # Errors
    ///
    /// A URL without an `http` or `https` scheme.
    pub fn new(url: &str) -> Result<Self, SchemaError> {
        let base = url.trim().trim_end_matches('/').to_owned();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(SchemaError(format!(
                "schema registry URL {url:?}: the scheme is not http or https"
            )));
        }
        Ok(RegistryClient {
            base,
            authorization: None,
            auto_register: true,
            roots: TlsRoots::Compiled,
            schemas: BoundedCache::new(DEFAULT_CACHE_CAPACITY),
            ids: BoundedCache::new(DEFAULT_CACHE_CAPACITY),
            versions: BoundedCache::new(DEFAULT_CACHE_CAPACITY),
        })
    }

    /// Sends HTTP basic authentication (Confluent Cloud's API key and secret).
    pub fn basic_auth(mut self, user: &str, password: &str) -> Self {
        use base64::Engine;
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        self.authorization = Some(format!("Basic {token}"));
        self
    }

    /// Whether an output schema missing from its subject is registered (`true`, the
    /// default) or is an error (`false`: a production registry whose subjects are managed
    /// elsewhere).
    pub fn auto_register(mut self, register: bool) -> Self {
        self.auto_register = register;
        self
    }

    /// The root certificates trusted over HTTPS (default [`TlsRoots::Compiled`]).
    pub fn tls_roots(mut self, roots: TlsRoots) -> Self {
        self.roots = roots;
        self
    }

    /// The registry's URL, as given (without a trailing `/`).
    pub fn url(&self) -> &str {
        &self.base
    }

    /// Sends one request on a thread of its own (see the module docs).
    fn request(&self, method: &str, path: &str, body: Option<Vec<u8>>) -> Result<Answer, String> {
        let url = format!("{}{path}", self.base);
        let mut headers = vec![("accept".to_owned(), CONTENT_TYPE.to_owned())];
        if let Some(authorization) = &self.authorization {
            headers.push(("authorization".to_owned(), authorization.clone()));
        }
        if body.is_some() {
            headers.push(("content-type".to_owned(), CONTENT_TYPE.to_owned()));
        }
        let method = method.to_owned();
        let roots = self.roots;
        block_on_own_thread(format!("{method} {url}"), async move {
            send(&method, &url, headers, roots, body.unwrap_or_default()).await
        })
    }

    /// GETs `path` and parses the schema it answers; `what` names it in errors.
    fn get_schema(&self, what: &str, path: &str) -> Result<Answered, SchemaError> {
        let answer = self
            .request("GET", path, None)
            .map_err(|e| Self::unavailable(what, e))?;
        if answer.status >= 500 {
            return Err(Self::unavailable(
                what,
                format!("HTTP {}: {}", answer.status, error_message(&answer.body)),
            ));
        }
        if answer.status != 200 {
            return Err(SchemaError(format!(
                "{what}: not found (HTTP {}: {})",
                answer.status,
                error_message(&answer.body)
            )));
        }
        serde_json::from_slice(&answer.body).map_err(|e| {
            SchemaError(format!(
                "{what}: the registry's answer is not a schema: {e}"
            ))
        })
    }

    /// The schema of an answer, its references fetched (by subject and version) and
    /// flattened into its [`dependencies`](RegisteredSchema::dependencies), dependencies
    /// first.
    fn resolve(
        &self,
        what: &str,
        answered: Answered,
        depth: usize,
    ) -> Result<RegisteredSchema, SchemaError> {
        let schema_type = match answered.schema_type.as_deref() {
            None => SchemaType::Avro,
            Some(name) => SchemaType::parse(name)
                .ok_or_else(|| SchemaError(format!("{what}: unknown schemaType {name:?}")))?,
        };
        let mut dependencies: Vec<(String, std::sync::Arc<str>)> = Vec::new();
        for reference in answered.references {
            if depth >= MAX_REFERENCE_DEPTH {
                return Err(SchemaError(format!(
                    "{what}: references nest deeper than {MAX_REFERENCE_DEPTH} (a cycle?)"
                )));
            }
            let referenced = self.version(what, &reference, depth + 1)?;
            for dependency in referenced.dependencies {
                if !dependencies.iter().any(|(n, _)| *n == dependency.0) {
                    dependencies.push(dependency);
                }
            }
            if !dependencies.iter().any(|(n, _)| *n == reference.name) {
                dependencies.push((reference.name, referenced.text));
            }
        }
        Ok(RegisteredSchema::new(schema_type, answered.schema).with_dependencies(dependencies))
    }

    /// A referenced schema, by its subject and version (cached).
    fn version(
        &self,
        what: &str,
        reference: &Reference,
        depth: usize,
    ) -> Result<RegisteredSchema, SchemaError> {
        let key = (reference.subject.clone(), reference.version);
        if let Some(schema) = self.versions.get(&key) {
            return Ok(schema);
        }
        let encoded = percent_encoding::utf8_percent_encode(
            &reference.subject,
            percent_encoding::NON_ALPHANUMERIC,
        );
        let what = format!(
            "{what}: its reference {:?} (subject {}, version {})",
            reference.name, reference.subject, reference.version
        );
        let answered = self.get_schema(
            &what,
            &format!("/subjects/{encoded}/versions/{}", reference.version),
        )?;
        let schema = self.resolve(&what, answered, depth)?;
        self.versions.insert(key, schema.clone());
        Ok(schema)
    }

    /// `error` marked as the registry's unavailability (see the module docs).
    fn unavailable(what: &str, error: impl std::fmt::Display) -> SchemaError {
        SchemaError(format!("{UNAVAILABLE_PREFIX}{what}: {error}"))
    }
}

/// Sends one HTTP(S) request with `headers` and `body`; the answer's status and body.
pub(super) async fn send(
    method: &str,
    url: &str,
    headers: Vec<(String, String)>,
    roots: TlsRoots,
    body: Vec<u8>,
) -> Result<Answer, String> {
    let mut connector = HttpConnector::new();
    connector.enforce_http(false);
    connector.set_connect_timeout(Some(REQUEST_TIMEOUT));
    let tls = crate::aws::rustls_client_config(roots)?;
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(connector);
    let client: HttpClient<_, Full<bytes::Bytes>> =
        HttpClient::builder(hyper_util::rt::TokioExecutor::new()).build(https);
    let mut request = http::Request::builder().method(method).uri(url);
    for (name, value) in headers {
        request = request.header(name, value);
    }
    let request = request
        .body(Full::new(bytes::Bytes::from(body)))
        .map_err(|e| format!("{method} {url}: {e}"))?;
    let response = client
        .request(request)
        .await
        .map_err(|e| format!("{method} {url}: {e}"))?;
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("{method} {url}: reading the answer: {e}"))?
        .to_bytes()
        .to_vec();
    Ok(Answer { status, body })
}

/// The `message` of a registry's error answer, or the body as text.
fn error_message(body: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    struct ErrorBody {
        error_code: Option<i64>,
        message: Option<String>,
    }
    match serde_json::from_slice::<ErrorBody>(body) {
        Ok(ErrorBody {
            error_code,
            message: Some(message),
        }) => match error_code {
            Some(code) => format!("{message} (error code {code})"),
            None => message,
        },
        _ => String::from_utf8_lossy(body).chars().take(300).collect(),
    }
}

/// A request's body: the schema and its type (omitted for Avro, as registries expect).
fn schema_body(schema: &RegisteredSchema) -> Vec<u8> {
    let mut body = serde_json::json!({ "schema": &*schema.text });
    if schema.schema_type != SchemaType::Avro {
        body["schemaType"] = schema.schema_type.as_str().into();
    }
    body.to_string().into_bytes()
}

impl SchemaSource for RegistryClient {
    fn schema_by_id(
        &self,
        id: &SchemaId,
        subject: &Subject,
    ) -> Result<RegisteredSchema, SchemaError> {
        if let Some(schema) = self.schemas.get(id) {
            return Ok(schema);
        }
        let what = format!("schema id {id} (subject {subject}) at {}", self.base);
        let SchemaId::Confluent(number) = id else {
            return Err(SchemaError(format!(
                "{what}: a Glue schema version id cannot be looked up in a Confluent-compatible registry"
            )));
        };
        let answered = self.get_schema(&what, &format!("/schemas/ids/{number}"))?;
        let schema = self.resolve(&what, answered, 0)?;
        self.schemas.insert(*id, schema.clone());
        Ok(schema)
    }

    fn id_for(
        &self,
        subject: &Subject,
        schema: &RegisteredSchema,
        format: WireFormat,
    ) -> Result<SchemaId, SchemaError> {
        if format == WireFormat::Glue {
            return Err(SchemaError(format!(
                "subject {subject}: a Confluent-compatible registry has no Glue schema version ids (use WireFormat::Confluent, or OfflineSchemas with the Glue ids)"
            )));
        }
        if !schema.dependencies.is_empty() {
            return Err(SchemaError(format!(
                "subject {subject}: an output schema with references cannot be registered or looked up by this client (register it with its references beforehand and give its id with OfflineSchemas)"
            )));
        }
        let key = (subject.clone(), schema.clone());
        if let Some(id) = self.ids.get(&key) {
            return Ok(id);
        }
        let encoded: String = percent_encoding::utf8_percent_encode(
            subject.as_str(),
            percent_encoding::NON_ALPHANUMERIC,
        )
        .to_string();
        let (path, action) = if self.auto_register {
            (
                format!("/subjects/{encoded}/versions"),
                "registering the output schema",
            )
        } else {
            (
                format!("/subjects/{encoded}"),
                "looking up the output schema",
            )
        };
        let what = format!("subject {subject} at {}: {action}", self.base);
        let answer = self
            .request("POST", &path, Some(schema_body(schema)))
            .map_err(|e| Self::unavailable(&what, e))?;
        if answer.status >= 500 {
            return Err(Self::unavailable(
                &what,
                format!("HTTP {}: {}", answer.status, error_message(&answer.body)),
            ));
        }
        if answer.status != 200 {
            return Err(SchemaError(format!(
                "{what}: HTTP {}: {}",
                answer.status,
                error_message(&answer.body)
            )));
        }
        #[derive(serde::Deserialize)]
        struct WithId {
            id: u32,
        }
        let parsed: WithId = serde_json::from_slice(&answer.body)
            .map_err(|e| SchemaError(format!("{what}: the registry's answer has no id: {e}")))?;
        let id = SchemaId::Confluent(parsed.id);
        self.ids.insert(key, id);
        self.schemas.insert(id, schema.clone());
        Ok(id)
    }
}
