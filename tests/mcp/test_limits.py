"""`cordis run --http` bounds what clients can hold: connections (`--max-connections`, default
1,024, never more than the descriptor limit leaves room for), sessions (`--max-sessions`,
default 1,024), the time a connection has to make an authenticated request (10 s) and to stay
idle between requests (5 min). Past a cap the answer is `503` with `Retry-After`."""

from __future__ import annotations

import asyncio
import os
import time

import httpx2
from conftest import CONFINED, Workspace, show, text
from test_http import AUTH, HttpServer, connect, initialize_request, servers, start  # noqa: F401

ACCEPT = {"Accept": "application/json, text/event-stream"}


def port_of(server: HttpServer) -> int:
    return int(server.url.split(":")[2].split("/")[0])


def descriptors(server: HttpServer) -> int:
    return len(os.listdir(f"/proc/{server.proc.pid}/fd"))


async def closed(reader: asyncio.StreamReader, within: float) -> bool:
    """Whether the server closes the connection (end of file) within `within` seconds."""
    try:
        return await asyncio.wait_for(reader.read(1 << 16), within) == b"" or await asyncio.wait_for(
            reader.read(), within
        ) == b""
    except TimeoutError:
        return False


async def test_sessions_past_the_cap_are_refused_until_one_ends(ws: Workspace, servers: list[HttpServer]) -> None:
    ws.manifest(CONFINED)
    server = await start(servers, ws, "--max-sessions", "3")
    async with connect(server.url) as a, connect(server.url) as b:
        async with connect(server.url) as c:
            for s in (a, b, c):
                r = await s.call_tool("bash", {"command": "true"})
                assert not r.is_error, show(r)
            refused = await asyncio.to_thread(
                httpx2.post, server.url, json=initialize_request(), headers={**AUTH, **ACCEPT}, timeout=30
            )
            assert refused.status_code == 503, (refused.status_code, refused.text)
            assert refused.headers.get("retry-after") == "5"
            assert "3 sessions live" in refused.text and "--max-sessions 3" in refused.text, refused.text
            # Headers of the stateless protocol do not make an `initialize` something else.
            disguised = await asyncio.to_thread(
                httpx2.post,
                server.url,
                json=initialize_request(),
                headers={**AUTH, **ACCEPT, "Mcp-Method": "tools/list", "MCP-Protocol-Version": "2026-07-28"},
                timeout=30,
            )
            assert disguised.status_code == 503, (disguised.status_code, disguised.text)
            # The sessions already live are served as before.
            r = await a.call_tool("bash", {"command": "echo still"})
            assert text(r).splitlines()[0] == "still", show(r)
        # `c` ended (DELETE): there is room again.
        async with connect(server.url) as d:
            r = await d.call_tool("bash", {"command": "echo room"})
            assert text(r).splitlines()[0] == "room", show(r)
    await server.wait_log(r"refused a new session: 3 sessions are live")


async def test_idle_and_half_sent_connections_do_not_crowd_out_a_client(
    ws: Workspace, servers: list[HttpServer]
) -> None:
    """With a 1,024-descriptor limit, 2,000 connections that never authenticate (silent, or
    sending half a request) are held open against the server: it keeps within its descriptors,
    serves a real client within a second, and closes what has not authenticated after 10 s."""
    ws.manifest(CONFINED)
    server = await start(servers, ws, open_files=1024)
    port = port_of(server)
    first_reader, first_writer = await asyncio.open_connection("127.0.0.1", port)
    opened = time.monotonic()
    held = []
    for i in range(2000):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        if i % 2:
            writer.write(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 10")
        held.append((reader, writer))
    await asyncio.sleep(0.5)
    assert descriptors(server) <= 1024, descriptors(server)
    started_at = time.monotonic()
    async with connect(server.url) as s:
        r = await s.call_tool("read", {"path": "."})
        took = time.monotonic() - started_at
    assert took < 1.0, f"a client waited {took:.2f} s behind idle connections"
    assert r is not None
    # A connection that sent a wrong token is closed with its 401.
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = b'{"jsonrpc":"2.0","id":1,"method":"ping"}'
    writer.write(
        b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer wrong-token-0123456789\r\n"
        b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    answer = await asyncio.wait_for(reader.read(), 5)
    assert answer.startswith(b"HTTP/1.1 401"), answer[:100]
    # The first silent connection (never evicted or not) is closed 10 s after it was opened.
    await asyncio.sleep(max(0.0, opened + 10.5 - time.monotonic()))
    assert await closed(first_reader, 2), "a silent connection was kept past 10 s"
    for _, w in held:
        w.close()
    first_writer.close()


async def test_connections_past_the_cap_are_answered_503_when_every_one_is_in_use(
    ws: Workspace, servers: list[HttpServer]
) -> None:
    ws.manifest(CONFINED)
    server = await start(servers, ws, "--max-connections", "3")
    clients = [httpx2.AsyncClient(headers={**AUTH, **ACCEPT}, timeout=30) for _ in range(3)]
    try:
        # Three kept-alive connections, each authenticated.
        for c in clients:
            r = await c.post(server.url, json=initialize_request())
            assert r.status_code == 200, r.text
        async with httpx2.AsyncClient(headers={**AUTH, **ACCEPT}, timeout=30) as extra:
            r = await extra.post(server.url, json=initialize_request())
        assert r.status_code == 503 and r.headers.get("retry-after") == "5", (r.status_code, r.text)
        assert "3 connections open" in r.text, r.text
        await server.wait_log(r"refused a connection: 3 connections are open")
    finally:
        for c in clients:
            await c.aclose()
    # Closed, they make room.
    await asyncio.sleep(0.5)
    async with httpx2.AsyncClient(headers={**AUTH, **ACCEPT}, timeout=30) as again:
        r = await again.post(server.url, json=initialize_request())
    assert r.status_code == 200, r.text
