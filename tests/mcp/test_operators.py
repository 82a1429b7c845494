"""What an operator watches on a running `cordis run --http`: health and readiness (also
during a drain), Prometheus metrics after real calls (the OpenTelemetry MCP histogram,
tool errors by `error.type`, approvals, reloads), JSON log lines, and a reload event a
program reads from them."""

from __future__ import annotations

import asyncio
import json
import re
import signal
from typing import Any

import httpx2
from conftest import CONFINED, Workspace, eventually, processes_with, sleep_token, text
from test_http import AUTH, HttpServer, connect, servers, start  # noqa: F401  (`servers` is a fixture)

BUCKETS = ["0.01", "0.02", "0.05", "0.1", "0.2", "0.5", "1.0", "2.0", "5.0", "10.0", "30.0", "60.0", "120.0", "300.0"]


def base(server: HttpServer) -> str:
    return server.url.rsplit("/mcp", 1)[0]


def get(server: HttpServer, path: str, headers: dict[str, str] | None = None) -> httpx2.Response:
    return httpx2.get(base(server) + path, headers=headers or {}, timeout=30)


def samples(exposition: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a Prometheus/OpenMetrics text exposition: (name, labels) -> value."""
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    line_re = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
    for line in exposition.splitlines():
        if not line or line.startswith("#"):
            continue
        m = line_re.match(line)
        assert m, f"not a sample line: {line!r}"
        labels = frozenset(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def value(all_samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    assert key in all_samples, f"no sample {name}{labels}; have: {sorted(k for k in all_samples if k[0] == name)}"
    return all_samples[key]


async def test_health_and_readiness_answer_anyone_and_readiness_drops_while_draining(
    ws: Workspace, servers: list[HttpServer]  # noqa: F811
) -> None:
    ws.manifest(CONFINED)
    server = await start(servers, ws, "--shutdown-timeout", "10")
    health, ready = get(server, "/healthz"), get(server, "/readyz")
    assert (health.status_code, health.text) == (200, "ok\n")
    assert (ready.status_code, ready.text) == (200, "ready\n")
    # Nothing else is revealed without the token.
    assert get(server, "/metrics").status_code == 401
    token = sleep_token().replace("2468.", "3.")
    try:
        async with connect(server.url) as s:
            asyncio.create_task(s.call_tool("bash", {"command": f"sleep {token}; echo done"}))
            await eventually("the command started", 30, lambda: processes_with(f"sleep {token}"))
            server.proc.send_signal(signal.SIGTERM)
            await eventually("readiness drops", 10, lambda: get(server, "/readyz").status_code == 503)
            assert get(server, "/readyz").text == "draining\n"
            assert get(server, "/healthz").status_code == 200
            assert await asyncio.wait_for(server.proc.wait(), 20) == 0, server.logged()
    except BaseExceptionGroup as group:
        # The server exits once the call has finished; the client's open streams end with it
        # (the call's outcome is not what this test is about).
        rest = group.subgroup(lambda e: not isinstance(e, (BaseExceptionGroup, httpx2.ReadError, httpx2.RemoteProtocolError)))
        if rest is not None:
            raise
    assert await asyncio.wait_for(server.proc.wait(), 20) == 0, server.logged()


async def test_metrics_count_the_calls_errors_approvals_and_reloads(ws: Workspace, servers: list[HttpServer]) -> None:  # noqa: F811
    manifest = ws.manifest(CONFINED)
    (ws.project("p") / "f.txt").write_text("four\n")
    # No operator channel: an escalation nobody can be asked about is unavailable at once.
    server = await start(servers, ws, "--approval-timeout", "0")
    async with connect(server.url) as s:
        for _ in range(3):
            r = await s.call_tool("read", {"path": "f.txt"})
            assert not r.is_error
        missing = await s.call_tool("read", {"path": "no-such-file.txt"})
        assert missing.is_error
        # An escalation without a client or an operator that can be asked: unavailable.
        escalate = {"command": "true", "sandbox_permissions": "danger-full-access", "justification": "metrics"}
        r = await s.call_tool("bash", escalate)
        assert r.is_error
        # A reload: the policy's network toggled.
        before = server.count(r"reload: ")
        manifest.write_text(CONFINED.replace("mode: workspace-write\n", "mode: workspace-write\n    network: true\n"))
        await eventually("the reload", 30, lambda: server.count(r"reload: ") > before)
        response = get(server, "/metrics", AUTH)
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("application/openmetrics-text")
        m = samples(response.text)
        ok = {"mcp_method_name": "tools/call", "gen_ai_tool_name": "read", "error_type": ""}
        failed = {**ok, "error_type": "tool_error"}
        name = "mcp_server_operation_duration_seconds"
        assert value(m, f"{name}_count", **ok) == 3
        assert value(m, f"{name}_count", **failed) == 1
        # The fixed buckets of the convention, cumulative, ending at +Inf = count.
        counts = [value(m, f"{name}_bucket", **ok, le=b) for b in BUCKETS]
        assert counts == sorted(counts), counts
        assert value(m, f"{name}_bucket", **ok, le="+Inf") == 3
        assert value(m, f"{name}_sum", **ok) > 0
        assert value(m, "cordis_tool_calls_total", tool="read", error_type="") == 3
        assert value(m, "cordis_tool_calls_total", tool="read", error_type="tool_error") == 1
        assert value(m, "cordis_tool_calls_total", tool="bash", error_type="tool_error") == 1
        assert value(m, "cordis_approvals_total", outcome="unavailable") == 1
        assert value(m, "cordis_reloads_total", outcome="applied") >= 1
        assert value(m, "cordis_sessions_live") >= 1
        assert value(m, "cordis_tool_calls_in_flight", tool="read") == 0


async def test_json_log_lines_and_a_reload_event_a_program_reads(ws: Workspace, servers: list[HttpServer]) -> None:  # noqa: F811
    manifest = ws.manifest(CONFINED)
    server = await start(servers, ws, "--log-format", "json")
    manifest.write_text(CONFINED.replace("mode: workspace-write\n", "mode: workspace-write\n    network: true\n"))

    def reload_events() -> list[dict[str, Any]]:
        events = []
        for line in server.log:
            obj = json.loads(line)
            if obj.get("event") == "reload":
                events.append(obj)
        return events

    await eventually("a reload event", 30, reload_events)
    event = reload_events()[0]
    assert event["outcome"] == "applied", event
    assert event["level"] == "INFO" and "reload: " in event["message"], event
    # Every line the server wrote is one JSON object with the common fields.
    assert server.log, "no log lines"
    for line in server.log:
        obj = json.loads(line)
        assert {"timestamp", "level", "target"} <= obj.keys(), obj
    # A refused edit is an event too, and the running composition stays.
    manifest.write_text("- name: dsh-tool-bash\n")
    await eventually("a refused reload event", 30, lambda: any(e["outcome"] == "refused" for e in reload_events()))
    assert get(server, "/readyz").status_code == 200
