//! Watching for changes while `cordis run` serves: the manifest and every loaded plugin
//! library. Parent directories are watched, not files (editors and cargo replace files by
//! rename or hard link, and a watch on the file dies with it). Events are debounced until
//! the files have been quiet for a moment, so one `cargo build` of several plugins becomes
//! one reload; a change that leaves every byte the same reloads nothing.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::Duration;

use notify::event::{AccessKind, AccessMode};
use notify::{Event, EventKind, RecommendedWatcher, RecursiveMode, Watcher};

use crate::runtime::{ReloadError, Runtime};

/// How long the watched files must be quiet before a reload starts.
pub const QUIET: Duration = Duration::from_millis(400);

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

/// The next batch of changed paths: waits for a change, then until the watched files have
/// been quiet for [`QUIET`] (a trailing-edge debounce). `None` when the watcher is gone.
pub(crate) fn next_batch(rx: &Receiver<Vec<PathBuf>>) -> Option<BTreeSet<PathBuf>> {
    let mut changed: BTreeSet<PathBuf> = rx.recv().ok()?.into_iter().collect();
    loop {
        match rx.recv_timeout(QUIET) {
            Ok(more) => changed.extend(more),
            Err(RecvTimeoutError::Timeout) => return Some(changed),
            Err(RecvTimeoutError::Disconnected) => return None,
        }
    }
}

/// Watches `runtime`'s files on a background thread until the process ends.
pub fn spawn(runtime: Arc<Runtime>) -> anyhow::Result<()> {
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
            while let Some(changed) = next_batch(&rx) {
                let relevant: BTreeSet<PathBuf> = runtime
                    .watched_files()
                    .iter()
                    .filter_map(|f| normalized(f))
                    .collect();
                if !changed
                    .iter()
                    .any(|p| relevant.contains(p) || is_library(p))
                {
                    tracing::trace!("ignored changes: {changed:?}");
                    continue;
                }
                survive("file watcher", || {
                    reload_and_log(&runtime);
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

/// Reloads `runtime` and logs the outcome: one line for a change, the errors for a
/// refused one.
pub(crate) fn reload_and_log(runtime: &Runtime) {
    match runtime.reload() {
        Ok(report) if report.is_empty() => {
            tracing::debug!("files changed but the composition did not")
        }
        Ok(report) => tracing::info!("{report}"),
        Err(e @ ReloadError::Invalid(_)) => tracing::error!("{e}"),
        Err(e) => tracing::error!("reload failed: {e}"),
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
