//! Development commands, run as `cargo xtask <command>`:
//! - `run`: build the host and every plugin, then `cordis run` on the bundled `cordis.yml`;
//! - `test`: set up the Python MCP client, then run every test (unit, end-to-end, MCP,
//!   doc tests) and the schema check;
//! - `schema [--check]`: regenerate `schemas/` from the workspace's plugins (or check it);
//! - `mutants [GROUP...]`: mutation testing of the security crates (`cargo mutants`), the
//!   result summed up in `target/mutants/summary.txt` (see `docs/mutants.md`).
//! - `fuzz [SECONDS]`: run every cargo-fuzz target in `fuzz/` for SECONDS each (default
//!   30), starting from its seeds; fails when a target crashes.
//! - `dist [--profile release|dev] [--no-build] [--out-dir DIR]`: the release archive
//!   `target/dist/cordis-<version>-<target>.tar.gz` (see [`dist`]).

mod dist;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("run") => run(&args[1..]),
        Some("test") => test(),
        Some("schema") => schema(args.get(1).map(String::as_str) == Some("--check")),
        Some("mutants") => mutants(&args[1..]),
        Some("fuzz") => fuzz(args.get(1).map(String::as_str)),
        Some("dist") => dist::dist(&args[1..]),
        _ => Err(
            "usage: cargo xtask run [cordis run flags] | cargo xtask test | cargo xtask schema [--check] | cargo xtask dist [--profile release|dev] [--no-build] [--out-dir DIR] | cargo xtask fuzz [SECONDS] | cargo xtask mutants [GROUP...]"
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

pub(crate) fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

pub(crate) fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(root());
    cmd
}

pub(crate) fn status(mut cmd: Command, what: &str) -> Result<(), String> {
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

/// Debian packages the tests need beyond the Rust toolchain: `python3-venv` for the MCP
/// client's venv, `strace` for the durability tests, `nginx` and `caddy` for the tests of
/// README's proxy recipes (`deploy/`), `curl` and `git` for the network allowlist's,
/// `apparmor` (`apparmor_parser`) for the AppArmor profile's. Installed with apt-get when missing and this runs
/// as root (as CI does); otherwise the error says what to install.
fn system_packages() -> Result<(), String> {
    let works = |program: &str, args: &[&str]| {
        Command::new(program)
            .args(args)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    let mut missing = Vec::new();
    if !works("python3", &["-c", "import venv, ensurepip"]) {
        missing.push("python3-venv");
    }
    if !works("strace", &["-V"]) {
        missing.push("strace");
    }
    if !works("nginx", &["-v"]) && !works("/usr/sbin/nginx", &["-v"]) {
        missing.push("nginx");
    }
    if !works("caddy", &["version"]) {
        missing.push("caddy");
    }
    // The network allowlist's tests: real clients through the proxy.
    if !works("curl", &["--version"]) {
        missing.push("curl");
    }
    if !works("git", &["--version"]) {
        missing.push("git");
    }
    // The AppArmor profile's test parses it.
    if !works("apparmor_parser", &["--version"])
        && !works("/usr/sbin/apparmor_parser", &["--version"])
    {
        missing.push("apparmor");
    }
    if missing.is_empty() {
        return Ok(());
    }
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    if !root || !works("apt-get", &["--version"]) {
        return Err(format!(
            "the tests need {}: install them (e.g. `sudo apt-get install {}`)",
            missing.join(" and "),
            missing.join(" ")
        ));
    }
    let mut update = Command::new("apt-get");
    update.args(["update", "-qq"]);
    status(update, "apt-get update")?;
    let mut install = Command::new("apt-get");
    install
        .args(["install", "-y", "-qq"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive");
    status(install, &format!("apt-get install {}", missing.join(" ")))
}

fn test() -> Result<(), String> {
    system_packages()?;
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
    // The interface crates' stand-ins (feature `testing`, never enabled inside the
    // workspace, so the bundled plugins are built the same way by every command): their
    // documented examples.
    let mut cmd = cargo();
    cmd.args([
        "test",
        "--doc",
        "--features",
        "testing",
        "-p",
        "dsh-fs-api",
        "-p",
        "dsh-sandbox",
        "-p",
        "dsh-shell-api",
    ]);
    status(cmd, "the stand-ins' doc tests")?;
    let mut cmd = cargo();
    if nextest {
        cmd.args(["nextest", "run", "--workspace", "--no-fail-fast"]);
    } else {
        cmd.args(["test", "--workspace", "--no-fail-fast"]);
    }
    cmd.env("CORDIS_TEST_PYTHON", &python);
    status(cmd, "the test suite")
}

/// The workspace's plugins (not test fixtures): the cdylib crates in `plugins/bundled/` and
/// `plugins/examples/`.
fn workspace_plugins() -> Result<Vec<String>, String> {
    workspace_plugins_in(&["plugins/bundled", "plugins/examples"])
}

/// The cdylib crates in the folders `groups`, sorted by name.
pub(crate) fn workspace_plugins_in(groups: &[&str]) -> Result<Vec<String>, String> {
    let mut names = Vec::new();
    for group in groups {
        let dir = root().join(group);
        let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
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

/// One group of `cargo xtask mutants`: what is mutated (`cargo mutants` selection flags)
/// and the tests that cover it beyond its own package's (a nextest filter on the
/// workspace).
struct MutantGroup {
    name: &'static str,
    select: &'static [&'static str],
    covering: &'static str,
}

const MUTANT_GROUPS: &[MutantGroup] = &[
    MutantGroup {
        name: "sandbox",
        select: &["-p", "dsh-sandbox"],
        covering: "package(dsh-sandbox) | test(/^fs::/) | test(/^tools::/)",
    },
    MutantGroup {
        name: "sandbox-policy",
        select: &["-p", "dsh-sandbox-policy"],
        covering: "test(/^tools::/) | test(/^fs::/) | (test(/^reload::/) & test(/session_mode/))",
    },
    MutantGroup {
        name: "fs-core",
        select: &[
            "-p",
            "dsh-fs-core",
            "-F",
            "fenced_target|Target::|is_escape|sandbox_denied|check_path|PathLocks|in split|regular|read_all|list_dir|too_large|in resolve",
        ],
        covering: "package(dsh-fs-core) | test(/^fs::/) | test(/^tools::/) | test(/^durability::/)",
    },
    MutantGroup {
        name: "tool-core",
        select: &["-p", "dsh-tool-core"],
        covering: "package(dsh-tool-core) | test(/^tools::/)",
    },
    MutantGroup {
        name: "shell-core",
        select: &[
            "-p",
            "dsh-shell-core",
            "-f",
            "plugins/common/shell-core/src/confine.rs",
            "-f",
            "plugins/common/shell-core/src/syscalls.rs",
            "-f",
            "plugins/common/shell-core/src/limits.rs",
        ],
        covering: "package(dsh-shell-core) | test(/^confine::|^shell::|^protect::/)",
    },
    MutantGroup {
        name: "host-sessions",
        select: &["-p", "cordis-engine", "-f", "host/engine/src/sessions.rs"],
        covering: "package(cordis-engine) | test(/^host::/) | test(/^durability::/)",
    },
    MutantGroup {
        name: "host-plan",
        select: &["-p", "cordis-engine", "-f", "host/engine/src/plan.rs"],
        covering: "package(cordis-engine) | test(/^host::/) | test(/^diagnostics::/) | test(/^reload::/)",
    },
];

/// Mutation testing in two passes per group: every mutant against its own package's tests
/// (fast), then the ones that survived against the end-to-end tests that cover the group.
/// Needs `cargo install cargo-mutants`. Not part of CI: a full run takes hours on 2 cores.
fn mutants(only: &[String]) -> Result<(), String> {
    let out = root().join("target/mutants");
    let mut summary = vec![format!(
        "{:<16} {:>7} {:>7} {:>9} {:>8}",
        "group", "caught", "missed", "unviable", "timeout"
    )];
    for group in MUTANT_GROUPS
        .iter()
        .filter(|g| only.is_empty() || only.iter().any(|o| o == g.name))
    {
        let first = out.join(group.name).join("own-tests");
        let second = out.join(group.name).join("covering-tests");
        for dir in [&first, &second] {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        let mut cmd = mutants_command(group.select, &first);
        cmd.args(["--", "--no-tests=pass"]);
        let _ = status(
            cmd,
            &format!("cargo mutants: {} against its own tests", group.name),
        );
        let survivors = read_lines(&first.join("mutants.out/missed.txt"));
        let mut counts = mutant_counts(&first);
        if !survivors.is_empty() {
            let exact: Vec<String> = survivors
                .iter()
                .map(|m| format!("^{}$", regex_escape(m)))
                .collect();
            let mut select: Vec<&str> = group
                .select
                .iter()
                .copied()
                .take_while(|a| *a != "-F")
                .collect();
            let re = exact.join("|");
            select.extend([
                "-F",
                re.as_str(),
                "--test-workspace=true",
                "--baseline=skip",
            ]);
            let mut cmd = mutants_command(&select, &second);
            cmd.args(["--", "-E", group.covering]);
            let _ = status(
                cmd,
                &format!(
                    "cargo mutants: {}'s survivors against the end-to-end tests",
                    group.name
                ),
            );
            let again = mutant_counts(&second);
            counts = [
                counts[0] + again[0],
                again[1],
                counts[2],
                counts[3] + again[3],
            ];
        }
        summary.push(format!(
            "{:<16} {:>7} {:>7} {:>9} {:>8}",
            group.name, counts[0], counts[1], counts[2], counts[3]
        ));
    }
    let text = summary.join("\n") + "\n";
    print!("{text}");
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    std::fs::write(out.join("summary.txt"), text).map_err(|e| format!("summary: {e}"))
}

fn mutants_command(select: &[&str], out: &Path) -> Command {
    let mut cmd = cargo();
    cmd.args(["mutants", "--no-shuffle", "-j", "2", "--timeout", "300"])
        .args(["--test-tool", "nextest", "--copy-target=true", "-o"])
        .arg(out)
        .args(select);
    cmd
}

/// Caught, missed, unviable and timed-out mutants of one `cargo mutants` run in `dir`.
fn mutant_counts(dir: &Path) -> [usize; 4] {
    ["caught", "missed", "unviable", "timeout"]
        .map(|what| read_lines(&dir.join(format!("mutants.out/{what}.txt"))).len())
}

fn read_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

/// `text` with every regular-expression metacharacter escaped.
fn regex_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if "\\.+*?()|[]{}^$#&-~/".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// `cargo +nightly` (cargo-fuzz needs the nightly toolchain), without the toolchain choice
/// this process inherited from the stable `cargo xtask`.
fn nightly_cargo() -> Command {
    let mut cmd = Command::new("cargo");
    cmd.current_dir(root()).arg("+nightly");
    for var in ["RUSTUP_TOOLCHAIN", "CARGO", "RUSTC", "RUSTDOC"] {
        cmd.env_remove(var);
    }
    cmd
}

/// The cargo-fuzz targets: `fuzz/fuzz_targets/<target>.rs`.
fn fuzz_targets() -> Result<Vec<String>, String> {
    let dir = root().join("fuzz/fuzz_targets");
    let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut names: Vec<String> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            name.strip_suffix(".rs").map(str::to_string)
        })
        .collect();
    names.sort();
    Ok(names)
}

/// The files in `dir` (none when it does not exist).
fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| entries.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.retain(|p| p.is_file());
    files.sort();
    files
}

/// Copies the committed seeds of `target` into its working corpus (git-ignored).
fn seed_corpus(target: &str) -> Result<PathBuf, String> {
    let fuzz = root().join("fuzz");
    let corpus = fuzz.join("corpus").join(target);
    std::fs::create_dir_all(&corpus).map_err(|e| format!("{}: {e}", corpus.display()))?;
    for seed in files_in(&fuzz.join("seeds").join(target)) {
        let to = corpus.join(seed.file_name().expect("a file has a name"));
        std::fs::copy(&seed, &to).map_err(|e| format!("{}: {e}", seed.display()))?;
    }
    Ok(corpus)
}

fn fuzz(seconds: Option<&str>) -> Result<(), String> {
    let seconds: u64 = match seconds {
        None => 30,
        Some(s) => s
            .parse()
            .map_err(|_| format!("`{s}` is not a number of seconds"))?,
    };
    let installed = nightly_cargo()
        .args(["fuzz", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !installed {
        return Err(
            "cargo-fuzz is not installed: `cargo install cargo-fuzz --locked` \
             (it needs the nightly toolchain: `rustup toolchain install nightly`)"
                .to_string(),
        );
    }
    // Without AddressSanitizer: the targets run safe Rust and load no plugin library, and
    // the sanitizer would cost a third more build time and half the executions.
    let fuzz_args = ["--fuzz-dir", "fuzz", "--sanitizer", "none"];
    let mut cmd = nightly_cargo();
    cmd.args(["fuzz", "build"]).args(fuzz_args);
    status(cmd, "cargo +nightly fuzz build --sanitizer none")?;
    let mut crashed = Vec::new();
    for target in fuzz_targets()? {
        let corpus = seed_corpus(&target)?;
        let artifacts = root().join("fuzz/artifacts").join(&target);
        let started = std::time::SystemTime::now();
        let mut cmd = nightly_cargo();
        cmd.args(["fuzz", "run"])
            .args(fuzz_args)
            .arg(&target)
            .arg(&corpus)
            .arg("--")
            .arg(format!("-max_total_time={seconds}"))
            // Inputs up to 64 KiB; an input that needs 2 GiB or 30 s is a crash too.
            .args(["-max_len=65536", "-rss_limit_mb=2048", "-timeout=30"])
            .arg("-print_final_stats=1");
        if let Err(e) = status(cmd, &format!("fuzz target `{target}` for {seconds} s")) {
            // Written by this run (a known input is written again under the same name).
            let new: Vec<PathBuf> = files_in(&artifacts)
                .into_iter()
                .filter(|p| {
                    p.metadata()
                        .and_then(|m| m.modified())
                        .is_ok_and(|t| t >= started)
                })
                .collect();
            eprintln!("xtask: {e}");
            for artifact in &new {
                eprintln!(
                    "xtask: `{target}` crashed on {} (reproduce: cargo +nightly fuzz run {} {target} {})",
                    artifact.display(),
                    fuzz_args.join(" "),
                    artifact.display()
                );
            }
            crashed.push(target);
        }
    }
    if crashed.is_empty() {
        Ok(())
    } else {
        Err(format!("fuzz targets crashed: {}", crashed.join(", ")))
    }
}
