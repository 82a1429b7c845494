//! `cordis approvals`: list and answer the escalations waiting for a person in the running
//! hosts of this state directory ([`cordis_cli::operator`]).

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Subcommand;
use cordis_cli::operator::{ask_host, PendingApproval, Request};
use cordis_cli::status::{self, HostStatus};

use super::Format;

#[derive(Subcommand)]
pub(crate) enum ApprovalsCommand {
    /// List the approvals waiting in every running `cordis run` of this state directory,
    /// each as its client would show it.
    List {
        /// `human`, or `json` (`[{"id", "session", "call", "tool", "summary", "prompt",
        /// "waiting_secs"}]`).
        #[arg(long, value_enum, default_value_t = Format::Human)]
        format: Format,
    },
    /// Approve one waiting approval: exactly that one call runs with the wider sandbox.
    Approve {
        /// Its id, `<pid>.<n>`, as `list` shows it.
        id: String,
    },
    /// Reject one waiting approval.
    Deny {
        /// Its id, `<pid>.<n>`, as `list` shows it.
        id: String,
    },
}

pub(crate) fn approvals(state_dir: &Path, command: ApprovalsCommand) -> anyhow::Result<ExitCode> {
    match command {
        ApprovalsCommand::List { format } => {
            let mut pending: Vec<PendingApproval> = Vec::new();
            let mut hosts = 0;
            for host in HostStatus::all_live(state_dir) {
                let run_dir = status::run_dir(state_dir, host.pid);
                if !run_dir.join(cordis_cli::operator::SOCKET).exists() {
                    continue;
                }
                hosts += 1;
                let reply = ask_host(&run_dir, |key| Request::List { key })?;
                if let Some(e) = reply.error {
                    anyhow::bail!("the host with pid {} refused: {e}", host.pid);
                }
                pending.extend(reply.pending.unwrap_or_default());
            }
            match format {
                Format::Json => println!("{}", serde_json::to_string_pretty(&pending)?),
                Format::Human if pending.is_empty() => println!(
                    "no approval is waiting ({hosts} running host{} with an approvals channel in {})",
                    if hosts == 1 { "" } else { "s" },
                    state_dir.display()
                ),
                Format::Human => {
                    for p in &pending {
                        println!(
                            "approval {} (session {}, call {}, waiting {} s)\n{}answer: cordis approvals approve {0}   or   cordis approvals deny {0}\n",
                            p.id, p.session, p.call, p.waiting_secs, p.prompt
                        );
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        ApprovalsCommand::Approve { id } => answer(state_dir, id, true),
        ApprovalsCommand::Deny { id } => answer(state_dir, id, false),
    }
}

fn answer(state_dir: &Path, id: String, approve: bool) -> anyhow::Result<ExitCode> {
    let pid = id
        .split_once('.')
        .and_then(|(pid, n)| Some((pid.parse::<u32>().ok()?, n.parse::<u64>().ok()?)))
        .map(|(pid, _)| pid)
        .with_context(|| {
            format!(
                "`{id}` is not an approval id (`<pid>.<n>`, as `cordis approvals list` shows it)"
            )
        })?;
    if !HostStatus::all_live(state_dir).iter().any(|h| h.pid == pid) {
        anyhow::bail!(
            "no running `cordis run` with pid {pid} keeps its state in {} (it ended, or runs with another --state-dir); `cordis approvals list` shows what waits",
            state_dir.display()
        );
    }
    let run_dir = status::run_dir(state_dir, pid);
    let reply = ask_host(&run_dir, |key| {
        let id = id.clone();
        if approve {
            Request::Approve { key, id }
        } else {
            Request::Deny { key, id }
        }
    })?;
    if let Some(e) = reply.error {
        anyhow::bail!("{e}");
    }
    println!("{} {id}", if approve { "approved" } else { "denied" });
    Ok(ExitCode::SUCCESS)
}
