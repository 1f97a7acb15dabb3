/*
 * plan.cu — the host side of the CUDA backend: plans (validation, the chunk
 * table, device buffers), the stream-ordered calls of bitexact_cuda.h, and
 * the hooks through which bx_total_norm / bx_clip_grad_norm / bx_scale
 * serve CUDA tensors (blocking, on the legacy default stream).
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

#include "cuda_internal.h"

/* Selects a device for the scope of a call and restores the caller's. */
struct device_guard {
  int prev;
  bool ok;
  explicit device_guard(int dev) {
    ok = cudaGetDevice(&prev) == cudaSuccess;
    cudaSetDevice(dev);
  }
  ~device_guard() {
    if (ok) cudaSetDevice(prev);
  }
};

static bx_status cuda_fail(const char *fn, const char *what, cudaError_t e) {
  cudaGetLastError(); /* clear a sticky launch error for the next call */
  return bx_fail(e == cudaErrorMemoryAllocation ? BX_ENOMEM : BX_EDEVICE, "%s: %s: %s (%s)", fn,
                 what, cudaGetErrorString(e), cudaGetErrorName(e));
}

bx_status bx_cuda_available(void) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return bx_fail(BX_EDEVICE, "bx_cuda_available: the CUDA backend is built in, but no CUDA "
                   "device is usable: %s", cudaGetErrorString(e));
  }
  if (n == 0) return bx_fail(BX_EDEVICE, "bx_cuda_available: no CUDA device");
  return BX_OK;
}

int bx_cuda_plan_device(const bx_cuda_plan *plan) { return plan ? plan->device : -1; }

static size_t align256(size_t b) { return (b + 255) & ~(size_t)255; }

static int64_t bits_of(double d) {
  int64_t b;
  memcpy(&b, &d, 8);
  return b;
}

/* Validation, the chunk table and the device buffers for groups. */
static bx_status plan_build(const char *fn, const bx_group *groups, size_t ngroups,
                            const bx_clip_opts *o, int mode, bx_cuda_plan **out) {
  *out = NULL;
  if (ngroups > 0 && !groups) return bx_fail(BX_EINVAL, "%s: groups is NULL with ngroups %zu", fn, ngroups);
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess) ndev = 0;
  cudaGetLastError();
  /* every tensor: CUDA, on one existing device, dense */
  int device = -1;
  size_t nchunks = 0;
  for (size_t g = 0; g < ngroups; g++) {
    if (groups[g].count > 0 && !groups[g].tensors)
      return bx_fail(BX_EINVAL, "%s: group %zu: tensors is NULL with count %zu", fn, g,
                     groups[g].count);
    for (size_t i = 0; i < groups[g].count; i++) {
      const DLTensor *t = &groups[g].tensors[i];
      bx_span s;
      bx_status st = bx_tensor_span_cuda(t, fn, g, i, &s);
      if (st != BX_OK) return st;
      if (t->device.device_id < 0 || t->device.device_id >= ndev)
        return bx_fail(BX_EDEVICE, "%s: group %zu, tensor %zu is on CUDA device %d, but this "
                       "process sees %d device(s)", fn, g, i, t->device.device_id, ndev);
      if (device < 0) device = t->device.device_id;
      else if (t->device.device_id != device)
        return bx_fail(BX_EDEVICE, "%s: group %zu, tensor %zu is on CUDA device %d, the "
                       "others on device %d; one call works on one device", fn, g, i,
                       t->device.device_id, device);
      nchunks += (s.n + BX_CU_CHUNK - 1) / BX_CU_CHUNK;
    }
  }
  if (device < 0 && cudaGetDevice(&device) != cudaSuccess) device = 0;
  /* tensors sharing memory: a norm counts them twice (as on the CPU), a
   * scaling would scale an element twice: refused when scaling */
  char overlap_msg[256] = "";
  if (bx_validate_scale_targets(fn, NULL, 0, groups, ngroups, 1) != BX_OK)
    snprintf(overlap_msg, sizeof overlap_msg, "%s", bx_last_error());
  device_guard guard(device);

  bx_cuda_plan *plan = (bx_cuda_plan *)calloc(1, sizeof *plan);
  bx_cu_chunk *host = (bx_cu_chunk *)malloc((nchunks ? nchunks : 1) * sizeof *host);
  if (!plan || !host) {
    free(plan);
    free(host);
    return bx_fail(BX_ENOMEM, "%s: cannot allocate the plan (%zu chunks)", fn, nchunks);
  }
  plan->device = device;
  plan->overlap = overlap_msg[0] != 0;
  memcpy(plan->overlap_msg, overlap_msg, sizeof overlap_msg);
  plan->ngroups = ngroups;
  plan->nchunks = nchunks;
  plan->mode = mode;
  const char *sq = getenv("BX_CUDA_SQUARES"); /* a tuning switch: the bits never change */
  plan->int_squares = sq && strcmp(sq, "int") == 0;
  plan->opts = *o;
  plan->wire_words = mode == BX_M_EXT ? 2 : BX_ACC_WORDS;
  size_t k = 0;
  for (size_t g = 0; g < ngroups; g++)
    for (size_t i = 0; i < groups[g].count; i++) {
      bx_span s;
      bx_tensor_span_cuda(&groups[g].tensors[i], fn, g, i, &s);
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
  size_t ng = ngroups ? ngroups : 1;
  size_t b_chunks = align256((nchunks ? nchunks : 1) * sizeof(bx_cu_chunk));
  size_t b_accs = align256(ng * BX_ACC_WORDS * sizeof(int64_t));
  size_t b_ext = align256(ng * BX_CU_EXT_WORDS * sizeof(uint64_t));
  size_t b_off = 256;
  size_t b_wire = align256((BX_CU_AGREE_WORDS + ng * plan->wire_words) * sizeof(int64_t));
  size_t b_result = align256((2 + ng) * sizeof(double));
  size_t b_status = 256;
  size_t b_scratch = align256(sizeof(bx_mag));
  size_t b_total = align256(BX_ACC_DIGITS * sizeof(int64_t));
  size_t bytes = b_chunks + b_accs + b_ext + b_off + b_wire + b_result + b_status + b_scratch + b_total;
  cudaError_t e = cudaMalloc(&plan->base, bytes);
  if (e != cudaSuccess) {
    free(plan);
    free(host);
    return cuda_fail(fn, "cudaMalloc of the plan's buffers", e);
  }
  char *p = (char *)plan->base;
  plan->chunks = (bx_cu_chunk *)p;        p += b_chunks;
  plan->accs = (int64_t *)p;              p += b_accs;
  plan->ext = (uint64_t *)p;              p += b_ext;
  plan->offender = (int64_t *)p;          p += b_off;
  plan->wire = (int64_t *)p;              p += b_wire;
  plan->result = (double *)p;             p += b_result;
  plan->status = (int32_t *)p;            p += b_status;
  plan->scratch = (bx_mag *)p;            p += b_scratch;
  plan->total_digits = (int64_t *)p;
  if (nchunks) e = cudaMemcpy(plan->chunks, host, nchunks * sizeof *host, cudaMemcpyHostToDevice);
  if (e == cudaSuccess) e = cudaMemset(plan->status, 0, sizeof(int32_t));
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&plan->done, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaStreamSynchronize(0); /* the uploads have landed */
  free(host);
  if (e != cudaSuccess) {
    if (plan->done) cudaEventDestroy(plan->done);
    cudaFree(plan->base);
    free(plan);
    return cuda_fail(fn, "uploading the chunk table", e);
  }
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms < 1)
    sms = 1;
  /* exactly the blocks that are resident at once: a second wave of a
   * grid-stride kernel would run its share with the GPU mostly idle */
  size_t gr = (size_t)sms * (size_t)bx_cu_reduce_blocks_per_sm();
  size_t gs = (size_t)sms * (size_t)bx_cu_scale_blocks_per_sm();
  size_t nc = nchunks ? nchunks : 1;
  plan->grid = (int)(nc < gr ? nc : gr);
  plan->grid_scale = (int)(nc < gs ? nc : gs);
  /* the agreement values (collective.c's items, and the clip's) */
  plan->agree[0] = BX_ACC_VERSION_TAG;
  plan->agree[1] = (int64_t)ngroups;
  plan->agree[2] = bits_of(o->norm.norm_type);
  plan->agree[3] = (int64_t)o->norm.flavor;
  plan->agree[4] = o->norm.error_if_nonfinite != 0;
  plan->agree[5] = bits_of(o->eps);
  plan->agree[6] = (int64_t)o->formula;
  plan->agree[7] = (int64_t)o->scale.mode;
  plan->agree[8] = 0; /* max_norm: per call */
  *out = plan;
  return BX_OK;
}

static void plan_free(bx_cuda_plan *plan) {
  if (!plan) return;
  device_guard guard(plan->device);
  cudaEventSynchronize(plan->done); /* work enqueued on the plan is done */
  cudaEventDestroy(plan->done);
  cudaGetLastError();
  cudaFree(plan->base);
  free(plan);
}

void bx_cuda_plan_destroy(bx_cuda_plan *plan) { plan_free(plan); }

static bx_status check_clip_opts(const char *fn, const bx_clip_opts *o, int *mode) {
  bx_mode m;
  bx_status st = bx_check_norm_opts(fn, &o->norm, &m);
  if (st != BX_OK) return st;
  if (!(o->eps >= 0)) return bx_fail(BX_EINVAL, "%s: eps %g is negative or NaN", fn, o->eps);
  if (o->formula != BX_COEF_TORCH && o->formula != BX_COEF_MAX)
    return bx_fail(BX_EINVAL, "%s: unknown formula %d", fn, (int)o->formula);
  if (o->scale.mode != BX_SCALE_TORCH && o->scale.mode != BX_SCALE_EXACT)
    return bx_fail(BX_EINVAL, "%s: unknown scale mode %d", fn, (int)o->scale.mode);
  *mode = (int)m;
  return BX_OK;
}

bx_status bx_cuda_plan_create(const bx_group *groups, size_t ngroups, const bx_comm *comm,
                              const bx_clip_opts *opts, bx_cuda_plan **out) {
  static const char *fn = "bx_cuda_plan_create";
  bx_clip_opts o = BX_CLIP_OPTS_DEFAULT;
  if (opts) o = *opts;
  if (!out) return bx_fail(BX_EINVAL, "%s: out is NULL", fn);
  *out = NULL;
  int mode = 0;
  bx_cuda_plan *plan = NULL;
  bx_status st = check_clip_opts(fn, &o, &mode);
  if (st == BX_OK) st = bx_cuda_available();
  if (st == BX_OK) st = plan_build(fn, groups, ngroups, &o, mode, &plan);
  if (comm) {
    /* collective: every rank learns whether any rank failed here */
    if (st == BX_OK && (!comm->on_device || !comm->allreduce_i64_async))
      st = bx_fail(BX_EINVAL, "%s: rank %d: the stream-ordered API needs a device communicator "
                   "(bx_comm_nccl); use bx_total_norm for a host one", fn, comm->rank);
    bx_agree_item items[BX_CU_AGREE_ITEMS - 1] = {
        {"the accumulator format (bitexact build)", BX_ACC_VERSION_TAG},
        {"the number of groups", (int64_t)ngroups},
        {"norm_type", bits_of(o.norm.norm_type)},
        {"flavor", (int64_t)o.norm.flavor},
        {"error_if_nonfinite", (int64_t)(o.norm.error_if_nonfinite != 0)},
        {"eps", bits_of(o.eps)},
        {"the coefficient formula", (int64_t)o.formula},
        {"the scale mode", (int64_t)o.scale.mode}};
    int64_t offender = -1, failure = bx_failure_key(comm->rank, st);
    if (comm->allreduce_i64) {
      bx_status agreed = bx_agree(comm, fn, items, BX_CU_AGREE_ITEMS - 1, &offender, &failure);
      if (st == BX_OK) st = agreed;
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

/* The whole stream-ordered norm (and clip) of a plan. */
/* Marks the end of the plan's work on stream (for bx_cuda_plan_destroy);
 * not while the stream is being captured (the graph's replays are the
 * caller's to wait for). */
static void mark_done(bx_cuda_plan *plan, cudaStream_t stream) {
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &cs) == cudaSuccess && cs == cudaStreamCaptureStatusNone)
    cudaEventRecord(plan->done, stream);
  cudaGetLastError();
}

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
  device_guard guard(plan->device);
  int rank = plan->has_comm ? plan->comm.rank : 0;
  size_t ng = plan->ngroups ? plan->ngroups : 1;
  double *coef_out = d_coef ? d_coef : plan->result + 1;
  cudaError_t e = cudaMemsetAsync(plan->accs, 0,
                                  (size_t)((char *)plan->offender - (char *)plan->accs), stream);
  if (e == cudaSuccess) e = cudaMemsetAsync(plan->offender, 0xFF, sizeof(int64_t), stream);
  if (e == cudaSuccess) e = bx_cu_launch_reduce(plan, stream, rank);
  if (e == cudaSuccess)
    e = bx_cu_launch_wire(plan, stream, bits_of(clip ? max_norm : 0.0),
                          bx_failure_key(rank, local));
  if (e != cudaSuccess) return cuda_fail(fn, "enqueueing the norm", e);
  if (plan->has_comm) {
    const bx_comm *c = &plan->comm;
    bx_op op = plan->mode == BX_M_EXT && plan->opts.norm.norm_type != 0.0 ? BX_OP_MAX : BX_OP_SUM;
    int rc = c->allreduce_i64_async(plan->wire, BX_CU_AGREE_WORDS, BX_OP_MAX, c->ctx, (void *)stream);
    if (rc == 0)
      rc = c->allreduce_i64_async(plan->wire + BX_CU_AGREE_WORDS, ng * plan->wire_words, op,
                                  c->ctx, (void *)stream);
    if (rc != 0)
      return bx_fail(BX_ECOMM, "%s: rank %d: the device communicator's all-reduce failed with "
                     "code %d; no gradient will be modified", fn, rank, rc);
  }
  e = bx_cu_launch_finish(plan, stream, clip, max_norm, out_code, d_total, d_groups, coef_out,
                          d_status);
  if (e == cudaSuccess && clip)
    e = bx_cu_launch_scale(plan, stream, coef_out, 1.0, plan->status, 1);
  if (e != cudaSuccess) return cuda_fail(fn, "enqueueing the norm", e);
  mark_done(plan, stream);
  return local;
}

bx_status bx_cuda_norm_async(bx_cuda_plan *plan, cudaStream_t stream, double *d_total_norm,
                             double *d_group_norms, int32_t *d_status) {
  return enqueue("bx_cuda_norm_async", plan, stream, 0, 0.0, BX_DT_F64, d_total_norm,
                 d_group_norms, NULL, d_status);
}

bx_status bx_cuda_norm_async_dtype(bx_cuda_plan *plan, cudaStream_t stream, DLDataType out_dtype,
                                   void *d_total_norm, int32_t *d_status) {
  static const char *fn = "bx_cuda_norm_async_dtype";
  int code;
  if (out_dtype.lanes != 1) code = -1;
  else if (out_dtype.code == kDLFloat && out_dtype.bits == 64) code = BX_DT_F64;
  else if (out_dtype.code == kDLFloat && out_dtype.bits == 32) code = BX_DT_F32;
  else if (out_dtype.code == kDLFloat && out_dtype.bits == 16) code = BX_DT_F16;
  else if (out_dtype.code == kDLBfloat && out_dtype.bits == 16) code = BX_DT_BF16;
  else code = -1;
  if (code < 0)
    return bx_fail(BX_EDTYPE, "%s: out_dtype (code %u, %u bits, %u lanes) is not float16, "
                   "bfloat16, float32 or float64", fn, (unsigned)out_dtype.code,
                   (unsigned)out_dtype.bits, (unsigned)out_dtype.lanes);
  return enqueue(fn, plan, stream, 0, 0.0, code, d_total_norm, NULL, NULL, d_status);
}

bx_status bx_cuda_clip_async(bx_cuda_plan *plan, double max_norm, cudaStream_t stream,
                             double *d_total_norm, double *d_coef, int32_t *d_status) {
  return enqueue("bx_cuda_clip_async", plan, stream, 1, max_norm, BX_DT_F64, d_total_norm, NULL,
                 d_coef, d_status);
}

bx_status bx_cuda_scale_async(bx_cuda_plan *plan, const double *d_coef, const int32_t *d_status,
                              cudaStream_t stream) {
  static const char *fn = "bx_cuda_scale_async";
  if (!plan) return bx_fail(BX_EINVAL, "%s: plan is NULL", fn);
  if (!d_coef) return bx_fail(BX_EINVAL, "%s: d_coef is NULL", fn);
  if (plan->overlap) return bx_fail(BX_ELAYOUT, "%s", plan->overlap_msg);
  device_guard guard(plan->device);
  cudaError_t e = bx_cu_launch_scale(plan, stream, d_coef, 1.0, d_status, 1);
  if (e != cudaSuccess) return cuda_fail(fn, "enqueueing the scaling", e);
  mark_done(plan, stream);
  return BX_OK;
}

/* ---- hooks for the blocking API (internal.h) ---------------------------- */

bx_status bx_cuda_partials(const char *fn, const bx_group *groups, size_t ngroups, bx_mode m,
                           double p, int rank, bx_partial *parts, int64_t *offender) {
  bx_status st = bx_cuda_available();
  if (st != BX_OK) return bx_fail(st, "%s: %s", fn, bx_last_error());
  bx_clip_opts o = BX_CLIP_OPTS_DEFAULT;
  o.norm.norm_type = p;
  bx_cuda_plan *plan;
  st = plan_build(fn, groups, ngroups, &o, (int)m, &plan);
  if (st != BX_OK) return st;
  device_guard guard(plan->device);
  size_t ng = ngroups ? ngroups : 1;
  int64_t *raw = (int64_t *)malloc(ng * (BX_ACC_WORDS + BX_CU_EXT_WORDS) * sizeof(int64_t));
  if (!raw) {
    plan_free(plan);
    return bx_fail(BX_ENOMEM, "%s: cannot allocate %zu groups' words", fn, ng);
  }
  uint64_t *ext = (uint64_t *)(raw + ng * BX_ACC_WORDS);
  cudaStream_t s0 = 0; /* legacy default stream: ordered after other blocking streams */
  cudaError_t e = cudaMemsetAsync(plan->accs, 0, (size_t)((char *)plan->offender - (char *)plan->accs), s0);
  if (e == cudaSuccess) e = cudaMemsetAsync(plan->offender, 0xFF, sizeof(int64_t), s0);
  if (e == cudaSuccess) e = bx_cu_launch_reduce(plan, s0, rank);
  if (e == cudaSuccess) e = cudaMemcpy(raw, plan->accs, ng * BX_ACC_WORDS * sizeof(int64_t), cudaMemcpyDeviceToHost);
  if (e == cudaSuccess) e = cudaMemcpy(ext, plan->ext, ng * BX_CU_EXT_WORDS * sizeof(uint64_t), cudaMemcpyDeviceToHost);
  if (e == cudaSuccess) e = cudaMemcpy(offender, plan->offender, sizeof(int64_t), cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) {
    free(raw);
    plan_free(plan);
    return cuda_fail(fn, "the reduction kernel", e);
  }
  for (size_t g = 0; g < ngroups; g++) {
    bx_partial *q = &parts[g];
    bx_acc_init(&q->acc);
    memcpy(q->acc.digit, raw + g * BX_ACC_WORDS, BX_ACC_DIGITS * sizeof(int64_t));
    q->acc.nan_count = raw[g * BX_ACC_WORDS + BX_ACC_DIGITS];
    q->acc.inf_count = raw[g * BX_ACC_WORDS + BX_ACC_DIGITS + 1];
    q->acc.count = raw[g * BX_ACC_WORDS + BX_ACC_DIGITS + 2];
    bx_acc_normalize(&q->acc);
    const uint64_t *x = ext + g * BX_CU_EXT_WORDS;
    q->maxabs = bx_f64_from_bits(x[0]);
    q->minabs = x[1] ? bx_f64_from_bits(~x[1]) : INFINITY;
    q->nonzero = (int64_t)x[2];
    q->nan = (int64_t)x[3];
    q->pending = 0;
  }
  free(raw);
  plan_free(plan);
  return BX_OK;
}

bx_status bx_cuda_scale_blocking(const char *fn, const DLTensor *flat, size_t count,
                                 const bx_group *groups, size_t ngroups, double coef,
                                 const bx_scale_opts *o, int skip_one) {
  bx_status st = bx_cuda_available();
  if (st != BX_OK) return bx_fail(st, "%s: %s", fn, bx_last_error());
  bx_clip_opts co = BX_CLIP_OPTS_DEFAULT;
  co.scale = *o;
  bx_group one = {flat, count};
  bx_cuda_plan *plan;
  st = groups ? plan_build(fn, groups, ngroups, &co, BX_M_SQ, &plan)
              : plan_build(fn, &one, 1, &co, BX_M_SQ, &plan);
  if (st != BX_OK) return st;
  if (plan->overlap) {
    st = bx_fail(BX_ELAYOUT, "%s", plan->overlap_msg);
    plan_free(plan);
    return st;
  }
  device_guard guard(plan->device);
  cudaError_t e = bx_cu_launch_scale(plan, 0, NULL, coef, NULL, skip_one);
  if (e == cudaSuccess) e = cudaStreamSynchronize(0);
  plan_free(plan);
  if (e != cudaSuccess) return cuda_fail(fn, "the scaling kernel", e);
  return BX_OK;
}

int bx_cuda_allreduce_staged(const bx_comm *comm, int64_t *buf, size_t n, bx_op op) {
  /* on the communicator's stream (bx_comm_nccl's), then wait for it */
  cudaStream_t st = (cudaStream_t)comm->stream;
  int64_t *d = NULL;
  if (!comm->allreduce_i64_async || cudaMalloc(&d, n * sizeof(int64_t) + 8) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  int rc = -1;
  if (cudaMemcpyAsync(d, buf, n * sizeof(int64_t), cudaMemcpyHostToDevice, st) == cudaSuccess) {
    rc = comm->allreduce_i64_async(d, n, op, comm->ctx, (void *)st);
    if (rc == 0 &&
        (cudaMemcpyAsync(buf, d, n * sizeof(int64_t), cudaMemcpyDeviceToHost, st) != cudaSuccess ||
         cudaStreamSynchronize(st) != cudaSuccess))
      rc = -1;
  }
  cudaStreamSynchronize(st);
  cudaGetLastError();
  cudaFree(d);
  return rc;
}
