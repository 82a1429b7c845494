//! `dsh-bash-sandbox`: the confined `shell` backend. Each command runs under the per-call
//! policy (or, without one, the deployment default from `sandboxPolicy`) in its own user,
//! mount, pid, ipc and (network off) network namespaces: `/` read-only, only
//! `dsh_sandbox::writable_roots(policy)` writable (none in `read-only`), a minimal `/dev`,
//! no capabilities, Landlock and a seccomp filter on top (see `dsh_shell_core::confine`);
//! `danger-full-access` runs unconfined. If any of it cannot be set up the command is not
//! run (`SHELL_SANDBOX_UNAVAILABLE`, naming the step). Its config is the environment
//! policy; the sandbox policy comes from `sandboxPolicy`.

use cordis_sdk::host::{
    Approval as _, ApprovalClient, ApprovalOutcome, ApprovalRequest, CallContextClient,
    CallContextService as _, CurrentCall, ModelContextClient, NewEvent, Sessions as _,
    SessionsClient, APPROVAL, CALL_CONTEXT, SESSIONS,
};
use cordis_sdk::prelude::*;
use dsh_sandbox::egress::{Connection, CONNECTIONS_EVENT};
use dsh_sandbox::{
    ApproveHostArgs, EnforcedFamily, SandboxMode, SandboxPolicy, SandboxPolicyClient,
    SANDBOX_POLICY,
};
use dsh_shell_api::{ExecRequest, ExecResult, Shell, ShellClient, SHELL};
use dsh_shell_core::env::{EnvironmentContext, ENVIRONMENT_CONTEXT};
use dsh_shell_core::{flag_denial, run_with, Confinement, EnvPolicy, Network, RunError};

/// The config: the environment commands get; the sandbox policy comes from
/// `sandboxPolicy`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The environment policy (`inherit`, `ignoreDefaultExcludes`, `exclude`,
    /// `includeOnly`, `set`); by default the host's environment without secrets.
    #[serde(default)]
    pub environment: EnvPolicy,
}

struct SandboxedShell {
    policy: SandboxPolicyClient,
    calls: CallContextClient,
    approval: Option<ApprovalClient>,
    sessions: Option<SessionsClient>,
    env: EnvPolicy,
}

/// The network allowlist's side of one command: a person asked for an unlisted host
/// (`ask`), the proxy's decisions kept in the session log.
struct CallNetwork<'a> {
    shell: &'a SandboxedShell,
    current: Option<&'a CurrentCall>,
    command: &'a str,
}

impl Network for CallNetwork<'_> {
    fn approve(&mut self, host: &str, port: u16) -> bool {
        let (Some(approval), Some(call)) = (&self.shell.approval, self.current) else {
            return false;
        };
        let (Some(session), Some(call_id)) = (&call.session, &call.call_id) else {
            return false;
        };
        let args = ApproveHostArgs {
            session: None,
            host: host.to_string(),
            port,
        };
        let outcome = approval.request(ApprovalRequest {
            session: session.clone(),
            call_id: call_id.clone(),
            tool: "bash".to_string(),
            summary: format!(
                "let sandboxed commands reach {host}:{port} for the rest of the session"
            ),
            detail: self.command.to_string(),
            justification: format!(
                "the command asked the network proxy for {host}:{port}, which the allowlist does not list"
            ),
            mode: Some(args.grant()),
        });
        match outcome {
            Ok(ApprovalOutcome::Approved) => match self.shell.policy.approve_host(args) {
                Ok(_) => true,
                Err(e) => {
                    tracing::warn!("could not record the approval of {host}:{port}: {e}");
                    false
                }
            },
            Ok(_) => false,
            Err(e) => {
                tracing::warn!("could not ask for {host}:{port}: {e}");
                false
            }
        }
    }

    fn record(&mut self, connections: Vec<Connection>) {
        let (Some(sessions), Some(session)) = (
            &self.shell.sessions,
            self.current.and_then(|c| c.session.clone()),
        ) else {
            return;
        };
        if connections.is_empty() {
            return;
        }
        let event = NewEvent {
            session,
            kind: CONNECTIONS_EVENT.to_string(),
            data: serde_json::json!({ "connections": connections }),
        };
        if let Err(e) = sessions.append(event) {
            tracing::warn!("could not record the command's network connections: {e}");
        }
    }
}

impl Shell for SandboxedShell {
    fn exec(&self, mut request: ExecRequest) -> Result<ExecResult> {
        let current = self.calls.current(())?;
        request.place_descriptors(current.as_ref());
        let policy =
            dsh_sandbox::policy_for_call(&self.policy, current.as_ref(), request.policy.take())?;
        let confinement =
            Confinement::prepare(&policy).map_err(|e| RunError::from(e).into_sdk_error())?;
        let mut network = CallNetwork {
            shell: self,
            current: current.as_ref(),
            command: &request.command,
        };
        let mut result = run_with(&request, confinement, &self.env, &mut network)
            .map_err(RunError::into_sdk_error)?;
        result.mode = Some(policy.mode);
        flag_denial(&mut result, policy.mode);
        Ok(result)
    }

    fn sandbox_mode(&self, _unit: ()) -> Result<Option<SandboxMode>> {
        self.policy.default_mode(()).map(Some)
    }
}

/// The plugin.
pub struct BashSandboxPlugin;

impl Plugin for BashSandboxPlugin {
    type Config = Config;

    fn metadata() -> Metadata {
        Metadata::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION"))
            .description("runs shell commands confined by namespaces, Landlock and seccomp")
            .needs(cordis_sdk::Need::Namespaces)
            .needs(cordis_sdk::Need::WriteFiles)
            .needs(cordis_sdk::Need::Network)
            .provides::<ShellClient>(SHELL)
            .provides::<ModelContextClient>(ENVIRONMENT_CONTEXT)
            .injects::<SandboxPolicyClient>(SANDBOX_POLICY)
            .injects::<CallContextClient>(CALL_CONTEXT)
            .injects_optional::<ApprovalClient>(APPROVAL)
            .injects_optional::<SessionsClient>(SESSIONS)
    }

    fn apply(ctx: &mut Context<'_>, config: Config) -> Result<Self> {
        let policy: SandboxPolicyClient = ctx.inject(SANDBOX_POLICY)?;
        let calls: CallContextClient = ctx.inject(CALL_CONTEXT)?;
        let approval: Option<ApprovalClient> = ctx.inject_optional(APPROVAL)?;
        let sessions: Option<SessionsClient> = ctx.inject_optional(SESSIONS)?;
        let token = policy.register_enforced_family(EnforcedFamily::Bash)?;
        let registry = policy.clone();
        ctx.on_dispose(move || {
            if let Err(e) = registry.unregister_enforced_family(token) {
                tracing::warn!("could not withdraw the bash enforced family: {e}");
            }
        });
        let env = config.environment;
        ctx.provide(
            ENVIRONMENT_CONTEXT,
            ModelContextClient::serve(EnvironmentContext(env.clone())),
        )?;
        ctx.provide(
            SHELL,
            ShellClient::serve(SandboxedShell {
                policy,
                calls,
                approval,
                sessions,
                env,
            }),
        )?;
        tracing::info!(entry = %ctx.entry_id(), "confined shell ready");
        Ok(BashSandboxPlugin)
    }
}

cordis_sdk::export_plugin!(BashSandboxPlugin);
