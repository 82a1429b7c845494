//! The MCP handler of one connection (`McpServer`), the connection's shared state
//! (`Shared`: its session, calls, parked approvals), and the conversions to rmcp's types.

use super::*;

/// One connection (on HTTP: one MCP session) and its cordis session.
pub(super) struct Shared {
    pub(super) hub: Arc<Hub>,
    /// The connection's id in the hub.
    pub(super) id: u64,
    /// The cordis session, once the first call (or `--session`) settled it.
    pub(super) session: tokio::sync::OnceCell<OpenSession>,
    /// Per call id: where that call's approval requests go.
    pub(super) calls: Mutex<HashMap<String, mpsc::UnboundedSender<Ask>>>,
    /// Per running call id: the write end of its cancel pipe. Removing it cancels the call
    /// (the tool sees end of file on `CallContext::cancel_fd`).
    pub(super) cancels: Mutex<HashMap<String, std::os::fd::OwnedFd>>,
    pub(super) parked: Mutex<HashMap<u64, Parked>>,
    /// The model context the client was last shown.
    pub(super) shown: Mutex<String>,
    /// The client, once it completed the handshake (told about tool-list changes).
    pub(super) peer: std::sync::OnceLock<Peer<RoleServer>>,
    /// The MCP session id (HTTP), once a request carried it.
    pub(super) mcp_session: std::sync::OnceLock<String>,
    /// The handle of a 2026-07-28 client's session over HTTP ([`handles`]).
    pub(super) handle: std::sync::OnceLock<String>,
    /// The tools whose calls the protocol's thread waits for spinning.
    pub(super) quick: Quick,
}

impl Shared {
    /// Whether none of this connection's calls is running (a parked one counts as running).
    pub(super) fn is_idle(&self) -> bool {
        lock(&self.cancels).is_empty()
    }

    /// Cancels every call of this connection in flight (the tools see end of file on their
    /// cancel descriptors; a running command is killed); how many there were.
    pub(super) fn cancel_calls(&self) -> usize {
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
        // The session's approval route ends with it (`OpenSession`).
        if let Some(session) = self.session.get().map(OpenSession::info) {
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
    pub(super) shared: Arc<Shared>,
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
            quick: Quick::default(),
        });
        lock(&shared.hub.live).insert(id, Arc::downgrade(&shared));
        McpServer { shared }
    }

    /// Learns the MCP session id from a request's HTTP headers (not on the `initialize`
    /// request: its answer assigns the id).
    pub(super) fn learn_mcp_session(&self, extensions: &rmcp::model::Extensions) {
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

    pub(super) fn runtime(&self) -> &Runtime {
        &self.shared.hub.runtime
    }

    /// Makes `session` this connection's session.
    pub(super) fn adopt(&self, session: OpenSession) {
        let _ = self.shared.session.set(session);
    }

    /// Opens a session at `start` whose approvals are asked through this connection, and
    /// says why.
    pub(super) fn open(
        &self,
        start: SessionStart<'_>,
        why: &str,
    ) -> Result<OpenSession, SessionError> {
        let session = self.runtime().open_session(start, Some(self.asker()))?;
        let info = session.info();
        tracing::info!(session = %info.id, cwd = %info.cwd.display(), "mcp session: {why}");
        Ok(session)
    }

    /// The connection's session: settled by the first call, rooted at the client's first
    /// root when it supports roots and that root is allowed.
    pub(super) async fn session(
        &self,
        context: &RequestContext<RoleServer>,
    ) -> Result<SessionInfo, String> {
        if let Some(settled) = self.shared.session.get() {
            return Ok(settled.info().clone());
        }
        // Boxed: only the first call waits for the client's roots, and what a future holds
        // is copied whole each time it moves (into its task, say).
        Box::pin(self.shared.session.get_or_try_init(|| async {
            let roots = client_roots(context).await;
            let (root, why) = self.shared.hub.rooting.choose(roots);
            self.open(SessionStart::New(&root), &why).map_err(|e| {
                format!(
                    "failed to create a session rooted at {}: {e}",
                    root.display()
                )
            })
        }))
        .await
        .map(|s| s.info().clone())
    }

    /// The asker bound to this connection's session: hands the request to the `tools/call`
    /// whose call id asked, and blocks (on the tool's thread) until it is answered.
    pub(super) fn asker(&self) -> Asker {
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
    pub(super) fn context_now(&self) -> String {
        let session = self.shared.session.get().map(|s| s.info().id.as_str());
        self.runtime().model_context(session)
    }

    /// Records the context sent with `initialize`/`discover` as shown.
    pub(super) fn mark_shown(&self, instructions: Option<&str>) {
        *lock(&self.shared.shown) = instructions.unwrap_or_default().to_string();
    }

    pub(super) fn next_id(&self) -> u64 {
        self.shared.hub.next_id()
    }
}

/// The URIs of the client's roots, when it supports roots and is asked in a handshake-era
/// connection (2026-07-28 has no server-to-client requests); `Err` says why there are none.
#[allow(deprecated)] // roots/list is deprecated in 2026-07-28, current before it
pub(super) async fn client_roots(
    context: &RequestContext<RoleServer>,
) -> Result<Vec<String>, String> {
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

pub(super) fn is_modern(context: &RequestContext<RoleServer>) -> bool {
    context
        .protocol_version()
        .is_some_and(|v| v.as_str() >= ProtocolVersion::V_2026_07_28.as_str())
}

pub(super) fn as_tool(info: cordis_engine::ToolInfo) -> Tool {
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

/// Ends a request's span with its outcome.
fn finish_span<T>(span: crate::traces::Operation, result: &Result<T, ErrorData>) {
    match result {
        Ok(_) => span.finish(None, None),
        Err(e) => span.finish(Some(&e.code.0.to_string()), Some(e.code.0)),
    }
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
        let span = self.span("initialize", None, &context);
        context.peer.set_peer_info(request.clone());
        let result = self.negotiate_initialize(&request);
        if let Ok(result) = &result {
            self.mark_shown(result.instructions.as_deref());
            let _ = self.shared.peer.set(context.peer.clone());
        }
        finish_span(span, &result);
        result
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
        match self.shared.session.get().map(OpenSession::info) {
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
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let span = self.span("tools/list", None, &context);
        let tools = self.runtime().tools().into_iter().map(as_tool).collect();
        span.finish(None, None);
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let timer = crate::metrics::metrics().call(&request.name);
        let span = self.span("tools/call", Some(&request.name), &context);
        let response = self.answer_call(request, context).await;
        let code;
        let error = match &response {
            Ok(CallToolResponse::Complete(r)) if r.is_error == Some(true) => {
                Some(crate::metrics::TOOL_ERROR)
            }
            Ok(_) => None,
            Err(e) => {
                code = e.code.0.to_string();
                Some(code.as_str())
            }
        };
        timer.finish(error);
        span.finish(error, response.as_ref().err().map(|e| e.code.0));
        response
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
    /// The trace span of a request ([`crate::traces`]; nothing when traces are off).
    fn span(
        &self,
        method: &'static str,
        tool: Option<&str>,
        context: &RequestContext<RoleServer>,
    ) -> crate::traces::Operation {
        crate::traces::start(crate::traces::Request {
            method,
            tool,
            meta: &context.meta.0 .0,
            id: &context.id,
            session: self.shared.mcp_session.get().map(String::as_str),
            protocol: context
                .meta
                .protocol_version()
                .or_else(|| context.peer.peer_info().map(|i| i.protocol_version.clone()))
                .map(|v| v.to_string()),
        })
    }

    /// A `tools/call` request, answered.
    async fn answer_call(
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
            let Some(session) = server.shared.session.get().map(|s| s.info().clone()) else {
                return Ok(error_result("the session has no root yet".into()));
            };
            // Boxed, as every path but a plain call's is: a task's future is as large as its
            // largest path, and is copied whole each time it moves (into its task, say).
            let mut response = Box::pin(server.run(&session, request, &context)).await;
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

    /// Runs `request` in `session`: a retry carrying an approval answer resumes its
    /// parked call, anything else starts one.
    pub(super) async fn run(
        &self,
        session: &SessionInfo,
        request: CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> CallToolResponse {
        let args = serde_json::Value::Object(request.arguments.clone().unwrap_or_default());
        if let Some(state) = request.request_state.clone() {
            return Box::pin(self.resume(session, &request, &state, &args, context)).await;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_is_listed_with_its_schema_annotations_and_output_schema() {
        let tool = as_tool(cordis_engine::ToolInfo {
            name: "read".into(),
            description: "reads".into(),
            input_schema: serde_json::json!({"type": "object", "properties": {"path": {"type": "string"}}}),
            annotations: Some(serde_json::json!({"readOnlyHint": true})),
            output_schema: Some(serde_json::json!({"type": "object"})),
        });
        let listed = serde_json::to_value(&tool).unwrap();
        assert_eq!(listed["name"], "read");
        assert_eq!(
            listed["inputSchema"]["properties"]["path"]["type"],
            "string"
        );
        assert_eq!(listed["annotations"]["readOnlyHint"], true);
        assert_eq!(listed["outputSchema"]["type"], "object");
        // A schema that is not an object is listed as an object schema, never dropped.
        let bare = as_tool(cordis_engine::ToolInfo {
            name: "x".into(),
            description: String::new(),
            input_schema: serde_json::json!(true),
            annotations: Some(serde_json::json!("not annotations")),
            output_schema: None,
        });
        let listed = serde_json::to_value(&bare).unwrap();
        assert_eq!(listed["inputSchema"], serde_json::json!({"type": "object"}));
        assert!(listed.get("annotations").is_none() && listed.get("outputSchema").is_none());
    }
}
