//! What a run may ask of the machine, checked before anything starts: the command line, its
//! config file and the library's builders refuse a value past these bounds with an error instead
//! of letting the process abort, hang or be killed part-way (a stack guard page that cannot be
//! mapped for the 100,000th thread; a 3 TB weight).

use crate::error::{Error, Result};

/// The most threads a run may start for one purpose (compute threads, loader workers): four per
/// logical CPU, and at least 64. More only queue for the same cores; a typo's 100,000 would
/// exhaust the process's memory map before the first batch.
pub fn most_threads() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (4 * cores).max(64)
}

/// The most batches a loader worker may hold ready: each is a whole batch in memory.
pub const MOST_PREFETCHED: usize = 1024;

/// `count` threads for `what` (a flag or a builder's field, as the caller names it), refused
/// past `most_threads`.
pub fn threads(what: &'static str, count: usize) -> Result<()> {
    let most = most_threads();
    if count > most {
        return Err(Error::invalid(
            what,
            format!(
                "{count} threads is more than this machine can use: at most {most} ({} logical CPUs, four each)",
                most / 4
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_typos_thread_count_is_refused_and_the_machines_own_is_not() {
        let cores = std::thread::available_parallelism().unwrap().get();
        threads("workers", cores).unwrap();
        threads("workers", most_threads()).unwrap();
        let msg = threads("workers", 100_000).unwrap_err().to_string();
        assert!(msg.starts_with("workers: 100000 threads"), "{msg}");
        assert!(msg.contains(&format!("at most {}", most_threads())), "{msg}");
    }
}
