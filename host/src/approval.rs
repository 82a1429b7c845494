//! The host's `approval` service, backed by whichever front-end owns the calling session:
//! an MCP connection asks its client (elicitation), `cordis call` answers from its flags or
//! the terminal. A session with no front-end that can ask gets `unavailable`.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use cordis_sdk::host::{Approval, ApprovalOutcome, ApprovalRequest};
use cordis_sdk::Result;

/// Something that can ask a person.
pub type Asker = Arc<dyn Fn(&ApprovalRequest) -> ApprovalOutcome + Send + Sync>;

/// Routes each approval request to the front-end of the calling session.
#[derive(Default)]
pub struct ApprovalRouter {
    by_session: RwLock<HashMap<String, Asker>>,
    fallback: RwLock<Option<Asker>>,
}

impl ApprovalRouter {
    /// Sets the asker for sessions without their own.
    pub fn set_default(&self, asker: Option<Asker>) {
        *self.fallback.write().unwrap_or_else(|e| e.into_inner()) = asker;
    }

    /// Answers every request for sessions without their own with `outcome`.
    pub fn answer_always(&self, outcome: ApprovalOutcome) {
        self.set_default(Some(Arc::new(move |_| outcome)));
    }

    /// Binds a session to a front-end's asker (until [`ApprovalRouter::unbind`]).
    pub fn bind(&self, session: &str, asker: Asker) {
        self.by_session
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(session.to_string(), asker);
    }

    /// Removes a session's asker.
    pub fn unbind(&self, session: &str) {
        self.by_session
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(session);
    }

    /// Asks the session's front-end; `unavailable` when there is none.
    pub fn ask(&self, request: &ApprovalRequest) -> ApprovalOutcome {
        let asker = self
            .by_session
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&request.session)
            .cloned()
            .or_else(|| {
                self.fallback
                    .read()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone()
            });
        let outcome = match asker {
            Some(ask) => ask(request),
            None => ApprovalOutcome::Unavailable,
        };
        tracing::info!(
            session = %request.session,
            call = %request.call_id,
            tool = %request.tool,
            "approval {outcome:?}: {}",
            request.summary
        );
        outcome
    }
}

/// The router as the host's `approval` service.
#[derive(Clone)]
pub struct ApprovalService(pub Arc<ApprovalRouter>);

impl Approval for ApprovalService {
    fn request(&self, request: ApprovalRequest) -> Result<ApprovalOutcome> {
        Ok(self.0.ask(&request))
    }
}
