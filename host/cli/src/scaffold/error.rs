//! Why `cordis new` scaffolded nothing (or, when a workspace's manifest could not be
//! replaced at the last step, what was left).

use std::fmt;
use std::path::PathBuf;

/// Why nothing was scaffolded.
#[derive(Debug)]
pub enum ScaffoldError {
    /// The name cannot be a plugin crate's name.
    BadName {
        /// The name given.
        name: String,
        /// What is wrong with it.
        why: String,
    },
    /// The directory exists and is not empty.
    NotEmpty(PathBuf),
    /// A crate the new plugin depends on is not where it should be.
    SdkMissing {
        /// The crate: `cordis-sdk`, or `cordis-test` (the sibling `test-support` of the SDK).
        krate: &'static str,
        /// Where it was looked for.
        looked: PathBuf,
        /// The SDK directory given (or built in).
        sdk: PathBuf,
    },
    /// The manifest of a workspace above the crate cannot be read or edited.
    Workspace {
        /// The `Cargo.toml`.
        manifest: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// The crate was written but the workspace's root manifest could not be replaced.
    NotAdded {
        /// The workspace's root `Cargo.toml` (unchanged).
        manifest: PathBuf,
        /// The crate directory.
        dir: PathBuf,
        /// Whether the crate was removed again.
        removed: bool,
        /// The error.
        error: std::io::Error,
    },
    /// Writing failed (nothing was left behind).
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The error.
        error: std::io::Error,
    },
}

impl fmt::Display for ScaffoldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScaffoldError::BadName { name, why } => write!(
                f,
                "`{name}` is not a valid plugin name: {why}; use lowercase letters, digits and `-`, starting with a letter (e.g. `my-plugin`)"
            ),
            ScaffoldError::NotEmpty(dir) => write!(
                f,
                "{} already exists and is not empty; choose another name or pass `--path DIR` with a new or empty directory",
                dir.display()
            ),
            ScaffoldError::SdkMissing { krate, looked, sdk } => {
                if *krate == "cordis-sdk" {
                    write!(f, "the cordis SDK is not at {}", looked.display())?;
                } else {
                    write!(
                        f,
                        "the plugin test harness `{krate}` is not at {} (beside the SDK at {})",
                        looked.display(),
                        sdk.display()
                    )?;
                }
                write!(
                    f,
                    ": a new plugin depends by path on `cordis-sdk` (the SDK directory) and on `cordis-test` (the directory `test-support` beside it); pass `--sdk-path` with the `plugins/sdk` directory of a cordis checkout, which has both"
                )
            }
            ScaffoldError::Workspace { manifest, why } => write!(
                f,
                "cannot read the workspace manifest {} above the new crate: {why}; fix it, or pass `--path DIR` outside that workspace",
                manifest.display()
            ),
            ScaffoldError::NotAdded {
                manifest,
                dir,
                removed,
                error,
            } => {
                write!(
                    f,
                    "cannot add the new crate to the workspace members in {}: {error}; that file is unchanged",
                    manifest.display()
                )?;
                if *removed {
                    write!(f, " and {} was removed again", dir.display())
                } else {
                    write!(
                        f,
                        ", but {} is left behind: remove it, or add it to `members` yourself",
                        dir.display()
                    )
                }
            }
            ScaffoldError::Io { path, error } => {
                write!(f, "cannot write {}: {error}", path.display())
            }
        }
    }
}

impl std::error::Error for ScaffoldError {}
