//! End-to-end tests of `cordis-test`, the plugin author's harness: real plugin libraries
//! driven through the engine alone, with stand-in services, and compositions of several
//! (the author's own plugins with the bundled `fs` and the real policy owner).

use cordis_e2e::workspace_root;
use cordis_example_api::{Greeter, GreeterClient};
use cordis_sdk::Result;
use cordis_test::{Composition, HarnessError, PluginUnderTest, ToolResult};
use serde_json::json;

struct StandIn;

impl Greeter for StandIn {
    fn greet(&self, name: String) -> Result<String> {
        Ok(format!("stand-in greets {name}"))
    }
}

cordis_sdk::interface! {
    /// The greeter interface at another version, for a mismatched stand-in.
    trait GreeterV2 as GreeterV2Client ("example.greeter", 2) {
        /// A greeting.
        fn greet(&self, name: String) -> String;
    }
}

impl GreeterV2 for StandIn {
    fn greet(&self, name: String) -> Result<String> {
        Ok(name)
    }
}

fn plugin(name: &str) -> PluginUnderTest {
    PluginUnderTest::load(cordis_e2e::library(name)).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn test_support_runs_the_example_plugin_and_its_service() {
    let started = plugin("cordis-example")
        .config(json!({ "word": "hi" }))
        .start()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(started.tools(), ["greet"]);
    assert_eq!(
        started
            .call_tool("greet", json!({ "name": "Ada" }))
            .unwrap(),
        ToolResult::ok("hi, Ada")
    );
    let greeter = started.service::<GreeterClient>("greeter").unwrap();
    assert_eq!(greeter.greet("Grace".into()).unwrap(), "hi, Grace");
    let err = greeter.greet(String::new()).unwrap_err();
    assert_eq!(err.code, "INVALID_ARGUMENT", "{err:?}");

    let unknown = started.call_tool("nope", json!({})).unwrap_err();
    assert_eq!(
        unknown.to_string(),
        "no tool `nope`; registered tools: greet"
    );
    let wrong = started.service::<GreeterV2Client>("greeter").err().unwrap();
    assert!(
        wrong.to_string().contains(
            "this plugin injects `greeter` as example.greeter v2, but the composition provides it as example.greeter v1; interface versions must match exactly"
        ),
        "{wrong}"
    );
}

#[test]
fn test_support_injects_a_stand_in_service() {
    let started = plugin("fixture-greeter-consumer")
        .stand_in("greeter", GreeterClient::serve(StandIn))
        .start()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        started
            .call_tool("greet-via-service", json!({ "name": "Ada" }))
            .unwrap(),
        ToolResult::ok("stand-in greets Ada")
    );
    assert_eq!(
        started.inspect(|registry| registry.missing_optional.clone()),
        [(
            "fixture-greeter-consumer".to_string(),
            "greeter-backup".to_string()
        )]
    );
}

#[test]
fn test_support_refuses_what_cordis_check_refuses() {
    let check = |outcome: std::result::Result<cordis_test::Started, HarnessError>,
                 needles: &[&str]| {
        let err = outcome.expect_err("must be refused").to_string();
        for n in needles {
            assert!(err.contains(n), "lacks {n:?}: {err}");
        }
    };
    check(
        plugin("fixture-greeter-consumer").start(),
        &[
            "plugin `fixture-greeter-consumer`: it requires service `greeter` (example.greeter v1)",
            ".stand_in(\"greeter\", Client::serve(...))",
        ],
    );
    check(
        plugin("fixture-greeter-consumer")
            .stand_in("greeter", GreeterV2Client::serve(StandIn))
            .start(),
        &["injects `greeter` as example.greeter v1, but the stand-in provides it as example.greeter v2"],
    );
    check(
        plugin("cordis-example")
            .config(json!({ "wrod": "hi" }))
            .start(),
        &["plugin `cordis-example` refuses the config", "wrod"],
    );
    let err = PluginUnderTest::load(workspace_root().join("Cargo.toml")).unwrap_err();
    assert!(
        err.to_string().starts_with("cannot load plugin library"),
        "{err}"
    );
    let err = PluginUnderTest::build(workspace_root().join("no-such-crate")).unwrap_err();
    assert!(
        err.to_string().contains("there is no Cargo.toml in it"),
        "{err}"
    );
}

/// The bundled tool set's file half with the real policy owner in `mode`, and the
/// example's greeter provider behind the fixture's greeting tool: two chains, each a tool
/// plugin, a provider plugin and what they inject; added consumers first, so the plan
/// must order them.
fn chain(mode: &str, workspace: &std::path::Path) -> Composition {
    Composition::new()
        .plugin(plugin("fixture-greeter-consumer"))
        .plugin(plugin("cordis-example").config(json!({ "word": "hello" })))
        .plugin(plugin("dsh-tool-fs"))
        .plugin(plugin("dsh-fs-sandbox"))
        .plugin(plugin("dsh-sandbox-policy").config(json!({
            "mode": mode,
            "workspaceRoot": workspace.display().to_string(),
        })))
        .cwd(workspace)
}

/// `text` begins with the denial marker of `mode` and holds it once.
fn assert_denied_once(result: &ToolResult, mode: dsh_sandbox::SandboxMode) {
    let marker = dsh_sandbox::denial_marker(mode);
    assert!(result.is_error, "{}", result.text);
    assert!(result.text.starts_with(&marker), "{}", result.text);
    assert_eq!(result.text.matches(&marker).count(), 1, "{}", result.text);
}

#[test]
fn a_composition_calls_through_tool_provider_and_the_real_fs_under_the_real_policy_owner() {
    let workspace = tempfile::tempdir().unwrap();
    let workspace = workspace.path().canonicalize().unwrap();
    let outside = cordis_e2e::Outside::new("harness");
    let started = chain("workspace-write", &workspace)
        .start()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        started.tools(),
        [
            "edit",
            "greet",
            "greet-via-service",
            "list",
            "read",
            "write"
        ]
    );
    assert_eq!(
        started
            .call_tool("greet-via-service", json!({ "name": "Ada" }))
            .unwrap(),
        ToolResult::ok("hello, Ada")
    );

    let written = started
        .call_tool("write", json!({ "path": "notes.txt", "content": "one\n" }))
        .unwrap();
    assert!(!written.is_error, "{}", written.text);
    assert_eq!(
        std::fs::read_to_string(workspace.join("notes.txt")).unwrap(),
        "one\n"
    );

    let before = outside.snapshot();
    for path in [
        outside.victim(),
        outside.dir.join("fresh.txt"),
        // Relative to the session's directory, up to `/` and down again.
        std::path::PathBuf::from("../".repeat(workspace.components().count()))
            .join(outside.dir.strip_prefix("/").unwrap())
            .join("victim.txt"),
    ] {
        let refused = started
            .call_tool(
                "write",
                json!({ "path": path.display().to_string(), "content": "pwned\n" }),
            )
            .unwrap();
        assert_denied_once(&refused, dsh_sandbox::SandboxMode::WorkspaceWrite);
        assert!(
            refused.text.contains("outside the writable roots"),
            "{}",
            refused.text
        );
    }
    assert_eq!(outside.snapshot(), before);
}

#[test]
fn a_composition_under_read_only_refuses_every_write_with_the_marker_once() {
    let workspace = tempfile::tempdir().unwrap();
    let workspace = workspace.path().canonicalize().unwrap();
    std::fs::write(workspace.join("kept.txt"), "kept\n").unwrap();
    let started = chain("read-only", &workspace)
        .start()
        .unwrap_or_else(|e| panic!("{e}"));
    let read = started
        .call_tool("read", json!({ "path": "kept.txt" }))
        .unwrap();
    assert!(
        !read.is_error && read.text.contains("kept"),
        "{}",
        read.text
    );
    for (tool, args) in [
        (
            "write",
            json!({ "path": "kept.txt", "content": "changed\n" }),
        ),
        ("write", json!({ "path": "new.txt", "content": "new\n" })),
        (
            "edit",
            json!({ "path": "kept.txt", "old_string": "kept", "new_string": "gone" }),
        ),
    ] {
        let refused = started.call_tool(tool, args).unwrap();
        assert_denied_once(&refused, dsh_sandbox::SandboxMode::ReadOnly);
    }
    assert_eq!(
        std::fs::read_to_string(workspace.join("kept.txt")).unwrap(),
        "kept\n"
    );
    assert!(!workspace.join("new.txt").exists());
}

#[test]
fn a_composition_that_cordis_check_would_refuse_is_refused_with_every_problem() {
    let workspace = tempfile::tempdir().unwrap();
    // No policy owner: `dsh-fs-sandbox` and `dsh-tool-fs` inject `sandboxPolicy`; and two
    // providers of `greeter`.
    let err = Composition::new()
        .plugin(plugin("dsh-tool-fs"))
        .plugin(plugin("dsh-fs-sandbox"))
        .plugin(plugin("cordis-example"))
        .plugin(plugin("cordis-example").id("second-greeter"))
        .cwd(workspace.path())
        .start()
        .expect_err("the composition is invalid");
    assert!(matches!(err, HarnessError::Composition(_)), "{err:?}");
    let err = err.to_string();
    for needle in [
        "the test's composition is refused",
        "`sandboxPolicy`",
        "`greeter`",
        "second-greeter",
    ] {
        assert!(err.contains(needle), "lacks {needle:?}: {err}");
    }

    // A stand-in serves what no entry provides, for every entry that injects it; a
    // stand-in and an entry providing the same name are two providers.
    let started = Composition::new()
        .plugin(plugin("fixture-greeter-consumer"))
        .stand_in("greeter", GreeterClient::serve(StandIn))
        .start()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        started
            .call_tool("greet-via-service", json!({ "name": "Ada" }))
            .unwrap(),
        ToolResult::ok("stand-in greets Ada")
    );
    drop(started);
    let err = Composition::new()
        .plugin(plugin("cordis-example"))
        .stand_in("greeter", GreeterClient::serve(StandIn))
        .start()
        .expect_err("two providers of greeter")
        .to_string();
    assert!(
        err.contains("`greeter`") && err.contains("drop a stand-in an entry provides"),
        "{err}"
    );
}
