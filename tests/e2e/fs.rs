//! End-to-end tests of the filesystem backends (`dsh-fs-local`, `dsh-fs-sandbox`) and the
//! sandbox policy service (`dsh-sandbox-policy`): the real cdylibs applied through the real
//! host, on a real disk with real symlinks. Every target that must stay untouched lives
//! outside every writable root (the scratch directories are under the temp area, which is
//! itself writable), and each case compares it byte for byte before and after.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cordis_e2e::{target_dir, unique, Host, Outside, Scratch, Started, Swapper};
use cordis_sdk::host::{ModelContext, ModelContextClient};
use cordis_sdk::Error;
use dsh_fs_api::{codes, EditText, FileSystem, FsClient, ListDir, WriteText};
use dsh_sandbox::{
    writable_roots, EnforcedFamily, ResolveArgs, SandboxExecutionPolicy, SandboxMode,
    SandboxPolicy, SandboxPolicyClient, SetModeArgs, Shared, MODE_EVENT, SANDBOX_POLICY,
};
use serde_json::json;

use SandboxMode::{DangerFullAccess, ReadOnly, WorkspaceWrite};

// ---------------------------------------------------------------------------------------
// Compositions

fn policy_entry(mode: &str, root: &Path) -> String {
    format!(
        "- name: dsh-sandbox-policy\n  config:\n    mode: {mode}\n    workspaceRoot: '{}'\n",
        root.display()
    )
}

const FS_SANDBOX: &str = "- name: dsh-fs-sandbox\n";
const FS_LOCAL: &str = "- name: dsh-fs-local\n";

fn compose(scratch: &Scratch, yaml: &str) -> Started {
    scratch.manifest(yaml);
    scratch.start()
}

/// `dsh-sandbox-policy` (default `mode`, fallback root `root`) + `dsh-fs-sandbox`.
fn fenced(scratch: &Scratch, mode: &str, root: &Path) -> Started {
    compose(
        scratch,
        &format!("{}{FS_SANDBOX}", policy_entry(mode, root)),
    )
}

fn fs_of(started: &Started) -> FsClient {
    started.service::<FsClient>(dsh_fs_api::FS)
}

fn policy_of(started: &Started) -> SandboxPolicyClient {
    started.service::<SandboxPolicyClient>(SANDBOX_POLICY)
}

fn policy(mode: SandboxMode, root: &Path) -> Option<Shared<SandboxExecutionPolicy>> {
    Some(Shared::new(SandboxExecutionPolicy {
        mode,
        workspace_root: root.to_path_buf(),
        network: false,
        ..Default::default()
    }))
}

fn write(
    fs: &FsClient,
    path: &Path,
    content: &str,
    p: Option<Shared<SandboxExecutionPolicy>>,
) -> Result<u64, Error> {
    fs.write_text(WriteText {
        path: path.to_path_buf(),
        content: content.to_string(),
        policy: p,
    })
    .map(|w| w.bytes)
}

fn edit(
    fs: &FsClient,
    path: &Path,
    old: &str,
    new: &str,
    p: Option<Shared<SandboxExecutionPolicy>>,
) -> Result<u64, Error> {
    fs.edit_text(EditText {
        path: path.to_path_buf(),
        old_string: old.to_string(),
        new_string: new.to_string(),
        replace_all: false,
        policy: p,
    })
    .map(|e| e.replacements)
}

fn symlink(target: &Path, link: &Path) {
    std::os::unix::fs::symlink(target, link).unwrap_or_else(|e| {
        panic!(
            "cannot create symlink {} -> {}: {e}",
            link.display(),
            target.display()
        )
    });
}

// ---------------------------------------------------------------------------------------
// The containment matrix

/// What a fenced mutation must do.
#[derive(Clone, Debug, PartialEq)]
enum Want {
    /// It succeeds and the content lands at this (real) path.
    Allowed(PathBuf),
    /// `FS_SANDBOX_DENIED` with `{"mode": "workspace-write"}`; an edit is denied too.
    Denied,
    /// It fails with this code.
    Fails(&'static str),
}

/// Writes `path` in workspace-write mode with workspace root `root` and checks the outcome;
/// the outside area must be byte-for-byte unchanged afterwards.
fn check(fs: &FsClient, outside: &Outside, case: &str, root: &Path, path: &Path, want: Want) {
    let mut expected = outside.snapshot();
    let content = format!("written by case `{case}`\n");
    if let Want::Allowed(lands) = &want {
        if let Ok(rel) = lands.strip_prefix(&outside.dir) {
            expected.insert(rel.to_path_buf(), format!("file {content:?}"));
        }
    }
    let p = policy(WorkspaceWrite, root);
    let got = write(fs, path, &content, p.clone());
    match (&want, &got) {
        (Want::Allowed(lands), Ok(bytes)) => {
            assert_eq!(*bytes, content.len() as u64, "case `{case}`");
            let on_disk = std::fs::read_to_string(lands)
                .unwrap_or_else(|e| panic!("case `{case}`: nothing at {}: {e}", lands.display()));
            assert_eq!(
                on_disk,
                content,
                "case `{case}`: wrong content at {}",
                lands.display()
            );
        }
        (Want::Denied, Err(e)) => {
            assert_eq!(e.code, codes::FS_SANDBOX_DENIED, "case `{case}`: {e}");
            assert_eq!(
                e.data,
                Some(json!({"mode": "workspace-write"})),
                "case `{case}`: {e}"
            );
            assert!(
                e.message
                    .contains("[sandbox: file access denied under workspace-write mode]"),
                "case `{case}`: {e}"
            );
            let edited = edit(fs, path, "original", "pwned", p);
            match edited {
                Err(e) => assert_eq!(
                    e.code,
                    codes::FS_SANDBOX_DENIED,
                    "case `{case}` (edit): {e}"
                ),
                Ok(n) => panic!("case `{case}`: the edit was allowed ({n} replacements)"),
            }
        }
        (Want::Fails(code), Err(e)) => assert_eq!(e.code, *code, "case `{case}`: {e}"),
        _ => panic!(
            "case `{case}`: wanted {want:?}, got {got:?} for {}",
            path.display()
        ),
    }
    assert_eq!(
        outside.snapshot(),
        expected,
        "case `{case}`: the outside area changed"
    );
}

#[test]
fn workspace_write_containment_matrix() {
    let scratch = Scratch::new();
    let out = Outside::new("fence");
    let ws = scratch.path().join("ws");
    std::fs::create_dir_all(ws.join("sub")).unwrap();
    std::fs::create_dir_all(out.dir.join("ws")).unwrap();
    std::fs::create_dir_all(out.dir.join("ws-evil")).unwrap();
    symlink(&out.dir, &ws.join("link-out"));
    symlink(&out.victim(), &ws.join("leaf-out"));
    symlink(&out.dir.join("not-yet.txt"), &ws.join("dangling"));
    symlink(&ws.join("sub"), &ws.join("abs-in"));
    symlink(&ws.join("loop-b"), &ws.join("loop-a"));
    symlink(&ws.join("loop-a"), &ws.join("loop-b"));
    symlink(&ws, &scratch.path().join("ws-alias"));
    std::fs::write(ws.join("existing.txt"), "original\n").unwrap();

    let started = fenced(&scratch, "read-only", &ws);
    let fs = fs_of(&started);
    let depth = ws.components().count();
    let up = "../".repeat(depth + 2);
    let out_rel = out.dir.strip_prefix("/").unwrap();
    let in_tmp = PathBuf::from("/tmp").join(format!("cordis-fence-{}.txt", unique()));
    let in_temp_dir = std::env::temp_dir().join(format!("cordis-fence-{}.txt", unique()));
    let alias = scratch.path().join("ws-alias");

    use Want::*;
    let cases: Vec<(&str, PathBuf, PathBuf, Want)> = vec![
        (
            "inside",
            ws.clone(),
            ws.join("a.txt"),
            Allowed(ws.join("a.txt")),
        ),
        (
            "new dirs inside",
            ws.clone(),
            ws.join("n/e/w.txt"),
            Allowed(ws.join("n/e/w.txt")),
        ),
        (
            "existing inside",
            ws.clone(),
            ws.join("existing.txt"),
            Allowed(ws.join("existing.txt")),
        ),
        (
            "`..` out",
            ws.clone(),
            ws.join(&up).join(out_rel).join("victim.txt"),
            Denied,
        ),
        (
            "`..` out, new file",
            ws.clone(),
            ws.join("sub").join(&up).join(out_rel).join("new.txt"),
            Denied,
        ),
        (
            "`..` stays inside",
            ws.clone(),
            ws.join("sub/../b.txt"),
            Allowed(ws.join("b.txt")),
        ),
        ("absolute outside", ws.clone(), out.victim(), Denied),
        (
            "absolute outside, new",
            ws.clone(),
            out.dir.join("new.txt"),
            Denied,
        ),
        (
            "prefix confusion",
            out.dir.join("ws"),
            out.dir.join("ws-evil/x.txt"),
            Denied,
        ),
        (
            "prefix sibling's own root",
            out.dir.join("ws"),
            out.dir.join("ws/x.txt"),
            Allowed(out.dir.join("ws/x.txt")),
        ),
        (
            "symlinked dir out, existing file",
            ws.clone(),
            ws.join("link-out/victim.txt"),
            Denied,
        ),
        (
            "symlinked dir out, new file",
            ws.clone(),
            ws.join("link-out/new.txt"),
            Denied,
        ),
        (
            "symlinked dir out, new dirs",
            ws.clone(),
            ws.join("link-out/d/e/new.txt"),
            Denied,
        ),
        ("symlink leaf out", ws.clone(), ws.join("leaf-out"), Denied),
        (
            "dangling symlink out",
            ws.clone(),
            ws.join("dangling"),
            Denied,
        ),
        (
            "absolute symlink inside",
            ws.clone(),
            ws.join("abs-in/c.txt"),
            Allowed(ws.join("sub/c.txt")),
        ),
        ("symlink loop", ws.clone(), ws.join("loop-a"), Denied),
        (
            "beneath a symlink loop",
            ws.clone(),
            ws.join("loop-a/x.txt"),
            Denied,
        ),
        (
            "the root itself",
            ws.clone(),
            ws.clone(),
            Fails(codes::FS_WRONG_KIND),
        ),
        (
            "the root with a trailing /",
            ws.clone(),
            PathBuf::from(format!("{}/", ws.display())),
            Fails(codes::FS_WRONG_KIND),
        ),
        (
            "root spelled with trailing /",
            PathBuf::from(format!("{}/", ws.display())),
            ws.join("t1.txt"),
            Allowed(ws.join("t1.txt")),
        ),
        (
            "root spelled with /.",
            ws.join("."),
            ws.join("t2.txt"),
            Allowed(ws.join("t2.txt")),
        ),
        (
            "root as a symlink",
            alias.clone(),
            ws.join("t3.txt"),
            Allowed(ws.join("t3.txt")),
        ),
        (
            "target through the root's symlink",
            ws.clone(),
            alias.join("t4.txt"),
            Allowed(ws.join("t4.txt")),
        ),
        (
            "/proc/self/root to outside",
            ws.clone(),
            Path::new("/proc/self/root")
                .join(out_rel)
                .join("victim.txt"),
            Denied,
        ),
        (
            "/proc/self/root to outside, new",
            ws.clone(),
            Path::new("/proc/self/root").join(out_rel).join("p.txt"),
            Denied,
        ),
        ("/tmp", ws.clone(), in_tmp.clone(), Allowed(in_tmp.clone())),
        (
            "the process temp dir",
            ws.clone(),
            in_temp_dir.clone(),
            Allowed(in_temp_dir.clone()),
        ),
        (
            "empty path",
            ws.clone(),
            PathBuf::new(),
            Fails(cordis_sdk::codes::INVALID_ARGUMENT),
        ),
        (
            "NUL byte",
            ws.clone(),
            PathBuf::from(format!("{}/a\0b", ws.display())),
            Fails(cordis_sdk::codes::INVALID_ARGUMENT),
        ),
        (
            "relative path",
            ws.clone(),
            PathBuf::from("ws/a.txt"),
            Fails(cordis_sdk::codes::INVALID_ARGUMENT),
        ),
    ];
    for (case, root, path, want) in cases {
        check(&fs, &out, case, &root, &path, want);
    }
    let _ = std::fs::remove_file(&in_tmp);
    let _ = std::fs::remove_file(&in_temp_dir);
    // Nothing was left behind beside the inside targets: no temp files.
    let leftovers: Vec<String> = std::fs::read_dir(&ws)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "temp files left: {leftovers:?}");
    // The clear errors say what was wrong.
    let err = write(&fs, Path::new(""), "x", policy(WorkspaceWrite, &ws)).unwrap_err();
    assert!(err.message.contains("empty"), "{err}");
    let err = write(&fs, &ws.join("a\0b"), "x", policy(WorkspaceWrite, &ws)).unwrap_err();
    assert!(err.message.contains("NUL"), "{err}");
}

/// One thread keeps exchanging an in-workspace directory with a symlink to the outside while
/// another writes beneath it through the fence: no byte may land outside.
#[test]
fn swapping_a_directory_for_a_symlink_never_escapes() {
    let scratch = Scratch::new();
    let out = Outside::new("fence");
    let ws = scratch.path().join("ws");
    std::fs::create_dir_all(ws.join("d")).unwrap();
    symlink(&out.dir, &ws.join("d-link"));
    let started = fenced(&scratch, "read-only", &ws);
    let fs = fs_of(&started);
    let before = out.snapshot();

    // `d` and `d-link` trade places atomically: `d` is the real directory, then the symlink
    // to the outside, then the directory again — never missing, so the writer races the
    // swap itself and nothing else.
    let swapper = Swapper::start(&ws.join("d"), &ws.join("d-link"));
    // The race runs until it has been exercised enough — both outcomes seen, enough writes
    // and swaps — not for a fixed time: a loaded machine only makes it take longer. The
    // deadline is there so a starved swapper fails the test instead of hanging it.
    const SWAPS: u64 = 200;
    const WRITES: u32 = 1000;
    let deadline = Instant::now() + Duration::from_secs(90);
    // Any other error is a defect; the first message of each code is kept to say which.
    let (mut allowed, mut denied) = (0u32, 0u32);
    let mut other = BTreeMap::<String, (u32, String)>::new();
    let mut iterations = 0u32;
    let exercised = |iterations: u32, allowed: u32, denied: u32| {
        iterations >= WRITES && allowed > 0 && denied > 0 && swapper.swaps() >= SWAPS
    };
    while !exercised(iterations, allowed, denied) && Instant::now() < deadline {
        iterations += 1;
        match write(
            &fs,
            &ws.join("d/f.txt"),
            "payload",
            policy(WorkspaceWrite, &ws),
        ) {
            Ok(_) => allowed += 1,
            Err(e) if e.code == codes::FS_SANDBOX_DENIED => denied += 1,
            Err(e) => other.entry(e.code.clone()).or_insert((0, e.message)).0 += 1,
        }
    }
    let was_exercised = exercised(iterations, allowed, denied);
    let swaps = swapper.stop();
    eprintln!(
        "race: {iterations} writes ({allowed} allowed, {denied} denied, other {other:?}), {swaps} swaps"
    );
    assert_eq!(out.snapshot(), before, "bytes landed outside the workspace");
    assert!(
        other.is_empty(),
        "`d` never goes missing, so every write is allowed or denied: {other:?}"
    );
    assert!(
        was_exercised,
        "the race was not exercised within the deadline: {iterations} writes \
         ({allowed} allowed, {denied} denied), {swaps} swaps; want at least {WRITES} writes, \
         {SWAPS} swaps and both outcomes"
    );
}

// ---------------------------------------------------------------------------------------
// Modes

#[test]
fn read_only_denies_every_mutation_and_leaves_the_disk_untouched() {
    let scratch = Scratch::new();
    let ws = scratch.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let existing = scratch.write("ws/existing.txt", "original\n");
    let started = fenced(&scratch, "read-only", &ws);
    let fs = fs_of(&started);
    assert_eq!(fs.sandbox_mode(()).unwrap(), Some(ReadOnly));
    let listing = || fs.list_dir(list(&ws)).unwrap();
    let before = listing();
    let in_tmp = std::env::temp_dir().join(format!("cordis-ro-{}.txt", unique()));
    let attempts: Vec<(&str, Result<u64, Error>)> = vec![
        (
            "write new, default policy",
            write(&fs, &ws.join("new.txt"), "x", None),
        ),
        (
            "write existing, default policy",
            write(&fs, &existing, "x", None),
        ),
        (
            "edit existing, default policy",
            edit(&fs, &existing, "original", "x", None),
        ),
        (
            "write new, per-call read-only",
            write(&fs, &ws.join("new.txt"), "x", policy(ReadOnly, &ws)),
        ),
        (
            "write temp area, per-call read-only",
            write(&fs, &in_tmp, "x", policy(ReadOnly, &ws)),
        ),
        (
            "edit, per-call read-only",
            edit(&fs, &existing, "original", "x", policy(ReadOnly, &ws)),
        ),
    ];
    for (what, got) in attempts {
        let e = got
            .err()
            .unwrap_or_else(|| panic!("{what}: allowed under read-only"));
        assert_eq!(e.code, codes::FS_SANDBOX_DENIED, "{what}: {e}");
        assert_eq!(e.data, Some(json!({"mode": "read-only"})), "{what}: {e}");
    }
    assert_eq!(listing(), before);
    assert_eq!(std::fs::read_to_string(&existing).unwrap(), "original\n");
    assert!(!in_tmp.exists());
    // Reads still pass.
    assert_eq!(fs.read_text(existing).unwrap(), "original\n");
}

#[test]
fn danger_full_access_writes_outside() {
    let scratch = Scratch::new();
    let out = Outside::new("fence");
    let ws = scratch.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let started = fenced(&scratch, "read-only", &ws);
    let fs = fs_of(&started);
    let p = policy(DangerFullAccess, &ws);
    write(&fs, &out.victim(), "replaced\n", p.clone()).unwrap();
    assert_eq!(
        edit(&fs, &out.victim(), "replaced", "edited", p.clone()).unwrap(),
        1
    );
    assert_eq!(std::fs::read_to_string(out.victim()).unwrap(), "edited\n");
    write(&fs, &out.dir.join("new/dir/f.txt"), "new\n", p).unwrap();
    assert_eq!(
        std::fs::read_to_string(out.dir.join("new/dir/f.txt")).unwrap(),
        "new\n"
    );
}

#[test]
fn a_call_without_a_policy_is_fenced_by_the_deployment_default() {
    let scratch = Scratch::new();
    let out = Outside::new("fence");
    let ws = scratch.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let started = fenced(&scratch, "workspace-write", &ws);
    let fs = fs_of(&started);
    assert_eq!(fs.sandbox_mode(()).unwrap(), Some(WorkspaceWrite));
    let before = out.snapshot();
    let e = write(&fs, &out.victim(), "pwned", None).unwrap_err();
    assert_eq!(e.code, codes::FS_SANDBOX_DENIED, "{e}");
    assert_eq!(e.data, Some(json!({"mode": "workspace-write"})));
    let e = edit(&fs, &out.victim(), "original", "pwned", None).unwrap_err();
    assert_eq!(e.code, codes::FS_SANDBOX_DENIED, "{e}");
    assert_eq!(out.snapshot(), before);
    write(&fs, &ws.join("ok.txt"), "fine\n", None).unwrap();
    assert_eq!(
        std::fs::read_to_string(ws.join("ok.txt")).unwrap(),
        "fine\n"
    );
}

#[test]
fn reads_through_the_fence_equal_the_local_backend() {
    let scratch = Scratch::new();
    let root = scratch.path().join("tree");
    std::fs::create_dir_all(root.join("dir/inner")).unwrap();
    std::fs::write(root.join("a.txt"), "alpha\n").unwrap();
    std::fs::write(root.join("dir/b.txt"), "beta\n").unwrap();
    std::fs::write(root.join("binary"), [0xff, 0x00, 0xfe]).unwrap();
    symlink(&root.join("a.txt"), &root.join("link"));
    symlink(&root.join("nowhere"), &root.join("dangling"));
    let local = compose(&scratch, FS_LOCAL);
    let local_fs = fs_of(&local);
    let sandbox = fenced(&scratch, "read-only", &root);
    let fenced_fs = fs_of(&sandbox);
    assert_eq!(local_fs.sandbox_mode(()).unwrap(), None);
    let paths = [
        root.clone(),
        root.join("a.txt"),
        root.join("dir"),
        root.join("dir/b.txt"),
        root.join("binary"),
        root.join("link"),
        root.join("dangling"),
        root.join("missing.txt"),
        root.join("dir/../a.txt"),
        PathBuf::from("relative"),
        PathBuf::new(),
    ];
    fn sig<T: std::fmt::Debug>(r: Result<T, Error>) -> String {
        match r {
            Ok(v) => format!("ok {v:?}"),
            Err(e) => format!("err {}", e.code),
        }
    }
    for p in paths {
        for (what, a, b) in [
            (
                "read_text",
                sig(local_fs.read_text(p.clone())),
                sig(fenced_fs.read_text(p.clone())),
            ),
            (
                "list_dir",
                sig(local_fs.list_dir(list(&p))),
                sig(fenced_fs.list_dir(list(&p))),
            ),
            (
                "stat",
                sig(local_fs.stat(p.clone())),
                sig(fenced_fs.stat(p.clone())),
            ),
            (
                "resolve",
                sig(local_fs.resolve(p.clone())),
                sig(fenced_fs.resolve(p.clone())),
            ),
        ] {
            assert_eq!(a, b, "{what} {}", p.display());
        }
    }
    // And they are right.
    assert_eq!(local_fs.read_text(root.join("link")).unwrap(), "alpha\n");
    assert_eq!(
        local_fs.read_text(root.join("binary")).unwrap_err().code,
        codes::FS_NOT_TEXT
    );
    assert_eq!(
        local_fs
            .read_text(root.join("missing.txt"))
            .unwrap_err()
            .code,
        codes::FS_NOT_FOUND
    );
    let listing = local_fs.list_dir(list(&root)).unwrap();
    let names: Vec<String> = listing.entries.into_iter().map(|e| e.name).collect();
    assert_eq!(names, ["a.txt", "binary", "dangling", "dir", "link"]);
    assert_eq!(listing.total, 5);
    // A cap keeps the first entries by name, whatever order the directory holds them in.
    let capped = local_fs
        .list_dir(ListDir {
            path: root.clone(),
            max_entries: 2,
            policy: None,
        })
        .unwrap();
    let names: Vec<String> = capped.entries.into_iter().map(|e| e.name).collect();
    assert_eq!(
        (names, capped.total),
        (vec!["a.txt".to_string(), "binary".to_string()], 5)
    );
}

/// `list_dir` arguments for `path` with a cap no test directory reaches.
fn list(path: &std::path::Path) -> ListDir {
    ListDir {
        path: path.to_path_buf(),
        max_entries: 1000,
        policy: None,
    }
}

/// Two threads edit one file concurrently, each replacing its own counter; an edit lost by
/// a concurrent read-modify-write would make the owner's next edit miss its match.
#[test]
fn concurrent_edits_of_one_file_never_lose_a_change() {
    let scratch = Scratch::new();
    let ws = scratch.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let local = Scratch::new();
    for (backend, started) in [
        ("fs-sandbox", fenced(&scratch, "workspace-write", &ws)),
        ("fs-local", compose(&local, FS_LOCAL)),
    ] {
        let fs = fs_of(&started);
        let file = ws.join(format!("counters-{backend}.txt"));
        std::fs::write(&file, "a=0\nb=0\n").unwrap();
        const N: u32 = 150;
        let threads: Vec<_> = ["a", "b"]
            .into_iter()
            .map(|key| {
                let (fs, file) = (fs.clone(), file.clone());
                std::thread::spawn(move || {
                    for i in 0..N {
                        let old = format!("{key}={i}\n");
                        let new = format!("{key}={}\n", i + 1);
                        if let Err(e) = edit(&fs, &file, &old, &new, None) {
                            panic!("{key} edit {i}: {e}");
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            if let Err(p) = t.join() {
                std::panic::resume_unwind(p);
            }
        }
        assert_eq!(
            std::fs::read_to_string(&file).unwrap(),
            format!("a={N}\nb={N}\n"),
            "{backend}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// The policy service

#[test]
fn resolve_precedence() {
    let scratch = Scratch::new();
    let fallback = scratch.path().join("fallback");
    let s1_cwd = scratch.path().join("s1");
    let s2_cwd = scratch.path().join("s2");
    for d in [&fallback, &s1_cwd, &s2_cwd] {
        std::fs::create_dir_all(d).unwrap();
    }
    let alias = scratch.path().join("fallback-alias");
    symlink(&fallback, &alias);
    let started = compose(&scratch, &policy_entry("read-only", &alias));
    let pol = policy_of(&started);
    assert_eq!(pol.default_mode(()).unwrap(), ReadOnly);
    assert_eq!(
        pol.workspace_root(()).unwrap(),
        fallback,
        "the configured root is canonicalized"
    );
    let s1 = started.host.sessions().create(&s1_cwd).unwrap().id;
    let s2 = started.host.sessions().create(&s2_cwd).unwrap().id;
    pol.set_sandbox_mode(SetModeArgs {
        session: s2.clone(),
        mode: WorkspaceWrite,
    })
    .unwrap();
    pol.set_sandbox_mode(SetModeArgs {
        session: s2.clone(),
        mode: DangerFullAccess,
    })
    .unwrap();
    let events = started
        .host
        .sessions()
        .events(&s2, Some(MODE_EVENT))
        .unwrap();
    assert_eq!(events.len(), 2, "one event per switch");
    assert_eq!(events[1].data, json!({"mode": "danger-full-access"}));

    let cases: Vec<(Option<&str>, Option<SandboxMode>, SandboxMode, &Path)> = vec![
        (None, None, ReadOnly, &fallback),
        (None, Some(WorkspaceWrite), WorkspaceWrite, &fallback),
        (Some(&s1), None, ReadOnly, &s1_cwd),
        (Some(&s1), Some(DangerFullAccess), DangerFullAccess, &s1_cwd),
        (Some(&s2), None, DangerFullAccess, &s2_cwd),
        (Some(&s2), Some(ReadOnly), ReadOnly, &s2_cwd),
    ];
    for (session, mode, want_mode, want_root) in cases {
        let got = pol
            .resolve(ResolveArgs {
                session: session.map(str::to_string),
                mode,
            })
            .unwrap_or_else(|e| panic!("resolve({session:?}, {mode:?}): {e}"));
        assert_eq!(
            (got.mode, got.workspace_root.as_path()),
            (want_mode, want_root),
            "resolve({session:?}, {mode:?})"
        );
    }
    let e = pol
        .resolve(ResolveArgs {
            session: Some("no-such-session".into()),
            mode: None,
        })
        .unwrap_err();
    assert!(e.message.contains("no-such-session"), "{e}");
}

#[test]
fn a_mode_switch_survives_a_host_restart() {
    let scratch = Scratch::new();
    let yaml = policy_entry("read-only", &scratch.path());
    let (id, seq) = {
        let started = compose(&scratch, &yaml);
        let id = started.host.sessions().create(&scratch.path()).unwrap().id;
        let seq = policy_of(&started)
            .set_sandbox_mode(SetModeArgs {
                session: id.clone(),
                mode: WorkspaceWrite,
            })
            .unwrap();
        (id, seq)
    };
    assert_eq!(seq, 1);
    let started = compose(&scratch, &yaml);
    let got = policy_of(&started)
        .resolve(ResolveArgs {
            session: Some(id.clone()),
            mode: None,
        })
        .unwrap();
    assert_eq!(got.mode, WorkspaceWrite);
    assert_eq!(
        started
            .host
            .sessions()
            .events(&id, Some(MODE_EVENT))
            .unwrap()
            .len(),
        1
    );
}

#[test]
fn a_forged_mode_event_is_rejected() {
    let scratch = Scratch::new();
    let started = compose(
        &scratch,
        &format!(
            "{}{FS_SANDBOX}",
            policy_entry("workspace-write", &scratch.path())
        ),
    );
    let pol = policy_of(&started);
    let id = started.host.sessions().create(&scratch.path()).unwrap().id;
    pol.set_sandbox_mode(SetModeArgs {
        session: id.clone(),
        mode: ReadOnly,
    })
    .unwrap();
    let seq = started
        .host
        .sessions()
        .append(&id, MODE_EVENT, json!({"mode": "root"}))
        .unwrap();
    for mode in [None, Some(DangerFullAccess)] {
        let e = pol
            .resolve(ResolveArgs {
                session: Some(id.clone()),
                mode,
            })
            .unwrap_err();
        assert_eq!(e.code, "SANDBOX_FORGED_MODE", "{e}");
        assert!(
            e.message.contains(&format!("#{seq}")) && e.message.contains("root"),
            "{e}"
        );
    }
    let e = pol.policy_text(Some(id)).unwrap_err();
    assert_eq!(e.code, "SANDBOX_FORGED_MODE", "{e}");
}

#[test]
fn two_sessions_share_one_set_of_services_each_confined_to_its_own_root() {
    let scratch = Scratch::new();
    let out = Outside::new("fence");
    let (a, b) = (out.dir.join("a"), out.dir.join("b"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    let started = fenced(&scratch, "read-only", &scratch.path());
    let (pol, fs) = (policy_of(&started), fs_of(&started));
    let sa = started.host.sessions().create(&a).unwrap().id;
    let sb = started.host.sessions().create(&b).unwrap().id;
    for s in [&sa, &sb] {
        pol.set_sandbox_mode(SetModeArgs {
            session: s.clone(),
            mode: WorkspaceWrite,
        })
        .unwrap();
    }
    let threads: Vec<_> = [(sa, a.clone(), b.clone()), (sb, b.clone(), a.clone())]
        .into_iter()
        .map(|(session, own, other)| {
            let (pol, fs) = (pol.clone(), fs.clone());
            std::thread::spawn(move || {
                for i in 0..40 {
                    let p = pol
                        .resolve(ResolveArgs {
                            session: Some(session.clone()),
                            mode: None,
                        })
                        .unwrap();
                    assert_eq!(p.workspace_root, own);
                    let name = format!("{session}-{i}.txt");
                    write(&fs, &own.join(&name), &name, Some(p.clone())).unwrap();
                    let e = write(&fs, &other.join(&name), &name, Some(p)).unwrap_err();
                    assert_eq!(e.code, codes::FS_SANDBOX_DENIED, "{e}");
                }
            })
        })
        .collect();
    for t in threads {
        if let Err(p) = t.join() {
            std::panic::resume_unwind(p);
        }
    }
    for dir in [&a, &b] {
        let names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names.len(),
            40,
            "each session wrote only its own root: {}: {names:?}",
            dir.display()
        );
    }
}

#[test]
fn enforced_families_are_independent_contributions_in_canonical_order() {
    let scratch = Scratch::new();
    let started = fenced(&scratch, "workspace-write", &scratch.path());
    let pol = policy_of(&started);
    use EnforcedFamily::{Bash, Filesystem, Terminal};
    let families = || pol.enforced_families(()).unwrap();
    assert_eq!(
        families(),
        [Filesystem],
        "fs-sandbox registers the filesystem family"
    );
    let t1 = pol.register_enforced_family(Terminal).unwrap();
    let t2 = pol.register_enforced_family(Bash).unwrap();
    let t3 = pol.register_enforced_family(Bash).unwrap();
    let t4 = pol.register_enforced_family(Filesystem).unwrap();
    assert_eq!(families(), [Filesystem, Bash, Terminal]);
    pol.unregister_enforced_family(t2).unwrap();
    assert_eq!(
        families(),
        [Filesystem, Bash, Terminal],
        "bash still has one contribution"
    );
    pol.unregister_enforced_family(t3).unwrap();
    assert_eq!(families(), [Filesystem, Terminal]);
    pol.unregister_enforced_family(t4).unwrap();
    assert_eq!(
        families(),
        [Filesystem, Terminal],
        "fs-sandbox's contribution remains"
    );
    pol.unregister_enforced_family(t1).unwrap();
    assert_eq!(families(), [Filesystem]);
    assert!(
        pol.unregister_enforced_family(t1).is_err(),
        "a token is withdrawn once"
    );
}

#[test]
fn policy_text_is_empty_without_a_family_and_names_the_canonical_root() {
    let scratch = Scratch::new();
    let ws = scratch.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let alias = scratch.path().join("ws-alias");
    symlink(&ws, &alias);
    let started = compose(&scratch, &policy_entry("workspace-write", &alias));
    let pol = policy_of(&started);
    assert_eq!(pol.policy_text(None).unwrap(), "");
    let token = pol
        .register_enforced_family(EnforcedFamily::Filesystem)
        .unwrap();
    let text = pol.policy_text(None).unwrap();
    assert!(
        text.starts_with("Current DSH file policy: workspace-write."),
        "{text}"
    );
    assert!(text.contains(&format!("\"{}\"", ws.display())), "{text}");
    assert!(!text.contains("ws-alias"), "{text}");
    assert_eq!(pol.policy_text(None).unwrap(), text, "byte-stable");
    let id = started.host.sessions().create(&ws).unwrap().id;
    pol.set_sandbox_mode(SetModeArgs {
        session: id.clone(),
        mode: ReadOnly,
    })
    .unwrap();
    assert!(pol
        .policy_text(Some(id.clone()))
        .unwrap()
        .starts_with("Current DSH file policy: read-only."));
    // Front-ends read the same text through the `sandbox:policy` model-context service.
    let context: ModelContextClient = started.service("sandbox:policy");
    assert_eq!(
        context.context(Some(id.clone())).unwrap(),
        pol.policy_text(Some(id.clone())).unwrap()
    );
    assert_eq!(context.context(None).unwrap(), text);
    pol.unregister_enforced_family(token).unwrap();
    assert_eq!(pol.policy_text(None).unwrap(), "");
    assert_eq!(context.context(Some(id)).unwrap(), "");
}

/// The fence allows exactly the paths beneath `writable_roots(policy)`.
#[test]
fn the_fence_agrees_with_writable_roots() {
    let scratch = Scratch::new();
    let out = Outside::new("fence");
    let ws = out.dir.join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::create_dir_all(out.dir.join("ws-sibling")).unwrap();
    let started = fenced(&scratch, "read-only", &ws);
    let fs = fs_of(&started);
    let p = SandboxExecutionPolicy {
        mode: WorkspaceWrite,
        workspace_root: ws.clone(),
        network: false,
        ..Default::default()
    };
    let roots = writable_roots(&p).expect("the workspace is a root");
    assert_eq!(roots[0], ws);
    let name = format!("cordis-parity-{}.txt", unique());
    let mut candidates: Vec<PathBuf> = roots.iter().map(|r| r.join(&name)).collect();
    candidates.push(out.dir.join("ws-sibling").join(&name));
    candidates.push(out.dir.join(&name));
    candidates.push(target_dir().join(&name));
    for path in candidates {
        let beneath = roots.iter().any(|r| path.starts_with(r));
        let got = write(&fs, &path, "parity", Some(p.clone().into()));
        match (&got, beneath) {
            (Ok(_), true) => assert_eq!(std::fs::read_to_string(&path).unwrap(), "parity"),
            (Err(e), false) => {
                assert_eq!(e.code, codes::FS_SANDBOX_DENIED, "{}: {e}", path.display());
                assert!(!path.exists(), "{}", path.display());
            }
            _ => panic!(
                "{}: beneath a writable root = {beneath}, but the fence said {got:?}",
                path.display()
            ),
        }
        if beneath {
            let _ = std::fs::remove_file(&path);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Config

#[test]
fn an_invalid_mode_fails_cordis_check() {
    let scratch = Scratch::new();
    scratch.manifest("- name: dsh-sandbox-policy\n  config:\n    mode: workspace_write\n");
    let run = scratch.run(&["check"]);
    assert_ne!(
        run.code(),
        Some(0),
        "check accepted an invalid mode\n{}",
        run.context()
    );
    run.expect_output(&[
        "mode",
        "workspace_write",
        "read-only, workspace-write, danger-full-access",
    ]);
    scratch.manifest("- name: dsh-sandbox-policy\n  config:\n    mode: workspace-write\n");
    scratch.run(&["check"]).expect_code(0);
}

#[test]
fn a_missing_workspace_root_fails_at_apply_naming_it() {
    let scratch = Scratch::new();
    let missing = scratch.path().join("no-such-root");
    scratch.manifest(&policy_entry("read-only", &missing));
    cordis_e2e::build_workspace();
    let host = Host::new(
        &scratch.path().join("cordis.yml"),
        &[target_dir()],
        &scratch.state_dir(),
        false,
    );
    let err = match host.start() {
        Ok(_) => panic!("a missing workspaceRoot was accepted"),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        err.contains(&missing.display().to_string()) && err.contains("workspaceRoot"),
        "{err}"
    );
}
