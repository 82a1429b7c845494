"""Nothing a `bash` call starts outlives it, through the official MCP client: a cancelled call,
a client that goes away, and a server told to stop each leave no process behind, in time."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import CONFINED, Workspace, required_env, show, text

_counter = 0


def sleep_token() -> str:
    """A `sleep` argument unique to this test run (sleep takes fractions)."""
    global _counter
    _counter += 1
    return f"2468.{os.getpid()}0{_counter}"


def leaving_children(token: str) -> str:
    """Background children of every kind, then a long foreground sleep."""
    return (
        f"setsid sleep {token} & (sleep {token} &) ; sleep {token} & "
        f"nohup sleep {token} >/dev/null 2>&1 & sleep {token}"
    )


def processes_with(needle: str) -> list[tuple[int, str]]:
    """Running processes (not zombies) whose command line contains `needle`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if needle in cmdline and ") Z " not in stat:
            found.append((int(entry.name), cmdline))
    return found


async def eventually(what: str, timeout: float, probe: Callable[[], object]) -> float:
    """Polls `probe` until it is truthy; returns the seconds it took, fails after `timeout`."""
    start = time.monotonic()
    while True:
        seen = probe()
        if seen:
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise AssertionError(f"{what}: not within {timeout} s")
        await asyncio.sleep(0.02)


async def started(token: str) -> None:
    await eventually("the command and its five sleeps started", 30, lambda: len(processes_with(token)) >= 5)


async def test_a_cancelled_bash_call_kills_everything_it_started_within_a_second(ws: Workspace) -> None:
    ws.manifest(CONFINED)
    token = sleep_token()
    async with ws.connect(ws.project("p")) as client:
        call = asyncio.create_task(client.call_tool("bash", {"command": leaving_children(token)}))
        await started(token)
        # Cancelling the caller makes the client send `notifications/cancelled`.
        call.cancel()
        cancelled = time.monotonic()
        try:
            await call
        except asyncio.CancelledError:
            pass
        took = await eventually("every process gone", 1.0, lambda: not processes_with(token))
        assert time.monotonic() - cancelled < 1.0, took
        after = await client.call_tool("bash", {"command": "echo still-serving"})
        assert not after.is_error and "still-serving" in text(after), show(after)


class RawServer:
    """`cordis run` over pipes, driven line by line: a client that can vanish mid-call (close
    its end) or watch its server be signalled, which the official client's orderly shutdown
    (it cancels pending requests first) does not do."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls, ws: Workspace) -> RawServer:
        proc = await asyncio.create_subprocess_exec(
            required_env("CORDIS_BIN"),
            "run",
            "-c",
            str(ws.root / "cordis.yml"),
            cwd=str(ws.project("p")),
            env={**os.environ, "CORDIS_STATE_DIR": str(ws.root / "state"), "RUST_LOG": "warn"},
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        server = cls(proc)
        await server.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}})
        line = await asyncio.wait_for(proc.stdout.readline(), timeout=60)
        assert json.loads(line)["id"] == 1, line
        await server.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return server

    async def send(self, message: dict[str, object]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        await self.proc.stdin.drain()

    async def start_bash(self, command: str) -> None:
        await self.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                         "params": {"name": "bash", "arguments": {"command": command}}})

    async def exited_within(self, seconds: float) -> int:
        return await asyncio.wait_for(self.proc.wait(), timeout=seconds)


async def test_a_client_that_goes_away_takes_its_commands_with_it(ws: Workspace) -> None:
    ws.manifest(CONFINED)
    token = sleep_token()
    server = await RawServer.start(ws)
    await server.start_bash(leaving_children(token))
    await started(token)
    assert server.proc.stdin is not None
    server.proc.stdin.close()
    await eventually("every process gone after the disconnect", 2.0, lambda: not processes_with(token))
    code = await server.exited_within(2.0)
    assert code == 0, code


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_a_stopped_server_kills_running_commands_and_exits(ws: Workspace, signum: signal.Signals) -> None:
    ws.manifest(CONFINED)
    token = sleep_token()
    server = await RawServer.start(ws)
    await server.start_bash(leaving_children(token))
    await started(token)
    server.proc.send_signal(signum)
    await eventually(f"every process gone after {signum.name}", 2.0, lambda: not processes_with(token))
    code = await server.exited_within(2.0)
    assert code == 0, code
