//! `cordis run`: apply the composition and serve its tools over MCP (stdio or HTTP), reloading changes.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use cordis_cli::http::{serve_http, HttpOptions};
use cordis_cli::mcp::{serve_stdio_with, McpOptions, ToolListNotifier};
use cordis_cli::status::{self, HostStatus};
use cordis_cli::watch::Quiet;
use cordis_engine::Copies;
use cordis_engine::Host;
use cordis_engine::Runtime;

use super::tools::tool_names;

#[derive(clap::Args)]
pub(crate) struct RunArgs {
    /// Do not watch cordis.yml and the plugin libraries for changes.
    #[arg(long, conflicts_with = "dev")]
    no_watch: bool,
    /// Also watch the sources of the cargo project cordis.yml lives in, run `cargo build`
    /// for the loaded plugins when one changes, and reload when the build finishes.
    #[arg(long)]
    dev: bool,
    /// Wait this long (milliseconds) after an in-place write to cordis.yml or a library
    /// that is not closed yet before reloading [default: 30 for cordis.yml, 50 for a
    /// library; a file renamed into place or closed reloads at once, and a library cargo is
    /// building waits for the build to finish].
    #[arg(long, value_name = "MS", conflicts_with = "no_watch", value_parser = clap::value_parser!(u64).range(0..=60_000))]
    reload_quiet: Option<u64>,
    /// Serve this existing session instead of a new one (stdio only).
    #[arg(long, conflicts_with_all = ["cwd", "http"])]
    session: Option<String>,
    /// Root new sessions here when the client names no allowed root [default: the current
    /// directory].
    #[arg(long)]
    cwd: Option<PathBuf>,
    /// A directory a client's root may lie in (repeatable); a session is rooted at the
    /// client's first root when it is within one [default: only the --cwd directory].
    #[arg(long, value_name = "DIR")]
    allow_root: Vec<PathBuf>,
    /// Serve MCP over Streamable HTTP at this address (e.g. 127.0.0.1:8765; port 0 picks
    /// one) at path /mcp, instead of stdio. Clients need the bearer token: CORDIS_HTTP_TOKEN,
    /// else one generated into the state directory (its path is logged).
    #[arg(long, value_name = "ADDR")]
    http: Option<std::net::SocketAddr>,
    /// A browser origin allowed to call the HTTP server besides the loopback ones
    /// (repeatable), e.g. https://agent.example.com.
    #[arg(long, value_name = "ORIGIN", requires = "http")]
    allow_origin: Vec<String>,
    /// A `Host` name allowed besides the loopback ones (repeatable): the public name a
    /// reverse proxy passes on, e.g. agent.example.com.
    #[arg(long, value_name = "NAME", requires = "http")]
    allow_host: Vec<String>,
    /// This host's name in session ids (`NAME.<uuid>`), so a proxy in front of several
    /// hosts routes each session to the host that made it.
    #[arg(long, value_name = "NAME", requires = "http", value_parser = instance_name)]
    instance: Option<String>,
    /// The most HTTP sessions at once; a new one past it is answered 503.
    #[arg(long, value_name = "N", default_value_t = 1024, requires = "http", value_parser = clap::value_parser!(u64).range(1..))]
    max_sessions: u64,
    /// The most HTTP connections at once; past it a connection that has made no
    /// authenticated request makes room, else the new one is answered 503.
    #[arg(long, value_name = "N", default_value_t = 1024, requires = "http", value_parser = clap::value_parser!(u64).range(1..))]
    max_connections: u64,
    /// End an HTTP session after this many seconds without requests.
    #[arg(long, value_name = "SECS", default_value_t = 900, requires = "http", value_parser = clap::value_parser!(u64).range(1..))]
    idle_timeout: u64,
    /// How HTTP clients authenticate: `token` (bearer tokens of this server,
    /// CORDIS_HTTP_TOKEN) or `oauth` (as an OAuth 2.1 resource server: access tokens of the
    /// authorization server --oauth-issuer, for the audience --oauth-audience).
    #[arg(long, value_enum, default_value_t = Auth::Token, requires = "http")]
    auth: Auth,
    /// With --auth oauth: the authorization server's issuer identifier, exactly as its
    /// tokens' `iss` names it (https, or http on loopback).
    #[arg(long, value_name = "URL", required_if_eq("auth", "oauth"))]
    oauth_issuer: Option<String>,
    /// With --auth oauth: this server's canonical URI as its clients reach it (e.g.
    /// https://mcp.example.com/mcp): the audience (`aud`) its tokens must name.
    #[arg(long, value_name = "URI", required_if_eq("auth", "oauth"))]
    oauth_audience: Option<String>,
    /// With --auth oauth: the issuer's keys (JWKS) [default: discovered from the issuer's
    /// metadata].
    #[arg(long, value_name = "URL")]
    oauth_jwks: Option<String>,
    /// On SIGTERM or SIGINT, give the calls in flight this many seconds to finish before
    /// they are cancelled (a running command is killed).
    #[arg(long, value_name = "SECS", default_value_t = 10)]
    shutdown_timeout: u64,
    /// Session retention: remove the logs of sessions no process holds once unchanged for
    /// this long (e.g. `30d`), at start and every 10 minutes.
    #[arg(long, value_name = "AGE", value_parser = cordis_engine::parse_duration)]
    retain_sessions_for: Option<std::time::Duration>,
    /// Session retention: keep at most this many session logs (the most recently changed;
    /// the sessions a process holds are never removed), at start and every 10 minutes.
    #[arg(long, value_name = "N")]
    retain_sessions: Option<usize>,
    /// How long an escalation waits for a person: its client (elicitation) or an operator
    /// (`cordis approvals approve|deny`, or `/approvals` over HTTP); after it, it is
    /// unavailable. 0: no operator channel (a client that cannot be asked gets
    /// `unavailable` at once).
    #[arg(long, value_name = "SECS", default_value_t = 600)]
    approval_timeout: u64,
}

/// `--auth`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Auth {
    Token,
    Oauth,
}

/// How often a server applies its session retention.
const RETENTION_EVERY: std::time::Duration = std::time::Duration::from_secs(600);

/// Applies `retention` to `sessions` now and every [`RETENTION_EVERY`], on a thread of
/// its own, logging what it removed.
fn retain_sessions(
    sessions: Arc<cordis_engine::SessionStore>,
    retention: cordis_engine::Retention,
) -> anyhow::Result<()> {
    let apply = move || match sessions.retain(&retention) {
        Ok(removed) if removed.is_empty() => {}
        Ok(removed) => tracing::info!(
            removed = removed.len(),
            "session retention removed {} session log(s) no process holds: {}",
            removed.len(),
            removed.join(", ")
        ),
        Err(e) => tracing::warn!("session retention failed: {e}"),
    };
    apply();
    std::thread::Builder::new()
        .name("cordis-retention".into())
        .spawn(move || loop {
            std::thread::sleep(RETENTION_EVERY);
            apply();
        })
        .context("cannot start the session retention thread")?;
    Ok(())
}

/// `--instance`: a name session ids may start with.
pub(crate) fn instance_name(name: &str) -> Result<String, String> {
    cordis_cli::http::sessions::check_instance(name).map(|()| name.to_string())
}

pub(crate) fn run(
    mut host: Host,
    state_dir: &std::path::Path,
    args: RunArgs,
) -> anyhow::Result<ExitCode> {
    let copies_dir = status::run_dir(state_dir, std::process::id());
    let manifest = host.manifest().to_path_buf();
    if !args.no_watch {
        // Every generation loads from its own copy, so a rebuilt file is a new library.
        host.copy_libraries(Copies::new(&copies_dir));
    }
    // With `--dev`, the libraries are brought up to date with the sources first.
    let project = if args.dev {
        let project = cordis_cli::dev::Projects::discover(&manifest, host.search())
            .context("`--dev` cannot start")?;
        let trusted = project.trusted_paths();
        tracing::warn!(
            "dev: the plugin sources in {} are rebuilt and run UNCONFINED in this host; they and \
             the target directory are protected from sandboxed sessions (read-only to them)",
            trusted
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
        host.services().protect(trusted);
        if !project.build_for_manifest(&manifest, host.search()) {
            tracing::error!("dev: the first build failed; starting with the libraries on disk");
        }
        Some(project)
    } else {
        None
    };
    // A session to resume must exist before anything is applied.
    if let Some(id) = &args.session {
        host.sessions()
            .get(id)
            .map_err(|e| anyhow::anyhow!("{e}; omit --session to start a new session"))?;
    }
    let runtime = Runtime::start(host);
    let runtime = match runtime {
        Ok(r) => r,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&copies_dir);
            return Err(e);
        }
    };
    if args.retain_sessions_for.is_some() || args.retain_sessions.is_some() {
        retain_sessions(
            runtime.sessions().clone(),
            cordis_engine::Retention {
                older_than: args.retain_sessions_for,
                keep: args.retain_sessions,
            },
        )?;
    }
    let mut status = HostStatus::new(&manifest);
    runtime.inspect(|c| status.publish(c, state_dir));
    // `None` once the host stops serving: nothing writes the status file after that.
    let status = Arc::new(Mutex::new(Some(status)));
    let stop_publishing = {
        let status = status.clone();
        move || {
            status.lock().unwrap_or_else(|e| e.into_inner()).take();
        }
    };
    {
        // An isolated entry's process changes without a reload (a crash, a restart).
        let (weak, state_dir, status) = (
            Arc::downgrade(&runtime),
            state_dir.to_path_buf(),
            status.clone(),
        );
        let _ = std::thread::Builder::new()
            .name("cordis-status".into())
            .spawn(move || loop {
                std::thread::sleep(std::time::Duration::from_millis(250));
                let Some(runtime) = weak.upgrade() else {
                    return;
                };
                let mut status = status.lock().unwrap_or_else(|e| e.into_inner());
                let Some(status) = status.as_mut() else {
                    return;
                };
                runtime.inspect(|c| status.refresh(c, &state_dir));
            });
    }
    let notifier = ToolListNotifier::default();
    {
        let notifier = notifier.clone();
        let (weak, state_dir, status) = (
            Arc::downgrade(&runtime),
            state_dir.to_path_buf(),
            status.clone(),
        );
        runtime.on_reloaded(move |report| {
            if report.tools_changed {
                notifier.notify_tools_changed();
            }
            let Some(runtime) = weak.upgrade() else {
                return;
            };
            let mut status = status.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(status) = status.as_mut() {
                status.reloads += 1;
                runtime.inspect(|c| status.publish(c, &state_dir));
            }
        });
    }
    let quiet = args.reload_quiet.map_or(Quiet::DEFAULT, |ms| {
        Quiet::uniform(std::time::Duration::from_millis(ms))
    });
    let watching = || -> anyhow::Result<()> {
        if !args.no_watch {
            cordis_cli::watch::spawn(runtime.clone(), quiet)
                .context("failed to watch for changes")?;
        }
        if let Some(project) = project {
            cordis_cli::dev::spawn(runtime.clone(), project, quiet)
                .context("`--dev` cannot start")?;
        }
        Ok(())
    };
    if let Err(e) = watching() {
        stop_publishing();
        runtime.shutdown();
        let _ = std::fs::remove_dir_all(&copies_dir);
        return Err(e);
    }
    // On stdio, one connection on one thread: the protocol's pipes, rmcp and the calls'
    // completions never hand work between runtime threads. Over HTTP, a request crosses
    // several tasks (the connection, rmcp's session worker, the handler, the kept event
    // stream), and each hand-off between runtime threads is a wake-up that costs more than
    // the parsing it spreads: half the cores run the protocol (one on two cores), the
    // blocking pool beside them runs the tool calls, where the time goes.
    let tokio = match args.http {
        None => tokio::runtime::Builder::new_current_thread(),
        Some(_) => {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads((cores / 2).max(1));
            builder
        }
    }
    .enable_all()
    .build()
    .context("failed to start the async runtime")?;
    // Traces, when an OTLP endpoint is configured; the last are sent when this drops.
    let _traces = match cordis_cli::traces::init(if args.http.is_some() { "tcp" } else { "pipe" }) {
        Ok(traces) => traces,
        Err(e) => {
            stop_publishing();
            runtime.shutdown();
            let _ = std::fs::remove_dir_all(&copies_dir);
            return Err(e);
        }
    };
    // The operator channel: approvals a person answers from outside the client.
    let operator = (args.approval_timeout > 0).then(|| {
        cordis_cli::operator::Operator::new(std::time::Duration::from_secs(args.approval_timeout))
    });
    let control = match &operator {
        Some(_) => match cordis_cli::operator::Control::bind(&copies_dir) {
            Ok(c) => Some(c),
            Err(e) => {
                stop_publishing();
                runtime.shutdown();
                let _ = std::fs::remove_dir_all(&copies_dir);
                return Err(e.context(
                    "cannot open the approvals socket (--approval-timeout 0 runs without one)",
                ));
            }
        },
        None => None,
    };
    let options = McpOptions {
        session: args.session,
        cwd: args.cwd,
        allow_roots: args.allow_root,
        operator: operator.clone(),
    };
    let deadline = std::time::Duration::from_secs(args.shutdown_timeout);
    let ended = tokio.block_on(async {
        // Signals are handled from here on; only then is the host announced as running.
        let mut signals = Signals::install()?;
        let _control = match (control, &operator) {
            (Some(control), Some(operator)) => Some(control.serve(operator.clone())?),
            _ => None,
        };
        runtime.inspect(|c| {
            let plugins: Vec<String> = c
                .plan()
                .entries
                .iter()
                .map(|p| format!("{} ({})", p.entry.id, p.library.meta.version))
                .collect();
            tracing::info!(
                "cordis {} running {}: plugins: {}; services: {}; tools: {}",
                env!("CARGO_PKG_VERSION"),
                c.plan().file.display(),
                if plugins.is_empty() {
                    "-".to_string()
                } else {
                    plugins.join(", ")
                },
                c.registry()
                    .services
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", "),
                tool_names(c.registry())
            );
        });
        // The first signal stops taking calls; the calls in flight finish until the
        // deadline or a second signal, then what remains is cancelled. (The first signal
        // yields the future that gives up: it starts the deadline when it comes.)
        #[allow(clippy::async_yields_async)]
        let shutdown = async move {
            let why = signals.next().await;
            tracing::info!(
                "{why}: taking no new calls; the calls in flight have {} s to finish (signal again to cancel them now)",
                deadline.as_secs()
            );
            async move {
                tokio::select! {
                    _ = tokio::time::sleep(deadline) => {}
                    why = signals.next() => tracing::info!("{why} again: cancelling the calls in flight now"),
                }
            }
        };
        match args.http {
            Some(addr) => {
                let oauth = match args.auth {
                    Auth::Oauth => Some(cordis_cli::http::oauth::OAuthOptions {
                        issuer: args.oauth_issuer.unwrap_or_default(),
                        audience: args.oauth_audience.unwrap_or_default(),
                        jwks: args.oauth_jwks,
                    }),
                    Auth::Token => {
                        if args.oauth_issuer.is_some()
                            || args.oauth_audience.is_some()
                            || args.oauth_jwks.is_some()
                        {
                            return Err(anyhow::anyhow!(
                                "--oauth-issuer, --oauth-audience and --oauth-jwks take effect only with --auth oauth: add it, or drop them"
                            ));
                        }
                        None
                    }
                };
                let http = HttpOptions {
                    oauth,
                    addr,
                    token: std::env::var(cordis_cli::http::TOKEN_ENV).ok(),
                    operator_token: std::env::var(cordis_cli::http::OPERATOR_TOKEN_ENV).ok(),
                    state_dir: state_dir.to_path_buf(),
                    allow_origins: args.allow_origin,
                    idle_timeout: std::time::Duration::from_secs(args.idle_timeout),
                    allow_hosts: args.allow_host,
                    instance: args.instance,
                    max_sessions: usize::try_from(args.max_sessions).unwrap_or(usize::MAX),
                    bounds: cordis_cli::http::connections::Bounds {
                        max_connections: usize::try_from(args.max_connections)
                            .unwrap_or(usize::MAX),
                        ..Default::default()
                    },
                };
                serve_http(runtime.clone(), options, http, notifier, shutdown)
                    .await
                    .map(|()| "shut down")
            }
            None => serve_stdio_with(runtime.clone(), options, notifier, shutdown)
                .await
                .map(|()| "the connection ended"),
        }
    });
    match &ended {
        Ok(why) => tracing::info!("{why}; disposing"),
        Err(e) => tracing::error!("{e:#}; disposing"),
    }
    // Not a plain drop: that waits for every blocking task, and the one reading stdin
    // only returns at end of input, so a signal would leave the host hanging while the
    // client keeps its end open.
    tokio.shutdown_background();
    stop_publishing();
    runtime.shutdown();
    let _ = std::fs::remove_dir_all(&copies_dir);
    ended.map(|_| ExitCode::SUCCESS)
}

/// SIGTERM and SIGINT, handled from when they are installed.
pub(crate) struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> anyhow::Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            term: signal(SignalKind::terminate()).context("failed to watch SIGTERM")?,
            int: signal(SignalKind::interrupt()).context("failed to watch SIGINT")?,
        })
    }

    /// The next signal.
    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "received SIGTERM",
            _ = self.int.recv() => "received SIGINT",
        }
    }
}
