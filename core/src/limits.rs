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

/// This machine's RAM (None where `/proc/meminfo` is not there) and swap, in bytes, read once.
pub(crate) fn ram_and_swap() -> (Option<u64>, u64) {
    static READ: std::sync::OnceLock<(Option<u64>, u64)> = std::sync::OnceLock::new();
    *READ.get_or_init(|| {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        (
            meminfo_bytes(&meminfo, "MemTotal"),
            meminfo_bytes(&meminfo, "SwapTotal").unwrap_or(0),
        )
    })
}

/// A file `path` read whole, where reading it and what is made of it (`expansion` bytes in
/// memory per byte of the file) fits this machine's RAM and swap; refused before reading
/// otherwise, saying the sizes and `instead` (what to do).
pub(crate) fn read_file_that_fits(path: &std::path::Path, expansion: u64, instead: &str) -> Result<Vec<u8>> {
    let len = std::fs::metadata(path).map_err(|e| Error::io(path, e))?.len();
    if let (Some(ram), swap) = ram_and_swap() {
        let needed = len.saturating_mul(expansion);
        if needed > ram + swap {
            let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
            return Err(Error::data(
                path.display().to_string(),
                format!(
                    "{:.1} GiB: training on it takes about {:.0} GiB of memory, more than this machine's {:.1} GiB; {instead}",
                    gib(len),
                    gib(needed),
                    gib(ram + swap)
                ),
            ));
        }
    }
    std::fs::read(path).map_err(|e| Error::io(path, e))
}

/// A `/proc/meminfo` field's value (kB there) in bytes.
fn meminfo_bytes(meminfo: &str, field: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.split(':').next() == Some(field))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_fields_are_read_in_bytes() {
        let text = "MemTotal:       24576000 kB\nMemFree:  1 kB\nSwapTotal:      0 kB\n";
        assert_eq!(meminfo_bytes(text, "MemTotal"), Some(24_576_000 * 1024));
        assert_eq!(meminfo_bytes(text, "SwapTotal"), Some(0));
        assert_eq!(meminfo_bytes(text, "Mem"), None);
    }

    #[test]
    fn a_file_is_read_only_where_what_is_made_of_it_fits() {
        let path = std::env::temp_dir().join(format!("lockstep-limits-{}.txt", std::process::id()));
        std::fs::write(&path, vec![b'a'; 1 << 20]).unwrap();
        assert_eq!(read_file_that_fits(&path, 10, "use less").unwrap().len(), 1 << 20);
        // A megabyte that would take a petabyte per byte: refused, unread.
        let err = read_file_that_fits(&path, 1 << 30, "split the file")
            .unwrap_err()
            .to_string();
        std::fs::remove_file(&path).unwrap();
        assert!(
            err.contains("0.0 GiB: training on it takes about 1048576 GiB of memory"),
            "{err}"
        );
        assert!(err.ends_with("; split the file"), "{err}");
    }

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
