//! End-to-end tests of the model-facing tools (`dsh-tool-fs`: read, write, edit, list;
//! `dsh-tool-bash`: bash) composed with the real policy service and the real fenced or
//! local backends, all as cdylibs applied through the real host. Each tool is called the way
//! a front-end calls it. Every target that must stay untouched lives outside every writable
//! root (the scratch directories are under the temp area, which is itself writable) and is
//! compared byte for byte before and after.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use cordis_e2e::{unique, Outside, Scratch, Started, VICTIM};
use cordis_host::registry::ToolSlot;
use cordis_sdk::host::{ApprovalOutcome, ApprovalRequest};
use cordis_sdk::{CallContext, SessionInfo, ToolResult};
use dsh_sandbox::{
    denial_marker, escalation_hint, texts, SandboxMode, SandboxPolicy, SandboxPolicyClient,
    SetModeArgs, SANDBOX_POLICY,
};
use serde_json::{json, Value};

use SandboxMode::{DangerFullAccess, ReadOnly, WorkspaceWrite};

// ---------------------------------------------------------------------------------------
// Compositions

/// Which backends a composition mounts.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Backends {
    /// `dsh-fs-sandbox` + `dsh-bash-sandbox`.
    Confined,
    /// `dsh-fs-local` + `dsh-bash-local`.
    Local,
}

/// The policy service (default `mode`, fallback root `root`), the backends, both tools.
fn compose(scratch: &Scratch, mode: SandboxMode, root: &Path, backends: Backends) -> Started {
    let (fs, shell) = match backends {
        Backends::Confined => ("dsh-fs-sandbox", "dsh-bash-sandbox"),
        Backends::Local => ("dsh-fs-local", "dsh-bash-local"),
    };
    scratch.manifest(&format!(
        "- name: dsh-sandbox-policy\n  config:\n    mode: {mode}\n    workspaceRoot: '{}'\n\
         - name: {fs}\n- name: {shell}\n- name: dsh-tool-fs\n- name: dsh-tool-bash\n",
        root.display()
    ));
    scratch.start()
}

/// A project directory inside the scratch dir (so inside the temp area).
fn project(scratch: &Scratch, name: &str) -> PathBuf {
    let dir = scratch.path().join(name);
    std::fs::create_dir_all(&dir).expect("create project dir");
    dir
}

fn policy_of(started: &Started) -> SandboxPolicyClient {
    started.service::<SandboxPolicyClient>(SANDBOX_POLICY)
}

// ---------------------------------------------------------------------------------------
// The one check

/// What a tool call must answer.
#[derive(Clone, Debug)]
enum Want<'a> {
    /// A success whose text is exactly this.
    Exact(&'a str),
    /// A success whose text contains this.
    Ok(&'a str),
    /// An error result whose text contains this.
    Error(&'a str),
    /// An error result whose text is exactly this.
    ErrorExact(&'a str),
    /// The denial marker for the mode, then (when `true`) the escalation hint.
    Denied(SandboxMode, bool),
}

/// Something that calls tools the way a front-end does.
trait Caller {
    fn call(&self, session: &SessionInfo, tool: &str, args: Value) -> ToolResult;
}

impl Caller for Started {
    fn call(&self, session: &SessionInfo, tool: &str, args: Value) -> ToolResult {
        self.call_tool(session, tool, args)
    }
}

/// The registered tools alone, shareable across threads.
struct Tools(BTreeMap<String, ToolSlot>);

impl Tools {
    fn of(started: &Started) -> Self {
        Tools(started.registry.tools.clone())
    }
}

impl Caller for Tools {
    fn call(&self, session: &SessionInfo, tool: &str, args: Value) -> ToolResult {
        let slot = self
            .0
            .get(tool)
            .unwrap_or_else(|| panic!("tool `{tool}` is not registered"));
        let call = CallContext {
            session: session.clone(),
            call_id: format!("thread-call-{}", unique()),
        };
        slot.call(&call, &args)
    }
}

/// Calls `tool` with `args` in `session` and checks the answer against `want`.
fn check(
    caller: &impl Caller,
    session: &SessionInfo,
    tool: &str,
    args: Value,
    want: Want<'_>,
) -> ToolResult {
    let r = caller.call(session, tool, args.clone());
    let ctx = || format!("{tool} {args}\n  wanted {want:?}\n  got {r:?}");
    // A tool's own failure (an `Err` or a panic) reaches the caller as `error: ... [CODE]`;
    // every case here must be an answer from the tool instead.
    assert!(!r.text.starts_with("error: "), "{}", ctx());
    match &want {
        Want::Exact(t) => assert!(!r.is_error && r.text == *t, "{}", ctx()),
        Want::Ok(t) => assert!(!r.is_error && r.text.contains(t), "{}", ctx()),
        Want::Error(t) => assert!(r.is_error && r.text.contains(t), "{}", ctx()),
        Want::ErrorExact(t) => assert!(r.is_error && r.text == *t, "{}", ctx()),
        Want::Denied(mode, hinted) => {
            let mut lines = r.text.lines();
            assert!(r.is_error, "{}", ctx());
            assert_eq!(
                lines.next(),
                Some(denial_marker(*mode).as_str()),
                "{}",
                ctx()
            );
            let hint = escalation_hint(*mode);
            assert_eq!(lines.next() == Some(hint.as_str()), *hinted, "{}", ctx());
        }
    }
    r
}

// ---------------------------------------------------------------------------------------
// Inside the session root

#[test]
fn file_tools_work_inside_the_session_root() {
    let scratch = Scratch::new();
    let outside = Outside::new("tools");
    let started = compose(&scratch, WorkspaceWrite, &outside.dir, Backends::Confined);
    let proj = project(&scratch, "proj");
    let s = started.session(&proj);
    let a = proj.join("notes/a.txt");
    let abs = a.display().to_string();
    std::fs::write(proj.join("binary.bin"), [0xff, 0xfe, 0x00, 0x80]).expect("binary file");
    let replaced = format!("Replaced 1 occurrence in {abs}");
    let pwd = format!("{}\n[exit code 0]", proj.display());
    let pwd_notes = format!("{}/notes\n[exit code 0]", proj.display());
    let abs_notes = format!("{}/notes", proj.display());

    let cases: Vec<(&str, Value, Want)> = vec![
        (
            "write",
            json!({"path": "notes/a.txt", "content": "one\ntwo\nthree\n"}),
            Want::Ok("Wrote 14 bytes"),
        ),
        (
            "read",
            json!({"path": "notes/a.txt"}),
            Want::Exact("one\ntwo\nthree\n"),
        ),
        (
            "read",
            json!({"path": abs}),
            Want::Exact("one\ntwo\nthree\n"),
        ),
        (
            "read",
            json!({"path": "notes/a.txt", "offset": 2}),
            Want::Exact("two\nthree\n"),
        ),
        (
            "read",
            json!({"path": "notes/a.txt", "offset": 2, "limit": 1}),
            Want::Exact("two\n"),
        ),
        (
            "read",
            json!({"path": "notes/a.txt", "limit": 2}),
            Want::Exact("one\ntwo\n"),
        ),
        (
            "read",
            json!({"path": "notes/a.txt", "offset": 3, "limit": 100}),
            Want::Exact("three\n"),
        ),
        (
            "read",
            json!({"path": "notes/a.txt", "offset": 4}),
            Want::Error("past the end"),
        ),
        (
            "read",
            json!({"path": "notes/a.txt", "offset": 0}),
            Want::Error("counts lines from 1"),
        ),
        (
            "read",
            json!({"path": "notes/a.txt", "limit": 0}),
            Want::Error("`limit` must be at least 1"),
        ),
        (
            "read",
            json!({"path": "notes/missing.txt"}),
            Want::Error("FS_NOT_FOUND"),
        ),
        (
            "read",
            json!({"path": "binary.bin"}),
            Want::Error("FS_NOT_TEXT"),
        ),
        (
            "read",
            json!({"path": "notes"}),
            Want::Error("FS_WRONG_KIND"),
        ),
        (
            "edit",
            json!({"path": "notes/a.txt", "old_string": "two", "new_string": "2"}),
            Want::Exact(&replaced),
        ),
        (
            "read",
            json!({"path": "notes/a.txt"}),
            Want::Exact("one\n2\nthree\n"),
        ),
        (
            "edit",
            json!({"path": "notes/a.txt", "old_string": "zzz", "new_string": "y"}),
            Want::Error("FS_EDIT_NO_MATCH"),
        ),
        (
            "write",
            json!({"path": "notes/b.txt", "content": "x x x"}),
            Want::Ok("(created)"),
        ),
        (
            "write",
            json!({"path": "notes/b.txt", "content": "x, x, x"}),
            Want::Ok("(replaced)"),
        ),
        (
            "edit",
            json!({"path": "notes/b.txt", "old_string": "x", "new_string": "y"}),
            Want::Error("FS_EDIT_AMBIGUOUS"),
        ),
        (
            "read",
            json!({"path": "notes/b.txt"}),
            Want::Exact("x, x, x"),
        ),
        (
            "edit",
            json!({"path": "notes/b.txt", "old_string": "x", "new_string": "y", "replace_all": true}),
            Want::Ok("Replaced 3 occurrences"),
        ),
        (
            "read",
            json!({"path": "notes/b.txt"}),
            Want::Exact("y, y, y"),
        ),
        (
            "edit",
            json!({"path": "notes/b.txt", "old_string": "", "new_string": "y"}),
            Want::Error("`old_string` is empty"),
        ),
        (
            "list",
            json!({"path": "."}),
            Want::Exact("binary.bin\nnotes/"),
        ),
        (
            "list",
            json!({"path": "notes"}),
            Want::Exact("a.txt\nb.txt"),
        ),
        (
            "list",
            json!({"path": "notes/a.txt"}),
            Want::Error("FS_WRONG_KIND"),
        ),
        (
            "bash",
            json!({"command": "echo hi; echo oops >&2"}),
            Want::Exact("hi\n[stderr]\noops\n[exit code 0]"),
        ),
        ("bash", json!({"command": "pwd"}), Want::Exact(&pwd)),
        (
            "bash",
            json!({"command": "pwd", "workdir": "notes"}),
            Want::Exact(&pwd_notes),
        ),
        (
            "bash",
            json!({"command": "pwd", "workdir": abs_notes}),
            Want::Ok("/notes\n"),
        ),
        (
            "bash",
            json!({"command": "pwd", "workdir": "/"}),
            Want::Error("outside the session directory"),
        ),
        (
            "bash",
            json!({"command": "pwd", "workdir": ".."}),
            Want::Error("outside the session directory"),
        ),
        (
            "bash",
            json!({"command": "pwd", "workdir": "notes/a.txt"}),
            Want::Error("not an existing directory"),
        ),
        (
            "bash",
            json!({"command": "cat notes/a.txt; exit 3"}),
            Want::ErrorExact("one\n2\nthree\n[exit code 3]"),
        ),
        (
            "bash",
            json!({"command": "kill -9 $$"}),
            Want::Error("[killed by signal 9]"),
        ),
        (
            "bash",
            json!({"command": "sleep 5", "timeout_ms": 300}),
            Want::Error("[timed out after 300 ms"),
        ),
        (
            "bash",
            json!({"command": "echo made > made.txt"}),
            Want::Exact("[exit code 0]"),
        ),
        ("read", json!({"path": "made.txt"}), Want::Exact("made\n")),
    ];
    for (tool, args, want) in cases {
        check(&started, &s, tool, args, want);
    }
    assert_eq!(
        std::fs::read_to_string(&a).expect("a.txt on disk"),
        "one\n2\nthree\n"
    );
}

// ---------------------------------------------------------------------------------------
// Denials

#[test]
fn writes_outside_the_root_are_denied_with_the_marker() {
    let scratch = Scratch::new();
    let outside = Outside::new("tools");
    let started = compose(&scratch, WorkspaceWrite, &outside.dir, Backends::Confined);
    let s = started.session(&project(&scratch, "proj"));
    let victim = outside.victim().display().to_string();
    let fresh = outside.dir.join("fresh.txt").display().to_string();
    let before = outside.snapshot();
    let cases: Vec<(&str, Value)> = vec![
        ("write", json!({"path": victim, "content": "clobbered"})),
        ("write", json!({"path": fresh, "content": "new"})),
        (
            "write",
            json!({"path": "../../../../../../../../".to_string() + &victim[1..], "content": "x"}),
        ),
        (
            "edit",
            json!({"path": victim, "old_string": "original", "new_string": "changed"}),
        ),
    ];
    for (tool, args) in cases {
        let r = check(&started, &s, tool, args, Want::Denied(WorkspaceWrite, true));
        assert!(r.text.contains("outside the writable roots"), "{r:?}");
    }
    for command in [
        format!("echo clobbered > '{victim}'"),
        format!("echo new > '{fresh}'"),
        format!("rm -f '{victim}'"),
    ] {
        let r = check(
            &started,
            &s,
            "bash",
            json!({ "command": command }),
            Want::Denied(WorkspaceWrite, true),
        );
        // The raw output follows the hint: the shell's own complaint and the exit code.
        let rest: Vec<&str> = r.text.lines().skip(2).collect();
        assert!(rest.iter().any(|l| l.contains("[exit code")), "{r:?}");
        assert_eq!(
            r.text.matches(&denial_marker(WorkspaceWrite)).count(),
            1,
            "{r:?}"
        );
    }
    assert_eq!(outside.snapshot(), before, "nothing outside may change");
}

// ---------------------------------------------------------------------------------------
// Escalation

/// Records every approval request and answers `outcome`.
struct Asker {
    asked: Arc<Mutex<Vec<ApprovalRequest>>>,
}

impl Asker {
    /// Installs an approver answering `outcome` (`None`: no approver at all).
    fn install(started: &Started, outcome: Option<ApprovalOutcome>) -> Asker {
        let asked: Arc<Mutex<Vec<ApprovalRequest>>> = Arc::default();
        match outcome {
            Some(o) => {
                let log = asked.clone();
                started
                    .host
                    .approvals
                    .set_default(Some(Arc::new(move |req: &ApprovalRequest| {
                        log.lock().expect("ask log").push(req.clone());
                        o
                    })));
            }
            None => started.approvals(None),
        }
        Asker { asked }
    }

    fn requests(&self) -> Vec<ApprovalRequest> {
        self.asked.lock().expect("ask log").clone()
    }
}

/// An escalating call of `tool` that would change the victim (exactly once when run).
fn escalating_call(tool: &str, outside: &Outside, mode: SandboxMode) -> Value {
    let victim = outside.victim().display().to_string();
    let mut args = match tool {
        "write" => json!({"path": victim, "content": format!("{VICTIM}escalated\n")}),
        "edit" => {
            json!({"path": victim, "old_string": "content\n", "new_string": "content\nescalated\n"})
        }
        _ => json!({"command": format!("echo escalated >> '{victim}'")}),
    };
    args["sandbox_permissions"] = json!(mode.as_str());
    args["justification"] = json!("the change is needed outside the project");
    args
}

#[test]
fn escalation_matrix_for_write_edit_and_bash() {
    let scratch = Scratch::new();
    let outside = Outside::new("tools");
    let started = compose(&scratch, WorkspaceWrite, &outside.dir, Backends::Confined);
    let proj = project(&scratch, "proj");
    let s = started.session(&proj);
    let events = || started.host.sessions.events(&s.id, None).expect("events");
    let escalated = format!("{VICTIM}escalated\n");
    let requested = DangerFullAccess;
    let outcomes: [(Option<ApprovalOutcome>, Option<String>); 5] = [
        (Some(ApprovalOutcome::Approved), None),
        (
            Some(ApprovalOutcome::Rejected),
            Some(texts::rejected(requested)),
        ),
        (
            Some(ApprovalOutcome::Cancelled),
            Some(texts::cancelled(requested)),
        ),
        (
            Some(ApprovalOutcome::Unavailable),
            Some(texts::unavailable(requested)),
        ),
        (None, Some(texts::unavailable(requested))),
    ];
    for tool in ["write", "edit", "bash"] {
        for (outcome, refusal) in &outcomes {
            std::fs::write(outside.victim(), VICTIM).expect("reset victim");
            let asker = Asker::install(&started, *outcome);
            let before = events();
            let args = escalating_call(tool, &outside, requested);
            let granted = match tool {
                "write" => format!(
                    "Wrote {} bytes to {} (replaced) under `danger-full-access`, approved for this call only",
                    escalated.len(),
                    outside.victim().display()
                ),
                "edit" => format!(
                    "Replaced 1 occurrence in {} under `danger-full-access`, approved for this call only",
                    outside.victim().display()
                ),
                _ => "[exit code 0]".to_string(),
            };
            let r = match refusal {
                Some(text) => check(&started, &s, tool, args, Want::ErrorExact(text)),
                None => check(&started, &s, tool, args, Want::Exact(&granted)),
            };
            let want_victim = if refusal.is_some() {
                VICTIM
            } else {
                &escalated
            };
            assert_eq!(
                outside.victim_text(),
                want_victim,
                "{tool} {outcome:?}: {r:?}"
            );
            assert_eq!(
                events(),
                before,
                "{tool} {outcome:?}: a grant writes no event"
            );
            let asked = asker.requests();
            assert_eq!(
                asked.len(),
                usize::from(outcome.is_some()),
                "{tool} {outcome:?}"
            );
            if let Some(req) = asked.first() {
                assert_eq!(req.session, s.id);
                assert_eq!(req.tool, tool);
                assert!(req.call_id.starts_with("test-call-"), "{req:?}");
                assert_eq!(
                    req.justification,
                    "the change is needed outside the project"
                );
                assert!(req.summary.contains("victim.txt"), "{req:?}");
                assert!(req.summary.contains("danger-full-access"), "{req:?}");
            }
        }

        // Not wider than the session's mode: refused without asking.
        std::fs::write(outside.victim(), VICTIM).expect("reset victim");
        for not_wider in [ReadOnly, WorkspaceWrite] {
            let asker = Asker::install(&started, Some(ApprovalOutcome::Approved));
            check(
                &started,
                &s,
                tool,
                escalating_call(tool, &outside, not_wider),
                Want::ErrorExact(&texts::not_wider(WorkspaceWrite, not_wider)),
            );
            assert!(
                asker.requests().is_empty(),
                "{tool}: not-wider must not ask"
            );
        }

        // Only one of the two fields: an error result, nobody asked.
        let asker = Asker::install(&started, Some(ApprovalOutcome::Approved));
        for drop in ["sandbox_permissions", "justification"] {
            let mut args = escalating_call(tool, &outside, requested);
            args.as_object_mut().expect("object").remove(drop);
            check(&started, &s, tool, args, Want::Error("go together"));
        }
        let mut args = escalating_call(tool, &outside, requested);
        args["sandbox_permissions"] = json!("root");
        check(
            &started,
            &s,
            tool,
            args,
            Want::Error("unknown sandbox mode `root`"),
        );
        assert!(
            asker.requests().is_empty(),
            "{tool}: a bad pair must not ask"
        );
        assert_eq!(outside.victim_text(), VICTIM, "{tool}");
    }
}

#[test]
fn a_grant_keeps_the_session_root_and_lasts_one_call() {
    let scratch = Scratch::new();
    let outside = Outside::new("tools");
    // The configured fallback root is the outside dir; the session root is the project.
    let started = compose(&scratch, ReadOnly, &outside.dir, Backends::Confined);
    let proj = project(&scratch, "proj");
    let s = started.session(&proj);
    let asker = Asker::install(&started, Some(ApprovalOutcome::Approved));
    let before = outside.snapshot();
    let events = || started.host.sessions.events(&s.id, None).expect("events");
    let events_before = events();
    let grant = |mut args: Value| {
        args["sandbox_permissions"] = json!("workspace-write");
        args["justification"] = json!("save the notes");
        args
    };
    let victim = outside.victim().display().to_string();
    // Granted workspace-write: inside the session root passes ...
    check(
        &started,
        &s,
        "write",
        grant(json!({"path": "in.txt", "content": "in"})),
        Want::Ok("under `workspace-write`, approved for this call only"),
    );
    check(
        &started,
        &s,
        "bash",
        grant(json!({"command": "echo in > in-bash.txt; pwd"})),
        Want::Ok(&proj.display().to_string()),
    );
    // ... but the configured fallback root is not the call's root.
    check(
        &started,
        &s,
        "write",
        grant(json!({"path": victim, "content": "x"})),
        Want::Denied(WorkspaceWrite, true),
    );
    check(
        &started,
        &s,
        "bash",
        grant(json!({"command": format!("echo x > '{victim}'")})),
        Want::Denied(WorkspaceWrite, true),
    );
    // The next call without the fields is back in the session's mode.
    check(
        &started,
        &s,
        "write",
        json!({"path": "in.txt", "content": "again"}),
        Want::Denied(ReadOnly, true),
    );
    check(
        &started,
        &s,
        "bash",
        json!({"command": "echo again > in.txt"}),
        Want::Denied(ReadOnly, true),
    );
    assert_eq!(
        std::fs::read_to_string(proj.join("in.txt")).ok().as_deref(),
        Some("in")
    );
    assert_eq!(
        std::fs::read_to_string(proj.join("in-bash.txt"))
            .ok()
            .as_deref(),
        Some("in\n")
    );
    assert_eq!(outside.snapshot(), before);
    assert_eq!(asker.requests().len(), 4);
    assert_eq!(events(), events_before, "a grant writes no session event");
}

// ---------------------------------------------------------------------------------------
// Per-session mode

#[test]
fn a_session_mode_switch_governs_both_families_of_that_session_only() {
    let scratch = Scratch::new();
    let outside = Outside::new("tools");
    let started = compose(&scratch, WorkspaceWrite, &outside.dir, Backends::Confined);
    let (pa, pb) = (project(&scratch, "a"), project(&scratch, "b"));
    let (a, b) = (started.session(&pa), started.session(&pb));
    policy_of(&started)
        .set_sandbox_mode(SetModeArgs {
            session: a.id.clone(),
            mode: ReadOnly,
        })
        .expect("set mode");
    let write = json!({"path": "f.txt", "content": "x"});
    let bash = json!({"command": "echo x > g.txt"});
    check(
        &started,
        &a,
        "write",
        write.clone(),
        Want::Denied(ReadOnly, true),
    );
    check(
        &started,
        &a,
        "bash",
        bash.clone(),
        Want::Denied(ReadOnly, true),
    );
    std::fs::write(pa.join("r.txt"), "readable").expect("write r.txt");
    check(
        &started,
        &a,
        "read",
        json!({"path": "r.txt"}),
        Want::Exact("readable"),
    );
    check(&started, &b, "write", write, Want::Ok("Wrote 1 bytes"));
    check(&started, &b, "bash", bash, Want::Exact("[exit code 0]"));
    assert!(!pa.join("f.txt").exists() && !pa.join("g.txt").exists());
    assert!(pb.join("f.txt").exists() && pb.join("g.txt").exists());
}

// ---------------------------------------------------------------------------------------
// Schemas

fn schema(started: &Started, tool: &str) -> Value {
    let slot = started
        .registry
        .tools
        .get(tool)
        .unwrap_or_else(|| panic!("tool `{tool}` is not registered"));
    serde_json::from_str(slot.decl.input_schema.as_str()).expect("schema is JSON")
}

#[test]
fn escalation_fields_follow_the_backend() {
    let fields = ["sandbox_permissions", "justification"];
    let required: [(&str, &[&str]); 5] = [
        ("read", &["path"]),
        ("write", &["path", "content"]),
        ("edit", &["path", "old_string", "new_string"]),
        ("list", &["path"]),
        ("bash", &["command"]),
    ];
    for backends in [Backends::Confined, Backends::Local] {
        let scratch = Scratch::new();
        let started = compose(&scratch, WorkspaceWrite, &scratch.path(), backends);
        let s = started.session(&project(&scratch, "proj"));
        for (tool, req) in required {
            let schema = schema(&started, tool);
            assert_eq!(schema["type"], "object", "{tool}");
            assert_eq!(schema["additionalProperties"], false, "{tool}");
            assert_eq!(schema["required"], json!(req), "{tool}");
            for (name, prop) in schema["properties"].as_object().expect("properties") {
                let described = prop["description"].as_str().unwrap_or("");
                assert!(!described.is_empty(), "{tool}.{name} has no description");
            }
            let escalates =
                backends == Backends::Confined && ["write", "edit", "bash"].contains(&tool);
            for f in fields {
                assert_eq!(
                    schema["properties"].get(f).is_some(),
                    escalates,
                    "{tool}.{f} with {backends:?}"
                );
            }
            if escalates {
                assert_eq!(
                    schema["properties"]["sandbox_permissions"]["enum"],
                    json!(["read-only", "workspace-write", "danger-full-access"])
                );
            }
        }
        if backends == Backends::Local {
            let calls = [
                ("write", json!({"path": "p.txt", "content": "x"})),
                (
                    "edit",
                    json!({"path": "p.txt", "old_string": "a", "new_string": "b"}),
                ),
                ("bash", json!({"command": "echo x > p.txt"})),
            ];
            for (tool, mut args) in calls {
                args["sandbox_permissions"] = json!("danger-full-access");
                args["justification"] = json!("j");
                check(
                    &started,
                    &s,
                    tool,
                    args,
                    Want::Error("unknown field `justification`"),
                );
            }
            assert!(!scratch.path().join("proj/p.txt").exists());
        }
    }
}

// ---------------------------------------------------------------------------------------
// Concurrency

#[test]
fn concurrent_sessions_each_write_only_their_own_project() {
    let scratch = Scratch::new();
    let fallback = Outside::new("tools");
    let started = compose(&scratch, WorkspaceWrite, &fallback.dir, Backends::Confined);
    // Both projects lie outside the temp area, so each is outside the other's roots.
    let projects = [Outside::new("tools"), Outside::new("tools")];
    let sessions: Vec<SessionInfo> = projects.iter().map(|p| started.session(&p.dir)).collect();
    const ROUNDS: usize = 6;
    let tools = Tools::of(&started);
    std::thread::scope(|scope| {
        for me in 0..2 {
            let (started, session) = (&tools, &sessions[me]);
            let other = projects[1 - me].dir.clone();
            scope.spawn(move || {
                for i in 0..ROUNDS {
                    check(
                        started,
                        session,
                        "write",
                        json!({"path": format!("fs-{i}.txt"), "content": format!("{me}")}),
                        Want::Ok("Wrote 1 bytes"),
                    );
                    check(
                        started,
                        session,
                        "bash",
                        json!({"command": format!("echo {me} > bash-{i}.txt")}),
                        Want::Exact("[exit code 0]"),
                    );
                    let cross = other
                        .join(format!("cross-{me}-{i}.txt"))
                        .display()
                        .to_string();
                    check(
                        started,
                        session,
                        "write",
                        json!({"path": cross, "content": "x"}),
                        Want::Denied(WorkspaceWrite, true),
                    );
                    check(
                        started,
                        session,
                        "bash",
                        json!({"command": format!("echo x > '{cross}'")}),
                        Want::Denied(WorkspaceWrite, true),
                    );
                }
            });
        }
    });
    for (me, p) in projects.iter().enumerate() {
        let mut names: Vec<String> = std::fs::read_dir(&p.dir)
            .expect("list project")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        let mut want: Vec<String> = (0..ROUNDS)
            .flat_map(|i| [format!("bash-{i}.txt"), format!("fs-{i}.txt")])
            .chain(["victim.txt".to_string()])
            .collect();
        want.sort();
        assert_eq!(
            names, want,
            "project {me}: no cross-project file may appear"
        );
        for i in 0..ROUNDS {
            let fs = std::fs::read_to_string(p.dir.join(format!("fs-{i}.txt"))).expect("fs file");
            let sh =
                std::fs::read_to_string(p.dir.join(format!("bash-{i}.txt"))).expect("bash file");
            assert_eq!((fs, sh), (format!("{me}"), format!("{me}\n")));
        }
    }
}

// ---------------------------------------------------------------------------------------
// Bad input

/// A deterministic xorshift generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn string(&mut self) -> String {
        const ALPHABET: &[char] = &[
            'a',
            'Z',
            '9',
            ' ',
            '.',
            '-',
            'é',
            '\u{1F600}',
            '"',
            '\\',
            '\n',
        ];
        let len = match self.below(4) {
            0 => 0,
            1 => 1 + self.below(8),
            2 => 1 + self.below(64),
            _ => 100_000 + self.below(100_000),
        };
        (0..len)
            .map(|_| ALPHABET[self.below(ALPHABET.len() as u64) as usize])
            .collect()
    }
    fn value(&mut self, depth: u32) -> Value {
        match self.below(if depth > 2 { 6 } else { 8 }) {
            0 => Value::Null,
            1 => json!(self.below(2) == 0),
            2 => json!(self.next() as i64),
            3 => json!(-1.5e300),
            4 | 5 => json!(self.string()),
            6 => Value::Array((0..self.below(4)).map(|_| self.value(depth + 1)).collect()),
            _ => {
                let mut map = serde_json::Map::new();
                for _ in 0..self.below(4) {
                    map.insert(
                        self.string().chars().take(12).collect(),
                        self.value(depth + 1),
                    );
                }
                Value::Object(map)
            }
        }
    }
}

/// A malformed call of a tool whose fields are `fields`: never valid (a non-object, a
/// wrongly typed field, or an unknown field), so nothing runs.
fn malformed(rng: &mut Rng, fields: &[&str]) -> Value {
    if rng.below(8) == 0 {
        return match rng.below(4) {
            0 => Value::Null,
            1 => json!([rng.value(1)]),
            2 => json!(rng.string()),
            _ => json!(rng.next()),
        };
    }
    let mut map = serde_json::Map::new();
    for f in fields {
        if rng.below(3) != 0 {
            map.insert(f.to_string(), rng.value(0));
        }
    }
    // Make sure at least one thing is wrong: an unknown field or a non-string field.
    if rng.below(2) == 0 {
        map.insert(format!("unknown_{}", rng.below(100)), rng.value(1));
    } else {
        let f = fields[rng.below(fields.len() as u64) as usize];
        // No field of any tool takes an object or an array.
        let wrong = match rng.below(2) {
            0 => json!({"nested": rng.value(1)}),
            _ => json!([rng.string()]),
        };
        map.insert(f.to_string(), wrong);
    }
    Value::Object(map)
}

#[test]
fn malformed_input_is_an_error_result_never_a_panic() {
    let scratch = Scratch::new();
    let started = compose(
        &scratch,
        WorkspaceWrite,
        &scratch.path(),
        Backends::Confined,
    );
    let proj = project(&scratch, "proj");
    let s = started.session(&proj);
    let asker = Asker::install(&started, Some(ApprovalOutcome::Rejected));
    let tools: [(&str, &[&str]); 5] = [
        ("read", &["path", "offset", "limit"]),
        (
            "write",
            &["path", "content", "sandbox_permissions", "justification"],
        ),
        (
            "edit",
            &[
                "path",
                "old_string",
                "new_string",
                "replace_all",
                "sandbox_permissions",
                "justification",
            ],
        ),
        ("list", &["path"]),
        (
            "bash",
            &[
                "command",
                "timeout_ms",
                "workdir",
                "sandbox_permissions",
                "justification",
            ],
        ),
    ];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for (tool, fields) in tools {
        for _ in 0..300 {
            let args = malformed(&mut rng, fields);
            // A tool's `Err` or panic would read `error: ... [CODE]` instead.
            let r = started.call_tool(&s, tool, args.clone());
            let shown: String = args.to_string().chars().take(300).collect();
            assert!(r.is_error, "{tool} accepted malformed input {shown}: {r:?}");
            assert!(
                r.text.contains(&format!("`{tool}`: invalid arguments:")) && r.text.len() > 40,
                "{tool} {shown}: unhelpful error {:?}",
                r.text
            );
        }
    }
    assert!(
        asker.requests().is_empty(),
        "malformed input must never ask"
    );
    let left: Vec<_> = std::fs::read_dir(&proj).expect("list").collect();
    assert!(left.is_empty(), "malformed input must change nothing");
}

#[test]
fn empty_and_odd_values_get_clear_errors() {
    let scratch = Scratch::new();
    let started = compose(
        &scratch,
        WorkspaceWrite,
        &scratch.path(),
        Backends::Confined,
    );
    let s = started.session(&project(&scratch, "proj"));
    let cases: Vec<(&str, Value, Want)> = vec![
        ("read", json!({"path": ""}), Want::Error("`path` is empty")),
        (
            "list",
            json!({"path": "  "}),
            Want::Error("`path` is empty"),
        ),
        (
            "write",
            json!({"path": "", "content": "x"}),
            Want::Error("`path` is empty"),
        ),
        (
            "write",
            json!({"path": "a\u{0}b", "content": "x"}),
            Want::Error("NUL"),
        ),
        (
            "write",
            json!({"path": "a.txt"}),
            Want::Error("missing field `content`"),
        ),
        (
            "write",
            json!({"path": "a.txt", "content": null}),
            Want::Error("invalid type: null"),
        ),
        (
            "edit",
            json!({"path": "a.txt", "old_string": "x"}),
            Want::Error("missing field `new_string`"),
        ),
        (
            "edit",
            json!({"path": "a.txt", "old_string": "x", "new_string": "y", "replace_all": "yes"}),
            Want::Error("invalid type: string \"yes\", expected a boolean"),
        ),
        (
            "read",
            json!({"path": "a.txt", "offset": -1}),
            Want::Error("invalid value: integer `-1`"),
        ),
        (
            "read",
            json!({"path": "a.txt", "offset": 1.5}),
            Want::Error("invalid type: floating point"),
        ),
        (
            "bash",
            json!({"command": ""}),
            Want::Error("`command` is empty"),
        ),
        (
            "bash",
            json!({"command": "true", "timeout_ms": 0}),
            Want::Error("`timeout_ms` must be between 1 and"),
        ),
        (
            "bash",
            json!({"command": "true", "timeout_ms": 600_001}),
            Want::Error("`timeout_ms` must be between 1 and"),
        ),
        (
            "bash",
            json!({"command": "true", "workdir": ""}),
            Want::Error("`workdir` is empty"),
        ),
        (
            "bash",
            json!({"cmd": "true"}),
            Want::Error("unknown field `cmd`"),
        ),
        (
            "bash",
            json!("true"),
            Want::Error("must be a JSON object, got a string"),
        ),
    ];
    for (tool, args, want) in cases {
        check(&started, &s, tool, args, want);
    }
}

#[test]
fn cordis_session_set_mode_from_another_process_governs_a_running_server() {
    let s = Scratch::with_bundled_manifest();
    let project = s.path().join("project");
    std::fs::create_dir_all(&project).expect("project dir");
    let created = s.run(&["session", "new", "--cwd", "project"]);
    created.expect_code(0);
    let id = created.stdout().trim().to_string();

    let mut mcp = cordis_e2e::McpStdio::start(s.cordis(&["run", "--no-watch", "--session", &id]));
    let write = |mcp: &mut cordis_e2e::McpStdio, name: &str| {
        mcp.call("write", json!({"path": name, "content": "x\n"}))
    };
    let bash = |mcp: &mut cordis_e2e::McpStdio, name: &str| {
        mcp.call("bash", json!({"command": format!("echo x > {name}")}))
    };
    let (is_error, text) = write(&mut mcp, "a.txt");
    assert!(
        !is_error,
        "workspace-write allows writes in the root: {text}"
    );
    let (is_error, text) = bash(&mut mcp, "b.txt");
    assert!(!is_error, "{text}");

    s.run(&["session", "set-mode", &id, "read-only"])
        .expect_code(0)
        .expect_output(&["mode read-only"]);
    let marker = denial_marker(ReadOnly);
    let (is_error, text) = write(&mut mcp, "c.txt");
    assert!(is_error && text.starts_with(&marker), "{text}");
    let (is_error, text) = bash(&mut mcp, "d.txt");
    assert!(is_error && text.starts_with(&marker), "{text}");
    assert!(!project.join("c.txt").exists() && !project.join("d.txt").exists());
    assert!(mcp.finish().success());

    s.run(&["session", "show", &id])
        .expect_code(0)
        .expect_output(&["sandbox policy: read-only", "sandbox/mode"]);
}

#[test]
fn cordis_call_exit_codes_approval_flags_and_no_stray_sessions() {
    let s = Scratch::with_bundled_manifest();
    let outside = Outside::new("call");
    let victim = outside.victim().display().to_string();
    let sessions = || s.run(&["session", "list"]).expect_code(0).stdout();

    // Host errors (exit 2) happen before anything is created.
    s.run(&["call", "wirte", r#"{"path": "a.txt", "content": "x"}"#])
        .expect_code(2)
        .expect_output(&["wirte", "write"]);
    s.run(&["call", "write", r#"["a.txt"]"#])
        .expect_code(2)
        .expect_output(&["must be a JSON object"]);
    s.run(&["call", "-c", "missing.yml", "write", "{}"])
        .expect_code(2)
        .expect_output(&["missing.yml"]);
    assert_eq!(sessions().trim(), "", "a failed call left a session behind");

    // A tool result (exit 0), in a session rooted where `cordis call` runs.
    s.run(&["call", "write", r#"{"path": "a.txt", "content": "x\n"}"#])
        .expect_code(0);
    assert_eq!(
        std::fs::read_to_string(s.path().join("a.txt")).unwrap(),
        "x\n"
    );
    assert_eq!(sessions().lines().count(), 1);

    // A tool error result (exit 1): denied outside the root, nothing changed.
    let denied = json!({"path": victim, "content": "changed\n"}).to_string();
    s.run(&["call", "write", &denied])
        .expect_code(1)
        .expect_output(&[&denial_marker(WorkspaceWrite)]);
    assert_eq!(outside.victim_text(), VICTIM);

    // Escalation answered by the flags; with neither (stdin is not a terminal) nobody
    // can be asked.
    let escalating = escalating_call("write", &outside, DangerFullAccess).to_string();
    s.run(&["call", "--deny", "write", &escalating])
        .expect_code(1)
        .expect_output(&[&texts::rejected(DangerFullAccess)]);
    s.run(&["call", "write", &escalating])
        .expect_code(1)
        .expect_output(&[&texts::unavailable(DangerFullAccess)]);
    assert_eq!(outside.victim_text(), VICTIM);
    s.run(&["call", "--approve", "write", &escalating])
        .expect_code(0);
    assert_eq!(outside.victim_text(), format!("{VICTIM}escalated\n"));
}
