//! Hot reload: rebuilt plugin libraries (real `cargo build`s of `fixture-reload` with a
//! different behaviour baked in) and edited `cordis.yml` take effect in a running host,
//! transactionally; bad changes leave the running composition serving.
//! Most tests drive the real `Runtime` in-process; the last drives a real `cordis run`
//! with its file watcher over MCP.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cordis_e2e::{
    eventually, fixture_reload_build, reload_project, replace_file, McpStdio, Runtime,
};
use cordis_engine::{ReloadError, ReloadReport};
use cordis_sdk::{CallContext, SessionInfo};
use dsh_sandbox::{ResolveArgs, SandboxMode, SandboxPolicy, SandboxPolicyClient, SetModeArgs};

fn call(rt: &Runtime, session: &SessionInfo, tool: &str) -> String {
    call_with(rt, session, tool, serde_json::json!({}))
}

fn call_with(rt: &Runtime, session: &SessionInfo, tool: &str, args: serde_json::Value) -> String {
    let r = rt
        .call_tool(
            tool,
            &CallContext {
                session: session.clone(),
                call_id: "reload-test".into(),
                cancel_fd: None,
                progress_fd: None,
            },
            &args,
        )
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!r.is_error, "{tool}: {}", r.text);
    r.text
}

/// The ids of the entries a reload restarted, in order.
fn restarted_ids(report: &ReloadReport) -> Vec<&str> {
    report
        .restarted
        .iter()
        .map(|(id, _, _)| id.as_str())
        .collect()
}

const THREE: &str = "- name: fixture-reload\n  config:\n    greeting: hi\n- name: fixture-reload-consumer\n- name: cordis-example\n";

#[test]
fn a_rebuilt_library_restarts_it_and_its_dependents_and_nothing_else() {
    let (s, lib) = reload_project(1, THREE);
    let rt = s.runtime();
    let session = rt.sessions().create(&s.path()).expect("session");
    assert_eq!(
        call(&rt, &session, "reload-version"),
        "build 1, greeting hi"
    );

    replace_file(&fixture_reload_build(2), &lib);
    let report = rt.reload().expect("reload");
    let restarted = restarted_ids(&report);
    assert_eq!(
        restarted,
        ["fixture-reload", "fixture-reload-consumer"],
        "{report}"
    );
    let (_, old, new) = &report.restarted[0];
    assert!(
        new > old,
        "the rebuilt library is a new generation: {report}"
    );
    // The old generation left the process (nothing references it any more) and its
    // private copy is gone; the new one is mapped.
    let copy = |g: &u64| {
        format!(
            "/g{g}-{}",
            cordis_engine::library_file_name("fixture-reload")
        )
    };
    let maps = std::fs::read_to_string("/proc/self/maps").expect("read /proc/self/maps");
    assert!(
        !maps.contains(&copy(old)),
        "generation {old} is still mapped"
    );
    assert!(
        maps.contains(&copy(new)),
        "generation {new} is not mapped:\n{maps}"
    );
    let copies: Vec<String> = std::fs::read_dir(s.state_dir().join("run"))
        .expect("the copies directory")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !copies.iter().any(|c| format!("/{c}") == copy(old)),
        "the copy of generation {old} is left: {copies:?}"
    );
    assert!(
        report.added.is_empty() && report.removed.is_empty(),
        "{report}"
    );
    assert_eq!(
        call(&rt, &session, "reload-version"),
        "build 2, greeting hi"
    );
    assert_eq!(
        call(&rt, &session, "consumer-view"),
        "applied with [build 2, greeting hi], now [build 2, greeting hi]"
    );
    assert_eq!(
        call_with(&rt, &session, "greet", serde_json::json!({"name": "Ada"})),
        "hello, Ada",
        "the untouched example plugin still answers"
    );

    // Same bytes again: nothing to do.
    replace_file(&fixture_reload_build(2), &lib);
    assert!(rt.reload().expect("reload").is_empty());
    rt.shutdown();
}

#[test]
fn config_edits_are_taken_in_place_or_by_restart() {
    let manifest = |greeting: &str, in_place: bool| {
        format!("- name: fixture-reload\n  config:\n    greeting: {greeting}\n    inPlace: {in_place}\n- name: fixture-reload-consumer\n")
    };
    let (s, _lib) = reload_project(1, &manifest("a", true));
    let rt = s.runtime();
    let session = rt.sessions().create(&s.path()).expect("session");

    s.manifest(&manifest("b", true));
    let report = rt.reload().expect("reload");
    assert_eq!(report.reconfigured, ["fixture-reload"], "{report}");
    assert!(
        report.restarted.is_empty(),
        "in place means no restart: {report}"
    );
    assert_eq!(call(&rt, &session, "reload-version"), "build 1, greeting b");

    s.manifest(&manifest("c", false));
    let report = rt.reload().expect("reload");
    let restarted = restarted_ids(&report);
    assert_eq!(
        restarted,
        ["fixture-reload", "fixture-reload-consumer"],
        "{report}"
    );
    assert_eq!(call(&rt, &session, "reload-version"), "build 1, greeting c");
    rt.shutdown();
}

/// Every entry of the running composition: id, library generation and config.
fn running_entries(rt: &Runtime) -> Vec<(String, u64, serde_json::Value)> {
    rt.inspect(|c| {
        c.plan()
            .entries
            .iter()
            .map(|p| {
                (
                    p.entry.id.clone(),
                    p.library.generation,
                    p.entry.config.clone(),
                )
            })
            .collect()
    })
}

#[test]
fn a_failed_apply_also_undoes_the_configs_taken_in_place() {
    let manifest = |greeting: &str, faulty: bool| {
        format!(
            "- name: fixture-reload\n  config:\n    greeting: {greeting}\n    inPlace: true\n- name: fixture-reload-consumer\n{}",
            if faulty { "- name: fixture-faulty\n  config:\n    fail: error\n" } else { "" }
        )
    };
    let (s, _lib) = reload_project(1, &manifest("a", false));
    let rt = s.runtime();
    let session = rt.sessions().create(&s.path()).expect("session");
    let before = running_entries(&rt);

    // One reload takes the greeting in place, then fails to apply the added entry.
    s.manifest(&manifest("b", true));
    let err = rt.reload().expect_err("fixture-faulty refuses to start");
    match &err {
        ReloadError::Apply { error, rolled_back } => {
            assert!(*rolled_back, "{err}");
            assert!(error.to_string().contains("FIXTURE_FAILED"), "{err}");
        }
        other => panic!("expected an apply failure, got {other}"),
    }
    assert_eq!(
        call(&rt, &session, "reload-version"),
        "build 1, greeting a",
        "the in-place greeting must be undone"
    );
    assert_eq!(
        call(&rt, &session, "consumer-view"),
        "applied with [build 1, greeting a], now [build 1, greeting a]"
    );
    assert_eq!(running_entries(&rt), before);
    let tools: Vec<String> = rt.tools().into_iter().map(|t| t.name).collect();
    assert_eq!(tools, ["consumer-view", "reload-version"]);

    // Fixed, the same edit goes through in place.
    s.manifest(&manifest("b", false));
    let report = rt.reload().expect("reload");
    assert_eq!(report.reconfigured, ["fixture-reload"], "{report}");
    assert_eq!(call(&rt, &session, "reload-version"), "build 1, greeting b");
    rt.shutdown();
}

#[test]
fn disabling_disposes_an_entry_and_its_dependents_and_enabling_restores_them() {
    let manifest = |disabled: bool| {
        format!("- name: cordis-example\n- group: true\n  disabled: {disabled}\n  config:\n    - name: fixture-reload\n    - name: fixture-reload-consumer\n")
    };
    let (s, _lib) = reload_project(1, &manifest(false));
    let rt = s.runtime();
    let session = rt.sessions().create(&s.path()).expect("session");

    s.manifest(&manifest(true));
    let report = rt.reload().expect("reload");
    assert_eq!(
        report.removed,
        ["fixture-reload", "fixture-reload-consumer"],
        "{report}"
    );
    let tools: Vec<String> = rt.tools().into_iter().map(|t| t.name).collect();
    assert_eq!(tools, ["greet"]);
    assert!(report.tools_changed);

    s.manifest(&manifest(false));
    let report = rt.reload().expect("reload");
    assert_eq!(
        report.added,
        ["fixture-reload", "fixture-reload-consumer"],
        "{report}"
    );
    assert_eq!(
        call(&rt, &session, "consumer-view"),
        "applied with [build 1, greeting ], now [build 1, greeting ]"
    );
    rt.shutdown();
}

#[test]
fn bad_changes_keep_the_old_composition_serving_until_fixed() {
    let (s, lib) = reload_project(1, THREE);
    let rt = s.runtime();
    let session = rt.sessions().create(&s.path()).expect("session");
    let serving = |why: &str| {
        assert_eq!(
            call(&rt, &session, "reload-version"),
            "build 1, greeting hi",
            "after {why}"
        );
        assert!(
            call(&rt, &session, "consumer-view").contains("build 1"),
            "after {why}"
        );
    };

    s.manifest("- name: fixture-reload\n  config: [unclosed\n");
    let err = rt.reload().expect_err("a syntax error");
    assert!(
        matches!(err, ReloadError::Invalid(_)) && err.to_string().contains("yaml-syntax"),
        "{err}"
    );
    serving("a syntax error");

    // Seen between the truncation and the write of an in-place save.
    s.manifest("");
    let err = rt.reload().expect_err("an empty manifest");
    assert!(err.to_string().contains("manifest-empty"), "{err}");
    serving("an empty manifest");

    s.manifest("- name: fixture-reload-consumer\n- name: cordis-example\n");
    let err = rt.reload().expect_err("a missing dependency");
    assert!(
        err.to_string().contains("requires service `reloadable`"),
        "{err}"
    );
    serving("a missing dependency");

    let whole = std::fs::read(fixture_reload_build(2)).expect("read build");
    std::fs::write(&lib, &whole[..whole.len() / 2]).expect("truncate");
    s.manifest(THREE);
    let err = rt.reload().expect_err("a truncated library");
    assert!(err.to_string().contains("library-invalid"), "{err}");
    serving("a truncated library");

    replace_file(&fixture_reload_build(1), &lib);
    s.manifest("- name: fixture-reload\n  config:\n    greeting: hi\n    panic: true\n- name: fixture-reload-consumer\n- name: cordis-example\n");
    let err = rt.reload().expect_err("a panic in apply");
    match &err {
        ReloadError::Apply { error, rolled_back } => {
            assert!(*rolled_back, "{err}");
            assert!(error.to_string().contains("panicked"), "{err}");
        }
        other => panic!("expected an apply failure, got {other}"),
    }
    serving("a panic in apply");

    replace_file(&fixture_reload_build(2), &lib);
    s.manifest(THREE);
    rt.reload().expect("fixed");
    assert_eq!(
        call(&rt, &session, "reload-version"),
        "build 2, greeting hi"
    );

    // Stopping every entry is said explicitly.
    s.manifest("[]\n");
    let report = rt.reload().expect("an explicitly empty composition");
    assert_eq!(
        report.removed,
        [
            "cordis-example",
            "fixture-reload",
            "fixture-reload-consumer"
        ],
        "{report}"
    );
    rt.shutdown();
}

fn resident_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// The bound stated for resident memory growth over 200 reloads.
const RSS_GROWTH_BOUND_KIB: u64 = 64 * 1024;

#[test]
fn two_hundred_reloads_under_concurrent_calls_fail_no_call() {
    let (s, lib) = reload_project(1, THREE);
    let builds = [fixture_reload_build(1), fixture_reload_build(2)];
    let rt = s.runtime();
    let session = rt.sessions().create(&s.path()).expect("session");
    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicU64::new(0));
    let callers: Vec<_> = ["reload-version", "consumer-view", "greet"]
        .into_iter()
        .map(|tool| {
            let (rt, session, stop, calls) =
                (rt.clone(), session.clone(), stop.clone(), calls.clone());
            std::thread::spawn(move || {
                let mut failures = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let r = rt.call_tool(
                        tool,
                        &CallContext {
                            session: session.clone(),
                            call_id: "load".into(),
                            cancel_fd: None,
                            progress_fd: None,
                        },
                        &serde_json::json!({"name": "load"}),
                    );
                    match r {
                        Ok(r) if !r.is_error => {}
                        Ok(r) => failures.push(r.text),
                        Err(e) => failures.push(e.to_string()),
                    }
                    calls.fetch_add(1, Ordering::Relaxed);
                }
                failures
            })
        })
        .collect();
    // Warm up (first reloads allocate caches that are not growth).
    for i in 0..10 {
        replace_file(&builds[i % 2], &lib);
        rt.reload().expect("reload");
    }
    let before = resident_kib();
    let started = Instant::now();
    for i in 0..200 {
        replace_file(&builds[i % 2], &lib);
        let report = rt.reload().expect("reload");
        assert_eq!(report.restarted.len(), 2, "{report}");
    }
    let elapsed = started.elapsed();
    let after = resident_kib();
    stop.store(true, Ordering::Relaxed);
    let failures: Vec<String> = callers
        .into_iter()
        .flat_map(|c| c.join().expect("caller"))
        .collect();
    assert!(
        failures.is_empty(),
        "{} failed calls, e.g. {:?}",
        failures.len(),
        &failures[..failures.len().min(3)]
    );
    let total = calls.load(Ordering::Relaxed);
    assert!(total > 200, "the callers made only {total} calls");
    let growth = after.saturating_sub(before);
    println!(
        "200 reloads in {elapsed:?} under {total} concurrent calls; resident {before} KiB -> {after} KiB (growth {growth} KiB, {} KiB per reload)",
        growth / 200
    );
    assert!(
        growth < RSS_GROWTH_BOUND_KIB,
        "resident memory grew by {growth} KiB over 200 reloads (bound {RSS_GROWTH_BOUND_KIB} KiB)"
    );
    let copies: Vec<String> = std::fs::read_dir(s.state_dir().join("run"))
        .expect("state/run holds the live generation's library copies")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    let live: std::collections::BTreeSet<std::path::PathBuf> = rt.inspect(|c| {
        c.plan()
            .entries
            .iter()
            .map(|p| p.library.path.clone())
            .collect()
    });
    assert_eq!(
        copies.len(),
        live.len(),
        "one copy per live library, every old generation's removed: {copies:?}"
    );
    rt.shutdown();
}

#[test]
fn session_mode_switches_survive_a_reload_of_the_policy_owner() {
    let manifest = |root_mode: &str| {
        format!("- name: dsh-sandbox-policy\n  config:\n    mode: {root_mode}\n- name: fixture-reload\n")
    };
    let (s, _lib) = reload_project(1, &manifest("read-only"));
    let rt = s.runtime();
    let session = rt.sessions().create(&s.path()).expect("session");
    let policy = |f: &dyn Fn(&SandboxPolicyClient) -> cordis_sdk::Result<()>| {
        rt.with_service::<SandboxPolicyClient, _>("sandboxPolicy", f)
            .expect("policy service")
    };
    policy(&|p| {
        p.set_sandbox_mode(SetModeArgs {
            session: session.id.clone(),
            mode: SandboxMode::DangerFullAccess,
        })
        .map(drop)
    });

    s.manifest(&manifest("workspace-write"));
    let report = rt.reload().expect("reload");
    assert!(
        report
            .restarted
            .iter()
            .any(|(id, _, _)| id == "dsh-sandbox-policy"),
        "{report}"
    );
    policy(&|p| {
        let resolved = p.resolve(ResolveArgs {
            session: Some(session.id.clone()),
            mode: None,
        })?;
        assert_eq!(
            resolved.mode,
            SandboxMode::DangerFullAccess,
            "the session's switch is in its log"
        );
        assert_eq!(
            p.default_mode(())?,
            SandboxMode::WorkspaceWrite,
            "the new config is live"
        );
        Ok(())
    });
    rt.shutdown();
}

/// Runs `cordis services` until its report on the running host satisfies `want`; returns
/// that report (the lines from `running:` on).
fn running_services(s: &cordis_e2e::Scratch, want: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = s.run(&["services", "--plugin-path", "plugins"]);
        out.expect_code(0);
        let stdout = out.stdout();
        let running = stdout[stdout.find("running:").expect("a running: section")..].to_string();
        if want(&running) {
            return running;
        }
        assert!(
            Instant::now() < deadline,
            "cordis services never showed it:\n{running}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The generation `cordis services` reports for entry `id`.
fn generation_of(running: &str, id: &str) -> u64 {
    let line = running
        .lines()
        .find(|l| l.starts_with(&format!("  {id}: ")))
        .unwrap_or_else(|| panic!("no entry {id} in:\n{running}"));
    let rest = &line[line.find("generation ").expect("a generation") + "generation ".len()..];
    rest.split(' ').next().unwrap().parse().expect("a number")
}

#[test]
fn cordis_run_watches_and_reloads_a_rebuilt_plugin_and_an_edited_manifest() {
    let (s, lib) = reload_project(1, "- name: fixture-reload\n  config:\n    greeting: hi\n");
    let mut cmd = s.cordis(&["run", "--plugin-path", "plugins"]);
    cmd.env("RUST_LOG", "info")
        .stderr(std::process::Stdio::piped());
    let mut mcp = McpStdio::start(cmd);
    assert_eq!(
        mcp.call("reload-version", serde_json::json!({})),
        (false, "build 1, greeting hi".into())
    );
    let pid = format!("running: pid {},", mcp.pid());
    let first = running_services(&s, |r| r.starts_with(&pid));
    assert!(first.contains(", 0 reloads\n"), "{first}");
    let g1 = generation_of(&first, "fixture-reload");

    replace_file(&fixture_reload_build(2), &lib);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (is_error, text) = mcp.call("reload-version", serde_json::json!({}));
        assert!(!is_error, "a call failed during the reload: {text}");
        if text == "build 2, greeting hi" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the rebuilt plugin was not picked up: {text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let second = running_services(&s, |r| r.contains(", 1 reload\n"));
    assert!(
        generation_of(&second, "fixture-reload") > g1,
        "a rebuilt library runs on a new generation:\n{first}\n{second}"
    );

    s.manifest("- name: fixture-reload\n  config:\n    greeting: hi\n- name: cordis-example\n");
    // The swap is visible to `tools/list` just before the reload's listeners send the
    // notification: wait for both, each within the deadline.
    eventually(
        "the manifest edit is picked up and announced",
        Duration::from_secs(20),
        || {
            let names = tool_names(&mut mcp);
            let announced = mcp
                .notifications
                .iter()
                .any(|n| n == "notifications/tools/list_changed");
            if names.iter().any(|n| n == "greet") && announced {
                Ok(())
            } else {
                Err(format!(
                    "tools {names:?}; notifications {:?}",
                    mcp.notifications
                ))
            }
        },
    );
    let third = running_services(&s, |r| r.contains(", 2 reloads\n"));
    assert!(
        third.contains("  cordis-example: plugin cordis-example "),
        "{third}"
    );
    assert!(mcp.finish().success());
    running_services(&s, |r| r.starts_with("running: no `cordis run`"));
}

/// `cordis run` serving `s` (with its `plugins/`), logging at `level` into `run.log`;
/// the client and the log's path.
fn serve_logged(s: &cordis_e2e::Scratch, level: &str) -> (McpStdio, std::path::PathBuf) {
    let log_path = s.path().join("run.log");
    let mut cmd = s.cordis(&["run", "--plugin-path", "plugins"]);
    cmd.env("RUST_LOG", level)
        .stderr(std::fs::File::create(&log_path).expect("create the log"));
    (McpStdio::start(cmd), log_path)
}

/// The names of the tools `mcp`'s server lists now.
fn tool_names(mcp: &mut McpStdio) -> Vec<String> {
    let tools = mcp.request("tools/list", serde_json::json!({}));
    tools["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["name"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn an_edit_that_cannot_be_planned_leaves_the_watcher_watching() {
    let (s, _lib) = reload_project(1, "- name: fixture-reload\n");
    let (mut mcp, log_path) = serve_logged(&s, "info");
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();

    // Non-ASCII text before the error's column once crashed the renderer, and the watcher
    // with it: every later edit was ignored.
    s.manifest("- name: fixture-reload\n- {name: cordis-example, id: ééé, dissabled: true}\n");
    eventually(
        "the invalid edit is reported",
        Duration::from_secs(20),
        || {
            let log = log();
            if log.contains("unknown entry key `dissabled`") {
                Ok(())
            } else {
                Err(log)
            }
        },
    );
    s.manifest("- name: fixture-reload\n- {name: cordis-example, id: ééé}\n");
    // The new tools are served as soon as the composition is swapped; the reload's log
    // line follows, so wait for both before ending the server.
    eventually("the fixed edit is applied", Duration::from_secs(20), || {
        let names = tool_names(&mut mcp);
        let log = log();
        if names.iter().any(|n| n == "greet") && log.contains("reload: added ééé;") {
            Ok(())
        } else {
            Err(format!("tools {names:?}\n{log}"))
        }
    });
    assert!(mcp.finish().success());
    let log = log();
    assert!(!log.contains("panicked"), "{log}");
}

#[test]
fn reading_a_library_is_not_a_change() {
    // Other processes load the libraries, and every reload reads them itself: if reads
    // counted as changes, an idle host would re-plan forever.
    let (s, lib) = reload_project(1, "- name: fixture-reload\n");
    let (mut mcp, log_path) = serve_logged(
        &s,
        "cordis_engine=debug,cordis_cli=debug,cordis_cli::watch=trace",
    );
    for _ in 0..3 {
        std::fs::read(&lib).expect("read the library");
        s.run(&["check", "--plugin-path", "plugins"]).expect_code(0);
    }
    // A barrier: a real change beside the library that is no library. The watcher handles
    // events in order, so once it reports ignoring this one, the reads before it were
    // handled: counted as changes, they would have reloaded in an earlier batch or made
    // this batch relevant.
    let barrier = lib.with_file_name("barrier.txt");
    std::fs::write(&barrier, "not a library").expect("write the barrier");
    eventually(
        "the watcher handles the barrier",
        Duration::from_secs(20),
        || {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            if log.contains("ignored changes") && log.contains("barrier.txt") {
                Ok(())
            } else {
                Err(log)
            }
        },
    );
    assert_eq!(
        mcp.call("reload-version", serde_json::json!({})),
        (false, "build 1, greeting ".into())
    );
    assert!(mcp.finish().success());
    let log = std::fs::read_to_string(&log_path).expect("read the log");
    assert!(
        !log.contains("files changed but the composition did not") && !log.contains("reload:"),
        "reads triggered reloads:\n{log}"
    );
    assert!(log.contains("mcp session"), "the log was captured:\n{log}");
}

/// A `cordis.yml` renamed into place (how editors save) is complete when seen: with a
/// quiet period of a minute, it still reloads at once and the reload line says why. One
/// written in place waits while its writer holds it open, and reloads at once when the
/// writer closes it.
#[test]
fn a_rename_reloads_at_once_and_an_open_in_place_write_waits_for_its_writer() {
    use std::io::Write as _;
    let (s, _lib) = reload_project(1, "- name: fixture-reload\n  config:\n    greeting: a\n");
    let log_path = s.path().join("run.log");
    let mut cmd = s.cordis(&["run", "--plugin-path", "plugins", "--reload-quiet", "60000"]);
    cmd.env("RUST_LOG", "info")
        .stderr(std::fs::File::create(&log_path).expect("create the log"));
    let mut mcp = McpStdio::start(cmd);
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let greeting = |mcp: &mut McpStdio| mcp.call("reload-version", serde_json::json!({})).1;
    assert_eq!(greeting(&mut mcp), "build 1, greeting a");

    let tmp = s.write(
        ".cordis.yml.tmp",
        "- name: fixture-reload\n  config:\n    greeting: b\n",
    );
    std::fs::rename(tmp, s.path().join("cordis.yml")).expect("save by rename");
    eventually(
        "the rename reloads at once",
        Duration::from_secs(20),
        || {
            let log = log();
            match log.lines().find(|l| l.contains("reload:")) {
                Some(line) if line.contains("complete at once: renamed into place") => Ok(()),
                _ => Err(log),
            }
        },
    );
    assert_eq!(greeting(&mut mcp), "build 1, greeting b");

    let mut writer = std::fs::File::create(s.path().join("cordis.yml")).expect("open in place");
    writer
        .write_all(b"- name: fixture-reload\n  config:\n    greeting: c\n")
        .expect("write in place");
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(
        greeting(&mut mcp),
        "build 1, greeting b",
        "reloaded while the writer still held the file:\n{}",
        log()
    );
    drop(writer);
    eventually("the close reloads at once", Duration::from_secs(20), || {
        let log = log();
        if log.contains("complete at once: its writer closed it") {
            Ok(())
        } else {
            Err(log)
        }
    });
    assert_eq!(greeting(&mut mcp), "build 1, greeting c");
    assert!(mcp.finish().success());
}

/// The model context is computed once per state it depends on, and follows each change on
/// the very next request: a mode switch by `cordis session set-mode` from another process,
/// and a reload that changes the policy.
#[test]
fn the_model_context_follows_a_mode_switch_from_another_process_and_a_reload() {
    let s = cordis_e2e::Scratch::new();
    let manifest = |network: bool| {
        format!(
            "- name: dsh-sandbox-policy\n  config:\n    mode: workspace-write\n    network: {network}\n\
             - name: dsh-fs-sandbox\n- name: dsh-tool-fs\n"
        )
    };
    s.manifest(&manifest(false));
    let rt = s.runtime();
    let session = rt.sessions().create(&s.path()).expect("session");
    let first = rt.model_context(Some(&session.id));
    assert!(first.contains("policy: workspace-write"), "{first}");
    assert!(first.contains("no network access"), "{first}");
    assert_eq!(
        rt.model_context(Some(&session.id)),
        first,
        "the same state, the same text"
    );

    s.run(&["session", "set-mode", &session.id, "read-only"])
        .expect_code(0);
    let switched = rt.model_context(Some(&session.id));
    assert!(switched.contains("policy: read-only"), "{switched}");

    s.manifest(&manifest(true));
    let report = rt.reload().unwrap_or_else(|e| panic!("{e}"));
    assert!(!report.is_empty(), "{report:?}");
    let reloaded = rt.model_context(Some(&session.id));
    assert!(
        reloaded.contains("policy: read-only") && reloaded.contains("may use the network"),
        "{reloaded}"
    );
    // Another session is its own entry.
    let other = rt.sessions().create(&s.path()).expect("another session");
    assert!(rt
        .model_context(Some(&other.id))
        .contains("policy: workspace-write"));
    rt.shutdown();
}

/// A session's resolved policy is reused from call to call, and each change it depends on
/// takes effect on the very next call: a reload that changes the policy's config, a reload
/// that protects a new path without touching the policy's entry (it adds another entry
/// whose library lies in the workspace), and a mode switch by `cordis session set-mode`
/// from another process.
#[test]
fn the_resolved_policy_follows_a_reload_a_newly_protected_path_and_a_mode_switch() {
    let s = cordis_e2e::Scratch::new();
    let policy = |protected: &str| {
        format!(
            "- name: dsh-sandbox-policy\n  config:\n    mode: workspace-write\n    protectedPaths: [{protected}]\n\
             - name: dsh-fs-sandbox\n- name: dsh-tool-fs\n"
        )
    };
    s.manifest(&policy(""));
    let rt = s.runtime();
    let session = rt.sessions().create(&s.path()).expect("session");
    let write = |path: &str| {
        let r = rt
            .call_tool(
                "write",
                &CallContext {
                    session: session.clone(),
                    call_id: cordis_e2e::unique(),
                    cancel_fd: None,
                    progress_fd: None,
                },
                &serde_json::json!({ "path": path, "content": "x\n" }),
            )
            .unwrap_or_else(|e| panic!("{e}"));
        (!r.is_error, r.text)
    };
    let allowed = |path: &str| {
        let (ok, text) = write(path);
        assert!(ok, "`{path}` should be writable: {text}");
        assert!(s.path().join(path).exists(), "{path}");
    };
    let refused = |path: &str, why: &str| {
        let (ok, text) = write(path);
        assert!(
            !ok && text.contains(why),
            "`{path}` should be refused ({why}): {text}"
        );
        assert!(!s.path().join(path).exists(), "{path}");
    };
    allowed("locked.txt");
    allowed("a.txt");

    // The policy's own config: its entry restarts, so a new state is read.
    s.manifest(&policy("'**/locked.txt'"));
    let report = rt.reload().unwrap_or_else(|e| panic!("{e}"));
    assert!(
        restarted_ids(&report).contains(&"dsh-sandbox-policy"),
        "{report}"
    );
    std::fs::remove_file(s.path().join("locked.txt")).unwrap();
    refused("locked.txt", "is protected");
    allowed("vendor/before.txt");

    // A path the composition now defines, the policy's entry untouched: a library loaded
    // from the workspace is protected, with its directory, from the next call on.
    std::fs::copy(
        cordis_e2e::library("dsh-bash-local"),
        s.path()
            .join("vendor")
            .join(cordis_engine::library_file_name("dsh-bash-local")),
    )
    .unwrap();
    let lib = format!(
        "vendor/{}",
        cordis_engine::library_file_name("dsh-bash-local")
    );
    s.manifest(&format!(
        "{}- name: dsh-bash-local\n  path: {lib}\n",
        policy("'**/locked.txt'")
    ));
    let report = rt.reload().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(report.added, ["dsh-bash-local"], "{report}");
    assert!(
        !restarted_ids(&report).contains(&"dsh-sandbox-policy"),
        "the policy's entry is not restarted: {report}"
    );
    refused("vendor/after.txt", "is protected");
    allowed("b.txt");

    // The session's log, appended by another process.
    s.run(&["session", "set-mode", &session.id, "read-only"])
        .expect_code(0);
    refused("c.txt", "under read-only mode");
    rt.shutdown();
}

/// A call that switches its own session's mode and resolves again sees its switch at once:
/// the policy's reuse of a session's state also counts its own appends, not only the stamps
/// the host read when the call began.
#[test]
fn a_call_that_switches_its_sessions_mode_sees_the_switch_within_the_call() {
    let s = cordis_e2e::Scratch::new();
    s.manifest(
        "- name: dsh-sandbox-policy\n  config:\n    mode: workspace-write\n- name: fixture-crashy\n",
    );
    let rt = s.runtime();
    let session = rt.sessions().create(&s.path()).expect("session");
    let switch =
        |mode: &str| call_with(&rt, &session, "switch", serde_json::json!({ "mode": mode }));
    assert_eq!(switch("read-only"), "workspace-write -> read-only");
    assert_eq!(switch("workspace-write"), "read-only -> workspace-write");
    assert_eq!(
        switch("workspace-write"),
        "workspace-write -> workspace-write"
    );
}
