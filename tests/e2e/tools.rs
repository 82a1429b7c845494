//! End-to-end tests of the model-facing tools (`dsh-tool-fs`: read, write, edit, list;
//! `dsh-tool-bash`: bash) composed with the real policy service and the real fenced or
//! local backends, all as cdylibs applied through the real host. Each tool is called the way
//! a front-end calls it. Every target that must stay untouched lives outside every writable
//! root (the scratch directories are under the temp area, which is itself writable) and is
//! compared byte for byte before and after.

use std::collections::BTreeMap;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cordis_e2e::{unique, McpStdio, Outside, Scratch, Started, VICTIM};
use cordis_engine::ToolSlot;
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

/// Writes `cordis.yml`: the policy service (default `mode`, fallback root `root`), the
/// backends, both tools; `tool_fs_config` is the `dsh-tool-fs` entry's config as a YAML
/// flow mapping (`{}` for none).
fn manifest(
    scratch: &Scratch,
    mode: SandboxMode,
    root: &Path,
    backends: Backends,
    tool_fs_config: &str,
) {
    let (fs, shell) = match backends {
        Backends::Confined => ("dsh-fs-sandbox", "dsh-bash-sandbox"),
        Backends::Local => ("dsh-fs-local", "dsh-bash-local"),
    };
    scratch.manifest(&format!(
        "- name: dsh-sandbox-policy\n  config:\n    mode: {mode}\n    workspaceRoot: '{}'\n\
         - name: {fs}\n- name: {shell}\n- name: dsh-tool-fs\n  config: {tool_fs_config}\n\
         - name: dsh-tool-bash\n",
        root.display()
    ));
}

/// The policy service (default `mode`, fallback root `root`), the backends, both tools.
fn compose(scratch: &Scratch, mode: SandboxMode, root: &Path, backends: Backends) -> Started {
    manifest(scratch, mode, root, backends, "{}");
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
struct Tools(BTreeMap<String, std::sync::Arc<ToolSlot>>);

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
            cancel_fd: None,
            progress_fd: None,
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
            Want::Error("invalid arguments: `offset`: 0 is less than the minimum of 1"),
        ),
        (
            "read",
            json!({"path": "notes/a.txt", "limit": 0}),
            Want::Error("invalid arguments: `limit`: 0 is less than the minimum of 1"),
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
// Bounded reads

/// How long one `cordis call` may take before it counts as blocked; a debug build answers
/// in well under a second.
const CALL_DEADLINE: Duration = Duration::from_secs(20);

/// The data segment one `cordis call` may use: ample for the host and every plugin, far
/// below what holding a gigabyte file takes.
const CALL_MAX_DATA: u64 = 512 << 20;

/// Runs `cordis call TOOL ARGS` in `scratch` under [`CALL_DEADLINE`] and [`CALL_MAX_DATA`],
/// checks that it exits with `code` and prints every needle, and returns its stdout.
fn call(scratch: &Scratch, tool: &str, args: Value, code: i32, needles: &[&str]) -> String {
    let args = args.to_string();
    let run = scratch.run_bounded(&["call", tool, &args], CALL_DEADLINE, CALL_MAX_DATA);
    run.expect_code(code).expect_output(needles);
    run.stdout()
}

/// Runs `check` once per backend family (fenced and local), each in a fresh scratch
/// directory composed in workspace-write rooted at it with the default tool config.
fn for_each_backend(check: impl Fn(Backends, &Scratch, &Path)) {
    for backends in [Backends::Confined, Backends::Local] {
        let scratch = Scratch::new();
        let root = scratch.path();
        manifest(&scratch, WorkspaceWrite, &root, backends, "{}");
        check(backends, &scratch, &root);
    }
}

/// A scratch directory composed in workspace-write rooted at it, fenced backends, with
/// `tool_fs_config` for `dsh-tool-fs`; and its path.
fn confined_with(tool_fs_config: &str) -> (Scratch, PathBuf) {
    let scratch = Scratch::new();
    let root = scratch.path();
    manifest(
        &scratch,
        WorkspaceWrite,
        &root,
        Backends::Confined,
        tool_fs_config,
    );
    (scratch, root)
}

/// Makes `path` a 1 GiB file: `start`, then zeros (a sparse file: no disk used).
fn sparse_gigabyte(path: &Path, start: &[u8]) {
    std::fs::write(path, start).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|f| f.set_len(1 << 30))
        .unwrap_or_else(|e| panic!("extend {} to 1 GiB: {e}", path.display()));
}

/// Creates a FIFO at `path`; nothing ever opens it for writing.
fn mkfifo(path: &Path) {
    use rustix::fs::{mknodat, FileType, Mode, CWD};
    mknodat(CWD, path, FileType::Fifo, Mode::RUSR | Mode::WUSR, 0)
        .unwrap_or_else(|e| panic!("mkfifo {}: {e}", path.display()));
}

#[test]
fn fifos_sockets_devices_and_directories_are_refused_without_blocking() {
    for_each_backend(|backends, scratch, root| {
        let pipe = root.join("pipe");
        mkfifo(&pipe);
        std::os::unix::fs::symlink(&pipe, root.join("link-to-pipe")).expect("symlink");
        let _socket = UnixListener::bind(root.join("socket")).expect("bind a unix socket");
        std::fs::create_dir(root.join("dir")).expect("mkdir");
        let refused = |op: &str, path: &str, kind: &str| {
            let shown = if path.starts_with('/') {
                path.to_string()
            } else {
                root.join(path).display().to_string()
            };
            format!("cannot {op} `{shown}`: it is {kind}, not a regular file")
        };
        let fifo = "a FIFO (named pipe)";
        let edit_pipe = json!({"path": "pipe", "old_string": "a", "new_string": "b"});
        let cases: [(&str, Value, String); 7] = [
            (
                "read",
                json!({"path": "pipe"}),
                refused("read", "pipe", fifo),
            ),
            (
                "read",
                json!({"path": "pipe", "offset": 2, "limit": 1}),
                refused("read", "pipe", fifo),
            ),
            (
                "read",
                json!({"path": "link-to-pipe"}),
                refused("read", "link-to-pipe", fifo),
            ),
            ("edit", edit_pipe, refused("read", "pipe", fifo)),
            (
                "read",
                json!({"path": "socket"}),
                refused("read", "socket", "a socket"),
            ),
            (
                "read",
                json!({"path": "/dev/zero"}),
                refused("read", "/dev/zero", "a character device"),
            ),
            (
                "read",
                json!({"path": "dir"}),
                refused("read", "dir", "a directory"),
            ),
        ];
        for (tool, args, want) in cases {
            // Exit 1: an error result naming the path and its kind, with a fix.
            call(
                scratch,
                tool,
                args,
                1,
                &[&want, "[FS_WRONG_KIND]", "\nhelp: "],
            );
        }
        // Listing a FIFO is refused by the lookup, never blocks on the open.
        call(
            scratch,
            "list",
            json!({"path": "pipe"}),
            1,
            &["cannot list", "Not a directory", "[FS_WRONG_KIND]"],
        );
        // Nothing is even opened: a writer waiting for a reader stays waiting (an open for
        // reading, even non-blocking, would release it).
        let mut writer = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("echo released > '{}'", pipe.display()))
            .spawn()
            .expect("start a writer");
        for (tool, args) in [
            ("read", json!({"path": "pipe"})),
            (
                "edit",
                json!({"path": "pipe", "old_string": "a", "new_string": "b"}),
            ),
            ("list", json!({"path": "pipe"})),
        ] {
            call(scratch, tool, args, 1, &["[FS_WRONG_KIND]"]);
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
        let waiting = writer.try_wait().expect("the writer's status").is_none();
        let _ = writer.kill();
        let _ = writer.wait();
        assert!(waiting, "{backends:?}: a refused call opened the FIFO");
        let kind = std::fs::symlink_metadata(&pipe).expect("lstat the FIFO");
        assert!(
            kind.file_type().is_fifo(),
            "{backends:?}: the refused edit must leave the FIFO in place"
        );
    });
}

#[test]
fn a_fifo_does_not_stall_the_mcp_server() {
    let s = Scratch::with_bundled_manifest();
    mkfifo(&s.path().join("pipe"));
    s.write("notes.txt", "still here\n");
    let mut mcp = McpStdio::start(s.cordis(&["run", "--no-watch"]));
    let (is_error, text) = mcp.call("read", json!({"path": "pipe"}));
    assert!(
        is_error && text.contains("it is a FIFO (named pipe), not a regular file"),
        "reading a FIFO must be refused at once: {text}"
    );
    let (is_error, text) = mcp.call("read", json!({"path": "notes.txt"}));
    assert!(
        !is_error && text == "still here\n",
        "the server must go on serving: {text}"
    );
    assert!(
        mcp.finish().success(),
        "the server must exit cleanly at the end of input"
    );
}

/// `count` lines `line 1`, `line 2`, ... joined, each with its break.
fn numbered(lines: std::ops::RangeInclusive<u64>) -> String {
    lines.map(|n| format!("line {n}\n")).collect()
}

#[test]
fn binary_content_is_described_never_dumped() {
    for_each_backend(|backends, scratch, root| {
        std::fs::write(root.join("nul.bin"), b"text\0more\n").expect("write nul.bin");
        std::fs::write(root.join("latin1.txt"), b"caf\xe9\n").expect("write latin1.txt");
        sparse_gigabyte(&root.join("sparse.bin"), b"");
        // 1000 lines of 17 bytes, past the 8 KiB sniffed at the start, then a NUL.
        let row = "0123456789abcdef\n";
        let late = format!("{}x\0y\nafter\n", row.repeat(1000));
        std::fs::write(root.join("late.txt"), late).expect("write late.txt");
        let late_path = root.join("late.txt").display().to_string();
        let binary = |name: &str, detail: &str| {
            format!(
                "`{}` is a binary file ({detail}), not text; its content is not shown",
                root.join(name).display()
            )
        };
        let xxd = |name: &str| format!("xxd '{}' | head", root.join(name).display());
        let cases: [(&str, String, String); 3] = [
            (
                "nul.bin",
                binary("nul.bin", "10 bytes; a NUL byte at byte 4"),
                xxd("nul.bin"),
            ),
            (
                "latin1.txt",
                binary("latin1.txt", "5 bytes; invalid UTF-8 at byte 3"),
                xxd("latin1.txt"),
            ),
            (
                "sparse.bin",
                binary("sparse.bin", "1073741824 bytes; a NUL byte at byte 0"),
                xxd("sparse.bin"),
            ),
        ];
        for (name, message, hint) in cases {
            let out = call(
                scratch,
                "read",
                json!({ "path": name }),
                1,
                &[&message, &hint, "[FS_NOT_TEXT]"],
            );
            assert!(out.len() < 1024, "{name}: a short refusal, got {out:?}");
        }
        // A page stops before a binary line past the sniffed start ...
        let out = call(
            scratch,
            "read",
            json!({"path": "late.txt", "offset": 999}),
            0,
            &[],
        );
        let want = format!(
            "{row}{row}[Stopped before line 1001: it holds binary content (a NUL byte at byte 17001), which is not shown; lines 999-1000 shown. To inspect it, use `bash`, e.g. `xxd -s 17001 -l 256 '{late_path}'`.]\n"
        );
        assert_eq!(
            out, want,
            "{backends:?}: the page ends before the binary line"
        );
        // ... a page starting at it is refused, and the text after it reads.
        call(
            scratch,
            "read",
            json!({"path": "late.txt", "offset": 1001}),
            1,
            &["a NUL byte at byte 17001", "[FS_NOT_TEXT]"],
        );
        let out = call(
            scratch,
            "read",
            json!({"path": "late.txt", "offset": 1002}),
            0,
            &[],
        );
        assert_eq!(
            out, "after\n\n",
            "{backends:?}: the line after the binary one"
        );
    });
}

#[test]
fn a_sparse_gigabyte_file_is_read_one_bounded_page_at_a_time() {
    for_each_backend(|backends, scratch, root| {
        let text = numbered(1..=3000);
        sparse_gigabyte(&root.join("huge.txt"), text.as_bytes());
        let out = call(scratch, "read", json!({"path": "huge.txt"}), 0, &[]);
        let want = format!(
            "{}[Cut at the 2000-line read cap: lines 1-2000 shown; the file (1073741824 bytes) goes on. To continue, call read with offset 2001.]\n",
            numbered(1..=2000)
        );
        assert_eq!(
            out, want,
            "{backends:?}: the first page, cut by the default line cap"
        );
        assert!(
            out.len() < 32 * 1024,
            "{backends:?}: the output of a 1 GiB file must stay small, got {} bytes",
            out.len()
        );
        let out = call(
            scratch,
            "read",
            json!({"path": "huge.txt", "offset": 2001}),
            0,
            &[],
        );
        let want = format!(
            "{}[Stopped before line 3001: it holds binary content (a NUL byte at byte {}), which is not shown; lines 2001-3000 shown. To inspect it, use `bash`, e.g. `xxd -s {} -l 256 '{}'`.]\n",
            numbered(2001..=3000),
            text.len(),
            text.len(),
            root.join("huge.txt").display()
        );
        assert_eq!(out, want, "{backends:?}: the second page, up to the zeros");
        let out = call(
            scratch,
            "read",
            json!({"path": "huge.txt", "offset": 2990, "limit": 3}),
            0,
            &[],
        );
        assert_eq!(
            out,
            format!("{}\n", numbered(2990..=2992)),
            "{backends:?}: a limited page"
        );
    });
}

#[test]
fn an_edit_holds_at_most_sixteen_mebibytes() {
    for_each_backend(|backends, scratch, root| {
        sparse_gigabyte(&root.join("huge.txt"), b"");
        let out = call(
            scratch,
            "edit",
            json!({"path": "huge.txt", "old_string": "a", "new_string": "b"}),
            1,
            &["FS_TOO_LARGE", "the file is larger than 16 MiB"],
        );
        assert!(out.len() < 4096, "{backends:?}: {out}");
        // A small file whose edit would grow past the bound: refused, left as it was.
        let small = "x".repeat(1024);
        std::fs::write(root.join("small.txt"), &small).expect("write small.txt");
        call(
            scratch,
            "edit",
            json!({"path": "small.txt", "old_string": "x", "new_string": "y".repeat(32 * 1024), "replace_all": true}),
            1,
            &["FS_TOO_LARGE", "the edited text is larger than 16 MiB"],
        );
        assert_eq!(
            std::fs::read_to_string(root.join("small.txt")).expect("read small.txt"),
            small,
            "{backends:?}: a refused edit changes nothing"
        );
    });
}

#[test]
fn a_huge_directory_is_listed_up_to_the_cap() {
    let (scratch, root) = confined_with("{listMaxEntries: 3}");
    std::fs::create_dir(root.join("many")).expect("mkdir many");
    // Created in reverse, so the directory's own order is not the answer.
    for i in (0..500).rev() {
        std::fs::write(root.join(format!("many/f{i:03}")), "").expect("create a file");
    }
    let out = call(&scratch, "list", json!({"path": "many"}), 0, &[]);
    assert_eq!(
        out,
        format!(
            "f000\nf001\nf002\n[Cut at the 3-entry list cap: the first 3 of 500 entries by name shown. To see the rest, list a subdirectory, or use `bash`, e.g. `ls -A '{}' | sed -n '4,6p'`.]\n",
            root.join("many").display()
        )
    );
    let out = call(&scratch, "list", json!({"path": "."}), 0, &[]);
    assert_eq!(out, "cordis.yml\nmany/\n", "at the cap, no note");
}

#[test]
fn read_pages_follow_the_configured_caps() {
    let (scratch, root) =
        confined_with("{readMaxLines: 3, readMaxBytes: 64, readMaxLineBytes: 10}");
    let started = scratch.start();
    let s = started.session(&root);
    scratch.write("five.txt", "one\ntwo\nthree\nfour\nfive\n");
    scratch.write("wide.txt", &format!("{0}\n{0}\n", "x".repeat(30)));
    scratch.write("long.txt", &format!("short\n{}\nend", "y".repeat(25)));
    scratch.write("accents.txt", "aéééééé\n");
    let path = |name: &str| root.join(name).display().to_string();
    let cut_at = |cap: &str, shown: &str, size: &str, next: u64| {
        format!("[Cut at the {cap} read cap: {shown}; the file{size} goes on. To continue, call read with offset {next}.]")
    };
    let long = |line: u64, file: &str| {
        format!("[Line {line} is longer than 10 bytes: cut there and marked `[… line cut: <length> bytes]`. To see a whole line, use `bash`, e.g. `sed -n '{line}p' '{}' | fold -w 10`.]", path(file))
    };
    let pages = [
        (
            json!({"path": "five.txt"}),
            format!(
                "one\ntwo\nthree\n{}",
                cut_at("3-line", "lines 1-3 shown", " (24 bytes)", 4)
            ),
        ),
        (
            json!({"path": "five.txt", "offset": 4}),
            "four\nfive\n".to_string(),
        ),
        (
            json!({"path": "five.txt", "offset": 2, "limit": 2}),
            "two\nthree\n".to_string(),
        ),
        (
            json!({"path": "five.txt", "offset": 2, "limit": 4}),
            format!(
                "two\nthree\nfour\n{}",
                cut_at("3-line", "lines 2-4 shown", " (24 bytes)", 5)
            ),
        ),
        (
            json!({"path": "wide.txt"}),
            format!(
                "xxxxxxxxxx [… line cut: 30 bytes]\n{}\n{}",
                long(1, "wide.txt"),
                cut_at("64-byte", "line 1 shown", " (62 bytes)", 2)
            ),
        ),
        (
            json!({"path": "wide.txt", "offset": 2}),
            format!("xxxxxxxxxx [… line cut: 30 bytes]\n{}", long(2, "wide.txt")),
        ),
        (
            json!({"path": "long.txt"}),
            format!(
                "short\nyyyyyyyyyy [… line cut: 25 bytes]\nend\n{}",
                long(2, "long.txt")
            ),
        ),
        (
            json!({"path": "accents.txt"}),
            format!("aéééé [… line cut: 13 bytes]\n{}", long(1, "accents.txt")),
        ),
    ];
    for (args, want) in pages {
        check(&started, &s, "read", args, Want::Exact(&want));
    }
    check(
        &started,
        &s,
        "read",
        json!({"path": "five.txt", "offset": 6}),
        Want::Error("`offset` 6 is past the end of"),
    );
    // /proc files report size 0 and still read, whole or up to the caps.
    check(
        &started,
        &s,
        "read",
        json!({"path": "/proc/sys/kernel/ostype"}),
        Want::Exact("Linux\n"),
    );
    let meminfo = check(
        &started,
        &s,
        "read",
        json!({"path": "/proc/meminfo"}),
        Want::Ok(&cut_at("64-byte", "line 1 shown", "", 2)),
    );
    assert!(meminfo.text.starts_with("MemTotal:"), "{meminfo:?}");
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
                started.host.approvals().set_default(Some(Arc::new(
                    move |req: &ApprovalRequest| {
                        log.lock().expect("ask log").push(req.clone());
                        o
                    },
                )));
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
    let events = || started.host.sessions().events(&s.id, None).expect("events");
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
                assert!(
                    req.summary.contains("victim.txt") || req.detail.contains("victim.txt"),
                    "{req:?}"
                );
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
            // The schema makes each field require the other: the host refuses the call.
            let wanted = format!("invalid arguments: \"{drop}\" is a required property");
            check(&started, &s, tool, args, Want::Error(&wanted));
        }
        let mut args = escalating_call(tool, &outside, requested);
        args["sandbox_permissions"] = json!("root");
        check(
            &started,
            &s,
            tool,
            args,
            Want::Error("invalid arguments: `sandbox_permissions`: \"root\" is not one of \"read-only\", \"workspace-write\" or \"danger-full-access\""),
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
    let events = || started.host.sessions().events(&s.id, None).expect("events");
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
                    Want::Error(
                        "invalid arguments: Additional properties are not allowed ('justification', 'sandbox_permissions' were unexpected)",
                    ),
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
            Want::Error("invalid arguments: \"content\" is a required property"),
        ),
        (
            "write",
            json!({"path": "a.txt", "content": null}),
            Want::Error("invalid arguments: `content`: null is not of type \"string\""),
        ),
        (
            "edit",
            json!({"path": "a.txt", "old_string": "x"}),
            Want::Error("invalid arguments: \"new_string\" is a required property"),
        ),
        (
            "edit",
            json!({"path": "a.txt", "old_string": "x", "new_string": "y", "replace_all": "yes"}),
            Want::Error("invalid arguments: `replace_all`: \"yes\" is not of type"),
        ),
        (
            "read",
            json!({"path": "a.txt", "offset": -1}),
            Want::Error("invalid arguments: `offset`: -1 is less than the minimum of 1"),
        ),
        (
            "read",
            json!({"path": "a.txt", "offset": 1.5}),
            Want::Error("invalid arguments: `offset`: 1.5 is not of type"),
        ),
        (
            "bash",
            json!({"command": ""}),
            Want::Error("`command` is empty"),
        ),
        (
            "bash",
            json!({"command": "true", "timeout_ms": 0}),
            Want::Error("invalid arguments: `timeout_ms`: 0 is less than the minimum of 1"),
        ),
        (
            "bash",
            json!({"command": "true", "timeout_ms": 600_001}),
            Want::Error(
                "invalid arguments: `timeout_ms`: 600001 is greater than the maximum of 600000",
            ),
        ),
        (
            "bash",
            json!({"command": "true", "workdir": ""}),
            Want::Error("`workdir` is empty"),
        ),
        (
            "bash",
            json!({"cmd": "true"}),
            Want::Error(
                "invalid arguments: Additional properties are not allowed ('cmd' was unexpected)",
            ),
        ),
        (
            "bash",
            json!("true"),
            Want::Error("invalid arguments: \"true\" is not of type \"object\""),
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
