/* A team of threads inside one OpenMP parallel region, working through phases.
 *
 * A decode step (pyx/step.pyx) runs every layer of a model inside one parallel region, as
 * a sequence of phases (a matmul, the attention, a norm, ...), a few hundred per step. A
 * phase is a set of work items that any thread of the team may take (team_phase_take),
 * each done by exactly one thread; a thread moves on to the next phase once every item of
 * this one is done, whoever did them (team_phase_wait). Unlike a barrier this never waits
 * for a thread that has nothing left to do: a thread another process has descheduled
 * finds, when it runs again, the phases it missed done and skips them, so a step is never
 * slower on two threads than the one thread that runs.
 *
 * Shares (team_share_take): a phase whose items belong to tokens can give each thread a
 * share of them to do first, taking the others' only when its own are done, so a thread
 * mostly reads what it wrote (a decode step's rows and matmul outputs stay in one core's
 * cache) and a descheduled thread's share is still done by the others.
 *
 * Waiting: OpenMP's own waits follow the process's wait policy, and llmcore makes waiters
 * sleep at once (OMP_WAIT_POLICY=PASSIVE, the cores are shared); a futex round trip per
 * phase would cost more than most phases. Here a waiter spins for at most `spin_ns`
 * (phases are microseconds long on an idle core), then sleeps on a futex; the thread that
 * finishes a phase wakes sleepers only when there are any.
 *
 * Memory order: finishing items is a sequentially consistent read-modify-write, so
 * everything a thread wrote for its items is visible to every thread that sees the phase
 * done.
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
    long spin_ns;        /* how long a waiter spins before it sleeps */
} team_t;

/* Shares (team_share_take): at most this many */
#define TEAM_MAX_SHARES 4

/* A phase: its counters on a cache line of their own. */
typedef struct {
    int64_t next;        /* next item to take */
    int64_t done;        /* items done */
    int state;           /* futex word: 1 once done == total */
    int sleepers;
    int64_t taken[TEAM_MAX_SHARES];  /* items taken of each share (team_share_take) */
    char _pad[64 - (2 + TEAM_MAX_SHARES) * sizeof(int64_t) - 2 * sizeof(int)];
} team_phase_t;

static inline void team_init(team_t *t, long spin_ns) { t->spin_ns = spin_ns; }

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

/* The next `chunk` items of p: returns the first, >= the phase's total when none are left. */
static inline int64_t team_phase_take(team_phase_t *p, int64_t chunk) {
    return __atomic_fetch_add(&p->next, chunk, __ATOMIC_RELAXED);
}

/* Shares: a phase's items [lo[0], lo[n]) split into n contiguous shares, share s = [lo[s],
 * lo[s + 1]), share s first of all for thread s. A thread takes from its own share (guided:
 * half of what is left of it at a time, so the end comes in small pieces; else one item),
 * then from the others' one item at a time. Thread s then mostly reads what it wrote itself
 * in the phases before (a token's rows, quantized by the thread that owns the token, read by
 * that thread's matmul items): a line written by the other core costs a transfer between the
 * cores' caches, which made the matmuls of a 32-token step ~25% slower per thread at two
 * threads than at one.
 * What a descheduled thread leaves is still done by the others (no thread waits for one that
 * is not running). Returns 0 once every share is taken, else 1 with [*i0, *i1) to do. */
static inline int team_share_take(team_phase_t *p, const int64_t *lo, int n, int me, int guided, int64_t *i0,
                                  int64_t *i1) {
    for (int k = 0; k < n; k++) {
        const int s = (me + k) % n;
        const int64_t size = lo[s + 1] - lo[s];
        int64_t c = 1;
        if (k == 0 && guided) {
            c = (size - __atomic_load_n(&p->taken[s], __ATOMIC_RELAXED)) / 2;
            if (c < 1) c = 1;
        } else if (k > 0 && __atomic_load_n(&p->taken[s], __ATOMIC_RELAXED) >= size) {
            continue;
        }
        const int64_t a = __atomic_fetch_add(&p->taken[s], c, __ATOMIC_RELAXED);
        if (a >= size) continue;
        *i0 = lo[s] + a;
        *i1 = lo[s] + (a + c < size ? a + c : size);
        return 1;
    }
    return 0;
}

/* n_done items of p (of `total`) are done: everything this thread wrote for them is
 * visible to whoever sees the phase complete. */
static inline void team_phase_finish(team_phase_t *p, int64_t n_done, int64_t total) {
    if (__atomic_add_fetch(&p->done, n_done, __ATOMIC_SEQ_CST) == total) {
        __atomic_store_n(&p->state, 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&p->sleepers, __ATOMIC_SEQ_CST) > 0) team_futex_wake_all(&p->state);
    }
}

/* A thread found no more items of p to take: the *mine items it did count as done (one
 * atomic a thread and phase, not one an item: the counters' cache line moves between the
 * cores at each); *mine is reset. */
static inline void team_phase_done(team_phase_t *p, int64_t *mine, int64_t total) {
    if (*mine > 0) team_phase_finish(p, *mine, total);
    *mine = 0;
}

/* Wait until all `total` items of p are done (spin up to t->spin_ns, then sleep). The
 * sleeper registers before its last look at the state, so the finisher (which stores the
 * state, then reads the sleepers) cannot miss it; the futex compares the state atomically. */
static inline void team_phase_wait(const team_t *t, team_phase_t *p, int64_t total) {
    if (total <= 0 || __atomic_load_n(&p->done, __ATOMIC_ACQUIRE) == total) return;
    long deadline = 0;
    for (int i = 0;; i++) {  /* spin: the count often, the clock every 64 pauses */
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

/* A flag any thread may raise (a scratch allocation failed). */
static inline void team_flag_set(int *flag) { __atomic_store_n(flag, 1, __ATOMIC_RELAXED); }

#endif /* LLMCORE_TEAM_H */
