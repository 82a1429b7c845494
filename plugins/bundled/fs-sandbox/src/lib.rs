//! The fenced `fs` backend: provides `fs` in place of `dsh-fs-local`, injects
//! `sandboxPolicy`, and fences the mutations (`write_text`, `edit_text`) by the per-call
//! policy or, when a call carries none, the deployment default. Reads pass except a
//! process's own `/proc` entries and, below `danger-full-access`, the policy's `denyRead`.
//!
//! - `read-only`: every mutation is `FS_SANDBOX_DENIED`.
//! - `workspace-write`: the canonical target must lie beneath one of
//!   [`dsh_sandbox::writable_roots`], and the mutation is performed through a handle to that
//!   root with every component resolved beneath it, so a symlink swapped in between the
//!   check and the write cannot escape.
//!   Paths the policy protects (what defines the running composition, `.git/hooks`,
//!   `.git/config`, `protectedPaths`) are refused beneath the roots too.
//! - `danger-full-access`: unfenced.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use cordis_sdk::host::{CallContextClient, CallContextService as _, CALL_CONTEXT};
use cordis_sdk::prelude::*;
use dsh_fs_api::{
    EditText, Edited, FileSystem, FsClient, Lines, ListDir, Listing, ReadLines, Stat, WriteText,
    Written, FS,
};
use dsh_fs_core::{fenced_target, Parents, PathLocks, ReadDeny};
use dsh_sandbox::{
    EnforcedFamily, SandboxExecutionPolicy, SandboxMode, SandboxPolicy, SandboxPolicyClient,
    Shared, SANDBOX_POLICY,
};

/// The config under `config:` in `cordis.yml`: none; the policy comes from `sandboxPolicy`.
#[derive(Deserialize, JsonSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct Config {}

struct FencedFs {
    policy: SandboxPolicyClient,
    calls: CallContextClient,
    locks: PathLocks,
    deny: DenyCache,
}

/// The read fence of the policy last seen, kept while the same policy comes again
/// ([`Shared::ptr_eq`]: the policy owner sends a session's policy again while it stays the
/// same, and this plugin then receives the value it parsed before), so its `denyRead`
/// patterns are not compiled for every read.
#[derive(Default)]
struct DenyCache(Mutex<Option<(Shared<SandboxExecutionPolicy>, Arc<ReadDeny>)>>);

impl DenyCache {
    /// The read fence of `policy`.
    fn of(&self, policy: &Shared<SandboxExecutionPolicy>) -> Arc<ReadDeny> {
        let mut last = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match &*last {
            Some((seen, deny)) if Shared::ptr_eq(seen, policy) => deny.clone(),
            _ => {
                let deny = Arc::new(ReadDeny::of(Some(policy)));
                *last = Some((policy.clone(), deny.clone()));
                deny
            }
        }
    }
}

impl FencedFs {
    /// The policy of this call: the caller's, or resolved here (see
    /// [`dsh_sandbox::policy_for_call`]: a caller in an isolated process is not trusted
    /// with it).
    fn policy_for(
        &self,
        per_call: Option<Shared<SandboxExecutionPolicy>>,
    ) -> Result<Shared<SandboxExecutionPolicy>> {
        let current = self.calls.current(())?;
        dsh_sandbox::policy_for_call(&self.policy, current.as_ref(), per_call).map_err(|e| {
            Error::new(
                e.code.clone(),
                format!(
                    "cannot resolve the sandbox policy of this call: {}",
                    e.message
                ),
            )
            .with_help(
                e.help
                    .clone()
                    .unwrap_or_else(|| "check the `dsh-sandbox-policy` entry in cordis.yml".into()),
            )
        })
    }
}

impl FileSystem for FencedFs {
    fn resolve(&self, path: PathBuf) -> Result<PathBuf> {
        dsh_fs_core::resolve(&path)
    }

    fn stat(&self, path: PathBuf) -> Result<Stat> {
        dsh_fs_core::stat(&path)
    }

    fn read_text(&self, path: PathBuf) -> Result<String> {
        let policy = self.policy_for(None)?;
        dsh_fs_core::read_text(&path, &self.deny.of(&policy))
    }

    fn read_lines(&self, args: ReadLines) -> Result<Lines> {
        let policy = self.policy_for(args.policy.clone())?;
        dsh_fs_core::read_lines(&args, &self.deny.of(&policy))
    }

    fn list_dir(&self, args: ListDir) -> Result<Listing> {
        let policy = self.policy_for(args.policy.clone())?;
        dsh_fs_core::list_dir(&args, &self.deny.of(&policy))
    }

    fn write_text(&self, args: WriteText) -> Result<Written> {
        let policy = self.policy_for(args.policy)?;
        let target = fenced_target(&policy, &args.path, Parents::Create)?;
        self.locks
            .with(target.path(), || target.write(args.content.as_bytes()))
    }

    fn edit_text(&self, args: EditText) -> Result<Edited> {
        let policy = self.policy_for(args.policy)?;
        let target = fenced_target(&policy, &args.path, Parents::Existing)?;
        self.locks.with(target.path(), || {
            target.edit(&args.old_string, &args.new_string, args.replace_all)
        })
    }

    fn sandbox_mode(&self, _unit: ()) -> Result<Option<SandboxMode>> {
        self.policy.default_mode(()).map(Some)
    }
}

/// The plugin.
pub struct FsSandboxPlugin;

impl Plugin for FsSandboxPlugin {
    type Config = Config;

    fn metadata() -> Metadata {
        Metadata::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION"))
            .description("the fenced filesystem backend: writes confined by the sandbox policy")
            .needs(cordis_sdk::Need::WriteFiles)
            .provides::<FsClient>(FS)
            .injects::<SandboxPolicyClient>(SANDBOX_POLICY)
            .injects::<CallContextClient>(CALL_CONTEXT)
    }

    fn apply(ctx: &mut Context<'_>, _config: Config) -> Result<Self> {
        let policy: SandboxPolicyClient = ctx.inject(SANDBOX_POLICY)?;
        let calls: CallContextClient = ctx.inject(CALL_CONTEXT)?;
        let token = policy.register_enforced_family(EnforcedFamily::Filesystem)?;
        let withdraw = policy.clone();
        ctx.on_dispose(move || {
            if let Err(e) = withdraw.unregister_enforced_family(token) {
                tracing::warn!("cannot withdraw the filesystem family from sandboxPolicy: {e}");
            }
        });
        ctx.provide(
            FS,
            FsClient::serve(FencedFs {
                policy,
                calls,
                locks: PathLocks::default(),
                deny: DenyCache::default(),
            }),
        )?;
        tracing::debug!(entry = %ctx.entry_id(), "fenced fs ready");
        Ok(FsSandboxPlugin)
    }
}

cordis_sdk::export_plugin!(FsSandboxPlugin);

#[cfg(test)]
mod tests {
    use super::*;

    /// The kept fence is the one of the policy given: a read that one policy denies is
    /// served under the next, which denies nothing, and denied again when the first comes
    /// back; the same policy again gives the very fence kept.
    #[test]
    fn the_kept_read_fence_is_the_given_policys() {
        let tmp = tempfile::tempdir().expect("a directory");
        let root = tmp.path().canonicalize().expect("canonical");
        let secret = root.join("secret.txt");
        std::fs::write(&secret, "s3cret").expect("a file");
        let policy = |deny_read: Vec<PathBuf>| {
            Shared::new(SandboxExecutionPolicy {
                mode: SandboxMode::WorkspaceWrite,
                workspace_root: root.clone(),
                deny_read,
                ..Default::default()
            })
        };
        let (denying, open) = (policy(vec![secret.clone()]), policy(Vec::new()));
        let cache = DenyCache::default();
        let read = |p: &Shared<SandboxExecutionPolicy>| {
            dsh_fs_core::read_text(&secret, &cache.of(p)).map_err(|e| e.code)
        };
        let denied = Err(dsh_fs_api::codes::FS_SANDBOX_DENIED.to_string());
        assert_eq!(read(&denying), denied);
        assert_eq!(read(&open), Ok("s3cret".to_string()));
        assert_eq!(read(&denying), denied);
        assert!(Arc::ptr_eq(
            &cache.of(&denying),
            &cache.of(&denying.clone())
        ));
    }
}
