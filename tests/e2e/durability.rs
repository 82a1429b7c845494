//! Durability observed, not assumed: the real `cordis` runs under `strace`, and the system
//! calls show a fenced write's data synced before its rename, the directory synced after
//! it, and a session event synced, all before the command reports success.

use cordis_e2e::Scratch;

/// Runs `cordis ARGS` in `s` under `strace -f`, tracing file writes, syncs and renames;
/// returns the trace lines (each with the descriptor's path, `-y`).
fn traced(s: &Scratch, args: &[&str]) -> Vec<String> {
    let strace = ["/usr/bin/strace", "/bin/strace"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .unwrap_or_else(|| {
            panic!("strace is not installed: install it (`apt-get install strace`; .ci/run does) to run the durability tests")
        });
    let log = s.path().join(format!("strace-{}.txt", args[0]));
    let cmd = s.cordis(args);
    let program = cmd.get_program().to_owned();
    let cordis_args: Vec<_> = cmd.get_args().map(|a| a.to_owned()).collect();
    let mut traced = std::process::Command::new(strace);
    traced
        .args(["-f", "-y", "-qq", "-s", "256", "-o"])
        .arg(&log)
        .args([
            "-e",
            "trace=openat,write,fsync,fdatasync,rename,renameat,renameat2",
        ])
        .arg(program)
        .args(cordis_args)
        .current_dir(s.path())
        .envs(
            cmd.get_envs()
                .filter_map(|(k, v)| Some((k.to_owned(), v?.to_owned()))),
        )
        .stdin(std::process::Stdio::null());
    let out = traced.output().expect("run strace");
    let trace = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        out.status.success(),
        "strace {args:?}: {:?}\n{}\n{}\n{trace}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        trace.contains("fsync(") || trace.contains("fdatasync("),
        "strace recorded no sync at all (is ptrace allowed here?):\n{trace}"
    );
    trace.lines().map(str::to_string).collect()
}

/// The index of the first line at or after `from` that contains every needle.
fn find(trace: &[String], from: usize, needles: &[&str], what: &str) -> usize {
    trace[from..]
        .iter()
        .position(|l| needles.iter().all(|n| l.contains(n)))
        .map(|i| from + i)
        .unwrap_or_else(|| {
            panic!(
                "{what}: no line with {needles:?} after line {from}:\n{}",
                trace.join("\n")
            )
        })
}

#[test]
fn a_fenced_write_is_synced_before_its_rename_and_the_directory_after_it() {
    let s = Scratch::with_bundled_manifest();
    let trace = traced(
        &s,
        &[
            "call",
            "write",
            r#"{"path": "notes.txt", "content": "durable\n"}"#,
        ],
    );
    let dir = s.path().display().to_string();
    let temp = format!("{dir}/.notes.txt.");
    let data = find(&trace, 0, &["write(", &temp, "\"durable\\n\""], "the data");
    let synced = find(&trace, data, &["fsync(", &temp, " = 0"], "the data synced");
    let renamed = find(
        &trace,
        synced,
        &["rename", ".notes.txt.", "\"notes.txt\")", " = 0"],
        "the rename, after the sync",
    );
    find(
        &trace,
        renamed,
        &["fsync(", &format!("<{dir}>)"), " = 0"],
        "the directory synced after the rename",
    );
    find(
        &trace,
        renamed,
        &["write(1", "Wrote 8 bytes"],
        "success reported last",
    );
}

#[test]
fn a_session_event_is_synced_before_the_command_returns() {
    let s = Scratch::with_bundled_manifest();
    let created = s.run(&["session", "new"]);
    created.expect_code(0);
    let id = created.stdout().trim().to_string();
    let trace = traced(&s, &["session", "set-mode", &id, "read-only"]);
    let log = format!("{id}.jsonl>");
    let event = find(
        &trace,
        0,
        &["write(", &log, "sandbox/mode", "read-only"],
        "the event appended",
    );
    find(
        &trace,
        event,
        &["fdatasync(", &log, " = 0"],
        "the event synced",
    );
}
