//! JSON Schemas: validating an entry's config against the schema its plugin exports (every
//! violation, each pointing at the value's line and column in `cordis.yml`), and generating
//! `schemas/` — one schema per plugin plus `cordis.schema.json` for the manifest, which
//! embeds each known plugin's config schema so editors complete config keys.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use jsonschema::error::ValidationErrorKind;
use serde_json::{json, Map, Value};

use crate::diag::{self, Diagnostic, Pos};
use crate::loader::Meta;
use crate::manifest::{closest, Entry, Node, Value as Yaml};

/// The manifest schema's file name in `schemas/`.
pub(crate) const MANIFEST_SCHEMA: &str = "cordis.schema.json";

/// Every way `entry.config` violates `schema`, each placed at the offending value.
pub fn validate_config(entry: &Entry, schema: &Value) -> Vec<Diagnostic> {
    let validator = match jsonschema::validator_for(schema) {
        Ok(v) => v,
        Err(e) => {
            return vec![Diagnostic::new(
                diag::INVALID_SCHEMA,
                format!(
                    "plugin `{}` exports an invalid config schema: {e}",
                    entry.plugin
                ),
            )
            .at(entry.pos)
            .help("this is a bug in the plugin; rebuild it with a current cordis-sdk")]
        }
    };
    let mut out = Vec::new();
    for error in validator.iter_errors(&entry.config) {
        let pointer = error.instance_path().to_string();
        let segments = pointer_segments(&pointer);
        let at = locate(entry, &segments);
        let path = json_path(&segments);
        let d = match error.kind() {
            ValidationErrorKind::AdditionalProperties { unexpected } => {
                for key in unexpected {
                    let mut key_segments = segments.clone();
                    key_segments.push(key.clone());
                    let pos = locate_key(entry, &key_segments).unwrap_or(at);
                    let known = property_names(schema, &segments);
                    let known_refs: Vec<&str> = known.iter().map(String::as_str).collect();
                    let help = match closest(key, &known_refs) {
                        Some(s) => format!("did you mean `{s}`?"),
                        None if known.is_empty() => format!("`{path}` takes no keys"),
                        None => format!("known keys: {}", known.join(", ")),
                    };
                    out.push(
                        Diagnostic::new(
                            diag::UNKNOWN_CONFIG_KEY,
                            format!(
                                "entry `{}` (plugin `{}`): unknown key `{key}` in `{path}`",
                                entry.id, entry.plugin
                            ),
                        )
                        .at(pos)
                        .help(help),
                    );
                }
                continue;
            }
            ValidationErrorKind::Enum { .. }
            | ValidationErrorKind::AnyOf { .. }
            | ValidationErrorKind::OneOfNotValid { .. } => Diagnostic::new(
                diag::INVALID_CONFIG,
                format!(
                    "entry `{}` (plugin `{}`): `{path}` is {}, which is not an allowed value",
                    entry.id,
                    entry.plugin,
                    error.instance(),
                ),
            )
            .at(at),
            ValidationErrorKind::Required { property } => Diagnostic::new(
                diag::INVALID_CONFIG,
                format!(
                    "entry `{}` (plugin `{}`): `{path}` is missing the required key {property}",
                    entry.id, entry.plugin
                ),
            )
            .at(at),
            _ => Diagnostic::new(
                diag::INVALID_CONFIG,
                format!(
                    "entry `{}` (plugin `{}`): `{path}`: {error}",
                    entry.id, entry.plugin
                ),
            )
            .at(at),
        };
        let d = match describe_expected(schema, &segments, error.instance()) {
            Some(expected) => d.help(expected),
            None => d,
        };
        out.push(d);
    }
    out
}

/// A tool's input schema, compiled once when the tool is registered: every call's
/// arguments are checked against it before the tool runs.
pub(crate) struct ToolArgs(jsonschema::Validator);

/// How many violations an error result names (the rest are counted).
const NAMED_VIOLATIONS: usize = 5;
/// How many characters of one violation's text an error result shows.
const VIOLATION_CHARS: usize = 200;

impl ToolArgs {
    /// Compiles `schema` (the JSON text a plugin registered), or says why it cannot be.
    pub(crate) fn compile(schema: &str) -> Result<ToolArgs, String> {
        let value: Value =
            serde_json::from_str(schema).map_err(|e| format!("it is not JSON: {e}"))?;
        jsonschema::validator_for(&value)
            .map(ToolArgs)
            .map_err(|e| format!("it is not a valid JSON Schema: {e}"))
    }

    /// `Ok` when `args` match the schema; otherwise every violation (at most
    /// [`NAMED_VIOLATIONS`], each cut to [`VIOLATION_CHARS`]), placed at its argument
    /// (a violation of the whole, such as a missing argument, names none).
    pub(crate) fn check(&self, args: &Value) -> Result<(), String> {
        let mut errors = self.0.iter_errors(args);
        let named: Vec<String> = errors
            .by_ref()
            .take(NAMED_VIOLATIONS)
            .map(|e| {
                let segments = pointer_segments(&e.instance_path().to_string());
                let text: String = e.to_string().chars().take(VIOLATION_CHARS).collect();
                match segments.is_empty() {
                    true => text,
                    false => format!("`{}`: {text}", argument_path(&segments)),
                }
            })
            .collect();
        if named.is_empty() {
            return Ok(());
        }
        let more = errors.count();
        let mut out = named.join("; ");
        if more > 0 {
            out.push_str(&format!("; and {more} more"));
        }
        Err(out)
    }
}

/// `path`, `edits[0].old_string`: where an argument is, as a model would name it.
fn argument_path(segments: &[String]) -> String {
    let mut out = String::new();
    for s in segments {
        if s.parse::<usize>().is_ok() {
            out.push_str(&format!("[{s}]"));
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(s);
        }
    }
    out
}

fn pointer_segments(pointer: &str) -> Vec<String> {
    pointer
        .split('/')
        .skip(1)
        .map(|s| s.replace("~1", "/").replace("~0", "~"))
        .collect()
}

fn json_path(segments: &[String]) -> String {
    let mut out = String::from("config");
    for s in segments {
        if s.parse::<usize>().is_ok() {
            out.push_str(&format!("[{s}]"));
        } else {
            out.push('.');
            out.push_str(s);
        }
    }
    out
}

fn walk<'a>(node: &'a Node, segments: &[String]) -> Option<(&'a Node, Option<&'a Node>)> {
    let mut cur = node;
    let mut key = None;
    for s in segments {
        match &cur.value {
            Yaml::Map(pairs) => {
                let (k, v) = pairs.iter().find(|(k, _)| key_text(k) == *s)?;
                key = Some(k);
                cur = v;
            }
            Yaml::Seq(items) => {
                cur = items.get(s.parse::<usize>().ok()?)?;
                key = None;
            }
            _ => return None,
        }
    }
    Some((cur, key))
}

fn key_text(node: &Node) -> String {
    match &node.value {
        Yaml::Str(s) => s.clone(),
        other => Node {
            value: other.clone(),
            pos: node.pos,
        }
        .to_json()
        .to_string(),
    }
}

/// The position of the value at `segments` (or the deepest ancestor that exists).
fn locate(entry: &Entry, segments: &[String]) -> Pos {
    let Some(config) = &entry.config_node else {
        return entry.pos;
    };
    (0..=segments.len())
        .rev()
        .find_map(|n| walk(config, &segments[..n]).map(|(v, _)| v.pos))
        .unwrap_or(config.pos)
}

/// The position of the KEY at `segments` (for unknown keys).
fn locate_key(entry: &Entry, segments: &[String]) -> Option<Pos> {
    walk(entry.config_node.as_ref()?, segments).and_then(|(_, k)| k.map(|k| k.pos))
}

/// The sub-schema at an instance path (follows `properties`, `items` and local `$ref`s).
fn schema_at<'a>(root: &'a Value, segments: &[String]) -> Option<&'a Value> {
    let mut cur = resolve_ref(root, root);
    for s in segments {
        cur = match cur.get("properties").and_then(|p| p.get(s)) {
            Some(v) => resolve_ref(root, v),
            None => resolve_ref(root, cur.get("items")?),
        };
    }
    Some(cur)
}

fn resolve_ref<'a>(root: &'a Value, schema: &'a Value) -> &'a Value {
    let target = schema
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix('#'))
        .and_then(|p| root.pointer(p));
    match target {
        Some(t) => resolve_ref(root, t),
        None => schema
            .get("anyOf")
            .or_else(|| schema.get("oneOf"))
            .and_then(Value::as_array)
            .and_then(|alts| alts.iter().find(|a| a.get("type") != Some(&json!("null"))))
            .map_or(schema, |a| resolve_ref(root, a)),
    }
}

fn property_names(root: &Value, segments: &[String]) -> Vec<String> {
    schema_at(root, segments)
        .and_then(|s| s.get("properties"))
        .and_then(Value::as_object)
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default()
}

/// The schema written for the value at `segments` (the property's own schema, before
/// `$ref`/`anyOf` are followed, so its description is kept).
fn declared_at<'a>(root: &'a Value, segments: &[String]) -> Option<&'a Value> {
    match segments.split_last() {
        None => Some(root),
        Some((last, parent)) => {
            let p = schema_at(root, parent)?;
            p.get("properties")
                .and_then(|props| props.get(last))
                .or_else(|| p.get("items"))
        }
    }
}

/// Every `const`/`enum` value a schema allows (through `$ref`, `anyOf`, `oneOf`).
fn allowed_values(root: &Value, schema: &Value, out: &mut Vec<String>) {
    let schema = match schema
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix('#'))
        .and_then(|p| root.pointer(p))
    {
        Some(t) => t,
        None => schema,
    };
    let text = |v: &Value| v.as_str().map_or_else(|| v.to_string(), str::to_string);
    if let Some(c) = schema.get("const") {
        out.push(text(c));
    }
    if let Some(e) = schema.get("enum").and_then(Value::as_array) {
        out.extend(e.iter().filter(|v| !v.is_null()).map(text));
    }
    for key in ["anyOf", "oneOf"] {
        for alt in schema
            .get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            allowed_values(root, alt, out);
        }
    }
}

fn describe_expected(root: &Value, segments: &[String], value: &Value) -> Option<String> {
    let declared = declared_at(root, segments)?;
    let mut allowed = Vec::new();
    allowed_values(root, declared, &mut allowed);
    let mut parts = Vec::new();
    if !allowed.is_empty() {
        parts.push(format!("expected one of: {}", allowed.join(", ")));
        let refs: Vec<&str> = allowed.iter().map(String::as_str).collect();
        if let Some(s) = value.as_str().and_then(|v| closest(v, &refs)) {
            parts.push(format!("did you mean `{s}`?"));
        }
    } else if let Some(t) = resolve_ref(root, declared).get("type") {
        let t = t.as_str().map_or_else(|| t.to_string(), str::to_string);
        parts.push(format!("expected {t}"));
    }
    if let Some(d) = declared.get("description").and_then(Value::as_str) {
        parts.push(format!(
            "`{}`: {}",
            segments.last().map_or("config", |s| s),
            d.replace('\n', " ")
        ));
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// A plugin's published config schema (its exported schema with a title).
pub(crate) fn plugin_schema(meta: &Meta) -> Value {
    let mut schema = match &meta.config_schema {
        Value::Object(o) => o.clone(),
        _ => Map::new(),
    };
    schema.insert("title".into(), json!(format!("{} config", meta.name)));
    if !meta.description.is_empty() {
        schema.insert("description".into(), json!(meta.description));
    }
    Value::Object(schema)
}

/// The manifest schema: entries, groups, and per known plugin its config schema.
pub(crate) fn manifest_schema(plugins: &[Meta]) -> Value {
    let mut defs = Map::new();
    let mut per_plugin = Vec::new();
    for meta in plugins {
        let prefix = format!("{}__", meta.name);
        let mut schema = plugin_schema(meta);
        let nested = schema
            .as_object_mut()
            .and_then(|o| o.remove("$defs"))
            .and_then(|d| d.as_object().cloned())
            .unwrap_or_default();
        rewrite_refs(&mut schema, &prefix);
        for (name, mut def) in nested {
            rewrite_refs(&mut def, &prefix);
            defs.insert(format!("{prefix}{name}"), def);
        }
        if let Some(o) = schema.as_object_mut() {
            o.remove("$schema");
        }
        defs.insert(format!("{}__config", meta.name), schema);
        per_plugin.push(json!({
            "if": {
                "properties": { "name": { "enum": [meta.name, format!("@deepseek-ai/{}", meta.name)] } },
                "required": ["name"]
            },
            "then": { "properties": { "config": { "$ref": format!("#/$defs/{}__config", meta.name) } } }
        }));
    }
    let names: Vec<Value> = plugins.iter().map(|m| json!(m.name)).collect();
    let mut all_of = vec![json!({
        "if": { "properties": { "group": { "const": true } }, "required": ["group"] },
        "then": { "properties": { "config": { "type": "array", "items": { "$ref": "#/$defs/entry" } } } },
        "else": { "required": ["name"], "properties": { "config": { "type": ["object", "null"] } } }
    })];
    all_of.extend(per_plugin);
    defs.insert(
        "entry".into(),
        json!({
            "type": "object",
            "description": "One plugin entry, or a group of entries.",
            "properties": {
                "name": {
                    "type": "string",
                    "description": "The plugin to load (`dsh-fs-sandbox` or the scoped `@deepseek-ai/dsh-fs-sandbox`).",
                    "examples": names
                },
                "id": { "type": "string", "description": "Stable identity; defaults to the name; required when a plugin appears twice." },
                "config": { "description": "The plugin's config (for a group: the list of child entries)." },
                "disabled": { "type": "boolean", "description": "Listed but not loaded (a disabled group disables its children)." },
                "group": { "type": "boolean", "description": "This entry is a group; `config` is its list of child entries." },
                "path": { "type": "string", "description": "An explicit library file, relative to cordis.yml." },
                "isolate": { "enum": ["process", "none"], "description": "`process`: the entry runs in a process of its own, so its crash or hang costs only its own calls (default `none`: in the host's process)." },
                "callTimeout": { "type": "string", "pattern": "^[0-9]+[smhd]$", "description": "For an isolated entry: the longest one call may take before its process is killed and restarted, e.g. `30s`, `15m` (default 15m)." },
                "memoryMib": { "type": "integer", "minimum": 16, "description": "For an isolated entry: the most memory its process may allocate, in MiB (`RLIMIT_DATA`: heap and private mappings; inherited by the processes it starts); an allocation past it ends the process, which restarts (default: no limit)." }
            },
            "additionalProperties": false,
            "allOf": all_of
        }),
    );
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "cordis.yml",
        "description": "A cordis composition: a list of plugin entries.",
        "type": ["array", "null"],
        "items": { "$ref": "#/$defs/entry" },
        "$defs": Value::Object(defs)
    })
}

fn rewrite_refs(value: &mut Value, prefix: &str) {
    match value {
        Value::Object(o) => {
            for (k, v) in o.iter_mut() {
                if k == "$ref" {
                    if let Some(r) = v.as_str().and_then(|r| r.strip_prefix("#/$defs/")) {
                        *v = json!(format!("#/$defs/{prefix}{r}"));
                    }
                } else {
                    rewrite_refs(v, prefix);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| rewrite_refs(v, prefix)),
        _ => {}
    }
}

/// The files `schemas/` must hold for `plugins`: name → pretty JSON text.
pub fn generate(plugins: &[Meta]) -> BTreeMap<String, String> {
    let mut files = BTreeMap::new();
    let pretty = |v: &Value| {
        let mut s = serde_json::to_string_pretty(v).unwrap_or_default();
        s.push('\n');
        s
    };
    for meta in plugins {
        files.insert(
            format!("{}.schema.json", meta.name),
            pretty(&plugin_schema(meta)),
        );
    }
    files.insert(
        MANIFEST_SCHEMA.to_string(),
        pretty(&manifest_schema(plugins)),
    );
    files
}

/// Writes the generated files atomically (temp + rename) and removes stale schema files.
pub fn write(dir: &Path, files: &BTreeMap<String, String>) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    for (name, text) in files {
        let path = dir.join(name);
        if std::fs::read_to_string(&path).ok().as_deref() == Some(text.as_str()) {
            continue;
        }
        let tmp = dir.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, &path)?;
        written.push(path);
    }
    for stale in stale_files(dir, files) {
        std::fs::remove_file(&stale)?;
        written.push(stale);
    }
    Ok(written)
}

fn stale_files(dir: &Path, files: &BTreeMap<String, String>) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.ends_with(".schema.json") && !files.contains_key(name)
        })
        .collect()
}

/// The files in `dir` that differ from `files` (missing, changed, or extra).
pub fn check(dir: &Path, files: &BTreeMap<String, String>) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = files
        .iter()
        .filter(|(name, text)| {
            std::fs::read_to_string(dir.join(name)).ok().as_deref() != Some(text.as_str())
        })
        .map(|(name, _)| dir.join(name))
        .collect();
    out.extend(stale_files(dir, files));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read_schema() -> String {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "offset": {"type": ["integer", "null"], "minimum": 0},
                "edits": {"type": "array", "items": {
                    "type": "object",
                    "properties": {"old_string": {"type": "string"}},
                    "required": ["old_string"]
                }}
            },
            "required": ["path"],
            "additionalProperties": false
        })
        .to_string()
    }

    #[test]
    fn arguments_that_match_pass_and_each_violation_is_placed_at_its_argument() {
        let args = ToolArgs::compile(&read_schema()).expect("compiles");
        assert_eq!(args.check(&json!({"path": "a.txt", "offset": 3})), Ok(()));
        let wrong = args.check(&json!({"path": 42})).unwrap_err();
        assert!(
            wrong.starts_with("`path`: 42 is not of type \"string\""),
            "{wrong}"
        );
        let nested = args
            .check(&json!({"path": "a", "edits": [{"old_string": 1}]}))
            .unwrap_err();
        assert!(nested.starts_with("`edits[0].old_string`: "), "{nested}");
        let missing = args.check(&json!({})).unwrap_err();
        assert!(
            missing.starts_with("\"path\" is a required property"),
            "{missing}"
        );
        let unknown = args.check(&json!({"path": "a", "pth": 1})).unwrap_err();
        assert!(unknown.contains("pth"), "{unknown}");
        let not_an_object = args.check(&json!(5)).unwrap_err();
        assert!(
            not_an_object.starts_with("5 is not of type"),
            "{not_an_object}"
        );
    }

    #[test]
    fn many_violations_are_counted_and_a_huge_value_is_cut() {
        let schema = json!({
            "type": "object",
            "additionalProperties": {"type": "integer"}
        })
        .to_string();
        let args = ToolArgs::compile(&schema).expect("compiles");
        let many: serde_json::Map<String, Value> =
            (0..9).map(|i| (format!("k{i}"), json!("x"))).collect();
        let out = args.check(&Value::Object(many)).unwrap_err();
        assert_eq!(
            out.matches("is not of type").count(),
            NAMED_VIOLATIONS,
            "{out}"
        );
        assert!(out.ends_with("; and 4 more"), "{out}");
        let huge = args.check(&json!({"k": "y".repeat(100_000)})).unwrap_err();
        assert!(huge.len() < 2 * VIOLATION_CHARS, "{} chars", huge.len());
    }

    #[test]
    fn a_schema_that_is_not_one_is_refused_with_the_reason() {
        let e = ToolArgs::compile("{").err().expect("not JSON");
        assert!(e.starts_with("it is not JSON"), "{e}");
        let e = ToolArgs::compile(r#"{"type": 5}"#)
            .err()
            .expect("not a schema");
        assert!(e.starts_with("it is not a valid JSON Schema"), "{e}");
    }
}
