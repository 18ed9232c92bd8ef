//! A minimal HTTP/1.1 server for `GET /metrics`, one request per connection,
//! on its own thread. Scrapes are rare and small; std::net is enough.

use super::Metrics;
use anyhow::Context as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

/// Largest request head read (a scrape request is a few hundred bytes).
const MAX_HEAD: usize = 16 * 1024;

pub fn spawn(addr: SocketAddr, metrics: Arc<Metrics>) -> anyhow::Result<()> {
    let listener =
        TcpListener::bind(addr).with_context(|| format!("--metrics {addr}: cannot listen"))?;
    std::thread::Builder::new()
        .name("gs-metrics".into())
        .spawn(move || {
            for conn in listener.incoming().flatten() {
                // A broken client costs one connection, never the tracer.
                let _ = handle(conn, &metrics);
            }
        })
        .context("cannot start the metrics thread")?;
    Ok(())
}

fn handle(mut conn: TcpStream, metrics: &Metrics) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    conn.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut head = Vec::new();
    let mut buf = [0u8; 2048];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = conn.read(&mut buf)?;
        if n == 0 || head.len() + n > MAX_HEAD {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let head = String::from_utf8_lossy(&head);
    let (status, ctype, body) = respond(&head, metrics);
    let resp = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(resp.as_bytes())?;
    conn.write_all(body.as_bytes())?;
    conn.flush()
}

/// Status line, content type and body for a request head.
fn respond(head: &str, metrics: &Metrics) -> (&'static str, &'static str, String) {
    let mut lines = head.lines();
    let mut parts = lines.next().unwrap_or("").split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    const TEXT: &str = "text/plain; charset=utf-8";
    if method != "GET" {
        return ("405 Method Not Allowed", TEXT, "only GET\n".into());
    }
    if path != "/metrics" {
        return ("404 Not Found", TEXT, "metrics are at /metrics\n".into());
    }
    let openmetrics = lines.any(|l| {
        l.split_once(':').is_some_and(|(k, v)| {
            k.trim().eq_ignore_ascii_case("accept") && v.contains("application/openmetrics-text")
        })
    });
    if openmetrics {
        (
            "200 OK",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            metrics.render(true),
        )
    } else {
        (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            metrics.render(false),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serves_metrics_by_accept_header() {
        let m = Metrics::new();
        let (s, ct, body) = respond(
            "GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text;version=1.0.0\r\n\r\n",
            &m,
        );
        assert_eq!(s, "200 OK");
        assert!(ct.starts_with("application/openmetrics-text"));
        assert!(body.ends_with("# EOF\n"));
        let (_, ct, body) = respond("GET /metrics HTTP/1.1\r\n\r\n", &m);
        assert!(ct.contains("0.0.4") && !body.contains("# EOF"));
        assert_eq!(respond("GET / HTTP/1.1\r\n\r\n", &m).0, "404 Not Found");
        assert_eq!(
            respond("POST /metrics HTTP/1.1\r\n\r\n", &m).0,
            "405 Method Not Allowed"
        );
    }

    #[test]
    fn real_socket_round_trip() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        spawn(addr, Arc::new(Metrics::new())).unwrap();
        let mut c = TcpStream::connect(addr).unwrap();
        c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).unwrap();
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
        assert!(out.contains("gpusleuth_labelled_processes 0"), "{out}");
    }
}
