//! `cordis session`: make, list, show, switch and prune sessions.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use clap::Subcommand;
use cordis_engine::{Host, Runtime};
use cordis_sdk::SessionInfo;
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
    /// `cordis session new` or by `cordis run` for a client), when unchanged for a while;
    /// with `--all`, apply a retention policy to every session no process holds.
    Prune {
        /// Remove only those unchanged for this long: a number and a unit, `s`, `m`, `h`
        /// or `d` (e.g. `30m`, `7d`; `0s` for all of them) [default: 1h without `--all`].
        #[arg(long, value_parser = cordis_engine::parse_duration)]
        older_than: Option<std::time::Duration>,
        /// Every session, not only those `cordis call` made, except the ones a process
        /// holds (a running server's, a call's) and those changed in the last minute.
        #[arg(long)]
        all: bool,
        /// With `--all`: keep at most this many (the most recently changed).
        #[arg(long, value_name = "N", requires = "all")]
        keep: Option<usize>,
    },
}

/// Applies the composition as a server started in `session`'s root would: the policy's
/// default workspace root is the current directory, so the guards of a new session's root
/// (the state directory must lie outside it) concern this session's root, not wherever the
/// command runs (every path the host was given is absolute by now).
fn start_in(host: Host, session: &SessionInfo) -> anyhow::Result<Arc<Runtime>> {
    std::env::set_current_dir(&session.cwd).with_context(|| {
        format!(
            "cannot enter the session's root {}; it was moved or removed",
            session.cwd.display()
        )
    })?;
    Runtime::start(host)
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
            let runtime = start_in(host, &info)?;
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
                match connections(&e) {
                    Some(list) => {
                        println!("  #{} {} ({} connections)", e.seq, e.kind, list.len());
                        for c in list {
                            println!(
                                "      {} {} {}:{} ({}), {} B sent, {} B received, {} ms",
                                if c.allowed { "allowed" } else { "refused" },
                                c.method,
                                c.host,
                                c.port,
                                c.rule,
                                c.sent,
                                c.received,
                                c.millis
                            );
                        }
                    }
                    None => println!("  #{} {} {}", e.seq, e.kind, e.data),
                }
            }
            runtime.shutdown();
        }
        SessionCommand::SetMode { id, mode } => {
            let info = host.sessions().get(&id)?;
            let runtime = start_in(host, &info)?;
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
        SessionCommand::Prune {
            older_than,
            all: true,
            keep,
        } => {
            if older_than.is_none() && keep.is_none() {
                anyhow::bail!("`--all` needs a policy: `--older-than AGE`, `--keep N`, or both");
            }
            let removed = host
                .sessions()
                .retain(&cordis_engine::Retention { older_than, keep })?;
            for id in &removed {
                println!("{id}");
            }
            eprintln!(
                "removed {} session(s) no process holds, by the retention policy",
                removed.len()
            );
        }
        SessionCommand::Prune { older_than, .. } => {
            let older_than = older_than.unwrap_or(std::time::Duration::from_secs(3600));
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

/// The proxy's decisions an event records (the network allowlist's `sandbox/network`),
/// one line each; `None` for any other event (or one that does not parse: shown raw).
fn connections(
    event: &cordis_sdk::host::SessionEvent,
) -> Option<Vec<dsh_sandbox::egress::Connection>> {
    if event.kind != dsh_sandbox::egress::CONNECTIONS_EVENT {
        return None;
    }
    serde_json::from_value(event.data.get("connections")?.clone()).ok()
}
