//! The HTTP server's connections, bounded. Each accepted connection is served by hyper
//! here rather than by `axum::serve`, so that the server can bound them:
//!
//! - at most [`Bounds::max_connections`] at once (never more than the process's descriptor
//!   limit leaves room for); at the cap a new connection takes the place of the oldest one
//!   that has not yet made an authenticated request, and when every connection has, it is
//!   answered `503` with `Retry-After` and closed;
//! - a connection must make an authenticated request within [`Bounds::header_timeout`] of
//!   being accepted, or it is closed (idle or half-sent connections hold nothing);
//! - between requests a connection may stay idle for [`Bounds::keep_alive`] (hyper's
//!   header-read timeout, which runs only while it waits for the next request).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::ConnectInfo;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// The bounds of the server's connections.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// Connections at once.
    pub max_connections: usize,
    /// How long a new connection has to make an authenticated request.
    pub header_timeout: Duration,
    /// How long a connection may stay idle between requests.
    pub keep_alive: Duration,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            max_connections: 1024,
            header_timeout: Duration::from_secs(10),
            keep_alive: Duration::from_secs(300),
        }
    }
}

/// One connection, as its requests see it (in their extensions).
#[derive(Debug)]
pub(crate) struct Connection {
    id: u64,
    proven: AtomicBool,
    close: CancellationToken,
}

impl Connection {
    /// The connection made an authenticated request: it keeps its place at the cap.
    pub(crate) fn prove(&self) {
        self.proven.store(true, Ordering::Relaxed);
    }

    fn is_proven(&self) -> bool {
        self.proven.load(Ordering::Relaxed)
    }
}

/// The open connections.
#[derive(Debug, Default)]
pub(crate) struct Table {
    open: Mutex<BTreeMap<u64, Arc<Connection>>>,
    next: AtomicU64,
}

impl Table {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<Connection>>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many are open.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }

    /// A place for a new connection under `cap`: free, or taken from the oldest connection
    /// that has made no authenticated request (which is closed); `None` when every open
    /// connection has.
    fn admit(&self, cap: usize) -> Option<Arc<Connection>> {
        let mut open = self.lock();
        if open.len() >= cap && !evict_oldest_unproven(&mut open) {
            return None;
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Connection {
            id,
            proven: AtomicBool::new(false),
            close: CancellationToken::new(),
        });
        open.insert(id, conn.clone());
        Some(conn)
    }

    /// Closes the oldest connection that has made no authenticated request, if any.
    fn evict_one(&self) -> bool {
        evict_oldest_unproven(&mut self.lock())
    }

    fn remove(&self, id: u64) {
        self.lock().remove(&id);
    }
}

/// Closes and forgets the oldest of `open` that has made no authenticated request (ids
/// grow with age); whether there was one.
fn evict_oldest_unproven(open: &mut BTreeMap<u64, Arc<Connection>>) -> bool {
    let oldest = open.iter().find(|(_, c)| !c.is_proven()).map(|(id, _)| *id);
    match oldest.and_then(|id| open.remove(&id)) {
        Some(evicted) => {
            evicted.close.cancel();
            true
        }
        None => false,
    }
}

/// The most connections the descriptor limit leaves room for (the soft limit is raised to
/// the hard one first), keeping 128 descriptors for everything else.
pub(crate) fn descriptor_room() -> usize {
    // SAFETY: plain system calls on a local structure.
    let limit = unsafe {
        let mut rl: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) != 0 {
            return usize::MAX;
        }
        if rl.rlim_cur < rl.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: rl.rlim_max,
                rlim_max: rl.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                rl = raised;
            }
        }
        rl.rlim_cur
    };
    usize::try_from(limit)
        .unwrap_or(usize::MAX)
        .saturating_sub(128)
        .max(16)
}

/// Accepts and serves connections to `app` until `stop_accepting` is cancelled; then asks
/// every connection to finish its answer in progress and close (`graceful`) and returns
/// once they all have.
pub(crate) async fn serve(
    listener: TcpListener,
    app: axum::Router,
    bounds: Bounds,
    table: Arc<Table>,
    stop_accepting: CancellationToken,
) {
    let cap = bounds.max_connections.min(descriptor_room());
    if cap < bounds.max_connections {
        tracing::warn!(
            "serving at most {cap} connections at once (not {}): the descriptor limit leaves room for no more; raise it with `ulimit -n`",
            bounds.max_connections
        );
    }
    let graceful = CancellationToken::new();
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            _ = stop_accepting.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((tcp, peer)) => {
                // Answers are written in several small pieces (headers, an event, the end
                // of the stream): without TCP_NODELAY, Nagle's algorithm holds the last one
                // back until the client's delayed acknowledgement, 40 ms later.
                if let Err(e) = tcp.set_nodelay(true) {
                    tracing::debug!("cannot set TCP_NODELAY on a connection: {e}");
                }
                match table.admit(cap) {
                    Some(conn) => {
                        let (app, table, graceful) = (app.clone(), table.clone(), graceful.clone());
                        tasks.spawn(async move {
                            let id = conn.id;
                            serve_one(tcp, peer, conn, app, bounds, graceful).await;
                            table.remove(id);
                        });
                    }
                    None => {
                        tasks.spawn(refuse(tcp, peer, cap));
                    }
                }
            }
            // Out of descriptors: make room, then try again.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                if !table.evict_one() {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                tokio::task::yield_now().await;
            }
            Err(e) => {
                tracing::debug!("accepting a connection failed: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        // Reap the finished ones as we go.
        while tasks.try_join_next().is_some() {}
    }
    graceful.cancel();
    while tasks.join_next().await.is_some() {}
}

/// Serves one connection until it closes, is evicted, or the server shuts down.
async fn serve_one(
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    conn: Arc<Connection>,
    app: axum::Router,
    bounds: Bounds,
    graceful: CancellationToken,
) {
    let service = {
        let conn = conn.clone();
        hyper::service::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
            request.extensions_mut().insert(ConnectInfo(peer));
            request.extensions_mut().insert(conn.clone());
            let app = app.clone();
            async move {
                let response = app
                    .oneshot(request.map(axum::body::Body::new))
                    .await
                    .unwrap_or_else(|never: Infallible| match never {});
                Ok::<_, Infallible>(response)
            }
        })
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(bounds.keep_alive)
        .keep_alive(true);
    let served = builder.serve_connection(TokioIo::new(tcp), service);
    tokio::pin!(served);
    let unproven_until = tokio::time::sleep(bounds.header_timeout);
    tokio::pin!(unproven_until);
    let mut checked = false;
    let mut closing = false;
    loop {
        tokio::select! {
            finished = served.as_mut() => {
                if let Err(e) = finished {
                    tracing::debug!(%peer, "connection ended: {e}");
                }
                return;
            }
            _ = conn.close.cancelled() => {
                tracing::debug!(%peer, "closed a connection that made no authenticated request, for a new one");
                return;
            }
            _ = &mut unproven_until, if !checked => {
                checked = true;
                if !conn.is_proven() {
                    tracing::debug!(%peer, "closed a connection that made no authenticated request within {} s", bounds.header_timeout.as_secs());
                    return;
                }
            }
            _ = graceful.cancelled(), if !closing => {
                closing = true;
                served.as_mut().graceful_shutdown();
            }
        }
    }
}

/// Answers a connection over the cap `503` with `Retry-After`, and closes it.
async fn refuse(mut tcp: tokio::net::TcpStream, peer: SocketAddr, cap: usize) {
    tracing::warn!(%peer, "refused a connection: {cap} connections are open, each in use (503)");
    let body =
        format!("the server has {cap} connections open, each in use; retry in a few seconds\n");
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 5\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    // The request is read first and what follows drained after: a socket closed with
    // unread bytes is reset, and the client would never see the answer.
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let mut head = Vec::new();
        let mut buf = [0u8; 4096];
        while head.len() < 64 * 1024 && !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
        let _ = tcp.write_all(response.as_bytes()).await;
        let _ = tcp.shutdown().await;
        while let Ok(n) = tcp.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_the_cap_the_oldest_unproven_connection_makes_room() {
        let table = Table::default();
        let a = table.admit(2).unwrap();
        let b = table.admit(2).unwrap();
        a.prove();
        let c = table.admit(2).expect("b makes room");
        assert!(b.close.is_cancelled() && !a.close.is_cancelled());
        assert_eq!(table.len(), 2);
        c.prove();
        assert!(table.admit(2).is_none(), "every connection is in use");
        table.remove(a.id);
        assert!(table.admit(2).is_some());
        assert!(!table.evict_one() || table.len() == 1);
    }
}
