//! `dsh-bash-local`: the unconfined `shell` backend. It runs every command with the shared
//! runner (the environment policy applies, and nothing a command starts outlives it) and
//! ignores the per-call policy; its capability fact is `sandbox_mode() = None`, so tools
//! offer no escalation parameters on top of it. Unconfined means the network too: its
//! commands reach every host the host reaches, whatever `network` the policy owner
//! configures (it says so in the log when the policy has an allowlist).

use cordis_sdk::host::{
    CallContextClient, CallContextService as _, ModelContextClient, CALL_CONTEXT,
};
use cordis_sdk::prelude::*;
use dsh_sandbox::{
    ResolveArgs, SandboxMode, SandboxPolicy as _, SandboxPolicyClient, SANDBOX_POLICY,
};
use dsh_shell_api::{ExecRequest, ExecResult, Shell, ShellClient, SHELL};
use dsh_shell_core::env::{EnvironmentContext, ENVIRONMENT_CONTEXT};
use dsh_shell_core::EnvPolicy;

/// The config: the environment commands get.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The environment policy (`inherit`, `ignoreDefaultExcludes`, `exclude`,
    /// `includeOnly`, `set`); by default the host's environment without secrets.
    #[serde(default)]
    pub environment: EnvPolicy,
}

struct LocalShell {
    env: EnvPolicy,
    /// The call being served (its descriptors, when the call crossed processes).
    calls: Option<CallContextClient>,
}

impl Shell for LocalShell {
    fn exec(&self, mut request: ExecRequest) -> Result<ExecResult> {
        if let Some(calls) = &self.calls {
            request.place_descriptors(calls.current(())?.as_ref());
        }
        dsh_shell_core::run(&request, None, &self.env).map_err(|e| e.into_sdk_error())
    }

    fn sandbox_mode(&self, _unit: ()) -> Result<Option<SandboxMode>> {
        Ok(None)
    }
}

/// The plugin.
pub struct BashLocalPlugin;

impl Plugin for BashLocalPlugin {
    type Config = Config;

    fn metadata() -> Metadata {
        Metadata::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION"))
            .description("runs shell commands unconfined")
            .needs(cordis_sdk::Need::Namespaces)
            .needs(cordis_sdk::Need::WriteFiles)
            .needs(cordis_sdk::Need::Network)
            .provides::<ShellClient>(SHELL)
            .provides::<ModelContextClient>(ENVIRONMENT_CONTEXT)
            .injects_optional::<CallContextClient>(CALL_CONTEXT)
            .injects_optional::<SandboxPolicyClient>(SANDBOX_POLICY)
    }

    fn apply(ctx: &mut Context<'_>, config: Config) -> Result<Self> {
        let env = config.environment;
        ctx.provide(
            ENVIRONMENT_CONTEXT,
            ModelContextClient::serve(EnvironmentContext(env.clone())),
        )?;
        let calls = ctx.inject_optional(CALL_CONTEXT)?;
        let policy: Option<SandboxPolicyClient> = ctx.inject_optional(SANDBOX_POLICY)?;
        let allowlist = policy
            .and_then(|p| p.resolve(ResolveArgs::default()).ok())
            .is_some_and(|p| p.egress.is_some());
        if allowlist {
            tracing::warn!(
                entry = %ctx.entry_id(),
                "the policy's network allowlist is not enforced: dsh-bash-local runs commands unconfined, and they reach every host; compose dsh-bash-sandbox to enforce it"
            );
        }
        ctx.provide(SHELL, ShellClient::serve(LocalShell { env, calls }))?;
        tracing::info!(entry = %ctx.entry_id(), "unconfined shell ready");
        Ok(BashLocalPlugin)
    }
}

cordis_sdk::export_plugin!(BashLocalPlugin);
