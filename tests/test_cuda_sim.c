/*
 * test_cuda_sim.c — the CUDA kernels' exact arithmetic, run on the CPU.
 *
 * src/common/exact_window.h holds the per-thread loops of the GPU reduction
 * kernel (windows, slow path, block digits, the split flush into the group
 * digits). Here a simulated grid runs those same functions — BX_CU_BLOCK
 * "threads" per chunk of BX_CU_CHUNK elements, each with its own window —
 * and the resulting words must equal the CPU backend's, bit for bit, for
 * every dtype and mode and for data built to stress the windows (rebases,
 * elements below the window, full headroom, specials). The GPU run itself
 * (tests/cuda) checks the launch code on a device.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "kernels.h"
#include "tests.h"
#include "util.h"

#include "exact_window.h"

/* SIM_SQ: the kernel's default for squares (the fp64 grid for fp32, bf16
 * and fp16; integer windows for fp64); SIM_SQ_INT: integer windows for
 * every dtype (BX_CUDA_SQUARES=int). */
typedef enum sim_mode { SIM_SQ, SIM_ABS, SIM_MEGATRON, SIM_POW, SIM_SQ_INT } sim_mode;

/* The reduction kernel's work on one tensor, as the GPU schedules it (any
 * schedule gives the same words: that is what is being tested). */
static void sim_reduce(const void *x, int dt, size_t n, sim_mode m, double p, bx_acc *out) {
  int64_t gdig[BX_ACC_DIGITS] = {0}, gnan = 0, ginf = 0;
  size_t es = bx_dtype_size((bx_dtype)dt);
  for (size_t start = 0; start < n; start += BX_CU_CHUNK) {
    uint32_t cn = (uint32_t)(n - start < BX_CU_CHUNK ? n - start : BX_CU_CHUNK);
    const void *c = (const char *)x + start * es;
    int64_t sdig[BX_CU_WARPS][BX_ACC_DIGITS] = {{0}}, snan = 0, sinf = 0;
    for (uint32_t t = 0; t < BX_CU_BLOCK; t++) {
      bx_sink s = {sdig[t / 32], &snan, &sinf}; /* the kernel's per-warp copies */
      switch (m) {
        case SIM_SQ:
          if (dt == BX_DT_F32) bx_thread_gridsq_f32(c, cn, t, BX_CU_BLOCK, &s);
          else if (dt == BX_DT_BF16) bx_thread_gridsq_bf16(c, cn, t, BX_CU_BLOCK, &s);
          else if (dt == BX_DT_F16) bx_thread_gridsq_f16(c, cn, t, BX_CU_BLOCK, &s);
          else bx_thread_sumsq_f64(c, cn, t, BX_CU_BLOCK, &s);
          break;
        case SIM_SQ_INT:
          if (dt == BX_DT_F32) bx_thread_sumsq_f32(c, cn, t, BX_CU_BLOCK, &s);
          else if (dt == BX_DT_BF16) bx_thread_sumsq_bf16(c, cn, t, BX_CU_BLOCK, &s);
          else if (dt == BX_DT_F16) bx_thread_sumsq_f16(c, cn, t, BX_CU_BLOCK, &s);
          else bx_thread_sumsq_f64(c, cn, t, BX_CU_BLOCK, &s);
          break;
        case SIM_ABS:
          bx_thread_sumabs(c, dt, cn, t, BX_CU_BLOCK, &s);
          break;
        case SIM_MEGATRON: bx_thread_megatron(c, dt, cn, t, BX_CU_BLOCK, &s); break;
        case SIM_POW: bx_thread_pow(c, dt, cn, t, BX_CU_BLOCK, p, &s); break;
      }
    }
    for (int i = 0; i < BX_ACC_DIGITS; i++) {
      int64_t w = 0;
      for (int k = 0; k < BX_CU_WARPS; k++) w += sdig[k][i];
      bx_flush_word(gdig, i, w);
    }
    gnan += snan;
    ginf += sinf;
  }
  bx_acc_init(out);
  memcpy(out->digit, gdig, sizeof gdig);
  out->nan_count = gnan;
  out->inf_count = ginf;
  out->count = (int64_t)n;
  bx_acc_normalize(out);
}

/* The CPU backend's accumulator for the same tensor and mode. */
/* The CPU backend's accumulator for elements [skip, n) of x and a mode. */
static void cpu_reduce(const bxt_tensor *x, size_t skip, sim_mode m, double p, bx_acc *out) {
  size_t es = bxt_dt_size(x->dt), n = x->n - skip;
  const char *data = (const char *)x->buf + skip * es;
  int64_t shape = (int64_t)n;
  DLTensor view = x->t;
  view.data = (void *)data;
  view.byte_offset = 0;
  view.ndim = 1;
  view.shape = &shape;
  view.strides = NULL;
  bx_acc_init(out);
  switch (m) {
    case SIM_SQ:
    case SIM_SQ_INT: bx_acc_add_squares(out, &view); break;
    case SIM_ABS: bx_acc_add_abs(out, &view); break;
    case SIM_MEGATRON:
      bx_sum_megatron_sq(data, (bx_dtype)x->dt, n, out);
      out->count = (int64_t)n; /* the megatron kernel counts its fp32 squares */
      break;
    case SIM_POW:
      for (size_t off = 0; off < n; off += BX_CHUNK) {
        size_t k = n - off < BX_CHUNK ? n - off : BX_CHUNK;
        bx_sum_pow(data + off * es, (bx_dtype)x->dt, k, p, out);
      }
      break;
  }
  bx_acc_normalize(out);
}

static const char *mode_name(sim_mode m) {
  return m == SIM_SQ ? "squares" : m == SIM_SQ_INT ? "squares (integer windows)"
         : m == SIM_ABS ? "abs" : m == SIM_MEGATRON ? "megatron" : "pow";
}

static int same_words(const bx_acc *a, const bx_acc *b) { return memcmp(a, b, sizeof *a) == 0; }

/* Simulated GPU against the CPU on x, and on x from its second element
 * (a chunk not aligned to 16 bytes: the kernels' element-wise path). */
static void compare_from(const bxt_tensor *x, size_t skip, sim_mode m, double p,
                         const char *what) {
  bx_acc gpu, cpu;
  if (skip > x->n) return;
  size_t es = bxt_dt_size(x->dt);
  sim_reduce((const char *)x->buf + skip * es, x->dt, x->n - skip, m, p, &gpu);
  cpu_reduce(x, skip, m, p, &cpu);
  if (m == SIM_MEGATRON) cpu.count = gpu.count; /* see cpu_reduce */
  int first = -1;
  for (int i = 0; i < BX_ACC_WORDS; i++)
    if (((int64_t *)&gpu)[i] != ((int64_t *)&cpu)[i]) {
      first = i;
      break;
    }
  CHECK(same_words(&gpu, &cpu), "%s %s n=%zu from %zu, %s: simulated GPU words differ from "
        "the CPU's (first at word %d: %lld vs %lld)", bxt_dt_name(x->dt), mode_name(m), x->n,
        skip, what,
        first, first >= 0 ? (long long)((int64_t *)&gpu)[first] : 0LL,
        first >= 0 ? (long long)((int64_t *)&cpu)[first] : 0LL);
}

static void compare(const bxt_tensor *x, sim_mode m, double p, const char *what) {
  compare_from(x, 0, m, p, what);
  compare_from(x, 1, m, p, what);
}

static void compare_sq(const bxt_tensor *x, const char *what) {
  compare(x, SIM_SQ, 2.0, what);
  compare(x, SIM_SQ_INT, 2.0, what);
}

static const size_t SIZES[] = {0, 1, 7, 255, 256, 257, 4099, BX_CU_CHUNK - 1, BX_CU_CHUNK,
                               BX_CU_CHUNK + 3, 3 * BX_CU_CHUNK + 1000};
#define NSIZES (sizeof SIZES / sizeof SIZES[0])

static void random_sets(sim_mode m, double p) {
  bxt_rng r;
  bxt_rng_init(&r);
  for (int dt = 0; dt < 4; dt++)
    for (size_t k = 0; k < NSIZES && bxt_failures() < 5; k++)
      for (int fill = 0; fill < 4; fill++) {
        bxt_tensor x;
        bxt_tensor_alloc(&x, dt, SIZES[k]);
        const char *what = "gradient";
        if (fill == 0) bxt_fill_gradient(&r, &x, 1e-3);
        else if (fill == 1) { bxt_fill_wide(&r, &x); what = "wide"; }
        else if (fill == 2) { bxt_fill_bits(&r, &x, 1); what = "random bits with NaN/Inf"; }
        else { bxt_fill_mixed(&r, &x); what = "mixed"; }
        compare(&x, m, p, what);
        bxt_tensor_free(&x);
      }
}

void test_cuda_sim_squares(void) {
  random_sets(SIM_SQ, 2.0);
  random_sets(SIM_SQ_INT, 2.0);
}
void test_cuda_sim_abs(void) { random_sets(SIM_ABS, 1.0); }
void test_cuda_sim_megatron(void) { random_sets(SIM_MEGATRON, 2.0); }
void test_cuda_sim_pow(void) { random_sets(SIM_POW, 3.0); }

/* Data made to stress the windows. */
void test_cuda_sim_adversarial(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  static const size_t NS[] = {2 * BX_CU_CHUNK + 77, BX_CU_CHUNK - 1};
  for (int run = 0; run < 8; run++) {
    const int dt = run % 4;
    const size_t n = NS[run / 4];
    const size_t vec = 16 / bxt_dt_size(dt); /* elements per 16-byte load */
    bxt_tensor x;
    bxt_tensor_alloc(&x, dt, n);
    /* 1: the largest finite value everywhere: each thread fills its window's
     * headroom (2^8 maximal squares at one position) */
    uint64_t maxbits = dt == BX_DT_F16 ? 0x7BFF : dt == BX_DT_BF16 ? 0x7F7F
                       : dt == BX_DT_F32 ? 0x7F7FFFFF : 0x7FEFFFFFFFFFFFFFull;
    for (size_t i = 0; i < n; i++) bxt_set_bits(&x, i, maxbits);
    compare_sq(&x, "all max");
    compare(&x, SIM_ABS, 1, "all max");
    /* 2: largest significand at every exponent, each thread climbing: a
     * rebase at almost every element */
    int emax = dt == BX_DT_F16 ? 30 : dt == BX_DT_F64 ? 2046 : 254;
    int mbits = dt == BX_DT_F16 ? 10 : dt == BX_DT_BF16 ? 7 : dt == BX_DT_F32 ? 23 : 52;
    for (size_t i = 0; i < n; i++) {
      uint64_t e = (uint64_t)((i / BX_CU_BLOCK) % (size_t)(emax + 1));
      bxt_set_bits(&x, i, (e << mbits) | ((1ull << mbits) - 1));
    }
    compare_sq(&x, "climbing exponents");
    compare(&x, SIM_ABS, 1, "climbing exponents");
    /* 3: falling exponents: everything after the first lands below the window */
    for (size_t i = 0; i < n; i++) {
      uint64_t e = (uint64_t)emax - (uint64_t)((i / BX_CU_BLOCK) % (size_t)(emax + 1));
      bxt_set_bits(&x, i, (e << mbits) | (bxt_next(&r) & ((1ull << mbits) - 1)));
    }
    compare_sq(&x, "falling exponents");
    compare(&x, SIM_ABS, 1, "falling exponents");
    /* 4: subnormals and zeros only, signs random */
    for (size_t i = 0; i < n; i++) {
      uint64_t sign = (bxt_next(&r) & 1) << (dt == BX_DT_F64 ? 63 : dt == BX_DT_F32 ? 31 : 15);
      uint64_t frac = i % 3 ? (bxt_next(&r) & ((1ull << mbits) - 1)) : 0;
      bxt_set_bits(&x, i, sign | frac);
    }
    compare_sq(&x, "subnormals and zeros");
    compare(&x, SIM_ABS, 1, "subnormals and zeros");
    compare(&x, SIM_MEGATRON, 2, "subnormals and zeros");
    /* 5: each thread's first element (the first of its first 16-byte
     * vector) places its window; all its others sit at the window's top with
     * the largest significand: the full headroom (with n = CHUNK - 1, thread
     * 0 also takes a tail element: 2^8 + 1 adds) */
    int up = dt == BX_DT_F16 ? (BX_SQ_F16_SMAX - BX_SQ_F16_LOW) / 2
             : dt == BX_DT_BF16 ? (BX_SQ_BF16_SMAX - BX_SQ_BF16_LOW) / 2
             : dt == BX_DT_F32 ? (BX_SQ_F32_SMAX - BX_SQ_F32_LOW) / 2
                               : (BX_SQ_F64_SMAX - BX_SQ_F64_LOW) / 2;
    for (size_t i = 0; i < n; i++) {
      int first = (i % BX_CU_CHUNK) < vec * BX_CU_BLOCK && i % vec == 0;
      uint64_t e = (uint64_t)(emax / 2) + (first ? 0 : (uint64_t)up);
      bxt_set_bits(&x, i, (e << mbits) | ((1ull << mbits) - 1));
    }
    compare_sq(&x, "full window headroom");
    int upa = (BX_ABS_SMAX - BX_ABS_LOW);
    for (size_t i = 0; i < n; i++) {
      uint64_t e = (uint64_t)(emax / 2) + ((i % BX_CU_CHUNK) < BX_CU_BLOCK ? 0 : (uint64_t)upa);
      /* (|x| loops are element-wise: thread t's first element is t) */
      bxt_set_bits(&x, i, (e << mbits) | ((1ull << mbits) - 1));
    }
    compare(&x, SIM_ABS, 1, "full window headroom");
    /* 5b: the same for the fp64 grid (fp32/bf16/fp16): each thread's first
     * square places the window 2^13 above itself, the others sit just below
     * the window's top (sqrt(2) * 2^7 times the first element) */
    if (dt != BX_DT_F64) {
      uint64_t sqrt2 = dt == BX_DT_F32 ? 0x3504F3 : dt == BX_DT_BF16 ? 0x35 : 0x1A8;
      for (size_t i = 0; i < n; i++) {
        int first = (i % BX_CU_CHUNK) < vec * BX_CU_BLOCK && i % vec == 0;
        uint64_t e = (uint64_t)(emax / 2) + (first ? 0 : 7);
        bxt_set_bits(&x, i, (e << mbits) | (first ? ((1ull << mbits) - 1) : sqrt2));
      }
      compare(&x, SIM_SQ, 2, "fp64 grid: squares at the window's top");
    }
    /* 6: a tiny first element per thread, then gradient-like values */
    bxt_fill_gradient(&r, &x, 1.0);
    for (size_t i = 0; i < BX_CU_BLOCK && i < n; i++) bxt_set_bits(&x, i, 1);
    compare_sq(&x, "tiny first elements");
    bxt_tensor_free(&x);
  }
}

/* Without a usable GPU (no CUDA backend built in, or no device: CI), CUDA
 * tensors are refused with BX_EDEVICE and a message that says why, mixed
 * host/CUDA calls name the odd tensor, and nothing is written. */
bx_status bx_cuda_available(void); /* bitexact_cuda.h, which needs CUDA's headers */

void test_cuda_refused_without_device(void) {
  if (bx_cuda_available() == BX_OK) {
    bxt_skip("a CUDA device is present: tests/cuda covers CUDA tensors");
    return;
  }
  CHECK(strlen(bx_last_error()) > 0, "bx_cuda_available says why");
  bxt_tensor h;
  bxt_tensor_alloc(&h, REF_F32, 4);
  for (size_t i = 0; i < 4; i++) bxt_set(&h, i, 3.0);
  int64_t shape = 4;
  DLTensor d = {0};
  d.data = (void *)(uintptr_t)0x10000; /* never dereferenced: refused first */
  d.device.device_type = kDLCUDA;
  d.ndim = 1;
  d.shape = &shape;
  d.dtype = bxt_dl_dtype(REF_F32);
  double norm = -1.0, coef = -1.0;
  bx_group g1 = {&d, 1};
  CHECK_STATUS(bx_total_norm(&g1, 1, NULL, NULL, &norm, NULL), BX_EDEVICE, "CUDA tensor");
  CHECK(strstr(bx_last_error(), "CUDA") != NULL, "message: %s", bx_last_error());
  DLTensor mixed[2] = {h.t, d};
  bx_group g2 = {mixed, 2};
  CHECK_STATUS(bx_total_norm(&g2, 1, NULL, NULL, &norm, NULL), BX_EDEVICE, "mixed devices");
  CHECK(strstr(bx_last_error(), "group 0, tensor 1") != NULL, "names the odd tensor: %s",
        bx_last_error());
  CHECK_STATUS(bx_clip_grad_norm(&g2, 1, NULL, 1e-3, NULL, &norm, &coef), BX_EDEVICE,
               "mixed clip");
  CHECK_STATUS(bx_clip_grad_norm(&g1, 1, NULL, 1e-3, NULL, &norm, &coef), BX_EDEVICE, "CUDA clip");
  CHECK_STATUS(bx_scale(mixed, 2, 0.5, NULL), BX_EDEVICE, "mixed scale");
  CHECK_STATUS(bx_scale(&d, 1, 0.5, NULL), BX_EDEVICE, "CUDA scale");
  CHECK(norm == -1.0 && coef == -1.0, "outputs untouched");
  for (size_t i = 0; i < 4; i++) CHECK(bxt_get(&h, i) == 3.0, "host tensor untouched at %zu", i);
  bxt_tensor_free(&h);
}

/* ---- the end of a GPU norm (src/common/cuda_finish.h) on the CPU ----------------
 * Raw words as the reduction kernel leaves them (simulated above), the wire
 * words, a simulated all-reduce over ranks, and the finish: the total, the
 * group norms and the coefficient must be bx_total_norm's and bx_clip_coef's
 * bits; the norm rounded into fp32/bf16/fp16 must be the exact value's
 * correct rounding (MPFR); broken agreement words give the right status. */
#include "cuda_finish.h"
#include "collective.h"

/* The p = 0 / ±inf raw words of one tensor, as the kernel builds them. */
static void sim_extremes(const void *x, int dt, size_t n, uint64_t ext[BX_CU_EXT_WORDS]) {
  size_t es = bx_dtype_size((bx_dtype)dt);
  for (size_t start = 0; start < n; start += BX_CU_CHUNK) {
    uint32_t cn = (uint32_t)(n - start < BX_CU_CHUNK ? n - start : BX_CU_CHUNK);
    uint64_t smax = 0, smin = BX_F64_INF_BITS, snz = 0, snan = 0;
    for (uint32_t t = 0; t < BX_CU_BLOCK; t++) {
      bx_extremes r = {0, BX_F64_INF_BITS, 0, 0};
      bx_thread_extremes((const char *)x + start * es, dt, cn, t, BX_CU_BLOCK, &r);
      if (r.maxbits > smax) smax = r.maxbits;
      if (r.minbits < smin) smin = r.minbits;
      snz += (uint64_t)r.nonzero;
      snan += (uint64_t)r.nan;
    }
    if (smax > ext[0]) ext[0] = smax;
    if (smin != BX_F64_INF_BITS && ~smin > ext[1]) ext[1] = ~smin;
    ext[2] += snz;
    ext[3] += snan;
  }
}

typedef struct finish_case {
  const char *name;
  int mode;
  double p;
  bx_norm_flavor flavor;
} finish_case;

static const finish_case FINISH_CASES[] = {
    {"p=2", BX_M_SQ, 2.0, BX_EXACT},         {"p=1", BX_M_ABS, 1.0, BX_EXACT},
    {"p=0", BX_M_EXT, 0.0, BX_EXACT},        {"p=inf", BX_M_EXT, INFINITY, BX_EXACT},
    {"p=-inf", BX_M_EXT, -INFINITY, BX_EXACT}, {"megatron", BX_M_MEGATRON, 2.0, BX_MEGATRON_FP32},
    {"p=3", BX_M_POW, 3.0, BX_EXACT},
};

#define FIN_GROUPS 3
#define FIN_RANKS 2

/* Every rank's wire for its share (rank r owns elements i % FIN_RANKS == r
 * of each group, as separate tensors), summed (or MAXed) word by word. */
static void sim_wire(const finish_case *c, bxt_tensor parts[FIN_RANKS][FIN_GROUPS], size_t ww,
                     int64_t *wire) {
  size_t nw = BX_AGREE_WORDS + FIN_GROUPS * ww;
  int64_t *mine = calloc(nw, sizeof *mine);
  for (int r = 0; r < FIN_RANKS; r++) {
    int64_t items[BX_AGREE_ITEMS] = {BX_ACC_VERSION_TAG, BX_CALL_CLIP, FIN_GROUPS, 7, 0, 0, 0, 11, 0, 0, 13};
    bx_agree_fill(mine, items, -1, -1, -1, 1u << (r == 0 ? BX_DT_F32 : BX_DT_BF16));
    for (int g = 0; g < FIN_GROUPS; g++) {
      const bxt_tensor *x = &parts[r][g];
      int64_t raw[BX_ACC_WORDS] = {0};
      uint64_t ext[BX_CU_EXT_WORDS] = {0};
      if (c->mode == BX_M_EXT) {
        sim_extremes(x->buf, x->dt, x->n, ext);
      } else {
        bx_acc acc;
        sim_reduce(x->buf, x->dt, x->n,
                   c->mode == BX_M_SQ ? SIM_SQ : c->mode == BX_M_ABS ? SIM_ABS
                   : c->mode == BX_M_MEGATRON ? SIM_MEGATRON : SIM_POW, c->p, &acc);
        memcpy(raw, &acc, BX_ACC_DIGITS * sizeof(int64_t) + 3 * sizeof(int64_t));
      }
      bx_cu_wire_group(c->mode, c->p, raw, ext, mine + BX_AGREE_WORDS + g * ww);
    }
    /* the all-reduce: agreement words by MAX, the norm words by SUM (MAX
     * for p = ±inf) */
    int max_words = c->mode == BX_M_EXT && c->p != 0.0;
    for (size_t i = 0; i < nw; i++) {
      int by_max = i < BX_AGREE_WORDS || max_words;
      if (r == 0) wire[i] = mine[i];
      else if (by_max) wire[i] = mine[i] > wire[i] ? mine[i] : wire[i];
      else wire[i] += mine[i];
    }
  }
  free(mine);
}

void test_cuda_sim_finish(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  const int dts[FIN_GROUPS] = {REF_F32, REF_BF16, REF_F64};
  const size_t ns[FIN_GROUPS] = {3 * BX_CU_CHUNK + 5, 999, 70001};
  for (int set = 0; set < 4 && bxt_failures() < 5; set++) {
    bxt_tensor whole[FIN_GROUPS], parts[FIN_RANKS][FIN_GROUPS];
    for (int g = 0; g < FIN_GROUPS; g++) {
      bxt_tensor_alloc(&whole[g], dts[g], ns[g]);
      if (set == 0) bxt_fill_gradient(&r, &whole[g], 1e-2);
      else if (set == 1) bxt_fill_wide(&r, &whole[g]);
      else bxt_fill_mixed(&r, &whole[g]);
      if (set == 3 && g == 1) bxt_set(&whole[g], 17, INFINITY); /* an Inf */
      for (int k = 0; k < FIN_RANKS; k++) {
        size_t cnt = (ns[g] + FIN_RANKS - 1 - (size_t)k) / FIN_RANKS;
        bxt_tensor_alloc(&parts[k][g], dts[g], cnt);
        for (size_t i = 0; i < cnt; i++)
          bxt_set_bits(&parts[k][g], i, bxt_get_bits(&whole[g], i * FIN_RANKS + (size_t)k));
      }
    }
    DLTensor views[FIN_GROUPS];
    bx_group groups[FIN_GROUPS];
    for (int g = 0; g < FIN_GROUPS; g++) {
      views[g] = whole[g].t;
      groups[g] = (bx_group){&views[g], 1};
    }
    for (size_t k = 0; k < sizeof FINISH_CASES / sizeof FINISH_CASES[0]; k++) {
      const finish_case *c = &FINISH_CASES[k];
      size_t ww = c->mode == BX_M_EXT ? 2 : BX_ACC_WORDS;
      int64_t *wire = calloc(BX_AGREE_WORDS + FIN_GROUPS * ww, sizeof *wire);
      sim_wire(c, parts, ww, wire);
      bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
      o.norm_type = c->p;
      o.flavor = c->flavor;
      double cpu_total, cpu_groups[FIN_GROUPS];
      CHECK_STATUS(bx_total_norm(groups, FIN_GROUPS, NULL, &o, &cpu_total, cpu_groups), BX_OK,
                   "CPU norm");
      static bx_mag scratch;
      int64_t total_digits[BX_ACC_DIGITS];
      /* clipping, no clipping, disabled, and a coefficient just above 1
       * (clamped) */
      const double MAX_NORMS[4] = {0.5, 1e30, 0.0, cpu_total * 1.25};
      for (int fm = 0; fm < 8; fm++) {
        int formula = fm % 2;
        double max_norm = MAX_NORMS[fm / 2];
        if (!(max_norm >= 0)) continue;
        bx_cu_finish_args a = {c->mode, c->p, 0, 1, max_norm, 1e-6, formula, BX_DT_F64};
        double total = -1, gn[FIN_GROUPS], coef = -1;
        int32_t st = bx_cu_finish(wire, FIN_GROUPS, &a, &scratch, total_digits, &total, gn, &coef);
        CHECK(st == BX_OK, "set %d %s: status %d", set, c->name, st);
        CHECK_BITS_D(total, cpu_total, "set %d %s: total", set, c->name);
        for (int g = 0; g < FIN_GROUPS; g++)
          CHECK_BITS_D(gn[g], cpu_groups[g], "set %d %s: group %d", set, c->name, g);
        bx_clip_opts co = BX_CLIP_OPTS_DEFAULT;
        co.formula = (bx_coef_formula)formula;
        double want;
        bx_clip_coef(cpu_total, max_norm, &co, &want);
        CHECK_BITS_D(coef, want, "set %d %s formula %d max_norm %g: coefficient", set, c->name,
                     formula, max_norm);
      }
      /* the norm rounded once into the narrower dtypes (p = 2 and 1) */
      if ((c->mode == BX_M_SQ || c->mode == BX_M_ABS) && set != 3) {
        ref_sum exact;
        ref_sum_init(&exact);
        for (int g = 0; g < FIN_GROUPS; g++) {
          if (c->mode == BX_M_SQ) ref_add_squares(&exact, dts[g], whole[g].buf, ns[g]);
          else ref_add_abs(&exact, dts[g], whole[g].buf, ns[g]);
        }
        for (int dt = 0; dt < 3; dt++) { /* f16, bf16, f32 */
          bx_cu_finish_args a = {c->mode, c->p, 0, 0, 0.0, 1e-6, 0, dt};
          uint32_t out = 0;
          int32_t st = bx_cu_finish(wire, FIN_GROUPS, &a, &scratch, total_digits, &out, NULL, NULL);
          CHECK(st == BX_OK, "set %d %s: status %d", set, c->name, st);
          double want = c->mode == BX_M_SQ ? ref_sqrt_fmt(exact.sum, REF_FMT[dt])
                                           : ref_round_fmt(exact.sum, REF_FMT[dt]);
          uint64_t want_bits = ref_encode(dt, want);
          uint64_t got_bits = dt == REF_F32 ? out : (out & 0xFFFF);
          CHECK(got_bits == want_bits, "set %d %s: norm in %s: 0x%llx, want 0x%llx", set, c->name,
                bxt_dt_name(dt), (unsigned long long)got_bits, (unsigned long long)want_bits);
        }
        ref_sum_clear(&exact);
      }
      /* statuses: a disagreement, a rank's failure, NaN/Inf with
       * error_if_nonfinite, a wrong accumulator version */
      {
        bx_cu_finish_args a = {c->mode, c->p, 1, 1, 0.5, 1e-6, 0, BX_DT_F64};
        double total = 0, coef = 0;
        int64_t save = wire[1];
        wire[1] = ~(wire[0] - 1); /* min != max for item 0 */
        CHECK(bx_cu_finish(wire, FIN_GROUPS, &a, &scratch, total_digits, &total, NULL, &coef) ==
                  BX_EMISMATCH && total != total && coef == 1.0,
              "%s: disagreement gives BX_EMISMATCH, NaN, coef 1", c->name);
        wire[1] = save;
        wire[BX_AGREE_W_FAILURE] = bx_agree_failure_key(1, BX_EDTYPE);
        CHECK(bx_cu_finish(wire, FIN_GROUPS, &a, &scratch, total_digits, &total, NULL, &coef) ==
                  BX_EDTYPE, "%s: a rank's local failure", c->name);
        wire[BX_AGREE_W_FAILURE] = -1;
        /* error_if_nonfinite: the device fails exactly when the CPU does
         * (a non-finite total: torch's rule) */
        bx_norm_opts oe = o;
        oe.error_if_nonfinite = 1;
        double t_cpu;
        bx_status want_st = bx_total_norm(groups, FIN_GROUPS, NULL, &oe, &t_cpu, NULL);
        int32_t got_st = bx_cu_finish(wire, FIN_GROUPS, &a, &scratch, total_digits, &total, NULL, &coef);
        CHECK(got_st == (int32_t)want_st, "set %d %s: error_if_nonfinite: status %d, CPU %d", set,
              c->name, got_st, (int)want_st);
        CHECK(want_st == BX_OK || (total != total && coef == 1.0),
              "set %d %s: a failed finish gives NaN and coef 1", set, c->name);
        if (c->mode != BX_M_EXT) {
          wire[BX_AGREE_WORDS + BX_ACC_DIGITS + 4] += 1;
          CHECK(bx_cu_finish(wire, FIN_GROUPS, &a, &scratch, total_digits, &total, NULL,
                             &coef) == BX_EMISMATCH, "%s: accumulator version", c->name);
        }
      }
      free(wire);
    }
    for (int g = 0; g < FIN_GROUPS; g++) {
      bxt_tensor_free(&whole[g]);
      for (int k = 0; k < FIN_RANKS; k++) bxt_tensor_free(&parts[k][g]);
    }
  }
}

/* A norm stored in a 16-bit dtype is rounded once from its double (no
 * double rounding through fp32), fp32 by the conversion itself. */
void test_cuda_sim_store_rounding(void) {
  bxt_rng r;
  bxt_rng_init(&r);
  mpfr_t v;
  mpfr_init2(v, 64);
  for (int k = 0; k < 200000 && bxt_failures() < 5; k++) {
    int dt = k % 3; /* f16, bf16, f32 */
    double d;
    if (k % 4 != 3 && dt != REF_F32) {
      /* just off a 16-bit format's midpoint, closer than fp32's half ulp:
       * through fp32 it would land on the midpoint and round to even */
      int frac = dt == REF_F16 ? 10 : 7, e = (int)bxt_below(&r, 28) - 14;
      double base = ldexp(1.0 + (double)bxt_below(&r, 1u << frac) / (double)(1u << frac), e);
      double off = ldexp((double)((int64_t)bxt_below(&r, 7) - 3), e - 40);
      d = base + ldexp(1.0, e - frac - 1) + off;
    } else {
      d = ldexp(bxt_uniform(&r) + 0.5, (int)bxt_below(&r, 80) - 40);
    }
    uint32_t out = 0;
    bx_norm_store(dt, &out, d);
    mpfr_set_d(v, d, MPFR_RNDN); /* exact: 64 bits */
    uint64_t want = ref_encode(dt, ref_round_fmt(v, REF_FMT[dt]));
    uint64_t got = dt == REF_F32 ? out : (out & 0xFFFF);
    CHECK(got == want, "%s of %a: 0x%llx, want 0x%llx", bxt_dt_name(dt), d,
          (unsigned long long)got, (unsigned long long)want);
  }
  mpfr_clear(v);
}
