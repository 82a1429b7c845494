//! Operator diagnostics end to end: the rendered output of `cordis check` for broken
//! manifests (snapshots, with line, column and caret), its JSON form, the generated
//! `schemas/` against the bundled and known-bad manifests, `cordis schema --check`, and
//! `cordis check --explain` over the diagnostics and the runtime error codes.

use cordis_e2e::Scratch;
use expect_test::{expect, Expect};

/// Runs `cordis check` on `manifest` and compares stderr with the snapshot.
fn check(manifest: &str, expected: Expect) {
    let s = Scratch::new();
    s.manifest(manifest);
    let run = s.run(&["check", "-c", "cordis.yml"]);
    run.expect_code(1);
    expected.assert_eq(&run.stderr());
}

#[test]
fn unknown_config_key_with_suggestion() {
    check(
        "- name: dsh-sandbox-policy\n  config:\n    mode: workspace-write\n    workspaceRot: /srv\n",
        expect![[r#"
            error[unknown-config-key]: entry `dsh-sandbox-policy` (plugin `dsh-sandbox-policy`): unknown key `workspaceRot` in `config`
             --> cordis.yml:4:5
              |
            4 |     workspaceRot: /srv
              |     ^^^^^^^^^^^^
              |
              = help: did you mean `workspaceRoot`?

            error: cordis.yml is not a valid composition (1 error)
        "#]],
    );
}

#[test]
fn wrong_type() {
    check(
        "- name: cordis-example\n  config:\n    word: 42\n",
        expect![[r#"
            error[invalid-config]: entry `cordis-example` (plugin `cordis-example`): `config.word`: 42 is not of type "string"
             --> cordis.yml:3:11
              |
            3 |     word: 42
              |           ^^
              |
              = help: expected string; `word`: The greeting word.

            error: cordis.yml is not a valid composition (1 error)
        "#]],
    );
}

#[test]
fn invalid_mode_names_the_allowed_values() {
    check(
        "- name: dsh-sandbox-policy\n  config:\n    mode: workspace_write\n",
        expect![[r#"
            error[invalid-config]: entry `dsh-sandbox-policy` (plugin `dsh-sandbox-policy`): `config.mode` is "workspace_write", which is not an allowed value
             --> cordis.yml:3:11
              |
            3 |     mode: workspace_write
              |           ^^^^^^^^^^^^^^^
              |
              = help: expected one of: read-only, workspace-write, danger-full-access; did you mean `workspace-write`?; `mode`: String, one of `read-only`, `workspace-write`, `danger-full-access`; default `read-only` (fail-safe). The deployment default mode: used when a call carries no approved mode and its session has no `sandbox/mode` switch.

            error: cordis.yml is not a valid composition (1 error)
        "#]],
    );
}

#[test]
fn missing_required_field() {
    check(
        "- id: policy\n  config:\n    mode: read-only\n",
        expect![[r#"
            error[missing-name]: entry has no `name`
             --> cordis.yml:1:3
              |
            1 | - id: policy
              |   ^^
              |
              = help: add `name: <plugin>` naming the plugin to load

            error: cordis.yml is not a valid composition (1 error)
        "#]],
    );
}

#[test]
fn bad_interpolation() {
    check(
        "- name: dsh-sandbox-policy\n  config:\n    workspaceRoot: ${CORDIS_E2E_SURELY_UNSET}/ws\n",
        expect![[r#"
            error[interpolation]: environment variable `CORDIS_E2E_SURELY_UNSET` is not set
             --> cordis.yml:3:20
              |
            3 |     workspaceRoot: ${CORDIS_E2E_SURELY_UNSET}/ws
              |                    ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
              |
              = help: set CORDIS_E2E_SURELY_UNSET, or give a default: `${CORDIS_E2E_SURELY_UNSET:-value}`

            error: cordis.yml is not a valid composition (1 error)
        "#]],
    );
}

#[test]
fn yaml_syntax_error() {
    check(
        "- name: cordis-example\n  config: {word: [\n",
        expect![[r#"
            error[yaml-syntax]: YAML syntax error: while parsing a node, did not find expected node content
            --> cordis.yml:3:1
             = help: fix the YAML syntax at this position (check indentation and quoting)

            error: cordis.yml is not a valid composition (1 error)
        "#]],
    );
}

#[test]
fn non_ascii_text_before_the_error_column() {
    check(
        "- {name: dsh-fs-local, id: ééé, dissabled: true}\n",
        expect![[r#"
            error[unknown-key]: unknown entry key `dissabled`
             --> cordis.yml:1:33
              |
            1 | - {name: dsh-fs-local, id: ééé, dissabled: true}
              |                                 ^^^^^^^^^
              |
              = help: did you mean `disabled`?

            error: cordis.yml is not a valid composition (1 error)
        "#]],
    );
}

#[test]
fn an_alias_bomb_stops_at_the_alias_that_crosses_the_limit() {
    let mut bomb = String::from(
        "- name: cordis-example\n  config:\n    l0: &l0 [x, x, x, x, x, x, x, x, x]\n",
    );
    for i in 1..9 {
        let prev = format!("*l{}", i - 1);
        bomb.push_str(&format!(
            "    l{i}: &l{i} [{}]\n",
            [prev.as_str(); 9].join(", ")
        ));
    }
    check(
        &bomb,
        expect![[r#"
        error[manifest-too-large]: this alias expands the manifest past 100000 values
         --> cordis.yml:8:14
          |
        8 |     l5: &l5 [*l4, *l4, *l4, *l4, *l4, *l4, *l4, *l4, *l4]
          |              ^^^
          |
          = help: write the values out instead of nesting aliases (`*name`) of aliases

        error: cordis.yml is not a valid composition (1 error)
    "#]],
    );
}

#[test]
fn every_code_is_explained() {
    let s = Scratch::new();
    let run = s.run(&["check", "--explain"]);
    run.expect_code(0);
    let stdout = run.stdout();
    let (diagnostics, runtime) = stdout
        .split_once(&format!("\n\n{}\n", cordis_cli::codes::RUNTIME_HEADING))
        .expect("the diagnostics, then the runtime codes");
    let listed = |text: &str, end: char| -> Vec<String> {
        text.lines()
            .map(|l| l.split(end).next().unwrap_or("").to_string())
            .collect()
    };
    let registry: Vec<&str> = cordis_engine::CODES.iter().map(|c| c.name).collect();
    assert_eq!(listed(diagnostics, ' '), registry);
    let runtime_codes: Vec<&str> = cordis_cli::codes::runtime().map(|c| c.name).collect();
    assert_eq!(listed(runtime, ':'), runtime_codes);
    for code in [
        cordis_sdk::codes::MISSING_SERVICE,
        cordis_sdk::host::codes::SESSION_NOT_FOUND,
        dsh_fs_api::codes::FS_SANDBOX_DENIED,
        dsh_shell_api::codes::SHELL_SANDBOX_UNAVAILABLE,
        dsh_sandbox::codes::SANDBOX_BAD_ROOT,
    ] {
        assert!(runtime_codes.contains(&code), "{code} is not listed");
    }
    s.run(&["check", "--explain", "missing-service"])
        .expect_code(0)
        .expect_output(&[
            "missing-service (error): an entry requires a service no enabled entry provides",
            "also reported at run time as `MISSING_SERVICE`",
        ]);
    s.run(&["check", "--explain", "missing-servce"])
        .expect_code(1)
        .expect_output(&[
            "no diagnostic or error code `missing-servce`; did you mean `missing-service`?",
        ]);
}

#[test]
fn a_runtime_error_code_is_explained() {
    let s = Scratch::new();
    let run = s.run(&["check", "--explain", "FS_SANDBOX_DENIED"]);
    run.expect_code(0);
    assert_eq!(
        run.stdout(),
        "FS_SANDBOX_DENIED: The policy fence refused a mutation; `data` is `{\"mode\": \"<mode>\"}`.\n"
    );
    s.run(&["check", "--explain", "MISSING_SERVICE"])
        .expect_code(0)
        .expect_output(&[
            "MISSING_SERVICE: A required service is not composed.",
            "the same problem found in cordis.yml is the diagnostic `missing-service`",
        ]);
    s.run(&["check", "--explain", "FS_SANDBOX_DENID"])
        .expect_code(1)
        .expect_output(&[
            "no diagnostic or error code `FS_SANDBOX_DENID`; did you mean `FS_SANDBOX_DENIED`?",
        ]);
}

/// The codes of `cordis check --format json` on `manifest`, in order, and the items.
fn json_codes(manifest: &str) -> (Vec<String>, serde_json::Value) {
    let s = Scratch::new();
    s.manifest(manifest);
    let run = s.run(&["check", "--format", "json"]);
    run.expect_code(1);
    let items: serde_json::Value = serde_json::from_str(&run.stdout()).expect("JSON");
    let codes = items
        .as_array()
        .expect("a list")
        .iter()
        .map(|i| i["code"].as_str().unwrap_or("").to_string())
        .collect();
    (codes, items)
}

#[test]
fn one_error_never_hides_another() {
    // A config error in an entry whose services are missing, and a misspelt plugin.
    let (codes, items) =
        json_codes("- name: dsh-tool-fs\n  config:\n    bogus: 1\n- name: dsh-fs-sandbx\n");
    assert_eq!(
        codes,
        [
            "unknown-config-key",
            "library-not-found",
            "missing-service",
            "missing-service"
        ],
        "{items:#}"
    );
    let help = items[1]["help"].as_str().unwrap_or("");
    assert!(
        help.starts_with("did you mean `dsh-fs-sandbox`?") && help.contains("libdsh_fs_sandbox."),
        "{items:#}"
    );
    assert_eq!(items[1]["severity"], "error");
    assert_eq!(
        items[1]["explanation"],
        "no library file was found for an entry's plugin"
    );

    // Nothing close: the help says how to build and point at a library, not a
    // `cargo build -p` of a package that may not exist.
    let (codes, items) = json_codes("- name: zzz-unheard-of\n");
    assert_eq!(codes, ["library-not-found"], "{items:#}");
    let help = items[0]["help"].as_str().unwrap_or("");
    assert!(
        !help.contains("did you mean")
            && !help.contains("-p zzz")
            && help.contains("--plugin-path"),
        "{help}"
    );
}

#[test]
fn interpolation_is_applied_and_every_violation_is_reported_as_json() {
    let s = Scratch::new();
    s.manifest(
        "- name: cordis-example\n  config:\n    word: ${CORDIS_E2E_WORD:-hey}\n- name: dsh-sandbox-policy\n  config:\n    mode: root\n    extra: 1\n",
    );
    let run = s.run(&["check", "--format", "json"]);
    run.expect_code(1);
    let items: serde_json::Value = serde_json::from_str(&run.stdout()).expect("JSON");
    let got: Vec<(String, u64, u64)> = items
        .as_array()
        .expect("a list")
        .iter()
        .map(|i| {
            (
                i["code"].as_str().unwrap_or("").to_string(),
                i["line"].as_u64().unwrap_or(0),
                i["column"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("invalid-config".to_string(), 6, 11),
            ("unknown-config-key".to_string(), 7, 5)
        ],
        "{}",
        run.context()
    );
    assert!(items[0]["help"]
        .as_str()
        .unwrap_or("")
        .contains("read-only, workspace-write, danger-full-access"));
    assert_eq!(items[0]["file"], "cordis.yml");

    s.manifest("- name: cordis-example\n  config:\n    word: ${CORDIS_E2E_WORD:-hey}\n");
    s.run(&["call", "greet", r#"{"name": "Ada"}"#])
        .expect_code(0)
        .expect_output(&["hey, Ada"]);
}

fn validator() -> jsonschema::Validator {
    let text =
        std::fs::read_to_string(cordis_e2e::workspace_root().join("schemas/cordis.schema.json"))
            .expect("schemas/cordis.schema.json exists (cargo xtask schema)");
    let schema: serde_json::Value = serde_json::from_str(&text).expect("schema JSON");
    jsonschema::validator_for(&schema).expect("a valid JSON Schema")
}

fn yaml_to_json(text: &str) -> serde_json::Value {
    cordis_engine::parse_yaml(text).expect("YAML").to_json()
}

#[test]
fn the_schema_accepts_the_bundled_manifest_and_rejects_known_bad_ones() {
    let v = validator();
    let bundled = cordis_e2e::bundled_manifest();
    let errors: Vec<String> = v
        .iter_errors(&yaml_to_json(&bundled))
        .map(|e| e.to_string())
        .collect();
    assert!(errors.is_empty(), "bundled cordis.yml: {errors:?}");
    let good = [
        "- name: dsh-fs-local\n- group: true\n  config:\n    - name: '@deepseek-ai/dsh-tool-fs'\n      disabled: true\n",
        "- name: my-own-plugin\n  path: libs/libmy.so\n  config:\n    anything: [1, 2]\n",
    ];
    for text in good {
        assert!(v.is_valid(&yaml_to_json(text)), "should be valid:\n{text}");
    }
    let bad = [
        "- name: dsh-sandbox-policy\n  config:\n    mode: workspace_write\n",
        "- name: '@deepseek-ai/dsh-sandbox-policy'\n  config:\n    workspaceRot: /x\n",
        "- name: dsh-fs-sandbox\n  config:\n    cwd: /x\n",
        "- name: cordis-example\n  confg: {}\n",
        "- id: nameless\n",
        "- name: cordis-example\n  disabled: yes\n",
        "- group: true\n  config: {name: x}\n",
        "name: not-a-list\n",
    ];
    for text in bad {
        assert!(
            !v.is_valid(&yaml_to_json(text)),
            "should be rejected:\n{text}"
        );
    }
}

#[test]
fn schema_check_fails_when_stale_until_written() {
    let s = Scratch::new();
    let out = s.path().join("schemas");
    std::fs::create_dir_all(&out).expect("dir");
    for entry in std::fs::read_dir(cordis_e2e::workspace_root().join("schemas")).expect("schemas/")
    {
        let p = entry.expect("entry").path();
        std::fs::copy(&p, out.join(p.file_name().expect("name"))).expect("copy");
    }
    let plugins = ["cordis-example", "dsh-sandbox-policy"];
    let args = |mode: &str| {
        let mut a = vec!["schema", mode, "--out", "schemas"];
        a.extend(plugins);
        a.into_iter().map(str::to_string).collect::<Vec<_>>()
    };
    let run = |mode: &str| {
        let a = args(mode);
        s.run(&a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    // The copied set holds schemas of other plugins too: stale for this plugin list.
    run("--check")
        .expect_code(1)
        .expect_output(&["is stale", "cordis schema --write"]);
    run("--write").expect_code(0);
    run("--check").expect_code(0).expect_output(&["up to date"]);
    // A config type change shows up as a different generated schema.
    let file = out.join("cordis-example.schema.json");
    let text = std::fs::read_to_string(&file).expect("read");
    std::fs::write(
        &file,
        text.replace("The greeting word.", "An older description."),
    )
    .expect("write");
    run("--check")
        .expect_code(1)
        .expect_output(&["cordis-example.schema.json is stale"]);
    run("--write").expect_code(0);
    run("--check").expect_code(0);
}
