//! `cordis plugin`: install, list, upgrade and remove plugin libraries.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;
use cordis_engine::Host;

use super::Format;

#[derive(Subcommand)]
pub(crate) enum PluginCommand {
    /// Check a plugin library (or build a plugin crate in release and check its library),
    /// copy it into the user plugin directory and print the cordis.yml entry to add.
    Install {
        /// A built library (`lib<name>.so`) or a plugin crate's directory.
        source: PathBuf,
        /// Install here instead [default: $XDG_DATA_HOME/cordis/plugins, else
        /// ~/.local/share/cordis/plugins].
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// List every plugin library on the search path, in search order, with its version,
    /// SDK version, services, tools and file; a file hidden by an earlier one of the same
    /// name is marked shadowed.
    List {
        /// `human` (a table) or `json`.
        #[arg(long, value_enum, default_value_t = Format::Human)]
        format: Format,
    },
    /// Rebuild and reinstall installed plugins from where `install` took them: every one
    /// this cordis cannot load (built against an older SDK release), or the one named.
    Upgrade {
        /// The plugin to rebuild, even if it loads (as in cordis.yml; a scope is ignored).
        name: Option<String>,
        /// Upgrade the plugins installed here instead of the user plugin directory.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Remove a plugin from the user plugin directory.
    Remove {
        /// The plugin's name (as in cordis.yml; a scope is ignored).
        name: String,
        /// Remove from here instead of the user plugin directory.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

/// The directory `cordis plugin install|remove` works in.
pub(crate) fn plugin_dir(flag: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    flag.or_else(|| cordis_engine::user_plugin_dir(|name| std::env::var_os(name)))
        .ok_or_else(|| {
            anyhow::anyhow!(
                "no user plugin directory: neither XDG_DATA_HOME nor HOME is set (absolute); \
                 set one, or pass `--dir DIR`"
            )
        })
}

pub(crate) fn plugin(host: &Host, cmd: PluginCommand) -> anyhow::Result<ExitCode> {
    use cordis_cli::plugins;
    let search = host.search();
    match cmd {
        PluginCommand::Install { source, dir } => {
            let installed = plugins::install(&source, &plugin_dir(dir)?)?;
            plugins::print(&plugins::describe_install(&installed, search));
        }
        PluginCommand::List { format } => {
            let listed = plugins::list(search);
            let text = match format {
                Format::Human => plugins::render_list(search, &listed),
                Format::Json => serde_json::to_string_pretty(&listed)? + "\n",
            };
            plugins::print(&text);
        }
        PluginCommand::Upgrade { name, dir } => {
            let dir = plugin_dir(dir)?;
            let upgraded = plugins::upgrade(name.as_deref(), &dir)?;
            let (text, ok) = plugins::describe_upgrade(&upgraded, &dir);
            plugins::print(&text);
            if !ok {
                return Ok(ExitCode::FAILURE);
            }
        }
        PluginCommand::Remove { name, dir } => {
            let removed = plugins::remove(&name, &plugin_dir(dir)?, search)?;
            let mut text = format!("removed {}\n", removed.path.display());
            if let Some(found) = removed.still_found {
                text += &format!(
                    "note: the search path still finds `{name}` at {}\n",
                    found.display()
                );
            }
            plugins::print(&text);
        }
    }
    Ok(ExitCode::SUCCESS)
}
