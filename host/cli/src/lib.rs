//! The front-ends of the `cordis` binary over [`cordis_engine`]: the MCP server ([`mcp`],
//! over stdio and, with [`http`], over Streamable HTTP),
//! the watcher that hot-reloads ([`watch`]), the `--dev` build loop ([`dev`]), a running
//! host's status file ([`status`]), `cordis new` ([`scaffold`]), an isolated entry's confinement ([`isolated`]), `cordis plugin`
//! ([`plugins`]) and every code `cordis check --explain` explains ([`codes`]). A library
//! only so the end-to-end tests, the benchmarks and the fuzz targets drive the same code;
//! not an API.

pub mod cargo;
pub mod codes;
pub mod dev;
pub mod http;
pub mod isolated;
pub mod mcp;
pub mod metrics;
pub mod operator;
mod outbound;
pub mod plugins;
pub mod scaffold;
pub mod status;
pub mod traces;
pub mod watch;
