//! How busy the CPU device is: the process's CPU time (summed over its threads from
//! /proc/self/task/*/schedstat, in ns) over wall time times the compute threads, between two
//! reports. Virtual devices `cpu:N` share the process's cores, so each reports the same
//! process-wide figure. `None` where /proc is not there (not Linux).

use std::sync::Mutex;
use std::time::Instant;

#[derive(Debug)]
pub struct BusyMeter {
    last: Mutex<Option<(Instant, u64)>>,
}

/// CPU time of every thread of this process, in ns.
fn process_cpu_ns() -> Option<u64> {
    let mut total = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let path = task.ok()?.path().join("schedstat");
        // A thread may end between listing and reading: skip it.
        if let Ok(text) = std::fs::read_to_string(path) {
            total += text.split_whitespace().next()?.parse::<u64>().ok()?;
        }
    }
    Some(total)
}

impl Default for BusyMeter {
    fn default() -> Self {
        BusyMeter::new()
    }
}

impl BusyMeter {
    pub fn new() -> BusyMeter {
        BusyMeter {
            last: Mutex::new(process_cpu_ns().map(|ns| (Instant::now(), ns))),
        }
    }

    /// The busy fraction since the previous call, for `threads` compute threads.
    pub fn utilization(&self, threads: usize) -> Option<f64> {
        let now_ns = process_cpu_ns()?;
        let now = Instant::now();
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let previous = last.replace((now, now_ns));
        let (then, then_ns) = previous?;
        let wall = (now - then).as_nanos() as f64 * threads.max(1) as f64;
        (wall > 0.0).then(|| (now_ns.saturating_sub(then_ns) as f64 / wall).clamp(0.0, 1.0))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    /// This thread's CPU time, in ns.
    fn thread_cpu_ns() -> u64 {
        let text = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap();
        text.split_whitespace().next().unwrap().parse().unwrap()
    }

    #[test]
    fn a_busy_thread_shows_up() {
        let meter = super::BusyMeter::new();
        if meter.utilization(1).is_none() {
            // First call after construction may be None only where /proc is missing.
            assert!(super::process_cpu_ns().is_none());
            return;
        }
        // Spin for 50 ms of this thread's own CPU time, however long the machine's other load
        // makes that take: the meter must report at least that share of the wall time.
        let (start, own_start) = (Instant::now(), thread_cpu_ns());
        let mut x = 0u64;
        while thread_cpu_ns() - own_start < 50_000_000 {
            for _ in 0..10_000 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            }
        }
        std::hint::black_box(x);
        let own = (thread_cpu_ns() - own_start) as f64 / start.elapsed().as_nanos() as f64;
        let busy = meter.utilization(1).unwrap();
        assert!(
            busy >= 0.9 * own && busy > 0.0,
            "a spinning thread measured {busy}, its own CPU time says {own}"
        );
    }
}
