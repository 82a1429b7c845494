//! Fuzz target `mcp_line`: MCP input → the real server (`mcp::serve_io`, the server of
//! `cordis run` over an in-memory pipe instead of stdio) of a runtime with an empty
//! composition, in one session.
//!
//! Per input, one connection: the first byte chooses whether the client first completes
//! the handshake (even: `initialize` + `notifications/initialized`, with elicitation) or
//! sends the fuzzed bytes as its very first message (odd: pre-initialize handling,
//! `server/discover` and inline-metadata requests of the 2026-07-28 protocol); the rest is
//! written as newline-terminated input, followed by a `ping` whose answer marks the end.
//! The connection ends when that `ping` is answered or the server closes it. Covered:
//! rmcp's line framing and message decoding, the handshake, and every handler of the
//! server (`initialize`, `server/discover`, `tools/list`, `tools/call` with unknown tools
//! and with forged `requestState`s, subscriptions). Every line the server writes must be
//! JSON, it must answer the ping or close the connection, and it must end when its input
//! ends. Tools themselves are not reached: the composition has none.

#![no_main]

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use cordis_cli::mcp::{serve_io, McpOptions, ToolListNotifier};
use cordis_engine::Runtime;
use cordis_engine::Host;
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{"elicitation":{}},"clientInfo":{"name":"fuzz","version":"0"}}}"#;
const INITIALIZED: &str = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
const END: &str = r#"{"jsonrpc":"2.0","id":"fuzz-end","method":"ping"}"#;

/// How long the server may take to answer and to end (a hang is a finding). At the end of
/// its input rmcp lets in-flight handlers finish for up to 5 s, and an open
/// `subscriptions/listen` only ends when cancelled, so such an input takes 5 s.
const BOUND: Duration = Duration::from_secs(20);

struct Server {
    _dir: tempfile::TempDir,
    tokio: tokio::runtime::Runtime,
    runtime: Arc<Runtime>,
    session: String,
}

fn server() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a scratch directory");
        let manifest = dir.path().join("cordis.yml");
        std::fs::write(&manifest, "").expect("an empty manifest");
        let work = dir.path().join("work");
        std::fs::create_dir(&work).expect("the session directory");
        let host = Host::new(&manifest, &[], &dir.path().join("state"), false);
        let runtime = Runtime::start(host).expect("an empty composition starts");
        let session = runtime.sessions().create(&work).expect("a session").id;
        let tokio = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime");
        Server {
            _dir: dir,
            tokio,
            runtime,
            session,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, fuzzed)) = data.split_first() else {
        return;
    };
    let server = server();
    let mut input = Vec::new();
    if mode & 1 == 0 {
        for line in [INITIALIZE, INITIALIZED] {
            input.extend_from_slice(line.as_bytes());
            input.push(b'\n');
        }
    }
    input.extend_from_slice(fuzzed);
    input.push(b'\n');
    input.extend_from_slice(END.as_bytes());
    input.push(b'\n');

    let (client, server_end) = tokio::io::duplex(1 << 16);
    let (server_read, server_write) = tokio::io::split(server_end);
    let (client_read, mut client_write) = tokio::io::split(client);
    let options = McpOptions {
        session: Some(server.session.clone()),
        ..McpOptions::default()
    };
    let serving = serve_io(
        server.runtime.clone(),
        options,
        ToolListNotifier::default(),
        server_read,
        server_write,
    );
    // Written and read at once, so neither side can block on a full pipe.
    let (answered, end_of_input) = tokio::sync::oneshot::channel::<()>();
    let writer = async move {
        // The server may close the connection early (e.g. after a refused handshake).
        let _ = client_write.write_all(&input).await;
        let _ = end_of_input.await;
        // Dropping a split half does not close the pipe; shutting it down does.
        let _ = client_write.shutdown().await;
    };
    let reader = async move {
        let mut lines = BufReader::new(client_read).lines();
        let mut answered = Some(answered);
        while let Some(line) = lines.next_line().await.expect("the server writes UTF-8") {
            let reply: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| {
                panic!("the server wrote a line that is not JSON ({e}): {line}")
            });
            if reply["id"] == "fuzz-end" {
                // The end marker is answered (a result, or an error where a 2026-07-28
                // connection wants metadata): end the input; the server must end too.
                answered.take();
            }
        }
    };
    server.tokio.block_on(async {
        let all = async { tokio::join!(serving, writer, reader) };
        // The server's own result may be an error (a refused handshake ends the connection).
        let (_served, (), ()) = tokio::time::timeout(BOUND, all)
            .await
            .expect("the server answers and ends within the bound");
    });
});
