//! Running one command: spawn it under its supervisor (optionally confined), drain both
//! pipes with a cap, wait with a timeout or a cancellation that kills everything the
//! command started, and fold it all into an [`ExecResult`].

use std::ffi::CString;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use dsh_shell_api::{codes, ExecRequest, ExecResult, DEFAULT_OUTPUT_LIMIT, DEFAULT_TIMEOUT_MS};

use dsh_sandbox::egress::{Connection, NO_PROXY, PROXY_URL, PROXY_VARIABLES};

use crate::child::{self, ChildPlan, Stage};
use crate::confine::{ConfineError, Confinement};
use crate::env::EnvPolicy;
use crate::proxy::Proxy;

/// What a backend does for the network proxy of a command under an allowlist.
pub trait Network {
    /// Whether a person approves `host:port` for the rest of the session (the allowlist's
    /// `ask`). Called on the thread that called [`run_with`], so the host's context of
    /// the call applies; the command waits meanwhile.
    fn approve(&mut self, host: &str, port: u16) -> bool;
    /// The proxy's decisions, once the command is over.
    fn record(&mut self, connections: Vec<Connection>);
}

/// No one to ask and nowhere to record (decisions are still logged at debug).
struct Unattended;

impl Network for Unattended {
    fn approve(&mut self, _host: &str, _port: u16) -> bool {
        false
    }
    fn record(&mut self, _connections: Vec<Connection>) {}
}

/// How long the supervisor may take to kill the command and exit after it was told to, and
/// then how long the pipes may stay open, before the host kills the supervisor's group and
/// abandons the readers.
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

/// `bash` on the host's PATH (`/bin/bash` if none is found), resolved once: the command's
/// own environment may have no PATH.
fn bash() -> &'static Path {
    static BASH: OnceLock<PathBuf> = OnceLock::new();
    BASH.get_or_init(|| {
        std::env::var_os("PATH")
            .iter()
            .flat_map(std::env::split_paths)
            .map(|dir| dir.join("bash"))
            .find(|p| p.is_absolute() && p.is_file())
            .unwrap_or_else(|| PathBuf::from("/bin/bash"))
    })
}

pub(crate) fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [-1; 2];
    // SAFETY: `fds` is a valid array of two descriptors for the kernel to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// A unix socket pair (`SOCK_SEQPACKET`, close-on-exec): the host's end and the child's.
fn socket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [-1; 2];
    // SAFETY: `fds` is a valid array of two descriptors for the kernel to fill.
    let ret = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Whether the call's cancel descriptor says "cancelled" (readable or at end of file).
/// An invalid descriptor is never cancelled.
fn is_cancelled(fd: Option<RawFd>) -> bool {
    let Some(fd) = fd else { return false };
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no waiting.
    let n = unsafe { libc::poll(&mut pfd, 1, 0) };
    n > 0 && pfd.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0
}

fn valid_fd(fd: RawFd) -> bool {
    // SAFETY: F_GETFD only reads the descriptor's flags.
    fd >= 0 && unsafe { libc::fcntl(fd, libc::F_GETFD) } != -1
}

/// Runs `request` to completion, timeout or cancellation, with the environment `env`
/// builds from the host's. Every process the command starts is gone when this returns.
/// With `confinement`, the command runs in its own namespaces under Landlock and seccomp
/// (see [`crate::confine`]); no host thread is ever confined. The result's `mode` and
/// `sandbox_denied` are left for the backend to fill in.
pub fn run(
    request: &ExecRequest,
    confinement: Option<Confinement>,
    env: &EnvPolicy,
) -> Result<ExecResult, RunError> {
    run_with(request, confinement, env, &mut Unattended)
}

/// [`run`], with `network` answering the allowlist's approvals and keeping the proxy's
/// decisions (a confinement with a network allowlist only).
pub fn run_with(
    request: &ExecRequest,
    confinement: Option<Confinement>,
    env: &EnvPolicy,
    network: &mut dyn Network,
) -> Result<ExecResult, RunError> {
    if !request.cwd.is_absolute() || !request.cwd.is_dir() {
        return Err(RunError::BadCwd {
            cwd: request.cwd.clone(),
        });
    }
    let timeout = Duration::from_millis(request.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS));
    let limit = request.output_limit.unwrap_or(DEFAULT_OUTPUT_LIMIT);
    let cancel = request.cancel_fd.filter(|fd| valid_fd(*fd));
    if is_cancelled(cancel) {
        return Ok(ExecResult {
            cancelled: true,
            ..ExecResult::default()
        });
    }
    let spawn_err = |source| RunError::Spawn {
        cwd: request.cwd.clone(),
        source,
    };

    let mut cmd = Command::new(bash());
    cmd.arg("-c")
        .arg(&request.command)
        .current_dir(&request.cwd)
        .env_clear()
        .envs(env.apply(std::env::vars_os()));
    let rules = confinement.as_ref().and_then(|c| c.egress.clone());
    if rules.is_some() {
        // The proxy is the one way out of the command's network namespace; these point
        // its tools at it (a tool that ignores them reaches nothing).
        cmd.envs(PROXY_VARIABLES.map(|k| (k, PROXY_URL)))
            .envs([("NO_PROXY", NO_PROXY), ("no_proxy", NO_PROXY)]);
    }
    cmd.envs(request.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let (control_rd, control_wr) = pipe().map_err(spawn_err)?;
    let (report_rd, report_wr) = pipe().map_err(spawn_err)?;
    let (status_rd, status_wr) = pipe().map_err(spawn_err)?;
    let egress = match rules {
        Some(_) => Some(socket_pair().map_err(spawn_err)?),
        None => None,
    };
    let (sandbox, limits) = match confinement {
        None => (None, None),
        Some(Confinement {
            mut spec, limits, ..
        }) => {
            spec.cwd = CString::new(request.cwd.as_os_str().as_bytes()).map_err(|_| {
                ConfineError::BadPath {
                    path: request.cwd.clone(),
                }
            })?;
            (Some(spec), Some(limits))
        }
    };
    let plan = ChildPlan {
        control: control_rd.as_raw_fd(),
        cancel,
        report: report_wr.as_raw_fd(),
        status: status_wr.as_raw_fd(),
        sandbox,
        limits: limits.as_ref().map(|l| l.child(timeout)),
        egress: egress.as_ref().map_or(-1, |(_, child)| child.as_raw_fd()),
    };
    // SAFETY: `supervise` only makes async-signal-safe system calls on data built before
    // the fork; the descriptors it names stay open until `spawn` returns.
    unsafe { cmd.pre_exec(move || child::supervise(&plan)) };
    let started = Instant::now();
    let spawned = cmd.spawn();
    // The plan (with the Landlock ruleset) and the child's pipe ends are not the host's.
    drop(cmd);
    drop(control_rd);
    drop(report_wr);
    drop(status_wr);
    let egress = egress.map(|(host, _child)| host);
    let mut child = spawned.map_err(spawn_err)?;
    if let Some((stage, errno)) = read_report(report_rd) {
        let _ = child.wait();
        return Err(match stage {
            Some(stage) => RunError::Sandbox(ConfineError::Setup {
                stage,
                source: io::Error::from_raw_os_error(errno),
            }),
            None => spawn_err(io::Error::from_raw_os_error(errno)),
        });
    }
    let (tx, rx) = mpsc::channel();
    let proxy = match (egress, rules) {
        (Some(channel), Some(rules)) => {
            let asks = Mutex::new(tx.clone());
            let asker: crate::proxy::Asker = Box::new(move |host: &str, port: u16| {
                let (reply, answer) = mpsc::channel();
                let sent = asks
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .send(Done::Ask {
                        host: host.to_string(),
                        port,
                        reply,
                    });
                sent.is_ok() && answer.recv().unwrap_or(false)
            });
            let served = crate::proxy::receive_listener(&channel)
                .and_then(|listener| Proxy::serve(listener, rules, Some(asker)));
            match served {
                Ok(proxy) => Some(proxy),
                Err(source) => {
                    kill_group(child.id());
                    let _ = child.wait();
                    return Err(RunError::Sandbox(ConfineError::Setup {
                        stage: Stage::Proxy,
                        source,
                    }));
                }
            }
        }
        _ => None,
    };
    let progress = request.progress_fd.filter(|fd| valid_fd(*fd));
    let result = supervise(
        child,
        (tx, rx),
        control_wr,
        status_rd,
        started + timeout,
        limit,
        progress,
        network,
    );
    if let Some(proxy) = proxy {
        network.record(proxy.finish());
    }
    let mut result = result?;
    // Cancelled only if it was cut short: a command that finished as the cancellation came
    // in reports how it finished.
    result.cancelled =
        !result.timed_out && result.signal == Some(libc::SIGKILL) && is_cancelled(cancel);
    result.limit_reached = limits.and_then(|l| l.reached(result.signal, result.exit_code));
    Ok(result)
}

/// Reads the report pipe to its end (the shell's `exec` closes it): a setup failure's
/// stage and errno, if one was written.
pub(crate) fn read_report(fd: OwnedFd) -> Option<(Option<Stage>, i32)> {
    let mut file = std::fs::File::from(fd);
    let mut record = Vec::with_capacity(8);
    let _ = file.read_to_end(&mut record);
    if record.len() < 8 {
        return None;
    }
    let stage = u32::from_ne_bytes(record[..4].try_into().expect("4 bytes"));
    let errno = i32::from_ne_bytes(record[4..8].try_into().expect("4 bytes"));
    Some((Stage::from_u32(stage), errno))
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
    /// The proxy asks whether a person approves an unlisted host.
    Ask {
        host: String,
        port: u16,
        reply: Sender<bool>,
    },
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

/// How often a running command reports its output so far to a progress descriptor.
const PROGRESS_EVERY: Duration = Duration::from_millis(1000);

fn captured(capture: &Mutex<Capture>) -> u64 {
    capture.lock().unwrap_or_else(|e| e.into_inner()).total
}

fn kill_group(pgid: u32) {
    // SAFETY: plain system calls. The group id is the supervisor's pid (it called setsid),
    // and it cannot be reused while the supervisor is unreaped.
    unsafe {
        libc::kill(-(pgid as libc::pid_t), libc::SIGKILL);
        libc::kill(pgid as libc::pid_t, libc::SIGKILL);
    }
}

/// Waits for the supervisor and both pipes until `deadline`; then closes the control pipe
/// (the supervisor kills everything and exits), and if that does not end it within
/// [`KILL_GRACE`], kills the supervisor's process group.
#[allow(clippy::too_many_arguments)]
fn supervise(
    mut child: Child,
    (tx, rx): (Sender<Done>, mpsc::Receiver<Done>),
    control: OwnedFd,
    status: OwnedFd,
    deadline: Instant,
    limit: u64,
    progress: Option<RawFd>,
    network: &mut dyn Network,
) -> Result<ExecResult, RunError> {
    let pgid = child.id();
    let mut control = Some(control);
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
            // The supervisor's report of the command's status comes before its own exit
            // (the teardown of its namespaces); without one, its own exit status.
            let mut raw = [0u8; 4];
            let mut status = std::fs::File::from(status);
            if status.read_exact(&mut raw).is_ok() {
                let reported = ExitStatus::from_raw(i32::from_ne_bytes(raw));
                let _ = t.send(Done::Exited(Ok(reported)));
                let _ = child.wait();
            } else {
                let _ = t.send(Done::Exited(child.wait()));
            }
        }),
    )?;
    pending += 1;

    let mut status: Option<ExitStatus> = None;
    let mut timed_out = false;
    let mut forced = false;
    let mut until = deadline;
    let mut next_report = Instant::now() + PROGRESS_EVERY;
    let mut reported = 0;
    while pending > 0 {
        let now = Instant::now();
        let wake = match progress {
            Some(_) => until.min(next_report),
            None => until,
        };
        match rx.recv_timeout(wake.saturating_duration_since(now)) {
            Err(RecvTimeoutError::Timeout) if Instant::now() < until => {
                // A progress tick: report the output so far when it grew.
                next_report = Instant::now() + PROGRESS_EVERY;
                let total = captured(&out) + captured(&err);
                if let Some(fd) = progress.filter(|_| total != reported) {
                    reported = total;
                    cordis_sdk::report_progress(
                        fd,
                        &cordis_sdk::Progress {
                            output_bytes: Some(total),
                            message: None,
                        },
                    );
                }
            }
            Ok(Done::Stream) => pending -= 1,
            Ok(Done::Ask { host, port, reply }) => {
                let _ = reply.send(network.approve(&host, port));
            }
            Ok(Done::Exited(s)) => {
                pending -= 1;
                status = s.ok();
            }
            Err(RecvTimeoutError::Timeout) if control.is_some() => {
                timed_out = true;
                control = None;
                until = Instant::now() + KILL_GRACE;
            }
            Err(RecvTimeoutError::Timeout) if !forced => {
                forced = true;
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
        cancelled: false,
        sandbox_denied: false,
        mode: None,
        limit_reached: None,
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
            cancel_fd: None,
            progress_fd: None,
        }
    }

    #[test]
    fn runs_in_cwd_with_env_and_null_stdin_and_reports_exit_and_signal() {
        let dir = tempfile::tempdir().unwrap();
        let cwd = dir.path().canonicalize().unwrap();
        let r = run(
            &request("pwd; echo $DSH_TEST_VAR; cat; echo err >&2; exit 3", &cwd),
            None,
            &EnvPolicy::default(),
        )
        .unwrap();
        assert_eq!(r.stdout, format!("{}\nfrom-env\n", cwd.display()));
        assert_eq!(
            (r.stderr.as_str(), r.exit_code, r.signal),
            ("err\n", Some(3), None)
        );
        let r = run(&request("kill -TERM $$", &cwd), None, &EnvPolicy::default()).unwrap();
        assert_eq!((r.exit_code, r.signal), (None, Some(libc::SIGTERM)));
        let err = run(
            &request("true", std::path::Path::new("relative")),
            None,
            &EnvPolicy::default(),
        )
        .unwrap_err();
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
            &EnvPolicy::default(),
        )
        .unwrap();
        // SAFETY: closing the descriptor opened above.
        unsafe { libc::close(fd) };
        let fds: Vec<&str> = r.stdout.lines().collect();
        // 0, 1, 2 and the directory `ls` opens to list.
        assert_eq!(fds, ["0", "1", "2", "3"], "{r:?}");
    }

    #[test]
    fn a_call_cancelled_before_it_starts_runs_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (rd, wr) = pipe().unwrap();
        drop(wr);
        let mut req = request("touch ran", dir.path());
        req.cancel_fd = Some(rd.as_raw_fd());
        let r = run(&req, None, &EnvPolicy::default()).unwrap();
        assert!(r.cancelled && r.exit_code.is_none(), "{r:?}");
        assert!(!dir.path().join("ran").exists());
        // A descriptor that is not open is no cancellation: the command runs.
        req.cancel_fd = Some(-1);
        let r = run(&req, None, &EnvPolicy::default()).unwrap();
        assert!(!r.cancelled && r.exit_code == Some(0), "{r:?}");
        assert!(dir.path().join("ran").exists());
    }

    #[test]
    fn cap_keeps_draining_and_says_so() {
        let mut req = request(
            "head -c 3000000 /dev/zero | tr '\\0' a; echo done >&2",
            std::path::Path::new("/"),
        );
        req.output_limit = Some(1000);
        let r = run(&req, None, &EnvPolicy::default()).unwrap();
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
        let r = run(&req, None, &EnvPolicy::default()).unwrap();
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
