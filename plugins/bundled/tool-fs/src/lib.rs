//! `dsh-tool-fs`: the model-facing file tools `read`, `write`, `edit` and `list` over the
//! `fs` service. Every call resolves the calling session's policy through `sandboxPolicy`
//! and passes it with each mutation, so the file tools and `bash` always agree on mode and
//! root. A fence denial becomes the shared denial marker; when the mounted backend is
//! confined, `write` and `edit` accept a one-call escalation that a person approves.
//! Reads never escalate, and a `read` returns at most one page: the caps of [`Config`]
//! bound it, and a final note says where to continue.

use std::num::NonZeroU64;
use std::path::{Path, PathBuf};

use cordis_sdk::host::{ApprovalClient, APPROVAL};
use cordis_sdk::prelude::*;
use dsh_fs_api::{
    codes, line_cut_marker, Cut, EditText, FileSystem, FsClient, Kind, Lines, ListDir, ReadCaps,
    ReadLines, WriteText, FS,
};
use dsh_sandbox::{
    Fence, SandboxExecutionPolicy, SandboxMode, SandboxPolicyClient, SANDBOX_POLICY,
};
use dsh_tool_core::args::{EditArgs, ListArgs, ReadArgs, WriteArgs};
use dsh_tool_core::{
    denial, head_and_tail, register, resolve_path, unified_diff, CallArgs, CallPolicy, Described,
    Escalating, Step, Stop, DETAIL_MAX_BYTES,
};

/// The config under `config:` in `cordis.yml`: the caps of one `read` (the policy comes
/// from `sandboxPolicy`).
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    /// Integer ≥ 1; default 2000. The most lines one `read` returns; a longer file is read
    /// in pages with `offset`.
    #[serde(default = "default_read_max_lines")]
    pub read_max_lines: NonZeroU64,
    /// Integer ≥ 1; default 262144 (256 KiB). The most bytes of text one `read` returns
    /// (the first line of a page always comes, cut to this size).
    #[serde(default = "default_read_max_bytes")]
    pub read_max_bytes: NonZeroU64,
    /// Integer ≥ 1; default 4096. The most bytes of one line a `read` returns; a longer
    /// line is cut there and marked with its length.
    #[serde(default = "default_read_max_line_bytes")]
    pub read_max_line_bytes: NonZeroU64,
    /// Integer ≥ 1; default 2000. The most entries one `list` returns (the first by name);
    /// a note gives the directory's total.
    #[serde(default = "default_list_max_entries")]
    pub list_max_entries: NonZeroU64,
}

fn default_list_max_entries() -> NonZeroU64 {
    const ENTRIES: NonZeroU64 = NonZeroU64::new(2000).unwrap();
    ENTRIES
}

fn default_read_max_lines() -> NonZeroU64 {
    const LINES: NonZeroU64 = NonZeroU64::new(2000).unwrap();
    LINES
}

fn default_read_max_bytes() -> NonZeroU64 {
    const BYTES: NonZeroU64 = NonZeroU64::new(256 * 1024).unwrap();
    BYTES
}

fn default_read_max_line_bytes() -> NonZeroU64 {
    const LINE_BYTES: NonZeroU64 = NonZeroU64::new(4096).unwrap();
    LINE_BYTES
}

impl Config {
    fn read_caps(&self) -> ReadCaps {
        ReadCaps {
            max_lines: self.read_max_lines.get(),
            max_bytes: self.read_max_bytes.get(),
            max_line_bytes: self.read_max_line_bytes.get(),
        }
    }
}

/// The `read` tool's description under `caps`.
fn read_description(caps: ReadCaps) -> String {
    format!(
        "Reads a UTF-8 text file: at most {} lines and {} bytes per call, lines longer than {} bytes cut. `offset` (1-based first line) and `limit` (number of lines) select a range of lines; when a file goes on past the caps, a final note gives the `offset` to continue from. Binary files, directories, FIFOs, sockets and devices are refused.",
        caps.max_lines, caps.max_bytes, caps.max_line_bytes
    )
}
const WRITE: &str = "Creates or replaces a text file with `content` (atomically; missing parent directories are created). Subject to the session's sandbox policy.";
const EDIT: &str = "Replaces `old_string` with `new_string` in an existing text file. `old_string` must occur exactly once unless `replace_all` is true. Subject to the session's sandbox policy.";
const LIST: &str = "Lists a directory, one entry per line, sorted by name: directories end in `/`, symbolic links in `@`. A very large directory is cut at a cap, with a note giving its total.";

struct FsTools {
    fs: FsClient,
    calls: CallPolicy,
    escalating: Escalating,
    read_caps: ReadCaps,
    list_max_entries: u64,
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

    /// For an approval: says so when `path` is protected under `policy`.
    fn protected_note(&self, policy: &SandboxExecutionPolicy, path: &Path) -> String {
        let canonical = self
            .fs
            .resolve(path.to_path_buf())
            .unwrap_or(path.to_path_buf());
        match Fence::of(policy).map(|f| f.protected.covering(&canonical)) {
            Ok(Some(rule)) => format!(
                " — PROTECTED: `{rule}` defines the running composition or the policy protects it"
            ),
            Ok(None) => String::new(),
            // The call itself is refused for the same reason when it runs.
            Err(moved) => format!(" — REFUSED: {moved}"),
        }
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
                bad("`limit` must be at least 1 (or left out to read up to the caps)").into(),
            );
        }
        let first = offset.unwrap_or(1);
        let policy = self
            .calls
            .for_call("read", call, None, |_| Described::default())?;
        let lines = self
            .fs
            .read_lines(ReadLines {
                path: path.clone(),
                offset: first,
                limit,
                caps: self.read_caps,
                policy: Some(policy.clone()),
            })
            .map_err(|e| self.fs_error(e, Some(&policy)))?;
        if lines.count == 0 && first > 1 {
            return Err(bad(format!(
                "`offset` {first} is past the end of `{}`, which has {} lines",
                path.display(),
                lines.total.unwrap_or(first - 1)
            ))
            .into());
        }
        Ok(ToolResult::ok(page_text(
            lines,
            first,
            &path,
            self.read_caps,
        )))
    }

    fn write(&self, call: &CallContext, args: CallArgs<WriteArgs>) -> Step<ToolResult> {
        let WriteArgs { path, content } = args.args;
        let path = resolve_path(&call.session.cwd, "path", &path)?;
        let policy = self
            .calls
            .for_call("write", call, args.escalation.as_ref(), |policy| {
                Described {
                    summary: format!(
                        "write {} bytes to {}{}",
                        content.len(),
                        path.display(),
                        self.protected_note(policy, &path)
                    ),
                    detail: match self.fs.read_text(path.clone()) {
                        Ok(old) => unified_diff(&path, &old, &content),
                        Err(e) if e.code == codes::FS_NOT_FOUND => format!(
                            "new file, content:\n{}",
                            head_and_tail(&content, DETAIL_MAX_BYTES)
                        ),
                        Err(e) => format!(
                            "the current file cannot be shown ({}); new content:\n{}",
                            e.message,
                            head_and_tail(&content, DETAIL_MAX_BYTES)
                        ),
                    },
                }
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
            .for_call("edit", call, args.escalation.as_ref(), |policy| Described {
                summary: format!(
                    "edit {}: replace {} occurrence{}",
                    path.display(),
                    if replace_all { "every" } else { "one" },
                    self.protected_note(policy, &path)
                ),
                detail: match self.fs.read_text(path.clone()) {
                    Ok(old) if old.contains(&old_string) => {
                        let new = if replace_all {
                            old.replace(&old_string, &new_string)
                        } else {
                            old.replacen(&old_string, &new_string, 1)
                        };
                        unified_diff(&path, &old, &new)
                    }
                    _ => head_and_tail(
                        &format!("replace:\n{old_string}\nwith:\n{new_string}"),
                        DETAIL_MAX_BYTES,
                    ),
                },
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
        let policy = self
            .calls
            .for_call("list", call, None, |_| Described::default())?;
        let listing = self
            .fs
            .list_dir(ListDir {
                path: path.clone(),
                max_entries: self.list_max_entries,
                policy: Some(policy.clone()),
            })
            .map_err(|e| self.fs_error(e, Some(&policy)))?;
        if listing.entries.is_empty() {
            return Ok(ToolResult::ok(format!("{} is empty", display_dir(&path))));
        }
        let shown = listing.entries.len();
        let mut lines: Vec<String> = listing
            .entries
            .into_iter()
            .map(|e| match e.kind {
                Kind::Dir => format!("{}/", e.name),
                Kind::Symlink => format!("{}@", e.name),
                Kind::File | Kind::Other => e.name,
            })
            .collect();
        if listing.total > shown as u64 {
            lines.push(format!(
                "[Cut at the {}-entry list cap: the first {shown} of {} entries by name shown. To see the rest, list a subdirectory, or use `bash`, e.g. `ls -A '{}' | sed -n '{},{}p'`.]",
                self.list_max_entries,
                listing.total,
                path.display(),
                shown + 1,
                shown * 2
            ));
        }
        Ok(ToolResult::ok(lines.join("\n")))
    }
}

/// A page of `read` as the model sees it: the lines, then a note for each cap that cut
/// something, saying how to see the rest.
fn page_text(lines: Lines, first: u64, path: &Path, caps: ReadCaps) -> String {
    let Lines {
        mut text,
        count,
        size,
        cut,
        long_lines,
        ..
    } = lines;
    let mut notes = Vec::new();
    // A line is cut at the smaller of the two byte caps.
    let line_cap = caps.max_line_bytes.min(caps.max_bytes);
    if let Some(&line) = long_lines.first() {
        let which = match long_lines.len() {
            1 => format!("Line {line} is"),
            n => format!("{n} lines are"),
        };
        notes.push(format!(
            "[{which} longer than {} bytes: cut there and marked `{}`. To see a whole line, use `bash`, e.g. `sed -n '{line}p' '{}' | fold -w {}`.]",
            line_cap,
            line_cut_marker("<length>").trim_start(),
            path.display(),
            line_cap
        ));
    }
    // A cut page holds at least one line: the first always fits, and a first line that
    // is binary fails the read instead.
    let next = first + count;
    let shown = match count {
        1 => format!("line {first} shown"),
        _ => format!("lines {first}-{} shown", next - 1),
    };
    let capped = |cap: String| {
        let size = if size > 0 {
            format!(" ({size} bytes)")
        } else {
            String::new()
        };
        format!(
            "[Cut at the {cap} read cap: {shown}; the file{size} goes on. To continue, call read with offset {next}.]"
        )
    };
    match cut {
        Some(Cut::MaxLines) => notes.push(capped(format!("{}-line", caps.max_lines))),
        Some(Cut::MaxBytes) => notes.push(capped(format!("{}-byte", caps.max_bytes))),
        Some(Cut::Binary { what, at }) => notes.push(format!(
            "[Stopped before line {next}: it holds binary content ({what} at byte {at}), which is not shown; {shown}. To inspect it, use `bash`, e.g. `xxd -s {at} -l 256 '{}'`.]",
            path.display()
        )),
        None => {}
    }
    if !notes.is_empty() {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&notes.join("\n"));
    }
    text
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
            .tool("read")
            .tool("write")
            .tool("edit")
            .tool("list")
    }

    fn apply(ctx: &mut Context<'_>, config: Config) -> Result<Self> {
        let fs: FsClient = ctx.inject(FS)?;
        let read_caps = config.read_caps();
        let calls = CallPolicy {
            policy: ctx.inject(SANDBOX_POLICY)?,
            approval: ctx.inject_optional(APPROVAL)?,
        };
        let escalating = Escalating::from_backend(fs.sandbox_mode(())?);
        let tools = std::sync::Arc::new(FsTools {
            fs,
            calls,
            escalating,
            read_caps,
            list_max_entries: config.list_max_entries.get(),
        });
        let t = tools.clone();
        let read = read_description(read_caps);
        let reads = |title: &str| {
            ToolOptions::annotated(
                ToolAnnotations::titled(title)
                    .read_only(true)
                    .idempotent(true)
                    .open_world(false),
            )
        };
        let writes = |title: &str, idempotent: bool| {
            ToolOptions::annotated(
                ToolAnnotations::titled(title)
                    .read_only(false)
                    .destructive(true)
                    .idempotent(idempotent)
                    .open_world(false),
            )
        };
        register(
            ctx,
            "read",
            &read,
            Escalating::NotOffered,
            reads("Read file"),
            move |c, a| t.read(c, a),
        )?;
        let t = tools.clone();
        register(
            ctx,
            "write",
            WRITE,
            escalating,
            writes("Write file", true),
            move |c, a| t.write(c, a),
        )?;
        let t = tools.clone();
        register(
            ctx,
            "edit",
            EDIT,
            escalating,
            writes("Edit file", false),
            move |c, a| t.edit(c, a),
        )?;
        let t = tools;
        register(
            ctx,
            "list",
            LIST,
            Escalating::NotOffered,
            reads("List directory"),
            move |c, a| t.list(c, a),
        )?;
        tracing::debug!(?escalating, ?read_caps, "file tools ready");
        Ok(ToolFsPlugin)
    }
}

cordis_sdk::export_plugin!(ToolFsPlugin);
