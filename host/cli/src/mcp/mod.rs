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
//! An approval also waits for an operator ([`crate::operator`]): a client without the
//! elicitation capability waits for one (with progress) instead of failing, and a
//! handshake-era client's elicitation races one (the first answer counts). Without either,
//! the answer is `unavailable`.

use std::collections::{HashMap, HashSet};
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

use cordis_engine::{Asker, OpenSession, Runtime, SessionError, SessionStart, UnknownTool};

mod approval;
mod call;
pub(crate) mod handles;
mod hub;
mod rooting;
mod server;
mod stdio;
mod wire;

use approval::*;
use call::*;
use rooting::*;
use server::*;

pub(crate) use hub::Hub;
use hub::InFlight;
pub(crate) use server::McpServer;
pub use stdio::{serve_io, serve_stdio, serve_stdio_with, Shutdown};

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
    /// Where approvals wait for a person outside the client ([`crate::operator`]); `None`:
    /// a call whose client cannot be asked gets `unavailable` at once.
    pub operator: Option<Arc<crate::operator::Operator>>,
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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `bytes` as lowercase hexadecimal.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
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
