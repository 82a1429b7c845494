//! Host-core benchmarks: a trivial service method called through the registry across the
//! ABI (the `greeter` of the real `cordis-example` cdylib) against the same method called
//! directly on a Rust trait object; and whole-process `cordis check` on the bundled
//! `cordis.yml`. Prints the ratios from this run.
//!
//! Run with `cargo bench -p cordis-e2e --bench host`.

use std::process::Command;

use cordis_e2e::bench::{criterion_estimate_ns, human, interleaved_medians, print_ratio};
use cordis_e2e::Scratch;
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
    let check = || {
        let out = Command::new(&cordis)
            .args(["check", "-c"])
            .arg(&bundled)
            .env("CORDIS_STATE_DIR", &state)
            .output()
            .expect("run cordis check");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    {
        let mut g = c.benchmark_group("process");
        g.sample_size(20);
        g.bench_function("cordis-check-bundled", |b| b.iter(check));
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
    if let Some(ns) = criterion_estimate_ns("process", "cordis-check-bundled") {
        println!(
            "  cordis check (bundled cordis.yml, whole process): {}",
            human(ns)
        );
    }
}
