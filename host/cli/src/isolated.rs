//! The confinement an isolated entry's process applies to itself before it loads its
//! plugin (the host gives it a network namespace of its own and a scrubbed environment
//! when it starts it): no file writes anywhere, no TCP bind or connect, and no signals to or
//! abstract unix sockets of processes outside; without a network, no unix socket of its
//! own either (a pathname socket reaches the host's services through the file system,
//! which no network namespace and no Landlock right of ABI 7 covers). Every right it
//! handles must be enforced, or the process does not run.

use landlock::{
    Access, AccessFs, AccessNet, CompatLevel, Compatible, Ruleset, RulesetAttr, RulesetStatus,
    Scope, ABI,
};

/// The Landlock ABI whose write rights are handled (5: truncate and device ioctls).
const PINNED_ABI: ABI = ABI::V5;

/// Forbids every file write of this process and its future threads and children.
pub fn forbid_writes() -> Result<(), String> {
    let status = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_write(PINNED_ABI))
        .map_err(|e| e.to_string())?
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessNet::from_all(PINNED_ABI))
        .map_err(|e| e.to_string())?
        .scope(Scope::Signal | Scope::AbstractUnixSocket)
        .map_err(|e| e.to_string())?
        .create()
        .map_err(|e| e.to_string())?
        .restrict_self()
        .map_err(|e| e.to_string())?;
    match status.ruleset {
        RulesetStatus::NotEnforced => {
            Err("the kernel does not enforce Landlock (needed: ABI 5 or later)".to_string())
        }
        _ => Ok(()),
    }
}

/// The audit architecture of this build, as the kernel reports it in `seccomp_data`.
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7;

/// Bit 30 of a system call number: the x32 numbering on x86_64.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// System calls no confined isolated process makes: reaching into another process's
/// memory or control (the host runs as the same user; a user namespace, where the process
/// has one, already keeps it out, but an entry that needs the network has none, and Yama
/// may be off).
const NO_TRACING: &[libc::c_long] = &[
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    // Another process's descriptor, taken from it (the same access check as `ptrace`).
    libc::SYS_pidfd_getfd,
];

/// Installs this process's seccomp filter (for its future threads and children too):
/// [`NO_TRACING`] refused, and with `no_unix_sockets` no unix socket created
/// (`socket(AF_UNIX, ..)`; the socket it already holds, the host's, and socket pairs keep
/// working). Every refusal answers `EACCES`. Calls of another architecture's numbering are
/// refused whole, so none of these is reached under another number.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub fn confine_syscalls(no_unix_sockets: bool) -> Result<(), String> {
    let stmt = |code: u32, k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    let (ld, jeq, jge, ret) = (
        libc::BPF_LD | libc::BPF_W | libc::BPF_ABS,
        libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
        libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K,
        libc::BPF_RET | libc::BPF_K,
    );
    let allow = stmt(ret, libc::SECCOMP_RET_ALLOW, 0, 0);
    let deny = stmt(ret, libc::SECCOMP_RET_ERRNO | libc::EACCES as u32, 0, 0);
    let mut program = vec![
        stmt(ld, 4, 0, 0),                // arch
        stmt(jeq, AUDIT_ARCH, 1, 0),      // native → skip the refusal
        deny,                             // another architecture
        stmt(ld, 0, 0, 0),                // nr
        stmt(jge, X32_SYSCALL_BIT, 0, 1), // x32 → refuse
        deny,
    ];
    for call in NO_TRACING {
        program.push(stmt(jeq, *call as u32, 0, 1));
        program.push(deny);
    }
    if no_unix_sockets {
        program.extend([
            stmt(jeq, libc::SYS_socket as u32, 0, 3), // not socket → allow
            stmt(ld, 16, 0, 0),                       // args[0], low word
            stmt(jeq, libc::AF_UNIX as u32, 0, 1),    // AF_UNIX → refuse
            deny,
        ]);
    }
    program.push(allow);
    let prog = libc::sock_fprog {
        len: u16::try_from(program.len()).map_err(|e| e.to_string())?,
        filter: program.as_mut_ptr(),
    };
    // SAFETY: `prog` points at `program`, alive for the call; the kernel copies it.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
            || libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &prog as *const libc::sock_fprog,
            ) != 0
        {
            return Err(format!(
                "cannot install the seccomp filter: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    Ok(())
}

/// Where no filter is built for the architecture, the process does not run unconfined.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub fn confine_syscalls(_no_unix_sockets: bool) -> Result<(), String> {
    Err("no seccomp filter is built for this architecture".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Run in a process of its own (this test binary again), since the filter cannot be
    /// taken off: no unix socket under the native numbering nor the x32 one, no reaching
    /// into another process (nor take its descriptors); other families and socket pairs
    /// still work.
    #[test]
    fn no_unix_socket_under_any_numbering_and_the_rest_still_works() {
        const CHILD: &str = "CORDIS_TEST_FORBID_UNIX_SOCKETS";
        if std::env::var_os(CHILD).is_none() {
            let status = std::process::Command::new(std::env::current_exe().expect("exe"))
                .args([
                    "--exact",
                    "isolated::tests::no_unix_socket_under_any_numbering_and_the_rest_still_works",
                    "--nocapture",
                ])
                .env(CHILD, "1")
                .status()
                .expect("run the test in a process of its own");
            assert!(status.success(), "{status}");
            return;
        }
        let errno = || std::io::Error::last_os_error().raw_os_error();
        // SAFETY: plain system calls; every descriptor made is closed.
        unsafe {
            let before = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            assert!(before >= 0, "a unix socket before the filter");
            libc::close(before);
            confine_syscalls(true).expect("the filter");
            assert_eq!(libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0), -1);
            assert_eq!(errno(), Some(libc::EACCES));
            assert_eq!(libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM, 0), -1);
            #[cfg(target_arch = "x86_64")]
            {
                let x32 = libc::syscall(
                    libc::SYS_socket | libc::c_long::from(X32_SYSCALL_BIT as i32),
                    libc::AF_UNIX,
                    libc::SOCK_STREAM,
                    0,
                );
                assert_eq!(x32, -1);
                assert_eq!(
                    errno(),
                    Some(libc::EACCES),
                    "not ENOSYS: refused by the filter"
                );
            }
            let inet = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
            assert!(
                inet >= 0,
                "other families are the network namespace's business"
            );
            libc::close(inet);
            let mut pair = [0; 2];
            assert_eq!(
                libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, pair.as_mut_ptr()),
                0
            );
            libc::close(pair[0]);
            libc::close(pair[1]);
            // Nothing reaches into another process (here the test's own parent).
            let mut byte = [0u8; 1];
            let local = libc::iovec {
                iov_base: byte.as_mut_ptr().cast(),
                iov_len: 1,
            };
            let remote = libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 1,
            };
            assert_eq!(
                libc::process_vm_readv(libc::getppid(), &local, 1, &remote, 1, 0),
                -1
            );
            assert_eq!(errno(), Some(libc::EACCES));
            assert_eq!(libc::ptrace(libc::PTRACE_ATTACH, libc::getppid(), 0, 0), -1);
            assert_eq!(errno(), Some(libc::EACCES));
            let parent = libc::syscall(libc::SYS_pidfd_open, libc::getppid(), 0);
            assert!(parent >= 0, "pidfd_open: {:?}", errno());
            assert_eq!(libc::syscall(libc::SYS_pidfd_getfd, parent, 0, 0), -1);
            assert_eq!(errno(), Some(libc::EACCES));
            libc::close(parent as i32);
        }
    }
}
