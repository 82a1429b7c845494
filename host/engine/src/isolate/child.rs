//! The isolated entry's process: `cordis __isolated ENTRY` serves the socket the host
//! passed as descriptor 3. It loads the library the host names (checked as the host checks
//! it), applies it with a host context whose injected services are proxies back to the
//! host, and answers the host's service and tool calls. It exits when the host closes the
//! socket (or dies).

use std::collections::HashMap;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};

use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RArc, ROption, RResult, RStr, RString};
use cordis_sdk::abi::{
    HostCtxObj, HostCtxObj_TO, InstanceBox, LoggerBox, LoggerObj, LoggerObj_TO, RError, ServiceBox,
    ServiceDecl, ServiceObj, ServiceObj_TO, ToolBox, ToolDecl,
};

use super::wire::{
    answer_service, service_result, CallFds, Conn, Handler, Injected, Msg, WireError,
};
use super::{ToolWire, CHILD_FD};
use crate::loader::Library;
use crate::scope::{self, Scope};
use cordis_sdk::host::{CallContextClient, CurrentCall, CALL_CONTEXT};

/// The host's request the calling thread answers: named in the calls it makes back, so
/// the host answers them in that request's scope.
struct Within(Option<u64>);

thread_local! {
    static WITHIN: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

impl Within {
    fn enter(id: u64) -> Within {
        Within(WITHIN.with(|w| w.replace(Some(id))))
    }

    fn current() -> Option<u64> {
        WITHIN.with(std::cell::Cell::get)
    }
}

impl Drop for Within {
    fn drop(&mut self) {
        WITHIN.with(|w| w.set(self.0));
    }
}

/// What the child holds once the plugin is applied.
#[derive(Default)]
struct Applied {
    services: HashMap<String, ServiceBox>,
    tools: HashMap<String, ToolBox>,
    instance: Option<InstanceBox>,
    /// Kept loaded for the life of the process (never unloaded).
    library: Option<Arc<Library>>,
}

/// Runs the isolated entry's process; never returns.
pub fn child_main() -> ! {
    // SAFETY: the host opened descriptor 3 for this process (`CHILD_FD`) and nothing else
    // owns it.
    let stream = unsafe { UnixStream::from_raw_fd(CHILD_FD) };
    let applied: Arc<Mutex<Applied>> = Arc::default();
    let handler: Arc<Handler> = {
        let applied = applied.clone();
        Arc::new(move |conn, id, msg, fds| {
            // Every call the plugin makes back while answering names this request.
            let _within = Within::enter(id);
            Some(handle(conn, &applied, msg, fds))
        })
    };
    let (closed_tx, closed_rx) = std::sync::mpsc::channel();
    let served = Conn::serve(
        stream,
        handler,
        move || {
            let _ = closed_tx.send(());
        },
        "cordis-isolated".into(),
    );
    if served.is_ok() {
        let _ = closed_rx.recv();
    }
    // No destructors and no unloading: the plugin's threads may still run.
    // SAFETY: `_exit` ends the process at once.
    unsafe { libc::_exit(0) }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn handle(
    conn: &Arc<Conn>,
    applied: &Mutex<Applied>,
    msg: Msg,
    fds: Vec<OwnedFd>,
) -> Result<serde_json::Value, WireError> {
    match msg {
        Msg::Apply {
            entry,
            library,
            config,
            injects,
            log_level,
        } => apply(conn, applied, entry, &library, &config, injects, log_level),
        Msg::Service {
            name,
            method,
            args,
            scope,
            fds: which,
            ..
        } => {
            let service = lock(applied).services.get(&name).cloned();
            let Some(service) = service else {
                return Err(WireError::new(
                    cordis_sdk::codes::MISSING_SERVICE,
                    format!("this entry provides no service `{name}`"),
                ));
            };
            let _scope = enter_sent(scope, placed(which, &fds));
            let answer = answer_service(&service, &method, &args);
            // The descriptors stay open until the call has returned.
            drop(fds);
            answer
        }
        Msg::Tool {
            tool,
            context,
            args,
            fds: which,
            scope,
        } => call_tool(applied, &tool, &context, &args, which, fds, scope),
        Msg::Reconfigure { config } => {
            let mut applied = lock(applied);
            let Some(instance) = applied.instance.as_mut() else {
                return Ok("restart".into());
            };
            match instance.reconfigure(RStr::from(config.as_str())) {
                RResult::ROk(cordis_sdk::Reconfigured::Applied) => Ok("applied".into()),
                RResult::ROk(cordis_sdk::Reconfigured::Restart) => Ok("restart".into()),
                RResult::RErr(e) => Err(e.into()),
            }
        }
        Msg::Dispose => {
            let instance = lock(applied).instance.take();
            if let Some(mut instance) = instance {
                if let RResult::RErr(e) = instance.dispose() {
                    return Err(e.into());
                }
            }
            Ok(serde_json::Value::Null)
        }
        Msg::Log { .. } | Msg::Reply { .. } => Err(WireError::new(
            cordis_sdk::codes::INVALID_ARGUMENT,
            "not a request an isolated entry answers",
        )),
    }
}

fn apply(
    conn: &Arc<Conn>,
    applied: &Mutex<Applied>,
    entry: String,
    library: &std::path::Path,
    config: &str,
    injects: Vec<Injected>,
    log_level: u8,
) -> Result<serde_json::Value, WireError> {
    let library = Library::load(library).map_err(|e| {
        WireError::new(
            cordis_sdk::codes::INVALID_ARGUMENT,
            format!("cannot load {}: {e}", library.display()),
        )
    })?;
    let mut ctx = ChildCtx {
        entry,
        conn: conn.clone(),
        injects: injects.into_iter().map(|i| (i.name.clone(), i)).collect(),
        services: HashMap::new(),
        tools: Vec::new(),
        log_level,
    };
    let outcome = (library.module().apply())(
        HostCtxObj_TO::from_ptr(&mut ctx, TD_Opaque),
        RStr::from(config),
    );
    let instance = outcome.into_result().map_err(WireError::from)?;
    let provided: Vec<Injected> = ctx
        .services
        .iter()
        .map(|(name, s)| {
            let decl = s.interface();
            Injected {
                name: name.clone(),
                interface: decl.interface.into(),
                version: decl.version,
            }
        })
        .collect();
    let tools: Vec<ToolWire> = ctx
        .tools
        .iter()
        .map(|(decl, _)| ToolWire {
            name: decl.name.to_string(),
            description: decl.description.to_string(),
            input_schema: decl.input_schema.to_string(),
        })
        .collect();
    let mut state = lock(applied);
    state.services = ctx.services;
    state.tools = ctx
        .tools
        .into_iter()
        .map(|(decl, tool)| (decl.name.to_string(), tool))
        .collect();
    state.instance = Some(instance);
    state.library = Some(library);
    Ok(serde_json::json!({ "provided": provided, "tools": tools }))
}

/// The descriptors that came with a frame, as `which` names them: (cancel, progress).
fn placed(which: CallFds, fds: &[OwnedFd]) -> (Option<i32>, Option<i32>) {
    let mut received = fds.iter().map(|fd| fd.as_raw_fd());
    let cancel = if which.cancel { received.next() } else { None };
    let progress = if which.progress {
        received.next()
    } else {
        None
    };
    (cancel, progress)
}

/// Enters the call the host sent a request in, with the descriptors that came with it in
/// this process (`(cancel, progress)`) in place of the host's.
fn enter_sent(
    scope: Option<CurrentCall>,
    (cancel, progress): (Option<i32>, Option<i32>),
) -> Option<scope::Entered> {
    scope.map(|mut call| {
        call.cancel_fd = cancel;
        call.progress_fd = progress;
        scope::enter(Scope::new(call))
    })
}

/// Runs a tool call in `scope` with the descriptors that came with it in place of the
/// host's.
fn call_tool(
    applied: &Mutex<Applied>,
    tool: &str,
    context: &str,
    args: &str,
    which: CallFds,
    fds: Vec<OwnedFd>,
    scope: Option<CurrentCall>,
) -> Result<serde_json::Value, WireError> {
    let handle = lock(applied).tools.get(tool).cloned();
    let Some(handle) = handle else {
        return Err(WireError::new(
            cordis_sdk::codes::INVALID_ARGUMENT,
            format!("this entry registers no tool `{tool}`"),
        ));
    };
    let mut context: serde_json::Value = serde_json::from_str(context).map_err(|e| {
        WireError::new(
            cordis_sdk::codes::INVALID_ARGUMENT,
            format!("malformed call context: {e}"),
        )
    })?;
    let (cancel, progress) = placed(which, &fds);
    for (fd, key) in [(cancel, "cancel_fd"), (progress, "progress_fd")] {
        if let Some(map) = context.as_object_mut() {
            match fd {
                Some(fd) => {
                    map.insert(key.into(), fd.into());
                }
                None => {
                    map.remove(key);
                }
            }
        }
    }
    let context = context.to_string();
    let _scope = enter_sent(scope, (cancel, progress));
    let out = handle.call(RStr::from(context.as_str()), RStr::from(args));
    // The descriptors stay open until the call has returned.
    drop(fds);
    match out {
        RResult::ROk(out) => Ok(serde_json::json!({
            "is_error": out.is_error,
            "text": out.text.as_str(),
        })),
        RResult::RErr(e) => Err(e.into()),
    }
}

/// The host context of the child's apply.
struct ChildCtx {
    entry: String,
    conn: Arc<Conn>,
    injects: HashMap<String, Injected>,
    services: HashMap<String, ServiceBox>,
    tools: Vec<(ToolDecl, ToolBox)>,
    log_level: u8,
}

impl HostCtxObj for ChildCtx {
    fn entry_id(&self) -> RString {
        self.entry.as_str().into()
    }

    fn inject(&self, name: RStr<'_>) -> ROption<ServiceBox> {
        match self.injects.get(name.as_str()) {
            None => ROption::RNone,
            // Which call this process serves is known here, from the host's requests.
            Some(i) if i.name == CALL_CONTEXT => {
                ROption::RSome(CallContextClient::serve(scope::CallContextAnswer))
            }
            Some(i) => ROption::RSome(ServiceObj_TO::from_ptr(
                RArc::new(HostService {
                    conn: self.conn.clone(),
                    decl: ServiceDecl {
                        name: i.name.as_str().into(),
                        interface: i.interface.as_str().into(),
                        version: i.version,
                    },
                }),
                TD_Opaque,
            )),
        }
    }

    fn provide(&mut self, name: RStr<'_>, service: ServiceBox) -> RResult<(), RError> {
        self.services.insert(name.to_string(), service);
        RResult::ROk(())
    }

    fn register_tool(&mut self, decl: ToolDecl, tool: ToolBox) -> RResult<(), RError> {
        self.tools.push((decl, tool));
        RResult::ROk(())
    }

    fn logger(&self) -> LoggerBox {
        LoggerObj_TO::from_ptr(
            RArc::new(HostLogger {
                conn: self.conn.clone(),
                level: self.log_level,
            }),
            TD_Opaque,
        )
    }
}

/// A service the child injects, served by the host.
#[derive(Clone)]
struct HostService {
    conn: Arc<Conn>,
    decl: ServiceDecl,
}

impl ServiceObj for HostService {
    fn interface(&self) -> ServiceDecl {
        self.decl.clone()
    }

    fn call(&self, method: RStr<'_>, args: RStr<'_>) -> RResult<RString, RError> {
        let msg = Msg::Service {
            name: self.decl.name.to_string(),
            method: method.to_string(),
            args: args.to_string(),
            scope: None,
            fds: CallFds::default(),
            within: Within::current(),
        };
        let gone = || {
            RResult::RErr(RError::from(WireError::new(
                crate::codes::PLUGIN_STOPPED,
                "the host closed the connection",
            )))
        };
        let Ok(rx) = self.conn.request(&msg, &[]) else {
            return gone();
        };
        match rx.recv() {
            Ok(answer) => service_result(answer),
            Err(_) => gone(),
        }
    }
}

/// The plugin's logger: events go to the host, which logs them as its own plugins'.
#[derive(Clone)]
struct HostLogger {
    conn: Arc<Conn>,
    level: u8,
}

impl LoggerObj for HostLogger {
    fn enabled(&self, level: u8) -> bool {
        level <= self.level
    }

    fn log(&self, level: u8, target: RStr<'_>, message: RStr<'_>) {
        if level <= self.level {
            self.conn.notify(&Msg::Log {
                level,
                target: target.to_string(),
                message: message.to_string(),
            });
        }
    }
}
