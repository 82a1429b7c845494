//! Fuzz target `manifest`: `cordis.yml` text → `parse_manifest` → every diagnostic rendered
//! (each one with the source, the `Diagnostics` display, and the JSON that
//! `cordis check --format json` prints). A manifest that parses is also planned against an
//! empty plugin directory, so every enabled entry is library-not-found and the plan's
//! diagnostics are rendered too.

#![no_main]

use std::path::{Component, Path, PathBuf};
use std::sync::OnceLock;

use cordis_engine::{hostile, parse_manifest, Diagnostics, Host, Manifest, SearchPath};
use libfuzzer_sys::fuzz_target;

/// The manifest file planning reads, next to an empty plugin directory.
struct Scratch {
    _dir: tempfile::TempDir,
    manifest: PathBuf,
    host: Host,
}

fn scratch() -> &'static Scratch {
    static SCRATCH: OnceLock<Scratch> = OnceLock::new();
    SCRATCH.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a scratch directory");
        let plugins = dir.path().join("plugins");
        std::fs::create_dir(&plugins).expect("the empty plugin directory");
        let manifest = dir.path().join("cordis.yml");
        // The host's own planning (its services), searching only the empty directory.
        let mut host = Host::new(&manifest, &[], &dir.path().join("state"), false);
        host.set_search(SearchPath {
            dirs: vec![(plugins, "--plugin-path")],
        });
        Scratch {
            _dir: dir,
            manifest,
            host,
        }
    })
}

fn render_all(diags: &Diagnostics) {
    assert!(!diags.items.is_empty(), "a failed check reports a problem");
    for d in &diags.items {
        if let Some(p) = d.pos {
            assert!(p.line >= 1 && p.col >= 1, "positions are 1-based: {d:?}");
        }
        let text = d.render(&diags.file, diags.source.as_deref());
        assert!(text.starts_with(&format!("error[{}]: ", d.code)), "{text}");
        // Control and invisible characters (a hostile key, say) never reach a terminal:
        // they are shown as symbols, so the message appears verbatim only when it has none.
        assert!(
            !text.chars().any(|c| c.is_control() && c != '\n'),
            "a control character reached the rendering: {text:?}"
        );
        if !d.message.chars().any(|c| c.is_control() || hostile(c)) {
            assert!(text.contains(&d.message), "{text}");
        }
    }
    let shown = diags.to_string();
    assert!(
        shown.ends_with("errors)") || shown.ends_with("error)"),
        "{shown}"
    );
    // The JSON `cordis check --format json` prints.
    let json = serde_json::to_string(&diags.to_json()).expect("diagnostics serialize");
    let back: serde_json::Value = serde_json::from_str(&json).expect("diagnostics JSON parses");
    assert_eq!(back.as_array().map(Vec::len), Some(diags.items.len()));
}

/// Planning may load the library an entry's `path:` names; only paths that stay inside
/// the scratch directory (where no library exists) are planned.
fn stays_inside(manifest: &Manifest) -> bool {
    manifest.entries.iter().all(|e| {
        e.path.as_deref().is_none_or(|p| {
            p.components()
                .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
        })
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let file = Path::new("cordis.yml");
    let parsed = match parse_manifest(text) {
        Ok(m) => m,
        Err(items) => {
            render_all(&Diagnostics {
                file: file.to_path_buf(),
                items,
                source: Some(text.to_string()),
            });
            return;
        }
    };
    if !stays_inside(&parsed) {
        return;
    }
    let scratch = scratch();
    std::fs::write(&scratch.manifest, text).expect("the scratch manifest is writable");
    match scratch.host.plan() {
        Ok(planned) => assert!(
            planned.entries.is_empty(),
            "nothing can be loaded from an empty plugin directory"
        ),
        Err(diags) => render_all(&diags),
    }
});
