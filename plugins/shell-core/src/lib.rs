//! The command runner both `shell` backends share, so the logic cannot drift between them.
//!
//! [`run`] executes `bash -c <command>` in its own session and process group, with stdin
//! from `/dev/null` and no inherited file descriptor beyond 0, 1 and 2. Stdout and stderr
//! are drained concurrently; each keeps at most the output limit while the pipe keeps
//! draining, so the child never blocks on a full pipe. On timeout the WHOLE process group
//! is killed.
//!
//! [`confine`] holds the kernel confinement `dsh-bash-sandbox` adds: a Landlock ruleset
//! with a pinned ABI that grants the write-ish rights only beneath
//! [`dsh_sandbox::writable_roots`] (plus `/dev/null`), applied on a fresh thread that then
//! spawns the command, so no host thread is ever confined.

pub mod confine;
mod run;

pub use confine::{flag_denial, granted_write_roots, ConfineError, Confinement, PINNED_ABI};
pub use run::{run, RunError};
