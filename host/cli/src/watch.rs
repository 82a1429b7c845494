//! Watching for changes while `cordis run` serves: the manifest and every loaded plugin
//! library. Parent directories are watched, not files (editors and cargo replace files by
//! rename or hard link, and a watch on the file dies with it). A batch of changes is
//! complete as soon as its writer is done: a library cargo is writing waits for cargo's
//! build lock (`target/<profile>/.cargo-lock`) to be released, so one `cargo build` of
//! several plugins is one reload with no fixed wait after it; a file renamed into place
//! (how editors, `cp` + `mv` and installers finish a write), closed by its writer or
//! removed is complete when seen; only a file written in place and not yet closed waits
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

/// How long changed files must be quiet before a reload starts, when their writer has not
/// closed them yet. Editors replace a file in one rename, cargo is waited for by its lock,
/// and a writer's close ends the wait, so these only cover a file still open for writing
/// (or a change whose close the watcher does not see); a library caught half-written is
/// refused by the loader's completeness check and picked up by the next event.
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
    /// Why the batch was complete when it was.
    pub how: Completed,
}

/// Why a batch of changes was complete when it was (the reload line says which).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Completed {
    /// Every watched file in it was renamed into place, closed by its writer or removed.
    AtOnce(Done),
    /// A file was written in place and not seen closed: no change for this long.
    Quiet(Duration),
    /// Cargo released the build lock of a library's directory.
    Cargo,
    /// `cordis run --dev` rebuilt the libraries of edited sources.
    Rebuilt,
}

impl std::fmt::Display for Completed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Completed::AtOnce(Done::Renamed) => write!(f, "at once: renamed into place"),
            Completed::AtOnce(Done::Closed) => write!(f, "at once: its writer closed it"),
            Completed::AtOnce(Done::Removed) => write!(f, "at once: removed"),
            Completed::AtOnce(Done::Writing) | Completed::Quiet(_) => {
                let quiet = match self {
                    Completed::Quiet(d) => d.as_millis(),
                    _ => 0,
                };
                write!(f, "after a {quiet} ms quiet period: written in place")
            }
            Completed::Cargo => write!(f, "when cargo released its build lock"),
            Completed::Rebuilt => write!(f, "when the rebuild of the edited sources finished"),
        }
    }
}

/// Where one file's change stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Done {
    /// Written in place (created, data written); its writer may still hold it open.
    Writing,
    /// Renamed into place: its content arrived whole.
    Renamed,
    /// Its writer closed it.
    Closed,
    /// Removed (or renamed away).
    Removed,
}

/// One file's change, as the watcher saw it.
#[derive(Clone, Debug)]
pub(crate) struct Change {
    pub path: PathBuf,
    /// `None`: its metadata only (which settles nothing and leaves a write as it was).
    pub done: Option<Done>,
}

/// A watcher that sends every change to `tx`. Reads are not changes: the host reads the
/// libraries itself on every reload (and other `cordis` processes load them), so counting
/// reads would keep an idle host re-planning forever.
pub(crate) fn change_watcher(tx: Sender<Vec<Change>>) -> notify::Result<RecommendedWatcher> {
    notify::recommended_watcher(move |event: notify::Result<Event>| match event {
        Ok(e) if is_change(&e.kind) => {
            let done = done_by(&e.kind);
            let _ = tx.send(
                e.paths
                    .into_iter()
                    .map(|path| Change { path, done })
                    .collect(),
            );
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

/// Where a change of this kind leaves its files.
fn done_by(kind: &EventKind) -> Option<Done> {
    use notify::event::{ModifyKind, RenameMode};
    match kind {
        EventKind::Access(_) => Some(Done::Closed),
        EventKind::Modify(ModifyKind::Name(RenameMode::To | RenameMode::Both)) => {
            Some(Done::Renamed)
        }
        EventKind::Modify(ModifyKind::Name(RenameMode::From)) | EventKind::Remove(_) => {
            Some(Done::Removed)
        }
        EventKind::Modify(ModifyKind::Metadata(_)) => None,
        _ => Some(Done::Writing),
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
/// releases it (then at once, with every change seen meanwhile); else, when the batch
/// holds a file `watched` says matters and every such file is renamed into place, closed
/// or removed, at once; otherwise when no change has come for the longest `quiet` period
/// of the paths changed so far. `None` when the watcher is gone.
pub(crate) fn next_batch(
    rx: &Receiver<Vec<Change>>,
    quiet: impl Fn(&Path) -> Duration,
    watched: impl Fn(&Path) -> bool,
) -> Option<Batch> {
    let first = rx.recv().ok()?;
    let first_seen = Instant::now();
    let mut state: std::collections::BTreeMap<PathBuf, Option<Done>> =
        std::collections::BTreeMap::new();
    take(first, &mut state);
    let mut cargo_since: Option<Instant> = None;
    let batch = |state: std::collections::BTreeMap<PathBuf, Option<Done>>, how| Batch {
        paths: state.into_keys().collect(),
        first_seen,
        how,
    };
    loop {
        let building = state
            .keys()
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
                    return Some(batch(state, Completed::Cargo));
                }
                CARGO_POLL
            }
            (None, Some(_)) => {
                // Cargo is done: everything it wrote has been seen.
                while let Ok(more) = rx.try_recv() {
                    take(more, &mut state);
                }
                return Some(batch(state, Completed::Cargo));
            }
            (None, None) => {
                if complete(&state, &watched).is_some() {
                    // What the watcher already has belongs to this batch too.
                    while let Ok(more) = rx.try_recv() {
                        take(more, &mut state);
                    }
                    if let Some(done) = complete(&state, &watched) {
                        return Some(batch(state, Completed::AtOnce(done)));
                    }
                    continue;
                }
                state.keys().map(|p| quiet(p)).max().unwrap_or_default()
            }
        };
        match rx.recv_timeout(wait) {
            Ok(more) => take(more, &mut state),
            Err(RecvTimeoutError::Timeout) if cargo_since.is_some() => {}
            Err(RecvTimeoutError::Timeout) => return Some(batch(state, Completed::Quiet(wait))),
            Err(RecvTimeoutError::Disconnected) => return None,
        }
    }
}

/// Records `changes` in a batch's `state`: the latest word on each file stands, and a
/// change of metadata only leaves it as it was.
fn take(changes: Vec<Change>, state: &mut std::collections::BTreeMap<PathBuf, Option<Done>>) {
    for c in changes {
        let entry = state.entry(c.path).or_insert(None);
        if c.done.is_some() {
            *entry = c.done;
        }
    }
}

/// How the watched files of a batch are done, when every one of them is and there is one
/// (renamed before closed before removed, for the reload line).
fn complete(
    state: &std::collections::BTreeMap<PathBuf, Option<Done>>,
    watched: impl Fn(&Path) -> bool,
) -> Option<Done> {
    let mut how: Option<Done> = None;
    for done in state.iter().filter(|(p, _)| watched(p)).map(|(_, d)| d) {
        let done = match done {
            None | Some(Done::Writing) => return None,
            Some(d) => *d,
        };
        how = Some(match (how, done) {
            (Some(Done::Renamed), _) | (_, Done::Renamed) => Done::Renamed,
            (Some(Done::Closed), _) | (_, Done::Closed) => Done::Closed,
            _ => done,
        });
    }
    how
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
    let (tx, rx) = channel::<Vec<Change>>();
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
            let relevant_now = || -> BTreeSet<PathBuf> {
                runtime
                    .watched_files()
                    .iter()
                    .filter_map(|f| normalized(f))
                    .collect()
            };
            let mut relevant = relevant_now();
            while let Some(batch) =
                next_batch(&rx, quiet_for, |p| relevant.contains(p) || is_library(p))
            {
                if !batch
                    .paths
                    .iter()
                    .any(|p| relevant.contains(p) || is_library(p))
                {
                    tracing::trace!("ignored changes: {:?}", batch.paths);
                    continue;
                }
                survive("file watcher", || {
                    reload_and_log(&runtime, Some((batch.first_seen, batch.how)), None);
                    watch_all(&runtime, &mut watched_dirs);
                });
                relevant = relevant_now();
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
    first_seen: Option<(Instant, Completed)>,
    unchanged: Option<&str>,
) {
    /// The last refusal shown, by runtime.
    static LAST_REFUSAL: Mutex<Option<(usize, String)>> = Mutex::new(None);
    let key = runtime as *const Runtime as usize;
    let outcome = runtime.reload();
    let mut last = LAST_REFUSAL.lock().unwrap_or_else(|e| e.into_inner());
    // Every reload is one event a program can read: `event = "reload"` with its `outcome`
    // (`applied`, `unchanged`, `refused`, `failed`) and, applied after a change was seen,
    // `after_ms`; one JSON object per line with `--log-format json`, and counted in
    // `/metrics` (`cordis_reloads_total`).
    let metrics = crate::metrics::metrics();
    match outcome {
        Ok(report) if report.is_empty() => {
            metrics.reload("unchanged");
            match unchanged {
                Some(line) => tracing::info!(event = "reload", outcome = "unchanged", "{line}"),
                None => tracing::debug!(
                    event = "reload",
                    outcome = "unchanged",
                    "files changed but the composition did not"
                ),
            }
        }
        Ok(report) => {
            *last = None;
            metrics.reload("applied");
            match first_seen {
                Some((t, how)) => tracing::info!(
                    event = "reload",
                    outcome = "applied",
                    after_ms = t.elapsed().as_millis() as u64,
                    "{report} ({} ms after the first change was seen; complete {how})",
                    t.elapsed().as_millis()
                ),
                None => tracing::info!(event = "reload", outcome = "applied", "{report}"),
            }
        }
        Err(e) => {
            let (outcome, text) = match e {
                e @ ReloadError::Invalid(_) => ("refused", e.to_string()),
                e => ("failed", format!("reload failed: {e}")),
            };
            metrics.reload(outcome);
            if last.as_ref() == Some(&(key, text.clone())) {
                tracing::debug!(
                    event = "reload",
                    outcome,
                    "reload refused again, for the reason shown above"
                );
            } else {
                tracing::error!(event = "reload", outcome, "{text}");
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

    /// Runs `next_batch` on a thread (every path watched); its result arrives on the
    /// returned channel.
    fn batch_on_thread(
        rx: Receiver<Vec<Change>>,
        quiet: Duration,
    ) -> Receiver<Option<BTreeSet<PathBuf>>> {
        let (done_tx, done_rx) = channel();
        std::thread::spawn(move || {
            let _ = done_tx.send(next_batch(&rx, |_| quiet, |_| true).map(|b| b.paths));
        });
        done_rx
    }

    /// A change of `path` that leaves it `done`.
    fn change(path: &Path, done: Option<Done>) -> Vec<Change> {
        vec![Change {
            path: path.to_path_buf(),
            done,
        }]
    }

    /// Runs `next_batch` on a thread, `cordis.yml` the one watched file, with a quiet
    /// period of a minute: a batch that ends sooner ended without it.
    fn manifest_batch(
        rx: Receiver<Vec<Change>>,
    ) -> Receiver<Option<(BTreeSet<PathBuf>, Completed)>> {
        let (done_tx, done_rx) = channel();
        std::thread::spawn(move || {
            let batch = next_batch(
                &rx,
                |_| Duration::from_secs(60),
                |p| p == Path::new("/w/cordis.yml"),
            );
            let _ = done_tx.send(batch.map(|b| (b.paths, b.how)));
        });
        done_rx
    }

    #[test]
    fn a_file_renamed_into_place_or_closed_completes_its_batch_at_once() {
        let manifest = Path::new("/w/cordis.yml");
        for (done, line) in [
            (Done::Renamed, "at once: renamed into place"),
            (Done::Closed, "at once: its writer closed it"),
            (Done::Removed, "at once: removed"),
        ] {
            let (tx, rx) = channel();
            // Sent before the batch starts, so all of them belong to it (it ends as soon as
            // it is complete). An editor's temporary file beside it, still being written,
            // does not count; a change of its metadata after it settles nothing.
            tx.send(change(Path::new("/w/.cordis.yml.swp"), Some(Done::Writing)))
                .expect("send");
            tx.send(change(manifest, Some(done))).expect("send");
            tx.send(change(manifest, None)).expect("send");
            let batch = manifest_batch(rx);
            let (paths, how) = batch
                .recv_timeout(Duration::from_secs(30))
                .expect("complete without the quiet period")
                .expect("a batch");
            assert!(paths.contains(manifest), "{paths:?}");
            assert_eq!(how, Completed::AtOnce(done));
            assert_eq!(how.to_string(), line);
        }
    }

    #[test]
    fn a_file_written_in_place_waits_for_its_writer_to_close_it() {
        let manifest = Path::new("/w/cordis.yml");
        let (tx, rx) = channel();
        let batch = manifest_batch(rx);
        tx.send(change(manifest, Some(Done::Writing)))
            .expect("send");
        tx.send(change(manifest, None)).expect("send");
        assert_eq!(
            batch.recv_timeout(Duration::from_millis(300)).err(),
            Some(RecvTimeoutError::Timeout),
            "a batch ended while its file was still open for writing"
        );
        tx.send(change(manifest, Some(Done::Closed))).expect("send");
        let (_, how) = batch
            .recv_timeout(Duration::from_secs(30))
            .expect("the close ends it")
            .expect("a batch");
        assert_eq!(how, Completed::AtOnce(Done::Closed));

        // Not seen closed: the quiet period ends it, and the line says so.
        let (tx, rx) = channel();
        let (done_tx, done_rx) = channel();
        std::thread::spawn(move || {
            let b = next_batch(&rx, |_| Duration::from_millis(20), |_| true);
            let _ = done_tx.send(b.map(|b| b.how));
        });
        tx.send(change(manifest, Some(Done::Writing)))
            .expect("send");
        let how = done_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the quiet period ends it")
            .expect("a batch");
        assert_eq!(how, Completed::Quiet(Duration::from_millis(20)));
        assert_eq!(
            how.to_string(),
            "after a 20 ms quiet period: written in place"
        );
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
        tx.send(change(&lib_a, Some(Done::Closed))).expect("send");
        // Twenty quiet periods pass: the batch is not complete while cargo builds, even
        // with the library closed.
        assert_eq!(
            done.recv_timeout(Duration::from_millis(200)).err(),
            Some(RecvTimeoutError::Timeout),
            "a batch ended while cargo still held its lock"
        );
        tx.send(change(&lib_b, Some(Done::Renamed))).expect("send");
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
        tx.send(change(&lib, Some(Done::Writing))).expect("send");
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
