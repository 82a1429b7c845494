//! The MCP sessions of one HTTP server: rmcp's in-memory sessions, with ids that name the
//! host (`--instance NAME`: `NAME.<uuid>`), so a proxy in front of several hosts routes
//! every request of a session to the host that made it by the id alone.

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

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
use tokio::sync::mpsc;

/// rmcp's local sessions, each id starting with the instance name when there is one, with
/// the events of their request streams kept for a client that resumes one ([`Relay`]).
#[derive(Default)]
pub(crate) struct Sessions {
    inner: LocalSessionManager,
    /// `NAME.`, or empty.
    prefix: String,
    relays: Arc<Relays>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions")
            .field("prefix", &self.prefix)
            .finish()
    }
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
            relays: Arc::default(),
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
        self.relays.lock().retain(|(session, _), _| session != id);
        self.inner.close_session(id).await
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.relays.sweep();
        let events = self.inner.create_stream(id, message).await?;
        Ok(self.relay(id, events))
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
        self.relays.sweep();
        if let Some(events) = self.replay(id, &last_event_id) {
            return Ok(Box::pin(events) as Boxed);
        }
        Ok(Box::pin(self.inner.resume(id, last_event_id).await?) as Boxed)
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

/// How long the events of a finished request stream stay for a client that resumes it.
const REPLAY_FOR: Duration = Duration::from_secs(60);
/// The most events kept per request stream (a call's progress, its requests, its answer).
const EVENTS_PER_STREAM: usize = 512;
/// The most finished request streams kept for resumption, all sessions together.
const FINISHED_STREAMS: usize = 4096;

/// The events of one POST's response stream, kept until it is resumed or expires: rmcp
/// drops an event sent while the stream's connection is gone (a proxy closed it, the
/// network dropped it), so without them a call's answer would be lost to a client that
/// resumes with `Last-Event-ID`, which would then wait for it forever.
#[derive(Default)]
struct Relay {
    events: VecDeque<ServerSseMessage>,
    /// The connection the events go to now; `None` while none is.
    live: Option<mpsc::Sender<ServerSseMessage>>,
    finished: Option<Instant>,
}

/// The request streams of every session, by session and rmcp's HTTP request id (the part
/// after `/` of their event ids).
#[derive(Default)]
struct Relays {
    streams: Mutex<Streams>,
    /// When the finished streams were last swept (at most every [`SWEEP_EVERY`]).
    swept: Mutex<Option<Instant>>,
}

/// The relayed streams, by session and HTTP request id.
type Streams = HashMap<(SessionId, String), Arc<Mutex<Relay>>>;

/// How often the finished streams are swept.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

impl Relays {
    fn lock(&self) -> std::sync::MutexGuard<'_, Streams> {
        self.streams.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Forgets the finished streams past [`REPLAY_FOR`], and the oldest beyond
    /// [`FINISHED_STREAMS`].
    fn sweep(&self) {
        {
            let mut swept = self.swept.lock().unwrap_or_else(|e| e.into_inner());
            if swept.is_some_and(|at| at.elapsed() < SWEEP_EVERY) {
                return;
            }
            *swept = Some(Instant::now());
        }
        let mut relays = self.lock();
        let mut finished: Vec<(Instant, (SessionId, String))> = relays
            .iter()
            .filter_map(|(k, r)| lock(r).finished.map(|at| (at, k.clone())))
            .collect();
        finished.sort();
        let excess = finished.len().saturating_sub(FINISHED_STREAMS);
        for (i, (at, key)) in finished.into_iter().enumerate() {
            if i < excess || at.elapsed() >= REPLAY_FOR {
                relays.remove(&key);
            }
        }
    }
}

fn lock(relay: &Mutex<Relay>) -> std::sync::MutexGuard<'_, Relay> {
    relay.lock().unwrap_or_else(|e| e.into_inner())
}

/// `index/http_request_id` of a request stream's event id.
fn request_event(event_id: &str) -> Option<(u64, &str)> {
    let (index, request) = event_id.split_once('/')?;
    Some((index.parse().ok()?, request))
}

/// A stream of the events sent to `rx`.
struct Events(mpsc::Receiver<ServerSseMessage>);

impl Stream for Events {
    type Item = ServerSseMessage;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(cx)
    }
}

type Boxed = Pin<Box<dyn Stream<Item = ServerSseMessage> + Send + Sync + 'static>>;

impl Sessions {
    /// Relays rmcp's events of one POST to its connection, keeping each (see [`Relay`]);
    /// rmcp's stream is read to its end whether or not the connection stays.
    fn relay(
        &self,
        session: &SessionId,
        events: impl Stream<Item = ServerSseMessage> + Send + 'static,
    ) -> Events {
        let (tx, rx) = mpsc::channel(64);
        let relays = self.relays.clone();
        let session = session.clone();
        tokio::spawn(async move {
            let mut events = std::pin::pin!(events);
            let relay = Arc::new(Mutex::new(Relay {
                live: Some(tx),
                ..Relay::default()
            }));
            let mut registered = false;
            while let Some(event) = std::future::poll_fn(|cx| events.as_mut().poll_next(cx)).await {
                if !registered {
                    if let Some((_, request)) = event.event_id.as_deref().and_then(request_event) {
                        relays
                            .lock()
                            .insert((session.clone(), request.to_string()), relay.clone());
                        registered = true;
                    }
                }
                let live = {
                    let mut r = lock(&relay);
                    if r.events.len() >= EVENTS_PER_STREAM {
                        r.events.pop_front();
                    }
                    r.events.push_back(event.clone());
                    r.live.clone()
                };
                if let Some(live) = live {
                    if live.send(event).await.is_err() {
                        // The connection is gone; the events wait for a resume.
                        let mut r = lock(&relay);
                        if r.live.as_ref().is_some_and(|l| l.same_channel(&live)) {
                            r.live = None;
                        }
                    }
                }
            }
            let mut r = lock(&relay);
            r.finished = Some(Instant::now());
            r.live = None;
        });
        Events(rx)
    }

    /// The events of a request stream after `last_event_id`, then the rest as they come,
    /// when this server relays that stream.
    fn replay(&self, session: &SessionId, last_event_id: &str) -> Option<Events> {
        let (after, request) = request_event(last_event_id)?;
        let relay = self
            .relays
            .lock()
            .get(&(session.clone(), request.to_string()))
            .cloned()?;
        let mut r = lock(&relay);
        let missed: Vec<ServerSseMessage> = r
            .events
            .iter()
            .filter(|e| {
                e.event_id
                    .as_deref()
                    .and_then(request_event)
                    .is_some_and(|(index, _)| index > after)
            })
            .cloned()
            .collect();
        let (tx, rx) = mpsc::channel(missed.len() + 64);
        for event in missed {
            // Room was made for every one.
            let _ = tx.try_send(event);
        }
        if r.finished.is_none() {
            r.live = Some(tx);
        }
        Some(Events(rx))
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
