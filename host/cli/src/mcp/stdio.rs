//! The stdio server: one connection, one session, served until end of input or shutdown.

use super::*;

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
pub(super) fn never() -> impl Shutdown {
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
pub(super) async fn serve_connection<R, W>(
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
        let session = server
            .open(SessionStart::Resume(id), "resuming the session")
            .map_err(|e| anyhow::anyhow!("{e}; omit --session to start a new session"))?;
        server.adopt(session);
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
pub(super) type Input = Box<dyn AsyncRead + Send + Unpin>;
pub(super) type Output = Box<dyn AsyncWrite + Send + Unpin>;

/// The protocol's stdin/stdout. The real stdout is kept on a private descriptor for MCP
/// and descriptor 1 is pointed at stderr, so a stray print from a plugin (or anything
/// else in the process) lands in the log instead of corrupting the MCP stream. Pipes (what
/// MCP clients give a server) are driven by the async runtime's poller; anything else
/// (a terminal, a file) by tokio's blocking stdio threads.
pub(super) fn protocol_stdio() -> anyhow::Result<(Input, Output)> {
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

pub(super) async fn serve<R, W>(
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
        started = server.serve(super::wire::Wire::new(io.0, io.1)) => started,
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
pub(super) struct EndOfInput<R> {
    pub(super) inner: R,
    pub(super) ended: Option<tokio::sync::oneshot::Sender<()>>,
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
