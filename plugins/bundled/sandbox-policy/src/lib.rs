//! Provides the `sandboxPolicy` service: the deployment default mode and workspace root
//! (config), per-session mode switches kept as `sandbox/mode` events in the host's session
//! log (never in plugin memory, so a reload or restart loses nothing), the registry of
//! enforcing families, and the model-facing `sandbox:policy` text.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cordis_sdk::host::{
    CallContextClient, CallContextService as _, Composition, CompositionClient, CurrentCall,
    EventQuery, ModelContext, ModelContextClient, NewEvent, Sessions, SessionsClient, CALL_CONTEXT,
    COMPOSITION, SESSIONS,
};
use cordis_sdk::prelude::*;
use dsh_sandbox::egress::{Egress, Host, Rules, APPROVED_HOST_EVENT};
use dsh_sandbox::{
    is_within, ApproveHostArgs, ConfinementTier, EnforcedFamily, Fence, FileId, Limits,
    ResolveArgs, SandboxExecutionPolicy, SandboxMode, SandboxPolicy, SandboxPolicyClient,
    SetModeArgs, Shared, MODE_EVENT, SANDBOX_POLICY,
};
use serde::Deserializer;

/// Error codes of this plugin: those of the `sandboxPolicy` interface.
pub use dsh_sandbox::codes;

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
    /// `false` (default), `true`, or a map (the allowlist). Whether confined commands
    /// (`read-only` and `workspace-write`) may use the network: off, a confined command
    /// has only its own loopback and cannot create unix sockets; on, the host's network.
    /// A map keeps the command's own network namespace and gives it one way out, an HTTP
    /// proxy the shell backend runs for it, which reaches only the hosts the map allows:
    /// `allow` and `deny` (host names, `*.domain`, `*`, IP addresses and CIDRs, each with
    /// an optional `:port`; deny wins), `ask` (an unlisted host is put to a person; an
    /// approval lasts for the session), `limited` (plain-HTTP GET, HEAD and OPTIONS only),
    /// `allowPrivate` (CIDRs a name may resolve to although private or loopback) and
    /// `resolver` (the DNS server the proxy asks). `danger-full-access` always may.
    #[serde(default, deserialize_with = "network_field")]
    #[schemars(with = "NetworkSchema")]
    pub network: Network,
    /// Boolean; default `false`. With `network: true`, whether confined commands may
    /// create unix sockets, and so reach every daemon listening on a socket file the
    /// command can see (`docker.sock`, the session bus, an ssh agent). Without the network
    /// they never may.
    #[serde(default)]
    pub allow_unix_sockets: bool,
    /// List of directories; default none. Writable roots in `workspace-write` besides the
    /// workspace root and the temp areas; each must exist and is canonicalized (`~/`
    /// means the home directory).
    #[serde(default)]
    pub writable_roots: Vec<PathBuf>,
    /// List of paths or glob patterns; default none. Kept read-only to every call below
    /// `danger-full-access`, even beneath a writable root (in addition to what defines the
    /// running composition and the `.git` of every writable root). A path
    /// is absolute or starts with `~/`; a pattern (`*`, `?`, `[`) matches whole
    /// paths, `**/` any directories (`**/.env`). Patterns are applied to commands for what
    /// they match inside the workspace when the command starts.
    #[serde(default)]
    pub protected_paths: Vec<PathBuf>,
    /// List of paths or glob patterns, as `protectedPaths`; default none. Unreadable to
    /// every call below `danger-full-access`: the `fs` backends refuse them and confined
    /// commands see an empty file or directory in their place (e.g. `~/.ssh`, `**/.env`).
    /// The host's state directory (session logs, its HTTP token) is always unreadable.
    #[serde(default)]
    pub deny_read: Vec<PathBuf>,
    /// `full` (default) or `landlock-only`. How confined commands are: `full` gives each
    /// its own user, mount, pid, ipc and network namespaces with a read-only view of `/`,
    /// then Landlock and seccomp, and refuses to run where the host has no unprivileged
    /// user namespaces. `landlock-only` is the explicit degraded tier for such hosts:
    /// Landlock (writes beneath the writable roots only; `denyRead` and the state
    /// directory unreadable), the seccomp filter (no IP sockets with the network off),
    /// `no_new_privs`, no capabilities, the limits and a subreaper, without namespaces; a
    /// command whose policy it cannot enforce (a protected path or `.git` inside a
    /// writable root, an unreadable path inside one) is refused, and the network
    /// allowlist is refused here.
    #[serde(default)]
    pub confinement: ConfinementTier,
    /// Resource limits of every confined command; by default 4096 MiB of memory, 512
    /// processes, 1024 MiB per file, and no CPU limit beyond the call's timeout
    /// (`{memoryMib, processes, fileSizeMib, cpuSeconds}`; `0` turns one off, and for
    /// `cpuSeconds` leaves the call's timeout as the bound). A command over
    /// one is stopped and its result names the limit.
    #[serde(default)]
    pub limits: Limits,
}

/// `~/x` as `$HOME/x`; anything else unchanged.
fn expand_home(path: &Path) -> Result<PathBuf> {
    match path.strip_prefix("~") {
        Ok(rest) => match std::env::var_os("HOME").filter(|h| !h.is_empty()) {
            Some(home) => Ok(PathBuf::from(home).join(rest)),
            None => Err(Error::new(
                codes::SANDBOX_BAD_PATH,
                format!("`{}` starts with `~` but HOME is not set", path.display()),
            )
            .with_help("write the path out in full")),
        },
        Err(_) => Ok(path.to_path_buf()),
    }
}

/// The configured `protectedPaths` or `denyRead` (`key`): `~` expanded, paths canonical
/// as far as they exist, patterns checked.
fn path_rules(key: &str, entries: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in entries {
        let path = expand_home(entry)?;
        if dsh_sandbox::fence::is_pattern(&path) {
            let text = path.to_string_lossy();
            dsh_sandbox::fence::check_pattern(&text).map_err(|e| {
                Error::new(
                    codes::SANDBOX_BAD_PATH,
                    format!("`{key}`: the pattern `{text}` is not valid: {e}"),
                )
                .with_help("fix the pattern (`**/name` matches `name` in any directory)")
            })?;
            out.push(path);
        } else if path.is_absolute() {
            // As written and where it leads: the fence protects both ends of a link.
            out.push(path.clone());
            out.push(dsh_sandbox::canonical_path(&path).unwrap_or(path));
        } else {
            return Err(Error::new(
                codes::SANDBOX_BAD_PATH,
                format!("`{key}`: `{}` is relative", path.display()),
            )
            .with_help("write an absolute path, a `~/` path, or a pattern such as `**/.env`"));
        }
    }
    Ok(out)
}

/// Refuses a `workspace-write` root that would make the whole file system or the home
/// directory writable.
fn check_writable_root(root: &Path, whose: &str) -> Result<()> {
    check_writable_root_at(root, None, whose)
}

/// [`check_writable_root`], with the root already open as `dir` when the caller has it.
fn check_writable_root_at(root: &Path, dir: Option<&std::fs::File>, whose: &str) -> Result<()> {
    check_not_swallowing(root, whose)?;
    let folds = match dir {
        Some(dir) => case_folding(dir),
        None => std::fs::File::open(root)
            .ok()
            .and_then(|dir| case_folding(&dir)),
    };
    match folds {
        Some(why) => Err(not_writable_root(
            whose,
            root,
            &format!("{why}, so `.GIT/hooks` would be `.git/hooks`; the sandbox compares names exactly, and its protections would not hold there"),
            "work in a directory on a case-sensitive file system (or use `read-only`)",
        )),
        None => Ok(()),
    }
}

/// The refusal of `root` (`whose`) as a `workspace-write` root, because of `why`.
fn not_writable_root(whose: &str, root: &Path, why: &str, help: &str) -> Error {
    Error::new(
        codes::SANDBOX_BAD_ROOT,
        format!(
            "{whose} `{}` cannot be a workspace-write root: {why}",
            root.display()
        ),
    )
    .with_help(help)
}

/// Refuses a `workspace-write` root that would make the whole file system or the home
/// directory writable (the part of [`check_writable_root`] that asks nothing of the root).
fn check_not_swallowing(root: &Path, whose: &str) -> Result<()> {
    // Only `/` has no parent among absolute paths.
    let swallows = if root.parent().is_none() {
        Some("the whole file system".to_string())
    } else {
        home_within(root, std::env::var_os("HOME"))
            .map(|h| format!("the home directory `{}`", h.display()))
    };
    match swallows {
        Some(what) => Err(not_writable_root(
            whose,
            root,
            &format!("it would make {what} writable"),
            "start the session in a project directory (or use `read-only`)",
        )),
        None => Ok(()),
    }
}

/// The home directory `home` (`$HOME`), canonical, when it lies strictly beneath `root`;
/// `None` when it does not, or when `home` is unset or unresolvable. It is resolved again
/// only when the variable changes.
fn home_within(root: &Path, home: Option<std::ffi::OsString>) -> Option<PathBuf> {
    static HOME: Mutex<Option<(std::ffi::OsString, Option<PathBuf>)>> = Mutex::new(None);
    let raw = home.filter(|h| !h.is_empty())?;
    let mut known = HOME.lock().unwrap_or_else(|e| e.into_inner());
    if !matches!(&*known, Some((named, _)) if *named == raw) {
        let canonical = PathBuf::from(&raw).canonicalize().ok();
        *known = Some((raw, canonical));
    }
    let home = known.as_ref()?.1.as_ref()?;
    // Both are canonical: the same directory is spelled the same.
    (home.as_os_str() != root.as_os_str() && is_within(home, root)).then(|| home.clone())
}

/// Why the file system of directory `dir` compares names without case, if it does: by
/// its kind, or by the directory's case-folding attribute (ext4 and f2fs `+F`).
fn case_folding(dir: &std::fs::File) -> Option<&'static str> {
    // `f_type`'s width differs between targets.
    #[allow(clippy::unnecessary_cast)]
    let fs_type = rustix::fs::fstatfs(dir).ok().map(|s| s.f_type as i64);
    folds_case(fs_type, inode_flags(dir))
}

/// The inode flags of directory `dir` (`FS_IOC_GETFLAGS`), through a readable descriptor
/// of it: the pinned root is held as an `O_PATH` handle, which `ioctl` refuses.
fn inode_flags(dir: &std::fs::File) -> Option<u64> {
    use rustix::fs::{Mode, OFlags};
    let readable = rustix::fs::openat(
        dir,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    rustix::fs::ioctl_getflags(&readable)
        .ok()
        .map(|f| u64::from(f.bits()))
}

/// The seam of [`case_folding`]: from a `statfs` type and the directory's inode flags.
fn folds_case(fs_type: Option<i64>, flags: Option<u64>) -> Option<&'static str> {
    /// `FS_CASEFOLD_FL`.
    const CASEFOLD: u64 = 0x4000_0000;
    const FOLDING: [(i64, &str); 7] = [
        (0x4d44, "it is on a FAT file system, which ignores case"),
        (
            0x2011_bab0,
            "it is on an exFAT file system, which ignores case",
        ),
        (
            0x5346_544e,
            "it is on an NTFS file system, which ignores case",
        ),
        (
            0x7366_746e,
            "it is on an NTFS file system, which ignores case",
        ),
        (0x482b, "it is on an HFS+ file system, which ignores case"),
        (0xff53_4d42, "it is on an SMB share, which ignores case"),
        (0xfe53_4d42, "it is on an SMB share, which ignores case"),
    ];
    if let Some((_, why)) = fs_type.and_then(|t| FOLDING.iter().find(|(k, _)| *k == t)) {
        return Some(why);
    }
    flags
        .filter(|f| f & CASEFOLD != 0)
        .map(|_| "its directory is case-insensitive (the `+F` attribute)")
}

/// The `network` setting: all or nothing, or the allowlist.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Network {
    /// `false` or `true`.
    All(bool),
    /// A map: the allowlist.
    Allowlist(Egress),
}

impl Default for Network {
    fn default() -> Self {
        Network::All(false)
    }
}

/// How `network` is written (for the schema).
#[derive(JsonSchema)]
#[serde(untagged)]
#[allow(dead_code)]
enum NetworkSchema {
    /// All or nothing.
    All(bool),
    /// The allowlist.
    Allowlist(Egress),
}

/// Parses `network` (`true`, `false` or a map), naming the key and the field at fault.
fn network_field<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Network, D::Error> {
    match serde_json::Value::deserialize(d)? {
        serde_json::Value::Bool(on) => Ok(Network::All(on)),
        map @ serde_json::Value::Object(_) => {
            let egress = serde_json::from_value::<Egress>(map)
                .map_err(|e| serde::de::Error::custom(format!("`network`: {e}")))?;
            // The rules are checked where the config is (`cordis check` runs this too).
            Rules::compile(&egress, &[])
                .map_err(|bad| serde::de::Error::custom(format!("{bad}; {}", bad.help())))?;
            Ok(Network::Allowlist(egress))
        }
        other => Err(serde::de::Error::custom(format!(
            "`network`: expected `true`, `false` or a map (`allow`, `deny`, `ask`, `limited`, `allowPrivate`, `resolver`), found {other}"
        ))),
    }
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
    /// The call being served, as the host set it: whose session to resolve.
    calls: CallContextClient,
    composition: Option<CompositionClient>,
    default_mode: SandboxMode,
    workspace_root: PathBuf,
    /// The workspace root's identity when the config was loaded.
    workspace_root_id: FileId,
    network: bool,
    egress: Option<Egress>,
    allow_unix_sockets: bool,
    writable_roots: Vec<PathBuf>,
    protected_paths: Vec<PathBuf>,
    deny_read: Vec<PathBuf>,
    limits: Limits,
    confinement: ConfinementTier,
    families: Mutex<Families>,
    /// What `resolve` read per session, by id (see [`SessionState`]).
    states: Mutex<HashMap<String, Arc<SessionState>>>,
    /// Events this plugin appended (mode switches, approved hosts): a call that appends
    /// and resolves again sees its own event, although the host's stamps are the call's
    /// start's.
    appended: AtomicU64,
}

/// The most sessions whose state is kept; beyond it the cache starts over.
const MAX_CACHED_STATES: usize = 1024;

/// What `resolve` reads of a session and of the composition, reused by later calls
/// under the same stamps: no event recorded in the session's log (from any process), no
/// reload planned or path protected, and no event appended here since. What a call's
/// policy checks of the file system (the pinned root, the writable root) is checked on
/// every call, and what the paths match is decided where the policy is enforced.
struct SessionState {
    /// `None`: read for an unstamped call, used once and never kept.
    stamps: Option<Stamps>,
    info: cordis_sdk::SessionInfo,
    standing: SandboxMode,
    approved_hosts: Vec<String>,
    protected_paths: Vec<PathBuf>,
    /// The policy resolved from this state last, and the mode and root it was resolved
    /// for: sent again as it is while they stay the same.
    last: Mutex<Option<Resolved>>,
}

/// A policy resolved from a [`SessionState`], and what else it was resolved from.
struct Resolved {
    mode: SandboxMode,
    /// The root's path, identity and change time: a root whose change time is the same is
    /// on the same file system with the same attributes, so its case check stands.
    root: (PathBuf, FileId, Ctime),
    policy: Shared<SandboxExecutionPolicy>,
}

/// When a [`SessionState`] was read: the host's [`CurrentCall::session_seq`] and
/// [`CurrentCall::composition`] of the call, and [`Policy::appended`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamps {
    seq: u64,
    composition: u64,
    appended: u64,
}

fn session_error(id: &str, e: Error) -> Error {
    Error::new(
        codes::SANDBOX_UNKNOWN_SESSION,
        format!("cannot read session `{id}`: {}", e.message),
    )
    .with_help("pass the id of an existing session (`cordis session list` shows them)")
}

impl Policy {
    /// The policy of one call rooted at `root` (the directory `root_id`, open as `dir` when
    /// the caller has it) protecting `protected_paths` (see [`Policy::protected_now`]).
    fn policy(
        &self,
        mode: SandboxMode,
        (root, root_id, dir): (PathBuf, FileId, Option<&std::fs::File>),
        approved_hosts: Vec<String>,
        protected_paths: Vec<PathBuf>,
    ) -> Result<SandboxExecutionPolicy> {
        if mode == SandboxMode::WorkspaceWrite {
            check_writable_root_at(&root, dir, "the workspace root")?;
        }
        Ok(SandboxExecutionPolicy {
            mode,
            workspace_root: root,
            workspace_root_id: Some(root_id),
            network: self.network,
            allow_unix_sockets: self.allow_unix_sockets,
            writable_roots: self.writable_roots.clone(),
            protected_paths,
            deny_read: self.deny_read.clone(),
            limits: self.limits,
            egress: self.egress.clone(),
            approved_hosts,
            confinement: self.confinement,
        })
    }

    /// The policy of a session's call in `mode` rooted at `root` (checked by
    /// [`pinned_root`]), from its `state`: the one resolved last when it was for the same
    /// mode and root, else made now. A `workspace-write` root is checked either way; its
    /// case check is not repeated while the root's change time stays the same (setting
    /// the case-folding attribute changes it).
    fn session_policy(
        &self,
        state: &SessionState,
        mode: SandboxMode,
        root: PinnedRoot,
    ) -> Result<Shared<SandboxExecutionPolicy>> {
        let lock = || state.last.lock().unwrap_or_else(|e| e.into_inner());
        let same = |r: &Resolved| {
            r.mode == mode && r.root.0 == root.path && (r.root.1, r.root.2) == (root.id, root.ctime)
        };
        if let Some(last) = lock().as_ref().filter(|r| same(r)) {
            if mode == SandboxMode::WorkspaceWrite {
                check_not_swallowing(&root.path, "the workspace root")?;
            }
            return Ok(last.policy.clone());
        }
        let made = Shared::new(self.policy(
            mode,
            (root.path.clone(), root.id, Some(&root.dir)),
            state.approved_hosts.clone(),
            state.protected_paths.clone(),
        )?);
        *lock() = Some(Resolved {
            mode,
            root: (root.path, root.id, root.ctime),
            policy: made.clone(),
        });
        Ok(made)
    }

    /// The composition's protected paths, asked fresh (a reload may have added some), and
    /// the configured ones.
    fn protected_now(&self) -> Result<Vec<PathBuf>> {
        let mut protected_paths = match &self.composition {
            Some(c) => c.protected_paths(())?,
            None => Vec::new(),
        };
        protected_paths.extend(self.protected_paths.iter().cloned());
        Ok(protected_paths)
    }

    /// The state of session `id`: the one read under the same `stamps` when there is one,
    /// else read now (and kept, when the host stamped the call).
    fn session_state(&self, id: &str, stamps: Option<Stamps>) -> Result<Arc<SessionState>> {
        let lock = || self.states.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(stamps) = stamps {
            if let Some(state) = lock().get(id).filter(|s| s.stamps == Some(stamps)) {
                return Ok(state.clone());
            }
        }
        let info = self
            .sessions
            .info(id.to_string())
            .map_err(|e| session_error(id, e))?;
        // The log is read even when a mode is approved for this call: a forged log is
        // reported, never silently bypassed.
        let standing = self.session_mode(id)?.unwrap_or(self.default_mode);
        let state = Arc::new(SessionState {
            stamps,
            info,
            standing,
            approved_hosts: self.approved_hosts(id)?,
            protected_paths: self.protected_now()?,
            last: Mutex::new(None),
        });
        if stamps.is_some() {
            let mut states = lock();
            if states.len() >= MAX_CACHED_STATES {
                states.clear();
            }
            states.insert(id.to_string(), state.clone());
        }
        Ok(state)
    }

    /// Appends `event` for session `id`; a later `resolve` of this call sees it.
    fn append(&self, id: &str, event: NewEvent) -> Result<u64> {
        let seq = self
            .sessions
            .append(event)
            .map_err(|e| session_error(id, e));
        // Bumped on a failure too: an append that failed may still have written (its
        // sync failing after the write), and a state read afresh is never wrong.
        self.appended.fetch_add(1, Ordering::SeqCst);
        seq
    }

    /// The hosts a person approved for the session (`host:port`), when the allowlist
    /// asks: its `sandbox/network-approved` events, replayed like mode switches.
    fn approved_hosts(&self, id: &str) -> Result<Vec<String>> {
        if !self.egress.as_ref().is_some_and(|e| e.ask) {
            return Ok(Vec::new());
        }
        let events = self.events(id, APPROVED_HOST_EVENT)?;
        let mut hosts = Vec::new();
        for event in events {
            let host = event
                .data
                .get("host")
                .and_then(|h| h.as_str())
                .and_then(Host::parse);
            let port = event.data.get("port").and_then(|p| p.as_u64());
            match (host, port) {
                (Some(host), Some(port @ 1..=65535)) => hosts.push(format!("{host}:{port}")),
                _ => {
                    return Err(Error::new(
                        codes::SANDBOX_FORGED_MODE,
                        format!(
                            "session `{id}`: event #{} ({APPROVED_HOST_EVENT}) names no valid host and port: {}",
                            event.seq, event.data
                        ),
                    )
                    .with_help("the session log was edited by hand or is corrupt; start a new session"))
                }
            }
        }
        Ok(hosts)
    }

    /// The session's events of one kind, oldest first.
    fn events(&self, id: &str, kind: &str) -> Result<Vec<cordis_sdk::host::SessionEvent>> {
        self.sessions
            .events(EventQuery {
                session: id.to_string(),
                kind: Some(kind.to_string()),
            })
            .map_err(|e| session_error(id, e))
    }

    /// The session's standing mode from its log (last switch wins), rejecting forgeries.
    fn session_mode(&self, id: &str) -> Result<Option<SandboxMode>> {
        let events = self.events(id, MODE_EVENT)?;
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
    fn resolve(&self, args: ResolveArgs) -> Result<Shared<SandboxExecutionPolicy>> {
        let current = self.calls.current(())?;
        let session = calling_session(current.as_ref(), args.session)?;
        let Some(id) = session else {
            let mode = approved_mode(current.as_ref(), args.mode, self.default_mode)?;
            return self
                .policy(
                    mode.unwrap_or(self.default_mode),
                    (self.workspace_root.clone(), self.workspace_root_id, None),
                    Vec::new(),
                    self.protected_now()?,
                )
                .map(Shared::new);
        };
        // Read before the state: a state read after them is at least as new.
        let stamps = current.as_ref().and_then(|call| {
            Some(Stamps {
                seq: call.session_seq?,
                composition: call.composition?,
                appended: self.appended.load(Ordering::SeqCst),
            })
        });
        let state = self.session_state(&id, stamps)?;
        let mode = approved_mode(current.as_ref(), args.mode, state.standing)?;
        let root = pinned_root(&id, &state.info)?;
        self.session_policy(&state, mode.unwrap_or(state.standing), root)
    }

    fn default_mode(&self, _unit: ()) -> Result<SandboxMode> {
        Ok(self.default_mode)
    }

    fn workspace_root(&self, _unit: ()) -> Result<PathBuf> {
        Ok(self.workspace_root.clone())
    }

    fn set_sandbox_mode(&self, args: SetModeArgs) -> Result<u64> {
        let current = self.calls.current(())?;
        let id = calling_session(current.as_ref(), Some(args.session))?.unwrap_or_default();
        self.append(
            &id,
            NewEvent {
                session: id.clone(),
                kind: MODE_EVENT.to_string(),
                data: serde_json::json!({ "mode": args.mode.as_str() }),
            },
        )
    }

    fn approve_host(&self, args: ApproveHostArgs) -> Result<u64> {
        let current = self.calls.current(())?;
        let Some(id) = calling_session(current.as_ref(), args.session.clone())? else {
            return Err(Error::invalid(
                "a host is approved for a session, and this call is outside any",
            )
            .with_help("approve hosts during a session's call"));
        };
        if !self.egress.as_ref().is_some_and(|e| e.ask) {
            return Err(Error::new(
                codes::SANDBOX_BAD_NETWORK,
                "the network allowlist does not ask (`ask: true`), so no host can be approved",
            )
            .with_help("set `ask: true` under `network` in the dsh-sandbox-policy config"));
        }
        let host = Host::parse(&args.host)
            .filter(|_| args.port != 0)
            .ok_or_else(|| {
                Error::new(
                    codes::SANDBOX_BAD_NETWORK,
                    format!("`{}:{}` is not a host and port", args.host, args.port),
                )
                .with_help("approve a host name or address and a port from 1 to 65535")
            })?;
        if let Some(call) = &current {
            if call.isolated_caller.is_some() && !call.approved_modes.contains(&args.grant()) {
                return Err(Error::new(
                    codes::SANDBOX_NOT_APPROVED,
                    format!(
                        "isolated entry `{}` approved {host}:{} without a person's approval for this call",
                        call.isolated_caller.as_deref().unwrap_or_default(),
                        args.port
                    ),
                )
                .with_help("ask through the host's `approval` service first, with `mode` set to the grant (`network:HOST:PORT`)"));
            }
        }
        self.append(
            &id,
            NewEvent {
                session: id.clone(),
                kind: APPROVED_HOST_EVENT.to_string(),
                data: serde_json::json!({ "host": host.to_string(), "port": args.port }),
            },
        )
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

/// The session a `resolve` is for: the calling one where the host set a call context (a
/// session named in the arguments must be that one), else the one named.
fn calling_session(current: Option<&CurrentCall>, named: Option<String>) -> Result<Option<String>> {
    let Some(call) = current else {
        return Ok(named);
    };
    match named {
        None => Ok(call.session.clone()),
        Some(id) if call.session.as_deref() == Some(id.as_str()) => Ok(Some(id)),
        Some(id) => Err(Error::new(
            cordis_sdk::host::codes::SESSION_NOT_CALLING,
            format!(
                "the policy of session `{id}` was asked for during a call {}",
                match &call.session {
                    Some(s) => format!("of session `{s}`"),
                    None => "outside any session".to_string(),
                }
            ),
        )
        .with_help("resolve the calling session's policy: leave `session` out, the host knows it")),
    }
}

/// The mode asked for one call, checked: from a caller in an isolated process, a mode wider
/// than `standing` only when a person approved it for this call (the host recorded it).
fn approved_mode(
    current: Option<&CurrentCall>,
    asked: Option<SandboxMode>,
    standing: SandboxMode,
) -> Result<Option<SandboxMode>> {
    let (Some(call), Some(mode)) = (current, asked) else {
        return Ok(asked);
    };
    let approved = call.approved_modes.iter().any(|m| m == mode.as_str());
    if call.isolated_caller.is_some() && mode.is_wider_than(standing) && !approved {
        return Err(Error::new(
            codes::SANDBOX_NOT_APPROVED,
            format!(
                "isolated entry `{}` asked for mode {mode} (the session's is {standing}) without a person's approval for this call",
                call.isolated_caller.as_deref().unwrap_or_default()
            ),
        )
        .with_help("a wider mode for one call needs the host's approval flow (`approval` with the mode asked for) first"));
    }
    Ok(Some(mode))
}

/// The session's root, checked on every call to still be the directory the session was
/// created in: the recorded path must still resolve to itself (no symlink swapped in) and
/// name the same directory (device and inode), which every enforcing family checks again
/// where it opens the root. Fails closed otherwise.
fn pinned_root(id: &str, info: &cordis_sdk::SessionInfo) -> Result<PinnedRoot> {
    let moved = |now: String| {
        Error::new(
            codes::SANDBOX_BAD_ROOT,
            format!(
                "session `{id}`: its root `{}` no longer names the directory the session was \
                 created in ({now}); refusing to guess where it went",
                info.cwd.display()
            ),
        )
        .with_help("restore the directory, or start a new session in the directory you mean")
    };
    // One open that follows no symlink resolves the path to itself exactly when it is
    // canonical; anything else (a link swapped in, or a kernel without `openat2`) takes
    // the long way, which also says what the path resolves to now.
    let dir = match open_no_links(&info.cwd) {
        Some(dir) => dir,
        None => {
            let canonical = info
                .cwd
                .canonicalize()
                .map_err(|e| moved(format!("it cannot be resolved: {e}")))?;
            if canonical != info.cwd {
                return Err(moved(format!(
                    "it now resolves to `{}`",
                    canonical.display()
                )));
            }
            std::fs::File::open(&canonical).map_err(|e| moved(e.to_string()))?
        }
    };
    let meta = dir.metadata().map_err(|e| moved(e.to_string()))?;
    if !meta.is_dir() {
        return Err(moved("it is not a directory".to_string()));
    }
    let found = FileId::of(&meta);
    let ctime = {
        use std::os::unix::fs::MetadataExt;
        (meta.ctime(), meta.ctime_nsec())
    };
    if let Some((dev, ino)) = info.cwd_id {
        if found != (FileId { dev, ino }) {
            return Err(moved("another directory is there now".to_string()));
        }
    }
    Ok(PinnedRoot {
        path: info.cwd.clone(),
        id: found,
        ctime,
        dir,
    })
}

/// An inode's change time (seconds and nanoseconds).
type Ctime = (i64, i64);

/// A session's root as [`pinned_root`] checked it, open.
struct PinnedRoot {
    path: PathBuf,
    id: FileId,
    ctime: Ctime,
    dir: std::fs::File,
}

/// `path` opened as a directory (an `O_PATH` handle: nothing is read through it, and
/// such an open and its close cost less) when it is plain ([`dsh_sandbox::plain_path`])
/// and no component of it is a symlink; `None` otherwise or where the kernel lacks
/// `openat2`.
fn open_no_links(path: &Path) -> Option<std::fs::File> {
    use rustix::fs::{OFlags, ResolveFlags};
    dsh_sandbox::plain_path(path)?;
    rustix::fs::openat2(
        rustix::fs::CWD,
        path,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
        ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .ok()
    .map(std::fs::File::from)
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
            .injects::<CallContextClient>(CALL_CONTEXT)
            .injects_optional::<CompositionClient>(COMPOSITION)
    }

    fn apply(ctx: &mut Context<'_>, config: Config) -> Result<Self> {
        let sessions: SessionsClient = ctx.inject(SESSIONS)?;
        let calls: CallContextClient = ctx.inject(CALL_CONTEXT)?;
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
        let workspace_root_id = match workspace_root.metadata() {
            Ok(meta) if meta.is_dir() => FileId::of(&meta),
            _ => {
                return Err(Error::new(
                    codes::SANDBOX_BAD_ROOT,
                    format!(
                        "workspaceRoot `{}` is not a directory",
                        workspace_root.display()
                    ),
                )
                .with_help("set `workspaceRoot` to an existing directory"))
            }
        };
        let default_mode = config.mode.unwrap_or(SandboxMode::ReadOnly);
        if default_mode == SandboxMode::WorkspaceWrite {
            check_writable_root(&workspace_root, "workspaceRoot")?;
        }
        let mut writable_roots = Vec::new();
        for root in &config.writable_roots {
            let expanded = expand_home(root)?;
            let canonical = expanded.canonicalize().map_err(|e| {
                Error::new(
                    codes::SANDBOX_BAD_PATH,
                    format!(
                        "`writableRoots`: `{}` cannot be resolved: {e}",
                        root.display()
                    ),
                )
                .with_help("list existing directories")
            })?;
            check_writable_root(&canonical, "`writableRoots` entry")?;
            writable_roots.push(canonical);
        }
        let composition: Option<CompositionClient> = ctx.inject_optional(COMPOSITION)?;
        let mut deny_read = path_rules("denyRead", &config.deny_read)?;
        // The host's own files (its HTTP token, every session's log, status files) are no
        // session's to read: with the token and network on, a command could open a session
        // of its own and answer its own approvals.
        if let Some(c) = &composition {
            let state_dir = c.state_dir(())?;
            if !state_dir.as_os_str().is_empty() {
                deny_read.push(state_dir);
            }
        }
        let network = config.network == Network::All(true);
        let egress = match config.network {
            Network::Allowlist(egress) => Some(egress),
            Network::All(_) => None,
        };
        if egress.is_some() && config.confinement == ConfinementTier::LandlockOnly {
            return Err(Error::new(
                codes::SANDBOX_BAD_NETWORK,
                "`network` is an allowlist, which needs a network namespace of each command's own, and `confinement: landlock-only` makes none",
            )
            .with_help("use `network: false` or `true` in the landlock-only tier, or `confinement: full` on a host with unprivileged user namespaces"));
        }
        let policy = Policy {
            sessions,
            calls,
            composition,
            default_mode,
            workspace_root: workspace_root.clone(),
            workspace_root_id,
            network,
            egress,
            allow_unix_sockets: config.allow_unix_sockets,
            writable_roots,
            protected_paths: path_rules("protectedPaths", &config.protected_paths)?,
            deny_read,
            limits: config.limits,
            confinement: config.confinement,
            families: Mutex::new(Families::default()),
            states: Mutex::new(HashMap::new()),
            appended: AtomicU64::new(0),
        };
        let fence = Fence::of(
            &policy
                .protected_now()
                .and_then(|protected| {
                    policy.policy(
                        SandboxMode::WorkspaceWrite,
                        (workspace_root.clone(), workspace_root_id, None),
                        Vec::new(),
                        protected,
                    )
                })
                .unwrap_or_default(),
        )
        .map_err(|moved| {
            Error::new(codes::SANDBOX_BAD_ROOT, moved.to_string())
                .with_help("keep the configured roots in place while cordis starts")
        })?;
        if let Some(c) = &policy.composition {
            let state_dir = c.state_dir(())?;
            let inside = std::iter::once(&workspace_root)
                .chain(&policy.writable_roots)
                .find(|r| !state_dir.as_os_str().is_empty() && is_within(&state_dir, r));
            if let Some(root) = inside {
                return Err(Error::new(
                    codes::SANDBOX_STATE_DIR_WRITABLE,
                    format!(
                        "the state directory `{}` lies inside the writable root `{}`: a session \
                         could rewrite its own log, and with it its sandbox mode",
                        state_dir.display(),
                        root.display()
                    ),
                )
                .with_help("pass `--state-dir DIR` (or set CORDIS_STATE_DIR) to a directory outside the workspace"));
            }
        }
        for why in &fence.left_out {
            tracing::warn!("{why}");
        }
        let shared = PolicyHandle(Arc::new(policy));
        ctx.provide(SANDBOX_POLICY, SandboxPolicyClient::serve(shared.clone()))?;
        ctx.provide(
            POLICY_CONTEXT,
            ModelContextClient::serve(PolicyContext(shared)),
        )?;
        tracing::info!(mode = %default_mode, root = %workspace_root.display(), confinement = config.confinement.as_str(), "sandbox policy ready");
        if config.confinement == ConfinementTier::LandlockOnly {
            tracing::warn!(
                "confinement: landlock-only: confined commands run under Landlock and seccomp without namespaces (they see the host's processes; a protected or unreadable path inside a writable root, and the network allowlist, are refused); use it only where the host has no unprivileged user namespaces (`cordis doctor`)"
            );
        }
        Ok(SandboxPolicyPlugin)
    }
}

cordis_sdk::export_plugin!(SandboxPolicyPlugin);

#[cfg(test)]
mod tests {
    use super::*;

    /// A root that holds the home directory (however `$HOME` spells it) is refused; the
    /// home directory itself and a project inside it are not.
    #[test]
    fn only_a_root_holding_the_home_directory_swallows_it() {
        let tmp = tempfile::tempdir().expect("a directory");
        let root = tmp.path().canonicalize().expect("canonical");
        let home = root.join("me");
        std::fs::create_dir_all(home.join("project")).expect("home");
        for spelled in [home.clone(), root.join("./me/"), root.join("me/../me")] {
            let var = Some(spelled.clone().into_os_string());
            assert_eq!(
                home_within(&root, var.clone()),
                Some(home.clone()),
                "{spelled:?}"
            );
            assert_eq!(home_within(&home, var.clone()), None, "{spelled:?}");
            assert_eq!(home_within(&home.join("project"), var), None, "{spelled:?}");
        }
        assert_eq!(home_within(&root, None), None);
        assert_eq!(home_within(&root, Some("".into())), None);
        assert_eq!(home_within(&root, Some(root.join("gone").into())), None);
    }

    #[test]
    fn roots_that_fold_case_are_recognised() {
        // ext4 (0xef53) without and with `+F`; FAT; exFAT; nothing known.
        assert_eq!(folds_case(Some(0xef53), Some(0x80000)), None);
        assert!(
            folds_case(Some(0xef53), Some(0x4000_0000 | 0x80000)).is_some_and(|w| w.contains("+F"))
        );
        assert!(folds_case(Some(0x4d44), None).is_some_and(|w| w.contains("FAT")));
        assert!(folds_case(Some(0x2011_bab0), None).is_some_and(|w| w.contains("exFAT")));
        assert_eq!(folds_case(None, None), None);
        // This machine's own temp directory is case-sensitive: the real call agrees.
        let tmp = std::env::temp_dir().canonicalize().unwrap();
        assert_eq!(case_folding(&std::fs::File::open(&tmp).unwrap()), None);
    }

    /// The pinned root is held as an `O_PATH` handle: its inode flags (where `+F` shows)
    /// are still read, through a readable descriptor of the same directory.
    #[test]
    fn the_flags_of_a_pinned_root_are_read_through_its_handle() {
        let root = std::env::temp_dir()
            .canonicalize()
            .unwrap()
            .join(format!("cordis-pinned-{}", std::process::id()));
        std::fs::create_dir(&root).unwrap();
        let pinned = open_no_links(&root).expect("a plain directory opens");
        assert!(
            inode_flags(&pinned).is_some(),
            "FS_IOC_GETFLAGS of {} answered nothing",
            root.display()
        );
        let other = root.join("other");
        std::fs::create_dir(&other).unwrap();
        std::os::unix::fs::symlink(&other, root.join("link")).unwrap();
        let through_link = open_no_links(&root.join("link"));
        std::fs::remove_dir_all(&root).unwrap();
        assert!(through_link.is_none(), "a link is followed");
    }
}
