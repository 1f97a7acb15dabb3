/*
 * test_norm.c — bx_total_norm on kDLCUDA tensors (the blocking API) against
 * the CPU backend on the same bytes, bit for bit: every dtype, every exact
 * norm_type, every data set, per-group norms, thousands of small tensors, a
 * few large ones and one tensor of more than 2^31 elements; other p too
 * (one power function, bx_pow_det, on both).
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ct.h"
#include "cuda_tests.h"

#define MAX_GROUPS 8

int ct_compare_norm(const ct_set *s, size_t ngroups, const bx_comm *comm,
                    const bx_norm_opts *o, const char *label) {
  bx_group gc[MAX_GROUPS], gg[MAX_GROUPS];
  double tc = -1, tg = -2, nc[MAX_GROUPS], ng[MAX_GROUPS];
  ct_groups(s, ngroups, gc, gg);
  bx_status sc = bx_total_norm(gc, ngroups, NULL, o, &tc, nc);
  char cpu_err[512];
  snprintf(cpu_err, sizeof cpu_err, "%s", bx_last_error());
  bx_status sg = bx_total_norm(gg, ngroups, comm, o, &tg, ng);
  if (!CT_STATUS(sg, sc, "%s: GPU status vs CPU status", label)) return 0;
  if (sc != BX_OK) {
    char want[96];
    snprintf(want, sizeof want, "%s", ct_tensor_ref(cpu_err));
    return CT_CHECK(strstr(bx_last_error(), want) != NULL,
                    "%s: GPU error \"%s\" does not name \"%s\" as the CPU's \"%s\"", label,
                    bx_last_error(), want, cpu_err);
  }
  int ok = CT_BITS(tg, tc, "%s: total norm", label);
  for (size_t g = 0; g < ngroups; g++) ok &= CT_BITS(ng[g], nc[g], "%s: group %zu norm", label, g);
  return ok;
}

static const int64_t SIZES[] = {0, 1, 3, 1000, 4097, 65541, 300007};
#define NSIZES (sizeof SIZES / sizeof SIZES[0])

/* The standard set: SIZES of one dtype, or of all dtypes in turn (dt < 0). */
static int standard_set(ct_set *s, int dt, int misalign, ct_rng *r) {
  int dts[NSIZES];
  for (size_t i = 0; i < NSIZES; i++) dts[i] = dt >= 0 ? dt : (int)(i % CT_NDT);
  return ct_set_init(s, NSIZES, dts, SIZES, misalign, r);
}

void test_norm_dtypes_datasets(void) {
  ct_rng r;
  ct_rng_init(&r);
  for (int dt = -1; dt < CT_NDT; dt++) {
    ct_set s;
    if (!standard_set(&s, dt, dt & 1, &r)) return;
    for (int data = 0; data < CT_NDATA; data++) {
      ct_fill(&s, data, &r);
      for (int k = 0; k < CT_NNORMS; k++) {
        char label[128];
        snprintf(label, sizeof label, "%s, %s, %s", dt < 0 ? "mixed" : ct_dt_name(dt),
                 ct_data_name(data), ct_norm_name(k));
        bx_norm_opts o = ct_norm_opts(k);
        ct_compare_norm(&s, 3, NULL, &o, label);
        if (ct_data_nonfinite(data)) {
          o.error_if_nonfinite = 1;
          strncat(label, ", error_if_nonfinite", sizeof label - strlen(label) - 1);
          ct_compare_norm(&s, 3, NULL, &o, label);
        }
      }
      if (ct_failures() > 20) break;
    }
    ct_set_free(&s);
  }
}

/* b: the elements of a (one dtype) shuffled and cut into 1..24 tensors of
 * random sizes, misaligned. */
static int repartition(const ct_set *a, ct_set *b, ct_rng *r) {
  int dt = a->dt[0];
  size_t es = ct_dt_size(dt);
  int64_t total = ct_set_elems(a);
  size_t k = 1 + (size_t)ct_below(r, 24);
  int dts[24];
  int64_t ns[24], left = total;
  for (size_t i = 0; i < k; i++) {
    dts[i] = dt;
    ns[i] = i + 1 == k ? left : (int64_t)ct_below(r, (uint64_t)left + 1);
    left -= ns[i];
  }
  if (!ct_set_init(b, k, dts, ns, 1, r)) return 0;
  unsigned char *all = malloc((size_t)total * es + 1);
  if (!CT_CHECK(all != NULL, "out of host memory")) return 0;
  size_t at = 0;
  for (size_t i = 0; i < a->count; i++) {
    memcpy(all + at, a->host + a->off[i], (size_t)a->n[i] * es);
    at += (size_t)a->n[i] * es;
  }
  for (int64_t i = total - 1; i > 0; i--) { /* Fisher-Yates */
    size_t j = (size_t)ct_below(r, (uint64_t)i + 1);
    unsigned char t[8];
    memcpy(t, all + (size_t)i * es, es);
    memcpy(all + (size_t)i * es, all + j * es, es);
    memcpy(all + j * es, t, es);
  }
  at = 0;
  for (size_t i = 0; i < b->count; i++) {
    memcpy(b->host + b->off[i], all + at, (size_t)b->n[i] * es);
    at += (size_t)b->n[i] * es;
  }
  free(all);
  return ct_upload(b);
}

static double gpu_norm(const ct_set *s, const bx_norm_opts *o, bx_status *st) {
  bx_group g = {s->gpu, s->count};
  double t = -1;
  *st = bx_total_norm(&g, 1, NULL, o, &t, NULL);
  return t;
}

/* Exact norms: the same bits for any partition and order of the values. */
void test_norm_layout_invariance(void) {
  ct_rng r;
  ct_rng_init(&r);
  static const int datas[] = {CT_GAUSS, CT_WIDE, CT_SPIKY, CT_HUGE};
  for (int dt = 0; dt < CT_NDT; dt++)
    for (size_t d = 0; d < sizeof datas / sizeof datas[0]; d++) {
      ct_set a, b;
      if (!standard_set(&a, dt, 0, &r)) return;
      ct_fill(&a, datas[d], &r);
      for (int rep = 0; rep < 3; rep++) {
        if (!repartition(&a, &b, &r)) break;
        for (int k = 0; k < CT_NNORMS; k++) {
          bx_norm_opts o = ct_norm_opts(k);
          bx_status sa, sb;
          double na = gpu_norm(&a, &o, &sa), nb = gpu_norm(&b, &o, &sb);
          CT_STATUS(sa, BX_OK, "GPU norm");
          CT_STATUS(sb, BX_OK, "GPU norm, repartitioned");
          CT_BITS(nb, na, "%s %s %s: %zu tensors vs 7, shuffled", ct_dt_name(dt),
                  ct_data_name(datas[d]), ct_norm_name(k), b.count);
          ct_compare_norm(&b, 1, NULL, &o, "repartitioned vs CPU");
        }
        ct_set_free(&b);
      }
      ct_set_free(&a);
    }
}

/* p other than 0, 1, 2, +-inf: |x|^p is not exact, but it is computed by
 * the same function (bx_pow_det, IEEE basic operations only, --fmad=false
 * on the device) on both sides, so the GPU's norm must have the CPU's bits,
 * and the same bits for any partition and order of the same values. */
void test_norm_other_p(void) {
  ct_rng r;
  ct_rng_init(&r);
  static const double ps[] = {3.0, 0.5, 1.5};
  static const int datas[] = {CT_GAUSS, CT_WIDE, CT_TINY, CT_HUGE, CT_ZEROS, CT_NAN};
  for (int dt = 0; dt < CT_NDT; dt++)
    for (size_t d = 0; d < sizeof datas / sizeof datas[0]; d++) {
      ct_set a, b;
      if (!standard_set(&a, dt, 1, &r)) return;
      ct_fill(&a, datas[d], &r);
      if (!repartition(&a, &b, &r)) {
        ct_set_free(&a);
        return;
      }
      for (size_t k = 0; k < sizeof ps / sizeof ps[0]; k++) {
        bx_norm_opts o = BX_NORM_OPTS_DEFAULT;
        o.norm_type = ps[k];
        bx_status sa, sb, sc;
        double na = gpu_norm(&a, &o, &sa), nb = gpu_norm(&b, &o, &sb), nc = -1;
        bx_group gc = {a.cpu, a.count};
        sc = bx_total_norm(&gc, 1, NULL, &o, &nc, NULL);
        CT_STATUS(sa, BX_OK, "GPU p=%g", ps[k]);
        CT_STATUS(sb, BX_OK, "GPU p=%g repartitioned", ps[k]);
        CT_STATUS(sc, BX_OK, "CPU p=%g", ps[k]);
        CT_BITS(nb, na, "%s %s p=%g: GPU determinism across partitions", ct_dt_name(dt),
                ct_data_name(datas[d]), ps[k]);
        CT_BITS(na, nc, "%s %s p=%g: GPU vs CPU", ct_dt_name(dt), ct_data_name(datas[d]),
                ps[k]);
      }
      ct_set_free(&b);
      ct_set_free(&a);
    }
}

/* 5000 tensors of random sizes 0..3000, every dtype mixed, at
 * element-aligned (not 16-byte aligned) addresses, in 7 groups. */
void test_norm_many_tensors(void) {
  ct_rng r;
  ct_rng_init(&r);
  ct_set s;
  if (!ct_set_random(&s, 5000, 3000, -1, 1, &r)) return;
  static const int datas[] = {CT_GAUSS, CT_WIDE, CT_NANINF};
  for (size_t d = 0; d < sizeof datas / sizeof datas[0]; d++) {
    ct_fill(&s, datas[d], &r);
    for (int k = 0; k < CT_NNORMS; k++) {
      char label[96];
      snprintf(label, sizeof label, "5000 tensors, %s, %s", ct_data_name(datas[d]), ct_norm_name(k));
      bx_norm_opts o = ct_norm_opts(k);
      ct_compare_norm(&s, 7, NULL, &o, label);
    }
  }
  ct_set_free(&s);
}

/* A few large tensors (~700 MB in all) of each dtype in one call. */
void test_norm_large_tensors(void) {
  ct_rng r;
  ct_rng_init(&r);
  static const int dts[] = {CT_F32, CT_BF16, CT_F16, CT_F64, CT_F32};
  static const int64_t ns[] = {64 << 20, 96 << 20, (64 << 20) + 7, 16 << 20, 1000003};
  ct_set s;
  if (!ct_set_init(&s, 5, dts, ns, 0, &r)) return;
  static const int datas[] = {CT_GAUSS, CT_SPIKY};
  for (size_t d = 0; d < 2; d++) {
    ct_fill(&s, datas[d], &r);
    for (int k = 0; k < CT_NNORMS; k++) {
      char label[96];
      snprintf(label, sizeof label, "large tensors, %s, %s", ct_data_name(datas[d]), ct_norm_name(k));
      bx_norm_opts o = ct_norm_opts(k);
      ct_compare_norm(&s, 2, NULL, &o, label);
    }
  }
  ct_set_free(&s);
}

/* ---- one tensor of more than 2^31 elements ----------------------------- */
#define HUGE_N ((int64_t)(1ll << 31) + 4099)

typedef struct huge_fill {
  uint16_t *x;
  int64_t lo, hi;
} huge_fill;

/* bf16 bits from the element's index: finite, exponents 2^-27..2^12, ~1%
 * zeros; a 32-bit index wrap would read other values. */
static void *huge_fill_range(void *arg) {
  huge_fill *f = arg;
  for (int64_t i = f->lo; i < f->hi; i++) {
    uint64_t z = bx_rng_hash64(0, (uint64_t)i); /* rng.h: counter-based */
    uint16_t b = (uint16_t)(((z & 1) << 15) | ((100 + (z >> 1) % 40) << 7) | ((z >> 8) & 0x7F));
    f->x[i] = (z >> 20) % 97 == 0 ? 0 : b;
  }
  return NULL;
}

void test_norm_huge_tensor(void) {
  const char *env = getenv("BX_CUDA_TEST_HUGE");
  if (env && *env == '0') {
    ct_skip("BX_CUDA_TEST_HUGE=0");
    return;
  }
  size_t bytes = (size_t)HUGE_N * 2, free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess || free_b < bytes + ((size_t)1 << 30)) {
    ct_skip("needs %zu free device bytes, has %zu", bytes + ((size_t)1 << 30), free_b);
    return;
  }
  /* 2 x 4.3 GB of host memory: not sized from sysconf, which reports the
   * current size of a VM whose memory grows as it is used */
  uint16_t *x = malloc(bytes), *back = malloc(bytes);
  void *dev = NULL;
  if (!x || !back) {
    ct_skip("cannot allocate 2 x %zu host bytes", bytes);
    goto done;
  }
  double t0 = ct_now();
  enum { NT = 16 };
  pthread_t th[NT];
  huge_fill f[NT];
  for (int i = 0; i < NT; i++) {
    f[i].x = x;
    f[i].lo = HUGE_N * i / NT;
    f[i].hi = HUGE_N * (i + 1) / NT;
    pthread_create(&th[i], NULL, huge_fill_range, &f[i]);
  }
  for (int i = 0; i < NT; i++) pthread_join(th[i], NULL);
  x[(1ll << 31) + 1] = (uint16_t)(200 << 7 | 0x11); /* past 2^31 */
  x[HUGE_N - 3] = (uint16_t)(1u << 15 | 210 << 7 | 0x33); /* the largest |x|, near the end */
  if (!CT_CUDA(cudaMalloc(&dev, bytes))) {
    dev = NULL;
    goto done;
  }
  if (!ct_h2d(dev, x, bytes)) goto done;
  double t1 = ct_now();
  int64_t shape = HUGE_N;
  DLTensor tc = {x, {kDLCPU, 0}, 1, {kDLBfloat, 16, 1}, &shape, NULL, 0};
  DLTensor tg = tc;
  tg.data = dev;
  tg.device.device_type = kDLCUDA;
  cudaGetDevice(&tg.device.device_id);
  ct_set s = {0};
  s.count = 1; /* a view for ct_compare_norm: one tensor, no host/dev copy */
  s.cpu = &tc;
  s.gpu = &tg;
  static const int ks[] = {0, 1, 2, 3, 5};
  for (size_t k = 0; k < sizeof ks / sizeof ks[0]; k++) {
    bx_norm_opts o = ct_norm_opts(ks[k]);
    char label[64];
    snprintf(label, sizeof label, "2^31+4099 bf16 elements, %s", ct_norm_name(ks[k]));
    ct_compare_norm(&s, 1, NULL, &o, label);
  }
  double t2 = ct_now();
  /* scaling past 2^31 elements: GPU vs CPU on the host copy */
  bx_scale_opts so = BX_SCALE_OPTS_DEFAULT;
  CT_STATUS(bx_scale(&tg, 1, 0.3, &so), BX_OK, "GPU bx_scale of the huge tensor");
  CT_STATUS(bx_scale(&tc, 1, 0.3, &so), BX_OK, "CPU bx_scale of the huge tensor");
  if (CT_CUDA(cudaMemcpy(back, dev, bytes, cudaMemcpyDeviceToHost)) && memcmp(back, x, bytes) != 0) {
    int64_t i = 0;
    while (i < HUGE_N && back[i] == x[i]) i++;
    CT_CHECK(0, "huge bf16 scale: first difference at element %lld: GPU 0x%04x CPU 0x%04x",
             (long long)i, back[i], x[i]);
  }
  ct_note("huge tensor: fill+upload %.1fs, 5 norms GPU+CPU %.1fs, scale+compare %.1fs", t1 - t0,
          t2 - t1, ct_now() - t2);
done:
  if (dev) cudaFree(dev);
  free(x);
  free(back);
}
