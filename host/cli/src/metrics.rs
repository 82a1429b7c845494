//! What a running server counts, in Prometheus text format (`GET /metrics` over HTTP, behind
//! the bearer token). The operation histogram follows OpenTelemetry's semantic conventions
//! for MCP: `mcp.server.operation.duration` in seconds with their fixed buckets, attributes
//! `mcp.method.name`, `gen_ai.tool.name` and `error.type` (`tool_error` for a result with
//! `isError`), named the Prometheus way (`mcp_server_operation_duration_seconds`,
//! `mcp_method_name`, …).

use std::sync::OnceLock;
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// The buckets OpenTelemetry's MCP conventions fix for `mcp.server.operation.duration`.
pub const BUCKETS: [f64; 14] = [
    0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

/// `error.type` of a tool result with `isError`.
pub const TOOL_ERROR: &str = "tool_error";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Operation {
    mcp_method_name: String,
    gen_ai_tool_name: String,
    error_type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Call {
    tool: String,
    error_type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Tool {
    tool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outcome {
    outcome: String,
}

/// The server's metrics.
pub struct Metrics {
    registry: Registry,
    duration: Family<Operation, Histogram, fn() -> Histogram>,
    calls: Family<Call, Counter>,
    in_flight: Family<Tool, Gauge>,
    sessions: Gauge,
    reloads: Family<Outcome, Counter>,
    approvals: Family<Outcome, Counter>,
}

fn histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

/// The process's metrics (one server per process).
pub fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::new)
}

/// A tool call being counted: in flight until [`CallTimer::finish`].
pub struct CallTimer {
    tool: String,
    started: Instant,
    done: bool,
}

impl CallTimer {
    /// The call ended: `error` is its `error.type` (`None` for a success).
    pub fn finish(mut self, error: Option<&str>) {
        self.done = true;
        let m = metrics();
        let error_type = error.unwrap_or_default().to_string();
        m.duration
            .get_or_create(&Operation {
                mcp_method_name: "tools/call".into(),
                gen_ai_tool_name: self.tool.clone(),
                error_type: error_type.clone(),
            })
            .observe(self.started.elapsed().as_secs_f64());
        m.calls
            .get_or_create(&Call {
                tool: self.tool.clone(),
                error_type,
            })
            .inc();
        m.in_flight
            .get_or_create(&Tool {
                tool: self.tool.clone(),
            })
            .dec();
    }
}

impl Drop for CallTimer {
    fn drop(&mut self) {
        // A request dropped before it answered (the client went away) still leaves.
        if !self.done {
            metrics()
                .in_flight
                .get_or_create(&Tool {
                    tool: self.tool.clone(),
                })
                .dec();
        }
    }
}

impl Metrics {
    fn new() -> Metrics {
        let mut registry = Registry::default();
        let duration = Family::<Operation, Histogram, fn() -> Histogram>::new_with_constructor(
            histogram as fn() -> Histogram,
        );
        registry.register(
            "mcp_server_operation_duration_seconds",
            "The duration of MCP requests as the server saw them (mcp.server.operation.duration)",
            duration.clone(),
        );
        let calls = Family::<Call, Counter>::default();
        registry.register(
            "cordis_tool_calls",
            "Tool calls answered, by tool and error.type (empty: success)",
            calls.clone(),
        );
        let in_flight = Family::<Tool, Gauge>::default();
        registry.register(
            "cordis_tool_calls_in_flight",
            "Tool calls running now, by tool (bash: the commands running)",
            in_flight.clone(),
        );
        let sessions = Gauge::default();
        registry.register(
            "cordis_sessions_live",
            "MCP sessions this server holds",
            sessions.clone(),
        );
        let reloads = Family::<Outcome, Counter>::default();
        registry.register(
            "cordis_reloads",
            "Reloads by outcome (applied, unchanged, refused, failed)",
            reloads.clone(),
        );
        let approvals = Family::<Outcome, Counter>::default();
        registry.register(
            "cordis_approvals",
            "Approval requests by outcome (approved, rejected, cancelled, unavailable)",
            approvals.clone(),
        );
        Metrics {
            registry,
            duration,
            calls,
            in_flight,
            sessions,
            reloads,
            approvals,
        }
    }

    /// A tool call starts.
    pub fn call(&self, tool: &str) -> CallTimer {
        self.in_flight
            .get_or_create(&Tool {
                tool: tool.to_string(),
            })
            .inc();
        CallTimer {
            tool: tool.to_string(),
            started: Instant::now(),
            done: false,
        }
    }

    /// A reload ended with `outcome`.
    pub fn reload(&self, outcome: &str) {
        self.reloads
            .get_or_create(&Outcome {
                outcome: outcome.to_string(),
            })
            .inc();
    }

    /// An approval request was answered with `outcome`.
    pub fn approval(&self, outcome: &str) {
        self.approvals
            .get_or_create(&Outcome {
                outcome: outcome.to_string(),
            })
            .inc();
    }

    /// The text exposition, with `sessions` live now.
    pub fn render(&self, sessions: usize) -> String {
        self.sessions.set(sessions as i64);
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
