//! `cordis.yml`: a Cordis-loader-style list of plugin entries, parsed with the position of
//! every value so that each diagnostic can point at a line and column.
//!
//! Entry keys: `name` (plugin; `@scope/name` accepted), `id`, `config`, `disabled`, `path`,
//! and `group: true` (then `config` is a child entry list; a disabled group disables them).

use std::collections::HashMap;
use std::path::PathBuf;

use yaml_rust2::parser::{Event, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

use crate::diag::{self, Diagnostic, Pos};

/// A YAML value with its position.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// The value.
    pub value: Value,
    /// Where it starts.
    pub pos: Pos,
}

/// A YAML value (core schema).
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `null`, `~` or empty.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A string.
    Str(String),
    /// A sequence.
    Seq(Vec<Node>),
    /// A mapping, in source order.
    Map(Vec<(Node, Node)>),
}

impl Node {
    /// The node as JSON (mapping keys become strings).
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as J;
        match &self.value {
            Value::Null => J::Null,
            Value::Bool(b) => J::Bool(*b),
            Value::Int(i) => J::from(*i),
            Value::Float(f) => serde_json::Number::from_f64(*f).map_or(J::Null, J::Number),
            Value::Str(s) => J::String(s.clone()),
            Value::Seq(items) => J::Array(items.iter().map(Node::to_json).collect()),
            Value::Map(pairs) => J::Object(
                pairs
                    .iter()
                    .map(|(k, v)| (k.key_text(), v.to_json()))
                    .collect(),
            ),
        }
    }

    fn key_text(&self) -> String {
        match &self.value {
            Value::Str(s) => s.clone(),
            Value::Null => "null".into(),
            Value::Bool(b) => b.to_string(),
            Value::Int(i) => i.to_string(),
            Value::Float(f) => f.to_string(),
            Value::Seq(_) | Value::Map(_) => "<complex key>".into(),
        }
    }

    /// A short name of the node's type, for messages.
    pub(crate) fn type_name(&self) -> &'static str {
        match self.value {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Int(_) => "an integer",
            Value::Float(_) => "a float",
            Value::Str(_) => "a string",
            Value::Seq(_) => "a list",
            Value::Map(_) => "a mapping",
        }
    }
}

/// The largest manifest accepted, in bytes.
pub(crate) const MAX_MANIFEST_BYTES: usize = 1024 * 1024;
/// The most values a manifest may hold once its aliases are expanded.
pub(crate) const MAX_NODES: usize = 100_000;
/// The deepest nesting of lists and mappings accepted.
pub(crate) const MAX_DEPTH: usize = 64;

/// Parses YAML text into a positioned tree (the first document; an empty file is `Null`).
/// Limits: [`MAX_MANIFEST_BYTES`] of text, [`MAX_NODES`] values with aliases expanded (an
/// alias bomb stops at the alias that crosses it) and [`MAX_DEPTH`] levels of nesting.
pub fn parse_yaml(text: &str) -> Result<Node, Diagnostic> {
    if text.len() > MAX_MANIFEST_BYTES {
        return Err(Diagnostic::new(
            diag::MANIFEST_TOO_LARGE,
            format!(
                "the manifest is {} bytes, more than the limit of {MAX_MANIFEST_BYTES} bytes (1 MiB)",
                text.len()
            ),
        )
        .at(Pos { line: 1, col: 1 })
        .help("a composition needs a few kilobytes: split generated content out of cordis.yml"));
    }
    let mut builder = Builder::default();
    let mut parser = Parser::new_from_str(text);
    loop {
        let (event, mark) = parser.next_token().map_err(|e| {
            let m = e.marker();
            Diagnostic::new(
                diag::YAML_SYNTAX,
                format!("YAML syntax error: {}", e.info()),
            )
            .at(pos_of(m))
            .help("fix the YAML syntax at this position (check indentation and quoting)")
        })?;
        if matches!(event, Event::StreamEnd | Event::DocumentEnd) {
            break;
        }
        builder.on_event(event, mark);
        if let Some(d) = builder.too_large.take() {
            return Err(d);
        }
    }
    Ok(builder.root.unwrap_or(Node {
        value: Value::Null,
        pos: Pos { line: 1, col: 1 },
    }))
}

fn pos_of(m: &Marker) -> Pos {
    Pos {
        line: m.line(),
        col: m.col() + 1,
    }
}

#[derive(Default)]
struct Builder {
    stack: Vec<(Node, Option<Node>, usize)>,
    root: Option<Node>,
    /// Anchored nodes with the number of values each holds.
    anchors: HashMap<usize, (Node, usize)>,
    /// Values built so far, aliases counted with everything they expand to.
    nodes: usize,
    /// Values built in each open container (to size an anchored container).
    counts: Vec<usize>,
    /// Set once a limit is crossed; nothing more is built.
    too_large: Option<Diagnostic>,
}

impl Builder {
    fn push_value(&mut self, node: Node) {
        match self.stack.last_mut() {
            None => {
                if self.root.is_none() {
                    self.root = Some(node);
                }
            }
            Some((parent, pending_key, _)) => match &mut parent.value {
                Value::Seq(items) => items.push(node),
                Value::Map(pairs) => match pending_key.take() {
                    None => *pending_key = Some(node),
                    Some(key) => pairs.push((key, node)),
                },
                _ => unreachable!("only containers are pushed on the stack"),
            },
        }
    }
}

impl Builder {
    /// Counts `n` more values; crossing [`MAX_NODES`] stops the build with a diagnostic.
    fn count(&mut self, n: usize, pos: Pos, alias: bool) -> bool {
        self.nodes = self.nodes.saturating_add(n);
        for c in &mut self.counts {
            *c = c.saturating_add(n);
        }
        if self.nodes <= MAX_NODES {
            return true;
        }
        let what = if alias {
            "this alias expands the manifest"
        } else {
            "the manifest has"
        };
        self.too_large = Some(
            Diagnostic::new(
                diag::MANIFEST_TOO_LARGE,
                format!("{what} past {MAX_NODES} values"),
            )
            .at(pos)
            .help("write the values out instead of nesting aliases (`*name`) of aliases"),
        );
        false
    }

    fn open(&mut self, value: Value, pos: Pos, anchor: usize) {
        if !self.count(1, pos, false) {
            return;
        }
        if self.stack.len() >= MAX_DEPTH {
            self.too_large = Some(
                Diagnostic::new(
                    diag::MANIFEST_TOO_LARGE,
                    format!("lists and mappings are nested more than {MAX_DEPTH} levels deep"),
                )
                .at(pos)
                .help("flatten the structure: a composition needs a few levels"),
            );
            return;
        }
        self.stack.push((Node { value, pos }, None, anchor));
        self.counts.push(1);
    }

    fn on_event(&mut self, ev: Event, mark: Marker) {
        let pos = pos_of(&mark);
        match ev {
            Event::Scalar(text, style, anchor, _tag) => {
                if !self.count(1, pos, false) {
                    return;
                }
                let value = if style == TScalarStyle::Plain {
                    plain_scalar(text)
                } else {
                    Value::Str(text)
                };
                let node = Node { value, pos };
                if anchor > 0 {
                    self.anchors.insert(anchor, (node.clone(), 1));
                }
                self.push_value(node);
            }
            Event::SequenceStart(anchor, _) => self.open(Value::Seq(Vec::new()), pos, anchor),
            Event::MappingStart(anchor, _) => self.open(Value::Map(Vec::new()), pos, anchor),
            Event::SequenceEnd | Event::MappingEnd => {
                let size = self.counts.pop().unwrap_or(1);
                if let Some((mut node, _, anchor)) = self.stack.pop() {
                    // The parser marks a block mapping late; its first key is where it starts.
                    if let Value::Map(pairs) = &node.value {
                        if let Some((k, _)) = pairs.first() {
                            node.pos = k.pos;
                        }
                    }
                    if anchor > 0 {
                        self.anchors.insert(anchor, (node.clone(), size));
                    }
                    self.push_value(node);
                }
            }
            Event::Alias(id) => {
                let size = self.anchors.get(&id).map_or(1, |(_, size)| *size);
                if !self.count(size, pos, true) {
                    return;
                }
                let node = self.anchors.get(&id).map_or(
                    Node {
                        value: Value::Null,
                        pos,
                    },
                    |(node, _)| node.clone(),
                );
                self.push_value(node);
            }
            _ => {}
        }
    }
}

fn plain_scalar(text: String) -> Value {
    match text.as_str() {
        "" | "~" | "null" | "Null" | "NULL" => return Value::Null,
        "true" | "True" | "TRUE" => return Value::Bool(true),
        "false" | "False" | "FALSE" => return Value::Bool(false),
        _ => {}
    }
    if let Ok(i) = text.parse::<i64>() {
        return Value::Int(i);
    }
    let looks_numeric = text
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_digit() || c == '-' || c == '+' || c == '.');
    if looks_numeric {
        if let Ok(f) = text.parse::<f64>() {
            return Value::Float(f);
        }
    }
    Value::Str(text)
}

/// One plugin entry, flattened out of its groups.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// Stable identity (defaults to the plugin name).
    pub id: String,
    /// The plugin name without a scope (`@deepseek-ai/dsh-fs` → `dsh-fs`).
    pub plugin: String,
    /// An explicit library file, relative to the manifest's directory.
    pub path: Option<PathBuf>,
    /// The entry's config as JSON (`{}` when absent).
    pub config: serde_json::Value,
    /// The config node, for positions of config values.
    pub config_node: Option<Node>,
    /// Disabled by itself or by a group.
    pub disabled: bool,
    /// `isolate: process`: applied in a process of its own (`callTimeout` inside).
    pub isolate: Option<crate::isolate::Isolation>,
    /// Where the entry starts.
    pub pos: Pos,
}

/// A parsed manifest: every entry in source order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Manifest {
    /// All entries, groups flattened, in source order.
    pub entries: Vec<Entry>,
}

impl Manifest {
    /// The enabled entries.
    pub fn enabled(&self) -> impl Iterator<Item = &Entry> {
        self.entries.iter().filter(|e| !e.disabled)
    }
}

const ENTRY_KEYS: &[&str] = &[
    "name",
    "id",
    "config",
    "disabled",
    "group",
    "path",
    "isolate",
    "callTimeout",
    "memoryMib",
];

/// Strips an npm-style scope: `@deepseek-ai/dsh-fs-sandbox` → `dsh-fs-sandbox`.
pub fn plugin_name(raw: &str) -> &str {
    match raw.strip_prefix('@') {
        Some(rest) => rest.split_once('/').map_or(raw, |(_, name)| name),
        None => raw,
    }
}

/// Parses `cordis.yml` text; returns every problem found.
pub fn parse(text: &str) -> Result<Manifest, Vec<Diagnostic>> {
    let root = parse_yaml(text).map_err(|d| vec![d])?;
    let mut diags = Vec::new();
    let mut manifest = Manifest::default();
    match &root.value {
        Value::Seq(items) => collect_entries(items, false, &mut manifest, &mut diags),
        Value::Null => {}
        _ => diags.push(
            Diagnostic::new(
                diag::MANIFEST_SHAPE,
                format!(
                    "cordis.yml must be a list of entries, found {}",
                    root.type_name()
                ),
            )
            .at(root.pos)
            .help("write one `- name: <plugin>` item per plugin"),
        ),
    }
    check_ids(&manifest, &mut diags);
    if diags.is_empty() {
        Ok(manifest)
    } else {
        Err(diags)
    }
}

fn collect_entries(
    items: &[Node],
    parent_disabled: bool,
    out: &mut Manifest,
    diags: &mut Vec<Diagnostic>,
) {
    for item in items {
        let Value::Map(pairs) = &item.value else {
            diags.push(
                Diagnostic::new(
                    diag::ENTRY_SHAPE,
                    format!("an entry must be a mapping, found {}", item.type_name()),
                )
                .at(item.pos)
                .help("write the entry as `- name: <plugin>` with optional `id`, `config`, `disabled`, `path`"),
            );
            continue;
        };
        let field = |key: &str| {
            pairs
                .iter()
                .find(|(k, _)| k.key_text() == key)
                .map(|(_, v)| v)
        };
        let mut ok = true;
        for (k, _) in pairs {
            let key = k.key_text();
            if !ENTRY_KEYS.contains(&key.as_str()) {
                ok = false;
                let mut d =
                    Diagnostic::new(diag::UNKNOWN_KEY, format!("unknown entry key `{key}`"))
                        .at(k.pos);
                d = match closest(&key, ENTRY_KEYS) {
                    Some(s) => d.help(format!("did you mean `{s}`?")),
                    None => d.help(format!("entry keys are: {}", ENTRY_KEYS.join(", "))),
                };
                diags.push(d);
            }
        }
        let bool_field = |key: &str, diags: &mut Vec<Diagnostic>| -> bool {
            match field(key) {
                None => false,
                Some(Node {
                    value: Value::Bool(b),
                    ..
                }) => *b,
                Some(n) => {
                    diags.push(
                        Diagnostic::new(
                            diag::ENTRY_TYPE,
                            format!("`{key}` must be true or false, found {}", n.type_name()),
                        )
                        .at(n.pos),
                    );
                    false
                }
            }
        };
        let str_field = |key: &str, diags: &mut Vec<Diagnostic>| -> Option<String> {
            match field(key) {
                None => None,
                Some(Node {
                    value: Value::Str(s),
                    ..
                }) if !s.is_empty() => Some(s.clone()),
                Some(n) => {
                    diags.push(
                        Diagnostic::new(
                            diag::ENTRY_TYPE,
                            format!(
                                "`{key}` must be a non-empty string, found {}",
                                n.type_name()
                            ),
                        )
                        .at(n.pos),
                    );
                    None
                }
            }
        };
        let disabled = parent_disabled || bool_field("disabled", diags);
        let is_group = bool_field("group", diags);
        let id = str_field("id", diags);
        let name = str_field("name", diags);
        let path = str_field("path", diags).map(PathBuf::from);
        let isolate = isolation(
            field("isolate"),
            field("callTimeout"),
            field("memoryMib"),
            diags,
        );
        let config = field("config");
        if is_group {
            match config.map(|c| &c.value) {
                Some(Value::Seq(children)) => collect_entries(children, disabled, out, diags),
                None | Some(Value::Null) => {}
                Some(_) => diags.push(
                    Diagnostic::new(
                        diag::GROUP_SHAPE,
                        "a group's `config` must be a list of entries",
                    )
                    .at(config.map_or(item.pos, |c| c.pos))
                    .help("write the group's children as a list under `config:`"),
                ),
            }
            continue;
        }
        let Some(raw_name) = name else {
            if field("name").is_none() {
                diags.push(
                    Diagnostic::new(diag::MISSING_NAME, "entry has no `name`")
                        .at(item.pos)
                        .help("add `name: <plugin>` naming the plugin to load"),
                );
            }
            continue;
        };
        let config_json = match config {
            None => serde_json::json!({}),
            Some(n) => match &n.value {
                Value::Null => serde_json::json!({}),
                Value::Map(_) => match config_json(n) {
                    Ok(v) => v,
                    Err(mut d) => {
                        diags.append(&mut d);
                        ok = false;
                        serde_json::json!({})
                    }
                },
                _ => {
                    diags.push(
                        Diagnostic::new(
                            diag::CONFIG_TYPE,
                            format!("`config` must be a mapping, found {}", n.type_name()),
                        )
                        .at(n.pos),
                    );
                    ok = false;
                    serde_json::json!({})
                }
            },
        };
        if !ok {
            continue;
        }
        let plugin = plugin_name(&raw_name).to_string();
        out.entries.push(Entry {
            id: id.unwrap_or_else(|| plugin.clone()),
            plugin,
            path,
            config: config_json,
            config_node: config.cloned(),
            disabled,
            isolate,
            pos: item.pos,
        });
    }
}

/// `30s`, `15m`, `2h`, `7d`: a whole number and a unit.
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let bad = || {
        format!("`{text}` is not a duration: write a whole number and a unit, s, m, h or d (e.g. 30m, 7d)")
    };
    let scale = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(bad()),
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .map(std::time::Duration::from_secs)
        .ok_or_else(bad)
}

/// An entry's `isolate`, `callTimeout` and `memoryMib`: `isolate: process` (the only
/// isolation there is), a positive duration and a memory limit of at least
/// [`crate::isolate::MIN_MEMORY_MIB`]; either of the last two without `isolate` is a
/// mistake.
fn isolation(
    isolate: Option<&Node>,
    timeout: Option<&Node>,
    memory: Option<&Node>,
    diags: &mut Vec<Diagnostic>,
) -> Option<crate::isolate::Isolation> {
    let wanted = match isolate.map(|n| (n, &n.value)) {
        None => false,
        Some((_, Value::Str(s))) if s == "process" => true,
        Some((_, Value::Str(s))) if s == "none" => false,
        Some((n, _)) => {
            diags.push(
                Diagnostic::new(
                    diag::ENTRY_TYPE,
                    match &n.value {
                        Value::Str(s) => {
                            format!("`isolate` must be `process` or `none`, found `{s}`")
                        }
                        _ => format!(
                            "`isolate` must be `process` or `none`, found {}",
                            n.type_name()
                        ),
                    },
                )
                .at(n.pos)
                .help("write `isolate: process` to run the entry in a process of its own"),
            );
            return None;
        }
    };
    let mut isolation = crate::isolate::Isolation::default();
    // A key of isolation on an entry that is not isolated is a mistake.
    let only_isolated = |key: &str, n: &Node, why: &str, diags: &mut Vec<Diagnostic>| {
        diags.push(
            Diagnostic::new(
                diag::ENTRY_TYPE,
                format!("`{key}` applies only to an entry with `isolate: process`"),
            )
            .at(n.pos)
            .help(format!("add `isolate: process`, or remove `{key}` ({why})")),
        );
    };
    if let Some(n) = memory {
        if !wanted {
            only_isolated(
                "memoryMib",
                n,
                "an in-process plugin shares the host's memory",
                diags,
            );
            return None;
        }
        let min = crate::isolate::MIN_MEMORY_MIB;
        match &n.value {
            Value::Int(mib) if u64::try_from(*mib).is_ok_and(|m| m >= min) => {
                isolation.memory_mib = u64::try_from(*mib).ok();
            }
            other => {
                let found = match other {
                    Value::Int(mib) => mib.to_string(),
                    _ => n.type_name().to_string(),
                };
                diags.push(
                    Diagnostic::new(
                        diag::ENTRY_TYPE,
                        format!("`memoryMib` must be a whole number of MiB, at least {min}, found {found}"),
                    )
                    .at(n.pos)
                    .help("write e.g. `memoryMib: 512`"),
                );
                return None;
            }
        }
    }
    if let Some(n) = timeout {
        if !wanted {
            only_isolated(
                "callTimeout",
                n,
                "an in-process call cannot be stopped",
                diags,
            );
            return None;
        }
        let parsed = match &n.value {
            Value::Str(s) => parse_duration(s),
            _ => Err(format!(
                "`callTimeout` must be a duration such as `30s` or `15m`, found {}",
                n.type_name()
            )),
        };
        match parsed {
            Ok(d) if !d.is_zero() => isolation.call_timeout = d,
            Ok(_) => {
                diags.push(
                    Diagnostic::new(diag::ENTRY_TYPE, "`callTimeout` must be longer than zero")
                        .at(n.pos)
                        .help("write e.g. `callTimeout: 30s`"),
                );
                return None;
            }
            Err(why) => {
                diags.push(
                    Diagnostic::new(diag::ENTRY_TYPE, why)
                        .at(n.pos)
                        .help("write e.g. `callTimeout: 30s`"),
                );
                return None;
            }
        }
    }
    wanted.then_some(isolation)
}

/// A config node as JSON, with `${VAR}` / `${VAR:-default}` interpolated in string values
/// (`$$` is a literal `$`). Every unset variable without a default is reported.
fn config_json(node: &Node) -> Result<serde_json::Value, Vec<Diagnostic>> {
    use serde_json::Value as J;
    let mut diags = Vec::new();
    let value = match &node.value {
        Value::Str(s) => match interpolate(s, node.pos) {
            Ok(text) => J::String(text),
            Err(d) => {
                diags.push(d);
                J::Null
            }
        },
        Value::Seq(items) => J::Array(
            items
                .iter()
                .map(|i| {
                    config_json(i).unwrap_or_else(|mut d| {
                        diags.append(&mut d);
                        J::Null
                    })
                })
                .collect(),
        ),
        Value::Map(pairs) => J::Object(
            pairs
                .iter()
                .map(|(k, v)| {
                    let v = config_json(v).unwrap_or_else(|mut d| {
                        diags.append(&mut d);
                        J::Null
                    });
                    (k.key_text(), v)
                })
                .collect(),
        ),
        _ => node.to_json(),
    };
    if diags.is_empty() {
        Ok(value)
    } else {
        Err(diags)
    }
}

/// Expands `${VAR}`, `${VAR:-default}` and `$$` in one string value.
pub(crate) fn interpolate(text: &str, pos: Pos) -> Result<String, Diagnostic> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(body) = after.strip_prefix('{') {
            let Some(end) = body.find('}') else {
                return Err(Diagnostic::new(
                    diag::INTERPOLATION,
                    format!("unterminated `${{` in {text:?}"),
                )
                .at(pos)
                .help("close it with `}`, or write `$$` for a literal `$`"));
            };
            let inner = &body[..end];
            let (name, default) = match inner.split_once(":-") {
                Some((n, d)) => (n, Some(d)),
                None => (inner, None),
            };
            let valid = !name.is_empty()
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !name.starts_with(|c: char| c.is_ascii_digit());
            if !valid {
                return Err(Diagnostic::new(
                    diag::INTERPOLATION,
                    format!("`${{{inner}}}` does not name an environment variable"),
                )
                .at(pos)
                .help("write `${NAME}` or `${NAME:-default}` (letters, digits, `_`), or `$$` for a literal `$`"));
            }
            match (std::env::var(name), default) {
                (Ok(v), _) => out.push_str(&v),
                (Err(_), Some(d)) => out.push_str(d),
                (Err(_), None) => {
                    return Err(Diagnostic::new(
                        diag::INTERPOLATION,
                        format!("environment variable `{name}` is not set"),
                    )
                    .at(pos)
                    .help(format!(
                        "set {name}, or give a default: `${{{name}:-value}}`"
                    )))
                }
            }
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

fn check_ids(manifest: &Manifest, diags: &mut Vec<Diagnostic>) {
    let mut seen: HashMap<&str, &Entry> = HashMap::new();
    for e in &manifest.entries {
        if let Some(first) = seen.get(e.id.as_str()) {
            let help = if first.plugin == e.plugin {
                format!(
                    "plugin `{}` appears twice: give each entry a distinct `id:`",
                    e.plugin
                )
            } else {
                "give each entry a distinct `id:`".to_string()
            };
            diags.push(
                Diagnostic::new(diag::DUPLICATE_ID, format!("duplicate entry id `{}`", e.id))
                    .at(e.pos)
                    .note(format!(
                        "first used at line {}:{}",
                        first.pos.line, first.pos.col
                    ))
                    .help(help),
            );
        } else {
            seen.insert(&e.id, e);
        }
    }
}

/// The closest candidate to `word` by edit distance, if it is close enough to be a typo.
pub fn closest<'a>(word: &str, candidates: &[&'a str]) -> Option<&'a str> {
    candidates
        .iter()
        .map(|c| (edit_distance(&word.to_lowercase(), &c.to_lowercase()), *c))
        .filter(|(d, c)| *d <= (c.len() / 3).max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for i in 1..=a.len() {
        let mut cur = vec![i; b.len() + 1];
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            cur[j] = (prev[j] + 1).min(cur[j - 1] + 1).min(prev[j - 1] + cost);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str, expected: &[(&str, usize, usize)]) {
        let got: Vec<(String, usize, usize)> = match parse(text) {
            Ok(_) => Vec::new(),
            Err(diags) => diags
                .iter()
                .map(|d| {
                    let p = d.pos.unwrap_or_default();
                    (d.code.name.to_string(), p.line, p.col)
                })
                .collect(),
        };
        let expected: Vec<(String, usize, usize)> = expected
            .iter()
            .map(|(c, l, col)| (c.to_string(), *l, *col))
            .collect();
        assert_eq!(got, expected, "for manifest:\n{text}");
    }

    #[test]
    fn entries_groups_and_scopes() {
        let m = parse(
            "- name: '@deepseek-ai/dsh-sandbox-policy'\n  config:\n    mode: workspace-write\n\
             - group: true\n  disabled: true\n  config:\n    - name: a\n    - name: b\n      id: bee\n\
             - name: c\n  path: libs/libc.so\n",
        )
        .unwrap();
        let summary: Vec<(&str, &str, bool, usize)> = m
            .entries
            .iter()
            .map(|e| (e.id.as_str(), e.plugin.as_str(), e.disabled, e.pos.line))
            .collect();
        assert_eq!(
            summary,
            vec![
                ("dsh-sandbox-policy", "dsh-sandbox-policy", false, 1),
                ("a", "a", true, 7),
                ("bee", "b", true, 8),
                ("c", "c", false, 10),
            ]
        );
        assert_eq!(
            m.entries[0].config,
            serde_json::json!({"mode": "workspace-write"})
        );
        assert_eq!(m.entries[3].path, Some(PathBuf::from("libs/libc.so")));
    }

    #[test]
    fn errors_point_at_line_and_column() {
        check("- name: a\n  confg: {}\n", &[("unknown-key", 2, 3)]);
        check("- id: x\n", &[("missing-name", 1, 3)]);
        check("- name: a\n- name: a\n", &[("duplicate-id", 2, 3)]);
        check("- name: a\n  disabled: yes\n", &[("entry-type", 2, 13)]);
        check("- name: a\n  config: [1]\n", &[("config-type", 2, 11)]);
        check("name: a\n", &[("manifest-shape", 1, 1)]);
        check("- name: a\n   bad: [\n", &[("yaml-syntax", 2, 7)]);
        check("", &[]);
    }

    #[test]
    fn limits_stop_alias_bombs_deep_nesting_and_huge_files() {
        // Nine levels of nine aliases: 9^9 values once expanded.
        let mut bomb =
            String::from("- name: a\n  config:\n    l0: &l0 [x, x, x, x, x, x, x, x, x]\n");
        for i in 1..9 {
            let prev = format!("*l{}", i - 1);
            bomb.push_str(&format!(
                "    l{i}: &l{i} [{}]\n",
                [prev.as_str(); 9].join(", ")
            ));
        }
        check(&bomb, &[("manifest-too-large", 8, 14)]);
        let deep = format!(
            "- name: a\n  config:\n    k: {}{}\n",
            "[".repeat(100),
            "]".repeat(100)
        );
        check(&deep, &[("manifest-too-large", 3, 69)]);
        let huge = format!("# {}\n- name: a\n", "x".repeat(MAX_MANIFEST_BYTES));
        check(&huge, &[("manifest-too-large", 1, 1)]);
        // Within the limits, aliases still work.
        let m = parse("- name: a\n  config:\n    a: &v [1, 2]\n    b: *v\n").unwrap();
        assert_eq!(m.entries[0].config["b"], serde_json::json!([1, 2]));
    }

    #[test]
    fn interpolation() {
        std::env::set_var("CORDIS_TEST_ROOT", "/srv/ws");
        let at = Pos { line: 3, col: 5 };
        let ok = |t: &str| interpolate(t, at).unwrap();
        assert_eq!(ok("${CORDIS_TEST_ROOT}/x"), "/srv/ws/x");
        assert_eq!(ok("${CORDIS_TEST_UNSET_VAR:-read-only}"), "read-only");
        assert_eq!(ok("cost: $$5 and $x"), "cost: $5 and $x");
        let err = interpolate("${CORDIS_TEST_UNSET_VAR}", at).unwrap_err();
        assert_eq!((err.code.name, err.pos), ("interpolation", Some(at)));
        assert!(
            err.message.contains("CORDIS_TEST_UNSET_VAR"),
            "{}",
            err.message
        );
        assert!(interpolate("${1BAD}", at).is_err());
        assert!(interpolate("${OPEN", at).is_err());
        let m = parse("- name: a\n  config:\n    root: ${CORDIS_TEST_ROOT}\n").unwrap();
        assert_eq!(m.entries[0].config["root"], "/srv/ws");
        check(
            "- name: a\n  config:\n    root: ${CORDIS_TEST_UNSET_VAR}\n",
            &[("interpolation", 3, 11)],
        );
    }

    #[test]
    fn suggestions() {
        assert_eq!(closest("confg", ENTRY_KEYS), Some("config"));
        assert_eq!(
            closest("workspaceRot", &["mode", "workspaceRoot"]),
            Some("workspaceRoot")
        );
        assert_eq!(closest("zzzzzz", ENTRY_KEYS), None);
        assert_eq!(plugin_name("@deepseek-ai/dsh-fs-local"), "dsh-fs-local");
        assert_eq!(plugin_name("dsh-fs-local"), "dsh-fs-local");
    }
}
