//! What the workspace-write fence costs: `write_text` and `edit_text` of a 4 KiB file
//! through `dsh-fs-sandbox` (fenced), through `dsh-fs-local`, and with plain `std::fs`
//! (temp file + fsync + rename), each backend loaded as a real cdylib through the host.
//! Prints the fenced/local and fenced/std ratios of the criterion mean estimates.
//!
//! Run with `cargo bench -p dsh-fs-sandbox --bench fence` (it builds the plugin libraries
//! of its own profile first).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use cordis_host::registry::Registry;
use cordis_host::Host;
use cordis_sdk::Service;
use criterion::Criterion;
use dsh_fs_api::{EditText, FileSystem, FsClient, WriteText, FS};
use dsh_sandbox::{SandboxExecutionPolicy, SandboxMode};

const PLUGINS: [&str; 3] = ["dsh-sandbox-policy", "dsh-fs-local", "dsh-fs-sandbox"];

/// The profile directory this bench runs from (`target/<profile>`).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("bench binary in <profile>/deps")
        .to_path_buf()
}

/// Builds the three plugin libraries in this bench's profile.
fn build_plugins() {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&root).args(["build", "--lib"]);
    for p in PLUGINS {
        cmd.args(["-p", p]);
    }
    if profile_dir().file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    let status = cmd.status().expect("run cargo build");
    assert!(status.success(), "building the plugin libraries failed");
}

/// One composition applied in-process; kept alive while its service is used. Fields drop
/// in order: the service handle before the registry that unloads its library.
struct Composition {
    fs: FsClient,
    _registry: Registry,
    _host: Host,
}

fn start(dir: &Path, name: &str, yaml: &str) -> Composition {
    let manifest = dir.join(format!("{name}.yml"));
    std::fs::write(&manifest, yaml).expect("write manifest");
    let host = Host::new(&manifest, &[profile_dir()], &dir.join("state"), false);
    let (_plan, registry) = host
        .start()
        .unwrap_or_else(|e| panic!("starting {name}: {e:#}"));
    let slot = registry.services.get(FS).expect("fs is registered");
    let fs = Service::checked::<FsClient>(FS, slot.handle.clone()).expect("fs client");
    Composition {
        _host: host,
        _registry: registry,
        fs,
    }
}

/// The baseline: what an atomic write costs with no host, no ABI and no fence.
fn std_atomic_write(path: &Path, content: &[u8]) {
    let tmp = path.with_extension("std-tmp");
    let mut f = std::fs::File::create(&tmp).expect("create temp");
    f.write_all(content).expect("write temp");
    f.sync_all().expect("fsync temp");
    std::fs::rename(&tmp, path).expect("rename");
}

fn mean_ns(criterion_dir: &Path, group: &str, bench: &str) -> Option<f64> {
    let file = criterion_dir
        .join(group)
        .join(bench)
        .join("new/estimates.json");
    let text = std::fs::read_to_string(file).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    json["mean"]["point_estimate"].as_f64()
}

fn main() {
    build_plugins();
    let scratch = tempfile::tempdir().expect("scratch dir");
    let dir = scratch.path().canonicalize().expect("canonical scratch");
    let ws = dir.join("ws");
    std::fs::create_dir_all(&ws).expect("workspace");
    let fenced = start(
        &dir,
        "fenced",
        &format!(
            "- name: dsh-sandbox-policy\n  config:\n    mode: workspace-write\n    workspaceRoot: '{}'\n- name: dsh-fs-sandbox\n",
            ws.display()
        ),
    );
    let local = start(&dir, "local", "- name: dsh-fs-local\n");
    let policy = Some(SandboxExecutionPolicy {
        mode: SandboxMode::WorkspaceWrite,
        workspace_root: ws.clone(),
    });
    let content: String = "0123456789abcdef".repeat(256);
    assert_eq!(content.len(), 4096);

    let criterion_dir = profile_dir()
        .parent()
        .expect("target dir")
        .join("criterion");
    let mut c = Criterion::default()
        .output_directory(&criterion_dir)
        .sample_size(40)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .configure_from_args();

    let backends: [(&str, &FsClient); 2] = [("fenced", &fenced.fs), ("local", &local.fs)];
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

    println!("\nfence cost (criterion mean estimates of this run):");
    for group in ["write_text", "edit_text"] {
        let m = |b: &str| mean_ns(&criterion_dir, group, b);
        match (m("fenced"), m("local"), m("std")) {
            (Some(f), Some(l), Some(s)) => println!(
                "  {group:<10} fenced {:>9.1} µs  local {:>9.1} µs  std {:>9.1} µs  fenced/local {:.3}  fenced/std {:.3}",
                f / 1e3,
                l / 1e3,
                s / 1e3,
                f / l,
                f / s
            ),
            _ => println!(
                "  {group:<10} no estimates under {} (was the group filtered out?)",
                criterion_dir.display()
            ),
        }
    }
}
