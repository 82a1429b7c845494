//! The host's `approval` service, backed by whichever front-end owns the calling session:
//! an MCP connection asks its client (elicitation), `cordis call` answers from its flags or
//! the terminal. A session with no front-end that can ask gets `unavailable`.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use cordis_sdk::host::{Approval, ApprovalOutcome, ApprovalRequest};
use cordis_sdk::Result;

/// Something that can ask a person.
pub type Asker = Arc<dyn Fn(&ApprovalRequest) -> ApprovalOutcome + Send + Sync>;

/// Routes each approval request to the front-end of the calling session.
#[derive(Default)]
pub struct ApprovalRouter {
    by_session: RwLock<HashMap<String, Asker>>,
    fallback: RwLock<Option<Asker>>,
    observer: RwLock<Option<Observer>>,
}

/// Told every outcome (a front-end's metrics).
pub type Observer = Arc<dyn Fn(ApprovalOutcome) + Send + Sync>;

impl ApprovalRouter {
    /// Sets what is told every outcome.
    pub fn observe(&self, observer: Option<Observer>) {
        *self.observer.write().unwrap_or_else(|e| e.into_inner()) = observer;
    }

    /// Sets the asker for sessions without their own.
    pub fn set_default(&self, asker: Option<Asker>) {
        *self.fallback.write().unwrap_or_else(|e| e.into_inner()) = asker;
    }

    /// Answers every request for sessions without their own with `outcome`.
    pub fn answer_always(&self, outcome: ApprovalOutcome) {
        self.set_default(Some(Arc::new(move |_| outcome)));
    }

    /// Binds a session to a front-end's asker (until [`ApprovalRouter::unbind`]).
    pub fn bind(&self, session: &str, asker: Asker) {
        self.by_session
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(session.to_string(), asker);
    }

    /// Removes a session's asker.
    pub fn unbind(&self, session: &str) {
        self.by_session
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(session);
    }

    /// Asks the session's front-end; `unavailable` when there is none.
    pub fn ask(&self, request: &ApprovalRequest) -> ApprovalOutcome {
        let asker = self
            .by_session
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&request.session)
            .cloned()
            .or_else(|| {
                self.fallback
                    .read()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone()
            });
        let outcome = match asker {
            Some(ask) => ask(request),
            None => ApprovalOutcome::Unavailable,
        };
        tracing::info!(
            session = %request.session,
            call = %request.call_id,
            tool = %request.tool,
            "approval {outcome:?}: {}",
            escape_line(&request.summary)
        );
        if let Some(observer) = self
            .observer
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            observer(outcome);
        }
        outcome
    }
}

/// The router as the host's `approval` service.
#[derive(Clone)]
pub struct ApprovalService(pub Arc<ApprovalRouter>);

impl Approval for ApprovalService {
    fn request(&self, request: ApprovalRequest) -> Result<ApprovalOutcome> {
        crate::scope::check_approval(&request)?;
        let outcome = self.0.ask(&request);
        if let (ApprovalOutcome::Approved, Some(mode)) = (outcome, &request.mode) {
            crate::scope::approved(mode);
        }
        Ok(outcome)
    }
}

/// The widest line of agent-supplied text an approval shows; longer lines are wrapped
/// (continued on the next line, marked), never cut.
pub(crate) const WRAP_AT: usize = 100;

/// `text` with every control character (C0, DEL, C1) and every
/// [`invisible`](crate::diag::invisible) character (format characters, separators,
/// default-ignorables, unassigned and private-use code points) escaped (`\n`,
/// `\u{1b}`, `\u{200b}`, …), so it stays on one line, shows every character it holds, and
/// cannot restyle or reorder the prompt around it.
pub fn escape_line(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() || crate::diag::invisible(c) => {
                out.push_str(&format!("\\u{{{:x}}}", c as u32));
            }
            c => out.push(c),
        }
    }
    out
}

/// Agent-supplied `text` as a quoted block: every line escaped ([`escape_line`]) and
/// prefixed with `│ `, lines wider than [`WRAP_AT`] continued on lines prefixed `┆ `.
/// Nothing in it can start a line of the prompt itself.
fn quoted(text: &str) -> String {
    let mut out = String::new();
    for line in text.split('\n') {
        let escaped = escape_line(line);
        let chars: Vec<char> = escaped.chars().collect();
        let mut chunks = chars.chunks(WRAP_AT);
        let first: String = chunks.next().unwrap_or_default().iter().collect();
        out.push_str(&format!("  │ {first}\n"));
        for rest in chunks {
            out.push_str(&format!("  ┆ {}\n", rest.iter().collect::<String>()));
        }
    }
    out
}

/// What a person is shown before deciding, the same for every front-end: the tool, the
/// one-line summary (escaped), the whole request as a quoted block, and the justification
/// as a quoted block marked as the agent's words. Ends with a newline; the front-end adds
/// its question.
pub fn render(request: &ApprovalRequest) -> String {
    let mut out = format!(
        "Tool `{}` asks to run one call with a wider sandbox:\n  {}\n",
        escape_line(&request.tool),
        escape_line(&request.summary)
    );
    if !request.detail.is_empty() {
        out.push_str("The whole request (exactly what will run or be written):\n");
        out.push_str(&quoted(&request.detail));
    }
    out.push_str("The agent's justification (its own words, not checked):\n");
    out.push_str(&quoted(&request.justification));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(summary: &str, detail: &str, justification: &str) -> ApprovalRequest {
        ApprovalRequest {
            session: "s1".into(),
            call_id: "c1".into(),
            tool: "bash".into(),
            summary: summary.into(),
            detail: detail.into(),
            justification: justification.into(),
            mode: None,
        }
    }

    #[test]
    fn agent_text_cannot_forge_lines_and_is_never_cut() {
        let long = format!("echo {}; touch ~/x", "a".repeat(250));
        let text = render(&request(
            "write 3 bytes to /w/a\nJustification: fine\u{1b}[2K",
            &long,
            "needed\nApprove this one call? yes\r",
        ));
        expect_test::expect![[r#"
            Tool `bash` asks to run one call with a wider sandbox:
              write 3 bytes to /w/a\nJustification: fine\u{1b}[2K
            The whole request (exactly what will run or be written):
              │ echo aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa
              ┆ aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa
              ┆ aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa; touch ~/x
            The agent's justification (its own words, not checked):
              │ needed
              │ Approve this one call? yes\r
        "#]]
        .assert_eq(&text);
        for line in text.lines() {
            assert!(!line.starts_with("Justification") && !line.starts_with("Approve"));
        }
    }

    /// Every code point Python's `unicodedata` (an independent source, its own Unicode
    /// version) calls a control, format character or separator, every default-ignorable
    /// one its names give away, and the tag block, must be escaped; every letter, number,
    /// punctuation, symbol, space and mark of any other name must be shown as it is.
    #[test]
    fn every_invisible_character_by_an_independent_table_is_escaped() {
        const TABLE: &str = r#"
import sys, unicodedata
HIDDEN_NAMES = ("VARIATION SELECTOR", "HANGUL FILLER", "HANGUL CHOSEONG FILLER",
    "HANGUL JUNGSEONG FILLER", "HALFWIDTH HANGUL FILLER", "MONGOLIAN VOWEL SEPARATOR",
    "COMBINING GRAPHEME JOINER", "KHMER VOWEL INHERENT", "MONGOLIAN FREE VARIATION SELECTOR")
out = []
for cp in range(0x110000):
    if 0xD800 <= cp <= 0xDFFF:
        continue
    c = chr(cp)
    cat = unicodedata.category(c)
    name = unicodedata.name(c, "")
    if cat in ("Cc", "Cf", "Zl", "Zp") or 0xE0000 <= cp <= 0xE007F \
            or any(name.startswith(n) for n in HIDDEN_NAMES):
        out.append("E %x" % cp)
    elif cat[0] in "LNPSM" or cat == "Zs":
        out.append("K %x" % cp)
sys.stdout.write("\n".join(out))
"#;
        let output = std::process::Command::new("python3")
            .args(["-c", TABLE])
            .output()
            .unwrap_or_else(|e| {
                panic!("this test needs python3 (its unicodedata is the reference table): {e}")
            });
        assert!(output.status.success(), "{output:?}");
        let table = String::from_utf8(output.stdout).unwrap();
        let (mut escaped, mut kept) = (0, 0);
        for line in table.lines() {
            let (kind, hex) = line.split_once(' ').unwrap();
            let c = char::from_u32(u32::from_str_radix(hex, 16).unwrap()).unwrap();
            let text = c.to_string();
            let shown = escape_line(&text);
            if kind == "E" {
                escaped += 1;
                assert!(
                    shown.starts_with("\\u{") || shown.len() == 2 && shown.starts_with('\\'),
                    "U+{hex} is invisible and must be escaped, was shown as {shown:?}"
                );
            } else if c != '\\' {
                kept += 1;
                assert_eq!(shown, text, "U+{hex} is visible and must be shown as it is");
            }
        }
        // The reference is not empty: Unicode 14 has over 300 such code points and over
        // 140,000 visible ones.
        assert!(escaped > 300 && kept > 140_000, "{escaped} {kept}");
        assert!(crate::diag::hostile('\u{e0041}'));
    }

    #[test]
    fn every_invisible_or_reordering_character_is_escaped() {
        let all = "\u{0}\u{7f}\u{85}\u{2028}\u{202e}\u{2067}\\";
        assert_eq!(
            escape_line(all),
            "\\u{0}\\u{7f}\\u{85}\\u{2028}\\u{202e}\\u{2067}\\\\"
        );
    }
}
