//! A stand-in `sandboxPolicy` for plugin tests (feature `testing`): [`FixedPolicy`].
//!
//! ```
//! use dsh_sandbox::testing::FixedPolicy;
//! use dsh_sandbox::{ResolveArgs, SandboxMode, SandboxPolicy};
//!
//! let policy = FixedPolicy::new(SandboxMode::ReadOnly, "/tmp");
//! // With cordis-test: `.stand_in(dsh_sandbox::SANDBOX_POLICY, policy.serve())`.
//! let resolved = policy.resolve(ResolveArgs { session: None, mode: None }).unwrap();
//! assert_eq!(resolved.mode, SandboxMode::ReadOnly);
//! ```

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use cordis_sdk::abi::ServiceBox;
use cordis_sdk::Result;

use crate::{
    policy_text, ApproveHostArgs, EnforcedFamily, ResolveArgs, SandboxExecutionPolicy, SandboxMode,
    SandboxPolicy, SandboxPolicyClient, SetModeArgs, Shared,
};

/// A `sandboxPolicy` that resolves every call to one fixed policy: its mode is the call's
/// approved mode when one is given, else the session's last `set_sandbox_mode`, else the
/// fixed mode (the real policy owner's precedence, without session logs). Families
/// register and unregister as with the real owner; `policy_text` is the real text for the
/// resolved policy once a family is registered.
#[derive(Clone)]
pub struct FixedPolicy {
    policy: SandboxExecutionPolicy,
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    session_modes: HashMap<String, SandboxMode>,
    families: Vec<(u64, EnforcedFamily)>,
    /// Hosts approved with `approve_host` (`host:port`), for every session.
    approved_hosts: Vec<String>,
    next: u64,
}

impl FixedPolicy {
    /// `mode` over the workspace root `root` (used as given: pass a canonical path).
    pub fn new(mode: SandboxMode, root: impl Into<PathBuf>) -> FixedPolicy {
        FixedPolicy::with_policy(SandboxExecutionPolicy {
            mode,
            workspace_root: root.into(),
            ..SandboxExecutionPolicy::default()
        })
    }

    /// Every field of the policy given (protected paths, `deny_read`, network, ...).
    pub fn with_policy(policy: SandboxExecutionPolicy) -> FixedPolicy {
        FixedPolicy {
            policy,
            state: Arc::default(),
        }
    }

    /// This stand-in as a service object, for `cordis-test`'s
    /// `stand_in(SANDBOX_POLICY, ...)`.
    pub fn serve(&self) -> ServiceBox {
        SandboxPolicyClient::serve(self.clone())
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl SandboxPolicy for FixedPolicy {
    fn resolve(&self, args: ResolveArgs) -> Result<Shared<SandboxExecutionPolicy>> {
        let standing = args
            .session
            .as_ref()
            .and_then(|s| self.state().session_modes.get(s).copied());
        let mut policy = self.policy.clone();
        policy.mode = args.mode.or(standing).unwrap_or(self.policy.mode);
        policy
            .approved_hosts
            .extend(self.state().approved_hosts.iter().cloned());
        Ok(Shared::new(policy))
    }

    fn default_mode(&self, _unit: ()) -> Result<SandboxMode> {
        Ok(self.policy.mode)
    }

    fn workspace_root(&self, _unit: ()) -> Result<PathBuf> {
        Ok(self.policy.workspace_root.clone())
    }

    fn set_sandbox_mode(&self, args: SetModeArgs) -> Result<u64> {
        let mut state = self.state();
        state.session_modes.insert(args.session, args.mode);
        state.next += 1;
        Ok(state.next)
    }

    fn approve_host(&self, args: ApproveHostArgs) -> Result<u64> {
        let host = crate::egress::Host::parse(&args.host).map_or(args.host, |h| h.to_string());
        let mut state = self.state();
        state.approved_hosts.push(format!("{host}:{}", args.port));
        state.next += 1;
        Ok(state.next)
    }

    fn register_enforced_family(&self, family: EnforcedFamily) -> Result<u64> {
        let mut state = self.state();
        state.next += 1;
        let token = state.next;
        state.families.push((token, family));
        Ok(token)
    }

    fn unregister_enforced_family(&self, token: u64) -> Result<()> {
        self.state().families.retain(|(t, _)| *t != token);
        Ok(())
    }

    fn enforced_families(&self, _unit: ()) -> Result<Vec<EnforcedFamily>> {
        let mut families: Vec<EnforcedFamily> =
            self.state().families.iter().map(|(_, f)| *f).collect();
        families.sort();
        families.dedup();
        Ok(families)
    }

    fn policy_text(&self, session: Option<String>) -> Result<String> {
        if self.state().families.is_empty() {
            return Ok(String::new());
        }
        let resolved = self.resolve(ResolveArgs {
            session,
            mode: None,
        })?;
        Ok(policy_text(&resolved))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn approved_mode_beats_the_session_switch_which_beats_the_fixed_mode() {
        let p = FixedPolicy::new(SandboxMode::WorkspaceWrite, "/w");
        let resolve = |session: Option<&str>, mode| {
            p.resolve(ResolveArgs {
                session: session.map(str::to_string),
                mode,
            })
            .unwrap()
            .mode
        };
        assert_eq!(resolve(Some("s"), None), SandboxMode::WorkspaceWrite);
        p.set_sandbox_mode(SetModeArgs {
            session: "s".into(),
            mode: SandboxMode::ReadOnly,
        })
        .unwrap();
        assert_eq!(resolve(Some("s"), None), SandboxMode::ReadOnly);
        assert_eq!(resolve(Some("t"), None), SandboxMode::WorkspaceWrite);
        assert_eq!(
            resolve(Some("s"), Some(SandboxMode::DangerFullAccess)),
            SandboxMode::DangerFullAccess
        );
        assert_eq!(p.policy_text(None).unwrap(), "");
        let token = p.register_enforced_family(EnforcedFamily::Bash).unwrap();
        assert!(!p.policy_text(None).unwrap().is_empty());
        p.unregister_enforced_family(token).unwrap();
        assert!(p.enforced_families(()).unwrap().is_empty());
    }
}
