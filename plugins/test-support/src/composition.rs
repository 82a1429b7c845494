//! A small composition applied through the host's engine, as `cordis` applies
//! `cordis.yml`: several plugins, the services stood in for, one session to call tools in.

use std::fmt;
use std::marker::PhantomData;
use std::ops::Deref;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cordis_engine::{Host, OpenSession, Registry, Runtime, SearchPath, ServiceSpec, SessionStart};
use cordis_sdk::abi::ServiceBox;
use cordis_sdk::host::ApprovalOutcome;
use cordis_sdk::{CallContext, Interface, Service, SessionInfo, ToolResult};

use crate::{HarnessError, PluginUnderTest};

/// Several plugins composed like the entries of a `cordis.yml`: each one's config checked,
/// every injection satisfied by exactly one provider (an entry, a stand-in or the host) of
/// the same interface and version, no cycle, applied providers first. Tool calls run in a
/// session whose policy is whatever the composition's policy owner says — the real
/// `dsh-sandbox-policy`, when the test composes it.
///
/// ```no_run
/// use cordis_test::{Composition, PluginUnderTest};
/// use serde_json::json;
///
/// # fn main() -> Result<(), cordis_test::HarnessError> {
/// let here = env!("CARGO_MANIFEST_DIR");
/// let workspace = tempfile::tempdir().unwrap();
/// let started = Composition::new()
///     // this crate's plugin, a tool that stores notes through `fs`
///     .plugin(PluginUnderTest::build(here)?)
///     // the bundled plugins, where the `cordis` on PATH finds them
///     .plugin(PluginUnderTest::installed("dsh-fs-sandbox")?)
///     .plugin(
///         PluginUnderTest::installed("dsh-sandbox-policy")?
///             .config(json!({ "mode": "read-only" })),
///     )
///     .cwd(workspace.path())
///     .start()?;
/// let refused = started.call_tool("note", json!({ "text": "hi" }))?;
/// assert!(refused.is_error && refused.text.contains("SANDBOX"), "{}", refused.text);
/// # Ok(())
/// # }
/// ```
#[derive(Default)]
pub struct Composition {
    plugins: Vec<PluginUnderTest>,
    stand_ins: Vec<(ServiceSpec, ServiceBox)>,
    cwd: Option<PathBuf>,
    approval: Option<ApprovalOutcome>,
}

impl fmt::Debug for Composition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Composition")
            .field("plugins", &self.plugins)
            .field(
                "stand_ins",
                &self
                    .stand_ins
                    .iter()
                    .map(|(s, _)| &s.name)
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// Adds `service` as `name` to `stand_ins`, replacing one of the same name.
pub(crate) fn put_stand_in(
    stand_ins: &mut Vec<(ServiceSpec, ServiceBox)>,
    name: &str,
    service: ServiceBox,
) {
    let decl = service.interface();
    let spec = ServiceSpec {
        name: name.to_string(),
        interface: decl.interface.to_string(),
        version: decl.version,
    };
    stand_ins.retain(|(s, _)| s.name != name);
    stand_ins.push((spec, service));
}

impl Composition {
    /// An empty composition.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `plugin` as an entry (its config and id as set on it). Its stand-ins, working
    /// directory and approval answer, if it has any, become the composition's.
    pub fn plugin(mut self, mut plugin: PluginUnderTest) -> Self {
        for (spec, service) in std::mem::take(&mut plugin.stand_ins) {
            put_stand_in(&mut self.stand_ins, &spec.name, service);
        }
        self.cwd = plugin.cwd.take().or(self.cwd);
        self.approval = plugin.approval.take().or(self.approval);
        self.plugins.push(plugin);
        self
    }

    /// Supplies service `name` from the host, for every entry that injects it: a provider
    /// wrapped by the seam crate's client (`Client::serve(...)`) or the stand-in an
    /// interface crate ships behind its feature `testing`. It replaces a host service of
    /// the same name; an entry providing the same name is a duplicate provider.
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

    /// Answers every approval request with `outcome` (default: "unavailable", as for a
    /// client that cannot ask).
    pub fn approve(mut self, outcome: ApprovalOutcome) -> Self {
        self.approval = Some(outcome);
        self
    }

    /// The `cordis.yml` this composition is: one entry per plugin, in the order added,
    /// each loaded from its library's path.
    pub fn manifest(&self) -> String {
        let quote = |v: &serde_json::Value| v.to_string();
        let mut yaml = String::new();
        for plugin in &self.plugins {
            let entry = plugin.entry();
            yaml.push_str(&format!("- name: {}\n", quote(&entry.plugin.into())));
            if entry.id != plugin.meta().name {
                yaml.push_str(&format!("  id: {}\n", quote(&entry.id.into())));
            }
            let path = plugin.path().to_string_lossy().into_owned();
            yaml.push_str(&format!("  path: {}\n", quote(&path.into())));
            yaml.push_str(&format!("  config: {}\n", quote(&entry.config)));
        }
        if yaml.is_empty() {
            yaml.push_str("[]\n");
        }
        yaml
    }

    /// Plans the composition as `cordis check` would (every problem at once, as
    /// [`HarnessError::Composition`]) and applies it. The returned [`Started`] disposes
    /// every entry, last applied first, when dropped.
    pub fn start(self) -> Result<Started, HarnessError> {
        let state = tempfile::Builder::new()
            .prefix("cordis-test-")
            .tempdir()
            .map_err(HarnessError::Io)?;
        let manifest = state.path().join("cordis.yml");
        std::fs::write(&manifest, self.manifest()).map_err(HarnessError::Io)?;
        let mut host = Host::new(&manifest, &[], &state.path().join("state"), false);
        // Every entry names its library's path; nothing installed takes part.
        host.set_search(SearchPath::default());
        for (spec, service) in self.stand_ins {
            host.stand_in(spec, service);
        }
        match self.approval {
            Some(outcome) => host.approvals().answer_always(outcome),
            None => host.approvals().set_default(None),
        }
        let plan = host.plan().map_err(HarnessError::Composition)?;
        let runtime = Runtime::apply(host, plan).map_err(HarnessError::Apply)?;
        let cwd = match self.cwd {
            Some(dir) => dir,
            None => {
                let dir = state.path().join("work");
                std::fs::create_dir_all(&dir).map_err(HarnessError::Io)?;
                dir
            }
        };
        let session = runtime
            .open_session(SessionStart::New(&cwd), None)
            .map_err(|e| HarnessError::Io(std::io::Error::other(e.to_string())));
        let session = match session {
            Ok(session) => session,
            Err(e) => {
                runtime.shutdown();
                return Err(e);
            }
        };
        Ok(Started {
            session,
            runtime,
            calls: AtomicU64::new(0),
            _state: state,
        })
    }
}

/// An applied composition (of one plugin or several). Dropping it disposes every entry,
/// last applied first, then unloads the libraries.
pub struct Started {
    // Field order is drop order: the session, then the runtime (its registry holds the
    // instances whose code lives in the libraries, which it holds too), then the state.
    session: OpenSession,
    runtime: Arc<Runtime>,
    calls: AtomicU64,
    _state: tempfile::TempDir,
}

impl fmt::Debug for Started {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let services: Vec<String> = self.inspect(|r| r.services.keys().cloned().collect());
        f.debug_struct("Started")
            .field("services", &services)
            .field("tools", &self.tools())
            .finish_non_exhaustive()
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        self.runtime.shutdown();
    }
}

impl Started {
    /// Calls tool `name` with JSON `args` in the test session, as `cordis call` would
    /// (the arguments checked against the tool's input schema first). A tool's own error
    /// is an error *result* (`is_error`), with its code and help in the text; only an
    /// unknown tool is an `Err`.
    pub fn call_tool(
        &self,
        name: &str,
        args: serde_json::Value,
    ) -> Result<ToolResult, HarnessError> {
        let n = self.calls.fetch_add(1, Ordering::Relaxed);
        let call = CallContext {
            session: self.session.info().clone(),
            call_id: format!("cordis-test-{n}"),
            cancel_fd: None,
            progress_fd: None,
        };
        self.runtime
            .call_tool(name, &call, &args)
            .map_err(HarnessError::UnknownTool)
    }

    /// The names of the tools registered, sorted.
    pub fn tools(&self) -> Vec<String> {
        self.runtime.tools().into_iter().map(|t| t.name).collect()
    }

    /// The session tool calls run in.
    pub fn session(&self) -> &SessionInfo {
        self.session.info()
    }

    /// A typed client for service `name` (one an entry provides, or a stand-in), e.g.
    /// `started.service::<GreeterClient>("greeter")`. The client borrows `self`, so it
    /// cannot outlive the library that serves it.
    pub fn service<I: Interface>(&self, name: &str) -> Result<ServiceRef<'_, I>, HarnessError> {
        let handle = self.inspect(|registry| match registry.services.get(name) {
            Some(slot) => Ok(slot.handle.clone()),
            None => Err(HarnessError::Service {
                name: name.to_string(),
                problem: format!(
                    "not registered; registered services: {}",
                    registry
                        .services
                        .keys()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }),
        })?;
        let client = Service::checked::<I>(name, handle).map_err(|e| HarnessError::Service {
            name: name.to_string(),
            problem: e.message,
        })?;
        Ok(ServiceRef {
            client,
            _started: PhantomData,
        })
    }

    /// Runs `f` with the host registry the composition was applied into (services, tools,
    /// absent optional injections).
    pub fn inspect<R>(&self, f: impl FnOnce(&Registry) -> R) -> R {
        self.runtime.inspect(|c| f(c.registry()))
    }
}

/// A typed service client borrowed from a [`Started`] composition; dereferences to the
/// client.
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
