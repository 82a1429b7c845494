//! `/approvals`: the operator channel over HTTP ([`crate::operator`]), behind the
//! operator's token (`CORDIS_OPERATOR_TOKEN`), never a client's.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use http::{header, HeaderMap, StatusCode};
use subtle::ConstantTimeEq as _;

use super::{bearer, oauth, oauth_refusal, APPROVALS_PATH, OPERATOR_TOKEN_ENV};
use crate::mcp::Hub;

/// What the routes share.
pub(super) struct Approvals {
    pub(super) hub: Arc<Hub>,
    /// The operator's own token, `CORDIS_OPERATOR_TOKEN`.
    pub(super) token: Option<String>,
    /// In OAuth mode, an access token with [`oauth::SCOPE_APPROVALS`] answers too.
    pub(super) oauth: Option<Arc<oauth::Resource>>,
}

impl Approvals {
    /// The operator of this server, when the request carries the operator's token or an
    /// access token with the approvals scope.
    async fn operator(
        &self,
        headers: &HeaderMap,
        from: &str,
    ) -> Result<&Arc<crate::operator::Operator>, Box<Response>> {
        let presented = bearer(headers);
        let operators = self.token.as_ref().is_some_and(|t| {
            presented.is_some_and(|p| bool::from(p.as_bytes().ct_eq(t.as_bytes())))
        });
        if !operators {
            match (&self.oauth, &self.token) {
                (Some(resource), _) => {
                    if let Err(refusal) =
                        resource.authorize(presented, oauth::SCOPE_APPROVALS).await
                    {
                        return Err(Box::new(oauth_refusal(
                            resource,
                            &refusal,
                            oauth::SCOPE_APPROVALS,
                            from,
                        )));
                    }
                }
                (None, None) => {
                    return Err(Box::new((
                        StatusCode::FORBIDDEN,
                        format!("this server answers approvals over HTTP only with an operator's token: start it with {OPERATOR_TOKEN_ENV} set, or answer on its machine with `cordis approvals`\n"),
                    )
                        .into_response()));
                }
                (None, Some(_)) => {
                    tracing::warn!(
                        request = from,
                        "refused an approvals request with {} (401)",
                        if presented.is_some() {
                            "a token that is not the operator's"
                        } else {
                            "no bearer token"
                        }
                    );
                    return Err(Box::new((
                        StatusCode::UNAUTHORIZED,
                        [(header::WWW_AUTHENTICATE, "Bearer")],
                        format!("approvals are answered with the operator's token ({OPERATOR_TOKEN_ENV}), not a client's\n"),
                    )
                        .into_response()));
                }
            }
        }
        self.hub.operator().ok_or_else(|| {
            Box::new(
                (
                    StatusCode::NOT_FOUND,
                    "this server has no operator channel (--approval-timeout 0)\n",
                )
                    .into_response(),
            )
        })
    }
}

/// `GET /approvals`: `{"pending": [...]}`, oldest first.
pub(super) async fn list(State(a): State<Arc<Approvals>>, headers: HeaderMap) -> Response {
    match a.operator(&headers, &format!("GET {APPROVALS_PATH}")).await {
        Ok(operator) => json(&serde_json::json!({ "pending": operator.list() })),
        Err(refused) => *refused,
    }
}

/// `POST /approvals/<id>/approve` or `/deny`.
pub(super) async fn answer(
    State(a): State<Arc<Approvals>>,
    Path((id, decision)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let operator = match a
        .operator(&headers, &format!("POST {APPROVALS_PATH}/<id>/<decision>"))
        .await
    {
        Ok(operator) => operator,
        Err(refused) => return *refused,
    };
    let approve = match decision.as_str() {
        "approve" => true,
        "deny" => false,
        _ => {
            return (
                StatusCode::NOT_FOUND,
                "answer with POST /approvals/<id>/approve or /approvals/<id>/deny\n",
            )
                .into_response()
        }
    };
    match operator.answer(&id, approve) {
        Ok(()) => json(&serde_json::json!({ "answered": id })),
        Err(e) => (StatusCode::CONFLICT, format!("{e}\n")).into_response(),
    }
}

fn json(value: &serde_json::Value) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        format!("{value}\n"),
    )
        .into_response()
}
