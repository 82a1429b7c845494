//! Running cargo for the front-ends: which cargo, what `cargo metadata` says about a
//! project, and a build's JSON messages. Used by the `--dev` loop ([`crate::dev`]) and by
//! `cordis plugin install` ([`crate::plugins`]).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::Context as _;
use serde::Deserialize;

/// The cargo to run: the one that ran us (`cargo run`) when set, else `cargo` on `PATH`.
pub(crate) fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// What `cargo metadata --no-deps` says about a project (the fields used here).
#[derive(Deserialize)]
pub(crate) struct Metadata {
    pub(crate) packages: Vec<Package>,
    pub(crate) workspace_members: Vec<String>,
    pub(crate) workspace_root: PathBuf,
    pub(crate) target_directory: PathBuf,
}

#[derive(Deserialize)]
pub(crate) struct Package {
    pub(crate) id: String,
    pub(crate) name: String,
    pub(crate) manifest_path: PathBuf,
    pub(crate) targets: Vec<Target>,
    #[serde(default)]
    pub(crate) dependencies: Vec<Dependency>,
}

#[derive(Deserialize)]
pub(crate) struct Dependency {
    /// The package directory of a path dependency.
    #[serde(default)]
    pub(crate) path: Option<PathBuf>,
    /// `dev` or `build`; none for a normal dependency.
    #[serde(default)]
    pub(crate) kind: Option<String>,
}

impl Dependency {
    /// The package directory of a path dependency a library build compiles (a normal or
    /// build dependency; a dev-dependency serves only the tests).
    pub(crate) fn built_path(&self) -> Option<&PathBuf> {
        self.path
            .as_ref()
            .filter(|_| self.kind.as_deref() != Some("dev"))
    }
}

#[derive(Deserialize)]
pub(crate) struct Target {
    pub(crate) name: String,
    pub(crate) kind: Vec<String>,
}

impl Target {
    /// Whether cargo builds this target as a plugin library.
    pub(crate) fn is_cdylib(&self) -> bool {
        self.kind.iter().any(|k| k == "cdylib")
    }
}

/// Asks `cargo metadata` about the project containing `dir`.
pub(crate) fn cargo_metadata(dir: &Path) -> anyhow::Result<Metadata> {
    let out = cargo()
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .context("cannot run `cargo metadata` (is cargo on PATH?)")?;
    if !out.status.success() {
        anyhow::bail!(
            "`cargo metadata` in {} failed:\n{}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr).trim_end()
        );
    }
    serde_json::from_slice(&out.stdout).context("cannot read `cargo metadata` output")
}

/// Runs `cmd` (a cargo build) with `--message-format=json-render-diagnostics` added, its
/// progress and rendered errors going to our stderr, and hands every JSON message to
/// `each`; true when cargo reported a finished, successful build.
pub(crate) fn cargo_build_messages(
    mut cmd: Command,
    mut each: impl FnMut(&serde_json::Value),
) -> std::io::Result<bool> {
    let mut child = cmd
        .arg("--message-format=json-render-diagnostics")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let mut finished = None;
    if let Some(stdout) = child.stdout.take() {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let Ok(msg) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            if msg["reason"] == "build-finished" {
                finished = msg["success"].as_bool();
            }
            each(&msg);
        }
    }
    let status = child.wait()?;
    Ok(finished == Some(true) && status.success())
}
