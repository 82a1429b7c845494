//! `cargo xtask dist`: the release archive `cordis-<version>-<target>.tar.gz`, laid out as
//! an installation prefix that works wherever it is extracted:
//!
//! ```text
//! cordis-<version>-<target>/
//!   bin/cordis
//!   lib/cordis/plugins/lib*.so            the bundled plugins (found by bin/cordis)
//!   share/cordis/cordis.yml               the bundled composition
//!   share/cordis/apparmor/cordis          the AppArmor profile granting `userns`
//!   share/cordis/schemas/                 the manifest's and the bundled plugins' schemas
//!                                         (the manifest's `$schema` is relative)
//!   share/man/man1/cordis.1
//!   share/bash-completion/completions/cordis
//!   share/zsh/site-functions/_cordis
//!   share/fish/vendor_completions.d/cordis.fish
//!   README.md LICENSE-MIT LICENSE-APACHE
//! ```

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{cargo, root, status, workspace_plugins_in};

/// Options: `--profile release|dev` (default release), `--no-build` (assemble what the
/// profile's output directory holds), `--out-dir DIR` (default `target/dist`).
pub fn dist(args: &[String]) -> Result<(), String> {
    let mut profile = "release".to_string();
    let mut build = true;
    let mut out_dir = root().join("target/dist");
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--profile" => profile = args.next().ok_or("--profile needs a value")?.clone(),
            "--no-build" => build = false,
            "--out-dir" => out_dir = PathBuf::from(args.next().ok_or("--out-dir needs a value")?),
            other => {
                return Err(format!(
                    "dist: unknown argument `{other}` (usage: cargo xtask dist [--profile release|dev] [--no-build] [--out-dir DIR])"
                ))
            }
        }
    }
    let plugins = workspace_plugins_in(&["plugins/bundled"])?;
    if build {
        let mut cmd = cargo();
        cmd.args(["build", "--profile", &profile, "-p", "cordis"])
            .args(plugins.iter().flat_map(|p| ["-p", p.as_str()]));
        status(
            cmd,
            &format!("cargo build --profile {profile} of cordis and the bundled plugins"),
        )?;
    }
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"));
    let built = target_dir.join(if profile == "dev" { "debug" } else { &profile });
    let cordis = built.join("cordis");
    let version = output(Command::new(&cordis).arg("--version"))?
        .trim()
        .strip_prefix("cordis ")
        .ok_or("`cordis --version` does not say `cordis <version>`")?
        .to_string();
    let host = output(Command::new("rustc").arg("-vV"))?
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .ok_or("`rustc -vV` names no host target")?
        .to_string();
    let name = format!("cordis-{version}-{host}");
    let stage = out_dir.join(&name);
    if stage.exists() {
        std::fs::remove_dir_all(&stage).map_err(|e| format!("{}: {e}", stage.display()))?;
    }
    let copy = |from: &Path, to: &str| -> Result<(), String> {
        let to = stage.join(to);
        std::fs::create_dir_all(to.parent().expect("a file in the stage"))
            .and_then(|()| std::fs::copy(from, &to))
            .map(drop)
            .map_err(|e| format!("cannot copy {} to {}: {e}", from.display(), to.display()))
    };
    copy(&cordis, "bin/cordis")?;
    for plugin in &plugins {
        let file = format!("lib{}.so", plugin.replace('-', "_"));
        copy(&built.join(&file), &format!("lib/cordis/plugins/{file}"))?;
    }
    copy(&root().join("cordis.yml"), "share/cordis/cordis.yml")?;
    copy(
        &root().join("deploy/apparmor/cordis"),
        "share/cordis/apparmor/cordis",
    )?;
    let schemas = root().join("schemas");
    for entry in std::fs::read_dir(&schemas).map_err(|e| format!("{}: {e}", schemas.display()))? {
        let path = entry.map_err(|e| e.to_string())?.path();
        let file = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        // The manifest's schema and the bundled plugins' (not the examples').
        let bundled = plugins.iter().any(|p| file == format!("{p}.schema.json"));
        if bundled || file == "cordis.schema.json" {
            copy(&path, &format!("share/cordis/schemas/{file}"))?;
        }
    }
    for file in ["README.md", "LICENSE-MIT", "LICENSE-APACHE"] {
        copy(&root().join(file), file)?;
    }
    // The man page and the completions come from the staged binary's own CLI definition.
    let staged = stage.join("bin/cordis");
    let generated = [
        (vec!["man"], "share/man/man1/cordis.1"),
        (
            vec!["completions", "bash"],
            "share/bash-completion/completions/cordis",
        ),
        (
            vec!["completions", "zsh"],
            "share/zsh/site-functions/_cordis",
        ),
        (
            vec!["completions", "fish"],
            "share/fish/vendor_completions.d/cordis.fish",
        ),
    ];
    for (args, to) in generated {
        let text = output(Command::new(&staged).args(&args))?;
        let to = stage.join(to);
        std::fs::create_dir_all(to.parent().expect("a file in the stage"))
            .and_then(|()| std::fs::write(&to, text))
            .map_err(|e| format!("cannot write {}: {e}", to.display()))?;
    }
    let archive = out_dir.join(format!("{name}.tar.gz"));
    let mut tar = Command::new("tar");
    tar.arg("--owner=0")
        .arg("--group=0")
        .arg("-czf")
        .arg(&archive)
        .arg("-C")
        .arg(&out_dir)
        .arg(&name);
    status(tar, &format!("tar -czf {}", archive.display()))?;
    println!("{}", archive.display());
    Ok(())
}

/// The standard output of `cmd`, which must succeed.
fn output(cmd: &mut Command) -> Result<String, String> {
    let what = format!("{cmd:?}");
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {what}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim_end()
        ));
    }
    String::from_utf8(out.stdout).map_err(|_| format!("{what} printed something not UTF-8"))
}
