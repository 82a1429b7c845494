//! A running composition as the front-ends see it: the tool list, tool calls in a session,
//! the model context for a session, and transactional reloads. Calls take a snapshot of the
//! tool and of the current generation's libraries under a short lock and run without it,
//! so concurrent calls never wait for each other, a call that is in flight during a reload
//! finishes on the generation it started on, and calls that arrive during a reload wait for
//! the swap and then go to the new generation.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use cordis_sdk::host::{ModelContextClient, MODEL_CONTEXT_INTERFACE};
use cordis_sdk::{CallContext, Interface, Service, SessionInfo, ToolResult};

use crate::approval::{ApprovalRouter, Asker};
use crate::diag::Diagnostics;
use crate::loader::Library;
use crate::plan::Plan;
use crate::registry::{ApplyError, CallStamps, Registry, UnknownTool};
use crate::sessions::{Origin, SessionError, SessionStore};
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
    /// The MCP tool annotations the plugin declared (a JSON object), if any.
    pub annotations: Option<serde_json::Value>,
    /// The JSON Schema of its structured content, if it has any.
    pub output_schema: Option<serde_json::Value>,
}

/// Every tool of `registry` as a front-end lists it, sorted by name.
fn tool_infos(registry: &Registry) -> Vec<ToolInfo> {
    registry
        .tools
        .values()
        .map(|t| ToolInfo {
            name: t.decl.name.to_string(),
            description: t.decl.description.to_string(),
            input_schema: serde_json::from_str(&t.decl.input_schema)
                .unwrap_or_else(|_| serde_json::json!({ "type": "object" })),
            annotations: t.extras.get("annotations").cloned(),
            output_schema: t.extras.get("outputSchema").cloned(),
        })
        .collect()
}

/// The applied composition, as [`Runtime::inspect`] shows it.
pub struct Composition {
    plan: Plan,
    registry: Registry,
    /// Every library of this generation; a call holds a clone until it returns.
    libraries: Arc<Vec<Arc<Library>>>,
}

impl Composition {
    /// The plan it was applied from.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Its services and tools.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    fn new(plan: Plan, registry: Registry) -> Self {
        let libraries = Arc::new(plan.entries.iter().map(|p| p.library.clone()).collect());
        Composition {
            plan,
            registry,
            libraries,
        }
    }
}

type Listener = Box<dyn Fn(&ReloadReport) + Send + Sync>;

/// A host with its composition applied.
pub struct Runtime {
    host: Host,
    composition: Mutex<Composition>,
    /// Held by a reload; `true` once the runtime was shut down (no reload after that).
    reloading: Mutex<bool>,
    /// Held while reloads must wait (a `--dev` build writing libraries one by one).
    held: Mutex<()>,
    reload_listeners: Mutex<Vec<Listener>>,
    /// Counts the reloads that swapped the composition (what the model context of a
    /// session depends on besides the session's log).
    epoch: std::sync::atomic::AtomicU64,
    /// The model context last computed for each session, with the epoch and the session
    /// log's last sequence number it was computed at.
    contexts: Mutex<HashMap<Option<String>, (u64, u64, String)>>,
}

/// The most sessions whose model context is kept at once (more: all are dropped).
const MAX_CACHED_CONTEXTS: usize = 4096;

/// Where a session opened by [`Runtime::open_session`] starts.
#[derive(Clone, Copy, Debug)]
pub enum SessionStart<'a> {
    /// A new long-lived session rooted at this directory.
    New(&'a Path),
    /// A new session for one call, rooted at this directory (`cordis session prune`
    /// removes it once old).
    ForOneCall(&'a Path),
    /// The session with this id, which exists.
    Resume(&'a str),
}

/// A session with its approval route, which ends when this is dropped.
pub struct OpenSession {
    info: SessionInfo,
    approvals: Option<Arc<ApprovalRouter>>,
    /// Held while open: retention never removes it.
    _hold: crate::sessions::SessionHold,
}

impl OpenSession {
    /// The session.
    pub fn info(&self) -> &SessionInfo {
        &self.info
    }
}

impl Drop for OpenSession {
    fn drop(&mut self) {
        if let Some(approvals) = &self.approvals {
            approvals.unbind(&self.info.id);
        }
    }
}

/// Something taken out of the composition (a tool, service handles) together with the
/// generation it belongs to, so a call finishes on the generation it started on. Fields
/// drop in order: the handles before the libraries that hold their code.
struct Held<T> {
    value: T,
    _libraries: Arc<Vec<Arc<Library>>>,
}

/// What one reload did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ReloadReport {
    /// Entries added.
    pub added: Vec<String>,
    /// Entries removed (or disabled).
    pub removed: Vec<String>,
    /// Entries whose new config was taken in place.
    pub reconfigured: Vec<String>,
    /// Entries restarted, with old and new library generation.
    pub restarted: Vec<(String, u64, u64)>,
    /// Whether the tool list changed.
    pub tools_changed: bool,
    /// How long it took, in milliseconds.
    pub millis: u128,
}

impl ReloadReport {
    /// Nothing changed.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty()
            && self.removed.is_empty()
            && self.reconfigured.is_empty()
            && self.restarted.is_empty()
    }
}

impl std::fmt::Display for ReloadReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let list = |v: &[String]| {
            if v.is_empty() {
                "-".to_string()
            } else {
                v.join(", ")
            }
        };
        let restarted: Vec<String> = self
            .restarted
            .iter()
            .map(|(id, old, new)| format!("{id} g{old}→g{new}"))
            .collect();
        write!(
            f,
            "reload: added {}; removed {}; reconfigured in place {}; restarted {}; {} ms",
            list(&self.added),
            list(&self.removed),
            list(&self.reconfigured),
            list(&restarted),
            self.millis
        )
    }
}

/// Why a reload left the running composition as it was.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The new composition is invalid; nothing was touched.
    #[error("the new composition is invalid; still running the previous one\n{0}")]
    Invalid(Diagnostics),
    /// An entry failed to apply; the affected entries were rolled back.
    #[error("{error}; rolled back to the previous libraries and configs{}", if *.rolled_back { "" } else { " (the rollback itself failed: see the log)" })]
    Apply {
        /// The failure.
        error: ApplyError,
        /// Whether every affected entry was restored.
        rolled_back: bool,
    },
}

impl Runtime {
    /// Plans and applies `host`'s manifest.
    pub fn start(host: Host) -> anyhow::Result<Arc<Runtime>> {
        let plan = host.plan()?;
        Ok(Runtime::apply(host, plan)?)
    }

    /// Applies `plan`, made by `host` ([`Host::plan`]).
    pub fn apply(host: Host, plan: Plan) -> Result<Arc<Runtime>, ApplyError> {
        let registry = host.apply(&plan)?;
        Ok(Arc::new(Runtime {
            host,
            composition: Mutex::new(Composition::new(plan, registry)),
            reloading: Mutex::new(false),
            held: Mutex::new(()),
            reload_listeners: Mutex::new(Vec::new()),
            epoch: std::sync::atomic::AtomicU64::new(0),
            contexts: Mutex::new(HashMap::new()),
        }))
    }

    /// Makes every reload wait until the guard is dropped.
    pub fn hold_reloads(&self) -> MutexGuard<'_, ()> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Calls `listener` after every reload that changed something, with its report.
    pub fn on_reloaded(&self, listener: impl Fn(&ReloadReport) + Send + Sync + 'static) {
        self.reload_listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Box::new(listener));
    }

    /// The manifest and library files this composition was built from (what to watch).
    pub fn watched_files(&self) -> Vec<std::path::PathBuf> {
        let c = self.composition();
        let mut files = vec![self.host.manifest().to_path_buf()];
        files.extend(c.plan.entries.iter().map(|p| p.library.path.clone()));
        files
    }

    /// Re-plans the manifest and applies the difference transactionally: entries whose
    /// library changed are restarted on the new library, config changes are offered in
    /// place (restart when refused), added entries are applied, removed ones disposed, and
    /// every entry that injects a restarted or removed provider is restarted after it.
    /// An invalid composition or a failed apply leaves the previous one running.
    pub fn reload(&self) -> Result<ReloadReport, ReloadError> {
        drop(self.hold_reloads());
        let shut_down = self.reloading.lock().unwrap_or_else(|e| e.into_inner());
        if *shut_down {
            return Ok(ReloadReport::default());
        }
        let started = Instant::now();
        let loaded: Vec<Arc<Library>> = self.composition().libraries.iter().cloned().collect();
        let new_plan = crate::plan::plan_with(&self.host.manifest, &self.host.options, &loaded)
            .map_err(ReloadError::Invalid)?;
        drop(loaded);

        let mut guard = self.composition();
        let c = &mut *guard;
        let tools_before = tool_infos(&c.registry);
        let changes = crate::reload::replace(
            &mut c.registry,
            &crate::reload::shape(&c.plan),
            &crate::reload::shape(&new_plan),
        )
        .map_err(|f| ReloadError::Apply {
            error: f.error,
            rolled_back: f.rolled_back,
        })?;
        let generation = |plan: &Plan, id: &str| {
            plan.entries
                .iter()
                .find(|p| p.entry.id == id)
                .map_or(0, |p| p.library.generation)
        };
        let mut report = ReloadReport {
            restarted: changes
                .restarted
                .iter()
                .map(|id| {
                    (
                        id.clone(),
                        generation(&c.plan, id),
                        generation(&new_plan, id),
                    )
                })
                .collect(),
            added: changes.added,
            removed: changes.removed,
            reconfigured: changes.reconfigured,
            ..ReloadReport::default()
        };
        report.tools_changed = tools_before != tool_infos(&c.registry);
        *c = Composition {
            libraries: Arc::new(new_plan.entries.iter().map(|p| p.library.clone()).collect()),
            plan: new_plan,
            registry: std::mem::take(&mut c.registry),
        };
        self.epoch.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        drop(guard);
        report.millis = started.elapsed().as_millis();
        if !report.is_empty() {
            for listener in self
                .reload_listeners
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
            {
                listener(&report);
            }
        }
        Ok(report)
    }

    /// The composition, locked: held briefly, never across a tool call.
    fn composition(&self) -> MutexGuard<'_, Composition> {
        self.composition.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the current composition (to describe it; reloads wait meanwhile, so `f`
    /// must not call a tool).
    pub fn inspect<R>(&self, f: impl FnOnce(&Composition) -> R) -> R {
        f(&self.composition())
    }

    /// The host this runtime applied.
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// The session store.
    pub fn sessions(&self) -> &Arc<SessionStore> {
        self.host.sessions()
    }

    /// Where approval requests go.
    pub fn approvals(&self) -> &Arc<ApprovalRouter> {
        self.host.approvals()
    }

    /// Opens a session (a new one, or one that exists) with its approval route: the
    /// session's approval requests go to `asker` until the returned session is dropped
    /// (without one they are answered by the router's default: `unavailable` unless set).
    pub fn open_session(
        &self,
        start: SessionStart<'_>,
        asker: Option<Asker>,
    ) -> Result<OpenSession, SessionError> {
        let sessions = self.sessions();
        let (info, hold) = match start {
            SessionStart::New(cwd) => {
                let info = sessions.create(cwd)?;
                let hold = sessions.hold(&info.id)?;
                (info, hold)
            }
            SessionStart::ForOneCall(cwd) => {
                let info = sessions.create_with(cwd, Some(Origin::Call))?;
                let hold = sessions.hold(&info.id)?;
                (info, hold)
            }
            // Held first: a session being removed by retention is then either gone (and
            // not found) or kept.
            SessionStart::Resume(id) => {
                let hold = sessions.hold(id)?;
                (sessions.get(id)?, hold)
            }
        };
        let approvals = asker.map(|asker| {
            self.approvals().bind(&info.id, asker);
            self.approvals().clone()
        });
        Ok(OpenSession {
            info,
            approvals,
            _hold: hold,
        })
    }

    /// Every registered tool, sorted by name.
    pub fn tools(&self) -> Vec<ToolInfo> {
        tool_infos(&self.composition().registry)
    }

    /// Calls tool `name` in the session of `call`.
    pub fn call_tool(
        &self,
        name: &str,
        call: &CallContext,
        args: &serde_json::Value,
    ) -> Result<ToolResult, UnknownTool> {
        let call_on = {
            let c = self.composition();
            Held {
                value: c.registry.tool(name)?.clone(),
                _libraries: c.libraries.clone(),
            }
        };
        // Read before the call: what a provider derives afterwards is at least this new.
        let stamps = CallStamps {
            session_seq: self.host.sessions().last_seq(&call.session.id).ok(),
            composition: Some(self.host.services().protection().stamp()),
        };
        Ok(call_on.value.call_stamped(call, args, stamps))
    }

    /// The model context for a session: every non-empty contribution of a service that
    /// implements the model-context interface, in service-name order, one per paragraph.
    /// Computed once per state it depends on: the composition (a reload) and the session's
    /// log (a mode switch, from any process); reused until one of them changes.
    pub fn model_context(&self, session: Option<&str>) -> String {
        use std::sync::atomic::Ordering;
        // Read before computing: a change meanwhile leaves an entry that no longer matches.
        let epoch = self.epoch.load(Ordering::SeqCst);
        let seq = match session {
            Some(id) => match self.host.sessions().last_seq(id) {
                Ok(seq) => seq,
                // Not cached: whatever is wrong is for the contributions to report.
                Err(_) => return self.compute_model_context(session),
            },
            None => 0,
        };
        let key = session.map(str::to_string);
        let cached = self
            .contexts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .filter(|(e, s, _)| *e == epoch && *s == seq)
            .map(|(_, _, text)| text.clone());
        if let Some(text) = cached {
            return text;
        }
        let text = self.compute_model_context(session);
        let mut contexts = self.contexts.lock().unwrap_or_else(|e| e.into_inner());
        if contexts.len() >= MAX_CACHED_CONTEXTS {
            contexts.clear();
        }
        contexts.insert(key, (epoch, seq, text.clone()));
        text
    }

    fn compute_model_context(&self, session: Option<&str>) -> String {
        let providers: Held<Vec<(String, Service)>> = {
            let c = self.composition();
            Held {
                value: c
                    .registry
                    .services
                    .iter()
                    .filter(|(_, s)| s.spec.interface == MODEL_CONTEXT_INTERFACE)
                    .map(|(name, s)| (name.clone(), s.handle.clone()))
                    .filter_map(|(name, h)| {
                        Service::checked::<ModelContextClient>(&name, h)
                            .ok()
                            .map(|c| (name, c.service().clone()))
                    })
                    .collect(),
                _libraries: c.libraries.clone(),
            }
        };
        let mut parts = Vec::new();
        // Each contribution answers for `session` (the host's scope, not only an argument).
        let _scope = crate::scope::enter(crate::scope::Scope::new(cordis_sdk::host::CurrentCall {
            session: session.map(str::to_string),
            ..Default::default()
        }));
        for (name, service) in &providers.value {
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

    /// Disposes the composition (reverse order); no reload happens after this.
    pub fn shutdown(&self) {
        let mut shut_down = self.reloading.lock().unwrap_or_else(|e| e.into_inner());
        *shut_down = true;
        self.composition().registry.dispose_all();
    }

    /// Runs `f` with service `name` through its interface crate's typed client `I` (the
    /// identity and version checked as for any consumer), on the generation it was taken
    /// from, for host commands that address a plugin service by its registry name (e.g.
    /// `cordis session set-mode` with `sandboxPolicy`).
    pub fn with_service<I: Interface, R>(
        &self,
        name: &str,
        f: impl FnOnce(&I) -> cordis_sdk::Result<R>,
    ) -> anyhow::Result<R> {
        let held = {
            let c = self.composition();
            let handle = c.registry.services.get(name).map(|s| s.handle.clone()).ok_or_else(|| {
                anyhow::anyhow!(
                    "no service `{name}` in this composition; add the plugin that provides it to cordis.yml"
                )
            })?;
            Held {
                value: Service::checked::<I>(name, handle).map_err(|e| anyhow::anyhow!("{e}"))?,
                _libraries: c.libraries.clone(),
            }
        };
        f(&held.value).map_err(|e| anyhow::anyhow!("{e}"))
    }
}
