//! Streamable HTTP transport: rmcp's `StreamableHttpService` behind a small
//! hyper server and a guard that runs on every request, before rmcp sees it:
//!
//! 1. `Host` must name this server (loopback names, the bound address, or an
//!    explicitly allowed host): 403 otherwise (DNS rebinding).
//! 2. `Origin`, when present, must be a loopback or allowed host: 403 otherwise
//!    (a web page must not reach a local server through the browser).
//! 3. When a token is configured, `Authorization: Bearer <token>`: 401 otherwise.
//!    A non-loopback bind refuses to start without a token.
//!
//! A request carrying `Host` or `Origin` more than once is refused (a second
//! `Host` must not slip past the check of the first). Before any of that,
//! the connection itself is bounded: headers must arrive within
//! [`HEADER_DEADLINE`] and the body within [`BODY_DEADLINE`] after them
//! (408), and [`ConnTracker`] caps open connections (all peers, one peer)
//! by closing idle ones first; a request counts as in progress (not
//! idle) only once its body is in. Bodies are capped at
//! [`MAX_BODY_BYTES`] (413). The MCP service runs stateless (no session
//! state kept between requests), so no number of `initialize` calls can make
//! the server keep anything.

use crate::conn_limit::{Admitted, ConnCaps, ConnTracker};
use crate::server::{ServerOptions, SleuthServer};
use anyhow::{bail, Context, Result};
use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, AUTHORIZATION, HOST, ORIGIN, WWW_AUTHENTICATE};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// The path the MCP endpoint is served at.
pub const MCP_PATH: &str = "/mcp";
/// A request's headers must be complete this long after its first byte
/// (or after the connection opened).
pub const HEADER_DEADLINE: Duration = Duration::from_secs(5);
/// Largest request body accepted (a tool call is a few hundred bytes).
pub const MAX_BODY_BYTES: usize = 1 << 20;
/// A request's body must be complete this long after its headers. Before,
/// only the headers had a deadline: a client that sent full headers with a
/// large `Content-Length` and then stalled held its connection, counted as
/// a request in progress (never evicted), for ever; 64 of them locked out
/// their address and 256 everyone.
pub const BODY_DEADLINE: Duration = Duration::from_secs(5);

/// Reads the body of `req` (at most [`MAX_BODY_BYTES`], within `deadline`)
/// and gives the request back with the body in memory; else the answer:
/// 413 past the size (as rmcp answers it), 408 past the deadline, 400 for a
/// broken body, each closing the connection.
async fn read_body(
    req: Request<Incoming>,
    deadline: Duration,
) -> std::result::Result<Request<Full<Bytes>>, Box<Response<Body>>> {
    let (parts, mut body) = req.into_parts();
    let mut collected = bytes::BytesMut::new();
    let read = async {
        while let Some(frame) = body.frame().await {
            let Ok(data) = frame?.into_data() else {
                continue; // trailers
            };
            if data.len() > MAX_BODY_BYTES.saturating_sub(collected.len()) {
                return Ok(false);
            }
            collected.extend_from_slice(&data);
        }
        Ok::<_, hyper::Error>(true)
    };
    let refusal = |status, text: &'static str| {
        let mut resp = plain(status, text);
        resp.headers_mut().insert(
            hyper::header::CONNECTION,
            hyper::header::HeaderValue::from_static("close"),
        );
        Err(Box::new(resp))
    };
    match tokio::time::timeout(deadline, read).await {
        Ok(Ok(true)) => Ok(Request::from_parts(parts, Full::new(collected.freeze()))),
        Ok(Ok(false)) => refusal(
            StatusCode::PAYLOAD_TOO_LARGE,
            "Payload Too Large: request body exceeds 1048576 bytes\n",
        ),
        Ok(Err(_)) => refusal(StatusCode::BAD_REQUEST, "bad request: broken body\n"),
        Err(_) => refusal(
            StatusCode::REQUEST_TIMEOUT,
            "request timeout: the body did not arrive within 5 s of the headers\n",
        ),
    }
}

/// How to serve HTTP.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// Address to bind; port 0 picks a free port (the chosen one is logged).
    pub addr: SocketAddr,
    /// Bearer token every request must carry; required for a non-loopback bind.
    pub token: Option<String>,
    /// Host names (without port) accepted in `Host`/`Origin` besides loopback
    /// and the bound address, e.g. the machine's DNS name for remote clients.
    pub extra_hosts: Vec<String>,
}

/// What the guard accepts.
#[derive(Debug, Clone)]
pub struct Policy {
    /// Lower-case host names, IPv6 without brackets.
    pub hosts: Vec<String>,
    pub token: Option<String>,
}

impl Policy {
    pub fn new(opts: &HttpOptions) -> Policy {
        let mut hosts: Vec<String> = ["localhost", "127.0.0.1", "::1"].map(String::from).to_vec();
        if !opts.addr.ip().is_unspecified() {
            hosts.push(opts.addr.ip().to_string());
        }
        hosts.extend(opts.extra_hosts.iter().map(|h| normalize_host(h)));
        hosts.sort();
        hosts.dedup();
        Policy {
            hosts,
            token: opts.token.clone(),
        }
    }

    fn host_allowed(&self, host: &str) -> bool {
        let h = normalize_host(host);
        self.hosts.contains(&h)
    }

    /// Decides one request from its headers; `Err` carries the refusal.
    pub fn check(
        &self,
        headers: &HeaderMap,
    ) -> std::result::Result<(), (StatusCode, &'static str)> {
        if headers.get_all(HOST).iter().count() > 1 {
            return Err((
                StatusCode::FORBIDDEN,
                "forbidden: more than one Host header\n",
            ));
        }
        if headers.get_all(ORIGIN).iter().count() > 1 {
            return Err((
                StatusCode::FORBIDDEN,
                "forbidden: more than one Origin header\n",
            ));
        }
        let host = headers.get(HOST).and_then(|v| v.to_str().ok());
        match host.and_then(strip_port) {
            Some(h) if self.host_allowed(h) => {}
            _ => return Err((StatusCode::FORBIDDEN, "forbidden: unexpected Host header\n")),
        }
        if let Some(origin) = headers.get(ORIGIN) {
            let ok = origin
                .to_str()
                .ok()
                .and_then(origin_host)
                .is_some_and(|h| self.host_allowed(h));
            if !ok {
                return Err((StatusCode::FORBIDDEN, "forbidden: Origin not allowed\n"));
            }
        }
        if let Some(token) = &self.token {
            let given = headers
                .get(AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "));
            if !given.is_some_and(|g| constant_time_eq(g.as_bytes(), token.as_bytes())) {
                return Err((
                    StatusCode::UNAUTHORIZED,
                    "unauthorized: missing or wrong bearer token\n",
                ));
            }
        }
        Ok(())
    }
}

/// `host`, `host:port`, `[v6]:port` or `[v6]` → the host part; None for
/// anything else (`[::1].evil`, `[::1]x`, a non-numeric port, userinfo).
fn strip_port(authority: &str) -> Option<&str> {
    if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        return match after {
            "" => Some(host),
            p if p.len() > 1
                && p.starts_with(':')
                && p[1..].bytes().all(|b| b.is_ascii_digit()) =>
            {
                Some(host)
            }
            _ => None,
        };
    }
    if authority.contains(['@', '/', '[', ']']) {
        return None;
    }
    match authority.rsplit_once(':') {
        // A bare IPv6 address has several colons and no port.
        Some((h, p)) if !h.contains(':') => {
            (!p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())).then_some(h)
        }
        _ => Some(authority),
    }
}

/// `scheme://host[:port]` → host; None for `null` or anything not http(s).
fn origin_host(origin: &str) -> Option<&str> {
    let rest = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))?;
    let authority = match rest.find(['/', '?', '#']) {
        Some(i) => &rest[..i],
        None => rest,
    };
    strip_port(authority)
}

fn normalize_host(h: &str) -> String {
    h.trim()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase()
}

/// Compares without an early exit, so timing does not reveal the token's prefix.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

type Body = BoxBody<Bytes, Infallible>;

fn plain(status: StatusCode, text: &'static str) -> Response<Body> {
    let mut resp = Response::new(Full::new(Bytes::from_static(text.as_bytes())).boxed());
    *resp.status_mut() = status;
    if status == StatusCode::UNAUTHORIZED {
        resp.headers_mut().insert(
            WWW_AUTHENTICATE,
            hyper::header::HeaderValue::from_static("Bearer"),
        );
    }
    resp
}

/// Binds and serves until SIGINT/SIGTERM.
pub async fn serve_http(opts: ServerOptions, http: HttpOptions) -> Result<()> {
    if !http.addr.ip().is_loopback() && http.token.is_none() {
        bail!(
            "refusing to serve on non-loopback address {} without a bearer token: set GPUSLEUTH_MCP_TOKEN or pass --token-file",
            http.addr
        );
    }
    if http.token.as_deref().is_some_and(|t| t.trim().is_empty()) {
        bail!("the bearer token is empty");
    }
    let policy = Arc::new(Policy::new(&http));
    let mut config = StreamableHttpServerConfig::default()
        // rmcp checks Host too; give it the same list (defence in depth).
        .with_allowed_hosts(policy.hosts.clone())
        .with_sse_keep_alive(None)
        // Stateless: nothing is kept between requests, so an initialize
        // flood cannot grow the server; answers are plain JSON.
        .with_legacy_session_mode(false)
        .with_json_response(true);
    config.max_request_body_bytes = MAX_BODY_BYTES;
    let server = SleuthServer::new(opts);
    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let listener = tokio::net::TcpListener::bind(http.addr)
        .await
        .with_context(|| format!("cannot bind {}", http.addr))?;
    let local = listener
        .local_addr()
        .context("cannot read the bound address")?;
    eprintln!("gpusleuth mcp: listening on http://{local}{MCP_PATH}");

    let tracker = ConnTracker::new(ConnCaps::default());
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot install the SIGTERM handler")?;
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // Transient (EMFILE, aborted handshakes): log and keep serving.
                    eprintln!("gpusleuth mcp: accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = tokio::signal::ctrl_c() => break,
            _ = sigterm.recv() => break,
        };
        let Some(admitted) = tracker.admit(peer.ip()) else {
            // Every connection in the way is serving a request: refuse this one.
            drop(stream);
            continue;
        };
        let id = admitted.id();
        let task = tokio::spawn(serve_connection(
            stream,
            peer,
            admitted,
            service.clone(),
            policy.clone(),
        ));
        tracker.set_closer(id, task.abort_handle());
    }
    eprintln!("gpusleuth mcp: shutting down");
    Ok(())
}

type Service = StreamableHttpService<SleuthServer, LocalSessionManager>;

/// Serves one connection: header deadline, policy check, then rmcp.
async fn serve_connection(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    admitted: Admitted,
    service: Service,
    policy: Arc<Policy>,
) {
    let in_flight = admitted.in_flight();
    let handler = hyper::service::service_fn(move |req: Request<Incoming>| {
        let service = service.clone();
        let policy = policy.clone();
        let in_flight = in_flight.clone();
        async move {
            if let Err((status, text)) = policy.check(req.headers()) {
                return Ok::<_, Infallible>(plain(status, text));
            }
            if req.uri().path() != MCP_PATH {
                return Ok(plain(
                    StatusCode::NOT_FOUND,
                    "not found: the MCP endpoint is /mcp\n",
                ));
            }
            // The body is read before the request counts as in progress: a
            // connection stalled mid-body stays idle (evictable) and is cut
            // at its deadline.
            let req = match read_body(req, BODY_DEADLINE).await {
                Ok(req) => req,
                Err(refusal) => return Ok(*refusal),
            };
            let _busy = Admitted::request(&in_flight);
            Ok(service.handle(req).await)
        }
    });
    let result = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_DEADLINE)
        .serve_connection(TokioIo::new(stream), handler)
        .await;
    if let Err(e) = result {
        // Header deadlines are the normal end of a slow client: not worth a line each.
        if !e.is_timeout() {
            eprintln!("gpusleuth mcp: connection from {peer}: {e}");
        }
    }
    drop(admitted);
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    fn policy(addr: &str, token: Option<&str>) -> Policy {
        Policy::new(&HttpOptions {
            addr: addr.parse().expect("test address"),
            token: token.map(String::from),
            extra_hosts: vec!["gpu-box.example".into()],
        })
    }

    fn headers(pairs: &[(&hyper::header::HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).expect("test header"));
        }
        h
    }

    #[test]
    fn host_rules() {
        let p = policy("127.0.0.1:8000", None);
        assert!(p.check(&headers(&[(&HOST, "127.0.0.1:8000")])).is_ok());
        assert!(p.check(&headers(&[(&HOST, "localhost")])).is_ok());
        assert!(p.check(&headers(&[(&HOST, "[::1]:8000")])).is_ok());
        assert!(p.check(&headers(&[(&HOST, "GPU-BOX.example:1")])).is_ok());
        assert_eq!(
            p.check(&headers(&[(&HOST, "evil.example:8000")]))
                .unwrap_err()
                .0,
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            p.check(&HeaderMap::new()).unwrap_err().0,
            StatusCode::FORBIDDEN
        );
        // A bound specific address is accepted; 0.0.0.0 itself never is.
        assert!(policy("10.1.2.3:80", Some("t"))
            .hosts
            .contains(&"10.1.2.3".to_string()));
        assert!(!policy("0.0.0.0:80", Some("t"))
            .hosts
            .contains(&"0.0.0.0".to_string()));
    }

    #[test]
    fn origin_rules() {
        let p = policy("127.0.0.1:8000", None);
        let host = "127.0.0.1:8000";
        assert!(p
            .check(&headers(&[
                (&HOST, host),
                (&ORIGIN, "http://localhost:3000")
            ]))
            .is_ok());
        assert!(p
            .check(&headers(&[(&HOST, host), (&ORIGIN, "https://[::1]")]))
            .is_ok());
        for bad in [
            "http://evil.example",
            "null",
            "file://",
            "http://127.0.0.1.evil.example:80",
        ] {
            let r = p.check(&headers(&[(&HOST, host), (&ORIGIN, bad)]));
            assert_eq!(r.unwrap_err().0, StatusCode::FORBIDDEN, "{bad}");
        }
    }

    #[test]
    fn token_rules() {
        let p = policy("0.0.0.0:8000", Some("s3cret"));
        let host = (&HOST, "127.0.0.1:8000");
        assert_eq!(
            p.check(&headers(&[host])).unwrap_err().0,
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            p.check(&headers(&[host, (&AUTHORIZATION, "Bearer s3cre")]))
                .unwrap_err()
                .0,
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            p.check(&headers(&[host, (&AUTHORIZATION, "Basic s3cret")]))
                .unwrap_err()
                .0,
            StatusCode::UNAUTHORIZED
        );
        assert!(p
            .check(&headers(&[host, (&AUTHORIZATION, "Bearer s3cret")]))
            .is_ok());
        // Host is checked before the token: a rebinding page learns nothing.
        assert_eq!(
            p.check(&headers(&[
                (&HOST, "evil"),
                (&AUTHORIZATION, "Bearer s3cret")
            ]))
            .unwrap_err()
            .0,
            StatusCode::FORBIDDEN
        );
    }

    #[test]
    fn port_stripping() {
        assert_eq!(strip_port("a:1"), Some("a"));
        assert_eq!(strip_port("a"), Some("a"));
        assert_eq!(strip_port("[::1]:5"), Some("::1"));
        assert_eq!(strip_port("[::1]"), Some("::1"));
        assert_eq!(strip_port("::1"), Some("::1"));
        for bad in [
            "[::1].evil",
            "[::1]x",
            "[::1]:",
            "[::1]:80.evil",
            "a:",
            "a:8o",
            "u@localhost",
            "[::1",
        ] {
            assert_eq!(strip_port(bad), None, "{bad}");
        }
    }

    #[test]
    fn bracket_and_duplicate_tricks_are_refused() {
        let p = policy("127.0.0.1:8000", None);
        for host in ["[::1].evil", "[::1].evil:8000", "localhost.evil"] {
            let r = p.check(&headers(&[(&HOST, host)]));
            assert_eq!(r.unwrap_err().0, StatusCode::FORBIDDEN, "{host}");
        }
        for origin in [
            "http://[::1].evil",
            "http://[::1].evil:8000",
            "http://localhost@evil.example",
            "http://localhost.evil/",
        ] {
            let r = p.check(&headers(&[(&HOST, "127.0.0.1:8000"), (&ORIGIN, origin)]));
            assert_eq!(r.unwrap_err().0, StatusCode::FORBIDDEN, "{origin}");
        }
        let mut two = HeaderMap::new();
        two.append(HOST, HeaderValue::from_static("127.0.0.1:8000"));
        two.append(HOST, HeaderValue::from_static("evil.example"));
        assert_eq!(p.check(&two).unwrap_err().0, StatusCode::FORBIDDEN);
        let mut two = HeaderMap::new();
        two.append(HOST, HeaderValue::from_static("127.0.0.1:8000"));
        two.append(ORIGIN, HeaderValue::from_static("http://localhost"));
        two.append(ORIGIN, HeaderValue::from_static("http://evil.example"));
        assert_eq!(p.check(&two).unwrap_err().0, StatusCode::FORBIDDEN);
    }
}
