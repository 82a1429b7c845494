//! End-to-end tests of the `shell` backends: `dsh-bash-sandbox` (composed with
//! `dsh-sandbox-policy`) and `dsh-bash-local`, loaded as real cdylibs through the real host,
//! running real commands under the real kernel's Landlock. A kernel that cannot enforce the
//! sandbox makes these tests FAIL with the reason, never pass.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use cordis_e2e::{shell_exec as exec, shell_request as request, Scratch, Started};
use dsh_sandbox::{
    denial_marker, writable_roots, EnforcedFamily, ResolveArgs, SandboxExecutionPolicy,
    SandboxMode, SandboxPolicy, SandboxPolicyClient,
};
use dsh_shell_api::{Shell, ShellClient};

use SandboxMode::{DangerFullAccess as Full, ReadOnly as Ro, WorkspaceWrite as Ww};

/// A directory OUTSIDE every writable root (the temp areas are writable roots), holding a
/// workspace `ws/` and an `outside/` tree; removed on drop.
struct Layout {
    base: PathBuf,
    ws: PathBuf,
    out: PathBuf,
    /// A unique name for files this test creates in the shared temp areas.
    tag: String,
}

impl Layout {
    fn new() -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let tag = format!(
            "dsh-shell-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        );
        let base = cordis_e2e::outside_base().join(format!("shell-outside-{tag}"));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("ws")).expect("create workspace");
        std::fs::create_dir_all(base.join("outside")).expect("create outside dir");
        let base = base.canonicalize().expect("canonical base");
        for root in [PathBuf::from("/tmp"), std::env::temp_dir()] {
            let root = root.canonicalize().expect("canonical temp root");
            assert!(
                !base.starts_with(&root),
                "the test layout {} must live outside the writable temp root {}",
                base.display(),
                root.display()
            );
        }
        let layout = Layout {
            ws: base.join("ws"),
            out: base.join("outside"),
            base,
            tag,
        };
        std::fs::write(layout.ws.join("inner.txt"), "inside\n").expect("seed inner");
        std::fs::write(layout.out.join("victim.txt"), "original\n").expect("seed victim");
        std::os::unix::fs::symlink(&layout.out, layout.ws.join("link")).expect("symlink out");
        layout
    }

    fn policy(&self, mode: SandboxMode) -> SandboxExecutionPolicy {
        SandboxExecutionPolicy {
            mode,
            workspace_root: self.ws.clone(),
            network: false,
            ..Default::default()
        }
    }

    /// `{ws}`, `{out}`, `{tmp}` (the process temp dir) and `{tag}` substituted.
    fn expand(&self, template: &str) -> String {
        template
            .replace("{ws}", &self.ws.display().to_string())
            .replace("{out}", &self.out.display().to_string())
            .replace("{tmp}", &std::env::temp_dir().display().to_string())
            .replace("{tag}", &self.tag)
    }

    /// Every file and directory beneath the base with its bytes (symlinks by target).
    fn snapshot(&self) -> BTreeMap<PathBuf, Vec<u8>> {
        fn walk(dir: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
            let Ok(rd) = std::fs::read_dir(dir) else {
                return;
            };
            for e in rd.flatten() {
                let p = e.path();
                let meta = p.symlink_metadata().expect("stat");
                if meta.file_type().is_symlink() {
                    let t = std::fs::read_link(&p).expect("readlink");
                    out.insert(p, t.display().to_string().into_bytes());
                } else if meta.is_dir() {
                    out.insert(p.clone(), b"<dir>".to_vec());
                    walk(&p, out);
                } else {
                    out.insert(p.clone(), std::fs::read(&p).expect("read"));
                }
            }
        }
        let mut out = BTreeMap::new();
        walk(&self.base, &mut out);
        out
    }
}

impl Drop for Layout {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.base);
        for dir in [PathBuf::from("/tmp"), std::env::temp_dir()] {
            let _ = std::fs::remove_file(dir.join(&self.tag));
        }
    }
}

/// `dsh-sandbox-policy` (configured with `mode` and `root`) plus `dsh-bash-sandbox`.
fn start_sandboxed(scratch: &Scratch, mode: SandboxMode, root: &Path) -> Started {
    scratch.manifest(&format!(
        "- name: dsh-sandbox-policy\n  config:\n    mode: {mode}\n    workspaceRoot: '{}'\n- name: dsh-bash-sandbox\n",
        root.display()
    ));
    scratch.start()
}

fn start_local(scratch: &Scratch) -> Started {
    scratch.manifest("- name: dsh-bash-local\n");
    scratch.start()
}

/// What a case does when it is allowed.
#[derive(Clone, Copy)]
enum Effect {
    /// The file has these bytes.
    File(&'static str, &'static str),
    /// The directory exists.
    Dir(&'static str),
    /// Nothing observable besides a zero exit (writes to `/dev/null`).
    Exit0,
}

/// One row of the write matrix.
struct Case {
    name: &'static str,
    command: &'static str,
    effect: Effect,
    /// The modes under which the write goes through.
    allowed: &'static [SandboxMode],
    /// The command exits non-zero when denied (a background write leaves the exit at 0).
    fails_when_denied: bool,
    /// Text the raw output must show when denied ([`DENIED`]: a denial by either layer).
    shows: &'static str,
}

/// Shown by a denied write: the read-only mount view says `Read-only file system`,
/// Landlock (the second layer) `Permission denied`.
const DENIED: &str = "<denied>";

fn shows_denial(stderr: &str, shows: &str) -> bool {
    match shows {
        DENIED => ["Permission denied", "Read-only file system"]
            .iter()
            .any(|m| stderr.contains(m)),
        text => stderr.contains(text),
    }
}

const INSIDE: &[SandboxMode] = &[Ww, Full];
const EVERYWHERE: &[SandboxMode] = &[Ro, Ww, Full];
const UNCONFINED: &[SandboxMode] = &[Full];

const CASES: &[Case] = &[
    Case {
        name: "create in workspace",
        command: "echo new > {ws}/new.txt",
        effect: Effect::File("{ws}/new.txt", "new\n"),
        allowed: INSIDE,
        fails_when_denied: true,
        shows: DENIED,
    },
    Case {
        name: "append in workspace",
        command: "echo more >> {ws}/inner.txt",
        effect: Effect::File("{ws}/inner.txt", "inside\nmore\n"),
        allowed: INSIDE,
        fails_when_denied: true,
        shows: DENIED,
    },
    Case {
        name: "rename within workspace",
        command: "mkdir {ws}/d && mv {ws}/inner.txt {ws}/d/moved.txt",
        effect: Effect::File("{ws}/d/moved.txt", "inside\n"),
        allowed: INSIDE,
        fails_when_denied: true,
        shows: DENIED,
    },
    Case {
        name: "mkdir in workspace",
        command: "mkdir -p {ws}/a/b/c",
        effect: Effect::Dir("{ws}/a/b/c"),
        allowed: INSIDE,
        fails_when_denied: true,
        shows: DENIED,
    },
    Case {
        name: "write /tmp",
        command: "echo t > /tmp/{tag}",
        effect: Effect::File("/tmp/{tag}", "t\n"),
        allowed: INSIDE,
        fails_when_denied: true,
        shows: DENIED,
    },
    Case {
        name: "write the temp dir",
        command: "echo t > {tmp}/{tag}",
        effect: Effect::File("{tmp}/{tag}", "t\n"),
        allowed: INSIDE,
        fails_when_denied: true,
        shows: DENIED,
    },
    Case {
        name: "write /dev/null",
        command: "echo gone > /dev/null && echo kept 2>/dev/null",
        effect: Effect::Exit0,
        allowed: EVERYWHERE,
        fails_when_denied: true,
        shows: DENIED,
    },
    Case {
        name: "write outside",
        command: "echo evil > {out}/victim.txt",
        effect: Effect::File("{out}/victim.txt", "evil\n"),
        allowed: UNCONFINED,
        fails_when_denied: true,
        shows: DENIED,
    },
    Case {
        name: "create outside",
        command: "echo evil > {out}/new.txt",
        effect: Effect::File("{out}/new.txt", "evil\n"),
        allowed: UNCONFINED,
        fails_when_denied: true,
        shows: DENIED,
    },
    Case {
        name: "truncate outside",
        command: "truncate -s 0 {out}/victim.txt",
        effect: Effect::File("{out}/victim.txt", ""),
        allowed: UNCONFINED,
        fails_when_denied: true,
        shows: DENIED,
    },
    Case {
        name: "rename a file out of the workspace",
        command: "mv {ws}/inner.txt {out}/stolen.txt",
        effect: Effect::File("{out}/stolen.txt", "inside\n"),
        allowed: UNCONFINED,
        fails_when_denied: true,
        shows: DENIED,
    },
    Case {
        name: "hard link to an outside file",
        command: "ln {out}/victim.txt {ws}/hard",
        effect: Effect::File("{ws}/hard", "original\n"),
        allowed: UNCONFINED,
        fails_when_denied: true,
        shows: "ln: failed",
    },
    Case {
        name: "write through an in-workspace symlink",
        command: "echo evil > {ws}/link/victim.txt",
        effect: Effect::File("{out}/victim.txt", "evil\n"),
        allowed: UNCONFINED,
        fails_when_denied: true,
        shows: DENIED,
    },
    Case {
        name: "nested bash -c",
        command: "bash -c 'bash -c \"echo evil > {out}/victim.txt\"'",
        effect: Effect::File("{out}/victim.txt", "evil\n"),
        allowed: UNCONFINED,
        fails_when_denied: true,
        shows: DENIED,
    },
    Case {
        name: "background child",
        command: "(sleep 0.1; echo evil > {out}/victim.txt) & wait; exit 0",
        effect: Effect::File("{out}/victim.txt", "evil\n"),
        allowed: UNCONFINED,
        fails_when_denied: false,
        shows: DENIED,
    },
];

/// Runs `case` in a fresh layout with the per-call policy `mode` and checks the outcome:
/// allowed → the effect is visible; denied → nothing under the layout changed (byte for
/// byte), the effect is absent, the output shows the denial, and the marker leads stderr
/// when the command failed.
fn check(shell: &ShellClient, case: &Case, mode: SandboxMode) {
    let layout = Layout::new();
    let before = layout.snapshot();
    let command = layout.expand(case.command);
    let r = exec(
        shell,
        request(&command, &layout.ws, Some(layout.policy(mode))),
    );
    // No wait: every process the command started is gone when the call returns, so its
    // effect (or its denial) is already there.
    let ctx = format!("case `{}` under {mode}: `{command}` gave {r:#?}", case.name);
    assert_eq!(r.mode, Some(mode), "{ctx}");
    let visible = match case.effect {
        Effect::File(path, bytes) => {
            std::fs::read(layout.expand(path)).ok() == Some(bytes.as_bytes().to_vec())
        }
        Effect::Dir(path) => Path::new(&layout.expand(path)).is_dir(),
        Effect::Exit0 => r.exit_code == Some(0),
    };
    if case.allowed.contains(&mode) {
        assert!(visible, "expected the write to go through\n{ctx}");
        assert_eq!(r.exit_code, Some(0), "{ctx}");
        assert!(!r.sandbox_denied, "{ctx}");
        return;
    }
    assert!(!visible, "expected the write to be denied\n{ctx}");
    assert_eq!(
        layout.snapshot(),
        before,
        "something changed on disk\n{ctx}"
    );
    assert!(
        shows_denial(&r.stderr, case.shows),
        "the output must show the denial\n{ctx}"
    );
    if case.fails_when_denied {
        assert_ne!(r.exit_code, Some(0), "{ctx}");
        assert!(r.sandbox_denied, "{ctx}");
        let marker = format!("{}\n", denial_marker(mode));
        assert!(
            r.stderr.starts_with(&marker),
            "stderr must start with the marker\n{ctx}"
        );
        assert!(
            r.stderr.len() > marker.len(),
            "the raw output follows the marker\n{ctx}"
        );
    }
}

#[test]
fn write_matrix_per_mode() {
    let scratch = Scratch::new();
    let root = Layout::new();
    let started = start_sandboxed(&scratch, Ro, &root.ws);
    let shell: ShellClient = started.service("shell");
    for mode in [Ww, Ro, Full] {
        for case in CASES {
            check(&shell, case, mode);
        }
    }
}

#[test]
fn default_policy_comes_from_sandbox_policy_and_the_bash_family_is_registered() {
    let scratch = Scratch::new();
    let layout = Layout::new();
    let started = start_sandboxed(&scratch, Ww, &layout.ws);
    let shell: ShellClient = started.service("shell");
    let policy: SandboxPolicyClient = started.service("sandboxPolicy");
    assert_eq!(shell.sandbox_mode(()).expect("sandbox_mode"), Some(Ww));
    assert!(
        policy
            .enforced_families(())
            .expect("families")
            .contains(&EnforcedFamily::Bash),
        "dsh-bash-sandbox must register the bash family"
    );
    let r = exec(
        &shell,
        request(
            &layout.expand("echo ok > {ws}/in.txt; echo evil > {out}/victim.txt"),
            &layout.ws,
            None,
        ),
    );
    assert_eq!(r.mode, Some(Ww), "{r:#?}");
    assert!(r.sandbox_denied, "{r:#?}");
    assert_eq!(
        std::fs::read_to_string(layout.ws.join("in.txt"))
            .ok()
            .as_deref(),
        Some("ok\n")
    );
    assert_eq!(
        std::fs::read_to_string(layout.out.join("victim.txt"))
            .ok()
            .as_deref(),
        Some("original\n")
    );
}

#[test]
fn the_granted_roots_are_exactly_the_shared_writable_roots() {
    let scratch = Scratch::new();
    let layout = Layout::new();
    let started = start_sandboxed(&scratch, Ww, &layout.ws);
    let shell: ShellClient = started.service("shell");
    let policy = layout.policy(Ww);
    let roots = writable_roots(&policy).expect("the workspace is a root");
    assert!(roots.contains(&layout.ws), "{roots:?}");
    // Every shared root is writable through the shell ...
    for root in &roots {
        let probe = root.join(format!("{}-parity", layout.tag));
        let r = exec(
            &shell,
            request(
                &format!("echo p > '{}'", probe.display()),
                &layout.ws,
                Some(policy.clone()),
            ),
        );
        assert_eq!(
            r.exit_code,
            Some(0),
            "root {} must be writable: {r:#?}",
            root.display()
        );
        std::fs::remove_file(&probe).expect("probe written");
    }
    // ... and the closest places that are not a shared root are not: the workspace's
    // parent and sibling, and the parents of the temp roots.
    let mut not_roots = vec![layout.base.clone(), layout.out.clone()];
    not_roots.extend(
        roots
            .iter()
            .filter_map(|r| r.parent().map(Path::to_path_buf)),
    );
    for dir in not_roots
        .iter()
        .filter(|d| !roots.iter().any(|r| d.starts_with(r)))
    {
        let probe = dir.join(format!("{}-parity", layout.tag));
        let r = exec(
            &shell,
            request(
                &format!("echo p > '{}'", probe.display()),
                &layout.ws,
                Some(policy.clone()),
            ),
        );
        assert!(
            r.exit_code != Some(0) && !probe.exists(),
            "{} must not be writable: {r:#?}",
            dir.display()
        );
    }
}

#[test]
fn the_local_backend_is_unconfined_and_ignores_the_policy() {
    let scratch = Scratch::new();
    let layout = Layout::new();
    let started = start_local(&scratch);
    let shell: ShellClient = started.service("shell");
    assert_eq!(shell.sandbox_mode(()).expect("sandbox_mode"), None);
    let r = exec(
        &shell,
        request(
            &layout.expand("echo local > {out}/victim.txt"),
            &layout.ws,
            Some(layout.policy(Ro)),
        ),
    );
    assert_eq!(
        (r.exit_code, r.mode, r.sandbox_denied),
        (Some(0), None, false),
        "{r:#?}"
    );
    assert_eq!(
        std::fs::read_to_string(layout.out.join("victim.txt"))
            .ok()
            .as_deref(),
        Some("local\n")
    );
}

#[test]
fn concurrent_policies_each_write_only_their_own_root() {
    let scratch = Scratch::new();
    let (a, b) = (Layout::new(), Layout::new());
    let started = start_sandboxed(&scratch, Ro, &a.ws);
    let shell: ShellClient = started.service("shell");
    let script = |mine: &Layout, theirs: &Layout| {
        format!(
            "for i in $(seq 1 20); do echo mine > {}/f$i; echo theirs > {}/g$i 2>/dev/null; done; true",
            mine.ws.display(),
            theirs.ws.display()
        )
    };
    std::thread::scope(|s| {
        let runs = [(&a, &b), (&b, &a), (&a, &b), (&b, &a)].map(|(mine, theirs)| {
            let shell = shell.clone();
            let command = script(mine, theirs);
            let policy = mine.policy(Ww);
            let cwd = mine.ws.clone();
            s.spawn(move || exec(&shell, request(&command, &cwd, Some(policy))))
        });
        for run in runs {
            let r = run.join().expect("runner thread");
            assert_eq!(r.exit_code, Some(0), "{r:#?}");
        }
    });
    for layout in [&a, &b] {
        for i in 1..=20 {
            assert_eq!(
                std::fs::read_to_string(layout.ws.join(format!("f{i}")))
                    .ok()
                    .as_deref(),
                Some("mine\n")
            );
            assert!(
                !layout.ws.join(format!("g{i}")).exists(),
                "the other policy wrote into {}",
                layout.ws.display()
            );
        }
    }
}

#[test]
fn output_cap_holds_on_100_mb() {
    let scratch = Scratch::new();
    let layout = Layout::new();
    let started = start_sandboxed(&scratch, Ww, &layout.ws);
    let shell: ShellClient = started.service("shell");
    let t = Instant::now();
    let r = exec(
        &shell,
        request(
            "head -c 100000000 /dev/zero | tr '\\0' a; echo tail >&2",
            &layout.ws,
            Some(layout.policy(Ww)),
        ),
    );
    let elapsed = t.elapsed();
    let cap = dsh_shell_api::DEFAULT_OUTPUT_LIMIT as usize;
    assert!(elapsed < Duration::from_secs(60), "took {elapsed:?}");
    assert!(
        r.truncated && r.exit_code == Some(0) && !r.timed_out,
        "{:?}",
        (r.truncated, r.exit_code, r.timed_out)
    );
    assert!(
        r.stdout.len() > cap && r.stdout.len() < cap + 200,
        "stdout is {} bytes",
        r.stdout.len()
    );
    assert!(r.stdout[..cap].bytes().all(|b| b == b'a'));
    assert!(
        r.stdout[cap..].contains(&format!("{cap}-byte cap")),
        "{}",
        &r.stdout[cap..]
    );
    assert_eq!(r.stderr, "tail\n");
}

#[test]
fn no_host_descriptor_leaks_into_commands() {
    let scratch = Scratch::new();
    let layout = Layout::new();
    let started = start_sandboxed(&scratch, Ww, &layout.ws);
    let shell: ShellClient = started.service("shell");
    // The host holds descriptors a command must not see: one the usual way
    // (close-on-exec) and one deliberately opened WITHOUT close-on-exec, as C
    // code in a plugin or an inherited descriptor would be.
    let cloexec = std::fs::File::open(&layout.ws).expect("open the workspace");
    // SAFETY: a plain system call on a path literal; closed below.
    let inheritable = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY) };
    assert!(inheritable > 2, "open /dev/null: {inheritable}");
    // SAFETY: querying the flags of the descriptor opened above.
    let flags = unsafe { libc::fcntl(inheritable, libc::F_GETFD) };
    assert_eq!(flags & libc::FD_CLOEXEC, 0, "the probe must be inheritable");
    let outcomes: Vec<_> = [Some(layout.policy(Ww)), Some(layout.policy(Full))]
        .into_iter()
        .map(|policy| exec(&shell, request("ls /proc/self/fd", &layout.ws, policy)))
        .collect();
    // SAFETY: closing the descriptor opened above.
    unsafe { libc::close(inheritable) };
    drop(cloexec);
    for r in outcomes {
        let fds: Vec<&str> = r.stdout.lines().collect();
        // 0, 1, 2 and the directory `ls` opens to list.
        assert_eq!(fds, ["0", "1", "2", "3"], "{r:#?}");
    }
}

#[test]
fn host_threads_are_not_confined_after_a_sandboxed_command() {
    let scratch = Scratch::new();
    let layout = Layout::new();
    let started = start_sandboxed(&scratch, Ro, &layout.ws);
    let shell: ShellClient = started.service("shell");
    let session = started
        .host
        .sessions()
        .create(&layout.ws)
        .expect("create session");
    // The command runs read-only and is denied ...
    let r = exec(
        &shell,
        request(
            &layout.expand("echo x > {ws}/denied.txt"),
            &layout.ws,
            Some(layout.policy(Ro)),
        ),
    );
    assert!(r.sandbox_denied, "{r:#?}");
    assert!(!layout.ws.join("denied.txt").exists());
    // ... while this thread, a fresh thread, and the host's session store still write
    // outside any root.
    std::fs::write(layout.out.join("host.txt"), "host\n").expect("test thread confined");
    let out = layout.out.clone();
    std::thread::spawn(move || std::fs::write(out.join("thread.txt"), "t\n"))
        .join()
        .expect("thread")
        .expect("fresh thread confined");
    started
        .host
        .sessions()
        .append(
            &session.id,
            "test/after-sandbox",
            serde_json::json!({"ok": true}),
        )
        .expect("the session store cannot append after a sandboxed command");
    let events = started
        .host
        .sessions()
        .events(&session.id, Some("test/after-sandbox"))
        .expect("events");
    assert_eq!(events.len(), 1);
}

#[test]
fn sessions_with_different_roots_resolve_to_their_own_root() {
    let scratch = Scratch::new();
    let (a, b) = (Layout::new(), Layout::new());
    let started = start_sandboxed(&scratch, Ww, &a.ws);
    let shell: ShellClient = started.service("shell");
    let policy: SandboxPolicyClient = started.service("sandboxPolicy");
    let sa = started.host.sessions().create(&a.ws).expect("session a");
    let sb = started.host.sessions().create(&b.ws).expect("session b");
    let resolve = |id: &str| {
        policy
            .resolve(ResolveArgs {
                session: Some(id.to_string()),
                mode: None,
            })
            .expect("resolve")
    };
    let (pa, pb) = (resolve(&sa.id), resolve(&sb.id));
    assert_eq!(
        (pa.workspace_root.as_path(), pb.workspace_root.as_path()),
        (a.ws.as_path(), b.ws.as_path())
    );
    std::thread::scope(|s| {
        let ra = s.spawn(|| {
            exec(
                &shell,
                request(
                    &format!(
                        "echo a > {}/x; echo a > {}/x",
                        a.ws.display(),
                        b.ws.display()
                    ),
                    &a.ws,
                    Some(pa.clone().into_inner()),
                ),
            )
        });
        let rb = s.spawn(|| {
            exec(
                &shell,
                request(
                    &format!(
                        "echo b > {}/y; echo b > {}/y",
                        b.ws.display(),
                        a.ws.display()
                    ),
                    &b.ws,
                    Some(pb.clone().into_inner()),
                ),
            )
        });
        for r in [ra.join().expect("a"), rb.join().expect("b")] {
            assert!(r.sandbox_denied, "{r:#?}");
        }
    });
    assert_eq!(
        std::fs::read_to_string(a.ws.join("x")).ok().as_deref(),
        Some("a\n")
    );
    assert_eq!(
        std::fs::read_to_string(b.ws.join("y")).ok().as_deref(),
        Some("b\n")
    );
    assert!(!b.ws.join("x").exists() && !a.ws.join("y").exists());
}

#[test]
fn confined_commands_run_with_no_new_privs() {
    let scratch = Scratch::new();
    let layout = Layout::new();
    let started = start_sandboxed(&scratch, Ww, &layout.ws);
    let shell: ShellClient = started.service("shell");
    let nnp = |mode| {
        let r = exec(
            &shell,
            request(
                "grep NoNewPrivs /proc/self/status",
                &layout.ws,
                Some(layout.policy(mode)),
            ),
        );
        r.stdout.split_whitespace().last().map(str::to_string)
    };
    // Confined modes set it (a setuid program cannot shed the confinement) ...
    assert_eq!(nnp(Ww).as_deref(), Some("1"));
    assert_eq!(nnp(Ro).as_deref(), Some("1"));
    // ... and the test process itself never got it.
    let own = std::fs::read_to_string("/proc/self/status").expect("own status");
    assert!(
        own.lines()
            .any(|l| l.starts_with("NoNewPrivs:") && l.ends_with('0')),
        "{own}"
    );
}

#[test]
fn a_kernel_without_landlock_runs_no_command_and_says_why() {
    // The kernel answers `landlock_create_ruleset` with ENOSYS, as without Landlock.
    cordis_e2e::assert_refused_setup_runs_nothing(
        &Layout::new().ws,
        libc::SYS_landlock_create_ruleset,
        libc::ENOSYS,
        &[
            "SHELL_SANDBOX_UNAVAILABLE",
            "the kernel cannot enforce the Landlock ruleset",
            "compose `dsh-bash-local`",
        ],
    );
}

/// The process that supervises a command is forked from the host and never execs: the
/// host's signal handlers (`cordis run`'s runtime watches SIGTERM and SIGINT) must not run
/// in it. A SIGTERM sent to the supervisor (the command's parent, under `dsh-bash-local`)
/// ends that call like any other kill, and the server goes on serving.
#[test]
fn the_hosts_signal_handlers_do_not_run_in_a_commands_supervisor() {
    let s = Scratch::new();
    s.manifest(
        "- name: dsh-sandbox-policy\n  config: {mode: danger-full-access}\n- name: dsh-bash-local\n- name: dsh-tool-bash\n",
    );
    let mut mcp = cordis_e2e::McpStdio::start(s.cordis(&["run", "--no-watch"]));
    let (_, text) = mcp.call(
        "bash",
        serde_json::json!({"command": "kill -TERM $PPID; sleep 2; echo after"}),
    );
    assert!(
        text.contains("killed by signal 15") && !text.contains("after"),
        "the supervisor takes SIGTERM's default action: {text}"
    );
    let (is_error, text) = mcp.call("bash", serde_json::json!({"command": "echo still serving"}));
    assert!(!is_error && text.contains("still serving"), "{text}");
    assert!(mcp.finish().success());
}
