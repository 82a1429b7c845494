//! `outside-notes`: a plugin written outside the cordis repository (the end-to-end test
//! `an_outside_plugin_uses_the_interface_crates_and_their_stand_ins` copies this file over
//! the `src/lib.rs` of a crate `cordis new` made). It injects `fs` and `sandboxPolicy`
//! through their interface crates and registers the `note` tool: append a line to
//! `NOTES.txt` in the calling session's directory, under that session's policy.

use cordis_sdk::prelude::*;
use dsh_fs_api::{FileSystem, FsClient, WriteText, FS};
use dsh_sandbox::{ResolveArgs, SandboxPolicy, SandboxPolicyClient, SANDBOX_POLICY};

/// The config (none).
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Config {}

/// The plugin.
pub struct Notes;

impl Plugin for Notes {
    type Config = Config;

    fn metadata() -> Metadata {
        Metadata::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION"))
            .description("keeps notes in the session's directory")
            .injects::<FsClient>(FS)
            .injects::<SandboxPolicyClient>(SANDBOX_POLICY)
            .tool("note")
    }

    fn apply(ctx: &mut Context<'_>, _config: Config) -> Result<Self> {
        let fs: FsClient = ctx.inject(FS)?;
        let policy: SandboxPolicyClient = ctx.inject(SANDBOX_POLICY)?;
        ctx.register_tool(
            Tool {
                name: "note".into(),
                description: "Appends a line to NOTES.txt in the session's directory".into(),
                input_schema: serde_json::json!({
                    "type": "object",
                    "properties": { "text": { "type": "string" } },
                    "required": ["text"],
                    "additionalProperties": false,
                }),
            },
            move |call, args| {
                let text = args.get("text").and_then(|t| t.as_str()).unwrap_or_default();
                // The rule of the `sandboxPolicy` interface: resolve the calling session's
                // policy on every call, and hand it to the `fs` mutation.
                let resolved = policy.resolve(ResolveArgs {
                    session: Some(call.session.id.clone()),
                    mode: None,
                })?;
                let path = call.session.cwd.join("NOTES.txt");
                let before = fs.read_text(path.clone()).unwrap_or_default();
                let written = fs.write_text(WriteText {
                    path,
                    content: format!("{before}{text}\n"),
                    policy: Some(resolved.clone()),
                });
                match written {
                    Ok(_) => Ok(ToolResult::ok(format!("noted under {}", resolved.mode))),
                    Err(e) => Ok(ToolResult::error(e.message)),
                }
            },
        )?;
        Ok(Notes)
    }
}

cordis_sdk::export_plugin!(Notes);
