//! `cordis call`: call one tool, in a session, as a script would.

use std::path::PathBuf;
use std::process::ExitCode;

use cordis_engine::diag::Diagnostics;
use cordis_engine::runtime::Runtime;
use cordis_engine::sessions::Origin;
use cordis_engine::Host;
use cordis_sdk::host::{ApprovalOutcome, ApprovalRequest};
use cordis_sdk::CallContext;
use std::io::IsTerminal;

#[derive(clap::Args)]
pub(crate) struct CallArgs {
    /// Run in this existing session.
    #[arg(long, conflicts_with = "cwd")]
    session: Option<String>,
    /// Root a new session here [default: the current directory].
    #[arg(long)]
    cwd: Option<PathBuf>,
    /// Approve an escalation request without asking.
    #[arg(long, conflicts_with = "deny")]
    approve: bool,
    /// Reject an escalation request without asking.
    #[arg(long)]
    deny: bool,
    /// The tool's name.
    tool: String,
    /// The tool's arguments as a JSON object.
    #[arg(default_value = "{}")]
    args: String,
}

pub(crate) fn call(host: Host, args: CallArgs) -> ExitCode {
    const HOST_ERROR: u8 = 2;
    let fail = |e: anyhow::Error| {
        match e.downcast_ref::<Diagnostics>() {
            Some(d) => eprintln!("{d}"),
            None => eprintln!("error: {e:#}"),
        }
        ExitCode::from(HOST_ERROR)
    };
    let parsed: serde_json::Value = match serde_json::from_str(&args.args) {
        Ok(v @ serde_json::Value::Object(_)) => v,
        Ok(other) => {
            return fail(anyhow::anyhow!(
            "tool arguments must be a JSON object, got `{other}`; e.g. '{{\"path\": \"a.txt\"}}'"
        ))
        }
        Err(e) => return fail(anyhow::anyhow!("tool arguments are not valid JSON: {e}")),
    };
    // Nothing is created before the composition starts and the tool is known: a bad
    // manifest or a misspelt tool leaves no stray session behind.
    let sessions = host.sessions.clone();
    let existing = match &args.session {
        Some(id) => match sessions.get(id) {
            Ok(s) => Some(s),
            Err(e) => return fail(e.into()),
        },
        None => None,
    };
    if args.approve {
        host.approvals.answer_always(ApprovalOutcome::Approved);
    } else if args.deny {
        host.approvals.answer_always(ApprovalOutcome::Rejected);
    } else if std::io::stdin().is_terminal() {
        host.approvals
            .set_default(Some(std::sync::Arc::new(ask_on_terminal)));
    } else {
        host.approvals.set_default(None);
    }
    let runtime = match Runtime::start(host) {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    let known = runtime.composition().registry.tool(&args.tool).map(|_| ());
    if let Err(e) = known {
        runtime.shutdown();
        return fail(e.into());
    }
    let session: anyhow::Result<_> = existing.map(Ok).unwrap_or_else(|| {
        let cwd = args
            .cwd
            .clone()
            .map(Ok)
            .unwrap_or_else(std::env::current_dir);
        let cwd = cwd.map_err(|e| anyhow::anyhow!("cannot read the current directory: {e}"))?;
        Ok(sessions.create_with(&cwd, Some(Origin::Call))?)
    });
    let session = match session {
        Ok(s) => s,
        Err(e) => {
            runtime.shutdown();
            return fail(e);
        }
    };
    eprintln!("session: {}", session.id);
    let call = CallContext {
        session,
        call_id: format!("cli-{}", std::process::id()),
        cancel_fd: None,
        progress_fd: None,
    };
    let outcome = runtime.call_tool(&args.tool, &call, &parsed);
    runtime.shutdown();
    match outcome {
        Ok(result) => {
            println!("{}", result.text);
            if result.is_error {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => fail(e.into()),
    }
}

/// Asks on the terminal: `y` approves, `n` rejects, end of input cancels.
pub(crate) fn ask_on_terminal(request: &ApprovalRequest) -> ApprovalOutcome {
    eprint!(
        "{}Approve this one call? [y/N] ",
        cordis_engine::approval::render(request)
    );
    let mut line = String::new();
    match std::io::stdin().read_line(&mut line) {
        Ok(0) | Err(_) => ApprovalOutcome::Cancelled,
        Ok(_) if matches!(line.trim(), "y" | "Y" | "yes") => ApprovalOutcome::Approved,
        Ok(_) => ApprovalOutcome::Rejected,
    }
}
