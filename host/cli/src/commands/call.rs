//! `cordis call`: call one tool, in a session, as a script would.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use cordis_engine::{Asker, Diagnostics, Host, OpenSession, Runtime, SessionStart};
use cordis_sdk::host::{ApprovalOutcome, ApprovalRequest};
use cordis_sdk::{CallContext, ToolResult};

use super::Format;

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
    /// `human` (the tool's text) or `json` (the whole result: `{"text", "isError",
    /// "structuredContent"}`, one object on one line, with the session id).
    #[arg(long, value_enum, default_value_t = Format::Human)]
    format: Format,
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
    if let Some(id) = &args.session {
        if let Err(e) = host.sessions().get(id) {
            return fail(e.into());
        }
    }
    let asker: Option<Asker> = if args.approve {
        Some(Arc::new(|_: &ApprovalRequest| ApprovalOutcome::Approved))
    } else if args.deny {
        Some(Arc::new(|_: &ApprovalRequest| ApprovalOutcome::Rejected))
    } else if std::io::stdin().is_terminal() {
        Some(Arc::new(ask_on_terminal))
    } else {
        None
    };
    let runtime = match Runtime::start(host) {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    let known = runtime.inspect(|c| c.registry().tool(&args.tool).map(|_| ()));
    if let Err(e) = known {
        runtime.shutdown();
        return fail(e.into());
    }
    let opened = || -> anyhow::Result<OpenSession> {
        if let Some(id) = &args.session {
            return Ok(runtime.open_session(SessionStart::Resume(id), asker)?);
        }
        let cwd = match &args.cwd {
            Some(cwd) => cwd.clone(),
            None => std::env::current_dir()
                .map_err(|e| anyhow::anyhow!("cannot read the current directory: {e}"))?,
        };
        Ok(runtime.open_session(SessionStart::ForOneCall(&cwd), asker)?)
    };
    let opened = match opened() {
        Ok(s) => s,
        Err(e) => {
            runtime.shutdown();
            return fail(e);
        }
    };
    let session = opened.info().clone();
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
            match args.format {
                Format::Human => println!("{}", result.text),
                Format::Json => println!("{}", result_json(&call.session.id, &result)),
            }
            if result.is_error {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => fail(e.into()),
    }
}

/// A tool result as `cordis call --format json` prints it, in the MCP result's field names.
fn result_json(session: &str, result: &ToolResult) -> serde_json::Value {
    let mut out = serde_json::json!({
        "session": session,
        "text": result.text,
        "isError": result.is_error,
    });
    if let Some(structured) = &result.structured {
        out["structuredContent"] = structured.clone();
    }
    out
}

/// Asks on the terminal: `y` approves, `n` rejects, end of input cancels.
pub(crate) fn ask_on_terminal(request: &ApprovalRequest) -> ApprovalOutcome {
    eprint!(
        "{}Approve this one call? [y/N] ",
        cordis_engine::render_approval(request)
    );
    let mut line = String::new();
    match std::io::stdin().read_line(&mut line) {
        Ok(0) | Err(_) => ApprovalOutcome::Cancelled,
        Ok(_) if matches!(line.trim(), "y" | "Y" | "yes") => ApprovalOutcome::Approved,
        Ok(_) => ApprovalOutcome::Rejected,
    }
}
