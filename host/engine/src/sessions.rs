//! Session logs: one append-only JSON-lines file per session under the state directory.
//! The first line is the header (id and the immutable, canonical `cwd`); every further line
//! is an event. Appends are fsynced before they return. Session state lives here, not in
//! plugin memory, so reloading a plugin loses nothing.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use cordis_sdk::host::{EventQuery, NewEvent, SessionEvent, Sessions};
use cordis_sdk::{Error, Result, SessionInfo};
use serde::{Deserialize, Serialize};

use cordis_sdk::host::codes;

/// The environment variable naming the state directory.
pub(crate) const STATE_DIR_ENV: &str = "CORDIS_STATE_DIR";

/// `--state-dir`, else `CORDIS_STATE_DIR`, else `$XDG_STATE_HOME/cordis`, else
/// `~/.local/state/cordis`. Never guessed: with none of them set there is no state
/// directory (a fallback into the working directory would put the session logs that hold
/// each session's sandbox mode inside the session's own workspace).
pub fn default_state_dir(flag: Option<&Path>) -> Option<PathBuf> {
    state_dir_from(flag, |name| std::env::var_os(name))
}

/// Creates `state_dir` and `sub` beneath it (empty: none), every directory it creates
/// `0700`, and takes group and other access away from an existing `state_dir` this user
/// owns: what the host keeps there (session logs, its HTTP token, status files) is no one
/// else's to read.
pub fn private_dir(state_dir: &Path, sub: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true).mode(0o700);
    builder.create(state_dir)?;
    let meta = std::fs::metadata(state_dir)?;
    // SAFETY: a plain system call without arguments.
    if meta.mode() & 0o077 != 0 && meta.uid() == unsafe { libc::geteuid() } {
        std::fs::set_permissions(state_dir, std::fs::Permissions::from_mode(0o700))?;
    }
    let dir = state_dir.join(sub);
    builder.create(&dir)?;
    Ok(dir)
}

/// What to say when a command needs a state directory and none is set.
pub const NO_STATE_DIR: &str = "no state directory: none of --state-dir, CORDIS_STATE_DIR, \
XDG_STATE_HOME or HOME is set; pass `--state-dir DIR` (or set CORDIS_STATE_DIR) to a \
directory outside every workspace the sessions may write";

/// [`default_state_dir`] with the environment read through `env`.
fn state_dir_from(
    flag: Option<&Path>,
    env: impl Fn(&str) -> Option<std::ffi::OsString>,
) -> Option<PathBuf> {
    if let Some(f) = flag {
        return Some(f.to_path_buf());
    }
    if let Some(d) = env(STATE_DIR_ENV).filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = env("XDG_STATE_HOME").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(d).join("cordis"));
    }
    env("HOME")
        .filter(|d| !d.is_empty())
        .map(|home| PathBuf::from(home).join(".local/state/cordis"))
}

#[derive(Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
enum Line {
    Header {
        version: u32,
        id: String,
        cwd: PathBuf,
        /// Device and inode of `cwd` at creation.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cwd_id: Option<(u64, u64)>,
        /// Who made the session, when it is short-lived.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        origin: Option<Origin>,
    },
    Event(SessionEvent),
}

/// Who made a short-lived session, recorded in its header. A session without one is
/// long-lived (made by `cordis session new` or by a front-end for its client) and is never
/// pruned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    /// Made for one `cordis call` (pruned by `cordis session prune`).
    Call,
}

struct Log {
    info: SessionInfo,
    file: LogFile,
    state: Mutex<LogState>,
}

/// Where a log is: its path, and its name beneath the store's sessions directory when
/// that directory is held open, so the `stat` asked on every call looks up one name
/// instead of walking the whole path.
struct LogFile {
    path: PathBuf,
    beneath: Option<(Arc<OwnedFd>, String)>,
}

impl LogFile {
    /// The log's size now (following a symlink, as a `stat` of its path would).
    fn len(&self) -> std::io::Result<u64> {
        match &self.beneath {
            Some((dir, name)) => {
                Ok(
                    rustix::fs::statat(dir, name.as_str(), rustix::fs::AtFlags::empty())?.st_size
                        as u64,
                )
            }
            None => Ok(std::fs::metadata(&self.path)?.len()),
        }
    }
}

/// What has been read of a log file so far. Another process (say `cordis session
/// set-mode` while `cordis run` serves the session) may append; reads pick that up.
#[derive(Default)]
struct LogState {
    header: Option<SessionInfo>,
    events: Vec<SessionEvent>,
    /// Bytes of complete lines consumed.
    consumed: u64,
    /// Complete lines consumed.
    lines: usize,
}

/// The store of every session's log.
pub struct SessionStore {
    dir: PathBuf,
    open: Mutex<HashMap<String, Arc<Log>>>,
    /// The sessions directory, held open once it exists (see [`LogFile`]).
    sessions_fd: OnceLock<Arc<OwnedFd>>,
}

/// Problems reading a session log.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// No such session.
    #[error("no session `{0}` (list them with `cordis session list`)")]
    NotFound(String),
    /// Not a session id at all (it could name a file outside the sessions directory).
    #[error("invalid session id {0}: an id is 1 to {MAX_ID_LEN} ASCII letters, digits and `-`, as `cordis session list` shows them")]
    InvalidId(String),
    /// A corrupt line that is not a torn last line.
    #[error("{path}:{line}: corrupt session log line: {detail}")]
    Corrupt {
        /// The log file.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// What was wrong.
        detail: String,
    },
    /// I/O.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The session's cwd is not a usable directory.
    #[error("session cwd {0}: {1}")]
    BadCwd(PathBuf, std::io::Error),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SessionError + '_ {
    move |source| SessionError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The longest session id accepted.
pub(crate) const MAX_ID_LEN: usize = 64;

/// Refuses anything but a plain id (`[A-Za-z0-9-]`, 1 to [`MAX_ID_LEN`] characters): an
/// id becomes a file name in the sessions directory, so `/`, `..`, NUL or an absolute path
/// must never reach the file system. The error shows at most 80 characters of the id,
/// escaped.
pub(crate) fn check_id(id: &str) -> Result<(), SessionError> {
    let valid = !id.is_empty()
        && id.len() <= MAX_ID_LEN
        && id.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-');
    if valid {
        return Ok(());
    }
    let shown: String = id.chars().take(80).collect();
    let more = if id.chars().count() > 80 { "…" } else { "" };
    Err(SessionError::InvalidId(format!(
        "{:?}{more} ({} bytes)",
        shown,
        id.len()
    )))
}

fn new_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("s{:x}{:04x}{:x}", nanos, std::process::id() & 0xffff, n)
}

impl SessionStore {
    /// A store in `dir` (created on first write).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        SessionStore {
            dir: dir.into(),
            open: Mutex::new(HashMap::new()),
            sessions_fd: OnceLock::new(),
        }
    }

    fn sessions_dir(&self) -> PathBuf {
        self.dir.join("sessions")
    }

    /// The sessions directory held open (`O_PATH`), once it exists; `None` before.
    fn sessions_fd(&self) -> Option<Arc<OwnedFd>> {
        if let Some(fd) = self.sessions_fd.get() {
            return Some(fd.clone());
        }
        use rustix::fs::{Mode, OFlags};
        let fd = rustix::fs::open(
            self.sessions_dir(),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .ok()?;
        Some(self.sessions_fd.get_or_init(|| Arc::new(fd)).clone())
    }

    fn path_of(&self, id: &str) -> PathBuf {
        self.sessions_dir().join(Self::file_name(id))
    }

    fn file_name(id: &str) -> String {
        format!("{id}.jsonl")
    }

    fn log_file(&self, id: &str) -> LogFile {
        LogFile {
            path: self.path_of(id),
            beneath: self.sessions_fd().map(|dir| (dir, Self::file_name(id))),
        }
    }

    /// Creates a long-lived session rooted at `cwd` (canonicalized, immutable).
    pub fn create(&self, cwd: &Path) -> Result<SessionInfo, SessionError> {
        self.create_with(cwd, None)
    }

    /// Creates a session rooted at `cwd` (canonicalized, immutable), made by `origin`.
    pub fn create_with(
        &self,
        cwd: &Path,
        origin: Option<Origin>,
    ) -> Result<SessionInfo, SessionError> {
        let cwd = cwd
            .canonicalize()
            .map_err(|e| SessionError::BadCwd(cwd.to_path_buf(), e))?;
        if !cwd.is_dir() {
            return Err(SessionError::BadCwd(
                cwd,
                std::io::Error::other("not a directory"),
            ));
        }
        let cwd_id = {
            use std::os::unix::fs::MetadataExt;
            let meta = std::fs::metadata(&cwd).map_err(|e| SessionError::BadCwd(cwd.clone(), e))?;
            Some((meta.dev(), meta.ino()))
        };
        let dir = private_dir(&self.dir, Path::new("sessions")).map_err(io(&self.dir))?;
        let id = new_id();
        let log_file = self.log_file(&id);
        let path = &log_file.path;
        let header = Line::Header {
            version: 1,
            id: id.clone(),
            cwd: cwd.clone(),
            cwd_id,
            origin,
        };
        let mut file = OpenOptions::new()
            .create_new(true)
            .append(true)
            .mode(0o600)
            .open(path)
            .map_err(io(path))?;
        write_line(&mut file, &header).map_err(io(path))?;
        File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(io(&dir))?;
        let info = SessionInfo {
            id: id.clone(),
            cwd,
            cwd_id,
        };
        let consumed = log_file.len().map_err(io(path))?;
        self.open.lock().unwrap_or_else(|e| e.into_inner()).insert(
            id,
            Arc::new(Log {
                info: info.clone(),
                state: Mutex::new(LogState {
                    header: Some(info.clone()),
                    events: Vec::new(),
                    consumed,
                    lines: 1,
                }),
                file: log_file,
            }),
        );
        Ok(info)
    }

    /// Opens (replaying on first use) an existing session.
    pub fn get(&self, id: &str) -> Result<SessionInfo, SessionError> {
        Ok(self.log(id)?.info.clone())
    }

    /// Session ids on disk, sorted.
    pub fn list(&self) -> Vec<String> {
        let mut ids: Vec<String> = std::fs::read_dir(self.sessions_dir())
            .into_iter()
            .flatten()
            .filter_map(|e| {
                let name = e.ok()?.file_name().into_string().ok()?;
                name.strip_suffix(".jsonl").map(str::to_string)
            })
            .collect();
        ids.sort();
        ids
    }

    /// Marks session `id` as held by this process until the returned hold is dropped (or
    /// the process ends): a shared lock on `<id>.held` beside its log, which retention
    /// ([`SessionStore::retain`]) never removes a session under, whichever process runs it.
    pub fn hold(&self, id: &str) -> Result<SessionHold, SessionError> {
        check_id(id)?;
        let path = self.sessions_dir().join(format!("{id}.held"));
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&path)
            .map_err(io(&path))?;
        file.lock_shared().map_err(io(&path))?;
        Ok(SessionHold { _file: file })
    }

    /// Applies a retention policy to the sessions no process holds: removes those whose
    /// log has not changed for `retention.older_than`, and beyond the `retention.keep` most
    /// recently changed, never one changed in the last [`RETENTION_GRACE`] (a session
    /// being opened). Returns the ids removed. Each is removed under its log's lock and an
    /// exclusive lock on its hold file, so neither an append nor a hold is in progress.
    pub fn retain(&self, retention: &Retention) -> Result<Vec<String>, SessionError> {
        let now = std::time::SystemTime::now();
        let mut ended: Vec<(std::time::SystemTime, String)> = Vec::new();
        for id in self.list() {
            if check_id(&id).is_err() {
                continue;
            }
            let path = self.path_of(&id);
            let Ok(modified) = std::fs::metadata(&path).and_then(|m| m.modified()) else {
                continue; // removed meanwhile
            };
            ended.push((modified, id));
        }
        // Newest first: the first `keep` are kept whatever their age.
        ended.sort_by_key(|e| std::cmp::Reverse(e.0));
        let mut removed = Vec::new();
        for (index, (modified, id)) in ended.into_iter().enumerate() {
            let age = now.duration_since(modified).unwrap_or_default();
            let too_many = retention.keep.is_some_and(|keep| index >= keep);
            let too_old = retention.older_than.is_some_and(|limit| age >= limit);
            if age < RETENTION_GRACE || !(too_many || too_old) {
                continue;
            }
            let Some(held) = self.unheld(&id)? else {
                continue; // a live holder
            };
            let path = self.path_of(&id);
            let _append = match lock_for_append(&path) {
                Ok(lock) => lock,
                Err(SessionError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound =>
                {
                    continue;
                }
                Err(e) => return Err(e),
            };
            std::fs::remove_file(&path).map_err(io(&path))?;
            self.forget(&id, held);
            removed.push(id);
        }
        Ok(removed)
    }

    /// `None` when a live process holds session `id`; else its hold file locked
    /// exclusively (while locked, nobody can hold the session), if it has one.
    fn unheld(&self, id: &str) -> Result<Option<Option<File>>, SessionError> {
        let path = self.sessions_dir().join(format!("{id}.held"));
        match OpenOptions::new().write(true).open(&path) {
            Ok(file) => match file.try_lock() {
                Ok(()) => Ok(Some(Some(file))),
                Err(std::fs::TryLockError::WouldBlock) => Ok(None),
                Err(std::fs::TryLockError::Error(e)) => Err(io(&path)(e)),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Some(None)),
            Err(e) => Err(io(&path)(e)),
        }
    }

    /// After session `id`'s log was removed: its hold file too, and its cached log.
    fn forget(&self, id: &str, held: Option<File>) {
        if held.is_some() {
            let _ = std::fs::remove_file(self.sessions_dir().join(format!("{id}.held")));
        }
        self.open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
    }

    /// Removes the sessions made for a single `cordis call` whose log has not changed for
    /// `older_than`, and returns their ids. Long-lived sessions are never touched. Each log
    /// is judged and removed under its lock, so an append in progress finishes first (and
    /// makes the log recent).
    pub fn prune(&self, older_than: std::time::Duration) -> Result<Vec<String>, SessionError> {
        let now = std::time::SystemTime::now();
        let mut removed = Vec::new();
        for id in self.list() {
            if check_id(&id).is_err() {
                continue;
            }
            let path = self.path_of(&id);
            let lock = match lock_for_append(&path) {
                Ok(lock) => lock,
                Err(SessionError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound =>
                {
                    continue; // removed meanwhile
                }
                Err(e) => return Err(e),
            };
            if origin_of(&path)? != Some(Origin::Call) {
                continue;
            }
            let modified = lock
                .metadata()
                .and_then(|m| m.modified())
                .map_err(io(&path))?;
            if now.duration_since(modified).unwrap_or_default() < older_than {
                continue;
            }
            let Some(held) = self.unheld(&id)? else {
                continue; // its call is still running
            };
            std::fs::remove_file(&path).map_err(io(&path))?;
            self.forget(&id, held);
            removed.push(id);
        }
        Ok(removed)
    }

    fn log(&self, id: &str) -> Result<Arc<Log>, SessionError> {
        check_id(id)?;
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(log) = open.get(id) {
            return Ok(log.clone());
        }
        let file = self.log_file(id);
        if !file.path.is_file() {
            return Err(SessionError::NotFound(id.to_string()));
        }
        let log = Arc::new(replay(file)?);
        open.insert(id.to_string(), log.clone());
        Ok(log)
    }

    /// The sequence number of a session's last event (0 with none), after reading what
    /// other processes appended since.
    pub fn last_seq(&self, id: &str) -> Result<u64, SessionError> {
        let log = self.log(id)?;
        let mut state = log.state.lock().unwrap_or_else(|e| e.into_inner());
        read_more(&log.file, &mut state, false)?;
        Ok(state.events.last().map_or(0, |e| e.seq))
    }

    /// Every event of a session, oldest first, optionally of one kind.
    pub fn events(&self, id: &str, kind: Option<&str>) -> Result<Vec<SessionEvent>, SessionError> {
        let log = self.log(id)?;
        let mut state = log.state.lock().unwrap_or_else(|e| e.into_inner());
        read_more(&log.file, &mut state, false)?;
        Ok(state
            .events
            .iter()
            .filter(|e| kind.is_none_or(|k| e.kind == k))
            .cloned()
            .collect())
    }

    /// Appends an event durably; returns its sequence number.
    pub fn append(
        &self,
        id: &str,
        kind: &str,
        data: serde_json::Value,
    ) -> Result<u64, SessionError> {
        let log = self.log(id)?;
        let mut state = log.state.lock().unwrap_or_else(|e| e.into_inner());
        // Every appender, in any process, holds the log's lock: the sequence numbers stay
        // dense, and a partial last line seen under the lock is a crash's, not an append
        // in progress.
        let mut file = lock_for_append(&log.file.path)?;
        read_more(&log.file, &mut state, true)?;
        let event = SessionEvent {
            seq: state.events.last().map_or(1, |e| e.seq + 1),
            kind: kind.to_string(),
            data,
        };
        write_line(&mut file, &Line::Event(event.clone())).map_err(io(&log.file.path))?;
        // Our own line is consumed by the next read like anyone else's.
        read_more(&log.file, &mut state, false)?;
        Ok(event.seq)
    }
}

/// Opens a log for appending, holding its exclusive lock (`flock`) until the file is
/// dropped.
/// A session held by a live front-end (see [`SessionStore::hold`]).
pub struct SessionHold {
    _file: File,
}

/// Which sessions' logs a server or `cordis session prune` keeps; the others, when no
/// process holds them, are removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Retention {
    /// Remove a session whose log has not changed for this long.
    pub older_than: Option<std::time::Duration>,
    /// Keep at most this many (the most recently changed).
    pub keep: Option<usize>,
}

/// A session changed this recently is never removed by retention (it may be being opened).
pub const RETENTION_GRACE: std::time::Duration = std::time::Duration::from_secs(60);

fn lock_for_append(path: &Path) -> Result<File, SessionError> {
    let file = OpenOptions::new()
        .append(true)
        .open(path)
        .map_err(io(path))?;
    file.lock().map_err(io(path))?;
    Ok(file)
}

/// The origin in a log's header (its first line, read up to 64 KiB); `None` for a
/// long-lived session or a header that cannot be read as one.
fn origin_of(path: &Path) -> Result<Option<Origin>, SessionError> {
    use std::io::Read;
    let file = File::open(path).map_err(io(path))?;
    let mut first = String::new();
    BufReader::new(file.take(64 * 1024))
        .read_line(&mut first)
        .map_err(io(path))?;
    Ok(match serde_json::from_str(first.trim_end()) {
        Ok(Line::Header { origin, .. }) => origin,
        _ => None,
    })
}

fn write_line(file: &mut File, line: &Line) -> std::io::Result<()> {
    let mut text = serde_json::to_string(line).map_err(std::io::Error::other)?;
    text.push('\n');
    file.write_all(text.as_bytes())?;
    file.sync_data()
}

/// Replays a log. A torn last line (a crash mid-append: no final newline) is reported and
/// cut off; any other corrupt line is an error naming file and line.
fn replay(file: LogFile) -> Result<Log, SessionError> {
    let path = &file.path;
    let mut state = LogState::default();
    let lock = lock_for_append(path)?;
    read_more(&file, &mut state, true)?;
    drop(lock);
    let info = state.header.clone().ok_or_else(|| SessionError::Corrupt {
        path: path.to_path_buf(),
        line: 1,
        detail: "missing header".into(),
    })?;
    Ok(Log {
        info,
        file,
        state: Mutex::new(state),
    })
}

/// Reads the complete lines appended since `state.consumed`. A last line without its
/// newline is an append in progress (left for later) or, when `cut_torn_tail` (the caller
/// holds the log's lock, so no append is in progress), the remains of a crash (reported
/// and cut off).
fn read_more(log: &LogFile, state: &mut LogState, cut_torn_tail: bool) -> Result<(), SessionError> {
    use std::io::{Seek, SeekFrom};
    let path = &log.path;
    // One `stat` when nothing was appended (the common case: asked on every call).
    if log.len().map_err(io(path))? <= state.consumed {
        return Ok(());
    }
    let mut file = File::open(path).map_err(io(path))?;
    file.seek(SeekFrom::Start(state.consumed))
        .map_err(io(path))?;
    let mut reader = BufReader::new(file);
    let mut buf = String::new();
    loop {
        buf.clear();
        let n = reader.read_line(&mut buf).map_err(io(path))?;
        if n == 0 {
            return Ok(());
        }
        if !buf.ends_with('\n') {
            if cut_torn_tail {
                tracing::warn!(
                    "{}:{}: torn last line (an append was interrupted); it is dropped",
                    path.display(),
                    state.lines + 1
                );
                let f = OpenOptions::new()
                    .write(true)
                    .open(path)
                    .map_err(io(path))?;
                f.set_len(state.consumed).map_err(io(path))?;
                f.sync_all().map_err(io(path))?;
            }
            return Ok(());
        }
        let line = state.lines + 1;
        let corrupt = |detail: String| SessionError::Corrupt {
            path: path.to_path_buf(),
            line,
            detail,
        };
        match serde_json::from_str::<Line>(buf.trim_end()) {
            Ok(Line::Header {
                id, cwd, cwd_id, ..
            }) if line == 1 => state.header = Some(SessionInfo { id, cwd, cwd_id }),
            Ok(Line::Event(e)) if line > 1 => state.events.push(e),
            Ok(_) => {
                return Err(corrupt(
                    "a header must be the first line and only the first".into(),
                ))
            }
            Err(e) => return Err(corrupt(e.to_string())),
        }
        state.lines = line;
        state.consumed += n as u64;
    }
}

fn to_sdk(e: SessionError) -> Error {
    let code = match e {
        SessionError::NotFound(_) => codes::SESSION_NOT_FOUND,
        SessionError::InvalidId(_) => cordis_sdk::codes::INVALID_ARGUMENT,
        _ => codes::SESSION_STORE,
    };
    Error::new(code, e.to_string())
}

/// The store as the host's `sessions` service.
#[derive(Clone)]
pub struct SessionsService(pub Arc<SessionStore>);

impl Sessions for SessionsService {
    fn info(&self, id: String) -> Result<SessionInfo> {
        crate::scope::check_session(&id, "`sessions.info`")?;
        self.0.get(&id).map_err(to_sdk)
    }

    fn events(&self, query: EventQuery) -> Result<Vec<SessionEvent>> {
        crate::scope::check_session(&query.session, "`sessions.events`")?;
        self.0
            .events(&query.session, query.kind.as_deref())
            .map_err(to_sdk)
    }

    fn append(&self, event: NewEvent) -> Result<u64> {
        crate::scope::check_session(&event.session, "`sessions.append`")?;
        self.0
            .append(&event.session, &event.kind, event.data)
            .map_err(to_sdk)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only sessions made for one call are pruned, and only when their log is older than
    /// asked; a long-lived session stays however old it is.
    #[test]
    fn prune_removes_only_old_one_call_sessions() {
        let state = tempfile::tempdir().unwrap();
        let cwd = tempfile::tempdir().unwrap();
        let store = SessionStore::new(state.path());
        let kept = store.create(cwd.path()).unwrap().id;
        let old_call = store
            .create_with(cwd.path(), Some(Origin::Call))
            .unwrap()
            .id;
        let new_call = store
            .create_with(cwd.path(), Some(Origin::Call))
            .unwrap()
            .id;
        let day_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(86_400);
        for id in [&kept, &old_call] {
            let file = File::options()
                .append(true)
                .open(store.path_of(id))
                .unwrap();
            file.set_modified(day_ago).unwrap();
        }
        let hour = std::time::Duration::from_secs(3600);
        assert_eq!(store.prune(hour).unwrap(), [old_call.as_str()]);
        assert!(matches!(
            store.get(&old_call),
            Err(SessionError::NotFound(_))
        ));
        assert_eq!(store.prune(hour).unwrap(), Vec::<String>::new());
        assert_eq!(store.prune(std::time::Duration::ZERO).unwrap(), [new_call]);
        let mut left = store.list();
        left.sort();
        assert_eq!(left, [kept.as_str()]);
        store.append(&kept, "x", serde_json::json!({})).unwrap();
        assert_eq!(store.events(&kept, None).unwrap().len(), 1);
    }

    #[test]
    fn create_append_replay_and_torn_tail() {
        let state = tempfile::tempdir().unwrap();
        let cwd = tempfile::tempdir().unwrap();
        let store = SessionStore::new(state.path());
        let info = store.create(cwd.path()).unwrap();
        assert_eq!(info.cwd, cwd.path().canonicalize().unwrap());
        store
            .append(
                &info.id,
                "sandbox/mode",
                serde_json::json!({"mode": "read-only"}),
            )
            .unwrap();
        let path = store.path_of(&info.id);
        // A crash mid-append leaves a torn last line.
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"{\"type\":\"event\",\"seq\":2,\"ki").unwrap();
        drop(f);

        let reopened = SessionStore::new(state.path());
        // Another process's store sees appends made after it opened the log.
        let watcher = SessionStore::new(state.path());
        assert_eq!(watcher.events(&info.id, None).unwrap().len(), 1);
        let events = reopened.events(&info.id, Some("sandbox/mode")).unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].data["mode"], "read-only");
        assert_eq!(
            reopened
                .append(&info.id, "x", serde_json::json!(1))
                .unwrap(),
            2
        );
        let again = SessionStore::new(state.path());
        assert_eq!(again.events(&info.id, None).unwrap().len(), 2);
        assert_eq!(watcher.events(&info.id, None).unwrap().len(), 2);
    }

    #[test]
    fn a_crash_seen_by_a_store_that_already_has_the_log_open_is_cut_before_its_append() {
        let state = tempfile::tempdir().unwrap();
        let cwd = tempfile::tempdir().unwrap();
        let store = SessionStore::new(state.path());
        let info = store.create(cwd.path()).unwrap();
        store.append(&info.id, "a", serde_json::json!(1)).unwrap();
        // Another process crashes mid-append while this store has the log open.
        let path = store.path_of(&info.id);
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"{\"type\":\"event\",\"seq\":2,").unwrap();
        drop(f);
        assert_eq!(
            store.append(&info.id, "b", serde_json::json!(2)).unwrap(),
            2
        );
        let fresh = SessionStore::new(state.path());
        let kinds: Vec<String> = fresh
            .events(&info.id, None)
            .unwrap()
            .into_iter()
            .map(|e| e.kind)
            .collect();
        assert_eq!(kinds, ["a", "b"]);
    }

    #[test]
    fn appenders_in_separate_stores_keep_sequence_numbers_dense() {
        let state = tempfile::tempdir().unwrap();
        let cwd = tempfile::tempdir().unwrap();
        let info = SessionStore::new(state.path()).create(cwd.path()).unwrap();
        // Separate stores open the log separately, as separate processes do.
        let seqs: Vec<u64> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..4)
                .map(|w| {
                    let (dir, id) = (state.path(), &info.id);
                    scope.spawn(move || {
                        let store = SessionStore::new(dir);
                        (0..25)
                            .map(|i| store.append(id, "n", serde_json::json!([w, i])).unwrap())
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            workers
                .into_iter()
                .flat_map(|w| w.join().unwrap())
                .collect()
        });
        let mut sorted = seqs.clone();
        sorted.sort();
        assert_eq!(sorted, (1..=100).collect::<Vec<u64>>());
        let events = SessionStore::new(state.path())
            .events(&info.id, None)
            .unwrap();
        let on_disk: Vec<u64> = events.iter().map(|e| e.seq).collect();
        assert_eq!(on_disk, (1..=100).collect::<Vec<u64>>());
    }

    #[test]
    fn corrupt_middle_line_names_file_and_line() {
        let state = tempfile::tempdir().unwrap();
        let cwd = tempfile::tempdir().unwrap();
        let store = SessionStore::new(state.path());
        let info = store.create(cwd.path()).unwrap();
        let path = store.path_of(&info.id);
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"garbage\n{\"type\":\"event\",\"seq\":1,\"kind\":\"k\",\"data\":null}\n")
            .unwrap();
        drop(f);
        let err = SessionStore::new(state.path()).get(&info.id).unwrap_err();
        let text = err.to_string();
        assert!(text.contains(&format!("{}:2:", path.display())), "{text}");
    }

    #[test]
    fn unknown_ids_are_not_found_and_malicious_ones_invalid() {
        let state = tempfile::tempdir().unwrap();
        let store = SessionStore::new(state.path());
        let real = store.create(state.path()).unwrap();
        // A valid-looking log at every traversal target: without the id check, each of
        // these ids would find it.
        let planted = |path: &Path| {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            let header =
                serde_json::json!({"type": "header", "version": 1, "id": "evil", "cwd": "/"});
            std::fs::write(path, format!("{header}\n")).unwrap();
        };
        planted(&state.path().join("evil.jsonl"));
        planted(&state.path().join("sessions/sub/evil.jsonl"));
        let abs = state.path().join("abs-evil");
        planted(&abs.with_extension("jsonl"));
        let long = "a".repeat(5000);
        let invalid = [
            "../evil".to_string(),
            "sub/evil".to_string(),
            abs.display().to_string(),
            "..".to_string(),
            "evil\0".to_string(),
            "séance".to_string(),
            "".to_string(),
            long.clone(),
            format!("{}\n", real.id),
        ];
        for id in &invalid {
            match store.get(id) {
                Err(SessionError::InvalidId(shown)) => {
                    assert!(shown.len() < 200, "the id is shown cut: {shown}");
                    assert!(!shown.contains('\0') && !shown.contains('\n'), "{shown}");
                }
                other => panic!("{id:?}: expected InvalidId, got {:?}", other.map(|i| i.cwd)),
            }
            assert!(matches!(
                store.append(id, "sandbox/mode", serde_json::json!({})),
                Err(SessionError::InvalidId(_))
            ));
            assert!(matches!(
                store.events(id, None),
                Err(SessionError::InvalidId(_))
            ));
        }
        assert!(matches!(store.get("nope"), Err(SessionError::NotFound(_))));
        assert!(matches!(
            store.get(&"a".repeat(MAX_ID_LEN)),
            Err(SessionError::NotFound(_))
        ));
        assert_eq!(store.get(&real.id).unwrap().id, real.id);
    }

    #[test]
    fn the_state_dir_follows_flag_then_environment() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                vars.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| std::ffi::OsString::from(v))
            }
        };
        let all: &[(&str, &str)] = &[
            (STATE_DIR_ENV, "/state"),
            ("XDG_STATE_HOME", "/xdg"),
            ("HOME", "/home/me"),
        ];
        let dir = |flag: Option<&str>, vars| state_dir_from(flag.map(Path::new), env(vars));
        let some = |p: &str| Some(PathBuf::from(p));
        assert_eq!(dir(Some("/flag"), all), some("/flag"));
        assert_eq!(dir(None, all), some("/state"));
        let empty_state: &[(&str, &str)] = &[
            (STATE_DIR_ENV, ""),
            ("XDG_STATE_HOME", "/xdg"),
            ("HOME", "/home/me"),
        ];
        assert_eq!(dir(None, empty_state), some("/xdg/cordis"));
        let home_only: &[(&str, &str)] = &[("XDG_STATE_HOME", ""), ("HOME", "/home/me")];
        assert_eq!(dir(None, home_only), some("/home/me/.local/state/cordis"));
        assert_eq!(dir(None, &[("HOME", "")]), None);
        assert_eq!(dir(None, &[]), None);
    }

    #[test]
    fn ids_are_fresh_listed_and_shown_cut() {
        let state = tempfile::tempdir().unwrap();
        let store = SessionStore::new(state.path());
        let a = store.create(state.path()).unwrap();
        let b = store.create(state.path()).unwrap();
        assert_ne!(a.id, b.id);
        assert!(check_id(&a.id).is_ok(), "{}", a.id);
        let mut ids = vec![a.id.clone(), b.id.clone()];
        ids.sort();
        assert_eq!(store.list(), ids);
        let shown = |id: &str| match check_id(id) {
            Err(SessionError::InvalidId(shown)) => shown,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            shown(&"/".repeat(80)),
            format!("{:?} (80 bytes)", "/".repeat(80))
        );
        assert_eq!(
            shown(&"/".repeat(81)),
            format!("{:?}… (81 bytes)", "/".repeat(80))
        );
    }

    #[test]
    fn the_service_speaks_the_store_with_stable_error_codes() {
        let state = tempfile::tempdir().unwrap();
        let store = Arc::new(SessionStore::new(state.path()));
        let info = store.create(state.path()).unwrap();
        let service = SessionsService(store);
        let append = |kind: &str| {
            service.append(NewEvent {
                session: info.id.clone(),
                kind: kind.into(),
                data: serde_json::json!({"n": kind}),
            })
        };
        assert_eq!(append("a").unwrap(), 1);
        assert_eq!(append("b").unwrap(), 2);
        let events = service
            .events(EventQuery {
                session: info.id.clone(),
                kind: Some("b".into()),
            })
            .unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(
            (events[0].seq, events[0].data["n"].as_str()),
            (2, Some("b"))
        );
        assert_eq!(service.info(info.id.clone()).unwrap().cwd, info.cwd);
        let code = |id: &str| service.info(id.to_string()).unwrap_err().code;
        assert_eq!(code("s0"), "SESSION_NOT_FOUND");
        assert_eq!(code("s0"), codes::SESSION_NOT_FOUND);
        assert_eq!(code("../x"), cordis_sdk::codes::INVALID_ARGUMENT);
    }

    #[test]
    fn a_header_only_first_and_events_only_after_it() {
        let state = tempfile::tempdir().unwrap();
        let store = SessionStore::new(state.path());
        let info = store.create(state.path()).unwrap();
        let path = store.path_of(&info.id);
        let header = std::fs::read_to_string(&path).unwrap();
        // A second header, then an event in a log that starts with one.
        std::fs::write(&path, format!("{header}{header}")).unwrap();
        let err = SessionStore::new(state.path()).get(&info.id).unwrap_err();
        assert!(
            matches!(err, SessionError::Corrupt { line: 2, .. }),
            "{err}"
        );
        // An event first (the header after it): refused at the event, line 1, as out of place.
        let event = r#"{"type":"event","seq":1,"kind":"k","data":null}"#;
        std::fs::write(&path, format!("{event}\n{header}")).unwrap();
        let err = SessionStore::new(state.path()).get(&info.id).unwrap_err();
        assert!(
            matches!(&err, SessionError::Corrupt { line: 1, detail, .. } if detail.contains("only the first")),
            "{err}"
        );
    }
}
