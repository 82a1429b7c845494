//! A confined command's resource limits ([`Limits`]). Memory and the number of processes
//! bind only through a control group: they must hold when cordis runs as root (as in most
//! containers), where `RLIMIT_NPROC` does not bind, and a per-process address-space limit
//! bounds no sum. So each command gets a cgroup of its own in whichever hierarchy the host
//! has (v1 `memory` and `pids`, or the v2 unified one), entered by its supervisor before
//! anything else runs; file size and CPU time are rlimits. A command whose limits need a
//! cgroup the host cannot make is not run. Afterwards, [`CommandLimits::reached`] says which
//! limit stopped or held back the command.

use std::ffi::c_int;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use dsh_sandbox::mountinfo::Mount;
use dsh_sandbox::Limits;

use crate::confine::ConfineError;

/// Where this host's command cgroups go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Hierarchy {
    /// cgroup v1: the host's own cgroup in the `memory` and in the `pids` hierarchy.
    V1 {
        /// The host's cgroup directory in the `memory` hierarchy.
        memory: PathBuf,
        /// The host's cgroup directory in the `pids` hierarchy.
        pids: PathBuf,
    },
    /// cgroup v2: the nearest cgroup at or above the host's whose children have the
    /// `memory` and `pids` controllers (a child of the host's own cgroup cannot, while the
    /// host's cgroup holds a process, unless it is the root).
    V2 {
        /// The directory command cgroups are made in.
        parent: PathBuf,
    },
}

/// Where the command cgroups of a process go, from its `/proc/self/mountinfo`, its
/// `/proc/self/cgroup` and (for v2) what `read` says the `cgroup.subtree_control` files
/// hold. v1 when both controllers are mounted there, else v2; an error names what is
/// missing.
pub(crate) fn locate(
    mountinfo: &str,
    own: &str,
    read: impl Fn(&Path) -> Option<String>,
) -> Result<Hierarchy, String> {
    let mounts: Vec<Mount<'_>> = dsh_sandbox::mountinfo::mounts(mountinfo.as_bytes()).collect();
    let own_path = |controller: &str| {
        own.lines().find_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            let listed = if controller.is_empty() {
                controllers.is_empty()
            } else {
                controllers.split(',').any(|c| c == controller)
            };
            listed.then_some(path)
        })
    };
    // The directory of cgroup `path` under `mount`.
    let dir_of = |mount: &Mount<'_>, path: &str| -> Option<PathBuf> {
        let rel = Path::new(path).strip_prefix(&mount.root).ok()?;
        Some(mount.point.join(rel))
    };
    let v1 = |controller: &str| {
        let mount = mounts.iter().find(|m| {
            m.fstype == "cgroup" && m.super_options.split(',').any(|o| o == controller)
        })?;
        dir_of(mount, own_path(controller)?)
    };
    if let (Some(memory), Some(pids)) = (v1("memory"), v1("pids")) {
        return Ok(Hierarchy::V1 { memory, pids });
    }
    let Some(mount) = mounts.iter().find(|m| m.fstype == "cgroup2") else {
        return Err("no cgroup hierarchy with the memory and pids controllers is mounted".into());
    };
    let Some(own_dir) = own_path("").and_then(|p| dir_of(mount, p)) else {
        return Err("this process's cgroup v2 path is not under the mounted hierarchy".into());
    };
    let top = &mount.point;
    for dir in own_dir.ancestors() {
        let enabled = read(&dir.join("cgroup.subtree_control")).unwrap_or_default();
        let has = |c: &str| enabled.split_whitespace().any(|e| e == c);
        if has("memory") && has("pids") {
            return Ok(Hierarchy::V2 {
                parent: dir.to_path_buf(),
            });
        }
        if dir == top {
            break;
        }
    }
    Err(format!(
        "no cgroup v2 directory at or above `{}` has the memory and pids controllers enabled for its children",
        own_dir.display()
    ))
}

/// This process's [`Hierarchy`], found once.
fn hierarchy() -> &'static Result<Hierarchy, String> {
    static HIERARCHY: OnceLock<Result<Hierarchy, String>> = OnceLock::new();
    HIERARCHY.get_or_init(|| {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
        let own = std::fs::read_to_string("/proc/self/cgroup")
            .map_err(|e| format!("cannot read /proc/self/cgroup: {e}"))?;
        locate(&mountinfo, &own, |p| std::fs::read_to_string(p).ok())
    })
}

/// The files of one command cgroup a limit is set in and read back from.
struct Files {
    /// The limit's file and its value.
    set: Vec<(&'static str, String)>,
    /// Files written only where they exist (swap, group kill).
    optional: Vec<(&'static str, &'static str)>,
}

/// A command's limits, prepared in the host: its cgroup directories (created, limits set),
/// their `cgroup.procs` opened for the supervisor to enter, and the rlimits.
pub struct CommandLimits {
    limits: Limits,
    dirs: Vec<PathBuf>,
    procs: Vec<OwnedFd>,
    /// `(resource, value)` for `setrlimit` in the supervisor.
    rlimits: Vec<(c_int, libc::rlim_t)>,
}

/// What the supervisor does with a command's limits, between fork and exec.
pub(crate) struct ChildLimits {
    /// `cgroup.procs` of each command cgroup: `0` written to it moves the writer in.
    pub procs: Vec<RawFd>,
    /// `(resource, soft, hard)` for `setrlimit`.
    pub rlimits: Vec<(c_int, libc::rlim_t, libc::rlim_t)>,
}

const MIB: u64 = 1 << 20;

impl CommandLimits {
    /// Prepares `limits` for one command: creates its cgroup (when memory or processes are
    /// limited) and sets the limits in it. Fails when the cgroup cannot be made.
    pub fn prepare(limits: &Limits) -> Result<CommandLimits, ConfineError> {
        let mut out = CommandLimits {
            limits: *limits,
            dirs: Vec::new(),
            procs: Vec::new(),
            rlimits: Vec::new(),
        };
        if limits.file_size_mib > 0 {
            out.rlimits.push((
                libc::RLIMIT_FSIZE as c_int,
                limits.file_size_mib.saturating_mul(MIB),
            ));
        }
        if limits.cpu_seconds > 0 {
            out.rlimits
                .push((libc::RLIMIT_CPU as c_int, limits.cpu_seconds));
        }
        if limits.memory_mib == 0 && limits.processes == 0 {
            return Ok(out);
        }
        let fail = |reason: String| ConfineError::Limits { reason };
        let hierarchy = hierarchy().as_ref().map_err(|e| fail(e.clone()))?;
        let memory = Files {
            set: vec![(
                match hierarchy {
                    Hierarchy::V1 { .. } => "memory.limit_in_bytes",
                    Hierarchy::V2 { .. } => "memory.max",
                },
                limits.memory_mib.saturating_mul(MIB).to_string(),
            )],
            optional: match hierarchy {
                Hierarchy::V1 { .. } => vec![],
                Hierarchy::V2 { .. } => vec![("memory.swap.max", "0"), ("memory.oom.group", "1")],
            },
        };
        let pids = Files {
            set: vec![("pids.max", limits.processes.to_string())],
            optional: vec![],
        };
        let mut wanted: Vec<(&Path, Vec<Files>)> = Vec::new();
        match hierarchy {
            Hierarchy::V1 { memory: m, pids: p } => {
                if limits.memory_mib > 0 {
                    wanted.push((m, vec![memory]));
                }
                if limits.processes > 0 {
                    wanted.push((p, vec![pids]));
                }
            }
            Hierarchy::V2 { parent } => {
                let mut files = Vec::new();
                if limits.memory_mib > 0 {
                    files.push(memory);
                }
                if limits.processes > 0 {
                    files.push(pids);
                }
                wanted.push((parent, files));
            }
        }
        // Once per process: what hosts that are gone left behind (this host's own are
        // removed as its commands end).
        static SWEPT: std::sync::Once = std::sync::Once::new();
        SWEPT.call_once(|| wanted.iter().for_each(|(parent, _)| sweep(parent)));
        for (parent, files) in wanted {
            let dir = create_fresh(parent).map_err(|e| {
                fail(format!(
                    "cannot create the command's cgroup in `{}`: {e}",
                    parent.display()
                ))
            })?;
            out.dirs.push(dir.clone());
            let at = |what: &str, e: std::io::Error| {
                fail(format!("cannot {what} `{}`: {e}", dir.display()))
            };
            for file in files {
                for (name, value) in &file.set {
                    std::fs::write(dir.join(name), value)
                        .map_err(|e| at(&format!("set {name} of"), e))?;
                }
                for (name, value) in &file.optional {
                    let path = dir.join(name);
                    if path.exists() {
                        std::fs::write(&path, value)
                            .map_err(|e| at(&format!("set {name} of"), e))?;
                    }
                }
            }
            let procs = std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_CLOEXEC)
                .open(dir.join("cgroup.procs"))
                .map_err(|e| at("open cgroup.procs of", e))?;
            out.procs.push(procs.into());
        }
        Ok(out)
    }

    /// What the supervisor needs, with `timeout` as the CPU limit when none is set.
    pub(crate) fn child(&self, timeout: Duration) -> ChildLimits {
        let mut rlimits: Vec<(c_int, libc::rlim_t, libc::rlim_t)> = self
            .rlimits
            .iter()
            .map(|&(resource, value)| {
                // CPU time: SIGXCPU at the soft limit, SIGKILL a second later.
                let hard = if resource == libc::RLIMIT_CPU as c_int {
                    value.saturating_add(1)
                } else {
                    value
                };
                (resource, value, hard)
            })
            .collect();
        if self.limits.cpu_seconds == 0 {
            let seconds = timeout.as_secs().saturating_add(1);
            rlimits.push((
                libc::RLIMIT_CPU as c_int,
                seconds,
                seconds.saturating_add(1),
            ));
        }
        ChildLimits {
            procs: self.procs.iter().map(AsRawFd::as_raw_fd).collect(),
            rlimits,
        }
    }

    /// The limit that stopped or held back the command, if one did: the memory limit when
    /// the cgroup's OOM killer ran, the process limit when a fork was refused, the file
    /// size or CPU limit when the command (its `signal`, or a shell's `exit_code` of 128
    /// plus it) ended by their signal.
    pub fn reached(&self, signal: Option<i32>, exit_code: Option<i32>) -> Option<String> {
        let count = |file: &str, key: &str| -> u64 {
            self.dirs
                .iter()
                .filter_map(|d| std::fs::read_to_string(d.join(file)).ok())
                .flat_map(|text| {
                    text.lines()
                        .filter_map(|l| l.strip_prefix(key)?.trim().parse::<u64>().ok())
                        .collect::<Vec<_>>()
                })
                .sum()
        };
        let by_signal = |sig: i32| signal == Some(sig) || exit_code == Some(128 + sig);
        if self.limits.memory_mib > 0
            && count("memory.oom_control", "oom_kill ") + count("memory.events", "oom_kill ") > 0
        {
            return Some(format!("memory limit ({} MiB)", self.limits.memory_mib));
        }
        if self.limits.processes > 0 && count("pids.events", "max ") > 0 {
            return Some(format!("process limit ({})", self.limits.processes));
        }
        if self.limits.file_size_mib > 0 && by_signal(libc::SIGXFSZ) {
            return Some(format!(
                "file size limit ({} MiB)",
                self.limits.file_size_mib
            ));
        }
        if by_signal(libc::SIGXCPU) {
            return Some(match self.limits.cpu_seconds {
                0 => "CPU time limit (the call's timeout)".to_string(),
                s => format!("CPU time limit ({s} s)"),
            });
        }
        None
    }
}

/// A new directory `cordis-<pid>-<n>` in `parent`. Each loaded copy of this library (a hot
/// reload loads a new one) counts `n` on its own, so a name already taken is skipped.
fn create_fresh(parent: &Path) -> std::io::Result<PathBuf> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = parent.join(format!("cordis-{}-{n}", std::process::id()));
        match std::fs::create_dir(&dir) {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < u64::MAX => continue,
            Err(e) => return Err(e),
            Ok(()) => return Ok(dir),
        }
    }
}

/// Removes the command cgroups in `parent` left by hosts that are gone (a one-shot `cordis
/// call` may exit before its command's supervisor has left its cgroup). A cgroup that still
/// holds a process is left alone (the kernel refuses to remove it).
fn sweep(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("cordis-"))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir(entry.path());
        }
    }
}

impl Drop for CommandLimits {
    /// Removes the command's cgroups once the last process has left them (the supervisor
    /// may still be tearing down its namespaces: a busy cgroup is retried for a while).
    fn drop(&mut self) {
        self.procs.clear();
        let busy: Vec<PathBuf> = self
            .dirs
            .drain(..)
            .filter(|dir| {
                std::fs::remove_dir(dir).is_err_and(|e| e.raw_os_error() == Some(libc::EBUSY))
            })
            .collect();
        if busy.is_empty() {
            return;
        }
        let retry = move || {
            for dir in busy {
                for _ in 0..500 {
                    std::thread::sleep(Duration::from_millis(10));
                    if !std::fs::remove_dir(&dir)
                        .is_err_and(|e| e.raw_os_error() == Some(libc::EBUSY))
                    {
                        break;
                    }
                }
            }
        };
        // Without a thread the empty cgroup stays behind; nothing else depends on it.
        let _ = std::thread::Builder::new()
            .name("dsh-cgroup-remove".into())
            .spawn(retry);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1_MOUNTS: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn v1_places_command_cgroups_under_the_hosts_own() {
        let own = "8:pids:/\n4:memory:/jobs/a b\n1:cpu,cpuacct:/\n0::/\n";
        assert_eq!(
            locate(V1_MOUNTS, own, |_| None),
            Ok(Hierarchy::V1 {
                memory: PathBuf::from("/sys/fs/cgroup/memory/jobs/a b"),
                pids: PathBuf::from("/sys/fs/cgroup/pids"),
            })
        );
    }

    /// The v2 path against a fake cgroupfs: the nearest directory at or above the host's
    /// cgroup whose `cgroup.subtree_control` enables both controllers; a cgroup namespace's
    /// mount root is stripped; nothing is found when no directory enables them.
    #[test]
    fn v2_places_command_cgroups_where_the_controllers_are_delegated() {
        let tmp = tempfile::tempdir().unwrap();
        let fs = tmp.path();
        let scope = fs.join("user.slice/user@1000.service/app.slice/term.scope");
        std::fs::create_dir_all(&scope).unwrap();
        std::fs::write(scope.join("cgroup.subtree_control"), "").unwrap();
        std::fs::write(
            fs.join("user.slice/user@1000.service/app.slice/cgroup.subtree_control"),
            "cpu memory pids\n",
        )
        .unwrap();
        std::fs::write(fs.join("cgroup.subtree_control"), "memory\n").unwrap();
        let mounts = format!("30 23 0:27 / {} rw - cgroup2 cgroup2 rw\n", fs.display());
        let own = "0::/user.slice/user@1000.service/app.slice/term.scope\n";
        let read = |p: &Path| std::fs::read_to_string(p).ok();
        assert_eq!(
            locate(&mounts, own, read),
            Ok(Hierarchy::V2 {
                parent: fs.join("user.slice/user@1000.service/app.slice"),
            })
        );
        // In a cgroup namespace the mount's root is the namespace's: paths are relative to it.
        let namespaced = format!(
            "30 23 0:27 /user.slice/user@1000.service {} rw - cgroup2 cgroup2 rw\n",
            fs.join("user.slice/user@1000.service").display()
        );
        assert_eq!(
            locate(&namespaced, own, read),
            Ok(Hierarchy::V2 {
                parent: fs.join("user.slice/user@1000.service/app.slice"),
            })
        );
        std::fs::write(
            fs.join("user.slice/user@1000.service/app.slice/cgroup.subtree_control"),
            "cpu\n",
        )
        .unwrap();
        let err = locate(&mounts, own, read).unwrap_err();
        assert!(err.contains("memory and pids controllers"), "{err}");
        // Hybrid: v1 controllers win over an empty unified hierarchy.
        assert!(matches!(
            locate(V1_MOUNTS, "4:memory:/\n8:pids:/\n0::/\n", read),
            Ok(Hierarchy::V1 { .. })
        ));
        assert!(locate("", "0::/\n", read).is_err());
    }

    /// Another loaded copy of this library (a hot reload) counts from 0 too: names it
    /// took are skipped, never an error.
    #[test]
    fn a_taken_cgroup_name_is_skipped() {
        let tmp = tempfile::tempdir().unwrap();
        for n in 0..64 {
            std::fs::create_dir(
                tmp.path()
                    .join(format!("cordis-{}-{n}", std::process::id())),
            )
            .unwrap();
        }
        let made: Vec<PathBuf> = (0..3).map(|_| create_fresh(tmp.path()).unwrap()).collect();
        assert!(made.iter().all(|d| d.is_dir()));
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 67);
        // Any other error is the answer, at once (never a loop over names).
        let err = create_fresh(&tmp.path().join("absent")).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
    }

    /// A limit is named only when it is on and its signal ended the command; the file
    /// size limit off, `SIGXFSZ` from elsewhere is no limit of ours.
    #[test]
    fn a_limit_is_named_only_when_it_is_on() {
        let with = |limits: Limits| CommandLimits {
            limits,
            dirs: Vec::new(),
            procs: Vec::new(),
            rlimits: Vec::new(),
        };
        let on = with(Limits::default());
        let off = with(Limits {
            file_size_mib: 0,
            ..Limits::default()
        });
        let xfsz = Some(libc::SIGXFSZ);
        assert_eq!(
            on.reached(xfsz, None).as_deref(),
            Some("file size limit (1024 MiB)")
        );
        assert_eq!(
            on.reached(None, Some(128 + libc::SIGXFSZ)).as_deref(),
            Some("file size limit (1024 MiB)")
        );
        assert_eq!(off.reached(xfsz, None), None);
        assert_eq!(on.reached(None, Some(1)), None);
        assert_eq!(
            on.reached(Some(libc::SIGXCPU), None).as_deref(),
            Some("CPU time limit (the call's timeout)")
        );
    }
}
