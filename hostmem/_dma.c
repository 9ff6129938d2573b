/* hostmem._dma: the data path's copy engine, with the crc32c folded into the copy.
 *
 * A NIC's DMA engine moves a scatter-gather list between host memory and its packets and
 * computes the checksum on the fly. The numpy path (hostmem.gather) does the same in blocks
 * of 512 KiB: it copies a block, then checksums it from L2, two passes and several Python calls
 * per MiB. Here each row is copied in pieces of at most PIECE_BYTES and the piece is
 * checksummed at once, from L1, with three crc32 streams in flight (combined by shifting, as
 * in Mark Adler's crc32c.c), so the checksum costs little beyond the copy. Writes into the
 * region use non-temporal stores, as a NIC's DMA writes bypass the CPU's caches: the region's
 * lines are not read before they are written, nor kept in the cache.
 *
 *   scatter(source, mem, runs, crc) -> crc   copy the contiguous source into the runs of mem
 *   gather(mem, runs, out, crc) -> crc       copy the runs of mem into the contiguous out
 *
 * crc None: copy only, and return None (for a reader that checks a MAC instead).
 * runs: a sequence of (first, length, stride, count) (hostmem.gather.Run): `count` rows of
 * `length` bytes, the i-th at first + i * stride. crc: the crc32c of the bytes before; the
 * result is extended over the contiguous side. Every row must lie inside mem and the runs
 * must hold exactly the contiguous side's bytes, or ValueError is raised and nothing copied.
 * The GIL is released while copying more than RELEASE_GIL_BYTES.
 *
 * HARDWARE_CRC is False when the CPU lacks SSE4.2; the functions then raise RuntimeError and
 * hostmem.dma uses the numpy path. Built by setuptools as an optional extension: a machine
 * without a C compiler (or not x86-64) gets the numpy path.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if !defined(__x86_64__)
#error "hostmem._dma needs x86-64 (SSE4.2 crc32); hostmem.dma uses numpy elsewhere"
#endif
#include <nmmintrin.h>
#include <emmintrin.h>

#define PIECE_BYTES (16 << 10)     /* copied, then checksummed while in L1 */
#define RELEASE_GIL_BYTES (64 << 10)

static PyObject *zero;               /* the default crc */

/* -- crc32c: kvtb/crc32c.h (the one C copy, shared with smartnic/_poller.c); its SSE4.2 routine keeps
 * three streams in flight, so the checksum costs little beyond the copy ---------------------- */
#include "crc32c.h"

#include "dma_runs.h"

/* Copy between the runs of mem and the contiguous flat buffer, checksumming flat's bytes (if checksum). */
static uint32_t copy_runs(uint8_t *mem, uint8_t *flat, const run_t *runs, Py_ssize_t n, int into_mem,
                          uint32_t crc, int checksum)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        const run_t *r = &runs[i];
        for (Py_ssize_t k = 0; k < r->count && r->length; k++) {
            uint8_t *row = mem + r->first + k * r->stride;
            for (Py_ssize_t done = 0; done < r->length;) {
                size_t piece = (size_t)(r->length - done) < PIECE_BYTES ? (size_t)(r->length - done) : PIECE_BYTES;
                if (into_mem)
                    copy_streaming(row + done, flat, piece);
                else
                    memcpy(flat, row + done, piece);
                if (checksum)
                    crc = crc32c_extend(crc, flat, piece);
                flat += piece;
                done += (Py_ssize_t)piece;
            }
        }
    }
    if (into_mem)
        _mm_sfence();
    return crc;
}

static PyObject *transfer(PyObject *mem_obj, PyObject *runs_obj, PyObject *flat_obj, PyObject *crc_obj,
                          int into_mem)
{
    int checksum = crc_obj != Py_None;
    unsigned long crc_in = 0;
    if (checksum) {
        crc_in = PyLong_AsUnsignedLong(crc_obj);
        if (crc_in == (unsigned long)-1 && PyErr_Occurred())
            return NULL;
    }
    if (!crc32c_hardware) {
        PyErr_SetString(PyExc_RuntimeError, "this CPU has no SSE4.2 crc32: use the numpy path");
        return NULL;
    }
    Py_buffer mem, flat;
    if (PyObject_GetBuffer(mem_obj, &mem, into_mem ? (PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) : PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    if (PyObject_GetBuffer(flat_obj, &flat, into_mem ? PyBUF_C_CONTIGUOUS : (PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS)) < 0) {
        PyBuffer_Release(&mem);
        return NULL;
    }
    PyObject *result = NULL;
    run_t *runs = NULL;
    Py_ssize_t total = 0;
    Py_ssize_t n = parse_runs(runs_obj, mem.len, &runs, &total);
    if (n < 0)
        goto done;
    if (total != flat.len) {
        PyErr_Format(PyExc_ValueError, "%s of %zd bytes for runs of %zd", into_mem ? "source" : "out",
                     flat.len, total);
        goto done;
    }
    uint32_t crc = (uint32_t)crc_in;
    if (total >= RELEASE_GIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        crc = copy_runs(mem.buf, flat.buf, runs, n, into_mem, crc, checksum);
        Py_END_ALLOW_THREADS
    } else {
        crc = copy_runs(mem.buf, flat.buf, runs, n, into_mem, crc, checksum);
    }
    if (checksum) {
        result = PyLong_FromUnsignedLong(crc);
    } else {
        Py_INCREF(Py_None);
        result = Py_None;
    }
done:
    PyMem_Free(runs);
    PyBuffer_Release(&flat);
    PyBuffer_Release(&mem);
    return result;
}

static PyObject *dma_scatter(PyObject *self, PyObject *args)
{
    PyObject *source, *mem, *runs, *crc = NULL;
    if (!PyArg_ParseTuple(args, "OOO|O:scatter", &source, &mem, &runs, &crc))
        return NULL;
    if (crc == NULL)
        crc = zero;
    return transfer(mem, runs, source, crc, 1);
}

static PyObject *dma_gather(PyObject *self, PyObject *args)
{
    PyObject *mem, *runs, *out, *crc = NULL;
    if (!PyArg_ParseTuple(args, "OOO|O:gather", &mem, &runs, &out, &crc))
        return NULL;
    if (crc == NULL)
        crc = zero;
    return transfer(mem, runs, out, crc, 0);
}

static PyMethodDef methods[] = {
    {"scatter", dma_scatter, METH_VARARGS,
     "scatter(source, mem, runs, crc=0) -> crc32c: copy the contiguous source into mem's runs (crc None: no checksum)."},
    {"gather", dma_gather, METH_VARARGS,
     "gather(mem, runs, out, crc=0) -> crc32c: copy mem's runs into the contiguous out (crc None: no checksum)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "hostmem._dma",
    "The data path's copy engine with the crc32c folded in (see hostmem/_dma.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__dma(void)
{
    crc32c_init();
    zero = PyLong_FromLong(0);
    if (zero == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddObject(m, "HARDWARE_CRC", PyBool_FromLong(crc32c_hardware)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
