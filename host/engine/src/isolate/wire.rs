//! The wire between the host and an isolated entry's process: a unix stream socket pair
//! carrying length-prefixed JSON frames, requests in both directions matched to replies
//! by id, and a call's cancel and progress descriptors passed with it (`SCM_RIGHTS`).

use std::collections::HashMap;
use std::io::{IoSlice, IoSliceMut, Read as _, Write as _};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex};

use abi_stable::std_types::{RResult, RStr, RString};
use cordis_sdk::abi::{RError, ServiceBox};
use cordis_sdk::host::CurrentCall;
use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use serde::{Deserialize, Serialize};

use crate::scope::Scope;

/// The largest frame either side accepts (a tool's text result is the big one).
pub(crate) const MAX_FRAME: usize = 256 << 20;

/// The most descriptors one frame carries (a call's cancel and progress descriptors).
const MAX_FDS: usize = 2;

/// One message.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub(crate) enum Msg {
    /// Host → child: load the library and apply it.
    Apply {
        entry: String,
        library: std::path::PathBuf,
        config: String,
        /// The services it may inject, as the host provides them.
        injects: Vec<Injected>,
        /// The host's log level (1 = error .. 5 = trace; 0 = off).
        log_level: u8,
    },
    /// Either way: call `method` of service `name`. Host → child, `scope` is the call it
    /// is made for (its descriptors, named by `fds`, come with the frame); child → host,
    /// `within` names the host's request the child is answering when it calls (the host
    /// answers in that request's scope, never in one the child claims).
    Service {
        name: String,
        method: String,
        args: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        scope: Option<CurrentCall>,
        #[serde(default)]
        fds: CallFds,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        within: Option<u64>,
    },
    /// Host → child: run tool `tool` in `scope`; `fds` names which descriptors came with
    /// the frame.
    Tool {
        tool: String,
        context: String,
        args: String,
        fds: CallFds,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        scope: Option<CurrentCall>,
    },
    /// Host → child: offer a new config in place.
    Reconfigure { config: String },
    /// Host → child: run the plugin's disposers.
    Dispose,
    /// Child → host: a log event of the plugin (no reply).
    Log {
        level: u8,
        target: String,
        message: String,
    },
    /// The answer to request `id`.
    Reply {
        result: Result<serde_json::Value, WireError>,
    },
}

/// Which of a call's descriptors travel with a `Tool` or `Service` frame, in this order.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub(crate) struct CallFds {
    pub cancel: bool,
    pub progress: bool,
}

/// A service the isolated entry may inject.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Injected {
    pub name: String,
    pub interface: String,
    pub version: u32,
}

/// An error as it crosses the wire (an [`RError`]).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct WireError {
    pub code: String,
    pub message: String,
    #[serde(default)]
    pub help: Option<String>,
    #[serde(default)]
    pub data: String,
}

impl From<RError> for WireError {
    fn from(e: RError) -> Self {
        WireError {
            code: e.code.into(),
            message: e.message.into(),
            help: e.help.into_option().map(Into::into),
            data: e.data.into(),
        }
    }
}

impl From<WireError> for RError {
    fn from(e: WireError) -> Self {
        RError {
            code: e.code.into(),
            message: e.message.into(),
            help: e.help.map(Into::into).into(),
            data: e.data.into(),
        }
    }
}

impl WireError {
    pub(crate) fn new(code: &str, message: impl Into<String>) -> Self {
        WireError {
            code: code.to_string(),
            message: message.into(),
            help: None,
            data: String::new(),
        }
    }
}

/// Runs a service call that came over the wire on `service`: its answer as it goes back.
pub(crate) fn answer_service(service: &ServiceBox, method: &str, args: &str) -> Answer {
    match service.call(RStr::from(method), RStr::from(args)) {
        RResult::ROk(text) => Ok(serde_json::Value::String(text.into())),
        RResult::RErr(e) => Err(e.into()),
    }
}

/// A service call's answer that came over the wire, as the calling plugin receives it.
pub(crate) fn service_result(answer: Answer) -> RResult<RString, RError> {
    match answer {
        Ok(serde_json::Value::String(text)) => RResult::ROk(text.into()),
        Ok(other) => RResult::ROk(other.to_string().into()),
        Err(e) => RResult::RErr(e.into()),
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Frame {
    id: u64,
    #[serde(flatten)]
    msg: Msg,
}

/// Why a request got no reply: the connection closed (the other side exited or was
/// killed).
#[derive(Debug)]
pub(crate) enum Unanswered {
    Closed,
}

/// Handles request `id` from the other side: its reply, or `None` for a message that
/// takes none (a log event).
pub(crate) type Handler = dyn Fn(&Arc<Conn>, u64, Msg, Vec<OwnedFd>) -> Option<Result<serde_json::Value, WireError>>
    + Send
    + Sync;

/// A request in flight: who waits for its answer, and the scope it was sent in.
struct Pending {
    waiter: Sender<Answer>,
    scope: Option<Scope>,
}

/// Where a request of the other side was made, as this side recorded it.
pub(crate) enum Within {
    /// During this side's request, sent in this scope (`None`: outside any call).
    Request(Option<Scope>),
    /// During no request of this side's in flight.
    Nothing,
}

/// A reply: the result, or the other side's error.
pub(crate) type Answer = Result<serde_json::Value, WireError>;

/// One side of the socket pair.
pub(crate) struct Conn {
    writer: Mutex<UnixStream>,
    next: AtomicU64,
    /// The waiter of each request in flight, with the scope it was sent in (`None`: sent
    /// by the host itself, outside any call); `None` once the connection closed.
    pending: Mutex<Option<HashMap<u64, Pending>>>,
}

impl Conn {
    /// Serves `stream`: a reader thread answers requests with `handler` (each on a thread
    /// of its own: it may call back) and hands replies to their waiters; when the stream
    /// ends, `on_close` runs, then every waiter is told.
    pub(crate) fn serve(
        stream: UnixStream,
        handler: Arc<Handler>,
        on_close: impl FnOnce() + Send + 'static,
        name: String,
    ) -> std::io::Result<Arc<Conn>> {
        let reader = stream.try_clone()?;
        let conn = Arc::new(Conn {
            writer: Mutex::new(stream),
            next: AtomicU64::new(1),
            pending: Mutex::new(Some(HashMap::new())),
        });
        let serving = conn.clone();
        std::thread::Builder::new().name(name).spawn(move || {
            serving.read_loop(reader, handler);
            on_close();
            serving.close();
        })?;
        Ok(conn)
    }

    fn read_loop(self: &Arc<Self>, mut reader: UnixStream, handler: Arc<Handler>) {
        let workers = Workers::new();
        loop {
            let Ok((frame, fds)) = read_frame(&mut reader) else {
                return;
            };
            match frame.msg {
                Msg::Reply { result } => {
                    let waiter = lock(&self.pending)
                        .as_mut()
                        .and_then(|p| p.remove(&frame.id));
                    if let Some(pending) = waiter {
                        let _ = pending.waiter.send(result);
                    }
                }
                msg => {
                    let (conn, handler, id) = (self.clone(), handler.clone(), frame.id);
                    let job: Job = Box::new(move || {
                        if let Some(result) = handler(&conn, id, msg, fds) {
                            let _ = conn.send(id, &Msg::Reply { result }, &[]);
                        }
                    });
                    if !workers.run(job) {
                        return;
                    }
                }
            }
        }
    }

    /// Marks the connection closed: every waiter (now and later) is told.
    fn close(&self) {
        lock(&self.pending).take();
        if let Ok(w) = self.writer.lock() {
            let _ = w.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Ends the connection from this side (the other side sees end of file).
    pub(crate) fn shutdown(&self) {
        if let Ok(w) = self.writer.lock() {
            let _ = w.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Sends a request; its reply arrives on the returned receiver.
    pub(crate) fn request(
        &self,
        msg: &Msg,
        fds: &[BorrowedFd<'_>],
    ) -> Result<Receiver<Answer>, Unanswered> {
        self.request_in(msg, fds, None)
    }

    /// Sends a request made in `scope`, which the other side's calls during it are
    /// answered in ([`Conn::within`]).
    pub(crate) fn request_in(
        &self,
        msg: &Msg,
        fds: &[BorrowedFd<'_>],
        scope: Option<Scope>,
    ) -> Result<Receiver<Answer>, Unanswered> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel();
        match lock(&self.pending).as_mut() {
            Some(pending) => {
                pending.insert(id, Pending { waiter: tx, scope });
            }
            None => return Err(Unanswered::Closed),
        }
        if self.send(id, msg, fds).is_err() {
            if let Some(p) = lock(&self.pending).as_mut() {
                p.remove(&id);
            }
            return Err(Unanswered::Closed);
        }
        Ok(rx)
    }

    /// Sends a message that takes no reply.
    pub(crate) fn notify(&self, msg: &Msg) {
        let _ = self.send(0, msg, &[]);
    }

    fn send(&self, id: u64, msg: &Msg, fds: &[BorrowedFd<'_>]) -> std::io::Result<()> {
        let body = serde_json::to_vec(&FrameRef { id, msg })?;
        if body.len() > MAX_FRAME {
            return Err(std::io::Error::other("frame too large"));
        }
        let header = (body.len() as u32).to_le_bytes();
        let writer = self
            .writer
            .lock()
            .map_err(|_| std::io::Error::other("poisoned"))?;
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !fds.is_empty() {
            control.push(SendAncillaryMessage::ScmRights(fds));
        }
        // The descriptors go with the first bytes; the rest is written plainly.
        let mut sent = loop {
            match sendmsg(
                writer.as_fd(),
                &[IoSlice::new(&header), IoSlice::new(&body)],
                &mut control,
                SendFlags::NOSIGNAL,
            ) {
                Err(rustix::io::Errno::INTR) => continue,
                other => break other?,
            }
        };
        let mut w: &UnixStream = &writer;
        if sent < header.len() {
            w.write_all(&header[sent..])?;
            sent = header.len();
        }
        w.write_all(&body[sent - header.len()..])
    }

    /// The scope of this side's request `id`, if it is still in flight.
    pub(crate) fn within(&self, id: Option<u64>) -> Within {
        let pending = lock(&self.pending);
        match id.and_then(|id| pending.as_ref()?.get(&id)) {
            Some(p) => Within::Request(p.scope.clone()),
            None => Within::Nothing,
        }
    }

    /// Requests in flight.
    pub(crate) fn in_flight(&self) -> usize {
        lock(&self.pending).as_ref().map_or(0, HashMap::len)
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// The threads that answer the other side's requests: an idle one takes each request, and
/// a new one starts when none is idle, so a request that calls back never waits for
/// another to finish. Idle threads end after a while.
struct Workers {
    state: Arc<(Mutex<Queue>, Condvar)>,
}

#[derive(Default)]
struct Queue {
    jobs: std::collections::VecDeque<Job>,
    idle: usize,
}

/// How long a thread with nothing to do waits for a request before it ends.
const IDLE: std::time::Duration = std::time::Duration::from_secs(30);

impl Workers {
    fn new() -> Self {
        Workers {
            state: Arc::new((Mutex::new(Queue::default()), Condvar::new())),
        }
    }

    /// Runs `job` on a worker; `false` when no thread could be started for it.
    fn run(&self, job: Job) -> bool {
        let (queue, ready) = &*self.state;
        let mut q = lock(queue);
        q.jobs.push_back(job);
        if q.idle >= q.jobs.len() {
            ready.notify_one();
            return true;
        }
        drop(q);
        let state = self.state.clone();
        std::thread::Builder::new()
            .name("cordis-isolated-call".into())
            .spawn(move || Workers::work(&state))
            .is_ok()
    }

    fn work(state: &(Mutex<Queue>, Condvar)) {
        let (queue, ready) = state;
        let mut q = lock(queue);
        loop {
            if let Some(job) = q.jobs.pop_front() {
                drop(q);
                job();
                q = lock(queue);
                continue;
            }
            q.idle += 1;
            let (next, waited) = ready
                .wait_timeout(q, IDLE)
                .unwrap_or_else(|e| e.into_inner());
            q = next;
            q.idle -= 1;
            if waited.timed_out() && q.jobs.is_empty() {
                return;
            }
        }
    }
}

#[derive(Serialize)]
struct FrameRef<'a> {
    id: u64,
    #[serde(flatten)]
    msg: &'a Msg,
}

/// Reads one frame and the descriptors that came with it.
fn read_frame(reader: &mut UnixStream) -> std::io::Result<(Frame, Vec<OwnedFd>)> {
    let mut header = [0u8; 4];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = loop {
        match recvmsg(
            reader.as_fd(),
            &mut [IoSliceMut::new(&mut header)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Err(rustix::io::Errno::INTR) => continue,
            other => break other?.bytes,
        }
    };
    let mut fds = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = message {
            fds.extend(received);
        }
    }
    if got == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    reader.read_exact(&mut header[got..])?;
    let len = u32::from_le_bytes(header) as usize;
    if len > MAX_FRAME {
        return Err(std::io::Error::other("frame too large"));
    }
    let mut body = vec![0u8; len];
    reader.read_exact(&mut body)?;
    let frame = serde_json::from_slice(&body).map_err(std::io::Error::other)?;
    Ok((frame, fds))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn requests_cross_both_ways_with_their_descriptors() {
        let (a, b) = UnixStream::pair().unwrap();
        let echo: Arc<Handler> = Arc::new(|_conn, _id, msg, fds| match msg {
            Msg::Service { method, args, .. } => Some(Ok(serde_json::json!({
                "method": method, "args": args, "fds": fds.len(),
            }))),
            _ => None,
        });
        let (closed_tx, closed_rx) = mpsc::channel();
        let left = Conn::serve(
            a,
            echo.clone(),
            move || closed_tx.send(()).unwrap(),
            "l".into(),
        )
        .unwrap();
        let right = Conn::serve(b, echo, || {}, "r".into()).unwrap();
        let (r, _w) = UnixStream::pair().unwrap();
        let rx = left
            .request(
                &Msg::Service {
                    name: "x".into(),
                    method: "m".into(),
                    args: "a".repeat(100_000),
                    scope: None,
                    fds: CallFds::default(),
                    within: None,
                },
                &[r.as_fd()],
            )
            .unwrap();
        let reply = rx.recv().unwrap().unwrap();
        assert_eq!(reply["fds"], 1);
        assert_eq!(reply["args"].as_str().unwrap().len(), 100_000);
        let rx = right
            .request(
                &Msg::Service {
                    name: "y".into(),
                    method: "n".into(),
                    args: String::new(),
                    scope: None,
                    fds: CallFds::default(),
                    within: None,
                },
                &[],
            )
            .unwrap();
        assert_eq!(rx.recv().unwrap().unwrap()["method"], "n");
        assert!(r.as_raw_fd() >= 0);
        right.shutdown();
        closed_rx.recv().unwrap();
        assert!(matches!(
            left.request(&Msg::Dispose, &[]),
            Err(Unanswered::Closed)
        ));
    }
}
