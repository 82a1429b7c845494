//! `cordis session`: make, list, show, switch and prune sessions.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Subcommand;
use cordis_engine::Host;
use cordis_engine::Runtime;
use dsh_sandbox::{
    ResolveArgs, SandboxMode, SandboxPolicy as _, SandboxPolicyClient, SetModeArgs, SANDBOX_POLICY,
};

#[derive(Subcommand)]
pub(crate) enum SessionCommand {
    /// Create a session rooted at a directory and print its id.
    New {
        /// The session's immutable root [default: the current directory].
        #[arg(long)]
        cwd: Option<PathBuf>,
    },
    /// List session ids.
    List,
    /// Show a session: its root, its effective sandbox policy and its events.
    Show {
        /// The session id.
        id: String,
    },
    /// Switch a session's standing sandbox mode (recorded in its log; survives restarts).
    SetMode {
        /// The session id.
        id: String,
        /// read-only, workspace-write or danger-full-access.
        mode: SandboxMode,
    },
    /// Remove the sessions `cordis call` made for one call (never a session made by
    /// `cordis session new` or by `cordis run` for a client), when unchanged for a while.
    Prune {
        /// Remove only those unchanged for this long: a number and a unit, `s`, `m`, `h`
        /// or `d` (e.g. `30m`, `7d`; `0s` for all of them).
        #[arg(long, default_value = "1h", value_parser = parse_duration)]
        older_than: std::time::Duration,
    },
}

/// `30s`, `15m`, `2h`, `7d`: a whole number and a unit.
pub(crate) fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let scale = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("`{text}` is not a duration: write a whole number and a unit, s, m, h or d (e.g. 30m, 7d)")),
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .map(std::time::Duration::from_secs)
        .ok_or_else(|| format!("`{text}` is not a duration: write a whole number and a unit, s, m, h or d (e.g. 30m, 7d)"))
}

pub(crate) fn session(host: Host, cmd: SessionCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        SessionCommand::New { cwd } => {
            let cwd = match cwd {
                Some(c) => c,
                None => std::env::current_dir().context("cannot read the current directory")?,
            };
            let info = host.sessions().create(&cwd)?;
            println!("{}", info.id);
        }
        SessionCommand::List => {
            for id in host.sessions().list() {
                println!("{id}");
            }
        }
        SessionCommand::Show { id } => {
            let info = host.sessions().get(&id)?;
            let events = host.sessions().events(&id, None)?;
            println!("session: {}\ncwd: {}", info.id, info.cwd.display());
            let runtime = Runtime::start(host)?;
            let policy = runtime.with_service(SANDBOX_POLICY, |p: &SandboxPolicyClient| {
                p.resolve(ResolveArgs {
                    session: Some(id.clone()),
                    mode: None,
                })
            });
            match policy {
                Ok(policy) => println!(
                    "sandbox policy: {} (workspace root {})",
                    policy.mode,
                    policy.workspace_root.display()
                ),
                Err(e) => println!("sandbox policy: unavailable: {e:#}"),
            }
            println!("events: {}", events.len());
            for e in events {
                println!("  #{} {} {}", e.seq, e.kind, e.data);
            }
            runtime.shutdown();
        }
        SessionCommand::SetMode { id, mode } => {
            host.sessions().get(&id)?;
            let runtime = Runtime::start(host)?;
            let outcome = runtime.with_service(SANDBOX_POLICY, |p: &SandboxPolicyClient| {
                p.set_sandbox_mode(SetModeArgs {
                    session: id.clone(),
                    mode,
                })
            });
            runtime.shutdown();
            outcome.with_context(|| format!("failed to set the mode of session {id}"))?;
            println!("session {id}: mode {mode}");
        }
        SessionCommand::Prune { older_than } => {
            let removed = host.sessions().prune(older_than)?;
            for id in &removed {
                println!("{id}");
            }
            eprintln!(
                "removed {} session(s) made by `cordis call` and unchanged for {}s",
                removed.len(),
                older_than.as_secs()
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
