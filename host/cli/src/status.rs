//! What a running `cordis run` tells other `cordis` processes about itself: a status file
//! in its runtime directory (`<state dir>/run/<pid>/status.json`), rewritten atomically at
//! start, after every reload and when an isolated entry's process changes (a crash, a
//! restart, left stopped), removed when it stops. `cordis services` reads it to show the
//! generations a running host is serving and how its isolated entries are doing.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use cordis_engine::Composition;

/// One applied entry of a running host.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryStatus {
    /// The entry's id.
    pub id: String,
    /// The plugin's name.
    pub plugin: String,
    /// The plugin's version.
    pub version: String,
    /// The library file the entry was loaded from.
    pub library: PathBuf,
    /// The library generation it runs on (0: loaded in place, without watching).
    pub generation: u64,
    /// How it is doing when it runs in a process of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolated: Option<IsolatedStatus>,
}

/// An isolated entry's process, as the host last saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IsolatedStatus {
    /// The process serving it now (none while it restarts or is stopped).
    pub pid: Option<u32>,
    /// How many times it was restarted.
    pub restarts: u32,
    /// How its last process ended.
    pub last_exit: Option<String>,
    /// Why it is left stopped, when it is.
    pub stopped: Option<String>,
}

/// A running host.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostStatus {
    /// Its process id.
    pub pid: u32,
    /// The manifest it serves (canonical).
    pub manifest: PathBuf,
    /// When it started, in seconds since the Unix epoch.
    pub started: u64,
    /// How many reloads changed its composition.
    pub reloads: u64,
    /// Its entries, in dependency order.
    pub entries: Vec<EntryStatus>,
}

/// The runtime directory of the host with process id `pid`.
pub fn run_dir(state_dir: &Path, pid: u32) -> PathBuf {
    state_dir.join("run").join(pid.to_string())
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl HostStatus {
    /// The status of this process serving `manifest`, started now.
    pub fn new(manifest: &Path) -> Self {
        HostStatus {
            pid: std::process::id(),
            manifest: manifest
                .canonicalize()
                .unwrap_or_else(|_| manifest.to_path_buf()),
            started: now(),
            reloads: 0,
            entries: Vec::new(),
        }
    }

    /// Takes the entries of `composition` and writes the status file into `state_dir`; a
    /// failure to write is logged (only `cordis services` misses it).
    pub fn publish(&mut self, composition: &Composition, state_dir: &Path) {
        self.update(composition);
        self.write_logged(state_dir);
    }

    /// Like [`HostStatus::publish`], only when the entries changed (an isolated entry's
    /// process came or went).
    pub fn refresh(&mut self, composition: &Composition, state_dir: &Path) {
        let before = self.entries.clone();
        self.update(composition);
        if self.entries != before {
            self.write_logged(state_dir);
        }
    }

    fn write_logged(&self, state_dir: &Path) {
        if let Err(e) = self.write(state_dir) {
            tracing::warn!("cannot write the host status for `cordis services`: {e}");
        }
    }

    fn update(&mut self, composition: &Composition) {
        let registry = composition.registry();
        self.entries = composition
            .plan()
            .entries
            .iter()
            .map(|p| EntryStatus {
                id: p.entry.id.clone(),
                plugin: p.library.meta.name.clone(),
                version: p.library.meta.version.clone(),
                library: p.library.path.clone(),
                generation: p.library.generation,
                isolated: registry.isolation(&p.entry.id).map(|st| IsolatedStatus {
                    pid: st.pid,
                    restarts: st.restarts,
                    last_exit: st.last_exit,
                    stopped: st.stopped,
                }),
            })
            .collect();
    }

    /// Writes the status file into `state_dir` atomically (a temp file renamed over it).
    pub fn write(&self, state_dir: &Path) -> std::io::Result<()> {
        let dir = cordis_engine::private_dir(state_dir, &run_dir(Path::new(""), self.pid))?;
        let tmp = dir.join("status.json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(self)?)?;
        std::fs::rename(&tmp, dir.join("status.json"))
    }

    /// The statuses of the live hosts in `state_dir` serving `manifest`, by pid. A status
    /// left behind by a host that died is skipped.
    pub fn live(state_dir: &Path, manifest: &Path) -> Vec<HostStatus> {
        let manifest = manifest
            .canonicalize()
            .unwrap_or_else(|_| manifest.to_path_buf());
        let mut live = HostStatus::all_live(state_dir);
        live.retain(|s| s.manifest == manifest);
        live
    }

    /// The statuses of every live host in `state_dir`, whatever it serves, by pid.
    pub fn all_live(state_dir: &Path) -> Vec<HostStatus> {
        let Ok(dirs) = std::fs::read_dir(state_dir.join("run")) else {
            return Vec::new();
        };
        let mut live: Vec<HostStatus> = dirs
            .filter_map(|d| {
                let text = std::fs::read(d.ok()?.path().join("status.json")).ok()?;
                serde_json::from_slice::<HostStatus>(&text).ok()
            })
            .filter(|s| is_alive(s.pid))
            .collect();
        live.sort_by_key(|s| s.pid);
        live
    }

    /// How long it has been running.
    pub(crate) fn uptime(&self) -> Duration {
        Duration::from_secs(now().saturating_sub(self.started))
    }
}

/// Whether process `pid` exists (signal 0 checks without sending anything).
fn is_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

impl std::fmt::Display for HostStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let up = self.uptime().as_secs();
        writeln!(
            f,
            "running: pid {}, up {}h{:02}m{:02}s, {} reload{}",
            self.pid,
            up / 3600,
            up / 60 % 60,
            up % 60,
            self.reloads,
            if self.reloads == 1 { "" } else { "s" }
        )?;
        for e in &self.entries {
            writeln!(
                f,
                "  {}: plugin {} {}, generation {} ({})",
                e.id,
                e.plugin,
                e.version,
                e.generation,
                e.library.display()
            )?;
            if let Some(st) = &e.isolated {
                writeln!(
                    f,
                    "    isolated: {}, restarts {}{}",
                    match (&st.stopped, st.pid) {
                        (Some(why), _) => format!("stopped ({why})"),
                        (None, Some(pid)) => format!("pid {pid}"),
                        (None, None) => "restarting".to_string(),
                    },
                    st.restarts,
                    st.last_exit
                        .as_ref()
                        .map(|e| format!(", last process {e}"))
                        .unwrap_or_default()
                )?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_statuses_only_for_this_manifest_and_living_pids() {
        let state = tempfile::tempdir().unwrap();
        let manifest = state.path().join("cordis.yml");
        std::fs::write(&manifest, "[]\n").unwrap();
        let mut me = HostStatus::new(&manifest);
        me.reloads = 1;
        me.write(state.path()).unwrap();
        // A host that died without cleaning up, and a live one serving another manifest.
        let mut dead = HostStatus::new(&manifest);
        dead.pid = i32::MAX as u32;
        dead.write(state.path()).unwrap();
        let mut other = HostStatus::new(&state.path().join("other.yml"));
        other.pid = 1;
        other.write(state.path()).unwrap();
        assert_eq!(HostStatus::live(state.path(), &manifest), vec![me]);
    }
}
