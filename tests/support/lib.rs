//! The one harness for end-to-end tests: makes sure the real plugin libraries and the real
//! `cordis` binary are built, gives each test a scratch directory, runs `cordis` in it and,
//! when an expectation fails, prints the command, cwd, listing, stdout and stderr.
//! It also starts a composition in-process (the same `Host` the binary uses) so tests can
//! call the real services of real cdylibs.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

pub mod bench;

pub use cordis_host::{plan::Plan, registry::Registry, Host};
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
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.current_dir(workspace_root())
            .args(["build", "--workspace", "--lib", "--bins"]);
        if target_dir().file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let out = cmd.output().expect("failed to run cargo build");
        assert!(
            out.status.success(),
            "building the plugins failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        target_dir()
    })
}

/// The `cordis` binary.
pub fn cordis_bin() -> PathBuf {
    build_workspace().join("cordis")
}

/// A plugin library by plugin name.
pub fn library(plugin: &str) -> PathBuf {
    build_workspace().join(cordis_host::loader::library_file_name(plugin))
}

/// A scratch directory for one test; kept (and its path printed) when a check fails.
pub struct Scratch {
    dir: tempfile::TempDir,
}

impl Default for Scratch {
    fn default() -> Self {
        Self::new()
    }
}

impl Scratch {
    /// A fresh scratch directory (canonical path) with a `state/` for session logs.
    pub fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("cordis-e2e-")
            .tempdir()
            .expect("tempdir");
        std::fs::create_dir_all(dir.path().join("state")).expect("state dir");
        Scratch { dir }
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

    /// A `cordis` command run in this directory with its own state dir.
    pub fn cordis(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(cordis_bin());
        cmd.current_dir(self.path())
            .env("CORDIS_STATE_DIR", self.path().join("state"))
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

    /// Runs `cordis ARGS` to completion with `RUST_LOG=level`.
    pub fn run_with_log(&self, args: &[&str], level: &str) -> Run {
        let mut cmd = self.cordis(args);
        cmd.env("RUST_LOG", level);
        let output = cmd.output().expect("failed to run cordis");
        Run {
            what: format!("cordis {}", args.join(" ")),
            cwd: self.path(),
            output,
        }
    }

    /// Starts the composition in `cordis.yml` in-process.
    pub fn start(&self) -> Started {
        build_workspace();
        let host = Host::new(
            &self.path().join("cordis.yml"),
            &[target_dir()],
            &self.path().join("state"),
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
            .sessions
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
        };
        self.registry
            .call_tool(name, &call, &args)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Makes every approval request answer `outcome` (`None`: nobody can be asked).
    pub fn approvals(&self, outcome: Option<cordis_sdk::host::ApprovalOutcome>) {
        match outcome {
            Some(o) => self.host.approvals.answer_always(o),
            None => self.host.approvals.set_default(None),
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
        format!(
            "command: {}\ncwd: {}\nexit: {:?}\nlisting: {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.what,
            self.cwd.display(),
            self.code(),
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
