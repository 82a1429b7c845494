//! Error codes the host itself produces (the `code` of a [`cordis_sdk::Error`]): those of
//! the `sessions` host service and of the registry while an entry is applied. The SDK's
//! own codes are [`cordis_sdk::codes`].

cordis_sdk::error_codes! {
    /// No session has this id (`cordis session list` shows them).
    SESSION_NOT_FOUND;
    /// A session log could not be read or written (an I/O error or a corrupt line), or the
    /// session's cwd is not a usable directory.
    SESSION_STORE;
    /// A plugin provided a service its metadata does not declare.
    UNDECLARED_SERVICE;
    /// A plugin provided a service that is already provided.
    DUPLICATE_SERVICE;
    /// A plugin registered a tool whose name another entry has already registered.
    DUPLICATE_TOOL;
}
