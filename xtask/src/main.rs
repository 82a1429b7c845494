//! Development commands, run as `cargo xtask <command>`:
//! - `run`: build the host and every plugin, then `cordis run` on the bundled `cordis.yml`;
//! - `test`: set up the Python MCP client, then run every test (unit, end-to-end, MCP,
//!   doc tests) and the schema check;
//! - `schema [--check]`: regenerate `schemas/` from the workspace's plugins (or check it).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("run") => run(&args[1..]),
        Some("test") => test(),
        Some("schema") => schema(args.get(1).map(String::as_str) == Some("--check")),
        _ => Err(
            "usage: cargo xtask run [cordis run flags] | cargo xtask test | cargo xtask schema [--check]"
                .to_string(),
        ),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(root());
    cmd
}

fn status(mut cmd: Command, what: &str) -> Result<(), String> {
    eprintln!("xtask: {what}");
    let status = cmd
        .status()
        .map_err(|e| format!("cannot start {what}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{what} failed ({status})"))
    }
}

fn build_all() -> Result<(), String> {
    let mut cmd = cargo();
    cmd.args(["build", "--workspace", "--lib", "--bins"]);
    status(cmd, "cargo build --workspace --lib --bins")
}

fn run(extra: &[String]) -> Result<(), String> {
    build_all()?;
    let mut cmd = Command::new(root().join("target/debug/cordis"));
    cmd.current_dir(root())
        .args(["run", "-c", "cordis.yml"])
        .args(extra);
    status(cmd, "cordis run -c cordis.yml")
}

/// The venv with the MCP client the end-to-end MCP tests use (`.venv`, git-ignored).
fn python_env() -> Result<PathBuf, String> {
    let venv = root().join(".venv");
    let python = venv.join("bin/python");
    if !python.exists() {
        let mut cmd = Command::new("python3");
        cmd.args(["-m", "venv"]).arg(&venv);
        status(cmd, "python3 -m venv .venv")?;
    }
    let mut cmd = Command::new(&python);
    cmd.args(["-m", "pip", "install", "--quiet", "-r"])
        .arg(root().join("tests/mcp/requirements.txt"));
    status(cmd, "pip install -r tests/mcp/requirements.txt")?;
    Ok(python)
}

fn test() -> Result<(), String> {
    let python = python_env()?;
    schema(true)?;
    let nextest = cargo()
        .args(["nextest", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if nextest {
        // nextest does not run doc tests.
        let mut cmd = cargo();
        cmd.args(["test", "--workspace", "--doc"]);
        status(cmd, "doc tests")?;
    }
    let mut cmd = cargo();
    if nextest {
        cmd.args(["nextest", "run", "--workspace", "--no-fail-fast"]);
    } else {
        cmd.args(["test", "--workspace", "--no-fail-fast"]);
    }
    cmd.env("CORDIS_TEST_PYTHON", &python);
    status(cmd, "the test suite")
}

/// The workspace's plugins (not test fixtures): `plugins/*` crates built as cdylibs.
fn workspace_plugins() -> Result<Vec<String>, String> {
    let dir = root().join("plugins");
    let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut names = Vec::new();
    for entry in entries.flatten() {
        let manifest = entry.path().join("Cargo.toml");
        let Ok(text) = std::fs::read_to_string(&manifest) else {
            continue;
        };
        if !text.contains("\"cdylib\"") {
            continue;
        }
        let name = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("name = \""))
            .and_then(|rest| rest.strip_suffix('"'))
            .ok_or_else(|| format!("{}: no package name", manifest.display()))?;
        names.push(name.to_string());
    }
    names.sort();
    Ok(names)
}

fn schema(check: bool) -> Result<(), String> {
    build_all()?;
    let mut cmd = Command::new(root().join("target/debug/cordis"));
    cmd.current_dir(root())
        .arg("schema")
        .arg(if check { "--check" } else { "--write" })
        .args(workspace_plugins()?);
    status(
        cmd,
        if check {
            "cordis schema --check"
        } else {
            "cordis schema --write"
        },
    )
}
