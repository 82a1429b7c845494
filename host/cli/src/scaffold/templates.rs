//! The files `cordis new` writes, from templates: `Cargo.toml`, `src/lib.rs`,
//! `tests/plugin.rs`, `README.md` and `cordis.yml`.

/// The names derived from the crate name.
pub(super) struct Names {
    /// `my-plugin`.
    pub(super) krate: String,
    /// `MyPlugin`.
    pub(super) camel: String,
    /// The provided service's registry name: `myPlugin`.
    pub(super) service: String,
    /// The tool: `my_plugin_greet`.
    pub(super) tool: String,
}

impl Names {
    pub(super) fn new(name: &str) -> Self {
        let words: Vec<&str> = name.split(['-', '_']).filter(|w| !w.is_empty()).collect();
        let cap = |w: &str| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        };
        let camel: String = words.iter().map(|w| cap(w)).collect();
        let service = words
            .iter()
            .enumerate()
            .map(|(i, w)| if i == 0 { w.to_string() } else { cap(w) })
            .collect();
        Names {
            krate: name.to_string(),
            camel,
            service,
            tool: format!("{}_greet", words.join("_")),
        }
    }
}

/// `text` escaped for a basic TOML string.
fn toml_string(text: &str) -> String {
    text.replace('\\', "\\\\").replace('"', "\\\"")
}

/// Where the new crate's `cordis-sdk` and `cordis-test` come from.
pub(super) enum SdkDeps {
    /// By path, as written (relative to the crate's directory where possible).
    Path {
        /// The `cordis-sdk` crate directory.
        sdk: String,
        /// The `cordis-test` crate directory.
        test: String,
    },
    /// From the registry, at this version.
    Version(&'static str),
}

/// Debug info settings for lighter test builds (a workspace root's; a member's profiles
/// are ignored): line tables for the workspace's crates, none for dependencies. Halves
/// the target directory and shortens the first `cargo test` (README: "Plugin authors").
pub const LIGHT_PROFILE: &str = r#"
# Lighter builds: line tables (file:line in backtraces) for this crate, no debug info for
# its dependencies.
[profile.dev]
debug = "line-tables-only"

[profile.dev.package."*"]
debug = false
"#;

/// The plugin crate's `Cargo.toml`; `standalone` gives it its own (empty) `[workspace]`
/// and the light profile.
pub(super) fn cargo_toml(n: &Names, deps: &SdkDeps, standalone: bool) -> String {
    let (sdk, test) = match deps {
        SdkDeps::Path { sdk, test } => (
            format!("{{ path = \"{}\" }}", toml_string(sdk)),
            format!("{{ path = \"{}\" }}", toml_string(test)),
        ),
        SdkDeps::Version(v) => (format!("\"{v}\""), format!("\"{v}\"")),
    };
    let workspace = if standalone {
        format!("\n# Not part of any enclosing workspace.\n[workspace]\n{LIGHT_PROFILE}")
    } else {
        String::new()
    };
    format!(
        r#"[package]
name = "{krate}"
version = "0.1.0"
edition = "2021"
description = "A cordis plugin: provides the `{service}` service and the `{tool}` tool"
publish = false

# A plugin is a dynamic library the cordis host loads; the rlib lets tests use its types.
[lib]
crate-type = ["cdylib", "rlib"]

[dependencies]
cordis-sdk = {sdk}
schemars = "1"
serde = {{ version = "1", features = ["derive"] }}
serde_json = "1"
tracing = "0.1"

[dev-dependencies]
cordis-test = {test}
{workspace}"#,
        krate = n.krate,
        service = n.service,
        tool = n.tool,
    )
}

pub(super) fn lib_rs(n: &Names) -> String {
    TEMPLATE_LIB
        .replace("{krate}", &n.krate)
        .replace("{camel}", &n.camel)
        .replace("{service}", &n.service)
        .replace("{tool}", &n.tool)
}

const TEMPLATE_LIB: &str = r#"//! `{krate}`: a cordis plugin that provides the `{service}` service and registers the
//! `{tool}` tool.

use cordis_sdk::prelude::*;

cordis_sdk::interface! {
    /// Greets people. Another plugin uses it by declaring
    /// `.injects::<GreeterClient>("{service}")`; once one does, move this declaration to a
    /// small seam crate (an rlib) that both plugins depend on.
    pub trait Greeter as GreeterClient ("{krate}.greeter", 1) {
        /// A greeting for `name`.
        fn greet(&self, name: String) -> String;
    }
}

/// The registry name of the service this plugin provides.
pub const SERVICE: &str = "{service}";

/// The config, as written under `config:` in `cordis.yml`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    /// The greeting word.
    #[serde(default = "default_word")]
    pub word: String,
}

fn default_word() -> String {
    "hello".into()
}

/// The arguments of `{tool}`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GreetArgs {
    /// Who to greet.
    pub name: String,
}

#[derive(Clone)]
struct Words {
    word: String,
}

impl Greeter for Words {
    fn greet(&self, name: String) -> Result<String> {
        if name.trim().is_empty() {
            return Err(Error::invalid("`name` must not be empty")
                .with_help("pass a name, e.g. {\"name\": \"Ada\"}"));
        }
        Ok(format!("{}, {name}!", self.word))
    }
}

/// The plugin.
pub struct {camel}Plugin;

impl Plugin for {camel}Plugin {
    type Config = Config;

    fn metadata() -> Metadata {
        Metadata::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION"))
            .description("greets people")
            .provides::<GreeterClient>(SERVICE)
            .tool("{tool}")
    }

    fn apply(ctx: &mut Context<'_>, config: Config) -> Result<Self> {
        let words = Words { word: config.word };
        ctx.provide(SERVICE, GreeterClient::serve(words.clone()))?;
        // The input schema comes from `GreetArgs`; the host checks every call's arguments
        // against it before the handler runs.
        ctx.register_typed_tool(
            Tool::typed::<GreetArgs>("{tool}", "Greets someone by name"),
            ToolOptions::default(),
            move |_call, args: GreetArgs| match words.greet(args.name) {
                Ok(text) => Ok(ToolResult::ok(text)),
                // A refusal the model should see is an error *result*, not a failure.
                Err(e) => Ok(ToolResult::error(e.message)),
            },
        )?;
        tracing::info!("ready");
        ctx.on_dispose(|| tracing::info!("disposed"));
        Ok({camel}Plugin)
    }
}

cordis_sdk::export_plugin!({camel}Plugin);
"#;

pub(super) fn test_rs(n: &Names) -> String {
    TEMPLATE_TEST
        .replace("{krate_ident}", &n.krate.replace('-', "_"))
        .replace("{tool}", &n.tool)
}

const TEMPLATE_TEST: &str = r#"//! Tests of the plugin as the cordis host runs it: `cordis-test` builds this crate's
//! library, loads it through the host's loader, applies it and calls its tool and service.

use cordis_test::{PluginUnderTest, ToolResult};
use serde_json::json;
use {krate_ident}::{Greeter, GreeterClient, SERVICE};

fn plugin() -> PluginUnderTest {
    PluginUnderTest::build(env!("CARGO_MANIFEST_DIR")).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn the_tool_greets() {
    let started = plugin()
        .config(json!({ "word": "hi" }))
        .start()
        .unwrap_or_else(|e| panic!("{e}"));
    let result = started.call_tool("{tool}", json!({ "name": "Ada" })).unwrap();
    assert_eq!(result, ToolResult::ok("hi, Ada!"));
    let result = started.call_tool("{tool}", json!({ "name": "" })).unwrap();
    assert!(result.is_error, "an empty name is refused: {result:?}");
    // The host checks the arguments against the tool's schema: the tool never sees these.
    let result = started.call_tool("{tool}", json!({ "name": 5 })).unwrap();
    assert!(result.is_error && result.text.contains("INVALID_ARGUMENT"), "{result:?}");
}

#[test]
fn the_service_greets() {
    let started = plugin().start().unwrap_or_else(|e| panic!("{e}"));
    let greeter = started.service::<GreeterClient>(SERVICE).unwrap();
    assert_eq!(greeter.greet("Grace".into()).unwrap(), "hello, Grace!");
}

#[test]
fn an_unknown_config_key_is_refused() {
    let err = plugin()
        .config(json!({ "wrod": "hi" }))
        .start()
        .expect_err("a misspelt key must be refused");
    assert!(err.to_string().contains("wrod"), "{err}");
}
"#;

pub(super) fn readme(n: &Names) -> String {
    format!(
        r#"# {krate}

A cordis plugin. It provides the `{service}`
service (interface `{krate}.greeter` v1) and registers the `{tool}` tool.

    cargo build                                   # builds the plugin library
    cordis check                                  # loads it with ./cordis.yml
    cordis call {tool} '{{"name": "Ada"}}'       # calls the tool once
    cordis run                                    # serves it over MCP; rebuilds are reloaded
    cargo test                                    # tests/plugin.rs, through the real host loader

`src/lib.rs` is the plugin: its config (`Config`, written under `config:` in
`cordis.yml`), the service it provides and the tool it registers. `tests/plugin.rs` tests
it with `cordis-test`, without a manifest or a server.
"#,
        krate = n.krate,
        service = n.service,
        tool = n.tool,
    )
}

pub(super) fn cordis_yml(n: &Names, path: &str) -> String {
    format!(
        "# A composition with just this plugin; `cordis check` and `cordis run` read it.\n{}",
        entry(&n.krate, path)
    )
}

/// The `cordis.yml` entry that loads plugin `name` from `path`.
pub fn entry(name: &str, path: &str) -> String {
    format!("- name: {name}\n  config:\n    word: hello\n  path: {path}\n")
}
