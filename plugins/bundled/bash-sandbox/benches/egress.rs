//! Benchmark of the network allowlist's proxy: a confined `curl` (the real
//! `dsh-bash-sandbox` cdylib through the host) fetching from a server this bench runs on
//! the host's loopback, through the proxy (`network:` as a map allowing it) against the
//! same directly (`network: true`, no network namespace). Two figures, each from rounds
//! that alternate the two:
//!
//! - latency: 200 sequential requests of 4 KiB, each on a new connection
//!   (`Connection: close`, so the direct run opens as many connections as the proxied one);
//!   the proxy's added time per request at the median (`curl`'s `time_total`);
//! - throughput: one download of 100 MiB (`curl`'s `speed_download`), proxied over direct.
//!
//! Run with `cargo bench -p dsh-bash-sandbox --bench egress`.

use std::io::{Read, Write};
use std::net::TcpListener;

use cordis_e2e::bench::percentile;
use cordis_e2e::Scratch;
use dsh_sandbox::egress::Egress;
use dsh_sandbox::{SandboxExecutionPolicy, SandboxMode};
use dsh_shell_api::{ExecRequest, Shell, ShellClient};

const REQUESTS: usize = 200;
const SMALL: usize = 4 * 1024;
const BIG: usize = 100 * 1024 * 1024;
const ROUNDS: usize = 5;

/// One response per connection: 4 KiB for `/small`, 100 MiB for `/big`.
fn serve(listener: TcpListener) {
    let small = vec![b's'; SMALL];
    let big = vec![b'b'; 1024 * 1024];
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else { continue };
        let (small, big) = (small.clone(), big.clone());
        std::thread::spawn(move || {
            let mut head = Vec::new();
            let mut buf = [0u8; 4096];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let is_big = head.starts_with(b"GET /big");
            let length = if is_big { BIG } else { SMALL };
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n"
            );
            let _ = if is_big {
                (0..BIG / big.len()).try_for_each(|_| stream.write_all(&big))
            } else {
                stream.write_all(&small)
            };
            let _ = stream.shutdown(std::net::Shutdown::Write);
        });
    }
}

fn main() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the bench server");
    let port = listener.local_addr().expect("its port").port();
    std::thread::spawn(move || serve(listener));

    let scratch = Scratch::new();
    let ws = scratch.path().join("ws");
    std::fs::create_dir_all(&ws).expect("bench workspace");
    scratch.manifest(&format!(
        "- name: dsh-sandbox-policy\n  config:\n    mode: workspace-write\n    workspaceRoot: '{}'\n- name: dsh-bash-sandbox\n",
        ws.display()
    ));
    let started = scratch.start();
    let shell: ShellClient = started.service("shell");
    let direct = SandboxExecutionPolicy {
        mode: SandboxMode::WorkspaceWrite,
        workspace_root: ws.clone(),
        network: true,
        ..Default::default()
    };
    let proxied = SandboxExecutionPolicy {
        network: false,
        egress: Some(Egress {
            allow: vec!["127.0.0.1".into()],
            allow_private: vec!["127.0.0.1/32".into()],
            ..Egress::default()
        }),
        ..direct.clone()
    };
    let run = |policy: &SandboxExecutionPolicy, command: String| -> String {
        let r = shell
            .exec(ExecRequest {
                command,
                cwd: ws.clone(),
                env: Vec::new(),
                timeout_ms: Some(300_000),
                output_limit: None,
                policy: Some(policy.clone().into()),
                cancel_fd: None,
                progress_fd: None,
            })
            .expect("the command runs");
        assert_eq!(r.exit_code, Some(0), "{r:?}");
        r.stdout
    };
    // `NO_PROXY` (the command's own loopback) would send 127.0.0.1 around the proxy: the
    // proxied run names the proxy and an empty `--noproxy`, the direct one `--noproxy '*'`.
    let small = format!("http://127.0.0.1:{port}/small");
    let urls: String = (0..REQUESTS)
        .map(|_| format!(" -o /dev/null {small}"))
        .collect();
    let latency = |proxy: &str| {
        format!("curl -sS {proxy} -H 'Connection: close' -w '%{{time_total}}\\n'{urls}")
    };
    let download = |proxy: &str| {
        format!(
            "curl -sS {proxy} -o /dev/null -w '%{{speed_download}}\\n' http://127.0.0.1:{port}/big"
        )
    };
    let (through, around) = (
        "--proxy http://127.0.0.1:3128 --noproxy ''",
        "--noproxy '*'",
    );
    let numbers = |out: String| -> Vec<f64> {
        out.lines()
            .map(|l| l.trim().parse::<f64>().expect("curl prints a number"))
            .collect()
    };
    let (mut direct_times, mut proxied_times) = (Vec::new(), Vec::new());
    let (mut direct_speeds, mut proxied_speeds) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        direct_times.extend(numbers(run(&direct, latency(around))));
        proxied_times.extend(numbers(run(&proxied, latency(through))));
        direct_speeds.extend(numbers(run(&direct, download(around))));
        proxied_speeds.extend(numbers(run(&proxied, download(through))));
    }
    for v in [
        &mut direct_times,
        &mut proxied_times,
        &mut direct_speeds,
        &mut proxied_speeds,
    ] {
        v.sort_by(f64::total_cmp);
    }
    let (d50, p50) = (
        percentile(&direct_times, 0.5) * 1e3,
        percentile(&proxied_times, 0.5) * 1e3,
    );
    let (d90, p90) = (
        percentile(&direct_times, 0.9) * 1e3,
        percentile(&proxied_times, 0.9) * 1e3,
    );
    println!(
        "{} requests of 4 KiB, each on a new connection ({ROUNDS} rounds, alternating):",
        REQUESTS * ROUNDS
    );
    println!("  direct (network: true)   p50 {d50:.3} ms, p90 {d90:.3} ms");
    println!("  through the proxy        p50 {p50:.3} ms, p90 {p90:.3} ms");
    println!(
        "  added by the proxy: {:.3} ms per request at p50 (target: at most 0.5 ms), ratio {:.2}",
        p50 - d50,
        p50 / d50
    );
    let (ds, ps) = (
        percentile(&direct_speeds, 0.5) / 1048576.0,
        percentile(&proxied_speeds, 0.5) / 1048576.0,
    );
    println!("one download of 100 MiB, median of {ROUNDS}:");
    println!("  direct {ds:.0} MiB/s, through the proxy {ps:.0} MiB/s");
    println!(
        "  proxied / direct: {:.1}% (target: at least 80%)",
        ps / ds * 100.0
    );
}
