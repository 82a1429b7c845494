//! Where each installed plugin came from: `cordis plugin install` records its source beside
//! the library (`<dir>/.sources/<library file>.json`), so `cordis plugin list` can say how to
//! rebuild a library this `cordis` no longer loads and `cordis plugin upgrade` can do it.
//! Written by a rename, like the library; removed with it.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

/// The directory of the records, inside the plugin directory (hidden: the search path
/// looks at `lib*.so` files only).
const SOURCES: &str = ".sources";

/// A record can be no larger than this (it is a path and a few names).
const MAX_RECORD: u64 = 64 * 1024;

/// What a library was installed from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// A plugin crate directory, built with `cargo build --release`.
    Crate(PathBuf),
    /// A library file, copied.
    File(PathBuf),
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Crate(dir) => write!(f, "the crate at {}", dir.display()),
            Source::File(file) => write!(f, "the file {}", file.display()),
        }
    }
}

/// One installed plugin's record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The plugin's name.
    pub plugin: String,
    /// Its version when installed.
    pub version: String,
    /// The `cordis-sdk` it was built against.
    pub sdk: String,
    /// Where it came from.
    pub source: Source,
}

/// The record file of the library named `library_file` in `dir`.
fn record_path(dir: &Path, library_file: &std::ffi::OsStr) -> PathBuf {
    let mut name = library_file.to_os_string();
    name.push(".json");
    dir.join(SOURCES).join(name)
}

/// Records `record` for the library `library` (a file in the plugin directory).
pub fn write(library: &Path, record: &Record) -> anyhow::Result<()> {
    let (Some(dir), Some(file)) = (library.parent(), library.file_name()) else {
        anyhow::bail!("{} is not a file in a directory", library.display());
    };
    let path = record_path(dir, file);
    let sources = dir.join(SOURCES);
    std::fs::create_dir_all(&sources)
        .with_context(|| format!("cannot create {}", sources.display()))?;
    let temp = tempfile::Builder::new()
        .prefix(".record-")
        .tempfile_in(&sources)
        .with_context(|| format!("cannot write in {}", sources.display()))?;
    serde_json::to_writer_pretty(temp.as_file(), record)?;
    temp.as_file()
        .sync_all()
        .with_context(|| format!("cannot write {}", temp.path().display()))?;
    temp.persist(&path)
        .with_context(|| format!("cannot put {} in place", path.display()))?;
    Ok(())
}

/// The record of the library `library`, if one was written and can be read. A record that
/// is unreadable or malformed is reported as such.
pub fn read(library: &Path) -> Option<Result<Record, String>> {
    let (dir, file) = (library.parent()?, library.file_name()?);
    let path = record_path(dir, file);
    let meta = std::fs::symlink_metadata(&path).ok()?;
    let bad = |why: String| Some(Err(format!("the record {} {why}", path.display())));
    if !meta.is_file() || meta.len() > MAX_RECORD {
        return bad(format!(
            "is not a regular file of at most {MAX_RECORD} bytes"
        ));
    }
    match std::fs::read(&path) {
        Err(e) => bad(format!("cannot be read: {e}")),
        Ok(bytes) => match serde_json::from_slice(&bytes) {
            Ok(record) => Some(Ok(record)),
            Err(e) => bad(format!("is malformed: {e}")),
        },
    }
}

/// Removes the record of `library` (nothing when there is none).
pub fn remove(library: &Path) -> anyhow::Result<()> {
    let (Some(dir), Some(file)) = (library.parent(), library.file_name()) else {
        return Ok(());
    };
    let path = record_path(dir, file);
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("cannot remove {}", path.display()))
        }
        _ => Ok(()),
    }
}

/// The library file of every record in `dir`, sorted.
pub fn recorded_libraries(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir.join(SOURCES)) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name();
            let name = name.to_str()?;
            let library = name.strip_suffix(".json")?;
            (!name.starts_with('.')).then(|| dir.join(library))
        })
        .collect();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(source: Source) -> Record {
        Record {
            plugin: "notes".into(),
            version: "0.1.0".into(),
            sdk: "0.1.0".into(),
            source,
        }
    }

    #[test]
    fn a_record_round_trips_and_goes_with_its_library() {
        let dir = tempfile::tempdir().unwrap();
        let library = dir.path().join("libnotes.so");
        assert_eq!(read(&library), None);
        let written = record(Source::Crate("/src/notes".into()));
        write(&library, &written).unwrap();
        assert_eq!(read(&library), Some(Ok(written)));
        assert_eq!(
            recorded_libraries(dir.path()),
            std::slice::from_ref(&library)
        );
        let replaced = record(Source::File("/out/libnotes.so".into()));
        write(&library, &replaced).unwrap();
        assert_eq!(read(&library), Some(Ok(replaced)));
        remove(&library).unwrap();
        remove(&library).unwrap();
        assert_eq!(read(&library), None);
        assert!(recorded_libraries(dir.path()).is_empty());
    }

    #[test]
    fn a_malformed_or_oversized_record_is_named_not_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let library = dir.path().join("libnotes.so");
        std::fs::create_dir_all(dir.path().join(SOURCES)).unwrap();
        let path = record_path(dir.path(), library.file_name().unwrap());
        std::fs::write(&path, "{\"plugin\": 5}").unwrap();
        let err = read(&library).unwrap().unwrap_err();
        assert!(err.contains("is malformed"), "{err}");
        std::fs::write(&path, vec![b' '; MAX_RECORD as usize + 1]).unwrap();
        let err = read(&library).unwrap().unwrap_err();
        assert!(err.contains("at most 65536 bytes"), "{err}");
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", &path).unwrap();
        let err = read(&library).unwrap().unwrap_err();
        assert!(err.contains("is not a regular file"), "{err}");
    }
}
