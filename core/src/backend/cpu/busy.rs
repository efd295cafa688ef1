//! How busy the CPU device is: the CPU time the process's threads spent (from
//! /proc/self/task/*/schedstat, in ns) over wall time times the compute threads, between two
//! reports. Virtual devices `cpu:N` share the process's cores, so each reports the same
//! process-wide figure. `None` where /proc is not there (not Linux).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

/// CPU time of each live thread of this process, in ns, by thread id.
type ThreadTimes = HashMap<u64, u64>;

#[derive(Debug)]
pub struct BusyMeter {
    last: Mutex<Option<(Instant, ThreadTimes)>>,
}

/// CPU time of every live thread of this process, in ns.
fn thread_times() -> Option<ThreadTimes> {
    let mut times = ThreadTimes::new();
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let task = task.ok()?;
        let Some(id) = task.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        // A thread may end between listing and reading: skip it.
        if let Ok(text) = std::fs::read_to_string(task.path().join("schedstat")) {
            times.insert(id, text.split_whitespace().next()?.parse().ok()?);
        }
    }
    Some(times)
}

/// The CPU time spent between two readings by the threads alive at the second: a thread that
/// ended takes its time with it, so the totals' difference could go down and hide the others' work.
fn spent(then: &ThreadTimes, now: &ThreadTimes) -> u64 {
    now.iter()
        .map(|(id, &ns)| ns.saturating_sub(then.get(id).copied().unwrap_or(0)))
        .sum()
}

impl Default for BusyMeter {
    fn default() -> Self {
        BusyMeter::new()
    }
}

impl BusyMeter {
    pub fn new() -> BusyMeter {
        BusyMeter {
            last: Mutex::new(thread_times().map(|times| (Instant::now(), times))),
        }
    }

    /// The busy fraction since the previous call, for `threads` compute threads.
    pub fn utilization(&self, threads: usize) -> Option<f64> {
        let times = thread_times()?;
        let now = Instant::now();
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let (then, then_times) = last.replace((now, times))?;
        let now_times = &last.as_ref()?.1;
        let wall = (now - then).as_nanos() as f64 * threads.max(1) as f64;
        (wall > 0.0).then(|| (spent(&then_times, now_times) as f64 / wall).clamp(0.0, 1.0))
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
    fn a_thread_that_ends_does_not_hide_the_others_work() {
        let then = super::ThreadTimes::from([(1, 500), (2, 9_000)]);
        // Thread 2 ended with its 9 µs; thread 1 worked 300 ns more; thread 3 started and worked 40 ns.
        let now = super::ThreadTimes::from([(1, 800), (3, 40)]);
        assert_eq!(super::spent(&then, &now), 340);
    }

    #[test]
    fn a_busy_thread_shows_up() {
        let meter = super::BusyMeter::new();
        if meter.utilization(1).is_none() {
            // First call after construction may be None only where /proc is missing.
            assert!(super::thread_times().is_none());
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
