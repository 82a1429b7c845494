//! A reload in two steps a unit test can drive: [`Diff`], what changed between the running
//! plan and the new one (pure: no plugin is asked), and [`Transaction`], which applies it
//! to the registry step by step and, when an entry fails, undoes every step it took, in
//! reverse. [`replace`] runs both; `Runtime::reload` only plans, calls it, swaps
//! generations and notifies.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::plan::{Plan, Planned, Provider};
use crate::registry::{ApplyError, Registry};

/// One entry of a plan as a reload compares it, with what applies it (`P`: the planned
/// entry; tests use their own).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Shape<P> {
    /// The entry id.
    pub id: String,
    /// The loaded library's identity: an unchanged library is the very same object.
    pub library: usize,
    /// The entry's config.
    pub config: serde_json::Value,
    /// How it is isolated (a change restarts it, like a new library).
    pub isolate: Option<crate::isolate::Isolation>,
    /// The entries whose services it injects.
    pub providers: BTreeSet<String>,
    /// What applies it.
    pub planned: P,
}

/// Every entry of `plan`, in its order (providers first).
pub(crate) fn shape(plan: &Plan) -> Vec<Shape<Planned>> {
    plan.entries
        .iter()
        .map(|p| Shape {
            id: p.entry.id.clone(),
            library: Arc::as_ptr(&p.library) as usize,
            config: p.entry.config.clone(),
            isolate: p.entry.isolate.clone(),
            providers: p
                .library
                .meta
                .injects
                .iter()
                .filter_map(|inj| match plan.providers.get(&inj.name) {
                    Some(Provider::Entry(id)) => Some(id.clone()),
                    _ => None,
                })
                .collect(),
            planned: p.clone(),
        })
        .collect()
}

/// What changed between two plans, before any plugin is asked.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Diff {
    /// Entries only in the new plan, in its order.
    pub added: Vec<String>,
    /// Entries only in the old plan, sorted.
    pub removed: Vec<String>,
    /// Entries on a new library, or isolated differently: restarted.
    pub new_library: BTreeSet<String>,
    /// Entries on the same library with a new config, in the new plan's order (providers
    /// first): offered in place.
    pub new_config: Vec<String>,
}

impl Diff {
    /// Compares `old` with `new`.
    pub fn between<P>(old: &[Shape<P>], new: &[Shape<P>]) -> Diff {
        let mut diff = Diff::default();
        for n in new {
            match find(old, &n.id) {
                None => diff.added.push(n.id.clone()),
                Some(o) if o.library != n.library || o.isolate != n.isolate => {
                    diff.new_library.insert(n.id.clone());
                }
                Some(o) if o.config != n.config => diff.new_config.push(n.id.clone()),
                Some(_) => {}
            }
        }
        diff.removed = old
            .iter()
            .filter(|o| find(new, &o.id).is_none())
            .map(|o| o.id.clone())
            .collect();
        diff.removed.sort();
        diff
    }

    /// The entries to restart when those in `refused` would not take their new config in
    /// place: every entry on a new library or refusing, and every entry of both plans that
    /// injects, directly or not, in either plan, one restarted or removed.
    pub fn restarts<P>(
        &self,
        old: &[Shape<P>],
        new: &[Shape<P>],
        refused: &BTreeSet<String>,
    ) -> BTreeSet<String> {
        let mut restart: BTreeSet<String> = self.new_library.union(refused).cloned().collect();
        let mut gone = restart.clone();
        gone.extend(self.removed.iter().cloned());
        let dependents = dependents(old, &gone)
            .into_iter()
            .chain(dependents(new, &gone))
            .filter(|id| find(old, id).is_some() && find(new, id).is_some());
        restart.extend(dependents.collect::<Vec<_>>());
        restart
    }
}

fn find<'a, P>(plan: &'a [Shape<P>], id: &str) -> Option<&'a Shape<P>> {
    plan.iter().find(|s| s.id == id)
}

/// Every entry of `plan` that injects, directly or not, one of `ids` (those not included).
pub(crate) fn dependents<P>(plan: &[Shape<P>], ids: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out: BTreeSet<String> = BTreeSet::new();
    let mut frontier: Vec<&String> = ids.iter().collect();
    while let Some(provider) = frontier.pop() {
        for s in plan {
            if s.providers.contains(provider) && !ids.contains(&s.id) && out.insert(s.id.clone()) {
                frontier.push(&s.id);
            }
        }
    }
    out
}

/// What a transaction changes: the registry, or a recording stand-in in tests.
pub(crate) trait Entries {
    /// What applies one entry.
    type Planned: Clone;
    /// Applies an entry (its providers are applied); on failure nothing of it stays.
    fn apply(&mut self, planned: &Self::Planned) -> Result<(), ApplyError>;
    /// Disposes an applied entry (its consumers are disposed).
    fn dispose(&mut self, id: &str);
    /// Offers an applied entry a new config: `Ok(true)` taken in place, `Ok(false)` the
    /// plugin asks for a restart.
    fn reconfigure(
        &mut self,
        id: &str,
        config: &serde_json::Value,
    ) -> Result<bool, cordis_sdk::Error>;
}

impl Entries for Registry {
    type Planned = Planned;

    fn apply(&mut self, planned: &Planned) -> Result<(), ApplyError> {
        self.apply_entry(planned)
    }

    fn dispose(&mut self, id: &str) {
        self.dispose_entry(id);
    }

    fn reconfigure(
        &mut self,
        id: &str,
        config: &serde_json::Value,
    ) -> Result<bool, cordis_sdk::Error> {
        Registry::reconfigure(self, id, config)
    }
}

/// A step taken, with what undoes it.
enum Step<P> {
    /// An entry took a new config in place: offer `previous` back, or, refused, restart
    /// `restart` (the entry and its dependents, in the old plan's order).
    Reconfigured {
        id: String,
        previous: serde_json::Value,
        restart: Vec<(String, P)>,
    },
    /// An entry was disposed: apply it again.
    Disposed(String, P),
    /// An entry was applied: dispose it.
    Applied(String),
}

/// Changes to a set of applied entries that are kept together or undone together.
pub(crate) struct Transaction<'a, E: Entries> {
    entries: &'a mut E,
    steps: Vec<Step<E::Planned>>,
}

impl<'a, E: Entries> Transaction<'a, E> {
    /// A transaction on `entries`.
    pub fn begin(entries: &'a mut E) -> Self {
        Transaction {
            entries,
            steps: Vec::new(),
        }
    }

    /// Offers entry `id` its new `config`; whether it took it in place (a refusal or an
    /// error is a `false`: the caller restarts it). Undone by offering `previous` back, or,
    /// refused then, by restarting `restart` on what applied them before.
    pub fn reconfigure(
        &mut self,
        id: &str,
        config: &serde_json::Value,
        previous: &serde_json::Value,
        restart: Vec<(String, E::Planned)>,
    ) -> bool {
        match self.entries.reconfigure(id, config) {
            Ok(true) => {
                self.steps.push(Step::Reconfigured {
                    id: id.to_string(),
                    previous: previous.clone(),
                    restart,
                });
                true
            }
            Ok(false) => false,
            Err(e) => {
                tracing::warn!(entry = %id, "reconfigure failed ({e}); restarting it");
                false
            }
        }
    }

    /// Disposes entry `id`, which `planned` applied (and applies again on rollback). A
    /// config it took in place needs no undoing then.
    pub fn dispose(&mut self, id: &str, planned: &E::Planned) {
        self.entries.dispose(id);
        self.steps
            .retain(|s| !matches!(s, Step::Reconfigured { id: r, .. } if r == id));
        self.steps
            .push(Step::Disposed(id.to_string(), planned.clone()));
    }

    /// Applies entry `id` from `planned`.
    pub fn apply(&mut self, id: &str, planned: &E::Planned) -> Result<(), ApplyError> {
        self.entries.apply(planned)?;
        self.steps.push(Step::Applied(id.to_string()));
        Ok(())
    }

    /// Keeps every step.
    pub fn commit(self) {}

    /// Undoes every step, last first; whether everything was restored (what was not is
    /// logged).
    pub fn rollback(self) -> bool {
        let mut restored = true;
        for step in self.steps.into_iter().rev() {
            match step {
                Step::Applied(id) => self.entries.dispose(&id),
                Step::Disposed(id, planned) => {
                    if let Err(e) = self.entries.apply(&planned) {
                        tracing::error!("rollback of entry `{id}` failed: {e}");
                        restored = false;
                    }
                }
                Step::Reconfigured {
                    id,
                    previous,
                    restart,
                } => {
                    match self.entries.reconfigure(&id, &previous) {
                        Ok(true) => continue,
                        Ok(false) => {}
                        Err(e) => tracing::warn!(
                            entry = %id,
                            "reconfigure back failed ({e}); restarting it"
                        ),
                    }
                    for (id, _) in restart.iter().rev() {
                        self.entries.dispose(id);
                    }
                    for (id, planned) in &restart {
                        if let Err(e) = self.entries.apply(planned) {
                            tracing::error!("rollback of entry `{id}`'s config failed: {e}");
                            restored = false;
                            break;
                        }
                    }
                }
            }
        }
        restored
    }
}

/// What [`replace`] changed.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Changes {
    /// Entries added, sorted.
    pub added: Vec<String>,
    /// Entries removed, sorted.
    pub removed: Vec<String>,
    /// Entries that took their new config in place, sorted.
    pub reconfigured: Vec<String>,
    /// Entries restarted.
    pub restarted: BTreeSet<String>,
}

/// An entry failed to apply during [`replace`].
#[derive(Debug)]
pub(crate) struct Failed {
    /// The failure.
    pub error: ApplyError,
    /// Whether every step was undone.
    pub rolled_back: bool,
}

/// Turns the applied entries of `old` into those of `new`, as one transaction: configs
/// offered in place (providers first), then the entries to restart or remove disposed
/// (consumers first) and those to restart or add applied (providers first). When an entry
/// fails to apply, every step is undone.
pub(crate) fn replace<E: Entries>(
    entries: &mut E,
    old: &[Shape<E::Planned>],
    new: &[Shape<E::Planned>],
) -> Result<Changes, Failed> {
    let diff = Diff::between(old, new);
    let mut tx = Transaction::begin(entries);
    let mut refused = BTreeSet::new();
    let mut reconfigured = Vec::new();
    for id in &diff.new_config {
        let (o, n) = (find(old, id), find(new, id));
        let (Some(o), Some(n)) = (o, n) else {
            continue;
        };
        let mut affected = dependents(old, &BTreeSet::from([id.clone()]));
        affected.insert(id.clone());
        let restart = old
            .iter()
            .filter(|s| affected.contains(&s.id))
            .map(|s| (s.id.clone(), s.planned.clone()))
            .collect();
        if tx.reconfigure(id, &n.config, &o.config, restart) {
            reconfigured.push(id.clone());
        } else {
            refused.insert(id.clone());
        }
    }
    let restarted = diff.restarts(old, new, &refused);
    for o in old.iter().rev() {
        if restarted.contains(&o.id) || diff.removed.contains(&o.id) {
            tx.dispose(&o.id, &o.planned);
        }
    }
    let added: BTreeSet<&String> = diff.added.iter().collect();
    for n in new {
        if restarted.contains(&n.id) || added.contains(&n.id) {
            if let Err(error) = tx.apply(&n.id, &n.planned) {
                let rolled_back = tx.rollback();
                return Err(Failed { error, rolled_back });
            }
        }
    }
    tx.commit();
    let mut added = diff.added;
    added.sort();
    reconfigured.sort();
    Ok(Changes {
        added,
        removed: diff.removed,
        reconfigured,
        restarted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// An entry: `(id, library, config, providers)`.
    fn entry(id: &str, library: usize, config: serde_json::Value, providers: &[&str]) -> Shape<()> {
        Shape {
            id: id.into(),
            library,
            config,
            isolate: None,
            providers: providers.iter().map(|p| p.to_string()).collect(),
            planned: (),
        }
    }

    fn set(ids: &[&str]) -> BTreeSet<String> {
        ids.iter().map(|s| s.to_string()).collect()
    }

    /// policy ← fs ← tools, policy ← shell ← tools; `other` alone.
    fn running() -> Vec<Shape<()>> {
        vec![
            entry("policy", 1, json!({"mode": "ro"}), &[]),
            entry("fs", 2, json!({}), &["policy"]),
            entry("shell", 3, json!({}), &["policy"]),
            entry("tools", 4, json!({}), &["fs", "shell"]),
            entry("other", 5, json!({}), &[]),
        ]
    }

    #[test]
    fn an_unchanged_plan_is_an_empty_diff() {
        let d = Diff::between(&running(), &running());
        assert_eq!(d, Diff::default());
        assert!(d.restarts(&running(), &running(), &set(&[])).is_empty());
    }

    #[test]
    fn a_new_library_restarts_the_entry_and_everything_that_injects_it() {
        let mut new = running();
        new[1].library = 20;
        let d = Diff::between(&running(), &new);
        assert_eq!(d.new_library, set(&["fs"]));
        assert_eq!(
            d.restarts(&running(), &new, &set(&[])),
            set(&["fs", "tools"])
        );
    }

    #[test]
    fn a_new_config_is_offered_in_place_providers_first_and_restarts_only_when_refused() {
        let mut new = running();
        new[3].config = json!({"x": 1});
        new[0].config = json!({"mode": "rw"});
        let d = Diff::between(&running(), &new);
        assert_eq!(d.new_config, vec!["policy", "tools"]);
        assert!(d.restarts(&running(), &new, &set(&[])).is_empty());
        assert_eq!(
            d.restarts(&running(), &new, &set(&["policy"])),
            set(&["policy", "fs", "shell", "tools"])
        );
    }

    #[test]
    fn added_and_removed_entries_and_the_dependents_of_a_removed_one() {
        let mut new = running();
        new.remove(4);
        new.remove(2);
        new[2].providers = set(&["fs"]);
        new.push(entry("late", 6, json!({}), &["tools"]));
        let d = Diff::between(&running(), &new);
        assert_eq!(d.added, vec!["late"]);
        assert_eq!(d.removed, vec!["other", "shell"]);
        // `tools` injected `shell` in the old plan: it is restarted without it.
        assert_eq!(d.restarts(&running(), &new, &set(&[])), set(&["tools"]));
    }

    #[test]
    fn dependents_are_transitive_and_exclude_the_ids_themselves() {
        assert_eq!(
            dependents(&running(), &set(&["policy"])),
            set(&["fs", "shell", "tools"])
        );
        assert_eq!(
            dependents(&running(), &set(&["policy", "fs"])),
            set(&["shell", "tools"])
        );
        assert!(dependents(&running(), &set(&["other"])).is_empty());
    }

    /// A registry stand-in: which entries are applied with which config, every call in
    /// order, and which calls fail.
    #[derive(Default)]
    struct Fake {
        applied: Vec<(String, serde_json::Value)>,
        log: Vec<String>,
        /// Entries whose apply fails (with config).
        fail_apply: Vec<(String, serde_json::Value)>,
        /// Entries that refuse a new config in place.
        refuse: BTreeSet<String>,
    }

    type Planned = (String, serde_json::Value);

    impl Entries for Fake {
        type Planned = Planned;

        fn apply(&mut self, (id, config): &Planned) -> Result<(), ApplyError> {
            self.log.push(format!("apply {id} {config}"));
            if self.fail_apply.contains(&(id.clone(), config.clone())) {
                return Err(ApplyError {
                    entry: id.clone(),
                    plugin: id.clone(),
                    line: 1,
                    error: Box::new(cordis_sdk::Error::internal("refused")),
                });
            }
            self.applied.push((id.clone(), config.clone()));
            Ok(())
        }

        fn dispose(&mut self, id: &str) {
            self.log.push(format!("dispose {id}"));
            self.applied.retain(|(a, _)| a != id);
        }

        fn reconfigure(
            &mut self,
            id: &str,
            config: &serde_json::Value,
        ) -> Result<bool, cordis_sdk::Error> {
            self.log.push(format!("reconfigure {id} {config}"));
            if self.refuse.contains(id) {
                return Ok(false);
            }
            for (a, c) in &mut self.applied {
                if a == id {
                    *c = config.clone();
                }
            }
            Ok(true)
        }
    }

    fn planned(plan: Vec<Shape<()>>) -> Vec<Shape<Planned>> {
        plan.into_iter()
            .map(|s| Shape {
                planned: (s.id.clone(), s.config.clone()),
                id: s.id,
                library: s.library,
                config: s.config,
                isolate: s.isolate,
                providers: s.providers,
            })
            .collect()
    }

    fn started(plan: &[Shape<Planned>]) -> Fake {
        let mut fake = Fake::default();
        for s in plan {
            fake.apply(&s.planned).unwrap();
        }
        fake.log.clear();
        fake
    }

    fn sorted(mut v: Vec<(String, serde_json::Value)>) -> Vec<(String, serde_json::Value)> {
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// Every entry of [`running`] restarted on its old config: consumers disposed first,
    /// providers applied first.
    const RESTART_ALL: [&str; 8] = [
        "dispose tools",
        "dispose shell",
        "dispose fs",
        "dispose policy",
        "apply policy {\"mode\":\"ro\"}",
        "apply fs {}",
        "apply shell {}",
        "apply tools {}",
    ];

    #[test]
    fn a_reload_disposes_consumers_first_and_applies_providers_first() {
        let old = planned(running());
        let mut new = running();
        new[0].library = 10;
        let new = planned(new);
        let mut fake = started(&old);
        let changes = replace(&mut fake, &old, &new).unwrap();
        assert_eq!(changes.restarted, set(&["policy", "fs", "shell", "tools"]));
        assert_eq!(fake.log, RESTART_ALL);
    }

    #[test]
    fn a_failed_apply_rolls_back_restarts_additions_removals_and_configs_taken_in_place() {
        let old = planned(running());
        let mut new = running();
        new[0].config = json!({"mode": "rw"}); // taken in place
        new[1].library = 20; // fs restarted, tools with it
        new.remove(4); // other removed
        new.push(entry("late", 6, json!({}), &[])); // added, and fails
        let new = planned(new);
        let mut fake = started(&old);
        let before = sorted(fake.applied.clone());
        fake.fail_apply.push(("late".into(), json!({})));
        let failed = replace(&mut fake, &old, &new).unwrap_err();
        assert_eq!(failed.error.entry, "late");
        assert!(failed.rolled_back);
        assert_eq!(sorted(fake.applied.clone()), before);
        assert_eq!(
            fake.log.last().map(String::as_str),
            Some("reconfigure policy {\"mode\":\"ro\"}"),
            "the config taken in place is given back last: {:?}",
            fake.log
        );
    }

    #[test]
    fn a_config_given_back_and_refused_restarts_the_entry_and_its_dependents_on_the_old_one() {
        let old = planned(running());
        let mut new = running();
        new[0].config = json!({"mode": "rw"});
        new.push(entry("late", 6, json!({}), &[]));
        let new = planned(new);
        let mut fake = started(&old);
        let before = sorted(fake.applied.clone());
        fake.fail_apply.push(("late".into(), json!({})));
        // Takes the new config, then refuses the old one back.
        let mut tx = Transaction::begin(&mut fake);
        let restart = old[..4]
            .iter()
            .map(|s| (s.id.clone(), s.planned.clone()))
            .collect();
        assert!(tx.reconfigure(
            "policy",
            &json!({"mode": "rw"}),
            &json!({"mode": "ro"}),
            restart
        ));
        tx.entries.refuse.insert("policy".into());
        assert!(tx.apply("late", &new[5].planned).is_err());
        assert!(tx.rollback());
        assert_eq!(sorted(fake.applied.clone()), before);
        let tail: Vec<&str> = fake
            .log
            .iter()
            .rev()
            .take(8)
            .rev()
            .map(String::as_str)
            .collect();
        assert_eq!(tail, RESTART_ALL);
    }

    #[test]
    fn a_refused_config_restarts_the_entry_on_its_new_config() {
        let old = planned(running());
        let mut new = running();
        new[3].config = json!({"x": 1});
        let new = planned(new);
        let mut fake = started(&old);
        fake.refuse.insert("tools".into());
        let changes = replace(&mut fake, &old, &new).unwrap();
        assert!(changes.reconfigured.is_empty());
        assert_eq!(changes.restarted, set(&["tools"]));
        assert!(fake.applied.contains(&("tools".into(), json!({"x": 1}))));
    }

    #[test]
    fn a_config_taken_in_place_by_an_entry_restarted_anyway_is_not_given_back_on_rollback() {
        let old = planned(running());
        let mut new = running();
        new[3].config = json!({"x": 1}); // taken in place, then restarted with fs
        new[1].library = 20;
        new.push(entry("late", 6, json!({}), &[]));
        let new = planned(new);
        let mut fake = started(&old);
        let before = sorted(fake.applied.clone());
        fake.fail_apply.push(("late".into(), json!({})));
        let failed = replace(&mut fake, &old, &new).unwrap_err();
        assert!(failed.rolled_back);
        assert_eq!(sorted(fake.applied.clone()), before);
        let given_back = fake
            .log
            .iter()
            .filter(|l| l.starts_with("reconfigure tools"))
            .count();
        assert_eq!(
            given_back, 1,
            "offered once, never given back: {:?}",
            fake.log
        );
    }

    #[test]
    fn a_rollback_that_cannot_reapply_an_entry_says_so() {
        let old = planned(running());
        let mut new = running();
        new[4].library = 50;
        new.push(entry("late", 6, json!({}), &[]));
        let new = planned(new);
        let mut fake = started(&old);
        fake.fail_apply.push(("late".into(), json!({})));
        fake.fail_apply.push(("other".into(), json!({})));
        let failed = replace(&mut fake, &old, &new).unwrap_err();
        assert_eq!(failed.error.entry, "other");
        assert!(!failed.rolled_back);
    }
}
