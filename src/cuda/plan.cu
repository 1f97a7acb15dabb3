/*
 * plan.cu — the host side of the stream-ordered CUDA API: plans
 * (validation, the chunk table, device buffers) and the calls of
 * bitexact_cuda.h. The blocking hooks (bx_total_norm & co. on CUDA tensors)
 * are backend.cu, built on the same plan code.
 *
 * A stream-ordered call enqueues, in this order and nothing else:
 *   memset (raw words) · memset (offender) · reduce · wire
 *   [· all-reduce MAX (agreement) · all-reduce SUM/MAX (norm words)]
 *   · finish [· scale]
 * No host synchronisation, no allocation: capturable in a CUDA graph.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "abi.h"
#include "call.h"
#include "cuda_internal.h"

bx_status bx_cu_fail(const char *fn, const char *what, cudaError_t e, cudaError_t pending_before) {
  if (pending_before == cudaSuccess) cudaGetLastError(); /* ours: do not leave it behind */
  return bx_fail(e == cudaErrorMemoryAllocation ? BX_ENOMEM : BX_EDEVICE, "%s: %s: %s (%s)", fn,
                 what, cudaGetErrorString(e), cudaGetErrorName(e));
}

int bx_cuda_plan_device(const bx_cuda_plan *plan) { return plan ? plan->device : -1; }

static size_t align256(size_t b) { return (b + 255) & ~(size_t)255; }

static int64_t bits_of(double d) {
  int64_t b;
  memcpy(&b, &d, 8);
  return b;
}

/* The i-th group of a call (flat tensors are one group). */
static const DLTensor *group_tensors(const bx_group *groups, const DLTensor *flat, size_t g,
                                     size_t *count, size_t fcount) {
  if (groups) {
    *count = groups[g].count;
    return groups[g].tensors;
  }
  *count = fcount;
  return flat;
}

bx_status bx_cu_plan_check(const char *fn, const bx_group *groups, size_t ngroups,
                           const DLTensor *flat, size_t count, const bx_clip_opts *o, int mode,
                           bx_cuda_plan *plan) {
  memset(plan, 0, sizeof *plan);
  size_t ng = groups ? ngroups : 1;
  if (groups == NULL && flat == NULL && count > 0)
    return bx_fail(BX_EINVAL, "%s: tensors is NULL with count %zu", fn, count);
  if (ngroups > 0 && !groups && !flat)
    return bx_fail(BX_EINVAL, "%s: groups is NULL with ngroups %zu", fn, ngroups);
  cudaError_t pending = cudaPeekAtLastError();
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess) {
    ndev = 0;
    if (pending == cudaSuccess) cudaGetLastError();
  }
  /* every tensor: CUDA, on one existing device, dense */
  int device = -1;
  size_t nchunks = 0;
  for (size_t g = 0; g < ng; g++) {
    size_t cnt;
    const DLTensor *ts = group_tensors(groups, flat, g, &cnt, count);
    size_t gid = groups ? g : BX_NO_GROUP;
    if (cnt > 0 && !ts)
      return bx_fail_at(BX_EINVAL, -1, gid, BX_NO_INDEX, "%s: group %zu: tensors is NULL with count %zu",
                        fn, g, cnt);
    for (size_t i = 0; i < cnt; i++) {
      const DLTensor *t = &ts[i];
      bx_span s;
      bx_status st = bx_tensor_span_cuda(t, fn, gid, i, &s);
      if (st != BX_OK) return st;
      if (t->device.device_id < 0 || t->device.device_id >= ndev)
        return bx_fail_at(BX_EDEVICE, -1, gid, i, "%s: group %zu, tensor %zu is on CUDA device %d, "
                          "but this process sees %d device(s)", fn, g, i, t->device.device_id, ndev);
      if (device < 0) device = t->device.device_id;
      else if (t->device.device_id != device)
        return bx_fail_at(BX_EDEVICE, -1, gid, i, "%s: group %zu, tensor %zu is on CUDA device %d, "
                          "the others on device %d; one call works on one device", fn, g, i,
                          t->device.device_id, device);
      nchunks += (s.n + BX_CU_CHUNK - 1) / BX_CU_CHUNK;
      plan->dtypes |= 1u << s.dtype;
    }
  }
  if (device < 0 && cudaGetDevice(&device) != cudaSuccess) {
    device = 0;
    if (pending == cudaSuccess) cudaGetLastError();
  }
  /* tensors sharing memory: a norm counts them twice (as on the CPU), a
   * scaling would scale an element twice: refused when scaling. Not an
   * error of this call: the caller's last error stays as it was. */
  bx_error_saved before;
  bx_error_save(&before);
  if (bx_check_writable(fn, flat, count, groups, ngroups, 1) != BX_OK) {
    plan->overlap = 1;
    snprintf(plan->overlap_msg, sizeof plan->overlap_msg, "%s", bx_last_error());
  }
  bx_error_restore(&before);
  plan->device = device;
  plan->ngroups = groups ? ngroups : 1;
  plan->nchunks = nchunks;
  plan->mode = mode;
  const char *sq = getenv("BX_CUDA_SQUARES"); /* a tuning switch: the bits never change */
  plan->int_squares = sq && strcmp(sq, "int") == 0;
  plan->opts = *o;
  plan->wire_words = bx_wire_words(mode);
  return BX_OK;
}

/* The layout of the buffers: sizes in the order of bx_cu_buffers. */
static void buffer_sizes(const bx_cuda_plan *plan, size_t sz[10]) {
  size_t ng = plan->ngroups ? plan->ngroups : 1;
  sz[0] = align256((plan->nchunks ? plan->nchunks : 1) * sizeof(bx_cu_chunk));
  sz[1] = align256(ng * BX_ACC_WORDS * sizeof(int64_t));
  sz[2] = align256(ng * BX_CU_EXT_WORDS * sizeof(uint64_t));
  sz[3] = 256;
  sz[4] = align256((BX_AGREE_WORDS + ng * plan->wire_words) * sizeof(int64_t));
  sz[5] = align256((2 + ng) * sizeof(double));
  sz[6] = 256;
  sz[7] = align256(sizeof(bx_mag));
  sz[8] = align256(BX_ACC_DIGITS * sizeof(int64_t));
  sz[9] = align256((plan->stage_words ? plan->stage_words : 1) * sizeof(int64_t));
}

size_t bx_cu_plan_bytes(const bx_cuda_plan *plan) {
  size_t sz[10], total = 0;
  buffer_sizes(plan, sz);
  for (int i = 0; i < 10; i++) total += sz[i];
  return total;
}

bx_status bx_cu_plan_bind(const char *fn, const bx_group *groups, size_t ngroups,
                          const DLTensor *flat, size_t count, bx_cuda_plan *plan, void *base,
                          bx_cu_chunk *host) {
  size_t sz[10];
  buffer_sizes(plan, sz);
  char *p = (char *)base;
  plan->b.chunks = (bx_cu_chunk *)p;        p += sz[0];
  plan->b.accs = (int64_t *)p;              p += sz[1];
  plan->b.ext = (uint64_t *)p;              p += sz[2];
  plan->b.offender = (int64_t *)p;          p += sz[3];
  plan->b.wire = (int64_t *)p;              p += sz[4];
  plan->b.result = (double *)p;             p += sz[5];
  plan->b.status = (int32_t *)p;            p += sz[6];
  plan->b.scratch = (bx_mag *)p;            p += sz[7];
  plan->b.total_digits = (int64_t *)p;      p += sz[8];
  plan->b.stage = (int64_t *)p;
  size_t k = 0, ng = groups ? ngroups : 1;
  for (size_t g = 0; g < ng; g++) {
    size_t cnt;
    const DLTensor *ts = group_tensors(groups, flat, g, &cnt, count);
    for (size_t i = 0; i < cnt; i++) {
      bx_span s;
      bx_tensor_span_cuda(&ts[i], fn, g, i, &s);
      size_t es = bx_dtype_size(s.dtype);
      for (size_t off = 0; off < s.n; off += BX_CU_CHUNK, k++) {
        host[k].data = (const char *)s.data + off * es;
        host[k].n = (uint32_t)(s.n - off < BX_CU_CHUNK ? s.n - off : BX_CU_CHUNK);
        host[k].dtype = (uint16_t)s.dtype;
        host[k].unused = 0;
        host[k].group = (uint32_t)(g > 0xFFFFFFFFu ? 0xFFFFFFFFu : g);
        host[k].tensor = (uint32_t)(i > 0xFFFFFFFFu ? 0xFFFFFFFFu : i);
      }
    }
  }
  cudaError_t pending = cudaPeekAtLastError();
  cudaError_t e = cudaSuccess;
  if (plan->nchunks)
    e = cudaMemcpy(plan->b.chunks, host, plan->nchunks * sizeof *host, cudaMemcpyHostToDevice);
  if (e == cudaSuccess) e = cudaMemset(plan->b.status, 0, sizeof(int32_t));
  if (e == cudaSuccess) e = cudaStreamSynchronize(0); /* the uploads have landed */
  if (e != cudaSuccess) return bx_cu_fail(fn, "uploading the chunk table", e, pending);
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, plan->device) != cudaSuccess ||
      sms < 1) {
    if (pending == cudaSuccess) cudaGetLastError();
    sms = 1;
  }
  /* exactly the blocks that are resident at once: a second wave of a
   * grid-stride kernel would run its share with the GPU mostly idle */
  size_t gr = (size_t)sms * (size_t)bx_cu_reduce_blocks_per_sm();
  size_t gs = (size_t)sms * (size_t)bx_cu_scale_blocks_per_sm();
  size_t nc = plan->nchunks ? plan->nchunks : 1;
  plan->grid = (int)(nc < gr ? nc : gr);
  plan->grid_scale = (int)(nc < gs ? nc : gs);
  /* the agreement items (agree.h); the call and max_norm are set per call */
  memset(plan->agree, 0, sizeof plan->agree);
  plan->agree[BX_AGREE_FORMAT] = BX_ACC_VERSION_TAG;
  plan->agree[BX_AGREE_NGROUPS] = (int64_t)plan->ngroups;
  plan->agree[BX_AGREE_NORM_TYPE] = bits_of(plan->opts.norm.norm_type);
  plan->agree[BX_AGREE_FLAVOR] = (int64_t)plan->opts.norm.flavor;
  plan->agree[BX_AGREE_NONFINITE] = plan->opts.norm.error_if_nonfinite != 0;
  plan->agree[BX_AGREE_NORM_DTYPE] = (int64_t)plan->opts.norm.norm_dtype;
  plan->agree[BX_AGREE_EPS] = bits_of(plan->opts.eps);
  plan->agree[BX_AGREE_FORMULA] = (int64_t)plan->opts.formula;
  plan->agree[BX_AGREE_SCALE_MODE] = (int64_t)plan->opts.scale.mode;
  return BX_OK;
}

static void plan_free(bx_cuda_plan *plan) {
  if (!plan) return;
  bx_cu_device_guard guard(plan->device);
  cudaError_t pending = cudaPeekAtLastError();
  if (plan->done) {
    cudaEventSynchronize(plan->done); /* work enqueued on the plan is done */
    cudaEventDestroy(plan->done);
  }
  if (plan->base) cudaFree(plan->base);
  if (pending == cudaSuccess) cudaGetLastError();
  free(plan);
}

void bx_cuda_plan_destroy(bx_cuda_plan *plan) { plan_free(plan); }

static bx_status check_clip_opts(const char *fn, const bx_clip_opts *o, int *mode) {
  bx_mode m = BX_M_SQ;
  bx_status st = bx_check_norm_opts(fn, &o->norm, &m);
  if (st == BX_OK) st = bx_check_clip_opts(fn, o);
  *mode = (int)m;
  return st;
}

static bx_status plan_build(const char *fn, const bx_group *groups, size_t ngroups,
                            const bx_clip_opts *o, int mode, bx_cuda_plan **out) {
  bx_cuda_plan *plan = (bx_cuda_plan *)calloc(1, sizeof *plan);
  if (!plan) return bx_fail(BX_ENOMEM, "%s: cannot allocate the plan", fn);
  bx_group none = {NULL, 0};
  const bx_group *gs = ngroups ? groups : &none;
  bx_status st = bx_cu_plan_check(fn, gs, ngroups, NULL, 0, o, mode, plan);
  plan->stage_words = BX_AGREE_WORDS; /* the creation's agreement, staged */
  bx_cu_chunk *host = NULL;
  if (st == BX_OK) {
    host = (bx_cu_chunk *)malloc((plan->nchunks ? plan->nchunks : 1) * sizeof *host);
    if (!host) st = bx_fail(BX_ENOMEM, "%s: cannot allocate the chunk table (%zu chunks)", fn, plan->nchunks);
  }
  if (st == BX_OK) {
    bx_cu_device_guard guard(plan->device);
    cudaError_t pending = cudaPeekAtLastError();
    cudaError_t e = cudaMalloc(&plan->base, bx_cu_plan_bytes(plan));
    if (e != cudaSuccess) {
      plan->base = NULL;
      st = bx_cu_fail(fn, "cudaMalloc of the plan's buffers", e, pending);
    }
    if (st == BX_OK) st = bx_cu_plan_bind(fn, gs, ngroups, NULL, 0, plan, plan->base, host);
    if (st == BX_OK) {
      e = cudaEventCreateWithFlags(&plan->done, cudaEventDisableTiming);
      if (e != cudaSuccess) {
        plan->done = NULL;
        st = bx_cu_fail(fn, "creating the plan's event", e, pending);
      }
    }
  }
  free(host);
  if (st != BX_OK) {
    plan_free(plan);
    return st;
  }
  *out = plan;
  return BX_OK;
}

static bx_status plan_create(const char *fn, const bx_group *groups, size_t ngroups,
                             const bx_comm *comm, const bx_clip_opts *opts, bx_cuda_plan **out) {
  /* struct sizes before anything else; a comm of another layout is never
   * called (abi.h), options of another layout are a local failure that
   * still joins the agreement below */
  bx_status st = bx_check_comm_size(fn, comm);
  if (out) *out = NULL;
  if (st != BX_OK) return st;
  st = bx_check_clip_opts_size(fn, opts);
  if (st != BX_OK && !comm) return st;
  bx_clip_opts o = BX_CLIP_OPTS_DEFAULT;
  if (opts && st == BX_OK) o = *opts;
  if (st == BX_OK && !out) return bx_fail(BX_EINVAL, "%s: out is NULL", fn);
  int mode = 0;
  bx_cuda_plan *plan = NULL;
  if (st == BX_OK) st = check_clip_opts(fn, &o, &mode);
  if (st == BX_OK) st = bx_cuda_available();
  if (st == BX_OK && ngroups > 0 && !groups)
    st = bx_fail(BX_EINVAL, "%s: groups is NULL with ngroups %zu", fn, ngroups);
  if (st == BX_OK) st = plan_build(fn, groups, ngroups, &o, mode, &plan);
  if (comm) {
    /* collective: every rank learns whether any rank failed here */
    if (st == BX_OK && (!comm->on_device || !comm->allreduce_i64_async))
      st = bx_fail(BX_EINVAL, "%s: rank %d: the stream-ordered API needs a device communicator "
                   "(bx_comm_nccl); use bx_total_norm for a host one", fn, comm->rank);
    int64_t items[BX_AGREE_ITEMS];
    memset(items, 0, sizeof items);
    if (plan) memcpy(items, plan->agree, sizeof items);
    items[BX_AGREE_CALL] = 0; /* a plan serves norms and clips */
    int64_t offender = -1;
    unsigned dtypes = plan ? plan->dtypes : 0;
    if (comm->allreduce_i64) {
      /* a device communicator stages the words through the plan's buffer;
       * a rank without a plan (it failed) stages through a temporary one:
       * a failure path, where an allocation cannot strand the others */
      bx_device_call dc;
      bx_cuda_plan tmp;
      memset(&dc, 0, sizeof dc);
      dc.level = -1;
      dc.plan = plan;
      if (!plan && comm->on_device) {
        memset(&tmp, 0, sizeof tmp);
        tmp.stage_words = BX_AGREE_WORDS;
        if (cudaMalloc((void **)&tmp.b.stage, BX_AGREE_WORDS * sizeof(int64_t)) != cudaSuccess)
          tmp.b.stage = NULL, tmp.stage_words = 0;
        dc.plan = &tmp;
      }
      st = bx_agree(comm, &dc, fn, items, st, &offender, &dtypes);
      if (!plan && comm->on_device && tmp.b.stage) cudaFree(tmp.b.stage);
    }
    if (st == BX_OK) {
      plan->comm = *comm;
      plan->has_comm = 1;
    }
  }
  if (st != BX_OK) {
    plan_free(plan);
    return st;
  }
  *out = plan;
  return BX_OK;
}

bx_status bx_cuda_plan_create(const bx_group *groups, size_t ngroups, const bx_comm *comm,
                              const bx_clip_opts *opts, bx_cuda_plan **out) {
  static const char *fn = "bx_cuda_plan_create";
  bx_call c;
  bx_status st = bx_call_enter(&c, fn);
  if (st != BX_OK) return st;
  st = plan_create(fn, groups, ngroups, comm, opts, out);
  bx_call_leave(&c);
  return st;
}

/* Marks the end of the plan's work on stream (for bx_cuda_plan_destroy);
 * not while the stream is being captured (the graph's replays are the
 * caller's to wait for). */
static void mark_done(bx_cuda_plan *plan, cudaStream_t stream) {
  cudaError_t pending = cudaPeekAtLastError();
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &cs) == cudaSuccess && cs == cudaStreamCaptureStatusNone)
    cudaEventRecord(plan->done, stream);
  if (pending == cudaSuccess) cudaGetLastError();
}

/* The whole stream-ordered norm (and clip) of a plan. */
static bx_status enqueue(const char *fn, bx_cuda_plan *plan, cudaStream_t stream, int clip,
                         double max_norm, int out_code, void *d_total, double *d_groups,
                         double *d_coef, int32_t *d_status) {
  if (!plan) return bx_fail(BX_EINVAL, "%s: plan is NULL", fn);
  if (!d_total) return bx_fail(BX_EINVAL, "%s: d_total_norm is NULL", fn);
  bx_status local = BX_OK;
  if (clip && !(max_norm >= 0))
    local = bx_fail(BX_EINVAL, "%s: max_norm %g is negative or NaN", fn, max_norm);
  else if (clip && plan->overlap)
    local = bx_fail(BX_ELAYOUT, "%s", plan->overlap_msg);
  if (local != BX_OK) {
    if (!plan->has_comm) return local; /* alone: nothing enqueued */
    max_norm = 0.0; /* with others: take part, so they fail instead of hanging */
  }
  bx_cu_device_guard guard(plan->device);
  int rank = plan->has_comm ? plan->comm.rank : 0;
  size_t ng = plan->ngroups ? plan->ngroups : 1;
  double *coef_out = d_coef ? d_coef : plan->b.result + 1;
  cudaError_t pending = cudaPeekAtLastError();
  cudaError_t e = cudaMemsetAsync(plan->b.accs, 0,
                                  (size_t)((char *)plan->b.offender - (char *)plan->b.accs), stream);
  if (e == cudaSuccess) e = cudaMemsetAsync(plan->b.offender, 0xFF, sizeof(int64_t), stream);
  if (e == cudaSuccess) e = bx_cu_launch_reduce(plan, stream, rank);
  if (e == cudaSuccess)
    e = bx_cu_launch_wire(plan, stream, clip ? BX_CALL_CLIP : BX_CALL_NORM,
                          bits_of(clip ? max_norm : 0.0), bx_agree_failure_key(rank, (int)local));
  if (e != cudaSuccess) return bx_cu_fail(fn, "enqueueing the norm", e, pending);
  if (plan->has_comm) {
    const bx_comm *c = &plan->comm;
    bx_op op = bx_wire_by_max(plan->mode, plan->opts.norm.norm_type) ? BX_OP_MAX : BX_OP_SUM;
    int rc = c->allreduce_i64_async(plan->b.wire, BX_AGREE_WORDS, BX_OP_MAX, c->ctx, (void *)stream);
    if (rc == 0)
      rc = c->allreduce_i64_async(plan->b.wire + BX_AGREE_WORDS, ng * plan->wire_words, op,
                                  c->ctx, (void *)stream);
    if (rc != 0)
      return bx_fail_at(BX_ECOMM, rank, BX_NO_INDEX, BX_NO_INDEX,
                        "%s: rank %d: the device communicator's all-reduce failed with code %d; "
                        "no gradient will be modified", fn, rank, rc);
  }
  e = bx_cu_launch_finish(plan, stream, clip, max_norm, out_code, d_total, d_groups, coef_out,
                          d_status);
  if (e == cudaSuccess && clip)
    e = bx_cu_launch_scale(plan, stream, coef_out, 1.0, plan->b.status, 1);
  if (e != cudaSuccess) return bx_cu_fail(fn, "enqueueing the norm", e, pending);
  mark_done(plan, stream);
  return local;
}

bx_status bx_cuda_norm_async(bx_cuda_plan *plan, cudaStream_t stream, double *d_total_norm,
                             double *d_group_norms, int32_t *d_status) {
  static const char *fn = "bx_cuda_norm_async";
  bx_call c;
  bx_status st = bx_call_enter(&c, fn);
  if (st != BX_OK) return st;
  st = enqueue(fn, plan, stream, 0, 0.0, BX_DT_F64, d_total_norm, d_group_norms, NULL, d_status);
  bx_call_leave(&c);
  return st;
}

bx_status bx_cuda_norm_async_dtype(bx_cuda_plan *plan, cudaStream_t stream, DLDataType out_dtype,
                                   void *d_total_norm, int32_t *d_status) {
  static const char *fn = "bx_cuda_norm_async_dtype";
  bx_dtype code;
  if (bx_dtype_from_dl(out_dtype, &code) != BX_OK)
    return bx_fail(BX_EDTYPE, "%s: out_dtype (code %u, %u bits, %u lanes) is not float16, "
                   "bfloat16, float32 or float64", fn, (unsigned)out_dtype.code,
                   (unsigned)out_dtype.bits, (unsigned)out_dtype.lanes);
  bx_call c;
  bx_status st = bx_call_enter(&c, fn);
  if (st != BX_OK) return st;
  st = enqueue(fn, plan, stream, 0, 0.0, (int)code, d_total_norm, NULL, NULL, d_status);
  bx_call_leave(&c);
  return st;
}

bx_status bx_cuda_clip_async(bx_cuda_plan *plan, cudaStream_t stream, double max_norm,
                             double *d_total_norm, double *d_coef, int32_t *d_status) {
  static const char *fn = "bx_cuda_clip_async";
  bx_call c;
  bx_status st = bx_call_enter(&c, fn);
  if (st != BX_OK) return st;
  st = enqueue(fn, plan, stream, 1, max_norm, BX_DT_F64, d_total_norm, NULL, d_coef, d_status);
  bx_call_leave(&c);
  return st;
}

bx_status bx_cuda_scale_async(bx_cuda_plan *plan, cudaStream_t stream, const double *d_coef,
                              const int32_t *d_status) {
  static const char *fn = "bx_cuda_scale_async";
  if (!plan) return bx_fail(BX_EINVAL, "%s: plan is NULL", fn);
  if (!d_coef) return bx_fail(BX_EINVAL, "%s: d_coef is NULL", fn);
  if (plan->overlap) return bx_fail(BX_ELAYOUT, "%s", plan->overlap_msg);
  bx_cu_device_guard guard(plan->device);
  cudaError_t pending = cudaPeekAtLastError();
  cudaError_t e = bx_cu_launch_scale(plan, stream, d_coef, 1.0, d_status, 1);
  if (e != cudaSuccess) return bx_cu_fail(fn, "enqueueing the scaling", e, pending);
  mark_done(plan, stream);
  return BX_OK;
}
