//! A running composition as the front-ends see it: the tool list, tool calls in a session,
//! and the model context for a session. Calls take a snapshot of the tool under a short
//! lock and run without it, so concurrent calls never wait for each other; the snapshot
//! keeps the tool's library loaded until the call returns.

use std::sync::{Arc, Mutex, MutexGuard};

use abi_stable::std_types::RStr;
use cordis_sdk::host::{ModelContextClient, MODEL_CONTEXT_INTERFACE};
use cordis_sdk::{CallContext, Service, ToolResult};

use crate::plan::Plan;
use crate::registry::{Registry, UnknownTool};
use crate::Host;

/// A tool as a front-end lists it.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolInfo {
    /// Unique name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// JSON Schema of its input.
    pub input_schema: serde_json::Value,
}

/// The applied composition.
pub struct Composition {
    /// The plan it was applied from.
    pub plan: Plan,
    /// Its services and tools.
    pub registry: Registry,
}

/// A host with its composition applied.
pub struct Runtime {
    /// The host (sessions, approvals, options).
    pub host: Host,
    composition: Mutex<Composition>,
}

impl Runtime {
    /// Plans and applies `host`'s manifest.
    pub fn start(host: Host) -> anyhow::Result<Arc<Runtime>> {
        let (plan, registry) = host.start()?;
        Ok(Arc::new(Runtime {
            host,
            composition: Mutex::new(Composition { plan, registry }),
        }))
    }

    /// The composition (held briefly: never across a tool call).
    pub fn composition(&self) -> MutexGuard<'_, Composition> {
        self.composition.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every registered tool, sorted by name.
    pub fn tools(&self) -> Vec<ToolInfo> {
        self.composition()
            .registry
            .tools
            .values()
            .map(|t| ToolInfo {
                name: t.decl.name.to_string(),
                description: t.decl.description.to_string(),
                input_schema: serde_json::from_str(&t.decl.input_schema)
                    .unwrap_or_else(|_| serde_json::json!({ "type": "object" })),
            })
            .collect()
    }

    /// Calls tool `name` in the session of `call`.
    pub fn call_tool(
        &self,
        name: &str,
        call: &CallContext,
        args: &serde_json::Value,
    ) -> Result<ToolResult, UnknownTool> {
        let slot = {
            let c = self.composition();
            c.registry
                .tools
                .get(name)
                .cloned()
                .ok_or_else(|| UnknownTool {
                    name: name.to_string(),
                    known: c.registry.tools.keys().cloned().collect(),
                })?
        };
        Ok(slot.call(call, args))
    }

    /// The model context for a session: every non-empty contribution of a service that
    /// implements the model-context interface, in service-name order, one per paragraph.
    pub fn model_context(&self, session: Option<&str>) -> String {
        let providers: Vec<(String, Service)> = {
            let c = self.composition();
            c.registry
                .services
                .iter()
                .filter(|(_, s)| s.spec.interface == MODEL_CONTEXT_INTERFACE)
                .map(|(name, s)| (name.clone(), s.handle.clone()))
                .filter_map(|(name, h)| {
                    Service::checked::<ModelContextClient>(&name, h)
                        .ok()
                        .map(|c| (name, c.service().clone()))
                })
                .collect()
        };
        let mut parts = Vec::new();
        for (name, service) in providers {
            let arg = serde_json::to_string(&session).unwrap_or_else(|_| "null".into());
            match service.call_raw("context", &arg) {
                Ok(raw) => match serde_json::from_str::<String>(&raw) {
                    Ok(text) if !text.is_empty() => parts.push(text),
                    Ok(_) => {}
                    Err(e) => tracing::warn!("context `{name}` returned malformed text: {e}"),
                },
                Err(e) => tracing::warn!("context `{name}` failed: {e}"),
            }
        }
        parts.join("\n\n")
    }

    /// Disposes the composition (reverse order).
    pub fn shutdown(&self) {
        self.composition().registry.dispose_all();
    }

    /// Calls method `method` of service `name` with raw JSON, for host commands that
    /// address a plugin service by its registry name (e.g. `cordis session set-mode`).
    pub fn call_service(
        &self,
        name: &str,
        method: &str,
        args: &serde_json::Value,
    ) -> anyhow::Result<serde_json::Value> {
        let handle = {
            let c = self.composition();
            c.registry
                .services
                .get(name)
                .map(|s| s.handle.clone())
                .ok_or_else(|| anyhow::anyhow!("no service `{name}` in this composition; add the plugin that provides it to cordis.yml"))?
        };
        let out = abi_stable::std_types::RResult::into_result(cordis_sdk::abi::ServiceObj::call(
            &handle,
            RStr::from(method),
            RStr::from(args.to_string().as_str()),
        ))
        .map_err(|e| anyhow::anyhow!("{}", cordis_sdk::Error::from(e)))?;
        Ok(serde_json::from_str(&out)?)
    }
}
