//! The `cordis` command line: check, run and inspect a composition.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory as _, Parser, Subcommand};
use cordis_engine::Diagnostics;
use cordis_engine::Host;
use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

mod commands;

use commands::Format;

/// A plugin host for AI coding-agent tools.
#[derive(Parser)]
#[command(name = "cordis", version)]
struct Cli {
    /// The manifest.
    #[arg(
        short = 'c',
        long = "config",
        global = true,
        default_value = "cordis.yml"
    )]
    manifest: PathBuf,
    /// A directory to search for plugin libraries first (repeatable).
    #[arg(long = "plugin-path", global = true)]
    plugin_path: Vec<PathBuf>,
    /// Where session logs live [default: $CORDIS_STATE_DIR, else $XDG_STATE_HOME/cordis,
    /// else ~/.local/state/cordis; never guessed: with none of them set, commands that
    /// keep state fail].
    #[arg(long, global = true)]
    state_dir: Option<PathBuf>,
    /// Show full reports (e.g. abi_stable's layout report on an ABI mismatch).
    #[arg(short, long, global = true)]
    verbose: bool,
    /// How log lines are written to stderr: `text` for people, or `json`: one object per
    /// line with `timestamp`, `level`, `target`, `message` and the event's fields at the top
    /// level (a reload: `event: "reload"` and its `outcome`).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

/// How log lines are written.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Validate the composition and print the plan, without applying it.
    Check {
        /// `human` (cargo-style, with the plan) or `json` (diagnostics for editors and CI).
        #[arg(long, value_enum, default_value_t = Format::Human)]
        format: Format,
        /// Explain a diagnostic code (e.g. `missing-service`) or a runtime error code (e.g.
        /// `FS_SANDBOX_DENIED`) instead of checking; without a code, list every code.
        #[arg(long, value_name = "CODE", num_args = 0..=1, default_missing_value = "")]
        explain: Option<String>,
    },
    /// Generate `schemas/` (each plugin's config schema and the manifest schema).
    Schema(commands::schema::SchemaArgs),
    /// Check that this host can run the composition as configured: each layer of the
    /// confinement tried for real (Landlock, user namespaces and their loopback, seccomp,
    /// cgroups, a confined `true`), the state directory, the plugin search path, the HTTP
    /// token source; ok, MISSING, degraded or not needed, each with its fix (exit 1 when
    /// something needed is missing)
    Doctor {
        /// `human` or `json` (`{"manifest", "runs", "checks": [{"check", "status", "detail", "fix"}]}`)
        #[arg(long, value_enum, default_value_t = Format::Human)]
        format: Format,
    },
    /// Load the composition and serve its tools over MCP on stdio until the client
    /// disconnects or SIGINT/SIGTERM; reload changed plugins and cordis.yml while serving.
    Run(Box<commands::run::RunArgs>),
    /// Apply the composition and print the service registry, then the entries and library
    /// generations of every running `cordis run` serving the same manifest.
    Services,
    /// Apply the composition and list the registered tools with their input schemas.
    Tools,
    /// Run one tool call in a session and print the tool's text (exit 0: success result,
    /// 1: error result such as a sandbox denial, 2: usage or host error).
    Call(commands::call::CallArgs),
    /// List and answer the escalations waiting for a person in the running hosts (for
    /// clients that cannot ask one themselves).
    #[command(subcommand)]
    Approvals(commands::approvals::ApprovalsCommand),
    /// Create, inspect and switch sessions.
    #[command(subcommand)]
    Session(commands::session::SessionCommand),
    /// Scaffold a plugin crate that builds and loads as it is (inside a cargo workspace, a
    /// member of it).
    New {
        /// The plugin's crate name: lowercase letters, digits and `-`, e.g. `my-plugin`.
        name: String,
        /// The crate directory to create (must not exist or be empty) [default: ./NAME].
        #[arg(long)]
        path: Option<PathBuf>,
        /// The `cordis-sdk` crate directory to depend on [default: the SDK this cordis
        /// was built from, else `cordis-sdk` and `cordis-test` of this version from the
        /// registry].
        #[arg(long)]
        sdk_path: Option<PathBuf>,
    },
    /// Install, list and remove plugin libraries.
    #[command(subcommand)]
    Plugin(commands::plugin::PluginCommand),
    /// Print a shell completion script, e.g. `cordis completions bash >
    /// ~/.local/share/bash-completion/completions/cordis`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff), e.g. `cordis man | man -l -`.
    #[command(hide = true)]
    Man,
}

fn main() -> ExitCode {
    if std::env::args_os().nth(1).as_deref() == Some(cordis_engine::ISOLATED_CHILD_ARG.as_ref()) {
        // An isolated entry's process, started by a host (hidden; see `isolate:`). It is
        // confined before it loads anything, while it has a single thread.
        let has = |arg: &str| std::env::args_os().any(|a| a == arg);
        let (no_writes, no_network, no_tracing) = (
            has(cordis_engine::ISOLATED_NO_WRITES_ARG),
            has(cordis_engine::ISOLATED_NO_NETWORK_ARG),
            has(cordis_engine::ISOLATED_NO_TRACING_ARG),
        );
        let confined = (|| {
            if no_writes {
                cordis_cli::isolated::forbid_writes()?;
            }
            if no_tracing || no_network {
                cordis_cli::isolated::confine_syscalls(no_network)?;
            }
            Ok::<(), String>(())
        })();
        if let Err(e) = confined {
            eprintln!("error: the isolated process cannot be confined: {e}; it does not run");
            return ExitCode::from(70);
        }
        cordis_engine::isolated_child_main();
    }
    let cli = Cli::parse();
    // `cordis run` logs what cordis and its plugins do at INFO; other libraries only warn
    // (their INFO lines, e.g. the file watcher's, are noise to an operator). `RUST_LOG`
    // replaces this.
    let default_filter = match cli.command {
        Command::Run(_) => "warn,cordis=info,cordis_cli=info,cordis_engine=info,plugin=info",
        _ => "warn",
    };
    let logs = tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter)),
        )
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Text => logs.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => logs
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .init(),
    }
    let keeps_state = !matches!(
        cli.command,
        Command::Check { .. }
            | Command::Doctor { .. }
            | Command::Schema(_)
            | Command::New { .. }
            | Command::Plugin(_)
            | Command::Completions { .. }
            | Command::Man
    );
    let state_dir = match cordis_engine::default_state_dir(cli.state_dir.as_deref()) {
        Some(dir) => dir,
        None if keeps_state => {
            eprintln!("error: {}", cordis_engine::NO_STATE_DIR);
            return ExitCode::FAILURE;
        }
        None => PathBuf::new(),
    };
    let host = if matches!(cli.command, Command::Session(_)) {
        // Session commands apply the composition in the session's root (see `session`):
        // every path given relative to where the command runs is made absolute first.
        let absolute = |p: &std::path::Path| std::path::absolute(p).unwrap_or(p.to_path_buf());
        let plugin_path: Vec<PathBuf> = cli.plugin_path.iter().map(|p| absolute(p)).collect();
        let state_dir = if state_dir.as_os_str().is_empty() {
            state_dir.clone()
        } else {
            absolute(&state_dir)
        };
        Host::new(
            &absolute(&cli.manifest),
            &plugin_path,
            &state_dir,
            cli.verbose,
        )
    } else {
        Host::new(&cli.manifest, &cli.plugin_path, &state_dir, cli.verbose)
    };
    let mut host = host;
    // An isolated entry runs in this very binary, re-executed (even if it was replaced on
    // disk since it started).
    let exe = PathBuf::from("/proc/self/exe");
    match (exe.exists(), std::env::current_exe()) {
        (true, _) => host.isolate_with(exe),
        (false, Ok(exe)) => host.isolate_with(exe),
        (false, Err(_)) => {}
    }
    let outcome = match cli.command {
        Command::Check {
            explain: Some(code),
            ..
        } => commands::check::explain(&code),
        Command::Check { format, .. } => commands::check::check(&host, format),
        Command::Schema(args) => commands::schema::schema(&host, args),
        Command::Doctor { format } => commands::doctor::doctor(
            &host,
            cordis_engine::default_state_dir(cli.state_dir.as_deref()),
            format,
        ),
        Command::Run(args) => commands::run::run(host, &state_dir, *args),
        Command::Services => commands::services::services(&host, &state_dir),
        Command::Tools => commands::tools::tools(&host),
        Command::Call(args) => return commands::call::call(host, args),
        Command::Session(cmd) => commands::session::session(host, cmd),
        Command::Approvals(cmd) => commands::approvals::approvals(&state_dir, cmd),
        Command::New {
            name,
            path,
            sdk_path,
        } => commands::new::new_plugin(name, path, sdk_path),
        Command::Plugin(cmd) => commands::plugin::plugin(&host, cmd),
        Command::Completions { shell } => {
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "cordis", &mut out);
            cordis_cli::plugins::print(&String::from_utf8_lossy(&out));
            Ok(ExitCode::SUCCESS)
        }
        Command::Man => {
            let mut out = Vec::new();
            clap_mangen::Man::new(Cli::command())
                .render(&mut out)
                .map(|()| {
                    cordis_cli::plugins::print(&String::from_utf8_lossy(&out));
                    ExitCode::SUCCESS
                })
                .map_err(anyhow::Error::from)
        }
    };
    match outcome {
        Ok(code) => code,
        Err(e) => {
            match e.downcast_ref::<Diagnostics>() {
                Some(d) => eprintln!("{d}"),
                None => eprintln!("error: {e:#}"),
            }
            ExitCode::FAILURE
        }
    }
}
