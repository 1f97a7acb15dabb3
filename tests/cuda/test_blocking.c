/*
 * test_blocking.c — the blocking API on kDLCUDA tensors beyond the norm:
 * bx_scale (both modes, every dtype, special coefficients), bx_clip_grad_norm
 * (formulas, modes, disabled/inactive clipping, non-finite gradients),
 * host communicators, dense views, and bad input. Every result is compared
 * bit for bit with the CPU backend on the same bytes.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ct.h"
#include "cuda_tests.h"

static const int64_t SIZES[] = {0, 1, 5, 999, 4099, 65537, 200003};
#define NSIZES (sizeof SIZES / sizeof SIZES[0])

static int std_set(ct_set *s, int dt, int misalign, ct_rng *r) {
  int dts[NSIZES];
  for (size_t i = 0; i < NSIZES; i++) dts[i] = dt >= 0 ? dt : (int)((i + 1) % CT_NDT);
  return ct_set_init(s, NSIZES, dts, SIZES, misalign, r);
}

static const char *dt_label(int dt) { return dt < 0 ? "mixed" : ct_dt_name(dt); }

/* The device buffer still holds the set's original values. */
static int unchanged(const ct_set *s, unsigned char *buf, const char *what) {
  if (!ct_download(s, buf)) return 0;
  return ct_compare_grads(s, buf, s->host, what) == 0;
}

void test_scale_dtypes_coefs(void) {
  ct_rng r;
  ct_rng_init(&r);
  static const double coefs[] = {0.5, 0.3, 1.0 / 3.0, 1.0, 0.0, 1e-300, 1e-40, 3.0, 1e300, -0.75};
  static const int datas[] = {CT_GAUSS, CT_WIDE, CT_SUBNORMAL, CT_MAXVAL, CT_TINY, CT_HUGE, CT_NANINF};
  for (int dt = -1; dt < CT_NDT; dt++) {
    ct_set s;
    if (!std_set(&s, dt, dt & 1, &r)) return;
    unsigned char *back = malloc(s.bytes + 1);
    if (!CT_CHECK(back != NULL, "out of host memory")) {
      ct_set_free(&s);
      return;
    }
    for (size_t d = 0; d < sizeof datas / sizeof datas[0]; d++) {
      ct_fill(&s, datas[d], &r);
      for (int mode = 0; mode < 2; mode++)
        for (size_t c = 0; c < sizeof coefs / sizeof coefs[0]; c++) {
          ct_upload(&s);
          bx_scale_opts o = BX_SCALE_OPTS_DEFAULT;
          o.mode = mode ? BX_SCALE_EXACT : BX_SCALE_TORCH;
          char label[128];
          snprintf(label, sizeof label, "bx_scale %s, %s, %s, coef %a", dt_label(dt),
                   ct_data_name(datas[d]), mode ? "exact" : "torch", coefs[c]);
          bx_status sg = bx_scale(s.gpu, s.count, coefs[c], &o);
          bx_status sc = bx_scale(s.cpu, s.count, coefs[c], &o);
          CT_STATUS(sg, sc, "%s", label);
          if (ct_download(&s, back)) ct_compare_grads(&s, back, s.work, label);
        }
      /* NaN coefficient: refused, nothing written */
      ct_upload(&s);
      bx_scale_opts o = BX_SCALE_OPTS_DEFAULT;
      CT_STATUS(bx_scale(s.gpu, s.count, NAN, &o), BX_EINVAL, "bx_scale coef NaN (%s)", dt_label(dt));
      unchanged(&s, back, "bx_scale coef NaN left the gradients");
      if (ct_failures() > 20) break;
    }
    free(back);
    ct_set_free(&s);
  }
}

/* bx_clip_grad_norm on CUDA vs CPU: norm, coefficient and gradients. */
static void clip_case(ct_set *s, unsigned char *back, double max_norm, const bx_clip_opts *o,
                      const char *label) {
  ct_upload(s);
  bx_group gc[3], gg[3];
  ct_groups(s, 3, gc, gg);
  double tc = -1, cc = -1, tg = -2, cg = -2;
  bx_status sc = bx_clip_grad_norm(gc, 3, NULL, max_norm, o, &tc, &cc);
  char cpu_err[512];
  snprintf(cpu_err, sizeof cpu_err, "%s", bx_last_error());
  bx_status sg = bx_clip_grad_norm(gg, 3, NULL, max_norm, o, &tg, &cg);
  if (!CT_STATUS(sg, sc, "%s", label)) return;
  if (sc == BX_OK) {
    CT_BITS(tg, tc, "%s: total norm", label);
    CT_BITS(cg, cc, "%s: coefficient", label);
  } else {
    CT_CHECK(strstr(bx_last_error(), ct_tensor_ref(cpu_err)) != NULL,
             "%s: GPU error \"%s\" vs CPU \"%s\"", label, bx_last_error(), cpu_err);
  }
  if (ct_download(s, back)) ct_compare_grads(s, back, s->work, label);
}

void test_clip_blocking(void) {
  ct_rng r;
  ct_rng_init(&r);
  static const int datas[] = {CT_GAUSS, CT_WIDE, CT_HUGE, CT_NAN, CT_INF};
  for (int dt = -1; dt < CT_NDT; dt++) {
    ct_set s;
    if (!std_set(&s, dt, 1, &r)) return;
    unsigned char *back = malloc(s.bytes + 1);
    if (!CT_CHECK(back != NULL, "out of host memory")) {
      ct_set_free(&s);
      return;
    }
    for (size_t d = 0; d < sizeof datas / sizeof datas[0]; d++) {
      ct_fill(&s, datas[d], &r);
      bx_group g = {s.cpu, s.count};
      double norm = 0;
      bx_total_norm(&g, 1, NULL, NULL, &norm, NULL);
      double maxes[] = {norm / 3, norm * 0.999999, 1e30, 0.0, 1.0};
      for (int variant = 0; variant < 4; variant++) {
        bx_clip_opts o = BX_CLIP_OPTS_DEFAULT;
        if (variant == 1) o.scale.mode = BX_SCALE_EXACT;
        if (variant == 2) o.formula = BX_COEF_MAX;
        if (variant == 3) o.norm.error_if_nonfinite = 1;
        for (size_t m = 0; m < sizeof maxes / sizeof maxes[0]; m++) {
          if (!(maxes[m] >= 0) || isinf(maxes[m])) continue; /* norm NaN/Inf: skip derived ones */
          char label[160];
          snprintf(label, sizeof label, "clip %s, %s, variant %d, max_norm %a", dt_label(dt),
                   ct_data_name(datas[d]), variant, maxes[m]);
          clip_case(&s, back, maxes[m], &o, label);
        }
      }
      bx_clip_opts o = BX_CLIP_OPTS_DEFAULT;
      clip_case(&s, back, -1.0, &o, "clip with max_norm -1");
      clip_case(&s, back, NAN, &o, "clip with max_norm NaN");
      if (ct_failures() > 20) break;
    }
    free(back);
    ct_set_free(&s);
  }
}

/* A one-rank host communicator: the words stay as they are. */
typedef struct host_comm_ctx {
  int calls, fail;
} host_comm_ctx;

static int host_allreduce(int64_t *buf, size_t n, bx_op op, void *ctx) {
  host_comm_ctx *c = ctx;
  (void)buf;
  (void)n;
  (void)op;
  c->calls++;
  return c->fail;
}

void test_blocking_host_comm(void) {
  ct_rng r;
  ct_rng_init(&r);
  ct_set s;
  if (!std_set(&s, -1, 1, &r)) return;
  ct_fill(&s, CT_WIDE, &r);
  host_comm_ctx ctx = {0, 0};
  bx_comm comm = BX_COMM_DEFAULT;
  comm.allreduce_i64 = host_allreduce;
  comm.ctx = &ctx;
  for (int k = 0; k < CT_NNORMS; k++) {
    bx_norm_opts o = ct_norm_opts(k);
    char label[64];
    snprintf(label, sizeof label, "host comm, %s", ct_norm_name(k));
    ctx.calls = 0;
    ct_compare_norm(&s, 3, &comm, &o, label);
    CT_CHECK(ctx.calls >= 1 && ctx.calls <= 2, "%s: %d all-reduce calls, expected 1 or 2", label,
             ctx.calls);
  }
  /* a failing all-reduce: BX_ECOMM, gradients untouched */
  unsigned char *back = malloc(s.bytes + 1);
  if (CT_CHECK(back != NULL, "out of host memory")) {
    ctx.fail = 5;
    bx_group gg[3], gc[3];
    ct_groups(&s, 3, gc, gg);
    double t = -1, c = -1;
    CT_STATUS(bx_clip_grad_norm(gg, 3, &comm, 1e-3, NULL, &t, &c), BX_ECOMM,
              "clip with a failing host communicator");
    CT_CHECK(t == -1 && c == -1, "outputs written on failure");
    unchanged(&s, back, "clip with a failing communicator left the gradients");
  }
  free(back);
  ct_set_free(&s);
}

/* Dense layouts other than row-major: a transposed matrix, size-1 dims. */
void test_blocking_views(void) {
  ct_rng r;
  ct_rng_init(&r);
  for (int dt = 0; dt < CT_NDT; dt++) {
    int dts[2] = {dt, dt};
    int64_t ns[2] = {300 * 70, 64 * 3};
    ct_set s;
    if (!ct_set_init(&s, 2, dts, ns, 0, &r)) return;
    ct_fill(&s, CT_WIDE, &r);
    int64_t shape0[2] = {300, 70}, strides0[2] = {1, 300};       /* column-major */
    int64_t shape1[4] = {64, 1, 3, 1}, strides1[4] = {3, 99, 1, 5}; /* size-1 dims */
    for (int side = 0; side < 2; side++) {
      DLTensor *t = side ? s.gpu : s.cpu;
      t[0].ndim = 2;
      t[0].shape = shape0;
      t[0].strides = strides0;
      t[1].ndim = 4;
      t[1].shape = shape1;
      t[1].strides = strides1;
    }
    for (int k = 0; k < CT_NNORMS; k++) {
      bx_norm_opts o = ct_norm_opts(k);
      char label[64];
      snprintf(label, sizeof label, "dense views, %s, %s", ct_dt_name(dt), ct_norm_name(k));
      ct_compare_norm(&s, 1, NULL, &o, label);
    }
    /* a view with gaps is refused on both */
    int64_t gshape[2] = {20, 5}, gstrides[2] = {10, 1};
    DLTensor gap = s.gpu[0];
    gap.shape = gshape;
    gap.strides = gstrides;
    bx_group g = {&gap, 1};
    double t = -1;
    CT_STATUS(bx_total_norm(&g, 1, NULL, NULL, &t, NULL), BX_ELAYOUT, "strided CUDA view with gaps");
    ct_set_free(&s);
  }
}

void test_blocking_bad_input(void) {
  ct_rng r;
  ct_rng_init(&r);
  ct_set s;
  int dts[4] = {CT_F32, CT_BF16, CT_F16, CT_F64};
  int64_t ns[4] = {1000, 1000, 1000, 1000};
  if (!ct_set_init(&s, 4, dts, ns, 0, &r)) return;
  ct_fill(&s, CT_GAUSS, &r);
  unsigned char *back = malloc(s.bytes + 1);
  if (!CT_CHECK(back != NULL, "out of host memory")) goto done;
  double t = -1, c = -1;

  /* CPU and CUDA tensors in one call */
  DLTensor mixed[4] = {s.gpu[0], s.gpu[1], s.cpu[2], s.gpu[3]};
  bx_group gm = {mixed, 4};
  CT_STATUS(bx_total_norm(&gm, 1, NULL, NULL, &t, NULL), BX_EDEVICE, "norm of CPU+CUDA tensors");
  CT_STATUS(bx_clip_grad_norm(&gm, 1, NULL, 1e-3, NULL, &t, &c), BX_EDEVICE, "clip of CPU+CUDA tensors");
  CT_STATUS(bx_scale(mixed, 4, 0.5, NULL), BX_EDEVICE, "scale of CPU+CUDA tensors");
  CT_CHECK(t == -1 && c == -1, "outputs written on failure");
  unchanged(&s, back, "CPU+CUDA calls left the gradients");
  bx_cuda_plan *plan = NULL;
  CT_STATUS(bx_cuda_plan_create(&gm, 1, NULL, NULL, &plan), BX_EDEVICE, "plan of CPU+CUDA tensors");
  CT_CHECK(plan == NULL, "plan returned on failure");
  bx_cuda_plan_destroy(plan);
  bx_group gcpu = {s.cpu, 4};
  CT_STATUS(bx_cuda_plan_create(&gcpu, 1, NULL, NULL, &plan), BX_EDEVICE, "plan of CPU tensors");
  bx_cuda_plan_destroy(plan);
  plan = NULL;

  /* an unsupported dtype on the device: named in the error */
  DLTensor bad[4] = {s.gpu[0], s.gpu[1], s.gpu[2], s.gpu[3]};
  bad[2].dtype.code = kDLInt;
  bad[2].dtype.bits = 32;
  bx_group gb[2] = {{bad, 1}, {bad + 1, 3}};
  CT_STATUS(bx_total_norm(gb, 2, NULL, NULL, &t, NULL), BX_EDTYPE, "norm with an int32 CUDA tensor");
  CT_CHECK(strstr(bx_last_error(), "group 1, tensor 1") != NULL,
           "the error should name group 1, tensor 1: \"%s\"", bx_last_error());
  CT_STATUS(bx_clip_grad_norm(gb, 2, NULL, 1e-3, NULL, &t, &c), BX_EDTYPE, "clip with an int32 CUDA tensor");
  CT_STATUS(bx_scale(bad, 4, 0.5, NULL), BX_EDTYPE, "scale with an int32 CUDA tensor");
  CT_CHECK(strstr(bx_last_error(), "tensor 2") != NULL, "the error should name tensor 2: \"%s\"",
           bx_last_error());
  CT_STATUS(bx_cuda_plan_create(gb, 2, NULL, NULL, &plan), BX_EDTYPE, "plan with an int32 CUDA tensor");
  CT_CHECK(strstr(bx_last_error(), "group 1, tensor 1") != NULL,
           "the plan error should name group 1, tensor 1: \"%s\"", bx_last_error());
  bx_cuda_plan_destroy(plan);
  plan = NULL;
  unchanged(&s, back, "calls with a bad dtype left the gradients");

  /* overlapping tensors: a norm counts the shared elements twice (as the
   * CPU does), scaling them is refused */
  DLTensor ov[2] = {s.gpu[0], s.gpu[0]}, ovc[2] = {s.cpu[0], s.cpu[0]};
  int64_t half = 500;
  ov[1].shape = ovc[1].shape = &half;
  ov[1].byte_offset += 1000; /* elements 250..749 of tensor 0 (fp32) */
  ovc[1].byte_offset += 1000;
  CT_STATUS(bx_scale(ov, 2, 0.5, NULL), BX_ELAYOUT, "scale of overlapping CUDA tensors");
  bx_group go = {ov, 2}, goc = {ovc, 2};
  double tg = -1, tc = -2;
  CT_STATUS(bx_total_norm(&go, 1, NULL, NULL, &tg, NULL), BX_OK, "norm of overlapping CUDA tensors");
  CT_STATUS(bx_total_norm(&goc, 1, NULL, NULL, &tc, NULL), BX_OK, "norm of overlapping host tensors");
  CT_BITS(tg, tc, "overlapping tensors counted twice on both");
  CT_STATUS(bx_clip_grad_norm(&go, 1, NULL, 1e-6, NULL, &t, &c), BX_ELAYOUT,
            "clip of overlapping CUDA tensors");
  CT_STATUS(bx_cuda_plan_create(&go, 1, NULL, NULL, &plan), BX_OK, "plan of overlapping tensors");
  if (plan) {
    double *d = NULL;
    if (cudaMalloc((void **)&d, 2 * sizeof(double)) == cudaSuccess) {
      CT_STATUS(bx_cuda_norm_async(plan, 0, d, NULL, NULL), BX_OK, "plan norm, overlapping");
      CT_STATUS(bx_cuda_clip_async(plan, 0, 1e-6, d, d + 1, NULL), BX_ELAYOUT,
                "plan clip, overlapping");
      CT_STATUS(bx_cuda_scale_async(plan, 0, d + 1, NULL), BX_ELAYOUT, "plan scale, overlapping");
      double hd = -3;
      cudaMemcpy(&hd, d, sizeof hd, cudaMemcpyDeviceToHost);
      CT_BITS(hd, tc, "plan norm of overlapping tensors");
      cudaFree(d);
    }
  }
  bx_cuda_plan_destroy(plan);
  plan = NULL;

  /* a device that does not exist */
  DLTensor nodev = s.gpu[0];
  nodev.device.device_id = 1000;
  bx_group gn = {&nodev, 1};
  CT_STATUS(bx_total_norm(&gn, 1, NULL, NULL, &t, NULL), BX_EDEVICE, "CUDA device 1000");

  /* NaN coefficient, negative max_norm */
  CT_STATUS(bx_scale(s.gpu, 4, NAN, NULL), BX_EINVAL, "scale by NaN");
  bx_group gg = {s.gpu, 4};
  CT_STATUS(bx_clip_grad_norm(&gg, 1, NULL, -2.0, NULL, &t, &c), BX_EINVAL, "clip max_norm -2");
  unchanged(&s, back, "refused calls left the gradients");
done:
  free(back);
  ct_set_free(&s);
}
