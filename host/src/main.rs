//! The `cordis` command line: check, run and inspect a composition.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use cordis_host::diag::Diagnostics;
use cordis_host::plan::{Plan, Provider};
use cordis_host::registry::Registry;
use cordis_host::Host;
use tracing_subscriber::EnvFilter;

/// A plugin host for AI coding-agent tools.
#[derive(Parser)]
#[command(name = "cordis", version, about)]
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
    /// else ~/.local/state/cordis].
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
    Check,
    /// Load the composition and serve until SIGINT/SIGTERM.
    Run,
    /// Apply the composition and print the service registry.
    Services,
    /// Apply the composition and list the registered tools with their input schemas.
    Tools,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let state_dir = cordis_host::sessions::default_state_dir(cli.state_dir.as_deref());
    let host = Host::new(&cli.manifest, &cli.plugin_path, &state_dir, cli.verbose);
    let outcome = match cli.command {
        Command::Check => check(&host),
        Command::Run => run(&host),
        Command::Services => services(&host),
        Command::Tools => tools(&host),
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

fn check(host: &Host) -> anyhow::Result<ExitCode> {
    let plan = host.plan()?;
    print!("{}", describe_plan(&plan));
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

fn services(host: &Host) -> anyhow::Result<ExitCode> {
    let (_plan, registry) = host.start()?;
    print!("{}", describe_registry(&registry));
    Ok(ExitCode::SUCCESS)
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
            serde_json::json!({
                "name": t.decl.name.as_str(),
                "description": t.decl.description.as_str(),
                "inputSchema": serde_json::from_str::<serde_json::Value>(&t.decl.input_schema)
                    .unwrap_or(serde_json::Value::Null),
                "entry": t.entry,
            })
        })
        .collect();
    println!("{}", serde_json::to_string_pretty(&list)?);
    Ok(ExitCode::SUCCESS)
}

fn run(host: &Host) -> anyhow::Result<ExitCode> {
    let (plan, mut registry) = host.start()?;
    let plugins: Vec<String> = plan
        .entries
        .iter()
        .map(|p| format!("{} ({})", p.entry.id, p.library.meta.version))
        .collect();
    tracing::info!(
        "cordis {} running {}: plugins: {}; services: {}; tools: {}",
        env!("CARGO_PKG_VERSION"),
        plan.file.display(),
        if plugins.is_empty() {
            "-".to_string()
        } else {
            plugins.join(", ")
        },
        registry
            .services
            .keys()
            .cloned()
            .collect::<Vec<_>>()
            .join(", "),
        tool_names(&registry)
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("failed to start the async runtime")?;
    let signal = runtime.block_on(wait_for_shutdown())?;
    tracing::info!("received {signal}; disposing");
    registry.dispose_all();
    Ok(ExitCode::SUCCESS)
}

async fn wait_for_shutdown() -> anyhow::Result<&'static str> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("failed to watch SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("failed to watch SIGINT")?;
    Ok(tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    })
}
