//! Fuzz target `tool_args`: a tool call's arguments (JSON) → each bundled tool's argument
//! decoding (`dsh_tool_core::decode` into the `args` types of `read`, `write`, `edit`,
//! `list` and `bash`, with and without escalation offered: the `sandbox_permissions` +
//! `justification` pairing) → what the tools do with decoded arguments before calling
//! their backend: resolving paths against the session directory, the one-line approval
//! summaries, and the fail-closed escalation decision for every current mode and answer.

#![no_main]

use std::path::Path;

use dsh_sandbox::{
    approve_escalation, ApproverDecision, Escalation, EscalationApprover, EscalationAsk,
    EscalationParams, SANDBOX_MODES,
};
use dsh_tool_core::args::{BashArgs, EditArgs, ListArgs, ReadArgs, WriteArgs};
use dsh_tool_core::{decode, one_line, resolve_path, Escalating};
use libfuzzer_sys::fuzz_target;
use serde::de::DeserializeOwned;
use serde_json::Value;

const CWD: &str = "/session/root";

/// An approver that always answers the same.
struct Answer(ApproverDecision);

impl EscalationApprover for Answer {
    fn approve(&self, _ask: &EscalationAsk<'_>) -> ApproverDecision {
        self.0
    }
}

fn path(field: &str, raw: &str) {
    let cwd = Path::new(CWD);
    match resolve_path(cwd, field, raw) {
        Ok(p) => assert!(p.is_absolute(), "{raw:?} resolved to {}", p.display()),
        Err(r) => assert!(
            r.is_error && r.text.contains(&format!("`{field}`")),
            "{}",
            r.text
        ),
    }
}

fn summary(text: &str, max: usize) -> String {
    let line = one_line(text, max);
    assert!(
        line.chars().count() <= max.max(1),
        "{line:?} is longer than {max}"
    );
    assert!(!line.contains('\n'), "{line:?}");
    line
}

fn escalate(tool: &str, escalation: &EscalationParams, summary: &str) {
    assert!(!escalation.justification.trim().is_empty());
    let answers = [
        ApproverDecision::Approved,
        ApproverDecision::Rejected,
        ApproverDecision::Cancelled,
        ApproverDecision::Unavailable,
    ];
    for current in SANDBOX_MODES {
        let ask = EscalationAsk {
            tool,
            current,
            requested: escalation.mode,
            justification: &escalation.justification,
            summary,
            detail: summary,
        };
        let wider = escalation.mode.is_wider_than(current);
        let none = approve_escalation(None, &ask);
        assert!(matches!(none, Escalation::Refused { .. }), "{none:?}");
        for answer in answers {
            let approver = Answer(answer);
            match approve_escalation(Some(&approver), &ask) {
                Escalation::Granted(mode) => {
                    assert!(wider && answer == ApproverDecision::Approved);
                    assert_eq!(mode, escalation.mode);
                }
                Escalation::Refused { text, .. } => {
                    assert!(!(wider && answer == ApproverDecision::Approved));
                    assert!(!text.is_empty());
                }
            }
        }
    }
}

/// Decodes `args` for `tool`; on success hands the arguments and the escalation to `then`.
fn check<T: DeserializeOwned>(
    tool: &str,
    args: &Value,
    escalating: Escalating,
    then: impl FnOnce(T) -> String,
) {
    match decode::<T>(tool, args.clone(), escalating) {
        Ok(call) => {
            if escalating == Escalating::NotOffered {
                assert!(call.escalation.is_none());
            }
            let summary = then(call.args);
            if let Some(escalation) = &call.escalation {
                escalate(tool, escalation, &summary);
            }
        }
        Err(r) => {
            assert!(r.is_error);
            assert!(
                r.text
                    .starts_with(&format!("`{tool}`: invalid arguments: ")),
                "{}",
                r.text
            );
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(args) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    for escalating in [Escalating::Offered, Escalating::NotOffered] {
        check("read", &args, escalating, |a: ReadArgs| {
            path("path", &a.path);
            format!("read {} {:?} {:?}", a.path, a.offset, a.limit)
        });
        check("write", &args, escalating, |a: WriteArgs| {
            path("path", &a.path);
            format!("write {} bytes to {}", a.content.len(), a.path)
        });
        check("edit", &args, escalating, |a: EditArgs| {
            path("path", &a.path);
            format!(
                "edit {}: replace {} {:?} with {:?}",
                a.path,
                if a.replace_all.unwrap_or(false) {
                    "every"
                } else {
                    "one"
                },
                summary(&a.old_string, 60),
                summary(&a.new_string, 60)
            )
        });
        check("list", &args, escalating, |a: ListArgs| {
            path("path", &a.path);
            format!("list {}", a.path)
        });
        check("bash", &args, escalating, |a: BashArgs| {
            if let Some(dir) = &a.workdir {
                path("workdir", dir);
            }
            format!("run `{}` in {CWD}", summary(&a.command, 160))
        });
    }
});
