"""Nothing a `bash` call starts outlives it, through the official MCP client: a cancelled call,
a client that goes away, and a server told to stop each leave no process behind, in time."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import pytest
from conftest import (
    CONFINED,
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
    async def start(cls, ws: Workspace, *args: str) -> RawServer:
        proc = await asyncio.create_subprocess_exec(
            required_env("CORDIS_BIN"),
            "run",
            "-c",
            str(ws.root / "cordis.yml"),
            *args,
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
async def test_a_stopped_server_kills_running_commands_at_its_deadline_and_exits(
    ws: Workspace, signum: signal.Signals
) -> None:
    ws.manifest(CONFINED)
    token = sleep_token()
    server = await RawServer.start(ws, "--shutdown-timeout", "1")
    await server.start_bash(leaving_children(token))
    await started(token)
    # Taken before the signal: the server's deadline runs from when it receives it.
    stopped = time.monotonic()
    server.proc.send_signal(signum)
    await asyncio.sleep(0.5)
    assert processes_with(token), "the command was killed before its deadline"
    await eventually(f"every process gone after {signum.name}", 3.0, lambda: not processes_with(token))
    assert time.monotonic() - stopped >= 1.0
    code = await server.exited_within(2.0)
    assert code == 0, code


async def test_a_stopped_server_lets_a_call_in_flight_finish_and_answer(ws: Workspace) -> None:
    ws.manifest(CONFINED)
    server = await RawServer.start(ws)
    await server.start_bash("sleep 1.5; echo finished-in-time")
    await asyncio.sleep(0.3)
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.stdout is not None
    line = await asyncio.wait_for(server.proc.stdout.readline(), timeout=10)
    answer = json.loads(line)
    assert answer["id"] == 2, answer
    result = answer["result"]
    assert not result.get("isError") and "finished-in-time" in result["content"][0]["text"], result
    code = await server.exited_within(5.0)
    assert code == 0, code


async def test_a_second_signal_cancels_the_calls_in_flight_at_once(ws: Workspace) -> None:
    ws.manifest(CONFINED)
    token = sleep_token()
    server = await RawServer.start(ws, "--shutdown-timeout", "600")
    await server.start_bash(leaving_children(token))
    await started(token)
    server.proc.send_signal(signal.SIGTERM)
    await asyncio.sleep(0.3)
    assert processes_with(token), "the first signal killed the command"
    server.proc.send_signal(signal.SIGTERM)
    await eventually("every process gone after the second SIGTERM", 2.0, lambda: not processes_with(token))
    code = await server.exited_within(2.0)
    assert code == 0, code
