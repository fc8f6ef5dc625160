/* A team of threads inside one OpenMP parallel region: a barrier that spins briefly and
 * then sleeps, and a shared work counter.
 *
 * A decode step (pyx/step.pyx) runs every layer of a model inside one parallel region and
 * separates its phases (a matmul, the attention, ...) with this barrier, a few hundred
 * times per step. OpenMP's own barrier follows the process's wait policy: llmcore makes
 * waiters sleep at once (OMP_WAIT_POLICY=PASSIVE, the cores are shared), and a futex
 * round trip per phase would cost more than most phases. Here a waiter spins for at most
 * `spin_ns` (phases are microseconds long on an idle core), then sleeps on a futex; the
 * last thread to arrive wakes sleepers only when there are any. A thread descheduled by
 * another process therefore costs its partner at most the spin, never a busy time slice.
 *
 * Memory order: every arrival is a sequentially consistent read-modify-write and the
 * release of a generation a sequentially consistent store, so everything a thread wrote
 * before the barrier is visible to every thread after it.
 */
#ifndef LLMCORE_TEAM_H
#define LLMCORE_TEAM_H

#include <stdint.h>
#include <time.h>
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TEAM_PAUSE() _mm_pause()
#else
#define TEAM_PAUSE() ((void)0)
#endif

typedef struct {
    /* each on its own cache line: arrivals, the generation waiters watch, the sleepers */
    int n;
    long spin_ns;
    char _pad0[64 - sizeof(int) - sizeof(long)];
    int count;
    char _pad1[64 - sizeof(int)];
    int gen;
    char _pad2[64 - sizeof(int)];
    int sleepers;
    char _pad3[64 - sizeof(int)];
    int64_t work;        /* next work item of the current phase (team_next) */
    char _pad4[64 - sizeof(int64_t)];
} team_t;

static inline void team_init(team_t *t, int n, long spin_ns) {
    t->n = n;
    t->spin_ns = spin_ns;
    t->count = 0;
    t->gen = 0;
    t->sleepers = 0;
    t->work = 0;
}

/* Threads of the enclosing parallel region and this one's number (1 and 0 outside one or
 * in a build without OpenMP). */
static inline int team_region_size(void) {
#ifdef _OPENMP
    return omp_get_num_threads();
#else
    return 1;
#endif
}

static inline int team_thread(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* Join the team: every thread of the region calls this first (all store the same size). */
static inline void team_join(team_t *t) {
    __atomic_store_n(&t->n, team_region_size(), __ATOMIC_RELAXED);
}

static inline long team_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long)ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static inline void team_futex_wait(int *addr, int val) {
#if defined(__linux__)
    syscall(SYS_futex, addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
#else
    (void)addr; (void)val;
#endif
}

static inline void team_futex_wake_all(int *addr) {
#if defined(__linux__)
    syscall(SYS_futex, addr, FUTEX_WAKE_PRIVATE, 0x7fffffff, NULL, NULL, 0);
#else
    (void)addr;
#endif
}

/* Wait until all t->n threads have arrived. The last one also resets the work counter
 * for the next phase (nobody reads it until they have all left this barrier). */
static inline void team_barrier(team_t *t) {
    if (t->n <= 1) {
        t->work = 0;
        return;
    }
    const int gen = __atomic_load_n(&t->gen, __ATOMIC_SEQ_CST);
    if (__atomic_add_fetch(&t->count, 1, __ATOMIC_SEQ_CST) == t->n) {
        __atomic_store_n(&t->count, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&t->work, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&t->gen, gen + 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&t->sleepers, __ATOMIC_SEQ_CST) > 0) team_futex_wake_all(&t->gen);
        return;
    }
    /* spin: check the generation often, the clock every 64 pauses */
    long deadline = 0;
    for (int i = 0;; i++) {
        if (__atomic_load_n(&t->gen, __ATOMIC_ACQUIRE) != gen) return;
        TEAM_PAUSE();
        if ((i & 63) == 63) {
            const long now = team_now_ns();
            if (deadline == 0) deadline = now + t->spin_ns;
            else if (now >= deadline) break;
        }
    }
    /* sleep: registered as a sleeper before the last look, so the releaser cannot miss us
     * (it stores the generation, then reads sleepers; we add ourselves, then the futex
     * compares the generation atomically) */
    __atomic_add_fetch(&t->sleepers, 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&t->gen, __ATOMIC_SEQ_CST) == gen) team_futex_wait(&t->gen, gen);
    __atomic_sub_fetch(&t->sleepers, 1, __ATOMIC_SEQ_CST);
}

/* The next `chunk` work items of the current phase: returns the first, >= n when none are
 * left. All threads of the phase call it until it runs out; team_barrier resets it. */
static inline int64_t team_next(team_t *t, int64_t chunk) {
    return __atomic_fetch_add(&t->work, chunk, __ATOMIC_RELAXED);
}

/* A phase of work items that any thread of the team may take (team_phase_take), each
 * item done by exactly one thread. A thread that finishes the last item releases the
 * phase; team_phase_wait returns once every item is done, whoever did them. Unlike a
 * barrier this never waits for a thread that has nothing left to do: a thread another
 * process has descheduled finds, when it runs again, the phases it missed done and skips
 * them, so a step is never slower on two threads than the one thread that runs. */
typedef struct {
    int64_t next;        /* next item to take */
    int64_t done;        /* items done */
    int state;           /* futex word: 1 once done == total */
    int sleepers;
    char _pad[64 - 2 * sizeof(int64_t) - 2 * sizeof(int)];
} team_phase_t;

static inline int64_t team_phase_take(team_phase_t *p, int64_t chunk) {
    return __atomic_fetch_add(&p->next, chunk, __ATOMIC_RELAXED);
}

/* n_done items of p (of `total`) are done: everything this thread wrote for them is
 * visible to whoever sees the phase complete. */
static inline void team_phase_finish(team_phase_t *p, int64_t n_done, int64_t total) {
    if (__atomic_add_fetch(&p->done, n_done, __ATOMIC_SEQ_CST) == total) {
        __atomic_store_n(&p->state, 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&p->sleepers, __ATOMIC_SEQ_CST) > 0) team_futex_wake_all(&p->state);
    }
}

/* Wait until all `total` items of p are done (spin up to t->spin_ns, then sleep). */
static inline void team_phase_wait(const team_t *t, team_phase_t *p, int64_t total) {
    if (total <= 0 || __atomic_load_n(&p->done, __ATOMIC_ACQUIRE) == total) return;
    long deadline = 0;
    for (int i = 0;; i++) {
        if (__atomic_load_n(&p->done, __ATOMIC_ACQUIRE) == total) return;
        TEAM_PAUSE();
        if ((i & 63) == 63) {
            const long now = team_now_ns();
            if (deadline == 0) deadline = now + t->spin_ns;
            else if (now >= deadline) break;
        }
    }
    __atomic_add_fetch(&p->sleepers, 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&p->state, __ATOMIC_SEQ_CST) == 0) team_futex_wait(&p->state, 0);
    __atomic_sub_fetch(&p->sleepers, 1, __ATOMIC_SEQ_CST);
}

/* A flag any thread may raise before a barrier and every thread reads after it. */
static inline void team_flag_set(int *flag) { __atomic_store_n(flag, 1, __ATOMIC_RELAXED); }
static inline int team_flag_get(const int *flag) { return __atomic_load_n(flag, __ATOMIC_RELAXED); }

#endif /* LLMCORE_TEAM_H */
