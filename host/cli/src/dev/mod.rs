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

mod project;
mod sources;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::mpsc::channel;
use std::sync::Arc;

use anyhow::Context as _;
use notify::{RecursiveMode, Watcher};

use crate::watch::{change_watcher, next_batch, reload_and_log, survive, Change, Completed, Quiet};
use cordis_engine::Runtime;
use cordis_engine::{library_file_name, SearchPath};
use project::{project_of, Builds, Project};

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
    let Ok(parsed) = cordis_engine::parse_manifest(&text) else {
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
    let (tx, rx) = channel::<Vec<Change>>();
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
            // A source file is never complete on its own: an editor saves several at once.
            while let Some(batch) = next_batch(&rx, |_| quiet.library, |_| false) {
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
                        reload_and_log(
                            &runtime,
                            Some((batch.first_seen, Completed::Rebuilt)),
                            Some("dev: unchanged: the rebuilt libraries are the running ones, byte for byte; nothing to reload"),
                        );
                    }
                });
            }
        })?;
    Ok(())
}

fn entry_libraries(runtime: &Runtime) -> Vec<(String, PathBuf)> {
    runtime.inspect(|c| {
        c.plan()
            .entries
            .iter()
            .map(|p| (p.entry.id.clone(), p.library.path.clone()))
            .collect()
    })
}
