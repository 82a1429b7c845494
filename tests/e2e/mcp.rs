//! Runs the MCP client tests in `tests/mcp/` (Python, official `mcp` package) against the real
//! `cordis` binary. The interpreter comes from `CORDIS_TEST_PYTHON`, else the workspace's
//! `.venv`; when neither has the `mcp` package the test fails and says how to install it.

use std::path::PathBuf;
use std::process::Command;

const INSTALL: &str = "python3 -m venv .venv && .venv/bin/pip install -r tests/mcp/requirements.txt \
                       (run in the workspace root), or set CORDIS_TEST_PYTHON to an interpreter that has them";

fn python() -> PathBuf {
    let root = cordis_e2e::workspace_root();
    let python = match std::env::var_os("CORDIS_TEST_PYTHON").filter(|p| !p.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => root.join(".venv/bin/python"),
    };
    assert!(
        python.exists(),
        "no Python for the MCP client tests at {}; install one with: {INSTALL}",
        python.display()
    );
    let probe = Command::new(&python)
        .args(["-c", "import mcp, pytest, pytest_asyncio"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
    assert!(
        probe.status.success(),
        "{} lacks the MCP client test packages ({}); install them with: {INSTALL}",
        python.display(),
        String::from_utf8_lossy(&probe.stderr).trim()
    );
    python
}

#[test]
fn mcp_client_tests_pass() {
    let python = python();
    let bin = cordis_e2e::cordis_bin();
    let outside = cordis_e2e::outside_base().join(format!("mcp-outside-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&outside);
    std::fs::create_dir_all(&outside).expect("create the outside dir");
    let dir = cordis_e2e::workspace_root().join("tests/mcp");
    let out = Command::new(&python)
        .current_dir(&dir)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-r", "fE"])
        .env("CORDIS_BIN", &bin)
        .env("CORDIS_OUTSIDE_DIR", &outside)
        .env_remove("CORDIS_PLUGIN_PATH")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("run pytest");
    let _ = std::fs::remove_dir_all(&outside);
    let report = format!(
        "--- pytest stdout ---\n{}\n--- pytest stderr ---\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "the MCP client tests failed\n{report}"
    );
    let summary = String::from_utf8_lossy(&out.stdout);
    assert!(
        summary.contains(" passed") && !summary.contains("no tests ran"),
        "pytest ran no tests\n{report}"
    );
    println!("{report}");
}
