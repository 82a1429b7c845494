//! Provides the `sandboxPolicy` service: the deployment default mode and workspace root
//! (config), per-session mode switches kept as `sandbox/mode` events in the host's session
//! log (never in plugin memory, so a reload or restart loses nothing), the registry of
//! enforcing families, and the model-facing `sandbox:policy` text.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use cordis_sdk::host::{
    EventQuery, ModelContext, ModelContextClient, NewEvent, Sessions, SessionsClient, SESSIONS,
};
use cordis_sdk::prelude::*;
use dsh_sandbox::{
    EnforcedFamily, ResolveArgs, SandboxExecutionPolicy, SandboxMode, SandboxPolicy,
    SandboxPolicyClient, SetModeArgs, MODE_EVENT, SANDBOX_POLICY,
};
use serde::Deserializer;

/// Error codes of this plugin.
pub mod codes {
    /// A session's `sandbox/mode` event holds a value outside the closed vocabulary.
    pub const SANDBOX_FORGED_MODE: &str = "SANDBOX_FORGED_MODE";
    /// The session could not be read from the host's session store.
    pub const SANDBOX_UNKNOWN_SESSION: &str = "SANDBOX_UNKNOWN_SESSION";
    /// A workspace root (configured or a session's cwd) is not a usable directory.
    pub const SANDBOX_BAD_ROOT: &str = "SANDBOX_BAD_ROOT";
}

/// The config under `config:` in `cordis.yml`.
#[derive(Deserialize, JsonSchema, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    /// String, one of `read-only`, `workspace-write`, `danger-full-access`; default
    /// `read-only` (fail-safe). The deployment default mode: used when a call carries no
    /// approved mode and its session has no `sandbox/mode` switch.
    #[serde(default, deserialize_with = "mode_field")]
    pub mode: Option<SandboxMode>,
    /// Path; default the process's current directory. The fallback workspace root for
    /// calls without a session; canonicalized when the plugin is applied and must exist.
    #[serde(default)]
    pub workspace_root: Option<PathBuf>,
    /// Boolean; default `false`. Whether confined commands (`read-only` and
    /// `workspace-write`) may use the network; off, a confined command has only its own
    /// loopback and cannot create unix sockets. `danger-full-access` always may.
    #[serde(default)]
    pub network: bool,
}

/// Parses `mode`, naming the key and the allowed values when the spelling is wrong.
fn mode_field<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<SandboxMode>, D::Error> {
    let raw = String::deserialize(d)?;
    raw.parse::<SandboxMode>()
        .map(Some)
        .map_err(|e| serde::de::Error::custom(format!("`mode`: {e}")))
}

/// Live contributions of enforcing families: token → family.
#[derive(Default)]
struct Families {
    next: u64,
    live: BTreeMap<u64, EnforcedFamily>,
}

struct Policy {
    sessions: SessionsClient,
    default_mode: SandboxMode,
    workspace_root: PathBuf,
    network: bool,
    families: Mutex<Families>,
}

fn session_error(id: &str, e: Error) -> Error {
    Error::new(
        codes::SANDBOX_UNKNOWN_SESSION,
        format!("cannot read session `{id}`: {}", e.message),
    )
    .with_help("pass the id of an existing session (`cordis session list` shows them)")
}

impl Policy {
    /// The session's standing mode from its log (last switch wins), rejecting forgeries.
    fn session_mode(&self, id: &str) -> Result<Option<SandboxMode>> {
        let events = self
            .sessions
            .events(EventQuery {
                session: id.to_string(),
                kind: Some(MODE_EVENT.to_string()),
            })
            .map_err(|e| session_error(id, e))?;
        dsh_sandbox::effective_sandbox_mode(&events).map_err(|forged| {
            Error::new(
                codes::SANDBOX_FORGED_MODE,
                format!("session `{id}`: {forged}"),
            )
            .with_help("the session log was edited by hand or is corrupt; start a new session")
            .with_data(serde_json::json!({ "session": id, "seq": forged.seq }))
        })
    }
}

impl SandboxPolicy for PolicyHandle {
    fn resolve(&self, args: ResolveArgs) -> Result<SandboxExecutionPolicy> {
        let Some(id) = args.session else {
            return Ok(SandboxExecutionPolicy {
                mode: args.mode.unwrap_or(self.default_mode),
                workspace_root: self.workspace_root.clone(),
                network: self.network,
            });
        };
        let info = self
            .sessions
            .info(id.clone())
            .map_err(|e| session_error(&id, e))?;
        // The log is checked even when a mode is approved for this call: a forged log is
        // reported, never silently bypassed.
        let logged = self.session_mode(&id)?;
        let root = info.cwd.canonicalize().map_err(|e| {
            Error::new(
                codes::SANDBOX_BAD_ROOT,
                format!(
                    "session `{id}`: its cwd `{}` is not usable: {e}",
                    info.cwd.display()
                ),
            )
            .with_help("restore the directory or start a session in an existing directory")
        })?;
        Ok(SandboxExecutionPolicy {
            mode: args.mode.or(logged).unwrap_or(self.default_mode),
            workspace_root: root,
            network: self.network,
        })
    }

    fn default_mode(&self, _unit: ()) -> Result<SandboxMode> {
        Ok(self.default_mode)
    }

    fn workspace_root(&self, _unit: ()) -> Result<PathBuf> {
        Ok(self.workspace_root.clone())
    }

    fn set_sandbox_mode(&self, args: SetModeArgs) -> Result<u64> {
        let id = args.session;
        self.sessions
            .append(NewEvent {
                session: id.clone(),
                kind: MODE_EVENT.to_string(),
                data: serde_json::json!({ "mode": args.mode.as_str() }),
            })
            .map_err(|e| session_error(&id, e))
    }

    fn register_enforced_family(&self, family: EnforcedFamily) -> Result<u64> {
        let mut f = self.families.lock().unwrap_or_else(|e| e.into_inner());
        f.next += 1;
        let token = f.next;
        f.live.insert(token, family);
        Ok(token)
    }

    fn unregister_enforced_family(&self, token: u64) -> Result<()> {
        let mut f = self.families.lock().unwrap_or_else(|e| e.into_inner());
        match f.live.remove(&token) {
            Some(_) => Ok(()),
            None => Err(Error::invalid(format!(
                "no enforced-family contribution has token {token}"
            ))
            .with_help("pass a token returned by register_enforced_family, once")),
        }
    }

    fn enforced_families(&self, _unit: ()) -> Result<Vec<EnforcedFamily>> {
        let f = self.families.lock().unwrap_or_else(|e| e.into_inner());
        let mut families: Vec<EnforcedFamily> = f.live.values().copied().collect();
        families.sort();
        families.dedup();
        Ok(families)
    }

    fn policy_text(&self, session: Option<String>) -> Result<String> {
        if self.enforced_families(())?.is_empty() {
            return Ok(String::new());
        }
        let policy = self.resolve(ResolveArgs {
            session,
            mode: None,
        })?;
        Ok(dsh_sandbox::policy_text(&policy))
    }
}

/// The registry name of the model-context contribution (the seeds' `sandbox:policy`).
pub const POLICY_CONTEXT: &str = "sandbox:policy";

/// The `sandbox:policy` contribution: the same text as `policy_text`, for front-ends.
struct PolicyContext(PolicyHandle);

impl ModelContext for PolicyContext {
    fn context(&self, session: Option<String>) -> Result<String> {
        self.0.policy_text(session)
    }
}

/// One policy shared by the `sandboxPolicy` service and its context contribution.
#[derive(Clone)]
struct PolicyHandle(Arc<Policy>);

impl std::ops::Deref for PolicyHandle {
    type Target = Policy;
    fn deref(&self) -> &Policy {
        &self.0
    }
}

/// The plugin.
pub struct SandboxPolicyPlugin;

impl Plugin for SandboxPolicyPlugin {
    type Config = Config;

    fn metadata() -> Metadata {
        Metadata::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION"))
            .description("owns the sandbox policy: default mode, session switches, policy text")
            .provides::<SandboxPolicyClient>(SANDBOX_POLICY)
            .provides::<ModelContextClient>(POLICY_CONTEXT)
            .injects::<SessionsClient>(SESSIONS)
    }

    fn apply(ctx: &mut Context<'_>, config: Config) -> Result<Self> {
        let sessions: SessionsClient = ctx.inject(SESSIONS)?;
        let configured = match config.workspace_root {
            Some(root) => root,
            None => std::env::current_dir().map_err(|e| {
                Error::new(
                    codes::SANDBOX_BAD_ROOT,
                    format!("the current directory is not usable as the workspace root: {e}"),
                )
                .with_help("set `workspaceRoot` in this entry's config")
            })?,
        };
        let workspace_root = configured.canonicalize().map_err(|e| {
            Error::new(
                codes::SANDBOX_BAD_ROOT,
                format!(
                    "workspaceRoot `{}` cannot be resolved: {e}",
                    configured.display()
                ),
            )
            .with_help("set `workspaceRoot` to an existing directory")
        })?;
        if !workspace_root.is_dir() {
            return Err(Error::new(
                codes::SANDBOX_BAD_ROOT,
                format!(
                    "workspaceRoot `{}` is not a directory",
                    workspace_root.display()
                ),
            )
            .with_help("set `workspaceRoot` to an existing directory"));
        }
        let default_mode = config.mode.unwrap_or(SandboxMode::ReadOnly);
        let shared = PolicyHandle(Arc::new(Policy {
            sessions,
            default_mode,
            workspace_root: workspace_root.clone(),
            network: config.network,
            families: Mutex::new(Families::default()),
        }));
        ctx.provide(SANDBOX_POLICY, SandboxPolicyClient::serve(shared.clone()))?;
        ctx.provide(
            POLICY_CONTEXT,
            ModelContextClient::serve(PolicyContext(shared)),
        )?;
        tracing::info!(mode = %default_mode, root = %workspace_root.display(), "sandbox policy ready");
        Ok(SandboxPolicyPlugin)
    }
}

cordis_sdk::export_plugin!(SandboxPolicyPlugin);
