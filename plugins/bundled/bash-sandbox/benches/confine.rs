//! Benchmark of what confinement costs a whole command: `true` and a small script through
//! `dsh-bash-sandbox` (workspace-write: namespaces, mount view, Landlock, seccomp), through
//! the same with network on (no network namespace: what the namespace itself costs), and
//! through the same without resource limits (no cgroup: what the limits cost), through
//! the same in a workspace of 3,000 directories (what the search for repositories beneath
//! it costs each command, its listings cached), and through `dsh-bash-local` (the supervisor and the environment policy only), all loaded as
//! real cdylibs through the host. Prints the sandboxed/local ratios and differences at the
//! end, from criterion's estimates and from interleaved medians.
//!
//! Run with `cargo bench -p dsh-bash-sandbox --bench confine`.

use cordis_e2e::bench::{criterion_estimate_ns, interleaved_medians, print_ratio};
use cordis_e2e::Scratch;
use criterion::Criterion;
use dsh_sandbox::{Limits, SandboxExecutionPolicy, SandboxMode};
use dsh_shell_api::{ExecRequest, Shell, ShellClient};

/// Alternating runs per backend for the interleaved medians.
const INTERLEAVED_ROUNDS: usize = 300;

const SCRIPT: &str = "for i in 1 2 3; do echo $i > f$i; done; cat f*";

fn main() {
    let local_scratch = Scratch::new();
    local_scratch.manifest("- name: dsh-bash-local\n");
    let sandboxed_scratch = Scratch::new();
    let ws = sandboxed_scratch.path().join("ws");
    std::fs::create_dir_all(&ws).expect("bench workspace");
    sandboxed_scratch.manifest(&format!(
        "- name: dsh-sandbox-policy\n  config:\n    mode: workspace-write\n    workspaceRoot: '{}'\n- name: dsh-bash-sandbox\n",
        ws.display()
    ));
    // Declared after the compositions so the clients drop first (before their libraries).
    let (local_started, sandboxed_started) = (local_scratch.start(), sandboxed_scratch.start());
    let local: ShellClient = local_started.service("shell");
    let sandboxed: ShellClient = sandboxed_started.service("shell");
    let policy = SandboxExecutionPolicy {
        mode: SandboxMode::WorkspaceWrite,
        workspace_root: ws.clone(),
        network: false,
        ..Default::default()
    };
    // A workspace of 3,000 directories (a checkout with a build directory has as many).
    let big = sandboxed_scratch.path().join("big");
    for i in 0..30 {
        for j in 0..100 {
            std::fs::create_dir_all(big.join(format!("d{i}/e{j}"))).expect("bench tree");
        }
    }
    let in_big = SandboxExecutionPolicy {
        workspace_root: big.clone(),
        ..policy.clone()
    };
    let networked = SandboxExecutionPolicy {
        network: true,
        ..policy.clone()
    };
    // The same confinement without resource limits: no cgroup, no rlimits.
    let unlimited = SandboxExecutionPolicy {
        limits: Limits {
            memory_mib: 0,
            processes: 0,
            file_size_mib: 0,
            cpu_seconds: 0,
        },
        ..policy.clone()
    };

    let mut criterion = Criterion::default()
        .sample_size(40)
        .warm_up_time(std::time::Duration::from_secs(1))
        .measurement_time(std::time::Duration::from_secs(6))
        .configure_from_args();
    let cases = [("true", "true"), ("script", SCRIPT)];
    let request_with = |command: &str, policy: &SandboxExecutionPolicy| ExecRequest {
        command: command.to_string(),
        cwd: ws.clone(),
        env: Vec::new(),
        timeout_ms: Some(10_000),
        output_limit: None,
        policy: Some(policy.clone().into()),
        cancel_fd: None,
        progress_fd: None,
    };
    let request = |command: &str| request_with(command, &policy);
    for (group_name, command) in cases {
        let request = request(command);
        let mut group = criterion.benchmark_group(group_name);
        for (function, backend) in [("local", &local), ("sandboxed", &sandboxed)] {
            group.bench_function(function, |b| {
                b.iter(|| {
                    let r = backend.exec(request.clone()).expect("the command runs");
                    assert_eq!(r.exit_code, Some(0), "{r:?}");
                    r
                })
            });
        }
        group.finish();
    }
    criterion.final_summary();

    println!("\nconfinement overhead, sandboxed / local, this run:");
    for (group_name, command) in cases {
        match (
            criterion_estimate_ns(group_name, "local"),
            criterion_estimate_ns(group_name, "sandboxed"),
        ) {
            (Some(l), Some(s)) => print_ratio(
                &format!("{group_name} (criterion estimate)"),
                ("local", l),
                ("sandboxed", s),
            ),
            _ => println!("  {group_name}: no criterion estimates (group filtered out?)"),
        }
        let run = |shell: &ShellClient, request: &ExecRequest| {
            let r = shell.exec(request.clone()).expect("the command runs");
            assert_eq!(r.exit_code, Some(0), "{r:?}");
        };
        let (confined, with_network) = (request(command), request_with(command, &networked));
        let without_limits = request_with(command, &unlimited);
        let in_big_tree = ExecRequest {
            cwd: big.clone(),
            ..request_with(command, &in_big)
        };
        let medians = interleaved_medians(
            INTERLEAVED_ROUNDS,
            &mut [
                &mut || run(&local, &confined),
                &mut || run(&sandboxed, &confined),
                &mut || run(&sandboxed, &with_network),
                &mut || run(&sandboxed, &without_limits),
                &mut || run(&sandboxed, &in_big_tree),
            ],
        );
        print_ratio(
            &format!("{group_name} (interleaved median)"),
            ("local", medians[0]),
            ("sandboxed", medians[1]),
        );
        print_ratio(
            &format!("{group_name}, network on"),
            ("local", medians[0]),
            ("sandboxed", medians[2]),
        );
        print_ratio(
            &format!("{group_name}, what the limits cost"),
            ("no limits", medians[3]),
            ("limits", medians[1]),
        );
        print_ratio(
            &format!("{group_name}, in 3,000 directories"),
            ("empty workspace", medians[1]),
            ("3,000 dirs", medians[4]),
        );
    }
}
