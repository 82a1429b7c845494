//! What every connection of one server shares, and the calls in flight.

use super::*;

/// What every connection of one server shares: the runtime, how sessions are rooted, the
/// peers and subscriptions to tell about tool-list changes, and the calls in flight (for a
/// graceful shutdown).
pub(crate) struct Hub {
    pub(super) runtime: Arc<Runtime>,
    pub(super) rooting: Rooting,
    /// A session to resume (stdio only).
    pub(super) resume: Option<String>,
    /// Over HTTP (only), how long a session lasts without requests.
    pub(super) idle: Option<Duration>,
    /// Over HTTP (only), how often a client with a call in flight is pinged (see
    /// [`Liveness`]).
    pub(super) ping_every: Option<Duration>,
    /// The sessions of 2026-07-28 clients over HTTP.
    pub(crate) handles: handles::Handles,
    pub(super) codec: RequestStateCodec,
    pub(super) call_prefix: String,
    pub(super) next: AtomicU64,
    pub(super) sinks: Mutex<Vec<SubscriptionSink>>,
    /// Live connections: to tell those that completed the handshake about tool-list
    /// changes, and to cancel their calls at shutdown.
    pub(super) live: Mutex<HashMap<u64, std::sync::Weak<Shared>>>,
    /// HTTP connections by MCP session id, to end them at once on `DELETE`.
    pub(super) by_mcp_session: Mutex<HashMap<String, std::sync::Weak<Shared>>>,
    /// Set when the server stops taking calls.
    pub(super) closing: std::sync::atomic::AtomicBool,
    pub(super) in_flight: watch::Sender<usize>,
    /// Where approvals wait for an operator.
    pub(super) operator: Option<Arc<crate::operator::Operator>>,
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
        runtime.approvals().observe(Some(Arc::new(|outcome| {
            use cordis_sdk::host::ApprovalOutcome as O;
            crate::metrics::metrics().approval(match outcome {
                O::Approved => "approved",
                O::Rejected => "rejected",
                O::Cancelled => "cancelled",
                O::Unavailable => "unavailable",
            })
        })));
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
            operator: options.operator.clone(),
        }))
    }

    pub(super) fn next_id(&self) -> u64 {
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
    pub(super) fn over_http(&self) -> bool {
        self.ping_every.is_some()
    }

    /// How long an HTTP session lasts without requests.
    pub(super) fn idle_timeout(&self) -> Duration {
        self.idle.unwrap_or(Duration::MAX)
    }

    /// The MCP connections alive (over HTTP: the MCP sessions).
    pub(crate) fn connections(&self) -> usize {
        lock(&self.live).len()
    }

    /// Where approvals wait for an operator, when they do.
    pub(crate) fn operator(&self) -> Option<&Arc<crate::operator::Operator>> {
        self.operator.as_ref()
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
        // Nobody will be there to answer: the calls waiting for an operator go on, refused.
        if let Some(operator) = &self.operator {
            operator.cancel_all();
        }
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
pub(super) struct InFlight<'a>(&'a watch::Sender<usize>);

impl<'a> InFlight<'a> {
    pub(super) fn enter(counter: &'a watch::Sender<usize>) -> Self {
        counter.send_modify(|n| *n += 1);
        InFlight(counter)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}
