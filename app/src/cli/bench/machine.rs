//! How busy the rest of the machine was while we measured, from Linux's /proc (None elsewhere).
//! On a shared machine another process's burst skews a benchmark, PyTorch's spinning OpenMP
//! threads most of all; this says when a run should be thrown away.

/// Clock ticks since boot: all CPUs busy, all CPUs in total, and this process with its waited-for
/// children (the PyTorch peer).
#[derive(Clone, Copy, Debug)]
pub struct CpuSample {
    busy: u64,
    total: u64,
    own: u64,
}

pub fn sample() -> Option<CpuSample> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let ticks: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal …: idle and iowait are the only idle ones.
    let total: u64 = ticks.iter().take(8).sum();
    let idle = ticks.get(3)? + ticks.get(4).unwrap_or(&0);
    let own_stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The fields after the command name (which may hold spaces) start at `state`; utime, stime,
    // cutime and cstime are the 12th to 15th of them.
    let after_name = own_stat.rsplit_once(')')?.1;
    let own = after_name
        .split_whitespace()
        .skip(11)
        .take(4)
        .filter_map(|f| f.parse::<u64>().ok())
        .sum();
    Some(CpuSample {
        busy: total - idle,
        total,
        own,
    })
}

/// The share of the whole machine's CPU time that other processes used between two samples.
pub fn others_percent(before: Option<CpuSample>, after: Option<CpuSample>) -> Option<f64> {
    let (b, a) = (before?, after?);
    let total = a.total.checked_sub(b.total).filter(|&t| t > 0)?;
    let others = (a.busy.saturating_sub(b.busy)).saturating_sub(a.own.saturating_sub(b.own));
    Some(100.0 * others as f64 / total as f64)
}

/// The first three fields of /proc/loadavg, or "unknown" where there is none.
pub fn load_average() -> String {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let fields: Vec<&str> = text.split_whitespace().take(3).collect();
    if fields.len() == 3 {
        fields.join(" ")
    } else {
        "unknown".into()
    }
}

/// The process's peak resident set (VmHWM in /proc/self/status), where Linux reports it.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn others_are_busy_ticks_not_ours() {
        let before = CpuSample {
            busy: 100,
            total: 1000,
            own: 10,
        };
        let after = CpuSample {
            busy: 300,
            total: 2000,
            own: 160,
        };
        assert_eq!(others_percent(Some(before), Some(after)), Some(5.0));
        assert_eq!(others_percent(None, Some(after)), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn proc_can_be_read_here() {
        assert!(sample().is_some());
    }
}
