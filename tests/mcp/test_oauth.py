"""`cordis run --http --auth oauth`: an OAuth 2.1 resource server, as the MCP authorization
specification asks of a remote server, against a local authorization server the test runs
with keys it generates: the metadata (RFC 9728) and its challenges, tokens refused for their
signature, expiry, issuer, audience and algorithm, a missing scope answered 403, a good token
used by the real MCP client, scopes deciding metrics and approvals, and a rotated key."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from conftest import CONFINED, Answer, LoopbackHttp, Workspace, eventually, required_env, show, text
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from test_http import connect, post, servers, start  # noqa: F401  (`servers` is a fixture)
from test_server import ESCALATE

AUDIENCE = "https://mcp.example.test/mcp"
METADATA = "https://mcp.example.test/.well-known/oauth-protected-resource/mcp"


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def uint(n: int) -> str:
    return b64(n.to_bytes((n.bit_length() + 7) // 8, "big"))


class Issuer:
    """An authorization server on loopback: its metadata (RFC 8414), its JWKS, and the
    tokens it signs. `fetches` counts the JWKS fetches."""

    def __init__(self) -> None:
        self.rsa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.ec = ec.generate_private_key(ec.SECP256R1())
        self.published: list[dict[str, Any]] = [self.rsa_jwk(self.rsa, "rsa-1"), self.ec_jwk(self.ec, "ec-1")]
        self.fetches = 0
        self.http = LoopbackHttp(self.answer)
        self.url = self.http.url

    def answer(self, _method: str, path: str, _body: bytes) -> Answer:
        if path == "/.well-known/oauth-authorization-server":
            body: dict[str, Any] = {"issuer": self.url, "jwks_uri": f"{self.url}/jwks"}
        elif path == "/jwks":
            self.fetches += 1
            body = {"keys": self.published}
        else:
            return 404, "text/plain", b"not found\n"
        return 200, "application/json", json.dumps(body).encode()

    @staticmethod
    def rsa_jwk(key: rsa.RSAPrivateKey, kid: str) -> dict[str, Any]:
        numbers = key.public_key().public_numbers()
        return {"kty": "RSA", "use": "sig", "alg": "RS256", "kid": kid, "n": uint(numbers.n), "e": uint(numbers.e)}

    @staticmethod
    def ec_jwk(key: ec.EllipticCurvePrivateKey, kid: str) -> dict[str, Any]:
        numbers = key.public_key().public_numbers()
        return {
            "kty": "EC",
            "crv": "P-256",
            "kid": kid,
            "x": b64(numbers.x.to_bytes(32, "big")),
            "y": b64(numbers.y.to_bytes(32, "big")),
        }

    def claims(self, scope: str = "cordis:tools", **changes: Any) -> dict[str, Any]:
        now = int(time.time())
        claims: dict[str, Any] = {
            "iss": self.url,
            "sub": "alice",
            "aud": AUDIENCE,
            "iat": now,
            "exp": now + 600,
            "scope": scope,
            "client_id": "the-agent",
        }
        claims.update(changes)
        return {k: v for k, v in claims.items() if v is not None}

    def token(
        self,
        scope: str = "cordis:tools",
        *,
        kid: str | None = "rsa-1",
        alg: str = "RS256",
        key: Any = None,
        secret: bytes | None = None,
        **changes: Any,
    ) -> str:
        header = {"alg": alg, "typ": "at+jwt", **({"kid": kid} if kid is not None else {})}
        signing = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(self.claims(scope, **changes)).encode())}".encode()
        if alg == "RS256":
            signature = (key or self.rsa).sign(signing, padding.PKCS1v15(), hashes.SHA256())
        elif alg == "ES256":
            der = (key or self.ec).sign(signing, ec.ECDSA(hashes.SHA256()))
            from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

            r, s = decode_dss_signature(der)
            signature = r.to_bytes(32, "big") + s.to_bytes(32, "big")
        elif alg == "HS256":
            signature = hmac.new(secret or b"", signing, hashlib.sha256).digest()
        else:
            signature = b""
        return f"{signing.decode()}.{b64(signature)}"

    def close(self) -> None:
        self.http.close()


@pytest.fixture
def issuer() -> Iterator[Issuer]:
    issuer = Issuer()
    yield issuer
    issuer.close()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def oauth_server(servers: list[Any], ws: Workspace, issuer: Issuer, *args: str, **kw: Any) -> Any:  # noqa: F811
    return await start(
        servers,
        ws,
        "--auth",
        "oauth",
        "--oauth-issuer",
        issuer.url,
        "--oauth-audience",
        AUDIENCE,
        *args,
        token=None,
        **kw,
    )


def challenge(response: httpx2.Response) -> str:
    return response.headers.get("www-authenticate", "")


async def test_the_metadata_names_the_issuer_and_a_request_without_a_token_is_challenged_with_it(
    ws: Workspace, servers: list[Any], issuer: Issuer  # noqa: F811
) -> None:
    ws.manifest(CONFINED)
    server = await oauth_server(servers, ws, issuer)
    base = server.url.rsplit("/mcp", 1)[0]
    expected = {
        "resource": AUDIENCE,
        "authorization_servers": [issuer.url],
        "scopes_supported": ["cordis:tools", "cordis:approvals", "cordis:metrics"],
        "bearer_methods_supported": ["header"],
        "resource_name": "cordis",
    }
    # At the well-known path and at it followed by the resource's path (RFC 9728 §3.1),
    # without a token, like health and readiness.
    for path in ["/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp"]:
        r = httpx2.get(base + path)
        assert r.status_code == 200 and r.json() == expected, (path, r.status_code, r.text)
    assert httpx2.get(f"{base}/healthz").status_code == 200
    # No token: 401 with the challenge that leads a client to the authorization server.
    r = post(server.url, {})
    assert r.status_code == 401, r.text
    assert challenge(r) == f'Bearer resource_metadata="{METADATA}", scope="cordis:tools"', challenge(r)
    assert httpx2.get(f"{base}/metrics").status_code == 401


async def test_only_a_token_of_this_issuer_for_this_server_in_time_gets_in(
    ws: Workspace, servers: list[Any], issuer: Issuer  # noqa: F811
) -> None:
    ws.manifest(CONFINED)
    (ws.project("p") / "notes.txt").write_text("hello from the project\n")
    server = await oauth_server(servers, ws, issuer)
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public_pem = issuer.rsa.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    now = int(time.time())
    refused = {
        "expired": (issuer.token(exp=now - 3600, iat=now - 7200), "expired"),
        "for another server": (issuer.token(aud="https://other.example.test/mcp"), "audience"),
        "from another issuer": (issuer.token(iss="https://evil.example.test"), "issuer"),
        "signed by another key under a known kid": (issuer.token(key=stranger), "signature"),
        "signed by a key the issuer never published": (issuer.token(kid="unknown", key=stranger), "not one of the issuer's keys"),
        "HS256 keyed with the issuer's public key": (issuer.token(alg="HS256", secret=public_pem), "shared secret"),
        "alg none": (issuer.token(alg="none"), "not a signed JWT"),
        "without a subject": (issuer.token(sub=None), "sub"),
        "without an audience": (issuer.token(aud=None), "aud"),
        "not yet valid": (issuer.token(nbf=now + 3600), "not valid yet"),
        "not a JWT": ("t0ken-for-the-http-tests-0123456789", "not a signed JWT"),
    }
    for case, (token, why) in refused.items():
        r = post(server.url, bearer(token))
        assert r.status_code == 401, (case, r.status_code, r.text)
        assert challenge(r).startswith('Bearer error="invalid_token"') and METADATA in challenge(r), (case, challenge(r))
        assert why in challenge(r) and why in r.text, (case, challenge(r), r.text)
    # A good token without the scope MCP needs: 403 naming it.
    r = post(server.url, bearer(issuer.token(scope="cordis:metrics")))
    assert r.status_code == 403, r.text
    assert 'error="insufficient_scope", scope="cordis:tools"' in challenge(r), challenge(r)
    # A good token: the real MCP client works, with an RSA key and with an EC key.
    for token in [issuer.token(), issuer.token(kid="ec-1", alg="ES256"), issuer.token(scp=["cordis:tools"], scope=None)]:
        async with connect(server.url, token=token) as s:
            r = await s.call_tool("read", {"path": "notes.txt"})
            assert not r.is_error and "hello from the project" in text(r), show(r)
    # No token is ever logged.
    assert not any(issuer.token()[:40] in line for line in server.log)


async def test_scopes_decide_who_reads_metrics_and_who_answers_approvals(
    ws: Workspace, outside: Path, servers: list[Any], issuer: Issuer  # noqa: F811
) -> None:
    ws.manifest(CONFINED)
    victim = outside / "victim.txt"
    victim.write_text("original\n")
    server = await oauth_server(servers, ws, issuer)
    base = server.url.rsplit("/mcp", 1)[0]
    agent = issuer.token("cordis:tools")
    person = issuer.token("cordis:approvals", sub="bob")
    watcher = issuer.token("cordis:metrics", sub="prometheus")
    r = httpx2.get(f"{base}/metrics", headers=bearer(agent))
    assert r.status_code == 403 and 'scope="cordis:metrics"' in challenge(r), (r.status_code, challenge(r))
    r = httpx2.get(f"{base}/metrics", headers=bearer(watcher))
    assert r.status_code == 200 and "cordis_sessions_live" in r.text, r.text
    async with connect(server.url, token=agent) as s:
        call = asyncio.create_task(s.call_tool("write", {"path": str(victim), "content": "approved\n", **ESCALATE}))

        def waiting() -> list[dict[str, Any]]:
            return httpx2.get(f"{base}/approvals", headers=bearer(person)).json()["pending"]

        await eventually("an approval waits", 30, waiting)
        (pending,) = waiting()
        # The agent's own token cannot answer its escalation, nor list what waits.
        for request in [
            lambda: httpx2.get(f"{base}/approvals", headers=bearer(agent)),
            lambda: httpx2.post(f"{base}/approvals/{pending['id']}/approve", headers=bearer(agent)),
        ]:
            r = request()
            assert r.status_code == 403 and 'scope="cordis:approvals"' in challenge(r), (r.status_code, challenge(r))
        assert httpx2.post(f"{base}/approvals/{pending['id']}/approve").status_code == 401
        assert not call.done() and victim.read_text() == "original\n"
        r = httpx2.post(f"{base}/approvals/{pending['id']}/approve", headers=bearer(person))
        assert r.status_code == 200, r.text
        result = await asyncio.wait_for(call, 30)
        assert not result.is_error, show(result)
    assert victim.read_text() == "approved\n"


async def test_a_key_the_issuer_rotates_in_is_fetched_when_a_token_names_it(
    ws: Workspace, servers: list[Any], issuer: Issuer  # noqa: F811
) -> None:
    ws.manifest(CONFINED)
    server = await oauth_server(servers, ws, issuer)
    assert issuer.fetches == 1
    rotated = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    issuer.published.append(issuer.rsa_jwk(rotated, "rsa-2"))
    r = post(server.url, bearer(issuer.token(kid="rsa-2", key=rotated)))
    assert r.status_code == 200, r.text
    assert issuer.fetches == 2
    # Unknown key ids do not make the server fetch again and again: at most once in 30 s.
    for n in range(5):
        r = post(server.url, bearer(issuer.token(kid=f"unknown-{n}", key=rotated)))
        assert r.status_code == 401, r.text
    assert issuer.fetches == 2
    await server.wait_log("fetched the issuer's keys again")


def run_refused(ws: Workspace, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "CORDIS_STATE_DIR": str(ws.root / "state"), **(env or {})}
    full_env.pop("CORDIS_HTTP_TOKEN", None)
    full_env.update(env or {})
    return subprocess.run(
        [required_env("CORDIS_BIN"), "run", "-c", str(ws.root / "cordis.yml"), "--http", "127.0.0.1:0", *args],
        cwd=str(ws.project("p")),
        env=full_env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_a_server_that_cannot_validate_tokens_does_not_start(ws: Workspace, issuer: Issuer) -> None:
    ws.manifest(CONFINED)
    gone = Issuer()
    gone.close()
    cases = {
        "an issuer nobody answers for": (["--oauth-issuer", gone.url, "--oauth-audience", AUDIENCE], {}, "cannot discover the keys of the issuer"),
        "plain http to another machine": (["--oauth-issuer", "http://issuer.example.test", "--oauth-audience", AUDIENCE], {}, "must be an https URL"),
        "no audience": (["--oauth-issuer", issuer.url], {}, "--oauth-audience"),
        "a static token beside": (
            ["--oauth-issuer", issuer.url, "--oauth-audience", AUDIENCE],
            {"CORDIS_HTTP_TOKEN": "t0ken-for-the-http-tests-0123456789"},
            "unset CORDIS_HTTP_TOKEN",
        ),
    }
    for case, (args, env, why) in cases.items():
        r = await asyncio.to_thread(run_refused, ws, "--auth", "oauth", *args, env=env)
        assert r.returncode != 0 and why in r.stderr, (case, r.returncode, r.stderr[-2000:])
    r = await asyncio.to_thread(run_refused, ws, "--oauth-issuer", issuer.url)
    assert r.returncode != 0 and "only with --auth oauth" in r.stderr, r.stderr[-2000:]
