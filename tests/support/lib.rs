//! The one harness for end-to-end tests: makes sure the real plugin libraries and the real
//! `cordis` binary are built, gives each test a scratch directory, runs `cordis` in it and,
//! when an expectation fails, prints the command, cwd, listing, stdout and stderr.
//! It also starts a composition in-process (the same `Host` the binary uses) so tests can
//! call the real services of real cdylibs.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

pub mod bench;

pub use cordis_engine::{Host, Plan, Registry, Runtime};
pub use cordis_sdk::{Interface, Service};

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The cargo output directory the test binary runs from (`target/<profile>`).
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("test binary in deps/");
    deps.parent()
        .expect("deps/ in the profile dir")
        .to_path_buf()
}

/// Builds every plugin library and the `cordis` binary of the workspace (once per test
/// process; a no-op when they are up to date). `cargo test` builds neither on its own.
pub fn build_workspace() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        with_build_lock(|| cargo_build(&[]));
        target_dir()
    })
}

fn cargo_build(env: &[(&str, &str)]) {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(workspace_root())
        .args(["build", "--workspace", "--lib", "--bins"])
        .envs(env.iter().copied());
    if target_dir().file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    let out = cmd.output().expect("failed to run cargo build");
    assert!(
        out.status.success(),
        "building the plugins failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `f` holding an exclusive lock shared by every test process, so builds that change
/// a library in the output directory never interleave with another test's build.
pub fn with_build_lock<T>(f: impl FnOnce() -> T) -> T {
    use std::os::fd::AsRawFd;
    let path = target_dir().join(".cordis-e2e-build.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .expect("open the build lock");
    // SAFETY: flock on a file descriptor this function owns; released when `file` drops.
    let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
    assert_eq!(locked, 0, "flock {}", path.display());
    f()
}

/// The workspace's cargo target directory (the parent of `target/<profile>`).
pub fn cargo_target() -> PathBuf {
    target_dir()
        .parent()
        .expect("the profile directory has a parent")
        .to_path_buf()
}

/// A cargo command for the scaffolded crate in `dir`, sharing the workspace's target
/// directory (so the dependencies already built are reused) and its lock file.
pub fn cargo(dir: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(dir)
        .args(args)
        .env("CARGO_TARGET_DIR", cargo_target());
    cmd
}

/// The workspace's `[profile.*]` sections, for a cargo config next to the scaffold: the
/// same profile means the same artifacts in the shared target directory.
pub fn workspace_profiles() -> String {
    let manifest = std::fs::read_to_string(workspace_root().join("Cargo.toml"))
        .expect("read the workspace manifest");
    let mut out = String::new();
    let mut keep = false;
    for line in manifest.lines() {
        if line.starts_with('[') {
            keep = line.starts_with("[profile");
        }
        if keep {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The fixture plugin `fixture-reload` built by a real `cargo build` with
/// `CORDIS_FIXTURE_GENERATION=generation` baked in (cached per generation).
pub fn fixture_reload_build(generation: u32) -> PathBuf {
    // Keyed by this test binary's build: a change to the SDK or the fixture relinks it, so
    // a build cached before the change is never loaded after it.
    let exe = std::env::current_exe().expect("current_exe");
    let built = std::fs::metadata(&exe)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    let stem = exe.file_stem().and_then(|s| s.to_str()).unwrap_or("test");
    let cache = target_dir()
        .join("fixture-builds")
        .join(format!("{stem}-{built}"));
    let file = cordis_engine::library_file_name("fixture-reload");
    let cached = cache.join(format!("g{generation}-{file}"));
    with_build_lock(|| {
        if !cached.is_file() {
            cargo_build(&[("CORDIS_FIXTURE_GENERATION", &generation.to_string())]);
            std::fs::create_dir_all(&cache).expect("fixture build cache");
            let tmp = cache.join(format!(".{generation}.tmp"));
            std::fs::copy(target_dir().join(&file), &tmp).expect("copy the build");
            std::fs::rename(&tmp, &cached).expect("publish the build");
            // Leave the output directory as every other test expects it.
            cargo_build(&[]);
        }
    });
    cached
}

/// A scratch project whose `plugins/` holds build `generation` of `fixture-reload` (found
/// there first by [`Scratch::runtime`] and by `cordis run --plugin-path plugins`), with
/// `manifest` as its `cordis.yml`. Returns the project and the library file to replace.
pub fn reload_project(generation: u32, manifest: &str) -> (Scratch, PathBuf) {
    let s = Scratch::new();
    std::fs::create_dir_all(s.path().join("plugins")).expect("plugins dir");
    let lib = s
        .path()
        .join("plugins")
        .join(cordis_engine::library_file_name("fixture-reload"));
    replace_file(&fixture_reload_build(generation), &lib);
    s.manifest(manifest);
    (s, lib)
}

/// Replaces `target` with a copy of `source` the way cargo does: write beside, then rename.
pub fn replace_file(source: &Path, target: &Path) {
    let tmp = target.with_extension("replacing");
    std::fs::copy(source, &tmp).expect("copy");
    std::fs::rename(&tmp, target).expect("rename into place");
}

/// The text of the bundled `cordis.yml`.
pub fn bundled_manifest() -> String {
    std::fs::read_to_string(workspace_root().join("cordis.yml"))
        .expect("read the bundled cordis.yml")
}

/// The `cordis` binary.
pub fn cordis_bin() -> PathBuf {
    build_workspace().join("cordis")
}

/// A plugin library by plugin name.
pub fn library(plugin: &str) -> PathBuf {
    build_workspace().join(cordis_engine::library_file_name(plugin))
}

/// A scratch directory for one test; kept (and its path printed) when a check fails.
pub struct Scratch {
    dir: tempfile::TempDir,
    state: tempfile::TempDir,
}

impl Default for Scratch {
    fn default() -> Self {
        Self::new()
    }
}

impl Scratch {
    /// A fresh scratch directory (canonical path) with a state directory of its own
    /// beside it (never inside a session's workspace: the host refuses that).
    pub fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("cordis-e2e-")
            .tempdir()
            .expect("tempdir");
        let state = tempfile::Builder::new()
            .prefix("cordis-e2e-state-")
            .tempdir()
            .expect("state tempdir");
        Scratch { dir, state }
    }

    /// The host's state directory for this scratch (canonical).
    pub fn state_dir(&self) -> PathBuf {
        self.state
            .path()
            .canonicalize()
            .expect("canonical state dir")
    }

    /// The `XDG_DATA_HOME` of the commands run here (beside the state, never inside the
    /// workspace): its `cordis/plugins` is the user plugin directory, empty unless a test
    /// installs a plugin, so plugins installed on the machine never shadow the
    /// workspace's.
    pub fn data_dir(&self) -> PathBuf {
        self.state_dir().join("data")
    }

    /// The directory (canonical).
    pub fn path(&self) -> PathBuf {
        self.dir.path().canonicalize().expect("canonical scratch")
    }

    /// Writes `text` at `rel`, creating parents; returns the path.
    pub fn write(&self, rel: &str, text: &str) -> PathBuf {
        let p = self.path().join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).expect("create parents");
        }
        std::fs::write(&p, text).expect("write");
        p
    }

    /// Writes `cordis.yml`.
    pub fn manifest(&self, yaml: &str) -> PathBuf {
        self.write("cordis.yml", yaml)
    }

    /// A scratch directory whose `cordis.yml` is the bundled one.
    pub fn with_bundled_manifest() -> Self {
        let s = Scratch::new();
        s.manifest(&bundled_manifest());
        s
    }

    /// A `cordis` command run in this directory with its own state dir.
    pub fn cordis(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(cordis_bin());
        cmd.current_dir(self.path())
            .env("CORDIS_STATE_DIR", self.state_dir())
            .env("XDG_DATA_HOME", self.data_dir())
            .env_remove("CORDIS_PLUGIN_PATH")
            .env("RUST_LOG", "warn")
            .args(args)
            .stdin(Stdio::null());
        cmd
    }

    /// Runs `cordis ARGS` to completion.
    pub fn run(&self, args: &[&str]) -> Run {
        self.run_with_log(args, "warn")
    }

    /// Runs `cmd` (made with [`Scratch::cordis`], then adjusted) to completion.
    pub fn run_command(&self, mut cmd: Command, what: &str) -> Run {
        Run {
            what: what.to_string(),
            cwd: self.path(),
            output: cmd.output().expect("failed to run cordis"),
            killed_at: None,
        }
    }

    /// Runs `cordis ARGS` to completion with `RUST_LOG=level`.
    pub fn run_with_log(&self, args: &[&str], level: &str) -> Run {
        let mut cmd = self.cordis(args);
        cmd.env("RUST_LOG", level);
        let output = cmd.output().expect("failed to run cordis");
        Run {
            what: format!("cordis {}", args.join(" ")),
            cwd: self.path(),
            output,
            killed_at: None,
        }
    }

    /// Runs `cordis ARGS` the way hostile input must not be able to stall or exhaust the
    /// tests: the child is killed when `deadline` passes (its [`Run`] then says so and has
    /// no exit code), and its data segment is limited to `max_data` bytes (`RLIMIT_DATA`),
    /// so a runaway allocation fails inside the child instead of exhausting the machine.
    pub fn run_bounded(&self, args: &[&str], deadline: Duration, max_data: u64) -> Run {
        use std::os::unix::process::CommandExt;
        let mut cmd = self.cordis(args);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        // SAFETY: the closure runs in the forked child before exec and calls only
        // setrlimit, which is async-signal-safe.
        unsafe {
            cmd.pre_exec(move || {
                let limit = libc::rlimit {
                    rlim_cur: max_data,
                    rlim_max: max_data,
                };
                match libc::setrlimit(libc::RLIMIT_DATA, &limit) {
                    0 => Ok(()),
                    _ => Err(std::io::Error::last_os_error()),
                }
            });
        }
        let child = cmd.spawn().expect("failed to run cordis");
        let pid = libc::pid_t::try_from(child.id()).expect("a pid fits pid_t");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait_with_output());
        });
        let (output, killed_at) = match rx.recv_timeout(deadline) {
            Ok(output) => (output, None),
            Err(_) => {
                // The waiting thread reaps the child only after it exits, so `pid` is
                // still this child.
                // SAFETY: kill(2) on a pid this function spawned and has not reaped.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                let output = rx.recv().expect("the waiting thread reports the exit");
                (output, Some(deadline))
            }
        };
        Run {
            what: format!("cordis {}", args.join(" ")),
            cwd: self.path(),
            output: output.expect("wait for cordis"),
            killed_at,
        }
    }

    /// Starts the composition in `cordis.yml` in-process.
    pub fn start(&self) -> Started {
        build_workspace();
        let host = Host::new(
            &self.path().join("cordis.yml"),
            &[target_dir()],
            &self.state_dir(),
            false,
        );
        let (plan, registry) = host
            .start()
            .unwrap_or_else(|e| panic!("start failed: {e:#}"));
        Started {
            host,
            _plan: plan,
            registry,
        }
    }
}

impl Scratch {
    /// Starts `cordis.yml` as a reloadable [`Runtime`] (libraries loaded from private copies
    /// under `state/run`), searching `plugins/` in this directory before the build output.
    pub fn runtime(&self) -> std::sync::Arc<Runtime> {
        self.runtime_with(|_| {})
    }

    /// [`Scratch::runtime`], with `isolate: process` entries in processes of their own
    /// (the `cordis` binary re-executed, as `cordis run` does it).
    pub fn runtime_isolated(&self) -> std::sync::Arc<Runtime> {
        self.runtime_with(|host| host.isolate_with(cordis_bin()))
    }

    fn runtime_with(&self, adjust: impl FnOnce(&mut Host)) -> std::sync::Arc<Runtime> {
        build_workspace();
        let mut host = Host::new(
            &self.path().join("cordis.yml"),
            &[self.path().join("plugins"), target_dir()],
            &self.state_dir(),
            false,
        );
        host.copy_libraries(cordis_engine::Copies::new(self.state_dir().join("run")));
        adjust(&mut host);
        Runtime::start(host).unwrap_or_else(|e| panic!("start failed: {e:#}"))
    }
}

/// A composition applied in-process.
pub struct Started {
    /// The host (sessions, options).
    pub host: Host,
    _plan: Plan,
    /// The applied registry.
    pub registry: Registry,
}

impl Started {
    /// Creates a session rooted at `cwd` and returns its call context (fresh call id).
    pub fn session(&self, cwd: &Path) -> cordis_sdk::SessionInfo {
        self.host
            .sessions()
            .create(cwd)
            .unwrap_or_else(|e| panic!("create session: {e}"))
    }

    /// Calls tool `name` in `session` with JSON `args`, as a front-end would.
    pub fn call_tool(
        &self,
        session: &cordis_sdk::SessionInfo,
        name: &str,
        args: serde_json::Value,
    ) -> cordis_sdk::ToolResult {
        use std::sync::atomic::{AtomicU64, Ordering};
        static CALLS: AtomicU64 = AtomicU64::new(0);
        let call = cordis_sdk::CallContext {
            session: session.clone(),
            call_id: format!("test-call-{}", CALLS.fetch_add(1, Ordering::Relaxed)),
            cancel_fd: None,
            progress_fd: None,
        };
        self.registry
            .call_tool(name, &call, &args)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Makes every approval request answer `outcome` (`None`: nobody can be asked).
    pub fn approvals(&self, outcome: Option<cordis_sdk::host::ApprovalOutcome>) {
        match outcome {
            Some(o) => self.host.approvals().answer_always(o),
            None => self.host.approvals().set_default(None),
        }
    }

    /// A typed client for service `name`.
    pub fn service<I: Interface>(&self, name: &str) -> I {
        let slot = self
            .registry
            .services
            .get(name)
            .unwrap_or_else(|| panic!("service `{name}` is not registered"));
        Service::checked::<I>(name, slot.handle.clone())
            .unwrap_or_else(|e| panic!("service `{name}`: {e}"))
    }
}

/// A finished `cordis` run.
pub struct Run {
    what: String,
    cwd: PathBuf,
    /// Its output.
    pub output: Output,
    /// The deadline it was killed at, when it did not finish before it.
    killed_at: Option<Duration>,
}

impl Run {
    /// Stdout as text.
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.output.stdout).into_owned()
    }

    /// Stderr as text.
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.output.stderr).into_owned()
    }

    /// The exit code (`None` when killed by a signal).
    pub fn code(&self) -> Option<i32> {
        self.output.status.code()
    }

    /// Everything about the run, for a failure message.
    pub fn context(&self) -> String {
        let listing: Vec<String> = walk(&self.cwd)
            .into_iter()
            .map(|p| {
                p.strip_prefix(&self.cwd)
                    .unwrap_or(&p)
                    .display()
                    .to_string()
            })
            .collect();
        let exit = match self.killed_at {
            Some(deadline) => format!("none: killed when the {deadline:?} deadline passed"),
            None => format!("{:?}", self.code()),
        };
        format!(
            "command: {}\ncwd: {}\nexit: {exit}\nlisting: {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.what,
            self.cwd.display(),
            listing.join(", "),
            self.stdout(),
            self.stderr()
        )
    }

    /// Asserts the exit code.
    pub fn expect_code(&self, code: i32) -> &Self {
        assert_eq!(
            self.code(),
            Some(code),
            "unexpected exit code\n{}",
            self.context()
        );
        self
    }

    /// Asserts stdout + stderr contain every needle.
    pub fn expect_output(&self, needles: &[&str]) -> &Self {
        let all = format!("{}{}", self.stdout(), self.stderr());
        for n in needles {
            assert!(all.contains(n), "output lacks {n:?}\n{}", self.context());
        }
        self
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() && !p.is_symlink() {
                out.extend(walk(&p));
            }
            out.push(p);
        }
    }
    out.sort();
    out
}

/// Lines still to come from a child's stream.
pub struct Rest {
    rx: std::sync::mpsc::Receiver<String>,
}

impl Rest {
    /// Everything until the stream closes.
    pub fn join(self) -> String {
        self.rx.iter().collect::<Vec<_>>().join("\n")
    }
}

/// Reads `stream` line by line until a line contains `needle` (or `timeout` passes).
/// Returns the text seen so far and the rest of the stream.
pub fn wait_for_line(
    stream: impl std::io::Read + Send + 'static,
    needle: &str,
    timeout: std::time::Duration,
) -> Option<(String, Rest)> {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = std::time::Instant::now() + timeout;
    let mut seen = Vec::new();
    loop {
        let left = deadline.checked_duration_since(std::time::Instant::now())?;
        let line = rx.recv_timeout(left).ok()?;
        let found = line.contains(needle);
        seen.push(line);
        if found {
            return Some((seen.join("\n"), Rest { rx }));
        }
    }
}

/// Polls `probe` until it returns `Some` and returns that; fails the test, saying what was
/// awaited and the last thing seen, when `timeout` passes first. A condition with a
/// deadline, never a fixed sleep.
pub fn eventually<T>(
    what: &str,
    timeout: std::time::Duration,
    mut probe: impl FnMut() -> Result<T, String>,
) -> T {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        match probe() {
            Ok(value) => return value,
            Err(seen) if std::time::Instant::now() >= deadline => {
                panic!("{what}: not within {timeout:?}; last seen:\n{seen}")
            }
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
        }
    }
}

/// Sends `SIG<name>` to a child with the system `kill`.
pub fn signal(child: &std::process::Child, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{name} failed");
}

/// A child process killed when the test lets go of it (also on a failed assertion).
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A minimal MCP client over a child's stdio (newline-delimited JSON-RPC), enough to drive
/// `cordis run` from Rust tests: requests wait for their response; notifications are kept.
pub struct McpStdio {
    child: KillOnDrop,
    stdin: Option<std::process::ChildStdin>,
    lines: std::sync::mpsc::Receiver<String>,
    next_id: u64,
    /// Notifications received so far (method names).
    pub notifications: Vec<String>,
}

impl McpStdio {
    /// Spawns `cmd` (a `cordis run`), initializes the connection.
    pub fn start(mut cmd: Command) -> Self {
        use std::io::BufRead;
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn cordis run");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut client = McpStdio {
            child: KillOnDrop(child),
            stdin: Some(stdin),
            lines,
            next_id: 0,
            notifications: Vec::new(),
        };
        client.request(
            "initialize",
            serde_json::json!({
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "cordis-e2e", "version": "0"}
            }),
        );
        client.send(&serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        client
    }

    fn send(&mut self, message: &serde_json::Value) {
        use std::io::Write;
        let stdin = self.stdin.as_mut().expect("the connection is open");
        writeln!(stdin, "{message}").expect("write to cordis run");
        stdin.flush().expect("flush");
    }

    /// Sends a request and waits (up to 60 s) for its response's `result`.
    pub fn request(&mut self, method: &str, params: serde_json::Value) -> serde_json::Value {
        self.next_id += 1;
        let id = self.next_id;
        self.send(
            &serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
        );
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let left = deadline
                .checked_duration_since(std::time::Instant::now())
                .unwrap_or_else(|| panic!("no response to {method} within 60 s"));
            let line = self.lines.recv_timeout(left).unwrap_or_else(|_| {
                panic!("cordis run closed stdout or timed out during {method}")
            });
            let Ok(msg) = serde_json::from_str::<serde_json::Value>(&line) else {
                panic!("cordis run wrote a non-JSON line on stdout: {line}");
            };
            if msg.get("id") == Some(&serde_json::json!(id)) {
                if let Some(err) = msg.get("error") {
                    panic!("{method} failed: {err}");
                }
                return msg["result"].clone();
            }
            if let Some(m) = msg.get("method").and_then(|m| m.as_str()) {
                self.notifications.push(m.to_string());
            }
        }
    }

    /// Calls a tool; returns (is_error, text).
    pub fn call(&mut self, tool: &str, args: serde_json::Value) -> (bool, String) {
        let r = self.request(
            "tools/call",
            serde_json::json!({"name": tool, "arguments": args}),
        );
        let text = r["content"]
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter_map(|i| i["text"].as_str())
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .unwrap_or_default();
        (r["isError"].as_bool().unwrap_or(false), text)
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.0.id()
    }

    /// Closes stdin (the client disconnects) and waits for the server to exit.
    pub fn finish(mut self) -> std::process::ExitStatus {
        drop(self.stdin.take());
        self.child.0.wait().expect("wait for cordis run")
    }
}

/// A name unique within this test run (process id and a counter).
pub fn unique() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A directory for test areas that must lie outside every writable root (the temp areas
/// are writable roots) and outside every protected path (the build output directory is on
/// the plugin search path): `CORDIS_E2E_OUTSIDE` when set, else `e2e-outside` beside the
/// build output directory, else `~/.cache/cordis-e2e`, else `/var/tmp/cordis-e2e` — the first that is not inside a
/// temp area. Fails loudly when none is.
pub fn outside_base() -> PathBuf {
    let temp_roots: Vec<PathBuf> = [PathBuf::from("/tmp"), std::env::temp_dir()]
        .iter()
        .filter_map(|r| r.canonicalize().ok())
        .collect();
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(dir) = std::env::var_os("CORDIS_E2E_OUTSIDE") {
        candidates.push(PathBuf::from(dir));
    }
    candidates.extend(target_dir().parent().map(|t| t.join("e2e-outside")));
    if let Some(home) = std::env::var_os("HOME") {
        candidates.push(PathBuf::from(home).join(".cache/cordis-e2e"));
    }
    candidates.push(PathBuf::from("/var/tmp/cordis-e2e"));
    for c in &candidates {
        if std::fs::create_dir_all(c).is_err() {
            continue;
        }
        let Ok(canon) = c.canonicalize() else {
            continue;
        };
        if !temp_roots.iter().any(|r| canon.starts_with(r)) {
            return canon;
        }
    }
    panic!(
        "no directory outside the temp areas {temp_roots:?} is usable for the sandbox tests (tried {candidates:?}); set CORDIS_E2E_OUTSIDE to one"
    )
}

/// What the victim file outside every writable root holds until something escapes.
pub const VICTIM: &str = "original outside content\n";

/// A directory outside every writable root (the scratch dirs live under the temp area,
/// which is writable in `workspace-write`), under the build output directory, holding
/// `victim.txt`; removed on drop.
pub struct Outside {
    /// The directory (canonical).
    pub dir: PathBuf,
}

impl Outside {
    /// Creates it; fails loudly if the build output lies inside a temp area.
    pub fn new(prefix: &str) -> Self {
        let dir = outside_base().join(format!("{prefix}-outside-{}", unique()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the outside dir");
        let dir = dir.canonicalize().expect("canonical outside dir");
        let probe = dsh_sandbox::SandboxExecutionPolicy {
            mode: dsh_sandbox::SandboxMode::WorkspaceWrite,
            workspace_root: PathBuf::from("/"),
            network: false,
            ..Default::default()
        };
        let temp_roots: Vec<PathBuf> = dsh_sandbox::writable_roots(&probe)
            .expect("`/` is a root")
            .into_iter()
            .skip(1)
            .collect();
        assert!(
            !temp_roots.iter().any(|r| dir.starts_with(r)),
            "the cargo target dir {} lies inside a temp area {temp_roots:?}; these tests need an \
             area outside every writable root, so build with a target dir outside the temp area",
            dir.display()
        );
        std::fs::write(dir.join("victim.txt"), VICTIM).expect("write victim");
        Outside { dir }
    }

    /// The victim file.
    pub fn victim(&self) -> PathBuf {
        self.dir.join("victim.txt")
    }

    /// The victim's text.
    pub fn victim_text(&self) -> String {
        std::fs::read_to_string(self.victim()).expect("read victim")
    }

    /// Every object beneath the dir (symlinks not followed): kind and bytes.
    pub fn snapshot(&self) -> std::collections::BTreeMap<PathBuf, String> {
        fn walk(dir: &Path, base: &Path, out: &mut std::collections::BTreeMap<PathBuf, String>) {
            let mut entries: Vec<_> = std::fs::read_dir(dir)
                .expect("read outside dir")
                .map(|e| e.expect("dir entry").path())
                .collect();
            entries.sort();
            for p in entries {
                let rel = p.strip_prefix(base).expect("beneath base").to_path_buf();
                let meta = std::fs::symlink_metadata(&p).expect("lstat");
                if meta.file_type().is_symlink() {
                    let t = std::fs::read_link(&p).expect("readlink");
                    out.insert(rel, format!("link -> {}", t.display()));
                } else if meta.is_dir() {
                    out.insert(rel, "dir".into());
                    walk(&p, base, out);
                } else {
                    let bytes = std::fs::read(&p).expect("read");
                    out.insert(rel, format!("file {:?}", String::from_utf8_lossy(&bytes)));
                }
            }
        }
        let mut out = std::collections::BTreeMap::new();
        walk(&self.dir, &self.dir, &mut out);
        out
    }
}

impl Drop for Outside {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A thread that keeps exchanging two paths (`renameat2` with `RENAME_EXCHANGE`: each
/// always names something, never nothing) until stopped, as a hostile command elsewhere
/// would; stopping leaves them as they were.
pub struct Swapper {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    swaps: std::sync::Arc<std::sync::atomic::AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Swapper {
    /// Starts exchanging `a` and `b`.
    pub fn start(a: &Path, b: &Path) -> Swapper {
        use std::sync::atomic::Ordering::Relaxed;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let swaps = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let thread = {
            let (a, b, stop, swaps) = (
                a.to_path_buf(),
                b.to_path_buf(),
                stop.clone(),
                swaps.clone(),
            );
            std::thread::spawn(move || {
                while !stop.load(Relaxed) || swaps.load(Relaxed) % 2 == 1 {
                    exchange(&a, &b);
                    swaps.fetch_add(1, Relaxed);
                    std::thread::yield_now();
                }
            })
        };
        Swapper {
            stop,
            swaps,
            thread: Some(thread),
        }
    }

    /// The exchanges so far.
    pub fn swaps(&self) -> u64 {
        self.swaps.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Stops (after an even number of exchanges) and returns how many there were.
    pub fn stop(mut self) -> u64 {
        self.halt();
        self.swaps()
    }

    fn halt(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.join().expect("swapper thread");
        }
    }
}

impl Drop for Swapper {
    fn drop(&mut self) {
        self.halt();
    }
}

/// Exchanges `a` and `b` atomically (`renameat2` `RENAME_EXCHANGE`).
pub fn exchange(a: &Path, b: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_bytes()).expect("no NUL");
    let (ca, cb) = (c(a), c(b));
    // SAFETY: two valid C strings; the call has no other effect on memory.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    assert_eq!(
        r,
        0,
        "exchange {} and {} (renameat2 RENAME_EXCHANGE): {}",
        a.display(),
        b.display(),
        std::io::Error::last_os_error()
    );
}

/// A confined `bash` call (`dsh-bash-sandbox` in workspace-write rooted at `ws`) whose
/// kernel refuses system call `nr` with `errno` must run nothing and exit 1 with every
/// one of `needles` in its output; the same call without the refusal runs, confined.
pub fn assert_refused_setup_runs_nothing(
    ws: &Path,
    nr: libc::c_long,
    errno: i32,
    needles: &[&str],
) {
    let scratch = Scratch::new();
    let manifest = scratch.manifest(&format!(
        "- name: dsh-sandbox-policy\n  config:\n    mode: workspace-write\n    workspaceRoot: '{}'\n- name: dsh-bash-sandbox\n- name: dsh-tool-bash\n",
        ws.display()
    ));
    let marker = ws.join("ran.txt");
    let args = format!(r#"{{"command": "echo ran > '{}'"}}"#, marker.display());
    let call = |refused: bool| {
        let manifest = manifest.to_str().expect("UTF-8 path");
        let mut cmd = scratch.cordis(&["call", "-c", manifest, "bash", &args]);
        cmd.current_dir(ws);
        if refused {
            refuse_syscall(&mut cmd, nr, errno);
        }
        cmd.output().expect("spawn cordis call")
    };
    let out = call(true);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(1), "{said}");
    for needle in needles {
        assert!(said.contains(needle), "missing {needle:?} in:\n{said}");
    }
    assert!(!marker.exists(), "the command ran without its sandbox");
    // The control: the very same call, without the refusal, runs confined.
    let out = call(false);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read_to_string(&marker).expect("ran"), "ran\n");
}

/// Makes `cmd` run under a seccomp filter (installed between fork and exec) under which the
/// kernel answers system call `nr` with `errno`: the real kernel, behaving as a machine
/// without that facility would (Landlock missing, user namespaces disabled). Spawning fails
/// loudly if the filter cannot be installed.
pub fn refuse_syscall(cmd: &mut Command, nr: libc::c_long, errno: i32) {
    use std::os::unix::process::CommandExt;
    #[cfg(target_arch = "x86_64")]
    const AUDIT_ARCH: u32 = 0xC000_003E;
    #[cfg(target_arch = "aarch64")]
    const AUDIT_ARCH: u32 = 0xC000_00B7;
    let stmt = |code: u32, k: u32| libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let jump_eq = |k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        jt,
        jf,
        k,
    };
    let load = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    let ret = libc::BPF_RET | libc::BPF_K;
    // Offsets into `struct seccomp_data`: `nr` at 0, `arch` at 4. Leaked: the program must
    // outlive the fork, and a test makes a handful.
    let filter: &'static [libc::sock_filter] = Box::leak(Box::new([
        stmt(load, 4),
        jump_eq(AUDIT_ARCH, 1, 0),
        stmt(ret, libc::SECCOMP_RET_KILL_PROCESS),
        stmt(load, 0),
        jump_eq(nr as u32, 0, 1),
        stmt(ret, libc::SECCOMP_RET_ERRNO | errno as u32),
        stmt(ret, libc::SECCOMP_RET_ALLOW),
    ]));
    let (addr, len) = (filter.as_ptr() as usize, filter.len() as u16);
    // SAFETY: the hook makes only system calls, on a program that lives for the whole run.
    unsafe {
        cmd.pre_exec(move || {
            let prog = libc::sock_fprog {
                len,
                filter: addr as *mut libc::sock_filter,
            };
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::syscall(
                    libc::SYS_seccomp,
                    libc::SECCOMP_SET_MODE_FILTER,
                    0,
                    &prog as *const libc::sock_fprog,
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    };
}

/// A `shell` request as the shell tests send it: no extra environment, a 20 s timeout, the
/// default output cap, no cancel descriptor.
pub fn shell_request(
    command: &str,
    cwd: &Path,
    policy: Option<dsh_sandbox::SandboxExecutionPolicy>,
) -> dsh_shell_api::ExecRequest {
    dsh_shell_api::ExecRequest {
        command: command.to_string(),
        cwd: cwd.to_path_buf(),
        env: Vec::new(),
        timeout_ms: Some(20_000),
        output_limit: None,
        policy: policy.map(dsh_sandbox::Shared::new),
        cancel_fd: None,
        progress_fd: None,
    }
}

/// Runs one command; a backend error (e.g. `SHELL_SANDBOX_UNAVAILABLE`) fails the test
/// with its message.
pub fn shell_exec(
    shell: &dsh_shell_api::ShellClient,
    request: dsh_shell_api::ExecRequest,
) -> dsh_shell_api::ExecResult {
    use dsh_shell_api::Shell;
    let what = request.command.clone();
    shell
        .exec(request)
        .unwrap_or_else(|e| panic!("`{what}` could not run: {e}"))
}

/// A copy of the SDK whose version is `version` (everything else unchanged), in `dir`.
pub fn sdk_copy(dir: &Path, version: &str) -> PathBuf {
    let sdk = workspace_root().join("plugins/sdk");
    let copy = dir.join("sdk");
    std::fs::create_dir_all(copy.join("src")).unwrap();
    for file in std::fs::read_dir(sdk.join("src")).unwrap() {
        let file = file.unwrap().path();
        std::fs::copy(&file, copy.join("src").join(file.file_name().unwrap())).unwrap();
    }
    let manifest = std::fs::read_to_string(sdk.join("Cargo.toml")).unwrap();
    write_sdk_manifest(&copy, &manifest, version);
    copy
}

/// The SDK's `Cargo.toml` standing alone (no workspace), at `version`.
pub fn write_sdk_manifest(copy: &Path, manifest: &str, version: &str) {
    let manifest = manifest
        .replace("rust-version.workspace = true", "")
        .replace(
            "version.workspace = true",
            &format!("version = \"{version}\""),
        )
        .replace("edition.workspace = true", "edition = \"2021\"")
        .replace("license.workspace = true", "")
        .replace("abi_stable.workspace = true", "abi_stable = \"0.11.3\"")
        .replace("schemars.workspace = true", "schemars = \"1\"")
        .replace(
            "serde.workspace = true",
            "serde = { version = \"1\", features = [\"derive\"] }",
        )
        .replace(
            "serde_json.workspace = true",
            "serde_json = { version = \"1\", features = [\"raw_value\"] }",
        )
        .replace(
            "json-escape-simd.workspace = true",
            "json-escape-simd = \"3\"",
        )
        .replace("memchr.workspace = true", "memchr = \"2\"")
        .replace("tracing.workspace = true", "tracing = \"0.1\"");
    assert!(!manifest.contains(".workspace"), "{manifest}");
    std::fs::write(copy.join("Cargo.toml"), manifest).unwrap();
}
