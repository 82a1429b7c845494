//! The fence against a racing swap, made deterministic: through the test-only seam in
//! [`Target::beneath`] a directory on the path (or the file itself) is swapped for a
//! symlink leading outside exactly between the containment check and the opens, for a
//! write, a write that creates new parent directories, and an edit. Then the same race run
//! freely against a swapper thread, counting the swaps that really fell inside the window.
//! And a read's file swapped exactly between its look at the path and its open.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dsh_fs_api::codes;
use dsh_sandbox::{SandboxExecutionPolicy, SandboxMode};

use super::race::{self, Point};
use super::{fenced_target, read_lines, Parents, ReadDeny};

/// A workspace (under the temp area) and a directory outside every writable root.
struct Layout {
    _ws: tempfile::TempDir,
    _outside: tempfile::TempDir,
    ws: PathBuf,
    outside: PathBuf,
}

impl Layout {
    fn new() -> Layout {
        let ws_dir = tempfile::tempdir().expect("workspace");
        let ws = ws_dir.path().canonicalize().expect("canonical workspace");
        let policy = policy(&ws);
        let roots = dsh_sandbox::writable_roots(&policy).expect("the workspace is a root");
        // This workspace's build directory, else the user's cache, else /var/tmp: the first
        // that no writable root contains.
        let candidates = [
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../target"),
            std::env::var_os("HOME")
                .map(|h| PathBuf::from(h).join(".cache/cordis-fs-core-tests"))
                .unwrap_or_default(),
            PathBuf::from("/var/tmp/cordis-fs-core-tests"),
        ];
        let base = candidates
            .iter()
            .filter(|c| !c.as_os_str().is_empty() && std::fs::create_dir_all(c).is_ok())
            .filter_map(|c| c.canonicalize().ok())
            .find(|c| dsh_sandbox::containing_root(c, &roots).is_none())
            .unwrap_or_else(|| {
                panic!("no directory outside the writable roots {roots:?} among {candidates:?}")
            });
        let outside_dir = tempfile::Builder::new()
            .prefix("race-outside-")
            .tempdir_in(&base)
            .expect("outside dir");
        let outside = outside_dir
            .path()
            .canonicalize()
            .expect("canonical outside");
        Layout {
            _ws: ws_dir,
            _outside: outside_dir,
            ws,
            outside,
        }
    }

    /// Everything outside, by name and content.
    fn outside_listing(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = std::fs::read_dir(&self.outside)
            .expect("list outside")
            .map(|e| {
                let e = e.expect("entry");
                let content = std::fs::read_to_string(e.path()).unwrap_or_else(|_| "<dir>".into());
                (e.file_name().to_string_lossy().into_owned(), content)
            })
            .collect();
        out.sort();
        out
    }
}

fn policy(ws: &Path) -> SandboxExecutionPolicy {
    SandboxExecutionPolicy {
        mode: SandboxMode::WorkspaceWrite,
        workspace_root: ws.to_path_buf(),
        network: false,
        ..Default::default()
    }
}

/// Swaps `victim` for a symlink to `target` (the original moved aside).
fn swap_for_symlink(victim: &Path, target: &Path) {
    let parked = victim.with_extension("parked");
    std::fs::rename(victim, parked).expect("move the original aside");
    std::os::unix::fs::symlink(target, victim).expect("plant the symlink");
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Write,
    Edit,
}

/// Runs `op` on `rel` (beneath the workspace) with `swap` done exactly inside the window,
/// and returns the error code (or `None` on success) and the window ends seen.
fn raced(
    layout: &Layout,
    rel: &str,
    op: Op,
    swap: impl FnOnce() + 'static,
) -> (Option<String>, Vec<Point>) {
    raced_under(policy(&layout.ws), layout, rel, op, swap)
}

/// [`raced`] under `policy`.
fn raced_under(
    policy: SandboxExecutionPolicy,
    layout: &Layout,
    rel: &str,
    op: Op,
    swap: impl FnOnce() + 'static,
) -> (Option<String>, Vec<Point>) {
    let seen = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let mut swap = Some(swap);
    let log = seen.clone();
    let path = layout.ws.join(rel);
    let outcome = race::with(
        move |point| {
            log.borrow_mut().push(point);
            if point == Point::Checked {
                if let Some(swap) = swap.take() {
                    swap();
                }
            }
        },
        || match op {
            Op::Write => fenced_target(&policy, &path, Parents::Create)
                .and_then(|t| t.write(b"raced\n"))
                .map(|_| ()),
            Op::Edit => fenced_target(&policy, &path, Parents::Existing)
                .and_then(|t| t.edit("old", "raced", false))
                .map(|_| ()),
        },
    );
    let points = seen.borrow().clone();
    (outcome.err().map(|e| e.code.to_string()), points)
}

#[test]
fn a_directory_swapped_for_a_symlink_inside_the_window_is_denied() {
    let denied = Some(codes::FS_SANDBOX_DENIED.to_string());
    // (what, path, op, files laid out first)
    let cases: [(&str, &str, Op, &[&str]); 3] = [
        (
            "write into an existing directory",
            "d/f.txt",
            Op::Write,
            &[],
        ),
        (
            "write creating new parent directories",
            "d/new/f.txt",
            Op::Write,
            &[],
        ),
        ("edit", "d/f.txt", Op::Edit, &["f.txt"]),
    ];
    let mut problems = Vec::new();
    for (what, rel, op, files) in cases {
        let layout = Layout::new();
        std::fs::create_dir(layout.ws.join("d")).expect("mkdir d");
        for f in files {
            std::fs::write(layout.ws.join("d").join(f), "old\n").expect("inside file");
            std::fs::write(layout.outside.join(f), "old\n").expect("outside file");
        }
        let before = layout.outside_listing();
        let (victim, target) = (layout.ws.join("d"), layout.outside.clone());
        let (outcome, points) = raced(&layout, rel, op, move || swap_for_symlink(&victim, &target));
        assert_eq!(
            points.first(),
            Some(&Point::Checked),
            "{what}: the window was reached"
        );
        assert!(
            std::fs::symlink_metadata(layout.ws.join("d"))
                .expect("d")
                .is_symlink(),
            "{what}: the swap happened"
        );
        let after = layout.outside_listing();
        if outcome != denied || after != before {
            problems.push(format!(
                "{what}: {outcome:?} (want {denied:?}), outside {before:?} became {after:?}"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "the fence let a swap through:\n{}",
        problems.join("\n")
    );
}

/// The writable root itself renamed away and replaced inside the window (by a link to the
/// outside, or by another directory, as another session may do to a root under `/tmp`):
/// the root opened is not the directory the fence checked, so the call is refused.
#[test]
fn the_root_itself_replaced_inside_the_window_is_denied() {
    let denied = Some(codes::FS_SANDBOX_DENIED.to_string());
    for (op, by_link) in [
        (Op::Write, true),
        (Op::Edit, true),
        (Op::Write, false),
        (Op::Edit, false),
    ] {
        let layout = Layout::new();
        std::fs::write(layout.ws.join("f.txt"), "old\n").expect("inside file");
        std::fs::write(layout.outside.join("f.txt"), "old\n").expect("outside file");
        let before = layout.outside_listing();
        let (ws, outside) = (layout.ws.clone(), layout.outside.clone());
        let (outcome, points) = raced(&layout, "f.txt", op, move || {
            if by_link {
                swap_for_symlink(&ws, &outside);
            } else {
                std::fs::rename(&ws, ws.with_extension("parked")).expect("move the root aside");
                std::fs::create_dir(&ws).expect("another directory");
                std::fs::write(ws.join("f.txt"), "old\n").expect("its file");
            }
        });
        let what = format!(
            "{op:?}, replaced by {}",
            if by_link { "a link" } else { "a directory" }
        );
        assert_eq!(
            points.first(),
            Some(&Point::Checked),
            "{what}: the window was reached"
        );
        assert_eq!(outcome, denied, "{what}");
        assert_eq!(
            layout.outside_listing(),
            before,
            "{what}: nothing outside changed"
        );
        if !by_link {
            assert_eq!(
                std::fs::read_to_string(layout.ws.join("f.txt")).expect("read"),
                "old\n",
                "{what}: nothing changed in the directory put in the root's place"
            );
        }
        // Put the root back, so the temporary directory is removed as usual.
        let parked = layout.ws.with_extension("parked");
        if by_link {
            std::fs::remove_file(&layout.ws).expect("remove the link");
        } else {
            std::fs::remove_dir_all(&layout.ws).expect("remove the other directory");
        }
        std::fs::rename(&parked, &layout.ws).expect("restore the root");
    }
}

/// A directory swapped for a symlink to a protected directory inside the same writable
/// root: the symlink stays beneath the root, so only the check of the directory actually
/// reached can refuse it.
#[test]
fn a_directory_swapped_for_a_symlink_into_a_protected_directory_is_denied() {
    let layout = Layout::new();
    let guarded = layout.ws.join("guarded");
    std::fs::create_dir(&guarded).expect("mkdir guarded");
    std::fs::create_dir(layout.ws.join("d")).expect("mkdir d");
    let policy = SandboxExecutionPolicy {
        protected_paths: vec![guarded.clone()],
        ..policy(&layout.ws)
    };
    // Relative, so resolving it beneath the root is allowed.
    // A write into `d`, and one that makes directories beneath it: nothing at all may be
    // made in the protected directory, not even an empty directory on the way.
    for rel in ["d/f.txt", "d/new/deeper/f.txt"] {
        if std::fs::symlink_metadata(layout.ws.join("d")).is_ok_and(|m| m.is_symlink()) {
            std::fs::remove_file(layout.ws.join("d")).expect("remove the link");
            std::fs::rename(layout.ws.join("d.parked"), layout.ws.join("d")).expect("restore d");
        }
        let (victim, target) = (layout.ws.join("d"), PathBuf::from("guarded"));
        let (outcome, points) = raced_under(policy.clone(), &layout, rel, Op::Write, move || {
            swap_for_symlink(&victim, &target)
        });
        assert_eq!(
            points.first(),
            Some(&Point::Checked),
            "{rel}: the window was reached"
        );
        assert!(
            std::fs::symlink_metadata(layout.ws.join("d"))
                .expect("d")
                .is_symlink(),
            "{rel}: the swap happened"
        );
        assert_eq!(outcome, Some(codes::FS_SANDBOX_DENIED.to_string()), "{rel}");
        assert_eq!(
            std::fs::read_dir(&guarded).expect("list guarded").count(),
            0,
            "{rel}: something was made in the protected directory"
        );
    }
}

#[test]
fn the_file_itself_swapped_for_a_symlink_inside_the_window() {
    // A write replaces the symlink (the rename never follows it); an edit, which must read
    // the file first, is denied. Either way nothing outside changes.
    for (op, want) in [
        (Op::Write, None),
        (Op::Edit, Some(codes::FS_SANDBOX_DENIED.to_string())),
    ] {
        let layout = Layout::new();
        std::fs::create_dir(layout.ws.join("d")).expect("mkdir d");
        std::fs::write(layout.ws.join("d/f.txt"), "old\n").expect("inside file");
        std::fs::write(layout.outside.join("f.txt"), "old\n").expect("outside file");
        let before = layout.outside_listing();
        let (victim, target) = (layout.ws.join("d/f.txt"), layout.outside.join("f.txt"));
        let (outcome, points) = raced(&layout, "d/f.txt", op, move || {
            swap_for_symlink(&victim, &target)
        });
        assert_eq!(outcome, want, "{op:?}: {points:?}");
        assert_eq!(
            layout.outside_listing(),
            before,
            "{op:?}: nothing outside changed"
        );
        if want.is_none() {
            let written = layout.ws.join("d/f.txt");
            assert!(!std::fs::symlink_metadata(&written)
                .expect("f.txt")
                .is_symlink());
            assert_eq!(std::fs::read_to_string(&written).expect("read"), "raced\n");
        }
    }
}

/// Exchanges `a` and `b` atomically (`renameat2` `RENAME_EXCHANGE`): both always exist.
fn exchange(a: &Path, b: &Path) {
    use rustix::fs::{renameat_with, RenameFlags, CWD};
    renameat_with(CWD, a, CWD, b, RenameFlags::EXCHANGE).expect("exchange");
}

#[test]
fn swaps_racing_the_writer_fall_inside_the_window_and_never_escape() {
    let layout = Layout::new();
    std::fs::create_dir(layout.ws.join("d")).expect("mkdir d");
    std::os::unix::fs::symlink(&layout.outside, layout.ws.join("link")).expect("symlink");
    let swaps = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let (swaps, stop) = (swaps.clone(), stop.clone());
        let (d, link) = (layout.ws.join("d"), layout.ws.join("link"));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                exchange(&d, &link);
                swaps.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    // Counted by the seam on this thread: windows a swap fell into, and those that ended
    // with `d` swapped (an odd number of exchanges: a symlink where a directory was).
    let in_window = std::rc::Rc::new(std::cell::Cell::new(0u64));
    let flipped = std::rc::Rc::new(std::cell::Cell::new(0u64));
    let (window_in, window_flipped, window_swaps) =
        (in_window.clone(), flipped.clone(), swaps.clone());
    let mut start = 0u64;
    let policy = policy(&layout.ws);
    let path = layout.ws.join("d/f.txt");
    let deadline = Instant::now() + Duration::from_secs(90);
    let (mut writes, mut allowed, mut denied) = (0u64, 0u64, 0u64);
    let mut other = Vec::new();
    race::with(
        move |point| match point {
            Point::Checked => {
                start = window_swaps.load(Ordering::SeqCst);
                // Widen the window a little: the swapper gets the processor more often.
                for _ in 0..3 {
                    std::thread::yield_now();
                }
            }
            Point::Opened => {
                let n = window_swaps.load(Ordering::SeqCst) - start;
                if n > 0 {
                    window_in.set(window_in.get() + 1);
                }
                if n % 2 == 1 {
                    window_flipped.set(window_flipped.get() + 1);
                }
            }
            // Only writes run here: no read looks at a path.
            Point::Looked => {}
        },
        || {
            while !(writes >= 500 && in_window.get() >= 100 && flipped.get() >= 20) {
                assert!(
                    Instant::now() < deadline,
                    "the race was not exercised within 90 s: {writes} writes ({allowed} allowed, {denied} denied), {} swaps, {} in the window, {} flipped",
                    swaps.load(Ordering::SeqCst),
                    in_window.get(),
                    flipped.get()
                );
                writes += 1;
                match fenced_target(&policy, &path, Parents::Create)
                    .and_then(|t| t.write(b"raced\n"))
                {
                    Ok(_) => allowed += 1,
                    Err(e) if e.code == codes::FS_SANDBOX_DENIED => denied += 1,
                    Err(e) => other.push(e.to_string()),
                }
            }
        },
    );
    stop.store(true, Ordering::Relaxed);
    swapper.join().expect("swapper");
    assert!(
        other.is_empty(),
        "only allowed or denied: {:?}",
        &other[..other.len().min(3)]
    );
    assert_eq!(
        layout.outside_listing(),
        Vec::<(String, String)>::new(),
        "bytes landed outside the workspace: {writes} writes, {} swaps in the window, {} flipped",
        in_window.get(),
        flipped.get()
    );
    println!(
        "{writes} writes ({allowed} allowed, {denied} denied), {} swaps, {} in the window, {} flipped",
        swaps.load(Ordering::SeqCst),
        in_window.get(),
        flipped.get()
    );
}

/// `edit` reads the file, then writes the result back: the file swapped for a symbolic link
/// to a `denyRead` file after its path was checked (exactly inside the window, through
/// the seam) is refused, not followed, so the secret never lands in a readable file.
#[test]
fn an_edit_does_not_follow_a_file_swapped_for_a_link_to_a_hidden_one() {
    let layout = Layout::new();
    std::fs::create_dir(layout.ws.join("d")).expect("mkdir d");
    std::fs::write(layout.ws.join("d/f.txt"), "old\n").expect("the file");
    std::fs::write(layout.ws.join("d/.env"), "old TOKEN=secret\n").expect("the secret");
    let policy = SandboxExecutionPolicy {
        deny_read: vec![PathBuf::from("**/.env")],
        ..policy(&layout.ws)
    };
    let path = layout.ws.join("d/f.txt");
    let (victim, secret) = (path.clone(), layout.ws.join("d/.env"));
    let mut swap = Some(move || {
        std::fs::remove_file(&victim).expect("remove the file");
        std::os::unix::fs::symlink(&secret, &victim).expect("plant the link");
    });
    let outcome = race::with(
        move |point| {
            if point == Point::Opened {
                if let Some(swap) = swap.take() {
                    swap();
                }
            }
        },
        || {
            fenced_target(&policy, &path, Parents::Existing)
                .and_then(|t| t.edit("old", "new", false))
                .map(|_| ())
        },
    );
    let err = outcome.expect_err("the swapped edit must be refused");
    assert_eq!(err.code, codes::FS_SANDBOX_DENIED, "{err:?}");
    assert!(err.message.contains("became a symbolic link"), "{err:?}");
    assert!(
        std::fs::symlink_metadata(layout.ws.join("d/f.txt"))
            .expect("f.txt")
            .is_symlink(),
        "the link is left as it was"
    );
    assert_eq!(
        std::fs::read_to_string(layout.ws.join("d/.env")).expect(".env"),
        "old TOKEN=secret\n"
    );
}

/// A read looks at a plain path before it opens it, and compares what it opened with what
/// it looked at: a FIFO swapped in exactly between the two is not read (an empty page
/// would say it was), and another regular file swapped in is read the long way, by what
/// the path names now. Each file is back in its place after each case.
#[test]
fn a_file_swapped_between_a_reads_look_and_its_open_is_not_read() {
    let layout = Layout::new();
    let file = layout.ws.join("f.txt");
    std::fs::write(&file, "the file\n").expect("file");
    let fifo = layout.ws.join("fifo");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
        0,
    )
    .expect("mkfifo");
    let other = layout.ws.join("other.txt");
    std::fs::write(&other, "another file\n").expect("other file");
    for (swapped_in, want) in [
        (&fifo, Err(codes::FS_WRONG_KIND.to_string())),
        (&other, Ok("another file\n".to_string())),
    ] {
        let seen = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let log = seen.clone();
        let (victim, swap_with) = (file.clone(), swapped_in.clone());
        let args = dsh_fs_api::ReadLines {
            path: file.clone(),
            offset: 1,
            limit: None,
            caps: dsh_fs_api::ReadCaps {
                max_lines: 100,
                max_bytes: 10_000,
                max_line_bytes: 1_000,
            },
            policy: None,
        };
        let outcome = race::with(
            move |point| {
                log.borrow_mut().push(point);
                if point == Point::Looked {
                    exchange(&victim, &swap_with);
                }
            },
            || read_lines(&args, &ReadDeny::default()),
        );
        assert_eq!(
            *seen.borrow(),
            [Point::Looked],
            "{swapped_in:?}: the read looked at the plain path once, then took the long way"
        );
        exchange(&file, swapped_in);
        assert_eq!(
            outcome.map(|l| l.text).map_err(|e| e.code.to_string()),
            want,
            "{swapped_in:?}"
        );
        assert_eq!(std::fs::read_to_string(&file).expect("back"), "the file\n");
    }
}
