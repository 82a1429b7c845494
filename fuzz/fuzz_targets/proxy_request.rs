//! Fuzz target `proxy_request`: what a confined command sends the network proxy → the
//! request head as the proxy reads it (`dsh_shell_core::proxy::parse_request`) → the host
//! it names (`Host::parse`) → the allowlist's decision and, for an address, the check
//! after resolution; and the same bytes, split at newlines, as allowlist rules
//! (`Rules::compile`), which must refuse or compile without a panic.

#![no_main]

use std::net::IpAddr;

use dsh_sandbox::egress::{Egress, Host, Rules};
use dsh_shell_core::proxy::parse_request;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let rules = Rules::compile(
        &Egress {
            allow: vec!["*.example.org".into(), "example.com:443".into(), "10.0.0.0/8".into()],
            deny: vec!["evil.example.org".into(), "10.9.0.0/16".into()],
            allow_private: vec!["10.0.0.0/8".into()],
            ..Egress::default()
        },
        &["approved.test:80".into()],
    )
    .expect("the fixed rules compile");
    if let Ok(request) = parse_request(data) {
        assert!(request.port != 0, "a request names port 0: {request:?}");
        if let Some(host) = Host::parse(&request.host) {
            let _ = rules.decide(&host, request.port);
            if let Host::Ip(ip) = host {
                let _ = rules.check_address(ip, request.port);
            }
        }
        if let Some(forward) = &request.forward {
            assert!(forward.ends_with(b"Connection: close\r\n\r\n"));
        }
    }
    let text = String::from_utf8_lossy(data);
    let entries: Vec<String> = text.lines().map(str::to_string).collect();
    let egress = Egress {
        allow: entries.clone(),
        deny: entries.clone(),
        allow_private: entries.clone(),
        ..Egress::default()
    };
    if let Ok(compiled) = Rules::compile(&egress, &entries) {
        for entry in &entries {
            if let Some(host) = Host::parse(entry) {
                let _ = compiled.decide(&host, 443);
            }
            if let Ok(ip) = entry.parse::<IpAddr>() {
                let _ = compiled.check_address(ip, 443);
            }
        }
    }
});
