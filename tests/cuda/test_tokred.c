/*
 * test_tokred.c — the token reduction on CUDA partials and over NCCL
 * (issue 30; src/cuda/train/tokred.cu): a state fed the device's tensors
 * must hold the words of a state fed the same bytes on the host, bit for
 * bit (memcmp of the words: grid words, non-finite counts, coverage), with
 * the same agreed grid, observed exponents, errors (status and message)
 * and, in the ordinary mode, the same finished fp32 sums; a one-rank NCCL
 * communicator must leave the words as a host run does.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bitexact_train.h"
#include "ct.h"
#include "cuda_tests.h"

#if BX_TEST_NCCL
#include <nccl.h>

#include "bitexact_nccl.h"
#endif

/* Mostly ordinary values over a random range of binades, with specials
 * (+-0, subnormals, +-Inf, NaN) when specials. */
static float tk_value(ct_rng *r, int specials, int wide) {
  uint64_t k = ct_below(r, 64);
  if (specials && k < 3) {
    static const uint32_t sp[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x807FFFFFu,
                                  0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFA5A5A5u};
    uint32_t b = sp[ct_below(r, 8)];
    float f;
    memcpy(&f, &b, 4);
    return f;
  }
  if (k < 6) return (float)(int)ct_below(r, 9) - 4.0f;
  return ldexpf((float)ct_normal(r), wide ? (int)ct_below(r, 60) - 30 : 0);
}

static void *tk_dev(const void *host, size_t bytes) {
  void *d = NULL;
  if (!CT_CUDA(cudaMalloc(&d, bytes ? bytes : 1))) return NULL;
  if (bytes && !ct_h2d(d, host, bytes)) {
    cudaFree(d);
    return NULL;
  }
  return d;
}

static DLTensor tk_view(void *data, int cuda, int bf16, int ndim, int64_t *shape) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = cuda ? kDLCUDA : kDLCPU;
  if (cuda) cudaGetDevice(&t.device.device_id);
  t.ndim = ndim;
  t.dtype.code = bf16 ? kDLBfloat : kDLFloat;
  t.dtype.bits = bf16 ? 16 : 32;
  t.dtype.lanes = 1;
  t.shape = shape;
  return t;
}

/* The two states' words equal (memcmp), and their grid and observations. */
static void tk_same(bx_tokred *h, bx_tokred *d, size_t nt, const char *label) {
  int64_t *wh, *wd;
  size_t nh, nd;
  if (!CT_CHECK(bx_tokred_words(h, &wh, &nh) == BX_OK && bx_tokred_words(d, &wd, &nd) == BX_OK &&
                    nh == nd, "%s: words", label))
    return;
  size_t i = 0;
  while (i < nh && wh[i] == wd[i]) i++;
  CT_CHECK(i == nh, "%s: word %zu of %zu: device %lld, host %lld", label, i, nh,
           (long long)(i < nh ? wd[i] : 0), (long long)(i < nh ? wh[i] : 0));
  for (size_t t = 0; t < nt; t++) {
    int eh = 0, ed = 1, oh = 0, od = 1;
    int64_t fh = 0, fd = 1;
    bx_tokred_grid_exp(h, t, &eh);
    bx_tokred_grid_exp(d, t, &ed);
    bx_tokred_observed(h, t, &oh, &fh);
    bx_tokred_observed(d, t, &od, &fd);
    CT_CHECK(eh == ed && oh == od && fh == fd, "%s: tensor %zu: grid 2^%d / 2^%d, observed 2^%d / "
             "2^%d, flagged %lld / %lld (device / host)", label, t, ed, eh, od, oh, (long long)fd,
             (long long)fh);
  }
}

void test_tokred_device(void) {
  ct_rng r;
  ct_rng_init(&r);
  for (int it = 0; it < 24 && !ct_failures(); it++) {
    int64_t rows = 1 + (int64_t)ct_below(&r, 16), cols = 1 + (int64_t)ct_below(&r, it < 4 ? 70000 : 700);
    size_t n = (size_t)(rows * cols);
    int64_t C = 1 + (int64_t)ct_below(&r, 4), nch = 1 + (int64_t)ct_below(&r, 6);
    int64_t total = (nch - 1) * C + 1 + (int64_t)ct_below(&r, (uint64_t)C);
    int specials = (int)ct_below(&r, 2), wide = (int)ct_below(&r, 2), mode = it % 4 == 3;
    int64_t shape[2] = {rows, cols};
    float *h = malloc(n * (size_t)nch * sizeof *h);
    if (!CT_CHECK(h != NULL, "out of host memory")) return;
    for (size_t i = 0; i < n * (size_t)nch; i++) h[i] = tk_value(&r, specials, wide);
    float *d = tk_dev(h, n * (size_t)nch * sizeof *h);
    if (!d) {
      free(h);
      return;
    }
    DLTensor g = tk_view(NULL, 0, 0, 2, shape);
    bx_tokred_opts o = BX_TOKRED_OPTS_DEFAULT;
    o.mode = mode ? BX_TOKRED_ORDINARY : BX_TOKRED_GRID;
    bx_tokred *s[2] = {NULL, NULL};
    char label[96];
    snprintf(label, sizeof label, "tokred %lld x %lld, %lld chunks, mode %d", (long long)rows,
             (long long)cols, (long long)nch, mode);
    for (int dev = 0; dev < 2; dev++) {
      CT_STATUS(bx_tokred_create(&g, 1, C, total, &o, &s[dev]), BX_OK, "%s: create", label);
      for (int64_t c = 0; c < nch; c++) {
        DLTensor p = tk_view(dev ? d + c * (int64_t)n : h + c * (int64_t)n, dev, 0, 2, shape);
        CT_STATUS(bx_tokred_bound(s[dev], 0, c, &p), BX_OK, "%s: bound (device %d)", label, dev);
      }
      CT_STATUS(bx_tokred_agree(s[dev], NULL), BX_OK, "%s: agree", label);
      for (int64_t c = 0; c < nch; c++) {
        DLTensor p = tk_view(dev ? d + c * (int64_t)n : h + c * (int64_t)n, dev, 0, 2, shape);
        CT_STATUS(bx_tokred_add(s[dev], 0, c, &p), BX_OK, "%s: add (device %d)", label, dev);
      }
    }
    if (!mode) {
      tk_same(s[0], s[1], 1, label);
    } else { /* the ordinary mode: the finished fp32 sums */
      float *o0 = malloc(n * 4), *o1 = malloc(n * 4);
      DLTensor t0 = tk_view(o0, 0, 0, 2, shape), t1 = tk_view(o1, 0, 0, 2, shape);
      bx_status a = bx_tokred_finish(s[0], &t0, 1, 1), b = bx_tokred_finish(s[1], &t1, 1, 1);
      CT_CHECK(a == b && (a != BX_OK || memcmp(o0, o1, n * 4) == 0), "%s: finish %s / %s", label,
               bx_status_str(b), bx_status_str(a));
      free(o0), free(o1);
    }
    /* a stated bound below the largest element: the same refusal, nothing added */
    if (!mode) {
      char msg[2][512];
      bx_status st[2];
      int64_t c = (int64_t)ct_below(&r, (uint64_t)nch);
      for (int dev = 0; dev < 2; dev++) {
        bx_tokred *f = NULL;
        bx_tokred_create(&g, 1, C, total, NULL, &f);
        bx_tokred_bound_exp(f, 0, -20);
        bx_tokred_agree(f, NULL);
        DLTensor p = tk_view(dev ? d + c * (int64_t)n : h + c * (int64_t)n, dev, 0, 2, shape);
        st[dev] = bx_tokred_add(f, 0, c, &p);
        snprintf(msg[dev], sizeof msg[dev], "%s", st[dev] == BX_OK ? "" : bx_last_error());
        int64_t *w;
        size_t nw, z = 0;
        bx_tokred_words(f, &w, &nw);
        while (st[dev] != BX_OK && z < nw && w[z] == 0) z++;
        CT_CHECK(st[dev] == BX_OK || z == nw, "%s: a refused add (device %d) left word %zu", label,
                 dev, z);
        bx_tokred_destroy(f);
      }
      CT_CHECK(st[0] == st[1] && strcmp(msg[0], msg[1]) == 0,
               "%s: stated bound: device %s (%s), host %s (%s)", label, bx_status_str(st[1]), msg[1],
               bx_status_str(st[0]), msg[0]);
    }
    bx_tokred_destroy(s[0]);
    bx_tokred_destroy(s[1]);
    cudaFree(d);
    free(h);
  }
}

/* dy [T, N] and x [T, K] (fp32 or bf16) on the host and on the device. */
static void *tk_operand(ct_rng *r, size_t n, int bf16, int specials, int wide) {
  void *h = malloc((n ? n : 1) * (bf16 ? 2 : 4));
  if (!h) return NULL;
  for (size_t i = 0; i < n; i++) {
    float v = tk_value(r, specials, wide);
    if (bf16) {
      uint32_t b;
      memcpy(&b, &v, 4);
      ((uint16_t *)h)[i] = (uint16_t)(b >> 16);
    } else {
      ((float *)h)[i] = v;
    }
  }
  return h;
}

void test_wgrad_device(void) {
  ct_rng r;
  ct_rng_init(&r);
  for (int it = 0; it < 24 && !ct_failures(); it++) {
    size_t T = 1 + ct_below(&r, it < 4 ? 600 : 80), N = 1 + ct_below(&r, it < 4 ? 300 : 90);
    size_t K = 1 + ct_below(&r, it < 4 ? 200 : 90), C = 1 + ct_below(&r, it % 2 ? 8 : 70);
    int dbf = (int)ct_below(&r, 2), xbf = (int)ct_below(&r, 2), specials = ct_below(&r, 3) == 0;
    int wide = (int)ct_below(&r, 2), mode = it % 5 == 4, with_w = mode || ct_below(&r, 6) != 0;
    int with_b = mode || !with_w || ct_below(&r, 3) != 0;
    int64_t tb = mode ? 0 : (int64_t)(C * ct_below(&r, 3)); /* ordinary: the whole batch here */
    int64_t total = tb + (int64_t)T + (T % C || mode ? 0 : (int64_t)(C * ct_below(&r, 2)));
    void *hdy = tk_operand(&r, T * N, dbf, specials, wide), *hx = tk_operand(&r, T * K, xbf, specials, wide);
    void *ddy = hdy ? tk_dev(hdy, T * N * (dbf ? 2 : 4)) : NULL;
    void *dx = hx ? tk_dev(hx, T * K * (xbf ? 2 : 4)) : NULL;
    int64_t sdy[2] = {(int64_t)T, (int64_t)N}, sx[2] = {(int64_t)T, (int64_t)K};
    int64_t sw[2] = {(int64_t)N, (int64_t)K}, sb[1] = {(int64_t)N};
    DLTensor grads[2] = {tk_view(NULL, 0, 0, 2, sw), tk_view(NULL, 0, 0, 1, sb)};
    size_t wt = with_w ? 0 : BX_WGRAD_NONE, bt = with_b ? 1 : BX_WGRAD_NONE;
    bx_tokred_opts o = BX_TOKRED_OPTS_DEFAULT;
    o.mode = mode ? BX_TOKRED_ORDINARY : BX_TOKRED_GRID;
    char label[128];
    snprintf(label, sizeof label, "wgrad T %zu N %zu K %zu C %zu bf16 %d/%d w %d b %d mode %d", T, N,
             K, C, dbf, xbf, with_w, with_b, mode);
    bx_tokred *s[2] = {NULL, NULL};
    for (int dev = 0; dev < 2 && ddy && dx; dev++) {
      DLTensor tdy = tk_view(dev ? ddy : hdy, dev, dbf, 2, sdy), tx = tk_view(dev ? dx : hx, dev, xbf, 2, sx);
      CT_STATUS(bx_tokred_create(grads, 2, (int64_t)C, total, &o, &s[dev]), BX_OK, "%s: create", label);
      CT_STATUS(bx_linear_wgrad_bound(s[dev], wt, bt, &tdy, with_w ? &tx : NULL, tb, NULL), BX_OK,
                "%s: bound (device %d)", label, dev);
      CT_STATUS(bx_tokred_agree(s[dev], NULL), BX_OK, "%s: agree", label);
      CT_STATUS(bx_linear_wgrad(s[dev], wt, bt, &tdy, with_w ? &tx : NULL, tb, NULL), BX_OK,
                "%s: wgrad (device %d)", label, dev);
    }
    if (s[0] && s[1] && !mode) tk_same(s[0], s[1], 2, label);
    if (s[0] && s[1] && mode) { /* the fp32 sums, finished (every chunk local: below) */
      float *o0 = malloc((N * K + N) * 4), *o1 = malloc((N * K + N) * 4);
      DLTensor t0[2] = {tk_view(o0, 0, 0, 2, sw), tk_view(o0 + N * K, 0, 0, 1, sb)};
      DLTensor t1[2] = {tk_view(o1, 0, 0, 2, sw), tk_view(o1 + N * K, 0, 0, 1, sb)};
      bx_status a = bx_tokred_finish(s[0], t0, 2, 1), b = bx_tokred_finish(s[1], t1, 2, 1);
      CT_CHECK(a == b && (a != BX_OK || memcmp(o0, o1, (N * K + N) * 4) == 0),
               "%s: finish %s / %s", label, bx_status_str(b), bx_status_str(a));
      free(o0), free(o1);
    }
    /* a stated bound too small for the weight (or the bias): the same refusal */
    if (s[0] && s[1] && !mode) {
      char msg[2][512];
      bx_status st[2];
      for (int dev = 0; dev < 2; dev++) {
        DLTensor tdy = tk_view(dev ? ddy : hdy, dev, dbf, 2, sdy), tx = tk_view(dev ? dx : hx, dev, xbf, 2, sx);
        bx_tokred *f = NULL;
        bx_tokred_create(grads, 2, (int64_t)C, total, NULL, &f);
        bx_tokred_bound_exp(f, 0, with_w ? -10 : 128);
        bx_tokred_bound_exp(f, 1, with_w ? 128 : -10);
        bx_tokred_agree(f, NULL);
        st[dev] = bx_linear_wgrad(f, wt, bt, &tdy, with_w ? &tx : NULL, tb, NULL);
        snprintf(msg[dev], sizeof msg[dev], "%s", st[dev] == BX_OK ? "" : bx_last_error());
        int64_t *w;
        size_t nw, z = 0;
        bx_tokred_words(f, &w, &nw);
        while (st[dev] != BX_OK && z < nw && w[z] == 0) z++;
        CT_CHECK(st[dev] == BX_OK || z == nw, "%s: a refused call (device %d) left word %zu", label,
                 dev, z);
        bx_tokred_destroy(f);
      }
      CT_CHECK(st[0] == st[1] && strcmp(msg[0], msg[1]) == 0,
               "%s: stated bound: device %s (%s), host %s (%s)", label, bx_status_str(st[1]), msg[1],
               bx_status_str(st[0]), msg[0]);
    }
    bx_tokred_destroy(s[0]);
    bx_tokred_destroy(s[1]);
    if (ddy) cudaFree(ddy);
    if (dx) cudaFree(dx);
    free(hdy), free(hx);
  }
}

/* The token reduction through a one-rank NCCL communicator (bx_comm_nccl):
 * agree and allreduce stage the words through device memory; the words,
 * grid and observations must be those of the same adds without a
 * communicator, in both modes. */
void test_nccl_tokred(void) {
#if BX_TEST_NCCL
  ct_rng r;
  ct_rng_init(&r);
  ncclComm_t comm = NULL;
  cudaStream_t st = NULL;
  int dev = 0;
  cudaGetDevice(&dev);
  ncclResult_t rc = ncclCommInitAll(&comm, 1, &dev);
  if (!CT_CHECK(rc == ncclSuccess, "ncclCommInitAll(1 device): %s", ncclGetErrorString(rc))) return;
  if (!CT_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking))) {
    ncclCommDestroy(comm);
    return;
  }
  bx_comm c = bx_comm_nccl(comm, st);
  for (int mode = 0; mode < 2 && !ct_failures(); mode++) {
    int64_t shape[2] = {37, 53}, C = 5, total = 23, nch = 5;
    size_t n = 37 * 53;
    float *h = malloc(n * (size_t)nch * sizeof *h);
    for (size_t i = 0; i < n * (size_t)nch; i++) h[i] = tk_value(&r, 0, 1);
    DLTensor g = tk_view(NULL, 0, 0, 2, shape);
    bx_tokred_opts o = BX_TOKRED_OPTS_DEFAULT;
    o.mode = mode ? BX_TOKRED_ORDINARY : BX_TOKRED_GRID;
    bx_tokred *s[2] = {NULL, NULL};
    float out[2][37 * 53];
    bx_status fs[2];
    for (int k = 0; k < 2; k++) {
      const bx_comm *cm = k ? &c : NULL;
      CT_STATUS(bx_tokred_create(&g, 1, C, total, &o, &s[k]), BX_OK, "create");
      for (int64_t j = 0; j < nch; j++) {
        DLTensor p = tk_view(h + j * (int64_t)n, 0, 0, 2, shape);
        CT_STATUS(bx_tokred_bound(s[k], 0, j, &p), BX_OK, "bound");
      }
      CT_STATUS(bx_tokred_agree(s[k], cm), BX_OK, "agree (NCCL %d): %s", k, bx_last_error());
      for (int64_t j = 0; j < nch; j++) {
        DLTensor p = tk_view(h + j * (int64_t)n, 0, 0, 2, shape);
        CT_STATUS(bx_tokred_add(s[k], 0, j, &p), BX_OK, "add");
      }
      if (k) CT_STATUS(bx_tokred_allreduce(s[k], cm), BX_OK, "allreduce (NCCL): %s", bx_last_error());
      DLTensor t = tk_view(out[k], 0, 0, 2, shape);
      fs[k] = bx_tokred_finish(s[k], &t, 1, total);
    }
    if (!mode) tk_same(s[0], s[1], 1, "NCCL tokred");
    CT_CHECK(fs[0] == fs[1] && (fs[0] != BX_OK || memcmp(out[0], out[1], sizeof out[0]) == 0),
             "NCCL tokred mode %d: finish %s / %s", mode, bx_status_str(fs[1]), bx_status_str(fs[0]));
    bx_tokred_destroy(s[0]);
    bx_tokred_destroy(s[1]);
    free(h);
  }
  cudaStreamSynchronize(st);
  ncclCommDestroy(comm);
  cudaStreamDestroy(st);
#else
  ct_skip("built without NCCL");
#endif
}
