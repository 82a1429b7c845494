//! A new crate and the cargo workspaces above it: which workspace it would belong to (the
//! rule cargo follows), whether that workspace's `members` already cover it, the edit of
//! the root manifest that adds it (comments and layout kept), the workspace's target
//! directory, and paths written relative to the crate.

use std::path::{Component, Path, PathBuf};
use std::process::Stdio;

use toml_edit::{DocumentMut, Item, Value};

use super::ScaffoldError;

/// Where a new crate stands among the cargo workspaces above it.
pub(super) enum Place {
    /// No workspace above: the crate is its own.
    Alone,
    /// A member of the workspace at `root`.
    Member {
        /// The workspace root directory.
        root: PathBuf,
        /// The crate's path relative to `root`, `/`-separated, as `members` lists it.
        path: String,
        /// The root manifest with the crate added to `members`, when they do not cover
        /// it yet.
        manifest: Option<String>,
        /// Whether the root manifest has a `[profile.dev]` table (the one a member's
        /// builds use).
        dev_profile: bool,
    },
    /// The workspace at `root` excludes the crate's path: the crate is its own.
    Excluded {
        /// The workspace root directory.
        root: PathBuf,
    },
}

/// How a workspace's `members` and `exclude` treat a crate directory.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Coverage {
    /// A `members` path or glob covers it.
    Member,
    /// Not listed: `members` must grow.
    Unlisted,
    /// An `exclude` path holds it (and no `members` path names it).
    Excluded,
}

/// Finds the workspace the crate at `dir` (absolute, with a canonical parent) would be a
/// member of, as cargo does: the nearest `Cargo.toml` above it with a `[workspace]` table
/// that does not exclude it.
pub(super) fn find(dir: &Path) -> Result<Place, ScaffoldError> {
    let mut excluded = None;
    for root in dir.ancestors().skip(1) {
        let manifest = root.join("Cargo.toml");
        if !manifest.is_file() {
            continue;
        }
        let bad = |why: String| ScaffoldError::Workspace {
            manifest: manifest.clone(),
            why,
        };
        let text = std::fs::read_to_string(&manifest).map_err(|e| bad(e.to_string()))?;
        let doc: DocumentMut = text.parse().map_err(|e| bad(format!("{e}")))?;
        let Some(ws) = doc.get("workspace").and_then(Item::as_table_like) else {
            continue;
        };
        let strings = |key: &str| -> Option<Vec<String>> {
            let array = ws.get(key)?.as_array()?;
            Some(
                array
                    .iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect(),
            )
        };
        let dev_profile = doc.get("profile").and_then(|p| p.get("dev")).is_some();
        let members = strings("members");
        let exclude = strings("exclude").unwrap_or_default();
        let path = member_path(root, dir);
        match coverage(root, members.as_deref(), &exclude, dir) {
            Coverage::Excluded => {
                excluded.get_or_insert_with(|| root.to_path_buf());
            }
            Coverage::Member => {
                return Ok(Place::Member {
                    root: root.to_path_buf(),
                    path,
                    manifest: None,
                    dev_profile,
                })
            }
            Coverage::Unlisted => {
                let edited = add_member(&text, &path).map_err(bad)?;
                return Ok(Place::Member {
                    root: root.to_path_buf(),
                    path,
                    manifest: Some(edited),
                    dev_profile,
                });
            }
        }
    }
    Ok(match excluded {
        Some(root) => Place::Excluded { root },
        None => Place::Alone,
    })
}

/// `dir` relative to `root` (which holds it), `/`-separated.
fn member_path(root: &Path, dir: &Path) -> String {
    let rel = dir.strip_prefix(root).unwrap_or(dir);
    let parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    parts.join("/")
}

/// How the workspace at `root` with these `members` (none: no `members` key) and
/// `exclude` treats the crate at `dir`, by cargo's rules: an `exclude` entry holds every
/// path beneath it unless a `members` entry names the crate's path or one above it;
/// `members` entries are paths or globs (`*` does not cross `/`, `**` does).
pub(super) fn coverage(
    root: &Path,
    members: Option<&[String]>,
    exclude: &[String],
    dir: &Path,
) -> Coverage {
    let manifest = dir.join("Cargo.toml");
    let members = members.unwrap_or_default();
    let named = members.iter().any(|m| manifest.starts_with(root.join(m)));
    if !named && exclude.iter().any(|ex| manifest.starts_with(root.join(ex))) {
        return Coverage::Excluded;
    }
    let options = glob::MatchOptions {
        require_literal_separator: true,
        ..glob::MatchOptions::new()
    };
    let root_pattern = glob::Pattern::escape(&root.to_string_lossy());
    let covers = |member: &String| {
        let tidy: Vec<String> = Path::new(member)
            .components()
            .filter(|c| *c != Component::CurDir)
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        let full = format!("{}/{}", root_pattern.trim_end_matches('/'), tidy.join("/"));
        root.join(member) == dir
            || glob::Pattern::new(&full).is_ok_and(|p| p.matches_path_with(dir, options))
    };
    if members.iter().any(covers) {
        Coverage::Member
    } else {
        Coverage::Unlisted
    }
}

/// The root manifest `text` with `path` added to `[workspace] members` (the key made when
/// missing), everything else as it was: a new entry of a list written one per line goes
/// on a line of its own, indented like the last one.
pub(super) fn add_member(text: &str, path: &str) -> Result<String, String> {
    let mut doc: DocumentMut = text.parse().map_err(|e| format!("{e}"))?;
    let ws = doc
        .get_mut("workspace")
        .and_then(Item::as_table_like_mut)
        .ok_or("it has no `[workspace]` table")?;
    if ws.get("members").is_none() {
        ws.insert("members", Item::Value(Value::Array(Default::default())));
    }
    let members = ws
        .get_mut("members")
        .and_then(Item::as_array_mut)
        .ok_or("its `workspace.members` is not an array")?;
    // A list written one entry per line: the new entry goes on a line of its own after
    // the last one and what follows it (a comment), indented like it.
    let raw =
        |r: Option<&toml_edit::RawString>| r.and_then(|r| r.as_str()).unwrap_or("").to_string();
    let trailing = raw(Some(members.trailing()));
    let last = members
        .len()
        .checked_sub(1)
        .and_then(|i| members.get_mut(i));
    let (last_prefix, gap) = match last {
        Some(last) => {
            // What lies between the last entry and `]`, the comma aside.
            let gap = raw(last.decor().suffix()) + &trailing;
            let prefix = raw(last.decor().prefix());
            if prefix.contains('\n') || gap.contains('\n') {
                last.decor_mut().set_suffix("");
            }
            (Some(prefix), gap)
        }
        None => (None, trailing),
    };
    let mut entry = Value::from(path);
    let prefix = match last_prefix {
        Some(last) if last.contains('\n') || gap.contains('\n') => {
            let indent = match last.rfind('\n') {
                Some(i) => last[i + 1..].to_string(),
                None => "    ".to_string(),
            };
            let (head, tail) = match gap.rfind('\n') {
                Some(i) => gap.split_at(i + 1),
                None => ("\n", gap.as_str()),
            };
            members.set_trailing(format!("\n{tail}"));
            format!("{head}{indent}")
        }
        Some(_) => " ".to_string(),
        None if gap.contains('\n') => {
            members.set_trailing("\n");
            members.set_trailing_comma(true);
            "\n    ".to_string()
        }
        None => String::new(),
    };
    entry.decor_mut().set_prefix(prefix);
    members.push_formatted(entry);
    Ok(doc.to_string())
}

/// The target directory of the workspace at `root` as `cargo metadata` reports it when
/// run from `from` (so `CARGO_TARGET_DIR` and `build.target-dir` in the cargo
/// configuration count); none when cargo cannot say.
pub(super) fn target_directory(root: &Path, from: &Path) -> Option<PathBuf> {
    #[derive(serde::Deserialize)]
    struct Metadata {
        target_directory: PathBuf,
    }
    let out = crate::cargo::cargo()
        .args([
            "metadata",
            "--no-deps",
            "--offline",
            "--format-version",
            "1",
        ])
        .arg("--manifest-path")
        .arg(root.join("Cargo.toml"))
        .current_dir(from)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|out| out.status.success())?;
    let metadata: Metadata = serde_json::from_slice(&out.stdout).ok()?;
    Some(metadata.target_directory)
}

/// `to` relative to the directory `from`, both absolute and without `.` or `..`; none
/// when they have different prefixes (Windows drives).
pub(super) fn relative(from: &Path, to: &Path) -> Option<PathBuf> {
    let (mut f, mut t) = (from.components().peekable(), to.components().peekable());
    if !matches!(f.peek(), Some(Component::RootDir | Component::Prefix(_))) || f.peek() != t.peek()
    {
        return None;
    }
    while f.peek().is_some() && f.peek() == t.peek() {
        f.next();
        t.next();
    }
    let mut rel: PathBuf = f.map(|_| Component::ParentDir).collect();
    rel.extend(t);
    if rel.as_os_str().is_empty() {
        rel.push(".");
    }
    Some(rel)
}

/// `path` as written in a file of the directory `dir`: relative to `dir` when possible,
/// with `/` between its parts.
pub(super) fn written_from(dir: &Path, path: &Path) -> String {
    let rel = relative(dir, path).unwrap_or_else(|| path.to_path_buf());
    if rel.is_absolute() {
        return rel.display().to_string();
    }
    let parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    parts.join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths() {
        let rel = |a: &str, b: &str| relative(Path::new(a), Path::new(b));
        assert_eq!(
            rel("/w/crates/p", "/w/plugins/sdk"),
            Some("../../plugins/sdk".into())
        );
        assert_eq!(rel("/w", "/w/target/debug"), Some("target/debug".into()));
        assert_eq!(rel("/w/crates/p", "/w"), Some("../..".into()));
        assert_eq!(rel("/w/p", "/w/p"), Some(".".into()));
        assert_eq!(rel("/a/b/c", "/src/sdk"), Some("../../../src/sdk".into()));
        assert_eq!(rel("w/p", "/w"), None, "a relative start");
        assert_eq!(
            written_from(
                Path::new("/w/crates/p"),
                Path::new("/w/target/debug/libp.so")
            ),
            "../../target/debug/libp.so"
        );
    }

    #[test]
    fn members_cover_by_path_and_glob_unless_excluded() {
        let root = Path::new("/w");
        let dir = Path::new("/w/crates/my-plugin");
        let list = |items: &[&str]| items.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let check = |members: Option<&[&str]>, exclude: &[&str]| {
            let members = members.map(list);
            coverage(root, members.as_deref(), &list(exclude), dir)
        };
        for members in [
            &["crates/my-plugin"][..],
            &["./crates/my-plugin/"],
            &["crates/*"],
            &["crates/my-*"],
            &["**"],
            &["other", "crates/*"],
        ] {
            assert_eq!(check(Some(members), &[]), Coverage::Member, "{members:?}");
        }
        for members in [&["crates/existing"][..], &["*"], &["crates"], &[]] {
            assert_eq!(check(Some(members), &[]), Coverage::Unlisted, "{members:?}");
        }
        assert_eq!(check(None, &[]), Coverage::Unlisted);
        assert_eq!(check(Some(&["crates/*"]), &["crates"]), Coverage::Excluded);
        assert_eq!(check(None, &["crates/my-plugin"]), Coverage::Excluded);
        assert_eq!(check(Some(&["crates/*"]), &["crates/my"]), Coverage::Member);
        // Named explicitly, an excluded path is a member again (cargo's rule).
        assert_eq!(
            check(Some(&["crates/my-plugin"]), &["crates"]),
            Coverage::Member
        );
    }

    #[test]
    fn a_member_is_added_keeping_comments_and_layout() {
        let text = "# The workspace.\n[workspace]\nresolver = \"2\"\nmembers = [\n    \"crates/existing\", # the first\n    \"tools/*\",\n]\n# Not these.\nexclude = [\"old\"]\n\n[workspace.dependencies]\nserde = \"1\" # pinned below\n";
        let edited = add_member(text, "crates/my-plugin").unwrap();
        assert_eq!(
            edited,
            text.replace(
                "    \"tools/*\",\n]",
                "    \"tools/*\",\n    \"crates/my-plugin\",\n]"
            )
        );
        let inline = add_member("[workspace]\nmembers = [\"a\"] # one\n", "b").unwrap();
        assert_eq!(inline, "[workspace]\nmembers = [\"a\", \"b\"] # one\n");
        let commented = "[workspace]\nmembers = [\n  \"a\",\n  \"c\" # last\n  # more to come\n]\n";
        assert_eq!(
            add_member(commented, "b").unwrap(),
            "[workspace]\nmembers = [\n  \"a\",\n  \"c\", # last\n  # more to come\n  \"b\"\n]\n"
        );
        let empty = add_member("[workspace]\nmembers = []\n", "b").unwrap();
        assert_eq!(empty, "[workspace]\nmembers = [\"b\"]\n");
        let none = add_member(
            "[package]\nname = \"x\"\n\n[workspace]\n# members below\n",
            "b",
        );
        let none = none.unwrap();
        assert!(
            none.starts_with("[package]\nname = \"x\"\n\n[workspace]\n"),
            "{none}"
        );
        assert!(none.contains("members = [\"b\"]\n"), "{none}");
        let multi_empty = add_member("[workspace]\nmembers = [\n]\n", "b").unwrap();
        assert_eq!(multi_empty, "[workspace]\nmembers = [\n    \"b\",\n]\n");
        let inline_table = add_member("workspace = { members = [\"a\"] }\n", "b").unwrap();
        assert_eq!(inline_table, "workspace = { members = [\"a\", \"b\"] }\n");
        assert!(add_member("[package]\n", "b").is_err());
        assert!(add_member("[workspace]\nmembers = \"a\"\n", "b").is_err());
    }

    #[test]
    fn the_nearest_workspace_that_does_not_exclude_the_crate() {
        let tmp = tempfile::tempdir().unwrap();
        let top = tmp.path().canonicalize().unwrap();
        let write = |rel: &str, text: &str| {
            let p = top.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        };
        write(
            "Cargo.toml",
            "[workspace]\nmembers = [\"crates/*\"]\nexclude = [\"inner\"]\n",
        );
        write("inner/Cargo.toml", "[package]\nname = \"inner\"\n"); // no workspace: skipped
        write("inner/ws/Cargo.toml", "[workspace]\nexclude = [\"gone\"]\n");
        let member = |rel: &str| match find(&top.join(rel)).unwrap() {
            Place::Member {
                root,
                path,
                manifest,
                ..
            } => (root, path, manifest),
            _ => panic!("{rel}: not a member"),
        };
        assert_eq!(member("crates/p"), (top.clone(), "crates/p".into(), None));
        let (root, path, manifest) = member("other/p");
        assert_eq!((root, path.as_str()), (top.clone(), "other/p"));
        assert!(manifest
            .unwrap()
            .contains("members = [\"crates/*\", \"other/p\"]"));
        let (root, path, manifest) = member("inner/ws/p");
        assert_eq!((root, path.as_str()), (top.join("inner/ws"), "p"));
        assert!(manifest.unwrap().contains("members = [\"p\"]"));
        // Excluded by the nearest workspace, cargo looks further up; excluded there too.
        let place = find(&top.join("inner/ws/gone/p")).unwrap();
        assert!(matches!(&place, Place::Excluded { root } if *root == top.join("inner/ws")));
        let place = find(&tempfile::tempdir().unwrap().path().join("p")).unwrap();
        assert!(matches!(place, Place::Alone));
    }
}
