//! Shared pieces of the benchmarks: read criterion's estimates of this run, time two
//! subjects interleaved (so both see the same background load), print ratios, summarize
//! latencies, and the leanest stdio MCP client.

use std::time::Instant;

/// The time per iteration in nanoseconds criterion estimated in this run for
/// `group/function`: the slope when it was fitted, else the mean.
pub fn criterion_estimate_ns(group: &str, function: &str) -> Option<f64> {
    let path = crate::target_dir()
        .parent()?
        .join("criterion")
        .join(group)
        .join(function)
        .join("new/estimates.json");
    let text = std::fs::read_to_string(path).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    json["slope"]["point_estimate"]
        .as_f64()
        .or_else(|| json["mean"]["point_estimate"].as_f64())
}

/// Runs each subject once per round, alternating, and returns each one's median time per
/// run in nanoseconds.
pub fn interleaved_medians(rounds: usize, subjects: &mut [&mut dyn FnMut()]) -> Vec<f64> {
    let mut times: Vec<Vec<f64>> = subjects
        .iter()
        .map(|_| Vec::with_capacity(rounds))
        .collect();
    for _ in 0..rounds {
        for (i, subject) in subjects.iter_mut().enumerate() {
            let t = Instant::now();
            subject();
            times[i].push(t.elapsed().as_nanos() as f64);
        }
    }
    times.into_iter().map(median).collect()
}

/// The median of `values` (the upper one of an even count).
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Formats nanoseconds with a unit a person reads at a glance.
pub fn human(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.3} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.3} µs", ns / 1e3)
    } else {
        format!("{ns:.1} ns")
    }
}

/// Prints `subject` against `baseline` as a ratio.
pub fn print_ratio(label: &str, baseline: (&str, f64), subject: (&str, f64)) {
    println!(
        "  {label:<32} {} {:>12}  {} {:>12}  ratio {:.3} ({:+.1}%, {}{})",
        baseline.0,
        human(baseline.1),
        subject.0,
        human(subject.1),
        subject.1 / baseline.1,
        (subject.1 / baseline.1 - 1.0) * 100.0,
        if subject.1 >= baseline.1 { "+" } else { "-" },
        human((subject.1 - baseline.1).abs())
    );
}

/// The `p` quantile of sorted samples.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// The median and the 99th percentile.
pub fn summarize(mut samples: Vec<f64>) -> (f64, f64) {
    samples.sort_by(f64::total_cmp);
    (percentile(&samples, 0.5), percentile(&samples, 0.99))
}

/// The resident memory of process `pid` in KiB (0 when it cannot be read).
pub fn resident_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// The leanest MCP client: requests written and responses read on the calling thread, so
/// a round trip times the server and the pipes, not a client's thread hand-offs.
pub struct StdioClient {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
    next_id: u64,
}

impl StdioClient {
    /// `cordis run --no-watch` in `s`, initialized.
    pub fn start(s: &crate::Scratch) -> StdioClient {
        let mut child = s
            .cordis(&["run", "--no-watch"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("spawn cordis run");
        let mut client = StdioClient {
            stdin: child.stdin.take().expect("stdin"),
            stdout: std::io::BufReader::new(child.stdout.take().expect("stdout")),
            child,
            next_id: 0,
        };
        client.request(
            "initialize",
            &serde_json::json!({"protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "bench", "version": "0"}}),
        );
        client.send(&serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        client
    }

    fn send(&mut self, message: &serde_json::Value) {
        use std::io::Write;
        let mut line = message.to_string();
        line.push('\n');
        self.stdin
            .write_all(line.as_bytes())
            .expect("write a request");
    }

    /// The raw response line to a request.
    fn request(&mut self, method: &str, params: &serde_json::Value) -> String {
        use std::io::BufRead;
        self.next_id += 1;
        let id = format!(r#""id":{}"#, self.next_id);
        self.send(&serde_json::json!({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}));
        loop {
            let mut line = String::new();
            let n = self.stdout.read_line(&mut line).expect("read a response");
            assert!(n > 0, "cordis run closed its output during {method}");
            if line.contains(&id) {
                return line;
            }
        }
    }

    /// The raw response line to a `tools/call`.
    pub fn call(&mut self, tool: &str, args: &serde_json::Value) -> String {
        self.request(
            "tools/call",
            &serde_json::json!({"name": tool, "arguments": args}),
        )
    }

    /// Times `calls` calls of `tool` (nanoseconds each); every one must succeed.
    pub fn time_calls(&mut self, calls: usize, tool: &str, args: &serde_json::Value) -> Vec<f64> {
        let params = serde_json::json!({"name": tool, "arguments": args});
        self.time_requests(calls, "tools/call", &params, r#""isError":false"#)
    }

    /// Times `pings` round trips of `ping` (nanoseconds each): the protocol and the pipes
    /// alone, the floor under every call.
    pub fn time_pings(&mut self, pings: usize) -> Vec<f64> {
        self.time_requests(pings, "ping", &serde_json::json!({}), r#""result""#)
    }

    /// Times `count` requests of `method` (nanoseconds each); every response must contain
    /// `ok`.
    fn time_requests(
        &mut self,
        count: usize,
        method: &str,
        params: &serde_json::Value,
        ok: &str,
    ) -> Vec<f64> {
        let mut samples = Vec::with_capacity(count);
        for _ in 0..count {
            let t = Instant::now();
            let response = self.request(method, params);
            samples.push(t.elapsed().as_nanos() as f64);
            assert!(response.contains(ok), "{response}");
        }
        samples
    }

    /// Closes the input and waits for a clean exit.
    pub fn finish(mut self) {
        drop(self.stdin);
        assert!(self.child.wait().expect("wait").success());
    }
}
