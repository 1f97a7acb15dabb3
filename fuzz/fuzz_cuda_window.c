/*
 * fuzz_cuda_window.c — the CUDA kernels' exact arithmetic
 * (src/common/exact_window.h, src/common/cuda_finish.h) run on the CPU as a
 * simulated grid, against the MPFR reference.
 *
 * Input: byte 0 = dtype (bits 0-1), mode (bit 2: squares or |x|), an
 * offset of one element (bit 3: the element-wise path instead of 16-byte
 * vectors), tiling 2^k (bits 4-7: the element data repeated up to 2^15
 * times, so that whole chunks of BX_CU_CHUNK elements and the windows'
 * headroom are reached from a short input); the rest is raw element data.
 * The simulated words, rounded by the finishing code, must give MPFR's
 * value and sqrt, and the counters; squares by the fp64 grid and by the
 * integer windows must give the same words; any difference traps.
 */
#include "fuzz_common.h"

#include "exact_window.h"
#include "cuda_finish.h"

#define FZ_MAX_ELEMS (1u << 19)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
static void sim_kernel(const char *x, int dt, size_t n, int abs_mode, int int_squares,
                       int64_t *raw);

/* The reduction kernel's work on x[0..n), as a simulated grid, into raw
 * (BX_ACC_WORDS words: digits, NaN, Inf, count). int_squares: integer
 * windows for the squares of every dtype instead of the fp64 grid. */
static void sim_kernel(const char *x, int dt, size_t n, int abs_mode, int int_squares,
                       int64_t *raw) {
  size_t es = fz_dt_size[dt];
  memset(raw, 0, BX_ACC_WORDS * sizeof *raw);
  for (size_t start = 0; start < n; start += BX_CU_CHUNK) {
    uint32_t cn = (uint32_t)(n - start < BX_CU_CHUNK ? n - start : BX_CU_CHUNK);
    const char *c = x + start * es;
    static int64_t sdig[BX_CU_WARPS][BX_ACC_DIGITS];
    int64_t snan = 0, sinf = 0;
    memset(sdig, 0, sizeof sdig);
    for (uint32_t t = 0; t < BX_CU_BLOCK; t++) {
      bx_sink s = {sdig[t / 32], &snan, &sinf}; /* the kernel's per-warp copies */
      if (abs_mode) {
        bx_thread_sumabs(c, dt, cn, t, BX_CU_BLOCK, &s);
      } else if (!int_squares) {
        if (dt == 2) bx_thread_gridsq_f32((const uint32_t *)c, cn, t, BX_CU_BLOCK, &s);
        else if (dt == 1) bx_thread_gridsq_bf16((const uint16_t *)c, cn, t, BX_CU_BLOCK, &s);
        else if (dt == 0) bx_thread_gridsq_f16((const uint16_t *)c, cn, t, BX_CU_BLOCK, &s);
        else bx_thread_sumsq_f64((const uint64_t *)c, cn, t, BX_CU_BLOCK, &s);
      } else {
        if (dt == 2) bx_thread_sumsq_f32((const uint32_t *)c, cn, t, BX_CU_BLOCK, &s);
        else if (dt == 1) bx_thread_sumsq_bf16((const uint16_t *)c, cn, t, BX_CU_BLOCK, &s);
        else if (dt == 0) bx_thread_sumsq_f16((const uint16_t *)c, cn, t, BX_CU_BLOCK, &s);
        else bx_thread_sumsq_f64((const uint64_t *)c, cn, t, BX_CU_BLOCK, &s);
      }
    }
    for (int i = 0; i < BX_ACC_DIGITS; i++) {
      int64_t w = 0;
      for (int k = 0; k < BX_CU_WARPS; k++) w += sdig[k][i];
      bx_flush_word(raw, i, w);
    }
    raw[BX_ACC_DIGITS] += snan;
    raw[BX_ACC_DIGITS + 1] += sinf;
    raw[BX_ACC_DIGITS + 2] += cn;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  int dt = data[0] & 3, abs_mode = (data[0] >> 2) & 1, off = (data[0] >> 3) & 1;
  int rep_log = (data[0] >> 4) & 15;
  size_t es = fz_dt_size[dt], n0 = (size - 1) / es, rep = (size_t)1 << rep_log;
  if (n0 == 0) return 0;
  if (n0 * rep > FZ_MAX_ELEMS) rep = FZ_MAX_ELEMS / n0 ? FZ_MAX_ELEMS / n0 : 1;
  size_t n = n0 * rep;
  char *buf = aligned_alloc(64, ((n + 1) * es + 63) / 64 * 64);
  char *x = buf + (size_t)off * es;
  for (size_t r = 0; r < rep; r++) memcpy(x + r * n0 * es, data + 1, n0 * es);

  ref_sum want;
  ref_sum_init(&want);
  (abs_mode ? ref_add_abs : ref_add_squares)(&want, dt, data + 1, n0);
  mpfr_mul_ui(want.sum, want.sum, (unsigned long)rep, MPFR_RNDN); /* exact */
  double wv = ref_round_d(want.sum), ws = ref_sqrt_d(want.sum);
  if (ref_inexact_events) FZ_FAIL("the reference lost exactness");

  /* the reduction kernel: chunks, BX_CU_BLOCK threads each, block digits
   * flushed into the group's words; squares by both schemes (the fp64 grid
   * and the integer windows), which must give the same words */
  static int64_t raw[BX_ACC_WORDS], raw_int[BX_ACC_WORDS];
  sim_kernel(x, dt, n, abs_mode, 0, raw);
  if (!abs_mode) {
    sim_kernel(x, dt, n, 0, 1, raw_int);
    int64_t a[BX_ACC_DIGITS], b[BX_ACC_DIGITS];
    bx_digits_normalize(a, raw);
    bx_digits_normalize(b, raw_int);
    if (memcmp(a, b, sizeof a) != 0 || memcmp(raw + BX_ACC_DIGITS, raw_int + BX_ACC_DIGITS, 24))
      FZ_FAIL("the fp64 grid and the integer windows give different words");
  }
  /* the wire and finishing kernels */
  static int64_t wire[BX_AGREE_WORDS + BX_ACC_WORDS];
  int64_t items[BX_AGREE_ITEMS] = {0};
  bx_agree_fill(wire, items, -1, -1, -1, 0);
  bx_cu_wire_group(abs_mode ? BX_M_ABS : BX_M_SQ, abs_mode ? 1.0 : 2.0, raw, NULL,
                   wire + BX_AGREE_WORDS);
  const int64_t *w = wire + BX_AGREE_WORDS;
  if (w[BX_ACC_DIGITS] != want.nan_count * (int64_t)rep ||
      w[BX_ACC_DIGITS + 1] != want.inf_count * (int64_t)rep || w[BX_ACC_DIGITS + 2] != (int64_t)n)
    FZ_FAIL("counters nan %lld inf %lld count %lld", (long long)w[BX_ACC_DIGITS],
            (long long)w[BX_ACC_DIGITS + 1], (long long)w[BX_ACC_DIGITS + 2]);
  static bx_mag scratch;
  static int64_t total_digits[BX_ACC_DIGITS];
  bx_cu_finish_args fa = {abs_mode ? BX_M_ABS : BX_M_SQ, abs_mode ? 1.0 : 2.0, 0, 0, 0.0, 0.0, 0,
                          BX_DT_F64};
  double got = -1;
  int32_t st = bx_cu_finish(wire, 1, &fa, &scratch, total_digits, &got, NULL, NULL);
  if (st != BX_OK) FZ_FAIL("finish status %d", (int)st);
  if (!want.nan_count && !want.inf_count) fz_same_d(got, abs_mode ? wv : ws, "norm", "cuda-sim");
  else if (want.nan_count ? got == got : got != INFINITY) FZ_FAIL("non-finite norm %a", got);
  ref_sum_clear(&want);
  free(buf);
  return 0;
}
