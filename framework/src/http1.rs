//! The framework's HTTP/1.1: a request written whole on a kept-alive connection and its
//! response read back in the same task, without a connection task, channels or header maps.
//! It serves the DynamoDB store's lean request path (`state::dynamodb::lean`) and, behind
//! the SDK's connector traits, every AWS SDK client of the framework
//! ([`crate::aws::https_client`]), so that the binary links one HTTP stack and no HTTP/2.
//!
//! # Why
//! A state write is one small `POST` and one small response. hyper's pooled client sends it
//! through a dispatch channel to a connection task, builds and parses header maps, and
//! boxes bodies; on the function's CPU per write that was about as much as the rest of the
//! write together (BENCHMARKS.md, "The request written straight from the write"). Here a
//! caller takes an idle connection (or opens one), writes the request's bytes in one
//! `write`, reads the response into the connection's buffer and hands the connection back
//! once it has read the body.
//!
//! # What it does of HTTP/1.1
//! Responses with `Content-Length`, `Transfer-Encoding: chunked` or ended by the closing of
//! the connection; `Connection: close` and HTTP/1.0 responses close the connection after the
//! response; informational (1xx) responses are skipped. A connection is kept only when its
//! response was read whole and nothing else arrived, and for at most [`IDLE_TIMEOUT`] idle.
//! A request that fails on a reused connection before any byte of a response arrived (the
//! server closed the idle connection) is sent again at once on a new connection, as hyper
//! does; every other failure is the caller's to retry.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long an idle connection is kept (hyper's pool of the earlier client kept 60 s; load
/// balancers commonly close at 60 s).
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(50);
/// At most this many idle connections are kept (a batch writes 32 items at a time).
const MAX_IDLE: usize = 64;
/// A response head larger than this is refused.
const MAX_HEAD: usize = 64 * 1024;
/// A response body larger than this is refused (an `UpdateItem` returns at most one item:
/// 400 KB of attributes, as JSON with base64 binaries).
const MAX_BODY: usize = 8 * 1024 * 1024;

/// Where connections go: the host and port, and TLS for `https`.
pub(crate) struct Connector {
    host: String,
    port: u16,
    tls: Option<(
        tokio_rustls::TlsConnector,
        rustls::pki_types::ServerName<'static>,
    )>,
    connect_timeout: Duration,
}

impl Connector {
    /// Connections to `uri`'s host and port (80 or 443 by default), over TLS with `tls` for
    /// `https` (which asks for it: an error saying why there is none, or the configuration).
    pub(crate) fn new(
        uri: &http::Uri,
        tls: impl FnOnce() -> Result<Arc<rustls::ClientConfig>, String>,
        connect_timeout: Duration,
    ) -> Result<Self, String> {
        let https = uri.scheme_str() == Some("https");
        let host = uri
            .host()
            .ok_or_else(|| format!("endpoint {uri}: no host"))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let tls = if https {
            let name = rustls::pki_types::ServerName::try_from(host.clone())
                .map_err(|e| format!("endpoint {uri}: {e}"))?;
            Some((tokio_rustls::TlsConnector::from(tls()?), name))
        } else {
            None
        };
        Ok(Connector {
            host,
            port,
            tls,
            connect_timeout,
        })
    }

    async fn connect(&self) -> std::io::Result<Connection> {
        let tcp = tokio::time::timeout(
            self.connect_timeout,
            TcpStream::connect((self.host.as_str(), self.port)),
        )
        .await
        .map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("connecting timed out after {:?}", self.connect_timeout),
            )
        })??;
        tcp.set_nodelay(true)?;
        let io = match &self.tls {
            None => Io::Plain(tcp),
            Some((tls, name)) => Io::Tls(Box::new(tls.connect(name.clone(), tcp).await?)),
        };
        Ok(Connection {
            io,
            buffer: Vec::with_capacity(4096),
        })
    }
}

enum Io {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

/// One connection and its read buffer.
struct Connection {
    io: Io,
    buffer: Vec<u8>,
}

impl Connection {
    async fn write(&mut self, request: &[u8]) -> std::io::Result<()> {
        match &mut self.io {
            Io::Plain(tcp) => tcp.write_all(request).await,
            Io::Tls(tls) => {
                tls.write_all(request).await?;
                tls.flush().await
            }
        }
    }

    /// Reads more of the response into the buffer: how many bytes (0 at the end).
    async fn read(&mut self) -> std::io::Result<usize> {
        if self.buffer.capacity() - self.buffer.len() < 1024 {
            self.buffer.reserve(self.buffer.capacity().max(4096));
        }
        match &mut self.io {
            Io::Plain(tcp) => tcp.read_buf(&mut self.buffer).await,
            Io::Tls(tls) => tls.read_buf(&mut self.buffer).await,
        }
    }
}

/// A failed exchange.
#[derive(Debug)]
pub(crate) struct ExchangeError {
    /// What failed.
    pub(crate) text: String,
    /// Whether any byte of a response had arrived.
    pub(crate) answered: bool,
    /// The kind of failure.
    pub(crate) kind: Failure,
}

/// What kind of failure an [`ExchangeError`] is (the SDK's retries tell them apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// Connecting timed out.
    TimedOut,
    /// The connection failed: connecting, sending, reading, or closed before the response
    /// ended.
    Io,
    /// The response is not one this client reads: not HTTP/1.1, or too large.
    Protocol,
}

impl ExchangeError {
    fn new(text: impl Into<String>, answered: bool) -> Self {
        ExchangeError {
            text: text.into(),
            answered,
            kind: Failure::Io,
        }
    }

    fn protocol(text: impl Into<String>) -> Self {
        ExchangeError {
            kind: Failure::Protocol,
            ..ExchangeError::new(text, true)
        }
    }
}

/// A response, read whole: its status and body (in the connection's buffer). Dropping it
/// hands the connection back to the pool when it can be used again.
pub(crate) struct Response<'a> {
    pool: &'a Pool,
    connection: Option<Connection>,
    status: u16,
    head: std::ops::Range<usize>,
    body: std::ops::Range<usize>,
    keep_alive: bool,
}

impl Response<'_> {
    /// The status code.
    pub(crate) fn status(&self) -> u16 {
        self.status
    }

    /// The head (status line and headers, up to the blank line included; informational
    /// responses before it skipped), for a caller that wants the headers.
    pub(crate) fn head(&self) -> &[u8] {
        self.connection
            .as_ref()
            .map_or(&[][..], |c| &c.buffer[self.head.clone()])
    }

    /// The body.
    pub(crate) fn body(&self) -> &[u8] {
        self.connection
            .as_ref()
            .map_or(&[][..], |c| &c.buffer[self.body.clone()])
    }
}

impl Drop for Response<'_> {
    fn drop(&mut self) {
        if let Some(connection) = self.connection.take()
            && self.keep_alive
        {
            self.pool.give_back(connection);
        }
    }
}

/// Idle connections to one endpoint.
pub(crate) struct Pool {
    connector: Connector,
    idle: Mutex<Vec<(Connection, Instant)>>,
}

impl Pool {
    /// A pool of connections made by `connector`.
    pub(crate) fn new(connector: Connector) -> Self {
        Pool {
            connector,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// Sends `request` (a whole HTTP/1.1 request: head and body) and reads its response.
    pub(crate) async fn send(&self, request: &[u8]) -> Result<Response<'_>, ExchangeError> {
        if let Some(connection) = self.take_idle() {
            match self.exchange(connection, request).await {
                Err(e) if !e.answered => {} // the server closed it while idle: a new one
                outcome => return outcome,
            }
        }
        let connection = self.connector.connect().await.map_err(|e| ExchangeError {
            kind: if e.kind() == std::io::ErrorKind::TimedOut {
                Failure::TimedOut
            } else {
                Failure::Io
            },
            ..ExchangeError::new(
                format!(
                    "connecting to {}:{}: {e}",
                    self.connector.host, self.connector.port
                ),
                false,
            )
        })?;
        self.exchange(connection, request).await
    }

    /// The most recently used connection idle for less than [`IDLE_TIMEOUT`]; older ones
    /// are closed.
    fn take_idle(&self) -> Option<Connection> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        // The oldest are first: drop those past the timeout.
        let stale = idle
            .iter()
            .take_while(|(_, since)| now.duration_since(*since) >= IDLE_TIMEOUT)
            .count();
        idle.drain(..stale);
        idle.pop().map(|(connection, _)| connection)
    }

    fn give_back(&self, mut connection: Connection) {
        connection.buffer.clear();
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < MAX_IDLE {
            idle.push((connection, Instant::now()));
        }
    }

    async fn exchange(
        &self,
        mut connection: Connection,
        request: &[u8],
    ) -> Result<Response<'_>, ExchangeError> {
        connection.buffer.clear();
        connection
            .write(request)
            .await
            .map_err(|e| ExchangeError::new(format!("sending the request: {e}"), false))?;
        let (status, head, body, keep_alive) = read_response(&mut connection).await?;
        Ok(Response {
            pool: self,
            connection: Some(connection),
            status,
            head,
            body,
            keep_alive,
        })
    }
}

/// Where a response's head or body is in the connection's buffer.
type Span = std::ops::Range<usize>;

/// Reads one response into the connection's buffer: its status, where its head and body
/// are, and whether the connection can be used again.
async fn read_response(
    connection: &mut Connection,
) -> Result<(u16, Span, Span, bool), ExchangeError> {
    let mut start = 0;
    let head = loop {
        match parse_head(&connection.buffer[start..]) {
            Ok(Some(head)) if (100..200).contains(&head.status) => start += head.length,
            Ok(Some(head)) => break head,
            Ok(None) if connection.buffer.len() - start > MAX_HEAD => {
                return Err(ExchangeError::protocol("the response head is too large"));
            }
            Ok(None) => {}
            Err(e) => return Err(ExchangeError::protocol(e)),
        }
        let answered = !connection.buffer.is_empty();
        match connection.read().await {
            Ok(0) if answered => {
                return Err(ExchangeError::new("the response ended in its head", true));
            }
            Ok(0) => return Err(ExchangeError::new("the connection was closed", false)),
            Ok(_) => {}
            Err(e) => {
                return Err(ExchangeError::new(
                    format!("reading the response: {e}"),
                    answered,
                ));
            }
        }
    };
    let at = start + head.length;
    let head_span = start..at;
    let failed = |e: std::io::Error| ExchangeError::new(format!("reading the response: {e}"), true);
    match head.body {
        Framing::Length(length) if length > MAX_BODY => {
            Err(ExchangeError::protocol("the response body is too large"))
        }
        Framing::Length(length) => {
            while connection.buffer.len() < at + length {
                if connection.read().await.map_err(failed)? == 0 {
                    return Err(ExchangeError::new("the response ended in its body", true));
                }
            }
            // Bytes past the body (that nothing asked for): the connection is not reused.
            let clean = connection.buffer.len() == at + length;
            Ok((
                head.status,
                head_span,
                at..at + length,
                head.keep_alive && clean,
            ))
        }
        Framing::Chunked => loop {
            match dechunk(&mut connection.buffer, at) {
                Ok(Some((length, clean))) => {
                    return Ok((
                        head.status,
                        head_span,
                        at..at + length,
                        head.keep_alive && clean,
                    ));
                }
                Ok(None) if connection.buffer.len() - at > MAX_BODY => {
                    return Err(ExchangeError::protocol("the response body is too large"));
                }
                Ok(None) => {}
                Err(e) => return Err(ExchangeError::protocol(e)),
            }
            if connection.read().await.map_err(failed)? == 0 {
                return Err(ExchangeError::new("the response ended in its body", true));
            }
        },
        Framing::UntilClose => {
            while connection.read().await.map_err(failed)? > 0 {
                if connection.buffer.len() - at > MAX_BODY {
                    return Err(ExchangeError::protocol("the response body is too large"));
                }
            }
            Ok((head.status, head_span, at..connection.buffer.len(), false))
        }
    }
}

/// How a response's body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    Length(usize),
    Chunked,
    UntilClose,
}

/// A response head.
#[derive(Debug, PartialEq, Eq)]
struct Head {
    status: u16,
    /// The head's length in bytes, the blank line included.
    length: usize,
    body: Framing,
    keep_alive: bool,
}

/// The head at the start of `bytes`, `None` while incomplete.
fn parse_head(bytes: &[u8]) -> Result<Option<Head>, String> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut response = httparse::Response::new(&mut headers);
    let length = match response.parse(bytes) {
        Ok(httparse::Status::Complete(length)) => length,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(format!("the response is not HTTP/1.1: {e}")),
    };
    let status = response.code.unwrap_or(0);
    let mut keep_alive = response.version == Some(1);
    let mut body = if status == 204 || status == 304 {
        Framing::Length(0)
    } else {
        Framing::UntilClose
    };
    for header in response.headers.iter() {
        // Only the three headers read here are decoded.
        let value = || std::str::from_utf8(header.value).unwrap_or("").trim();
        if header.name.eq_ignore_ascii_case("content-length") && body == Framing::UntilClose {
            let value = value();
            let length = value
                .parse()
                .map_err(|_| format!("the response's content-length {value:?} is not a number"))?;
            body = Framing::Length(length);
        } else if header.name.eq_ignore_ascii_case("transfer-encoding") {
            let value = value();
            if !value.to_ascii_lowercase().ends_with("chunked") {
                return Err(format!("the response's transfer-encoding {value:?}"));
            }
            body = Framing::Chunked;
        } else if header.name.eq_ignore_ascii_case("connection") {
            for option in value().split(',').map(str::trim) {
                if option.eq_ignore_ascii_case("close") {
                    keep_alive = false;
                } else if option.eq_ignore_ascii_case("keep-alive") {
                    keep_alive = true;
                }
            }
        }
    }
    if body == Framing::UntilClose {
        keep_alive = false;
    }
    Ok(Some(Head {
        status,
        length,
        body,
        keep_alive,
    }))
}

/// Decodes the chunked body that starts at `at` in place (its data moved to `at..`), when it
/// is complete: its length, and whether nothing follows it.
fn dechunk(buffer: &mut [u8], at: usize) -> Result<Option<(usize, bool)>, String> {
    let line_end = |from: usize, buffer: &[u8]| {
        memchr::memmem::find(&buffer[from..], b"\r\n").map(|i| from + i)
    };
    // A first pass finds the chunks without moving anything, so that an incomplete body
    // can be read further and decoded again.
    let mut chunks = Vec::new();
    let mut cursor = at;
    loop {
        let Some(end) = line_end(cursor, buffer) else {
            return Ok(None);
        };
        let size_text = std::str::from_utf8(&buffer[cursor..end]).unwrap_or("");
        let size_text = size_text.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|_| format!("a chunk size {size_text:?} is not hexadecimal"))?;
        if size > MAX_BODY {
            return Err("a response chunk is too large".to_owned());
        }
        let data = end + 2;
        if size == 0 {
            // Trailers (ignored) up to an empty line.
            let mut line = data;
            loop {
                let Some(end) = line_end(line, buffer) else {
                    return Ok(None);
                };
                if end == line {
                    let clean = end + 2 == buffer.len();
                    let mut length = 0;
                    for (from, size) in chunks {
                        buffer.copy_within(from..from + size, at + length);
                        length += size;
                    }
                    return Ok(Some((length, clean)));
                }
                line = end + 2;
            }
        }
        if buffer.len() < data + size + 2 {
            return Ok(None);
        }
        if &buffer[data + size..data + size + 2] != b"\r\n" {
            return Err("a response chunk does not end with CRLF".to_owned());
        }
        chunks.push((data, size));
        cursor = data + size + 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_give_the_status_the_framing_and_keep_alive() {
        let head = parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\nx: y\r\n\r\n{}")
            .unwrap()
            .unwrap();
        assert_eq!(
            head,
            Head {
                status: 200,
                length: 45,
                body: Framing::Length(12),
                keep_alive: true
            }
        );
        let head = parse_head(
            b"HTTP/1.1 400 X\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n",
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (head.status, head.body, head.keep_alive),
            (400, Framing::Chunked, false)
        );
        let head = parse_head(b"HTTP/1.0 200 OK\r\n\r\n").unwrap().unwrap();
        assert_eq!((head.body, head.keep_alive), (Framing::UntilClose, false));
        let head =
            parse_head(b"HTTP/1.0 200 OK\r\ncontent-length: 0\r\nConnection: keep-alive\r\n\r\n")
                .unwrap()
                .unwrap();
        assert_eq!((head.body, head.keep_alive), (Framing::Length(0), true));
        assert_eq!(parse_head(b"HTTP/1.1 200 OK\r\ncontent-le").unwrap(), None);
        assert!(parse_head(b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n").is_err());
        assert!(parse_head(b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n").is_err());
        assert!(parse_head(b"garbage\r\n\r\n").is_err());
    }

    /// A server whose first connection answers chunked and is then closed by the server
    /// (without `Connection: close`), and whose second answers with a length: the second
    /// request finds its pooled connection closed and is sent again on a new one.
    #[tokio::test]
    async fn a_pooled_connection_closed_by_the_server_is_replaced_at_once() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let uri: http::Uri = format!("http://{}/", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        let accepted = Arc::new(Mutex::new(0usize));
        let count = Arc::clone(&accepted);
        tokio::spawn(async move {
            let replies: [&[u8]; 2] = [
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
                b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok",
            ];
            let mut held = Vec::new();
            for reply in replies {
                let (mut socket, _) = listener.accept().await.unwrap();
                *count.lock().unwrap() += 1;
                let mut request = Vec::new();
                while !request.ends_with(b"\r\n\r\n") {
                    let mut byte = [0u8; 1];
                    if socket.read(&mut byte).await.unwrap() == 0 {
                        break;
                    }
                    request.push(byte[0]);
                }
                socket.write_all(reply).await.unwrap();
                held.push(socket);
                if held.len() == 1 {
                    held.clear(); // the first connection closed by the server
                }
            }
            std::future::pending::<()>().await;
        });
        let tls = crate::aws::rustls_client_config(crate::aws::TlsRoots::Compiled).unwrap();
        let tls = || Ok(Arc::new(tls));
        let pool = Pool::new(Connector::new(&uri, tls, Duration::from_secs(3)).unwrap());
        let request = b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n";
        {
            let response = pool.send(request).await.unwrap();
            assert_eq!((response.status(), response.body()), (200, &b"abc"[..]));
        }
        assert_eq!(
            pool.idle.lock().unwrap().len(),
            1,
            "kept for the next request"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        let response = pool.send(request).await.unwrap();
        assert_eq!((response.status(), response.body()), (201, &b"ok"[..]));
        assert_eq!(
            *accepted.lock().unwrap(),
            2,
            "a new connection for the second"
        );
    }

    #[test]
    fn chunked_bodies_are_decoded_in_place_once_complete() {
        let whole = b"HEAD5;x=y\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nt: v\r\n\r\n";
        for cut in 4..whole.len() {
            let mut partial = whole[..cut].to_vec();
            assert_eq!(dechunk(&mut partial, 4).unwrap(), None, "cut at {cut}");
        }
        let mut buffer = whole.to_vec();
        assert_eq!(dechunk(&mut buffer, 4).unwrap(), Some((11, true)));
        assert_eq!(&buffer[4..15], b"hello world");
        let mut more = b"0\r\n\r\nHTTP".to_vec();
        assert_eq!(dechunk(&mut more, 0).unwrap(), Some((0, false)));
        assert!(dechunk(&mut b"zz\r\n".to_vec(), 0).is_err());
        assert!(dechunk(&mut b"2\r\nabc\r\n".to_vec(), 0).is_err());
    }
}
