//! An example plugin: provides the `greeter` service (interface from `cordis-example-api`)
//! and registers a `greet` tool. Copy this crate to start a plugin of your own.

use cordis_example_api::{Greeter, GreeterClient};
use cordis_sdk::prelude::*;

/// The config under `config:` in `cordis.yml`.
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

struct Words {
    word: String,
}

impl Greeter for Words {
    fn greet(&self, name: String) -> Result<String> {
        if name.is_empty() {
            return Err(Error::invalid("name must not be empty"));
        }
        Ok(format!("{}, {name}", self.word))
    }
}

/// The plugin.
pub struct ExamplePlugin;

impl Plugin for ExamplePlugin {
    type Config = Config;

    fn metadata() -> Metadata {
        Metadata::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION"))
            .description("greets people")
            .provides::<GreeterClient>("greeter")
            .tool("greet")
    }

    fn apply(ctx: &mut Context<'_>, config: Config) -> Result<Self> {
        ctx.provide(
            "greeter",
            GreeterClient::serve(Words {
                word: config.word.clone(),
            }),
        )?;
        let word = config.word;
        ctx.register_tool(
            Tool {
                name: "greet".into(),
                description: "Greets someone by name".into(),
                input_schema: serde_json::json!({
                    "type": "object",
                    "properties": { "name": { "type": "string", "description": "who to greet" } },
                    "required": ["name"],
                    "additionalProperties": false,
                }),
            },
            move |_call, args| {
                let Some(name) = args.get("name").and_then(|n| n.as_str()) else {
                    return Ok(ToolResult::error("`name` (a string) is required"));
                };
                Ok(ToolResult::ok(format!("{word}, {name}")))
            },
        )?;
        tracing::info!(entry = %ctx.entry_id(), "greeter ready");
        ctx.on_dispose(|| tracing::info!("greeter disposed"));
        Ok(ExamplePlugin)
    }
}

cordis_sdk::export_plugin!(ExamplePlugin);
