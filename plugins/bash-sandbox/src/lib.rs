//! `dsh-bash-sandbox`: the confined `shell` backend. Each command runs under the per-call
//! policy (or, without one, the deployment default from `sandboxPolicy`) with its file
//! writes confined by Landlock to exactly `dsh_sandbox::writable_roots(policy)` plus
//! `/dev/null`; `read-only` grants only `/dev/null`, `danger-full-access` runs unconfined.
//! If the kernel cannot fully enforce the ruleset the command is not run
//! (`SHELL_SANDBOX_UNAVAILABLE`). It has no sandbox config of its own.

use cordis_sdk::prelude::*;
use dsh_sandbox::{
    EnforcedFamily, ResolveArgs, SandboxMode, SandboxPolicy, SandboxPolicyClient, SANDBOX_POLICY,
};
use dsh_shell_api::{ExecRequest, ExecResult, Shell, ShellClient, SHELL};
use dsh_shell_core::{flag_denial, run, Confinement, RunError};

/// The config: empty on purpose, the policy comes from `sandboxPolicy`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Config {}

struct SandboxedShell {
    policy: SandboxPolicyClient,
}

impl Shell for SandboxedShell {
    fn exec(&self, mut request: ExecRequest) -> Result<ExecResult> {
        let policy = match request.policy.take() {
            Some(policy) => policy,
            None => self.policy.resolve(ResolveArgs::default())?,
        };
        let confinement =
            Confinement::prepare(&policy).map_err(|e| RunError::from(e).into_sdk_error())?;
        let mut result = run(&request, confinement).map_err(RunError::into_sdk_error)?;
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
            .description("runs shell commands with file writes confined by Landlock")
            .provides::<ShellClient>(SHELL)
            .injects::<SandboxPolicyClient>(SANDBOX_POLICY)
    }

    fn apply(ctx: &mut Context<'_>, _config: Config) -> Result<Self> {
        let policy: SandboxPolicyClient = ctx.inject(SANDBOX_POLICY)?;
        let token = policy.register_enforced_family(EnforcedFamily::Bash)?;
        let registry = policy.clone();
        ctx.on_dispose(move || {
            if let Err(e) = registry.unregister_enforced_family(token) {
                tracing::warn!("could not withdraw the bash enforced family: {e}");
            }
        });
        ctx.provide(SHELL, ShellClient::serve(SandboxedShell { policy }))?;
        tracing::info!(entry = %ctx.entry_id(), "confined shell ready");
        Ok(BashSandboxPlugin)
    }
}

cordis_sdk::export_plugin!(BashSandboxPlugin);
