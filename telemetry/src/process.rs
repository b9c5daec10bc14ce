//! The standard `process_*` metrics of Prometheus client libraries (CPU,
//! memory, file descriptors, threads, start time), read from `/proc` at
//! each scrape. Unprefixed, as every exporter names them, so the usual
//! dashboards and alerts apply unchanged.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Unit;

/// One reading of this process.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProcessReading {
    pub cpu_seconds: f64,
    pub resident_bytes: i64,
    pub virtual_bytes: i64,
    pub open_fds: i64,
    /// The soft limit on open files (`None`: unlimited).
    pub max_fds: Option<i64>,
    pub threads: i64,
    pub start_time_seconds: f64,
}

impl ProcessReading {
    /// This process now; `None` where `/proc` cannot be read.
    pub fn now() -> Option<Self> {
        let me = procfs::process::Process::myself().ok()?;
        let stat = me.stat().ok()?;
        let ticks = procfs::ticks_per_second() as f64;
        let boot = procfs::boot_time_secs().ok()? as f64;
        let max_fds = match me.limits().ok()?.max_open_files.soft_limit {
            procfs::process::LimitValue::Value(v) => i64::try_from(v).ok(),
            procfs::process::LimitValue::Unlimited => None,
        };
        Some(Self {
            cpu_seconds: (stat.utime + stat.stime) as f64 / ticks,
            resident_bytes: i64::try_from(stat.rss.saturating_mul(procfs::page_size())).unwrap_or(i64::MAX),
            virtual_bytes: i64::try_from(stat.vsize).unwrap_or(i64::MAX),
            open_fds: i64::try_from(me.fd_count().ok()?).unwrap_or(i64::MAX),
            max_fds,
            threads: stat.num_threads,
            start_time_seconds: boot + stat.starttime as f64 / ticks,
        })
    }
}

/// Reads the process at each scrape.
#[derive(Debug, Default)]
pub struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(r) = ProcessReading::now() else {
            return Ok(());
        };
        let cpu = ConstCounter::new(r.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu",
            "Total user and system CPU time spent in seconds.",
            Some(&Unit::Seconds),
            cpu.metric_type(),
        )?)?;
        let gauges = [
            (
                "process_resident_memory",
                "Resident memory size in bytes.",
                Some(Unit::Bytes),
                Some(r.resident_bytes),
            ),
            (
                "process_virtual_memory",
                "Virtual memory size in bytes.",
                Some(Unit::Bytes),
                Some(r.virtual_bytes),
            ),
            (
                "process_open_fds",
                "Number of open file descriptors.",
                None,
                Some(r.open_fds),
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors.",
                None,
                r.max_fds,
            ),
            (
                "process_threads",
                "Number of OS threads in the process.",
                None,
                Some(r.threads),
            ),
        ];
        for (name, help, unit, value) in gauges {
            let Some(value) = value else { continue };
            let gauge = ConstGauge::new(value);
            gauge.encode(encoder.encode_descriptor(name, help, unit.as_ref(), gauge.metric_type())?)?;
        }
        let start = ConstGauge::new(r.start_time_seconds);
        start.encode(encoder.encode_descriptor(
            "process_start_time",
            "Start time of the process since unix epoch in seconds.",
            Some(&Unit::Seconds),
            start.metric_type(),
        )?)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_reads_as_itself() {
        let r = ProcessReading::now().expect("/proc is readable on Linux");
        assert!(r.resident_bytes > 1024 * 1024, "{r:?}");
        assert!(r.virtual_bytes >= r.resident_bytes);
        assert!(r.open_fds >= 3, "stdin, stdout, stderr at least: {r:?}");
        assert!(r.threads >= 1);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(
            r.start_time_seconds <= now + 1.0 && r.start_time_seconds > now - 86_400.0,
            "started within a day: {r:?}"
        );
        // Burn a little CPU: the counter moves.
        let before = r.cpu_seconds;
        let mut x = 0u64;
        let start = std::time::Instant::now();
        while start.elapsed() < std::time::Duration::from_millis(200) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        assert!(x != 1);
        assert!(ProcessReading::now().unwrap().cpu_seconds > before);
    }
}
