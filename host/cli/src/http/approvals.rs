//! `/approvals`: the operator channel over HTTP ([`crate::operator`]), behind the
//! operator's token (`CORDIS_OPERATOR_TOKEN`), never a client's.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use http::{header, HeaderMap, StatusCode};
use subtle::ConstantTimeEq as _;

use super::OPERATOR_TOKEN_ENV;
use crate::mcp::Hub;

/// What the routes share.
pub(super) struct Approvals {
    pub(super) hub: Arc<Hub>,
    pub(super) token: Option<String>,
}

impl Approvals {
    /// The operator of this server, when the request carries the operator's token.
    fn operator(
        &self,
        headers: &HeaderMap,
    ) -> Result<&Arc<crate::operator::Operator>, Box<Response>> {
        let Some(expected) = &self.token else {
            return Err(Box::new((
                StatusCode::FORBIDDEN,
                format!("this server answers approvals over HTTP only with an operator's token: start it with {OPERATOR_TOKEN_ENV} set, or answer on its machine with `cordis approvals`\n"),
            )
                .into_response()));
        };
        let presented = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let matches =
            presented.is_some_and(|p| bool::from(p.as_bytes().ct_eq(expected.as_bytes())));
        if !matches {
            tracing::warn!(
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
    match a.operator(&headers) {
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
    let operator = match a.operator(&headers) {
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
