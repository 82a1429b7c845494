//! `cordis plugin install|list|remove|upgrade`: the plugin libraries on the search path,
//! and the directory `install` puts them in (the user plugin directory unless told
//! otherwise), with where each came from (`record`) so `upgrade` can rebuild it.
//!
//! A library is checked by loading it (the SDK version, the type layouts, the metadata)
//! from a temporary file in the target directory *before* it takes its place there, and
//! it takes it by a rename: what was checked is what is installed, and a host watching the
//! directory sees either the old file or the new one, never half a file.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context as _};
use cordis_engine::{library_file_name, Library, LoadError, SearchPath};
use cordis_sdk::abi::TOOLS_FROM_CONFIG;

use crate::cargo::{cargo_build_messages, cargo_metadata};

mod record;
mod upgrade;

pub use record::{Record, Source};
pub use upgrade::{describe as describe_upgrade, upgrade, Outcome, Upgraded};

/// What `install` did.
#[derive(Debug)]
pub struct Installed {
    /// The library now in place.
    pub path: PathBuf,
    /// Its metadata.
    pub library: Arc<Library>,
    /// The version it replaced, when the same plugin was installed there before.
    pub replaced: Option<String>,
    /// Why its source could not be recorded (it is installed; `upgrade` cannot rebuild it).
    pub unrecorded: Option<String>,
}

/// Installs `source` (a built library, or a plugin crate directory, which is built in
/// release first) into `dir`.
pub fn install(source: &Path, dir: &Path) -> anyhow::Result<Installed> {
    let absolute = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    let (built, origin) = if source.is_dir() {
        (build_release(source)?, Source::Crate(absolute(source)))
    } else if source.is_file() {
        (source.to_path_buf(), Source::File(absolute(source)))
    } else {
        bail!(
            "{} is neither a plugin library nor a plugin crate directory (it does not exist)",
            source.display()
        );
    };
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create the plugin directory {}", dir.display()))?;
    let temp = tempfile::Builder::new()
        .prefix(".cordis-install-")
        .suffix(std::env::consts::DLL_SUFFIX)
        .tempfile_in(dir)
        .with_context(|| format!("cannot write in {}", dir.display()))?;
    let mut from =
        std::fs::File::open(&built).with_context(|| format!("cannot read {}", built.display()))?;
    std::io::copy(&mut from, &mut temp.as_file())
        .and_then(|_| temp.as_file().sync_all())
        .with_context(|| format!("cannot copy {} into {}", built.display(), dir.display()))?;
    let library = Library::load(temp.path()).map_err(|e| {
        anyhow::anyhow!(
            "{} cannot be installed: {e}; nothing was installed",
            built.display()
        )
    })?;
    let name = library.meta.name.clone();
    let path = dir.join(library_file_name(&name));
    let replaced = match std::fs::symlink_metadata(&path) {
        Err(_) => None,
        Ok(_) => Some(replaceable(&path, &name)?),
    };
    let mode = std::os::unix::fs::PermissionsExt::from_mode(0o644);
    std::fs::set_permissions(temp.path(), mode)
        .with_context(|| format!("cannot set the mode of {}", temp.path().display()))?;
    temp.persist(&path)
        .with_context(|| format!("cannot put the library in place at {}", path.display()))?;
    let recorded = record::write(
        &path,
        &Record {
            plugin: name,
            version: library.meta.version.clone(),
            sdk: library.meta.sdk_version.clone(),
            source: origin,
        },
    );
    sync_dir(dir);
    Ok(Installed {
        path,
        library,
        replaced: replaced.flatten(),
        unrecorded: recorded.err().map(|e| format!("{e:#}")),
    })
}

/// Whether the existing file at `path` may be replaced by plugin `name`: it must be that
/// plugin (any version) or a library of another SDK that no longer loads; the version it
/// had, when known.
fn replaceable(path: &Path, name: &str) -> anyhow::Result<Option<String>> {
    match Library::load(path) {
        Ok(old) if old.meta.name == name => Ok(Some(old.meta.version.clone())),
        Ok(old) => bail!(
            "{} is plugin `{}` {}, not `{name}`: refusing to overwrite another plugin's file; \
             remove it first (`cordis plugin remove {}`)",
            path.display(),
            old.meta.name,
            old.meta.version,
            old.meta.name
        ),
        Err(LoadError::Abi { .. }) => Ok(None),
        Err(e) => bail!(
            "{} exists and is not a plugin library cordis can read ({e}): refusing to \
             overwrite it; move it away first",
            path.display()
        ),
    }
}

/// Makes a rename or removal in `dir` durable (best effort: the change itself is done).
fn sync_dir(dir: &Path) {
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Builds the plugin crate in `dir` with `cargo build --release` and returns its library.
fn build_release(dir: &Path) -> anyhow::Result<PathBuf> {
    let manifest = dir.join("Cargo.toml");
    if !manifest.is_file() {
        bail!(
            "{} is a directory without a Cargo.toml: pass a plugin crate's directory or a built library",
            dir.display()
        );
    }
    let manifest = manifest.canonicalize().unwrap_or(manifest);
    let meta = cargo_metadata(dir)?;
    let Some(package) = meta.packages.iter().find(|p| {
        p.manifest_path.canonicalize().ok().as_ref() == Some(&manifest)
            && meta.workspace_members.contains(&p.id)
    }) else {
        bail!(
            "{} is a workspace, not a plugin crate: pass the directory of the plugin's own crate",
            dir.display()
        );
    };
    let Some(target) = package.targets.iter().find(|t| t.is_cdylib()) else {
        bail!(
            "package `{}` builds no plugin library: add `[lib] crate-type = [\"cdylib\"]` to {}",
            package.name,
            manifest.display()
        );
    };
    eprintln!("building `{}` (cargo build --release)", package.name);
    let mut cmd = crate::cargo::cargo();
    cmd.args(["build", "--release", "--lib", "-p", &package.name])
        .arg("--manifest-path")
        .arg(&manifest);
    let file = library_file_name(&target.name);
    let mut library = None;
    let built = cargo_build_messages(cmd, |msg| {
        if msg["reason"] == "compiler-artifact" && msg["package_id"] == package.id.as_str() {
            let files = msg["filenames"].as_array().into_iter().flatten();
            for f in files.filter_map(|f| f.as_str()) {
                if Path::new(f).file_name() == Some(std::ffi::OsStr::new(&file)) {
                    library = Some(PathBuf::from(f));
                }
            }
        }
    })
    .context("cannot run cargo (is it on PATH?)")?;
    match library {
        Some(library) if built => Ok(library),
        _ => bail!(
            "`cargo build --release` of `{}` failed (errors above); nothing was installed",
            package.name
        ),
    }
}

/// What `remove` did: the file removed, and where the plugin is still found, if anywhere.
#[derive(Debug)]
pub struct Removed {
    /// The file removed.
    pub path: PathBuf,
    /// The library the search path now finds for the name.
    pub still_found: Option<PathBuf>,
}

/// Removes plugin `name` (a manifest name; a scope is ignored) from `dir`.
pub fn remove(name: &str, dir: &Path, search: &SearchPath) -> anyhow::Result<Removed> {
    let name = cordis_engine::plugin_name(name);
    let path = dir.join(library_file_name(name));
    if std::fs::symlink_metadata(&path).is_err() {
        match search.find(name) {
            Ok(elsewhere) => bail!(
                "plugin `{name}` is not installed in {}; the search path finds it at {}, \
                 which `cordis plugin remove` does not manage (delete that file yourself)",
                dir.display(),
                elsewhere.display()
            ),
            Err(_) => bail!(
                "no plugin `{name}` is installed in {}: `cordis plugin list` shows what is",
                dir.display()
            ),
        }
    }
    std::fs::remove_file(&path).with_context(|| format!("cannot remove {}", path.display()))?;
    record::remove(&path)?;
    sync_dir(dir);
    Ok(Removed {
        still_found: search.find(name).ok(),
        path,
    })
}

/// One library on the search path, as `cordis plugin list` shows it.
#[derive(Debug, serde::Serialize)]
pub struct Listed {
    /// The file.
    pub file: PathBuf,
    /// Why its directory is on the search path.
    pub source: &'static str,
    /// The plugin's name, version and SDK version, services and tools; `None` when the
    /// file does not load.
    #[serde(flatten)]
    pub plugin: Option<ListedPlugin>,
    /// Why it does not load.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The file found first for the same name, which hides this one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shadowed_by: Option<PathBuf>,
    /// Where `cordis plugin install` took it from, when it recorded that.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub installed_from: Option<Source>,
    /// For a file that does not load: how to make it load again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

/// What a loadable library declares.
#[derive(Debug, serde::Serialize)]
pub struct ListedPlugin {
    /// Plugin name.
    pub name: String,
    /// Plugin version.
    pub version: String,
    /// The `cordis-sdk` it was built against.
    pub sdk: String,
    /// The services it provides.
    pub services: Vec<String>,
    /// The tools it declares (`None`: built before tools were declared; `["*"]`: its
    /// config names them).
    pub tools: Option<Vec<String>>,
}

/// Every plugin library on the search path, in search order.
pub fn list(search: &SearchPath) -> Vec<Listed> {
    let mut first: BTreeMap<std::ffi::OsString, PathBuf> = BTreeMap::new();
    let mut out = Vec::new();
    let mut seen_dirs = Vec::new();
    for (dir, source) in &search.dirs {
        // A directory named twice (a flag and the environment) is listed once.
        let canonical = dir.canonicalize().unwrap_or_else(|_| dir.clone());
        if seen_dirs.contains(&canonical) {
            continue;
        }
        seen_dirs.push(canonical);
        for file in SearchPath::libraries_in(dir) {
            let Some(file_name) = file.file_name().map(ToOwned::to_owned) else {
                continue;
            };
            let shadowed_by = first.get(&file_name).cloned();
            first.entry(file_name).or_insert_with(|| file.clone());
            let (plugin, error) = match Library::load(&file) {
                Ok(lib) => (
                    Some(ListedPlugin {
                        name: lib.meta.name.clone(),
                        version: lib.meta.version.clone(),
                        sdk: lib.meta.sdk_version.clone(),
                        services: lib.meta.provides.iter().map(|s| s.name.clone()).collect(),
                        tools: lib.meta.tools.clone(),
                    }),
                    None,
                ),
                Err(e) => (None, Some(e.to_string())),
            };
            let recorded = record::read(&file);
            let installed_from = match &recorded {
                Some(Ok(r)) => Some(r.source.clone()),
                _ => None,
            };
            let fix = error.is_some().then(|| fix_for(&file, recorded));
            out.push(Listed {
                file,
                source,
                plugin,
                error,
                shadowed_by,
                installed_from,
                fix,
            });
        }
    }
    out
}

/// How to make the library `file`, which does not load, load again, given its record.
fn fix_for(file: &Path, recorded: Option<Result<Record, String>>) -> String {
    let dir = file.parent().unwrap_or(Path::new("."));
    match recorded {
        Some(Ok(Record {
            plugin,
            source: Source::Crate(krate),
            ..
        })) => format!(
            "`cordis plugin upgrade {plugin}{}` rebuilds it from the crate at {}",
            dir_flag(dir),
            krate.display()
        ),
        Some(Ok(Record {
            plugin,
            source: Source::File(from),
            ..
        })) => format!(
            "it was installed from the file {}: rebuild that against this cordis's SDK, then `cordis plugin upgrade {plugin}{}`",
            from.display(),
            dir_flag(dir)
        ),
        Some(Err(why)) => format!("{why}; reinstall it from its source with `cordis plugin install`"),
        None => "no source was recorded for it: reinstall it from its crate with `cordis plugin install DIR`, or remove it".to_string(),
    }
}

/// ` --dir DIR` unless `dir` is the user plugin directory.
fn dir_flag(dir: &Path) -> String {
    let user = cordis_engine::user_plugin_dir(|name| std::env::var_os(name));
    match user {
        Some(user) if same_file(&user, dir) => String::new(),
        _ => format!(" --dir {}", dir.display()),
    }
}

/// The listing as a table: one plugin per line, the search path above it.
pub fn render_list(search: &SearchPath, listed: &[Listed]) -> String {
    let mut out = String::from("search path (the first file for a name wins):\n");
    for (dir, source) in &search.dirs {
        let missing = if dir.is_dir() { "" } else { " (absent)" };
        let _ = writeln!(out, "  {}{missing}  [{source}]", dir.display());
    }
    if listed.is_empty() {
        out.push_str("no plugin libraries found\n");
        return out;
    }
    let join = |items: &[String]| {
        if items.is_empty() {
            "-".to_string()
        } else {
            items.join(",")
        }
    };
    let rows: Vec<[String; 6]> = listed
        .iter()
        .map(|l| {
            let mut file = l.file.display().to_string();
            if let Some(by) = &l.shadowed_by {
                let _ = write!(file, "  (shadowed by {})", by.display());
            }
            match (&l.plugin, &l.error) {
                (Some(p), _) => [
                    p.name.clone(),
                    p.version.clone(),
                    p.sdk.clone(),
                    join(&p.services),
                    match p.tools.as_deref() {
                        None => "(undeclared)".to_string(),
                        Some(t) if t.iter().any(|t| t == TOOLS_FROM_CONFIG) => {
                            "(named by config)".to_string()
                        }
                        Some(t) => join(t),
                    },
                    file,
                ],
                (None, error) => {
                    let error = error.as_deref().unwrap_or("does not load");
                    let _ = write!(file, "  (not loadable: {error})");
                    [
                        "?".into(),
                        "?".into(),
                        "?".into(),
                        "?".into(),
                        "?".into(),
                        file,
                    ]
                }
            }
        })
        .collect();
    let header = ["NAME", "VERSION", "SDK", "SERVICES", "TOOLS", "FILE"].map(String::from);
    let mut widths = [0usize; 5];
    for row in std::iter::once(&header).chain(&rows) {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    for row in std::iter::once(&header).chain(&rows) {
        for (w, cell) in widths.iter().zip(row) {
            let _ = write!(out, "{cell:<w$}  ");
        }
        let _ = writeln!(out, "{}", row[5]);
    }
    let broken: Vec<&Listed> = listed.iter().filter(|l| l.fix.is_some()).collect();
    if !broken.is_empty() {
        let _ = writeln!(
            out,
            "\n{} plugin librar{} this cordis (cordis-sdk {}) cannot load:",
            broken.len(),
            if broken.len() == 1 { "y" } else { "ies" },
            cordis_engine::sdk_version()
        );
        for l in broken {
            let _ = writeln!(
                out,
                "  {}: {}\n    fix: {}",
                l.file.display(),
                l.error.as_deref().unwrap_or("does not load"),
                l.fix.as_deref().unwrap_or_default()
            );
        }
    }
    out
}

/// What to tell the operator after an install: what is where, and the entry to add.
pub fn describe_install(installed: &Installed, search: &SearchPath) -> String {
    let meta = &installed.library.meta;
    let mut out = String::new();
    let _ = write!(
        out,
        "installed plugin `{}` {} (cordis-sdk {}) at {}",
        meta.name,
        meta.version,
        meta.sdk_version,
        installed.path.display()
    );
    if let Some(old) = &installed.replaced {
        let _ = write!(out, ", replacing {old}");
    }
    out.push('\n');
    if let Some(why) = &installed.unrecorded {
        let _ = writeln!(
            out,
            "warning: where it came from could not be recorded ({why}); `cordis plugin upgrade` cannot rebuild it"
        );
    }
    let all = search.find_all(&meta.name);
    let at = all.iter().position(|p| same_file(p, &installed.path));
    match (at, all.first()) {
        (Some(0), _) => {
            for hidden in all
                .iter()
                .skip(1)
                .filter(|p| !same_file(p, &installed.path))
            {
                let _ = writeln!(out, "note: it takes precedence over {}", hidden.display());
            }
        }
        (Some(_), Some(first)) => {
            let _ = writeln!(
                out,
                "warning: the search path finds {} first, so that file is the one loaded; \
                 remove it or install into its directory (`--dir`)",
                first.display()
            );
        }
        _ => {
            let dir = installed.path.parent().unwrap_or(Path::new("."));
            let _ = writeln!(
                out,
                "warning: {} is not on the plugin search path; add it (--plugin-path, CORDIS_PLUGIN_PATH)",
                dir.display(),
            );
        }
    }
    let services: Vec<&str> = meta.provides.iter().map(|s| s.name.as_str()).collect();
    let needs: Vec<&str> = meta
        .injects
        .iter()
        .filter(|i| !i.optional)
        .map(|i| i.name.as_str())
        .collect();
    if !services.is_empty() {
        let _ = writeln!(out, "provides: {}", services.join(", "));
    }
    if !needs.is_empty() {
        let _ = writeln!(
            out,
            "needs: {} (entries providing them must be in the same cordis.yml)",
            needs.join(", ")
        );
    }
    match meta.tools.as_deref() {
        Some(t) if t.iter().any(|t| t == TOOLS_FROM_CONFIG) => {
            out.push_str("tools: named by its config\n");
        }
        Some(t) if !t.is_empty() => {
            let _ = writeln!(out, "tools: {}", t.join(", "));
        }
        _ => {}
    }
    let _ = writeln!(
        out,
        "add this entry to cordis.yml (`cordis schema {}` prints its config schema):\n\n- name: {}",
        meta.name, meta.name
    );
    out
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// Writes `text` to stdout, ignoring a closed pipe (`cordis plugin list | head`).
pub fn print(text: &str) {
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}
