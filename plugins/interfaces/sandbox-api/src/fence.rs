//! The fence of one call, computed from its policy: where it may write, what it may never
//! modify, what it may never read. Every enforcing family (the fs fence, the shell's mount
//! view) asks [`Fence::of`], so they cannot drift.

use std::path::{Path, PathBuf};

use glob::{MatchOptions, Pattern};

use crate::{is_within, FileId, SandboxExecutionPolicy};

/// What stays read-only beneath every writable root while it exists: the repository's
/// whole git directory, or the `.git` file of a linked worktree or submodule (as Codex
/// does). git reads code from many places in it (`config`, `hooks/`, `commondir`,
/// `config.worktree`, `modules/*/`, `worktrees/*/`, `info/`, the `gitdir:` pointer itself),
/// so protecting named files leaves aliases open; a command commits through an approved
/// escalation. A command may still create a new repository where there was none.
pub const GIT_PROTECTED: [&str; 1] = [".git"];

/// The most directory entries one glob expansion visits ([`PathSet::expand_beneath`]).
pub const EXPAND_BUDGET: usize = 50_000;

/// A set of paths and glob patterns; a path is covered when it or one of its ancestors is
/// one of the paths or matches one of the patterns. A pattern is matched against the whole
/// canonical path, `*` never crossing a `/` and a `**` component crossing any number:
/// `**/.env` covers every `.env`, `/home/me/.ssh` is a plain path.
#[derive(Clone, Debug, Default)]
pub struct PathSet {
    /// The plain paths (canonical).
    pub paths: Vec<PathBuf>,
    /// The patterns, as written.
    pub patterns: Vec<String>,
    compiled: Vec<Pattern>,
}

/// How patterns match: `*` and `?` never match a `/`, a leading `.` is matched like any
/// other character.
const MATCHING: MatchOptions = MatchOptions {
    case_sensitive: true,
    require_literal_separator: true,
    require_literal_leading_dot: false,
};

/// Whether a configured entry is a glob pattern rather than a path.
pub fn is_pattern(path: &Path) -> bool {
    path.to_string_lossy().contains(['*', '?', '['])
}

impl PathSet {
    /// The set of `entries`; a pattern that does not compile is kept as a plain path (the
    /// policy owner rejects such patterns in its config, so only a hand-built policy can
    /// hold one).
    pub fn new(entries: impl IntoIterator<Item = PathBuf>) -> PathSet {
        let mut out = PathSet::default();
        for entry in entries {
            let text = entry.to_string_lossy().into_owned();
            if is_pattern(&entry) {
                if let Ok(pattern) = Pattern::new(&text) {
                    out.compiled.push(pattern);
                    out.patterns.push(text);
                    continue;
                }
            }
            if !out.paths.contains(&entry) {
                out.paths.push(entry);
            }
        }
        out
    }

    /// Nothing in the set.
    pub fn is_empty(&self) -> bool {
        self.paths.is_empty() && self.patterns.is_empty()
    }

    /// The entry (path or pattern) that covers the canonical `path`, if any.
    pub fn covering(&self, path: &Path) -> Option<String> {
        if let Some(p) = self.paths.iter().find(|p| is_within(path, p)) {
            return Some(p.display().to_string());
        }
        path.ancestors().find_map(|a| {
            let i = self.matching(a)?;
            Some(self.patterns[i].clone())
        })
    }

    /// The existing paths beneath `root` this set covers, outermost only (what a mount view
    /// must hide or re-bind): its plain paths inside `root`, then what its patterns match in
    /// a walk of `root` (symlinks not followed, a matched directory not entered). `Err`
    /// when the walk passes [`EXPAND_BUDGET`] entries, or a path or directory cannot be
    /// looked at for any reason but not existing (it may hold a match).
    pub fn expand_beneath(&self, root: &Path) -> Result<Vec<PathBuf>, SearchError> {
        let unreadable = |path: &Path, source| SearchError::Unreadable {
            path: path.to_path_buf(),
            source,
        };
        let mut out: Vec<PathBuf> = Vec::new();
        for path in self.paths.iter().filter(|p| is_within(p, root)) {
            match path.symlink_metadata() {
                Ok(_) => out.push(path.clone()),
                Err(e) if absent(&e) => {}
                Err(e) => return Err(unreadable(path, e)),
            }
        }
        if !self.patterns.is_empty() {
            let mut visited = 0;
            let mut stack = vec![root.to_path_buf()];
            while let Some(dir) = stack.pop() {
                let read = match std::fs::read_dir(&dir) {
                    Ok(read) => read,
                    // Removed since its parent was listed: it holds nothing now.
                    Err(e) if absent(&e) => continue,
                    Err(e) => return Err(unreadable(&dir, e)),
                };
                for entry in read {
                    let entry = entry.map_err(|e| unreadable(&dir, e))?;
                    visited += 1;
                    if visited > EXPAND_BUDGET {
                        return Err(SearchError::TooLarge { visited });
                    }
                    let path = entry.path();
                    if self.matching(&path).is_some() {
                        out.push(path);
                    } else if entry
                        .file_type()
                        .map_err(|e| unreadable(&path, e))?
                        .is_dir()
                    {
                        stack.push(path);
                    }
                }
            }
        }
        out.sort();
        out.dedup();
        let outermost: Vec<PathBuf> = out
            .iter()
            .filter(|p| !out.iter().any(|q| q != *p && is_within(p, q)))
            .cloned()
            .collect();
        Ok(outermost)
    }
}

impl PathSet {
    /// The index of the first pattern `path` matches as a whole.
    fn matching(&self, path: &Path) -> Option<usize> {
        self.compiled
            .iter()
            .position(|p| p.matches_path_with(path, MATCHING))
    }
}

/// Whether a lookup failed because the path does not exist (a part of it missing, or a
/// file where a directory would be), not because it could not be looked at.
pub fn absent(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
    )
}

/// Checks a configured pattern: the error says what is wrong with it.
pub fn check_pattern(pattern: &str) -> Result<(), String> {
    Pattern::new(pattern).map(|_| ()).map_err(|e| e.to_string())
}

/// Why a search of a tree ([`PathSet::expand_beneath`], [`crate::repositories_beneath`])
/// could not finish: the caller refuses rather than act on part of it.
#[derive(Debug)]
pub enum SearchError {
    /// The tree holds more entries than one search may visit.
    TooLarge {
        /// Directories visited before stopping.
        visited: usize,
    },
    /// A directory could not be listed.
    Unreadable {
        /// The directory.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

impl std::fmt::Display for SearchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SearchError::TooLarge { visited } => {
                write!(f, "the search visited more than {visited} entries")
            }
            SearchError::Unreadable { path, source } => {
                write!(f, "`{}` cannot be listed: {source}", path.display())
            }
        }
    }
}

impl std::error::Error for SearchError {}

/// One call's fence.
#[derive(Clone, Debug, Default)]
pub struct Fence {
    /// Where a `workspace-write` call may modify: canonical, deduplicated, the workspace
    /// root first.
    pub writable_roots: Vec<PathBuf>,
    /// What no call below `danger-full-access` may modify: the policy's protected paths
    /// and, beneath every writable root, [`GIT_PROTECTED`].
    pub protected: PathSet,
    /// The protected paths that are protected only while they exist (the git directories
    /// of [`GIT_PROTECTED`]); every other protected path is kept from being created too.
    pub optional: Vec<PathBuf>,
    /// What no call below `danger-full-access` may read.
    pub deny_read: PathSet,
    /// Candidate roots left out, each with the reason (for the start-up log).
    pub left_out: Vec<String>,
    /// The identity of each writable root, in the same order.
    identities: Vec<FileId>,
}

impl Fence {
    /// The fence of `policy`. The writable roots are the workspace root, the policy's extra
    /// roots and `/tmp` (each canonicalized, dropped when missing), and the process temp
    /// dir (`TMPDIR`) only when it is not `/`, not `$HOME` or an ancestor of it, and holds
    /// none of the protected paths: a temp dir that would make the host's own files
    /// writable is left out, and [`Fence::left_out`] says why. Each root's identity is
    /// recorded ([`Fence::identity`]) for whoever opens it to check. A workspace root whose
    /// identity the policy gives ([`SandboxExecutionPolicy::workspace_root_id`], as the
    /// policy owner always does) that no longer resolves to itself or is no longer that
    /// directory was moved and replaced since it was checked: the fence is refused
    /// ([`RootMoved`]).
    pub fn of(policy: &SandboxExecutionPolicy) -> Result<Fence, RootMoved> {
        let mut fence = Fence::default();
        let mut roots: Vec<(PathBuf, FileId)> = Vec::new();
        let add = |root: Root, roots: &mut Vec<(PathBuf, FileId)>| -> Result<(), RootMoved> {
            let moved = |now: String| RootMoved {
                root: root.path.to_path_buf(),
                now,
            };
            // A root whose identity the policy gives is used only as that directory: it
            // must still resolve to itself (no link swapped in) and be a directory.
            let strict = root.expect.is_some();
            let canonical = match root.path.canonicalize() {
                Ok(canonical) => canonical,
                Err(e) if strict => return Err(moved(format!("it cannot be resolved: {e}"))),
                Err(_) => return Ok(()),
            };
            if strict && canonical != root.path {
                return Err(moved(format!(
                    "it now resolves to `{}`",
                    canonical.display()
                )));
            }
            // Not followed: what `canonical` names itself, a directory unless it was just
            // swapped for something else.
            let id = match canonical.symlink_metadata() {
                Ok(meta) if meta.is_dir() => FileId::of(&meta),
                Ok(_) if strict => return Err(moved("it is not a directory".to_string())),
                Err(e) if strict => return Err(moved(e.to_string())),
                _ => return Ok(()),
            };
            if root.expect.is_some_and(|want| want != id) {
                return Err(moved("another directory is there now".to_string()));
            }
            if !roots.iter().any(|(r, _)| *r == canonical) {
                roots.push((canonical, id));
            }
            Ok(())
        };
        add(
            Root {
                path: &policy.workspace_root,
                expect: policy.workspace_root_id,
            },
            &mut roots,
        )?;
        for r in &policy.writable_roots {
            add(Root::as_named(r), &mut roots)?;
        }
        add(Root::as_named(Path::new("/tmp")), &mut roots)?;
        let temp = std::env::temp_dir();
        let already = temp
            .canonicalize()
            .is_ok_and(|t| roots.iter().any(|(r, _)| *r == t));
        match temp_dir_refusal(&temp, &policy.protected_paths) {
            _ if already => {}
            Some(why) => fence.left_out.push(format!(
                "the temp dir `{}` (TMPDIR) is not a writable root: {why}",
                temp.display()
            )),
            None => add(Root::as_named(&temp), &mut roots)?,
        }
        let (roots, identities): (Vec<PathBuf>, Vec<FileId>) = roots.into_iter().unzip();
        let mut protected: Vec<PathBuf> = policy
            .protected_paths
            .iter()
            .flat_map(|p| {
                if is_pattern(p) {
                    vec![p.clone()]
                } else {
                    both_ends(p)
                }
            })
            .collect();
        for root in &roots {
            fence
                .optional
                .extend(GIT_PROTECTED.iter().map(|p| root.join(p)));
            for git in GIT_PROTECTED {
                protected.extend(git_link_targets(&root.join(git)));
            }
            // The `.git` of every submodule and linked worktree of the repository the root
            // is in, or is: kept from being created too, unless the submodule's directory
            // is missing as well (then its parent would be the one kept read-only).
            for entry in crate::git::nested_git_entries(&enclosing_work_tree(root)) {
                if !is_within(&entry, root) {
                    continue;
                }
                if entry.parent().is_some_and(Path::is_dir) {
                    protected.push(entry);
                } else {
                    fence.optional.push(entry);
                }
            }
        }
        protected.extend(fence.optional.iter().cloned());
        fence.writable_roots = roots;
        fence.identities = identities;
        fence.protected = PathSet::new(protected);
        fence.deny_read = PathSet::new(policy.deny_read.iter().cloned());
        Ok(fence)
    }

    /// The identity `root` (one of [`Fence::writable_roots`]) had when the fence was made:
    /// whoever opens the root checks that it opened this directory, so a root swapped after
    /// the fence was made is refused, not followed.
    pub fn identity(&self, root: &Path) -> Option<FileId> {
        let i = self.writable_roots.iter().position(|r| r == root)?;
        self.identities.get(i).copied()
    }

    /// Checks that `opened` (what opening `root` gave) is the directory the fence recorded
    /// for it.
    pub fn check_opened(&self, root: &Path, opened: FileId) -> Result<(), RootMoved> {
        RootMoved::unless(root, self.identity(root), opened)
    }
}

/// A candidate writable root of [`Fence::of`].
struct Root<'a> {
    path: &'a Path,
    /// The identity the policy owner verified, if it says: then the root is used only as
    /// that directory.
    expect: Option<FileId>,
}

impl<'a> Root<'a> {
    /// A root used where it resolves now (dropped when missing): the temp areas, and the
    /// extra roots, which the view pins where another root holds them.
    fn as_named(path: &'a Path) -> Root<'a> {
        Root { path, expect: None }
    }
}

/// A root of the policy no longer names the directory it named when it was checked: it
/// was renamed away and something else put in its place. Refused, never followed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RootMoved {
    /// The root, as the policy names it.
    pub root: PathBuf,
    /// What it is now.
    pub now: String,
}

impl RootMoved {
    /// `Ok` when opening `root` gave `opened`, the directory `want` says it was (or nothing
    /// was recorded).
    pub fn unless(root: &Path, want: Option<FileId>, opened: FileId) -> Result<(), RootMoved> {
        match want {
            Some(want) if want != opened => Err(RootMoved {
                root: root.to_path_buf(),
                now: "another directory is there now".to_string(),
            }),
            _ => Ok(()),
        }
    }
}

impl std::fmt::Display for RootMoved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the writable root `{}` no longer names the directory that was checked ({}); refusing to follow it",
            self.root.display(),
            self.now
        )
    }
}

impl std::error::Error for RootMoved {}

impl Fence {
    /// The `.git` entry at any depth beneath a writable root that the canonical `path` is
    /// or lies in, if any: no call below `danger-full-access` modifies a repository's git
    /// directory, or makes one, wherever it is in a root (git runs code from it).
    pub fn git_entry(&self, path: &Path) -> Option<PathBuf> {
        let root = self.writable_roots.iter().find(|r| is_within(path, r))?;
        let mut at = root.clone();
        for part in path.strip_prefix(root).ok()?.components() {
            at.push(part);
            if part.as_os_str() == ".git" {
                return Some(at);
            }
        }
        None
    }
}

/// Both ends of a protected path that runs through symbolic links: where it leads (its
/// canonical path, as far as it exists) and every link on the way, each as the link's own
/// path (its directory resolved). Protecting only the target leaves the link to be
/// repointed; protecting only the link leaves the target writable through another name.
pub fn both_ends(path: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut at = PathBuf::new();
    let mut parts = path.components();
    for part in parts.by_ref() {
        at.push(part);
        match at.symlink_metadata() {
            Ok(meta) if meta.file_type().is_symlink() => {
                out.push(at.clone());
                match at.canonicalize() {
                    Ok(target) => at = target,
                    // Dangling or looping: the link itself is what there is to protect,
                    // with what it names beside it as written.
                    Err(_) => break,
                }
            }
            Ok(_) => {}
            Err(_) => break,
        }
    }
    at.extend(parts);
    if !out.contains(&at) {
        out.push(at);
    }
    out
}

/// The targets of the symbolic links git follows inside the git directory `git_dir` (its
/// entries and its `hooks/`'s, such as `hooks -> ../githooks`): protected like the git
/// directory itself, or code could be written through them by another name.
fn git_link_targets(git_dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in [git_dir.to_path_buf(), git_dir.join("hooks")] {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_symlink()) {
                out.push(crate::canonical_path(&entry.path()).unwrap_or_else(|_| entry.path()));
            }
        }
    }
    out
}

/// The work tree of the repository `root` lies in: the nearest of `root` and its
/// ancestors that has a `.git`; `root` itself when none has.
fn enclosing_work_tree(root: &Path) -> PathBuf {
    root.ancestors()
        .find(|dir| dir.join(".git").symlink_metadata().is_ok())
        .unwrap_or(root)
        .to_path_buf()
}

/// Why `temp` may not be a writable root, if it may not.
fn temp_dir_refusal(temp: &Path, protected: &[PathBuf]) -> Option<String> {
    let Ok(temp) = temp.canonicalize() else {
        return Some("it does not exist".to_string());
    };
    if temp == Path::new("/") {
        return Some("it is `/`, the whole file system".to_string());
    }
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .and_then(|h| PathBuf::from(h).canonicalize().ok());
    if let Some(home) = home.filter(|h| is_within(h, &temp)) {
        return Some(format!(
            "it is the home directory `{}` or holds it",
            home.display()
        ));
    }
    if let Some(p) = protected
        .iter()
        .find(|p| !is_pattern(p) && is_within(p, &temp))
    {
        return Some(format!("it holds the protected path `{}`", p.display()));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_cover_paths_beneath_and_patterns_anywhere() {
        let set = PathSet::new(
            ["/h/.ssh", "**/.env", "/w/*.key", "/w/[bad"]
                .into_iter()
                .map(PathBuf::from),
        );
        assert_eq!(
            set.covering(Path::new("/h/.ssh/id")).as_deref(),
            Some("/h/.ssh")
        );
        assert_eq!(set.covering(Path::new("/h/.sshx")), None);
        assert_eq!(
            set.covering(Path::new("/a/b/.env")).as_deref(),
            Some("**/.env")
        );
        assert_eq!(
            set.covering(Path::new("/a/.env/x")).as_deref(),
            Some("**/.env")
        );
        assert_eq!(set.covering(Path::new("/a/b/.envrc")), None);
        assert_eq!(
            set.covering(Path::new("/w/a.key")).as_deref(),
            Some("/w/*.key")
        );
        assert_eq!(set.covering(Path::new("/w/d/a.key")), None);
        // A pattern that does not compile is a plain path: nothing is silently dropped.
        assert_eq!(
            set.covering(Path::new("/w/[bad/x")).as_deref(),
            Some("/w/[bad")
        );
    }

    #[test]
    fn expansion_finds_outermost_matches_and_is_bounded() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().canonicalize().unwrap();
        for d in ["a/.env", "b/c"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::fs::write(root.join("a/.env/inner.env"), "").unwrap();
        std::fs::write(root.join("b/c/.env"), "").unwrap();
        std::os::unix::fs::symlink("/", root.join("b/up")).unwrap();
        let set = PathSet::new([
            PathBuf::from("**/.env"),
            root.join("b/c"),
            root.join("gone"),
        ]);
        assert_eq!(
            set.expand_beneath(&root).unwrap(),
            vec![root.join("a/.env"), root.join("b/c")]
        );
        for i in 0..=EXPAND_BUDGET {
            if i % 1000 == 0 {
                std::fs::create_dir_all(root.join(format!("many/{i}"))).unwrap();
            }
            std::fs::write(root.join(format!("many/{}/{i}", i / 1000 * 1000)), "").unwrap();
        }
        assert!(matches!(
            set.expand_beneath(&root),
            Err(SearchError::TooLarge { .. })
        ));
    }

    #[test]
    fn git_internals_are_protected_beneath_every_root() {
        let tmp = tempfile::tempdir().unwrap();
        let ws = tmp.path().canonicalize().unwrap();
        let fence = Fence::of(&SandboxExecutionPolicy {
            mode: crate::SandboxMode::WorkspaceWrite,
            workspace_root: ws.clone(),
            ..Default::default()
        })
        .unwrap();
        for inside in [
            ".git/hooks/pre-commit",
            ".git/config",
            ".git/commondir",
            ".git",
        ] {
            assert!(
                fence.protected.covering(&ws.join(inside)).is_some(),
                "{inside}"
            );
        }
        assert!(fence.optional.contains(&ws.join(".git")));
        assert!(fence.protected.covering(&ws.join(".gitignore")).is_none());
        assert!(fence.protected.covering(&ws.join("src/main.rs")).is_none());
    }

    #[test]
    fn a_temp_dir_that_would_swallow_the_host_is_left_out() {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().canonicalize().unwrap().join("home");
        std::fs::create_dir_all(home.join("ws")).unwrap();
        let protected = [home.join("ws/cordis.yml")];
        assert!(temp_dir_refusal(Path::new("/"), &[])
            .unwrap()
            .contains("whole file system"));
        assert!(temp_dir_refusal(&home.join("missing"), &[]).is_some());
        assert!(temp_dir_refusal(&home.join("ws"), &protected)
            .unwrap()
            .contains("cordis.yml"));
        assert_eq!(temp_dir_refusal(&home.join("ws"), &[]), None);
    }

    #[test]
    fn a_link_is_protected_at_both_ends() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().canonicalize().unwrap();
        std::fs::create_dir_all(root.join("real/conf")).unwrap();
        std::os::unix::fs::symlink("real", root.join("link")).unwrap();
        std::os::unix::fs::symlink(root.join("gone"), root.join("dangling")).unwrap();
        assert_eq!(
            both_ends(&root.join("link/conf/app.yml")),
            [root.join("link"), root.join("real/conf/app.yml")]
        );
        assert_eq!(both_ends(&root.join("real/conf")), [root.join("real/conf")]);
        assert_eq!(
            both_ends(&root.join("dangling/x")),
            [root.join("dangling"), root.join("dangling/x")]
        );
        // Inside a git directory, what its links lead to is protected too.
        std::fs::create_dir_all(root.join("githooks")).unwrap();
        std::fs::create_dir_all(root.join(".git")).unwrap();
        std::os::unix::fs::symlink("../githooks", root.join(".git/hooks")).unwrap();
        let fence = Fence::of(&SandboxExecutionPolicy {
            mode: crate::SandboxMode::WorkspaceWrite,
            workspace_root: root.clone(),
            protected_paths: vec![root.join("link/conf")],
            ..Default::default()
        })
        .unwrap();
        for path in ["githooks/pre-commit", "real/conf/app.yml"] {
            assert!(
                fence.protected.covering(&root.join(path)).is_some(),
                "{path}"
            );
        }
        assert!(fence.protected.covering(&root.join("real/other")).is_none());
    }
}
