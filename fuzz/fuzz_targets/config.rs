//! Fuzz target `config`: a plugin config (YAML or JSON, a mapping as under `config:` in
//! `cordis.yml`) → `validate_config` against one bundled plugin's published config
//! schema (`schemas/<plugin>.schema.json`, chosen by the first input byte modulo 8: the
//! ASCII digits `0`…`7` pick the plugins in alphabetical order) → every diagnostic
//! rendered with the config text as its source.

#![no_main]

use std::path::Path;
use std::sync::OnceLock;

use cordis_engine::{parse_yaml, validate_config, Entry, Pos, YamlValue as Yaml};
use libfuzzer_sys::fuzz_target;

const SCHEMAS: &[(&str, &str)] = &[
    (
        "cordis-example",
        include_str!("../../schemas/cordis-example.schema.json"),
    ),
    (
        "dsh-bash-local",
        include_str!("../../schemas/dsh-bash-local.schema.json"),
    ),
    (
        "dsh-bash-sandbox",
        include_str!("../../schemas/dsh-bash-sandbox.schema.json"),
    ),
    (
        "dsh-fs-local",
        include_str!("../../schemas/dsh-fs-local.schema.json"),
    ),
    (
        "dsh-fs-sandbox",
        include_str!("../../schemas/dsh-fs-sandbox.schema.json"),
    ),
    (
        "dsh-sandbox-policy",
        include_str!("../../schemas/dsh-sandbox-policy.schema.json"),
    ),
    (
        "dsh-tool-bash",
        include_str!("../../schemas/dsh-tool-bash.schema.json"),
    ),
    (
        "dsh-tool-fs",
        include_str!("../../schemas/dsh-tool-fs.schema.json"),
    ),
];

fn schemas() -> &'static [(&'static str, serde_json::Value)] {
    static PARSED: OnceLock<Vec<(&str, serde_json::Value)>> = OnceLock::new();
    PARSED.get_or_init(|| {
        SCHEMAS
            .iter()
            .map(|(name, text)| (*name, serde_json::from_str(text).expect("a JSON schema")))
            .collect()
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let Ok(node) = parse_yaml(text) else {
        return;
    };
    // The manifest hands only mappings to validation (anything else is `config-type`).
    if !matches!(node.value, Yaml::Map(_)) {
        return;
    }
    let (plugin, schema) = &schemas()[usize::from(pick) % SCHEMAS.len()];
    let entry = Entry {
        id: "fuzzed".to_string(),
        plugin: plugin.to_string(),
        path: None,
        config: node.to_json(),
        pos: Pos { line: 1, col: 1 },
        config_node: Some(node),
        disabled: false,
        isolate: None,
    };
    for d in validate_config(&entry, schema) {
        let text = d.render(Path::new("config.yml"), Some(text));
        assert!(text.starts_with(&format!("error[{}]: ", d.code)), "{text}");
    }
});
