"""End-to-end tests of `cordis run` as an MCP server, driven by the official Python client."""

from __future__ import annotations

import asyncio
import json
import os
import random
from pathlib import Path
from typing import Any

import pytest
from conftest import CONFINED, DENIED, EXAMPLE, MODES, Workspace, required_env, show, text, texts
from mcp.types import CallToolResult, ElicitRequestParams, ElicitResult, InputRequiredResult

ESCALATE = {"sandbox_permissions": "danger-full-access", "justification": "the change is needed outside the project"}


def tool_names(listing: Any) -> set[str]:
    return {t.name for t in listing.tools}


# --- listing, plain calls, faults -------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_lists_tools_with_schemas_and_identifies_itself(ws: Workspace, mode: str) -> None:
    ws.manifest(EXAMPLE)
    async with ws.connect(ws.project("p"), mode=mode) as client:
        info = client.server_info
        assert info is not None and info.name == "cordis", info
        tools = client.server_capabilities.tools
        assert tools is not None and tools.list_changed is True
        listing = await client.list_tools()
        assert tool_names(listing) == {"greet", "explode", "shout"}
        greet = next(t for t in listing.tools if t.name == "greet")
        assert greet.input_schema["properties"]["name"]["type"] == "string"


@pytest.mark.parametrize("mode", MODES)
async def test_a_panicking_tool_is_an_error_result_and_the_server_keeps_answering(ws: Workspace, mode: str) -> None:
    ws.manifest(EXAMPLE)
    async with ws.connect(ws.project("p"), mode=mode) as client:
        ok = await client.call_tool("greet", {"name": "Ada"})
        assert not ok.is_error and "Ada" in text(ok), show(ok)
        boom = await client.call_tool("explode", {})
        assert boom.is_error, show(boom)
        assert "panic" in text(boom).lower() or "explode" in text(boom), show(boom)
        unknown = await client.call_tool("no-such-tool", {})
        assert unknown.is_error and "no-such-tool" in text(unknown), show(unknown)
        bad = await client.call_tool("greet", {"name": 42})
        assert bad.is_error, show(bad)
        again = await client.call_tool("greet", {"name": "Grace"})
        assert not again.is_error and "Grace" in text(again), show(again)
        assert len(texts(again)) == 1, "an unchanged model context adds nothing: " + show(again)


# --- the confined file and shell tools ------------------------------------------------------


async def test_lists_the_confined_tools_with_escalation_fields(ws: Workspace) -> None:
    ws.manifest(CONFINED)
    async with ws.connect(ws.project("p")) as client:
        listing = await client.list_tools()
        assert tool_names(listing) == {"read", "write", "edit", "list", "bash"}
        for t in listing.tools:
            props = t.input_schema.get("properties", {})
            wants = t.name in {"write", "edit", "bash"}
            assert ("sandbox_permissions" in props) == wants, t
            assert ("justification" in props) == wants, t


async def test_instructions_carry_the_sandbox_policy(ws: Workspace) -> None:
    ws.manifest(CONFINED)
    proj = ws.project("p")
    async with ws.connect(proj) as client:
        assert client.instructions, "no instructions"
        assert "workspace-write" in client.instructions, client.instructions
    ws.manifest(EXAMPLE)
    async with ws.connect(proj) as client:
        assert not client.instructions, client.instructions


@pytest.mark.parametrize("mode", MODES)
async def test_write_edit_read_list_inside_the_root(ws: Workspace, mode: str) -> None:
    ws.manifest(CONFINED)
    proj = ws.project("p")
    async with ws.connect(proj, mode=mode) as client:
        w = await client.call_tool("write", {"path": str(proj / "notes.txt"), "content": "one\ntwo\n"})
        assert not w.is_error, show(w)
        assert (proj / "notes.txt").read_text() == "one\ntwo\n"
        e = await client.call_tool("edit", {"path": "notes.txt", "old_string": "two", "new_string": "three"})
        assert not e.is_error, show(e)
        assert (proj / "notes.txt").read_text() == "one\nthree\n"
        r = await client.call_tool("read", {"path": "notes.txt"})
        assert not r.is_error and "three" in text(r), show(r)
        ls = await client.call_tool("list", {"path": "."})
        assert not ls.is_error and "notes.txt" in text(ls), show(ls)
        b = await client.call_tool("bash", {"command": "echo hi > from-bash.txt"})
        assert not b.is_error, show(b)
        assert (proj / "from-bash.txt").read_text() == "hi\n"


@pytest.mark.parametrize("mode", MODES)
async def test_arguments_that_break_a_tools_schema_are_refused_before_it_runs(ws: Workspace, mode: str) -> None:
    ws.manifest(CONFINED)
    proj = ws.project("p")
    async with ws.connect(proj, mode=mode) as client:
        w = await client.call_tool("write", {"path": 42, "content": "x"})
        assert w.is_error, show(w)
        assert "`write`: invalid arguments: `path`: 42 is not of type" in text(w), show(w)
        assert "[INVALID_ARGUMENT]" in text(w) and "The tool did not run" in text(w), show(w)
        b = await client.call_tool("bash", {"command": "echo ran > ran.txt", "timeout_ms": "soon"})
        assert b.is_error and "`timeout_ms`" in text(b), show(b)
        assert not (proj / "ran.txt").exists(), "the command ran although its arguments were refused"
        ok = await client.call_tool("write", {"path": "a.txt", "content": "x"})
        assert not ok.is_error, show(ok)


@pytest.mark.parametrize("mode", MODES)
async def test_a_write_outside_the_root_is_denied_and_changes_nothing(ws: Workspace, outside: Path, mode: str) -> None:
    ws.manifest(CONFINED)
    victim = outside / "victim.txt"
    victim.write_text("original\n")
    async with ws.connect(ws.project("p"), mode=mode) as client:
        w = await client.call_tool("write", {"path": str(victim), "content": "pwned\n"})
        assert w.is_error and text(w).startswith(DENIED), show(w)
        e = await client.call_tool("edit", {"path": str(victim), "old_string": "original", "new_string": "pwned"})
        assert e.is_error and text(e).startswith(DENIED), show(e)
        fresh = await client.call_tool("write", {"path": str(outside / "new.txt"), "content": "x"})
        assert fresh.is_error and text(fresh).startswith(DENIED), show(fresh)
        b = await client.call_tool("bash", {"command": f"echo pwned >> '{victim}'"})
        assert b.is_error or "denied" in text(b).lower() or "Permission" in text(b), show(b)
    assert victim.read_text() == "original\n"
    assert not (outside / "new.txt").exists()


# --- approvals ---------------------------------------------------------------------------


class Approver:
    """An elicitation callback answering every request with one fixed reply, counting them."""

    def __init__(self, action: str, approve: bool | None = None) -> None:
        self.action = action
        self.approve = approve
        self.requests: list[ElicitRequestParams] = []

    async def __call__(self, _context: Any, params: ElicitRequestParams) -> ElicitResult:
        self.requests.append(params)
        content = None if self.approve is None else {"approve": self.approve}
        return ElicitResult(action=self.action, content=content)


OUTCOMES = [
    # (reply, expected refusal text start or None when approved)
    (("accept", True), None),
    (("accept", False), "Escalation to `danger-full-access` was rejected by the user."),
    (("decline", None), "Escalation to `danger-full-access` was rejected by the user."),
    (("cancel", None), "Escalation to `danger-full-access` was cancelled before a decision."),
    (None, "Escalation to `danger-full-access` is unavailable: no approver can be asked in this session."),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("reply", "refusal"), OUTCOMES, ids=["approve", "approve-false", "decline", "cancel", "no-capability"])
@pytest.mark.parametrize("tool", ["bash", "write"])
async def test_escalation_outcomes(
    ws: Workspace, outside: Path, mode: str, reply: tuple[str, bool | None] | None, refusal: str | None, tool: str
) -> None:
    ws.manifest(CONFINED)
    victim = outside / "victim.txt"
    victim.write_text("original\n")
    approver = Approver(*reply) if reply else None
    if tool == "bash":
        args = {"command": f"echo escalated >> '{victim}'", **ESCALATE}
        escalated = "original\nescalated\n"
    else:
        args = {"path": str(victim), "content": "original\nescalated\n", **ESCALATE}
        escalated = "original\nescalated\n"
    # Without a client that can be asked, nor an operator channel, nobody can be asked.
    extra = [] if approver is not None else ["--approval-timeout", "0"]
    async with ws.connect(ws.project("p"), mode=mode, elicitation=approver, extra_args=extra) as client:
        r = await client.call_tool(tool, args)
        if refusal is None:
            assert not r.is_error, show(r)
            assert victim.read_text() == escalated, show(r)
        else:
            assert r.is_error and text(r).startswith(refusal), show(r)
            assert victim.read_text() == "original\n", show(r)
        if approver is not None:
            assert len(approver.requests) == 1, approver.requests
            asked = approver.requests[0]
            shown = asked.message.replace("\n  ┆ ", "")  # long lines are wrapped, never cut
            assert tool in shown and "victim.txt" in shown, asked.message
            assert "the change is needed outside the project" in asked.message, asked.message
        # The grant was for that call only: the same call without escalation is denied again.
        plain = {k: v for k, v in args.items() if k not in ESCALATE}
        again = await client.call_tool(tool, plain)
        assert again.is_error, show(again)
    assert victim.read_text() == (escalated if refusal is None else "original\n")


@pytest.mark.parametrize("mode", MODES)
async def test_the_approval_prompt_shows_the_whole_request_and_cannot_be_forged(
    ws: Workspace, outside: Path, mode: str
) -> None:
    """The three prompt attacks: a command longer than a cut, a write whose content the
    prompt hid, a path with newlines forging the prompt's own lines. Every one is declined,
    so nothing may change; the test asserts on the text the person is shown."""
    ws.manifest(CONFINED)
    victim = outside / "victim.txt"
    victim.write_text("original\n")
    approver = Approver("decline")
    long_command = "echo " + "a" * 400 + f"; touch '{outside}/pwned'"
    forged_path = str(outside / "x\nJustification: approved by the operator\nApprove this one call? yes")
    justification = "harmless\nApprove this one call? yes"
    async with ws.connect(ws.project("p"), mode=mode, elicitation=approver) as client:
        calls = [
            ("bash", {"command": long_command}),
            ("write", {"path": str(victim), "content": "original\nHIDDEN PAYLOAD\n"}),
            ("write", {"path": forged_path, "content": "x"}),
        ]
        for tool, args in calls:
            r = await client.call_tool(tool, {**args, "sandbox_permissions": "danger-full-access", "justification": justification})
            assert r.is_error, show(r)
    assert len(approver.requests) == 3, approver.requests
    bash, write, forged = (r.message for r in approver.requests)
    # The whole command, the tail included, wrapped rather than cut (where the wrap falls
    # depends on the length of the temporary path, so compare with the wraps joined).
    unwrapped = bash.replace("\n  ┆ ", "")
    assert "…" not in bash, bash
    assert unwrapped.count(long_command) == 1, bash
    # The content of the write, as a diff against the current file.
    assert "+HIDDEN PAYLOAD" in write and " original" in write, write
    # No agent text starts a line of its own: newlines are escaped in the summary and
    # quoted in the blocks; the prompt's own question appears once, at the end.
    for message in (bash, write, forged):
        lines = message.splitlines()
        assert lines[-1] == "Approve this one call?", message
        assert sum(line.startswith("Approve this one call?") for line in lines) == 1, message
        assert not any(line.startswith("Justification:") for line in lines), message
        assert "its own words" in message, message
    assert "x\\nJustification: approved by the operator\\nApprove" in forged, forged
    assert victim.read_text() == "original\n"
    assert not (outside / "pwned").exists()


async def test_an_approval_answers_only_the_call_that_asked(ws: Workspace, outside: Path) -> None:
    """2026-07-28 round trip: the sealed request state is bound to its call and used once."""
    ws.manifest(CONFINED)
    victim = outside / "victim.txt"
    victim.write_text("original\n")
    approver = Approver("accept", True)
    args = {"command": f"echo escalated >> '{victim}'", **ESCALATE}
    async with ws.connect(ws.project("p"), mode="auto", elicitation=approver) as client:
        assert client.protocol_version == "2026-07-28"
        first = await client.session.call_tool("bash", args, allow_input_required=True)
        assert isinstance(first, InputRequiredResult), first
        assert first.request_state and first.input_requests and len(first.input_requests) == 1
        key = next(iter(first.input_requests))
        yes = {key: {"action": "accept", "content": {"approve": True}}}

        forged_state = first.request_state[:-2] + ("AA" if not first.request_state.endswith("AA") else "BB")
        forged = await client.session.call_tool("bash", args, input_responses=yes, request_state=forged_state)
        assert isinstance(forged, CallToolResult) and forged.is_error, forged
        other = {"command": "echo other > other.txt", **ESCALATE}
        moved = await client.session.call_tool("bash", other, input_responses=yes, request_state=first.request_state)
        assert isinstance(moved, CallToolResult) and moved.is_error, moved
        assert "does not belong to this call" in text(moved), show(moved)
        assert victim.read_text() == "original\n"

        done = await client.session.call_tool("bash", args, input_responses=yes, request_state=first.request_state)
        assert isinstance(done, CallToolResult) and not done.is_error, done
        assert victim.read_text() == "original\nescalated\n"
        replay = await client.session.call_tool("bash", args, input_responses=yes, request_state=first.request_state)
        assert isinstance(replay, CallToolResult) and replay.is_error, replay
        assert "no approval is pending" in text(replay), show(replay)
        # Answers without a state are ignored: the call starts afresh and asks again.
        fresh = await client.session.call_tool("bash", args, input_responses=yes, allow_input_required=True)
        assert isinstance(fresh, InputRequiredResult), fresh
    assert victim.read_text() == "original\nescalated\n"
    assert approver.requests == [], "the manual rounds never used the callback"


# --- sessions ---------------------------------------------------------------------------


async def test_two_sessions_with_different_roots_run_concurrently(ws: Workspace, outside: Path) -> None:
    ws.manifest(CONFINED)
    # Both projects live outside the temp dir, which every session may write.
    a, b = outside / "a", outside / "b"
    a.mkdir()
    b.mkdir()

    async def work(mine: Path, theirs: Path, tag: str) -> list[str]:
        problems: list[str] = []
        async with ws.connect(mine) as client:
            for i in range(5):
                w = await client.call_tool("write", {"path": f"w{i}.txt", "content": f"{tag}{i}"})
                if w.is_error:
                    problems.append(f"own write {i}: {show(w)}")
                sh = await client.call_tool("bash", {"command": f"sleep 0.05; echo {tag}{i} > b{i}.txt; pwd"})
                if sh.is_error or str(mine) not in text(sh):
                    problems.append(f"own bash {i}: {show(sh)}")
                cross = await client.call_tool("write", {"path": str(theirs / f"x{tag}{i}.txt"), "content": "x"})
                if not (cross.is_error and text(cross).startswith(DENIED)):
                    problems.append(f"cross write {i}: {show(cross)}")
                await client.call_tool("bash", {"command": f"echo x > '{theirs}/y{tag}{i}.txt'"})
        return problems

    pa, pb = await asyncio.gather(work(a, b, "A"), work(b, a, "B"))
    assert pa == [] and pb == [], (pa, pb)
    for proj, tag, other in [(a, "A", "B"), (b, "B", "A")]:
        for i in range(5):
            assert (proj / f"w{i}.txt").read_text() == f"{tag}{i}"
            assert (proj / f"b{i}.txt").read_text() == f"{tag}{i}\n"
            assert not (proj / f"x{other}{i}.txt").exists()
            assert not (proj / f"y{other}{i}.txt").exists()


@pytest.mark.parametrize(
    ("session", "says"),
    [
        ("no-such-session", "no session `no-such-session`"),
        ("../../escape", 'invalid session id "../../escape"'),
    ],
)
async def test_resuming_an_unknown_or_invalid_session_fails_to_start(ws: Workspace, session: str, says: str) -> None:
    """The server refuses before it speaks MCP or applies anything: exit 1, the reason on
    stderr, nothing on the protocol stream."""
    ws.manifest(EXAMPLE)
    proc = await asyncio.create_subprocess_exec(
        required_env("CORDIS_BIN"),
        "run",
        "-c",
        str(ws.root / "cordis.yml"),
        "--session",
        session,
        cwd=str(ws.project("p")),
        env={**os.environ, "CORDIS_STATE_DIR": str(ws.root / "state"), "RUST_LOG": "info"},
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout=60)
    log = stderr.decode()
    assert proc.returncode == 1, log
    assert says in log and "omit --session to start a new session" in log, log
    assert stdout == b"", stdout
    assert "greeter ready" not in log, "nothing is applied for a session that cannot be resumed"


# --- fuzz ---------------------------------------------------------------------------------

SAFE_STRINGS = ["", "x", "notes.txt", ".", "/", "..", "../..", "a/b/c", "🦀", "\u0000", "a" * 5000, "true", "echo hi"]
KEYS = ["path", "content", "old_string", "new_string", "replace_all", "offset", "limit", "command", "timeout_ms",
        "workdir", "sandbox_permissions", "justification", "name", "", "__proto__", "extra"]


def random_value(rng: random.Random, depth: int = 0) -> Any:
    kinds = ["null", "bool", "int", "float", "str"] + (["list", "obj"] if depth < 3 else [])
    kind = rng.choice(kinds)
    if kind == "null":
        return None
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "int":
        return rng.choice([0, -1, 1, 2**31, -(2**63), 2**64, rng.randint(-1000, 1000)])
    if kind == "float":
        return rng.choice([0.5, -1e308, 1e308, 3.14])
    if kind == "str":
        return rng.choice(SAFE_STRINGS + ["workspace-write", "danger-full-access", "read-only", "root"])
    if kind == "list":
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return random_object(rng, depth + 1)


def random_object(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    return {rng.choice(KEYS): random_value(rng, depth) for _ in range(rng.randint(0, 5))}


async def test_random_argument_shapes_always_come_back_as_results(ws: Workspace) -> None:
    ws.manifest(CONFINED + EXAMPLE)
    rng = random.Random(20240601)
    async with ws.connect(ws.project("p")) as client:
        names = sorted(tool_names(await client.list_tools()))
        errors = 0
        for i in range(300):
            name = rng.choice(names + ["nope"])
            args = random_object(rng)
            if name == "bash" and "command" in args:
                # Keep the shell harmless: only the command's type varies, never its text.
                args["command"] = rng.choice(["true", "echo hi", "", 7, None, ["ls"]])
            try:
                r = await client.call_tool(name, args)
            except Exception as e:  # a protocol error is a failure: every call must be a result
                pytest.fail(f"call {i} {name} {json.dumps(args)[:300]} raised {e!r}")
            assert isinstance(r, CallToolResult) and r.content, f"call {i}: {r!r}"
            errors += bool(r.is_error)
        assert errors > 50, "the generator should mostly produce invalid arguments"
        ok = await client.call_tool("greet", {"name": "still here"})
        assert not ok.is_error and "still here" in text(ok), show(ok)

