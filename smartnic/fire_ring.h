/* smartnic/fire_ring.h: the poller's fires handed to the PUT path through a ring, no interpreter between.
 *
 * Included by smartnic/_poller.c. One producer (the poller's own native thread: it polls, checks each
 * fired block's descriptor and pushes the record) and one consumer (the PUT path's thread, which takes
 * records without the GIL and issues their PUTs). Single-producer single-consumer: `head` is written by
 * the producer only, `tail` by the consumer only, each published with release and read with acquire.
 * A consumer with nothing to take spins for take_spin_ns, then raises `consumer_sleeping`, looks once
 * more and sleeps on `signal` (a private futex word, read before that last look, that every wake-up
 * bumps: a push or an interrupt between the look and the sleep ends the sleep at once); the producer
 * wakes it only when that flag is up (no system call while the consumer spins or is busy). A full ring makes the producer wait (in slices of FULL_WAIT_NS) for the
 * consumer: nothing is dropped, and the triggers it has not polled yet simply wait in the region.
 */
#ifndef KVTB_FIRE_RING_H
#define KVTB_FIRE_RING_H

#include <linux/futex.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define RING_MAX_CAPACITY (1u << 20)
#define FULL_WAIT_NS 1000000LL

typedef struct {
    uint32_t block;
    uint64_t generation;
    int64_t seen_ns;
    int verdict;               /* checking: the descriptor's (V_*) */
    int64_t checked_ns;        /* checking: when its check ended */
} Fired;

typedef struct {
    Fired *slots;              /* [capacity], a power of two */
    uint32_t mask;
    uint32_t head;             /* the next slot the producer writes */
    uint32_t tail;             /* the next slot the consumer reads */
    uint32_t signal;           /* futex word: bumped by each wake-up of a sleeping consumer */
    uint32_t consumer_sleeping;
    uint32_t stop;             /* the producer is asked to end */
    uint32_t take_interrupted;
    unsigned long long pushed, taken, full_waits, wakes;
} FireRing;

static void ring_futex_wait(uint32_t *word, uint32_t expected, int64_t timeout_ns)
{
    struct timespec ts = {timeout_ns / 1000000000, timeout_ns % 1000000000};
    syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, expected, &ts, NULL, 0);
}

static void ring_futex_wake(uint32_t *word)
{
    syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

static int64_t ring_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Producer: push one record, waiting while the ring is full; 0, or -1 when asked to stop first. */
static int ring_push(FireRing *r, const Fired *f)
{
    uint32_t head = r->head;  /* its own */
    while (head - __atomic_load_n(&r->tail, __ATOMIC_ACQUIRE) > r->mask) {
        if (__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE))
            return -1;
        r->full_waits++;
        struct timespec ts = {0, FULL_WAIT_NS};
        nanosleep(&ts, NULL);
    }
    r->slots[head & r->mask] = *f;
    __atomic_store_n(&r->head, head + 1, __ATOMIC_SEQ_CST);  /* publish, then look for a sleeper */
    r->pushed++;
    if (__atomic_exchange_n(&r->consumer_sleeping, 0, __ATOMIC_SEQ_CST)) {
        __atomic_add_fetch(&r->signal, 1, __ATOMIC_SEQ_CST);
        r->wakes++;
        ring_futex_wake(&r->signal);
    }
    return 0;
}

/* Consumer: copy up to max records into out, waiting up to timeout_ns for the first (spinning for spin_ns
 * of it); how many (0: the timeout, or take_interrupt()). */
static uint32_t ring_take(FireRing *r, Fired *out, uint32_t max, int64_t spin_ns, int64_t timeout_ns)
{
    int64_t start = ring_now_ns();
    uint32_t tail = r->tail, head;  /* tail: its own */
    for (;;) {
        head = __atomic_load_n(&r->head, __ATOMIC_ACQUIRE);
        if (head != tail)
            break;
        if (__atomic_exchange_n(&r->take_interrupted, 0, __ATOMIC_ACQ_REL))
            return 0;
        int64_t waited = ring_now_ns() - start;
        if (waited >= timeout_ns)
            return 0;
        if (waited < spin_ns) {
            CPU_RELAX();
            continue;
        }
        uint32_t signal = __atomic_load_n(&r->signal, __ATOMIC_SEQ_CST);
        __atomic_store_n(&r->consumer_sleeping, 1, __ATOMIC_SEQ_CST);  /* then look again: no lost wake */
        if (__atomic_load_n(&r->head, __ATOMIC_SEQ_CST) == tail &&
            !__atomic_load_n(&r->take_interrupted, __ATOMIC_SEQ_CST))
            ring_futex_wait(&r->signal, signal, timeout_ns - waited);
        __atomic_store_n(&r->consumer_sleeping, 0, __ATOMIC_SEQ_CST);
    }
    uint32_t n = head - tail < max ? head - tail : max;
    for (uint32_t i = 0; i < n; i++)
        out[i] = r->slots[(tail + i) & r->mask];
    __atomic_store_n(&r->tail, tail + n, __ATOMIC_RELEASE);
    r->taken += n;
    return n;
}

/* Any thread: end a take() now. */
static void ring_interrupt_take(FireRing *r)
{
    __atomic_store_n(&r->take_interrupted, 1, __ATOMIC_SEQ_CST);
    __atomic_add_fetch(&r->signal, 1, __ATOMIC_SEQ_CST);
    ring_futex_wake(&r->signal);
}

#endif
