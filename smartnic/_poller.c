/* smartnic._poller: a pool's standing PUT triggers, polled and waited on outside the interpreter.
 *
 * The NIC's deferred work queue watches its counters in hardware. Here the agent's watcher thread
 * does, and on this kind of machine its cost is the wake-up, not the poll: on a virtual machine a
 * timer wake-up costs far more CPU than a poll, so polling every 30 µs takes a large share of a core
 * (from Python or from C alike) that the compute node's forward needs (`kvtb bench smartnic` puts
 * the Python poll's CPU beside this poller's). So the watcher polls only while
 * stores are arriving (back to back, for `spin_ns` after a fire: the blocks of one engine step
 * are stored microseconds apart), and between bursts it sleeps on a doorbell in the region (a
 * futex word, io_uring's SQPOLL "need wakeup" flag): it sets the word to SLEEPING, polls once more,
 * and waits; the compute node, after a counter store, finds SLEEPING and wakes it (one system call
 * per burst, none while the watcher is polling). A wake that is lost (a store racing the flag)
 * costs at most the wait's timeout: the watcher polls again then. All of it with the GIL released.
 * Where the watcher has a CPU the compute node does not use (placement `nic`), it can nap instead
 * (`nap_ns`): for `warm_ns` after a fire it sleeps nap_ns at a time and polls, the doorbell left
 * AWAKE, so the compute node's stores make no system call at all while a decode runs (on a virtual
 * machine a wake from another CPU cost its thread 25-200 µs: an interprocessor interrupt); the naps
 * cost the NIC's CPU instead (a 1 ms nap, about 3% of it here), as a NIC's polling costs its own
 * engine, not the GPU.
 *
 *   Poller(counters, first, stride, count, bell=-1, armed=None)
 *       counters: a writable buffer holding the trigger counters (the region's counter array); block
 *       b's trigger is the u64 at byte first + b * stride; bell: the byte offset of the doorbell's
 *       u32 in the same buffer (-1: none, wait() sleeps its timeout). The entries are armed at
 *       `armed` (a buffer of count u64) or at the counters' values now (what was stored before is
 *       not due), and re-arm themselves at each fire: a block fires when its trigger holds a
 *       generation past the one it last fired at.
 *   poll() -> [(block, generation, seen_ns)]          one poll, with the GIL held (about 1 µs)
 *   wait(spin_ns, timeout_ns, nap_ns=0, warm_ns=0) -> [(block, generation, seen_ns)]
 *       without the GIL: poll back to back for spin_ns, then (nap_ns > 0, less than warm_ns since
 *       the last fire) nap and poll, then sleep on the doorbell (or the timeout) and poll again;
 *       returns as soon as something fired, or empty after the timeout or interrupt()
 *   interrupt()   end a wait() now, from any thread (the watcher has other work: a registration...)
 *   start_ring(capacity, spin_ns, timeout_ns, busy=False)   from now on a native thread of the Poller's
 *       own polls as wait() does and pushes each fire (with its verdict, when checking) into a ring
 *       (smartnic/fire_ring.h); take(max, timeout_ns, spin_ns) hands them to the PUT path's thread
 *       without the GIL, interrupt_take() ends a take, stop_ring() ends the thread (close() does too);
 *       ring_pushed, ring_taken, ring_full_waits, ring_wakes: counts. While it runs, poll(), wait()
 *       and check_descriptors() are refused (the thread alone reads the triggers).
 *   polls, fires, sleeps, rings, naps: counts (rings: waits the compute node ended)
 * seen_ns: CLOCK_MONOTONIC (time.monotonic_ns), read right after the poll found the store.
 *
 * The standing PUT's descriptor check, made right where a poll finds a fired block (no GIL):
 *   check_descriptors(region, descriptor_first, descriptor_stride, ids_first, ids_stride, block_tokens)
 *       region: a buffer of the whole region (the same mapping as counters); block b's descriptor is
 *       the DESCRIPTOR_BYTES at descriptor_first + b * descriptor_stride, its token ids (u32 LE) the
 *       block_tokens * 4 bytes at ids_first + b * ids_stride; ValueError when any of them passes the
 *       buffer. From then on poll() and wait() return (block, generation, seen_ns, verdict, checked_ns):
 *       verdict 0 (ACCEPTED) or the code of the first reason to refuse it (VERDICTS[code] says which,
 *       in the order Python's checks find them), checked_ns CLOCK_MONOTONIC when the check ended.
 *       check_descriptors(None): back to 3-tuples. `checking` says which.
 *   check_descriptor(region, descriptor_offset, ids_offset, block_tokens, generation) -> verdict
 *       the same check of one block (module function), for a trigger holding `generation`
 *   crc32c(data, crc=0, software=False), blake2b(data, digest_size=16): the check's own routines
 * Linux only (futex); elsewhere the build fails and smartnic.standing polls from Python.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#if !defined(__linux__)
#error "smartnic._poller needs Linux (futex); smartnic.standing polls from Python elsewhere"
#endif

#include <errno.h>
#include <string.h>
#include <linux/futex.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#define CPU_RELAX() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ __volatile__("yield")
#else
#define CPU_RELAX() ((void)0)
#endif

#define AWAKE 0u
#define SLEEPING 1u

#include <pthread.h>
#include "fire_ring.h"  /* Fired, and the ring that hands fires to the PUT path */

#define TAKE_MAX 256

/* ---- the standing PUT's descriptor check (hostmem/descriptor.py `decode` and Agent.block_put's checks) ----
 *
 * What Python accepts, refused for the same first reason, in the same order: the record's fields
 * (magic and version, lengths, crc32c of magic..context, token count, chunk index, generation 0,
 * parent), its ids as strict utf-8 (each id on its own, as Python decodes them), the trigger's
 * generation, a shared block full, and its name: blake2b-128 of (len(parent) u32 LE, len(salt) u32 LE,
 * parent, salt, token ids) with salt_for's salt (hostmem/block_hash.py). The record is copied first, so
 * what is checked is one snapshot (a store racing the check cannot move a length under it); the token
 * ids are hashed in place, never past the block's block_tokens ids.
 */
#define DESCRIPTOR_BYTES 512
#define D_HEAD_BYTES 58           /* "<4sHHQIIH16s16s" */
#define D_OWNER_AT D_HEAD_BYTES   /* "<HHH": tenant_len, user_len, context_len */
#define D_IDS_AT (D_HEAD_BYTES + 6)
#define D_STAMP_AT (DESCRIPTOR_BYTES - 12)
#define D_CRC_AT (DESCRIPTOR_BYTES - 4)
#define D_VERSION 2u
#define D_SHARED 1u
#define D_MAX_TENANT 64u
#define D_MAX_USER 128u
#define D_MAX_CONTEXT 240u
#define D_MAX_TOKEN_END 0xFFFFFFFFull
#define D_MAX_BLOCK_TOKENS 0x7FFFFFFFL  /* chunk index (u32) * block_tokens stays within a u64 */
#define TOKEN_ID_BYTES 4

enum {
    V_ACCEPTED = 0,
    V_MAGIC,            /* not a descriptor: magic or version */
    V_LENGTHS,          /* tenant, user or context length, or parent length, out of range */
    V_CRC,              /* crc32c mismatch: torn or not written */
    V_TOKEN_COUNT,      /* token count outside (0, block_tokens] */
    V_CHUNK_INDEX,      /* the chunk's tokens pass u32 */
    V_GENERATION_ZERO,  /* generation 0 is never stored */
    V_PARENT,           /* only block 0 has no parent */
    V_UTF8,             /* an id is not utf-8 */
    V_STALE,            /* the descriptor's generation is not the trigger's */
    V_SHARED_PARTIAL,   /* only a full block can be shared */
    V_HASH,             /* the name is not the block's tokens under its owner */
    V_COUNT
};

static const char *const verdict_messages[V_COUNT] = {
    "accepted",
    "not a descriptor (magic or version)",
    "descriptor field lengths out of range",
    "descriptor crc32c mismatch (torn or not written)",
    "token count outside (0, block_tokens]",
    "chunk index out of range (its tokens pass 2**32 - 1)",
    "generation 0 is never stored",
    "only block 0 has no parent",
    "descriptor ids are not utf-8",
    "descriptor generation is not the trigger's",
    "only a full block can be shared",
    "the descriptor's name is not the block's tokens under its owner",
};

static const char *const verdict_names[V_COUNT] = {
    "ACCEPTED", "BAD_MAGIC", "BAD_LENGTHS", "BAD_CRC", "BAD_TOKEN_COUNT", "BAD_CHUNK_INDEX",
    "GENERATION_ZERO", "BAD_PARENT", "BAD_UTF8", "STALE_GENERATION", "SHARED_PARTIAL", "BAD_HASH",
};

static inline uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t le64(const uint8_t *p) { return (uint64_t)le32(p) | ((uint64_t)le32(p + 4) << 32); }
static inline void put_le32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)(v >> 16), p[3] = (uint8_t)(v >> 24);
}

/* -- CRC32C: kvtb/crc32c.h (the one C copy, shared with hostmem/_dma.c) */
#include "bounds.h"
#include "crc32c.h"

/* -- BLAKE2b, unkeyed (RFC 7693's reference implementation, with a block-wise update) */
typedef struct {
    uint8_t b[128];
    uint64_t h[8];
    uint64_t t[2];
    size_t c;       /* bytes in b */
    size_t outlen;
} Blake2b;

static const uint64_t blake2b_iv[8] = {
    0x6A09E667F3BCC908ull, 0xBB67AE8584CAA73Bull, 0x3C6EF372FE94F82Bull, 0xA54FF53A5F1D36F1ull,
    0x510E527FADE682D1ull, 0x9B05688C2B3E6C1Full, 0x1F83D9ABFB41BD6Bull, 0x5BE0CD19137E2179ull,
};

static const uint8_t blake2b_sigma[12][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4}, {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13}, {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11}, {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5}, {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
};

#define ROTR64(x, y) (((x) >> (y)) ^ ((x) << (64 - (y))))
#define B2B_G(a, b, c, d, x, y)                \
    do {                                       \
        v[a] = v[a] + v[b] + (x);              \
        v[d] = ROTR64(v[d] ^ v[a], 32);        \
        v[c] = v[c] + v[d];                    \
        v[b] = ROTR64(v[b] ^ v[c], 24);        \
        v[a] = v[a] + v[b] + (y);              \
        v[d] = ROTR64(v[d] ^ v[a], 16);        \
        v[c] = v[c] + v[d];                    \
        v[b] = ROTR64(v[b] ^ v[c], 63);        \
    } while (0)

static void blake2b_compress(Blake2b *ctx, int last)
{
    uint64_t v[16], m[16];
    for (int i = 0; i < 8; i++) {
        v[i] = ctx->h[i];
        v[i + 8] = blake2b_iv[i];
    }
    v[12] ^= ctx->t[0];
    v[13] ^= ctx->t[1];
    if (last)
        v[14] = ~v[14];
    for (int i = 0; i < 16; i++)
        m[i] = le64(&ctx->b[8 * i]);
    for (int i = 0; i < 12; i++) {
        const uint8_t *s = blake2b_sigma[i];
        B2B_G(0, 4, 8, 12, m[s[0]], m[s[1]]);
        B2B_G(1, 5, 9, 13, m[s[2]], m[s[3]]);
        B2B_G(2, 6, 10, 14, m[s[4]], m[s[5]]);
        B2B_G(3, 7, 11, 15, m[s[6]], m[s[7]]);
        B2B_G(0, 5, 10, 15, m[s[8]], m[s[9]]);
        B2B_G(1, 6, 11, 12, m[s[10]], m[s[11]]);
        B2B_G(2, 7, 8, 13, m[s[12]], m[s[13]]);
        B2B_G(3, 4, 9, 14, m[s[14]], m[s[15]]);
    }
    for (int i = 0; i < 8; i++)
        ctx->h[i] ^= v[i] ^ v[i + 8];
}

static void blake2b_init(Blake2b *ctx, size_t outlen)  /* 1 <= outlen <= 64, no key */
{
    for (int i = 0; i < 8; i++)
        ctx->h[i] = blake2b_iv[i];
    ctx->h[0] ^= 0x01010000ull ^ (uint64_t)outlen;
    ctx->t[0] = ctx->t[1] = 0;
    ctx->c = 0;
    ctx->outlen = outlen;
}

static void blake2b_count(Blake2b *ctx, size_t n)
{
    ctx->t[0] += (uint64_t)n;
    if (ctx->t[0] < (uint64_t)n)
        ctx->t[1]++;
}

static void blake2b_update(Blake2b *ctx, const void *data, size_t n)
{
    const uint8_t *in = data;
    while (n) {
        if (ctx->c == 128) {  /* full, and more follows: not the last block */
            blake2b_count(ctx, 128);
            blake2b_compress(ctx, 0);
            ctx->c = 0;
        }
        size_t take = 128 - ctx->c < n ? 128 - ctx->c : n;
        memcpy(ctx->b + ctx->c, in, take);
        ctx->c += take;
        in += take;
        n -= take;
    }
}

static void blake2b_final(Blake2b *ctx, uint8_t *out)
{
    blake2b_count(ctx, ctx->c);
    memset(ctx->b + ctx->c, 0, 128 - ctx->c);
    blake2b_compress(ctx, 1);
    for (size_t i = 0; i < ctx->outlen; i++)
        out[i] = (uint8_t)(ctx->h[i >> 3] >> (8 * (i & 7)));
}

/* -- strict utf-8 (Python's decoder: no overlong forms, no surrogates, nothing past U+10FFFF) */
static int utf8_valid(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t need;
        uint8_t lo = 0x80, hi = 0xBF;  /* the second byte's range */
        if (c >= 0xC2 && c <= 0xDF)
            need = 1;
        else if (c >= 0xE0 && c <= 0xEF) {
            need = 2;
            if (c == 0xE0)
                lo = 0xA0;
            else if (c == 0xED)
                hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            need = 3;
            if (c == 0xF0)
                lo = 0x90;
            else if (c == 0xF4)
                hi = 0x8F;
        } else
            return 0;
        if (n - i - 1 < need || s[i + 1] < lo || s[i + 1] > hi)
            return 0;
        for (size_t k = 2; k <= need; k++)
            if ((s[i + k] & 0xC0) != 0x80)
                return 0;
        i += need + 1;
    }
    return 1;
}

/* The verdict on one block's descriptor (rec: DESCRIPTOR_BYTES; ids: the block's block_tokens ids),
 * for the generation its trigger holds. No Python call: runs without the GIL. */
static int check_record(const uint8_t *rec, const uint8_t *ids, uint32_t block_tokens, uint64_t trigger)
{
    uint8_t r[DESCRIPTOR_BYTES];
    memcpy(r, rec, DESCRIPTOR_BYTES);  /* one snapshot */
    if (memcmp(r, "KVBD", 4) != 0 || le16(r + 4) != D_VERSION)
        return V_MAGIC;
    uint16_t flags = le16(r + 6);
    uint64_t generation = le64(r + 8);
    uint32_t index = le32(r + 16), count = le32(r + 20);
    uint16_t parent_len = le16(r + 24);
    const uint8_t *hash = r + 26, *parent = r + 42;
    uint32_t tlen = le16(r + D_OWNER_AT), ulen = le16(r + D_OWNER_AT + 2), clen = le16(r + D_OWNER_AT + 4);
    if (tlen > D_MAX_TENANT || ulen > D_MAX_USER || clen > D_MAX_CONTEXT || (parent_len != 0 && parent_len != 16))
        return V_LENGTHS;
    const uint8_t *tenant = r + D_IDS_AT, *user = tenant + tlen, *context = user + ulen;
    size_t end = D_IDS_AT + tlen + ulen + clen;  /* <= D_STAMP_AT */
    if (crc32c_extend(0, r, end) != le32(r + D_CRC_AT))
        return V_CRC;
    if (count == 0 || count > block_tokens)
        return V_TOKEN_COUNT;
    if ((uint64_t)index * block_tokens + count > D_MAX_TOKEN_END)
        return V_CHUNK_INDEX;
    if (generation == 0)
        return V_GENERATION_ZERO;
    if ((parent_len == 0) != (index == 0))
        return V_PARENT;
    if (!utf8_valid(tenant, tlen) || !utf8_valid(user, ulen) || !utf8_valid(context, clen))
        return V_UTF8;
    if (generation != trigger)
        return V_STALE;
    int shared = (flags & D_SHARED) != 0;
    if (shared && count != block_tokens)
        return V_SHARED_PARTIAL;
    /* salt_for: b"tenant\0" + tenant (+ b"\0user\0" + user unless shared) */
    uint32_t salt_len = 7 + tlen + (shared ? 0 : 6 + ulen);
    uint8_t lengths[8], name[16];
    put_le32(lengths, parent_len);
    put_le32(lengths + 4, salt_len);
    Blake2b h;
    blake2b_init(&h, 16);
    blake2b_update(&h, lengths, 8);
    blake2b_update(&h, parent, parent_len);
    blake2b_update(&h, "tenant", 7);  /* with its NUL */
    blake2b_update(&h, tenant, tlen);
    if (!shared) {
        blake2b_update(&h, "\0user", 6);  /* with its NUL */
        blake2b_update(&h, user, ulen);
    }
    blake2b_update(&h, ids, (size_t)count * TOKEN_ID_BYTES);
    blake2b_final(&h, name);
    return memcmp(name, hash, 16) == 0 ? V_ACCEPTED : V_HASH;
}


typedef struct {
    PyObject_HEAD
    Py_buffer view;
    int has_view;
    const char *base;          /* the first trigger */
    Py_ssize_t stride, count;
    uint32_t *bell;            /* NULL: no doorbell */
    uint64_t *armed;           /* [count]: fire when the trigger passes this */
    Py_buffer region;          /* checking: the region's bytes (descriptors and token ids) */
    int checking;              /* check_descriptors() was called: a fire's descriptor is checked */
    const uint8_t *descriptors, *ids;  /* block 0's descriptor and token ids in region */
    Py_ssize_t descriptor_stride, ids_stride;
    uint32_t block_tokens;
    Fired *fired;              /* [count]: one poll's finds */
    int waiting;               /* a wait() or the ring's thread is running (one at a time) */
    int interrupted;           /* atomic */
    unsigned long long polls, fires, sleeps, rings, naps;
    int64_t last_fire_ns;      /* CLOCK_MONOTONIC of the last poll that found a fire (0: none yet) */
    FireRing ring;             /* start_ring(): fires pushed by a native thread, taken by take() */
    pthread_t ring_thread;
    int ring_running, taking, ring_busy;
    int64_t ring_spin_ns, ring_timeout_ns;
} Poller;

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* One poll: every trigger past its arming is re-armed there and recorded in p->fired; how many. */
static Py_ssize_t poll_once(Poller *p)
{
    Py_ssize_t n = 0;
    p->polls++;
    for (Py_ssize_t i = 0; i < p->count; i++) {
        uint64_t v = __atomic_load_n((const uint64_t *)(p->base + i * p->stride), __ATOMIC_ACQUIRE);
        if (v > p->armed[i]) {
            p->armed[i] = v;
            p->fired[n].block = (uint32_t)i;
            p->fired[n].generation = v;
            p->fired[n].seen_ns = now_ns();  /* after the load: never before this store */
            if (p->checking) {
                p->fired[n].verdict = check_record(p->descriptors + i * p->descriptor_stride,
                                                   p->ids + i * p->ids_stride, p->block_tokens, v);
                p->fired[n].checked_ns = now_ns();
            }
            n++;
        }
    }
    p->fires += (unsigned long long)n;
    if (n)
        p->last_fire_ns = p->fired[n - 1].seen_ns;
    return n;
}

static PyObject *fired_list(const Fired *fired, Py_ssize_t n, int checking)
{
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out && i < n; i++) {
        const Fired *f = &fired[i];
        PyObject *item = checking
            ? Py_BuildValue("(IKLiL)", f->block, (unsigned long long)f->generation, (long long)f->seen_ns,
                            f->verdict, (long long)f->checked_ns)
            : Py_BuildValue("(IKL)", f->block, (unsigned long long)f->generation, (long long)f->seen_ns);
        if (!item) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, item);
    }
    return out;
}

static PyObject *as_list(Poller *p, Py_ssize_t n)
{
    return fired_list(p->fired, n, p->checking);
}

static void futex_wait(uint32_t *word, uint32_t expected, int64_t timeout_ns)
{
    struct timespec ts = {timeout_ns / 1000000000, timeout_ns % 1000000000};
    syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, NULL, 0);  /* shared: the compute node wakes it */
}

static void sleep_ns(int64_t ns)
{
    struct timespec ts = {ns / 1000000000, ns % 1000000000};
    while (clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, &ts) == EINTR)
        ;
}

/* Without the GIL: spin, then nap while warm, then sleep on the bell (or the timeout), then poll;
 * how many fired. */
static Py_ssize_t wait_for_stores(Poller *p, int64_t spin_ns, int64_t timeout_ns, int64_t nap_ns, int64_t warm_ns)
{
    int64_t start = now_ns();
    Py_ssize_t n;
    do {
        if ((n = poll_once(p)) || __atomic_exchange_n(&p->interrupted, 0, __ATOMIC_ACQ_REL))
            return n;
        CPU_RELAX();
    } while (now_ns() - start < spin_ns);
    if (timeout_ns <= 0)
        return 0;
    if (nap_ns > 0 && p->last_fire_ns && now_ns() - p->last_fire_ns < warm_ns) {
        /* warm: the next store is likely soon; the doorbell stays AWAKE (no system call for the store).
         * Naps until something fires, interrupt(), the timeout (the caller has other work) or warm_ns */
        int64_t nap_start = now_ns();
        do {
            p->naps++;
            sleep_ns(nap_ns);
            if ((n = poll_once(p)) || __atomic_exchange_n(&p->interrupted, 0, __ATOMIC_ACQ_REL))
                return n;
        } while (now_ns() - nap_start < timeout_ns && now_ns() - p->last_fire_ns < warm_ns);
        return 0;
    }
    p->sleeps++;
    if (!p->bell) {
        sleep_ns(timeout_ns);
        return poll_once(p);
    }
    __atomic_store_n(p->bell, SLEEPING, __ATOMIC_SEQ_CST);  /* then poll: a store before it is seen now */
    if ((n = poll_once(p)) || __atomic_exchange_n(&p->interrupted, 0, __ATOMIC_ACQ_REL)) {
        __atomic_store_n(p->bell, AWAKE, __ATOMIC_SEQ_CST);
        return n;
    }
    futex_wait(p->bell, SLEEPING, timeout_ns);
    if (__atomic_exchange_n(p->bell, AWAKE, __ATOMIC_SEQ_CST) == AWAKE)
        p->rings++;  /* the compute node (or interrupt) set it back: it rang */
    __atomic_store_n(&p->interrupted, 0, __ATOMIC_RELEASE);
    return poll_once(p);
}

static void stop_checking(Poller *p)
{
    if (p->checking) {
        p->checking = 0;
        PyBuffer_Release(&p->region);
    }
}

static void release(Poller *p)
{
    stop_checking(p);
    if (p->has_view) {
        PyBuffer_Release(&p->view);
        p->has_view = 0;
    }
}

static int Poller_init(Poller *p, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"counters", "first", "stride", "count", "bell", "armed", NULL};
    PyObject *counters, *armed = Py_None;
    Py_ssize_t first, stride, count, bell = -1;
    if (p->has_view) {
        PyErr_SetString(PyExc_RuntimeError, "a Poller is initialised once");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "Onnn|nO", kwlist, &counters, &first, &stride, &count, &bell,
                                     &armed))
        return -1;
    if (first < 0 || stride <= 0 || count < 0 || first % 8 || stride % 8 || (bell >= 0 && bell % 4)) {
        PyErr_SetString(PyExc_ValueError, "first and stride: non-negative multiples of 8 (stride > 0); "
                                          "count >= 0; bell: -1 or a multiple of 4");
        return -1;
    }
    if (PyObject_GetBuffer(counters, &p->view, PyBUF_WRITABLE) < 0)
        return -1;
    p->has_view = 1;
    if (!fits(p->view.len, first, stride, count, 8) || (bell >= 0 && !fits(p->view.len, bell, 0, 1, 4))) {
        release(p);
        PyErr_Format(PyExc_ValueError, "%zd triggers from byte %zd every %zd bytes, or the bell at %zd, pass the "
                     "buffer's %zd bytes", count, first, stride, bell, p->view.len);
        return -1;
    }
    p->base = (const char *)p->view.buf + first;
    p->stride = stride;
    p->count = count;
    p->bell = bell >= 0 ? (uint32_t *)((char *)p->view.buf + bell) : NULL;
    p->armed = PyMem_RawMalloc((size_t)(count ? count : 1) * sizeof(uint64_t));
    p->fired = PyMem_RawMalloc((size_t)(count ? count : 1) * sizeof(Fired));
    if (!p->armed || !p->fired) {
        release(p);
        PyErr_NoMemory();
        return -1;
    }
    if (armed != Py_None) {  /* where the caller's entries were armed */
        Py_buffer given;
        if (PyObject_GetBuffer(armed, &given, PyBUF_SIMPLE) < 0) {
            release(p);
            return -1;
        }
        int fits = given.len == (Py_ssize_t)(count * sizeof(uint64_t));
        if (fits)
            memcpy(p->armed, given.buf, (size_t)given.len);
        PyBuffer_Release(&given);
        if (!fits) {
            release(p);
            PyErr_Format(PyExc_ValueError, "armed must hold %zd u64", count);
            return -1;
        }
    } else {
        for (Py_ssize_t i = 0; i < count; i++)  /* armed at the values stored before: not due */
            p->armed[i] = __atomic_load_n((const uint64_t *)(p->base + i * stride), __ATOMIC_ACQUIRE);
    }
    return 0;
}

static void stop_ring(Poller *p);

static void Poller_dealloc(Poller *p)
{
    stop_ring(p);
    release(p);
    PyMem_RawFree(p->ring.slots);
    PyMem_RawFree(p->armed);
    PyMem_RawFree(p->fired);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

static int ready(Poller *p)
{
    if (!p->has_view) {
        PyErr_SetString(PyExc_ValueError, "the Poller is closed");
        return 0;
    }
    if (p->waiting) {
        PyErr_SetString(PyExc_RuntimeError, "another thread is waiting on this Poller");
        return 0;
    }
    return 1;
}

static PyObject *Poller_poll(Poller *p, PyObject *Py_UNUSED(ignored))
{
    if (!ready(p))
        return NULL;
    return as_list(p, poll_once(p));
}

static PyObject *Poller_wait(Poller *p, PyObject *args)
{
    long long spin_ns, timeout_ns, nap_ns = 0, warm_ns = 0;
    if (!PyArg_ParseTuple(args, "LL|LL", &spin_ns, &timeout_ns, &nap_ns, &warm_ns) || !ready(p))
        return NULL;
    if (nap_ns < 0 || warm_ns < 0) {
        PyErr_SetString(PyExc_ValueError, "nap_ns and warm_ns must be >= 0");
        return NULL;
    }
    Py_ssize_t n;
    p->waiting = 1;  /* close() waits for it: the buffer stays while this thread reads it */
    Py_BEGIN_ALLOW_THREADS
    n = wait_for_stores(p, spin_ns, timeout_ns, nap_ns, warm_ns);
    Py_END_ALLOW_THREADS
    p->waiting = 0;
    return as_list(p, n);
}

static void interrupt_wait(Poller *p)
{
    __atomic_store_n(&p->interrupted, 1, __ATOMIC_RELEASE);
    if (p->bell && p->has_view && __atomic_exchange_n(p->bell, AWAKE, __ATOMIC_SEQ_CST) == SLEEPING)
        syscall(SYS_futex, p->bell, FUTEX_WAKE, 1, NULL, NULL, 0);
}

static PyObject *Poller_interrupt(Poller *p, PyObject *Py_UNUSED(ignored))
{
    interrupt_wait(p);
    Py_RETURN_NONE;
}

/* ---- the ring: a native thread polls (and checks) and pushes each fire; the PUT path take()s them ---- */

static void *ring_main(void *arg)
{
    Poller *p = arg;
    int64_t spin = 0;
    while (!__atomic_load_n(&p->ring.stop, __ATOMIC_ACQUIRE)) {
        Py_ssize_t n = wait_for_stores(p, spin, p->ring_timeout_ns, 0, 0);
        spin = n || p->ring_busy ? p->ring_spin_ns : 0;  /* spin right after a fire (its burst goes on), or always */
        for (Py_ssize_t i = 0; i < n; i++) {
            if (ring_push(&p->ring, &p->fired[i]) < 0) {
                /* stopped with the ring full: what was not pushed is due again for the next poll */
                for (Py_ssize_t j = i; j < n; j++)
                    p->armed[p->fired[j].block] = p->fired[j].generation - 1;
                break;
            }
        }
    }
    return NULL;
}

/* Stop the ring's thread and wait for it (without the GIL); what it pushed stays to be taken. */
static void stop_ring(Poller *p)
{
    if (!p->ring_running)
        return;
    __atomic_store_n(&p->ring.stop, 1, __ATOMIC_RELEASE);
    interrupt_wait(p);
    Py_BEGIN_ALLOW_THREADS
    pthread_join(p->ring_thread, NULL);
    Py_END_ALLOW_THREADS
    __atomic_store_n(&p->interrupted, 0, __ATOMIC_RELEASE);
    p->ring_running = 0;
    p->waiting = 0;
}

static PyObject *Poller_start_ring(Poller *p, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"capacity", "spin_ns", "timeout_ns", "busy", NULL};
    Py_ssize_t capacity;
    long long spin_ns, timeout_ns;
    int busy = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "nLL|p", kwlist, &capacity, &spin_ns, &timeout_ns, &busy) ||
        !ready(p))
        return NULL;
    if (capacity < 1 || capacity > RING_MAX_CAPACITY || spin_ns < 0 || timeout_ns <= 0) {
        PyErr_Format(PyExc_ValueError, "capacity in [1, %u], spin_ns >= 0, timeout_ns > 0", RING_MAX_CAPACITY);
        return NULL;
    }
    uint32_t size = 1;
    while (size < (uint32_t)capacity)
        size <<= 1;
    if (p->ring.slots == NULL || p->ring.mask + 1 != size) {
        if (p->ring.head != p->ring.tail) {
            PyErr_SetString(PyExc_RuntimeError, "the ring still holds fires: take them before resizing it");
            return NULL;
        }
        Fired *slots = PyMem_RawMalloc(sizeof(Fired) * size);
        if (slots == NULL)
            return PyErr_NoMemory();
        PyMem_RawFree(p->ring.slots);
        p->ring.slots = slots;
        p->ring.mask = size - 1;
    }
    p->ring.stop = 0;
    p->ring_spin_ns = spin_ns;
    p->ring_timeout_ns = timeout_ns;
    p->ring_busy = busy;
    p->waiting = 1;  /* poll(), wait() and close() see the thread */
    int rc = pthread_create(&p->ring_thread, NULL, ring_main, p);  /* it inherits this thread's CPUs and policy */
    if (rc != 0) {
        p->waiting = 0;
        errno = rc;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    p->ring_running = 1;
    Py_RETURN_NONE;
}

static PyObject *Poller_stop_ring(Poller *p, PyObject *Py_UNUSED(ignored))
{
    stop_ring(p);
    Py_RETURN_NONE;
}

static PyObject *Poller_take(Poller *p, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"max", "timeout_ns", "spin_ns", NULL};
    Py_ssize_t max = 64;
    long long timeout_ns = 0, spin_ns = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|nLL", kwlist, &max, &timeout_ns, &spin_ns))
        return NULL;
    if (!p->has_view || p->ring.slots == NULL) {
        PyErr_SetString(PyExc_ValueError, p->has_view ? "the ring was never started" : "the Poller is closed");
        return NULL;
    }
    if (max < 1 || max > TAKE_MAX || timeout_ns < 0 || spin_ns < 0) {
        PyErr_Format(PyExc_ValueError, "max in [1, %d], timeout_ns and spin_ns >= 0", TAKE_MAX);
        return NULL;
    }
    if (p->taking) {
        PyErr_SetString(PyExc_RuntimeError, "another thread is taking from this ring (it has one consumer)");
        return NULL;
    }
    Fired out[TAKE_MAX];
    uint32_t n;
    int checking = p->checking;  /* fixed while the ring runs: check_descriptors() is refused then */
    p->taking = 1;
    Py_BEGIN_ALLOW_THREADS
    n = ring_take(&p->ring, out, (uint32_t)max, spin_ns, timeout_ns);
    Py_END_ALLOW_THREADS
    p->taking = 0;
    return fired_list(out, n, checking);
}

static PyObject *Poller_interrupt_take(Poller *p, PyObject *Py_UNUSED(ignored))
{
    ring_interrupt_take(&p->ring);
    Py_RETURN_NONE;
}

static PyObject *Poller_close(Poller *p, PyObject *Py_UNUSED(ignored))
{
    if (p->taking) {
        ring_interrupt_take(&p->ring);
        PyErr_SetString(PyExc_RuntimeError, "a thread is taking from this Poller's ring: it was interrupted, "
                                            "close again once it returned");
        return NULL;
    }
    stop_ring(p);
    if (p->waiting) {
        PyErr_SetString(PyExc_RuntimeError, "a thread is waiting on this Poller: interrupt it first");
        return NULL;
    }
    release(p);
    Py_RETURN_NONE;
}

static PyObject *Poller_check_descriptors(Poller *p, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"region", "descriptor_first", "descriptor_stride", "ids_first", "ids_stride",
                             "block_tokens", NULL};
    PyObject *region;
    Py_ssize_t d_first = 0, d_stride = 0, i_first = 0, i_stride = 0, block_tokens = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|nnnnn", kwlist, &region, &d_first, &d_stride, &i_first,
                                     &i_stride, &block_tokens) || !ready(p))
        return NULL;
    if (region == Py_None) {  /* checking off: fires are (block, generation, seen_ns) again */
        stop_checking(p);
        Py_RETURN_NONE;
    }
    if (block_tokens <= 0 || block_tokens > D_MAX_BLOCK_TOKENS || d_stride <= 0 || i_stride <= 0 || d_first < 0 ||
        i_first < 0) {
        PyErr_Format(PyExc_ValueError, "block_tokens in [1, %ld], strides positive, offsets non-negative",
                     (long)D_MAX_BLOCK_TOKENS);
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(region, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (!fits(view.len, d_first, d_stride, p->count, DESCRIPTOR_BYTES) ||
        !fits(view.len, i_first, i_stride, p->count, block_tokens * TOKEN_ID_BYTES)) {
        PyErr_Format(PyExc_ValueError, "%zd descriptors from byte %zd every %zd bytes, or their %zd token ids "
                     "from byte %zd every %zd bytes, pass the region's %zd bytes", p->count, d_first, d_stride,
                     block_tokens, i_first, i_stride, view.len);
        PyBuffer_Release(&view);
        return NULL;
    }
    stop_checking(p);
    p->region = view;
    p->descriptors = (const uint8_t *)view.buf + d_first;
    p->ids = (const uint8_t *)view.buf + i_first;
    p->descriptor_stride = d_stride;
    p->ids_stride = i_stride;
    p->block_tokens = (uint32_t)block_tokens;
    p->checking = 1;
    Py_RETURN_NONE;
}

#define COUNT_GETTER(name)                                                          \
    static PyObject *Poller_##name(Poller *p, void *Py_UNUSED(closure))            \
    {                                                                               \
        return PyLong_FromUnsignedLongLong(p->name);                                \
    }
COUNT_GETTER(polls)
COUNT_GETTER(fires)
COUNT_GETTER(sleeps)
COUNT_GETTER(naps)
COUNT_GETTER(rings)

#define RING_GETTER(name)                                                           \
    static PyObject *Poller_ring_##name(Poller *p, void *Py_UNUSED(closure))       \
    {                                                                               \
        return PyLong_FromUnsignedLongLong(p->ring.name);                           \
    }
RING_GETTER(pushed)
RING_GETTER(taken)
RING_GETTER(full_waits)
RING_GETTER(wakes)

static PyObject *Poller_ring_running(Poller *p, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(p->ring_running);
}

static PyObject *Poller_closed(Poller *p, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(!p->has_view);
}

static PyObject *Poller_checking(Poller *p, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(p->checking);
}

static PyMethodDef Poller_methods[] = {
    {"poll", (PyCFunction)Poller_poll, METH_NOARGS, "poll() -> [(block, generation, seen_ns)]: one poll."},
    {"wait", (PyCFunction)Poller_wait, METH_VARARGS,
     "wait(spin_ns, timeout_ns, nap_ns=0, warm_ns=0) -> [(block, generation, seen_ns)]: spin, then nap while warm, "
     "then sleep on the doorbell, without the GIL."},
    {"check_descriptors", (PyCFunction)(void (*)(void))Poller_check_descriptors, METH_VARARGS | METH_KEYWORDS,
     "check_descriptors(region, descriptor_first, descriptor_stride, ids_first, ids_stride, block_tokens): from "
     "now on every fire's descriptor is checked and poll()/wait() return (block, generation, seen_ns, verdict, "
     "checked_ns); check_descriptors(None): not any more. ValueError when the layout passes the region."},
    {"interrupt", (PyCFunction)Poller_interrupt, METH_NOARGS, "End a wait() now (any thread)."},
    {"start_ring", (PyCFunction)(void (*)(void))Poller_start_ring, METH_VARARGS | METH_KEYWORDS,
     "start_ring(capacity, spin_ns, timeout_ns, busy=False): a native thread of its own polls from now on (as wait() "
     "does: spin_ns after a fire, always when busy, then the doorbell or timeout_ns) and pushes every fire into a "
     "ring of capacity (rounded up to a power of two) for take()."},
    {"stop_ring", (PyCFunction)Poller_stop_ring, METH_NOARGS,
     "Stop the ring's thread and wait for it; the fires it pushed stay to be taken."},
    {"take", (PyCFunction)(void (*)(void))Poller_take, METH_VARARGS | METH_KEYWORDS,
     "take(max=64, timeout_ns=0, spin_ns=0) -> fires: up to max from the ring, waiting without the GIL up to "
     "timeout_ns for the first (spinning spin_ns of it); [] at the timeout or interrupt_take()."},
    {"interrupt_take", (PyCFunction)Poller_interrupt_take, METH_NOARGS, "End a take() now (any thread)."},
    {"close", (PyCFunction)Poller_close, METH_NOARGS, "Release the buffer (no wait() may be running)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Poller_getset[] = {
    {"polls", (getter)Poller_polls, NULL, "Polls so far.", NULL},
    {"fires", (getter)Poller_fires, NULL, "Entries fired so far.", NULL},
    {"sleeps", (getter)Poller_sleeps, NULL, "Sleeps (on the doorbell or a timer) so far.", NULL},
    {"naps", (getter)Poller_naps, NULL, "Naps (warm sleeps with the doorbell left awake) so far.", NULL},
    {"rings", (getter)Poller_rings, NULL, "Sleeps the doorbell ended.", NULL},
    {"closed", (getter)Poller_closed, NULL, "Whether close() was called.", NULL},
    {"checking", (getter)Poller_checking, NULL, "Whether fires' descriptors are checked.", NULL},
    {"ring_running", (getter)Poller_ring_running, NULL, "Whether the ring's thread polls.", NULL},
    {"ring_pushed", (getter)Poller_ring_pushed, NULL, "Fires the ring's thread pushed.", NULL},
    {"ring_taken", (getter)Poller_ring_taken, NULL, "Fires take() returned.", NULL},
    {"ring_full_waits", (getter)Poller_ring_full_waits, NULL, "Waits of the ring's thread for a full ring.", NULL},
    {"ring_wakes", (getter)Poller_ring_wakes, NULL, "Sleeping take()s the ring's thread woke.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PollerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "smartnic._poller.Poller",
    .tp_doc = "A pool's standing PUT triggers, polled and waited on without the GIL (see smartnic/_poller.c).",
    .tp_basicsize = sizeof(Poller),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Poller_init,
    .tp_dealloc = (destructor)Poller_dealloc,
    .tp_methods = Poller_methods,
    .tp_getset = Poller_getset,
};

static PyObject *module_check_descriptor(PyObject *Py_UNUSED(m), PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"region", "descriptor_offset", "ids_offset", "block_tokens", "generation", NULL};
    PyObject *region;
    Py_ssize_t d_offset, i_offset, block_tokens;
    unsigned long long generation;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OnnnK", kwlist, &region, &d_offset, &i_offset, &block_tokens,
                                     &generation))
        return NULL;
    if (block_tokens <= 0 || block_tokens > D_MAX_BLOCK_TOKENS) {
        PyErr_Format(PyExc_ValueError, "block_tokens in [1, %ld]", (long)D_MAX_BLOCK_TOKENS);
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(region, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (!fits(view.len, d_offset, 0, 1, DESCRIPTOR_BYTES) ||
        !fits(view.len, i_offset, 0, 1, block_tokens * TOKEN_ID_BYTES)) {
        PyErr_Format(PyExc_ValueError, "the descriptor at %zd or %zd token ids at %zd pass the region's %zd bytes",
                     d_offset, block_tokens, i_offset, view.len);
        PyBuffer_Release(&view);
        return NULL;
    }
    int verdict = check_record((const uint8_t *)view.buf + d_offset, (const uint8_t *)view.buf + i_offset,
                               (uint32_t)block_tokens, generation);
    PyBuffer_Release(&view);
    return PyLong_FromLong(verdict);
}

static PyObject *module_crc32c(PyObject *Py_UNUSED(m), PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"data", "crc", "software", NULL};
    Py_buffer data;
    unsigned int crc = 0;
    int software = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "y*|Ip", kwlist, &data, &crc, &software))
        return NULL;
    uint32_t out = software ? crc32c_software(crc, data.buf, (size_t)data.len)
                            : crc32c_extend(crc, data.buf, (size_t)data.len);
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(out);
}

static PyObject *module_blake2b(PyObject *Py_UNUSED(m), PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"data", "digest_size", NULL};
    Py_buffer data;
    int size = 16;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "y*|i", kwlist, &data, &size))
        return NULL;
    if (size < 1 || size > 64) {
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_ValueError, "digest_size in [1, 64]");
        return NULL;
    }
    Blake2b h;
    uint8_t out[64];
    blake2b_init(&h, (size_t)size);
    blake2b_update(&h, data.buf, (size_t)data.len);
    blake2b_final(&h, out);
    PyBuffer_Release(&data);
    return PyBytes_FromStringAndSize((const char *)out, size);
}

static PyMethodDef module_methods[] = {
    {"check_descriptor", (PyCFunction)(void (*)(void))module_check_descriptor, METH_VARARGS | METH_KEYWORDS,
     "check_descriptor(region, descriptor_offset, ids_offset, block_tokens, generation) -> verdict: the check a "
     "checking Poller makes at a fire (0: accepted; else a code, VERDICTS[code] says why). ValueError when the "
     "descriptor or the block's ids pass the region."},
    {"crc32c", (PyCFunction)(void (*)(void))module_crc32c, METH_VARARGS | METH_KEYWORDS,
     "crc32c(data, crc=0, software=False) -> int: crc32c of the bytes so far (crc) then data (the check's own; "
     "software: the table routine even where SSE4.2 is used)."},
    {"blake2b", (PyCFunction)(void (*)(void))module_blake2b, METH_VARARGS | METH_KEYWORDS,
     "blake2b(data, digest_size=16) -> bytes: unkeyed BLAKE2b (the check's own, RFC 7693)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "smartnic._poller",
    "A pool's standing PUT triggers, polled and waited on without the GIL, and their descriptors checked there "
    "(see smartnic/_poller.c).", -1, module_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__poller(void)
{
    crc32c_init();
    if (PyType_Ready(&PollerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    Py_INCREF(&PollerType);
    if (PyModule_AddObject(m, "Poller", (PyObject *)&PollerType) < 0) {
        Py_DECREF(&PollerType);
        Py_DECREF(m);
        return NULL;
    }
    PyObject *verdicts = PyTuple_New(V_COUNT);
    for (int i = 0; verdicts && i < V_COUNT; i++) {
        PyObject *message = PyUnicode_FromString(verdict_messages[i]);
        if (!message || PyModule_AddIntConstant(m, verdict_names[i], i) < 0) {
            Py_XDECREF(message);
            Py_CLEAR(verdicts);
            break;
        }
        PyTuple_SET_ITEM(verdicts, i, message);
    }
    if (!verdicts || PyModule_AddObject(m, "VERDICTS", verdicts) < 0 ||
        PyModule_AddIntConstant(m, "DESCRIPTOR_BYTES", DESCRIPTOR_BYTES) < 0 ||
        PyModule_AddIntConstant(m, "CRC_HARDWARE", crc32c_hardware) < 0) {
        Py_XDECREF(verdicts);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
