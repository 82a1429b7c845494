//! Services the host itself provides to every composition. Plugins inject them by name like
//! any other service; the host implements them.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The registry name of the host's session store.
pub const SESSIONS: &str = "sessions";

/// Error codes of the host's services (`Error::code`).
pub mod codes {
    crate::error_codes! {
        /// No session has this id (`cordis session list` shows them).
        SESSION_NOT_FOUND;
        /// A session log could not be read or written (an I/O error or a corrupt line), or
        /// the session's cwd is not a usable directory.
        SESSION_STORE;
        /// A service call named a session (or a tool call) other than the one it is made
        /// for, as the host set it ([`crate::host::CurrentCall`]): a plugin acts only for
        /// the session that is calling it.
        SESSION_NOT_CALLING;
    }
}

/// The session a tool call runs in, as the host hands it to the tool.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SessionInfo {
    /// The session id.
    pub id: String,
    /// The session's immutable, canonical working directory.
    pub cwd: PathBuf,
    /// The identity of that directory when the session was created (device and inode), so
    /// a consumer can check that `cwd` still names the same directory; `None` in logs
    /// written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd_id: Option<(u64, u64)>,
}

/// One event in a session log.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SessionEvent {
    /// Position in the log, from 1.
    pub seq: u64,
    /// The event kind, e.g. `sandbox/mode`.
    pub kind: String,
    /// The event's payload.
    pub data: serde_json::Value,
}

/// Which events to read.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct EventQuery {
    /// The session id.
    pub session: String,
    /// Only events of this kind, when set.
    pub kind: Option<String>,
}

/// An event to append.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct NewEvent {
    /// The session id.
    pub session: String,
    /// The event kind.
    pub kind: String,
    /// The payload.
    pub data: serde_json::Value,
}

crate::interface! {
    /// The host's append-only session logs. Appends are durable before `append` returns.
    pub trait Sessions as SessionsClient ("cordis.sessions", 1) {
        /// The session's header.
        fn info(&self, id: String) -> SessionInfo;
        /// The session's events, oldest first.
        fn events(&self, query: EventQuery) -> Vec<SessionEvent>;
        /// Appends one event; returns its sequence number.
        fn append(&self, event: NewEvent) -> u64;
    }
}

/// The registry name of the host's description of the running composition.
pub const COMPOSITION: &str = "composition";

crate::interface! {
    /// What the host knows about the composition it runs, for plugins that must protect it.
    pub trait Composition as CompositionClient ("cordis.composition", 1) {
        /// The canonical paths that define the running composition: the manifest, every
        /// plugin library and the directories libraries are looked for in, the state
        /// directory, and with `cordis run --dev` the plugin packages it rebuilds and their
        /// target directory. Recomputed before every reload loads a library.
        fn protected_paths(&self, unit: ()) -> Vec<std::path::PathBuf>;
        /// The host's state directory (canonical): session logs, status files, library
        /// copies.
        fn state_dir(&self, unit: ()) -> std::path::PathBuf;
    }
}

/// The registry name of the host's approval service.
pub const APPROVAL: &str = "approval";

/// A request for a person's approval, bound to one tool call.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ApprovalRequest {
    /// The calling session.
    pub session: String,
    /// The tool call this approval is for; an answer is valid for this call only.
    pub call_id: String,
    /// The tool asking.
    pub tool: String,
    /// What would be done, in one line, for the person deciding.
    pub summary: String,
    /// The whole request as the person must see it before deciding (the full command, the
    /// content or diff of a write or edit); may span lines. Agent-supplied: the approver
    /// shows it escaped and set apart, so it cannot forge the prompt's own lines.
    #[serde(default)]
    pub detail: String,
    /// Why the model says it needs it.
    pub justification: String,
    /// What a grant allows, when the request is an escalation (a sandbox mode for this
    /// call) or a host for the network allowlist (`network:HOST:PORT`): the host records a
    /// granted one in the call's context ([`CurrentCall::approved_modes`]) so the policy
    /// owner can tell an approved grant from a claimed one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
}

/// How a person answered.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ApprovalOutcome {
    /// Granted.
    Approved,
    /// Refused.
    Rejected,
    /// The person dismissed the request.
    Cancelled,
    /// Nobody can be asked (no interactive front-end).
    Unavailable,
}

crate::interface! {
    /// Asks the person behind the active front-end to approve one action.
    pub trait Approval as ApprovalClient ("cordis.approval", 1) {
        /// Blocks until the person answers (or the front-end cannot ask).
        fn request(&self, request: ApprovalRequest) -> ApprovalOutcome;
    }
}

/// The registry name of the host's answer to "which call is this thread serving?".
pub const CALL_CONTEXT: &str = "callContext";

/// The call a service provider is serving, as the host set it — never as a caller claims
/// it in its arguments. The host sets it around every tool call, every model-context
/// request and every call that crosses to or from an isolated entry's process; it follows
/// nested service calls on the calling thread (a thread the plugin starts itself has
/// none, except in an isolated process, where the host answers such calls as outside any
/// session).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct CurrentCall {
    /// The calling session; `None` outside any session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// The tool call ([`crate::CallContext::call_id`]); `None` outside a tool call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    /// The call's cancel descriptor, in this process (readable once the call is cancelled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel_fd: Option<i32>,
    /// The call's progress descriptor, in this process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_fd: Option<i32>,
    /// When the call must be over, in milliseconds since the Unix epoch (an isolated
    /// entry's `callTimeout`); `None` without a deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    /// The isolated entry this call came from, when it crossed from an isolated process to
    /// the provider: a caller-resolved argument (`fs`'s `policy`) is then not trusted, and
    /// the provider resolves it itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolated_caller: Option<String>,
    /// The call came from another process (an isolated entry's, or the host's to one):
    /// descriptor numbers in its arguments are not this process's — use
    /// [`CurrentCall::cancel_fd`] and [`CurrentCall::progress_fd`].
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub crossed: bool,
    /// What a person approved for this call through the host's `approval` service
    /// ([`ApprovalRequest::mode`]: sandbox modes and `network:HOST:PORT` grants), in the
    /// order granted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approved_modes: Vec<String>,
    /// The calling session's log as the call started: the sequence number of its last
    /// event (0 with none), appends from other processes included. Equal numbers for a
    /// session mean no event was recorded in between, so what a provider derived from the
    /// log may be reused; `None` when the host did not read it (then derive afresh).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_seq: Option<u64>,
    /// The composition as the call started: a number that changes whenever what the
    /// host's `composition` service answers may have (a reload planned, a path protected).
    /// `None` when the host did not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub composition: Option<u64>,
}

crate::interface! {
    /// The context of the call the calling thread serves, as the host set it.
    pub trait CallContextService as CallContextClient ("cordis.call-context", 1) {
        /// The current call; `None` when the host set none (a thread the plugin started
        /// itself in the host's process, or a host command such as `cordis session
        /// set-mode`, which acts for the session it names).
        fn current(&self, unit: ()) -> Option<CurrentCall>;
    }
}

/// The interface identity of model-context contributions (see [`ModelContext`]).
pub const MODEL_CONTEXT_INTERFACE: &str = "cordis.context";

crate::interface! {
    /// A contribution to what the model is told about its situation. Front-ends collect every
    /// service implementing this interface (whatever its registry name, conventionally the
    /// contribution's key such as `sandbox:policy`) and show the non-empty texts to the model.
    pub trait ModelContext as ModelContextClient ("cordis.context", 1) {
        /// The text for a session (`None`: no session); empty when there is nothing to say.
        fn context(&self, session: Option<String>) -> String;
    }
}

/// The registry name of the host's record of what tools tell their clients.
pub const TOOL_EXTRAS: &str = "toolExtras";

/// What a tool declares besides its decl (see [`crate::ToolOptions`]).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ToolDescription {
    /// The tool's name.
    pub tool: String,
    /// Its MCP annotations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<crate::ToolAnnotations>,
    /// The JSON Schema of its structured content (an object schema).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<serde_json::Value>,
}

/// The structured content of one call's result.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct StructuredContent {
    /// The call (`CallContext::call_id`).
    pub call_id: String,
    /// The content, a JSON object.
    pub content: serde_json::Value,
}

crate::interface! {
    /// What tools tell their clients beyond a name, a description, an input schema and
    /// text: annotations, output schemas and structured results. A host service, not part
    /// of the ABI's types, so libraries built before it load on hosts that have it and the
    /// other way round (then it is simply absent); the SDK uses it on the author's behalf
    /// ([`crate::Context::register_tool_with`], [`crate::ToolResult::with_structured`]).
    pub trait ToolExtras as ToolExtrasClient ("cordis.tool-extras", 1) {
        /// Describes the tool the plugin registers next under `description.tool`.
        fn describe(&self, description: ToolDescription) -> ();
        /// Records the structured content of a call in flight, for its result.
        fn structured(&self, content: StructuredContent) -> ();
    }
}
