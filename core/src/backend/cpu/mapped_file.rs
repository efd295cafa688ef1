//! Files mapped into host memory read-only (the token files of language models), so a run on
//! billions of tokens keeps only the pages its windows touch.

use std::fs::File;

use memmap2::Mmap;

/// `file`'s bytes, mapped read-only.
pub(crate) fn map_read_only(file: &File) -> std::io::Result<Mmap> {
    // SAFETY: the map is read-only and its owner keeps it alive as long as it reads it. Another
    // process truncating or rewriting the file in place while we read would change what we see;
    // Lockstep's own token caches are replaced by rename (a new file), never rewritten, and
    // nanoGPT's .bin files are written once before training, as memory-mapping readers
    // (nanoGPT's np.memmap) assume.
    unsafe { Mmap::map(file) }
}
