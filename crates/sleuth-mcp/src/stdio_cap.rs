//! A cap on stdio request lines that answers instead of dropping.
//!
//! rmcp's stdio transport drops a line longer than its cap (16 MiB) with a
//! log line and no answer: the client, waiting on its request's id, hangs.
//! [`LineCap`] sits between stdin and rmcp. It passes every line of at most
//! `max` bytes (newline included) through unchanged; of a longer line it
//! passes the first part, then ends it with a newline (rmcp reads that as
//! unparsable JSON and ignores it, as any garbage line), skips the rest up
//! to its newline, and then hands rmcp [`OVERSIZED`]: well-formed JSON that
//! is not a JSON-RPC message, which rmcp answers through its own writer
//! with error -32600 `Invalid request`, `id` null (no id can be read from
//! a line that was not read). Memory stays one read buffer, whatever the
//! line's length.

use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, ReadBuf};

/// What an over-long line becomes: valid JSON, not a JSON-RPC message.
pub const OVERSIZED: &[u8] = b"{\"gpusleuth\":\"request line too long\"}\n";

/// Bytes read from the inner reader at a time.
const CHUNK: usize = 64 << 10;

/// An [`AsyncRead`] whose lines are at most `max` bytes (see the module).
pub struct LineCap<R> {
    inner: R,
    max: usize,
    /// Bytes of the current line passed on so far.
    line: usize,
    /// Skipping the rest of an over-long line.
    skipping: bool,
    /// Bytes ready to hand out, from `at`.
    out: Vec<u8>,
    at: usize,
    chunk: Box<[u8]>,
}

impl<R> LineCap<R> {
    pub fn new(inner: R, max: usize) -> Self {
        LineCap {
            inner,
            max: max.max(2),
            line: 0,
            skipping: false,
            out: Vec::new(),
            at: 0,
            chunk: vec![0; CHUNK].into_boxed_slice(),
        }
    }

    /// Moves `input` into `out`, capping its lines.
    fn take(&mut self, mut input: &[u8]) {
        while !input.is_empty() {
            let newline = input.iter().position(|&b| b == b'\n');
            let seg = newline.map_or(input.len(), |i| i + 1);
            let (part, rest) = input.split_at(seg);
            input = rest;
            if self.skipping {
                if newline.is_some() {
                    self.skipping = false;
                    self.line = 0;
                    self.out.extend_from_slice(OVERSIZED);
                }
                continue;
            }
            if self.line + part.len() <= self.max {
                self.out.extend_from_slice(part);
                self.line = if newline.is_some() {
                    0
                } else {
                    self.line + part.len()
                };
                continue;
            }
            // Too long: end what was passed on (an empty line when nothing
            // was, which rmcp skips), then skip to the line's end.
            self.out.push(b'\n');
            self.line = 0;
            if newline.is_some() {
                self.out.extend_from_slice(OVERSIZED);
            } else {
                self.skipping = true;
            }
        }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for LineCap<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.at < this.out.len() {
                let n = (this.out.len() - this.at).min(buf.remaining());
                buf.put_slice(&this.out[this.at..this.at + n]);
                this.at += n;
                if this.at == this.out.len() {
                    this.out.clear();
                    this.at = 0;
                }
                return Poll::Ready(Ok(()));
            }
            let mut chunk = std::mem::take(&mut this.chunk);
            let mut rb = ReadBuf::new(&mut chunk);
            let polled = Pin::new(&mut this.inner).poll_read(cx, &mut rb);
            let filled = rb.filled().len();
            let result = match polled {
                Poll::Ready(Ok(())) if filled == 0 => Some(Poll::Ready(Ok(()))), // end of input
                Poll::Ready(Ok(())) => {
                    this.take(&chunk[..filled]);
                    None
                }
                other => Some(other),
            };
            this.chunk = chunk;
            if let Some(r) = result {
                return r;
            }
            // All of it skipped: read on.
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    async fn through(input: &[u8], max: usize) -> Vec<u8> {
        let mut out = Vec::new();
        LineCap::new(input, max)
            .read_to_end(&mut out)
            .await
            .expect("read");
        out
    }

    #[tokio::test]
    async fn short_lines_pass_unchanged() {
        let input = b"{\"a\":1}\n\n{\"b\":2}\npartial";
        assert_eq!(through(input, 8).await, input.to_vec());
    }

    #[tokio::test]
    async fn a_long_line_becomes_a_message_rmcp_answers() {
        let long = format!("{}\n", "x".repeat(200_000));
        let input = format!("{{\"a\":1}}\n{long}{{\"b\":2}}\n");
        let out = through(input.as_bytes(), 100_000).await;
        let text = String::from_utf8(out).expect("utf8");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "{\"a\":1}");
        // The long line's first part, ended: garbage rmcp ignores.
        assert!(lines[1].len() <= 100_000 && lines[1].bytes().all(|b| b == b'x'));
        assert_eq!(lines[2].as_bytes(), &OVERSIZED[..OVERSIZED.len() - 1]);
        assert_eq!(lines[3], "{\"b\":2}");
        assert_eq!(lines.len(), 4);
        // A line of exactly the cap passes.
        let exact = format!("{}\n", "y".repeat(99_999));
        assert_eq!(through(exact.as_bytes(), 100_000).await, exact.as_bytes());
    }
}
