//! Serving benchmarks, end to end with the real binary and the bundled plugins:
//! - MCP `tools/call` round trip of `read` on a 4 KiB file (p50/p99 over 10,000 calls on
//!   one connection) against the same call in-process (`Runtime::call_tool`), as a ratio;
//! - whole-process `cordis call read` on the bundled `cordis.yml`;
//! - hot reload latency: from replacing a plugin library on disk to the first call served
//!   by the new generation (median of 50, the watcher's quiet period reported separately),
//!   and the server's resident memory growth per reload.
//!
//! Run with `cargo bench -p cordis-e2e --bench serve`. Distributions of whole requests are
//! timed directly (criterion's per-iteration model does not give p99 of a live server).

use std::path::Path;
use std::time::{Duration, Instant};

use cordis_e2e::bench::human;
use cordis_e2e::{fixture_reload_build, reload_project, replace_file, McpStdio, Scratch};
use cordis_sdk::CallContext;

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn summarize(mut samples: Vec<f64>) -> (f64, f64) {
    samples.sort_by(f64::total_cmp);
    (percentile(&samples, 0.5), percentile(&samples, 0.99))
}

fn resident_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

const CALLS: usize = 10_000;

fn read_round_trips() {
    let s = Scratch::with_bundled_manifest();
    s.write("data.txt", &"0123456789abcdef".repeat(256));
    let args = serde_json::json!({ "path": "data.txt" });

    let mut mcp = McpStdio::start(s.cordis(&["run", "--no-watch"]));
    let mut over_mcp = Vec::with_capacity(CALLS);
    for _ in 0..CALLS {
        let t = Instant::now();
        let (is_error, text) = mcp.call("read", args.clone());
        over_mcp.push(t.elapsed().as_nanos() as f64);
        assert!(!is_error && text.len() >= 4096, "{text}");
    }
    assert!(mcp.finish().success());

    let rt = s.runtime();
    let session = rt.host.sessions.create(&s.path()).expect("session");
    let call = CallContext {
        session,
        call_id: "bench".into(),
        cancel_fd: None,
    };
    let mut in_process = Vec::with_capacity(CALLS);
    for _ in 0..CALLS {
        let t = Instant::now();
        let r = rt.call_tool("read", &call, &args).expect("read");
        in_process.push(t.elapsed().as_nanos() as f64);
        assert!(!r.is_error, "{}", r.text);
    }
    rt.shutdown();

    let (mp50, mp99) = summarize(over_mcp);
    let (ip50, ip99) = summarize(in_process);
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

    let runs = 20;
    let mut whole = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = Instant::now();
        let run = s.run(&["call", "read", r#"{"path": "data.txt"}"#]);
        whole.push(t.elapsed().as_nanos() as f64);
        run.expect_code(0);
    }
    let (p50, p99) = summarize(whole);
    println!(
        "  `cordis call read` whole process ({runs} runs): p50 {}  max {}",
        human(p50),
        human(p99)
    );
}

fn reload_latency(lib: &Path, s: &Scratch) {
    let builds = [fixture_reload_build(1), fixture_reload_build(2)];
    let mut cmd = s.cordis(&["run", "--plugin-path", "plugins"]);
    cmd.env("RUST_LOG", "warn");
    let mut mcp = McpStdio::start(cmd);
    let pid = mcp.pid();
    let rounds = 50;
    let mut latencies = Vec::with_capacity(rounds);
    // One warm-up reload.
    let mut current = 1;
    let flip = |mcp: &mut McpStdio, current: &mut usize| -> f64 {
        let next = 1 - *current;
        let want = format!("build {}, greeting ", next + 1);
        let t = Instant::now();
        replace_file(&builds[next], lib);
        loop {
            let (is_error, text) = mcp.call("reload-version", serde_json::json!({}));
            assert!(!is_error, "a call failed during a reload: {text}");
            if text == want {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "reload not picked up: {text}"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        *current = next;
        t.elapsed().as_nanos() as f64
    };
    flip(&mut mcp, &mut current);
    let before = resident_kib(pid);
    for _ in 0..rounds {
        latencies.push(flip(&mut mcp, &mut current));
    }
    let after = resident_kib(pid);
    assert!(mcp.finish().success());
    let (p50, p99) = summarize(latencies);
    let quiet = cordis_host::watch::QUIET.as_nanos() as f64;
    println!("hot reload, library replaced on disk -> first call on the new generation ({rounds} reloads):");
    println!(
        "  median {}  p99 {}  (of which the watcher's quiet period {}; reload work after it ~{})",
        human(p50),
        human(p99),
        human(quiet),
        human((p50 - quiet).max(0.0))
    );
    println!(
        "  server resident memory {before} KiB -> {after} KiB: {:+.1} KiB per reload",
        (after as f64 - before as f64) / rounds as f64
    );
}

fn main() {
    read_round_trips();
    let (s, lib) = reload_project(1, "- name: fixture-reload\n");
    reload_latency(&lib, &s);
}
