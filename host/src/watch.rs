//! Watching for changes while `cordis run` serves: the manifest and every loaded plugin
//! library. Parent directories are watched, not files (editors and cargo replace files by
//! rename or hard link, and a watch on the file dies with it). Events are debounced until
//! the files have been quiet for a moment, so one `cargo build` of several plugins becomes
//! one reload; a change that leaves every byte the same reloads nothing.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

use notify_debouncer_mini::notify::RecursiveMode;
use notify_debouncer_mini::{new_debouncer, DebounceEventResult};

use crate::runtime::{ReloadError, Runtime};

/// How long the watched files must be quiet before a reload starts.
pub const QUIET: Duration = Duration::from_millis(400);

/// Watches `runtime`'s files on a background thread until the process ends.
pub fn spawn(runtime: Arc<Runtime>) -> anyhow::Result<()> {
    let (tx, rx) = channel::<Vec<PathBuf>>();
    let mut debouncer =
        new_debouncer(QUIET / 4, move |result: DebounceEventResult| match result {
            Ok(events) => {
                let _ = tx.send(events.into_iter().map(|e| e.path).collect());
            }
            Err(e) => tracing::warn!("file watcher: {e}"),
        })?;
    let mut watched_dirs: BTreeSet<PathBuf> = BTreeSet::new();
    let mut watch_all = move |runtime: &Runtime, dirs: &mut BTreeSet<PathBuf>| {
        for dir in parent_dirs(&runtime.watched_files()) {
            if dirs.contains(&dir) {
                continue;
            }
            match debouncer.watcher().watch(&dir, RecursiveMode::NonRecursive) {
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
        .spawn(move || loop {
            let Ok(first) = rx.recv() else { return };
            let mut changed: BTreeSet<PathBuf> = first.into_iter().collect();
            // Trailing-edge debounce over every path: wait until quiet.
            loop {
                match rx.recv_timeout(QUIET) {
                    Ok(more) => changed.extend(more),
                    Err(RecvTimeoutError::Timeout) => break,
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            }
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
            match runtime.reload() {
                Ok(report) if report.is_empty() => {
                    tracing::debug!("files changed but the composition did not")
                }
                Ok(report) => tracing::info!("{report}"),
                Err(e @ ReloadError::Invalid(_)) => tracing::error!("{e}"),
                Err(e) => tracing::error!("reload failed: {e}"),
            }
            watch_all(&runtime, &mut watched_dirs);
        })?;
    Ok(())
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
