//! One module per `cordis` command: its arguments and what it does.

pub(crate) mod approvals;
pub(crate) mod call;
pub(crate) mod check;
pub(crate) mod doctor;
pub(crate) mod new;
pub(crate) mod plugin;
pub(crate) mod run;
pub(crate) mod schema;
pub(crate) mod services;
pub(crate) mod session;
pub(crate) mod tools;

/// How a command prints what it found: for people, or for scripts.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Format {
    Human,
    Json,
}
