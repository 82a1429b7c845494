//! A tool call: started on a blocking thread with its cancel and progress pipes, driven
//! to its result (progress, pings, approvals on the way), and rendered for the client.

use super::*;

/// An approval request from a tool thread, waiting for its answer.
pub(super) struct Ask {
    pub(super) request: ApprovalRequest,
    pub(super) answer: std_mpsc::SyncSender<ApprovalOutcome>,
}

impl Ask {
    pub(super) fn answer(self, outcome: ApprovalOutcome) {
        let _ = self.answer.send(outcome);
    }
}

/// A close-on-exec pipe with `flags` (e.g. `O_NONBLOCK`): (read end, write end).
pub(super) fn pipe(flags: i32) -> std::io::Result<Pipe> {
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

/// A pipe as [`pipe`] makes it: (read end, write end).
pub(super) type Pipe = (std::os::fd::OwnedFd, std::os::fd::OwnedFd);

/// Cancel pipes of calls that ended without being cancelled, for the calls after them. A
/// call's pipe becomes readable only when its write end closes, and nobody writes into
/// it, so a pipe whose write end the host still holds is as good as new (a plugin may use
/// the descriptor only during its call, like any other the call lends it).
struct SparePipes(Mutex<Vec<Pipe>>);

/// At most this many spare pipes are kept (two descriptors each).
const MAX_SPARE_PIPES: usize = 64;

impl SparePipes {
    const fn new() -> Self {
        Self(Mutex::new(Vec::new()))
    }

    /// A cancel pipe for a new call: a spare one when there is one.
    fn take(&self) -> std::io::Result<Pipe> {
        match lock(&self.0).pop() {
            Some(pipe) => Ok(pipe),
            None => pipe(0),
        }
    }

    /// Keeps the cancel pipe of a call that ended uncancelled for a later call.
    fn keep(&self, pipe: Pipe) {
        let mut spare = lock(&self.0);
        if spare.len() < MAX_SPARE_PIPES {
            spare.push(pipe);
        }
    }
}

static CANCEL_PIPES: SparePipes = SparePipes::new();

/// What a tool thread hands back: its result and the model context right after it.
pub(super) type Finished = (Result<ToolResult, UnknownTool>, String);

/// A call's progress reports, one JSON line each ([`cordis_sdk::Progress`]).
pub(super) type Feed = tokio::io::Lines<BufReader<tokio::net::unix::pipe::Receiver>>;

/// A tool call in flight.
pub(super) struct Running {
    pub(super) call_id: String,
    /// The session it runs in.
    pub(super) session: String,
    pub(super) tool: String,
    pub(super) join: JoinHandle<Finished>,
    /// How long the call's thread ran, in nanoseconds plus one, once it has; 0 before.
    pub(super) ran: Arc<AtomicU64>,
    pub(super) asks: mpsc::UnboundedReceiver<Ask>,
    pub(super) started: Instant,
    /// The tool's progress reports, while it may send any.
    pub(super) feed: Option<Feed>,
    /// What it reported last (each field as last reported).
    pub(super) reported: cordis_sdk::Progress,
}

impl Running {
    /// How long the call's thread ran, once it has.
    fn ran_for(&self) -> Option<Duration> {
        match self.ran.load(Ordering::Acquire) {
            0 => None,
            ns => Some(Duration::from_nanos(ns - 1)),
        }
    }

    /// The call's end if it comes within [`SPIN_FOR`], waited for spinning.
    fn spin_for_end(&mut self) -> Option<Result<Finished, tokio::task::JoinError>> {
        let until = Instant::now() + SPIN_FOR;
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        loop {
            // Polled once the thread is done, so the task's budget is not spent waiting.
            if self.ran.load(Ordering::Acquire) != 0 {
                if let std::task::Poll::Ready(finished) =
                    std::future::Future::poll(std::pin::Pin::new(&mut self.join), &mut cx)
                {
                    return Some(finished);
                }
            }
            if Instant::now() >= until {
                return None;
            }
            std::hint::spin_loop();
        }
    }
}

/// The longest a connection's only protocol thread waits, spinning, for the end of a call
/// it expects to be short ([`Quick`]).
pub(super) const SPIN_FOR: Duration = Duration::from_micros(60);

/// The tools whose last call on this connection ran within [`SPIN_FOR`]. A call runs on
/// the blocking pool, and its end wakes the thread that answers it; where that is the
/// connection's only thread (stdio), the thread sleeps meanwhile, and waking a sleeping
/// thread costs about as much as a short call (more on a virtual machine). For a call of
/// such a tool the thread waits spinning instead, at most [`SPIN_FOR`] (the connection's
/// other messages wait as long); a call that ran longer takes its tool off the list.
#[derive(Default)]
pub(super) struct Quick(Mutex<HashSet<String>>);

impl Quick {
    pub(super) fn expects_short(&self, tool: &str) -> bool {
        lock(&self.0).contains(tool)
    }

    pub(super) fn record(&self, tool: &str, ran: Duration) {
        let mut quick = lock(&self.0);
        if ran > SPIN_FOR {
            quick.remove(tool);
        } else if !quick.contains(tool) {
            quick.insert(tool.to_string());
        }
    }
}

/// Whether this task runs on a runtime of one thread (stdio's), where a spin waits for
/// nothing else the thread should be doing but the connection's own messages.
fn one_thread() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread)
}

/// The next report of `feed`; `None` at its end.
pub(super) async fn next_line(feed: &mut Option<Feed>) -> Option<String> {
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
pub(super) struct Liveness {
    pub(super) every: Duration,
    pub(super) next: tokio::time::Instant,
    pub(super) pinging: Option<std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send>>>,
}

impl Liveness {
    pub(super) fn new(every: Option<Duration>) -> Option<Self> {
        every.map(|every| Liveness {
            every,
            next: tokio::time::Instant::now() + every,
            pinging: None,
        })
    }
}

/// Resolves when the client stopped answering pings (never without `liveness`). Dropping
/// it keeps a ping in flight for the next call.
pub(super) async fn client_lost(liveness: &mut Option<Liveness>, peer: &Peer<RoleServer>) {
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
pub(super) async fn report(
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

/// A call's approval request, asked of its client and an operator.
struct Asked<'a> {
    context: &'a RequestContext<RoleServer>,
    token: Option<&'a ProgressToken>,
    running: &'a Running,
    request: &'a ApprovalRequest,
}

impl Asked<'_> {
    /// The first answer: the client's (by elicitation, when `elicits`) or the operator's
    /// (when `waiting`). The client hears progress meanwhile; a client that cancels or goes
    /// away cancels the request. A failed elicitation leaves the operator to answer.
    async fn answer(
        &self,
        elicits: bool,
        mut waiting: Option<crate::operator::Waiting>,
        ticker: &mut tokio::time::Interval,
        liveness: &mut Option<Liveness>,
    ) -> ApprovalOutcome {
        let doing = match &waiting {
            Some(w) => format!(
                "waiting for approval (an operator can answer: `cordis approvals approve {}`)",
                w.id()
            ),
            None => "waiting for approval".to_string(),
        };
        let mut client_asked = elicits;
        let operator_waits = waiting.is_some();
        let asking = elicit_now(&self.context.peer, self.request);
        tokio::pin!(asking);
        let by_operator = async {
            match &mut waiting {
                Some(w) => w.outcome().await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(by_operator);
        loop {
            tokio::select! {
                outcome = &mut asking, if client_asked => {
                    if outcome != ApprovalOutcome::Unavailable || !operator_waits {
                        return outcome;
                    }
                    client_asked = false;
                }
                outcome = &mut by_operator => return outcome,
                _ = ticker.tick(), if self.token.is_some() => {
                    report(self.context, self.token, self.running, &doing).await;
                }
                () = client_lost(liveness, &self.context.peer) => return ApprovalOutcome::Cancelled,
                _ = self.context.ct.cancelled() => return ApprovalOutcome::Cancelled,
            }
        }
    }
}

impl McpServer {
    pub(super) fn start_call(
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
        let cancel_rd = match CANCEL_PIPES.take() {
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
        let ran = Arc::new(AtomicU64::new(0));
        let ran_in = ran.clone();
        let join = tokio::task::spawn_blocking(move || {
            let began = Instant::now();
            let result = runtime.call_tool(&name, &call, &args);
            let context = runtime.model_context(Some(&call.session.id));
            // Whoever takes the write end out first decides: a cancel closes it, the end
            // of an uncancelled call keeps the pipe for the next call.
            let uncancelled = shared
                .upgrade()
                .and_then(|shared| lock(&shared.cancels).remove(&call.call_id));
            if let (Some(rd), Some(wr)) = (cancel_rd, uncancelled) {
                CANCEL_PIPES.keep((rd, wr));
            }
            drop(progress_wr);
            let ns = u64::try_from(began.elapsed().as_nanos()).unwrap_or(u64::MAX - 1);
            ran_in.store(ns + 1, Ordering::Release);
            (result, context)
        });
        Running {
            call_id,
            session: session.id.clone(),
            tool,
            join,
            ran,
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
    pub(super) async fn drive(
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
        if one_thread() && self.shared.quick.expects_short(&running.tool) {
            if let Some(finished) = running.spin_for_end() {
                return self.ended(&running, finished);
            }
        }
        loop {
            tokio::select! {
                finished = &mut running.join => return self.ended(&running, finished),
                Some(ask) = running.asks.recv() => {
                    let elicits = elicitation_supported(context);
                    if elicits && is_modern(context) {
                        match self.park(running, ask, args) {
                            Ok(input) => return input.into(),
                            Err(text) => return error_result(text),
                        }
                    }
                    let waiting = self.shared.hub.operator.as_ref().map(|o| o.wait(&ask.request));
                    let outcome = if elicits || waiting.is_some() {
                        let asked = Asked {
                            context,
                            token: token.as_ref(),
                            running: &running,
                            request: &ask.request,
                        };
                        Box::pin(asked.answer(elicits, waiting, &mut ticker, &mut liveness)).await
                    } else {
                        ApprovalOutcome::Unavailable
                    };
                    ask.answer(outcome);
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
    pub(super) fn detach(&self, mut running: Running, outcome: ApprovalOutcome) {
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

    /// A driven call's end: its approvals' route closed, its tool's speed noted.
    fn ended(
        &self,
        running: &Running,
        finished: Result<Finished, tokio::task::JoinError>,
    ) -> CallToolResponse {
        lock(&self.shared.calls).remove(&running.call_id);
        if let Some(ran) = running.ran_for() {
            self.shared.quick.record(&running.tool, ran);
        }
        self.finish(&running.tool, finished).into()
    }

    /// The tool's result as MCP content, with the model context when it changed.
    pub(super) fn finish(
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

pub(super) fn error_result(text: String) -> CallToolResponse {
    CallToolResult::error(vec![ContentBlock::text(text)]).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `fd` is readable (or at end of file) right now.
    fn readable(fd: &std::os::fd::OwnedFd) -> bool {
        let mut poll = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, no wait.
        let ready = unsafe { libc::poll(&mut poll, 1, 0) };
        assert!(ready >= 0, "poll: {}", std::io::Error::last_os_error());
        ready == 1
    }

    #[test]
    fn a_tool_is_quick_while_its_last_call_ran_within_the_spin() {
        let quick = Quick::default();
        assert!(!quick.expects_short("read"), "a tool never called");
        quick.record("read", Duration::from_micros(17));
        assert!(quick.expects_short("read"));
        assert!(!quick.expects_short("bash"));
        quick.record("read", SPIN_FOR + Duration::from_nanos(1));
        assert!(!quick.expects_short("read"), "a call that ran longer");
        quick.record("read", SPIN_FOR);
        assert!(quick.expects_short("read"));
    }

    #[test]
    fn only_a_runtime_of_one_thread_spins() {
        assert!(!one_thread(), "outside any runtime");
        let one = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        assert!(one.block_on(async { one_thread() }));
        let many = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap();
        assert!(!many.block_on(async { one_thread() }));
    }

    /// A call running `f` on the blocking pool, as [`McpServer::start_call`] starts one.
    fn running(f: impl FnOnce() + Send + 'static) -> Running {
        let ran = Arc::new(AtomicU64::new(0));
        let ran_in = ran.clone();
        let join = tokio::task::spawn_blocking(move || {
            f();
            ran_in.store(1 + 5_000, Ordering::Release);
            (Ok(ToolResult::ok("done")), String::new())
        });
        Running {
            call_id: "c-1".into(),
            session: "s".into(),
            tool: "read".into(),
            join,
            ran,
            asks: mpsc::unbounded_channel().1,
            started: Instant::now(),
            feed: None,
            reported: cordis_sdk::Progress::default(),
        }
    }

    #[tokio::test]
    async fn the_spin_takes_a_call_that_has_ended_and_gives_up_on_one_that_has_not() {
        let mut ended = running(|| {});
        while !ended.join.is_finished() {
            std::thread::sleep(Duration::from_millis(1));
        }
        match ended.spin_for_end() {
            Some(Ok((Ok(result), _))) => assert_eq!(result.text, "done"),
            other => panic!("the ended call was not taken: {other:?}"),
        }
        assert_eq!(ended.ran_for(), Some(Duration::from_micros(5)));

        let (go, wait) = std_mpsc::channel::<()>();
        let mut waiting = running(move || {
            let _ = wait.recv();
        });
        let spun = Instant::now();
        assert!(waiting.spin_for_end().is_none(), "a call still running");
        assert!(
            spun.elapsed() >= SPIN_FOR,
            "gave up early: {:?}",
            spun.elapsed()
        );
        assert_eq!(waiting.ran_for(), None);
        go.send(()).unwrap();
        let (result, _) = (&mut waiting.join).await.expect("the call");
        assert_eq!(result.expect("known tool").text, "done");
    }

    #[test]
    fn a_spare_cancel_pipe_is_reused_unsignalled_and_still_cancels() {
        // A pipe is known by its inode: descriptor numbers are reused.
        let inode = |fd: &std::os::fd::OwnedFd| {
            use std::os::unix::fs::MetadataExt;
            std::fs::File::from(fd.try_clone().expect("dup"))
                .metadata()
                .expect("fstat")
                .ino()
        };
        let spares = SparePipes::new();
        let (rd, wr) = spares.take().expect("a cancel pipe");
        let ours = inode(&rd);
        spares.keep((rd, wr));
        let (rd, wr) = spares.take().expect("a cancel pipe");
        assert_eq!(inode(&rd), ours, "the spare pipe was not reused");
        assert!(!readable(&rd), "a reused pipe reads as cancelled");
        drop(wr);
        assert!(readable(&rd), "closing the write end does not cancel");
        let mut byte = [0u8; 1];
        // SAFETY: reading one byte into a valid buffer.
        let n = unsafe { libc::read(rd.as_raw_fd(), byte.as_mut_ptr().cast(), 1) };
        assert_eq!(n, 0, "a cancel is the end of file, not data");
    }
}
