//! `dsh-tool-fs`: the model-facing file tools `read`, `write`, `edit` and `list` over the
//! `fs` service. Every call resolves the calling session's policy through `sandboxPolicy`
//! and passes it with each mutation, so the file tools and `bash` always agree on mode and
//! root. A fence denial becomes the shared denial marker; when the mounted backend is
//! confined, `write` and `edit` accept a one-call escalation that a person approves.
//! Reads never escalate.

use std::path::{Path, PathBuf};

use cordis_sdk::host::{ApprovalClient, APPROVAL};
use cordis_sdk::prelude::*;
use dsh_fs_api::{codes, EditText, FileSystem, FsClient, Kind, WriteText, FS};
use dsh_sandbox::{SandboxExecutionPolicy, SandboxMode, SandboxPolicyClient, SANDBOX_POLICY};
use dsh_tool_core::args::{EditArgs, ListArgs, ReadArgs, WriteArgs};
use dsh_tool_core::{
    denial, one_line, register, resolve_path, CallArgs, CallPolicy, Escalating, Step, Stop,
};

/// The config: none; the policy comes from `sandboxPolicy`.
#[derive(Deserialize, JsonSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct Config {}

const READ: &str = "Reads a UTF-8 text file. `offset` (1-based first line) and `limit` (number of lines) select a range of lines; without them the whole file is returned.";
const WRITE: &str = "Creates or replaces a text file with `content` (atomically; missing parent directories are created). Subject to the session's sandbox policy.";
const EDIT: &str = "Replaces `old_string` with `new_string` in an existing text file. `old_string` must occur exactly once unless `replace_all` is true. Subject to the session's sandbox policy.";
const LIST: &str = "Lists a directory, one entry per line, sorted by name: directories end in `/`, symbolic links in `@`.";

struct FsTools {
    fs: FsClient,
    calls: CallPolicy,
    escalating: Escalating,
}

impl FsTools {
    /// A backend error as the model's answer; a fence denial becomes the marker.
    fn fs_error(&self, e: Error, policy: Option<&SandboxExecutionPolicy>) -> Stop {
        if e.code == codes::FS_SANDBOX_DENIED {
            let mode = e
                .data
                .as_ref()
                .and_then(|d| d.get("mode"))
                .and_then(|m| m.as_str())
                .and_then(|m| m.parse::<SandboxMode>().ok())
                .or(policy.map(|p| p.mode));
            if let Some(mode) = mode {
                return Stop::Answer(denial(mode, self.escalating, &e.message));
            }
        }
        dsh_tool_core::backend_error(e)
    }

    fn read(&self, call: &CallContext, args: CallArgs<ReadArgs>) -> Step<ToolResult> {
        let ReadArgs {
            path,
            offset,
            limit,
        } = args.args;
        let path = resolve_path(&call.session.cwd, "path", &path)?;
        if offset == Some(0) {
            return Err(bad("`offset` counts lines from 1; pass 1 for the first line").into());
        }
        if limit == Some(0) {
            return Err(
                bad("`limit` must be at least 1 (or left out for the rest of the file)").into(),
            );
        }
        let text = self
            .fs
            .read_text(path.clone())
            .map_err(|e| self.fs_error(e, None))?;
        let lines: Vec<&str> = text.split_inclusive('\n').collect();
        let first = offset.unwrap_or(1);
        if first > 1 && first > lines.len() as u64 {
            return Err(bad(format!(
                "`offset` {first} is past the end of `{}`, which has {} lines",
                path.display(),
                lines.len()
            ))
            .into());
        }
        let skip = usize::try_from(first - 1).unwrap_or(usize::MAX);
        let take = limit
            .map(|l| usize::try_from(l).unwrap_or(usize::MAX))
            .unwrap_or(usize::MAX);
        Ok(ToolResult::ok(
            lines.into_iter().skip(skip).take(take).collect::<String>(),
        ))
    }

    fn write(&self, call: &CallContext, args: CallArgs<WriteArgs>) -> Step<ToolResult> {
        let WriteArgs { path, content } = args.args;
        let path = resolve_path(&call.session.cwd, "path", &path)?;
        let policy = self
            .calls
            .for_call("write", call, args.escalation.as_ref(), || {
                format!("write {} bytes to {}", content.len(), path.display())
            })?;
        let note = escalated_note(args.escalation.is_some(), &policy);
        let written = self
            .fs
            .write_text(WriteText {
                path: path.clone(),
                content,
                policy: Some(policy.clone()),
            })
            .map_err(|e| self.fs_error(e, Some(&policy)))?;
        let how = if written.created {
            "created"
        } else {
            "replaced"
        };
        Ok(ToolResult::ok(format!(
            "Wrote {} bytes to {} ({how}){note}",
            written.bytes,
            path.display()
        )))
    }

    fn edit(&self, call: &CallContext, args: CallArgs<EditArgs>) -> Step<ToolResult> {
        let EditArgs {
            path,
            old_string,
            new_string,
            replace_all,
        } = args.args;
        let replace_all = replace_all.unwrap_or(false);
        let path = resolve_path(&call.session.cwd, "path", &path)?;
        if old_string.is_empty() {
            return Err(bad("`old_string` is empty: pass the exact text to replace").into());
        }
        let policy = self
            .calls
            .for_call("edit", call, args.escalation.as_ref(), || {
                format!(
                    "edit {}: replace {} {:?} with {:?}",
                    path.display(),
                    if replace_all { "every" } else { "one" },
                    one_line(&old_string, 60),
                    one_line(&new_string, 60)
                )
            })?;
        let note = escalated_note(args.escalation.is_some(), &policy);
        let edited = self
            .fs
            .edit_text(EditText {
                path: path.clone(),
                old_string,
                new_string,
                replace_all,
                policy: Some(policy.clone()),
            })
            .map_err(|e| self.fs_error(e, Some(&policy)))?;
        let plural = if edited.replacements == 1 { "" } else { "s" };
        Ok(ToolResult::ok(format!(
            "Replaced {} occurrence{plural} in {}{note}",
            edited.replacements,
            path.display()
        )))
    }

    fn list(&self, call: &CallContext, args: CallArgs<ListArgs>) -> Step<ToolResult> {
        let path: PathBuf = resolve_path(&call.session.cwd, "path", &args.args.path)?;
        let entries = self
            .fs
            .list_dir(path.clone())
            .map_err(|e| self.fs_error(e, None))?;
        if entries.is_empty() {
            return Ok(ToolResult::ok(format!("{} is empty", display_dir(&path))));
        }
        let lines: Vec<String> = entries
            .into_iter()
            .map(|e| match e.kind {
                Kind::Dir => format!("{}/", e.name),
                Kind::Symlink => format!("{}@", e.name),
                Kind::File | Kind::Other => e.name,
            })
            .collect();
        Ok(ToolResult::ok(lines.join("\n")))
    }
}

fn bad(text: impl Into<String>) -> ToolResult {
    ToolResult::error(text)
}

fn display_dir(path: &Path) -> String {
    format!("the directory {}", path.display())
}

/// Tells the model a call ran under a mode granted for it alone.
fn escalated_note(escalated: bool, policy: &SandboxExecutionPolicy) -> String {
    if escalated {
        format!(
            " under `{}`, approved for this call only",
            policy.mode.as_str()
        )
    } else {
        String::new()
    }
}

/// The plugin.
pub struct ToolFsPlugin;

impl Plugin for ToolFsPlugin {
    type Config = Config;

    fn metadata() -> Metadata {
        Metadata::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION"))
            .description("the read, write, edit and list tools, under the session's sandbox policy")
            .injects::<FsClient>(FS)
            .injects::<SandboxPolicyClient>(SANDBOX_POLICY)
            .injects_optional::<ApprovalClient>(APPROVAL)
    }

    fn apply(ctx: &mut Context<'_>, _config: Config) -> Result<Self> {
        let fs: FsClient = ctx.inject(FS)?;
        let calls = CallPolicy {
            policy: ctx.inject(SANDBOX_POLICY)?,
            approval: ctx.inject_optional(APPROVAL)?,
        };
        let escalating = Escalating::from_backend(fs.sandbox_mode(())?);
        let tools = std::sync::Arc::new(FsTools {
            fs,
            calls,
            escalating,
        });
        let t = tools.clone();
        register(ctx, "read", READ, Escalating::NotOffered, move |c, a| {
            t.read(c, a)
        })?;
        let t = tools.clone();
        register(ctx, "write", WRITE, escalating, move |c, a| t.write(c, a))?;
        let t = tools.clone();
        register(ctx, "edit", EDIT, escalating, move |c, a| t.edit(c, a))?;
        let t = tools;
        register(ctx, "list", LIST, Escalating::NotOffered, move |c, a| {
            t.list(c, a)
        })?;
        tracing::debug!(?escalating, "file tools ready");
        Ok(ToolFsPlugin)
    }
}

cordis_sdk::export_plugin!(ToolFsPlugin);
