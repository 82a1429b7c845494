//! The outside plugin's own tests: `cordis-test` with the stand-ins the interface crates
//! ship (feature `testing`), one line each.

use cordis_test::{PluginUnderTest, ToolResult};
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
