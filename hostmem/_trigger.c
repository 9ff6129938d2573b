/* hostmem._trigger: one engine step's triggered PUTs, described and triggered in one call.
 *
 * On the paper's hardware the GPU's part of a triggered PUT is a descriptor write and one store to a
 * counter. In Python each block cost the engine's thread a struct pack, a crc32c call, slice stores,
 * a stamp and the counter's reads and store: a few microseconds warm, but the engine comes to them
 * right after a forward has swept the caches, and there they cost it a hundred or more (`kvtb bench
 * offload`). Here the blocks that filled in one step are written in one call, as
 * hostmem.descriptor.Writer.write and stamp would (the same bytes: tests/hostmem/test_trigger.py),
 * then their triggers stored, in order. Python keeps the control: which blocks, their names and owners.
 *
 *   store(region, descriptor_first, counter_first, per_block, num_blocks, blocks) -> [(generation, success, error)]
 *       region: a writable buffer of the whole region; block b's record is the DESCRIPTOR_BYTES at
 *       descriptor_first + b * DESCRIPTOR_BYTES, its PUT trigger the counter b * per_block and its PUT-done
 *       counter the next (counter c: u64 success at counter_first + 16 c, u64 error after it).
 *       blocks: a sequence of (block_id, chunk_index, token_count, hash, parent, owner_part, shared):
 *       hash 16 bytes, parent 0 or 16, owner_part hostmem.descriptor.owner()'s bytes.
 *       Every block is checked before anything is written (ValueError, nothing written); then every record
 *       is written and stamped (CLOCK_MONOTONIC ns), then for each block its PUT-done counter is read (the
 *       base a PUT's end is judged from) and its trigger set to the next generation (one release store:
 *       the agent's entry fires). Returns, per block, that generation and the base (success, error).
 *
 * The engine's thread only (the records and triggers are the compute node's to write); the GIL is held
 * (a step's batch is a few kilobytes of writes).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "bounds.h"
#include "crc32c.h"

#define DESCRIPTOR_BYTES 512
#define CRC_OFFSET (DESCRIPTOR_BYTES - 4)
#define STAMP_OFFSET (CRC_OFFSET - 8)
#define HEAD_BYTES 58  /* "<4sHHQIIH16s16s" */
#define VERSION 2
#define SHARED 1
#define MAX_BATCH 65536

typedef struct {
    unsigned long long block, index, tokens, generation;
    const char *hash, *parent, *owner;
    Py_ssize_t parent_len, owner_len;
    int shared;
} Item;

static void put_u16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }  /* x86-64 and aarch64: little endian */
static void put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

static int64_t monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* One block of the sequence as an Item (borrowed pointers into the tuple's bytes); -1 with ValueError. */
static int item_of(PyObject *t, Item *it, unsigned long long num_blocks)
{
    PyObject *hash, *parent, *owner;
    int shared;
    if (!PyArg_ParseTuple(t, "KKKSSSp", &it->block, &it->index, &it->tokens, &hash, &parent, &owner, &shared))
        return -1;
    if (it->block >= num_blocks) {
        PyErr_Format(PyExc_ValueError, "block %llu out of range [0, %llu)", it->block, num_blocks);
        return -1;
    }
    if (PyBytes_GET_SIZE(hash) != 16 || (PyBytes_GET_SIZE(parent) != 0 && PyBytes_GET_SIZE(parent) != 16)) {
        PyErr_SetString(PyExc_ValueError, "hash must be 16 bytes and parent 0 or 16");
        return -1;
    }
    if (it->index > 0xFFFFFFFFull || it->tokens == 0 || it->tokens > 0xFFFFFFFFull) {
        PyErr_SetString(PyExc_ValueError, "chunk index and token count must fit in u32 (and tokens be > 0)");
        return -1;
    }
    it->owner_len = PyBytes_GET_SIZE(owner);
    if (it->owner_len < 6 || HEAD_BYTES + it->owner_len > STAMP_OFFSET) {
        PyErr_SetString(PyExc_ValueError, "the owner part does not fit in a record");
        return -1;
    }
    it->hash = PyBytes_AS_STRING(hash);
    it->parent = PyBytes_AS_STRING(parent);
    it->parent_len = PyBytes_GET_SIZE(parent);
    it->owner = PyBytes_AS_STRING(owner);
    it->shared = shared;
    return 0;
}

static PyObject *trigger_store(PyObject *self, PyObject *args)
{
    Py_buffer region;
    Py_ssize_t descriptor_first, counter_first, per_block, num_blocks;
    PyObject *blocks, *seq = NULL, *out = NULL;
    Item *items = NULL;
    if (!PyArg_ParseTuple(args, "w*nnnnO", &region, &descriptor_first, &counter_first, &per_block, &num_blocks,
                          &blocks))
        return NULL;
    uint8_t *base = region.buf;
    Py_ssize_t num_counters;  /* every block's counters: the PUT trigger, the PUT-done, ... */
    if (per_block < 2 || __builtin_mul_overflow(num_blocks, per_block, &num_counters) ||
        !fits(region.len, descriptor_first, DESCRIPTOR_BYTES, num_blocks, DESCRIPTOR_BYTES) ||
        !fits(region.len, counter_first, 16, num_counters, 16) || (counter_first % 8) != 0 || ((uintptr_t)base % 8) != 0) {
        PyErr_SetString(PyExc_ValueError, "the descriptors or counters pass the region (or are not aligned)");
        goto done;
    }
    if (!(seq = PySequence_Fast(blocks, "blocks must be a sequence")))
        goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > MAX_BATCH) {
        PyErr_Format(PyExc_ValueError, "at most %d blocks a batch", MAX_BATCH);
        goto done;
    }
    if (!(items = PyMem_Malloc(sizeof(Item) * (n ? n : 1)))) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++)  /* every block checked before anything is written */
        if (item_of(PySequence_Fast_GET_ITEM(seq, i), &items[i], (unsigned long long)num_blocks) < 0)
            goto done;
    if (!(out = PyList_New(n)))
        goto done;
    uint64_t *counters = (uint64_t *)(base + counter_first);
    for (Py_ssize_t i = 0; i < n; i++) {
        Item *it = &items[i];
        uint8_t *r = base + descriptor_first + it->block * DESCRIPTOR_BYTES;
        uint64_t trigger = it->block * (uint64_t)per_block;
        uint64_t generation = __atomic_load_n(&counters[2 * trigger], __ATOMIC_RELAXED) + 1;
        it->generation = generation;
        memcpy(r, "KVBD", 4);
        put_u16(r + 4, VERSION);
        put_u16(r + 6, it->shared ? SHARED : 0);
        put_u64(r + 8, generation);
        put_u32(r + 16, (uint32_t)it->index);
        put_u32(r + 20, (uint32_t)it->tokens);
        put_u16(r + 24, (uint16_t)it->parent_len);
        memcpy(r + 26, it->hash, 16);
        memset(r + 42, 0, 16);
        memcpy(r + 42, it->parent, (size_t)it->parent_len);
        memcpy(r + HEAD_BYTES, it->owner, (size_t)it->owner_len);
        put_u32(r + CRC_OFFSET, crc32c_extend(0, r, (size_t)(HEAD_BYTES + it->owner_len)));
        put_u64(r + STAMP_OFFSET, (uint64_t)monotonic_ns());  /* trigger-to-fire is timed from here */
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        const Item *it = &items[i];
        uint64_t trigger = it->block * (uint64_t)per_block, done = trigger + 1;
        uint64_t success = __atomic_load_n(&counters[2 * done], __ATOMIC_ACQUIRE);
        uint64_t error = __atomic_load_n(&counters[2 * done + 1], __ATOMIC_ACQUIRE);
        uint64_t generation = it->generation;
        __atomic_store_n(&counters[2 * trigger], generation, __ATOMIC_RELEASE);  /* the agent's entry fires */
        PyObject *row = Py_BuildValue("(KKK)", (unsigned long long)generation, (unsigned long long)success,
                                      (unsigned long long)error);
        if (!row) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, i, row);
    }
done:
    PyMem_Free(items);
    Py_XDECREF(seq);
    PyBuffer_Release(&region);
    return out;
}

static PyMethodDef methods[] = {
    {"store", trigger_store, METH_VARARGS,
     "store(region, descriptor_first, counter_first, per_block, num_blocks, blocks) -> [(generation, success, "
     "error)]: one step's records written and stamped, then their triggers stored."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "hostmem._trigger",
    "One engine step's triggered PUTs, described and triggered in one call.", -1, methods,
};

PyMODINIT_FUNC PyInit__trigger(void)
{
    crc32c_init();
    return PyModule_Create(&module);
}
