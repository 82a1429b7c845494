//! The file mechanics every `fs` backend shares: argument checks, the mapping of I/O errors
//! to the `fs` error codes, the read operations, and the two mutations (atomic write, edit)
//! performed through a handle to the target's parent directory ([`Target`]). A backend only
//! decides HOW that handle is obtained: ambiently ([`Target::ambient`]) or resolved beneath a
//! writable root ([`Target::beneath`]), which is what makes the sandbox fence race-free.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::UNIX_EPOCH;

use cap_std::ambient_authority;
use cap_std::fs::{Dir, OpenOptions};
use cordis_sdk::{Error, Result};
use dsh_fs_api::codes;
use dsh_fs_api::{DirEntry, Edited, Kind, Stat, Written};
use dsh_sandbox::SandboxMode;

/// Checks that `path` is usable: non-empty, without NUL bytes, absolute.
pub fn check_path(path: &Path) -> Result<()> {
    let raw = path.as_os_str();
    if raw.is_empty() {
        return Err(Error::invalid("the path is empty")
            .with_help("pass an absolute path, e.g. /home/me/project/notes.txt"));
    }
    if raw.as_encoded_bytes().contains(&0) {
        return Err(Error::invalid(format!(
            "the path {:?} contains a NUL byte",
            path.display().to_string()
        ))
        .with_help("remove the NUL byte; file names cannot contain it"));
    }
    if !path.is_absolute() {
        return Err(
            Error::invalid(format!("the path `{}` is relative", path.display())).with_help(
                "resolve it against the session's working directory and pass the absolute path",
            ),
        );
    }
    Ok(())
}

/// `true` when `e` is cap-std's refusal of a path that resolved outside its directory
/// handle (a symlink or `..` leading out). The OS's own EACCES/EPERM carry an errno; this
/// one does not.
pub fn is_escape(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::PermissionDenied && e.raw_os_error().is_none()
}

/// The `FS_SANDBOX_DENIED` error: the policy (not the OS) refused a mutation of `path`.
pub fn sandbox_denied(mode: SandboxMode, path: &Path, why: &str) -> Error {
    Error::new(
        codes::FS_SANDBOX_DENIED,
        format!(
            "{}: cannot modify `{}` under {mode} mode: {why}",
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
    .with_data(serde_json::json!({ "mode": mode.as_str() }))
}

/// Maps an I/O error from operation `op` on `path` to an `fs` error code.
pub fn io_error(e: io::Error, op: &str, path: &Path) -> Error {
    const EROFS: i32 = 30;
    let (code, help) = match e.kind() {
        io::ErrorKind::NotFound => (
            codes::FS_NOT_FOUND,
            "check the path; list the parent directory to see what exists",
        ),
        io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem => (
            codes::FS_PERMISSION_DENIED,
            "the operating system refused; check the file's permissions and the mount",
        ),
        io::ErrorKind::IsADirectory | io::ErrorKind::NotADirectory => (
            codes::FS_WRONG_KIND,
            "a directory is in the way of a file, or a file where a directory was expected",
        ),
        _ if e.raw_os_error() == Some(EROFS) => (
            codes::FS_PERMISSION_DENIED,
            "the file system is mounted read-only",
        ),
        _ => (codes::FS_IO, "check the path and the file system"),
    };
    Error::new(code, format!("cannot {op} `{}`: {e}", path.display())).with_help(help)
}

/// Canonicalizes an absolute path (the deepest existing ancestor is resolved).
pub fn resolve(path: &Path) -> Result<PathBuf> {
    check_path(path)?;
    dsh_sandbox::canonical_path(path).map_err(|e| io_error(e, "resolve", path))
}

fn kind_of(t: std::fs::FileType) -> Kind {
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

/// Metadata of `path`, following symlinks.
pub fn stat(path: &Path) -> Result<Stat> {
    check_path(path)?;
    let m = std::fs::metadata(path).map_err(|e| io_error(e, "stat", path))?;
    let modified_ms = m
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_millis() as u64);
    Ok(Stat {
        kind: kind_of(m.file_type()),
        size: m.len(),
        modified_ms,
    })
}

fn utf8(bytes: Vec<u8>, path: &Path) -> Result<String> {
    String::from_utf8(bytes).map_err(|e| {
        Error::new(
            codes::FS_NOT_TEXT,
            format!(
                "`{}` is not UTF-8 text (invalid byte at offset {})",
                path.display(),
                e.utf8_error().valid_up_to()
            ),
        )
        .with_help("only text files can be read or edited as text")
    })
}

/// The whole file at `path` as UTF-8 text.
pub fn read_text(path: &Path) -> Result<String> {
    check_path(path)?;
    let bytes = std::fs::read(path).map_err(|e| io_error(e, "read", path))?;
    utf8(bytes, path)
}

/// The entries of directory `path`, sorted by name (kinds do not follow symlinks).
pub fn list_dir(path: &Path) -> Result<Vec<DirEntry>> {
    check_path(path)?;
    let rd = std::fs::read_dir(path).map_err(|e| io_error(e, "list", path))?;
    let mut out = Vec::new();
    for entry in rd {
        let entry = entry.map_err(|e| io_error(e, "list", path))?;
        let kind = entry
            .file_type()
            .map(kind_of)
            .map_err(|e| io_error(e, "list", &entry.path()))?;
        out.push(DirEntry {
            name: entry.file_name().to_string_lossy().into_owned(),
            kind,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// One mutex per canonical path: a read-match-write (or a write) of one file is a critical
/// section, so two concurrent edits of the same file never lose either change. Entries are
/// dropped when nobody holds or waits for them.
#[derive(Default)]
pub struct PathLocks {
    map: Mutex<HashMap<PathBuf, Arc<Mutex<()>>>>,
}

impl PathLocks {
    /// Runs `f` while holding the lock for `path`.
    pub fn with<T>(&self, path: &Path, f: impl FnOnce() -> T) -> T {
        let entry = {
            let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
            map.entry(path.to_path_buf()).or_default().clone()
        };
        let out = {
            let _held = entry.lock().unwrap_or_else(|e| e.into_inner());
            f()
        };
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        // The map's reference and ours: nobody else holds or waits for it.
        if Arc::strong_count(&entry) == 2 {
            map.remove(path);
        }
        out
    }
}

/// Whether a mutation creates missing parent directories (a write does, an edit does not).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Parents {
    /// Create them.
    Create,
    /// They must exist.
    Existing,
}

/// A file to mutate, reached through a handle to its parent directory. Every operation is
/// relative to that handle: the temp file and the rename both happen inside it.
pub struct Target {
    parent: Dir,
    name: OsString,
    path: PathBuf,
    fence: Option<SandboxMode>,
}

fn split(path: &Path) -> Result<(&Path, OsString)> {
    match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) => Ok((parent, name.to_os_string())),
        _ => Err(Error::new(
            codes::FS_WRONG_KIND,
            format!("`{}` is a directory, not a file", path.display()),
        )
        .with_help("name a file beneath the directory")),
    }
}

impl Target {
    /// The file at canonical `path`, its parent directory opened ambiently (no
    /// confinement); with [`Parents::Create`] missing parent directories are created first.
    pub fn ambient(path: &Path, parents: Parents) -> Result<Target> {
        let (parent, name) = split(path)?;
        if parents == Parents::Create {
            std::fs::create_dir_all(parent)
                .map_err(|e| io_error(e, "create the directories of", path))?;
        }
        let parent = Dir::open_ambient_dir(parent, ambient_authority())
            .map_err(|e| io_error(e, "open the directory of", path))?;
        Ok(Target {
            parent,
            name,
            path: path.to_path_buf(),
            fence: None,
        })
    }

    /// The file at canonical `path`, which must lie beneath the canonical writable `root`.
    /// The parent directories are created and opened THROUGH a handle to `root`, every
    /// component resolved beneath it (openat2 `RESOLVE_BENEATH` where available): a symlink
    /// swapped in after the containment check cannot lead outside. Such an escape is
    /// reported as `FS_SANDBOX_DENIED` under `mode`.
    pub fn beneath(
        root: &Path,
        path: &Path,
        parents: Parents,
        mode: SandboxMode,
    ) -> Result<Target> {
        let rel = path.strip_prefix(root).map_err(|_| {
            sandbox_denied(
                mode,
                path,
                &format!("it is not beneath `{}`", root.display()),
            )
        })?;
        if rel.as_os_str().is_empty() {
            return Err(Error::new(
                codes::FS_WRONG_KIND,
                format!(
                    "`{}` is the writable root itself, a directory",
                    path.display()
                ),
            )
            .with_help("name a file beneath the directory"));
        }
        let (rel_parent, name) = split(rel)?;
        let fenced = |e: io::Error, op: &str| {
            if is_escape(&e) {
                sandbox_denied(
                    mode,
                    path,
                    "a symlink or `..` leads outside the writable root",
                )
            } else {
                io_error(e, op, path)
            }
        };
        let root_dir = Dir::open_ambient_dir(root, ambient_authority())
            .map_err(|e| io_error(e, "open the writable root for", path))?;
        let parent = if rel_parent.as_os_str().is_empty() {
            root_dir
        } else {
            if parents == Parents::Create {
                match root_dir.create_dir_all(rel_parent) {
                    // Something appeared there meanwhile (a directory, a file or a symlink):
                    // opening it below decides whether it is a directory beneath the root.
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    r => r.map_err(|e| fenced(e, "create the directories of"))?,
                }
            }
            root_dir
                .open_dir(rel_parent)
                .map_err(|e| fenced(e, "open the directory of"))?
        };
        Ok(Target {
            parent,
            name,
            path: path.to_path_buf(),
            fence: Some(mode),
        })
    }

    /// The canonical path of the file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn err(&self, e: io::Error, op: &str) -> Error {
        match self.fence {
            Some(mode) if is_escape(&e) => sandbox_denied(
                mode,
                &self.path,
                "a symlink leads outside the writable root",
            ),
            _ => io_error(e, op, &self.path),
        }
    }

    /// Atomically replaces (or creates) the file: a temp file in the same directory is
    /// written and fsynced, then renamed over the target. The temp file never outlives a
    /// failure.
    pub fn write(&self, content: &[u8]) -> Result<Written> {
        let existing = match self.parent.symlink_metadata(&self.name) {
            Ok(m) => Some(m),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(self.err(e, "inspect")),
        };
        if existing.as_ref().is_some_and(|m| m.is_dir()) {
            return Err(Error::new(
                codes::FS_WRONG_KIND,
                format!("`{}` is a directory, not a file", self.path.display()),
            )
            .with_help("name a file, not a directory"));
        }
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let tmp = OsString::from(format!(
            ".{}.{}-{}.tmp",
            self.name.to_string_lossy(),
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let mut file = self
            .parent
            .open_with(&tmp, OpenOptions::new().write(true).create_new(true))
            .map_err(|e| self.err(e, "create a temp file next to"))?;
        let written = (|| -> io::Result<()> {
            file.write_all(content)?;
            if let Some(m) = existing.as_ref().filter(|m| m.is_file()) {
                file.set_permissions(m.permissions())?;
            }
            file.sync_all()?;
            drop(file);
            self.parent.rename(&tmp, &self.parent, &self.name)
        })();
        if let Err(e) = written {
            let _ = self.parent.remove_file(&tmp);
            return Err(self.err(e, "write"));
        }
        Ok(Written {
            bytes: content.len() as u64,
            created: existing.is_none(),
        })
    }

    /// The file's text, read through the parent handle.
    pub fn read_text(&self) -> Result<String> {
        let bytes = self
            .parent
            .read(&self.name)
            .map_err(|e| self.err(e, "read"))?;
        utf8(bytes, &self.path)
    }

    /// Replaces `old` with `new` (exactly one occurrence unless `replace_all`) and writes
    /// the result atomically. Run it under [`PathLocks::with`] for a critical section.
    pub fn edit(&self, old: &str, new: &str, replace_all: bool) -> Result<Edited> {
        if old.is_empty() {
            return Err(Error::invalid("`old_string` is empty")
                .with_help("pass the exact text to replace; use write_text to create a file"));
        }
        let text = self.read_text()?;
        let count = text.matches(old).count();
        if count == 0 {
            return Err(Error::new(
                codes::FS_EDIT_NO_MATCH,
                format!("`old_string` was not found in `{}`", self.path.display()),
            )
            .with_help("read the file and copy the exact text, including whitespace"));
        }
        if count > 1 && !replace_all {
            return Err(Error::new(
                codes::FS_EDIT_AMBIGUOUS,
                format!(
                    "`old_string` occurs {count} times in `{}`",
                    self.path.display()
                ),
            )
            .with_help("add surrounding context so it matches once, or set replace_all"));
        }
        let updated = if replace_all {
            text.replace(old, new)
        } else {
            text.replacen(old, new, 1)
        };
        self.write(updated.as_bytes())?;
        Ok(Edited {
            replacements: if replace_all { count as u64 } else { 1 },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_checks_name_the_problem() {
        let check = |p: &str, needle: &str| {
            let err = check_path(Path::new(p)).unwrap_err();
            assert_eq!(err.code, cordis_sdk::codes::INVALID_ARGUMENT, "{p:?}");
            assert!(err.message.contains(needle), "{p:?}: {}", err.message);
        };
        check("", "empty");
        check("/a\0b", "NUL");
        check("rel/x", "relative");
        assert!(check_path(Path::new("/abs")).is_ok());
    }

    #[test]
    fn write_edit_round_trip_and_kinds() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().canonicalize().unwrap();
        let file = root.join("a/b/c.txt");
        let t =
            Target::beneath(&root, &file, Parents::Create, SandboxMode::WorkspaceWrite).unwrap();
        assert!(t.write(b"one two two").unwrap().created);
        assert!(!t.write(b"one two two").unwrap().created);
        assert_eq!(
            t.edit("two", "2", false).unwrap_err().code,
            codes::FS_EDIT_AMBIGUOUS
        );
        assert_eq!(
            t.edit("zzz", "2", false).unwrap_err().code,
            codes::FS_EDIT_NO_MATCH
        );
        assert_eq!(t.edit("two", "2", true).unwrap().replacements, 2);
        assert_eq!(read_text(&file).unwrap(), "one 2 2");
        let names: Vec<String> = list_dir(&root.join("a/b"))
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(names, ["c.txt"], "no temp file is left behind");
        let err = Target::beneath(&root, &root, Parents::Create, SandboxMode::WorkspaceWrite)
            .err()
            .unwrap();
        assert_eq!(err.code, codes::FS_WRONG_KIND);
        std::fs::write(root.join("bin"), [0xff, 0xfe]).unwrap();
        assert_eq!(
            read_text(&root.join("bin")).unwrap_err().code,
            codes::FS_NOT_TEXT
        );
        assert_eq!(
            read_text(&root.join("none")).unwrap_err().code,
            codes::FS_NOT_FOUND
        );
    }
}
