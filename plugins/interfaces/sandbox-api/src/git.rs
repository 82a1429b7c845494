//! The git entries a person's git reads beneath a repository's work tree, found from git's
//! own records rather than by walking the tree: the `.git` of every submodule the index
//! records (a gitlink, followed into submodules of submodules), and the `.git` file of
//! every linked worktree. Those records live in the repository's git directory, which the
//! fence keeps read-only, so a command cannot hide a submodule from this list; a command
//! that could write one of the entries could point git at a config or hook of its own.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::fence::{absent, SearchError};

/// How deep submodules of submodules are followed.
const MAX_DEPTH: usize = 8;

/// The largest index read; a larger one is not searched for gitlinks.
const MAX_INDEX: u64 = 512 << 20;

/// The largest `.git` file or `gitdir` pointer read.
const MAX_POINTER: u64 = 4096;

/// The mode of a gitlink (a submodule's commit) in the index.
const GITLINK: u32 = 0o160000;

/// The `.git` entries git reads for the repository whose work tree is `worktree`, other
/// than `worktree/.git` itself: each submodule's (`<worktree>/<path>/.git`, at any depth of
/// nesting) and each linked worktree's `.git` file. Existing or not: a submodule that is
/// not checked out has none yet, and a command must not be able to make one.
pub fn nested_git_entries(worktree: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    collect(worktree, 0, &mut out);
    out
}

fn collect(worktree: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    let Some(gitdir) = git_dir(worktree) else {
        return;
    };
    if depth == 0 {
        // A linked worktree's `gitdir` names its `.git` file.
        if let Ok(entries) = std::fs::read_dir(gitdir.join("worktrees")) {
            for entry in entries.flatten() {
                if let Some(pointer) = read_small(&entry.path().join("gitdir")) {
                    let text = String::from_utf8_lossy(&pointer);
                    let path = PathBuf::from(text.trim_end_matches(['\n', '\r']));
                    if path.is_absolute() {
                        out.push(path);
                    }
                }
            }
        }
    }
    let sha256 = object_format_is_sha256(&gitdir);
    for link in gitlinks(&gitdir.join("index"), sha256) {
        let sub = worktree.join(OsStr::from_bytes(&link));
        out.push(sub.join(".git"));
        if depth + 1 < MAX_DEPTH {
            collect(&sub, depth + 1, out);
        }
    }
}

/// The most directories one search for repositories visits ([`repositories_beneath`]).
pub const REPOSITORY_BUDGET: usize = 200_000;

/// What a directory was when it was last read: device, inode, and the modification and
/// change times in nanoseconds (an entry added, removed or renamed in it changes them).
type DirStamp = (u64, u64, i64, i64, i64, i64);

/// One directory as last read: its stamp, whether it holds a `.git`, its subdirectories.
struct Listing {
    stamp: DirStamp,
    git: bool,
    children: Vec<std::ffi::OsString>,
}

/// The directory listings of recent searches, by root: a search re-reads only the
/// directories whose stamp changed since (one `lstat` per directory otherwise).
static LISTINGS: Mutex<Option<HashMap<PathBuf, HashMap<PathBuf, Listing>>>> = Mutex::new(None);

/// Every `.git` entry (directory, file or link) at any depth beneath `root`, other than
/// `root/.git`: the repositories a person's git may run code from, whether or not the
/// root's repository records them (a vendored copy with its own history is not a
/// submodule until someone runs `git add`). Symlinked directories are not followed and a
/// `.git` is not entered. `Err` with the number of directories visited when the tree has
/// more than [`REPOSITORY_BUDGET`]; a directory that exists but cannot be listed is `Err`
/// too (the caller refuses rather than guess), with its path and error.
pub fn repositories_beneath(root: &Path) -> Result<Vec<PathBuf>, SearchError> {
    search(root, REPOSITORY_BUDGET)
}

/// [`repositories_beneath`] with at most `budget` directories.
fn search(root: &Path, budget: usize) -> Result<Vec<PathBuf>, SearchError> {
    let mut all = LISTINGS.lock().unwrap_or_else(|e| e.into_inner());
    let all = all.get_or_insert_with(HashMap::new);
    let mut old = all.remove(root).unwrap_or_default();
    let mut new: HashMap<PathBuf, Listing> = HashMap::new();
    let mut found = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        if new.len() >= budget {
            return Err(SearchError::TooLarge { visited: new.len() });
        }
        let meta = match dir.symlink_metadata() {
            Ok(meta) => meta,
            // Removed since its parent was listed: nothing to protect there.
            Err(e) if absent(&e) => continue,
            Err(source) => return Err(SearchError::Unreadable { path: dir, source }),
        };
        if !meta.is_dir() {
            continue;
        }
        let stamp = (
            meta.dev(),
            meta.ino(),
            meta.mtime(),
            meta.mtime_nsec(),
            meta.ctime(),
            meta.ctime_nsec(),
        );
        let listing = match old.remove(&dir) {
            Some(listing) if listing.stamp == stamp => listing,
            _ => list(&dir, stamp)?,
        };
        if listing.git && dir != root {
            found.push(dir.join(".git"));
        }
        stack.extend(listing.children.iter().map(|c| dir.join(c)));
        new.insert(dir, listing);
    }
    if all.len() >= 16 {
        all.clear();
    }
    all.insert(root.to_path_buf(), new);
    found.sort();
    Ok(found)
}

/// Reads the directory `dir` (whose stamp is `stamp`) for [`repositories_beneath`].
fn list(dir: &Path, stamp: DirStamp) -> Result<Listing, SearchError> {
    let unreadable = |source| SearchError::Unreadable {
        path: dir.to_path_buf(),
        source,
    };
    let mut listing = Listing {
        stamp,
        git: false,
        children: Vec::new(),
    };
    for entry in std::fs::read_dir(dir).map_err(unreadable)? {
        let entry = entry.map_err(unreadable)?;
        let name = entry.file_name();
        if name == ".git" {
            listing.git = true;
        } else if entry.file_type().map_err(unreadable)?.is_dir() {
            listing.children.push(name);
        }
    }
    Ok(listing)
}

/// The git directory of the work tree `worktree`: its `.git` directory, or where its
/// `.git` file points (`gitdir: PATH`, relative to the work tree).
fn git_dir(worktree: &Path) -> Option<PathBuf> {
    let dot_git = worktree.join(".git");
    let meta = dot_git.symlink_metadata().ok()?;
    if meta.is_dir() {
        return Some(dot_git);
    }
    let text = read_small(&dot_git)?;
    let text = String::from_utf8_lossy(&text);
    let target = text.strip_prefix("gitdir:")?.trim();
    Some(worktree.join(target))
}

/// Whether the repository of `gitdir` names its objects by SHA-256 (its common config
/// says `extensions.objectFormat = sha256`).
fn object_format_is_sha256(gitdir: &Path) -> bool {
    let common = read_small(&gitdir.join("commondir"))
        .map(|c| gitdir.join(String::from_utf8_lossy(&c).trim()))
        .unwrap_or_else(|| gitdir.to_path_buf());
    let Ok(config) = std::fs::read_to_string(common.join("config")) else {
        return false;
    };
    config.lines().any(|line| {
        let line: String = line
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect::<String>()
            .to_ascii_lowercase();
        line == "objectformat=sha256"
    })
}

/// The bytes of the small file at `path`, if it is one.
fn read_small(path: &Path) -> Option<Vec<u8>> {
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() || meta.len() > MAX_POINTER {
        return None;
    }
    std::fs::read(path).ok()
}

/// What an index file was when its gitlinks were read.
type Stamp = (u64, u64, u64, i64, i64);

/// The gitlinks of recently read indexes, by path: a command reads the index of its
/// repository once per change of the index, not once per call.
static CACHE: Mutex<Option<Gitlinks>> = Mutex::new(None);

/// Index path → its stamp and its gitlink paths.
type Gitlinks = HashMap<PathBuf, (Stamp, Vec<Vec<u8>>)>;

/// The paths of the gitlinks recorded in the index at `index` (none when there is no
/// readable index, or it is larger than [`MAX_INDEX`]).
fn gitlinks(index: &Path, sha256: bool) -> Vec<Vec<u8>> {
    let Ok(meta) = std::fs::metadata(index) else {
        return Vec::new();
    };
    if !meta.is_file() || meta.len() > MAX_INDEX {
        return Vec::new();
    }
    let stamp = (
        meta.dev(),
        meta.ino(),
        meta.len(),
        meta.mtime(),
        meta.mtime_nsec(),
    );
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    let cache = cache.get_or_insert_with(HashMap::new);
    if let Some((seen, links)) = cache.get(index) {
        if *seen == stamp {
            return links.clone();
        }
    }
    let Ok(bytes) = std::fs::read(index) else {
        return Vec::new();
    };
    let links = parse_gitlinks(&bytes, if sha256 { 32 } else { 20 });
    if cache.len() >= 64 {
        cache.clear();
    }
    cache.insert(index.to_path_buf(), (stamp, links.clone()));
    links
}

/// The gitlink paths of an index file (versions 2, 3 and 4), whose object ids are
/// `id_len` bytes long. Stops at the first entry that does not parse.
pub(crate) fn parse_gitlinks(bytes: &[u8], id_len: usize) -> Vec<Vec<u8>> {
    let be32 = |at: usize| -> Option<u32> {
        let b = bytes.get(at..at + 4)?;
        Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    };
    let mut links = Vec::new();
    if bytes.get(..4) != Some(b"DIRC") {
        return links;
    }
    let (Some(version), Some(count)) = (be32(4), be32(8)) else {
        return links;
    };
    if !(2..=4).contains(&version) {
        return links;
    }
    let mut at = 12;
    let mut previous: Vec<u8> = Vec::new();
    for _ in 0..count {
        let entry = at;
        let Some(mode) = be32(entry + 24) else {
            break;
        };
        let flags_at = entry + 40 + id_len;
        let Some(flags) = bytes.get(flags_at..flags_at + 2) else {
            break;
        };
        let flags = u16::from_be_bytes([flags[0], flags[1]]);
        let mut name_at = flags_at + 2;
        if version >= 3 && flags & 0x4000 != 0 {
            name_at += 2;
        }
        let path = if version == 4 {
            let Some((strip, len)) = varint(bytes.get(name_at..).unwrap_or_default()) else {
                break;
            };
            let suffix_at = name_at + len;
            let Some(end) = bytes
                .get(suffix_at..)
                .and_then(|rest| rest.iter().position(|b| *b == 0))
            else {
                break;
            };
            let Some(keep) = previous.len().checked_sub(strip) else {
                break;
            };
            let mut path = previous[..keep].to_vec();
            path.extend_from_slice(&bytes[suffix_at..suffix_at + end]);
            at = suffix_at + end + 1;
            path
        } else {
            let Some(end) = bytes
                .get(name_at..)
                .and_then(|rest| rest.iter().position(|b| *b == 0))
            else {
                break;
            };
            let path = bytes[name_at..name_at + end].to_vec();
            // Entries are padded with 1 to 8 NUL bytes to a multiple of 8.
            let len = name_at - entry + end;
            at = entry + (len + 8) / 8 * 8;
            path
        };
        if mode & 0o170000 == GITLINK && !path.is_empty() {
            links.push(path.clone());
        }
        previous = path;
    }
    links
}

/// git's offset varint (index version 4): the value and how many bytes it took.
fn varint(bytes: &[u8]) -> Option<(usize, usize)> {
    let mut iter = bytes.iter().enumerate();
    let (_, first) = iter.next()?;
    let mut value = usize::from(first & 0x7f);
    let mut byte = *first;
    let mut used = 1;
    while byte & 0x80 != 0 {
        let (_, next) = iter.next()?;
        value = value.checked_add(1)?.checked_mul(128)? + usize::from(next & 0x7f);
        byte = *next;
        used += 1;
    }
    Some((value, used))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `git ARGS` in `dir`; panics with git's output when it fails.
    fn git(dir: &Path, args: &[&str]) {
        let out = std::process::Command::new("git")
            .args([
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "-c",
                "protocol.file.allow=always",
            ])
            .args(args)
            .current_dir(dir)
            .output()
            .expect("git must be installed for this test");
        assert!(out.status.success(), "git {args:?}: {out:?}");
    }

    fn repo(dir: &Path) {
        std::fs::create_dir_all(dir).unwrap();
        git(dir, &["init", "-q"]);
        std::fs::write(dir.join("f"), "f").unwrap();
        git(dir, &["add", "f"]);
        git(dir, &["commit", "-qm", "f"]);
    }

    /// Real git writes the indexes (versions 2, 3 and 4); submodules nested two deep, one
    /// not checked out, and a linked worktree are all found.
    #[test]
    fn submodules_at_any_depth_and_linked_worktrees_are_found() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().canonicalize().unwrap();
        let (top, mid, leaf) = (base.join("top"), base.join("mid"), base.join("leaf"));
        for dir in [&top, &mid, &leaf] {
            repo(dir);
        }
        git(&mid, &["submodule", "-q", "add", "../leaf", "deps/leaf"]);
        git(&mid, &["commit", "-qm", "leaf"]);
        git(&top, &["submodule", "-q", "add", "../mid", "vendor/mid"]);
        git(
            &top,
            &["submodule", "-q", "add", "../leaf", "not-checked-out"],
        );
        git(&top, &["commit", "-qm", "subs"]);
        git(
            &top,
            &["submodule", "-q", "update", "--init", "--recursive"],
        );
        git(
            &top,
            &["submodule", "-q", "deinit", "-f", "not-checked-out"],
        );
        git(&top, &["worktree", "add", "-q", "../wt"]);
        for version in ["2", "3", "4"] {
            git(&top, &["update-index", "--index-version", version]);
            let mut found = nested_git_entries(&top);
            found.sort();
            assert_eq!(
                found,
                [
                    base.join("top/not-checked-out/.git"),
                    base.join("top/vendor/mid/.git"),
                    base.join("top/vendor/mid/deps/leaf/.git"),
                    base.join("wt/.git"),
                ],
                "index version {version}"
            );
        }
        assert!(nested_git_entries(&base).is_empty());
    }

    #[test]
    fn a_damaged_index_yields_what_parses() {
        assert!(parse_gitlinks(b"", 20).is_empty());
        assert!(parse_gitlinks(b"DIRC\0\0\0\x02\xff\xff\xff\xff", 20).is_empty());
        assert!(parse_gitlinks(b"XXXX\0\0\0\x02\0\0\0\x01", 20).is_empty());
        assert_eq!(varint(&[0x80, 0x00]), Some((128, 2)));
        assert_eq!(varint(&[0x05]), Some((5, 1)));
        assert_eq!(varint(&[0xff]), None);
    }

    #[test]
    fn repositories_at_any_depth_are_found_and_a_change_is_seen_at_the_next_search() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().canonicalize().unwrap();
        std::fs::create_dir_all(root.join(".git")).unwrap();
        std::fs::create_dir_all(root.join("a/b/c/.git/hooks")).unwrap();
        std::fs::create_dir_all(root.join("x/y")).unwrap();
        std::fs::write(root.join("x/y/.git"), "gitdir: ../z\n").unwrap();
        std::os::unix::fs::symlink(root.join("a"), root.join("link")).unwrap();
        let first = repositories_beneath(&root).unwrap();
        assert_eq!(first, vec![root.join("a/b/c/.git"), root.join("x/y/.git")]);
        // Cached listings are re-read when a directory changes, however deep: a new
        // repository, one moved in, one removed.
        std::fs::create_dir_all(root.join("x/y/w/.git")).unwrap();
        std::fs::create_dir_all(root.join("elsewhere/v/.git")).unwrap();
        std::fs::rename(root.join("elsewhere"), root.join("a/b/moved")).unwrap();
        std::fs::remove_dir_all(root.join("a/b/c")).unwrap();
        let second = repositories_beneath(&root).unwrap();
        assert_eq!(
            second,
            vec![
                root.join("a/b/moved/v/.git"),
                root.join("x/y/.git"),
                root.join("x/y/w/.git")
            ]
        );
        assert_eq!(repositories_beneath(&root).unwrap(), second);
    }

    #[test]
    fn a_tree_beyond_the_budget_is_refused_not_cut_short() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().canonicalize().unwrap();
        for i in 0..5 {
            std::fs::create_dir_all(root.join(format!("d{i}"))).unwrap();
        }
        std::fs::create_dir_all(root.join("d4/.git")).unwrap();
        assert_eq!(search(&root, 6).unwrap(), vec![root.join("d4/.git")]);
        let err = search(&root, 5).unwrap_err();
        assert!(matches!(err, SearchError::TooLarge { visited: 5 }), "{err}");
        assert_eq!(err.to_string(), "the search visited more than 5 entries");
    }
}
