//! Diagnostics an operator can act on: what is wrong, where in `cordis.yml`, and how to fix
//! it. Every check in the host reports through [`Diagnostic`]; rendering is cargo-style.

use std::fmt;
use std::path::{Path, PathBuf};

/// A position in a source file (1-based line and column).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Pos {
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub col: usize,
}

/// One problem found in a composition.
#[derive(Clone, Debug, PartialEq)]
pub struct Diagnostic {
    /// A stable code, e.g. `missing-service`.
    pub code: &'static str,
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
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
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
    /// given, the source line with a caret under the offending value.
    pub fn render(&self, file: &Path, source: Option<&str>) -> String {
        Rendered {
            diag: self,
            file,
            source,
        }
        .to_string()
    }
}

struct Rendered<'a> {
    diag: &'a Diagnostic,
    file: &'a Path,
    source: Option<&'a str>,
}

impl fmt::Display for Rendered<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.diag;
        writeln!(f, "error[{}]: {}", d.code, d.message)?;
        match d.pos {
            Some(p) => {
                writeln!(f, "  --> {}:{}:{}", self.file.display(), p.line, p.col)?;
                let line = self
                    .source
                    .and_then(|s| s.lines().nth(p.line.saturating_sub(1)));
                if let Some(line) = line {
                    let gutter = p.line.to_string().len();
                    let start = p.col.saturating_sub(1).min(line.len());
                    let token = line[start..].trim_end();
                    let width = token
                        .split([':', '#'])
                        .next()
                        .unwrap_or("")
                        .trim_end()
                        .chars()
                        .count()
                        .max(1);
                    writeln!(f, "{:gutter$} |", "")?;
                    writeln!(f, "{} | {line}", p.line)?;
                    writeln!(
                        f,
                        "{:gutter$} | {}{}",
                        "",
                        " ".repeat(start),
                        "^".repeat(width)
                    )?;
                }
            }
            None => writeln!(f, "  --> {}", self.file.display())?,
        }
        for note in &d.notes {
            writeln!(f, "  = note: {note}")?;
        }
        if let Some(help) = &d.help {
            writeln!(f, "  = help: {help}")?;
        }
        Ok(())
    }
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
