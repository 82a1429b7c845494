//! The cargo projects `--dev` rebuilds: which packages build which loaded libraries, where
//! their sources are (the members and their path dependencies), what cargo reads as
//! configuration, and the builds themselves.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::sources::{build_configs, path_dependencies, sources_of};
use crate::cargo::{cargo, cargo_build_messages, cargo_metadata, Package};
use cordis_engine::library_file_name;

/// A workspace member that builds a plugin library.
#[derive(Debug)]
pub(super) struct Member {
    pub(super) package: String,
    /// The library's file name (`lib<name>.so`).
    pub(super) library: String,
}

/// One cargo project (a workspace, or a package that is its own).
#[derive(Debug)]
pub(super) struct Project {
    /// Its `Cargo.toml` (the workspace root's).
    pub(super) manifest: PathBuf,
    /// Its target directory (canonical).
    pub(super) target_dir: PathBuf,
    /// The directories of its members (watched recursively).
    pub(super) member_dirs: Vec<PathBuf>,
    /// The package directories of its members' path dependencies outside them, at any
    /// depth: cargo compiles their sources and runs their build scripts into the library
    /// too (watched recursively like the members).
    pub(super) path_deps: Vec<PathBuf>,
    /// The configuration files cargo and rustup read for a build here that existed when
    /// `--dev` started (protected), and those that did not (a build is refused once one
    /// appears).
    pub(super) configs: (Vec<PathBuf>, Vec<PathBuf>),
    /// The members with a `cdylib` target.
    pub(super) plugins: Vec<Member>,
}

impl Project {
    /// The package directories whose sources `--dev` rebuilds into the host, and the
    /// target directory.
    pub(super) fn trusted_paths(&self) -> Vec<PathBuf> {
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
    pub(super) fn source_dirs(&self) -> impl Iterator<Item = &PathBuf> {
        self.member_dirs.iter().chain(&self.path_deps)
    }

    /// The configuration files that did not exist when `--dev` started and do now.
    pub(super) fn appeared_configs(&self) -> Vec<&PathBuf> {
        self.configs
            .1
            .iter()
            .filter(|p| p.symlink_metadata().is_ok())
            .collect()
    }
}

/// One `cargo build` invocation: a profile and the packages to build in it.
pub(super) type Builds = BTreeMap<String, BTreeSet<String>>;

impl Project {
    /// Asks `cargo metadata` about the project containing `dir`.
    pub(super) fn discover(dir: &Path) -> anyhow::Result<Project> {
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
    pub(super) fn builds(&self, entries: &[(String, PathBuf)]) -> (Builds, Vec<String>) {
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
    pub(super) fn is_source(&self, path: &Path) -> bool {
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
    pub(super) fn build(&self, builds: &Builds) -> bool {
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

    pub(super) fn build_one(&self, profile: &str, packages: &BTreeSet<String>) -> bool {
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

/// The cargo project that builds `library`: of the projects around the sources its
/// dep-info file lists (the plugin's own crate, and path dependencies such as the SDK,
/// in no particular order), the one with a member whose `cdylib` is `library`. The
/// projects of its dependencies are not rebuilt, watched or trusted.
pub(super) fn project_of(library: &Path) -> Option<Project> {
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
    /// listed again, a registry dependency is none, and a dev-dependency (tests only) is
    /// left out.
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
        package("testing", "");
        package(
            "plugin",
            "shared = { path = \"../shared\" }\ninner = { path = \"inner\" }\nserde = \"1\"\n\n[dev-dependencies]\ntesting = { path = \"../testing\" }\n",
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
