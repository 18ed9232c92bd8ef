//! Limits of the stdio transport, through the binary: a request line over
//! 16 MiB is answered (rmcp alone dropped it and the client waited for
//! ever), and the server serves the next request.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;
#[path = "common/bin.rs"]
mod bin;
use bin::gpusleuth_with;

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/demo-sim.db")
}

#[test]
fn an_oversized_request_line_is_answered() {
    let mut child = gpusleuth_with(Stdio::piped(), Stdio::piped(), Stdio::null())
        .args(["mcp", "--db"])
        .arg(example())
        .spawn()
        .expect("start server");
    let mut stdin = child.stdin.take().expect("stdin");
    let stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let (tx, rx) = mpsc::channel::<serde_json::Value>();
    std::thread::spawn(move || {
        for line in stdout.lines().map_while(Result::ok) {
            if let Ok(v) = serde_json::from_str(&line) {
                if tx.send(v).is_err() {
                    break;
                }
            }
        }
    });
    // Generous: a loaded machine is slow, and without the fix no answer
    // ever comes.
    let next = || rx.recv_timeout(Duration::from_secs(60)).ok();
    let send = |stdin: &mut std::process::ChildStdin, line: &[u8]| {
        stdin.write_all(line).expect("write");
        stdin.flush().expect("flush");
    };
    send(&mut stdin, br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}
{"jsonrpc":"2.0","method":"notifications/initialized"}
"#);
    assert_eq!(next().expect("initialize answered")["id"], 1);
    // A valid ping padded past 16 MiB.
    let big = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\",\"params\":{{\"_meta\":{{\"pad\":\"{}\"}}}}}}\n",
        "a".repeat(17 << 20)
    );
    send(&mut stdin, big.as_bytes());
    let answer = next().expect("the oversized line gets an answer");
    assert_eq!(answer["error"]["code"], -32600, "{answer}");
    assert!(answer.get("result").is_none());
    // The next request is served, and one of 1 MiB still passes.
    let ok = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"ping\",\"params\":{{\"_meta\":{{\"pad\":\"{}\"}}}}}}\n",
        "b".repeat(1 << 20)
    );
    send(&mut stdin, ok.as_bytes());
    let answer = next().expect("next request answered");
    assert_eq!(answer["id"], 3, "{answer}");
    assert!(answer.get("result").is_some(), "{answer}");
    drop(stdin);
    let _ = child.kill();
    let _ = child.wait();
}
