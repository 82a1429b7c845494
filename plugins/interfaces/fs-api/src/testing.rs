//! A stand-in `fs` for plugin tests (feature `testing`): [`TempDirFs`], a plain filesystem
//! over a fresh temporary directory.
//!
//! ```
//! use dsh_fs_api::testing::TempDirFs;
//! use dsh_fs_api::{FileSystem, WriteText};
//!
//! let fs = TempDirFs::new().unwrap();
//! // With cordis-test: `PluginUnderTest::build(...)?.stand_in(dsh_fs_api::FS, fs.serve())`.
//! let path = fs.path().join("notes/a.txt");
//! fs.write_text(WriteText { path: path.clone(), content: "hi\n".into(), policy: None }).unwrap();
//! assert_eq!(std::fs::read_to_string(path).unwrap(), "hi\n");
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cordis_sdk::abi::ServiceBox;
use cordis_sdk::{Error, Result};
use dsh_sandbox::{Fence, SandboxExecutionPolicy, SandboxMode};

use crate::{
    codes, io_error, read_denied, sandbox_denied, sandbox_refused, writable_root, DirEntry,
    EditText, Edited, FileSystem, FsClient, Kind, Lines, ListDir, Listing, ReadLines, Stat,
    WriteText, Written,
};

/// An `fs` over a temporary directory (removed when the last clone is dropped): plain
/// `std::fs` (`sandbox_mode` is `None`, like `dsh-fs-local`), and every path must lie
/// inside the directory (anything else is refused with `FS_SANDBOX_DENIED`), so a test sees
/// exactly what its plugin wrote. A request that carries a policy (as a tool passes the one
/// its call resolved) is held to it as the bundled backends hold it, with the same
/// refusals (`FS_SANDBOX_DENIED`, the denial marker first): no mutation under `read-only`;
/// under `workspace-write` none outside the writable roots or of a protected path or git
/// directory; below `danger-full-access` no read of a `denyRead` path. Reads and edits
/// handle files whole; a page of `read_lines` honours its line and byte caps but does not
/// cut long lines.
#[derive(Clone)]
pub struct TempDirFs {
    _dir: Arc<tempfile::TempDir>,
    root: PathBuf,
}

impl TempDirFs {
    /// A fresh, empty directory.
    pub fn new() -> std::io::Result<TempDirFs> {
        let dir = tempfile::Builder::new().prefix("cordis-fs-").tempdir()?;
        let root = dir.path().canonicalize()?;
        Ok(TempDirFs {
            _dir: Arc::new(dir),
            root,
        })
    }

    /// The directory (canonical).
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// This stand-in as a service object, for `cordis-test`'s `stand_in(FS, ...)`.
    pub fn serve(&self) -> ServiceBox {
        FsClient::serve(self.clone())
    }

    /// `path`, refused unless it is absolute and lies inside the directory.
    fn inside(&self, path: &Path) -> Result<PathBuf> {
        let normal = path.is_absolute()
            && !path
                .components()
                .any(|c| matches!(c, std::path::Component::ParentDir));
        if normal && path.starts_with(&self.root) {
            return Ok(path.to_path_buf());
        }
        Err(Error::new(
            codes::FS_SANDBOX_DENIED,
            format!(
                "{} is outside the stand-in's directory {}",
                path.display(),
                self.root.display()
            ),
        ))
    }
}

/// What a request does to its path, for the policy it carries.
#[derive(Clone, Copy, PartialEq)]
enum Op {
    Read,
    Modify,
}

impl TempDirFs {
    /// Refuses what `policy` refuses (see [`TempDirFs`]); no policy refuses nothing.
    fn allowed(&self, policy: Option<&SandboxExecutionPolicy>, op: Op, path: &Path) -> Result<()> {
        let Some(policy) = policy else {
            return Ok(());
        };
        let mode = policy.mode;
        if mode == SandboxMode::DangerFullAccess {
            return Ok(());
        }
        if op == Op::Modify && mode == SandboxMode::ReadOnly {
            return Err(sandbox_denied(
                mode,
                path,
                "read-only mode allows no modification",
            ));
        }
        let canonical = dsh_sandbox::canonical_path(path).unwrap_or_else(|_| path.to_path_buf());
        let fence = Fence::of(policy).map_err(|moved| {
            let verb = if op == Op::Read { "read" } else { "modify" };
            sandbox_refused(mode, verb, path, &moved.to_string())
        })?;
        match op {
            Op::Read => match fence.deny_read.covering(&canonical) {
                Some(rule) => Err(read_denied(mode, path, &rule)),
                None => Ok(()),
            },
            Op::Modify => writable_root(&fence, mode, path, &canonical).map(drop),
        }
    }

    fn read(&self, path: &Path) -> Result<String> {
        let path = self.inside(path)?;
        let meta = std::fs::metadata(&path).map_err(|e| io_error(e, "read", &path))?;
        if !meta.is_file() {
            return Err(Error::new(
                codes::FS_WRONG_KIND,
                format!("{} is not a regular file", path.display()),
            ));
        }
        let bytes = std::fs::read(&path).map_err(|e| io_error(e, "read", &path))?;
        String::from_utf8(bytes).map_err(|_| {
            Error::new(
                codes::FS_NOT_TEXT,
                format!("{} is not UTF-8 text", path.display()),
            )
        })
    }
}

impl FileSystem for TempDirFs {
    fn resolve(&self, path: PathBuf) -> Result<PathBuf> {
        let path = self.inside(&path)?;
        Ok(path.canonicalize().unwrap_or(path))
    }

    fn stat(&self, path: PathBuf) -> Result<Stat> {
        let path = self.inside(&path)?;
        let meta = std::fs::metadata(&path).map_err(|e| io_error(e, "stat", &path))?;
        Ok(Stat {
            kind: Kind::of(meta.file_type()),
            size: meta.len(),
            modified_ms: meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_millis() as u64),
        })
    }

    fn read_text(&self, path: PathBuf) -> Result<String> {
        self.read(&path)
    }

    fn read_lines(&self, args: ReadLines) -> Result<Lines> {
        self.allowed(args.policy.as_deref(), Op::Read, &args.path)?;
        let text = self.read(&args.path)?;
        let all: Vec<&str> = text.split_inclusive('\n').collect();
        let first = args.offset.max(1) as usize - 1;
        let limit = args.limit.unwrap_or(u64::MAX).min(args.caps.max_lines) as usize;
        let mut page = String::new();
        let mut count = 0;
        for line in all.iter().skip(first).take(limit) {
            if count > 0 && (page.len() + line.len()) as u64 > args.caps.max_bytes {
                break;
            }
            page.push_str(line);
            count += 1;
        }
        let end = first + count >= all.len();
        Ok(Lines {
            text: page,
            count: count as u64,
            size: text.len() as u64,
            cut: None,
            total: end.then_some(all.len() as u64),
            long_lines: Vec::new(),
        })
    }

    fn list_dir(&self, args: ListDir) -> Result<Listing> {
        let path = self.inside(&args.path)?;
        self.allowed(args.policy.as_deref(), Op::Read, &path)?;
        let mut entries = std::fs::read_dir(&path)
            .map_err(|e| io_error(e, "list", &path))?
            .map(|entry| {
                let entry = entry.map_err(|e| io_error(e, "list", &path))?;
                Ok(DirEntry {
                    name: entry.file_name().to_string_lossy().into_owned(),
                    kind: entry.file_type().map_or(Kind::Other, Kind::of),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        let total = entries.len() as u64;
        entries.truncate(args.max_entries.max(1) as usize);
        Ok(Listing { entries, total })
    }

    fn write_text(&self, args: WriteText) -> Result<Written> {
        let path = self.inside(&args.path)?;
        self.allowed(args.policy.as_deref(), Op::Modify, &path)?;
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| io_error(e, "create", parent))?;
        }
        let created = !path.exists();
        let staging = path.with_extension("cordis-stand-in.tmp");
        std::fs::write(&staging, &args.content)
            .and_then(|()| std::fs::rename(&staging, &path))
            .map_err(|e| io_error(e, "write", &path))?;
        Ok(Written {
            bytes: args.content.len() as u64,
            created,
        })
    }

    fn edit_text(&self, args: EditText) -> Result<Edited> {
        self.allowed(args.policy.as_deref(), Op::Modify, &args.path)?;
        let text = self.read(&args.path)?;
        let found = text.matches(&args.old_string).count();
        if found == 0 || args.old_string.is_empty() {
            return Err(Error::new(
                codes::FS_EDIT_NO_MATCH,
                format!("`old_string` is not in {}", args.path.display()),
            ));
        }
        if found > 1 && !args.replace_all {
            return Err(Error::new(
                codes::FS_EDIT_AMBIGUOUS,
                format!(
                    "`old_string` occurs {found} times in {}; pass `replace_all` or more context",
                    args.path.display()
                ),
            ));
        }
        let edited = if args.replace_all {
            text.replace(&args.old_string, &args.new_string)
        } else {
            text.replacen(&args.old_string, &args.new_string, 1)
        };
        self.write_text(WriteText {
            path: args.path,
            content: edited,
            policy: None,
        })?;
        Ok(Edited {
            replacements: found as u64,
        })
    }

    fn sandbox_mode(&self, _unit: ()) -> Result<Option<SandboxMode>> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request carrying a policy is held to it with the bundled backends' refusals:
    /// nothing is written under `read-only`, a protected path or a git directory is refused
    /// under `workspace-write`, a `denyRead` path is not read, and `danger-full-access`
    /// allows all of it.
    #[test]
    fn a_policy_carried_by_a_request_is_held_as_the_bundled_backends_hold_it() {
        use dsh_sandbox::denial_marker;
        let fs = TempDirFs::new().unwrap();
        let root = fs.path().join("ws");
        std::fs::create_dir_all(root.join(".git")).unwrap();
        std::fs::write(root.join("secret.txt"), "s\n").unwrap();
        let policy = |mode| SandboxExecutionPolicy {
            mode,
            workspace_root: root.clone(),
            protected_paths: vec![root.join("cordis.yml")],
            deny_read: vec![root.join("secret.txt")],
            ..SandboxExecutionPolicy::default()
        };
        let write = |mode, name: &str| {
            fs.write_text(WriteText {
                path: root.join(name),
                content: "x".into(),
                policy: Some(policy(mode).into()),
            })
        };
        let refused = write(SandboxMode::ReadOnly, "a.txt").unwrap_err();
        assert_eq!(refused.code, codes::FS_SANDBOX_DENIED);
        assert!(
            refused.message.starts_with(&format!(
                "{}: cannot modify `{}` under read-only mode: read-only mode allows no modification",
                denial_marker(SandboxMode::ReadOnly),
                root.join("a.txt").display()
            )),
            "{refused}"
        );
        assert_eq!(
            refused.data,
            Some(cordis_sdk::serde_json::json!({"mode": "read-only"}))
        );
        assert!(!root.join("a.txt").exists());
        write(SandboxMode::WorkspaceWrite, "a.txt").unwrap();
        let edit = fs
            .edit_text(EditText {
                path: root.join("a.txt"),
                old_string: "x".into(),
                new_string: "y".into(),
                replace_all: false,
                policy: Some(policy(SandboxMode::ReadOnly).into()),
            })
            .unwrap_err();
        assert_eq!(edit.code, codes::FS_SANDBOX_DENIED, "{edit}");
        for (name, why) in [
            ("cordis.yml", "is protected"),
            (".git/config", "/.git` is protected"),
        ] {
            let e = write(SandboxMode::WorkspaceWrite, name).unwrap_err();
            assert_eq!(e.code, codes::FS_SANDBOX_DENIED, "{e}");
            assert!(e.message.contains(why), "{e}");
            assert!(!root.join(name).exists());
        }
        let read = |mode| {
            fs.read_lines(ReadLines {
                path: root.join("secret.txt"),
                offset: 1,
                limit: None,
                caps: crate::ReadCaps {
                    max_lines: 10,
                    max_bytes: 100,
                    max_line_bytes: 100,
                },
                policy: Some(policy(mode).into()),
            })
        };
        let e = read(SandboxMode::WorkspaceWrite).unwrap_err();
        assert!(e.message.contains("`denyRead`"), "{e}");
        assert_eq!(read(SandboxMode::DangerFullAccess).unwrap().text, "s\n");
        write(SandboxMode::DangerFullAccess, "cordis.yml").unwrap();
    }

    #[test]
    fn writes_reads_edits_and_lists_inside_and_refuses_outside() {
        let fs = TempDirFs::new().unwrap();
        let a = fs.path().join("d/a.txt");
        let w = fs
            .write_text(WriteText {
                path: a.clone(),
                content: "one\ntwo\nthree\n".into(),
                policy: None,
            })
            .unwrap();
        assert!(w.created && w.bytes == 14);
        let page = fs
            .read_lines(ReadLines {
                path: a.clone(),
                offset: 2,
                limit: Some(1),
                caps: crate::ReadCaps {
                    max_lines: 10,
                    max_bytes: 100,
                    max_line_bytes: 100,
                },
                policy: None,
            })
            .unwrap();
        assert_eq!(
            (page.text.as_str(), page.count, page.total),
            ("two\n", 1, None)
        );
        let edit = |old: &str, all| EditText {
            path: a.clone(),
            old_string: old.into(),
            new_string: "2".into(),
            replace_all: all,
            policy: None,
        };
        assert_eq!(fs.edit_text(edit("two", false)).unwrap().replacements, 1);
        assert_eq!(
            fs.edit_text(edit("nope", false)).unwrap_err().code,
            codes::FS_EDIT_NO_MATCH
        );
        assert_eq!(fs.read_text(a.clone()).unwrap(), "one\n2\nthree\n");
        let listing = fs
            .list_dir(ListDir {
                path: fs.path().join("d"),
                max_entries: 10,
                policy: None,
            })
            .unwrap();
        assert_eq!(listing.total, 1);
        assert_eq!(listing.entries[0].name, "a.txt");
        for outside in [PathBuf::from("/etc/passwd"), fs.path().join("../x")] {
            assert_eq!(
                fs.read_text(outside).unwrap_err().code,
                codes::FS_SANDBOX_DENIED
            );
        }
        assert_eq!(
            fs.stat(fs.path().join("none")).unwrap_err().code,
            codes::FS_NOT_FOUND
        );
    }
}
