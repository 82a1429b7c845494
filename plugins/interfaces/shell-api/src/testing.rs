//! A stand-in `shell` for plugin tests (feature `testing`): [`ScriptedShell`].
//!
//! ```
//! use dsh_shell_api::testing::ScriptedShell;
//! use dsh_shell_api::{ExecRequest, Shell};
//!
//! let shell = ScriptedShell::answering("hi\n");
//! // With cordis-test: `.stand_in(dsh_shell_api::SHELL, shell.serve())`.
//! let request = ExecRequest {
//!     command: "echo hi".into(),
//!     cwd: "/".into(),
//!     env: Vec::new(),
//!     timeout_ms: None,
//!     output_limit: None,
//!     policy: None,
//!     cancel_fd: None,
//!     progress_fd: None,
//! };
//! assert_eq!(shell.exec(request).unwrap().stdout, "hi\n");
//! assert_eq!(shell.requests()[0].command, "echo hi");
//! ```

use std::sync::{Arc, Mutex};

use cordis_sdk::abi::ServiceBox;
use cordis_sdk::Result;
use dsh_sandbox::SandboxMode;

use crate::{ExecRequest, ExecResult, Shell, ShellClient};

type Answer = dyn Fn(&ExecRequest) -> ExecResult + Send + Sync;

/// A `shell` that runs nothing: it records every request and answers each with what its
/// script says, so a test checks what its plugin asked to run and how it handles each
/// outcome (exit codes, timeouts, denials) without a process or a sandbox.
#[derive(Clone)]
pub struct ScriptedShell {
    answer: Arc<Answer>,
    requests: Arc<Mutex<Vec<ExecRequest>>>,
}

impl ScriptedShell {
    /// Every command exits 0 with `stdout`.
    pub fn answering(stdout: &str) -> ScriptedShell {
        let stdout = stdout.to_string();
        ScriptedShell::with(move |_| ExecResult {
            exit_code: Some(0),
            stdout: stdout.clone(),
            ..ExecResult::default()
        })
    }

    /// Each command is answered by `answer`.
    pub fn with(
        answer: impl Fn(&ExecRequest) -> ExecResult + Send + Sync + 'static,
    ) -> ScriptedShell {
        ScriptedShell {
            answer: Arc::new(answer),
            requests: Arc::default(),
        }
    }

    /// The requests so far, oldest first.
    pub fn requests(&self) -> Vec<ExecRequest> {
        self.requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// This stand-in as a service object, for `cordis-test`'s `stand_in(SHELL, ...)`.
    pub fn serve(&self) -> ServiceBox {
        ShellClient::serve(self.clone())
    }
}

impl Shell for ScriptedShell {
    fn exec(&self, request: ExecRequest) -> Result<ExecResult> {
        let result = (self.answer)(&request);
        self.requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(request);
        Ok(result)
    }

    fn sandbox_mode(&self, _unit: ()) -> Result<Option<SandboxMode>> {
        Ok(None)
    }
}
