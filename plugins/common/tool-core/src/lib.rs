//! The mechanics `dsh-tool-fs` and `dsh-tool-bash` share, in one place so the two tool
//! families cannot drift: decoding a model's arguments into a typed struct with errors the
//! model can act on ([`decode`]), building each tool's input schema with the escalation
//! fields when the backend is confined ([`input_schema`]), resolving a model's path against
//! the session ([`resolve_path`]), the per-call policy with the fail-closed escalation flow
//! ([`CallPolicy`]), the model-facing denial text ([`denial`]), and the bundled tools'
//! argument types ([`args`]).
//!
//! A model's mistake never becomes an `Err`: every function here that judges model input
//! returns a [`ToolResult`] error instead.

pub mod args;

use std::path::{Path, PathBuf};

use cordis_sdk::host::{Approval, ApprovalClient, ApprovalOutcome, ApprovalRequest};
use cordis_sdk::prelude::*;
use dsh_sandbox::{
    approve_escalation, denial_marker, escalation_hint, escalation_params, ApproverDecision,
    Escalation, EscalationApprover, EscalationAsk, EscalationParams, ResolveArgs,
    SandboxExecutionPolicy, SandboxMode, SandboxPolicy, SandboxPolicyClient, Shared,
    JUSTIFICATION_PARAM, PERMISSIONS_PARAM, SANDBOX_MODES,
};
use serde::de::DeserializeOwned;
use serde_json::{json, Map, Value};

/// A tool's decoded arguments, or the error result to return to the model.
pub type Decoded<T> = std::result::Result<T, ToolResult>;

/// Why a tool call stops before its normal answer.
#[derive(Debug)]
pub enum Stop {
    /// An answer for the model (bad input, a denial, a refused escalation): an error result.
    Answer(ToolResult),
    /// The tool itself could not work (a service it needs failed): an `Err` for the host.
    Failed(Error),
}

impl From<ToolResult> for Stop {
    fn from(r: ToolResult) -> Self {
        Stop::Answer(r)
    }
}

impl From<Error> for Stop {
    fn from(e: Error) -> Self {
        Stop::Failed(e)
    }
}

/// One step of a tool call: `?` stops the call with an answer or a failure.
pub type Step<T> = std::result::Result<T, Stop>;

/// Registers tool `name` whose arguments decode into `T`: the input schema comes from `T`
/// (plus the escalation fields when offered), a decoding error becomes an error result, and
/// `run` gets the decoded arguments; `options` are its annotations and output schema.
pub fn register<T, F>(
    ctx: &mut Context<'_>,
    name: &'static str,
    description: &str,
    escalating: Escalating,
    options: ToolOptions,
    run: F,
) -> Result<()>
where
    T: DeserializeOwned + JsonSchema,
    F: Fn(&CallContext, CallArgs<T>) -> Step<ToolResult> + Send + Sync + 'static,
{
    let tool = Tool {
        name: name.to_string(),
        description: description.to_string(),
        input_schema: input_schema::<T>(escalating),
    };
    ctx.register_tool_with(tool, options, move |call, args| {
        let outcome = decode::<T>(name, args, escalating)
            .map_err(Stop::from)
            .and_then(|args| run(call, args));
        match outcome {
            Ok(result) | Err(Stop::Answer(result)) => Ok(result),
            Err(Stop::Failed(e)) => Err(e),
        }
    })
}

/// How a tool handles escalation: offered only when its backend reports a confined mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Escalating {
    /// The backend is confined: `sandbox_permissions` + `justification` are accepted.
    Offered,
    /// No confined backend (or a tool that never escalates): the fields are unknown.
    NotOffered,
}

impl Escalating {
    /// From a backend's capability fact (`sandbox_mode()`).
    pub fn from_backend(mode: Option<SandboxMode>) -> Self {
        match mode {
            Some(_) => Escalating::Offered,
            None => Escalating::NotOffered,
        }
    }
}

/// A tool call's arguments: the tool's own fields plus, when offered, an escalation request.
#[derive(Debug)]
pub struct CallArgs<T> {
    /// The tool's own arguments.
    pub args: T,
    /// `sandbox_permissions` + `justification`, when the call carried both.
    pub escalation: Option<EscalationParams>,
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn invalid(tool: &str, what: impl std::fmt::Display) -> ToolResult {
    ToolResult::error(format!(
        "`{tool}`: invalid arguments: {what}. See the tool's input schema for the expected fields."
    ))
}

/// Decodes a call's JSON arguments into `T` (a struct with `deny_unknown_fields`). When
/// escalation is offered, the two escalation fields are taken out first and checked as a
/// pair; otherwise they are unknown fields like any other.
pub fn decode<T: DeserializeOwned>(
    tool: &str,
    args: Value,
    escalating: Escalating,
) -> Decoded<CallArgs<T>> {
    let mut map: Map<String, Value> = match args {
        Value::Object(map) => map,
        other => {
            return Err(invalid(
                tool,
                format!(
                    "the arguments must be a JSON object, got {}",
                    kind_of(&other)
                ),
            ))
        }
    };
    let escalation = match escalating {
        Escalating::NotOffered => None,
        Escalating::Offered => {
            let mut pair = Map::new();
            for field in [PERMISSIONS_PARAM, JUSTIFICATION_PARAM] {
                if let Some(v) = map.remove(field) {
                    pair.insert(field.to_string(), v);
                }
            }
            escalation_params(&Value::Object(pair)).map_err(|e| invalid(tool, e))?
        }
    };
    let args = serde_json::from_value(Value::Object(map)).map_err(|e| invalid(tool, e))?;
    Ok(CallArgs { args, escalation })
}

/// The input schema of a tool whose arguments are `T`, with the escalation fields added
/// when offered (both or neither: each requires the other).
pub fn input_schema<T: JsonSchema>(escalating: Escalating) -> Value {
    let mut schema = cordis_sdk::input_schema_of::<T>();
    if let Some(obj) = schema.as_object_mut() {
        if escalating == Escalating::Offered {
            let modes: Vec<&str> = SANDBOX_MODES.iter().map(|m| m.as_str()).collect();
            let props = obj
                .entry("properties")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Some(props) = props.as_object_mut() {
                props.insert(
                    PERMISSIONS_PARAM.into(),
                    json!({
                        "type": "string",
                        "enum": modes,
                        "description": "Only after a sandbox denial: the wider sandbox mode this one call needs. A person is asked to approve it; pass it together with `justification`.",
                    }),
                );
                props.insert(
                    JUSTIFICATION_PARAM.into(),
                    json!({
                        "type": "string",
                        "minLength": 1,
                        "description": "One sentence, shown to the person asked, on why this call needs the wider mode; pass it together with `sandbox_permissions`.",
                    }),
                );
            }
            obj.insert(
                "dependentRequired".into(),
                json!({
                    (PERMISSIONS_PARAM): [JUSTIFICATION_PARAM],
                    (JUSTIFICATION_PARAM): [PERMISSIONS_PARAM],
                }),
            );
        }
    }
    schema
}

/// Resolves a model's path: relative paths against the session cwd, absolute paths as
/// given. `field` names the argument in the error.
pub fn resolve_path(cwd: &Path, field: &str, raw: &str) -> Decoded<PathBuf> {
    if raw.trim().is_empty() {
        return Err(ToolResult::error(format!(
            "`{field}` is empty: pass a file path, relative to the session directory `{}` or absolute",
            cwd.display()
        )));
    }
    if raw.contains('\0') {
        return Err(ToolResult::error(format!(
            "`{field}` contains a NUL character; file names cannot contain it"
        )));
    }
    let path = Path::new(raw);
    Ok(if path.is_absolute() {
        path.to_path_buf()
    } else {
        cwd.join(path)
    })
}

/// What an escalating call would do, for the person asked to approve it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Described {
    /// One line (the approver escapes what could break it).
    pub summary: String,
    /// The whole request: the full command, the diff or content of a change. Never cut
    /// below [`DETAIL_MAX_BYTES`].
    pub detail: String,
}

/// The most bytes of a change an approval shows whole; a larger one shows its first
/// and last parts and says how much lies between.
pub const DETAIL_MAX_BYTES: usize = 24 * 1024;

/// `text` whole when it fits in `max` bytes; else its first two thirds and last third of
/// `max`, cut at character boundaries, with the size of what lies between.
pub fn head_and_tail(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let floor = |mut i: usize| {
        while !text.is_char_boundary(i) {
            i -= 1;
        }
        i
    };
    let head = floor(max * 2 / 3);
    let tail = floor(text.len() - max / 3);
    format!(
        "{}\n[… {} of {} bytes not shown …]\n{}",
        &text[..head],
        tail - head,
        text.len(),
        &text[tail..]
    )
}

/// A unified diff from `old` to `new` of the file `path` (capped as [`head_and_tail`]).
pub fn unified_diff(path: &Path, old: &str, new: &str) -> String {
    let name = path.display().to_string();
    let diff = similar::TextDiff::from_lines(old, new)
        .unified_diff()
        .context_radius(3)
        .header(&name, &name)
        .to_string();
    head_and_tail(&diff, DETAIL_MAX_BYTES)
}

/// Collapses `text` to one line of at most `max` characters (for short labels).
pub fn one_line(text: &str, max: usize) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() <= max {
        return flat;
    }
    let cut: String = flat.chars().take(max.saturating_sub(1)).collect();
    format!("{cut}…")
}

/// Adapts the host's `approval` service to the minimal approver `dsh-sandbox` asks.
struct ApprovalAdapter<'a> {
    client: &'a ApprovalClient,
    call: &'a CallContext,
}

impl EscalationApprover for ApprovalAdapter<'_> {
    fn approve(&self, ask: &EscalationAsk<'_>) -> ApproverDecision {
        let request = ApprovalRequest {
            session: self.call.session.id.clone(),
            call_id: self.call.call_id.clone(),
            tool: ask.tool.to_string(),
            summary: format!(
                "{} (sandbox: {} → {}, this call only)",
                ask.summary, ask.current, ask.requested
            ),
            detail: ask.detail.to_string(),
            justification: ask.justification.to_string(),
            mode: Some(ask.requested.as_str().to_string()),
        };
        match self.client.request(request) {
            Ok(ApprovalOutcome::Approved) => ApproverDecision::Approved,
            Ok(ApprovalOutcome::Rejected) => ApproverDecision::Rejected,
            Ok(ApprovalOutcome::Cancelled) => ApproverDecision::Cancelled,
            Ok(ApprovalOutcome::Unavailable) => ApproverDecision::Unavailable,
            Err(e) => {
                tracing::warn!(call = %self.call.call_id, "the approval service failed: {e}");
                ApproverDecision::Unavailable
            }
        }
    }
}

/// The services a tool needs to decide the policy of one call.
#[derive(Clone)]
pub struct CallPolicy {
    /// The policy owner.
    pub policy: SandboxPolicyClient,
    /// The host's approval service, when composed.
    pub approval: Option<ApprovalClient>,
}

impl CallPolicy {
    /// The policy `call` runs under, resolved fresh for the calling session. With an
    /// escalation request, the approval flow runs first: a grant resolves the same session
    /// with the granted mode (same root, no session event); anything else is the fixed
    /// fail-closed text as an error result. `describe` says what the call would do under
    /// the session's policy.
    pub fn for_call(
        &self,
        tool: &str,
        call: &CallContext,
        escalation: Option<&EscalationParams>,
        describe: impl FnOnce(&SandboxExecutionPolicy) -> Described,
    ) -> Step<Shared<SandboxExecutionPolicy>> {
        let session = self.resolve(call, None)?;
        let Some(escalation) = escalation else {
            return Ok(session);
        };
        let described = describe(&session);
        let ask = EscalationAsk {
            tool,
            current: session.mode,
            requested: escalation.mode,
            justification: &escalation.justification,
            summary: &described.summary,
            detail: &described.detail,
        };
        let adapter = self
            .approval
            .as_ref()
            .map(|client| ApprovalAdapter { client, call });
        let approver = adapter.as_ref().map(|a| a as &dyn EscalationApprover);
        match approve_escalation(approver, &ask) {
            Escalation::Granted(mode) => {
                tracing::info!(call = %call.call_id, tool, %mode, "escalation granted for one call");
                Ok(self.resolve(call, Some(mode))?)
            }
            Escalation::Refused { reason, text } => {
                tracing::info!(call = %call.call_id, tool, reason, "escalation refused");
                Err(Stop::Answer(ToolResult::error(text)))
            }
        }
    }

    fn resolve(
        &self,
        call: &CallContext,
        mode: Option<SandboxMode>,
    ) -> Result<Shared<SandboxExecutionPolicy>> {
        self.policy
            .resolve(ResolveArgs {
                session: Some(call.session.id.clone()),
                mode,
            })
            .map_err(|e| {
                Error::new(
                    e.code.clone(),
                    format!(
                        "cannot resolve the sandbox policy of session `{}`: {}",
                        call.session.id, e.message
                    ),
                )
                .with_help(
                    e.help.clone().unwrap_or_else(|| {
                        "check the `dsh-sandbox-policy` entry in cordis.yml".into()
                    }),
                )
            })
    }
}

/// The model-facing denial: the verbatim marker, the retry hint when escalation is offered
/// (and a wider mode exists), then `detail` (the backend's explanation or the raw output).
pub fn denial(mode: SandboxMode, escalating: Escalating, detail: &str) -> ToolResult {
    let marker = denial_marker(mode);
    let mut text = marker.clone();
    if escalating == Escalating::Offered && !mode.wider_modes().is_empty() {
        text.push('\n');
        text.push_str(&escalation_hint(mode));
    }
    let detail = detail
        .strip_prefix(marker.as_str())
        .map(|rest| rest.trim_start_matches([':', '\n', ' ']))
        .unwrap_or(detail);
    if !detail.is_empty() {
        text.push('\n');
        text.push_str(detail);
    }
    ToolResult::error(text)
}

/// A backend's error: the host-level failures (a panic, a broken or mismatched service)
/// are the tool's own failure; everything else concerns what the model asked for and is
/// its answer, as an error result.
pub fn backend_error(e: Error) -> Stop {
    use cordis_sdk::codes;
    let tool_failure = [
        codes::PANIC,
        codes::INTERNAL,
        codes::UNKNOWN_METHOD,
        codes::INTERFACE_MISMATCH,
        codes::MISSING_SERVICE,
    ];
    if tool_failure.contains(&e.code.as_str()) {
        Stop::Failed(e)
    } else {
        Stop::Answer(error_result(&e))
    }
}

/// A backend error as a model-facing error result: message, code and fix.
pub fn error_result(e: &Error) -> ToolResult {
    let mut text = format!("{} [{}]", e.message, e.code);
    if let Some(help) = &e.help {
        text.push_str(&format!("\nhelp: {help}"));
    }
    ToolResult::error(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sample tool's arguments.
    #[derive(Debug, Deserialize, JsonSchema, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Sample {
        /// A path.
        path: String,
        /// A count.
        #[serde(default)]
        count: Option<u32>,
    }

    fn check(args: Value, escalating: Escalating, expected: std::result::Result<&str, &str>) {
        let got = decode::<Sample>("sample", args.clone(), escalating);
        match (got, expected) {
            (Ok(call), Ok(path)) => assert_eq!(call.args.path, path, "{args}"),
            (Err(r), Err(needle)) => {
                assert!(r.is_error);
                assert!(r.text.contains(needle), "{args}: {}", r.text);
            }
            (got, expected) => panic!("{args}: got {got:?}, expected {expected:?}"),
        }
    }

    #[test]
    fn decoding_gives_actionable_errors() {
        use Escalating::{NotOffered, Offered};
        check(json!({"path": "a"}), NotOffered, Ok("a"));
        check(json!({"path": "a", "count": null}), NotOffered, Ok("a"));
        check(
            json!([]),
            NotOffered,
            Err("must be a JSON object, got an array"),
        );
        check(json!({}), NotOffered, Err("missing field `path`"));
        check(json!({"path": 3}), NotOffered, Err("invalid type"));
        check(
            json!({"path": "a", "x": 1}),
            NotOffered,
            Err("unknown field `x`"),
        );
        check(
            json!({"path": "a", "sandbox_permissions": "danger-full-access", "justification": "j"}),
            NotOffered,
            Err("unknown field `justification`"),
        );
        check(
            json!({"path": "a", "sandbox_permissions": "danger-full-access", "justification": "j"}),
            Offered,
            Ok("a"),
        );
        check(
            json!({"path": "a", "justification": "j"}),
            Offered,
            Err("go together"),
        );
    }

    #[test]
    fn schema_gates_the_escalation_fields() {
        let plain = input_schema::<Sample>(Escalating::NotOffered);
        assert_eq!(plain["additionalProperties"], json!(false));
        assert_eq!(plain["required"], json!(["path"]));
        assert!(plain["properties"].get(PERMISSIONS_PARAM).is_none());
        let offered = input_schema::<Sample>(Escalating::Offered);
        assert_eq!(
            offered["properties"][PERMISSIONS_PARAM]["enum"],
            json!(["read-only", "workspace-write", "danger-full-access"])
        );
        assert!(offered["properties"].get(JUSTIFICATION_PARAM).is_some());
        assert_eq!(offered["required"], json!(["path"]));
    }

    #[test]
    fn paths_resolve_against_the_session() {
        let cwd = Path::new("/w/s");
        assert_eq!(
            resolve_path(cwd, "path", "a/b"),
            Ok(PathBuf::from("/w/s/a/b"))
        );
        assert_eq!(resolve_path(cwd, "path", "/x"), Ok(PathBuf::from("/x")));
        assert!(resolve_path(cwd, "path", " ").is_err());
        assert!(resolve_path(cwd, "path", "a\0b").is_err());
    }

    #[test]
    fn denial_starts_with_the_marker() {
        let d = denial(
            SandboxMode::WorkspaceWrite,
            Escalating::Offered,
            "[sandbox: file access denied under workspace-write mode]: cannot modify `/x`",
        );
        let lines: Vec<&str> = d.text.lines().collect();
        assert_eq!(lines[0], denial_marker(SandboxMode::WorkspaceWrite));
        assert_eq!(lines[1], escalation_hint(SandboxMode::WorkspaceWrite));
        assert_eq!(lines[2], "cannot modify `/x`");
        let d = denial(SandboxMode::ReadOnly, Escalating::NotOffered, "");
        assert_eq!(d.text, denial_marker(SandboxMode::ReadOnly));
        assert_eq!(one_line("a\n  b\tc", 80), "a b c");
        assert_eq!(one_line("abcdef", 4), "abc…");
    }
}
