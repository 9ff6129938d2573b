/* hostmem/dma_runs.h: what the data path's C shares (hostmem/_dma.c, the copy engine; hostmem/_lander.c,
 * the landing): runs of a buffer, parsed and bound-checked, and the streaming copy into the region.
 * Static functions, included by each extension (each is its own shared object). */
#ifndef KVTB_DMA_RUNS_H
#define KVTB_DMA_RUNS_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <emmintrin.h>

/* -- runs ----------------------------------------------------------------------------------- */

typedef struct {
    Py_ssize_t first, length, stride, count;
} run_t;

/* Parse and bound-check runs against a buffer of mem_len bytes; the number of runs, or -1 with
 * an exception set. *runs_out is PyMem_Malloc'ed; *total gets the runs' bytes. */
static Py_ssize_t parse_runs(PyObject *seq, Py_ssize_t mem_len, run_t **runs_out, Py_ssize_t *total)
{
    PyObject *fast = PySequence_Fast(seq, "runs must be a sequence of (first, length, stride, count)");
    if (fast == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    run_t *runs = PyMem_Malloc(sizeof(run_t) * (n ? n : 1));
    if (runs == NULL) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    *total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        run_t *r = &runs[i];
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "nnnn;a run is (first, length, stride, count)",
                              &r->first, &r->length, &r->stride, &r->count))
            goto fail;
        if (r->first < 0 || r->length < 0 || r->count < 0 || (r->count > 1 && r->stride < r->length)) {
            PyErr_Format(PyExc_ValueError, "run %zd (%zd, %zd, %zd, %zd) is malformed", i,
                         r->first, r->length, r->stride, r->count);
            goto fail;
        }
        if (r->count == 0 || r->length == 0)
            continue;
        /* last row's end = first + (count - 1) * stride + length <= mem_len, without overflow */
        if (r->first > mem_len || r->length > mem_len - r->first ||
            (r->count > 1 && (r->count - 1) > (mem_len - r->first - r->length) / r->stride)) {
            PyErr_Format(PyExc_ValueError, "run %zd (%zd, %zd, %zd, %zd) reaches past the %zd bytes of mem",
                         i, r->first, r->length, r->stride, r->count, mem_len);
            goto fail;
        }
        *total += r->length * r->count;  /* each run lies in mem, so this cannot overflow by much */
    }
    Py_DECREF(fast);
    *runs_out = runs;
    return n;
fail:
    Py_DECREF(fast);
    PyMem_Free(runs);
    return -1;
}

/* memcpy, with non-temporal stores when dst is 16-byte aligned: the region is not read again
 * soon, so its lines need not be fetched (read for ownership) nor kept in the cache. */
static void copy_streaming(uint8_t *dst, const uint8_t *src, size_t n)
{
    if (((uintptr_t)dst & 15) == 0) {
        for (; n >= 64; n -= 64, src += 64, dst += 64) {
            __m128i a = _mm_loadu_si128((const __m128i *)src);
            __m128i b = _mm_loadu_si128((const __m128i *)(src + 16));
            __m128i c = _mm_loadu_si128((const __m128i *)(src + 32));
            __m128i d = _mm_loadu_si128((const __m128i *)(src + 48));
            _mm_stream_si128((__m128i *)dst, a);
            _mm_stream_si128((__m128i *)(dst + 16), b);
            _mm_stream_si128((__m128i *)(dst + 32), c);
            _mm_stream_si128((__m128i *)(dst + 48), d);
        }
    }
    memcpy(dst, src, n);
}

#endif
