//! The proxy's metrics of its agent calls: how long each took, by method
//! and gRPC code (retries included), and how many are in flight. Failed
//! calls also go to the process's recent errors.

use std::time::Instant;

use csi_scsi_contract::NodeName;
use csi_scsi_daemon::{Metrics, code_name, rpc_histogram};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Unit;
use tonic::Code;

/// The agent-call series, registered once per process.
#[derive(Clone, Debug)]
pub struct AgentCallMetrics {
    metrics: Metrics,
    calls: Family<CallLabels, Histogram, fn() -> Histogram>,
    in_flight: Gauge,
}

/// Times one outgoing agent call and counts it in flight until it is
/// finished or dropped.
pub struct AgentCallTimer {
    calls: AgentCallMetrics,
    method: &'static str,
    start: Instant,
    done: bool,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    method: &'static str,
    code: &'static str,
}

// === impl AgentCallMetrics ===

impl AgentCallMetrics {
    /// Registers the agent-call series in `metrics`.
    pub fn new(metrics: &Metrics) -> Self {
        let calls = Family::new_with_constructor(rpc_histogram as fn() -> Histogram);
        let in_flight = Gauge::default();
        metrics.register_with_unit(
            "agent_client_handling",
            "Time of one agent API call made by the proxy, retries included, by method and gRPC code",
            Unit::Seconds,
            calls.clone(),
        );
        metrics.register(
            "agent_calls_in_flight",
            "Agent API calls the proxy is making now (fan-out included)",
            in_flight.clone(),
        );
        Self {
            metrics: metrics.clone(),
            calls,
            in_flight,
        }
    }

    /// Starts timing an outgoing agent call of `method`.
    pub fn start(&self, method: &'static str) -> AgentCallTimer {
        self.in_flight.inc();
        AgentCallTimer {
            calls: self.clone(),
            method,
            start: Instant::now(),
            done: false,
        }
    }

    /// Remembers a failed call to `node` for `/status`.
    pub fn note_error(&self, node: &NodeName, method: &str, code: Code, message: &str, rid: &str) {
        self.metrics
            .note_error(&format!("agent {node}"), method, code, message, rid);
    }
}

// === impl AgentCallTimer ===

impl AgentCallTimer {
    /// Records the call's outcome.
    pub fn finish(mut self, code: Code) {
        self.record(code);
    }

    fn record(&mut self, code: Code) {
        if self.done {
            return;
        }
        self.done = true;
        self.calls.in_flight.dec();
        self.calls
            .calls
            .get_or_create(&CallLabels {
                method: self.method,
                code: code_name(code),
            })
            .observe(self.start.elapsed().as_secs_f64());
    }
}

impl Drop for AgentCallTimer {
    fn drop(&mut self) {
        // Dropped unfinished: the caller gave up (its own deadline).
        self.record(Code::Cancelled);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_timed_by_method_and_code_and_counted_in_flight() {
        let m = Metrics::new("proxy", "1.2.3", None);
        let calls = AgentCallMetrics::new(&m);
        calls.start("Attach").finish(Code::Ok);
        drop(calls.start("Wipe"));
        let held = calls.start("Discover");
        let text = m.encode();
        assert!(text.contains(
            "csi_scsi_agent_client_handling_seconds_count{method=\"Attach\",code=\"OK\"} 1"
        ));
        assert!(text.contains(
            "csi_scsi_agent_client_handling_seconds_count{method=\"Wipe\",code=\"Canceled\"} 1"
        ));
        assert!(text.contains("csi_scsi_agent_calls_in_flight 1"), "{text}");
        held.finish(Code::Unavailable);
        assert!(m.encode().contains("csi_scsi_agent_calls_in_flight 0"));
    }
}
