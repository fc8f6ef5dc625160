# cython: language_level=3
"""Memory read bandwidth probe (the bound for memory-bound decode), for bench/speed.py.

Built on first use by pyximport (settings in membw.pyxbld); not part of the package.
"""
from cython.parallel cimport prange
from libc.stdint cimport uint64_t
cimport cython


@cython.boundscheck(False)
@cython.wraparound(False)
def read_xor(const uint64_t[::1] buf, int n_threads=1):
    """XOR of all words of `buf` (n,), read with `n_threads` OpenMP threads.

    Integer XOR is associative, so the compiler vectorises the loop and the probe is
    limited by memory, not by a floating-point dependency chain; the result keeps the
    reads from being elided.
    """
    cdef Py_ssize_t n = buf.shape[0], chunk = 1 << 15, nchunks, c, i, lo, hi
    cdef uint64_t total = 0, acc
    nchunks = (n + chunk - 1) // chunk
    for c in prange(nchunks, nogil=True, num_threads=n_threads, schedule="static"):
        lo = c * chunk
        hi = lo + chunk
        if hi > n:
            hi = n
        acc = 0
        for i in range(lo, hi):
            acc = acc ^ buf[i]
        total ^= acc
    return total
