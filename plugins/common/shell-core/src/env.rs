//! The environment a command gets: built from the host's by a policy in the shell plugins'
//! config (`environment:`), modelled on Codex's `shell_environment_policy`, so secrets in the
//! host's environment do not reach a command unless the operator says so.
//!
//! In order: start from `inherit` (`all`, `core` or `none`); unless `ignoreDefaultExcludes`,
//! drop every name matching [`DEFAULT_EXCLUDES`]; drop names matching `exclude`; if
//! `includeOnly` is not empty, keep only names matching it; then add `set`. Patterns are
//! case-insensitive globs (`*` any run, `?` one character). The caller's per-request
//! variables are added last.

use std::collections::BTreeMap;
use std::ffi::OsString;

use schemars::JsonSchema;
use serde::Deserialize;

/// Names dropped unless `ignoreDefaultExcludes` is set or `includeOnly` names them
/// exactly: secrets by name, and the ssh agent's socket (a key's use, not its bytes).
pub const DEFAULT_EXCLUDES: [&str; 8] = [
    "*KEY*",
    "*SECRET*",
    "*TOKEN*",
    "*PASSWORD*",
    "*PASSWD*",
    "*CREDENTIAL*",
    "*_PAT",
    "SSH_AUTH_SOCK",
];

/// Whether `value` carries a credential in a URL's user information
/// (`postgres://user:pass@db/app`, `https://token@forge/`, a proxy with a login): such a
/// variable is dropped like a secret's name, whatever it is called.
pub fn carries_credentials(value: &str) -> bool {
    value.match_indices("://").any(|(at, sep)| {
        let rest = &value[at + sep.len()..];
        let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
        authority.contains('@')
    })
}

/// The names `inherit: core` keeps (plus every `LC_*`).
pub const CORE_VARS: [&str; 14] = [
    "HOME", "LOGNAME", "PATH", "SHELL", "USER", "USERNAME", "TMPDIR", "TEMP", "TMP", "LANG",
    "LANGUAGE", "TERM", "TZ", "PWD",
];

/// Where the environment starts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Inherit {
    /// The host's whole environment.
    #[default]
    All,
    /// Only [`CORE_VARS`] and `LC_*`.
    Core,
    /// Nothing.
    None,
}

/// The `environment:` config of both shell plugins.
#[derive(Clone, Debug, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EnvPolicy {
    /// `all` (default), `core` (HOME, PATH, USER, LANG, LC_*, TERM, SHELL, TMPDIR, …) or
    /// `none`.
    #[serde(default)]
    pub inherit: Inherit,
    /// Keep names matching `*KEY*`, `*SECRET*`, `*TOKEN*`, `*PASSWORD*`, `*PASSWD*`,
    /// `*CREDENTIAL*`, `*_PAT` and `SSH_AUTH_SOCK`, and values holding a URL with a login
    /// (`scheme://user:pass@host`), which are dropped by default (names
    /// case-insensitively). One such variable is kept by naming it in `includeOnly`.
    #[serde(default)]
    pub ignore_default_excludes: bool,
    /// More names to drop (case-insensitive globs).
    #[serde(default)]
    pub exclude: Vec<String>,
    /// If not empty, keep only names matching one of these globs (before `set`).
    #[serde(default)]
    pub include_only: Vec<String>,
    /// Variables to set, after everything else.
    #[serde(default)]
    pub set: BTreeMap<String, String>,
}

impl EnvPolicy {
    /// The environment for one command, from the host's `vars`.
    pub fn apply(
        &self,
        vars: impl IntoIterator<Item = (OsString, OsString)>,
    ) -> Vec<(OsString, OsString)> {
        let mut out: Vec<(OsString, OsString)> = vars
            .into_iter()
            .filter(|(name, value)| {
                let name = name.to_string_lossy();
                let inherited = match self.inherit {
                    Inherit::All => true,
                    Inherit::Core => CORE_VARS.contains(&name.as_ref()) || name.starts_with("LC_"),
                    Inherit::None => false,
                };
                // Named in `includeOnly` without a wildcard: the operator asked for it.
                let named = self
                    .include_only
                    .iter()
                    .any(|p| !p.contains(['*', '?']) && p.eq_ignore_ascii_case(&name));
                let secret = DEFAULT_EXCLUDES.iter().any(|p| glob_match(p, &name))
                    || carries_credentials(&value.to_string_lossy());
                inherited
                    && (self.ignore_default_excludes || named || !secret)
                    && !self.exclude.iter().any(|p| glob_match(p, &name))
                    && (self.include_only.is_empty()
                        || self.include_only.iter().any(|p| glob_match(p, &name)))
            })
            .collect();
        for (name, value) in &self.set {
            out.retain(|(n, _)| n != name.as_str());
            out.push((name.into(), value.into()));
        }
        out
    }

    /// One line for logs and the model: what the policy passes on.
    pub fn describe(&self) -> String {
        let inherit = match self.inherit {
            Inherit::All => "the host's environment",
            Inherit::Core => "the host's core variables (HOME, PATH, USER, LANG, LC_*, TERM, …)",
            Inherit::None => "no host variables",
        };
        let mut text = format!("Commands get {inherit}");
        if !self.ignore_default_excludes {
            text.push_str(", without names containing KEY, SECRET, TOKEN, PASSWORD, PASSWD or CREDENTIAL or ending in _PAT, without SSH_AUTH_SOCK, and without values holding a URL with a login");
        }
        if !self.exclude.is_empty() {
            text.push_str(&format!(", without {}", self.exclude.join(", ")));
        }
        if !self.include_only.is_empty() {
            text.push_str(&format!(", only {}", self.include_only.join(", ")));
        }
        if !self.set.is_empty() {
            let names: Vec<&str> = self.set.keys().map(String::as_str).collect();
            text.push_str(&format!(", with {} set", names.join(", ")));
        }
        text.push('.');
        text
    }
}

/// The registry name of the shell's model-context contribution: what environment commands
/// get, so the model knows why a variable it expects is absent.
pub const ENVIRONMENT_CONTEXT: &str = "shell:environment";

/// The `shell:environment` contribution of both shell plugins.
pub struct EnvironmentContext(pub EnvPolicy);

impl cordis_sdk::host::ModelContext for EnvironmentContext {
    fn context(&self, _session: Option<String>) -> cordis_sdk::Result<String> {
        Ok(self.0.describe())
    }
}

/// Case-insensitive glob: `*` matches any run of characters, `?` exactly one.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().flat_map(char::to_uppercase).collect();
    let n: Vec<char> = name.chars().flat_map(char::to_uppercase).collect();
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ni));
            pi += 1;
        } else if let Some((sp, sn)) = star {
            pi = sp + 1;
            ni = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host() -> Vec<(OsString, OsString)> {
        [
            ("PATH", "/bin"),
            ("HOME", "/home/a"),
            ("LC_ALL", "C"),
            ("OPENAI_API_KEY", "sk"),
            ("GITHUB_TOKEN", "gh"),
            ("AWS_SECRET_ACCESS_KEY", "aws"),
            ("db_password", "pw"),
            ("MY_CREDENTIALS", "c"),
            ("EDITOR", "vi"),
            ("DATABASE_URL", "postgres://app:hunter2@db:5432/app"),
            ("GITHUB_PAT", "ghp"),
            ("LDAP_PASSWD", "pw"),
            ("SSH_AUTH_SOCK", "/tmp/ssh-x/agent.1"),
            ("HTTPS_PROXY", "http://proxy:3128"),
            ("PUSH_URL", "https://x-access:ghp@forge.example/repo.git"),
        ]
        .into_iter()
        .map(|(k, v)| (k.into(), v.into()))
        .collect()
    }

    fn names(env: &[(OsString, OsString)]) -> Vec<String> {
        env.iter()
            .map(|(k, _)| k.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn the_default_drops_every_secret_name_and_keeps_the_rest() {
        let env = EnvPolicy::default().apply(host());
        assert_eq!(
            names(&env),
            ["PATH", "HOME", "LC_ALL", "EDITOR", "HTTPS_PROXY"]
        );
        // Named in `includeOnly`, one is kept; a glob does not lift the default.
        let named = EnvPolicy {
            include_only: vec!["ssh_auth_sock".into(), "DATABASE_*".into(), "PATH".into()],
            ..EnvPolicy::default()
        };
        assert_eq!(names(&named.apply(host())), ["PATH", "SSH_AUTH_SOCK"]);
    }

    #[test]
    fn credentials_in_urls_are_found_in_any_value() {
        for value in [
            "postgres://u:p@h/db",
            "https://token@github.com/a/b",
            "x=1 redis://:pw@cache:6379",
            "http://user@proxy",
        ] {
            assert!(carries_credentials(value), "{value}");
        }
        for value in [
            "https://github.com/a@b",
            "mailto:me@example.com",
            "http://proxy:3128",
            "me@example.com",
            "a://",
        ] {
            assert!(!carries_credentials(value), "{value}");
        }
    }

    #[test]
    fn inherit_core_none_and_lifting_the_default_excludes() {
        let core = EnvPolicy {
            inherit: Inherit::Core,
            ..EnvPolicy::default()
        };
        assert_eq!(names(&core.apply(host())), ["PATH", "HOME", "LC_ALL"]);
        let none = EnvPolicy {
            inherit: Inherit::None,
            ..EnvPolicy::default()
        };
        assert!(none.apply(host()).is_empty());
        let all = EnvPolicy {
            ignore_default_excludes: true,
            ..EnvPolicy::default()
        };
        assert_eq!(all.apply(host()).len(), host().len());
    }

    #[test]
    fn exclude_include_only_and_set_apply_in_order() {
        let policy = EnvPolicy {
            exclude: vec!["edit*".into()],
            include_only: vec!["PATH".into(), "LC_*".into(), "EDITOR".into()],
            set: [
                ("PATH".to_string(), "/opt/bin".to_string()),
                ("NEW".to_string(), "1".to_string()),
            ]
            .into_iter()
            .collect(),
            ..EnvPolicy::default()
        };
        let env = policy.apply(host());
        assert_eq!(names(&env), ["LC_ALL", "NEW", "PATH"]);
        assert_eq!(env[2].1, "/opt/bin");
    }

    #[test]
    fn globs_are_case_insensitive_with_star_and_question_mark() {
        assert!(glob_match("*KEY*", "openai_api_key"));
        assert!(glob_match("*key*", "KEYRING"));
        assert!(glob_match("LC_*", "LC_ALL"));
        assert!(glob_match("A?C", "abc"));
        assert!(!glob_match("A?C", "ac"));
        assert!(!glob_match("*TOKEN*", "TOKE"));
        assert!(glob_match("*", ""));
        assert!(glob_match("a*b*c", "axxbyyc"));
        assert!(!glob_match("a*b*c", "axxbyy"));
    }
}
