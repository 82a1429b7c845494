//! Traces over OTLP/HTTP when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set; nothing is exported, and nothing is kept,
//! otherwise.
//!
//! A span per MCP request (`initialize`, `tools/list`, `tools/call`), following
//! OpenTelemetry's semantic conventions for MCP: named `"{mcp.method.name} {gen_ai.tool.name}"`
//! (`tools/call read`), kind server, with `mcp.method.name`, `gen_ai.tool.name`,
//! `gen_ai.operation.name` (`execute_tool`), `jsonrpc.request.id`, `mcp.session.id`,
//! `mcp.protocol.version`, `network.transport` (`pipe` on stdio, `tcp` over HTTP), and
//! `error.type` (`tool_error` for a result with `isError`, the JSON-RPC code for a protocol
//! error, with `rpc.response.status_code`). Its parent is the client's span when the
//! request's `_meta` carries W3C trace context (`traceparent`, `tracestate`).
//!
//! The exporter is opentelemetry-otlp's, in a batch on its own thread, over `ureq` (the
//! HTTP client the OAuth mode uses); the standard `OTEL_*` variables configure it
//! (endpoint, headers, timeout, `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`).

use std::sync::OnceLock;

use opentelemetry::propagation::{Extractor, TextMapPropagator as _};
use opentelemetry::trace::{Span as _, SpanKind, Status, Tracer as _, TracerProvider as _};
use opentelemetry::KeyValue;
use opentelemetry_http::{Bytes, HttpClient, HttpError};
use opentelemetry_otlp::{Protocol, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracerProvider, Span, Tracer};

/// The variables that turn exporting on.
pub const ENDPOINT_ENVS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
];

/// The largest answer read from the collector.
const MAX_ANSWER: u64 = 1024 * 1024;

static TRACER: OnceLock<Tracer> = OnceLock::new();

/// Exporting while held; dropping it sends what is buffered.
#[must_use = "traces are exported while this is held"]
pub struct Tracing {
    provider: SdkTracerProvider,
}

impl Drop for Tracing {
    fn drop(&mut self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!("the last traces were not all exported: {e}");
        }
    }
}

/// Starts exporting when an OTLP endpoint is configured; `Ok(None)` when none is.
pub fn init(transport: &'static str) -> anyhow::Result<Option<Tracing>> {
    let Some((var, endpoint)) = ENDPOINT_ENVS.iter().find_map(|v| {
        std::env::var(v)
            .ok()
            .filter(|e| !e.is_empty())
            .map(|e| (*v, e))
    }) else {
        return Ok(None);
    };
    // The exporter reads the variables itself (a signal's endpoint is used as it is, the
    // general one gets `/v1/traces`).
    export(None, &format!("{var}={endpoint}"), transport).map(Some)
}

/// Starts exporting to the OTLP/HTTP receiver at `endpoint` (its base URL), whatever the
/// environment says.
pub fn export_to(endpoint: &str, transport: &'static str) -> anyhow::Result<Tracing> {
    let url = format!("{}/v1/traces", endpoint.trim_end_matches('/'));
    export(Some(url), endpoint, transport)
}

fn export(url: Option<String>, named: &str, transport: &'static str) -> anyhow::Result<Tracing> {
    let agent = crate::outbound::agent(std::time::Duration::from_secs(10), |config| {
        config.http_status_as_error(false)
    });
    let mut builder = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_http_client(Ureq(agent));
    if let Some(url) = url {
        builder = builder.with_endpoint(url);
    }
    let exporter = builder
        .build()
        .map_err(|e| anyhow::anyhow!("{named}: cannot export traces there: {e}"))?;
    let mut resource = opentelemetry_sdk::Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name("cordis");
    }
    let resource = resource
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build();
    let _ = TRANSPORT.set(transport);
    if TRACER.set(provider.tracer("cordis")).is_err() {
        anyhow::bail!("traces are already exported by this process");
    }
    tracing::info!("exporting traces over OTLP/HTTP ({named})");
    Ok(Tracing { provider })
}

static TRANSPORT: OnceLock<&'static str> = OnceLock::new();

/// One MCP request's span, ended by [`Operation::finish`] (or when dropped: a request
/// that never answered, e.g. cancelled).
pub struct Operation(Option<Span>);

/// What a request's span records.
pub struct Request<'a> {
    /// `tools/call`, `tools/list`, `initialize`.
    pub method: &'static str,
    /// The tool a `tools/call` calls.
    pub tool: Option<&'a str>,
    /// The request's `_meta`, where the client's trace context is.
    pub meta: &'a serde_json::Map<String, serde_json::Value>,
    /// The JSON-RPC id.
    pub id: &'a dyn std::fmt::Display,
    /// The MCP session, when there is one.
    pub session: Option<&'a str>,
    /// The protocol version negotiated.
    pub protocol: Option<String>,
}

/// Starts `request`'s span, or nothing when traces are off.
pub fn start(request: Request<'_>) -> Operation {
    let Some(tracer) = TRACER.get() else {
        return Operation(None);
    };
    let parent = TraceContextPropagator::new().extract(&Meta(request.meta));
    let name = match request.tool {
        Some(tool) => format!("{} {tool}", request.method),
        None => request.method.to_string(),
    };
    let mut attributes = vec![
        KeyValue::new("mcp.method.name", request.method),
        KeyValue::new("jsonrpc.request.id", request.id.to_string()),
        KeyValue::new("network.transport", *TRANSPORT.get().unwrap_or(&"pipe")),
    ];
    if let Some(tool) = request.tool {
        attributes.push(KeyValue::new("gen_ai.tool.name", tool.to_string()));
        attributes.push(KeyValue::new("gen_ai.operation.name", "execute_tool"));
    }
    if let Some(session) = request.session {
        attributes.push(KeyValue::new("mcp.session.id", session.to_string()));
    }
    if let Some(protocol) = request.protocol {
        attributes.push(KeyValue::new("mcp.protocol.version", protocol));
    }
    let span = tracer
        .span_builder(name)
        .with_kind(SpanKind::Server)
        .with_attributes(attributes)
        .start_with_context(tracer, &parent);
    Operation(Some(span))
}

impl Operation {
    /// The request answered: `error` is its `error.type` (`None` for a success), `code`
    /// the JSON-RPC error code of a protocol error.
    pub fn finish(mut self, error: Option<&str>, code: Option<i32>) {
        let Some(mut span) = self.0.take() else {
            return;
        };
        if let Some(error) = error {
            span.set_attribute(KeyValue::new("error.type", error.to_string()));
            span.set_status(Status::error(error.to_string()));
        }
        if let Some(code) = code {
            span.set_attribute(KeyValue::new("rpc.response.status_code", code.to_string()));
        }
        span.end();
    }
}

impl Drop for Operation {
    fn drop(&mut self) {
        if let Some(mut span) = self.0.take() {
            span.set_attribute(KeyValue::new("error.type", "cancelled"));
            span.set_status(Status::error("the request ended without an answer"));
            span.end();
        }
    }
}

/// A request's `_meta` as a carrier of trace context.
struct Meta<'a>(&'a serde_json::Map<String, serde_json::Value>);

impl Extractor for Meta<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(serde_json::Value::as_str)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

/// opentelemetry-otlp's HTTP client: `ureq`, blocking on the exporter's own thread.
#[derive(Debug)]
struct Ureq(ureq::Agent);

#[async_trait::async_trait]
impl HttpClient for Ureq {
    async fn send_bytes(
        &self,
        request: http::Request<Bytes>,
    ) -> Result<http::Response<Bytes>, HttpError> {
        let (parts, body) = request.into_parts();
        let mut response = self
            .0
            .run(http::Request::from_parts(parts, body.to_vec()))?;
        let status = response.status();
        let body = response
            .body_mut()
            .with_config()
            .limit(MAX_ANSWER)
            .read_to_vec()?;
        Ok(http::Response::builder()
            .status(status)
            .body(Bytes::from(body))?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::TraceContextExt as _;

    #[test]
    fn the_parent_comes_from_the_requests_meta() {
        let meta = serde_json::json!({
            "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "progressToken": 1
        });
        let meta = meta.as_object().unwrap();
        let parent = TraceContextPropagator::new().extract(&Meta(meta));
        let span = parent.span();
        let context = span.span_context();
        assert!(context.is_remote() && context.is_valid());
        assert_eq!(
            context.trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        assert_eq!(context.span_id().to_string(), "b7ad6b7169203331");
    }

    #[test]
    fn without_an_endpoint_nothing_is_traced() {
        // No tracer is installed in unit tests: a request costs one load and no span.
        let meta = serde_json::Map::new();
        let op = start(Request {
            method: "tools/call",
            tool: Some("read"),
            meta: &meta,
            id: &1,
            session: None,
            protocol: None,
        });
        assert!(op.0.is_none());
    }
}
