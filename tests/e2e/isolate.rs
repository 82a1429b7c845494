//! Isolated entries (`isolate: process`): a plugin that aborts, segfaults, exits or hangs
//! costs only its own calls — the host (here the test process itself, driving the real
//! `Runtime` with the `cordis` binary as the isolated processes) keeps serving every other
//! entry and session, the entry restarts on its own, and a consumer of its service
//! recovers; the same plugin in-process takes the whole host down.

use std::os::fd::AsRawFd as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cordis_e2e::{eventually, Scratch};
use cordis_engine::Runtime;
use cordis_sdk::{CallContext, SessionInfo, ToolResult};
use serde_json::{json, Value};

/// The crashing fixture isolated (a short `callTimeout`), a consumer of its `greeter`
/// in-process, and the bundled confined shell with its policy owner.
fn compose(s: &Scratch, timeout: &str) -> Arc<Runtime> {
    runtime_of(
        s,
        &format!(
            "- name: dsh-sandbox-policy\n  config:\n    mode: workspace-write\n\
             - name: dsh-fs-sandbox\n- name: dsh-bash-sandbox\n- name: dsh-tool-bash\n\
             - name: fixture-crashy\n  isolate: process\n  callTimeout: {timeout}\n\
             - name: fixture-greeter-consumer\n"
        ),
    )
}

/// `manifest` applied with isolation, the plugins directory created first (searched
/// first, so protected; a command could create it if it were absent).
fn runtime_of(s: &Scratch, manifest: &str) -> Arc<Runtime> {
    s.manifest(manifest);
    std::fs::create_dir_all(s.path().join("plugins")).expect("plugins dir");
    s.runtime_isolated()
}

/// Another session's command that runs across whatever the test does meanwhile.
fn command_across(rt: &Arc<Runtime>, other: &SessionInfo) -> std::thread::JoinHandle<ToolResult> {
    let (rt, other) = (rt.clone(), other.clone());
    std::thread::spawn(move || {
        call_in(
            &rt,
            &other,
            "bash",
            json!({"command": "sleep 1; echo survived"}),
        )
    })
}

fn call_in(rt: &Runtime, session: &SessionInfo, tool: &str, args: Value) -> ToolResult {
    call_with(rt, session, tool, args, None)
}

fn call_with(
    rt: &Runtime,
    session: &SessionInfo,
    tool: &str,
    args: Value,
    cancel_fd: Option<i32>,
) -> ToolResult {
    use std::sync::atomic::{AtomicU64, Ordering};
    static CALLS: AtomicU64 = AtomicU64::new(0);
    rt.call_tool(
        tool,
        &CallContext {
            session: session.clone(),
            call_id: format!("isolate-{}", CALLS.fetch_add(1, Ordering::Relaxed)),
            cancel_fd,
            progress_fd: None,
        },
        &args,
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

/// The pid serving the fixture, once it serves again.
fn serving_pid(rt: &Runtime, session: &SessionInfo) -> u32 {
    eventually("the isolated entry serves", Duration::from_secs(20), || {
        let r = call_in(rt, session, "pid", json!({}));
        if r.is_error {
            return Err(r.text);
        }
        r.text
            .parse::<u32>()
            .map_err(|e| format!("{e}: {}", r.text))
    })
}

#[test]
fn a_crashing_isolated_entry_costs_only_its_own_calls_and_restarts() {
    let s = Scratch::new();
    let rt = compose(&s, "30s");
    let session = rt.sessions().create(&s.path()).expect("session");
    let other = rt.sessions().create(&s.path()).expect("another session");
    let first = serving_pid(&rt, &session);
    assert_ne!(
        first,
        std::process::id(),
        "the entry runs in a process of its own"
    );
    assert!(
        call_in(&rt, &session, "greet-via-service", json!({"name": "Ada"}))
            .text
            .starts_with(&format!("crashy greets Ada from {first}"))
    );

    for (how, exit) in [
        ("abort", "was killed by signal 6 (SIGABRT)"),
        ("segv", "was killed by signal 11 (SIGSEGV)"),
        ("exit", "exited with status 3"),
    ] {
        let before = serving_pid(&rt, &session);
        // Another session's command runs across the crash.
        let shell = command_across(&rt, &other);
        std::thread::sleep(Duration::from_millis(200));
        let crashed = call_in(&rt, &session, "crash", json!({ "how": how }));
        assert!(crashed.is_error, "{how}: {}", crashed.text);
        assert!(
            crashed.text.contains("isolated entry `fixture-crashy`")
                && crashed.text.contains(exit)
                && crashed.text.contains("[PLUGIN_CRASHED]"),
            "{how}: {}",
            crashed.text
        );
        let bash = shell.join().expect("the shell call");
        assert!(
            !bash.is_error && bash.text.contains("survived"),
            "{}",
            bash.text
        );
        let after = serving_pid(&rt, &session);
        assert_ne!(after, before, "{how}: a new process serves the entry");
        // The consumer of its service recovers without being restarted.
        let greeted = call_in(&rt, &other, "greet-via-service", json!({"name": "Grace"}));
        assert_eq!(
            greeted.text,
            format!("crashy greets Grace from {after} in session {}", other.id)
        );
    }

    // A crash inside a service call reaches the consumer as an error, then it recovers.
    let through = call_in(&rt, &session, "greet-via-service", json!({"name": "abort"}));
    assert!(
        through.is_error
            && through.text.contains("[PLUGIN_CRASHED]")
            && through.text.contains("SIGABRT"),
        "{}",
        through.text
    );
    let pid = serving_pid(&rt, &session);
    assert_eq!(
        call_in(&rt, &session, "greet-via-service", json!({"name": "Ada"})).text,
        format!("crashy greets Ada from {pid} in session {}", session.id)
    );
    let status = rt
        .inspect(|c| c.registry().isolation("fixture-crashy"))
        .expect("isolated");
    assert_eq!(status.pid, Some(pid));
    assert_eq!(status.restarts, 4);
    assert_eq!(
        status.last_exit.as_deref(),
        Some("was killed by signal 6 (SIGABRT)")
    );
    rt.shutdown();
}

#[test]
fn a_hung_isolated_call_times_out_and_a_cancelled_one_is_stopped() {
    let s = Scratch::new();
    let rt = compose(&s, "4s");
    let session = rt.sessions().create(&s.path()).expect("session");
    let first = serving_pid(&rt, &session);

    let started = Instant::now();
    let hung = call_in(&rt, &session, "crash", json!({"how": "spin"}));
    let took = started.elapsed();
    assert!(
        hung.is_error
            && hung
                .text
                .contains("did not answer a call of tool `crash` within its callTimeout (4 s)")
            && hung.text.contains("[PLUGIN_TIMEOUT]"),
        "{}",
        hung.text
    );
    assert!(
        took >= Duration::from_secs(4) && took < Duration::from_secs(12),
        "{took:?}"
    );
    let second = serving_pid(&rt, &session);
    assert_ne!(second, first);

    // Cancelled (the call's cancel descriptor reaches end of file) and still sleeping:
    // its process is killed after the grace period (2 s), before the call timeout.
    let (read, write) = std::io::pipe().expect("pipe");
    let canceller = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        drop(write);
    });
    let started = Instant::now();
    let cancelled = call_with(
        &rt,
        &session,
        "sleep",
        json!({"ms": 600_000}),
        Some(read.as_raw_fd()),
    );
    canceller.join().unwrap();
    assert!(
        cancelled.is_error && cancelled.text.contains("[PLUGIN_CANCELLED]"),
        "{}",
        cancelled.text
    );
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(4),
        "{took:?}"
    );
    drop(read);
    assert_ne!(serving_pid(&rt, &session), second);
    rt.shutdown();
}

/// Editing the isolated entry's `callTimeout` restarts it on a new process; calls running
/// on the old one finish there, and no call fails.
#[test]
fn reloading_an_isolated_entry_under_concurrent_calls_fails_no_call() {
    let s = Scratch::new();
    let rt = compose(&s, "30s");
    let session = rt.sessions().create(&s.path()).expect("session");
    let first = serving_pid(&rt, &session);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let callers: Vec<_> = (0..3)
        .map(|_| {
            let (rt, session, stop) = (rt.clone(), session.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut calls = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let r = call_in(&rt, &session, "sleep", json!({"ms": 30}));
                    assert!(!r.is_error, "a call failed across the reload: {}", r.text);
                    calls += 1;
                }
                calls
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let manifest = std::fs::read_to_string(s.path().join("cordis.yml")).unwrap();
    s.manifest(&manifest.replace("callTimeout: 30s", "callTimeout: 40s"));
    let report = rt.reload().unwrap_or_else(|e| panic!("{e}"));
    assert!(
        report
            .restarted
            .iter()
            .any(|(id, _, _)| id == "fixture-crashy"),
        "{report:?}"
    );
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for caller in callers {
        assert!(caller.join().expect("no caller panicked") > 0);
    }
    assert_ne!(serving_pid(&rt, &session), first);
    rt.shutdown();
}

/// Without `isolate`, the same crash takes the whole host down: `cordis call` dies by the
/// plugin's signal (documented in README).
#[test]
fn in_process_the_same_crash_kills_the_host() {
    use std::os::unix::process::ExitStatusExt as _;
    let s = Scratch::new();
    s.manifest("- name: fixture-crashy\n");
    let run = s.run(&["call", "crash", r#"{"how": "abort"}"#]);
    assert_eq!(run.output.status.signal(), Some(6), "{}", run.stderr());
    s.manifest("- name: fixture-crashy\n  isolate: process\n");
    s.run(&["call", "crash", r#"{"how": "abort"}"#])
        .expect_code(1)
        .expect_output(&["was killed by signal 6 (SIGABRT)", "[PLUGIN_CRASHED]"]);
}

/// `isolate` and `callTimeout` are checked like every other key.
#[test]
fn malformed_isolation_keys_are_refused_by_check() {
    let s = Scratch::new();
    s.manifest(
        "- name: fixture-crashy\n  isolate: thread\n\
         - name: cordis-example\n  callTimeout: 5s\n\
         - name: fixture-greeter-consumer\n  isolate: process\n  callTimeout: soon\n\
         - name: fixture-reload\n  memoryMib: 64\n\
         - name: fixture-greeter-v2\n  isolate: process\n  memoryMib: 8\n",
    );
    s.run(&["check"]).expect_code(1).expect_output(&[
        "`isolate` must be `process` or `none`, found `thread`",
        "`callTimeout` applies only to an entry with `isolate: process`",
        "`soon` is not a duration",
        "`memoryMib` applies only to an entry with `isolate: process`",
        "`memoryMib` must be a whole number of MiB, at least 16, found 8",
    ]);
    // A good one is shown.
    s.manifest("- name: fixture-crashy\n  isolate: process\n  memoryMib: 256\n");
    s.run(&["check"])
        .expect_code(0)
        .expect_output(&["isolated in its own process (callTimeout 900s; memory 256 MiB; "]);
}

/// An isolated consumer injects an in-process provider's service (the other direction).
#[test]
fn an_isolated_consumer_injects_an_in_process_service() {
    let s = Scratch::new();
    s.manifest(
        "- name: cordis-example\n  config:\n    word: hello\n\
         - name: fixture-greeter-consumer\n  isolate: process\n",
    );
    let rt = s.runtime_isolated();
    let session = rt.sessions().create(&s.path()).expect("session");
    assert_eq!(
        call_in(&rt, &session, "greet-via-service", json!({"name": "Ada"})),
        ToolResult::ok("hello, Ada")
    );
    let status = rt
        .inspect(|c| c.registry().isolation("fixture-greeter-consumer"))
        .expect("isolated");
    assert!(
        status.pid.is_some_and(|p| p != std::process::id()),
        "{status:?}"
    );
    assert_eq!(
        rt.inspect(|c| c.registry().isolation("cordis-example")),
        None
    );
    rt.shutdown();
}

/// Over MCP, a real `cordis run` answers the crashing call with an error result and keeps
/// serving: the entry's next call succeeds on a new process, which `cordis services` shows.
#[test]
fn cordis_run_over_mcp_survives_an_isolated_crash() {
    let s = Scratch::new();
    s.manifest("- name: fixture-crashy\n  isolate: process\n");
    let mut mcp = cordis_e2e::McpStdio::start(s.cordis(&["run"]));
    let (is_error, first) = mcp.call("pid", json!({}));
    assert!(!is_error, "{first}");
    let (is_error, crashed) = mcp.call("crash", json!({"how": "segv"}));
    assert!(is_error && crashed.contains("SIGSEGV"), "{crashed}");
    let again = eventually(
        "the entry serves again",
        Duration::from_secs(20),
        || match mcp.call("pid", json!({})) {
            (false, pid) => Ok(pid),
            (true, text) => Err(text),
        },
    );
    assert_ne!(again, first);
    // `cordis services` shows the running host's process, restarts and last exit.
    let want = format!(
        "isolated: pid {again}, restarts 1, last process was killed by signal 11 (SIGSEGV)"
    );
    eventually(
        "cordis services shows the restart",
        Duration::from_secs(20),
        || {
            let out = s.run(&["services"]);
            out.expect_code(0);
            let stdout = out.stdout();
            let running = &stdout[stdout.find("running:").ok_or_else(|| stdout.clone())?..];
            if running.contains(&want) {
                Ok(())
            } else {
                Err(running.to_string())
            }
        },
    );
}

/// An isolated process whose plugin declares no needs writes no file, reaches no network
/// (no TCP, no unix socket of the host's by its path), does not see the host's secrets and inherits no descriptor of the host's; the same plugin in-process does all three (so the
/// test can fail). A plugin that needs writes (`dsh-fs-sandbox`) keeps them when isolated.
#[test]
fn an_isolated_process_cannot_write_a_file_open_a_socket_or_read_the_hosts_secrets() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    let port = listener.local_addr().unwrap().port();
    let (inside, s) = (Scratch::new(), Scratch::new());
    let target = s.path().join("planted.txt");
    // A service of the host's reachable by path (as a container engine's or a desktop
    // bus's socket is): no network namespace keeps a connection to it out.
    let socket = s.path().join("service.sock");
    let _service = std::os::unix::net::UnixListener::bind(&socket).expect("bind a unix socket");
    let probe = |rt: &Runtime, session: &SessionInfo| {
        let unix = call_in(
            rt,
            session,
            "unix",
            json!({"path": socket.display().to_string()}),
        );
        (
            call_in(
                rt,
                session,
                "touch",
                json!({"path": target.display().to_string()}),
            ),
            (
                call_in(rt, session, "connect", json!({ "port": port })),
                unix,
            ),
            // Set in the test's (the host's) environment by the test runner.
            call_in(rt, session, "env", json!({"name": "CARGO_MANIFEST_DIR"})),
        )
    };

    inside.manifest("- name: fixture-crashy\n");
    let rt = inside.runtime_isolated();
    let session = rt.sessions().create(&inside.path()).expect("session");
    let (touched, (connected, unix), secret) = probe(&rt, &session);
    assert_eq!(touched.text, "written", "in-process, the plugin writes");
    assert_eq!(
        connected.text, "connected",
        "in-process, the plugin connects"
    );
    assert_eq!(
        unix.text, "connected",
        "in-process, the plugin reaches the socket"
    );
    assert_eq!(secret.text, env!("CARGO_MANIFEST_DIR"));
    // A descriptor the host holds without close-on-exec (as a careless plugin could).
    let (pipe, _writer) = std::io::pipe().expect("pipe");
    // SAFETY: duplicates a descriptor this test owns to a new one, 100 or above, without
    // close-on-exec (`F_DUPFD`); it is closed below.
    let fd = unsafe { libc::fcntl(pipe.as_raw_fd(), libc::F_DUPFD, 100) };
    assert!(fd >= 100, "{}", std::io::Error::last_os_error());
    let open_here = call_in(&rt, &session, "fds", json!({})).text;
    assert!(
        open_here.contains(&format!(" {fd},")) || open_here.contains(&format!(" {fd}]")),
        "{open_here}"
    );
    rt.shutdown();
    std::fs::remove_file(&target).unwrap();

    s.manifest(
        "- name: fixture-crashy\n  isolate: process\n\
         - name: dsh-sandbox-policy\n  config:\n    mode: workspace-write\n\
         - name: dsh-fs-sandbox\n  isolate: process\n- name: dsh-tool-fs\n  isolate: process\n",
    );
    s.run(&["check"]).expect_code(0).expect_output(&[
        "isolated in its own process (callTimeout 900s; no file writes, no network, no access to other processes, a scrubbed environment)",
    ]);
    let rt = s.runtime_isolated();
    let session = rt.sessions().create(&s.path()).expect("session");
    let (touched, (connected, unix), secret) = probe(&rt, &session);
    assert!(
        touched.is_error && touched.text.contains("Permission denied"),
        "{}",
        touched.text
    );
    assert!(!target.exists());
    assert!(connected.is_error, "{}", connected.text);
    assert!(
        unix.is_error && unix.text.contains("Permission denied"),
        "{}",
        unix.text
    );
    assert_eq!(secret.text, "<unset>");
    let open_there: Vec<i32> =
        serde_json::from_str(&call_in(&rt, &session, "fds", json!({})).text).expect("a list");
    assert!(
        !open_there.contains(&fd),
        "{open_there:?} holds the host's {fd}"
    );
    // SAFETY: `fd` was made above and nothing else uses it.
    unsafe { libc::close(fd) };
    // The fenced filesystem declares that it writes files: isolated, it still does, for a
    // tool that is itself confined.
    let written = call_in(
        &rt,
        &session,
        "write",
        json!({"path": "through-fs.txt", "content": "ok\n"}),
    );
    assert!(!written.is_error, "{}", written.text);
    assert_eq!(
        std::fs::read_to_string(s.path().join("through-fs.txt")).unwrap(),
        "ok\n"
    );
    rt.shutdown();
}

/// The call context travels with every nested service call and the host sets it: a
/// provider learns the calling session (in-process and isolated alike), and an isolated
/// plugin cannot act for another session, resolve a wider mode nobody approved, or hand
/// the fenced backend a policy it made up; in-process, the same plugin's made-up policy is
/// trusted (it is native code in the host), but another session is still refused.
#[test]
fn the_call_context_reaches_providers_and_an_isolated_plugin_cannot_act_for_another_session() {
    for isolated in [true, false] {
        let s = Scratch::new();
        // Without `isolate`, the same runtime applies the fixture in-process.
        let rt = runtime_of(
            &s,
            &format!(
                "- name: dsh-sandbox-policy\n  config:\n    mode: workspace-write\n    network: {{ask: true}}\n\
                 - name: dsh-fs-sandbox\n\
                 - name: fixture-crashy\n{}\
                 - name: fixture-greeter-consumer\n",
                if isolated { "  isolate: process\n" } else { "" }
            ),
        );
        let (dir_a, dir_b) = (s.path().join("a"), s.path().join("b"));
        for d in [&dir_a, &dir_b] {
            std::fs::create_dir_all(d).expect("session dir");
        }
        let a = rt.sessions().create(&dir_a).expect("session a");
        let b = rt.sessions().create(&dir_b).expect("session b");

        // A provider (the greeter) learns which session calls it through a consumer.
        for session in [&a, &b] {
            let r = call_in(&rt, session, "greet-via-service", json!({"name": "Ada"}));
            assert!(
                r.text.ends_with(&format!("in session {}", session.id)),
                "isolated {isolated}: {}",
                r.text
            );
        }
        let whoami: Value =
            serde_json::from_str(&call_in(&rt, &a, "whoami", json!({})).text).expect("json");
        assert_eq!(whoami["session"], a.id.as_str(), "{whoami}");
        assert!(whoami["call_id"]
            .as_str()
            .is_some_and(|c| c.starts_with("isolate-")));
        assert_eq!(
            whoami["crossed"].as_bool().unwrap_or(false),
            isolated,
            "{whoami}"
        );
        assert_eq!(whoami["deadline_ms"].is_u64(), isolated, "{whoami}");

        let b_events = rt.sessions().events(&b.id, None).expect("events of b");
        let outside = dir_b.join("claimed.txt");
        let claim = call_in(
            &rt,
            &a,
            "claim",
            json!({"session": b.id, "outside": outside.display().to_string()}),
        );
        assert!(!claim.is_error, "{}", claim.text);
        let claim: Value = serde_json::from_str(&claim.text).expect("json");
        for attempt in [
            "events_other",
            "append_other",
            "set_mode_other",
            "resolve_other",
            "approve_host_other",
        ] {
            assert_eq!(claim[attempt], "SESSION_NOT_CALLING", "{attempt}: {claim}");
        }
        let approved_hosts = |id: &str| {
            rt.sessions()
                .events(id, Some("sandbox/network-approved"))
                .expect("events")
                .len()
        };
        assert_eq!(
            claim["resolve_calling_root"],
            dir_a
                .canonicalize()
                .expect("canonical")
                .display()
                .to_string(),
            "{claim}"
        );
        assert_eq!(claim["info_calling"], format!("ok: {:?}", a.id), "{claim}");
        assert_eq!(
            rt.sessions().events(&b.id, None).expect("events of b"),
            b_events,
            "nothing was written to the other session"
        );
        if isolated {
            for attempt in ["resolve_wider", "write_made_up", "approve_host"] {
                assert_eq!(claim[attempt], "SANDBOX_NOT_APPROVED", "{attempt}: {claim}");
            }
            assert_eq!(
                approved_hosts(&a.id),
                0,
                "an isolated entry approved a host itself"
            );
            assert!(!outside.exists(), "a made-up policy wrote outside the root");
            // A thread the plugin started itself is outside any session.
            assert_eq!(
                claim["info_calling_from_own_thread"], "SESSION_NOT_CALLING",
                "{claim}"
            );
        } else {
            assert!(
                claim["resolve_wider"]
                    .as_str()
                    .is_some_and(|r| r.starts_with("ok: ")),
                "{claim}"
            );
            assert!(
                claim["write_made_up"]
                    .as_str()
                    .is_some_and(|r| r.starts_with("ok: ")),
                "{claim}"
            );
            // In the host's process a plugin is trusted like the host.
            assert!(
                claim["approve_host"]
                    .as_str()
                    .is_some_and(|r| r.starts_with("ok: ")),
                "{claim}"
            );
            assert_eq!(approved_hosts(&a.id), 1);
            assert_eq!(
                std::fs::read_to_string(&outside).expect("written"),
                "claimed\n"
            );
            assert!(
                claim["info_calling_from_own_thread"]
                    .as_str()
                    .is_some_and(|r| r.starts_with("ok: ")),
                "{claim}"
            );
        }
        rt.shutdown();
    }
}

/// An isolated `dsh-tool-fs` escalates through the approval flow: the granted mode reaches
/// the in-process fenced backend (the host recorded it for the call), a refusal does not.
#[test]
fn an_isolated_tool_escalates_only_with_an_approval_the_host_saw() {
    let s = Scratch::new();
    let rt = runtime_of(
        &s,
        "- name: dsh-sandbox-policy\n  config:\n    mode: workspace-write\n\
         - name: dsh-fs-sandbox\n\
         - name: dsh-tool-fs\n  isolate: process\n",
    );
    let project = s.path().join("project");
    std::fs::create_dir_all(&project).expect("project");
    let session = rt.sessions().create(&project).expect("session");
    let outside = s.path().join("outside.txt");
    let write = || {
        call_in(
            &rt,
            &session,
            "write",
            json!({
                "path": outside.display().to_string(),
                "content": "escalated\n",
                "sandbox_permissions": "danger-full-access",
                "justification": "needed outside the project",
            }),
        )
    };
    rt.approvals()
        .answer_always(cordis_sdk::host::ApprovalOutcome::Rejected);
    let refused = write();
    assert!(refused.is_error, "{}", refused.text);
    assert!(!outside.exists());
    rt.approvals()
        .answer_always(cordis_sdk::host::ApprovalOutcome::Approved);
    let granted = write();
    assert!(
        !granted.is_error && granted.text.contains("approved for this call only"),
        "{}",
        granted.text
    );
    assert_eq!(
        std::fs::read_to_string(&outside).expect("written"),
        "escalated\n"
    );
    rt.shutdown();
}

/// A leak costs only its entry: with `memoryMib`, an isolated plugin that allocates without
/// bound ends (SIGABRT, the help naming the limit) and serves again after its restart;
/// another session's command runs across it.
#[test]
fn an_isolated_entry_over_its_memory_limit_ends_and_restarts() {
    let s = Scratch::new();
    let rt = runtime_of(
        &s,
        "- name: dsh-sandbox-policy\n  config:\n    mode: workspace-write\n\
         - name: dsh-bash-sandbox\n- name: dsh-tool-bash\n\
         - name: fixture-crashy\n  isolate: process\n  memoryMib: 128\n",
    );
    let session = rt.sessions().create(&s.path()).expect("session");
    let other = rt.sessions().create(&s.path()).expect("another session");
    let before = serving_pid(&rt, &session);
    let shell = command_across(&rt, &other);
    let leaked = call_in(&rt, &session, "crash", json!({"how": "alloc"}));
    assert!(
        leaked.is_error
            && leaked.text.contains("[PLUGIN_CRASHED]")
            && leaked.text.contains("SIGABRT")
            && leaked
                .text
                .contains("may allocate 128 MiB (`memoryMib` at cordis.yml line"),
        "{}",
        leaked.text
    );
    let bash = shell.join().expect("the shell call");
    assert!(
        !bash.is_error && bash.text.contains("survived"),
        "{}",
        bash.text
    );
    assert_ne!(serving_pid(&rt, &session), before, "a new process serves");
    rt.shutdown();
}

/// A plugin that fails at every start is left stopped after 5 failed starts in a row
/// (`PLUGIN_STOPPED`, saying why) until its config changes; the reload starts it again.
#[test]
fn an_entry_failing_every_restart_is_left_stopped_until_its_config_changes() {
    let s = Scratch::new();
    let flag = s.path().join("refuse");
    s.manifest(&format!(
        "- name: fixture-crashy\n  isolate: process\n  config:\n    refuseStartWhile: {}\n",
        flag.display()
    ));
    let rt = s.runtime_isolated();
    let session = rt.sessions().create(&s.path()).expect("session");
    serving_pid(&rt, &session);
    std::fs::write(&flag, "").expect("flag");
    let crashed = call_in(&rt, &session, "crash", json!({"how": "exit"}));
    assert!(
        crashed.text.contains("[PLUGIN_CRASHED]"),
        "{}",
        crashed.text
    );
    // Restarts after 0.5, 1, 2, 4 and 8 s each fail; then it is left stopped.
    let stopped = eventually("the entry is left stopped", Duration::from_secs(40), || {
        let status = rt
            .inspect(|c| c.registry().isolation("fixture-crashy"))
            .expect("isolated");
        status.stopped.clone().ok_or(format!("{status:?}"))
    });
    assert!(
        stopped.contains("failed to start 5 times in a row")
            && stopped.contains(&format!("refusing to start while {}", flag.display())),
        "{stopped}"
    );
    let refused = call_in(&rt, &session, "pid", json!({}));
    assert!(
        refused.is_error
            && refused.text.contains("[PLUGIN_STOPPED]")
            && refused
                .text
                .contains("is stopped: it failed to start 5 times"),
        "{}",
        refused.text
    );
    // The fix: the flag gone and the config changed; the reload starts it again.
    std::fs::remove_file(&flag).expect("remove flag");
    s.manifest(&format!(
        "- name: fixture-crashy\n  isolate: process\n  config:\n    refuseStartWhile: {}\n",
        s.path().join("absent").display()
    ));
    rt.reload().unwrap_or_else(|e| panic!("{e}"));
    serving_pid(&rt, &session);
    rt.shutdown();
}
