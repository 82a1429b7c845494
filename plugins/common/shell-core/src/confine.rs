//! The kernel confinement of a command: new user, mount, pid, ipc and (with network off)
//! network namespaces with a read-only view of `/` in which exactly the roots
//! [`dsh_sandbox::writable_roots`] names are writable, a minimal `/dev` and a fresh `/proc`;
//! no capabilities; Landlock on top with the same writable roots (plus `/dev/null`), signal
//! and abstract-socket scoping; and the seccomp filter of [`crate::syscalls`] (set-user-ID
//! modes, unix sockets, nested user namespaces, keyrings, and the rest of its table). Also
//! the conservative detection of the denials it causes.
//!
//! Landlock's filesystem rights are pinned to [`PINNED_ABI`] with
//! [`CompatLevel::HardRequirement`]: a kernel that cannot enforce every handled right makes
//! [`Confinement::prepare`] fail, and the command is not run. Scoping is used where the
//! kernel has it (Landlock ABI 6). Reads and execution are not handled, so they stay
//! allowed everywhere.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use dsh_sandbox::egress::Rules;
use dsh_sandbox::{
    denial_marker, is_within, ConfinementTier, Fence, FileId, PathSet, RootMoved,
    SandboxExecutionPolicy, SandboxMode, SearchError,
};
use dsh_shell_api::ExecResult;
use landlock::{
    AccessFs, BitFlags, CompatLevel, Compatible, PathBeneath, PathFd, PathFdError, Ruleset,
    RulesetAttr, RulesetCreatedAttr, RulesetError, Scope, ABI,
};

use crate::child::{SandboxSpec, Stage, MAX_BINDS};
use crate::limits::CommandLimits;

/// The Landlock ABI the filesystem rules are written against: v5 (Linux 6.10) is the first
/// ABI whose write-ish rights include `IoctlDev`; later ABIs add no filesystem write right
/// this runner needs. Pinned so the confinement means the same on every kernel that runs it.
pub const PINNED_ABI: ABI = ABI::V5;

/// The one file outside the writable roots every confined command may write.
pub const DEV_NULL: &str = "/dev/null";

/// The paths a confined command may write beneath, in order: `writable_roots(policy)` then
/// `/dev/null`. `None` for `danger-full-access` (the command runs unconfined); only
/// `/dev/null` for `read-only`.
pub fn granted_write_roots(
    policy: &SandboxExecutionPolicy,
) -> Result<Option<Vec<PathBuf>>, RootMoved> {
    Ok(granted(policy.mode, &Fence::of(policy)?))
}

/// [`granted_write_roots`] of a call in `mode` whose fence is `fence`.
fn granted(mode: SandboxMode, fence: &Fence) -> Option<Vec<PathBuf>> {
    let mut roots = match mode {
        SandboxMode::DangerFullAccess => return None,
        SandboxMode::ReadOnly => Vec::new(),
        SandboxMode::WorkspaceWrite => fence.writable_roots.clone(),
    };
    roots.push(PathBuf::from(DEV_NULL));
    Some(roots)
}

/// Why the kernel sandbox cannot be enforced.
#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    /// The kernel refused the ruleset (Landlock missing, disabled, or older than the ABI).
    #[error("the kernel cannot enforce the Landlock ruleset (pinned ABI v{abi}): {source}", abi = PINNED_ABI as u32)]
    Ruleset {
        /// What the landlock layer said.
        #[source]
        source: RulesetError,
    },
    /// A granted root could not be opened.
    #[error("cannot open writable root `{}` for the Landlock ruleset: {source}", path.display())]
    OpenRoot {
        /// The root.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: PathFdError,
    },
    /// A root of the policy was renamed away and replaced since it was checked.
    #[error(transparent)]
    RootMoved(#[from] RootMoved),
    /// The kernel accepted no part of the ruleset.
    #[error("the Landlock ruleset would not be enforced; refusing to run the command with weaker confinement")]
    NotEnforced,
    /// A path cannot be handed to the kernel (it contains a NUL byte).
    #[error("the path `{}` contains a NUL byte", path.display())]
    BadPath {
        /// The path.
        path: PathBuf,
    },
    /// A pattern of the policy needed a walk of more entries than one command may cost.
    #[error("matching the policy's patterns beneath `{}` visited more than {visited} entries", root.display())]
    TooManyEntries {
        /// Where the walk was.
        root: PathBuf,
        /// How many entries it visited before it stopped.
        visited: usize,
    },
    /// A protected path does not exist and only the writable root above it does, so a
    /// command could create it.
    #[error("the protected path `{}` does not exist, and a command could create it directly in the writable root `{}`", path.display(), root.display())]
    AbsentProtected {
        /// The protected path.
        path: PathBuf,
        /// The writable root it would be created in.
        root: PathBuf,
    },
    /// Whether a protected path exists, or where it leads, cannot be told.
    #[error("cannot check the protected path `{}`: {source}", path.display())]
    Unverifiable {
        /// The path.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The search for repositories beneath a writable root could not be finished.
    #[error("cannot look for git repositories beneath `{}`: {source}", root.display())]
    Repositories {
        /// The writable root.
        root: PathBuf,
        /// Why not.
        #[source]
        source: dsh_sandbox::SearchError,
    },
    /// The command's limits need a control group the host cannot make.
    #[error("cannot bound the command's memory and processes: {reason}")]
    Limits {
        /// Why not.
        reason: String,
    },
    /// More writable roots and protected paths than one view binds.
    #[error("{count} writable roots and protected paths; a sandbox binds at most {MAX_BINDS}")]
    TooManyBinds {
        /// How many were asked for.
        count: usize,
    },
    /// The seccomp filter could not be compiled for this architecture.
    #[error("cannot build the seccomp filter for {arch}: {reason}", arch = std::env::consts::ARCH)]
    Seccomp {
        /// What seccompiler said.
        reason: String,
    },
    /// The `landlock-only` tier cannot do what the policy asks.
    #[error("the `landlock-only` confinement cannot enforce this policy: {reason}")]
    Tier {
        /// What it cannot do.
        reason: String,
    },
    /// The policy's network allowlist does not parse (the policy owner checks it when it is
    /// configured, so this is a policy from elsewhere).
    #[error("the network allowlist cannot be enforced: {reason}")]
    Network {
        /// What is wrong with it.
        reason: String,
    },
    /// A setup step in the command's process failed; nothing was run.
    #[error("the sandbox could not be set up: {doing} failed: {source}", doing = stage.doing())]
    Setup {
        /// The step.
        stage: Stage,
        /// What the kernel said.
        #[source]
        source: std::io::Error,
    },
}

impl ConfineError {
    /// How to fix it.
    pub fn help(&self) -> String {
        match self {
            ConfineError::OpenRoot { .. } => {
                "make sure the workspace root and the temp directories exist and are readable"
                    .to_string()
            }
            ConfineError::BadPath { .. } => "use paths without NUL bytes".to_string(),
            ConfineError::AbsentProtected { path, .. } => format!(
                "create it (`mkdir -p '{}'` for a directory) so commands see it read-only, or stop protecting it",
                path.display()
            ),
            ConfineError::Limits { .. } => {
                "run cordis where it may create control groups (as root with the cgroup file system writable; as a user, under a systemd unit with `Delegate=yes`), or turn those limits off on purpose with `limits: {memoryMib: 0, processes: 0}` in the dsh-sandbox-policy config".to_string()
            }
            ConfineError::Unverifiable { .. } => {
                "make the path and the directories above it readable by the host (a command may have changed their modes), or stop protecting it".to_string()
            }
            ConfineError::Repositories {
                source: dsh_sandbox::SearchError::TooLarge { .. },
                ..
            } => "root the session at a smaller directory (every directory beneath the workspace is searched for a `.git`, so that none can be rewritten by a command)".to_string(),
            ConfineError::Repositories { .. } => {
                "make the directory readable by the host (a command may have changed its mode), or root the session elsewhere".to_string()
            }
            ConfineError::TooManyEntries { .. } => {
                "list exact paths in `protectedPaths` and `denyRead` instead of patterns, or use them in a smaller workspace".to_string()
            }
            ConfineError::TooManyBinds { .. } => {
                format!("protect fewer paths (at most {MAX_BINDS} binds in all)")
            }
            ConfineError::Seccomp { .. } => {
                "run on x86_64 or aarch64, or compose `dsh-bash-local` to run commands unconfined on purpose".to_string()
            }
            ConfineError::Setup { stage, .. } => stage.help().to_string(),
            ConfineError::Tier { .. } => {
                "move what must stay read-only or unreadable out of the writable roots (or stop protecting it), turn the network allowlist off, or use the full confinement (`confinement: full`) on a host with unprivileged user namespaces (`cordis doctor` says what this one lacks)".to_string()
            }
            ConfineError::Network { .. } => {
                "fix the `network` rules in the dsh-sandbox-policy config (`cordis check` names the entry)".to_string()
            }
            ConfineError::RootMoved(_) => crate::child::ROOT_MOVED_HELP.to_string(),
            ConfineError::Ruleset { .. } | ConfineError::NotEnforced => format!(
                "run on Linux 6.10 or newer with Landlock enabled (`landlock` in the `lsm=` boot parameter, Landlock ABI {} or newer), or compose `dsh-bash-local` to run commands unconfined on purpose",
                PINNED_ABI as u32
            ),
        }
    }
}

/// A prepared confinement: the Landlock ruleset (root descriptors opened), the seccomp
/// program and the mount plan, built in the host; entered only by the command's own
/// processes between fork and exec.
pub struct Confinement {
    pub(crate) spec: SandboxSpec,
    pub(crate) limits: CommandLimits,
    /// The network allowlist the command's proxy enforces; `None`: no proxy.
    pub(crate) egress: Option<Rules>,
}

fn c_path(path: &Path) -> Result<CString, ConfineError> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| ConfineError::BadPath {
        path: path.to_path_buf(),
    })
}

impl Confinement {
    /// Prepares the confinement for `policy`; `None` for `danger-full-access`. The mount
    /// view follows the policy's [`Fence`]: the writable roots read-write; beneath them
    /// every protected path read-only again, and every directory between a root and a
    /// protected path pinned (bound onto itself, so it cannot be renamed away and replaced);
    /// every path the policy denies reading hidden (an empty read-only directory, or
    /// `/dev/null` for a file). Patterns are matched against the workspace when the command
    /// starts.
    pub fn prepare(policy: &SandboxExecutionPolicy) -> Result<Option<Confinement>, ConfineError> {
        let fence = Fence::of(policy)?;
        let Some(roots) = granted(policy.mode, &fence) else {
            return Ok(None);
        };
        let egress = policy
            .egress
            .as_ref()
            .map(|e| Rules::compile(e, &policy.approved_hosts))
            .transpose()
            .map_err(|e| ConfineError::Network {
                reason: e.to_string(),
            })?;
        let limits = CommandLimits::prepare(&policy.limits)?;
        let mut writable: Vec<&PathBuf> = roots.iter().filter(|r| r.is_dir()).collect();
        // Outermost first, so an inner root is bound on top of the outer one.
        writable.sort_by_key(|r| r.components().count());
        let expand = |set: &PathSet, root: &Path| {
            set.expand_beneath(root).map_err(|e| match e {
                SearchError::TooLarge { visited } => ConfineError::TooManyEntries {
                    root: root.to_path_buf(),
                    visited,
                },
                SearchError::Unreadable { path, source } => {
                    ConfineError::Unverifiable { path, source }
                }
            })
        };
        // The roots an operator chose: the workspace root and the policy's extra roots.
        let searched: Vec<PathBuf> = std::iter::once(&policy.workspace_root)
            .chain(&policy.writable_roots)
            .filter_map(|r| r.canonicalize().ok())
            .collect();
        let mut protected: Vec<PathBuf> = Vec::new();
        // A root inside another (`TMPDIR` or a `writableRoots` entry below the workspace or
        // `/tmp`) is itself a mount; the directories between them are pinned too, so no
        // command can move it away and put a link to elsewhere in its place for the next
        // call, which resolves the root by its path again.
        let mut pinned: Vec<PathBuf> = Vec::new();
        for inner in &writable {
            if let Some(outer) = writable
                .iter()
                .filter(|o| *o != inner && is_within(inner, o))
                .max_by_key(|o| o.components().count())
            {
                pinned.extend(directories_between(inner, outer));
            }
        }
        let mut keep = |path: PathBuf, root: &Path| {
            pinned.extend(directories_between(&path, root));
            protected.push(path);
        };
        for root in &writable {
            for path in expand(&fence.protected, root)? {
                // A symlink is protected where it leads; outside the root it is read-only. A
                // git directory's dangling link protects nothing (there is no repository).
                let is_link = path.symlink_metadata().is_ok_and(|m| m.is_symlink());
                let link_dir = path
                    .parent()
                    .filter(|d| *d != root.as_path() && is_within(d, root));
                match path.canonicalize() {
                    Ok(canonical) => {
                        if is_within(&canonical, root) {
                            keep(canonical, root);
                        }
                    }
                    Err(e) if dsh_sandbox::fence::absent(&e) && fence.optional.contains(&path) => {
                        continue
                    }
                    // A dangling link, not directly in the root: pinned (below), and what it
                    // names cannot be created either.
                    Err(e) if dsh_sandbox::fence::absent(&e) && is_link && link_dir.is_some() => {
                        let named = std::fs::read_link(&path)
                            .ok()
                            .and_then(|t| path.parent().map(|d| d.join(t)))
                            .and_then(|t| dsh_sandbox::canonical_path(&t).ok());
                        let Some(named) = named else {
                            return Err(ConfineError::Unverifiable { path, source: e });
                        };
                        if is_within(&named, root) {
                            if let Some(ancestor) = creatable(&named, root)? {
                                keep(ancestor, root);
                            }
                        }
                    }
                    Err(source) => return Err(ConfineError::Unverifiable { path, source }),
                }
                // A protected link cannot be repointed: its directory stays read-only
                // (unless that is the root itself, which then cannot be: README).
                if is_link {
                    if let Some(dir) = link_dir {
                        keep(dir.to_path_buf(), root);
                    }
                }
            }
            // Every repository beneath an operator's root, recorded or not (a vendored copy
            // becomes a submodule at the person's next `git add -A`): its `.git` is kept
            // like a protected path. `/tmp` and `TMPDIR` are not searched (README).
            if searched.contains(*root) {
                let found = dsh_sandbox::repositories_beneath(root).map_err(|source| {
                    ConfineError::Repositories {
                        root: root.to_path_buf(),
                        source,
                    }
                })?;
                for path in found {
                    match path.canonicalize() {
                        Ok(canonical) if is_within(&canonical, root) => keep(canonical, root),
                        Ok(_) => {}
                        Err(e) if dsh_sandbox::fence::absent(&e) => {}
                        Err(source) => return Err(ConfineError::Unverifiable { path, source }),
                    }
                }
            }
            // A protected path a command could create: its nearest existing directory
            // stays read-only, so it cannot be.
            for path in &fence.protected.paths {
                if !is_within(path, root) || fence.optional.contains(path) {
                    continue;
                }
                if let Some(ancestor) = creatable(path, root)? {
                    keep(ancestor, root);
                }
            }
        }
        let mut hidden: Vec<PathBuf> = Vec::new();
        for path in &fence.deny_read.paths {
            match path.symlink_metadata() {
                Ok(_) => hidden.push(path.clone()),
                Err(e) if dsh_sandbox::fence::absent(&e) => {}
                Err(source) => {
                    return Err(ConfineError::Unverifiable {
                        path: path.clone(),
                        source,
                    })
                }
            }
        }
        if policy.workspace_root.is_dir() {
            hidden.extend(expand(&fence.deny_read, &policy.workspace_root)?);
        }
        let landlock_only = policy.confinement == ConfinementTier::LandlockOnly;
        if !landlock_only {
            hidden.extend(proc_mounts_elsewhere()?);
        }
        // Hidden where it leads (a dangling symlink hides nothing); pinned like a protected
        // path, so renaming a directory above it cannot take it out from under its cover.
        let mut resolved = Vec::with_capacity(hidden.len());
        for path in hidden {
            match path.canonicalize() {
                Ok(canonical) => resolved.push(canonical),
                Err(e) if dsh_sandbox::fence::absent(&e) => {}
                Err(source) => return Err(ConfineError::Unverifiable { path, source }),
            }
        }
        let mut hidden = resolved;
        for path in &hidden {
            if let Some(root) = writable.iter().find(|r| is_within(path, r)) {
                pinned.extend(directories_between(path, root));
            }
        }
        for list in [&mut protected, &mut pinned, &mut hidden] {
            // Outermost first; equal paths side by side, so each is bound once (a path
            // beneath two nested roots is found beneath both).
            list.sort_by(|a, b| (a.components().count(), a).cmp(&(b.components().count(), b)));
            list.dedup();
        }
        // What lies beneath a hidden directory is hidden with it (and is not there to
        // cover once the directory is).
        let mut covered = Vec::<PathBuf>::with_capacity(hidden.len());
        for path in hidden {
            if !covered.iter().any(|dir| path.starts_with(dir)) {
                covered.push(path);
            }
        }
        let hidden = covered;
        if landlock_only {
            tier_refusals(egress.is_some(), &protected, &hidden, &writable)?;
        }
        let landlock = landlock_ruleset(&roots, &fence, landlock_only.then_some(&hidden[..]))?;
        let count = writable.len() + protected.len() + pinned.len() + hidden.len();
        if count > MAX_BINDS {
            return Err(ConfineError::TooManyBinds { count });
        }
        let c_paths = |paths: &[PathBuf]| {
            paths
                .iter()
                .map(|p| c_path(p))
                .collect::<Result<Vec<_>, _>>()
        };
        let (hidden_dirs, hidden_files): (Vec<PathBuf>, Vec<PathBuf>) =
            hidden.into_iter().partition(|p| p.is_dir());
        // SAFETY: plain system calls without arguments.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let map = |id: u32| CString::new(format!("{id} {id} 1\n")).expect("no NUL in digits");
        Ok(Some(Confinement {
            spec: SandboxSpec {
                uid_map: map(uid),
                gid_map: map(gid),
                writable_ids: writable
                    .iter()
                    .map(|p| fence.identity(p).map(|id| (id.dev, id.ino)))
                    .collect(),
                writable: writable
                    .into_iter()
                    .map(|p| c_path(p))
                    .collect::<Result<_, _>>()?,
                pinned: c_paths(&pinned)?,
                protected: c_paths(&protected)?,
                hidden_dirs: c_paths(&hidden_dirs)?,
                hidden_files: c_paths(&hidden_files)?,
                cwd: CString::default(),
                network: policy.network && egress.is_none(),
                namespaces: !landlock_only,
                proxy: egress.is_some(),
                landlock,
                shm_access: rights_for(Path::new("/"), AccessFs::from_write(PINNED_ABI)).bits(),
                seccomp: crate::syscalls::seccomp_filter(crate::syscalls::Setting::of(policy))
                    .map_err(|reason| ConfineError::Seccomp { reason })?,
            },
            limits,
            egress,
        }))
    }
}

/// The mount points of every `proc` file system mounted elsewhere than at `/proc` (a
/// container's `/host/proc`, a process's directory bound somewhere): the command's own
/// `/proc` shows its own processes only, and these would show the host's, so each is
/// hidden like a `denyRead` directory. Fails closed when the mounts cannot be read.
fn proc_mounts_elsewhere() -> Result<Vec<PathBuf>, ConfineError> {
    let path = Path::new("/proc/self/mountinfo");
    let table = std::fs::read(path).map_err(|source| ConfineError::Unverifiable {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(procs_elsewhere(&table))
}

/// The seam of [`proc_mounts_elsewhere`]: from the text of a `mountinfo` file.
fn procs_elsewhere(table: &[u8]) -> Vec<PathBuf> {
    dsh_sandbox::mountinfo::mounts(table)
        .filter(|m| m.fstype == "proc" && !m.point.starts_with("/proc"))
        .map(|m| m.point)
        .collect()
}

/// The directories strictly between `root` and `path` beneath it, innermost first: what
/// is pinned (bound onto itself, so it cannot be renamed) above a protected or hidden path.
fn directories_between<'a>(path: &'a Path, root: &'a Path) -> impl Iterator<Item = PathBuf> + 'a {
    path.ancestors()
        .skip(1)
        .take_while(move |a| *a != root && is_within(a, root))
        .map(Path::to_path_buf)
}

/// For a protected `path` beneath the writable `root` that does not exist: its nearest
/// existing ancestor, to be kept read-only so the command cannot create `path`. `None` when
/// `path` exists (it is bound where it is) or its nearest existing ancestor resolves
/// outside `root` (read-only there already). An error when that ancestor is `root` itself
/// (keeping the whole root read-only is not what a writable root means: the operator
/// creates the path or stops protecting it) or when the host cannot tell whether the path
/// exists: a check that cannot be made refuses the command.
fn creatable(path: &Path, root: &Path) -> Result<Option<PathBuf>, ConfineError> {
    let unverifiable = |at: &Path, source| ConfineError::Unverifiable {
        path: at.to_path_buf(),
        source,
    };
    let mut at = path;
    loop {
        match at.symlink_metadata() {
            Ok(_) if at == path => return Ok(None),
            Ok(_) => break,
            Err(e) if dsh_sandbox::fence::absent(&e) => {}
            Err(e) => return Err(unverifiable(at, e)),
        }
        match at.parent() {
            Some(parent) => at = parent,
            None => return Ok(None),
        }
    }
    let ancestor = at.canonicalize().map_err(|e| unverifiable(at, e))?;
    if !is_within(&ancestor, root) {
        return Ok(None);
    }
    if ancestor == root {
        return Err(ConfineError::AbsentProtected {
            path: path.to_path_buf(),
            root: root.to_path_buf(),
        });
    }
    Ok(Some(ancestor))
}

/// The Landlock ruleset: write-ish rights only beneath `roots`, signals and abstract unix
/// sockets scoped to the sandbox where the kernel can. With `unreadable` (the
/// `landlock-only` tier, which has no mount view to hide paths), reads are handled too:
/// the writable roots are readable, and everything else but `unreadable` (canonical paths,
/// none inside a writable root), which is carved out: every entry of each directory above
/// an unreadable path gets its own read rule, except the one on the way to it (the
/// directories above keep no rule of their own, so they cannot be listed).
fn landlock_ruleset(
    roots: &[PathBuf],
    fence: &Fence,
    unreadable: Option<&[PathBuf]>,
) -> Result<std::os::fd::OwnedFd, ConfineError> {
    let write = AccessFs::from_write(PINNED_ABI);
    let read = match unreadable {
        Some(_) => AccessFs::from_read(PINNED_ABI),
        None => BitFlags::EMPTY,
    };
    let readable = |path: &Path| {
        if path.is_dir() {
            read
        } else {
            read & AccessFs::from_file(PINNED_ABI)
        }
    };
    let ruleset_err = |source: RulesetError| ConfineError::Ruleset { source };
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(write | read)
        .map_err(ruleset_err)?
        .set_compatibility(CompatLevel::BestEffort)
        .scope(Scope::Signal | Scope::AbstractUnixSocket)
        .map_err(ruleset_err)?
        .create()
        .map_err(ruleset_err)?;
    for root in roots {
        let fd = PathFd::new(root).map_err(|source| ConfineError::OpenRoot {
            path: root.clone(),
            source,
        })?;
        // The rule is for the directory opened: it must be the one the fence checked.
        let opened = FileId::of_fd(std::os::fd::AsFd::as_fd(&fd)).map_err(|source| {
            ConfineError::Unverifiable {
                path: root.clone(),
                source,
            }
        })?;
        fence.check_opened(root, opened)?;
        ruleset = ruleset
            .set_compatibility(CompatLevel::HardRequirement)
            .add_rule(PathBeneath::new(
                fd,
                rights_for(root, write) | readable(root),
            ))
            .map_err(ruleset_err)?;
    }
    for path in unreadable
        .map(readable_around)
        .transpose()?
        .unwrap_or_default()
    {
        // An entry that vanished since it was listed is not readable.
        let Ok(fd) = PathFd::new(&path) else { continue };
        ruleset = ruleset
            .set_compatibility(CompatLevel::HardRequirement)
            .add_rule(PathBeneath::new(fd, readable(&path)))
            .map_err(ruleset_err)?;
    }
    let fd: Option<std::os::fd::OwnedFd> = ruleset.into();
    fd.ok_or(ConfineError::NotEnforced)
}

/// What the `landlock-only` tier refuses, since without a mount view Landlock alone
/// cannot do it: the network allowlist (it needs a network namespace), a protected path
/// inside a writable root (a rule on a directory covers all beneath it), and an unreadable
/// path inside one.
fn tier_refusals(
    allowlist: bool,
    protected: &[PathBuf],
    hidden: &[PathBuf],
    writable: &[&PathBuf],
) -> Result<(), ConfineError> {
    let refuse = |reason: String| Err(ConfineError::Tier { reason });
    if allowlist {
        return refuse("the network allowlist needs a network namespace of the command's own, and this tier makes none".to_string());
    }
    let root_of = |path: &Path| {
        writable
            .iter()
            .filter(|r| is_within(path, r))
            .max_by_key(|r| r.components().count())
            .map(|r| r.display().to_string())
            .unwrap_or_default()
    };
    if let Some(path) = protected.first() {
        return refuse(format!(
            "`{}` must stay read-only, but it lies inside the writable root `{}`, and Landlock cannot keep part of a writable root read-only",
            path.display(),
            root_of(path)
        ));
    }
    if let Some(path) = hidden
        .iter()
        .find(|p| writable.iter().any(|r| is_within(p, r)))
    {
        return refuse(format!(
            "`{}` must be unreadable, but it lies inside the writable root `{}`, and Landlock cannot hide part of a writable root",
            path.display(),
            root_of(path)
        ));
    }
    Ok(())
}

/// `/` without `unreadable`: `/` itself when nothing is unreadable, else every entry of the
/// directories above an unreadable path except those on the way to one (a link leading
/// to a directory above or at one is left out too: the directory is reached by its own
/// path).
fn readable_around(unreadable: &[PathBuf]) -> Result<Vec<PathBuf>, ConfineError> {
    if unreadable.is_empty() {
        return Ok(vec![PathBuf::from("/")]);
    }
    let covers = |p: &Path| unreadable.iter().any(|u| is_within(u, p));
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::from("/")];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|source| ConfineError::Unverifiable {
            path: dir.clone(),
            source,
        })?;
        for entry in entries {
            let entry = entry.map_err(|source| ConfineError::Unverifiable {
                path: dir.clone(),
                source,
            })?;
            let path = entry.path();
            if unreadable.contains(&path) {
                continue;
            }
            if covers(&path) {
                stack.push(path);
                continue;
            }
            let leads_above = entry.file_type().is_ok_and(|t| t.is_symlink())
                && path.canonicalize().is_ok_and(|c| covers(&c));
            if !leads_above {
                out.push(path);
            }
        }
    }
    Ok(out)
}

/// Directory rights beneath a directory; only the file rights on a file.
/// Never device nodes: `MakeChar` and `MakeBlock` are handled and granted nowhere.
fn rights_for(path: &Path, write: BitFlags<AccessFs>) -> BitFlags<AccessFs> {
    let write = write & !(AccessFs::MakeChar | AccessFs::MakeBlock);
    if path.is_dir() {
        write
    } else {
        write & AccessFs::from_file(PINNED_ABI)
    }
}

/// What a shell prints when the kernel refuses a file access (EACCES, EPERM, EROFS, and
/// EXDEV, which Landlock returns for a rename or link that would widen access).
const DENIAL_MESSAGES: [&str; 4] = [
    "Permission denied",
    "Operation not permitted",
    "Read-only file system",
    "Invalid cross-device link",
];

/// Conservatively flags a confined command's result as a sandbox denial: the command failed
/// (non-zero exit or a signal) and stderr carries a denial message. Then sets
/// `sandbox_denied` and puts the model-facing marker at the start of stderr, keeping the
/// raw output after it. Never flags `danger-full-access`.
pub fn flag_denial(result: &mut ExecResult, mode: SandboxMode) {
    if mode == SandboxMode::DangerFullAccess || result.exit_code == Some(0) {
        return;
    }
    if DENIAL_MESSAGES.iter().any(|m| result.stderr.contains(m)) {
        result.sandbox_denied = true;
        result.stderr = format!("{}\n{}", denial_marker(mode), result.stderr);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{run, RunError};
    use dsh_shell_api::ExecRequest;

    /// `command` in `cwd`, with a 10 s timeout and no policy of its own.
    fn request(command: &str, cwd: &Path) -> ExecRequest {
        ExecRequest {
            command: command.into(),
            cwd: cwd.to_path_buf(),
            env: vec![],
            timeout_ms: Some(10_000),
            output_limit: None,
            policy: None,
            cancel_fd: None,
            progress_fd: None,
        }
    }

    fn policy(mode: SandboxMode, root: &Path) -> SandboxExecutionPolicy {
        SandboxExecutionPolicy {
            mode,
            workspace_root: root.to_path_buf(),
            network: false,
            ..Default::default()
        }
    }

    /// Every `proc` mounted elsewhere than at `/proc` is hidden; `/proc` itself and what
    /// is mounted beneath it (covered by the command's own `/proc`) are not, nor a path
    /// that merely starts with the same letters.
    #[test]
    fn proc_file_systems_mounted_elsewhere_are_found() {
        let table = b"22 1 0:21 / /proc rw - proc proc rw\n\
                      23 22 0:40 / /proc/sys/fs/binfmt_misc rw - binfmt_misc binfmt_misc rw\n\
                      24 22 0:21 / /proc/inner rw - proc proc rw\n\
                      25 1 0:21 / /host/proc rw - proc proc rw\n\
                      26 1 0:21 /1 /srv/init\\040dir rw - proc proc rw\n\
                      27 1 0:21 / /procs rw - proc proc rw\n\
                      28 1 0:50 / /data rw - ext4 /dev/sda1 rw\n";
        assert_eq!(
            procs_elsewhere(table),
            ["/host/proc", "/srv/init dir", "/procs"].map(PathBuf::from)
        );
    }

    #[test]
    fn granted_roots_are_exactly_the_shared_writable_roots_plus_dev_null() {
        let dir = tempfile::tempdir().unwrap();
        let ws = policy(SandboxMode::WorkspaceWrite, dir.path());
        let mut expected = dsh_sandbox::writable_roots(&ws).unwrap();
        expected.push(PathBuf::from(DEV_NULL));
        assert_eq!(granted_write_roots(&ws), Ok(Some(expected)));
        let ro = policy(SandboxMode::ReadOnly, dir.path());
        assert_eq!(
            granted_write_roots(&ro),
            Ok(Some(vec![PathBuf::from(DEV_NULL)]))
        );
        let full = policy(SandboxMode::DangerFullAccess, dir.path());
        assert_eq!(granted_write_roots(&full), Ok(None));
    }

    #[test]
    fn only_the_spawning_thread_is_confined() {
        // The workspace must live outside the temp areas, which are writable roots.
        let outside = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../../target/shell-core-confine-test");
        std::fs::create_dir_all(&outside).unwrap();
        let outside = outside.canonicalize().unwrap();
        let ro = policy(SandboxMode::ReadOnly, &outside);
        let confinement = Confinement::prepare(&ro)
            .unwrap_or_else(|e| panic!("Landlock must be available for these tests: {e}"));
        let req = request("echo x > denied.txt", &outside);
        let mut r = run(&req, confinement, &crate::EnvPolicy::default()).unwrap();
        flag_denial(&mut r, SandboxMode::ReadOnly);
        assert!(
            r.sandbox_denied && r.stderr.starts_with(&denial_marker(SandboxMode::ReadOnly)),
            "{r:?}"
        );
        assert!(!outside.join("denied.txt").exists());
        // This thread (and so the test process) still writes where the command could not.
        std::fs::write(outside.join("allowed.txt"), "host").unwrap();
        std::fs::remove_dir_all(&outside).unwrap();
    }

    #[test]
    fn protected_paths_stay_read_only_inside_a_writable_root() {
        let ws = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../../target/shell-core-protect-test");
        let _ = std::fs::remove_dir_all(&ws);
        std::fs::create_dir_all(ws.join("guarded")).unwrap();
        let ws = ws.canonicalize().unwrap();
        std::fs::create_dir_all(ws.join("conf")).unwrap();
        std::fs::write(ws.join("conf/cordis.yml"), "original\n").unwrap();
        let protected = vec![
            ws.join("conf/cordis.yml"),
            ws.join("guarded"),
            ws.join("guarded/absent"),
        ];
        let confinement = Confinement::prepare(&SandboxExecutionPolicy {
            protected_paths: protected,
            ..policy(SandboxMode::WorkspaceWrite, &ws)
        })
        .unwrap();
        let req = request(
            "cd conf; echo evil > cordis.yml; touch ../guarded/new; rm cordis.yml; cd ..; \
                      mv conf conf2; echo ok > free.txt",
            &ws,
        );
        let r = run(&req, confinement, &crate::EnvPolicy::default()).unwrap();
        assert_eq!(
            std::fs::read_to_string(ws.join("conf/cordis.yml")).unwrap(),
            "original\n",
            "{r:?}"
        );
        assert!(r.stderr.contains("Device or resource busy"), "{r:?}");
        assert!(!ws.join("guarded/new").exists(), "{r:?}");
        assert_eq!(
            std::fs::read_to_string(ws.join("free.txt")).unwrap(),
            "ok\n"
        );
        assert_eq!(
            r.stderr.matches("Read-only file system").count(),
            2,
            "{r:?}"
        );
        std::fs::remove_dir_all(&ws).unwrap();
    }

    /// The workspace root renamed away and replaced (by a link to the outside, or by
    /// another directory) after the command's confinement was prepared, before it starts:
    /// what the command's process would bind is not the directory the fence checked, so it
    /// runs nothing and says why.
    #[test]
    fn a_root_replaced_after_the_check_runs_nothing() {
        let base = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../../target/shell-core-replaced-root-test");
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("ws")).unwrap();
        std::fs::create_dir_all(base.join("outside")).unwrap();
        let base = base.canonicalize().unwrap();
        let (ws, outside) = (base.join("ws"), base.join("outside"));
        for by_link in [true, false] {
            let confinement =
                Confinement::prepare(&policy(SandboxMode::WorkspaceWrite, &ws)).unwrap();
            std::fs::rename(&ws, base.join("parked")).unwrap();
            if by_link {
                std::os::unix::fs::symlink(&outside, &ws).unwrap();
            } else {
                std::fs::create_dir(&ws).unwrap();
            }
            let req = request(&format!("echo x > {}/f.txt", ws.display()), &ws);
            let what = if by_link { "a link" } else { "a directory" };
            match run(&req, confinement, &crate::EnvPolicy::default()) {
                Err(RunError::Sandbox(e @ ConfineError::Setup { stage, .. })) => {
                    assert_eq!(stage, Stage::RootIdentity, "replaced by {what}: {e}");
                    assert!(e.help().contains("put the directory back"), "{}", e.help());
                }
                other => {
                    panic!("replaced by {what}: the command ran or failed otherwise: {other:?}")
                }
            }
            assert!(!outside.join("f.txt").exists() && !ws.join("f.txt").exists());
            if by_link {
                std::fs::remove_file(&ws).unwrap();
            } else {
                std::fs::remove_dir(&ws).unwrap();
            }
            std::fs::rename(base.join("parked"), &ws).unwrap();
        }
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_protected_path_that_does_not_exist_cannot_be_created() {
        let ws = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../../target/shell-core-absent-test");
        let _ = std::fs::remove_dir_all(&ws);
        std::fs::create_dir_all(ws.join("lib")).unwrap();
        let ws = ws.canonicalize().unwrap();
        let prepare = |protected: Vec<PathBuf>| {
            Confinement::prepare(&SandboxExecutionPolicy {
                protected_paths: protected,
                ..policy(SandboxMode::WorkspaceWrite, &ws)
            })
        };
        let plugins = ws.join("lib/cordis/plugins");
        let req = request(
            "mkdir -p lib/cordis/plugins && echo planted > lib/cordis/plugins/libx.so; \
                      touch lib/other; echo ok > free.txt",
            &ws,
        );
        let r = run(
            &req,
            prepare(vec![plugins.clone()]).unwrap(),
            &crate::EnvPolicy::default(),
        )
        .unwrap();
        assert!(!ws.join("lib/cordis").exists(), "{r:?}");
        assert!(r.stderr.contains("Read-only file system"), "{r:?}");
        // The control: the rest of the root stays writable.
        assert_eq!(
            std::fs::read_to_string(ws.join("free.txt")).unwrap(),
            "ok\n"
        );
        // Directly in the root, keeping it from being created would take the whole root:
        // the command is refused, and the error says how to fix it.
        let Err(e) = prepare(vec![ws.join("absent/plugins")]) else {
            panic!("an absent protected path directly in the root must refuse the command");
        };
        assert!(matches!(e, ConfineError::AbsentProtected { .. }), "{e}");
        assert!(e.to_string().contains("absent/plugins"), "{e}");
        assert!(e.help().contains("mkdir -p"), "{}", e.help());
        // A git directory is protected only where it exists: a workspace need not be a
        // repository, and a dangling `.git` link is none.
        assert!(prepare(vec![]).is_ok());
        std::os::unix::fs::symlink(ws.join("gone"), ws.join(".git")).unwrap();
        assert!(prepare(vec![]).is_ok());
        // Any other protected link that leads nowhere is pinned: it cannot be repointed,
        // and what it names cannot be made. Directly in the root it cannot be pinned, and
        // the command is refused.
        std::os::unix::fs::symlink(ws.join("lib/gone"), ws.join("lib/link")).unwrap();
        let req = request(
            "ln -sfn /tmp lib/link; mkdir lib/gone; echo ok > free.txt",
            &ws,
        );
        let r = run(
            &req,
            prepare(vec![ws.join("lib/link")]).unwrap(),
            &crate::EnvPolicy::default(),
        )
        .unwrap();
        assert_eq!(
            std::fs::read_link(ws.join("lib/link")).unwrap(),
            ws.join("lib/gone"),
            "{r:?}"
        );
        assert!(!ws.join("lib/gone").exists(), "{r:?}");
        assert!(r.stderr.contains("Read-only file system"), "{r:?}");
        std::os::unix::fs::symlink(ws.join("gone"), ws.join("top-link")).unwrap();
        let Err(e) = prepare(vec![ws.join("top-link")]) else {
            panic!("a dangling protected link directly in the root must refuse the command");
        };
        assert!(matches!(e, ConfineError::Unverifiable { .. }), "{e}");
        std::fs::remove_dir_all(&ws).unwrap();
    }

    /// What a `denyRead` entry that cannot be hidden does: one that does not exist, or a
    /// link leading nowhere, hides nothing and the command runs; a link that loops cannot
    /// be checked and refuses it. A protected path that is the root itself keeps the root
    /// read-only (as `--dev` does with a plugin crate as the session root).
    #[test]
    fn deny_read_entries_that_cannot_be_hidden_and_a_protected_root() {
        let ws =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../target/shell-core-deny-test");
        let _ = std::fs::remove_dir_all(&ws);
        std::fs::create_dir_all(&ws).unwrap();
        let ws = ws.canonicalize().unwrap();
        let prepare = |deny_read: Vec<PathBuf>, protected: Vec<PathBuf>| {
            Confinement::prepare(&SandboxExecutionPolicy {
                deny_read,
                protected_paths: protected,
                ..policy(SandboxMode::WorkspaceWrite, &ws)
            })
        };
        assert!(prepare(vec![ws.join("absent.pem")], vec![]).is_ok());
        std::os::unix::fs::symlink(ws.join("gone"), ws.join("dangling.pem")).unwrap();
        assert!(prepare(vec![ws.join("dangling.pem")], vec![]).is_ok());
        assert!(prepare(vec![PathBuf::from("**/*.pem")], vec![]).is_ok());
        std::os::unix::fs::symlink(ws.join("loop.pem"), ws.join("loop.pem")).unwrap();
        for entry in [ws.join("loop.pem"), PathBuf::from("**/loop.pem")] {
            let Err(e) = prepare(vec![entry.clone()], vec![]) else {
                panic!(
                    "{}: a looping link must refuse the command",
                    entry.display()
                );
            };
            assert!(matches!(e, ConfineError::Unverifiable { .. }), "{e}");
        }
        std::fs::remove_file(ws.join("loop.pem")).unwrap();
        let confinement = prepare(vec![], vec![ws.clone()]).unwrap();
        let req = request("echo x > inside.txt", &ws);
        let r = run(&req, confinement, &crate::EnvPolicy::default()).unwrap();
        assert!(r.stderr.contains("Read-only file system"), "{r:?}");
        assert!(!ws.join("inside.txt").exists());
        std::fs::remove_dir_all(&ws).unwrap();
    }

    /// A writable root inside another cannot be moved away (and a link put in its place
    /// for the next call, which resolves it by path): it and the directories above it up
    /// to the outer root are mounts.
    #[test]
    fn a_root_inside_another_cannot_be_moved_away() {
        let ws = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../../target/shell-core-nested-test");
        let _ = std::fs::remove_dir_all(&ws);
        std::fs::create_dir_all(ws.join("a/b/inner")).unwrap();
        let ws = ws.canonicalize().unwrap();
        let confinement = Confinement::prepare(&SandboxExecutionPolicy {
            writable_roots: vec![ws.join("a/b/inner")],
            ..policy(SandboxMode::WorkspaceWrite, &ws)
        })
        .unwrap();
        let req = request(
            "mv a a2; mv a/b a/b2; mv a/b/inner a/b/i2; echo ok > a/b/inner/f; echo ok > free",
            &ws,
        );
        let r = run(&req, confinement, &crate::EnvPolicy::default()).unwrap();
        assert_eq!(
            r.stderr.matches("Device or resource busy").count(),
            3,
            "{r:?}"
        );
        assert!(
            ws.join("a/b/inner/f").is_file() && ws.join("free").is_file(),
            "{r:?}"
        );
        std::fs::remove_dir_all(&ws).unwrap();
    }

    /// At most [`MAX_BINDS`] binds: exactly that many prepare, one more is refused.
    #[test]
    fn the_bind_limit_is_exact() {
        let ws =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../target/shell-core-binds-test");
        let _ = std::fs::remove_dir_all(&ws);
        std::fs::create_dir_all(&ws).unwrap();
        let ws = ws.canonicalize().unwrap();
        let files: Vec<PathBuf> = (0..MAX_BINDS + 1)
            .map(|i| ws.join(format!("f{i}")))
            .collect();
        for f in &files {
            std::fs::write(f, "").unwrap();
        }
        let prepare = |n: usize| {
            Confinement::prepare(&SandboxExecutionPolicy {
                protected_paths: files[..n].to_vec(),
                ..policy(SandboxMode::WorkspaceWrite, &ws)
            })
        };
        let Err(ConfineError::TooManyBinds { count }) = prepare(MAX_BINDS + 1) else {
            panic!("{} binds must be refused", MAX_BINDS + 1);
        };
        // Everything bound besides the protected files (the writable roots).
        let others = count - (MAX_BINDS + 1);
        assert!(others >= 1, "{count}");
        assert!(prepare(MAX_BINDS - others).is_ok());
        let Err(ConfineError::TooManyBinds { count }) = prepare(MAX_BINDS - others + 1) else {
            panic!("one bind over the limit must be refused");
        };
        assert_eq!(count, MAX_BINDS + 1);
        std::fs::remove_dir_all(&ws).unwrap();
    }

    #[test]
    fn device_nodes_are_granted_nowhere() {
        let write = AccessFs::from_write(PINNED_ABI);
        for path in [Path::new("/"), Path::new(DEV_NULL)] {
            let granted = rights_for(path, write);
            assert!(!granted.contains(AccessFs::MakeChar), "{path:?}");
            assert!(!granted.contains(AccessFs::MakeBlock), "{path:?}");
        }
        assert!(rights_for(Path::new("/"), write).contains(AccessFs::MakeFifo));
    }

    #[test]
    fn denials_are_flagged_conservatively() {
        let result = |exit_code, stderr: &str| ExecResult {
            exit_code,
            signal: None,
            stdout: String::new(),
            stderr: stderr.into(),
            truncated: false,
            timed_out: false,
            cancelled: false,
            sandbox_denied: false,
            mode: None,
            limit_reached: None,
        };
        let check = |exit, stderr: &str, mode, flagged: bool| {
            let mut r = result(exit, stderr);
            flag_denial(&mut r, mode);
            assert_eq!(r.sandbox_denied, flagged, "{stderr:?} {exit:?} {mode}");
            assert_eq!(r.stderr.starts_with("[sandbox:"), flagged);
            assert!(r.stderr.ends_with(stderr));
        };
        let ww = SandboxMode::WorkspaceWrite;
        check(Some(1), "bash: /x: Permission denied\n", ww, true);
        check(
            Some(1),
            "touch: cannot touch '/x': Read-only file system\n",
            SandboxMode::ReadOnly,
            true,
        );
        check(
            Some(1),
            "ln: failed to create hard link 'a': Invalid cross-device link\n",
            ww,
            true,
        );
        check(Some(0), "bash: /x: Permission denied\n", ww, false);
        check(Some(1), "grep: no match\n", ww, false);
        check(
            Some(1),
            "bash: /x: Permission denied\n",
            SandboxMode::DangerFullAccess,
            false,
        );
    }
}
