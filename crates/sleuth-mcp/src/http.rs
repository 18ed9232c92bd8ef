//! Streamable HTTP transport: rmcp's `StreamableHttpService` behind a small
//! hyper server and a guard that runs on every request, before rmcp sees it:
//!
//! 1. `Host` must name this server (loopback names, the bound address, or an
//!    explicitly allowed host): 403 otherwise (DNS rebinding).
//! 2. `Origin`, when present, must be a loopback or allowed host: 403 otherwise
//!    (a web page must not reach a local server through the browser).
//! 3. When a token is configured, `Authorization: Bearer <token>`: 401 otherwise.
//!    A non-loopback bind refuses to start without a token.

use crate::server::{ServerOptions, SleuthServer};
use anyhow::{bail, Context, Result};
use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, AUTHORIZATION, HOST, ORIGIN, WWW_AUTHENTICATE};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

/// The path the MCP endpoint is served at.
pub const MCP_PATH: &str = "/mcp";

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
        let host = headers.get(HOST).and_then(|v| v.to_str().ok());
        match host.map(strip_port) {
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

/// `host`, `host:port`, `[v6]:port` or `[v6]` → the host part.
fn strip_port(authority: &str) -> &str {
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match authority.rsplit_once(':') {
        // A bare IPv6 address has several colons and no port.
        Some((h, p)) if !h.contains(':') && p.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => authority,
    }
}

/// `scheme://host[:port]` → host; None for `null` or anything not http(s).
fn origin_host(origin: &str) -> Option<&str> {
    let rest = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))?;
    let authority = rest.split('/').next()?;
    Some(strip_port(authority))
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
    let config = StreamableHttpServerConfig::default()
        // rmcp checks Host too; give it the same list (defence in depth).
        .with_allowed_hosts(policy.hosts.clone())
        .with_sse_keep_alive(None);
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
        let service = service.clone();
        let policy = policy.clone();
        tokio::spawn(async move {
            let handler = hyper::service::service_fn(move |req: Request<Incoming>| {
                let service = service.clone();
                let policy = policy.clone();
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
                    Ok(service.handle(req).await)
                }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), handler)
                .await
            {
                eprintln!("gpusleuth mcp: connection from {peer}: {e}");
            }
        });
    }
    eprintln!("gpusleuth mcp: shutting down");
    Ok(())
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
        assert_eq!(strip_port("a:1"), "a");
        assert_eq!(strip_port("a"), "a");
        assert_eq!(strip_port("[::1]:5"), "::1");
        assert_eq!(strip_port("::1"), "::1");
    }
}
