//! Shared pieces of the benchmarks: read criterion's estimates of this run, time two
//! subjects interleaved (so both see the same background load), print ratios.

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
    times
        .into_iter()
        .map(|mut v| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        })
        .collect()
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
