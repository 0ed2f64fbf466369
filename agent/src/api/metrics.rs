//! The agent's wipe metrics: bytes written or discarded, and how long each
//! wipe took, by mode (and result).

use std::time::Duration;

use csi_scsi_daemon::Metrics;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Unit;

/// The wipe series, registered once per process.
#[derive(Clone, Debug)]
pub(super) struct WipeMetrics {
    bytes: Family<ModeLabels, Counter>,
    seconds: Family<WipeLabels, Histogram, fn() -> Histogram>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModeLabels {
    mode: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WipeLabels {
    mode: String,
    result: &'static str,
}

/// Wipe durations: 1 s to about 4 hours.
fn wipe_histogram() -> Histogram {
    Histogram::new([
        1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0,
    ])
}

impl WipeMetrics {
    /// Registers the wipe series in `metrics`.
    pub(super) fn new(metrics: &Metrics) -> Self {
        let wipes = Self {
            bytes: Family::default(),
            seconds: Family::new_with_constructor(wipe_histogram),
        };
        metrics.register_with_unit(
            "wiped",
            "Bytes written or discarded by wipes, by mode",
            Unit::Bytes,
            wipes.bytes.clone(),
        );
        metrics.register_with_unit(
            "wipe_duration",
            "Time of one wipe, by mode and result",
            Unit::Seconds,
            wipes.seconds.clone(),
        );
        wipes
    }

    /// A wipe finished: `bytes` written or discarded over all passes.
    pub(super) fn finished(&self, mode: &str, bytes: u64, took: Duration, ok: bool) {
        let mode = mode.to_owned();
        if bytes > 0 {
            self.bytes
                .get_or_create(&ModeLabels { mode: mode.clone() })
                .inc_by(bytes);
        }
        self.seconds
            .get_or_create(&WipeLabels {
                mode,
                result: if ok { "ok" } else { "error" },
            })
            .observe(took.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wipes_count_bytes_and_time_by_mode_and_result() {
        let m = Metrics::new("agent", "1.2.3", None);
        let wipes = WipeMetrics::new(&m);
        wipes.finished("zero", 1 << 30, Duration::from_secs(42), true);
        wipes.finished("random", 0, Duration::from_millis(1500), false);
        let text = m.encode();
        assert!(text.contains("csi_scsi_wiped_bytes_total{mode=\"zero\"} 1073741824"));
        assert!(!text.contains("csi_scsi_wiped_bytes_total{mode=\"random\"}"));
        assert!(text.contains(
            "csi_scsi_wipe_duration_seconds_bucket{le=\"60.0\",mode=\"zero\",result=\"ok\"} 1"
        ));
        assert!(
            text.contains(
                "csi_scsi_wipe_duration_seconds_count{mode=\"random\",result=\"error\"} 1"
            )
        );
    }
}
