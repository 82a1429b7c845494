//! The `shell` seam: the interface every shell backend (`dsh-bash-local`,
//! `dsh-bash-sandbox`) provides and every consumer (`dsh-tool-bash`) injects.
//!
//! # Using it from a plugin
//!
//! Declare `.injects::<ShellClient>(SHELL)` in `metadata()`, take the client with
//! `ctx.inject(SHELL)?`, and call [`Shell::exec`]. The rules a consumer follows:
//!
//! - **Resolve the calling session's policy on every call** (`sandboxPolicy`'s `resolve`)
//!   and pass it as [`ExecRequest::policy`]; `None` means the backend's deployment default.
//! - **Run in the session's directory**: [`ExecRequest::cwd`] is absolute, normally
//!   `CallContext::session.cwd`.
//! - **Pass the call's cancel descriptor** (`CallContext::cancel_fd`) as
//!   [`ExecRequest::cancel_fd`], so a cancelled call kills the command and everything it
//!   started instead of waiting for it.
//! - **Errors**: [`codes::SHELL_SANDBOX_UNAVAILABLE`] means the command did *not* run (the
//!   kernel cannot confine it here); [`codes::SHELL_SPAWN`] that it could not start. A
//!   command that ran and failed is a normal [`ExecResult`] (its exit code, signal,
//!   `timed_out`, `sandbox_denied`).
//!
//! ```no_run
//! use cordis_sdk::CallContext;
//! use dsh_sandbox::{ResolveArgs, SandboxPolicy, SandboxPolicyClient};
//! use dsh_shell_api::{ExecRequest, Shell, ShellClient};
//!
//! /// Runs `command` in the calling session's directory, under its policy.
//! fn run(
//!     shell: &ShellClient,
//!     policy: &SandboxPolicyClient,
//!     call: &CallContext,
//!     command: &str,
//! ) -> cordis_sdk::Result<String> {
//!     let resolved = policy.resolve(ResolveArgs {
//!         session: Some(call.session.id.clone()),
//!         mode: None,
//!     })?;
//!     let result = shell.exec(ExecRequest {
//!         command: command.to_string(),
//!         cwd: call.session.cwd.clone(),
//!         env: Vec::new(),
//!         timeout_ms: None,
//!         output_limit: None,
//!         policy: Some(resolved),
//!         cancel_fd: call.cancel_fd,
//!         progress_fd: call.progress_fd,
//!     })?;
//!     Ok(result.stdout)
//! }
//! ```
//!
//! For tests, the feature `testing` adds [`testing::ScriptedShell`](crate::testing), a
//! `shell` that records requests and answers from a script.

use std::path::PathBuf;

/// Stand-ins for plugin tests (feature `testing`).
#[cfg(any(test, feature = "testing"))]
pub mod testing;

use dsh_sandbox::{SandboxExecutionPolicy, SandboxMode, Shared};
use serde::{Deserialize, Serialize};

/// The registry name of the shell service.
pub const SHELL: &str = "shell";

/// Error codes of the `shell` interface.
pub mod codes {
    cordis_sdk::error_codes! {
        /// The kernel sandbox cannot be enforced here; the command was NOT run.
        SHELL_SANDBOX_UNAVAILABLE;
        /// The command could not be started.
        SHELL_SPAWN;
    }
}

/// Default timeout when a request names none.
pub const DEFAULT_TIMEOUT_MS: u64 = 120_000;
/// Default cap on captured stdout + stderr bytes (each).
pub const DEFAULT_OUTPUT_LIMIT: u64 = 1024 * 1024;

/// One command to run with `bash -c`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecRequest {
    /// The script.
    pub command: String,
    /// Absolute working directory.
    pub cwd: PathBuf,
    /// Extra environment variables.
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// Kill the whole process group after this long.
    pub timeout_ms: Option<u64>,
    /// Cap on captured bytes of stdout and of stderr.
    pub output_limit: Option<u64>,
    /// The per-call policy; `None` means the backend's deployment default.
    pub policy: Option<Shared<SandboxExecutionPolicy>>,
    /// The calling tool call's cancel descriptor (`CallContext::cancel_fd`, same process):
    /// when it becomes readable or reaches end of file, the command and every process it
    /// started are killed.
    #[serde(default)]
    pub cancel_fd: Option<i32>,
    /// The calling tool call's progress descriptor (`CallContext::progress_fd`, same
    /// process): the backend reports the output captured so far to it while the command
    /// runs ([`cordis_sdk::report_progress`]). Absent from older callers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_fd: Option<i32>,
}

impl ExecRequest {
    /// Takes the call's descriptors from the call as the host set it when the call came
    /// from another process (`crossed`: the numbers in the request are that process's, not
    /// this one's); a caller in this process keeps its own.
    pub fn place_descriptors(&mut self, current: Option<&cordis_sdk::host::CurrentCall>) {
        if let Some(call) = current.filter(|c| c.crossed) {
            self.cancel_fd = call.cancel_fd;
            self.progress_fd = call.progress_fd;
        }
    }
}

/// How a command ended.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecResult {
    /// Exit status, when it exited.
    pub exit_code: Option<i32>,
    /// The signal that ended it, when killed.
    pub signal: Option<i32>,
    /// Captured stdout (lossy UTF-8), capped.
    #[serde(serialize_with = "cordis_sdk::json_text")]
    pub stdout: String,
    /// Captured stderr (lossy UTF-8), capped.
    #[serde(serialize_with = "cordis_sdk::json_text")]
    pub stderr: String,
    /// Output was cut at the cap (a notice names the cap).
    pub truncated: bool,
    /// The timeout fired; the command and every process it started were killed.
    pub timed_out: bool,
    /// The call was cancelled; the command and every process it started were killed (or,
    /// cancelled before it started, it never ran).
    #[serde(default)]
    pub cancelled: bool,
    /// The sandbox denied a file access (inferred conservatively from the output).
    pub sandbox_denied: bool,
    /// The mode the command ran under (`None`: unconfined backend).
    pub mode: Option<SandboxMode>,
    /// The resource limit that stopped the command or refused it something (memory,
    /// processes, file size, CPU time), named with its value; `None` when none did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_reached: Option<String>,
}

cordis_sdk::interface! {
    /// Runs shell commands.
    pub trait Shell as ShellClient ("dsh.shell", 1) {
        /// Runs one command to completion (or timeout).
        fn exec(&self, request: ExecRequest) -> ExecResult;
        /// The capability fact: `None` for an unconfined backend, else its default mode.
        fn sandbox_mode(&self, unit: ()) -> Option<SandboxMode>;
    }
}
