//! Error codes the registry produces while an entry is applied (the `code` of a
//! [`cordis_sdk::Error`]). The SDK's own codes are [`cordis_sdk::codes`], those of the host
//! services [`cordis_sdk::host::codes`].

cordis_sdk::error_codes! {
    /// A plugin provided a service its metadata does not declare.
    UNDECLARED_SERVICE;
    /// A plugin provided a service that is already provided.
    DUPLICATE_SERVICE;
    /// A plugin registered a tool whose name another entry has already registered.
    DUPLICATE_TOOL;
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
