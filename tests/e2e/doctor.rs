//! `cordis doctor` on this machine and with each layer made to fail for real (a seccomp
//! filter under which the kernel answers one system call as a machine without it would),
//! and the AppArmor profile shipped in the release archive, parsed by `apparmor_parser`.

use std::process::Command;

use cordis_e2e::Scratch;
use serde_json::Value;

/// The bundled composition, its plugins from this build.
fn bundled(scratch: &Scratch) {
    let yaml = std::fs::read_to_string(cordis_e2e::workspace_root().join("cordis.yml"))
        .expect("the bundled cordis.yml");
    scratch.manifest(&yaml);
}

/// `cordis doctor --format json`: its exit code and report.
fn doctor(cmd: &mut Command) -> (Option<i32>, Value) {
    let out = cmd.output().expect("run cordis doctor");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor printed no JSON ({e}):\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code(), report)
}

fn check<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["check"] == name)
        .unwrap_or_else(|| panic!("no `{name}` check in {report:#}"))
}

#[test]
fn the_bundled_composition_can_run_here_and_every_layer_is_checked() {
    use std::os::unix::fs::PermissionsExt;
    let s = Scratch::new();
    bundled(&s);
    // A state directory others may read works (cordis tightens it at start), but is said.
    let loose = std::fs::Permissions::from_mode(0o755);
    std::fs::set_permissions(s.state_dir(), loose).expect("chmod 755");
    let (code, report) = doctor(&mut s.cordis(&["doctor", "--format", "json"]));
    assert_eq!(code, Some(0), "{report:#}");
    let state = check(&report, "state directory");
    assert_eq!(state["status"], "degraded", "{report:#}");
    assert!(
        state["fix"]
            .as_str()
            .is_some_and(|f| f.starts_with("`chmod 700")),
        "{state:#}"
    );
    let private = std::fs::Permissions::from_mode(0o700);
    std::fs::set_permissions(s.state_dir(), private).expect("chmod 700");
    let (code, report) = doctor(&mut s.cordis(&["doctor", "--format", "json"]));
    assert_eq!(code, Some(0), "{report:#}");
    assert_eq!(report["runs"], true, "{report:#}");
    for name in [
        "composition",
        "landlock",
        "user namespaces",
        "network namespace loopback",
        "seccomp",
        "confined command",
        "state directory",
    ] {
        assert_eq!(check(&report, name)["status"], "ok", "{name}: {report:#}");
    }
    // The limits need a cgroup here: v1 or delegated v2, whichever serves, said which.
    let cgroups = check(&report, "cgroups");
    assert_eq!(cgroups["status"], "ok", "{report:#}");
    assert!(
        cgroups["detail"]
            .as_str()
            .is_some_and(|d| d.starts_with("cgroup v1") || d.starts_with("cgroup v2")),
        "{cgroups:#}"
    );
    let search = check(&report, "plugin search path")["detail"]
        .as_str()
        .unwrap();
    assert!(
        search.contains("`dsh-bash-sandbox` from `"),
        "which library each entry loads: {search}"
    );
    let token = check(&report, "http token")["detail"].as_str().unwrap();
    assert!(token.contains("http-token"), "{token}");
    // The same, for people.
    let out = s.cordis(&["doctor"]).output().expect("doctor");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("this host can run the composition as configured"),
        "{text}"
    );
}

#[test]
fn without_user_namespaces_the_item_is_missing_with_its_fix_and_the_exit_says_so() {
    let s = Scratch::new();
    bundled(&s);
    let mut cmd = s.cordis(&["doctor", "--format", "json"]);
    cordis_e2e::refuse_syscall(&mut cmd, libc::SYS_unshare, libc::EPERM);
    let (code, report) = doctor(&mut cmd);
    assert_eq!(code, Some(1), "{report:#}");
    assert_eq!(report["runs"], false);
    let userns = check(&report, "user namespaces");
    assert_eq!(userns["status"], "missing", "{report:#}");
    assert!(
        userns["detail"]
            .as_str()
            .unwrap()
            .contains("creating the user, mount, pid, ipc and network namespaces failed"),
        "{userns:#}"
    );
    assert!(
        userns["fix"].as_str().is_some_and(|f| !f.is_empty()),
        "{userns:#}"
    );
    assert_eq!(check(&report, "confined command")["status"], "missing");
    // What does not need a namespace is still checked, and fine.
    assert_eq!(check(&report, "landlock")["status"], "ok", "{report:#}");
    assert_eq!(check(&report, "seccomp")["status"], "ok", "{report:#}");
}

#[test]
fn without_landlock_the_item_is_missing_with_its_fix() {
    let s = Scratch::new();
    bundled(&s);
    let mut cmd = s.cordis(&["doctor", "--format", "json"]);
    cordis_e2e::refuse_syscall(&mut cmd, libc::SYS_landlock_create_ruleset, libc::ENOSYS);
    let (code, report) = doctor(&mut cmd);
    assert_eq!(code, Some(1), "{report:#}");
    let landlock = check(&report, "landlock");
    assert_eq!(landlock["status"], "missing", "{report:#}");
    assert!(
        landlock["fix"].as_str().is_some_and(|f| f.contains("lsm=")),
        "{landlock:#}"
    );
    assert_eq!(check(&report, "user namespaces")["status"], "ok");
}

#[test]
fn without_seccomp_the_item_is_missing() {
    let s = Scratch::new();
    bundled(&s);
    let mut cmd = s.cordis(&["doctor", "--format", "json"]);
    cordis_e2e::refuse_syscall(&mut cmd, libc::SYS_seccomp, libc::EINVAL);
    let (code, report) = doctor(&mut cmd);
    assert_eq!(code, Some(1), "{report:#}");
    let seccomp = check(&report, "seccomp");
    assert_eq!(seccomp["status"], "missing", "{report:#}");
    assert!(
        seccomp["detail"]
            .as_str()
            .unwrap()
            .contains("installing the seccomp filter failed"),
        "{seccomp:#}"
    );
}

#[test]
fn a_composition_without_the_confined_shell_needs_none_of_it() {
    let s = Scratch::new();
    s.manifest(
        "- name: dsh-sandbox-policy\n  config: {mode: danger-full-access}\n- name: dsh-bash-local\n- name: dsh-tool-bash\n",
    );
    let mut cmd = s.cordis(&["doctor", "--format", "json"]);
    cordis_e2e::refuse_syscall(&mut cmd, libc::SYS_unshare, libc::EPERM);
    let (code, report) = doctor(&mut cmd);
    assert_eq!(code, Some(0), "{report:#}");
    for name in ["user namespaces", "confined command", "cgroups"] {
        assert_eq!(
            check(&report, name)["status"],
            "not-needed",
            "{name}: {report:#}"
        );
    }
}

#[test]
fn a_composition_that_does_not_plan_is_reported() {
    let s = Scratch::new();
    s.manifest("- name: dsh-tool-bash\n");
    let (code, report) = doctor(&mut s.cordis(&["doctor", "--format", "json"]));
    assert_eq!(code, Some(1), "{report:#}");
    let composition = check(&report, "composition");
    assert_eq!(composition["status"], "missing");
    assert!(
        composition["fix"]
            .as_str()
            .is_some_and(|f| f.contains("cordis check")),
        "{composition:#}"
    );
}

/// The profile in the release archive parses. AppArmor 4.0 added the `userns` rule (and
/// `abi/4.0`); an older `apparmor_parser` (Debian 12 has 3.0) cannot read those two lines,
/// so there the rest of the profile is parsed without them, and the test says so. A
/// profile with a typo in its rule does not parse either way.
#[test]
fn the_apparmor_profile_parses() {
    let profile = cordis_e2e::workspace_root().join("deploy/apparmor/cordis");
    let text = std::fs::read_to_string(&profile).expect("deploy/apparmor/cordis");
    let parser = ["apparmor_parser", "/usr/sbin/apparmor_parser", "/sbin/apparmor_parser"]
        .into_iter()
        .find(|p| Command::new(p).arg("--version").output().is_ok_and(|o| o.status.success()))
        .unwrap_or_else(|| {
            panic!(
                "apparmor_parser is not installed, so the AppArmor profile cannot be checked: install it (`apt-get install apparmor`; `cargo xtask test` does as root)"
            )
        });
    let version = String::from_utf8_lossy(
        &Command::new(parser)
            .arg("--version")
            .output()
            .expect("version")
            .stdout,
    )
    .to_string();
    let modern = version
        .split_whitespace()
        .find_map(|w| w.split('.').next()?.parse::<u32>().ok())
        .is_some_and(|major| major >= 4);
    let dir = tempfile::tempdir().expect("scratch");
    let parse = |body: &str| {
        let file = dir.path().join("cordis");
        std::fs::write(&file, body).expect("write the profile");
        let out = Command::new(parser)
            .args(["-Q", "-K"])
            .arg(&file)
            .output()
            .expect("run apparmor_parser");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let checked = if modern {
        text.clone()
    } else {
        let older: String = text
            .lines()
            .filter(|l| !l.starts_with("abi <abi/4.0>") && l.trim() != "userns,")
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(
            older.lines().count() + 2,
            text.lines().count(),
            "exactly the two AppArmor 4.0 lines are left out"
        );
        eprintln!(
            "NOTE: {} predates the `userns` rule (AppArmor 4.0): parsed the profile without its `abi <abi/4.0>` and `userns,` lines",
            version.lines().next().unwrap_or("apparmor_parser")
        );
        older
    };
    let (ok, said) = parse(&checked);
    assert!(ok, "the profile does not parse:\n{said}");
    assert!(
        checked.contains("profile cordis /usr/local/bin/cordis flags=(unconfined)"),
        "{checked}"
    );
    // The control: a mistake is caught.
    let (ok, _) = parse(&checked.replace("flags=(unconfined)", "flags=(unconfinde)"));
    assert!(!ok, "apparmor_parser accepted a misspelt flag");
}
