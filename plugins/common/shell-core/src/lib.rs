//! The command runner both `shell` backends share, so the logic cannot drift between them.
//!
//! [`run`] executes `bash -c <command>` under a per-command supervisor process, with stdin
//! from `/dev/null`, no inherited file descriptor beyond 0, 1 and 2, and the environment
//! an [`EnvPolicy`] builds from the host's. Stdout and stderr are drained concurrently;
//! each keeps at most the output limit while the pipe keeps draining, so the child never
//! blocks on a full pipe. Nothing a command starts outlives its call: on exit, timeout,
//! cancellation or the host's death the supervisor kills every process it started (a pid
//! namespace when confined, a child subreaper otherwise).
//!
//! [`confine`] holds the kernel confinement `dsh-bash-sandbox` adds: namespaces with a
//! read-only `/` in which only [`dsh_sandbox::writable_roots`] are writable, no network,
//! no capabilities, Landlock and a seccomp filter, entered by the command's own processes
//! between fork and exec, so no host thread is ever confined.

mod child;
pub mod confine;
pub mod env;
mod limits;
pub mod probe;
pub mod proxy;
mod run;
mod syscalls;

pub use child::Stage;
pub use confine::{flag_denial, granted_write_roots, ConfineError, Confinement, PINNED_ABI};
pub use env::EnvPolicy;
pub use run::{run, run_with, Network, RunError};
