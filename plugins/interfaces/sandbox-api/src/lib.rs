//! The shared sandbox vocabulary every enforcing family and every tool speaks: the closed
//! set of [`SandboxMode`]s, the per-call [`SandboxExecutionPolicy`], the one
//! [`writable_roots`] function both the fs fence and the shell runner use, path
//! canonicalization and containment, the model-facing denial marker, the escalation
//! parameter check, the ordered fail-closed [`approve_escalation`], and the `sandboxPolicy`
//! service interface ([`SandboxPolicy`]). It depends on no approval or agent code:
//! approval comes in through the minimal [`EscalationApprover`] trait.
//!
//! # Using `sandboxPolicy` from a plugin
//!
//! Declare `.injects::<SandboxPolicyClient>(SANDBOX_POLICY)` in `metadata()` and take the
//! client with `ctx.inject(SANDBOX_POLICY)?`. The rules a consumer follows:
//!
//! - **Resolve on every call, never cache**: [`SandboxPolicy::resolve`] with the calling
//!   session's id gives the policy that call runs under (an approved escalation's mode >
//!   the session's last `sandbox/mode` switch > the deployment default; the session's cwd
//!   as workspace root, checked on every call to still be the directory the session was
//!   created in; the composition's protected paths, which grow with a reload). Pass it on
//!   to `fs` and `shell` as their `policy`.
//! - **Escalate only through the approval flow**: a tool's `sandbox_permissions` argument
//!   goes through [`escalation_params`] and [`approve_escalation`]; only an approved call
//!   resolves with `mode: Some(...)`.
//! - **Refuse with the marker, once**: a sandbox refusal starts with [`denial_marker`], so a
//!   model can tell it from a failure. The backend that refuses puts it there: `fs` at the
//!   start of its `FS_SANDBOX_DENIED` message (as `dsh_fs_api::sandbox_refused` writes it,
//!   the stand-in `TempDirFs` included), `shell` as its result's `sandbox_denied`. A tool
//!   passes a backend's refusal on as it is, and starts its own text with the marker only
//!   for a refusal of its own (e.g. a shell result flagged `sandbox_denied`).
//! - **Errors** are [`codes`]: an unreadable session, a forged mode switch or a root that
//!   is no longer the session's make `resolve` fail; a tool reports that as an error
//!   result and does nothing.
//!
//! ```no_run
//! use cordis_sdk::CallContext;
//! use dsh_sandbox::{ResolveArgs, SandboxMode, SandboxPolicy, SandboxPolicyClient};
//!
//! /// Whether the calling session may write at all, as of this call.
//! fn may_write(policy: &SandboxPolicyClient, call: &CallContext) -> cordis_sdk::Result<bool> {
//!     let resolved = policy.resolve(ResolveArgs {
//!         session: Some(call.session.id.clone()),
//!         mode: None,
//!     })?;
//!     Ok(resolved.mode != SandboxMode::ReadOnly)
//! }
//! ```
//!
//! For tests, the feature `testing` adds [`testing::FixedPolicy`](crate::testing), a
//! `sandboxPolicy` with one fixed policy to pass to `cordis-test` as a stand-in.

use std::fmt;
use std::path::{Component, Path, PathBuf};
use std::str::FromStr;

use cordis_sdk::host::SessionEvent;
pub use cordis_sdk::Shared;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A file-effect mode. Wider order: read-only < workspace-write < danger-full-access.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum SandboxMode {
    /// No file modification (the fail-safe default).
    #[default]
    ReadOnly,
    /// Modifications beneath the workspace root and the temp areas.
    WorkspaceWrite,
    /// Unrestricted.
    DangerFullAccess,
}

/// Every mode, narrowest first.
pub const SANDBOX_MODES: [SandboxMode; 3] = [
    SandboxMode::ReadOnly,
    SandboxMode::WorkspaceWrite,
    SandboxMode::DangerFullAccess,
];

impl SandboxMode {
    /// The mode's spelling in configs, events and markers.
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxMode::ReadOnly => "read-only",
            SandboxMode::WorkspaceWrite => "workspace-write",
            SandboxMode::DangerFullAccess => "danger-full-access",
        }
    }

    /// Strictly wider than `other`.
    pub fn is_wider_than(self, other: SandboxMode) -> bool {
        self > other
    }

    /// The modes strictly wider than this one (escalation targets).
    pub fn wider_modes(self) -> Vec<SandboxMode> {
        SANDBOX_MODES
            .into_iter()
            .filter(|m| m.is_wider_than(self))
            .collect()
    }
}

impl fmt::Display for SandboxMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A mode spelling outside the closed vocabulary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownMode(pub String);

impl fmt::Display for UnknownMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown sandbox mode `{}`; expected one of: read-only, workspace-write, danger-full-access",
            self.0
        )
    }
}

impl std::error::Error for UnknownMode {}

impl FromStr for SandboxMode {
    type Err = UnknownMode;
    fn from_str(s: &str) -> Result<Self, UnknownMode> {
        SANDBOX_MODES
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| UnknownMode(s.to_string()))
    }
}

/// The full policy one call runs under: the effective mode, the workspace root, and what
/// the policy owner adds to the fence (extra writable roots, protected paths, unreadable
/// paths). Paths are canonical; an entry of `protected_paths` or `deny_read` holding a glob
/// character (`*`, `?`, `[`) is a pattern (see [`PathSet`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxExecutionPolicy {
    /// The effective mode for this call.
    pub mode: SandboxMode,
    /// The canonical workspace root for this call.
    pub workspace_root: PathBuf,
    /// Whether a confined command may use the network (`read-only` and `workspace-write`;
    /// `danger-full-access` always may). Off by default.
    #[serde(default)]
    pub network: bool,
    /// Whether a confined command with `network` on may create unix sockets (and so reach
    /// the host's daemons through their socket files: `docker.sock`, the session bus, an
    /// ssh agent). Off by default; with `network` off they are always refused.
    #[serde(default)]
    pub allow_unix_sockets: bool,
    /// The identity of the workspace root as the policy owner verified it (for a session,
    /// the directory the session was created in): every enforcing family uses the root
    /// only while it is still that directory, so a root renamed away and replaced (by a
    /// link, or another directory) after the check is refused, never followed. `None`:
    /// the root is checked only to still resolve to itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_root_id: Option<FileId>,
    /// Writable roots besides the workspace root and the temp areas (canonical).
    #[serde(default)]
    pub writable_roots: Vec<PathBuf>,
    /// Paths no call below `danger-full-access` may modify, even beneath a writable root:
    /// what defines the running composition (manifest, plugin libraries and their
    /// directories, the state directory) and the configured `protectedPaths`.
    #[serde(default)]
    pub protected_paths: Vec<PathBuf>,
    /// Paths no call below `danger-full-access` may read (the configured `denyRead`).
    #[serde(default)]
    pub deny_read: Vec<PathBuf>,
    /// The resource limits of every confined command (the configured `limits`).
    #[serde(default)]
    pub limits: Limits,
    /// The network allowlist (`network:` configured as a map): with it, `network` is off
    /// (the command keeps its own network namespace) and the command reaches the hosts it
    /// allows through a proxy the shell backend runs for it. A backend that does not know
    /// this field runs the command without network: it fails closed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<egress::Egress>,
    /// The hosts (`host:port`) a person approved for this call's session with the
    /// allowlist's `ask` (its `sandbox/network-approved` events).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approved_hosts: Vec<String>,
    /// How confined commands are: `full` (namespaces, Landlock, seccomp) or, where the
    /// host has no user namespaces, the explicit `landlock-only` tier. A backend that does
    /// not know this field confines fully (and fails closed where it cannot).
    #[serde(default, skip_serializing_if = "ConfinementTier::is_full")]
    pub confinement: ConfinementTier,
}

/// How confined commands are (the policy owner's `confinement`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ConfinementTier {
    /// New user, mount, pid, ipc and network namespaces with a read-only view of `/`,
    /// Landlock and seccomp (the default).
    #[default]
    Full,
    /// For hosts without unprivileged user namespaces: Landlock (writes beneath the
    /// writable roots only, nothing readable the policy denies), the seccomp filter (with
    /// the network off, no IP sockets), `no_new_privs`, no capabilities, the resource
    /// limits and a child subreaper; no mount, pid or network namespace. What it cannot
    /// do is refused: a protected path inside a writable root (Landlock cannot keep part
    /// of a writable root read-only), and the network allowlist (it needs the network
    /// namespace).
    LandlockOnly,
}

impl ConfinementTier {
    /// Whether this is the default, full tier.
    pub fn is_full(&self) -> bool {
        *self == ConfinementTier::Full
    }

    /// The spelling in `cordis.yml`.
    pub fn as_str(self) -> &'static str {
        match self {
            ConfinementTier::Full => "full",
            ConfinementTier::LandlockOnly => "landlock-only",
        }
    }
}

/// Which directory (or file) a path named when it was checked: its device and inode. A
/// path re-resolved later may name another; comparing identities tells.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub struct FileId {
    /// The device.
    pub dev: u64,
    /// The inode on it.
    pub ino: u64,
}

impl FileId {
    /// The identity in `meta`.
    pub fn of(meta: &std::fs::Metadata) -> FileId {
        use std::os::unix::fs::MetadataExt;
        FileId {
            dev: meta.dev(),
            ino: meta.ino(),
        }
    }
}

impl FileId {
    /// The identity of what the open descriptor `fd` refers to (an `O_PATH` one too).
    pub fn of_fd(fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<FileId> {
        let file = std::fs::File::from(fd.try_clone_to_owned()?);
        Ok(FileId::of(&file.metadata()?))
    }
}

impl fmt::Display for FileId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "device {}, inode {}", self.dev, self.ino)
    }
}

/// The resource limits of one confined command (the policy's `limits`). A command over one
/// is stopped (memory, CPU time), or refused what would pass it (processes, file size), and
/// its result names the limit. `0` turns a limit off (for `cpu_seconds`, `0` leaves the
/// call's timeout as the bound).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct Limits {
    /// Memory of all the command's processes together, in MiB; default 4096 (a control
    /// group's limit: it binds whoever runs the host, root included).
    pub memory_mib: u64,
    /// Processes and threads of the command at once; default 512 (a control group's
    /// `pids.max`).
    pub processes: u64,
    /// The largest file the command may write, in MiB; default 1024 (`RLIMIT_FSIZE`).
    pub file_size_mib: u64,
    /// CPU seconds each of the command's processes may use; default none: the call's
    /// timeout bounds it (`RLIMIT_CPU`).
    pub cpu_seconds: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_mib: 4096,
            processes: 512,
            file_size_mib: 1024,
            cpu_seconds: 0,
        }
    }
}

pub mod egress;
pub mod fence;
mod git;
pub mod mountinfo;
/// Stand-ins for plugin tests (feature `testing`).
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub use fence::{Fence, PathSet, RootMoved, SearchError, GIT_PROTECTED};
pub use git::{repositories_beneath, REPOSITORY_BUDGET};

/// The roots a `workspace-write` call may modify beneath: the workspace root, the policy's
/// extra roots, `/tmp` and the process temp dir when it may be one (see [`Fence::of`]),
/// each canonicalized, deduplicated. The ONE source for every enforcing family (fs fence
/// and shell runner), so they cannot drift. `Err` when a root of the policy no longer
/// names the directory it named ([`RootMoved`]).
pub fn writable_roots(policy: &SandboxExecutionPolicy) -> Result<Vec<PathBuf>, RootMoved> {
    Ok(Fence::of(policy)?.writable_roots)
}

/// Canonicalizes a path that may not exist yet: the deepest existing ancestor is resolved
/// with the filesystem (symlinks, `..`), the rest is appended lexically. `path` must be
/// absolute.
pub fn canonical_path(path: &Path) -> std::io::Result<PathBuf> {
    if !path.is_absolute() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} is not absolute", path.display()),
        ));
    }
    let mut existing = path.to_path_buf();
    let mut rest: Vec<std::ffi::OsString> = Vec::new();
    loop {
        match existing.canonicalize() {
            Ok(canon) => {
                let mut out = canon;
                for part in rest.iter().rev() {
                    match Path::new(part).components().next() {
                        Some(Component::ParentDir) => {
                            out.pop();
                        }
                        Some(Component::CurDir) | None => {}
                        _ => out.push(part),
                    }
                }
                return Ok(out);
            }
            Err(e) => {
                let is_link = existing
                    .symlink_metadata()
                    .map(|m| m.file_type().is_symlink())
                    .unwrap_or(false);
                if is_link {
                    // A dangling or looping symlink: its target is unknown, refuse.
                    return Err(e);
                }
                match (existing.file_name(), existing.parent()) {
                    (Some(name), Some(parent)) => {
                        rest.push(name.to_os_string());
                        existing = parent.to_path_buf();
                    }
                    _ => {
                        // Ends in `..` or `.`: resolve lexically one level, then retry.
                        let last = existing.components().next_back();
                        match last {
                            Some(Component::ParentDir) | Some(Component::CurDir) => {
                                rest.push(last.unwrap().as_os_str().to_os_string());
                                existing.pop();
                            }
                            _ => return Err(e),
                        }
                    }
                }
            }
        }
    }
}

/// `path` as the kernel names a file opened at it without following a symbolic link: the
/// path itself, when it is absolute and plain (no `..`; `.` and repeated slashes name
/// nothing and are dropped). `None` for any other path. Opened with `openat2` and
/// `RESOLVE_NO_SYMLINKS`, such a path names exactly what it opens. A path already spelled
/// that way (the usual case) is borrowed, not rebuilt.
pub fn plain_path(path: &Path) -> Option<std::borrow::Cow<'_, Path>> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    // Spelled plainly: `/` then names, each between single slashes, none `.` or `..`.
    let spelled_plainly = bytes == b"/"
        || (bytes.first() == Some(&b'/')
            && bytes[1..]
                .split(|&b| b == b'/')
                .all(|name| !matches!(name, b"" | b"." | b"..")));
    if spelled_plainly {
        return Some(std::borrow::Cow::Borrowed(path));
    }
    let mut components = path.components();
    let rooted = components.next() == Some(Component::RootDir);
    (rooted && components.all(|c| matches!(c, Component::Normal(_))))
        .then(|| std::borrow::Cow::Owned(path.components().collect()))
}

/// `path` is `root` or beneath it (component-wise: `/ws-evil` is not beneath `/ws`).
pub fn is_within(path: &Path, root: &Path) -> bool {
    path.starts_with(root)
}

/// The writable root that contains the canonical `path`, if any.
pub fn containing_root<'a>(path: &Path, roots: &'a [PathBuf]) -> Option<&'a PathBuf> {
    roots.iter().find(|r| is_within(path, r))
}

/// The model-facing denial marker, verbatim.
pub fn denial_marker(mode: SandboxMode) -> String {
    format!("[sandbox: file access denied under {mode} mode]")
}

/// The one-line hint after a denial, when the tool offers escalation.
pub fn escalation_hint(mode: SandboxMode) -> String {
    let wider: Vec<&str> = mode.wider_modes().iter().map(|m| m.as_str()).collect();
    format!(
        "If this change is required, retry the same call with `sandbox_permissions` set to a wider mode ({}) and a one-sentence `justification`; a person will be asked to approve it.",
        wider.join(" or ")
    )
}

/// The `sandbox:policy` text the model sees for a resolved policy (wording from the
/// policy owner's documentation).
pub fn policy_text(policy: &SandboxExecutionPolicy) -> String {
    let files = match policy.mode {
        SandboxMode::ReadOnly => "Current DSH file policy: read-only. Any available operation enforced by the DSH file sandbox cannot modify files in the standing mode. Do not refuse a required modification from this policy alone: try an available tool normally and follow any denial and escalation guidance it returns.".to_string(),
        SandboxMode::WorkspaceWrite => format!(
            "Current DSH file policy: workspace-write. Any available operation enforced by the DSH file sandbox may modify files under the session workspace: \"{}\". Some platform temporary areas may also be writable.",
            policy.workspace_root.display()
        ),
        SandboxMode::DangerFullAccess => return "Current DSH file policy: danger-full-access. The DSH file sandbox does not restrict file modifications by available operations.".to_string(),
    };
    let network = if let Some(egress) = &policy.egress {
        let mut text = egress::Rules::describe(egress);
        if !policy.approved_hosts.is_empty() {
            text.push_str(&format!(
                " Approved for this session: {}.",
                policy
                    .approved_hosts
                    .iter()
                    .map(|h| format!("`{h}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        text
    } else if policy.network {
        "Sandboxed commands may use the network.".to_string()
    } else {
        "Sandboxed commands have no network access (only their own loopback) and cannot connect to unix sockets.".to_string()
    };
    let tier = match policy.confinement {
        ConfinementTier::Full => "",
        ConfinementTier::LandlockOnly => " Sandboxed commands run in the `landlock-only` tier: Landlock and seccomp without namespaces, so they see the host's processes and cannot list directories above a path they may not read.",
    };
    format!("{files} {network}{tier}")
}

/// The session event kind that records a mode switch.
pub const MODE_EVENT: &str = "sandbox/mode";

/// A `sandbox/mode` event whose value is outside the vocabulary (a forged or corrupt log).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForgedModeEvent {
    /// The event's sequence number.
    pub seq: u64,
    /// What it said.
    pub value: String,
}

impl fmt::Display for ForgedModeEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "session event #{} `{MODE_EVENT}` has value {} outside the closed vocabulary (read-only, workspace-write, danger-full-access); the log was altered",
            self.seq, self.value
        )
    }
}

/// The pure fold: the last `sandbox/mode` switch wins; a forged value is rejected.
pub fn effective_sandbox_mode(
    events: &[SessionEvent],
) -> Result<Option<SandboxMode>, ForgedModeEvent> {
    let mut mode = None;
    for e in events.iter().filter(|e| e.kind == MODE_EVENT) {
        let raw = e
            .data
            .get("mode")
            .cloned()
            .unwrap_or(serde_json::Value::Null);
        let parsed = raw.as_str().and_then(|s| s.parse::<SandboxMode>().ok());
        match parsed {
            Some(m) => mode = Some(m),
            None => {
                return Err(ForgedModeEvent {
                    seq: e.seq,
                    value: raw.to_string(),
                })
            }
        }
    }
    Ok(mode)
}

/// A call's escalation request, after the pairing check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EscalationParams {
    /// The wider mode asked for.
    pub mode: SandboxMode,
    /// Why.
    pub justification: String,
}

/// The parameter names tools declare when the backend is confined.
pub const PERMISSIONS_PARAM: &str = "sandbox_permissions";
/// See [`PERMISSIONS_PARAM`].
pub const JUSTIFICATION_PARAM: &str = "justification";

/// Checks `sandbox_permissions` + `justification` in tool arguments: both or neither.
pub fn escalation_params(args: &serde_json::Value) -> Result<Option<EscalationParams>, String> {
    let perm = args.get(PERMISSIONS_PARAM).filter(|v| !v.is_null());
    let just = args.get(JUSTIFICATION_PARAM).filter(|v| !v.is_null());
    match (perm, just) {
        (None, None) => Ok(None),
        (Some(_), None) | (None, Some(_)) => Err(format!(
            "`{PERMISSIONS_PARAM}` and `{JUSTIFICATION_PARAM}` go together: pass both or neither"
        )),
        (Some(p), Some(j)) => {
            let mode = p
                .as_str()
                .ok_or_else(|| format!("`{PERMISSIONS_PARAM}` must be a mode string"))?
                .parse::<SandboxMode>()
                .map_err(|e| e.to_string())?;
            let justification = j
                .as_str()
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .ok_or_else(|| format!("`{JUSTIFICATION_PARAM}` must be a non-empty string"))?
                .to_string();
            Ok(Some(EscalationParams {
                mode,
                justification,
            }))
        }
    }
}

/// How an approver answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApproverDecision {
    /// Granted.
    Approved,
    /// Refused.
    Rejected,
    /// Dismissed.
    Cancelled,
    /// Nobody could be asked.
    Unavailable,
}

/// What an approver is asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EscalationAsk<'a> {
    /// The tool asking.
    pub tool: &'a str,
    /// The call's current mode.
    pub current: SandboxMode,
    /// The mode asked for.
    pub requested: SandboxMode,
    /// The model's reason.
    pub justification: &'a str,
    /// What the call would do, in one line, for the person.
    pub summary: &'a str,
    /// The whole request (the full command, the content or diff of a change); may span
    /// lines.
    pub detail: &'a str,
}

/// The minimal approver: tools adapt their approval service to this.
pub trait EscalationApprover {
    /// Asks a person.
    fn approve(&self, ask: &EscalationAsk<'_>) -> ApproverDecision;
}

/// The result of the escalation orchestration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Escalation {
    /// Run exactly this call in `mode` (the session root is kept, no event is written).
    Granted(SandboxMode),
    /// Do nothing; return `text` as the tool's error result.
    Refused {
        /// Why, as a stable code: `not-wider`, `rejected`, `cancelled`, `unavailable`.
        reason: &'static str,
        /// The fixed fail-closed text.
        text: String,
    },
}

/// The fixed fail-closed texts.
pub mod texts {
    use super::SandboxMode;

    /// The requested mode is not strictly wider.
    pub fn not_wider(current: SandboxMode, requested: SandboxMode) -> String {
        format!("Escalation not requested: `{requested}` is not wider than the current `{current}` mode. The call was not run; nothing changed.")
    }
    /// A person rejected the escalation.
    pub fn rejected(requested: SandboxMode) -> String {
        format!("Escalation to `{requested}` was rejected by the user. The call was not run; nothing changed. Do not retry this escalation; continue within the current mode or ask the user how to proceed.")
    }
    /// A person dismissed the request.
    pub fn cancelled(requested: SandboxMode) -> String {
        format!("Escalation to `{requested}` was cancelled before a decision. The call was not run; nothing changed.")
    }
    /// Nobody could be asked.
    pub fn unavailable(requested: SandboxMode) -> String {
        format!("Escalation to `{requested}` is unavailable: no approver can be asked in this session. The call was not run; nothing changed.")
    }
}

/// Ordered, fail-closed: (1) the requested mode must be strictly wider (else refused
/// without asking); (2) an approver must exist (else unavailable); (3) only an explicit
/// approval grants; every other answer refuses.
pub fn approve_escalation(
    approver: Option<&dyn EscalationApprover>,
    ask: &EscalationAsk<'_>,
) -> Escalation {
    if !ask.requested.is_wider_than(ask.current) {
        return Escalation::Refused {
            reason: "not-wider",
            text: texts::not_wider(ask.current, ask.requested),
        };
    }
    let Some(approver) = approver else {
        return Escalation::Refused {
            reason: "unavailable",
            text: texts::unavailable(ask.requested),
        };
    };
    match approver.approve(ask) {
        ApproverDecision::Approved => Escalation::Granted(ask.requested),
        ApproverDecision::Rejected => Escalation::Refused {
            reason: "rejected",
            text: texts::rejected(ask.requested),
        },
        ApproverDecision::Cancelled => Escalation::Refused {
            reason: "cancelled",
            text: texts::cancelled(ask.requested),
        },
        ApproverDecision::Unavailable => Escalation::Refused {
            reason: "unavailable",
            text: texts::unavailable(ask.requested),
        },
    }
}

/// A family that enforces the policy.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum EnforcedFamily {
    /// `fs` backends.
    Filesystem,
    /// `shell` backends.
    Bash,
    /// Terminal backends.
    Terminal,
}

/// Arguments of `resolve`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResolveArgs {
    /// The calling session, if any. Where the host set a call context (the host's
    /// `callContext` service), the session is the calling one: `None` means that one, and
    /// naming another is refused (`SESSION_NOT_CALLING`).
    pub session: Option<String>,
    /// An explicitly approved mode for this one call.
    pub mode: Option<SandboxMode>,
}

/// Arguments of `approve_host`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApproveHostArgs {
    /// The session; `None`: the calling one.
    pub session: Option<String>,
    /// The host as the command named it.
    pub host: String,
    /// The port.
    pub port: u16,
}

impl ApproveHostArgs {
    /// The grant as the host's approval service records it for the call
    /// ([`cordis_sdk::host::ApprovalRequest::mode`]): `network:HOST:PORT`.
    pub fn grant(&self) -> String {
        format!("network:{}:{}", self.host, self.port)
    }
}

/// Arguments of `set_sandbox_mode`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetModeArgs {
    /// The session.
    pub session: String,
    /// The new standing mode.
    pub mode: SandboxMode,
}

/// Error codes of the `sandboxPolicy` interface (`Error::code`). [`SandboxPolicy::resolve`]
/// and [`SandboxPolicy::set_sandbox_mode`] fail with the first three; the policy owner
/// refuses its config with the last two.
pub mod codes {
    cordis_sdk::error_codes! {
        /// A session's `sandbox/mode` event holds a value outside the closed vocabulary, or
        /// a `sandbox/network-approved` event names no valid host and port (the log was
        /// edited or is corrupt); the session cannot be used.
        SANDBOX_FORGED_MODE;
        /// The session could not be read from the host's session store.
        SANDBOX_UNKNOWN_SESSION;
        /// A workspace root (configured or a session's cwd) is not a usable directory, no
        /// longer names the directory its session was created in, or would make the whole
        /// file system or the home directory writable.
        SANDBOX_BAD_ROOT;
        /// A `writableRoots`, `protectedPaths` or `denyRead` entry is not usable.
        SANDBOX_BAD_PATH;
        /// The host's state directory lies inside a writable root.
        SANDBOX_STATE_DIR_WRITABLE;
        /// A host approval names no valid host and port, or the network allowlist does
        /// not ask.
        SANDBOX_BAD_NETWORK;
        /// A call that came from an isolated entry asked for a mode wider than its
        /// session's, and no person approved that mode for the call (through the host's
        /// `approval` service).
        SANDBOX_NOT_APPROVED;
    }
}

/// The policy a backend enforces for one call, given the policy its caller resolved
/// (`fs`'s and the shell's `policy` argument) and the call as the host set it
/// ([`cordis_sdk::host::CurrentCall`], from the host's `callContext` service).
///
/// The rule: a caller in this process resolved the policy through the policy owner and is
/// trusted like the host, so its policy is used as given. A caller in an isolated process
/// (`isolated_caller`) could send any policy, so the backend resolves it itself for the
/// calling session, keeping only the mode the caller asked for — which the policy owner
/// grants only when it is no wider than the session's or a person approved it for this
/// call. Without a caller's policy, the calling session's (or, outside any session, the
/// deployment default).
pub fn policy_for_call(
    policy: &SandboxPolicyClient,
    current: Option<&cordis_sdk::host::CurrentCall>,
    supplied: Option<Shared<SandboxExecutionPolicy>>,
) -> cordis_sdk::Result<Shared<SandboxExecutionPolicy>> {
    match supplied {
        Some(p) if current.is_none_or(|c| c.isolated_caller.is_none()) => Ok(p),
        supplied => policy.resolve(ResolveArgs {
            session: None,
            mode: supplied.map(|p| p.mode),
        }),
    }
}

/// The registry name of the policy service.
pub const SANDBOX_POLICY: &str = "sandboxPolicy";

cordis_sdk::interface! {
    /// The one owner of sandbox policy: deployment default, per-session overrides, and the
    /// model-facing `sandbox:policy` text.
    pub trait SandboxPolicy as SandboxPolicyClient ("dsh.sandbox-policy", 1) {
        /// The full policy for one call: approved mode > session's last switch > default;
        /// session cwd > configured workspace root. A [`Shared`] value: pass it on to the
        /// `fs` and shell backends as it is (cloning it is cheap), and it crosses as the
        /// text it came as, parsed once per plugin.
        fn resolve(&self, args: ResolveArgs) -> Shared<SandboxExecutionPolicy>;
        /// The deployment default mode.
        fn default_mode(&self, unit: ()) -> SandboxMode;
        /// The configured fallback workspace root.
        fn workspace_root(&self, unit: ()) -> PathBuf;
        /// Records a session's standing mode switch (one `sandbox/mode` event).
        fn set_sandbox_mode(&self, args: SetModeArgs) -> u64;
        /// Records a host a person approved for the rest of the session (one
        /// `sandbox/network-approved` event). From an isolated caller, only when the host
        /// recorded that approval for the call ([`ApproveHostArgs::grant`]).
        fn approve_host(&self, args: ApproveHostArgs) -> u64;
        /// Registers an enforcing family; returns a token for `unregister_enforced_family`.
        fn register_enforced_family(&self, family: EnforcedFamily) -> u64;
        /// Withdraws one contribution.
        fn unregister_enforced_family(&self, token: u64) -> ();
        /// The registered families, canonical order.
        fn enforced_families(&self, unit: ()) -> Vec<EnforcedFamily>;
        /// The `sandbox:policy` text for a session (empty when no family is registered).
        fn policy_text(&self, session: Option<String>) -> String;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(seq: u64, kind: &str, mode: serde_json::Value) -> SessionEvent {
        SessionEvent {
            seq,
            kind: kind.into(),
            data: serde_json::json!({ "mode": mode }),
        }
    }

    #[test]
    fn a_plain_path_is_named_by_itself_and_any_other_is_not_plain() {
        // Compared as spelled: paths compare equal component by component (`/a//b` is
        // `/a/b`), and the spelling is what this function is about.
        let plain = |p: &str| plain_path(Path::new(p)).map(|p| p.into_owned().into_os_string());
        assert_eq!(plain("/a/./b//c/"), Some("/a/b/c".into()));
        assert_eq!(plain("/"), Some("/".into()));
        assert_eq!(plain("/a/../b"), None);
        assert_eq!(plain("/a/b/.."), None);
        assert_eq!(plain("a/b"), None);
        assert_eq!(plain("./a"), None);
        // Spelled plainly already: borrowed. Every other spelling is rebuilt or refused,
        // exactly as the components say.
        assert!(matches!(
            plain_path(Path::new("/a/b.c/..d")),
            Some(std::borrow::Cow::Borrowed(_))
        ));
        for p in [
            "/a/b", "/a//b", "/a/./b", "/a/b/", "/a/b/.", "/.", "//", "/..", "/a/..", "/...",
            "/a/.b", "//a", "/./", "", "a", "/a/b/./", "/a/b//",
        ] {
            let mut components = Path::new(p).components();
            let expected = (components.next() == Some(Component::RootDir)
                && components.all(|c| matches!(c, Component::Normal(_))))
            .then(|| {
                Path::new(p)
                    .components()
                    .collect::<PathBuf>()
                    .into_os_string()
            });
            assert_eq!(plain(p), expected, "{p:?}");
        }
    }

    #[test]
    fn modes_are_closed_and_ordered() {
        assert_eq!(
            SANDBOX_MODES.map(|m| m.as_str()),
            ["read-only", "workspace-write", "danger-full-access"]
        );
        for m in SANDBOX_MODES {
            assert_eq!(m.as_str().parse::<SandboxMode>(), Ok(m));
            assert_eq!(serde_json::to_value(m).unwrap(), m.as_str());
        }
        assert!(SandboxMode::WorkspaceWrite.is_wider_than(SandboxMode::ReadOnly));
        assert!(!SandboxMode::ReadOnly.is_wider_than(SandboxMode::ReadOnly));
        let err = "workspace_write"
            .parse::<SandboxMode>()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("read-only, workspace-write, danger-full-access"),
            "{err}"
        );
    }

    #[test]
    fn fold_last_switch_wins_and_rejects_forged_values() {
        assert_eq!(effective_sandbox_mode(&[]), Ok(None));
        let events = [
            ev(1, MODE_EVENT, "danger-full-access".into()),
            ev(2, "other", "x".into()),
            ev(3, MODE_EVENT, "read-only".into()),
        ];
        assert_eq!(
            effective_sandbox_mode(&events),
            Ok(Some(SandboxMode::ReadOnly))
        );
        let forged = [ev(1, MODE_EVENT, "root".into())];
        assert_eq!(effective_sandbox_mode(&forged).unwrap_err().seq, 1);
        let forged = [ev(4, MODE_EVENT, serde_json::json!(7))];
        assert!(effective_sandbox_mode(&forged).is_err());
    }

    #[test]
    fn marker_is_verbatim() {
        assert_eq!(
            denial_marker(SandboxMode::WorkspaceWrite),
            "[sandbox: file access denied under workspace-write mode]"
        );
    }

    #[test]
    fn escalation_params_pairing() {
        use serde_json::json;
        let check = |args: serde_json::Value, expected: Result<Option<SandboxMode>, ()>| {
            let got = escalation_params(&args)
                .map(|o| o.map(|p| p.mode))
                .map_err(|_| ());
            assert_eq!(got, expected, "{args}");
        };
        check(json!({}), Ok(None));
        check(
            json!({"sandbox_permissions": null, "justification": null}),
            Ok(None),
        );
        check(
            json!({"sandbox_permissions": "danger-full-access"}),
            Err(()),
        );
        check(json!({"justification": "need it"}), Err(()));
        check(
            json!({"sandbox_permissions": "god-mode", "justification": "x"}),
            Err(()),
        );
        check(
            json!({"sandbox_permissions": "danger-full-access", "justification": "  "}),
            Err(()),
        );
        check(
            json!({"sandbox_permissions": "danger-full-access", "justification": "write the system config"}),
            Ok(Some(SandboxMode::DangerFullAccess)),
        );
    }

    struct Fixed(ApproverDecision, std::cell::Cell<u32>);
    impl EscalationApprover for Fixed {
        fn approve(&self, _ask: &EscalationAsk<'_>) -> ApproverDecision {
            self.1.set(self.1.get() + 1);
            self.0
        }
    }

    #[test]
    fn approve_escalation_is_ordered_and_fail_closed() {
        let ask = |current, requested| EscalationAsk {
            tool: "write",
            current,
            requested,
            justification: "because",
            summary: "write /etc/x",
            detail: "",
        };
        let yes = Fixed(ApproverDecision::Approved, Default::default());
        // Not wider: refused without asking.
        let r = approve_escalation(
            Some(&yes),
            &ask(SandboxMode::WorkspaceWrite, SandboxMode::ReadOnly),
        );
        assert!(matches!(
            r,
            Escalation::Refused {
                reason: "not-wider",
                ..
            }
        ));
        assert_eq!(yes.1.get(), 0);
        // No approver: unavailable.
        let r = approve_escalation(
            None,
            &ask(SandboxMode::ReadOnly, SandboxMode::WorkspaceWrite),
        );
        assert!(matches!(
            r,
            Escalation::Refused {
                reason: "unavailable",
                ..
            }
        ));
        // Each answer.
        let cases = [
            (ApproverDecision::Approved, None),
            (ApproverDecision::Rejected, Some("rejected")),
            (ApproverDecision::Cancelled, Some("cancelled")),
            (ApproverDecision::Unavailable, Some("unavailable")),
        ];
        for (decision, refused) in cases {
            let a = Fixed(decision, Default::default());
            let r = approve_escalation(
                Some(&a),
                &ask(SandboxMode::ReadOnly, SandboxMode::DangerFullAccess),
            );
            match (r, refused) {
                (Escalation::Granted(m), None) => assert_eq!(m, SandboxMode::DangerFullAccess),
                (Escalation::Refused { reason, text }, Some(expected)) => {
                    assert_eq!(reason, expected);
                    assert!(text.contains("nothing changed"), "{text}");
                }
                (other, _) => panic!("{decision:?} gave {other:?}"),
            }
            assert_eq!(a.1.get(), 1);
        }
    }

    #[test]
    fn canonical_path_and_containment_on_real_disk() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().canonicalize().unwrap();
        let ws = root.join("ws");
        std::fs::create_dir(&ws).unwrap();
        std::fs::create_dir(root.join("ws-evil")).unwrap();
        std::os::unix::fs::symlink(&root, ws.join("up")).unwrap();
        std::os::unix::fs::symlink(ws.join("nowhere"), ws.join("dangling")).unwrap();
        let c = |p: PathBuf| canonical_path(&p).ok();
        assert_eq!(c(ws.join("new/dir/file")), Some(ws.join("new/dir/file")));
        assert_eq!(c(ws.join("a/../b")), Some(ws.join("b")));
        assert_eq!(c(ws.join("up/ws-evil/x")), Some(root.join("ws-evil/x")));
        assert_eq!(c(ws.join("dangling")), None);
        assert!(canonical_path(Path::new("relative")).is_err());
        assert!(is_within(&ws.join("x"), &ws));
        assert!(is_within(&ws, &ws));
        assert!(!is_within(&root.join("ws-evil/x"), &ws));
    }

    #[test]
    fn writable_roots_are_the_workspace_and_temp_and_a_moved_root_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let ws = tmp.path().canonicalize().unwrap().join("ws");
        std::fs::create_dir(&ws).unwrap();
        let policy = |root: &Path, id: Option<FileId>| SandboxExecutionPolicy {
            mode: SandboxMode::WorkspaceWrite,
            workspace_root: root.to_path_buf(),
            workspace_root_id: id,
            ..Default::default()
        };
        let id = FileId::of(&ws.metadata().unwrap());
        let roots = writable_roots(&policy(&ws, Some(id))).unwrap();
        assert_eq!(roots[0], ws);
        assert!(roots.contains(&PathBuf::from("/tmp").canonicalize().unwrap()));
        assert!(roots.contains(&std::env::temp_dir().canonicalize().unwrap()));
        let fence = Fence::of(&policy(&ws, Some(id))).unwrap();
        assert_eq!(fence.identity(&ws), Some(id));
        // A root named through a link is used where it leads, unless the policy gives its
        // identity: then it must be that directory by that name (the policy owner names
        // it so; a link there now was swapped in).
        let alias = ws.with_file_name("alias");
        std::os::unix::fs::symlink(&ws, &alias).unwrap();
        assert_eq!(writable_roots(&policy(&alias, None)).unwrap()[0], ws);
        let moved = writable_roots(&policy(&alias, Some(id))).unwrap_err();
        assert_eq!(moved.root, alias);
        assert!(moved.to_string().contains("now resolves to"), "{moved}");
        // The same path, another directory: refused when the identity is known, and
        // caught where the root is opened when the swap comes after the fence.
        std::fs::rename(&ws, ws.with_file_name("away")).unwrap();
        std::fs::create_dir(&ws).unwrap();
        let moved = Fence::of(&policy(&ws, Some(id))).unwrap_err();
        assert!(moved.to_string().contains("another directory"), "{moved}");
        let now = FileId::of(&ws.metadata().unwrap());
        assert!(fence.check_opened(&ws, now).is_err());
        assert!(fence.check_opened(&ws, id).is_ok());
        // Without an identity the root only has to resolve to itself; gone, it is dropped.
        assert_eq!(writable_roots(&policy(&ws, None)).unwrap()[0], ws);
        std::fs::remove_dir(&ws).unwrap();
        assert!(!writable_roots(&policy(&ws, None)).unwrap().contains(&ws));
        assert!(Fence::of(&policy(&ws, Some(id))).is_err());
    }

    #[test]
    fn containment_picks_the_root_that_holds_the_path() {
        let roots = [PathBuf::from("/ws"), PathBuf::from("/tmp")];
        assert_eq!(
            containing_root(Path::new("/ws/a/b"), &roots),
            Some(&roots[0])
        );
        assert_eq!(
            containing_root(Path::new("/tmp/x"), &roots),
            Some(&roots[1])
        );
        assert_eq!(containing_root(Path::new("/ws-evil/x"), &roots), None);
        assert_eq!(containing_root(Path::new("/etc"), &roots), None);
        assert_eq!(
            SandboxMode::ReadOnly.wider_modes(),
            [SandboxMode::WorkspaceWrite, SandboxMode::DangerFullAccess]
        );
        assert_eq!(SandboxMode::DangerFullAccess.wider_modes(), []);
    }

    /// Every text the model or a person reads, to the byte: the tools compare their
    /// answers with these functions, so only literal expectations here can catch a change.
    #[test]
    fn model_facing_texts_are_byte_stable() {
        use SandboxMode::*;
        let ws = |mode| SandboxExecutionPolicy {
            mode,
            workspace_root: "/w".into(),
            network: false,
            ..Default::default()
        };
        let all = [
            escalation_hint(ReadOnly),
            escalation_hint(WorkspaceWrite),
            texts::not_wider(WorkspaceWrite, ReadOnly),
            texts::rejected(DangerFullAccess),
            texts::cancelled(WorkspaceWrite),
            texts::unavailable(DangerFullAccess),
            policy_text(&ws(ReadOnly)),
            policy_text(&ws(WorkspaceWrite)),
            policy_text(&ws(DangerFullAccess)),
            ForgedModeEvent {
                seq: 7,
                value: "\"root\"".into(),
            }
            .to_string(),
        ];
        expect_test::expect![[r#"
            If this change is required, retry the same call with `sandbox_permissions` set to a wider mode (workspace-write or danger-full-access) and a one-sentence `justification`; a person will be asked to approve it.
            If this change is required, retry the same call with `sandbox_permissions` set to a wider mode (danger-full-access) and a one-sentence `justification`; a person will be asked to approve it.
            Escalation not requested: `read-only` is not wider than the current `workspace-write` mode. The call was not run; nothing changed.
            Escalation to `danger-full-access` was rejected by the user. The call was not run; nothing changed. Do not retry this escalation; continue within the current mode or ask the user how to proceed.
            Escalation to `workspace-write` was cancelled before a decision. The call was not run; nothing changed.
            Escalation to `danger-full-access` is unavailable: no approver can be asked in this session. The call was not run; nothing changed.
            Current DSH file policy: read-only. Any available operation enforced by the DSH file sandbox cannot modify files in the standing mode. Do not refuse a required modification from this policy alone: try an available tool normally and follow any denial and escalation guidance it returns. Sandboxed commands have no network access (only their own loopback) and cannot connect to unix sockets.
            Current DSH file policy: workspace-write. Any available operation enforced by the DSH file sandbox may modify files under the session workspace: "/w". Some platform temporary areas may also be writable. Sandboxed commands have no network access (only their own loopback) and cannot connect to unix sockets.
            Current DSH file policy: danger-full-access. The DSH file sandbox does not restrict file modifications by available operations.
            session event #7 `sandbox/mode` has value "root" outside the closed vocabulary (read-only, workspace-write, danger-full-access); the log was altered"#]].assert_eq(&all.join("\n"));
    }
}
