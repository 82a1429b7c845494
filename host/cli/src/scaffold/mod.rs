//! `cordis new`: scaffolds a plugin crate outside any workspace — a cdylib on `cordis-sdk`
//! with one service and one tool, a test on `cordis-test`, a README and a `cordis.yml`
//! that loads it — written as a whole or not at all.

use std::fmt;
use std::path::{Path, PathBuf};

mod templates;

pub use templates::entry;
use templates::{cargo_toml, cordis_yml, lib_rs, readme, test_rs, Names};

/// Where this host's SDK sources were when it was built (the SDK is used by path).
pub const BUILT_SDK_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../plugins/sdk");

/// What to scaffold.
#[derive(Clone, Debug)]
pub struct NewPlugin {
    /// The crate (and plugin) name.
    pub name: String,
    /// The crate directory to create; must not exist or be empty.
    pub dir: PathBuf,
    /// The `cordis-sdk` crate directory; `cordis-test` is its sibling `test-support`.
    pub sdk: PathBuf,
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
}

/// Why nothing was scaffolded.
#[derive(Debug)]
pub enum ScaffoldError {
    /// The name cannot be a plugin crate's name.
    BadName {
        /// The name given.
        name: String,
        /// What is wrong with it.
        why: String,
    },
    /// The directory exists and is not empty.
    NotEmpty(PathBuf),
    /// A crate the new plugin depends on is not where it should be.
    SdkMissing {
        /// The crate: `cordis-sdk`, or `cordis-test` (the sibling `test-support` of the SDK).
        krate: &'static str,
        /// Where it was looked for.
        looked: PathBuf,
        /// The SDK directory given (or built in).
        sdk: PathBuf,
    },
    /// Writing failed (nothing was left behind).
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The error.
        error: std::io::Error,
    },
}

impl fmt::Display for ScaffoldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScaffoldError::BadName { name, why } => write!(
                f,
                "`{name}` is not a valid plugin name: {why}; use lowercase letters, digits and `-`, starting with a letter (e.g. `my-plugin`)"
            ),
            ScaffoldError::NotEmpty(dir) => write!(
                f,
                "{} already exists and is not empty; choose another name or pass `--path DIR` with a new or empty directory",
                dir.display()
            ),
            ScaffoldError::SdkMissing { krate, looked, sdk } => {
                if *krate == "cordis-sdk" {
                    write!(f, "the cordis SDK is not at {}", looked.display())?;
                } else {
                    write!(
                        f,
                        "the plugin test harness `{krate}` is not at {} (beside the SDK at {})",
                        looked.display(),
                        sdk.display()
                    )?;
                }
                write!(
                    f,
                    ": a new plugin depends by path on `cordis-sdk` (the SDK directory) and on `cordis-test` (the directory `test-support` beside it); pass `--sdk-path` with the `plugins/sdk` directory of a cordis checkout, which has both"
                )
            }
            ScaffoldError::Io { path, error } => {
                write!(f, "cannot write {}: {error}", path.display())
            }
        }
    }
}

impl std::error::Error for ScaffoldError {}

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

/// Creates the crate. Every file is written to a fresh directory beside `dir` first, which
/// is then renamed into place, so a failure leaves nothing behind.
pub fn scaffold(req: &NewPlugin) -> Result<Scaffolded, ScaffoldError> {
    validate_name(&req.name)?;
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |error| ScaffoldError::Io { path, error }
    };
    let crate_at = |krate: &'static str, dir: &Path| {
        dir.canonicalize()
            .ok()
            .filter(|p| p.join("Cargo.toml").is_file())
            .ok_or_else(|| ScaffoldError::SdkMissing {
                krate,
                looked: dir.to_path_buf(),
                sdk: req.sdk.clone(),
            })
    };
    let sdk = crate_at("cordis-sdk", &req.sdk)?;
    let test_support = crate_at(
        "cordis-test",
        &sdk.parent().unwrap_or(&sdk).join("test-support"),
    )?;

    let cwd = std::env::current_dir().map_err(io(Path::new(".")))?;
    let dir = cwd.join(&req.dir);
    if dir.exists() {
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

    let names = Names::new(&req.name);
    let library_file = cordis_engine::library_file_name(&req.name);
    let (library, manifest_path) = match &req.target_dir {
        Some(t) => {
            let lib = cwd.join(t).join("debug").join(&library_file);
            (lib.clone(), lib.display().to_string())
        }
        None => (
            dir.join("target/debug").join(&library_file),
            format!("target/debug/{library_file}"),
        ),
    };
    let files: Vec<(&'static str, String)> = vec![
        ("Cargo.toml", cargo_toml(&names, &sdk, &test_support)),
        ("src/lib.rs", lib_rs(&names)),
        ("tests/plugin.rs", test_rs(&names)),
        ("README.md", readme(&names)),
        ("cordis.yml", cordis_yml(&names, &manifest_path)),
        (".gitignore", "/target\n".to_string()),
    ];

    let staging = tempfile_dir(&parent, &req.name).map_err(io(&parent))?;
    let written = (|| -> Result<(), ScaffoldError> {
        for (rel, text) in &files {
            let path = staging.join(rel);
            if let Some(p) = path.parent() {
                std::fs::create_dir_all(p).map_err(io(p))?;
            }
            std::fs::write(&path, text).map_err(io(&path))?;
        }
        // An empty directory is replaced by the rename; a non-empty one never reaches here.
        std::fs::rename(&staging, &dir).map_err(io(&dir))
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(e);
    }
    Ok(Scaffolded {
        dir,
        library,
        tool: names.tool.clone(),
        service: names.service.clone(),
        files: files.iter().map(|(rel, _)| *rel).collect(),
    })
}

/// A fresh hidden directory in `parent` for staging.
fn tempfile_dir(parent: &Path, name: &str) -> std::io::Result<PathBuf> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let dir = parent.join(format!(
        ".{name}.cordis-new-{}-{nanos:x}",
        std::process::id()
    ));
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
        let scaffold = cargo_toml(&names, Path::new("/sdk"), Path::new("/test"));
        for (dep, req) in [
            ("schemars", "\"1\""),
            ("serde", "\"1\""),
            ("serde_json", "\"1\""),
            ("tracing", "\"0.1\""),
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
}
