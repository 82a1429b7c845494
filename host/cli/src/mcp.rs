//! The MCP server front-end: serves the composition's tools to a client over stdio (or,
//! through [`crate::http`], to many over Streamable HTTP), and asks that client to approve
//! escalations.
//!
//! One connection (over HTTP: one MCP session) is one cordis session, settled at its first
//! call: rooted at the client's first root when the client offers roots and that root lies
//! within an allowed directory, else at the fallback directory; it never moves after.
//! Every `tools/call` gets a fresh call id and runs on a
//! blocking thread (plugin code may block for a long time, e.g. a shell command or an
//! approval). When the tool asks the host's `approval` service, the request is routed by
//! session to this connection and by call id to the `tools/call` that caused it:
//!
//! - on a handshake-era connection (`initialize`) the server sends `elicitation/create`
//!   while the call is in flight;
//! - on a 2026-07-28 connection (`server/discover`, no server-to-client requests) the call
//!   answers `input_required` with an elicitation and a sealed `requestState`; the tool stays
//!   parked until the client retries the same call with its answer. The state is
//!   HMAC-sealed with a per-process random key and bound to the session, the tool name and
//!   the arguments, and the parked approval is removed when answered, so an answer can be
//!   neither forged nor replayed, and is only ever consumed by the call that asked.
//!
//! Without the client's elicitation capability the answer is `unavailable`.

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc as std_mpsc, Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use cordis_sdk::host::{ApprovalOutcome, ApprovalRequest};
use cordis_sdk::{CallContext, SessionInfo, ToolResult};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, DiscoverResult,
    ElicitRequest, ElicitRequestParams, ElicitResult, ElicitationAction, ElicitationSchema,
    Implementation, InitializeRequestParams, InitializeResult, InputRequest, InputRequests,
    InputRequiredResult, JsonObject, ListToolsResult, PaginatedRequestParams,
    ProgressNotificationParam, ProgressToken, ProtocolVersion, RequestStateCodec, SealOptions,
    ServerCapabilities, ServerConfig, SubscriptionFilter, Tool, ToolAnnotations,
};
use rmcp::service::{
    NotificationContext, RequestContext, RoleServer, SubscriptionContext, SubscriptionSink,
};
use rmcp::{ErrorData, Peer, ServerHandler, ServiceExt};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, BufReader};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use cordis_engine::approval::Asker;

pub(crate) mod handles;
use cordis_engine::registry::UnknownTool;
use cordis_engine::runtime::Runtime;

/// How long a parked approval waits for the client's retry before it counts as cancelled.
const PARK_TTL: Duration = Duration::from_secs(600);

/// How long cancelled calls have at shutdown to send their answers.
const ANSWER_GRACE: Duration = Duration::from_secs(3);

/// The bounds of how often a client with a call in flight is pinged over HTTP (a third of
/// the idle timeout); it has as long to answer.
const MIN_PING_EVERY: Duration = Duration::from_secs(1);
const MAX_PING_EVERY: Duration = Duration::from_secs(60);

/// How often a call with a progress token reports to the client.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);

/// The key under which the approval elicitation travels in `inputRequests`.
const APPROVAL_INPUT: &str = "approval";

/// Which session an MCP connection works in.
#[derive(Clone, Debug, Default)]
pub struct McpOptions {
    /// An existing session to resume (an error when unknown); `None`: a new session.
    pub session: Option<String>,
    /// The root of a new session when the client names none (or none that is allowed);
    /// `None`: the process's current directory.
    pub cwd: Option<PathBuf>,
    /// Where a client's root may lie (each with everything beneath it); empty: only the
    /// fallback root (`cwd`).
    pub allow_roots: Vec<PathBuf>,
}

/// Tells connected clients that the tool list changed (`notifications/tools/list_changed`).
/// Cheap to clone; callable from any thread, before, during or after serving.
#[derive(Clone)]
pub struct ToolListNotifier {
    tx: Arc<watch::Sender<u64>>,
}

impl Default for ToolListNotifier {
    fn default() -> Self {
        ToolListNotifier {
            tx: Arc::new(watch::channel(0).0),
        }
    }
}

impl ToolListNotifier {
    /// Notifies every connection served with this notifier.
    pub fn notify_tools_changed(&self) {
        self.tx.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// Where new sessions are rooted: the client's first root when it lies within an allowed
/// directory, else the fallback.
#[derive(Clone, Debug)]
pub(crate) struct Rooting {
    fallback: PathBuf,
    allowed: Vec<PathBuf>,
}

impl Rooting {
    pub(crate) fn new(options: &McpOptions) -> anyhow::Result<Self> {
        let fallback = match &options.cwd {
            Some(cwd) => cwd.clone(),
            None => std::env::current_dir().context("cannot read the current directory")?,
        };
        let allowed = if options.allow_roots.is_empty() {
            vec![dsh_sandbox::canonical_path(&fallback).with_context(|| {
                format!("the session root {} does not exist", fallback.display())
            })?]
        } else {
            options
                .allow_roots
                .iter()
                .map(|dir| {
                    let canonical = dsh_sandbox::canonical_path(dir).ok().filter(|d| d.is_dir());
                    canonical.with_context(|| {
                        format!(
                            "--allow-root {}: not an existing directory; pass a directory clients may root their sessions in",
                            dir.display()
                        )
                    })
                })
                .collect::<anyhow::Result<_>>()?
        };
        Ok(Rooting { fallback, allowed })
    }

    /// The root for a client that listed `roots` (`Err`: why it listed none), and why.
    fn choose(&self, roots: Result<Vec<String>, String>) -> (PathBuf, String) {
        let fallback = |why: String| {
            (
                self.fallback.clone(),
                format!(
                    "{why}; the session is rooted at {}",
                    self.fallback.display()
                ),
            )
        };
        let first = match roots {
            Ok(roots) => match roots.into_iter().next() {
                Some(first) => first,
                None => return fallback("the client listed no roots".into()),
            },
            Err(why) => return fallback(why),
        };
        let path = match url::Url::parse(&first)
            .ok()
            .filter(|u| u.scheme() == "file")
        {
            Some(url) => url.to_file_path().ok(),
            None => None,
        };
        let Some(path) = path else {
            return fallback(format!("the client's first root {first} is not a file URI"));
        };
        let canonical = match dsh_sandbox::canonical_path(&path) {
            Ok(c) if c.is_dir() => c,
            _ => {
                return fallback(format!(
                    "the client's first root {} is not an existing directory",
                    path.display()
                ))
            }
        };
        if !self
            .allowed
            .iter()
            .any(|a| dsh_sandbox::is_within(&canonical, a))
        {
            return fallback(format!(
                "the client's first root {} is outside the allowed roots ({}; widen with --allow-root)",
                canonical.display(),
                self.allowed
                    .iter()
                    .map(|a| a.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        let why = format!(
            "the session is rooted at the client's first root {}",
            canonical.display()
        );
        (canonical, why)
    }
}

/// What every connection of one server shares: the runtime, how sessions are rooted, the
/// peers and subscriptions to tell about tool-list changes, and the calls in flight (for a
/// graceful shutdown).
pub(crate) struct Hub {
    runtime: Arc<Runtime>,
    rooting: Rooting,
    /// A session to resume (stdio only).
    resume: Option<String>,
    /// Over HTTP (only), how long a session lasts without requests.
    idle: Option<Duration>,
    /// Over HTTP (only), how often a client with a call in flight is pinged (see
    /// [`Liveness`]).
    ping_every: Option<Duration>,
    /// The sessions of 2026-07-28 clients over HTTP.
    pub(crate) handles: handles::Handles,
    codec: RequestStateCodec,
    call_prefix: String,
    next: AtomicU64,
    sinks: Mutex<Vec<SubscriptionSink>>,
    /// Live connections: to tell those that completed the handshake about tool-list
    /// changes, and to cancel their calls at shutdown.
    live: Mutex<HashMap<u64, std::sync::Weak<Shared>>>,
    /// HTTP connections by MCP session id, to end them at once on `DELETE`.
    by_mcp_session: Mutex<HashMap<String, std::sync::Weak<Shared>>>,
    /// Set when the server stops taking calls.
    closing: std::sync::atomic::AtomicBool,
    in_flight: watch::Sender<usize>,
}

impl Hub {
    /// The hub of a stdio server (`idle_timeout: None`) or of an HTTP server whose
    /// sessions end after `idle_timeout` without requests.
    pub(crate) fn new(
        runtime: Arc<Runtime>,
        options: &McpOptions,
        idle_timeout: Option<Duration>,
    ) -> anyhow::Result<Arc<Self>> {
        let key = random_bytes(32)?;
        let codec = RequestStateCodec::try_new(key)
            .map_err(|e| anyhow::anyhow!("cannot set up the request-state key: {e}"))?;
        let prefix = hex(&random_bytes(6)?);
        Ok(Arc::new(Hub {
            runtime,
            rooting: Rooting::new(options)?,
            resume: options.session.clone(),
            idle: idle_timeout,
            ping_every: idle_timeout.map(|idle| (idle / 3).clamp(MIN_PING_EVERY, MAX_PING_EVERY)),
            handles: handles::Handles::default(),
            codec,
            call_prefix: format!("mcp-{prefix}"),
            next: AtomicU64::new(1),
            sinks: Mutex::default(),
            live: Mutex::default(),
            by_mcp_session: Mutex::default(),
            closing: Default::default(),
            in_flight: watch::channel(0).0,
        }))
    }

    fn next_id(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// Forwards tool-list changes to every connection until the hub is dropped.
    pub(crate) fn forward_tool_changes(
        self: &Arc<Self>,
        notifier: &ToolListNotifier,
    ) -> JoinHandle<()> {
        let mut changes = notifier.tx.subscribe();
        let hub = Arc::downgrade(self);
        tokio::spawn(async move {
            while changes.changed().await.is_ok() {
                let Some(hub) = hub.upgrade() else { break };
                let peers: Vec<Peer<RoleServer>> = lock(&hub.live)
                    .values()
                    .filter_map(|w| w.upgrade())
                    .filter_map(|shared| shared.peer.get().cloned())
                    .collect();
                let sinks: Vec<SubscriptionSink> = lock(&hub.sinks).clone();
                drop(hub);
                tracing::info!(
                    connections = peers.len() + sinks.len(),
                    "the tool list changed; telling every client"
                );
                for peer in peers {
                    if let Err(e) = peer.notify_tool_list_changed().await {
                        tracing::debug!("tools/list_changed not delivered: {e}");
                    }
                }
                for sink in sinks {
                    if let Err(e) = sink.notify_tool_list_changed().await {
                        tracing::debug!("tools/list_changed not delivered to a subscription: {e}");
                    }
                }
            }
        })
    }

    /// Whether this hub serves HTTP, where a cordis session is an MCP session (or, for a
    /// 2026-07-28 client, a handle).
    fn over_http(&self) -> bool {
        self.ping_every.is_some()
    }

    /// How long an HTTP session lasts without requests.
    fn idle_timeout(&self) -> Duration {
        self.idle.unwrap_or(Duration::MAX)
    }

    /// The MCP connections alive (over HTTP: the MCP sessions).
    pub(crate) fn connections(&self) -> usize {
        lock(&self.live).len()
    }

    /// Whether the server stopped taking calls.
    pub(crate) fn is_closing(&self) -> bool {
        self.closing.load(Ordering::SeqCst)
    }

    /// The client ended MCP session `id` (HTTP `DELETE`): its calls are cancelled now (a
    /// running command is killed) rather than when the transport has drained.
    pub(crate) fn end_mcp_session(&self, id: &str) {
        let shared = lock(&self.by_mcp_session)
            .remove(id)
            .and_then(|w| w.upgrade());
        if let Some(shared) = shared {
            let cancelled = shared.cancel_calls();
            if cancelled > 0 {
                tracing::info!(
                    calls = cancelled,
                    "the client ended its session; cancelled its calls in flight"
                );
            }
        }
    }

    /// Stops taking calls, waits until the calls in flight finish or `give_up` resolves,
    /// then cancels what remains (a running command is killed).
    pub(crate) async fn drain(&self, give_up: impl std::future::Future<Output = ()>) {
        self.closing.store(true, Ordering::SeqCst);
        let mut count = self.in_flight.subscribe();
        let running = *count.borrow();
        if running > 0 {
            tracing::info!(calls = running, "waiting for the calls in flight");
        }
        tokio::select! {
            _ = count.wait_for(|n| *n == 0) => {}
            () = give_up => {}
        }
        let live: Vec<Arc<Shared>> = lock(&self.live)
            .values()
            .filter_map(|w| w.upgrade())
            .collect();
        let cancelled: usize = live.iter().map(|shared| shared.cancel_calls()).sum();
        if cancelled > 0 {
            tracing::warn!(
                calls = cancelled,
                "cancelled the calls still running at shutdown"
            );
            // Their answers (cancelled results) go out before the connections close.
            let _ = tokio::time::timeout(ANSWER_GRACE, count.wait_for(|n| *n == 0)).await;
        }
    }
}

/// Counts a call in flight while it lives.
struct InFlight<'a>(&'a watch::Sender<usize>);

impl<'a> InFlight<'a> {
    fn enter(counter: &'a watch::Sender<usize>) -> Self {
        counter.send_modify(|n| *n += 1);
        InFlight(counter)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// A shutdown request: resolves when the server is to stop taking calls, with the future
/// after which the calls still in flight are cancelled.
pub trait Shutdown: std::future::Future<Output = Self::GiveUp> {
    /// Resolves when the calls in flight have had their time.
    type GiveUp: std::future::Future<Output = ()>;
}

impl<F, G> Shutdown for F
where
    F: std::future::Future<Output = G>,
    G: std::future::Future<Output = ()>,
{
    type GiveUp = G;
}

/// Never shuts down.
fn never() -> impl Shutdown {
    std::future::pending::<std::future::Ready<()>>()
}

/// Serves the runtime's tools over stdin/stdout until the client disconnects.
pub async fn serve_stdio(runtime: Arc<Runtime>, options: McpOptions) -> anyhow::Result<()> {
    serve_stdio_with(runtime, options, ToolListNotifier::default(), never()).await
}

/// [`serve_stdio`], with a notifier the host keeps to announce tool-list changes, until the
/// client disconnects or `shutdown` resolves (then the calls in flight may finish until
/// its give-up future resolves, and are cancelled after).
pub async fn serve_stdio_with(
    runtime: Arc<Runtime>,
    options: McpOptions,
    notifier: ToolListNotifier,
    shutdown: impl Shutdown,
) -> anyhow::Result<()> {
    serve_connection(runtime, options, notifier, protocol_stdio, shutdown).await
}

/// Serves one connection over `input` and `output` (newline-delimited JSON-RPC) exactly as
/// [`serve_stdio_with`] serves stdio, for clients in the same process.
pub async fn serve_io<R, W>(
    runtime: Arc<Runtime>,
    options: McpOptions,
    notifier: ToolListNotifier,
    input: R,
    output: W,
) -> anyhow::Result<()>
where
    R: AsyncRead + Send + Unpin + 'static,
    W: AsyncWrite + Send + Unpin + 'static,
{
    serve_connection(
        runtime,
        options,
        notifier,
        move || Ok((input, output)),
        never(),
    )
    .await
}

/// One connection. A session to resume is opened before `io` is set up; a new one when the
/// first call needs it (rooted where the client says, see [`Rooting`]).
async fn serve_connection<R, W>(
    runtime: Arc<Runtime>,
    options: McpOptions,
    notifier: ToolListNotifier,
    io: impl FnOnce() -> anyhow::Result<(R, W)>,
    shutdown: impl Shutdown,
) -> anyhow::Result<()>
where
    R: AsyncRead + Send + Unpin + 'static,
    W: AsyncWrite + Send + Unpin + 'static,
{
    let hub = Hub::new(runtime, &options, None)?;
    let server = McpServer::attach(hub.clone());
    if let Some(id) = &hub.resume {
        let session = hub
            .runtime
            .host
            .sessions
            .get(id)
            .map_err(|e| anyhow::anyhow!("{e}; omit --session to start a new session"))?;
        server.adopt(session, "resuming the session".into());
    }
    let forward = hub.forward_tool_changes(&notifier);
    let result = match io() {
        Ok(io) => serve(server, &hub, io, shutdown).await,
        Err(e) => Err(e),
    };
    forward.abort();
    result
}

/// The protocol's input and output streams.
type Input = Box<dyn AsyncRead + Send + Unpin>;
type Output = Box<dyn AsyncWrite + Send + Unpin>;

/// The protocol's stdin/stdout. The real stdout is kept on a private descriptor for MCP
/// and descriptor 1 is pointed at stderr, so a stray print from a plugin (or anything
/// else in the process) lands in the log instead of corrupting the MCP stream. Pipes (what
/// MCP clients give a server) are driven by the async runtime's poller; anything else
/// (a terminal, a file) by tokio's blocking stdio threads.
fn protocol_stdio() -> anyhow::Result<(Input, Output)> {
    use std::os::fd::FromRawFd;
    // SAFETY: plain descriptor operations on 0, 1 and 2; each duplicate is owned by a File.
    let dup = |fd: i32, what: &str| {
        let copy = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
        if copy < 0 {
            anyhow::bail!(
                "cannot duplicate {what} for the MCP stream: {}",
                std::io::Error::last_os_error()
            );
        }
        Ok(unsafe { std::fs::File::from_raw_fd(copy) })
    };
    let protocol = dup(1, "stdout")?;
    if unsafe { libc::dup2(2, 1) } < 0 {
        anyhow::bail!(
            "cannot point stdout at stderr: {}",
            std::io::Error::last_os_error()
        );
    }
    let is_pipe = |f: &std::fs::File| {
        use std::os::unix::fs::FileTypeExt;
        f.metadata().is_ok_and(|m| m.file_type().is_fifo())
    };
    let input: Input = match dup(0, "stdin")? {
        f if is_pipe(&f) => Box::new(tokio::net::unix::pipe::Receiver::from_file(f)?),
        _ => Box::new(tokio::io::stdin()),
    };
    let output: Output = if is_pipe(&protocol) {
        Box::new(tokio::net::unix::pipe::Sender::from_file(protocol)?)
    } else {
        Box::new(tokio::fs::File::from_std(protocol))
    };
    Ok((input, output))
}

async fn serve<R, W>(
    server: McpServer,
    hub: &Hub,
    io: (R, W),
    shutdown: impl Shutdown,
) -> anyhow::Result<()>
where
    R: AsyncRead + Send + Unpin + 'static,
    W: AsyncWrite + Send + Unpin + 'static,
{
    let shared = server.shared.clone();
    let (ended, input_ended) = tokio::sync::oneshot::channel();
    let io = (
        EndOfInput {
            inner: io.0,
            ended: Some(ended),
        },
        io.1,
    );
    tokio::pin!(shutdown);
    let started = tokio::select! {
        started = server.serve(io) => started,
        // Nothing runs before the handshake: nothing to wait for.
        _ = &mut shutdown => return Ok(()),
    };
    let running = match started {
        Ok(r) => r,
        Err(rmcp::service::ServerInitializeError::ConnectionClosed(_)) => {
            // The client went away before initializing (or stdin was empty): nothing to serve.
            tracing::info!("the input closed before an MCP client initialized");
            return Ok(());
        }
        Err(e) => return Err(anyhow::Error::new(e).context("failed to start the mcp server")),
    };
    let waiting = running.waiting();
    tokio::pin!(waiting);
    let quit = tokio::select! {
        quit = &mut waiting => Some(quit),
        Ok(()) = input_ended => None,
        give_up = &mut shutdown => {
            hub.drain(give_up).await;
            return Ok(());
        }
    };
    match quit {
        Some(quit) => {
            quit.context("the mcp connection failed")?;
        }
        None => {
            // The client is gone: nobody will read an answer, so every call in flight is
            // cancelled (a running command is killed) instead of being waited for.
            let cancelled = shared.cancel_calls();
            tracing::info!(
                calls = cancelled,
                "the client closed its input; cancelling the calls in flight"
            );
        }
    }
    Ok(())
}

/// The client's input, telling `ended` when it reaches end of file. rmcp keeps serving the
/// calls in flight after its input ends; the connection instead ends at once.
struct EndOfInput<R> {
    inner: R,
    ended: Option<tokio::sync::oneshot::Sender<()>>,
}

impl<R: AsyncRead + Unpin> AsyncRead for EndOfInput<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        if let std::task::Poll::Ready(Ok(())) = &polled {
            if buf.filled().len() == before && buf.remaining() > 0 {
                if let Some(ended) = self.ended.take() {
                    let _ = ended.send(());
                }
            }
        }
        polled
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `bytes` as lowercase hexadecimal.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An approval request from a tool thread, waiting for its answer.
struct Ask {
    request: ApprovalRequest,
    answer: std_mpsc::SyncSender<ApprovalOutcome>,
}

impl Ask {
    fn answer(self, outcome: ApprovalOutcome) {
        let _ = self.answer.send(outcome);
    }
}

/// A close-on-exec pipe with `flags` (e.g. `O_NONBLOCK`): (read end, write end).
fn pipe(flags: i32) -> std::io::Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)> {
    use std::os::fd::FromRawFd;
    let mut fds = [-1; 2];
    // SAFETY: `fds` is a valid array of two descriptors for the kernel to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | flags) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned by nobody else.
    Ok(unsafe {
        (
            std::os::fd::OwnedFd::from_raw_fd(fds[0]),
            std::os::fd::OwnedFd::from_raw_fd(fds[1]),
        )
    })
}

/// What a tool thread hands back: its result and the model context right after it.
type Finished = (Result<ToolResult, UnknownTool>, String);

/// A call's progress reports, one JSON line each ([`cordis_sdk::Progress`]).
type Feed = tokio::io::Lines<BufReader<tokio::net::unix::pipe::Receiver>>;

/// A tool call in flight.
struct Running {
    call_id: String,
    /// The session it runs in.
    session: String,
    tool: String,
    join: JoinHandle<Finished>,
    asks: mpsc::UnboundedReceiver<Ask>,
    started: Instant,
    /// The tool's progress reports, while it may send any.
    feed: Option<Feed>,
    /// What it reported last (each field as last reported).
    reported: cordis_sdk::Progress,
}

/// The next report of `feed`; `None` at its end.
async fn next_line(feed: &mut Option<Feed>) -> Option<String> {
    match feed {
        Some(lines) => lines.next_line().await.ok().flatten(),
        None => None,
    }
}

/// Over HTTP, a session with a call in flight is not idle, and a client that went away
/// without ending its session (a dropped stream is not a cancellation) must still be
/// noticed: while a call runs, the client is pinged every `every` and must answer within
/// `every`. The pings keep the session from idling out; an unanswered one means the client
/// is gone.
struct Liveness {
    every: Duration,
    next: tokio::time::Instant,
    pinging: Option<std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send>>>,
}

impl Liveness {
    fn new(every: Option<Duration>) -> Option<Self> {
        every.map(|every| Liveness {
            every,
            next: tokio::time::Instant::now() + every,
            pinging: None,
        })
    }
}

/// Resolves when the client stopped answering pings (never without `liveness`). Dropping
/// it keeps a ping in flight for the next call.
async fn client_lost(liveness: &mut Option<Liveness>, peer: &Peer<RoleServer>) {
    let Some(live) = liveness else {
        return std::future::pending().await;
    };
    loop {
        match &mut live.pinging {
            None => {
                tokio::time::sleep_until(live.next).await;
                let (peer, every) = (peer.clone(), live.every);
                live.pinging = Some(Box::pin(async move {
                    let ping = rmcp::model::ServerRequest::PingRequest(Default::default());
                    matches!(
                        tokio::time::timeout(every, peer.send_request(ping)).await,
                        Ok(Ok(_))
                    )
                }));
            }
            Some(ping) => {
                let answered = ping.await;
                live.pinging = None;
                live.next = tokio::time::Instant::now() + live.every;
                if !answered {
                    return;
                }
            }
        }
    }
}

/// Tells the client how `running` is getting on: the seconds since it started (the
/// progress, always increasing) and what it is doing.
async fn report(
    context: &RequestContext<RoleServer>,
    token: Option<&ProgressToken>,
    running: &Running,
    doing: &str,
) {
    let Some(token) = token else { return };
    let elapsed = running.started.elapsed().as_secs_f64();
    let mut message = format!("{}: {doing} for {elapsed:.0} s", running.tool);
    if let Some(bytes) = running.reported.output_bytes {
        message.push_str(&format!(", {bytes} bytes of output"));
    }
    if let Some(note) = &running.reported.message {
        message.push_str(&format!("; {note}"));
    }
    let param =
        ProgressNotificationParam::new(token.clone(), elapsed.floor()).with_message(message);
    if let Err(e) = context.peer.notify_progress(param).await {
        tracing::debug!("progress not delivered: {e}");
    }
}

/// A call waiting for the client's retry with an approval answer.
struct Parked {
    running: Running,
    ask: Ask,
}

/// What a sealed `requestState` carries.
#[derive(Serialize, Deserialize)]
struct ParkState {
    park: u64,
    call: String,
    /// The session's handle, for a 2026-07-28 client over HTTP: its retry may name none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    handle: Option<String>,
}

/// One connection (on HTTP: one MCP session) and its cordis session.
struct Shared {
    hub: Arc<Hub>,
    /// The connection's id in the hub.
    id: u64,
    /// The cordis session, once the first call (or `--session`) settled it.
    session: tokio::sync::OnceCell<SessionInfo>,
    /// Per call id: where that call's approval requests go.
    calls: Mutex<HashMap<String, mpsc::UnboundedSender<Ask>>>,
    /// Per running call id: the write end of its cancel pipe. Removing it cancels the call
    /// (the tool sees end of file on `CallContext::cancel_fd`).
    cancels: Mutex<HashMap<String, std::os::fd::OwnedFd>>,
    parked: Mutex<HashMap<u64, Parked>>,
    /// The model context the client was last shown.
    shown: Mutex<String>,
    /// The client, once it completed the handshake (told about tool-list changes).
    peer: std::sync::OnceLock<Peer<RoleServer>>,
    /// The MCP session id (HTTP), once a request carried it.
    mcp_session: std::sync::OnceLock<String>,
    /// The handle of a 2026-07-28 client's session over HTTP ([`handles`]).
    handle: std::sync::OnceLock<String>,
}

impl Shared {
    /// Cancels every call of this connection in flight (the tools see end of file on their
    /// cancel descriptors; a running command is killed); how many there were.
    fn cancel_calls(&self) -> usize {
        std::mem::take(&mut *lock(&self.cancels)).len()
    }
}

impl Drop for Shared {
    /// The connection ended (on HTTP: `DELETE`, idle timeout or shutdown): its calls are
    /// cancelled (the cancel pipes close with the map) and its approvals unbound.
    fn drop(&mut self) {
        lock(&self.hub.live).remove(&self.id);
        if let Some(id) = self.mcp_session.get() {
            lock(&self.hub.by_mcp_session).remove(id);
        }
        let calls = lock(&self.cancels).len();
        if let Some(session) = self.session.get() {
            self.hub.runtime.host.approvals.unbind(&session.id);
            if self.hub.over_http() {
                tracing::info!(
                    session = %session.id,
                    cancelled = calls,
                    "mcp session ended"
                );
            }
        }
    }
}

/// The MCP handler of one connection.
pub(crate) struct McpServer {
    shared: Arc<Shared>,
}

/// `n` bytes from the kernel's random source.
pub(crate) fn random_bytes(n: usize) -> anyhow::Result<Vec<u8>> {
    use std::io::Read;
    let mut buf = vec![0u8; n];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .context("cannot read random bytes")?;
    Ok(buf)
}

impl McpServer {
    /// A handler for a new connection of `hub`; cheap (the HTTP transport makes one per
    /// session, and one per stateless request).
    pub(crate) fn attach(hub: Arc<Hub>) -> Self {
        let id = hub.next_id();
        let shared = Arc::new(Shared {
            hub,
            id,
            session: tokio::sync::OnceCell::new(),
            calls: Mutex::default(),
            cancels: Mutex::default(),
            parked: Mutex::default(),
            shown: Mutex::default(),
            peer: std::sync::OnceLock::new(),
            mcp_session: std::sync::OnceLock::new(),
            handle: std::sync::OnceLock::new(),
        });
        lock(&shared.hub.live).insert(id, Arc::downgrade(&shared));
        McpServer { shared }
    }

    /// Learns the MCP session id from a request's HTTP headers (not on the `initialize`
    /// request: its answer assigns the id).
    fn learn_mcp_session(&self, extensions: &rmcp::model::Extensions) {
        if self.shared.mcp_session.get().is_some() {
            return;
        }
        let id = extensions
            .get::<http::request::Parts>()
            .and_then(|p| p.headers.get("mcp-session-id"))
            .and_then(|v| v.to_str().ok());
        if let Some(id) = id {
            if self.shared.mcp_session.set(id.to_string()).is_ok() {
                lock(&self.shared.hub.by_mcp_session)
                    .insert(id.to_string(), Arc::downgrade(&self.shared));
            }
        }
    }

    fn runtime(&self) -> &Runtime {
        &self.shared.hub.runtime
    }

    /// Makes `session` (one to resume) this connection's session.
    fn adopt(&self, session: SessionInfo, why: String) {
        let session = self.bind(session, why);
        let _ = self.shared.session.set(session);
    }

    /// The connection's session: settled by the first call, rooted at the client's first
    /// root when it supports roots and that root is allowed.
    async fn session(&self, context: &RequestContext<RoleServer>) -> Result<SessionInfo, String> {
        self.shared
            .session
            .get_or_try_init(|| async {
                let roots = client_roots(context).await;
                let (root, why) = self.shared.hub.rooting.choose(roots);
                let session = self.runtime().host.sessions.create(&root).map_err(|e| {
                    format!(
                        "failed to create a session rooted at {}: {e}",
                        root.display()
                    )
                })?;
                Ok::<_, String>(self.bind(session, why))
            })
            .await
            .cloned()
    }

    /// Binds `session` for approvals (asked through this connection), and says so.
    fn bind(&self, session: SessionInfo, why: String) -> SessionInfo {
        tracing::info!(session = %session.id, cwd = %session.cwd.display(), "mcp session: {why}");
        self.runtime()
            .host
            .approvals
            .bind(&session.id, self.asker());
        session
    }

    /// The asker bound to this connection's session: hands the request to the `tools/call`
    /// whose call id asked, and blocks (on the tool's thread) until it is answered.
    fn asker(&self) -> Asker {
        let shared = Arc::downgrade(&self.shared);
        Arc::new(move |request: &ApprovalRequest| {
            let Some(shared) = shared.upgrade() else {
                return ApprovalOutcome::Unavailable;
            };
            let Some(to_call) = lock(&shared.calls).get(&request.call_id).cloned() else {
                return ApprovalOutcome::Unavailable;
            };
            drop(shared);
            let (tx, rx) = std_mpsc::sync_channel(1);
            let ask = Ask {
                request: request.clone(),
                answer: tx,
            };
            if to_call.send(ask).is_err() {
                return ApprovalOutcome::Unavailable;
            }
            rx.recv().unwrap_or(ApprovalOutcome::Unavailable)
        })
    }

    /// The model context of this connection's session (the default one before it starts).
    fn context_now(&self) -> String {
        let session = self.shared.session.get().map(|s| s.id.as_str());
        self.runtime().model_context(session)
    }

    /// Records the context sent with `initialize`/`discover` as shown.
    fn mark_shown(&self, instructions: Option<&str>) {
        *lock(&self.shared.shown) = instructions.unwrap_or_default().to_string();
    }

    fn next_id(&self) -> u64 {
        self.shared.hub.next_id()
    }

    fn start_call(
        &self,
        session: &SessionInfo,
        tool: String,
        args: serde_json::Value,
        with_progress: bool,
    ) -> Running {
        let call_id = format!("{}-{}", self.shared.hub.call_prefix, self.next_id());
        let (tx, asks) = mpsc::unbounded_channel();
        lock(&self.shared.calls).insert(call_id.clone(), tx);
        // The read end lives as long as the call; the write end as long as nobody cancels.
        let cancel_rd = match pipe(0) {
            Ok((rd, wr)) => {
                lock(&self.shared.cancels).insert(call_id.clone(), wr);
                Some(rd)
            }
            Err(e) => {
                tracing::warn!("cannot create a cancel pipe; this call cannot be cancelled: {e}");
                None
            }
        };
        // The tool reports on the write end while it runs; it closes when the call ends.
        let (feed, progress_wr) = match with_progress.then(|| pipe(libc::O_NONBLOCK)) {
            Some(Ok((rd, wr))) => match tokio::net::unix::pipe::Receiver::from_owned_fd(rd) {
                Ok(rd) => (Some(BufReader::new(rd).lines()), Some(wr)),
                Err(e) => {
                    tracing::warn!("cannot watch a progress pipe: {e}");
                    (None, None)
                }
            },
            Some(Err(e)) => {
                tracing::warn!("cannot create a progress pipe: {e}");
                (None, None)
            }
            None => (None, None),
        };
        let call = CallContext {
            session: session.clone(),
            call_id: call_id.clone(),
            cancel_fd: cancel_rd.as_ref().map(|fd| fd.as_raw_fd()),
            progress_fd: progress_wr.as_ref().map(|fd| fd.as_raw_fd()),
        };
        let runtime = self.shared.hub.runtime.clone();
        let shared = Arc::downgrade(&self.shared);
        let name = tool.clone();
        let join = tokio::task::spawn_blocking(move || {
            let result = runtime.call_tool(&name, &call, &args);
            let context = runtime.model_context(Some(&call.session.id));
            if let Some(shared) = shared.upgrade() {
                lock(&shared.cancels).remove(&call.call_id);
            }
            drop(cancel_rd);
            drop(progress_wr);
            (result, context)
        });
        Running {
            call_id,
            session: session.id.clone(),
            tool,
            join,
            asks,
            started: Instant::now(),
            feed,
            reported: cordis_sdk::Progress::default(),
        }
    }

    /// Drives a call to its result, answering its approval requests on the way; on a
    /// 2026-07-28 connection an approval parks the call and returns `input_required`. With
    /// a progress token, the client hears how the call is getting on every
    /// [`PROGRESS_EVERY`] (also while an approval is pending).
    async fn drive(
        &self,
        mut running: Running,
        args: &serde_json::Value,
        context: &RequestContext<RoleServer>,
    ) -> CallToolResponse {
        let token = context.meta.get_progress_token();
        // A 2026-07-28 client is never sent a request (a ping included); its call is
        // cancelled when it drops the request's stream.
        let mut liveness =
            Liveness::new(self.shared.hub.ping_every.filter(|_| !is_modern(context)));
        let mut ticker =
            tokio::time::interval_at(tokio::time::Instant::now() + PROGRESS_EVERY, PROGRESS_EVERY);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                finished = &mut running.join => {
                    lock(&self.shared.calls).remove(&running.call_id);
                    return self.finish(&running.tool, finished).into();
                }
                Some(ask) = running.asks.recv() => {
                    if !elicitation_supported(context) {
                        ask.answer(ApprovalOutcome::Unavailable);
                    } else if is_modern(context) {
                        match self.park(running, ask, args) {
                            Ok(input) => return input.into(),
                            Err(text) => return error_result(text),
                        }
                    } else {
                        let outcome = {
                            let asking = elicit_now(&context.peer, &ask.request);
                            tokio::pin!(asking);
                            loop {
                                tokio::select! {
                                    outcome = &mut asking => break outcome,
                                    _ = ticker.tick(), if token.is_some() => {
                                        report(context, token.as_ref(), &running, "waiting for approval").await;
                                    }
                                    () = client_lost(&mut liveness, &context.peer) => {
                                        break ApprovalOutcome::Cancelled;
                                    }
                                }
                            }
                        };
                        ask.answer(outcome);
                    }
                }
                line = next_line(&mut running.feed), if running.feed.is_some() => match line {
                    Some(line) => {
                        if let Ok(p) = serde_json::from_str::<cordis_sdk::Progress>(&line) {
                            let last = &mut running.reported;
                            last.output_bytes = p.output_bytes.or(last.output_bytes);
                            last.message = p.message.or(last.message.take());
                        }
                    }
                    None => running.feed = None,
                },
                _ = ticker.tick(), if token.is_some() => {
                    report(context, token.as_ref(), &running, "running").await;
                }
                _ = context.ct.cancelled() => {
                    self.detach(running, ApprovalOutcome::Cancelled);
                    return error_result("the call was cancelled by the client".into());
                }
                () = client_lost(&mut liveness, &context.peer) => {
                    tracing::info!(call = %running.call_id, "the client stopped answering pings; cancelling its call");
                    self.detach(running, ApprovalOutcome::Cancelled);
                    return error_result("the client stopped answering; the call was cancelled".into());
                }
            }
        }
    }

    /// Lets a call finish in the background, answering its approvals with `outcome`; a
    /// cancelled call is told so (a running command is killed).
    fn detach(&self, mut running: Running, outcome: ApprovalOutcome) {
        if outcome == ApprovalOutcome::Cancelled {
            lock(&self.shared.cancels).remove(&running.call_id);
        }
        let shared = self.shared.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = &mut running.join => break,
                    Some(ask) = running.asks.recv() => ask.answer(outcome),
                }
            }
            lock(&shared.calls).remove(&running.call_id);
        });
    }

    /// What a parked call's state is bound to: the session, the tool and its arguments.
    /// A 2026-07-28 session over HTTP is named by the handle sealed inside the state
    /// instead, since its client's retry may not name it.
    fn binding(&self, session: &str, tool: &str, args: &serde_json::Value) -> Vec<u8> {
        match self.shared.handle.get() {
            Some(_) => stateless_binding(tool, args),
            None => format!("{session}\0{tool}\0{args}").into_bytes(),
        }
    }

    fn park(
        &self,
        running: Running,
        ask: Ask,
        args: &serde_json::Value,
    ) -> Result<InputRequiredResult, String> {
        let elicitation = match approval_elicitation(&ask.request) {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!("cannot build the approval elicitation: {e}");
                ask.answer(ApprovalOutcome::Unavailable);
                self.detach(running, ApprovalOutcome::Unavailable);
                return Err(format!("approval could not be requested: {e}"));
            }
        };
        let park = self.next_id();
        let binding = self.binding(&running.session, &running.tool, args);
        let state = self.shared.hub.codec.seal_json_with(
            &ParkState {
                park,
                call: running.call_id.clone(),
                handle: self.shared.handle.get().cloned(),
            },
            &SealOptions::new().associated_data(&binding).ttl(PARK_TTL),
        );
        let state = match state {
            Ok(s) => s,
            Err(e) => {
                ask.answer(ApprovalOutcome::Unavailable);
                self.detach(running, ApprovalOutcome::Unavailable);
                return Err(format!("approval could not be requested: {e}"));
            }
        };
        lock(&self.shared.parked).insert(park, Parked { running, ask });
        // Weak: a parked call does not keep its connection alive.
        let me = Arc::downgrade(&self.shared);
        tokio::spawn(async move {
            tokio::time::sleep(PARK_TTL).await;
            let Some(shared) = me.upgrade() else { return };
            let me = McpServer { shared };
            let expired = lock(&me.shared.parked).remove(&park);
            if let Some(p) = expired {
                p.ask.answer(ApprovalOutcome::Cancelled);
                me.detach(p.running, ApprovalOutcome::Cancelled);
            }
        });
        let mut requests = InputRequests::new();
        requests.insert(APPROVAL_INPUT.to_string(), elicitation);
        Ok(InputRequiredResult::new(Some(requests), Some(state)))
    }

    /// A retry carrying `requestState`: answer the parked approval it names and go on.
    async fn resume(
        &self,
        session: &SessionInfo,
        request: &CallToolRequestParams,
        state: &str,
        args: &serde_json::Value,
        context: &RequestContext<RoleServer>,
    ) -> CallToolResponse {
        let binding = self.binding(&session.id, &request.name, args);
        let opened: Result<ParkState, _> = self.shared.hub.codec.open_json_with(state, &binding);
        let state = match opened {
            Ok(s) if s.handle.as_ref() == self.shared.handle.get() => s,
            Ok(_) => {
                return error_result(
                    "this approval answer does not belong to this call (another session's); call the tool again"
                        .to_string(),
                )
            }
            Err(e) => {
                return error_result(format!(
                    "this approval answer does not belong to this call ({e}); call the tool again"
                ))
            }
        };
        let parked = {
            let mut parked = lock(&self.shared.parked);
            match parked.get(&state.park) {
                Some(p) if p.running.call_id == state.call => parked.remove(&state.park),
                _ => None,
            }
        };
        let Some(Parked { running, ask }) = parked else {
            return error_result(
                "no approval is pending for this call (already answered or expired); call the tool again"
                    .to_string(),
            );
        };
        let outcome = request
            .input_responses
            .as_ref()
            .and_then(|r| r.get(APPROVAL_INPUT))
            .and_then(|v| serde_json::from_value::<ElicitResult>(v.clone()).ok())
            .map(|r| outcome_of(&r))
            .unwrap_or(ApprovalOutcome::Unavailable);
        ask.answer(outcome);
        self.drive(running, args, context).await
    }

    /// The tool's result as MCP content, with the model context when it changed.
    fn finish(
        &self,
        tool: &str,
        finished: Result<Finished, tokio::task::JoinError>,
    ) -> CallToolResult {
        let (is_error, text, structured, context) = match finished {
            Ok((Ok(r), context)) => (r.is_error, r.text, r.structured, Some(context)),
            Ok((Err(unknown), context)) => (true, unknown.to_string(), None, Some(context)),
            Err(e) => (true, format!("tool `{tool}` failed: {e}"), None, None),
        };
        let mut content = vec![ContentBlock::text(text)];
        if let Some(context) = context {
            let mut shown = lock(&self.shared.shown);
            if *shown != context {
                if !context.is_empty() {
                    content.push(ContentBlock::text(format!("[model context]\n{context}")));
                }
                *shown = context;
            }
        }
        let mut result = if is_error {
            CallToolResult::error(content)
        } else {
            CallToolResult::success(content)
        };
        result.structured_content = structured;
        result
    }
}

/// [`McpServer::binding`] of a 2026-07-28 session over HTTP.
fn stateless_binding(tool: &str, args: &serde_json::Value) -> Vec<u8> {
    format!("stateless\0{tool}\0{args}").into_bytes()
}

fn error_result(text: String) -> CallToolResponse {
    CallToolResult::error(vec![ContentBlock::text(text)]).into()
}

/// The URIs of the client's roots, when it supports roots and is asked in a handshake-era
/// connection (2026-07-28 has no server-to-client requests); `Err` says why there are none.
#[allow(deprecated)] // roots/list is deprecated in 2026-07-28, current before it
async fn client_roots(context: &RequestContext<RoleServer>) -> Result<Vec<String>, String> {
    /// How long the client has to list its roots.
    const ROOTS_TIMEOUT: Duration = Duration::from_secs(10);
    let supports = context
        .client_capabilities()
        .is_some_and(|c| c.roots.is_some());
    if !supports || is_modern(context) {
        return Err("the client does not offer roots".into());
    }
    let listed = tokio::time::timeout(ROOTS_TIMEOUT, context.peer.list_roots()).await;
    match listed {
        Ok(Ok(list)) => Ok(list.roots.into_iter().map(|r| r.uri).collect()),
        Ok(Err(e)) => Err(format!("the client's roots/list failed ({e})")),
        Err(_) => Err(format!(
            "the client did not answer roots/list within {} s",
            ROOTS_TIMEOUT.as_secs()
        )),
    }
}

fn is_modern(context: &RequestContext<RoleServer>) -> bool {
    context
        .protocol_version()
        .is_some_and(|v| v.as_str() >= ProtocolVersion::V_2026_07_28.as_str())
}

/// Whether the client declared form elicitation (a bare `elicitation: {}` means form).
fn elicitation_supported(context: &RequestContext<RoleServer>) -> bool {
    context
        .client_capabilities()
        .and_then(|c| c.elicitation)
        .is_some_and(|e| e.form.is_some() || e.url.is_none())
}

fn approval_params(request: &ApprovalRequest) -> Result<ElicitRequestParams, String> {
    let schema: ElicitationSchema = serde_json::from_value(serde_json::json!({
        "type": "object",
        "properties": {
            "approve": {
                "type": "boolean",
                "title": "Approve",
                "description": "Allow exactly this one call",
                "default": false
            }
        },
        "required": ["approve"]
    }))
    .map_err(|e| e.to_string())?;
    let message = format!(
        "{}\nApprove this one call?",
        cordis_engine::approval::render(request)
    );
    Ok(ElicitRequestParams::FormElicitationParams {
        meta: None,
        message,
        requested_schema: schema,
    })
}

fn approval_elicitation(request: &ApprovalRequest) -> Result<InputRequest, String> {
    Ok(InputRequest::Elicitation(ElicitRequest::new(
        approval_params(request)?,
    )))
}

/// Asks now, with a server-to-client `elicitation/create` (handshake-era connections).
async fn elicit_now(peer: &Peer<RoleServer>, request: &ApprovalRequest) -> ApprovalOutcome {
    let params = match approval_params(request) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!("cannot build the approval elicitation: {e}");
            return ApprovalOutcome::Unavailable;
        }
    };
    match peer.create_elicitation(params).await {
        Ok(result) => outcome_of(&result),
        Err(e) => {
            tracing::warn!("approval elicitation failed: {e}");
            ApprovalOutcome::Unavailable
        }
    }
}

fn outcome_of(result: &ElicitResult) -> ApprovalOutcome {
    match result.action {
        ElicitationAction::Accept => {
            let approved = result
                .content
                .as_ref()
                .and_then(|c| c.get("approve"))
                .and_then(|v| v.as_bool())
                .unwrap_or(false);
            if approved {
                ApprovalOutcome::Approved
            } else {
                ApprovalOutcome::Rejected
            }
        }
        ElicitationAction::Decline => ApprovalOutcome::Rejected,
        ElicitationAction::Cancel => ApprovalOutcome::Cancelled,
        _ => ApprovalOutcome::Unavailable,
    }
}

fn as_tool(info: cordis_engine::runtime::ToolInfo) -> Tool {
    let schema: JsonObject = match info.input_schema {
        serde_json::Value::Object(o) => o,
        _ => {
            let mut o = JsonObject::new();
            o.insert("type".into(), "object".into());
            o
        }
    };
    let mut tool = Tool::new(info.name, info.description, Arc::new(schema));
    if let Some(annotations) = info
        .annotations
        .and_then(|a| serde_json::from_value::<ToolAnnotations>(a).ok())
    {
        tool = tool.with_annotations(annotations);
    }
    if let Some(serde_json::Value::Object(schema)) = info.output_schema {
        tool = tool.with_raw_output_schema(Arc::new(schema));
    }
    tool
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        let mut info = InitializeResult::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        );
        info.server_info = Implementation::new("cordis", env!("CARGO_PKG_VERSION"));
        let context = self.context_now();
        if !context.is_empty() {
            info.instructions = Some(context);
        }
        info
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        context.peer.set_peer_info(request.clone());
        let result = self.negotiate_initialize(&request)?;
        self.mark_shown(result.instructions.as_deref());
        let _ = self.shared.peer.set(context.peer.clone());
        Ok(result)
    }

    async fn discover(
        &self,
        _context: RequestContext<RoleServer>,
    ) -> Result<DiscoverResult, ErrorData> {
        let info = self.get_info();
        self.mark_shown(info.instructions.as_deref());
        Ok(DiscoverResult::from_server_info(
            self.supported_protocol_versions().into_owned(),
            info,
        ))
    }

    /// Every version, over stdio and HTTP: over HTTP a handshake-era client's session is
    /// its MCP session, a 2026-07-28 client's is named by a handle ([`handles`]).
    fn supported_protocol_versions(&self) -> std::borrow::Cow<'static, [ProtocolVersion]> {
        ProtocolVersion::KNOWN_VERSIONS.into()
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        self.learn_mcp_session(&context.extensions);
    }

    async fn on_roots_list_changed(&self, _context: NotificationContext<RoleServer>) {
        match self.shared.session.get() {
            Some(session) => tracing::info!(
                session = %session.id,
                "the client's roots changed; the session stays rooted at {} (a session's root is pinned when it starts)",
                session.cwd.display()
            ),
            None => tracing::info!(
                "the client's roots changed; the session root is read at the first call"
            ),
        }
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let tools = self.runtime().tools().into_iter().map(as_tool).collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let hub = &self.shared.hub;
        if hub.is_closing() {
            return Ok(error_result(
                "the server is shutting down and takes no new calls; reconnect when it is back"
                    .into(),
            ));
        }
        let _in_flight = InFlight::enter(&hub.in_flight);
        if hub.over_http() && is_modern(&context) {
            let named = match (handles::named(&context)?, &request.request_state) {
                // A retry with an approval answer: its state names the session.
                (None, Some(state)) => hub.handle_in_state(state, &request),
                (named, _) => named,
            };
            let (handle, server) = hub.stateless_session(named, handles::principal(&context))?;
            let Some(session) = server.shared.session.get().cloned() else {
                return Ok(error_result("the session has no root yet".into()));
            };
            let mut response = server.run(&session, request, &context).await;
            handles::label(&mut response, &handle);
            return Ok(response);
        }
        self.learn_mcp_session(&context.extensions);
        let session = match self.session(&context).await {
            Ok(s) => s,
            Err(e) => return Ok(error_result(e)),
        };
        Ok(self.run(&session, request, &context).await)
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        (requested.tools_list_changed == Some(true))
            .then(|| SubscriptionFilter::builder().tools_list_changed().build())
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        let sink = context.sink().clone();
        let id = sink.id().clone();
        lock(&self.shared.hub.sinks).push(sink);
        context.cancelled().await;
        lock(&self.shared.hub.sinks).retain(|s| *s.id() != id);
        Ok(())
    }
}

impl McpServer {
    /// Runs `request` in `session`: a retry carrying an approval answer resumes its
    /// parked call, anything else starts one.
    async fn run(
        &self,
        session: &SessionInfo,
        request: CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> CallToolResponse {
        let args = serde_json::Value::Object(request.arguments.clone().unwrap_or_default());
        if let Some(state) = request.request_state.clone() {
            return self.resume(session, &request, &state, &args, context).await;
        }
        let with_progress = context.meta.get_progress_token().is_some();
        let running = self.start_call(
            session,
            request.name.to_string(),
            args.clone(),
            with_progress,
        );
        self.drive(running, &args, context).await
    }
}
