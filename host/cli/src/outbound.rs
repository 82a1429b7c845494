//! The HTTP client of the host's own requests (an OAuth issuer's metadata and keys, traces
//! to an OTLP collector): `ureq`, blocking, on the threads that make them, with the
//! system's trust store.

use std::time::Duration;

/// A client whose every request ends within `timeout`, verifying TLS with the platform's
/// roots (the system store, `SSL_CERT_FILE`), configured further by `configure`.
pub(crate) fn agent(
    timeout: Duration,
    configure: impl FnOnce(
        ureq::config::ConfigBuilder<ureq::typestate::AgentScope>,
    ) -> ureq::config::ConfigBuilder<ureq::typestate::AgentScope>,
) -> ureq::Agent {
    configure(
        ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            .tls_config(
                ureq::tls::TlsConfig::builder()
                    .root_certs(ureq::tls::RootCerts::PlatformVerifier)
                    .build(),
            ),
    )
    .build()
    .new_agent()
}
