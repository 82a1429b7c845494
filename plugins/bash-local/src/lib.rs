//! `dsh-bash-local`: the unconfined `shell` backend. It runs every command with the shared
//! runner and ignores the per-call policy; its capability fact is `sandbox_mode() = None`,
//! so tools offer no escalation parameters on top of it.

use cordis_sdk::prelude::*;
use dsh_sandbox::SandboxMode;
use dsh_shell_api::{ExecRequest, ExecResult, Shell, ShellClient, SHELL};

/// The config: this backend has nothing to configure.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Config {}

struct LocalShell;

impl Shell for LocalShell {
    fn exec(&self, request: ExecRequest) -> Result<ExecResult> {
        dsh_shell_core::run(&request, None).map_err(|e| e.into_sdk_error())
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
            .provides::<ShellClient>(SHELL)
    }

    fn apply(ctx: &mut Context<'_>, _config: Config) -> Result<Self> {
        ctx.provide(SHELL, ShellClient::serve(LocalShell))?;
        tracing::info!(entry = %ctx.entry_id(), "unconfined shell ready");
        Ok(BashLocalPlugin)
    }
}

cordis_sdk::export_plugin!(BashLocalPlugin);
