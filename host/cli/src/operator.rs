//! Approvals answered by a person outside the MCP client: the operator channel.
//!
//! A call whose client cannot be asked (no elicitation) waits here instead of failing, and
//! a handshake-era client that can be asked races the operator: the first answer counts.
//! Each waiting request has an id, `<pid>.<n>`, and is shown exactly as a client would show
//! it ([`cordis_engine::render_approval`]). An approval is answered through
//!
//! - the control socket of the running host, `<state dir>/run/<pid>/approvals.sock`,
//!   which `cordis approvals list|approve|deny` speaks to: one JSON line each way, from a
//!   process of the host's own user (`SO_PEERCRED`) that knows the key beside it
//!   (`approvals.key`, `0600`). The state directory is unreadable to every sandboxed
//!   command, and the key stands even where a path socket could be reached anyway (the
//!   `landlock-only` tier with unix sockets allowed: Landlock does not govern `connect`);
//! - over HTTP, `/approvals` with the operator's token ([`crate::http`]).
//!
//! An answer is the same one-call grant an elicitation gives. A request nobody answers
//! within the timeout is `unavailable`.

use std::collections::BTreeMap;
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use cordis_sdk::host::{ApprovalOutcome, ApprovalRequest};
use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq as _;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::oneshot;

/// The control socket's file name in a host's runtime directory.
pub const SOCKET: &str = "approvals.sock";
/// The key file's name beside it.
pub const KEY: &str = "approvals.key";
/// The longest request line the control socket reads.
const MAX_LINE: u64 = 64 * 1024;
/// How long a connection to the control socket has to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The approvals waiting for a person in this host.
pub struct Operator {
    pid: u32,
    next: AtomicU64,
    pending: Mutex<BTreeMap<u64, Pending>>,
    timeout: Duration,
}

impl std::fmt::Debug for Operator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Operator")
            .field("pid", &self.pid)
            .field("waiting", &lock(&self.pending).len())
            .field("timeout", &self.timeout)
            .finish()
    }
}

struct Pending {
    request: ApprovalRequest,
    since: Instant,
    answer: Option<oneshot::Sender<ApprovalOutcome>>,
}

/// A waiting approval as `list` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingApproval {
    /// `<pid>.<n>`: what `approve` and `deny` take.
    pub id: String,
    /// The session the call runs in.
    pub session: String,
    /// The call's id.
    pub call: String,
    /// The tool that asks.
    pub tool: String,
    /// The one-line summary (escaped, as in the prompt).
    pub summary: String,
    /// What a person is shown before deciding, as every front-end shows it.
    pub prompt: String,
    /// How long it has waited, in seconds.
    pub waiting_secs: u64,
}

/// Why an answer was not taken.
#[derive(Debug)]
pub enum AnswerError {
    /// No such approval waits here (answered, timed out, its call ended, or never).
    NotWaiting(String),
}

impl std::fmt::Display for AnswerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AnswerError::NotWaiting(id) => write!(
                f,
                "no approval `{id}` is waiting (it was answered, timed out or its call ended); `cordis approvals list` shows those that are"
            ),
        }
    }
}

impl std::error::Error for AnswerError {}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Operator {
    /// The approvals of this process; each waits at most `timeout` for an answer.
    pub fn new(timeout: Duration) -> Arc<Self> {
        Arc::new(Operator {
            pid: std::process::id(),
            next: AtomicU64::new(1),
            pending: Mutex::default(),
            timeout,
        })
    }

    /// Lists `request` as waiting until the returned [`Waiting`] is answered or dropped.
    pub fn wait(self: &Arc<Self>, request: &ApprovalRequest) -> Waiting {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        lock(&self.pending).insert(
            n,
            Pending {
                request: request.clone(),
                since: Instant::now(),
                answer: Some(tx),
            },
        );
        let waiting = Waiting {
            operator: self.clone(),
            n,
            answer: rx,
        };
        tracing::warn!(
            approval = %waiting.id(),
            session = %request.session,
            call = %request.call_id,
            tool = %request.tool,
            "approval {} waits for a person: {}; answer with `cordis approvals approve {0}` or `cordis approvals deny {0}`",
            waiting.id(),
            cordis_engine::escape_approval_line(&request.summary)
        );
        waiting
    }

    fn id(&self, n: u64) -> String {
        format!("{}.{n}", self.pid)
    }

    /// The approvals waiting now, oldest first.
    pub fn list(&self) -> Vec<PendingApproval> {
        lock(&self.pending)
            .iter()
            .map(|(n, p)| PendingApproval {
                id: self.id(*n),
                session: p.request.session.clone(),
                call: p.request.call_id.clone(),
                tool: p.request.tool.clone(),
                summary: cordis_engine::escape_approval_line(&p.request.summary),
                prompt: cordis_engine::render_approval(&p.request),
                waiting_secs: p.since.elapsed().as_secs(),
            })
            .collect()
    }

    /// Answers the approval `id` (`<pid>.<n>`): approved or rejected.
    pub fn answer(&self, id: &str, approve: bool) -> Result<(), AnswerError> {
        let not_waiting = || AnswerError::NotWaiting(id.to_string());
        let n = id
            .strip_prefix(&format!("{}.", self.pid))
            .and_then(|n| n.parse::<u64>().ok())
            .ok_or_else(not_waiting)?;
        let sender = lock(&self.pending)
            .get_mut(&n)
            .and_then(|p| p.answer.take())
            .ok_or_else(not_waiting)?;
        let outcome = if approve {
            ApprovalOutcome::Approved
        } else {
            ApprovalOutcome::Rejected
        };
        sender.send(outcome).map_err(|_| not_waiting())?;
        tracing::info!(approval = %id, "an operator answered approval {id}: {outcome:?}");
        Ok(())
    }

    /// Answers every waiting approval `cancelled` (the server shuts down).
    pub fn cancel_all(&self) {
        for p in lock(&self.pending).values_mut() {
            if let Some(tx) = p.answer.take() {
                let _ = tx.send(ApprovalOutcome::Cancelled);
            }
        }
    }
}

/// One approval waiting for an operator; it stops being listed when dropped.
pub struct Waiting {
    operator: Arc<Operator>,
    n: u64,
    answer: oneshot::Receiver<ApprovalOutcome>,
}

impl Waiting {
    /// Its id, `<pid>.<n>`.
    pub fn id(&self) -> String {
        self.operator.id(self.n)
    }

    /// The operator's answer; `unavailable` when none comes within the timeout.
    pub async fn outcome(&mut self) -> ApprovalOutcome {
        match tokio::time::timeout(self.operator.timeout, &mut self.answer).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(_)) => ApprovalOutcome::Cancelled,
            Err(_) => {
                tracing::warn!(
                    approval = %self.id(),
                    "no one answered approval {} within {} s; it is unavailable (--approval-timeout)",
                    self.id(),
                    self.operator.timeout.as_secs()
                );
                ApprovalOutcome::Unavailable
            }
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        lock(&self.operator.pending).remove(&self.n);
    }
}

/// A request on the control socket.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase", deny_unknown_fields)]
pub enum Request {
    /// The approvals waiting.
    List {
        /// The key from [`KEY`].
        key: String,
    },
    /// Approve one.
    Approve {
        /// The key from [`KEY`].
        key: String,
        /// Its id.
        id: String,
    },
    /// Reject one.
    Deny {
        /// The key from [`KEY`].
        key: String,
        /// Its id.
        id: String,
    },
}

/// The control socket's answer.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Reply {
    /// For `list`: what waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<Vec<PendingApproval>>,
    /// For `approve` and `deny`: the id answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answered: Option<String>,
    /// Why the request was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Reply {
    fn error(text: impl Into<String>) -> Self {
        Reply {
            error: Some(text.into()),
            ..Reply::default()
        }
    }
}

/// The control socket of a host, listening, with its key.
pub struct Control {
    listener: std::os::unix::net::UnixListener,
    key: String,
    files: [PathBuf; 2],
}

/// `path` reached through the open directory `dir`, so a socket path stays short however
/// deep the state directory is (a unix socket's path holds at most 107 bytes).
fn beneath(dir: &std::fs::File, name: &str) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}/{name}", dir.as_raw_fd()))
}

impl Control {
    /// Creates the key and binds the socket in `run_dir` (the host's runtime directory).
    pub fn bind(run_dir: &Path) -> anyhow::Result<Self> {
        use std::io::Write as _;
        use std::os::unix::fs::PermissionsExt as _;
        let dir = std::fs::File::open(run_dir)
            .with_context(|| format!("cannot open {}", run_dir.display()))?;
        let key = crate::mcp::hex(&crate::mcp::random_bytes(32)?);
        let key_path = run_dir.join(KEY);
        let mut file = tempfile::NamedTempFile::new_in(run_dir)
            .with_context(|| format!("cannot write {}", key_path.display()))?;
        file.write_all(key.as_bytes())?;
        file.persist(&key_path)
            .map_err(|e| e.error)
            .with_context(|| format!("cannot write {}", key_path.display()))?;
        let socket = run_dir.join(SOCKET);
        let _ = std::fs::remove_file(&socket);
        let listener = std::os::unix::net::UnixListener::bind(beneath(&dir, SOCKET))
            .with_context(|| format!("cannot listen on {}", socket.display()))?;
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("cannot restrict {}", socket.display()))?;
        listener.set_nonblocking(true)?;
        Ok(Control {
            listener,
            key,
            files: [socket, key_path],
        })
    }

    /// Answers requests for `operator` until dropped (a task of the current runtime).
    pub fn serve(self, operator: Arc<Operator>) -> anyhow::Result<ControlTask> {
        let listener = tokio::net::UnixListener::from_std(self.listener)
            .context("cannot serve the approvals socket")?;
        let key: Arc<str> = self.key.into();
        let task = tokio::spawn(async move {
            loop {
                let stream = match listener.accept().await {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // Out of descriptors, say: wait rather than spin.
                        tracing::debug!("approvals socket: accepting failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let (operator, key) = (operator.clone(), key.clone());
                tokio::spawn(async move {
                    if let Err(e) = answer_connection(stream, &operator, &key).await {
                        tracing::debug!("approvals socket: {e}");
                    }
                });
            }
        });
        Ok(ControlTask {
            task,
            files: self.files,
        })
    }
}

/// The serving control socket; removes its files when dropped.
pub struct ControlTask {
    task: tokio::task::JoinHandle<()>,
    files: [PathBuf; 2],
}

impl Drop for ControlTask {
    fn drop(&mut self) {
        self.task.abort();
        for f in &self.files {
            let _ = std::fs::remove_file(f);
        }
    }
}

async fn answer_connection(
    stream: tokio::net::UnixStream,
    operator: &Operator,
    key: &str,
) -> anyhow::Result<()> {
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    let peer = stream.peer_cred()?.uid();
    let (read, mut write) = stream.into_split();
    let reply = if peer != me && peer != 0 {
        Reply::error(format!(
            "refused: the approvals of this host are answered by its own user (uid {me}), not uid {peer}"
        ))
    } else {
        let mut line = String::new();
        let mut read = tokio::io::BufReader::new(read).take(MAX_LINE);
        match tokio::time::timeout(REQUEST_TIMEOUT, read.read_line(&mut line)).await {
            Ok(Ok(_)) => handle(&line, operator, key),
            Ok(Err(e)) => Reply::error(format!("cannot read the request: {e}")),
            Err(_) => Reply::error("no request within 5 s"),
        }
    };
    let mut out = serde_json::to_vec(&reply)?;
    out.push(b'\n');
    write.write_all(&out).await?;
    Ok(())
}

/// Answers one request line.
pub fn handle(line: &str, operator: &Operator, key: &str) -> Reply {
    let request: Request = match serde_json::from_str(line) {
        Ok(r) => r,
        Err(e) => return Reply::error(format!("not a request: {e}")),
    };
    let presented = match &request {
        Request::List { key } | Request::Approve { key, .. } | Request::Deny { key, .. } => key,
    };
    if !bool::from(presented.as_bytes().ct_eq(key.as_bytes())) {
        return Reply::error(format!(
            "refused: a wrong key (the key is the file {KEY} beside the socket)"
        ));
    }
    match request {
        Request::List { .. } => Reply {
            pending: Some(operator.list()),
            ..Reply::default()
        },
        Request::Approve { id, .. } | Request::Deny { id, .. }
            if operator
                .answer(&id, matches!(request, Request::Approve { .. }))
                .is_ok() =>
        {
            Reply {
                answered: Some(id),
                ..Reply::default()
            }
        }
        Request::Approve { id, .. } | Request::Deny { id, .. } => {
            Reply::error(AnswerError::NotWaiting(id).to_string())
        }
    }
}

/// Sends `request` (its key filled from the host's key file) to the host whose runtime
/// directory is `run_dir`, and returns its reply (a client: `cordis approvals`).
pub fn ask_host(run_dir: &Path, request: impl FnOnce(String) -> Request) -> anyhow::Result<Reply> {
    use std::io::{BufRead as _, Read as _, Write as _};
    let key_path = run_dir.join(KEY);
    let key = std::fs::read_to_string(&key_path)
        .with_context(|| format!("cannot read the host's key {}", key_path.display()))?;
    let dir = std::fs::File::open(run_dir)
        .with_context(|| format!("cannot open {}", run_dir.display()))?;
    let socket = run_dir.join(SOCKET);
    let mut stream = std::os::unix::net::UnixStream::connect(beneath(&dir, SOCKET))
        .with_context(|| format!("cannot reach the host at {}", socket.display()))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut line = serde_json::to_vec(&request(key.trim().to_string()))?;
    line.push(b'\n');
    stream.write_all(&line)?;
    let mut answer = String::new();
    std::io::BufReader::new(stream)
        .take(16 * 1024 * 1024)
        .read_line(&mut answer)
        .with_context(|| format!("no answer from {}", socket.display()))?;
    serde_json::from_str(&answer)
        .with_context(|| format!("a malformed answer from {}", socket.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(summary: &str) -> ApprovalRequest {
        ApprovalRequest {
            session: "s1".into(),
            call_id: "c1".into(),
            tool: "bash".into(),
            summary: summary.into(),
            detail: "rm -rf build".into(),
            justification: "clean".into(),
            mode: None,
        }
    }

    #[tokio::test]
    async fn an_answer_reaches_its_waiter_once_and_only_while_it_waits() {
        let operator = Operator::new(Duration::from_secs(60));
        let mut waiting = operator.wait(&request("run `rm -rf build`\u{1b}[2K"));
        let listed = operator.list();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].id, waiting.id());
        assert_eq!(listed[0].summary, "run `rm -rf build`\\u{1b}[2K");
        assert!(
            listed[0].prompt.contains("rm -rf build"),
            "{}",
            listed[0].prompt
        );
        // Another process's id, a malformed one, an unknown one: not waiting.
        for wrong in ["1.1", "x", &format!("{}.99", std::process::id())] {
            assert!(operator.answer(wrong, true).is_err(), "{wrong}");
        }
        operator.answer(&waiting.id(), false).unwrap();
        assert!(
            operator.answer(&waiting.id(), true).is_err(),
            "answered twice"
        );
        assert_eq!(waiting.outcome().await, ApprovalOutcome::Rejected);
        drop(waiting);
        assert!(operator.list().is_empty());
    }

    #[tokio::test]
    async fn nobody_answering_within_the_timeout_is_unavailable() {
        let operator = Operator::new(Duration::from_millis(20));
        let mut waiting = operator.wait(&request("x"));
        assert_eq!(waiting.outcome().await, ApprovalOutcome::Unavailable);
    }

    #[test]
    fn a_wrong_key_or_a_malformed_line_is_refused_and_answers_nothing() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _guard = rt.enter();
        let operator = Operator::new(Duration::from_secs(60));
        let waiting = operator.wait(&request("x"));
        let id = waiting.id();
        for line in [
            format!(r#"{{"op":"approve","key":"wrong","id":"{id}"}}"#),
            format!(r#"{{"op":"approve","id":"{id}"}}"#),
            format!(r#"{{"op":"approve","key":"k","id":"{id}","extra":1}}"#),
            "not json".to_string(),
        ] {
            let reply = handle(&line, &operator, "k");
            assert!(reply.error.is_some() && reply.answered.is_none(), "{line}");
        }
        assert_eq!(operator.list().len(), 1);
        let reply = handle(
            &format!(r#"{{"op":"approve","key":"k","id":"{id}"}}"#),
            &operator,
            "k",
        );
        assert_eq!(reply.answered.as_deref(), Some(id.as_str()));
    }
}
