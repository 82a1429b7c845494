//! The MCP server front-end: serves the composition's tools to one client over stdio, in one
//! session, and asks that client to approve escalations.
//!
//! One connection is one session. Every `tools/call` gets a fresh call id and runs on a
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
use std::time::Duration;

use anyhow::Context as _;
use cordis_sdk::host::{ApprovalOutcome, ApprovalRequest};
use cordis_sdk::{CallContext, SessionInfo, ToolResult};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, DiscoverResult,
    ElicitRequest, ElicitRequestParams, ElicitResult, ElicitationAction, ElicitationSchema,
    Implementation, InitializeRequestParams, InitializeResult, InputRequest, InputRequests,
    InputRequiredResult, JsonObject, ListToolsResult, PaginatedRequestParams, ProtocolVersion,
    RequestStateCodec, SealOptions, ServerCapabilities, ServerConfig, SubscriptionFilter, Tool,
};
use rmcp::service::{RequestContext, RoleServer, SubscriptionContext, SubscriptionSink};
use rmcp::{ErrorData, Peer, ServerHandler, ServiceExt};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use cordis_engine::approval::Asker;
use cordis_engine::registry::UnknownTool;
use cordis_engine::runtime::Runtime;

/// How long a parked approval waits for the client's retry before it counts as cancelled.
const PARK_TTL: Duration = Duration::from_secs(600);

/// The key under which the approval elicitation travels in `inputRequests`.
const APPROVAL_INPUT: &str = "approval";

/// Which session an MCP connection works in.
#[derive(Clone, Debug, Default)]
pub struct McpOptions {
    /// An existing session to resume (an error when unknown); `None`: a new session.
    pub session: Option<String>,
    /// The root of a new session; `None`: the process's current directory.
    pub cwd: Option<PathBuf>,
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

/// Serves the runtime's tools over stdin/stdout until the client disconnects.
pub async fn serve_stdio(runtime: Arc<Runtime>, options: McpOptions) -> anyhow::Result<()> {
    serve_stdio_with(runtime, options, ToolListNotifier::default()).await
}

/// [`serve_stdio`], with a notifier the host keeps to announce tool-list changes.
pub async fn serve_stdio_with(
    runtime: Arc<Runtime>,
    options: McpOptions,
    notifier: ToolListNotifier,
) -> anyhow::Result<()> {
    serve_connection(runtime, options, notifier, protocol_stdio).await
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
    serve_connection(runtime, options, notifier, move || Ok((input, output))).await
}

/// One connection: its session is opened and bound for approvals before `io` is set up.
async fn serve_connection<R, W>(
    runtime: Arc<Runtime>,
    options: McpOptions,
    notifier: ToolListNotifier,
    io: impl FnOnce() -> anyhow::Result<(R, W)>,
) -> anyhow::Result<()>
where
    R: AsyncRead + Send + Unpin + 'static,
    W: AsyncWrite + Send + Unpin + 'static,
{
    let session = open_session(&runtime, &options)?;
    tracing::info!(session = %session.id, cwd = %session.cwd.display(), "mcp session");
    let server = McpServer::new(runtime.clone(), session.clone())?;
    runtime.host.approvals.bind(&session.id, server.asker());
    let result = match io() {
        Ok(io) => serve(server, notifier, io).await,
        Err(e) => Err(e),
    };
    runtime.host.approvals.unbind(&session.id);
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
    notifier: ToolListNotifier,
    io: (R, W),
) -> anyhow::Result<()>
where
    R: AsyncRead + Send + Unpin + 'static,
    W: AsyncWrite + Send + Unpin + 'static,
{
    let sinks = server.shared.sinks.clone();
    let shared = server.shared.clone();
    let (ended, input_ended) = tokio::sync::oneshot::channel();
    let io = (
        EndOfInput {
            inner: io.0,
            ended: Some(ended),
        },
        io.1,
    );
    let running = match server.serve(io).await {
        Ok(r) => r,
        Err(rmcp::service::ServerInitializeError::ConnectionClosed(_)) => {
            // The client went away before initializing (or stdin was empty): nothing to serve.
            tracing::info!("the input closed before an MCP client initialized");
            return Ok(());
        }
        Err(e) => return Err(anyhow::Error::new(e).context("failed to start the mcp server")),
    };
    let peer = running.peer().clone();
    let mut changes = notifier.tx.subscribe();
    let forward = tokio::spawn(async move {
        while changes.changed().await.is_ok() {
            announce_tools_changed(&peer, &sinks).await;
        }
    });
    let waiting = running.waiting();
    tokio::pin!(waiting);
    let quit = tokio::select! {
        quit = &mut waiting => Some(quit),
        Ok(()) = input_ended => None,
    };
    forward.abort();
    match quit {
        Some(quit) => {
            quit.context("the mcp connection failed")?;
        }
        None => {
            // The client is gone: nobody will read an answer, so every call in flight is
            // cancelled (a running command is killed) instead of being waited for.
            let cancelled = std::mem::take(&mut *lock(&shared.cancels));
            tracing::info!(
                calls = cancelled.len(),
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

async fn announce_tools_changed(peer: &Peer<RoleServer>, sinks: &Mutex<Vec<SubscriptionSink>>) {
    if peer.peer_info().is_some() {
        if let Err(e) = peer.notify_tool_list_changed().await {
            tracing::debug!("tools/list_changed not delivered: {e}");
        }
    }
    let sinks: Vec<SubscriptionSink> = lock(sinks).clone();
    for sink in sinks {
        if let Err(e) = sink.notify_tool_list_changed().await {
            tracing::debug!("tools/list_changed not delivered to a subscription: {e}");
        }
    }
}

fn open_session(runtime: &Runtime, options: &McpOptions) -> anyhow::Result<SessionInfo> {
    let sessions = &runtime.host.sessions;
    match &options.session {
        Some(id) => sessions
            .get(id)
            .map_err(|e| anyhow::anyhow!("{e}; omit --session to start a new session")),
        None => {
            let cwd = match &options.cwd {
                Some(cwd) => cwd.clone(),
                None => std::env::current_dir().context("cannot read the current directory")?,
            };
            sessions
                .create(&cwd)
                .with_context(|| format!("failed to create a session rooted at {}", cwd.display()))
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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

/// A close-on-exec pipe: (read end, write end).
fn cancel_pipe() -> std::io::Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)> {
    use std::os::fd::FromRawFd;
    let mut fds = [-1; 2];
    // SAFETY: `fds` is a valid array of two descriptors for the kernel to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
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

/// A tool call in flight.
struct Running {
    call_id: String,
    tool: String,
    join: JoinHandle<Finished>,
    asks: mpsc::UnboundedReceiver<Ask>,
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
}

struct Shared {
    runtime: Arc<Runtime>,
    session: SessionInfo,
    /// Per call id: where that call's approval requests go.
    calls: Mutex<HashMap<String, mpsc::UnboundedSender<Ask>>>,
    /// Per running call id: the write end of its cancel pipe. Removing it cancels the call
    /// (the tool sees end of file on `CallContext::cancel_fd`).
    cancels: Mutex<HashMap<String, std::os::fd::OwnedFd>>,
    parked: Mutex<HashMap<u64, Parked>>,
    codec: RequestStateCodec,
    /// The model context the client was last shown.
    shown: Mutex<String>,
    call_prefix: String,
    next: AtomicU64,
    sinks: Arc<Mutex<Vec<SubscriptionSink>>>,
}

/// The MCP handler of one connection.
#[derive(Clone)]
struct McpServer {
    shared: Arc<Shared>,
}

fn random_bytes(n: usize) -> anyhow::Result<Vec<u8>> {
    use std::io::Read;
    let mut buf = vec![0u8; n];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .context("cannot read random bytes for the request-state key")?;
    Ok(buf)
}

impl McpServer {
    fn new(runtime: Arc<Runtime>, session: SessionInfo) -> anyhow::Result<Self> {
        let key = random_bytes(32)?;
        let codec = RequestStateCodec::try_new(key)
            .map_err(|e| anyhow::anyhow!("cannot set up the request-state key: {e}"))?;
        let prefix: String = random_bytes(6)?
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Ok(McpServer {
            shared: Arc::new(Shared {
                runtime,
                session,
                calls: Mutex::default(),
                cancels: Mutex::default(),
                parked: Mutex::default(),
                codec,
                shown: Mutex::default(),
                call_prefix: format!("mcp-{prefix}"),
                next: AtomicU64::new(1),
                sinks: Arc::default(),
            }),
        })
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

    fn context_now(&self) -> String {
        self.shared
            .runtime
            .model_context(Some(&self.shared.session.id))
    }

    /// Records the context sent with `initialize`/`discover` as shown.
    fn mark_shown(&self, instructions: Option<&str>) {
        *lock(&self.shared.shown) = instructions.unwrap_or_default().to_string();
    }

    fn next_id(&self) -> u64 {
        self.shared.next.fetch_add(1, Ordering::Relaxed)
    }

    fn start_call(&self, tool: String, args: serde_json::Value) -> Running {
        let call_id = format!("{}-{}", self.shared.call_prefix, self.next_id());
        let (tx, asks) = mpsc::unbounded_channel();
        lock(&self.shared.calls).insert(call_id.clone(), tx);
        // The read end lives as long as the call; the write end as long as nobody cancels.
        let cancel_rd = match cancel_pipe() {
            Ok((rd, wr)) => {
                lock(&self.shared.cancels).insert(call_id.clone(), wr);
                Some(rd)
            }
            Err(e) => {
                tracing::warn!("cannot create a cancel pipe; this call cannot be cancelled: {e}");
                None
            }
        };
        let call = CallContext {
            session: self.shared.session.clone(),
            call_id: call_id.clone(),
            cancel_fd: cancel_rd.as_ref().map(|fd| fd.as_raw_fd()),
        };
        let runtime = self.shared.runtime.clone();
        let shared = Arc::downgrade(&self.shared);
        let name = tool.clone();
        let join = tokio::task::spawn_blocking(move || {
            let result = runtime.call_tool(&name, &call, &args);
            let context = runtime.model_context(Some(&call.session.id));
            if let Some(shared) = shared.upgrade() {
                lock(&shared.cancels).remove(&call.call_id);
            }
            drop(cancel_rd);
            (result, context)
        });
        Running {
            call_id,
            tool,
            join,
            asks,
        }
    }

    /// Drives a call to its result, answering its approval requests on the way; on a
    /// 2026-07-28 connection an approval parks the call and returns `input_required`.
    async fn drive(
        &self,
        mut running: Running,
        args: &serde_json::Value,
        context: &RequestContext<RoleServer>,
    ) -> CallToolResponse {
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
                            Err(text) => return CallToolResult::error(vec![ContentBlock::text(text)]).into(),
                        }
                    } else {
                        let outcome = elicit_now(&context.peer, &ask.request).await;
                        ask.answer(outcome);
                    }
                }
                _ = context.ct.cancelled() => {
                    self.detach(running, ApprovalOutcome::Cancelled);
                    return CallToolResult::error(vec![ContentBlock::text("the call was cancelled by the client")]).into();
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

    fn binding(&self, tool: &str, args: &serde_json::Value) -> Vec<u8> {
        format!("{}\0{}\0{}", self.shared.session.id, tool, args).into_bytes()
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
        let binding = self.binding(&running.tool, args);
        let state = self.shared.codec.seal_json_with(
            &ParkState {
                park,
                call: running.call_id.clone(),
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
        let me = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(PARK_TTL).await;
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
        request: &CallToolRequestParams,
        state: &str,
        args: &serde_json::Value,
        context: &RequestContext<RoleServer>,
    ) -> CallToolResponse {
        let binding = self.binding(&request.name, args);
        let opened: Result<ParkState, _> = self.shared.codec.open_json_with(state, &binding);
        let state = match opened {
            Ok(s) => s,
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
        let (is_error, text, context) = match finished {
            Ok((Ok(r), context)) => (r.is_error, r.text, Some(context)),
            Ok((Err(unknown), context)) => (true, unknown.to_string(), Some(context)),
            Err(e) => (true, format!("tool `{tool}` failed: {e}"), None),
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
        if is_error {
            CallToolResult::error(content)
        } else {
            CallToolResult::success(content)
        }
    }
}

fn error_result(text: String) -> CallToolResponse {
    CallToolResult::error(vec![ContentBlock::text(text)]).into()
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
    Tool::new(info.name, info.description, Arc::new(schema))
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

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let tools = self
            .shared
            .runtime
            .tools()
            .into_iter()
            .map(as_tool)
            .collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = serde_json::Value::Object(request.arguments.clone().unwrap_or_default());
        if let Some(state) = request.request_state.clone() {
            return Ok(self.resume(&request, &state, &args, &context).await);
        }
        let running = self.start_call(request.name.to_string(), args.clone());
        Ok(self.drive(running, &args, &context).await)
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
        lock(&self.shared.sinks).push(sink);
        context.cancelled().await;
        lock(&self.shared.sinks).retain(|s| *s.id() != id);
        Ok(())
    }
}
