//! The call context the host sets (`callContext`): which session and tool call the
//! calling thread serves. The host enters a scope around every tool call and model-context
//! request, and around every call that crosses to or from an isolated entry's process (the
//! host records the scope of each request it sends a child, and a child's nested call is
//! answered in the scope of the request it names — never in one it claims). Providers read
//! it through the host's `callContext` service; the host's own `sessions` and `approval`
//! services refuse a session other than the calling one.

use std::cell::RefCell;
use std::sync::{Arc, Mutex};

use cordis_sdk::host::{codes, CallContextService, CurrentCall};
use cordis_sdk::{Error, Result};

/// One call's scope: what the host set, and the modes approved during the call (shared by
/// every thread serving the call, so a grant made on one is seen by the next nested call).
#[derive(Clone, Debug, Default)]
pub(crate) struct Scope {
    /// The call (its `approved_modes` kept in `approved` instead).
    pub call: CurrentCall,
    approved: Arc<Mutex<Vec<String>>>,
}

impl Scope {
    /// A new scope; the modes already approved for the call move to where later grants
    /// are added.
    pub(crate) fn new(mut call: CurrentCall) -> Self {
        let approved = Arc::new(Mutex::new(std::mem::take(&mut call.approved_modes)));
        Scope { call, approved }
    }

    /// The call as a provider sees it (approvals so far included).
    pub(crate) fn current(&self) -> CurrentCall {
        let mut call = self.call.clone();
        call.approved_modes = lock(&self.approved).clone();
        call
    }

    /// The same call, crossing from isolated entry `entry`.
    pub(crate) fn crossed_from(&self, entry: &str) -> Self {
        let mut scope = self.clone();
        scope.call.isolated_caller = Some(entry.to_string());
        scope.call.crossed = true;
        scope
    }

    fn approve(&self, mode: String) {
        lock(&self.approved).push(mode);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

thread_local! {
    static CURRENT: RefCell<Option<Scope>> = const { RefCell::new(None) };
}

/// Restores the scope that was current before [`enter`].
pub(crate) struct Entered(Option<Scope>);

impl Drop for Entered {
    fn drop(&mut self) {
        let previous = self.0.take();
        CURRENT.with(|c| *c.borrow_mut() = previous);
    }
}

/// Makes `scope` the calling thread's until the guard drops.
#[must_use]
pub(crate) fn enter(scope: Scope) -> Entered {
    Entered(CURRENT.with(|c| c.borrow_mut().replace(scope)))
}

/// The calling thread's scope.
pub(crate) fn current() -> Option<Scope> {
    CURRENT.with(|c| c.borrow().clone())
}

/// Refuses `session` unless it is the calling one (no scope: the host itself, or a thread
/// of an in-process plugin, which is trusted like the host).
pub(crate) fn check_session(session: &str, what: &str) -> Result<()> {
    let Some(scope) = current() else {
        return Ok(());
    };
    match &scope.call.session {
        Some(calling) if calling == session => Ok(()),
        calling => Err(Error::new(
            codes::SESSION_NOT_CALLING,
            format!(
                "{what} names session `{session}`, but the call it is made for {}",
                match calling {
                    Some(c) => format!("runs in session `{c}`"),
                    None => "runs outside any session".to_string(),
                }
            ),
        )
        .with_help("a plugin acts only for the session calling it; take the session from the call context (the host's `callContext` service)")),
    }
}

/// Refuses an approval request for another session or call than the calling one; once a
/// mode is granted, records it in the call's scope.
pub(crate) fn check_approval(request: &cordis_sdk::host::ApprovalRequest) -> Result<()> {
    check_session(&request.session, "an approval request")?;
    if let Some(scope) = current() {
        if scope.call.call_id.as_deref() != Some(request.call_id.as_str()) {
            return Err(Error::new(
                codes::SESSION_NOT_CALLING,
                format!(
                    "an approval request names call `{}`, but it is made during {}",
                    request.call_id,
                    scope
                        .call
                        .call_id
                        .as_deref()
                        .map_or("no tool call".to_string(), |c| format!("call `{c}`"))
                ),
            )
            .with_help("ask for approval of the call being served (`CallContext::call_id`)"));
        }
    }
    Ok(())
}

/// Records that `mode` was granted for the calling thread's call.
pub(crate) fn approved(mode: &str) {
    if let Some(scope) = current() {
        scope.approve(mode.to_string());
    }
}

/// The host's `callContext` service: the calling thread's scope.
#[derive(Clone, Copy)]
pub(crate) struct CallContextAnswer;

impl CallContextService for CallContextAnswer {
    fn current(&self, _unit: ()) -> Result<Option<CurrentCall>> {
        Ok(current().map(|s| s.current()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(session: &str) -> CurrentCall {
        CurrentCall {
            session: Some(session.into()),
            call_id: Some("c1".into()),
            ..CurrentCall::default()
        }
    }

    #[test]
    fn scopes_nest_and_restore_and_refuse_other_sessions() {
        assert!(current().is_none());
        check_session("anyone", "a read").expect("no scope: the host itself");
        {
            let _outer = enter(Scope::new(call("s1")));
            check_session("s1", "a read").expect("the calling session");
            let e = check_session("s2", "a read").unwrap_err();
            assert_eq!(e.code, codes::SESSION_NOT_CALLING);
            assert!(e.message.contains("`s2`") && e.message.contains("session `s1`"));
            {
                let _inner = enter(Scope::new(CurrentCall::default()));
                let e = check_session("s1", "a read").unwrap_err();
                assert!(e.message.contains("outside any session"), "{}", e.message);
            }
            assert_eq!(current().unwrap().call.session.as_deref(), Some("s1"));
            approved("workspace-write");
            let seen = CallContextAnswer.current(()).unwrap().unwrap();
            assert_eq!(seen.approved_modes, ["workspace-write"]);
            // A copy taken for another thread shares the grants.
            let copy = current().unwrap().crossed_from("e");
            approved("danger-full-access");
            assert_eq!(copy.current().approved_modes.len(), 2);
            assert_eq!(copy.current().isolated_caller.as_deref(), Some("e"));
        }
        assert!(current().is_none());
    }

    #[test]
    fn an_approval_is_for_the_calling_call_only() {
        let request = |session: &str, call_id: &str| cordis_sdk::host::ApprovalRequest {
            session: session.into(),
            call_id: call_id.into(),
            tool: "bash".into(),
            summary: String::new(),
            detail: String::new(),
            justification: String::new(),
            mode: None,
        };
        let _in = enter(Scope::new(call("s1")));
        check_approval(&request("s1", "c1")).expect("its own call");
        assert!(check_approval(&request("s1", "c2")).is_err());
        assert!(check_approval(&request("s2", "c1")).is_err());
    }
}
