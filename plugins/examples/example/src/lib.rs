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

/// The arguments of the `greet` tool.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GreetArgs {
    /// Who to greet.
    pub name: String,
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
        // The input schema comes from `GreetArgs`; the host checks every call's arguments
        // against it before the handler runs.
        ctx.register_typed_tool(
            Tool::typed::<GreetArgs>("greet", "Greets someone by name"),
            ToolOptions::default(),
            move |_call, args: GreetArgs| Ok(ToolResult::ok(format!("{word}, {}", args.name))),
        )?;
        tracing::info!(entry = %ctx.entry_id(), "greeter ready");
        ctx.on_dispose(|| tracing::info!("greeter disposed"));
        Ok(ExamplePlugin)
    }
}

cordis_sdk::export_plugin!(ExamplePlugin);
