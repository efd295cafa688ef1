"""Counter-hashed values the parity scripts and their Rust tests both compute
(core/tests/parity_support/mod.rs mirrors this file), so no weights need committing."""

import numpy as np

MASK = (1 << 64) - 1


def splitmix(x):
    """splitmix64's finaliser on a uint64 array (wrapping arithmetic)."""
    x = (x + np.uint64(0x9E3779B97F4A7C15)) & np.uint64(MASK)
    x = ((x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & np.uint64(MASK)
    x = ((x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & np.uint64(MASK)
    return x ^ (x >> np.uint64(31))


def uniform(stream, n):
    """n values in [-1, 1), exact in f32: 24 bits of splitmix(stream << 32 | i)."""
    i = np.arange(n, dtype=np.uint64) | (np.uint64(stream) << np.uint64(32))
    bits = splitmix(i) >> np.uint64(40)
    return bits.astype(np.float64) / float(1 << 23) - 1.0
