//! The cordis engine: everything a plugin host does, without a front-end. The `cordis`
//! binary, the plugin test harness (`cordis-test`), the end-to-end tests and the benchmarks
//! all drive the same [`Host`].
//!
//! Flow: `cordis.yml` → [`manifest`] → [`plan`] (libraries loaded by [`loader`], whole
//! composition validated) → [`registry`] (entries applied in dependency order) → front-ends
//! call tools in a session from [`sessions`].

pub mod approval;
pub mod diag;
pub mod loader;
pub mod manifest;
pub mod plan;
pub mod protect;
pub mod registry;
mod reload;
pub mod runtime;
pub mod schema;
pub mod sessions;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cordis_sdk::host::{
    ApprovalClient, CompositionClient, SessionsClient, APPROVAL, COMPOSITION, SESSIONS,
};
use cordis_sdk::Interface;

use crate::approval::{ApprovalRouter, ApprovalService};
use crate::diag::Diagnostics;
use crate::loader::{SearchPath, ServiceSpec};
use crate::plan::{Plan, PlanOptions};
use crate::protect::{CompositionService, Protection};
use crate::registry::Registry;
use crate::sessions::{SessionStore, SessionsService};

/// Everything needed to plan and apply a composition.
pub struct Host {
    /// The manifest.
    pub manifest: PathBuf,
    /// Planning options (search path, verbosity, host services).
    pub options: PlanOptions,
    /// The session store.
    pub sessions: Arc<SessionStore>,
    /// Where approval requests go.
    pub approvals: Arc<ApprovalRouter>,
    /// The paths that define the composition (served as `composition`).
    pub protection: Arc<Protection>,
}

fn spec<I: Interface>(name: &str) -> ServiceSpec {
    ServiceSpec {
        name: name.to_string(),
        interface: I::ID.to_string(),
        version: I::VERSION,
    }
}

impl Host {
    /// A host for `manifest`, searching `plugin_path` first, keeping state in `state_dir`
    /// (empty for a command that keeps none).
    pub fn new(manifest: &Path, plugin_path: &[PathBuf], state_dir: &Path, verbose: bool) -> Self {
        let protection = Arc::new(Protection::new(state_dir));
        Host {
            manifest: manifest.to_path_buf(),
            options: PlanOptions {
                search: SearchPath::new(plugin_path),
                verbose,
                host_services: vec![
                    spec::<SessionsClient>(SESSIONS),
                    spec::<ApprovalClient>(APPROVAL),
                    spec::<CompositionClient>(COMPOSITION),
                    crate::registry::tool_extras_spec(),
                ],
                copies: None,
                protect: Some(protection.clone()),
            },
            sessions: Arc::new(SessionStore::new(state_dir)),
            approvals: Arc::new(ApprovalRouter::default()),
            protection,
        }
    }

    /// Validates the composition without applying it.
    pub fn plan(&self) -> Result<Plan, Diagnostics> {
        plan::plan(&self.manifest, &self.options)
    }

    /// Plans and applies the composition.
    pub fn start(&self) -> anyhow::Result<(Plan, Registry)> {
        let plan = self.plan()?;
        let mut registry = Registry::with_host_services(vec![
            (
                spec::<SessionsClient>(SESSIONS),
                SessionsClient::serve(SessionsService(self.sessions.clone())),
            ),
            (
                spec::<ApprovalClient>(APPROVAL),
                ApprovalClient::serve(ApprovalService(self.approvals.clone())),
            ),
            (
                spec::<CompositionClient>(COMPOSITION),
                CompositionClient::serve(CompositionService(self.protection.clone())),
            ),
        ]);
        registry.apply_plan(&plan)?;
        Ok((plan, registry))
    }
}
