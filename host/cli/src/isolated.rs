//! The confinement an isolated entry's process applies to itself before it loads its
//! plugin (the host gives it a network namespace of its own and a scrubbed environment
//! when it starts it): no file writes anywhere, no TCP bind or connect, and no signals to or
//! abstract unix sockets of processes outside. Every right it handles must be enforced,
//! or the process does not run.

use landlock::{
    Access, AccessFs, AccessNet, CompatLevel, Compatible, Ruleset, RulesetAttr, RulesetStatus,
    Scope, ABI,
};

/// The Landlock ABI whose write rights are handled (5: truncate and device ioctls).
const PINNED_ABI: ABI = ABI::V5;

/// Forbids every file write of this process and its future threads and children.
pub fn forbid_writes() -> Result<(), String> {
    let status = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_write(PINNED_ABI))
        .map_err(|e| e.to_string())?
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessNet::from_all(PINNED_ABI))
        .map_err(|e| e.to_string())?
        .scope(Scope::Signal | Scope::AbstractUnixSocket)
        .map_err(|e| e.to_string())?
        .create()
        .map_err(|e| e.to_string())?
        .restrict_self()
        .map_err(|e| e.to_string())?;
    match status.ruleset {
        RulesetStatus::NotEnforced => {
            Err("the kernel does not enforce Landlock (needed: ABI 5 or later)".to_string())
        }
        _ => Ok(()),
    }
}
