//! What the workspace-write fence costs: `write_text` and `edit_text` of a 4 KiB file
//! through `dsh-fs-sandbox` (fenced), through `dsh-fs-local`, and with plain `std::fs`
//! (temp file + fsync + rename), each backend loaded as a real cdylib through the host.
//! Prints the fenced/local and fenced/std ratios of the criterion mean estimates.
//!
//! Run with `cargo bench -p dsh-fs-sandbox --bench fence` (it builds the plugin libraries
//! of its own profile first, through the end-to-end harness).

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use cordis_e2e::bench::{criterion_estimate_ns, print_ratio};
use cordis_e2e::Scratch;
use criterion::Criterion;
use dsh_fs_api::{EditText, FileSystem, FsClient, WriteText, FS};
use dsh_sandbox::{SandboxExecutionPolicy, SandboxMode};

/// The baseline: what an atomic write costs with no host, no ABI and no fence.
fn std_atomic_write(path: &Path, content: &[u8]) {
    let tmp = path.with_extension("std-tmp");
    let mut f = std::fs::File::create(&tmp).expect("create temp");
    f.write_all(content).expect("write temp");
    f.sync_all().expect("fsync temp");
    std::fs::rename(&tmp, path).expect("rename");
}

fn main() {
    let fenced_scratch = Scratch::new();
    let ws = fenced_scratch.path().join("ws");
    std::fs::create_dir_all(&ws).expect("workspace");
    fenced_scratch.manifest(&format!(
        "- name: dsh-sandbox-policy\n  config:\n    mode: workspace-write\n    workspaceRoot: '{}'\n- name: dsh-fs-sandbox\n",
        ws.display()
    ));
    let local_scratch = Scratch::new();
    local_scratch.manifest("- name: dsh-fs-local\n");
    // Declared after the compositions so the clients drop first (before their libraries).
    let (fenced_started, local_started) = (fenced_scratch.start(), local_scratch.start());
    let fenced: FsClient = fenced_started.service(FS);
    let local: FsClient = local_started.service(FS);
    let policy = Some(dsh_sandbox::Shared::new(SandboxExecutionPolicy {
        mode: SandboxMode::WorkspaceWrite,
        workspace_root: ws.clone(),
        network: false,
        ..Default::default()
    }));
    let content: String = "0123456789abcdef".repeat(256);
    assert_eq!(content.len(), 4096);

    let mut c = Criterion::default()
        .sample_size(40)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .configure_from_args();

    let backends: [(&str, &FsClient); 2] = [("fenced", &fenced), ("local", &local)];
    {
        let mut g = c.benchmark_group("write_text");
        for (name, fs) in backends {
            let path = ws.join(format!("write-{name}.txt"));
            g.bench_function(name, |b| {
                b.iter(|| {
                    fs.write_text(WriteText {
                        path: path.clone(),
                        content: content.clone(),
                        policy: policy.clone(),
                    })
                    .expect("write_text")
                })
            });
        }
        let path = ws.join("write-std.txt");
        g.bench_function("std", |b| {
            b.iter(|| std_atomic_write(&path, content.as_bytes()))
        });
        g.finish();
    }
    {
        let mut g = c.benchmark_group("edit_text");
        let body = format!("{content}\nmarker=A\n");
        for (name, fs) in backends {
            let path = ws.join(format!("edit-{name}.txt"));
            std::fs::write(&path, &body).expect("seed edit file");
            let mut flip = false;
            g.bench_function(name, |b| {
                b.iter(|| {
                    let (old, new) = if flip {
                        ("marker=B", "marker=A")
                    } else {
                        ("marker=A", "marker=B")
                    };
                    flip = !flip;
                    fs.edit_text(EditText {
                        path: path.clone(),
                        old_string: old.into(),
                        new_string: new.into(),
                        replace_all: false,
                        policy: policy.clone(),
                    })
                    .expect("edit_text")
                })
            });
        }
        let path = ws.join("edit-std.txt");
        std::fs::write(&path, &body).expect("seed edit file");
        let mut flip = false;
        g.bench_function("std", |b| {
            b.iter(|| {
                let (old, new) = if flip {
                    ("marker=B", "marker=A")
                } else {
                    ("marker=A", "marker=B")
                };
                flip = !flip;
                let text = std::fs::read_to_string(&path).expect("read");
                std_atomic_write(&path, text.replacen(old, new, 1).as_bytes());
            })
        });
        g.finish();
    }
    c.final_summary();

    println!("\nfence cost (criterion estimates of this run):");
    for group in ["write_text", "edit_text"] {
        let m = |b: &str| criterion_estimate_ns(group, b);
        match (m("fenced"), m("local"), m("std")) {
            (Some(f), Some(l), Some(s)) => {
                print_ratio(
                    &format!("{group}: fenced vs local"),
                    ("local", l),
                    ("fenced", f),
                );
                print_ratio(
                    &format!("{group}: fenced vs std"),
                    ("std", s),
                    ("fenced", f),
                );
            }
            _ => println!("  {group}: no criterion estimates (was the group filtered out?)"),
        }
    }
}
