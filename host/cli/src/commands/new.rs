//! `cordis new`: a new plugin crate.

use std::path::PathBuf;
use std::process::ExitCode;

pub(crate) fn new_plugin(
    name: String,
    path: Option<PathBuf>,
    sdk_path: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    use cordis_cli::scaffold::{
        entry, scaffold, Membership, NewPlugin, LIGHT_PROFILE, SDK_VERSION,
    };
    let made = scaffold(&NewPlugin {
        dir: path.unwrap_or_else(|| PathBuf::from(&name)),
        sdk: sdk_path,
        target_dir: std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from),
        name: name.clone(),
    })?;
    let dir = made.dir.display();
    println!(
        "created plugin crate `{name}` in {dir}: {}",
        made.files.join(", ")
    );
    match &made.workspace {
        Membership::Alone => {}
        Membership::Member {
            root,
            path,
            added,
            dev_profile,
        } => {
            println!(
                "a member of the workspace at {}{}; it builds into that workspace's target directory",
                root.display(),
                if *added {
                    format!(" (`{path}` added to `members` in its Cargo.toml)")
                } else {
                    String::new()
                }
            );
            if !dev_profile {
                println!(
                    "tip: the workspace sets no `[profile.dev]`; for test builds about half the size and faster, add to {}:{LIGHT_PROFILE}",
                    root.join("Cargo.toml").display()
                );
            }
        }
        Membership::Excluded { root } => println!(
            "note: the workspace at {} excludes {dir}, so the crate is a workspace of its own",
            root.display()
        ),
    }
    if made.sdk.is_none() {
        println!(
            "`cordis-sdk` and `cordis-test` {SDK_VERSION} come from the registry (there are no SDK sources beside this cordis; `--sdk-path` names a checkout's `plugins/sdk` to use by path)"
        );
    }
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
