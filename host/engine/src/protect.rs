//! What defines the running composition, so the sessions it serves cannot rewrite it: the
//! manifest, the plugin libraries and every directory libraries are looked for in, the
//! state directory, and with `--dev` the packages it rebuilds and their target directory.
//! The host only computes the list and serves it as the `composition` service; the plugin
//! that owns the sandbox policy decides how it is enforced.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cordis_sdk::host::Composition;
use cordis_sdk::Result;

use crate::loader::SearchPath;
use crate::manifest::Manifest;

/// The protected paths of one host. Only ever grows while the host runs: a path that
/// defined an earlier generation may still be loaded, and a reload that fails keeps it.
#[derive(Debug, Default)]
pub struct Protection {
    state_dir: PathBuf,
    paths: Mutex<BTreeSet<PathBuf>>,
    /// Bumped by every [`Protection::add`] (every plan, so every reload), after the paths
    /// are in: whoever reads a stamp and then the paths sees at least that stamp's paths.
    stamp: AtomicU64,
}

/// `path` made absolute and canonical as far as it exists (the deepest existing ancestor
/// resolved, the rest appended), so a path that does not exist yet is protected too.
pub(crate) fn canonical_lenient(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut rest = Vec::new();
    let mut existing = absolute.as_path();
    loop {
        if let Ok(canon) = existing.canonicalize() {
            return rest.iter().rev().fold(canon, |acc, part| acc.join(part));
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                existing = parent;
            }
            _ => return absolute,
        }
    }
}

impl Protection {
    /// The protection of a host keeping its state in `state_dir` (protected from the start;
    /// empty for commands that keep no state).
    pub fn new(state_dir: &Path) -> Protection {
        if state_dir.as_os_str().is_empty() {
            return Protection::default();
        }
        let state_dir = canonical_lenient(state_dir);
        Protection {
            paths: Mutex::new(BTreeSet::from([state_dir.clone()])),
            state_dir,
            stamp: AtomicU64::new(0),
        }
    }

    /// Protects `paths` from now on.
    pub fn add(&self, paths: impl IntoIterator<Item = PathBuf>) {
        let mut set = self.paths.lock().unwrap_or_else(|e| e.into_inner());
        for path in paths {
            // As named too (absolute, links kept): a link on the way is protected at both
            // ends by the policy owner only if it sees the link.
            if let Ok(absolute) = std::path::absolute(&path) {
                set.insert(absolute);
            }
            set.insert(canonical_lenient(&path));
        }
        drop(set);
        self.stamp.fetch_add(1, Ordering::SeqCst);
    }

    /// Changes whenever the protected paths may have ([`CurrentCall::composition`]).
    ///
    /// [`CurrentCall::composition`]: cordis_sdk::host::CurrentCall::composition
    pub fn stamp(&self) -> u64 {
        self.stamp.load(Ordering::SeqCst)
    }

    /// Protects what `manifest` (read from `file`) can load: the file itself, every
    /// directory of the search path, and each `path:` entry's library and directory.
    /// Called before any of its libraries is loaded.
    pub(crate) fn cover_manifest(&self, file: &Path, manifest: &Manifest, search: &SearchPath) {
        let base = file.parent().unwrap_or(Path::new("."));
        let mut paths = vec![file.to_path_buf()];
        paths.extend(search.dirs.iter().map(|(d, _)| d.clone()));
        for entry in &manifest.entries {
            if let Some(p) = &entry.path {
                let library = base.join(p);
                paths.extend(library.parent().map(Path::to_path_buf));
                paths.push(library);
            }
        }
        self.add(paths);
    }

    /// Every protected path, sorted.
    pub fn paths(&self) -> Vec<PathBuf> {
        let set = self.paths.lock().unwrap_or_else(|e| e.into_inner());
        set.iter().cloned().collect()
    }

    /// The state directory (canonical; empty when the host keeps no state).
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }
}

/// The `composition` host service.
pub(crate) struct CompositionService(pub Arc<Protection>);

impl Composition for CompositionService {
    fn protected_paths(&self, _unit: ()) -> Result<Vec<PathBuf>> {
        Ok(self.0.paths())
    }

    fn state_dir(&self, _unit: ()) -> Result<PathBuf> {
        Ok(self.0.state_dir().to_path_buf())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_canonical_even_before_they_exist_and_kept_as_named() {
        let tmp = tempfile::tempdir().unwrap();
        let real = tmp.path().canonicalize().unwrap();
        std::os::unix::fs::symlink(&real, real.join("alias")).unwrap();
        assert_eq!(
            canonical_lenient(&real.join("alias/not/yet")),
            real.join("not/yet")
        );
        let p = Protection::new(&real.join("alias/state"));
        assert_eq!(p.state_dir(), real.join("state"));
        p.add([real.join("alias/lib.so")]);
        // Where it leads, and as named (the link on the way is protected at both ends).
        assert_eq!(
            p.paths(),
            [
                real.join("alias/lib.so"),
                real.join("lib.so"),
                real.join("state")
            ]
        );
        assert!(Protection::new(Path::new("")).paths().is_empty());
    }
}
