//! Serving benchmarks, end to end with the real binary and the bundled plugins:
//! - MCP `tools/call` round trip of `read` on a 4 KiB file (p50/p99 over 10,000 calls on
//!   one connection) against the same call in-process (`Runtime::call_tool`), as a ratio,
//!   against a `ping` round trip on the same connection (what the protocol and the pipes
//!   cost alone), and what the host's check of the arguments against the input schema
//!   costs of it;
//! - whole-process `cordis call read` on the bundled `cordis.yml`;
//! - hot reload latency to the first call served by the new composition (median and p99),
//!   (a) after a library is replaced by `cp` + `mv` (and the server's resident memory growth
//!   per reload), (b) after a real `cargo build` of two plugins, from cargo's exit (and the
//!   number of reloads: exactly one per build), (c) after a `cordis.yml` edit saved the way
//!   editors save (write beside, rename).
//!
//! Run with `cargo bench -p cordis-e2e --bench serve` (`-- read`, `-- reload` or `-- cargo`
//! for one part; `-- in-process` runs the in-process `read` calls alone, for a profiler). Distributions of whole requests are
//! timed directly (criterion's per-iteration model does not give p99 of a live server).

use std::time::{Duration, Instant};

use cordis_cli::watch::Quiet;
use cordis_e2e::bench::{human, resident_kib, summarize, StdioClient};
use cordis_e2e::{
    cargo, cargo_target, fixture_reload_build, reload_project, replace_file, target_dir,
    with_build_lock, workspace_profiles, workspace_root, McpStdio, Scratch,
};
use cordis_sdk::CallContext;

const CALLS: usize = 10_000;

fn read_round_trips() {
    let s = Scratch::with_bundled_manifest();
    s.write("data.txt", &"0123456789abcdef".repeat(256));
    let args = serde_json::json!({ "path": "data.txt" });

    let mut mcp = StdioClient::start(&s);
    let over_mcp = mcp.time_calls(CALLS, "read", &args);
    let pings = mcp.time_pings(CALLS);
    mcp.finish();

    let rt = s.runtime();
    let in_process = in_process_reads(&rt, &s, &args);
    // What the host's argument check adds to every call (part of both figures above).
    let slot = rt.inspect(|c| c.registry().tool("read").cloned().expect("read"));
    let mut checks = Vec::with_capacity(CALLS);
    for _ in 0..CALLS {
        let t = Instant::now();
        let checked = slot.check_args(&args);
        checks.push(t.elapsed().as_nanos() as f64);
        assert!(checked.is_ok(), "{checked:?}");
    }
    drop(slot);
    rt.shutdown();

    let (cp50, cp99) = summarize(checks);
    let (mp50, mp99) = summarize(over_mcp);
    let (ip50, ip99) = summarize(in_process);
    let (pp50, pp99) = summarize(pings);
    println!("read of a 4 KiB file, {CALLS} calls each:");
    println!(
        "  MCP tools/call round trip  p50 {:>10}  p99 {:>10}",
        human(mp50),
        human(mp99)
    );
    println!(
        "  in-process call_tool       p50 {:>10}  p99 {:>10}",
        human(ip50),
        human(ip99)
    );
    println!(
        "  ratio MCP / in-process     p50 {:.2}  p99 {:.2}",
        mp50 / ip50,
        mp99 / ip99
    );
    println!(
        "  MCP ping round trip        p50 {:>10}  p99 {:>10}  (read - ping at p50: {}, {:.2}x in-process)",
        human(pp50),
        human(pp99),
        human(mp50 - pp50),
        (mp50 - pp50) / ip50
    );
    println!(
        "  argument check             p50 {:>10}  p99 {:>10}  ({:.3}% of the MCP round trip at p50)",
        human(cp50),
        human(cp99),
        100.0 * cp50 / mp50
    );

    // The bundled composition starts the shell's process too; the same with it in-process.
    let in_process = Scratch::with_bundled_manifest();
    let manifest = std::fs::read_to_string(s.path().join("cordis.yml")).expect("manifest");
    in_process.write("cordis.yml", &manifest.replace("  isolate: process\n", ""));
    in_process.write("data.txt", &"0123456789abcdef".repeat(256));
    let runs = 20;
    let whole = |s: &Scratch| {
        let mut times = Vec::with_capacity(runs);
        for _ in 0..runs {
            let t = Instant::now();
            let run = s.run(&["call", "read", r#"{"path": "data.txt"}"#]);
            times.push(t.elapsed().as_nanos() as f64);
            run.expect_code(0);
        }
        summarize(times)
    };
    let ((p50, max), (lp50, lmax)) = (whole(&s), whole(&in_process));
    println!(
        "  `cordis call read` whole process ({runs} runs): p50 {}  max {}; with the shell in-process p50 {}  max {}: {:+.2} ms for the shell's process",
        human(p50),
        human(max),
        human(lp50),
        human(lmax),
        (p50 - lp50) / 1e6
    );
}

/// Calls `tool` until it answers `want`; the time since `since`. Every call must succeed.
fn until_answered(mcp: &mut McpStdio, tool: &str, want: &str, since: Instant) -> f64 {
    loop {
        let (is_error, text) = mcp.call(tool, serde_json::json!({"name": "Ada"}));
        assert!(!is_error, "a call failed during a reload: {text}");
        if text == want {
            return since.elapsed().as_nanos() as f64;
        }
        assert!(
            since.elapsed() < Duration::from_secs(30),
            "reload not picked up: {tool} answers {text:?}, want {want:?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn print_latencies(what: &str, latencies: Vec<f64>) {
    let rounds = latencies.len();
    let (p50, p99) = summarize(latencies);
    println!(
        "  {what} ({rounds} reloads): median {}  p99 {}",
        human(p50),
        human(p99)
    );
}

/// (a): the library replaced by `cp` + `mv`; (c): `cordis.yml` saved by rename.
fn reload_latency() {
    let (s, lib) = reload_project(1, "- name: fixture-reload\n  config:\n    greeting: a\n");
    let builds = [fixture_reload_build(1), fixture_reload_build(2)];
    let mut cmd = s.cordis(&["run", "--plugin-path", "plugins"]);
    cmd.env("RUST_LOG", "warn");
    let mut mcp = McpStdio::start(cmd);
    let pid = mcp.pid();
    let rounds = 50;
    let mut current = 0;
    let mut flip = |mcp: &mut McpStdio| -> f64 {
        current = 1 - current;
        let t = Instant::now();
        replace_file(&builds[current], &lib);
        until_answered(
            mcp,
            "reload-version",
            &format!("build {}, greeting a", current + 1),
            t,
        )
    };
    flip(&mut mcp); // warm-up
    let before = resident_kib(pid);
    let replaced: Vec<f64> = (0..rounds).map(|_| flip(&mut mcp)).collect();
    let after = resident_kib(pid);

    let build = current + 1;
    let mut greeting = "a";
    let edited: Vec<f64> = (0..rounds)
        .map(|_| {
            greeting = if greeting == "a" { "b" } else { "a" };
            let t = Instant::now();
            let tmp = s.write(
                ".cordis.yml.swp",
                &format!("- name: fixture-reload\n  config:\n    greeting: {greeting}\n"),
            );
            std::fs::rename(tmp, s.path().join("cordis.yml")).expect("save cordis.yml");
            until_answered(
                &mut mcp,
                "reload-version",
                &format!("build {build}, greeting {greeting}"),
                t,
            )
        })
        .collect();
    assert!(mcp.finish().success());

    let quiet = Quiet::DEFAULT;
    println!(
        "hot reload -> first call on the new composition (quiet periods: {} after a library, {} after cordis.yml):",
        human(quiet.library.as_nanos() as f64),
        human(quiet.manifest.as_nanos() as f64)
    );
    print_latencies("(a) library replaced by cp + mv", replaced);
    println!(
        "      server resident memory {before} KiB -> {after} KiB: {:+.1} KiB per reload",
        (after as f64 - before as f64) / rounds as f64
    );
    print_latencies("(c) cordis.yml saved by rename", edited);
}

/// (b): two plugins of one cargo workspace rebuilt by one `cargo build`.
fn cargo_build_reload() {
    let s = Scratch::new();
    s.write(".cargo/config.toml", &workspace_profiles());
    let names = ["bench-reload-a", "bench-reload-b"];
    for name in names {
        let mut new = s.cordis(&["new", name]);
        new.env("CARGO_TARGET_DIR", cargo_target());
        s.run_command(new, "cordis new").expect_code(0);
        let toml = s.path().join(name).join("Cargo.toml");
        let text = std::fs::read_to_string(&toml).expect("read Cargo.toml");
        let member = text.replace(
            "\n# Not part of any enclosing workspace.\n[workspace]\n",
            "\n",
        );
        assert_ne!(text, member, "the scaffold's own [workspace] table moved");
        std::fs::write(&toml, member).expect("write Cargo.toml");
    }
    s.write(
        "Cargo.toml",
        &format!("[workspace]\nmembers = {names:?}\nresolver = \"2\"\n"),
    );
    std::fs::copy(
        workspace_root().join("Cargo.lock"),
        s.path().join("Cargo.lock"),
    )
    .expect("copy Cargo.lock");
    let libraries: Vec<std::path::PathBuf> = names
        .iter()
        .map(|n| target_dir().join(cordis_engine::library_file_name(n)))
        .collect();
    let build = || -> Duration {
        let mut cmd = cargo(&s.path(), &["build", "--lib"]);
        if target_dir().file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let t = Instant::now();
        s.run_command(cmd, "cargo build").expect_code(0);
        t.elapsed()
    };
    let edit = |round: usize| {
        for name in names {
            let path = s.path().join(name).join("src/lib.rs");
            let src = std::fs::read_to_string(&path).expect("read src/lib.rs");
            let edited = match round {
                1 => src.replace(r#""{}, {name}!""#, r#""{}, {name}! (round 1)""#),
                _ => src.replace(
                    &format!("(round {})", round - 1),
                    &format!("(round {round})"),
                ),
            };
            assert_ne!(src, edited, "the edit changed nothing");
            std::fs::write(&path, edited).expect("write src/lib.rs");
        }
    };
    let tools: Vec<String> = names
        .iter()
        .map(|n| format!("{}_greet", n.replace('-', "_")))
        .collect();

    with_build_lock(|| {
        build();
        let entries: String = names
            .iter()
            .zip(&libraries)
            .map(|(n, l)| format!("- name: {n}\n  path: {}\n", l.display()))
            .collect();
        s.manifest(&entries);
        let log = s.path().join("run.log");
        let mut cmd = s.cordis(&["run"]);
        cmd.env("RUST_LOG", "info")
            .stderr(std::fs::File::create(&log).expect("create the log"));
        let mut mcp = McpStdio::start(cmd);
        for tool in &tools {
            until_answered(&mut mcp, tool, "hello, Ada!", Instant::now());
        }
        let rounds = 5;
        let mut after_exit = Vec::with_capacity(rounds);
        let mut cargo_times = Vec::with_capacity(rounds);
        for round in 1..=rounds {
            edit(round);
            cargo_times.push(build().as_nanos() as f64);
            let exited = Instant::now();
            let want = format!("hello, Ada! (round {round})");
            for tool in &tools {
                until_answered(&mut mcp, tool, &want, exited);
            }
            after_exit.push(exited.elapsed().as_nanos() as f64);
        }
        assert!(mcp.finish().success());
        let log = std::fs::read_to_string(&log).expect("read the log");
        let reloads = log.matches("reload: ").count();
        let (build_p50, _) = summarize(cargo_times);
        print_latencies(
            &format!(
                "(b) `cargo build` of two plugins ({} each), from cargo's exit",
                human(build_p50)
            ),
            after_exit,
        );
        println!("      reloads: {reloads} for {rounds} builds");
        assert_eq!(
            reloads, rounds,
            "one build of two plugins must be exactly one reload:\n{log}"
        );
    });
    for lib in libraries {
        let _ = std::fs::remove_file(lib);
    }
}

/// What isolation (`isolate: process`) adds: a trivial service method (the example's
/// greeter) through the registry in-process against the same entry isolated, and the MCP
/// `read` round trip with `dsh-fs-sandbox` and `dsh-tool-fs` isolated against the bundled
/// composition in-process, measured in the same run.
fn isolation_overhead() {
    use cordis_example_api::{Greeter, GreeterClient};
    let greets = |isolate: bool| -> Vec<f64> {
        let s = Scratch::new();
        s.manifest(if isolate {
            "- name: cordis-example\n  isolate: process\n"
        } else {
            "- name: cordis-example\n"
        });
        let rt = if isolate {
            s.runtime_isolated()
        } else {
            s.runtime()
        };
        let times = rt
            .with_service::<GreeterClient, _>("greeter", |greeter| {
                let mut times = Vec::with_capacity(CALLS);
                for _ in 0..CALLS {
                    let t = Instant::now();
                    let text = greeter.greet(std::hint::black_box("Ada".into()))?;
                    times.push(t.elapsed().as_nanos() as f64);
                    assert_eq!(text, "hello, Ada");
                }
                Ok(times)
            })
            .expect("greet");
        rt.shutdown();
        times
    };
    let (in_p50, in_p99) = summarize(greets(false));
    let (iso_p50, iso_p99) = summarize(greets(true));
    println!("a trivial service method (greeter.greet), {CALLS} calls each:");
    println!(
        "  in-process                 p50 {:>10}  p99 {:>10}",
        human(in_p50),
        human(in_p99)
    );
    println!(
        "  isolated                   p50 {:>10}  p99 {:>10}  (adds {} at p50)",
        human(iso_p50),
        human(iso_p99),
        human(iso_p50 - in_p50)
    );

    let reads = |isolate: bool| -> Vec<f64> {
        let s = Scratch::with_bundled_manifest();
        if isolate {
            let manifest = std::fs::read_to_string(s.path().join("cordis.yml")).unwrap();
            let isolated = manifest
                .replace(
                    "- name: '@deepseek-ai/dsh-fs-sandbox'\n",
                    "- name: '@deepseek-ai/dsh-fs-sandbox'\n  isolate: process\n",
                )
                .replace(
                    "- name: '@deepseek-ai/dsh-tool-fs'\n",
                    "- name: '@deepseek-ai/dsh-tool-fs'\n  isolate: process\n",
                );
            assert_eq!(
                isolated.matches("isolate: process").count(),
                manifest.matches("isolate: process").count() + 2,
                "{isolated}"
            );
            s.manifest(&isolated);
        }
        s.write("data.txt", &"0123456789abcdef".repeat(256));
        let mut mcp = StdioClient::start(&s);
        let times = mcp.time_calls(CALLS, "read", &serde_json::json!({ "path": "data.txt" }));
        mcp.finish();
        times
    };
    let (in_p50, in_p99) = summarize(reads(false));
    let (iso_p50, iso_p99) = summarize(reads(true));
    println!("MCP read of a 4 KiB file, {CALLS} calls each:");
    println!(
        "  in-process                 p50 {:>10}  p99 {:>10}",
        human(in_p50),
        human(in_p99)
    );
    println!(
        "  fs + tool-fs isolated      p50 {:>10}  p99 {:>10}  (adds {} at p50, ratio {:.2})",
        human(iso_p50),
        human(iso_p99),
        human(iso_p50 - in_p50),
        iso_p50 / in_p50
    );
}

/// `cargo bench -p cordis-e2e --bench serve [-- read|reload|cargo|isolated ...]`: the named
/// parts, or all of them.
/// [`CALLS`] in-process `read` calls of `args` through `rt` in a new session rooted at
/// `s`, each timed (nanoseconds).
fn in_process_reads(
    rt: &cordis_engine::Runtime,
    s: &Scratch,
    args: &serde_json::Value,
) -> Vec<f64> {
    let session = rt.sessions().create(&s.path()).expect("session");
    let call = CallContext {
        session,
        call_id: "bench".into(),
        cancel_fd: None,
        progress_fd: None,
    };
    let mut times = Vec::with_capacity(CALLS);
    for _ in 0..CALLS {
        let t = Instant::now();
        let r = rt.call_tool("read", &call, args).expect("read");
        times.push(t.elapsed().as_nanos() as f64);
        assert!(!r.is_error, "{}", r.text);
    }
    times
}

/// The in-process `read` alone, nothing else in the process's run: the part to run under
/// a profiler (`perf record`, or `valgrind --tool=callgrind
/// --toggle-collect='cordis_engine::runtime::Runtime::call_tool*'` for the instructions
/// of the calls themselves).
fn in_process_only() {
    let s = Scratch::with_bundled_manifest();
    s.write("data.txt", &"0123456789abcdef".repeat(256));
    let rt = s.runtime();
    let times = in_process_reads(&rt, &s, &serde_json::json!({ "path": "data.txt" }));
    rt.shutdown();
    let (p50, p99) = summarize(times);
    println!(
        "in-process read of a 4 KiB file, {CALLS} calls: p50 {:>10}  p99 {:>10}",
        human(p50),
        human(p99)
    );
}

fn main() {
    let wanted: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let parts: [(&str, fn()); 5] = [
        ("read", read_round_trips),
        ("in-process", in_process_only),
        ("reload", reload_latency),
        ("cargo", cargo_build_reload),
        ("isolated", isolation_overhead),
    ];
    for (name, part) in parts {
        // `in-process` is a part of `read`, run alone only when asked for.
        let by_default = name != "in-process";
        if (wanted.is_empty() && by_default) || wanted.iter().any(|w| w == name) {
            part();
        }
    }
}
