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

enum { SW_F32, SW_BF16, SW_I64, SW_I32 };
#define SW_MAX_ARGS 10

typedef struct sw_arg {
  const char *name;
  int kind;      /* SW_F32, SW_BF16, SW_I64, SW_I32 */
  int ndim;
  int64_t shape[3];
  int out;       /* written by the call */
  int alias;     /* -1, or the earlier argument whose buffer this one is (in place) */
  int64_t range; /* SW_I64, SW_I32: values in [0, range); SW_F32: SW_NO_NAN or SW_FINITE
                    values (where the entry refuses the others), 0 every special */
} sw_arg;

enum { SW_NO_NAN = 1, SW_FINITE = 2 };

typedef struct sw_case {
  const char *name;
  int narg;
  sw_arg a[SW_MAX_ARGS];
  int64_t p[4]; /* the call's integer parameters */
  double d[2];  /* and its real ones */
  bx_status (*call)(const struct sw_case *c, DLTensor *t);
  /* NULL, or what makes the filled inputs valid (distinct ids, a plan) */
  void (*prep)(const struct sw_case *c, bxt_rng *r, void **init);
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
    if (a->kind == SW_F32) {
      float v = a->range == SW_FINITE ? sim_plain(r) : sim_value(r);
      ((float *)p)[i] = a->range == SW_NO_NAN && v != v ? -1.5f : v;
    } else if (a->kind == SW_BF16) {
      float v = a->range == SW_FINITE ? sim_plain(r) : sim_value(r);
      ((uint16_t *)p)[i] = (uint16_t)(bx_f32_bits(v) >> 16);
    }
    else if (a->kind == SW_I32) ((int32_t *)p)[i] = (int32_t)bxt_below(r, (uint64_t)a->range);
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

/* The device side's view of a managed buffer as a kDLCUDA tensor, for the
 * entries that run on the device only for kDLCUDA tensors (bx_adamw_step,
 * the token reduction): managed memory is device memory for the device,
 * the host simulation included. */
static DLTensor sw_cuda(const DLTensor *t) {
  DLTensor u = *t;
  if (u.device.device_type == kDLCUDAManaged) u.device.device_type = kDLCUDA;
  return u;
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
  for (int i = 0; i < c->narg && ok; i++) { /* the inputs' bytes */
    const sw_arg *a = &c->a[i];
    size_t b = sw_bytes(a);
    if (a->alias >= 0) continue;
    init[i] = malloc(b ? b : 1);
    ok = init[i] != NULL;
    if (ok) sw_fill(r, a, init[i]);
  }
  if (ok && c->prep) c->prep(c, r, init);
  for (int i = 0; i < c->narg && ok; i++) { /* the same bytes on both sides */
    const sw_arg *a = &c->a[i];
    size_t b = sw_bytes(a);
    if (a->alias >= 0) {
      host[i] = host[a->alias];
      dev[i] = dev[a->alias];
    } else {
      host[i] = malloc(b ? b : 1);
      ok = host[i] != NULL;
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
  DLTensor u[4]; /* kDLCUDA: bx_adamw_step takes managed tensors on the host */
  for (int i = 0; i < 4; i++) u[i] = sw_cuda(&t[i]);
  return bx_adamw_step(&u[0], &u[1], &u[2], &u[3], c->p[0], &o);
}

/* ---- the last entries: elementwise math, RoPE's table, bias partials ------------------------ */

/* p[0]: 0..6 bx_exp .. bx_cos, 7 bx_round_bf16; p[1]: the tensors as
 * kDLCUDA (else managed). */
static bx_status call_math(const sw_case *c, DLTensor *t) {
  static bx_status (*const f[8])(const DLTensor *, DLTensor *, const bx_math_opts *) = {
      bx_exp, bx_log, bx_sigmoid, bx_silu, bx_rsqrt, bx_sin, bx_cos, bx_round_bf16};
  DLTensor u[2] = {t[0], t[1]};
  if (c->p[1]) u[0] = sw_cuda(&t[0]), u[1] = sw_cuda(&t[1]);
  return f[c->p[0]](&u[0], &u[1], NULL);
}
/* p[0]: rotary_dim; p[1]: the tensors as kDLCUDA; d[0]: theta. */
static bx_status call_rope_table(const sw_case *c, DLTensor *t) {
  DLTensor u[3] = {t[0], t[1], t[2]};
  if (c->p[1])
    for (int i = 0; i < 3; i++) u[i] = sw_cuda(&t[i]);
  return bx_rope_cos_sin(&u[0], c->p[0], c->d[0], &u[1], &u[2], NULL);
}
/* p[2] != 0: position p[2] - 1 set out of range (the error path: nothing written). */
static void prep_bad_position(const sw_case *c, bxt_rng *r, void **init) {
  (void)r;
  if (c->p[2]) ((int64_t *)init[0])[c->p[2] - 1] = c->p[3] ? -1 : ((int64_t)1 << 24) + 1;
}
/* p[0]: chunk_tokens; p[1]: the tensors as kDLCUDA. */
static bx_status call_bias_partials(const sw_case *c, DLTensor *t) {
  DLTensor u[2] = {t[0], t[1]};
  if (c->p[1]) u[0] = sw_cuda(&t[0]), u[1] = sw_cuda(&t[1]);
  return bx_bias_grad_partials(&u[0], c->p[0], &u[1], NULL);
}

/* ---- MoE router, dispatch, embedding, cross-entropy --------------------------------------- */

static void sw_set_id(void *p, int kind, size_t i, int64_t v) {
  if (kind == SW_I32) ((int32_t *)p)[i] = (int32_t)v;
  else ((int64_t *)p)[i] = v;
}

/* ids [T, k] of kind: k distinct experts of [0, E) per token, in random order. */
static void sw_distinct_ids(bxt_rng *r, void *ids, int kind, int64_t T, int64_t k, int64_t E) {
  int64_t *perm = malloc((size_t)(E ? E : 1) * sizeof *perm);
  for (int64_t t = 0; t < T; t++) {
    for (int64_t e = 0; e < E; e++) perm[e] = e;
    for (int64_t j = 0; j < k; j++) { /* a partial Fisher-Yates */
      int64_t x = j + (int64_t)bxt_below(r, (uint64_t)(E - j)), v = perm[x];
      perm[x] = perm[j];
      perm[j] = v;
      sw_set_id(ids, kind, (size_t)(t * k + j), v);
    }
  }
  free(perm);
}

/* Router backward: argument 1 (topk_ids [T, k]) distinct in [0, E = logits' columns). */
static void prep_router_ids(const sw_case *c, bxt_rng *r, void **init) {
  sw_distinct_ids(r, init[1], c->a[1].kind, c->a[1].shape[0], c->a[1].shape[1], c->a[0].shape[1]);
}

/* A dispatch plan, built on the host by bx_moe_dispatch_plan from random
 * distinct ids: E = p[0], k = p[1], row_map argument p[2], pos argument
 * p[3] (-1: none); T = row_map's rows / k. */
static void prep_plan(const sw_case *c, bxt_rng *r, void **init) {
  int64_t E = c->p[0], k = c->p[1], R = c->a[c->p[2]].shape[0], T = k ? R / k : 0;
  int64_t *ids = malloc((size_t)(T * k + 1) * sizeof *ids), *pos = malloc((size_t)(T * k + 1) * 8);
  int64_t *off = malloc((size_t)(E + 1) * sizeof *off);
  sw_distinct_ids(r, ids, SW_I64, T, k, E);
  const DLDevice cpu = {kDLCPU, 0};
  sw_arg ai = {"ids", SW_I64, 2, {T, k, 0}, 0, -1, 0}, ao = {"offsets", SW_I64, 1, {E + 1, 0, 0}, 0, -1, 0};
  DLTensor ti = sw_view(&ai, ids, cpu), to = sw_view(&ao, off, cpu);
  DLTensor tr = sw_view(&c->a[c->p[2]], init[c->p[2]], cpu), tp = sw_view(&ai, pos, cpu);
  bx_status st = bx_moe_dispatch_plan(&ti, NULL, &to, &tr, &tp, NULL);
  CHECK(st == BX_OK, "%s: the plan: %s", c->name, bx_last_error());
  if (c->p[3] >= 0) memcpy(init[c->p[3]], pos, (size_t)(T * k) * 8);
  free(ids), free(pos), free(off);
}

static bx_status call_router_fwd(const sw_case *c, DLTensor *t) {
  bx_moe_router_opts o = BX_MOE_ROUTER_OPTS_DEFAULT;
  o.n_group = c->p[1];
  o.topk_group = c->p[2];
  o.norm_topk_prob = (int)c->d[1];
  o.routed_scaling_factor = c->d[0];
  return bx_moe_router_forward(&t[0], &t[1], &t[2], &t[3], c->p[0], c->p[3] ? &t[4] : NULL, &o);
}
static bx_status call_router_bwd(const sw_case *c, DLTensor *t) {
  bx_moe_router_opts o = BX_MOE_ROUTER_OPTS_DEFAULT;
  o.norm_topk_prob = (int)c->d[1];
  o.routed_scaling_factor = c->d[0];
  return bx_moe_router_backward(&t[0], &t[1], &t[2], &t[3], &o);
}
static bx_status call_permute(const sw_case *c, DLTensor *t) {
  (void)c;
  return bx_moe_permute(&t[0], &t[1], &t[2], NULL);
}
static bx_status call_permute_bwd(const sw_case *c, DLTensor *t) {
  (void)c;
  return bx_moe_permute_backward(&t[0], &t[1], &t[2], &t[3], NULL);
}
static bx_status call_unpermute(const sw_case *c, DLTensor *t) {
  return bx_moe_unpermute(&t[0], &t[1], &t[2], &t[3], c->d[0] ? &t[4] : NULL, &t[5], NULL);
}
static bx_status call_unpermute_bwd(const sw_case *c, DLTensor *t) {
  int which = (int)c->d[0]; /* 0: both outputs, 1: dy_perm alone, 2: dweights alone */
  return bx_moe_unpermute_backward(&t[0], &t[1], &t[2], &t[3], &t[4], which != 2 ? &t[5] : NULL,
                                   which != 1 ? &t[6] : NULL, NULL);
}
static bx_status call_embedding_fwd(const sw_case *c, DLTensor *t) {
  (void)c;
  return bx_embedding_forward(&t[0], &t[1], &t[2], NULL);
}
static bx_status call_embedding_bwd(const sw_case *c, DLTensor *t) {
  bx_embedding_opts o = BX_EMBEDDING_OPTS_DEFAULT;
  o.padding_idx = c->p[2];
  return bx_embedding_backward(&t[0], &t[1], c->p[0], c->p[1], &t[2], &t[3], &t[4], &o);
}
static bx_status call_xent_fb(const sw_case *c, DLTensor *t) {
  bx_xent_opts o = BX_XENT_OPTS_DEFAULT;
  o.ignore_index = c->p[1];
  o.grad_scale = c->d[0];
  int np = c->p[3] & 1, nc = c->p[3] & 2; /* loss_partials / counts NULL */
  return bx_xent_forward_backward(&t[0], &t[1], c->p[2], c->p[0], &t[2], np ? NULL : &t[3],
                                  nc ? NULL : &t[4], &t[5], &o);
}
static bx_status call_xent_fwd(const sw_case *c, DLTensor *t) {
  bx_xent_opts o = BX_XENT_OPTS_DEFAULT;
  o.ignore_index = c->p[1];
  int np = c->p[3] & 1, nc = c->p[3] & 2;
  return bx_xent_forward(&t[0], &t[1], c->p[0], &t[2], np ? NULL : &t[3], nc ? NULL : &t[4], &o);
}
static bx_status call_xent_bwd(const sw_case *c, DLTensor *t) {
  bx_xent_opts o = BX_XENT_OPTS_DEFAULT;
  o.ignore_index = c->p[1];
  o.grad_scale = c->d[0];
  return bx_xent_backward(&t[0], &t[1], c->p[2], &t[2], &o);
}

/* ---- the token reduction through a state ---------------------------------------------------
 * The token reduction takes a partial (or dy and x) to the device only when
 * it is a kDLCUDA tensor (sw_cuda). The call runs a whole state (bounds, agree, adds) and writes what can be
 * compared: the state's words, the finished sums, the error text. */

/* The error text of a failed step into err (an I64 [64] output: 511 characters). */
static bx_status sw_err(DLTensor *err, bx_status st) {
  if (st != BX_OK) {
    char *e = err->data;
    memset(e, 0, 512);
    snprintf(e, 512, "%s", bx_last_error());
  }
  return st;
}

/* The state's words into out (grid mode; its element count must be the words'). */
static void sw_words(bx_tokred *s, DLTensor *out) {
  int64_t *w = NULL;
  size_t n = 0;
  if (bx_tokred_words(s, &w, &n) == BX_OK && (int64_t)n == out->shape[0])
    memcpy(out->data, w, n * sizeof *w);
}

/* tokred_add: partials [nch, m] (chunk j = row j), one tensor [m], chunks of
 * one token; p[0] mode, p[1] 0: bx_tokred_bound per chunk, 1: a stated
 * bound 2^-2 (breaking elements: the error or the flag), p[2] on_bound,
 * p[3] the finish into sum as a kDLCUDA tensor (host staging, then copied).
 * Outputs: words [m + 1 + nch], sum [m], err. */
static bx_status call_tokred_add(const sw_case *c, DLTensor *t) {
  DLTensor part = sw_cuda(&t[0]);
  int64_t nch = t[0].shape[0], m = t[0].shape[1];
  bx_tokred_opts o = BX_TOKRED_OPTS_DEFAULT;
  o.mode = (bx_tokred_mode)c->p[0];
  o.on_bound = (bx_tokred_on_bound)c->p[2];
  DLTensor g = t[2];
  g.device = (DLDevice){kDLCPU, 0};
  g.data = NULL;
  bx_tokred *s = NULL;
  bx_status st = sw_err(&t[3], bx_tokred_create(&g, 1, 1, nch, &o, &s));
  for (int64_t j = 0; st == BX_OK && j < nch; j++) {
    DLTensor pj = part;
    pj.ndim = 1;
    pj.shape = &t[0].shape[1];
    pj.data = (float *)part.data + j * m;
    st = sw_err(&t[3], c->p[1] ? bx_tokred_bound_exp(s, 0, -2) : bx_tokred_bound(s, 0, j, &pj));
  }
  if (st == BX_OK) st = sw_err(&t[3], bx_tokred_agree(s, NULL));
  for (int64_t j = 0; st == BX_OK && j < nch; j++) {
    DLTensor pj = part;
    pj.ndim = 1;
    pj.shape = &t[0].shape[1];
    pj.data = (float *)part.data + j * m;
    st = sw_err(&t[3], bx_tokred_add(s, 0, j, &pj));
  }
  if (s && o.mode == BX_TOKRED_GRID) sw_words(s, &t[1]);
  DLTensor out = c->p[3] ? sw_cuda(&t[2]) : t[2]; /* p[3]: the sum as a kDLCUDA tensor */
  if (st == BX_OK) st = sw_err(&t[3], bx_tokred_finish_check(s, &out, 1, 1));
  if (st == BX_OK) st = sw_err(&t[3], bx_tokred_finish(s, &out, 1, 1));
  bx_tokred_destroy(s);
  return st;
}

/* linear_wgrad: dy [t, n], x [t, k] (fp32 or bf16) in chunks of p[0] tokens;
 * p[1] mode, p[2] 0: bx_linear_wgrad_bound, 1: stated bounds 2^-2, p[3]
 * 0: weight and bias, 1: the weight alone, 2: the bias alone (x NULL);
 * d[0] on_bound. Outputs: words, dweight [n, k], dbias [n], err. */
static bx_status call_linear_wgrad(const sw_case *c, DLTensor *t) {
  DLTensor dy = sw_cuda(&t[0]), x = sw_cuda(&t[1]);
  int which = (int)c->p[3];
  bx_tokred_opts o = BX_TOKRED_OPTS_DEFAULT;
  o.mode = (bx_tokred_mode)c->p[1];
  o.on_bound = (bx_tokred_on_bound)c->d[0];
  DLTensor g[2], out[2];
  size_t nt = 0, wt = BX_WGRAD_NONE, bt = BX_WGRAD_NONE;
  if (which != 2) wt = nt, out[nt] = t[3], g[nt++] = t[3];
  if (which != 1) bt = nt, out[nt] = t[4], g[nt++] = t[4];
  for (size_t i = 0; i < nt; i++) {
    g[i].device = (DLDevice){kDLCPU, 0};
    g[i].data = NULL;
  }
  bx_tokred *s = NULL;
  bx_status st = sw_err(&t[5], bx_tokred_create(g, nt, c->p[0], t[0].shape[0], &o, &s));
  if (st == BX_OK && c->p[2] == 0)
    st = sw_err(&t[5], bx_linear_wgrad_bound(s, wt, bt, &dy, which == 2 ? NULL : &x, 0, NULL));
  for (size_t i = 0; st == BX_OK && c->p[2] && i < nt; i++)
    st = sw_err(&t[5], bx_tokred_bound_exp(s, i, -2));
  if (st == BX_OK) st = sw_err(&t[5], bx_tokred_agree(s, NULL));
  if (st == BX_OK) st = sw_err(&t[5], bx_linear_wgrad(s, wt, bt, &dy, which == 2 ? NULL : &x, 0, NULL));
  if (s && o.mode == BX_TOKRED_GRID) sw_words(s, &t[2]);
  if (st == BX_OK) st = sw_err(&t[5], bx_tokred_finish(s, out, nt, 1));
  bx_tokred_destroy(s);
  return st;
}

/* attention forward, then backward on its own stats: o, stats, dq, dk, dv */
static bx_status call_attention(const sw_case *c, DLTensor *t) {
  bx_status st = bx_attention_forward(&t[0], &t[1], &t[2], c->p[0], c->p[1], c->p[2], c->p[3],
                                      &t[4], &t[5], NULL);
  if (st != BX_OK) return st;
  return bx_attention_backward(&t[3], &t[0], &t[1], &t[2], &t[5], c->p[0], c->p[1], c->p[2],
                               c->p[3], &t[6], &t[7], &t[8], NULL);
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
    sw_case c = {"gemm", 3, {{0}}, {layout, (int64_t)bxt_below(&r, 2), 0, 0}, {0, 0}, call_gemm, NULL};
    int ka = abf ? SW_BF16 : SW_F32, kb = bbf ? SW_BF16 : SW_F32;
    c.a[0] = (sw_arg){"a", ka, 2, {layout == 2 ? k : m, layout == 2 ? m : k, 0}, 0, -1, 0};
    c.a[1] = (sw_arg){"b", kb, 2, {layout == 0 ? n : k, layout == 0 ? k : n, 0}, 0, -1, 0};
    c.a[2] = (sw_arg)F32("c", 1, m, n);
    sw_run(&r, &c, &cases);
  }
  for (int it = 0; it < 6 && !bxt_failures(); it++) { /* SwiGLU, both layouts, both ways */
    int64_t rows = 1 + (int64_t)bxt_below(&r, 9), f = 1 + (int64_t)bxt_below(&r, 300);
    sw_case a = {"swiglu_forward", 3, {F32("gate", 0, rows, f), F32("up", 0, rows, f),
                                       F32("h", 1, rows, f)}, {0}, {0}, call_swiglu_fwd, NULL};
    sw_run(&r, &a, &cases);
    sw_case b = {"swiglu_backward", 5, {F32("gate", 0, rows, f), F32("up", 0, rows, f),
                                        F32("dh", 0, rows, f), F32("dgate", 1, rows, f),
                                        F32("dup", 1, rows, f)}, {0}, {0}, call_swiglu_bwd, NULL};
    sw_run(&r, &b, &cases);
    sw_case fa = {"swiglu_forward_fused", 2, {F32("gate_up", 0, rows, 2 * f), F32("h", 1, rows, f)},
                  {0}, {0}, call_swiglu_fused_fwd, NULL};
    sw_run(&r, &fa, &cases);
    sw_case fb = {"swiglu_backward_fused (in place)", 3,
                  {F32("gate_up", 1, rows, 2 * f), F32("dh", 0, rows, f), F32("dgate_up", 1, rows, 2 * f)},
                  {0}, {0}, call_swiglu_fused_bwd, NULL};
    fb.a[2].alias = 0;
    sw_run(&r, &fb, &cases);
  }
  for (int it = 0; it < 6 && !bxt_failures(); it++) { /* RMSNorm */
    int64_t rows = 1 + (int64_t)bxt_below(&r, 40), h = 1 + (int64_t)bxt_below(&r, 200);
    int64_t chunk = 1 + (int64_t)bxt_below(&r, 12), nch = (rows + chunk - 1) / chunk;
    sw_case f = {"rmsnorm_forward", 4, {F32("x", 0, rows, h), F32_1("weight", 0, h),
                                        F32("y", 1, rows, h), F32_1("rstd", 1, rows)},
                 {0}, {1e-6, 0}, call_rms_fwd, NULL};
    sw_run(&r, &f, &cases);
    sw_case b = {"rmsnorm_backward", 6, {F32("x", 0, rows, h), F32_1("weight", 0, h),
                                         F32("dy", 0, rows, h), F32_1("rstd", 0, rows),
                                         F32("dx", 1, rows, h), F32("dweight_partials", 1, nch, h)},
                 {chunk, 0, 0, 0}, {0, 0}, call_rms_bwd, NULL};
    sw_run(&r, &b, &cases);
  }
  for (int it = 0; it < 6 && !bxt_failures(); it++) { /* RoPE, forward and backward */
    int64_t T = 1 + (int64_t)bxt_below(&r, 20), hd = 2 * (1 + (int64_t)bxt_below(&r, 16));
    int64_t heads = 1 + (int64_t)bxt_below(&r, 4), rot = 2 * (1 + (int64_t)bxt_below(&r, hd / 2));
    sw_case c = {it % 2 ? "rope_backward" : "rope_forward", 3,
                 {F32("x", 0, T, heads * hd), {"positions", SW_I64, 1, {T, 0, 0}, 0, -1, 5000},
                  F32("y", 1, T, heads * hd)},
                 {hd, rot, it % 2, 0}, {it % 3 ? 10000.0 : 1e6, 0}, call_rope, NULL};
    sw_run(&r, &c, &cases);
  }
  for (int it = 0; it < 4 && !bxt_failures(); it++) { /* AdamW */
    int64_t n = 1 + (int64_t)bxt_below(&r, 3000);
    sw_case c = {"adamw_step", 4, {F32_1("param", 1, n), F32_1("grad", 0, n), F32_1("exp_avg", 1, n),
                                   F32_1("exp_avg_sq", 1, n)},
                 {1 + (int64_t)bxt_below(&r, 1000), 0, 0, 0}, {1e-3, it % 2 ? 0.1 : 0.0}, call_adamw, NULL};
    sw_run(&r, &c, &cases);
  }
  for (int it = 0; it < 8 && !bxt_failures(); it++) { /* MoE router, forward and backward */
    int64_t S = 2 + (int64_t)bxt_below(&r, 7), G = 1 + (int64_t)bxt_below(&r, 4);
    if (it == 3) S = 64, G = 4; /* E = 256, the device's most */
    int64_t E = S * G, kg = 1 + (int64_t)bxt_below(&r, (uint64_t)G), T = (int64_t)bxt_below(&r, 40);
    int64_t kmax = kg * S < 32 ? kg * S : 32, k = 1 + (int64_t)bxt_below(&r, (uint64_t)kmax);
    int64_t chunk = 1 + (int64_t)bxt_below(&r, 9), nch = (T + chunk - 1) / chunk;
    int idk = it % 2 ? SW_I32 : SW_I64;
    double rsf = it % 3 ? 2.5 : 1.0, norm = (double)(it % 2 == 0);
    sw_case f = {"moe_router_forward", 5,
                 {{"logits", SW_F32, 2, {T, E, 0}, 0, -1, SW_NO_NAN},
                  {"bias", SW_F32, 1, {E, 0, 0}, 0, -1, SW_FINITE},
                  {"topk_ids", idk, 2, {T, k, 0}, 1, -1, 1},
                  F32("topk_weights", 1, T, k),
                  {"counts", SW_I64, 2, {nch, E, 0}, 1, -1, 1}},
                 {chunk, G, kg, it % 4 != 1}, {rsf, norm}, call_router_fwd, NULL};
    sw_run(&r, &f, &cases);
    int64_t Eb = 1 + (int64_t)bxt_below(&r, 64), kb = 1 + (int64_t)bxt_below(&r, (uint64_t)(Eb < 32 ? Eb : 32));
    sw_case b = {"moe_router_backward", 4,
                 {F32("logits", 0, T, Eb), {"topk_ids", idk, 2, {T, kb, 0}, 0, -1, 1},
                  F32("dweights", 0, T, kb), F32("dlogits", 1, T, Eb)},
                 {0}, {rsf, norm}, call_router_bwd, prep_router_ids};
    sw_run(&r, &b, &cases);
  }
  for (int it = 0; it < 8 && !bxt_failures(); it++) { /* token dispatch: permute, unpermute */
    int64_t T = it == 0 ? 0 : (int64_t)bxt_below(&r, 30), E = 1 + (int64_t)bxt_below(&r, 12);
    int64_t k = 1 + (int64_t)bxt_below(&r, (uint64_t)E), H = it == 1 ? 0 : 1 + (int64_t)bxt_below(&r, 70);
    int64_t R = T * k;
    sw_arg rm = {"row_map", SW_I64, 2, {R, 2, 0}, 0, -1, 1}, pos = {"pos", SW_I64, 2, {T, k, 0}, 0, -1, 1};
    sw_case p = {"moe_permute", 3, {F32("x", 0, T, H), rm, F32("x_perm", 1, R, H)},
                 {E, k, 1, -1}, {0}, call_permute, prep_plan};
    sw_run(&r, &p, &cases);
    sw_case pb = {"moe_permute_backward", 4, {F32("dx_perm", 0, R, H), rm, pos, F32("dx", 1, T, H)},
                  {E, k, 1, 2}, {0}, call_permute_bwd, prep_plan};
    sw_run(&r, &pb, &cases);
    sw_case u = {"moe_unpermute", 6,
                 {F32("y_perm", 0, R, H), F32("weights", 0, T, k), rm, pos, F32("initial", 0, T, H),
                  F32("out", 1, T, H)},
                 {E, k, 2, 3}, {(double)(it % 2), 0}, call_unpermute, prep_plan};
    sw_run(&r, &u, &cases);
    sw_case ub = {"moe_unpermute_backward", 7,
                  {F32("dout", 0, T, H), F32("y_perm", 0, R, H), F32("weights", 0, T, k), rm, pos,
                   F32("dy_perm", 1, R, H), F32("dweights", 1, T, k)},
                  {E, k, 3, 4}, {(double)(it % 3), 0}, call_unpermute_bwd, prep_plan};
    sw_run(&r, &ub, &cases);
  }
  for (int it = 0; it < 6 && !bxt_failures(); it++) { /* embedding, forward and backward */
    int64_t V = 1 + (int64_t)bxt_below(&r, 20), T = it == 0 ? 0 : (int64_t)bxt_below(&r, 50);
    int64_t H = 1 + (int64_t)bxt_below(&r, 40), chunk = 1 + (int64_t)bxt_below(&r, 12);
    int64_t nch = (T + chunk - 1) / chunk;
    int idk = it % 2 ? SW_I32 : SW_I64;
    sw_case f = {"embedding_forward", 3,
                 {F32("weight", 0, V, H), {"ids", idk, 1, {T, 0, 0}, 0, -1, V}, F32("y", 1, T, H)},
                 {0}, {0}, call_embedding_fwd, NULL};
    sw_run(&r, &f, &cases);
    sw_case b = {"embedding_backward", 5,
                 {{"ids", idk, 1, {T, 0, 0}, 0, -1, V}, F32("dy", 0, T, H),
                  {"row_ids", SW_I64, 1, {T, 0, 0}, 1, -1, 1}, F32("rows", 1, T, H),
                  {"offsets", SW_I64, 1, {nch + 1, 0, 0}, 1, -1, 1}},
                 {V, chunk, it % 3 ? -1 : (int64_t)bxt_below(&r, (uint64_t)V), 0}, {0}, call_embedding_bwd, NULL};
    sw_run(&r, &b, &cases);
  }
  for (int it = 0; it < 8 && !bxt_failures(); it++) { /* cross-entropy */
    int64_t T = 1 + (int64_t)bxt_below(&r, 24), V = 1 + (int64_t)bxt_below(&r, 300);
    int64_t chunk = 1 + (int64_t)bxt_below(&r, 8), nch = (T + chunk - 1) / chunk;
    int64_t ign = it % 2 ? -100 : (int64_t)bxt_below(&r, (uint64_t)V), ng = T + (int64_t)bxt_below(&r, 100);
    int idk = it % 3 ? SW_I64 : SW_I32, nulls = it % 4;
    sw_arg z = {"logits", SW_F32, 2, {T, V, 0}, 0, -1, it % 2 ? SW_FINITE : 0};
    sw_arg y = {"targets", idk, 1, {T, 0, 0}, 0, -1, V};
    sw_arg cn = {"counts", SW_I64, 1, {nch, 0, 0}, 1, -1, 1};
    sw_case fb = {"xent_forward_backward", 6,
                  {z, y, F32_1("losses", 1, T), F32_1("loss_partials", 1, nch), cn, F32("dlogits", 1, T, V)},
                  {chunk, ign, ng, nulls}, {it % 3 ? 1.0 : 0.37, 0}, call_xent_fb, NULL};
    sw_run(&r, &fb, &cases);
    sw_case fbi = fb; /* in place: dlogits is logits */
    fbi.name = "xent_forward_backward (in place)";
    fbi.a[0].out = 1;
    fbi.a[5].alias = 0;
    sw_run(&r, &fbi, &cases);
    sw_case f = {"xent_forward", 5,
                 {z, y, F32_1("losses", 1, T), F32_1("loss_partials", 1, nch), cn},
                 {chunk, ign, 0, nulls}, {0}, call_xent_fwd, NULL};
    sw_run(&r, &f, &cases);
    sw_case b = {"xent_backward", 3, {z, y, F32("dlogits", 1, T, V)},
                 {chunk, ign, ng, 0}, {it % 3 ? 1.0 : 0.37, 0}, call_xent_bwd, NULL};
    if (it % 2) { /* in place */
      b.name = "xent_backward (in place)";
      b.a[0].out = 1;
      b.a[2].alias = 0;
    }
    sw_run(&r, &b, &cases);
  }
  for (int it = 0; it < 8 && !bxt_failures(); it++) { /* bx_tokred_bound / _add on device partials */
    int64_t nch = 1 + (int64_t)bxt_below(&r, 6), m = 1 + (int64_t)bxt_below(&r, 3000);
    if (it == 1) m = 70000; /* several maxabs blocks per chunk */
    int mode = it % 4 == 3, stated = it % 4 == 2, flag = it == 6;
    sw_case c = {"tokred_add", 4,
                 {{"partials", SW_F32, 2, {nch, m, 0}, 0, -1, it % 3 ? SW_FINITE : 0},
                  {"words", SW_I64, 1, {m + 1 + nch, 0, 0}, 1, -1, 1}, F32_1("sum", 1, m),
                  {"error", SW_I64, 1, {64, 0, 0}, 1, -1, 1}},
                 {mode, stated, flag, it % 2}, {0}, call_tokred_add, NULL};
    sw_run(&r, &c, &cases);
  }
  for (int it = 0; it < 12 && !bxt_failures(); it++) { /* bx_linear_wgrad(_bound) on device dy, x */
    int64_t t = 1 + (int64_t)bxt_below(&r, 90), n = 1 + (int64_t)bxt_below(&r, 140);
    int64_t k = 1 + (int64_t)bxt_below(&r, 100), C = 1 + (int64_t)bxt_below(&r, 40);
    if (it == 0) t = 64, n = 64, k = 64, C = 64; /* whole tiles, one chunk */
    if (it == 1) t = 200, n = 3, k = 2, C = 1;  /* many chunk groups */
    int64_t nch = (t + C - 1) / C;
    int which = it % 3, mode = it % 5 == 4, stated = it % 5 == 3, flag = it == 8;
    int64_t nw = (which != 2 ? n * k + 1 + nch : 0) + (which != 1 ? n + 1 + nch : 0);
    int kd = bxt_below(&r, 2) ? SW_BF16 : SW_F32, kx = bxt_below(&r, 2) ? SW_BF16 : SW_F32;
    int vals = it % 4 ? SW_FINITE : 0;
    sw_case c = {"linear_wgrad", 6,
                 {{"dy", kd, 2, {t, n, 0}, 0, -1, vals}, {"x", kx, 2, {t, k, 0}, 0, -1, vals},
                  {"words", SW_I64, 1, {nw, 0, 0}, 1, -1, 1}, F32("dweight", 1, n, k),
                  F32_1("dbias", 1, n), {"error", SW_I64, 1, {64, 0, 0}, 1, -1, 1}},
                 {C, mode, stated, which}, {flag, 0}, call_linear_wgrad, NULL};
    sw_run(&r, &c, &cases);
  }
  for (int it = 0; it < 8 && !bxt_failures(); it++) { /* attention, forward then backward */
    int64_t L = 1 + (int64_t)bxt_below(&r, 24), B = 1 + (int64_t)bxt_below(&r, 3), T = B * L;
    int64_t Hkv = 1 + (int64_t)bxt_below(&r, 3), Hq = Hkv * (1 + (int64_t)bxt_below(&r, 4));
    int64_t D = 1 + (int64_t)bxt_below(&r, 40);
    sw_case c = {"attention_forward_backward", 9,
                 {F32("q", 0, T, Hq * D), F32("k", 0, T, Hkv * D), F32("v", 0, T, Hkv * D),
                  F32("dout", 0, T, Hq * D), F32("o", 1, T, Hq * D),
                  {"stats", SW_F32, 3, {T, Hq, 2}, 1, -1, 0}, F32("dq", 1, T, Hq * D),
                  F32("dk", 1, T, Hkv * D), F32("dv", 1, T, Hkv * D)},
                 {L, Hq, Hkv, D}, {0, 0}, call_attention, NULL};
    sw_run(&r, &c, &cases);
  }
  for (int it = 0; it < 16 && !bxt_failures(); it++) { /* the elementwise math, bx_round_bf16 */
    int64_t n = 1 + (int64_t)bxt_below(&r, it < 8 ? 700 : 5000);
    int op = it % 8, cuda = (it / 8) % 2;
    static const char *names[8] = {"exp", "log", "sigmoid", "silu", "rsqrt", "sin", "cos",
                                   "round_bf16"};
    sw_case c = {names[op], 2, {F32_1("x", 0, n), F32_1("y", 1, n)}, {op, cuda, 0, 0}, {0, 0},
                 call_math, NULL};
    if (op == 7) c.a[1] = (sw_arg){"y", SW_BF16, 1, {n, 0, 0}, 1, -1, 0};
    sw_run(&r, &c, &cases);
    if (op < 7 && it % 3 == 0) { /* in place */
      c.a[0].out = 1;
      c.a[1].alias = 0;
      sw_run(&r, &c, &cases);
    }
  }
  for (int it = 0; it < 8 && !bxt_failures(); it++) { /* bx_rope_cos_sin */
    int64_t T = 1 + (int64_t)bxt_below(&r, 30), half = 1 + (int64_t)bxt_below(&r, 64);
    int64_t bad = it % 4 == 3 ? 1 + (int64_t)bxt_below(&r, (uint64_t)T) : 0;
    sw_case c = {bad ? "rope_cos_sin (bad position)" : "rope_cos_sin", 3,
                 {{"positions", SW_I64, 1, {T, 0, 0}, 0, -1, 70000}, F32("cos", 1, T, half),
                  F32("sin", 1, T, half)},
                 {2 * half, it % 2, bad, it % 8 == 7}, {it % 3 ? 10000.0 : 5e5, 0}, call_rope_table,
                 prep_bad_position};
    sw_run(&r, &c, &cases);
  }
  for (int it = 0; it < 10 && !bxt_failures(); it++) { /* bx_bias_grad_partials */
    int64_t t = 1 + (int64_t)bxt_below(&r, 80), n = 1 + (int64_t)bxt_below(&r, 400);
    int64_t C = it % 5 == 1 ? 1 : it % 5 == 2 ? t + 3 : 1 + (int64_t)bxt_below(&r, 30);
    int64_t nch = (t + C - 1) / C;
    int kd = it % 2 ? SW_BF16 : SW_F32;
    sw_case c = {"bias_grad_partials", 2,
                 {{"dy", kd, 2, {t, n, 0}, 0, -1, it % 3 ? 0 : SW_FINITE},
                  F32("partials", 1, nch, n)},
                 {C, (it / 2) % 2, 0, 0}, {0, 0}, call_bias_partials, NULL};
    sw_run(&r, &c, &cases);
  }
  printf("  note: %d cases, each bit for bit against the host\n", cases);
  if (sim) bx_train_device_use_sim(0);
}
