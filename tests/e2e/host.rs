//! End-to-end tests of the host core: the real `cordis` binary on real plugin libraries
//! (the example plugin and the fixture plugins), for every way a composition can be wrong.

use cordis_e2e::Scratch;

/// Runs `cordis <command>` on `manifest` and checks the exit code and that the output
/// names everything in `needles`.
fn check(command: &[&str], manifest: &str, code: i32, needles: &[&str]) -> Scratch {
    let scratch = Scratch::new();
    scratch.manifest(manifest);
    scratch
        .run(command)
        .expect_code(code)
        .expect_output(needles);
    scratch
}

#[test]
fn valid_composition_prints_the_plan_in_dependency_order() {
    let s = check(
        &["check"],
        "- name: fixture-greeter-consumer\n- name: '@deepseek-ai/cordis-example'\n  config:\n    word: hi\n",
        0,
        &["valid composition, 2 entries"],
    );
    let out = s.run(&["check"]).stdout();
    let example = out.find("1. cordis-example").expect("provider first");
    let consumer = out
        .find("2. fixture-greeter-consumer")
        .expect("consumer second");
    assert!(example < consumer, "{out}");
    assert!(
        out.contains("injects  greeter <- entry cordis-example"),
        "{out}"
    );
    assert!(
        out.contains("greeter-backup (optional) <- nothing"),
        "{out}"
    );
}

#[test]
fn missing_required_service_names_consumer_service_line_and_a_provider() {
    check(
        &["check"],
        "# a consumer without its provider\n- name: fixture-greeter-consumer\n",
        1,
        &[
            "error[missing-service]",
            "entry `fixture-greeter-consumer` requires service `greeter` (example.greeter v1)",
            "cordis.yml:2:3",
            "add an entry `- name: cordis-example`",
        ],
    );
    // The provider named is the one that provides the service, not the first library found.
    check(
        &["check"],
        "- name: dsh-bash-sandbox\n",
        1,
        &[
            "entry `dsh-bash-sandbox` requires service `sandboxPolicy`",
            "add an entry `- name: dsh-sandbox-policy` to cordis.yml; plugin `dsh-sandbox-policy` provides `sandboxPolicy`",
        ],
    );
}

#[test]
fn two_providers_of_one_service() {
    check(
        &["check"],
        "- name: cordis-example\n- name: cordis-example\n  id: second\n",
        1,
        &[
            "error[duplicate-provider]",
            "entry `cordis-example` and entry `second` (plugin `cordis-example`) both provide service `greeter`",
            "cordis.yml:2:3",
            "disabled: true",
        ],
    );
}

#[test]
fn same_plugin_twice_needs_distinct_ids() {
    check(
        &["check"],
        "- name: cordis-example\n- name: cordis-example\n",
        1,
        &[
            "error[duplicate-id]",
            "cordis.yml:2:3",
            "plugin `cordis-example` appears twice",
        ],
    );
}

#[test]
fn dependency_cycle_is_printed() {
    check(
        &["check"],
        "- name: fixture-cycle-a\n- name: fixture-cycle-b\n",
        1,
        &[
            "error[dependency-cycle]",
            "`fixture-cycle-a` (line 1) → `fixture-cycle-b` (line 2) → `fixture-cycle-a` (line 1)",
        ],
    );
    // An entry placed before the cycle is not part of it.
    check(
        &["check"],
        "- name: cordis-example\n- name: fixture-cycle-a\n- name: fixture-cycle-b\n",
        1,
        &[
            "error[dependency-cycle]",
            "dependency cycle: `fixture-cycle-a` (line 2) → `fixture-cycle-b` (line 3) → `fixture-cycle-a` (line 2)",
        ],
    );
}

#[test]
fn interface_version_mismatch_between_provider_and_consumer() {
    check(
        &["check"],
        "- name: fixture-greeter-v2\n- name: fixture-greeter-consumer\n",
        1,
        &[
            "error[interface-mismatch]",
            "entry `fixture-greeter-consumer` injects `greeter` as example.greeter v1, but entry `fixture-greeter-v2` provides it as example.greeter v2; interface versions must match exactly: rebuild one of them against the other's version of the seam crate",
            "cordis.yml:2:3",
        ],
    );
}

#[test]
fn library_problems() {
    let s = check(
        &["check"],
        "- name: no-such-plugin\n",
        1,
        &[
            "error[library-not-found]",
            "no library for plugin `no-such-plugin`",
            "looked for",
            "cordis/plugins/libno_such_plugin.so (the user plugin directory)",
            "libno_such_plugin.so (next to the cordis binary)",
        ],
    );
    // The binary cargo built is no installation: `target/lib/cordis/plugins`, which
    // nothing creates, is not searched (a sandboxed command could plant a library there).
    let err = s.run(&["check"]).stderr();
    assert!(
        !err.contains("the installation's plugin directory"),
        "{err}"
    );
    s.write("libs/libfake.so", "not a shared object");
    s.manifest("- name: fake\n  path: libs/libfake.so\n");
    s.run(&["check"]).expect_code(1).expect_output(&[
        "error[library-invalid]",
        "entry `fake`",
        "libfake.so",
        "cordis.yml:1:3",
        "help: point the entry at a cdylib built with cordis-sdk's `export_plugin!`",
    ]);
    let real = cordis_e2e::library("cordis-example");
    s.manifest(&format!(
        "- name: fixture-faulty\n  path: {}\n",
        real.display()
    ));
    s.run(&["check"]).expect_code(1).expect_output(&[
        "error[plugin-name-mismatch]",
        "contains plugin `cordis-example`, not `fixture-faulty`",
    ]);
}

#[test]
fn manifest_syntax_and_shape_errors_have_line_and_column() {
    let cases: &[(&str, &[&str])] = &[
        (
            "- name: a\n   bad: [\n",
            &["error[yaml-syntax]", "cordis.yml:2:7"],
        ),
        (
            "- name: cordis-example\n  confg: {}\n",
            &[
                "error[unknown-key]",
                "unknown entry key `confg`",
                "cordis.yml:2:3",
                "did you mean `config`?",
            ],
        ),
        ("- id: x\n", &["error[missing-name]", "cordis.yml:1:3"]),
        (
            "- name: cordis-example\n  id: a\n- name: fixture-faulty\n  id: a\n",
            &[
                "error[duplicate-id]",
                "duplicate entry id `a`",
                "cordis.yml:3:3",
                "first used at line 1:3",
            ],
        ),
    ];
    for (manifest, needles) in cases {
        check(&["check"], manifest, 1, needles);
    }
}

#[test]
fn all_errors_are_reported_not_only_the_first() {
    // The misconfigured `cordis-example` still provides `greeter` to the consumer: its
    // config is the error, not a missing service.
    let s = check(
        &["check"],
        "- name: no-such-plugin\n- name: fixture-greeter-consumer\n- name: cordis-example\n  config:\n    wrd: 1\n",
        1,
        &[
            "error[library-not-found]",
            "error[unknown-config-key]",
            "unknown key `wrd` in `config`",
            "cordis.yml:5:5",
            "did you mean `word`?",
            "(2 errors)",
        ],
    );
    let run = s.run(&["check"]);
    assert!(
        !run.stderr().contains("missing-service"),
        "{}",
        run.context()
    );
    // Remove the provider and its consumer's error joins the others.
    s.manifest("- name: no-such-plugin\n- name: fixture-greeter-consumer\n");
    s.run(&["check"]).expect_code(1).expect_output(&[
        "error[library-not-found]",
        "error[missing-service]",
        "(2 errors)",
    ]);
}

#[test]
fn disabled_entries_and_groups_are_not_loaded() {
    let s = check(
        &["check"],
        "- name: cordis-example\n- group: true\n  disabled: true\n  config:\n    - name: no-such-plugin\n    - name: fixture-cycle-a\n- name: fixture-faulty\n  disabled: true\n",
        0,
        &["valid composition, 1 entry"],
    );
    let out = s.run(&["check"]).stdout();
    assert!(out.contains("no-such-plugin (disabled, line 5)"), "{out}");
    assert!(out.contains("fixture-faulty (disabled, line 7)"), "{out}");
}

#[test]
fn services_shows_providers_consumers_and_absent_optional_injections() {
    check(
        &["services"],
        "- name: cordis-example\n- name: fixture-greeter-consumer\n",
        0,
        &[
            "greeter: example.greeter v1 provided by entry cordis-example (plugin cordis-example); consumers: fixture-greeter-consumer",
            "sessions: cordis.sessions v1 provided by host",
            "greeter-backup: absent (optional for entry fixture-greeter-consumer)",
            "tools: greet, greet-via-service",
        ],
    );
}

#[test]
fn apply_failure_disposes_what_was_applied_and_exits_non_zero() {
    for (fail, needles) in [
        (
            "panic",
            &["apply panicked: fixture panics in apply", "[PANIC]"][..],
        ),
        (
            "error",
            &[
                "fixture refuses to start: No such file or directory (os error 2) [FIXTURE_FAILED]",
                "set `fail:` to nothing",
            ][..],
        ),
        (
            // What `cordis plugin list` shows is what a plugin registers: the SDK holds it
            // to its declaration.
            "undeclared-tool",
            &[
                "plugin `fixture-faulty` registers tool `sneak` without declaring it in its metadata",
                "add `.tool(\"sneak\")` to `metadata()`",
            ][..],
        ),
    ] {
        let s = Scratch::new();
        s.manifest(&format!(
            "- name: cordis-example\n- name: fixture-faulty\n  config:\n    fail: {fail}\n"
        ));
        let run = s.run_with_log(&["services"], "info");
        run.expect_code(1)
            .expect_output(&["entry `fixture-faulty` (plugin `fixture-faulty`, cordis.yml line 2) failed to apply"])
            .expect_output(needles)
            .expect_output(&["faulty disposer ran", "greeter disposed"]);
    }
}

#[test]
fn run_serves_until_sigterm_and_disposes_in_reverse_order() {
    let s = Scratch::new();
    s.manifest("- name: cordis-example\n- name: fixture-greeter-consumer\n");
    // stdin stays open (the MCP client side), so only the signal ends the server.
    let mut child = cordis_e2e::KillOnDrop(
        s.cordis(&["run"])
            .env("RUST_LOG", "info")
            .arg("--no-watch")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn cordis run"),
    );
    let stderr = child.0.stderr.take().expect("stderr");
    let banner = cordis_e2e::wait_for_line(stderr, "running", std::time::Duration::from_secs(30));
    let (seen, rest) = banner.expect("cordis run printed no banner");
    assert!(
        seen.contains("plugins: cordis-example (0.1.0), fixture-greeter-consumer (0.1.0)"),
        "{seen}"
    );
    assert!(
        seen.contains("greeter ready") && seen.contains("plugin=\"cordis-example\""),
        "plugin log not bridged: {seen}"
    );
    // `Child::wait` closes the child's stdin first, and end of input also ends the server:
    // hold stdin open until the process is reaped, so the signal alone ends it.
    let stdin = child.0.stdin.take().expect("stdin");
    cordis_e2e::signal(&child.0, "TERM");
    let status = child.0.wait().expect("wait");
    drop(stdin);
    let tail = rest.join();
    assert!(status.success(), "exit {status:?}\n{tail}");
    assert!(tail.contains("received SIGTERM"), "{tail}");
    assert!(tail.contains("greeter disposed"), "{tail}");
}

#[test]
fn a_plugin_printing_to_stdout_cannot_corrupt_the_mcp_stream() {
    let s = Scratch::new();
    s.manifest("- name: cordis-example\n- name: fixture-faulty\n");
    let mut cmd = s.cordis(&["run", "--no-watch"]);
    cmd.stderr(std::process::Stdio::piped());
    // McpStdio fails on any stdout line that is not JSON-RPC.
    let mut mcp = cordis_e2e::McpStdio::start(cmd);
    assert_eq!(
        mcp.call("shout", serde_json::json!({})),
        (false, "shouted".to_string())
    );
    assert_eq!(
        mcp.call("greet", serde_json::json!({"name": "Ada"})),
        (false, "hello, Ada".to_string())
    );
    let (is_error, text) = mcp.call("explode", serde_json::json!({}));
    assert!(is_error && text.contains("panicked"), "{text}");
    assert_eq!(
        mcp.call("greet", serde_json::json!({"name": "Bo"})),
        (false, "hello, Bo".to_string()),
        "the server keeps answering after a plugin panic"
    );
    assert!(mcp.finish().success());
}

#[test]
fn two_entries_of_one_library_log_under_their_own_ids() {
    let s = Scratch::new();
    s.manifest(
        "- name: cordis-example\n\
         - name: fixture-greeter-consumer\n  id: first\n  config:\n    tool: greet-first\n\
         - name: fixture-greeter-consumer\n  id: second\n  config:\n    tool: greet-second\n",
    );
    // `first` was applied before `second`: its calls must not log under the later id.
    for (tool, id, other) in [
        ("greet-first", "first", "second"),
        ("greet-second", "second", "first"),
    ] {
        let run = s.run_with_log(&["call", tool, r#"{"name": "Ada"}"#], "info");
        run.expect_code(0)
            .expect_output(&["hello, Ada", &format!("[{id}] greeting Ada")]);
        assert!(
            !run.stderr().contains(&format!("[{other}] greeting")),
            "{}",
            run.stderr()
        );
    }
}

/// The host checks every call's arguments against the tool's input schema: a wrong type,
/// a missing or an unknown argument is an error result naming the argument, and the tool
/// (which logs each greeting) never runs; the same call with the right type does.
#[test]
fn arguments_that_break_the_tools_schema_never_reach_the_tool() {
    let s = Scratch::new();
    s.manifest("- name: cordis-example\n- name: fixture-greeter-consumer\n");
    for (args, expected) in [
        (r#"{"name": 5}"#, "`name`: 5 is not of type \"string\""),
        (
            r#"{"name": ["Ada"]}"#,
            "`name`: [\"Ada\"] is not of type \"string\"",
        ),
    ] {
        let run = s.run_with_log(&["call", "greet-via-service", args], "info");
        run.expect_code(1).expect_output(&[
            &format!("`greet-via-service`: invalid arguments: {expected}. The tool did not run"),
            "[INVALID_ARGUMENT]",
        ]);
        assert!(!run.stderr().contains("greeting"), "{}", run.stderr());
    }
    // The example's typed tool: its schema (generated from its argument type) requires
    // `name` and refuses unknown fields.
    for (args, expected) in [
        ("{}", "\"name\" is a required property"),
        (r#"{"name": "Ada", "nmae": 1}"#, "nmae"),
    ] {
        s.run(&["call", "greet", args])
            .expect_code(1)
            .expect_output(&["`greet`: invalid arguments: ", expected]);
    }
    s.run(&["call", "greet", r#"{"name": "Ada"}"#])
        .expect_code(0)
        .expect_output(&["hello, Ada"]);
    let run = s.run_with_log(&["call", "greet-via-service", r#"{"name": "Ada"}"#], "info");
    run.expect_code(0)
        .expect_output(&["hello, Ada", "greeting Ada"]);
}

#[test]
fn session_ids_that_are_not_ids_are_refused_before_any_file_is_read() {
    let s = Scratch::with_bundled_manifest();
    let outside = cordis_e2e::Outside::new("session-id");
    // A real session rooted outside, switched to danger-full-access, then moved to where
    // traversal ids lead: without the id check, each id below would run in it.
    let created = s.run(&[
        "session",
        "new",
        "--cwd",
        &outside.dir.display().to_string(),
    ]);
    created.expect_code(0);
    let id = created.stdout().trim().to_string();
    s.run(&["session", "set-mode", &id, "danger-full-access"])
        .expect_code(0);
    let log = s.state_dir().join("sessions").join(format!("{id}.jsonl"));
    let text = std::fs::read_to_string(&log).expect("the session log");
    assert!(text.contains("danger-full-access"), "{text}");
    std::fs::write(s.state_dir().join("evil.jsonl"), &text).expect("plant");
    std::fs::write(outside.dir.join("evil.jsonl"), &text).expect("plant");
    std::fs::create_dir_all(s.state_dir().join("sessions/sub")).expect("sub");
    std::fs::write(s.state_dir().join("sessions/sub/evil.jsonl"), &text).expect("plant");

    let write = format!(
        r#"{{"path": "{}", "content": "escaped\n"}}"#,
        outside.victim().display()
    );
    let absolute = outside.dir.join("evil").display().to_string();
    let long = "a".repeat(5000);
    for bad in [
        "../evil",
        "sub/evil",
        absolute.as_str(),
        "..",
        "séance",
        &long,
    ] {
        let runs = [
            (vec!["call", "--session", bad, "write", write.as_str()], 2),
            (vec!["session", "show", bad], 1),
            (vec!["session", "set-mode", bad, "read-only"], 1),
        ];
        for (args, code) in runs {
            let run = s.run(&args);
            run.expect_code(code);
            let stderr = run.stderr();
            assert!(
                stderr.contains("invalid session id") && !stderr.contains("no session"),
                "{}",
                run.context()
            );
            assert!(stderr.len() < 1000, "the id is shown cut: {}", stderr.len());
        }
    }
    assert_eq!(outside.victim_text(), cordis_e2e::VICTIM, "nothing escaped");
    // The planted logs were neither read nor appended to.
    assert_eq!(
        std::fs::read_to_string(s.state_dir().join("evil.jsonl")).expect("planted"),
        text
    );
    // A well-formed id that does not exist is "no session", not "invalid".
    let run = s.run(&["session", "show", "s0123abc"]);
    run.expect_code(1);
    assert!(
        run.stderr().contains("no session `s0123abc`"),
        "{}",
        run.context()
    );
}

#[test]
fn a_client_on_a_socket_rather_than_a_pipe_is_served_too() {
    // Pipes are driven by the server's poller; anything else on stdio (a socket, a
    // terminal) by blocking stdio threads. Both must speak the same protocol.
    use std::io::{BufRead, Write};
    let s = Scratch::new();
    s.manifest("- name: cordis-example\n");
    let (server_end, client_end) = std::os::unix::net::UnixStream::pair().expect("a socket pair");
    let stdin = std::os::fd::OwnedFd::from(server_end.try_clone().expect("clone"));
    let mut child = cordis_e2e::KillOnDrop(
        s.cordis(&["run", "--no-watch"])
            .stdin(stdin)
            .stdout(std::os::fd::OwnedFd::from(server_end))
            .spawn()
            .expect("spawn cordis run"),
    );
    client_end
        .set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .expect("a read timeout");
    let mut reader = std::io::BufReader::new(client_end.try_clone().expect("clone"));
    let end_of_input = client_end.try_clone().expect("clone");
    let mut writer = client_end;
    let mut send = |message: serde_json::Value| {
        writeln!(writer, "{message}").expect("write a message");
        message.get("id").cloned()
    };
    let mut answer = |id: Option<serde_json::Value>| loop {
        let mut line = String::new();
        reader.read_line(&mut line).expect("read a response");
        assert!(!line.is_empty(), "cordis run closed the socket");
        let msg: serde_json::Value = serde_json::from_str(&line).expect("a JSON line");
        if msg.get("id") == id.as_ref() {
            return msg;
        }
    };
    let init = answer(send(
        serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "socket", "version": "0"}}}),
    ));
    assert!(init["result"]["serverInfo"].is_object(), "{init}");
    send(serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    let call = answer(send(
        serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "greet", "arguments": {"name": "Ada"}}}),
    ));
    assert_eq!(call["result"]["content"][0]["text"], "hello, Ada", "{call}");
    end_of_input
        .shutdown(std::net::Shutdown::Write)
        .expect("end the input");
    assert!(child.0.wait().expect("wait").success());
}

/// A session command that only edits an existing session applies the composition in that
/// session's root: run from the parent of the state directory (where a new session would
/// be refused, the state directory lying inside its root), `set-mode` and `show` work; a
/// new session there is still refused.
#[test]
fn session_commands_apply_the_guards_of_the_sessions_root_not_of_where_they_run() {
    let s = Scratch::with_bundled_manifest();
    let ws = s.path().join("ws");
    std::fs::create_dir(&ws).expect("the session's root");
    let state = s.path().join("state");
    let run = |args: &[&str]| {
        let mut cmd = s.cordis(args);
        cmd.env("CORDIS_STATE_DIR", "state");
        s.run_command(cmd, &format!("cordis {}", args.join(" ")))
    };
    let created = run(&["session", "new", "--cwd", "ws"]);
    created.expect_code(0);
    let id = created.stdout().trim().to_string();
    assert!(state.join("sessions").join(format!("{id}.jsonl")).is_file());
    run(&["session", "set-mode", &id, "read-only"])
        .expect_code(0)
        .expect_output(&["mode read-only"]);
    let shown = run(&["session", "show", &id]);
    shown.expect_code(0);
    let ws = ws.canonicalize().expect("canonical root");
    assert!(
        shown.stdout().contains(&format!(
            "sandbox policy: read-only (workspace root {})",
            ws.display()
        )),
        "{}",
        shown.stdout()
    );
    let refused = run(&["call", "list", r#"{"path": "."}"#]);
    refused.expect_code(2);
    assert!(
        refused.stderr().contains("SANDBOX_STATE_DIR_WRITABLE"),
        "{}",
        refused.stderr()
    );
}

/// `cordis call --format json` prints the whole result, its structured content included,
/// as one JSON object; the default prints the text only.
#[test]
fn cordis_call_prints_the_whole_result_as_json() {
    let s = Scratch::with_bundled_manifest();
    let run = s.run(&[
        "call",
        "--format",
        "json",
        "bash",
        r#"{"command": "echo hi; exit 3"}"#,
    ]);
    run.expect_code(1);
    let result: serde_json::Value =
        serde_json::from_str(run.stdout().trim()).expect("one JSON object");
    assert_eq!(result["isError"], true, "{result}");
    assert_eq!(result["structuredContent"]["exit_code"], 3, "{result}");
    assert_eq!(result["structuredContent"]["stdout"], "hi\n", "{result}");
    assert!(
        result["text"].as_str().is_some_and(|t| t.contains("hi")),
        "{result}"
    );
    assert!(
        result["session"].as_str().is_some_and(|id| !id.is_empty()),
        "{result}"
    );
    let human = s.run(&["call", "bash", r#"{"command": "echo hi"}"#]);
    human.expect_code(0);
    assert!(
        !human.stdout().contains("structuredContent"),
        "{}",
        human.stdout()
    );
    assert!(human.stdout().contains("hi"), "{}", human.stdout());
}

/// `cordis call` marks the session it makes; `cordis session prune` removes those when they
/// are old enough, and never a session made by `cordis session new`, however old.
#[test]
fn session_prune_removes_what_cordis_call_made_and_nothing_else() {
    let s = Scratch::with_bundled_manifest();
    let kept = s.run(&["session", "new"]);
    kept.expect_code(0);
    let kept = kept.stdout().trim().to_string();
    for _ in 0..2 {
        s.run(&["call", "list", r#"{"path": "."}"#]).expect_code(0);
    }
    let ids = || {
        let listed = s.run(&["session", "list"]);
        listed.expect_code(0);
        listed
            .stdout()
            .lines()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    assert_eq!(ids().len(), 3, "{:?}", ids());
    // Just made: younger than the default hour.
    s.run(&["session", "prune"])
        .expect_code(0)
        .expect_output(&["removed 0 session(s)"]);
    let log = s.state_dir().join("sessions").join(format!("{kept}.jsonl"));
    let week_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(7 * 86_400);
    std::fs::File::options()
        .append(true)
        .open(&log)
        .and_then(|f| f.set_modified(week_ago))
        .expect("age the long-lived session");
    s.run(&["session", "prune", "--older-than", "0s"])
        .expect_code(0)
        .expect_output(&["removed 2 session(s) made by `cordis call`"]);
    assert_eq!(ids(), [kept.as_str()]);
    s.run(&["session", "show", &kept]).expect_code(0);
    s.run(&["session", "prune", "--older-than", "soon"])
        .expect_code(2)
        .expect_output(&["`soon` is not a duration"]);
}
