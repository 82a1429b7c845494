//! What a plugin library is built from: the sources cargo lists for it, the path
//! dependencies it compiles, and the configuration cargo and rustup read for its build.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::cargo::{cargo_metadata, Package};

/// The package directories of the path dependencies of `members` (whose directories are
/// `member_dirs`) that lie outside every member and that a library build compiles (not
/// dev-dependencies), following each one's own in turn (`cargo metadata` of its package).
pub(super) fn path_dependencies(
    members: &[&Package],
    member_dirs: &[PathBuf],
) -> anyhow::Result<Vec<PathBuf>> {
    let outside = |dir: &PathBuf| !member_dirs.iter().any(|m| dir.starts_with(m));
    let mut queue: Vec<PathBuf> = members
        .iter()
        .flat_map(|p| {
            p.dependencies
                .iter()
                .filter_map(|d| d.built_path().cloned())
        })
        .collect();
    let mut found: BTreeSet<PathBuf> = BTreeSet::new();
    while let Some(dir) = queue.pop() {
        let dir = dir.canonicalize().unwrap_or(dir);
        if !outside(&dir) || !found.insert(dir.clone()) {
            continue;
        }
        let meta = cargo_metadata(&dir)?;
        let manifest = dir.join("Cargo.toml");
        if let Some(package) = meta.packages.iter().find(|p| {
            p.manifest_path
                .canonicalize()
                .unwrap_or_else(|_| p.manifest_path.clone())
                == manifest
        }) {
            queue.extend(
                package
                    .dependencies
                    .iter()
                    .filter_map(|d| d.built_path().cloned()),
            );
        }
    }
    Ok(found.into_iter().collect())
}

/// The configuration files cargo (`.cargo/config.toml`, `.cargo/config`) and rustup
/// (`rust-toolchain.toml`, `rust-toolchain`) read for a build run in `root`: in it and in
/// every directory above it.
pub(super) fn build_configs(root: &Path) -> Vec<PathBuf> {
    root.ancestors()
        .flat_map(|dir| {
            [
                dir.join(".cargo/config.toml"),
                dir.join(".cargo/config"),
                dir.join("rust-toolchain.toml"),
                dir.join("rust-toolchain"),
            ]
        })
        .collect()
}

/// The source files listed in the dep-info file cargo writes beside `library`
/// (`lib<name>.d`: `<output>: <source> <source>...`, spaces in paths escaped with `\\`);
/// none when there is no such file.
pub(super) fn sources_of(library: &Path) -> Vec<PathBuf> {
    use std::io::Read;
    let mut text = String::new();
    let read = std::fs::File::open(library.with_extension("d"))
        .and_then(|f| f.take(1 << 20).read_to_string(&mut text));
    let Some((_, deps)) = read
        .ok()
        .and_then(|_| text.lines().next())
        .and_then(|line| line.split_once(": "))
    else {
        return Vec::new();
    };
    let mut sources = Vec::new();
    let mut current = String::new();
    let mut chars = deps.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => current.extend(chars.next()),
            ' ' => sources
                .extend((!current.is_empty()).then(|| PathBuf::from(std::mem::take(&mut current)))),
            c => current.push(c),
        }
    }
    sources.extend((!current.is_empty()).then(|| PathBuf::from(current)));
    sources
}

#[cfg(test)]
mod tests {
    use super::*;
    use cordis_engine::library_file_name;

    /// Every source of the dep-info file, spaces unescaped, in cargo's order (sorted, so
    /// the plugin's own crate root need not come first).
    #[test]
    fn dep_info_sources_are_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let library = dir.path().join(library_file_name("my_plugin"));
        std::fs::write(
            library.with_extension("d"),
            "/t/debug/libmy_plugin.rlib: /a/sdk/src/lib.rs /z/my\\ plugin/src/lib.rs\n\n/a/sdk/src/lib.rs:\n",
        )
        .unwrap();
        assert_eq!(
            sources_of(&library),
            [
                PathBuf::from("/a/sdk/src/lib.rs"),
                PathBuf::from("/z/my plugin/src/lib.rs")
            ]
        );
        assert!(sources_of(&dir.path().join("libnone.so")).is_empty());
    }
}
