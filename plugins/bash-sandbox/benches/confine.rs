//! Benchmark of what Landlock confinement costs a whole command: `true` and a small script
//! through `dsh-bash-sandbox` (workspace-write) and through `dsh-bash-local`, both loaded as
//! real cdylibs through the host. Prints the sandboxed/local ratio of the means at the end.
//!
//! Run with `cargo bench -p dsh-bash-sandbox --bench confine`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use cordis_host::{plan::Plan, registry::Registry, Host};
use cordis_sdk::Service;
use criterion::Criterion;
use dsh_sandbox::{SandboxExecutionPolicy, SandboxMode};
use dsh_shell_api::{ExecRequest, Shell, ShellClient};

/// The profile directory this bench runs from (`target/<profile>`).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the bench knows its own path");
    exe.parent()
        .and_then(Path::parent)
        .expect("the bench binary lives in <target>/<profile>/deps")
        .to_path_buf()
}

/// Builds the three plugin libraries in the profile the bench runs in.
fn build_plugins(profile: &Path) {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .args([
            "build",
            "--lib",
            "-p",
            "dsh-sandbox-policy",
            "-p",
            "dsh-bash-local",
            "-p",
            "dsh-bash-sandbox",
        ]);
    if profile.file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    let status = cmd.status().expect("cargo runs");
    assert!(status.success(), "building the shell plugins failed");
}

/// One applied composition and its `shell`.
struct Backend {
    shell: ShellClient,
    _registry: Registry,
    _plan: Plan,
    _host: Host,
}

fn start(dir: &Path, name: &str, manifest: &str, profile: &Path) -> Backend {
    let dir = dir.join(name);
    std::fs::create_dir_all(dir.join("state")).expect("bench state dir");
    std::fs::write(dir.join("cordis.yml"), manifest).expect("bench manifest");
    let host = Host::new(
        &dir.join("cordis.yml"),
        &[profile.to_path_buf()],
        &dir.join("state"),
        false,
    );
    let (plan, registry) = host
        .start()
        .unwrap_or_else(|e| panic!("starting the {name} composition failed: {e:#}"));
    let handle = registry
        .services
        .get("shell")
        .unwrap_or_else(|| panic!("the {name} composition provides no `shell`"))
        .handle
        .clone();
    let shell = Service::checked::<ShellClient>("shell", handle).expect("a `shell` service");
    Backend {
        shell,
        _registry: registry,
        _plan: plan,
        _host: host,
    }
}

/// Alternating runs per backend for the interleaved medians.
const INTERLEAVED_ROUNDS: usize = 300;

const SCRIPT: &str = "for i in 1 2 3; do echo $i > f$i; done; cat f*";

/// One benchmark's time per command in nanoseconds from criterion's estimates: the slope
/// (the figure criterion prints) when it was fitted, else the mean.
fn estimate_ns(criterion_dir: &Path, group: &str, function: &str) -> Option<f64> {
    let path = criterion_dir
        .join(group)
        .join(function)
        .join("new/estimates.json");
    let text = std::fs::read_to_string(&path).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    json["slope"]["point_estimate"]
        .as_f64()
        .or_else(|| json["mean"]["point_estimate"].as_f64())
}

/// Runs `request` alternately on both backends `rounds` times and returns the median
/// latency of each, in nanoseconds. Alternating exposes both to the same background load.
fn interleaved_medians(
    local: &ShellClient,
    sandboxed: &ShellClient,
    request: &ExecRequest,
    rounds: usize,
) -> (f64, f64) {
    let mut times = [Vec::with_capacity(rounds), Vec::with_capacity(rounds)];
    for _ in 0..rounds {
        for (i, shell) in [local, sandboxed].into_iter().enumerate() {
            let t = Instant::now();
            let r = shell.exec(request.clone()).expect("the command runs");
            times[i].push(t.elapsed().as_nanos() as f64);
            assert_eq!(r.exit_code, Some(0), "{r:?}");
        }
    }
    let [l, s] = times.map(|mut v| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    });
    (l, s)
}

fn print_ratio(label: &str, local_ns: f64, sandboxed_ns: f64) {
    println!(
        "  {label:<28} local {:>7.3} ms  sandboxed {:>7.3} ms  ratio {:.3} ({:+.1}%)",
        local_ns / 1e6,
        sandboxed_ns / 1e6,
        sandboxed_ns / local_ns,
        (sandboxed_ns / local_ns - 1.0) * 100.0
    );
}

fn main() {
    let profile = profile_dir();
    build_plugins(&profile);
    let scratch = tempfile::tempdir().expect("bench scratch dir");
    let ws = scratch.path().join("ws");
    std::fs::create_dir_all(&ws).expect("bench workspace");
    let ws = ws.canonicalize().expect("canonical workspace");
    let local = start(
        scratch.path(),
        "local",
        "- name: dsh-bash-local\n",
        &profile,
    );
    let sandboxed = start(
        scratch.path(),
        "sandboxed",
        &format!(
            "- name: dsh-sandbox-policy\n  config:\n    mode: workspace-write\n    workspaceRoot: '{}'\n- name: dsh-bash-sandbox\n",
            ws.display()
        ),
        &profile,
    );
    let policy = SandboxExecutionPolicy {
        mode: SandboxMode::WorkspaceWrite,
        workspace_root: ws.clone(),
    };

    let mut criterion = Criterion::default()
        .sample_size(40)
        .warm_up_time(std::time::Duration::from_secs(1))
        .measurement_time(std::time::Duration::from_secs(6))
        .configure_from_args();
    let cases = [("true", "true"), ("script", SCRIPT)];
    let request = |command: &str| ExecRequest {
        command: command.to_string(),
        cwd: ws.clone(),
        env: Vec::new(),
        timeout_ms: Some(10_000),
        output_limit: None,
        policy: Some(policy.clone()),
    };
    for (group_name, command) in cases {
        let request = request(command);
        let mut group = criterion.benchmark_group(group_name);
        for (function, backend) in [("local", &local), ("sandboxed", &sandboxed)] {
            group.bench_function(function, |b| {
                b.iter(|| {
                    let r = backend
                        .shell
                        .exec(request.clone())
                        .expect("the command runs");
                    assert_eq!(r.exit_code, Some(0), "{r:?}");
                    r
                })
            });
        }
        group.finish();
    }
    criterion.final_summary();

    let criterion_dir = profile
        .parent()
        .map(|t| t.join("criterion"))
        .unwrap_or_default();
    println!("\nconfinement overhead, sandboxed / local, this run:");
    for (group_name, command) in cases {
        match (
            estimate_ns(&criterion_dir, group_name, "local"),
            estimate_ns(&criterion_dir, group_name, "sandboxed"),
        ) {
            (Some(l), Some(s)) => print_ratio(&format!("{group_name} (criterion estimate)"), l, s),
            _ => println!(
                "  {group_name}: no criterion estimates under {} (group filtered out?)",
                criterion_dir.display()
            ),
        }
        let (l, s) = interleaved_medians(
            &local.shell,
            &sandboxed.shell,
            &request(command),
            INTERLEAVED_ROUNDS,
        );
        print_ratio(&format!("{group_name} (interleaved median)"), l, s);
    }
}
