//! Approvals: asked of a handshake-era client with `elicitation/create` while the call
//! runs, or of a 2026-07-28 client as `input_required`, the call parked until the retry
//! with the answer (sealed state, bound to the call, used once).

use super::*;

/// A call waiting for the client's retry with an approval answer.
pub(super) struct Parked {
    pub(super) running: Running,
    pub(super) ask: Ask,
}

/// What a sealed `requestState` carries.
#[derive(Serialize, Deserialize)]
pub(super) struct ParkState {
    pub(super) park: u64,
    pub(super) call: String,
    /// The session's handle, for a 2026-07-28 client over HTTP: its retry may name none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) handle: Option<String>,
}

impl McpServer {
    /// What a parked call's state is bound to: the session, the tool and its arguments.
    /// A 2026-07-28 session over HTTP is named by the handle sealed inside the state
    /// instead, since its client's retry may not name it.
    pub(super) fn binding(&self, session: &str, tool: &str, args: &serde_json::Value) -> Vec<u8> {
        match self.shared.handle.get() {
            Some(_) => stateless_binding(tool, args),
            None => format!("{session}\0{tool}\0{args}").into_bytes(),
        }
    }

    pub(super) fn park(
        &self,
        running: Running,
        ask: Ask,
        args: &serde_json::Value,
    ) -> Result<InputRequiredResult, String> {
        let elicitation = match approval_elicitation(&ask.request) {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!("cannot build the approval elicitation: {e}");
                ask.answer(ApprovalOutcome::Unavailable);
                self.detach(running, ApprovalOutcome::Unavailable);
                return Err(format!("approval could not be requested: {e}"));
            }
        };
        let park = self.next_id();
        let binding = self.binding(&running.session, &running.tool, args);
        let state = self.shared.hub.codec.seal_json_with(
            &ParkState {
                park,
                call: running.call_id.clone(),
                handle: self.shared.handle.get().cloned(),
            },
            &SealOptions::new().associated_data(&binding).ttl(PARK_TTL),
        );
        let state = match state {
            Ok(s) => s,
            Err(e) => {
                ask.answer(ApprovalOutcome::Unavailable);
                self.detach(running, ApprovalOutcome::Unavailable);
                return Err(format!("approval could not be requested: {e}"));
            }
        };
        lock(&self.shared.parked).insert(park, Parked { running, ask });
        // Weak: a parked call does not keep its connection alive.
        let me = Arc::downgrade(&self.shared);
        tokio::spawn(async move {
            tokio::time::sleep(PARK_TTL).await;
            let Some(shared) = me.upgrade() else { return };
            let me = McpServer { shared };
            let expired = lock(&me.shared.parked).remove(&park);
            if let Some(p) = expired {
                p.ask.answer(ApprovalOutcome::Cancelled);
                me.detach(p.running, ApprovalOutcome::Cancelled);
            }
        });
        let mut requests = InputRequests::new();
        requests.insert(APPROVAL_INPUT.to_string(), elicitation);
        Ok(InputRequiredResult::new(Some(requests), Some(state)))
    }

    /// A retry carrying `requestState`: answer the parked approval it names and go on.
    pub(super) async fn resume(
        &self,
        session: &SessionInfo,
        request: &CallToolRequestParams,
        state: &str,
        args: &serde_json::Value,
        context: &RequestContext<RoleServer>,
    ) -> CallToolResponse {
        let binding = self.binding(&session.id, &request.name, args);
        let opened: Result<ParkState, _> = self.shared.hub.codec.open_json_with(state, &binding);
        let state = match opened {
            Ok(s) if s.handle.as_ref() == self.shared.handle.get() => s,
            Ok(_) => {
                return error_result(
                    "this approval answer does not belong to this call (another session's); call the tool again"
                        .to_string(),
                )
            }
            Err(e) => {
                return error_result(format!(
                    "this approval answer does not belong to this call ({e}); call the tool again"
                ))
            }
        };
        let parked = {
            let mut parked = lock(&self.shared.parked);
            match parked.get(&state.park) {
                Some(p) if p.running.call_id == state.call => parked.remove(&state.park),
                _ => None,
            }
        };
        let Some(Parked { running, ask }) = parked else {
            return error_result(
                "no approval is pending for this call (already answered or expired); call the tool again"
                    .to_string(),
            );
        };
        let outcome = request
            .input_responses
            .as_ref()
            .and_then(|r| r.get(APPROVAL_INPUT))
            .and_then(|v| serde_json::from_value::<ElicitResult>(v.clone()).ok())
            .map(|r| outcome_of(&r))
            .unwrap_or(ApprovalOutcome::Unavailable);
        ask.answer(outcome);
        self.drive(running, args, context).await
    }
}

/// [`McpServer::binding`] of a 2026-07-28 session over HTTP.
pub(super) fn stateless_binding(tool: &str, args: &serde_json::Value) -> Vec<u8> {
    format!("stateless\0{tool}\0{args}").into_bytes()
}

/// Whether the client declared form elicitation (a bare `elicitation: {}` means form).
pub(super) fn elicitation_supported(context: &RequestContext<RoleServer>) -> bool {
    context
        .client_capabilities()
        .and_then(|c| c.elicitation)
        .is_some_and(|e| e.form.is_some() || e.url.is_none())
}

pub(super) fn approval_params(request: &ApprovalRequest) -> Result<ElicitRequestParams, String> {
    let schema: ElicitationSchema = serde_json::from_value(serde_json::json!({
        "type": "object",
        "properties": {
            "approve": {
                "type": "boolean",
                "title": "Approve",
                "description": "Allow exactly this one call",
                "default": false
            }
        },
        "required": ["approve"]
    }))
    .map_err(|e| e.to_string())?;
    let message = format!(
        "{}\nApprove this one call?",
        cordis_engine::render_approval(request)
    );
    Ok(ElicitRequestParams::FormElicitationParams {
        meta: None,
        message,
        requested_schema: schema,
    })
}

pub(super) fn approval_elicitation(request: &ApprovalRequest) -> Result<InputRequest, String> {
    Ok(InputRequest::Elicitation(ElicitRequest::new(
        approval_params(request)?,
    )))
}

/// Asks now, with a server-to-client `elicitation/create` (handshake-era connections).
pub(super) async fn elicit_now(
    peer: &Peer<RoleServer>,
    request: &ApprovalRequest,
) -> ApprovalOutcome {
    let params = match approval_params(request) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!("cannot build the approval elicitation: {e}");
            return ApprovalOutcome::Unavailable;
        }
    };
    match peer.create_elicitation(params).await {
        Ok(result) => outcome_of(&result),
        Err(e) => {
            tracing::warn!("approval elicitation failed: {e}");
            ApprovalOutcome::Unavailable
        }
    }
}

pub(super) fn outcome_of(result: &ElicitResult) -> ApprovalOutcome {
    match result.action {
        ElicitationAction::Accept => {
            let approved = result
                .content
                .as_ref()
                .and_then(|c| c.get("approve"))
                .and_then(|v| v.as_bool())
                .unwrap_or(false);
            if approved {
                ApprovalOutcome::Approved
            } else {
                ApprovalOutcome::Rejected
            }
        }
        ElicitationAction::Decline => ApprovalOutcome::Rejected,
        ElicitationAction::Cancel => ApprovalOutcome::Cancelled,
        _ => ApprovalOutcome::Unavailable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn elicited(action: ElicitationAction, content: Option<serde_json::Value>) -> ElicitResult {
        serde_json::from_value(serde_json::json!({
            "action": action,
            "content": content,
        }))
        .unwrap()
    }

    #[test]
    fn only_an_accepted_approve_true_approves() {
        let yes = serde_json::json!({"approve": true});
        let no = serde_json::json!({"approve": false});
        let cases = [
            (
                elicited(ElicitationAction::Accept, Some(yes.clone())),
                ApprovalOutcome::Approved,
            ),
            (
                elicited(ElicitationAction::Accept, Some(no)),
                ApprovalOutcome::Rejected,
            ),
            (
                elicited(ElicitationAction::Accept, None),
                ApprovalOutcome::Rejected,
            ),
            (
                elicited(
                    ElicitationAction::Accept,
                    Some(serde_json::json!({"approve": "yes"})),
                ),
                ApprovalOutcome::Rejected,
            ),
            (
                elicited(ElicitationAction::Decline, Some(yes.clone())),
                ApprovalOutcome::Rejected,
            ),
            (
                elicited(ElicitationAction::Cancel, Some(yes)),
                ApprovalOutcome::Cancelled,
            ),
        ];
        for (result, want) in cases {
            assert_eq!(outcome_of(&result), want, "{result:?}");
        }
    }

    #[test]
    fn the_approval_form_asks_one_boolean_and_ends_with_the_question() {
        let request = ApprovalRequest {
            session: "s1".into(),
            call_id: "c1".into(),
            tool: "bash".into(),
            summary: "run `rm -rf build`".into(),
            detail: "rm -rf build".into(),
            justification: "clean build".into(),
            mode: None,
        };
        let ElicitRequestParams::FormElicitationParams {
            message,
            requested_schema,
            ..
        } = approval_params(&request).unwrap()
        else {
            panic!("a form elicitation");
        };
        assert!(message.ends_with("\nApprove this one call?"), "{message}");
        assert!(message.contains("rm -rf build"), "{message}");
        let schema = serde_json::to_value(&requested_schema).unwrap();
        assert_eq!(schema["required"], serde_json::json!(["approve"]));
        assert_eq!(schema["properties"]["approve"]["type"], "boolean");
        assert!(approval_elicitation(&request).is_ok());
    }

    /// A parked call's state opens only for the same tool and arguments; a 2026-07-28
    /// session's handle travels inside it, sealed.
    #[test]
    fn a_sealed_state_opens_only_for_its_call_and_carries_the_handle() {
        let codec = RequestStateCodec::try_new(random_bytes(32).unwrap()).unwrap();
        let args = serde_json::json!({"command": "make"});
        let binding = stateless_binding("bash", &args);
        let state = codec
            .seal_json_with(
                &ParkState {
                    park: 7,
                    call: "mcp-x-1".into(),
                    handle: Some("h1.abc".into()),
                },
                &SealOptions::new().associated_data(&binding).ttl(PARK_TTL),
            )
            .unwrap();
        let opened: ParkState = codec.open_json_with(&state, &binding).unwrap();
        assert_eq!((opened.park, opened.call.as_str()), (7, "mcp-x-1"));
        assert_eq!(opened.handle.as_deref(), Some("h1.abc"));
        let other_args = stateless_binding("bash", &serde_json::json!({"command": "rm -rf /"}));
        assert!(codec
            .open_json_with::<ParkState>(&state, &other_args)
            .is_err());
        let other_tool = stateless_binding("write", &args);
        assert!(codec
            .open_json_with::<ParkState>(&state, &other_tool)
            .is_err());
        let mut forged = state.clone();
        forged.pop();
        forged.push(if state.ends_with('A') { 'B' } else { 'A' });
        assert!(codec
            .open_json_with::<ParkState>(&forged, &binding)
            .is_err());
    }
}
