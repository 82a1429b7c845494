//! `cordis plugin upgrade [NAME]`: rebuilds and reinstalls installed plugins from the
//! sources `install` recorded — every one this `cordis` no longer loads, or the one named
//! — each checked and put in place exactly as `install` does it.

use std::path::{Path, PathBuf};

use anyhow::bail;
use cordis_engine::{library_file_name, plugin_name, Library};

use super::record::{self, Record, Source};
use super::{install, Installed};

/// What `upgrade` did for one installed plugin.
#[derive(Debug)]
pub struct Upgraded {
    /// The plugin (from its record; the library file's name when the record is unreadable).
    pub plugin: String,
    /// Its library file.
    pub library: PathBuf,
    /// What happened.
    pub outcome: Outcome,
}

/// The outcome for one installed plugin.
#[derive(Debug)]
pub enum Outcome {
    /// It loads with this `cordis` and was not named: left as it is.
    Current,
    /// Its library is gone (removed by hand): left as it is.
    Missing(Source),
    /// Rebuilt (or copied again) from its source and installed.
    Reinstalled(Box<Installed>, Source),
    /// It could not be upgraded, and why; the installed file is unchanged.
    Failed(String),
}

/// Upgrades the plugins installed in `dir`: the one named `name` (rebuilt even when it
/// loads), or every recorded one this `cordis` cannot load.
pub fn upgrade(name: Option<&str>, dir: &Path) -> anyhow::Result<Vec<Upgraded>> {
    let mut libraries = record::recorded_libraries(dir);
    if let Some(name) = name {
        let name = plugin_name(name);
        let file = dir.join(library_file_name(name));
        let named = |library: &PathBuf| {
            *library == file || matches!(record::read(library), Some(Ok(r)) if r.plugin == name)
        };
        libraries.retain(named);
        if libraries.is_empty() {
            if file.exists() {
                bail!(
                    "plugin `{name}` in {} has no recorded source (it was installed by hand or by an older cordis): reinstall it with `cordis plugin install SOURCE`, which records it",
                    dir.display()
                );
            }
            bail!(
                "no plugin `{name}` is installed in {}: `cordis plugin list` shows what is",
                dir.display()
            );
        }
    }
    let mut out = Vec::new();
    for library in libraries {
        let fallback = library
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        let (plugin, outcome) = match record::read(&library) {
            None => continue,
            Some(Err(why)) => (fallback, Outcome::Failed(why)),
            Some(Ok(Record { plugin, source, .. })) => {
                let outcome = if !library.exists() {
                    if name.is_some() {
                        reinstall(&source, dir)
                    } else {
                        Outcome::Missing(source)
                    }
                } else if name.is_none() && Library::load(&library).is_ok() {
                    Outcome::Current
                } else {
                    reinstall(&source, dir)
                };
                (plugin, outcome)
            }
        };
        out.push(Upgraded {
            plugin,
            library,
            outcome,
        });
    }
    Ok(out)
}

/// Installs again from `source`, as `cordis plugin install` would.
fn reinstall(source: &Source, dir: &Path) -> Outcome {
    let from = match source {
        Source::Crate(dir) | Source::File(dir) => dir,
    };
    match install(from, dir) {
        Ok(installed) => Outcome::Reinstalled(Box::new(installed), source.clone()),
        Err(e) => Outcome::Failed(match source {
            Source::Crate(_) => format!("{e:#}"),
            Source::File(file) => format!(
                "{e:#}; it was installed from the file {}, which cordis cannot rebuild: rebuild it against this cordis's SDK, then upgrade again",
                file.display()
            ),
        }),
    }
}

/// The report of `upgrade`, one paragraph per plugin, and whether every one succeeded.
pub fn describe(upgraded: &[Upgraded], dir: &Path) -> (String, bool) {
    use std::fmt::Write as _;
    if upgraded.is_empty() {
        return (
            format!(
                "no plugin installed in {} has a recorded source; `cordis plugin install SOURCE` installs one and records where it came from\n",
                dir.display()
            ),
            true,
        );
    }
    let mut out = String::new();
    let mut ok = true;
    for u in upgraded {
        let plugin = &u.plugin;
        match &u.outcome {
            Outcome::Current => {
                let _ = writeln!(
                    out,
                    "`{plugin}`: loads with this cordis; left as it is (`cordis plugin upgrade {plugin}` rebuilds it anyway)"
                );
            }
            Outcome::Missing(source) => {
                let _ = writeln!(
                    out,
                    "`{plugin}`: its library {} is gone; left as it is (`cordis plugin upgrade {plugin}` reinstalls it from {source})",
                    u.library.display()
                );
            }
            Outcome::Reinstalled(installed, source) => {
                let meta = &installed.library.meta;
                let _ = writeln!(
                    out,
                    "`{plugin}`: reinstalled from {source} at {}: {} {} (cordis-sdk {}){}",
                    installed.path.display(),
                    meta.name,
                    meta.version,
                    meta.sdk_version,
                    installed
                        .replaced
                        .as_ref()
                        .map(|v| format!(", replacing {v}"))
                        .unwrap_or_default()
                );
                if let Some(why) = &installed.unrecorded {
                    let _ = writeln!(out, "warning: its source could not be recorded ({why})");
                }
            }
            Outcome::Failed(why) => {
                ok = false;
                let _ = writeln!(
                    out,
                    "`{plugin}`: not upgraded, {} is unchanged: {why}",
                    u.library.display()
                );
            }
        }
    }
    (out, ok)
}
