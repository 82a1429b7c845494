//! Isolated entries (`isolate: process` in `cordis.yml`): the entry's library is loaded and
//! applied by a child process — the `cordis` binary itself, re-executed — and the host's
//! registry holds proxies that forward every service and tool call to it over a socket pair
//! (`wire`), with the same JSON that crosses the ABI. The services the entry injects are
//! served back to it from the host's registry (`child` is the other side). A crash, a hang
//! past the entry's `callTimeout` or a cancelled call the plugin does not stop costs only
//! that entry: its calls in flight end with an error result, the child is started again
//! with backoff, and every other entry keeps serving. The proxies stay the same across
//! restarts, so consumers of the entry's services recover without being restarted.

mod child;
mod wire;

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RArc, RResult, RStr, RString};
use cordis_sdk::abi::{
    HostCtx, InstanceBox, InstanceObj, InstanceObj_TO, RError, Reconfigured, ServiceBox,
    ServiceDecl, ServiceObj, ServiceObj_TO, ToolDecl, ToolObj, ToolObj_TO, ToolOutput,
};

pub use child::child_main;
use wire::{CallFds, Conn, Handler, Injected, Msg, Unanswered, WireError, Within};

use crate::codes;
use crate::plan::Planned;
use crate::scope::{self, Scope};
use cordis_sdk::host::CurrentCall;

/// The argument the `cordis` binary is re-executed with to become an isolated entry's
/// process (hidden; it serves the socket on [`CHILD_FD`]).
pub const CHILD_ARG: &str = "__isolated";

/// The descriptor of the socket in the child.
const CHILD_FD: RawFd = 3;

/// The argument after which the child confines its own filesystem writes (Landlock; the
/// `cordis` binary applies it before it serves the socket).
pub const NO_WRITES_ARG: &str = "--no-writes";

/// The argument after which the child creates no unix socket (seccomp; a network namespace
/// does not keep a pathname socket of the host's out).
pub const NO_NETWORK_ARG: &str = "--no-network";

/// The argument after which the child reaches into no other process (seccomp: `ptrace`,
/// `process_vm_readv`, `process_vm_writev`).
pub const NO_TRACING_ARG: &str = "--no-tracing";

/// The environment a confined isolated process keeps; everything else (tokens, keys) is
/// dropped.
const KEPT_ENV: &[&str] = &["PATH", "HOME", "LANG", "LC_ALL", "TZ", "RUST_BACKTRACE"];

/// How an isolated process is confined, from what its plugin declares it needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Confinement {
    /// No network of its own: a new (empty) network namespace, in a user namespace.
    no_network: bool,
    /// No file writes anywhere (Landlock).
    no_writes: bool,
    /// Only [`KEPT_ENV`] of the host's environment.
    scrub_env: bool,
    /// No reaching into another process (`ptrace`, `process_vm_*`: seccomp).
    no_tracing: bool,
}

impl Confinement {
    fn of(needs: &[String]) -> Self {
        let needs = |n: cordis_sdk::Need| needs.iter().any(|x| x == n.as_str());
        let everything = needs(cordis_sdk::Need::Namespaces);
        Confinement {
            no_network: !everything && !needs(cordis_sdk::Need::Network),
            no_writes: !everything && !needs(cordis_sdk::Need::WriteFiles),
            scrub_env: !everything,
            no_tracing: !everything,
        }
    }
}

/// What an isolated entry's process is denied, given what its plugin needs, in words (for
/// `cordis check`).
pub fn confinement_summary(needs: &[String]) -> String {
    let c = Confinement::of(needs);
    let mut denied = Vec::new();
    if c.no_writes {
        denied.push("no file writes");
    }
    if c.no_network {
        denied.push("no network");
    }
    if c.no_tracing {
        denied.push("no access to other processes");
    }
    if c.scrub_env {
        denied.push("a scrubbed environment");
    }
    if denied.is_empty() {
        "unconfined (its plugin needs namespaces)".to_string()
    } else {
        denied.join(", ")
    }
}

/// The first restart waits this long; each crash in a row doubles it, up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A child that ran this long before it crashed restarts after [`FIRST_BACKOFF`] again.
const HEALTHY: Duration = Duration::from_secs(60);
/// Starts that fail in a row before the entry is left stopped.
const MAX_FAILED_STARTS: u32 = 5;
/// How long a cancelled call may take to stop before its entry's process is killed.
const CANCEL_GRACE: Duration = Duration::from_secs(2);

/// How an entry is isolated (`isolate: process`, `callTimeout` and `memoryMib` in
/// `cordis.yml`).
#[derive(Clone, Debug, PartialEq)]
pub struct Isolation {
    /// The longest any one call may take before the entry's process is killed.
    pub call_timeout: Duration,
    /// The most memory the entry's process may allocate (`RLIMIT_DATA`), in MiB.
    pub memory_mib: Option<u64>,
}

/// The smallest `memoryMib`: below it the `cordis` binary itself cannot start.
pub const MIN_MEMORY_MIB: u64 = 16;

/// The default `callTimeout`: above the longest timeout of the bundled `bash` tool.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(15 * 60);

impl Default for Isolation {
    fn default() -> Self {
        Isolation {
            call_timeout: DEFAULT_CALL_TIMEOUT,
            memory_mib: None,
        }
    }
}

/// How an isolated entry is doing, for `cordis services`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IsolationStatus {
    /// The process serving it now (none while it restarts or is stopped).
    pub pid: Option<u32>,
    /// How many times it was restarted.
    pub restarts: u32,
    /// How its last process ended.
    pub last_exit: Option<String>,
    /// Why it is left stopped, when it is.
    pub stopped: Option<String>,
}

/// One isolated entry: its process and how to start it again.
pub(crate) struct Isolated {
    entry: String,
    plugin: String,
    line: usize,
    library: PathBuf,
    config: Mutex<String>,
    exe: PathBuf,
    timeout: Duration,
    memory_mib: Option<u64>,
    confinement: Confinement,
    injects: Vec<Injected>,
    served: HashMap<String, ServiceBox>,
    state: Mutex<State>,
    changed: Condvar,
    /// The libraries of the entries whose services `served` holds: declared after it, so
    /// they are dropped after it (the last reference may go on the connection's thread,
    /// after a reload or the host's shutdown has let the composition's go).
    _providers: Vec<Arc<crate::loader::Library>>,
}

#[derive(Default)]
struct State {
    running: Option<Running>,
    /// Counts every child started, so a late end of an old one changes nothing.
    generation: u64,
    restarts: u32,
    failed_starts: u32,
    backoff: Option<Duration>,
    /// How each recent generation ended, by generation.
    exits: Vec<(u64, String)>,
    stopped: Option<String>,
    retired: bool,
}

struct Running {
    conn: Arc<Conn>,
    pid: u32,
    started: Instant,
    generation: u64,
    process: SharedChild,
}

/// A child process, taken out once reaped.
type SharedChild = Arc<Mutex<Option<Child>>>;

/// What the child reports after applying the plugin.
#[derive(serde::Deserialize)]
struct Applied {
    provided: Vec<Injected>,
    tools: Vec<ToolWire>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct ToolWire {
    name: String,
    description: String,
    input_schema: String,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn error(code: &str, message: String, help: Option<String>) -> WireError {
    WireError {
        code: code.into(),
        message,
        help,
        data: String::new(),
    }
}

/// Applies `planned` in a child process running `exe`, through `ctx` (the registry's own
/// apply context, so every check of an in-process apply holds): the services it injects
/// are taken from `ctx` and served back to the child (their `providers`' libraries kept
/// loaded as long as their handles), what the child provides and registers is registered
/// through `ctx` as proxies.
pub(crate) fn apply(
    ctx: &mut HostCtx<'_>,
    planned: &Planned,
    exe: &Path,
    isolation: &Isolation,
    providers: Vec<Arc<crate::loader::Library>>,
) -> Result<(InstanceBox, Arc<Isolated>), WireError> {
    let meta = &planned.library.meta;
    let mut served = HashMap::new();
    let mut injects = Vec::new();
    for inj in &meta.injects {
        if let Some(service) = ctx.inject(RStr::from(inj.name.as_str())).into_option() {
            let decl = service.interface();
            injects.push(Injected {
                name: inj.name.clone(),
                interface: decl.interface.into(),
                version: decl.version,
            });
            served.insert(inj.name.clone(), service);
        }
    }
    let isolated = Arc::new(Isolated {
        entry: planned.entry.id.clone(),
        plugin: meta.name.clone(),
        line: planned.entry.pos.line,
        library: planned.library.loaded_file().to_path_buf(),
        config: Mutex::new(planned.entry.config.to_string()),
        exe: exe.to_path_buf(),
        timeout: isolation.call_timeout,
        memory_mib: isolation.memory_mib,
        confinement: Confinement::of(&meta.needs),
        injects,
        served,
        state: Mutex::new(State::default()),
        changed: Condvar::new(),
        _providers: providers,
    });
    let applied = isolated.start().inspect_err(|_| isolated.retire())?;
    let registered = (|| {
        for p in &applied.provided {
            let proxy = ServiceProxy {
                isolated: isolated.clone(),
                decl: ServiceDecl {
                    name: p.name.as_str().into(),
                    interface: p.interface.as_str().into(),
                    version: p.version,
                },
            };
            let handle: ServiceBox = ServiceObj_TO::from_ptr(RArc::new(proxy), TD_Opaque);
            ctx.provide(RStr::from(p.name.as_str()), handle)
                .into_result()?;
        }
        for t in applied.tools {
            let proxy = ToolProxy {
                isolated: isolated.clone(),
                tool: t.name.clone(),
            };
            let decl = ToolDecl {
                name: t.name.into(),
                description: t.description.into(),
                input_schema: t.input_schema.into(),
            };
            let handle = ToolObj_TO::from_ptr(RArc::new(proxy), TD_Opaque);
            ctx.register_tool(decl, handle)
                .into_result()
                .map_err(WireError::from)?;
        }
        Ok(())
    })();
    if let Err(e) = registered {
        isolated.retire();
        return Err(e);
    }
    let instance = InstanceObj_TO::from_value(
        InstanceProxy {
            isolated: isolated.clone(),
        },
        TD_Opaque,
    );
    Ok((instance, isolated))
}

impl Isolated {
    fn what(&self) -> String {
        format!(
            "isolated entry `{}` (plugin `{}`, cordis.yml line {})",
            self.entry, self.plugin, self.line
        )
    }

    /// The calling thread's scope as a request to this entry's process carries it: the call,
    /// its deadline no later than this entry's `callTimeout` from now.
    fn crossing(&self) -> Option<(Scope, CurrentCall)> {
        let scope = scope::current()?;
        let mut call = scope.current();
        let deadline = unix_ms(std::time::SystemTime::now() + self.timeout);
        call.deadline_ms = Some(call.deadline_ms.map_or(deadline, |d| d.min(deadline)));
        call.crossed = true;
        Some((scope, call))
    }

    /// The entry's status.
    pub(crate) fn status(&self) -> IsolationStatus {
        let state = lock(&self.state);
        IsolationStatus {
            pid: state.running.as_ref().map(|r| r.pid),
            restarts: state.restarts,
            last_exit: state.exits.last().map(|(_, e)| e.clone()),
            stopped: state.stopped.clone(),
        }
    }

    /// Starts a child and applies the plugin in it.
    fn start(self: &Arc<Self>) -> Result<Applied, WireError> {
        let fail = |why: String| {
            error(
                codes::PLUGIN_CRASHED,
                format!("{} could not start its process: {why}", self.what()),
                Some("check that the `cordis` binary can be executed again (it re-runs itself for an isolated entry)".into()),
            )
        };
        let (ours, theirs) = UnixStream::pair().map_err(|e| fail(e.to_string()))?;
        let mut command = Command::new(&self.exe);
        command
            .arg(CHILD_ARG)
            .arg(&self.entry)
            .stdin(Stdio::null())
            // The host's stdout may be the MCP channel: a plugin's prints go to stderr.
            .stdout(Stdio::from(
                std::io::stderr()
                    .as_fd()
                    .try_clone_to_owned()
                    .map_err(|e| fail(e.to_string()))?,
            ))
            .stderr(Stdio::inherit());
        let confinement = self.confinement;
        if confinement.no_writes {
            command.arg(NO_WRITES_ARG);
        }
        if confinement.no_network {
            command.arg(NO_NETWORK_ARG);
        }
        if confinement.no_tracing {
            command.arg(NO_TRACING_ARG);
        }
        if confinement.scrub_env {
            let kept: Vec<(&str, std::ffi::OsString)> = KEPT_ENV
                .iter()
                .filter_map(|k| std::env::var_os(k).map(|v| (*k, v)))
                .collect();
            command.env_clear().envs(kept);
        }
        let fd = theirs.as_raw_fd();
        let memory = self.memory_mib.map(|mib| mib.saturating_mul(1 << 20));
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            command.pre_exec(move || {
                if let Some(bytes) = memory {
                    let limit = libc::rlimit {
                        rlim_cur: bytes,
                        rlim_max: bytes,
                    };
                    if libc::setrlimit(libc::RLIMIT_DATA, &limit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                // A network of its own: an empty namespace (only a loopback, down).
                if confinement.no_network
                    && libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNET) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                if fd == CHILD_FD {
                    if libc::fcntl(fd, libc::F_SETFD, 0) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                } else if libc::dup2(fd, CHILD_FD) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // Nothing else of the host's (a descriptor some plugin opened without
                // close-on-exec) reaches the child.
                if libc::syscall(libc::SYS_close_range, CHILD_FD + 1, libc::c_uint::MAX, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let process = command.spawn().map_err(|e| {
            if confinement.no_network {
                fail(format!(
                    "{e} (a network namespace of its own needs unprivileged user namespaces: see `kernel.unprivileged_userns_clone` and AppArmor's `kernel.apparmor_restrict_unprivileged_userns`); the entry is not run unconfined"
                ))
            } else {
                fail(e.to_string())
            }
        })?;
        drop(theirs);
        let pid = process.id();
        let process = Arc::new(Mutex::new(Some(process)));
        let generation = {
            let mut state = lock(&self.state);
            state.generation += 1;
            state.generation
        };
        let handler: Arc<Handler> = {
            let isolated = Arc::downgrade(self);
            Arc::new(move |conn, _id, msg, _fds| match isolated.upgrade() {
                Some(isolated) => isolated.serve(conn, msg),
                None => Some(Err(WireError::new(
                    codes::PLUGIN_STOPPED,
                    "the entry was removed",
                ))),
            })
        };
        let on_close = {
            let isolated = Arc::downgrade(self);
            let process = process.clone();
            move || {
                if let Some(isolated) = isolated.upgrade() {
                    isolated.ended(generation, &process);
                } else {
                    reap(&process);
                }
            }
        };
        let conn = Conn::serve(
            ours,
            handler,
            on_close,
            format!("cordis-isolated-{}", self.entry),
        )
        .map_err(|e| fail(e.to_string()))?;
        let config = lock(&self.config).clone();
        let msg = Msg::Apply {
            entry: self.entry.clone(),
            library: self.library.clone(),
            config,
            injects: self.injects.clone(),
            log_level: log_level(),
        };
        let applied = match wait(&conn, &msg, &[], Instant::now() + self.timeout, None, None) {
            Ok(value) => serde_json::from_value::<Applied>(value)
                .map_err(|e| fail(format!("its answer to apply is malformed: {e}")))?,
            Err(Waited::Reply(e)) => {
                conn.shutdown();
                return Err(e);
            }
            Err(other) => {
                kill(&process);
                conn.shutdown();
                let exit = self.exit_of(generation);
                return Err(fail(match other {
                    Waited::Gone => format!("its process {exit} while applying the plugin"),
                    _ => format!("it did not apply the plugin within {:?}", self.timeout),
                }));
            }
        };
        let mut state = lock(&self.state);
        state.running = Some(Running {
            conn,
            pid,
            started: Instant::now(),
            generation,
            process,
        });
        state.failed_starts = 0;
        self.changed.notify_all();
        Ok(applied)
    }

    /// Answers a request from the child: a call of a service it injects (in the scope of
    /// the host's request it names, as the host recorded it; outside any session when it
    /// names none in flight), or a log event.
    fn serve(&self, conn: &Conn, msg: Msg) -> Option<Result<serde_json::Value, WireError>> {
        match msg {
            Msg::Service {
                name,
                method,
                args,
                within,
                ..
            } => Some(match self.served.get(&name) {
                None => Err(WireError::new(
                    cordis_sdk::codes::MISSING_SERVICE,
                    format!("service `{name}` is not injected into this entry"),
                )),
                Some(service) => {
                    let scope = match conn.within(within) {
                        // The host's own request (apply, dispose, a host command): the
                        // child acts for the host during it.
                        Within::Request(None) => None,
                        Within::Request(Some(scope)) => Some(scope.crossed_from(&self.entry)),
                        Within::Nothing => Some(Scope::new(CurrentCall {
                            isolated_caller: Some(self.entry.clone()),
                            crossed: true,
                            ..CurrentCall::default()
                        })),
                    };
                    let _entered = scope.map(scope::enter);
                    wire::answer_service(service, &method, &args)
                }
            }),
            Msg::Log {
                level,
                target,
                message,
            } => {
                let logger = crate::registry::plugin_logger(&self.entry, &self.plugin);
                logger.log(
                    level,
                    RStr::from(target.as_str()),
                    RStr::from(message.as_str()),
                );
                None
            }
            _ => Some(Err(WireError::new(
                cordis_sdk::codes::INVALID_ARGUMENT,
                "the host serves only service calls and log events",
            ))),
        }
    }

    /// A child's connection ended: record how, and start it again unless retired.
    fn ended(self: &Arc<Self>, generation: u64, process: &Mutex<Option<Child>>) {
        let exit = reap(process);
        let mut state = lock(&self.state);
        state.exits.push((generation, exit.clone()));
        if state.exits.len() > 8 {
            state.exits.remove(0);
        }
        let ran = match &state.running {
            Some(r) if r.generation == generation => {
                let ran = r.started.elapsed();
                state.running = None;
                Some(ran)
            }
            _ => None,
        };
        self.changed.notify_all();
        let Some(ran) = ran else {
            return;
        };
        if state.retired || state.stopped.is_some() {
            return;
        }
        let backoff = match state.backoff {
            Some(b) if ran < HEALTHY => (b * 2).min(MAX_BACKOFF),
            _ => FIRST_BACKOFF,
        };
        state.backoff = Some(backoff);
        state.restarts += 1;
        tracing::error!(
            "{} crashed: its process {exit}; calls in flight failed with {}; restarting in {:.1} s, every other entry keeps serving",
            self.what(),
            codes::PLUGIN_CRASHED,
            backoff.as_secs_f64()
        );
        drop(state);
        self.restart_after(backoff);
    }

    fn restart_after(self: &Arc<Self>, delay: Duration) {
        let isolated = Arc::downgrade(self);
        let _ = std::thread::Builder::new()
            .name("cordis-isolated-restart".into())
            .spawn(move || {
                std::thread::sleep(delay);
                let Some(isolated) = isolated.upgrade() else {
                    return;
                };
                if lock(&isolated.state).retired {
                    return;
                }
                match isolated.start() {
                    Ok(_) => tracing::info!("{} serves again", isolated.what()),
                    Err(e) => {
                        let mut state = lock(&isolated.state);
                        state.failed_starts += 1;
                        if state.failed_starts >= MAX_FAILED_STARTS {
                            let why = format!(
                                "it failed to start {} times in a row, last: {}",
                                state.failed_starts, e.message
                            );
                            tracing::error!(
                                "{} is left stopped until its library or config changes: {why}",
                                isolated.what()
                            );
                            state.stopped = Some(why);
                            isolated.changed.notify_all();
                            return;
                        }
                        let backoff = state
                            .backoff
                            .map_or(FIRST_BACKOFF, |b| (b * 2).min(MAX_BACKOFF));
                        state.backoff = Some(backoff);
                        drop(state);
                        tracing::error!(
                            "{} failed to start again ({}); retrying in {:.1} s",
                            isolated.what(),
                            e.message,
                            backoff.as_secs_f64()
                        );
                        isolated.restart_after(backoff);
                    }
                }
            });
    }

    /// How generation `generation` ended, as far as known.
    fn exit_of(&self, generation: u64) -> String {
        let state = lock(&self.state);
        state
            .exits
            .iter()
            .find(|(g, _)| *g == generation)
            .map_or_else(|| "ended".to_string(), |(_, e)| e.clone())
    }

    /// The running child, waiting for a restart until `deadline`.
    fn running(&self, deadline: Instant) -> Result<(Arc<Conn>, u64, SharedChild), WireError> {
        let mut state = lock(&self.state);
        loop {
            if let Some(why) = &state.stopped {
                return Err(error(
                    codes::PLUGIN_STOPPED,
                    format!("{} is stopped: {why}", self.what()),
                    Some("fix the plugin, then rebuild its library or change its config in cordis.yml: the entry starts again on the reload".into()),
                ));
            }
            if state.retired {
                return Err(error(
                    codes::PLUGIN_STOPPED,
                    format!("{} was removed from the composition", self.what()),
                    None,
                ));
            }
            if let Some(r) = &state.running {
                return Ok((r.conn.clone(), r.generation, r.process.clone()));
            }
            let now = Instant::now();
            if now >= deadline {
                let last = state
                    .exits
                    .last()
                    .map_or("ended".into(), |(_, e)| e.clone());
                return Err(error(
                    codes::PLUGIN_CRASHED,
                    format!(
                        "{} is restarting after its process {last}; the call did not run",
                        self.what()
                    ),
                    Some("retry the call in a moment".into()),
                ));
            }
            state = self
                .changed
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Sends `msg` to the running child and waits for its answer, within the entry's
    /// `callTimeout`; `cancel` (a descriptor readable once the call is cancelled) stops
    /// the wait, and the child too if it does not answer within the grace period.
    fn call(
        &self,
        what: &str,
        msg: &Msg,
        fds: &[BorrowedFd<'_>],
        cancel: Option<BorrowedFd<'_>>,
        scope: Option<Scope>,
    ) -> Result<serde_json::Value, WireError> {
        let deadline = Instant::now() + self.timeout;
        let restart_wait = Instant::now() + MAX_BACKOFF + Duration::from_secs(5);
        let (conn, generation, process) = self.running(deadline.min(restart_wait))?;
        match wait(&conn, msg, fds, deadline, cancel, scope) {
            Ok(value) => Ok(value),
            Err(Waited::Reply(e)) => Err(e),
            Err(Waited::Gone) => {
                // Recorded before the wait ended (the connection's end runs `ended` first).
                let exit = self.exit_of(generation);
                Err(error(
                    codes::PLUGIN_CRASHED,
                    format!(
                        "{} crashed during {what}: its process {exit}; the call did not complete",
                        self.what()
                    ),
                    Some(match self.memory_mib {
                        Some(mib) => format!("the entry restarts on its own and other entries are unaffected; retry the call. Its process may allocate {mib} MiB (`memoryMib` at cordis.yml line {}): an allocation past that ends it (SIGABRT), so raise it if the plugin needs more; otherwise report the crash to the plugin's author", self.line),
                        None => "the entry restarts on its own and other entries are unaffected; retry the call, and if it crashes again, report it to the plugin's author".into(),
                    }),
                ))
            }
            Err(Waited::TimedOut) => {
                kill(&process);
                Err(error(
                    codes::PLUGIN_TIMEOUT,
                    format!(
                        "{} did not answer {what} within its callTimeout ({}); its process was killed and restarts",
                        self.what(),
                        humanize(self.timeout)
                    ),
                    Some(format!(
                        "raise `callTimeout` of the entry at cordis.yml line {} if such calls are expected to take longer",
                        self.line
                    )),
                ))
            }
            Err(Waited::Cancelled) => {
                kill(&process);
                Err(error(
                    codes::PLUGIN_CANCELLED,
                    format!(
                        "{what} was cancelled and {} did not stop within {}; its process was killed and restarts",
                        self.what(),
                        humanize(CANCEL_GRACE)
                    ),
                    None,
                ))
            }
        }
    }

    /// Takes the entry out: the child runs the plugin's disposers and exits once its calls
    /// have finished; no restart after that.
    fn retire(self: &Arc<Self>) {
        let running = {
            let mut state = lock(&self.state);
            state.retired = true;
            self.changed.notify_all();
            state.running.take()
        };
        let Some(running) = running else {
            return;
        };
        let timeout = self.timeout;
        let _ = std::thread::Builder::new()
            .name("cordis-isolated-retire".into())
            .spawn(move || {
                // Calls in flight finish first (each ends within the call timeout).
                let until = Instant::now() + timeout;
                while running.conn.in_flight() > 0 && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(20));
                }
                let _ = wait(
                    &running.conn,
                    &Msg::Dispose,
                    &[],
                    Instant::now() + Duration::from_secs(10),
                    None,
                    None,
                );
                running.conn.shutdown();
                let end = Instant::now() + Duration::from_secs(5);
                loop {
                    let done = lock(&running.process)
                        .as_mut()
                        .is_none_or(|c| matches!(c.try_wait(), Ok(Some(_))));
                    if done || Instant::now() >= end {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                kill(&running.process);
                reap(&running.process);
            });
    }
}

/// How a wait for an answer ended without one.
enum Waited {
    /// The other side answered with an error.
    Reply(WireError),
    /// The connection closed.
    Gone,
    TimedOut,
    Cancelled,
}

/// Sends `msg` (made in `scope`) and waits for its answer until `deadline`, watching
/// `cancel`.
fn wait(
    conn: &Conn,
    msg: &Msg,
    fds: &[BorrowedFd<'_>],
    deadline: Instant,
    cancel: Option<BorrowedFd<'_>>,
    scope: Option<Scope>,
) -> Result<serde_json::Value, Waited> {
    let rx = conn.request_in(msg, fds, scope).map_err(|u| match u {
        Unanswered::Closed => Waited::Gone,
    })?;
    let mut cancelled_at: Option<Instant> = None;
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Err(Waited::TimedOut);
        }
        let mut slice = deadline - now;
        if cancel.is_some() {
            slice = slice.min(Duration::from_millis(50));
        }
        match rx.recv_timeout(slice) {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(e)) => return Err(Waited::Reply(e)),
            Err(RecvTimeoutError::Disconnected) => return Err(Waited::Gone),
            Err(RecvTimeoutError::Timeout) => {}
        }
        if let Some(fd) = cancel {
            match cancelled_at {
                Some(at) if at.elapsed() >= CANCEL_GRACE => return Err(Waited::Cancelled),
                Some(_) => {}
                None if readable(fd) => cancelled_at = Some(Instant::now()),
                None => {}
            }
        }
    }
}

/// Whether `fd` is readable now (a cancel descriptor at end of file).
fn readable(fd: BorrowedFd<'_>) -> bool {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut pfd, 1, 0) };
    n > 0 && pfd.revents != 0
}

fn kill(process: &Mutex<Option<Child>>) {
    if let Some(child) = lock(process).as_mut() {
        let _ = child.kill();
    }
}

/// Waits for the child (killing it if it lingers) and says how it ended.
fn reap(process: &Mutex<Option<Child>>) -> String {
    let Some(mut child) = lock(process).take() else {
        return "ended".to_string();
    };
    let end = Instant::now() + Duration::from_secs(2);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < end => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) => {
                let _ = child.kill();
                break child.wait().ok();
            }
            Err(_) => break None,
        }
    };
    match status {
        None => "ended".to_string(),
        Some(s) => match (s.code(), s.signal()) {
            (Some(code), _) => format!("exited with status {code}"),
            (_, Some(sig)) => format!("was killed by signal {sig} ({})", signal_name(sig)),
            _ => "ended".to_string(),
        },
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGABRT => "SIGABRT",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGKILL => "SIGKILL",
        libc::SIGBUS => "SIGBUS",
        libc::SIGILL => "SIGILL",
        libc::SIGFPE => "SIGFPE",
        libc::SIGTERM => "SIGTERM",
        libc::SIGSYS => "SIGSYS",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGXCPU => "SIGXCPU",
        _ => "a signal",
    }
}

fn humanize(d: Duration) -> String {
    let secs = d.as_secs_f64();
    if secs >= 60.0 && d.as_secs().is_multiple_of(60) {
        format!("{} min", d.as_secs() / 60)
    } else {
        format!("{secs} s")
    }
}

/// The host's log level as the SDK numbers levels (1 = error .. 5 = trace).
fn log_level() -> u8 {
    use tracing::level_filters::LevelFilter;
    match LevelFilter::current() {
        LevelFilter::OFF => 0,
        LevelFilter::ERROR => 1,
        LevelFilter::WARN => 2,
        LevelFilter::INFO => 3,
        LevelFilter::DEBUG => 4,
        _ => 5,
    }
}

/// The descriptors of `call` that go with a frame (cancel, then progress), and which.
fn call_fds(call: &CurrentCall) -> (Vec<BorrowedFd<'_>>, CallFds) {
    // SAFETY: a call's descriptors stay open for the whole call (the front-end keeps
    // them), and the frame is sent during it.
    let borrow = |fd: Option<i32>| {
        fd.filter(|fd| *fd >= 0)
            .map(|fd| unsafe { BorrowedFd::borrow_raw(fd) })
    };
    let (cancel, progress) = (borrow(call.cancel_fd), borrow(call.progress_fd));
    let which = CallFds {
        cancel: cancel.is_some(),
        progress: progress.is_some(),
    };
    (cancel.into_iter().chain(progress).collect(), which)
}

/// Milliseconds since the Unix epoch at `at`.
fn unix_ms(at: std::time::SystemTime) -> u64 {
    at.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A service of an isolated entry, as the registry holds it.
#[derive(Clone)]
struct ServiceProxy {
    isolated: Arc<Isolated>,
    decl: ServiceDecl,
}

impl ServiceObj for ServiceProxy {
    fn interface(&self) -> ServiceDecl {
        self.decl.clone()
    }

    fn call(&self, method: RStr<'_>, args: RStr<'_>) -> RResult<RString, RError> {
        let (scope, call) = self.isolated.crossing().unzip();
        let (fds, which) = call.as_ref().map(call_fds).unwrap_or_default();
        let msg = Msg::Service {
            name: self.decl.name.to_string(),
            method: method.to_string(),
            args: args.to_string(),
            scope: call.clone(),
            fds: which,
            within: None,
        };
        let what = format!("`{}.{method}`", self.decl.name);
        wire::service_result(self.isolated.call(&what, &msg, &fds, None, scope))
    }
}

/// A tool of an isolated entry, as the registry holds it.
#[derive(Clone)]
struct ToolProxy {
    isolated: Arc<Isolated>,
    tool: String,
}

impl ToolObj for ToolProxy {
    fn call(&self, context: RStr<'_>, args: RStr<'_>) -> RResult<ToolOutput, RError> {
        let parsed: serde_json::Value = serde_json::from_str(context.as_str()).unwrap_or_default();
        let fd_of = |key: &str| {
            parsed[key]
                .as_i64()
                .and_then(|fd| RawFd::try_from(fd).ok())
                .filter(|fd| *fd >= 0)
                // SAFETY: the front-end keeps the call's descriptors open for the whole call.
                .map(|fd| unsafe { BorrowedFd::borrow_raw(fd) })
        };
        let (cancel, progress) = (fd_of("cancel_fd"), fd_of("progress_fd"));
        let fds: Vec<BorrowedFd<'_>> = cancel.iter().chain(progress.iter()).copied().collect();
        let crossing = self.isolated.crossing();
        let msg = Msg::Tool {
            tool: self.tool.clone(),
            context: context.to_string(),
            args: args.to_string(),
            fds: CallFds {
                cancel: cancel.is_some(),
                progress: progress.is_some(),
            },
            scope: crossing.as_ref().map(|(_, call)| call.clone()),
        };
        let what = format!("a call of tool `{}`", self.tool);
        match self
            .isolated
            .call(&what, &msg, &fds, cancel, crossing.map(|(scope, _)| scope))
        {
            Ok(value) => RResult::ROk(ToolOutput {
                is_error: value["is_error"].as_bool().unwrap_or(false),
                text: value["text"].as_str().unwrap_or_default().into(),
            }),
            Err(e) => RResult::RErr(e.into()),
        }
    }
}

/// An isolated entry's instance, as the registry holds it.
struct InstanceProxy {
    isolated: Arc<Isolated>,
}

impl InstanceObj for InstanceProxy {
    fn dispose(&mut self) -> RResult<(), RError> {
        self.isolated.retire();
        RResult::ROk(())
    }

    fn reconfigure(&mut self, config: RStr<'_>) -> RResult<Reconfigured, RError> {
        let msg = Msg::Reconfigure {
            config: config.to_string(),
        };
        match self.isolated.call("a new config", &msg, &[], None, None) {
            Ok(v) if v == "applied" => {
                *lock(&self.isolated.config) = config.to_string();
                RResult::ROk(Reconfigured::Applied)
            }
            Ok(_) => RResult::ROk(Reconfigured::Restart),
            Err(e) => RResult::RErr(e.into()),
        }
    }
}
