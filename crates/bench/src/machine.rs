//! What the JSON report says about the machine and the settings that shape
//! every run: CPU, cores, memory, flush instruction, kernel, persistence
//! mode, durability, emulated write latency and the date.

use serde::Serialize;

/// The `"machine"` object of the JSON report.
#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    /// CPU model name (`/proc/cpuinfo`), or `"unknown"`.
    pub cpu: String,
    /// Hardware threads this process may use.
    pub cores: usize,
    /// Total memory (`/proc/meminfo`), 0 if unknown.
    pub mem_bytes: u64,
    /// `clwb`, `clflushopt`, `clflush` or `none`.
    pub flush_instr: String,
    /// Kernel release, or `"unknown"`.
    pub kernel: String,
    /// Persistence mode the pools actually got (`dax` may fall back to
    /// `mapped`); the requested one when no persistent engine ran.
    pub mode: String,
    /// `strict` or `relaxed`.
    pub durability: String,
    /// Emulated PM write latency per flushed line.
    pub pm_write_latency_ns: u64,
    /// `grown` (engines created for `initial_capacity` keys, their
    /// default unless `--initial-capacity` is given: the tables and pool
    /// files grow during the run) or `pre-sized` (`--presized`: created
    /// for `--keys`).
    pub sizing: String,
    /// Keys the engines were created for.
    pub initial_capacity: u64,
    /// When the report was made, UTC, ISO 8601.
    pub date: String,
}

impl Machine {
    /// Describes this machine; `mode`, `durability` and the write latency
    /// come from the benchmark settings.
    pub fn detect(mode: &str, durability: &str, pm_write_latency_ns: u64) -> Machine {
        Machine {
            cpu: cpu_model().unwrap_or_else(|| "unknown".to_string()),
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            mem_bytes: mem_total().unwrap_or(0),
            flush_instr: pmem::persist::flush_instr().name().to_string(),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "unknown".to_string()),
            mode: mode.to_string(),
            durability: durability.to_string(),
            pm_write_latency_ns,
            sizing: "pre-sized".to_string(),
            initial_capacity: 0,
            date: utc_now_iso8601(),
        }
    }

    /// The same, with the run's sizing (`"grown"` or `"pre-sized"`) and
    /// the keys the engines were created for.
    pub fn with_sizing(mut self, sizing: &str, initial_capacity: u64) -> Machine {
        self.sizing = sizing.to_string();
        self.initial_capacity = initial_capacity;
        self
    }

    /// The report's first line: how the tables were sized.
    pub fn sizing_line(&self) -> String {
        if self.sizing == "grown" {
            format!(
                "tables grown from {} keys (their pool files from the default size); --presized sizes them for --keys",
                self.initial_capacity
            )
        } else {
            format!(
                "tables and pool files pre-sized for {} keys",
                self.initial_capacity
            )
        }
    }
}

fn cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    info.lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
}

fn mem_total() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The current time as `YYYY-MM-DDTHH:MM:SSZ`.
pub(crate) fn utc_now_iso8601() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    iso8601(secs)
}

/// Formats seconds since the Unix epoch as an ISO 8601 UTC date-time
/// (Howard Hinnant's `civil_from_days`).
fn iso8601(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00Z");
        assert_eq!(iso8601(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(iso8601(1_700_000_000), "2023-11-14T22:13:20Z");
    }

    #[test]
    fn detects_something() {
        let m = Machine::detect("mapped", "strict", 0);
        assert!(m.cores >= 1);
        assert!(!m.cpu.is_empty() && !m.kernel.is_empty());
        assert_eq!(m.date.len(), 20);
    }
}
