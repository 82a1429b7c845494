//! What a confined command may not call: the one table of the seccomp filter
//! ([`REFUSED`]), compiled into the program every confined command runs under. README's
//! "What a confined command cannot call" is this table in prose; keep them together.
//!
//! Every refusal answers `EPERM` (the command sees an ordinary error, never a crash),
//! except `clone3`, which answers `ENOSYS` so that libc falls back to `clone`, whose flags
//! seccomp can read. On x86_64, the x32 numbering of every call (the same calls under
//! numbers with bit 30 set, which a table by number would miss) is refused as a whole.

use std::collections::BTreeMap;

use dsh_sandbox::SandboxExecutionPolicy;
use libc::c_long;
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// When a row of [`REFUSED`] applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum When {
    /// For every confined command.
    Always,
    /// Unless the policy has the network on and `allowUnixSockets`.
    UnixSocketsClosed,
    /// In the `landlock-only` tier with the network off (there is no network namespace
    /// to leave the command only its own loopback).
    NoNetworkNamespace,
}

/// One refused system call: refused outright, or when its argument `arg` masked by `mask`
/// equals `value`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Refusal {
    pub call: c_long,
    /// How README's table names it (its test checks every row is there).
    #[cfg_attr(not(test), allow(dead_code))]
    pub name: &'static str,
    /// `(arg, mask, value)`.
    pub only: Option<(u8, u64, u64)>,
    pub when: When,
    /// Why it is refused (README's table says the same).
    #[cfg_attr(not(test), allow(dead_code))]
    pub why: &'static str,
}

const CLONE_NEWUSER: u64 = libc::CLONE_NEWUSER as u64;
const SETUID: u64 = libc::S_ISUID as u64;
const SETGID: u64 = libc::S_ISGID as u64;

const fn refuse(call: c_long, name: &'static str, why: &'static str) -> Refusal {
    Refusal {
        call,
        name,
        only: None,
        when: When::Always,
        why,
    }
}

const fn refuse_if(
    call: c_long,
    name: &'static str,
    only: (u8, u64, u64),
    when: When,
    why: &'static str,
) -> Refusal {
    Refusal {
        call,
        name,
        only: Some(only),
        when,
        why,
    }
}

const MODE: &str =
    "a set-user-ID or set-group-ID file written inside would run with its owner's privileges outside (the sandbox's root is the host's root)";
const NESTED: &str =
    "a nested user namespace gives the command every capability over new namespaces, the kernel's most attacked surface (netfilter, mounts, raw sockets)";
const KEYS: &str = "the host's session keyring: its secrets, and keys the host would use";

/// Every refusal of the filter (see the module's documentation for what they answer).
pub(crate) const REFUSED: &[Refusal] = &[
    refuse_if(libc::SYS_socket, "socket(AF_UNIX)", (0, u64::MAX, libc::AF_UNIX as u64), When::UnixSocketsClosed,
        "a socket file anywhere the command can see reaches a host daemon (`docker.sock`, the session bus, an ssh agent)"),
    refuse_if(libc::SYS_socket, "socket(AF_INET)", (0, u64::MAX, libc::AF_INET as u64), When::NoNetworkNamespace,
        "without a network namespace of its own, an IP socket reaches the host's network and its loopback services"),
    refuse_if(libc::SYS_socket, "socket(AF_INET6)", (0, u64::MAX, libc::AF_INET6 as u64), When::NoNetworkNamespace,
        "the same over IPv6"),
    refuse_if(libc::SYS_socket, "socket(AF_VSOCK)", (0, u64::MAX, libc::AF_VSOCK as u64), When::Always,
        "the host's vsock port space, which on a virtual machine reaches the hypervisor"),
    refuse_if(libc::SYS_socket, "socket(AF_PACKET)", (0, u64::MAX, libc::AF_PACKET as u64), When::Always,
        "raw link-layer frames"),
    refuse_if(libc::SYS_socket, "socket(SOCK_RAW)", (1, 0xf, libc::SOCK_RAW as u64), When::Always,
        "raw IP packets"),
    refuse_if(libc::SYS_unshare, "unshare(CLONE_NEWUSER)", (0, CLONE_NEWUSER, CLONE_NEWUSER), When::Always, NESTED),
    refuse_if(libc::SYS_clone, "clone(CLONE_NEWUSER)", (0, CLONE_NEWUSER, CLONE_NEWUSER), When::Always, NESTED),
    refuse_if(libc::SYS_ioctl, "ioctl(FS_IOC_SETFLAGS)", (1, u64::MAX, libc::FS_IOC_SETFLAGS), When::Always,
        "`chattr`: a directory made case-insensitive (`+F`) would give every protected name aliases (`.GIT`)"),
    refuse_if(libc::SYS_ioctl, "ioctl(FS_IOC32_SETFLAGS)", (1, u64::MAX, libc::FS_IOC32_SETFLAGS), When::Always,
        "the same through the 32-bit number"),
    refuse(libc::SYS_keyctl, "keyctl", KEYS),
    refuse(libc::SYS_add_key, "add_key", KEYS),
    refuse(libc::SYS_request_key, "request_key", KEYS),
    refuse(libc::SYS_userfaultfd, "userfaultfd",
        "it stalls the kernel inside a copy at will, the usual way to win a kernel race"),
    refuse(libc::SYS_perf_event_open, "perf_event_open",
        "kernel attack surface and side channels on other processes"),
    refuse(libc::SYS_bpf, "bpf", "programs run by the kernel"),
    refuse(libc::SYS_io_uring_setup, "io_uring_setup",
        "io_uring's operations bypass seccomp (and this table)"),
    refuse(libc::SYS_openat2, "openat2",
        "its mode sits in a structure seccomp cannot read (callers fall back to `openat`)"),
    refuse_if(libc::SYS_fchmod, "fchmod(S_ISUID)", (1, SETUID, SETUID), When::Always, MODE),
    refuse_if(libc::SYS_fchmod, "fchmod(S_ISGID)", (1, SETGID, SETGID), When::Always, MODE),
    refuse_if(libc::SYS_fchmodat, "fchmodat(S_ISUID)", (2, SETUID, SETUID), When::Always, MODE),
    refuse_if(libc::SYS_fchmodat, "fchmodat(S_ISGID)", (2, SETGID, SETGID), When::Always, MODE),
    refuse_if(libc::SYS_fchmodat2, "fchmodat2(S_ISUID)", (2, SETUID, SETUID), When::Always, MODE),
    refuse_if(libc::SYS_fchmodat2, "fchmodat2(S_ISGID)", (2, SETGID, SETGID), When::Always, MODE),
    refuse_if(libc::SYS_openat, "openat(S_ISUID)", (3, SETUID, SETUID), When::Always, MODE),
    refuse_if(libc::SYS_openat, "openat(S_ISGID)", (3, SETGID, SETGID), When::Always, MODE),
    refuse_if(libc::SYS_mknodat, "mknodat(S_ISUID)", (2, SETUID, SETUID), When::Always, MODE),
    refuse_if(libc::SYS_mknodat, "mknodat(S_ISGID)", (2, SETGID, SETGID), When::Always, MODE),
    refuse_if(libc::SYS_mkdirat, "mkdirat(S_ISUID)", (2, SETUID, SETUID), When::Always, MODE),
    refuse_if(libc::SYS_mkdirat, "mkdirat(S_ISGID)", (2, SETGID, SETGID), When::Always, MODE),
];

/// [`REFUSED`]'s rows for the older calls only some architectures still have.
#[cfg(target_arch = "x86_64")]
pub(crate) const REFUSED_LEGACY: &[Refusal] = &[
    refuse_if(
        libc::SYS_chmod,
        "chmod(S_ISUID)",
        (1, SETUID, SETUID),
        When::Always,
        MODE,
    ),
    refuse_if(
        libc::SYS_chmod,
        "chmod(S_ISGID)",
        (1, SETGID, SETGID),
        When::Always,
        MODE,
    ),
    refuse_if(
        libc::SYS_open,
        "open(S_ISUID)",
        (2, SETUID, SETUID),
        When::Always,
        MODE,
    ),
    refuse_if(
        libc::SYS_open,
        "open(S_ISGID)",
        (2, SETGID, SETGID),
        When::Always,
        MODE,
    ),
    refuse_if(
        libc::SYS_creat,
        "creat(S_ISUID)",
        (1, SETUID, SETUID),
        When::Always,
        MODE,
    ),
    refuse_if(
        libc::SYS_creat,
        "creat(S_ISGID)",
        (1, SETGID, SETGID),
        When::Always,
        MODE,
    ),
    refuse_if(
        libc::SYS_mknod,
        "mknod(S_ISUID)",
        (1, SETUID, SETUID),
        When::Always,
        MODE,
    ),
    refuse_if(
        libc::SYS_mknod,
        "mknod(S_ISGID)",
        (1, SETGID, SETGID),
        When::Always,
        MODE,
    ),
    refuse_if(
        libc::SYS_mkdir,
        "mkdir(S_ISUID)",
        (1, SETUID, SETUID),
        When::Always,
        MODE,
    ),
    refuse_if(
        libc::SYS_mkdir,
        "mkdir(S_ISGID)",
        (1, SETGID, SETGID),
        When::Always,
        MODE,
    ),
];
#[cfg(not(target_arch = "x86_64"))]
pub(crate) const REFUSED_LEGACY: &[Refusal] = &[];

/// What decides which rows apply to one command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Setting {
    /// Whether the command may create unix sockets.
    pub unix_sockets: bool,
    /// Whether the command may create IP sockets (refused only in the `landlock-only` tier
    /// with the network off).
    pub ip_sockets: bool,
}

impl Setting {
    /// The setting of a command under `policy` on this kernel.
    pub fn of(policy: &SandboxExecutionPolicy) -> Setting {
        Setting::with_scoping(policy, landlock_abi() >= 6)
    }

    /// [`Setting::of`] on a kernel that has Landlock's abstract-socket scoping or not:
    /// without it an allowed `AF_UNIX` socket would reach every abstract socket of the
    /// host (seccomp cannot tell an abstract address from a path), so unix sockets stay
    /// closed whatever the policy says.
    pub fn with_scoping(policy: &SandboxExecutionPolicy, scoping: bool) -> Setting {
        Setting {
            unix_sockets: policy.network && policy.allow_unix_sockets && scoping,
            ip_sockets: policy.network
                || policy.confinement != dsh_sandbox::ConfinementTier::LandlockOnly,
        }
    }
}

/// The Landlock ABI version of this kernel (0 without Landlock).
pub(crate) fn landlock_abi() -> i64 {
    /// `LANDLOCK_CREATE_RULESET_VERSION`.
    const VERSION: libc::c_uint = 1;
    // SAFETY: with this flag the call only reports the version; no pointer is read.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            VERSION,
        )
    };
    abi.max(0)
}

/// Whether `row` applies to a command with `setting`.
fn applies(row: &Refusal, setting: Setting) -> bool {
    match row.when {
        When::Always => true,
        When::UnixSocketsClosed => !setting.unix_sockets,
        When::NoNetworkNamespace => !setting.ip_sockets,
    }
}

/// The audit architecture of this build, as the kernel reports it in `seccomp_data`.
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7;
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const AUDIT_ARCH: u32 = 0;

/// Bit 30 of a system call number: the x32 numbering on x86_64 (no call of another
/// architecture has it).
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// The seccomp program of a command with `setting`: [`REFUSED`] (and [`REFUSED_LEGACY`])
/// refused with `EPERM`, everything else allowed; before them, `clone3` answers `ENOSYS`
/// and every x32 number `EPERM`. `Err` says why it cannot be built for this
/// architecture.
pub(crate) fn seccomp_filter(setting: Setting) -> Result<Vec<libc::sock_filter>, String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|e| err(&e))?;
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for row in REFUSED.iter().chain(REFUSED_LEGACY) {
        if !applies(row, setting) {
            continue;
        }
        let alternatives = rules.entry(row.call).or_default();
        if let Some((arg, mask, value)) = row.only {
            let op = if mask == u64::MAX {
                SeccompCmpOp::Eq
            } else {
                SeccompCmpOp::MaskedEq(mask)
            };
            let condition = SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value)
                .map_err(|e| err(&e))?;
            alternatives.push(SeccompRule::new(vec![condition]).map_err(|e| err(&e))?);
        }
    }
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(|e| err(&e))?;
    let program: BpfProgram = filter.try_into().map_err(|e| err(&e))?;
    let stmt = |code: u32, k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    let ret_errno = |errno: i32| {
        stmt(
            libc::BPF_RET | libc::BPF_K,
            libc::SECCOMP_RET_ERRNO | errno as u32,
            0,
            0,
        )
    };
    // The prologue: another architecture goes on to seccompiler's program (which refuses
    // it); an x32 number is refused; `clone3` answers ENOSYS; anything else goes on.
    let mut out = vec![
        stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 4, 0, 0),
        stmt(
            libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
            AUDIT_ARCH,
            0,
            5,
        ),
        stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0, 0, 0),
        stmt(
            libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K,
            X32_SYSCALL_BIT,
            2,
            0,
        ),
        stmt(
            libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
            libc::SYS_clone3 as u32,
            0,
            2,
        ),
        ret_errno(libc::ENOSYS),
        ret_errno(libc::EPERM),
    ];
    out.extend(program.into_iter().map(|f| libc::sock_filter {
        code: f.code,
        jt: f.jt,
        jf: f.jf,
        k: f.k,
    }));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the kernel would answer: a classic BPF interpreter over a `seccomp_data` (the
    /// instructions seccompiler and the prologue use), returning the filter's verdict.
    fn verdict(program: &[libc::sock_filter], nr: u32, arch: u32, args: [u64; 6]) -> u32 {
        let mut data = Vec::with_capacity(64);
        data.extend(nr.to_ne_bytes());
        data.extend(arch.to_ne_bytes());
        data.extend(0u64.to_ne_bytes());
        for a in args {
            data.extend(a.to_ne_bytes());
        }
        let (mut acc, mut pc) = (0u32, 0usize);
        loop {
            let i = program[pc];
            let code = u32::from(i.code);
            pc += 1;
            match code {
                c if c == libc::BPF_LD | libc::BPF_W | libc::BPF_ABS => {
                    let at = i.k as usize;
                    acc = u32::from_ne_bytes(data[at..at + 4].try_into().unwrap());
                }
                c if c == libc::BPF_ALU | libc::BPF_AND | libc::BPF_K => acc &= i.k,
                c if c == libc::BPF_JMP | libc::BPF_JA => pc += i.k as usize,
                c if c & 0x07 == libc::BPF_JMP => {
                    let taken = match c & 0xf0 {
                        x if x == libc::BPF_JEQ => acc == i.k,
                        x if x == libc::BPF_JGE => acc >= i.k,
                        x if x == libc::BPF_JGT => acc > i.k,
                        x if x == libc::BPF_JSET => acc & i.k != 0,
                        other => panic!("jump op {other:#x}"),
                    };
                    pc += usize::from(if taken { i.jt } else { i.jf });
                }
                c if c == libc::BPF_RET | libc::BPF_K => return i.k,
                other => panic!("instruction {other:#x} at {}", pc - 1),
            }
        }
    }

    const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
    const EPERM: u32 = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
    const ENOSYS: u32 = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;

    fn policy(network: bool, allow_unix_sockets: bool) -> Setting {
        Setting::with_scoping(
            &SandboxExecutionPolicy {
                network,
                allow_unix_sockets,
                ..Default::default()
            },
            true,
        )
    }

    /// The arguments that make `row` match (or, with `matching` false, not match).
    fn args_for(row: &Refusal, matching: bool) -> [u64; 6] {
        let mut args = [0u64; 6];
        if let Some((arg, mask, value)) = row.only {
            args[usize::from(arg)] = if matching {
                value
            } else {
                value ^ (mask & mask.wrapping_neg())
            };
        }
        args
    }

    #[test]
    fn every_row_is_refused_when_it_applies_and_only_then() {
        for (network, unix) in [(false, false), (false, true), (true, false), (true, true)] {
            let p = policy(network, unix);
            let program = seccomp_filter(p).unwrap();
            for row in REFUSED.iter().chain(REFUSED_LEGACY) {
                let expected = if applies(row, p) { EPERM } else { ALLOW };
                let got = verdict(&program, row.call as u32, AUDIT_ARCH, args_for(row, true));
                assert_eq!(
                    got, expected,
                    "{} with network {network}, unix {unix}",
                    row.name
                );
                if row.only.is_some() {
                    let other = args_for(row, false);
                    let refused_otherwise = REFUSED.iter().chain(REFUSED_LEGACY).any(|r| {
                        r.call == row.call
                            && applies(r, p)
                            && r.only
                                .is_some_and(|(a, m, v)| other[usize::from(a)] & m == v)
                    });
                    if !refused_otherwise {
                        assert_eq!(
                            verdict(&program, row.call as u32, AUDIT_ARCH, other),
                            ALLOW,
                            "{} with other arguments {other:?}",
                            row.name
                        );
                    }
                }
            }
        }
    }

    /// README's table is this one: every row's call is named there, in a row saying when.
    #[test]
    fn readme_lists_every_row() {
        let readme = include_str!("../../../../README.md");
        for row in REFUSED.iter().chain(REFUSED_LEGACY) {
            // `socket(AF_VSOCK)` by that name; `fchmod(S_ISUID)` as `fchmod` with `S_ISUID`.
            let (call, arg) = match row.name.split_once('(') {
                Some((call, arg)) => (call, Some(arg.trim_end_matches(')'))),
                None => (row.name, None),
            };
            let named = |l: &str| {
                l.contains(&format!("`{}`", row.name))
                    || (l.contains(&format!("`{call}`"))
                        && arg.is_none_or(|a| l.contains(&format!("`{a}`"))))
            };
            let line = readme
                .lines()
                .find(|l| l.starts_with("| `") && named(l))
                .unwrap_or_else(|| panic!("README's syscall table lacks `{}`", row.name));
            let when = match row.when {
                When::Always => "always",
                When::UnixSocketsClosed => "unless `network` and `allowUnixSockets`",
                When::NoNetworkNamespace => "in the `landlock-only` tier with the network off",
            };
            assert!(line.contains(when), "README's row for {}: {line}", row.name);
            assert!(!row.why.is_empty());
        }
    }

    #[test]
    fn unix_sockets_open_only_with_the_network_and_the_option() {
        let unix = [libc::AF_UNIX as u64, libc::SOCK_STREAM as u64, 0, 0, 0, 0];
        let inet = [libc::AF_INET as u64, libc::SOCK_STREAM as u64, 0, 0, 0, 0];
        let raw = [
            libc::AF_INET as u64,
            (libc::SOCK_RAW | libc::SOCK_CLOEXEC) as u64,
            0,
            0,
            0,
            0,
        ];
        let vsock = [libc::AF_VSOCK as u64, libc::SOCK_STREAM as u64, 0, 0, 0, 0];
        let socket = libc::SYS_socket as u32;
        for (network, allow, unix_verdict) in [
            (false, false, EPERM),
            (false, true, EPERM),
            (true, false, EPERM),
            (true, true, ALLOW),
        ] {
            let program = seccomp_filter(policy(network, allow)).unwrap();
            assert_eq!(verdict(&program, socket, AUDIT_ARCH, unix), unix_verdict);
            assert_eq!(verdict(&program, socket, AUDIT_ARCH, inet), ALLOW);
            assert_eq!(verdict(&program, socket, AUDIT_ARCH, raw), EPERM);
            assert_eq!(verdict(&program, socket, AUDIT_ARCH, vsock), EPERM);
        }
    }

    /// Without Landlock's abstract-socket scoping, `allowUnixSockets` opens nothing.
    #[test]
    fn unix_sockets_stay_closed_without_abstract_socket_scoping() {
        let open = SandboxExecutionPolicy {
            network: true,
            allow_unix_sockets: true,
            ..Default::default()
        };
        assert!(Setting::with_scoping(&open, true).unix_sockets);
        assert!(!Setting::with_scoping(&open, false).unix_sockets);
        // This kernel has scoping (Landlock ABI 6 or newer): the option holds here.
        assert!(landlock_abi() >= 6, "Landlock ABI {}", landlock_abi());
        assert!(Setting::of(&open).unix_sockets);
    }

    #[test]
    fn clone3_answers_enosys_and_x32_numbers_are_refused() {
        let program = seccomp_filter(policy(false, false)).unwrap();
        assert_eq!(
            verdict(&program, libc::SYS_clone3 as u32, AUDIT_ARCH, [0; 6]),
            ENOSYS
        );
        // x32's `socket(AF_UNIX)` and `getpid`, and a number beyond every table.
        for nr in [41, 39, 0x1ff] {
            assert_eq!(
                verdict(
                    &program,
                    X32_SYSCALL_BIT | nr,
                    AUDIT_ARCH,
                    [1, 0, 0, 0, 0, 0]
                ),
                EPERM,
                "x32 number {nr}"
            );
        }
        // Ordinary calls pass; a thread's `clone` without a new user namespace too.
        let thread = (libc::CLONE_VM | libc::CLONE_THREAD | libc::CLONE_SIGHAND) as u64;
        assert_eq!(
            verdict(
                &program,
                libc::SYS_clone as u32,
                AUDIT_ARCH,
                [thread, 0, 0, 0, 0, 0]
            ),
            ALLOW
        );
        assert_eq!(
            verdict(&program, libc::SYS_getpid as u32, AUDIT_ARCH, [0; 6]),
            ALLOW
        );
        // Another architecture never reaches the allow-list.
        assert_ne!(
            verdict(&program, libc::SYS_getpid as u32, 0x4000_0003, [0; 6]),
            ALLOW
        );
    }
}
