/*
 * test_train_device_sweep.c — every training call that has a CUDA kernel,
 * run on the device and on the host over the same bytes, compared bit for
 * bit (issue 30, S4's kernel sweep): random shapes (edge tiles, K not a
 * multiple of the tile, empty dimensions) and values with every kind of
 * special (tests/train_cuda_sim.h), the device side's tensors in managed
 * memory (bx_train_alloc).
 *
 * "The device" is the GPU where one is usable and, everywhere else (CI),
 * the host simulation of the device backend (src/hostsim), so the sweep
 * itself is rehearsed on every run; it says which it used. On a mismatch it
 * names the case, the output and the first element, and with BX_SWEEP_OUT
 * set it writes every argument's bytes (before, after on the host, after on
 * the device) there as raw little-endian files, for replay on the CPU:
 * `BX_TEST_SEED=... bx_tests train_device_sweep` rebuilds the same inputs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bitexact_train.h"
#include "dl_view.h"
#include "harness.h"
#include "tests.h"
#include "train_cuda_sim.h"
#include "train_device.h"

enum { SW_F32, SW_BF16, SW_I64 };
#define SW_MAX_ARGS 8

typedef struct sw_arg {
  const char *name;
  int kind;      /* SW_F32, SW_BF16, SW_I64 */
  int ndim;
  int64_t shape[3];
  int out;       /* written by the call */
  int alias;     /* -1, or the earlier argument whose buffer this one is (in place) */
  int64_t range; /* SW_I64: values in [0, range) */
} sw_arg;

typedef struct sw_case {
  const char *name;
  int narg;
  sw_arg a[SW_MAX_ARGS];
  int64_t p[4]; /* the call's integer parameters */
  double d[2];  /* and its real ones */
  bx_status (*call)(const struct sw_case *c, DLTensor *t);
} sw_case;

static size_t sw_numel(const sw_arg *a) {
  size_t n = 1;
  for (int d = 0; d < a->ndim; d++) n *= (size_t)a->shape[d];
  return n;
}
static size_t sw_elsize(const sw_arg *a) { return a->kind == SW_BF16 ? 2 : a->kind == SW_I64 ? 8 : 4; }
static size_t sw_bytes(const sw_arg *a) { return sw_numel(a) * sw_elsize(a); }

static void sw_fill(bxt_rng *r, const sw_arg *a, void *p) {
  size_t n = sw_numel(a);
  for (size_t i = 0; i < n; i++) {
    if (a->kind == SW_F32) ((float *)p)[i] = sim_value(r);
    else if (a->kind == SW_BF16) ((uint16_t *)p)[i] = (uint16_t)(bx_f32_bits(sim_value(r)) >> 16);
    else ((int64_t *)p)[i] = (int64_t)bxt_below(r, (uint64_t)a->range);
  }
}

static DLTensor sw_view(const sw_arg *a, void *p, DLDevice dev) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = p;
  t.device = dev;
  t.ndim = a->ndim;
  t.dtype.code = a->kind == SW_F32 ? kDLFloat : a->kind == SW_BF16 ? kDLBfloat : kDLInt;
  t.dtype.bits = (uint8_t)(8 * sw_elsize(a));
  t.dtype.lanes = 1;
  t.shape = (int64_t *)a->shape;
  return t;
}

static void sw_dump(const char *dir, const sw_case *c, int which, const char *tag, const void *p,
                    size_t bytes) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s.%d.%s.%s.bin", dir, c->name, which, c->a[which].name, tag);
  FILE *f = fopen(path, "wb");
  if (!f) return;
  if (bytes) fwrite(p, 1, bytes, f);
  fclose(f);
}

/* One case: the host call on host buffers, the device call on managed ones
 * holding the same bytes; the statuses and every output's bytes equal. */
static void sw_run(bxt_rng *r, const sw_case *c, int *cases) {
  void *init[SW_MAX_ARGS] = {0}, *host[SW_MAX_ARGS] = {0}, *dev[SW_MAX_ARGS] = {0};
  DLTensor th[SW_MAX_ARGS], td[SW_MAX_ARGS];
  const DLDevice cpu = {kDLCPU, 0}, managed = {kDLCUDAManaged, 0};
  int ok = 1;
  for (int i = 0; i < c->narg && ok; i++) {
    const sw_arg *a = &c->a[i];
    size_t b = sw_bytes(a);
    if (a->alias >= 0) {
      host[i] = host[a->alias];
      dev[i] = dev[a->alias];
    } else {
      init[i] = malloc(b ? b : 1);
      host[i] = malloc(b ? b : 1);
      ok = init[i] && host[i];
      if (ok) sw_fill(r, a, init[i]);
      if (ok) memcpy(host[i], init[i], b);
      ok = ok && bx_train_alloc(managed, b, &dev[i]) == BX_OK;
      if (ok) memcpy(dev[i], init[i], b);
    }
    th[i] = sw_view(a, host[i], cpu);
    td[i] = sw_view(a, dev[i], managed);
  }
  CHECK(ok, "%s: buffers", c->name);
  if (ok) {
    bx_status sh = c->call(c, th);
    char eh[512];
    snprintf(eh, sizeof eh, "%s", bx_last_error());
    bx_status sd = c->call(c, td);
    CHECK(sh == sd, "%s: host status %d (%s), device status %d (%s)", c->name, (int)sh,
          sh ? eh : "", (int)sd, sd ? bx_last_error() : "");
    for (int i = 0; i < c->narg; i++) {
      const sw_arg *a = &c->a[i];
      if (!a->out) continue;
      size_t n = sw_numel(a), es = sw_elsize(a), k = 0;
      while (k < n && !memcmp((char *)host[i] + k * es, (char *)dev[i] + k * es, es)) k++;
      if (k == n) continue;
      uint32_t hv = 0, dv = 0;
      memcpy(&hv, (char *)host[i] + k * es, es < 4 ? es : 4);
      memcpy(&dv, (char *)dev[i] + k * es, es < 4 ? es : 4);
      CHECK(0, "%s: output %s differs first at element %zu of %zu: host 0x%08x, device 0x%08x "
            "(shape %lld x %lld x %lld)", c->name, a->name, k, n, hv, dv, (long long)a->shape[0],
            (long long)(a->ndim > 1 ? a->shape[1] : 1), (long long)(a->ndim > 2 ? a->shape[2] : 1));
      const char *dir = getenv("BX_SWEEP_OUT");
      if (dir)
        for (int j = 0; j < c->narg; j++) {
          size_t b = sw_bytes(&c->a[j]);
          int root = c->a[j].alias >= 0 ? c->a[j].alias : j;
          sw_dump(dir, c, j, "input", init[root], b);
          sw_dump(dir, c, j, "host", host[j], b);
          sw_dump(dir, c, j, "device", dev[j], b);
        }
      break;
    }
  }
  for (int i = 0; i < c->narg; i++) {
    if (c->a[i].alias >= 0) continue;
    free(init[i]);
    free(host[i]);
    bx_train_free(managed, dev[i]);
  }
  (*cases)++;
}

/* ---- the calls ------------------------------------------------------------------------ */

static bx_status call_gemm(const sw_case *c, DLTensor *t) {
  bx_gemm_opts o = BX_GEMM_OPTS_DEFAULT;
  o.accumulate = (int)c->p[1];
  return bx_gemm(&t[0], &t[1], (bx_gemm_layout)c->p[0], &t[2], &o);
}
static bx_status call_swiglu_fwd(const sw_case *c, DLTensor *t) {
  (void)c;
  return bx_swiglu_forward(&t[0], &t[1], &t[2], NULL);
}
static bx_status call_swiglu_bwd(const sw_case *c, DLTensor *t) {
  (void)c;
  return bx_swiglu_backward(&t[0], &t[1], &t[2], &t[3], &t[4], NULL);
}
static bx_status call_swiglu_fused_fwd(const sw_case *c, DLTensor *t) {
  (void)c;
  return bx_swiglu_forward_fused(&t[0], &t[1], NULL);
}
static bx_status call_swiglu_fused_bwd(const sw_case *c, DLTensor *t) {
  (void)c;
  return bx_swiglu_backward_fused(&t[0], &t[1], &t[2], NULL);
}
static bx_status call_rms_fwd(const sw_case *c, DLTensor *t) {
  return bx_rmsnorm_forward(&t[0], &t[1], c->d[0], &t[2], &t[3], NULL);
}
static bx_status call_rms_bwd(const sw_case *c, DLTensor *t) {
  return bx_rmsnorm_backward(&t[0], &t[1], &t[2], &t[3], c->p[0], &t[4], &t[5], NULL);
}
static bx_status call_rope(const sw_case *c, DLTensor *t) {
  return c->p[2] ? bx_rope_backward(&t[0], &t[1], c->p[0], c->p[1], c->d[0], &t[2], NULL)
                 : bx_rope_forward(&t[0], &t[1], c->p[0], c->p[1], c->d[0], &t[2], NULL);
}
static bx_status call_adamw(const sw_case *c, DLTensor *t) {
  bx_adamw_opts o = BX_ADAMW_OPTS_DEFAULT;
  o.lr = c->d[0];
  o.weight_decay = c->d[1];
  return bx_adamw_step(&t[0], &t[1], &t[2], &t[3], c->p[0], &o);
}

#define F32(nm, o, n0, n1) {nm, SW_F32, 2, {n0, n1, 0}, o, -1, 0}
#define F32_1(nm, o, n0) {nm, SW_F32, 1, {n0, 0, 0}, o, -1, 0}

/* ---- the sweep ------------------------------------------------------------------------- */

void test_train_device_sweep(void) {
  int sim = !bx_train_managed_on_device();
  if (sim) bx_train_device_use_sim(1);
  printf("  note: the device: %s\n", sim ? "the host simulation (no usable GPU)" : bx_train_device_cuda()->name);
  bxt_rng r;
  bxt_rng_init(&r);
  int cases = 0;
  for (int it = 0; it < 12 && !bxt_failures(); it++) { /* GEMM: 12 shapes, every layout */
    int64_t m = (int64_t)bxt_below(&r, 150), n = 1 + (int64_t)bxt_below(&r, 150),
            k = (int64_t)bxt_below(&r, 70);
    if (it == 0) m = 64, n = 64, k = 32; /* whole tiles */
    int layout = it % 3, abf = (int)bxt_below(&r, 2), bbf = (int)bxt_below(&r, 2);
    sw_case c = {"gemm", 3, {{0}}, {layout, (int64_t)bxt_below(&r, 2), 0, 0}, {0, 0}, call_gemm};
    int ka = abf ? SW_BF16 : SW_F32, kb = bbf ? SW_BF16 : SW_F32;
    c.a[0] = (sw_arg){"a", ka, 2, {layout == 2 ? k : m, layout == 2 ? m : k, 0}, 0, -1, 0};
    c.a[1] = (sw_arg){"b", kb, 2, {layout == 0 ? n : k, layout == 0 ? k : n, 0}, 0, -1, 0};
    c.a[2] = (sw_arg)F32("c", 1, m, n);
    sw_run(&r, &c, &cases);
  }
  for (int it = 0; it < 6 && !bxt_failures(); it++) { /* SwiGLU, both layouts, both ways */
    int64_t rows = 1 + (int64_t)bxt_below(&r, 9), f = 1 + (int64_t)bxt_below(&r, 300);
    sw_case a = {"swiglu_forward", 3, {F32("gate", 0, rows, f), F32("up", 0, rows, f),
                                       F32("h", 1, rows, f)}, {0}, {0}, call_swiglu_fwd};
    sw_run(&r, &a, &cases);
    sw_case b = {"swiglu_backward", 5, {F32("gate", 0, rows, f), F32("up", 0, rows, f),
                                        F32("dh", 0, rows, f), F32("dgate", 1, rows, f),
                                        F32("dup", 1, rows, f)}, {0}, {0}, call_swiglu_bwd};
    sw_run(&r, &b, &cases);
    sw_case fa = {"swiglu_forward_fused", 2, {F32("gate_up", 0, rows, 2 * f), F32("h", 1, rows, f)},
                  {0}, {0}, call_swiglu_fused_fwd};
    sw_run(&r, &fa, &cases);
    sw_case fb = {"swiglu_backward_fused (in place)", 3,
                  {F32("gate_up", 1, rows, 2 * f), F32("dh", 0, rows, f), F32("dgate_up", 1, rows, 2 * f)},
                  {0}, {0}, call_swiglu_fused_bwd};
    fb.a[2].alias = 0;
    sw_run(&r, &fb, &cases);
  }
  for (int it = 0; it < 6 && !bxt_failures(); it++) { /* RMSNorm */
    int64_t rows = 1 + (int64_t)bxt_below(&r, 40), h = 1 + (int64_t)bxt_below(&r, 200);
    int64_t chunk = 1 + (int64_t)bxt_below(&r, 12), nch = (rows + chunk - 1) / chunk;
    sw_case f = {"rmsnorm_forward", 4, {F32("x", 0, rows, h), F32_1("weight", 0, h),
                                        F32("y", 1, rows, h), F32_1("rstd", 1, rows)},
                 {0}, {1e-6, 0}, call_rms_fwd};
    sw_run(&r, &f, &cases);
    sw_case b = {"rmsnorm_backward", 6, {F32("x", 0, rows, h), F32_1("weight", 0, h),
                                         F32("dy", 0, rows, h), F32_1("rstd", 0, rows),
                                         F32("dx", 1, rows, h), F32("dweight_partials", 1, nch, h)},
                 {chunk, 0, 0, 0}, {0, 0}, call_rms_bwd};
    sw_run(&r, &b, &cases);
  }
  for (int it = 0; it < 6 && !bxt_failures(); it++) { /* RoPE, forward and backward */
    int64_t T = 1 + (int64_t)bxt_below(&r, 20), hd = 2 * (1 + (int64_t)bxt_below(&r, 16));
    int64_t heads = 1 + (int64_t)bxt_below(&r, 4), rot = 2 * (1 + (int64_t)bxt_below(&r, hd / 2));
    sw_case c = {it % 2 ? "rope_backward" : "rope_forward", 3,
                 {F32("x", 0, T, heads * hd), {"positions", SW_I64, 1, {T, 0, 0}, 0, -1, 5000},
                  F32("y", 1, T, heads * hd)},
                 {hd, rot, it % 2, 0}, {it % 3 ? 10000.0 : 1e6, 0}, call_rope};
    sw_run(&r, &c, &cases);
  }
  for (int it = 0; it < 4 && !bxt_failures(); it++) { /* AdamW */
    int64_t n = 1 + (int64_t)bxt_below(&r, 3000);
    sw_case c = {"adamw_step", 4, {F32_1("param", 1, n), F32_1("grad", 0, n), F32_1("exp_avg", 1, n),
                                   F32_1("exp_avg_sq", 1, n)},
                 {1 + (int64_t)bxt_below(&r, 1000), 0, 0, 0}, {1e-3, it % 2 ? 0.1 : 0.0}, call_adamw};
    sw_run(&r, &c, &cases);
  }
  printf("  note: %d cases, each bit for bit against the host\n", cases);
  if (sim) bx_train_device_use_sim(0);
}
