//! The services the host itself provides to plugins, in one table: what plans check
//! injections against and what registries serve, for the `cordis` host and for
//! `cordis-test` alike. A new host service is one row of [`TABLE`].

use std::path::Path;
use std::sync::Arc;

use cordis_sdk::abi::ServiceBox;
use cordis_sdk::host::{
    ApprovalClient, CallContextClient, CompositionClient, SessionsClient, ToolExtrasClient,
    APPROVAL, CALL_CONTEXT, COMPOSITION, SESSIONS, TOOL_EXTRAS,
};

use crate::approval::{ApprovalRouter, ApprovalService};
use crate::loader::ServiceSpec;
use crate::protect::{CompositionService, Protection};
use crate::sessions::{SessionStore, SessionsService};

/// The state behind the host's services.
pub struct HostServices {
    sessions: Arc<SessionStore>,
    approvals: Arc<ApprovalRouter>,
    protection: Arc<Protection>,
}

/// One host service: its spec and how it is served from the host's state.
struct Row {
    spec: fn() -> ServiceSpec,
    serve: fn(&HostServices) -> ServiceBox,
}

/// Every host service but `toolExtras`, which each registry keeps itself (what its tools
/// tell their clients).
const TABLE: &[Row] = &[
    Row {
        spec: || ServiceSpec::of::<SessionsClient>(SESSIONS),
        serve: |h| SessionsClient::serve(SessionsService(h.sessions.clone())),
    },
    Row {
        spec: || ServiceSpec::of::<ApprovalClient>(APPROVAL),
        serve: |h| ApprovalClient::serve(ApprovalService(h.approvals.clone())),
    },
    Row {
        spec: || ServiceSpec::of::<CompositionClient>(COMPOSITION),
        serve: |h| CompositionClient::serve(CompositionService(h.protection.clone())),
    },
    Row {
        spec: || ServiceSpec::of::<CallContextClient>(CALL_CONTEXT),
        serve: |_| CallContextClient::serve(crate::scope::CallContextAnswer),
    },
];

impl HostServices {
    /// Host services keeping their state in `state_dir`.
    pub fn new(state_dir: &Path) -> Self {
        HostServices {
            sessions: Arc::new(SessionStore::new(state_dir)),
            approvals: Arc::new(ApprovalRouter::default()),
            protection: Arc::new(Protection::new(state_dir)),
        }
    }

    /// What each host service is, `toolExtras` included (for planning).
    pub fn specs() -> Vec<ServiceSpec> {
        TABLE
            .iter()
            .map(|row| (row.spec)())
            .chain([ServiceSpec::of::<ToolExtrasClient>(TOOL_EXTRAS)])
            .collect()
    }

    /// Each host service with its handle, for a registry (which adds `toolExtras`).
    pub fn serve(&self) -> Vec<(ServiceSpec, ServiceBox)> {
        TABLE
            .iter()
            .map(|row| ((row.spec)(), (row.serve)(self)))
            .collect()
    }

    /// The session store.
    pub fn sessions(&self) -> &Arc<SessionStore> {
        &self.sessions
    }

    /// Where approval requests go.
    pub fn approvals(&self) -> &Arc<ApprovalRouter> {
        &self.approvals
    }

    /// The paths that define the composition (served as `composition`).
    pub fn protection(&self) -> &Arc<Protection> {
        &self.protection
    }

    /// Protects `paths` too: no session may change them (a `--dev` project's sources).
    pub fn protect(&self, paths: impl IntoIterator<Item = std::path::PathBuf>) {
        self.protection.add(paths);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_host_service_is_planned_and_served_under_one_name() {
        let dir = tempfile::tempdir().unwrap();
        let services = HostServices::new(dir.path());
        let served: Vec<String> = services.serve().into_iter().map(|(s, _)| s.name).collect();
        let mut planned: Vec<String> = HostServices::specs().into_iter().map(|s| s.name).collect();
        assert_eq!(
            planned.pop().as_deref(),
            Some(cordis_sdk::host::TOOL_EXTRAS)
        );
        assert_eq!(served, planned);
        assert_eq!(served, [SESSIONS, APPROVAL, COMPOSITION, CALL_CONTEXT]);
    }
}
