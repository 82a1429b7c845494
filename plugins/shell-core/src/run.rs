//! Running one command: spawn (optionally confined), drain both pipes with a cap, wait with
//! a timeout that kills the whole process group, and fold it all into an [`ExecResult`].

use std::io::{self, Read};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dsh_shell_api::{codes, ExecRequest, ExecResult, DEFAULT_OUTPUT_LIMIT, DEFAULT_TIMEOUT_MS};

use crate::confine::{ConfineError, Confinement};

/// How long the pipes may stay open after the process group was killed before the readers
/// are abandoned (a process that left the group could hold them forever).
const KILL_GRACE: Duration = Duration::from_secs(2);

/// Why a command could not be run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The working directory is not an absolute path to a directory.
    #[error("working directory `{}` is not an absolute path to an existing directory", cwd.display())]
    BadCwd {
        /// The directory asked for.
        cwd: PathBuf,
    },
    /// `bash` could not be started.
    #[error("cannot start `bash -c` in `{}`: {source}", cwd.display())]
    Spawn {
        /// The working directory.
        cwd: PathBuf,
        /// What the OS said.
        source: io::Error,
    },
    /// The kernel sandbox could not be enforced; the command was NOT run.
    #[error("the command was not run: {0}")]
    Sandbox(#[from] ConfineError),
    /// A helper thread could not be started.
    #[error("cannot start a helper thread for the command: {0}")]
    Thread(io::Error),
}

impl RunError {
    /// The error as it crosses the plugin boundary: a `shell` code, the message, a fix.
    pub fn into_sdk_error(self) -> cordis_sdk::Error {
        let (code, help) = match &self {
            RunError::BadCwd { .. } => (
                cordis_sdk::codes::INVALID_ARGUMENT,
                "pass `cwd` as an absolute path to an existing directory".to_string(),
            ),
            RunError::Spawn { .. } | RunError::Thread(_) => (
                codes::SHELL_SPAWN,
                "check that `bash` is on PATH and the process may create threads and processes"
                    .to_string(),
            ),
            RunError::Sandbox(e) => (codes::SHELL_SANDBOX_UNAVAILABLE, e.help()),
        };
        cordis_sdk::Error::new(code, self.to_string()).with_help(help)
    }
}

/// Runs `request` to completion or timeout. With `confinement`, the command is spawned from
/// a fresh thread that first confines itself (and so everything it spawns); the calling
/// thread is never confined. The result's `mode` and `sandbox_denied` are left for the
/// backend to fill in.
pub fn run(
    request: &ExecRequest,
    confinement: Option<Confinement>,
) -> Result<ExecResult, RunError> {
    if !request.cwd.is_absolute() || !request.cwd.is_dir() {
        return Err(RunError::BadCwd {
            cwd: request.cwd.clone(),
        });
    }
    let timeout = Duration::from_millis(request.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS));
    let limit = request.output_limit.unwrap_or(DEFAULT_OUTPUT_LIMIT);

    let mut cmd = Command::new("bash");
    cmd.arg("-c")
        .arg(&request.command)
        .current_dir(&request.cwd)
        .envs(request.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: `isolate_child` only makes async-signal-safe system calls.
    unsafe { cmd.pre_exec(isolate_child) };

    let started = Instant::now();
    let spawned = match confinement {
        None => cmd.spawn(),
        Some(confinement) => spawn_confined(cmd, confinement)?,
    };
    let child = spawned.map_err(|source| RunError::Spawn {
        cwd: request.cwd.clone(),
        source,
    })?;
    supervise(child, started + timeout, limit)
}

/// Spawns `cmd` from a fresh, dedicated thread that confines itself first. The thread ends
/// right after the spawn; the confinement dies with it.
fn spawn_confined(
    mut cmd: Command,
    confinement: Confinement,
) -> Result<io::Result<Child>, RunError> {
    let handle = std::thread::Builder::new()
        .name("dsh-shell-confined-spawn".into())
        .spawn(move || -> Result<io::Result<Child>, ConfineError> {
            confinement.restrict_current_thread()?;
            Ok(cmd.spawn())
        })
        .map_err(RunError::Thread)?;
    match handle.join() {
        Ok(outcome) => Ok(outcome?),
        Err(_) => Err(RunError::Sandbox(ConfineError::SpawnThreadPanicked)),
    }
}

/// Runs in the child between fork and exec: a new session (and process group) so the whole
/// tree can be killed at once, and every descriptor above 2 marked close-on-exec so nothing
/// of the host leaks into the command. Only async-signal-safe calls.
fn isolate_child() -> io::Result<()> {
    // SAFETY: plain system calls without memory arguments.
    unsafe {
        if libc::setsid() == -1 {
            return Err(io::Error::last_os_error());
        }
        if libc::close_range(
            3,
            libc::c_uint::MAX,
            libc::CLOSE_RANGE_CLOEXEC as libc::c_int,
        ) == -1
        {
            // Kernels before 5.11: mark each possible descriptor.
            let max = libc::sysconf(libc::_SC_OPEN_MAX);
            let max = if max < 0 { 1024 } else { max as libc::c_int };
            for fd in 3..max {
                let flags = libc::fcntl(fd, libc::F_GETFD);
                if flags >= 0 && flags & libc::FD_CLOEXEC == 0 {
                    libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
                }
            }
        }
    }
    Ok(())
}

/// One stream's capture: the first `limit` bytes and how many came in total.
#[derive(Default)]
struct Capture {
    kept: Vec<u8>,
    total: u64,
}

enum Done {
    Stream,
    Exited(io::Result<ExitStatus>),
}

/// Reads `pipe` to EOF, keeping at most `limit` bytes but never stopping early.
fn drain(mut pipe: impl Read, limit: u64, capture: Arc<Mutex<Capture>>, done: Sender<Done>) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match pipe.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let mut c = capture.lock().unwrap_or_else(|e| e.into_inner());
                let room = limit.saturating_sub(c.kept.len() as u64) as usize;
                let take = room.min(n);
                c.kept.extend_from_slice(&buf[..take]);
                c.total += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    let _ = done.send(Done::Stream);
}

fn kill_group(pgid: u32) {
    // SAFETY: a plain system call. The group id is the child's pid (it called setsid), and
    // it cannot be reused while any member of the group is alive.
    unsafe {
        libc::kill(-(pgid as libc::pid_t), libc::SIGKILL);
    }
}

/// Waits for the leader and both pipes until `deadline`; then kills the process group.
fn supervise(mut child: Child, deadline: Instant, limit: u64) -> Result<ExecResult, RunError> {
    let pgid = child.id();
    let (tx, rx) = mpsc::channel();
    let out = Arc::new(Mutex::new(Capture::default()));
    let err = Arc::new(Mutex::new(Capture::default()));
    let helper = |name: &str, f: Box<dyn FnOnce() + Send>| -> Result<(), RunError> {
        std::thread::Builder::new()
            .name(name.into())
            .spawn(f)
            .map(drop)
            .map_err(|e| {
                kill_group(pgid);
                RunError::Thread(e)
            })
    };
    let mut pending = 0;
    if let Some(pipe) = child.stdout.take() {
        let (c, t) = (out.clone(), tx.clone());
        helper(
            "dsh-shell-stdout",
            Box::new(move || drain(pipe, limit, c, t)),
        )?;
        pending += 1;
    }
    if let Some(pipe) = child.stderr.take() {
        let (c, t) = (err.clone(), tx.clone());
        helper(
            "dsh-shell-stderr",
            Box::new(move || drain(pipe, limit, c, t)),
        )?;
        pending += 1;
    }
    let t = tx;
    helper(
        "dsh-shell-wait",
        Box::new(move || {
            let _ = t.send(Done::Exited(child.wait()));
        }),
    )?;
    pending += 1;

    let mut status: Option<ExitStatus> = None;
    let mut timed_out = false;
    let mut until = deadline;
    while pending > 0 {
        let now = Instant::now();
        match rx.recv_timeout(until.saturating_duration_since(now)) {
            Ok(Done::Stream) => pending -= 1,
            Ok(Done::Exited(s)) => {
                pending -= 1;
                status = s.ok();
            }
            Err(RecvTimeoutError::Timeout) if !timed_out => {
                timed_out = true;
                kill_group(pgid);
                until = Instant::now() + KILL_GRACE;
            }
            Err(_) => break,
        }
    }

    let mut truncated = false;
    let mut finish = |capture: &Arc<Mutex<Capture>>, stream: &str| -> String {
        let c = capture.lock().unwrap_or_else(|e| e.into_inner());
        let mut text = String::from_utf8_lossy(&c.kept).into_owned();
        if c.total > c.kept.len() as u64 {
            truncated = true;
            text.push_str(&format!(
                "\n[output truncated: {stream} exceeded the {limit}-byte cap; {} further bytes were discarded]",
                c.total - c.kept.len() as u64
            ));
        }
        text
    };
    let stdout = finish(&out, "stdout");
    let stderr = finish(&err, "stderr");
    Ok(ExecResult {
        exit_code: status.and_then(|s| s.code()),
        signal: status.and_then(|s| s.signal()),
        stdout,
        stderr,
        truncated,
        timed_out,
        sandbox_denied: false,
        mode: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(command: &str, cwd: &std::path::Path) -> ExecRequest {
        ExecRequest {
            command: command.into(),
            cwd: cwd.to_path_buf(),
            env: vec![("DSH_TEST_VAR".into(), "from-env".into())],
            timeout_ms: Some(10_000),
            output_limit: None,
            policy: None,
        }
    }

    #[test]
    fn runs_in_cwd_with_env_and_null_stdin_and_reports_exit_and_signal() {
        let dir = tempfile::tempdir().unwrap();
        let cwd = dir.path().canonicalize().unwrap();
        let r = run(
            &request("pwd; echo $DSH_TEST_VAR; cat; echo err >&2; exit 3", &cwd),
            None,
        )
        .unwrap();
        assert_eq!(r.stdout, format!("{}\nfrom-env\n", cwd.display()));
        assert_eq!(
            (r.stderr.as_str(), r.exit_code, r.signal),
            ("err\n", Some(3), None)
        );
        let r = run(&request("kill -TERM $$", &cwd), None).unwrap();
        assert_eq!((r.exit_code, r.signal), (None, Some(libc::SIGTERM)));
        let err = run(&request("true", std::path::Path::new("relative")), None).unwrap_err();
        assert!(matches!(err, RunError::BadCwd { .. }), "{err}");
    }

    #[test]
    fn no_descriptor_of_the_host_leaks_into_the_command() {
        // A descriptor deliberately opened WITHOUT close-on-exec.
        // SAFETY: plain system calls on a path literal.
        let fd = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY) };
        assert!(fd > 2);
        let r = run(
            &request("ls /proc/self/fd", std::path::Path::new("/")),
            None,
        )
        .unwrap();
        // SAFETY: closing the descriptor opened above.
        unsafe { libc::close(fd) };
        let fds: Vec<&str> = r.stdout.lines().collect();
        // 0, 1, 2 and the directory `ls` opens to list.
        assert_eq!(fds, ["0", "1", "2", "3"], "{r:?}");
    }

    #[test]
    fn cap_keeps_draining_and_says_so() {
        let mut req = request(
            "head -c 3000000 /dev/zero | tr '\\0' a; echo done >&2",
            std::path::Path::new("/"),
        );
        req.output_limit = Some(1000);
        let r = run(&req, None).unwrap();
        assert!(
            r.truncated && !r.timed_out && r.exit_code == Some(0),
            "{r:?}"
        );
        assert!(r.stdout.starts_with(&"a".repeat(1000)));
        assert!(
            r.stdout.contains("1000-byte cap; 2999000 further bytes"),
            "{}",
            &r.stdout[1000..]
        );
        assert_eq!(r.stderr, "done\n");
    }

    #[test]
    fn timeout_kills_the_whole_process_group() {
        let mut req = request(
            "sleep 1000 & echo $!; sleep 1000",
            std::path::Path::new("/"),
        );
        req.timeout_ms = Some(300);
        let started = Instant::now();
        let r = run(&req, None).unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        assert!(r.timed_out && r.signal == Some(libc::SIGKILL), "{r:?}");
        let pid: i32 = r.stdout.trim().parse().unwrap();
        // The background grandchild is gone (at most a zombie until init reaps it).
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if stat.is_empty() || stat.contains(") Z ") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "grandchild {pid} survived: {stat}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
