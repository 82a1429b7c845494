//! `cordis tools`: the tools the composition serves.

use std::process::ExitCode;

use cordis_engine::Host;
use cordis_engine::Registry;

/// The registry's tool names, comma-separated (`-` for none).
pub(crate) fn tool_names(registry: &Registry) -> String {
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

pub(crate) fn tools(host: &Host) -> anyhow::Result<ExitCode> {
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
