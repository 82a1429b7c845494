//! `cordis run --dev`: besides the libraries and the manifest, watch the sources of the
//! cargo projects that build the composition's libraries and, when one is saved, run
//! `cargo build` for the packages whose libraries the composition loads; reload as soon as
//! cargo reports the build finished (its JSON messages say when and whether it succeeded).
//! A failed build leaves the running composition serving, like any bad change.
//!
//! The projects are found wherever the manifest lives: the one behind each library (cargo
//! writes a dep-info file `lib<name>.d` beside it listing the sources it was built from;
//! of the cargo projects around those, asked with `cargo metadata`, the one with a member
//! whose `cdylib` is that library; a path dependency's project, such as the SDK's, is
//! neither rebuilt nor trusted), and the one the manifest lives in, if any (which covers a
//! plugin not built yet). Which package builds
//! which library comes from `cargo metadata`: a loaded library
//! `<target dir>/<profile dir>/lib<name>.so` is built by the workspace member with a
//! `cdylib` target `<name>`, in the profile that writes into `<profile dir>`. Entries whose
//! libraries no project builds are reloaded when their files change but never rebuilt (one
//! INFO line says which). Before the composition is loaded, one build brings the libraries
//! up to date with the sources.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::mpsc::channel;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;
use notify::{RecursiveMode, Watcher};

use crate::cargo::{cargo, cargo_build_messages, cargo_metadata, Package};
use crate::watch::{change_watcher, next_batch, reload_and_log, survive, Quiet};
use cordis_engine::loader::{library_file_name, SearchPath};
use cordis_engine::runtime::Runtime;

/// A workspace member that builds a plugin library.
#[derive(Debug)]
struct Member {
    package: String,
    /// The library's file name (`lib<name>.so`).
    library: String,
}

/// One cargo project (a workspace, or a package that is its own).
#[derive(Debug)]
struct Project {
    /// Its `Cargo.toml` (the workspace root's).
    manifest: PathBuf,
    /// Its target directory (canonical).
    target_dir: PathBuf,
    /// The directories of its members (watched recursively).
    member_dirs: Vec<PathBuf>,
    /// The package directories of its members' path dependencies outside them, at any
    /// depth: cargo compiles their sources and runs their build scripts into the library
    /// too (watched recursively like the members).
    path_deps: Vec<PathBuf>,
    /// The configuration files cargo and rustup read for a build here that existed when
    /// `--dev` started (protected), and those that did not (a build is refused once one
    /// appears).
    configs: (Vec<PathBuf>, Vec<PathBuf>),
    /// The members with a `cdylib` target.
    plugins: Vec<Member>,
}

impl Project {
    /// The package directories whose sources `--dev` rebuilds into the host, and the
    /// target directory.
    fn trusted_paths(&self) -> Vec<PathBuf> {
        let mut paths: Vec<PathBuf> = self.source_dirs().cloned().collect();
        paths.push(self.target_dir.clone());
        paths.push(self.manifest.clone());
        if let Some(root) = self.manifest.parent() {
            paths.push(root.join("Cargo.lock"));
        }
        for config in &self.configs.0 {
            // A `.cargo` directory whole, so no other config file appears beside one.
            match config.parent() {
                Some(dir) if dir.ends_with(".cargo") => paths.push(dir.to_path_buf()),
                _ => paths.push(config.clone()),
            }
        }
        paths.sort();
        paths.dedup();
        paths
    }

    /// Where the sources built into its libraries are: the members' directories and their
    /// path dependencies'.
    fn source_dirs(&self) -> impl Iterator<Item = &PathBuf> {
        self.member_dirs.iter().chain(&self.path_deps)
    }

    /// The configuration files that did not exist when `--dev` started and do now.
    fn appeared_configs(&self) -> Vec<&PathBuf> {
        self.configs
            .1
            .iter()
            .filter(|p| p.symlink_metadata().is_ok())
            .collect()
    }
}

/// One `cargo build` invocation: a profile and the packages to build in it.
type Builds = BTreeMap<String, BTreeSet<String>>;

impl Project {
    /// Asks `cargo metadata` about the project containing `dir`.
    fn discover(dir: &Path) -> anyhow::Result<Project> {
        let meta = cargo_metadata(dir)?;
        let members: BTreeSet<&str> = meta.workspace_members.iter().map(String::as_str).collect();
        let members: Vec<&Package> = meta
            .packages
            .iter()
            .filter(|p| members.contains(p.id.as_str()))
            .collect();
        let (present, absent): (Vec<PathBuf>, Vec<PathBuf>) = build_configs(&meta.workspace_root)
            .into_iter()
            .partition(|p| p.symlink_metadata().is_ok());
        let member_dirs: Vec<PathBuf> = members
            .iter()
            .filter_map(|p| p.manifest_path.parent().map(Path::to_path_buf))
            .collect();
        let path_deps = path_dependencies(&members, &member_dirs)?;
        Ok(Project {
            configs: (present, absent),
            manifest: meta.workspace_root.join("Cargo.toml"),
            target_dir: meta
                .target_directory
                .canonicalize()
                .unwrap_or(meta.target_directory),
            member_dirs,
            path_deps,
            plugins: members
                .iter()
                .flat_map(|p| {
                    p.targets.iter().filter(|t| t.is_cdylib()).map(|t| Member {
                        package: p.name.clone(),
                        library: library_file_name(&t.name),
                    })
                })
                .collect(),
        })
    }

    /// The builds that produce the libraries of `entries` (entry id, library path), and the
    /// ids of the entries this project does not build.
    fn builds(&self, entries: &[(String, PathBuf)]) -> (Builds, Vec<String>) {
        let mut builds = Builds::new();
        let mut others = Vec::new();
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
                _ => others.push(id.clone()),
            }
        }
        (builds, others)
    }

    /// Whether a changed path is a source edit (not build output, not a hidden or backup
    /// file of an editor or of version control).
    fn is_source(&self, path: &Path) -> bool {
        if path.starts_with(&self.target_dir) {
            return false;
        }
        let Some(inside) = self.source_dirs().find_map(|d| path.strip_prefix(d).ok()) else {
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

    /// Runs one `cargo build` per profile; true when every one succeeded. Refused while a
    /// configuration file cargo or rustup would read appeared since `--dev` started.
    fn build(&self, builds: &Builds) -> bool {
        let appeared = self.appeared_configs();
        if !appeared.is_empty() {
            let list: Vec<String> = appeared.iter().map(|p| p.display().to_string()).collect();
            tracing::error!(
                "dev: not building: {} appeared since `cordis run --dev` started; cargo and rustup \
                 would run what it says (a `rustc-wrapper`, a linker, a toolchain) unconfined, \
                 and a sandboxed session may have written it. Look at it, then restart \
                 `cordis run --dev` to build with it; still serving the previous build",
                list.join(", ")
            );
            return false;
        }
        builds
            .iter()
            .all(|(profile, packages)| self.build_one(profile, packages))
    }

    fn build_one(&self, profile: &str, packages: &BTreeSet<String>) -> bool {
        let started = Instant::now();
        let list = packages.iter().cloned().collect::<Vec<_>>().join(", ");
        tracing::info!("dev: cargo build --profile {profile} of {list}");
        let mut cmd = cargo();
        // In the project's root, so the configuration cargo and rustup find is the one
        // checked above, whatever directory the host runs in.
        if let Some(root) = self.manifest.parent() {
            cmd.current_dir(root);
        }
        cmd.arg("build")
            .arg("--manifest-path")
            .arg(&self.manifest)
            .args(["--profile", profile])
            .args(packages.iter().flat_map(|p| ["-p", p.as_str()]));
        let mut rebuilt = Vec::new();
        let built = cargo_build_messages(cmd, |msg| {
            let is_plugin = msg["target"]["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == "cdylib"));
            if msg["reason"] == "compiler-artifact" && msg["fresh"] == false && is_plugin {
                if let Some(name) = msg["target"]["name"].as_str() {
                    rebuilt.push(name.to_string());
                }
            }
        });
        let ok = match built {
            Ok(ok) => ok,
            Err(e) => {
                tracing::error!("dev: cannot run cargo: {e}");
                return false;
            }
        };
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

/// The package directories of the path dependencies of `members` (whose directories are
/// `member_dirs`) that lie outside every member, following each one's own path
/// dependencies in turn (`cargo metadata` of its package).
fn path_dependencies(
    members: &[&Package],
    member_dirs: &[PathBuf],
) -> anyhow::Result<Vec<PathBuf>> {
    let outside = |dir: &PathBuf| !member_dirs.iter().any(|m| dir.starts_with(m));
    let mut queue: Vec<PathBuf> = members
        .iter()
        .flat_map(|p| p.dependencies.iter().filter_map(|d| d.path.clone()))
        .collect();
    let mut found: BTreeSet<PathBuf> = BTreeSet::new();
    while let Some(dir) = queue.pop() {
        let dir = dir.canonicalize().unwrap_or(dir);
        if !outside(&dir) || !found.insert(dir.clone()) {
            continue;
        }
        let meta = cargo_metadata(&dir)?;
        let manifest = dir.join("Cargo.toml");
        if let Some(package) = meta.packages.iter().find(|p| {
            p.manifest_path
                .canonicalize()
                .unwrap_or_else(|_| p.manifest_path.clone())
                == manifest
        }) {
            queue.extend(package.dependencies.iter().filter_map(|d| d.path.clone()));
        }
    }
    Ok(found.into_iter().collect())
}

/// The configuration files cargo (`.cargo/config.toml`, `.cargo/config`) and rustup
/// (`rust-toolchain.toml`, `rust-toolchain`) read for a build run in `root`: in it and in
/// every directory above it.
fn build_configs(root: &Path) -> Vec<PathBuf> {
    root.ancestors()
        .flat_map(|dir| {
            [
                dir.join(".cargo/config.toml"),
                dir.join(".cargo/config"),
                dir.join("rust-toolchain.toml"),
                dir.join("rust-toolchain"),
            ]
        })
        .collect()
}

/// The source files listed in the dep-info file cargo writes beside `library`
/// (`lib<name>.d`: `<output>: <source> <source>...`, spaces in paths escaped with `\\`);
/// none when there is no such file.
fn sources_of(library: &Path) -> Vec<PathBuf> {
    use std::io::Read;
    let mut text = String::new();
    let read = std::fs::File::open(library.with_extension("d"))
        .and_then(|f| f.take(1 << 20).read_to_string(&mut text));
    let Some((_, deps)) = read
        .ok()
        .and_then(|_| text.lines().next())
        .and_then(|line| line.split_once(": "))
    else {
        return Vec::new();
    };
    let mut sources = Vec::new();
    let mut current = String::new();
    let mut chars = deps.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => current.extend(chars.next()),
            ' ' => sources
                .extend((!current.is_empty()).then(|| PathBuf::from(std::mem::take(&mut current)))),
            c => current.push(c),
        }
    }
    sources.extend((!current.is_empty()).then(|| PathBuf::from(current)));
    sources
}

/// The cargo project that builds `library`: of the projects around the sources its
/// dep-info file lists (the plugin's own crate, and path dependencies such as the SDK,
/// in no particular order), the one with a member whose `cdylib` is `library`. The
/// projects of its dependencies are not rebuilt, watched or trusted.
fn project_of(library: &Path) -> Option<Project> {
    let file = library.file_name()?;
    let mut asked: BTreeSet<PathBuf> = BTreeSet::new();
    for source in sources_of(library) {
        let Some(dir) = source
            .ancestors()
            .skip(1)
            .find(|dir| dir.join("Cargo.toml").is_file())
        else {
            continue;
        };
        if !asked.insert(dir.to_path_buf()) {
            continue;
        }
        let Ok(project) = Project::discover(dir) else {
            continue;
        };
        if project
            .plugins
            .iter()
            .any(|m| std::ffi::OsStr::new(&m.library) == file)
        {
            return Some(project);
        }
        // Another crate's project: none of its members builds this library.
        asked.extend(project.member_dirs);
    }
    None
}

/// The enabled entries of `manifest` and their libraries: a `path:` relative to the
/// manifest, else the library found on `search`, else (when `unbuilt` is given) where the
/// `dev` profile of `unbuilt` would write it. Entries not found otherwise are left out; an
/// unreadable manifest has none (the composition's own check reports it).
fn manifest_entries(
    manifest: &Path,
    search: &SearchPath,
    unbuilt: Option<&Path>,
) -> Vec<(String, PathBuf)> {
    let Ok(text) = std::fs::read_to_string(manifest) else {
        return Vec::new();
    };
    let Ok(parsed) = cordis_engine::manifest::parse(&text) else {
        return Vec::new();
    };
    let base = manifest.parent().unwrap_or(Path::new("."));
    parsed
        .enabled()
        .filter_map(|e| {
            let path = match &e.path {
                Some(p) => base.join(p),
                None => search.find(&e.plugin).ok().or_else(|| {
                    unbuilt.map(|t| t.join("debug").join(library_file_name(&e.plugin)))
                })?,
            };
            Some((e.id.clone(), path))
        })
        .collect()
}

/// Every cargo project `--dev` rebuilds.
#[derive(Debug)]
pub struct Projects(Vec<Project>);

impl Projects {
    /// The projects behind the libraries `manifest` names and the one `manifest` lives in.
    /// None at all is an error that says what `--dev` needs.
    pub fn discover(manifest: &Path, search: &SearchPath) -> anyhow::Result<Projects> {
        let manifest_dir = manifest
            .canonicalize()
            .ok()
            .and_then(|m| m.parent().map(Path::to_path_buf))
            .unwrap_or_else(|| PathBuf::from("."));
        let mut projects: Vec<Project> = Vec::new();
        // Outside every cargo project is fine for the manifest (a composition beside its
        // plugins' folders); what cargo said is shown if no project is found at all.
        let around_manifest = Project::discover(&manifest_dir);
        let failure = around_manifest.as_ref().err().map(|e| format!("{e:#}"));
        projects.extend(around_manifest.ok());
        for (_, library) in manifest_entries(manifest, search, None) {
            let built = projects
                .iter()
                .any(|p| !p.builds(&[(String::new(), library.clone())]).0.is_empty());
            if built {
                continue;
            }
            if let Some(project) = project_of(&library) {
                if !projects.iter().any(|p| p.manifest == project.manifest) {
                    projects.push(project);
                }
            }
        }
        if projects.is_empty() {
            anyhow::bail!(
                "no cargo project builds a library of {} and it is not inside one: `--dev` rebuilds plugins from their sources; build them once with cargo (it writes the dep-info file `lib<name>.d` beside each library that leads back to its sources), or run without `--dev`\n{}",
                manifest.display(),
                failure.unwrap_or_default()
            );
        }
        Ok(Projects(projects))
    }

    /// What `--dev` trusts and must protect from sandboxed sessions: every project's
    /// package directories and target directory.
    pub fn trusted_paths(&self) -> Vec<PathBuf> {
        self.0.iter().flat_map(Project::trusted_paths).collect()
    }

    /// Builds the libraries the enabled entries of `manifest` name, before anything is
    /// loaded, so `cordis run --dev` serves the current sources (and works before the first
    /// `cargo build`). An entry without `path:` is looked up in `search`; one not found there
    /// yet is built into the `dev` profile of the first project (the manifest's own, when
    /// it is in one). Returns whether every build succeeded.
    pub fn build_for_manifest(&self, manifest: &Path, search: &SearchPath) -> bool {
        let unbuilt = self.0.first().map(|p| p.target_dir.as_path());
        let entries = manifest_entries(manifest, search, unbuilt);
        self.0.iter().all(|project| {
            let (builds, _) = project.builds(&entries);
            builds.is_empty() || project.build(&builds)
        })
    }
}

/// Watches the sources of `projects` and rebuilds and reloads `runtime`'s plugins on every
/// change (once the sources have been quiet for `quiet.library`), on a background thread.
/// The reload follows cargo's build-finished message with no further wait.
pub fn spawn(runtime: Arc<Runtime>, projects: Projects, quiet: Quiet) -> anyhow::Result<()> {
    let entries = entry_libraries(&runtime);
    let mut packages: BTreeSet<String> = BTreeSet::new();
    let mut not_built: Option<BTreeSet<String>> = None;
    for project in &projects.0 {
        let (builds, others) = project.builds(&entries);
        packages.extend(builds.into_values().flatten());
        let others: BTreeSet<String> = others.into_iter().collect();
        not_built = Some(match not_built {
            None => others,
            Some(before) => before.intersection(&others).cloned().collect(),
        });
    }
    let not_built = not_built.unwrap_or_default();
    if !not_built.is_empty() {
        tracing::info!(
            "dev: not rebuilding {} (no cargo project here builds their libraries; they are reloaded when their files change)",
            not_built.iter().map(String::as_str).collect::<Vec<_>>().join(", ")
        );
    }
    let (tx, rx) = channel::<Vec<PathBuf>>();
    let mut watcher = change_watcher(tx)?;
    for dir in projects.0.iter().flat_map(|p| p.source_dirs()) {
        watcher
            .watch(dir, RecursiveMode::Recursive)
            .with_context(|| format!("cannot watch {}", dir.display()))?;
    }
    tracing::info!(
        "dev: rebuilding {} on every change in {}",
        if packages.is_empty() {
            "nothing (no loaded library is built by these projects)".to_string()
        } else {
            packages.iter().cloned().collect::<Vec<_>>().join(", ")
        },
        projects
            .0
            .iter()
            .map(|p| p.manifest.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );

    std::thread::Builder::new()
        .name("cordis-dev".into())
        .spawn(move || {
            let _watcher = watcher;
            while let Some(batch) = next_batch(&rx, |_| quiet.library) {
                let edited: Vec<&Project> = projects
                    .0
                    .iter()
                    .filter(|project| batch.paths.iter().any(|p| project.is_source(p)))
                    .collect();
                if edited.is_empty() {
                    continue;
                }
                survive("dev builder", || {
                    let entries = entry_libraries(&runtime);
                    let builds: Vec<(&Project, Builds)> = edited
                        .iter()
                        .map(|project| (*project, project.builds(&entries).0))
                        .filter(|(_, builds)| !builds.is_empty())
                        .collect();
                    if builds.is_empty() {
                        return;
                    }
                    // The library watcher waits while cargo writes libraries one by one; one
                    // reload follows the whole build.
                    let built = {
                        let _hold = runtime.hold_reloads();
                        builds.iter().all(|(project, builds)| project.build(builds))
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
            path_deps: vec![root.join("../shared")],
            configs: (Vec::new(), Vec::new()),
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

    /// What cargo and rustup read as configuration is protected where it exists, and a
    /// build is refused once one appears where there was none.
    #[test]
    fn build_configuration_is_protected_or_watched_for() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("ws");
        std::fs::create_dir_all(tmp.path().join(".cargo")).unwrap();
        std::fs::write(tmp.path().join(".cargo/config.toml"), "").unwrap();
        std::fs::create_dir_all(&root).unwrap();
        let configs = build_configs(&root);
        assert!(configs.contains(&root.join(".cargo/config.toml")));
        assert!(configs.contains(&root.join("rust-toolchain.toml")));
        assert!(configs.contains(&tmp.path().join(".cargo/config")));
        let (present, absent): (Vec<PathBuf>, Vec<PathBuf>) = configs
            .into_iter()
            .partition(|p| p.symlink_metadata().is_ok());
        let p = Project {
            configs: (present, absent),
            ..project(&root)
        };
        let trusted = p.trusted_paths();
        for path in [
            tmp.path().join(".cargo"),
            root.join("../shared"),
            root.join("Cargo.toml"),
            root.join("Cargo.lock"),
            root.join("target"),
        ] {
            assert!(trusted.contains(&path), "{} in {trusted:?}", path.display());
        }
        assert!(p.appeared_configs().is_empty());
        assert!(p.build(&Builds::new()));
        std::fs::write(root.join("rust-toolchain.toml"), "").unwrap();
        assert_eq!(p.appeared_configs(), [&root.join("rust-toolchain.toml")]);
        assert!(!p.build(&Builds::new()), "a build is refused");
    }

    /// A member's path dependency outside the members, and that one's own, are found
    /// (cargo builds both into the library); a path dependency inside a member is not
    /// listed again, and a registry dependency is none.
    #[test]
    fn path_dependencies_are_found_at_any_depth() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().canonicalize().unwrap();
        let package = |dir: &str, deps: &str| {
            let dir = base.join(dir);
            std::fs::create_dir_all(dir.join("src")).unwrap();
            let name = dir.file_name().unwrap().to_str().unwrap().to_string();
            std::fs::write(
                dir.join("Cargo.toml"),
                format!("[package]\nname = \"{name}\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[dependencies]\n{deps}"),
            )
            .unwrap();
            std::fs::write(dir.join("src/lib.rs"), "").unwrap();
        };
        package("deeper", "");
        package("shared", "deeper = { path = \"../deeper\" }\n");
        package("plugin/inner", "");
        package(
            "plugin",
            "shared = { path = \"../shared\" }\ninner = { path = \"inner\" }\nserde = \"1\"\n",
        );
        let project = Project::discover(&base.join("plugin")).unwrap();
        assert_eq!(project.member_dirs, [base.join("plugin")]);
        assert_eq!(
            project.path_deps,
            [base.join("deeper"), base.join("shared")]
        );
        let trusted = project.trusted_paths();
        assert!(trusted.contains(&base.join("deeper")), "{trusted:?}");
        assert!(project.is_source(&base.join("shared/src/lib.rs")));
    }

    #[test]
    fn libraries_map_to_packages_and_profiles() {
        let root = Path::new("/nonexistent/ws");
        let p = project(root);
        let lib =
            |dir: &str, name: &str| root.join("target").join(dir).join(library_file_name(name));
        let (builds, others) = p.builds(&[
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
        assert_eq!(others, ["c", "d"]);
    }

    /// Every source of the dep-info file, spaces unescaped, in cargo's order (sorted, so
    /// the plugin's own crate root need not come first).
    #[test]
    fn dep_info_sources_are_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let library = dir.path().join(library_file_name("my_plugin"));
        std::fs::write(
            library.with_extension("d"),
            "/t/debug/libmy_plugin.rlib: /a/sdk/src/lib.rs /z/my\\ plugin/src/lib.rs\n\n/a/sdk/src/lib.rs:\n",
        )
        .unwrap();
        assert_eq!(
            sources_of(&library),
            [
                PathBuf::from("/a/sdk/src/lib.rs"),
                PathBuf::from("/z/my plugin/src/lib.rs")
            ]
        );
        assert!(sources_of(&dir.path().join("libnone.so")).is_empty());
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
