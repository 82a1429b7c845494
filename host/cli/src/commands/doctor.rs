//! `cordis doctor`: whether this host can run the composition in `cordis.yml` as it is
//! configured, item by item (ok, missing, degraded, or not needed), each with the exact
//! fix. Every check is made for real: the namespaces, their loopback and the seccomp
//! filter in a child that enters them, Landlock from the kernel, a whole confined `true`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use cordis_engine::Host;
use dsh_sandbox::ConfinementTier;
use dsh_shell_core::probe;
use serde::Serialize;

use super::Format;

/// The plugin whose commands are confined: what most of the checks are for.
const CONFINED_SHELL: &str = "dsh-bash-sandbox";
/// The policy owner, whose config says what the confinement needs (limits, network).
const POLICY_OWNER: &str = "dsh-sandbox-policy";
/// README's section on hosts that restrict user namespaces (the AppArmor profile).
const APPARMOR_HELP: &str = "load the AppArmor profile shipped with cordis (`share/cordis/apparmor/cordis` in the release archive; README, \"Hosts that restrict user namespaces\"): edit its path to where `cordis` is installed, copy it to /etc/apparmor.d/cordis and run `apparmor_parser -r /etc/apparmor.d/cordis`";

/// How one item stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Status {
    /// Works as the composition needs it.
    Ok,
    /// The composition needs it and it does not work: the composition cannot run as
    /// configured.
    Missing,
    /// Works, but not as well as it could (the composition runs).
    Degraded,
    /// The composition does not need it.
    NotNeeded,
}

impl Status {
    fn label(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Missing => "MISSING",
            Status::Degraded => "degraded",
            Status::NotNeeded => "not needed",
        }
    }
}

#[derive(Debug, Serialize)]
struct Item {
    check: &'static str,
    status: Status,
    detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    fix: Option<String>,
}

fn item(check: &'static str, status: Status, detail: impl Into<String>) -> Item {
    Item {
        check,
        status,
        detail: detail.into(),
        fix: None,
    }
}

impl Item {
    fn fix(mut self, fix: impl Into<String>) -> Item {
        self.fix = Some(fix.into());
        self
    }
}

/// What the composition asks of the host.
struct Needs {
    /// A confined shell is composed.
    confinement: bool,
    /// Its commands have memory or process limits (a cgroup per command).
    cgroups: bool,
    /// Its policy has a network allowlist (the proxy on the namespace's loopback).
    allowlist: bool,
    /// The policy's confinement tier (`landlock-only` makes no namespaces).
    tier: ConfinementTier,
}

fn needs_of(host: &Host) -> (Needs, Vec<Item>) {
    let mut items = Vec::new();
    let plan = match host.plan() {
        Ok(plan) => {
            items.push(item(
                "composition",
                Status::Ok,
                format!(
                    "`{}`: {} entries, valid",
                    host.manifest().display(),
                    plan.entries.len()
                ),
            ));
            Some(plan)
        }
        Err(problems) => {
            items.push(
                item(
                    "composition",
                    Status::Missing,
                    format!("`{}` does not plan: {problems}", host.manifest().display()),
                )
                .fix("`cordis check` shows every problem with its fix"),
            );
            None
        }
    };
    let entries = plan.as_ref().map(|p| p.entries.as_slice()).unwrap_or(&[]);
    let confinement = entries.iter().any(|p| p.entry.plugin == CONFINED_SHELL);
    let policy = entries
        .iter()
        .find(|p| p.entry.plugin == POLICY_OWNER)
        .map(|p| p.entry.config.clone())
        .unwrap_or_default();
    let limit = |key: &str| {
        policy
            .pointer(&format!("/limits/{key}"))
            .and_then(|v| v.as_u64())
    };
    // The defaults (4096 MiB, 512 processes) need a cgroup; `0` turns a limit off.
    let cgroups = confinement
        && (limit("memoryMib").is_none_or(|v| v > 0) || limit("processes").is_none_or(|v| v > 0));
    let allowlist = confinement && policy.get("network").is_some_and(|n| n.is_object());
    let tier = policy
        .get("confinement")
        .and_then(|t| serde_json::from_value(t.clone()).ok())
        .unwrap_or_default();
    // The search path: which library each entry loads, and what it shadows.
    let mut lines = Vec::new();
    for planned in entries {
        let loaded_file = planned.library.loaded_file();
        let loaded = loaded_file.display().to_string();
        let same = |p: &Path| p.canonicalize().ok() == loaded_file.canonicalize().ok();
        let mut shadowed: Vec<String> = Vec::new();
        for p in host.search().find_all(&planned.entry.plugin) {
            let shown = format!("`{}`", p.display());
            if !same(&p) && !shadowed.contains(&shown) {
                shadowed.push(shown);
            }
        }
        lines.push(if shadowed.is_empty() {
            format!("`{}` from `{loaded}`", planned.entry.plugin)
        } else {
            format!(
                "`{}` from `{loaded}` (shadowing {})",
                planned.entry.plugin,
                shadowed.join(", ")
            )
        });
    }
    let dirs: Vec<String> = host
        .search()
        .dirs
        .iter()
        .map(|(d, why)| format!("`{}` ({why})", d.display()))
        .collect();
    items.push(item(
        "plugin search path",
        Status::Ok,
        format!(
            "searched in order: {}; {}",
            dirs.join(", "),
            if lines.is_empty() {
                "no entry loaded".to_string()
            } else {
                lines.join("; ")
            }
        ),
    ));
    (
        Needs {
            confinement,
            cgroups,
            allowlist,
            tier,
        },
        items,
    )
}

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// The sysctls and the AppArmor state that decide whether unprivileged user namespaces
/// work, in words, and the fix they point to.
fn userns_explained() -> (String, String) {
    let mut facts = Vec::new();
    let mut fix = None;
    if let Some(v) = read_trimmed("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") {
        facts.push(format!(
            "kernel.apparmor_restrict_unprivileged_userns = {v}"
        ));
        if v == "1" {
            let label = read_trimmed("/proc/self/attr/apparmor/current")
                .or_else(|| read_trimmed("/proc/self/attr/current"))
                .unwrap_or_else(|| "unknown".to_string());
            facts.push(format!("this process's AppArmor label: {label}"));
            fix = Some(APPARMOR_HELP.to_string());
        }
    }
    if let Some(v) = read_trimmed("/proc/sys/kernel/unprivileged_userns_clone") {
        facts.push(format!("kernel.unprivileged_userns_clone = {v}"));
        if v == "0" && fix.is_none() {
            fix = Some(
                "`sysctl -w kernel.unprivileged_userns_clone=1` (and in /etc/sysctl.d to keep it)"
                    .to_string(),
            );
        }
    }
    if let Some(v) = read_trimmed("/proc/sys/user/max_user_namespaces") {
        facts.push(format!("user.max_user_namespaces = {v}"));
        if v == "0" && fix.is_none() {
            fix = Some(
                "`sysctl -w user.max_user_namespaces=15000` (and in /etc/sysctl.d to keep it)"
                    .to_string(),
            );
        }
    }
    let fix = fix.unwrap_or_else(|| {
        "in a container, run it with a seccomp profile that allows `unshare` and `clone` with `CLONE_NEWUSER` (e.g. Docker's `--security-opt seccomp=unconfined`), or compose `dsh-bash-local` to run commands unconfined on purpose".to_string()
    });
    (facts.join(", "), fix)
}

fn confinement_items(needs: &Needs) -> Vec<Item> {
    let mut items = Vec::new();
    let needed = |status: Status| {
        if needs.confinement {
            status
        } else {
            Status::NotNeeded
        }
    };
    // The namespaces: needed by the full tier only.
    let namespaced = |status: Status| {
        if needs.tier == ConfinementTier::LandlockOnly {
            Status::NotNeeded
        } else {
            needed(status)
        }
    };
    let abi = probe::landlock_abi();
    let pinned = dsh_shell_core::PINNED_ABI as i64;
    items.push(if abi >= pinned {
        item(
            "landlock",
            needed(Status::Ok),
            format!("Landlock ABI {abi} (confinement uses {pinned})"),
        )
    } else {
        item(
            "landlock",
            needed(Status::Missing),
            if abi == 0 {
                "the kernel has no Landlock (or it is not enabled)".to_string()
            } else {
                format!("Landlock ABI {abi}; confinement needs {pinned}")
            },
        )
        .fix("run Linux 6.10 or newer with `landlock` in the `lsm=` boot parameter (check `cat /sys/kernel/security/lsm`)")
    });
    let namespaces = probe::namespaces();
    let userns_failed = matches!(
        &namespaces,
        Err(f) if matches!(f.stage, dsh_shell_core::Stage::Namespaces | dsh_shell_core::Stage::IdMap)
    );
    items.push(match &namespaces {
        Err(f) if userns_failed => {
            let (facts, fix) = userns_explained();
            let fix = if needs.tier == ConfinementTier::LandlockOnly {
                fix
            } else {
                format!("{fix}; or, knowing what it gives up, `confinement: landlock-only` in the dsh-sandbox-policy config (README, \"The landlock-only tier\")")
            };
            item(
                "user namespaces",
                namespaced(Status::Missing),
                format!("{f}; {facts}"),
            )
            .fix(fix)
        }
        _ => {
            let (facts, _) = userns_explained();
            item(
                "user namespaces",
                namespaced(Status::Ok),
                format!("unprivileged user, mount, pid, ipc, uts and network namespaces can be created ({facts})"),
            )
        }
    });
    let loopback_status = |ok| {
        if !needs.confinement || needs.tier == ConfinementTier::LandlockOnly {
            Status::NotNeeded
        } else if ok {
            Status::Ok
        } else if needs.allowlist {
            Status::Missing
        } else {
            // Without the loopback a command still runs with no network at all; only the
            // allowlist's proxy needs it.
            Status::Degraded
        }
    };
    items.push(match &namespaces {
        Ok(()) => item(
            "network namespace loopback",
            loopback_status(true),
            "a command's own network namespace gets its loopback (the allowlist's proxy listens there)",
        ),
        Err(_) if userns_failed => item(
            "network namespace loopback",
            namespaced(Status::Missing),
            "not checked: no user namespace to make it in",
        ),
        Err(f) => item("network namespace loopback", loopback_status(false), f.to_string())
            .fix(f.stage.help()),
    });
    items.push(match probe::seccomp() {
        Ok(()) => item(
            "seccomp",
            needed(Status::Ok),
            "the command filter installs (with no_new_privs)",
        ),
        Err(f) => item("seccomp", needed(Status::Missing), f.to_string()).fix(f.stage.help()),
    });
    let cgroup_needed = |status| {
        if needs.cgroups {
            status
        } else {
            Status::NotNeeded
        }
    };
    items.push(match probe::cgroups() {
        Ok(where_) if where_.starts_with("cgroup v1") => item(
            "cgroups",
            cgroup_needed(Status::Ok),
            format!("{where_}: v1 serves the per-command memory and process limits (cgroup v2 with delegation is not needed)"),
        ),
        Ok(where_) => item("cgroups", cgroup_needed(Status::Ok), where_),
        Err(why) => item("cgroups", cgroup_needed(Status::Missing), why)
            .fix("run cordis where it may create control groups (as root with the cgroup file system writable; as a user, under a systemd unit with `Delegate=yes`), or turn the limits off on purpose with `limits: {memoryMib: 0, processes: 0}` in the dsh-sandbox-policy config"),
    });
    if needs.confinement {
        let scratch = std::env::temp_dir().join(format!("cordis-doctor-{}", std::process::id()));
        let made = std::fs::create_dir_all(&scratch).and_then(|()| scratch.canonicalize());
        items.push(match made {
            Err(e) => item(
                "confined command",
                Status::Missing,
                format!(
                    "cannot make a scratch workspace in `{}`: {e}",
                    std::env::temp_dir().display()
                ),
            )
            .fix("make the temp directory (TMPDIR) writable"),
            Ok(ws) => match probe::confined_true(&ws, needs.cgroups, needs.tier) {
                Ok(()) => item(
                    "confined command",
                    if needs.tier == ConfinementTier::LandlockOnly {
                        Status::Degraded
                    } else {
                        Status::Ok
                    },
                    match needs.tier {
                        ConfinementTier::Full => "`true` ran confined (namespaces, read-only view, Landlock, seccomp, limits)",
                        ConfinementTier::LandlockOnly => "`true` ran in the `landlock-only` tier (Landlock, seccomp, limits; no namespaces, as configured)",
                    },
                ),
                Err(e) => {
                    let err = e.into_sdk_error();
                    item("confined command", Status::Missing, err.message)
                        .fix(err.help.unwrap_or_default())
                }
            },
        });
        let _ = std::fs::remove_dir_all(&scratch);
    } else {
        items.push(item(
            "confined command",
            Status::NotNeeded,
            format!("no `{CONFINED_SHELL}` in the composition"),
        ));
    }
    items
}

fn state_items(state_dir: Option<&Path>) -> Vec<Item> {
    use std::os::unix::fs::MetadataExt;
    let Some(dir) = state_dir else {
        return vec![
            item(
                "state directory",
                Status::Missing,
                cordis_engine::NO_STATE_DIR,
            )
            .fix("pass `--state-dir DIR` or set CORDIS_STATE_DIR"),
            item(
                "http token",
                Status::Missing,
                "no state directory to keep a generated token in",
            )
            .fix("set CORDIS_HTTP_TOKEN, or give cordis a state directory"),
        ];
    };
    // SAFETY: a plain system call.
    let uid = unsafe { libc::geteuid() };
    let state = match std::fs::metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => item(
            "state directory",
            Status::Ok,
            format!("`{}` does not exist yet; cordis creates it 0700", dir.display()),
        ),
        Err(e) => item("state directory", Status::Missing, format!("`{}`: {e}", dir.display()))
            .fix("make it readable by this user, or choose another with `--state-dir`"),
        Ok(meta) if !meta.is_dir() => item(
            "state directory",
            Status::Missing,
            format!("`{}` is not a directory", dir.display()),
        )
        .fix("choose another with `--state-dir`"),
        Ok(meta) if meta.uid() != uid => item(
            "state directory",
            Status::Missing,
            format!("`{}` belongs to uid {}, not to this user (uid {uid})", dir.display(), meta.uid()),
        )
        .fix("use a state directory of your own (`--state-dir`)"),
        Ok(meta) if meta.mode() & 0o077 != 0 => item(
            "state directory",
            Status::Degraded,
            format!("`{}` is mode {:o}: others may read session logs until cordis tightens it to 0700 at start", dir.display(), meta.mode() & 0o7777),
        )
        .fix(format!("`chmod 700 '{}'`", dir.display())),
        Ok(_) => item("state directory", Status::Ok, format!("`{}`, 0700, yours", dir.display())),
    };
    let env = std::env::var(cordis_cli::http::TOKEN_ENV)
        .ok()
        .filter(|t| !t.is_empty());
    let file = dir.join(cordis_cli::http::TOKEN_FILE);
    let token = match env {
        Some(tokens) => item(
            "http token",
            Status::Ok,
            format!(
                "`cordis run --http` would take {} token(s) from {}",
                tokens.split(',').filter(|t| !t.trim().is_empty()).count(),
                cordis_cli::http::TOKEN_ENV
            ),
        ),
        None => item(
            "http token",
            Status::Ok,
            format!(
                "`cordis run --http` would generate a token into `{}` (0600) at start; set {} to choose the tokens yourself",
                file.display(),
                cordis_cli::http::TOKEN_ENV
            ),
        ),
    };
    vec![state, token]
}

pub(crate) fn doctor(
    host: &Host,
    state_dir: Option<PathBuf>,
    format: Format,
) -> anyhow::Result<ExitCode> {
    let (needs, mut items) = needs_of(host);
    items.extend(confinement_items(&needs));
    items.extend(state_items(state_dir.as_deref()));
    let runs = items.iter().all(|i| i.status != Status::Missing);
    if format == Format::Json {
        let report = serde_json::json!({
            "manifest": host.manifest(),
            "runs": runs,
            "checks": items,
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("cordis doctor: `{}`", host.manifest().display());
        for i in &items {
            println!("  {:<10} {:<28} {}", i.status.label(), i.check, i.detail);
            if let Some(fix) = &i.fix {
                println!("  {:<10} {:<28} fix: {fix}", "", "");
            }
        }
        println!(
            "{}",
            if runs {
                "this host can run the composition as configured"
            } else {
                "this host cannot run the composition as configured: fix what is MISSING"
            }
        );
    }
    Ok(if runs {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
