/*
 * test_plan.c — the stream-ordered API of bitexact_cuda.h: plans, norm /
 * clip / scale enqueued on non-default streams with results in device
 * memory, d_status for error_if_nonfinite, CUDA graph capture and replay
 * on new gradient contents, no host synchronisation while enqueueing, and
 * a constant number of launches whatever the tensor count. Results are
 * compared bit for bit with the CPU backend on the same bytes.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ct.h"
#include "cuda_tests.h"

/* Device outputs of one enqueued call and their pinned host mirror. */
typedef struct outs {
  unsigned char *block, *host;
  double *d_norm, *d_groups, *d_coef;
  int32_t *d_status;
} outs;

#define OUT_BYTES 1024

static int outs_alloc(outs *o) {
  memset(o, 0, sizeof *o);
  if (!CT_CUDA(cudaMalloc((void **)&o->block, OUT_BYTES))) return 0;
  if (!CT_CUDA(cudaMallocHost((void **)&o->host, OUT_BYTES))) return 0;
  o->d_norm = (double *)o->block;
  o->d_coef = (double *)o->block + 1;
  o->d_groups = (double *)o->block + 8;
  o->d_status = (int32_t *)(o->block + 512);
  return 1;
}

static void outs_free(outs *o) {
  if (o->block) cudaFree(o->block);
  if (o->host) cudaFreeHost(o->host);
  memset(o, 0, sizeof *o);
}

/* All ones: a NaN in every double and -1 as the status, so an output the
 * library forgot to write is seen. */
static void outs_poison(const outs *o, cudaStream_t s) { cudaMemsetAsync(o->block, 0xFF, OUT_BYTES, s); }

typedef struct got {
  double norm, coef, groups[8];
  int32_t status;
} got;

static int outs_read(const outs *o, cudaStream_t s, got *g) {
  if (!CT_CUDA(cudaMemcpyAsync(o->host, o->block, OUT_BYTES, cudaMemcpyDeviceToHost, s))) return 0;
  if (!CT_CUDA(cudaStreamSynchronize(s))) return 0;
  const double *d = (const double *)o->host;
  g->norm = d[0];
  g->coef = d[1];
  memcpy(g->groups, d + 8, sizeof g->groups);
  memcpy(&g->status, o->host + 512, 4);
  return 1;
}

static int make_stream(cudaStream_t *s) {
  return CT_CUDA(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking));
}

/* The CPU's clip of s->work (which must equal s->host): norm, coef, and
 * the clipped gradients left in s->work. */
static bx_status cpu_clip(ct_set *s, double max_norm, const bx_clip_opts *o, double *t, double *c) {
  memcpy(s->work, s->host, s->bytes);
  bx_group gc[3], gg[3];
  ct_groups(s, 3, gc, gg);
  return bx_clip_grad_norm(gc, 3, NULL, max_norm, o, t, c);
}

static bx_cuda_plan *plan_for(const ct_set *s, size_t ngroups, const bx_comm *comm,
                              const bx_clip_opts *o) {
  bx_group gc[8], gg[8];
  ct_groups(s, ngroups, gc, gg);
  bx_cuda_plan *p = NULL;
  if (!CT_STATUS(bx_cuda_plan_create(gg, ngroups, comm, o, &p), BX_OK, "bx_cuda_plan_create"))
    return NULL;
  CT_CHECK(p != NULL, "bx_cuda_plan_create returned BX_OK and no plan");
  return p;
}

/* ---- norm ------------------------------------------------------------- */
void test_plan_norm_async(void) {
  ct_rng r;
  ct_rng_init(&r);
  ct_set s;
  outs o = {0};
  cudaStream_t st = NULL;
  if (!ct_set_random(&s, 200, 70000, -1, 1, &r)) return;
  if (!outs_alloc(&o) || !make_stream(&st)) goto done;
  for (int k = 0; k < CT_NNORMS; k++) {
    bx_clip_opts co = BX_CLIP_OPTS_DEFAULT;
    co.norm = ct_norm_opts(k);
    bx_cuda_plan *p = plan_for(&s, 3, NULL, &co);
    if (!p) break;
    CT_CHECK(bx_cuda_plan_device(p) == s.gpu[0].device.device_id, "bx_cuda_plan_device");
    static const int datas[] = {CT_GAUSS, CT_WIDE, CT_NANINF, CT_ZEROS};
    for (size_t d = 0; d < sizeof datas / sizeof datas[0]; d++) {
      ct_fill(&s, datas[d], &r); /* new contents, same buffers */
      outs_poison(&o, st);
      CT_STATUS(bx_cuda_norm_async(p, st, o.d_norm, o.d_groups, o.d_status), BX_OK, "norm_async");
      got g;
      if (!outs_read(&o, st, &g)) break;
      bx_group gc[3], gg[3];
      ct_groups(&s, 3, gc, gg);
      double t = -1, gn[3];
      CT_STATUS(bx_total_norm(gc, 3, NULL, &co.norm, &t, gn), BX_OK, "CPU norm");
      char label[96];
      snprintf(label, sizeof label, "plan norm %s, %s", ct_norm_name(k), ct_data_name(datas[d]));
      CT_BITS(g.norm, t, "%s: total", label);
      for (int i = 0; i < 3; i++) CT_BITS(g.groups[i], gn[i], "%s: group %d", label, i);
      CT_CHECK(g.status == 0, "%s: d_status %d", label, (int)g.status);
    }
    /* optional outputs may be NULL */
    CT_STATUS(bx_cuda_norm_async(p, st, o.d_norm, NULL, NULL), BX_OK, "norm_async without groups/status");
    CT_CUDA(cudaStreamSynchronize(st));
    bx_cuda_plan_destroy(p);
  }
done:
  if (st) cudaStreamDestroy(st);
  outs_free(&o);
  ct_set_free(&s);
}

/* ---- clip ------------------------------------------------------------- */
static void plan_clip_case(ct_set *s, bx_cuda_plan *p, const bx_clip_opts *co, double max_norm,
                           const outs *o, cudaStream_t st, unsigned char *back, const char *label) {
  double t = -1, c = -1;
  bx_status sc = cpu_clip(s, max_norm, co, &t, &c);
  CT_STATUS(sc, BX_OK, "%s: CPU clip", label);
  outs_poison(o, st);
  CT_STATUS(bx_cuda_clip_async(p, st, max_norm, o->d_norm, o->d_coef, o->d_status), BX_OK, "%s", label);
  got g;
  if (!outs_read(o, st, &g)) return;
  CT_BITS(g.norm, t, "%s: total norm", label);
  CT_BITS(g.coef, c, "%s: coefficient", label);
  CT_CHECK(g.status == 0, "%s: d_status %d", label, (int)g.status);
  if (ct_download(s, back)) ct_compare_grads(s, back, s->work, label);
}

void test_plan_clip_async(void) {
  ct_rng r;
  ct_rng_init(&r);
  ct_set s;
  outs o = {0};
  cudaStream_t st = NULL;
  unsigned char *back = NULL;
  if (!ct_set_random(&s, 300, 50000, -1, 1, &r)) return;
  back = malloc(s.bytes + 1);
  if (!CT_CHECK(back != NULL, "out of host memory") || !outs_alloc(&o) || !make_stream(&st)) goto done;
  for (int variant = 0; variant < 3; variant++) {
    bx_clip_opts co = BX_CLIP_OPTS_DEFAULT;
    if (variant == 1) co.scale.mode = BX_SCALE_EXACT;
    if (variant == 2) co.formula = BX_COEF_MAX;
    bx_cuda_plan *p = plan_for(&s, 3, NULL, &co);
    if (!p) break;
    static const int datas[] = {CT_GAUSS, CT_WIDE, CT_HUGE, CT_NAN, CT_INF};
    for (size_t d = 0; d < sizeof datas / sizeof datas[0]; d++) {
      ct_fill(&s, datas[d], &r);
      bx_group g = {s.cpu, s.count};
      double norm = 0;
      bx_total_norm(&g, 1, NULL, NULL, &norm, NULL);
      double maxes[] = {isfinite(norm) ? norm / 3 : 1.0, 1e30, 0.0};
      for (int m = 0; m < 3; m++) {
        ct_upload(&s);
        char label[128];
        snprintf(label, sizeof label, "plan clip variant %d, %s, max_norm %a", variant,
                 ct_data_name(datas[d]), maxes[m]);
        plan_clip_case(&s, p, &co, maxes[m], &o, st, back, label);
      }
    }
    ct_upload(&s);
    CT_STATUS(bx_cuda_clip_async(p, st, -1.0, o.d_norm, o.d_coef, o.d_status), BX_EINVAL, "max_norm -1");
    CT_STATUS(bx_cuda_clip_async(p, st, NAN, o.d_norm, o.d_coef, o.d_status), BX_EINVAL, "max_norm NaN");
    CT_CUDA(cudaStreamSynchronize(st));
    if (ct_download(&s, back)) ct_compare_grads(&s, back, s.host, "refused clip_async left the gradients");
    bx_cuda_plan_destroy(p);
  }
done:
  if (st) cudaStreamDestroy(st);
  free(back);
  outs_free(&o);
  ct_set_free(&s);
}

/* A set, its outputs, a non-blocking stream and a download buffer. */
typedef struct fixture {
  ct_set s;
  outs o;
  cudaStream_t st;
  unsigned char *back;
} fixture;

static void fx_free(fixture *f) {
  if (f->st) cudaStreamDestroy(f->st);
  free(f->back);
  outs_free(&f->o);
  ct_set_free(&f->s);
}

static int fx_init(fixture *f, size_t count, int64_t maxn, ct_rng *r) {
  memset(f, 0, sizeof *f);
  if (!ct_set_random(&f->s, count, maxn, -1, 1, r)) return 0;
  f->back = malloc(f->s.bytes + 1);
  if (CT_CHECK(f->back != NULL, "out of host memory") && outs_alloc(&f->o) && make_stream(&f->st))
    return 1;
  fx_free(f);
  return 0;
}

/* ---- error_if_nonfinite: d_status, NaN norm, nothing written ---------- */
void test_plan_nonfinite_status(void) {
  ct_rng r;
  ct_rng_init(&r);
  fixture f;
  if (!fx_init(&f, 100, 20000, &r)) return;
  bx_clip_opts co = BX_CLIP_OPTS_DEFAULT;
  co.norm.error_if_nonfinite = 1;
  bx_cuda_plan *p = plan_for(&f.s, 3, NULL, &co);
  if (!p) goto done;
  static const int datas[] = {CT_NAN, CT_INF, CT_NANINF, CT_GAUSS};
  for (size_t d = 0; d < sizeof datas / sizeof datas[0]; d++) {
    ct_fill(&f.s, datas[d], &r);
    const char *dn = ct_data_name(datas[d]);
    if (datas[d] == CT_GAUSS) { /* finite: an ordinary clip */
      plan_clip_case(&f.s, p, &co, 1e-3, &f.o, f.st, f.back, "error_if_nonfinite plan, finite data");
      continue;
    }
    got g;
    outs_poison(&f.o, f.st);
    CT_STATUS(bx_cuda_norm_async(p, f.st, f.o.d_norm, f.o.d_groups, f.o.d_status), BX_OK, "norm_async");
    if (outs_read(&f.o, f.st, &g)) {
      CT_CHECK(g.status == BX_ENONFINITE, "norm_async on %s data: d_status %d, expected BX_ENONFINITE",
               dn, (int)g.status);
      CT_CHECK(isnan(g.norm), "norm_async on %s data: norm %g, expected NaN", dn, g.norm);
    }
    outs_poison(&f.o, f.st);
    CT_STATUS(bx_cuda_clip_async(p, f.st, 1e-3, f.o.d_norm, f.o.d_coef, f.o.d_status), BX_OK,
              "clip_async");
    if (outs_read(&f.o, f.st, &g)) {
      CT_CHECK(g.status == BX_ENONFINITE, "clip_async on %s data: d_status %d, expected BX_ENONFINITE",
               dn, (int)g.status);
      CT_CHECK(isnan(g.norm), "clip_async on %s data: norm %g, expected NaN", dn, g.norm);
    }
    if (ct_download(&f.s, f.back)) ct_compare_grads(&f.s, f.back, f.s.host, "BX_ENONFINITE clip wrote nothing");
  }
  bx_cuda_plan_destroy(p);
done:
  fx_free(&f);
}

/* ---- scale_async: coefficient and status from device memory ---------- */
void test_plan_scale_async(void) {
  ct_rng r;
  ct_rng_init(&r);
  fixture f;
  if (!fx_init(&f, 150, 30000, &r)) return;
  static const double coefs[] = {0.37, 1e-300, 3.0, 1.0, 0.0};
  for (int mode = 0; mode < 2; mode++) {
    bx_clip_opts co = BX_CLIP_OPTS_DEFAULT;
    co.scale.mode = mode ? BX_SCALE_EXACT : BX_SCALE_TORCH;
    bx_cuda_plan *p = plan_for(&f.s, 3, NULL, &co);
    if (!p) break;
    for (int data = 0; data < 2; data++) {
      ct_fill(&f.s, data ? CT_NANINF : CT_WIDE, &r);
      for (size_t c = 0; c < sizeof coefs / sizeof coefs[0]; c++) {
        ct_upload(&f.s);
        int32_t zero = 0;
        ct_h2d(f.o.d_coef, &coefs[c], 8);
        ct_h2d(f.o.d_status, &zero, 4);
        CT_STATUS(bx_cuda_scale_async(p, f.st, f.o.d_coef, c & 1 ? f.o.d_status : NULL), BX_OK,
                  "scale_async");
        CT_CUDA(cudaStreamSynchronize(f.st));
        CT_STATUS(bx_scale(f.s.cpu, f.s.count, coefs[c], &co.scale), BX_OK, "CPU bx_scale");
        char label[96];
        snprintf(label, sizeof label, "scale_async %s, %s, coef %a", mode ? "exact" : "torch",
                 data ? "nan+inf" : "wide", coefs[c]);
        if (ct_download(&f.s, f.back)) ct_compare_grads(&f.s, f.back, f.s.work, label);
      }
      /* a non-zero status: nothing is written */
      ct_upload(&f.s);
      int32_t five = 5;
      ct_h2d(f.o.d_coef, &coefs[0], 8);
      ct_h2d(f.o.d_status, &five, 4);
      CT_STATUS(bx_cuda_scale_async(p, f.st, f.o.d_coef, f.o.d_status), BX_OK, "scale_async, status 5");
      CT_CUDA(cudaStreamSynchronize(f.st));
      if (ct_download(&f.s, f.back))
        ct_compare_grads(&f.s, f.back, f.s.host, "scale_async with d_status 5 wrote nothing");
    }
    bx_cuda_plan_destroy(p);
  }
  fx_free(&f);
}

/* ---- CUDA graph capture and replay on new contents -------------------- */
void test_plan_graph_capture(void) {
  ct_rng r;
  ct_rng_init(&r);
  fixture f;
  if (!fx_init(&f, 120, 40000, &r)) return;
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  bx_clip_opts co = BX_CLIP_OPTS_DEFAULT;
  bx_cuda_plan *p = plan_for(&f.s, 3, NULL, &co);
  if (!p) goto done;
  const double max_norm = 1e-3;
  ct_fill(&f.s, CT_GAUSS, &r);
  /* first use outside the capture (lazy module loading happens here) */
  CT_STATUS(bx_cuda_clip_async(p, f.st, max_norm, f.o.d_norm, f.o.d_coef, f.o.d_status), BX_OK, "warm-up");
  CT_CUDA(cudaStreamSynchronize(f.st));
  /* global mode: any call that would synchronise or allocate during the
   * capture makes the capture fail */
  if (!CT_CUDA(cudaStreamBeginCapture(f.st, cudaStreamCaptureModeGlobal))) goto done;
  bx_status sc = bx_cuda_clip_async(p, f.st, max_norm, f.o.d_norm, f.o.d_coef, f.o.d_status);
  cudaError_t ce = cudaStreamEndCapture(f.st, &graph);
  CT_STATUS(sc, BX_OK, "clip_async under stream capture");
  if (!CT_CUDA(ce) || !CT_CUDA(cudaGraphInstantiate(&exec, graph, 0))) goto done;
  static const int datas[] = {CT_GAUSS, CT_WIDE, CT_TINY, CT_NAN, CT_GAUSS};
  for (size_t d = 0; d < sizeof datas / sizeof datas[0]; d++) {
    ct_fill(&f.s, datas[d], &r); /* same buffers, new contents */
    double t = -1, c = -1;
    CT_STATUS(cpu_clip(&f.s, max_norm, &co, &t, &c), BX_OK, "CPU clip");
    outs_poison(&f.o, f.st);
    if (!CT_CUDA(cudaGraphLaunch(exec, f.st))) break;
    got g;
    if (!outs_read(&f.o, f.st, &g)) break;
    char label[96];
    snprintf(label, sizeof label, "graph replay %zu (%s)", d, ct_data_name(datas[d]));
    CT_BITS(g.norm, t, "%s: total norm", label);
    CT_BITS(g.coef, c, "%s: coefficient", label);
    CT_CHECK(g.status == 0, "%s: d_status %d", label, (int)g.status);
    if (ct_download(&f.s, f.back)) ct_compare_grads(&f.s, f.back, f.s.work, label);
  }
done:
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  bx_cuda_plan_destroy(p);
  fx_free(&f);
}

/* ---- enqueueing never waits for the device ---------------------------- */
static void CUDART_CB sleep_host(void *arg) { usleep(*(const unsigned *)arg); }

void test_plan_async_no_host_sync(void) {
  ct_rng r;
  ct_rng_init(&r);
  fixture f;
  if (!fx_init(&f, 1000, 20000, &r)) return;
  outs o2 = {0};
  cudaEvent_t ev = NULL;
  bx_clip_opts co = BX_CLIP_OPTS_DEFAULT;
  bx_cuda_plan *p = plan_for(&f.s, 3, NULL, &co);
  if (!p || !outs_alloc(&o2) || !CT_CUDA(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming))) goto done;
  ct_fill(&f.s, CT_GAUSS, &r);
  /* warm-up: first launches (module loading) outside the timing */
  CT_STATUS(bx_cuda_clip_async(p, f.st, 1e9, f.o.d_norm, f.o.d_coef, f.o.d_status), BX_OK, "warm-up clip");
  CT_STATUS(bx_cuda_norm_async(p, f.st, o2.d_norm, o2.d_groups, o2.d_status), BX_OK, "warm-up norm");
  CT_STATUS(bx_cuda_scale_async(p, f.st, f.o.d_coef, f.o.d_status), BX_OK, "warm-up scale");
  CT_CUDA(cudaStreamSynchronize(f.st));
  ct_upload(&f.s);
  static const double one = 1.0;
  ct_h2d(o2.d_coef, &one, 8);
  /* the stream is held 300 ms by a host function: a library call that
   * synchronised (cudaStreamSynchronize, cudaMemcpy to pageable memory,
   * cudaMalloc/cudaFree) would block the host for that long */
  static const unsigned hold_us = 300000;
  double t0 = ct_now();
  if (!CT_CUDA(cudaLaunchHostFunc(f.st, sleep_host, (void *)&hold_us))) goto done;
  double t1 = ct_now();
  bx_status s1 = bx_cuda_clip_async(p, f.st, 1e-3, f.o.d_norm, f.o.d_coef, f.o.d_status);
  double t2 = ct_now();
  bx_status s2 = bx_cuda_norm_async(p, f.st, o2.d_norm, o2.d_groups, o2.d_status);
  double t3 = ct_now();
  bx_status s3 = bx_cuda_scale_async(p, f.st, o2.d_coef, NULL); /* by 1: no writes */
  double t4 = ct_now();
  cudaEventRecord(ev, f.st);
  cudaError_t q = cudaEventQuery(ev);
  CT_STATUS(s1, BX_OK, "clip_async behind a busy stream");
  CT_STATUS(s2, BX_OK, "norm_async behind a busy stream");
  CT_STATUS(s3, BX_OK, "scale_async behind a busy stream");
  CT_CHECK(q == cudaErrorNotReady, "the work finished before the 300 ms hold ended (query: %s): "
           "something waited", cudaGetErrorString(q));
  CT_CHECK(t2 - t1 < 0.05 && t3 - t2 < 0.05 && t4 - t3 < 0.05,
           "enqueue took clip %.1f ms, norm %.1f ms, scale %.1f ms: a call waited for the device",
           1e3 * (t2 - t1), 1e3 * (t3 - t2), 1e3 * (t4 - t3));
  ct_note("host time to enqueue behind a 300 ms hold: hostfunc %.3f ms, clip %.3f ms, norm %.3f ms, "
          "scale %.3f ms", 1e3 * (t1 - t0), 1e3 * (t2 - t1), 1e3 * (t3 - t2), 1e3 * (t4 - t3));
  (void)cudaGetLastError(); /* cudaErrorNotReady is not sticky; clear it anyway */
  got g, g2;
  if (!outs_read(&f.o, f.st, &g) || !outs_read(&o2, f.st, &g2)) goto done;
  /* expected: the CPU's clip, then the norm of the clipped gradients; the
   * final scale by exactly 1 writes nothing */
  double t = -1, c = -1, t2n = -1, gn[3];
  CT_STATUS(cpu_clip(&f.s, 1e-3, &co, &t, &c), BX_OK, "CPU clip");
  bx_group gc[3], gg[3];
  ct_groups(&f.s, 3, gc, gg);
  CT_STATUS(bx_total_norm(gc, 3, NULL, &co.norm, &t2n, gn), BX_OK, "CPU norm of the clipped grads");
  CT_BITS(g.norm, t, "async clip: total norm");
  CT_BITS(g.coef, c, "async clip: coefficient");
  CT_CHECK(g.status == 0, "async clip: d_status %d", (int)g.status);
  CT_BITS(g2.norm, t2n, "async norm after the clip");
  for (int i = 0; i < 3; i++) CT_BITS(g2.groups[i], gn[i], "async norm after the clip: group %d", i);
  if (ct_download(&f.s, f.back)) ct_compare_grads(&f.s, f.back, f.s.work, "async clip: gradients");
done:
  if (ev) cudaEventDestroy(ev);
  outs_free(&o2);
  bx_cuda_plan_destroy(p);
  fx_free(&f);
}

/* ---- a constant number of launches whatever the tensor count ---------- */
typedef struct node_count {
  int kernels, memsets, memcpys, others;
} node_count;

static int count_nodes(cudaGraph_t g, node_count *c) {
  memset(c, 0, sizeof *c);
  size_t n = 0;
  if (!CT_CUDA(cudaGraphGetNodes(g, NULL, &n))) return 0;
  cudaGraphNode_t *nodes = malloc((n ? n : 1) * sizeof *nodes);
  if (!CT_CHECK(nodes != NULL, "out of host memory")) return 0;
  int ok = CT_CUDA(cudaGraphGetNodes(g, nodes, &n));
  for (size_t i = 0; ok && i < n; i++) {
    enum cudaGraphNodeType t;
    if (!CT_CUDA(cudaGraphNodeGetType(nodes[i], &t))) break;
    if (t == cudaGraphNodeTypeKernel) c->kernels++;
    else if (t == cudaGraphNodeTypeMemset) c->memsets++;
    else if (t == cudaGraphNodeTypeMemcpy) c->memcpys++;
    else c->others++;
  }
  free(nodes);
  return ok;
}

/* Captures one call (which 0 norm, 1 clip, 2 scale) and counts its nodes. */
static int capture_count(bx_cuda_plan *p, int which, fixture *f, node_count *c) {
  cudaGraph_t g = NULL;
  if (!CT_CUDA(cudaStreamBeginCapture(f->st, cudaStreamCaptureModeGlobal))) return 0;
  bx_status s = which == 0 ? bx_cuda_norm_async(p, f->st, f->o.d_norm, f->o.d_groups, f->o.d_status)
              : which == 1 ? bx_cuda_clip_async(p, f->st, 1e-3, f->o.d_norm, f->o.d_coef, f->o.d_status)
                           : bx_cuda_scale_async(p, f->st, f->o.d_coef, f->o.d_status);
  cudaError_t e = cudaStreamEndCapture(f->st, &g);
  int ok = CT_STATUS(s, BX_OK, "captured call %d", which) && CT_CUDA(e) && count_nodes(g, c);
  if (g) cudaGraphDestroy(g);
  return ok;
}

void test_plan_launch_count(void) {
  ct_rng r;
  ct_rng_init(&r);
  static const char *what[3] = {"norm", "clip", "scale"};
  /* plan.cu: memset (raw words), memset (offender), reduce, wire, finish
   * [, scale]. bitexact_cuda.h's summary ("1 memset + 1 reduction kernel
   * + 1 finishing kernel") counts fewer; what matters is the bound and
   * that it does not grow with the tensor count. */
  static const int limit[3] = {5, 6, 1};
  node_count first[3];
  static const size_t counts[2] = {10, 5000};
  for (int cfg = 0; cfg < 2; cfg++) {
    fixture f;
    memset(&f, 0, sizeof f);
    int dts[5000];
    int64_t ns[5000];
    for (size_t i = 0; i < counts[cfg]; i++) {
      dts[i] = CT_F32;
      ns[i] = 2000000 / (int64_t)counts[cfg];
    }
    if (!ct_set_init(&f.s, counts[cfg], dts, ns, 0, &r)) return;
    if (!outs_alloc(&f.o) || !make_stream(&f.st)) {
      fx_free(&f);
      return;
    }
    ct_fill(&f.s, CT_GAUSS, &r);
    bx_cuda_plan *p = plan_for(&f.s, 3, NULL, NULL);
    if (p) {
      CT_STATUS(bx_cuda_clip_async(p, f.st, 1e9, f.o.d_norm, f.o.d_coef, f.o.d_status), BX_OK, "warm-up");
      CT_CUDA(cudaStreamSynchronize(f.st));
      for (int w = 0; w < 3; w++) {
        node_count c;
        if (!capture_count(p, w, &f, &c)) continue;
        ct_note("%zu tensors, %s: %d kernel(s), %d memset(s), %d memcpy(s), %d other node(s)",
                counts[cfg], what[w], c.kernels, c.memsets, c.memcpys, c.others);
        CT_CHECK(c.kernels + c.memsets + c.memcpys + c.others <= limit[w],
                 "%s: %d nodes, plan.cu enqueues at most %d", what[w],
                 c.kernels + c.memsets + c.memcpys + c.others, limit[w]);
        if (cfg == 0) first[w] = c;
        else
          CT_CHECK(memcmp(&c, &first[w], sizeof c) == 0,
                   "%s: the node count changed with the tensor count (10 -> 5000)", what[w]);
      }
      bx_cuda_plan_destroy(p);
    }
    fx_free(&f);
  }
}

/* ---- thousands of small tensors through a plan ------------------------ */
void test_plan_many_tensors(void) {
  ct_rng r;
  ct_rng_init(&r);
  fixture f;
  if (!fx_init(&f, 5000, 3000, &r)) return;
  bx_clip_opts co = BX_CLIP_OPTS_DEFAULT;
  bx_cuda_plan *p = plan_for(&f.s, 3, NULL, &co);
  if (p) {
    for (int data = 0; data < 2; data++) {
      ct_fill(&f.s, data ? CT_WIDE : CT_GAUSS, &r);
      got g;
      outs_poison(&f.o, f.st);
      CT_STATUS(bx_cuda_norm_async(p, f.st, f.o.d_norm, f.o.d_groups, f.o.d_status), BX_OK, "norm_async");
      if (outs_read(&f.o, f.st, &g)) {
        bx_group gc[3], gg[3];
        ct_groups(&f.s, 3, gc, gg);
        double t = -1, gn[3];
        CT_STATUS(bx_total_norm(gc, 3, NULL, NULL, &t, gn), BX_OK, "CPU norm");
        CT_BITS(g.norm, t, "5000 tensors, plan norm");
        for (int i = 0; i < 3; i++) CT_BITS(g.groups[i], gn[i], "5000 tensors, plan norm, group %d", i);
      }
      bx_group g1 = {f.s.cpu, f.s.count};
      double norm = 0;
      bx_total_norm(&g1, 1, NULL, NULL, &norm, NULL);
      plan_clip_case(&f.s, p, &co, isfinite(norm) && norm > 0 ? norm / 7 : 1.0, &f.o, f.st, f.back,
                     data ? "5000 tensors, plan clip, wide" : "5000 tensors, plan clip, gauss");
    }
    bx_cuda_plan_destroy(p);
  }
  fx_free(&f);
}

/* ---- argument errors, empty plans ------------------------------------- */
void test_plan_errors(void) {
  ct_rng r;
  ct_rng_init(&r);
  fixture f;
  if (!fx_init(&f, 4, 100, &r)) return;
  ct_fill(&f.s, CT_GAUSS, &r);
  CT_STATUS(bx_cuda_norm_async(NULL, f.st, f.o.d_norm, NULL, NULL), BX_EINVAL, "norm_async, NULL plan");
  CT_STATUS(bx_cuda_clip_async(NULL, f.st, 1.0, f.o.d_norm, NULL, NULL), BX_EINVAL, "clip_async, NULL plan");
  CT_STATUS(bx_cuda_scale_async(NULL, f.st, f.o.d_coef, NULL), BX_EINVAL, "scale_async, NULL plan");
  bx_cuda_plan_destroy(NULL);
  bx_cuda_plan *p = plan_for(&f.s, 1, NULL, NULL);
  if (p) {
    CT_STATUS(bx_cuda_norm_async(p, f.st, NULL, NULL, NULL), BX_EINVAL, "norm_async, NULL d_total_norm");
    CT_STATUS(bx_cuda_clip_async(p, f.st, 1.0, NULL, NULL, NULL), BX_EINVAL, "clip_async, NULL d_total_norm");
    bx_cuda_plan_destroy(p);
  }
  CT_STATUS(bx_cuda_plan_create(NULL, 1, NULL, NULL, &p), BX_EINVAL,
            "plan_create, NULL groups with ngroups 1");
  CT_STATUS(bx_cuda_plan_create(NULL, 0, NULL, NULL, NULL), BX_EINVAL, "plan_create, NULL out");
  /* options and communicators of another struct_size (bitexact.h, "Struct
   * sizes"): refused before anything else, *out NULL, the comm never called */
  {
    bx_group g1 = {f.s.gpu, f.s.count};
    bx_clip_opts co = BX_CLIP_OPTS_DEFAULT;
    size_t *sizes[3] = {&co.struct_size, &co.norm.struct_size, &co.scale.struct_size};
    const char *names[3] = {"opts->struct_size", "opts->norm.struct_size", "opts->scale.struct_size"};
    for (int k = 0; k < 3; k++)
      for (int v = 0; v < 2; v++) {
        size_t keep = *sizes[k];
        *sizes[k] = v ? keep + 8 : 0;
        p = (bx_cuda_plan *)&f; /* any non-NULL value */
        CT_STATUS(bx_cuda_plan_create(&g1, 1, NULL, &co, &p), BX_EINVAL, "plan_create, %s %zu",
                  names[k], *sizes[k]);
        CT_CHECK(strstr(bx_last_error(), names[k]) != NULL, "plan_create: the text names %s: %s",
                 names[k], bx_last_error());
        CT_CHECK(p == NULL, "plan_create, %s %zu: *out is not NULL", names[k], *sizes[k]);
        *sizes[k] = keep;
      }
    bx_comm bad = BX_COMM_DEFAULT;
    bad.struct_size = 0; /* refused before any collective */
    p = (bx_cuda_plan *)&f;
    CT_STATUS(bx_cuda_plan_create(&g1, 1, &bad, NULL, &p), BX_EINVAL, "plan_create, comm size 0");
    CT_CHECK(strstr(bx_last_error(), "comm->struct_size is 0") != NULL, "plan_create: %s",
             bx_last_error());
    CT_CHECK(p == NULL, "plan_create, comm size 0: *out is not NULL");
  }
  /* no tensors at all, and only empty tensors: a norm of +0, coefficient 1 */
  for (int empty = 0; empty < 2; empty++) {
    int64_t zero = 0;
    DLTensor z = f.s.gpu[0];
    z.shape = &zero;
    bx_group gz = {&z, 1};
    p = NULL;
    if (!CT_STATUS(bx_cuda_plan_create(empty ? &gz : NULL, empty ? 1 : 0, NULL, NULL, &p), BX_OK,
                   "plan of %s", empty ? "an empty tensor" : "no groups"))
      continue;
    outs_poison(&f.o, f.st);
    CT_STATUS(bx_cuda_clip_async(p, f.st, 1.0, f.o.d_norm, f.o.d_coef, f.o.d_status), BX_OK, "empty clip");
    got g;
    if (outs_read(&f.o, f.st, &g)) {
      CT_BITS(g.norm, 0.0, "empty plan: norm");
      CT_BITS(g.coef, 1.0, "empty plan: coefficient");
      CT_CHECK(g.status == 0, "empty plan: d_status %d", (int)g.status);
    }
    bx_cuda_plan_destroy(p);
  }
  fx_free(&f);
}
