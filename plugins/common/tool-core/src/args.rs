//! The arguments of the bundled model-facing tools (`read`, `write`, `edit`, `list`,
//! `bash`): what each tool decodes a call into with [`decode`](crate::decode) and derives
//! its input schema from. They live here, outside the cdylibs, so they can be decoded
//! (and fuzzed) without loading a plugin.

use schemars::JsonSchema;
use serde::Deserialize;

/// `read` arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadArgs {
    /// The file to read: relative to the session directory, or absolute.
    pub path: String,
    /// The first line to return, counting from 1 (default 1).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub offset: Option<u64>,
    /// How many lines to return (default: to the end of the file, up to the read caps).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub limit: Option<u64>,
}

/// `write` arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteArgs {
    /// The file to create or replace: relative to the session directory, or absolute.
    /// Missing parent directories are created.
    pub path: String,
    /// The whole new content of the file.
    pub content: String,
}

/// `edit` arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EditArgs {
    /// The existing text file to edit: relative to the session directory, or absolute.
    pub path: String,
    /// The exact text to replace (whitespace and line breaks included).
    pub old_string: String,
    /// The text to put in its place.
    pub new_string: String,
    /// Replace every occurrence; otherwise `old_string` must occur exactly once.
    #[serde(default)]
    pub replace_all: Option<bool>,
}

/// `list` arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListArgs {
    /// The directory to list: relative to the session directory, or absolute.
    pub path: String,
}

/// `bash` arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BashArgs {
    /// The script, run with `bash -c`.
    pub command: String,
    /// Kill the command (and everything it started) after this many milliseconds
    /// (default 120000, at most 600000).
    #[serde(default)]
    #[schemars(range(min = 1, max = 600_000))]
    pub timeout_ms: Option<u64>,
    /// The working directory, inside the session directory: relative to it, or absolute
    /// beneath it (default: the session directory).
    #[serde(default)]
    pub workdir: Option<String>,
}
