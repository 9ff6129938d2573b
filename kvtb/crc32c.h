/* crc32c (Castagnoli, reflected 0x82F63B78) for the C extensions: the one C copy of it.
 *
 * Included by hostmem/_dma.c (the copy engine folds it into its copy) and smartnic/_poller.c (the
 * descriptor check); kvtb/crc32c.py is the Python side (google_crc32c's library), and the tests hold
 * all three to the same values (tests/smartnic/test_poller.py, tests/hostmem/test_dma.py).
 *
 *   crc32c_init()                   once, at module init: the tables, and whether the CPU has SSE4.2
 *   crc32c_extend(crc, p, n)        crc32c of the bytes so far (crc) followed by p[0:n], like
 *                                   google_crc32c.extend: SSE4.2 where the CPU has it, else tables
 *   crc32c_software(crc, p, n)      the table routine alone (slicing-by-8)
 *   crc32c_hardware                 1 when crc32c_extend uses SSE4.2
 *
 * The SSE4.2 routine keeps three crc32 streams in flight over three lanes of CRC32C_LANE bytes and
 * combines them by shifting (as in Mark Adler's crc32c.c), so a large buffer checksums at about three
 * times one stream's rate.
 */
#ifndef KVTB_CRC32C_H
#define KVTB_CRC32C_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define CRC32C_POLY 0x82f63b78u
#define CRC32C_LANE 256 /* bytes per stream: three streams of CRC32C_LANE bytes at a time */

static uint32_t crc32c_table[8][256];
static uint32_t crc32c_lane_shift[4][256]; /* appends CRC32C_LANE zero bytes to a crc register */
static int crc32c_hardware;

static inline uint32_t crc32c_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* -- the operator for CRC32C_LANE zero bytes, built once over GF(2) */
static uint32_t crc32c_gf2_times(const uint32_t *mat, uint32_t vec)
{
    uint32_t sum = 0;
    for (; vec; vec >>= 1, mat++)
        if (vec & 1)
            sum ^= *mat;
    return sum;
}

static void crc32c_gf2_square(uint32_t *square, const uint32_t *mat)
{
    for (int n = 0; n < 32; n++)
        square[n] = crc32c_gf2_times(mat, mat[n]);
}

static void crc32c_build_lane_shift(void)
{
    uint32_t odd[32], even[32], row = 1;
    odd[0] = CRC32C_POLY; /* one zero bit */
    for (int n = 1; n < 32; n++, row <<= 1)
        odd[n] = row;
    crc32c_gf2_square(even, odd); /* two zero bits */
    crc32c_gf2_square(odd, even); /* four */
    crc32c_gf2_square(even, odd); /* one zero byte */
    for (size_t len = 1; len < CRC32C_LANE; len <<= 1) { /* CRC32C_LANE is a power of two */
        crc32c_gf2_square(odd, even);
        memcpy(even, odd, sizeof(odd));
    }
    for (uint32_t n = 0; n < 256; n++)
        for (int b = 0; b < 4; b++)
            crc32c_lane_shift[b][n] = crc32c_gf2_times(even, n << (8 * b));
}

static inline uint32_t crc32c_shift_lane(uint32_t c)
{
    return crc32c_lane_shift[0][c & 0xff] ^ crc32c_lane_shift[1][(c >> 8) & 0xff] ^
           crc32c_lane_shift[2][(c >> 16) & 0xff] ^ crc32c_lane_shift[3][c >> 24];
}

/* -- tables: slicing-by-8 */
static uint32_t crc32c_software(uint32_t crc, const uint8_t *p, size_t n)
{
    crc = ~crc;
    while (n && ((uintptr_t)p & 7)) {
        crc = (crc >> 8) ^ crc32c_table[0][(crc ^ *p++) & 0xFF];
        n--;
    }
    while (n >= 8) {
        uint32_t lo = crc32c_le32(p) ^ crc, hi = crc32c_le32(p + 4);
        crc = crc32c_table[7][lo & 0xFF] ^ crc32c_table[6][(lo >> 8) & 0xFF] ^ crc32c_table[5][(lo >> 16) & 0xFF] ^
              crc32c_table[4][lo >> 24] ^ crc32c_table[3][hi & 0xFF] ^ crc32c_table[2][(hi >> 8) & 0xFF] ^
              crc32c_table[1][(hi >> 16) & 0xFF] ^ crc32c_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = (crc >> 8) ^ crc32c_table[0][(crc ^ *p++) & 0xFF];
    return ~crc;
}

/* -- SSE4.2: three streams in flight */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define CRC32C_HAVE_SSE42 1
__attribute__((target("sse4.2"))) static uint32_t crc32c_sse42(uint32_t crc, const uint8_t *p, size_t n)
{
    uint64_t c0 = crc ^ 0xffffffffu;
    uint64_t a, b, d;
    while (n >= 3 * CRC32C_LANE) {
        uint64_t c1 = 0, c2 = 0;
        const uint8_t *end = p + CRC32C_LANE;
        do {
            memcpy(&a, p, 8);
            memcpy(&b, p + CRC32C_LANE, 8);
            memcpy(&d, p + 2 * CRC32C_LANE, 8);
            c0 = _mm_crc32_u64(c0, a);
            c1 = _mm_crc32_u64(c1, b);
            c2 = _mm_crc32_u64(c2, d);
            p += 8;
        } while (p < end);
        c0 = crc32c_shift_lane((uint32_t)c0) ^ (uint32_t)c1;
        c0 = crc32c_shift_lane((uint32_t)c0) ^ (uint32_t)c2;
        p += 2 * CRC32C_LANE;
        n -= 3 * CRC32C_LANE;
    }
    for (; n >= 8; p += 8, n -= 8) {
        memcpy(&a, p, 8);
        c0 = _mm_crc32_u64(c0, a);
    }
    for (; n; p++, n--)
        c0 = _mm_crc32_u8((uint32_t)c0, *p);
    return (uint32_t)c0 ^ 0xffffffffu;
}
#else
#define CRC32C_HAVE_SSE42 0
#endif

static void crc32c_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ CRC32C_POLY : c >> 1;
        crc32c_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc32c_table[t][i] = (crc32c_table[t - 1][i] >> 8) ^ crc32c_table[0][crc32c_table[t - 1][i] & 0xFF];
    crc32c_build_lane_shift();
#if CRC32C_HAVE_SSE42
    __builtin_cpu_init();
    crc32c_hardware = __builtin_cpu_supports("sse4.2") != 0;
#else
    crc32c_hardware = 0;
#endif
}

static uint32_t crc32c_extend(uint32_t crc, const uint8_t *p, size_t n)
{
#if CRC32C_HAVE_SSE42
    if (crc32c_hardware)
        return crc32c_sse42(crc, p, n);
#endif
    return crc32c_software(crc, p, n);
}

#endif /* KVTB_CRC32C_H */
