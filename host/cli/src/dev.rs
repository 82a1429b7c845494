//! `cordis run --dev`: besides the libraries and the manifest, watch the sources of the
//! cargo project the manifest lives in and, when one is saved, run `cargo build` for the
//! packages whose libraries the composition loads; reload as soon as cargo reports the build
//! finished (its JSON messages say when and whether it succeeded). A failed build leaves
//! the running composition serving, like any bad change.
//!
//! Which package builds which library comes from `cargo metadata`: a loaded library
//! `<target dir>/<profile dir>/lib<name>.so` is built by the workspace member with a
//! `cdylib` target `<name>`, in the profile that writes into `<profile dir>`. Entries whose
//! libraries this project does not build are reloaded when their files change but never
//! rebuilt. Before the composition is loaded, one build brings the libraries up to date
//! with the sources.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::channel;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;
use notify::{RecursiveMode, Watcher};
use serde::Deserialize;

use crate::watch::{change_watcher, next_batch, reload_and_log, survive, Quiet};
use cordis_engine::loader::{library_file_name, SearchPath};
use cordis_engine::runtime::Runtime;

#[derive(Deserialize)]
struct Metadata {
    packages: Vec<Package>,
    workspace_members: Vec<String>,
    workspace_root: PathBuf,
    target_directory: PathBuf,
}

#[derive(Deserialize)]
struct Package {
    id: String,
    name: String,
    manifest_path: PathBuf,
    targets: Vec<Target>,
}

#[derive(Deserialize)]
struct Target {
    name: String,
    kind: Vec<String>,
}

/// A workspace member that builds a plugin library.
#[derive(Debug)]
struct Member {
    package: String,
    /// The library's file name (`lib<name>.so`).
    library: String,
}

/// The cargo project the manifest lives in.
#[derive(Debug)]
pub struct Project {
    /// Its `Cargo.toml` (the workspace root's).
    manifest: PathBuf,
    /// Its target directory (canonical).
    target_dir: PathBuf,
    /// The directories of its members (watched recursively).
    member_dirs: Vec<PathBuf>,
    /// The members with a `cdylib` target.
    plugins: Vec<Member>,
}

impl Project {
    /// What `--dev` trusts and must protect from sandboxed sessions: the package
    /// directories whose sources it rebuilds into the host, and the target directory.
    pub fn trusted_paths(&self) -> Vec<PathBuf> {
        let mut paths = self.member_dirs.clone();
        paths.push(self.target_dir.clone());
        paths
    }
}

/// The cargo to run: the one that ran us (`cargo run`) when set, else `cargo` on `PATH`.
fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// One `cargo build` invocation: a profile and the packages to build in it.
type Builds = BTreeMap<String, BTreeSet<String>>;

impl Project {
    /// Asks `cargo metadata` about the project containing `dir`.
    pub fn discover(dir: &Path) -> anyhow::Result<Project> {
        let out = cargo()
            .args(["metadata", "--no-deps", "--format-version", "1"])
            .current_dir(dir)
            .stdin(Stdio::null())
            .output()
            .context("cannot run `cargo metadata` (is cargo on PATH?)")?;
        if !out.status.success() {
            anyhow::bail!(
                "`cargo metadata` in {} failed; `--dev` needs the manifest inside a cargo project:\n{}",
                dir.display(),
                String::from_utf8_lossy(&out.stderr).trim_end()
            );
        }
        let meta: Metadata =
            serde_json::from_slice(&out.stdout).context("cannot read `cargo metadata` output")?;
        let members: BTreeSet<&str> = meta.workspace_members.iter().map(String::as_str).collect();
        let members: Vec<&Package> = meta
            .packages
            .iter()
            .filter(|p| members.contains(p.id.as_str()))
            .collect();
        Ok(Project {
            manifest: meta.workspace_root.join("Cargo.toml"),
            target_dir: meta
                .target_directory
                .canonicalize()
                .unwrap_or(meta.target_directory),
            member_dirs: members
                .iter()
                .filter_map(|p| p.manifest_path.parent().map(Path::to_path_buf))
                .collect(),
            plugins: members
                .iter()
                .flat_map(|p| {
                    p.targets
                        .iter()
                        .filter(|t| t.kind.iter().any(|k| k == "cdylib"))
                        .map(|t| Member {
                            package: p.name.clone(),
                            library: library_file_name(&t.name),
                        })
                })
                .collect(),
        })
    }

    /// The builds that produce the libraries of `entries` (entry id, library path), and a
    /// note for each entry this project does not build.
    fn builds(&self, entries: &[(String, PathBuf)]) -> (Builds, Vec<String>) {
        let mut builds = Builds::new();
        let mut notes = Vec::new();
        for (id, path) in entries {
            let path = path.canonicalize().unwrap_or_else(|_| path.clone());
            let member = path.file_name().and_then(|file| {
                self.plugins
                    .iter()
                    .find(|m| std::ffi::OsStr::new(&m.library) == file)
            });
            let profile_dir = path
                .parent()
                .filter(|dir| dir.parent() == Some(self.target_dir.as_path()))
                .and_then(|dir| dir.file_name())
                .and_then(|name| name.to_str());
            match (member, profile_dir) {
                (Some(m), Some(dir)) => {
                    let profile = if dir == "debug" { "dev" } else { dir };
                    builds
                        .entry(profile.to_string())
                        .or_default()
                        .insert(m.package.clone());
                }
                _ => notes.push(format!(
                    "entry `{id}`: {} is not built by the cargo project {}; it is reloaded when the file changes but not rebuilt",
                    path.display(),
                    self.manifest.display()
                )),
            }
        }
        (builds, notes)
    }

    /// Whether a changed path is a source edit (not build output, not a hidden or backup
    /// file of an editor or of version control).
    fn is_source(&self, path: &Path) -> bool {
        if path.starts_with(&self.target_dir) {
            return false;
        }
        let Some(inside) = self
            .member_dirs
            .iter()
            .find_map(|d| path.strip_prefix(d).ok())
        else {
            return false;
        };
        let hidden = inside
            .components()
            .any(|c| c.as_os_str().to_str().is_some_and(|s| s.starts_with('.')));
        let backup = inside
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.ends_with('~'));
        !hidden && !backup
    }

    /// Runs one `cargo build` per profile; true when every one succeeded.
    fn build(&self, builds: &Builds) -> bool {
        builds
            .iter()
            .all(|(profile, packages)| self.build_one(profile, packages))
    }

    fn build_one(&self, profile: &str, packages: &BTreeSet<String>) -> bool {
        let started = Instant::now();
        let list = packages.iter().cloned().collect::<Vec<_>>().join(", ");
        tracing::info!("dev: cargo build --profile {profile} of {list}");
        let mut cmd = cargo();
        cmd.arg("build")
            .arg("--message-format=json-render-diagnostics")
            .arg("--manifest-path")
            .arg(&self.manifest)
            .args(["--profile", profile])
            .args(packages.iter().flat_map(|p| ["-p", p.as_str()]))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            // Progress and rendered compiler errors go to our log stream.
            .stderr(Stdio::inherit());
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                tracing::error!("dev: cannot run cargo: {e}");
                return false;
            }
        };
        let mut finished = None;
        let mut rebuilt = Vec::new();
        if let Some(stdout) = child.stdout.take() {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let Ok(msg) = serde_json::from_str::<serde_json::Value>(&line) else {
                    continue;
                };
                match msg["reason"].as_str() {
                    Some("compiler-artifact") if msg["fresh"] == false => {
                        let is_plugin = msg["target"]["kind"]
                            .as_array()
                            .is_some_and(|k| k.iter().any(|k| k == "cdylib"));
                        if is_plugin {
                            if let Some(name) = msg["target"]["name"].as_str() {
                                rebuilt.push(name.to_string());
                            }
                        }
                    }
                    Some("build-finished") => finished = msg["success"].as_bool(),
                    _ => {}
                }
            }
        }
        let status = child.wait();
        let ok = finished == Some(true) && status.as_ref().is_ok_and(|s| s.success());
        let took = started.elapsed().as_secs_f64();
        if ok {
            let rebuilt = if rebuilt.is_empty() {
                "nothing changed".to_string()
            } else {
                format!("rebuilt {}", rebuilt.join(", "))
            };
            tracing::info!("dev: build finished in {took:.1} s: {rebuilt}");
        } else {
            tracing::error!(
                "dev: cargo build of {list} failed after {took:.1} s (errors above); still serving the previous build"
            );
        }
        ok
    }
}

impl Project {
    /// Builds the libraries the enabled entries of `manifest` name, before anything is
    /// loaded, so `cordis run --dev` serves the current sources (and works before the first
    /// `cargo build`). An entry without `path:` is looked up in `search`; one not found there
    /// yet is built into the `dev` profile. Returns whether the build succeeded; an
    /// unreadable manifest builds nothing (the composition's own check reports it).
    pub fn build_for_manifest(&self, manifest: &Path, search: &SearchPath) -> bool {
        let Ok(text) = std::fs::read_to_string(manifest) else {
            return true;
        };
        let Ok(parsed) = cordis_engine::manifest::parse(&text) else {
            return true;
        };
        let base = manifest.parent().unwrap_or(Path::new("."));
        let entries: Vec<(String, PathBuf)> = parsed
            .enabled()
            .map(|e| {
                let path = match &e.path {
                    Some(p) => base.join(p),
                    None => search.find(&e.plugin).unwrap_or_else(|_| {
                        self.target_dir
                            .join("debug")
                            .join(library_file_name(&e.plugin))
                    }),
                };
                (e.id.clone(), path)
            })
            .collect();
        let (builds, _) = self.builds(&entries);
        builds.is_empty() || self.build(&builds)
    }
}

/// Watches the sources of `project` and rebuilds and reloads `runtime`'s plugins on every
/// change (once the sources have been quiet for `quiet.library`), on a background thread.
/// The reload follows cargo's build-finished message with no further wait.
pub fn spawn(runtime: Arc<Runtime>, project: Project, quiet: Quiet) -> anyhow::Result<()> {
    let entries = entry_libraries(&runtime);
    let (builds, notes) = project.builds(&entries);
    for note in notes {
        tracing::warn!("dev: {note}");
    }
    let (tx, rx) = channel::<Vec<PathBuf>>();
    let mut watcher = change_watcher(tx)?;
    for dir in &project.member_dirs {
        watcher
            .watch(dir, RecursiveMode::Recursive)
            .with_context(|| format!("cannot watch {}", dir.display()))?;
    }
    let packages: BTreeSet<&String> = builds.values().flatten().collect();
    tracing::info!(
        "dev: rebuilding {} on every change in {}",
        if packages.is_empty() {
            "nothing (no loaded library is built by this project)".to_string()
        } else {
            packages
                .iter()
                .map(|p| p.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        },
        project.manifest.display()
    );

    std::thread::Builder::new()
        .name("cordis-dev".into())
        .spawn(move || {
            let _watcher = watcher;
            while let Some(batch) = next_batch(&rx, |_| quiet.library) {
                let Some(edited) = batch.paths.iter().find(|p| project.is_source(p)) else {
                    continue;
                };
                tracing::debug!("dev: {} changed", edited.display());
                survive("dev builder", || {
                    let (builds, _) = project.builds(&entry_libraries(&runtime));
                    if builds.is_empty() {
                        return;
                    }
                    // The library watcher waits while cargo writes libraries one by one; one
                    // reload follows the whole build.
                    let built = {
                        let _hold = runtime.hold_reloads();
                        project.build(&builds)
                    };
                    if built {
                        reload_and_log(&runtime, Some(batch.first_seen));
                    }
                });
            }
        })?;
    Ok(())
}

fn entry_libraries(runtime: &Runtime) -> Vec<(String, PathBuf)> {
    runtime
        .composition()
        .plan
        .entries
        .iter()
        .map(|p| (p.entry.id.clone(), p.library.path.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn project(root: &Path) -> Project {
        Project {
            manifest: root.join("Cargo.toml"),
            target_dir: root.join("target"),
            member_dirs: vec![root.join("plugins/a"), root.join("plugins/b")],
            plugins: vec![
                Member {
                    package: "plugin-a".into(),
                    library: library_file_name("plugin_a"),
                },
                Member {
                    package: "plugin-b".into(),
                    library: library_file_name("plugin_b"),
                },
            ],
        }
    }

    #[test]
    fn libraries_map_to_packages_and_profiles() {
        let root = Path::new("/nonexistent/ws");
        let p = project(root);
        let lib =
            |dir: &str, name: &str| root.join("target").join(dir).join(library_file_name(name));
        let (builds, notes) = p.builds(&[
            ("a".into(), lib("debug", "plugin_a")),
            ("b".into(), lib("release", "plugin_b")),
            ("c".into(), lib("debug", "elsewhere")),
            (
                "d".into(),
                Path::new("/opt/plugins").join(library_file_name("plugin_a")),
            ),
        ]);
        let expected: Builds = [
            ("dev".to_string(), BTreeSet::from(["plugin-a".to_string()])),
            (
                "release".to_string(),
                BTreeSet::from(["plugin-b".to_string()]),
            ),
        ]
        .into_iter()
        .collect();
        assert_eq!(builds, expected);
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert!(notes[0].starts_with("entry `c`: "), "{notes:?}");
        assert!(notes[1].starts_with("entry `d`: "), "{notes:?}");
    }

    #[test]
    fn only_source_edits_count() {
        let root = Path::new("/nonexistent/ws");
        let p = project(root);
        assert!(p.is_source(&root.join("plugins/a/src/lib.rs")));
        assert!(p.is_source(&root.join("plugins/b/Cargo.toml")));
        assert!(!p.is_source(&root.join("target/debug/libplugin_a.so")));
        assert!(!p.is_source(&root.join("plugins/a/src/.lib.rs.swp")));
        assert!(!p.is_source(&root.join("plugins/a/src/lib.rs~")));
        assert!(!p.is_source(&root.join("plugins/a/.git/index")));
        assert!(!p.is_source(&root.join("README.md")));
    }
}
