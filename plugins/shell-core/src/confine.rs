//! Kernel confinement of a command's file writes with Landlock, to exactly the roots
//! [`dsh_sandbox::writable_roots`] names (plus `/dev/null`), and the conservative detection
//! of the denials it causes.
//!
//! The ABI is pinned to [`PINNED_ABI`] with [`CompatLevel::HardRequirement`]: a kernel that
//! cannot enforce every handled right makes [`Confinement::prepare`] or the restriction
//! fail, and the command is not run. Reads and execution are not handled, so they stay
//! allowed everywhere.

use std::path::{Path, PathBuf};

use dsh_sandbox::{denial_marker, writable_roots, SandboxExecutionPolicy, SandboxMode};
use dsh_shell_api::ExecResult;
use landlock::{
    AccessFs, BitFlags, CompatLevel, Compatible, PathBeneath, PathFd, PathFdError, Ruleset,
    RulesetAttr, RulesetCreated, RulesetCreatedAttr, RulesetError, RulesetStatus, ABI,
};

/// The Landlock ABI the ruleset is written against: v5 (Linux 6.10) is the first ABI whose
/// write-ish rights include `IoctlDev`; later ABIs add no filesystem write right this
/// runner needs. Pinned so the confinement means the same on every kernel that runs it.
pub const PINNED_ABI: ABI = ABI::V5;

/// The one file outside the writable roots every confined command may write.
pub const DEV_NULL: &str = "/dev/null";

/// The paths a confined command may write beneath, in order: `writable_roots(policy)` then
/// `/dev/null`. `None` for `danger-full-access` (the command runs unconfined); only
/// `/dev/null` for `read-only`.
pub fn granted_write_roots(policy: &SandboxExecutionPolicy) -> Option<Vec<PathBuf>> {
    let mut roots = match policy.mode {
        SandboxMode::DangerFullAccess => return None,
        SandboxMode::ReadOnly => Vec::new(),
        SandboxMode::WorkspaceWrite => writable_roots(policy),
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
    /// The ruleset was applied only partly or not at all.
    #[error("the Landlock ruleset was not fully enforced (status: {status}); refusing to run the command with weaker confinement")]
    NotEnforced {
        /// The status the kernel reported.
        status: String,
    },
    /// `no_new_privs` could not be set, so a setuid program could escape the confinement.
    #[error("`no_new_privs` could not be set for the confined command")]
    NoNewPrivs,
    /// The confined spawning thread panicked.
    #[error("the confined spawning thread panicked")]
    SpawnThreadPanicked,
}

impl ConfineError {
    /// How to fix it.
    pub fn help(&self) -> String {
        match self {
            ConfineError::OpenRoot { .. } => {
                "make sure the workspace root and the temp directories exist and are readable"
                    .to_string()
            }
            ConfineError::SpawnThreadPanicked => {
                "this is a bug in the shell runner; the command was not run".to_string()
            }
            _ => format!(
                "run on Linux 6.10 or newer with Landlock enabled (`landlock` in the `lsm=` boot parameter, Landlock ABI {} or newer), or compose `dsh-bash-local` to run commands unconfined on purpose",
                PINNED_ABI as u32
            ),
        }
    }
}

/// A prepared ruleset: built (root descriptors opened) on the caller's thread, enforced
/// only on the fresh thread that spawns the command.
pub struct Confinement {
    ruleset: RulesetCreated,
}

impl Confinement {
    /// Prepares the confinement for `policy`; `None` for `danger-full-access`.
    pub fn prepare(policy: &SandboxExecutionPolicy) -> Result<Option<Confinement>, ConfineError> {
        let Some(roots) = granted_write_roots(policy) else {
            return Ok(None);
        };
        let write = AccessFs::from_write(PINNED_ABI);
        let ruleset_err = |source: RulesetError| ConfineError::Ruleset { source };
        let mut ruleset = Ruleset::default()
            .set_compatibility(CompatLevel::HardRequirement)
            .handle_access(write)
            .map_err(ruleset_err)?
            .create()
            .map_err(ruleset_err)?;
        for root in roots {
            let rights = rights_for(&root, write);
            let fd = PathFd::new(&root).map_err(|source| ConfineError::OpenRoot {
                path: root.clone(),
                source,
            })?;
            ruleset = ruleset
                .add_rule(PathBeneath::new(fd, rights))
                .map_err(ruleset_err)?;
        }
        Ok(Some(Confinement { ruleset }))
    }

    /// Confines the CURRENT thread (and everything it spawns afterwards). Call it only on a
    /// thread made for one command.
    pub(crate) fn restrict_current_thread(self) -> Result<(), ConfineError> {
        let status = self
            .ruleset
            .restrict_self()
            .map_err(|source| ConfineError::Ruleset { source })?;
        if status.ruleset != RulesetStatus::FullyEnforced {
            return Err(ConfineError::NotEnforced {
                status: format!("{:?}", status.ruleset),
            });
        }
        if !status.no_new_privs {
            return Err(ConfineError::NoNewPrivs);
        }
        Ok(())
    }
}

/// Directory rights beneath a directory; only the file rights on a file.
fn rights_for(path: &Path, write: BitFlags<AccessFs>) -> BitFlags<AccessFs> {
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
    use crate::run;
    use dsh_shell_api::ExecRequest;

    fn policy(mode: SandboxMode, root: &Path) -> SandboxExecutionPolicy {
        SandboxExecutionPolicy {
            mode,
            workspace_root: root.to_path_buf(),
        }
    }

    #[test]
    fn granted_roots_are_exactly_the_shared_writable_roots_plus_dev_null() {
        let dir = tempfile::tempdir().unwrap();
        let ws = policy(SandboxMode::WorkspaceWrite, dir.path());
        let mut expected = writable_roots(&ws);
        expected.push(PathBuf::from(DEV_NULL));
        assert_eq!(granted_write_roots(&ws), Some(expected));
        let ro = policy(SandboxMode::ReadOnly, dir.path());
        assert_eq!(
            granted_write_roots(&ro),
            Some(vec![PathBuf::from(DEV_NULL)])
        );
        let full = policy(SandboxMode::DangerFullAccess, dir.path());
        assert_eq!(granted_write_roots(&full), None);
    }

    #[test]
    fn only_the_spawning_thread_is_confined() {
        // The workspace must live outside the temp areas, which are writable roots.
        let outside =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/shell-core-confine-test");
        std::fs::create_dir_all(&outside).unwrap();
        let outside = outside.canonicalize().unwrap();
        let ro = policy(SandboxMode::ReadOnly, &outside);
        let confinement = Confinement::prepare(&ro)
            .unwrap_or_else(|e| panic!("Landlock must be available for these tests: {e}"));
        let req = ExecRequest {
            command: "echo x > denied.txt".into(),
            cwd: outside.clone(),
            env: vec![],
            timeout_ms: Some(10_000),
            output_limit: None,
            policy: None,
        };
        let mut r = run(&req, confinement).unwrap();
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
    fn denials_are_flagged_conservatively() {
        let result = |exit_code, stderr: &str| ExecResult {
            exit_code,
            signal: None,
            stdout: String::new(),
            stderr: stderr.into(),
            truncated: false,
            timed_out: false,
            sandbox_denied: false,
            mode: None,
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
