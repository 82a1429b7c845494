//! `dsh-tool-bash`: the model-facing `bash` tool over the `shell` service. Every call
//! resolves the calling session's policy through `sandboxPolicy` and passes it with the
//! command, so `bash` and the file tools always agree on mode and root. A sandbox denial
//! becomes the shared denial marker (the raw output follows it); when the mounted backend
//! is confined, the tool accepts a one-call escalation that a person approves.

use std::path::Path;

use cordis_sdk::host::{ApprovalClient, APPROVAL};
use cordis_sdk::prelude::*;
use dsh_sandbox::{ResolveArgs, SandboxPolicy, SandboxPolicyClient, SANDBOX_POLICY};
use dsh_shell_api::{ExecRequest, ExecResult, Shell, ShellClient, DEFAULT_TIMEOUT_MS, SHELL};
use dsh_tool_core::args::BashArgs;
use dsh_tool_core::{
    backend_error, denial, register, resolve_path, CallArgs, CallPolicy, Described, Escalating,
    Step,
};

/// The config: none; the policy comes from `sandboxPolicy`.
#[derive(Deserialize, JsonSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct Config {}

/// The longest timeout a call may ask for (10 minutes).
const MAX_TIMEOUT_MS: u64 = 600_000;

const BASH: &str = "Runs a bash script and returns its stdout, stderr and exit status. The result is an error when the command exits non-zero, is killed, or times out. File writes are subject to the session's sandbox policy.";

struct BashTool {
    shell: ShellClient,
    calls: CallPolicy,
    escalating: Escalating,
}

impl BashTool {
    fn bash(&self, call: &CallContext, args: CallArgs<BashArgs>) -> Step<ToolResult> {
        let BashArgs {
            command,
            timeout_ms,
            workdir,
        } = args.args;
        if command.trim().is_empty() {
            return Err(ToolResult::error("`command` is empty: pass the script to run").into());
        }
        let timeout_ms = timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS);
        if !(1..=MAX_TIMEOUT_MS).contains(&timeout_ms) {
            return Err(ToolResult::error(format!(
                "`timeout_ms` must be between 1 and {MAX_TIMEOUT_MS}, got {timeout_ms}"
            ))
            .into());
        }
        let cwd = match workdir {
            None => call.session.cwd.clone(),
            Some(raw) => {
                let dir = resolve_path(&call.session.cwd, "workdir", &raw)?;
                inside_root(&dir, &call.session.cwd)?
            }
        };
        let policy = self
            .calls
            .for_call("bash", call, args.escalation.as_ref(), |_| Described {
                summary: format!("run a command in {}", cwd.display()),
                detail: command.clone(),
            })?;
        let mode = policy.mode;
        let mut result = self
            .shell
            .exec(ExecRequest {
                command,
                cwd,
                env: Vec::new(),
                timeout_ms: Some(timeout_ms),
                output_limit: None,
                policy: Some(policy),
                cancel_fd: call.cancel_fd,
                progress_fd: call.progress_fd,
            })
            .map_err(backend_error)?;
        let failed = result.exit_code != Some(0)
            || result.signal.is_some()
            || result.timed_out
            || result.cancelled;
        if result.sandbox_denied {
            let mode = result.mode.unwrap_or(mode);
            // The backend flags its stderr with the marker; the answer leads with it once.
            let marker = format!("{}\n", dsh_sandbox::denial_marker(mode));
            result.stderr = result.stderr.replacen(&marker, "", 1);
            let structured = structured(&result);
            return Ok(denial(mode, self.escalating, &render(&result, timeout_ms))
                .with_structured(structured));
        }
        let text = render(&result, timeout_ms);
        Ok(if failed {
            ToolResult::error(text)
        } else {
            ToolResult::ok(text)
        }
        .with_structured(structured(&result)))
    }
}

/// The result as structured content (see [`output_schema`]).
fn structured(result: &ExecResult) -> serde_json::Value {
    serde_json::json!({
        "exit_code": result.exit_code,
        "stdout": result.stdout,
        "stderr": result.stderr,
        "timed_out": result.timed_out,
    })
}

/// The schema of [`structured`].
fn output_schema() -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "properties": {
            "exit_code": {
                "type": ["integer", "null"],
                "description": "The command's exit status; null when it was killed by a signal"
            },
            "stdout": { "type": "string", "description": "What the command wrote to stdout" },
            "stderr": { "type": "string", "description": "What the command wrote to stderr" },
            "timed_out": {
                "type": "boolean",
                "description": "Whether the command was killed at its timeout"
            }
        },
        "required": ["exit_code", "stdout", "stderr", "timed_out"]
    })
}

/// `dir` canonicalized, when it is an existing directory beneath the session root.
fn inside_root(dir: &Path, root: &Path) -> Step<std::path::PathBuf> {
    let root = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
    let outside = || {
        ToolResult::error(format!(
            "`workdir` {} is outside the session directory {}; pass a directory inside it",
            dir.display(),
            root.display()
        ))
    };
    let canonical = dsh_sandbox::canonical_path(dir).map_err(|_| outside())?;
    if !dsh_sandbox::is_within(&canonical, &root) {
        return Err(outside().into());
    }
    if !canonical.is_dir() {
        return Err(ToolResult::error(format!(
            "`workdir` {} is not an existing directory",
            dir.display()
        ))
        .into());
    }
    Ok(canonical)
}

/// The output the model sees: stdout, stderr, then how the command ended.
fn render(result: &ExecResult, timeout_ms: u64) -> String {
    let mut parts: Vec<String> = Vec::new();
    if !result.stdout.is_empty() {
        parts.push(result.stdout.trim_end_matches('\n').to_string());
    }
    if !result.stderr.is_empty() {
        parts.push(format!(
            "[stderr]\n{}",
            result.stderr.trim_end_matches('\n')
        ));
    }
    let mut notes: Vec<String> = Vec::new();
    if result.timed_out {
        notes.push(format!(
            "[timed out after {timeout_ms} ms; the command and every process it started were killed]"
        ));
    }
    if result.cancelled {
        notes.push(
            "[the call was cancelled; the command and every process it started were killed]"
                .to_string(),
        );
    }
    match (result.exit_code, result.signal) {
        (Some(code), _) => notes.push(format!("[exit code {code}]")),
        (None, Some(signal)) => notes.push(format!("[killed by signal {signal}]")),
        (None, None) => {}
    }
    if let Some(limit) = &result.limit_reached {
        notes.push(format!(
            "[the command reached its {limit}; the operator sets it under `limits` in the dsh-sandbox-policy config]"
        ));
    }
    if result.truncated {
        notes.push("[output truncated at the capture limit]".to_string());
    }
    parts.push(notes.join("\n"));
    parts.join("\n")
}

/// The plugin.
pub struct ToolBashPlugin;

impl Plugin for ToolBashPlugin {
    type Config = Config;

    fn metadata() -> Metadata {
        Metadata::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION"))
            .description("the bash tool, under the session's sandbox policy")
            .injects::<ShellClient>(SHELL)
            .injects::<SandboxPolicyClient>(SANDBOX_POLICY)
            .injects_optional::<ApprovalClient>(APPROVAL)
            .tool("bash")
    }

    fn apply(ctx: &mut Context<'_>, _config: Config) -> Result<Self> {
        let shell: ShellClient = ctx.inject(SHELL)?;
        let calls = CallPolicy {
            policy: ctx.inject(SANDBOX_POLICY)?,
            approval: ctx.inject_optional(APPROVAL)?,
        };
        let escalating = Escalating::from_backend(shell.sandbox_mode(())?);
        // An unconfined shell always reaches the network; a confined one when the policy
        // lets it (all of it, or the hosts of its allowlist).
        let network = escalating == Escalating::NotOffered || {
            let policy = calls.policy.resolve(ResolveArgs {
                session: None,
                mode: None,
            })?;
            policy.network || policy.egress.is_some()
        };
        let options = ToolOptions::annotated(
            ToolAnnotations::titled("Run bash")
                .read_only(false)
                .destructive(true)
                .idempotent(false)
                .open_world(network),
        )
        .output_schema(output_schema());
        let tool = BashTool {
            shell,
            calls,
            escalating,
        };
        register(ctx, "bash", BASH, escalating, options, move |c, a| {
            tool.bash(c, a)
        })?;
        tracing::debug!(?escalating, "bash tool ready");
        Ok(ToolBashPlugin)
    }
}

cordis_sdk::export_plugin!(ToolBashPlugin);
