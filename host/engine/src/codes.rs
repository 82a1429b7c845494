//! Error codes the registry produces while an entry is applied or an isolated entry is
//! called (the `code` of a [`cordis_sdk::Error`]). The SDK's own codes are [`cordis_sdk::codes`], those of the host
//! services [`cordis_sdk::host::codes`].

cordis_sdk::error_codes! {
    /// A plugin provided a service its metadata does not declare.
    UNDECLARED_SERVICE;
    /// A plugin provided a service that is already provided.
    DUPLICATE_SERVICE;
    /// A plugin registered a tool whose name another entry has already registered.
    DUPLICATE_TOOL;
    /// An isolated entry's process died during the call (the signal or exit status is
    /// named); the call did not complete and the entry restarts on its own.
    PLUGIN_CRASHED;
    /// An isolated entry did not answer within its `callTimeout`; its process was killed
    /// and the entry restarts on its own.
    PLUGIN_TIMEOUT;
    /// An isolated entry failed to start again several times in a row and is left stopped
    /// until its library or config changes.
    PLUGIN_STOPPED;
    /// A call to an isolated entry was cancelled and the entry did not stop within the
    /// grace period; its process was killed and restarts.
    PLUGIN_CANCELLED;
}

/// A diagnostic and a runtime code that name one problem: `cordis check` finds it in
/// `cordis.yml`, a plugin or the host meets it at run time.
pub const SAME_PROBLEM: &[(&crate::diag::Code, &str)] = &[
    (
        crate::diag::MISSING_SERVICE,
        cordis_sdk::codes::MISSING_SERVICE,
    ),
    (
        crate::diag::INTERFACE_MISMATCH,
        cordis_sdk::codes::INTERFACE_MISMATCH,
    ),
    (crate::diag::DUPLICATE_PROVIDER, DUPLICATE_SERVICE),
];
