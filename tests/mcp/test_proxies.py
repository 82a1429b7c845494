"""`cordis run --http` behind the real proxies README recommends, configured with the recipe
files in `deploy/` as they are (only their port numbers changed to free ones): two hosts behind
nginx with concurrent clients, one host behind Caddy over HTTPS; and the caps on connections and
sessions. The proxies are Debian's `nginx` and `caddy` (`cargo xtask test` installs them)."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import socket
import ssl
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx2
import pytest
from conftest import CONFINED, Workspace, show, text
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from test_http import AUTH, HttpServer, connect, initialize_request, servers  # noqa: F401
from test_stateless import HANDLE

REPO = Path(__file__).resolve().parents[2]
NGINX_RECIPE = REPO / "deploy/nginx/cordis.conf"
CADDY_RECIPE = REPO / "deploy/caddy/Caddyfile"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def need(program: str) -> str:
    path = shutil.which(program) or next(
        (str(p) for p in (Path("/usr/sbin") / program, Path("/usr/bin") / program) if p.exists()), None
    )
    if path is None:
        raise AssertionError(f"`{program}` is not installed; `cargo xtask test` installs it (apt-get install {program})")
    return path


def with_ports(recipe: str, ports: dict[int, int]) -> str:
    """The recipe with each of its port numbers replaced (and nothing else)."""
    for old, new in ports.items():
        assert f":{old}" in recipe, f"the recipe no longer uses port {old}"
        recipe = recipe.replace(f":{old}", f":{new}")
    return recipe


async def wait_port(port: int, what: str, proc: asyncio.subprocess.Process, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.returncode is not None:
            raise AssertionError(f"{what} exited with {proc.returncode}")
        try:
            _, w = await asyncio.open_connection("127.0.0.1", port)
            w.close()
            return
        except OSError:
            await asyncio.sleep(0.05)
    raise AssertionError(f"{what} did not listen on {port} within {timeout} s")


@asynccontextmanager
async def process(*argv: str, env: dict[str, str] | None = None) -> AsyncIterator[asyncio.subprocess.Process]:
    proc = await asyncio.create_subprocess_exec(
        *argv, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()


@asynccontextmanager
async def nginx(dir: Path, recipe: str) -> AsyncIterator[None]:
    """nginx in the foreground with `recipe` included in its `http` block."""
    dir.mkdir(parents=True, exist_ok=True)
    (dir / "cordis.conf").write_text(recipe)
    (dir / "nginx.conf").write_text(
        f"daemon off;\nworker_processes 1;\npid {dir}/nginx.pid;\nerror_log {dir}/error.log;\n"
        + ("user root;\n" if os.geteuid() == 0 else "")
        + "events {}\nhttp {\n"
        f"    access_log off;\n    client_body_temp_path {dir}/body;\n    proxy_temp_path {dir}/proxy;\n"
        f"    include {dir}/cordis.conf;\n}}\n"
    )
    async with process(need("nginx"), "-p", str(dir), "-e", str(dir / "error.log"), "-c", str(dir / "nginx.conf")) as proc:
        listen = int(re.search(r"listen 127\.0\.0\.1:(\d+);", recipe).group(1))  # type: ignore[union-attr]
        await wait_port(listen, "nginx", proc)
        yield


async def test_two_hosts_behind_nginx_serve_every_session_to_the_end(ws: Workspace, servers: list[HttpServer]) -> None:
    """README's scale-out, with its nginx file: 8 clients x 10 calls through nginx to two hosts,
    and 4 clients on the stateless protocol x 10 calls. Each session's requests reach the host
    that made it (by the instance name its id or handle starts with), so no session fails;
    both hosts get sessions."""
    ws.manifest(CONFINED)
    ports = {8765: free_port(), 8771: free_port(), 8772: free_port()}
    hosts = []
    for name, port in (("h1", ports[8771]), ("h2", ports[8772])):
        host = await HttpServer.start(ws, "--instance", name, "--allow-root", str(ws.root), bind=f"127.0.0.1:{port}")
        servers.append(host)
        hosts.append(host)
    recipe = with_ports(NGINX_RECIPE.read_text(), ports)
    async with nginx(ws.root / "nginx", recipe):
        url = f"http://127.0.0.1:{ports[8765]}/mcp"

        async def client(i: int) -> None:
            root = ws.project(f"c{i}")
            async with connect(url, roots=[root]) as s:
                for n in range(10):
                    r = await s.call_tool("write", {"path": f"f{n}.txt", "content": f"{i}-{n}"})
                    assert not r.is_error, show(r)
                listed = await s.call_tool("bash", {"command": "ls | wc -l"})
                assert text(listed).splitlines()[0].strip() == "10", show(listed)

        async def stateless_client(i: int) -> None:
            """A 2026-07-28 client: its first call (no session) goes to any host; after that
            it names its handle, in `_meta` and in the `Cordis-Session` header nginx routes by."""
            async with httpx2.AsyncClient(headers=AUTH, timeout=httpx2.Timeout(30, read=300)) as http:
                async with Client(streamable_http_client(url, http_client=http), mode="2026-07-28") as c:
                    first = await c.call_tool("write", {"path": f"s{i}-0.txt", "content": f"s{i}"})
                    assert not first.is_error, show(first)
                    handle = first.meta[HANDLE]
                    http.headers["Cordis-Session"] = handle
                    for n in range(1, 10):
                        r = await c.call_tool("write", {"path": f"s{i}-{n}.txt", "content": f"s{i}"}, meta={HANDLE: handle})
                        assert not r.is_error and r.meta[HANDLE] == handle, show(r)

        await asyncio.gather(*(client(i) for i in range(8)), *(stateless_client(i) for i in range(4)))
        for i in range(8):
            assert sorted(p.read_text() for p in ws.project(f"c{i}").iterdir()) == sorted(f"{i}-{n}" for n in range(10))
        made = [h.count(r"mcp session: ") for h in hosts]
        assert sum(made) == 12 and all(n > 0 for n in made), made
        for h in hosts:
            assert h.count(r"\b404\b|Session not found|session terminated") == 0, h.logged()

        # An id no host knows (one whose host is gone, or a made-up one) reaches some host,
        # which answers 404 as the transport specifies: the client starts anew.
        for stale in ("h1.00000000-0000-4000-8000-000000000000", "h9.00000000-0000-4000-8000-000000000000"):
            r = await asyncio.to_thread(
                httpx2.post,
                url,
                json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
                headers={
                    **AUTH,
                    "Accept": "application/json, text/event-stream",
                    "Mcp-Session-Id": stale,
                    "MCP-Protocol-Version": "2025-11-25",
                },
                timeout=30,
            )
            assert r.status_code == 404, (stale, r.status_code, r.text)


def caddyfile(recipe: str, port: int, host_port: int) -> str:
    """README's Caddyfile with its ports changed, Caddy's own authority (`tls internal`), and
    the global options a test needs (no admin endpoint, no trust-store install, no port 80)."""
    site = with_ports(recipe, {8765: host_port}).replace("agent.example.com {", f"agent.example.com:{port} {{\n    tls internal", 1)
    assert "tls internal" in site, "the recipe's site block is not `agent.example.com {`"
    return "{\n    admin off\n    skip_install_trust\n    auto_https disable_redirects\n}\n\n" + site


@asynccontextmanager
async def caddy(dir: Path, config: str, port: int) -> AsyncIterator[Path]:
    """Caddy in the foreground; yields its local authority's root certificate."""
    dir.mkdir(parents=True, exist_ok=True)
    (dir / "Caddyfile").write_text(config)
    env = {**os.environ, "HOME": str(dir), "XDG_DATA_HOME": str(dir / "data"), "XDG_CONFIG_HOME": str(dir / "config")}
    argv = (need("caddy"), "run", "--config", str(dir / "Caddyfile"), "--adapter", "caddyfile")
    async with process(*argv, env=env) as proc:
        await wait_port(port, "caddy", proc)
        root = dir / "data/caddy/pki/authorities/local/root.crt"
        deadline = time.monotonic() + 30
        while not root.exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert root.exists(), f"caddy made no local authority at {root}"
        yield root


@pytest.fixture
def resolve_agent_example_com(monkeypatch: pytest.MonkeyPatch) -> None:
    """`agent.example.com` resolves to this machine (as DNS would for the proxy's name)."""
    real = socket.getaddrinfo

    def getaddrinfo(host: object, *args: object, **kw: object):  # type: ignore[no-untyped-def]
        named = host in ("agent.example.com", b"agent.example.com")  # anyio passes bytes
        return real("127.0.0.1" if named else host, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


async def test_one_host_behind_caddy_over_https(
    ws: Workspace, servers: list[HttpServer], resolve_agent_example_com: None
) -> None:
    """README's TLS recipe, with its Caddyfile: Caddy passes `Host: agent.example.com`, which the
    loopback host refuses as DNS rebinding until it is started with `--allow-host`; then an MCP
    client works over HTTPS."""
    ws.manifest(CONFINED)
    port, host_port = free_port(), free_port()
    config = caddyfile(CADDY_RECIPE.read_text(), port, host_port)
    async with caddy(ws.root / "caddy", config, port) as ca:
        tls = ssl.create_default_context(cafile=str(ca))
        url = f"https://agent.example.com:{port}/mcp"
        refusing = await HttpServer.start(ws, bind=f"127.0.0.1:{host_port}")
        servers.append(refusing)
        async with httpx2.AsyncClient(verify=tls, timeout=30) as http:
            r = await http.post(url, json=initialize_request(), headers={**AUTH, "Accept": "application/json, text/event-stream"})
        assert r.status_code == 403, (r.status_code, r.text)
        await refusing.stop()

        host = await HttpServer.start(ws, "--allow-host", "agent.example.com", bind=f"127.0.0.1:{host_port}")
        servers.append(host)
        async with httpx2.AsyncClient(headers=AUTH, verify=tls, timeout=httpx2.Timeout(30, read=300)) as http:
            from mcp.client.session import ClientSession
            from mcp.client.streamable_http import streamable_http_client

            async with streamable_http_client(url, http_client=http) as (read, write):
                async with ClientSession(read, write) as s:
                    await s.initialize()
                    tools = {t.name for t in (await s.list_tools()).tools}
                    assert {"read", "write", "bash"} <= tools, tools
                    r = await s.call_tool("write", {"path": "over-tls.txt", "content": "tls"})
                    assert not r.is_error, show(r)
                    r = await s.call_tool("bash", {"command": "cat over-tls.txt"})
                    assert text(r).splitlines()[0] == "tls", show(r)
        assert (ws.project("p") / "over-tls.txt").read_text() == "tls"
