//! Session retention: `cordis session prune --all` and `cordis run --retain-sessions*`
//! remove the logs of sessions by age and count, never one a live process holds (a
//! running server's), whichever process applies the policy. Ages are set with the real
//! `touch -d`.

use std::process::Command;

use cordis_e2e::{McpStdio, Scratch};

const MANIFEST: &str = "- name: dsh-sandbox-policy\n  config: {mode: danger-full-access}\n- name: dsh-bash-local\n- name: dsh-tool-bash\n";

fn new_session(s: &Scratch) -> String {
    let out = s
        .cordis(&["session", "new", "--cwd", s.path().to_str().unwrap()])
        .output()
        .expect("session new");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Sets the log's modification time to `when` (as `touch -d` reads it).
fn age(s: &Scratch, id: &str, when: &str) {
    let log = s.state_dir().join("sessions").join(format!("{id}.jsonl"));
    let status = Command::new("touch")
        .args(["-d", when])
        .arg(&log)
        .status()
        .expect("touch");
    assert!(status.success());
}

fn exists(s: &Scratch, id: &str) -> bool {
    s.state_dir()
        .join("sessions")
        .join(format!("{id}.jsonl"))
        .exists()
}

fn prune(s: &Scratch, args: &[&str]) -> (bool, String) {
    let mut all = vec!["session", "prune", "--all"];
    all.extend_from_slice(args);
    let out = s.cordis(&all).output().expect("prune");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn retention_removes_by_age_and_count_but_never_a_held_session() {
    let s = Scratch::new();
    s.manifest(MANIFEST);
    let [held, old_a, old_b, recent] = [(); 4].map(|()| new_session(&s));
    // A live server holds one of them.
    let mut server = McpStdio::start(s.cordis(&["run", "--no-watch", "--session", &held]));
    let (is_error, text) = server.call("bash", serde_json::json!({"command": "echo held"}));
    assert!(!is_error && text.contains("held"), "{text}");
    for id in [&held, &old_a, &old_b] {
        age(&s, id, "3 days ago");
    }
    age(&s, &recent, "5 minutes ago");

    let (ok, said) = prune(&s, &["--older-than", "1d"]);
    assert!(ok, "{said}");
    assert!(!exists(&s, &old_a) && !exists(&s, &old_b), "{said}");
    assert!(exists(&s, &held), "a held session was removed: {said}");
    assert!(exists(&s, &recent), "{said}");
    // By count: the held one is the older of the two left, and stays while it is held.
    let (ok, said) = prune(&s, &["--keep", "1"]);
    assert!(ok && exists(&s, &held) && exists(&s, &recent), "{said}");

    assert!(server.finish().success());
    age(&s, &held, "3 days ago");
    let (ok, said) = prune(&s, &["--keep", "1"]);
    assert!(ok, "{said}");
    assert!(
        !exists(&s, &held),
        "no longer held, beyond the count: {said}"
    );
    assert!(exists(&s, &recent), "{said}");
    // A session changed in the last minute is never removed (it may be being opened).
    let fresh = new_session(&s);
    let (ok, said) = prune(&s, &["--older-than", "0s"]);
    assert!(ok && exists(&s, &fresh) && !exists(&s, &recent), "{said}");
    // `--all` without a policy removes nothing and says why.
    let (ok, said) = prune(&s, &[]);
    assert!(!ok && said.contains("`--all` needs a policy"), "{said}");
    assert!(exists(&s, &fresh));
}

#[test]
fn a_server_applies_its_retention_at_start() {
    let s = Scratch::new();
    s.manifest(MANIFEST);
    let old = new_session(&s);
    let kept = new_session(&s);
    age(&s, &old, "40 days ago");
    age(&s, &kept, "2 days ago");
    let mut server =
        McpStdio::start(s.cordis(&["run", "--no-watch", "--retain-sessions-for", "30d"]));
    let (is_error, _) = server.call("bash", serde_json::json!({"command": "true"}));
    assert!(!is_error);
    assert!(!exists(&s, &old), "older than 30 days, removed at start");
    assert!(exists(&s, &kept));
    assert!(server.finish().success());
}
