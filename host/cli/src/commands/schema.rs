//! `cordis schema`: the JSON schemas of `cordis.yml` and of each plugin's config.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use cordis_engine::Host;

#[derive(clap::Args)]
pub(crate) struct SchemaArgs {
    /// Write the files (atomically; stale schema files are removed).
    #[arg(long, conflicts_with = "check")]
    write: bool,
    /// Fail when the files on disk differ from what would be generated.
    #[arg(long)]
    check: bool,
    /// The directory.
    #[arg(long, default_value = "schemas")]
    out: PathBuf,
    /// The plugins to generate for (found in the plugin search path).
    #[arg(required = true)]
    plugins: Vec<String>,
}

pub(crate) fn schema(host: &Host, args: SchemaArgs) -> anyhow::Result<ExitCode> {
    let mut metas = Vec::new();
    for name in &args.plugins {
        let path = host.search().find(name).map_err(|tried| {
            anyhow::anyhow!(
                "no library for plugin `{name}` (looked for {}); build it first",
                tried
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })?;
        let lib = cordis_engine::Library::load(&path)
            .map_err(|e| anyhow::anyhow!("cannot load {}: {e}", path.display()))?;
        metas.push(lib.meta.clone());
    }
    metas.sort_by(|a, b| a.name.cmp(&b.name));
    let files = cordis_engine::generate_schemas(&metas);
    if args.check {
        let stale = cordis_engine::check_schemas(&args.out, &files);
        if stale.is_empty() {
            println!(
                "{}: {} schema files up to date",
                args.out.display(),
                files.len()
            );
            return Ok(ExitCode::SUCCESS);
        }
        for p in &stale {
            eprintln!("error: {} is stale", p.display());
        }
        eprintln!("help: regenerate with `cordis schema --write` (`cargo xtask schema`)");
        return Ok(ExitCode::FAILURE);
    }
    if args.write {
        let written = cordis_engine::write_schemas(&args.out, &files)
            .with_context(|| format!("failed to write {}", args.out.display()))?;
        println!("{}: {} files changed", args.out.display(), written.len());
    } else {
        for (name, text) in &files {
            println!("// {name}\n{text}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
