//! The MCP sessions of one HTTP server: rmcp's in-memory sessions, with ids that name the
//! host (`--instance NAME`: `NAME.<uuid>`), so a proxy in front of several hosts routes
//! every request of a session to the host that made it by the id alone.

use std::sync::Arc;

use futures_core::Stream;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::common::server_side_http::session_id;
use rmcp::transport::streamable_http_server::session::local::{
    create_local_session, LocalSessionManager, LocalSessionManagerError, LocalSessionWorker,
};
use rmcp::transport::streamable_http_server::session::{
    EventStore, RestoreOutcome, ServerSseMessage, SessionId, SessionManager,
};
use rmcp::transport::WorkerTransport;

/// rmcp's local sessions, each id starting with the instance name when there is one.
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    inner: LocalSessionManager,
    /// `NAME.`, or empty.
    prefix: String,
}

impl Sessions {
    /// Sessions whose ids start with `instance.` (none: plain ids), ending after
    /// `keep_alive` without requests.
    pub(crate) fn new(instance: Option<&str>, keep_alive: std::time::Duration) -> Sessions {
        let mut inner = LocalSessionManager::default();
        inner.session_config.keep_alive = Some(keep_alive);
        Sessions {
            inner,
            prefix: instance.map(|i| format!("{i}.")).unwrap_or_default(),
        }
    }
}

/// Checks an instance name: what a session id may start with and a proxy's pattern can
/// match (letters, digits, `-`, `_`; at most 32).
pub fn check_instance(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 32
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "`{name}` is not an instance name: use 1 to 32 letters, digits, `-` or `_` (it starts every session id, for a proxy to route by)"
        ))
    }
}

impl SessionManager for Sessions {
    type Error = LocalSessionManagerError;
    type Transport = WorkerTransport<LocalSessionWorker>;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let id: SessionId = format!("{}{}", self.prefix, session_id()).into();
        let (handle, worker) = create_local_session(id.clone(), self.inner.session_config.clone());
        self.inner.sessions.write().await.insert(id.clone(), handle);
        Ok((id, WorkerTransport::spawn(worker)))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        self.inner.initialize_session(id, message).await
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        self.inner.has_session(id).await
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        self.inner.close_session(id).await
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.inner.create_stream(id, message).await
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        self.inner.accept_message(id, message).await
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.inner.create_standalone_stream(id).await
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.inner.resume(id, last_event_id).await
    }

    async fn restore_session(
        &self,
        id: SessionId,
    ) -> Result<RestoreOutcome<Self::Transport>, Self::Error> {
        self.inner.restore_session(id).await
    }

    fn event_store(&self) -> Option<Arc<dyn EventStore>> {
        self.inner.event_store()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_ids_name_their_instance() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let named = Sessions::new(Some("host-a"), std::time::Duration::from_secs(60));
            let (id, _transport) = named.create_session().await.unwrap();
            let (prefix, uuid) = id.split_once('.').unwrap();
            assert_eq!(prefix, "host-a");
            assert_eq!(uuid.len(), 36);
            assert!(named.has_session(&id).await.unwrap());
            let plain = Sessions::new(None, std::time::Duration::from_secs(60));
            let (id, _transport) = plain.create_session().await.unwrap();
            assert!(!id.contains('.') && id.len() == 36, "{id}");
        });
    }

    #[test]
    fn instance_names_are_checked() {
        assert!(check_instance("a").is_ok());
        assert!(check_instance("host_2-b").is_ok());
        for bad in ["", "a.b", "a b", "ä", &"x".repeat(33)] {
            assert!(check_instance(bad).is_err(), "{bad}");
        }
    }
}
