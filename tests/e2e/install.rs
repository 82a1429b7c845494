//! End-to-end tests of installing cordis as an operator does: the release archive
//! extracted into a prefix and run from outside the repository with a clean environment;
//! a plugin crate installed, listed, composed and removed with `cordis plugin`; a broken
//! library refused with nothing copied.

use std::path::{Path, PathBuf};
use std::process::Command;

use cordis_e2e::{
    build_workspace, cargo, cargo_target, library, outside_base, sdk_copy, target_dir, unique,
    with_build_lock, workspace_profiles, workspace_root, write_sdk_manifest, Scratch,
};
use serde_json::Value;

/// Runs `cmd` to completion and panics with everything it printed unless it exits `code`.
fn expect(cmd: &mut Command, code: i32) -> String {
    let what = format!("{cmd:?}");
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        out.status.code(),
        Some(code),
        "unexpected exit\ncommand: {what}\n{text}"
    );
    text
}

/// The files in `dir` (none when it does not exist).
fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// `cargo xtask dist` of the tree the tests run from, extracted into a temporary prefix,
/// works from a directory outside the repository with no `CORDIS_*` variable and a `HOME`
/// of its own: `check` of the bundled `cordis.yml` finds every plugin in the prefix, and a
/// `cordis call` writes and reads through the sandboxed filesystem.
#[test]
fn an_extracted_release_archive_works_from_any_prefix_with_a_clean_environment() {
    build_workspace();
    let out = tempfile::tempdir().expect("tempdir");
    let profile = target_dir()
        .file_name()
        .and_then(|n| n.to_str())
        .map(|dir| if dir == "debug" { "dev" } else { dir })
        .expect("profile dir")
        .to_string();
    // The archive is assembled from the libraries the tests use: no build, under the lock
    // the tests that rebuild libraries hold.
    let listed = with_build_lock(|| {
        expect(
            Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
                .current_dir(workspace_root())
                .args([
                    "xtask",
                    "dist",
                    "--profile",
                    &profile,
                    "--no-build",
                    "--out-dir",
                ])
                .arg(out.path()),
            0,
        )
    });
    let archive = files_in(out.path())
        .into_iter()
        .find(|f| f.ends_with(".tar.gz"))
        .unwrap_or_else(|| panic!("no archive in {}:\n{listed}", out.path().display()));
    let name = archive.trim_end_matches(".tar.gz").to_string();
    assert!(
        name.starts_with(&format!("cordis-{}-", env!("CARGO_PKG_VERSION"))),
        "{archive} is not cordis-<version>-<target>.tar.gz"
    );

    let prefix_parent = tempfile::tempdir().expect("prefix");
    expect(
        Command::new("tar")
            .arg("-xzf")
            .arg(out.path().join(&archive))
            .arg("-C")
            .arg(prefix_parent.path()),
        0,
    );
    let prefix = prefix_parent.path().join(&name);
    for file in [
        "bin/cordis",
        "lib/cordis/plugins/libdsh_tool_fs.so",
        "lib/cordis/plugins/libdsh_bash_sandbox.so",
        "share/cordis/cordis.yml",
        "share/cordis/schemas/cordis.schema.json",
        "share/cordis/schemas/dsh-sandbox-policy.schema.json",
        "share/man/man1/cordis.1",
        "share/bash-completion/completions/cordis",
        "share/zsh/site-functions/_cordis",
        "share/fish/vendor_completions.d/cordis.fish",
        "README.md",
        "LICENSE-MIT",
        "LICENSE-APACHE",
    ] {
        assert!(prefix.join(file).is_file(), "the archive lacks {file}");
    }
    let read = |rel: &str| std::fs::read_to_string(prefix.join(rel)).expect(rel);
    assert!(read("share/man/man1/cordis.1").contains(".TH cordis 1"));
    assert!(read("share/man/man1/cordis.1").contains("plugin"));
    assert!(read("share/bash-completion/completions/cordis").contains("_cordis()"));
    assert!(read("share/zsh/site-functions/_cordis").starts_with("#compdef cordis"));
    assert!(read("share/fish/vendor_completions.d/cordis.fish").contains("complete -c cordis"));
    assert_eq!(
        files_in(&prefix.join("lib/cordis/plugins")),
        [
            "libdsh_bash_local.so",
            "libdsh_bash_sandbox.so",
            "libdsh_fs_local.so",
            "libdsh_fs_sandbox.so",
            "libdsh_sandbox_policy.so",
            "libdsh_tool_bash.so",
            "libdsh_tool_fs.so"
        ],
        "the bundled plugins, and only they"
    );

    // An operator's machine: a home of its own, a workspace outside the repository.
    let home = tempfile::tempdir().expect("home");
    let work = tempfile::tempdir().expect("workspace");
    let work_dir = work.path().canonicalize().expect("canonical workspace");
    let clean = |dir: &Path, args: &[&str]| {
        let mut cmd = Command::new(prefix.join("bin/cordis"));
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", home.path())
            .current_dir(dir)
            .args(args);
        cmd
    };
    let plugins_dir = prefix.join("lib/cordis/plugins");
    let checked = expect(
        &mut clean(&prefix, &["check", "-c", "share/cordis/cordis.yml"]),
        0,
    );
    assert!(
        checked.contains("valid composition, 5 entries"),
        "{checked}"
    );
    assert!(
        checked.contains(&format!(
            "file     {}",
            plugins_dir.join("libdsh_tool_fs.so").display()
        )),
        "the plugins come from the prefix:\n{checked}"
    );
    let manifest = prefix.join("share/cordis/cordis.yml");
    let manifest = manifest.to_str().expect("utf-8 path");
    let wrote = expect(
        &mut clean(
            &work_dir,
            &[
                "call",
                "-c",
                manifest,
                "write",
                r#"{"path": "notes.txt", "content": "from the archive\n"}"#,
            ],
        ),
        0,
    );
    assert_eq!(
        std::fs::read_to_string(work_dir.join("notes.txt")).expect("written"),
        "from the archive\n",
        "{wrote}"
    );
    // Outside the session's root and the temp areas, the fence holds.
    let outside = outside_base().join(format!("archive-{}.txt", unique()));
    let args = serde_json::json!({"path": outside, "content": "x"}).to_string();
    let denied = expect(
        &mut clean(&work_dir, &["call", "-c", manifest, "write", &args]),
        1,
    );
    assert!(
        denied.contains("[sandbox: file access denied under workspace-write mode]")
            && !outside.exists(),
        "the fence holds:\n{denied}"
    );
    let list = expect(
        &mut clean(&work_dir, &["plugin", "list", "--format", "json"]),
        0,
    );
    let list: Vec<Value> = serde_json::from_str(&list).expect("json list");
    assert_eq!(list.len(), 7, "{list:?}");
    for item in &list {
        assert!(
            item["file"]
                .as_str()
                .is_some_and(|f| Path::new(f).starts_with(&plugins_dir))
                && item["shadowed_by"].is_null(),
            "{item}"
        );
    }
    assert!(
        home.path().join(".local/state/cordis").is_dir(),
        "the session state went to the default under HOME"
    );
}

/// The user plugin directory of the commands `s` runs.
fn user_dir(s: &Scratch) -> PathBuf {
    s.data_dir().join("cordis/plugins")
}

/// `cordis plugin list --format json`, the entries for `name`.
fn listed(s: &Scratch, name: &str) -> Vec<Value> {
    let run = s.run(&["plugin", "list", "--format", "json"]);
    run.expect_code(0);
    let all: Vec<Value> = serde_json::from_str(&run.stdout()).expect("json list");
    all.into_iter().filter(|p| p["name"] == name).collect()
}

/// The example plugin's crate is built in release, installed into the user plugin
/// directory, listed (hiding the copy in the build output), composed, reinstalled over
/// itself, removed; a file of another plugin in its place is never overwritten.
#[test]
fn a_plugin_crate_is_installed_listed_composed_and_removed() {
    build_workspace();
    let s = Scratch::new();
    let crate_dir = workspace_root().join("plugins/examples/example");
    let crate_dir = crate_dir.to_str().expect("utf-8");
    s.run(&["plugin", "install", crate_dir])
        .expect_code(0)
        .expect_output(&[
            "installed plugin `cordis-example` 0.1.0 (cordis-sdk 0.1.0)",
            "provides: greeter",
            "tools: greet",
            "- name: cordis-example",
        ])
        .expect_output(&[&format!(
            "note: it takes precedence over {}",
            library("cordis-example").display()
        )]);
    let installed = user_dir(&s).join("libcordis_example.so");
    assert_eq!(
        files_in(&user_dir(&s)),
        [".sources", "libcordis_example.so"],
        "no temporary file left"
    );
    // Where it came from, for `cordis plugin upgrade`.
    let record: Value = serde_json::from_str(
        &std::fs::read_to_string(user_dir(&s).join(".sources/libcordis_example.so.json"))
            .expect("the install is recorded"),
    )
    .expect("a JSON record");
    assert_eq!(
        record["source"]["crate"],
        workspace_root()
            .join("plugins/examples/example")
            .canonicalize()
            .unwrap()
            .to_str()
            .unwrap()
    );
    assert_eq!(record["plugin"], "cordis-example");

    let entries = listed(&s, "cordis-example");
    assert_eq!(
        entries.len(),
        2,
        "the installed copy and the build output's: {entries:?}"
    );
    assert_eq!(entries[0]["file"], installed.to_str().unwrap());
    assert!(entries[0]["shadowed_by"].is_null());
    assert_eq!(entries[0]["services"], serde_json::json!(["greeter"]));
    assert_eq!(entries[0]["tools"], serde_json::json!(["greet"]));
    assert_eq!(entries[0]["sdk"], "0.1.0");
    assert_eq!(
        entries[1]["file"],
        library("cordis-example").to_str().unwrap()
    );
    assert_eq!(entries[1]["shadowed_by"], installed.to_str().unwrap());
    s.run(&["plugin", "list"]).expect_code(0).expect_output(&[
        "[the user plugin directory]",
        &format!("(shadowed by {})", installed.display()),
    ]);

    s.manifest("- name: cordis-example\n  config:\n    word: howdy\n");
    s.run(&["check"])
        .expect_code(0)
        .expect_output(&[&format!("file     {}", installed.display())]);
    s.run(&["call", "greet", r#"{"name": "operator"}"#])
        .expect_code(0)
        .expect_output(&["howdy, operator"]);

    // Installing the built library again replaces it.
    let release = workspace_root().join("target/release/libcordis_example.so");
    s.run(&["plugin", "install", release.to_str().unwrap()])
        .expect_code(0)
        .expect_output(&["replacing 0.1.0"]);

    s.run(&["plugin", "remove", "cordis-example"])
        .expect_code(0)
        .expect_output(&[
            &format!("removed {}", installed.display()),
            "the search path still finds `cordis-example`",
        ]);
    assert_eq!(files_in(&user_dir(&s)), [".sources"]);
    assert_eq!(
        files_in(&user_dir(&s).join(".sources")),
        Vec::<String>::new(),
        "the record goes with the library"
    );
    assert_eq!(listed(&s, "cordis-example").len(), 1);
    s.run(&["plugin", "remove", "cordis-example"])
        .expect_code(1)
        .expect_output(&["is not installed in", "does not manage"]);

    // Another plugin's library under this plugin's file name is never overwritten.
    let impostor = library("dsh-tool-fs");
    std::fs::copy(&impostor, &installed).expect("plant");
    s.run(&["plugin", "install", release.to_str().unwrap()])
        .expect_code(1)
        .expect_output(&[
            "is plugin `dsh-tool-fs` 0.1.0, not `cordis-example`",
            "refusing to overwrite another plugin's file",
        ]);
    assert_eq!(
        std::fs::read(&installed).expect("still there"),
        std::fs::read(&impostor).expect("impostor"),
        "the file was left as it was"
    );
    assert_eq!(
        files_in(&user_dir(&s)),
        [".sources", "libcordis_example.so"]
    );
}

/// A truncated library, a file that is not ELF and a shared object that is no cordis
/// plugin are each refused with the reason; the user plugin directory holds nothing after.
#[test]
fn a_broken_library_is_refused_and_nothing_is_copied() {
    build_workspace();
    let s = Scratch::new();
    let real = std::fs::read(library("cordis-example")).expect("library");
    let truncated = s.path().join("libtruncated.so");
    std::fs::write(&truncated, &real[..real.len() / 3]).expect("write");
    let junk = s.write("libjunk.so", "not a library");
    // A proc-macro the build made: a shared object, not a plugin.
    let not_a_plugin = std::fs::read_dir(target_dir().join("deps"))
        .expect("deps")
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.starts_with("libserde_derive-") && name.ends_with(".so")
        })
        .expect("serde_derive's proc-macro library in the build output");
    for (source, reason) in [
        (&truncated, "the file is incomplete"),
        (&junk, "not an ELF file"),
        (&not_a_plugin, "it is not a cordis plugin"),
    ] {
        s.run(&["plugin", "install", source.to_str().unwrap()])
            .expect_code(1)
            .expect_output(&["cannot be installed", reason, "nothing was installed"]);
        assert_eq!(
            files_in(&user_dir(&s)),
            Vec::<String>::new(),
            "{} left something behind",
            source.display()
        );
    }
    s.run(&[
        "plugin",
        "install",
        s.path().join("no-such").to_str().unwrap(),
    ])
    .expect_code(1)
    .expect_output(&["neither a plugin library nor a plugin crate directory"]);
}

/// A plugin crate outside the workspace, depending on a copy of the SDK by path, so the
/// test can build it against another SDK release.
struct OutsideCrate {
    scratch: Scratch,
    sdk: PathBuf,
    dir: PathBuf,
}

impl OutsideCrate {
    fn new(name: &str) -> Self {
        let scratch = Scratch::new();
        let sdk = sdk_copy(&scratch.path(), env!("CARGO_PKG_VERSION"));
        scratch.write(".cargo/config.toml", &workspace_profiles());
        scratch.write(
            "plugin/Cargo.toml",
            &format!(
                "[package]\nname = \"{name}\"\nversion = \"0.2.0\"\nedition = \"2021\"\n\n[lib]\ncrate-type = [\"cdylib\"]\n\n[dependencies]\ncordis-sdk = {{ path = \"../sdk\" }}\nschemars = \"1\"\nserde = {{ version = \"1\", features = [\"derive\"] }}\n\n[workspace]\n"
            ),
        );
        scratch.write(
            "plugin/src/lib.rs",
            &format!("use cordis_sdk::prelude::*;\n#[derive(Deserialize, JsonSchema)]\npub struct Config {{}}\npub struct P;\nimpl Plugin for P {{\n    type Config = Config;\n    fn metadata() -> Metadata {{ Metadata::new(\"{name}\", \"0.2.0\") }}\n    fn apply(_ctx: &mut Context<'_>, _config: Config) -> Result<Self> {{ Ok(P) }}\n}}\ncordis_sdk::export_plugin!(P);\n"),
        );
        let dir = scratch.path().join("plugin");
        std::fs::copy(workspace_root().join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
        OutsideCrate { scratch, sdk, dir }
    }

    /// Sets the SDK copy's release to `version`.
    fn sdk_release(&self, version: &str) {
        let manifest = std::fs::read_to_string(workspace_root().join("plugins/sdk/Cargo.toml"))
            .expect("the SDK's manifest");
        write_sdk_manifest(&self.sdk, &manifest, version);
    }

    /// `cordis ARGS` sharing the workspace's target directory, under the build lock, the
    /// library taken out of the shared release directory afterwards (no plugin of this
    /// workspace).
    fn cordis(&self, s: &Scratch, args: &[&str], code: i32, name: &str) -> String {
        with_build_lock(|| {
            let mut cmd = s.cordis(args);
            cmd.env("CARGO_TARGET_DIR", cargo_target());
            let out = expect(&mut cmd, code);
            let _ = std::fs::remove_file(
                cargo_target()
                    .join("release")
                    .join(cordis_engine::library_file_name(name)),
            );
            out
        })
    }

    /// `cargo build --release` of the crate; its library.
    fn build_release(&self, name: &str) -> Vec<u8> {
        with_build_lock(|| {
            let mut cmd = cargo(&self.dir, &["build", "--release"]);
            expect(&mut cmd, 0);
            let built = cargo_target()
                .join("release")
                .join(cordis_engine::library_file_name(name));
            let bytes = std::fs::read(&built).expect("the built library");
            let _ = std::fs::remove_file(&built);
            bytes
        })
    }
}

/// An installed plugin built against an older SDK release than this cordis's: `cordis
/// plugin list` names it with the reason and the fix; `cordis plugin upgrade` rebuilds it
/// from the crate `install` recorded — refused, with the file untouched, while the crate
/// still depends on the old release; in place, and loading, once it depends on this one.
#[test]
fn an_installed_plugin_of_an_older_sdk_release_is_named_stale_and_upgraded_from_its_source() {
    build_workspace();
    let name = "stale-notes";
    let krate = OutsideCrate::new(name);
    let s = &krate.scratch;
    let installed = user_dir(s).join(cordis_engine::library_file_name(name));
    let dir = krate.dir.to_str().unwrap();
    let first = krate.cordis(s, &["plugin", "install", dir], 0, name);
    assert!(
        first.contains("installed plugin `stale-notes` 0.2.0"),
        "{first}"
    );

    // What an older cordis installed: the same crate built against an older SDK release.
    krate.sdk_release("0.0.9");
    let old = krate.build_release(name);
    std::fs::write(&installed, &old).expect("put the old build in place");
    s.manifest(&format!("- name: {name}\n"));
    s.run(&["check"])
        .expect_code(1)
        .expect_output(&["built against cordis-sdk 0.0.9"]);
    s.run(&["plugin", "list"]).expect_code(0).expect_output(&[
        &format!(
            "1 plugin library this cordis (cordis-sdk {}) cannot load:",
            env!("CARGO_PKG_VERSION")
        ),
        &format!(
            "{}: ABI mismatch: the plugin was built against cordis-sdk 0.0.9",
            installed.display()
        ),
        &format!(
            "fix: `cordis plugin upgrade {name}` rebuilds it from the crate at {}",
            krate.dir.display()
        ),
    ]);
    let run = s.run(&["plugin", "list", "--format", "json"]);
    run.expect_code(0);
    let all: Vec<Value> = serde_json::from_str(&run.stdout()).expect("json list");
    let stale = all
        .iter()
        .find(|l| l["file"] == installed.to_str().unwrap())
        .expect("listed");
    assert_eq!(stale["installed_from"]["crate"], dir, "{stale}");
    assert!(
        stale["error"].as_str().unwrap().contains("0.0.9"),
        "{stale}"
    );
    assert!(
        stale["fix"]
            .as_str()
            .unwrap()
            .contains("cordis plugin upgrade"),
        "{stale}"
    );

    // Still depending on the old release, the rebuild is refused as `install` refuses it.
    let refused = krate.cordis(s, &["plugin", "upgrade"], 1, name);
    assert!(
        refused.contains(&format!(
            "`{name}`: not upgraded, {} is unchanged",
            installed.display()
        )) && refused.contains("built against cordis-sdk 0.0.9"),
        "{refused}"
    );
    assert_eq!(
        std::fs::read(&installed).unwrap(),
        old,
        "the file is unchanged"
    );

    // Depending on this cordis's release, it is rebuilt, checked and put in place.
    krate.sdk_release(env!("CARGO_PKG_VERSION"));
    let upgraded = krate.cordis(s, &["plugin", "upgrade"], 0, name);
    assert!(
        upgraded.contains(&format!(
            "`{name}`: reinstalled from the crate at {} at {}: {name} 0.2.0 (cordis-sdk {})",
            krate.dir.display(),
            installed.display(),
            env!("CARGO_PKG_VERSION")
        )),
        "{upgraded}"
    );
    s.run(&["check"])
        .expect_code(0)
        .expect_output(&["valid composition"]);
    let listed = s.run(&["plugin", "list"]);
    listed.expect_code(0);
    assert!(
        !listed.stdout().contains("cannot load"),
        "{}",
        listed.stdout()
    );
    let again = krate.cordis(s, &["plugin", "upgrade"], 0, name);
    assert!(
        again.contains(&format!("`{name}`: loads with this cordis; left as it is")),
        "{again}"
    );
    s.run(&["plugin", "upgrade", "no-such-plugin"])
        .expect_code(1)
        .expect_output(&["no plugin `no-such-plugin` is installed in"]);
}
