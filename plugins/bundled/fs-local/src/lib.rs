//! The unconfined local `fs` backend: provides the `fs` service on the local disk. Reads,
//! atomic writes (temp file + fsync + rename) and edits in a per-path critical section;
//! the per-call sandbox policy is ignored and `sandbox_mode()` is `None`.

use std::path::PathBuf;

use cordis_sdk::prelude::*;
use dsh_fs_api::{
    EditText, Edited, FileSystem, FsClient, Lines, ListDir, Listing, ReadLines, Stat, WriteText,
    Written, FS,
};
use dsh_fs_core::{Parents, PathLocks, ReadDeny, Target};
use dsh_sandbox::SandboxMode;

/// The config under `config:` in `cordis.yml`: this backend takes none.
#[derive(Deserialize, JsonSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct Config {}

#[derive(Default)]
struct LocalFs {
    locks: PathLocks,
}

impl FileSystem for LocalFs {
    fn resolve(&self, path: PathBuf) -> Result<PathBuf> {
        dsh_fs_core::resolve(&path)
    }

    fn stat(&self, path: PathBuf) -> Result<Stat> {
        dsh_fs_core::stat(&path)
    }

    fn read_text(&self, path: PathBuf) -> Result<String> {
        dsh_fs_core::read_text(&path, &ReadDeny::default())
    }

    fn read_lines(&self, args: ReadLines) -> Result<Lines> {
        dsh_fs_core::read_lines(&args, &ReadDeny::default())
    }

    fn list_dir(&self, args: ListDir) -> Result<Listing> {
        dsh_fs_core::list_dir(&args, &ReadDeny::default())
    }

    fn write_text(&self, args: WriteText) -> Result<Written> {
        let target = Target::ambient(&dsh_fs_core::resolve(&args.path)?, Parents::Create)?;
        self.locks
            .with(target.path(), || target.write(args.content.as_bytes()))
    }

    fn edit_text(&self, args: EditText) -> Result<Edited> {
        let target = Target::ambient(&dsh_fs_core::resolve(&args.path)?, Parents::Existing)?;
        self.locks.with(target.path(), || {
            target.edit(&args.old_string, &args.new_string, args.replace_all)
        })
    }

    fn sandbox_mode(&self, _unit: ()) -> Result<Option<SandboxMode>> {
        Ok(None)
    }
}

/// The plugin.
pub struct FsLocalPlugin;

impl Plugin for FsLocalPlugin {
    type Config = Config;

    fn metadata() -> Metadata {
        Metadata::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION"))
            .description("the unconfined local filesystem backend")
            .needs(cordis_sdk::Need::WriteFiles)
            .provides::<FsClient>(FS)
    }

    fn apply(ctx: &mut Context<'_>, _config: Config) -> Result<Self> {
        ctx.provide(FS, FsClient::serve(LocalFs::default()))?;
        tracing::debug!(entry = %ctx.entry_id(), "local fs ready");
        Ok(FsLocalPlugin)
    }
}

cordis_sdk::export_plugin!(FsLocalPlugin);
