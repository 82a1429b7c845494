//! MCP over Streamable HTTP (`cordis run --http ADDR`): many clients at once, each MCP
//! session (`Mcp-Session-Id`) one cordis session with its own root.
//!
//! The transport is rmcp's; this module puts the guards the MCP specification asks for in
//! front of it and runs it:
//!
//! - every request carries `Authorization: Bearer <token>` (compared in constant time; a
//!   missing or wrong one is answered `401` and logged without the token). The tokens are
//!   `CORDIS_HTTP_TOKEN` (one, or several separated by commas: one per client, whose
//!   2026-07-28 sessions are then theirs alone), else one generated at start into a `0600`
//!   file in the state directory whose path is logged;
//!   or, with `--auth oauth`, an authorization server's access tokens ([`oauth`]: the
//!   metadata, the challenges, and a scope per route);
//! - a loopback bind by default; a non-loopback bind only with an operator's token;
//! - `Origin` is validated (DNS-rebinding protection; `403` otherwise) and, on loopback,
//!   so is `Host` (loopback names, plus each `--allow-host` for a proxy that passes the
//!   client's);
//! - connections and sessions are bounded ([`connections`]; `--max-sessions`): past a cap
//!   the answer is `503` with `Retry-After`;
//! - with `--instance NAME` every session id starts with `NAME.` ([`sessions`]), so a
//!   proxy routes a session's requests to the host that made it;
//! - sessions end on `DELETE`, after an idle timeout, and at shutdown, and a session's
//!   calls are cancelled when it ends (a running command is killed);
//! - SIGTERM stops taking new sessions and calls, gives the calls in flight a deadline,
//!   then cancels what remains and closes the connections.
//!
//! A POST's answer is written in one piece when it comes soon ([`answers`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::extract::{ConnectInfo, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use connections::{Bounds, Connection, Table};
use http::{header, StatusCode};
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use subtle::ConstantTimeEq;
use tokio_util::sync::CancellationToken;

use cordis_engine::Runtime;

use crate::mcp::handles::Principal;
use crate::mcp::{hex, random_bytes, Hub, McpOptions, McpServer, Shutdown, ToolListNotifier};

mod answers;
mod approvals;
pub mod connections;
pub mod oauth;
pub mod sessions;

/// The environment variable an operator's bearer token comes from.
pub const TOKEN_ENV: &str = "CORDIS_HTTP_TOKEN";

/// The environment variable the operator's token comes from: it alone answers approvals
/// over HTTP (`/approvals`); a client's token never does.
pub const OPERATOR_TOKEN_ENV: &str = "CORDIS_OPERATOR_TOKEN";

/// The file a generated token is written to, in the state directory.
pub const TOKEN_FILE: &str = "http-token";

/// The path clients post to.
pub const MCP_PATH: &str = "/mcp";

/// The largest request body (rmcp's own bound).
const MAX_BODY: usize = 4 * 1024 * 1024;

/// How long the connections have at shutdown to finish writing their answers.
const ANSWERS_FLUSH: Duration = Duration::from_millis(500);

/// How the HTTP server runs.
#[derive(Clone, Debug)]
pub struct HttpOptions {
    /// Where to listen.
    pub addr: SocketAddr,
    /// The operator's bearer token; `None`: one is generated.
    pub token: Option<String>,
    /// The token that answers approvals (`/approvals`); `None`: approvals are answered
    /// only on this machine (`cordis approvals`).
    pub operator_token: Option<String>,
    /// Where a generated token is written.
    pub state_dir: PathBuf,
    /// Browser origins allowed besides the loopback ones (`http://localhost:*`, ...).
    pub allow_origins: Vec<String>,
    /// A session without requests for this long ends.
    pub idle_timeout: Duration,
    /// `Host` names allowed besides the loopback ones (a proxy's public name).
    pub allow_hosts: Vec<String>,
    /// This host's name in session ids (`NAME.<uuid>`), for a proxy to route by.
    pub instance: Option<String>,
    /// Sessions at once.
    pub max_sessions: usize,
    /// The bounds of the connections.
    pub bounds: Bounds,
    /// OAuth resource-server mode (`--auth oauth`) instead of bearer tokens of our own.
    pub oauth: Option<oauth::OAuthOptions>,
}

/// Serves MCP over HTTP until `shutdown` resolves; the calls in flight then run until its
/// give-up future resolves.
pub async fn serve_http(
    runtime: Arc<Runtime>,
    mcp: McpOptions,
    options: HttpOptions,
    notifier: ToolListNotifier,
    shutdown: impl Shutdown,
) -> anyhow::Result<()> {
    let loopback = options.addr.ip().is_loopback();
    let auth = match (&options.oauth, &options.token) {
        (Some(_), Some(_)) => anyhow::bail!(
            "{TOKEN_ENV} is set, but --auth oauth accepts only the issuer's access tokens: unset {TOKEN_ENV}, or drop --auth oauth"
        ),
        (Some(o), None) => {
            let o = o.clone();
            let resource = tokio::task::spawn_blocking(move || oauth::Resource::start(o))
                .await
                .context("the OAuth set-up failed")??;
            Auth::OAuth(Arc::new(resource))
        }
        (None, _) => Auth::Tokens(client_tokens(&options)?),
    };
    let operator_token = match &options.operator_token {
        Some(t) => {
            check_token(t).map_err(|e| anyhow::anyhow!("{OPERATOR_TOKEN_ENV}: {e}"))?;
            if let Auth::Tokens(tokens) = &auth {
                if tokens.iter().any(|c| c == t) {
                    anyhow::bail!(
                        "{OPERATOR_TOKEN_ENV} is also a client's token ({TOKEN_ENV}): a client could then approve its own escalations; choose another secret"
                    );
                }
            }
            Some(t.clone())
        }
        None => None,
    };
    let hub = Hub::new(runtime, &mcp, Some(options.idle_timeout))?;
    hub.handles
        .configure(options.instance.as_deref(), options.max_sessions);
    // The sessions of 2026-07-28 clients end after the idle timeout too.
    let sweeper = {
        let hub = Arc::downgrade(&hub);
        let every =
            (options.idle_timeout / 4).clamp(Duration::from_millis(250), Duration::from_secs(30));
        let idle = options.idle_timeout;
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(hub) = hub.upgrade() else { break };
                hub.handles.sweep(idle);
            }
        })
    };
    let listener = tokio::net::TcpListener::bind(options.addr)
        .await
        .with_context(|| format!("cannot listen on {}", options.addr))?;
    let local = listener
        .local_addr()
        .context("cannot read the listening address")?;

    let sessions_end = CancellationToken::new();
    let sessions = sessions::Sessions::new(options.instance.as_deref(), options.idle_timeout);
    let mut origins: Vec<String> = ["http://localhost:*", "http://127.0.0.1:*", "http://[::1]:*"]
        .into_iter()
        .map(String::from)
        .collect();
    origins.extend(options.allow_origins.iter().cloned());
    let mut config = StreamableHttpServerConfig::default()
        .with_cancellation_token(sessions_end.child_token())
        .with_allowed_origins(origins)
        .enforce_origin_validation();
    config = if loopback {
        let mut hosts: Vec<String> = ["localhost", "127.0.0.1", "::1", "[::1]"]
            .into_iter()
            .map(String::from)
            .collect();
        hosts.extend(options.allow_hosts.iter().cloned());
        config.with_allowed_hosts(hosts)
    } else if !options.allow_hosts.is_empty() {
        config.with_allowed_hosts(options.allow_hosts.clone())
    } else {
        // Reached by name or address from elsewhere (and behind proxies): the token guards.
        config.disable_allowed_hosts()
    };
    let factory_hub = hub.clone();
    let service: StreamableHttpService<McpServer, sessions::Sessions> = StreamableHttpService::new(
        move || Ok(McpServer::attach(factory_hub.clone())),
        Arc::new(sessions),
        config,
    );
    let auth = Arc::new(auth);
    let guard = |scope| {
        axum::middleware::from_fn_with_state(
            Arc::new(Guard {
                auth: auth.clone(),
                scope,
            }),
            require_token,
        )
    };
    let mcp_routes = axum::Router::new()
        .nest_service(MCP_PATH, service)
        .layer(axum::middleware::from_fn(answers::whole_when_quick))
        .layer(axum::middleware::from_fn_with_state(
            Arc::new(Gate {
                hub: hub.clone(),
                max_sessions: options.max_sessions,
            }),
            session_gate,
        ))
        .layer(guard(oauth::SCOPE_TOOLS));
    // Health and readiness answer anyone and say nothing else; the metrics take the token.
    let metrics_routes = axum::Router::new()
        .route(METRICS_PATH, axum::routing::get(metrics))
        .with_state(hub.clone())
        .layer(guard(oauth::SCOPE_METRICS));
    let resource = match &*auth {
        Auth::OAuth(resource) => Some(resource.clone()),
        Auth::Tokens(_) => None,
    };
    let approval_routes = axum::Router::new()
        .route(APPROVALS_PATH, axum::routing::get(approvals::list))
        .route(
            &format!("{APPROVALS_PATH}/{{id}}/{{decision}}"),
            axum::routing::post(approvals::answer),
        )
        .with_state(Arc::new(approvals::Approvals {
            hub: hub.clone(),
            token: operator_token,
            oauth: resource.clone(),
        }));
    let mut app = axum::Router::new()
        .route(HEALTH_PATH, axum::routing::get(|| async { "ok\n" }))
        .route(READY_PATH, axum::routing::get(ready))
        .with_state(hub.clone())
        .merge(metrics_routes)
        .merge(approval_routes)
        .merge(mcp_routes);
    // The metadata a client discovers the authorization server by: public, like the
    // issuer's own.
    if let Some(resource) = resource {
        let document = format!("{}\n", resource.metadata());
        for path in resource.metadata_paths() {
            let document = document.clone();
            app = app.route(
                &path,
                axum::routing::get(move || async move {
                    ([(header::CONTENT_TYPE, "application/json")], document)
                }),
            );
        }
    }

    let forward = hub.forward_tool_changes(&notifier);
    let stop_accepting = CancellationToken::new();
    let server = tokio::spawn(connections::serve(
        listener,
        app,
        options.bounds,
        Arc::new(Table::default()),
        stop_accepting.clone(),
    ));
    tracing::info!(
        "serving MCP over Streamable HTTP at http://{local}{MCP_PATH} (sessions end after {} s idle)",
        options.idle_timeout.as_secs()
    );
    // Connections stay open while the calls in flight finish (a client may still fetch
    // what it needs to read a result); new sessions and new calls are refused.
    let give_up = shutdown.await;
    hub.drain(give_up).await;
    // No new connections; the answers being written finish (a session's standing event
    // stream never does, so it is not waited for long), then the sessions end.
    stop_accepting.cancel();
    tokio::pin!(server);
    let finished = tokio::time::timeout(ANSWERS_FLUSH, &mut server).await;
    sessions_end.cancel();
    forward.abort();
    sweeper.abort();
    let finished = match finished {
        Ok(finished) => Ok(finished),
        Err(_) => tokio::time::timeout(Duration::from_secs(5), server).await,
    };
    match finished {
        Ok(Ok(())) | Err(_) => Ok(()),
        Ok(Err(e)) => Err(anyhow::Error::new(e).context("the HTTP server failed")),
    }
}

/// Liveness: answered while the process serves.
pub const HEALTH_PATH: &str = "/healthz";
/// Readiness: `200` while the composition is applied and the server takes new sessions and
/// calls, `503` while it drains.
pub const READY_PATH: &str = "/readyz";
/// The Prometheus metrics ([`crate::metrics`]), behind the bearer token.
pub const METRICS_PATH: &str = "/metrics";
/// The approvals waiting for a person (`GET`), and each one's answer (`POST
/// /approvals/<id>/approve|deny`), behind the operator's token.
pub const APPROVALS_PATH: &str = "/approvals";

async fn ready(State(hub): State<Arc<Hub>>) -> Response {
    if hub.is_closing() {
        (StatusCode::SERVICE_UNAVAILABLE, "draining\n").into_response()
    } else {
        "ready\n".into_response()
    }
}

async fn metrics(State(hub): State<Arc<Hub>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        crate::metrics::metrics().render(hub.connections()),
    )
        .into_response()
}

/// How requests authenticate.
enum Auth {
    /// Bearer tokens of our own (one per client, or one for all).
    Tokens(Vec<String>),
    /// An authorization server's access tokens.
    OAuth(Arc<oauth::Resource>),
}

/// What a group of routes requires.
struct Guard {
    auth: Arc<Auth>,
    /// The OAuth scope a token needs here (our own tokens may do everything a client may).
    scope: &'static str,
}

/// The client tokens of `CORDIS_HTTP_TOKEN`, or one generated into the state directory.
fn client_tokens(options: &HttpOptions) -> anyhow::Result<Vec<String>> {
    match &options.token {
        Some(tokens) => {
            let tokens: Vec<String> = tokens
                .split(',')
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(String::from)
                .collect();
            if tokens.is_empty() {
                check_token("")?;
            }
            for token in &tokens {
                check_token(token)?;
            }
            Ok(tokens)
        }
        None if !options.addr.ip().is_loopback() => anyhow::bail!(
            "refusing to listen on {} without a bearer token: a non-loopback address is reachable from other machines; set {TOKEN_ENV} to a secret of at least 16 characters, run as an OAuth resource server (--auth oauth), or listen on 127.0.0.1 behind a reverse proxy",
            options.addr
        ),
        None => {
            let (token, file) = generate_token(&options.state_dir)?;
            tracing::info!(
                "generated a bearer token for this run into {} (mode 0600); clients send `Authorization: Bearer <token>`; set {TOKEN_ENV} to choose it",
                file.display()
            );
            Ok(vec![token])
        }
    }
}

/// The token of `Authorization: Bearer <token>`.
pub(super) fn bearer(headers: &http::HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
}

/// Lets a request through only with a valid token: one of ours, or an access token of the
/// issuer with the route's scope.
async fn require_token(
    State(guard): State<Arc<Guard>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
    next: Next,
) -> Response {
    let presented = bearer(request.headers());
    let principal = match &*guard.auth {
        Auth::Tokens(expected) => {
            // Every token is compared, so the time taken does not tell which one nearly
            // matched.
            let matched = presented.and_then(|token| {
                expected.iter().enumerate().fold(None, |found, (i, t)| {
                    let same = bool::from(token.as_bytes().ct_eq(t.as_bytes()));
                    found.or(same.then_some(i))
                })
            });
            match matched {
                Some(i) => Principal::token(i),
                None => {
                    tracing::warn!(
                        %peer,
                        method = %request.method(),
                        "refused an HTTP request with {} (401)",
                        if presented.is_some() {
                            "a wrong bearer token"
                        } else {
                            "no bearer token"
                        }
                    );
                    // The connection closes with the answer: holding one takes a token.
                    return (
                        StatusCode::UNAUTHORIZED,
                        [(header::WWW_AUTHENTICATE, "Bearer"), (header::CONNECTION, "close")],
                        format!("a bearer token is required: send `Authorization: Bearer <token>` with the server's token ({TOKEN_ENV}, or the token file it logged at start)\n"),
                    )
                        .into_response();
                }
            }
        }
        Auth::OAuth(resource) => match resource.authorize(presented, guard.scope).await {
            Ok(claims) => Principal::subject(&claims.subject),
            Err(refusal) => {
                let from = format!("{peer} {} {}", request.method(), request.uri().path());
                return oauth_refusal(resource, &refusal, guard.scope, &from);
            }
        },
    };
    let mut request = request;
    if let Some(connection) = request.extensions().get::<Arc<Connection>>() {
        connection.prove();
    }
    request.extensions_mut().insert(principal);
    next.run(request).await
}

/// The answer to a request `resource` refused: `401` with the challenge that names the
/// metadata, or `403` naming the scope needed.
pub(super) fn oauth_refusal(
    resource: &oauth::Resource,
    refusal: &oauth::Refusal,
    scope: &str,
    from: &str,
) -> Response {
    let (status, why) = match refusal {
        oauth::Refusal::Missing => (StatusCode::UNAUTHORIZED, "no bearer token".to_string()),
        oauth::Refusal::Invalid(why) => (StatusCode::UNAUTHORIZED, why.clone()),
        oauth::Refusal::Scope(needed) => (
            StatusCode::FORBIDDEN,
            format!("a token without the scope {needed}"),
        ),
    };
    tracing::warn!(
        request = from,
        "refused an HTTP request with {why} ({})",
        status.as_u16()
    );
    let challenge = resource.challenge(refusal, scope);
    let body = match refusal {
        oauth::Refusal::Missing => "an access token is required: send `Authorization: Bearer <token>` with a token of this server's authorization server (see WWW-Authenticate's resource_metadata)\n".to_string(),
        oauth::Refusal::Invalid(why) => format!("the access token is refused: {why}\n"),
        oauth::Refusal::Scope(needed) => format!("the access token lacks the scope {needed}, which this needs\n"),
    };
    let mut response = (status, body).into_response();
    if let Ok(value) = http::HeaderValue::from_str(&challenge) {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, value);
    }
    if status == StatusCode::UNAUTHORIZED {
        response
            .headers_mut()
            .insert(header::CONNECTION, http::HeaderValue::from_static("close"));
    }
    response
}

/// What decides whether a session may start.
struct Gate {
    hub: Arc<Hub>,
    max_sessions: usize,
}

/// While the server shuts down, or while `--max-sessions` sessions are live, no session
/// starts (`503` with `Retry-After`). A session the client ended (`DELETE`, accepted) has
/// its calls cancelled at once; the transport itself would let them run while it drains.
async fn session_gate(State(gate): State<Arc<Gate>>, request: Request, next: Next) -> Response {
    let session = request
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let starts = session.is_none() && request.method() == http::Method::POST;
    if starts && gate.hub.is_closing() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "5")],
            "the server is shutting down and starts no new sessions\n",
        )
            .into_response();
    }
    // Whether the request is an `initialize`, which makes an MCP session (by its body: a
    // header could say anything). A 2026-07-28 request's session, if it needs a new one,
    // is bounded where it is made.
    let (request, initialize) = if starts {
        let (parts, body) = request.into_parts();
        let bytes = match axum::body::to_bytes(body, MAX_BODY).await {
            Ok(bytes) => bytes,
            Err(_) => {
                return (
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("a request body may hold at most {MAX_BODY} bytes\n"),
                )
                    .into_response()
            }
        };
        let initialize = serde_json::from_slice::<serde_json::Value>(&bytes)
            .is_ok_and(|v| v["method"] == "initialize");
        (
            Request::from_parts(parts, axum::body::Body::from(bytes)),
            initialize,
        )
    } else {
        (request, false)
    };
    let live = gate.hub.connections();
    if initialize && live >= gate.max_sessions {
        tracing::warn!(
            live,
            "refused a new session: {} sessions are live, the most this server keeps (--max-sessions) (503)",
            gate.max_sessions
        );
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "5")],
            format!(
                "the server has {live} sessions live, the most it keeps (--max-sessions {}); retry when one has ended\n",
                gate.max_sessions
            ),
        )
            .into_response();
    }
    let ending = session.filter(|_| request.method() == http::Method::DELETE);
    let response = next.run(request).await;
    if let Some(id) = ending.filter(|_| response.status().is_success()) {
        gate.hub.end_mcp_session(&id);
    }
    response
}

/// An operator's token must be long enough to resist guessing.
fn check_token(token: &str) -> anyhow::Result<()> {
    if token.chars().count() < 16 || token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        anyhow::bail!(
            "{TOKEN_ENV} must be at least 16 characters without spaces or control characters; generate one with `head -c 32 /dev/urandom | base64`"
        );
    }
    Ok(())
}

/// A fresh random token, written atomically to a `0600` file in `state_dir`.
fn generate_token(state_dir: &Path) -> anyhow::Result<(String, PathBuf)> {
    use std::io::Write;
    let token = hex(&random_bytes(32).context("cannot make a bearer token")?);
    let path = state_dir.join(TOKEN_FILE);
    let write = || -> std::io::Result<()> {
        cordis_engine::private_dir(state_dir, Path::new(""))?;
        // A temporary file is created 0600 and renamed into place: the token is never
        // readable by others, nor half-written.
        let mut file = tempfile::NamedTempFile::new_in(state_dir)?;
        file.write_all(format!("{token}\n").as_bytes())?;
        file.as_file().sync_all()?;
        file.persist(&path).map_err(|e| e.error)?;
        Ok(())
    };
    write().with_context(|| format!("cannot write the bearer token to {}", path.display()))?;
    Ok((token, path))
}
