//! Serving many clients over Streamable HTTP, end to end with the real binary and the bundled
//! plugins: 64 clients each making 1,000 `read` calls of a 4 KiB file, each in its own MCP
//! session on its own keep-alive connection, while 8 more clients run short `bash` commands,
//! all against one `cordis run --http`:
//! - throughput, p50/p99 of a `read` and of a `bash` call, failures (must be 0), and the
//!   server's resident memory per session;
//! - the same while a plugin library (`dsh-tool-fs`, which serves `read`) is hot-reloaded
//!   every second;
//! - the baselines, in the same run: the same `read` over stdio and over HTTP by one
//!   client alone, and the 64 read clients without the bash clients;
//! - the stateless 2026-07-28 protocol against the session protocol: one client, and 64
//!   clients, each carrying its session's handle;
//! - (`-- ratio`) one client's HTTP `read` against stdio's, in rounds timing both back to
//!   back.
//!
//! Run with `cargo bench -p cordis-e2e --bench http`. The load generator shares the machine's
//! cores with the server. Latencies of whole requests are timed directly (criterion's
//! per-iteration model does not give p99 of a live server).

use std::io::BufRead;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cordis_e2e::bench::{human, median, resident_kib, summarize, StdioClient};
use cordis_e2e::{library, replace_file, KillOnDrop, Scratch};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;

const READ_CLIENTS: usize = 64;
const READS: usize = 1_000;
const BASH_CLIENTS: usize = 8;
const STDIO_READS: usize = 5_000;
const TOKEN: &str = "bench-token-0123456789abcdef";

/// `cordis run --http 127.0.0.1:0`, its address read from its log.
struct Server {
    child: KillOnDrop,
    addr: String,
}

impl Server {
    fn start(s: &Scratch, args: &[&str]) -> Server {
        let mut all = vec!["run", "--http", "127.0.0.1:0"];
        all.extend_from_slice(args);
        let mut child = s
            .cordis(&all)
            .env("CORDIS_HTTP_TOKEN", TOKEN)
            .env("RUST_LOG", "warn,cordis_cli::http=info")
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn cordis run --http");
        let mut log = std::io::BufReader::new(child.stderr.take().expect("stderr"));
        let addr = loop {
            let mut line = String::new();
            let n = log.read_line(&mut line).expect("read the server's log");
            assert!(n > 0, "cordis run --http exited before serving");
            if let Some(rest) = line
                .split("serving MCP over Streamable HTTP at http://")
                .nth(1)
            {
                break rest.split('/').next().expect("an address").to_string();
            }
        };
        // The rest of the log is drained so the server never blocks on it; failures show.
        std::thread::spawn(move || {
            for line in log.lines().map_while(Result::ok) {
                if line.contains("ERROR") || line.contains("WARN") {
                    eprintln!("server: {line}");
                }
            }
        });
        Server {
            child: KillOnDrop(child),
            addr,
        }
    }

    fn pid(&self) -> u32 {
        self.child.0.id()
    }
}

/// Which protocol a client speaks.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Protocol {
    /// `initialize`, then every request in its MCP session.
    Session,
    /// 2026-07-28: every request stands alone, naming its cordis session's handle.
    Stateless,
}

/// One MCP client over one keep-alive HTTP/1.1 connection, in one session.
struct Client {
    send: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    addr: String,
    protocol: Protocol,
    /// The MCP session id, or the handle of the cordis session (stateless).
    session: String,
    next_id: u64,
}

impl Client {
    async fn connect(addr: &str, protocol: Protocol) -> Client {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .expect("connect to the server");
        stream.set_nodelay(true).expect("nodelay");
        let io = hyper_util::rt::TokioIo::new(stream);
        let (send, connection) = hyper::client::conn::http1::handshake(io)
            .await
            .expect("HTTP handshake");
        tokio::spawn(connection);
        let mut client = Client {
            send,
            addr: addr.to_string(),
            protocol,
            session: String::new(),
            next_id: 0,
        };
        if protocol == Protocol::Stateless {
            return client;
        }
        let (status, session, _) = client
            .post(
                &serde_json::json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                    "clientInfo": {"name": "bench", "version": "0"}}}),
            )
            .await;
        assert_eq!(status, 200, "initialize failed");
        client.session = session.expect("an Mcp-Session-Id");
        let (status, _, _) = client
            .post(&serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        assert_eq!(status, 202, "initialized failed");
        client
    }

    async fn post(&mut self, message: &serde_json::Value) -> (u16, Option<String>, String) {
        let mut request = hyper::Request::post("/mcp")
            .header("host", &self.addr)
            .header("authorization", format!("Bearer {TOKEN}"))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        if self.protocol == Protocol::Stateless {
            request = request
                .header("mcp-protocol-version", "2026-07-28")
                .header("mcp-method", message["method"].as_str().unwrap_or_default())
                .header(
                    "mcp-name",
                    message["params"]["name"].as_str().unwrap_or_default(),
                );
        } else if !self.session.is_empty() {
            request = request
                .header("mcp-session-id", &self.session)
                .header("mcp-protocol-version", "2025-11-25");
        }
        let request = request
            .body(Full::new(Bytes::from(message.to_string())))
            .expect("a request");
        self.send.ready().await.expect("connection ready");
        let response = self.send.send_request(request).await.expect("a response");
        let status = response.status().as_u16();
        let session = response
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = response
            .into_body()
            .collect()
            .await
            .expect("the body")
            .to_bytes();
        (status, session, String::from_utf8_lossy(&body).into_owned())
    }

    /// One `tools/call`: whether it succeeded (HTTP 200, a result, not an error result).
    async fn call(&mut self, tool: &str, args: &serde_json::Value) -> bool {
        self.next_id += 1;
        let id = self.next_id;
        let mut params = serde_json::json!({"name": tool, "arguments": args});
        if self.protocol == Protocol::Stateless {
            let mut meta = serde_json::json!({
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {},
                "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "0"},
            });
            if !self.session.is_empty() {
                meta["cordis/session"] = serde_json::json!(self.session);
            }
            params["_meta"] = meta;
        }
        let (status, _, body) = self
            .post(
                &serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": params}),
            )
            .await;
        // The answer is an SSE event `data: {json}` (or a JSON body).
        let answer = body
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .chain(std::iter::once(body.as_str()))
            .filter_map(|d| serde_json::from_str::<serde_json::Value>(d.trim()).ok())
            .find(|v| v["id"] == id);
        if let Some(handle) = answer
            .as_ref()
            .and_then(|a| a["result"]["_meta"]["cordis/session"].as_str())
        {
            self.session = handle.to_string();
        }
        status == 200
            && answer.is_some_and(|a| a["result"]["isError"] == false && a["result"].is_object())
    }

    async fn delete(mut self) {
        if self.protocol == Protocol::Stateless {
            return;
        }
        let request = hyper::Request::delete("/mcp")
            .header("host", &self.addr)
            .header("authorization", format!("Bearer {TOKEN}"))
            .header("mcp-session-id", &self.session)
            .body(Full::new(Bytes::new()))
            .expect("a request");
        if self.send.ready().await.is_ok() {
            let _ = self.send.send_request(request).await;
        }
    }
}

#[derive(Default)]
struct Outcome {
    reads: Vec<f64>,
    bash: Vec<f64>,
    failures: usize,
    wall: Duration,
    rss_per_session_kib: f64,
    sessions: usize,
    reloads: usize,
}

/// The load: `readers` clients making `reads` reads each, `bashers` bash clients until
/// then (as fast as they can, or together at `bash_rate` calls per second), and the
/// library `reload.1` replaced by a copy of `reload.0` every second.
fn load(
    server: &Server,
    (readers, reads, bashers): (usize, usize, usize),
    reload: Option<(&std::path::Path, &std::path::Path)>,
    protocol: Protocol,
    bash_rate: Option<f64>,
) -> Outcome {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let idle_kib = resident_kib(server.pid());
    runtime.block_on(async {
        let sessions = readers + bashers;
        let mut read_clients = Vec::new();
        for _ in 0..readers {
            read_clients.push(Client::connect(&server.addr, protocol).await);
        }
        let mut bash_clients = Vec::new();
        for _ in 0..bashers {
            bash_clients.push(Client::connect(&server.addr, protocol).await);
        }
        let sessions_kib = resident_kib(server.pid());
        let done = Arc::new(AtomicBool::new(false));
        let failures = Arc::new(AtomicUsize::new(0));
        let reloads = Arc::new(AtomicUsize::new(0));
        let reloader = reload.map(|(source, target)| {
            let (done, reloads) = (done.clone(), reloads.clone());
            let (source, target) = (source.to_path_buf(), target.to_path_buf());
            std::thread::spawn(move || {
                while !done.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_secs(1));
                    replace_file(&source, &target);
                    reloads.fetch_add(1, Ordering::SeqCst);
                }
            })
        });
        let started = Instant::now();
        let read_args = serde_json::json!({ "path": "data.txt" });
        let read_tasks: Vec<_> = read_clients
            .into_iter()
            .map(|mut c| {
                let (args, failures) = (read_args.clone(), failures.clone());
                tokio::spawn(async move {
                    let mut samples = Vec::with_capacity(reads);
                    for _ in 0..reads {
                        let t = Instant::now();
                        if !c.call("read", &args).await {
                            failures.fetch_add(1, Ordering::SeqCst);
                        }
                        samples.push(t.elapsed().as_nanos() as f64);
                    }
                    c.delete().await;
                    samples
                })
            })
            .collect();
        let bash_tasks: Vec<_> = bash_clients
            .into_iter()
            .map(|mut c| {
                let (done, failures) = (done.clone(), failures.clone());
                tokio::spawn(async move {
                    let args = serde_json::json!({ "command": "echo hi" });
                    let mut samples = Vec::new();
                    let every = bash_rate.map(|r| Duration::from_secs_f64(bashers as f64 / r));
                    let mut next = tokio::time::Instant::now();
                    while !done.load(Ordering::SeqCst) {
                        if let Some(every) = every {
                            next += every;
                            tokio::time::sleep_until(next).await;
                        }
                        let t = Instant::now();
                        if !c.call("bash", &args).await {
                            failures.fetch_add(1, Ordering::SeqCst);
                        }
                        samples.push(t.elapsed().as_nanos() as f64);
                    }
                    c.delete().await;
                    samples
                })
            })
            .collect();
        let mut read_samples = Vec::with_capacity(readers * reads);
        for task in read_tasks {
            read_samples.extend(task.await.expect("a read client"));
        }
        let wall = started.elapsed();
        done.store(true, Ordering::SeqCst);
        let mut bash = Vec::new();
        for task in bash_tasks {
            bash.extend(task.await.expect("a bash client"));
        }
        if let Some(reloader) = reloader {
            reloader.join().expect("the reloader");
        }
        Outcome {
            reads: read_samples,
            bash,
            failures: failures.load(Ordering::SeqCst),
            wall,
            rss_per_session_kib: sessions_kib.saturating_sub(idle_kib) as f64 / sessions as f64,
            sessions,
            reloads: reloads.load(Ordering::SeqCst),
        }
    })
}

fn report(what: &str, outcome: Outcome, baselines: &[(&str, f64)]) -> f64 {
    let calls = outcome.reads.len();
    let bash_calls = outcome.bash.len();
    let (p50, p99) = summarize(outcome.reads);
    let (b50, b99) = if outcome.bash.is_empty() {
        (0.0, 0.0)
    } else {
        summarize(outcome.bash)
    };
    println!("{what}:");
    println!(
        "  read  {calls} calls in {:.2} s: {:.0} calls/s  p50 {:>10}  p99 {:>10}",
        outcome.wall.as_secs_f64(),
        calls as f64 / outcome.wall.as_secs_f64(),
        human(p50),
        human(p99)
    );
    if bash_calls > 0 {
        println!(
            "  bash  {bash_calls} calls: p50 {:>10}  p99 {:>10}",
            human(b50),
            human(b99)
        );
    }
    println!(
        "  failures {}{}{}",
        outcome.failures,
        if outcome.sessions > 1 {
            format!(
                "  resident memory per session {:.0} KiB ({} sessions on a fresh server)",
                outcome.rss_per_session_kib, outcome.sessions
            )
        } else {
            String::new()
        },
        if outcome.reloads > 0 {
            format!("  reloads {}", outcome.reloads)
        } else {
            String::new()
        }
    );
    for (name, baseline) in baselines {
        println!("  ratio read p50 / {name} {:.2}", p50 / baseline);
    }
    assert_eq!(outcome.failures, 0, "{what}: calls failed");
    p50
}

/// `cargo bench -p cordis-e2e --bench http [-- reads|shell]`: the named parts, or both.
/// What `--auth oauth` adds to a request: a token's signature is checked the first time it
/// is seen (ES256, the key of `tests/keys`), then the token is remembered until it expires.
fn oauth_cost(http_p50: f64) {
    use cordis_cli::http::oauth::{OAuthOptions, Resource, SCOPE_TOOLS};
    let resource = std::sync::Arc::new(
        Resource::from_jwks(
            OAuthOptions {
                issuer: "https://as.example".into(),
                audience: "https://mcp.example/mcp".into(),
                jwks: None,
            },
            include_str!("../keys/jwks.json"),
        )
        .expect("the test JWKS"),
    );
    let key = jsonwebtoken::EncodingKey::from_ec_der(include_bytes!("../keys/es256.pk8.der"));
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
    header.kid = Some("test-es256".into());
    let exp = jsonwebtoken::get_current_timestamp() + 3600;
    let tokens: Vec<String> = (0..500)
        .map(|n| {
            let claims = serde_json::json!({
                "iss": "https://as.example", "sub": format!("client-{n}"),
                "aud": "https://mcp.example/mcp", "exp": exp, "scope": SCOPE_TOOLS,
            });
            jsonwebtoken::encode(&header, &claims, &key).expect("sign")
        })
        .collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let per_token = |tokens: &[String]| {
        let timed = Instant::now();
        for token in tokens {
            rt.block_on(resource.authorize(Some(token), SCOPE_TOOLS))
                .expect("a valid token");
        }
        timed.elapsed().as_nanos() as f64 / tokens.len() as f64
    };
    let first = per_token(&tokens);
    let again = per_token(&tokens);
    println!(
        "oauth: a token seen first costs {} to verify ({:.3}% of the HTTP read p50), a remembered one {} ({:.3}%; target under 5%)",
        human(first),
        first / http_p50 * 100.0,
        human(again),
        again / http_p50 * 100.0,
    );
}

fn main() {
    let wanted: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let parts: [(&str, fn()); 3] = [
        ("reads", reads),
        ("ratio", ratio_rounds),
        ("shell", shell_beside_reads),
    ];
    for (name, part) in parts {
        if wanted.is_empty() || wanted.iter().any(|w| w == name) {
            part();
        }
    }
}

/// Rounds of the HTTP/stdio ratio.
const RATIO_ROUNDS: usize = 7;
/// Reads per client and protocol in a round.
const RATIO_READS: usize = 2_000;

/// The ratio of one client's `read` over HTTP to the same over stdio, each round timing
/// both back to back on fresh servers: on a machine whose speed drifts from minute to
/// minute, the median of the rounds' ratios is steadier than one ratio of two runs.
fn ratio_rounds() {
    let s = Scratch::with_bundled_manifest();
    s.write("data.txt", &"0123456789abcdef".repeat(256));
    let read_args = serde_json::json!({ "path": "data.txt" });
    println!("HTTP against stdio, one client, {RATIO_ROUNDS} rounds of {RATIO_READS} reads each:");
    let (mut https, mut stdios) = (Vec::new(), Vec::new());
    let ratios: Vec<f64> = (0..RATIO_ROUNDS)
        .map(|round| {
            let mut stdio = StdioClient::start(&s);
            let samples = stdio.time_calls(RATIO_READS, "read", &read_args);
            stdio.finish();
            let (stdio_p50, _) = summarize(samples);
            let server = Server::start(&s, &["--no-watch"]);
            let outcome = load(&server, (1, RATIO_READS, 0), None, Protocol::Session, None);
            assert_eq!(outcome.failures, 0, "HTTP reads failed");
            let (http_p50, _) = summarize(outcome.reads);
            let ratio = http_p50 / stdio_p50;
            https.push(http_p50);
            stdios.push(stdio_p50);
            println!(
                "  round {}: HTTP p50 {:>10}  stdio p50 {:>10}  ratio {ratio:.2}",
                round + 1,
                human(http_p50),
                human(stdio_p50)
            );
            ratio
        })
        .collect();
    println!(
        "  medians of the rounds: HTTP p50 {}  stdio p50 {}  ratio {:.2} (target at most 1.5)",
        human(median(https)),
        human(median(stdios)),
        median(ratios)
    );
}

/// The `bash` clients' rate, all together, when reads are compared with and without
/// them: one both layouts reach here (at 80, the isolated shell's clients fell short).
const BASH_RATE: f64 = 60.0;

/// What commands cost the reads beside them: 64 read clients alone, then with 8 `bash`
/// clients at [`BASH_RATE`] calls per second in total, the shell isolated (the bundled
/// composition: each command's supervisor forks the shell's small process) and in the
/// host's process (each command forks the host).
fn shell_beside_reads() {
    let bundled = Scratch::with_bundled_manifest();
    let in_process = Scratch::with_bundled_manifest();
    let manifest = std::fs::read_to_string(bundled.path().join("cordis.yml")).expect("manifest");
    assert!(
        manifest.contains("  isolate: process\n"),
        "the bundled shell is isolated"
    );
    in_process.write("cordis.yml", &manifest.replace("  isolate: process\n", ""));
    for s in [&bundled, &in_process] {
        s.write("data.txt", &"0123456789abcdef".repeat(256));
    }
    let per_second = |o: &Outcome| o.reads.len() as f64 / o.wall.as_secs_f64();
    let alone = load(
        &Server::start(&bundled, &["--no-watch"]),
        (READ_CLIENTS, READS, 0),
        None,
        Protocol::Session,
        None,
    );
    let alone_rate = per_second(&alone);
    let alone_p50 = report(
        &format!("HTTP, {READ_CLIENTS} clients x {READS} reads, no bash"),
        alone,
        &[],
    );
    for (what, s) in [
        ("the shell isolated (bundled)", &bundled),
        ("the shell in the host's process", &in_process),
    ] {
        let outcome = load(
            &Server::start(s, &["--no-watch"]),
            (READ_CLIENTS, READS, BASH_CLIENTS),
            None,
            Protocol::Session,
            Some(BASH_RATE),
        );
        let (rate, bash_rate) = (
            per_second(&outcome),
            outcome.bash.len() as f64 / outcome.wall.as_secs_f64(),
        );
        report(
            &format!(
                "HTTP, {READ_CLIENTS} clients x {READS} reads + {BASH_CLIENTS} bash clients at {BASH_RATE} calls/s, {what}"
            ),
            outcome,
            &[("reads alone", alone_p50)],
        );
        println!(
            "  reads/s {rate:.0} against {alone_rate:.0} alone: ratio {:.3}; bash reached {bash_rate:.1} calls/s",
            rate / alone_rate
        );
    }
}

/// The read loads: stdio and HTTP baselines, many clients, the stateless protocol, reads
/// beside unpaced `bash` clients, and a hot reload under load.
fn reads() {
    let s = Scratch::with_bundled_manifest();
    s.write("data.txt", &"0123456789abcdef".repeat(256));
    let read_args = serde_json::json!({ "path": "data.txt" });

    // The baseline: one client over stdio, in this run.
    let mut stdio = StdioClient::start(&s);
    let samples = stdio.time_calls(STDIO_READS, "read", &read_args);
    stdio.finish();
    let (stdio_p50, stdio_p99) = summarize(samples);
    println!(
        "stdio baseline: read {STDIO_READS} calls, one client: p50 {}  p99 {}",
        human(stdio_p50),
        human(stdio_p99)
    );

    // Each load on a fresh server, so its memory per session is its own.
    let fresh = || Server::start(&s, &["--no-watch"]);
    let alone = load(&fresh(), (1, STDIO_READS, 0), None, Protocol::Session, None);
    let http_p50 = report(
        "HTTP, one client (the same reads)",
        alone,
        &[("stdio, one client", stdio_p50)],
    );
    // What the metrics add to each call (the server records every `tools/call` in
    // `/metrics`): the same recording, timed in this process, against the HTTP round trip.
    let recordings = 200_000u32;
    let timed = std::time::Instant::now();
    for _ in 0..recordings {
        cordis_cli::metrics::metrics().call("read").finish(None);
    }
    let per_call = timed.elapsed().as_nanos() as f64 / f64::from(recordings);
    println!(
        "metrics: recording one tool call costs {} ({:.3}% of the HTTP read p50 {}; target under 5%)",
        human(per_call),
        per_call / http_p50 * 100.0,
        human(http_p50)
    );
    // What traces add to each request: nothing but a load while no OTLP endpoint is set;
    // with one, a span with the MCP attributes, ended into the exporter's batch (exported
    // on its own thread, here to a port nobody listens on).
    let meta = serde_json::Map::new();
    let span = || {
        cordis_cli::traces::start(cordis_cli::traces::Request {
            method: "tools/call",
            tool: Some("read"),
            meta: &meta,
            id: &7,
            session: Some("0b9e5c1d-6a3f-4e2b-9c8d-7f1a2b3c4d5e"),
            protocol: Some("2025-11-25".into()),
        })
        .finish(None, None);
    };
    let spans = 200_000u32;
    let timed = std::time::Instant::now();
    for _ in 0..spans {
        span();
    }
    let off = timed.elapsed().as_nanos() as f64 / f64::from(spans);
    let _traces = cordis_cli::traces::export_to("http://127.0.0.1:9", "tcp").expect("traces");
    // Rounds smaller than the batch queue (2,048 spans), so none is dropped unrecorded,
    // with time between for the exporter to empty it; the median round.
    let rounds: Vec<f64> = (0..7)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(300));
            let on_spans = 1_500u32;
            let timed = std::time::Instant::now();
            for _ in 0..on_spans {
                span();
            }
            timed.elapsed().as_nanos() as f64 / f64::from(on_spans)
        })
        .collect();
    let on = median(rounds);
    println!(
        "traces: a request's span costs {} with no endpoint ({:.3}% of the HTTP read p50) and {} exporting ({:.3}%; target under 5%)",
        human(off),
        off / http_p50 * 100.0,
        human(on),
        on / http_p50 * 100.0,
    );
    drop(_traces);
    oauth_cost(http_p50);
    let baselines = [
        ("stdio, one client", stdio_p50),
        ("HTTP, one client", http_p50),
    ];
    let reads_only = load(
        &fresh(),
        (READ_CLIENTS, READS, 0),
        None,
        Protocol::Session,
        None,
    );
    let many_p50 = report(
        &format!("HTTP, {READ_CLIENTS} clients x {READS} reads, no bash"),
        reads_only,
        &baselines,
    );
    // The stateless protocol against the session protocol, in this run.
    let stateless_alone = load(
        &fresh(),
        (1, STDIO_READS, 0),
        None,
        Protocol::Stateless,
        None,
    );
    report(
        "HTTP stateless (2026-07-28), one client (the same reads)",
        stateless_alone,
        &[
            ("HTTP session, one client", http_p50),
            ("stdio, one client", stdio_p50),
        ],
    );
    let stateless_many = load(
        &fresh(),
        (READ_CLIENTS, READS, 0),
        None,
        Protocol::Stateless,
        None,
    );
    report(
        &format!("HTTP stateless (2026-07-28), {READ_CLIENTS} clients x {READS} reads"),
        stateless_many,
        &[(&format!("HTTP session, {READ_CLIENTS} clients"), many_p50)],
    );
    let steady = load(
        &fresh(),
        (READ_CLIENTS, READS, BASH_CLIENTS),
        None,
        Protocol::Session,
        None,
    );
    report(
        &format!("HTTP, {READ_CLIENTS} clients x {READS} reads + {BASH_CLIENTS} bash clients"),
        steady,
        &baselines,
    );

    // The same with `dsh-tool-fs` (it serves `read`) replaced every second.
    std::fs::create_dir_all(s.path().join("plugins")).expect("plugins dir");
    let source = library("dsh-tool-fs");
    let target = s
        .path()
        .join("plugins")
        .join(source.file_name().expect("a file name"));
    std::fs::copy(&source, &target).expect("copy the library");
    let server = Server::start(&s, &["--plugin-path", "plugins"]);
    let reloading = load(
        &server,
        (READ_CLIENTS, READS, BASH_CLIENTS),
        Some((&source, &target)),
        Protocol::Session,
        None,
    );
    drop(server);
    report(
        "the same, dsh-tool-fs hot-reloaded every second",
        reloading,
        &baselines,
    );
}
