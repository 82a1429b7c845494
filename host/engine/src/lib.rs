//! The cordis engine: everything a plugin host does, without a front-end. The `cordis`
//! binary, the plugin test harness (`cordis-test`), the end-to-end tests and the benchmarks
//! all drive the same [`Host`] and [`Runtime`].
//!
//! Flow: `cordis.yml` → `manifest` → `plan` (libraries loaded by `loader`, the whole
//! composition validated: [`Plan`]) → `registry` (entries applied in dependency order:
//! [`Registry`]) → [`Runtime`] (tool calls in a session, reloads as a `reload::Diff` and a
//! transaction). Every module is private; what a front-end may use is re-exported here.

mod approval;
pub mod codes;
mod diag;
mod host_services;
mod isolate;
mod loader;
mod manifest;
mod plan;
mod protect;
mod registry;
mod reload;
mod runtime;
mod schema;
mod scope;
mod sessions;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cordis_sdk::abi::ServiceBox;

pub use crate::approval::{
    escape_line as escape_approval_line, render as render_approval, ApprovalRouter, Asker,
};
pub use crate::diag::{
    code as diagnostic_code, hostile, Code, Diagnostic, Diagnostics, Pos, Severity, CODES,
};
pub use crate::host_services::HostServices;
pub use crate::isolate::{
    child_main as isolated_child_main, confinement_summary, Isolation, IsolationStatus,
    CHILD_ARG as ISOLATED_CHILD_ARG, DEFAULT_CALL_TIMEOUT,
    NO_NETWORK_ARG as ISOLATED_NO_NETWORK_ARG, NO_TRACING_ARG as ISOLATED_NO_TRACING_ARG,
    NO_WRITES_ARG as ISOLATED_NO_WRITES_ARG,
};
pub use crate::loader::{
    library_file_name, sdk_version, user_plugin_dir, Copies, Library, LoadError, Meta, SearchPath,
    ServiceSpec,
};
pub use crate::manifest::{
    closest, parse as parse_manifest, parse_duration, parse_yaml, plugin_name, Entry, Manifest,
    Node, Value as YamlValue,
};
pub use crate::plan::{Plan, Planned, Provider};
pub use crate::registry::{ApplyError, CallStamps, Registry, ServiceSlot, ToolSlot, UnknownTool};
pub use crate::runtime::{
    Composition, OpenSession, ReloadError, ReloadReport, Runtime, SessionStart, ToolInfo,
};
pub use crate::schema::{
    check as check_schemas, generate as generate_schemas, validate_config, write as write_schemas,
};
pub use crate::sessions::{
    default_state_dir, private_dir, Origin, Retention, SessionError, SessionHold, SessionStore,
    NO_STATE_DIR, RETENTION_GRACE,
};

use crate::diag::Diagnostics as Problems;
use crate::plan::PlanOptions;

/// Everything needed to plan and apply a composition.
pub struct Host {
    manifest: PathBuf,
    options: PlanOptions,
    services: HostServices,
    /// Services the host provides in place of its own or a plugin's (`cordis-test`).
    stand_ins: Vec<(ServiceSpec, ServiceBox)>,
    /// The `cordis` binary isolated entries run in (none: every entry in-process).
    isolation_exe: Option<PathBuf>,
}

impl Host {
    /// A host for `manifest`, searching `plugin_path` first, keeping state in `state_dir`
    /// (empty for a command that keeps none).
    pub fn new(manifest: &Path, plugin_path: &[PathBuf], state_dir: &Path, verbose: bool) -> Self {
        let services = HostServices::new(state_dir);
        Host {
            manifest: manifest.to_path_buf(),
            options: PlanOptions {
                search: SearchPath::new(plugin_path),
                verbose,
                host_services: HostServices::specs(),
                copies: None,
                protect: Some(services.protection().clone()),
            },
            services,
            stand_ins: Vec::new(),
            isolation_exe: None,
        }
    }

    /// Runs every entry marked `isolate: process` in a process of its own: `exe` (the
    /// `cordis` binary) re-executed. Without it every entry runs in-process.
    pub fn isolate_with(&mut self, exe: PathBuf) {
        self.isolation_exe = Some(exe);
    }

    /// Provides `service` as `spec.name` from the host itself, like `sessions` or
    /// `approval`: entries inject it as they would a host service, and it replaces a host
    /// service of the same name. A plugin test's stand-in for a service no entry of the
    /// composition provides.
    pub fn stand_in(&mut self, spec: ServiceSpec, service: ServiceBox) {
        self.options.host_services.retain(|s| s.name != spec.name);
        self.stand_ins.retain(|(s, _)| s.name != spec.name);
        self.options.host_services.push(spec.clone());
        self.stand_ins.push((spec, service));
    }

    /// The manifest.
    pub fn manifest(&self) -> &Path {
        &self.manifest
    }

    /// Where plugins are looked for.
    pub fn search(&self) -> &SearchPath {
        &self.options.search
    }

    /// Looks for plugins in `search` instead.
    pub fn set_search(&mut self, search: SearchPath) {
        self.options.search = search;
    }

    /// Loads every library from a private copy made in `copies` (`--dev`: the build may
    /// rewrite the file while it is loaded).
    pub fn copy_libraries(&mut self, copies: Copies) {
        self.options.copies = Some(Arc::new(copies));
    }

    /// The services the host provides to plugins (sessions, approvals, the paths that
    /// define the composition).
    pub fn services(&self) -> &HostServices {
        &self.services
    }

    /// The session store.
    pub fn sessions(&self) -> &Arc<SessionStore> {
        self.services.sessions()
    }

    /// Where approval requests go.
    pub fn approvals(&self) -> &Arc<ApprovalRouter> {
        self.services.approvals()
    }

    /// Validates the composition without applying it.
    pub fn plan(&self) -> Result<Plan, Problems> {
        plan::plan(&self.manifest, &self.options)
    }

    /// Plans and applies the composition.
    pub fn start(&self) -> anyhow::Result<(Plan, Registry)> {
        let plan = self.plan()?;
        let registry = self.apply(&plan)?;
        Ok((plan, registry))
    }

    /// Applies a plan made by [`Host::plan`] into a new registry holding the host's
    /// services (stand-ins included).
    pub fn apply(&self, plan: &Plan) -> Result<Registry, ApplyError> {
        let mut services = self.services.serve();
        services.retain(|(s, _)| !self.stand_ins.iter().any(|(t, _)| t.name == s.name));
        services.extend(self.stand_ins.iter().cloned());
        let mut registry = Registry::with_host_services(services);
        if let Some(exe) = &self.isolation_exe {
            registry.isolate_with(exe.clone());
        }
        registry.apply_plan(plan)?;
        Ok(registry)
    }
}
