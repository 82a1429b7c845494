//! `cordis new`: a new plugin crate.

use std::path::PathBuf;
use std::process::ExitCode;

pub(crate) fn new_plugin(
    name: String,
    path: Option<PathBuf>,
    sdk_path: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    use cordis_cli::scaffold::{entry, scaffold, NewPlugin, BUILT_SDK_PATH};
    let made = scaffold(&NewPlugin {
        dir: path.unwrap_or_else(|| PathBuf::from(&name)),
        sdk: sdk_path.unwrap_or_else(|| PathBuf::from(BUILT_SDK_PATH)),
        target_dir: std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from),
        name: name.clone(),
    })?;
    let dir = made.dir.display();
    println!(
        "created plugin crate `{name}` in {dir}: {}",
        made.files.join(", ")
    );
    println!(
        "\nto compose it elsewhere, add this entry to that cordis.yml:\n\n{}",
        entry(&name, &made.library.display().to_string())
    );
    println!(
        "next:\n  cd {dir}\n  cargo build\n  cordis check\n  cordis call {} '{{\"name\": \"Ada\"}}'\n  cargo test",
        made.tool
    );
    Ok(ExitCode::SUCCESS)
}
