//! A raw JSON-RPC client over `gpusleuth mcp`'s stdio, for tests that call
//! MCP tools without the Python client. Included through `#[path]`.

#[path = "bin.rs"]
pub mod bin;

use bin::gpusleuth_with;
use std::ffi::OsStr;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// A raw JSON-RPC client over `gpusleuth mcp`'s stdio.
pub struct McpStdio {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    lines: std::sync::mpsc::Receiver<String>,
    next_id: u64,
    deadline: Duration,
}

impl McpStdio {
    /// Starts `gpusleuth mcp ARGS` and initializes the session; each request
    /// must be answered within `deadline`.
    pub fn start(args: &[&OsStr], deadline: Duration) -> McpStdio {
        let mut child = gpusleuth_with(Stdio::piped(), Stdio::piped(), Stdio::null())
            .arg("mcp")
            .args(args)
            .spawn()
            .expect("start mcp");
        let stdin = child.stdin.take().expect("stdin");
        let out = child.stdout.take().expect("stdout");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut c = McpStdio {
            child,
            stdin,
            lines,
            next_id: 1,
            deadline,
        };
        let init = c.call(
            "initialize",
            serde_json::json!({"protocolVersion": "2025-06-18", "capabilities": {},
                               "clientInfo": {"name": "gpusleuth-tests", "version": "0"}}),
        );
        assert!(init["result"].is_object(), "initialize: {init}");
        c.send(&serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        c
    }

    pub fn send(&mut self, v: &serde_json::Value) {
        use std::io::Write;
        writeln!(self.stdin, "{v}").expect("write to the server");
        self.stdin.flush().expect("flush");
    }

    /// One request; its response, or a panic naming a hang.
    pub fn call(&mut self, method: &str, params: serde_json::Value) -> serde_json::Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(
            &serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
        );
        let deadline = Instant::now() + self.deadline;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self.lines.recv_timeout(left).unwrap_or_else(|_| {
                panic!(
                    "HANG or crash: MCP {method} {params} got no answer within {:?}",
                    self.deadline
                )
            });
            let msg: serde_json::Value =
                serde_json::from_str(&line).expect("stdout carries JSON-RPC only");
            if msg["id"] == id {
                return msg;
            }
        }
    }
}

impl Drop for McpStdio {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
