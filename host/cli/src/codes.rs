//! Every code `cordis` reports, in one place, for `cordis check --explain`: the
//! diagnostics of a composition ([`cordis_engine::CODES`], kebab-case) and the runtime
//! error codes (the `code` of a [`cordis_sdk::Error`] a tool or service returns,
//! SCREAMING_SNAKE), each declared with [`cordis_sdk::error_codes!`] in the crate that
//! produces it.

use cordis_engine::{Code, CODES};
use cordis_sdk::ErrorCode;

/// The runtime error codes, by the crate that declares them: the SDK, the host, and the
/// interfaces of the bundled plugins.
pub const RUNTIME: &[&[ErrorCode]] = &[
    cordis_sdk::codes::ALL,
    cordis_sdk::host::codes::ALL,
    cordis_engine::codes::ALL,
    dsh_fs_api::codes::ALL,
    dsh_shell_api::codes::ALL,
    dsh_sandbox::codes::ALL,
];

pub use cordis_engine::codes::SAME_PROBLEM;

/// The line that starts the runtime codes in the listing.
pub const RUNTIME_HEADING: &str =
    "runtime error codes (the `code` of an error a tool or service returns):";

/// Every runtime error code.
pub fn runtime() -> impl Iterator<Item = &'static ErrorCode> {
    RUNTIME.iter().flat_map(|codes| codes.iter())
}

/// The runtime code named `name`.
pub fn runtime_code(name: &str) -> Option<&'static ErrorCode> {
    runtime().find(|c| c.name == name)
}

fn diagnostic_line(c: &Code) -> String {
    format!("{} ({}): {}", c.name, c.severity.as_str(), c.explanation)
}

fn runtime_line(c: &ErrorCode) -> String {
    format!("{}: {}", c.name, c.explanation)
}

/// What `cordis check --explain` prints: every diagnostic, one a line, then a blank line,
/// [`RUNTIME_HEADING`] and every runtime code, one a line.
pub fn list() -> String {
    let mut out = String::new();
    for c in CODES {
        out.push_str(&diagnostic_line(c));
        out.push('\n');
    }
    out.push('\n');
    out.push_str(RUNTIME_HEADING);
    out.push('\n');
    for c in runtime() {
        out.push_str(&runtime_line(c));
        out.push('\n');
    }
    out
}

/// What `cordis check --explain CODE` prints for `code`, a diagnostic or a runtime code,
/// with the other spelling of the same problem if it has one; for an unknown code, the
/// error, with the closest code of either kind.
pub fn explain(code: &str) -> Result<String, String> {
    if let Some(c) = cordis_engine::diagnostic_code(code) {
        let mut out = diagnostic_line(c);
        if let Some((_, runtime)) = SAME_PROBLEM.iter().find(|(d, _)| d.name == c.name) {
            out.push_str(&format!("\nalso reported at run time as `{runtime}`"));
        }
        return Ok(out + "\n");
    }
    if let Some(c) = runtime_code(code) {
        let mut out = runtime_line(c);
        if let Some((d, _)) = SAME_PROBLEM.iter().find(|(_, r)| *r == c.name) {
            out.push_str(&format!(
                "\nthe same problem found in cordis.yml is the diagnostic `{}`",
                d.name
            ));
        }
        return Ok(out + "\n");
    }
    let names: Vec<&str> = CODES
        .iter()
        .map(|c| c.name)
        .chain(runtime().map(|c| c.name))
        .collect();
    let hint = match cordis_engine::closest(code, &names) {
        Some(name) => format!("did you mean `{name}`?"),
        None => "`cordis check --explain` lists every code".to_string(),
    };
    Err(format!("no diagnostic or error code `{code}`; {hint}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_runtime_code_is_listed_once_in_screaming_snake_case() {
        let mut seen = std::collections::HashSet::new();
        for c in runtime() {
            assert!(seen.insert(c.name), "`{}` is listed twice", c.name);
            let screaming = !c.name.is_empty()
                && c.name.starts_with(|ch: char| ch.is_ascii_uppercase())
                && !c.name.ends_with('_')
                && !c.name.contains("__")
                && c.name
                    .bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
            assert!(screaming, "`{}` is not SCREAMING_SNAKE", c.name);
            assert!(
                !c.explanation.is_empty() && !c.explanation.contains('\n'),
                "`{}` needs a one-line explanation",
                c.name
            );
        }
        assert!(seen.contains(dsh_fs_api::codes::FS_SANDBOX_DENIED));
        assert!(seen.contains(cordis_sdk::host::codes::SESSION_NOT_FOUND));
    }

    #[test]
    fn every_problem_named_twice_names_listed_codes() {
        for (d, r) in SAME_PROBLEM {
            assert_eq!(cordis_engine::diagnostic_code(d.name), Some(*d));
            assert!(runtime_code(r).is_some(), "`{r}` is not a runtime code");
        }
    }

    #[test]
    fn a_runtime_code_is_explained() {
        assert_eq!(
            explain("SHELL_SPAWN").unwrap(),
            "SHELL_SPAWN: The command could not be started.\n"
        );
        let denied = explain("FS_SANDBOX_DENIED").unwrap();
        assert!(
            denied.starts_with("FS_SANDBOX_DENIED: The policy fence refused a mutation"),
            "{denied}"
        );
        assert_eq!(denied.lines().count(), 1, "{denied}");
    }

    #[test]
    fn a_diagnostic_is_explained_as_before() {
        assert_eq!(
            explain("dependency-cycle").unwrap(),
            "dependency-cycle (error): entries inject each other's services in a cycle\n"
        );
    }

    #[test]
    fn a_near_miss_of_either_kind_gets_the_closest_code() {
        assert_eq!(
            explain("FS_SANDBOX_DENIE").unwrap_err(),
            "no diagnostic or error code `FS_SANDBOX_DENIE`; did you mean `FS_SANDBOX_DENIED`?"
        );
        assert_eq!(
            explain("fs_sandbox_denied").unwrap_err(),
            "no diagnostic or error code `fs_sandbox_denied`; did you mean `FS_SANDBOX_DENIED`?"
        );
        assert_eq!(
            explain("missing-servce").unwrap_err(),
            "no diagnostic or error code `missing-servce`; did you mean `missing-service`?"
        );
        assert_eq!(
            explain("no-such-thing-at-all").unwrap_err(),
            "no diagnostic or error code `no-such-thing-at-all`; `cordis check --explain` lists every code"
        );
    }

    #[test]
    fn each_spelling_of_one_problem_names_the_other() {
        assert_eq!(
            explain("missing-service").unwrap(),
            "missing-service (error): an entry requires a service no enabled entry provides\n\
             also reported at run time as `MISSING_SERVICE`\n"
        );
        assert_eq!(
            explain("MISSING_SERVICE").unwrap(),
            "MISSING_SERVICE: A required service is not composed.\n\
             the same problem found in cordis.yml is the diagnostic `missing-service`\n"
        );
        let mismatch = explain("INTERFACE_MISMATCH").unwrap();
        assert!(
            mismatch.ends_with("the diagnostic `interface-mismatch`\n"),
            "{mismatch}"
        );
        let duplicate = explain("duplicate-provider").unwrap();
        assert!(
            duplicate.ends_with("also reported at run time as `DUPLICATE_SERVICE`\n"),
            "{duplicate}"
        );
    }

    #[test]
    fn the_listing_holds_the_diagnostics_then_the_runtime_codes() {
        let listing = list();
        let (diagnostics, runtime_part) = listing
            .split_once(&format!("\n{RUNTIME_HEADING}\n"))
            .unwrap();
        let names = |text: &str| -> Vec<String> {
            text.lines()
                .filter(|l| !l.is_empty())
                .map(|l| l.split([' ', ':']).next().unwrap().to_string())
                .collect()
        };
        let registry: Vec<&str> = CODES.iter().map(|c| c.name).collect();
        assert_eq!(names(diagnostics), registry);
        let runtime_names: Vec<&str> = runtime().map(|c| c.name).collect();
        assert_eq!(names(runtime_part), runtime_names);
    }
}
