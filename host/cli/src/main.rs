//! The `cordis` command line: check, run and inspect a composition.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use clap::{CommandFactory as _, Parser, Subcommand};
use cordis_cli::http::{serve_http, HttpOptions};
use cordis_cli::mcp::{serve_stdio_with, McpOptions, ToolListNotifier};
use cordis_cli::status::{self, HostStatus};
use cordis_cli::watch::Quiet;
use cordis_engine::diag::Diagnostics;
use cordis_engine::loader::Copies;
use cordis_engine::plan::{Plan, Provider};
use cordis_engine::registry::Registry;
use cordis_engine::runtime::Runtime;
use cordis_engine::sessions::Origin;
use cordis_engine::Host;
use cordis_sdk::host::{ApprovalOutcome, ApprovalRequest};
use cordis_sdk::CallContext;
use dsh_sandbox::{
    ResolveArgs, SandboxMode, SandboxPolicy as _, SandboxPolicyClient, SetModeArgs, SANDBOX_POLICY,
};
use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

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
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Validate the composition and print the plan, without applying it.
    Check {
        /// `human` (cargo-style, with the plan) or `json` (diagnostics for editors and CI).
        #[arg(long, value_enum, default_value_t = Format::Human)]
        format: Format,
        /// Explain a diagnostic code (e.g. `missing-service`) instead of checking; without
        /// a code, list every code.
        #[arg(long, value_name = "CODE", num_args = 0..=1, default_missing_value = "")]
        explain: Option<String>,
    },
    /// Generate `schemas/` (each plugin's config schema and the manifest schema).
    Schema(SchemaArgs),
    /// Load the composition and serve its tools over MCP on stdio until the client
    /// disconnects or SIGINT/SIGTERM; reload changed plugins and cordis.yml while serving.
    Run(RunArgs),
    /// Apply the composition and print the service registry, then the entries and library
    /// generations of every running `cordis run` serving the same manifest.
    Services,
    /// Apply the composition and list the registered tools with their input schemas.
    Tools,
    /// Run one tool call in a session and print the tool's text (exit 0: success result,
    /// 1: error result such as a sandbox denial, 2: usage or host error).
    Call(CallArgs),
    /// Create, inspect and switch sessions.
    #[command(subcommand)]
    Session(SessionCommand),
    /// Scaffold a plugin crate (outside any workspace) that builds and loads as it is.
    New {
        /// The plugin's crate name: lowercase letters, digits and `-`, e.g. `my-plugin`.
        name: String,
        /// The crate directory to create (must not exist or be empty) [default: ./NAME].
        #[arg(long)]
        path: Option<PathBuf>,
        /// The `cordis-sdk` crate directory to depend on [default: the SDK this cordis
        /// was built from].
        #[arg(long)]
        sdk_path: Option<PathBuf>,
    },
    /// Install, list and remove plugin libraries.
    #[command(subcommand)]
    Plugin(PluginCommand),
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

#[derive(Subcommand)]
enum PluginCommand {
    /// Check a plugin library (or build a plugin crate in release and check its library),
    /// copy it into the user plugin directory and print the cordis.yml entry to add.
    Install {
        /// A built library (`lib<name>.so`) or a plugin crate's directory.
        source: PathBuf,
        /// Install here instead [default: $XDG_DATA_HOME/cordis/plugins, else
        /// ~/.local/share/cordis/plugins].
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// List every plugin library on the search path, in search order, with its version,
    /// SDK version, services, tools and file; a file hidden by an earlier one of the same
    /// name is marked shadowed.
    List {
        /// `human` (a table) or `json`.
        #[arg(long, value_enum, default_value_t = Format::Human)]
        format: Format,
    },
    /// Remove a plugin from the user plugin directory.
    Remove {
        /// The plugin's name (as in cordis.yml; a scope is ignored).
        name: String,
        /// Remove from here instead of the user plugin directory.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

#[derive(clap::Args)]
struct RunArgs {
    /// Do not watch cordis.yml and the plugin libraries for changes.
    #[arg(long, conflicts_with = "dev")]
    no_watch: bool,
    /// Also watch the sources of the cargo project cordis.yml lives in, run `cargo build`
    /// for the loaded plugins when one changes, and reload when the build finishes.
    #[arg(long)]
    dev: bool,
    /// Wait this long (milliseconds) after a change to cordis.yml or a library that cargo
    /// is not building before reloading [default: 30 for cordis.yml, 50 for a library;
    /// a library cargo is building waits for the build to finish instead].
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
    /// On SIGTERM or SIGINT, give the calls in flight this many seconds to finish before
    /// they are cancelled (a running command is killed).
    #[arg(long, value_name = "SECS", default_value_t = 10)]
    shutdown_timeout: u64,
}

/// `--instance`: a name session ids may start with.
fn instance_name(name: &str) -> Result<String, String> {
    cordis_cli::http::sessions::check_instance(name).map(|()| name.to_string())
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Format {
    Human,
    Json,
}

#[derive(clap::Args)]
struct SchemaArgs {
    /// Write the files (atomically; stale schema files are removed).
    #[arg(long, conflicts_with = "check")]
    write: bool,
    /// Fail when the files on disk differ from what would be generated.
    #[arg(long)]
    check: bool,
    /// The directory.
    #[arg(long, default_value = "schemas")]
    out: PathBuf,
    /// The plugins to generate for (found in the plugin search path).
    #[arg(required = true)]
    plugins: Vec<String>,
}

#[derive(clap::Args)]
struct CallArgs {
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

#[derive(Subcommand)]
enum SessionCommand {
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
fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    // `cordis run` logs what cordis and its plugins do at INFO; other libraries only warn
    // (their INFO lines, e.g. the file watcher's, are noise to an operator). `RUST_LOG`
    // replaces this.
    let default_filter = match cli.command {
        Command::Run(_) => "warn,cordis=info,cordis_cli=info,cordis_engine=info,plugin=info",
        _ => "warn",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter)),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let keeps_state = !matches!(
        cli.command,
        Command::Check { .. }
            | Command::Schema(_)
            | Command::New { .. }
            | Command::Plugin(_)
            | Command::Completions { .. }
            | Command::Man
    );
    let state_dir = match cordis_engine::sessions::default_state_dir(cli.state_dir.as_deref()) {
        Some(dir) => dir,
        None if keeps_state => {
            eprintln!("error: {}", cordis_engine::sessions::NO_STATE_DIR);
            return ExitCode::FAILURE;
        }
        None => PathBuf::new(),
    };
    let host = Host::new(&cli.manifest, &cli.plugin_path, &state_dir, cli.verbose);
    let outcome = match cli.command {
        Command::Check {
            explain: Some(code),
            ..
        } => explain(&code),
        Command::Check { format, .. } => check(&host, format),
        Command::Schema(args) => schema(&host, args),
        Command::Run(args) => run(host, &state_dir, args),
        Command::Services => services(&host, &state_dir),
        Command::Tools => tools(&host),
        Command::Call(args) => return call(host, args),
        Command::Session(cmd) => session(host, cmd),
        Command::New {
            name,
            path,
            sdk_path,
        } => new_plugin(name, path, sdk_path),
        Command::Plugin(cmd) => plugin(&host, cmd),
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

/// The directory `cordis plugin install|remove` works in.
fn plugin_dir(flag: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    flag.or_else(|| cordis_engine::loader::user_plugin_dir(|name| std::env::var_os(name)))
        .ok_or_else(|| {
            anyhow::anyhow!(
                "no user plugin directory: neither XDG_DATA_HOME nor HOME is set (absolute); \
                 set one, or pass `--dir DIR`"
            )
        })
}

fn plugin(host: &Host, cmd: PluginCommand) -> anyhow::Result<ExitCode> {
    use cordis_cli::plugins;
    let search = &host.options.search;
    match cmd {
        PluginCommand::Install { source, dir } => {
            let installed = plugins::install(&source, &plugin_dir(dir)?)?;
            plugins::print(&plugins::describe_install(&installed, search));
        }
        PluginCommand::List { format } => {
            let listed = plugins::list(search);
            let text = match format {
                Format::Human => plugins::render_list(search, &listed),
                Format::Json => serde_json::to_string_pretty(&listed)? + "\n",
            };
            plugins::print(&text);
        }
        PluginCommand::Remove { name, dir } => {
            let removed = plugins::remove(&name, &plugin_dir(dir)?, search)?;
            let mut text = format!("removed {}\n", removed.path.display());
            if let Some(found) = removed.still_found {
                text += &format!(
                    "note: the search path still finds `{name}` at {}\n",
                    found.display()
                );
            }
            plugins::print(&text);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn explain(code: &str) -> anyhow::Result<ExitCode> {
    use cordis_engine::diag::{self, CODES};
    let line = |c: &diag::Code| format!("{} ({}): {}", c.name, c.severity.as_str(), c.explanation);
    if code.is_empty() {
        for c in CODES {
            println!("{}", line(c));
        }
        return Ok(ExitCode::SUCCESS);
    }
    match diag::code(code) {
        Some(c) => {
            println!("{}", line(c));
            Ok(ExitCode::SUCCESS)
        }
        None => {
            let names: Vec<&str> = CODES.iter().map(|c| c.name).collect();
            let hint = match cordis_engine::manifest::closest(code, &names) {
                Some(name) => format!("did you mean `{name}`?"),
                None => "`cordis check --explain` lists every code".to_string(),
            };
            anyhow::bail!("no diagnostic code `{code}`; {hint}")
        }
    }
}

fn check(host: &Host, format: Format) -> anyhow::Result<ExitCode> {
    let outcome = host.plan();
    if format == Format::Json {
        let items = match &outcome {
            Ok(_) => serde_json::json!([]),
            Err(d) => d.to_json(),
        };
        println!("{}", serde_json::to_string_pretty(&items)?);
        return Ok(if outcome.is_ok() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        });
    }
    let plan = outcome?;
    print!("{}", describe_plan(&plan));
    // The process ends now: unloading every library first would only cost time.
    std::mem::forget(plan);
    Ok(ExitCode::SUCCESS)
}

fn schema(host: &Host, args: SchemaArgs) -> anyhow::Result<ExitCode> {
    let mut metas = Vec::new();
    for name in &args.plugins {
        let path = host.options.search.find(name).map_err(|tried| {
            anyhow::anyhow!(
                "no library for plugin `{name}` (looked for {}); build it first",
                tried
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })?;
        let lib = cordis_engine::loader::Library::load(&path)
            .map_err(|e| anyhow::anyhow!("cannot load {}: {e}", path.display()))?;
        metas.push(lib.meta.clone());
    }
    metas.sort_by(|a, b| a.name.cmp(&b.name));
    let files = cordis_engine::schema::generate(&metas);
    if args.check {
        let stale = cordis_engine::schema::check(&args.out, &files);
        if stale.is_empty() {
            println!(
                "{}: {} schema files up to date",
                args.out.display(),
                files.len()
            );
            return Ok(ExitCode::SUCCESS);
        }
        for p in &stale {
            eprintln!("error: {} is stale", p.display());
        }
        eprintln!("help: regenerate with `cordis schema --write` (`cargo xtask schema`)");
        return Ok(ExitCode::FAILURE);
    }
    if args.write {
        let written = cordis_engine::schema::write(&args.out, &files)
            .with_context(|| format!("failed to write {}", args.out.display()))?;
        println!("{}: {} files changed", args.out.display(), written.len());
    } else {
        for (name, text) in &files {
            println!("// {name}\n{text}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn describe_plan(plan: &Plan) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}: valid composition, {} entr{} in apply order",
        plan.file.display(),
        plan.entries.len(),
        if plan.entries.len() == 1 { "y" } else { "ies" }
    );
    for (i, p) in plan.entries.iter().enumerate() {
        let m = &p.library.meta;
        let _ = writeln!(
            out,
            "  {}. {} (plugin {} {}, line {})",
            i + 1,
            p.entry.id,
            m.name,
            m.version,
            p.entry.pos.line
        );
        let _ = writeln!(out, "       file     {}", p.library.path.display());
        for s in &m.provides {
            let _ = writeln!(
                out,
                "       provides {} ({} v{})",
                s.name, s.interface, s.version
            );
        }
        for inj in &m.injects {
            let from = match plan.providers.get(&inj.name) {
                Some(Provider::Host) => "the host".to_string(),
                Some(Provider::Entry(id)) => format!("entry {id}"),
                None => "nothing (optional, absent)".to_string(),
            };
            let _ = writeln!(
                out,
                "       injects  {}{} <- {from}",
                inj.name,
                if inj.optional { " (optional)" } else { "" }
            );
        }
    }
    for d in &plan.disabled {
        let _ = writeln!(out, "  -  {} (disabled, line {})", d.id, d.pos.line);
    }
    out
}

/// The composition `cordis.yml` describes now, then the generations every running host
/// serving it is on (those can differ: a host keeps its last valid composition).
fn services(host: &Host, state_dir: &std::path::Path) -> anyhow::Result<ExitCode> {
    let planned = host.start();
    if let Ok((_plan, registry)) = &planned {
        print!("{}", describe_registry(registry));
    }
    let running = HostStatus::live(state_dir, &host.manifest);
    if running.is_empty() {
        println!("running: no `cordis run` is serving this manifest");
    }
    for status in running {
        print!("{status}");
    }
    planned.map(|_| ExitCode::SUCCESS)
}

fn describe_registry(registry: &Registry) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    for (name, s) in &registry.services {
        let who = match (&s.provider, &s.plugin) {
            (Provider::Host, _) => "host".to_string(),
            (Provider::Entry(id), Some(plugin)) => format!("entry {id} (plugin {plugin})"),
            (Provider::Entry(id), None) => format!("entry {id}"),
        };
        let consumers = if s.consumers.is_empty() {
            "-".to_string()
        } else {
            s.consumers.join(", ")
        };
        let _ = writeln!(
            out,
            "{name}: {} v{} provided by {who}; consumers: {consumers}",
            s.spec.interface, s.spec.version
        );
    }
    for (entry, service) in &registry.missing_optional {
        let _ = writeln!(out, "{service}: absent (optional for entry {entry})");
    }
    let _ = writeln!(out, "tools: {}", tool_names(registry));
    out
}

fn tool_names(registry: &Registry) -> String {
    if registry.tools.is_empty() {
        "-".to_string()
    } else {
        registry
            .tools
            .keys()
            .cloned()
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn tools(host: &Host) -> anyhow::Result<ExitCode> {
    let (_plan, registry) = host.start()?;
    let list: Vec<serde_json::Value> = registry
        .tools
        .values()
        .map(|t| {
            let mut tool = serde_json::json!({
                "name": t.decl.name.as_str(),
                "description": t.decl.description.as_str(),
                "inputSchema": serde_json::from_str::<serde_json::Value>(&t.decl.input_schema)
                    .unwrap_or(serde_json::Value::Null),
                "entry": t.entry,
            });
            // `annotations` and `outputSchema`, when the plugin declared them.
            for (key, value) in &t.extras {
                tool[key] = value.clone();
            }
            tool
        })
        .collect();
    println!("{}", serde_json::to_string_pretty(&list)?);
    Ok(ExitCode::SUCCESS)
}

fn run(mut host: Host, state_dir: &std::path::Path, args: RunArgs) -> anyhow::Result<ExitCode> {
    let copies_dir = status::run_dir(state_dir, std::process::id());
    let manifest = host.manifest.clone();
    if !args.no_watch {
        // Every generation loads from its own copy, so a rebuilt file is a new library.
        host.options.copies = Some(std::sync::Arc::new(Copies::new(&copies_dir)));
    }
    // With `--dev`, the libraries are brought up to date with the sources first.
    let project = if args.dev {
        let project = cordis_cli::dev::Projects::discover(&manifest, &host.options.search)
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
        host.protection.add(trusted);
        if !project.build_for_manifest(&manifest, &host.options.search) {
            tracing::error!("dev: the first build failed; starting with the libraries on disk");
        }
        Some(project)
    } else {
        None
    };
    // A session to resume must exist before anything is applied.
    if let Some(id) = &args.session {
        host.sessions
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
    let mut status = HostStatus::new(&manifest);
    status.publish(&runtime.composition(), state_dir);
    let status = Mutex::new(status);
    let notifier = ToolListNotifier::default();
    {
        let notifier = notifier.clone();
        let (weak, state_dir) = (Arc::downgrade(&runtime), state_dir.to_path_buf());
        runtime.on_reloaded(move |report| {
            if report.tools_changed {
                notifier.notify_tools_changed();
            }
            let Some(runtime) = weak.upgrade() else {
                return;
            };
            let mut status = status.lock().unwrap_or_else(|e| e.into_inner());
            status.reloads += 1;
            status.publish(&runtime.composition(), &state_dir);
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
        runtime.shutdown();
        let _ = std::fs::remove_dir_all(&copies_dir);
        return Err(e);
    }
    // On stdio, one connection on one thread: the protocol's pipes, rmcp and the calls'
    // completions never hand work between runtime threads. Over HTTP, many connections
    // on every core. Tool calls run on the blocking pool either way.
    let tokio = match args.http {
        None => tokio::runtime::Builder::new_current_thread(),
        Some(_) => tokio::runtime::Builder::new_multi_thread(),
    }
    .enable_all()
    .build()
    .context("failed to start the async runtime")?;
    let options = McpOptions {
        session: args.session,
        cwd: args.cwd,
        allow_roots: args.allow_root,
    };
    let deadline = std::time::Duration::from_secs(args.shutdown_timeout);
    let ended = tokio.block_on(async {
        // Signals are handled from here on; only then is the host announced as running.
        let mut signals = Signals::install()?;
        {
            let c = runtime.composition();
            let plugins: Vec<String> = c
                .plan
                .entries
                .iter()
                .map(|p| format!("{} ({})", p.entry.id, p.library.meta.version))
                .collect();
            tracing::info!(
                "cordis {} running {}: plugins: {}; services: {}; tools: {}",
                env!("CARGO_PKG_VERSION"),
                c.plan.file.display(),
                if plugins.is_empty() {
                    "-".to_string()
                } else {
                    plugins.join(", ")
                },
                c.registry
                    .services
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", "),
                tool_names(&c.registry)
            );
        }
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
                let http = HttpOptions {
                    addr,
                    token: std::env::var(cordis_cli::http::TOKEN_ENV).ok(),
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
    runtime.shutdown();
    let _ = std::fs::remove_dir_all(&copies_dir);
    ended.map(|_| ExitCode::SUCCESS)
}

/// SIGTERM and SIGINT, handled from when they are installed.
struct Signals {
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

fn call(host: Host, args: CallArgs) -> ExitCode {
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
fn ask_on_terminal(request: &ApprovalRequest) -> ApprovalOutcome {
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

fn session(host: Host, cmd: SessionCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        SessionCommand::New { cwd } => {
            let cwd = match cwd {
                Some(c) => c,
                None => std::env::current_dir().context("cannot read the current directory")?,
            };
            let info = host.sessions.create(&cwd)?;
            println!("{}", info.id);
        }
        SessionCommand::List => {
            for id in host.sessions.list() {
                println!("{id}");
            }
        }
        SessionCommand::Show { id } => {
            let info = host.sessions.get(&id)?;
            let events = host.sessions.events(&id, None)?;
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
            host.sessions.get(&id)?;
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
            let removed = host.sessions.prune(older_than)?;
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

fn new_plugin(
    name: String,
    path: Option<PathBuf>,
    sdk_path: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    use cordis_cli::scaffold::{entry, scaffold, NewPlugin, BUILT_SDK_PATH};
    let made = scaffold(&NewPlugin {
        dir: path.unwrap_or_else(|| PathBuf::from(&name)),
        sdk: sdk_path.unwrap_or_else(|| PathBuf::from(BUILT_SDK_PATH)),
        target_dir: std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from),
        name: name.clone(),
    })?;
    let dir = made.dir.display();
    println!(
        "created plugin crate `{name}` in {dir}: {}",
        made.files.join(", ")
    );
    println!(
        "\nto compose it elsewhere, add this entry to that cordis.yml:\n\n{}",
        entry(&name, &made.library.display().to_string())
    );
    println!(
        "next:\n  cd {dir}\n  cargo build\n  cordis check\n  cordis call {} '{{\"name\": \"Ada\"}}'\n  cargo test",
        made.tool
    );
    Ok(ExitCode::SUCCESS)
}
