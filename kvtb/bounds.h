/* Whether a strided run of items fits in a buffer, without overflow: the one C copy of the check.
 *
 * Included by smartnic/_poller.c (the trigger counters, the descriptors and token ids it checks) and
 * hostmem/_trigger.c (the records and counters a step writes). Every product and sum is checked, so
 * offsets and counts from a caller, however large, can never wrap past it into a write outside the
 * buffer. Include <Python.h> first (Py_ssize_t).
 *
 *   fits(len, first, stride, n, size)   n items of `size` bytes, the first at byte `first`, one every
 *                                       `stride` bytes: 1 when all of them lie in [0, len), else 0
 */
#ifndef KVTB_BOUNDS_H
#define KVTB_BOUNDS_H

static inline int fits(Py_ssize_t len, Py_ssize_t first, Py_ssize_t stride, Py_ssize_t n, Py_ssize_t size)
{
    if (first < 0 || stride < 0 || n < 0 || size < 0 || first > len)
        return 0;
    if (n == 0)
        return 1;
    Py_ssize_t last;
    if (__builtin_mul_overflow(n - 1, stride, &last) || __builtin_add_overflow(last, first, &last) ||
        __builtin_add_overflow(last, size, &last))
        return 0;
    return last <= len;
}

#endif
