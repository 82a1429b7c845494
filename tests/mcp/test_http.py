"""`cordis run --http`: MCP over Streamable HTTP, driven by the official Python client over its
Streamable HTTP transport. Many clients, one cordis session per MCP session, each rooted at its
client's first allowed root; a bearer token, Origin validation, progress, annotations,
structured results, reloads under traffic, and commands that end with their call or session."""

from __future__ import annotations

import asyncio
import os
import re
import resource
import signal
import stat
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
from conftest import (
    CONFINED,
    DENIED,
    Workspace,
    eventually,
    leaving_children,
    processes_with,
    required_env,
    show,
    sleep_token,
    started,
    text,
)
from mcp import Client
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

TOKEN = "t0ken-for-the-http-tests-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SERVING = re.compile(r"serving MCP over Streamable HTTP at (http://\S+/mcp)")


class HttpServer:
    """`cordis run --http 127.0.0.1:0` with its log collected line by line."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.log: list[str] = []
        self.url = ""
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            self.log.append(line.decode(errors="replace").rstrip())

    @classmethod
    async def start(
        cls,
        ws: Workspace,
        *args: str,
        token: str | None = TOKEN,
        bind: str = "127.0.0.1:0",
        open_files: int | None = None,
        env: dict[str, str] | None = None,
    ) -> HttpServer:
        """`open_files`: the server's descriptor limit (soft and hard); `env`: variables set
        for the server besides the state directory and the token."""
        base_env = {**os.environ, "CORDIS_STATE_DIR": str(ws.root / "state"), "RUST_LOG": "warn,cordis=info,cordis_cli=info"}
        base_env.pop("CORDIS_HTTP_TOKEN", None)
        base_env.pop("CORDIS_OPERATOR_TOKEN", None)
        env = {**base_env, **(env or {})}
        if token is not None:
            env["CORDIS_HTTP_TOKEN"] = token
        proc = await asyncio.create_subprocess_exec(
            required_env("CORDIS_BIN"),
            "run",
            "-c",
            str(ws.root / "cordis.yml"),
            "--http",
            bind,
            *args,
            cwd=str(ws.project("p")),
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            preexec_fn=None if open_files is None else lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files)),
        )
        server = cls(proc)
        await server.wait_log(SERVING, 60)
        server.url = next(m.group(1) for line in server.log if (m := SERVING.search(line)))
        return server

    async def wait_log(self, pattern: re.Pattern[str] | str, timeout: float = 10) -> str:
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.log:
                if regex.search(line):
                    return line
            if self.proc.returncode is not None and self._reader.done():
                break
            await asyncio.sleep(0.02)
        raise AssertionError(f"no log line matching {regex.pattern!r}; log:\n" + "\n".join(self.log))

    def count(self, pattern: str) -> int:
        return sum(1 for line in self.log if re.search(pattern, line))

    def logged(self) -> str:
        return "\n".join(self.log)

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        await self._reader


@pytest.fixture
async def servers() -> AsyncIterator[list[HttpServer]]:
    """Every server a test starts is stopped after it, whatever happened."""
    started_servers: list[HttpServer] = []
    yield started_servers
    for server in started_servers:
        await server.stop()


async def start(servers: list[HttpServer], ws: Workspace, *args: str, **kw: Any) -> HttpServer:
    server = await HttpServer.start(ws, *args, **kw)
    servers.append(server)
    return server


def roots_of(*dirs: Path) -> Any:
    async def list_roots(_ctx: Any) -> types.ListRootsResult:
        return types.ListRootsResult(roots=[types.Root(uri=d.as_uri(), name=d.name) for d in dirs])

    return list_roots


class Seen:
    """The notifications a client received."""

    def __init__(self) -> None:
        self.methods: list[str] = []

    async def __call__(self, message: Any) -> None:
        method = getattr(message, "method", None)
        if isinstance(method, str):
            self.methods.append(method)


@asynccontextmanager
async def connect(
    url: str,
    *,
    token: str = TOKEN,
    roots: list[Path] | None = None,
    seen: Seen | None = None,
    elicitation: Any = None,
) -> AsyncIterator[ClientSession]:
    """One MCP session over Streamable HTTP (the `initialize` handshake), ended with DELETE."""
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300)) as http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(
                read,
                write,
                list_roots_callback=roots_of(*roots) if roots is not None else None,
                message_handler=seen,
                elicitation_callback=elicitation,
            ) as session:
                await session.initialize()
                yield session


def initialize_request() -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
    }


def post(url: str, headers: dict[str, str]) -> httpx2.Response:
    return httpx2.post(
        url,
        json=initialize_request(),
        headers={"Accept": "application/json, text/event-stream", **headers},
        timeout=30,
    )


# --- sessions and roots ------------------------------------------------------------------


async def test_two_clients_with_their_own_roots_write_concurrently_each_in_its_own_root(
    ws: Workspace, servers: list[HttpServer]
) -> None:
    ws.manifest(CONFINED)
    a, b = ws.project("a"), ws.project("b")
    server = await start(servers, ws, "--allow-root", str(ws.root))

    async def client(root: Path, tag: str) -> None:
        async with connect(server.url, roots=[root]) as s:
            where = await s.call_tool("bash", {"command": "pwd"})
            assert not where.is_error and text(where).splitlines()[0] == str(root), show(where)
            for i in range(20):
                r = await s.call_tool("write", {"path": f"{tag}-{i}.txt", "content": tag})
                assert not r.is_error, show(r)
            listed = await s.call_tool("bash", {"command": "ls"})
            assert set(text(listed).split()) >= {f"{tag}-{i}.txt" for i in range(20)}, show(listed)

    await asyncio.gather(client(a, "a"), client(b, "b"))
    assert sorted(p.name for p in a.iterdir()) == sorted(f"a-{i}.txt" for i in range(20))
    assert sorted(p.name for p in b.iterdir()) == sorted(f"b-{i}.txt" for i in range(20))
    sessions = re.findall(r"mcp session: .*rooted at the client's first root (\S+)", server.logged())
    assert sorted(sessions) == sorted([str(a), str(b)]), server.logged()


async def test_a_client_in_auto_mode_speaks_2026_07_28_at_the_fallback_root(
    ws: Workspace, servers: list[HttpServer]
) -> None:
    """The default client probes `server/discover` and, the server offering it, speaks the
    stateless 2026-07-28 protocol: no roots there, so its session is at the fallback root (a
    client that wants its own root connects with the handshake, as `connect` does)."""
    ws.manifest(CONFINED)
    q = ws.project("q")
    server = await start(servers, ws, "--allow-root", str(ws.root))
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300)) as http:
        transport = streamable_http_client(server.url, http_client=http)
        async with Client(transport, mode="auto", list_roots_callback=roots_of(q)) as client:
            assert client.protocol_version == "2026-07-28", client.protocol_version
            first = await client.call_tool("bash", {"command": "pwd"})
            assert text(first).splitlines()[0] == str(ws.project("p")), show(first)
    async with connect(server.url, roots=[q]) as s:
        where = await s.call_tool("bash", {"command": "pwd"})
        assert text(where).splitlines()[0] == str(q), show(where)


async def test_a_root_outside_the_allowed_set_falls_back_and_says_so(
    ws: Workspace, servers: list[HttpServer], outside: Path
) -> None:
    ws.manifest(CONFINED)
    p = ws.project("p")
    server = await start(servers, ws)  # allowed: the server's directory, p
    async with connect(server.url, roots=[outside]) as s:
        where = await s.call_tool("bash", {"command": "pwd"})
        assert text(where).splitlines()[0] == str(p), show(where)
        r = await s.call_tool("write", {"path": str(outside / "x.txt"), "content": "x"})
        assert r.is_error and DENIED in text(r), show(r)
        line = await server.wait_log(r"outside the allowed roots")
        assert str(outside) in line and f"rooted at {p}" in line, line
        # A root inside the allowed set that does not exist falls back too.
    async with connect(server.url, roots=[p / "missing"]) as s:
        where = await s.call_tool("bash", {"command": "pwd"})
        assert text(where).splitlines()[0] == str(p), show(where)
        await server.wait_log(r"not an existing directory")
    assert not (outside / "x.txt").exists()


async def test_changed_roots_do_not_move_a_session(ws: Workspace, servers: list[HttpServer]) -> None:
    ws.manifest(CONFINED)
    a, b = ws.project("a"), ws.project("b")
    server = await start(servers, ws, "--allow-root", str(ws.root))
    current = [a]

    async def list_roots(_ctx: Any) -> types.ListRootsResult:
        return types.ListRootsResult(roots=[types.Root(uri=d.as_uri()) for d in current])

    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300)) as http:
        async with streamable_http_client(server.url, http_client=http) as (read, write):
            async with ClientSession(read, write, list_roots_callback=list_roots) as s:
                await s.initialize()
                before = await s.call_tool("bash", {"command": "pwd"})
                current[:] = [b]
                await s.send_roots_list_changed()
                await server.wait_log(r"roots changed; the session stays rooted at " + re.escape(str(a)))
                after = await s.call_tool("bash", {"command": "pwd"})
                assert text(before).splitlines()[0] == text(after).splitlines()[0] == str(a), show(after)


async def test_stdio_sessions_take_the_clients_allowed_root_too(ws: Workspace, outside: Path) -> None:
    ws.manifest(CONFINED)
    q = ws.project("q")
    params_args = ["--allow-root", str(ws.root)]
    for roots, expected in (([q], q), ([outside], ws.project("p"))):
        async with ws.connect(ws.project("p"), mode="legacy", extra_args=params_args, roots=roots_of(*roots)) as c:
            where = await c.call_tool("bash", {"command": "pwd"})
            assert text(where).splitlines()[0] == str(expected), show(where)


# --- the guards ---------------------------------------------------------------------------


async def test_a_missing_or_wrong_token_is_refused_and_never_logged(ws: Workspace, servers: list[HttpServer]) -> None:
    ws.manifest(CONFINED)
    server = await start(servers, ws)
    wrong = "wrong-token-that-must-not-be-logged"
    for headers in ({}, {"Authorization": f"Bearer {wrong}"}, {"Authorization": f"Basic {TOKEN}"}):
        r = await asyncio.to_thread(post, server.url, headers)
        assert r.status_code == 401, (headers, r.status_code, r.text)
        assert r.headers.get("www-authenticate") == "Bearer"
    # Every path is guarded, not just the MCP endpoint's POST.
    for method in ("GET", "DELETE"):
        r = await asyncio.to_thread(httpx2.request, method, server.url, timeout=30)
        assert r.status_code == 401, (method, r.status_code)
    ok = await asyncio.to_thread(post, server.url, {"Authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200, ok.text
    await server.wait_log(r"refused an HTTP request with a wrong bearer token \(401\)")
    await server.wait_log(r"refused an HTTP request with no bearer token \(401\)")
    assert wrong not in server.logged() and TOKEN not in server.logged()


async def test_without_a_token_one_is_generated_into_a_private_file(ws: Workspace, servers: list[HttpServer]) -> None:
    ws.manifest(CONFINED)
    server = await start(servers, ws, token=None)
    line = await server.wait_log(r"generated a bearer token for this run into (\S+)")
    path = Path(re.search(r"into (\S+) \(mode 0600\)", line).group(1))  # type: ignore[union-attr]
    assert path.parent == ws.root / "state", path
    assert stat.S_IMODE(path.stat().st_mode) == 0o600, oct(path.stat().st_mode)
    token = path.read_text().strip()
    assert len(token) == 64 and token not in server.logged()
    async with connect(server.url, token=token) as s:
        r = await s.call_tool("bash", {"command": "echo via-the-generated-token"})
        assert "via-the-generated-token" in text(r), show(r)
    r = await asyncio.to_thread(post, server.url, {"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 401


async def test_an_answer_sent_while_its_connection_is_gone_is_replayed_on_resume(
    ws: Workspace, servers: list[HttpServer]
) -> None:
    """A proxy or the network may close a POST's response stream while its call runs; the
    answer must not be lost: the client resumes with `Last-Event-ID` and gets it."""
    ws.manifest(CONFINED)
    server = await start(servers, ws)
    sse = {**AUTH, "Accept": "application/json, text/event-stream"}

    def exchange() -> str:
        with httpx2.Client(timeout=30) as http:
            init = http.post(server.url, json=initialize_request(), headers=sse)
            assert init.status_code == 200, init.text
            session = {**sse, "Mcp-Session-Id": init.headers["mcp-session-id"], "MCP-Protocol-Version": "2025-11-25"}
            note = http.post(server.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=session)
            assert note.status_code == 202, note.text
            call = {
                "jsonrpc": "2.0",
                "id": 7,
                "method": "tools/call",
                "params": {"name": "bash", "arguments": {"command": "sleep 1; echo answered-while-away"}},
            }
            # Read the stream's first event (its id is what a client resumes from), then
            # drop the connection while the command runs.
            last_event_id = None
            with httpx2.Client(timeout=30) as once, once.stream("POST", server.url, json=call, headers=session) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    if line.startswith("id:"):
                        last_event_id = line[3:].strip()
                        break
            assert last_event_id, "the call's stream names no event id to resume from"
            time.sleep(2)  # the answer is sent while no connection is there
            resumed = []
            with http.stream("GET", server.url, headers={**session, "Last-Event-ID": last_event_id}) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    if line.startswith("data:") and '"id":7' in line:
                        resumed.append(line)
                        break
            assert resumed, "the resumed stream ended without the call's answer"
            return resumed[0]

    answer = await asyncio.to_thread(exchange)
    assert "answered-while-away" in answer, answer


async def test_a_forged_origin_is_refused(ws: Workspace, servers: list[HttpServer]) -> None:
    ws.manifest(CONFINED)
    server = await start(servers, ws, "--allow-origin", "https://agent.example.com")
    port = server.url.split(":")[2].split("/")[0]
    auth = {"Authorization": f"Bearer {TOKEN}"}
    for origin in ("http://evil.example", "http://localhost.evil.example", "https://agent.example.com.evil"):
        r = await asyncio.to_thread(post, server.url, {**auth, "Origin": origin})
        assert r.status_code == 403, (origin, r.status_code, r.text)
    for origin in (f"http://localhost:{port}", f"http://127.0.0.1:{port}", "https://agent.example.com"):
        r = await asyncio.to_thread(post, server.url, {**auth, "Origin": origin})
        assert r.status_code == 200, (origin, r.status_code, r.text)
    # DNS rebinding: a loopback server answers only to loopback host names.
    r = await asyncio.to_thread(post, server.url, {**auth, "Host": f"evil.example:{port}"})
    assert r.status_code == 403, r.status_code


async def test_a_non_loopback_bind_without_a_token_refuses_to_start(ws: Workspace) -> None:
    ws.manifest(CONFINED)
    for token, why in ((None, "without a bearer token"), ("short", "at least 16 characters")):
        env = {**os.environ, "CORDIS_STATE_DIR": str(ws.root / "state")}
        env.pop("CORDIS_HTTP_TOKEN", None)
        if token is not None:
            env["CORDIS_HTTP_TOKEN"] = token
        proc = await asyncio.create_subprocess_exec(
            required_env("CORDIS_BIN"), "run", "-c", str(ws.root / "cordis.yml"), "--http", "0.0.0.0:0",
            cwd=str(ws.project("p")), env=env,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        )
        _, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode != 0, err
        assert why in err.decode() and "serving MCP" not in err.decode(), err.decode()
    # With a token it serves (and the token is required from every address).
    server = await HttpServer.start(ws, bind="0.0.0.0:0")
    await server.stop()


# --- what clients see -----------------------------------------------------------------------


async def test_annotations_and_structured_content_are_visible(ws: Workspace, servers: list[HttpServer]) -> None:
    ws.manifest(CONFINED)
    server = await start(servers, ws)
    async with connect(server.url) as s:
        tools = {t.name: t for t in (await s.list_tools()).tools}
        hints = {
            name: (t.annotations.read_only_hint, t.annotations.destructive_hint, t.annotations.open_world_hint)
            for name, t in tools.items()
            if t.annotations is not None
        }
        assert hints == {
            "read": (True, None, False),
            "list": (True, None, False),
            "write": (False, True, False),
            "edit": (False, True, False),
            "bash": (False, True, False),  # the policy keeps the network off
        }, hints
        schema = tools["bash"].output_schema
        assert schema is not None and set(schema["required"]) == {"exit_code", "stdout", "stderr", "timed_out"}
        r = await s.call_tool("bash", {"command": "echo out; echo err >&2; exit 3"})
        assert r.is_error, show(r)
        assert r.structured_content == {"exit_code": 3, "stdout": "out\n", "stderr": "err\n", "timed_out": False}
        assert "[exit code 3]" in text(r)
        r = await s.call_tool("bash", {"command": "sleep 5", "timeout_ms": 200})
        assert r.structured_content is not None and r.structured_content["timed_out"] is True, show(r)


async def test_an_isolated_crash_fails_only_the_crashing_call_of_one_client(
    ws: Workspace, servers: list[HttpServer]
) -> None:
    """Two clients of one server: while one runs `bash`, the other's call of an isolated
    plugin that aborts gets an error result; the `bash` call and both clients' later calls
    succeed, the plugin on a new process."""
    ws.manifest(CONFINED + "- name: fixture-crashy\n  isolate: process\n")
    server = await start(servers, ws)
    async with connect(server.url) as a, connect(server.url) as b:
        first = await b.call_tool("pid", {})
        assert not first.is_error, show(first)
        running = asyncio.create_task(a.call_tool("bash", {"command": "sleep 1; echo survived"}))
        await asyncio.sleep(0.3)
        crashed = await b.call_tool("crash", {"how": "abort"})
        assert crashed.is_error, show(crashed)
        assert "[PLUGIN_CRASHED]" in text(crashed) and "SIGABRT" in text(crashed), show(crashed)
        survived = await running
        assert not survived.is_error and "survived" in text(survived), show(survived)

        async def serves_again() -> object:
            r = await b.call_tool("pid", {})
            return not r.is_error and text(r) != text(first)

        deadline = time.monotonic() + 20
        while not await serves_again():
            assert time.monotonic() < deadline, "the isolated entry never served again"
            await asyncio.sleep(0.2)
        later = await a.call_tool("bash", {"command": "echo later"})
        assert not later.is_error and "later" in text(later), show(later)
    assert server.count(r"isolated entry `fixture-crashy`.*crashed") == 1, server.logged()


async def test_progress_notifications_arrive_during_a_five_second_bash(ws: Workspace, servers: list[HttpServer]) -> None:
    ws.manifest(CONFINED)
    server = await start(servers, ws)
    progress: list[tuple[float, str | None]] = []

    async def on_progress(value: float, _total: float | None, message: str | None) -> None:
        progress.append((value, message))

    async with connect(server.url) as s:
        command = "for i in 1 2 3 4 5; do echo line-$i; sleep 1; done"
        r = await s.call_tool("bash", {"command": command}, progress_callback=on_progress)
        assert not r.is_error and "line-5" in text(r), show(r)
    assert len(progress) >= 2, progress
    values = [v for v, _ in progress]
    assert values == sorted(values) and len(set(values)) == len(values), progress
    assert all(m is not None and m.startswith("bash: running for") for _, m in progress), progress
    assert any(m is not None and "bytes of output" in m for _, m in progress), progress


async def test_a_call_waiting_for_approval_reports_progress(ws: Workspace, servers: list[HttpServer]) -> None:
    ws.manifest(CONFINED)
    server = await start(servers, ws)
    progress: list[str | None] = []

    async def on_progress(_value: float, _total: float | None, message: str | None) -> None:
        progress.append(message)

    async def slow_approval(_ctx: Any, _params: Any) -> types.ElicitResult:
        await asyncio.sleep(4.5)
        return types.ElicitResult(action="accept", content={"approve": False})

    async with connect(server.url, elicitation=slow_approval) as s:
        args = {"command": "echo hi", "sandbox_permissions": "danger-full-access", "justification": "a test"}
        r = await s.call_tool("bash", args, progress_callback=on_progress)
        assert r.is_error, show(r)
    assert any(m is not None and "waiting for approval" in m for m in progress), progress


async def test_a_reload_during_traffic_fails_no_call_and_tells_every_client(
    ws: Workspace, servers: list[HttpServer]
) -> None:
    """Toggling the policy's network restarts the policy and every tool (a real reload), and
    changes `bash`'s open-world hint: the tool list changed, so every client is told."""
    manifest = ws.manifest(CONFINED)
    (ws.project("p") / "f.txt").write_text("steady\n")
    server = await start(servers, ws)
    stop = asyncio.Event()
    calls = 0

    async def client(seen: Seen) -> None:
        nonlocal calls
        async with connect(server.url, seen=seen) as s:
            while not stop.is_set():
                r = await s.call_tool("read", {"path": "f.txt"})
                assert not r.is_error and "steady" in text(r), show(r)
                calls += 1
            await eventually("the tool-list change reached this client", 10, lambda: seen.methods)

    async def reloads() -> None:
        for network in ("true", "false", "true"):
            await asyncio.sleep(0.4)
            body = CONFINED.replace("mode: workspace-write\n", f"mode: workspace-write\n    network: {network}\n")
            tmp = manifest.with_suffix(".tmp")
            tmp.write_text(body)
            before = server.count(r"reload: ")
            tmp.replace(manifest)
            await eventually("the reload", 30, lambda: server.count(r"reload: ") > before)
            assert server.count(r"reload: .*restarted .*dsh-tool-bash g") > before, server.logged()
        await asyncio.sleep(0.4)
        stop.set()

    seen = [Seen() for _ in range(3)]
    await asyncio.gather(reloads(), *(client(s) for s in seen))
    assert calls > 30, calls
    for s in seen:
        assert "notifications/tools/list_changed" in s.methods, s.methods
    async with connect(server.url) as s:
        bash = next(t for t in (await s.list_tools()).tools if t.name == "bash")
        assert bash.annotations is not None and bash.annotations.open_world_hint is True


# --- commands end with their call, their session and the server ------------------------------


async def test_a_cancelled_call_kills_its_command_within_a_second(ws: Workspace, servers: list[HttpServer]) -> None:
    ws.manifest(CONFINED)
    server = await start(servers, ws)
    token = sleep_token()
    async with connect(server.url) as s:
        call = asyncio.create_task(s.call_tool("bash", {"command": leaving_children(token)}))
        await started(token)
        call.cancel()
        cancelled = time.monotonic()
        try:
            await call
        except asyncio.CancelledError:
            pass
        await eventually("every process gone", 1.0, lambda: not processes_with(token))
        assert time.monotonic() - cancelled < 1.0
        after = await s.call_tool("bash", {"command": "echo still-serving"})
        assert "still-serving" in text(after), show(after)


async def test_a_client_that_ends_its_session_takes_its_commands_with_it(
    ws: Workspace, servers: list[HttpServer]
) -> None:
    ws.manifest(CONFINED)
    server = await start(servers, ws)
    token = sleep_token()
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300)) as http:
        async with streamable_http_client(server.url, http_client=http) as (read, write):
            async with ClientSession(read, write) as s:
                await s.initialize()
                call = asyncio.create_task(s.call_tool("bash", {"command": leaving_children(token)}))
                await started(token)
                # Leaving the transport sends DELETE; the call is abandoned, not cancelled.
                ended = time.monotonic()
    call.cancel()
    await eventually("every process gone after DELETE", 1.5, lambda: not processes_with(token))
    assert time.monotonic() - ended < 1.5
    await server.wait_log(r"mcp session ended")


async def test_a_client_that_vanishes_loses_its_commands_when_it_stops_answering(
    ws: Workspace, servers: list[HttpServer]
) -> None:
    """Per the transport, a dropped stream is not a cancellation (a client may resume); a
    client with a call in flight is pinged every third of the idle timeout (here 2 s) and
    must answer within as long, so one that went away is noticed and its command killed."""
    ws.manifest(CONFINED)
    server = await start(servers, ws, "--idle-timeout", "6")
    token = sleep_token()
    headers = {
        "Authorization": f"Bearer {TOKEN}",
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
    }
    with httpx2.Client(timeout=30) as http:
        init = http.post(server.url, headers=headers, json=initialize_request())
        session = {**headers, "Mcp-Session-Id": init.headers["mcp-session-id"], "MCP-Protocol-Version": "2025-11-25"}
        http.post(server.url, headers=session, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                "params": {"name": "bash", "arguments": {"command": leaving_children(token)}}}
        with http.stream("POST", server.url, headers=session, json=call):
            await started(token)
    vanished = time.monotonic()
    await asyncio.sleep(1.0)
    assert processes_with(token), "a dropped stream was taken for a cancellation"
    await eventually("every process gone once the pings went unanswered", 10, lambda: not processes_with(token))
    assert time.monotonic() - vanished >= 1.5
    await server.wait_log(r"the client stopped answering pings; cancelling its call")


async def test_a_busy_session_does_not_idle_out_and_an_idle_one_does(ws: Workspace, servers: list[HttpServer]) -> None:
    ws.manifest(CONFINED)
    server = await start(servers, ws, "--idle-timeout", "2")
    async with connect(server.url) as s:
        # Longer than the idle timeout: the pings the client answers keep the session.
        r = await s.call_tool("bash", {"command": "sleep 4; echo still-here"})
        assert not r.is_error and "still-here" in text(r), show(r)
        assert server.count(r"mcp session ended") == 0, server.logged()
        await server.wait_log(r"mcp session ended", 10)
        # The session is gone: the client's next request is refused.
        with pytest.raises(MCPError):
            await s.call_tool("bash", {"command": "echo too-late"})


async def test_sigterm_lets_calls_finish_then_kills_what_remains(ws: Workspace, servers: list[HttpServer]) -> None:
    ws.manifest(CONFINED)
    server = await start(servers, ws, "--shutdown-timeout", "2")
    token = sleep_token()
    quick_token = sleep_token().replace("2468.", "1.")
    async with connect(server.url) as quick, connect(server.url) as slow:
        hanging = asyncio.create_task(slow.call_tool("bash", {"command": leaving_children(token)}))
        await started(token)
        finishing = asyncio.create_task(quick.call_tool("bash", {"command": f"sleep {quick_token}; echo finished"}))
        await eventually("the quick call started", 10, lambda: processes_with(f"sleep {quick_token}"))
        # Taken before the signal: the server's deadline runs from when it receives it.
        stopped = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        r = await asyncio.wait_for(finishing, 10)
        assert not r.is_error and "finished" in text(r), show(r)
        await eventually("the slow call's processes gone", 5, lambda: not processes_with(token))
        assert time.monotonic() - stopped >= 2.0
        try:
            r = await asyncio.wait_for(hanging, 10)
        except Exception as e:
            raise AssertionError(server.logged()) from e
        assert r.is_error, show(r)
        code = await asyncio.wait_for(server.proc.wait(), 10)
        assert code == 0, (code, server.logged())
