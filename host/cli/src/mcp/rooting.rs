//! Where a session is rooted: the client's first root when it lies within an allowed
//! directory, else the fallback.

use super::*;

/// Where new sessions are rooted: the client's first root when it lies within an allowed
/// directory, else the fallback.
#[derive(Clone, Debug)]
pub(crate) struct Rooting {
    pub(super) fallback: PathBuf,
    pub(super) allowed: Vec<PathBuf>,
}

impl Rooting {
    pub(crate) fn new(options: &McpOptions) -> anyhow::Result<Self> {
        let fallback = match &options.cwd {
            Some(cwd) => cwd.clone(),
            None => std::env::current_dir().context("cannot read the current directory")?,
        };
        let allowed = if options.allow_roots.is_empty() {
            vec![dsh_sandbox::canonical_path(&fallback).with_context(|| {
                format!("the session root {} does not exist", fallback.display())
            })?]
        } else {
            options
                .allow_roots
                .iter()
                .map(|dir| {
                    let canonical = dsh_sandbox::canonical_path(dir).ok().filter(|d| d.is_dir());
                    canonical.with_context(|| {
                        format!(
                            "--allow-root {}: not an existing directory; pass a directory clients may root their sessions in",
                            dir.display()
                        )
                    })
                })
                .collect::<anyhow::Result<_>>()?
        };
        Ok(Rooting { fallback, allowed })
    }

    /// The root for a client that listed `roots` (`Err`: why it listed none), and why.
    pub(super) fn choose(&self, roots: Result<Vec<String>, String>) -> (PathBuf, String) {
        let fallback = |why: String| {
            (
                self.fallback.clone(),
                format!(
                    "{why}; the session is rooted at {}",
                    self.fallback.display()
                ),
            )
        };
        let first = match roots {
            Ok(roots) => match roots.into_iter().next() {
                Some(first) => first,
                None => return fallback("the client listed no roots".into()),
            },
            Err(why) => return fallback(why),
        };
        let path = match url::Url::parse(&first)
            .ok()
            .filter(|u| u.scheme() == "file")
        {
            Some(url) => url.to_file_path().ok(),
            None => None,
        };
        let Some(path) = path else {
            return fallback(format!("the client's first root {first} is not a file URI"));
        };
        let canonical = match dsh_sandbox::canonical_path(&path) {
            Ok(c) if c.is_dir() => c,
            _ => {
                return fallback(format!(
                    "the client's first root {} is not an existing directory",
                    path.display()
                ))
            }
        };
        if !self
            .allowed
            .iter()
            .any(|a| dsh_sandbox::is_within(&canonical, a))
        {
            return fallback(format!(
                "the client's first root {} is outside the allowed roots ({}; widen with --allow-root)",
                canonical.display(),
                self.allowed
                    .iter()
                    .map(|a| a.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        let why = format!(
            "the session is rooted at the client's first root {}",
            canonical.display()
        );
        (canonical, why)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_is_rooted_at_the_clients_first_allowed_root_else_the_fallback() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().canonicalize().unwrap();
        let (allowed, inside, outside) = (base.join("a"), base.join("a/sub"), base.join("b"));
        for dir in [&inside, &outside] {
            std::fs::create_dir_all(dir).unwrap();
        }
        let rooting = Rooting::new(&McpOptions {
            cwd: Some(allowed.clone()),
            allow_roots: vec![allowed.clone()],
            ..Default::default()
        })
        .unwrap();
        let uri = |p: &std::path::Path| url::Url::from_file_path(p).unwrap().to_string();
        let (root, why) = rooting.choose(Ok(vec![uri(&inside), uri(&outside)]));
        assert_eq!(root, inside, "{why}");
        assert!(why.contains("the client's first root"), "{why}");
        for (roots, reason) in [
            (Ok(vec![uri(&outside)]), "outside the allowed roots"),
            (
                Ok(vec!["https://example.com/x".to_string()]),
                "is not a file URI",
            ),
            (
                Ok(vec![uri(&base.join("a/gone"))]),
                "is not an existing directory",
            ),
            (Ok(vec![]), "the client listed no roots"),
            (
                Err("the client does not offer roots".to_string()),
                "does not offer roots",
            ),
        ] {
            let (root, why) = rooting.choose(roots);
            assert_eq!(root, allowed, "{why}");
            assert!(why.contains(reason), "{why}");
            assert!(
                why.ends_with(&format!("rooted at {}", allowed.display())),
                "{why}"
            );
        }
        // An allowed directory that does not exist is refused at start, saying which.
        let err = Rooting::new(&McpOptions {
            cwd: Some(allowed.clone()),
            allow_roots: vec![base.join("missing")],
            ..Default::default()
        })
        .unwrap_err();
        assert!(err.to_string().contains("--allow-root"), "{err}");
    }
}
