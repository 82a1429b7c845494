//! Host-core benchmarks: a trivial service method called through the registry across the
//! ABI (the `greeter` of the real `cordis-example` cdylib) against the same method called
//! directly on a Rust trait object; whole-process `cordis check` on the bundled
//! `cordis.yml` against `cordis --version` (a process that loads nothing); and the time from
//! spawning `cordis run` to its answers to `initialize` and `tools/list`. Prints the ratios
//! from this run.
//!
//! Run with `cargo bench -p cordis-e2e --bench host`.

use std::process::Command;
use std::time::Instant;

use cordis_e2e::bench::{criterion_estimate_ns, human, interleaved_medians, median, print_ratio};
use cordis_e2e::{McpStdio, Scratch};
use cordis_example_api::{Greeter, GreeterClient};
use criterion::Criterion;

/// The same work as the example plugin's greeter, in this process.
struct Direct {
    word: String,
}

impl Greeter for Direct {
    fn greet(&self, name: String) -> cordis_sdk::Result<String> {
        if name.is_empty() {
            return Err(cordis_sdk::Error::invalid("name must not be empty"));
        }
        Ok(format!("{}, {name}", self.word))
    }
}

fn main() {
    let scratch = Scratch::new();
    scratch.manifest("- name: cordis-example\n");
    let started = scratch.start();
    let across_abi: GreeterClient = started.service("greeter");
    let direct: Box<dyn Greeter> = Box::new(Direct {
        word: "hello".into(),
    });
    assert_eq!(
        across_abi.greet("Ada".into()).expect("abi call"),
        direct.greet("Ada".into()).expect("direct call")
    );

    let mut c = Criterion::default().configure_from_args();
    {
        let mut g = c.benchmark_group("greet");
        g.bench_function("direct", |b| {
            b.iter(|| direct.greet(std::hint::black_box("Ada".to_string())))
        });
        g.bench_function("abi", |b| {
            b.iter(|| across_abi.greet(std::hint::black_box("Ada".to_string())))
        });
        g.finish();
    }
    let cordis = cordis_e2e::cordis_bin();
    let bundled = cordis_e2e::workspace_root().join("cordis.yml");
    let state = scratch.state_dir();
    let process = |args: &[&str]| {
        let out = Command::new(&cordis)
            .args(args)
            .env("CORDIS_STATE_DIR", &state)
            .output()
            .expect("run cordis");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let manifest = bundled.to_string_lossy().into_owned();
    {
        let mut g = c.benchmark_group("process");
        g.sample_size(50);
        g.bench_function("cordis-version", |b| b.iter(|| process(&["--version"])));
        g.bench_function("cordis-check-bundled", |b| {
            b.iter(|| process(&["check", "-c", &manifest]))
        });
        g.finish();
    }
    c.final_summary();

    println!("\nhost core (this run):");
    match (
        criterion_estimate_ns("greet", "direct"),
        criterion_estimate_ns("greet", "abi"),
    ) {
        (Some(d), Some(a)) => print_ratio("greet: criterion", ("direct", d), ("abi", a)),
        _ => println!("  greet: no criterion estimates (group filtered out?)"),
    }
    let mut d = || {
        let _ = direct.greet("Ada".to_string());
    };
    let mut a = || {
        let _ = across_abi.greet("Ada".to_string());
    };
    let medians = interleaved_medians(20_000, &mut [&mut d, &mut a]);
    print_ratio(
        "greet: interleaved medians",
        ("direct", medians[0]),
        ("abi", medians[1]),
    );
    match (
        criterion_estimate_ns("process", "cordis-version"),
        criterion_estimate_ns("process", "cordis-check-bundled"),
    ) {
        (Some(v), Some(c)) => print_ratio(
            "whole process: criterion",
            ("cordis --version", v),
            ("cordis check (bundled cordis.yml)", c),
        ),
        _ => println!("  whole process: no criterion estimates (group filtered out?)"),
    }
    ready_to_serve();
}

/// From spawning `cordis run` on the bundled `cordis.yml` to the answers of `initialize`
/// and then `tools/list` (median of 20 spawns).
fn ready_to_serve() {
    let s = Scratch::with_bundled_manifest();
    let runs = 20;
    let mut initialized = Vec::with_capacity(runs);
    let mut listed = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = Instant::now();
        let mut mcp = McpStdio::start(s.cordis(&["run"]));
        initialized.push(t.elapsed().as_nanos() as f64);
        let tools = mcp.request("tools/list", serde_json::json!({}));
        listed.push(t.elapsed().as_nanos() as f64);
        assert!(
            tools["tools"].as_array().is_some_and(|t| t.len() >= 5),
            "{tools}"
        );
        assert!(mcp.finish().success());
    }
    println!(
        "  `cordis run` (bundled cordis.yml) spawned -> initialize answered {}, -> tools/list answered {} (median of {runs})",
        human(median(initialized)),
        human(median(listed))
    );
}
