//! Sessions of clients on the stateless 2026-07-28 protocol over HTTP. That protocol has no
//! MCP session, so a cordis session travels as an explicit handle, as the specification
//! asks of state that spans requests: the server mints it (a 128-bit random name, after the
//! host's `--instance` name so a proxy can route it) on a call that names none, says it in
//! the result's `_meta` under [`HANDLE_META`], and the client names it in the `_meta` of its
//! next calls (or in the [`HANDLE_HEADER`] header, which a proxy can see). A handle is bound
//! to the bearer token that made it: another client's calls with it are refused, as are
//! calls with a handle this host does not know (ended after the idle timeout, or made before
//! a restart), saying so. A session whose handle no call has named again is the first to
//! make room at `--max-sessions`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use rmcp::model::{CallToolResponse, MetaObject};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::ErrorData;

use cordis_engine::SessionStart;

use super::{hex, lock, random_bytes, Hub, McpServer, Shared};

/// The `_meta` key a 2026-07-28 client names its session by, and the server says it by.
pub const HANDLE_META: &str = "cordis/session";

/// The header a client may name its session by instead (for a proxy to route on).
pub const HANDLE_HEADER: &str = "cordis-session";

/// Whose a request, and so a session, is: the bearer token it came with (its place in the
/// server's list), or an access token's subject (`iss` and `sub`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Principal(Arc<str>);

impl Principal {
    pub(crate) fn token(index: usize) -> Principal {
        Principal(format!("token {index}").into())
    }

    pub(crate) fn subject(subject: &str) -> Principal {
        Principal(format!("subject {subject}").into())
    }
}

struct Handle {
    shared: Arc<Shared>,
    principal: Option<Principal>,
    last: Instant,
    /// A call named the handle after the one that made it.
    continued: bool,
}

/// The live sessions of 2026-07-28 clients, by handle.
#[derive(Default)]
pub(crate) struct Handles {
    map: Mutex<HashMap<String, Handle>>,
    /// `NAME.` of `--instance NAME`, or empty.
    prefix: OnceLock<String>,
    /// `--max-sessions` (all sessions of the server together).
    max_sessions: AtomicUsize,
}

impl Handles {
    /// Handles that start with `instance.`, within `max_sessions` sessions in all.
    pub(crate) fn configure(&self, instance: Option<&str>, max_sessions: usize) {
        let _ = self
            .prefix
            .set(instance.map(|i| format!("{i}.")).unwrap_or_default());
        self.max_sessions.store(max_sessions, Ordering::Relaxed);
    }

    /// Ends the sessions no call has named for `idle` (none with a call in flight).
    pub(crate) fn sweep(&self, idle: Duration) {
        let ended: Vec<Handle> = {
            let mut map = lock(&self.map);
            let expired: Vec<String> = map
                .iter()
                .filter(|(_, h)| h.last.elapsed() >= idle && h.shared.is_idle())
                .map(|(k, _)| k.clone())
                .collect();
            expired.iter().filter_map(|k| map.remove(k)).collect()
        };
        // Dropped outside the lock: a session's end logs and unbinds its approvals.
        drop(ended);
    }
}

/// The handle a request names, from its `_meta` or its header (which must agree).
pub(crate) fn named(context: &RequestContext<RoleServer>) -> Result<Option<String>, ErrorData> {
    let in_meta = match context.meta.get(HANDLE_META) {
        None => None,
        Some(serde_json::Value::String(s)) => Some(s.clone()),
        Some(other) => {
            return Err(ErrorData::invalid_params(
                format!(
                    "`_meta.\"{HANDLE_META}\"` must be a session handle (a string), not {other}"
                ),
                None,
            ))
        }
    };
    let in_header = context
        .extensions
        .get::<http::request::Parts>()
        .and_then(|p| p.headers.get(HANDLE_HEADER))
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    match (in_meta, in_header) {
        (Some(m), Some(h)) if m != h => Err(ErrorData::invalid_params(
            format!(
                "the `{HANDLE_HEADER}` header names session `{h}` and `_meta.\"{HANDLE_META}\"` names `{m}`; name one session"
            ),
            None,
        )),
        (m, h) => Ok(m.or(h)),
    }
}

/// Whose the request is (the bearer token it came with).
pub(crate) fn principal(context: &RequestContext<RoleServer>) -> Option<Principal> {
    context
        .extensions
        .get::<http::request::Parts>()
        .and_then(|p| p.extensions.get::<Principal>())
        .cloned()
}

/// Says the session's handle in a call's result.
pub(crate) fn label(response: &mut CallToolResponse, handle: &str) {
    let meta = match response {
        CallToolResponse::Complete(r) => &mut r.meta,
        CallToolResponse::InputRequired(r) => &mut r.meta,
        _ => return,
    };
    meta.get_or_insert_with(|| MetaObject(Default::default()))
        .0
        .insert(
            HANDLE_META.to_string(),
            serde_json::Value::String(handle.to_string()),
        );
}

impl Hub {
    /// The handle sealed in a parked call's `requestState` (see [`McpServer::binding`]),
    /// if it opens for this tool and these arguments.
    pub(crate) fn handle_in_state(
        &self,
        state: &str,
        request: &rmcp::model::CallToolRequestParams,
    ) -> Option<String> {
        let args = serde_json::Value::Object(request.arguments.clone().unwrap_or_default());
        let binding = super::stateless_binding(&request.name, &args);
        self.codec
            .open_json_with::<super::ParkState>(state, &binding)
            .ok()
            .and_then(|s| s.handle)
    }

    /// The session a 2026-07-28 call runs in: the one `named` (it must be `principal`'s),
    /// or a new one at the fallback root.
    pub(crate) fn stateless_session(
        self: &Arc<Self>,
        named: Option<String>,
        principal: Option<Principal>,
    ) -> Result<(String, McpServer), ErrorData> {
        if let Some(handle) = named {
            let mut map = lock(&self.handles.map);
            return match map.get_mut(&handle) {
                Some(h) if h.principal == principal => {
                    h.last = Instant::now();
                    h.continued = true;
                    Ok((
                        handle,
                        McpServer {
                            shared: h.shared.clone(),
                        },
                    ))
                }
                _ => Err(ErrorData::invalid_params(
                    format!(
                        "this host has no session `{handle}` of this client: it ended after {} s without calls, or the host restarted, or another client's token made it; call without `_meta.\"{HANDLE_META}\"` to start a new session",
                        self.idle_timeout().as_secs()
                    ),
                    Some(serde_json::json!({ "session": handle })),
                )),
            };
        }
        self.make_room()?;
        let server = McpServer::attach(self.clone());
        let (root, why) = self
            .rooting
            .choose(Err("a 2026-07-28 client offers no roots".to_string()));
        let why =
            format!("{why} (a 2026-07-28 client; its handle is said in each result's `_meta`)");
        let session = server
            .open(SessionStart::ForOneCall(&root), &why)
            .map_err(|e| {
                ErrorData::internal_error(
                    format!(
                        "failed to create a session rooted at {}: {e}",
                        root.display()
                    ),
                    None,
                )
            })?;
        let random = random_bytes(16).map_err(|e| {
            ErrorData::internal_error(format!("cannot make a session handle: {e}"), None)
        })?;
        let handle = format!(
            "{}{}",
            self.handles.prefix.get().map(String::as_str).unwrap_or(""),
            hex(&random)
        );
        let _ = server.shared.handle.set(handle.clone());
        server.adopt(session);
        lock(&self.handles.map).insert(
            handle.clone(),
            Handle {
                shared: server.shared.clone(),
                principal,
                last: Instant::now(),
                continued: false,
            },
        );
        Ok((handle, server))
    }

    /// Room for one more session under `--max-sessions`: at the cap, the oldest session of
    /// a 2026-07-28 client that no call named again (and none runs in) ends.
    fn make_room(&self) -> Result<(), ErrorData> {
        let max = self.handles.max_sessions.load(Ordering::Relaxed);
        let max = if max == 0 { usize::MAX } else { max };
        // Every session: those of MCP sessions and these.
        let live = self.connections();
        if live < max {
            return Ok(());
        }
        let evicted = {
            let mut map = lock(&self.handles.map);
            let oldest = map
                .iter()
                .filter(|(_, h)| !h.continued && h.shared.is_idle())
                .min_by_key(|(_, h)| h.last)
                .map(|(k, _)| k.clone());
            oldest.and_then(|k| map.remove(&k))
        };
        match evicted {
            Some(h) => {
                drop(h);
                Ok(())
            }
            None => Err(ErrorData::internal_error(
                format!(
                    "the server has {live} sessions live, the most it keeps (--max-sessions {max}); retry when one has ended"
                ),
                None,
            )),
        }
    }
}
