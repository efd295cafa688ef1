//! A caching pool of host vectors keyed by (dtype, length), so a training step that repeats the
//! same shapes stops calling the system allocator after its first iteration.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::dtype::{DType, Element, HostVec};

/// Memory kept for reuse beyond this is handed back to the system.
const MAX_CACHED_BYTES: u64 = 1 << 30;

#[derive(Default, Debug)]
pub struct Pool {
    free: Mutex<HashMap<(DType, usize), Vec<HostVec>>>,
    cached_bytes: AtomicU64,
    pub(super) allocated_bytes: AtomicU64,
    pub(super) peak_bytes: AtomicU64,
}

fn bytes_of(dtype: DType, len: usize) -> u64 {
    (dtype.size_in_bytes() * len) as u64
}

impl Pool {
    /// A vector of `len` elements with unspecified (but initialised) contents.
    pub fn take<T: Element>(&self, len: usize) -> Vec<T> {
        let reused = self
            .free
            .lock()
            .ok()
            .and_then(|mut free| free.get_mut(&(T::DTYPE, len)).and_then(Vec::pop));
        match reused {
            Some(v) => {
                self.cached_bytes.fetch_sub(bytes_of(T::DTYPE, len), Ordering::Relaxed);
                T::from_host(v).unwrap_or_else(|_| vec![T::from_f64(0.0); len])
            }
            None => vec![T::from_f64(0.0); len],
        }
    }

    /// Returns a buffer's memory for reuse (buffers count their bytes from creation to drop).
    pub fn give(&self, data: HostVec) {
        let (dtype, len) = (data.dtype(), data.len());
        let bytes = bytes_of(dtype, len);
        self.allocated_bytes.fetch_sub(bytes, Ordering::Relaxed);
        if len == 0 || self.cached_bytes.load(Ordering::Relaxed) + bytes > MAX_CACHED_BYTES {
            return;
        }
        if let Ok(mut free) = self.free.lock() {
            free.entry((dtype, len)).or_default().push(data);
            self.cached_bytes.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    pub fn note_alloc(&self, bytes: u64) {
        let now = self.allocated_bytes.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak_bytes.fetch_max(now, Ordering::Relaxed);
    }

    pub fn cached_bytes(&self) -> u64 {
        self.cached_bytes.load(Ordering::Relaxed)
    }
}
