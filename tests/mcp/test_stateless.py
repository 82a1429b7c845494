"""`cordis run --http` for clients on the stateless 2026-07-28 protocol (no `initialize`, no
`Mcp-Session-Id`), driven by the official Python client in that mode. A cordis session is a
handle the server mints and says in each result's `_meta` ("cordis/session"); the client names
it in its next calls (from any connection), and only the client whose token made it can."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from conftest import CONFINED, Workspace, show, text
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from test_http import TOKEN, HttpServer, servers, start  # noqa: F401
from test_server import ESCALATE, Approver

HANDLE = "cordis/session"


@asynccontextmanager
async def stateless(url: str, *, token: str = TOKEN, elicitation: Any = None) -> AsyncIterator[Client]:
    """One 2026-07-28 client over its own HTTP connection."""
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30, read=300)) as http:
        async with Client(
            streamable_http_client(url, http_client=http), mode="2026-07-28", elicitation_callback=elicitation
        ) as client:
            yield client


def handle_of(result: Any) -> str:
    handle = (result.meta or {}).get(HANDLE)
    assert isinstance(handle, str) and handle, f"no session handle in {result!r}"
    return handle


def sessions_made(server: HttpServer) -> int:
    return len(re.findall(r"mcp session: .*2026-07-28 client", server.logged()))


async def test_a_session_is_a_handle_the_client_carries_across_connections(
    ws: Workspace, servers: list[HttpServer]
) -> None:
    ws.manifest(CONFINED)
    server = await start(servers, ws, "--instance", "h1")
    p = ws.project("p")
    async with stateless(server.url) as a:
        assert a.protocol_version == "2026-07-28"
        tools = {t.name for t in (await a.list_tools()).tools}
        assert {"read", "write", "edit", "list", "bash"} <= tools, tools
        first = await a.call_tool("write", {"path": "a.txt", "content": "from a"})
        assert not first.is_error, show(first)
        handle = handle_of(first)
        assert re.fullmatch(r"h1\.[0-9a-f]{32}", handle), handle
    assert (p / "a.txt").read_text() == "from a"
    # Another connection, the same session: named by its handle.
    async with stateless(server.url) as b:
        again = await b.call_tool("bash", {"command": "cat a.txt; echo; pwd"}, meta={HANDLE: handle})
        assert not again.is_error and text(again).splitlines()[:2] == ["from a", str(p)], show(again)
        assert handle_of(again) == handle
        # A call that names none starts a new session.
        other = await b.call_tool("bash", {"command": "true"})
        assert handle_of(other) != handle
    assert sessions_made(server) == 2, server.logged()


async def test_an_escalation_is_approved_through_input_required(
    ws: Workspace, servers: list[HttpServer], outside: Path
) -> None:
    """The approval travels as `input_required`; the client's retry names no session, its
    sealed state does, so the parked call is the one that goes on."""
    ws.manifest(CONFINED)
    victim = outside / "victim.txt"
    victim.write_text("original\n")
    server = await start(servers, ws)
    approver = Approver("accept", True)
    async with stateless(server.url, elicitation=approver) as client:
        r = await client.call_tool("write", {"path": str(victim), "content": "escalated\n", **ESCALATE})
        assert not r.is_error, show(r)
        handle = handle_of(r)
        # The grant was for that call only.
        plain = await client.call_tool("write", {"path": str(victim), "content": "again\n"}, meta={HANDLE: handle})
        assert plain.is_error, show(plain)
    assert victim.read_text() == "escalated\n"
    assert len(approver.requests) == 1 and "victim.txt" in approver.requests[0].message
    assert sessions_made(server) == 1, server.logged()


async def test_a_handle_is_refused_to_another_clients_token_and_when_unknown(
    ws: Workspace, servers: list[HttpServer]
) -> None:
    ws.manifest(CONFINED)
    alice, bob = "alice-token-0123456789abcdef", "bob-token-0123456789abcdefgh"
    server = await start(servers, ws, token=f"{alice},{bob}")
    async with stateless(server.url, token=alice) as a:
        made = await a.call_tool("write", {"path": "alice.txt", "content": "mine"})
        handle = handle_of(made)
    async with stateless(server.url, token=bob) as b:
        with pytest.raises(MCPError) as refused:
            await b.call_tool("write", {"path": "alice.txt", "content": "bob was here"}, meta={HANDLE: handle})
        assert "no session" in str(refused.value) and "another client" in str(refused.value), refused.value
        with pytest.raises(MCPError) as unknown:
            await b.call_tool("bash", {"command": "true"}, meta={HANDLE: "h9.00000000000000000000000000000000"})
        assert "no session `h9.0" in str(unknown.value) and "call without" in str(unknown.value), unknown.value
    async with stateless(server.url, token=alice) as a:
        mine = await a.call_tool("bash", {"command": "cat alice.txt"}, meta={HANDLE: handle})
        assert text(mine).splitlines()[0] == "mine", show(mine)
    assert (ws.project("p") / "alice.txt").read_text() == "mine"


async def test_routing_headers_must_agree_with_the_body(ws: Workspace, servers: list[HttpServer]) -> None:
    """A gateway routes by `Mcp-Method` and `Mcp-Name` without reading the body: a request
    whose headers say one thing and whose body another is refused (400), never run."""
    ws.manifest(CONFINED)
    server = await start(servers, ws)
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
    }
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "write", "arguments": {"path": "x.txt", "content": "x"}, "_meta": meta},
    }
    base = {
        "Authorization": f"Bearer {TOKEN}",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
    }
    for headers in (
        {"Mcp-Method": "tools/call", "Mcp-Name": "read"},
        {"Mcp-Method": "tools/list", "Mcp-Name": "write"},
        {"Mcp-Name": "write"},
    ):
        r = await asyncio.to_thread(httpx2.post, server.url, json=body, headers={**base, **headers}, timeout=30)
        assert r.status_code == 400, (headers, r.status_code, r.text)
    assert not (ws.project("p") / "x.txt").exists()
    ok = await asyncio.to_thread(
        httpx2.post, server.url, json=body, headers={**base, "Mcp-Method": "tools/call", "Mcp-Name": "write"}, timeout=30
    )
    assert ok.status_code == 200, ok.text
    assert (ws.project("p") / "x.txt").read_text() == "x"
