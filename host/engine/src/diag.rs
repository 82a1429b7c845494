//! Diagnostics an operator can act on: what is wrong, where in `cordis.yml`, and how to fix
//! it. Every check in the host reports through [`Diagnostic`], with a stable [`Code`] from
//! the one registry ([`CODES`]); text is rendered cargo-style by `annotate-snippets` (byte
//! spans, display widths, untrusted text normalized), JSON by [`Diagnostic::to_json`].

use std::borrow::Cow;
use std::fmt;
use std::path::{Path, PathBuf};

use annotate_snippets::{
    normalize_untrusted_str, AnnotationKind, Group, Level, Origin, Renderer, Snippet,
};

/// A position in a source file (1-based line and 1-based column in characters).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Pos {
    /// 1-based line.
    pub line: usize,
    /// 1-based column, counted in characters (not bytes).
    pub col: usize,
}

/// How serious a diagnostic is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    /// The composition cannot be applied.
    Error,
}

impl Severity {
    /// The lower-case name used in text and JSON output.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Error => "error",
        }
    }
}

/// A stable diagnostic code: its name, severity and a one-line explanation.
#[derive(Debug, PartialEq, Eq)]
pub struct Code {
    /// The stable name, e.g. `missing-service`.
    pub name: &'static str,
    /// How serious it is.
    pub severity: Severity,
    /// One line: what it means.
    pub explanation: &'static str,
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

impl PartialEq<&str> for &'static Code {
    fn eq(&self, other: &&str) -> bool {
        self.name == *other
    }
}

macro_rules! codes {
    ($($konst:ident = $name:literal: $explanation:literal;)*) => {
        $(
            #[doc = $explanation]
            pub const $konst: &Code = &Code {
                name: $name,
                severity: Severity::Error,
                explanation: $explanation,
            };
        )*
        /// Every code, in the order they are documented.
        pub const CODES: &[&Code] = &[$($konst),*];
    };
}

codes! {
    MANIFEST_UNREADABLE = "manifest-unreadable": "the manifest file cannot be read";
    MANIFEST_EMPTY = "manifest-empty": "a running host's manifest became empty, as in the middle of a save; write `[]` to stop every entry";
    MANIFEST_TOO_LARGE = "manifest-too-large": "the manifest exceeds a limit on its size, alias expansion or nesting depth";
    YAML_SYNTAX = "yaml-syntax": "the manifest is not valid YAML";
    MANIFEST_SHAPE = "manifest-shape": "the manifest is not a list of entries";
    ENTRY_SHAPE = "entry-shape": "an entry is not a mapping";
    UNKNOWN_KEY = "unknown-key": "an entry has a key cordis does not know";
    ENTRY_TYPE = "entry-type": "an entry key has a value of the wrong type";
    MISSING_NAME = "missing-name": "an entry does not name its plugin";
    GROUP_SHAPE = "group-shape": "a group's `config` is not a list of entries";
    CONFIG_TYPE = "config-type": "an entry's `config` is not a mapping";
    INTERPOLATION = "interpolation": "a `${VAR}` in a config value cannot be expanded";
    DUPLICATE_ID = "duplicate-id": "two entries have the same id";
    LIBRARY_NOT_FOUND = "library-not-found": "no library file was found for an entry's plugin";
    LIBRARY_INVALID = "library-invalid": "a library file is not a loadable cordis plugin";
    ABI_MISMATCH = "abi-mismatch": "a plugin was built against an incompatible cordis-sdk";
    PLUGIN_NAME_MISMATCH = "plugin-name-mismatch": "a library holds another plugin than the entry names";
    INVALID_SCHEMA = "invalid-schema": "a plugin exports a config schema that is not valid JSON Schema";
    UNKNOWN_CONFIG_KEY = "unknown-config-key": "an entry's config has a key its plugin does not accept";
    INVALID_CONFIG = "invalid-config": "an entry's config is rejected by its plugin's schema or deserializer";
    DUPLICATE_PROVIDER = "duplicate-provider": "two entries (or an entry and the host) provide the same service";
    MISSING_SERVICE = "missing-service": "an entry requires a service no enabled entry provides";
    INTERFACE_MISMATCH = "interface-mismatch": "a service is provided and injected with different interfaces or versions";
    DEPENDENCY_CYCLE = "dependency-cycle": "entries inject each other's services in a cycle";
}

/// The code named `name`.
pub fn code(name: &str) -> Option<&'static Code> {
    CODES.iter().copied().find(|c| c.name == name)
}

/// One problem found in a composition.
#[derive(Clone, Debug, PartialEq)]
pub struct Diagnostic {
    /// Its stable code.
    pub code: &'static Code,
    /// What is wrong, naming the entry, plugin and service involved.
    pub message: String,
    /// Where, when the problem has a place in `cordis.yml`.
    pub pos: Option<Pos>,
    /// How to fix it.
    pub help: Option<String>,
    /// Further context (e.g. the places a library was looked for).
    pub notes: Vec<String>,
}

impl Diagnostic {
    /// A diagnostic with `code` and `message`.
    pub fn new(code: &'static Code, message: impl Into<String>) -> Self {
        Diagnostic {
            code,
            message: message.into(),
            pos: None,
            help: None,
            notes: Vec::new(),
        }
    }

    /// Places it in the manifest.
    pub fn at(mut self, pos: Pos) -> Self {
        self.pos = Some(pos);
        self
    }

    /// Adds a fix.
    pub fn help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    /// Adds a note.
    pub fn note(mut self, note: impl Into<String>) -> Self {
        self.notes.push(note.into());
        self
    }

    /// Renders it for a person, with the manifest path and, when the manifest text is
    /// given, the source line with a caret under the offending value. Never panics,
    /// whatever the position and the text.
    pub fn render(&self, file: &Path, source: Option<&str>) -> String {
        let path = printable(&file.display().to_string()).into_owned();
        let level = match self.code.severity {
            Severity::Error => Level::ERROR,
        };
        let message = printable(&self.message);
        let title = level.primary_title(message.as_ref()).id(self.code.name);
        let mut group: Group<'_> = match self.pos {
            Some(pos) => match source.and_then(|s| snippet_span(s, pos)) {
                Some((line, span)) => title.element(
                    Snippet::source(line.into_owned())
                        .line_start(pos.line)
                        .path(path.as_str())
                        .fold(false)
                        .annotation(AnnotationKind::Primary.span(span)),
                ),
                None => title.element(
                    Origin::path(path.as_str())
                        .line(pos.line.max(1))
                        .char_column(pos.col),
                ),
            },
            None => title.element(Origin::path(path.as_str())),
        };
        let notes: Vec<String> = self
            .notes
            .iter()
            .map(|n| normalize_untrusted_str(&printable(n)))
            .collect();
        for note in &notes {
            group = group.element(Level::NOTE.message(note.as_str()));
        }
        let help = self
            .help
            .as_deref()
            .map(|h| normalize_untrusted_str(&printable(h)));
        if let Some(help) = &help {
            group = group.element(Level::HELP.message(help.as_str()));
        }
        let mut text = Renderer::plain().render(&[group]);
        text.push('\n');
        text
    }

    /// The diagnostic as JSON for editors and CI: file, line, column (1-based, in
    /// characters), code, severity, message, help, notes, and the code's explanation.
    pub fn to_json(&self, file: &Path) -> serde_json::Value {
        serde_json::json!({
            "file": file,
            "line": self.pos.map(|p| p.line),
            "column": self.pos.map(|p| p.col),
            "code": self.code.name,
            "severity": self.code.severity.as_str(),
            "message": self.message,
            "help": self.help,
            "notes": self.notes,
            "explanation": self.code.explanation,
        })
    }
}

/// The source line at `pos` and the byte span, within it, of the token that starts at
/// `pos` (up to a `:`, `#`, `,`, `]` or `}`; one character for a flow collection's
/// opening bracket; at least one character); `None` when `pos` is not in
/// `source`.
fn snippet_span(source: &str, pos: Pos) -> Option<(Cow<'_, str>, std::ops::Range<usize>)> {
    let line = printable(source.lines().nth(pos.line.checked_sub(1)?)?);
    let col = pos.col.saturating_sub(1);
    let start = line
        .char_indices()
        .nth(col)
        .map_or(line.len(), |(byte, _)| byte);
    let rest = &line[start..];
    let token = rest[..token_end(rest)].trim_end();
    let len = if token.is_empty() || token.starts_with(['[', '{']) {
        rest.chars().next().map_or(0, char::len_utf8)
    } else {
        token.len()
    };
    let span = start..start + len;
    Some((line, span))
}

/// Whether `c` in untrusted text could act on a terminal or change how the text around it
/// reads: the C1 controls (U+0080–U+009F, among them the one-character CSI) and every
/// [`invisible`] character. (The C0 controls are each renderer's own business:
/// `annotate-snippets` shows them as symbols, approvals escape them.)
pub fn hostile(c: char) -> bool {
    ('\u{80}'..='\u{9f}').contains(&c) || invisible(c)
}

/// The code points Unicode marks as default-ignorable (`Default_Ignorable_Code_Point` in
/// `DerivedCoreProperties.txt`): a renderer shows nothing for them, whatever their general
/// category (the Hangul fillers are letters, the variation selectors marks).
const DEFAULT_IGNORABLE: [(char, char); 19] = [
    ('\u{ad}', '\u{ad}'),
    ('\u{34f}', '\u{34f}'),
    ('\u{61c}', '\u{61c}'),
    ('\u{115f}', '\u{1160}'),
    ('\u{17b4}', '\u{17b5}'),
    ('\u{180b}', '\u{180f}'),
    ('\u{200b}', '\u{200f}'),
    ('\u{202a}', '\u{202e}'),
    ('\u{2060}', '\u{206f}'),
    ('\u{3164}', '\u{3164}'),
    ('\u{fe00}', '\u{fe0f}'),
    ('\u{feff}', '\u{feff}'),
    ('\u{ffa0}', '\u{ffa0}'),
    ('\u{fff0}', '\u{fff8}'),
    ('\u{1bca0}', '\u{1bca3}'),
    ('\u{1d173}', '\u{1d17a}'),
    ('\u{e0000}', '\u{e0fff}'),
    ('\u{2028}', '\u{2029}'),
    ('\u{fffe}', '\u{ffff}'),
];

/// Whether `c` shows nothing, or not what it is, where a person reads untrusted text: a
/// format character (Unicode category `Cf`: zero-width characters, the byte-order mark,
/// the soft hyphen, bidirectional marks, overrides and isolates, the tag characters), a
/// line or paragraph separator (`Zl`, `Zp`), a private-use, surrogate or unassigned code
/// point (`Co`, `Cs`, `Cn`: a later Unicode or a font may draw it as anything, or as
/// nothing), or a default-ignorable code point of another category (Hangul fillers, the
/// Mongolian vowel separator and variation selectors, the combining grapheme joiner).
/// Controls (`Cc`) are left to the caller, which escapes or symbolizes them.
pub fn invisible(c: char) -> bool {
    use unicode_general_category::{get_general_category, GeneralCategory as G};
    if c.is_ascii() {
        return false;
    }
    matches!(
        get_general_category(c),
        G::Format
            | G::LineSeparator
            | G::ParagraphSeparator
            | G::PrivateUse
            | G::Surrogate
            | G::Unassigned
    ) || DEFAULT_IGNORABLE
        .iter()
        .any(|(first, last)| (*first..=*last).contains(&c))
}

/// `text` with every [`hostile`] character replaced by `\u{FFFD}`, one character for one
/// (so character columns still hold).
fn printable(text: &str) -> Cow<'_, str> {
    if text.chars().any(hostile) {
        Cow::Owned(
            text.chars()
                .map(|c| if hostile(c) { '\u{fffd}' } else { c })
                .collect(),
        )
    } else {
        Cow::Borrowed(text)
    }
}

/// Where the token at the start of `rest` ends: at a `:`, `#`, `,`, `]` or a `}` that does
/// not close a `${…}`.
fn token_end(rest: &str) -> usize {
    let mut open = 0usize;
    let mut prev = '\0';
    for (i, c) in rest.char_indices() {
        match c {
            '{' if prev == '$' => open += 1,
            '}' if open > 0 => open -= 1,
            ':' | '#' | ',' | ']' | '}' => return i,
            _ => {}
        }
        prev = c;
    }
    rest.len()
}

/// A failed check: every diagnostic found, for one manifest.
#[derive(Debug)]
pub struct Diagnostics {
    /// The manifest the diagnostics point into.
    pub file: PathBuf,
    /// All problems found (never empty).
    pub items: Vec<Diagnostic>,
    /// The manifest's text, for source snippets.
    pub source: Option<String>,
}

impl Diagnostics {
    /// Every diagnostic as JSON (see [`Diagnostic::to_json`]).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::Value::Array(self.items.iter().map(|d| d.to_json(&self.file)).collect())
    }
}

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for d in &self.items {
            writeln!(f, "{}", d.render(&self.file, self.source.as_deref()))?;
        }
        let n = self.items.len();
        write!(
            f,
            "error: {} is not a valid composition ({n} error{})",
            self.file.display(),
            if n == 1 { "" } else { "s" }
        )
    }
}

impl std::error::Error for Diagnostics {}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(source: &str, line: usize, col: usize) -> String {
        Diagnostic::new(UNKNOWN_KEY, "unknown entry key `dissabled`")
            .at(Pos { line, col })
            .help("did you mean `disabled`?")
            .render(Path::new("cordis.yml"), Some(source))
    }

    #[test]
    fn carets_sit_under_the_token_whatever_the_characters_before_it() {
        expect_test::expect![[r#"
            error[unknown-key]: unknown entry key `dissabled`
             --> cordis.yml:1:33
              |
            1 | - {name: dsh-fs-local, id: ééé, dissabled: true}
              |                                 ^^^^^^^^^
              |
              = help: did you mean `disabled`?
        "#]]
        .assert_eq(&render(
            "- {name: dsh-fs-local, id: ééé, dissabled: true}\n",
            1,
            33,
        ));
        expect_test::expect![[r#"
            error[unknown-key]: unknown entry key `dissabled`
             --> cordis.yml:1:13
              |
            1 | - {id: 日本語, dissabled: true}
              |                ^^^^^^^^^
              |
              = help: did you mean `disabled`?
        "#]]
        .assert_eq(&render("- {id: 日本語, dissabled: true}\n", 1, 13));
    }

    #[test]
    fn positions_outside_the_text_never_panic() {
        for (line, col) in [(0, 0), (1, 0), (1, 999), (9, 1), (usize::MAX, usize::MAX)] {
            for source in ["", "é", "\n\n", "a\r\nb", "- \u{1b}[31m: x"] {
                let text = render(source, line, col);
                assert!(
                    text.starts_with("error[unknown-key]: "),
                    "{source:?} {line}:{col}: {text}"
                );
            }
        }
    }

    #[test]
    fn terminal_escapes_in_the_text_are_not_passed_through() {
        let d = Diagnostic::new(UNKNOWN_KEY, "unknown entry key `\u{1b}[2J\u{9b}31m`")
            .at(Pos { line: 1, col: 3 })
            .note("note \u{1b}]0;title\u{7}\u{202e}")
            .help("help \u{1b}[31m\u{90}");
        let source = "- \u{9b}2J\u{1b}[31m\u{2066}: x\n";
        let text = d.render(Path::new("cordis\u{9b}.yml"), Some(source));
        let hostile = |c: char| {
            c.is_control() && c != '\n'
                || ('\u{202a}'..='\u{202e}').contains(&c)
                || ('\u{2066}'..='\u{2069}').contains(&c)
        };
        assert!(!text.chars().any(hostile), "{text:?}");
        assert!(text.contains("1 | - \u{fffd}2J"), "{text}");
    }

    #[test]
    fn every_code_is_unique_and_explained() {
        let mut names: Vec<&str> = CODES.iter().map(|c| c.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), CODES.len(), "duplicate code names");
        for c in CODES {
            assert!(!c.explanation.is_empty(), "{} has no explanation", c.name);
            assert_eq!(code(c.name), Some(*c));
        }
        assert_eq!(code("no-such-code"), None);
    }
}
