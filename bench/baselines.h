/*
 * baselines.h — the loops bitexact is raced against in bench_norm.c:
 *   - a streaming-read ceiling: the integer sum of every 64-bit word loaded
 *     (the least work a pass over the data can do, so the fastest rate any
 *     reduction over that memory can reach);
 *   - the naive sums of squares: fp32 accumulators (what a vectorised
 *     framework kernel computes) and fp64 accumulators, both SIMD;
 *   - a plain read-modify-write scale loop (x *= c) for fp32 and bf16.
 *
 * The SIMD versions are compiled per function with target attributes, so
 * the shipped compiler flags stay generic; the caller picks them at run
 * time with __builtin_cpu_supports and falls back to the scalar versions.
 * Header-only, included by bench_norm.c alone (the Makefile builds every
 * bench/ *.c as its own program).
 */
#ifndef BX_BENCH_BASELINES_H
#define BX_BENCH_BASELINES_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define BENCH_X86 1
#endif

/* Element types of the benchmark data (fp16, bf16: uint16_t bit patterns). */
typedef enum bench_dtype { BT_F16, BT_BF16, BT_F32, BT_F64 } bench_dtype;

static size_t bench_dtype_size(bench_dtype dt) {
  return dt == BT_F64 ? 8 : dt == BT_F32 ? 4 : 2;
}

static float bf16_bits_to_float(uint16_t h) {
  uint32_t b = (uint32_t)h << 16;
  float f;
  memcpy(&f, &b, 4);
  return f;
}

static uint16_t float_to_bf16_bits(float f) { /* nearest even, finite f */
  uint32_t b;
  memcpy(&b, &f, 4);
  b += 0x7FFFu + ((b >> 16) & 1u);
  return (uint16_t)(b >> 16);
}

static float f16_bits_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu,
           m = h & 0x3FFu, b;
  if (e == 0) { /* zero or subnormal: m * 2^-24, exact in fp32 */
    float f = (float)m * 0x1p-24f;
    memcpy(&b, &f, 4);
    b |= sign;
  } else if (e == 31) {
    b = sign | 0x7F800000u | (m << 13);
  } else {
    b = sign | ((e + 112u) << 23) | (m << 13);
  }
  float f;
  memcpy(&f, &b, 4);
  return f;
}

/* ------------------------------------------------------- read ceiling */
typedef uint64_t (*read_fn)(const void *p, size_t bytes);

static uint64_t read_tail(const char *c, size_t i, size_t bytes, uint64_t s) {
  for (; i + 8 <= bytes; i += 8) {
    uint64_t w;
    memcpy(&w, c + i, 8);
    s += w;
  }
  for (; i < bytes; i++) s += (unsigned char)c[i];
  return s;
}

static uint64_t read_scalar(const void *p, size_t bytes) {
  const char *c = (const char *)p;
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  size_t i = 0;
  for (; i + 32 <= bytes; i += 32) {
    uint64_t w[4];
    memcpy(w, c + i, 32);
    s0 += w[0];
    s1 += w[1];
    s2 += w[2];
    s3 += w[3];
  }
  return read_tail(c, i, bytes, s0 + s1 + s2 + s3);
}

#ifdef BENCH_X86
__attribute__((target("avx2"))) static uint64_t read_avx2(const void *p,
                                                           size_t bytes) {
  const char *c = (const char *)p;
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 128 <= bytes; i += 128) {
    a0 = _mm256_add_epi64(a0, _mm256_loadu_si256((const __m256i *)(c + i)));
    a1 = _mm256_add_epi64(a1, _mm256_loadu_si256((const __m256i *)(c + i + 32)));
    a2 = _mm256_add_epi64(a2, _mm256_loadu_si256((const __m256i *)(c + i + 64)));
    a3 = _mm256_add_epi64(a3, _mm256_loadu_si256((const __m256i *)(c + i + 96)));
  }
  a0 = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
  uint64_t w[4];
  _mm256_storeu_si256((__m256i *)w, a0);
  return read_tail(c, i, bytes, w[0] + w[1] + w[2] + w[3]);
}

__attribute__((target("avx512f"))) static uint64_t read_avx512(const void *p,
                                                                size_t bytes) {
  const char *c = (const char *)p;
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 256 <= bytes; i += 256) {
    a0 = _mm512_add_epi64(a0, _mm512_loadu_si512((const void *)(c + i)));
    a1 = _mm512_add_epi64(a1, _mm512_loadu_si512((const void *)(c + i + 64)));
    a2 = _mm512_add_epi64(a2, _mm512_loadu_si512((const void *)(c + i + 128)));
    a3 = _mm512_add_epi64(a3, _mm512_loadu_si512((const void *)(c + i + 192)));
  }
  a0 = _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3));
  return read_tail(c, i, bytes, (uint64_t)_mm512_reduce_add_epi64(a0));
}
#endif

/* --------------------------------------------------- naive sums of squares
 * Each returns the sum of squares of x[0..n) (n elements); the fp32 ones
 * accumulate in fp32 and return that float widened. */
typedef double (*sumsq_fn)(const void *x, size_t n);

static float load_as_float(const void *x, size_t i, bench_dtype dt) {
  switch (dt) {
    case BT_F16: return f16_bits_to_float(((const uint16_t *)x)[i]);
    case BT_BF16: return bf16_bits_to_float(((const uint16_t *)x)[i]);
    case BT_F32: return ((const float *)x)[i];
    default: return (float)((const double *)x)[i];
  }
}

static float tail32(const void *x, size_t i, size_t n, bench_dtype dt, float s) {
  for (; i < n; i++) {
    float v = load_as_float(x, i, dt);
    s += v * v;
  }
  return s;
}

static double tail64(const void *x, size_t i, size_t n, bench_dtype dt, double s) {
  for (; i < n; i++) {
    double v = dt == BT_F64 ? ((const double *)x)[i] : (double)load_as_float(x, i, dt);
    s += v * v;
  }
  return s;
}

/* scalar fallbacks: 4 accumulators, as a compiler would unroll */
static double naive32_scalar(const void *x, size_t n, bench_dtype dt) {
  float s[4] = {0, 0, 0, 0};
  size_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int k = 0; k < 4; k++) {
      float v = load_as_float(x, i + (size_t)k, dt);
      s[k] += v * v;
    }
  return tail32(x, i, n, dt, (s[0] + s[1]) + (s[2] + s[3]));
}

static double naive64_scalar(const void *x, size_t n, bench_dtype dt) {
  double s[4] = {0, 0, 0, 0};
  size_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int k = 0; k < 4; k++) {
      size_t j = i + (size_t)k;
      double v = dt == BT_F64 ? ((const double *)x)[j] : (double)load_as_float(x, j, dt);
      s[k] += v * v;
    }
  return tail64(x, i, n, dt, (s[0] + s[1]) + (s[2] + s[3]));
}

static double naive32_f32_scalar(const void *x, size_t n) { return naive32_scalar(x, n, BT_F32); }
static double naive32_bf16_scalar(const void *x, size_t n) { return naive32_scalar(x, n, BT_BF16); }
static double naive32_f16_scalar(const void *x, size_t n) { return naive32_scalar(x, n, BT_F16); }
static double naive64_f32_scalar(const void *x, size_t n) { return naive64_scalar(x, n, BT_F32); }
static double naive64_bf16_scalar(const void *x, size_t n) { return naive64_scalar(x, n, BT_BF16); }
static double naive64_f16_scalar(const void *x, size_t n) { return naive64_scalar(x, n, BT_F16); }
static double naive64_f64_scalar(const void *x, size_t n) { return naive64_scalar(x, n, BT_F64); }

#ifdef BENCH_X86
#define AVX512_TARGET __attribute__((target("avx512f,fma")))

/* 16 elements of each dtype widened to fp32 */
AVX512_TARGET static inline __m512 load16_bf16(const uint16_t *p) {
  __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

AVX512_TARGET static inline __m512 load16_f16(const uint16_t *p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

/* fp32 accumulation: 4 x 16 lanes, fused multiply-add. */
#define NAIVE32_BODY(LOAD)                                                \
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;             \
  size_t i = 0;                                                           \
  for (; i + 64 <= n; i += 64) {                                          \
    __m512 v0 = LOAD(p + i), v1 = LOAD(p + i + 16);                       \
    __m512 v2 = LOAD(p + i + 32), v3 = LOAD(p + i + 48);                  \
    a0 = _mm512_fmadd_ps(v0, v0, a0);                                     \
    a1 = _mm512_fmadd_ps(v1, v1, a1);                                     \
    a2 = _mm512_fmadd_ps(v2, v2, a2);                                     \
    a3 = _mm512_fmadd_ps(v3, v3, a3);                                     \
  }                                                                       \
  a0 = _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3));

AVX512_TARGET static double naive32_f32_avx512(const void *x, size_t n) {
  const float *p = (const float *)x;
  NAIVE32_BODY(_mm512_loadu_ps)
  return tail32(x, i, n, BT_F32, _mm512_reduce_add_ps(a0));
}

AVX512_TARGET static double naive32_bf16_avx512(const void *x, size_t n) {
  const uint16_t *p = (const uint16_t *)x;
  NAIVE32_BODY(load16_bf16)
  return tail32(x, i, n, BT_BF16, _mm512_reduce_add_ps(a0));
}

AVX512_TARGET static double naive32_f16_avx512(const void *x, size_t n) {
  const uint16_t *p = (const uint16_t *)x;
  NAIVE32_BODY(load16_f16)
  return tail32(x, i, n, BT_F16, _mm512_reduce_add_ps(a0));
}

/* fp64 accumulation: each fp32 vector is widened to two fp64 vectors. */
#define NAIVE64_BODY(LOAD)                                                \
  __m512d a0 = _mm512_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;            \
  size_t i = 0;                                                           \
  for (; i + 32 <= n; i += 32) {                                          \
    __m512 v = LOAD(p + i), w = LOAD(p + i + 16);                         \
    __m512d d0 = _mm512_cvtps_pd(_mm512_castps512_ps256(v));              \
    __m512d d1 = _mm512_cvtps_pd(_mm256_castpd_ps(                        \
        _mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));                 \
    __m512d d2 = _mm512_cvtps_pd(_mm512_castps512_ps256(w));              \
    __m512d d3 = _mm512_cvtps_pd(_mm256_castpd_ps(                        \
        _mm512_extractf64x4_pd(_mm512_castps_pd(w), 1)));                 \
    a0 = _mm512_fmadd_pd(d0, d0, a0);                                     \
    a1 = _mm512_fmadd_pd(d1, d1, a1);                                     \
    a2 = _mm512_fmadd_pd(d2, d2, a2);                                     \
    a3 = _mm512_fmadd_pd(d3, d3, a3);                                     \
  }                                                                       \
  a0 = _mm512_add_pd(_mm512_add_pd(a0, a1), _mm512_add_pd(a2, a3));

AVX512_TARGET static double naive64_f32_avx512(const void *x, size_t n) {
  const float *p = (const float *)x;
  NAIVE64_BODY(_mm512_loadu_ps)
  return tail64(x, i, n, BT_F32, _mm512_reduce_add_pd(a0));
}

AVX512_TARGET static double naive64_bf16_avx512(const void *x, size_t n) {
  const uint16_t *p = (const uint16_t *)x;
  NAIVE64_BODY(load16_bf16)
  return tail64(x, i, n, BT_BF16, _mm512_reduce_add_pd(a0));
}

AVX512_TARGET static double naive64_f16_avx512(const void *x, size_t n) {
  const uint16_t *p = (const uint16_t *)x;
  NAIVE64_BODY(load16_f16)
  return tail64(x, i, n, BT_F16, _mm512_reduce_add_pd(a0));
}

AVX512_TARGET static double naive64_f64_avx512(const void *x, size_t n) {
  const double *p = (const double *)x;
  __m512d a0 = _mm512_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m512d v0 = _mm512_loadu_pd(p + i), v1 = _mm512_loadu_pd(p + i + 8);
    __m512d v2 = _mm512_loadu_pd(p + i + 16), v3 = _mm512_loadu_pd(p + i + 24);
    a0 = _mm512_fmadd_pd(v0, v0, a0);
    a1 = _mm512_fmadd_pd(v1, v1, a1);
    a2 = _mm512_fmadd_pd(v2, v2, a2);
    a3 = _mm512_fmadd_pd(v3, v3, a3);
  }
  a0 = _mm512_add_pd(_mm512_add_pd(a0, a1), _mm512_add_pd(a2, a3));
  return tail64(x, i, n, BT_F64, _mm512_reduce_add_pd(a0));
}
#endif /* BENCH_X86 */

/* ---------------------------------------------- read-modify-write scale
 * x[i] = x[i] * c in place, n elements: fp32 as fl32(x * c32); bf16 as
 * bf16(fl32(x * c32)) rounded to nearest even (torch's bf16 mul_ on CPU;
 * finite data assumed — a plain loop, not a careful one). */
typedef void (*scale_fn)(void *x, size_t n, float c);

static void rmw_f32_scalar(void *x, size_t n, float c) {
  float *p = (float *)x;
  for (size_t i = 0; i < n; i++) p[i] *= c;
}

static void rmw_bf16_scalar(void *x, size_t n, float c) {
  uint16_t *p = (uint16_t *)x;
  for (size_t i = 0; i < n; i++)
    p[i] = float_to_bf16_bits(bf16_bits_to_float(p[i]) * c);
}

#ifdef BENCH_X86
AVX512_TARGET static void rmw_f32_avx512(void *x, size_t n, float c) {
  float *p = (float *)x;
  __m512 vc = _mm512_set1_ps(c);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    _mm512_storeu_ps(p + i, _mm512_mul_ps(_mm512_loadu_ps(p + i), vc));
    _mm512_storeu_ps(p + i + 16, _mm512_mul_ps(_mm512_loadu_ps(p + i + 16), vc));
  }
  rmw_f32_scalar(p + i, n - i, c);
}

AVX512_TARGET static inline __m256i round_to_bf16(__m512 v) {
  __m512i b = _mm512_castps_si512(v);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  b = _mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(b, 16));
}

AVX512_TARGET static void rmw_bf16_avx512(void *x, size_t n, float c) {
  uint16_t *p = (uint16_t *)x;
  __m512 vc = _mm512_set1_ps(c);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m512 v0 = _mm512_mul_ps(load16_bf16(p + i), vc);
    __m512 v1 = _mm512_mul_ps(load16_bf16(p + i + 16), vc);
    _mm256_storeu_si256((__m256i *)(p + i), round_to_bf16(v0));
    _mm256_storeu_si256((__m256i *)(p + i + 16), round_to_bf16(v1));
  }
  rmw_bf16_scalar(p + i, n - i, c);
}
#endif /* BENCH_X86 */

/* ------------------------------------------------------ run-time choice */
static int bench_have_avx512(void) {
#ifdef BENCH_X86
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma");
#else
  return 0;
#endif
}

static inline int bench_have_avx2(void) {
#ifdef BENCH_X86
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2");
#else
  return 0;
#endif
}

static read_fn pick_read(const char **isa) {
#ifdef BENCH_X86
  if (bench_have_avx512()) { *isa = "avx512"; return read_avx512; }
  if (bench_have_avx2()) { *isa = "avx2"; return read_avx2; }
#endif
  *isa = "scalar";
  return read_scalar;
}

/* fp32-accumulated naive loop for dt (NULL for fp64 data: not meaningful). */
static sumsq_fn pick_naive32(bench_dtype dt, int simd) {
#ifdef BENCH_X86
  if (simd) {
    if (dt == BT_F32) return naive32_f32_avx512;
    if (dt == BT_BF16) return naive32_bf16_avx512;
    if (dt == BT_F16) return naive32_f16_avx512;
    return NULL;
  }
#else
  (void)simd;
#endif
  if (dt == BT_F32) return naive32_f32_scalar;
  if (dt == BT_BF16) return naive32_bf16_scalar;
  if (dt == BT_F16) return naive32_f16_scalar;
  return NULL;
}

static sumsq_fn pick_naive64(bench_dtype dt, int simd) {
#ifdef BENCH_X86
  if (simd) {
    if (dt == BT_F32) return naive64_f32_avx512;
    if (dt == BT_BF16) return naive64_bf16_avx512;
    if (dt == BT_F16) return naive64_f16_avx512;
    return naive64_f64_avx512;
  }
#else
  (void)simd;
#endif
  if (dt == BT_F32) return naive64_f32_scalar;
  if (dt == BT_BF16) return naive64_bf16_scalar;
  if (dt == BT_F16) return naive64_f16_scalar;
  return naive64_f64_scalar;
}

static scale_fn pick_rmw(bench_dtype dt, int simd) {
#ifdef BENCH_X86
  if (simd) return dt == BT_BF16 ? rmw_bf16_avx512 : rmw_f32_avx512;
#else
  (void)simd;
#endif
  return dt == BT_BF16 ? rmw_bf16_scalar : rmw_f32_scalar;
}

#endif /* BX_BENCH_BASELINES_H */
