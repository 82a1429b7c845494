//! What this host lets a confined command have, each layer tried for real (never guessed
//! from versions), for `cordis doctor`: the namespaces and their loopback and the seccomp
//! filter in a forked child that enters them exactly as a command's supervisor does, the
//! Landlock ABI from the kernel, the control groups the limits would use, and a whole
//! confined `true`.

use std::ffi::c_int;
use std::os::fd::AsRawFd;
use std::path::Path;

use dsh_sandbox::{Limits, SandboxExecutionPolicy, SandboxMode};
use dsh_shell_api::ExecRequest;

use crate::child::{self, Stage};
use crate::confine::Confinement;
use crate::env::EnvPolicy;
use crate::limits::{self, Hierarchy};
use crate::run::{pipe, RunError};

/// A failed probe: the step, and what the kernel said.
#[derive(Debug)]
pub struct Failed {
    /// The step that failed.
    pub stage: Stage,
    /// The kernel's answer.
    pub error: std::io::Error,
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} failed: {}", self.stage.doing(), self.error)
    }
}

/// Runs `step` in a forked child (async-signal-safe system calls only: it reports a failed
/// step through the report pipe like a command's supervisor) and reads what it reported.
fn in_child(step: impl FnOnce(c_int)) -> Result<(), Failed> {
    let (rd, wr) = pipe().map_err(|error| Failed {
        stage: Stage::Fork,
        error,
    })?;
    // SAFETY: the child only makes async-signal-safe system calls on data built before the
    // fork, then `_exit`s.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(Failed {
            stage: Stage::Fork,
            error: std::io::Error::last_os_error(),
        });
    }
    if pid == 0 {
        drop(rd);
        step(wr.as_raw_fd());
        // SAFETY: leaving the child without running the parent's destructors.
        unsafe { libc::_exit(0) };
    }
    drop(wr);
    let mut status = 0;
    // SAFETY: waiting for the child just forked.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    match crate::run::read_report(rd) {
        Some((stage, errno)) => Err(Failed {
            stage: stage.unwrap_or(Stage::Fork),
            error: std::io::Error::from_raw_os_error(errno),
        }),
        None => Ok(()),
    }
}

/// Creates the user, mount, pid, ipc, uts and network namespaces a command gets, maps the
/// user, and brings up the network namespace's loopback: `Err` names the step that failed
/// (`Namespaces` or `IdMap`: no unprivileged user namespaces; `Loopback`).
pub fn namespaces() -> Result<(), Failed> {
    // SAFETY: plain system calls.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let map = |id: u32| std::ffi::CString::new(format!("{id} {id} 1\n")).expect("digits");
    let (uid_map, gid_map) = (map(uid), map(gid));
    in_child(|report| {
        // SAFETY: in the forked child; what `child` does before a command, nothing else.
        unsafe {
            child::check(
                report,
                Stage::Namespaces,
                libc::unshare(
                    libc::CLONE_NEWUSER
                        | libc::CLONE_NEWNS
                        | libc::CLONE_NEWPID
                        | libc::CLONE_NEWIPC
                        | libc::CLONE_NEWUTS
                        | libc::CLONE_NEWNET,
                ) as _,
            );
            child::map_ids(report, &uid_map, &gid_map);
            child::loopback_up(report);
        }
    })
}

/// Installs the seccomp filter every confined command runs under (after `no_new_privs`).
pub fn seccomp() -> Result<(), Failed> {
    let program = crate::syscalls::seccomp_filter(crate::syscalls::Setting {
        unix_sockets: false,
        ip_sockets: true,
    })
    .map_err(|reason| Failed {
        stage: Stage::Seccomp,
        error: std::io::Error::other(reason),
    })?;
    in_child(|report| {
        // SAFETY: in the forked child; the program outlives the call.
        unsafe {
            child::check(
                report,
                Stage::Capabilities,
                libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) as _,
            );
            child::install_seccomp(report, &program);
        }
    })
}

/// The kernel's Landlock ABI version (0 without Landlock).
pub fn landlock_abi() -> i64 {
    crate::syscalls::landlock_abi()
}

/// Where the per-command control groups would go (`cgroup v1 …` or `cgroup v2 at …`), or
/// why there is no such place.
pub fn cgroups() -> Result<String, String> {
    let read = |p: &Path| std::fs::read_to_string(p).ok();
    let mountinfo = read(Path::new("/proc/self/mountinfo")).unwrap_or_default();
    let own = read(Path::new("/proc/self/cgroup")).unwrap_or_default();
    match limits::locate(&mountinfo, &own, read)? {
        Hierarchy::V1 { memory, pids } => Ok(format!(
            "cgroup v1 (memory at `{}`, pids at `{}`)",
            memory.display(),
            pids.display()
        )),
        Hierarchy::V2 { parent } => Ok(format!(
            "cgroup v2 (memory and pids delegated at `{}`)",
            parent.display()
        )),
    }
}

/// Runs `true` confined in `workspace` (a fresh directory) in `workspace-write`, with the
/// default limits or none, in `tier`: every layer at once, as a command gets them.
pub fn confined_true(
    workspace: &Path,
    with_limits: bool,
    tier: dsh_sandbox::ConfinementTier,
) -> Result<(), RunError> {
    let policy = SandboxExecutionPolicy {
        confinement: tier,
        mode: SandboxMode::WorkspaceWrite,
        workspace_root: workspace.to_path_buf(),
        limits: if with_limits {
            Limits::default()
        } else {
            Limits {
                memory_mib: 0,
                processes: 0,
                file_size_mib: 0,
                cpu_seconds: 0,
            }
        },
        ..Default::default()
    };
    let confinement = Confinement::prepare(&policy)?;
    let request = ExecRequest {
        command: "true".to_string(),
        cwd: workspace.to_path_buf(),
        env: Vec::new(),
        timeout_ms: Some(30_000),
        output_limit: None,
        policy: None,
        cancel_fd: None,
        progress_fd: None,
    };
    let result = crate::run::run(&request, confinement, &EnvPolicy::default())?;
    match result.exit_code {
        Some(0) => Ok(()),
        other => Err(RunError::Spawn {
            cwd: workspace.to_path_buf(),
            source: std::io::Error::other(format!(
                "`true` ended with {other:?} (signal {:?}): {}",
                result.signal,
                result.stderr.trim()
            )),
        }),
    }
}
