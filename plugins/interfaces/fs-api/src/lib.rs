//! The `fs` seam: the interface every filesystem backend (`dsh-fs-local`, `dsh-fs-sandbox`)
//! provides and every consumer (`dsh-tool-fs`) injects. Paths are absolute: the caller
//! resolves a model's relative path against the session cwd. The mutations carry an
//! optional per-call [`SandboxExecutionPolicy`]; a plain local backend ignores it. Reads
//! open only regular files, never blocking on a FIFO or a device; [`ReadLines`] is the
//! bounded read for anything a model asks for.
//!
//! # Using it from a plugin
//!
//! Declare the injection in `metadata()` (`.injects::<FsClient>(FS)`), take the client in
//! `apply` (`ctx.inject(FS)?`), and call the [`FileSystem`] methods on it. The rules a
//! consumer follows:
//!
//! - **Resolve the calling session's policy on every call** (`sandboxPolicy`'s `resolve`
//!   with the call's session id) and pass it as `policy` to every mutation and read: the
//!   policy changes while a session runs (`cordis session set-mode`, an approved
//!   escalation), so a policy kept from an earlier call is wrong. `None` means the
//!   backend's deployment default, never the session's. The policy is a
//!   [`Shared`] value: pass on the one `resolve` gave (a policy made
//!   by hand converts with `.into()`).
//! - **Absolute paths only**, resolved against `CallContext::session.cwd` (the session's
//!   immutable root), never against the host's working directory.
//! - **Bounded reads for model input**: [`FileSystem::read_lines`] with caps, not
//!   [`FileSystem::read_text`], for anything a model asked for.
//! - **Errors are data**: each method fails with a [`cordis_sdk::Error`] whose `code` is one
//!   of [`codes`]; a sandbox refusal is [`codes::FS_SANDBOX_DENIED`] with the mode in
//!   `data`, and a tool shows it to the model as an error result, not a failure.
//!
//! ```no_run
//! use cordis_sdk::CallContext;
//! use dsh_fs_api::{FileSystem, FsClient, WriteText};
//! use dsh_sandbox::{ResolveArgs, SandboxPolicy, SandboxPolicyClient};
//!
//! /// Writes `text` to `name` in the calling session's directory, under its policy.
//! fn save(
//!     fs: &FsClient,
//!     policy: &SandboxPolicyClient,
//!     call: &CallContext,
//!     name: &str,
//!     text: &str,
//! ) -> cordis_sdk::Result<u64> {
//!     let resolved = policy.resolve(ResolveArgs {
//!         session: Some(call.session.id.clone()),
//!         mode: None,
//!     })?;
//!     let written = fs.write_text(WriteText {
//!         path: call.session.cwd.join(name),
//!         content: text.to_string(),
//!         policy: Some(resolved),
//!     })?;
//!     Ok(written.bytes)
//! }
//! ```
//!
//! For tests, the feature `testing` adds [`testing::TempDirFs`](crate::testing), an `fs`
//! over a temporary directory to pass to `cordis-test` as a stand-in.

use std::path::{Path, PathBuf};

/// Stand-ins for plugin tests (feature `testing`).
#[cfg(any(test, feature = "testing"))]
pub mod testing;

use dsh_sandbox::{Fence, SandboxExecutionPolicy, SandboxMode, Shared};
use serde::{Deserialize, Serialize};

/// The registry name of the filesystem service.
pub const FS: &str = "fs";

/// Error codes of the `fs` interface (`Error::code`).
pub mod codes {
    cordis_sdk::error_codes! {
        /// The policy fence refused a mutation; `data` is `{"mode": "<mode>"}`.
        FS_SANDBOX_DENIED;
        /// The operating system refused (EACCES/EPERM/EROFS).
        FS_PERMISSION_DENIED;
        /// No such file or directory.
        FS_NOT_FOUND;
        /// The file is not UTF-8 text (a NUL byte or invalid UTF-8: binary content).
        FS_NOT_TEXT;
        /// The path is not the kind of object the operation needs: a directory where a file
        /// was expected (or the reverse), or a FIFO, socket or device where a regular file was.
        FS_WRONG_KIND;
        /// `edit_text`: `old_string` was not found.
        FS_EDIT_NO_MATCH;
        /// `edit_text`: `old_string` matched more than once and `replace_all` was false.
        FS_EDIT_AMBIGUOUS;
        /// The file (or an edit's result) is larger than an operation that handles it whole
        /// accepts.
        FS_TOO_LARGE;
        /// A read of a process's own `/proc` entries (`/proc/self`, `/proc/<pid>`, …), which
        /// would reveal the host's environment, memory or open files.
        FS_READ_DENIED;
        /// Any other I/O error.
        FS_IO;
    }
}

/// What kind of filesystem object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (as seen by `list_dir`; `stat` follows links).
    Symlink,
    /// Anything else.
    Other,
}

impl Kind {
    /// The kind of a file type as the OS reports it.
    pub fn of(t: std::fs::FileType) -> Kind {
        if t.is_symlink() {
            Kind::Symlink
        } else if t.is_dir() {
            Kind::Dir
        } else if t.is_file() {
            Kind::File
        } else {
            Kind::Other
        }
    }
}

/// The `FS_SANDBOX_DENIED` error: the policy (not the OS) refused a mutation of `path`.
pub fn sandbox_denied(mode: SandboxMode, path: &Path, why: &str) -> cordis_sdk::Error {
    sandbox_refused(mode, "modify", path, why)
}

/// The `FS_SANDBOX_DENIED` error for operation `op` (`modify`, `read`) of `path`: the
/// denial marker first, then what was refused and why. The one shape of a policy refusal
/// every `fs` gives (the bundled backends and [`testing::TempDirFs`]); a tool passes it on
/// as it is.
pub fn sandbox_refused(mode: SandboxMode, op: &str, path: &Path, why: &str) -> cordis_sdk::Error {
    cordis_sdk::Error::new(
        codes::FS_SANDBOX_DENIED,
        format!(
            "{}: cannot {op} `{}` under {mode} mode: {why}",
            dsh_sandbox::denial_marker(mode),
            path.display()
        ),
    )
    .with_help(match mode {
        SandboxMode::ReadOnly => {
            "read-only mode allows no modification; ask for a wider mode to change files"
                .to_string()
        }
        _ => "modify files beneath the workspace root or a temp area, or ask for a wider mode"
            .to_string(),
    })
    .with_data(cordis_sdk::serde_json::json!({ "mode": mode.as_str() }))
}

/// The refusal of a mutation of `path`, which resolves to `canonical`, outside every
/// writable root of `roots`.
pub fn outside_roots(
    mode: SandboxMode,
    path: &Path,
    canonical: &Path,
    roots: &[PathBuf],
) -> cordis_sdk::Error {
    let listed: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
    sandbox_denied(
        mode,
        path,
        &format!(
            "it resolves to `{}`, outside the writable roots ({})",
            canonical.display(),
            listed.join(", ")
        ),
    )
}

/// The refusal of a read of `path`, which the policy's `denyRead` rule `rule` covers.
pub fn read_denied(mode: SandboxMode, path: &Path, rule: &str) -> cordis_sdk::Error {
    sandbox_refused(
        mode,
        "read",
        path,
        &format!("reading it is denied by the policy (`denyRead`: `{rule}`)"),
    )
}

/// The writable root beneath which `canonical` (asked as `path`) may be modified under
/// `fence` in `mode`, or the refusal: outside every writable root, or a path the fence
/// protects ([`guard`]). The one decision every `fs` makes before it opens anything.
pub fn writable_root<'a>(
    fence: &'a Fence,
    mode: SandboxMode,
    path: &Path,
    canonical: &Path,
) -> cordis_sdk::Result<&'a PathBuf> {
    let roots = &fence.writable_roots;
    let Some(root) = dsh_sandbox::containing_root(canonical, roots) else {
        return Err(outside_roots(mode, path, canonical, roots));
    };
    guard(fence, mode, path, canonical)?;
    Ok(root)
}

/// Refuses a mutation of `canonical` (asked as `path`) that the fence protects (a path
/// that defines the composition, a configured protected path, a git directory) or makes
/// unreadable.
pub fn guard(
    fence: &Fence,
    mode: SandboxMode,
    path: &Path,
    canonical: &Path,
) -> cordis_sdk::Result<()> {
    if let Some(rule) = fence.protected.covering(canonical) {
        return Err(sandbox_denied(
            mode,
            path,
            &format!(
                "`{rule}` is protected: it defines the running composition or the policy lists it; only an approved escalation to danger-full-access may change it"
            ),
        ));
    }
    if let Some(git) = fence.git_entry(canonical) {
        return Err(sandbox_denied(
            mode,
            path,
            &format!(
                "`{}` is a git directory: git runs code from it (hooks, config), so only an approved escalation to danger-full-access may change it",
                git.display()
            ),
        ));
    }
    if let Some(rule) = fence.deny_read.covering(canonical) {
        return Err(sandbox_denied(
            mode,
            path,
            &format!("it is unreadable under the policy (`denyRead`: `{rule}`)"),
        ));
    }
    Ok(())
}

/// Maps an I/O error from operation `op` on `path` to this interface's error codes, with
/// a help text; what every backend (and the stand-in) reports for an OS refusal.
pub fn io_error(e: std::io::Error, op: &str, path: &std::path::Path) -> cordis_sdk::Error {
    use std::io::ErrorKind;
    const EROFS: i32 = 30;
    let (code, help) = match e.kind() {
        ErrorKind::NotFound => (
            codes::FS_NOT_FOUND,
            "check the path; list the parent directory to see what exists",
        ),
        ErrorKind::PermissionDenied | ErrorKind::ReadOnlyFilesystem => (
            codes::FS_PERMISSION_DENIED,
            "the operating system refused; check the file's permissions and the mount",
        ),
        ErrorKind::IsADirectory | ErrorKind::NotADirectory => (
            codes::FS_WRONG_KIND,
            "a directory is in the way of a file, or a file where a directory was expected",
        ),
        _ if e.raw_os_error() == Some(EROFS) => (
            codes::FS_PERMISSION_DENIED,
            "the file system is mounted read-only",
        ),
        _ => (codes::FS_IO, "check the path and the file system"),
    };
    cordis_sdk::Error::new(code, format!("cannot {op} `{}`: {e}", path.display())).with_help(help)
}

/// `stat` result (follows symlinks).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stat {
    /// Kind.
    pub kind: Kind,
    /// Size in bytes.
    pub size: u64,
    /// Modification time, milliseconds since the Unix epoch.
    pub modified_ms: Option<u64>,
}

/// One directory entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    /// File name.
    pub name: String,
    /// Kind (not following symlinks).
    pub kind: Kind,
}

/// `list_dir` arguments.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListDir {
    /// The directory.
    pub path: PathBuf,
    /// The most entries returned (the first ones by name); at least 1.
    pub max_entries: u64,
    /// The per-call policy, whose `denyRead` a sandboxed backend enforces; `None` means
    /// the backend's deployment default. A plain local backend ignores it.
    #[serde(default)]
    pub policy: Option<Shared<SandboxExecutionPolicy>>,
}

/// A directory's entries: the first [`ListDir::max_entries`] by name, and how many it has.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listing {
    /// The entries returned, sorted by name.
    pub entries: Vec<DirEntry>,
    /// How many entries the directory has.
    pub total: u64,
}

/// `read_lines` arguments: a page of lines, bounded by [`ReadCaps`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadLines {
    /// Absolute path of a regular text file.
    pub path: PathBuf,
    /// The first line to return, counting from 1.
    pub offset: u64,
    /// The most lines to return; `None`: as many as the caps allow.
    pub limit: Option<u64>,
    /// What one page may hold at most.
    pub caps: ReadCaps,
    /// The per-call policy, whose `denyRead` a sandboxed backend enforces; `None` means
    /// the backend's deployment default. A plain local backend ignores it.
    #[serde(default)]
    pub policy: Option<Shared<SandboxExecutionPolicy>>,
}

/// The most one `read_lines` page holds. Every cap is at least 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadCaps {
    /// Lines per page.
    pub max_lines: u64,
    /// Bytes of text per page (the first line is always returned, cut to this size).
    pub max_bytes: u64,
    /// Bytes per line: a longer line is cut and marked (see [`Lines::long_lines`]).
    pub max_line_bytes: u64,
}

/// What ended a page before the end of the file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cut {
    /// The cap [`ReadCaps::max_lines`].
    MaxLines,
    /// The cap [`ReadCaps::max_bytes`].
    MaxBytes,
    /// The next line holds binary content, which is never returned: `what` (e.g. "a NUL
    /// byte") at byte `at` of the file. (When the page's first line does, the read fails
    /// with `FS_NOT_TEXT` instead.)
    Binary {
        /// What was found.
        what: String,
        /// Where, in bytes from the start of the file.
        at: u64,
    },
}

/// `read_lines` result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lines {
    /// The lines from `offset` on, each with its own line break. A line longer than
    /// [`ReadCaps::max_line_bytes`] (or `max_bytes`, when smaller) is cut there, on a
    /// character boundary, and ends in [`line_cut_marker`] before its break.
    #[serde(serialize_with = "cordis_sdk::json_text")]
    pub text: String,
    /// How many lines `text` holds.
    pub count: u64,
    /// The file's size as the file system reports it (0 for many `/proc` files, which
    /// are read all the same).
    pub size: u64,
    /// What ended the page while the file goes on; `None` when the page ends at the end
    /// of the file or after `limit` lines.
    pub cut: Option<Cut>,
    /// The number of lines in the file, when the read reached its end.
    pub total: Option<u64>,
    /// The line numbers of the lines in `text` that were cut.
    pub long_lines: Vec<u64>,
}

/// What ends a cut line in [`Lines::text`]: `bytes` is the whole line's length, its line
/// break excluded.
pub fn line_cut_marker(bytes: impl std::fmt::Display) -> String {
    format!(" [… line cut: {bytes} bytes]")
}

/// `write_text` arguments.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteText {
    /// Absolute target path; parent directories are created.
    pub path: PathBuf,
    /// The whole new content.
    #[serde(serialize_with = "cordis_sdk::json_text")]
    pub content: String,
    /// The per-call policy; `None` means the backend's deployment default.
    pub policy: Option<Shared<SandboxExecutionPolicy>>,
}

/// `write_text` result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Written {
    /// Bytes written.
    pub bytes: u64,
    /// The file did not exist before.
    pub created: bool,
}

/// `edit_text` arguments.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EditText {
    /// Absolute path of an existing text file.
    pub path: PathBuf,
    /// The exact text to replace.
    pub old_string: String,
    /// The replacement.
    pub new_string: String,
    /// Replace every occurrence (otherwise exactly one must match).
    pub replace_all: bool,
    /// The per-call policy; `None` means the backend's deployment default.
    pub policy: Option<Shared<SandboxExecutionPolicy>>,
}

/// `edit_text` result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Edited {
    /// How many occurrences were replaced.
    pub replacements: u64,
}

cordis_sdk::interface! {
    /// A text filesystem. Reads always pass; mutations are atomic (temp file + rename).
    pub trait FileSystem as FsClient ("dsh.fs", 2) {
        /// Canonicalizes an absolute path (the deepest existing ancestor is resolved).
        fn resolve(&self, path: PathBuf) -> PathBuf;
        /// Metadata, following symlinks.
        fn stat(&self, path: PathBuf) -> Stat;
        /// The whole regular file as UTF-8 text, however large; a FIFO, socket or device
        /// is refused without blocking on it.
        fn read_text(&self, path: PathBuf) -> String;
        /// A page of lines of a regular text file, bounded by its caps whatever the
        /// file's size; binary content and FIFOs, sockets and devices are refused (the
        /// latter without blocking on them).
        fn read_lines(&self, args: ReadLines) -> Lines;
        /// The first `max_entries` directory entries by name, and their total: memory
        /// stays bounded whatever the directory's size.
        fn list_dir(&self, args: ListDir) -> Listing;
        /// Atomically replaces (or creates) a file.
        fn write_text(&self, args: WriteText) -> Written;
        /// Read-match-write in one critical section per path.
        fn edit_text(&self, args: EditText) -> Edited;
        /// The capability fact: `None` for an unconfined backend, else its default mode.
        fn sandbox_mode(&self, unit: ()) -> Option<SandboxMode>;
    }
}
