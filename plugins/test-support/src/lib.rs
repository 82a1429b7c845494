//! Test support for plugin authors: load plugin libraries through the real `cordis` engine
//! (its loader, planner, registry and sessions; no front-end), with given configs and
//! stand-in services, then call their services and tools and assert on the results — no
//! server.
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
//! To test the whole chain — your tool, your provider, the real sandboxed `fs` under the
//! policy the real policy owner resolves — apply a [`Composition`]: several plugins (built
//! from a crate, loaded from a path, or [`PluginUnderTest::installed`] where your `cordis`
//! finds them, e.g. the bundled ones) and stand-ins for the rest, planned and applied as
//! `cordis` applies `cordis.yml`.
//!
//! The plugins run exactly as under `cordis`: each library is checked for ABI
//! compatibility when loaded, each config against its JSON Schema and its plugin's own
//! deserializer, every required injection must be satisfied by exactly one entry, stand-in
//! or host service of the same interface and version, tool arguments are checked against
//! the tool's input schema, and entries are applied and disposed by the host's registry.
//! The host's own `sessions`, `approval` and `composition` services are present (approval
//! requests are answered "unavailable" unless [`PluginUnderTest::approve`] or
//! [`Composition::approve`] says otherwise). Every entry runs in the test's process:
//! isolation (`isolate: process` in `cordis.yml`) belongs to the `cordis` binary, so a
//! plugin that aborts here ends the test, as it would end a host running it in-process.

#![deny(missing_docs)]

mod composition;
mod plugin;

use std::fmt;
use std::path::PathBuf;

use cordis_engine::{ApplyError, Diagnostics, LoadError, UnknownTool};

pub use crate::composition::{Composition, ServiceRef, Started};
pub use crate::plugin::PluginUnderTest;
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
    /// [`PluginUnderTest::installed`] found no library for the plugin.
    NotInstalled {
        /// The plugin.
        plugin: String,
        /// The `cordis` on `PATH` whose search path was used, if any.
        cordis: Option<PathBuf>,
        /// Every file tried, in order.
        tried: Vec<PathBuf>,
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
    /// The composition is not valid (a missing or duplicate provider, a cycle, a
    /// mismatched interface, a refused config, ...): every problem, as `cordis check`
    /// reports them against the composition's `cordis.yml` ([`Composition::manifest`]).
    Composition(Diagnostics),
    /// An entry's `apply` failed (everything applied before it was disposed).
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
            HarnessError::NotInstalled {
                plugin,
                cordis,
                tried,
            } => {
                let tried: Vec<String> = tried.iter().map(|p| p.display().to_string()).collect();
                write!(
                    f,
                    "plugin `{plugin}` is not installed where {} finds plugins; tried: {}; install it with `cordis plugin install`, point CORDIS_PLUGIN_PATH at its directory, or load it by path with `PluginUnderTest::load`",
                    match cordis {
                        Some(c) => format!("the `cordis` on PATH ({})", c.display()),
                        None => "cordis (none on PATH)".to_string(),
                    },
                    if tried.is_empty() { "nothing".to_string() } else { tried.join(", ") }
                )
            }
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
            HarnessError::Composition(problems) => {
                write!(
                    f,
                    "the test's composition is refused:\n{problems}\nhelp: in a test, each entry is a `.plugin(...)` of the composition (in the order added) and the host's services include every `.stand_in(...)`: supply a missing service with either, and drop a stand-in an entry provides"
                )
            }
            HarnessError::Apply(e) => write!(f, "{e}"),
            HarnessError::UnknownTool(e) => write!(f, "{e}"),
            HarnessError::Service { name, problem } => write!(f, "service `{name}`: {problem}"),
            HarnessError::Io(e) => write!(f, "cannot set up the test state directory: {e}"),
        }
    }
}

impl std::error::Error for HarnessError {}
