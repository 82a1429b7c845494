//! `cordis new`: scaffolds a plugin crate — a cdylib on `cordis-sdk` with one service and
//! one tool, a test on `cordis-test`, a README and a `cordis.yml` that loads it — written
//! as a whole or not at all. Inside a cargo workspace the crate becomes a member (added to
//! the root manifest's `members` when they do not cover it, in the same all-or-nothing
//! step); elsewhere it is its own workspace.

use std::path::{Path, PathBuf};

mod error;
mod templates;
mod workspace;

pub use error::ScaffoldError;

use templates::{cargo_toml, cordis_yml, lib_rs, readme, test_rs, Names, SdkDeps};
pub use templates::{entry, LIGHT_PROFILE};
use workspace::{written_from, Place};

/// Where this host's SDK sources were when it was built (the SDK is used by path).
pub const BUILT_SDK_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../plugins/sdk");

/// This host's version, which its SDK and `cordis-test` share: the version a new crate
/// asks the registry for when there are no SDK sources to use by path.
pub const SDK_VERSION: &str = env!("CARGO_PKG_VERSION");

/// What to scaffold.
#[derive(Clone, Debug)]
pub struct NewPlugin {
    /// The crate (and plugin) name.
    pub name: String,
    /// The crate directory to create; must not exist or be empty.
    pub dir: PathBuf,
    /// The `cordis-sdk` crate directory; `cordis-test` is its sibling `test-support`.
    /// None: the SDK this host was built from ([`BUILT_SDK_PATH`]) when it is there, else
    /// both crates from the registry at [`SDK_VERSION`].
    pub sdk: Option<PathBuf>,
    /// The cargo target directory the library will be built in, when not `<dir>/target`.
    pub target_dir: Option<PathBuf>,
}

/// What was scaffolded.
#[derive(Clone, Debug)]
pub struct Scaffolded {
    /// The crate directory (absolute).
    pub dir: PathBuf,
    /// The library `cargo build` will produce.
    pub library: PathBuf,
    /// The tool the plugin registers.
    pub tool: String,
    /// The service the plugin provides.
    pub service: String,
    /// The files written, relative to `dir`.
    pub files: Vec<&'static str>,
    /// The SDK used by path (canonical), or none when the crate depends on the registry's
    /// `cordis-sdk` and `cordis-test` at [`SDK_VERSION`].
    pub sdk: Option<PathBuf>,
    /// Where the crate stands among cargo workspaces.
    pub workspace: Membership,
}

/// Where a new crate stands among cargo workspaces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Membership {
    /// No workspace above it: it is its own (its `Cargo.toml` has an empty `[workspace]`).
    Alone,
    /// A member of the workspace at `root` (its library is built in that workspace's
    /// target directory).
    Member {
        /// The workspace root directory.
        root: PathBuf,
        /// The crate's path as the root manifest's `members` lists it.
        path: String,
        /// Whether that path was added to `members` (else a path or glob covered it).
        added: bool,
        /// Whether the workspace's root manifest sets `[profile.dev]` (else `cordis new`
        /// suggests [`LIGHT_PROFILE`]).
        dev_profile: bool,
    },
    /// The workspace at `root` excludes the crate's path: it is its own.
    Excluded {
        /// The workspace root directory.
        root: PathBuf,
    },
}

const RESERVED: &[&str] = &[
    "test",
    "core",
    "std",
    "alloc",
    "proc-macro",
    "proc_macro",
    "self",
    "super",
    "crate",
    "cordis-sdk",
    "cordis-test",
    "cordis-engine",
    "cordis",
];

const KEYWORDS: &[&str] = &[
    "as", "async", "await", "break", "const", "continue", "dyn", "else", "enum", "extern", "false",
    "fn", "for", "if", "impl", "in", "let", "loop", "match", "mod", "move", "mut", "pub", "ref",
    "return", "static", "struct", "trait", "true", "type", "unsafe", "use", "where", "while",
    "abstract", "become", "box", "do", "final", "gen", "macro", "override", "priv", "try",
    "typeof", "unsized", "virtual", "yield",
];

/// Checks that `name` can be a plugin crate's name (and so its library's and its plugin's).
pub(crate) fn validate_name(name: &str) -> Result<(), ScaffoldError> {
    let bad = |why: &str| {
        Err(ScaffoldError::BadName {
            name: name.to_string(),
            why: why.to_string(),
        })
    };
    let Some(first) = name.chars().next() else {
        return bad("it is empty");
    };
    if !first.is_ascii_lowercase() {
        return bad("it must start with a lowercase ASCII letter");
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-' || *c == '_'))
    {
        return bad(&format!("it contains `{c}`"));
    }
    if name.ends_with(['-', '_']) {
        return bad("it ends with a separator");
    }
    if name.len() > 64 {
        return bad("it is longer than 64 characters");
    }
    if KEYWORDS.contains(&name) {
        return bad("it is a Rust keyword");
    }
    if RESERVED.contains(&name) {
        return bad("it is reserved (a built-in or cordis crate)");
    }
    Ok(())
}

/// Where the new crate's `cordis-sdk` and `cordis-test` are: the canonical SDK and
/// `test-support` directories, or none (the registry) when no SDK was `given` and there is
/// none at `built`.
fn find_sdk(
    given: Option<&Path>,
    built: &Path,
) -> Result<Option<(PathBuf, PathBuf)>, ScaffoldError> {
    let sdk = match given {
        Some(sdk) => sdk,
        None if !built.join("Cargo.toml").is_file() => return Ok(None),
        None => built,
    };
    let crate_at = |krate: &'static str, dir: &Path| {
        dir.canonicalize()
            .ok()
            .filter(|p| p.join("Cargo.toml").is_file())
            .ok_or_else(|| ScaffoldError::SdkMissing {
                krate,
                looked: dir.to_path_buf(),
                sdk: sdk.to_path_buf(),
            })
    };
    let sdk_dir = crate_at("cordis-sdk", sdk)?;
    let test_support = crate_at(
        "cordis-test",
        &sdk_dir.parent().unwrap_or(&sdk_dir).join("test-support"),
    )?;
    Ok(Some((sdk_dir, test_support)))
}

/// Creates the crate. Every file is written to a fresh directory beside `dir` first, which
/// is then renamed into place, so a failure leaves nothing behind. When a workspace's
/// `members` must list the crate, its new root manifest is written to a temporary file
/// first and renamed over the old one once the crate is in place; if that fails, the
/// crate is removed again.
pub fn scaffold(req: &NewPlugin) -> Result<Scaffolded, ScaffoldError> {
    validate_name(&req.name)?;
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |error| ScaffoldError::Io { path, error }
    };
    let sdk = find_sdk(req.sdk.as_deref(), Path::new(BUILT_SDK_PATH))?;

    let cwd = std::env::current_dir().map_err(io(Path::new(".")))?;
    let dir = cwd.join(&req.dir);
    let existed = dir.exists();
    if existed {
        let empty = dir.is_dir() && std::fs::read_dir(&dir).map_err(io(&dir))?.next().is_none();
        if !empty {
            return Err(ScaffoldError::NotEmpty(dir));
        }
    }
    let parent = dir
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| cwd.clone());
    std::fs::create_dir_all(&parent).map_err(io(&parent))?;
    // The crate directory under its canonical parent: where workspaces are looked for
    // and what the paths the crate's files name are relative to.
    let home = match dir.file_name() {
        Some(name) => parent.canonicalize().map_err(io(&parent))?.join(name),
        None => dir.clone(),
    };
    let place = workspace::find(&home)?;

    let names = Names::new(&req.name);
    let library_file = cordis_engine::library_file_name(&req.name);
    let (library, manifest_path) = match (&place, &req.target_dir) {
        (Place::Member { root, .. }, given) => {
            let target = workspace::target_directory(root, &parent)
                .or_else(|| given.as_ref().map(|t| cwd.join(t)))
                .unwrap_or_else(|| root.join("target"));
            let target = target.canonicalize().unwrap_or(target);
            let lib = target.join("debug").join(&library_file);
            let written = if lib.starts_with(root) {
                written_from(&home, &lib)
            } else {
                lib.display().to_string()
            };
            (lib, written)
        }
        (_, Some(t)) => {
            let lib = cwd.join(t).join("debug").join(&library_file);
            (lib.clone(), lib.display().to_string())
        }
        (_, None) => (
            dir.join("target/debug").join(&library_file),
            format!("target/debug/{library_file}"),
        ),
    };
    let deps = match &sdk {
        Some((sdk, test_support)) => SdkDeps::Path {
            sdk: written_from(&home, sdk),
            test: written_from(&home, test_support),
        },
        None => SdkDeps::Version(SDK_VERSION),
    };
    let standalone = !matches!(place, Place::Member { .. });
    let mut files: Vec<(&'static str, String)> = vec![
        ("Cargo.toml", cargo_toml(&names, &deps, standalone)),
        ("src/lib.rs", lib_rs(&names)),
        ("tests/plugin.rs", test_rs(&names)),
        ("README.md", readme(&names)),
        ("cordis.yml", cordis_yml(&names, &manifest_path)),
    ];
    if standalone {
        // A member's library is built in the workspace's target directory.
        files.push((".gitignore", "/target\n".to_string()));
    }
    // The workspace's root manifest to replace, when `members` must list the crate.
    let root_manifest = match &place {
        Place::Member {
            root,
            manifest: Some(text),
            ..
        } => {
            let file = root.join("Cargo.toml");
            Some((file.canonicalize().unwrap_or(file), text.as_str()))
        }
        _ => None,
    };

    let staging = tempfile_dir(&parent, &req.name).map_err(io(&parent))?;
    let mut pending = None;
    let written = (|| -> Result<(), ScaffoldError> {
        for (rel, text) in &files {
            let path = staging.join(rel);
            if let Some(p) = path.parent() {
                std::fs::create_dir_all(p).map_err(io(p))?;
            }
            std::fs::write(&path, text).map_err(io(&path))?;
        }
        if let Some((manifest, text)) = &root_manifest {
            pending = Some(write_beside(manifest, text).map_err(io(manifest))?);
        }
        // An empty directory is replaced by the rename; a non-empty one never reaches here.
        std::fs::rename(&staging, &dir).map_err(io(&dir))
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_dir_all(&staging);
        if let Some(temp) = &pending {
            let _ = std::fs::remove_file(temp);
        }
        return Err(e);
    }
    if let (Some((manifest, _)), Some(temp)) = (&root_manifest, &pending) {
        if let Err(error) = std::fs::rename(temp, manifest) {
            let _ = std::fs::remove_file(temp);
            let removed = std::fs::remove_dir_all(&dir).is_ok();
            if removed && existed {
                let _ = std::fs::create_dir(&dir);
            }
            return Err(ScaffoldError::NotAdded {
                manifest: manifest.clone(),
                dir,
                removed,
                error,
            });
        }
    }
    let workspace = match place {
        Place::Alone => Membership::Alone,
        Place::Excluded { root } => Membership::Excluded { root },
        Place::Member {
            root,
            path,
            manifest,
            dev_profile,
        } => Membership::Member {
            root,
            path,
            added: manifest.is_some(),
            dev_profile,
        },
    };
    Ok(Scaffolded {
        dir,
        library,
        tool: names.tool.clone(),
        service: names.service.clone(),
        files: files.iter().map(|(rel, _)| *rel).collect(),
        sdk: sdk.map(|(sdk, _)| sdk),
        workspace,
    })
}

/// Writes `text` to a fresh hidden file beside `file`, with `file`'s permissions, for a
/// rename over it; returns the new file.
fn write_beside(file: &Path, text: &str) -> std::io::Result<PathBuf> {
    let name = file.file_name().unwrap_or_default().to_string_lossy();
    let temp = file.with_file_name(format!(".{name}.cordis-new-{}", unique()));
    let written = (|| {
        std::fs::write(&temp, text)?;
        std::fs::set_permissions(&temp, std::fs::metadata(file)?.permissions())
    })();
    match written {
        Ok(()) => Ok(temp),
        Err(e) => {
            let _ = std::fs::remove_file(&temp);
            Err(e)
        }
    }
}

/// This process's id and the clock's nanoseconds, for fresh file names.
fn unique() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{}-{nanos:x}", std::process::id())
}

/// A fresh hidden directory in `parent` for staging.
fn tempfile_dir(parent: &Path, name: &str) -> std::io::Result<PathBuf> {
    let dir = parent.join(format!(".{name}.cordis-new-{}", unique()));
    std::fs::create_dir(&dir)?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(name: &str, expected: Option<&str>) {
        match (validate_name(name), expected) {
            (Ok(()), None) => {}
            (Err(e), Some(why)) => {
                let text = e.to_string();
                assert!(text.contains(why), "{name}: {text}");
            }
            (got, want) => panic!("{name}: got {got:?}, expected {want:?}"),
        }
    }

    #[test]
    fn names() {
        check("my-plugin", None);
        check("p2", None);
        check("snake_case", None);
        check("", Some("it is empty"));
        check("My-plugin", Some("lowercase ASCII letter"));
        check("9lives", Some("lowercase ASCII letter"));
        check("my plugin", Some("contains ` `"));
        check("my.plugin", Some("contains `.`"));
        check("trailing-", Some("ends with a separator"));
        check("fn", Some("Rust keyword"));
        check("test", Some("reserved"));
        check("cordis-sdk", Some("reserved"));
    }

    #[test]
    fn derived_names() {
        let n = Names::new("my-fine_plugin");
        assert_eq!(
            (n.camel.as_str(), n.service.as_str(), n.tool.as_str()),
            ("MyFinePlugin", "myFinePlugin", "my_fine_plugin_greet")
        );
    }

    /// The scaffold's dependency requirements follow the workspace's.
    #[test]
    fn dependency_versions_match_the_workspace() {
        let workspace = include_str!("../../../../Cargo.toml");
        let names = Names::new("x");
        let scaffold = cargo_toml(&names, &SdkDeps::Version(SDK_VERSION), true);
        for (dep, req) in [
            ("schemars", "\"1\""),
            ("serde", "\"1\""),
            ("serde_json", "\"1\""),
            ("tracing", "\"0.1\""),
            ("cordis-sdk", &format!("\"{SDK_VERSION}\"")),
            ("cordis-test", &format!("\"{SDK_VERSION}\"")),
        ] {
            let line = |text: &str| {
                text.lines()
                    .find(|l| l.starts_with(&format!("{dep} = ")))
                    .map(str::to_string)
            };
            let ws = line(workspace).unwrap_or_else(|| panic!("workspace lacks {dep}"));
            let sc = line(&scaffold).unwrap_or_else(|| panic!("scaffold lacks {dep}"));
            assert!(ws.contains(req), "workspace: {ws}");
            assert!(sc.contains(req), "scaffold: {sc}");
        }
    }

    /// A member crate has no `[workspace]` and no profile (a member's would be ignored);
    /// a crate alone has both. Path dependencies are written as given.
    #[test]
    fn a_member_crate_has_no_workspace_table() {
        let deps = SdkDeps::Path {
            sdk: "../../sdk".into(),
            test: "../../test-support".into(),
        };
        let names = Names::new("x");
        let member = cargo_toml(&names, &deps, false);
        assert!(!member.contains("[workspace]"), "{member}");
        assert!(
            member.contains("cordis-sdk = { path = \"../../sdk\" }\n"),
            "{member}"
        );
        assert!(member.ends_with("cordis-test = { path = \"../../test-support\" }\n"));
        assert!(!member.contains("[profile"), "{member}");
        let alone = cargo_toml(&names, &deps, true);
        assert!(alone.ends_with(&format!(
            "\n\n# Not part of any enclosing workspace.\n[workspace]\n{LIGHT_PROFILE}"
        )));
        let parsed: toml_edit::DocumentMut = alone.parse().unwrap();
        assert_eq!(
            parsed["profile"]["dev"]["package"]["*"]["debug"].as_bool(),
            Some(false)
        );
    }

    /// With no SDK given and none where this host was built, the registry's crates are
    /// used; an SDK given that is not there is an error.
    #[test]
    fn the_sdk_by_path_or_from_the_registry() {
        let tmp = tempfile::tempdir().unwrap();
        let gone = tmp.path().join("no-sdk");
        assert!(find_sdk(None, &gone).unwrap().is_none());
        let err = find_sdk(Some(&gone), Path::new(BUILT_SDK_PATH)).unwrap_err();
        assert!(
            err.to_string()
                .starts_with(&format!("the cordis SDK is not at {}", gone.display())),
            "{err}"
        );
        let (sdk, test) = find_sdk(None, Path::new(BUILT_SDK_PATH)).unwrap().unwrap();
        assert!(sdk.ends_with("plugins/sdk") && test.ends_with("plugins/test-support"));
        // The SDK without `test-support` beside it: not the registry, an error naming it.
        std::fs::create_dir_all(tmp.path().join("lone/sdk")).unwrap();
        std::fs::write(tmp.path().join("lone/sdk/Cargo.toml"), "").unwrap();
        let err = find_sdk(None, &tmp.path().join("lone/sdk")).unwrap_err();
        assert!(err.to_string().contains("`cordis-test` is not at"), "{err}");
    }
}
