//! Watching for changes while `cordis run` serves: the manifest and every loaded plugin
//! library. Parent directories are watched, not files (editors and cargo replace files by
//! rename or hard link, and a watch on the file dies with it). A batch of changes is
//! complete as soon as its writer is done: a library cargo is writing waits for cargo's
//! build lock (`target/<profile>/.cargo-lock`) to be released, so one `cargo build` of
//! several plugins is one reload with no fixed wait after it; any other change waits
//! for a short quiet period ([`Quiet`]). A change that leaves every byte the same reloads
//! nothing.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use notify::event::{AccessKind, AccessMode};
use notify::{Event, EventKind, RecommendedWatcher, RecursiveMode, Watcher};

use cordis_engine::{ReloadError, Runtime};

/// How long changed files must be quiet before a reload starts. Editors replace a file in
/// one rename and cargo is waited for by its lock, so these only cover writers that write
/// in place (`cp`, a slow save); a library caught half-written is refused by the loader's
/// completeness check and picked up by the next event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quiet {
    /// After a change to a library file that cargo is not writing.
    pub library: Duration,
    /// After a change to any other file: the manifest, an editor's or a copier's
    /// temporary file beside it.
    pub manifest: Duration,
}

impl Quiet {
    /// 50 ms after a library, 30 ms after the manifest.
    pub const DEFAULT: Quiet = Quiet {
        library: Duration::from_millis(50),
        manifest: Duration::from_millis(30),
    };

    /// The same quiet period for every file (`--reload-quiet MS`).
    pub fn uniform(quiet: Duration) -> Quiet {
        Quiet {
            library: quiet,
            manifest: quiet,
        }
    }
}

/// Changes that belong together, and when the first of them was seen.
#[derive(Debug)]
pub(crate) struct Batch {
    pub paths: BTreeSet<PathBuf>,
    pub first_seen: Instant,
}

/// A watcher that sends the paths of every change to `tx`. Reads are not changes: the
/// host reads the libraries itself on every reload (and other `cordis` processes load
/// them), so counting reads would keep an idle host re-planning forever.
pub(crate) fn change_watcher(tx: Sender<Vec<PathBuf>>) -> notify::Result<RecommendedWatcher> {
    notify::recommended_watcher(move |event: notify::Result<Event>| match event {
        Ok(e) if is_change(&e.kind) => {
            let _ = tx.send(e.paths);
        }
        Ok(_) => {}
        Err(e) => tracing::warn!("file watcher: {e}"),
    })
}

fn is_change(kind: &EventKind) -> bool {
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        _ => true,
    }
}

/// How often a held cargo build lock is tried while waiting for cargo to finish.
const CARGO_POLL: Duration = Duration::from_millis(5);

/// How long a batch waits for cargo at most. A lock held longer (a stuck build) is not
/// allowed to stop reloads for good: what is on disk then is loaded, and the loader's
/// completeness check refuses a library still being written.
const CARGO_PATIENCE: Duration = Duration::from_secs(600);

/// The next batch of changed paths: waits for a change, then until the batch is complete.
/// While cargo holds the build lock of a changed library's directory, that is when cargo
/// releases it (then at once, with every change seen meanwhile); otherwise when no change
/// has come for the longest `quiet` period of the paths changed so far. `None` when the
/// watcher is gone.
pub(crate) fn next_batch(
    rx: &Receiver<Vec<PathBuf>>,
    quiet: impl Fn(&Path) -> Duration,
) -> Option<Batch> {
    let first = rx.recv().ok()?;
    let first_seen = Instant::now();
    let mut paths: BTreeSet<PathBuf> = first.into_iter().collect();
    let mut cargo_since: Option<Instant> = None;
    loop {
        let building = paths
            .iter()
            .filter(|p| is_library(p))
            .find_map(|p| held_cargo_lock(p));
        let wait = match (building, cargo_since) {
            (Some(lock), _) => {
                let since = *cargo_since.get_or_insert_with(|| {
                    tracing::debug!("waiting for cargo to release {}", lock.display());
                    Instant::now()
                });
                if since.elapsed() >= CARGO_PATIENCE {
                    tracing::warn!(
                        "cargo has held {} for {} s; reloading what is on disk now",
                        lock.display(),
                        since.elapsed().as_secs()
                    );
                    return Some(Batch { paths, first_seen });
                }
                CARGO_POLL
            }
            (None, Some(_)) => {
                // Cargo is done: everything it wrote has been seen.
                while let Ok(more) = rx.try_recv() {
                    paths.extend(more);
                }
                return Some(Batch { paths, first_seen });
            }
            (None, None) => paths.iter().map(|p| quiet(p)).max().unwrap_or_default(),
        };
        match rx.recv_timeout(wait) {
            Ok(more) => paths.extend(more),
            Err(RecvTimeoutError::Timeout) if cargo_since.is_some() => {}
            Err(RecvTimeoutError::Timeout) => return Some(Batch { paths, first_seen }),
            Err(RecvTimeoutError::Disconnected) => return None,
        }
    }
}

/// The build lock of the cargo output directory `library` lies in (its own directory, or
/// the one above for `deps/`), when some process holds it now. Only tried, never held:
/// cargo's next build never waits for this host.
fn held_cargo_lock(library: &Path) -> Option<PathBuf> {
    library
        .ancestors()
        .skip(1)
        .take(2)
        .map(|dir| dir.join(".cargo-lock"))
        .find(|lock| {
            let Ok(file) = std::fs::File::open(lock) else {
                return false;
            };
            matches!(
                file.try_lock_shared(),
                Err(std::fs::TryLockError::WouldBlock)
            )
        })
}

/// Watches `runtime`'s files on a background thread until the process ends, waiting
/// `quiet` after changes cargo is not making.
pub fn spawn(runtime: Arc<Runtime>, quiet: Quiet) -> anyhow::Result<()> {
    let (tx, rx) = channel::<Vec<PathBuf>>();
    let mut watcher = change_watcher(tx)?;
    let mut watched_dirs: BTreeSet<PathBuf> = BTreeSet::new();
    let mut watch_all = move |runtime: &Runtime, dirs: &mut BTreeSet<PathBuf>| {
        for dir in parent_dirs(&runtime.watched_files()) {
            if dirs.contains(&dir) {
                continue;
            }
            match watcher.watch(&dir, RecursiveMode::NonRecursive) {
                Ok(()) => {
                    dirs.insert(dir);
                }
                Err(e) => tracing::warn!("cannot watch {}: {e}", dir.display()),
            }
        }
    };
    watch_all(&runtime, &mut watched_dirs);
    std::thread::Builder::new()
        .name("cordis-watch".into())
        .spawn(move || {
            let quiet_for = |p: &Path| {
                if is_library(p) {
                    quiet.library
                } else {
                    quiet.manifest
                }
            };
            while let Some(batch) = next_batch(&rx, quiet_for) {
                let relevant: BTreeSet<PathBuf> = runtime
                    .watched_files()
                    .iter()
                    .filter_map(|f| normalized(f))
                    .collect();
                if !batch
                    .paths
                    .iter()
                    .any(|p| relevant.contains(p) || is_library(p))
                {
                    tracing::trace!("ignored changes: {:?}", batch.paths);
                    continue;
                }
                survive("file watcher", || {
                    reload_and_log(&runtime, Some(batch.first_seen), None);
                    watch_all(&runtime, &mut watched_dirs);
                });
            }
        })?;
    Ok(())
}

/// Runs one step of a background thread's loop. A panic in it is logged as an error with
/// its message, the step is abandoned and the thread goes on with the next one: a host
/// thread never dies silently, and a bad edit never stops later ones from being seen.
pub(crate) fn survive<T>(thread: &str, step: impl FnOnce() -> T) -> Option<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(step)) {
        Ok(value) => Some(value),
        Err(payload) => {
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".to_string());
            tracing::error!(
                "{thread}: a step panicked and was abandoned ({message}); still serving, and still watching for changes"
            );
            None
        }
    }
}

/// Reloads `runtime` and logs the outcome: one line for a change (with the time since
/// the first change of the batch was seen, when known), `unchanged` (when given) for a
/// reload that found nothing to do, the errors for a refused one. A refusal for the same
/// reason as the one before it (the library watcher and the `--dev` builder both reload
/// after a build) is not shown again.
pub(crate) fn reload_and_log(
    runtime: &Runtime,
    first_seen: Option<Instant>,
    unchanged: Option<&str>,
) {
    /// The last refusal shown, by runtime.
    static LAST_REFUSAL: Mutex<Option<(usize, String)>> = Mutex::new(None);
    let key = runtime as *const Runtime as usize;
    let outcome = runtime.reload();
    let mut last = LAST_REFUSAL.lock().unwrap_or_else(|e| e.into_inner());
    match outcome {
        Ok(report) if report.is_empty() => match unchanged {
            Some(line) => tracing::info!("{line}"),
            None => tracing::debug!("files changed but the composition did not"),
        },
        Ok(report) => {
            *last = None;
            match first_seen {
                Some(t) => tracing::info!(
                    "{report} ({} ms after the first change was seen)",
                    t.elapsed().as_millis()
                ),
                None => tracing::info!("{report}"),
            }
        }
        Err(e) => {
            let text = match e {
                e @ ReloadError::Invalid(_) => e.to_string(),
                e => format!("reload failed: {e}"),
            };
            if last.as_ref() == Some(&(key, text.clone())) {
                tracing::debug!("reload refused again, for the reason shown above");
            } else {
                tracing::error!("{text}");
                *last = Some((key, text));
            }
        }
    }
}

fn is_library(p: &Path) -> bool {
    p.extension()
        .is_some_and(|e| Some(e) == Path::new(std::env::consts::DLL_SUFFIX).extension())
        || p.to_string_lossy().ends_with(std::env::consts::DLL_SUFFIX)
}

/// `f` with its directory canonicalized (the form the watcher reports paths in).
fn normalized(f: &Path) -> Option<PathBuf> {
    let abs = if f.is_absolute() {
        f.to_path_buf()
    } else {
        std::env::current_dir().ok()?.join(f)
    };
    Some(abs.parent()?.canonicalize().ok()?.join(abs.file_name()?))
}

fn parent_dirs(files: &[PathBuf]) -> BTreeSet<PathBuf> {
    files
        .iter()
        .filter_map(|f| normalized(f)?.parent().map(Path::to_path_buf))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `target/debug` directory with cargo's lock file; the library path in it.
    fn cargo_output(dir: &Path) -> (PathBuf, PathBuf) {
        let out = dir.join("target/debug");
        std::fs::create_dir_all(&out).expect("target dir");
        let lock = out.join(".cargo-lock");
        std::fs::write(&lock, "").expect("lock file");
        (lock, out.join(cordis_engine::library_file_name("plugin-a")))
    }

    /// Runs `next_batch` on a thread; its result arrives on the returned channel.
    fn batch_on_thread(
        rx: Receiver<Vec<PathBuf>>,
        quiet: Duration,
    ) -> Receiver<Option<BTreeSet<PathBuf>>> {
        let (done_tx, done_rx) = channel();
        std::thread::spawn(move || {
            let _ = done_tx.send(next_batch(&rx, |_| quiet).map(|b| b.paths));
        });
        done_rx
    }

    /// What a test's reloads log, as the host shows it.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Runs `f` with the info-level log captured; returns what it logged.
    fn logged(f: impl FnOnce()) -> String {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        let bytes = captured.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The library watcher and the `--dev` builder both reload after a build: a refusal
    /// for the same reason is shown once; a reload that finds nothing to do says so when
    /// asked to (the builder's).
    #[test]
    fn a_refusal_is_shown_once_and_an_unchanged_reload_says_so() {
        let dir = tempfile::tempdir().expect("tempdir");
        let manifest = dir.path().join("cordis.yml");
        std::fs::write(&manifest, "[]\n").expect("manifest");
        let host = cordis_engine::Host::new(
            &manifest,
            &[dir.path().join("plugins")],
            &dir.path().join("state"),
            false,
        );
        let runtime = Runtime::start(host).expect("an empty composition starts");
        std::fs::write(&manifest, "- name: no-such-plugin\n").expect("manifest");
        let log = logged(|| {
            reload_and_log(&runtime, None, None);
            reload_and_log(&runtime, None, None);
        });
        assert_eq!(log.matches("ERROR").count(), 1, "{log}");
        assert!(log.contains("no-such-plugin"), "{log}");
        std::fs::write(&manifest, "[]\n").expect("manifest");
        let log = logged(|| {
            reload_and_log(&runtime, None, None);
            reload_and_log(&runtime, None, Some("dev: unchanged"));
        });
        assert_eq!(log.matches("dev: unchanged").count(), 1, "{log}");
        assert!(!log.contains("ERROR"), "{log}");
        runtime.shutdown();
    }

    #[test]
    fn a_library_cargo_is_building_waits_for_the_whole_build() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (lock, lib_a) = cargo_output(dir.path());
        let lib_b = lib_a.with_file_name(cordis_engine::library_file_name("plugin-b"));
        let cargo = std::fs::File::open(&lock).expect("open the lock");
        cargo.lock().expect("hold the lock as cargo does");

        let (tx, rx) = channel();
        let done = batch_on_thread(rx, Duration::from_millis(10));
        tx.send(vec![lib_a.clone()]).expect("send");
        // Twenty quiet periods pass: the batch is not complete while cargo builds.
        assert_eq!(
            done.recv_timeout(Duration::from_millis(200)).err(),
            Some(RecvTimeoutError::Timeout),
            "a batch ended while cargo still held its lock"
        );
        tx.send(vec![lib_b.clone()]).expect("send");
        drop(cargo);
        let batch = done
            .recv_timeout(Duration::from_secs(30))
            .expect("the batch ends when cargo releases the lock");
        assert_eq!(batch, Some(BTreeSet::from([lib_a, lib_b])));
    }

    #[test]
    fn a_lock_nobody_holds_does_not_delay_a_batch() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (_lock, lib) = cargo_output(dir.path());
        let (tx, rx) = channel();
        let done = batch_on_thread(rx, Duration::from_millis(10));
        tx.send(vec![lib.clone()]).expect("send");
        let batch = done
            .recv_timeout(Duration::from_secs(30))
            .expect("the quiet period ends the batch");
        assert_eq!(batch, Some(BTreeSet::from([lib])));
        drop(tx);
    }

    #[test]
    fn a_panicking_step_is_survived() {
        assert_eq!(survive("test", || 7), Some(7));
        let panicked: Option<()> = survive("test", || panic!("boom"));
        assert_eq!(panicked, None);
        let formatted: Option<()> = survive("test", || panic!("boom {}", 2));
        assert_eq!(formatted, None);
        assert_eq!(survive("test", || "after"), Some("after"), "still usable");
    }
}
