//! The network allowlist of confined commands: which hosts a command may reach through the
//! proxy the shell backend runs for it, as the policy owner configures it (`network:` as a
//! map) and every enforcing family reads it. The rules are data ([`Egress`]); [`Rules`]
//! compiles them once and answers the two questions the proxy asks: may this host and port
//! be asked for ([`Rules::decide`]), and may this resolved address be connected to
//! ([`Rules::check_address`], after resolution, so a name that resolves to a denied
//! address is refused whatever the name).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use ipnet::IpNet;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The port the proxy listens on inside a command's network namespace (its own loopback).
pub const PROXY_PORT: u16 = 3128;

/// The proxy's URL as a confined command sees it.
pub const PROXY_URL: &str = "http://127.0.0.1:3128";

/// The variables that point a command's tools at the proxy (both spellings: curl reads
/// the lowercase `http_proxy` only, most others either).
pub const PROXY_VARIABLES: [&str; 6] = [
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
];

/// The hosts a command reaches on its own loopback without the proxy (`NO_PROXY`).
pub const NO_PROXY: &str = "localhost,127.0.0.1,::1";

/// The session event that records a host a person approved for the rest of the session
/// (`{"host": …, "port": …}`), replayed by the policy owner like mode switches.
pub const APPROVED_HOST_EVENT: &str = "sandbox/network-approved";

/// The session event that records the proxy's decisions during one command
/// (`{"connections": [Connection, …]}`).
pub const CONNECTIONS_EVENT: &str = "sandbox/network";

/// The methods `limited` lets through (plain HTTP only).
pub const LIMITED_METHODS: [&str; 3] = ["GET", "HEAD", "OPTIONS"];

/// The network allowlist, as configured under the policy owner's `network:` (a map).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Egress {
    /// Hosts a command may reach: `example.com` (that name only), `*.example.com` (any
    /// name beneath it, not the name itself), `*` (any name), an IP address, or a CIDR;
    /// each optionally with `:port` (`[v6]:port` for IPv6). Default none.
    #[serde(default)]
    pub allow: Vec<String>,
    /// The same forms, refused even where `allow` lists them (deny wins). An IP address
    /// or CIDR here also refuses every name that resolves into it.
    #[serde(default)]
    pub deny: Vec<String>,
    /// Boolean; default `false`. Whether a host `allow` does not list is put to a person
    /// (the host's approval flow, naming the host and port) instead of refused; an
    /// approval lasts for the session.
    #[serde(default)]
    pub ask: bool,
    /// Boolean; default `false`. Plain HTTP only with `GET`, `HEAD` and `OPTIONS` (no
    /// request body); `CONNECT` (so HTTPS) is refused, since a method cannot be seen
    /// inside TLS.
    #[serde(default)]
    pub limited: bool,
    /// CIDRs (or addresses) that may be reached although private, loopback, link-local or
    /// otherwise not public; default none, so no name reaches the cloud metadata service,
    /// the host's own services or the local network.
    #[serde(default)]
    pub allow_private: Vec<String>,
    /// The DNS server the proxy asks (`IP` or `IP:port`, port 53 by default); default the
    /// system's resolver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolver: Option<String>,
}

/// One decision of the proxy, as the session log and `cordis session show` keep it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Connection {
    /// The host asked for, as the command named it.
    pub host: String,
    /// The port.
    pub port: u16,
    /// `CONNECT` or the plain-HTTP method.
    pub method: String,
    /// Whether it was let through.
    pub allowed: bool,
    /// The rule that decided, in words (`allow *.example.com`, `deny 10.0.0.0/8`, …).
    pub rule: String,
    /// Bytes from the command to the host.
    pub sent: u64,
    /// Bytes from the host to the command.
    pub received: u64,
    /// How long the connection lasted, in milliseconds.
    pub millis: u64,
}

/// A rule that does not parse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadRule {
    /// The key (`network.allow`, …).
    pub key: &'static str,
    /// The entry as written.
    pub entry: String,
    /// What is wrong with it.
    pub why: String,
}

impl fmt::Display for BadRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}`: `{}` {}", self.key, self.entry, self.why)
    }
}

impl std::error::Error for BadRule {}

impl BadRule {
    /// What to write instead.
    pub fn help(&self) -> &'static str {
        match self.key {
            "network.allowPrivate" => "write a CIDR (`10.1.0.0/16`, `fd00::/8`) or an address",
            "network.resolver" => "write the DNS server as `IP` or `IP:port` (`127.0.0.1:5353`)",
            _ => "write a host name (`example.com`), `*.example.com`, `*`, an IP address or a CIDR, optionally with `:port`",
        }
    }
}

/// What a rule names.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Target {
    /// Every name.
    Any,
    /// This name exactly (lowercase, no trailing dot).
    Name(String),
    /// Every name strictly beneath this one (`*.example.com` holds `.example.com`).
    Beneath(String),
    /// Addresses in this network (an address is a /32 or /128).
    Net(IpNet),
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Rule {
    written: String,
    target: Target,
    port: Option<u16>,
}

impl Rule {
    fn parse(key: &'static str, entry: &str) -> Result<Rule, BadRule> {
        let bad = |why: &str| BadRule {
            key,
            entry: entry.to_string(),
            why: why.to_string(),
        };
        let text = entry.trim();
        if text.is_empty() {
            return Err(bad("is empty"));
        }
        // `[v6]:port`, `[v6]`, `v6`, `v6/len`, `v4/len:port` is not a thing: CIDRs take no port.
        let (host, port) = if let Some(rest) = text.strip_prefix('[') {
            let (inner, after) = rest
                .split_once(']')
                .ok_or_else(|| bad("opens `[` without closing it"))?;
            let port = match after {
                "" => None,
                p => Some(
                    parse_port(
                        p.strip_prefix(':')
                            .ok_or_else(|| bad("has something other than `:port` after `]`"))?,
                    )
                    .ok_or_else(|| bad("has a port that is not a number from 1 to 65535"))?,
                ),
            };
            (inner, port)
        } else if text.matches(':').count() == 1 {
            let (h, p) = text.split_once(':').expect("one colon");
            let port = parse_port(p)
                .ok_or_else(|| bad("has a port that is not a number from 1 to 65535"))?;
            (h, Some(port))
        } else {
            (text, None)
        };
        let target = if host == "*" {
            Target::Any
        } else if let Ok(net) = host.parse::<IpNet>() {
            Target::Net(net.trunc())
        } else if let Ok(ip) = host.parse::<IpAddr>() {
            Target::Net(IpNet::from(ip))
        } else if let Some(domain) = host.strip_prefix("*.") {
            Target::Beneath(format!(
                ".{}",
                valid_name(domain).ok_or_else(|| bad(NOT_A_NAME))?
            ))
        } else {
            Target::Name(valid_name(host).ok_or_else(|| bad(NOT_A_NAME))?)
        };
        Ok(Rule {
            written: text.to_string(),
            target,
            port,
        })
    }

    fn port_matches(&self, port: u16) -> bool {
        self.port.is_none_or(|p| p == port)
    }

    /// Whether the rule names `host` (a normalised name or an address literal).
    fn names(&self, host: &Host) -> bool {
        match (&self.target, host) {
            (Target::Any, Host::Name(_)) => true,
            (Target::Name(n), Host::Name(h)) => n == h,
            (Target::Beneath(suffix), Host::Name(h)) => h.ends_with(suffix.as_str()),
            (Target::Net(net), Host::Ip(ip)) => net.contains(ip),
            _ => false,
        }
    }
}

const NOT_A_NAME: &str =
    "is not a host name, `*.name`, `*`, an IP address or a CIDR (optionally with `:port`)";

fn parse_port(text: &str) -> Option<u16> {
    text.parse::<u16>().ok().filter(|p| *p != 0)
}

/// `name` lowercased without a trailing dot, if it is a valid DNS name (letters, digits,
/// `-` and `_`, labels of 1 to 63 characters, at most 253 in all).
fn valid_name(name: &str) -> Option<String> {
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    ok.then_some(name)
}

/// A destination as the command named it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Host {
    /// A DNS name, lowercased, without a trailing dot.
    Name(String),
    /// An address literal.
    Ip(IpAddr),
}

impl Host {
    /// The destination `text` names (`example.com`, `10.0.0.1`, `[::1]` or `::1`); `None`
    /// when it is neither a valid name nor an address.
    pub fn parse(text: &str) -> Option<Host> {
        let bare = text
            .strip_prefix('[')
            .and_then(|t| t.strip_suffix(']'))
            .unwrap_or(text);
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return Some(Host::Ip(ip));
        }
        valid_name(text).map(Host::Name)
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
            Host::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// What the rules say about a host and port, before any name is resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// A rule of `allow` (or a person's approval) names it; the text says which.
    Allowed(String),
    /// A rule of `deny` names it (deny wins); the text says which.
    Denied(String),
    /// No rule names it: refused, or put to a person with `ask`.
    Unlisted,
}

/// Address ranges no name reaches unless `allowPrivate` lists them: what is not the public
/// internet (the host itself, the local network, the cloud metadata service).
const NOT_PUBLIC: [(&str, &str); 16] = [
    ("0.0.0.0/8", "\"this\" network"),
    ("10.0.0.0/8", "private"),
    (
        "100.64.0.0/10",
        "shared (carrier-grade NAT, some clouds' metadata service)",
    ),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local (the cloud metadata service)"),
    ("172.16.0.0/12", "private"),
    ("192.0.0.0/24", "IETF protocol assignments"),
    ("192.168.0.0/16", "private"),
    ("198.18.0.0/15", "benchmarking"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved"),
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    ("fc00::/7", "unique local (private)"),
    ("fe80::/10", "link-local"),
    ("ff00::/8", "multicast"),
];

/// The address an IPv6 address stands for when it embeds an IPv4 one (`::ffff:a.b.c.d`,
/// NAT64's `64:ff9b::a.b.c.d`): the check applies to the IPv4 address it reaches.
fn effective(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return IpAddr::V4(v4);
            }
            let s = v6.segments();
            if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                let o = v6.octets();
                return IpAddr::V4(Ipv4Addr::new(o[12], o[13], o[14], o[15]));
            }
            IpAddr::V6(v6)
        }
        v4 => v4,
    }
}

/// The network allowlist, compiled.
#[derive(Clone, Debug)]
pub struct Rules {
    allow: Vec<Rule>,
    deny: Vec<Rule>,
    approved: Vec<Rule>,
    allow_private: Vec<IpNet>,
    not_public: Vec<(IpNet, &'static str)>,
    /// Whether an unlisted host is put to a person.
    pub ask: bool,
    /// Whether only plain HTTP `GET`, `HEAD` and `OPTIONS` pass.
    pub limited: bool,
    /// The DNS server to ask; `None`: the system's resolver.
    pub resolver: Option<SocketAddr>,
}

impl Rules {
    /// Compiles `egress` plus the hosts a person approved in this session
    /// (`host:port`, as [`Connection`] names them).
    pub fn compile(egress: &Egress, approved: &[String]) -> Result<Rules, BadRule> {
        let rules = |key, entries: &[String]| {
            entries
                .iter()
                .map(|e| Rule::parse(key, e))
                .collect::<Result<Vec<_>, _>>()
        };
        let allow_private = egress
            .allow_private
            .iter()
            .map(|e| {
                let t = e.trim();
                t.parse::<IpNet>()
                    .map(|n| n.trunc())
                    .or_else(|_| t.parse::<IpAddr>().map(IpNet::from))
                    .map_err(|_| BadRule {
                        key: "network.allowPrivate",
                        entry: e.clone(),
                        why: "is not a CIDR or an IP address".to_string(),
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let resolver = egress
            .resolver
            .as_deref()
            .map(|r| {
                let t = r.trim();
                t.parse::<SocketAddr>()
                    .or_else(|_| t.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, 53)))
                    .map_err(|_| BadRule {
                        key: "network.resolver",
                        entry: r.to_string(),
                        why: "is not an IP address with an optional port".to_string(),
                    })
            })
            .transpose()?;
        Ok(Rules {
            allow: rules("network.allow", &egress.allow)?,
            deny: rules("network.deny", &egress.deny)?,
            approved: rules("approved host", approved)?,
            allow_private,
            not_public: NOT_PUBLIC
                .iter()
                .map(|(net, why)| (net.parse().expect("a valid CIDR"), *why))
                .collect(),
            ask: egress.ask,
            limited: egress.limited,
            resolver,
        })
    }

    /// What the rules say about `host` and `port` before resolution: deny wins over allow,
    /// then a person's approval, then `Unlisted`.
    pub fn decide(&self, host: &Host, port: u16) -> Verdict {
        let find = |rules: &[Rule]| {
            rules
                .iter()
                .find(|r| r.port_matches(port) && r.names(host))
                .map(|r| r.written.clone())
        };
        if let Some(rule) = find(&self.deny) {
            return Verdict::Denied(format!("deny {rule}"));
        }
        if let Some(rule) = find(&self.allow) {
            return Verdict::Allowed(format!("allow {rule}"));
        }
        if let Some(rule) = find(&self.approved) {
            return Verdict::Allowed(format!("approved {rule} for this session"));
        }
        Verdict::Unlisted
    }

    /// Whether the proxy may connect to `addr` (an address a name resolved to, or the
    /// literal the command named) for `port`: not in a `deny` network, and public unless
    /// `allowPrivate` lists it. `Err` names the rule.
    pub fn check_address(&self, addr: IpAddr, port: u16) -> Result<(), String> {
        let seen = effective(addr);
        for rule in &self.deny {
            if let Target::Net(net) = &rule.target {
                if rule.port_matches(port) && (net.contains(&seen) || net.contains(&addr)) {
                    return Err(format!("deny {} (the address is {addr})", rule.written));
                }
            }
        }
        if let Some((net, why)) = self.not_public.iter().find(|(n, _)| n.contains(&seen)) {
            if !self.allow_private.iter().any(|n| n.contains(&seen)) {
                return Err(format!(
                    "the address {addr} is {why} ({net}); list it in `allowPrivate` to reach it"
                ));
            }
        }
        Ok(())
    }

    /// The model-facing sentence: how commands reach the network and which hosts.
    pub fn describe(egress: &Egress) -> String {
        let list = |entries: &[String]| {
            entries
                .iter()
                .map(|e| format!("`{e}`"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut text = format!(
            "Sandboxed commands reach the network only through the proxy at {PROXY_URL} (HTTP_PROXY, HTTPS_PROXY and ALL_PROXY are set; tools that ignore them reach nothing), and only these hosts: {}.",
            if egress.allow.is_empty() {
                "none".to_string()
            } else {
                list(&egress.allow)
            }
        );
        if !egress.deny.is_empty() {
            text.push_str(&format!(" Always refused: {}.", list(&egress.deny)));
        }
        text.push_str(if egress.ask {
            " Another host is put to the user for approval when a command first asks for it."
        } else {
            " Another host is refused with `403` naming the rule."
        });
        if egress.limited {
            text.push_str(
                " Only plain-HTTP GET, HEAD and OPTIONS requests pass (no HTTPS, no uploads).",
            );
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(allow: &[&str], deny: &[&str], private: &[&str]) -> Rules {
        let own = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
        Rules::compile(
            &Egress {
                allow: own(allow),
                deny: own(deny),
                allow_private: own(private),
                ..Egress::default()
            },
            &[],
        )
        .unwrap()
    }

    fn host(text: &str) -> Host {
        Host::parse(text).unwrap()
    }

    #[test]
    fn names_wildcards_ports_and_deny_winning() {
        let r = rules(
            &[
                "crates.io",
                "*.crates.io",
                "example.org:443",
                "*",
                "10.1.2.3",
            ],
            &["evil.crates.io", "*.internal", "example.org:80"],
            &[],
        );
        let allowed = |h: &str, p| matches!(r.decide(&host(h), p), Verdict::Allowed(_));
        assert_eq!(
            r.decide(&host("Static.Crates.IO."), 443),
            Verdict::Allowed("allow *.crates.io".into())
        );
        assert_eq!(
            r.decide(&host("crates.io"), 443),
            Verdict::Allowed("allow crates.io".into())
        );
        assert_eq!(
            r.decide(&host("evil.crates.io"), 443),
            Verdict::Denied("deny evil.crates.io".into())
        );
        assert_eq!(
            r.decide(&host("a.b.internal"), 1),
            Verdict::Denied("deny *.internal".into())
        );
        // `*.internal` is strictly beneath: the name itself falls to `*`.
        assert!(allowed("internal", 1));
        assert_eq!(
            r.decide(&host("example.org"), 80),
            Verdict::Denied("deny example.org:80".into())
        );
        assert!(allowed("10.1.2.3", 22));
        // `*` is every name, not every address.
        assert_eq!(r.decide(&host("10.9.9.9"), 80), Verdict::Unlisted);
        let strict = rules(&["example.org:443"], &[], &[]);
        assert_eq!(strict.decide(&host("example.org"), 80), Verdict::Unlisted);
        assert_eq!(
            strict.decide(&host("notexample.org"), 443),
            Verdict::Unlisted
        );
        assert_eq!(
            strict.decide(&host("x.example.org"), 443),
            Verdict::Unlisted
        );
    }

    #[test]
    fn addresses_are_checked_after_resolution() {
        let r = rules(&["*"], &["203.0.113.0/24"], &["127.0.0.2", "10.5.0.0/16"]);
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(r.check_address(ip("93.184.216.34"), 443).is_ok());
        assert!(r
            .check_address(ip("203.0.113.9"), 443)
            .unwrap_err()
            .starts_with("deny 203.0.113.0/24"));
        for private in [
            "127.0.0.1",
            "169.254.169.254",
            "10.0.0.1",
            "192.168.1.1",
            "100.100.100.200",
            "::1",
            "fe80::1",
            "fd00:ec2::254",
            "::ffff:169.254.169.254",
            "64:ff9b::7f00:1",
            "0.0.0.0",
        ] {
            let why = r.check_address(ip(private), 80).unwrap_err();
            assert!(why.contains("allowPrivate"), "{private}: {why}");
        }
        assert!(r.check_address(ip("127.0.0.2"), 80).is_ok());
        assert!(r.check_address(ip("::ffff:127.0.0.2"), 80).is_ok());
        assert!(r.check_address(ip("10.5.3.3"), 80).is_ok());
        assert!(r.check_address(ip("10.6.3.3"), 80).is_err());
    }

    #[test]
    fn approvals_allow_after_deny_and_allow() {
        let r = Rules::compile(
            &Egress {
                deny: vec!["blocked.test".into()],
                ask: true,
                ..Egress::default()
            },
            &["pypi.org:443".into(), "blocked.test:443".into()],
        )
        .unwrap();
        assert_eq!(
            r.decide(&host("pypi.org"), 443),
            Verdict::Allowed("approved pypi.org:443 for this session".into())
        );
        assert_eq!(r.decide(&host("pypi.org"), 80), Verdict::Unlisted);
        assert!(matches!(
            r.decide(&host("blocked.test"), 443),
            Verdict::Denied(_)
        ));
    }

    #[test]
    fn the_model_is_told_which_hosts_and_how() {
        let policy = crate::SandboxExecutionPolicy {
            egress: Some(Egress {
                allow: vec!["pypi.org".into(), "*.crates.io".into()],
                deny: vec!["evil.crates.io".into()],
                ask: true,
                limited: true,
                ..Egress::default()
            }),
            approved_hosts: vec!["example.org:443".into()],
            ..Default::default()
        };
        let text = crate::policy_text(&policy);
        expect_test::expect![[r#"Current DSH file policy: read-only. Any available operation enforced by the DSH file sandbox cannot modify files in the standing mode. Do not refuse a required modification from this policy alone: try an available tool normally and follow any denial and escalation guidance it returns. Sandboxed commands reach the network only through the proxy at http://127.0.0.1:3128 (HTTP_PROXY, HTTPS_PROXY and ALL_PROXY are set; tools that ignore them reach nothing), and only these hosts: `pypi.org`, `*.crates.io`. Always refused: `evil.crates.io`. Another host is put to the user for approval when a command first asks for it. Only plain-HTTP GET, HEAD and OPTIONS requests pass (no HTTPS, no uploads). Approved for this session: `example.org:443`."#]].assert_eq(&text);
    }

    #[test]
    fn the_model_is_told_the_landlock_only_tier() {
        let policy = crate::SandboxExecutionPolicy {
            confinement: crate::ConfinementTier::LandlockOnly,
            ..Default::default()
        };
        let text = crate::policy_text(&policy);
        assert!(
            text.ends_with("Sandboxed commands run in the `landlock-only` tier: Landlock and seccomp without namespaces, so they see the host's processes and cannot list directories above a path they may not read."),
            "{text}"
        );
        let full = crate::policy_text(&crate::SandboxExecutionPolicy::default());
        assert!(!full.contains("landlock-only"), "{full}");
    }

    #[test]
    fn malformed_rules_name_the_key_and_the_entry() {
        let bad = |egress: Egress| Rules::compile(&egress, &[]).unwrap_err().to_string();
        let allow = |e: &str| Egress {
            allow: vec![e.into()],
            ..Egress::default()
        };
        for (entry, why) in [
            ("exa mple.com", "is not a host name"),
            ("example.com:0", "port"),
            ("example.com:http", "port"),
            ("*.", "is not a host name"),
            ("a.*.com", "is not a host name"),
            ("[::1", "opens `[`"),
            ("", "is empty"),
        ] {
            let text = bad(allow(entry));
            assert!(
                text.starts_with(&format!("`network.allow`: `{entry}`")) && text.contains(why),
                "{entry}: {text}"
            );
        }
        let text = bad(Egress {
            allow_private: vec!["10.0.0.0/33".into()],
            ..Egress::default()
        });
        assert!(text.starts_with("`network.allowPrivate`"), "{text}");
        let text = bad(Egress {
            resolver: Some("dns.example".into()),
            ..Egress::default()
        });
        assert!(text.starts_with("`network.resolver`"), "{text}");
        // The forms that do parse.
        for entry in [
            "[::1]:443",
            "::1",
            "10.0.0.0/8",
            "*",
            "*.x.y:8080",
            "a_b.example",
        ] {
            Rules::compile(&allow(entry), &[]).unwrap();
        }
    }
}
