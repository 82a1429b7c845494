"""Shared fixtures for the MCP server tests: spawn `cordis run` over stdio with the official client.

The Rust test target `tests/mcp.rs` sets `CORDIS_BIN` (the built binary) and
`CORDIS_OUTSIDE_DIR` (a directory outside every writable root) before running pytest.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters
from mcp.types import CallToolResult, ElicitRequestParams, ElicitResult, TextContent

DENIED = "[sandbox: file access denied under workspace-write mode]"

POLICY = "- name: dsh-sandbox-policy\n  config:\n    mode: workspace-write\n"
# As the bundled cordis.yml composes them: the confined shell in a process of its own, so
# its commands' cancel and progress descriptors cross the isolation wire.
CONFINED = (
    POLICY
    + "- name: dsh-fs-sandbox\n- name: dsh-bash-sandbox\n  isolate: process\n"
    + "- name: dsh-tool-fs\n- name: dsh-tool-bash\n"
)
EXAMPLE = "- name: cordis-example\n- name: fixture-faulty\n"

# The two ways a client can connect: the 2026-07-28 per-request envelope (`server/discover`;
# approvals travel as `input_required` round trips) and the `initialize` handshake
# (approvals are `elicitation/create` requests during the call).
MODES = ["auto", "legacy"]


def required_env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(f"{name} is not set; run these tests through `cargo test -p cordis-e2e --test mcp`")
    return value


@dataclass
class Workspace:
    """A scratch directory: `cordis.yml`, `state/` for session logs, projects under it."""

    root: Path

    def manifest(self, yaml: str) -> Path:
        path = self.root / "cordis.yml"
        path.write_text(yaml)
        return path

    def project(self, name: str) -> Path:
        path = self.root / name
        path.mkdir(parents=True, exist_ok=True)
        return path.resolve()

    @asynccontextmanager
    async def connect(
        self,
        cwd: Path,
        *,
        mode: str = "auto",
        elicitation: Callable[[Any, ElicitRequestParams], Awaitable[ElicitResult]] | None = None,
        extra_args: list[str] | None = None,
        roots: Callable[[Any], Awaitable[Any]] | None = None,
    ) -> AsyncIterator[Client]:
        env = dict(os.environ)
        env["CORDIS_STATE_DIR"] = str(self.root / "state")
        env.setdefault("RUST_LOG", "warn")
        params = StdioServerParameters(
            command=required_env("CORDIS_BIN"),
            args=["run", "-c", str(self.root / "cordis.yml"), *(extra_args or [])],
            env=env,
            cwd=str(cwd),
        )
        async with Client(
            params, mode=mode, elicitation_callback=elicitation, list_roots_callback=roots, read_timeout_seconds=60
        ) as client:
            yield client


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    (tmp_path / "state").mkdir()
    return Workspace(tmp_path.resolve())


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A fresh directory outside every writable root (the scratch dirs are under a writable root)."""
    base = Path(required_env("CORDIS_OUTSIDE_DIR"))
    path = base / tmp_path.name
    path.mkdir(parents=True, exist_ok=True)
    return path.resolve()


def texts(result: CallToolResult) -> list[str]:
    return [c.text for c in result.content if isinstance(c, TextContent)]


def text(result: CallToolResult) -> str:
    """The tool's own text (the first content item)."""
    items = texts(result)
    assert items, f"no text content in {result!r}"
    return items[0]


def show(result: CallToolResult) -> str:
    return f"isError={result.is_error} content={texts(result)!r}"


def eprint(*args: object) -> None:
    print(*args, file=sys.stderr)


# --- processes a command leaves behind ----------------------------------------------------

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


# An HTTP answer: status, content type, body.
Answer = tuple[int, str, bytes]


class LoopbackHttp:
    """An HTTP server on 127.0.0.1 in a thread of its own (a test's OAuth issuer, its OTLP
    receiver): `answer(method, path, body)` answers every request."""

    def __init__(self, answer: Callable[[str, str, bytes], Answer]) -> None:
        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                status, content_type, data = answer(self.command, self.path, body)
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = _answer  # noqa: N815
            do_POST = _answer  # noqa: N815

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
