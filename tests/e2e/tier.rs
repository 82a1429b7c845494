//! The `landlock-only` tier, on a host made to refuse user namespaces for real (a seccomp
//! filter under which the kernel answers `unshare` with `EPERM`, as Ubuntu's AppArmor
//! restriction does): commands run with writes outside the workspace, unreadable paths and
//! the network refused; without the option nothing runs; what the tier cannot enforce is
//! refused, not lost. Everything lives outside the temp areas (`/tmp` is writable, and the
//! tier refuses a protected path inside a writable root): the manifest, the state, and the
//! `cordis` binary with the plugins it loads (copied, so a build under `/tmp` is not a
//! protected path inside a writable root).

use std::path::PathBuf;
use std::process::Command;

use cordis_e2e::Outside;
use serde_json::Value;

struct Host {
    outside: Outside,
}

impl Host {
    fn new(policy: &str) -> Host {
        let outside = Outside::new("tier");
        for dir in ["ws", "state", "data", "bin"] {
            std::fs::create_dir_all(outside.dir.join(dir)).expect("mkdir");
        }
        // Plugins are found next to the binary.
        let bin = outside.dir.join("bin");
        std::fs::copy(cordis_e2e::cordis_bin(), bin.join("cordis")).expect("copy cordis");
        for plugin in ["dsh-sandbox-policy", "dsh-bash-sandbox", "dsh-tool-bash"] {
            let lib = cordis_e2e::library(plugin);
            std::fs::copy(&lib, bin.join(lib.file_name().expect("a file"))).expect("copy a plugin");
        }
        std::fs::write(outside.dir.join("secret.txt"), "s3cret\n").expect("secret");
        let host = Host { outside };
        host.manifest(policy);
        host
    }

    fn dir(&self, name: &str) -> PathBuf {
        self.outside.dir.join(name)
    }

    fn manifest(&self, policy: &str) {
        let yaml = format!(
            "- name: dsh-sandbox-policy\n  config:\n    mode: workspace-write\n    denyRead: ['{}']\n{policy}- name: dsh-bash-sandbox\n- name: dsh-tool-bash\n",
            self.dir("secret.txt").display()
        );
        std::fs::write(self.dir("cordis.yml"), yaml).expect("manifest");
    }

    fn cordis(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(self.dir("bin/cordis"));
        cmd.current_dir(self.dir("ws"))
            .env("CORDIS_STATE_DIR", self.dir("state"))
            .env("XDG_DATA_HOME", self.dir("data"))
            .env_remove("CORDIS_PLUGIN_PATH")
            .env("RUST_LOG", "warn")
            .arg("-c")
            .arg(self.dir("cordis.yml"))
            .args(args);
        cmd
    }

    /// `cordis call bash` with user namespaces refused: exit code, and the JSON result (or
    /// what was printed).
    fn bash(&self, command: &str) -> (Option<i32>, Value, String) {
        let args = serde_json::json!({ "command": command }).to_string();
        let mut cmd = self.cordis(&["call", "--format", "json", "bash", &args]);
        cordis_e2e::refuse_syscall(&mut cmd, libc::SYS_unshare, libc::EPERM);
        let out = cmd.output().expect("cordis call");
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        let said = format!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
        let json = stdout
            .lines()
            .next()
            .and_then(|l| serde_json::from_str(l).ok())
            .unwrap_or(Value::Null);
        (out.status.code(), json, said)
    }
}

const TIER: &str = "    confinement: landlock-only\n";

fn script(host: &Host) -> String {
    let outside = host.dir("escaped.txt");
    format!(
        "echo in > inside.txt; cat inside.txt; \
         echo out > '{outside}' || echo 'write outside refused'; \
         cat '{secret}' || echo 'secret refused'; \
         ls '{state}' || echo 'state refused'; \
         python3 -c 'import socket; socket.socket(socket.AF_INET)' 2>/dev/null || echo 'ip socket refused'; \
         python3 -c 'import socket; socket.socket(socket.AF_INET6)' 2>/dev/null || echo 'ipv6 socket refused'; \
         python3 -c 'import socket; socket.socket(socket.AF_UNIX)' 2>/dev/null || echo 'unix socket refused'; \
         cat /proc/{host_pid}/environ >/dev/null 2>&1 || echo 'host environ refused'; \
         kill -0 {host_pid} 2>/dev/null || echo 'host signal refused'; \
         echo 1 > /proc/sys/vm/drop_caches 2>/dev/null || echo 'proc sys refused'; \
         cat '/proc/1/root{secret}' 2>/dev/null || echo 'secret alias refused'; \
         ln '{secret}' hard 2>/dev/null || echo 'hard link refused'; \
         grep NoNewPrivs /proc/self/status; grep CapEff /proc/self/status",
        outside = outside.display(),
        secret = host.dir("secret.txt").display(),
        state = host.dir("state").display(),
        host_pid = std::process::id(),
    )
}

#[test]
fn the_landlock_only_tier_runs_where_user_namespaces_are_refused() {
    let host = Host::new(TIER);
    let (code, result, said) = host.bash(&script(&host));
    assert_eq!(code, Some(0), "{said}");
    let stdout = result["structuredContent"]["stdout"]
        .as_str()
        .unwrap_or_default();
    for line in [
        "in",
        "write outside refused",
        "secret refused",
        "state refused",
        "ip socket refused",
        "ipv6 socket refused",
        "unix socket refused",
        // No namespace hides the host's processes: Landlock keeps the command from
        // reading or signalling them, and from reaching an unreadable file by an alias
        // (`/proc/1/root`, a hard link).
        "host environ refused",
        "host signal refused",
        "proc sys refused",
        "secret alias refused",
        "hard link refused",
        "NoNewPrivs:\t1",
        "CapEff:\t0000000000000000",
    ] {
        assert!(
            stdout.lines().any(|l| l == line),
            "missing {line:?}: {said}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(host.dir("ws/inside.txt"))
            .ok()
            .as_deref(),
        Some("in\n")
    );
    assert!(!host.dir("escaped.txt").exists(), "{said}");
}

#[test]
fn without_the_option_nothing_runs_where_user_namespaces_are_refused() {
    let host = Host::new("");
    let (code, _, said) = host.bash("echo ran > ran.txt");
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("SHELL_SANDBOX_UNAVAILABLE"), "{said}");
    assert!(
        said.contains("creating the user, mount, pid, ipc and network namespaces"),
        "{said}"
    );
    assert!(!host.dir("ws/ran.txt").exists(), "{said}");
}

fn refused_and_nothing_ran(host: &Host, needles: &[&str]) {
    let (code, _, said) = host.bash("echo ran > ran.txt");
    assert_eq!(code, Some(1), "{said}");
    for needle in ["SHELL_SANDBOX_UNAVAILABLE", "`landlock-only`"]
        .iter()
        .chain(needles)
    {
        assert!(said.contains(needle), "missing {needle:?}: {said}");
    }
    assert!(!host.dir("ws/ran.txt").exists(), "{said}");
}

#[test]
fn the_tier_refuses_a_repository_in_the_workspace_it_could_not_keep_read_only() {
    let host = Host::new(TIER);
    let git = Command::new("git")
        .args(["init", "-q"])
        .current_dir(host.dir("ws"))
        .status()
        .expect("git init");
    assert!(git.success());
    let dotgit = host.dir("ws/.git");
    refused_and_nothing_ran(
        &host,
        &[
            &format!("`{}` must stay read-only", dotgit.display()),
            "Landlock cannot keep part of a writable root read-only",
        ],
    );
}

#[test]
fn the_tier_refuses_an_unreadable_path_inside_the_workspace() {
    let host = Host::new(TIER);
    let env = host.dir("ws/.env");
    std::fs::write(&env, "TOKEN=x\n").expect(".env");
    // `**/.env` inside the workspace: Landlock cannot hide part of a writable root.
    let yaml = std::fs::read_to_string(host.dir("cordis.yml"))
        .unwrap()
        .replace("denyRead: ['", "denyRead: ['**/.env', '");
    std::fs::write(host.dir("cordis.yml"), yaml).unwrap();
    refused_and_nothing_ran(&host, &[&format!("`{}` must be unreadable", env.display())]);
}

#[test]
fn the_tier_refuses_the_network_allowlist_at_start() {
    let host = Host::new(&format!("{TIER}    network: {{allow: [example.org]}}\n"));
    let (code, _, said) = host.bash("echo ran > ran.txt");
    assert_ne!(code, Some(0), "{said}");
    assert!(said.contains("SANDBOX_BAD_NETWORK"), "{said}");
    assert!(said.contains("landlock-only"), "{said}");
    assert!(!host.dir("ws/ran.txt").exists(), "{said}");
}

#[test]
fn doctor_reports_the_tier_and_needs_no_user_namespace_for_it() {
    let host = Host::new(TIER);
    let mut cmd = host.cordis(&["doctor", "--format", "json"]);
    cordis_e2e::refuse_syscall(&mut cmd, libc::SYS_unshare, libc::EPERM);
    let out = cmd.output().expect("doctor");
    let report: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(out.status.code(), Some(0), "{report:#}");
    let status = |name: &str| {
        report["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["check"] == name)
            .map(|c| c["status"].clone())
            .unwrap_or(Value::Null)
    };
    assert_eq!(status("user namespaces"), "not-needed", "{report:#}");
    assert_eq!(status("confined command"), "degraded", "{report:#}");
    assert_eq!(status("landlock"), "ok", "{report:#}");
    assert_eq!(status("seccomp"), "ok", "{report:#}");
}
