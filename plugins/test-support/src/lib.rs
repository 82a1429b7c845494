//! Test support for plugin authors: load a plugin library through the real `cordis` engine
//! (its loader and registry; no front-end), with a given config and stand-in services, then call its services
//! and tools and assert on the results — no manifest, no server.
//!
//! Add it to the plugin crate's `dev-dependencies` and write an integration test:
//!
//! ```no_run
//! use cordis_test::PluginUnderTest;
//!
//! # fn main() -> Result<(), cordis_test::HarnessError> {
//! // Build this crate's cdylib (`cargo build`) and load it like `cordis` would.
//! let plugin = PluginUnderTest::build(env!("CARGO_MANIFEST_DIR"))?
//!     .config(serde_json::json!({ "word": "hi" }));
//! let started = plugin.start()?;
//! let result = started.call_tool("greet", serde_json::json!({ "name": "Ada" }))?;
//! assert!(!result.is_error, "{}", result.text);
//! assert_eq!(result.text, "hi, Ada");
//! # Ok(())
//! # }
//! ```
//!
//! A service the plugin injects is replaced by a stand-in (see
//! [`PluginUnderTest::stand_in`]): the one its interface crate ships behind the feature
//! `testing`, one line each —
//!
//! ```text
//! [dev-dependencies]
//! cordis-test = "0.1"
//! dsh-fs-api = { version = "0.1", features = ["testing"] }
//! dsh-sandbox = { version = "0.1", features = ["testing"] }
//! ```
//!
//! ```text
//! let fs = dsh_fs_api::testing::TempDirFs::new()?;
//! let started = PluginUnderTest::build(env!("CARGO_MANIFEST_DIR"))?
//!     .stand_in(dsh_fs_api::FS, fs.serve())
//!     .stand_in(dsh_sandbox::SANDBOX_POLICY, FixedPolicy::new(SandboxMode::WorkspaceWrite, fs.path()).serve())
//!     .cwd(fs.path())
//!     .start()?;
//! ```
//!
//! — or one of your own, `Client::serve(...)` of the seam crate's client over any type
//! implementing its trait. [`PluginUnderTest::start`] names every missing or mismatched
//! stand-in at once. A service the plugin provides is reached with [`Started::service`],
//! typed by the seam crate's client.
//!
//! The plugin runs exactly as under `cordis`: its library is checked for ABI compatibility
//! when loaded, its config is checked against its JSON Schema and its own deserializer,
//! every required injection must be satisfied by a stand-in or a host service of the same
//! interface and version, and it is applied and disposed by the host's registry. The
//! host's own `sessions` and `approval` services are present (approval requests are
//! answered "unavailable" unless [`PluginUnderTest::approve`] says otherwise).

#![deny(missing_docs)]

use std::fmt;
use std::marker::PhantomData;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use cordis_engine::{
    ApplyError, Entry, HostServices, Library, LoadError, Meta, Planned, Pos, Registry, ServiceSpec,
    UnknownTool,
};
use cordis_sdk::abi::ServiceBox;
use cordis_sdk::host::ApprovalOutcome;
use cordis_sdk::{CallContext, Interface, InterfaceMismatch, Service, SessionInfo};

pub use cordis_sdk::ToolResult;

/// Why a plugin could not be built, loaded, configured, started or called.
#[derive(Debug)]
pub enum HarnessError {
    /// `cargo build` of the plugin crate failed or produced no cdylib.
    Build {
        /// The crate directory.
        crate_dir: PathBuf,
        /// What went wrong (cargo's diagnostics when it ran).
        detail: String,
    },
    /// The library could not be loaded (not a plugin, ABI mismatch, ...).
    Load {
        /// The library file.
        path: PathBuf,
        /// The loader's reason.
        error: LoadError,
    },
    /// The config was refused by the plugin's schema or its deserializer.
    Config {
        /// The plugin.
        plugin: String,
        /// Every problem, one per line.
        problems: Vec<String>,
    },
    /// Required injections without a stand-in (or with one of another interface or
    /// version), every one of them.
    Injection {
        /// The plugin.
        plugin: String,
        /// What is missing or mismatched and how to supply it, one line each.
        problem: String,
    },
    /// The plugin's `apply` failed.
    Apply(ApplyError),
    /// A call named a tool the plugin did not register.
    UnknownTool(UnknownTool),
    /// A service is not registered, or implements another interface than asked for.
    Service {
        /// The service name.
        name: String,
        /// Why it cannot be used.
        problem: String,
    },
    /// The scratch state for sessions could not be set up.
    Io(std::io::Error),
}

impl fmt::Display for HarnessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HarnessError::Build { crate_dir, detail } => write!(
                f,
                "cannot build the plugin crate in {}: {detail}",
                crate_dir.display()
            ),
            HarnessError::Load { path, error } => {
                write!(f, "cannot load plugin library {}: {error}", path.display())
            }
            HarnessError::Config { plugin, problems } => write!(
                f,
                "plugin `{plugin}` refuses the config:\n  {}",
                problems.join("\n  ")
            ),
            HarnessError::Injection { plugin, problem } => {
                write!(f, "plugin `{plugin}`: {problem}")
            }
            HarnessError::Apply(e) => write!(f, "{e}"),
            HarnessError::UnknownTool(e) => write!(f, "{e}"),
            HarnessError::Service { name, problem } => write!(f, "service `{name}`: {problem}"),
            HarnessError::Io(e) => write!(f, "cannot set up the test state directory: {e}"),
        }
    }
}

impl std::error::Error for HarnessError {}

/// A plugin library loaded for a test, not yet applied: set its config and stand-ins,
/// then [`start`](PluginUnderTest::start) it.
pub struct PluginUnderTest {
    library: Arc<Library>,
    id: Option<String>,
    config: serde_json::Value,
    stand_ins: Vec<(ServiceSpec, ServiceBox)>,
    cwd: Option<PathBuf>,
    approval: Option<ApprovalOutcome>,
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

    /// Runs `cargo build --lib` for the crate in `crate_dir` (usually
    /// `env!("CARGO_MANIFEST_DIR")`) and loads the cdylib it produced. Cargo honours
    /// `CARGO_TARGET_DIR` and the crate's own settings, as for any build.
    pub fn build(crate_dir: impl AsRef<Path>) -> Result<Self, HarnessError> {
        let path = build_cdylib(crate_dir.as_ref())?;
        Self::load(path)
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
        let decl = service.interface();
        let spec = ServiceSpec {
            name: name.to_string(),
            interface: decl.interface.to_string(),
            version: decl.version,
        };
        self.stand_ins.retain(|(s, _)| s.name != name);
        self.stand_ins.push((spec, service));
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

    fn entry(&self) -> Entry {
        let name = self.library.meta.name.clone();
        Entry {
            id: self.id.clone().unwrap_or_else(|| name.clone()),
            plugin: name,
            path: Some(self.library.path.clone()),
            config: self.config.clone(),
            config_node: None,
            disabled: false,
            pos: Pos { line: 1, col: 1 },
        }
    }

    /// Checks the config and the injections, then applies the plugin through the host's
    /// registry. The returned [`Started`] disposes it when dropped.
    pub fn start(self) -> Result<Started, HarnessError> {
        self.check_config()?;
        let state = tempfile::Builder::new()
            .prefix("cordis-test-")
            .tempdir()
            .map_err(HarnessError::Io)?;
        let host = HostServices::new(&state.path().join("state"));
        match self.approval {
            Some(outcome) => host.approvals().answer_always(outcome),
            None => host.approvals().set_default(None),
        }
        let mut services = host.serve();
        services.retain(|(s, _)| !self.stand_ins.iter().any(|(t, _)| t.name == s.name));
        services.extend(self.stand_ins.iter().cloned());
        self.check_injections(&services)?;

        let cwd = match &self.cwd {
            Some(dir) => dir.clone(),
            None => {
                let dir = state.path().join("work");
                std::fs::create_dir_all(&dir).map_err(HarnessError::Io)?;
                dir
            }
        };
        let session = host
            .sessions()
            .create(&cwd)
            .map_err(|e| HarnessError::Io(std::io::Error::other(e.to_string())))?;

        let planned = Planned {
            entry: self.entry(),
            library: self.library.clone(),
        };
        let mut registry = Registry::with_host_services(services);
        registry
            .apply_entry(&planned)
            .map_err(HarnessError::Apply)?;
        Ok(Started {
            registry,
            session,
            calls: std::sync::atomic::AtomicU64::new(0),
            _state: state,
            _library: self.library,
        })
    }

    /// Every required injection without a fitting stand-in, all reported at once.
    fn check_injections(&self, services: &[(ServiceSpec, ServiceBox)]) -> Result<(), HarnessError> {
        let meta = &self.library.meta;
        let problems: Vec<String> = meta
            .injects
            .iter()
            .filter_map(|inj| match services.iter().find(|(s, _)| s.name == inj.name) {
                None if inj.optional => None,
                None => Some(format!(
                    "it requires service `{}` ({} v{}); supply one with `.stand_in(\"{}\", Client::serve(...))` using the seam crate's client, or the stand-in its interface crate ships behind the feature `testing`",
                    inj.name, inj.interface, inj.version, inj.name
                )),
                Some((s, _)) => InterfaceMismatch::check(
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
    let out = Command::new(cargo)
        .current_dir(crate_dir)
        .args(["build", "--lib", "--message-format=json-render-diagnostics"])
        .arg("--manifest-path")
        .arg(&manifest)
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
            .is_some_and(|k| k.iter().any(|k| k == "cdylib"));
        let ours = target_dir
            .zip(crate_dir.canonicalize().ok())
            .is_some_and(|(a, b)| a.canonicalize().ok() == Some(b));
        if !(is_cdylib && ours) {
            continue;
        }
        found = msg["filenames"].as_array().and_then(|files| {
            files
                .iter()
                .filter_map(|f| f.as_str())
                .find(|f| f.ends_with(suffix))
                .map(PathBuf::from)
        });
    }
    found.ok_or_else(|| {
        fail(
            "cargo built no cdylib for it; set `crate-type = [\"cdylib\"]` under `[lib]` in Cargo.toml"
                .to_string(),
        )
    })
}

/// An applied plugin. Dropping it disposes the plugin (its disposers run), then unloads
/// the library.
pub struct Started {
    // Field order is drop order: the registry (instances, services, tools whose code lives
    // in the library) goes before the library itself.
    registry: Registry,
    session: SessionInfo,
    calls: std::sync::atomic::AtomicU64,
    _state: tempfile::TempDir,
    _library: Arc<Library>,
}

impl fmt::Debug for Started {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Started")
            .field(
                "services",
                &self.registry.services.keys().collect::<Vec<_>>(),
            )
            .field("tools", &self.tools())
            .finish_non_exhaustive()
    }
}

impl Started {
    /// Calls tool `name` with JSON `args` in the test session, as `cordis call` would.
    /// A tool's own error is an error *result* (`is_error`), with its code and help in the
    /// text; only an unknown tool is an `Err`.
    pub fn call_tool(
        &self,
        name: &str,
        args: serde_json::Value,
    ) -> Result<ToolResult, HarnessError> {
        let n = self
            .calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let call = CallContext {
            session: self.session.clone(),
            call_id: format!("cordis-test-{n}"),
            cancel_fd: None,
            progress_fd: None,
        };
        self.registry
            .call_tool(name, &call, &args)
            .map_err(HarnessError::UnknownTool)
    }

    /// The names of the tools the plugin registered, sorted.
    pub fn tools(&self) -> Vec<String> {
        self.registry.tools.keys().cloned().collect()
    }

    /// The session tool calls run in.
    pub fn session(&self) -> &SessionInfo {
        &self.session
    }

    /// A typed client for service `name` (one the plugin provides, or a stand-in), e.g.
    /// `started.service::<GreeterClient>("greeter")`. The client borrows `self`, so it
    /// cannot outlive the library that serves it.
    pub fn service<I: Interface>(&self, name: &str) -> Result<ServiceRef<'_, I>, HarnessError> {
        let slot = self
            .registry
            .services
            .get(name)
            .ok_or_else(|| HarnessError::Service {
                name: name.to_string(),
                problem: format!(
                    "not registered; registered services: {}",
                    self.registry
                        .services
                        .keys()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            })?;
        let client = Service::checked::<I>(name, slot.handle.clone()).map_err(|e| {
            HarnessError::Service {
                name: name.to_string(),
                problem: e.message,
            }
        })?;
        Ok(ServiceRef {
            client,
            _started: PhantomData,
        })
    }

    /// The host registry the plugin was applied into (services, tools, absent optional
    /// injections).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }
}

/// A typed service client borrowed from a [`Started`] plugin; dereferences to the client.
pub struct ServiceRef<'a, I> {
    client: I,
    _started: PhantomData<&'a Started>,
}

impl<I> Deref for ServiceRef<'_, I> {
    type Target = I;

    fn deref(&self) -> &I {
        &self.client
    }
}
