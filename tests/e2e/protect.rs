//! The composition protects itself: each attack a hostile agent tried, through the real
//! host (`cordis run` over MCP, `cordis call`), the real cdylibs and the real kernel, with
//! the manifest and the libraries inside the session root as `cargo xtask run` has them.
//! Every test checks that the target is unchanged byte for byte, and that the same kind of
//! change to an unprotected file still works, so a refusal cannot pass by refusing all.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use cordis_e2e::{bundled_manifest, library, McpStdio, Outside, Scratch, Swapper};
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

/// `cordis call TOOL ARGS` in `s` with the session rooted at `root`.
fn call_at(s: &Scratch, root: &Path, tool: &str, args: Value) -> cordis_e2e::Run {
    let mut cmd = s.cordis(&[
        "call",
        "--cwd",
        &root.display().to_string(),
        tool,
        &args.to_string(),
    ]);
    cmd.env("RUST_LOG", "warn");
    run(
        cmd,
        &format!("cordis call {tool} {args} in {}", root.display()),
        s,
    )
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

/// `git ARGS` in `dir` as a person would run it, outside any sandbox; its output.
fn person_git(dir: &Path, args: &[&str]) -> std::process::Output {
    let out = Command::new("git")
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "-c",
            "protocol.file.allow=always",
        ])
        .args(args)
        .current_dir(dir)
        .output()
        .expect("git must be installed for this test");
    assert!(
        out.status.success(),
        "git {args:?} in {}: {out:?}",
        dir.display()
    );
    out
}

/// A git config fragment whose `core.fsmonitor` (run by `git status` and `git commit`)
/// leaves `proof` behind.
fn fsmonitor_config(proof: &Path) -> String {
    format!(
        "[core]\n\tfsmonitor = \"touch {}; false\"\n\thooksPath = {}\n",
        proof.display(),
        proof.with_extension("hooks").display()
    )
}

/// Each way a command planted code for a person's next `git status` or `git commit`: an
/// `.git/commondir` pointing at a config the command wrote, a submodule's config under
/// `.git/modules`, a hook in a repository that had no `hooks` directory, the `gitdir:`
/// pointer of a linked worktree and of a submodule, a repository made where a submodule is
/// not checked out, and the config itself. All of the root's git directory (or `.git`
/// file) and every submodule's `.git` are read-only, through both `bash` and `write`;
/// afterwards the person's git runs none of it. A commit is an approved escalation.
#[test]
fn no_git_code_path_of_the_root_is_writable() {
    let s = Scratch::with_bundled_manifest();
    let outside = Outside::new("git");
    let (repo, origin, wt) = (
        outside.dir.join("repo"),
        outside.dir.join("origin"),
        outside.dir.join("wt"),
    );
    let proof = outside.dir.join("pwned");
    for dir in [&repo, &origin] {
        std::fs::create_dir_all(dir).expect("repo dir");
        person_git(dir, &["init", "-q"]);
        std::fs::write(dir.join("a.txt"), "a\n").expect("a file");
        person_git(dir, &["add", "a.txt"]);
        person_git(dir, &["commit", "-qm", "one"]);
    }
    person_git(&repo, &["submodule", "-q", "add", "../origin", "sub"]);
    person_git(&repo, &["submodule", "-q", "add", "../origin", "sub2"]);
    person_git(&repo, &["commit", "-qm", "sub"]);
    // A submodule that is not checked out: an empty directory a command must not make
    // into a repository git would recurse into.
    person_git(&repo, &["submodule", "-q", "deinit", "-f", "sub2"]);
    person_git(&repo, &["worktree", "add", "-q", "../wt"]);
    std::fs::remove_dir_all(repo.join(".git/hooks")).expect("no hooks dir at start");
    let config = fsmonitor_config(&proof);
    let git_dir_before = |dir: &Path| {
        let out = Command::new("find")
            .arg(dir)
            .args(["-printf", "%p %s %m\n"])
            .output()
            .expect("find");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let (repo_git, wt_git) = (git_dir_before(&repo.join(".git")), read(&wt.join(".git")));
    let bash =
        |root: &Path, command: &str| call_at(&s, root, "bash", json!({ "command": command }));
    let attack = format!(
        "mkdir -p evil && printf '{config}' > evil/config; \
         echo \"$PWD/evil\" > .git/commondir; \
         printf '{config}' >> .git/modules/sub/config; \
         mkdir .git/hooks; printf '#!/bin/sh\\ntouch {proof}\\n' > .git/hooks/pre-commit; \
         printf '{config}' >> .git/config; \
         mv .git .git.away; \
         cp -r .git/modules/sub evil-sub && printf '{config}' >> evil-sub/config \
           && printf 'gitdir: ../evil-sub\\n' > sub/.git; \
         git init -q sub2 && printf '{config}' >> sub2/.git/config; \
         echo hi > b.txt; git add b.txt; exit 0",
        proof = proof.display()
    );
    bash(&repo, &attack).expect_output(&["Read-only file system", "Device or resource busy"]);
    let repoint = "mkdir -p .g && cp -r ../repo/.git/worktrees/wt/. .g/ 2>/dev/null; \
                   printf '[core]\\n\\tfsmonitor = \"touch ../pwned; false\"\\n' > .g/config; \
                   echo 'gitdir: .g' > .git; exit 0";
    bash(&wt, repoint).expect_output(&["Read-only file system"]);
    for (path, content) in [
        (repo.join(".git/commondir"), "/tmp\n"),
        (repo.join(".git/hooks/pre-commit"), "#!/bin/sh\n"),
        (wt.join(".git"), "gitdir: .g\n"),
        (repo.join("sub/.git"), "gitdir: ../evil-sub\n"),
    ] {
        let root = if path.starts_with(&wt) { &wt } else { &repo };
        call_at(
            &s,
            root,
            "write",
            json!({"path": path.display().to_string(), "content": content}),
        )
        .expect_code(1)
        .expect_output(&[&marker()]);
    }
    assert_eq!(git_dir_before(&repo.join(".git")), repo_git);
    assert!(read(&repo.join("sub/.git")).starts_with(b"gitdir: ../.git/modules/sub"));
    assert!(!repo.join("sub2/.git").exists());
    assert_eq!(read(&wt.join(".git")), wt_git);
    // The person's git afterwards runs nothing the command planted.
    person_git(&repo, &["status"]);
    person_git(&repo, &["commit", "-q", "--allow-empty", "-m", "person"]);
    person_git(&wt, &["status"]);
    assert!(!proof.exists(), "planted code ran in the person's git");
    // The control: the work tree is writable, and a commit goes through as one approved
    // escalation.
    assert_eq!(read(&repo.join("b.txt")), b"hi\n");
    let commit = json!({
        "command": "git add b.txt && git -c user.name=t -c user.email=t@t commit -qm agent && git log --oneline | wc -l",
        "sandbox_permissions": "danger-full-access",
        "justification": "commit the change",
    });
    let mut approved = s.cordis(&[
        "call",
        "--cwd",
        &repo.display().to_string(),
        "--approve",
        "bash",
        &commit.to_string(),
    ]);
    approved.env("RUST_LOG", "warn");
    run(approved, "cordis call --approve bash (git commit)", &s)
        .expect_code(0)
        .expect_output(&["4\n"]);
}

/// A repository the root's repository does not record (a vendored copy with its own
/// history, at any depth) is protected the same way: a person's `git add -A` makes it a
/// submodule, whose config the next `git status` runs. Its `.git` cannot be written,
/// renamed or moved away through `bash`, nor written or made anywhere through `write`.
#[test]
fn a_repository_the_root_does_not_record_is_protected_too() {
    let s = Scratch::with_bundled_manifest();
    let outside = Outside::new("vendored");
    let repo = outside.dir.join("repo");
    let vendored = repo.join("third/party/lib");
    let proof = outside.dir.join("pwned");
    for dir in [&repo, &vendored] {
        std::fs::create_dir_all(dir).expect("repo dir");
        person_git(dir, &["init", "-q"]);
        std::fs::write(dir.join("a.txt"), "a\n").expect("a file");
        person_git(dir, &["add", "a.txt"]);
        person_git(dir, &["commit", "-qm", "one"]);
    }
    let config_before = read(&vendored.join(".git/config"));
    let config = fsmonitor_config(&proof);
    let attack = format!(
        "printf '{config}' >> third/party/lib/.git/config; \
         mkdir -p third/party/lib/.git/hooks; \
         printf '#!/bin/sh\\ntouch {proof}\\n' > third/party/lib/.git/hooks/pre-commit; \
         mv third/party/lib/.git third/party/lib/.g; mv third/party/lib third/party/l2; \
         mv third t2; echo b > third/party/lib/b.txt; exit 0",
        proof = proof.display()
    );
    call_at(&s, &repo, "bash", json!({ "command": attack }))
        .expect_code(0)
        .expect_output(&["Read-only file system", "Device or resource busy"]);
    for path in [
        vendored.join(".git/config"),
        vendored.join(".git/hooks/pre-commit"),
        repo.join("fresh/.git/config"),
        repo.join("third/.git"),
    ] {
        call_at(
            &s,
            &repo,
            "write",
            json!({"path": path.display().to_string(), "content": config}),
        )
        .expect_code(1)
        .expect_output(&[&marker(), "is a git directory"]);
    }
    assert_eq!(read(&vendored.join(".git/config")), config_before);
    assert!(!repo.join("fresh").exists() && !repo.join("third/.git").exists());
    // The control: the vendored work tree itself is writable.
    assert_eq!(read(&vendored.join("b.txt")), b"b\n");
    // The person adds everything, commits, and looks: nothing planted runs.
    person_git(&repo, &["add", "-A"]);
    person_git(&repo, &["commit", "-qm", "vendored"]);
    person_git(&repo, &["status"]);
    person_git(&vendored, &["status"]);
    person_git(
        &vendored,
        &["commit", "-q", "--allow-empty", "-m", "person"],
    );
    assert!(!proof.exists(), "planted code ran in the person's git");
}

/// A check the host cannot make refuses the command: a command owns its writable roots, so
/// (where the host is not root) it can make a directory unreadable to the host, and a
/// `denyRead` pattern's match inside it would go unseen by the next command's view. That
/// command is refused, naming the directory; once the person fixes the mode, the match is
/// hidden again. Both searches of the workspace (for repositories, for the pattern's
/// matches) refuse on their own. Run as an unprivileged user (`nobody`) where the tests
/// run as root.
#[test]
fn a_directory_the_host_cannot_read_refuses_the_command() {
    use std::os::unix::process::CommandExt;
    let s = Scratch::new();
    s.manifest(
        "- name: dsh-sandbox-policy\n  config:\n    mode: workspace-write\n    denyRead: ['**/*.pem']\n    limits: {memoryMib: 0, processes: 0}\n- name: dsh-bash-sandbox\n- name: dsh-tool-bash\n",
    );
    // SAFETY: a plain system call without arguments.
    let root = unsafe { libc::geteuid() } == 0;
    if root {
        for dir in [s.path(), s.state_dir()] {
            let out = Command::new("chown")
                .args(["-R", "65534:65534"])
                .arg(&dir)
                .output()
                .expect("chown");
            assert!(out.status.success(), "chown {}: {out:?}", dir.display());
        }
    }
    let bash = |command: &str| {
        let mut cmd = s.cordis(&["call", "bash", &json!({ "command": command }).to_string()]);
        if root {
            cmd.uid(65534).gid(65534);
        }
        run(
            cmd,
            &format!("cordis call bash {command} (as an unprivileged user)"),
            &s,
        )
    };
    bash("mkdir locked && echo key-material > locked/k.pem && chmod 000 locked").expect_code(0);
    bash("chmod 755 locked; cat locked/k.pem")
        .expect_code(1)
        .expect_output(&["SHELL_SANDBOX_UNAVAILABLE", "locked", "Permission denied"]);
    std::fs::set_permissions(s.path().join("locked"), PermissionsExt::from_mode(0o755))
        .expect("the person fixes the mode");
    let r = bash("cat locked/k.pem; echo end");
    r.expect_code(0).expect_output(&["end"]);
    assert!(!r.stdout().contains("key-material"), "{}", r.stdout());
}

/// A protected path that runs through a symbolic link is protected at both ends. The
/// common `.git/hooks -> ../githooks`: a hook written through either name, by `bash` or
/// `write`, is refused, and the person's commit runs none. A configured protected path
/// named through a link: its target cannot be written by its own name either.
#[test]
fn a_protected_link_is_protected_where_it_leads() {
    let s = Scratch::new();
    let outside = Outside::new("links");
    let repo = outside.dir.join("repo");
    let proof = outside.dir.join("pwned");
    std::fs::create_dir_all(repo.join("githooks")).expect("githooks");
    std::fs::create_dir_all(repo.join("real/deploy")).expect("real/deploy");
    std::fs::create_dir_all(repo.join("links")).expect("links");
    std::os::unix::fs::symlink("../real/deploy", repo.join("links/deploy")).expect("link");
    person_git(&repo, &["init", "-q"]);
    std::fs::remove_dir_all(repo.join(".git/hooks")).expect("the default hooks");
    std::os::unix::fs::symlink("../githooks", repo.join(".git/hooks")).expect("hooks link");
    std::fs::write(repo.join("a.txt"), "a\n").expect("a file");
    person_git(&repo, &["add", "a.txt"]);
    person_git(&repo, &["commit", "-qm", "one"]);
    s.manifest(&format!(
        "- name: dsh-sandbox-policy\n  config:\n    mode: workspace-write\n    protectedPaths: ['{}']\n\
         - name: dsh-fs-sandbox\n- name: dsh-bash-sandbox\n- name: dsh-tool-fs\n- name: dsh-tool-bash\n",
        repo.join("links/deploy").display()
    ));
    let hook = format!("#!/bin/sh\ntouch {}\n", proof.display());
    let bash = |command: &str| call_at(&s, &repo, "bash", json!({ "command": command }));
    bash(&format!(
        "printf '{}' > githooks/pre-commit; chmod +x githooks/pre-commit; \
         echo evil > real/deploy/run.sh; rm links/deploy; ln -sfn /tmp links/deploy; \
         echo ok > free.txt; exit 0",
        hook.replace('\n', "\\n")
    ))
    .expect_output(&["Read-only file system"]);
    for path in [
        repo.join(".git/hooks/pre-commit"),
        repo.join("githooks/pre-commit"),
        repo.join("real/deploy/run.sh"),
        repo.join("links/deploy/run.sh"),
    ] {
        call_at(
            &s,
            &repo,
            "write",
            json!({"path": path.display().to_string(), "content": hook}),
        )
        .expect_code(1)
        .expect_output(&[&marker()]);
    }
    assert!(!repo.join("githooks/pre-commit").exists());
    assert!(!repo.join("real/deploy/run.sh").exists());
    assert_eq!(
        std::fs::read_link(repo.join("links/deploy")).expect("the link"),
        Path::new("../real/deploy"),
        "the link was repointed"
    );
    assert_eq!(read(&repo.join("free.txt")), b"ok\n", "the control");
    person_git(&repo, &["commit", "-q", "--allow-empty", "-m", "person"]);
    assert!(!proof.exists(), "a planted hook ran in the person's commit");
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

/// Any session may rename what lies in `/tmp`, another session's root included. One
/// keeps exchanging this session's root with a link to a directory outside every root
/// (`RENAME_EXCHANGE`: the root never goes missing, it is the directory or the link),
/// while this session calls `write` and `bash` beneath it: each call lands in the root or
/// is refused, and nothing lands outside. The race runs until every tool has seen both
/// outcomes many times (a deadline only turns a starved race into a failure).
#[test]
fn a_session_root_exchanged_for_a_link_in_a_loop_never_leads_outside() {
    let s = Scratch::with_bundled_manifest();
    let project = s.path().join("project");
    std::fs::create_dir_all(&project).expect("project");
    let outside = Outside::new("protect-exchange");
    let link = s.path().join("project-link");
    std::os::unix::fs::symlink(&outside.dir, &link).expect("link");
    let started = s.start();
    let session = started.session(&project);
    let before = outside.snapshot();
    let calls = [
        (
            "write",
            json!({"path": project.join("w.txt").display().to_string(), "content": "x"}),
        ),
        (
            "bash",
            json!({"command": format!("echo x > {}/b.txt", project.display())}),
        ),
    ];
    // Each outcome, by which defence refused it; anything else is a defect.
    let outcome = |r: &cordis_sdk::ToolResult| match () {
        _ if !r.is_error => "done",
        _ if r
            .text
            .contains("no longer names the directory the session was created in") =>
        {
            "refused by the policy owner"
        }
        _ if r
            .text
            .contains("no longer names the directory that was checked") =>
        {
            "refused where the root is used"
        }
        _ if r.text.contains("still the directory the policy checked") => {
            "refused by the command's process"
        }
        _ if r.text.contains("outside the writable roots") => "refused by the containment check",
        // The command ran on the root it was given; the path led elsewhere by then.
        _ if r.text.contains("Read-only file system") || r.text.contains("Permission denied") => {
            "refused by the kernel"
        }
        _ => "other",
    };
    const EACH: u32 = 20;
    type Tally<'a> = std::collections::BTreeMap<(&'a str, &'static str), (u32, String)>;
    let mut tally = Tally::new();
    let exercised = |tally: &Tally| {
        calls.iter().all(|(tool, _)| {
            let seen = |done: bool| {
                tally
                    .iter()
                    .filter(|((t, o), _)| t == tool && (*o == "done") == done)
                    .map(|(_, (n, _))| n)
                    .sum::<u32>()
                    >= EACH
            };
            seen(true) && seen(false)
        })
    };
    let swapper = Swapper::start(&project, &link);
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut rounds = 0;
    while !exercised(&tally) && Instant::now() < deadline {
        rounds += 1;
        for (tool, args) in &calls {
            let r = started.call_tool(&session, tool, args.clone());
            let entry = tally.entry((*tool, outcome(&r))).or_insert((0, r.text));
            entry.0 += 1;
        }
    }
    let swaps = swapper.stop();
    eprintln!("race: {rounds} rounds, {swaps} exchanges: {tally:#?}");
    assert_eq!(
        outside.snapshot(),
        before,
        "a call beneath the session root wrote outside it: {tally:#?}"
    );
    assert!(
        !tally.keys().any(|(_, o)| *o == "other"),
        "a call failed for another reason: {tally:#?}"
    );
    assert!(
        exercised(&tally),
        "the race was not exercised within the deadline ({rounds} rounds, {swaps} exchanges): {tally:#?}"
    );
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
    // The same entries through aliases: a link to the file, a link to a process's
    // directory, a link to `/proc` itself and a `..` that climbs back into it.
    std::os::unix::fs::symlink("/proc/self/environ", s.path().join("env-link")).expect("link");
    std::os::unix::fs::symlink("/proc/1", s.path().join("init")).expect("link");
    std::os::unix::fs::symlink("/proc", s.path().join("procfs")).expect("link");
    for path in [
        "env-link",
        "init/environ",
        "procfs/self/environ",
        "procfs/sys/../self/environ",
    ] {
        let r = call(&s, &env, "read", json!({ "path": path }));
        r.expect_code(1).expect_output(&["FS_READ_DENIED"]);
        assert!(!r.stdout().contains("s3cret"), "{}", r.stdout());
    }
    call(&s, &env, "list", json!({"path": "/proc/self/fd"}))
        .expect_code(1)
        .expect_output(&["FS_READ_DENIED"]);
    call(&s, &env, "list", json!({"path": "procfs/self/fd"}))
        .expect_code(1)
        .expect_output(&["FS_READ_DENIED"]);
    // The denied paths by their names, and through aliases: a link to the file, a link to
    // a directory above it, a `..`, and the spellings that name the same path (`.`, `//`).
    std::os::unix::fs::symlink(&secret, s.path().join("secret-link")).expect("link");
    std::os::unix::fs::symlink(s.path().join("keys"), s.path().join("kl")).expect("link");
    std::fs::create_dir_all(s.path().join("open")).expect("open");
    let ws = s.path().display().to_string();
    for path in [
        s.path().join(".env"),
        secret.clone(),
        s.path().join("keys/id"),
        s.path().join("secret-link"),
        s.path().join("kl/id"),
        s.path().join("open/../keys/id"),
        format!("{ws}/./keys/id").into(),
        format!("{ws}//keys//id").into(),
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

/// `cordis call TOOL ARGS` in `s`, run in a private user and mount namespace (`unshare`)
/// after the shell commands `mounts` (run in `s`); `$$` is the shell's pid, which `exec`
/// hands to `cordis`, and `@PID@` in `args` is replaced by it. The host's environment
/// holds a credential (`s3cret-host-env`).
fn call_unshared(s: &Scratch, mounts: &str, tool: &str, args: Value) -> cordis_e2e::Run {
    let script = format!(
        "set -e\n{mounts}\nargs=$(printf '%s' \"$1\" | sed \"s/@PID@/$$/g\")\nshift\nexec \"$@\" \"$args\""
    );
    let cordis = s.cordis(&["call", tool]);
    let mut cmd = Command::new("unshare");
    cmd.args([
        "--user",
        "--map-root-user",
        "--mount",
        "--",
        "sh",
        "-c",
        &script,
        "sh",
    ])
    .arg(args.to_string())
    .arg(cordis.get_program())
    .args(cordis.get_args())
    .current_dir(s.path())
    .env("CORDIS_E2E_API_TOKEN", "s3cret-host-env")
    .stdin(std::process::Stdio::null());
    for (key, value) in cordis.get_envs() {
        match value {
            Some(value) => cmd.env(key, value),
            None => cmd.env_remove(key),
        };
    }
    let r = run(cmd, &format!("cordis call {tool} {args} (unshared)"), s);
    assert!(
        !r.stderr().contains("unshare:") && !r.stderr().contains("mount:"),
        "this test needs user and mount namespaces (`unshare --user --mount`), which this \
         machine refused: it cannot run here\n{}",
        r.context()
    );
    r
}

/// A `proc` file system is the same kernel object wherever it is mounted: a container's
/// `/host/proc`, or one process's directory bound as the root of a mount, reveals the host
/// process as `/proc` itself would. With `/proc` bound at `p` in the workspace and the
/// host's own `/proc/<pid>` bound at `me`, every read, list and edit of a process's
/// entries through them is refused: by a plain path, through `self`, and by the directory
/// that is a mount's root.
#[test]
fn a_proc_file_system_mounted_elsewhere_reveals_no_process() {
    let s = Scratch::with_bundled_manifest();
    for dir in ["p", "me"] {
        std::fs::create_dir(s.path().join(dir)).expect("mount point");
    }
    std::fs::write(s.path().join("plain.txt"), "visible").expect("plain");
    let mounts = "mount --rbind /proc p\nmount --rbind /proc/$$ me";
    let call_unshared = |tool: &str, args: Value| call_unshared(&s, mounts, tool, args);
    for path in [
        "p/@PID@/environ",
        "p/@PID@/status",
        "p/self/environ",
        "me/environ",
        "me/status",
        "p/thread-self/environ",
    ] {
        let r = call_unshared("read", json!({ "path": path }));
        r.expect_code(1)
            .expect_output(&["FS_READ_DENIED", "entry of a process"]);
        assert!(!r.stdout().contains("s3cret"), "{}", r.context());
    }
    for path in ["p/@PID@/fd", "me/fd", "me/task"] {
        call_unshared("list", json!({ "path": path }))
            .expect_code(1)
            .expect_output(&["FS_READ_DENIED", "entry of a process"]);
    }
    // An edit's search would tell whether a guessed text is in the entry: refused before.
    for path in ["p/@PID@/environ", "me/environ"] {
        let edit = json!({"path": path, "old_string": "CORDIS_E2E_API_TOKEN=s", "new_string": "x"});
        call_unshared("edit", edit)
            .expect_code(1)
            .expect_output(&["FS_READ_DENIED", "entry of a process"]);
    }
    // What is not a process's is still served, through the same mounts.
    call_unshared("read", json!({"path": "p/version"}))
        .expect_code(0)
        .expect_output(&["Linux"]);
    call_unshared("list", json!({"path": "p/sys"}))
        .expect_code(0)
        .expect_output(&["kernel"]);
    call_unshared("read", json!({"path": "plain.txt"}))
        .expect_code(0)
        .expect_output(&["visible"]);
}

/// A sandboxed command's own `/proc` shows its own processes only; a `proc` file system
/// mounted elsewhere (here `/proc` bound at a directory outside the workspace, as a
/// container's `/host/proc`) would show the host's: in the command's view it is an empty
/// directory, while its own `/proc` still works.
#[test]
fn a_sandboxed_command_sees_no_proc_file_system_mounted_elsewhere() {
    let s = Scratch::with_bundled_manifest();
    let outside = Outside::new("host-proc");
    let host_proc = outside.dir.join("proc");
    std::fs::create_dir(&host_proc).expect("mount point");
    let hp = host_proc.display();
    let command = format!(
        "echo entries=$(ls -A {hp} | wc -l); test -e {hp}/@PID@/status && echo HOST-VISIBLE; \
         cat {hp}/@PID@/status; test -e /proc/self/status && echo own=yes"
    );
    let r = call_unshared(
        &s,
        &format!("mount --rbind /proc '{hp}'"),
        "bash",
        json!({ "command": command }),
    );
    r.expect_code(0).expect_output(&["entries=0", "own=yes"]);
    assert!(!r.stdout().contains("HOST-VISIBLE"), "{}", r.context());
    assert!(!r.stdout().contains("Name:"), "{}", r.context());
}

/// The host's state directory holds every session's log (its root and history) and the
/// HTTP server's bearer token: it is created `0700` (an existing looser one is tightened),
/// logs `0600`, and no session reads any of it, through `bash` or `read`.
#[test]
fn the_hosts_state_is_private_on_disk_and_unreadable_to_sessions() {
    use std::os::unix::fs::PermissionsExt;
    let s = Scratch::with_bundled_manifest();
    let state = s.state_dir().join("loose");
    std::fs::create_dir(&state).expect("state dir");
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let token = "0123456789abcdef0123456789abcdef";
    std::fs::write(state.join("http-token"), format!("{token}\n")).expect("token");
    let state_env = state.display().to_string();
    let call_in =
        |tool: &str, args: Value| call(&s, &[("CORDIS_STATE_DIR", state_env.as_str())], tool, args);
    call_in("list", json!({"path": "."})).expect_code(0);
    let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
    assert_eq!(mode(&state), 0o700);
    assert_eq!(mode(&state.join("sessions")), 0o700);
    let logs: Vec<PathBuf> = std::fs::read_dir(state.join("sessions"))
        .expect("sessions")
        .map(|e| e.expect("entry").path())
        .collect();
    assert!(!logs.is_empty());
    for log in &logs {
        assert_eq!(mode(log), 0o600, "{}", log.display());
    }
    let r = call_in(
        "bash",
        json!({"command": format!(
            "cat '{0}/http-token'; cat '{0}'/sessions/*.jsonl; ls -A '{0}'; echo visible > mine.txt; cat mine.txt",
            state.display()
        )}),
    );
    let out = r.stdout();
    assert!(!out.contains(token), "the token was read: {out}");
    assert!(!out.contains("\"cwd\""), "a session log was read: {out}");
    assert!(out.contains("visible"), "the control read works: {out}");
    call_in("read", json!({"path": logs[0].display().to_string()}))
        .expect_code(1)
        .expect_output(&[&marker(), "reading it is denied"]);
    // Through an alias: a link in the workspace to the state directory.
    std::os::unix::fs::symlink(&state, s.path().join("alias")).expect("link");
    let r = call_in(
        "bash",
        json!({"command": "cat alias/http-token; cat alias/sessions/*.jsonl; exit 0"}),
    );
    assert!(!r.stdout().contains(token), "{}", r.context());
    assert!(!r.stdout().contains("\"cwd\""), "{}", r.context());
    call_in("read", json!({"path": "alias/http-token"}))
        .expect_code(1)
        .expect_output(&["reading it is denied"]);
}

/// A hidden path stays hidden when the directory above it is renamed in one call and read
/// under its new name in the next: the directories between the root and a hidden path (a
/// plain `denyRead` path or a pattern's match) are pinned, so the rename fails.
#[test]
fn deny_read_survives_renaming_the_directories_above() {
    let s = Scratch::new();
    for (rel, text) in [
        ("conf/secret", "s3cret-conf"),
        ("deep/keys/a.pem", "s3cret-pem"),
        ("free/plain.txt", "visible"),
    ] {
        s.write(rel, text);
    }
    s.manifest(&format!(
        "- name: dsh-sandbox-policy\n  config:\n    mode: workspace-write\n    denyRead: ['**/keys/*.pem', '{}']\n\
         - name: dsh-fs-sandbox\n- name: dsh-bash-sandbox\n- name: dsh-tool-fs\n- name: dsh-tool-bash\n",
        s.path().join("conf/secret").display(),
    ));
    let r = call(
        &s,
        &[],
        "bash",
        json!({"command": "mv conf c2; mv deep/keys deep/k2; mv deep d2; mv deep/keys/a.pem deep/keys/a.txt; mv free f2; exit 0"}),
    );
    assert!(
        r.stdout().contains("Device or resource busy"),
        "{}",
        r.context()
    );
    assert!(
        s.path().join("f2/plain.txt").exists(),
        "the control rename: {}",
        r.context()
    );
    for dir in ["conf", "deep/keys"] {
        assert!(
            s.path().join(dir).is_dir(),
            "{dir} was renamed: {}",
            r.context()
        );
    }
    let r = call(
        &s,
        &[],
        "bash",
        json!({"command": "cat conf/secret c2/secret deep/keys/a.pem deep/k2/a.pem d2/keys/a.pem deep/keys/a.txt; cat f2/plain.txt"}),
    );
    assert!(!r.stdout().contains("s3cret"), "{}", r.context());
    assert!(r.stdout().contains("visible"), "{}", r.context());
    for path in ["conf/secret", "deep/keys/a.pem"] {
        call(&s, &[], "read", json!({ "path": path }))
            .expect_code(1)
            .expect_output(&["denyRead"]);
    }
}

/// Plugin directories in writable roots that do not exist yet (`<prefix>/lib/cordis/plugins`
/// of a `<prefix>/bin/cordis` inside the session root, and the user plugin directory of a
/// home in a temp area): a command cannot create them to plant a library the host would
/// load at its next start. Their nearest existing directories are
/// read-only to it; the rest of the root is not.
#[test]
fn absent_plugin_directories_in_the_root_cannot_be_created() {
    let s = Scratch::with_bundled_manifest();
    let bin = s.path().join("prefix/bin");
    std::fs::create_dir_all(&bin).expect("prefix/bin");
    // A home in a temp area (a writable root of its own; one inside the session root is
    // refused).
    let home_dir = tempfile::Builder::new()
        .prefix("cordis-e2e-home-")
        .tempdir()
        .expect("home");
    let home = home_dir.path().canonicalize().expect("canonical home");
    let cordis = bin.join("cordis");
    std::fs::copy(cordis_e2e::cordis_bin(), &cordis).expect("copy cordis");
    for plugin in BUNDLED {
        let file = library(plugin);
        std::fs::copy(&file, bin.join(file.file_name().expect("a file name"))).expect("copy");
    }
    let installed = s.path().join("prefix/lib/cordis/plugins");
    let user = home.join(".local/share/cordis/plugins");
    let with_home = |cmd: &mut Command| {
        cmd.env_remove("XDG_DATA_HOME")
            .env("HOME", &home)
            .env("RUST_LOG", "warn")
            .current_dir(s.path());
    };
    // The installed binary searches both, before its own directory.
    s.write("missing.yml", "- name: no-such-plugin\n");
    let mut check = Command::new(&cordis);
    check.args(["check", "-c", "missing.yml"]);
    with_home(&mut check);
    run(check, "cordis check (where it looks)", &s)
        .expect_code(1)
        .expect_output(&[
            &format!(
                "{}/libno_such_plugin.so (the installation's plugin directory)",
                installed.display()
            ),
            &format!(
                "{}/libno_such_plugin.so (the user plugin directory)",
                user.display()
            ),
        ]);
    let planted = library("dsh-tool-fs");
    let attack = format!(
        "for d in '{}' '{}'; do mkdir -p \"$d\" && cp '{}' \"$d\"/; done; echo free > free.txt; exit 0",
        installed.display(),
        user.display(),
        planted.display()
    );
    let mut bash = Command::new(&cordis);
    bash.args(["call", "bash", &json!({ "command": attack }).to_string()])
        .env("CORDIS_STATE_DIR", s.state_dir());
    with_home(&mut bash);
    run(bash, "cordis call bash (plant)", &s).expect_output(&["Read-only file system"]);
    assert!(!s.path().join("prefix/lib").exists());
    assert!(!home.join(".local").exists());
    assert_eq!(read(&s.path().join("free.txt")), b"free\n");
}

/// `denyRead` may list a directory and a path inside it: the command runs with the
/// directory hidden (what is inside is hidden with it), and neither is readable.
#[test]
fn nested_deny_read_paths_hide_both_and_the_command_runs() {
    let s = Scratch::new();
    std::fs::create_dir_all(s.path().join("secret")).expect("secret dir");
    std::fs::write(s.path().join("secret/key"), "s3cret-key").expect("key");
    std::fs::write(s.path().join("plain.txt"), "visible").expect("plain");
    s.manifest(&format!(
        "- name: dsh-sandbox-policy\n  config:\n    mode: workspace-write\n    denyRead: ['{}', '{}']\n\
         - name: dsh-fs-sandbox\n- name: dsh-bash-sandbox\n- name: dsh-tool-fs\n- name: dsh-tool-bash\n",
        s.path().join("secret").display(),
        s.path().join("secret/key").display()
    ));
    let r = call(
        &s,
        &[],
        "bash",
        json!({"command": "ls -A secret; cat secret/key; cat plain.txt"}),
    );
    r.expect_code(0).expect_output(&["visible"]);
    assert!(!r.stdout().contains("s3cret"), "{}", r.context());
    assert!(!r.stdout().contains("key\n"), "{}", r.context());
}
