"""Approvals answered by an operator outside the MCP client: a client that cannot be asked
(no elicitation) waits, with progress, while a person answers with `cordis approvals
approve|deny` or over HTTP with the operator's token; the answer is the same one-call grant.
A sandboxed command cannot answer its own escalation, and nobody answering in time is
`unavailable`."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import httpx2
import pytest
from conftest import CONFINED, DENIED, MODES, Workspace, eventually, required_env, show, text
from test_http import connect, servers, start  # noqa: F401  (`servers` is a fixture)
from test_server import ESCALATE

OPERATOR = "the-operator-token-0123456789abcdef"


def approvals(ws: Workspace, *args: str) -> subprocess.CompletedProcess[str]:
    """`cordis approvals ...` as an operator on this machine runs it."""
    env = {**os.environ, "CORDIS_STATE_DIR": str(ws.root / "state")}
    return subprocess.run(
        [required_env("CORDIS_BIN"), "approvals", *args], env=env, capture_output=True, text=True, timeout=60
    )


def waiting(ws: Workspace) -> list[dict[str, Any]]:
    listed = approvals(ws, "list", "--format", "json")
    assert listed.returncode == 0, listed.stderr
    return json.loads(listed.stdout)


async def one_waiting(ws: Workspace) -> dict[str, Any]:
    await eventually("an approval waits", 30, lambda: waiting(ws))
    (pending,) = waiting(ws)
    return pending


@pytest.mark.parametrize("mode", MODES)
async def test_an_operator_approves_and_denies_while_a_client_without_elicitation_waits(
    ws: Workspace, outside: Path, mode: str
) -> None:
    ws.manifest(CONFINED)
    victim = outside / "victim.txt"
    victim.write_text("original\n")
    progress: list[str] = []

    async def on_progress(_progress: float, _total: float | None, message: str | None) -> None:
        progress.append(message or "")

    async with ws.connect(ws.project("p"), mode=mode) as client:
        args = {"path": str(victim), "content": "original\nescalated\n", **ESCALATE}
        call = asyncio.create_task(client.call_tool("write", args, progress_callback=on_progress))
        pending = await one_waiting(ws)
        assert pending["tool"] == "write", pending
        # The operator sees what a client would show: the whole request and the agent's words.
        assert str(victim) in pending["prompt"] and "escalated" in pending["prompt"], pending
        assert "the change is needed outside the project" in pending["prompt"], pending
        human = approvals(ws, "list")
        assert human.returncode == 0 and f"cordis approvals approve {pending['id']}" in human.stdout, human
        # The client hears that it waits, and for whom.
        await eventually("a progress report", 10, lambda: any(pending["id"] in m for m in progress))
        assert not call.done() and victim.read_text() == "original\n"
        answered = approvals(ws, "approve", pending["id"])
        assert answered.returncode == 0, answered.stderr
        r = await asyncio.wait_for(call, 30)
        assert not r.is_error, show(r)
        assert victim.read_text() == "original\nescalated\n"
        assert waiting(ws) == []
        # Answered once: the same id is not waiting any more.
        again = approvals(ws, "approve", pending["id"])
        assert again.returncode != 0 and "is waiting" in again.stderr, again

        # The grant was for that call only: the plain call is denied again.
        plain = await client.call_tool("write", {"path": str(victim), "content": "plain\n"})
        assert plain.is_error and text(plain).startswith(DENIED), show(plain)

        # A denial: the call is refused and nothing changes.
        call = asyncio.create_task(client.call_tool("write", {**args, "content": "denied\n"}))
        pending = await one_waiting(ws)
        denied = approvals(ws, "deny", pending["id"])
        assert denied.returncode == 0, denied.stderr
        r = await asyncio.wait_for(call, 30)
        assert r.is_error and "was rejected by the user" in text(r), show(r)
    assert victim.read_text() == "original\nescalated\n"


async def test_nobody_answering_in_time_is_unavailable(ws: Workspace, outside: Path) -> None:
    ws.manifest(CONFINED)
    victim = outside / "victim.txt"
    victim.write_text("original\n")
    async with ws.connect(ws.project("p"), extra_args=["--approval-timeout", "1"]) as client:
        r = await client.call_tool("write", {"path": str(victim), "content": "x\n", **ESCALATE})
        assert r.is_error and "is unavailable" in text(r), show(r)
    assert victim.read_text() == "original\n"
    assert waiting(ws) == []


async def test_a_sandboxed_command_cannot_answer_its_own_escalation(ws: Workspace, outside: Path) -> None:
    """The strongest shell the policy allows: the network and unix sockets on. The command
    knows where the socket is and which approval waits, and runs `cordis approvals` itself."""
    ws.manifest(
        CONFINED.replace(
            "mode: workspace-write\n", "mode: workspace-write\n    network: true\n    allowUnixSockets: true\n"
        )
    )
    victim = outside / "victim.txt"
    victim.write_text("original\n")
    state = ws.root / "state"
    async with ws.connect(ws.project("p"), mode="legacy") as client:
        call = asyncio.create_task(
            client.call_tool("write", {"path": str(victim), "content": "pwned\n", **ESCALATE})
        )
        pending = await one_waiting(ws)
        run_dir = state / "run" / pending["id"].split(".")[0]
        socket_path = run_dir / "approvals.sock"
        assert socket_path.exists()
        connect_socket = (
            "import socket; s = socket.socket(socket.AF_UNIX); "
            f"s.connect({str(socket_path)!r}); "
            f"s.sendall(b'{{\"op\":\"approve\",\"key\":\"guess\",\"id\":\"{pending['id']}\"}}\\n'); "
            "print('REPLY', s.recv(4096))"
        )
        attack = (
            f"cat '{run_dir}/approvals.key'; echo KEY=$?; "
            f"python3 -c \"{connect_socket}\"; echo SOCKET=$?; "
            f"'{required_env('CORDIS_BIN')}' --state-dir '{state}' approvals approve {pending['id']}; echo CLI=$?"
        )
        r = await client.call_tool("bash", {"command": attack})
        out = text(r)
        assert "KEY=0" not in out and "CLI=0" not in out, show(r)
        # The socket answers only with the key, and the command cannot read it.
        assert "SOCKET=0" not in out or "wrong key" in out, show(r)
        assert "answered" not in out, show(r)
        assert not call.done()
        assert [p["id"] for p in waiting(ws)] == [pending["id"]]
        assert approvals(ws, "deny", pending["id"]).returncode == 0
        r = await asyncio.wait_for(call, 30)
        assert r.is_error, show(r)
    assert victim.read_text() == "original\n"


async def test_over_http_only_the_operators_token_lists_and_answers(
    ws: Workspace, outside: Path, servers: list[Any]  # noqa: F811
) -> None:
    ws.manifest(CONFINED)
    victim = outside / "victim.txt"
    victim.write_text("original\n")
    server = await start(servers, ws, env={"CORDIS_OPERATOR_TOKEN": OPERATOR})
    base = server.url.rsplit("/mcp", 1)[0]
    operator = {"Authorization": f"Bearer {OPERATOR}"}
    async with connect(server.url) as s:
        # The token is in the server's environment; a command cannot read it there (through
        # any process's `/proc/PID/environ`), nor inherit it.
        leak = await s.call_tool(
            "bash", {"command": "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c OPERATOR_TOKEN; env | grep -c OPERATOR_TOKEN; echo scanned"}
        )
        assert "scanned" in text(leak) and OPERATOR not in text(leak), show(leak)
        assert text(leak).split()[:2] == ["0", "0"], show(leak)
        call = asyncio.create_task(s.call_tool("write", {"path": str(victim), "content": "http\n", **ESCALATE}))
        await eventually("an approval waits", 30, lambda: httpx2.get(f"{base}/approvals", headers=operator).json()["pending"])
        (pending,) = httpx2.get(f"{base}/approvals", headers=operator).json()["pending"]
        assert str(victim) in pending["prompt"], pending
        # A client's token is not an operator's: a client cannot approve its own escalation.
        client = {"Authorization": "Bearer t0ken-for-the-http-tests-0123456789"}
        assert httpx2.get(f"{base}/approvals", headers=client).status_code == 401
        assert httpx2.post(f"{base}/approvals/{pending['id']}/approve", headers=client).status_code == 401
        assert httpx2.post(f"{base}/approvals/{pending['id']}/approve").status_code == 401
        assert not call.done()
        assert httpx2.post(f"{base}/approvals/{pending['id']}/maybe", headers=operator).status_code == 404
        ok = httpx2.post(f"{base}/approvals/{pending['id']}/approve", headers=operator)
        assert ok.status_code == 200 and ok.json() == {"answered": pending["id"]}, ok.text
        r = await asyncio.wait_for(call, 30)
        assert not r.is_error, show(r)
        twice = httpx2.post(f"{base}/approvals/{pending['id']}/approve", headers=operator)
        assert twice.status_code == 409, twice.text
    assert victim.read_text() == "http\n"


async def test_over_http_without_an_operator_token_approvals_are_answered_on_the_machine(
    ws: Workspace, servers: list[Any]  # noqa: F811
) -> None:
    ws.manifest(CONFINED)
    server = await start(servers, ws)
    base = server.url.rsplit("/mcp", 1)[0]
    client = {"Authorization": "Bearer t0ken-for-the-http-tests-0123456789"}
    refused = httpx2.get(f"{base}/approvals", headers=client)
    assert refused.status_code == 403 and "CORDIS_OPERATOR_TOKEN" in refused.text, refused.text
    # The operator's token may not be a client's.
    with pytest.raises(AssertionError, match="also a client's token"):
        await start(servers, ws, env={"CORDIS_OPERATOR_TOKEN": "t0ken-for-the-http-tests-0123456789"})
