//! A plugin library under test: loaded or built, with its entry's config and id, and the
//! stand-ins a test gives it.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use cordis_engine::{Entry, HostServices, Library, Meta, Pos, SearchPath, ServiceSpec};
use cordis_sdk::abi::ServiceBox;
use cordis_sdk::host::ApprovalOutcome;
use cordis_sdk::InterfaceMismatch;

use crate::composition::put_stand_in;
use crate::{Composition, HarnessError, Started};

/// A plugin library loaded for a test, not yet applied: set its config and stand-ins,
/// then [`start`](PluginUnderTest::start) it.
pub struct PluginUnderTest {
    pub(crate) library: Arc<Library>,
    id: Option<String>,
    config: serde_json::Value,
    pub(crate) stand_ins: Vec<(ServiceSpec, ServiceBox)>,
    pub(crate) cwd: Option<PathBuf>,
    pub(crate) approval: Option<ApprovalOutcome>,
}

impl fmt::Debug for PluginUnderTest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PluginUnderTest")
            .field("library", &self.library.path)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl PluginUnderTest {
    /// Loads the plugin library at `path` (a cdylib built with `export_plugin!`) through
    /// the host's loader: ABI checks and metadata exactly as `cordis check` does them.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, HarnessError> {
        let path = path.as_ref();
        let library = Library::load(path).map_err(|error| HarnessError::Load {
            path: path.to_path_buf(),
            error,
        })?;
        Ok(PluginUnderTest {
            library,
            id: None,
            config: serde_json::json!({}),
            stand_ins: Vec::new(),
            cwd: None,
            approval: None,
        })
    }

    /// Builds the crate in `crate_dir` (usually `env!("CARGO_MANIFEST_DIR")`) and loads
    /// the cdylib it produced. From a test that `cargo test` runs, this is the library
    /// `cargo test` has just built (`cargo build --tests` with the test's profile and
    /// target directory: the same features, so nothing is compiled again); elsewhere cargo
    /// builds it. Cargo honours `CARGO_TARGET_DIR` and the crate's own settings.
    pub fn build(crate_dir: impl AsRef<Path>) -> Result<Self, HarnessError> {
        let path = build_cdylib(crate_dir.as_ref())?;
        Self::load(path)
    }

    /// Loads plugin `plugin` (e.g. `dsh-fs-sandbox`) from where the `cordis` on `PATH`
    /// finds it — `CORDIS_PLUGIN_PATH`, the user plugin directory, its installation's
    /// plugin directory (a release archive's bundled plugins), the directory of the binary
    /// (a checkout's build output) — to compose your plugin with the plugins your `cordis`
    /// runs.
    pub fn installed(plugin: &str) -> Result<Self, HarnessError> {
        let cordis = std::env::var_os("PATH").and_then(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join("cordis"))
                .find(|file| file.is_file())
                .and_then(|file| file.canonicalize().ok())
        });
        match SearchPath::for_binary(&[], cordis.as_deref()).find(plugin) {
            Ok(path) => Self::load(path),
            Err(tried) => Err(HarnessError::NotInstalled {
                plugin: plugin.to_string(),
                cordis,
                tried,
            }),
        }
    }

    /// The plugin's metadata (name, version, provided and injected services, config
    /// schema) as the host read it from the library.
    pub fn meta(&self) -> &Meta {
        &self.library.meta
    }

    /// The library file that was loaded.
    pub fn path(&self) -> &Path {
        &self.library.path
    }

    /// The entry id the plugin sees in `Context::entry_id` (default: the plugin's name).
    pub fn id(mut self, id: &str) -> Self {
        self.id = Some(id.to_string());
        self
    }

    /// The config, as it would be written under `config:` in `cordis.yml` (default `{}`).
    pub fn config(mut self, config: serde_json::Value) -> Self {
        self.config = config;
        self
    }

    /// Supplies service `name` to the plugin: `service` is a provider wrapped by the seam
    /// crate's client, e.g. `GreeterClient::serve(MyStandIn)`. It replaces a host service
    /// of the same name.
    pub fn stand_in(mut self, name: &str, service: ServiceBox) -> Self {
        put_stand_in(&mut self.stand_ins, name, service);
        self
    }

    /// The working directory of the session tool calls run in (default: a fresh
    /// temporary directory).
    pub fn cwd(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cwd = Some(dir.into());
        self
    }

    /// Answers every approval request the plugin makes with `outcome`.
    pub fn approve(mut self, outcome: ApprovalOutcome) -> Self {
        self.approval = Some(outcome);
        self
    }

    /// Checks the config against the plugin's JSON Schema and its own deserializer,
    /// without applying anything (what `cordis check` does for an entry).
    pub fn check_config(&self) -> Result<(), HarnessError> {
        let entry = self.entry();
        let meta = &self.library.meta;
        let mut problems: Vec<String> = cordis_engine::validate_config(&entry, &meta.config_schema)
            .into_iter()
            .map(|d| match d.help {
                Some(h) => format!("{} (help: {h})", d.message),
                None => d.message,
            })
            .collect();
        if problems.is_empty() {
            if let Err(e) = self.library.check_config(&self.config.to_string()) {
                problems.push(match e.help.into_option() {
                    Some(h) => format!("{} (help: {h})", e.message),
                    None => e.message.to_string(),
                });
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(HarnessError::Config {
                plugin: meta.name.clone(),
                problems,
            })
        }
    }

    /// The entry as `cordis.yml` would hold it.
    pub(crate) fn entry(&self) -> Entry {
        let name = self.library.meta.name.clone();
        Entry {
            id: self.id.clone().unwrap_or_else(|| name.clone()),
            plugin: name,
            path: Some(self.library.path.clone()),
            config: self.config.clone(),
            config_node: None,
            disabled: false,
            isolate: None,
            pos: Pos { line: 1, col: 1 },
        }
    }

    /// Checks the config and the injections, then applies the plugin through the host's
    /// engine, alone (a [`Composition`] of one entry). The returned [`Started`] disposes it
    /// when dropped.
    pub fn start(self) -> Result<Started, HarnessError> {
        self.check_config()?;
        let mut services = HostServices::specs();
        services.retain(|s| !self.stand_ins.iter().any(|(t, _)| t.name == s.name));
        services.extend(self.stand_ins.iter().map(|(s, _)| s.clone()));
        self.check_injections(&services)?;
        Composition::new().plugin(self).start()
    }

    /// Every required injection without a fitting stand-in, all reported at once.
    fn check_injections(&self, services: &[ServiceSpec]) -> Result<(), HarnessError> {
        let meta = &self.library.meta;
        let problems: Vec<String> = meta
            .injects
            .iter()
            .filter_map(|inj| match services.iter().find(|s| s.name == inj.name) {
                None if inj.optional => None,
                None => Some(format!(
                    "it requires service `{}` ({} v{}); supply one with `.stand_in(\"{}\", Client::serve(...))` using the seam crate's client, or the stand-in its interface crate ships behind the feature `testing`",
                    inj.name, inj.interface, inj.version, inj.name
                )),
                Some(s) => InterfaceMismatch::check(
                    &inj.name,
                    (&inj.interface, inj.version),
                    (&s.interface, s.version),
                )
                .err()
                .map(|mismatch| mismatch.explain("it", "the stand-in")),
            })
            .collect();
        if problems.is_empty() {
            return Ok(());
        }
        Err(HarnessError::Injection {
            plugin: meta.name.clone(),
            problem: problems.join("\n  "),
        })
    }
}

/// Runs `cargo build --lib` in `crate_dir` and returns the cdylib it reports.
fn build_cdylib(crate_dir: &Path) -> Result<PathBuf, HarnessError> {
    let fail = |detail: String| HarnessError::Build {
        crate_dir: crate_dir.to_path_buf(),
        detail,
    };
    let manifest = crate_dir.join("Cargo.toml");
    if !manifest.is_file() {
        return Err(fail(
            "there is no Cargo.toml in it; pass the plugin crate's directory, e.g. env!(\"CARGO_MANIFEST_DIR\")"
                .to_string(),
        ));
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    // `--tests`, not `--lib`: with the dev-dependencies' features, as `cargo test` built
    // the library (a `--lib` build resolves features without them and compiles the
    // dependencies again).
    command
        .current_dir(crate_dir)
        .args([
            "build",
            "--tests",
            "--message-format=json-render-diagnostics",
        ])
        .arg("--manifest-path")
        .arg(&manifest);
    if let Some((target_dir, profile)) = std::env::current_exe()
        .ok()
        .and_then(|exe| cargo_output_of(&exe))
    {
        command.arg("--target-dir").arg(target_dir);
        command.args(["--profile", &profile]);
    }
    let out = command
        .output()
        .map_err(|e| fail(format!("cannot run cargo: {e}")))?;
    if !out.status.success() {
        return Err(fail(format!(
            "cargo build failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    let suffix = std::env::consts::DLL_SUFFIX;
    let mut found = None;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if msg["reason"] != "compiler-artifact" {
            continue;
        }
        let target_dir = msg["manifest_path"]
            .as_str()
            .and_then(|p| Path::new(p).parent())
            .map(Path::to_path_buf);
        let is_cdylib = msg["target"]["kind"]
            .as_array()
            .is_some_and(|k| k.iter().any(|k| k == "cdylib"))
            && msg["profile"]["test"] != true;
        let ours = target_dir
            .zip(crate_dir.canonicalize().ok())
            .is_some_and(|(a, b)| a.canonicalize().ok() == Some(b));
        if !(is_cdylib && ours) {
            continue;
        }
        let library = msg["filenames"].as_array().and_then(|files| {
            files
                .iter()
                .filter_map(|f| f.as_str())
                .find(|f| f.ends_with(suffix))
                .map(PathBuf::from)
        });
        found = library.or(found);
    }
    found.ok_or_else(|| {
        fail(
            "cargo built no cdylib for it; set `crate-type = [\"cdylib\"]` under `[lib]` in Cargo.toml"
                .to_string(),
        )
    })
}

/// The target directory and profile a test executable at `exe` was built with, when it
/// lies where cargo puts them: `<target>/<profile dir>/deps/`, `<target>` holding cargo's
/// `CACHEDIR.TAG`.
fn cargo_output_of(exe: &Path) -> Option<(PathBuf, String)> {
    let deps = exe.parent()?;
    if deps.file_name()? != "deps" {
        return None;
    }
    let profile_dir = deps.parent()?;
    let target = profile_dir.parent()?;
    if !target.join("CACHEDIR.TAG").is_file() {
        return None;
    }
    let profile = match profile_dir.file_name()?.to_str()? {
        "debug" => "dev",
        "release" => "release",
        other => other,
    };
    Some((target.to_path_buf(), profile.to_string()))
}
