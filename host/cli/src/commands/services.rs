//! `cordis services`: the applied registry, service by service.

use std::process::ExitCode;

use cordis_cli::status::HostStatus;
use cordis_engine::Host;
use cordis_engine::Provider;
use cordis_engine::Registry;

use super::tools::tool_names;

/// The composition `cordis.yml` describes now, then the generations every running host
/// serving it is on (those can differ: a host keeps its last valid composition).
pub(crate) fn services(host: &Host, state_dir: &std::path::Path) -> anyhow::Result<ExitCode> {
    let planned = host.start();
    if let Ok((_plan, registry)) = &planned {
        print!("{}", describe_registry(registry));
    }
    let running = HostStatus::live(state_dir, host.manifest());
    if running.is_empty() {
        println!("running: no `cordis run` is serving this manifest");
    }
    for status in running {
        print!("{status}");
    }
    planned.map(|_| ExitCode::SUCCESS)
}

pub(crate) fn describe_registry(registry: &Registry) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    for (name, s) in &registry.services {
        let who = match (&s.provider, &s.plugin) {
            (Provider::Host, _) => "host".to_string(),
            // This process's own apply: isolated entries run in processes of their own, but
            // which, and how they do, is what a running host's status below says.
            (Provider::Entry(id), Some(plugin)) if registry.isolation(id).is_some() => {
                format!("entry {id} (plugin {plugin}, isolated)")
            }
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
