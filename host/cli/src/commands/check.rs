//! `cordis check`: validate the composition and print the plan (or `--explain CODE`, for a
//! diagnostic or a runtime error code).

use std::process::ExitCode;

use cordis_engine::Host;
use cordis_engine::{Plan, Provider};

use super::Format;

pub(crate) fn explain(code: &str) -> anyhow::Result<ExitCode> {
    use cordis_cli::codes;
    if code.is_empty() {
        print!("{}", codes::list());
        return Ok(ExitCode::SUCCESS);
    }
    match codes::explain(code) {
        Ok(text) => {
            print!("{text}");
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => anyhow::bail!(e),
    }
}

pub(crate) fn check(host: &Host, format: Format) -> anyhow::Result<ExitCode> {
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

pub(crate) fn describe_plan(plan: &Plan) -> String {
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
        if let Some(isolation) = &p.entry.isolate {
            let _ = writeln!(
                out,
                "       isolated in its own process (callTimeout {}s; {}{})",
                isolation.call_timeout.as_secs(),
                isolation
                    .memory_mib
                    .map_or(String::new(), |mib| format!("memory {mib} MiB; ")),
                cordis_engine::confinement_summary(&m.needs)
            );
        }
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
