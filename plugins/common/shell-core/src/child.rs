//! What runs in the forked child between `fork` and `exec`: the per-command supervisor
//! and, for a confined command, the namespaces it enters. Everything here runs after a
//! fork of a multi-threaded process, so it only makes async-signal-safe system calls on
//! data built before the fork ([`ChildPlan`]): no allocation, no locks, no `std` I/O.
//!
//! The process tree of one command:
//!
//! - **supervisor** (the process `std` forks): its own session; closes every descriptor but
//!   the few it needs; for a confined command enters new user, mount, pid, ipc (and, with
//!   network off, network) namespaces and builds the mount view; otherwise becomes a child
//!   subreaper. It forks the payload, then waits for it, or for the host's control pipe to
//!   close (timeout, cancellation, or the host died) or the call's cancel descriptor to
//!   fire, and then kills everything the command started before it exits with the command's
//!   status.
//! - confined: **init** (pid 1 of the new pid namespace): mounts `/proc` (`/proc/sys`
//!   read-only), forks the shell,
//!   reaps orphans, and exits with the shell's status, which takes every other process of
//!   the namespace with it.
//! - **shell** (returns from the hook, so `std` execs `bash`): confined, it changes to the
//!   working directory again (inside the new mounts), drops every capability, and applies
//!   Landlock and the seccomp filter.
//!
//! A setup step that fails writes `[stage, errno]` to the report pipe and exits with
//! [`SETUP_FAILED`]; the host reads the pipe to its end (the shell's `exec` closes it) and
//! turns a record into `SHELL_SANDBOX_UNAVAILABLE` naming the step. Nothing runs after a
//! failed step.

use std::ffi::{c_int, CStr, CString};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use crate::limits::ChildLimits;

/// The exit status of a supervisor whose setup failed (the reason is on the report pipe).
pub(crate) const SETUP_FAILED: c_int = 125;

/// The most mounts (writable roots plus protected paths) one command's view may bind.
pub(crate) const MAX_BINDS: usize = 64;

/// The device nodes a confined command sees in its `/dev`, bound from the host's.
const DEV_NODES: [&CStr; 6] = [
    c"/dev/null",
    c"/dev/zero",
    c"/dev/full",
    c"/dev/random",
    c"/dev/urandom",
    c"/dev/tty",
];

/// The setup step that failed, as reported through the report pipe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Stage {
    /// `setsid`.
    Session = 1,
    /// `unshare` of the user, mount, pid, ipc and network namespaces.
    Namespaces,
    /// Writing `uid_map`, `setgroups` or `gid_map`.
    IdMap,
    /// Making the mount tree private and cloning the mounts to bind.
    Mounts,
    /// Making `/` read-only.
    ReadOnlyRoot,
    /// Binding a writable root read-write.
    WritableRoot,
    /// Re-binding a protected path read-only (or pinning a directory above one).
    ProtectedPath,
    /// Hiding a path the policy denies reading.
    DenyRead,
    /// Building the minimal `/dev`.
    Dev,
    /// Bringing up the namespace's loopback interface.
    Loopback,
    /// `fork`.
    Fork,
    /// Mounting a fresh `/proc` for the pid namespace.
    Proc,
    /// Changing to the working directory inside the new view.
    Chdir,
    /// Dropping capabilities and setting `no_new_privs`.
    Capabilities,
    /// `landlock_restrict_self`.
    Landlock,
    /// Installing the seccomp filter.
    Seccomp,
    /// Entering the command's cgroup and setting its rlimits.
    Limits,
    /// Checking that each writable root cloned is the directory the fence checked.
    RootIdentity,
    /// Opening the network proxy's port on the namespace's loopback and handing it over.
    Proxy,
}

impl Stage {
    const ALL: [Stage; 19] = [
        Stage::Session,
        Stage::Namespaces,
        Stage::IdMap,
        Stage::Mounts,
        Stage::ReadOnlyRoot,
        Stage::WritableRoot,
        Stage::ProtectedPath,
        Stage::DenyRead,
        Stage::Dev,
        Stage::Loopback,
        Stage::Fork,
        Stage::Proc,
        Stage::Chdir,
        Stage::Capabilities,
        Stage::Landlock,
        Stage::Seccomp,
        Stage::Limits,
        Stage::RootIdentity,
        Stage::Proxy,
    ];

    pub(crate) fn from_u32(n: u32) -> Option<Stage> {
        Stage::ALL.into_iter().find(|s| *s as u32 == n)
    }

    /// What the step does, for an error message.
    pub fn doing(self) -> &'static str {
        match self {
            Stage::Session => "starting a new session",
            Stage::Namespaces => "creating the user, mount, pid, ipc and network namespaces",
            Stage::IdMap => "mapping the user and group ids into the user namespace",
            Stage::Mounts => "cloning the mounts of the writable roots and of /dev",
            Stage::ReadOnlyRoot => "making the root file system read-only",
            Stage::WritableRoot => "binding a writable root read-write",
            Stage::ProtectedPath => "re-binding a protected path read-only",
            Stage::DenyRead => "hiding a path the policy denies reading",
            Stage::Dev => "building the minimal /dev (tmpfs, device binds, devpts)",
            Stage::Loopback => "bringing up the loopback interface of the network namespace",
            Stage::Proxy => "opening the network proxy's port in the network namespace",
            Stage::Fork => "forking",
            Stage::Proc => "mounting /proc for the pid namespace",
            Stage::Chdir => "changing to the working directory inside the sandbox",
            Stage::Capabilities => "dropping capabilities",
            Stage::Landlock => "applying the Landlock ruleset",
            Stage::Seccomp => "installing the seccomp filter",
            Stage::Limits => "entering the command's cgroup and setting its rlimits",
            Stage::RootIdentity => {
                "checking that each writable root is still the directory the policy checked"
            }
        }
    }

    /// How to make the step work.
    pub fn help(self) -> &'static str {
        match self {
            Stage::Namespaces | Stage::IdMap => {
                "allow unprivileged user namespaces (`sysctl kernel.unprivileged_userns_clone=1` on Debian-patched kernels, `user.max_user_namespaces` above 0, `kernel.apparmor_restrict_unprivileged_userns=0` or an AppArmor profile granting `userns` on Ubuntu 23.10+; in a container, run it with a seccomp profile that allows `unshare` and `CLONE_NEWUSER`), or compose `dsh-bash-local` to run commands unconfined on purpose"
            }
            Stage::Mounts
            | Stage::ReadOnlyRoot
            | Stage::WritableRoot
            | Stage::ProtectedPath
            | Stage::DenyRead
            | Stage::Dev
            | Stage::Proc => {
                "run on Linux 5.12 or newer (new mount API and `mount_setattr`), outside a container that masks /proc or forbids mounts in user namespaces; check that every writable root exists"
            }
            Stage::Chdir => "make sure the working directory exists and is readable",
            Stage::Landlock => {
                "run on Linux 6.10 or newer with Landlock enabled (`landlock` in the `lsm=` boot parameter)"
            }
            Stage::Seccomp => "run on a kernel with seccomp filters (`CONFIG_SECCOMP_FILTER`)",
            Stage::Limits => {
                "let cordis move its own child processes between cgroups (write access to the cgroup file system), or turn the limits off with `limits: {memoryMib: 0, processes: 0}`"
            }
            Stage::RootIdentity => ROOT_MOVED_HELP,
            Stage::Session
            | Stage::Loopback
            | Stage::Proxy
            | Stage::Fork
            | Stage::Capabilities => {
                "this should not fail on Linux; check the process limits (`ulimit -u`)"
            }
        }
    }
}

/// How to fix a writable root found replaced, when the command is prepared or as it starts.
pub(crate) const ROOT_MOVED_HELP: &str = "another process renamed a writable root away and put something else in its place, so nothing ran; put the directory back, or start a new session in the directory you mean";

/// A confined command's namespaces and mount view, built before the fork.
pub(crate) struct SandboxSpec {
    /// `/proc/self/uid_map` contents: the caller's uid mapped to itself.
    pub uid_map: CString,
    /// `/proc/self/gid_map` contents.
    pub gid_map: CString,
    /// Directories bound read-write on the read-only root, outermost first.
    pub writable: Vec<CString>,
    /// The device and inode each of `writable` had when the fence was made: what is bound
    /// must be that directory (another process may have renamed a root away and put
    /// something else in its place since).
    pub writable_ids: Vec<Option<(u64, u64)>>,
    /// Directories between a writable root and a protected path, bound onto themselves
    /// (a mount point cannot be renamed), outermost first.
    pub pinned: Vec<CString>,
    /// Paths re-bound read-only on top of the writable roots, outermost first.
    pub protected: Vec<CString>,
    /// Directories hidden under an empty read-only tmpfs (unreadable by policy).
    pub hidden_dirs: Vec<CString>,
    /// Files hidden under `/dev/null` (unreadable by policy).
    pub hidden_files: Vec<CString>,
    /// The working directory, entered again inside the new view.
    pub cwd: CString,
    /// Network on: no network namespace and no socket filter.
    pub network: bool,
    /// The full tier: the namespaces and the mount view. Without (the `landlock-only`
    /// tier), the supervisor is a child subreaper and the shell gets only its last steps
    /// (no capabilities, `no_new_privs`, Landlock, seccomp).
    pub namespaces: bool,
    /// The network allowlist: a listening socket on the namespace's loopback is handed
    /// to the host ([`ChildPlan::egress`]), which serves it as the command's proxy.
    pub proxy: bool,
    /// The prepared Landlock ruleset.
    pub landlock: OwnedFd,
    /// The Landlock rights granted beneath the view's own `/dev/shm` (a private tmpfs, so
    /// its rule is added inside the view, where that tmpfs is).
    pub shm_access: u64,
    /// The seccomp program (empty: none).
    pub seccomp: Vec<libc::sock_filter>,
}

/// Everything the child needs, built before the fork.
pub(crate) struct ChildPlan {
    /// Read end of the host's control pipe: end of file means "kill the command now".
    pub control: RawFd,
    /// The call's cancel descriptor: readable (or end of file) means "cancelled".
    pub cancel: Option<RawFd>,
    /// Write end of the report pipe.
    pub report: RawFd,
    /// Write end of the status pipe: the supervisor writes the command's wait status here
    /// before it exits, so the host need not wait for the namespaces' teardown.
    pub status: RawFd,
    /// The namespaces and mount view of a confined command; `None` runs it unconfined.
    pub sandbox: Option<SandboxSpec>,
    /// The cgroups to enter and rlimits to set, first thing.
    pub limits: Option<ChildLimits>,
    /// The supervisor's end of the unix socket pair the proxy's listening socket is sent
    /// over (`SandboxSpec::proxy`); -1 without.
    pub egress: RawFd,
}

fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Reports a failed step and exits. Never returns.
unsafe fn fail(report: RawFd, stage: Stage, err: c_int) -> ! {
    let mut record = [0u8; 8];
    record[..4].copy_from_slice(&(stage as u32).to_ne_bytes());
    record[4..].copy_from_slice(&err.to_ne_bytes());
    libc::write(report, record.as_ptr().cast(), record.len());
    libc::_exit(SETUP_FAILED)
}

/// `Ok` or the step's failure.
pub(crate) unsafe fn check(report: RawFd, stage: Stage, ret: libc::c_long) {
    if ret < 0 {
        fail(report, stage, errno());
    }
}

/// Runs in the process `std` forked. Returns only in the process that must exec the shell.
///
/// # Safety
/// Call only between fork and exec, in the child.
pub(crate) unsafe fn supervise(plan: &ChildPlan) -> std::io::Result<()> {
    let report = plan.report;
    check(report, Stage::Session, libc::setsid() as _);
    // The host's signal handlers (its runtime's) were copied by the fork; this process and
    // the confined command's init never exec, so they would run here. Every signal gets its
    // default action back, and none stays blocked.
    for sig in 1..=64 {
        if sig != libc::SIGKILL && sig != libc::SIGSTOP {
            libc::signal(sig, libc::SIG_DFL);
        }
    }
    let mut unblocked: libc::sigset_t = std::mem::zeroed();
    libc::sigemptyset(&mut unblocked);
    libc::sigprocmask(libc::SIG_SETMASK, &unblocked, std::ptr::null_mut());
    if let Some(limits) = &plan.limits {
        for &fd in &limits.procs {
            if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                fail(report, Stage::Limits, errno());
            }
        }
        for &(resource, soft, hard) in &limits.rlimits {
            let limit = libc::rlimit {
                rlim_cur: soft,
                rlim_max: hard,
            };
            check(
                report,
                Stage::Limits,
                libc::setrlimit(resource as _, &limit) as _,
            );
        }
    }
    let landlock = plan.sandbox.as_ref().map_or(-1, |s| s.landlock.as_raw_fd());
    close_all_but(&[
        plan.control,
        plan.report,
        plan.cancel.unwrap_or(-1),
        landlock,
        plan.status,
        plan.egress,
    ]);
    libc::prctl(libc::PR_SET_NAME, c"dsh-supervisor".as_ptr(), 0, 0, 0);
    let supervisor = libc::getpid();
    let namespaced = plan.sandbox.as_ref().filter(|s| s.namespaces);
    match namespaced {
        Some(spec) => enter_namespaces(spec, report, plan.egress),
        None => check(
            report,
            Stage::Session,
            libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) as _,
        ),
    }
    // A confined command's init hands the shell's wait status up through this pipe (the
    // init cannot die of a signal it sends itself).
    let mut status_pipe = [-1; 2];
    if namespaced.is_some() {
        check(
            report,
            Stage::Fork,
            libc::pipe2(status_pipe.as_mut_ptr(), libc::O_CLOEXEC) as _,
        );
    }
    // Held open by the supervisor alone (never written): its end of file tells a child
    // that the supervisor is gone, where `getppid` cannot (a new pid namespace's init sees
    // its parent as 0).
    let mut alive = [-1; 2];
    check(
        report,
        Stage::Fork,
        libc::pipe2(alive.as_mut_ptr(), libc::O_CLOEXEC) as _,
    );
    let child = libc::fork();
    check(report, Stage::Fork, child as _);
    if child == 0 {
        libc::close(alive[1]);
        libc::close(plan.status);
        if let Some(fd) = plan.cancel {
            libc::close(fd);
        }
        // The payload dies with its supervisor, whatever kills it; a supervisor that died
        // before this line was reached is caught by the check after it.
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
        let mut gone = libc::pollfd {
            fd: alive[0],
            events: libc::POLLIN,
            revents: 0,
        };
        if libc::poll(&mut gone, 1, 0) != 0 {
            libc::_exit(SETUP_FAILED);
        }
        libc::close(alive[0]);
        return match &plan.sandbox {
            None => {
                if libc::getppid() != supervisor {
                    libc::_exit(SETUP_FAILED);
                }
                libc::setpgid(0, 0);
                Ok(())
            }
            Some(spec) if !spec.namespaces => {
                if libc::getppid() != supervisor {
                    libc::_exit(SETUP_FAILED);
                }
                libc::setpgid(0, 0);
                confine_shell(spec, report);
                Ok(())
            }
            Some(spec) => {
                libc::close(status_pipe[0]);
                init(spec, report, status_pipe[1])
            }
        };
    }
    libc::close(alive[0]);
    libc::close(report);
    if landlock >= 0 {
        libc::close(landlock);
    }
    if status_pipe[1] >= 0 {
        libc::close(status_pipe[1]);
    }
    // The supervisor writes nothing: the command's output pipes must close with the
    // command's last process, not with this one.
    for fd in 0..3 {
        libc::close(fd);
    }
    let mut status = wait_for(plan, child);
    if namespaced.is_some() {
        let mut raw = [0u8; 4];
        if libc::read(status_pipe[0], raw.as_mut_ptr().cast(), 4) == 4 {
            status = c_int::from_ne_bytes(raw);
        }
    } else {
        sweep(child);
    }
    // Every process of the command is gone; the host may answer before this process has
    // torn down its namespaces.
    let raw = status.to_ne_bytes();
    libc::write(plan.status, raw.as_ptr().cast(), raw.len());
    exit_like(status)
}

/// Closes every descriptor above 2 except `keep` (negative entries are ignored).
unsafe fn close_all_but(keep: &[RawFd; 6]) {
    let mut sorted = *keep;
    sorted.sort_unstable();
    let mut from: RawFd = 3;
    for fd in sorted {
        if fd < from {
            continue;
        }
        if fd > from {
            close_range(from as u32, (fd - 1) as u32);
        }
        from = fd + 1;
    }
    close_range(from as u32, u32::MAX);
}

unsafe fn close_range(first: u32, last: u32) {
    if libc::syscall(libc::SYS_close_range, first, last, 0) == 0 {
        return;
    }
    // Kernels before 5.9: one by one, up to the descriptor limit.
    let max = libc::sysconf(libc::_SC_OPEN_MAX);
    let max = if max < 0 { 1024 } else { max as u32 };
    for fd in first..=last.min(max) {
        libc::close(fd as c_int);
    }
}

/// Waits until the payload exits; kills it (and everything it started) first if the
/// control pipe closes or the call is cancelled. Returns the payload's wait status.
unsafe fn wait_for(plan: &ChildPlan, child: libc::pid_t) -> c_int {
    let pidfd = libc::syscall(libc::SYS_pidfd_open, child, 0) as c_int;
    let mut killed = false;
    let mut status: c_int = 0;
    loop {
        let (control, cancel) = if killed {
            (-1, -1)
        } else {
            (plan.control, plan.cancel.unwrap_or(-1))
        };
        let mut fds = [
            libc::pollfd {
                fd: pidfd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: control,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: cancel,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // Without pidfds (kernels before 5.3), look at the child every 10 ms.
        let timeout = if pidfd < 0 { 10 } else { -1 };
        let n = libc::poll(fds.as_mut_ptr(), 3, timeout);
        if n < 0 && errno() == libc::EINTR {
            continue;
        }
        if !killed && (fds[1].revents != 0 || fds[2].revents != 0) {
            killed = true;
            match plan.sandbox {
                // The init's death takes the whole pid namespace with it.
                Some(_) => libc::kill(child, libc::SIGKILL),
                None => libc::kill(-child, libc::SIGKILL),
            };
        }
        if pidfd >= 0 && fds[0].revents == 0 {
            continue;
        }
        let r = libc::waitpid(
            child,
            &mut status,
            if pidfd < 0 { libc::WNOHANG } else { 0 },
        );
        if r == child {
            return status;
        }
        if r < 0 && errno() != libc::EINTR {
            return status;
        }
    }
}

/// After an unconfined command: kills its process group and every process that was
/// reparented to this subreaper (double-forked or `setsid` children), until none is left.
unsafe fn sweep(leader: libc::pid_t) {
    libc::kill(-leader, libc::SIGKILL);
    let mut path = [0u8; 64];
    let len = children_path(&mut path, libc::getpid());
    loop {
        let fd = libc::open(
            path[..len].as_ptr().cast(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        );
        if fd >= 0 {
            kill_listed(fd);
            libc::close(fd);
        }
        let mut status = 0;
        let r = libc::waitpid(-1, &mut status, 0);
        if r < 0 && errno() != libc::EINTR {
            return;
        }
    }
}

/// `/proc/self/task/<pid>/children` with its NUL into `buf`; its length with the NUL.
fn children_path(buf: &mut [u8; 64], pid: libc::pid_t) -> usize {
    let head = b"/proc/self/task/";
    let tail = b"/children\0";
    buf[..head.len()].copy_from_slice(head);
    let mut at = head.len();
    let mut digits = [0u8; 12];
    let mut n = pid.max(0) as u32;
    let mut count = 0;
    loop {
        digits[count] = b'0' + (n % 10) as u8;
        count += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for i in (0..count).rev() {
        buf[at] = digits[i];
        at += 1;
    }
    buf[at..at + tail.len()].copy_from_slice(tail);
    at + tail.len()
}

/// Reads a list of pids separated by spaces from `fd` and kills each and its group.
unsafe fn kill_listed(fd: c_int) {
    let mut buf = [0u8; 512];
    let mut pid: libc::pid_t = 0;
    let mut in_number = false;
    loop {
        let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
        if n < 0 && errno() == libc::EINTR {
            continue;
        }
        if n <= 0 {
            break;
        }
        for &b in &buf[..n as usize] {
            if b.is_ascii_digit() {
                pid = pid
                    .saturating_mul(10)
                    .saturating_add((b - b'0') as libc::pid_t);
                in_number = true;
            } else if in_number {
                kill_tree(pid);
                pid = 0;
                in_number = false;
            }
        }
    }
    if in_number {
        kill_tree(pid);
    }
}

unsafe fn kill_tree(pid: libc::pid_t) {
    if pid > 1 {
        libc::kill(pid, libc::SIGKILL);
        libc::kill(-pid, libc::SIGKILL);
    }
}

/// Exits the way `status` says the payload did: the same exit code, or the same signal.
unsafe fn exit_like(status: c_int) -> ! {
    if libc::WIFSIGNALED(status) {
        let sig = libc::WTERMSIG(status);
        let no_core = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        libc::setrlimit(libc::RLIMIT_CORE, &no_core);
        libc::signal(sig, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::kill(libc::getpid(), sig);
        libc::_exit(128 + sig);
    }
    libc::_exit(if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        SETUP_FAILED
    })
}

/// Writes `data` (without its NUL) to the file at `path`.
unsafe fn write_file(path: &CStr, data: &CStr) -> Result<(), c_int> {
    let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
    if fd < 0 {
        return Err(errno());
    }
    let bytes = data.to_bytes();
    let n = libc::write(fd, bytes.as_ptr().cast(), bytes.len());
    let err = errno();
    libc::close(fd);
    if n != bytes.len() as isize {
        return Err(err);
    }
    Ok(())
}

unsafe fn open_tree(path: &CStr, recursive: bool) -> c_int {
    let flags = libc::OPEN_TREE_CLONE
        | libc::OPEN_TREE_CLOEXEC
        | if recursive {
            libc::AT_RECURSIVE as u32
        } else {
            0
        };
    libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, path.as_ptr(), flags) as c_int
}

unsafe fn move_mount(from: c_int, to: &CStr) -> libc::c_long {
    libc::syscall(
        libc::SYS_move_mount,
        from,
        c"".as_ptr(),
        libc::AT_FDCWD,
        to.as_ptr(),
        libc::MOVE_MOUNT_F_EMPTY_PATH,
    )
}

/// Attaches the detached mount `from` onto the directory open as `to`.
unsafe fn move_mount_onto(from: c_int, to: c_int) -> libc::c_long {
    libc::syscall(
        libc::SYS_move_mount,
        from,
        c"".as_ptr(),
        to,
        c"".as_ptr(),
        libc::MOVE_MOUNT_F_EMPTY_PATH | libc::MOVE_MOUNT_T_EMPTY_PATH,
    )
}

/// Sets `MOUNT_ATTR_RDONLY` on the mount at `dirfd`/`path` (and beneath, if `recursive`).
unsafe fn read_only(dirfd: c_int, path: &CStr, flags: c_int) -> libc::c_long {
    let attr = libc::mount_attr {
        attr_set: libc::MOUNT_ATTR_RDONLY,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    libc::syscall(
        libc::SYS_mount_setattr,
        dirfd,
        path.as_ptr(),
        flags,
        &attr as *const libc::mount_attr,
        std::mem::size_of::<libc::mount_attr>(),
    )
}

/// In the supervisor: new namespaces, id maps, and the mount view (read-only `/`, the
/// writable roots bound read-write, protected paths read-only again, a minimal `/dev`).
unsafe fn enter_namespaces(spec: &SandboxSpec, report: RawFd, egress: RawFd) {
    let mut flags = libc::CLONE_NEWUSER
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS;
    if !spec.network {
        flags |= libc::CLONE_NEWNET;
    }
    check(report, Stage::Namespaces, libc::unshare(flags) as _);
    map_ids(report, &spec.uid_map, &spec.gid_map);
    check(
        report,
        Stage::Mounts,
        libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ) as _,
    );
    // Clone what must stay writable (and the device nodes) while it still is.
    let mut roots = [-1; MAX_BINDS];
    for ((slot, root), id) in roots.iter_mut().zip(&spec.writable).zip(&spec.writable_ids) {
        *slot = open_tree(root, true);
        check(report, Stage::Mounts, *slot as _);
        if let Some((dev, ino)) = *id {
            let mut st: libc::stat = std::mem::zeroed();
            check(
                report,
                Stage::RootIdentity,
                libc::fstat(*slot, &mut st) as _,
            );
            if (st.st_dev as u64, st.st_ino as u64) != (dev, ino) {
                fail(report, Stage::RootIdentity, libc::ESTALE);
            }
        }
    }
    let mut nodes = [-1; DEV_NODES.len()];
    for (slot, node) in nodes.iter_mut().zip(DEV_NODES) {
        *slot = open_tree(node, false);
        check(report, Stage::Dev, *slot as _);
    }
    check(
        report,
        Stage::ReadOnlyRoot,
        read_only(libc::AT_FDCWD, c"/", libc::AT_RECURSIVE),
    );
    build_dev(&nodes, report);
    for ((fd, root), id) in roots.iter().zip(&spec.writable).zip(&spec.writable_ids) {
        match *id {
            // Bound onto the very directory checked, opened without following a link: a
            // root renamed away meanwhile (a link or another directory in its place) is
            // refused, and one renamed after this open keeps its mount wherever it goes.
            Some(id) => {
                let target = libc::open(
                    root.as_ptr(),
                    libc::O_PATH | libc::O_NOFOLLOW | libc::O_DIRECTORY | libc::O_CLOEXEC,
                );
                check(report, Stage::RootIdentity, target as _);
                let mut st: libc::stat = std::mem::zeroed();
                check(
                    report,
                    Stage::RootIdentity,
                    libc::fstat(target, &mut st) as _,
                );
                if (st.st_dev as u64, st.st_ino as u64) != id {
                    fail(report, Stage::RootIdentity, libc::ESTALE);
                }
                check(report, Stage::WritableRoot, move_mount_onto(*fd, target));
                libc::close(target);
            }
            None => check(report, Stage::WritableRoot, move_mount(*fd, root)),
        }
        libc::close(*fd);
    }
    for path in &spec.pinned {
        let fd = open_tree(path, true);
        check(report, Stage::ProtectedPath, fd as _);
        check(report, Stage::ProtectedPath, move_mount(fd, path));
        libc::close(fd);
    }
    for path in &spec.protected {
        let fd = open_tree(path, true);
        check(report, Stage::ProtectedPath, fd as _);
        check(
            report,
            Stage::ProtectedPath,
            read_only(fd, c"", libc::AT_EMPTY_PATH | libc::AT_RECURSIVE),
        );
        check(report, Stage::ProtectedPath, move_mount(fd, path));
        libc::close(fd);
    }
    for dir in &spec.hidden_dirs {
        check(
            report,
            Stage::DenyRead,
            libc::mount(
                c"tmpfs".as_ptr(),
                dir.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                c"size=0,mode=0555".as_ptr().cast(),
            ) as _,
        );
    }
    for file in &spec.hidden_files {
        // The view's own /dev/null (bound from the host's by `build_dev`).
        let fd = open_tree(c"/dev/null", false);
        check(report, Stage::DenyRead, fd as _);
        check(
            report,
            Stage::DenyRead,
            read_only(fd, c"", libc::AT_EMPTY_PATH),
        );
        check(report, Stage::DenyRead, move_mount(fd, file));
        libc::close(fd);
    }
    if !spec.network {
        loopback_up(report);
    }
    if spec.proxy {
        open_proxy_port(report, egress);
    }
    if egress >= 0 {
        libc::close(egress);
    }
}

/// Listens on the proxy's port of the namespace's loopback and sends the listening
/// socket over `egress` (`SCM_RIGHTS`): the host serves it, from its own network namespace.
unsafe fn open_proxy_port(report: RawFd, egress: RawFd) {
    let sock = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
    check(report, Stage::Proxy, sock as _);
    let one: c_int = 1;
    libc::setsockopt(
        sock,
        libc::SOL_SOCKET,
        libc::SO_REUSEADDR,
        (&one as *const c_int).cast(),
        std::mem::size_of::<c_int>() as _,
    );
    let mut addr: libc::sockaddr_in = std::mem::zeroed();
    addr.sin_family = libc::AF_INET as _;
    addr.sin_port = dsh_sandbox::egress::PROXY_PORT.to_be();
    addr.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
    check(
        report,
        Stage::Proxy,
        libc::bind(
            sock,
            (&addr as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as _,
        ) as _,
    );
    check(report, Stage::Proxy, libc::listen(sock, 128) as _);
    // One byte of data carrying the descriptor; the control buffer is sized and aligned
    // for one `int` on the stack (no allocation after the fork).
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut control = [0u64; 4];
    let mut msg: libc::msghdr = std::mem::zeroed();
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<c_int>() as u32) as _;
    let cmsg = libc::CMSG_FIRSTHDR(&msg);
    (*cmsg).cmsg_level = libc::SOL_SOCKET;
    (*cmsg).cmsg_type = libc::SCM_RIGHTS;
    (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<c_int>() as u32) as _;
    std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<c_int>(), sock);
    check(report, Stage::Proxy, libc::sendmsg(egress, &msg, 0) as _);
    libc::close(sock);
}

/// In a new user namespace: `setgroups` denied, then the user and group maps written.
pub(crate) unsafe fn map_ids(report: RawFd, uid_map: &CStr, gid_map: &CStr) {
    match write_file(c"/proc/self/setgroups", c"deny") {
        Err(e) if e != libc::ENOENT => fail(report, Stage::IdMap, e),
        _ => {}
    }
    if let Err(e) = write_file(c"/proc/self/uid_map", uid_map) {
        fail(report, Stage::IdMap, e);
    }
    if let Err(e) = write_file(c"/proc/self/gid_map", gid_map) {
        fail(report, Stage::IdMap, e);
    }
}

/// A fresh tmpfs on `/dev` holding the host's harmless device nodes (bound), a private
/// devpts instance, the usual links, and a private `/dev/shm`; then `/dev` read-only.
unsafe fn build_dev(nodes: &[c_int; DEV_NODES.len()], report: RawFd) {
    let mount = |source: &CStr, target: &CStr, fstype: &CStr, flags, data: &CStr| {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            flags,
            data.as_ptr().cast(),
        ) as libc::c_long
    };
    let nosuid = libc::MS_NOSUID | libc::MS_NOEXEC;
    check(
        report,
        Stage::Dev,
        mount(c"tmpfs", c"/dev", c"tmpfs", nosuid, c"mode=0755,size=1m"),
    );
    for (fd, node) in nodes.iter().zip(DEV_NODES) {
        let file = libc::open(
            node.as_ptr(),
            libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
            0o666,
        );
        check(report, Stage::Dev, file as _);
        libc::close(file);
        check(report, Stage::Dev, move_mount(*fd, node));
        libc::close(*fd);
    }
    check(
        report,
        Stage::Dev,
        libc::mkdir(c"/dev/pts".as_ptr(), 0o755) as _,
    );
    check(
        report,
        Stage::Dev,
        mount(
            c"devpts",
            c"/dev/pts",
            c"devpts",
            nosuid,
            c"newinstance,ptmxmode=0666,mode=0620",
        ),
    );
    check(
        report,
        Stage::Dev,
        libc::mkdir(c"/dev/shm".as_ptr(), 0o1777) as _,
    );
    check(
        report,
        Stage::Dev,
        mount(
            c"tmpfs",
            c"/dev/shm",
            c"tmpfs",
            nosuid | libc::MS_NODEV,
            c"mode=1777,size=64m",
        ),
    );
    for (target, link) in [
        (c"pts/ptmx", c"/dev/ptmx"),
        (c"/proc/self/fd", c"/dev/fd"),
        (c"/proc/self/fd/0", c"/dev/stdin"),
        (c"/proc/self/fd/1", c"/dev/stdout"),
        (c"/proc/self/fd/2", c"/dev/stderr"),
    ] {
        check(
            report,
            Stage::Dev,
            libc::symlink(target.as_ptr(), link.as_ptr()) as _,
        );
    }
    check(report, Stage::Dev, read_only(libc::AT_FDCWD, c"/dev", 0));
}

/// `ip link set lo up` in the new network namespace: the command's own loopback.
pub(crate) unsafe fn loopback_up(report: RawFd) {
    let sock = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
    check(report, Stage::Loopback, sock as _);
    let mut ifr: libc::ifreq = std::mem::zeroed();
    for (dst, src) in ifr.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    check(
        report,
        Stage::Loopback,
        libc::ioctl(sock, libc::SIOCGIFFLAGS, &mut ifr) as _,
    );
    ifr.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    check(
        report,
        Stage::Loopback,
        libc::ioctl(sock, libc::SIOCSIFFLAGS, &ifr) as _,
    );
    libc::close(sock);
}

/// Pid 1 of the new pid namespace: mounts `/proc`, forks the shell, reaps every orphan,
/// and exits once the shell has, handing its status to the supervisor. Returns only in
/// the shell.
unsafe fn init(spec: &SandboxSpec, report: RawFd, status_out: RawFd) -> std::io::Result<()> {
    libc::prctl(libc::PR_SET_NAME, c"dsh-init".as_ptr(), 0, 0, 0);
    // A fresh `/proc`; then `/proc/sys` read-only, beside Landlock: the command's own
    // namespaces' settings (its network namespace's, as their owner) stay unchangeable too.
    let hardened = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    let mounts: [(Option<&CStr>, &CStr, Option<&CStr>, libc::c_ulong); 3] = [
        (Some(c"proc"), c"/proc", Some(c"proc"), hardened),
        (Some(c"/proc/sys"), c"/proc/sys", None, libc::MS_BIND),
        (
            None,
            c"/proc/sys",
            None,
            libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | hardened,
        ),
    ];
    let ptr = |s: Option<&CStr>| s.map_or(std::ptr::null(), CStr::as_ptr);
    for (source, target, fstype, flags) in mounts {
        let r = libc::mount(
            ptr(source),
            target.as_ptr(),
            ptr(fstype),
            flags,
            std::ptr::null(),
        );
        check(report, Stage::Proc, r as _);
    }
    let shell = libc::fork();
    check(report, Stage::Fork, shell as _);
    if shell == 0 {
        libc::close(status_out);
        confine_shell(spec, report);
        return Ok(());
    }
    libc::close(report);
    libc::close(spec.landlock.as_raw_fd());
    for fd in 0..3 {
        libc::close(fd);
    }
    loop {
        let mut status = 0;
        let r = libc::waitpid(-1, &mut status, 0);
        if r == shell {
            let raw = status.to_ne_bytes();
            libc::write(status_out, raw.as_ptr().cast(), raw.len());
            libc::_exit(0);
        }
        if r < 0 && errno() != libc::EINTR {
            libc::_exit(SETUP_FAILED);
        }
    }
}

/// The shell's last steps before `exec`: the working directory inside the new view, no
/// capabilities, `no_new_privs`, Landlock, and the seccomp filter.
unsafe fn confine_shell(spec: &SandboxSpec, report: RawFd) {
    check(report, Stage::Chdir, libc::chdir(spec.cwd.as_ptr()) as _);
    check(
        report,
        Stage::Capabilities,
        libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) as _,
    );
    for cap in 0..64 {
        if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno() != libc::EINVAL {
            fail(report, Stage::Capabilities, errno());
        }
    }
    libc::prctl(
        libc::PR_CAP_AMBIENT,
        libc::PR_CAP_AMBIENT_CLEAR_ALL,
        0,
        0,
        0,
    );
    #[repr(C)]
    struct CapHeader {
        version: u32,
        pid: c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct CapData {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let header = CapHeader {
        version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
        pid: 0,
    };
    let none = [CapData {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    check(
        report,
        Stage::Capabilities,
        libc::syscall(libc::SYS_capset, &header, none.as_ptr()),
    );
    let landlock = spec.landlock.as_raw_fd();
    // `struct landlock_path_beneath_attr`: the view's private /dev/shm is writable, so POSIX
    // semaphores and shared memory work within its size. Without the view (the
    // `landlock-only` tier) `/dev/shm` is the host's, shared with every process: not
    // writable.
    #[repr(C, packed)]
    struct PathBeneath {
        allowed_access: u64,
        parent_fd: c_int,
    }
    if spec.namespaces {
        let shm = libc::open(c"/dev/shm".as_ptr(), libc::O_PATH | libc::O_CLOEXEC);
        check(report, Stage::Landlock, shm as _);
        let rule = PathBeneath {
            allowed_access: spec.shm_access,
            parent_fd: shm,
        };
        check(
            report,
            Stage::Landlock,
            libc::syscall(
                libc::SYS_landlock_add_rule,
                landlock,
                1, // LANDLOCK_RULE_PATH_BENEATH
                &rule as *const PathBeneath,
                0,
            ),
        );
        libc::close(shm);
    }
    check(
        report,
        Stage::Landlock,
        libc::syscall(libc::SYS_landlock_restrict_self, landlock, 0),
    );
    libc::close(landlock);
    if !spec.seccomp.is_empty() {
        install_seccomp(report, &spec.seccomp);
    }
}

/// Installs the seccomp `program` on the calling thread (`no_new_privs` already set).
pub(crate) unsafe fn install_seccomp(report: RawFd, program: &[libc::sock_filter]) {
    let prog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_ptr() as *mut libc::sock_filter,
    };
    check(
        report,
        Stage::Seccomp,
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0,
            &prog as *const libc::sock_fprog,
        ),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_path_names_the_task() {
        let mut buf = [0u8; 64];
        let len = children_path(&mut buf, 40213);
        assert_eq!(&buf[..len], b"/proc/self/task/40213/children\0");
        let len = children_path(&mut buf, 7);
        assert_eq!(&buf[..len], b"/proc/self/task/7/children\0");
    }

    #[test]
    fn every_stage_round_trips_through_its_number() {
        for stage in Stage::ALL {
            assert_eq!(Stage::from_u32(stage as u32), Some(stage));
        }
        assert_eq!(Stage::from_u32(0), None);
        assert_eq!(Stage::from_u32(99), None);
    }
}
