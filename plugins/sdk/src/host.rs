//! Services the host itself provides to every composition. Plugins inject them by name like
//! any other service; the host implements them.

use serde::{Deserialize, Serialize};

use crate::plugin::SessionInfo;

/// The registry name of the host's session store.
pub const SESSIONS: &str = "sessions";

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
