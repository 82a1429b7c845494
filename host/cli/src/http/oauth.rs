//! OAuth 2.1 resource-server mode (`cordis run --http ADDR --auth oauth`): the server
//! accepts the access tokens an authorization server issues for it, as the MCP
//! authorization specification asks of a remote server.
//!
//! - Protected Resource Metadata (RFC 9728) at `/.well-known/oauth-protected-resource`
//!   (and at that path followed by the resource's own path), naming the resource (this
//!   server's canonical URI, the tokens' audience), its authorization server and the scopes;
//! - `401` with `WWW-Authenticate: Bearer resource_metadata="…"` for a missing or invalid
//!   token, `403` with `error="insufficient_scope"` and the scope needed;
//! - a token is a JWT signed by one of the issuer's keys (its JWKS, from `--oauth-jwks` or
//!   the issuer's metadata, RFC 8414 or OpenID discovery): asymmetric algorithms only, never
//!   a shared secret; `iss`, `aud`, `exp` and `sub` required, `aud` this server's canonical
//!   URI, `nbf` honoured, a minute's leeway for clocks. An unknown key id fetches the JWKS
//!   again (key rotation), at most once every [`REFRESH_EVERY`];
//! - scopes ([`SCOPE_TOOLS`], [`SCOPE_APPROVALS`], [`SCOPE_METRICS`]) decide what a token
//!   may do; a session belongs to its token's subject (`iss` and `sub`).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, JwkSet, PublicKeyUse};
use jsonwebtoken::{errors::ErrorKind, Algorithm, DecodingKey, Validation};
use serde::Deserialize;

/// The scope a token needs for MCP (`/mcp`): tools, sessions, everything a client does.
pub const SCOPE_TOOLS: &str = "cordis:tools";
/// The scope a token needs to list and answer approvals over HTTP (`/approvals`). Grant it
/// to the people who approve escalations, never to an agent's client: a client holding it
/// could approve its own.
pub const SCOPE_APPROVALS: &str = "cordis:approvals";
/// The scope a token needs to read `/metrics`.
pub const SCOPE_METRICS: &str = "cordis:metrics";

/// Where the Protected Resource Metadata is served (RFC 9728 §3).
pub const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";

/// The least time between two fetches of the JWKS for an unknown key id.
pub const REFRESH_EVERY: Duration = Duration::from_secs(30);
/// How long a fetch from the authorization server may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest metadata document or JWKS read.
const MAX_DOCUMENT: u64 = 1024 * 1024;
/// How long a verified token is remembered at most (it is never past its `exp`).
pub const REMEMBER_FOR: Duration = Duration::from_secs(300);
/// The most verified tokens remembered.
const REMEMBERED: usize = 4096;
/// The most keys kept from one JWKS.
const MAX_KEYS: usize = 64;

/// What `--auth oauth` was given.
#[derive(Clone, Debug)]
pub struct OAuthOptions {
    /// The authorization server's issuer identifier (`iss`).
    pub issuer: String,
    /// This server's canonical URI, e.g. `https://mcp.example.com/mcp`: the audience
    /// (`aud`) its tokens must name, and the `resource` of its metadata.
    pub audience: String,
    /// The issuer's JWKS; `None`: discovered from the issuer's metadata.
    pub jwks: Option<String>,
}

/// What a valid token says about its bearer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claims {
    /// `iss` and `sub`: whose the token is.
    pub subject: String,
    /// The scopes granted (`scope`, space-separated, or `scp`, a list).
    pub scopes: BTreeSet<String>,
}

/// Why a request is refused.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No bearer token.
    Missing,
    /// A token that is not valid here, and why (safe to show: it names no secret).
    Invalid(String),
    /// A valid token without the scope needed.
    Scope(&'static str),
}

/// A key of the issuer and the algorithms it verifies.
struct Key {
    key: DecodingKey,
    algorithms: Vec<Algorithm>,
}

#[derive(Default)]
struct Keys {
    by_id: HashMap<String, Arc<Key>>,
    /// Keys without a `kid`: tried for a token without one.
    unnamed: Vec<Arc<Key>>,
}

/// This server as an OAuth resource server.
pub struct Resource {
    options: OAuthOptions,
    jwks_url: String,
    /// The absolute URL of this server's metadata, for the challenges.
    metadata_url: String,
    keys: RwLock<Keys>,
    /// When the JWKS was last fetched, behind the lock one refresh at a time takes.
    fetched: tokio::sync::Mutex<Instant>,
    agent: ureq::Agent,
    /// Tokens verified, with their claims, until they expire or [`REMEMBER_FOR`] passes:
    /// a client sends the same token with every request, and a signature is checked once.
    verified: Mutex<HashMap<String, (Claims, Instant)>>,
}

impl std::fmt::Debug for Resource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resource")
            .field("issuer", &self.options.issuer)
            .field("audience", &self.options.audience)
            .field("jwks", &self.jwks_url)
            .finish()
    }
}

impl Resource {
    /// Checks the options, discovers the JWKS when none is given, and fetches it: a server
    /// that cannot validate a token does not start. Blocks on the network.
    pub fn start(options: OAuthOptions) -> anyhow::Result<Resource> {
        let issuer = checked_url("--oauth-issuer", &options.issuer)?;
        let audience = checked_url("--oauth-audience", &options.audience)?;
        if issuer.query().is_some() {
            anyhow::bail!(
                "--oauth-issuer {}: an issuer identifier has no query (RFC 8414 §2); give the issuer exactly as its tokens' `iss` names it",
                options.issuer
            );
        }
        let loopback_only = is_loopback(&issuer)
            && options
                .jwks
                .as_deref()
                .is_none_or(|j| url::Url::parse(j).is_ok_and(|u| is_loopback(&u)));
        let agent = crate::outbound::agent(FETCH_TIMEOUT, |config| {
            config
                .https_only(!loopback_only)
                .max_redirects(3)
                // A proxy cannot reach this machine's loopback.
                .proxy(if loopback_only {
                    None
                } else {
                    ureq::Proxy::try_from_env()
                })
        });
        let jwks_url = match &options.jwks {
            Some(jwks) => checked_url("--oauth-jwks", jwks)?.to_string(),
            None => discover(&agent, &options.issuer, &issuer)?,
        };
        let keys = fetch_keys(&agent, &jwks_url)?;
        let resource = Resource::new(options, &audience, jwks_url, keys, agent);
        tracing::info!(
            issuer = %resource.options.issuer,
            audience = %resource.options.audience,
            jwks = %resource.jwks_url,
            "accepting OAuth access tokens from {} for {}",
            resource.options.issuer,
            resource.options.audience
        );
        Ok(resource)
    }

    fn new(
        options: OAuthOptions,
        audience: &url::Url,
        jwks_url: String,
        keys: Keys,
        agent: ureq::Agent,
    ) -> Resource {
        Resource {
            options,
            jwks_url,
            metadata_url: metadata_url(audience),
            keys: RwLock::new(keys),
            // The first unknown key id may fetch at once: a key rotated in just after start.
            fetched: tokio::sync::Mutex::new(
                Instant::now()
                    .checked_sub(REFRESH_EVERY)
                    .unwrap_or_else(Instant::now),
            ),
            agent,
            verified: Mutex::new(HashMap::new()),
        }
    }

    /// A resource server that verifies with the keys of `jwks` (a JWKS document), fetched
    /// elsewhere: nothing is fetched now, and a key id it does not know is fetched from
    /// `options.jwks` (when given) as [`Resource::start`]'s would be.
    pub fn from_jwks(options: OAuthOptions, jwks: &str) -> anyhow::Result<Resource> {
        checked_url("--oauth-issuer", &options.issuer)?;
        let audience = checked_url("--oauth-audience", &options.audience)?;
        let keys = parse_keys(jwks, "the JWKS given")?;
        let jwks_url = options.jwks.clone().unwrap_or_default();
        let agent = crate::outbound::agent(FETCH_TIMEOUT, |config| config);
        Ok(Resource::new(options, &audience, jwks_url, keys, agent))
    }

    /// The Protected Resource Metadata document.
    pub fn metadata(&self) -> serde_json::Value {
        serde_json::json!({
            "resource": self.options.audience,
            "authorization_servers": [self.options.issuer],
            "scopes_supported": [SCOPE_TOOLS, SCOPE_APPROVALS, SCOPE_METRICS],
            "bearer_methods_supported": ["header"],
            "resource_name": "cordis",
        })
    }

    /// The paths the metadata is served at: the well-known path, and that path followed by
    /// the resource's own (RFC 9728 §3.1).
    pub fn metadata_paths(&self) -> Vec<String> {
        let mut paths = vec![METADATA_PATH.to_string()];
        if let Ok(url) = url::Url::parse(&self.options.audience) {
            let path = url.path().trim_end_matches('/');
            if !path.is_empty() {
                paths.push(format!("{METADATA_PATH}{path}"));
            }
        }
        paths
    }

    /// The `WWW-Authenticate` value for `refusal`.
    pub fn challenge(&self, refusal: &Refusal, scope: &str) -> String {
        let metadata = &self.metadata_url;
        match refusal {
            Refusal::Missing => {
                format!(r#"Bearer resource_metadata="{metadata}", scope="{scope}""#)
            }
            Refusal::Invalid(why) => format!(
                r#"Bearer error="invalid_token", error_description="{}", resource_metadata="{metadata}""#,
                quoted(why)
            ),
            Refusal::Scope(needed) => format!(
                r#"Bearer error="insufficient_scope", scope="{needed}", resource_metadata="{metadata}", error_description="this needs the scope {needed}""#
            ),
        }
    }

    /// The claims of `token` if it is valid here and carries `scope`.
    pub async fn authorize(
        self: &Arc<Self>,
        token: Option<&str>,
        scope: &'static str,
    ) -> Result<Claims, Refusal> {
        let token = token.ok_or(Refusal::Missing)?;
        let claims = self.validate(token).await?;
        if claims.scopes.contains(scope) {
            Ok(claims)
        } else {
            Err(Refusal::Scope(scope))
        }
    }

    /// The claims of `token` if it is valid here, whatever its scopes.
    pub async fn validate(self: &Arc<Self>, token: &str) -> Result<Claims, Refusal> {
        if let Some(claims) = self.remembered(token) {
            return Ok(claims);
        }
        let header = jsonwebtoken::decode_header(token)
            .map_err(|_| Refusal::Invalid("the bearer token is not a signed JWT".into()))?;
        if matches!(
            header.alg,
            Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512
        ) {
            return Err(Refusal::Invalid(format!(
                "the token is signed with {:?}, a shared secret; this server accepts only the issuer's public keys",
                header.alg
            )));
        }
        let mut candidates = self.candidates(header.kid.as_deref());
        if candidates.is_empty() {
            if let Some(kid) = header.kid.as_deref() {
                // A key the issuer may have rotated in since the JWKS was fetched.
                self.refresh().await;
                candidates = self.candidates(Some(kid));
            }
        }
        if candidates.is_empty() {
            return Err(Refusal::Invalid(match header.kid {
                Some(kid) => format!("the token's key id `{kid}` is not one of the issuer's keys"),
                None => {
                    "the token names no key id and no key of the issuer without one matches".into()
                }
            }));
        }
        let mut validation = Validation::new(header.alg);
        validation.set_issuer(&[&self.options.issuer]);
        validation.set_audience(&[&self.options.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        validation.validate_nbf = true;
        let mut last = Refusal::Invalid(format!(
            "no key of the issuer verifies a token signed with {:?}",
            header.alg
        ));
        for key in candidates
            .iter()
            .filter(|k| k.algorithms.contains(&header.alg))
        {
            match jsonwebtoken::decode::<RawClaims>(token, &key.key, &validation) {
                Ok(data) => {
                    let expires = data.claims.exp;
                    let claims = data.claims.into_claims();
                    self.remember(token, &claims, expires);
                    return Ok(claims);
                }
                Err(e) => {
                    last = Refusal::Invalid(describe(e.kind(), &self.options));
                    if !matches!(e.kind(), ErrorKind::InvalidSignature) {
                        break;
                    }
                }
            }
        }
        Err(last)
    }

    fn remembered(&self, token: &str) -> Option<Claims> {
        let verified = self.verified.lock().unwrap_or_else(|e| e.into_inner());
        verified
            .get(token)
            .filter(|(_, until)| Instant::now() < *until)
            .map(|(claims, _)| claims.clone())
    }

    /// Remembers a token verified now, until `expires` (seconds since the epoch) or
    /// [`REMEMBER_FOR`], whichever comes first.
    fn remember(&self, token: &str, claims: &Claims, expires: u64) {
        let left = expires.saturating_sub(jsonwebtoken::get_current_timestamp());
        let until = Instant::now() + Duration::from_secs(left).min(REMEMBER_FOR);
        let mut verified = self.verified.lock().unwrap_or_else(|e| e.into_inner());
        if verified.len() >= REMEMBERED {
            let now = Instant::now();
            verified.retain(|_, (_, until)| now < *until);
            if verified.len() >= REMEMBERED {
                verified.clear();
            }
        }
        verified.insert(token.to_string(), (claims.clone(), until));
    }

    fn candidates(&self, kid: Option<&str>) -> Vec<Arc<Key>> {
        let keys = self.keys.read().unwrap_or_else(|e| e.into_inner());
        match kid {
            Some(kid) => keys.by_id.get(kid).cloned().into_iter().collect(),
            None => keys.unnamed.clone(),
        }
    }

    /// Fetches the JWKS again unless it was fetched within [`REFRESH_EVERY`]; one fetch at
    /// a time, and the requests waiting for it see its keys.
    async fn refresh(self: &Arc<Self>) {
        let mut fetched = self.fetched.lock().await;
        if fetched.elapsed() < REFRESH_EVERY {
            return;
        }
        *fetched = Instant::now();
        let this = self.clone();
        match tokio::task::spawn_blocking(move || this.fetch_keys()).await {
            Ok(Ok(keys)) => {
                tracing::info!(
                    jwks = %self.jwks_url,
                    keys = keys.by_id.len() + keys.unnamed.len(),
                    "fetched the issuer's keys again for a key id this server did not know"
                );
                *self.keys.write().unwrap_or_else(|e| e.into_inner()) = keys;
            }
            // The keys known stay: a failed fetch does not make valid tokens invalid.
            Ok(Err(e)) => tracing::warn!("{e:#}"),
            Err(e) => tracing::warn!("fetching the issuer's keys failed: {e}"),
        }
    }

    /// The usable keys of the JWKS, fetched now.
    fn fetch_keys(&self) -> anyhow::Result<Keys> {
        fetch_keys(&self.agent, &self.jwks_url)
    }
}

/// The usable keys of the JWKS at `url`, fetched now.
fn fetch_keys(agent: &ureq::Agent, url: &str) -> anyhow::Result<Keys> {
    let body = fetch(agent, url)
        .with_context(|| format!("cannot fetch the issuer's keys (JWKS) from {url}"))?;
    parse_keys(&body, url)
}

/// The usable keys of a JWKS read from `from`.
fn parse_keys(body: &str, from: &str) -> anyhow::Result<Keys> {
    let set: JwkSet = serde_json::from_str(body)
        .with_context(|| format!("{from} is not a JWKS (a JSON object with `keys`)"))?;
    let mut keys = Keys::default();
    for jwk in set.keys.iter().take(MAX_KEYS) {
        let Some(key) = usable(jwk) else { continue };
        match &jwk.common.key_id {
            Some(kid) => {
                keys.by_id.insert(kid.clone(), Arc::new(key));
            }
            None => keys.unnamed.push(Arc::new(key)),
        }
    }
    if keys.by_id.is_empty() && keys.unnamed.is_empty() {
        anyhow::bail!(
            "the JWKS at {from} has no key this server can verify a token with (RSA, P-256, P-384 or Ed25519 signing keys; never a shared secret)"
        );
    }
    Ok(keys)
}

/// Where the metadata of the resource `audience` is: the well-known path followed by the
/// audience's (RFC 9728 §3.1).
fn metadata_url(audience: &url::Url) -> String {
    let mut url = audience.clone();
    url.set_query(None);
    let path = audience.path().trim_end_matches('/');
    url.set_path(&format!("{METADATA_PATH}{path}"));
    url.to_string()
}

/// The claims read from a token (after its signature and the registered claims are
/// checked).
#[derive(Deserialize)]
struct RawClaims {
    /// Required and checked before these are read; optional here so that a token without
    /// them is refused for that, by name.
    #[serde(default)]
    iss: Option<String>,
    #[serde(default)]
    sub: Option<String>,
    /// Required and checked: a token is remembered until then at most.
    #[serde(default)]
    exp: u64,
    #[serde(default)]
    scope: Option<String>,
    /// The list some issuers use instead of `scope`.
    #[serde(default)]
    scp: Option<Scopes>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Scopes {
    List(Vec<String>),
    Line(String),
}

impl RawClaims {
    fn into_claims(self) -> Claims {
        let mut scopes: BTreeSet<String> = self
            .scope
            .iter()
            .flat_map(|s| s.split_ascii_whitespace())
            .map(String::from)
            .collect();
        match self.scp {
            Some(Scopes::List(list)) => scopes.extend(list),
            Some(Scopes::Line(line)) => {
                scopes.extend(line.split_ascii_whitespace().map(String::from));
            }
            None => {}
        }
        Claims {
            subject: format!(
                "{} {}",
                self.iss.unwrap_or_default(),
                self.sub.unwrap_or_default()
            ),
            scopes,
        }
    }
}

/// A key this server verifies signatures with, or `None` for one it must not (a shared
/// secret, an encryption key, an algorithm it does not implement).
fn usable(jwk: &Jwk) -> Option<Key> {
    if matches!(
        jwk.common.public_key_use,
        Some(PublicKeyUse::Encryption | PublicKeyUse::Other(_))
    ) {
        return None;
    }
    let family: &[Algorithm] = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => &[
            Algorithm::RS256,
            Algorithm::RS384,
            Algorithm::RS512,
            Algorithm::PS256,
            Algorithm::PS384,
            Algorithm::PS512,
        ],
        AlgorithmParameters::EllipticCurve(p) => match p.curve {
            EllipticCurve::P256 => &[Algorithm::ES256],
            EllipticCurve::P384 => &[Algorithm::ES384],
            _ => return None,
        },
        AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => {
            &[Algorithm::EdDSA]
        }
        _ => return None,
    };
    let algorithms: Vec<Algorithm> = match jwk.common.key_algorithm {
        Some(alg) => {
            let alg: Algorithm = alg.to_string().parse().ok()?;
            family.contains(&alg).then(|| vec![alg])?
        }
        None => family.to_vec(),
    };
    let key = DecodingKey::from_jwk(jwk).ok()?;
    Some(Key { key, algorithms })
}

/// Why a token failed validation, for its bearer.
fn describe(kind: &ErrorKind, options: &OAuthOptions) -> String {
    match kind {
        ErrorKind::ExpiredSignature => "the token has expired".into(),
        ErrorKind::ImmatureSignature => "the token is not valid yet (nbf)".into(),
        ErrorKind::InvalidAudience => format!(
            "the token is not for this server: its audience (aud) must be {}",
            options.audience
        ),
        ErrorKind::InvalidIssuer => format!(
            "the token is not from this server's issuer: its iss must be {}",
            options.issuer
        ),
        ErrorKind::InvalidSignature => "the token's signature does not verify".into(),
        ErrorKind::MissingRequiredClaim(claim) => format!("the token has no `{claim}` claim"),
        ErrorKind::InvalidAlgorithm => "the token's algorithm does not match its key".into(),
        _ => "the token is malformed".into(),
    }
}

/// `value` inside a quoted-string of a header: no quotes, backslashes or controls.
fn quoted(value: &str) -> String {
    value
        .chars()
        .map(|c| match c {
            '"' | '\\' => '\'',
            ' ' => ' ',
            c if c.is_ascii_graphic() => c,
            _ => '?',
        })
        .take(200)
        .collect()
}

/// An absolute `https` URL, or `http` on a loopback host (an issuer on this machine).
fn checked_url(flag: &str, value: &str) -> anyhow::Result<url::Url> {
    let url =
        url::Url::parse(value).with_context(|| format!("{flag} {value}: not an absolute URL"))?;
    if url.fragment().is_some() {
        anyhow::bail!("{flag} {value}: a URL with a fragment (#...) cannot identify a server");
    }
    match url.scheme() {
        "https" => Ok(url),
        "http" if is_loopback(&url) => Ok(url),
        _ => anyhow::bail!(
            "{flag} {value}: must be an https URL (http only on this machine's loopback: localhost, 127.0.0.1, [::1])"
        ),
    }
}

fn is_loopback(url: &url::Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

/// The body of a `GET url` answered `200`, at most [`MAX_DOCUMENT`] bytes.
fn fetch(agent: &ureq::Agent, url: &str) -> anyhow::Result<String> {
    let mut response = agent
        .get(url)
        .header("accept", "application/json")
        .call()
        .map_err(|e| anyhow::anyhow!("GET {url}: {e}"))?;
    response
        .body_mut()
        .with_config()
        .limit(MAX_DOCUMENT)
        .read_to_string()
        .map_err(|e| anyhow::anyhow!("GET {url}: {e}"))
}

/// The issuer's `jwks_uri`, from its authorization server metadata (RFC 8414) or its
/// OpenID configuration, in the order the MCP authorization specification gives; the
/// document must name the same issuer (RFC 8414 §3.3).
fn discover(agent: &ureq::Agent, issuer: &str, url: &url::Url) -> anyhow::Result<String> {
    let origin = url.origin().ascii_serialization();
    let path = url.path().trim_end_matches('/');
    let candidates = if path.is_empty() {
        vec![
            format!("{origin}/.well-known/oauth-authorization-server"),
            format!("{origin}/.well-known/openid-configuration"),
        ]
    } else {
        vec![
            format!("{origin}/.well-known/oauth-authorization-server{path}"),
            format!("{origin}/.well-known/openid-configuration{path}"),
            format!("{origin}{path}/.well-known/openid-configuration"),
        ]
    };
    #[derive(Deserialize)]
    struct Metadata {
        issuer: String,
        jwks_uri: Option<String>,
    }
    let mut tried = Vec::new();
    for candidate in &candidates {
        let body = match fetch(agent, candidate) {
            Ok(body) => body,
            Err(e) => {
                tried.push(format!("{e}"));
                continue;
            }
        };
        let metadata: Metadata = serde_json::from_str(&body)
            .with_context(|| format!("{candidate} is not authorization server metadata"))?;
        if metadata.issuer != issuer {
            anyhow::bail!(
                "{candidate} names the issuer {}, not {issuer}: refusing metadata of another issuer (RFC 8414 §3.3); give --oauth-issuer exactly as the issuer names itself",
                metadata.issuer
            );
        }
        let jwks = metadata.jwks_uri.with_context(|| {
            format!("{candidate} names no jwks_uri: give the issuer's keys with --oauth-jwks URL")
        })?;
        return Ok(checked_url("the issuer's jwks_uri", &jwks)?.to_string());
    }
    anyhow::bail!(
        "cannot discover the keys of the issuer {issuer}: {}; check --oauth-issuer, or give the keys with --oauth-jwks URL",
        tried.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_come_from_scope_and_scp() {
        let raw: RawClaims = serde_json::from_value(serde_json::json!({
            "iss": "https://as.example", "sub": "alice",
            "scope": "cordis:tools  extra", "scp": ["cordis:metrics"]
        }))
        .unwrap();
        let claims = raw.into_claims();
        assert_eq!(claims.subject, "https://as.example alice");
        assert_eq!(
            claims.scopes.into_iter().collect::<Vec<_>>(),
            ["cordis:metrics", "cordis:tools", "extra"]
        );
    }

    #[test]
    fn urls_are_https_or_loopback_http() {
        assert!(checked_url("--x", "https://as.example/tenant").is_ok());
        assert!(checked_url("--x", "http://127.0.0.1:9000").is_ok());
        assert!(checked_url("--x", "http://[::1]:9000").is_ok());
        assert!(checked_url("--x", "http://localhost/").is_ok());
        for bad in [
            "http://as.example",
            "as.example",
            "https://as.example/#f",
            "ftp://x",
        ] {
            let e = checked_url("--x", bad).unwrap_err().to_string();
            assert!(e.starts_with(&format!("--x {bad}")), "{e}");
        }
    }

    #[test]
    fn a_shared_secret_or_an_encryption_key_is_never_used() {
        let oct: Jwk =
            serde_json::from_value(serde_json::json!({"kty": "oct", "k": "c2VjcmV0", "kid": "s"}))
                .unwrap();
        assert!(usable(&oct).is_none());
        let enc: Jwk = serde_json::from_value(serde_json::json!({
            "kty": "RSA", "use": "enc", "n": "sXchDaQebHnPiGvyDOAT4saGEUetSyo9MKLOoWFsueri23bOdgWp4Dy1WlUzewbgBHod5pcM9H95GQRV3JDXboIRROSBigeC5yjU1hGzHHyXss8UDprecbAYxknTcQkhslANGRUZmdTOQ5qTRsLAt6BTYuyvVRdhS8exSZEy_c4gs_7svlJJQ4H9_NxsiIoLwAEk7-Q3UXERGYw_75IDrGA84-lA_-Ct4eTlXHBIY2EaV7t7LjJaynVJCpkv4LKjTTAumiGUIuQhrNhZLuF_RJLqHpM2kgWFLU7-VTdL1VbC2tejvcI2BlMkEpk1BzBZI0KQB0GaDWFLN-aEAw3vRw",
            "e": "AQAB", "kid": "e"
        }))
        .unwrap();
        assert!(usable(&enc).is_none());
        let sig = serde_json::from_value::<Jwk>(serde_json::json!({
            "kty": "RSA", "use": "sig", "alg": "RS256", "n": "sXchDaQebHnPiGvyDOAT4saGEUetSyo9MKLOoWFsueri23bOdgWp4Dy1WlUzewbgBHod5pcM9H95GQRV3JDXboIRROSBigeC5yjU1hGzHHyXss8UDprecbAYxknTcQkhslANGRUZmdTOQ5qTRsLAt6BTYuyvVRdhS8exSZEy_c4gs_7svlJJQ4H9_NxsiIoLwAEk7-Q3UXERGYw_75IDrGA84-lA_-Ct4eTlXHBIY2EaV7t7LjJaynVJCpkv4LKjTTAumiGUIuQhrNhZLuF_RJLqHpM2kgWFLU7-VTdL1VbC2tejvcI2BlMkEpk1BzBZI0KQB0GaDWFLN-aEAw3vRw",
            "e": "AQAB", "kid": "k"
        }))
        .unwrap();
        assert_eq!(
            usable(&sig).map(|k| k.algorithms),
            Some(vec![Algorithm::RS256])
        );
    }

    #[test]
    fn a_description_cannot_break_out_of_its_quotes() {
        assert_eq!(quoted("a \"b\"\\\nc\u{e9}"), "a 'b''?c?");
    }

    const KEY: &[u8] = include_bytes!("../../../../tests/keys/es256.pk8.der");
    const JWKS: &str = include_str!("../../../../tests/keys/jwks.json");

    fn resource() -> Arc<Resource> {
        Arc::new(
            Resource::from_jwks(
                OAuthOptions {
                    issuer: "https://as.example".into(),
                    audience: "https://mcp.example/mcp".into(),
                    jwks: None,
                },
                JWKS,
            )
            .unwrap(),
        )
    }

    fn token(exp_in: i64) -> String {
        let now = jsonwebtoken::get_current_timestamp() as i64;
        let mut header = jsonwebtoken::Header::new(Algorithm::ES256);
        header.kid = Some("test-es256".into());
        let claims = serde_json::json!({
            "iss": "https://as.example", "sub": "alice", "aud": "https://mcp.example/mcp",
            "exp": now + exp_in, "scope": "cordis:tools"
        });
        jsonwebtoken::encode(
            &header,
            &claims,
            &jsonwebtoken::EncodingKey::from_ec_der(KEY),
        )
        .unwrap()
    }

    fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn a_verified_token_is_remembered_until_it_expires_and_a_forged_one_never() {
        let resource = resource();
        let good = token(600);
        let claims = block_on(resource.authorize(Some(&good), SCOPE_TOOLS)).unwrap();
        assert_eq!(claims.subject, "https://as.example alice");
        assert_eq!(resource.remembered(&good), Some(claims.clone()));
        // Remembered at most REMEMBER_FOR, never past `exp`.
        let until = resource.verified.lock().unwrap()[&good].1;
        assert!(until <= Instant::now() + REMEMBER_FOR);
        let soon = token(2);
        block_on(resource.validate(&soon)).unwrap();
        let until = resource.verified.lock().unwrap()[&soon].1;
        assert!(until <= Instant::now() + Duration::from_secs(2));
        // The same claims with another signature: refused, and not remembered.
        let (signed, signature) = good.rsplit_once('.').unwrap();
        let flipped = if signature.starts_with('A') { "B" } else { "A" };
        let forged = format!("{signed}.{flipped}{}", &signature[1..]);
        assert!(matches!(
            block_on(resource.validate(&forged)),
            Err(Refusal::Invalid(_))
        ));
        assert_eq!(resource.remembered(&forged), None);
        // A remembered token still needs the scope of what it asks.
        assert_eq!(
            block_on(resource.authorize(Some(&good), SCOPE_APPROVALS)),
            Err(Refusal::Scope(SCOPE_APPROVALS))
        );
    }
}
