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
 *
 *   Poller(counters, first, stride, count, bell=-1, armed=None)
 *       counters: a writable buffer holding the trigger counters (the region's counter array); block
 *       b's trigger is the u64 at byte first + b * stride; bell: the byte offset of the doorbell's
 *       u32 in the same buffer (-1: none, wait() sleeps its timeout). The entries are armed at
 *       `armed` (a buffer of count u64) or at the counters' values now (what was stored before is
 *       not due), and re-arm themselves at each fire: a block fires when its trigger holds a
 *       generation past the one it last fired at.
 *   poll() -> [(block, generation, seen_ns)]          one poll, with the GIL held (about 1 µs)
 *   wait(spin_ns, timeout_ns) -> [(block, generation, seen_ns)]
 *       without the GIL: poll back to back for spin_ns, then sleep on the doorbell (or the timeout)
 *       and poll again; returns as soon as something fired, or empty after the timeout or interrupt()
 *   interrupt()   end a wait() now, from any thread (the watcher has other work: a registration...)
 *   polls, fires, sleeps, rings: counts (rings: waits the compute node ended)
 * seen_ns: CLOCK_MONOTONIC (time.monotonic_ns), read right after the poll found the store.
 * Linux only (futex); elsewhere the build fails and smartnic.standing polls from Python.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#if !defined(__linux__)
#error "smartnic._poller needs Linux (futex); smartnic.standing polls from Python elsewhere"
#endif

#include <errno.h>
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

typedef struct {
    uint32_t block;
    uint64_t generation;
    int64_t seen_ns;
} Fired;

typedef struct {
    PyObject_HEAD
    Py_buffer view;
    int has_view;
    const char *base;          /* the first trigger */
    Py_ssize_t stride, count;
    uint32_t *bell;            /* NULL: no doorbell */
    uint64_t *armed;           /* [count]: fire when the trigger passes this */
    Fired *fired;              /* [count]: one poll's finds */
    int waiting;               /* a wait() is running (one at a time) */
    int interrupted;           /* atomic */
    unsigned long long polls, fires, sleeps, rings;
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
            n++;
        }
    }
    p->fires += (unsigned long long)n;
    return n;
}

static PyObject *as_list(Poller *p, Py_ssize_t n)
{
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out && i < n; i++) {
        PyObject *item = Py_BuildValue("(IKL)", p->fired[i].block, (unsigned long long)p->fired[i].generation,
                                       (long long)p->fired[i].seen_ns);
        if (!item) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, item);
    }
    return out;
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

/* Without the GIL: spin, then sleep on the bell (or the timeout), then poll; how many fired. */
static Py_ssize_t wait_for_stores(Poller *p, int64_t spin_ns, int64_t timeout_ns)
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

static void release(Poller *p)
{
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
    if ((count && first + (count - 1) * stride + 8 > p->view.len) || bell + 4 > p->view.len) {
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

static void Poller_dealloc(Poller *p)
{
    release(p);
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
    long long spin_ns, timeout_ns;
    if (!PyArg_ParseTuple(args, "LL", &spin_ns, &timeout_ns) || !ready(p))
        return NULL;
    Py_ssize_t n;
    p->waiting = 1;  /* close() waits for it: the buffer stays while this thread reads it */
    Py_BEGIN_ALLOW_THREADS
    n = wait_for_stores(p, spin_ns, timeout_ns);
    Py_END_ALLOW_THREADS
    p->waiting = 0;
    return as_list(p, n);
}

static PyObject *Poller_interrupt(Poller *p, PyObject *Py_UNUSED(ignored))
{
    __atomic_store_n(&p->interrupted, 1, __ATOMIC_RELEASE);
    if (p->bell && p->has_view && __atomic_exchange_n(p->bell, AWAKE, __ATOMIC_SEQ_CST) == SLEEPING)
        syscall(SYS_futex, p->bell, FUTEX_WAKE, 1, NULL, NULL, 0);
    Py_RETURN_NONE;
}

static PyObject *Poller_close(Poller *p, PyObject *Py_UNUSED(ignored))
{
    if (p->waiting) {
        PyErr_SetString(PyExc_RuntimeError, "a thread is waiting on this Poller: interrupt it first");
        return NULL;
    }
    release(p);
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
COUNT_GETTER(rings)

static PyObject *Poller_closed(Poller *p, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(!p->has_view);
}

static PyMethodDef Poller_methods[] = {
    {"poll", (PyCFunction)Poller_poll, METH_NOARGS, "poll() -> [(block, generation, seen_ns)]: one poll."},
    {"wait", (PyCFunction)Poller_wait, METH_VARARGS,
     "wait(spin_ns, timeout_ns) -> [(block, generation, seen_ns)]: spin, then sleep on the doorbell, without the GIL."},
    {"interrupt", (PyCFunction)Poller_interrupt, METH_NOARGS, "End a wait() now (any thread)."},
    {"close", (PyCFunction)Poller_close, METH_NOARGS, "Release the buffer (no wait() may be running)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Poller_getset[] = {
    {"polls", (getter)Poller_polls, NULL, "Polls so far.", NULL},
    {"fires", (getter)Poller_fires, NULL, "Entries fired so far.", NULL},
    {"sleeps", (getter)Poller_sleeps, NULL, "Sleeps (on the doorbell or a timer) so far.", NULL},
    {"rings", (getter)Poller_rings, NULL, "Sleeps the doorbell ended.", NULL},
    {"closed", (getter)Poller_closed, NULL, "Whether close() was called.", NULL},
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

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "smartnic._poller",
    "A pool's standing PUT triggers, polled and waited on without the GIL (see smartnic/_poller.c).", -1, NULL,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__poller(void)
{
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
    return m;
}
