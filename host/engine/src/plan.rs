//! Validating a whole composition before anything is applied: libraries found and
//! ABI-compatible, configs accepted, every required service provided exactly once by a
//! compatible interface, no cycles. The result is a [`Plan`]: entries in dependency order.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cordis_sdk::InterfaceMismatch;

use crate::diag::{self, Diagnostic, Diagnostics};
use crate::loader::{Copies, Library, LoadError, SearchPath, ServiceSpec};
use crate::manifest::{self, Entry};
use crate::protect::Protection;

/// Options for planning.
#[derive(Clone, Debug, Default)]
pub struct PlanOptions {
    /// Where libraries are looked for.
    pub search: SearchPath,
    /// Include abi_stable's full report in ABI diagnostics.
    pub verbose: bool,
    /// Services the host provides itself.
    pub host_services: Vec<ServiceSpec>,
    /// Load every library from a private copy (needed to load a new generation of a file
    /// that is already loaded).
    pub copies: Option<Arc<Copies>>,
    /// Protected paths to extend with what each planned manifest can load, before any of
    /// its libraries is loaded.
    pub protect: Option<Arc<Protection>>,
}

/// An entry ready to apply.
#[derive(Debug, Clone)]
pub struct Planned {
    /// The manifest entry.
    pub entry: Entry,
    /// Its loaded library.
    pub library: Arc<Library>,
}

/// Who provides a service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Provider {
    /// The host itself.
    Host,
    /// A manifest entry, by id.
    Entry(String),
}

/// A validated composition.
#[derive(Debug)]
pub struct Plan {
    /// The manifest file.
    pub file: PathBuf,
    /// Enabled entries in dependency order (providers before consumers).
    pub entries: Vec<Planned>,
    /// Disabled entries (listed, not loaded).
    pub disabled: Vec<Entry>,
    /// Service name → provider.
    pub providers: BTreeMap<String, Provider>,
}

/// Reads, parses and validates `file`; every problem found is returned at once.
pub fn plan(file: &Path, opts: &PlanOptions) -> Result<Plan, Diagnostics> {
    plan_with(file, opts, &[])
}

/// Like [`plan`], reusing each library of `loaded` whose file has not changed (same path,
/// same metadata or same bytes) instead of loading it again. With libraries loaded (a
/// reload), an empty manifest is refused rather than planned as an empty composition.
pub(crate) fn plan_with(
    file: &Path,
    opts: &PlanOptions,
    loaded: &[Arc<Library>],
) -> Result<Plan, Diagnostics> {
    let text = std::fs::read_to_string(file).map_err(|e| Diagnostics {
        file: file.to_path_buf(),
        source: None,
        items: vec![Diagnostic::new(
            diag::MANIFEST_UNREADABLE,
            format!("cannot read {}: {e}", file.display()),
        )
        .help("pass the manifest with `-c path/to/cordis.yml`")],
    })?;
    let fail = |items| Diagnostics {
        file: file.to_path_buf(),
        source: Some(text.clone()),
        items,
    };
    if !loaded.is_empty() && text.trim().is_empty() {
        // A writer that truncates and then writes (`>`, some editors) can be seen in
        // between; an empty file never stops a running composition.
        return Err(fail(vec![Diagnostic::new(
            diag::MANIFEST_EMPTY,
            format!(
                "{} is empty; the running composition is kept",
                file.display()
            ),
        )
        .help(
            "if it is being saved, its next change is picked up; to stop every entry, write `[]`",
        )]));
    }
    let manifest = manifest::parse(&text).map_err(fail)?;
    if let Some(protect) = &opts.protect {
        protect.cover_manifest(file, &manifest, &opts.search);
    }
    let base = file.parent().unwrap_or(Path::new("."));
    let mut diags = Vec::new();

    let mut libraries: HashMap<PathBuf, Arc<Library>> = HashMap::new();
    for lib in loaded {
        if lib.unchanged_on_disk() {
            let key = lib.path.canonicalize().unwrap_or_else(|_| lib.path.clone());
            libraries.insert(key, lib.clone());
        }
    }
    // Every entry whose library loaded takes part in the checks of the whole graph, even
    // when its config is invalid, so one error never hides another.
    let mut planned = Vec::new();
    for entry in manifest.enabled() {
        if let Some(p) = load_entry(entry, base, opts, &mut libraries, &mut diags) {
            planned.push(p);
        }
    }

    let providers = check_providers(&planned, opts, &mut diags);
    check_injections(&planned, &providers, opts, &mut diags);
    let order = order_by_dependencies(&planned, &mut diags);
    if !diags.is_empty() {
        return Err(fail(diags));
    }
    let providers = providers
        .into_iter()
        .map(|(name, p)| {
            let provider = match p {
                Source::Host(_) => Provider::Host,
                Source::Entry(i) => Provider::Entry(planned[i].entry.id.clone()),
            };
            (name, provider)
        })
        .collect();
    let mut slots: Vec<Option<Planned>> = planned.into_iter().map(Some).collect();
    Ok(Plan {
        file: file.to_path_buf(),
        entries: order.into_iter().filter_map(|i| slots[i].take()).collect(),
        disabled: manifest
            .entries
            .iter()
            .filter(|e| e.disabled)
            .cloned()
            .collect(),
        providers,
    })
}

fn describe(entry: &Entry) -> String {
    if entry.id == entry.plugin {
        format!("entry `{}`", entry.id)
    } else {
        format!("entry `{}` (plugin `{}`)", entry.id, entry.plugin)
    }
}

fn load_entry(
    entry: &Entry,
    base: &Path,
    opts: &PlanOptions,
    libraries: &mut HashMap<PathBuf, Arc<Library>>,
    diags: &mut Vec<Diagnostic>,
) -> Option<Planned> {
    let path = match &entry.path {
        Some(p) => {
            let p = base.join(p);
            if !p.is_file() {
                diags.push(
                    Diagnostic::new(
                        diag::LIBRARY_NOT_FOUND,
                        format!(
                            "{}: library file {} does not exist",
                            describe(entry),
                            p.display()
                        ),
                    )
                    .at(entry.pos)
                    .help("fix `path:` or remove it to search the plugin path by name"),
                );
                return None;
            }
            p
        }
        None => match opts.search.find(&entry.plugin) {
            Ok(p) => p,
            Err(tried) => {
                let mut d = Diagnostic::new(
                    diag::LIBRARY_NOT_FOUND,
                    format!(
                        "{}: no library for plugin `{}`",
                        describe(entry),
                        entry.plugin
                    ),
                )
                .at(entry.pos);
                for (t, (_, why)) in tried.iter().zip(&opts.search.dirs) {
                    d = d.note(format!("looked for {} ({why})", t.display()));
                }
                let help = match closest_plugin(&opts.search, &entry.plugin) {
                    Some((name, file)) => format!(
                        "did you mean `{name}`? ({} is on the plugin path): write `name: {name}`",
                        file.display()
                    ),
                    None => format!(
                        "build the plugin's crate (cargo puts {} in its target directory), then add that directory with --plugin-path or {}, or name the file with `path:`",
                        crate::loader::library_file_name(&entry.plugin),
                        crate::loader::PLUGIN_PATH_ENV
                    ),
                };
                diags.push(d.help(help));
                return None;
            }
        },
    };
    let key = path.canonicalize().unwrap_or_else(|_| path.clone());
    let library = match libraries.get(&key) {
        Some(lib) => lib.clone(),
        None => match Library::load_with(&path, opts.copies.as_deref()) {
            Ok(lib) => {
                libraries.insert(key, lib.clone());
                lib
            }
            Err(e) => {
                let mut d = Diagnostic::new(
                    if matches!(e, LoadError::Abi { .. }) {
                        diag::ABI_MISMATCH
                    } else {
                        diag::LIBRARY_INVALID
                    },
                    format!("{}: cannot use {}: {e}", describe(entry), path.display()),
                )
                .at(entry.pos);
                if let LoadError::Abi { full, .. } = &e {
                    d = if opts.verbose {
                        d.note(full.clone())
                    } else {
                        d.note("run with --verbose for abi_stable's full report")
                    };
                }
                let help = match e {
                    LoadError::NotAPlugin | LoadError::Open(_) => {
                        "point the entry at a cdylib built with cordis-sdk's `export_plugin!`"
                    }
                    _ => "rebuild the plugin against this host's cordis-sdk",
                };
                diags.push(d.help(help));
                return None;
            }
        },
    };
    if library.meta.name != entry.plugin {
        diags.push(
            Diagnostic::new(
                diag::PLUGIN_NAME_MISMATCH,
                format!(
                    "{}: {} contains plugin `{}`, not `{}`",
                    describe(entry),
                    path.display(),
                    library.meta.name,
                    entry.plugin
                ),
            )
            .at(entry.pos)
            .help(format!("set `name: {}` or fix `path:`", library.meta.name)),
        );
        return None;
    }
    let planned = Planned {
        entry: entry.clone(),
        library: library.clone(),
    };
    let schema_errors = crate::schema::validate_config(entry, &library.meta.config_schema);
    if !schema_errors.is_empty() {
        diags.extend(schema_errors);
        return Some(planned);
    }
    // The schema cannot say everything (e.g. custom checks): the plugin's own deserializer
    // has the last word, still before anything is applied.
    if let Err(e) = library.check_config(&entry.config.to_string()) {
        let pos = entry.config_node.as_ref().map_or(entry.pos, |n| n.pos);
        let mut d = Diagnostic::new(
            diag::INVALID_CONFIG,
            format!(
                "{}: invalid config for plugin `{}`: {}",
                describe(entry),
                entry.plugin,
                e.message
            ),
        )
        .at(pos);
        let help = e.help.into_option().map(|h| h.to_string());
        d = d.help(help.unwrap_or_else(|| {
            let keys = schema_keys(&library.meta.config_schema);
            if keys.is_empty() {
                format!("plugin `{}` takes no config", entry.plugin)
            } else {
                format!(
                    "plugin `{}` accepts config keys: {}",
                    entry.plugin,
                    keys.join(", ")
                )
            }
        }));
        diags.push(d);
    }
    Some(planned)
}

/// The plugin on the search path whose name is closest to `plugin` (a likely typo), with
/// its library file. Names come from file names (`libdsh_fs_local.so` → `dsh-fs-local`).
fn closest_plugin(search: &SearchPath, plugin: &str) -> Option<(String, PathBuf)> {
    let libraries: Vec<(String, PathBuf)> = search
        .all_libraries()
        .into_iter()
        .filter_map(|path| {
            let name = path
                .file_name()?
                .to_str()?
                .strip_prefix(std::env::consts::DLL_PREFIX)?
                .strip_suffix(std::env::consts::DLL_SUFFIX)?
                .replace('_', "-");
            Some((name, path))
        })
        .collect();
    let names: Vec<&str> = libraries.iter().map(|(n, _)| n.as_str()).collect();
    let best = manifest::closest(plugin, &names)?.to_string();
    libraries.into_iter().find(|(n, _)| *n == best)
}

/// The top-level property names of a config schema.
pub(crate) fn schema_keys(schema: &serde_json::Value) -> Vec<String> {
    schema
        .get("properties")
        .and_then(|p| p.as_object())
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default()
}

enum Source {
    Host(ServiceSpec),
    Entry(usize),
}

fn check_providers(
    planned: &[Planned],
    opts: &PlanOptions,
    diags: &mut Vec<Diagnostic>,
) -> BTreeMap<String, Source> {
    let mut providers: BTreeMap<String, Source> = opts
        .host_services
        .iter()
        .map(|s| (s.name.clone(), Source::Host(s.clone())))
        .collect();
    for (i, p) in planned.iter().enumerate() {
        for s in &p.library.meta.provides {
            match providers.get(&s.name) {
                None => {
                    providers.insert(s.name.clone(), Source::Entry(i));
                }
                Some(Source::Host(_)) => diags.push(
                    Diagnostic::new(
                        diag::DUPLICATE_PROVIDER,
                        format!(
                            "{} provides service `{}`, which the host itself provides",
                            describe(&p.entry),
                            s.name
                        ),
                    )
                    .at(p.entry.pos)
                    .help("remove the entry; the host's service cannot be replaced"),
                ),
                Some(Source::Entry(first)) => {
                    let first = &planned[*first].entry;
                    diags.push(
                        Diagnostic::new(
                            diag::DUPLICATE_PROVIDER,
                            format!(
                                "{} and {} both provide service `{}`",
                                describe(first),
                                describe(&p.entry),
                                s.name
                            ),
                        )
                        .at(p.entry.pos)
                        .note(format!("`{}` is at line {}", first.id, first.pos.line))
                        .help(format!(
                            "compose one provider of `{}`: remove one entry or mark it `disabled: true`",
                            s.name
                        )),
                    );
                }
            }
        }
    }
    providers
}

fn check_injections(
    planned: &[Planned],
    providers: &BTreeMap<String, Source>,
    opts: &PlanOptions,
    diags: &mut Vec<Diagnostic>,
) {
    for p in planned {
        for inj in &p.library.meta.injects {
            let provided = match providers.get(&inj.name) {
                Some(Source::Host(s)) => Some((s.clone(), "the host".to_string())),
                Some(Source::Entry(i)) => {
                    let e = &planned[*i];
                    let spec = e
                        .library
                        .meta
                        .provides
                        .iter()
                        .find(|s| s.name == inj.name)
                        .cloned();
                    spec.map(|s| (s, describe(&e.entry)))
                }
                None => None,
            };
            match provided {
                None if inj.optional => {}
                None => {
                    let candidates = plugins_providing(&opts.search, &inj.name);
                    let help = match candidates.first() {
                        Some(name) => format!(
                            "add an entry `- name: {name}` to cordis.yml; plugin `{name}` provides `{}`",
                            inj.name
                        ),
                        None => format!(
                            "add an entry for a plugin that provides `{}` (none was found in the plugin search path)",
                            inj.name
                        ),
                    };
                    diags.push(
                        Diagnostic::new(
                            diag::MISSING_SERVICE,
                            format!(
                                "{} requires service `{}` ({} v{}), but no enabled entry provides it",
                                describe(&p.entry),
                                inj.name,
                                inj.interface,
                                inj.version
                            ),
                        )
                        .at(p.entry.pos)
                        .help(help),
                    );
                }
                Some((spec, who)) => {
                    if let Err(mismatch) = InterfaceMismatch::check(
                        &inj.name,
                        (&inj.interface, inj.version),
                        (&spec.interface, spec.version),
                    ) {
                        diags.push(
                            Diagnostic::new(
                                diag::INTERFACE_MISMATCH,
                                mismatch.explain(&describe(&p.entry), &who),
                            )
                            .at(p.entry.pos)
                            .help(mismatch.help()),
                        );
                    }
                }
            }
        }
    }
}

/// Names of plugins in the search path that provide `service`.
fn plugins_providing(search: &SearchPath, service: &str) -> Vec<String> {
    let mut names = Vec::new();
    for path in search.all_libraries() {
        if let Ok(lib) = Library::load(&path) {
            if lib.meta.provides.iter().any(|s| s.name == service)
                && !names.contains(&lib.meta.name)
            {
                names.push(lib.meta.name.clone());
            }
        }
    }
    names
}

/// A stable topological order (manifest order where dependencies allow).
fn order_by_dependencies(planned: &[Planned], diags: &mut Vec<Diagnostic>) -> Vec<usize> {
    let provider_of: HashMap<&str, usize> = planned
        .iter()
        .enumerate()
        .flat_map(|(i, p)| {
            p.library
                .meta
                .provides
                .iter()
                .map(move |s| (s.name.as_str(), i))
        })
        .collect();
    let deps: Vec<Vec<usize>> = planned
        .iter()
        .map(|p| {
            let mut d: Vec<usize> = p
                .library
                .meta
                .injects
                .iter()
                .filter_map(|inj| provider_of.get(inj.name.as_str()).copied())
                .collect();
            d.dedup();
            d
        })
        .collect();
    let mut placed = vec![false; planned.len()];
    let mut order = Vec::new();
    while order.len() < planned.len() {
        let next = (0..planned.len()).find(|&i| !placed[i] && deps[i].iter().all(|&d| placed[d]));
        match next {
            Some(i) => {
                placed[i] = true;
                order.push(i);
            }
            None => {
                let start = (0..planned.len()).find(|&i| !placed[i]).unwrap_or(0);
                let cycle = find_cycle(start, &deps, &placed);
                let names: Vec<String> = cycle
                    .iter()
                    .map(|&i| {
                        let e = &planned[i].entry;
                        format!("`{}` (line {})", e.id, e.pos.line)
                    })
                    .collect();
                let first = &planned[cycle[0]].entry;
                diags.push(
                    Diagnostic::new(
                        diag::DEPENDENCY_CYCLE,
                        format!("dependency cycle: {}", names.join(" → ")),
                    )
                    .at(first.pos)
                    .help("break the cycle: one of these plugins must not inject a service the others provide (make the injection optional or split the plugin)"),
                );
                break;
            }
        }
    }
    order
}

fn find_cycle(start: usize, deps: &[Vec<usize>], placed: &[bool]) -> Vec<usize> {
    let mut path = vec![start];
    let mut cur = start;
    loop {
        let Some(&next) = deps[cur].iter().find(|&&d| !placed[d]) else {
            return path;
        };
        if let Some(at) = path.iter().position(|&p| p == next) {
            let mut cycle = path[at..].to_vec();
            cycle.push(next);
            return cycle;
        }
        path.push(next);
        cur = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_keys_are_the_top_level_properties() {
        let schema = serde_json::json!({
            "type": "object",
            "properties": {"mode": {"type": "string"}, "network": {"type": "boolean"}},
        });
        assert_eq!(schema_keys(&schema), ["mode", "network"]);
        assert!(schema_keys(&serde_json::json!({"type": "object"})).is_empty());
        assert!(schema_keys(&serde_json::json!({"properties": 3})).is_empty());
    }
}
