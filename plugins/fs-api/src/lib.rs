//! The `fs` seam: the interface every filesystem backend (`dsh-fs-local`, `dsh-fs-sandbox`)
//! provides and every consumer (`dsh-tool-fs`) injects. Paths are absolute: the caller
//! resolves a model's relative path against the session cwd. The mutations carry an
//! optional per-call [`SandboxExecutionPolicy`]; a plain local backend ignores it.

use std::path::PathBuf;

use dsh_sandbox::{SandboxExecutionPolicy, SandboxMode};
use serde::{Deserialize, Serialize};

/// The registry name of the filesystem service.
pub const FS: &str = "fs";

/// Error codes of the `fs` interface (`Error::code`).
pub mod codes {
    /// The policy fence refused a mutation; `data` is `{"mode": "<mode>"}`.
    pub const FS_SANDBOX_DENIED: &str = "FS_SANDBOX_DENIED";
    /// The operating system refused (EACCES/EPERM/EROFS).
    pub const FS_PERMISSION_DENIED: &str = "FS_PERMISSION_DENIED";
    /// No such file or directory.
    pub const FS_NOT_FOUND: &str = "FS_NOT_FOUND";
    /// The file is not UTF-8 text.
    pub const FS_NOT_TEXT: &str = "FS_NOT_TEXT";
    /// The path is a directory where a file was expected (or the reverse).
    pub const FS_WRONG_KIND: &str = "FS_WRONG_KIND";
    /// `edit_text`: `old_string` was not found.
    pub const FS_EDIT_NO_MATCH: &str = "FS_EDIT_NO_MATCH";
    /// `edit_text`: `old_string` matched more than once and `replace_all` was false.
    pub const FS_EDIT_AMBIGUOUS: &str = "FS_EDIT_AMBIGUOUS";
    /// Any other I/O error.
    pub const FS_IO: &str = "FS_IO";
}

/// What kind of filesystem object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
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

/// `write_text` arguments.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteText {
    /// Absolute target path; parent directories are created.
    pub path: PathBuf,
    /// The whole new content.
    pub content: String,
    /// The per-call policy; `None` means the backend's deployment default.
    pub policy: Option<SandboxExecutionPolicy>,
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
    pub policy: Option<SandboxExecutionPolicy>,
}

/// `edit_text` result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Edited {
    /// How many occurrences were replaced.
    pub replacements: u64,
}

cordis_sdk::interface! {
    /// A text filesystem. Reads always pass; mutations are atomic (temp file + rename).
    pub trait FileSystem as FsClient ("dsh.fs", 1) {
        /// Canonicalizes an absolute path (the deepest existing ancestor is resolved).
        fn resolve(&self, path: PathBuf) -> PathBuf;
        /// Metadata, following symlinks.
        fn stat(&self, path: PathBuf) -> Stat;
        /// The whole file as UTF-8 text.
        fn read_text(&self, path: PathBuf) -> String;
        /// Directory entries, sorted by name.
        fn list_dir(&self, path: PathBuf) -> Vec<DirEntry>;
        /// Atomically replaces (or creates) a file.
        fn write_text(&self, args: WriteText) -> Written;
        /// Read-match-write in one critical section per path.
        fn edit_text(&self, args: EditText) -> Edited;
        /// The capability fact: `None` for an unconfined backend, else its default mode.
        fn sandbox_mode(&self, unit: ()) -> Option<SandboxMode>;
    }
}
