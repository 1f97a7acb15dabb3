/*
 * test_cuda_sim.c — the CUDA kernels' exact arithmetic, run on the CPU.
 *
 * src/cuda/exact_window.h holds the per-thread loops of the GPU reduction
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
#include "internal.h"
#include "tests.h"
#include "util.h"

#include "../src/cuda/exact_window.h"

typedef enum sim_mode { SIM_SQ, SIM_ABS, SIM_MEGATRON, SIM_POW } sim_mode;

/* The reduction kernel's work on one tensor, as the GPU schedules it (any
 * schedule gives the same words: that is what is being tested). */
static void sim_reduce(const void *x, int dt, size_t n, sim_mode m, double p, bx_acc *out) {
  int64_t gdig[BX_ACC_DIGITS] = {0}, gnan = 0, ginf = 0;
  size_t es = bx_dtype_size((bx_dtype)dt);
  for (size_t start = 0; start < n; start += BX_CU_CHUNK) {
    uint32_t cn = (uint32_t)(n - start < BX_CU_CHUNK ? n - start : BX_CU_CHUNK);
    const void *c = (const char *)x + start * es;
    int64_t sdig[BX_ACC_DIGITS] = {0}, snan = 0, sinf = 0;
    bx_sink s = {sdig, &snan, &sinf};
    for (uint32_t t = 0; t < BX_CU_BLOCK; t++) {
      switch (m) {
        case SIM_SQ:
          if (dt == BX_DT_F32) bx_thread_sumsq_f32(c, cn, t, BX_CU_BLOCK, &s);
          else if (dt == BX_DT_BF16) bx_thread_sumsq_bf16(c, cn, t, BX_CU_BLOCK, &s);
          else if (dt == BX_DT_F16) bx_thread_sumsq_f16(c, cn, t, BX_CU_BLOCK, &s);
          else bx_thread_sumsq_f64(c, cn, t, BX_CU_BLOCK, &s);
          break;
        case SIM_ABS:
          if (dt == BX_DT_F32) bx_thread_sumabs_f32(c, cn, t, BX_CU_BLOCK, &s);
          else if (dt == BX_DT_BF16) bx_thread_sumabs_bf16(c, cn, t, BX_CU_BLOCK, &s);
          else if (dt == BX_DT_F16) bx_thread_sumabs_f16(c, cn, t, BX_CU_BLOCK, &s);
          else bx_thread_sumabs_f64(c, cn, t, BX_CU_BLOCK, &s);
          break;
        case SIM_MEGATRON: bx_thread_megatron(c, dt, cn, t, BX_CU_BLOCK, &s); break;
        case SIM_POW: bx_thread_pow(c, dt, cn, t, BX_CU_BLOCK, p, &s); break;
      }
    }
    for (int i = 0; i < BX_ACC_DIGITS; i++) bx_flush_word(gdig, i, sdig[i]);
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
    case SIM_SQ: bx_acc_add_squares(out, &view); break;
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
  return m == SIM_SQ ? "squares" : m == SIM_ABS ? "abs" : m == SIM_MEGATRON ? "megatron" : "pow";
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

void test_cuda_sim_squares(void) { random_sets(SIM_SQ, 2.0); }
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
    compare(&x, SIM_SQ, 2, "all max");
    compare(&x, SIM_ABS, 1, "all max");
    /* 2: largest significand at every exponent, each thread climbing: a
     * rebase at almost every element */
    int emax = dt == BX_DT_F16 ? 30 : dt == BX_DT_F64 ? 2046 : 254;
    int mbits = dt == BX_DT_F16 ? 10 : dt == BX_DT_BF16 ? 7 : dt == BX_DT_F32 ? 23 : 52;
    for (size_t i = 0; i < n; i++) {
      uint64_t e = (uint64_t)((i / BX_CU_BLOCK) % (size_t)(emax + 1));
      bxt_set_bits(&x, i, (e << mbits) | ((1ull << mbits) - 1));
    }
    compare(&x, SIM_SQ, 2, "climbing exponents");
    compare(&x, SIM_ABS, 1, "climbing exponents");
    /* 3: falling exponents: everything after the first lands below the window */
    for (size_t i = 0; i < n; i++) {
      uint64_t e = (uint64_t)emax - (uint64_t)((i / BX_CU_BLOCK) % (size_t)(emax + 1));
      bxt_set_bits(&x, i, (e << mbits) | (bxt_next(&r) & ((1ull << mbits) - 1)));
    }
    compare(&x, SIM_SQ, 2, "falling exponents");
    compare(&x, SIM_ABS, 1, "falling exponents");
    /* 4: subnormals and zeros only, signs random */
    for (size_t i = 0; i < n; i++) {
      uint64_t sign = (bxt_next(&r) & 1) << (dt == BX_DT_F64 ? 63 : dt == BX_DT_F32 ? 31 : 15);
      uint64_t frac = i % 3 ? (bxt_next(&r) & ((1ull << mbits) - 1)) : 0;
      bxt_set_bits(&x, i, sign | frac);
    }
    compare(&x, SIM_SQ, 2, "subnormals and zeros");
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
    compare(&x, SIM_SQ, 2, "full window headroom");
    int upa = (BX_ABS_SMAX - BX_ABS_LOW);
    for (size_t i = 0; i < n; i++) {
      uint64_t e = (uint64_t)(emax / 2) + ((i % BX_CU_CHUNK) < BX_CU_BLOCK ? 0 : (uint64_t)upa);
      /* (|x| loops are element-wise: thread t's first element is t) */
      bxt_set_bits(&x, i, (e << mbits) | ((1ull << mbits) - 1));
    }
    compare(&x, SIM_ABS, 1, "full window headroom");
    /* 6: a tiny first element per thread, then gradient-like values */
    bxt_fill_gradient(&r, &x, 1.0);
    for (size_t i = 0; i < BX_CU_BLOCK && i < n; i++) bxt_set_bits(&x, i, 1);
    compare(&x, SIM_SQ, 2, "tiny first elements");
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
