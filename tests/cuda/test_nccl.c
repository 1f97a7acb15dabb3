/*
 * test_nccl.c — the NCCL adapter (bitexact_nccl.h) in one process on one
 * GPU (a one-rank communicator from ncclCommInitAll): the adapter's own
 * contract (fields, in-place SUM/MAX, errors), and the blocking and
 * stream-ordered paths with the communicator giving the same bits as
 * without (and as the CPU). Multi-rank NCCL runs need several GPUs; the
 * words' reduction is the same integer SUM/MAX the MPI tests cover.
 *
 * Built only when nccl.h and libnccl were found (BX_TEST_NCCL=1);
 * otherwise each test reports a skip.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ct.h"
#include "cuda_tests.h"

#if BX_TEST_NCCL
#include <nccl.h>

#include "bitexact_nccl.h"

typedef struct nccl_fx {
  ncclComm_t comm;
  cudaStream_t st;
  bx_comm c;
} nccl_fx;

static int nccl_up(nccl_fx *f) {
  memset(f, 0, sizeof *f);
  int dev = 0;
  cudaGetDevice(&dev);
  ncclResult_t rc = ncclCommInitAll(&f->comm, 1, &dev);
  if (!CT_CHECK(rc == ncclSuccess, "ncclCommInitAll(1 device): %s", ncclGetErrorString(rc))) return 0;
  if (!CT_CUDA(cudaStreamCreateWithFlags(&f->st, cudaStreamNonBlocking))) {
    ncclCommDestroy(f->comm);
    return 0;
  }
  f->c = bx_comm_nccl(f->comm, f->st);
  return 1;
}

static void nccl_down(nccl_fx *f) {
  if (f->st) cudaStreamSynchronize(f->st);
  if (f->comm) ncclCommDestroy(f->comm);
  if (f->st) cudaStreamDestroy(f->st);
  memset(f, 0, sizeof *f);
}

void test_nccl_adapter(void) {
  nccl_fx f;
  if (!nccl_up(&f)) return;
  int64_t *d = NULL;
  enum { N = BX_ACC_WORDS };
  int64_t w[N], back[N];
  for (int i = 0; i < N; i++) w[i] = (int64_t)(0x0123456789ABCDEFull * (uint64_t)(i + 1) >> 2) - i;
  CT_CHECK(f.c.on_device == 1, "on_device %d", f.c.on_device);
  CT_CHECK(f.c.rank == 0, "rank %d, expected 0", f.c.rank);
  CT_CHECK(f.c.stream == (void *)f.st, "stream field is not the stream given");
  CT_CHECK(f.c.ctx != NULL && f.c.allreduce_i64 && f.c.allreduce_i64_async, "functions/ctx unset");
  if (!CT_CUDA(cudaMalloc((void **)&d, sizeof w))) goto done;
  for (int op = 0; op < 2; op++)
    for (int async = 0; async < 2; async++) {
      ct_h2d(d, w, sizeof w);
      int rc = async ? f.c.allreduce_i64_async(d, N, (bx_op)op, f.c.ctx, (void *)f.st)
                     : f.c.allreduce_i64(d, N, (bx_op)op, f.c.ctx);
      CT_CHECK(rc == 0, "allreduce_i64%s op %d returned %d", async ? "_async" : "", op, rc);
      CT_CUDA(cudaStreamSynchronize(f.st));
      CT_CUDA(cudaMemcpy(back, d, sizeof w, cudaMemcpyDeviceToHost));
      CT_CHECK(memcmp(back, w, sizeof w) == 0, "one rank: the words must stay as they are (op %d, %s)",
               op, async ? "async" : "blocking");
    }
  CT_CHECK(f.c.allreduce_i64(d, 0, BX_OP_SUM, f.c.ctx) == 0, "n = 0 must succeed");
  CT_CHECK(f.c.allreduce_i64(d, 4, (bx_op)7, f.c.ctx) != 0, "an unknown op must fail");
  CT_CHECK(f.c.allreduce_i64_async(d, 4, (bx_op)7, f.c.ctx, (void *)f.st) != 0, "an unknown op must fail");
  {
    /* no communicator: every call fails, bitexact says BX_ECOMM/EINVAL */
    bx_comm bad = bx_comm_nccl(NULL, f.st);
    CT_CHECK(bad.rank == -1, "NULL communicator: rank %d, expected -1", bad.rank);
    CT_CHECK(bad.allreduce_i64(d, 4, BX_OP_SUM, bad.ctx) != 0, "NULL communicator must fail");
    float x[64];
    for (int i = 0; i < 64; i++) x[i] = (float)i;
    float *dx = NULL;
    if (CT_CUDA(cudaMalloc((void **)&dx, sizeof x))) {
      ct_h2d(dx, x, sizeof x);
      int64_t n = 64;
      DLTensor t = {dx, {kDLCUDA, 0}, 1, {kDLFloat, 32, 1}, &n, NULL, 0};
      cudaGetDevice(&t.device.device_id);
      bx_group g = {&t, 1};
      double norm = -1;
      bx_status s = bx_total_norm(&g, 1, &bad, NULL, &norm, NULL);
      CT_CHECK(s == BX_ECOMM || s == BX_EINVAL, "norm with a NULL NCCL communicator: %s (%s)",
               bx_status_str(s), bx_last_error());
      CT_CHECK(norm == -1, "norm written on failure");
      cudaFree(dx);
    }
  }
done:
  if (d) cudaFree(d);
  nccl_down(&f);
}

void test_nccl_blocking(void) {
  ct_rng r;
  ct_rng_init(&r);
  nccl_fx f;
  ct_set s;
  if (!nccl_up(&f)) return;
  if (!ct_set_random(&s, 60, 40000, -1, 1, &r)) goto done;
  static const int datas[] = {CT_GAUSS, CT_WIDE, CT_NANINF};
  for (size_t d = 0; d < 3; d++) {
    ct_fill(&s, datas[d], &r);
    for (int k = 0; k < CT_NNORMS; k++) {
      char label[96];
      snprintf(label, sizeof label, "NCCL blocking norm, %s, %s", ct_data_name(datas[d]), ct_norm_name(k));
      bx_norm_opts o = ct_norm_opts(k);
      ct_compare_norm(&s, 3, &f.c, &o, label); /* GPU with NCCL vs CPU alone */
    }
  }
  /* a clip through the communicator: as the CPU alone */
  ct_fill(&s, CT_GAUSS, &r);
  {
    bx_group gc[3], gg[3];
    ct_groups(&s, 3, gc, gg);
    double tc = -1, cc = -1, tg = -2, cg = -2;
    CT_STATUS(bx_clip_grad_norm(gc, 3, NULL, 1e-3, NULL, &tc, &cc), BX_OK, "CPU clip");
    CT_STATUS(bx_clip_grad_norm(gg, 3, &f.c, 1e-3, NULL, &tg, &cg), BX_OK, "GPU clip with NCCL");
    CT_BITS(tg, tc, "NCCL clip: total norm");
    CT_BITS(cg, cc, "NCCL clip: coefficient");
    unsigned char *back = malloc(s.bytes + 1);
    if (CT_CHECK(back != NULL, "out of host memory") && ct_download(&s, back))
      ct_compare_grads(&s, back, s.work, "NCCL clip: gradients");
    free(back);
  }
  ct_set_free(&s);
done:
  nccl_down(&f);
}

/* Plans with a device communicator: the all-reduces are enqueued on the
 * plan's stream; results as without the communicator. Also captured. */
void test_nccl_plan(void) {
  ct_rng r;
  ct_rng_init(&r);
  nccl_fx f;
  ct_set s;
  double *dres = NULL;
  int32_t *dst = NULL;
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  bx_cuda_plan *p = NULL;
  if (!nccl_up(&f)) return;
  if (!ct_set_random(&s, 80, 30000, -1, 1, &r)) goto done;
  if (!CT_CUDA(cudaMalloc((void **)&dres, 16 * sizeof(double))) ||
      !CT_CUDA(cudaMalloc((void **)&dst, sizeof(int32_t))))
    goto done;
  for (int k = 0; k < CT_NNORMS; k++) {
    bx_clip_opts co = BX_CLIP_OPTS_DEFAULT;
    co.norm = ct_norm_opts(k);
    bx_group gc[3], gg[3];
    ct_groups(&s, 3, gc, gg);
    p = NULL;
    if (!CT_STATUS(bx_cuda_plan_create(gg, 3, &f.c, &co, &p), BX_OK, "plan with NCCL, %s", ct_norm_name(k)))
      continue;
    ct_fill(&s, k & 1 ? CT_WIDE : CT_GAUSS, &r);
    CT_STATUS(bx_cuda_norm_async(p, f.st, dres, dres + 8, dst), BX_OK, "norm_async with NCCL");
    double h[16];
    int32_t hs = -1;
    CT_CUDA(cudaStreamSynchronize(f.st));
    CT_CUDA(cudaMemcpy(h, dres, sizeof h, cudaMemcpyDeviceToHost));
    CT_CUDA(cudaMemcpy(&hs, dst, 4, cudaMemcpyDeviceToHost));
    double t = -1, gn[3];
    CT_STATUS(bx_total_norm(gc, 3, NULL, &co.norm, &t, gn), BX_OK, "CPU norm");
    CT_BITS(h[0], t, "NCCL plan norm %s: total", ct_norm_name(k));
    for (int i = 0; i < 3; i++) CT_BITS(h[8 + i], gn[i], "NCCL plan norm %s: group %d", ct_norm_name(k), i);
    CT_CHECK(hs == 0, "NCCL plan norm: d_status %d", (int)hs);
    if (k == 0) { /* p = 2: clip, then the same clip captured in a graph */
      for (int captured = 0; captured < 2; captured++) {
        ct_fill(&s, CT_GAUSS, &r);
        double tc = -1, cc = -1;
        CT_STATUS(bx_clip_grad_norm(gc, 3, NULL, 1e-3, &co, &tc, &cc), BX_OK, "CPU clip");
        if (captured) {
          if (!CT_CUDA(cudaStreamBeginCapture(f.st, cudaStreamCaptureModeGlobal))) break;
          bx_status sc = bx_cuda_clip_async(p, f.st, 1e-3, dres, dres + 1, dst);
          cudaError_t e = cudaStreamEndCapture(f.st, &graph);
          CT_STATUS(sc, BX_OK, "clip_async with NCCL under capture");
          if (!CT_CUDA(e) || !CT_CUDA(cudaGraphInstantiate(&exec, graph, 0))) break;
          if (!CT_CUDA(cudaGraphLaunch(exec, f.st))) break;
        } else {
          CT_STATUS(bx_cuda_clip_async(p, f.st, 1e-3, dres, dres + 1, dst), BX_OK, "clip_async with NCCL");
        }
        CT_CUDA(cudaStreamSynchronize(f.st));
        CT_CUDA(cudaMemcpy(h, dres, sizeof h, cudaMemcpyDeviceToHost));
        CT_CUDA(cudaMemcpy(&hs, dst, 4, cudaMemcpyDeviceToHost));
        CT_BITS(h[0], tc, "NCCL plan clip%s: total", captured ? " (graph)" : "");
        CT_BITS(h[1], cc, "NCCL plan clip%s: coefficient", captured ? " (graph)" : "");
        CT_CHECK(hs == 0, "NCCL plan clip: d_status %d", (int)hs);
        unsigned char *back = malloc(s.bytes + 1);
        if (CT_CHECK(back != NULL, "out of host memory") && ct_download(&s, back))
          ct_compare_grads(&s, back, s.work, captured ? "NCCL graph clip: gradients" : "NCCL clip: gradients");
        free(back);
      }
    }
    bx_cuda_plan_destroy(p);
    p = NULL;
  }
done:
  bx_cuda_plan_destroy(p);
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  if (dres) cudaFree(dres);
  if (dst) cudaFree(dst);
  ct_set_free(&s);
  nccl_down(&f);
}

#else /* !BX_TEST_NCCL */

void test_nccl_adapter(void) { ct_skip("built without NCCL (nccl.h / libnccl not found)"); }
void test_nccl_blocking(void) { ct_skip("built without NCCL (nccl.h / libnccl not found)"); }
void test_nccl_plan(void) { ct_skip("built without NCCL (nccl.h / libnccl not found)"); }

#endif
