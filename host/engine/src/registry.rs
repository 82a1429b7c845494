//! The service registry: applies a [`Plan`] in dependency order, keeps every provided
//! service by name and every registered tool, and disposes entries in reverse order.
//! It knows nothing about what the services mean.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use abi_stable::{
    sabi_trait::TD_Opaque,
    std_types::{RArc, ROption, RResult, RStr, RString},
};
use cordis_sdk::abi::{
    HostCtxObj, HostCtxObj_TO, InstanceBox, LoggerBox, LoggerObj, LoggerObj_TO, RError, ServiceBox,
    ToolBox, ToolDecl,
};
use cordis_sdk::host::{
    StructuredContent, ToolDescription, ToolExtras, ToolExtrasClient, TOOL_EXTRAS,
};
use cordis_sdk::{CallContext, InterfaceMismatch, ToolResult};
use tracing::Level;

use crate::codes;
use crate::loader::ServiceSpec;
use crate::plan::{Plan, Planned, Provider};
use crate::schema::ToolArgs;

/// A service in the registry.
pub struct ServiceSlot {
    /// The service object.
    pub handle: ServiceBox,
    /// Its interface.
    pub spec: ServiceSpec,
    /// Who provides it.
    pub provider: Provider,
    /// The plugin behind it (`None` for host services).
    pub plugin: Option<String>,
    /// Entries that inject it.
    pub consumers: Vec<String>,
}

/// A registered tool.
#[derive(Clone)]
pub struct ToolSlot {
    /// Name, description and input schema.
    pub decl: ToolDecl,
    /// The handler: called only by [`ToolSlot::call`], after the argument check.
    handle: ToolBox,
    /// What the plugin declared besides the decl (through the host's `toolExtras`):
    /// `annotations` and `outputSchema`; empty for a tool declared without them.
    pub extras: serde_json::Map<String, serde_json::Value>,
    /// Where the structured content of its calls is left.
    store: Arc<ToolExtrasStore>,
    /// Its input schema, compiled: every call's arguments are checked before it runs.
    args: Arc<ToolArgs>,
    /// The entry that registered it.
    pub entry: String,
}

impl ToolSlot {
    /// Checks `args` against the tool's input schema: every violation, placed at its
    /// argument, when they do not match (what [`ToolSlot::call`] answers without calling).
    pub fn check_args(&self, args: &serde_json::Value) -> Result<(), String> {
        self.args.check(args)
    }

    /// Runs one call: arguments that break the input schema are an `INVALID_ARGUMENT`
    /// error result and the tool does not run; a tool's own error becomes an error result
    /// naming its code.
    pub fn call(&self, call: &CallContext, args: &serde_json::Value) -> ToolResult {
        self.call_stamped(call, args, CallStamps::default())
    }

    /// [`ToolSlot::call`], telling providers what the host read of the state the call
    /// depends on as it started (so they can reuse what they derived from it).
    pub fn call_stamped(
        &self,
        call: &CallContext,
        args: &serde_json::Value,
        stamps: CallStamps,
    ) -> ToolResult {
        if let Err(violations) = self.check_args(args) {
            return ToolResult::error(format!(
                "`{}`: invalid arguments: {violations}. The tool did not run; see its input schema for the expected fields (`cordis tools` shows it). [{}]",
                self.decl.name,
                cordis_sdk::codes::INVALID_ARGUMENT
            ));
        }
        let context = serde_json::to_string(call).unwrap_or_default();
        let args = args.to_string();
        let _scope = crate::scope::enter(crate::scope::Scope::new(cordis_sdk::host::CurrentCall {
            session: Some(call.session.id.clone()),
            call_id: Some(call.call_id.clone()),
            cancel_fd: call.cancel_fd,
            progress_fd: call.progress_fd,
            session_seq: stamps.session_seq,
            composition: stamps.composition,
            ..Default::default()
        }));
        let outcome = self
            .handle
            .call(RStr::from(context.as_str()), RStr::from(args.as_str()));
        // Taken whatever the outcome, so nothing is left behind for a failed call.
        let structured = self.store.take_structured(&call.call_id);
        match outcome {
            RResult::ROk(out) => ToolResult {
                is_error: out.is_error,
                text: out.text.into(),
                structured,
            },
            RResult::RErr(e) => {
                let e = cordis_sdk::Error::from(e);
                let mut text = format!("error: {} [{}]", e.message, e.code);
                if let Some(h) = e.help {
                    text.push_str(&format!("\nhelp: {h}"));
                }
                ToolResult::error(text)
            }
        }
    }
}

/// What the host read of the state a call depends on as the call started
/// ([`cordis_sdk::host::CurrentCall::session_seq`] and
/// [`cordis_sdk::host::CurrentCall::composition`]); `None` where it did not read it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallStamps {
    /// The sequence number of the calling session's last event.
    pub session_seq: Option<u64>,
    /// The protected paths' stamp.
    pub composition: Option<u64>,
}

/// What plugins told the host's `toolExtras` service: the description of each tool about
/// to be registered, and the structured content of calls in flight. A host service rather
/// than new ABI types, so libraries built before it keep loading (abi_stable refuses a
/// library whose types have fewer fields than the host's).
#[derive(Debug, Default)]
pub struct ToolExtrasStore {
    /// Per tool name, what its plugin described right before registering it.
    pending: Mutex<HashMap<String, serde_json::Map<String, serde_json::Value>>>,
    /// Per call id, the structured content of its result.
    results: Mutex<HashMap<String, serde_json::Value>>,
}

/// The most structured results held at once (one per call in flight; more means a plugin
/// records content for calls that never come).
const MAX_HELD_RESULTS: usize = 4096;

impl ToolExtrasStore {
    fn take_pending(&self, tool: &str) -> serde_json::Map<String, serde_json::Value> {
        lock(&self.pending).remove(tool).unwrap_or_default()
    }

    fn take_structured(&self, call_id: &str) -> Option<serde_json::Value> {
        lock(&self.results).remove(call_id)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The host's `toolExtras` service over a store.
struct ToolExtrasService(Arc<ToolExtrasStore>);

impl ToolExtras for ToolExtrasService {
    fn describe(&self, description: ToolDescription) -> cordis_sdk::Result<()> {
        let ToolDescription {
            tool,
            annotations,
            output_schema,
        } = description;
        let mut extras = serde_json::Map::new();
        if let Some(annotations) = annotations {
            extras.insert("annotations".into(), serde_json::json!(annotations));
        }
        if let Some(schema) = output_schema {
            if schema.get("type").and_then(|t| t.as_str()) != Some("object") {
                return Err(cordis_sdk::Error::invalid(format!(
                    "tool `{tool}`: its output schema must describe an object (`\"type\": \"object\"`)"
                ))
                .with_help("MCP structured content is a JSON object; wrap other values in one"));
            }
            extras.insert("outputSchema".into(), schema);
        }
        lock(&self.0.pending).insert(tool, extras);
        Ok(())
    }

    fn structured(&self, content: StructuredContent) -> cordis_sdk::Result<()> {
        if !content.content.is_object() {
            return Err(cordis_sdk::Error::invalid(
                "structured content must be a JSON object",
            ));
        }
        let mut results = lock(&self.0.results);
        if results.len() >= MAX_HELD_RESULTS && !results.contains_key(&content.call_id) {
            return Err(cordis_sdk::Error::internal(format!(
                "more than {MAX_HELD_RESULTS} structured results are waiting for their calls"
            )));
        }
        results.insert(content.call_id, content.content);
        Ok(())
    }
}

/// A call named a tool nobody registered.
#[derive(Debug)]
pub struct UnknownTool {
    /// The name asked for.
    pub name: String,
    /// The registered tools.
    pub known: Vec<String>,
}

impl std::fmt::Display for UnknownTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "no tool `{}`; registered tools: {}",
            self.name,
            if self.known.is_empty() {
                "none".to_string()
            } else {
                self.known.join(", ")
            }
        )
    }
}

impl std::error::Error for UnknownTool {}

/// An applied entry.
pub(crate) struct Applied {
    /// The entry id.
    pub id: String,
    /// The planned entry it came from.
    pub planned: Planned,
    instance: Option<InstanceBox>,
    /// Its process, when it is isolated.
    isolated: Option<Arc<crate::isolate::Isolated>>,
}

/// Services and tools of an applied composition.
#[derive(Default)]
pub struct Registry {
    /// Services by name.
    pub services: BTreeMap<String, ServiceSlot>,
    /// Tools by name.
    pub tools: BTreeMap<String, Arc<ToolSlot>>,
    /// Optional injections that nothing provides: (entry, service).
    pub missing_optional: Vec<(String, String)>,
    applied: Vec<Applied>,
    tool_extras: Arc<ToolExtrasStore>,
    /// The `cordis` binary an isolated entry's process runs; without it (`cordis-test`,
    /// the benchmarks) every entry runs in-process.
    isolation_exe: Option<std::path::PathBuf>,
}

/// An entry failed to apply; everything applied before it was disposed.
#[derive(Debug)]
pub struct ApplyError {
    /// The failing entry.
    pub entry: String,
    /// Its plugin.
    pub plugin: String,
    /// Its manifest line.
    pub line: usize,
    /// What the plugin said.
    pub error: Box<cordis_sdk::Error>,
}

impl std::fmt::Display for ApplyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "entry `{}` (plugin `{}`, cordis.yml line {}) failed to apply: {} [{}]",
            self.entry, self.plugin, self.line, self.error.message, self.error.code
        )?;
        if let Some(h) = &self.error.help {
            write!(f, "\n  = help: {h}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ApplyError {}

impl Registry {
    /// A registry holding only the host's own services: those given, and `toolExtras`
    /// (what tools tell their clients, kept by the registry itself).
    pub fn with_host_services(host: Vec<(ServiceSpec, ServiceBox)>) -> Self {
        let mut reg = Registry::default();
        let extras = (
            ServiceSpec::of::<ToolExtrasClient>(TOOL_EXTRAS),
            ToolExtrasClient::serve(ToolExtrasService(reg.tool_extras.clone())),
        );
        for (spec, handle) in host.into_iter().chain([extras]) {
            reg.services.insert(
                spec.name.clone(),
                ServiceSlot {
                    handle,
                    spec,
                    provider: Provider::Host,
                    plugin: None,
                    consumers: Vec::new(),
                },
            );
        }
        reg
    }

    /// Runs every entry marked `isolate: process` in a process of its own, running `exe`
    /// (the `cordis` binary).
    pub fn isolate_with(&mut self, exe: std::path::PathBuf) {
        self.isolation_exe = Some(exe);
    }

    /// How isolated entry `id` is doing; `None` for an entry applied in-process.
    pub fn isolation(&self, id: &str) -> Option<crate::isolate::IsolationStatus> {
        self.applied
            .iter()
            .find(|a| a.id == id)
            .and_then(|a| a.isolated.as_ref())
            .map(|i| i.status())
    }

    /// Applies every entry of `plan` in order. On failure, disposes what was applied.
    pub(crate) fn apply_plan(&mut self, plan: &Plan) -> Result<(), ApplyError> {
        for planned in &plan.entries {
            if let Err(e) = self.apply_entry(planned) {
                self.dispose_all();
                return Err(e);
            }
        }
        Ok(())
    }

    /// Applies one entry (its providers must be applied already). On failure nothing of
    /// the entry stays registered.
    pub fn apply_entry(&mut self, planned: &Planned) -> Result<(), ApplyError> {
        let entry = &planned.entry;
        let meta = &planned.library.meta;
        let fail = |error: cordis_sdk::Error| ApplyError {
            entry: entry.id.clone(),
            plugin: meta.name.clone(),
            line: entry.pos.line,
            error: Box::new(error),
        };
        // An isolated entry holds the handles of the services it injects for as long as
        // its process may call them (past its disposal, until the process is gone): it
        // holds their providers' libraries as long, so no handle outlives its code.
        let providers: Vec<Arc<crate::loader::Library>> = meta
            .injects
            .iter()
            .filter_map(|inj| match &self.services.get(&inj.name)?.provider {
                Provider::Entry(id) => self
                    .applied
                    .iter()
                    .find(|a| &a.id == id)
                    .map(|a| a.planned.library.clone()),
                Provider::Host => None,
            })
            .collect();
        let mut ctx = ApplyCtx {
            registry: self,
            planned,
            provided: Vec::new(),
            tools: Vec::new(),
        };
        let config = entry.config.to_string();
        let mut isolated = None;
        let outcome = match (&entry.isolate, ctx.registry.isolation_exe.clone()) {
            (Some(isolation), Some(exe)) => {
                let mut host = HostCtxObj_TO::from_ptr(&mut ctx, TD_Opaque);
                match crate::isolate::apply(&mut host, planned, &exe, isolation, providers) {
                    Ok((instance, process)) => {
                        isolated = Some(process);
                        RResult::ROk(instance)
                    }
                    Err(e) => RResult::RErr(e.into()),
                }
            }
            (isolate, _) => {
                if isolate.is_some() {
                    tracing::warn!(
                        "entry `{}` asks for `isolate: process`; isolation belongs to the `cordis` binary, so here it runs in-process",
                        entry.id
                    );
                }
                (planned.library.module().apply())(
                    HostCtxObj_TO::from_ptr(&mut ctx, TD_Opaque),
                    RStr::from(config.as_str()),
                )
            }
        };
        let (provided, tools) = (ctx.provided, ctx.tools);
        let undo = |reg: &mut Registry| {
            for s in &provided {
                reg.services.remove(s);
            }
            for t in &tools {
                reg.tools.remove(t);
            }
        };
        let mut instance = match outcome {
            RResult::ROk(i) => i,
            RResult::RErr(e) => {
                undo(self);
                return Err(fail(e.into()));
            }
        };
        if let Some(missing) = meta.provides.iter().find(|s| !provided.contains(&s.name)) {
            let _ = instance.dispose();
            undo(self);
            return Err(fail(cordis_sdk::Error::internal(format!(
                "the plugin declares service `{}` but did not provide it in apply()",
                missing.name
            ))));
        }
        for inj in &meta.injects {
            match self.services.get_mut(&inj.name) {
                Some(slot) => slot.consumers.push(entry.id.clone()),
                None => self
                    .missing_optional
                    .push((entry.id.clone(), inj.name.clone())),
            }
        }
        tracing::debug!(entry = %entry.id, plugin = %meta.name, "applied");
        self.applied.push(Applied {
            id: entry.id.clone(),
            planned: planned.clone(),
            instance: Some(instance),
            isolated,
        });
        Ok(())
    }

    /// Disposes every applied entry in reverse order of application.
    pub(crate) fn dispose_all(&mut self) {
        while let Some(applied) = self.applied.pop() {
            self.dispose_applied(applied);
        }
    }

    /// Disposes one applied entry (its consumers must be disposed already). Returns whether
    /// it was applied.
    pub(crate) fn dispose_entry(&mut self, id: &str) -> bool {
        match self.applied.iter().position(|a| a.id == id) {
            Some(i) => {
                let applied = self.applied.remove(i);
                self.dispose_applied(applied);
                true
            }
            None => false,
        }
    }

    fn dispose_applied(&mut self, mut applied: Applied) {
        self.services
            .retain(|_, s| s.provider != Provider::Entry(applied.id.clone()));
        self.tools.retain(|_, t| t.entry != applied.id);
        for s in self.services.values_mut() {
            s.consumers.retain(|c| c != &applied.id);
        }
        self.missing_optional.retain(|(e, _)| e != &applied.id);
        if let Some(mut instance) = applied.instance.take() {
            if let RResult::RErr(e) = instance.dispose() {
                tracing::error!(entry = %applied.id, "dispose failed: {} [{}]", e.message, e.code);
            }
        }
        tracing::debug!(entry = %applied.id, "disposed");
    }

    /// Offers an applied entry a new config in place. `Ok(true)`: taken in place;
    /// `Ok(false)`: the plugin asks for a restart.
    pub(crate) fn reconfigure(
        &mut self,
        id: &str,
        config: &serde_json::Value,
    ) -> Result<bool, cordis_sdk::Error> {
        let Some(applied) = self.applied.iter_mut().find(|a| a.id == id) else {
            return Ok(false);
        };
        let Some(instance) = applied.instance.as_mut() else {
            return Ok(false);
        };
        let text = config.to_string();
        match instance.reconfigure(RStr::from(text.as_str())) {
            RResult::ROk(cordis_sdk::Reconfigured::Applied) => {
                applied.planned.entry.config = config.clone();
                Ok(true)
            }
            RResult::ROk(cordis_sdk::Reconfigured::Restart) => Ok(false),
            RResult::RErr(e) => Err(e.into()),
        }
    }

    /// Calls tool `name` in a session. A tool's own error becomes an error result naming
    /// its code; only an unknown tool is an `Err`.
    pub fn call_tool(
        &self,
        name: &str,
        call: &CallContext,
        args: &serde_json::Value,
    ) -> Result<ToolResult, UnknownTool> {
        Ok(self.tool(name)?.call(call, args))
    }

    /// The tool registered as `name`.
    pub fn tool(&self, name: &str) -> Result<&Arc<ToolSlot>, UnknownTool> {
        self.tools.get(name).ok_or_else(|| UnknownTool {
            name: name.to_string(),
            known: self.tools.keys().cloned().collect(),
        })
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.dispose_all();
    }
}

struct ApplyCtx<'a> {
    registry: &'a mut Registry,
    planned: &'a Planned,
    provided: Vec<String>,
    tools: Vec<String>,
}

fn rerr(code: &str, message: String, help: Option<String>) -> RError {
    RError {
        code: code.into(),
        message: message.into(),
        help: help.map(RString::from).into(),
        data: RString::new(),
    }
}

impl HostCtxObj for ApplyCtx<'_> {
    fn entry_id(&self) -> RString {
        self.planned.entry.id.as_str().into()
    }

    fn inject(&self, name: RStr<'_>) -> ROption<ServiceBox> {
        let declared = self
            .planned
            .library
            .meta
            .injects
            .iter()
            .any(|i| i.name == name.as_str());
        match self.registry.services.get(name.as_str()) {
            Some(slot) if declared => ROption::RSome(slot.handle.clone()),
            _ => ROption::RNone,
        }
    }

    fn provide(&mut self, name: RStr<'_>, service: ServiceBox) -> RResult<(), RError> {
        let meta = &self.planned.library.meta;
        let Some(spec) = meta.provides.iter().find(|s| s.name == name.as_str()) else {
            return RResult::RErr(rerr(
                codes::UNDECLARED_SERVICE,
                format!(
                    "plugin `{}` provides `{name}` without declaring it",
                    meta.name
                ),
                Some(format!("add `.provides::<...>(\"{name}\")` to metadata()")),
            ));
        };
        let actual = service.interface();
        if let Err(mismatch) = InterfaceMismatch::check(
            name.as_str(),
            (&spec.interface, spec.version),
            (actual.interface.as_str(), actual.version),
        ) {
            return RResult::RErr(rerr(
                cordis_sdk::codes::INTERFACE_MISMATCH,
                format!(
                    "plugin `{}` provides a service other than the one it declared: {}",
                    meta.name,
                    mismatch.explain("its metadata", "its `apply`")
                ),
                Some(mismatch.help()),
            ));
        }
        if self.registry.services.contains_key(name.as_str()) {
            return RResult::RErr(rerr(
                codes::DUPLICATE_SERVICE,
                format!("service `{name}` is already provided"),
                None,
            ));
        }
        self.registry.services.insert(
            name.to_string(),
            ServiceSlot {
                handle: service,
                spec: spec.clone(),
                provider: Provider::Entry(self.planned.entry.id.clone()),
                plugin: Some(meta.name.clone()),
                consumers: Vec::new(),
            },
        );
        self.provided.push(name.to_string());
        RResult::ROk(())
    }

    fn register_tool(&mut self, decl: ToolDecl, tool: ToolBox) -> RResult<(), RError> {
        let name = decl.name.to_string();
        let extras = self.registry.tool_extras.take_pending(&name);
        if let Some(existing) = self.registry.tools.get(&name) {
            return RResult::RErr(rerr(
                codes::DUPLICATE_TOOL,
                format!(
                    "tool `{name}` is already registered by entry `{}`",
                    existing.entry
                ),
                Some("compose only one plugin that registers this tool".into()),
            ));
        }
        let args = match ToolArgs::compile(&decl.input_schema) {
            Ok(args) => Arc::new(args),
            Err(why) => {
                return RResult::RErr(rerr(
                    cordis_sdk::codes::INVALID_ARGUMENT,
                    format!("tool `{name}` registers an input schema that cannot be used: {why}"),
                    Some("this is a bug in the plugin: register a JSON Schema for the tool's arguments (`Tool::typed` generates one)".into()),
                ));
            }
        };
        self.registry.tools.insert(
            name.clone(),
            Arc::new(ToolSlot {
                decl,
                handle: tool,
                extras,
                store: self.registry.tool_extras.clone(),
                args,
                entry: self.planned.entry.id.clone(),
            }),
        );
        self.tools.push(name);
        RResult::ROk(())
    }

    fn logger(&self) -> LoggerBox {
        plugin_logger(&self.planned.entry.id, &self.planned.library.meta.name)
    }
}

/// The host side of the logging bridge: plugin events become host `tracing` events whose
/// message starts with the entry id, with a `plugin` field.
#[derive(Clone)]
struct PluginLogger {
    entry: Arc<str>,
    plugin: Arc<str>,
}

pub(crate) fn plugin_logger(entry: &str, plugin: &str) -> LoggerBox {
    LoggerObj_TO::from_ptr(
        RArc::new(PluginLogger {
            entry: entry.into(),
            plugin: plugin.into(),
        }),
        TD_Opaque,
    )
}

fn level_of(level: u8) -> Level {
    match level {
        1 => Level::ERROR,
        2 => Level::WARN,
        3 => Level::INFO,
        4 => Level::DEBUG,
        _ => Level::TRACE,
    }
}

impl LoggerObj for PluginLogger {
    fn enabled(&self, level: u8) -> bool {
        level_of(level) <= tracing::level_filters::LevelFilter::current()
    }

    fn log(&self, level: u8, target: RStr<'_>, message: RStr<'_>) {
        let (entry, plugin) = (&*self.entry, &*self.plugin);
        let (target, message) = (target.as_str(), message.as_str());
        match level_of(level) {
            Level::ERROR => {
                tracing::error!(target: "plugin", plugin, source = target, "[{entry}] {message}")
            }
            Level::WARN => {
                tracing::warn!(target: "plugin", plugin, source = target, "[{entry}] {message}")
            }
            Level::INFO => {
                tracing::info!(target: "plugin", plugin, source = target, "[{entry}] {message}")
            }
            Level::DEBUG => {
                tracing::debug!(target: "plugin", plugin, source = target, "[{entry}] {message}")
            }
            _ => tracing::trace!(target: "plugin", plugin, source = target, "[{entry}] {message}"),
        }
    }
}
