//! `GET /metrics` over hyper (HTTP/1.1, the server MCP already uses), on a
//! single-threaded tokio runtime of its own thread, so a scrape never runs
//! on the thread draining the ring buffer.
//!
//! Bounds, as the hand-written server had them and MCP has them: request
//! headers within [`HEADER_DEADLINE`] and at most [`MAX_HEAD`] bytes, a whole
//! exchange within [`CONN_DEADLINE`], one request per connection, and the
//! open connections capped by MCP's `ConnTracker` (idle ones closed first).
//!
//! The bytes those connections hold are bounded too ([`Pages`]): a
//! response that starts while another still sends a page sends that page
//! (until it is [`CONN_DEADLINE`] old), so at most two pages are alive;
//! both formats are sent from the one OpenMetrics page (Prometheus 0.0.4
//! as its ranges and the few lines that differ: [`Chunks`]). Before, each
//! connection held a page of its own until its deadline: 100 clients that
//! never read the reply took a 22 MB page each (200 labelled processes),
//! the tracer's RSS to 2.2 GB (round 55's tester).

use super::Metrics;
use anyhow::Context as _;
use bytes::Bytes;
use hyper::body::Incoming;
use hyper::body::{Frame, SizeHint};
use hyper::header::{HeaderValue, ACCEPT, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use sleuth_mcp::conn_limit::{ConnCaps, ConnTracker};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

/// Largest request head read (a scrape request is a few hundred bytes).
const MAX_HEAD: usize = 16 * 1024;
/// Headers must be complete this long after the connection opened.
const HEADER_DEADLINE: Duration = Duration::from_secs(5);
/// A connection is closed this long after it opened, whatever its state
/// (a client that stops reading the response cannot hold it).
const CONN_DEADLINE: Duration = Duration::from_secs(10);
/// The last OpenMetrics page rendered, known while a response still sends
/// it (a `Weak`: once every response sending it is done, it is freed, never
/// kept for the next scrape). At most two pages are alive: the last one,
/// and an older one still sent by responses that end within
/// [`CONN_DEADLINE`] of its rendering, when the next one may be rendered.
#[derive(Default)]
struct Pages {
    last: std::sync::Mutex<Option<Page>>,
}

struct Page {
    rendered: std::time::Instant,
    text: std::sync::Weak<String>,
    /// Its length: the next page's buffer is sized for it.
    len: usize,
}

/// A page's bytes as a response body: the `Arc` travels with it.
struct PageBody(Arc<String>);

impl AsRef<[u8]> for PageBody {
    fn as_ref(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl Pages {
    /// The page to send: the one a response still sends, else one `render`
    /// writes into a buffer of the size given.
    fn get(&self, render: impl FnOnce(usize) -> String) -> Bytes {
        // Held while rendering: concurrent scrapes wait for one page.
        let mut slot = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let sent = slot
            .as_ref()
            .filter(|p| p.rendered.elapsed() < CONN_DEADLINE)
            .and_then(|p| p.text.upgrade());
        let text = match sent {
            Some(text) => text,
            None => {
                let text = Arc::new(render(slot.as_ref().map_or(0, |p| p.len)));
                *slot = Some(Page {
                    rendered: std::time::Instant::now(),
                    text: Arc::downgrade(&text),
                    len: text.len(),
                });
                text
            }
        };
        Bytes::from_owner(PageBody(text))
    }
}

/// A response body sent as chunks (a page's ranges, and the few lines the
/// 0.0.4 format changes), with its exact length.
pub(crate) struct Chunks(VecDeque<Bytes>);

impl Chunks {
    fn one(b: Bytes) -> Chunks {
        Chunks(VecDeque::from([b]))
    }

    /// The Prometheus 0.0.4 text of OpenMetrics page `om`, from the page.
    fn prometheus_004(om: &Bytes) -> Chunks {
        let text = std::str::from_utf8(om).unwrap_or_default();
        let pieces = super::encode::prometheus_004_pieces(text);
        Chunks(
            pieces
                .into_iter()
                .map(|p| match p {
                    super::encode::Piece::Same(r) => om.slice(r),
                    super::encode::Piece::New(s) => Bytes::from(s),
                })
                .collect(),
        )
    }
}

impl hyper::body::Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.pop_front().map(|b| Ok(Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.0.iter().map(|b| b.len() as u64).sum())
    }
}

pub fn spawn(addr: SocketAddr, metrics: Arc<Metrics>) -> anyhow::Result<()> {
    // Bound here, so a busy port is the command's error, not the thread's.
    let listener = std::net::TcpListener::bind(addr)
        .with_context(|| format!("--metrics {addr}: cannot listen"))?;
    listener
        .set_nonblocking(true)
        .context("--metrics: cannot configure the socket")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .context("cannot start the metrics server's runtime")?;
    std::thread::Builder::new()
        .name("gs-metrics".into())
        .spawn(move || rt.block_on(serve(listener, metrics)))
        .context("cannot start the metrics thread")?;
    Ok(())
}

async fn serve(listener: std::net::TcpListener, metrics: Arc<Metrics>) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("gpusleuth: warning: metrics server not started: {e}");
            return;
        }
    };
    let tracker = ConnTracker::new(ConnCaps::default());
    let pages = Arc::new(Pages::default());
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(_) => {
                // Transient (EMFILE, aborted handshakes): keep serving.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(admitted) = tracker.admit(peer.ip()) else {
            continue;
        };
        let id = admitted.id();
        let (metrics, pages) = (metrics.clone(), pages.clone());
        let task = tokio::spawn(async move {
            let in_flight = admitted.in_flight();
            let handler = hyper::service::service_fn(move |req: Request<Incoming>| {
                let busy = sleuth_mcp::conn_limit::Admitted::request(&in_flight);
                let resp = respond(&req, &metrics, &pages);
                drop(busy);
                async move { Ok::<_, Infallible>(resp) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_DEADLINE)
                .max_buf_size(MAX_HEAD)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), handler);
            // A broken or slow client costs one connection, never the tracer.
            let _ = tokio::time::timeout(CONN_DEADLINE, conn).await;
            drop(admitted);
        });
        tracker.set_closer(id, task.abort_handle());
    }
}

/// The response to a request: the exposition by the `Accept` header, 404
/// for other paths, 405 for other methods.
fn respond<B>(req: &Request<B>, metrics: &Metrics, pages: &Pages) -> Response<Chunks> {
    const TEXT: &str = "text/plain; charset=utf-8";
    if req.method() != Method::GET {
        return plain(
            StatusCode::METHOD_NOT_ALLOWED,
            TEXT,
            Bytes::from_static(b"only GET\n"),
        );
    }
    if req.uri().path() != "/metrics" {
        return plain(
            StatusCode::NOT_FOUND,
            TEXT,
            Bytes::from_static(b"metrics are at /metrics\n"),
        );
    }
    let openmetrics = req.headers().get_all(ACCEPT).iter().any(|v| {
        v.to_str()
            .is_ok_and(|v| v.contains("application/openmetrics-text"))
    });
    let ctype = match openmetrics {
        true => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        false => "text/plain; version=0.0.4; charset=utf-8",
    };
    let page = pages.get(|size| metrics.render(size));
    let body = match openmetrics {
        true => Chunks::one(page),
        false => Chunks::prometheus_004(&page),
    };
    with_type(Response::new(body), StatusCode::OK, ctype)
}

fn plain(status: StatusCode, ctype: &'static str, body: Bytes) -> Response<Chunks> {
    with_type(Response::new(Chunks::one(body)), status, ctype)
}

fn with_type(mut r: Response<Chunks>, status: StatusCode, ctype: &'static str) -> Response<Chunks> {
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(ctype));
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt as _;
    use std::io::{Read, Write};

    fn get(method: Method, path: &str, accept: Option<&str>) -> Request<()> {
        let mut b = Request::builder().method(method).uri(path);
        if let Some(a) = accept {
            b = b.header(ACCEPT, a);
        }
        b.body(()).unwrap()
    }

    fn body(r: Response<Chunks>) -> String {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let bytes = rt.block_on(r.into_body().collect()).unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[test]
    fn serves_metrics_by_accept_header() {
        let m = Metrics::new();
        let p = Pages::default();
        let r = respond(
            &get(
                Method::GET,
                "/metrics",
                Some("application/openmetrics-text;version=1.0.0"),
            ),
            &m,
            &p,
        );
        assert_eq!(r.status(), StatusCode::OK);
        assert!(r.headers()[CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("application/openmetrics-text"));
        assert!(body(r).ends_with("# EOF\n"));
        let r = respond(&get(Method::GET, "/metrics?x=1", None), &m, &p);
        assert!(r.headers()[CONTENT_TYPE]
            .to_str()
            .unwrap()
            .contains("0.0.4"));
        assert!(!body(r).contains("# EOF"));
        assert_eq!(
            respond(&get(Method::GET, "/", None), &m, &p).status(),
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            respond(&get(Method::POST, "/metrics", None), &m, &p).status(),
            StatusCode::METHOD_NOT_ALLOWED
        );
    }

    /// Responses that start while a page is still sent share it, until it
    /// is as old as a connection may live; a page nobody sends is freed
    /// (round 55's tester: each connection held a page of its own, 100
    /// clients that never read took 2.2 GB).
    #[test]
    fn responses_share_one_page_and_renders_are_bounded() {
        let pages = Pages::default();
        let renders = std::cell::Cell::new(0);
        let sizes = std::cell::RefCell::new(Vec::new());
        let render = |size| {
            sizes.borrow_mut().push(size);
            renders.set(renders.get() + 1);
            format!("page {}\n", renders.get())
        };
        let age = |by: Duration| pages.last.lock().unwrap().as_mut().unwrap().rendered -= by;
        // Fifty responses at once: one page, one allocation.
        let held: Vec<Bytes> = (0..50).map(|_| pages.get(render)).collect();
        assert_eq!(renders.get(), 1);
        assert!(held.iter().all(|b| b.as_ptr() == held[0].as_ptr()));
        // Still being sent, 9 s later: served again, not rendered.
        age(CONN_DEADLINE - Duration::from_secs(1));
        assert_eq!(&pages.get(render)[..], b"page 1\n");
        assert_eq!(renders.get(), 1);
        // As old as a connection may live: rendered, whoever sends it.
        age(Duration::from_secs(1));
        let second = pages.get(render);
        assert_eq!(&second[..], b"page 2\n");
        // Nobody sends a page any more: it is gone, the next is rendered,
        // into a buffer sized for the last one.
        drop((held, second));
        assert!(pages
            .last
            .lock()
            .unwrap()
            .as_ref()
            .unwrap()
            .text
            .upgrade()
            .is_none());
        assert_eq!(&pages.get(render)[..], b"page 3\n");
        assert_eq!(*sizes.borrow(), [0, 7, 7]);
    }

    /// Both formats are sent from the one OpenMetrics page: the 0.0.4
    /// answer is the page's ranges and the lines that differ, the same text
    /// `Metrics::render(false)` writes, with its exact length.
    #[test]
    fn the_004_answer_is_sent_from_the_openmetrics_page() {
        let m = Metrics::new();
        m.observe(&sleuth_core::Event::Call(sleuth_core::CallEvent {
            pid: 7,
            tid: 7,
            op: sleuth_core::op_by_name("cudaMalloc").unwrap().id,
            dur_ns: 3_000,
            size: Some(4096),
            ptr: Some(0x10),
            ..Default::default()
        }));
        let pages = Pages::default();
        let r = respond(&get(Method::GET, "/metrics", None), &m, &pages);
        use hyper::body::Body as _;
        let exact = r.body().size_hint().exact();
        let (page, text) = (pages.get(|_| unreachable!("still sent")), body(r));
        assert_eq!(text, super::super::encode::to_prometheus_004(&m.render(0)));
        assert_eq!(exact, Some(text.len() as u64));
        assert!(
            text.contains("# TYPE gpusleuth_cuda_calls_total counter\n"),
            "{text}"
        );
        assert!(!text.contains("# EOF"));
        drop(page);
    }

    fn free_addr() -> SocketAddr {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    }

    /// One scrape over a real socket: the whole response.
    fn scrape(addr: SocketAddr) -> String {
        let mut c = std::net::TcpStream::connect(addr).unwrap();
        c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn real_socket_round_trip() {
        let addr = free_addr();
        spawn(addr, Arc::new(Metrics::new())).unwrap();
        let out = scrape(addr);
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
        assert!(out.contains("gpusleuth_labelled_processes 0"), "{out}");
    }

    /// An oversized head is refused without a response body of metrics,
    /// and a silent client does not stop others from being served.
    #[test]
    fn oversized_and_silent_clients_are_bounded() {
        let addr = free_addr();
        spawn(addr, Arc::new(Metrics::new())).unwrap();
        let _silent = std::net::TcpStream::connect(addr).unwrap();
        let mut big = std::net::TcpStream::connect(addr).unwrap();
        let head = format!(
            "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: {}\r\n\r\n",
            "a".repeat(4 * MAX_HEAD)
        );
        // The server may close mid-write: only what it answers matters.
        let _ = big.write_all(head.as_bytes());
        let mut out = String::new();
        let _ = big.read_to_string(&mut out);
        assert!(!out.contains("gpusleuth_labelled_processes"), "{out}");
        let out = scrape(addr);
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
    }
}
