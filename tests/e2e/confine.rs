//! The confined shell against a hostile command: each test is one escape class from the
//! confinement issue, run through the real `dsh-bash-sandbox` (and `dsh-bash-local` where
//! it applies) loaded as cdylibs through the real host, under the real kernel, in
//! `workspace-write` and `read-only`. Each asserts the attack's effect is absent, and a
//! control shows the same action works where it is allowed, so none can pass because the
//! command simply failed to run.

use std::io::Read;
use std::net::{TcpListener, UdpSocket};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cordis_e2e::{
    eventually, shell_exec as exec, shell_request as request, unique, Outside, Scratch, Started,
};
use dsh_sandbox::{SandboxExecutionPolicy, SandboxMode};
use dsh_shell_api::{ExecResult, ShellClient};

use SandboxMode::{ReadOnly as Ro, WorkspaceWrite as Ww};

/// A workspace and an outside directory (outside every writable root) with `victim.txt`.
struct Layout {
    ws: PathBuf,
    outside: Outside,
}

impl Layout {
    fn new() -> Self {
        let outside = Outside::new("confine");
        let ws = outside.dir.join("ws");
        std::fs::create_dir_all(&ws).expect("create the workspace");
        let ws = ws.canonicalize().expect("canonical workspace");
        std::fs::write(outside.dir.join("victim.txt"), "original\n").expect("seed victim");
        std::fs::write(ws.join("inner.txt"), "inside\n").expect("seed inner");
        Layout { ws, outside }
    }

    fn victim(&self) -> PathBuf {
        self.outside.dir.join("victim.txt")
    }

    fn policy(&self, mode: SandboxMode, network: bool) -> SandboxExecutionPolicy {
        SandboxExecutionPolicy {
            mode,
            workspace_root: self.ws.clone(),
            network,
            ..Default::default()
        }
    }

    /// `dsh-sandbox-policy` + `dsh-bash-sandbox`, started in `scratch`.
    fn sandboxed(&self, scratch: &Scratch) -> Started {
        scratch.manifest(&format!(
            "- name: dsh-sandbox-policy\n  config:\n    mode: workspace-write\n    workspaceRoot: '{}'\n- name: dsh-bash-sandbox\n",
            self.ws.display()
        ));
        scratch.start()
    }

    /// [`Layout::sandboxed`] in a scratch of its own, with its shell.
    fn confined(&self) -> Confined {
        let scratch = Scratch::new();
        let started = self.sandboxed(&scratch);
        Confined {
            shell: shell_of(&started),
            _started: started,
            _scratch: scratch,
        }
    }
}

/// A running confined composition and its shell, dropped in field order: the client
/// before the composition, the composition before its files.
struct Confined {
    shell: ShellClient,
    _started: Started,
    _scratch: Scratch,
}

fn run_in(shell: &ShellClient, layout: &Layout, mode: SandboxMode, command: &str) -> ExecResult {
    exec(
        shell,
        request(command, &layout.ws, Some(layout.policy(mode, false))),
    )
}

fn shell_of(started: &Started) -> ShellClient {
    started.service("shell")
}

/// The metadata that setattr, utime and xattr calls would change.
fn attributes(path: &Path) -> (u32, i64, Option<Vec<u8>>) {
    let meta = std::fs::metadata(path).expect("stat");
    (
        meta.permissions().mode(),
        meta.mtime(),
        xattr(path, "user.cordis"),
    )
}

fn xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    let path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("no NUL");
    let name = std::ffi::CString::new(name).expect("no NUL");
    let mut buf = [0u8; 256];
    // SAFETY: valid C strings and a buffer of the size passed.
    let n = unsafe {
        libc::getxattr(
            path.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    (n >= 0).then(|| buf[..n as usize].to_vec())
}

/// `chmod`, `touch -d` and `setxattr` (through Python's `os.setxattr`, no extra tools).
fn setattr_script(path: &Path) -> String {
    let p = path.display();
    format!(
        "python3 -c \"import os; os.setxattr('{p}', 'user.cordis', b'x')\"; touch -d 2001-02-03 '{p}'; chmod 0 '{p}'; exit 0"
    )
}

#[test]
fn setattr_utime_and_xattr_outside_the_roots_are_refused() {
    let layout = Layout::new();
    let confined = layout.confined();
    let shell = &confined.shell;
    for mode in [Ww, Ro] {
        let victim = layout.victim();
        let before = attributes(&victim);
        let r = run_in(shell, &layout, mode, &setattr_script(&victim));
        assert_eq!(attributes(&victim), before, "{mode}: {r:#?}");
        assert!(
            r.stderr.contains("Read-only file system"),
            "{mode}: the refusal is shown: {r:#?}"
        );
    }
    // The control: the same script on a file inside the workspace goes through.
    let inner = layout.ws.join("inner.txt");
    let r = run_in(shell, &layout, Ww, &setattr_script(&inner));
    let (mode, mtime, attr) = attributes(&inner);
    assert_eq!(
        (mode & 0o777, attr.as_deref()),
        (0, Some(&b"x"[..])),
        "{r:#?}"
    );
    assert!(mtime < 1_000_000_000, "touch -d changed mtime: {mtime}");
}

#[test]
fn device_nodes_cannot_be_made_even_in_the_workspace() {
    let layout = Layout::new();
    let confined = layout.confined();
    let shell = &confined.shell;
    let r = run_in(
        shell,
        &layout,
        Ww,
        "mknod blk b 7 0; mknod chr c 1 3; mkfifo fifo; ls",
    );
    assert!(!layout.ws.join("blk").exists(), "{r:#?}");
    assert!(!layout.ws.join("chr").exists(), "{r:#?}");
    // The control: a FIFO (no device) is an ordinary write in the workspace.
    assert!(layout.ws.join("fifo").exists(), "{r:#?}");
    assert!(r.stderr.contains("mknod"), "{r:#?}");
}

/// Whether `pid` is running (not gone, not a zombie).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| !stat.contains(") Z "))
        .unwrap_or(false)
}

#[test]
fn signals_reach_no_process_outside_the_sandbox() {
    let layout = Layout::new();
    let confined = layout.confined();
    let shell = &confined.shell;
    let mut bystander = cordis_e2e::KillOnDrop(
        std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .expect("spawn a bystander"),
    );
    let victim = bystander.0.id();
    let server = std::process::id();
    for mode in [Ww, Ro] {
        let r = run_in(
            shell,
            &layout,
            mode,
            &format!("kill -9 {victim}; kill -9 {server}; kill -TERM -1; echo done"),
        );
        assert!(alive(victim), "{mode}: the bystander was killed: {r:#?}");
        assert!(r.stdout.contains("done"), "{mode}: {r:#?}");
    }
    assert!(
        bystander.0.try_wait().expect("try_wait").is_none(),
        "bystander ended"
    );
    // The control: inside the sandbox, a command signals its own children.
    let r = run_in(
        shell,
        &layout,
        Ww,
        "sleep 600 & kill -9 $!; wait $!; echo status=$?",
    );
    assert!(r.stdout.contains("status=137"), "{r:#?}");
}

/// A TCP and a UDP listener on the host's loopback and a unix socket outside the roots.
struct Listeners {
    tcp: TcpListener,
    udp: UdpSocket,
    unix: UnixListener,
    unix_path: PathBuf,
}

impl Listeners {
    fn new(dir: &Path) -> Self {
        let tcp = TcpListener::bind("127.0.0.1:0").expect("bind tcp");
        tcp.set_nonblocking(true).expect("nonblocking");
        let udp = UdpSocket::bind("127.0.0.1:0").expect("bind udp");
        udp.set_nonblocking(true).expect("nonblocking");
        let unix_path = dir.join(format!("s-{}.sock", unique()));
        let unix = UnixListener::bind(&unix_path).expect("bind unix");
        unix.set_nonblocking(true).expect("nonblocking");
        Listeners {
            tcp,
            udp,
            unix,
            unix_path,
        }
    }

    fn script(&self) -> String {
        let tcp = self.tcp.local_addr().expect("addr").port();
        let udp = self.udp.local_addr().expect("addr").port();
        format!(
            "exec 3<>/dev/tcp/127.0.0.1/{tcp} && echo tcp-connected; \
             echo datagram > /dev/udp/127.0.0.1/{udp}; \
             python3 -c \"import socket; s=socket.socket(socket.AF_UNIX); s.connect('{}'); print('unix-connected')\"; \
             exit 0",
            self.unix_path.display()
        )
    }

    /// What reached the listeners (everything a command sent has arrived by the time it
    /// returns: loopback delivery happens inside the sending call).
    fn reached(&self) -> Vec<&'static str> {
        let mut got = Vec::new();
        if self.tcp.accept().is_ok() {
            got.push("tcp");
        }
        let mut buf = [0u8; 64];
        if self.udp.recv(&mut buf).is_ok() {
            got.push("udp");
        }
        if self.unix.accept().is_ok() {
            got.push("unix");
        }
        got
    }
}

#[test]
fn network_is_off_in_the_confined_modes() {
    let layout = Layout::new();
    let confined = layout.confined();
    let shell = &confined.shell;
    let listeners = Listeners::new(&layout.outside.dir);
    for mode in [Ww, Ro] {
        let r = run_in(shell, &layout, mode, &listeners.script());
        assert_eq!(listeners.reached(), Vec::<&str>::new(), "{mode}: {r:#?}");
        assert!(!r.stdout.contains("connected"), "{mode}: {r:#?}");
        assert!(
            r.stderr.contains("Connection refused"),
            "{mode}: the namespace's own loopback answers: {r:#?}"
        );
        assert!(
            r.stderr.contains("PermissionError"),
            "{mode}: unix sockets are refused: {r:#?}"
        );
    }
}

#[test]
fn network_true_lets_a_confined_command_connect() {
    let layout = Layout::new();
    let confined = layout.confined();
    let shell = &confined.shell;
    let listeners = Listeners::new(&layout.outside.dir);
    let r = exec(
        shell,
        request(
            &listeners.script(),
            &layout.ws,
            Some(layout.policy(Ww, true)),
        ),
    );
    assert_eq!(
        listeners.reached(),
        ["tcp", "udp"],
        "with network on, TCP and UDP connect, a host daemon's socket file does not: {r:#?}"
    );
    assert!(r.stderr.contains("PermissionError"), "{r:#?}");
    let open_unix = SandboxExecutionPolicy {
        allow_unix_sockets: true,
        ..layout.policy(Ww, true)
    };
    let r = exec(
        shell,
        request(&listeners.script(), &layout.ws, Some(open_unix)),
    );
    assert_eq!(listeners.reached(), ["tcp", "udp", "unix"], "{r:#?}");
    // `allowUnixSockets` without the network opens nothing.
    let closed = SandboxExecutionPolicy {
        allow_unix_sockets: true,
        ..layout.policy(Ww, false)
    };
    let r = exec(
        shell,
        request(&listeners.script(), &layout.ws, Some(closed)),
    );
    assert_eq!(listeners.reached(), Vec::<&str>::new(), "{r:#?}");
    // The same switches in the policy's config, for calls that carry no policy of their own.
    let configured = Scratch::new();
    configured.manifest(&format!(
        "- name: dsh-sandbox-policy\n  config:\n    mode: workspace-write\n    workspaceRoot: '{}'\n    network: true\n    allowUnixSockets: true\n- name: dsh-bash-sandbox\n",
        layout.ws.display()
    ));
    let configured_started = configured.start();
    let r = exec(
        &shell_of(&configured_started),
        request(&listeners.script(), &layout.ws, None),
    );
    assert_eq!(listeners.reached(), ["tcp", "udp", "unix"], "{r:#?}");
    // Still confined: writes outside the roots are refused.
    let r = exec(
        shell,
        request(
            &format!("echo evil > '{}'", layout.victim().display()),
            &layout.ws,
            Some(layout.policy(Ww, true)),
        ),
    );
    assert!(r.sandbox_denied, "{r:#?}");
}

/// Runs `cordis call bash` with secrets in its environment; returns the command's output.
fn env_seen_by(scratch: &Scratch, layout: &Layout, manifest: &str) -> String {
    let path = scratch.manifest(manifest);
    let args = r#"{"command": "env | sort"}"#;
    let out = scratch
        .cordis(&["call", "-c", path.to_str().expect("UTF-8"), "bash", args])
        .current_dir(&layout.ws)
        .env("OPENAI_API_KEY", "sk-cordis-test")
        .env("GITHUB_TOKEN", "ghp-cordis-test")
        .env("AWS_SECRET_ACCESS_KEY", "aws-cordis-test")
        .env("Db_Password", "pw-cordis-test")
        .env("MY_CREDENTIALS", "cred-cordis-test")
        .env("GITHUB_PAT", "pat-cordis-test")
        .env("DATABASE_URL", "postgres://app:url-cordis-test@db/app")
        .env("SSH_AUTH_SOCK", "/run/agent-cordis-test")
        .env("CORDIS_PLAIN", "plain-value")
        .output()
        .expect("run cordis call");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn commands_get_a_scrubbed_environment_in_both_families() {
    let scratch = Scratch::new();
    let layout = Layout::new();
    let policy = format!(
        "- name: dsh-sandbox-policy\n  config:\n    mode: workspace-write\n    workspaceRoot: '{}'\n",
        layout.ws.display()
    );
    for shell in ["dsh-bash-sandbox", "dsh-bash-local"] {
        let seen = env_seen_by(
            &scratch,
            &layout,
            &format!("{policy}- name: {shell}\n- name: dsh-tool-bash\n"),
        );
        for secret in [
            "sk-", "ghp-", "aws-", "pw-", "cred-", "pat-", "url-", "agent-",
        ] {
            assert!(
                !seen.contains(&format!("{secret}cordis-test")),
                "{shell}: a secret reached the command:\n{seen}"
            );
        }
        assert!(
            seen.contains("CORDIS_PLAIN=plain-value"),
            "{shell}:\n{seen}"
        );
        assert!(seen.contains("PATH="), "{shell}:\n{seen}");

        let seen = env_seen_by(
            &scratch,
            &layout,
            &format!(
                "{policy}- name: {shell}\n  config:\n    environment:\n      includeOnly: [PATH, 'cordis_pl*']\n      set: {{EXTRA: added}}\n- name: dsh-tool-bash\n"
            ),
        );
        let names: Vec<&str> = seen
            .lines()
            .filter_map(|l| l.split_once('=').map(|(k, _)| k))
            .filter(|k| !["PWD", "SHLVL", "_"].contains(k))
            .collect();
        assert_eq!(names, ["CORDIS_PLAIN", "EXTRA", "PATH"], "{shell}:\n{seen}");

        let seen = env_seen_by(
            &scratch,
            &layout,
            &format!(
                "{policy}- name: {shell}\n  config:\n    environment: {{ignoreDefaultExcludes: true, exclude: ['aws_*']}}\n- name: dsh-tool-bash\n"
            ),
        );
        assert!(
            seen.contains("OPENAI_API_KEY=sk-cordis-test"),
            "{shell}:\n{seen}"
        );
        assert!(!seen.contains("aws-cordis-test"), "{shell}:\n{seen}");
    }
}

/// Processes whose command line contains `token`: (pid, command line).
fn processes_with(token: &str) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("read /proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(mut file) = std::fs::File::open(entry.path().join("cmdline")) else {
            continue;
        };
        let mut raw = Vec::new();
        if file.read_to_end(&mut raw).is_err() {
            continue;
        }
        let line = String::from_utf8_lossy(&raw).replace('\0', " ");
        if line.contains(token) && alive(pid) {
            found.push((pid, line));
        }
    }
    found
}

/// A `sleep` argument unique to this call: `1357.<digits>` (sleep takes fractions).
fn sleep_token() -> String {
    format!("1357.{}", unique().replace('-', "0"))
}

/// Background children of every kind: `setsid`, double-forked, plain `&`, and `nohup`.
fn leaving_children(token: &str) -> String {
    format!(
        "setsid sleep {token} & (sleep {token} &) ; sleep {token} & nohup sleep {token} >/dev/null 2>&1 & echo started"
    )
}

fn assert_none_left(token: &str, what: &str) {
    let left = processes_with(token);
    assert!(left.is_empty(), "{what}: these outlived the call: {left:?}");
}

#[test]
fn nothing_a_command_starts_outlives_its_call() {
    let layout = Layout::new();
    for backend in ["dsh-bash-sandbox", "dsh-bash-local"] {
        let scratch = Scratch::new();
        let started = if backend == "dsh-bash-sandbox" {
            layout.sandboxed(&scratch)
        } else {
            scratch.manifest("- name: dsh-bash-local\n");
            scratch.start()
        };
        let shell = shell_of(&started);
        let policy = Some(layout.policy(Ww, false));

        // A normal return.
        let token = sleep_token();
        let t = Instant::now();
        let r = exec(
            &shell,
            request(&leaving_children(&token), &layout.ws, policy.clone()),
        );
        assert_eq!(
            (r.exit_code, r.stdout.trim()),
            (Some(0), "started"),
            "{r:#?}"
        );
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        assert_none_left(&token, &format!("{backend}, normal return"));

        // A timeout.
        let token = sleep_token();
        let mut req = request(
            &format!("{}; sleep {token}", leaving_children(&token)),
            &layout.ws,
            policy.clone(),
        );
        req.timeout_ms = Some(500);
        let r = exec(&shell, req);
        assert!(r.timed_out && r.signal == Some(9), "{r:#?}");
        assert_none_left(&token, &format!("{backend}, timeout"));
    }
}

#[test]
fn a_cancelled_command_is_killed_within_a_second() {
    let layout = Layout::new();
    let confined = layout.confined();
    let shell = confined.shell.clone();
    let mut fds = [-1; 2];
    // SAFETY: a valid array for the kernel to fill.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    let (cancel_rd, cancel_wr) = (fds[0], fds[1]);
    let token = sleep_token();
    let mut req = request(
        &format!("{}; sleep {token}", leaving_children(&token)),
        &layout.ws,
        Some(layout.policy(Ww, false)),
    );
    req.cancel_fd = Some(cancel_rd);
    let running = std::thread::spawn(move || exec(&shell, req));
    eventually("the command started", Duration::from_secs(20), || {
        let n = processes_with(&token).len();
        if n >= 5 {
            Ok(())
        } else {
            Err(format!("{n} sleeps"))
        }
    });
    let cancelled = Instant::now();
    // SAFETY: closing the write end this test owns: the call is cancelled.
    unsafe { libc::close(cancel_wr) };
    let r = running.join().expect("the call thread");
    let took = cancelled.elapsed();
    assert!(took < Duration::from_secs(1), "cancellation took {took:?}");
    assert!(r.cancelled && !r.timed_out, "{r:#?}");
    assert_none_left(&token, "cancelled");
    // SAFETY: the read end is this test's.
    unsafe { libc::close(cancel_rd) };
}

#[test]
fn without_user_namespaces_nothing_runs_and_the_error_says_how_to_fix_it() {
    // The kernel answers `unshare` with EPERM, as with user namespaces disabled.
    cordis_e2e::assert_refused_setup_runs_nothing(
        &Layout::new().ws,
        libc::SYS_unshare,
        libc::EPERM,
        &[
            "SHELL_SANDBOX_UNAVAILABLE",
            "creating the user, mount, pid, ipc and network namespaces failed",
            "Operation not permitted",
            "unprivileged user namespaces",
        ],
    );
}

/// The calls of README's table, made for real from inside (through Python's `ctypes`, with
/// arguments that succeed or fail otherwise without the filter): each answers `EPERM`,
/// network on or off; a nested user namespace cannot be made; threads still start (libc
/// falls back from `clone3`, which answers `ENOSYS`, to `clone`); `/proc/sys` is mounted
/// read-only; `chattr` cannot set a file's attributes.
#[test]
fn the_dangerous_calls_are_refused_by_name() {
    let layout = Layout::new();
    let confined = layout.confined();
    let calls = [
        ("keyctl", libc::SYS_keyctl, "0, -3, 0"),
        ("add_key", libc::SYS_add_key, "b'user', b'k', b'v', 1, -3"),
        (
            "request_key",
            libc::SYS_request_key,
            "b'user', b'k', None, -3",
        ),
        ("userfaultfd", libc::SYS_userfaultfd, "1"),
        (
            "perf_event_open",
            libc::SYS_perf_event_open,
            "None, 0, -1, -1, 0",
        ),
        ("bpf", libc::SYS_bpf, "0, None, 0"),
        ("unshare", libc::SYS_unshare, "0x10000000"),
        ("socket_vsock", libc::SYS_socket, "40, 1, 0"),
        ("socket_packet", libc::SYS_socket, "17, 3, 0"),
        ("socket_raw", libc::SYS_socket, "2, 3, 1"),
        ("openat2", libc::SYS_openat2, "-100, b'.', None, 0"),
    ];
    let mut script = String::from(
        "import ctypes, os, threading\n\
         libc = ctypes.CDLL(None, use_errno=True)\n\
         def call(name, nr, *args):\n    \
             ctypes.set_errno(0)\n    \
             r = libc.syscall(nr, *args)\n    \
             print(name, 'returned' if r >= 0 else 'errno', ctypes.get_errno() if r < 0 else r)\n",
    );
    for (name, nr, args) in calls {
        script.push_str(&format!("call('{name}', {nr}, {args})\n"));
    }
    script.push_str(
        "t = threading.Thread(target=lambda: print('thread ran'))\nt.start(); t.join()\n",
    );
    std::fs::write(layout.ws.join("calls.py"), script).expect("write the script");
    for network in [false, true] {
        let r = exec(
            &confined.shell,
            request(
                "python3 calls.py; unshare -U true || echo no-nested-userns; \
                 touch attr; chattr +A attr || echo no-chattr; \
                 awk '$5 == \"/proc/sys\" && $6 ~ /^ro/ {print \"proc-sys-ro\"}' /proc/self/mountinfo",
                &layout.ws,
                Some(layout.policy(Ww, network)),
            ),
        );
        for (name, ..) in calls {
            assert!(
                r.stdout
                    .contains(&format!("{name} errno {}\n", libc::EPERM)),
                "network {network}: {name} is refused with EPERM: {r:#?}"
            );
        }
        assert!(r.stdout.contains("thread ran"), "network {network}: {r:#?}");
        assert!(
            r.stdout.contains("proc-sys-ro"),
            "network {network}: {r:#?}"
        );
        assert!(
            r.stdout.contains("no-nested-userns"),
            "network {network}: {r:#?}"
        );
        assert!(r.stdout.contains("no-chattr"), "network {network}: {r:#?}");
    }
    // The control: the same script in `danger-full-access` (unconfined, no filter)
    // gets other answers for the calls that work unprivileged.
    let unconfined = exec(
        &confined.shell,
        request(
            "python3 calls.py",
            &layout.ws,
            Some(layout.policy(SandboxMode::DangerFullAccess, false)),
        ),
    );
    for name in ["keyctl", "unshare", "perf_event_open"] {
        assert!(
            !unconfined
                .stdout
                .contains(&format!("{name} errno {}\n", libc::EPERM)),
            "{name} answers something else without the filter: {unconfined:#?}"
        );
    }
}

/// A set-user-ID or set-group-ID file written inside would run with its owner's
/// privileges outside the sandbox (where the sandbox's root is the host's root): no call
/// that sets a mode may set either bit, with network on or off, and the files a command
/// creates carry neither.
#[test]
fn nothing_written_inside_carries_setuid_or_setgid() {
    let layout = Layout::new();
    let confined = layout.confined();
    let shell = &confined.shell;
    let script = "cp /bin/sh suid; chmod 4755 suid; chmod u+s suid; chmod g+s suid; \
                  python3 -c \"import os; os.chmod('suid', 0o6755)\"; \
                  python3 -c \"import os; os.close(os.open('created', os.O_CREAT | os.O_WRONLY, 0o6755))\"; \
                  install -m 4755 /bin/sh installed; mkdir -m 2755 sgid-dir; \
                  cp /bin/sh plain; chmod 0750 plain; exit 0";
    for network in [false, true] {
        for name in ["suid", "created", "installed", "sgid-dir", "plain"] {
            let _ = std::fs::remove_file(layout.ws.join(name));
            let _ = std::fs::remove_dir(layout.ws.join(name));
        }
        let r = exec(
            shell,
            request(script, &layout.ws, Some(layout.policy(Ww, network))),
        );
        for name in ["suid", "created", "installed", "sgid-dir"] {
            let mode = std::fs::metadata(layout.ws.join(name))
                .map(|m| m.mode())
                .unwrap_or(0);
            assert_eq!(
                mode & 0o6000,
                0,
                "network {network}: `{name}` has mode {mode:o}: {r:#?}"
            );
        }
        assert!(
            r.stderr.contains("Operation not permitted"),
            "network {network}: the refusal is shown: {r:#?}"
        );
        // The control: ordinary modes are set as asked.
        let plain = std::fs::metadata(layout.ws.join("plain")).expect("plain copied");
        assert_eq!(plain.mode() & 0o7777, 0o750, "network {network}: {r:#?}");
    }
}

/// Each resource limit holds, bounded by itself (the bombs here never touch the machine's
/// own limits): a fork bomb stops at the process limit, a memory hog is killed at the
/// memory limit, a file stops growing at the file size limit, a busy loop is killed at
/// the CPU limit. Each result names its limit; the host keeps serving, and `/dev/shm`
/// works within its own bound.
#[test]
fn each_resource_limit_stops_its_command_and_says_so() {
    let layout = Layout::new();
    let scratch = Scratch::new();
    scratch.manifest(&format!(
        "- name: dsh-sandbox-policy\n  config:\n    mode: workspace-write\n    workspaceRoot: '{}'\n    limits: {{memoryMib: 64, processes: 32, fileSizeMib: 1, cpuSeconds: 1}}\n- name: dsh-bash-sandbox\n",
        layout.ws.display()
    ));
    let started = scratch.start();
    let shell = shell_of(&started);
    let run = |command: &str, timeout_ms: u64| {
        let mut req = request(command, &layout.ws, None);
        req.timeout_ms = Some(timeout_ms);
        let started = Instant::now();
        let r = exec(&shell, req);
        (r, started.elapsed())
    };
    let (r, _) = run("f() { f | f & }; f; sleep 2", 3_000);
    assert_eq!(
        r.limit_reached.as_deref(),
        Some("process limit (32)"),
        "{r:#?}"
    );
    let (r, _) = run(
        "python3 -c \"b = b'x' * (256 << 20); print(len(b))\"",
        20_000,
    );
    assert_eq!(r.signal, Some(libc::SIGKILL), "{r:#?}");
    assert_eq!(
        r.limit_reached.as_deref(),
        Some("memory limit (64 MiB)"),
        "{r:#?}"
    );
    let (r, _) = run("head -c 2097152 /dev/zero > big", 20_000);
    assert_eq!(
        r.limit_reached.as_deref(),
        Some("file size limit (1 MiB)"),
        "{r:#?}"
    );
    let size = std::fs::metadata(layout.ws.join("big")).expect("big").len();
    assert_eq!(size, 1 << 20, "{r:#?}");
    let (r, took) = run("while :; do :; done", 20_000);
    assert_eq!(
        r.limit_reached.as_deref(),
        Some("CPU time limit (1 s)"),
        "{r:#?}"
    );
    assert!(
        !r.timed_out && took < Duration::from_secs(10),
        "{took:?} {r:#?}"
    );
    // The control: within the limits nothing is named, and POSIX semaphores in /dev/shm
    // work.
    let (r, _) = run(
        "python3 -c \"import multiprocessing as m; s = m.Semaphore(); s.acquire(); print('sem ok')\"",
        20_000,
    );
    assert_eq!(
        (r.exit_code, r.limit_reached.as_deref()),
        (Some(0), None),
        "{r:#?}"
    );
    assert!(r.stdout.contains("sem ok"), "{r:#?}");
    // Each command's cgroups are removed once it is done, busy or not when its call
    // returned (the fork bomb's teardown keeps them busy for a while).
    // The host is this test process (the plugins are loaded in it).
    let own = format!("cordis-{}-", std::process::id());
    eventually(
        "the commands' cgroups to be removed",
        Duration::from_secs(10),
        || {
            let left: Vec<String> = [
                "/sys/fs/cgroup/memory",
                "/sys/fs/cgroup/pids",
                "/sys/fs/cgroup",
            ]
            .iter()
            .flat_map(|root| walk_names(Path::new(root), 4))
            .filter(|name| name.starts_with(&own))
            .collect();
            left.is_empty().then_some(()).ok_or(format!("{left:?}"))
        },
    );
}

/// The names of the directories beneath `root`, `depth` levels down at most.
fn walk_names(root: &Path, depth: usize) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(root) else {
        return out;
    };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            out.push(entry.file_name().to_string_lossy().into_owned());
            if depth > 1 {
                out.extend(walk_names(&entry.path(), depth - 1));
            }
        }
    }
    out
}
