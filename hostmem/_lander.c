/* hostmem._lander: a stored block's KV landing in the region, copied and MAC-checked in C.
 *
 * A restore receives each block's KV parts (fabric.chunk_format: one part per layer, each with its
 * keyed BLAKE3 MAC) as data PDUs of up to 2 MiB. In Python, each part of each PDU cost a hasher, a
 * cut of the target runs, a copy call and a hash call: tens of microseconds a part, so a 2,048-token
 * context (thousands of parts) landed at a fraction of what the socket and the memory bus give.
 * Here one call places a whole piece of a block's KV: it copies each part's bytes into the region
 * (non-temporal stores, as a NIC's DMA writes) and feeds them, still in the cache, to that part's
 * keyed BLAKE3 (the vendored C implementation, hostmem/blake3, with its SSE4.1/AVX2/AVX-512 code),
 * without the interpreter lock. Python keeps the control: which block, which key, which parts make
 * a group, and what a failure means (smartnic.landing).
 *
 *   Lander(runs, kv_base, part_bytes, parts, key, prefix)
 *       runs: the block's targets in the region (hostmem.gather.Run rows, token ids first);
 *       kv_base: where its KV starts in the targets' bytes (after the token ids);
 *       part_bytes, parts: the KV's parts; key: the 32-byte MAC key; prefix: what each part's MAC
 *       starts with before its 4-byte little-endian part number (fabric.chunk_format.chunk_mac).
 *   place(source, mem, kv_pos)      copy source, the block's KV bytes [kv_pos, kv_pos + len), into
 *       mem, feeding each part's MAC. ValueError, with nothing copied, when the bytes lie outside the
 *       KV or a part's bytes would come out of order (each part's MAC needs them in order).
 *   check(first, end, macs, base) -> int   the first part of [first, end) whose MAC is not the one at
 *       macs[base + part * 32] (compared in constant time), or -1 when all match. ValueError when a
 *       part has not received all its bytes.
 *   fed(part) -> int                the bytes a part received so far.
 *
 * A part's hasher is made when its first byte comes (a forged header cannot make it allocate for
 * parts that never arrive). One thread at a time: a second caller while the lock is released gets
 * RuntimeError (smartnic.landing serialises its callers with its own lock).
 */
#include "dma_runs.h"
#include "blake3/blake3.h"

#define LANDER_MAX_PARTS 0xFFFF
#define MAC_BYTES 32
#define MAX_PREFIX_BYTES 256
#define RELEASE_GIL_BYTES (64 << 10)
#define HASH_PIECE_BYTES (64 << 10)  /* copied, then hashed while the source is still in L2 */

typedef struct {
    PyObject_HEAD
    run_t *runs;
    Py_ssize_t nruns, total;      /* target bytes */
    Py_ssize_t *run_start;        /* where each run starts in the targets' bytes */
    Py_ssize_t extent;            /* the end of the last row in mem: mem must be at least this long */
    Py_ssize_t kv_base, part_bytes, parts;
    uint8_t key[BLAKE3_KEY_LEN];
    uint8_t prefix[MAX_PREFIX_BYTES + 4];
    Py_ssize_t prefix_len;
    blake3_hasher **hashers;      /* one per part, made at its first byte */
    Py_ssize_t *fed;              /* bytes each part received */
    int busy;
} Lander;

static void lander_dealloc(Lander *self)
{
    if (self->hashers != NULL) {
        for (Py_ssize_t p = 0; p < self->parts; p++)
            PyMem_RawFree(self->hashers[p]);
    }
    PyMem_Free(self->hashers);
    PyMem_Free(self->fed);
    PyMem_Free(self->runs);
    PyMem_Free(self->run_start);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int lander_init(Lander *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"runs", "kv_base", "part_bytes", "parts", "key", "prefix", NULL};
    PyObject *runs_obj;
    Py_buffer key, prefix;
    if (self->runs != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a Lander is initialised once");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "Onnny*y*:Lander", kwlist, &runs_obj, &self->kv_base,
                                     &self->part_bytes, &self->parts, &key, &prefix))
        return -1;
    int rc = -1;
    if (key.len != BLAKE3_KEY_LEN) {
        PyErr_Format(PyExc_ValueError, "the MAC key is %zd bytes, not %d", key.len, BLAKE3_KEY_LEN);
        goto done;
    }
    if (prefix.len > MAX_PREFIX_BYTES) {
        PyErr_Format(PyExc_ValueError, "a MAC prefix of %zd bytes (at most %d)", prefix.len, MAX_PREFIX_BYTES);
        goto done;
    }
    if (self->parts < 1 || self->parts > LANDER_MAX_PARTS || self->part_bytes < 1 || self->kv_base < 0) {
        PyErr_Format(PyExc_ValueError, "%zd parts of %zd bytes from %zd: expected 1-%d parts of at least one byte",
                     self->parts, self->part_bytes, self->kv_base, LANDER_MAX_PARTS);
        goto done;
    }
    Py_ssize_t total = 0;
    self->nruns = parse_runs(runs_obj, PY_SSIZE_T_MAX, &self->runs, &total);
    if (self->nruns < 0) {
        self->runs = NULL;
        goto done;
    }
    self->total = total;
    if (self->kv_base > total || self->part_bytes > (total - self->kv_base) / self->parts ||
        self->kv_base + self->parts * self->part_bytes != total) {
        PyErr_Format(PyExc_ValueError, "targets of %zd bytes do not hold %zd bytes then %zd parts of %zd", total,
                     self->kv_base, self->parts, self->part_bytes);
        goto done;
    }
    self->run_start = PyMem_Malloc(sizeof(Py_ssize_t) * (self->nruns + 1));
    self->hashers = PyMem_Calloc(self->parts, sizeof(blake3_hasher *));
    self->fed = PyMem_Calloc(self->parts, sizeof(Py_ssize_t));
    if (self->run_start == NULL || self->hashers == NULL || self->fed == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t at = 0;
    self->extent = 0;
    for (Py_ssize_t i = 0; i < self->nruns; i++) {
        const run_t *r = &self->runs[i];
        self->run_start[i] = at;
        at += r->length * r->count;
        if (r->count && r->length) {
            Py_ssize_t end = r->first + (r->count - 1) * r->stride + r->length;
            if (end > self->extent)
                self->extent = end;
        }
    }
    self->run_start[self->nruns] = at;
    memcpy(self->key, key.buf, BLAKE3_KEY_LEN);
    memcpy(self->prefix, prefix.buf, prefix.len);
    self->prefix_len = prefix.len;
    rc = 0;
done:
    PyBuffer_Release(&key);
    PyBuffer_Release(&prefix);
    return rc;
}

/* The run holding the targets' byte at `offset` (offset < total). */
static Py_ssize_t run_of(const Lander *self, Py_ssize_t offset)
{
    Py_ssize_t lo = 0, hi = self->nruns - 1;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi + 1) / 2;
        if (self->run_start[mid] <= offset)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Copy n bytes of src to the targets from their byte `offset` on. */
static void copy_to_targets(const Lander *self, uint8_t *mem, Py_ssize_t offset, const uint8_t *src, Py_ssize_t n)
{
    Py_ssize_t i = run_of(self, offset);
    while (n > 0) {
        const run_t *r = &self->runs[i];
        Py_ssize_t within = offset - self->run_start[i];
        if (r->length == 0 || within >= r->length * r->count) {
            i++;
            continue;
        }
        Py_ssize_t row = within / r->length, col = within % r->length;
        Py_ssize_t take = r->length - col < n ? r->length - col : n;
        copy_streaming(mem + r->first + row * r->stride + col, src, (size_t)take);
        src += take;
        offset += take;
        n -= take;
    }
}

static blake3_hasher *hasher_of(Lander *self, Py_ssize_t part)
{
    blake3_hasher *h = self->hashers[part];
    if (h != NULL)
        return h;
    h = PyMem_RawMalloc(sizeof(blake3_hasher));  /* raw: called without the interpreter lock */
    if (h == NULL)
        return NULL;
    uint8_t *number = self->prefix + self->prefix_len;
    uint32_t p = (uint32_t)part;
    number[0] = p & 0xFF; number[1] = (p >> 8) & 0xFF; number[2] = (p >> 16) & 0xFF; number[3] = p >> 24;
    blake3_hasher_init_keyed(h, self->key);
    blake3_hasher_update(h, self->prefix, (size_t)self->prefix_len + 4);
    self->hashers[part] = h;
    return h;
}

/* Copy and hash [kv_pos, kv_pos + n) of the KV (already checked); 0, or -1 when out of memory. */
static int land(Lander *self, uint8_t *mem, const uint8_t *src, Py_ssize_t kv_pos, Py_ssize_t n)
{
    while (n > 0) {
        Py_ssize_t part = kv_pos / self->part_bytes;
        Py_ssize_t left = (part + 1) * self->part_bytes - kv_pos;
        Py_ssize_t take = left < n ? left : n;
        if (take > HASH_PIECE_BYTES)
            take = HASH_PIECE_BYTES;
        blake3_hasher *h = hasher_of(self, part);
        if (h == NULL)
            return -1;
        copy_to_targets(self, mem, self->kv_base + kv_pos, src, take);
        blake3_hasher_update(h, src, (size_t)take);
        self->fed[part] += take;
        src += take;
        kv_pos += take;
        n -= take;
    }
    _mm_sfence();
    return 0;
}

static PyObject *lander_place(Lander *self, PyObject *args)
{
    Py_buffer source, mem;
    Py_ssize_t kv_pos;
    if (self->runs == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the Lander was not initialised");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "y*w*n:place", &source, &mem, &kv_pos))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = source.len, kv_bytes = self->parts * self->part_bytes;
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "a Lander is used by one thread at a time");
        goto done;
    }
    if (mem.len < self->extent) {
        PyErr_Format(PyExc_ValueError, "the targets reach byte %zd of a buffer of %zd", self->extent, mem.len);
        goto done;
    }
    if (kv_pos < 0 || kv_pos > kv_bytes || n > kv_bytes - kv_pos) {
        PyErr_Format(PyExc_ValueError, "KV bytes [%zd, %zd) of a block of %zd", kv_pos, kv_pos + n, kv_bytes);
        goto done;
    }
    /* every part the piece touches must take it where its bytes so far end (in order) */
    for (Py_ssize_t at = kv_pos; at < kv_pos + n;) {
        Py_ssize_t part = at / self->part_bytes, start = part * self->part_bytes;
        if (self->fed[part] != at - start) {
            PyErr_Format(PyExc_ValueError, "KV part %zd: bytes from %zd came after %zd of its bytes (out of order)",
                         part, at - start, self->fed[part]);
            goto done;
        }
        at = start + self->part_bytes;
    }
    int rc;
    self->busy = 1;
    if (n >= RELEASE_GIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        rc = land(self, mem.buf, source.buf, kv_pos, n);
        Py_END_ALLOW_THREADS
    } else {
        rc = land(self, mem.buf, source.buf, kv_pos, n);
    }
    self->busy = 0;
    if (rc < 0) {
        PyErr_NoMemory();
        goto done;
    }
    Py_INCREF(Py_None);
    result = Py_None;
done:
    PyBuffer_Release(&source);
    PyBuffer_Release(&mem);
    return result;
}

/* Constant-time comparison of two MACs. */
static int same_mac(const uint8_t *a, const uint8_t *b)
{
    uint8_t diff = 0;
    for (int i = 0; i < MAC_BYTES; i++)
        diff |= a[i] ^ b[i];
    return diff == 0;
}

static PyObject *lander_check(Lander *self, PyObject *args)
{
    Py_ssize_t first, end, base;
    Py_buffer macs;
    if (self->runs == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the Lander was not initialised");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "nny*n:check", &first, &end, &macs, &base))
        return NULL;
    PyObject *result = NULL;
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "a Lander is used by one thread at a time");
        goto done;
    }
    if (first < 0 || first > end || end > self->parts) {
        PyErr_Format(PyExc_ValueError, "parts [%zd, %zd) of %zd", first, end, self->parts);
        goto done;
    }
    if (base < 0 || base > macs.len || end * MAC_BYTES > macs.len - base) {
        PyErr_Format(PyExc_ValueError, "the MACs of parts [%zd, %zd) from byte %zd lie past the %zd bytes given",
                     first, end, base, macs.len);
        goto done;
    }
    Py_ssize_t bad = -1;
    for (Py_ssize_t p = first; p < end && bad < 0; p++) {
        if (self->fed[p] != self->part_bytes) {
            PyErr_Format(PyExc_ValueError, "KV part %zd received %zd of its %zd bytes", p, self->fed[p],
                         self->part_bytes);
            goto done;
        }
        uint8_t digest[MAC_BYTES];
        blake3_hasher_finalize(self->hashers[p], digest, MAC_BYTES);
        if (!same_mac(digest, (const uint8_t *)macs.buf + base + p * MAC_BYTES))
            bad = p;
    }
    result = PyLong_FromSsize_t(bad);
done:
    PyBuffer_Release(&macs);
    return result;
}

static PyObject *lander_fed(Lander *self, PyObject *arg)
{
    Py_ssize_t part = PyLong_AsSsize_t(arg);
    if (part == -1 && PyErr_Occurred())
        return NULL;
    if (self->fed == NULL || part < 0 || part >= self->parts) {
        PyErr_Format(PyExc_ValueError, "part %zd of %zd", part, self->parts);
        return NULL;
    }
    return PyLong_FromSsize_t(self->fed[part]);
}

static PyMethodDef lander_methods[] = {
    {"place", (PyCFunction)lander_place, METH_VARARGS,
     "place(source, mem, kv_pos): copy the block's KV bytes [kv_pos, kv_pos + len(source)) into mem, feeding each "
     "part's MAC."},
    {"check", (PyCFunction)lander_check, METH_VARARGS,
     "check(first, end, macs, base) -> int: the first part of [first, end) whose MAC is not macs[base + part * 32:], "
     "or -1."},
    {"fed", (PyCFunction)lander_fed, METH_O, "fed(part) -> int: the bytes the part received so far."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject LanderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hostmem._lander.Lander",
    .tp_doc = "One block's KV landing: copied into the region and MAC-checked part by part (hostmem/_lander.c).",
    .tp_basicsize = sizeof(Lander),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)lander_init,
    .tp_dealloc = (destructor)lander_dealloc,
    .tp_methods = lander_methods,
};

static PyObject *digest(PyObject *self, PyObject *args)
{
    Py_buffer key, data;
    if (!PyArg_ParseTuple(args, "y*y*:keyed_digest", &key, &data))
        return NULL;
    PyObject *result = NULL;
    if (key.len != BLAKE3_KEY_LEN) {
        PyErr_Format(PyExc_ValueError, "the key is %zd bytes, not %d", key.len, BLAKE3_KEY_LEN);
    } else {
        blake3_hasher h;
        uint8_t out[MAC_BYTES];
        blake3_hasher_init_keyed(&h, key.buf);
        Py_BEGIN_ALLOW_THREADS
        blake3_hasher_update(&h, data.buf, (size_t)data.len);
        Py_END_ALLOW_THREADS
        blake3_hasher_finalize(&h, out, MAC_BYTES);
        result = PyBytes_FromStringAndSize((const char *)out, MAC_BYTES);
    }
    PyBuffer_Release(&key);
    PyBuffer_Release(&data);
    return result;
}

static PyMethodDef methods[] = {
    {"keyed_digest", digest, METH_VARARGS,
     "keyed_digest(key, data) -> bytes: the vendored BLAKE3's keyed 32-byte digest (to check it against the blake3 "
     "package, and to time it)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "hostmem._lander",
    "A block's KV copied into the region and MAC-checked in C (see hostmem/_lander.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__lander(void)
{
    if (PyType_Ready(&LanderType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&LanderType);
    if (PyModule_AddObject(m, "Lander", (PyObject *)&LanderType) < 0 ||
        PyModule_AddStringConstant(m, "BLAKE3_VERSION", blake3_version()) < 0) {
        Py_DECREF(&LanderType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
