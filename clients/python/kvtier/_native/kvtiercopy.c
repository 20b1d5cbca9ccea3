/*
 * kvtiercopy: copy + CRC-32C (Castagnoli) in one pass, for kvtier's Python
 * clients (clients/python/kvtier/native.py loads it with ctypes).
 *
 * The engine's host pool and kvtier's slab are both plain memory; the
 * clients copy each page between them and, for Completion.sums (docs/
 * engine-api.md, "Page checksums"), need the page's CRC-32C. Summing while
 * copying reads the source once: the sum is free next to the copy's memory
 * traffic, where summing afterwards reads every page again.
 *
 * Build: cc -O2 -shared -fPIC -o libkvtiercopy.so kvtiercopy.c
 * (no -m flags: the AVX-512 and SSE 4.2 functions carry target attributes
 * and are picked at load time from what the CPU has). -DKVTIER_NO_X86
 * builds the portable code alone, as on other CPUs (for its tests).
 *
 * C API (stable; every function is thread-safe and reentrant, takes no
 * lock and keeps no state but the tables and the path chosen at load time):
 *
 *   uint32_t kvtier_crc32c(uint32_t crc, const void *p, size_t n);
 *       The CRC-32C of the bytes whose CRC-32C is crc followed by p[0:n],
 *       like Go's crc32.Update(crc, crc32.MakeTable(crc32.Castagnoli), p):
 *       kvtier_crc32c(0, p, n) is the CRC-32C of p; n may be 0.
 *
 *   uint32_t kvtier_copy_crc32c(uint32_t crc, void *dst, const void *src,
 *                               size_t n);
 *       Copies n bytes src -> dst (as memmove) and returns
 *       kvtier_crc32c(crc, src, n) of the bytes as they were in src, in one
 *       pass over src. Overlapping buffers are summed first, then moved.
 *
 *   uint32_t kvtier_copy_crc32c_nt(uint32_t crc, void *dst, const void *src,
 *                                  size_t n);
 *       kvtier_copy_crc32c with streaming (non-temporal) stores into dst,
 *       for copies into memory that is not read again soon (a page into
 *       the slab, which serve reads from another process later): dst's
 *       lines are not pulled into the cache and the stores are fenced
 *       (sfence) before it returns. Only the AVX-512 and SSE 4.2 paths
 *       stream (from dst's first 64- or 16-byte boundary; the head is
 *       stored as usual); short copies (< 1 KiB), overlapping buffers and the table
 *       path copy as kvtier_copy_crc32c does. Opt-in, not the default: on
 *       the AMD EPYC VM it was measured on, summing with streaming stores
 *       ran 0.75-0.9x of the ordinary stores (2.75 MiB pages, whole or in
 *       44 KiB pieces, into a 1 GiB destination), while a plain vectored
 *       copy (kvtier_copyv_crc32c_nt with group NULL) gained about 30%
 *       (docs/perf.md, "Native copy+CRC-32C for the Python clients").
 *
 *   void kvtier_copyv_crc32c(size_t npieces, void *const *dst,
 *                            const void *const *src, const uint64_t *len,
 *                            const uint32_t *group, uint32_t *sums);
 *       For each piece i in order: copies len[i] bytes src[i] -> dst[i] and,
 *       when group is not NULL, sets sums[group[i]] =
 *       kvtier_crc32c(sums[group[i]], src[i], len[i]). A page's payload
 *       split in several pieces (given in the order of its bytes) gets
 *       the CRC-32C of the whole payload when the caller zeroes sums
 *       first. group NULL: a plain vectored copy (sums unused, may be
 *       NULL). Pieces of length 0 are skipped.
 *
 *   void kvtier_copyv_crc32c_nt(...same arguments...);
 *       kvtier_copyv_crc32c with kvtier_copy_crc32c_nt's streaming stores
 *       (one fence at the end).
 *
 *   int kvtier_native_accel(void);
 *       The path in use: 2 AVX-512 VPCLMULQDQ folding (and the SSE 4.2
 *       CRC32 instruction for the short inputs and the tails), 1 SSE 4.2
 *       CRC32 instruction (three interleaved streams), 0 portable
 *       slicing-by-8 table.
 *
 *   int kvtier_native_set_accel(int level);
 *       Caps the path at level (0, 1 or 2; out-of-range values are
 *       clamped) within what the CPU has, and returns the path now in use.
 *       For tests and benchmarks, which run every path on one machine; it
 *       changes the path of every thread, so call it with no copy running.
 *       The environment variable KVTIER_NATIVE_ACCEL=0|1|2, read when the
 *       library is loaded, caps the path the same way.
 *
 * The folding is our Go assembly's (internal/crc32c/crc32c_amd64.s), in
 * intrinsics: four 64-byte accumulators folded 2048 bits ahead, then into
 * one 512 bits at a time, its four 128-bit lanes into one, and the last
 * 128 bits reduced with two CRC32 instructions. Inputs of 1 KiB or more
 * take it (foldMin in crc32c.go), their last len % 64 bytes by CRC32.
 */

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* -DKVTIER_NO_X86 builds the portable code alone on x86-64 (its tests). */
#if defined(__x86_64__) && !defined(KVTIER_NO_X86)
#define KVTIER_X86 1
#include <immintrin.h>
#endif

#define POLY 0x82f63b78u /* CRC-32C, reflected */
#define FOLD_MIN 1024

uint32_t kvtier_crc32c(uint32_t crc, const void *p, size_t n);
uint32_t kvtier_copy_crc32c(uint32_t crc, void *dst, const void *src, size_t n);
uint32_t kvtier_copy_crc32c_nt(uint32_t crc, void *dst, const void *src, size_t n);
void kvtier_copyv_crc32c(size_t npieces, void *const *dst, const void *const *src,
                         const uint64_t *len, const uint32_t *group, uint32_t *sums);
void kvtier_copyv_crc32c_nt(size_t npieces, void *const *dst, const void *const *src,
                            const uint64_t *len, const uint32_t *group, uint32_t *sums);
int kvtier_native_accel(void);
int kvtier_native_set_accel(int level);

/* ---- portable: slicing-by-8 table (raw state: no inversion) ---- */

static uint32_t tab[8][256];

static uint32_t table_update(uint32_t s, const unsigned char *p, size_t n) {
    while (n && ((uintptr_t)p & 7)) {
        s = tab[0][(s ^ *p++) & 0xff] ^ (s >> 8);
        n--;
    }
    while (n >= 8) {
        uint32_t a, b;
        memcpy(&a, p, 4);
        memcpy(&b, p + 4, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        a = __builtin_bswap32(a);
        b = __builtin_bswap32(b);
#endif
        a ^= s;
        s = tab[7][a & 0xff] ^ tab[6][(a >> 8) & 0xff] ^ tab[5][(a >> 16) & 0xff] ^
            tab[4][a >> 24] ^ tab[3][b & 0xff] ^ tab[2][(b >> 8) & 0xff] ^
            tab[1][(b >> 16) & 0xff] ^ tab[0][b >> 24];
        p += 8;
        n -= 8;
    }
    while (n--)
        s = tab[0][(s ^ *p++) & 0xff] ^ (s >> 8);
    return s;
}

/* ---- GF(2) helpers for combining the SSE path's streams (zlib's) ---- */

/* a*b mod P, polynomials in the reflected representation (x^0 is bit 31). */
static uint32_t multmodp(uint32_t a, uint32_t b) {
    uint32_t m = (uint32_t)1 << 31, p = 0;
    if (a == 0)
        return 0;
    for (;;) {
        if (a & m) {
            p ^= b;
            if ((a & (m - 1)) == 0)
                break;
        }
        m >>= 1;
        b = b & 1 ? (b >> 1) ^ POLY : b >> 1;
    }
    return p;
}

/* x^(8n) mod P. */
static uint32_t xpow8n(size_t n) {
    uint32_t sq = (uint32_t)1 << 23; /* x^8 */
    uint32_t p = (uint32_t)1 << 31;  /* 1 */
    while (n) {
        if (n & 1)
            p = multmodp(sq, p);
        sq = multmodp(sq, sq);
        n >>= 1;
    }
    return p;
}

/*
 * The SSE 4.2 path sums STREAM-byte blocks three at a time, one CRC32
 * dependency chain each (the instruction's latency is 3 cycles, its
 * throughput 1 a cycle), and combines them: for a raw state s and blocks
 * A, B, C of STREAM bytes, raw(s, ABC) = raw(s, A)*x^(16 STREAM) ^
 * raw(0, B)*x^(8 STREAM) ^ raw(0, C) mod P. The two multiplications by a
 * constant are 4 table lookups each (shift1, shift2).
 */
#define STREAM 4096
static uint32_t shift1[4][256], shift2[4][256];

static inline uint32_t shift_by(uint32_t t[4][256], uint32_t s) {
    return t[0][s & 0xff] ^ t[1][(s >> 8) & 0xff] ^ t[2][(s >> 16) & 0xff] ^ t[3][s >> 24];
}

/* ---- dispatch ---- */

static int hw_accel;       /* what the CPU has */
static int cur_accel;      /* the path in use */

__attribute__((constructor)) static void kvtier_native_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
        tab[0][i] = c;
    }
    for (int j = 1; j < 8; j++)
        for (int i = 0; i < 256; i++)
            tab[j][i] = tab[0][tab[j - 1][i] & 0xff] ^ (tab[j - 1][i] >> 8);
    uint32_t k1 = xpow8n(STREAM), k2 = xpow8n(2 * STREAM);
    for (int j = 0; j < 4; j++)
        for (uint32_t i = 0; i < 256; i++) {
            shift1[j][i] = multmodp(i << (8 * j), k1);
            shift2[j][i] = multmodp(i << (8 * j), k2);
        }

    int hw = 0;
#if defined(KVTIER_X86)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) {
        hw = 1;
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
            __builtin_cpu_supports("vpclmulqdq"))
            hw = 2;
    }
#endif
    hw_accel = hw;
    cur_accel = hw;
    const char *e = getenv("KVTIER_NATIVE_ACCEL");
    if (e != NULL && e[0] >= '0' && e[0] <= '2' && e[1] == '\0' && e[0] - '0' < hw)
        cur_accel = e[0] - '0';
}

int kvtier_native_accel(void) { return __atomic_load_n(&cur_accel, __ATOMIC_RELAXED); }

int kvtier_native_set_accel(int level) {
    if (level < 0)
        level = 0;
    if (level > hw_accel)
        level = hw_accel;
    __atomic_store_n(&cur_accel, level, __ATOMIC_RELAXED);
    return level;
}

#if defined(KVTIER_X86)

/* ---- SSE 4.2 ---- */

#define SSE42 __attribute__((target("sse4.2")))

SSE42 static uint32_t sse_one(uint32_t s, const unsigned char *p, size_t n) {
    uint64_t c = s;
    while (n && ((uintptr_t)p & 7)) {
        c = _mm_crc32_u8((uint32_t)c, *p++);
        n--;
    }
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = _mm_crc32_u64(c, v);
        p += 8;
        n -= 8;
    }
    while (n--)
        c = _mm_crc32_u8((uint32_t)c, *p++);
    return (uint32_t)c;
}

/* Raw state after p[0:3*STREAM]. */
SSE42 static uint32_t sse_three(uint32_t s, const unsigned char *p) {
    uint64_t a = s, b = 0, c = 0;
    const unsigned char *q = p + STREAM, *r = p + 2 * STREAM;
    for (size_t i = 0; i < STREAM; i += 8) {
        uint64_t x, y, z;
        memcpy(&x, p + i, 8);
        memcpy(&y, q + i, 8);
        memcpy(&z, r + i, 8);
        a = _mm_crc32_u64(a, x);
        b = _mm_crc32_u64(b, y);
        c = _mm_crc32_u64(c, z);
    }
    return shift_by(shift2, (uint32_t)a) ^ shift_by(shift1, (uint32_t)b) ^ (uint32_t)c;
}

SSE42 static uint32_t sse_update(uint32_t s, const unsigned char *p, size_t n) {
    while (n >= 3 * STREAM) {
        s = sse_three(s, p);
        p += 3 * STREAM;
        n -= 3 * STREAM;
    }
    return sse_one(s, p, n);
}

/* Streaming copy, dst 16-byte aligned, n a multiple of 16. */
SSE42 static void stream16(unsigned char *dst, const unsigned char *src, size_t n) {
    for (size_t i = 0; i < n; i += 16)
        _mm_stream_si128((__m128i *)(dst + i), _mm_loadu_si128((const __m128i *)(src + i)));
}

/*
 * Copy + sum with one pass over src: each 3*STREAM-byte block is summed
 * (which brings it into L1) and then copied from the cache.
 */
SSE42 static uint32_t sse_copy_update(uint32_t s, unsigned char *dst, const unsigned char *src,
                                      size_t n, int nt) {
    if (nt) {
        size_t head = (size_t)(-(uintptr_t)dst & 15);
        if (head > n)
            head = n;
        s = sse_one(s, src, head);
        memcpy(dst, src, head);
        dst += head, src += head, n -= head;
    }
    while (n >= 3 * STREAM) {
        s = sse_three(s, src);
        if (nt)
            stream16(dst, src, 3 * STREAM);
        else
            memcpy(dst, src, 3 * STREAM);
        dst += 3 * STREAM, src += 3 * STREAM, n -= 3 * STREAM;
    }
    s = sse_one(s, src, n);
    if (nt) {
        size_t m = n & ~(size_t)15;
        stream16(dst, src, m);
        memcpy(dst + m, src + m, n - m);
    } else {
        memcpy(dst, src, n);
    }
    return s;
}

/* ---- AVX-512 VPCLMULQDQ folding ---- */

#define AVX512 __attribute__((target("avx512f,avx512vl,vpclmulqdq,pclmul,sse4.2")))

/* k2048, k512, k128 of crc32c_amd64.s: (lo, hi) per 128-bit lane. */
#define K2048_LO 0xdcb17aa4ull
#define K2048_HI 0xb9e02b86ull
#define K512_LO 0x740eef02ull
#define K512_HI 0x9e4addf8ull
#define K128_LO 0xf20c0dfeull
#define K128_HI 0x14cd00bd6ull

/* a folded 512 bits (k) ahead onto b: clmul(a.lo, k.lo) ^ clmul(a.hi, k.hi) ^ b, per lane. */
AVX512 static inline __m512i fold512(__m512i a, __m512i k, __m512i b) {
    __m512i hi = _mm512_clmulepi64_epi128(a, k, 0x11);
    __m512i lo = _mm512_clmulepi64_epi128(a, k, 0x00);
    return _mm512_ternarylogic_epi64(lo, hi, b, 0x96);
}

AVX512 static inline __m128i fold128(__m128i a, __m128i k, __m128i b) {
    __m128i hi = _mm_clmulepi64_si128(a, k, 0x11);
    __m128i lo = _mm_clmulepi64_si128(a, k, 0x00);
    return _mm_ternarylogic_epi64(lo, hi, b, 0x96);
}

/*
 * The raw state after src[0:n] from raw state s; n >= 256, a multiple of
 * 64. STORE(i, v) stores the block at offset i into dst (or nothing).
 */
#define FOLD_BODY(STORE)                                                                \
    __m512i x1 = _mm512_loadu_si512(src), x2 = _mm512_loadu_si512(src + 64);            \
    __m512i x3 = _mm512_loadu_si512(src + 128), x4 = _mm512_loadu_si512(src + 192);     \
    STORE(0, x1);                                                                        \
    STORE(64, x2);                                                                       \
    STORE(128, x3);                                                                      \
    STORE(192, x4);                                                                      \
    x1 = _mm512_xor_si512(x1, _mm512_castsi128_si512(_mm_cvtsi32_si128((int)s)));       \
    size_t i = 256;                                                                      \
    __m512i k = _mm512_set4_epi64(K2048_HI, K2048_LO, K2048_HI, K2048_LO);               \
    for (; i + 256 <= n; i += 256) {                                                     \
        __m512i y1 = _mm512_loadu_si512(src + i), y2 = _mm512_loadu_si512(src + i + 64); \
        __m512i y3 = _mm512_loadu_si512(src + i + 128);                                  \
        __m512i y4 = _mm512_loadu_si512(src + i + 192);                                  \
        STORE(i, y1);                                                                    \
        STORE(i + 64, y2);                                                               \
        STORE(i + 128, y3);                                                              \
        STORE(i + 192, y4);                                                              \
        x1 = fold512(x1, k, y1);                                                         \
        x2 = fold512(x2, k, y2);                                                         \
        x3 = fold512(x3, k, y3);                                                         \
        x4 = fold512(x4, k, y4);                                                         \
    }                                                                                    \
    k = _mm512_set4_epi64(K512_HI, K512_LO, K512_HI, K512_LO);                           \
    x2 = fold512(x1, k, x2);                                                             \
    x3 = fold512(x2, k, x3);                                                             \
    x4 = fold512(x3, k, x4);                                                             \
    for (; i + 64 <= n; i += 64) {                                                       \
        __m512i y = _mm512_loadu_si512(src + i);                                         \
        STORE(i, y);                                                                     \
        x4 = fold512(x4, k, y);                                                          \
    }                                                                                    \
    __m128i k1 = _mm_set_epi64x((long long)K128_HI, (long long)K128_LO);                 \
    __m128i l = _mm512_castsi512_si128(x4);                                              \
    l = fold128(l, k1, _mm512_extracti32x4_epi32(x4, 1));                                \
    l = fold128(l, k1, _mm512_extracti32x4_epi32(x4, 2));                                \
    l = fold128(l, k1, _mm512_extracti32x4_epi32(x4, 3));                                \
    uint64_t c = _mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(l));                       \
    c = _mm_crc32_u64(c, (uint64_t)_mm_extract_epi64(l, 1));                             \
    return (uint32_t)c;

#define STORE_NONE(off, v) ((void)0)
#define STORE_U(off, v) _mm512_storeu_si512(dst + (off), (v))
#define STORE_NT(off, v) _mm512_stream_si512((void *)(dst + (off)), (v))

AVX512 static uint32_t fold_avx512(uint32_t s, const unsigned char *src, size_t n) {
    FOLD_BODY(STORE_NONE)
}

AVX512 static uint32_t copy_fold_avx512(uint32_t s, unsigned char *dst, const unsigned char *src,
                                        size_t n) {
    FOLD_BODY(STORE_U)
}

/* dst 64-byte aligned; the caller fences. */
AVX512 static uint32_t copy_fold_nt_avx512(uint32_t s, unsigned char *dst,
                                           const unsigned char *src, size_t n) {
    FOLD_BODY(STORE_NT)
}

static uint32_t avx_update(uint32_t s, const unsigned char *p, size_t n) {
    if (n >= FOLD_MIN) {
        size_t m = n & ~(size_t)63;
        s = fold_avx512(s, p, m);
        p += m;
        n -= m;
    }
    return sse_one(s, p, n);
}

static uint32_t avx_copy_update(uint32_t s, unsigned char *dst, const unsigned char *src, size_t n,
                                int nt) {
    if (nt) {
        size_t head = (size_t)(-(uintptr_t)dst & 63);
        if (n >= FOLD_MIN + head) {
            s = sse_one(s, src, head);
            memcpy(dst, src, head);
            dst += head, src += head, n -= head;
            size_t m = n & ~(size_t)63;
            s = copy_fold_nt_avx512(s, dst, src, m);
            dst += m, src += m, n -= m;
        }
    } else if (n >= FOLD_MIN) {
        size_t m = n & ~(size_t)63;
        s = copy_fold_avx512(s, dst, src, m);
        dst += m, src += m, n -= m;
    }
    s = sse_one(s, src, n);
    memcpy(dst, src, n);
    return s;
}

/* Streaming copy, dst 64-byte aligned, n a multiple of 64. */
AVX512 static void stream64(unsigned char *dst, const unsigned char *src, size_t n) {
    for (size_t i = 0; i < n; i += 64)
        _mm512_stream_si512((void *)(dst + i), _mm512_loadu_si512(src + i));
}

SSE42 static void sfence(void) { _mm_sfence(); }

#endif /* KVTIER_X86 */

/* ---- the API ---- */

static uint32_t raw_update(int accel, uint32_t s, const unsigned char *p, size_t n) {
#if defined(KVTIER_X86)
    if (accel == 2)
        return avx_update(s, p, n);
    if (accel == 1)
        return sse_update(s, p, n);
#else
    (void)accel;
#endif
    return table_update(s, p, n);
}

uint32_t kvtier_crc32c(uint32_t crc, const void *p, size_t n) {
    if (n == 0)
        return crc;
    return ~raw_update(kvtier_native_accel(), ~crc, p, n);
}

static int overlap(const void *a, const void *b, size_t n) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + n && y < x + n;
}

/* The table path's copy: sum a 16 KiB block (into the cache), copy it. */
static uint32_t table_copy_update(uint32_t s, unsigned char *dst, const unsigned char *src,
                                  size_t n) {
    while (n) {
        size_t m = n < 16384 ? n : 16384;
        s = table_update(s, src, m);
        memcpy(dst, src, m);
        dst += m, src += m, n -= m;
    }
    return s;
}

static uint32_t copy_update(uint32_t crc, void *dst, const void *src, size_t n, int nt) {
    if (n == 0)
        return crc;
    int accel = kvtier_native_accel();
    if (overlap(dst, src, n)) {
        /* NB: the sum first: the move overwrites part of src. */
        crc = ~raw_update(accel, ~crc, src, n);
        memmove(dst, src, n);
        return crc;
    }
#if defined(KVTIER_X86)
    if (accel == 2)
        return ~avx_copy_update(~crc, dst, src, n, nt);
    if (accel == 1)
        return ~sse_copy_update(~crc, dst, src, n, nt);
#else
    (void)nt;
#endif
    return ~table_copy_update(~crc, dst, src, n);
}

uint32_t kvtier_copy_crc32c(uint32_t crc, void *dst, const void *src, size_t n) {
    return copy_update(crc, dst, src, n, 0);
}

uint32_t kvtier_copy_crc32c_nt(uint32_t crc, void *dst, const void *src, size_t n) {
    crc = copy_update(crc, dst, src, n, 1);
#if defined(KVTIER_X86)
    if (kvtier_native_accel() >= 1)
        sfence();
#endif
    return crc;
}

/* A plain copy (no sum), streaming where the path can. */
static void nt_copy(void *dst, const void *src, size_t n) {
#if defined(KVTIER_X86)
    int accel = kvtier_native_accel();
    if (accel >= 1 && n >= FOLD_MIN && !overlap(dst, src, n)) {
        unsigned char *d = dst;
        const unsigned char *s = src;
        size_t a = accel == 2 ? 64 : 16;
        size_t head = (size_t)(-(uintptr_t)d & (a - 1));
        memcpy(d, s, head);
        d += head, s += head, n -= head;
        size_t m = n & ~(a - 1);
        if (accel == 2)
            stream64(d, s, m);
        else
            stream16(d, s, m);
        memcpy(d + m, s + m, n - m);
        return;
    }
#endif
    memmove(dst, src, n);
}

static void copyv(size_t npieces, void *const *dst, const void *const *src, const uint64_t *len,
                  const uint32_t *group, uint32_t *sums, int nt) {
    for (size_t i = 0; i < npieces; i++) {
        size_t n = (size_t)len[i];
        if (n == 0)
            continue;
        if (group == NULL) {
            if (nt)
                nt_copy(dst[i], src[i], n);
            else
                memmove(dst[i], src[i], n);
        } else {
            sums[group[i]] = copy_update(sums[group[i]], dst[i], src[i], n, nt);
        }
    }
}

void kvtier_copyv_crc32c(size_t npieces, void *const *dst, const void *const *src,
                         const uint64_t *len, const uint32_t *group, uint32_t *sums) {
    copyv(npieces, dst, src, len, group, sums, 0);
}

void kvtier_copyv_crc32c_nt(size_t npieces, void *const *dst, const void *const *src,
                            const uint64_t *len, const uint32_t *group, uint32_t *sums) {
    copyv(npieces, dst, src, len, group, sums, 1);
#if defined(KVTIER_X86)
    if (kvtier_native_accel() >= 1)
        sfence();
#endif
}
