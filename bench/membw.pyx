# cython: language_level=3
"""Memory read bandwidth probe (the bound for memory-bound decode) and a core-to-core
round-trip probe (where the host put the cores), for bench/speed.py.

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


cdef extern from *:
    """
    #if defined(__linux__)
    #ifndef _GNU_SOURCE
    #define _GNU_SOURCE
    #endif
    #include <pthread.h>
    #include <sched.h>
    #include <time.h>
    #endif
    #include <stdint.h>
    #if defined(__x86_64__) || defined(__i386__)
    #define MEMBW_PAUSE() __builtin_ia32_pause()
    #else
    #define MEMBW_PAUSE() ((void)0)
    #endif
    /* a line of its own, written in turn by the two threads */
    static int64_t membw_pp_flag[16] __attribute__((aligned(64)));
    typedef struct { int cpu; int64_t n; } membw_pp_arg;
    #if defined(__linux__)
    static int membw_pin(int cpu) {
        cpu_set_t s;
        CPU_ZERO(&s);
        CPU_SET(cpu, &s);
        return pthread_setaffinity_np(pthread_self(), sizeof s, &s);
    }
    static void *membw_pong(void *p) {
        const membw_pp_arg *a = (const membw_pp_arg *)p;
        membw_pin(a->cpu);
        for (int64_t i = 0; i < a->n; i++) {
            int64_t v;
            while ((v = __atomic_load_n(&membw_pp_flag[0], __ATOMIC_ACQUIRE)) != 2 * i + 1) {
                if (v < 0) return NULL;  /* the other side stopped early */
                MEMBW_PAUSE();
            }
            __atomic_store_n(&membw_pp_flag[0], 2 * i + 2, __ATOMIC_RELEASE);
        }
        return NULL;
    }
    static double membw_secs(const struct timespec *a, const struct timespec *b) {
        return (double)(b->tv_sec - a->tv_sec) + 1e-9 * (double)(b->tv_nsec - a->tv_nsec);
    }
    #endif
    /* seconds a round trip of the line between a thread on cpu0 and one on cpu1, over n of
     * them or as many as fit in budget seconds (a CPU another process holds hands the line
     * over once a scheduler slice), or -1 */
    static double membw_round_trip(int cpu0, int cpu1, int64_t n, double budget) {
    #if defined(__linux__)
        pthread_t t;
        membw_pp_arg a = {cpu1, n};
        cpu_set_t old;
        if (pthread_getaffinity_np(pthread_self(), sizeof old, &old) != 0) return -1.0;
        __atomic_store_n(&membw_pp_flag[0], 0, __ATOMIC_RELEASE);
        if (membw_pin(cpu0) != 0) return -1.0;
        if (pthread_create(&t, NULL, membw_pong, &a) != 0) {
            pthread_setaffinity_np(pthread_self(), sizeof old, &old);
            return -1.0;
        }
        struct timespec t0, t1;
        int64_t done = 0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (int64_t i = 0; i < n; i++) {
            __atomic_store_n(&membw_pp_flag[0], 2 * i + 1, __ATOMIC_RELEASE);
            while (__atomic_load_n(&membw_pp_flag[0], __ATOMIC_ACQUIRE) != 2 * i + 2) MEMBW_PAUSE();
            done = i + 1;
            if ((i & 63) == 63) {
                clock_gettime(CLOCK_MONOTONIC, &t1);
                if (membw_secs(&t0, &t1) > budget) break;
            }
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        __atomic_store_n(&membw_pp_flag[0], -1, __ATOMIC_RELEASE);  /* the other side may stop */
        pthread_join(t, NULL);
        pthread_setaffinity_np(pthread_self(), sizeof old, &old);
        return membw_secs(&t0, &t1) / (double)done;
    #else
        (void)cpu0; (void)cpu1; (void)n; (void)budget;
        return -1.0;
    #endif
    }
    """
    double membw_round_trip(int cpu0, int cpu1, long n, double budget) nogil


def core_round_trip_ns(long n=20000, double budget_s=0.1):
    """Nanoseconds for a cache line to go from one core to another and back: a thread on
    each of the first two CPUs this process may use hands a counter to the other n times
    (fewer if that takes over budget_s). -1.0 with fewer than two CPUs, or off Linux.

    A shared host places the two vCPUs of a 2-core VM near each other (~100-200 ns) or far
    apart (~400 ns, while the memory probe reads more): batched decode steps then take longer
    and one stream's does not (bench/RESULTS.md, session 33)."""
    import os

    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:
        return -1.0
    if len(cpus) < 2:
        return -1.0
    cdef int c0 = cpus[0], c1 = cpus[1]
    cdef double dt
    with nogil:
        dt = membw_round_trip(c0, c1, n, budget_s)
    return dt * 1e9 if dt > 0 else -1.0
