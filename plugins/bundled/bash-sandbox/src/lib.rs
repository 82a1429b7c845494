//! `dsh-bash-sandbox`: the confined `shell` backend. Each command runs under the per-call
//! policy (or, without one, the deployment default from `sandboxPolicy`) in its own user,
//! mount, pid, ipc and (network off) network namespaces: `/` read-only, only
//! `dsh_sandbox::writable_roots(policy)` writable (none in `read-only`), a minimal `/dev`,
//! no capabilities, Landlock and a seccomp filter on top (see `dsh_shell_core::confine`);
//! `danger-full-access` runs unconfined. If any of it cannot be set up the command is not
//! run (`SHELL_SANDBOX_UNAVAILABLE`, naming the step). Its config is the environment
//! policy; the sandbox policy comes from `sandboxPolicy`.

use cordis_sdk::host::ModelContextClient;
use cordis_sdk::host::{CallContextClient, CallContextService as _, CALL_CONTEXT};
use cordis_sdk::prelude::*;
use dsh_sandbox::{
    EnforcedFamily, SandboxMode, SandboxPolicy, SandboxPolicyClient, SANDBOX_POLICY,
};
use dsh_shell_api::{ExecRequest, ExecResult, Shell, ShellClient, SHELL};
use dsh_shell_core::env::{EnvironmentContext, ENVIRONMENT_CONTEXT};
use dsh_shell_core::{flag_denial, run, Confinement, EnvPolicy, RunError};

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
    env: EnvPolicy,
}

impl Shell for SandboxedShell {
    fn exec(&self, mut request: ExecRequest) -> Result<ExecResult> {
        let current = self.calls.current(())?;
        request.place_descriptors(current.as_ref());
        let policy =
            dsh_sandbox::policy_for_call(&self.policy, current.as_ref(), request.policy.take())?;
        let confinement =
            Confinement::prepare(&policy).map_err(|e| RunError::from(e).into_sdk_error())?;
        let mut result = run(&request, confinement, &self.env).map_err(RunError::into_sdk_error)?;
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
    }

    fn apply(ctx: &mut Context<'_>, config: Config) -> Result<Self> {
        let policy: SandboxPolicyClient = ctx.inject(SANDBOX_POLICY)?;
        let calls: CallContextClient = ctx.inject(CALL_CONTEXT)?;
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
            ShellClient::serve(SandboxedShell { policy, calls, env }),
        )?;
        tracing::info!(entry = %ctx.entry_id(), "confined shell ready");
        Ok(BashSandboxPlugin)
    }
}

cordis_sdk::export_plugin!(BashSandboxPlugin);
