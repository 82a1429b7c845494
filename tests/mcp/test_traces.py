"""Traces over OTLP/HTTP: with `OTEL_EXPORTER_OTLP_ENDPOINT` set, the server exports a span per
MCP request to a receiver the test runs (decoding the protobuf with `opentelemetry-proto`),
with OpenTelemetry's MCP attributes, `error.type` for a tool error, and the client's span as
parent when the request's `_meta` carries `traceparent`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from conftest import CONFINED, Answer, LoopbackHttp, Workspace, eventually, show
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from test_http import connect, servers, start  # noqa: F401  (`servers` is a fixture)

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


class Receiver:
    """An OTLP/HTTP trace receiver on loopback: every span it was sent, with its
    resource's attributes."""

    def __init__(self) -> None:
        self.spans: list[tuple[dict[str, Any], Span]] = []
        self.paths: list[str] = []
        self.http = LoopbackHttp(self.answer)
        self.url = self.http.url

    def answer(self, _method: str, path: str, body: bytes) -> Answer:
        self.paths.append(path)
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for resource_spans in request.resource_spans:
            resource = attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.append((resource, span))
        return 200, "application/x-protobuf", ExportTraceServiceResponse().SerializeToString()

    def named(self, name: str) -> list[tuple[dict[str, Any], Span]]:
        return [(r, s) for r, s in self.spans if s.name == name]

    def close(self) -> None:
        self.http.close()


def attributes(kvs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in kvs:
        which = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, which) if which else None
    return out


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def exporting_to(receiver: Receiver) -> dict[str, str]:
    # Export within 100 ms of a span's end rather than the default 5 s.
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "100"}


async def test_each_request_over_http_is_a_span_with_the_mcp_attributes_and_the_clients_parent(
    ws: Workspace, servers: list[Any], receiver: Receiver  # noqa: F811
) -> None:
    ws.manifest(CONFINED)
    (ws.project("p") / "notes.txt").write_text("traced\n")
    server = await start(servers, ws, env=exporting_to(receiver))
    async with connect(server.url) as s:
        await s.list_tools()
        ok = await s.call_tool("read", {"path": "notes.txt"}, meta={"traceparent": TRACEPARENT})
        assert not ok.is_error, show(ok)
        failed = await s.call_tool("read", {"path": "missing.txt"})
        assert failed.is_error, show(failed)
    await eventually("both calls' spans", 30, lambda: len(receiver.named("tools/call read")) >= 2)
    await eventually("the handshake's and the listing's spans", 30, lambda: receiver.named("initialize") and receiver.named("tools/list"))
    assert set(receiver.paths) == {"/v1/traces"}, receiver.paths

    calls = receiver.named("tools/call read")
    (resource, traced), (_, plain) = sorted(calls, key=lambda rs: rs[1].start_time_unix_nano)
    assert resource["service.name"] == "cordis", resource
    assert traced.kind == Span.SPAN_KIND_SERVER
    attrs = attributes(traced.attributes)
    assert attrs["mcp.method.name"] == "tools/call", attrs
    assert attrs["gen_ai.tool.name"] == "read" and attrs["gen_ai.operation.name"] == "execute_tool", attrs
    assert attrs["network.transport"] == "tcp", attrs
    assert attrs["mcp.session.id"] and attrs["jsonrpc.request.id"], attrs
    assert attrs["mcp.protocol.version"], attrs
    assert "error.type" not in attrs, attrs
    # The client's span is the parent: same trace, its span id as parent.
    assert traced.trace_id.hex() == TRACE_ID and traced.parent_span_id.hex() == PARENT_ID
    assert traced.end_time_unix_nano > traced.start_time_unix_nano
    # A tool error is an error span with `error.type` tool_error, in a trace of its own.
    plain_attrs = attributes(plain.attributes)
    assert plain_attrs["error.type"] == "tool_error", plain_attrs
    assert plain.status.code == plain.status.STATUS_CODE_ERROR
    assert plain.trace_id.hex() != TRACE_ID


async def test_over_stdio_the_transport_is_a_pipe(
    ws: Workspace, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws.manifest(CONFINED)
    for name, value in exporting_to(receiver).items():
        monkeypatch.setenv(name, value)
    async with ws.connect(ws.project("p"), mode="legacy") as client:
        r = await client.call_tool("list", {"path": "."})
        assert not r.is_error, show(r)
    # The server exports what it has when it stops.
    await eventually("the call's span", 30, lambda: receiver.named("tools/call list"))
    ((_, span),) = receiver.named("tools/call list")
    attrs = attributes(span.attributes)
    assert attrs["network.transport"] == "pipe" and attrs["gen_ai.tool.name"] == "list", attrs
    assert len(span.parent_span_id) == 0
