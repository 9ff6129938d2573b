/* compute_node._attention: decode attention read straight from the paged KV pool.
 *
 *   pool: [num_blocks, num_layers, 2 (K|V), num_kv_heads, block_tokens, head_dim] fp32
 *
 * The torch path (compute_node.paged_attention) first gathers each sequence's blocks of a layer
 * into a workspace, then runs scaled_dot_product_attention over it: the KV is written once more
 * and read twice. Here each (sequence, KV head) reads its blocks' K and V rows where they lie in
 * the pool, once, for the query heads that share that KV head, with an exact softmax (scores,
 * their maximum, then the exponentials and their sum), and only up to each sequence's own length:
 * no padding to the longest sequence, no mask.
 *
 *   decode(pool, num_blocks, num_layers, num_kv_heads, block_tokens, head_dim, layer,
 *          q, num_heads, out, tables, table_width, lens, seqs, scale)
 *
 * Each "sequence" here is one query token with its own table row and key count: a decode, or one
 * token of a short prefill chunk (the chunk's tokens share their sequence's table, and each sees
 * the keys up to its own position). Pointers are addresses (torch's data_ptr()): q and out
 * [seqs, num_heads, head_dim] fp32, tables [seqs, table_width] int32 block ids, lens [seqs] int64
 * keys per query. Every length must lie in [1, table_width * block_tokens] and every block id it
 * covers in [0, num_blocks), or ValueError is raised before anything is read.
 *
 * Work is split between (sequence, KV head) pairs over OpenMP's threads: imported after torch,
 * this module shares torch's OpenMP runtime (libgomp.so.1 is already loaded), hence its threads
 * and their count. The GIL is kept while it runs (torch's operators release it): the call is
 * short, and the engine would otherwise queue behind the gRPC threads to get the GIL back.
 *
 * Built by setuptools as an optional extension; without a C compiler, compute_node.paged_attention
 * gathers and uses torch.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CLONES
#endif

typedef struct {
    const float *pool;
    int64_t num_blocks, block_floats, layer_floats, kind_floats, head_floats;
    int block_tokens, head_dim, kv_heads, group;
    const float *q;
    float *out;
    const int32_t *tables;
    int64_t table_width;
    const int64_t *lens;
    float scale;
} Args;

/* One sequence's attention for one KV head and its `group` query heads. scores: group * len floats. */
CLONES static void attend_one(const Args *a, int64_t s, int h, float *scores) {
    const int D = a->head_dim, T = a->block_tokens, G = a->group;
    const int64_t len = a->lens[s];
    const int32_t *table = a->tables + s * a->table_width;
    const float *q = a->q + (s * a->kv_heads + h) * (int64_t)G * D;  /* [G, D]: heads h*G .. h*G+G-1 */
    float *out = a->out + (s * a->kv_heads + h) * (int64_t)G * D;
    float maxs[64];
    for (int g = 0; g < G; g++) maxs[g] = -INFINITY;
    for (int64_t start = 0; start < len; start += T) {
        const float *k = a->pool + table[start / T] * a->block_floats + a->head_floats * h;
        int n = len - start < T ? (int)(len - start) : T;
        for (int t = 0; t < n; t++) {
            const float *kt = k + (int64_t)t * D;
            for (int g = 0; g < G; g++) {
                const float *qg = q + g * D;
                float acc = 0.f;
#pragma omp simd reduction(+ : acc)
                for (int d = 0; d < D; d++) acc += qg[d] * kt[d];
                acc *= a->scale;
                scores[g * len + start + t] = acc;
                if (acc > maxs[g]) maxs[g] = acc;
            }
        }
    }
    for (int g = 0; g < G; g++) {
        float *sg = scores + g * len, m = maxs[g], sum = 0.f;
#pragma omp simd reduction(+ : sum)
        for (int64_t i = 0; i < len; i++) {
            float e = expf(sg[i] - m);
            sg[i] = e;
            sum += e;
        }
        float inv = 1.f / sum;
#pragma omp simd
        for (int64_t i = 0; i < len; i++) sg[i] *= inv;
        memset(out + g * D, 0, sizeof(float) * D);
    }
    for (int64_t start = 0; start < len; start += T) {
        const float *v = a->pool + table[start / T] * a->block_floats + a->kind_floats + a->head_floats * h;
        int n = len - start < T ? (int)(len - start) : T;
        for (int t = 0; t < n; t++) {
            const float *vt = v + (int64_t)t * D;
            for (int g = 0; g < G; g++) {
                float p = scores[g * len + start + t], *og = out + g * D;
#pragma omp simd
                for (int d = 0; d < D; d++) og[d] += p * vt[d];
            }
        }
    }
}

static PyObject *decode(PyObject *self, PyObject *args) {
    unsigned long long pool, q, out, tables, lens;
    long long num_blocks, table_width, seqs;
    int num_layers, kv_heads, block_tokens, head_dim, layer, num_heads;
    float scale;
    if (!PyArg_ParseTuple(args, "KLiiiiiKiKKLKLf:decode", &pool, &num_blocks, &num_layers, &kv_heads,
                          &block_tokens, &head_dim, &layer, &q, &num_heads, &out, &tables, &table_width,
                          &lens, &seqs, &scale))
        return NULL;
    if (kv_heads < 1 || num_heads % kv_heads || num_heads / kv_heads > 64 || head_dim < 1 || block_tokens < 1
        || layer < 0 || layer >= num_layers || seqs < 0 || table_width < 1) {
        PyErr_SetString(PyExc_ValueError, "decode: inconsistent shapes");
        return NULL;
    }
    Args a = {
        .pool = (const float *)(uintptr_t)pool, .num_blocks = num_blocks,
        .head_floats = (int64_t)block_tokens * head_dim,
        .block_tokens = block_tokens, .head_dim = head_dim, .kv_heads = kv_heads, .group = num_heads / kv_heads,
        .q = (const float *)(uintptr_t)q, .out = (float *)(uintptr_t)out,
        .tables = (const int32_t *)(uintptr_t)tables, .table_width = table_width,
        .lens = (const int64_t *)(uintptr_t)lens, .scale = scale,
    };
    a.kind_floats = a.head_floats * kv_heads;
    a.layer_floats = a.kind_floats * 2;
    a.block_floats = a.layer_floats * num_layers;
    a.pool += a.layer_floats * layer;
    int64_t longest = 0;
    for (int64_t s = 0; s < seqs; s++) {
        int64_t len = a.lens[s];
        if (len < 1 || len > table_width * block_tokens) {
            PyErr_Format(PyExc_ValueError, "decode: sequence %lld has %lld keys, its table holds 1 to %lld",
                         (long long)s, (long long)len, (long long)(table_width * block_tokens));
            return NULL;
        }
        for (int64_t b = 0; b < (len + block_tokens - 1) / block_tokens; b++) {
            int32_t id = a.tables[s * table_width + b];
            if (id < 0 || id >= num_blocks) {
                PyErr_Format(PyExc_ValueError, "decode: sequence %lld reads block %d of a pool of %lld",
                             (long long)s, id, (long long)num_blocks);
                return NULL;
            }
        }
        if (len > longest) longest = len;
    }
    int64_t items = seqs * kv_heads;
    int failed = 0;
#pragma omp parallel if (items > 1)
    {
        float *scores = malloc(sizeof(float) * a.group * (longest > 0 ? longest : 1));
        if (!scores) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < items; i++)
            if (scores) attend_one(&a, i / kv_heads, (int)(i % kv_heads), scores);
        free(scores);
    }
    if (failed) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS, "Decode attention over the paged pool (see the module's comment)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "compute_node._attention", NULL, -1, methods};

PyMODINIT_FUNC PyInit__attention(void) { return PyModule_Create(&module); }
