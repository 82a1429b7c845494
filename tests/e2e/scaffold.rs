//! End-to-end tests of the plugin-author path: `cordis new` scaffolds a crate that builds,
//! loads with `cordis check`, answers `cordis call` and passes its own `cargo test`; and a
//! plugin built against another SDK release is refused with an actionable message
//! (`cordis-test` itself: `harness`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use cordis_e2e::{
    bundled_manifest, cargo, cargo_target, sdk_copy, target_dir, with_build_lock,
    workspace_profiles, workspace_root, write_sdk_manifest, Scratch,
};
use cordis_test::PluginUnderTest;
use serde_json::json;

/// Runs `cmd` and returns its output; on an unexpected exit status, panics with the
/// command, its directory, stdout and stderr.
fn run(mut cmd: Command, success: bool) -> Output {
    let what = format!("{cmd:?}");
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    assert_eq!(
        out.status.success(),
        success,
        "unexpected exit status {}\ncommand: {what}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A plugin crate `name` made by `cordis new` in a scratch directory, set up to build into
/// the workspace's target directory with the workspace's profiles and lock file.
struct Scaffold {
    scratch: Scratch,
    /// The crate.
    dir: PathBuf,
    /// Where its library is built.
    library: PathBuf,
    /// What `cordis new` printed.
    printed: String,
}

impl Scaffold {
    fn new(name: &str) -> Self {
        let scratch = Scratch::new();
        scratch.write(".cargo/config.toml", &workspace_profiles());
        let created = run(
            {
                let mut c = scratch.cordis(&["new", name]);
                c.env("CARGO_TARGET_DIR", cargo_target());
                c
            },
            true,
        );
        let dir = scratch.path().join(name);
        std::fs::copy(workspace_root().join("Cargo.lock"), dir.join("Cargo.lock"))
            .expect("copy Cargo.lock");
        Scaffold {
            library: target_dir().join(cordis_engine::library_file_name(name)),
            printed: text(&created),
            scratch,
            dir,
        }
    }

    /// Rewrites `src/lib.rs` with `edit`.
    fn edit(&self, edit: impl FnOnce(String) -> String) {
        let path = self.dir.join("src/lib.rs");
        let before = std::fs::read_to_string(&path).expect("read src/lib.rs");
        let after = edit(before.clone());
        assert_ne!(before, after, "the edit changed nothing");
        std::fs::write(&path, after).expect("write src/lib.rs");
    }
}

impl Drop for Scaffold {
    fn drop(&mut self) {
        // Leave the shared output directory with the workspace's plugins only.
        let _ = std::fs::remove_file(&self.library);
    }
}

#[test]
fn cordis_new_builds_checks_answers_and_tests() {
    let Scaffold {
        ref scratch,
        ref dir,
        ref library,
        ref printed,
    } = Scaffold::new("hello-cordis");
    let (dir, library) = (dir.clone(), library.clone());
    for needle in [
        "created plugin crate `hello-cordis`",
        "- name: hello-cordis\n",
        &format!("  path: {}\n", library.display()),
        "cordis call hello_cordis_greet",
    ] {
        assert!(printed.contains(needle), "lacks {needle:?}:\n{printed}");
    }
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).expect("Cargo.toml");
    for needle in ["crate-type = [\"cdylib\", \"rlib\"]", "\n[workspace]\n"] {
        assert!(manifest.contains(needle), "lacks {needle:?}:\n{manifest}");
    }
    assert_relative_sdk_dependencies(&dir, &manifest);

    with_build_lock(|| {
        run(cargo(&dir, &["build"]), true);
        assert!(library.is_file(), "{} was not built", library.display());

        let mut check = scratch.cordis(&["check"]);
        check.current_dir(&dir);
        let checked = text(&run(check, true));
        assert!(
            checked.contains("valid composition, 1 entry")
                && checked.contains("provides helloCordis (hello-cordis.greeter v1)"),
            "{checked}"
        );

        let mut call = scratch.cordis(&["call", "hello_cordis_greet", r#"{"name": "Ada"}"#]);
        call.current_dir(&dir).env("RUST_LOG", "info");
        let answered = run(call, true);
        assert_eq!(String::from_utf8_lossy(&answered.stdout), "hello, Ada!\n");
        // The plugin's own log line reaches the host's output, prefixed with its entry id.
        let log = String::from_utf8_lossy(&answered.stderr);
        assert!(log.contains("[hello-cordis] ready"), "{log}");

        let tested = text(&run(cargo(&dir, &["test"]), true));
        assert!(tested.contains("test result: ok. 3 passed"), "{tested}");
    });
}

/// Waits (up to 60 s) until `f` returns `Some`.
fn eventually<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Shows the host's log when a test fails.
struct ShowLog(PathBuf);

impl Drop for ShowLog {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.0).unwrap_or_default();
            eprintln!("--- cordis run --dev log ---\n{log}");
        }
    }
}

#[test]
fn cordis_run_dev_rebuilds_an_edited_plugin_and_survives_a_broken_edit() {
    let plugin = Scaffold::new("dev-cordis");
    let log_path = plugin.scratch.path().join("run.log");
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let _show = ShowLog(log_path.clone());
    with_build_lock(|| {
        // Never built (as right after `cordis new`): `--dev` builds it before loading.
        let _ = std::fs::remove_file(&plugin.library);
        let mut cmd = plugin.scratch.cordis(&["run", "--dev"]);
        cmd.current_dir(&plugin.dir)
            .env("CARGO_TARGET_DIR", cargo_target())
            .env("RUST_LOG", "info")
            .stderr(std::fs::File::create(&log_path).expect("create the log"));
        let mut mcp = cordis_e2e::McpStdio::start(cmd);
        let mut greet = || mcp.call("dev_cordis_greet", json!({"name": "Ada"}));
        assert_eq!(greet(), (false, "hello, Ada!".to_string()));
        eventually("the source watcher", || {
            log()
                .contains("dev: rebuilding dev-cordis on every change")
                .then_some(())
        });

        // Saving a source file is enough: cordis builds it and reloads.
        plugin.edit(|src| src.replace(r#""{}, {name}!""#, r#""{}, {name}! (edited)""#));
        eventually("the edited build", || {
            let (is_error, text) = greet();
            assert!(!is_error, "a call failed during the rebuild: {text}");
            (text == "hello, Ada! (edited)").then_some(())
        });

        // A broken edit: the build fails loudly and the last good build keeps serving.
        plugin.edit(|src| {
            format!(
                "{src}
fn broken( {{
"
            )
        });
        eventually("the failed build", || {
            log()
                .contains("dev: cargo build of dev-cordis failed")
                .then_some(())
        });
        assert_eq!(greet(), (false, "hello, Ada! (edited)".to_string()));

        // Fixing it recovers.
        plugin.edit(|src| {
            src.replace("\nfn broken( {\n", "")
                .replace("(edited)", "(fixed)")
        });
        eventually("the fixed build", || {
            let (_, text) = greet();
            (text == "hello, Ada! (fixed)").then_some(())
        });

        // Saved again as it was: cargo rebuilds the same bytes, and the log says so.
        let src = plugin.dir.join("src/lib.rs");
        let same = std::fs::read(&src).expect("read src/lib.rs");
        std::fs::write(&src, same).expect("save src/lib.rs unchanged");
        eventually("the unchanged rebuild", || {
            log().contains("dev: unchanged").then_some(())
        });
        assert_eq!(greet(), (false, "hello, Ada! (fixed)".to_string()));
        assert!(mcp.finish().success());
        let log = log();
        assert!(
            log.contains("unclosed delimiter"),
            "cargo's error is shown:\n{log}"
        );
        assert!(log.contains("reload: "), "{log}");
    });
}

/// The planted-library attack on `--dev` with `cordis.yml` inside the plugin crate (the
/// session root): `--dev` rebuilds and loads whatever the crate's sources say, unconfined,
/// so a session must not be able to change them. A confined command's edit of the source,
/// the manifest or a new build script fails, `write` is refused, and the plugin serves
/// what it served.
#[test]
fn under_dev_no_session_can_change_what_is_rebuilt_into_the_host() {
    let plugin = Scaffold::new("dev-guard");
    let manifest = std::fs::read_to_string(plugin.dir.join("cordis.yml")).expect("cordis.yml");
    std::fs::write(
        plugin.dir.join("cordis.yml"),
        format!("{}\n{manifest}", bundled_manifest()),
    )
    .expect("write cordis.yml");
    // The bundled plugins as copies outside any cargo project: `--dev` rebuilds only the
    // crate under test.
    let lib = plugin.scratch.path().join("lib");
    std::fs::create_dir_all(&lib).expect("lib dir");
    for name in [
        "dsh-sandbox-policy",
        "dsh-fs-sandbox",
        "dsh-bash-sandbox",
        "dsh-tool-fs",
        "dsh-tool-bash",
    ] {
        let file = cordis_e2e::library(name);
        std::fs::copy(&file, lib.join(file.file_name().expect("a file name"))).expect("copy");
    }
    // A path dependency beside the crate (in `/tmp`, where every session may write):
    // cargo builds it into the library too.
    let shared = plugin.scratch.path().join("shared");
    std::fs::create_dir_all(shared.join("src")).expect("shared crate");
    std::fs::write(
        shared.join("Cargo.toml"),
        "[package]\nname = \"shared\"\nversion = \"0.1.0\"\nedition = \"2021\"\n",
    )
    .expect("shared manifest");
    std::fs::write(shared.join("src/lib.rs"), "pub fn shared() {}\n").expect("shared source");
    let (source, cargo_toml) = (plugin.dir.join("src/lib.rs"), plugin.dir.join("Cargo.toml"));
    let with_dependency = std::fs::read_to_string(&cargo_toml)
        .expect("Cargo.toml")
        .replacen(
            "[dependencies]\n",
            "[dependencies]\nshared = { path = \"../shared\" }\n",
            1,
        );
    assert!(with_dependency.contains("../shared"), "{with_dependency}");
    std::fs::write(&cargo_toml, with_dependency).expect("add the path dependency");
    let log_path = plugin.scratch.path().join("run.log");
    let _show = ShowLog(log_path.clone());
    let before = [
        std::fs::read(&source).expect("source"),
        std::fs::read(&cargo_toml).expect("Cargo.toml"),
        std::fs::read(shared.join("src/lib.rs")).expect("shared source"),
    ];
    with_build_lock(|| {
        let _ = std::fs::remove_file(&plugin.library);
        let lib = lib.display().to_string();
        let mut cmd = plugin
            .scratch
            .cordis(&["run", "--dev", "--plugin-path", &lib]);
        cmd.current_dir(&plugin.dir)
            .env("CARGO_TARGET_DIR", cargo_target())
            .env("RUST_LOG", "info")
            .stderr(std::fs::File::create(&log_path).expect("create the log"));
        let mut mcp = cordis_e2e::McpStdio::start(cmd);
        assert_eq!(
            mcp.call("dev_guard_greet", json!({"name": "Ada"})),
            (false, "hello, Ada!".to_string())
        );
        eventually("the source watcher", || {
            std::fs::read_to_string(&log_path)
                .unwrap_or_default()
                .contains("dev: rebuilding dev-guard on every change")
                .then_some(())
        });
        let attack = "sed -i 's/hello/pwned/' src/lib.rs; \
                      printf '[package.metadata.x]\\n' >> Cargo.toml; \
                      printf 'fn main() {}\\n' > build.rs; \
                      printf 'pub fn pwned() {}\\n' >> ../shared/src/lib.rs; \
                      mv src src2; exit 0";
        let (_, out) = mcp.call("bash", json!({ "command": attack }));
        assert!(
            out.contains("Read-only file system") && !out.contains("pwned"),
            "{out}"
        );
        let (is_error, out) = mcp.call(
            "write",
            json!({"path": source.display().to_string(), "content": "pwned"}),
        );
        assert!(is_error && out.contains("protected"), "{out}");
        // Time for a watcher to have seen a change, had there been one.
        std::thread::sleep(std::time::Duration::from_millis(500));
        assert_eq!(
            mcp.call("dev_guard_greet", json!({"name": "Ada"})),
            (false, "hello, Ada!".to_string())
        );
        // A toolchain file that appears above the project (where a session rooted there
        // could write it) stops the rebuilds: the person's next save is not built with it.
        let toolchain = plugin.scratch.path().join("rust-toolchain.toml");
        std::fs::write(&toolchain, "[toolchain]\nchannel = \"stable\"\n").expect("toolchain");
        std::fs::write(
            &source,
            String::from_utf8_lossy(&before[0]).replace("hello", "hi"),
        )
        .expect("the person's edit");
        eventually("the refused build", || {
            std::fs::read_to_string(&log_path)
                .unwrap_or_default()
                .contains("dev: not building")
                .then_some(())
        });
        assert!(
            std::fs::read_to_string(&log_path)
                .unwrap_or_default()
                .contains(&toolchain.display().to_string()),
            "the refusal names the file"
        );
        assert_eq!(
            mcp.call("dev_guard_greet", json!({"name": "Ada"})),
            (false, "hello, Ada!".to_string())
        );
        std::fs::write(&source, &before[0]).expect("restore the source");
        assert!(mcp.finish().success());
    });
    assert_eq!(std::fs::read(&source).expect("source"), before[0]);
    assert_eq!(std::fs::read(&cargo_toml).expect("Cargo.toml"), before[1]);
    assert_eq!(
        std::fs::read(shared.join("src/lib.rs")).expect("shared source"),
        before[2],
        "the path dependency is protected like the crate"
    );
    assert!(!plugin.dir.join("build.rs").exists() && plugin.dir.join("src").is_dir());
}

/// `--dev` with the manifest beside the plugin's folder, outside its cargo project: the
/// project is found from the library (its dep-info file), an edit rebuilds and reloads it,
/// an entry no project builds gets one INFO line, and at the default level no other
/// library logs.
#[test]
fn cordis_run_dev_finds_the_project_behind_each_library_wherever_the_manifest_lives() {
    let plugin = Scaffold::new("dev-beside");
    let scratch = &plugin.scratch;
    // A library no cargo project builds: a copy of a workspace plugin, with no dep-info.
    let example = cordis_engine::library_file_name("cordis-example");
    std::fs::create_dir_all(scratch.path().join("libs")).unwrap();
    std::fs::copy(
        target_dir().join(&example),
        scratch.path().join("libs").join(&example),
    )
    .unwrap();
    scratch.manifest(&format!(
        "- name: dev-beside\n  path: {}\n- name: cordis-example\n  path: libs/{example}\n",
        plugin.library.display()
    ));
    let log_path = scratch.path().join("run.log");
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let _show = ShowLog(log_path.clone());
    with_build_lock(|| {
        run(cargo(&plugin.dir, &["build"]), true);
        let mut cmd = scratch.cordis(&["run", "--dev"]);
        cmd.env("CARGO_TARGET_DIR", cargo_target())
            .env_remove("RUST_LOG")
            .stderr(std::fs::File::create(&log_path).expect("create the log"));
        let mut mcp = cordis_e2e::McpStdio::start(cmd);
        let mut greet = || mcp.call("dev_beside_greet", json!({"name": "Ada"}));
        assert_eq!(greet(), (false, "hello, Ada!".to_string()), "{}", log());
        let project = plugin.dir.canonicalize().unwrap().join("Cargo.toml");
        eventually("the source watcher", || {
            log()
                .contains(&format!(
                    "dev: rebuilding dev-beside on every change in {}",
                    project.display()
                ))
                .then_some(())
        });
        plugin.edit(|src| src.replace(r#""{}, {name}!""#, r#""{}, {name}! (beside)""#));
        eventually("the edited build", || {
            let (is_error, text) = greet();
            assert!(!is_error, "a call failed during the rebuild: {text}");
            (text == "hello, Ada! (beside)").then_some(())
        });
        assert!(mcp.finish().success());
    });
    let log = log();
    let not_rebuilt: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("not rebuilding"))
        .collect();
    assert!(
        not_rebuilt.len() == 1
            && not_rebuilt[0].contains(" INFO ")
            && not_rebuilt[0].contains("dev: not rebuilding cordis-example"),
        "{log}"
    );
    for line in log.lines().filter(|l| l.contains(" INFO ")) {
        let target = line
            .split(" INFO ")
            .nth(1)
            .and_then(|rest| rest.split(':').next())
            .unwrap_or("");
        assert!(
            ["cordis", "plugin"].contains(&target) || target.starts_with("cordis_"),
            "another library logs at the default level: {line}\n{log}"
        );
    }
    // Nothing to rebuild anywhere: `--dev` says what it needs and does not start.
    scratch.write(
        "copies.yml",
        &format!("- name: cordis-example\n  path: libs/{example}\n"),
    );
    scratch
        .run(&["run", "--dev", "-c", "copies.yml"])
        .expect_code(1)
        .expect_output(&[
            "`--dev` cannot start",
            "no cargo project builds a library of",
        ]);
    // The one warning is `--dev`'s own: what it runs unconfined.
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains(" WARN ")).collect();
    assert!(
        warnings.len() == 1 && warnings[0].contains("run UNCONFINED in this host"),
        "{log}"
    );
    // The plugin's project is trusted and so is what its library is built from: the SDK,
    // a path dependency (protected from sessions, its edits rebuilt). Not the projects
    // of its dev-dependencies (`cordis-test` and the engine it loads plugins with), which
    // serve only its tests.
    let path = |rel: &str| {
        workspace_root()
            .join(rel)
            .canonicalize()
            .unwrap()
            .display()
            .to_string()
    };
    assert!(warnings[0].contains(&path("plugins/sdk")), "{log}");
    for dev_only in ["plugins/test-support", "host/engine"] {
        assert!(!warnings[0].contains(&path(dev_only)), "{dev_only}: {log}");
    }
}

/// A plugin written outside this repository, from `cordis new`: it injects `fs` and
/// `sandboxPolicy` through the interface crates, its own tests run with `cordis-test`, the
/// stand-ins those crates ship and a composition with the bundled plugins the `cordis` on
/// PATH finds, and it composes with them under `cordis`.
#[test]
fn an_outside_plugin_uses_the_interface_crates_and_their_stand_ins() {
    let plugin = Scaffold::new("outside-notes");
    let interfaces = workspace_root()
        .join("plugins/interfaces")
        .canonicalize()
        .unwrap();
    let dep = |name: &str, dir: &str, features: &str| {
        format!(
            "{name} = {{ path = \"{}\"{features} }}",
            interfaces.join(dir).display()
        )
    };
    let manifest_path = plugin.dir.join("Cargo.toml");
    let mut toml = std::fs::read_to_string(&manifest_path).unwrap();
    for (line_start, features) in [
        ("cordis-sdk = ", ""),
        ("cordis-test = ", ", features = [\"testing\"]"),
    ] {
        let line = toml
            .lines()
            .find(|l| l.starts_with(line_start))
            .unwrap_or_else(|| panic!("no {line_start}in {toml}"))
            .to_string();
        let with = format!(
            "{line}\n{}\n{}",
            dep("dsh-fs-api", "fs-api", features),
            dep("dsh-sandbox", "sandbox-api", features)
        );
        toml = toml.replace(&line, &with);
    }
    std::fs::write(&manifest_path, toml).unwrap();
    let outside = workspace_root().join("tests/outside");
    for file in ["src/lib.rs", "tests/plugin.rs"] {
        std::fs::copy(outside.join(file), plugin.dir.join(file)).unwrap();
    }
    let scratch = &plugin.scratch;
    let project = scratch.path().join("project");
    std::fs::create_dir_all(&project).unwrap();
    scratch.manifest(&format!(
        "{}\n- name: outside-notes\n  path: {}\n",
        bundled_manifest(),
        plugin.library.display()
    ));
    with_build_lock(|| {
        // Its composition test loads the bundled plugins from where the `cordis` on PATH
        // (this build's) finds them, and from nowhere else.
        let mut test = cargo(&plugin.dir, &["test"]);
        let path = std::env::join_paths(std::iter::once(target_dir()).chain(
            std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
        ))
        .unwrap();
        test.env("PATH", path)
            .env("XDG_DATA_HOME", scratch.path().join("data"))
            .env_remove("CORDIS_PLUGIN_PATH");
        let tested = text(&run(test, true));
        assert!(tested.contains("test result: ok. 3 passed"), "{tested}");
        run(cargo(&plugin.dir, &["build"]), true);
        scratch
            .run(&["check"])
            .expect_code(0)
            .expect_output(&["valid composition", "outside-notes"]);
        let project_arg = project.display().to_string();
        for text in ["first", "second"] {
            let args = format!(r#"{{"text": "{text}"}}"#);
            scratch
                .run(&["call", "--cwd", &project_arg, "note", &args])
                .expect_code(0)
                .expect_output(&["noted under workspace-write"]);
        }
    });
    let notes = std::fs::read_to_string(project.join("NOTES.txt")).unwrap();
    assert_eq!(notes, "first\nsecond\n");
}

/// The `path` of dependency `krate` in `manifest`, a `Cargo.toml`.
fn path_dependency<'a>(manifest: &'a str, krate: &str) -> &'a str {
    let line = manifest
        .lines()
        .find(|l| l.starts_with(&format!("{krate} = {{ path = \"")))
        .unwrap_or_else(|| panic!("no path dependency on {krate}:\n{manifest}"));
    line.split('"').nth(1).expect("a quoted path")
}

/// `cordis-sdk` and `cordis-test` are path dependencies, relative to the crate at `dir`,
/// on this repository's SDK and test harness.
fn assert_relative_sdk_dependencies(dir: &Path, manifest: &str) {
    for (krate, at) in [
        ("cordis-sdk", "plugins/sdk"),
        ("cordis-test", "plugins/test-support"),
    ] {
        let path = path_dependency(manifest, krate);
        assert!(Path::new(path).is_relative(), "{krate}: {path}");
        assert_eq!(
            dir.join(path).canonicalize().unwrap(),
            workspace_root().join(at).canonicalize().unwrap(),
            "{krate}: {path}"
        );
    }
}

/// A cargo workspace in a scratch directory: a root manifest (with a comment, the
/// workspace's profiles and its lock file) whose `members` are `members`, and the member
/// crate `crates/existing`.
fn workspace_scratch(members: &str) -> Scratch {
    let scratch = Scratch::new();
    scratch.write(
        "Cargo.toml",
        &format!(
            "# Plugins of one project.\n[workspace]\nresolver = \"2\"\nmembers = {members}\nexclude = [\"vendor\"]\n\n{}",
            workspace_profiles()
        ),
    );
    scratch.write(
        "crates/existing/Cargo.toml",
        "[package]\nname = \"existing-member\"\nversion = \"0.1.0\"\nedition = \"2021\"\n",
    );
    scratch.write("crates/existing/src/lib.rs", "");
    std::fs::copy(
        workspace_root().join("Cargo.lock"),
        scratch.path().join("Cargo.lock"),
    )
    .expect("copy Cargo.lock");
    scratch
}

/// `cordis new ARGS` in `scratch`, with the SDK of this repository and no
/// `CARGO_TARGET_DIR` unless `target` names one; what it printed.
fn cordis_new_in(scratch: &Scratch, args: &[&str], target: Option<&Path>) -> String {
    let sdk = workspace_root().join("plugins/sdk");
    let mut cmd =
        scratch.cordis(&[&["new"], args, &["--sdk-path", &sdk.display().to_string()]].concat());
    cmd.env_remove("CARGO_TARGET_DIR");
    if let Some(target) = target {
        cmd.env("CARGO_TARGET_DIR", target);
    }
    text(&run(cmd, true))
}

/// Removes a library from the shared output directory when dropped.
struct RemoveLibrary(PathBuf);

impl Drop for RemoveLibrary {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `cordis new` inside a cargo workspace: the crate is a member (added to `members`, the
/// root manifest otherwise as it was), has no `[workspace]` of its own, depends on the
/// SDK by relative paths, builds from the workspace root, and its `cordis.yml` loads the
/// library from the workspace's target directory.
#[test]
fn cordis_new_in_a_workspace_adds_a_member_that_builds_there() {
    let scratch = workspace_scratch("[\"crates/existing\"]");
    let before = std::fs::read_to_string(scratch.path().join("Cargo.toml")).unwrap();
    let printed = cordis_new_in(&scratch, &["my-plugin", "--path", "crates/my-plugin"], None);
    let dir = scratch.path().join("crates/my-plugin");
    let file = cordis_engine::library_file_name("my-plugin");
    let in_workspace_target = scratch.path().join("target/debug").join(&file);
    for needle in [
        "created plugin crate `my-plugin`",
        &format!(
            "a member of the workspace at {} (`crates/my-plugin` added to `members`",
            scratch.path().display()
        ),
        &format!("  path: {}\n", in_workspace_target.display()),
    ] {
        assert!(printed.contains(needle), "lacks {needle:?}:\n{printed}");
    }
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
    assert!(!manifest.contains("[workspace]"), "{manifest}");
    assert_relative_sdk_dependencies(&dir, &manifest);
    assert!(
        !dir.join(".gitignore").exists(),
        "the workspace's target is elsewhere"
    );
    let root = std::fs::read_to_string(scratch.path().join("Cargo.toml")).unwrap();
    assert_eq!(
        root,
        before.replace(
            "members = [\"crates/existing\"]",
            "members = [\"crates/existing\", \"crates/my-plugin\"]"
        ),
        "only `members` changed"
    );
    assert!(root.starts_with("# Plugins of one project.\n"), "{root}");
    let yml = std::fs::read_to_string(dir.join("cordis.yml")).unwrap();
    assert!(
        yml.contains(&format!("  path: ../../target/debug/{file}\n")),
        "{yml}"
    );

    // Built at the workspace root (into the shared output directory, to reuse the SDK's
    // build), then placed where the workspace's own target directory would have it.
    let built = RemoveLibrary(target_dir().join(&file));
    with_build_lock(|| {
        run(cargo(&scratch.path(), &["build"]), true);
        assert!(built.0.is_file(), "{} was not built", built.0.display());
        std::fs::create_dir_all(in_workspace_target.parent().unwrap()).unwrap();
        std::fs::copy(&built.0, &in_workspace_target).unwrap();
        std::fs::remove_file(&built.0).unwrap();
    });
    let mut check = scratch.cordis(&["check"]);
    check.current_dir(&dir);
    let checked = text(&run(check, true));
    assert!(
        checked.contains("valid composition, 1 entry")
            && checked.contains(&format!("file     ../../target/debug/{file}\n"))
            && checked.contains("provides myPlugin (my-plugin.greeter v1)"),
        "{checked}"
    );
}

/// A member's profiles are ignored, so for a workspace that sets no `[profile.dev]` the
/// light profile is suggested for its root manifest, which stays as it was.
#[test]
fn cordis_new_in_a_workspace_without_a_dev_profile_suggests_the_light_one() {
    let scratch = Scratch::new();
    scratch.write("Cargo.toml", "[workspace]\nmembers = []\n");
    let printed = cordis_new_in(&scratch, &["bare"], None);
    let root = scratch.path().join("Cargo.toml");
    assert!(
        printed.contains(&format!(
            "tip: the workspace sets no `[profile.dev]`; for test builds about half the size and faster, add to {}:",
            root.display()
        )) && printed.contains("[profile.dev.package.\"*\"]\ndebug = false\n"),
        "{printed}"
    );
    let manifest = std::fs::read_to_string(scratch.path().join("bare/Cargo.toml")).unwrap();
    assert!(!manifest.contains("[profile"), "{manifest}");
    assert_eq!(
        std::fs::read_to_string(&root).unwrap(),
        "[workspace]\nmembers = [\"bare\"]\n"
    );
}

/// A workspace whose `members` glob covers the new crate keeps its root manifest byte for
/// byte, and the library's path follows the target directory cargo is told of; a crate
/// under an excluded path is its own workspace, and the note says so.
#[test]
fn cordis_new_in_a_workspace_that_covers_or_excludes_the_crate_leaves_its_manifest_alone() {
    let scratch = workspace_scratch("[\"crates/*\"]");
    let root = scratch.path().join("Cargo.toml");
    let before = std::fs::read(&root).unwrap();
    let target = cargo_target();
    let printed = cordis_new_in(
        &scratch,
        &["globbed", "--path", "crates/globbed"],
        Some(&target),
    );
    let dir = scratch.path().join("crates/globbed");
    let library = target
        .join("debug")
        .join(cordis_engine::library_file_name("globbed"));
    let entry = format!("  path: {}\n", library.display());
    assert!(
        printed.contains(&format!(
            "a member of the workspace at {}; it builds",
            scratch.path().display()
        )) && printed.contains(&entry),
        "{printed}"
    );
    let yml = std::fs::read_to_string(dir.join("cordis.yml")).unwrap();
    assert!(yml.contains(&entry), "{yml}");
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
    assert!(
        !manifest.contains("[workspace]") && !manifest.contains("[profile"),
        "{manifest}"
    );
    // The root sets its own `[profile.dev]`: nothing to suggest.
    assert!(!printed.contains("tip:"), "{printed}");
    assert_eq!(
        std::fs::read(&root).unwrap(),
        before,
        "the root manifest changed"
    );

    let printed = cordis_new_in(&scratch, &["apart", "--path", "vendor/apart"], None);
    let dir = scratch.path().join("vendor/apart");
    assert!(
        printed.contains(&format!(
            "note: the workspace at {} excludes {}",
            scratch.path().display(),
            dir.display()
        )),
        "{printed}"
    );
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
    assert!(
        manifest.contains("\n[workspace]\n")
            && manifest.ends_with(
                "[profile.dev]\ndebug = \"line-tables-only\"\n\n[profile.dev.package.\"*\"]\ndebug = false\n"
            ),
        "{manifest}"
    );
    assert_relative_sdk_dependencies(&dir, &manifest);
    let yml = std::fs::read_to_string(dir.join("cordis.yml")).unwrap();
    let file = cordis_engine::library_file_name("apart");
    assert!(
        yml.contains(&format!("  path: target/debug/{file}\n")),
        "{yml}"
    );
    assert_eq!(
        std::fs::read(&root).unwrap(),
        before,
        "the root manifest changed"
    );
}

#[test]
fn cordis_new_refuses_bad_names_and_existing_directories() {
    let scratch = Scratch::new();
    for (name, why) in [
        ("My-Plugin", "it must start with a lowercase ASCII letter"),
        ("my.plugin", "it contains `.`"),
        ("fn", "it is a Rust keyword"),
    ] {
        scratch
            .run(&["new", name])
            .expect_code(1)
            .expect_output(&[&format!("`{name}` is not a valid plugin name: {why}")]);
        assert!(!scratch.path().join(name).exists());
    }

    scratch.write("taken/keep.txt", "mine");
    scratch
        .run(&["new", "taken"])
        .expect_code(1)
        .expect_output(&["taken already exists and is not empty", "pass `--path DIR`"]);
    assert_eq!(
        std::fs::read_to_string(scratch.path().join("taken/keep.txt")).unwrap(),
        "mine"
    );
    assert!(!scratch.path().join("taken/Cargo.toml").exists());

    // An empty directory is filled; nothing is left beside it.
    std::fs::create_dir_all(scratch.path().join("plugins/empty")).unwrap();
    scratch
        .run(&["new", "filled", "--path", "plugins/empty"])
        .expect_code(0)
        .expect_output(&["created plugin crate `filled`"]);
    let crate_dir = scratch.path().join("plugins/empty");
    for file in [
        "Cargo.toml",
        "src/lib.rs",
        "tests/plugin.rs",
        "README.md",
        "cordis.yml",
    ] {
        assert!(crate_dir.join(file).is_file(), "{file} missing");
    }
    let beside: Vec<_> = std::fs::read_dir(scratch.path().join("plugins"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(beside, ["empty"], "staging left behind");

    scratch
        .run(&["new", "elsewhere", "--sdk-path", "no/such/sdk"])
        .expect_code(1)
        .expect_output(&["the cordis SDK is not at no/such/sdk", "--sdk-path"]);
    assert!(!scratch.path().join("elsewhere").exists());
    // An SDK without `test-support` beside it: the message names the crate that is missing.
    let lone = scratch.path().join("lone/sdk");
    std::fs::create_dir_all(&lone).unwrap();
    std::fs::copy(
        workspace_root().join("plugins/sdk/Cargo.toml"),
        lone.join("Cargo.toml"),
    )
    .unwrap();
    scratch
        .run(&["new", "elsewhere", "--sdk-path", "lone/sdk"])
        .expect_code(1)
        .expect_output(&[
            "the plugin test harness `cordis-test` is not at",
            "lone/test-support (beside the SDK at lone/sdk)",
            "--sdk-path",
        ]);
    assert!(!scratch.path().join("elsewhere").exists());
}

/// The SDK's sources as they were at `revision` (from git), in `dir/sdk`.
fn sdk_at_revision(dir: &Path, revision: &str) -> PathBuf {
    let copy = dir.join("sdk");
    std::fs::create_dir_all(copy.join("src")).unwrap();
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .current_dir(workspace_root())
            .args(args)
            .output()
            .expect("run git");
        assert!(
            out.status.success(),
            "git {} failed (this test needs the repository's history, not a shallow clone): {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    let files = git(&["ls-tree", "--name-only", revision, "plugins/sdk/src/"]);
    for file in String::from_utf8(files).unwrap().lines() {
        let text = git(&["show", &format!("{revision}:{file}")]);
        let name = Path::new(file).file_name().unwrap();
        std::fs::write(copy.join("src").join(name), text).unwrap();
    }
    let manifest = git(&["show", &format!("{revision}:plugins/sdk/Cargo.toml")]);
    let version = env!("CARGO_PKG_VERSION");
    write_sdk_manifest(&copy, &String::from_utf8(manifest).unwrap(), version);
    copy
}

/// This host's cordis-sdk version and the ABI it speaks.
fn host_sdk() -> (&'static str, String) {
    let host_sdk = env!("CARGO_PKG_VERSION");
    let host_abi = match host_sdk.split('.').collect::<Vec<_>>()[..] {
        ["0", minor, _] => format!("0.{minor}"),
        [major, ..] => major.to_string(),
        _ => unreachable!("a semver version"),
    };
    (host_sdk, host_abi)
}

/// A scratch directory whose `cordis.yml` composes plugin `name` built against a copy of the
/// SDK whose version is `version`.
fn plugin_against_sdk(name: &str, version: &str) -> Scratch {
    let scratch = Scratch::new();
    let sdk = sdk_copy(&scratch.path(), version);
    let source = format!("//! A plugin built against another SDK release.\nuse cordis_sdk::prelude::*;\n#[derive(Deserialize, JsonSchema)]\npub struct Config {{}}\npub struct Other;\nimpl Plugin for Other {{\n    type Config = Config;\n    fn metadata() -> Metadata {{ Metadata::new(\"{name}\", \"0.1.0\") }}\n    fn apply(_ctx: &mut Context<'_>, _config: Config) -> Result<Self> {{ Ok(Other) }}\n}}\ncordis_sdk::export_plugin!(Other);\n");
    build_plugin(&scratch, name, &sdk, &source);
    scratch
}

/// Builds plugin `name` from `source` against the SDK at `sdk`, outside the workspace, into
/// `scratch`, whose `cordis.yml` composes it.
fn build_plugin(scratch: &Scratch, name: &str, sdk: &Path, source: &str) {
    scratch.write(".cargo/config.toml", &workspace_profiles());
    scratch.write(
        "other/Cargo.toml",
        &format!(
            "[package]\nname = \"{name}\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[lib]\ncrate-type = [\"cdylib\"]\n\n[dependencies]\ncordis-sdk = {{ path = \"{}\" }}\nschemars = \"1\"\nserde = {{ version = \"1\", features = [\"derive\"] }}\n\n[workspace]\n",
            sdk.display()
        ),
    );
    scratch.write("other/src/lib.rs", source);
    let dir = scratch.path().join("other");
    std::fs::copy(workspace_root().join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
    let file = cordis_engine::library_file_name(name);
    let library = target_dir().join(&file);
    with_build_lock(|| {
        run(cargo(&dir, &["build"]), true);
        // Take it out of the shared output directory at once: it is no plugin of this host.
        std::fs::rename(&library, scratch.path().join(&file)).unwrap();
    });
    scratch.manifest(&format!("- name: {name}\n  path: {file}\n"));
}

/// The last revision whose SDK had neither tool annotations and output schemas, structured
/// results (both through the host's `toolExtras` service) nor progress: a compatible change,
/// so a library built against it must keep loading and serving.
const SDK_BEFORE_ANNOTATIONS: &str = "2da6211d704165d0e6651063eb3b5949c452a8da";

#[test]
fn a_plugin_built_before_annotations_and_structured_results_still_loads_and_serves() {
    let scratch = Scratch::new();
    let sdk = sdk_at_revision(&scratch.path(), SDK_BEFORE_ANNOTATIONS);
    let source = r#"//! A plugin built against the SDK before tool annotations.
use cordis_sdk::prelude::*;
#[derive(Deserialize, JsonSchema)]
pub struct Config {}
pub struct Older;
impl Plugin for Older {
    type Config = Config;
    fn metadata() -> Metadata {
        Metadata::new("older-plugin", "0.1.0").tool("older-echo")
    }
    fn apply(ctx: &mut Context<'_>, _config: Config) -> Result<Self> {
        let tool = Tool {
            name: "older-echo".into(),
            description: "echoes `text`".into(),
            input_schema: cordis_sdk::serde_json::json!({"type": "object", "properties": {"text": {"type": "string"}}}),
        };
        ctx.register_tool(tool, |call, args| {
            Ok(ToolResult::ok(format!("{} in {}", args["text"].as_str().unwrap_or(""), call.session.cwd.display())))
        })?;
        Ok(Older)
    }
}
cordis_sdk::export_plugin!(Older);
"#;
    build_plugin(&scratch, "older-plugin", &sdk, source);
    scratch.run(&["check", "-v"]).expect_code(0);
    let call = scratch.run(&["call", "older-echo", r#"{"text": "still served"}"#]);
    call.expect_code(0)
        .expect_output(&[&format!("still served in {}", scratch.path().display())]);
    // Listed without annotations or an output schema (it declared none).
    let tools: serde_json::Value =
        serde_json::from_str(&scratch.run(&["tools"]).expect_code(0).stdout()).unwrap();
    let tool = &tools.as_array().unwrap()[0];
    assert_eq!(tool["name"], "older-echo", "{tools}");
    assert!(
        tool.get("annotations").is_none_or(|a| a.is_null()),
        "{tools}"
    );
}

#[test]
fn a_plugin_built_against_an_incompatible_sdk_is_refused_with_both_versions() {
    let scratch = plugin_against_sdk("future-plugin", "1.0.0");
    let (host_sdk, host_abi) = host_sdk();
    scratch.run(&["check"]).expect_code(1).expect_output(&[
        "error[abi-mismatch]: entry `future-plugin`: cannot use",
        &format!("libfuture_plugin.so: ABI mismatch: the plugin was built against cordis-sdk 1.0.0 (ABI 1), this host against cordis-sdk {host_sdk} (ABI {host_abi}); rebuild the plugin with its `cordis-sdk` dependency set to the host's SDK ({host_abi}), or run a cordis built with the plugin's SDK"),
        "cordis.yml:1:3",
    ]);
    let err = PluginUnderTest::load(scratch.path().join("libfuture_plugin.so")).unwrap_err();
    assert!(
        err.to_string()
            .contains("built against cordis-sdk 1.0.0 (ABI 1)"),
        "{err}"
    );
}

/// Below 1.0 the minor version is the ABI: a plugin of the next minor release is told so,
/// with both versions and the rule, not that its types differ in layout.
#[test]
fn a_plugin_of_the_next_minor_sdk_release_is_told_which_rule_it_breaks() {
    let (host_sdk, host_abi) = host_sdk();
    let minor: u64 = host_abi
        .strip_prefix("0.")
        .map_or(0, |m| m.parse().unwrap());
    assert!(
        host_abi.starts_with("0."),
        "update this test for SDK 1.0: {host_sdk}"
    );
    let next = format!("0.{}.0", minor + 1);
    let scratch = plugin_against_sdk("next-minor-plugin", &next);
    scratch.run(&["check"]).expect_code(1).expect_output(&[
        "error[abi-mismatch]: entry `next-minor-plugin`: cannot use",
        &format!("the plugin was built against cordis-sdk {next} (ABI 0.{}), this host against cordis-sdk {host_sdk} (ABI {host_abi})", minor + 1),
        "a plugin must speak its host's ABI: the SDK's major version, or its minor version below 1.0",
    ]);
}
