//! The composition protects itself: each attack a hostile agent tried, through the real
//! host (`cordis run` over MCP, `cordis call`), the real cdylibs and the real kernel, with
//! the manifest and the libraries inside the session root as `cargo xtask run` has them.
//! Every test checks that the target is unchanged byte for byte, and that the same kind of
//! change to an unprotected file still works, so a refusal cannot pass by refusing all.

use std::path::{Path, PathBuf};
use std::process::Command;

use cordis_e2e::{bundled_manifest, library, McpStdio, Outside, Scratch};
use dsh_sandbox::{denial_marker, SandboxMode};
use serde_json::{json, Value};

const BUNDLED: [&str; 5] = [
    "dsh-sandbox-policy",
    "dsh-fs-sandbox",
    "dsh-bash-sandbox",
    "dsh-tool-fs",
    "dsh-tool-bash",
];

/// The `cargo xtask run` layout: the bundled `cordis.yml` and a copy of every bundled
/// library (in `lib/`, searched first) inside the scratch dir, which is the session root.
fn xtask_layout() -> (Scratch, PathBuf) {
    let s = Scratch::with_bundled_manifest();
    let lib = s.path().join("lib");
    std::fs::create_dir_all(&lib).expect("lib dir");
    for plugin in BUNDLED {
        let file = library(plugin);
        std::fs::copy(&file, lib.join(file.file_name().expect("a file name"))).expect("copy");
    }
    (s, lib)
}

fn marker() -> String {
    denial_marker(SandboxMode::WorkspaceWrite)
}

/// `cordis call TOOL ARGS` in `s` (session rooted at `s`) with `env` added.
fn call(s: &Scratch, env: &[(&str, &str)], tool: &str, args: Value) -> cordis_e2e::Run {
    let mut cmd = s.cordis(&["call", tool, &args.to_string()]);
    cmd.envs(env.iter().copied()).env("RUST_LOG", "warn");
    run(cmd, &format!("cordis call {tool} {args}"), s)
}

fn run(cmd: Command, what: &str, s: &Scratch) -> cordis_e2e::Run {
    s.run_command(cmd, what)
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

#[test]
fn the_manifest_and_libraries_in_the_session_root_cannot_be_rewritten_over_mcp() {
    let (s, lib) = xtask_layout();
    let manifest = s.path().join("cordis.yml");
    let library = lib.join("libdsh_fs_sandbox.so");
    let (yml, so) = (read(&manifest), read(&library));
    let mut cmd = s.cordis(&["run", "-c", "cordis.yml", "--plugin-path", "lib"]);
    cmd.stderr(std::process::Stdio::null());
    let mut client = McpStdio::start(cmd);
    let widened = String::from_utf8(yml.clone())
        .expect("utf-8")
        .replace("mode: workspace-write", "mode: danger-full-access");
    let m = manifest.display().to_string();
    let l = library.display().to_string();
    let attacks = [
        ("write", json!({"path": m, "content": widened})),
        (
            "edit",
            json!({"path": m, "old_string": "mode: workspace-write", "new_string": "mode: danger-full-access"}),
        ),
        ("write", json!({"path": l, "content": "\u{7f}ELF evil"})),
    ];
    for (tool, args) in attacks {
        let (is_error, text) = client.call(tool, args.clone());
        assert!(
            is_error && text.starts_with(&marker()),
            "{tool} {args}: {text}"
        );
        assert!(text.contains("is protected"), "{text}");
    }
    for command in [
        "sed -i 's/mode: workspace-write/mode: danger-full-access/' cordis.yml",
        "echo '- name: evil' >> cordis.yml",
        "mv cordis.yml gone.yml",
        "cp /bin/true lib/libdsh_fs_sandbox.so",
        "mv lib lib.away && mkdir lib",
    ] {
        let (_, text) = client.call("bash", json!({ "command": command }));
        assert!(
            text.contains("Read-only file system") || text.contains("Device or resource busy"),
            "{command}: {text}"
        );
    }
    // The same changes to unprotected files work.
    let (is_error, text) = client.call("write", json!({"path": "free.txt", "content": "ok"}));
    assert!(!is_error, "{text}");
    let (is_error, text) = client.call(
        "bash",
        json!({"command": "cp cordis.yml copy.yml && echo x >> copy.yml"}),
    );
    assert!(!is_error, "{text}");
    assert_eq!(read(&manifest), yml);
    assert_eq!(read(&library), so);
    // No reload widened the running composition: a write outside is still denied.
    let outside = Outside::new("protect-mcp");
    let (is_error, text) = client.call(
        "write",
        json!({"path": outside.victim().display().to_string(), "content": "x"}),
    );
    assert!(is_error && text.starts_with(&marker()), "{text}");
    assert_eq!(outside.victim_text(), cordis_e2e::VICTIM);
    drop(client);
}

#[test]
fn a_library_on_the_search_path_cannot_be_replaced_through_cordis_call() {
    let (s, lib) = xtask_layout();
    let target = lib.join("libdsh_tool_fs.so");
    let before = read(&target);
    let env = [("CORDIS_PLUGIN_PATH", "lib")];
    call(
        &s,
        &env,
        "write",
        json!({"path": target.display().to_string(), "content": "evil"}),
    )
    .expect_code(1)
    .expect_output(&[&marker(), "is protected"]);
    let planted = lib.join("libevil.so");
    call(
        &s,
        &env,
        "bash",
        json!({"command": format!("cp /bin/true {}; cp /bin/true {}", target.display(), planted.display())}),
    )
    .expect_output(&["Read-only file system"]);
    assert_eq!(read(&target), before);
    assert!(!planted.exists());
}

#[test]
fn git_hooks_and_config_are_read_only_while_commits_keep_working() {
    let s = Scratch::with_bundled_manifest();
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .args(args)
            .current_dir(s.path())
            .output()
            .expect("git must be installed for this test");
        assert!(out.status.success(), "git {args:?}: {out:?}");
    };
    git(&["init", "-q"]);
    let hook = s.path().join(".git/hooks/pre-commit");
    let config = s.path().join(".git/config");
    let config_before = read(&config);
    call(
        &s,
        &[],
        "write",
        json!({"path": hook.display().to_string(), "content": "#!/bin/sh\ntouch ~/pwned\n"}),
    )
    .expect_code(1)
    .expect_output(&[&marker(), ".git/hooks"]);
    call(
        &s,
        &[],
        "bash",
        json!({"command": "echo 'touch ~/pwned' > .git/hooks/pre-commit; echo '[core]' >> .git/config; mv .git .git.away"}),
    )
    .expect_output(&["Read-only file system", "Device or resource busy"]);
    assert!(!hook.exists());
    assert_eq!(read(&config), config_before);
    call(
        &s,
        &[],
        "bash",
        json!({"command": "echo hi > a.txt && git add a.txt && git -c user.name=t -c user.email=t@t commit -qm one && git log --oneline | wc -l"}),
    )
    .expect_code(0)
    .expect_output(&["1"]);
    // An approved escalation may still change a protected path.
    call(
        &s,
        &[],
        "write",
        json!({
            "path": hook.display().to_string(),
            "content": "#!/bin/sh\n",
            "sandbox_permissions": "danger-full-access",
            "justification": "install the project's hook",
        }),
    )
    .expect_code(1)
    .expect_output(&["unavailable"]);
    let mut approved = s.cordis(&[
        "call",
        "--approve",
        "write",
        &json!({
            "path": hook.display().to_string(),
            "content": "#!/bin/sh\n",
            "sandbox_permissions": "danger-full-access",
            "justification": "install the project's hook",
        })
        .to_string(),
    ]);
    approved.env("RUST_LOG", "warn");
    run(approved, "cordis call --approve write", &s).expect_code(0);
    assert_eq!(read(&hook), b"#!/bin/sh\n");
}

#[test]
fn without_a_state_dir_commands_fail_instead_of_guessing() {
    let s = Scratch::with_bundled_manifest();
    let mut cmd = s.cordis(&["call", "list", r#"{"path": "."}"#]);
    cmd.env_remove("CORDIS_STATE_DIR")
        .env_remove("XDG_STATE_HOME")
        .env_remove("HOME");
    run(cmd, "cordis call list (no HOME)", &s)
        .expect_code(1)
        .expect_output(&["no state directory", "--state-dir"]);
    assert!(!s.path().join(".cordis-state").exists());
    // `cordis check` keeps no state and still works.
    let mut check = s.cordis(&["check"]);
    check.env_remove("CORDIS_STATE_DIR").env_remove("HOME");
    run(check, "cordis check (no HOME)", &s).expect_code(0);
}

#[test]
fn a_state_dir_inside_the_workspace_is_refused() {
    let s = Scratch::with_bundled_manifest();
    let inside = s.path().join("state");
    let state = inside.display().to_string();
    call(
        &s,
        &[("CORDIS_STATE_DIR", &state)],
        "list",
        json!({"path": "."}),
    )
    .expect_code(2)
    .expect_output(&["SANDBOX_STATE_DIR_WRITABLE", &state, "--state-dir"]);
}

#[test]
fn a_temp_dir_at_home_or_root_is_not_a_writable_root() {
    let s = Scratch::with_bundled_manifest();
    // A home outside the temp areas (which are writable roots of their own).
    let outside = Outside::new("protect-home");
    let home = outside.dir.clone();
    let project = home.join("project");
    std::fs::create_dir_all(&project).expect("project");
    std::fs::write(project.join("cordis.yml"), bundled_manifest()).expect("manifest");
    let state = home.join(".local/state/cordis");
    let h = home.display().to_string();
    let mut new = s.cordis(&["session", "new", "--cwd", &project.display().to_string()]);
    new.env_remove("CORDIS_STATE_DIR")
        .current_dir(&project)
        .env("HOME", &h);
    let id = run(new, "cordis session new", &s).expect_code(0).stdout();
    let id = id.trim();
    let log = state.join("sessions").join(format!("{id}.jsonl"));
    let before = read(&log);
    let forged =
        r#"{"type":"event","seq":2,"kind":"sandbox/mode","data":{"mode":"danger-full-access"}}"#;
    for tmpdir in [h.as_str(), "/"] {
        let mut bash = s.cordis(&[
            "call",
            "--session",
            id,
            "bash",
            &json!({"command": format!("echo '{forged}' >> {}; touch {}/x", log.display(), h)})
                .to_string(),
        ]);
        bash.env_remove("CORDIS_STATE_DIR")
            .current_dir(&project)
            .env("HOME", &h)
            .env("TMPDIR", tmpdir)
            .env("RUST_LOG", "warn");
        run(bash, &format!("cordis call bash (TMPDIR={tmpdir})"), &s)
            .expect_output(&["(TMPDIR) is not a writable root", "Read-only file system"]);
        let mut write = s.cordis(&[
            "call",
            "--session",
            id,
            "write",
            &json!({"path": log.display().to_string(), "content": forged}).to_string(),
        ]);
        write
            .env_remove("CORDIS_STATE_DIR")
            .current_dir(&project)
            .env("HOME", &h)
            .env("TMPDIR", tmpdir);
        run(write, "cordis call write", &s)
            .expect_code(1)
            .expect_output(&[&marker()]);
    }
    assert_eq!(read(&log), before);
    assert!(!home.join("x").exists());
}

#[test]
fn a_workspace_write_session_at_the_root_of_the_file_system_is_refused() {
    let s = Scratch::with_bundled_manifest();
    let mut cmd = s.cordis(&["call", "bash", r#"{"command": "true"}"#]);
    cmd.current_dir("/")
        .arg("-c")
        .arg(s.path().join("cordis.yml"));
    run(cmd, "cordis call bash in /", &s)
        .expect_code(2)
        .expect_output(&["SANDBOX_BAD_ROOT", "`/` cannot be a workspace-write root"]);
}

#[test]
fn a_session_root_swapped_for_a_symlink_fails_closed() {
    let s = Scratch::with_bundled_manifest();
    let project = s.path().join("project");
    std::fs::create_dir_all(&project).expect("project");
    let p = project.display().to_string();
    let id = s
        .run(&["session", "new", "--cwd", &p])
        .expect_code(0)
        .stdout();
    let id = id.trim();
    let in_session =
        |tool: &str, args: Value| s.run(&["call", "--session", id, tool, &args.to_string()]);
    // Inside the sandbox the root is a mount point: it cannot be moved away.
    in_session(
        "bash",
        json!({"command": format!("cd ..; mv {p} {p}.away && ln -s / {p}")}),
    )
    .expect_output(&["Device or resource busy"]);
    assert!(project.is_dir() && !project.is_symlink());
    // Swapped by other means, the next call refuses instead of following the link.
    std::fs::rename(&project, s.path().join("project.away")).expect("move");
    std::os::unix::fs::symlink("/", &project).expect("symlink");
    let outside = Outside::new("protect-swap");
    let victim = outside.victim().display().to_string();
    for (tool, args) in [
        ("write", json!({"path": victim, "content": "x"})),
        ("bash", json!({"command": format!("echo x > {victim}")})),
    ] {
        in_session(tool, args).expect_code(1).expect_output(&[
            "SANDBOX_BAD_ROOT",
            "no longer names the directory",
            "start a new session",
        ]);
    }
    // The same with another directory at the same path.
    std::fs::remove_file(&project).expect("unlink");
    std::fs::create_dir(&project).expect("another dir");
    in_session("list", json!({"path": "."}))
        .expect_code(1)
        .expect_output(&["another directory is there now"]);
    assert_eq!(outside.victim_text(), cordis_e2e::VICTIM);
}

#[test]
fn reads_reveal_neither_the_host_process_nor_denied_paths() {
    let s = Scratch::new();
    let outside = Outside::new("protect-read");
    let secret = outside.dir.join("secret.txt");
    std::fs::write(&secret, "s3cret-outside").expect("secret");
    std::fs::write(s.path().join(".env"), "API_KEY=s3cret-env\n").expect(".env");
    std::fs::create_dir_all(s.path().join("keys")).expect("keys");
    std::fs::write(s.path().join("keys/id"), "s3cret-key").expect("key");
    s.manifest(&format!(
        "- name: dsh-sandbox-policy\n  config:\n    mode: workspace-write\n    denyRead: ['**/.env', '{}', '{}']\n\
         - name: dsh-fs-sandbox\n- name: dsh-bash-sandbox\n- name: dsh-tool-fs\n- name: dsh-tool-bash\n",
        secret.display(),
        s.path().join("keys").display()
    ));
    // A credential in the host's environment (the shell's own environment leaves it out
    // by default, so anything that shows it was read from the host process).
    let env = [("CORDIS_E2E_API_TOKEN", "s3cret-host-env")];
    for path in [
        "/proc/self/environ",
        "/proc/thread-self/environ",
        "/proc/1/environ",
    ] {
        let r = call(&s, &env, "read", json!({ "path": path }));
        r.expect_code(1).expect_output(&["FS_READ_DENIED"]);
        assert!(!r.stdout().contains("s3cret"), "{}", r.stdout());
    }
    call(&s, &env, "list", json!({"path": "/proc/self/fd"}))
        .expect_code(1)
        .expect_output(&["FS_READ_DENIED"]);
    for path in [
        s.path().join(".env"),
        secret.clone(),
        s.path().join("keys/id"),
    ] {
        let r = call(
            &s,
            &env,
            "read",
            json!({ "path": path.display().to_string() }),
        );
        r.expect_code(1).expect_output(&[&marker(), "denyRead"]);
        assert!(!r.stdout().contains("s3cret"), "{}", r.stdout());
    }
    call(&s, &env, "list", json!({"path": "keys"}))
        .expect_code(1)
        .expect_output(&["denyRead"]);
    let r = call(
        &s,
        &env,
        "bash",
        json!({"command": format!("cat /proc/self/environ .env keys/id {}; ls keys; cat /proc/1/environ", secret.display())}),
    );
    assert!(!r.stdout().contains("s3cret"), "{}", r.context());
    // What is not denied is still read.
    std::fs::write(s.path().join("plain.txt"), "visible").expect("plain");
    call(&s, &env, "read", json!({"path": "plain.txt"}))
        .expect_code(0)
        .expect_output(&["visible"]);
    call(&s, &env, "bash", json!({"command": "cat plain.txt"}))
        .expect_code(0)
        .expect_output(&["visible"]);
}
