//! The plugin-author API: the [`Plugin`] trait, its [`Metadata`], the [`Context`] passed to
//! `apply`, tools, and the glue [`crate::export_plugin!`] expands to.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use abi_stable::{
    sabi_trait::TD_Opaque,
    std_types::{RArc, RResult, RStr, RString, RVec},
};
use schemars::JsonSchema;
use serde::{de::DeserializeOwned, Deserialize, Serialize};

use crate::abi::{
    HostCtx, InjectDecl, InstanceBox, InstanceObj, InstanceObj_TO, LoggerBox, PluginMeta,
    PluginMod, PluginModRef, RError, Reconfigured, ServiceBox, ServiceDecl, ServiceObj,
    ServiceObj_TO, ToolDecl, ToolObj, ToolObj_TO, ToolOutput,
};
use crate::error::{codes, from_panic, Error, Result};
use crate::host::SessionInfo;
use crate::log::with_logger;
use crate::service::{Interface, Service};

/// A plugin: metadata declared in code, applied with a typed config.
///
/// Dropping the value is its last disposal step, after the disposers registered with
/// [`Context::on_dispose`] ran in reverse order.
pub trait Plugin: Send + Sized + 'static {
    /// The plugin's config, deserialized from the entry's `config` in `cordis.yml`.
    /// Its JSON Schema is exported so the host validates configs before applying anything.
    type Config: DeserializeOwned + JsonSchema;

    /// Name, version, provided and injected services.
    fn metadata() -> Metadata;

    /// Applies the plugin: inject services, provide services, register tools.
    fn apply(ctx: &mut Context<'_>, config: Self::Config) -> Result<Self>;

    /// Offered a changed config while running. The default asks for a restart.
    fn reconfigure(&mut self, _config: Self::Config) -> Result<Reconfigured> {
        Ok(Reconfigured::Restart)
    }
}

/// What a plugin declares about itself.
#[derive(Clone, Debug)]
pub struct Metadata {
    name: String,
    version: String,
    description: String,
    provides: Vec<ServiceDecl>,
    injects: Vec<InjectDecl>,
    tools: Vec<String>,
    needs: Vec<Need>,
}

/// What a plugin's process needs beyond calling the services it injects, when its entry
/// runs isolated (`isolate: process`): such a process is confined — it writes no file, has
/// no network of its own and sees a scrubbed environment — unless the plugin declares what
/// it needs ([`Metadata::needs`]). `cordis check` shows what an entry is granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// To write files itself (a filesystem backend).
    WriteFiles,
    /// A network of its own (the host's).
    Network,
    /// To create namespaces and run commands in them (a shell): no confinement at all, and
    /// the host's environment.
    Namespaces,
}

impl Need {
    /// The need's spelling (`write-files`, `network`, `namespaces`).
    pub fn as_str(self) -> &'static str {
        match self {
            Need::WriteFiles => "write-files",
            Need::Network => "network",
            Need::Namespaces => "namespaces",
        }
    }
}

impl Metadata {
    /// Starts a declaration; pass `env!("CARGO_PKG_NAME")` and `env!("CARGO_PKG_VERSION")`.
    pub fn new(name: &str, version: &str) -> Self {
        Metadata {
            name: name.to_string(),
            version: version.to_string(),
            description: String::new(),
            provides: Vec::new(),
            injects: Vec::new(),
            tools: Vec::new(),
            needs: Vec::new(),
        }
    }

    /// Declares what the plugin's process needs when its entry is isolated (see [`Need`]);
    /// a plugin that declares nothing runs confined there.
    pub fn needs(mut self, need: Need) -> Self {
        if !self.needs.contains(&need) {
            self.needs.push(need);
        }
        self
    }

    /// One line on what the plugin is for.
    pub fn description(mut self, text: &str) -> Self {
        self.description = text.to_string();
        self
    }

    /// Declares that the plugin provides service `name` implementing `I`.
    pub fn provides<I: Interface>(mut self, name: &str) -> Self {
        self.provides.push(ServiceDecl {
            name: name.into(),
            interface: I::ID.into(),
            version: I::VERSION,
        });
        self
    }

    /// Declares a required injection of service `name` implementing `I`.
    pub fn injects<I: Interface>(self, name: &str) -> Self {
        self.inject_decl::<I>(name, false)
    }

    /// Declares an optional injection of service `name` implementing `I`.
    pub fn injects_optional<I: Interface>(self, name: &str) -> Self {
        self.inject_decl::<I>(name, true)
    }

    fn inject_decl<I: Interface>(mut self, name: &str, optional: bool) -> Self {
        self.injects.push(InjectDecl {
            name: name.into(),
            interface: I::ID.into(),
            version: I::VERSION,
            optional,
        });
        self
    }

    /// Declares a tool the plugin registers, so listings (`cordis plugin list`) show it
    /// without applying the plugin; registering a tool not declared is an error.
    pub fn tool(mut self, name: &str) -> Self {
        self.tools.push(name.to_string());
        self.with_tool_extras()
    }

    /// Declares that the plugin's config names its tools, so they cannot be listed before
    /// it is applied; it may then register tools of any name.
    pub fn tools_from_config(mut self) -> Self {
        self.tools.push(crate::abi::TOOLS_FROM_CONFIG.to_string());
        self.with_tool_extras()
    }

    /// A plugin with tools injects the host's tool extras (optional: a host without them
    /// still runs the tools, without annotations and structured content).
    fn with_tool_extras(self) -> Self {
        let declared = self
            .injects
            .iter()
            .any(|d| d.name.as_str() == crate::host::TOOL_EXTRAS);
        if declared {
            self
        } else {
            self.injects_optional::<crate::host::ToolExtrasClient>(crate::host::TOOL_EXTRAS)
        }
    }

    /// The plugin's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// Everything a tool call knows besides its arguments.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CallContext {
    /// The calling session.
    pub session: SessionInfo,
    /// A unique id for this call (approvals are bound to it).
    pub call_id: String,
    /// A descriptor in this process, open for the whole call, that becomes readable (end
    /// of file) when the call is cancelled: a plugin that blocks (a shell running a
    /// command) polls it and stops. `None` when the front-end cannot cancel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel_fd: Option<i32>,
    /// A descriptor in this process, open for the whole call, where a long-running tool
    /// may report how it is getting on ([`report_progress`]); the front-end turns the
    /// reports into progress notifications for the client. `None` when nobody listens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_fd: Option<i32>,
}

impl CallContext {
    /// Reports progress on this call, when the front-end listens; never blocks.
    pub fn report_progress(&self, progress: &Progress) {
        if let Some(fd) = self.progress_fd {
            report_progress(fd, progress);
        }
    }
}

/// How a running tool call is getting on, as it reports it ([`CallContext::report_progress`]).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Progress {
    /// Output produced so far, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_bytes: Option<u64>,
    /// A short line for a person, e.g. `compiling 3/7`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The longest report line; shorter than `PIPE_BUF`, so a report is written whole or not
/// at all.
pub const MAX_PROGRESS_LINE: usize = 512;

/// Writes one progress report to `fd` (a progress descriptor handed down from
/// [`CallContext::progress_fd`], e.g. by a tool to the service that runs its command): one
/// JSON line, written whole or not at all. A report the reader has no room for is dropped
/// (the descriptor is non-blocking): progress is advisory and must never slow the call.
pub fn report_progress(fd: i32, progress: &Progress) {
    let mut progress = progress.clone();
    if let Some(m) = &mut progress.message {
        if m.len() > MAX_PROGRESS_LINE / 2 {
            let mut end = MAX_PROGRESS_LINE / 2;
            while !m.is_char_boundary(end) {
                end -= 1;
            }
            m.truncate(end);
        }
    }
    let Ok(mut line) = serde_json::to_vec(&progress) else {
        return;
    };
    line.push(b'\n');
    if line.len() > MAX_PROGRESS_LINE {
        return;
    }
    use std::io::Write;
    use std::os::fd::FromRawFd;
    // SAFETY: the descriptor is borrowed for one write and never closed here
    // (`ManuallyDrop`); one that is not open fails with EBADF, ignored like a full pipe.
    let mut out = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fd) });
    let _ = out.write(&line);
}

/// A tool's result: text for the model, whether it is an error result, and optionally
/// structured content matching the tool's output schema ([`ToolOptions::output_schema`]).
#[derive(Clone, Debug, PartialEq)]
pub struct ToolResult {
    /// An error result (e.g. a denial): the call ran, the answer is "no".
    pub is_error: bool,
    /// What the model sees.
    pub text: String,
    /// Structured content (a JSON object), for clients that read it; the text stays what
    /// the model sees.
    pub structured: Option<serde_json::Value>,
}

impl ToolResult {
    /// A success result.
    pub fn ok(text: impl Into<String>) -> Self {
        ToolResult {
            is_error: false,
            text: text.into(),
            structured: None,
        }
    }

    /// An error result.
    pub fn error(text: impl Into<String>) -> Self {
        ToolResult {
            is_error: true,
            text: text.into(),
            structured: None,
        }
    }

    /// This result with structured content (a JSON object).
    pub fn with_structured(mut self, value: serde_json::Value) -> Self {
        self.structured = Some(value);
        self
    }
}

/// Hints for clients about what a tool does, as MCP tool annotations: a client uses them to
/// decide what to ask a person before a call. They are hints, never a security boundary
/// (the sandbox is).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ToolAnnotations {
    /// A human-readable title.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// The tool does not change its environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only_hint: Option<bool>,
    /// The tool may destroy or overwrite (meaningful when not read-only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destructive_hint: Option<bool>,
    /// Repeating a call with the same arguments has no further effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotent_hint: Option<bool>,
    /// The tool reaches an open world (the network), beyond a closed set of things.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_world_hint: Option<bool>,
}

impl ToolAnnotations {
    /// Annotations with a title.
    pub fn titled(title: impl Into<String>) -> Self {
        ToolAnnotations {
            title: Some(title.into()),
            ..Self::default()
        }
    }

    /// Sets the read-only hint.
    pub fn read_only(mut self, yes: bool) -> Self {
        self.read_only_hint = Some(yes);
        self
    }

    /// Sets the destructive hint.
    pub fn destructive(mut self, yes: bool) -> Self {
        self.destructive_hint = Some(yes);
        self
    }

    /// Sets the idempotent hint.
    pub fn idempotent(mut self, yes: bool) -> Self {
        self.idempotent_hint = Some(yes);
        self
    }

    /// Sets the open-world hint.
    pub fn open_world(mut self, yes: bool) -> Self {
        self.open_world_hint = Some(yes);
        self
    }
}

/// What a tool declares besides its name, description and input
/// ([`Context::register_tool_with`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ToolOptions {
    /// Hints for clients.
    pub annotations: Option<ToolAnnotations>,
    /// The JSON Schema of the tool's structured content (an object schema).
    pub output_schema: Option<serde_json::Value>,
}

impl ToolOptions {
    /// Options with these annotations.
    pub fn annotated(annotations: ToolAnnotations) -> Self {
        ToolOptions {
            annotations: Some(annotations),
            output_schema: None,
        }
    }

    /// Sets the output schema.
    pub fn output_schema(mut self, schema: serde_json::Value) -> Self {
        self.output_schema = Some(schema);
        self
    }

    fn is_empty(&self) -> bool {
        self.annotations.is_none() && self.output_schema.is_none()
    }
}

/// A tool as registered by a plugin.
pub struct Tool {
    /// Unique tool name.
    pub name: String,
    /// What the tool does, for the model.
    pub description: String,
    /// JSON Schema of the input.
    pub input_schema: serde_json::Value,
}

impl Tool {
    /// A tool whose arguments are `A`: its input schema is generated from `A` (as a
    /// plugin's config schema is from its `Config`), unknown fields refused. Register it with
    /// [`Context::register_typed_tool`], whose handler receives an `A`.
    pub fn typed<A: JsonSchema>(name: impl Into<String>, description: impl Into<String>) -> Tool {
        Tool {
            name: name.into(),
            description: description.into(),
            input_schema: input_schema_of::<A>(),
        }
    }
}

/// The input schema of a tool whose arguments are `A`: `A`'s JSON Schema as an object
/// schema without `$schema` or `title`, unknown fields refused (`additionalProperties:
/// false`). The host checks every call's arguments against the schema a tool registers
/// before the tool runs.
pub fn input_schema_of<A: JsonSchema>() -> serde_json::Value {
    let mut schema = schemars::schema_for!(A).to_value();
    if let Some(obj) = schema.as_object_mut() {
        obj.remove("$schema");
        obj.remove("title");
        obj.insert(
            "additionalProperties".into(),
            serde_json::Value::Bool(false),
        );
    }
    schema
}

type ToolHandler = dyn Fn(&CallContext, serde_json::Value) -> Result<ToolResult> + Send + Sync;

#[derive(Clone)]
struct ToolDispatcher {
    name: String,
    handler: Arc<ToolHandler>,
    logger: LoggerBox,
    /// Where structured content goes (absent on a host without tool extras).
    extras: Option<crate::host::ToolExtrasClient>,
}

impl ToolDispatcher {
    /// Hands a result's structured content to the host, keyed by the call.
    fn record_structured(&self, call_id: String, content: serde_json::Value) {
        let Some(extras) = &self.extras else { return };
        let recorded = crate::host::ToolExtras::structured(
            extras,
            crate::host::StructuredContent { call_id, content },
        );
        if let Err(e) = recorded {
            tracing::warn!("tool `{}`: structured content not recorded: {e}", self.name);
        }
    }
}

impl ToolObj for ToolDispatcher {
    fn call(&self, context: RStr<'_>, args: RStr<'_>) -> RResult<ToolOutput, RError> {
        let run = || -> Result<ToolResult> {
            let context: CallContext = serde_json::from_str(context.as_str())
                .map_err(|e| Error::internal(format!("malformed call context: {e}")))?;
            let args: serde_json::Value = serde_json::from_str(args.as_str()).map_err(|e| {
                Error::invalid(format!("tool `{}`: arguments are not JSON: {e}", self.name))
            })?;
            let mut result = (self.handler)(&context, args)?;
            if let Some(content) = result.structured.take() {
                self.record_structured(context.call_id, content);
            }
            Ok(result)
        };
        match with_logger(&self.logger, || catch_unwind(AssertUnwindSafe(run))) {
            Ok(Ok(r)) => RResult::ROk(ToolOutput {
                is_error: r.is_error,
                text: r.text.into(),
            }),
            Ok(Err(e)) => RResult::RErr(e.into()),
            Err(payload) => {
                RResult::RErr(from_panic(&format!("tool `{}`", self.name), payload).into())
            }
        }
    }
}

type Disposer = Box<dyn FnOnce() + Send>;

/// What a plugin sees while it is applied.
pub struct Context<'a> {
    host: HostCtx<'a>,
    metadata: Metadata,
    disposers: Vec<Disposer>,
    logger: LoggerBox,
}

impl<'a> Context<'a> {
    /// The entry's id in `cordis.yml`.
    pub fn entry_id(&self) -> String {
        self.host.entry_id().into()
    }

    /// A required injected service. Fails if it was not declared with
    /// [`Metadata::injects`], is not composed, or implements another interface.
    pub fn inject<I: Interface>(&self, name: &str) -> Result<I> {
        self.inject_optional::<I>(name)?.ok_or_else(|| {
            Error::new(
                codes::MISSING_SERVICE,
                format!("required service `{name}` is not composed"),
            )
            .with_help(format!("add an entry that provides `{name}` to cordis.yml"))
        })
    }

    /// An optional injected service: `None` when nothing provides it.
    pub fn inject_optional<I: Interface>(&self, name: &str) -> Result<Option<I>> {
        let declared = self
            .metadata
            .injects
            .iter()
            .any(|d| d.name.as_str() == name);
        if !declared {
            return Err(Error::internal(format!(
                "plugin `{}` injects `{name}` without declaring it in its metadata",
                self.metadata.name
            ))
            .with_help(format!("add `.injects::<...>(\"{name}\")` to `metadata()`")));
        }
        match self.host.inject(RStr::from(name)).into_option() {
            Some(handle) => Service::checked::<I>(name, handle).map(Some),
            None => Ok(None),
        }
    }

    /// Provides service `name` (declared with [`Metadata::provides`]).
    pub fn provide(&mut self, name: &str, service: ServiceBox) -> Result<()> {
        let service = ServiceObj_TO::from_ptr(
            RArc::new(Logged {
                service,
                logger: self.logger.clone(),
            }),
            TD_Opaque,
        );
        self.host
            .provide(RStr::from(name), service)
            .into_result()
            .map_err(Error::from)
    }

    /// Registers a tool; `handler` receives the call context and the JSON arguments.
    pub fn register_tool<F>(&mut self, tool: Tool, handler: F) -> Result<()>
    where
        F: Fn(&CallContext, serde_json::Value) -> Result<ToolResult> + Send + Sync + 'static,
    {
        self.register_tool_with(tool, ToolOptions::default(), handler)
    }

    /// Registers a tool with its annotations and output schema.
    pub fn register_tool_with<F>(
        &mut self,
        tool: Tool,
        options: ToolOptions,
        handler: F,
    ) -> Result<()>
    where
        F: Fn(&CallContext, serde_json::Value) -> Result<ToolResult> + Send + Sync + 'static,
    {
        let declared = &self.metadata.tools;
        let allowed = declared
            .iter()
            .any(|t| *t == tool.name || t == crate::abi::TOOLS_FROM_CONFIG);
        if !allowed {
            return Err(Error::internal(format!(
                "plugin `{}` registers tool `{}` without declaring it in its metadata",
                self.metadata.name, tool.name,
            ))
            .with_help(format!(
                "add `.tool(\"{}\")` to `metadata()` (or `.tools_from_config()` when the config names the tools)",
                tool.name
            )));
        }
        // Declaring a tool declared the injection; a host without tool extras has none.
        let extras =
            self.inject_optional::<crate::host::ToolExtrasClient>(crate::host::TOOL_EXTRAS)?;
        if let (Some(extras), false) = (&extras, options.is_empty()) {
            crate::host::ToolExtras::describe(
                extras,
                crate::host::ToolDescription {
                    tool: tool.name.clone(),
                    annotations: options.annotations,
                    output_schema: options.output_schema,
                },
            )?;
        }
        let decl = ToolDecl {
            name: tool.name.as_str().into(),
            description: tool.description.into(),
            input_schema: tool.input_schema.to_string().into(),
        };
        let obj = ToolObj_TO::from_ptr(
            RArc::new(ToolDispatcher {
                name: tool.name,
                handler: Arc::new(handler),
                logger: self.logger.clone(),
                extras,
            }),
            TD_Opaque,
        );
        self.host
            .register_tool(decl, obj)
            .into_result()
            .map_err(Error::from)
    }

    /// Registers a tool made by [`Tool::typed`]: `handler` receives the arguments as an
    /// `A`. The host has checked them against the tool's input schema before the call, so
    /// a wrong type or an unknown field never reaches `handler`; what the schema cannot say
    /// and `A`'s deserializer refuses is an `INVALID_ARGUMENT` error.
    pub fn register_typed_tool<A, F>(
        &mut self,
        tool: Tool,
        options: ToolOptions,
        handler: F,
    ) -> Result<()>
    where
        A: DeserializeOwned,
        F: Fn(&CallContext, A) -> Result<ToolResult> + Send + Sync + 'static,
    {
        let name = tool.name.clone();
        self.register_tool_with(tool, options, move |call, args| {
            let args = serde_json::from_value(args)
                .map_err(|e| Error::invalid(format!("tool `{name}`: invalid arguments: {e}")))?;
            handler(call, args)
        })
    }

    /// Registers a disposer; disposers run in reverse order when the entry is disposed.
    pub fn on_dispose(&mut self, disposer: impl FnOnce() + Send + 'static) {
        self.disposers.push(Box::new(disposer));
    }
}

fn run_disposers(disposers: &mut Vec<Disposer>) {
    while let Some(d) = disposers.pop() {
        d();
    }
}

/// A provided service whose calls log under the providing entry's id.
#[derive(Clone)]
struct Logged {
    service: ServiceBox,
    logger: LoggerBox,
}

impl ServiceObj for Logged {
    fn interface(&self) -> ServiceDecl {
        self.service.interface()
    }

    fn call(&self, method: RStr<'_>, args: RStr<'_>) -> RResult<RString, RError> {
        with_logger(&self.logger, || self.service.call(method, args))
    }
}

struct Instance<P> {
    plugin: Option<P>,
    disposers: Vec<Disposer>,
    logger: LoggerBox,
}

impl<P: Plugin> InstanceObj for Instance<P> {
    fn dispose(&mut self) -> RResult<(), RError> {
        let logger = self.logger.clone();
        with_logger(&logger, || {
            guard("dispose", || {
                run_disposers(&mut self.disposers);
                drop(self.plugin.take());
                Ok(())
            })
        })
    }

    fn reconfigure(&mut self, config: RStr<'_>) -> RResult<Reconfigured, RError> {
        let logger = self.logger.clone();
        with_logger(&logger, || {
            guard("reconfigure", || {
                let config = parse_config::<P>(config.as_str())?;
                match self.plugin.as_mut() {
                    Some(p) => p.reconfigure(config),
                    None => Ok(Reconfigured::Restart),
                }
            })
        })
    }
}

fn guard<T>(what: &str, f: impl FnOnce() -> Result<T>) -> RResult<T, RError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => RResult::ROk(v),
        Ok(Err(e)) => RResult::RErr(e.into()),
        Err(payload) => RResult::RErr(from_panic(what, payload).into()),
    }
}

fn parse_config<P: Plugin>(config: &str) -> Result<P::Config> {
    serde_json::from_str(config).map_err(|e| Error::invalid(format!("invalid config: {e}")))
}

fn meta_of<P: Plugin>() -> Result<PluginMeta> {
    let m = P::metadata();
    let schema = schemars::schema_for!(P::Config);
    Ok(PluginMeta {
        name: m.name.into(),
        version: m.version.into(),
        description: m.description.into(),
        provides: RVec::from(m.provides),
        injects: RVec::from(m.injects),
        config_schema: RString::from(serde_json::to_string(&schema)?),
    })
}

extern "C" fn metadata<P: Plugin>() -> RResult<PluginMeta, RError> {
    guard("metadata", meta_of::<P>)
}

extern "C" fn tools<P: Plugin>() -> RVec<RString> {
    // `metadata` reports a failure to build the metadata; this only lists names.
    catch_unwind(|| P::metadata().tools.into_iter().map(RString::from).collect())
        .unwrap_or_default()
}

/// What plugin `P`'s process needs when isolated, for the symbol
/// [`crate::abi::NEEDS_SYMBOL`] that [`crate::export_plugin!`] exports: comma-separated,
/// NUL-terminated, leaked (asked for once per load).
#[doc(hidden)]
pub fn needs_of<P: Plugin>() -> *const std::os::raw::c_char {
    let needs = catch_unwind(|| {
        P::metadata()
            .needs
            .iter()
            .map(|n| n.as_str())
            .collect::<Vec<_>>()
            .join(",")
    })
    .unwrap_or_default();
    let text = std::ffi::CString::new(needs).unwrap_or_default();
    Box::leak(text.into_boxed_c_str()).as_ptr()
}

extern "C" fn check_config<P: Plugin>(config: RStr<'_>) -> RResult<(), RError> {
    guard("check_config", || {
        parse_config::<P>(config.as_str()).map(drop)
    })
}

extern "C" fn apply<P: Plugin>(
    host: HostCtx<'_>,
    config: RStr<'_>,
) -> RResult<InstanceBox, RError> {
    let logger = host.logger();
    crate::log::install(logger.clone());
    with_logger(&logger.clone(), move || {
        guard("apply", move || {
            let config = parse_config::<P>(config.as_str())?;
            let mut ctx = Context {
                host,
                metadata: P::metadata(),
                disposers: Vec::new(),
                logger,
            };
            let outcome = catch_unwind(AssertUnwindSafe(|| P::apply(&mut ctx, config)));
            let error = match outcome {
                Ok(Ok(plugin)) => {
                    return Ok(InstanceObj_TO::from_value(
                        Instance {
                            plugin: Some(plugin),
                            disposers: std::mem::take(&mut ctx.disposers),
                            logger: ctx.logger.clone(),
                        },
                        TD_Opaque,
                    ))
                }
                Ok(Err(e)) => e,
                Err(payload) => from_panic("apply", payload),
            };
            // Undo what the failed apply set up, even when it panicked half-way.
            let _ = catch_unwind(AssertUnwindSafe(|| run_disposers(&mut ctx.disposers)));
            Err(error)
        })
    })
}

/// The root module for plugin `P`; [`crate::export_plugin!`] calls this.
#[doc(hidden)]
pub fn root_module<P: Plugin>() -> PluginModRef {
    use abi_stable::prefix_type::PrefixTypeTrait;
    PluginMod {
        metadata: metadata::<P>,
        check_config: check_config::<P>,
        apply: apply::<P>,
        tools: tools::<P>,
    }
    .leak_into_prefix()
}

/// Exports a [`Plugin`] type as this library's cordis plugin. Use it once, in a crate
/// built with `crate-type = ["cdylib"]`.
#[macro_export]
macro_rules! export_plugin {
    ($plugin:ty) => {
        #[doc(hidden)]
        #[unsafe(export_name = "_1as_0lib_1header_0root_bmodule_bloader")]
        pub static __CORDIS_PLUGIN_LIB_HEADER: $crate::__private::LibHeader = {
            extern "C" fn erased() -> $crate::__private::RootModuleResult {
                $crate::__private::__call_root_module_loader(root)
            }
            fn root() -> $crate::abi::PluginModRef {
                $crate::__private::root_module::<$plugin>()
            }
            unsafe {
                $crate::__private::LibHeader::from_constructor::<$crate::abi::PluginModRef>(
                    erased,
                    $crate::__private::CheckTypeLayout::Yes,
                )
            }
        };

        #[doc(hidden)]
        #[unsafe(no_mangle)]
        pub extern "C" fn cordis_plugin_needs() -> *const ::std::os::raw::c_char {
            $crate::__private::needs_of::<$plugin>()
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The arguments of a tool under test.
    #[derive(Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)] // read through the schema only
    struct Args {
        /// Who to greet.
        name: String,
        /// How often.
        #[serde(default)]
        times: Option<u32>,
    }

    #[test]
    fn a_typed_tools_input_schema_is_its_argument_type() {
        let tool = Tool::typed::<Args>("greet", "Greets");
        let schema = &tool.input_schema;
        assert_eq!(
            (tool.name.as_str(), tool.description.as_str()),
            ("greet", "Greets")
        );
        assert_eq!(schema["type"], "object", "{schema}");
        assert_eq!(schema["required"], json!(["name"]), "{schema}");
        assert_eq!(schema["additionalProperties"], false, "{schema}");
        assert_eq!(schema["properties"]["name"]["type"], "string", "{schema}");
        assert_eq!(schema["properties"]["name"]["description"], "Who to greet.");
        assert_eq!(
            schema["properties"]["times"]["type"],
            json!(["integer", "null"])
        );
        assert!(schema.get("$schema").is_none() && schema.get("title").is_none());
        assert_eq!(input_schema_of::<Args>(), tool.input_schema);
    }
}
