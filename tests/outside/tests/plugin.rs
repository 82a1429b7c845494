//! The outside plugin's own tests: `cordis-test` with the stand-ins the interface crates
//! ship (feature `testing`), one line each.

use cordis_test::{Composition, PluginUnderTest, ToolResult};
use dsh_fs_api::testing::TempDirFs;
use dsh_sandbox::testing::FixedPolicy;
use dsh_sandbox::SandboxMode;
use serde_json::json;

fn plugin() -> PluginUnderTest {
    PluginUnderTest::build(env!("CARGO_MANIFEST_DIR")).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn notes_go_through_the_fs_under_the_sessions_policy() {
    let fs = TempDirFs::new().unwrap();
    let started = plugin()
        .stand_in(dsh_fs_api::FS, fs.serve())
        .stand_in(
            dsh_sandbox::SANDBOX_POLICY,
            FixedPolicy::new(SandboxMode::WorkspaceWrite, fs.path()).serve(),
        )
        .cwd(fs.path())
        .start()
        .unwrap_or_else(|e| panic!("{e}"));
    for text in ["one", "two"] {
        let result = started.call_tool("note", json!({ "text": text })).unwrap();
        assert_eq!(result, ToolResult::ok("noted under workspace-write"));
    }
    let notes = std::fs::read_to_string(fs.path().join("NOTES.txt")).unwrap();
    assert_eq!(notes, "one\ntwo\n");
}

#[test]
fn every_missing_stand_in_is_named_at_once() {
    let err = plugin().start().expect_err("two services are missing");
    let err = err.to_string();
    assert!(
        err.contains("it requires service `fs`") && err.contains("it requires service `sandboxPolicy`"),
        "{err}"
    );
}

/// The whole chain: this plugin, the bundled sandboxed `fs` and the real policy owner,
/// loaded from where the `cordis` on `PATH` finds them, composed as `cordis.yml` would.
#[test]
fn the_real_fs_refuses_a_note_under_the_real_policy_owners_read_only_mode() {
    let compose = |mode: &str| {
        Composition::new()
            .plugin(plugin())
            .plugin(PluginUnderTest::installed("dsh-fs-sandbox").unwrap_or_else(|e| panic!("{e}")))
            .plugin(
                PluginUnderTest::installed("dsh-sandbox-policy")
                    .unwrap_or_else(|e| panic!("{e}"))
                    .config(json!({ "mode": mode })),
            )
            .start()
            .unwrap_or_else(|e| panic!("{e}"))
    };
    let read_only = compose("read-only");
    let refused = read_only.call_tool("note", json!({ "text": "one" })).unwrap();
    let marker = dsh_sandbox::denial_marker(SandboxMode::ReadOnly);
    assert!(refused.is_error && refused.text.starts_with(&marker), "{}", refused.text);
    assert_eq!(refused.text.matches(&marker).count(), 1, "{}", refused.text);
    assert!(!read_only.session().cwd.join("NOTES.txt").exists());

    let writable = compose("workspace-write");
    let noted = writable.call_tool("note", json!({ "text": "two" })).unwrap();
    assert_eq!(noted, ToolResult::ok("noted under workspace-write"));
    let notes = std::fs::read_to_string(writable.session().cwd.join("NOTES.txt")).unwrap();
    assert_eq!(notes, "two\n");
}
