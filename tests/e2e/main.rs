//! The end-to-end tests: one test binary, a module per area, so a test build links the
//! host, the engine and the SDK once (cargo's, rust-analyzer's and nushell's layout).
//! Each module says what it covers; the harness they share is `cordis_e2e` (`support/`).

mod confine;
mod diagnostics;
mod doctor;
mod durability;
mod fs;
mod harness;
mod host;
mod install;
mod isolate;
mod mcp;
mod protect;
mod reload;
mod retention;
mod scaffold;
mod shell;
mod tier;
mod tools;
